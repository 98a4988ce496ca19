"""The checkpoint stream heals itself (docs/trainer.md, "Self-healing"): the mirror sender never
blocks on receive, retransmit history survives a backed-up sender, shadows that lose their state are
re-seeded (from the trainers, or cloned from a replica) while training runs, stale job
instances are fenced out, and the trainers' view of health tells the truth.

Trainers run in this process (world size 1, no DDP) against real shadow nodes; the soak at the
end runs the documented example with ``tools/soak.py``, as a user does.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from shadowgrad import wire
from shadowgrad.config import parse_spec
from shadowgrad.errors import ShadowgradError
from shadowgrad.layout import Layout, from_module
from shadowgrad.shadow.node import ShadowNode
from shadowgrad.specs import loopback_spec
from shadowgrad.testing.cluster import shadow_cluster
from shadowgrad.testing.processes import run_soak
from shadowgrad.testing.specs import TOKEN
from shadowgrad.trainer_hooks._mirror import MirrorSender
from shadowgrad.trainer_hooks._plan import RankPlan
from tests.test_trainer_local import _assert_shadows_equal, _setup, _train


def _layout(shadows: int = 1) -> tuple[torch.nn.Module, Layout]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))
    params, buckets = from_module(model)
    return model, Layout.build(params, buckets, shadows, 1)


def _sink() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 2**20)
    s.settimeout(5.0)
    return s


def _sender(layout: Layout, sink: socket.socket, **kw: Any) -> tuple[MirrorSender, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(1.0)  # what the session once gave it: the sender must not wait on it
    snd = MirrorSender(
        RankPlan(layout, 0, 1),
        job=7,
        sock=sock,
        shadow_addrs=[sink.getsockname()],
        chunk_bytes=4096,
        **kw,
    )
    return snd, sock.getsockname()


@contextlib.contextmanager
def _mirror(
    **kw: Any,
) -> Iterator[tuple[torch.nn.Module, Layout, socket.socket, MirrorSender, Any]]:
    """(model, layout, sink, sender, sender's address): a mirror sender (``kw``: its options)
    of a one-shadow layout toward the ``sink`` socket; both closed at the end."""
    model, layout = _layout()
    sink = _sink()
    snd, addr = _sender(layout, sink, **kw)
    try:
        yield model, layout, sink, snd, addr
    finally:
        snd.close()
        sink.close()


def _grads(model: torch.nn.Module, it: int) -> dict[str, torch.Tensor]:
    return {n: torch.full_like(p, float(it)) for n, p in model.named_parameters()}


def _nack(layout: Layout, it: int, ranges: list[tuple[int, int, int]], seq: int) -> bytes:
    return wire.encode(
        wire.Kind.NACK,
        job=7,
        sender=0,
        iteration=it,
        seq=seq,
        layout=layout.digest64,
        payload=wire.NackRecord.of(ranges).body(),
    )


def _drain(sink: socket.socket, until: float) -> list[wire.Header]:
    out = []
    sink.settimeout(0.05)
    while time.monotonic() < until:
        try:
            data = sink.recv(wire.MAX_DATAGRAM)
        except TimeoutError:
            continue
        out.append(wire.peek_header(data))
    return out


def test_a_nack_storm_does_not_delay_the_next_iterations_data() -> None:
    """NACKs keep arriving (every shadow re-NACKs); the next iteration's data still leaves at
    once. With a socket timeout the drain loop waited 1 s per NACK burst (the receive waited
    the timeout, MSG_DONTWAIT or not)."""
    with _mirror() as (model, layout, sink, snd, addr):
        stop = threading.Event()

        def nack_storm() -> None:
            seq = 0
            while not stop.is_set():
                seq += 1
                sink.sendto(_nack(layout, 0, [(0, 0, 64)], seq), addr)  # from the shadow
                time.sleep(0.002)

        try:
            assert snd.capture(0, _grads(model, 0))
            assert snd.flush(5)
            t = threading.Thread(target=nack_storm, daemon=True)
            t.start()
            time.sleep(0.2)
            delays = []
            for it in range(1, 6):
                t0 = time.monotonic()
                assert snd.capture(it, _grads(model, it))
                assert snd.flush(5)
                delays.append(time.monotonic() - t0)
            stop.set()
            t.join(5)
            assert snd.counters.nacks > 20 and snd.counters.retx_chunks > 0
            # the old sender could not leave its receive loop while NACKs kept coming (it
            # waited 1 s for silence after each), so no iteration left during the storm at all;
            # now each leaves within milliseconds (the bound only separates "at once" from
            # "never")
            assert max(delays) < 1.0, delays
        finally:
            stop.set()


def test_a_retransmission_of_the_oldest_slot_does_not_drop_the_next_capture() -> None:
    """While a NACK for the oldest kept iteration is being answered (its slot busy on the sender
    thread), the next capture recycles the next slot beyond the history instead of dropping
    the iteration (seen in CI under load: the NACK-storm test's capture returned False)."""
    with _mirror(slots=4, history=2) as (model, _lo, _sk, snd, _):
        for it in range(4):
            assert snd.capture(it, _grads(model, it))
        assert snd.flush(5)
        with snd._lock:
            oldest = snd._history[0]
            assert oldest.iteration == 0
            oldest.busy = True  # as _on_nack marks it while it resends from it
        try:
            assert snd.capture(4, _grads(model, 4))
            assert snd.flush(5)
        finally:
            with snd._lock:
                oldest.busy = False
        assert snd.counters.dropped_iterations == 0
        with snd._lock:
            kept = sorted(s.iteration for s in snd._history)
        assert 0 in kept and 1 not in kept, kept  # the busy one kept, the next one recycled


def test_a_backed_up_sender_keeps_its_retransmit_history() -> None:
    """Captures that cannot be sent yet never take the slots a NACK needs: the iteration is
    dropped instead (reported once), and the NACK for an old iteration is still answered."""
    with _mirror(slots=6, history=3) as (model, layout, sink, snd, addr):
        for it in range(3):
            assert snd.capture(it, _grads(model, it))
        assert snd.flush(5)
        gate = threading.Event()
        real = snd._send_slot

        def blocked(slot: Any) -> None:
            gate.wait(10)
            real(slot)

        snd._send_slot = blocked  # type: ignore[method-assign]
        results = [snd.capture(it, _grads(model, it)) for it in range(3, 9)]
        assert results[:3] == [True] * 3 and results[3:] == [False] * 3, results
        assert snd.counters.dropped_iterations == 3 and snd.last_drop == 8
        gate.set()
        assert snd.flush(5)
        _drain(sink, time.monotonic() + 0.3)
        nb = layout.bucket_nbytes[0]
        sink.sendto(_nack(layout, 0, [(0, 0, nb)], 1), addr)  # answered to the NACK's sender
        got = [h for h in _drain(sink, time.monotonic() + 1.0) if h.kind == wire.Kind.DATA]
        assert got and all(h.iteration == 0 and h.flags & wire.Flag.RETX for h in got)
        assert snd.counters.nack_unavailable == 0


def test_a_nack_history_cannot_answer_asks_for_a_reseed_at_once() -> None:
    asked: list[tuple[Any, int]] = []
    rig = _mirror(slots=4, history=2, on_unavailable=lambda a, it: asked.append((a, it)))
    with rig as (model, layout, sink, snd, addr):
        for it in range(8):
            assert snd.capture(it, _grads(model, it))
            assert snd.flush(5)
        sink.sendto(_nack(layout, 1, [(0, 0, 64)], 1), addr)  # the shadow asks
        deadline = time.monotonic() + 5
        while not asked and time.monotonic() < deadline:
            time.sleep(0.01)
        assert asked == [(sink.getsockname(), 1)]
        assert snd.counters.nack_unavailable == 1


@contextlib.contextmanager
def _trained(doc: dict[str, Any], iterations: int) -> Iterator[tuple[Any, ...]]:
    """(cluster, model, optimizer, session): the shadows of ``doc`` and a world-size-1 trainer
    attached to them, started and ``iterations`` in, with every shadow having applied them."""
    spec = parse_spec(doc, env={})
    with shadow_cluster(spec) as cluster:
        model, opt, sg = _setup(spec)
        with sg:
            sg.restore_or_start()
            _train(model, sg, iterations)
            assert cluster.wait_applied(iterations - 1, timeout_s=30)
            yield cluster, model, opt, sg


def _train_until(
    model: Any, sg: Any, it: int, done: Any, timeout_s: float = 60.0, pause_s: float = 0.01
) -> int:
    """Train one iteration at a time (from ``it``) until ``done()``; the next iteration."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        _train(model, sg, 1, it)
        it += 1
        time.sleep(pause_s)
    assert done(), f"not done after {timeout_s}s of training (iteration {it})"
    return it


def _finish(cluster: Any, model: Any, opt: Any, sg: Any, it: int) -> int:
    """A few more iterations, then every shadow applied the last one, bit-exact."""
    _train(model, sg, 3, it)
    it += 3
    assert sg.flush(10)
    assert cluster.wait_applied(it - 1, timeout_s=60), cluster.status()
    _assert_shadows_equal(cluster, sg, model, opt)
    return it


def _restart(cluster: Any, k: int) -> None:
    """SIGKILL-like: the node is gone with its state; a new one binds the same addresses."""
    old = cluster.nodes[k]
    old.stop()
    node = ShadowNode(cluster.spec, k, token=TOKEN)
    node.start()
    cluster.nodes[k] = node


@pytest.mark.parametrize("replication", [1, 2])
def test_a_restarted_shadow_is_reseeded_while_training_runs(replication: int) -> None:
    """r = 1: the trainers see the shard unloaded and re-seed it (one staging copy on the
    training thread); r = 2: the restarted replica clones its peer. Either way I* advances
    again, the end state is bit-exact, and ``degraded`` turns back to False."""
    shadows = 2 if replication == 2 else 3
    doc = loopback_spec(
        world=1, shadows=shadows, replication=replication, gap_repair="20ms", heartbeat="50ms"
    )
    with _trained(doc, 10) as (cluster, model, opt, sg):
        _restart(cluster, 1)
        seen = {"degraded": False}

        def healed() -> bool:
            seen["degraded"] |= sg.degraded
            st = cluster.nodes[1].status(timeline=0)
            return bool(st["loaded"]) and st["last_applied"] >= 12 and sg.iteration > 30

        it = _finish(cluster, model, opt, sg, _train_until(model, sg, 10, healed))
        # r = 2: the shard always had a healthy replica, so it never was degraded; r = 1:
        # it had none until the re-seed (often too briefly to be sampled between steps:
        # the monitor's own record says it)
        if replication == 2:
            assert not seen["degraded"]
        else:
            assert sg.stats()["health"]["transitions"].get("unloaded", 0) >= 1
        deadline = time.monotonic() + 10
        while sg.degraded and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not sg.degraded, sg.stats()
        health = sg.stats()["health"]
        ev = cluster.nodes[1].ev
        if replication == 1:
            assert health["reseeds"] >= 1 and ev["seeded"] >= 1
            assert health["reseed_pauses_s"]
        else:
            assert ev["cloned"] == 1 and health["reseeds"] == 0
        for n in cluster.nodes:  # I* advanced again, everywhere
            assert n.wait_for(lambda s: s["istar"] == it - 1, 10), n.status(timeline=0)


def test_a_diverged_shard_without_replica_is_reseeded_from_the_trainers() -> None:
    doc = loopback_spec(world=1, shadows=3, gap_repair="20ms", heartbeat="50ms")
    with _trained(doc, 5) as (cluster, model, opt, sg):
        node = cluster.nodes[2]
        with node._lock:
            node._diverge(node._last_applied + 1, 0)
        it = _train_until(model, sg, 5, lambda: node.ev["seeded"] > 0, 30, 0.02)
        _finish(cluster, model, opt, sg, it)


def test_a_second_instance_fails_fast_and_changes_nothing() -> None:
    """Fencing: a rerun next to a live instance cannot bind the trainer address and stops
    before it touches a shadow; a newer generation refuses the old instance's data."""
    doc = loopback_spec(world=1, shadows=2)
    with _trained(doc, 5) as (cluster, model, _opt, sg):
        before = [(n.status(timeline=0)["generation"], n.ev["loads"]) for n in cluster.nodes]
        _m2, _o2, sg2 = _setup(cluster.spec)
        with pytest.raises(
            ShadowgradError,
            match=r"cannot bind its trainer address.*"
            rf"held by pid {os.getpid()}",
        ):
            sg2.restore_or_start()
        after = [(n.status(timeline=0)["generation"], n.ev["loads"]) for n in cluster.nodes]
        assert after == before
        assert before[0][0] == sg.generation > 0
        # a newer generation takes the shadows over: the old instance's data is refused
        node = cluster.nodes[0]
        with node._lock:
            node._generation += 1
            node._digest = wire.session_digest(sg.layout.digest64, node._generation)
        applied = node.status(timeline=0)["last_applied"]
        _train(model, sg, 3, 5)
        assert sg.flush(10)
        time.sleep(0.3)
        assert node.status(timeline=0)["last_applied"] == applied
        assert node.rx["wire.layout"] > 0
        deadline = time.monotonic() + 10
        while not sg.stats()["health"]["fenced"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sg.stats()["health"]["fenced"] and sg.degraded


def test_session_digest_is_the_layout_digest_for_generation_zero() -> None:
    assert wire.session_digest(0x1234, 0) == 0x1234
    a, b = wire.session_digest(0x1234, 1), wire.session_digest(0x1234, 2)
    assert len({a, b, 0x1234}) == 3 and 0 <= a < 2**64


# --------------------------------------------------------------------------- the soak


def _soak(tmp: Path, *args: str, refs: Path) -> list[dict[str, Any]]:
    """``tools/soak.py ARGS`` in ``tmp``, train_plain.py's references kept in ``refs``."""
    out = tmp / "soak.json"
    proc = run_soak(tmp, out, *args, timeout_s=1500, plain_dir=refs)
    reports: list[dict[str, Any]] = json.loads(out.read_text())
    assert proc.returncode == 0, json.dumps(reports)[:4000]
    return reports


def _check_job_kills(kills: list[dict[str, Any]]) -> None:
    """Whole-job SIGKILLs: the restore never goes back beyond what every shadow had applied at
    the kill; where the shadows kept up (lag <= 1) at most the iteration in flight is repeated
    (+1 for the log's granularity); a CPU-starved machine whose shadows lagged repeats what
    they had not applied yet."""
    print("lag at kill", [k["lag_at_kill"] for k in kills])
    print("repeated", [k["repeated"] for k in kills])
    assert not [k for k in kills if k["lost_held"]], kills
    caught_up = [k for k in kills if k["lag_at_kill"] is not None and k["lag_at_kill"] <= 1]
    assert all(k["repeated"] <= 2 for k in caught_up), caught_up


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_documented_example_soak(tmp_path: Path, plain_refs: Path) -> None:
    """The documented example (2 ranks, 3 ``shadowgrad shadow`` processes, torchrun) at full
    speed, as a user runs it: 1,500 iterations clean; a shadow SIGSTOPped for 3 s; a shadow
    SIGKILLed and restarted (r = 1, re-seeded by the trainers; r = 2 is in the controller
    soak below); torchrun SIGKILLed with its workers alive (paused while the rerun starts, so
    that it always meets them) and an immediate rerun (fenced); the
    whole job SIGKILLed three times and rerun 8 s later. Every run ends bit-identical to
    ``examples/train_plain.py`` with every shadow at the last iteration."""
    soak = partial(_soak, refs=plain_refs)
    clean = soak(tmp_path / "clean", "--steps", "1500")[0]
    assert clean["degraded_lines"] == 0
    stop = soak(
        tmp_path / "stop", "--steps", "1500", "--stop-shadow", "1", "--at", "4", "--settle", "3"
    )[0]
    # settled: the stopped shadow caught up and stopped NACKing (the soak then fails on more
    # than 5 % retransmitted chunks: a repair that never ends)
    assert "retx_after_settle" in stop, stop
    kill1 = soak(
        tmp_path / "kill1", "--steps", "1000", "--kill-shadow", "1", "--at", "4", "--for", "0.5"
    )[0]
    assert kill1["shadows"][1]["reseeds"] >= 1
    # r = 2 (the restarted shadow clones its replica): test_documented_example_with_the_
    # controller below, which also checks the controller's view of it
    fence = soak(tmp_path / "fence", "--steps", "2500", "--fence", "--at", "4")[0]
    assert fence["fault"]["rerun_rc"] != 0 and fence["fault"]["generation_unchanged"]
    # the job stays dead 8 s before each rerun (longer than a shard's NACK rounds last): a
    # partial iteration left by the kill must not be declared a divergence (seen in CI when the
    # rerun was slow to start), and the rerun's restore replaces it
    jobs = soak(tmp_path / "jobs", "--steps", "600", "--kill-job", "3", "--down", "8")[0]
    _check_job_kills(jobs["job_kills"])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_documented_example_with_the_controller(tmp_path: Path, plain_refs: Path) -> None:
    """The documented example with ``shadowgrad controller`` running (issue 12's trials):
    20 whole-job SIGKILLs at random points, each detected by the controller from the shadows'
    view of the trainers' silence, I* fixed, held and taken by the rerun from the controller,
    the holds released when the trainers run again; a worker SIGKILLed 3 times and restarted
    in place by ``torchrun --max-restarts``; a shadow SIGKILLed with r = 2 (failed, back,
    rejoined; no trainer failure). Every run ends bit-identical to ``examples/train_plain.py``
    and the normal end of training is no failure (``job_finished``)."""
    soak = partial(_soak, refs=plain_refs)
    many = soak(tmp_path / "many", "--steps", "2000", "--controller", "--kill-job", "20")[0]
    c = many["controller"]
    assert c["trainer_failed"] == c["recovered"] == 20 and c["job_finished"] == 1, c
    # SIGKILL -> the controller's event: failure_detect (2 s) + one heartbeat (250 ms) by
    # design; measured and reported (not a timing bound: the machine is shared)
    print("detect_s", sorted(c["detect_s"]))
    assert len(c["detect_s"]) == 20
    _check_job_kills(many["job_kills"])
    ranks = soak(tmp_path / "ranks", "--steps", "600", "--controller", "--kill-rank", "3")[0]
    assert len(ranks["rank_kills"]) == 3, ranks
    assert ranks["controller"]["recovered"] == 3
    assert all(k.get("repeated", 99) <= 2 for k in ranks["rank_kills"]), ranks["rank_kills"]
    shadow = soak(
        tmp_path / "shadow",
        # long enough for the restarted shadow to start (torch's import: seconds on a busy
        # machine), clone its replica and settle with the job still running (in CI 1,200
        # iterations ended before it had)
        "--steps",
        "4000",
        "--shadows",
        "4",
        "--replication",
        "2",
        "--kill-shadow",
        "1",
        "--at",
        "4",
        "--for",
        "3",
        "--settle",
        "3",
        "--controller",
    )[0]
    assert "retx_after_settle" in shadow, (
        "the restarted shadow never caught up",
        {k: shadow.get(k) for k in ("fault", "controller", "stuck", "failures")},
        shadow["shadows"][1],
    )
    assert shadow["shadows"][1]["reseeds"] >= 1
    c = shadow["controller"]
    assert c["trainer_failed"] == 0, c
    # the kill is the one failure while the job runs; on a loaded machine a shadow may also be
    # slower to start than timeouts.connect ("never answered ... since the controller
    # started", CI): a start-up failure, not this test's, and it must rejoin like the killed one
    startup = ("never answered", "not started")
    running = [f for f in c["shadow_failures"] if not str(f[1]).startswith(startup)]
    assert [k for k, _ in running] == [1], c["shadow_failures"]
    assert {k for k, _ in c["shadow_failures"]} <= set(c["rejoined_shadows"]), c


def test_a_parameter_without_gradient_is_skipped_as_torch_skips_it() -> None:
    """A branch used only on some iterations: its parameters have no gradient then, the
    optimizer skips them (no decay, no moment update, no step count), and so does the replay
    — no iteration is dropped and the shadows stay bit-exact."""

    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = torch.nn.Linear(16, 32)
            self.extra = torch.nn.Linear(32, 32)
            self.head = torch.nn.Linear(32, 3)
            self.use_extra = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.trunk(x))
            if self.use_extra:
                h = torch.relu(self.extra(h))
            return self.head(h)  # type: ignore[no-any-return]

    from shadowgrad.trainer_hooks import attach

    doc = loopback_spec(world=1, shadows=2, gap_repair="20ms")
    spec = parse_spec(doc, env={})
    with shadow_cluster(spec) as cluster:
        torch.manual_seed(3)
        model = Branchy()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        with attach(model, opt, spec, max_grad_norm=0.5, token=TOKEN) as sg:
            sg.restore_or_start()
            for it in range(12):
                model.use_extra = it % 3 != 1
                g = torch.Generator().manual_seed(it)
                x, y = torch.randn(32, 16, generator=g), torch.randint(0, 3, (32,), generator=g)
                sg.backward(torch.nn.functional.cross_entropy(model(x), y))
                info = sg.step()
                assert info.sent
            assert sg.flush(10)
            assert cluster.wait_applied(11, timeout_s=60), cluster.status()
            _assert_shadows_equal(cluster, sg, model, opt)
            assert sg.stats()["mirror"]["dropped_iterations"] == 0 and not sg.degraded
            # the unused parameters' step counts lag: they were skipped 4 times of 12
            assert float(opt.state[model.extra.weight]["step"]) == 8.0


def test_a_stuck_shard_is_reseeded() -> None:
    """Every shadow answers and none reports a problem, yet one has stopped applying (here: a
    wedge until its next load) while training goes on: the trainers see it stalled after
    ``timeouts.failure_detect`` and re-seed it, and the stream converges bit-exact."""
    doc = loopback_spec(world=1, shadows=3, gap_repair="20ms", heartbeat="50ms")
    doc["timeouts"]["failure_detect"] = "1s"
    spec = parse_spec(doc, env={})
    with shadow_cluster(spec) as cluster:
        node = cluster.nodes[1]
        orig = node._applier.can_apply

        def wedged(i: int) -> bool:
            return False if node.ev["seeded"] == 0 and i >= 6 else orig(i)

        node._applier.can_apply = wedged  # type: ignore[method-assign]
        model, opt, sg = _setup(spec)
        with sg:
            sg.restore_or_start()
            it = _train_until(model, sg, 0, lambda: node.ev["seeded"] > 0, 60, 0.02)
            _finish(cluster, model, opt, sg, it)
