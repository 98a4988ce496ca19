"""The shadow's control service (token, status, hold/release, fetch, load, snapshot), on-disk
snapshots, and the ``shadowgrad shadow`` command."""

from __future__ import annotations

import base64
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import zmq

from shadowgrad.errors import ShadowgradTimeout
from shadowgrad.freeports import free_port
from shadowgrad.optspec import state_by_name
from shadowgrad.shadow.control import (
    ControlError,
    ShadowClient,
    commit_to_json,
    decode_states,
    encode_states,
)
from shadowgrad.shadow.snapshot import SnapshotError, list_snapshots, read_snapshot
from shadowgrad.testing.cluster import producer_cluster
from shadowgrad.testing.loaded import loaded_cluster, run_applied, trainer_state
from shadowgrad.testing.specs import TOKEN
from shadowgrad.testing.training import (
    Case,
    RefTrainer,
    bucket_bytes,
    compare_shard,
    initial_states,
)


def test_token_status_hold_release_fetch() -> None:
    trainer = RefTrainer(Case("ctl", "mlp", "adamw", iterations=10), seed=1)
    layout = trainer.layout(num_shadows=2)
    with producer_cluster(layout) as c:
        ep = c.nodes[0].control_endpoint
        # nothing works before load, and says so
        with pytest.raises(ControlError) as ei:
            c.clients[0].fetch()
        assert ei.value.code == "not_loaded"
        with ShadowClient(ep, "wrong-token", timeout_s=2) as bad:
            for op in ("status", "fetch", "load", "hold"):
                with pytest.raises(ControlError) as ei:
                    bad.call(op)
                assert ei.value.code == "bad_token"
        assert c.nodes[0].ev["control_bad_token"] == 4
        with pytest.raises(ControlError) as ei:
            c.clients[0].call("reboot")
        assert ei.value.code == "bad_request"

        c.load(trainer.named, trainer.optimizer_spec())
        run_applied(c, trainer, layout, range(3))
        c.expect_istar(2)
        at2 = trainer_state(trainer)
        st = c.clients[0].status(timeline=8)
        # the server built it with the schema: the header is exactly the schema's JSON
        assert type(st).from_json(st.raw).to_json() == dict(st.raw)
        assert st.last_applied == 2 and st.last_ready == 2 and st.istar == 2
        assert st.lag == 0 and st.counters["data"] > 0 and st.counters["commit"] == 3
        assert [t["iteration"] for t in st.timeline] == [0, 1, 2]
        assert st.peers[1].last_applied == 2
        # hold(2) keeps the state of 2 available while replay continues
        for cl in c.clients:
            assert cl.hold(2).holds == (2,)
        with pytest.raises(ControlError) as ei:
            c.clients[0].hold(0)
        assert ei.value.code == "unavailable"
        run_applied(c, trainer, layout, range(3, 6))
        for shard, cl in enumerate(c.clients):
            res = cl.fetch(2)
            assert res.iteration == 2
            assert not compare_shard(layout, shard, res.states, *at2)
            latest = cl.fetch(None, boxes=[0])
            assert latest.iteration == 5 and list(latest.states) == [0]
            cl.release(2)
            with pytest.raises(ControlError) as ei:
                cl.fetch(2)
            assert ei.value.code == "unavailable"
        # a bad load is refused precisely and changes nothing
        with pytest.raises(ControlError) as ei:
            c.clients[0].load(-1, [], trainer.optimizer_spec().to_json(), layout.to_json())
        assert ei.value.code == "bad_request"
        assert c.clients[0].status().last_applied == 5


