"""The shadow node's receiver: the ``rx`` threads' side of :class:`ShadowNode`.

:class:`Receiver` receives DATA chunks straight into their place in the iteration buffers
where it can (:meth:`Receiver._loop_direct`: peek at the header, reserve the bytes, receive,
verify in place, then cover) and everything else into a preallocated buffer, which it
verifies and decodes (:meth:`Receiver.handle`: no per-element Python), places
DATA bytes into the iteration buffers, keeps COMMIT records, takes the peers' READY records,
and announces this shard's own READY; receive thread 0 also runs the timers: gap repair (NACK
with backoff, divergence when it fails) and the READY refresh to the peer shadows.

It runs on the ``rx`` threads (``NodeOptions.rx_threads``); :meth:`Receiver.send_ready` and
:meth:`Receiver.send_nack` are called from the other threads too (an apply, a load, a
resync). State: the node's protocol state (the session ``_ld``, ``_iters``, the cut tracker,
``_bucket_senders``, the per-rank progress, the ``rx`` counters) is read and written under the
node's ``_lock`` (decoding runs before it, without it); its own: the source checks and the
record keys (set once), the source cache and the READY/NACK sequence number (under the node's
``_lock``, which every send holds), the refresh time (thread 0 only).
"""

from __future__ import annotations

import bisect
import importlib
import logging
import os
import select
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from crc32c import crc32c

from shadowgrad import events, wire
from shadowgrad._addr import canonical, resolve
from shadowgrad._log import event
from shadowgrad.dtypes import WIRE_ITEMSIZE
from shadowgrad.errors import WireError
from shadowgrad.frames import decode_frame
from shadowgrad.shadow.assembly import IntervalSet, IterBuffer
from shadowgrad.shadow.control import commit_to_json

_rxnative: ModuleType | None
try:
    _rxnative = importlib.import_module("shadowgrad.shadow._rxnative")
except ImportError:  # not built (no C compiler or OpenSSL headers): the Python loop
    _rxnative = None

if TYPE_CHECKING:
    from shadowgrad.shadow._applier import _Loaded
    from shadowgrad.shadow.node import ShadowNode


__all__ = ["NONE_ITER", "Receiver"]

#: the node's logger: its events and messages come from one place whichever thread logs them
log = logging.getLogger("shadowgrad.shadow.node")

#: wire encoding of "no iteration" (-1) in READY records' u64 fields
NONE_ITER = (1 << 64) - 1

_FINAL = int(wire.Flag.FINAL)
_RETX = int(wire.Flag.RETX)
_MAC = int(wire.Flag.MAC)
_DATA = int(wire.Kind.DATA)
_DATA_FLAGS = wire.ALLOWED_FLAGS[wire.Kind.DATA]
_HDR = wire.HEADER_STRUCT
_HSIZE = wire.HEADER_SIZE
_CSUM_AT = wire.CHECKSUM_AT
_ITEMSIZE = {int(k): v for k, v in WIRE_ITEMSIZE.items()}
#: the direct receive peeks at the header (MSG_TRUNC: the call returns the datagram's size);
#: Linux semantics
_DIRECT_OK = sys.platform.startswith("linux") and hasattr(socket, "MSG_TRUNC")
_PEEK = (socket.MSG_PEEK | getattr(socket, "MSG_TRUNC", 0)) if _DIRECT_OK else 0
_MSG_TRUNC = getattr(socket, "MSG_TRUNC", 0)
#: how a direct receive is verified (Receiver._reserve)
_CRC, _SPLIT, _IN_SLOT = 0, 1, 2
#: a direct run (Receiver._run_recv) covers what verified every this many datagrams
_RUN_FLUSH = 16
#: and keeps this many chunks ahead reserved
_RUN_WINDOW = 32
#: a run that ends on another datagram before this many chunks verified was not worth it (two
#: senders interleaving, reordering): the next runs wait, :data:`_RUN_BACKOFF` direct
#: receives at most
_RUN_MIN = 4
_RUN_BACKOFF = 1024
#: Runner.run's outcomes (_rxnative.c): cover and go on; the socket is empty; another datagram
#: came (in the scratch buffer); a socket error
_NATIVE_FLUSH, _NATIVE_EMPTY, _NATIVE_OTHER = 0, 1, 2

#: the header's offset, layout and length fields (then comes the checksum)
_HDR_TAIL = struct.Struct("!QQI")
_HDR_TAIL_AT = _CSUM_AT - _HDR_TAIL.size
_HDR_CSUM = struct.Struct("!I")
#: the header's bytes before ``seq``: magic, version, kind, flags, dtype, sender, job, bucket,
#: iteration (the same for every chunk of a run)
_RUN_PREFIX = _HDR_TAIL_AT - 8


def _enc(i: int) -> int:
    return NONE_ITER if i < 0 else i


def _dec(v: int) -> int:
    return -1 if v == NONE_ITER else v


@dataclass
class _Iter:
    """Bookkeeping of one iteration after last_applied."""

    it: int
    buf: IterBuffer | None = None
    commit: wire.CommitRecord | None = None
    t_first: float | None = None  # wall clock, for the timeline
    t_last: float | None = None
    t_commit: float | None = None
    t_ready: float | None = None
    activity: float = 0.0  # monotonic time of the last new bytes / COMMIT / creation
    nack_rounds: int = 0
    next_nack: float = 0.0
    waited_silent: bool = False  # repair paused once because no trainer was heard from
    covered_at_nack: int = -1

    def complete(self) -> bool:
        return self.buf is not None and self.buf.complete

    def ready(self) -> bool:
        return self.commit is not None and self.complete()


