"""Loss, duplication, reordering, a withheld chunk, divergence and resync (invariants 2, 3)."""

from __future__ import annotations

import time

from shadowgrad.layout import Layout
from shadowgrad.shadow.node import NodeOptions
from shadowgrad.testing.cluster import producer_cluster
from shadowgrad.testing.loaded import loaded_cluster, trainer_state
from shadowgrad.testing.producer import Faults
from shadowgrad.testing.training import Case, RefTrainer, bucket_bytes, compare_shard

FAST_FAIL = NodeOptions(max_repair_rounds=3, repair_backoff=1.5, resync_interval_s=0.05)


def test_drop_dup_reorder_repaired_bit_exact_with_iterations_in_flight() -> None:
    case = Case("faults", "mlp", "adamw", scaler=True, skip_at=(7,), iterations=80)
    trainer = RefTrainer(case, seed=11)
    layout = trainer.layout(num_shadows=3)
    faults = Faults(drop=0.01, dup=0.01, reorder=0.01, seed=5)
    with loaded_cluster(trainer, layout, faults=faults, chunk_bytes=512) as c:
        for it, _ in c.send_steps(trainer, range(case.iterations)):
            if it >= 2:  # keep up to three iterations in flight
                c.expect_applied(it - 2)
        c.expect_applied(case.iterations - 1, timeout_s=30)
        bad = c.check(case.iterations - 1, trainer)
        assert not bad, bad[:4]
        sent = c.producer.stats.sent
        assert sent["dropped"] > 0 and sent["duplicated"] > 0 and sent["reordered"] > 0
        assert sent["retx"] > 0
        total: dict[str, int] = {}
        c.expect_istar(case.iterations - 1)
        for n in c.nodes:
            st = n.status(timeline=0)
            for k, v in st["counters"].items():
                total[k] = total.get(k, 0) + v
            assert st["diverged_at"] is None
            assert st["istar"] == case.iterations - 1
        assert total.get("duplicate", 0) > 0  # dropped and counted
        assert total.get("retx", 0) > 0 and sum(n.ev["nack_sent"] for n in c.nodes) > 0


def test_lost_commit_is_asked_for_and_a_producer_far_ahead_is_caught_up() -> None:
    """A COMMIT lost on its way to one shadow is requested with a zero-range NACK; a producer
    eight iterations ahead of a four-iteration window is rejected precisely (ahead_of_window)
    and repaired by NACK once the window moves."""
    case = Case("ahead", "mlp", "sgd", iterations=12)
    trainer = RefTrainer(case, seed=6)
    layout = trainer.layout(num_shadows=3)

    def drop_commit(it: int, sid: int, retx: bool) -> bool:
        # COMMIT(0) lost everywhere holds every shadow at -1 while the producer runs ahead
        return not retx and (it == 0 or (it == 1 and sid == 2))

    with loaded_cluster(
        trainer, layout, faults=Faults(drop_commit=drop_commit), options=NodeOptions(window=4)
    ) as c:
        steps = [trainer.step(it) for it in range(case.iterations)]
        for it, (grads, commit) in enumerate(steps):  # back to back, no waiting at all
            c.producer.send_iteration(it, bucket_bytes(layout, grads), commit)
        c.expect_applied(case.iterations - 1, timeout_s=30)
        assert not c.check(case.iterations - 1, trainer)
        assert c.producer.stats.sent["commit_dropped"] == 3 + 1
        assert c.producer.stats.sent["commit_retx"] >= 3 + 1
        assert c.nodes[2].rx["commit"] == case.iterations
        detail = [(n.id, n.rx["ahead_of_window"], n.ev["repaired_bytes"]) for n in c.nodes]
        assert all(a > 0 and r > 0 for _, a, r in detail), detail