def test_a_keep_load_starts_a_session_from_the_shadows_own_state() -> None:
    """Issue 23: after a restore the shadows keep their own state of I* (live, or the held
    snapshot) as the new session's start: a ``load`` with ``keep`` and no state; a shadow that
    has not got the iteration refuses with ``unavailable`` and changes nothing."""
    trainer = RefTrainer(Case("keep", "mlp", "adamw", iterations=10), seed=3)
    layout = trainer.layout(num_shadows=2)
    opt = trainer.optimizer_spec().to_json()
    with loaded_cluster(trainer, layout) as c:
        run_applied(c, trainer, layout, range(3))
        at2 = trainer_state(trainer)
        for cl in c.clients:
            cl.hold(2)
        run_applied(c, trainer, layout, range(3, 5))  # live at 4, 2 a held snapshot
        for shard, (n, cl) in enumerate(zip(c.nodes, c.clients, strict=True)):
            with pytest.raises(ControlError) as ei:
                cl.load(1, None, opt, layout.to_json(), generation=7)
            assert ei.value.code == "unavailable"
            assert cl.status().last_applied == 4 and n.ev["loads_kept"] == 0
            reply = cl.load(2, None, opt, layout.to_json(), generation=7)
            assert reply.iteration == 2 and n.ev["loads_kept"] == 1
            st = cl.status()
            assert (st.last_applied, st.generation, st.holds) == (2, 7, ())
            assert not compare_shard(layout, shard, cl.fetch(2).states, *at2)
            # standing at 2 now: a second keep of 2 takes the live state itself
            cl.load(2, None, opt, layout.to_json(), generation=8)
            assert n.ev["loads_kept"] == 2 and cl.status().generation == 8
            assert not compare_shard(layout, shard, cl.fetch(2).states, *at2)


def test_a_reseed_older_than_what_the_shadow_applied_changes_nothing() -> None:
    """A re-seed captured at iteration 1 that arrives after the shadow applied 4 (it cloned its
    replica, or caught up, while the state travelled) is answered ``behind`` and changes
    nothing: installing it would take the shard back to 1, and at the end of training no later
    iteration would make the shadow ask for the last one again (it waited forever). A re-seed
    of the iteration it stands at, or of a newer generation, still installs."""
    trainer = RefTrainer(Case("behind", "mlp", "adamw", iterations=10), seed=4)
    layout = trainer.layout(num_shadows=2)
    opt = trainer.optimizer_spec().to_json()
    with loaded_cluster(trainer, layout) as c:
        run_applied(c, trainer, layout, range(2))
        at1 = [cl.fetch(1).states for cl in c.clients]
        run_applied(c, trainer, layout, range(2, 5))
        at4 = trainer_state(trainer)
        for shard, (n, cl) in enumerate(zip(c.nodes, c.clients, strict=True)):
            states = [at1[shard][k] for k in range(len(at1[shard]))]
            reply = cl.load(1, states, opt, layout.to_json(), reseed=True, source="rank 0")
            assert reply.behind and reply.iteration == 4, reply
            assert n.ev["seed_behind"] == 1 and n.ev["seeded"] == 0
            assert cl.status().last_applied == 4
            assert not compare_shard(layout, shard, cl.fetch(4).states, *at4)
        run_applied(c, trainer, layout, range(5, 7))  # the session goes on from its own state
        for shard, (n, cl) in enumerate(zip(c.nodes, c.clients, strict=True)):
            here = cl.fetch(6).states
            reply = cl.load(6, [here[k] for k in range(len(here))], opt, reseed=True)
            assert reply.behind is None and n.ev["seeded"] == 1
            # another generation: a new instance of the job, installed whatever it says
            reply = cl.load(
                1, [at1[shard][k] for k in range(len(at1[shard]))], opt, reseed=True, generation=9
            )
            assert reply.behind is None and cl.status().last_applied == 1


def test_stream_checksums_and_client_timeout() -> None:
    states = [(0, {"param": torch.arange(10.0), "step": torch.tensor(3.0)})]
    entries, frames = encode_states(states)
    out = decode_states(entries, [bytes(f) for f in frames])
    assert torch.equal(out[0]["param"], torch.arange(10.0))
    bad = [bytearray(f) for f in frames]
    bad[0][3] ^= 1
    with pytest.raises(ControlError) as ei:
        decode_states(entries, [bytes(b) for b in bad])
    assert ei.value.code == "checksum"
    with pytest.raises(ControlError):
        decode_states(entries, [bytes(f) for f in frames][:-1])
    # nobody listens: the client gives up on time
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    try:
        with ShadowClient(f"tcp://127.0.0.1:{port}", TOKEN, timeout_s=0.2) as cl:
            t0 = time.monotonic()
            with pytest.raises(ShadowgradTimeout):
                cl.status()
            assert time.monotonic() - t0 < 2.0
    finally:
        s.close(linger=0)
        ctx.term()


