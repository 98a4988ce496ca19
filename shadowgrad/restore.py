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

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shadowgrad.errors import ShadowgradError
from shadowgrad.layout import shadows_of_shard
from shadowgrad.replies import ShadowStatus, StatusLike, shadow_status, shadow_statuses

__all__ = ["RestorePoint", "NoRestorePointError", "restore_point", "settle", "usable_iteration"]


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


def usable_iteration(status: StatusLike) -> int | None:
    """The newest iteration a loaded shadow can serve (``None``: it holds no state)."""
    st = shadow_status(status)
    if not st.loaded or st.last_applied is None:
        return None
    if st.diverged_at is not None:
        return min(st.last_applied, st.diverged_at - 1)
    return st.last_applied


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
    gens = tuple(sorted({s.generation for s in loaded.values()}))
    return RestorePoint(
        istar=min(u for u, _ in best),
        source=tuple(k for _, k in best),
        usable=tuple(u for u, _ in best),
        reachable=reachable,
        digest=digest,
        generations=gens,
    )


def settle(
    poll: Callable[[], Mapping[int, StatusLike | None]],
    statuses: Mapping[int, StatusLike | None],
    *,
    interval_s: float,
    timeout_s: float,
) -> dict[int, ShadowStatus | None]:
    """Let the shadows finish what they can still apply before I* is fixed: the data of the
    iterations every rank completed may still be in flight or in repair. Polls (``poll()``)
    until no shadow's ``last_applied`` moved for three polls, at most ``timeout_s``; returns the
    last statuses."""

    def applied(s: ShadowStatus | None) -> int | None:
        return None if s is None else s.last_applied

    deadline = time.monotonic() + timeout_s
    quiet = 0
    last = shadow_statuses(statuses)
    while (
        quiet < 3
        and time.monotonic() < deadline
        and any(s is not None and s.loaded for s in last.values())
    ):
        time.sleep(interval_s)
        now = shadow_statuses(poll())
        moved = any(applied(now.get(k)) != applied(last.get(k)) for k in now)
        quiet = 0 if moved else quiet + 1
        last = now
    return last