class _Run:
    """A direct run (:meth:`Receiver._run_recv`): the chunks after a direct receive of a
    sealed (or, without DATA authentication, CRC-checked) FINAL chunk, expected in order in
    the same box: each next one at ``off`` (bucket offset), shard-local ``ls``, ``chunk``
    bytes or what is left of the box (``seg_end``), from ``src``, with the header bytes
    ``prefix`` up to ``seq``. ``[done, ls)`` verified but not yet covered; ``entry`` =
    ``(lo, end)`` the reservation in ``buf.inflight`` (``lo``: the 56 covered bytes before
    ``ls`` where the next header is received, when sealed), None while it holds none."""

    __slots__ = (
        "bucket",
        "buf",
        "chunk",
        "done",
        "end",
        "entry",
        "epoch",
        "flags",
        "layout",
        "ld",
        "ls",
        "off",
        "prefix",
        "rec",
        "sealed",
        "seg_end",
        "sender",
        "src",
        "total",
    )

    def __init__(self, res: _Reserved, src: Any, prefix: bytes, sealed: bool) -> None:
        f = res.fields
        self.rec, self.buf, self.epoch, self.ld = res.rec, res.buf, res.epoch, res.ld
        self.flags, self.sender, self.bucket, self.layout = f[3], f[5], f[7], f[11]
        self.src, self.prefix, self.sealed = src, prefix, sealed
        self.chunk = res.le - res.ls
        self.off = f[10] + self.chunk
        self.ls = self.done = res.le
        self.seg_end = res.seg_end
        self.entry: tuple[int, int] | None = None  # none held yet (Receiver._run_extend)
        self.end = self.ls
        self.total = 0  # chunks covered so far


class _Reserved(NamedTuple):
    """A direct receive's reservation (:meth:`Receiver._reserve`): the shard-local payload
    bytes ``[ls, le)`` of iteration ``rec``'s buffer ``buf``, reserved as ``entry`` in its
    ``inflight``; how the datagram is verified (``mode``); where its header goes (``slot``),
    where its payload goes (``dest``), both as one view (``whole``, :data:`_IN_SLOT` only);
    the peeked header's fields, the buffer's epoch and the session at the reservation."""

    rec: _Iter
    buf: IterBuffer
    entry: tuple[int, int]
    ls: int
    le: int
    mode: int
    slot: memoryview
    dest: memoryview
    whole: memoryview
    fields: tuple[int, ...]
    epoch: int
    ld: _Loaded
    seg_end: int  # shard-local end of the box