def test_background_snapshots_are_atomic_and_verified(tmp_path: Path) -> None:
    trainer = RefTrainer(Case("snap", "mlp", "sgd", iterations=10), seed=2)
    layout = trainer.layout(num_shadows=2)
    with loaded_cluster(trainer, layout, snapshot_every=2, snapshot_dir=str(tmp_path)) as c:
        run_applied(c, trainer, layout, range(5))
        assert c.wait(lambda n, _s: n.ev["snapshots"] >= 2, 10.0)
        for n in c.nodes:
            snaps = list_snapshots(tmp_path, n.id)
            assert [p.name for p in snaps] == ["iter000000000002", "iter000000000004"]
            manifest, states = read_snapshot(snaps[-1])
            assert manifest["iteration"] == 4 and manifest["layout_digest"] == layout.digest
            shard = manifest["shard"]
            opt_state = state_by_name(trainer.opt, trainer.model.named_parameters())
            assert not compare_shard(
                layout, shard, dict(enumerate(states)), trainer.named, opt_state
            )
            assert not list((tmp_path / f"shadow{n.id}").glob(".tmp-*"))
        # on demand
        info = c.clients[0].snapshot(wait=True)
        assert info.iteration == 4 and info.path is not None and Path(info.path).is_dir()
        # a corrupted snapshot is refused
        state_bin = list_snapshots(tmp_path, 0)[-1] / "state.bin"
        raw = bytearray(state_bin.read_bytes())
        raw[7] ^= 0x40
        state_bin.write_bytes(bytes(raw))
        with pytest.raises(SnapshotError):
            read_snapshot(state_bin.parent)


