"""Where each rank's bytes live: the layout, a rank's 1/N slice of every bucket, and the model.

The layout (``shadowgrad.layout.Layout``) fixes flat byte coordinates for every gradient byte:
bucket ``b``, byte offset ``o``. The trainer hooks never depend on the buckets DDP happens to use in
a given iteration (DDP rebuilds its buckets after the first backward, see ``shadowgrad.layout``):
every gradient is located by *parameter* in the layout, so whatever DDP does, the bytes a rank
sends are the same in every iteration, every run and every world size.

Rank ``r`` of ``N`` owns, in bucket ``b`` of ``e`` elements, the elements ``[e*r//N, e*(r+1)//N)``
(:func:`rank_slice`). That rule is shared with the shadows (a NACK can be directed at the owner).

The layout's module-state bucket (buffers, ``Layout.state_bucket``) is rank 0's alone, whole: DDP
broadcasts rank 0's buffers at every forward, so rank 0's are the model's. Rank 0's plan stages it
after its gradient slices (raw bytes, :attr:`RankPlan.state_pieces`) and sends it along the
layout's ``state_routes``, in mirror and in in-band mode alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from shadowgrad.dtypes import DType, wire_code
from shadowgrad.errors import LayoutError
from shadowgrad.layout import Layout
from shadowgrad.torch_dtypes import LAYOUT_TORCH_DTYPES

__all__ = ["Piece", "Run", "StatePiece", "RankPlan", "rank_slice", "param_map", "box_view"]

#: layout dtype name -> torch dtype (the one dtype table's index, :mod:`shadowgrad.torch_dtypes`)
_TORCH_DTYPES: Mapping[str, torch.dtype] = LAYOUT_TORCH_DTYPES


def rank_slice(bucket_nbytes: int, itemsize: int, rank: int, world: int) -> tuple[int, int]:
    """Bytes ``[lo, hi)`` of a bucket that ``rank`` of ``world`` sends (element-aligned)."""
    e = bucket_nbytes // itemsize
    return (e * rank // world) * itemsize, (e * (rank + 1) // world) * itemsize


@dataclass(frozen=True)
class Piece:
    """Bucket bytes ``[bucket_offset, +nbytes)`` = elements ``[elem_start, +numel)`` of ``name``,
    kept at ``staging_offset`` of the rank's staging buffer."""

    name: str
    bucket: int
    bucket_offset: int
    nbytes: int
    elem_start: int
    numel: int
    staging_offset: int
    dtype: str


@dataclass(frozen=True)
class StatePiece:
    """Module buffer ``name``, all ``nbytes`` of it, kept (raw) at ``staging_offset``."""

    name: str
    staging_offset: int
    nbytes: int


@dataclass(frozen=True)
class Run:
    """A contiguous byte range of one bucket owned by one shard, held contiguously in staging."""

    bucket: int
    start: int
    end: int
    shard: int
    staging_offset: int
    dtype: DType


class RankPlan:
    """What ``rank`` of ``world`` captures and sends under ``layout``.

    ``pieces`` say which gradient elements go where in the staging buffer (``staging_nbytes``
    long; the rank's slices of every bucket, in bucket order, then on rank 0 the module-state
    bucket: ``state_pieces``); ``runs`` say which staged bytes go to which shard. ``empty=True``:
    a plan without gradient slices (in-band mode's sender of COMMITs and module buffers).
    """

    def __init__(self, layout: Layout, rank: int, world: int, *, empty: bool = False) -> None:
        if not 0 <= rank < world:
            raise LayoutError(f"rank {rank} not in [0, {world})")
        self.layout = layout
        self.rank = rank
        self.world = world
        pieces: list[Piece] = []
        runs: list[Run] = []
        #: per bucket: (lo, hi, staging offset of lo)
        self.slices: list[tuple[int, int, int]] = []
        pos = 0
        for b, names in enumerate(layout.buckets):
            itemsize = layout.placement(names[0]).itemsize
            dtype = layout.placement(names[0]).spec.dtype
            mixed = {layout.placement(n).spec.dtype for n in names} - {dtype}
            if mixed:
                raise LayoutError(
                    f"bucket {b} mixes dtypes {dtype} and {sorted(mixed)[0]} (DDP never does)"
                )
            lo, hi = rank_slice(layout.bucket_nbytes[b], itemsize, rank, world)
            if empty:
                lo = hi = 0
            self.slices.append((lo, hi, pos))
            if hi > lo:
                for name in names:
                    pl = layout.placement(name)
                    a = max(lo, pl.bucket_offset)
                    z = min(hi, pl.bucket_offset + pl.nbytes)
                    if a < z:
                        pieces.append(
                            Piece(
                                name,
                                b,
                                a,
                                z - a,
                                (a - pl.bucket_offset) // itemsize,
                                (z - a) // itemsize,
                                pos + (a - lo),
                                dtype,
                            )
                        )
                wire = wire_code(dtype)
                for route in layout.bucket_routes[b]:
                    a, z = max(lo, route.start), min(hi, route.end)
                    if a < z:
                        runs.append(Run(b, a, z, route.shard, pos + (a - lo), wire))
            pos += hi - lo
        state_pieces: list[StatePiece] = []
        if rank == 0 and layout.state_bucket_nbytes:
            base = pos
            for box in layout.state_boxes:
                if box.bucket == layout.state_bucket:
                    state_pieces.append(StatePiece(box.name, base + box.bucket_offset, box.nbytes))
            for route in layout.state_routes:
                runs.append(
                    Run(
                        layout.state_bucket,
                        route.start,
                        route.end,
                        route.shard,
                        base + route.start,
                        DType.UINT8,
                    )
                )
            pos += layout.state_bucket_nbytes
        #: rank 0: the module buffers it stages (raw bytes) after the gradient slices
        self.state_pieces: tuple[StatePiece, ...] = tuple(state_pieces)
        self.pieces: tuple[Piece, ...] = tuple(pieces)
        self.runs: tuple[Run, ...] = tuple(runs)
        self.staging_nbytes = pos

    def runs_in(self, bucket: int, offset: int, length: int) -> Iterator[Run]:
        """Sub-runs of this rank's runs overlapping bucket bytes ``[offset, offset+length)``."""
        end = offset + length
        for run in self.runs:
            if run.bucket != bucket or run.end <= offset or run.start >= end:
                continue
            a, z = max(run.start, offset), min(run.end, end)
            yield Run(bucket, a, z, run.shard, run.staging_offset + (a - run.start), run.dtype)


def param_map(module: torch.nn.Module, layout: Layout) -> dict[str, torch.nn.Parameter]:
    """``name -> parameter`` for every layout parameter; checks shape and dtype."""
    named = dict(module.named_parameters())
    out: dict[str, torch.nn.Parameter] = {}
    for spec in layout.params:
        p = named.get(spec.name)
        if p is None:
            raise LayoutError(f"layout parameter {spec.name!r} is not in the model")
        if tuple(p.shape) != spec.shape or str(p.dtype).removeprefix("torch.") != spec.dtype:
            raise LayoutError(
                f"parameter {spec.name!r}: model has {tuple(p.shape)} {p.dtype}, layout has"
                f" {spec.shape} {spec.dtype}"
            )
        out[spec.name] = p
    return out


def box_view(
    full: torch.Tensor, elem_start: int, elem_count: int, lengths: Sequence[int]
) -> torch.Tensor:
    """The box of a whole tensor (a view when ``full`` is contiguous)."""
    return full.reshape(-1)[elem_start : elem_start + elem_count].view(tuple(lengths))


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise LayoutError(f"unsupported dtype {name!r}") from None
