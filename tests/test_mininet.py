"""The Mininet topology (issue 24): the P4RuntimeSwitch/P4Host node classes on a real Mininet
(Debian's, linked into the venv by ``make install``), ``shadowgrad demo --topology mininet``
bit-exact with its faults, ``--cli`` driven through stdin (``pingall`` reaches every host,
leaving the CLI tears everything down), and a signal mid-scenario; after each, no process,
namespace, veth or Mininet interface of the run is left. Root and Mininet only: skips
otherwise."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.test_demo import CLI, SCEN, _check, _demo, _marked, _pids_where, _signal_mid_scenario
from tests.test_exercise import compile_as_the_tutorials

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
    return _pids_where("cmdline", lambda argv: f"mininet:sg{tag}".encode() in argv.split(b"\0"))


def test_switch_class_runs_the_target_on_mininet_interfaces(tmp_path: Path) -> None:
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
        log_file=str(tmp_path / "switch.log"),  # not the tutorials' /tmp/p4s.NAME.log
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
    rc, _, out = _signal_mid_scenario(tmp_path, "mininet", sig, _mininet_shells, "Mininet nodes")
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
    compile_as_the_tutorials(tmp_path, "wire.p4")
    p4info = text_format.Parse(
        (tmp_path / "build" / "wire.p4.p4info.txtpb").read_text(), p4info_pb2.P4Info()
    )
    tag = f"{(os.getpid() + 1) % 0xFFFF:04x}"
    net = MininetNet(
        [(1, "10.0.0.1", 0x020000000001), (2, "10.0.0.2", 0x020000000002)],
        {1: "h1", 2: "h2"},
        tag=tag,
        log_file=str(tmp_path / "switch.log"),
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
        log_file=str(tmp_path / "switch.log"),
    )
    try:
        out = net.hosts[1].cmd("ping -c 3 -i 0.2 -W 2 10.0.0.2")
        assert " 0% packet loss" in out, out
    finally:
        net.close()
    assert leftovers(tag) == {"namespaces": [], "links": []}


# ------------------------------------------------------------------ the tutorials' run_exercise
BASIC = ROOT / "tests" / "p4progs" / "basic.p4"
VENV_BIN = Path(sys.executable).parent


def _exercise_folder(where: Path, sw: str) -> Path:
    """A p4lang/tutorials exercise folder of our own (the layout of exercises/basic): the IPv4
    LPM program, topology.json with h1 and h2 behind switch ``sw`` (hosts configured by their
    ``commands`` as the tutorials' are: a default route and a static ARP entry for the
    gateway), and ``<sw>-runtime.json`` with a default action and one /32 route per host."""
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(BASIC, where / "basic.p4")
    hosts = {
        f"h{n}": {
            "ip": f"10.0.{n}.{n}/24",
            "mac": f"08:00:00:00:0{n}:{n}{n}",
            "commands": [
                f"route add default gw 10.0.{n}.{n}0 dev eth0",
                f"arp -i eth0 -s 10.0.{n}.{n}0 08:00:00:00:0{n}:00",
            ],
        }
        for n in (1, 2)
    }
    topo = {
        "hosts": hosts,
        "switches": {sw: {"runtime_json": f"{sw}-runtime.json"}},
        "links": [["h1", f"{sw}-p1"], ["h2", f"{sw}-p2", "0ms"]],
    }
    (where / "topology.json").write_text(json.dumps(topo, indent=2))
    entries: list[dict[str, Any]] = [
        {
            "table": "MyIngress.ipv4_lpm",
            "default_action": True,
            "action_name": "MyIngress.drop",
            "action_params": {},
        }
    ]
    for n in (1, 2):
        entries.append(
            {
                "table": "MyIngress.ipv4_lpm",
                "match": {"hdr.ipv4.dstAddr": [f"10.0.{n}.{n}", 32]},
                "action_name": "MyIngress.ipv4_forward",
                "action_params": {"dstAddr": f"08:00:00:00:0{n}:{n}{n}", "port": n},
            }
        )
    runtime = {
        "target": "bmv2",
        "p4info": "build/basic.p4.p4info.txtpb",
        "bmv2_json": "build/basic.json",
        "table_entries": entries,
    }
    (where / f"{sw}-runtime.json").write_text(json.dumps(runtime, indent=2))
    return where


def _exercise_env() -> dict[str, str]:
    # what `sudo PATH=$(PATH)` in the tutorials' Makefile gives, with the venv activated
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _compile_basic(folder: Path) -> None:
    """The tutorials' Makefile's compile command line, with P4C=shadowgrad-p4c."""
    (folder / "build").mkdir(exist_ok=True)
    compile_as_the_tutorials(folder, "basic.p4", "shadowgrad-p4c", _exercise_env())


def _processes_naming(text: str) -> list[int]:
    naming = _pids_where("cmdline", lambda argv: text.encode() in argv)
    return [p for p in naming if p != os.getpid()]


def _exercise_left(tag: str, shells: Sequence[int]) -> dict[str, Any]:
    """What is left of an exercise run whose switch is ``sg<tag>``: its switch process, its
    interfaces, the Mininet shells of the switch and of the hosts (by their PIDs)."""
    from shadowgrad.bmv2_testbed.topology import leftovers

    time.sleep(0.5)
    return {
        "processes": _processes_naming(f"sg{tag}-eth"),
        **leftovers(tag),
        "shells": _mininet_shells(tag) + [p for p in shells if Path(f"/proc/{p}").exists()],
    }


_NOTHING_OF_EXERCISE = {"processes": [], "namespaces": [], "links": [], "shells": []}
_CLI_INPUT = "h1 ping -c 3 h2\nh1 echo shell=$$\nh2 echo shell=$$\nexit\n"


def _check_exercise_run(folder: Path, tag: str, rc: int, out: str) -> None:
    assert rc == 0, out[-4000:]
    assert " 0% packet loss" in out and "3 received" in out, out[-4000:]
    assert f"sg{tag} -> gRPC port: " in out
    assert "h1: eth0 10.0.1.1 08:00:00:00:01:11" in out
    # the switch was programmed from its runtime file, its requests and log are where the
    # tutorials put them, and the switch wrote pcaps per interface into -p
    assert "Inserting 3 table entries" in out
    requests = (folder / "logs" / f"sg{tag}-p4runtime-requests.txt").read_text()
    assert "SetForwardingPipelineConfigRequest" in requests and "WriteRequest" in requests
    assert "pipeline committed" in (folder / "logs" / f"sg{tag}.log").read_text()
    assert (folder / "pcaps" / f"sg{tag}-eth1_in.pcap").stat().st_size > 24
    shells = [int(p) for p in re.findall(r"shell=(\d+)", out)]
    assert len(shells) == 2, out[-4000:]
    assert _exercise_left(tag, shells) == _NOTHING_OF_EXERCISE


def _run_exercise_cli(folder: Path, tag: str, *argv: str) -> None:
    """Run ``argv`` in the exercise ``folder`` with the CLI fed :data:`_CLI_INPUT`, then check
    the run (:func:`_check_exercise_run`)."""
    r = subprocess.run(
        list(argv),
        cwd=folder,
        env=_exercise_env(),
        input=_CLI_INPUT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    _check_exercise_run(folder, tag, r.returncode, r.stdout + r.stderr)


@pytest.mark.timeout(300)
def test_a_tutorials_exercise_runs_with_run_exercises_command_line(tmp_path: Path) -> None:
    """Issue 24's acceptance: in an exercise folder of p4lang/tutorials' layout, the
    Makefile's compile command line and run_exercise.py's command line (``-t topology.json
    -j build/basic.json -b sg-switch-grpc -l logs -p pcaps``) bring the network up on the
    project's switch, programmed from sN-runtime.json; ``h1 ping h2`` in the CLI succeeds, and
    leaving the CLI leaves nothing behind."""
    tag = f"{(os.getpid() + 3) % 0xFFFF:04x}"
    folder = _exercise_folder(tmp_path / "basic", f"sg{tag}")
    _compile_basic(folder)
    _run_exercise_cli(
        folder,
        tag,
        *("shadowgrad-run-exercise", "-t", "topology.json", "-j", "build/basic.json"),
        *("-b", "sg-switch-grpc", "-l", "logs", "-p", "pcaps"),
    )


# The tutorials' utils/Makefile recipe (build: dirs and `$(P4C) --p4v 16 --p4runtime-files ...
# -o build/X.json X.p4`; run: `python3 $(RUN_SCRIPT) -t $(TOPO) -j build/X.json -b
# $(BMV2_SWITCH_EXE)`), written here without its sudo (the test runs as root).
_MAKEFILE = """\
P4C = p4c-bm2-ss
RUN_SCRIPT = ../../utils/run_exercise.py
TOPO = topology.json
P4C_ARGS += --p4runtime-files build/$(basename $@).p4.p4info.txtpb
source = $(wildcard *.p4)
compiled_json := $(source:.p4=.json)
run_args += -j build/$(source:.p4=.json)
ifdef BMV2_SWITCH_EXE
run_args += -b $(BMV2_SWITCH_EXE)
endif

