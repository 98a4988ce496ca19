"""The trainers' view of the checkpoint's health, and self-healing by re-seeding (DESIGN inv. 7).

One :class:`HealthMonitor` thread per rank polls every shadow's ``status`` (a brief one, short
timeouts, never on the training thread; another rank's healthy shadow every
:attr:`HealthMonitor.OTHERS_EVERY` rounds) and classifies each shadow: ``healthy``,
``unloaded`` (a restarted shadow with no state), ``starting`` (a restarted shadow process that
answers but is still importing torch: not re-seeded until it is ``unloaded``, so the state sent
is the newest and its ``load`` does not wait), ``diverged``, ``stale`` (it serves an older
generation of the job), ``fenced`` (it serves a *newer* one: another instance took over and this
one must not touch the shadows), or ``unreachable``.
A shard is healthy while one of its replicas is.

A shadow that cannot heal by itself is **re-seeded** from the trainers: the rank responsible for
it (``shadow % world == rank``, as for the initial load) captures the shard's parameters and
optimizer state after an optimizer step — one staging copy on the training thread, the only pause
self-healing costs (:attr:`HealthMonitor.pauses`) — and this thread sends it as a ``load`` with
``reseed=True``, which keeps what the shadow buffered for later iterations; the shadow then
repairs the few iterations in between from the senders' retransmit history and rejoins the
consistent cut. A shadow with a healthy replica is left to clone itself from that replica (a
restarted replica does so on its own; a diverged one resynchronises) for ``failure_detect``
before the trainers step in. A NACK the retransmit history can no longer answer asks for a
re-seed at once (``request``).

Events (once per change): ``trainer.shadow_health`` (shadow, state, previous), ``trainer.reseed``
(shadow, iteration, pause_ms; rtt_ms: the ``load``'s round trip; install_ms: the part of it the
shadow spent installing the state, as it reports; send_ms: the transfer, from the call's start
until the shadow took the request off its socket, on the shadow's clock related to ours by the
status polls (:class:`PeerClock`, within clock_err_ms); reply_ms: the rest of the round trip
(the reply's way back); from a shadow that reports no clock, send_ms = rtt_ms - install_ms;
bytes: the tensor data it carried; send_mb_s: bytes / send_ms), ``trainer.reseed_failed``,
``trainer.fenced``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shadowgrad import events
from shadowgrad._log import event
from shadowgrad.layout import Layout
from shadowgrad.messages import ShadowStatus

__all__ = ["HealthMonitor", "ShadowView", "health_interval"]

log = logging.getLogger(__name__)

HEALTHY, UNLOADED, STARTING, DIVERGED, STALE, FENCED, UNREACHABLE = (
    "healthy",
    "unloaded",
    "starting",
    "diverged",
    "stale",
    "fenced",
    "unreachable",
)


@dataclass
class PeerClock:
    """Where a peer's monotonic clock stands against ours, from calls whose replies carry it:
    a call sent at ``a`` and answered at ``b`` (our clock) with the peer's reading ``c`` puts
    the offset at ``c - (a + b) / 2``, within ``(b - a) / 2``. The sample of the shortest
    round trip is kept (NTP's minimum filter) until one as short comes, or it is older than
    ``max_age_s`` (drift), or the peer is another process (``incarnation``)."""

    offset: float | None = None
    err: float = math.inf
    at: float = 0.0
    incarnation: str | None = None
    max_age_s: float = 30.0

    def add(self, a: float, b: float, c: float, incarnation: str | None = None) -> None:
        err = (b - a) / 2
        if (
            self.offset is None
            or incarnation != self.incarnation
            or err <= self.err
            or b - self.at > self.max_age_s
        ):
            self.offset, self.err, self.at = c - (a + b) / 2, err, b
            self.incarnation = incarnation

    def ours(self, c: float) -> float | None:
        """The peer's reading ``c`` on our clock (None until a sample came)."""
        return None if self.offset is None else c - self.offset


@dataclass
class ShadowView:
    """What the monitor last saw of one shadow."""

    state: str = UNREACHABLE
    since: float = 0.0
    last_applied: int = -1
    #: when last_applied last moved (monotonic), and the trainers' iteration then
    moved_at: float = 0.0
    training_then: int | None = None
    #: a re-seed of this shadow in flight or sent: (iteration, monotonic time)
    seeded: tuple[int, float] | None = None
    #: re-seed asked for (a NACK history could not answer), with the reason
    requested: str | None = None
    #: its clock against ours (from the status polls), for the re-seed's one-way time
    clock: PeerClock = field(default_factory=PeerClock)


def health_interval(failure_detect_s: float) -> float:
    """Seconds between the monitor's looks at the shadows: six per ``failure_detect`` (what
    bounds noticing a failed shadow), between 0.1 and 0.5 s."""
    return max(0.1, min(0.5, failure_detect_s / 6))


def classify(st: ShadowStatus | None, generation: int) -> str:
    if st is None:
        return UNREACHABLE
    if not st.loaded:
        # a shadow process still importing torch answers "starting" (shadow/_early.py): a
        # re-seed now would wait for it, so it is taken once the shadow can load at once
        return STARTING if st.starting else UNLOADED
    if st.generation > generation:
        return FENCED
    if st.generation < generation:
        return STALE
    if st.diverged_at is not None:
        return DIVERGED
    return HEALTHY


def state_bytes(states: list[dict[str, Any]]) -> int:
    """Bytes of tensor data in a shard's box states (what a re-seed ``load`` carries)."""
    return sum(int(getattr(v, "nbytes", 0)) for st in states for v in st.values())


def reseed_event(
    logger: logging.Logger,
    rank: int,
    shadow: int,
    iteration: int,
    *,
    shard: int | None = None,
    error: BaseException | None = None,
    **fields: Any,
) -> None:
    """Log ``trainer.reseed``: rank ``rank`` re-seeded ``shadow`` (of ``shard``) with the state
    of ``iteration`` (``fields``: how it went), or with ``error``, ``trainer.reseed_failed``.
    The monitor's re-seeds and the one at close."""
    more: dict[str, Any]
    if error is None:
        name, more = events.TRAINER_RESEED, {"shard": shard, "iteration": iteration, **fields}
    else:
        name, more = events.TRAINER_RESEED_FAILED, {"iteration": iteration, "error": str(error)}
    event(logger, name, logging.WARNING, rank=rank, shadow=shadow, **more)


def _send_fields(
    nbytes: int,
    rtt_s: float,
    install_s: float | None,
    arrived_s: float | None = None,
    clock_err_s: float | None = None,
) -> dict[str, Any]:
    """The timing fields of ``trainer.reseed``. ``install_s``: the shadow's own time on the
    request, as it reported it (None from a shadow that does not). ``arrived_s``: when the
    shadow had the whole request, from the start of the call, on our clock (its
    ``received_at`` through :class:`PeerClock`, within ``clock_err_s``): the transfer is that
    (one way); the rest of the round trip, less the install, is the reply's way back
    (``reply_ms``: the reply and the wake-up of this thread, on a busy machine most of it).
    Without it (a shadow that reports no clock) the whole round trip less the install counts
    as the transfer."""
    inst = min(max(0.0, install_s or 0.0), rtt_s)
    send_s = rtt_s - inst if arrived_s is None else min(max(0.0, arrived_s), rtt_s - inst)
    out: dict[str, Any] = {
        "rtt_ms": round(1000 * rtt_s, 1),
        "install_ms": None if install_s is None else round(1000 * inst, 1),
        "send_ms": round(1000 * send_s, 1),
    }
    if arrived_s is not None:
        out["reply_ms"] = round(1000 * (rtt_s - inst - send_s), 1)
        out["clock_err_ms"] = None if clock_err_s is None else round(1000 * clock_err_s, 2)
    out["bytes"] = nbytes
    out["send_mb_s"] = round(nbytes / send_s / 1e6, 1) if send_s > 0 else None
    return out


class HealthMonitor:
    """See the module docstring. ``status(k)`` returns shadow ``k``'s status or raises;
    ``load(k, iteration, states, commit)`` sends a re-seed ``load`` to shadow ``k`` and returns
    the install seconds and the receipt time (its clock) the shadow reports (None: not
    reported)."""

    def __init__(
        self,
        layout: Layout,
        *,
        rank: int,
        world: int,
        generation: int,
        status: Callable[[int], ShadowStatus],
        load: Callable[
            [int, int, list[dict[str, Any]], dict[str, Any] | None],
            tuple[float | None, float | None],
        ],
        interval_s: float,
        grace_s: float,
        reseed_timeout_s: float,
        progress: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.layout = layout
        self.rank = rank
        self.world = world
        self.generation = generation
        self._status = status
        self._load = load
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.reseed_timeout_s = reseed_timeout_s
        #: the trainers' next iteration (None before the first step)
        self._progress = progress
        now = time.monotonic()
        # unknown until the first poll (moments after start): not healthy
        self.views = {k: ShadowView(UNREACHABLE, now) for k in range(layout.num_shadows)}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._wanted: set[int] = set()
        self._submitted: list[
            tuple[int, list[int], list[dict[str, Any]], dict[str, Any] | None]
        ] = []
        self.fenced = False
        #: since when every shadow is healthy (None: not now); the stall clock starts there
        self._all_healthy_since: float | None = None
        self.reseeds = 0
        self.reseed_failures = 0
        #: seconds the training thread spent capturing re-seed state, per capture
        self.pauses: list[float] = []
        self.polls = 0
        #: how often a shadow entered each state (after the first poll)
        self.transitions: dict[str, int] = {}
        self._thread = threading.Thread(
            target=self._run, name=f"shadowgrad-health-r{rank}", daemon=True
        )

    def start(self) -> HealthMonitor:
        self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> bool:
        """Stop the thread; True when it ended within ``timeout_s``."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # -- any thread ---------------------------------------------------------------------

    def request(self, shadow: int, reason: str) -> None:
        """Ask for a re-seed of ``shadow`` (e.g. its NACK can no longer be answered). Any rank
        may: every rank holds the whole state, and the rank whose history is gone is the one
        that knows."""
        with self._lock:
            v = self.views[shadow]
            if v.requested is None and not self._seed_pending(v, time.monotonic()):
                v.requested = reason
                self._wanted.add(shadow)

    def unhealthy_shards(self) -> list[int]:
        with self._lock:
            return [
                s
                for s in range(self.layout.num_shards)
                if not any(self.views[k].state == HEALTHY for k in self.layout.shadows_of_shard(s))
            ]

    def covered(self, iteration: int) -> bool:
        """Every shard has a healthy replica that applied ``iteration`` (or was seeded past it)."""
        with self._lock:
            for s in range(self.layout.num_shards):
                best = -2
                for k in self.layout.shadows_of_shard(s):
                    v = self.views[k]
                    if v.state == HEALTHY:
                        best = max(
                            best, v.last_applied, v.seeded[0] if v.seeded is not None else -2
                        )
                if best < iteration:
                    return False
        return True

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {
                "shadows": {str(k): v.state for k, v in self.views.items()},
                "unhealthy_shards": [
                    s
                    for s in range(self.layout.num_shards)
                    if not any(
                        self.views[k].state == HEALTHY for k in self.layout.shadows_of_shard(s)
                    )
                ],
                "reseeds": self.reseeds,
                "reseed_failures": self.reseed_failures,
                "transitions": dict(self.transitions),
                "reseed_pauses_s": list(self.pauses[-16:]),
                "fenced": self.fenced,
            }

    # -- training thread ----------------------------------------------------------------

    @property
    def wants_reseed(self) -> bool:
        """Whether a re-seed waits for the training thread's capture (one read, no lock)."""
        return bool(self._wanted)

    def take_wanted(self) -> dict[int, list[int]]:
        """Shard -> shadows to re-seed now (cleared); the caller captures each shard's state
        and calls :meth:`submit`. Cheap when nothing is wanted (one attribute read)."""
        if not self._wanted:
            return {}
        with self._lock:
            wanted, self._wanted = self._wanted, set()
            now = time.monotonic()
            out: dict[int, list[int]] = {}
            for k in sorted(wanted):
                self.views[k].seeded = (-1, now)  # in flight: not asked again meanwhile
                out.setdefault(self.layout.shard_of_shadow(k)[0], []).append(k)
            return out

    def submit(
        self,
        iteration: int,
        shadows: list[int],
        states: list[dict[str, Any]],
        commit: dict[str, Any] | None,
        pause_s: float,
    ) -> None:
        with self._lock:
            self._submitted.append((iteration, shadows, states, commit))
            self.pauses.append(pause_s)
            del self.pauses[:-256]
        self._wake.set()

    # -- the thread ---------------------------------------------------------------------

    def _seed_pending(self, v: ShadowView, now: float) -> bool:
        return (
            v.seeded is not None
            and now - v.seeded[1] < self.reseed_timeout_s
            and (v.seeded[0] < 0 or v.last_applied < v.seeded[0] or v.state != HEALTHY)
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self._send_submitted()
            self._poll()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def _send_submitted(self) -> None:
        with self._lock:
            todo, self._submitted = self._submitted, []
        for iteration, shadows, states, commit in todo:
            nbytes = state_bytes(states)
            for k in shadows:
                t0 = time.monotonic()
                try:
                    install_s, received_at = self._load(k, iteration, states, commit)
                    rtt_s = time.monotonic() - t0
                except Exception as exc:
                    self.reseed_failures += 1
                    with self._lock:
                        self.views[k].seeded = None
                    reseed_event(log, self.rank, k, iteration, error=exc)
                    continue
                self.reseeds += 1
                with self._lock:
                    v = self.views[k]
                    v.seeded = (iteration, time.monotonic())
                    v.requested = None
                    at = None if received_at is None else v.clock.ours(received_at)
                    err = v.clock.err if at is not None else None
                reseed_event(
                    log,
                    self.rank,
                    k,
                    iteration,
                    shard=self.layout.shard_of_shadow(k)[0],
                    pause_ms=round(1000 * self.pauses[-1], 3) if self.pauses else None,
                    **_send_fields(nbytes, rtt_s, install_s, None if at is None else at - t0, err),
                )

    #: another rank's shadow that looks healthy is polled every this many rounds (its own
    #: rank polls it every round and re-seeds it): each shadow answers about 1 + (world - 1) /
    #: OTHERS_EVERY polls a round instead of ``world``, and every rank still sees every shadow
    OTHERS_EVERY = 4

    def _due(self, k: int, now: float) -> bool:
        """Whether this round polls shadow ``k`` (lock held): this rank's own shadows, any
        that is not healthy or that this rank was asked to re-seed, every round; another
        rank's healthy one every :attr:`OTHERS_EVERY` rounds."""
        v = self.views[k]
        return (
            k % self.world == self.rank
            or self.polls % self.OTHERS_EVERY == 0
            or v.state != HEALTHY
            or v.requested is not None
            or self._seed_pending(v, now)
        )

    def _poll(self) -> None:
        sts: dict[int, ShadowStatus | None] = {}
        with self._lock:
            now = time.monotonic()
            due = [k for k in range(self.layout.num_shadows) if self._due(k, now)]
        for k in due:
            if self._stop.is_set():
                return
            a = time.monotonic()
            try:
                got = sts[k] = self._status(k)
            except Exception:
                sts[k] = None
                continue
            if got.clock is not None:
                with self._lock:
                    self.views[k].clock.add(a, time.monotonic(), got.clock, got.incarnation)
        self.polls += 1
        now = time.monotonic()
        changes: list[tuple[int, str, str, ShadowStatus | None]] = []
        with self._lock:
            for k, st in sts.items():
                v = self.views[k]
                state = classify(st, self.generation)
                if st is not None and st.last_applied is not None:
                    la = st.last_applied
                    if la != v.last_applied or v.training_then is None:
                        v.moved_at, v.training_then = now, self._progress()
                    v.last_applied = la
                if state != v.state:
                    changes.append((k, v.state, state, st))
                    v.state, v.since = state, now
                    if self.polls > 1:
                        self.transitions[state] = self.transitions.get(state, 0) + 1
            if any(v.state == FENCED for v in self.views.values()):
                if not self.fenced:
                    self.fenced = True
                    event(
                        log,
                        events.TRAINER_FENCED,
                        logging.ERROR,
                        rank=self.rank,
                        generation=self.generation,
                        newer=max(0 if s is None else s.generation for s in sts.values()),
                    )
            else:
                self._stalled_locked(now)
                self._choose_locked(now)
        for k, old, new, st in changes:
            if self.polls == 1 and new == HEALTHY:
                continue  # the first look: healthy is what everyone expects, say nothing
            event(
                log,
                events.TRAINER_SHADOW_HEALTH,
                logging.INFO if new == HEALTHY else logging.WARNING,
                rank=self.rank,
                shadow=k,
                state=new,
                previous=old,
                last_applied=None if st is None else st.last_applied,
                diverged_at=None if st is None else st.diverged_at,
            )

    def _stalled_locked(self, now: float) -> None:
        """Every shadow answers and none is unhealthy, yet one has not applied anything for
        ``grace_s`` while training moved on: the stream is stuck (e.g. what it misses is gone
        from every history): re-seed it, the last resort that always converges. (A shard
        waiting on a stopped or dead peer is not stuck: that peer is unreachable or unhealthy,
        and the peer is what gets healed.)"""
        if any(v.state != HEALTHY for v in self.views.values()):
            self._all_healthy_since = None
            return
        if self._all_healthy_since is None:
            self._all_healthy_since = now  # a shard waiting for a peer that just healed waits
        it = self._progress()
        for k, v in self.views.items():
            if k % self.world != self.rank or v.requested is not None:
                continue
            idle = now - max(v.moved_at, self._all_healthy_since)
            if (
                it is not None
                and v.training_then is not None
                and it > v.training_then
                and idle > self.grace_s
                and not self._seed_pending(v, now)
            ):
                v.requested = "stalled"
                event(
                    log,
                    events.TRAINER_SHADOW_HEALTH,
                    logging.WARNING,
                    rank=self.rank,
                    shadow=k,
                    state="stalled",
                    previous=v.state,
                    last_applied=v.last_applied,
                    iteration=it,
                )

    def _choose_locked(self, now: float) -> None:
        for k, v in self.views.items():
            if v.state in (UNREACHABLE, STARTING) or (
                k % self.world != self.rank and v.requested is None
            ):
                continue  # another rank's (unless this rank was the one asked)
            if v.state == HEALTHY and v.requested is None:
                continue
            if self._seed_pending(v, now):
                continue
            if v.state != HEALTHY:
                shard = self.layout.shard_of_shadow(k)[0]
                replica_ok = any(
                    self.views[j].state == HEALTHY
                    for j in self.layout.shadows_of_shard(shard)
                    if j != k
                )
                if replica_ok and now - v.since < self.grace_s:
                    continue  # it clones / resynchronises from its replica by itself
            self._wanted.add(k)
