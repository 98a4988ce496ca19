"""Shard layout: DDP buckets, flat byte coordinates, boxes, shards and shadows.

A :class:`Layout` is the single source of truth shared by trainers, switch controller and shadows.
It is built from the model's parameters (:class:`ParamSpec`) and the DDP bucket assignment
(:func:`ddp_buckets`) and fixes, deterministically:

* **Flat coordinates.** Each bucket is a flat byte buffer holding its parameters packed in bucket
  order without padding (exactly DDP's bucket views); buckets concatenated in order give the global
  flat byte space. Every parameter gets a :class:`Placement` (bucket, byte offset in the bucket,
  global byte offset, numel, itemsize). Offsets need not be itemsize-aligned across dtypes in
  general, but DDP never mixes dtypes in a bucket, so in practice they are.
* **Boxes.** Tensors are cut along dim 0 only into :class:`Box` es (global coordinates,
  ``(name, offsets, lengths)``, the DCP idea). A cut inside a tensor is only made at a row whose
  flat element offset is a multiple of ``align_elems`` (default 64): CPU fused AdamW rounds its
  vectorised body and its scalar tail differently, so a shadow stepping a piece is bit-exact with
  the trainer stepping the whole tensor only if every cut is vector aligned. Only tensors larger
  than ``max_piece_bytes`` are cut; 0-d and one-row tensors never are.
* **Shards and shadows.** ``num_shards = num_shadows // replication``; boxes go to shards by
  worst-fit (LPT), so no shard holds more than the mean plus the largest box. Shadow ``k`` holds
  shard ``k % num_shards`` as replica ``k // num_shards``.
* **Routes.** Per bucket, sorted byte ranges ``[start, end) -> shard`` tiling the bucket: what the
  controller installs into the switch (bucket range -> the shard's multicast group).
* **Module state.** The model's state that is not a trained parameter (:class:`StateSpec`):
  persistent buffers (BatchNorm running statistics, ``num_batches_tracked``) and frozen
  parameters (``requires_grad=False``). Each such tensor is one whole *state box* owned by one
  shard (worst-fit by bytes, after the parameters' loads). Buffers change every iteration: they
  are packed, shard by shard, into one reserved **state bucket** (index ``len(buckets)``, right
  after the gradient buckets, raw bytes: wire dtype ``uint8``) that rank 0 sends as DATA every
  iteration (``state_routes``: one byte range per shard). Frozen parameters never change: they
  are part of the shard state loaded at session start and fetched at restore, never streamed.

A layout serialises to canonical JSON (:meth:`Layout.to_json`); its :attr:`Layout.digest` is the
SHA-256 of that canonical content and :attr:`Layout.digest64` (first 8 digest bytes, big-endian)
goes into every wire header's ``layout`` field. Nothing depends on hash seeds or the process.

DDP bucket order (checked against torch 2.13, see ``tests/test_layout.py``):

* DDP lists parameters in ``named_parameters()`` order (``requires_grad`` only, shared ones once,
  minus ``_ddp_params_and_buffers_to_ignore``) and calls
  ``_compute_bucket_assignment_by_size(params, limits)``: per dtype, parameters accumulate in
  list order and a bucket closes once its size reaches the dtype's current limit (``>=``); the
  limits advance per dtype (``[first_bucket_bytes, bucket_cap]``, the last one repeats); the
  buckets are sorted by their smallest index, and the Reducer receives them **reversed**.
  Inside a bucket, parameters keep the order of the indices (ascending model order), and the
  bucket's flat views are laid out in that order: ``GradBucket.parameters()`` and the buffer
  offsets follow it. DDP passes ``limits = [first, cap]`` only when ``first < cap`` (otherwise
  ``[cap]``), and ``first`` is 1 MiB only when ``bucket_cap_mb`` is left at its default;
  an explicit ``bucket_cap_mb`` makes the first bucket as large as the others.
* That initial assignment is what DDP uses for every iteration **only with**
  ``find_unused_parameters=True`` (and ``static_graph=False``). By default
  (``find_unused_parameters=False``, or ``static_graph=True``) DDP's first iteration uses the
  limit ``[sys.maxsize]`` (one bucket per dtype, model order) and, before the second forward,
  **rebuilds** the buckets from the order in which gradients became ready in the first backward:
  the same size rule over the ready order, *not* sorted and *not* reversed, and parameters
  inside a bucket in ready order (typically reverse model order). Pass ``grad_ready_order`` to
  :func:`ddp_buckets` to get those steady-state buckets; :func:`from_module` predicts that order
  as the reverse of the parameters' order unless told otherwise (``initial=True``: the initial
  assignment). In a rebuild, a dtype's partially filled
  trailing bucket is emitted after the full ones in reverse order of the dtype's first
  appearance (libstdc++ ``unordered_map`` order; verified for all orders of the four dtypes).
* ``DDP_SET_LAST_BUCKET_CAP=1`` makes a rebuild run over the reversed ready order and reverse the
  result (``last_bucket_small=True``). Sparse gradients (sparse embeddings) and multi-device
  modules are not modelled.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import itertools
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from shadowgrad.dtypes import DTYPES, LAYOUT_ITEMSIZE
from shadowgrad.errors import LayoutError

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DTYPE_ITEMSIZE",
    "STATE_KINDS",
    "ParamSpec",
    "StateSpec",
    "Placement",
    "Box",
    "Route",
    "Location",
    "Layout",
    "ddp_buckets",
    "from_module",
    "state_from_module",
]

#: itemsize in bytes of every dtype a layout accepts (the one dtype table's index)
DTYPE_ITEMSIZE: Mapping[str, int] = LAYOUT_ITEMSIZE

_FORMAT = "shadowgrad.layout/1"
_DEFAULT_BUCKET_CAP_BYTES = 25 * 2**20
_DEFAULT_FIRST_BUCKET_BYTES = 2**20


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: fully qualified ``name`` (as in ``state_dict``), ``shape``, ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise LayoutError(f"parameter name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.shape, tuple) or not all(_is_int(d) for d in self.shape):
            raise LayoutError(
                f"parameter {self.name!r}: shape {self.shape!r} is not a tuple of ints"
            )
        for dim in self.shape:
            if dim < 0:
                raise LayoutError(
                    f"parameter {self.name!r}: negative dimension {dim} in shape {self.shape!r}"
                )
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_ITEMSIZE:
            raise LayoutError(
                f"parameter {self.name!r}: unsupported dtype {self.dtype!r}"
                f" (supported: {', '.join(DTYPE_ITEMSIZE)})"
            )

    @property
    def itemsize(self) -> int:
        return DTYPE_ITEMSIZE[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def rows(self) -> int:
        """Extent along dim 0 (a 0-d tensor counts as one row)."""
        return self.shape[0] if self.shape else 1

    @property
    def row_numel(self) -> int:
        """Elements per dim-0 row (1 for a 0-d tensor)."""
        return math.prod(self.shape[1:]) if self.shape else 1


#: kinds of module state: a persistent buffer (streamed every iteration) or a frozen parameter
#: (loaded with the shard state, never streamed)
STATE_KINDS = ("buffer", "frozen")


@dataclass(frozen=True)
class StateSpec:
    """One tensor of module state that is not a trained parameter: ``name`` (as in
    ``state_dict``), ``shape``, ``dtype`` (any dtype of :data:`shadowgrad.dtypes.DTYPES`:
    ``num_batches_tracked`` is int64) and ``kind`` (``"buffer"`` or ``"frozen"``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise LayoutError(f"state name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.shape, tuple) or not all(_is_int(d) and d >= 0 for d in self.shape):
            raise LayoutError(f"state {self.name!r}: bad shape {self.shape!r}")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise LayoutError(
                f"state {self.name!r}: unsupported dtype {self.dtype!r}"
                f" (supported: {', '.join(DTYPES)})"
            )
        if self.kind not in STATE_KINDS:
            raise LayoutError(f"state {self.name!r}: kind {self.kind!r} not in {STATE_KINDS}")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype].itemsize


@dataclass(frozen=True)
class Placement:
    """Where a whole parameter lives in flat coordinates."""

    spec: ParamSpec
    bucket: int
    bucket_offset: int  #: byte offset inside the bucket
    global_offset: int  #: byte offset in the concatenation of all buckets

    @property
    def numel(self) -> int:
        return self.spec.numel

    @property
    def itemsize(self) -> int:
        return self.spec.itemsize

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes


@dataclass(frozen=True)
class Box:
    """A piece of one tensor in global coordinates (rows ``[offsets[0], offsets[0]+lengths[0])``).

    ``offsets``/``lengths`` index the tensor (``()`` for a 0-d tensor); the rest is derived flat
    information: ``elem_start``/``elem_count`` within the tensor, the ``bucket``, the byte offset
    in that bucket and in the global flat space, and ``nbytes``.
    """

    name: str
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    dtype: str
    elem_start: int
    elem_count: int
    bucket: int
    bucket_offset: int
    global_offset: int
    nbytes: int

    @property
    def bucket_end(self) -> int:
        return self.bucket_offset + self.nbytes


class Route(NamedTuple):
    """Bytes ``[start, end)`` of a bucket go to ``shard`` (i.e. to its shadows' multicast group)."""

    start: int
    end: int
    shard: int


class Location(NamedTuple):
    """Answer of :meth:`Layout.locate`: the box, the byte offset inside it, and its shard."""

    box: Box
    offset: int
    shard: int


# --------------------------------------------------------------------------------------------
# DDP bucket assignment
# --------------------------------------------------------------------------------------------


def _check_nonneg_int(what: str, value: object) -> int:
    if not _is_int(value) or value < 0:  # type: ignore[operator]
        raise LayoutError(f"{what} must be a non-negative int, got {value!r}")
    return value  # type: ignore[return-value]


def _assign_by_size(
    items: Sequence[tuple[int, str, int]], limits: Sequence[int], *, sort: bool
) -> list[list[int]]:
    """Replica of c10d ``compute_bucket_assignment_by_size`` over ``(index, dtype, nbytes)``."""
    result: list[list[int]] = []
    # dict insertion order == first appearance of the dtype (the C++ map's key insertion order)
    open_buckets: dict[str, tuple[list[int], int]] = {}
    limit_pos: dict[str, int] = {}
    for index, dtype, nbytes in items:
        indices, size = open_buckets.get(dtype, ([], 0))
        indices.append(index)
        size += nbytes
        pos = limit_pos.setdefault(dtype, 0)
        if size >= limits[pos]:
            result.append(indices)
            open_buckets[dtype] = ([], 0)
            if pos + 1 < len(limits):
                limit_pos[dtype] = pos + 1
        else:
            open_buckets[dtype] = (indices, size)
    trailing = [indices for indices, _ in open_buckets.values() if indices]
    if sort:
        result.extend(trailing)
        result.sort(key=min)  # buckets are disjoint, so the minima are distinct
    else:
        # libstdc++ unordered_map iterates small maps in reverse key-insertion order
        result.extend(reversed(trailing))
    return result


def ddp_buckets(
    params: Sequence[ParamSpec],
    bucket_cap_bytes: int = _DEFAULT_BUCKET_CAP_BYTES,
    first_bucket_bytes: int = _DEFAULT_FIRST_BUCKET_BYTES,
    *,
    grad_ready_order: Sequence[str] | None = None,
    last_bucket_small: bool = False,
) -> list[list[str]]:
    """The bucket membership torch DDP uses, as lists of names in bucket-view order.

    ``params`` must be in DDP's parameter order (``named_parameters()`` order, ``requires_grad``
    only). Without ``grad_ready_order`` this is DDP's initial assignment,
    ``reversed(_compute_bucket_assignment_by_size(params, limits))`` with
    ``limits = [first_bucket_bytes, bucket_cap_bytes]`` if ``first_bucket_bytes <
    bucket_cap_bytes`` else ``[bucket_cap_bytes]`` — the buckets of every iteration with
    ``find_unused_parameters=True``. With ``grad_ready_order`` (all names, in the order their
    gradients became ready in the first backward) it is the rebuilt assignment DDP uses from the
    second iteration on by default (see the module docstring); ``last_bucket_small`` mirrors
    ``DDP_SET_LAST_BUCKET_CAP=1``. The first default iteration's single-bucket-per-dtype layout is
    ``ddp_buckets(params, sys.maxsize, sys.maxsize)``.
    """
    cap = _check_nonneg_int("bucket_cap_bytes", bucket_cap_bytes)
    first = _check_nonneg_int("first_bucket_bytes", first_bucket_bytes)
    if not params:
        raise LayoutError("ddp_buckets needs at least one parameter, got none")
    limits = [first, cap] if first < cap else [cap]
    index_of = _index_names(params)
    if grad_ready_order is None:
        if last_bucket_small:
            raise LayoutError("last_bucket_small=True only applies with grad_ready_order")
        items = [(i, p.dtype, p.nbytes) for i, p in enumerate(params)]
        buckets = list(reversed(_assign_by_size(items, limits, sort=True)))
    else:
        order = list(grad_ready_order)
        seen: set[int] = set()
        for name in order:
            if name not in index_of:
                raise LayoutError(f"grad_ready_order names unknown parameter {name!r}")
            if index_of[name] in seen:
                raise LayoutError(f"grad_ready_order lists parameter {name!r} twice")
            seen.add(index_of[name])
        missing = [p.name for p in params if index_of[p.name] not in seen]
        if missing:
            raise LayoutError(f"grad_ready_order misses parameter {missing[0]!r}")
        if last_bucket_small:
            order.reverse()
        items = [
            (index_of[n], params[index_of[n]].dtype, params[index_of[n]].nbytes) for n in order
        ]
        buckets = _assign_by_size(items, limits, sort=False)
        if last_bucket_small:
            buckets.reverse()
    return [[params[i].name for i in bucket] for bucket in buckets]


def _index_names(params: Sequence[ParamSpec]) -> dict[str, int]:
    index_of: dict[str, int] = {}
    for i, p in enumerate(params):
        if not isinstance(p, ParamSpec):
            raise LayoutError(f"expected a ParamSpec, got {p!r}")
        if p.name in index_of:
            raise LayoutError(f"parameter name {p.name!r} appears twice")
        index_of[p.name] = i
    return index_of


def from_module(
    module: torch.nn.Module,
    bucket_cap_mb: float | None = None,
    *,
    grad_ready_order: Sequence[str] | None = None,
    last_bucket_small: bool = False,
    initial: bool = False,
) -> tuple[list[ParamSpec], list[list[str]]]:
    """ParamSpecs of ``module`` in DDP's order and its DDP buckets (:func:`ddp_buckets`).

    The buckets are those default DDP uses from its second iteration on, the rebuilt
    assignment, with ``grad_ready_order`` (all names) or, without it, the order most models'
    gradients become ready in: the reverse of the parameters' order. Where that prediction
    holds, every DDP bucket *is* a layout bucket from the second iteration on and
    :class:`~shadowgrad.trainer_hooks.LayoutReducer` reduces it in place (no copy in or out);
    where it does not, the reducer copies, with the same bits. ``initial=True``: DDP's initial
    assignment instead (what ``find_unused_parameters=True`` uses every iteration).

    ``bucket_cap_mb=None`` means DDP's default (25 MiB buckets after a 1 MiB first bucket); an
    explicit value gives every bucket that cap, as DDP does. Parameters listed in
    ``module._ddp_params_and_buffers_to_ignore`` are left out, as DDP does.
    """
    import torch  # lazily: the layout core stays standard library only

    ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
    params: list[ParamSpec] = []
    for mod_name, mod in module.named_modules():
        if isinstance(mod, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and mod.sparse:
            raise LayoutError(f"module {mod_name!r} produces sparse gradients (not supported)")
    seen: set[int] = set()
    for name, p in module.named_parameters():
        if not p.requires_grad or name in ignore or id(p) in seen:
            continue
        seen.add(id(p))
        dtype = str(p.dtype).removeprefix("torch.")
        params.append(ParamSpec(name, tuple(int(d) for d in p.shape), dtype))
    devices = sorted({str(p.device) for p in module.parameters()})
    if len(devices) > 1:
        raise LayoutError(f"module spans several devices {devices!r} (not supported)")
    if bucket_cap_mb is None:
        cap, first = _DEFAULT_BUCKET_CAP_BYTES, _DEFAULT_FIRST_BUCKET_BYTES
    else:
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)):
            raise LayoutError(f"bucket_cap_mb must be a number, got {bucket_cap_mb!r}")
        if not bucket_cap_mb >= 0:
            raise LayoutError(f"bucket_cap_mb must be >= 0, got {bucket_cap_mb!r}")
        cap = first = int(bucket_cap_mb * 2**20)
    if initial:
        if grad_ready_order is not None or last_bucket_small:
            raise LayoutError("initial=True takes no grad_ready_order or last_bucket_small")
    elif grad_ready_order is None:
        grad_ready_order = [p.name for p in reversed(params)]
    buckets = ddp_buckets(
        params, cap, first, grad_ready_order=grad_ready_order, last_bucket_small=last_bucket_small
    )
    return params, buckets


