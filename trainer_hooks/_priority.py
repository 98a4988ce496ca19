"""The mirror sender thread's CPU priority: ``SCHED_IDLE`` while it keeps up, its own policy again
when it falls behind.

A rank's sender streams its slice of the reduced gradients while the training thread already runs
the next iteration. Where every core is busy with training, the sender's CPU time is wall time the
training loses. At ``SCHED_IDLE`` the kernel runs the sender only on cycles nothing else of normal
priority wants (the waits of the all-reduce, of the data loader, of other ranks): the bytes go out
in the gaps. The sender is put back to its own policy the moment it falls behind (a new capture
while it still sends the previous one), so a busy machine delays it by at most one iteration, as
before, and never starves it.

Coming back from ``SCHED_IDLE`` needs ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` that allows the
thread's nice value (``sched(7)``); where a probe thread cannot come back, the sender stays at its
own policy all the time (:func:`background_available` is False).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time

__all__ = ["ThreadPriority", "background_available"]

log = logging.getLogger(__name__)

#: the policies a thread may be lowered from and put back to (real-time ones are left alone)
_NORMAL = tuple(getattr(os, n) for n in ("SCHED_OTHER", "SCHED_BATCH") if hasattr(os, n))


@functools.cache
def background_available() -> bool:
    """Whether a thread of this process can lower itself to ``SCHED_IDLE`` *and come back*.

    Probed once per process on a throwaway thread (a thread that could not come back ends
    there)."""
    if not hasattr(os, "SCHED_IDLE") or not hasattr(os, "sched_setscheduler"):
        return False
    result: list[bool] = []

    def probe() -> None:
        try:
            policy = os.sched_getscheduler(0)
            if policy not in _NORMAL:
                return
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, policy, os.sched_param(0))
            result.append(True)
        except OSError as exc:
            log.info("mirror sender stays at normal priority: %s", exc)

    t = threading.Thread(target=probe, name="shadowgrad-priority-probe", daemon=True)
    t.start()
    t.join(5.0)
    return bool(result)


class ThreadPriority:
    """Lowers one thread to ``SCHED_IDLE`` and puts it back, from that thread or any other of
    the process. Not thread-safe by itself: the caller serialises (the sender's lock)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and background_available()
        self._tid: int | None = None
        self._policy = 0
        #: the thread is at SCHED_IDLE now, since this ``time.monotonic()``
        self.low = False
        self.since = 0.0
        #: times it was lowered; put back before it was done because it fell behind, or
        #: because it was in the background too long
        self.lowered = 0
        self.behind = 0
        self.overdue = 0

    def bind(self) -> None:
        """Called on the thread itself, before it is lowered for the first time."""
        if not self.enabled:
            return
        self._tid = threading.get_native_id()
        try:
            self._policy = os.sched_getscheduler(0)
        except OSError:
            self.enabled = False
            return
        if self._policy not in _NORMAL:
            self.enabled = False

    def lower(self) -> None:
        if not self.enabled or self.low or self._tid is None:
            return
        try:
            os.sched_setscheduler(self._tid, os.SCHED_IDLE, os.sched_param(0))
        except OSError as exc:
            self.enabled = False
            log.warning("mirror sender: cannot lower its priority, staying at normal: %s", exc)
            return
        self.low = True
        self.since = time.monotonic()
        self.lowered += 1

    def restore(self, *, behind: bool = False, overdue: bool = False) -> None:
        if not self.low or self._tid is None:
            return
        try:
            os.sched_setscheduler(self._tid, self._policy, os.sched_param(0))
        except ProcessLookupError:
            pass  # the thread ended
        except OSError as exc:
            # the probe came back, so this should not happen; never lower it again
            self.enabled = False
            log.warning("mirror sender: cannot restore its priority: %s", exc)
            return
        self.low = False
        self.behind += behind
        self.overdue += overdue
