"""The shadow node's lifecycle (shadow/_state.py): the transition table, and a real in-process
node driven unloaded -> live -> diverged -> resyncing -> live -> stopped, each move one
``shadow.state`` event."""

from __future__ import annotations

import gc
import itertools
import logging
import weakref
from collections.abc import Iterator

import pytest

from shadowgrad import events
from shadowgrad.errors import ShadowgradError
from shadowgrad.layout import Layout
from shadowgrad.shadow._state import TABLE, NodeState, StateError, Trigger, transition
from shadowgrad.shadow.node import NodeOptions, ShadowNode
from shadowgrad.testing.cluster import producer_cluster
from shadowgrad.testing.producer import Faults
from shadowgrad.testing.training import Case, RefTrainer

S, T = NodeState, Trigger

#: the lifecycle proper (the moves that change the state)
MAIN = {
    (S.UNLOADED, T.LOAD): S.LIVE,
    (S.UNLOADED, T.CLONE): S.CLONING,
    (S.CLONING, T.LOAD): S.LIVE,
    (S.CLONING, T.CLONE_FAILED): S.UNLOADED,
    (S.LIVE, T.DIVERGE): S.DIVERGED,
    (S.DIVERGED, T.RESYNC): S.RESYNCING,
    (S.DIVERGED, T.LOAD): S.LIVE,
    (S.RESYNCING, T.RESYNCED): S.LIVE,
    (S.RESYNCING, T.RESYNC_FAILED): S.DIVERGED,
    (S.RESYNCING, T.LOAD): S.LIVE,
}


def test_every_allowed_transition() -> None:
    for (state, trigger), new in TABLE.items():
        assert transition(state, trigger) is new
    for (state, trigger), new in MAIN.items():
        assert TABLE[state, trigger] is new
    for state in S:
        assert transition(state, T.STOP) is S.STOPPED


def test_every_other_transition_raises() -> None:
    impossible = [(s, t) for s in S for t in T if (s, t) not in TABLE]
    assert (S.UNLOADED, T.DIVERGE) in impossible and (S.STOPPED, T.LOAD) in impossible
    assert (S.LIVE, T.RESYNCED) not in impossible  # a load overtook a resync's fetch
    for state, trigger in impossible:
        with pytest.raises(StateError) as err:
            transition(state, trigger)
        assert isinstance(err.value, ShadowgradError)
        assert err.value.state is state and err.value.trigger is trigger
        assert repr(trigger.value) in str(err.value) and repr(state.value) in str(err.value)


def test_stopped_is_terminal_and_unloaded_only_the_start() -> None:
    assert {new for (s, _t), new in TABLE.items() if s is S.STOPPED} == {S.STOPPED}
    assert {s for (s, _t), new in TABLE.items() if new is S.UNLOADED} == {S.CLONING}


class _States(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.moves: list[tuple[int, str, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == events.SHADOW_STATE:
            f = record.fields  # type: ignore[attr-defined]
            self.moves.append((f["shadow"], f["old"], f["new"], f["reason"]))


@pytest.fixture
def states() -> Iterator[_States]:
    h = _States()
    logger = logging.getLogger("shadowgrad.shadow.node")
    level = logger.level
    logger.addHandler(h)
    logger.setLevel(logging.DEBUG)
    try:
        yield h
    finally:
        logger.removeHandler(h)
        logger.setLevel(level)


def _withheld(layout: Layout, shard: int, hole: int, victim: int) -> Faults:
    """Withhold one chunk of ``shard`` of iteration ``hole`` from shadow ``victim``."""
    chunk = 1408
    bucket, off = sorted(
        (b, r.start - r.start % chunk)
        for b, routes in enumerate(layout.bucket_routes)
        for r in routes
        if r.shard == shard
    )[0]
    return Faults(withhold=lambda it, b, o, sid: (it, b, o, sid) == (hole, bucket, off, victim))


def test_a_node_goes_unloaded_live_diverged_resyncing_live_stopped(states: _States) -> None:
    case = Case("lifecycle", "mlp", "adamw", iterations=8)
    trainer = RefTrainer(case, seed=5)
    layout = trainer.layout(num_shadows=4, replication=2)
    victim = 3  # shard 1, replica 1
    assert layout.shard_of_shadow(victim) == (1, 1)
    hole = 3
    fast = NodeOptions(max_repair_rounds=3, repair_backoff=1.5, resync_interval_s=0.05)
    with producer_cluster(layout, faults=_withheld(layout, 1, hole, victim), options=fast) as c:
        node = c.nodes[victim]
        assert node.state is S.UNLOADED
        c.load(trainer.named, trainer.optimizer_spec())
        assert node.state is S.LIVE
        c.send_all(trainer, range(case.iterations))
        c.expect_applied(case.iterations - 1, timeout_s=20)
        assert node.ev["diverged"] == 1 and node.ev["resynced"] >= 1, dict(node.ev)
        assert node.state is S.LIVE
        assert not c.check(case.iterations - 1, trainer)
    assert node.state is S.STOPPED
    mine = [(old, new, why) for sid, old, new, why in states.moves if sid == victim]
    changes = [m for m in mine if m[0] != m[1]]
    assert changes[:4] == [
        ("unloaded", "live", "load"),
        ("live", "diverged", "diverge"),
        ("diverged", "resyncing", "resync"),
        ("resyncing", "live", "resynced"),
    ], mine
    assert changes[-1] == ("live", "stopped", "stop"), mine
    # every move is in the table, and the moves chain
    for a, b in itertools.pairwise(mine):
        assert a[1] == b[0], mine
    for old, new, why in mine:
        assert TABLE[S(old), T(why)] is S(new)
    # the healthy nodes only loaded and stopped
    other = [(o, n, w) for sid, o, n, w in states.moves if sid == 0]
    assert other == [("unloaded", "live", "load"), ("live", "stopped", "stop")], other


def test_a_stopped_node_is_freed_with_its_last_reference() -> None:
    """A stopped node and its buffers go when the last reference to it does, not at the cyclic
    collector's next pass (which lands on whatever thread runs then: in one process, in the
    middle of the next node's optimizer step). ``status`` still answers after ``stop``."""
    case = Case("freed", "mlp", "adamw", iterations=3)
    trainer = RefTrainer(case, seed=7)
    layout = trainer.layout(num_shadows=2)

    def run() -> list[weakref.ref[ShadowNode]]:
        with producer_cluster(layout) as c:
            c.load(trainer.named, trainer.optimizer_spec())
            c.send_all(trainer, range(case.iterations))
            c.expect_applied(case.iterations - 1)
            nodes = list(c.nodes)
        for n in nodes:
            assert n.state is S.STOPPED
            assert n.status(timeline=0)["last_applied"] == case.iterations - 1
        return [weakref.ref(n) for n in nodes]

    run()  # a first node pays the process's one-time lazy imports (torch's hold frames a while)
    gc.collect()
    gc.disable()
    try:
        refs = run()
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()
