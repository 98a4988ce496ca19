"""``shadowgrad-run-exercise``'s file handling, without a network (any user): the tutorials'
``topology.json`` and ``sN-runtime.json`` formats, value encoding as their
``convert.encode`` does it, and the one-line errors for bad files. The runs themselves (root,
Mininet) are in tests/test_mininet.py."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shadowgrad.bmv2_testbed.exercise import (
    ExerciseError,
    encode_value,
    load_runtime,
    load_topology,
)

ROOT = Path(__file__).resolve().parents[1]
BASIC = ROOT / "tests" / "p4progs" / "basic.p4"
P4C = str(Path(sys.executable).parent / "shadowgrad-p4c")


def compile_as_the_tutorials(
    folder: Path, program: str, p4c: str = P4C, env: dict[str, str] | None = None
) -> None:
    """``program`` (a ``.p4`` in ``folder``) compiled by the tutorials' Makefile's command
    line with ``p4c`` as its P4C (``env`` its environment, where given): the P4Info in
    ``build/<program>.p4info.txtpb``, the JSON in ``build/<name>.json``."""
    name = program.removesuffix(".p4")
    r = subprocess.run(
        [
            *(p4c, "--p4v", "16"),
            *("--p4runtime-files", f"build/{program}.p4info.txtpb"),
            *("-o", f"build/{name}.json", program),
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr


def test_encode_value_as_the_tutorials_convert_does() -> None:
    assert encode_value(1, 9, "x") == b"\x00\x01"
    assert encode_value([7], 8, "x") == b"\x07"
    assert encode_value(-1, 16, "x") == b"\xff\xff"
    assert encode_value("08:00:00:00:01:11", 48, "x") == bytes.fromhex("080000000111")
    assert encode_value("10.0.1.1", 32, "x") == bytes([10, 0, 1, 1])
    assert encode_value("2001:db8::1", 128, "x") == bytes.fromhex("20010db8" + "0" * 23 + "1")
    with pytest.raises(ExerciseError, match=r"^a\.b: 512 does not fit in 9 bits$"):
        encode_value(512, 9, "a.b")
    with pytest.raises(ExerciseError, match="is 32 bits wide, the field 48 bits"):
        encode_value("10.0.1.1", 48, "x")
    with pytest.raises(ExerciseError, match="not a number, MAC, IPv4 or IPv6"):
        encode_value("08:00:00:00:01", 48, "x")
    with pytest.raises(ExerciseError, match="not a number"):
        encode_value(True, 1, "x")
    with pytest.raises(ExerciseError, match="not an IPv4 address"):
        encode_value("10.0.1.300", 32, "x")


def _topo(tmp: Path, **over: Any) -> Path:
    doc: dict[str, Any] = {
        "hosts": {
            "h1": {"ip": "10.0.1.1/24", "mac": "08:00:00:00:01:11", "commands": ["true"]},
            "h2": {"ip": "10.0.2.2/24", "mac": "08:00:00:00:02:22"},
        },
        "switches": {"s1": {"runtime_json": "s1-runtime.json"}, "s2": {"cpu_port": "510"}},
        "links": [["h1", "s1-p1"], ["s2-p1", "h2"], ["s2-p2", "s1-p3", "0ms"]],
    }
    doc.update(over)
    p = tmp / "topology.json"
    p.write_text(json.dumps(doc))
    return p


def test_a_topology_in_the_tutorials_format(tmp_path: Path) -> None:
    t = load_topology(_topo(tmp_path))
    assert list(t.switches) == ["s1", "s2"]
    assert t.switches["s2"]["cpu_port"] == 510  # the tutorials write it as a string
    ends = [(ln.node1, ln.port1, ln.node2, ln.port2) for ln in t.links]
    assert ends == [("s1", 1, "h1", None), ("s2", 1, "h2", None), ("s1", 3, "s2", 2)]


def test_link_latency_and_bandwidth_are_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    links = [["h1", "s1-p1", "0ms"], ["h2", "s2-p1", 5, 100], ["s1-p2", "s2-p2"]]
    with caplog.at_level(logging.WARNING):
        t = load_topology(_topo(tmp_path, links=links))
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "links[1]: latency 5ms / bandwidth 100 ignored" in warned[0]
    assert t.links[1].latency == "5ms" and t.links[1].bandwidth == 100.0


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"links": [["h1", "s9-p1"], ["h2", "s1-p2"]]}, "links[0]: 's9-p1': no switch 's9'"),
        ({"links": [["h1", "s1-x"], ["h2", "s1-p2"]]}, "'s1-x' is neither a host"),
        ({"links": [["h1", "s1-p1"], ["h2", "s1-p1"]]}, "port 1 of 's1' is already used"),
        ({"links": [["h1", "h2"]]}, "hosts are connected to switches, not to each other"),
        ({"links": [["h1", "s1-p1"]]}, "host 'h2' has no link"),
        (
            {"links": [["h1", "s1-p1"], ["h1", "s1-p2"], ["h2", "s2-p1"]]},
            "host 'h1' has a second link",
        ),
        ({"hosts": {"h1": {"ip": "10.0.1.300/24"}}}, "hosts.h1.ip: '10.0.1.300/24' is not"),
        ({"switches": {"s1": {"cli_input": "s1-commands.txt"}}}, "simple_switch_CLI"),
        ({"switches": {}}, "no switches"),
        ({"links": {}}, "'links' is a list"),
    ],
)
def test_a_bad_topology_is_one_precise_error(
    tmp_path: Path, over: dict[str, Any], message: str
) -> None:
    with pytest.raises(ExerciseError) as e:
        load_topology(_topo(tmp_path, **over))
    assert message in str(e.value)
    assert str(e.value).startswith(str(tmp_path / "topology.json"))


def test_topology_file_that_is_not_json(tmp_path: Path) -> None:
    p = tmp_path / "topology.json"
    p.write_text('{"hosts": {},\n  oops}')
    with pytest.raises(ExerciseError, match=r"topology\.json:2:3: not JSON"):
        load_topology(p)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An exercise folder with basic.p4 compiled as the tutorials' Makefile does."""
    d = tmp_path_factory.mktemp("basic")
    (d / "basic.p4").write_text(BASIC.read_text())
    compile_as_the_tutorials(d, "basic.p4")
    return d


