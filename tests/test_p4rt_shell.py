"""p4runtime-shell against the running target: ``p4runtime-sh --grpc-addr 127.0.0.1:PORT
--device-id 0 --election-id 0,1 --config build/x.p4info.txtpb,build/x.bin`` pushes the pipeline,
then a scripted session inserts a table entry and a multicast group and reads them back.

p4runtime-shell 0.0.6 ships no console script; ``p4runtime-sh`` is ``python -m p4runtime_sh``.
Both its REPL (script on stdin) and its Python API are driven in subprocesses, because its
``setup()`` calls ``sys.exit`` on failure.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import text_format

from shadowgrad.p4target.dataplane import Pipeline
from shadowgrad.p4target.process import stop_process, wait_switch_ready
from shadowgrad.testing.processes import spawn_switch

ROOT = Path(__file__).resolve().parents[1]
PROG = ROOT / "tests" / "p4progs" / "rt_l2l3.p4"


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("build")
    pipe = Pipeline.compile(PROG)
    info = d / "rt_l2l3.p4info.txtpb"
    info.write_text(text_format.MessageToString(pipe.p4info))
    blob = d / "rt_l2l3.bin"
    blob.write_bytes(pipe.to_device_config())
    return info, blob


@pytest.fixture
def target() -> Iterator[str]:
    """``sg-switch-grpc --no-p4`` in a subprocess; yields its gRPC address."""
    p = spawn_switch(
        "--no-p4",
        "--loopback-port",
        "1@127.0.0.1:0",
        "--loopback-port",
        "2@127.0.0.1:0",
        "--device-id",
        "0",
        "--thrift-port",
        "9090",
        "-L",
        "warn",
    )
    try:
        yield wait_switch_ready(p)
    finally:
        stop_process(p)
        assert p.returncode == 0, (p.stderr.read() if p.stderr else "")[-2000:]


def _run_ok(argv: list[str], stdin: str | None = None) -> str:
    """Run ``argv`` (2 minutes at most), asserting that it exits 0; its stdout and stderr."""
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    return out


REPL_SCRIPT = """\
te = table_entry["MyIngress.ipv4_lpm"](action="MyIngress.ipv4_forward")
te.match["hdr.ipv4.dstAddr"] = "10.0.0.2/32"
te.action["dstAddr"] = "00:00:00:00:00:02"
te.action["port"] = "2"
te.insert()
mg = multicast_group_entry(7).add(1, 1).add(2, 2)
mg.insert()
print("TE", [(e.msg().match[0].lpm.value.hex(), e.msg().match[0].lpm.prefix_len) for e in table_entry["MyIngress.ipv4_lpm"].read()])
print("MG", [(g.group_id, [(r.egress_port, r.instance) for r in g.replicas]) for g in multicast_group_entry(0).read()])
print("VERSION", APIVersion())
"""  # noqa: E501


def test_p4runtime_sh_repl_session(target: str, artefacts: tuple[Path, Path]) -> None:
    info, blob = artefacts
    shell = [sys.executable, "-m", "p4runtime_sh", "--grpc-addr", target, "--device-id", "0"]
    out = _run_ok([*shell, "--election-id", "0,1", "--config", f"{info},{blob}"], REPL_SCRIPT)
    # each output line follows the REPL prompt ("P4Runtime sh >>> ")
    assert "TE [('0a000002', 32)]" in out, out[-3000:]
    assert "MG [(7, [(1, 1), (2, 2)])]" in out, out[-3000:]
    assert "VERSION 1.3.0" in out, out[-3000:]


API_SCRIPT = """
import sys
import p4runtime_sh.shell as sh
addr, info, blob = sys.argv[1:4]
sh.setup(device_id=0, grpc_addr=addr, election_id=(0, 1),
         config=sh.FwdPipeConfig(info, blob), verbose=False)
try:
    te = sh.TableEntry("MyIngress.acl")(action="MyIngress.drop")
    te.match["hdr.ipv4.dstAddr"] = "10.0.0.0&&&255.0.0.0"
    te.priority = 10
    te.insert()
    sh.MulticastGroupEntry(3).add(1, 5).insert()
    sh.CloneSessionEntry(9).add(2, 0).insert()
    acl = list(sh.TableEntry("MyIngress.acl").read())
    print("ACL", len(acl), acl[0].priority)
    print("MG", [(r.egress_port, r.instance) for g in sh.MulticastGroupEntry(3).read()
                 for r in g.replicas])
    print("CS", [g.session_id for g in sh.CloneSessionEntry(0).read()])
    cnt = []
    sh.CounterEntry("MyIngress.port_rx").read(lambda c: cnt.append(c))
    print("CNT", len(cnt))
    try:
        te.insert()
    except Exception as e:
        print("DUP", type(e).__name__, "ALREADY_EXISTS" in str(e))
finally:
    sh.teardown()
"""


def test_p4runtime_sh_python_api(target: str, artefacts: tuple[Path, Path]) -> None:
    info, blob = artefacts
    out = _run_ok([sys.executable, "-c", API_SCRIPT, target, str(info), str(blob)])
    assert "ACL 1 10" in out, out[-3000:]
    assert "MG [(1, 5)]" in out
    assert "CS [9]" in out
    assert "CNT 512" in out
    assert "DUP P4RuntimeWriteException True" in out
