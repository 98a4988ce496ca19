"""The job view (``shadowgrad.controller.view``) and ``shadowgrad status`` against real shadow
nodes: in-process ShadowNodes bound to the spec's own data and control addresses, fed by the
test producer (trainer rank 0 on the wire), polled over their control endpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shadowgrad.cli import main
from shadowgrad.config import JobSpec, parse_spec
from shadowgrad.controller import view as jobview
from shadowgrad.freeports import free_tcp_base
from shadowgrad.shadow.control import ControlError, ShadowClient
from shadowgrad.shadow.node import ShadowNode
from shadowgrad.testing.cluster import ShadowCluster
from shadowgrad.testing.producer import Producer
from shadowgrad.testing.specs import JOB_ID, TOKEN, bound_spec
from shadowgrad.testing.training import Case, RefTrainer, bucket_bytes, initial_states

RPC = 1.0  # timeouts.rpc of the test jobs: what one dead shadow may cost a poll


class Job:
    """``shadows`` real ShadowNodes (threads of this process) of a mirror-mode job whose one
    trainer is the test producer; the spec (token in a private file) is written to
    ``tmp/job.toml`` for the command line."""

    def __init__(self, tmp: Path, shadows: int, replication: int = 1) -> None:
        self.tmp = tmp
        self.trainer = RefTrainer(Case("status", "mlp", "sgd", clip=None), seed=3)
        self.layout = self.trainer.layout(num_shadows=shadows, replication=replication)
        self.producer = Producer(self.layout)
        socks = []
        for _ in range(shadows):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        self.doc: dict[str, Any] = bound_spec(
            [s.getsockname() for s in socks],
            [self.producer.address],
            replication,
            name="status-test",
            failure_detect="2s",
            rpc=f"{RPC:g}s",
        )
        self.spec_path = self.write_spec("job.toml", TOKEN)
        self.spec: JobSpec = parse_spec(
            json.loads(json.dumps(self.doc))
            | {"security": {"token_file": str(tmp / "job.toml.token")}},
            env={},
        )
        self.stopped: set[int] = set()
        self._beat_stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._last: tuple[int, Any] | None = None
        try:
            # the shadows at the spec's addresses and control ports, the producer sending to them
            self.cluster = ShadowCluster(
                self.spec, TOKEN, socks=socks, producer=self.producer, client_timeout_s=10.0
            )
        except BaseException:
            self.producer.close()
            raise
        self.nodes: list[ShadowNode] = self.cluster.nodes

    def write_spec(self, name: str, token: str) -> Path:
        tok = self.tmp / f"{name}.token"
        tok.write_text(token + "\n")
        tok.chmod(0o600)
        doc = {**self.doc, "security": {"token_file": str(tok)}}
        path = self.tmp / name
        path.write_text(parse_spec(doc, env={}).to_toml())
        return path

    def load(self, only: list[int] | None = None, generation: int | None = None) -> None:
        """Every shadow (``only`` these) loaded with the trainer's initial state (as
        ``generation``, where given)."""
        opt = self.trainer.optimizer_spec().to_json()
        for n in self.nodes:
            if only is not None and n.id not in only:
                continue
            shard, _ = self.layout.shard_of_shadow(n.id)
            with ShadowClient(n.control_endpoint, TOKEN, timeout_s=10.0) as c:
                c.load(
                    -1,
                    initial_states(self.layout, shard, self.trainer.named),
                    opt,
                    self.layout.to_json(),
                    generation=generation,
                )

    def train(self, iterations: int) -> None:
        for it in range(iterations):
            grads, commit = self.trainer.step(it)
            self.producer.send_iteration(it, bucket_bytes(self.layout, grads), commit)
            self._last = (it, commit)
        self.wait(lambda st: st["last_applied"] == iterations - 1 and st["istar"] == iterations - 1)

    def heartbeat(self) -> None:
        """Rank 0 idle: re-send the last COMMIT every 50 ms (the trainers stay 'running')."""

        def beat() -> None:
            while not self._beat_stop.wait(0.05):
                if self._last is not None:
                    with self.producer._lock:
                        self.producer._send_commit(*self._last, retx=True)

        self._beat = threading.Thread(target=beat, name="test-heartbeat", daemon=True)
        self._beat.start()

    def wait(self, pred: Any, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        live = [n for n in self.nodes if n.id not in self.stopped]
        while time.monotonic() < deadline:
            if all(pred(n.status(timeline=0)) for n in live):
                return
            time.sleep(0.005)
        raise AssertionError([n.status(timeline=0)["last_applied"] for n in live])

    def stop(self, k: int) -> None:
        self.nodes[k].stop()
        self.stopped.add(k)

    def close(self) -> None:
        self._beat_stop.set()
        if self._beat is not None:
            self._beat.join(5.0)
        self.cluster.close()  # stopping a stopped node does nothing


@contextlib.contextmanager
def trained_job(tmp: Path, iterations: int) -> Iterator[Job]:
    """A :class:`Job` of 4 shadows (2 shards x 2 replicas), loaded and ``iterations`` applied;
    closed at the end."""
    job = Job(tmp, shadows=4, replication=2)
    try:
        job.load()
        job.train(iterations)
        yield job
    finally:
        job.close()


ITERS = 6


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    """4 shadows, 2 shards x 2 replicas, loaded and 6 iterations applied; trainers alive."""
    with trained_job(tmp_path_factory.mktemp("healthy"), ITERS) as job:
        job.heartbeat()
        yield job


def _status(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["status", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------------------- healthy


def test_healthy_job_view(healthy: Job) -> None:
    v = jobview.collect(healthy.spec)  # token from the spec's token file
    assert json.loads(json.dumps(v)) == v  # JSON-serialisable as it is
    assert v["healthy"] and v["problems"] == [], v["problems"]
    assert v["summary"].startswith("healthy: I* = 5"), v["summary"]
    assert v["source"] == "shadows" and v["controller"] is None and v["schema"] == 1
    assert v["job"] == {
        "id": JOB_ID,
        "name": "status-test",
        "mode": "mirror",
        "shadows": 4,
        "shards": 2,
        "replication": 2,
    }
    t = v["trainers"]
    assert t["iteration"] == ITERS - 1 and t["state"] == "running" and t["alive"] is True
    assert 0 <= t["silent_s"] < 2.0
    ist = v["istar"]
    assert ist["iteration"] == ITERS - 1 and ist["reason"] is None and not ist["fresh"]
    assert ist["layout"] == healthy.layout.digest
    assert len(ist["source"]) == 2
    for shard, src in enumerate(ist["source"]):  # a source holds its shard
        assert src % 2 == shard
    assert [s["state"] for s in v["shards"]] == ["ok", "ok"]
    assert [r["id"] for r in v["shadows"]] == [0, 1, 2, 3]
    for r in v["shadows"]:
        assert r["health"] == "ok" and r["reachable"] and r["error"] is None
        assert (r["shard"], r["replica"]) == healthy.layout.shard_of_shadow(r["id"])
        assert r["loaded"] and r["last_applied"] == ITERS - 1 and r["lag"] == 0
        assert r["diverged_at"] is None and r["rates"] is None
        # the only drops: READY records of peers that were loaded a moment earlier
        assert set(r["drops"]) <= {"not_loaded"}
        assert r["drops_total"] == sum(r["drops"].values())
        assert set(r["events"]) == set(jobview.EVENTS)
        assert r["endpoint"] == f"tcp://{healthy.spec.shadows.control_endpoint(r['id'])}"
    assert "switch" not in v


def test_status_json_schema_and_exit_0(healthy: Job, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _status(["--spec", str(healthy.spec_path), "--json"], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert len(lines) == 1
    v = json.loads(lines[0])
    assert set(v) == {
        "schema",
        "source",
        "controller",
        "time",
        "elapsed_s",
        "job",
        "trainers",
        "istar",
        "shards",
        "shadows",
        "healthy",
        "summary",
        "problems",
    }
    assert set(v["trainers"]) == {
        "world_size",
        "iteration",
        "silent_s",
        "failure_detect_s",
        "alive",
        "state",
        "iterations_per_s",
        "finished",
    }
    assert v["trainers"]["finished"] is None  # running
    assert set(v["istar"]) == {
        "iteration",
        "fresh",
        "source",
        "usable",
        "layout",
        "generations",
        "reason",
        "reachable",
    }
    assert set(v["shards"][0]) == {"shard", "shadows", "answering", "usable", "healthy", "state"}
    assert set(v["shadows"][0]) == {
        "id",
        "endpoint",
        "reachable",
        "error",
        "error_code",
        "shard",
        "replica",
        "loaded",
        "last_applied",
        "last_ready",
        "newest_seen",
        "istar_view",
        "lag",
        "lag_threshold",
        "diverged_at",
        "generation",
        "window",
        "buffered",
        "trainers_silent_s",
        "health",
        "drops",
        "drops_total",
        "events",
        "rates",
    }
    assert v["istar"]["iteration"] == ITERS - 1 and v["healthy"]


def test_status_text_has_every_shadow_row(healthy: Job, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _status(["--spec", str(healthy.spec_path)], capsys)
    assert rc == 0, out
    assert "\x1b[" not in out  # not a terminal: no colours
    assert f"job {JOB_ID} status-test (mirror)" in out
    assert re.search(rf"trainers: iteration {ITERS - 1}, running", out), out
    assert re.search(
        rf"I\*: {ITERS - 1} +sources: shard 0 <- shadow \d, shard 1 <- shadow \d", out
    ), out
    for k in range(4):
        shard, rep = healthy.layout.shard_of_shadow(k)
        assert re.search(rf"^ +{k}  {shard}/{rep} +ok +{ITERS - 1} +0 +- ", out, re.M), out
    assert out.rstrip().splitlines()[-1].startswith("healthy: I* = 5")
    coloured = jobview.render_text(jobview.collect(healthy.spec, token=TOKEN), colour=True)
    assert "\x1b[32mok" in coloured


def test_watch_count_json_gives_one_line_per_refresh_with_rates(
    healthy: Job, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = _status(
        [
            "--spec",
            str(healthy.spec_path),
            "--watch",
            "--count",
            "2",
            "--interval",
            "0.1",
            "--json",
        ],
        capsys,
    )
    assert rc == 0
    views = [json.loads(line) for line in out.splitlines()]
    assert len(views) == 2
    assert views[1]["time"] > views[0]["time"]
    assert all(r["rates"] is None for r in views[0]["shadows"])
    for r in views[1]["shadows"]:
        assert r["rates"] == {"applied_per_s": 0.0, "drops_per_s": 0.0, "nacks_per_s": 0.0}
    assert views[1]["trainers"]["iterations_per_s"] == 0.0
    # plain text watch, not a terminal: views one after the other, no screen clearing
    rc, out, _ = _status(
        ["--spec", str(healthy.spec_path), "--watch", "--count", "2", "--interval", "0.05"], capsys
    )
    assert rc == 0 and out.count("healthy: I* = 5") == 2 and "\x1b[2J" not in out


def test_wrong_token_is_each_shadows_error_not_a_crash(
    healthy: Job, capsys: pytest.CaptureFixture[str]
) -> None:
    v = jobview.collect(healthy.spec, token="not-the-token")
    assert not v["healthy"]
    for r in v["shadows"]:
        assert r["reachable"] and r["error_code"] == "bad_token" and r["health"] == "error"
        assert "bad_token" in r["error"]
    assert any("wrong job token" in p for p in v["problems"]), v["problems"]
    assert v["istar"]["iteration"] is None and v["istar"]["reason"]
    assert v["trainers"]["state"] == "unknown"
    wrong = healthy.write_spec("wrong.toml", "not-the-token")
    rc, out, err = _status(["--spec", str(wrong)], capsys)
    # a token no shadow accepts is an error (exit 1, docs/operations.md), not a job state; the
    # view is still printed (every shadow's refusal), the error names who refused and where
    # the token came from
    assert rc == 1, (rc, err)
    assert out.count("bad_token") >= 4 and "DEGRADED" in out
    assert "the job token was refused (bad_token) by shadows 0, 1, 2, 3" in err, err
    assert f"security.token_file = {wrong}.token" in err and "is not this job's token" in err
    rc, out, err = _status(["--spec", str(wrong), "--json"], capsys)
    assert rc == 1 and json.loads(out)["shadows"][0]["error_code"] == "bad_token"
    rc, _, err = _status(["--spec", str(wrong), "--watch", "--count", "3"], capsys)
    assert rc == 1 and "refused (bad_token)" in err  # no refresh makes it right


def test_bad_options_exit_1(
    healthy: Job, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, _, err = _status(["--spec", str(healthy.spec_path), "--count", "2"], capsys)
    assert rc == 1 and "--count needs --watch" in err
    rc, _, err = _status(["--spec", str(tmp_path / "missing.toml")], capsys)
    assert rc == 1 and "cannot read job spec" in err
    doc = {**healthy.doc, "security": {"token_env": "SG_STATUS_TEST_UNSET_TOKEN"}}
    spec = tmp_path / "noenv.toml"
    spec.write_text(parse_spec(doc, env={}).to_toml())
    rc, _, err = _status(["--spec", str(spec)], capsys)
    assert rc == 1 and "SG_STATUS_TEST_UNSET_TOKEN" in err


# ------------------------------------------------------------------------------- faults


def test_stopped_shadows_are_unreachable_and_cost_one_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with trained_job(tmp_path, 3) as job:
        job.heartbeat()
        job.stop(3)  # shard 1 keeps replica 0 (shadow 1): degraded, I* still there
        t0 = time.monotonic()
        v = jobview.collect(job.spec, token=TOKEN)
        took = time.monotonic() - t0
        assert RPC * 0.9 <= took < RPC + 1.5, took
        rows = {r["id"]: r for r in v["shadows"]}
        assert rows[3]["health"] == "unreachable" and not rows[3]["reachable"]
        assert rows[3]["error_code"] == "timeout" and rows[3]["shard"] == 1
        assert [rows[k]["health"] for k in (0, 1, 2)] == ["ok", "ok", "ok"]
        assert [s["state"] for s in v["shards"]] == ["ok", "degraded"]
        assert v["istar"]["iteration"] == 2 and v["istar"]["source"][1] == 1
        assert not v["healthy"] and v["summary"].startswith("DEGRADED")
        assert any(
            p.startswith("shadow 3 (shard 1, replica 1) unreachable") for p in v["problems"]
        ), v["problems"]
        assert "shard 1 degraded: 1 of 2 replicas healthy" in v["problems"]

        job.stop(1)  # now no replica of shard 1 answers: no restore point
        t0 = time.monotonic()
        rc, out, _ = _status(["--spec", str(job.spec_path), "--json"], capsys)
        took = time.monotonic() - t0
        assert rc == 3
        assert took < RPC + 2.0, took  # two dead shadows, still one timeout
        v = json.loads(out)
        assert v["istar"]["iteration"] is None
        assert "no shadow holding shard 1 answers" in v["istar"]["reason"]
        assert v["shards"][1]["state"] == "unavailable"
        assert any("shard 1 unavailable: no replica answers" in p for p in v["problems"])
        rc, out, _ = _status(["--spec", str(job.spec_path)], capsys)
        assert rc == 3 and "unreachable" in out and "I*: none:" in out


def test_unloaded_shadow_and_silent_trainers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = Job(tmp_path, shadows=3, replication=1)
    try:
        v = jobview.collect(job.spec, token=TOKEN)  # nothing loaded yet: a fresh job
        assert v["istar"]["fresh"] and v["istar"]["iteration"] == -1
        assert [r["health"] for r in v["shadows"]] == ["unloaded"] * 3
        job.load(only=[0, 1])  # shard 2's only shadow stays empty
        v = jobview.collect(job.spec, token=TOKEN)
        rows = v["shadows"]
        assert [r["health"] for r in rows] == ["ok", "ok", "unloaded"]
        assert rows[2]["loaded"] is False and rows[2]["lag"] is None
        assert v["istar"]["iteration"] is None
        assert "shard 2's shadows [2] answer but hold no state" in v["istar"]["reason"]
        assert "shadow 2 is not loaded (holds no state)" in v["problems"]
        assert v["shards"][2]["state"] == "unavailable"
        rc, out, _ = _status(["--spec", str(job.spec_path)], capsys)
        assert rc == 3 and re.search(r"^ +2  2/0 +unloaded", out, re.M), out
        # nothing arrives from the trainers: silent once failure_detect has passed
        time.sleep(0.3)
        quick = dataclasses.replace(
            job.spec,
            timeouts=dataclasses.replace(job.spec.timeouts, heartbeat_s=0.05, failure_detect_s=0.2),
        )
        v = jobview.collect(quick, token=TOKEN)
        t = v["trainers"]
        assert t["state"] == "silent" and t["alive"] is False and t["silent_s"] >= 0.2
        assert any(p.startswith("trainers silent for") for p in v["problems"])
    finally:
        job.close()


def _quick_spec(job: Job, name: str, token: str = TOKEN, **extra: Any) -> Path:
    """``job``'s spec with failure_detect 0.3 s (the trainers fall silent fast), plus
    ``extra`` sections."""
    saved = job.doc
    job.doc = {
        **saved,
        "timeouts": {**saved["timeouts"], "heartbeat": "50ms", "failure_detect": "300ms"},
        **extra,
    }
    try:
        return job.write_spec(name, token)
    finally:
        job.doc = saved


def test_a_clean_finish_is_finished_not_silent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 0's close tells every shadow (``finished``); ``status`` then says the trainers
    finished and exits 0, without a controller; a load of a newer generation clears it."""
    from shadowgrad.replies import ShadowStatus

    with trained_job(tmp_path, 3) as job:
        quick = _quick_spec(job, "quick.toml")
        time.sleep(0.4)  # the trainers are gone: silent
        rc, out, _ = _status(["--spec", str(quick)], capsys)
        assert rc == 3 and "trainers silent for" in out
        for n in job.nodes:  # what rank 0's close() does
            with ShadowClient(n.control_endpoint, TOKEN, timeout_s=5.0) as c:
                head = c.finished(2, 0, requester="rank 0")
                assert head.finished == {"iteration": 2, "generation": 0, "requester": "rank 0"}
                st = c.status(timeline=0)
                assert st.finished == head.finished
                # an older trainer (an older generation) cannot say the job finished
                with pytest.raises(ControlError, match="stale_generation"):
                    c.finished(2, -1, requester="rank 0")
                with pytest.raises(ControlError, match="bad_request"):
                    c.call("finished", iteration="x", generation=0)
        # a shadow without the op (an older one) has no such key: it reads as not finished
        old = {k: v for k, v in st.raw.items() if k != "finished"}
        assert ShadowStatus.from_wire(old).finished is None
        rc, out, _ = _status(["--spec", str(quick), "--json"], capsys)
        v = json.loads(out)
        assert rc == 0, v["problems"]
        assert v["healthy"] and v["trainers"]["state"] == "finished"
        assert v["trainers"]["finished"] == {
            "iteration": 2,
            "generation": 0,
            "requester": "rank 0",
            "source": "shadows",
        }
        assert v["summary"].startswith("healthy: I* = 2, trainers finished"), v["summary"]
        rc, out, _ = _status(["--spec", str(quick)], capsys)
        assert rc == 0 and "finished (training ended after iteration 2)" in out, out
        # a new run of the job (a newer generation loaded) clears it
        job.load(generation=5)
        for n in job.nodes:
            with ShadowClient(n.control_endpoint, TOKEN, timeout_s=10.0) as c:
                assert c.status(timeline=0).finished is None
        time.sleep(0.4)
        rc, out, _ = _status(["--spec", str(quick), "--json"], capsys)
        assert rc == 3 and json.loads(out)["trainers"]["state"] == "silent"