def test_a_producer_far_ahead_is_buffered_within_the_memory_budget() -> None:
    """With the default window (a memory budget, not 4 iterations), a producer 60 iterations
    ahead of a shadow held back by a lost COMMIT is buffered: no datagram rejected, nothing
    retransmitted, and every shadow catches up bit-exact once COMMIT(0) is repaired (the test
    above covers a window too small: rejected precisely, repaired by NACK)."""

    def drop_commit(it: int, sid: int, retx: bool) -> bool:
        return not retx and it == 0

    for options in (None, NodeOptions(window_bytes=8 * 2**20)):
        case = Case("ahead", "mlp", "sgd", iterations=60)
        trainer = RefTrainer(case, seed=6)
        layout = trainer.layout(num_shadows=3)
        with producer_cluster(layout, faults=Faults(drop_commit=drop_commit), options=options) as c:
            c.producer.keep = case.iterations  # COMMIT(0) must still be there for the NACK
            c.load(trainer.named, trainer.optimizer_spec())
            steps = [trainer.step(it) for it in range(case.iterations)]
            for it, (grads, commit) in enumerate(steps):
                c.producer.send_iteration(it, bucket_bytes(layout, grads), commit)
            c.expect_applied(case.iterations - 1, timeout_s=60)
            assert not c.check(case.iterations - 1, trainer)
            for n in c.nodes:
                assert n.status(timeline=0)["window"] >= case.iterations
                assert n.rx["ahead_of_window"] == 0 and n.ev["repaired_bytes"] == 0
                assert n.rx["retx"] == 0


def _chunk_of_shard(layout: Layout, shard: int, chunk: int = 1408) -> tuple[int, int]:
    """(bucket, chunk offset) of a producer chunk carrying bytes of ``shard``."""
    targets = {
        (b, r.start - r.start % chunk)
        for b, routes in enumerate(layout.bucket_routes)
        for r in routes
        if r.shard == shard
    }
    return sorted(targets)[0]


def _withheld(layout: Layout, shard: int, hole: int, victim: int) -> Faults:
    """Faults that withhold one chunk of ``shard`` of iteration ``hole`` from shadow
    ``victim`` (every other copy of it is sent)."""
    bucket, off = _chunk_of_shard(layout, shard)

    def withhold(it: int, b: int, o: int, sid: int) -> bool:
        return it == hole and b == bucket and o == off and sid == victim

    return Faults(withhold=withhold)


def test_withheld_chunk_diverges_and_istar_stops_at_last_complete_iteration() -> None:
    case = Case("withhold", "mlp", "adamw", iterations=9)
    trainer = RefTrainer(case, seed=2)
    layout = trainer.layout(num_shadows=3)
    victim_shard = 1
    hole = 4
    faults = _withheld(layout, victim_shard, hole, victim_shard)
    with loaded_cluster(trainer, layout, faults=faults, options=FAST_FAIL) as c:
        at_cut = None
        for it, _ in c.send_steps(trainer, range(case.iterations)):
            if it == hole - 1:
                c.expect_applied(it)
                at_cut = trainer_state(trainer)
        assert at_cut is not None
        assert c.wait(lambda _n, st: st["diverged_at"] == hole, 10.0, nodes=[victim_shard])
        time.sleep(0.3)  # give every shard the chance to (wrongly) move on
        for n in c.nodes:
            st = n.status(timeline=0)
            assert st["last_applied"] == hole - 1, st
            assert st["istar"] == hole - 1
        assert c.nodes[victim_shard].ev["diverged"] == 1
        assert c.nodes[victim_shard].ev["nack_sent"] >= FAST_FAIL.max_repair_rounds
        # every shard still serves the consistent cut, bit-exact
        named, opt_state = at_cut
        for shard in range(layout.num_shards):
            res = c.clients[shard].fetch(hole - 1)
            assert not compare_shard(layout, shard, res.states, named, opt_state)
        # the diverged shard says so to its peers
        peer = c.nodes[0].status(timeline=0)["peers"][str(victim_shard)]
        assert peer["diverged"] is True


