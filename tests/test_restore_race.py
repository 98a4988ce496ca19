"""The restore point is a fact (issue 21): it is published only once every source shadow holds
it. The apply/hold race is driven deterministically against real shadow nodes: the restore
point is computed from statuses polled *before* the shadows applied two more iterations (so the
cut moved on and the shadows dropped the state the stale poll names); the holds fail, and the
core rule polls again, recomputes the cut and holds that. A point is never returned (or
published by the controller) held nowhere, and the settle waits for the shadows to apply what
they hold before I* is fixed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from shadowgrad.controller.service import Controller, ControllerOptions
from shadowgrad.errors import ShadowgradError
from shadowgrad.replies import ShadowStatus
from shadowgrad.restore import NoRestorePointError, fix_restore_point, settle
from shadowgrad.shadow.control import ShadowClient
from shadowgrad.testing.cluster import producer_cluster
from shadowgrad.testing.loaded import loaded_cluster
from shadowgrad.testing.specs import TOKEN
from shadowgrad.testing.training import Case, RefTrainer


def _statuses(c: Any) -> dict[int, Any]:
    return {n.id: n.status(timeline=0) for n in c.nodes}


def _stale_then_live(c: Any, stale: dict[int, Any]) -> Callable[[], Mapping[int, Any]]:
    """A poll that answers ``stale`` twice (the first poll and the settle's confirming one:
    the race is between the settle's last poll and the hold), then the real statuses."""
    calls = {"n": 0}

    def poll() -> Mapping[int, Any]:
        calls["n"] += 1
        return stale if calls["n"] <= 2 else _statuses(c)

    return poll


def _hold_on(c: Any) -> tuple[Callable[[int, int], None], Callable[[int, int], None], list[Any]]:
    log: list[Any] = []

    def hold(k: int, it: int) -> None:
        log.append(("hold", k, it))
        with ShadowClient(c.nodes[k].control_endpoint, TOKEN, timeout_s=5.0) as cl:
            cl.hold(it)

    def release(k: int, it: int) -> None:
        log.append(("release", k, it))
        with ShadowClient(c.nodes[k].control_endpoint, TOKEN, timeout_s=5.0) as cl:
            cl.release(it)

    return hold, release, log


def _moved_on_cluster(c: Any, trainer: RefTrainer) -> dict[int, Any]:
    """Every shard applies 0..5; the statuses then are kept (stale); then 6 and 7 are applied,
    so the cut moves to 7 and no shadow holds 5 any more."""
    c.load(trainer.named, trainer.optimizer_spec())
    c.send_all(trainer, range(6))
    c.expect_applied(5)
    c.expect_istar(5)
    stale = _statuses(c)
    c.send_all(trainer, range(6, 8))
    c.expect_applied(7)
    c.expect_istar(7)
    for n in c.nodes:
        assert 5 not in n.status(timeline=0)["available"], n.status(timeline=0)
    return stale


def test_a_hold_that_lost_the_race_is_recomputed_and_held_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    case = Case("race", "mlp", "adamw", iterations=8)
    trainer = RefTrainer(case, seed=21)
    layout = trainer.layout(num_shadows=3, replication=1)
    with producer_cluster(layout) as c:
        stale = _moved_on_cluster(c, trainer)
        hold, release, calls = _hold_on(c)
        with caplog.at_level(logging.WARNING, logger="shadowgrad.restore"):
            point, held = fix_restore_point(
                _stale_then_live(c, stale),
                hold,
                release,
                num_shards=layout.num_shards,
                replication=layout.replication,
                interval_s=0.02,
                timeout_s=1.0,
            )
        # the stale poll named 5; nobody holds it; the second attempt names 7 and holds it
        assert [x for x in calls if x[0] == "hold" and x[2] == 5]
        assert point.istar == 7 and sorted(held) == sorted(set(point.source)) == [0, 1, 2]
        for k in held:
            assert 7 in c.nodes[k].status(timeline=0)["holds"]
        assert any("restore.hold_retry" in r.getMessage() for r in caplog.records)
        for k in held:
            release(k, 7)


def test_no_point_is_returned_held_nowhere() -> None:
    case = Case("race-never", "mlp", "adamw", iterations=4)
    trainer = RefTrainer(case, seed=22)
    layout = trainer.layout(num_shadows=2, replication=1)
    with loaded_cluster(trainer, layout) as c:
        c.send_all(trainer, range(3))
        c.expect_applied(2)

        def refuse(k: int, it: int) -> None:
            raise ShadowgradError(f"shadow {k} refuses {it}")

        with pytest.raises(NoRestorePointError, match="cannot hold a restore point"):
            fix_restore_point(
                lambda: _statuses(c),
                refuse,
                lambda k, it: None,
                num_shards=layout.num_shards,
                replication=layout.replication,
                interval_s=0.01,
                timeout_s=0.5,
                attempts=3,
            )


def test_the_controller_recomputes_a_stale_cut_and_publishes_only_what_is_held() -> None:
    case = Case("race-ctl", "mlp", "adamw", iterations=8)
    trainer = RefTrainer(case, seed=23)
    layout = trainer.layout(num_shadows=3, replication=1)
    with producer_cluster(layout) as c:
        stale = _moved_on_cluster(c, trainer)
        eps = {n.id: n.control_endpoint for n in c.nodes}
        poll = _stale_then_live(c, stale)
        ctl = Controller(
            c.spec,
            token=TOKEN,
            endpoints=eps,
            options=ControllerOptions(poll_s=0.05),
            statuses=poll,
        )
        try:
            # a restart request the controller had not detected: the request is the evidence;
            # its first poll is the stale one
            doc = ctl.restore_point("rank 0")
            assert doc["istar"] == 7 and sorted(doc["held"]) == [0, 1, 2], doc
            assert ctl.ev["trainer_failures"] == 1
            # the trainers could not fetch it (say): asking again with failed=7 fixes it anew
            again = ctl.restore_point("rank 0", failed=7)
            assert again["istar"] == 7 and sorted(again["held"]) == [0, 1, 2]
            for n in c.nodes:
                assert n.status(timeline=0)["holds"] == [7]
        finally:
            ctl.close()


def _st(shadow: int, shard: int, applied: int, ready: int) -> dict[str, Any]:
    return {
        "ok": True,
        "shadow": shadow,
        "loaded": True,
        "shard": shard,
        "replica": 0,
        "layout": "L",
        "owned_bytes": 1,
        "last_ready": ready,
        "last_applied": applied,
        "istar": None,
        "newest_seen": ready,
        "lag": ready - applied,
        "diverged_at": None,
        "trainers_silent_s": 9.0,
        "ranks": {},
        "generation": 1,
        "window": 8,
        "buffered": ready - applied,
        "holds": [],
        "available": [applied],
        "counters": {},
        "events": {},
        "peers": {},
    }


def test_settle_waits_until_the_shadows_applied_what_they_hold() -> None:
    """Shadows lagging 30 iterations behind what they hold complete, applying 3 per poll: the
    settle ends when both shards applied 40 (not after a fixed number of quiet polls), and at
    once when nothing is left to apply."""
    state = {"a0": 10, "a1": 12}

    def poll() -> dict[int, Any]:
        state["a0"] = min(40, state["a0"] + 3)
        state["a1"] = min(40, state["a1"] + 3)
        return {0: _st(0, 0, state["a0"], 40), 1: _st(1, 1, state["a1"], 40)}

    out = settle(poll, {0: _st(0, 0, 10, 40), 1: _st(1, 1, 12, 40)}, interval_s=0.0, timeout_s=5)
    got = {k: s.last_applied for k, s in out.items() if isinstance(s, ShadowStatus)}
    assert got == {0: 40, 1: 40}
    polls = {"n": 0}

    def idle() -> dict[int, Any]:
        polls["n"] += 1
        return {0: _st(0, 0, 40, 40), 1: _st(1, 1, 40, 40)}

    settle(idle, idle(), interval_s=0.0, timeout_s=5)
    assert polls["n"] <= 3  # the first, and one confirming poll
