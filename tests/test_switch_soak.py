"""Soak of the in-band path through the switch, the way a user runs it: ``sg-switch-grpc``
running ``p4/shadowgrad.p4`` on loopback ports, 4 ``shadowgrad shadow`` processes (2 shards x 2
replicas) and 4 trainer processes at full speed for hundreds of iterations; meanwhile one
shadow is paused (SIGSTOP) for seconds and another is killed and restarted. Every shadow ends at
the last iteration, and the shadows' state equals the trainers' bit for bit.

``SHADOWGRAD_SOAK_STEPS`` sets the length (default 400)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("grpc")
pytest.importorskip("p4")

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "trainer-test-token"


def _shadow(spec: Path, k: int, log: Path) -> subprocess.Popen[bytes]:
    cli = str(Path(sys.executable).parent / "shadowgrad")
    with log.open("ab") as f:
        return subprocess.Popen(
            [cli, "shadow", "--spec", str(spec), "--id", str(k)],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "SHADOWGRAD_TOKEN": TOKEN},
            start_new_session=True,
        )


def _step(text: str) -> int:
    steps = re.findall(r"^step (\d+) loss", text, re.M)
    return int(steps[-1]) if steps else -1


@pytest.mark.slow
def test_inband_switch_soak_with_a_paused_and_a_restarted_shadow(tmp_path: Path) -> None:
    from shadowgrad.bmv2_testbed.inband import JobSwitch
    from shadowgrad.config import parse_spec
    from shadowgrad.layout import Layout, from_module
    from shadowgrad.specs import switch_spec
    from tests.test_trainer_restore import _finish, _launch, _model, _spec

    steps = int(os.environ.get("SHADOWGRAD_SOAK_STEPS", "400"))
    doc = switch_spec(world=4, shadows=4, replication=2, gap_repair="30ms")
    spec = parse_spec(doc, env={})
    path = _spec(tmp_path, doc)
    params, buckets = from_module(_model())
    layout = Layout.build(params, buckets, 4, 2)
    shadows: dict[int, subprocess.Popen[bytes]] = {}
    events: list[str] = []
    t0 = time.monotonic()
    with JobSwitch(spec, layout) as sw:
        try:
            for k in range(4):
                shadows[k] = _shadow(path, k, tmp_path / f"shadow{k}.log")
            time.sleep(1.0)
            ranks = _launch(path, 4, steps, "--amp", "--out", str(tmp_path / "final.pt"))
            try:
                paused = killed = False
                while any(p.poll() is None for p in ranks.procs):
                    it = _step(ranks.output(0))
                    if not paused and it >= steps // 4:
                        shadows[1].send_signal(signal.SIGSTOP)
                        time.sleep(3.0)
                        shadows[1].send_signal(signal.SIGCONT)
                        paused = True
                        events.append(f"shadow 1 paused 3 s at step {it}")
                    if not killed and it >= steps // 2:
                        shadows[3].kill()
                        shadows[3].wait(10)
                        time.sleep(1.0)
                        shadows[3] = _shadow(path, 3, tmp_path / "shadow3.log")
                        killed = True
                        events.append(f"shadow 3 killed and restarted at step {it}")
                    time.sleep(0.2)
                _finish(ranks, 4, timeout_s=900)
            finally:
                ranks.close()
            assert len(events) == 2, events
            wall = time.monotonic() - t0
            # every shadow catches up to the last iteration (healed by repair or re-seed) ...
            out = None
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                r = subprocess.run(
                    [
                        sys.executable,
                        str(ROOT / "tests" / "test_netns_inband.py"),
                        "--check",
                        str(path),
                        str(tmp_path / "final.pt"),
                        str(steps),
                    ],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    env={**os.environ, "SHADOWGRAD_TOKEN": TOKEN},
                    timeout=120,
                )
                if r.returncode == 0:
                    out = json.loads(r.stdout.strip().splitlines()[-1])
                    if out["last_applied"] == [steps - 1] * 4:
                        break
                time.sleep(1.0)
            assert out is not None, r.stderr[-3000:]
            # ... and holds exactly the trainers' state
            assert out["last_applied"] == [steps - 1] * 4, out
            assert out["bad"] == [], out["bad"]
            c = sw.counters()
            print(
                f"soak: {steps} iterations in {wall:.0f} s through the switch; {events}; "
                f"tagged {[p for p, _ in c['tagged']]}, copies "
                f"{[p for p, _ in c['shadow_copies']]}, drops {c['drops']}"
            )
        finally:
            for p in shadows.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)
                    p.terminate()
            for p in shadows.values():
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
