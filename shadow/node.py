"""One shadow node: receive, verify, reassemble, consistently apply, repair, serve, persist.

Threads (all stop within ``tick_s`` of :meth:`ShadowNode.stop`):

* **rx** — ``recv_into`` a preallocated buffer (socket timeout ``tick_s``), :meth:`handle_datagram`
  (decode + place bytes, no per-element Python), then the timers: gap repair (NACK with backoff,
  divergence when it fails), READY refresh to the peer shadows.
* **apply** — steps the :class:`~shadowgrad.shadow.replay.ShardReplayer` for iteration
  ``last_applied + 1`` once the two-phase rule allows it (docs/shadow.md), keeps the state of the
  consistent cut I* when it moves ahead of it, resynchronises from a replica when diverged, and
  starts background disk snapshots.
* **control** — the control endpoint, a ZeroMQ ROUTER socket served by the core's control server
  (:mod:`shadowgrad._control_server`) with this node's handlers (``shadow/_handlers.py``,
  :class:`~shadowgrad.shadow._handlers.ControlHandlers`: ``status``, ``hold``,
  ``release``, ``fetch``, ``load``, ``snapshot``, ``config``, ``finished``); every request
  carries the job token.
* **snapshot writer** — one at a time, writes a cloned state (write, fsync, rename).

Every received datagram increments exactly one ``rx`` counter (``wire.<reason>`` for decode
failures, otherwise a semantic outcome), so ``sum(rx.values())`` is the number of datagrams
handled.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import traceback
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import zmq

from shadowgrad import events, wire
from shadowgrad._addr import canonical, resolve
from shadowgrad._control_server import ControlServer, bind_router
from shadowgrad._log import event
from shadowgrad.config import JobSpec
from shadowgrad.errors import LayoutError, ShadowgradError, WireError
from shadowgrad.frames import decode_frame
from shadowgrad.layout import Layout
from shadowgrad.messages import (
    LoadReply,
    PeerStatus,
    RankStatus,
    ShadowStatus,
)
from shadowgrad.optspec import OptimizerSpec
from shadowgrad.shadow._cut import UNKNOWN as _UNKNOWN
from shadowgrad.shadow._cut import CutTracker
from shadowgrad.shadow._early import new_incarnation
from shadowgrad.shadow._handlers import ControlHandlers
from shadowgrad.shadow._state import NodeState, StateError, Trigger, transition
from shadowgrad.shadow.assembly import IntervalSet, IterBuffer, ShardGeometry
from shadowgrad.shadow.control import (
    ControlError,
    FetchResult,
    ShadowClient,
    commit_from_json,
    commit_to_json,
)
from shadowgrad.shadow.replay import ReplayError, ShardReplayer
from shadowgrad.shadow.snapshot import write_snapshot

__all__ = ["NodeOptions", "ShadowNode", "NONE_ITER"]


log = logging.getLogger(__name__)

#: wire encoding of "no iteration" (-1) in READY records' u64 fields
NONE_ITER = (1 << 64) - 1
#: what a control call to a replica (clone, resync) may fail with: skip that replica
_PEER_ERRORS = (ShadowgradError, zmq.ZMQError, KeyError, ValueError)


def _refusal(e: Exception) -> tuple[str, str] | None:
    """How the control endpoint answers a handler's exception: a ControlError with its own code
    (None: the server's default), a bad argument or state as ``bad_request``."""
    if isinstance(e, ControlError):
        return None
    if isinstance(e, (ShadowgradError, KeyError, TypeError, ValueError)):
        return "bad_request", f"{type(e).__name__}: {e}"
    return None


_FINAL = int(wire.Flag.FINAL)
_RETX = int(wire.Flag.RETX)


def _enc(i: int) -> int:
    return NONE_ITER if i < 0 else i


def _dec(v: int) -> int:
    return -1 if v == NONE_ITER else v


@dataclass(frozen=True)
class NodeOptions:
    """Tunables of a shadow node (the job spec supplies the timeouts)."""

    #: iterations with a gradient buffer at once (last_applied+1 .. last_applied+window); None:
    #: as many as ``window_bytes`` holds, between 4 and ``max_window``
    window: int | None = None
    #: memory for buffering iterations ahead of last_applied (bytes): a shadow that fell behind
    #: (a CPU hiccup, SIGSTOP) keeps what arrives meanwhile instead of rejecting it, and catches
    #: up from its buffers without a single retransmission
    window_bytes: int = 256 * 2**20
    #: upper bound of the window in iterations (the repair timer walks it every tick)
    max_window: int = 2048
    #: COMMIT records are kept up to this many iterations ahead of last_applied
    commit_horizon: int = 1024
    #: NACK rounds without progress before the shard declares itself diverged
    max_repair_rounds: int = 6
    #: NACK retry interval multiplier per round (first retry after timeouts.gap_repair_s)
    repair_backoff: float = 1.5
    #: READY refresh period (soft state re-sent to every peer); None: min(heartbeat, 50 ms)
    ready_refresh_s: float | None = None
    #: granularity of the receive loop's timers and of thread shutdown
    tick_s: float = 0.01
    #: how often a diverged shard retries resynchronisation from a replica
    resync_interval_s: float = 0.2
    #: receive threads on the data socket: decoding (CRC-32) runs without the GIL, so a second
    #: thread overlaps one datagram's CRC with the next one's receive on a multi-core host
    rx_threads: int = 1
    #: receive buffer asked for (SO_RCVBUFFORCE when permitted, else SO_RCVBUF)
    rcvbuf_bytes: int = 64 * 2**20
    #: iterations kept in the status timeline
    timeline_len: int = 256
    #: keep the state of I* when this shard applies ahead of it (invariant 2)
    retain_cut: bool = True
    #: at most this many NACK ranges per datagram
    nack_ranges_per_datagram: int = 512


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


@dataclass
class _Loaded:
    """Everything that exists only after ``load``."""

    layout: Layout
    shard: int
    replica: int
    geom: ShardGeometry
    replayer: ShardReplayer
    optimizer_json: str
    pool: list[IterBuffer] = field(default_factory=list)
    #: iterations with a buffer at once (NodeOptions.window / window_bytes)
    window: int = 4
    #: buffers allocated so far (lazily, up to ``window``)
    allocated: int = 0


class ShadowNode:
    """A shadow node for ``spec``'s shadow ``shadow_id``.

    ``sock``: an already bound UDP socket (tests bind port 0 and put the port in the spec);
    otherwise the node binds ``spec.shadows.addresses[shadow_id]``. ``control_bind``: zmq bind
    address (default ``tcp://<host>:<control_port + id>``; ``tcp://127.0.0.1:*`` picks a free
    port, see :attr:`control_endpoint`); ``control_socket``: instead, a ROUTER socket bound
    already and its context, the node owns both from now on (``shadowgrad shadow`` binds it
    before importing torch, :mod:`shadowgrad.shadow._early`). ``peer_controls``: control
    endpoints of other shadows by id (for resync), default from the spec. ``layout`` may be
    given now or with ``load``.
    """

    def __init__(
        self,
        spec: JobSpec,
        shadow_id: int,
        *,
        token: str | None = None,
        layout: Layout | None = None,
        sock: socket.socket | None = None,
        control_bind: str | None = None,
        control_socket: tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]] | None = None,
        peer_controls: Mapping[int, str] | None = None,
        options: NodeOptions | None = None,
        incarnation: str | None = None,
    ) -> None:
        if not 0 <= shadow_id < spec.shadows.count:
            raise ShadowgradError(f"shadow id {shadow_id} not in 0..{spec.shadows.count - 1}")
        self.spec = spec
        self.id = shadow_id
        self.opts = options or NodeOptions()
        #: this process's (or in-process node's) identity in every status: a restart shows as a
        #: new value (``shadowgrad shadow`` passes the one its EarlyControl answered with)
        self.incarnation = incarnation if incarnation is not None else new_incarnation()
        self._token = token if token is not None else spec.token()
        self._job = spec.job.id
        self._layout_hint = layout
        self._peer_controls = dict(peer_controls or {})
        self._refresh_s = (
            self.opts.ready_refresh_s
            if self.opts.ready_refresh_s is not None
            else min(spec.timeouts.heartbeat_s, 0.05)
        )
        self._gap_s = spec.timeouts.gap_repair_s
        # the trainers are "silent" (the job is stopped, crashed or restarting) when nothing came
        # from any of them for failure_detect: unanswered NACKs are then no sign of divergence
        self._silent_s = spec.timeouts.failure_detect_s
        self._trainer_rx_at = time.monotonic()
        self._rank_rx_at: dict[int, float] = {}  # per rank (the sender field): last DATA/COMMIT
        # sockets
        if sock is None:
            ep = spec.shadows.addresses[shadow_id]
            sock = socket.socket(
                socket.AF_INET6 if ":" in ep.host else socket.AF_INET, socket.SOCK_DGRAM
            )
            try:
                sock.bind((ep.host, ep.port))
            except OSError as e:
                sock.close()
                raise ShadowgradError(
                    f"shadow {shadow_id}: cannot bind its data address "
                    f"shadows.addresses[{shadow_id}] = {ep}: {e}"
                ) from None
        self.sock = sock
        self._set_rcvbuf()
        self.sock.settimeout(self.opts.tick_s)
        self._peer_addrs = [(a.host, a.port) for a in spec.shadows.addresses]
        self._trainer_addrs = [(a.host, a.port) for a in spec.trainers.addresses]
        # records are authenticated with the job's key (never the token itself); DATA and
        # COMMIT are taken only from the trainers' addresses, READY only from the peers'
        self._key = wire.mac_key(self._token, self._job)
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
        if control_socket is not None:  # bound already (shadowgrad shadow, while starting)
            ctx, rep = control_socket
        else:
            if control_bind is None:
                ep = spec.shadows.control_endpoint(shadow_id)
                control_bind = f"tcp://{ep}"
            try:
                ctx, rep = bind_router(control_bind)
            except zmq.ZMQError as e:
                self.sock.close()
                raise ShadowgradError(
                    f"shadow {shadow_id}: cannot bind its control endpoint {control_bind}: {e}"
                ) from None
        # state
        self._lock = threading.Lock()  # protocol state
        self._state_lock = threading.Lock()  # the replayer's tensors
        self._cond = threading.Condition(self._lock)
        self._stop = threading.Event()
        self.ev: Counter[str] = Counter()
        #: the control ops (shadow/_handlers.py), served on the node's state and locks
        self._handlers = ControlHandlers(self)
        #: the control endpoint's request loop (its thread is the node's ``control`` thread)
        self._control = ControlServer(
            ctx,
            rep,
            self._token,
            counters=self.ev,
            logger=log,
            bad_token_event=events.SHADOW_CONTROL_BAD_TOKEN,
            event_fields={"shadow": shadow_id},
            poll_s=self.opts.tick_s * 10,
            stop=self._stop,
            refusal=_refusal,
            handlers=self._handlers.table(),
            name=f"shadow{shadow_id}-control",
        )
        self.control_endpoint: str = self._control.endpoint
        self._ld: _Loaded | None = None
        #: the lifecycle (shadow/_state.py), moved by :meth:`_move` only (under _lock)
        self._state = NodeState.UNLOADED
        self._iters: dict[int, _Iter] = {}
        #: the consistent cut: own progress, the peers' READY records, I*, holds (under _lock)
        self._cut = CutTracker(shadow_id, retain_cut=self.opts.retain_cut)
        self._applying: int | None = None
        self._gen = 0  # bumped by load/resync: a step chosen before one is discarded
        self._newest_seen = -1
        self._snaps: dict[int, list[dict[str, torch.Tensor]]] = {}
        # COMMIT(i) (control.commit_to_json form) of every iteration whose state can be fetched:
        # last_applied and the retained/held states in _snaps (see _gc_snaps)
        self._commits: dict[int, dict[str, Any]] = {}
        self._timeline: OrderedDict[int, dict[str, float | None]] = OrderedDict()
        self._bucket_senders: dict[int, set[int]] = {}
        #: per trainer rank: the newest iteration it sent DATA for (a rank sends iteration i
        #: completely before i+1, so a later iteration from every rank makes a hole a gap)
        self._rank_newest: dict[int, int] = {}
        #: the job instance this state belongs to (fencing, docs/shadow.md "Generations"): set
        #: by ``load``, carried in the header's layout field (wire.session_digest); older
        #: generations are refused
        self._generation = 0
        self._digest = 0  # wire.session_digest(layout digest64, generation) once loaded
        #: rank 0's ``finished`` (training ended): {iteration, generation, requester}; it
        #: speaks for its generation only (a load of a newer one hides it, see _finished_now)
        self._finished: dict[str, Any] | None = None
        self._next_clone = 0.0
        self.rx: Counter[str] = Counter()
        self._next_refresh = 0.0
        self._next_resync = 0.0
        self._seq = 0
        self._snap_thread: threading.Thread | None = None
        self._snap_lock = threading.Lock()
        self._snap_next = spec.shadows.snapshot_every
        self._last_snapshot: dict[str, Any] | None = None
        self._threads: list[threading.Thread] = []
        self._error: BaseException | None = None

    # ---------------------------------------------------------------- lifecycle

    def _set_rcvbuf(self) -> None:
        n = self.opts.rcvbuf_bytes
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, 33, n)  # SO_RCVBUFFORCE (root)
        except OSError:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, n)

    @property
    def state(self) -> NodeState:
        """Where the node is in its lifecycle (:class:`shadow._state.NodeState`)."""
        return self._state

    def _move(self, trigger: Trigger) -> None:
        """Move the lifecycle by ``trigger`` (the caller holds ``_lock``) and log the event
        ``shadow.state``: at INFO when the state changes, at DEBUG when it stays. Raises
        :class:`StateError` for a transition the table does not allow."""
        old = self._state
        new = transition(old, trigger)
        self._state = new
        event(
            log,
            events.SHADOW_STATE,
            level=logging.INFO if new is not old else logging.DEBUG,
            shadow=self.id,
            old=old.value,
            new=new.value,
            reason=trigger.value,
        )

    @property
    def _last_applied(self) -> int:
        """This shard's last applied iteration (the cut tracker's; under ``_lock``)."""
        return self._cut.last_applied

    @property
    def _diverged_at(self) -> int | None:
        """Where this shard diverged (the cut tracker's; under ``_lock``)."""
        return self._cut.diverged_at

    @property
    def data_address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def start(self, backlog: Sequence[Sequence[zmq.Frame]] = ()) -> ShadowNode:
        """Start the threads. ``backlog``: requests received on a ``control_socket`` before
        the node existed (``EarlyControl.handover``), served first, in order."""
        if self._layout_hint is not None:
            self._check_layout(self._layout_hint)
        loops: list[tuple[str, Any, tuple[Any, ...]]] = [
            (f"rx{k}", self._rx_loop, (k,)) for k in range(self.opts.rx_threads)
        ]
        loops += [("apply", self._apply_loop, ()), ("control", self._control.serve, (backlog,))]
        for name, target, args in loops:
            t = threading.Thread(
                target=self._guard,
                args=(target, *args),
                name=f"shadow{self.id}-{name}",
                daemon=True,
            )
            t.start()
            self._threads.append(t)
        event(
            log,
            events.SHADOW_START,
            shadow=self.id,
            data=f"{self.data_address}",
            control=self.control_endpoint,
        )
        return self

    def _guard(self, target: Any, *args: Any) -> None:
        try:
            target(*args)
        except BaseException as e:  # a thread must not die silently
            self._error = e
            log.error(
                "shadow %d thread %s died:\n%s",
                self.id,
                threading.current_thread().name,
                traceback.format_exc(),
            )
            self._stop.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every thread (joined with a deadline) and close the sockets. Idempotent."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        deadline = time.monotonic() + timeout_s
        for t in [*self._threads, self._snap_thread]:
            if t is not None:
                t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads = []
        with contextlib.suppress(OSError):
            self.sock.close()
        self._control.close(0.0)
        if alive:
            raise ShadowgradError(f"shadow {self.id}: threads {alive} did not stop in {timeout_s}s")
        with self._lock:
            self._move(Trigger.STOP)
        event(log, events.SHADOW_STOP, shadow=self.id)

    def __enter__(self) -> ShadowNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def failed(self) -> BaseException | None:
        """The exception that killed a node thread, if any."""
        return self._error

    # ---------------------------------------------------------------- receive path

    def _rx_loop(self, index: int = 0) -> None:
        """Receive thread ``index``; thread 0 also runs the timers."""
        sock = self.sock
        buf = bytearray(wire.MAX_DATAGRAM + 1)  # one byte more: oversize datagrams show up
        mv = memoryview(buf)
        next_timer = 0.0
        switch = self._switch_ep
        while not self._stop.is_set():
            src: Any = None
            try:
                n, src = sock.recvfrom_into(buf)
            except TimeoutError:
                n = -1
            except OSError:
                if self._stop.is_set():
                    return
                raise
            if n >= 0 and switch is not None and (src[0], src[1]) == switch:
                frame = decode_frame(mv[:n])
                if frame is None or frame.dst != self._me:
                    with self._lock:
                        self.rx["bad_frame"] += 1
                else:  # the copy keeps the trainer's source address
                    self.handle_datagram(frame.payload, frame.src)
            elif n >= 0:
                self.handle_datagram(mv[:n], src)
            if index == 0:
                now = time.monotonic()
                if now >= next_timer:
                    self._timers(now)
                    next_timer = now + self.opts.tick_s

    def handle_datagram(
        self, data: memoryview | bytes | bytearray, src: tuple[str, int] | None = None
    ) -> str:
        """Verify and handle one datagram from ``src``; return the rx counter it was counted
        under. DATA and COMMIT count only from a trainer's address and READY only from a
        peer's (``src=None``: a caller that has checked the source itself)."""
        ld = self._ld
        try:
            msg = wire.decode(
                data,
                job=self._job,
                layout=None if ld is None else self._digest,
                key=self._key,
                require=self._require,
            )
        except WireError as e:
            reason = "wire." + e.reason
            self.rx[reason] += 1
            return reason
        h = msg.header
        with self._lock:
            if src is not None and not self._source_ok(h.kind, src):
                reason = "foreign_source"
            elif self._ld is None:
                reason = "not_loaded"
            elif h.kind is wire.Kind.DATA:
                self._trainer_rx_at = self._rank_rx_at[h.sender] = time.monotonic()
                reason = self._on_data(h, msg.payload)
            elif h.kind is wire.Kind.COMMIT:
                # rank 0's idle heartbeat is a COMMIT
                self._trainer_rx_at = self._rank_rx_at[h.sender] = time.monotonic()
                reason = self._on_commit(msg)
            elif h.kind is wire.Kind.READY:
                reason = self._on_ready(msg)
            else:
                reason = "unexpected_kind"
            self.rx[reason] += 1
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
        rec = self._iters.get(it)
        if rec is None:
            rec = _Iter(it, activity=now)
            self._iters[it] = rec
            self._newest_seen = max(self._newest_seen, it)
        return rec

    def _on_data(self, h: wire.Header, payload: memoryview) -> str:
        ld = self._ld
        assert ld is not None
        flags = h.flags._value_  # int arithmetic: IntFlag operators run in Python
        if not flags & _FINAL:
            return "not_final"
        it = h.iteration
        if it <= self._last_applied:
            return "stale"
        if it > self._rank_newest.get(h.sender, -1):
            self._rank_newest[h.sender] = it
        if it > self._last_applied + ld.window:
            return "ahead_of_window"
        geom = ld.geom
        if (
            h.bucket >= len(geom.bucket_nbytes)
            or h.offset + h.length > geom.bucket_nbytes[h.bucket]
        ):
            return "out_of_layout"
        if h.dtype != geom.bucket_dtype[h.bucket]:
            return "dtype_mismatch"
        if not geom.owns_any(h.bucket, h.offset, h.length):
            return "not_mine"
        now = time.monotonic()
        rec = self._rec(it, now)
        if rec.buf is None:
            rec.buf = self._take_buf(ld)
            if rec.buf is None:  # cannot happen while the window bounds the buffers in use
                return "no_buffer"
        res = rec.buf.place(h.bucket, h.offset, payload)
        if res.owned == 0:
            return "not_mine"
        senders = self._bucket_senders.get(h.bucket)
        if senders is None:
            senders = self._bucket_senders[h.bucket] = set()
        senders.add(h.sender)
        if res.new == 0:
            self.ev["duplicate_bytes"] += res.owned
            return "duplicate"
        if res.new < res.owned:
            self.ev["duplicate_bytes"] += res.owned - res.new
        self.ev["data_bytes"] += res.new
        wall = time.time()
        if rec.t_first is None:
            rec.t_first = wall
        rec.t_last = wall
        rec.activity = now
        if flags & _RETX:
            self.ev["repaired_bytes"] += res.new
        if rec.buf.complete:
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
        h = msg.header
        if h.sender != 0:
            return "commit_not_rank0"
        it = h.iteration
        if it == self._last_applied and it not in self._commits and it >= 0:
            # a shard seeded without COMMIT(it) (by a rank other than 0) asked rank 0 for it:
            # keep it, so a restore at I* = it has the scheduler, scaler and user state
            self._commits[it] = commit_to_json(it, wire.CommitRecord.from_message(msg))
            return "commit_filled"
        if it <= self._last_applied:
            return "commit_stale"
        if it > self._last_applied + self.opts.commit_horizon:
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
        if rec.ready() and rec.t_ready is None:
            rec.t_ready = time.time()
            self._cut.mark_ready(rec.it)
            self._cond.notify_all()
            self._send_ready(retx=False)

    def _on_ready(self, msg: wire.Message) -> str:
        ld = self._ld
        assert ld is not None
        h = msg.header
        sender = h.sender
        if sender >= self.spec.shadows.count or sender == self.id:
            return "ready_bad_sender"
        rec = wire.ReadyRecord.from_message(msg)
        if (rec.shard, rec.replica) != ld.layout.shard_of_shadow(sender):
            return "ready_bad_shard"
        reason = self._cut.on_ready(
            sender,
            h.seq,
            last_applied=_dec(rec.last_applied),
            iteration=_dec(h.iteration),
            diverged=rec.state is wire.ReadyState.DIVERGED,
            now=time.monotonic(),
        )
        if reason == "ready":
            self._update_istar()
            self._cond.notify_all()
        return reason

    # ---------------------------------------------------------------- consistent cut

    def _update_istar(self) -> None:
        if self._ld is None:
            return
        old = self._cut.istar
        if self._cut.update_istar():
            if old != _UNKNOWN:
                event(
                    log,
                    events.SHADOW_ISTAR,
                    level=logging.DEBUG,
                    shadow=self.id,
                    istar=self._cut.istar,
                )
            self._gc_snaps()

    def _gc_snaps(self) -> None:
        for it in list(self._snaps):
            if not self._cut.keeps(it):
                del self._snaps[it]
        for it in list(self._commits):
            if it != self._last_applied and it not in self._snaps:
                del self._commits[it]

    def _can_apply(self, i: int) -> bool:
        """Two-phase rule (:meth:`CutTracker.can_apply`), for an iteration buffered here."""
        rec = self._iters.get(i)
        if rec is None or not rec.ready():
            return False
        return self._cut.can_apply(i)

    def _send_ready(self, *, retx: bool) -> None:
        ld = self._ld
        if ld is None:
            return
        state, it, last = self._cut.announcement()
        body = wire.ReadyRecord(ld.shard, ld.replica, state, _enc(last)).body()
        self._seq = max(self._seq + 1, time.time_ns())
        data = wire.encode(
            wire.Kind.READY,
            job=self._job,
            sender=self.id,
            iteration=_enc(it),
            seq=self._seq,
            layout=self._digest,
            payload=body,
            flags=wire.Flag.RETX if retx else 0,
            key=self._key,
        )
        for sid, addr in enumerate(self._peer_addrs):
            if sid != self.id:
                try:
                    self.sock.sendto(data, addr)
                    self.ev["ready_sent"] += 1
                except OSError as e:
                    self.ev["send_error"] += 1
                    log.debug("READY to shadow %d %s failed: %s", sid, addr, e)

    # ---------------------------------------------------------------- timers: repair, refresh

    def _timers(self, now: float) -> None:
        with self._lock:
            if self._ld is None:
                return
            if now >= self._next_refresh:
                self._send_ready(retx=True)
                self._next_refresh = now + self._refresh_s
            self._repair(now)

    def _repair(self, now: float) -> None:
        ld = self._ld
        assert ld is not None
        la = self._last_applied
        top = min(self._newest_seen, la + ld.window)
        world = len(self._trainer_addrs)
        # every rank already sends a later iteration: what is missing of i is lost, not late
        past = min((self._rank_newest.get(r, -1) for r in range(world)), default=-1)
        # an iteration nothing arrived for, while later ones did, gets a record (a gap)
        for i in range(la + 1, top):
            self._rec(i, now)
        for i in range(la + 1, top + 1):
            rec = self._iters.get(i)
            if rec is None or rec.ready() or i == self._applying:
                continue
            if rec.buf is None and ld.geom.owned_nbytes == 0:
                rec.buf = self._take_buf(ld)
                if rec.buf is not None:
                    self._maybe_ready(rec)
                continue
            if self._diverged_at is not None and i >= self._diverged_at:
                continue
            later = self._newest_seen > i
            if rec.commit is None and not later:
                continue  # the trainer may still be sending: nothing says data is missing
            wait = 2 * self.opts.tick_s if past > i else self._gap_s
            if now - rec.activity < wait or now < rec.next_nack:
                continue
            covered = rec.buf.cov.total if rec.buf is not None else 0
            if covered != rec.covered_at_nack:
                rec.nack_rounds = 0  # progress since the last round
            if rec.nack_rounds >= self.opts.max_repair_rounds:
                if now - self._trainer_rx_at > self._silent_s and (
                    self._cut.holds or not self._cut.replica_applied(i)
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
                        self._note(
                            events.SHADOW_REPAIR_WAITING,
                            logging.INFO,
                            counter="repair_trainers_silent",
                            iteration=i,
                            silent_s=round(now - self._trainer_rx_at, 3),
                        )
                    rec.nack_rounds = self.opts.max_repair_rounds - 1
                else:
                    self._diverge(i, covered)
                    continue
            rec.nack_rounds += 1
            rec.covered_at_nack = covered
            rec.next_nack = now + self._gap_s * self.opts.repair_backoff**rec.nack_rounds
            if rec.buf is None:
                rec.buf = self._take_buf(ld)
            cov = rec.buf.cov if rec.buf is not None else IntervalSet()
            self._send_nack(
                i,
                ld.geom.missing(cov) if not rec.complete() else [],
                commit_missing=rec.commit is None,
            )

    def _send_nack(
        self, it: int, missing: list[tuple[int, int, int]], *, commit_missing: bool
    ) -> None:
        ld = self._ld
        assert ld is not None
        by_rank: dict[int, list[tuple[int, int, int]]] = {}
        all_ranks = range(len(self._trainer_addrs))
        for bucket, off, n in missing:
            for r in self._bucket_senders.get(bucket) or all_ranks:
                by_rank.setdefault(r, []).append((bucket, off, n))
        if commit_missing:
            by_rank.setdefault(0, [])  # zero ranges = "resend COMMIT(it)" (docs/shadow.md)
        per = self.opts.nack_ranges_per_datagram
        for rank, ranges in by_rank.items():
            if rank >= len(self._trainer_addrs):
                continue
            for lo in range(0, max(1, len(ranges)), per):
                body = wire.NackRecord.of(ranges[lo : lo + per]).body()
                self._seq = max(self._seq + 1, time.time_ns())
                data = wire.encode(
                    wire.Kind.NACK,
                    job=self._job,
                    sender=self.id,
                    iteration=it,
                    seq=self._seq,
                    layout=self._digest,
                    payload=body,
                    key=self._key,
                )
                try:
                    self.sock.sendto(data, self._trainer_addrs[rank])
                    self.ev["nack_sent"] += 1
                    self.ev["nack_ranges"] += len(ranges[lo : lo + per])
                except OSError as e:
                    self.ev["send_error"] += 1
                    log.debug("NACK to rank %d failed: %s", rank, e)
        event(
            log,
            events.SHADOW_REPAIR,
            level=logging.DEBUG,
            shadow=self.id,
            iteration=it,
            ranges=len(missing),
            commit_missing=commit_missing,
        )

    def _diverge(self, it: int, covered: int) -> None:
        if not self._cut.diverge(it):
            return
        self._move(Trigger.DIVERGE)
        ld = self._ld
        assert ld is not None
        self._note(
            events.SHADOW_DIVERGED,
            logging.WARNING,
            shard=ld.shard,
            iteration=it,
            last_applied=self._last_applied,
            covered=covered,
            owned=ld.geom.owned_nbytes,
        )
        self._send_ready(retx=False)
        self._cond.notify_all()

    # ---------------------------------------------------------------- apply

    def _apply_loop(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                job = self._next_job()
                if job is None:
                    self._cond.wait(self.opts.tick_s * 5)
                    job = self._next_job()
            if job is None:
                self._maybe_resync()
                self._maybe_snapshot()
                continue
            self._apply(*job)
            self._maybe_snapshot()

    def _next_job(self) -> tuple[int, _Iter, bool, int] | None:
        if self._ld is None:
            return None
        i = self._last_applied + 1
        if not self._can_apply(i):
            return None
        rec = self._iters[i]
        # with one shard, I* is this shard's own progress: nothing to keep
        retain = self._cut.retain_before(i) and (i - 1) not in self._snaps
        self._applying = i
        return i, rec, retain, self._gen

    def _apply(self, i: int, rec: _Iter, retain: bool, gen: int) -> None:
        ld = self._ld
        assert ld is not None and rec.buf is not None and rec.commit is not None
        with self._state_lock:
            with self._lock:
                if gen != self._gen:  # a load replaced the state since this step was chosen
                    return
            if retain:
                snap = ld.replayer.export()  # clones
                with self._lock:
                    self._snaps[i - 1] = snap
                    self.ev["cut_copies"] += 1
            try:
                ld.replayer.step(i, rec.buf.views(), rec.commit, rec.buf.buffer_views())
            except ReplayError as e:
                failed: ReplayError | None = e
            else:
                failed = None
        if failed is not None:
            with self._lock:
                self._applying = None
                self._cond.notify_all()  # a hold waiting for this step (_op_hold)
                if gen != self._gen:
                    return
                self._note(
                    events.SHADOW_REPLAY_FAILED, logging.ERROR, iteration=i, error=str(failed)
                )
                self._diverge(i, rec.buf.cov.total)
            return
        with self._lock:
            if gen != self._gen:
                return
            self._cut.applied(i)
            self._applying = None
            self._commits[i] = commit_to_json(i, rec.commit)
            self._iters.pop(i, None)
            ld.pool.append(rec.buf)
            rec.buf = None
            self._timeline[i] = {
                "first_chunk": rec.t_first,
                "last_chunk": rec.t_last,
                "commit": rec.t_commit,
                "ready": rec.t_ready,
                "applied": time.time(),
            }
            while len(self._timeline) > self.opts.timeline_len:
                self._timeline.popitem(last=False)
            self.ev["applied"] += 1
            self._update_istar()
            self._gc_snaps()
            self._send_ready(retx=False)
            self._cond.notify_all()

    # ---------------------------------------------------------------- resync

    def _maybe_clone(self) -> None:
        """A shadow without state (restarted) clones its shard from a healthy replica. With
        replication 1 there is none: the trainers see it unloaded and seed it (docs/shadow.md)."""
        now = time.monotonic()
        sh = self.spec.shadows
        if sh.replication < 2 or now < self._next_clone:
            return
        self._next_clone = now + max(0.5, self.opts.resync_interval_s)
        # the replicas follow from the counts alone (Layout.shadows_of_shard): shadow k holds
        # shard k % num_shards, so no layout is needed to know whom to ask
        shards = sh.count // sh.replication
        replicas = [self.id % shards + r * shards for r in range(sh.replication)]
        for sid in replicas:
            if sid == self.id or self._state is not NodeState.UNLOADED or self._stop.is_set():
                continue
            fetching = False
            try:
                with self._peer_client(sid) as client:
                    cfg = client.config()
                    if cfg.diverged_at is not None:
                        continue
                    layout = Layout.from_json(cfg.layout)
                    with self._lock:
                        self._move(Trigger.CLONE)
                    fetching = True
                    res = self._peer_fetch(client)
            except StateError:
                raise
            except _PEER_ERRORS as e:
                if fetching:
                    with self._lock:
                        self._move(Trigger.CLONE_FAILED)
                if not isinstance(e, ControlError) or e.code != "not_loaded":
                    self.ev["clone_failed"] += 1
                    log.debug("shadow %d: clone from shadow %d failed: %s", self.id, sid, e)
                continue
            try:
                self._load_state(
                    layout,
                    res.iteration,
                    res.states,
                    cfg.optimizer,
                    OptimizerSpec.from_json(cfg.optimizer),
                    commit=res.commit,
                    generation=cfg.generation,
                    reseed=False,
                    source=f"shadow {sid}",
                )
            except StateError:
                raise
            except (ShadowgradError, ReplayError) as e:
                with self._lock:
                    self._move(Trigger.CLONE_FAILED)
                self._note(events.SHADOW_CLONE_FAILED, logging.WARNING, replica=sid, error=str(e))
                continue
            self.ev["cloned"] += 1
            return

    def _maybe_resync(self) -> None:
        if self._state is NodeState.UNLOADED:
            self._maybe_clone()
            return
        with self._lock:
            # (RESYNCING and CLONING are this thread's own, and over when it gets here)
            if self._state is not NodeState.DIVERGED:
                return
            assert self._ld is not None and self._diverged_at is not None
            now = time.monotonic()
            if now < self._next_resync:
                return
            self._next_resync = now + self.opts.resync_interval_s
            d: int = self._diverged_at
            replicas = [s for s in self._ld.layout.shadows_of_shard(self._ld.shard) if s != self.id]
            # prefer replicas known to be past the hole
            peers = self._cut.peers
            replicas.sort(key=lambda s: -(peers[s].last_applied if s in peers else -9))
        for sid in replicas:
            fetching = False
            try:
                with self._peer_client(sid) as client:
                    st = client.status(timeline=0)
                    if st.diverged_at is not None or st.last_applied is None or st.last_applied < d:
                        continue
                    with self._lock:
                        self._move(Trigger.RESYNC)
                    fetching = True
                    res = self._peer_fetch(client)
            except StateError:
                raise
            except _PEER_ERRORS as e:
                if fetching:
                    with self._lock:
                        self._move(Trigger.RESYNC_FAILED)
                self._note(events.SHADOW_RESYNC_FAILED, logging.WARNING, replica=sid, error=str(e))
                continue
            self._install(res.iteration, res.states, source=f"shadow {sid}", commit=res.commit)
            return

    def _peer_control(self, sid: int) -> str:
        ep = self._peer_controls.get(sid)
        return ep if ep is not None else f"tcp://{self.spec.shadows.control_endpoint(sid)}"

    def _peer_client(self, sid: int) -> ShadowClient:
        return ShadowClient(
            self._peer_control(sid), self._token, timeout_s=self.spec.timeouts.rpc_s
        )

    def _peer_fetch(self, client: ShadowClient) -> FetchResult:
        """The newest state a replica holds (clone, resync): a whole shard, a longer deadline."""
        return client.fetch(None, timeout_s=max(self.spec.timeouts.rpc_s, 30.0))

    def _note(
        self,
        name: str,
        level: int,
        *,
        counter: str | None = None,
        count: bool = True,
        **fields: Any,
    ) -> None:
        """Log the event ``name`` (an :mod:`shadowgrad.events` constant, ``shadow.<x>``) of
        this shadow and, with ``count``, count it in :attr:`ev` as ``counter`` (default:
        ``<x>``)."""
        if count:
            self.ev[counter or name.removeprefix("shadow.")] += 1
        event(log, name, level=level, shadow=self.id, **fields)

    def set_peer_control(self, shadow_id: int, endpoint: str) -> None:
        """Tell this node where shadow ``shadow_id`` serves its control endpoint."""
        self._peer_controls[shadow_id] = endpoint

    def _install(
        self,
        iteration: int,
        states: Mapping[int, Mapping[str, torch.Tensor]],
        source: str,
        commit: dict[str, Any] | None = None,
    ) -> None:
        """Resync: load a replica's state of ``iteration`` and continue with buffered data."""
        ld = self._ld
        assert ld is not None
        try:
            boxes = [dict(states[k]) for k in range(ld.geom.entries)]
            with self._state_lock:
                ld.replayer.load(iteration, boxes)
        except (KeyError, ReplayError) as e:
            with self._lock:
                self._move(Trigger.RESYNC_FAILED)
            self._note(events.SHADOW_RESYNC_FAILED, logging.WARNING, source=source, error=str(e))
            return
        with self._lock:
            self._gen += 1
            old = self._last_applied
            self._cut.resynced(iteration)
            self._move(Trigger.RESYNCED)
            for it in [k for k in self._iters if k <= iteration]:
                rec = self._iters.pop(it)
                if rec.buf is not None:
                    ld.pool.append(rec.buf)
            self._snaps.clear()
            self._commits.clear()
            if commit is not None:
                try:
                    c_it, c_rec = commit_from_json(commit)
                    if c_it == iteration:
                        self._commits[iteration] = commit_to_json(c_it, c_rec)
                except ControlError as e:
                    log.warning("shadow %d: resync from %s: bad COMMIT: %s", self.id, source, e)
            self._note(
                events.SHADOW_RESYNC,
                logging.WARNING,
                counter="resynced",
                shard=ld.shard,
                source=source,
                iteration=iteration,
                previous=old,
            )
            self._update_istar()
            self._send_ready(retx=False)
            self._cond.notify_all()

    # ---------------------------------------------------------------- snapshots

    def _maybe_snapshot(self, force: bool = False) -> dict[str, Any] | None:
        every = self.spec.shadows.snapshot_every
        root = self.spec.shadows.snapshot_dir
        if root is None or (every <= 0 and not force):
            return None
        with self._snap_lock:
            return self._snapshot_locked(force, every, root)

    def _snapshot_locked(self, force: bool, every: int, root: Path) -> dict[str, Any] | None:
        if self._snap_thread is not None and self._snap_thread.is_alive():
            if force:
                self._snap_thread.join(60.0)
            else:
                return None
        with self._lock:
            ld = self._ld
            it = self._cut.istar
            if ld is None or it < 0 or (not force and it < self._snap_next):
                return None
            states = self._snaps.get(it)
            current = it == self._last_applied
        if states is None and not current:
            return None
        if states is None:
            with self._state_lock:
                with self._lock:
                    if self._last_applied != it:
                        return None
                states = ld.replayer.export()  # clones
        self._snap_next = (it // every + 1) * every if every > 0 else self._snap_next
        info: dict[str, Any] = {"iteration": it}
        kw: dict[str, Any] = {
            "shadow_id": self.id,
            "shard": ld.shard,
            "replica": ld.replica,
            "iteration": it,
            "layout_digest": ld.layout.digest,
            "optimizer_json": ld.optimizer_json,
            "states": states,
        }

        def write() -> None:
            t0 = time.monotonic()
            try:
                path = write_snapshot(Path(root), **kw)
            except ShadowgradError as e:
                info["error"] = str(e)
                self._note(events.SHADOW_SNAPSHOT_FAILED, logging.ERROR, iteration=it, error=str(e))
                return
            info["path"] = str(path)
            info["seconds"] = time.monotonic() - t0
            self.ev["snapshots"] += 1
            self._last_snapshot = info
            event(log, events.SHADOW_SNAPSHOT, shadow=self.id, iteration=it, path=str(path))

        self._snap_thread = threading.Thread(
            target=write, name=f"shadow{self.id}-snap", daemon=True
        )
        self._snap_thread.start()
        if force:
            self._snap_thread.join(120.0)
        return info

    # ---------------------------------------------------------------- control service

    def status(self, timeline: int = 16) -> dict[str, Any]:
        """What ``status`` answers, as its JSON header (also usable in-process)."""
        return self.status_reply(timeline).to_json()

    def status_reply(self, timeline: int = 16) -> ShadowStatus:
        """The ``status`` reply; ``timeline``: how many entries of the timeline and of the
        iterations pending it carries."""
        with self._lock:
            ld = self._ld
            tl = list(self._timeline.items())[-timeline:] if timeline > 0 else []
            pending = {
                str(k): {
                    "first_chunk": r.t_first,
                    "last_chunk": r.t_last,
                    "commit": r.t_commit,
                    "ready": r.t_ready,
                    "covered": r.buf.cov.total if r.buf is not None else 0,
                    "nack_rounds": r.nack_rounds,
                }
                for k, r in sorted(self._iters.items())[:timeline]
                if timeline > 0
            }
            now = time.monotonic()
            return ShadowStatus(
                shadow=self.id,
                # the process is up (EarlyControl answers true while it imports torch)
                starting=False,
                incarnation=self.incarnation,
                loaded=ld is not None,
                shard=None if ld is None else ld.shard,
                replica=None if ld is None else ld.replica,
                layout=None if ld is None else ld.layout.digest,
                owned_bytes=None if ld is None else ld.geom.owned_nbytes,
                last_ready=self._cut.ready_through() if ld is not None else None,
                last_applied=self._last_applied if ld is not None else None,
                istar=None if self._cut.istar == _UNKNOWN else self._cut.istar,
                newest_seen=self._newest_seen,
                lag=max(0, self._newest_seen - self._last_applied),
                diverged_at=self._diverged_at,
                trainers_silent_s=round(max(0.0, now - self._trainer_rx_at), 3),
                ranks={
                    r: RankStatus(self._rank_newest.get(r), round(max(0.0, now - t), 3))
                    for r, t in sorted(self._rank_rx_at.items())
                },
                generation=self._generation,
                window=None if ld is None else ld.window,
                buffered=len(self._iters),
                holds=tuple(sorted(self._cut.holds)),
                available=tuple(sorted({*self._snaps, self._last_applied}))
                if ld is not None
                else (),
                counters=dict(self.rx),
                events=dict(self.ev),
                peers={
                    k: PeerStatus(p.ready_through, p.last_applied, p.diverged)
                    for k, p in sorted(self._cut.peers.items())
                },
                timeline=tuple({"iteration": k, **v} for k, v in tl),
                pending=pending,
                last_snapshot=self._last_snapshot,
                finished=self._finished_now(),
            )

    def _finished_now(self) -> dict[str, Any] | None:
        """The ``finished`` record, while the generation it names is the one served (a later
        load of a newer generation, a new run of the job, clears it). Under ``_lock``."""
        f = self._finished
        if f is not None and int(f["generation"]) < self._generation:
            self._finished = f = None
        return None if f is None else dict(f)

    def _check_layout(self, layout: Layout) -> None:
        if (layout.num_shadows, layout.replication) != (
            self.spec.shadows.count,
            self.spec.shadows.replication,
        ):
            raise LayoutError(
                f"layout has {layout.num_shadows} shadows / replication {layout.replication}, "
                f"the job spec {self.spec.shadows.count} / {self.spec.shadows.replication}"
            )

    def _own_replayer(
        self, layout: Layout, iteration: int, opt_json: str, opt: Any
    ) -> ShardReplayer:
        """A ``keep`` load: this shadow's own state of ``iteration`` as a replayer (the live one
        when it stands at ``iteration`` with the same optimizer, else a new one loaded from the
        live state or the held snapshot of ``iteration``). ``unavailable`` when this shadow
        does not have it. The caller holds ``_state_lock`` (no step meanwhile)."""
        ld = self._ld
        with self._lock:
            last, snap, div = self._last_applied, self._snaps.get(iteration), self._diverged_at
        if ld is None or ld.layout != layout:
            raise ControlError("unavailable", "keep: this shadow holds no state of this layout")
        if div is not None and div <= iteration:
            raise ControlError("unavailable", f"keep: diverged at {div}")
        if iteration == last:
            if ld.optimizer_json == opt_json:
                return ld.replayer
            states = ld.replayer.export(copy=False)
        elif snap is not None:
            states = [snap[b] for b in range(ld.geom.entries)]
        else:
            raise ControlError(
                "unavailable", f"keep: iteration {iteration} not held here (at {last})"
            )
        replayer = ShardReplayer(layout, ld.shard, opt)
        replayer.load(iteration, [dict(st) for st in states])
        return replayer

    def _load_state(
        self,
        layout: Layout,
        iteration: int,
        states: Mapping[int, Mapping[str, torch.Tensor]] | None,
        opt_json: str,
        opt: Any,
        *,
        commit: dict[str, Any] | None,
        generation: int,
        reseed: bool,
        source: str,
    ) -> LoadReply:
        """Install a whole shard state as ``iteration`` (``load``, and the clone of a restarted
        replica); ``states=None``: this shadow's own state of ``iteration`` (a ``keep`` load,
        :meth:`_own_replayer`). ``reseed``: the job goes on (self-healing), so data already
        buffered for later iterations of the same generation is kept; otherwise everything in
        flight is dropped."""
        self._check_layout(layout)
        shard, replica = layout.shard_of_shadow(self.id)
        geom = ShardGeometry(layout, shard)
        replayer: ShardReplayer | None = None
        if states is not None:
            if sorted(states) != list(range(geom.entries)):
                raise ControlError(
                    "bad_request",
                    f"load has boxes {sorted(states)}, shard {shard} has {geom.entries}",
                )
            replayer = ShardReplayer(layout, shard, opt)
            replayer.load(iteration, [dict(states[k]) for k in range(geom.entries)])
        window = self.opts.window
        if window is None:
            per = max(1, geom.local_nbytes)
            window = max(4, min(self.opts.max_window, self.opts.window_bytes // per))
        with self._state_lock:
            if replayer is None:
                replayer = self._own_replayer(layout, iteration, opt_json, opt)
            with self._lock:
                return self._start_session(
                    layout,
                    replayer,
                    shard=shard,
                    replica=replica,
                    geom=geom,
                    iteration=iteration,
                    opt_json=opt_json,
                    window=window,
                    commit=commit,
                    generation=generation,
                    reseed=reseed,
                    source=source,
                    kept=states is None,
                )

    def _start_session(
        self,
        layout: Layout,
        replayer: ShardReplayer,
        *,
        shard: int,
        replica: int,
        geom: ShardGeometry,
        iteration: int,
        opt_json: str,
        window: int,
        commit: dict[str, Any] | None,
        generation: int,
        reseed: bool,
        source: str,
        kept: bool,
    ) -> LoadReply:
        """The session bookkeeping of a load (both locks held)."""
        if generation < self._generation:
            self.ev["load_stale_generation"] += 1
            raise ControlError(
                "stale_generation",
                f"load of generation {generation}: this "
                f"shadow serves generation {self._generation} of the job (a "
                "newer instance started; this one is fenced out)",
            )
        old = self._ld
        same = old is not None and old.layout == layout and old.shard == shard
        keep = reseed and same and generation == self._generation
        if keep and self._diverged_at is None and self._last_applied > iteration:
            # a re-seed captured before this shadow got further on its own (it cloned its
            # replica or caught up while the state travelled): installing it would take the
            # shard back, and at the end of training nothing would bring the last iteration
            # again (seen: a shadow seeded with 1 at 2 waited for 2 forever)
            self._note(
                events.SHADOW_SEED_BEHIND,
                logging.INFO,
                iteration=iteration,
                last_applied=self._last_applied,
                source=source,
            )
            return LoadReply(shard, replica, self._last_applied, generation, behind=True)
        if same and old is not None:
            pool, allocated, geom = old.pool, old.allocated, old.geom
            for it, rec in list(self._iters.items()):
                if keep and it > iteration:
                    continue
                del self._iters[it]
                if rec.buf is not None:
                    pool.append(rec.buf)
        else:
            pool, allocated = [], 0
            self._iters.clear()
        self._ld = _Loaded(
            layout,
            shard,
            replica,
            geom,
            replayer,
            opt_json,
            pool,
            window=window,
            allocated=allocated,
        )
        self._gen += 1
        self._generation = generation
        self._digest = wire.session_digest(layout.digest64, generation)
        # own progress at iteration, I* unknown; the peers' records and holds stay with keep
        self._cut.load(
            iteration,
            shard=shard,
            members=[layout.shadows_of_shard(s) for s in range(layout.num_shards)],
            keep=keep,
        )
        self._move(Trigger.LOAD)
        self._applying = None
        self._trainer_rx_at = time.monotonic()  # a LOAD comes from the trainers
        self._snaps.clear()
        self._commits = {iteration: commit} if commit is not None else {}
        if not keep:
            # the senders of the old job (e.g. ranks 2, 3 before a 4 -> 2 restore) are gone
            self._bucket_senders.clear()
            self._rank_newest.clear()
            self._rank_rx_at.clear()
            self._newest_seen = iteration
        else:
            self._newest_seen = max(self._newest_seen, iteration)
        self._snap_next = self.spec.shadows.snapshot_every
        self.ev["loads"] += 1
        if kept:
            self.ev["loads_kept"] += 1  # installed its own state: nothing travelled
        self._note(
            events.SHADOW_SEEDED if reseed else events.SHADOW_LOAD,
            logging.WARNING if reseed else logging.INFO,
            count=reseed,
            shard=shard,
            replica=replica,
            iteration=iteration,
            source=source,
            generation=generation,
            layout=layout.digest[:16],
            boxes=geom.entries,
            kept_ahead=len(self._iters),
            own_state=kept,
        )
        self._update_istar()
        self._send_ready(retx=False)
        if reseed and commit is None and iteration >= 0:
            # seeded by a rank other than 0: ask rank 0 for COMMIT(iteration), so a restore
            # at I* = iteration still has the scheduler, scaler and user state
            self._send_nack(iteration, [], commit_missing=True)
        self._cond.notify_all()
        return LoadReply(shard, replica, iteration, generation)

    # ---------------------------------------------------------------- in-process helpers

    def wait_for(self, predicate: Any, timeout_s: float) -> bool:
        """Poll ``predicate(status_dict)`` until true or ``timeout_s`` (tests, tools)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._error is not None:
                raise ShadowgradError(f"shadow {self.id} failed: {self._error!r}")
            if predicate(self.status(timeline=0)):
                return True
            time.sleep(0.005)
        return False
