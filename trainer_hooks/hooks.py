"""DDP comm hooks that reduce in *layout* coordinates, whatever buckets DDP uses.

DDP's first iteration uses one bucket per dtype and rebuilds its buckets after the first backward
(``shadowgrad.layout``); a restarted job's first iteration is a "first iteration" again. An
all-reduce adds the ranks' values in an order that depends on where an element sits in the
buffer being reduced (ring chunking, algorithm choice by size), so the same gradients reduced in
differently composed buckets can differ in the last bit — and a resumed run would no longer be
bit-identical to an uninterrupted one. These hooks therefore never reduce DDP's buckets as they
are: every gradient is copied into the flat buffer of its **layout bucket**, each layout bucket is
reduced as one tensor once all its gradients have arrived (possibly from several DDP buckets),
and the results are copied back. The reduction of every element is then the same in every
iteration, every run and after every restart.

This module deliberately has no ``from __future__ import annotations``: DDP's
``register_comm_hook`` checks the hook's annotations as objects.
"""

import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import GradBucket  # type: ignore[attr-defined]

from shadowgrad.errors import LayoutError
from shadowgrad.layout import Layout

__all__ = ["LayoutReducer", "layout_hook"]

#: ``reduce(layout_bucket, flat_tensor) -> Future`` completing when ``flat_tensor`` holds the
#: *average* over ranks
ReduceFn = Callable[[int, torch.Tensor], "torch.futures.Future[Any]"]


class LayoutReducer:
    """State of :func:`layout_hook`: per layout bucket, a flat buffer and its arrival count.

    ``reduce`` defaults to ``all_reduce(SUM)`` of ``flat / world`` on ``process_group``; the in-band
    ring passes its own.
    """

    def __init__(
        self,
        layout: Layout,
        params: Mapping[str, torch.nn.Parameter],
        process_group: Any = None,
        reduce: ReduceFn | None = None,
    ) -> None:
        self.layout = layout
        self.pg = process_group
        self._name_of = {id(p): n for n, p in params.items()}
        self._where: dict[str, tuple[int, int]] = {}
        for name in params:
            pl = layout.placement(name)
            self._where[name] = (pl.bucket, pl.bucket_offset // pl.itemsize)
        self._count = [len(b) for b in layout.buckets]
        self._numel = [
            layout.bucket_nbytes[b] // layout.placement(names[0]).itemsize
            for b, names in enumerate(layout.buckets)
        ]
        self._bufs: list[torch.Tensor | None] = [None] * len(layout.buckets)
        self._reduce = reduce or self._allreduce
        self._lock = threading.Lock()
        #: the training iteration being reduced (counts completed backward passes)
        self.iteration = 0
        self._reset()
        #: number of layout-bucket reductions done, and how many of them without copies
        self.reductions = 0
        self.zero_copy = 0
        self._exact = {tuple(names): b for b, names in enumerate(layout.buckets)}

    def _reset(self) -> None:
        self._arrived = [0] * len(self._count)
        self._futs: dict[int, torch.futures.Future[Any]] = {}
        self._launched: set[int] = set()

    def _buf(self, b: int, like: torch.Tensor) -> torch.Tensor:
        t = self._bufs[b]
        if t is None or t.device != like.device or t.dtype != like.dtype:
            t = torch.empty(self._numel[b], dtype=like.dtype, device=like.device)
            self._bufs[b] = t
        return t

    def _allreduce(self, b: int, flat: torch.Tensor) -> "torch.futures.Future[Any]":
        world = dist.get_world_size(self.pg)
        flat.div_(world)
        work = dist.all_reduce(flat, group=self.pg, async_op=True)
        assert work is not None
        fut: torch.futures.Future[Any] = work.get_future()
        return fut

    def bucket(self, bucket: GradBucket) -> "torch.futures.Future[torch.Tensor]":
        buf = bucket.buffer()
        params = bucket.parameters()
        names = tuple(self._name_of.get(id(p), "") for p in params)
        b0 = self._exact.get(names)
        if b0 is not None and buf.numel() == self._numel[b0]:
            # DDP's bucket *is* layout bucket b0 (same parameters, same order): reduce it in
            # place, no copies -- the same tensor as the copy path would reduce
            with self._lock:
                self._arrived[b0] = self._count[b0]
                self._launched.add(b0)
                self.reductions += 1
                self.zero_copy += 1
                inner = self._reduce(b0, buf)
                if len(self._launched) == len(self._count):
                    self._reset()
                    self.iteration += 1

            def same(f: Any) -> torch.Tensor:
                f.wait()  # re-raises a failed reduction (a peer died): never swallow it
                out: torch.Tensor = buf
                return out

            return inner.then(same)
        entries: list[tuple[int, int, int, int]] = []  # layout bucket, its elem off, n, DDP off
        off = 0
        with self._lock:
            for p in bucket.parameters():
                name = self._name_of.get(id(p))
                if name is None:
                    raise LayoutError(
                        f"DDP bucket holds a parameter of shape {tuple(p.shape)} "
                        "that is not in the layout"
                    )
                b, lo = self._where[name]
                n = p.numel()
                self._buf(b, buf)[lo : lo + n].copy_(buf[off : off + n])
                entries.append((b, lo, n, off))
                self._arrived[b] += 1
                off += n
            futs: list[torch.futures.Future[Any]] = []
            for b in sorted({e[0] for e in entries}):
                fut = self._futs.get(b)
                if fut is None:
                    fut = self._futs[b] = torch.futures.Future()
                if self._arrived[b] == self._count[b] and b not in self._launched:
                    self._launched.add(b)
                    self._launch(b, fut)
                futs.append(fut)
            if len(self._launched) == len(self._count):
                self._reset()
                self.iteration += 1
        bufs = self._bufs

        def back(done: Any) -> torch.Tensor:
            for f in done.wait():
                f.wait()  # re-raises a failed reduction (a peer died): never swallow it
            for b, lo, n, o in entries:
                src = bufs[b]
                assert src is not None
                buf[o : o + n].copy_(src[lo : lo + n])
            out: torch.Tensor = buf
            return out

        return torch.futures.collect_all(futs).then(back)

    def _launch(self, b: int, fut: "torch.futures.Future[Any]") -> None:
        flat = self._bufs[b]
        assert flat is not None
        self.reductions += 1
        inner = self._reduce(b, flat)

        def done(f: "torch.futures.Future[Any]") -> None:
            try:
                f.wait()
            except Exception as exc:
                fut.set_exception(exc)
                return
            fut.set_result(None)

        inner.add_done_callback(done)


def layout_hook(state: LayoutReducer, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP comm hook: ``ddp.register_comm_hook(LayoutReducer(...), layout_hook)``."""
    return state.bucket(bucket)
