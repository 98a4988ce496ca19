"""The restore-point rule: I* from the shadows' statuses (docs/shadow.md, "Consistent apply").

One implementation, used by the controller (``shadowgrad controller`` / ``shadowgrad restore``)
and, when no controller runs, by the trainers themselves (rank 0's survey before a restart).

For every shard the best source is the shadow with the highest *usable* iteration: its
``last_applied``, or the iteration before its hole when it is diverged (a diverged shadow still
vouches for its state up to there). I* is the minimum over the shards; a source whose usable
iteration is above I* still serves I*, because every shadow retains the state of the consistent
cut it applied past (invariant 2).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shadowgrad import events
from shadowgrad._log import event
from shadowgrad.errors import ShadowgradError
from shadowgrad.layout import shadows_of_shard
from shadowgrad.messages import ShadowStatus, StatusLike, shadow_status, shadow_statuses

__all__ = [
    "RestorePoint",
    "NoRestorePointError",
    "consistent_cut",
    "fix_restore_point",
    "restore_point",
    "settle",
    "usable",
    "usable_iteration",
]

log = logging.getLogger(__name__)


class NoRestorePointError(ShadowgradError):
    """The shadows cannot provide a complete state (a shard has no usable source)."""


@dataclass(frozen=True)
class RestorePoint:
    """``istar``: the iteration to restore (-1: the state as loaded, before iteration 0);
    ``source[shard]``: the shadow to fetch it from; ``usable[shard]``: that shadow's newest usable
    iteration; ``fresh``: no shadow holds state (start the job from scratch)."""

    istar: int
    source: tuple[int, ...] = ()
    usable: tuple[int, ...] = ()
    fresh: bool = False
    reachable: int = 0
    digest: str | None = None
    generations: tuple[int, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "istar": self.istar,
            "source": list(self.source),
            "usable": list(self.usable),
            "fresh": self.fresh,
            "reachable": self.reachable,
            "layout": self.digest,
        }


def usable(last_applied: int, diverged_at: int | None) -> int:
    """The newest iteration a shadow that applied ``last_applied`` can serve: that one, or the
    iteration before its hole when it is diverged at ``diverged_at``."""
    return last_applied if diverged_at is None else min(last_applied, diverged_at - 1)


def consistent_cut(per_shard: Iterable[Iterable[int]]) -> int | None:
    """The cut over the shards: per shard the best of its replicas' iterations, the minimum of
    those over the shards (``None``: a shard without any). With usable iterations this is I*;
    the shadows also take it over what they have ready (docs/shadow.md, two-phase rule)."""
    cut: int | None = None
    for its in per_shard:
        best = max(its, default=None)
        if best is None:
            return None
        cut = best if cut is None else min(cut, best)
    return cut


def usable_iteration(status: StatusLike) -> int | None:
    """The newest iteration a loaded shadow can serve (``None``: it holds no state)."""
    st = shadow_status(status)
    if not st.loaded or st.last_applied is None:
        return None
    return usable(st.last_applied, st.diverged_at)


def restore_point(
    statuses: Mapping[int, StatusLike | None],
    *,
    num_shards: int,
    replication: int,
    digest: str | None = None,
) -> RestorePoint:
    """I* and its sources from ``statuses[shadow]`` (a shadow's ``status`` reply, typed or as a
    dict, or ``None`` when it does not answer), for a job of ``num_shards`` shards held
    ``replication`` times. ``digest``: the layout the caller trains (None: whatever the shadows
    hold, as long as they agree). Raises :class:`NoRestorePointError` when some shard has
    shadows that answer without state, or none that answer, and ShadowgradError when a shadow
    holds another layout (another job's state)."""
    typed = shadow_statuses(statuses)
    reachable = sum(s is not None for s in typed.values())
    loaded = {k: s for k, s in typed.items() if s is not None and s.loaded}
    if not loaded:
        return RestorePoint(istar=-1, fresh=True, reachable=reachable)
    if digest is None:
        digest = str(next(iter(loaded.values())).layout)
    for k, s in loaded.items():
        if s.layout != digest:
            raise ShadowgradError(
                f"shadow {k} holds layout {str(s.layout)[:16]}, this job uses "
                f"{digest[:16]}: not this job's state (restart the shadows for a new job)"
            )
    best: list[tuple[int, int]] = []  # per shard: (usable, shadow)
    usables: list[list[int]] = []  # per shard: its sources' usable iterations
    for shard in range(num_shards):
        cands = []
        members = shadows_of_shard(shard, num_shards, replication)
        for k in members:
            u = usable_iteration(loaded[k]) if k in loaded else None
            if u is not None:
                cands.append((u, k))
        if not cands:
            answering = [k for k in members if typed.get(k) is not None]
            if answering:
                raise NoRestorePointError(
                    f"cannot restore: shard {shard}'s shadows {answering} answer but hold no "
                    "state (restarted, and the job stopped before it re-seeded them); the "
                    "checkpoint is incomplete: restart every shadow to start the job fresh"
                )
            raise NoRestorePointError(f"cannot restore: no shadow holding shard {shard} answers")
        best.append(max(cands))
        usables.append([u for u, _ in cands])
    gens = tuple(sorted({s.generation for s in loaded.values()}))
    istar = consistent_cut(usables)
    assert istar is not None  # every shard has a source (raised above otherwise)
    return RestorePoint(
        istar=istar,
        source=tuple(k for _, k in best),
        usable=tuple(u for u, _ in best),
        reachable=reachable,
        digest=digest,
        generations=gens,
    )


def _cuts(statuses: Mapping[int, ShadowStatus | None]) -> tuple[int, int] | None:
    """(applied cut, ready cut) of the loaded shadows that answer: per shard the best replica's
    usable iteration, resp. the newest iteration it has complete and verified (``last_ready``,
    the data it can still apply); the minimum over the shards (None: nobody holds state)."""
    applied: dict[int, int] = {}
    ready: dict[int, int] = {}
    for s in statuses.values():
        u = None if s is None else usable_iteration(s)
        if s is None or u is None or s.shard is None:
            continue
        r = max(u, s.last_ready if s.last_ready is not None else u)
        if s.diverged_at is not None:
            r = min(r, s.diverged_at - 1)
        applied[s.shard] = max(applied.get(s.shard, u), u)
        ready[s.shard] = max(ready.get(s.shard, r), r)
    if not applied:
        return None
    return min(applied.values()), min(ready.values())


def settle(
    poll: Callable[[], Mapping[int, StatusLike | None]],
    statuses: Mapping[int, StatusLike | None],
    *,
    interval_s: float,
    timeout_s: float,
    max_s: float | None = None,
) -> dict[int, ShadowStatus | None]:
    """Let the shadows apply what they already hold before I* is fixed: after a failure they
    may still be behind the trainers (a fast job, a slow shadow), and every iteration they hold
    complete is one the restarted job does not repeat.

    Ends on facts: as soon as the applied cut (what every shard has applied) has reached the
    ready cut (what every shard holds complete and verified) and either no shadow buffers any
    incomplete iteration (nothing more can become ready: no wait at all) or the ready cut did
    not move since the poll before. While the shadows make progress it waits (``timeout_s``
    after the last progress, at most ``max_s`` in all, default ``4 * timeout_s``); when
    nothing moves for three polls it ends too (what is missing is not coming). Polls with
    ``poll()`` every ``interval_s``; returns the last statuses."""

    def applied(s: ShadowStatus | None) -> tuple[int | None, int | None]:
        return (None, None) if s is None else (s.last_applied, s.last_ready)

    start = time.monotonic()
    hard = start + (4 * timeout_s if max_s is None else max_s)
    moved_at = start
    quiet = 0
    last = shadow_statuses(statuses)
    prev_ready: int | None = None
    while True:
        cuts = _cuts(last)
        if cuts is None:
            return last  # nobody holds state: nothing to wait for
        a, r = cuts
        idle = all(s is None or not s.loaded or s.buffered == 0 for s in last.values())
        if a >= r and (idle or prev_ready == r):
            return last
        now = time.monotonic()
        if quiet >= 3 or now >= hard or now - moved_at >= timeout_s:
            return last
        prev_ready = r
        time.sleep(interval_s)
        cur = shadow_statuses(poll())
        if any(applied(cur.get(k)) != applied(last.get(k)) for k in {*cur, *last}):
            quiet, moved_at = 0, time.monotonic()
        else:
            quiet += 1
        last = cur


#: ``hold(shadow, iteration)`` / ``release(shadow, iteration)``: raises when it cannot
_Hold = Callable[[int, int], object]


def fix_restore_point(
    poll: Callable[[], Mapping[int, StatusLike | None]],
    hold: _Hold,
    release: _Hold,
    *,
    num_shards: int,
    replication: int,
    digest: str | None = None,
    interval_s: float,
    timeout_s: float,
    attempts: int = 6,
    who: str = "restore",
    first: Mapping[int, StatusLike | None] | None = None,
) -> tuple[RestorePoint, list[int]]:
    """The restore point as a fact: settle (:func:`settle`), compute I* (:func:`restore_point`),
    and hold it on every source shadow (``hold(shadow, iteration)``, raising when the shadow
    cannot). A hold can fail because the shadow moved on between the poll and the hold (it
    applied past I* and the cut moved with it) or went away: then the holds placed are released
    (``release``), the shadows are polled again and the cut is recomputed and held again, at
    most ``attempts`` times, each retry a ``<who>.hold_retry`` event (``who``: ``controller``,
    ``trainer`` or ``restore``, :data:`shadowgrad.events.HOLD_EVENTS`). Returns the point and the
    shadows that hold it (every source: a point is never returned held nowhere); raises
    :class:`NoRestorePointError` when no attempt held. ``first``: statuses already polled."""
    hold_failed, hold_retry = events.HOLD_EVENTS[who]
    statuses = settle(
        poll,
        poll() if first is None else first,
        interval_s=interval_s,
        timeout_s=timeout_s,
    )
    errors: dict[int, str] = {}
    for attempt in range(1, attempts + 1):
        point = restore_point(
            statuses, num_shards=num_shards, replication=replication, digest=digest
        )
        if point.fresh:
            return point, []
        held: list[int] = []
        errors = {}
        for k in dict.fromkeys(point.source):
            try:
                hold(k, point.istar)
            except Exception as e:
                errors[k] = str(e)
                event(
                    log,
                    hold_failed,
                    level=logging.WARNING,
                    shadow=k,
                    iteration=point.istar,
                    attempt=attempt,
                    error=str(e),
                )
            else:
                held.append(k)
        if not errors:
            return point, held
        for k in held:
            with contextlib.suppress(Exception):
                release(k, point.istar)
        if attempt < attempts:
            event(
                log,
                hold_retry,
                level=logging.WARNING,
                iteration=point.istar,
                attempt=attempt,
                failed=sorted(errors),
                reason="a source shadow moved past I* or went away before the hold",
            )
            time.sleep(min(0.05 * attempt, 0.5))
            statuses = settle(poll, poll(), interval_s=interval_s, timeout_s=timeout_s)
    raise NoRestorePointError(
        f"cannot hold a restore point on its sources after {attempts} attempts "
        f"(last failures: {errors})"
    )
