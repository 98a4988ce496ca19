"""In-band mode: ring reduce-scatter + all-gather over a reliable datagram transport.

Every rank talks to its two ring neighbours only: it sends DATA to ``next = (r+1) % N`` and
receives DATA from ``prev = (r-1) % N``, over one :class:`~shadowgrad.trainer_hooks.link.Link`.

**Transport.** One stream per direction, numbered by the header ``seq``. The sender keeps at most
``window`` datagrams unacknowledged (flow control: the window times the datagram size stays below
the receiver's socket buffer, so a slow receiver makes the sender wait instead of losing data),
keeps a copy of each until acknowledged, and retransmits after ``rto_s`` (doubling per try, up to
``max_rto_s``) with the RETX flag. The receiver delivers in sequence order (out-of-order datagrams
are buffered, duplicates dropped) and acknowledges cumulatively plus a 64-bit SACK bitmap
(``wire.AckRecord``): at once after a datagram out of order, one that fills a gap or a
duplicate (a loss, a retransmission, or a lost ACK), else after every ``window // 4``
datagrams in order or :attr:`RingAllReduce.ACK_DELAY_S` after the first one not yet
acknowledged, whichever comes first. An ACK per datagram would cost both ends a datagram's work
and, in-band, the switch a packet; the sender never waits for a delayed ACK: a quarter of its
window is acknowledged long before it fills, and the delay is a fraction of ``rto_s``. A
stream that makes no progress for ``timeout_s`` raises
:class:`~shadowgrad.errors.ShadowgradTimeout`.

**Copies.** One per byte each way: a payload sent is copied from the bucket into a datagram
buffer (the bucket changes before every datagram is acknowledged); a datagram received lands in
a buffer the inbox keeps until its payload is added to (or stored in) the bucket. The buffers
come from a pool and go back to it once acknowledged, added or no longer retained, so a ring
that runs allocates none: a 64 KiB buffer allocated and freed per datagram costs malloc's churn
and, where the heap shrinks and grows again, the kernel a zeroed page per 4 KiB.

**Ring.** A flat buffer of ``n`` elements is cut into ``N`` chunks ``[n*k//N, n*(k+1)//N)``. Each
rank first divides its buffer by ``N``. Reduce-scatter step ``s`` (``0..N-2``): rank ``r`` sends
chunk ``(r-s) % N`` and adds the chunk ``(r-s-1) % N`` it receives into its own; afterwards rank
``r`` holds the complete sum of chunk ``(r+1) % N``, added in the fixed order
``((x_k + x_{k+1}) + x_{k+2}) + ...`` starting at rank ``k``. All-gather step ``s``: rank ``r``
sends chunk ``(r+1-s) % N`` and stores the chunk ``(r-s) % N`` it receives. Every rank ends with
the same bits, and the same inputs give the same bits in every run — the order never depends on
timing, loss or retransmission. The first send of each fully reduced chunk (all-gather step 0)
is tagged FINAL (its retransmissions FINAL|RETX); reduce-scatter traffic and later all-gather
forwards are untagged, so each reduced byte is tagged exactly once per iteration.

**Shadows.** The FINAL bytes this rank produced are kept for the last ``retain`` iterations, and
a shadow's NACK for them is answered with FINAL|RETX DATA sent straight to the shadow. With
``retain=0`` (a ring without shadows) they are never copied and every NACK is unavailable; the
FINAL tagging, a header bit, is the same.

**MACs.** With ``authenticate_data`` the DATA a shadow receives carries the GMAC trailer: the
FINAL datagrams (the switch copies them to the shadows) and the NACK repairs; a FINAL datagram
without one is refused here too. The rest of the ring's DATA goes from trainer to trainer only,
as a collective library's does, and carries none unless ``authenticate_ring`` (docs/security.md
says what that leaves open). ACKs always carry one.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from shadowgrad import events
from shadowgrad._log import event
from shadowgrad.errors import ShadowgradError, ShadowgradTimeout, WireError
from shadowgrad.torch_dtypes import GRAD_WIRE_DTYPES
from shadowgrad.wire import (
    AUTHENTICATED_KINDS,
    HEADER_SIZE,
    MAX_DATAGRAM,
    MAX_PAYLOAD,
    AckRecord,
    DataSealer,
    DType,
    Flag,
    Kind,
    NackRecord,
    decode,
    encode,
    encode_header,
    seal,
)

from ._guard import Peers, RepairBudget, canonical
from .link import Address, Link

__all__ = ["RingConfig", "RingAllReduce", "TransportError"]

log = logging.getLogger(__name__)

#: wire code of every gradient dtype (the one dtype table's index, :mod:`shadowgrad.torch_dtypes`)
_WIRE_DTYPE = GRAD_WIRE_DTYPES


_REQUIRE_DATA = AUTHENTICATED_KINDS | {Kind.DATA}
# the flag bits as plain ints: the per-datagram paths test them several times a datagram, and an
# ``enum.IntFlag`` operation builds a new member each time (about 1 us: 4 % of the ring's CPU)
_FINAL, _LAST, _RETX = int(Flag.FINAL), int(Flag.LAST), int(Flag.RETX)
#: a FINAL datagram without a MAC: ``flags & _FINAL_UNSEALED == _FINAL``
_FINAL_UNSEALED = int(Flag.FINAL | Flag.MAC)


class TransportError(ShadowgradError):
    """The ring received something it cannot place (a peer out of step or a bug)."""


@dataclass(frozen=True)
class RingConfig:
    job: int
    layout: int = 0  #: layout digest64 of every header
    chunk_bytes: int = (MAX_PAYLOAD // 64) * 64
    window: int = 64
    rto_s: float = 0.02
    max_rto_s: float = 0.5
    timeout_s: float = 30.0
    retain: int = 4  #: iterations of FINAL bytes kept for shadow NACKs (0: none, never copied)
    #: per bucket, the byte offsets where a FINAL datagram must end (the layout's shard
    #: boundaries, ``Layout.bucket_routes`` ends): the switch maps a FINAL datagram to the one
    #: shard that owns its first byte, so none may straddle a boundary (the ring's other
    #: datagrams are not mapped and are not cut)
    cuts: tuple[tuple[int, ...], ...] = ()
    #: the job's record key (``wire.mac_key``): ACKs and NACKs carry / need a MAC, and with
    #: ``authenticate_data`` the DATA a shadow receives (FINAL datagrams, the switch's copies,
    #: and NACK repairs); None authenticates nothing (tests of the bare transport)
    key: bytes | None = None
    authenticate_data: bool = False
    #: with ``authenticate_data``, the ring's other DATA too (reduce-scatter and the all-gather's
    #: forwards, which only trainers receive): 28 more bytes and a GMAC on each end per datagram
    authenticate_ring: bool = False
    #: the job's shadows: only they may NACK (empty: NACKs are not answered)
    shadows: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def shard_cuts(bucket_routes: Sequence[Sequence[Any]]) -> tuple[tuple[int, ...], ...]:
        """``cuts`` from a layout's ``bucket_routes`` (the end of every route but the last)."""
        return tuple(tuple(r.end for r in routes[:-1]) for routes in bucket_routes)


