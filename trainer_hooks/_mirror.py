"""Mirror mode's sender: a background thread that streams each rank's reduced-gradient slices and
rank 0's COMMIT records to the shadows over UDP, and answers the shadows' NACKs.

The training thread only copies its slice of the reduced gradients into a staging slot
(:meth:`MirrorSender.capture`) and enqueues it; everything else happens on the thread. Memory is
bounded by ``slots`` staging buffers (allocated as needed). A sent slot becomes *retransmit
history*: the newest ``history`` sent slots, at most ``history_s`` old, are never handed to a new
capture, so a sender that backs up cannot destroy what the shadows' NACKs need. When no slot is
free (the network or a shadow is slower than training), the iteration is *dropped* for the
shadows (event ``trainer.mirror.degraded``, once per change of state, plus a periodic summary):
training never waits. A NACK that history cannot answer any more is reported to
``on_unavailable`` at once (the session re-seeds that shadow instead of letting it burn repair
rounds).

The thread never blocks for long: the socket is non-blocking (a receive returns at once; a send
into a full buffer waits at most ``_SEND_WAIT_S`` for room, then counts a send error).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import random
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from shadowgrad import events
from shadowgrad._log import event
from shadowgrad.errors import WireError
from shadowgrad.wire import (
    HEADER_SIZE,
    MAX_DATAGRAM,
    CommitRecord,
    DataSealer,
    Flag,
    Kind,
    NackRecord,
    decode,
    encode_parts,
)

from ._guard import Peers, RepairBudget
from ._plan import RankPlan, Run, torch_dtype
from ._priority import ThreadPriority

__all__ = ["CommitInfo", "MirrorSender"]

log = logging.getLogger(__name__)

_FREE, _QUEUED, _SENT = 0, 1, 2  # a slot's state: never used, waiting to be sent, sent


@dataclass
class CommitInfo:
    """A COMMIT record whose scalars may still be device tensors (read on the sender thread)."""

    iteration: int
    lrs: tuple[float, ...]
    clip_coef: torch.Tensor | float | None
    loss_scale: torch.Tensor | float | None
    skipped: bool
    user_state: bytes
    ready: Any = None  # a CUDA event to wait for before reading tensors, or None
    no_grad: tuple[int, ...] = ()  # layout indices of parameters without a gradient

    def record(self) -> CommitRecord:
        if self.ready is not None:
            self.ready.synchronize()
        return CommitRecord(
            lrs=self.lrs,
            clip_coef=None if self.clip_coef is None else float(self.clip_coef),
            loss_scale=None if self.loss_scale is None else float(self.loss_scale),
            skipped=self.skipped,
            user_state=self.user_state,
            no_grad=self.no_grad,
        )


#: bytes before a slot's staging area (room for one header, cache-line aligned)
_LEAD = -(-HEADER_SIZE // 64) * 64
_FINAL, _RETX, _LAST = int(Flag.FINAL), int(Flag.RETX), int(Flag.LAST)


@dataclass
class _Slot:
    buf: torch.Tensor  # the staging area (captures write here)
    mv: memoryview  # bytes of the whole allocation: staging offset x is at mv[_LEAD + x]
    iteration: int = -1
    state: int = _FREE
    busy: bool = False
    ready: Any = None
    sent_at: float = 0.0


@dataclass
class _Counters:
    data_chunks: int = 0
    data_bytes: int = 0
    retx_chunks: int = 0
    commits: int = 0
    heartbeats: int = 0
    nacks: int = 0
    nack_unavailable: int = 0
    rx_rejected: int = 0
    dropped_iterations: int = 0
    send_errors: int = 0
    injected_drops: int = 0
    #: wall seconds the training thread spent in :meth:`MirrorSender.capture` (mirror mode's
    #: own time on the training thread; the sender thread's CPU is apart), and how many
    capture_s: float = 0.0
    captures: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


def _bytes_view(t: torch.Tensor) -> memoryview:
    """A writable byte memoryview of a contiguous CPU uint8 tensor (no copy)."""
    arr: Any = t.numpy()
    return memoryview(arr).cast("B")


class MirrorSender:
    """Background sender of one rank (see the module docstring).

    ``shadow_addrs[k]`` is shadow ``k``'s UDP address; shard ``s`` goes to every shadow in
    ``shadows_of_shard(s)``. ``sock`` is bound to this rank's trainer address (shadows send
    NACKs there). ``commits=True`` on rank 0 only.
    """

    def __init__(
        self,
        plan: RankPlan,
        *,
        job: int,
        sock: socket.socket,
        shadow_addrs: Sequence[tuple[str, int]],
        chunk_bytes: int,
        slots: int = 4,
        commits: bool = False,
        heartbeat_s: float = 0.5,
        pin_memory: bool = False,
        max_queue: int = 64,
        drop_first_sends: float = 0.0,
        seed: int = 0,
        history: int | None = None,
        history_s: float = 30.0,
        digest: int | None = None,
        on_unavailable: Callable[[tuple[str, int], int], None] | None = None,
        summary_s: float = 30.0,
        commit_fanout: bool = False,
        commit_send: Callable[[bytes, tuple[str, int]], bool] | None = None,
        send_parts: Callable[[list[Any], tuple[str, int]], bool] | None = None,
        key: bytes | None = None,
        authenticate_data: bool = False,
        repair_budget: RepairBudget | None = None,
        background: bool = True,
    ) -> None:
        layout = plan.layout
        if chunk_bytes < 64 or chunk_bytes % 8:
            raise ValueError(f"chunk_bytes must be a multiple of 8 and >= 64, got {chunk_bytes}")
        self.plan = plan
        self.job = job
        self.rank = plan.rank
        #: the header's layout field: the layout digest mixed with the job's generation
        self.digest = layout.digest64 if digest is None else digest
        self.sock = sock
        sock.setblocking(False)
        self.shadow_addrs = list(shadow_addrs)
        self.chunk_bytes = chunk_bytes
        self.commits = commits
        #: the switch copies a COMMIT to every shadow of the job (p4/ingress.p4, to the group
        #: of the guard's jobs entry): send each once, to shadow 0's address, instead of once
        #: per shadow
        self.commit_fanout = commit_fanout
        #: how COMMITs leave (in-band through the target's loopback ports: the ring's
        #: FrameLink); default: this sender's socket
        self.commit_send = commit_send
        #: how DATA leaves (in-band: rank 0's module buffers through the ring's link, from the
        #: trainer address the shadows accept); default: this sender's socket
        self.send_parts = send_parts
        #: the job's record key (``wire.mac_key``): COMMITs carry a MAC, NACKs must; DATA too
        #: with ``authenticate_data``. None: nothing is authenticated (tests of the bare path)
        self.key = key
        self.authenticate_data = authenticate_data and key is not None
        #: seals DATA into the room in front of each chunk (None: DATA is not authenticated)
        self._sealer = (
            DataSealer(key, job=job, sender=self.rank, layout=self.digest)
            if self.authenticate_data and key is not None
            else None
        )
        #: NACKs are answered only from the job's shadows, within a resend budget per shadow
        self._shadows = Peers(self.shadow_addrs)
        self.repair_budget = repair_budget or RepairBudget()
        self.heartbeat_s = heartbeat_s
        self.counters = _Counters()
        #: DATA of a capture is sent at SCHED_IDLE while the sender keeps up (``_priority``);
        #: back to the thread's own policy when a newer capture arrives before it is done, or
        #: after ``heartbeat_s`` in the background (the shadows and the controller then hear
        #: from this rank as soon as they would at normal priority)
        self.priority = ThreadPriority(background)
        #: fault injection for tests: probability of silently dropping a first (non-RETX) send
        self.drop_first_sends = drop_first_sends
        self._rng = random.Random(seed)
        self._dest = [
            [self.shadow_addrs[k] for k in layout.shadows_of_shard(s)]
            for s in range(layout.num_shards)
        ]
        self._seq = collections.Counter[tuple[str, int]]()
        self._slot_nbytes = max(1, plan.staging_nbytes)
        self._pin = pin_memory
        self._max_slots = max(1, slots)
        #: sent slots kept for NACKs, never recycled by a capture (at least one slot stays for
        #: new captures)
        self.history = max(
            0, min(self._max_slots - 1, self._max_slots // 2 if history is None else history)
        )
        self.history_s = history_s
        self.on_unavailable = on_unavailable
        self._slots: list[_Slot] = []
        #: sent slots, oldest first (the retransmit history and the recycling order), and the
        #: slot holding each iteration: a capture and a NACK find theirs in O(1)
        self._history: collections.deque[_Slot] = collections.deque()
        self._by_iter: dict[int, _Slot] = {}
        #: slots allocated (their pages touched) but never captured into, taken first
        self._unused: list[_Slot] = []
        self._lock = threading.Lock()
        self._new_slot()  # the first one now: a failing allocation shows at attach
        #: state-change logging of drops: the reason of the current degraded spell, drops since
        #: the last summary, when that was
        self._drop_reason: str | None = None
        self._drops_since_summary = 0
        self._summary_s = summary_s
        self._next_summary = time.monotonic() + summary_s
        #: newest iteration that was dropped for the shadows (None: none)
        self.last_drop: int | None = None
        self._wake = threading.Condition(self._lock)
        self._queue: collections.deque[tuple[str, Any]] = collections.deque()
        self._max_queue = max_queue
        self._commits_kept: collections.OrderedDict[int, CommitRecord] = collections.OrderedDict()
        self._last_commit: tuple[int, CommitRecord] | None = None
        self._last_send = time.monotonic()
        self._stop = False
        # the other slots in the background, each written once: a capture into a slot whose
        # pages were never touched page-faults all of it in on the training thread (a
        # 100M-parameter rank's 200 MB slot: ~0.1 s, once per slot), and doing it here would
        # hold a (re)start up as long (the same memory a run holds after its first ``slots``
        # iterations anyway). A capture that finds no touched slot yet allocates one itself.
        self._prefault = threading.Thread(
            target=self._allocate_slots, name=f"shadowgrad-slots-r{plan.rank}", daemon=True
        )
        self._prefault.start()
        self._rx = bytearray(MAX_DATAGRAM)
        # self-pipe: work queued while the thread idles in select() wakes it at once (a
        # Condition cannot interrupt select, and a timed poll let the sender lag by its period)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._idle = False
        self._thread = threading.Thread(
            target=self._run, name=f"shadowgrad-mirror-r{plan.rank}", daemon=True
        )
        self._thread.start()

    # -- training thread ------------------------------------------------------------------

    def capture(
        self,
        iteration: int,
        grads: Mapping[str, torch.Tensor | None],
        buffers: Mapping[str, torch.Tensor] | None = None,
    ) -> bool:
        """Copy this rank's slices of the reduced gradients (and on rank 0 the module
        ``buffers``, raw, by name: ``plan.state_pieces``) and queue them. Never blocks.

        Returns False (and marks the checkpoint degraded) when the iteration had to be dropped.
        A parameter without a gradient (unused this iteration) is sent as zeros; the COMMIT
        names it (``CommitInfo.no_grad``) and the shadows skip it, as the optimizer does.
        """
        t0 = time.perf_counter()
        try:
            return self._capture(iteration, grads, buffers or {})
        finally:
            self.counters.capture_s += time.perf_counter() - t0
            self.counters.captures += 1

    def _capture(
        self,
        iteration: int,
        grads: Mapping[str, torch.Tensor | None],
        buffers: Mapping[str, torch.Tensor],
    ) -> bool:
        with self._lock:
            slot = self._take_slot()
            if slot is None or len(self._queue) >= self._max_queue:
                self._degrade_locked(iteration, "backlog")
                return False
            slot.state = _QUEUED
            slot.iteration = iteration
            self._by_iter[iteration] = slot
            self._recovered_locked(iteration)
        cuda = False
        dsts: list[torch.Tensor] = []
        srcs: list[torch.Tensor] = []
        for piece in self.plan.pieces:
            g = grads.get(piece.name)
            dst = slot.buf[piece.staging_offset : piece.staging_offset + piece.nbytes]
            if g is None:
                dst.zero_()
                continue
            src = g.detach().reshape(-1)[piece.elem_start : piece.elem_start + piece.numel]
            dsts.append(dst.view(torch_dtype(piece.dtype)))
            srcs.append(src)
            cuda = cuda or src.is_cuda
        for sp in self.plan.state_pieces:  # rank 0's module buffers, as raw bytes
            t = buffers[sp.name].detach()
            dsts.append(slot.buf[sp.staging_offset : sp.staging_offset + sp.nbytes])
            srcs.append(t.reshape(-1).view(torch.uint8))
            cuda = cuda or t.is_cuda
        if dsts:
            # one call for every piece: the GIL is released once for all the copies, not once
            # per piece (on busy cores each hand-back of the GIL to this thread can wait for a
            # scheduler slice while the sender thread runs)
            torch._foreach_copy_(dsts, srcs, non_blocking=cuda)
        slot.ready = None
        if cuda:
            ev = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ev.record()
            slot.ready = ev
        with self._lock:
            self._queue.append(("data", slot))
            # a capture while the previous one is still being sent in the background: the
            # sender fell behind, so it gets the CPU it needs again (it never lags more)
            self.priority.restore(behind=True)
            self._wake_thread_locked()
        return True

    def commit(self, info: CommitInfo) -> bool:
        """Queue rank 0's COMMIT record (after the data of the same iteration). Never blocks."""
        with self._lock:
            if len(self._queue) >= self._max_queue:
                self._degrade_locked(info.iteration, "backlog")
                return False
            self._queue.append(("commit", info))
            self._wake_thread_locked()
        return True

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the sender thread, in queue order (errors degrade the checkpoint)."""
        with self._lock:
            self._queue.append(("call", fn))
            self._wake_thread_locked()

    def request_commit(self, iteration: int, addr: tuple[str, int]) -> None:
        """Re-send COMMIT(iteration) to ``addr`` if it is still kept (any thread)."""

        def resend() -> None:
            rec = self._commits_kept.get(iteration)
            if rec is not None:
                self._broadcast_commit(iteration, rec, retx=True, only=addr)

        self.call_soon(resend)

    def request_ranges(self, iteration: int, nack: NackRecord, addr: tuple[str, int]) -> None:
        """Answer a shadow's NACK ranges of ``iteration`` from this sender's history (any
        thread; in-band mode: the ring passes on the ranges of the module-state bucket)."""
        self.counters.nacks += 1
        self.call_soon(lambda: self._answer_ranges(iteration, nack, addr))

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued so far was sent (for tests and shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._queue or self._sending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._stop = True
            self._wake_thread_locked()
        self._thread.join(timeout_s)
        self._prefault.join(timeout_s)
        if self._thread.is_alive():
            log.warning("mirror sender thread of rank %d did not stop in %gs", self.rank, timeout_s)

    def stats(self) -> dict[str, Any]:
        c = self.counters
        out = {k: v for k, v in vars(c).items() if k != "by_reason"}
        out["last_drop"] = self.last_drop
        out["slots_allocated"] = len(self._slots)
        # what the prefault thread allocates up to (fewer once an allocation failed): equal
        # to slots_allocated once it is done
        out["slots_max"] = self._max_slots
        # CPU seconds of the sender thread so far (encode, MAC, send, NACKs): off the critical
        # path, but on a machine without a spare core it competes with training
        out["thread_cpu_s"] = None
        ident = self._thread.ident
        if ident is not None and self._thread.is_alive():
            with contextlib.suppress(OSError, AttributeError):
                out["thread_cpu_s"] = time.clock_gettime(time.pthread_getcpuclockid(ident))
        out["rejected_by_reason"] = dict(c.by_reason)
        # slots sent in the background (SCHED_IDLE), and of them how many were put back to
        # normal priority before they were done: a newer capture came (the sender fell behind),
        # or the slot had been heartbeat_s in the background
        out["background_slots"] = self.priority.lowered
        out["background_behind"] = self.priority.behind
        out["background_overdue"] = self.priority.overdue
        return out

    # -- internals -----------------------------------------------------------------------

    _sending = False
    _in_rx = False
    #: the idle thread sleeps in select() until the next heartbeat or summary is due, at most
    #: this long (queued work, close and NACKs wake it at once): no periodic wake-ups that cost
    #: a training core CPU for nothing
    _IDLE_POLL_MAX_S = 0.25
    #: the longest a send waits for room in a full socket buffer
    _SEND_WAIT_S = 0.05
    #: at most this many datagrams are drained per receive poll (the queue is served between)
    _RX_BATCH = 64
    #: while sending, look at the receive socket (NACKs, READYs) after this many payload bytes,
    #: not after every datagram: a ``select`` per 64 KiB datagram was 8 % of the sender
    #: thread's CPU (py-spy, 10M mirror_sink); 256 KiB is 4 such datagrams, well under a
    #: millisecond of sending
    _POLL_BYTES = 256 * 1024

    def _wake_thread_locked(self) -> None:
        """New work for the thread: if it idles in select(), write to its self-pipe. (``_wake``
        is only for :meth:`flush` waiters, who care about sends finishing, not queueing.)"""
        if self._idle:
            self._idle = False
            # full: a wake-up is pending anyway
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def _alloc_slot(self) -> _Slot:
        # _LEAD bytes of room before the staging area: an authenticated chunk's header is
        # written in front of its payload, so the GMAC and sendmsg read one contiguous buffer
        full = torch.zeros(_LEAD + self._slot_nbytes, dtype=torch.uint8, pin_memory=self._pin)
        return _Slot(full[_LEAD:], _bytes_view(full))

    def _new_slot(self) -> _Slot:
        """Allocate a slot and add it to the unused ones (lock held, or at construction)."""
        slot = self._alloc_slot()
        self._slots.append(slot)
        self._unused.append(slot)
        return slot

    def _allocate_slots(self) -> None:
        """The prefault thread: allocate (and so touch) the slots up to ``slots``, one at a
        time outside the lock; stops at the first failed allocation (out of pinned memory:
        make do with what there is) or at close."""
        while True:
            with self._lock:
                if self._stop or len(self._slots) >= self._max_slots:
                    return
            try:
                slot = self._alloc_slot()
            except RuntimeError:
                with self._lock:
                    self._max_slots = len(self._slots)
                return
            with self._lock:
                if len(self._slots) >= self._max_slots:
                    return
                self._slots.append(slot)
                self._unused.append(slot)

    def _take_slot(self) -> _Slot | None:
        """A slot for a new capture (lock held): one never captured into yet (all are allocated
        at start), or the oldest sent one beyond the retransmit history (the newest
        ``history`` sent slots younger than ``history_s`` are kept for NACKs), skipping one
        a retransmission is being sent from. O(slots) at worst, O(1) as a rule."""
        if self._unused:
            return self._unused.pop()
        if len(self._slots) < self._max_slots:  # the prefault thread has not got this far
            try:
                self._new_slot()
                return self._unused.pop()
            except RuntimeError:
                self._max_slots = len(self._slots)
        # the oldest recyclable sent slot that no NACK is being answered from right now: a
        # retransmission of the oldest iteration (a NACK storm for it) must not make the next
        # capture fail while a younger slot beyond the history is free (seen in CI: dropped)
        excess = len(self._history) - self.history
        now = time.monotonic()
        for i, old in enumerate(self._history):
            if i >= excess and now - old.sent_at <= self.history_s:
                break  # kept for NACKs, and so is every younger one
            if old.busy:
                continue
            del self._history[i]
            if self._by_iter.get(old.iteration) is old:
                del self._by_iter[old.iteration]
            return old
        return None

    def _degrade(self, iteration: int, reason: str, **fields: Any) -> None:
        with self._lock:
            self._degrade_locked(iteration, reason, **fields)

    def _degrade_locked(self, iteration: int, reason: str, **fields: Any) -> None:
        """An iteration dropped for the shadows: logged when the state changes (first drop, or
        another reason), counted otherwise and summarised every ``summary_s``."""
        self.counters.dropped_iterations += 1
        self.last_drop = iteration if self.last_drop is None else max(self.last_drop, iteration)
        self._drops_since_summary += 1
        if reason != self._drop_reason:
            self._drop_reason = reason
            event(
                log,
                events.TRAINER_MIRROR_DEGRADED,
                logging.WARNING,
                rank=self.rank,
                iteration=iteration,
                reason=reason,
                **fields,
            )

    def _recovered_locked(self, iteration: int) -> None:
        if self._drop_reason is not None:
            event(
                log,
                events.TRAINER_MIRROR_STREAMING,
                rank=self.rank,
                iteration=iteration,
                dropped=self._drops_since_summary,
                previous=self._drop_reason,
            )
            self._drop_reason = None

    def _maybe_summary(self) -> None:
        now = time.monotonic()
        if now < self._next_summary:
            return
        self._next_summary = now + self._summary_s
        c = self.counters
        with self._lock:
            dropped, self._drops_since_summary = self._drops_since_summary, 0
        if dropped or c.nack_unavailable or c.send_errors:
            event(
                log,
                events.TRAINER_MIRROR_SUMMARY,
                logging.WARNING if dropped else logging.INFO,
                rank=self.rank,
                dropped=dropped,
                dropped_total=c.dropped_iterations,
                retx_chunks=c.retx_chunks,
                nacks=c.nacks,
                nack_unavailable=c.nack_unavailable,
                send_errors=c.send_errors,
            )

    def _run(self) -> None:
        self.priority.bind()
        try:
            while True:
                with self._lock:
                    if self._stop and not self._queue:
                        return
                    item = self._queue.popleft() if self._queue else None
                    self._sending = item is not None
                    self._idle = item is None
                if item is None:
                    self._poll_rx(self._idle_timeout(), wake=True)
                    with self._lock:
                        self._idle = False
                    self._maybe_heartbeat()
                    self._maybe_summary()
                    continue
                kind, obj = item
                try:
                    if kind == "data":
                        self._send_slot(obj)
                    elif kind == "commit":
                        self._send_commit(obj)
                    else:
                        obj()
                except Exception as exc:
                    self._degrade(getattr(obj, "iteration", -1), "error", error=repr(exc))
                    log.exception("mirror sender of rank %d", self.rank)
                with self._lock:
                    self._sending = False
                    self._wake.notify_all()
                self._poll_rx(0.0)
        finally:
            self.sock.close()
            with self._lock:
                self._idle = False
                for fd in (self._wake_r, self._wake_w):
                    os.close(fd)

    def _sendto(
        self,
        header: bytes | memoryview,
        payload: memoryview | bytes,
        addr: tuple[str, int],
        retx: bool = False,
        tag: bytes = b"",
    ) -> bool:
        if not retx and self.drop_first_sends and self._rng.random() < self.drop_first_sends:
            self.counters.injected_drops += 1
            return True
        parts = [p for p in (header, payload, tag) if len(p)]
        if self.send_parts is not None:
            if not self.send_parts(parts, addr):
                self.counters.send_errors += 1
                return False
            return True
        try:
            try:
                self.sock.sendmsg(parts, (), 0, addr)
            except BlockingIOError:  # send buffer full: wait a little for room, once
                select.select([], [self.sock], [], self._SEND_WAIT_S)
                self.sock.sendmsg(parts, (), 0, addr)
        except OSError as exc:
            self.counters.send_errors += 1
            if self.counters.send_errors in (1, 10, 100, 1000):
                log.warning("rank %d: send to %s failed: %s", self.rank, addr, exc)
            return False
        return True

    def _send_range(
        self, slot: _Slot, run: Run, *, retx: bool, only: tuple[str, int] | None = None
    ) -> None:
        bucket, start, end, staging, dtype = (
            run.bucket,
            run.start,
            run.end,
            run.staging_offset,
            run.dtype,
        )
        step = self.chunk_bytes
        flags_base = _FINAL | (_RETX if retx else 0)
        sealer = self._sealer
        mv = slot.mv
        iteration = slot.iteration
        dtype_code = int(dtype)
        dests = [only] if only is not None else self._dest[run.shard]
        seqs = self._seq
        poll_every = self._POLL_BYTES
        unpolled = 0
        for off in range(start, end, step):
            n = min(step, end - off)
            at = _LEAD + staging + (off - start)
            flags = flags_base | (_LAST if off + n >= end else 0)
            if only is not None and not self.repair_budget.take(only, n):
                self._count("repair_rate_limited")
                return
            for addr in dests:
                seq = seqs[addr]
                seqs[addr] = seq + 1
                if sealer is not None:
                    # the header in front of the payload, over the previous chunk's last bytes
                    # (kept and put back: a retransmission needs them): no payload copy
                    head = at - HEADER_SIZE
                    kept = bytes(mv[head:at])
                    try:
                        trailer = sealer.seal(
                            mv,
                            at,
                            n,
                            iteration=iteration,
                            seq=seq,
                            flags=flags,
                            dtype=dtype_code,
                            bucket=bucket,
                            offset=off,
                        )
                        ok = self._sendto(mv[head : at + n], b"", addr, retx, trailer)
                    finally:
                        mv[head:at] = kept
                else:
                    fields: dict[str, Any] = {
                        "job": self.job,
                        "sender": self.rank,
                        "iteration": iteration,
                        "seq": seq,
                        "layout": self.digest,
                        "flags": flags,
                        "dtype": dtype,
                        "bucket": bucket,
                        "offset": off,
                    }
                    payload = mv[at : at + n]
                    header, _ = encode_parts(Kind.DATA, key=None, payload=payload, **fields)
                    ok = self._sendto(header, payload, addr, retx)
                if ok:
                    if retx:
                        self.counters.retx_chunks += 1
                    else:
                        self.counters.data_chunks += 1
                        self.counters.data_bytes += n
            unpolled += n
            if unpolled >= poll_every:
                unpolled = 0
                self._poll_rx(0.0)
                if self.priority.low:
                    self._background_deadline()
        if unpolled:
            self._poll_rx(0.0)

    def _background_deadline(self) -> None:
        """Back to normal priority once a slot was ``heartbeat_s`` in the background: training
        that keeps every core busy for longer (an evaluation pass, another job) must not
        starve the checkpoint."""
        if time.monotonic() - self.priority.since >= self.heartbeat_s:
            with self._lock:
                self.priority.restore(overdue=True)

    def _send_slot(self, slot: _Slot) -> None:
        if slot.ready is not None:
            slot.ready.synchronize()
        with self._lock:
            slot.busy = True
            if not any(kind == "data" for kind, _ in self._queue):
                self.priority.lower()  # keeping up: send in the cycles training leaves
        try:
            for run in self.plan.runs:
                self._send_range(slot, run, retx=False)
        finally:
            with self._lock:
                self.priority.restore()  # COMMITs, heartbeats and repairs at normal priority
                slot.busy = False
                slot.state = _SENT
                slot.sent_at = time.monotonic()
                self._history.append(slot)
        self._last_send = time.monotonic()

    def _send_commit(self, info: CommitInfo) -> None:
        rec = info.record()
        self._commits_kept[info.iteration] = rec
        # as long as the data of an iteration can be retransmitted (slots allocate lazily)
        while len(self._commits_kept) > max(8, self._max_slots):
            self._commits_kept.popitem(last=False)
        self._last_commit = (info.iteration, rec)
        self._broadcast_commit(info.iteration, rec, retx=False)
        self.counters.commits += 1

    def _broadcast_commit(
        self, iteration: int, rec: CommitRecord, *, retx: bool, only: tuple[str, int] | None = None
    ) -> None:
        targets = (
            [only]
            if only is not None
            else self.shadow_addrs[:1]
            if self.commit_fanout
            else self.shadow_addrs
        )
        for addr in targets:
            seq = self._seq[addr]
            self._seq[addr] = seq + 1
            data = rec.encode(
                job=self.job,
                sender=self.rank,
                iteration=iteration,
                seq=seq,
                layout=self.digest,
                retx=retx,
                key=self.key,
            )
            if self.commit_send is not None:
                if not self.commit_send(data, addr):
                    self.counters.send_errors += 1
            else:
                self._sendto(data, b"", addr, retx)
        self._last_send = time.monotonic()

    def _idle_timeout(self) -> float:
        """Seconds until the next heartbeat or summary is due (1 ms to ``_IDLE_POLL_MAX_S``)."""
        due = self._next_summary
        if self.commits and self._last_commit is not None:
            due = min(due, self._last_send + self.heartbeat_s)
        return min(self._IDLE_POLL_MAX_S, max(0.001, due - time.monotonic()))

    def _maybe_heartbeat(self) -> None:
        if not self.commits or self._last_commit is None:
            return
        if time.monotonic() - self._last_send >= self.heartbeat_s:
            it, rec = self._last_commit
            self._broadcast_commit(it, rec, retx=True)
            self.counters.heartbeats += 1

    def _poll_rx(self, timeout_s: float, wake: bool = False) -> None:
        if self._in_rx:
            return
        self._in_rx = True
        try:
            self._poll_rx_inner(timeout_s, wake)
        finally:
            self._in_rx = False

    def _poll_rx_inner(self, timeout_s: float, wake: bool) -> None:
        fds: list[Any] = [self.sock, self._wake_r] if wake else [self.sock]
        try:
            ready, _, _ = select.select(fds, [], [], timeout_s)
        except (OSError, ValueError):
            return
        if self._wake_r in ready:
            with contextlib.suppress(OSError):
                os.read(self._wake_r, 64)
        if self.sock not in ready:
            return
        # the socket is non-blocking: an empty queue ends the loop at once (on a socket with a
        # timeout, CPython would wait that long before every receive, MSG_DONTWAIT or not)
        for _ in range(self._RX_BATCH):
            try:
                n, addr = self.sock.recvfrom_into(self._rx, MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self._on_datagram(memoryview(self._rx)[:n], addr)

    def _count(self, reason: str) -> None:
        self.counters.rx_rejected += 1
        self.counters.by_reason[reason] = self.counters.by_reason.get(reason, 0) + 1

    def _on_datagram(self, buf: memoryview, addr: tuple[str, int]) -> None:
        if addr not in self._shadows:  # only the job's shadows may ask for anything
            self._count("not_a_shadow")
            return
        try:
            msg = decode(buf, job=self.job, layout=self.digest, key=self.key)
        except WireError as exc:
            self._count(exc.reason)
            return
        if msg.header.kind is not Kind.NACK:
            self._count("unexpected_kind")
            return
        self.counters.nacks += 1
        it = msg.header.iteration
        nack = NackRecord.from_message(msg)
        rec = self._commits_kept.get(it)
        if rec is not None:
            if self.repair_budget.take(addr, 256):
                self._broadcast_commit(it, rec, retx=True, only=addr)
            else:
                self._count("repair_rate_limited")
        if not nack.ranges:
            return
        self._answer_ranges(it, nack, addr)

    def _answer_ranges(self, it: int, nack: NackRecord, addr: tuple[str, int]) -> None:
        """Resend the ranges of ``nack`` this rank sent, from the history slot of ``it``."""
        with self._lock:
            slot = self._by_iter.get(it)
            if slot is not None and slot.state != _SENT:
                return  # still queued: it is on its way
            if slot is not None and (slot.busy or time.monotonic() - slot.sent_at > self.history_s):
                slot = None
            if slot is not None:
                slot.busy = True
        if slot is None:  # not kept, not on its way: repair cannot help this shadow any more
            self.counters.nack_unavailable += 1
            if self.on_unavailable is not None:
                self.on_unavailable(addr, it)
            return
        try:
            for r in nack.ranges:
                for run in self.plan.runs_in(r.bucket, r.offset, r.length):
                    self._send_range(slot, run, retx=True, only=addr)
        finally:
            with self._lock:
                slot.busy = False
