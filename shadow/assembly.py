"""Reassembly of one shard's gradient bytes: shard-local geometry, coverage, per-iteration buffers.

A shard owns a list of boxes (``Layout.shard_boxes``), each a contiguous byte range of one DDP
bucket. The shadow keeps, per iteration in flight, one preallocated shard-local byte buffer in
which box ``k`` lives at ``ShardGeometry.local_offsets[k]`` (64-byte aligned, so every box can be
viewed as its dtype without a copy). An incoming DATA chunk ``(bucket, offset, length)`` is
intersected with the shard's segments of that bucket (bisect, O(log boxes)), and only the bytes
not yet covered are copied (memoryview slice assignment = memcpy), so a duplicate never
overwrites anything. Coverage is an exact interval set over shard-local byte coordinates.

The shard's module-state buffers (``Layout.shard_state_boxes`` of kind ``buffer``) are placed
the same way, after its parameter boxes: they arrive as raw bytes (wire dtype ``uint8``) of the
layout's reserved state bucket, count towards completeness (an iteration is not ready without
its buffers) and are repaired by the same NACKs. Frozen parameters have no place here: they
never travel per iteration.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from shadowgrad.dtypes import DTYPES, DType, wire_code
from shadowgrad.layout import Box, Layout
from shadowgrad.torch_dtypes import LAYOUT_TORCH_DTYPES

__all__ = ["IntervalSet", "Segment", "ShardGeometry", "IterBuffer", "PlaceResult"]

#: alignment of every box inside the shard-local buffer (bytes)
LOCAL_ALIGN = 64


class IntervalSet:
    """A set of disjoint, non-adjacent half-open integer intervals ``[s, e)``, kept sorted.

    :meth:`add` returns exactly the sub-intervals that were not covered before (so the caller
    copies only new bytes) and merges. Exactness: the invariant ``starts[k] < ends[k] <
    starts[k+1]`` holds after every call (intervals never touch), so :attr:`total` is the exact
    number of covered integers.
    """

    __slots__ = ("_ends", "_starts", "total")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.total = 0

    def __len__(self) -> int:
        return len(self._starts)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._ends, strict=True))

    def add(self, s: int, e: int) -> list[tuple[int, int]]:
        """Cover ``[s, e)``; return the newly covered pieces in order."""
        if e <= s:
            return []
        starts, ends = self._starts, self._ends
        if not starts or s > ends[-1]:  # fast path: past everything (in-order arrival)
            starts.append(s)
            ends.append(e)
            self.total += e - s
            return [(s, e)]
        if s == ends[-1]:
            ends[-1] = e
            self.total += e - s
            return [(s, e)]
        # first interval that could touch [s, e): the last one starting at or before s
        i = bisect.bisect_right(starts, s) - 1
        if i < 0 or ends[i] < s:
            i += 1  # interval i-1 ends before s (no touch); start with the next one
        j = i
        new: list[tuple[int, int]] = []
        cur = s
        lo, hi = s, e
        while j < len(starts) and starts[j] <= e:
            if starts[j] > cur:
                new.append((cur, starts[j]))
            cur = max(cur, ends[j])
            lo = min(lo, starts[j])
            hi = max(hi, ends[j])
            j += 1
        if cur < e:
            new.append((cur, e))
        starts[i:j] = [lo]
        ends[i:j] = [hi]
        self.total += sum(b - a for a, b in new)
        return new

    def gaps(self, s: int, e: int) -> list[tuple[int, int]]:
        """The sub-intervals of ``[s, e)`` that are not covered."""
        out: list[tuple[int, int]] = []
        starts, ends = self._starts, self._ends
        i = max(0, bisect.bisect_right(starts, s) - 1)
        cur = s
        while i < len(starts) and starts[i] < e:
            if ends[i] > cur:
                if starts[i] > cur:
                    out.append((cur, starts[i]))
                cur = ends[i]
            i += 1
        if cur < e:
            out.append((cur, e))
        return out

    def covers(self, s: int, e: int) -> bool:
        """Whether every byte of ``[s, e)`` is covered (``s < e``)."""
        starts, ends = self._starts, self._ends
        if starts and starts[-1] <= s:  # in-order arrival: the last interval
            return e <= ends[-1]
        i = bisect.bisect_right(starts, s) - 1
        return i >= 0 and e <= ends[i]

    def disjoint(self, s: int, e: int) -> bool:
        """Whether no byte of ``[s, e)`` is covered (``s < e``)."""
        starts, ends = self._starts, self._ends
        if not starts or s >= ends[-1]:  # in-order arrival: past everything
            return True
        i = bisect.bisect_right(starts, s) - 1  # the last interval starting at or before s
        if i >= 0 and ends[i] > s:
            return False
        return i + 1 >= len(starts) or starts[i + 1] >= e


@dataclass(frozen=True)
class Segment:
    """Box ``index`` of the shard: bucket bytes ``[start, end)`` live at ``local`` onwards."""

    index: int
    bucket: int
    start: int
    end: int
    local: int
    itemsize: int


@dataclass(frozen=True)
class PlaceResult:
    """Outcome of placing one chunk: bytes of it inside the shard, and of those the new ones."""

    owned: int
    new: int


#: layout dtype name -> torch dtype (the one dtype table's index, :mod:`shadowgrad.torch_dtypes`)
_TORCH_DTYPES = LAYOUT_TORCH_DTYPES


class ShardGeometry:
    """Where the shard's boxes live in bucket coordinates and in the shard-local buffer."""

    def __init__(self, layout: Layout, shard: int) -> None:
        self.layout = layout
        self.shard = shard
        self.boxes: tuple[Box, ...] = layout.shard_boxes(shard)
        #: the shard's module-state boxes (entries ``len(boxes)`` on of its state lists)
        self.state_boxes: tuple[Box, ...] = layout.shard_state_boxes(shard)
        #: entries of the shard's state lists (load, fetch, export): parameter + state boxes
        self.entries = len(self.boxes) + len(self.state_boxes)
        offs: list[int] = []
        pos = 0
        for box in self.boxes:
            pos = -(-pos // LOCAL_ALIGN) * LOCAL_ALIGN
            offs.append(pos)
            pos += box.nbytes
        self.local_offsets = tuple(offs)
        #: per streamed buffer: (index into state_boxes, its shard-local byte offset)
        self.buffer_offsets: tuple[tuple[int, int], ...] = ()
        placed: list[tuple[int, Box, int]] = [(k, b, offs[k]) for k, b in enumerate(self.boxes)]
        buf_offs: list[tuple[int, int]] = []
        for j, box in enumerate(self.state_boxes):
            if box.bucket != layout.state_bucket:
                continue  # frozen: never streamed
            pos = -(-pos // LOCAL_ALIGN) * LOCAL_ALIGN
            buf_offs.append((j, pos))
            placed.append((len(self.boxes) + j, box, pos))
            pos += box.nbytes
        self.buffer_offsets = tuple(buf_offs)
        #: every streamed box (parameter boxes, then buffers): (entry index, box, local offset)
        self._placed = tuple(placed)
        self.local_nbytes = max(pos, 1)
        #: bytes the shard owns (what "complete" means), buffers included
        self.owned_nbytes = sum(b.nbytes for _, b, _ in placed)
        stream_buckets = len(layout.bucket_nbytes) + (1 if layout.state_bucket_nbytes else 0)
        nb = stream_buckets
        per_bucket: list[list[Segment]] = [[] for _ in range(nb)]
        for k, box, local in placed:
            if box.nbytes:
                per_bucket[box.bucket].append(
                    Segment(
                        k,
                        box.bucket,
                        box.bucket_offset,
                        box.bucket_end,
                        local,
                        1 if box.bucket == layout.state_bucket else DTYPES[box.dtype].itemsize,
                    )
                )
        for segs in per_bucket:
            segs.sort(key=lambda s: s.start)
        self.segments: tuple[tuple[Segment, ...], ...] = tuple(tuple(s) for s in per_bucket)
        self._starts = [[s.start for s in segs] for segs in per_bucket]
        #: wire dtype code of each bucket (DDP never mixes dtypes in a bucket)
        self.bucket_dtype: list[int | None] = [None] * nb
        for box in layout.boxes:
            self.bucket_dtype[box.bucket] = int(wire_code(box.dtype))
        self.bucket_nbytes: tuple[int, ...] = layout.bucket_nbytes
        if layout.state_bucket_nbytes:  # the reserved state bucket: raw bytes
            self.bucket_dtype[layout.state_bucket] = int(DType.UINT8)
            self.bucket_nbytes = (*layout.bucket_nbytes, layout.state_bucket_nbytes)

    def overlaps(self, bucket: int, offset: int, length: int) -> Iterator[tuple[Segment, int, int]]:
        """Segments of ``bucket`` overlapping bucket bytes ``[offset, offset+length)``, with the
        overlap ``[a, b)`` in bucket coordinates."""
        segs = self.segments[bucket]
        end = offset + length
        i = max(0, bisect.bisect_right(self._starts[bucket], offset) - 1)
        while i < len(segs):
            seg = segs[i]
            if seg.start >= end:
                break
            a = max(seg.start, offset)
            b = min(seg.end, end)
            if a < b:
                yield seg, a, b
            i += 1

    def owns_any(self, bucket: int, offset: int, length: int) -> bool:
        """Whether bucket bytes ``[offset, offset+length)`` hold any byte of this shard."""
        i = bisect.bisect_right(self._starts[bucket], offset) - 1
        if i >= 0 and offset < self.segments[bucket][i].end:  # the usual case: inside a box
            return True
        return next(self.overlaps(bucket, offset, length), None) is not None

    def local_to_bucket(self, s: int, e: int) -> list[tuple[int, int, int]]:
        """A shard-local byte range (inside owned boxes) as ``(bucket, offset, length)``."""
        out: list[tuple[int, int, int]] = []
        for _, box, lo in self._placed:
            if lo >= e:
                break
            a, b = max(s, lo), min(e, lo + box.nbytes)
            if a < b:
                out.append((box.bucket, box.bucket_offset + (a - lo), b - a))
        return out

    def missing(self, cov: IntervalSet) -> list[tuple[int, int, int]]:
        """Every owned byte range not in ``cov``, as ``(bucket, offset, length)``, merged."""
        out: list[tuple[int, int, int]] = []
        for _, box, lo in self._placed:
            for a, b in cov.gaps(lo, lo + box.nbytes):
                bucket, off, n = box.bucket, box.bucket_offset + (a - lo), b - a
                if out and out[-1][0] == bucket and out[-1][1] + out[-1][2] == off:
                    out[-1] = (bucket, out[-1][1], out[-1][2] + n)
                else:
                    out.append((bucket, off, n))
        return out

    def box_views(self, buf: torch.Tensor) -> list[torch.Tensor]:
        """Per-box tensors (box dtype, shape ``box.lengths``) viewing the uint8 ``buf``."""
        out: list[torch.Tensor] = []
        for k, box in enumerate(self.boxes):
            lo = self.local_offsets[k]
            t = buf[lo : lo + box.nbytes].view(_TORCH_DTYPES[box.dtype])
            out.append(t.view(box.lengths))
        return out

    def buffer_views(self, buf: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """Per streamed buffer: (index into ``state_boxes``, its raw bytes in ``buf``)."""
        return [(j, buf[lo : lo + self.state_boxes[j].nbytes]) for j, lo in self.buffer_offsets]


class IterBuffer:
    """One preallocated shard-local gradient buffer and its exact coverage.

    ``inflight``: shard-local ranges a receive thread is receiving straight into (uncovered
    when reserved, covered only once the datagram verified; see ``Receiver``); nothing else
    writes them meanwhile. They outlive :meth:`reset` (the receive may still be writing when
    the buffer is recycled), whose ``epoch`` tells the receiver its datagram lost its place.
    """

    def __init__(self, geom: ShardGeometry) -> None:
        self.geom = geom
        self.tensor = torch.zeros(geom.local_nbytes, dtype=torch.uint8)
        self.mv = self.tensor.numpy().data.cast("B")
        self.cov = IntervalSet()
        self.inflight: list[tuple[int, int]] = []
        self.epoch = 0

    def reset(self) -> None:
        self.cov = IntervalSet()
        self.epoch += 1

    def reserved(self, bucket: int, offset: int, length: int) -> bool:
        """Whether an owned byte of the chunk lies in a range being received into."""
        inflight = self.inflight
        if not inflight:
            return False
        for seg, a, b in self.geom.overlaps(bucket, offset, length):
            s = seg.local + (a - seg.start)
            e = s + (b - a)
            for x, y in inflight:
                if x < e and s < y:
                    return True
        return False

    @property
    def complete(self) -> bool:
        return self.cov.total == self.geom.owned_nbytes

    def place(self, bucket: int, offset: int, payload: memoryview) -> PlaceResult:
        """Copy the not-yet-covered owned bytes of a chunk; the caller checked bucket bounds."""
        owned = new = 0
        mv = self.mv
        n = payload.nbytes
        geom = self.geom
        starts = geom._starts[bucket]
        i = bisect.bisect_right(starts, offset) - 1
        if i >= 0:
            seg = geom.segments[bucket][i]
            if offset + n <= seg.end:  # fast path: the chunk lies inside one box
                ls = seg.local + (offset - seg.start)
                for x, y in self.cov.add(ls, ls + n):
                    mv[x:y] = payload[x - ls : y - ls]
                    new += y - x
                return PlaceResult(n, new)
        for seg, a, b in geom.overlaps(bucket, offset, n):
            owned += b - a
            ls = seg.local + (a - seg.start)
            for x, y in self.cov.add(ls, ls + (b - a)):
                src = a + (x - ls) - offset
                mv[x:y] = payload[src : src + (y - x)]
                new += y - x
        return PlaceResult(owned, new)

    def views(self) -> list[torch.Tensor]:
        return self.geom.box_views(self.tensor)

    def buffer_views(self) -> list[tuple[int, torch.Tensor]]:
        return self.geom.buffer_views(self.tensor)
