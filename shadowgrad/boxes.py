"""Box states: one shard's slice of a trainer's full state, and back (shared contract).

A box (``Layout.shard_boxes(shard)``) is a row range of one parameter; its *state* is
``{"param": rows, <torch optimizer state key>: rows or a 0-d scalar}``. The trainer hooks cut
their live state into box states to bootstrap or re-seed a shadow
(:func:`box_states_from_full`); a restore, the controller's export and the tests glue the exports
of all shards back into full tensors (:func:`assemble_full`). The shadow's optimizer replay
(``shadowgrad.shadow.replay``) keeps its state in the same form and re-exports these names.

A shard's state list covers :meth:`Layout.shard_entries`: its parameter boxes, then its
module-state boxes (buffers, frozen parameters: whole tensors, state ``{"param": tensor}`` and
never an optimizer key), so module state travels, is held and comes back exactly like the
parameters (``load``, ``fetch``, snapshots, exports).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from shadowgrad.errors import ShadowgradError
from shadowgrad.layout import Box, Layout
from shadowgrad.tensorstream import (
    StreamEntry,
    StreamTensor,
    copy_verified,
    dest_bytes,
    iter_stream,
    parse_entry,
)
from shadowgrad.torch_dtypes import LAYOUT_TORCH_DTYPES, TORCH_DTYPES

if TYPE_CHECKING:
    from shadowgrad.bulk import StreamReader

__all__ = [
    "ReplayError",
    "ReplayInputError",
    "BoxState",
    "box_rows",
    "box_where",
    "box_states_from_full",
    "assemble_full",
    "FullStateSink",
    "check_state_entry",
]

#: one box's state: ``"param"`` plus the torch optimizer state keys
BoxState = dict[str, torch.Tensor]


class ReplayError(ShadowgradError, RuntimeError):
    """Base class of the replay errors."""


class ReplayInputError(ReplayError, ValueError):
    """Bad input: wrong number, shape or dtype of tensors, bad state keys, a COMMIT that does not
    fit the spec (group count, a scale not representable in fp32, ...). Nothing was changed."""


def box_rows(tensor: torch.Tensor, box: Box) -> torch.Tensor:
    """The box's rows of a full tensor (a view); the tensor itself for a 0-d box."""
    if not box.offsets:
        return tensor
    return tensor.narrow(0, box.offsets[0], box.lengths[0])


def box_where(box: Box) -> str:
    """The box for a message: ``'name'`` or ``'name' rows [a, b)``."""
    if not box.offsets:
        return repr(box.name)
    return f"{box.name!r} rows [{box.offsets[0]}, {box.offsets[0] + box.lengths[0]})"


def box_states_from_full(
    layout: Layout,
    shard: int,
    model_state: Mapping[str, torch.Tensor],
    optim_state: Mapping[str, Mapping[str, torch.Tensor | None]] | None = None,
) -> list[BoxState]:
    """Cut a trainer's full state into the box states of ``shard`` (for a shadow's
    ``ShardReplayer.load``, locally or through the control protocol's ``load``).

    ``model_state`` maps parameter names to full tensors (``model.state_dict()`` or
    ``dict(model.named_parameters())``); ``optim_state`` maps names to that parameter's torch
    optimizer state (:func:`shadowgrad.optspec.state_by_name`); a name without state, or
    ``optim_state=None``, means a fresh optimizer. Tensors shaped like the parameter are cut to
    the box's rows, 0-d ones (``step``) are shared by every box; ``None`` values are dropped.
    The results are **views** of the inputs (``load`` copies them).
    """
    optim_state = optim_state or {}
    out: list[BoxState] = []
    for box in layout.shard_boxes(shard):
        spec_shape = layout.placement(box.name).spec.shape
        full = model_state.get(box.name)
        if not isinstance(full, torch.Tensor):
            raise ReplayInputError(f"model state has no tensor for parameter {box.name!r}")
        if tuple(full.shape) != spec_shape:
            raise ReplayInputError(
                f"model state {box.name!r} has shape {tuple(full.shape)},"
                f" the layout says {spec_shape}"
            )
        st: BoxState = {"param": box_rows(full.detach(), box)}
        for key, value in (optim_state.get(box.name) or {}).items():
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise ReplayInputError(
                    f"optimizer state {box.name!r}.{key} is a {type(value).__name__}, not a tensor"
                )
            if tuple(value.shape) == spec_shape:
                st[key] = box_rows(value.detach(), box)
            elif value.dim() == 0:
                st[key] = value.detach()
            else:
                raise ReplayInputError(
                    f"optimizer state {box.name!r}.{key} has shape {tuple(value.shape)}: neither"
                    f" the parameter's {spec_shape} nor a scalar"
                )
        out.append(st)
    for box in layout.shard_state_boxes(shard):
        full = model_state.get(box.name)
        if not isinstance(full, torch.Tensor):
            raise ReplayInputError(f"model state has no tensor for module state {box.name!r}")
        if tuple(full.shape) != box.lengths or full.dtype != TORCH_DTYPES[box.dtype]:
            raise ReplayInputError(
                f"module state {box.name!r} is {tuple(full.shape)} {full.dtype},"
                f" the layout says {box.lengths} {box.dtype}"
            )
        out.append({"param": full.detach()})
    return out