def state_from_module(
    module: torch.nn.Module, trained: Collection[str]
) -> tuple[dict[str, torch.Tensor], tuple[StateSpec, ...]]:
    """The module state that is not a trained parameter, in module order: frozen parameters
    (every parameter not in ``trained``, the layout's) and persistent buffers (BatchNorm running
    statistics, ``num_batches_tracked``, any registered buffer), as in ``state_dict``; a tensor
    registered under several names counts once (its first). Returns the tensors by name and
    their :class:`StateSpec` s (``Layout.build(..., state=...)``)."""
    out: dict[str, torch.Tensor] = {}
    specs: list[StateSpec] = []
    seen: set[int] = set()

    def add(name: str, t: torch.Tensor, kind: str) -> None:
        if id(t) in seen:
            return
        seen.add(id(t))
        out[name] = t
        dtype = str(t.dtype).removeprefix("torch.")
        specs.append(StateSpec(name, tuple(int(d) for d in t.shape), dtype, kind))

    trained = set(trained)
    seen.update(id(p) for n, p in module.named_parameters() if n in trained)
    for name, p in module.named_parameters():
        add(name, p, "frozen")
    for mod_name, mod in module.named_modules():
        skip: set[str] = getattr(mod, "_non_persistent_buffers_set", set())
        for bname, b in mod.named_buffers(recurse=False):
            if b is not None and bname not in skip:
                add(f"{mod_name}.{bname}" if mod_name else bname, b, "buffer")
    return out, tuple(specs)


