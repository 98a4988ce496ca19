"""The Mininet topology (issue 24): the P4RuntimeSwitch/P4Host node classes on a real Mininet
(Debian's, linked into the venv by ``make install``), ``shadowgrad demo --topology mininet``
bit-exact with its faults, ``--cli`` driven through stdin (``pingall`` reaches every host,
leaving the CLI tears everything down), and a signal mid-scenario; after each, no process,
namespace, veth or Mininet interface of the run is left. Root and Mininet only: skips
otherwise."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_demo import CLI, SCEN, _check, _demo, _marked

ROOT = Path(__file__).resolve().parents[1]
WIRE = ROOT / "tests" / "p4progs" / "wire.p4"


def _why_not() -> str | None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "needs root and iproute2"
    from shadowgrad.bmv2_testbed.topology import can_mininet

    return can_mininet()


_WHY = _why_not()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(_WHY is not None, reason=str(_WHY))]


def _mininet_shells(tag: str) -> list[int]:
    """Mininet node shells (``bash ... mininet:NAME``) of a net whose switch is ``sg<tag>``."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a == f"mininet:sg{tag}".encode() for a in argv):
            found.append(int(p.name))
    return found


def test_switch_class_runs_the_target_on_mininet_interfaces() -> None:
    """A two-host Mininet behind P4RuntimeSwitch(sw_path='sg-switch-grpc', json_path=a
    program): the tutorials' command line (``-i N@sX-ethN``, ``--device-id``, the program,
    ``-- --grpc-server-addr``), the hosts configured as the netns topology does, h1 pings h2
    through the program, and close() leaves nothing."""
    from shadowgrad.bmv2_testbed.p4_mininet import MininetNet
    from shadowgrad.bmv2_testbed.topology import leftovers

    tag = f"{os.getpid() % 0xFFFF:04x}"
    net = MininetNet(
        [(1, "10.0.0.1", 0x020000000001), (2, "10.0.0.2", 0x020000000002)],
        {1: "h1", 2: "h2"},
        tag=tag,
        json_path=str(WIRE),
        cpu_port=255,
        device_id=3,
    )
    try:
        sw = net.switch
        argv = sw.argv()
        assert argv[0].endswith("sg-switch-grpc")
        i = [argv[k + 1] for k, a in enumerate(argv) if a == "-i"]
        assert i == [f"1@sg{tag}-eth1", f"2@sg{tag}-eth2"], argv
        assert argv[argv.index("--device-id") + 1] == "3" and str(WIRE) in argv
        tail = argv[argv.index("--") :]
        assert tail == [
            "--",
            "--grpc-server-addr",
            f"127.0.0.1:{sw.grpc_port}",
            "--cpu-port",
            "255",
        ]
        assert sw.proc is not None and sw.proc.poll() is None
        assert net.switch_if == {1: f"sg{tag}-eth1", 2: f"sg{tag}-eth2"}
        h1 = net.hosts[1]
        assert "mtu 9000" in h1.cmd("ip link show eth0")
        assert "PERMANENT" in h1.cmd("ip neigh show 10.0.0.2")
        assert "tx-checksumming: off" in h1.cmd("ethtool -k eth0")
        assert h1.cmd("cat /proc/sys/net/ipv6/conf/all/disable_ipv6").strip() == "1"
        out = h1.cmd("ping -c 3 -i 0.2 -W 2 10.0.0.2")
        assert " 0% packet loss" in out, out
        assert leftovers(tag)["links"], "the switch's interfaces are not named sg<tag>-ethN"
        proc = sw.proc
    finally:
        net.close()
    assert proc.poll() is not None
    assert leftovers(tag) == {"namespaces": [], "links": []}
    assert _mininet_shells(tag) == []


def _left(out: Path) -> dict[str, Any]:
    from shadowgrad.bmv2_testbed.topology import leftovers

    info = json.loads((out / "topology.json").read_text())
    time.sleep(0.5)
    return {
        "processes": _marked(info["run_id"]),
        **leftovers(info["tag"]),
        "shells": _mininet_shells(info["tag"]),
    }


