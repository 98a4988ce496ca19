"""``shadowgrad demo`` end to end, as a user runs it (a subprocess of the CLI), asserting on
report.json: the default scenario in network namespaces, the same scenario as an ordinary user
(``nobody``) in a user + network namespace, a mirror-mode scenario, a loss scenario that still
ends bit-exact; SIGINT and SIGTERM mid-scenario leave no process, veth or namespace behind;
the target and scenario errors are precise. The scenarios are tests/scenarios/t-*.toml (the
shipped ones, shortened)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("grpc")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
SCEN = ROOT / "tests" / "scenarios"
CLI = str(Path(sys.executable).parent / "shadowgrad")


def _root() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


needs_root = pytest.mark.skipif(not _root(), reason="needs root and iproute2 (namespaces)")
_F = TypeVar("_F", bound=Callable[..., Any])


def _in_namespaces(test: _F) -> _F:
    """A scenario in network namespaces: slow (15 minutes at most), marked netns, root only."""
    for mark in (needs_root, pytest.mark.netns, pytest.mark.timeout(900), pytest.mark.slow):
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One reference cache for the module: t-default and t-loss share their reference."""
    d = tmp_path_factory.mktemp("demo-cache")
    d.chmod(0o777)
    return d


def _demo(
    out: Path,
    scenario: str | Path,
    *extra: str,
    cache: Path,
    prefix: tuple[str, ...] = (),
    timeout: float = 900,
) -> dict[str, Any]:
    cmd = [
        *prefix,
        CLI,
        "demo",
        str(scenario if isinstance(scenario, Path) else SCEN / f"{scenario}.toml"),
        "--out",
        str(out),
        "--cache",
        str(cache),
        "--no-progress",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    report_path = out / "report.json"
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-5000:]
    report: dict[str, Any] = json.loads(report_path.read_text())
    report["_rc"] = proc.returncode
    report["_stdout"] = proc.stdout
    report["_stderr"] = proc.stderr
    return report


def _check(report: dict[str, Any]) -> dict[str, Any]:
    s = report["summary"]
    assert report["_rc"] == 0 and s["ok"], (s["problems"], report["_stderr"][-3000:])
    assert s["bit_exact_resume"] is True and s["losses_match"] is True
    for f in s["faults"]:
        if f["kind"] == "kill_trainer":
            assert f["lost_iterations"] is not None and f["lost_iterations"] <= 1, f
        else:
            assert f["lost_iterations"] == 0, f
    assert "bit-exact resume: yes" in report["_stdout"]
    return s


@_in_namespaces
def test_default_scenario_in_namespaces(tmp_path: Path, cache: Path) -> None:
    rep = _demo(tmp_path / "out", "t-default", "--topology", "netns", cache=cache)
    s = _check(rep)
    assert rep["record"]["topology"] == "netns" and rep["record"]["target"] == "sim"
    kinds = [f["kind"] for f in s["faults"]]
    assert kinds == ["kill_trainer", "kill_shadow"]
    # the controller saw the trainer failure and the shadow's (down 2.5 s, training goes on
    # long enough after it); the switch replicated the gradients
    assert s["faults"][0]["detect_s"] is not None
    assert s["faults"][1]["detect_s"] is not None, s["faults"][1]
    assert rep["record"]["switch"]["replicated_bytes"] > 0
    assert {"loss.png", "step_time.png", "lag.png", "recovery.png"} <= set(rep["plots"])
    assert "target sim" in rep["_stderr"]


@_in_namespaces
def test_loss_scenario_still_ends_bit_exact(tmp_path: Path, cache: Path) -> None:
    rep = _demo(tmp_path / "out", "t-loss", "--topology", "netns", cache=cache)
    _check(rep)
    rec = rep["record"]
    assert [f["kind"] for f in rec["faults"]] == ["kill_trainer", "restart_controller"]
    # frames were dropped on the shadow's port and repaired (NACK -> retransmission)
    assert rec["switch"]["emulated_loss"] > 0, rec["switch"]
    assert rec["shadow_repaired_bytes"] > 0


def _as_nobody(tmp: Path) -> tuple[str, ...]:
    """Run a command as ``nobody``. The venv's interpreter may live under a directory nobody
    cannot enter (pyenv under /root, mode 700): then the command runs in a private mount
    namespace where that directory is replaced by a world-readable view of the interpreter's
    tree only (nothing on the machine changes)."""
    real = Path(os.path.realpath(sys.executable))
    blocked = next(
        (p for p in reversed(real.parents) if p != Path("/") and not os.stat(p).st_mode & 0o001),
        None,
    )
    script = tmp / "as-nobody.sh"
    lines = ["set -e"]
    if blocked is not None:
        inner = real.relative_to(blocked).parts[0]
        lines += [
            f"mkdir -p {tmp}/view",
            f"mount --bind {blocked}/{inner} {tmp}/view",
            f"mount -t tmpfs -o mode=755 sgview {blocked}",
            f"mkdir -p {blocked}/{inner}",
            f"mount --bind {tmp}/view {blocked}/{inner}",
        ]
    lines.append(f'exec runuser -u nobody -- env HOME={tmp} "$@"')
    script.write_text("\n".join(lines) + "\n")
    return ("unshare", "-m", "--propagation", "private", "sh", str(script))