def test_no_divergence_while_the_trainers_are_silent_then_divergence_once_they_are_back() -> None:
    """A whole job killed mid-iteration leaves a partial iteration nobody can complete: the shard
    waits (NACKing slowly) instead of declaring DIVERGED while no trainer is heard from for
    failure_detect (1 s here); once a trainer speaks again and the NACK still goes unanswered,
    the shard diverges as before."""
    case = Case("silent", "mlp", "adamw", iterations=5)
    trainer = RefTrainer(case, seed=3)
    layout = trainer.layout(num_shadows=3)
    victim = 1
    hole = case.iterations - 1
    # 8 rounds at 40 ms x 1.5^k take ~2 s: longer than failure_detect, so silence decides
    slow = NodeOptions(max_repair_rounds=8, repair_backoff=1.5, resync_interval_s=0.05)
    with loaded_cluster(
        trainer, layout, faults=_withheld(layout, victim, hole, victim), options=slow
    ) as c:
        commit = c.send_all(trainer, range(case.iterations))
        assert commit is not None
        node = c.nodes[victim]
        # the job is "dead" from here: nothing is sent
        assert c.wait(lambda n, _st: n.ev["repair_trainers_silent"] == 1, 10.0, nodes=[victim])
        time.sleep(1.5)
        st = node.status(timeline=0)
        assert st["diverged_at"] is None and st["last_applied"] == hole - 1, st
        assert st["trainers_silent_s"] > 1.0
        assert node.ev["diverged"] == 0 and node.ev["nack_sent"] >= slow.max_repair_rounds
        # rank 0 is back (an idle rank 0 re-sends its last COMMIT as a heartbeat)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and node.status(timeline=0)["diverged_at"] is None:
            c.producer._send_commit(hole, commit, retx=True)
            c.producer.flush()
            time.sleep(0.1)
        assert node.status(timeline=0)["diverged_at"] == hole
        assert node.ev["diverged"] == 1
        for n in c.nodes:  # no shard applies past the consistent cut
            assert n.status(timeline=0)["last_applied"] == hole - 1


def test_trainers_silent_but_a_replica_applied_the_hole_resyncs_from_it() -> None:
    """The trainers are gone (training ended) while one replica still misses a chunk of the
    last iteration that its replica applied: silence says nothing about the data, but the
    replica's READY does. The shard diverges and resyncs from it instead of waiting for the
    trainers forever (seen in CI: a restarted shadow stuck 114 iterations behind)."""
    case = Case("silent-replica", "mlp", "adamw", iterations=5)
    trainer = RefTrainer(case, seed=5)
    layout = trainer.layout(num_shadows=4, replication=2)
    victim = 2 + 1  # shard 1, replica 1
    assert layout.shard_of_shadow(victim) == (1, 1)
    hole = case.iterations - 1
    slow = NodeOptions(max_repair_rounds=8, repair_backoff=1.5, resync_interval_s=0.05)
    with loaded_cluster(
        trainer, layout, faults=_withheld(layout, 1, hole, victim), options=slow
    ) as c:
        c.send_all(trainer, range(case.iterations))
        c.expect_applied(hole, nodes=[0, 1, 2])
        # nothing more is sent: the victim heals from shadow 1 although no trainer speaks
        c.expect_applied(hole, nodes=[victim], timeout_s=20)
        ev = c.nodes[victim].ev
        assert ev["diverged"] == 1 and ev["resynced"] >= 1, dict(ev)
        bad = c.check(hole, trainer)
        assert not bad, bad[:4]


def test_withheld_chunk_on_one_replica_resyncs_from_the_other_bit_exact() -> None:
    case = Case("resync", "transformer", "adamw", clip=1.0, iterations=24)
    trainer = RefTrainer(case, seed=4)
    layout = trainer.layout(num_shadows=4, replication=2)
    victim = 2 + 1  # shard 1, replica 1
    assert layout.shard_of_shadow(victim) == (1, 1)
    hole = 6
    with loaded_cluster(
        trainer, layout, faults=_withheld(layout, 1, hole, victim), options=FAST_FAIL
    ) as c:
        for it, _ in c.send_steps(trainer, range(case.iterations)):
            # the healthy shadows never wait for the diverged replica
            c.expect_applied(it, nodes=[0, 1, 2])
            if it == hole + 2:
                assert c.nodes[victim].ev["diverged"] == 1 or c.wait(
                    lambda n, _st: n.ev["diverged"] == 1, 5.0, nodes=[victim]
                )
        c.expect_applied(case.iterations - 1, nodes=[victim], timeout_s=20)
        ev = c.nodes[victim].ev
        assert ev["diverged"] == 1 and ev["resynced"] >= 1
        bad = c.check(case.iterations - 1, trainer)  # every replica of every shard
        assert not bad, bad[:4]
        c.expect_istar(case.iterations - 1)
        for n in c.nodes:
            assert n.status(timeline=0)["istar"] == case.iterations - 1