def _runtime(folder: Path, name: str, entries: list[Any], **over: Any) -> Path:
    doc: dict[str, Any] = {
        "target": "bmv2",
        "p4info": "build/basic.p4.p4info.txtpb",
        "bmv2_json": "build/basic.json",
        "table_entries": entries,
    }
    doc.update(over)
    p = folder / name
    p.write_text(json.dumps(doc))
    return p


_DEFAULT = {
    "table": "MyIngress.ipv4_lpm",
    "default_action": True,
    "action_name": "MyIngress.drop",
    "action_params": {},
}
_ROUTE = {
    "table": "MyIngress.ipv4_lpm",
    "match": {"hdr.ipv4.dstAddr": ["10.0.2.2", 32]},
    "action_name": "MyIngress.ipv4_forward",
    "action_params": {"dstAddr": "08:00:00:00:02:22", "port": 2},
}


def test_a_runtime_file_becomes_p4runtime_updates(compiled: Path) -> None:
    from p4.v1 import p4runtime_pb2

    p = _runtime(
        compiled,
        "s1-runtime.json",
        [_DEFAULT, _ROUTE],
        multicast_group_entries=[
            {"multicast_group_id": 1, "replicas": [{"egress_port": 1, "instance": 1}]}
        ],
        clone_session_entries=[
            {"clone_session_id": 5, "replicas": [{"egress_port": 2, "instance": 1}]}
        ],
    )
    prog = load_runtime(p)
    assert prog.device_config == (compiled / "build" / "basic.json").read_bytes()
    assert [t.preamble.name for t in prog.p4info.tables] == ["MyIngress.ipv4_lpm"]
    descs = [d for d, _ in prog.updates]
    assert descs == [
        "MyIngress.ipv4_lpm: (default action) => MyIngress.drop()",
        "MyIngress.ipv4_lpm: hdr.ipv4.dstAddr=['10.0.2.2', 32] => "
        "MyIngress.ipv4_forward(dstAddr=08:00:00:00:02:22, port=2)",
        "Group 1 => (1)",
        "Clone Session 5 => (2) (NO_TRUNCATION)",
    ]
    ups = [u for _, u in prog.updates]
    assert ups[0].type == p4runtime_pb2.Update.MODIFY
    assert ups[0].entity.table_entry.is_default_action
    route = ups[1].entity.table_entry
    assert ups[1].type == p4runtime_pb2.Update.INSERT
    assert route.match[0].lpm.value == bytes([10, 0, 2, 2])
    assert route.match[0].lpm.prefix_len == 32
    assert [p.value for p in route.action.action.params] == [
        bytes.fromhex("080000000222"),
        b"\x00\x02",
    ]
    pre = ups[2].entity.packet_replication_engine_entry.multicast_group_entry
    assert pre.multicast_group_id == 1
    assert (pre.replicas[0].egress_port, pre.replicas[0].instance) == (1, 1)