class Receiver:
    """The receive side of ``node``: its threads' loop (:meth:`loop`), one datagram
    (:meth:`handle`), and the READY and NACK records it sends (:meth:`send_ready`,
    :meth:`send_nack`)."""

    def __init__(self, node: ShadowNode) -> None:
        self.node = node
        spec, opts, shadow_id = node.spec, node.opts, node.id
        self._refresh_s = (
            opts.ready_refresh_s
            if opts.ready_refresh_s is not None
            else min(spec.timeouts.heartbeat_s, 0.05)
        )
        self._gap_s = spec.timeouts.gap_repair_s
        # the trainers are "silent" (the job is stopped, crashed or restarting) when nothing came
        # from any of them for failure_detect: unanswered NACKs are then no sign of divergence
        self._silent_s = spec.timeouts.failure_detect_s
        self._peer_addrs = [(a.host, a.port) for a in spec.shadows.addresses]
        self._trainer_addrs = [(a.host, a.port) for a in spec.trainers.addresses]
        # records are authenticated with the job's key (never the token itself); DATA and
        # COMMIT are taken only from the trainers' addresses, READY only from the peers'
        self._key = wire.mac_key(node._token, node._job)
        self._require = (
            wire.AUTHENTICATED_KINDS | {wire.Kind.DATA}
            if spec.security.authenticate_data
            else wire.AUTHENTICATED_KINDS
        )
        self._trainer_src = {resolve(a) for a in self._trainer_addrs}
        self._peer_src = {resolve(a) for k, a in enumerate(self._peer_addrs) if k != shadow_id}
        self._src_cache: dict[tuple[str, int], tuple[bool, bool]] = {}
        # in-band through the P4 target's loopback UDP ports: what arrives from this shadow's
        # switch port is a whole Ethernet frame (shadowgrad.frames), the copy the switch made
        self._switch_ep: tuple[str, int] | None = None
        self._me = (spec.shadows.addresses[shadow_id].host, spec.shadows.addresses[shadow_id].port)
        sw = spec.switch
        if spec.job.mode == "in-band" and sw.loopback is not None and sw.shadow_ports:
            ep = sw.loopback_endpoint(sw.shadow_ports[shadow_id])
            self._switch_ep = (ep.host, ep.port)
        self._next_refresh = 0.0
        self._seq = 0
        # direct receive (:meth:`_loop_direct`): the rx threads peek and receive under
        # _rx_lock (a peek and the receive after it are one step); a thread placing a chunk
        # from its scratch buffer waits on _inflight while another receives into those bytes
        self._direct = _DIRECT_OK and node.opts.direct_rx
        self._rx_lock = threading.Lock()
        self._waiting = 0  # threads waiting on _inflight (under the node's _lock)
        self._inflight_cond: threading.Condition | None = None  # on the node's _lock, built late
        self._data_mac = wire.Kind.DATA in self._require
        # a direct run's receive loop in C (_rxnative.c), when built and not turned off
        self._native: Any = None
        if self._direct and node.opts.native_rx:
            if _rxnative is None:
                log.info("shadow %d: the C receive loop is not built; runs use Python", shadow_id)
            else:
                self._native = _rxnative.Runner(
                    self._key,
                    _HSIZE,
                    _HDR_TAIL_AT,
                    _CSUM_AT,
                    wire.MAC_SIZE,
                    wire.NONCE_SIZE,
                    wire.MAX_DATAGRAM,
                )

    @property
    def _inflight(self) -> threading.Condition:
        """Signalled when a direct receive releases its reservation (on the node's ``_lock``,
        which the node creates after its receiver; every caller holds that lock)."""
        c = self._inflight_cond
        if c is None:
            c = self._inflight_cond = threading.Condition(self.node._lock)
        return c

    def loop(self, index: int = 0) -> None:
        """Receive thread ``index``; thread 0 also runs the timers."""
        if self._direct:
            self._loop_direct(index)
            return
        n = self.node
        sock = n.sock
        buf = bytearray(wire.MAX_DATAGRAM + 1)  # one byte more: oversize datagrams show up
        mv = memoryview(buf)
        next_timer = 0.0
        while not n._stop.is_set():
            src: Any = None
            try:
                size, src = sock.recvfrom_into(buf)
            except TimeoutError:
                size = -1
            except OSError:
                if n._stop.is_set():
                    return
                raise
            if size >= 0:
                self._scratch(mv[:size], src)
            if index == 0:
                next_timer = self._tick(next_timer)

    def _scratch(self, data: memoryview, src: Any) -> None:
        """A datagram received into the scratch buffer from ``src``: in-band, a frame the
        switch copied here (its payload keeps the trainer's source address); else the datagram
        itself (:meth:`handle`)."""
        switch = self._switch_ep
        if switch is not None and (src[0], src[1]) == switch:
            frame = decode_frame(data)
            if frame is None or frame.dst != self._me:
                with self.node._lock:
                    self.node.rx["bad_frame"] += 1
            else:
                self.handle(frame.payload, frame.src)
        else:
            self.handle(data, src)

    def _tick(self, next_timer: float) -> float:
        """Receive thread 0 runs the timers every ``tick_s``: the next time they are due."""
        now = time.monotonic()
        if now < next_timer:
            return next_timer
        self._timers(now)
        return now + self.node.opts.tick_s

    def _loop_direct(self, index: int) -> None:
        """:meth:`loop` receiving DATA straight into the iteration buffer.

        Under ``_rx_lock``: peek at the next datagram's header; when it is a well-formed FINAL
        DATA chunk from a known trainer whose bytes lie inside one box of an iteration buffered
        here and are neither covered nor being received by another thread, reserve them
        (:meth:`_reserve`) and ``recvmsg_into`` header, box bytes and MAC trailer: the kernel
        writes the payload into its final place. Then, without the lock, verify it there (the
        received header must be the peeked one; its CRC; the GMAC over header + payload, or
        the CRC over both without a MAC) and only then cover the bytes (:meth:`_finish`). A
        datagram that fails leaves the bytes uncovered (the genuine one overwrites them later;
        a covered byte is never received into). Everything else (the first chunk of an
        iteration, duplicates, straddling chunks, other kinds, anything when in-band frames
        come from the switch) is received into the scratch buffer and :meth:`handle` d. The
        source is checked after the verification, as :meth:`handle` does.
        """
        n = self.node
        # a non-blocking twin of the socket: no poll() before every call (the node's socket
        # has a timeout); closed when the loop ends
        dsock = socket.socket(fileno=os.dup(n.sock.fileno()))
        try:
            dsock.setblocking(False)
            poller = select.poll()
            poller.register(dsock.fileno(), select.POLLIN)
            tick_ms = max(1, round(n.opts.tick_s * 1000))
            buf = bytearray(wire.MAX_DATAGRAM + 1)  # one byte more: oversize datagrams show up
            mv = memoryview(buf)
            peek = bytearray(_HSIZE)
            hdr = bytearray(_HSIZE)
            save = bytearray(_HSIZE)
            tail = bytearray(wire.MAC_SIZE)
            hdr_at = memoryview(hdr)[:_CSUM_AT]
            peek_at = memoryview(peek)[:_CSUM_AT]
            iov: list[Any] = [memoryview(hdr), None, memoryview(tail)]
            iov_crc: list[Any] = [memoryview(hdr), None]
            over = bytearray(wire.MAX_DATAGRAM + 1)  # a run's datagram that is longer
            lock = self._rx_lock
            switch = self._switch_ep
            key = self._key
            next_timer = 0.0
            run: _Run | None = None
            src: Any = None
            # direct receives left before a run may open again, and the last such wait
            skip = backoff = 0
            while not n._stop.is_set():
                if run is not None:
                    ended = run
                    run, size, src = self._run_recv(
                        run,
                        dsock,
                        scratch=buf,
                        over=over,
                        hdr=hdr,
                        save=save,
                        tail=tail,
                        timer_at=next_timer if index == 0 else None,
                        poller=poller,
                    )
                    if size >= 0:
                        if ended.total < _RUN_MIN:
                            backoff = skip = min(_RUN_BACKOFF, max(8, 2 * backoff))
                        else:
                            backoff = 0
                        self._scratch(mv[:size], src)
                    if index == 0:
                        next_timer = self._tick(next_timer)
                    continue
                size = -1
                src = None
                res: _Reserved | None = None
                got = 0
                mflags = 0
                with lock:
                    try:
                        if switch is None:  # the source is checked once the datagram verified
                            size = dsock.recv_into(peek, _HSIZE, _PEEK)
                        else:
                            size, src = dsock.recvfrom_into(peek, _HSIZE, _PEEK)
                    except (BlockingIOError, InterruptedError):
                        size = -1
                    if size >= 0:
                        if size >= _HSIZE and (switch is None or src != switch):
                            res = self._reserve(peek, peek_at, size, src)
                        if res is None:
                            size, src = dsock.recvfrom_into(buf)
                        else:
                            mode, slot, dest = res.mode, res.slot, res.dest
                            if mode == _IN_SLOT:  # the header lands on covered bytes: keep them
                                save[:] = slot
                                iov[0] = slot
                            io = iov_crc if mode == _CRC else iov
                            io[1] = dest
                            try:
                                got, _, mflags, src = dsock.recvmsg_into(io)
                            except BaseException:
                                if mode == _IN_SLOT:
                                    slot[:] = save
                                self._finish(res, None, False, "direct_mismatch")
                                raise
                            finally:
                                io[1] = None
                                iov[0] = iov_crc[0]
                if res is not None:
                    mode, slot, dest = res.mode, res.slot, res.dest
                    reason = "direct_mismatch"
                    ok = got == size and not mflags & _MSG_TRUNC
                    if mode == _IN_SLOT:
                        # header + payload are one contiguous view: the one-shot GMAC
                        if ok and slot == peek:
                            ok = wire.verify_mac(key, res.whole, tail)
                            reason = "wire.bad_mac"
                        else:
                            ok = False
                        slot[:] = save
                    elif ok and hdr == peek:
                        if mode == _SPLIT:  # sealed: the header's CRC was checked on the peek
                            ok = wire.verify_parts(key, hdr, dest, tail)
                            reason = "wire.bad_mac"
                        else:
                            ok = crc32c(dest, crc32c(hdr_at)) == res.fields[13]
                            reason = "wire.checksum"
                    else:
                        ok = False
                    if skip:
                        skip -= 1
                        self._finish(res, src, ok, reason)
                    else:
                        run = self._finish(res, src, ok, reason, peek)
                elif size < 0:
                    poller.poll(tick_ms)
                else:
                    self._scratch(mv[:size], src)
                if index == 0:
                    next_timer = self._tick(next_timer)
        finally:
            try:
                if run is not None:  # the node stops: release the reservation
                    self._run_flush(run, 0, 0, keep=False)
            finally:
                dsock.close()

    def _reserve(
        self, peek: bytearray, peek_at: memoryview, size: int, src: Any
    ) -> _Reserved | None:
        """Where the datagram whose header is ``peek`` (``size`` bytes in all; ``peek_at``: its
        bytes before the checksum; ``src``: its source when known) goes, when it can be
        received straight into an iteration buffer: a :class:`_Reserved`, whose shard-local
        payload bytes ``[ls, le)`` of ``buf`` (``dest`` views them) are reserved (``entry`` in
        ``buf.inflight``); ``mode`` says how it is verified: :data:`_CRC` (no MAC),
        :data:`_SPLIT` (header received into the thread's own buffer) or :data:`_IN_SLOT` (the
        :data:`wire.HEADER_SIZE` bytes before ``dest`` are covered: the header is received
        there, ``slot``, after their bytes were saved, so header and payload are one view,
        ``whole``, for the one-shot GMAC; the reservation includes them until they are
        restored). Else None (the caller takes the scratch path). Changes nothing else: what
        the datagram does to the protocol state happens once it verified."""
        f = _HDR.unpack_from(peek)
        magic, version, kind, flags, dtype, _, job, bucket, it, _, offset, layout, length, csum = f
        if (
            magic != wire.MAGIC
            or version != wire.VERSION
            or kind != _DATA
            or size != _HSIZE + length
            or length > wire.MAX_PAYLOAD
            or flags & ~_DATA_FLAGS
            or not flags & _FINAL
        ):
            return None
        sealed = flags & _MAC
        if sealed:
            length -= wire.MAC_SIZE
            if crc32c(peek_at) != csum:
                return None
        elif self._data_mac:
            return None
        item = _ITEMSIZE.get(dtype)
        if item is None or length <= 0 or length % item or offset % item:
            return None
        n = self.node
        with n._lock:
            ld = n._ld
            if ld is None or job != n._job or layout != n._digest:
                return None
            if src is not None:
                known = self._src_cache.get(src)
                if known is None or not known[0]:
                    return None
            la = n._last_applied
            if it <= la or it > la + ld.window:
                return None
            geom = ld.geom
            if (
                bucket >= len(geom.bucket_nbytes)
                or offset + length > geom.bucket_nbytes[bucket]
                or dtype != geom.bucket_dtype[bucket]
            ):
                return None
            rec = n._iters.get(it)
            if rec is None or rec.buf is None:
                return None
            buf = rec.buf
            i = bisect.bisect_right(geom._starts[bucket], offset) - 1
            if i < 0:
                return None
            seg = geom.segments[bucket][i]
            if offset + length > seg.end:
                return None
            ls = seg.local + (offset - seg.start)
            le = ls + length
            cov = buf.cov
            if not cov.disjoint(ls, le):
                return None
            for x, y in buf.inflight:
                if x < le and ls < y:
                    return None
            mv = buf.mv
            if not sealed:
                mode = _CRC
            elif ls >= _HSIZE and cov.covers(ls - _HSIZE, ls):
                # covered bytes are never written and not read before the iteration is
                # complete, which it is not while [ls, le) is uncovered
                entry = (ls - _HSIZE, le)
                buf.inflight.append(entry)
                whole = mv[ls - _HSIZE : le]
                return _Reserved(
                    rec,
                    buf,
                    entry,
                    ls,
                    le,
                    _IN_SLOT,
                    whole[:_HSIZE],
                    whole[_HSIZE:],
                    whole,
                    f,
                    buf.epoch,
                    ld,
                    seg.local + (seg.end - seg.start),
                )
            else:
                mode = _SPLIT
            entry = (ls, le)
            buf.inflight.append(entry)
            dest = mv[ls:le]
            seg_end = seg.local + (seg.end - seg.start)
            return _Reserved(
                rec, buf, entry, ls, le, mode, dest, dest, dest, f, buf.epoch, ld, seg_end
            )

    def _finish(
        self, res: _Reserved, src: Any, ok: bool, reason: str, peek: bytearray | None = None
    ) -> _Run | None:
        """Release a reservation of :meth:`_reserve`; a datagram from ``src`` that verified
        (``ok``) is handled as :meth:`handle` would have (its bytes are in place), else counted
        under ``reason``. With ``peek`` (its header), a first-time FINAL chunk that verified
        opens a direct run at the chunk after it (:meth:`_run_recv`) where there is room: the
        run, else None."""
        rec, buf, entry, ls, le, mode, _, _, _, f, epoch, ld, seg_end = res
        n = self.node
        run = None
        with n._lock:
            buf.inflight.remove(entry)
            if ok:
                if not self._source_ok(wire.Kind.DATA, src):
                    reason = "foreign_source"
                elif not self._placed(ld, rec, buf, epoch):
                    reason = "stale"  # the iteration was dropped while the bytes came in
                else:
                    reason = self._cover(
                        rec, buf, flags=f[3], sender=f[5], bucket=f[7], ls=ls, le=le, count=1
                    )
                    if peek is not None and reason == "data" and le < seg_end:
                        sealed = mode != _CRC
                        run = _Run(res, src, bytes(peek[:_RUN_PREFIX]), sealed)
                        # the next header lands on the 56 bytes before: covered ones
                        if (sealed and not buf.cov.covers(le - _HSIZE, le)) or not (
                            self._run_extend(run)
                        ):
                            run = None
            n.rx[reason] += 1
            if self._waiting:
                self._inflight.notify_all()
        return run

    def _placed(self, ld: _Loaded, rec: _Iter, buf: IterBuffer, epoch: int) -> bool:
        """Whether a direct receive's bytes still belong where they were received: the same
        session, ``rec`` still the iteration's record with ``buf`` (at ``epoch``) its buffer,
        as :meth:`_on_data` checks. Under the node's lock."""
        n = self.node
        return n._ld is ld and n._iters.get(rec.it) is rec and rec.buf is buf and buf.epoch == epoch

    def _cover(
        self,
        rec: _Iter,
        buf: IterBuffer,
        *,
        flags: int,
        sender: int,
        bucket: int,
        ls: int,
        le: int,
        count: int,
    ) -> str:
        """Cover the shard-local bytes ``[ls, le)`` of ``buf``, received in place by ``count``
        verified datagrams from ``sender`` and reserved meanwhile (nothing covered them), and
        count them as :meth:`_on_data` would (:meth:`_account`): the rx counter reason. The
        iteration cannot have been applied with these bytes uncovered. Under the node's
        lock, after :meth:`_placed`."""
        n = self.node
        now = time.monotonic()
        it = rec.it
        n._trainer_rx_at = n._rank_rx_at[sender] = now
        if it > n._rank_newest.get(sender, -1):
            n._rank_newest[sender] = it
        new = 0
        for x, y in buf.cov.add(ls, le):
            new += y - x
        n.ev["direct_datagrams"] += count
        owned = le - ls
        return self._account(rec, buf, flags, sender, bucket=bucket, owned=owned, new=new, now=now)

    def _run_extend(self, run: _Run) -> bool:
        """Reserve the room ahead of the run's next chunk (:meth:`_run_room`, from the 56
        bytes its header lands on when sealed): whether there is any. Under the node's
        lock, with the run holding no reservation."""
        lo = run.ls - _HSIZE if run.sealed else run.ls
        end = self._run_room(run.buf, run.ls, lo, run.seg_end, run.chunk)
        if end <= run.ls:
            return False
        run.entry = (lo, end)
        run.end = end
        run.buf.inflight.append(run.entry)
        return True

    @staticmethod
    def _run_room(buf: IterBuffer, ls: int, lo: int, seg_end: int, chunk: int) -> int:
        """Where a run's reservation at ``ls`` (from ``lo``: its header slot) may end: up to
        :data:`_RUN_WINDOW` chunks of ``chunk`` bytes, not past the box (``seg_end``), the
        first covered byte or another reservation; ``ls`` when not even the next chunk (or
        the rest of the box) fits. Under the node's lock."""
        want = min(seg_end, ls + _RUN_WINDOW * chunk)
        gaps = buf.cov.gaps(ls, want)
        if not gaps or gaps[0][0] != ls:
            return ls
        end = gaps[0][1]
        for x, y in buf.inflight:
            if x < end and y > lo:
                if x <= ls:
                    return ls
                end = x
        return end if end - ls >= min(chunk, seg_end - ls) else ls

    def _run_flush(self, run: _Run, count: int, bad: int, *, keep: bool) -> bool:
        """Cover the run's verified bytes ``[done, ls)`` (``count`` chunks; ``bad`` more failed
        their MAC or CRC) and count them as :meth:`_finish` does; with ``keep``, reserve the
        room ahead again (:meth:`_run_room`) and say whether the run goes on, else release
        the reservation. The run ends where its iteration's buffer changed meanwhile."""
        n = self.node
        buf = run.buf
        with n._lock:
            if run.entry is not None:
                buf.inflight.remove(run.entry)
                run.entry = None
            rec = run.rec
            valid = self._placed(run.ld, rec, buf, run.epoch)
            if count:
                if valid:
                    reason = self._cover(
                        rec,
                        buf,
                        flags=run.flags,
                        sender=run.sender,
                        bucket=run.bucket,
                        ls=run.done,
                        le=run.ls,
                        count=count,
                    )
                    run.total += count
                    if self._native is not None:  # received by the C loop
                        n.ev["direct_native"] += count
                else:
                    reason = "stale"
                n.rx[reason] += count
            if bad:
                n.rx["wire.bad_mac" if run.sealed else "wire.checksum"] += bad
            run.done = run.ls
            keep = keep and valid and run.ls < run.seg_end and self._run_extend(run)
            if self._waiting:
                self._inflight.notify_all()
        return keep

    def _run_idle(
        self, run: _Run, count: int, bad: int, poller: Any, timer_at: float | None
    ) -> bool:
        """The socket went empty during a run: cover what verified (:meth:`_run_flush`, the
        room ahead reserved again) and wait up to a tick (``poller``: the socket's), no later
        than the timers (``timer_at``), for the next datagram; whether the run goes on (else
        its reservation is released). A sender that keeps up less than the receiver (every
        trainer) would otherwise end its runs between every two chunks."""
        n = self.node
        keep = run.buf.epoch == run.epoch and not n._stop.is_set() and run.ls < run.seg_end
        if not self._run_flush(run, count, bad, keep=keep):
            return False
        wait_s = n.opts.tick_s
        if timer_at is not None:
            wait_s = min(wait_s, timer_at - time.monotonic())
        if wait_s > 0 and poller.poll(max(1, round(wait_s * 1000))):
            return True
        self._run_flush(run, 0, 0, keep=False)
        return False

    def _run_recv(
        self,
        run: _Run,
        dsock: socket.socket,
        *,
        scratch: bytearray,
        over: bytearray,
        hdr: bytearray,
        save: bytearray,
        tail: bytearray,
        timer_at: float | None,
        poller: Any,
    ) -> tuple[_Run | None, int, Any]:
        """Receive a run's chunks without peeking: each straight into where the next chunk
        of the box goes (``recvmsg_into([header slot, box bytes, trailer, over])``), then
        check that it is that chunk (size, source, header fields) and verify it there, the
        GMAC over header and payload in one piece (the header lands on the 56 bytes before,
        saved and restored as in :meth:`_loop_direct`), without a MAC the CRC-32C. Covered
        in batches (:meth:`_run_flush`). Returns ``(run, -1, None)`` when the thread's timers
        are due (``timer_at``; the run goes on); ``(None, -1, None)`` when the run ended
        (the socket stayed empty for a tick, :meth:`_run_idle`; the box or the reservation
        is used up, the buffer changed, the node stops); ``(None, size, src)`` when a
        datagram that is not the expected chunk came: gathered into ``scratch`` for the
        caller's scratch path, the run ended before it.
        Where the C loop was built (``self._native``: ``_rxnative.Runner.run``), it receives,
        checks and verifies each batch instead, without the GIL: the header into a buffer of
        its own (its GMAC takes header and payload in two pieces), the same checks."""
        n = self.node
        buf = run.buf
        box = buf.mv
        sealed = run.sealed
        # the GMAC check bound to the trailer's place (sealed runs)
        verify = wire.gmac_verifier(self._key, tail) if sealed else None
        prefix, chunk, seg_end, epoch, src0 = run.prefix, run.chunk, run.seg_end, run.epoch, run.src
        mac = wire.MAC_SIZE if sealed else 0
        layout = run.layout
        hdr_mv, tail_mv, over_mv = memoryview(hdr), memoryview(tail), memoryview(over)
        hdr_at = hdr_mv[:_CSUM_AT]
        iov: list[Any] = [hdr_mv, None, tail_mv, over_mv] if sealed else [hdr_mv, None, over_mv]
        lock, stop, unpack = self._rx_lock, n._stop, _HDR_TAIL.unpack_from
        slot: memoryview | None = None
        count = bad = 0
        ls, off, end = run.ls, run.off, run.end
        native = self._native
        fd = dsock.fileno()
        while True:
            size = min(chunk, seg_end - ls)
            if count >= _RUN_FLUSH or ls + size > end or size <= 0:
                # between batches: the timers, the node's stop, the buffer's epoch
                due = timer_at is not None and time.monotonic() >= timer_at
                run.ls, run.off = ls, off
                keep = size > 0 and buf.epoch == epoch and not stop.is_set()
                if not self._run_flush(run, count, bad, keep=keep):
                    return None, -1, None
                count = bad = 0
                end = run.end
                if due:
                    return run, -1, None
                continue
            if native is not None:
                # the same loop in C, up to the batch's end (_rxnative.c's Runner.run)
                with lock:
                    st, ls, off, k, b, got, src = native.run(
                        fd, box, ls, end, seg_end, chunk, off, layout, prefix, src0,
                        _RUN_FLUSH - count, scratch, sealed,
                    )  # fmt: skip
                count += k
                bad += b
                if st == _NATIVE_FLUSH:
                    continue
                run.ls, run.off = ls, off
                if st == _NATIVE_EMPTY:
                    if not self._run_idle(run, count, bad, poller, timer_at):
                        return None, -1, None
                    count = bad = 0
                    end = run.end
                    continue
                self._run_flush(run, count, bad, keep=False)
                if st == _NATIVE_OTHER:
                    return None, got, src
                raise OSError(got, os.strerror(got))
            dest = box[ls : ls + size]
            if sealed:
                slot = box[ls - _HSIZE : ls]
                save[:] = slot
                iov[0] = slot
            iov[1] = dest
            with lock:
                try:
                    got, _, _, src = dsock.recvmsg_into(iov)
                except (BlockingIOError, InterruptedError):
                    got = -1
                except BaseException:
                    if slot is not None:
                        slot[:] = save
                    run.ls, run.off = ls, off
                    self._run_flush(run, count, bad, keep=False)
                    raise
            if got < 0:  # the socket is empty: cover what verified, wait a tick for more
                run.ls, run.off = ls, off
                if not self._run_idle(run, count, bad, poller, timer_at):
                    return None, -1, None
                count = bad = 0
                end = run.end
                continue
            if slot is not None:
                hdr[:] = slot
            if (
                got == _HSIZE + size + mac
                and src == src0
                and hdr.startswith(prefix)
                and unpack(hdr, _HDR_TAIL_AT) == (off, layout, size + mac)
            ):
                if verify is not None and slot is not None:
                    ok = verify(box[ls - _HSIZE : ls + size])
                    slot[:] = save
                else:
                    ok = crc32c(dest, crc32c(hdr_at)) == _HDR_CSUM.unpack_from(hdr, _CSUM_AT)[0]
                if ok:
                    ls += size
                    off += size
                    count += 1
                else:
                    bad += 1
                continue
            # not the chunk expected here: gather it for the scratch path, the run ends
            out = memoryview(scratch)
            pos = 0
            for part in (hdr_mv, dest, tail_mv, over_mv) if sealed else (hdr_mv, dest, over_mv):
                k = min(part.nbytes, got - pos)
                if k <= 0:
                    break
                out[pos : pos + k] = part[:k]
                pos += k
            if slot is not None:
                slot[:] = save
            run.ls, run.off = ls, off
            self._run_flush(run, count, bad, keep=False)
            return None, got, src

    def handle(
        self, data: memoryview | bytes | bytearray, src: tuple[str, int] | None = None
    ) -> str:
        """Verify and handle one datagram from ``src``; return the rx counter it was counted
        under. DATA and COMMIT count only from a trainer's address and READY only from a
        peer's (``src=None``: a caller that has checked the source itself)."""
        n = self.node
        ld = n._ld
        try:
            msg = wire.decode(
                data,
                job=n._job,
                layout=None if ld is None else n._digest,
                key=self._key,
                require=self._require,
            )
        except WireError as e:
            reason = "wire." + e.reason
            n.rx[reason] += 1
            return reason
        h = msg.header
        with n._lock:
            if src is not None and not self._source_ok(h.kind, src):
                reason = "foreign_source"
            elif n._ld is None:
                reason = "not_loaded"
            elif h.kind is wire.Kind.DATA:
                n._trainer_rx_at = n._rank_rx_at[h.sender] = time.monotonic()
                reason = self._on_data(h, msg.payload)
            elif h.kind is wire.Kind.COMMIT:
                # rank 0's idle heartbeat is a COMMIT
                n._trainer_rx_at = n._rank_rx_at[h.sender] = time.monotonic()
                reason = self._on_commit(msg)
            elif h.kind is wire.Kind.READY:
                reason = self._on_ready(msg)
            else:
                reason = "unexpected_kind"
            n.rx[reason] += 1
        return reason

    def _source_ok(self, kind: wire.Kind, src: tuple[str, int]) -> bool:
        key = (src[0], src[1])
        known = self._src_cache.get(key)  # (a trainer?, a peer?): no address parse per datagram
        if known is None:
            c = canonical(key)
            known = (c in self._trainer_src, c in self._peer_src)
            if len(self._src_cache) < 4096:
                self._src_cache[key] = known
        return known[1] if kind is wire.Kind.READY else known[0]

    def _rec(self, it: int, now: float) -> _Iter:
        n = self.node
        rec = n._iters.get(it)
        if rec is None:
            rec = _Iter(it, activity=now)
            n._iters[it] = rec
            n._newest_seen = max(n._newest_seen, it)
        return rec

    def _on_data(self, h: wire.Header, payload: memoryview) -> str:
        """A verified DATA chunk received into the scratch buffer: place its ``payload``
        (a direct receive's is in place already: :meth:`_finish`). Under the node's lock."""
        flags = h.flags._value_  # int arithmetic: IntFlag operators run in Python
        it, sender, bucket = h.iteration, h.sender, h.bucket
        offset, length, dtype = h.offset, h.length, h.dtype
        n = self.node
        while True:
            ld = n._ld
            assert ld is not None
            if not flags & _FINAL:
                return "not_final"
            if it <= n._last_applied:
                return "stale"
            if it > n._rank_newest.get(sender, -1):
                n._rank_newest[sender] = it
            if it > n._last_applied + ld.window:
                return "ahead_of_window"
            geom = ld.geom
            if bucket >= len(geom.bucket_nbytes) or offset + length > geom.bucket_nbytes[bucket]:
                return "out_of_layout"
            if dtype != geom.bucket_dtype[bucket]:
                return "dtype_mismatch"
            if not geom.owns_any(bucket, offset, length):
                return "not_mine"
            now = time.monotonic()
            rec = self._rec(it, now)
            if rec.buf is None:
                rec.buf = self._take_buf(ld)
                if rec.buf is None:  # cannot happen while the window bounds the buffers in use
                    return "no_buffer"
            buf = rec.buf
            if buf.inflight and buf.reserved(bucket, offset, length) and not n._stop.is_set():
                # another rx thread is receiving into these bytes: place after it verified
                # (or failed), never under it
                self._waiting += 1
                try:
                    self._inflight.wait(n.opts.tick_s)
                finally:
                    self._waiting -= 1
                continue
            res = buf.place(bucket, offset, payload)
            if res.owned == 0:
                return "not_mine"
            return self._account(
                rec, buf, flags, sender, bucket=bucket, owned=res.owned, new=res.new, now=now
            )

    def _account(
        self,
        rec: _Iter,
        buf: IterBuffer,
        flags: int,
        sender: int,
        *,
        bucket: int,
        owned: int,
        new: int,
        now: float,
    ) -> str:
        """Count a placed DATA chunk (``owned`` bytes of this shard, ``new`` of them not
        there before) and move its iteration on; the rx counter reason."""
        n = self.node
        senders = n._bucket_senders.get(bucket)
        if senders is None:
            senders = n._bucket_senders[bucket] = set()
        senders.add(sender)
        if new == 0:
            n.ev["duplicate_bytes"] += owned
            return "duplicate"
        if new < owned:
            n.ev["duplicate_bytes"] += owned - new
        n.ev["data_bytes"] += new
        wall = time.time()
        if rec.t_first is None:
            rec.t_first = wall
        rec.t_last = wall
        rec.activity = now
        if flags & _RETX:
            n.ev["repaired_bytes"] += new
        if buf.complete:
            self._maybe_ready(rec)
        return "retx" if flags & _RETX else "data"

    def _take_buf(self, ld: _Loaded) -> IterBuffer | None:
        """A free iteration buffer: from the pool, or a new one while fewer than the window."""
        if ld.pool:
            buf = ld.pool.pop()
            buf.reset()
            return buf
        if ld.allocated < ld.window + 1:  # +1: the one being applied
            ld.allocated += 1
            return IterBuffer(ld.geom)
        return None

    def _on_commit(self, msg: wire.Message) -> str:
        n = self.node
        h = msg.header
        if h.sender != 0:
            return "commit_not_rank0"
        it = h.iteration
        if it == n._last_applied and it not in n._commits and it >= 0:
            # a shard seeded without COMMIT(it) (by a rank other than 0) asked rank 0 for it:
            # keep it, so a restore at I* = it has the scheduler, scaler and user state
            n._commits[it] = commit_to_json(it, wire.CommitRecord.from_message(msg))
            return "commit_filled"
        if it <= n._last_applied:
            return "commit_stale"
        if it > n._last_applied + n.opts.commit_horizon:
            return "commit_ahead"
        now = time.monotonic()
        rec = self._rec(it, now)
        if rec.commit is not None:
            return "commit_duplicate"
        rec.commit = wire.CommitRecord.from_message(msg)
        rec.t_commit = time.time()
        rec.activity = now
        self._maybe_ready(rec)
        return "commit"

    def _maybe_ready(self, rec: _Iter) -> None:
        n = self.node
        if rec.ready() and rec.t_ready is None:
            rec.t_ready = time.time()
            n._cut.mark_ready(rec.it)
            n._cond.notify_all()
            self.send_ready(retx=False)

    def _on_ready(self, msg: wire.Message) -> str:
        n = self.node
        ld = n._ld
        assert ld is not None
        h = msg.header
        sender = h.sender
        if sender >= n.spec.shadows.count or sender == n.id:
            return "ready_bad_sender"
        rec = wire.ReadyRecord.from_message(msg)
        if (rec.shard, rec.replica) != ld.layout.shard_of_shadow(sender):
            return "ready_bad_shard"
        reason = n._cut.on_ready(
            sender,
            h.seq,
            last_applied=_dec(rec.last_applied),
            iteration=_dec(h.iteration),
            diverged=rec.state is wire.ReadyState.DIVERGED,
            now=time.monotonic(),
        )
        if reason == "ready":
            n._update_istar()
            n._cond.notify_all()
        return reason

    def send_ready(self, *, retx: bool) -> None:
        n = self.node
        ld = n._ld
        if ld is None:
            return
        state, it, last = n._cut.announcement()
        body = wire.ReadyRecord(ld.shard, ld.replica, state, _enc(last)).body()
        self._seq = max(self._seq + 1, time.time_ns())
        data = wire.encode(
            wire.Kind.READY,
            job=n._job,
            sender=n.id,
            iteration=_enc(it),
            seq=self._seq,
            layout=n._digest,
            payload=body,
            flags=wire.Flag.RETX if retx else 0,
            key=self._key,
        )
        for sid, addr in enumerate(self._peer_addrs):
            if sid != n.id:
                try:
                    n.sock.sendto(data, addr)
                    n.ev["ready_sent"] += 1
                except OSError as e:
                    n.ev["send_error"] += 1
                    log.debug("READY to shadow %d %s failed: %s", sid, addr, e)

    def _timers(self, now: float) -> None:
        n = self.node
        with n._lock:
            if n._ld is None:
                return
            if now >= self._next_refresh:
                self.send_ready(retx=True)
                self._next_refresh = now + self._refresh_s
            self._repair(now)

    def _repair(self, now: float) -> None:
        n = self.node
        ld = n._ld
        assert ld is not None
        la = n._last_applied
        top = min(n._newest_seen, la + ld.window)
        world = len(self._trainer_addrs)
        # every rank already sends a later iteration: what is missing of i is lost, not late
        past = min((n._rank_newest.get(r, -1) for r in range(world)), default=-1)
        # an iteration nothing arrived for, while later ones did, gets a record (a gap)
        for i in range(la + 1, top):
            self._rec(i, now)
        for i in range(la + 1, top + 1):
            rec = n._iters.get(i)
            if rec is None or rec.ready() or i == n._applying:
                continue
            if rec.buf is None and ld.geom.owned_nbytes == 0:
                rec.buf = self._take_buf(ld)
                if rec.buf is not None:
                    self._maybe_ready(rec)
                continue
            if n._diverged_at is not None and i >= n._diverged_at:
                continue
            later = n._newest_seen > i
            if rec.commit is None and not later:
                continue  # the trainer may still be sending: nothing says data is missing
            wait = 2 * n.opts.tick_s if past > i else self._gap_s
            if now - rec.activity < wait or now < rec.next_nack:
                continue
            covered = rec.buf.cov.total if rec.buf is not None else 0
            if covered != rec.covered_at_nack:
                rec.nack_rounds = 0  # progress since the last round
            if rec.nack_rounds >= n.opts.max_repair_rounds:
                if now - n._trainer_rx_at > self._silent_s and (
                    n._cut.holds or not n._cut.replica_applied(i)
                ):
                    # no trainer has sent anything for failure_detect (the job was killed, is
                    # paused or is restarting): nobody can answer, which says nothing about the
                    # data. Keep asking at the slowest rate; one more unanswered round once a
                    # trainer is heard from again declares the divergence. A replica that has
                    # applied i says the data existed: diverge now and resync from it (seen in
                    # CI: a restarted shadow still catching up when training ended waited for
                    # the finished trainers forever while its replica held the last iteration).
                    # Not while a restore point is held here: a resync would drop the held
                    # iteration's retained copy, and the restarted trainers fill the hole.
                    if not rec.waited_silent:
                        rec.waited_silent = True
                        n._note(
                            events.SHADOW_REPAIR_WAITING,
                            logging.INFO,
                            counter="repair_trainers_silent",
                            iteration=i,
                            silent_s=round(now - n._trainer_rx_at, 3),
                        )
                    rec.nack_rounds = n.opts.max_repair_rounds - 1
                else:
                    n._diverge(i, covered)
                    continue
            rec.nack_rounds += 1
            rec.covered_at_nack = covered
            rec.next_nack = now + self._gap_s * n.opts.repair_backoff**rec.nack_rounds
            if rec.buf is None:
                rec.buf = self._take_buf(ld)
            cov = rec.buf.cov if rec.buf is not None else IntervalSet()
            self.send_nack(
                i,
                ld.geom.missing(cov) if not rec.complete() else [],
                commit_missing=rec.commit is None,
            )

    def send_nack(
        self, it: int, missing: list[tuple[int, int, int]], *, commit_missing: bool
    ) -> None:
        n = self.node
        ld = n._ld
        assert ld is not None
        by_rank: dict[int, list[tuple[int, int, int]]] = {}
        all_ranks = range(len(self._trainer_addrs))
        for bucket, off, length in missing:
            for r in n._bucket_senders.get(bucket) or all_ranks:
                by_rank.setdefault(r, []).append((bucket, off, length))
        if commit_missing:
            by_rank.setdefault(0, [])  # zero ranges = "resend COMMIT(it)" (docs/shadow.md)
        per = n.opts.nack_ranges_per_datagram
        for rank, ranges in by_rank.items():
            if rank >= len(self._trainer_addrs):
                continue
            for lo in range(0, max(1, len(ranges)), per):
                body = wire.NackRecord.of(ranges[lo : lo + per]).body()
                self._seq = max(self._seq + 1, time.time_ns())
                data = wire.encode(
                    wire.Kind.NACK,
                    job=n._job,
                    sender=n.id,
                    iteration=it,
                    seq=self._seq,
                    layout=n._digest,
                    payload=body,
                    key=self._key,
                )
                try:
                    n.sock.sendto(data, self._trainer_addrs[rank])
                    n.ev["nack_sent"] += 1
                    n.ev["nack_ranges"] += len(ranges[lo : lo + per])
                except OSError as e:
                    n.ev["send_error"] += 1
                    log.debug("NACK to rank %d failed: %s", rank, e)
        event(
            log,
            events.SHADOW_REPAIR,
            level=logging.DEBUG,
            shadow=n.id,
            iteration=it,
            ranges=len(missing),
            commit_missing=commit_missing,
        )
