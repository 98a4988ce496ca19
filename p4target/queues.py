"""Per-port egress queues: FIFO, optional rate (token bucket), emulated delay and loss, and
lossless mode.

Each :class:`EgressQueue` owns one transmit thread that takes frames in FIFO order, waits until a
frame's release time (``enqueue time + delay``), paces it through a token bucket when a rate is
set, applies the seeded loss knob, and calls the port's transmit function.

**Lossy queues** (the default) tail-drop when ``capacity`` packets are queued, counting
``tail_drop``.

**Lossless queues** (shadow ports, ``--lossless-port``) never tail-drop. When the queue holds
``capacity`` packets it is *paused* (XOFF): :meth:`EgressQueue.put` blocks the producer — the RX
thread of the ingress port whose packet is being enqueued — until the depth falls to
``xon`` packets (XON) or ``pause_timeout_s`` passes. While that RX thread is blocked it reads
nothing, so the ingress port's kernel socket buffer (sized large) and, behind it, the sending
host's qdisc and socket send buffer absorb the burst: the pause propagates to the sender exactly
as far as Linux allows (docs/switch-target.md, "Lossless queues"). If the pause times out the
frame is admitted into ``headroom`` (counted as ``headroom_admits``). The bound is a *budget per
congestion episode* (from the queue first filling until it is empty again, like a PFC
watchdog): once the pauses of an episode add up to ``pause_timeout_s``, the queue gives up
pausing until it has drained empty — frames that find it full meanwhile are admitted into
headroom without waiting and dropped as ``lossless_overflow`` once headroom is exhausted too.
So a burst whose pauses fit the bound loses nothing, and sustained overload drops (counted)
instead of holding the producers to the slow port's rate: no producer is held longer than the
bound per episode. Nothing is dropped silently: every drop has a reason counter.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["QueueConfig", "QueueStats", "EgressQueue", "DROP_REASONS"]

log = logging.getLogger(__name__)

DROP_REASONS = ("tail_drop", "emulated_loss", "tx_error", "lossless_overflow", "closed")


@dataclass(frozen=True)
class QueueConfig:
    """Knobs of one egress queue.

    ``rate_bps`` in bits per second (None: line rate, i.e. as fast as the port takes frames);
    ``burst_bytes`` the token bucket depth; ``delay_s`` a constant one-way delay added to every
    frame; ``loss`` the probability in [0, 1) that a frame is dropped at transmit (seeded by
    ``seed``); ``capacity`` queue depth in packets; ``lossless`` never tail-drop (see module doc);
    ``xon`` the depth at which a paused lossless queue resumes (default capacity // 2);
    ``pause_timeout_s`` how long a producer blocks at most per frame; ``headroom`` extra packets
    a lossless queue admits after a timed-out pause; ``inline_tx``: a frame that finds the
    queue idle and unshaped (no rate, delay or loss) is transmitted on the producer's thread,
    saving a thread handoff per packet (a port whose send blocks then slows its producer; set
    False to always hand frames to the transmit thread).
    """

    capacity: int = 1024
    rate_bps: float | None = None
    burst_bytes: int = 16 * 1024
    delay_s: float = 0.0
    loss: float = 0.0
    seed: int | None = None
    lossless: bool = False
    xon: int | None = None
    pause_timeout_s: float = 1.0
    headroom: int = 4096
    inline_tx: bool = True

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"queue capacity must be >= 1, got {self.capacity}")
        if self.rate_bps is not None and self.rate_bps <= 0:
            raise ValueError(f"rate must be > 0 bit/s, got {self.rate_bps}")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), got {self.loss}")
        if self.delay_s < 0:
            raise ValueError(f"delay must be >= 0 s, got {self.delay_s}")
        if self.pause_timeout_s <= 0:
            raise ValueError(f"pause timeout must be > 0 s, got {self.pause_timeout_s}")
        if self.xon is not None and not 0 <= self.xon < self.capacity:
            raise ValueError(f"xon must be in [0, capacity), got {self.xon}")


@dataclass
class QueueStats:
    """Counters of one queue (a snapshot when returned by :meth:`EgressQueue.stats`)."""

    enqueued: int = 0
    transmitted: int = 0
    tx_bytes: int = 0
    drops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    max_depth: int = 0
    pause_events: int = 0
    paused_s: float = 0.0
    headroom_admits: int = 0
    max_pause_s: float = 0.0  #: the longest a producer was held by one pause

    def copy(self) -> QueueStats:
        return QueueStats(
            self.enqueued,
            self.transmitted,
            self.tx_bytes,
            dict(self.drops),
            self.max_depth,
            self.pause_events,
            self.paused_s,
            self.headroom_admits,
            self.max_pause_s,
        )


class EgressQueue:
    """One port's egress FIFO with its transmit thread (started by the constructor)."""

    def __init__(
        self,
        port: int,
        transmit: Callable[[bytes], None],
        config: QueueConfig | None = None,
        *,
        on_pause: Callable[[int, bool], None] | None = None,
        transmit_many: Callable[[Sequence[bytes]], tuple[int, int]] | None = None,
    ) -> None:
        self.port = port
        self.config = config or QueueConfig()
        self._transmit = transmit
        # optional: send several frames in order, return (frames sent, bytes sent)
        self._transmit_many = transmit_many
        self._on_pause = on_pause
        self._q: collections.deque[tuple[float, bytes]] = collections.deque()
        self._lock = threading.RLock()  # the condition's lock, taken directly on the fast path
        self._cv = threading.Condition(self._lock)
        self._stats = QueueStats()
        self._rng = random.Random(self.config.seed)
        self._closed = False
        self._paused = False
        self._gave_up = False  # the episode's pause budget is spent: no pausing until empty
        self._episode_paused = 0.0  # seconds paused in this congestion episode
        self._busy = False
        self._drainers = 0  # threads in drain(): they wait for _busy to clear
        self._xon = self.config.xon if self.config.xon is not None else self.config.capacity // 2
        self._inline_ok = self._can_inline(self.config)
        self._tokens = float(self.config.burst_bytes)
        self._last_refill = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"egress-q{port}", daemon=True)
        self._thread.start()

    # ---- producer side -------------------------------------------------------------------
    def put(self, frame: bytes, on_block: Callable[[bool], None] | None = None) -> bool:
        """Enqueue ``frame``; True if queued. A lossless queue may block (module doc);
        ``on_block(True)`` is called (lock released) before this producer blocks and
        ``on_block(False)`` when it resumes — the switch emits PFC frames from it."""
        if on_block is not None and self._would_block():
            on_block(True)
            try:
                return self.put(frame)
            finally:
                on_block(False)
        if self._put_inline((frame,)):
            return True
        return self._put_queued(frame)

    def put_many(self, frames: Sequence[bytes]) -> int:
        """Enqueue ``frames`` in order (no PFC callback); returns how many were queued."""
        if self._put_inline(frames):
            return len(frames)
        return sum(self.put(frame) for frame in frames)

    def _put_inline(self, frames: Sequence[bytes]) -> bool:
        """The fast path: an idle queue with no shaping transmits on the producer's thread,
        under the lock (FIFO holds: the queue is empty and the TX thread idle; other
        producers wait for these sends, as they would behind a busy link). False, having
        done nothing, when the queue is not in that state."""
        lock = self._lock
        lock.acquire()  # acquire/release: half the cost of ``with`` (hot path)
        try:
            if self._closed or not self._inline_ok or self._busy or self._q:
                return False
            st = self._stats
            st.enqueued += len(frames)
            if not st.max_depth:
                st.max_depth = 1
            if self._transmit_many is not None and len(frames) > 1:
                try:
                    sent, nbytes = self._transmit_many(frames)
                except Exception as e:  # counted and logged, never fatal
                    log.debug("transmit on port %d failed: %s", self.port, e)
                    sent = nbytes = 0
                if sent < len(frames):
                    st.drops["tx_error"] += len(frames) - sent
            else:
                transmit = self._transmit
                sent = nbytes = 0
                for frame in frames:
                    try:
                        transmit(frame)
                    except Exception as e:  # counted and logged, never fatal
                        log.debug("transmit on port %d failed: %s", self.port, e)
                        st.drops["tx_error"] += 1
                    else:
                        sent += 1
                        nbytes += len(frame)
            st.transmitted += sent
            st.tx_bytes += nbytes
            if self._drainers:
                self._cv.notify_all()
            return True
        finally:
            lock.release()

    def _put_queued(self, frame: bytes) -> bool:
        with self._cv:
            cfg = self.config
            if self._is_closed():
                self._stats.drops["closed"] += 1
                return False
            if len(self._q) >= cfg.capacity:
                if not cfg.lossless:
                    self._stats.drops["tail_drop"] += 1
                    return False
                if self._gave_up or not self._wait_for_room():
                    self._gave_up = True
                    if len(self._q) >= cfg.capacity + cfg.headroom:
                        self._stats.drops["lossless_overflow"] += 1
                        log.error(
                            "lossless queue %d overflowed its headroom: frame dropped", self.port
                        )
                        return False
                    self._stats.headroom_admits += 1
                if self._is_closed():
                    self._stats.drops["closed"] += 1
                    return False
            self._q.append((time.monotonic() + cfg.delay_s, frame))
            self._stats.enqueued += 1
            self._stats.max_depth = max(self._stats.max_depth, len(self._q))
            self._cv.notify_all()
            return True

    @staticmethod
    def _can_inline(cfg: QueueConfig) -> bool:
        return cfg.inline_tx and cfg.rate_bps is None and not cfg.delay_s and not cfg.loss

    def _would_block(self) -> bool:
        with self._cv:
            return (
                self.config.lossless and not self._gave_up and len(self._q) >= self.config.capacity
            )

    def _is_closed(self) -> bool:
        return self._closed  # a method, so mypy does not narrow it across waits

    def _wait_for_room(self) -> bool:
        """With the lock held and the queue full: pause until XON; False on timeout."""
        if not self._paused:
            self._paused = True
            self._stats.pause_events += 1
            self._notify_pause(True)
        start = time.monotonic()
        deadline = start + self.config.pause_timeout_s - self._episode_paused
        try:
            while self._paused and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True
        finally:
            held = time.monotonic() - start
            self._episode_paused += held
            self._stats.paused_s += held
            self._stats.max_pause_s = max(self._stats.max_pause_s, held)

    def _notify_pause(self, paused: bool) -> None:
        if self._on_pause is not None:
            try:
                self._on_pause(self.port, paused)
            except Exception:  # a hook must never break the data path
                log.exception("pause hook failed on port %d", self.port)

    # ---- consumer side -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                cfg = self.config
                while (not self._q or self._busy) and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                ready, frame = self._q[0]
                now = time.monotonic()
                if ready > now:
                    self._cv.wait(ready - now)
                    continue
                self._q.popleft()
                self._busy = True
                if self._paused and len(self._q) <= self._xon:
                    self._paused = False
                    self._notify_pause(False)
                if not self._q:  # the congestion episode is over
                    self._gave_up = False
                    self._episode_paused = 0.0
                self._cv.notify_all()
            if cfg.rate_bps is not None:
                self._pace(len(frame))
            self._transmit_one(frame)

    def _transmit_one(self, frame: bytes) -> None:
        """Loss knob, then the port; runs with ``_busy`` set and clears it."""
        loss = self.config.loss
        outcome = "ok"
        try:
            if loss and self._rng.random() < loss:
                outcome = "emulated_loss"
            else:
                try:
                    self._transmit(frame)
                except Exception as e:  # counted and logged, never fatal
                    log.debug("transmit on port %d failed: %s", self.port, e)
                    outcome = "tx_error"
        finally:
            with self._lock:
                st = self._stats
                if outcome == "ok":
                    st.transmitted += 1
                    st.tx_bytes += len(frame)
                else:
                    st.drops[outcome] += 1
                self._busy = False
                # wake the TX thread only if frames wait behind this one (or drain() waits):
                # a wake-up per packet of an idle TX thread costs a GIL handoff each
                if self._q or self._drainers:
                    self._cv.notify_all()

    def _pace(self, nbytes: int) -> None:
        rate = self.config.rate_bps
        assert rate is not None
        bps = rate / 8.0
        burst = max(float(self.config.burst_bytes), float(nbytes))
        while True:
            now = time.monotonic()
            self._tokens = min(burst, self._tokens + (now - self._last_refill) * bps)
            self._last_refill = now
            if self._tokens >= nbytes:
                self._tokens -= nbytes
                return
            time.sleep((nbytes - self._tokens) / bps)

    def reconfigure(self, config: QueueConfig) -> None:
        """Replace the queue's knobs at run time (e.g. the controller marking a shadow port
        lossless). Queued frames stay; paused producers re-check against the new settings."""
        with self._cv:
            if config.seed != self.config.seed:
                self._rng = random.Random(config.seed)
            self.config = config
            self._inline_ok = self._can_inline(config)
            self._xon = config.xon if config.xon is not None else config.capacity // 2
            if self._paused and (not config.lossless or len(self._q) <= self._xon):
                self._paused = False
                self._notify_pause(False)
            self._cv.notify_all()

    # ---- inspection and lifecycle --------------------------------------------------------
    @property
    def depth(self) -> int:
        with self._cv:
            return len(self._q)

    def depth_nowait(self) -> int:
        """:attr:`depth` without the queue's lock (a deque's length is read atomically): for
        the dataplane, which asks while holding its own lock."""
        return len(self._q)

    @property
    def paused(self) -> bool:
        with self._cv:
            return self._paused

    def stats(self) -> QueueStats:
        with self._cv:
            s = self._stats.copy()
        return s

    def drain(self, timeout: float = 5.0) -> bool:
        """Wait until every queued frame has been handed to the port; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self._drainers += 1
            try:
                while self._q or self._busy:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cv.wait(left)
            finally:
                self._drainers -= 1
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Stop the transmit thread; frames still queued are counted as ``closed`` drops."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._stats.drops["closed"] += len(self._q)
            self._q.clear()
            self._paused = False
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