@dataclass
class _Out:
    header: dict[str, Any]
    payload: bytes | memoryview
    flags: int
    sent: float
    rto: float
    first: float
    #: sealed DATA: the datagram's own buffer, :data:`HEADER_SIZE` bytes of room for the
    #: header and then the payload (``payload`` views it), so the GMAC reads one buffer
    room: memoryview | None = None
    #: the payload's pooled buffer goes back to the pool once acknowledged (False: it is
    #: retained for shadows' NACKs, and goes back when its iteration is dropped)
    pooled: bool = False


@dataclass
class _Ctx:
    """One bucket reduction in progress."""

    iteration: int
    bucket: int
    host: torch.Tensor
    raw: memoryview
    dtype: DType
    bounds: list[int]


@dataclass
class _Job:
    iteration: int
    bucket: int
    flat: torch.Tensor
    fut: torch.futures.Future[Any] = field(default_factory=torch.futures.Future)


class RingAllReduce:
    """Ring all-reduce of one rank over ``link`` (see the module docstring).

    ``addrs[k]`` is rank ``k``'s link address. Use :meth:`allreduce` from one thread, or
    :meth:`start` the engine thread and :meth:`submit` jobs (what the DDP hook does).
    ``tap(header, payload)`` is called for every FINAL DATA send (tests, a software switch).
    Shadows' NACKs are answered from the retained FINAL bytes; a NACK without ranges (a missing
    COMMIT) goes to ``on_commit_nack``.
    """

    def __init__(
        self, rank: int, world: int, link: Link, addrs: Sequence[Address], config: RingConfig
    ) -> None:
        if world < 1 or not 0 <= rank < world or len(addrs) < world:
            raise ShadowgradError(f"bad ring: rank {rank}, world {world}, {len(addrs)} addrs")
        self.rank, self.world, self.link, self.cfg = rank, world, link, config
        self.next: Address = (str(addrs[(rank + 1) % world][0]), int(addrs[(rank + 1) % world][1]))
        self.prev_rank = (rank - 1) % world
        self._prev_addr: Address = (str(addrs[self.prev_rank][0]), int(addrs[self.prev_rank][1]))
        self.item_align = 8
        # tx stream to next
        self._tx_seq = 0
        self._unacked: collections.OrderedDict[int, _Out] = collections.OrderedDict()
        # rx stream from prev
        self._rx_cum = 0
        self._rx_ooo: dict[int, tuple[Any, memoryview]] = {}
        self._inbox: collections.deque[tuple[Any, memoryview]] = collections.deque()
        #: DATA received and not yet acknowledged; since when, how many, and whether the ACK
        #: must go at once (a duplicate or a datagram out of order)
        self._ack_due = False
        self._ack_by = 0.0
        self._rx_since_ack = 0
        self._ack_urgent = False
        self._ack_every = max(1, config.window // 4)
        self._ack_delay = min(self.ACK_DELAY_S, config.rto_s / 4)
        #: no unacknowledged datagram is due for retransmission before this (a lower bound)
        self._next_due = float("inf")
        #: datagram buffers to reuse (module docstring, *Copies*; :meth:`_take_buf`)
        self._bufs: list[bytearray] = []
        self._rx = bytearray(MAX_DATAGRAM + 1)
        # shadows
        self._retained: collections.OrderedDict[
            int, list[tuple[int, int, DType, bytes | memoryview]]
        ] = collections.OrderedDict()
        #: per retained iteration, the sequence number after its last FINAL datagram
        self._retained_end: dict[int, int] = {}
        self._aux_seq = 0
        #: ``tap(header, payload)`` for every FINAL DATA datagram sent (incl. retransmissions)
        self.tap: Callable[[bytes, bytes], None] | None = None
        #: ``on_commit_nack(iteration, addr)``: a shadow asked for COMMIT(iteration)
        self.on_commit_nack: Callable[[int, Address], None] | None = None
        #: the layout's module-state bucket (rank 0 sends it itself, not the ring) and who
        #: answers NACKs of it: ``on_state_nack(iteration, nack of that bucket only, addr)``
        self.state_bucket: int | None = None
        self.on_state_nack: Callable[[int, NackRecord, Address], None] | None = None
        self.stats = collections.Counter[str]()
        self.max_send_wait_s = 0.0
        self._key = config.key
        self._auth_data = config.authenticate_data and config.key is not None
        #: every DATA datagram is sealed and must be (not only the FINAL ones)
        self._auth_ring = self._auth_data and config.authenticate_ring
        #: seals DATA into the room in front of the payload (None: DATA is not authenticated)
        self._sealer = (
            DataSealer(config.key, job=config.job, sender=self.rank, layout=config.layout)
            if self._auth_data and config.key is not None
            else None
        )
        self._shadows = Peers(config.shadows)
        self._next_addr = canonical(self.next)
        self._prev_canon = canonical(self._prev_addr)
        self.repair_budget = RepairBudget()
        # engine thread
        self._jobs: collections.deque[_Job] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        # an idle engine sleeps in select() on the link's socket and a self-pipe that submit
        # and close write to (under _cv, while _idle): a job starts at once and an idle rank
        # costs no CPU; a link without a descriptor (FaultyLink's held datagrams need recv
        # calls) is polled every IDLE_POLL_S instead
        fileno = getattr(link, "fileno", None)
        self._link_fd: int | None = fileno() if callable(fileno) else None
        self._idle = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # -- engine thread ---------------------------------------------------------------------

    def start(self) -> RingAllReduce:
        self._thread = threading.Thread(
            target=self._run, name=f"shadowgrad-ring-r{self.rank}", daemon=True
        )
        self._thread.start()
        return self

    def submit(self, iteration: int, bucket: int, flat: torch.Tensor) -> torch.futures.Future[Any]:
        """Queue the all-reduce (average) of ``flat`` in place; the future completes after it."""
        job = _Job(iteration, bucket, flat)
        with self._cv:
            if self._stop:
                raise ShadowgradError("ring engine stopped")
            self._jobs.append(job)
            self._cv.notify()
            self._wake_locked()
        return job.fut

    def _wake_locked(self) -> None:
        if self._idle:
            self._idle = False
            with contextlib.suppress(OSError):  # full: a wake-up is pending anyway
                os.write(self._wake_w, b"x")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the engine after it drained its jobs and its unacknowledged data (bounded)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            self._wake_locked()
        if self._thread is not None:
            self._thread.join(timeout_s + self.cfg.timeout_s)
        else:
            self._drain(timeout_s)
        self.link.close()
        if self._thread is None or not self._thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    #: the longest an idle engine sleeps (nothing to retransmit, no job, nothing received)
    IDLE_MAX_S = 0.25
    #: the longest DATA received in order waits for its ACK (at most a quarter of ``rto_s``)
    ACK_DELAY_S = 0.003
    #: the poll period of an idle engine on a link without a descriptor
    IDLE_POLL_S = 0.005

    def _idle_wait(self) -> None:
        """No job: sleep until a datagram, a job or close arrives, or the next retransmission
        is due; then receive, ACK and retransmit (:meth:`_pump`)."""
        fd = self._link_fd
        if fd is None:
            self._pump(self.IDLE_POLL_S)
            return
        now = time.monotonic()
        timeout = self.IDLE_MAX_S
        if self._ack_due:
            timeout = 0.0 if self._ack_urgent else max(0.0, self._ack_by - now)
        if timeout and self._unacked:
            timeout = min(timeout, max(0.0, self._next_due - now))
        if timeout > 0:
            with self._cv:
                if self._jobs or self._stop:
                    return
                self._idle = True
            try:
                select.select([fd, self._wake_r], [], [], timeout)
            except (OSError, ValueError):  # closed under us: the loop sees _stop
                pass
            finally:
                with self._cv:
                    self._idle = False
            with contextlib.suppress(OSError):
                while os.read(self._wake_r, 64):
                    pass
        self._pump(0.0)

    def _run(self) -> None:
        while True:
            with self._cv:
                job = self._jobs.popleft() if self._jobs else None
                stop = self._stop
            if job is None:
                if stop:
                    self._drain(2.0)
                    return
                try:
                    self._idle_wait()
                except ShadowgradError as exc:  # a peer vanished between jobs
                    log.warning("ring rank %d idle: %s", self.rank, exc)
                    self._unacked.clear()
                continue
            try:
                self.allreduce(job.iteration, job.bucket, job.flat)
            except Exception as exc:
                job.fut.set_exception(exc)
                log.error(
                    "ring all-reduce of bucket %d failed on rank %d: %s", job.bucket, self.rank, exc
                )
                continue
            job.fut.set_result(job.flat)

    def _drain(self, timeout_s: float) -> None:
        self._ack_urgent = True  # nothing more is coming to wait for
        deadline = time.monotonic() + timeout_s
        while (self._unacked or self._ack_due) and time.monotonic() < deadline:
            self._pump(0.005)
        # linger a little so a lost final ACK of ours can be answered again
        end = time.monotonic() + min(0.2, timeout_s)
        while time.monotonic() < end:
            self._pump(0.01)

    # -- the ring --------------------------------------------------------------------------

    def allreduce(self, iteration: int, bucket: int, flat: torch.Tensor) -> None:
        """Average ``flat`` over the ranks, in place (blocking; deterministic result)."""
        host = flat if flat.device.type == "cpu" else flat.detach().cpu()
        if not host.is_contiguous():
            raise TransportError("ring all-reduce needs a contiguous tensor")
        dtype = _WIRE_DTYPE.get(host.dtype)
        if dtype is None:
            raise TransportError(f"dtype {host.dtype} cannot travel on the wire")
        n, world = host.numel(), self.world
        keep = self.cfg.retain > 0  # retain=0: no copy of the FINAL bytes at all
        host.div_(world)
        if world == 1:
            if keep:
                self._retain(iteration, bucket, [(0, dtype, bytes(_bytes(host)))])
            if flat is not host:
                flat.copy_(host)
            return
        item = host.element_size()
        raw = _bytes(host)
        ctx = _Ctx(
            iteration, bucket, host, raw, dtype, [(n * k // world) * item for k in range(world + 1)]
        )
        r = self.rank
        finals: list[tuple[int, DType, bytes | memoryview]] = []
        for s in range(world - 1):  # reduce-scatter
            self._send_chunk(ctx, (r - s) % world, 0)
            self._recv_chunk(ctx, (r - s - 1) % world, add=True)
        for s in range(world - 1):  # all-gather
            c = (r + 1 - s) % world
            sent = self._send_chunk(ctx, c, _FINAL if s == 0 else 0)
            if s == 0 and keep:  # the FINAL datagrams' own payloads: no copy of their own
                finals.extend((off, dtype, payload) for off, payload in sent)
            self._recv_chunk(ctx, (r - s) % world, add=False)
        if keep:
            self._retain(iteration, bucket, finals)
        if flat is not host:
            flat.copy_(host)

    def _spans(
        self, bucket: int, lo: int, hi: int, *, cut: bool = True
    ) -> Iterator[tuple[int, int]]:
        """Datagram spans of bytes ``[lo, hi)`` of ``bucket``: at most ``chunk_bytes`` each,
        with ``cut`` (FINAL datagrams, the ones the switch maps to a shard) also cut at the
        bucket's shard boundaries (``cuts``); the other datagrams cross them (fewer
        datagrams: fewer headers and MAC trailers)."""
        cuts = (self.cfg.cuts[bucket] if bucket < len(self.cfg.cuts) else ()) if cut else ()
        k = bisect.bisect_right(cuts, lo)
        step = self.cfg.chunk_bytes
        off = lo
        while off < hi:
            end = min(hi, off + step)
            while k < len(cuts) and cuts[k] <= off:
                k += 1
            if k < len(cuts) and cuts[k] < end:
                end = cuts[k]
            yield off, end
            off = end

    def _send_chunk(self, ctx: _Ctx, c: int, flags: int) -> list[tuple[int, bytes | memoryview]]:
        """Send chunk ``c`` of the bucket; its datagrams' ``(offset, payload)``."""
        lo, hi = ctx.bounds[c], ctx.bounds[c + 1]
        sent: list[tuple[int, bytes | memoryview]] = []
        final = bool(flags & _FINAL)
        for off, end in self._spans(ctx.bucket, lo, hi, cut=final):
            f = flags | (_LAST if end >= hi else 0)
            if len(self._unacked) >= self.cfg.window:
                t0 = time.monotonic()
                while len(self._unacked) >= self.cfg.window:
                    self._pump(self.cfg.rto_s / 4)
                #: the longest a send waited for window space (a paused switch port shows here)
                self.max_send_wait_s = max(self.max_send_wait_s, time.monotonic() - t0)
            # one copy into a pooled buffer (the bucket changes before every datagram is
            # acknowledged); sealed (what a shadow receives): the header is written in front
            # of the payload, so the GMAC reads one buffer
            buf = memoryview(self._take_buf())
            room: memoryview | None = None
            if self._sealer is not None and (self._auth_ring or final):
                room = buf[: HEADER_SIZE + end - off]
                payload = room[HEADER_SIZE:]
            else:
                payload = buf[: end - off]
            payload[:] = ctx.raw[off:end]
            # a retained FINAL payload's buffer goes back when its iteration is dropped
            pooled = not (final and self.cfg.retain > 0)
            self._send_data(ctx, off, payload, f, room, pooled=pooled)
            sent.append((off, payload))
        return sent

    def _recv_chunk(self, ctx: _Ctx, c: int, *, add: bool) -> None:
        lo, hi = ctx.bounds[c], ctx.bounds[c + 1]
        host = ctx.host
        pos = lo
        last_progress = time.monotonic()
        while pos < hi:
            if not self._inbox:
                self._pump(self.cfg.rto_s / 4)
                if not self._inbox:
                    if time.monotonic() - last_progress > self.cfg.timeout_s:
                        raise ShadowgradTimeout(
                            f"rank {self.rank}: no data from rank {self.prev_rank} for "
                            f"{self.cfg.timeout_s:g}s (iteration {ctx.iteration}, bucket "
                            f"{ctx.bucket})"
                        )
                    continue
            h, payload = self._inbox.popleft()
            if (h.iteration, h.bucket, h.offset) != (
                ctx.iteration,
                ctx.bucket,
                pos,
            ) or pos + h.length > hi:
                raise TransportError(
                    f"rank {self.rank} expected iteration {ctx.iteration} bucket {ctx.bucket} "
                    f"offset {pos}, got iteration {h.iteration} bucket {h.bucket} offset "
                    f"{h.offset}"
                )
            n = h.length
            if add:
                item = host.element_size()
                src = torch.frombuffer(payload, dtype=host.dtype)
                host[pos // item : (pos + n) // item].add_(src)
                del src
            else:
                ctx.raw[pos : pos + n] = payload
            self._give_buf(payload)
            pos += n
            last_progress = time.monotonic()

    # -- transport -------------------------------------------------------------------------

    def _send_data(
        self,
        ctx: _Ctx,
        off: int,
        payload: bytes | memoryview,
        flags: int,
        room: memoryview | None = None,
        *,
        pooled: bool = False,
    ) -> None:
        seq = self._tx_seq
        self._tx_seq += 1
        hdr = {
            "job": self.cfg.job,
            "sender": self.rank,
            "iteration": ctx.iteration,
            "seq": seq,
            "layout": self.cfg.layout,
            "dtype": ctx.dtype,
            "bucket": ctx.bucket,
            "offset": off,
        }
        now = time.monotonic()
        self._unacked[seq] = _Out(hdr, payload, flags, now, self.cfg.rto_s, now, room, pooled)
        self._next_due = min(self._next_due, now + self.cfg.rto_s)
        self._transmit(seq, retx=False)

    def _transmit(self, seq: int, *, retx: bool) -> None:
        out = self._unacked[seq]
        flags = out.flags | (_RETX if retx else 0)
        sealer = self._sealer
        room = out.room
        if room is not None:  # sealed: _send_chunk gave the datagram its room
            assert sealer is not None
            # the header is (re)written in the room in front of the payload: no copy for the MAC
            h = out.header
            tag = sealer.seal(
                room,
                HEADER_SIZE,
                room.nbytes - HEADER_SIZE,
                iteration=h["iteration"],
                seq=h["seq"],
                flags=flags,
                dtype=int(h["dtype"]),
                bucket=h["bucket"],
                offset=h["offset"],
            )
            if flags & _FINAL and self.tap is not None:
                self.tap(bytes(room[:HEADER_SIZE]), bytes(out.payload) + tag)
            self.link.send([room, tag], self.next)
        else:
            header = encode_header(Kind.DATA, payload=out.payload, flags=flags, **out.header)
            if flags & _FINAL and self.tap is not None:
                self.tap(header, bytes(out.payload))
            self.link.send([header, out.payload], self.next)
        self.stats["retx" if retx else "data_sent"] += 1
        if retx and flags & _FINAL:  # the switch copies it to the shard's shadows again
            self.stats["final_retx"] += 1

    def _pump(self, timeout_s: float) -> None:
        """Receive what is there (waiting at most ``timeout_s`` for the first, and not past a
        delayed ACK's time), ACK what is due, retransmit what is due."""
        if self._ack_due and timeout_s > 0:
            timeout_s = min(timeout_s, max(0.0, self._ack_by - time.monotonic()))
        got = self.link.recv_into(self._rx, timeout_s)
        budget = 256
        while got is not None and budget:
            n, addr = got
            self._on_datagram(memoryview(self._rx)[:n], addr)
            if self._rx_since_ack >= self._ack_every:  # an urgent one waits for the burst's end
                self._send_ack()
            budget -= 1
            got = self.link.recv_into(self._rx, 0.0) if budget else None
        if self._ack_due and (self._ack_urgent or time.monotonic() >= self._ack_by):
            self._send_ack()
        self._retransmit_due()

    def _on_datagram(self, buf: memoryview, addr: Address) -> None:
        src = (addr[0], addr[1])
        from_prev = src in (self._prev_addr, self._prev_canon)
        from_next = src in (self.next, self._next_addr)
        if not (from_prev or from_next or src in self._shadows):
            self.stats["rx_not_a_peer"] += 1  # only the ring neighbours and the shadows
            return
        try:
            msg = decode(
                buf,
                job=self.cfg.job,
                layout=self.cfg.layout,
                key=self._key,
                require=_REQUIRE_DATA if self._auth_ring else AUTHENTICATED_KINDS,
            )
        except WireError as exc:
            self.stats["rx_" + exc.reason] += 1
            return
        h = msg.header
        if self._auth_data and int(h.flags) & _FINAL_UNSEALED == _FINAL:
            self.stats["rx_unauthenticated"] += 1  # FINAL bytes are what shadows checkpoint
            return
        if h.kind is Kind.DATA and h.sender == self.prev_rank and from_prev:
            self._on_data(h, msg.payload)
        elif h.kind is Kind.ACK and h.sender == (self.rank + 1) % self.world and from_next:
            self.stats["rx_ack"] += 1
            self._on_ack(h.seq, AckRecord.from_message(msg).sack)
        elif h.kind is Kind.NACK and src in self._shadows:
            self._on_nack(h.iteration, NackRecord.from_message(msg), src)
        else:
            self.stats["rx_unexpected"] += 1

    def _on_data(self, h: Any, payload: memoryview) -> None:
        seq = h.seq
        if not self._ack_due:
            self._ack_due = True
            self._ack_by = time.monotonic() + self._ack_delay
        if seq != self._rx_cum:
            self._ack_urgent = True  # a loss or a lost ACK: the sender needs to know now
        if seq < self._rx_cum or seq in self._rx_ooo:
            self.stats["rx_duplicate"] += 1
            return
        if seq > self._rx_cum:
            if seq - self._rx_cum > 4 * self.cfg.window:
                self.stats["rx_beyond_window"] += 1
                return
            self._rx_ooo[seq] = (h, payload)
            self._rx = self._take_buf()  # the payload keeps the receive buffer
            self.stats["rx_out_of_order"] += 1
            return
        if self._rx_ooo:
            self._ack_urgent = True  # it fills a gap: what the sender resends, answered now
        # the inbox keeps the receive buffer (the payload views it); the next datagram is
        # received into another
        self._inbox.append((h, payload))
        self._rx = self._take_buf()
        self._rx_cum += 1
        self._rx_since_ack += 1
        while self._rx_cum in self._rx_ooo:
            self._inbox.append(self._rx_ooo.pop(self._rx_cum))
            self._rx_cum += 1
        self.stats["rx_data"] += 1

    def _send_ack(self) -> None:
        sack = 0
        if self._rx_ooo:
            for k in range(64):
                if self._rx_cum + 1 + k in self._rx_ooo:
                    sack |= 1 << k
        data = encode(
            Kind.ACK,
            job=self.cfg.job,
            sender=self.rank,
            iteration=0,
            seq=self._rx_cum,
            layout=self.cfg.layout,
            payload=AckRecord(sack).body(),
            key=self._key,
        )
        self.link.send([data], self._prev_addr)
        self.stats["ack_sent"] += 1
        self._ack_due = self._ack_urgent = False
        self._rx_since_ack = 0

    def _on_ack(self, cum: int, sack: int) -> None:
        unacked = self._unacked
        # oldest first: sent in sequence order (a retransmission keeps its place)
        while unacked:
            seq = next(iter(unacked))
            if seq >= cum:
                break
            self._acked(unacked.pop(seq))
        k = 0
        while sack:
            if sack & 1:
                out = unacked.pop(cum + 1 + k, None)
                if out is not None:
                    self._acked(out)
            sack >>= 1
            k += 1

    def _acked(self, out: _Out) -> None:
        if out.pooled and isinstance(out.payload, memoryview):
            self._give_buf(out.payload)

    #: datagram buffers (32 MiB) kept for reuse after an acknowledgement or a receive at most
    #: (more are left to the garbage collector); a dropped iteration's FINAL buffers are kept
    #: whatever their number: the next iteration's FINAL datagrams take as many
    MAX_POOLED = 512

    def _take_buf(self) -> bytearray:
        """A buffer for one datagram (:data:`MAX_DATAGRAM` bytes and one more: a receive that
        fills it was truncated)."""
        if self._bufs:
            return self._bufs.pop()
        self.stats["buffers_allocated"] += 1
        return bytearray(MAX_DATAGRAM + 1)

    def _give_buf(self, view: memoryview, *, always: bool = False) -> None:
        """Back to the pool, the buffer ``view`` is a view of (while the pool holds fewer than
        :attr:`MAX_POOLED`, or ``always``). Only a buffer nothing reads again: not in the
        inbox, not unacknowledged, not retained."""
        buf = view.obj
        if (
            isinstance(buf, bytearray)
            and len(buf) == MAX_DATAGRAM + 1
            and (always or len(self._bufs) < self.MAX_POOLED)
        ):
            self._bufs.append(buf)

    def _retransmit_due(self) -> None:
        now = time.monotonic()
        if now < self._next_due:  # nothing is due yet (no scan of the window per receive)
            return
        nxt = float("inf")
        for seq, out in list(self._unacked.items()):
            if now - out.sent >= out.rto:
                if now - out.first > self.cfg.timeout_s:
                    raise ShadowgradTimeout(
                        f"rank {self.rank}: datagram {seq} to rank {(self.rank + 1) % self.world}"
                        f" unacknowledged for {self.cfg.timeout_s:g}s"
                    )
                out.sent = now
                out.rto = min(out.rto * 2, self.cfg.max_rto_s)
                self._transmit(seq, retx=True)
            nxt = min(nxt, out.sent + out.rto)
        self._next_due = nxt

    # -- shadows ---------------------------------------------------------------------------

    def _retain(
        self, iteration: int, bucket: int, finals: list[tuple[int, DType, bytes | memoryview]]
    ) -> None:
        lst = self._retained.setdefault(iteration, [])
        lst.extend((bucket, off, dt, data) for off, dt, data in finals)
        self._retained_end[iteration] = self._tx_seq
        while len(self._retained) > self.cfg.retain:
            old, dropped = self._retained.popitem(last=False)
            end = self._retained_end.pop(old, self._tx_seq)
            # its buffers are reused unless one of its datagrams is still unacknowledged (a
            # retransmission reads it: then they are left to the garbage collector)
            if not self._unacked or next(iter(self._unacked)) >= end:
                for _bucket, _off, _dt, data in dropped:
                    if isinstance(data, memoryview):
                        self._give_buf(data, always=True)

    def _on_nack(self, iteration: int, nack: NackRecord, addr: Address) -> None:
        self.stats["nack"] += 1
        if not nack.ranges:
            if self.on_commit_nack is not None:
                self.on_commit_nack(iteration, addr)
            return
        sb = self.state_bucket
        if sb is not None and any(r.bucket == sb for r in nack.ranges):
            if self.on_state_nack is not None:
                mine = NackRecord(tuple(r for r in nack.ranges if r.bucket == sb))
                self.on_state_nack(iteration, mine, addr)
            nack = NackRecord(tuple(r for r in nack.ranges if r.bucket != sb))
            if not nack.ranges:
                return
        held = self._retained.get(iteration)
        if held is None:
            self.stats["nack_unavailable"] += 1
            return
        for r in nack.ranges:
            for bucket, off, dt, data in held:
                if bucket != r.bucket:
                    continue
                a, z = max(off, r.offset), min(off + len(data), r.offset + r.length)
                for x, y in self._spans(bucket, a, z):
                    payload = data[x - off : y - off]
                    if not self.repair_budget.take(addr, len(payload)):
                        self.stats["nack_rate_limited"] += 1
                        return
                    self._aux_seq += 1
                    fields: dict[str, Any] = dict(
                        job=self.cfg.job,
                        sender=self.rank,
                        iteration=iteration,
                        seq=self._aux_seq,
                        layout=self.cfg.layout,
                        payload=payload,
                        flags=Flag.FINAL | Flag.RETX,
                        dtype=dt,
                        bucket=bucket,
                        offset=x,
                    )
                    if self._auth_data:
                        assert self._key is not None
                        header, tag = seal(Kind.DATA, key=self._key, **fields)
                        self.link.send([header, payload, tag], addr)
                    else:
                        self.link.send([encode_header(Kind.DATA, **fields), payload], addr)
                    self.stats["nack_retx"] += 1
        event(
            log,
            events.TRAINER_RING_NACK,
            logging.DEBUG,
            rank=self.rank,
            iteration=iteration,
            ranges=len(nack.ranges),
        )


def _bytes(t: torch.Tensor) -> memoryview:
    arr: Any = t.view(torch.uint8).numpy()
    return memoryview(arr).cast("B")
