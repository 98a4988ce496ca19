"""Golden P4Info: p4c's ids, names, aliases, match fields, action refs/scopes, defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("p4")

from google.protobuf import text_format

from shadowgrad.p4target.p4info import jenkins_one_at_a_time, p4_id
from shadowgrad.p4target.pipeline import P4CompileError, Pipeline
from shadowgrad.testing.v1model import v1switch

PROGS = Path(__file__).resolve().parent / "p4progs"

GOLDEN_BASIC = """
pkg_info { arch: "v1model" }
tables {
  preamble { id: 37375156 name: "MyIngress.ipv4_lpm" alias: "ipv4_lpm" }
  match_fields { id: 1 name: "hdr.ipv4.dstAddr" bitwidth: 32 match_type: LPM }
  action_refs { id: 28792405 }
  action_refs { id: 25652968 }
  action_refs { id: 21257015 }
  initial_default_action { action_id: 25652968 }
  size: 1024
}
actions {
  preamble {
    id: 21257015 name: "NoAction" alias: "NoAction" annotations: "@noWarn(\\"unused\\")"
  }
}
actions { preamble { id: 25652968 name: "MyIngress.drop" alias: "drop" } }
actions {
  preamble { id: 28792405 name: "MyIngress.ipv4_forward" alias: "ipv4_forward" }
  params { id: 1 name: "dstAddr" bitwidth: 48 }
  params { id: 2 name: "port" bitwidth: 9 }
}
"""


def test_jenkins_ids_match_p4c() -> None:
    assert p4_id("action", "NoAction") == 21257015
    assert p4_id("action", "IngressI.drop") == 23455883
    assert p4_id("table", "IngressI.indirect") == 46872340  # a table in that testdata
    assert p4_id("action_profile", "ap") == 294074782
    assert jenkins_one_at_a_time("") == 0


def test_basic_p4info_golden() -> None:
    p = Pipeline.compile(PROGS / "basic.p4")
    ids = {o.preamble.name: o.preamble.id for o in [*p.p4info.tables, *p.p4info.actions]}
    assert ids["MyIngress.ipv4_lpm"] == 37375156
    assert ids["MyIngress.ipv4_forward"] == 28792405
    assert ids["MyIngress.drop"] == 25652968
    assert ids["NoAction"] == 21257015
    golden = text_format.Parse(GOLDEN_BASIC, type(p.p4info)())
    assert p.p4info == golden, text_format.MessageToString(p.p4info)


def test_implicit_noaction_default_and_direct_counter() -> None:
    p = Pipeline.compile(PROGS / "l2.p4")
    (t,) = p.p4info.tables
    assert t.preamble.name == "L2Ingress.dmac" and t.preamble.alias == "dmac"
    assert t.size == 64
    noaction = next(a for a in p.p4info.actions if a.preamble.name == "NoAction")
    ref = next(r for r in t.action_refs if r.id == noaction.preamble.id)
    assert ref.scope == 2 and list(ref.annotations) == ["@defaultonly"]  # DEFAULT_ONLY
    assert t.initial_default_action.action_id == noaction.preamble.id
    (dc,) = p.p4info.direct_counters
    assert dc.preamble.name == "L2Ingress.dmac_counter"
    assert dc.preamble.id == p4_id("direct_counter", "L2Ingress.dmac_counter")
    assert dc.direct_table_id == t.preamble.id and list(t.direct_resource_ids) == [dc.preamble.id]
    assert dc.spec.unit == 1  # BOTH
    (c,) = p.p4info.counters
    assert (c.preamble.name, c.size, c.spec.unit) == ("L2Ingress.port_counter", 16, 1)
    assert c.preamble.id >> 24 == 0x12


def test_match_kinds_names_const_entries_and_controller_headers() -> None:
    p = Pipeline.compile(PROGS / "acl.p4")
    acl = next(t for t in p.p4info.tables if t.preamble.name == "AclIngress.acl")
    assert [(m.id, m.name, m.bitwidth, m.match_type) for m in acl.match_fields] == [
        (1, "hdr.ipv4.srcAddr", 32, 4),
        (2, "hdr.ipv4.protocol", 8, 4),
        (3, "dport", 16, 5),
    ]
    assert acl.const_default_action_id == 0
    cls = next(t for t in p.p4info.tables if t.preamble.name == "AclIngress.classify")
    assert cls.is_const_table and cls.has_initial_entries
    cph = {c.preamble.name: c for c in p.p4info.controller_packet_metadata}
    assert sorted(cph) == ["packet_in", "packet_out"]
    assert [(m.id, m.name, m.bitwidth) for m in cph["packet_in"].metadata] == [
        (1, "ingress_port", 9),
        (2, "_pad", 7),
    ]
    assert cph["packet_in"].preamble.id == p4_id("controller_header", "packet_in")


def test_registers_digests_name_and_id_annotations() -> None:
    src = (PROGS / "misc.p4").read_text()
    p = Pipeline.compile(PROGS / "misc.p4")
    (r,) = p.p4info.registers
    assert (r.preamble.name, r.size, r.type_spec.bitstring.bit.bitwidth) == (
        "MiscIngress.seen",
        8,
        16,
    )
    del src
    d = Pipeline.compile(PROGS / "pktio.p4").p4info.digests
    assert [x.preamble.name for x in d] == ["learn_t"]
    assert d[0].preamble.id == p4_id("digest", "learn_t")
    named = (
        (PROGS / "basic.p4")
        .read_text()
        .replace(
            "    table ipv4_lpm {", '    @name("routes") @id(0x02000001)\n    table ipv4_lpm {'
        )
        .replace("    action drop() {", '    @name(".global_drop")\n    action drop() {')
    )
    p2 = Pipeline.compile(named, include_dirs=[PROGS], filename="named.p4")
    (t,) = p2.p4info.tables
    assert (t.preamble.name, t.preamble.id) == ("MyIngress.routes", 0x02000001)
    names = {a.preamble.name for a in p2.p4info.actions}
    assert "global_drop" in names


def test_artefact_round_trip(tmp_path: Path) -> None:
    p = Pipeline.compile(PROGS / "l2.p4")
    blob = p.to_device_config()
    q = Pipeline.from_device_config(blob, p.p4info)
    assert q.p4info == p.p4info
    with pytest.raises(P4CompileError, match="does not match"):
        Pipeline.from_device_config(blob, Pipeline.compile(PROGS / "basic.p4").p4info)
    with pytest.raises(P4CompileError, match="bmv2 JSON"):
        Pipeline.from_device_config(b'{"header_types": []}')
    out = tmp_path / "l2.p4info.txtpb"
    p.write_p4info(out)
    assert text_format.Parse(out.read_text(), type(p.p4info)()) == p.p4info


def test_compile_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shadowgrad.p4target._compile_cmd import main

    out = tmp_path / "build"
    rc = main(
        [
            str(PROGS / "basic.p4"),
            "-o",
            str(out),
            "--p4runtime-files",
            f"{out}/basic.p4info.txtpb,{out}/basic.p4info.bin",
        ]
    )
    assert rc == 0
    blob = (out / "basic.bin").read_bytes()
    info = text_format.Parse(
        (out / "basic.p4info.txtpb").read_text(),
        Pipeline.compile(PROGS / "basic.p4").p4info.__class__(),
    )
    assert Pipeline.from_device_config(blob, info).p4info == info
    bad = tmp_path / "bad.p4"
    bad.write_text("#include <core.p4>\nheader h { bit<8> a }\n")
    assert main([str(bad), "-o", str(out)]) == 1
    assert capsys.readouterr().err.strip() == f"{bad}:2:21: expected ';', found '}}'"


def test_p4info_lists_direct_calls_annotations_and_key_enums() -> None:
    """As p4c writes them: an action's annotations (not @name/@id); an action called only
    directly from a control, without parameters; an action list entry's other annotations;
    a serializable enum that types a key, in type_info."""
    src = v1switch(
        """
enum bit<8> K { A = 1, B = 0xff }
header h_t { K k; bit<8> b; }
struct headers { h_t h; }
struct meta_t { }
""",
        ingress="""{
    @my_note("x y") @name("setb") action set_b(bit<8> v) { hdr.h.b = v; }
    action direct(bit<8> v) { hdr.h.b = v; }
    table t { key = { hdr.h.k: exact; } actions = { set_b; @whatever NoAction; } }
    apply { t.apply(); direct(3); }
}""",
    )
    p = Pipeline.compile(src, filename="anns.p4")
    acts = {a.preamble.name: a for a in p.p4info.actions}
    assert list(acts["I.setb"].preamble.annotations) == ['@my_note("x y")']
    assert list(acts["NoAction"].preamble.annotations) == ['@noWarn("unused")']
    assert not acts["I.direct"].params  # its argument is given at the call
    (t,) = p.p4info.tables
    refs = {r.id: list(r.annotations) for r in t.action_refs}
    assert refs[acts["NoAction"].preamble.id] == ["@whatever"]
    se = p.p4info.type_info.serializable_enums["K"]
    assert se.underlying_type.bitwidth == 8
    assert [(m.name, m.value) for m in se.members] == [("A", b"\x01"), ("B", b"\xff")]