@_in_namespaces
def test_default_scenario_as_an_ordinary_user_in_a_user_namespace() -> None:
    if shutil.which("runuser") is None or shutil.which("unshare") is None:
        pytest.skip("needs runuser and unshare (util-linux)")
    import tempfile

    # pytest's tmp_path is under /tmp/pytest-of-root (mode 700): nobody needs its own place
    work = Path(tempfile.mkdtemp(prefix="sg-demo-nobody-", dir="/tmp"))
    try:
        work.chmod(0o777)
        rep = _demo(
            work / "out",
            "t-default",
            "--topology",
            "userns",
            cache=work / "cache",
            prefix=_as_nobody(work),
        )
        _check(rep)
        assert rep["record"]["topology"] == "userns"
        assert (work / "out" / "report.json").stat().st_uid != 0  # written by nobody
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mirror_scenario_on_loopback(tmp_path: Path, cache: Path) -> None:
    rep = _demo(tmp_path / "out", "t-mirror", "--topology", "loopback", cache=cache)
    s = _check(rep)
    assert rep["record"]["scenario"]["mode"] == "mirror" and rep["record"]["switch"] is None
    assert [f["kind"] for f in s["faults"]] == ["kill_trainer", "pause_shadow"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mirror_lagging_shadows_then_a_trainer_kill_loses_nothing(
    tmp_path: Path, cache: Path
) -> None:
    """Issue 21, run 1: the shadows lag the fast trainers when rank 1 is killed; the controller
    settles, holds I* on every source before it publishes it, and the job resumes bit-exact."""
    rep = _demo(tmp_path / "out", "t-mirror-lag", "--topology", "loopback", cache=cache)
    s = _check(rep)
    points = _events(tmp_path / "out", "controller.restore_point")
    assert points and all(sorted(p["held"]) == sorted(set(p["source"])) for p in points), points
    assert s["faults"][0]["lost_iterations"] <= 1


@_in_namespaces
def test_both_replicas_of_a_shard_killed_are_current_again_within_seconds(
    tmp_path: Path, cache: Path
) -> None:
    """Issue 21, run 2: both replicas of shard 1 killed and restarted; they are re-seeded at
    the trainers' iteration (fast), the cut moves on, and a later trainer kill loses at most
    one iteration, bit-exact."""
    rep = _demo(tmp_path / "out", "t-replicas", "--topology", "netns", cache=cache)
    s = _check(rep)
    assert [f["kind"] for f in s["faults"]] == ["kill_shadow", "kill_shadow", "kill_trainer"]
    seeds = _events(tmp_path / "out", "trainer.reseed")
    assert seeds, "the lost shard was not re-seeded by the trainers"
    # only the two killed shadows were ever failed (no false alarm at the start or the end)
    failed = {e["shadow"] for e in _events(tmp_path / "out", "controller.shadow_failed")}
    assert failed <= {1, 3}, failed
    # the shadows got the gradients from the switch's copies; NACK repair filled only what
    # the restarted ones missed (a chunk the veths fragmented was never copied: two thirds of
    # every iteration came by repair, 150 MB, and the kill could lose 2)
    rec = rep["record"]
    assert rec["shadow_repaired_bytes"] < rec["switch"]["replicated_bytes"] // 20, rec["shadow_rx"]


#: the smallest demo with a trainer kill: mirror mode (no switch), 2 ranks, 40 iterations
_TINY = """name = "t-tiny"
model = "mlp"
mode = "mirror"
trainers = 2
shards = 2
replication = 1
iterations = 40
sleep = "10ms"

[[faults]]
kind = "kill_trainer"
target = 1
at = 20
"""


def _consistent(rep: dict[str, Any]) -> dict[str, Any]:
    """The report of one run, and only of it: OK, no contradiction, durations not negative,
    a wall time the run's own window and steps account for, repeated steps = work lost."""
    s = _check(rep)
    rec = rep["record"]
    assert s["contradictions"] == [], s["contradictions"]
    for f in s["faults"]:
        assert f["detect_s"] is not None and f["detect_s"] >= 0, f
        assert f["recover_s"] is not None and f["recover_s"] >= 0, f
    assert s["repeated_steps"] == sum(f["lost_iterations"] for f in s["faults"])
    # every step logged is one of this run's iterations, or one of its repeats
    assert s["steps_executed"] - s["repeated_steps"] <= s["iterations_planned"]
    window = rec["run_window"]["ended"] - rec["run_window"]["began"]
    assert 0 < s["wall_s"] <= window, (s["wall_s"], window)
    assert min(w for w, _, _ in rec["step_times"]) >= rec["run_window"]["began"]
    # the overhead is the unfaulted run with shadowgrad against the same job without it
    over = s["trainer_overhead"]
    assert over["plain_mean_step_s"] and over["checkpointed_mean_step_s"], over
    assert "trainer overhead: x" in rep["_stdout"] and "with shadowgrad vs" in rep["_stdout"]
    assert "faulted run vs unfaulted: x" in rep["_stdout"]
    return s


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_demos_into_one_out_each_report_only_their_own_run(tmp_path: Path) -> None:
    """Issue 22: a second demo into the same --out read the first run's logs and events with
    its own (600 steps executed, 300 repeated, 1578 s wall for an 85 s run, a negative
    recovery) and still said OK. The second run clears the first one's artefacts (the cache in
    OUT/.cache stays: its reference and plain runs are reused) and reports as consistently as
    the first."""
    scenario = tmp_path / "t-tiny.toml"
    scenario.write_text(_TINY)
    out = tmp_path / "out"
    cache = out / ".cache" / "shadowgrad"  # the default place: inside --out
    first = _demo(out, scenario, "--topology", "loopback", cache=cache)
    s1 = _consistent(first)
    assert (out / ".shadowgrad-demo").exists()
    assert not first["record"]["reference"]["cached"] and not first["record"]["plain"]["cached"]
    stale = out / "run" / "stale-from-run-1.log"
    stale.write_text("step 999 loss 0x1p+0 dt 0.1 wall 1.0\n")
    second = _demo(out, scenario, "--topology", "loopback", cache=cache)
    s2 = _consistent(second)
    assert second["record"]["reference"]["cached"] and second["record"]["plain"]["cached"]
    assert "holds a previous run: removed" in second["_stderr"]
    assert not stale.exists()
    assert s2["wall_s"] < 3 * s1["wall_s"] + 60, (s1["wall_s"], s2["wall_s"])
    assert s2["trainer_overhead"]["ratio"] == s1["trainer_overhead"]["ratio"]  # both cached


def test_an_out_folder_that_is_not_a_demos_is_refused_and_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    (out / "run").mkdir(parents=True)
    (out / "run" / "notes.txt").write_text("mine")
    (out / "thesis.tex").write_text("mine")
    proc = subprocess.run(
        [CLI, "demo", str(SCEN / "t-mirror.toml"), "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (
        f"--out {out}: the folder is not empty and is not a demo's output folder "
        "(no .shadowgrad-demo file; it holds thesis.tex, which a demo does not write): "
        "nothing was deleted"
    ) in proc.stderr
    assert (out / "thesis.tex").read_text() == "mine"
    assert (out / "run" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["run", "thesis.tex"]


def _events(out: Path, name: str) -> list[dict[str, Any]]:
    """The structured events ``name`` in a demo run's logs (``out/run/*.log``): JSON lines
    (the controller's) as they are, text lines (``name key=value ...``, the ranks' and
    shadows') as ``{"line": ...}``."""
    found: list[dict[str, Any]] = []
    for path in sorted((out / "run").glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if doc.get("event") == name:
                    found.append(doc)
            elif line.startswith(f"{name} ") or f" {name} " in line:
                found.append({"line": line})
    return found


def _pids_where(name: str, holds: Callable[[bytes], bool]) -> list[int]:
    """The processes whose ``/proc/PID/<name>`` (``environ``, ``cmdline``) ``holds`` is true
    of (one that ends while it is read is passed over)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            data = (p / name).read_bytes()
        except OSError:
            continue
        if holds(data):
            found.append(int(p.name))
    return found


def _marked(run_id: str) -> list[int]:
    """Processes that carry this demo run's marker in their environment."""
    return _pids_where("environ", lambda env: f"SHADOWGRAD_DEMO_RUN={run_id}".encode() in env)


def _signal_mid_scenario(
    tmp_path: Path, topology: str, sig: int, up: Callable[[str], object], what: str
) -> tuple[int, dict[str, Any], Path]:
    """The default scenario on ``topology`` (in ``tmp_path / "out"``), sent ``sig`` once rank
    0 trained step 5 (the switch, the shadows, the controller and the ranks running; its
    processes marked, and ``up(tag)`` true, else "no ``what`` were up"): the demo's exit
    code, its ``topology.json`` and its out folder."""
    out = tmp_path / "out"
    # a shell that starts a job in the background ignores SIGINT for it, and an ignored SIGINT
    # stays ignored across exec: the demo gets a caught one (reset to the default by exec), as
    # from a terminal
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [
                CLI,
                "demo",
                str(SCEN / "t-default.toml"),
                "--topology",
                topology,
                "--out",
                str(out),
                "--cache",
                str(tmp_path / "own-cache"),
                "--no-progress",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    finally:
        signal.signal(signal.SIGINT, old)
    try:
        deadline = time.monotonic() + 240
        topo = out / "topology.json"
        # mid-scenario: the switch, the shadows, the controller and the ranks are running
        while time.monotonic() < deadline:
            logs = list(out.glob("*/rank0-0.log"))
            if topo.exists() and logs and "step 5 " in logs[0].read_text(errors="replace"):
                break
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:] if proc.stdout else ""
            time.sleep(0.2)
        info = json.loads(topo.read_text())
        assert _marked(info["run_id"]), "nothing was running"
        assert up(info["tag"]), f"no {what} were up"
        proc.send_signal(sig)
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return rc, info, out


@_in_namespaces
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_scenario_leaves_nothing_behind(tmp_path: Path, cache: Path, sig: int) -> None:
    from shadowgrad.bmv2_testbed.topology import leftovers

    rc, info, _ = _signal_mid_scenario(
        tmp_path, "netns", sig, lambda tag: leftovers(tag)["namespaces"], "namespaces"
    )
    assert rc != 0
    time.sleep(0.5)
    assert _marked(info["run_id"]) == [], "processes left behind"
    assert leftovers(info["tag"]) == {"namespaces": [], "links": []}


def test_a_signal_during_teardown_is_held_then_acted_on() -> None:
    """Seen in CI: a Ctrl-C that landed while the reference run was torn down was ignored, and
    the demo went on to the faulted run and exited 0. It is held, then raised once teardown is
    done; while an interruption is already unwinding, it is not raised again."""
    from shadowgrad.bmv2_testbed.runner import Runner

    runner = Runner.__new__(Runner)  # only _teardown is exercised
    before = signal.getsignal(signal.SIGINT)

    def teardown_all() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler runs here: held, teardown goes on
        calls.append("done")

    calls: list[str] = []
    runner._teardown_all = teardown_all  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt, match="during teardown"):
        runner._teardown()
    assert calls == ["done"]

    def interrupted() -> None:
        try:
            raise RuntimeError("first")
        finally:
            runner._teardown()

    with pytest.raises(RuntimeError, match="first"):
        interrupted()
    assert calls == ["done", "done"]
    assert signal.getsignal(signal.SIGINT) is before


def test_target_bmv2_without_the_binaries_fails_at_once(tmp_path: Path) -> None:
    if shutil.which("p4c") and shutil.which("simple_switch_grpc"):
        pytest.skip("real bmv2 is installed")
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            CLI,
            "demo",
            str(SCEN / "t-default.toml"),
            "--target",
            "bmv2",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and time.monotonic() - t0 < 30
    assert "--target bmv2: p4c and simple_switch_grpc are not on PATH" in proc.stderr


def test_scenario_errors_name_the_key_and_the_value(tmp_path: Path) -> None:
    from shadowgrad.bmv2_testbed.scenario import ScenarioError, load_scenario, parse_scenario

    sc = load_scenario(ROOT / "scenarios" / "default.toml")
    assert (
        sc.trainers == 4
        and sc.shadows == 4
        and [f.kind for f in sc.faults] == ["kill_trainer", "kill_shadow"]
    )
    for shipped in (ROOT / "scenarios").glob("*.toml"):
        load_scenario(shipped)
    cases = [
        ({"name": "x", "trainers": 5}, "trainers = 5: must divide"),
        ({"name": "x", "faults": [{"kind": "explode"}]}, "faults[0].kind = 'explode'"),
        ({"name": "x", "faults": [{"kind": "kill_trainer", "target": 9}]}, "faults[0].target = 9"),
        (
            {
                "name": "x",
                "mode": "mirror",
                "faults": [{"kind": "loss", "target": 0, "percent": 2}],
            },
            "needs mode = 'in-band'",
        ),
        ({"name": "x", "colour": 1}, "unknown key 'colour'"),
        ({"name": "x", "sleep": 5}, "sleep"),
    ]
    for doc, msg in cases:
        with pytest.raises(
            (ScenarioError, Exception),
            match=msg.replace("[", r"\[")
            .replace("]", r"\]")
            .replace("(", r"\(")
            .replace(")", r"\)"),
        ):
            parse_scenario(doc)
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ScenarioError, match="invalid TOML"):
        load_scenario(bad)