run: build
\tPATH=$(PATH) python3 $(RUN_SCRIPT) -t $(TOPO) $(run_args)

build: dirs $(compiled_json)

%.json: %.p4
\t$(P4C) --p4v 16 $(P4C_ARGS) -o build/$@ $<

dirs:
\tmkdir -p build pcaps logs
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_in_an_exercise_folder(tmp_path: Path) -> None:
    """``make run P4C=shadowgrad-p4c BMV2_SWITCH_EXE=sg-switch-grpc RUN_SCRIPT='-m
    shadowgrad.bmv2_testbed.exercise'`` with a Makefile of the tutorials' recipe: builds,
    runs, h1 pings h2, nothing left."""
    tag = f"{(os.getpid() + 4) % 0xFFFF:04x}"
    folder = _exercise_folder(tmp_path / "basic", f"sg{tag}")
    (folder / "Makefile").write_text(_MAKEFILE)
    _run_exercise_cli(
        folder,
        tag,
        *("make", "run", "P4C=shadowgrad-p4c", "BMV2_SWITCH_EXE=sg-switch-grpc"),
        "RUN_SCRIPT=-m shadowgrad.bmv2_testbed.exercise",
    )


@pytest.mark.timeout(300)
def test_run_exercise_tears_down_on_sigterm_at_the_cli(tmp_path: Path) -> None:
    tag = f"{(os.getpid() + 5) % 0xFFFF:04x}"
    folder = _exercise_folder(tmp_path / "basic", f"sg{tag}")
    _compile_basic(folder)
    proc = subprocess.Popen(
        ["shadowgrad-run-exercise", "-t", "topology.json", "-j", "build/basic.json", "-q"],
        cwd=folder,
        env=_exercise_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"h1 echo shell=$$\n")
        proc.stdin.flush()
        seen = b""
        deadline = time.monotonic() + 120
        while b"shell=" not in seen and time.monotonic() < deadline:
            chunk = proc.stdout.read1(4096)  # type: ignore[attr-defined]
            if not chunk:
                break
            seen += chunk
        assert b"shell=" in seen, seen.decode(errors="replace")[-3000:]
        assert _processes_naming(f"sg{tag}-eth"), "no switch was running"
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = (seen + rest).decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "signal 15; the network is torn down" in out
    shells = [int(p) for p in re.findall(r"shell=(\d+)", out)]
    assert _exercise_left(tag, shells) == _NOTHING_OF_EXERCISE


def test_run_exercise_reports_a_bad_runtime_file_in_one_line(tmp_path: Path) -> None:
    """A runtime file naming a table the program does not have: one error line that names the
    file, the entry and the tables there are; exit status 1; nothing was started."""
    tag = f"{(os.getpid() + 6) % 0xFFFF:04x}"
    folder = _exercise_folder(tmp_path / "basic", f"sg{tag}")
    _compile_basic(folder)
    rt = folder / f"sg{tag}-runtime.json"
    doc = json.loads(rt.read_text())
    doc["table_entries"][2]["table"] = "MyIngress.ipv4_exact"
    rt.write_text(json.dumps(doc))
    r = subprocess.run(
        ["shadowgrad-run-exercise", "-t", "topology.json", "-j", "build/basic.json"],
        cwd=folder,
        env=_exercise_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert (
        f"shadowgrad-run-exercise: error: sg{tag}-runtime.json: table_entries[2]: no table "
        f"'MyIngress.ipv4_exact' in " in r.stderr
    ), r.stderr
    assert "(it has: MyIngress.ipv4_lpm)" in r.stderr
    assert _exercise_left(tag, []) == _NOTHING_OF_EXERCISE