_NOTHING = {"processes": [], "namespaces": [], "links": [], "shells": []}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """t-default and t-loss share their reference and plain runs."""
    return tmp_path_factory.mktemp("mininet-cache")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_default_scenario_in_mininet(tmp_path: Path, cache: Path) -> None:
    rep = _demo(tmp_path / "out", "t-default", "--topology", "mininet", cache=cache)
    s = _check(rep)
    assert rep["record"]["topology"] == "mininet"
    assert [f["kind"] for f in s["faults"]] == ["kill_trainer", "kill_shadow"]
    assert s["faults"][0]["detect_s"] is not None and s["faults"][1]["detect_s"] is not None
    assert rep["record"]["switch"]["replicated_bytes"] > 0
    assert "topology mininet" in rep["_stderr"]
    assert _left(tmp_path / "out") == _NOTHING


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_loss_scenario_in_mininet(tmp_path: Path, cache: Path) -> None:
    rep = _demo(tmp_path / "out", "t-loss", "--topology", "mininet", cache=cache)
    _check(rep)
    rec = rep["record"]
    assert rec["switch"]["emulated_loss"] > 0, rec["switch"]
    assert rec["shadow_repaired_bytes"] > 0
    assert _left(tmp_path / "out") == _NOTHING


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cli_pingall_reaches_every_host_and_leaving_it_tears_down(
    tmp_path: Path, cache: Path
) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            CLI,
            "demo",
            str(SCEN / "t-default.toml"),
            "--topology",
            "mininet",
            "--cli",
            "--out",
            str(out),
            "--cache",
            str(cache),
        ],
        input="pingall\ntrainer0 ip -s link show eth0\nexit\n",
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both[-4000:]
    # 4 trainers + 4 shadows: 8 x 7 pings, every one answered, through the P4 switch
    assert "*** Results: 0% dropped (56/56 received)" in both, both[-4000:]
    assert "mtu 9000" in both  # trainer0's eth0
    assert "Mininet's CLI is open" in proc.stderr
    assert both.count("*** Results:") == 1  # Mininet's output once, not twice
    assert "bit-exact resume: yes" in proc.stdout and "result: OK" in proc.stdout
    # the progress output: which run, iterations of the total, the faults as they happened
    assert "run: 150 iterations (the faulted run: kill_trainer, kill_shadow)" in proc.stderr
    assert "fault kill_trainer (rank 2) injected at iteration" in proc.stderr
    assert _left(out) == _NOTHING


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.timeout(600)
def test_a_signal_mid_scenario_leaves_nothing_behind_in_mininet(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "out"
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [
                CLI,
                "demo",
                str(SCEN / "t-default.toml"),
                "--topology",
                "mininet",
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
        while time.monotonic() < deadline:
            logs = list(out.glob("*/rank0-0.log"))
            if topo.exists() and logs and "step 5 " in logs[0].read_text(errors="replace"):
                break
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:] if proc.stdout else ""
            time.sleep(0.2)
        info = json.loads(topo.read_text())
        assert _marked(info["run_id"]), "nothing was running"
        assert _mininet_shells(info["tag"]), "no Mininet nodes were up"
        proc.send_signal(sig)
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert rc != 0
    assert _left(out) == _NOTHING


def test_cli_needs_the_mininet_topology(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            *(CLI, "demo", str(SCEN / "t-default.toml"), "--topology", "netns", "--cli"),
            *("--out", str(tmp_path / "out"), "--no-progress"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "--cli opens Mininet's CLI: it needs --topology mininet" in proc.stderr


def test_mininet_is_importable_from_the_venv_and_nothing_else_of_the_system() -> None:
    """make install links Debian's Mininet package only (tools/system_mininet.py): the venv's
    interpreter imports it, without dist-packages on its path."""
    code = (
        "import sys, mininet.net, mininet.node; "
        "assert not any('dist-packages' in p for p in sys.path), sys.path; "
        "print(mininet.net.VERSION, mininet.net.__file__)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr
    version, path = r.stdout.split()
    assert version == "2.3.0" and "system-mininet" in path, r.stdout


def test_the_tutorials_compile_and_push_workflow_on_the_target(tmp_path: Path) -> None:
    """p4lang/tutorials' Makefile compiles with ``$(P4C) --p4v 16 --p4runtime-files
    build/X.p4.p4info.txtpb -o build/X.json X.p4``; run_exercise.py starts the switch and its
    controller pushes build/X.json as the P4Runtime device config with the P4Info text. The
    same on shadowgrad-p4c and sg-switch-grpc, with the switch started by P4RuntimeSwitch
    (``--no-p4``), then h1 pings h2 through the pushed program."""
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2

    from shadowgrad.bmv2_testbed.p4_mininet import MininetNet
    from shadowgrad.bmv2_testbed.topology import leftovers
    from shadowgrad.controller.p4runtime import P4RuntimeClient

    shutil.copy(WIRE, tmp_path / "wire.p4")
    p4c = str(Path(sys.executable).parent / "shadowgrad-p4c")
    r = subprocess.run(
        [
            p4c,
            "--p4v",
            "16",
            "--p4runtime-files",
            "build/wire.p4.p4info.txtpb",
            "-o",
            "build/wire.json",
            "wire.p4",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    p4info = text_format.Parse(
        (tmp_path / "build" / "wire.p4.p4info.txtpb").read_text(), p4info_pb2.P4Info()
    )
    tag = f"{(os.getpid() + 1) % 0xFFFF:04x}"
    net = MininetNet(
        [(1, "10.0.0.1", 0x020000000001), (2, "10.0.0.2", 0x020000000002)],
        {1: "h1", 2: "h2"},
        tag=tag,
    )
    try:
        h1 = net.hosts[1]
        assert " 0% packet loss" not in h1.cmd("ping -c 1 -W 1 10.0.0.2")  # no program yet
        with P4RuntimeClient(net.grpc_addr, device_id=net.switch.device_id) as client:
            client.connect(wait_s=30)
            client.set_pipeline(p4info, (tmp_path / "build" / "wire.json").read_bytes())
            out = h1.cmd("ping -c 3 -i 0.2 -W 2 10.0.0.2")
        assert " 0% packet loss" in out, out
    finally:
        net.close()
    assert leftovers(tag) == {"namespaces": [], "links": []}


@pytest.mark.bmv2
@pytest.mark.skipif(
    shutil.which("p4c") is None or shutil.which("simple_switch_grpc") is None,
    reason="needs the real p4c and simple_switch_grpc on PATH",
)
def test_the_same_switch_class_runs_real_simple_switch_grpc(tmp_path: Path) -> None:
    """Where bmv2 is installed: the same P4RuntimeSwitch with sw_path='simple_switch_grpc' and
    p4c's JSON of the wire program forwards h1 <-> h2 (not run on the development machine,
    which has no bmv2)."""
    from shadowgrad.bmv2_testbed.p4_mininet import MininetNet
    from shadowgrad.bmv2_testbed.topology import leftovers

    r = subprocess.run(
        ["p4c", "--target", "bmv2", "--arch", "v1model", "-o", str(tmp_path), str(WIRE)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    tag = f"{(os.getpid() + 2) % 0xFFFF:04x}"
    net = MininetNet(
        [(1, "10.0.0.1", 0x020000000001), (2, "10.0.0.2", 0x020000000002)],
        {1: "h1", 2: "h2"},
        tag=tag,
        sw_path="simple_switch_grpc",
        json_path=str(tmp_path / "wire.json"),
    )
    try:
        out = net.hosts[1].cmd("ping -c 3 -i 0.2 -W 2 10.0.0.2")
        assert " 0% packet loss" in out, out
    finally:
        net.close()
    assert leftovers(tag) == {"namespaces": [], "links": []}