# --------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------


def _granule_rows(spec: ParamSpec, align_elems: int) -> int:
    """Smallest row count whose element count is a multiple of ``align_elems``."""
    return align_elems // math.gcd(spec.row_numel, align_elems)


def _split_rows(spec: ParamSpec, max_piece_bytes: int, align_elems: int) -> list[tuple[int, int]]:
    """Row ranges ``(start, stop)`` cutting ``spec`` at aligned rows into pieces <= the cap."""
    rows = spec.rows
    row_bytes = spec.row_numel * spec.itemsize
    if not spec.shape or rows <= 1 or row_bytes == 0 or rows * row_bytes <= max_piece_bytes:
        return [(0, rows)]
    g = _granule_rows(spec, align_elems)
    granules = -(-rows // g)
    per_piece = max(1, max_piece_bytes // (g * row_bytes))  # granules per piece, >= 1 granule
    k = -(-granules // per_piece)
    if k <= 1:
        return [(0, rows)]
    cuts = [min(rows, (i * granules // k) * g) for i in range(k + 1)]
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def _canonical(obj: Any) -> str:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def shadows_of_shard(shard: int, num_shards: int, replication: int) -> tuple[int, ...]:
    """Shadow ids holding ``shard`` (replica 0 first): shadow ``k`` holds shard
    ``k % num_shards`` as replica ``k // num_shards``. The one copy of the rule."""
    return tuple(shard + r * num_shards for r in range(replication))


class Layout:
    """An immutable shard layout; build it with :meth:`build` or :meth:`from_json`.

    Read-only attributes: ``params`` (in flat order), ``buckets`` (names per bucket),
    ``placements`` (name -> :class:`Placement`), ``bucket_nbytes``, ``total_bytes``,
    ``num_shadows``, ``replication``, ``num_shards``, ``align_elems``, ``max_piece_bytes``,
    ``boxes`` (all pieces in global flat order), ``box_shards`` (shard of each box),
    ``bucket_routes``, ``digest``, ``digest64``.
    """

    __slots__ = (  # noqa: RUF023 - grouped: public first, then private indexes
        "params",
        "buckets",
        "placements",
        "bucket_nbytes",
        "total_bytes",
        "num_shadows",
        "replication",
        "num_shards",
        "align_elems",
        "max_piece_bytes",
        "boxes",
        "box_shards",
        "bucket_routes",
        "digest",
        "digest64",
        "state",
        "state_boxes",
        "state_box_shards",
        "state_bucket",
        "state_bucket_nbytes",
        "state_routes",
        "_json",
        "_shard_state_boxes",
        "_shard_boxes",
        "_shard_bytes",
        "_bucket_starts",
        "_bucket_boxes",
        "_tensor_boxes",
    )

    params: tuple[ParamSpec, ...]
    buckets: tuple[tuple[str, ...], ...]
    placements: Mapping[str, Placement]
    bucket_nbytes: tuple[int, ...]
    total_bytes: int
    num_shadows: int
    replication: int
    num_shards: int
    align_elems: int
    max_piece_bytes: int
    boxes: tuple[Box, ...]
    box_shards: tuple[int, ...]
    bucket_routes: tuple[tuple[Route, ...], ...]
    digest: str
    digest64: int
    state: tuple[StateSpec, ...]
    state_boxes: tuple[Box, ...]
    state_box_shards: tuple[int, ...]
    state_bucket: int
    state_bucket_nbytes: int
    state_routes: tuple[Route, ...]
    _json: str
    _shard_state_boxes: tuple[tuple[Box, ...], ...]
    _shard_boxes: tuple[tuple[Box, ...], ...]
    _shard_bytes: tuple[int, ...]
    _bucket_starts: list[list[int]]
    _bucket_boxes: list[list[int]]
    _tensor_boxes: dict[str, tuple[Box, ...]]

    # -- construction ------------------------------------------------------------------------

    @staticmethod
    def _check_shadows(num_shadows: object, replication: object) -> tuple[int, int]:
        if not _is_int(num_shadows) or num_shadows < 1:  # type: ignore[operator]
            raise LayoutError(f"num_shadows must be an int >= 1, got {num_shadows!r}")
        if not _is_int(replication) or not 1 <= replication <= num_shadows:  # type: ignore[operator]
            raise LayoutError(
                f"replication must be an int in [1, num_shadows={num_shadows}], got {replication!r}"
            )
        if num_shadows % replication:  # type: ignore[operator]
            raise LayoutError(
                f"replication {replication} does not divide num_shadows {num_shadows}"
            )
        return num_shadows, replication  # type: ignore[return-value]

    @staticmethod
    def _order_params(
        params: Sequence[ParamSpec], buckets: Sequence[Sequence[str]]
    ) -> tuple[list[ParamSpec], list[list[str]]]:
        """Validate the bucketing; return the params in flat order and the buckets as lists."""
        by_name: dict[str, ParamSpec] = {}
        for p in params:
            if not isinstance(p, ParamSpec):
                raise LayoutError(f"expected a ParamSpec, got {p!r}")
            if p.name in by_name:
                raise LayoutError(f"parameter name {p.name!r} appears twice")
            by_name[p.name] = p
        if isinstance(buckets, (str, bytes)) or not buckets:
            raise LayoutError(f"buckets must be a non-empty list of name lists, got {buckets!r}")
        bucket_of: dict[str, int] = {}
        ordered: list[ParamSpec] = []
        out: list[list[str]] = []
        for b, bucket in enumerate(buckets):
            if isinstance(bucket, (str, bytes)) or not isinstance(bucket, Sequence):
                raise LayoutError(f"bucket {b} must be a list of names, got {bucket!r}")
            if not bucket:
                raise LayoutError(f"bucket {b} is empty")
            for name in bucket:
                if name not in by_name:
                    raise LayoutError(f"bucket {b} names unknown parameter {name!r}")
                if name in bucket_of:
                    raise LayoutError(
                        f"parameter {name!r} is in bucket {bucket_of[name]} and again in bucket {b}"
                    )
                bucket_of[name] = b
                ordered.append(by_name[name])
            out.append(list(bucket))
        for p in params:
            if p.name not in bucket_of:
                raise LayoutError(f"parameter {p.name!r} is in no bucket")
        return ordered, out

    @classmethod
    def build(
        cls,
        params: Sequence[ParamSpec],
        buckets: Sequence[Sequence[str]],
        num_shadows: int,
        replication: int = 1,
        *,
        max_piece_bytes: int | None = None,
        align_elems: int = 64,
        state: Sequence[StateSpec] = (),
    ) -> Layout:
        """Lay ``params`` out in ``buckets``, cut them into boxes and assign them to shards.

        ``max_piece_bytes`` defaults to ``ceil(total_bytes / (num_shards * 4))``; a tensor is cut
        only if larger than that (and never into pieces below one aligned granule of rows).
        ``state``: the module state that is not a trained parameter (see the module docstring).
        """
        num_shadows, replication = cls._check_shadows(num_shadows, replication)
        if not _is_int(align_elems) or align_elems < 1:
            raise LayoutError(f"align_elems must be an int >= 1, got {align_elems!r}")
        ordered, bucket_lists = cls._order_params(params, buckets)
        num_shards = num_shadows // replication
        total = sum(p.nbytes for p in ordered)
        if max_piece_bytes is None:
            max_piece_bytes = max(1, -(-total // (num_shards * 4)))
        elif not _is_int(max_piece_bytes) or max_piece_bytes < 1:
            raise LayoutError(f"max_piece_bytes must be an int >= 1, got {max_piece_bytes!r}")
        pieces: list[tuple[str, int, int]] = []
        sizes: list[int] = []
        for p in ordered:
            for start, stop in _split_rows(p, max_piece_bytes, align_elems):
                pieces.append((p.name, start, stop))
                sizes.append((stop - start) * p.row_numel * p.itemsize)
        # worst-fit (LPT): biggest first, ties by global offset (= piece index), to the least
        # loaded shard, ties to the lowest shard index
        order = sorted(range(len(pieces)), key=lambda i: (-sizes[i], i))
        heap = [(0, s) for s in range(num_shards)]
        shards = [0] * len(pieces)
        for i in order:
            load, s = heapq.heappop(heap)
            shards[i] = s
            heapq.heappush(heap, (load + sizes[i], s))
        assigned = [(n, a, b, s) for (n, a, b), s in zip(pieces, shards, strict=True)]
        return cls._make(
            ordered,
            bucket_lists,
            assigned,
            num_shadows=num_shadows,
            replication=replication,
            align_elems=align_elems,
            max_piece_bytes=max_piece_bytes,
            state=state,
        )

    def with_state(self, state: Sequence[StateSpec]) -> Layout:
        """This layout (same parameters, buckets, boxes and shards) with ``state`` as its module
        state (a new digest unless the state is the same)."""
        content = json.loads(self._json)["layout"]
        return Layout._make(
            list(self.params),
            [list(b) for b in self.buckets],
            [(n, a, b, s) for n, a, b, s in content["pieces"]],
            num_shadows=self.num_shadows,
            replication=self.replication,
            align_elems=self.align_elems,
            max_piece_bytes=self.max_piece_bytes,
            state=state,
        )

    @classmethod
    def _make(
        cls,
        ordered: list[ParamSpec],
        bucket_lists: list[list[str]],
        pieces: Sequence[tuple[str, int, int, int]],
        *,
        num_shadows: int,
        replication: int,
        align_elems: int,
        max_piece_bytes: int,
        state: Sequence[StateSpec] = (),
    ) -> Layout:
        """Common constructor: validates ``pieces`` (flat order) and derives everything."""
        self = cls.__new__(cls)
        num_shards = num_shadows // replication
        by_name = {p.name: p for p in ordered}
        placements: dict[str, Placement] = {}
        bucket_nbytes: list[int] = []
        goff = 0
        for b, names in enumerate(bucket_lists):
            boff = 0
            for name in names:
                spec = by_name[name]
                placements[name] = Placement(spec, b, boff, goff + boff)
                boff += spec.nbytes
            bucket_nbytes.append(boff)
            goff += boff

        boxes: list[Box] = []
        box_shards: list[int] = []
        tensor_boxes: dict[str, list[int]] = {p.name: [] for p in ordered}
        pos = 0  # index into ordered: pieces must come tensor by tensor in flat order
        next_row = 0
        for piece in pieces:
            name, start, stop, shard = piece
            if pos >= len(ordered):
                raise LayoutError(f"piece {piece!r} lies past the last parameter")
            spec = ordered[pos]
            if name != spec.name or start != next_row:
                raise LayoutError(
                    f"piece {piece!r} out of order: expected {spec.name!r} from row {next_row}"
                )
            rows = spec.rows
            if not stop > start and not (rows == 0 and stop == 0):
                raise LayoutError(f"piece {piece!r} is empty or reversed")
            if stop > rows:
                raise LayoutError(f"piece {piece!r} runs past row {rows} of {name!r}")
            if start and (start * spec.row_numel) % align_elems:
                raise LayoutError(
                    f"piece {piece!r} starts at element {start * spec.row_numel} of {name!r},"
                    f" not a multiple of align_elems={align_elems}"
                )
            if not _is_int(shard) or not 0 <= shard < num_shards:
                raise LayoutError(f"piece {piece!r}: shard {shard!r} not in [0, {num_shards})")
            pl = placements[name]
            elem_start = start * spec.row_numel
            elem_count = (stop - start) * spec.row_numel
            if spec.shape:
                offsets = (start,) + (0,) * (len(spec.shape) - 1)
                lengths = (stop - start, *spec.shape[1:])
            else:
                offsets, lengths = (), ()
                elem_count = 1
            byte_start = elem_start * spec.itemsize
            tensor_boxes[name].append(len(boxes))
            boxes.append(
                Box(
                    name,
                    offsets,
                    lengths,
                    spec.dtype,
                    elem_start,
                    elem_count,
                    pl.bucket,
                    pl.bucket_offset + byte_start,
                    pl.global_offset + byte_start,
                    elem_count * spec.itemsize,
                )
            )
            box_shards.append(shard)
            next_row = stop
            if stop == rows:
                pos += 1
                next_row = 0
        if pos != len(ordered):
            raise LayoutError(
                f"pieces do not cover parameter {ordered[pos].name!r} (from row {next_row})"
            )

        shard_boxes: list[list[Box]] = [[] for _ in range(num_shards)]
        shard_bytes = [0] * num_shards
        bucket_starts: list[list[int]] = [[] for _ in bucket_lists]
        bucket_boxes: list[list[int]] = [[] for _ in bucket_lists]
        routes: list[list[Route]] = [[] for _ in bucket_lists]
        for i, (box, shard) in enumerate(zip(boxes, box_shards, strict=True)):
            shard_boxes[shard].append(box)
            shard_bytes[shard] += box.nbytes
            if box.nbytes == 0:
                continue
            bucket_starts[box.bucket].append(box.bucket_offset)
            bucket_boxes[box.bucket].append(i)
            r = routes[box.bucket]
            if r and r[-1].shard == shard:
                r[-1] = Route(r[-1].start, box.bucket_end, shard)
            else:
                r.append(Route(box.bucket_offset, box.bucket_end, shard))

        state_t = tuple(state)
        taken = {p.name for p in ordered}
        for st in state_t:
            if not isinstance(st, StateSpec):
                raise LayoutError(f"expected a StateSpec, got {st!r}")
            if st.name in taken:
                raise LayoutError(f"state {st.name!r} is also a parameter or appears twice")
            taken.add(st.name)
        # whole tensors to shards, worst-fit by bytes on top of the parameters' loads (biggest
        # first, ties by index, to the least loaded shard, ties to the lowest shard index)
        heap = [(shard_bytes[s], s) for s in range(num_shards)]
        heapq.heapify(heap)
        st_shard = [0] * len(state_t)
        for i in sorted(range(len(state_t)), key=lambda i: (-state_t[i].nbytes, i)):
            load, s = heapq.heappop(heap)
            st_shard[i] = s
            heapq.heappush(heap, (load + state_t[i].nbytes, s))
        # buffers packed shard by shard into the state bucket (one contiguous range per shard)
        sbucket = len(bucket_lists)
        st_offsets: dict[int, int] = {}
        pos = 0
        state_routes: list[Route] = []
        for s in range(num_shards):
            start = pos
            for i, st in enumerate(state_t):
                if st_shard[i] == s and st.kind == "buffer":
                    st_offsets[i] = pos
                    pos += st.nbytes
            if pos > start:
                state_routes.append(Route(start, pos, s))
        state_boxes: list[Box] = []
        shard_state: list[list[Box]] = [[] for _ in range(num_shards)]
        for i, st in enumerate(state_t):
            buffer = st.kind == "buffer"
            sbox = Box(
                st.name,
                (0,) * len(st.shape),
                st.shape,
                st.dtype,
                0,
                st.numel,
                sbucket if buffer else -1,
                st_offsets[i] if buffer else 0,
                -1,
                st.nbytes,
            )
            state_boxes.append(sbox)
            shard_state[st_shard[i]].append(sbox)
        self.state = state_t
        self.state_boxes = tuple(state_boxes)
        self.state_box_shards = tuple(st_shard)
        self.state_bucket = sbucket
        self.state_bucket_nbytes = pos
        self.state_routes = tuple(state_routes)
        self._shard_state_boxes = tuple(tuple(b) for b in shard_state)

        self.params = tuple(ordered)
        self.buckets = tuple(tuple(b) for b in bucket_lists)
        self.placements = placements
        self.bucket_nbytes = tuple(bucket_nbytes)
        self.total_bytes = goff
        self.num_shadows = num_shadows
        self.replication = replication
        self.num_shards = num_shards
        self.align_elems = align_elems
        self.max_piece_bytes = max_piece_bytes
        self.boxes = tuple(boxes)
        self.box_shards = tuple(box_shards)
        self.bucket_routes = tuple(tuple(r) for r in routes)
        self._shard_boxes = tuple(tuple(b) for b in shard_boxes)
        self._shard_bytes = tuple(shard_bytes)
        self._bucket_starts = bucket_starts
        self._bucket_boxes = bucket_boxes
        self._tensor_boxes = {k: tuple(boxes[i] for i in v) for k, v in tensor_boxes.items()}
        content = {
            "format": _FORMAT,
            "num_shadows": num_shadows,
            "replication": replication,
            "align_elems": align_elems,
            "max_piece_bytes": max_piece_bytes,
            "buckets": [
                [[n, list(by_name[n].shape), by_name[n].dtype] for n in names]
                for names in bucket_lists
            ],
            "pieces": [[n, a, b, s] for n, a, b, s in pieces],
        }
        if state_t:  # absent without module state: those layouts keep their digests
            content["state"] = [[st.name, list(st.shape), st.dtype, st.kind] for st in state_t]
        body = _canonical(content)
        self.digest = hashlib.sha256(body.encode("ascii")).hexdigest()
        self.digest64 = int(self.digest[:16], 16)
        self._json = _canonical({"digest": self.digest, "layout": content})
        return self

    # -- serialisation -----------------------------------------------------------------------

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no whitespace): ``{"digest": ..., "layout": {...}}``."""
        return self._json

    @classmethod
    def from_json(cls, text: str | bytes) -> Layout:
        """Parse and fully validate :meth:`to_json` output; a digest mismatch is a LayoutError."""
        try:
            doc = json.loads(text)
        except (ValueError, TypeError) as exc:
            raise LayoutError(f"layout JSON does not parse: {exc}") from None
        if not isinstance(doc, dict) or set(doc) != {"digest", "layout"}:
            keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
            raise LayoutError(f"layout JSON must have exactly keys digest, layout; got {keys!r}")
        content, claimed = doc["layout"], doc["digest"]
        want = {
            "format",
            "num_shadows",
            "replication",
            "align_elems",
            "max_piece_bytes",
            "buckets",
            "pieces",
        }
        if not isinstance(content, dict) or set(content) - {"state"} != want:
            keys = sorted(content) if isinstance(content, dict) else content
            raise LayoutError(f"layout JSON content keys {keys!r}, expected {sorted(want)!r}")
        if content["format"] != _FORMAT:
            raise LayoutError(f"layout format {content['format']!r}, expected {_FORMAT!r}")
        num_shadows, replication = cls._check_shadows(
            content["num_shadows"], content["replication"]
        )
        align, cap = content["align_elems"], content["max_piece_bytes"]
        if not _is_int(align) or align < 1:
            raise LayoutError(f"align_elems must be an int >= 1, got {align!r}")
        if not _is_int(cap) or cap < 1:
            raise LayoutError(f"max_piece_bytes must be an int >= 1, got {cap!r}")
        raw_buckets = content["buckets"]
        if not isinstance(raw_buckets, list):
            raise LayoutError(f"layout buckets must be a list, got {raw_buckets!r}")
        params: list[ParamSpec] = []
        names: list[list[str]] = []
        for b, bucket in enumerate(raw_buckets):
            if not isinstance(bucket, list):
                raise LayoutError(f"layout bucket {b} must be a list, got {bucket!r}")
            names.append([])
            for entry in bucket:
                if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[1], list)):
                    raise LayoutError(f"bad parameter entry {entry!r} in bucket {b}")
                params.append(ParamSpec(entry[0], tuple(entry[1]), entry[2]))
                names[-1].append(entry[0])
        ordered, bucket_lists = cls._order_params(params, names)
        raw_pieces = content["pieces"]
        if not isinstance(raw_pieces, list):
            raise LayoutError(f"layout pieces must be a list, got {raw_pieces!r}")
        pieces: list[tuple[str, int, int, int]] = []
        for piece in raw_pieces:
            if not (
                isinstance(piece, list)
                and len(piece) == 4
                and isinstance(piece[0], str)
                and all(_is_int(x) for x in piece[1:])
            ):
                raise LayoutError(f"bad piece entry {piece!r}")
            pieces.append((piece[0], piece[1], piece[2], piece[3]))
        raw_state = content.get("state", [])
        if not isinstance(raw_state, list) or ("state" in content and not raw_state):
            raise LayoutError(f"layout state must be a non-empty list, got {raw_state!r}")
        state: list[StateSpec] = []
        for entry in raw_state:
            if not (
                isinstance(entry, list)
                and len(entry) == 4
                and isinstance(entry[1], list)
                and all(isinstance(x, str) for x in (entry[0], entry[2], entry[3]))
            ):
                raise LayoutError(f"bad state entry {entry!r}")
            state.append(StateSpec(entry[0], tuple(entry[1]), entry[2], entry[3]))
        layout = cls._make(
            ordered,
            bucket_lists,
            pieces,
            num_shadows=num_shadows,
            replication=replication,
            align_elems=align,
            max_piece_bytes=cap,
            state=state,
        )
        if layout.digest != claimed:
            raise LayoutError(
                f"layout digest mismatch: JSON claims {claimed!r}, content hashes to"
                f" {layout.digest!r}"
            )
        return layout

    # -- queries -----------------------------------------------------------------------------

    def _check_shard(self, shard: int) -> None:
        if not _is_int(shard) or not 0 <= shard < self.num_shards:
            raise LayoutError(f"shard {shard!r} not in [0, {self.num_shards})")

    def shard_boxes(self, shard: int) -> tuple[Box, ...]:
        """Boxes of ``shard`` in global flat order."""
        self._check_shard(shard)
        return self._shard_boxes[shard]

    def shard_bytes(self, shard: int) -> int:
        self._check_shard(shard)
        return self._shard_bytes[shard]

    def shard_state_boxes(self, shard: int) -> tuple[Box, ...]:
        """The module-state boxes of ``shard`` (whole tensors, in :attr:`state` order): a
        buffer's ``bucket`` is :attr:`state_bucket`, a frozen parameter's is -1 (never sent)."""
        self._check_shard(shard)
        return self._shard_state_boxes[shard]

    def shard_entries(self, shard: int) -> tuple[Box, ...]:
        """Everything ``shard`` holds, in the order of its state lists (``load``, ``fetch``,
        exports): its parameter boxes, then its module-state boxes."""
        return self.shard_boxes(shard) + self.shard_state_boxes(shard)

    def shard_of_shadow(self, shadow_id: int) -> tuple[int, int]:
        """``(shard, replica)`` held by shadow ``shadow_id``."""
        if not _is_int(shadow_id) or not 0 <= shadow_id < self.num_shadows:
            raise LayoutError(f"shadow id {shadow_id!r} not in [0, {self.num_shadows})")
        return shadow_id % self.num_shards, shadow_id // self.num_shards

    def shadows_of_shard(self, shard: int) -> tuple[int, ...]:
        """Shadow ids holding ``shard``, replica 0 first."""
        self._check_shard(shard)
        return shadows_of_shard(shard, self.num_shards, self.replication)

    def shadow_boxes(self, shadow_id: int) -> tuple[Box, ...]:
        return self._shard_boxes[self.shard_of_shadow(shadow_id)[0]]

    def tensor_boxes(self, name: str) -> tuple[Box, ...]:
        """Boxes of one tensor, in row order."""
        try:
            return self._tensor_boxes[name]
        except KeyError:
            raise LayoutError(f"unknown parameter {name!r}") from None

    def placement(self, name: str) -> Placement:
        try:
            return self.placements[name]
        except KeyError:
            raise LayoutError(f"unknown parameter {name!r}") from None

    def locate(self, bucket: int, byte_offset: int) -> Location:
        """The box holding byte ``byte_offset`` of ``bucket`` (O(log boxes), for packet paths)."""
        if not 0 <= bucket < len(self.bucket_nbytes):
            raise LayoutError(f"bucket {bucket!r} not in [0, {len(self.bucket_nbytes)})")
        if not 0 <= byte_offset < self.bucket_nbytes[bucket]:
            raise LayoutError(
                f"byte offset {byte_offset!r} outside bucket {bucket}"
                f" of {self.bucket_nbytes[bucket]} bytes"
            )
        j = bisect.bisect_right(self._bucket_starts[bucket], byte_offset) - 1
        i = self._bucket_boxes[bucket][j]
        box = self.boxes[i]
        return Location(box, byte_offset - box.bucket_offset, self.box_shards[i])

    # -- dunder ------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and other.digest == self.digest

    def __hash__(self) -> int:
        return self.digest64

    def __repr__(self) -> str:
        return (
            f"Layout(digest64={self.digest64:016x}, params={len(self.params)},"
            f" buckets={len(self.buckets)}, boxes={len(self.boxes)},"
            f" shadows={self.num_shadows}, replication={self.replication},"
            f" bytes={self.total_bytes})"
        )