def check_state_entry(shard: int, box: Box, st: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The tensor of a module-state entry (exactly ``{"param": tensor}`` of the box's shape
    and dtype)."""
    piece = st.get("param")
    if (
        set(st) != {"param"}
        or not isinstance(piece, torch.Tensor)
        or tuple(piece.shape) != box.lengths
        or piece.dtype != TORCH_DTYPES[box.dtype]
    ):
        raise ReplayInputError(
            f"shard {shard} module state {box.name!r}: expected only 'param'"
            f" {box.lengths} {box.dtype}, got {sorted(st)}"
        )
    return piece


def assemble_full(
    layout: Layout, per_shard_exports: Sequence[Sequence[Mapping[str, torch.Tensor]]]
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Glue the ``ShardReplayer.export`` of every shard (index = shard) into full tensors.

    Returns ``(params_by_name, optim_state_by_name)``; a parameter whose boxes hold no optimizer
    state is absent from the second. The module state (buffers, frozen parameters) is in the
    first, by name. Raises :class:`ReplayError` when the boxes of a tensor
    disagree: different state keys, or different 0-d values (``step``).
    """
    if len(per_shard_exports) != layout.num_shards:
        raise ReplayInputError(
            f"{len(per_shard_exports)} shard exports, the layout has {layout.num_shards} shards"
        )
    params = {
        p.name: torch.empty(p.shape, dtype=LAYOUT_TORCH_DTYPES[p.dtype]) for p in layout.params
    }
    states: dict[str, dict[str, torch.Tensor]] = {}
    keys_of: dict[str, tuple[set[str], Box]] = {}
    for shard, export in enumerate(per_shard_exports):
        boxes = layout.shard_boxes(shard)
        sboxes = layout.shard_state_boxes(shard)
        if len(export) != len(boxes) + len(sboxes):
            raise ReplayInputError(
                f"shard {shard} export has {len(export)} boxes, the layout has"
                f" {len(boxes) + len(sboxes)}"
            )
        for box, st in zip(sboxes, export[len(boxes) :], strict=True):
            params[box.name] = check_state_entry(shard, box, st).detach().clone()
        for box, st in zip(boxes, export[: len(boxes)], strict=True):
            full = params[box.name]
            piece = st.get("param")
            if not isinstance(piece, torch.Tensor) or tuple(piece.shape) != box.lengths:
                raise ReplayInputError(
                    f"shard {shard} box {box_where(box)}: bad or missing 'param'"
                )
            box_rows(full, box).copy_(piece)
            keys = set(st) - {"param"}
            first = keys_of.setdefault(box.name, (keys, box))
            if first[0] != keys:
                raise ReplayError(
                    f"boxes of {box.name!r} disagree on optimizer state: {box_where(first[1])} has"
                    f" {sorted(first[0])}, {box_where(box)} has {sorted(keys)}"
                )
            tstate = states.setdefault(box.name, {}) if keys else {}
            for key in keys:
                value = st[key]
                if box.lengths and value.dim() == 0:  # a scalar shared by all boxes ("step")
                    prev = tstate.get(key)
                    if prev is None:
                        tstate[key] = value.detach().clone()
                    elif not torch.equal(prev, value):
                        raise ReplayError(
                            f"boxes of {box.name!r} disagree on {key!r}: {prev.item()} vs"
                            f" {value.item()} ({box_where(box)})"
                        )
                elif tuple(value.shape) == box.lengths:
                    if key not in tstate:
                        tstate[key] = torch.empty(full.shape, dtype=value.dtype)
                    box_rows(tstate[key], box).copy_(value)
                else:
                    raise ReplayInputError(
                        f"shard {shard} box {box_where(box)}: state {key!r} has"
                        f" shape {tuple(value.shape)}"
                    )
    return params, states


class FullStateSink:
    """The tensor streams of every shard's ``fetch`` reply, written straight into full
    tensors: the parameters (``params``: destination tensors by name, written in place where
    they are contiguous CPU tensors of the layout's shape and dtype; the others, and names not
    given, get new memory) and the optimizer state (new full tensors, one per key, allocated as
    the first box of a tensor names it). Every chunk is verified as it is copied, once, from
    the reply's frame to its place (:func:`shadowgrad.tensorstream.copy_verified`).

    :meth:`write` may run for different shards on different threads at once. :meth:`finish`
    checks that every box of every shard came, with the same state keys across the boxes of a
    tensor and the same 0-d values (``step``), as :func:`assemble_full` does, and returns
    ``(params_by_name, optim_state_by_name)``.
    """

    def __init__(self, layout: Layout, params: Mapping[str, torch.Tensor] | None = None) -> None:
        self.layout = layout
        self._lock = threading.Lock()
        self.params: dict[str, torch.Tensor] = {}
        #: parameters written in place into the caller's tensors
        self.in_place: set[str] = set()
        given = params or {}
        for p in layout.params:
            dtype = LAYOUT_TORCH_DTYPES[p.dtype]
            t = given.get(p.name)
            if (
                t is not None
                and t.device.type == "cpu"
                and t.is_contiguous()
                and t.dtype == dtype
                and tuple(t.shape) == tuple(p.shape)
            ):
                self.params[p.name] = t
                self.in_place.add(p.name)
            else:
                self.params[p.name] = torch.empty(p.shape, dtype=dtype)
        for st in layout.state:  # module state: a new tensor each (the caller copies it in)
            self.params[st.name] = torch.empty(st.shape, dtype=TORCH_DTYPES[st.dtype])
        self.states: dict[str, dict[str, torch.Tensor]] = {}
        self._keys: dict[tuple[int, int], set[str]] = {}
        self.nbytes = 0

    def _state_tensor(self, name: str, key: str, dtype: torch.dtype) -> torch.Tensor:
        with self._lock:
            st = self.states.setdefault(name, {})
            t = st.get(key)
            if t is None:
                t = st[key] = torch.empty(self.params[name].shape, dtype=dtype)
            elif t.dtype != dtype:
                raise ReplayInputError(f"state {key!r} of {name!r} comes as {dtype} and {t.dtype}")
            return t

    def write(
        self,
        shard: int,
        entries: Sequence[Mapping[str, Any]],
        frames: Sequence[Any],
        *,
        boxes: Sequence[int] | None = None,
    ) -> None:
        """Shard ``shard``'s stream (a ``fetch`` reply's ``entries`` and frames) of the box
        indices ``boxes`` (None: all of the shard's; a stream of other boxes is refused)."""
        allowed = None if boxes is None else frozenset(boxes)
        for t in iter_stream(entries, frames):
            dest, post = self._target(shard, t, allowed)
            copy_verified(t, dest)
            self._done(shard, t, post)

    def receive(
        self,
        shard: int,
        entries: Sequence[Mapping[str, Any]],
        reader: StreamReader,
        *,
        boxes: Sequence[int] | None = None,
    ) -> None:
        """Like :meth:`write`, the bytes from a bulk stream (:mod:`shadowgrad.bulk`): each
        tensor received straight into its place, every chunk checked as it lands."""
        allowed = None if boxes is None else frozenset(boxes)
        for entry in entries:
            t = parse_entry(entry)
            dest, post = self._target(shard, t, allowed)
            reader.read_into(dest_bytes(t, dest), t.crcs, f"{t.key!r} of box {t.box}")
            self._done(shard, t, post)

    def _done(
        self,
        shard: int,
        t: StreamEntry | StreamTensor,
        post: Callable[[], None] | None,
    ) -> None:
        if post is not None:
            post()
        with self._lock:
            self._keys.setdefault((shard, t.box), set()).add(t.key)
            self.nbytes += t.nbytes

    def _target(
        self,
        shard: int,
        t: StreamEntry | StreamTensor,
        allowed: frozenset[int] | None,
    ) -> tuple[torch.Tensor, Callable[[], None] | None]:
        """Where tensor ``t`` of shard ``shard``'s stream goes (contiguous, its size), and what
        to do once it is there (None: nothing), or ReplayInputError."""
        shard_boxes = self.layout.shard_entries(shard)
        nparam = len(self.layout.shard_boxes(shard))
        if (allowed is not None and t.box not in allowed) or not 0 <= t.box < len(shard_boxes):
            raise ReplayInputError(f"shard {shard}: box {t.box} was not asked for")
        box = shard_boxes[t.box]
        if "name" in t.entry and (
            t.entry.get("name") != box.name or tuple(t.entry.get("offsets") or ()) != box.offsets
        ):
            raise ReplayInputError(
                f"shard {shard} box {t.box} is {box_where(box)}, the stream says "
                f"{t.entry.get('name')!r} at {t.entry.get('offsets')}"
            )
        dtype = TORCH_DTYPES[t.dtype]
        if t.box >= nparam:  # module state: the whole tensor, no optimizer state
            if t.key != "param" or t.shape != box.lengths or dtype != TORCH_DTYPES[box.dtype]:
                raise ReplayInputError(
                    f"shard {shard} module state {box.name!r}: bad {t.key!r} ({t.shape}, {t.dtype})"
                )
            return self.params[box.name], None
        if t.key == "param":
            if t.shape != box.lengths or dtype != LAYOUT_TORCH_DTYPES[box.dtype]:
                raise ReplayInputError(
                    f"shard {shard} box {box_where(box)}: bad 'param' ({t.shape}, {t.dtype})"
                )
            return box_rows(self.params[box.name], box), None
        if box.lengths and t.shape == ():  # a scalar shared by every box ("step")
            value = torch.empty((), dtype=dtype)

            def keep() -> None:
                with self._lock:
                    st = self.states.setdefault(box.name, {})
                    prev = st.get(t.key)
                    if prev is None:
                        st[t.key] = value
                    elif not torch.equal(prev, value):
                        raise ReplayError(
                            f"boxes of {box.name!r} disagree on {t.key!r}: {prev.item()} vs"
                            f" {value.item()} ({box_where(box)})"
                        )

            return value, keep
        if t.shape == box.lengths:
            return box_rows(self._state_tensor(box.name, t.key, dtype), box), None
        raise ReplayInputError(
            f"shard {shard} box {box_where(box)}: state {t.key!r} has shape {t.shape}"
        )

    def finish(self) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """Check completeness and agreement; ``(params_by_name, optim_state_by_name)`` (the
        first holds the module state too)."""
        first: dict[str, tuple[set[str], Box]] = {}
        for shard in range(self.layout.num_shards):
            nparam = len(self.layout.shard_boxes(shard))
            for b, box in enumerate(self.layout.shard_state_boxes(shard), nparam):
                if self._keys.get((shard, b)) != {"param"}:
                    raise ReplayInputError(f"shard {shard} module state {box.name!r}: did not come")
            for b, box in enumerate(self.layout.shard_boxes(shard)):
                keys = self._keys.get((shard, b))
                if keys is None or "param" not in keys:
                    raise ReplayInputError(f"shard {shard} box {box_where(box)}: no 'param' came")
                prev = first.setdefault(box.name, (keys, box))
                if prev[0] != keys:
                    raise ReplayError(
                        f"boxes of {box.name!r} disagree on optimizer state: "
                        f"{box_where(prev[1])} has {sorted(prev[0] - {'param'})}, "
                        f"{box_where(box)} has {sorted(keys - {'param'})}"
                    )
        return self.params, {n: st for n, st in self.states.items() if st}
