"""The controller with in-band jobs through the P4 target (``sg-switch-grpc`` running
``p4/shadowgrad.p4``): a rank SIGKILLed at random points is detected, I* is fixed and held by the
controller, the restarted ranks take it from the controller and the resumed run is bit-identical
to an uninterrupted one; a SIGKILLed ``shadowgrad controller`` restarts, reads the switch back and
writes nothing while training goes on.

The mirror-mode trials (20 whole-job SIGKILLs at random points with ``shadowgrad controller``
running, the documented example under torchrun) are in tests/test_trainer_heal.py's soak.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("grpc")
pytest.importorskip("p4")

from shadowgrad.bmv2_testbed.inband import JobSwitch
from shadowgrad.config import parse_spec
from shadowgrad.controller.service import Controller, ControllerOptions
from shadowgrad.freeports import free_port
from shadowgrad.p4target.process import stop_process
from shadowgrad.specs import switch_spec
from shadowgrad.testing.cluster import shadow_cluster
from shadowgrad.testing.fakes import FakeShadowStatuses
from shadowgrad.testing.processes import wait_for
from shadowgrad.testing.specs import TOKEN
from tests.test_trainer_restore import (
    _assert_resumed_bit_identical,
    _finish,
    _kill_rank_when,
    _launch,
    _layout,
    _losses,
    _run_to_end,
    _spec,
    _start,
)

ROOT = Path(__file__).resolve().parents[1]
STEPS = 30


def _doc() -> dict[str, Any]:
    doc = switch_spec(world=4, shadows=4, replication=2, gap_repair="30ms")
    doc["controller"] = {"address": f"127.0.0.1:{free_port()}"}
    return doc


def _reference(tmp: Path) -> tuple[dict[int, str], dict[str, Any]]:
    doc = _doc()
    del doc["controller"]
    spec = parse_spec(doc, env={})
    path = _spec(tmp, doc, "ref.toml")
    out = tmp / "ref.pt"
    with JobSwitch(spec, _layout(4, 2)), shadow_cluster(spec):
        text = _run_to_end(path, 4, STEPS, "--amp", "--out", str(out))
    return _losses(text), torch.load(out, weights_only=True)


def _trial(
    tmp: Path, trial: int, ref_losses: dict[int, str], ref_final: dict[str, Any]
) -> dict[str, Any]:
    rng = random.Random(3000 + trial)
    kill_after = rng.randrange(2, STEPS - 6)
    victim = rng.randrange(4)
    delay = rng.uniform(0.0, 0.03)
    doc = _doc()
    spec = parse_spec(doc, env={})
    path = _spec(tmp, doc, f"trial{trial}.toml")
    out = tmp / f"trial{trial}.pt"
    with (
        JobSwitch(spec, _layout(4, 2)) as sw,
        shadow_cluster(spec) as cluster,
        Controller(
            spec, token=TOKEN, driver=sw.driver, options=ControllerOptions(poll_s=0.05)
        ) as ctl,
    ):
        # the switch was programmed already: the controller's convergence writes nothing
        assert ctl.converge_reports[0]["writes"] == 0, ctl.converge_reports
        # paced (50 ms a step): on a loaded machine the tiny model's last steps otherwise run
        # out before the kill lands, and a job that finished has no failure to detect
        ranks = _launch(path, 4, STEPS, "--amp", "--sleep", "0.05")
        try:
            t_kill = _kill_rank_when(ranks, kill_after, delay, victim)
            time.sleep(0.05)
            first = _losses(str(ranks.output(0)))
        finally:
            ranks.close()  # the others hang in the ring: a torchrun would kill them too
        assert max(first) < STEPS - 1, f"trial {trial}: the job ended before the kill landed"
        assert wait_for(lambda: ctl.detections, 20.0), ctl.status()
        detect_s = time.monotonic() - t_kill if len(ctl.detections) == 1 else None
        assert wait_for(lambda: ctl.istar is not None, 20.0), ctl.status()
        published = ctl.istar
        text = _run_to_end(path, 4, STEPS, "--amp", "--out", str(out))
        assert wait_for(lambda: ctl.state in ("running", "finished"), 10.0), ctl.status()
        status = cluster.status()
        ev = dict(ctl.ev)
    start, restored = _start(text)
    assert published is not None and "error" not in published, published
    assert restored and start == int(published["istar"]) + 1, (start, published)
    _assert_resumed_bit_identical(
        trial, STEPS, first, text, start, out, ref_losses, ref_final, status
    )
    assert ev["trainer_failures"] == 1 and ev["recoveries"] == 1, ev
    return {
        "kill_after": kill_after,
        "victim": victim,
        "last_logged": max(first, default=-1),
        "resumed_at": start,
        "detect_s": detect_s,
    }


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_inband_rank_sigkill_with_the_controller_is_bit_identical(tmp_path: Path) -> None:
    # 2 in the default run (SHADOWGRAD_INBAND_KILL_TRIALS=20 for the 20 points)
    trials = int(os.environ.get("SHADOWGRAD_INBAND_KILL_TRIALS", "2"))
    ref_losses, ref_final = _reference(tmp_path)
    assert sorted(ref_losses) == list(range(STEPS))
    results = [_trial(tmp_path, t, ref_losses, ref_final) for t in range(trials)]
    print(json.dumps(results))
    # at most the iterations in flight are repeated (see test_trainer_restore)
    assert all(r["resumed_at"] >= r["last_logged"] - 2 for r in results), results


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and "event" in d:
            out.append(d)
    return out


def _controller(spec: Path, layout: Path, log: Path) -> subprocess.Popen[bytes]:
    cli = str(Path(sys.executable).parent / "shadowgrad")
    with log.open("ab") as f:
        return subprocess.Popen(
            [cli, "--log-json", "controller", "--spec", str(spec), "--layout", str(layout)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SHADOWGRAD_TOKEN": TOKEN},
            cwd=ROOT,
        )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_controller_sigkill_and_restart_writes_nothing_and_training_goes_on(tmp_path: Path) -> None:
    doc = _doc()
    spec = parse_spec(doc, env={})
    layout = _layout(4, 2)
    steps = 120
    lpath = tmp_path / "layout.json"
    lpath.write_text(layout.to_json())
    with JobSwitch(spec, layout) as sw, shadow_cluster(spec) as cluster:
        sw.driver.remove()  # the job's entries out: the first controller programs the switch
        sw.client.close()  # and the primary's stream: the controller becomes the primary
        doc["switch"]["grpc_addr"] = sw.grpc_addr
        path = _spec(tmp_path, doc)
        log = tmp_path / "controller.log"
        procs: list[subprocess.Popen[bytes]] = []
        ranks = None
        try:
            procs.append(_controller(path, lpath, log))
            assert wait_for(
                lambda: any(e["event"] == "controller.switch_converged" for e in _events(log)), 60.0
            ), log.read_text()[-3000:]
            first = next(e for e in _events(log) if e["event"] == "controller.switch_converged")
            assert first["writes"] > 0
            ranks = _launch(path, 4, steps, "--amp")
            assert wait_for(lambda: len(_losses(str(ranks.output(0)))) >= 20, 120.0)
            before = cluster.status()
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(10)
            procs.append(_controller(path, lpath, log))
            assert wait_for(
                lambda: sum(e["event"] == "controller.switch_converged" for e in _events(log)) == 2,
                60.0,
            ), log.read_text()[-3000:]
            second = [e for e in _events(log) if e["event"] == "controller.switch_converged"][1]
            # invariant 6: the restarted controller read the switch back and wrote nothing
            assert second["writes"] == 0 and not second["pipeline_pushed"], second
            text = _finish(ranks, 4)
            after = cluster.status()
            assert wait_for(
                lambda: any(e["event"] == "controller.job_finished" for e in _events(log)), 10.0
            )
            assert procs[1].poll() is None, log.read_text()[-3000:]
        finally:
            if ranks is not None:
                ranks.close()
            for p in procs:
                stop_process(p, kill_s=10)
    assert sorted(_losses(text)) == list(range(steps))
    # I* continuous: training and checkpointing never stopped for the controller
    assert min(s["last_applied"] for s in after) == steps - 1
    assert min(s["last_applied"] for s in before) >= 0
    text_log = log.read_text(errors="replace")
    assert "tick failed" not in text_log and "Traceback" not in text_log, text_log[-3000:]
    events = [e["event"] for e in _events(log)]
    assert "controller.trainer_failed" not in events, events
    assert events.count("controller.job_finished") == 1, events


def test_a_shadow_replaced_at_a_new_address_rewrites_only_its_entries() -> None:
    """SIGHUP's reload: a failed shadow comes back at another address in an updated spec; the
    controller converges the switch to it, writing only what depends on that address (its
    rewrite and its route), and a second convergence writes nothing."""
    from shadowgrad.bmv2_testbed.inband import compile_product
    from shadowgrad.controller.switch import SwitchDriver

    doc = _doc()
    spec = parse_spec(doc, env={})
    layout = _layout(4, 2)
    with JobSwitch(spec, layout) as sw:
        ctl = Controller(spec, token=TOKEN, driver=sw.driver, statuses=FakeShadowStatuses.silent(4))
        with ctl:
            assert ctl.converge_reports[0]["writes"] == 0
            old = doc["shadows"]["addresses"][1]
            doc["shadows"]["addresses"][1] = old.rsplit(".", 1)[0] + ".201"
            new = parse_spec(doc, env={})
            rep = ctl.reload(new, SwitchDriver(sw.client, new, layout, pipeline=compile_product()))
            assert rep is not None and 0 < rep["writes"] <= 3, rep
            assert rep["modified"] + rep["inserted"] + rep["deleted"] == rep["writes"]
            again = SwitchDriver(sw.client, new, layout, pipeline=compile_product()).converge()
            assert again.writes == 0
            # a changed job shape is refused, the running spec kept
            doc["trainers"]["world_size"] = 2
            doc["trainers"]["addresses"] = doc["trainers"]["addresses"][:2]
            doc["switch"]["trainer_ports"] = doc["switch"]["trainer_ports"][:2]
            with pytest.raises(Exception, match="cannot change"):
                ctl.reload(parse_spec(doc, env={}))
            assert ctl.spec is new