def test_cli_runs_a_shadow_until_sigterm(tmp_path: Path) -> None:
    trainer = RefTrainer(Case("cli", "mlp", "adamw", iterations=1), seed=0)
    layout = trainer.layout(num_shadows=1)
    data_port, trainer_port, control = (
        free_port(socket.SOCK_DGRAM),
        free_port(socket.SOCK_DGRAM),
        free_port(socket.SOCK_STREAM),
    )
    spec = tmp_path / "job.toml"
    spec.write_text(f"""
[job]
id = 77
name = "cli-test"
mode = "mirror"
[trainers]
world_size = 1
addresses = ["127.0.0.1:{trainer_port}"]
[shadows]
count = 1
addresses = ["127.0.0.1:{data_port}"]
control_port = {control}
[switch]
target = "none"
""")
    (tmp_path / "layout.json").write_text(layout.to_json())
    env = {**os.environ, "SHADOWGRAD_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shadowgrad.cli",
            "shadow",
            "--spec",
            str(spec),
            "--id",
            "0",
            "--layout",
            str(tmp_path / "layout.json"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        with ShadowClient(f"tcp://127.0.0.1:{control}", TOKEN, timeout_s=1.0) as cl:
            deadline = time.monotonic() + 30
            st = None
            while time.monotonic() < deadline and st is None:
                try:
                    st = cl.status()
                except ShadowgradTimeout:
                    assert proc.poll() is None, proc.communicate(timeout=5)[0]
            assert st is not None and st.loaded is False
            cl.load(
                -1,
                initial_states(layout, 0, trainer.named),
                trainer.optimizer_spec().to_json(),
                timeout_s=30,
            )
            st = cl.status()
            assert st.loaded is True and st.last_applied == -1
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0, out
        assert b"shadow.stop" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_state_at_istar_is_kept_while_another_shard_lags() -> None:
    """Invariant 2: a shard that applied i while another shard is still at i-1 can still
    produce its state at I* = i-1, and drops that copy once every shard has applied i."""
    trainer = RefTrainer(Case("cut", "mlp", "adamw", iterations=5), seed=5)
    layout = trainer.layout(num_shadows=2)
    with loaded_cluster(trainer, layout) as c:
        run_applied(c, trainer, layout, range(2))
        at1 = trainer_state(trainer)
        lagging = c.nodes[1]
        with lagging._state_lock:  # shard 1 cannot step: it stays at 1, ready for 2
            grads, commit = trainer.step(2)
            c.producer.send_iteration(2, bucket_bytes(layout, grads), commit)
            c.expect_applied(2, nodes=[0])
            assert c.wait(lambda _n, st: st["peers"]["0"]["last_applied"] == 2, 5.0, nodes=[1])
            st0 = c.clients[0].status()
            assert st0.last_applied == 2 and st0.istar == 1
            assert st0.available == (1, 2)
            res = c.clients[0].fetch(1)
            assert not compare_shard(layout, 0, res.states, *at1)
            # the retained cut keeps its COMMIT too
            assert res.commit is not None and res.commit["iteration"] == 1
            assert c.clients[0].fetch(2).commit == commit_to_json(2, commit)
            assert lagging.status(timeline=0)["last_applied"] == 1
            # the fetched copy (kept alive here, so its memory cannot be handed out again)
            lent_states = c.nodes[0]._snaps[1]
            lent_values = [t.clone() for st in lent_states for t in st.values()]
            lent = [t.data_ptr() for st in lent_states for t in st.values()]
        c.expect_applied(2)
        assert c.wait(lambda _n, st: st["istar"] == 2 and st["available"] == [2], 5.0)
        with pytest.raises(ControlError):
            c.clients[0].fetch(1)
        assert c.nodes[0].ev["cut_copies"] >= 1

        # a retained state that was fetched is never written again (its bytes may still be on
        # their way); one nobody was lent is the copy the next retention writes into
        def retained_while_lagging(it: int) -> list[int]:
            with lagging._state_lock:
                grads, commit = trainer.step(it)
                c.producer.send_iteration(it, bucket_bytes(layout, grads), commit)
                c.expect_applied(it, nodes=[0])
                with c.nodes[0]._lock:
                    ptrs = [t.data_ptr() for st in c.nodes[0]._snaps[it - 1] for t in st.values()]
            c.expect_applied(it)
            return ptrs

        at3 = retained_while_lagging(3)
        assert not set(at3) & set(lent)
        at4 = retained_while_lagging(4)
        assert at4 == at3  # the unlent copy of 2 became the copy of 3
        now = [t for st in lent_states for t in st.values()]
        assert all(torch.equal(a, b) for a, b in zip(lent_values, now, strict=True))
        assert c.wait(lambda _n, st: st["istar"] == 4, 5.0)
        assert not compare_shard(layout, 0, c.clients[0].fetch(4).states, *trainer_state(trainer))


def test_fetch_returns_the_commit_and_load_keeps_the_one_given() -> None:
    """``fetch`` carries COMMIT(i) of the fetched iteration (current, held after replay moved
    on); ``load`` keeps the COMMIT given with it (a second restore right after a restore still
    finds the user state); only the COMMITs of fetchable iterations are kept."""
    trainer = RefTrainer(
        Case("commit", "mlp", "adamw", scaler=True, skip_at=(1,), iterations=10), seed=3
    )
    layout = trainer.layout(num_shadows=2)
    sent: dict[int, dict[str, object]] = {}

    def run(its: range) -> None:
        for it in its:
            grads, commit = trainer.step(it)
            commit = dataclasses.replace(commit, user_state=f"user {it}".encode())
            sent[it] = commit_to_json(it, commit)
            c.producer.send_iteration(it, bucket_bytes(layout, grads), commit)
            c.expect_applied(it)

    with loaded_cluster(trainer, layout) as c:
        first = c.clients[0].fetch(None)
        assert first.iteration == -1 and first.commit is None  # a fresh start has none
        run(range(3))
        for cl in c.clients:
            res = cl.fetch(None)
            assert res.iteration == 2 and res.commit == sent[2]
        com = c.clients[0].fetch(2).commit
        assert com is not None
        assert base64.b64decode(com["user_state"]) == b"user 2"
        assert com["loss_scale"] is not None
        assert com["clip_coef"] is not None and not com["skipped"]
        assert sent[1]["skipped"] is True
        # a held iteration keeps its COMMIT while replay moves on
        for cl in c.clients:
            cl.hold(2)
        run(range(3, 5))
        for cl in c.clients:
            assert cl.fetch(2).commit == sent[2]
            assert cl.fetch(4).commit == sent[4]
            cl.release(2)
        assert all(sorted(n._commits) == [4] for n in c.nodes)  # bounded
        # load with a COMMIT (what a restored trainer does): kept, and fetched again
        got = [c.clients[k].fetch(4) for k in range(2)]
        given = {**sent[4], "user_state": base64.b64encode(b"restored").decode()}
        for k, cl in enumerate(c.clients):
            for bad in (
                {**given, "iteration": 3},
                {**given, "lrs": "x"},
                {**given, "user_state": "not base64!"},
            ):
                with pytest.raises(ControlError) as ei:
                    cl.load(
                        4,
                        [got[k].states[b] for b in range(len(got[k].states))],
                        trainer.optimizer_spec().to_json(),
                        commit=bad,
                    )
                assert ei.value.code == "bad_request"
            assert c.nodes[k]._bucket_senders  # a refused load changes nothing
        for k, cl in enumerate(c.clients):
            cl.load(
                4,
                [got[k].states[b] for b in range(len(got[k].states))],
                trainer.optimizer_spec().to_json(),
                commit=given,
            )
            assert not c.nodes[k]._bucket_senders  # the old job's senders are forgotten
        for cl in c.clients:
            res = cl.fetch(None)
            assert res.iteration == 4 and res.commit == given
        run(range(5, 6))
        for cl in c.clients:
            assert cl.fetch(None).commit == sent[5]
        assert all(sorted(n._commits) == [5] for n in c.nodes)
        assert not c.check(5, trainer)


def test_a_fetch_of_the_live_state_holds_the_next_step_until_its_reply_has_left() -> None:
    """The current iteration is served from the live tensors, not a copy (issue 23): the next
    step waits until the reply has left the node (its tracker), and past ``timeouts.rpc``
    goes ahead anyway and says so (the requester's checksums refuse what changed)."""
    trainer = RefTrainer(Case("live", "mlp", "adamw", iterations=4), seed=3)
    layout = trainer.layout(num_shadows=1)
    with loaded_cluster(trainer, layout) as c:
        node = c.nodes[0]
        run_applied(c, trainer, layout, range(2))
        res = c.clients[0].fetch(None)
        assert res.iteration == 1
        assert not compare_shard(layout, 0, res.states, *trainer_state(trainer))
        assert node.ev["cut_copies"] == 0  # no snapshot of 1 was made for it
        # a reply over the live state still in flight: the step of 2 waits for it
        serve = node._serve_live()
        grads, commit = trainer.step(2)
        c.producer.send_iteration(2, bucket_bytes(layout, grads), commit)
        time.sleep(0.5)
        assert node.status_reply().last_applied == 1
        serve.sent(None)  # gone (or never sent): the step goes ahead
        c.expect_applied(2)
        # one that never leaves: after timeouts.rpc the step goes ahead, counted
        t = dataclasses.replace(node.spec.timeouts, rpc_s=0.3)
        node.spec = dataclasses.replace(node.spec, timeouts=t)
        node._serve_live()
        grads, commit = trainer.step(3)
        c.producer.send_iteration(3, bucket_bytes(layout, grads), commit)
        c.expect_applied(3)
        assert node.ev["serve_overrun"] == 1
        assert not compare_shard(layout, 0, c.clients[0].fetch(3).states, *trainer_state(trainer))


def test_status_and_load_carry_the_shadows_clock_for_a_one_way_transfer_time() -> None:
    """``status`` carries the shadow's monotonic clock and a ``load`` reply the time the shadow
    took the request off its socket: the trainer relates the two clocks by its status polls
    (``PeerClock``) and times the re-seed's transfer one way (``trainer.reseed``'s send_ms),
    without the reply's way back. Here both ends share one clock, so the readings must fall
    inside the caller's own send and receive times."""
    from shadowgrad.trainer_hooks._health import PeerClock, _send_fields

    trainer = RefTrainer(Case("clock", "mlp", "adamw", iterations=4), seed=5)
    layout = trainer.layout(num_shadows=2)
    opt = trainer.optimizer_spec().to_json()
    with loaded_cluster(trainer, layout) as c:
        run_applied(c, trainer, layout, range(2))
        cl = c.clients[0]
        clock = PeerClock()
        for _ in range(3):
            a = time.monotonic()
            st = cl.status()
            b = time.monotonic()
            assert st.clock is not None and a <= st.clock <= b, (a, st.clock, b)
            clock.add(a, b, st.clock, st.incarnation)
        # one clock on both ends: the offset is zero within its error bound
        assert clock.offset is not None and abs(clock.offset) <= clock.err
        here = cl.fetch(1).states
        t0 = time.monotonic()
        reply = cl.load(1, [here[k] for k in range(len(here))], opt, reseed=True)
        t1 = time.monotonic()
        assert reply.received_at is not None and t0 <= reply.received_at <= t1
        arrived = clock.ours(reply.received_at)
        assert arrived is not None
        f = _send_fields(1000, t1 - t0, reply.install_ms / 1000, arrived - t0, clock.err)
        assert 0 <= f["send_ms"] + f["reply_ms"] + f["install_ms"] <= 1000 * (t1 - t0) + 0.2


def test_peer_clock_keeps_the_shortest_round_trip_and_starts_over_for_a_new_process() -> None:
    from shadowgrad.trainer_hooks._health import PeerClock, _send_fields

    pc = PeerClock(max_age_s=30.0)
    assert pc.ours(5.0) is None
    pc.add(10.0, 10.2, 110.1, "a")  # offset 100 +- 0.1
    pc.add(11.0, 11.02, 111.0, "a")  # offset 99.99 +- 0.01: better
    pc.add(12.0, 12.5, 113.0, "a")  # worse: kept the last
    assert pc.offset == pytest.approx(99.99) and pc.err == pytest.approx(0.01)
    assert pc.ours(200.0) == pytest.approx(100.01)
    pc.add(13.0, 13.5, 20.0, "b")  # another process (another host's clock): starts over
    assert pc.offset == pytest.approx(6.75) and pc.incarnation == "b"
    pc.add(50.0, 50.4, 56.95, "b")  # the kept sample is older than max_age_s: replaced
    assert pc.at == 50.4
    # one way: the transfer is until the shadow had the request, the rest is the way back
    f = _send_fields(250_000, 0.050, 0.010, 0.0025, 0.0001)
    assert (f["send_ms"], f["install_ms"], f["reply_ms"]) == (2.5, 10.0, 37.5)
    assert f["send_mb_s"] == 100.0 and f["clock_err_ms"] == 0.1
    # a shadow without a clock: round trip less install, as before
    f = _send_fields(250_000, 0.050, 0.010)
    assert f["send_ms"] == 40.0 and "reply_ms" not in f


def test_a_brief_status_carries_the_health_fields_and_leaves_the_rest_empty() -> None:
    """The trainers' health polls ask ``brief``: every field a health check reads is the full
    status's, the maps and lists are empty (cheaper to build, send and parse)."""
    trainer = RefTrainer(Case("brief", "mlp", "adamw", iterations=3), seed=7)
    layout = trainer.layout(num_shadows=2)
    with loaded_cluster(trainer, layout) as c:
        run_applied(c, trainer, layout, range(2))
        full = c.clients[0].status(timeline=4)
        brief = c.clients[0].status(timeline=4, brief=True)
        assert full.counters and full.peers and full.available and full.timeline
        same = {f.name for f in dataclasses.fields(full)} - {
            "ranks",
            "holds",
            "available",
            "counters",
            "events",
            "peers",
            "timeline",
            "pending",
            "last_snapshot",
            "clock",
            "trainers_silent_s",
            "raw",
        }
        assert {k: getattr(brief, k) for k in same} == {k: getattr(full, k) for k in same}
        assert brief.clock is not None and brief.clock >= full.clock
        assert (brief.ranks, brief.counters, brief.events, brief.peers) == ({}, {}, {}, {})
        assert (brief.holds, brief.available, brief.timeline, brief.pending) == ((), (), (), {})
        assert brief.last_applied == 1 and brief.loaded and brief.incarnation


def test_the_health_monitor_polls_another_ranks_healthy_shadows_every_few_rounds() -> None:
    """Each rank polls its own shadows (``k % world == rank``) and any shadow not healthy every
    round, another rank's healthy shadows every ``OTHERS_EVERY`` rounds: every rank still sees
    every shadow, and a shadow answers far fewer polls than one per rank per round."""
    from shadowgrad.layout import Layout, ParamSpec
    from shadowgrad.messages import ShadowStatus
    from shadowgrad.trainer_hooks._health import HealthMonitor

    layout = Layout.build([ParamSpec("w", (64,), "float32")], [["w"]], num_shadows=4)
    calls = {k: 0 for k in range(4)}
    down = {3}

    def status(k: int) -> ShadowStatus:
        calls[k] += 1
        if k in down:
            raise ShadowgradTimeout("down")
        return ShadowStatus(
            shadow=k, loaded=True, shard=k, replica=0, layout=None, owned_bytes=0,
            last_ready=0, last_applied=0, istar=0, newest_seen=0, lag=0, diverged_at=None,
            trainers_silent_s=0.0, ranks={}, generation=1, window=1, buffered=0, holds=(),
            available=(), counters={}, events={}, peers={},
        )  # fmt: skip

    mon = HealthMonitor(
        layout,
        rank=0,
        world=2,
        generation=1,
        status=status,
        load=lambda *_a: (None, None),
        interval_s=60.0,
        grace_s=60.0,
        reseed_timeout_s=60.0,
    )
    rounds = 4 * HealthMonitor.OTHERS_EVERY
    for _ in range(rounds):
        mon._poll()
    assert calls[0] == calls[2] == rounds  # this rank's own
    assert calls[1] == rounds // HealthMonitor.OTHERS_EVERY  # another rank's, healthy
    assert calls[3] == rounds  # another rank's, unreachable: every round
    assert mon.views[1].state == "healthy" and mon.views[3].state == "unreachable"
    down.clear()  # shadow 3 answers again: healthy, then polled like shadow 1
    mon._poll()
    assert mon.views[3].state == "healthy"
    before = dict(calls)
    for _ in range(HealthMonitor.OTHERS_EVERY):
        mon._poll()
    assert calls[3] - before[3] == calls[1] - before[1] == 1


def test_a_single_shard_keeps_no_spare_copy_after_a_hold() -> None:
    """A single-shard job retains a state only while it is held: once released, its copy is
    freed, not kept as a spare for retentions that never come."""
    trainer = RefTrainer(Case("spare1", "mlp", "adamw", iterations=4), seed=3)
    layout = trainer.layout(num_shadows=1)
    with loaded_cluster(trainer, layout) as c:
        run_applied(c, trainer, layout, range(2))
        node, cl = c.nodes[0], c.clients[0]
        cl.hold(1)
        run_applied(c, trainer, layout, range(2, 3))  # steps past the held 1: retains it
        assert node.ev["cut_copies"] == 1 and 1 in node._snaps
        cl.release(1)
        with node._lock:
            assert 1 not in node._snaps and node._snap_spare is None