def test_a_finish_the_controller_was_told_of_is_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a controller: its state ``finished`` is no problem, and its word stands for the
    shadows' when they were not told (exit 0); a wrong token refused by the shadows and the
    controller exits 1 naming both."""
    from shadowgrad.control_client import ControllerClient
    from shadowgrad.controller.service import Controller, ControllerOptions

    with trained_job(tmp_path, 3) as job:
        from shadowgrad.config import load_spec

        ctl_at = {"address": f"127.0.0.1:{free_tcp_base(1)}"}
        quick = _quick_spec(job, "ctl.toml", controller=ctl_at)
        wrong = _quick_spec(job, "ctl-wrong.toml", "not-the-token", controller=ctl_at)
        opts = ControllerOptions(poll_s=0.05)
        with Controller(load_spec(quick), token=TOKEN, options=opts) as ctl:
            time.sleep(0.4)
            rc, out, _ = _status(["--spec", str(quick), "--json"], capsys)
            v = json.loads(out)
            assert rc == 3 and v["controller_state"]["state"] == "trainers_failed", v
            with ControllerClient(f"tcp://{ctl_at['address']}", TOKEN, timeout_s=5.0) as c:
                c.finished(2, 0, requester="rank 0")
            assert ctl.state == "finished"
            rc, out, _ = _status(["--spec", str(quick), "--json"], capsys)
            v = json.loads(out)
            assert rc == 0, v["problems"]
            assert v["controller_state"]["state"] == "finished"
            assert v["controller_state"]["finished"]["iteration"] == 2
            assert v["trainers"]["state"] == "finished"
            assert v["trainers"]["finished"]["source"] == "controller"
            assert set(v["controller_state"]["shadows"].values()) == {"ok"}
            rc, _, err = _status(["--spec", str(wrong)], capsys)
            assert rc == 1 and "by shadows 0, 1, 2, 3 and the controller" in err, err


def test_switch_counters_join_the_view(healthy: Job) -> None:
    class Switch:
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        def counters(self) -> dict[str, Any]:
            if self.fail:
                raise ConnectionError("switch down")
            return {"tagged": {"0": [12, 9000]}, "drops": {}}

    v = jobview.collect(healthy.spec, token=TOKEN, switch=Switch(False))
    assert v["switch"]["tagged"] == {"0": [12, 9000]} and v["healthy"]
    v = jobview.collect(healthy.spec, token=TOKEN, switch=Switch(True))
    assert "switch down" in v["switch"]["error"] and not v["healthy"]


# ------------------------------------------------------------------------------- units


def test_drop_classification() -> None:
    counters = {
        "data": 10,
        "retx": 2,
        "duplicate": 3,
        "commit": 4,
        "commit_stale": 9,
        "commit_duplicate": 1,
        "commit_filled": 1,
        "ready": 50,
        "ready_stale": 2,
        "stale": 1,
        "wire.checksum": 2,
        "foreign_source": 5,
        "ahead_of_window": 0,
        "not_loaded": 7,
        "some_future_reason": 1,
    }
    assert jobview.drops_of(counters) == {
        "foreign_source": 5,
        "not_loaded": 7,
        "some_future_reason": 1,
        "stale": 1,
        "wire.checksum": 2,
    }
    assert jobview.lag_threshold(None) == 8 and jobview.lag_threshold(2048) == 8
    assert jobview.lag_threshold(16) == 4 and jobview.lag_threshold(4) == 2


def test_view_module_imports_no_grpc_protobuf_or_torch() -> None:
    code = (
        "import sys, shadowgrad.controller.view, shadowgrad.controller._status_cmd; "
        "bad = [m for m in ('grpc', 'google.protobuf', 'torch', 'zmq') if m in sys.modules];"
        " print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ}, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_help_documents_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    out = capsys.readouterr().out
    assert "exit status:" in out and "3  degraded" in out
