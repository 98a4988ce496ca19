"""One shadow node: receive, verify, reassemble, consistently apply, repair, serve, persist.

:class:`ShadowNode` owns the sockets, the protocol state shared by its threads (one lock,
``_lock``; ``_state_lock`` for the replayer's tensors), the lifecycle (:class:`NodeState`,
moved by :meth:`ShadowNode._move`), the consistent cut's bookkeeping (``shadow/_cut.py``), and
starts and stops the threads; each thread's work is its own module, which works on the node's
state the way the control handlers do.

Threads (all stop within ``tick_s`` of :meth:`ShadowNode.stop`):

* **rx** (``shadow/_receiver.py``, :class:`~shadowgrad.shadow._receiver.Receiver`) —
  ``recv_into`` a preallocated buffer (socket timeout ``tick_s``), :meth:`handle_datagram`
  (decode + place bytes, no per-element Python), then the timers: gap repair (NACK with backoff,
  divergence when it fails), READY refresh to the peer shadows.
* **apply** (``shadow/_applier.py``, :class:`~shadowgrad.shadow._applier.Applier`) — steps the
  :class:`~shadowgrad.shadow.replay.ShardReplayer` for iteration ``last_applied + 1`` once the
  two-phase rule allows it (docs/shadow.md), keeps the state of the consistent cut I* when it
  moves ahead of it, clones or resynchronises from a replica, installs loaded states, and starts
  background disk snapshots.
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
import weakref
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
import zmq

from shadowgrad import events
from shadowgrad._control_server import bind_router
from shadowgrad._log import event
from shadowgrad.bulk import BulkServer, endpoint_host
from shadowgrad.config import JobSpec
from shadowgrad.errors import LayoutError, ShadowgradError
from shadowgrad.layout import Layout
from shadowgrad.messages import PeerStatus, RankStatus, ShadowStatus
from shadowgrad.shadow._applier import Applier, _Loaded
from shadowgrad.shadow._cut import UNKNOWN as _UNKNOWN
from shadowgrad.shadow._cut import CutTracker
from shadowgrad.shadow._early import new_incarnation, shadow_control_server
from shadowgrad.shadow._handlers import ControlHandlers
from shadowgrad.shadow._receiver import NONE_ITER, Receiver, _Iter
from shadowgrad.shadow._state import NodeState, Trigger, transition
from shadowgrad.shadow.control import ControlError

__all__ = ["NodeOptions", "ShadowNode", "NONE_ITER"]


log = logging.getLogger(__name__)


def _refusal(e: Exception) -> tuple[str, str] | None:
    """How the control endpoint answers a handler's exception: a ControlError with its own code
    (None: the server's default), a bad argument or state as ``bad_request``."""
    if isinstance(e, ControlError):
        return None
    if isinstance(e, (ShadowgradError, KeyError, TypeError, ValueError)):
        return "bad_request", f"{type(e).__name__}: {e}"
    return None


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
    #: receive DATA straight into the iteration buffer (peek at the header, then the kernel
    #: copies the payload into its box; docs/shadow.md): no user-space copy of the payload.
    #: False: every datagram goes through the scratch buffer (one copy more)
    direct_rx: bool = True
    #: receive a direct run's chunks in C (shadow/_rxnative.c: recvmsg, the header checks and the
    #: GMAC or CRC-32C without the GIL, up to 16 chunks a call) where that extension was built;
    #: False, or where it was not: the same loop in Python (~8 us more per datagram)
    native_rx: bool = True
    #: receive buffer asked for (SO_RCVBUFFORCE when permitted, else SO_RCVBUF)
    rcvbuf_bytes: int = 64 * 2**20
    #: iterations kept in the status timeline
    timeline_len: int = 256
    #: keep the state of I* when this shard applies ahead of it (invariant 2)
    retain_cut: bool = True
    #: at most this many NACK ranges per datagram
    nack_ranges_per_datagram: int = 512


class _Serve:
    """One fetch reply over the live tensors: its tracker comes once the control server queued
    it (:class:`~shadowgrad._control_server.TrackedFrames`); None, the send failed."""

    def __init__(self) -> None:
        self.queued = threading.Event()
        self.tracker: zmq.MessageTracker | None = None

    def sent(self, tracker: zmq.MessageTracker | None) -> None:
        self.tracker = tracker
        self.queued.set()

    def wait(self, deadline: float) -> bool:
        """Until libzmq let go of the reply's frames; False past ``deadline`` (monotonic)."""
        if not self.queued.wait(max(0.0, deadline - time.monotonic())):
            return False
        if self.tracker is None:
            return True
        try:
            self.tracker.wait(max(0.0, deadline - time.monotonic()))
        except zmq.NotDone:
            return False
        return True


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
        #: the rx threads' side (shadow/_receiver.py) and the apply thread's (shadow/_applier.py):
        #: each keeps only its own thread's bookkeeping and works on the node's state below
        self._receiver = Receiver(self)
        self._applier = Applier(self)
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
        # state: everything below is shared by the threads (rx, apply, control) and guarded by
        # the one _lock (_cond, its condition, wakes the apply thread and a waiting hold), but
        # the replayer's tensors, which _state_lock guards (taken before _lock when both are)
        self._lock = threading.Lock()  # protocol state
        self._state_lock = threading.Lock()  # the replayer's tensors
        #: fetch replies sent from the live tensors, without a copy (under _lock): the apply
        #: thread waits for them before it writes those tensors again (:meth:`_quiesce_serves`)
        self._serving: list[_Serve] = []
        #: the bulk channel of streamed fetches (shadowgrad.bulk), made by the first one
        self._bulk_server: BulkServer | None = None
        self._bulk_failed = False
        self._cond = threading.Condition(self._lock)
        self._stop = threading.Event()
        self.ev: Counter[str] = Counter()
        #: the control ops (shadow/_handlers.py), served on the node's state and locks
        self._handlers = ControlHandlers(self)
        #: the control endpoint's request loop (its thread is the node's ``control`` thread)
        self._control = shadow_control_server(
            ctx,
            rep,
            self._token,
            shadow_id,
            counters=self.ev,
            logger=log,
            poll_s=self.opts.tick_s * 10,
            handlers=self._handlers.table(),
            stop=self._stop,
            refusal=_refusal,
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
        #: iterations of _snaps whose tensors were handed out (a fetch, the snapshot writer, a
        #: ``keep`` load): never recycled. A retained state dropped unlent becomes the spare
        #: set the next retention copies into (no fresh allocation, no page faults per step)
        self._snaps_lent: set[int] = set()
        self._snap_spare: list[dict[str, torch.Tensor]] | None = None
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
        self.rx: Counter[str] = Counter()
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
            (f"rx{k}", self._receiver.loop, (k,)) for k in range(self.opts.rx_threads)
        ]
        loops += [
            ("apply", self._applier.loop, ()),
            ("control", self._control.serve, (backlog,)),
        ]
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
        for t in [*self._threads, self._applier.snap_thread]:
            if t is not None:
                t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads = []
        with contextlib.suppress(OSError):
            self.sock.close()
        self._control.close(0.0)
        if self._bulk_server is not None:
            self._bulk_server.close(max(0.0, deadline - time.monotonic()))
        if alive:
            raise ShadowgradError(f"shadow {self.id}: threads {alive} did not stop in {timeout_s}s")
        self._detach_parts()
        with self._lock:
            self._move(Trigger.STOP)
        event(log, events.SHADOW_STOP, shadow=self.id)

    def _detach_parts(self) -> None:
        """With every thread stopped: the receiver, the applier and the control handlers refer
        back to this node weakly from now on. Each held it strongly (a plain attribute, read on
        every datagram), so a stopped node was a reference cycle with its buffers (about 1 GB at
        100M parameters), freed only when Python's cyclic collector next ran, on whichever
        thread set it off, with the GIL held: in one process that starts another node, in the
        middle of that node's first optimizer step (docs/shadow.md). Now the last reference to a
        stopped node frees it. What a caller does with it after ``stop`` (``status``,
        ``handle_datagram``) goes on working through the weak references."""
        me = cast("ShadowNode", weakref.proxy(self))
        for part in (self._receiver, self._applier, self._handlers):
            part.node = me

    def __enter__(self) -> ShadowNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def failed(self) -> BaseException | None:
        """The exception that killed a node thread, if any."""
        return self._error

    # ---------------------------------------------------------------- receive path

    def handle_datagram(
        self, data: memoryview | bytes | bytearray, src: tuple[str, int] | None = None
    ) -> str:
        """Verify and handle one datagram from ``src``; return the rx counter it was counted
        under. DATA and COMMIT count only from a trainer's address and READY only from a
        peer's (``src=None``: a caller that has checked the source itself). The receive
        threads' work (:meth:`Receiver.handle <shadowgrad.shadow._receiver.Receiver.handle>`),
        callable in-process."""
        return self._receiver.handle(data, src)

    # ---------------------------------------------------------------- consistent cut
    # shared by the receiver, the applier and the control handlers (under _lock)

    def _serve_live(self) -> _Serve:
        """Register a fetch reply about to be sent from the live tensors (the caller holds
        ``_state_lock``, so no step has begun writing them)."""
        serve = _Serve()
        with self._lock:
            self._serving.append(serve)
        return serve

    def _bulk(self) -> BulkServer | None:
        """The bulk channel's server, listening on the control host (made by the first
        streamed fetch, on the control thread); None when it cannot listen (the fetch is then
        answered with frames, as by a shadow without one)."""
        if self._bulk_server is None and not self._bulk_failed and not self._stop.is_set():
            try:
                self._bulk_server = BulkServer(
                    endpoint_host(self.control_endpoint),
                    ticket_ttl_s=self.spec.timeouts.rpc_s,
                    counters=self.ev,
                    name=f"shadow{self.id}-bulk",
                )
            except OSError as e:
                self._bulk_failed = True
                log.warning("shadow %d: no bulk channel (%s): fetches send frames", self.id, e)
        return self._bulk_server

    def _quiesce_serves(self) -> None:
        """Before the live tensors are written (the caller holds ``_state_lock``): wait until
        every fetch reply sent from them has left (``timeouts.rpc``). Past it, the write goes
        ahead: the requester's checksums, computed before, refuse what changed under them
        (``shadow.serve_overrun``)."""
        with self._lock:
            pending, self._serving = self._serving, []
        if not pending:
            return
        deadline = time.monotonic() + self.spec.timeouts.rpc_s
        late = sum(not serve.wait(deadline) for serve in pending)
        if late:
            self._note(events.SHADOW_SERVE_OVERRUN, logging.WARNING, replies=late)

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
                snap = self._snaps.pop(it)
                if it in self._snaps_lent:
                    self._snaps_lent.discard(it)
                elif self._snap_spare is None and self._cut.retain_before(self._last_applied + 1):
                    self._snap_spare = snap  # the next step retains again: its copy goes here
        for it in list(self._commits):
            if it != self._last_applied and it not in self._snaps:
                del self._commits[it]

    def _drop_snaps(self) -> None:
        """Forget every retained and held state (a load or resync replaced the state; its
        shapes may differ): nothing of them is recycled."""
        self._snaps.clear()
        self._snaps_lent.clear()
        self._snap_spare = None

    def _lend_snap(self, it: int) -> list[dict[str, torch.Tensor]] | None:
        """The retained or held state of ``it`` for a reader outside the lock (never recycled
        after this), or None."""
        snap = self._snaps.get(it)
        if snap is not None:
            self._snaps_lent.add(it)
        return snap

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
        self._receiver.send_ready(retx=False)
        self._cond.notify_all()

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

    # ---------------------------------------------------------------- control service

    def status(self, timeline: int = 16) -> dict[str, Any]:
        """What ``status`` answers, as its JSON header (also usable in-process)."""
        return self.status_reply(timeline).to_json()

    def status_reply(self, timeline: int = 16, *, brief: bool = False) -> ShadowStatus:
        """The ``status`` reply; ``timeline``: how many entries of the timeline and of the
        iterations pending it carries; ``brief``: the health check's fields only (the maps and
        lists of the full status empty, :class:`~shadowgrad.messages.StatusRequest`)."""
        with self._lock:
            ld = self._ld
            now = time.monotonic()
            head = ShadowStatus(
                shadow=self.id,
                # the process is up (EarlyControl answers true while it imports torch)
                starting=False,
                incarnation=self.incarnation,
                clock=now,
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
                generation=self._generation,
                window=None if ld is None else ld.window,
                buffered=len(self._iters),
                finished=self._finished_now(),
                ranks={},
                holds=(),
                available=(),
                counters={},
                events={},
                peers={},
            )
            if brief:
                return head
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
            return replace(
                head,
                ranks={
                    r: RankStatus(self._rank_newest.get(r), round(max(0.0, now - t), 3))
                    for r, t in sorted(self._rank_rx_at.items())
                },
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
                last_snapshot=self._applier.last_snapshot,
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