def _with(**over: Any) -> dict[str, Any]:
    return {**_ROUTE, **over}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (_with(table="MyIngress.nope"), "no table 'MyIngress.nope' in"),
        (_with(match={"hdr.ipv4.srcAddr": ["10.0.2.2", 32]}), "has no match field"),
        (_with(match={"hdr.ipv4.dstAddr": "10.0.2.2"}), "lpm match: a pair [value, prefix length]"),
        (_with(match={"hdr.ipv4.dstAddr": ["10.0.2.2", 33]}), "prefix length 33 is not"),
        (_with(action_params={"dstAddr": "08:00:00:00:02:22"}), "missing: port"),
        (_with(action_params={**_ROUTE["action_params"], "x": 1}), "unknown: x"),
        (
            _with(action_params={"dstAddr": "08:00:00:00:02:22", "port": 512}),
            "action_params.port: 512 does not fit in 9 bits",
        ),
        (_with(action_name="MyIngress.nope"), "no action 'MyIngress.nope'"),
        ({**_DEFAULT, "match": _ROUTE["match"]}, "a default_action entry has no match"),
        ({"table": "MyIngress.ipv4_lpm"}, "missing 'action_name'"),
    ],
)
def test_a_bad_runtime_entry_is_one_precise_error(
    compiled: Path, entry: dict[str, Any], message: str
) -> None:
    p = _runtime(compiled, "bad-runtime.json", [_DEFAULT, entry])
    with pytest.raises(ExerciseError) as e:
        load_runtime(p)
    assert str(e.value).startswith(f"{p}: table_entries[1]"), str(e.value)
    assert message in str(e.value)


def test_a_bad_runtime_file_is_one_precise_error(compiled: Path) -> None:
    p = _runtime(compiled, "r.json", [], target="tofino")
    with pytest.raises(ExerciseError, match="'target' is 'tofino'"):
        load_runtime(p)
    p = _runtime(compiled, "r.json", [], bmv2_json="build/missing.json")
    with pytest.raises(ExerciseError, match=r"bmv2_json: no file 'build/missing.json'"):
        load_runtime(p)
    p = _runtime(compiled, "r.json", [], p4info="")
    with pytest.raises(ExerciseError, match="missing key 'p4info' or empty value"):
        load_runtime(p)
    p = _runtime(
        compiled,
        "r.json",
        [],
        multicast_group_entries=[{"multicast_group_id": 1, "replicas": [{"instance": 1}]}],
    )
    with pytest.raises(ExerciseError, match=r"multicast_group_entries\[0\]\.replicas\[0\]"):
        load_runtime(p)
