"""Front end: preprocessor, parser and checker diagnostics (``file:line:col: message``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("p4")

from shadowgrad.p4target.pipeline import P4CompileError, Pipeline

ROOT = Path(__file__).resolve().parents[1]
PROGS = ROOT / "tests" / "p4progs"

PRE = """#include <core.p4>
#include <v1model.p4>
header h_t { bit<8> a; bit<16> b; }
struct hs { h_t h; }
struct m_t { bit<8> x; }
parser P(packet_in pk, out hs hdr, inout m_t meta, inout standard_metadata_t sm) {
    state start { pk.extract(hdr.h); transition accept; }
}
control V(inout hs hdr, inout m_t meta) { apply { } }
control E(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) { apply { } }
control D(packet_out pk, in hs hdr) { apply { pk.emit(hdr.h); } }
"""
ING_EMPTY = "control I(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) { apply { } }\n"
POST = "\nV1Switch(P(), V(), I(), E(), V(), D()) main;\n"


def ing(body: str, locals_: str = "") -> str:
    """A program whose ingress apply body starts on line 15 (locals on line 13)."""
    return (
        PRE
        + "control I(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) {\n"
        + locals_
        + "\n    apply {\n"
        + body
        + "\n    }\n}\n"
        + POST
    )


def swap(old: str, new: str) -> str:
    assert old in PRE
    return PRE.replace(old, new) + ING_EMPTY + POST


TABLE = "    action a() { }\n    table t { key = { hdr.h.a: exact; } actions = { a; } }"

BAD: dict[str, tuple[str, str]] = {
    "width_mismatch": (
        ing("        hdr.h.a = hdr.h.b;"),
        "bad.p4:15:19: right-hand side has type bit<16>, expected bit<8>; an "
        "explicit cast is needed",
    ),
    "bit_condition": (
        ing("        if (hdr.h.a) { sm.egress_spec = 1; }"),
        "bad.p4:15:13: condition must be bool, not bit<8>",
    ),
    "undeclared": (ing("        sm.egress_spec = port;"), "bad.p4:15:26: undeclared name port"),
    "no_such_field": (ing("        hdr.h.c = 1;"), "bad.p4:15:15: header h_t has no field c"),
    "literal_overflow": (
        ing("        hdr.h.a = 256;"),
        "bad.p4:15:19: value 256 does not fit in bit<8>",
    ),
    "typed_literal_overflow": (
        ing("        hdr.h.a = 8w300;"),
        "bad.p4:15:19: value of '8w300' does not fit in bit<8>",
    ),
    "syntax": (ing("        hdr.h.a = ;"), "bad.p4:15:19: expected an expression, found ';'"),
    "unknown_type": (ing("        foo_t x;"), "bad.p4:15:9: unknown type foo_t"),
    "table_applied_twice": (
        ing("        t.apply();\n        t.apply();", TABLE),
        "bad.p4:17:9: table I.t is applied more than once (bmv2 allows one apply per control)",
    ),
    "bad_match_kind": (
        ing("        t.apply();", TABLE.replace("exact", "fuzzy")),
        "bad.p4:14:23: unknown match kind fuzzy",
    ),
    "two_lpm_keys": (
        ing("        t.apply();", TABLE.replace("hdr.h.a: exact;", "hdr.h.a: lpm; hdr.h.b: lpm;")),
        "bad.p4:14:5: table t has more than one lpm key (bmv2 allows one)",
    ),
    "deparser_assignment": (
        PRE.replace("apply { pk.emit(hdr.h); }", "apply { hdr.h.a = 1; }") + ING_EMPTY + POST,
        "bad.p4:11:47: assignments are not allowed in the deparser",
    ),
    "unaligned_header": (
        swap("bit<8> a; bit<16> b;", "bit<7> a; bit<16> b;"),
        "bad.p4:3:1: header h_t is 23 bits long, not a multiple of 8",
    ),
    "if_in_parser": (
        swap("state start { pk.extract(hdr.h);", "state start { if (true) { pk.extract(hdr.h); }"),
        "bad.p4:7:19: 'if' is not allowed in parser states on bmv2; use select",
    ),
    "unknown_state": (
        swap("transition accept; }", "transition parse_x; }"),
        "bad.p4:7:38: unknown parser state parse_x",
    ),
    "explicit_reject": (
        swap("transition accept; }", "transition reject; }"),
        "bad.p4:7:38: explicit 'reject' is not supported on bmv2; use verify(cond, error.X)",
    ),
    "header_stack": (
        swap("struct hs { h_t h; }", "struct hs { h_t h; bit<8>[4] st; }"),
        "bad.p4:4:20: a stack holds headers or header unions, not bit<8>",
    ),
    "varbit": (
        swap("bit<16> b;", "varbit<16> b;"),
        "bad.p4:7:19: extract of header h_t (with a varbit field) needs a length in bits",
    ),
    "meter": (
        ing("        sm.egress_spec = 1;", "    meter(8, MeterType.packets) m;"),
        "bad.p4:13:5: extern meter is not supported by this target",
    ),
    "action_param_assign": (
        ing("        a(1);", "    action a(bit<8> v) { v = 2; }"),
        "bad.p4:13:26: expression is not assignable (action parameters are read-only)",
    ),
    "missing_include": (
        '#include "nope.p4"\n' + ing(""),
        "bad.p4:1:1: cannot find include file 'nope.p4'",
    ),
    "unterminated_comment": (ing("        /* oops"), "bad.p4:15:1: unterminated comment"),
    "bool_to_bit": (
        ing("        hdr.h.a = hdr.h.isValid();"),
        "bad.p4:15:19: right-hand side has type bool, expected bit<8>",
    ),
    "i2e_clone_in_egress": (
        PRE.replace(
            "control E(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) { apply { } }",
            "control E(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) "
            "{ apply { clone(CloneType.I2E, 1); } }",
        )
        + ING_EMPTY
        + POST,
        "bad.p4:10:81: clone of type I2E is only allowed in the ingress control",
    ),
    "no_main": (PRE, "bad.p4:11:1: no 'main' instantiation of V1Switch(...) found"),
    "switch_label": (
        ing("        switch (t.apply().action_run) { b: { } }", TABLE),
        "bad.p4:16:41: b is not an action of table I.t",
    ),
    "default_action_not_listed": (
        ing(
            "        t.apply();",
            TABLE.replace("actions = { a; }", "actions = { a; } default_action = b();").replace(
                "    action a() { }", "    action a() { }\n    action b() { }"
            ),
        ),
        "bad.p4:15:75: default action b is not in the actions of table t",
    ),
    "sub_parser": (
        ing("        sm.egress_spec = 1;", "    P() p_inst;"),
        "bad.p4:13:5: instantiating parser P inside I is not supported (no "
        "sub-parsers on this target)",
    ),
    "sub_control_twice": (
        ing("        e.apply(hdr);\n        e.apply(hdr);", "    T() e;").replace(
            "control I(",
            "control T(inout hs hdr) {\n    table tt { actions = { NoAction; } }\n"
            "    apply { tt.apply(); }\n}\ncontrol I(",
            1,
        ),
        "bad.p4:20:9: control instance I.e (with tables) is applied more than once",
    ),
    "sub_control_arg_type": (
        ing("        e.apply(hdr, meta, meta);", "    E() e;"),
        "bad.p4:15:28: argument for inout parameter sm has type struct "
        "m_t, expected struct standard_metadata_t",
    ),
    "slice_out_of_range": (
        ing("        hdr.h.a = hdr.h.b[16:9];"),
        "bad.p4:15:26: slice [16:9] out of range for bit<16>",
    ),
    "wrong_arity": (
        ing("        mark_to_drop();"),
        "bad.p4:15:9: mark_to_drop takes 1 argument, 0 given",
    ),
    "for_loop": (
        ing("        for (bit<8> i = 0; i < 2; i = i + 1) { }"),
        "bad.p4:15:9: 'for' loops are not supported by this target",
    ),
    "direct_control_apply": (
        ing("        E.apply(hdr, meta, sm);"),
        "bad.p4:15:9: applying control type E directly is not supported; instantiate it",
    ),
    "macro_stringify": (
        "#define F(x) #x\n" + ing(""),
        "bad.p4:1:1: '#' and '##' in macro bodies are not supported",
    ),
    "macro_arity": (
        "#define F(x, y) x\n" + ing("        sm.egress_spec = F(1);"),
        "bad.p4:16:26: macro F takes 2 argument(s), 1 given",
    ),
    "mixed_operands": (
        ing("        hdr.h.b = hdr.h.b + hdr.h.a;"),
        "bad.p4:15:27: operands of '+' have different types bit<16> and bit<8>; a cast is needed",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_rejected_with_location(case: str) -> None:
    src, want = BAD[case]
    with pytest.raises(P4CompileError) as ei:
        Pipeline.compile(src, filename="bad.p4")
    assert ei.value.diagnostics[0] == want, ei.value.diagnostics
    assert str(ei.value).startswith("bad.p4:")


def test_errors_in_included_file_point_into_it(tmp_path: Path) -> None:
    (tmp_path / "inc.p4").write_text("header x_t {\n    bit<8> a\n}\n")
    main = tmp_path / "main.p4"
    main.write_text('#include <core.p4>\n#include "inc.p4"\n')
    with pytest.raises(P4CompileError) as ei:
        Pipeline.compile(main)
    assert ei.value.diagnostics == [f"{tmp_path / 'inc.p4'}:3:1: expected ';', found '}}'"]


def test_several_errors_reported_at_once() -> None:
    with pytest.raises(P4CompileError) as ei:
        Pipeline.compile(ing("        hdr.h.a = hdr.h.b;\n        hdr.h.c = 1;"), filename="bad.p4")
    assert len(ei.value.diagnostics) == 2


def test_preprocessor_defines_and_conditionals() -> None:
    src = ing(
        "        sm.egress_spec = PORT;\n#ifdef NOPE\n        garbage here\n#else\n"
        "        hdr.h.a = VAL;\n#endif"
    ).replace(
        "#include <core.p4>",
        "#include <core.p4>\n#define PORT 9w7\n#define VAL 0x2a\n#if "
        "defined(PORT) && !defined(NOPE)\n#define OK 1\n#endif",
    )
    Pipeline.compile(src, filename="ok.p4")


def test_a_sub_control_without_tables_can_be_applied_twice() -> None:
    from shadowgrad.p4target.dataplane import Dataplane

    src = ing(
        "        e.apply(hdr);\n        e.apply(hdr);\n        sm.egress_spec = 1;", "    T() e;"
    )
    src = src.replace(
        "control I(",
        "control T(inout hs hdr) {\n    bit<8> n = 1;\n"
        "    apply { hdr.h.a = hdr.h.a + n; n = 5; }\n}\ncontrol I(",
        1,
    )
    dp = Dataplane(Pipeline.compile(src, filename="twice.p4"))
    # each apply starts from the control's own initial locals (n = 1 both times)
    assert dp.process(0, bytes([5, 0, 0])) == [(1, bytes([7, 0, 0]))]


def test_function_like_macros() -> None:
    """Arguments expanded before substitution, the result scanned again, a call whose
    arguments go on over lines, #undef and redefinition."""
    from shadowgrad.p4target.dataplane import Dataplane

    src = ing(
        "        sm.egress_spec = PICK(9w1,\n            TWICE(\n  ONE));\n"
        "        hdr.h.a = ADD(hdr.h.a, (8w3));\n#undef ADD\n#define ADD(a, b) a\n"
        "        hdr.h.a = ADD(hdr.h.a, 8w100);"
    ).replace(
        "#include <core.p4>",
        "#include <core.p4>\n#define ONE 9w1\n#define TWICE(x) ((x) + (x))\n"
        "#define PICK(a, b) (b)\n#define ADD(a, b) ((a) + (b))",
    )
    dp = Dataplane(Pipeline.compile(src, filename="fm.p4"))
    out = dp.process(0, bytes([5, 0, 0]))
    assert out == [(2, bytes([8, 0, 0]))], out


SUB = (
    "control Sub(inout hs hdr, in standard_metadata_t s) {\n"
    "    apply { hdr.h.a = (bit<8>) s.enq_timestamp; }\n}\n"
)
STD_READS: dict[str, tuple[str, dict[str, set[str]]]] = {
    "assigned_only": (
        ing("        sm.enq_qdepth = 1; sm.egress_spec = 2; mark_to_drop(sm);"),
        {},
    ),
    "read": (ing("        hdr.h.a = (bit<8>) sm.enq_qdepth;"), {"ingress": {"enq_qdepth"}}),
    "slice_assigned": (ing("        sm.egress_spec[0:0] = 1;"), {"ingress": {"egress_spec"}}),
    "copy": (
        ing("        c = sm; hdr.h.a = (bit<8>) c.deq_qdepth;", "    standard_metadata_t c;"),
        {"ingress": {"deq_qdepth"}},
    ),
    "sub_control": (
        ing("        sub.apply(hdr, sm);", "    Sub() sub;").replace(
            "control I(", SUB + "control I(", 1
        ),
        {"ingress": {"enq_timestamp"}},
    ),
    "egress_and_tables": (
        ing("        t.apply();", TABLE).replace(
            "control E(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) { apply { } }",
            "control E(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) {\n"
            "    apply { if (sm.egress_port == 2) { hdr.h.b = (bit<16>) sm.deq_qdepth; } } }",
        ),
        {"egress": {"egress_port", "deq_qdepth"}, "ingress": {"packet_length"}},
    ),
}


@pytest.mark.parametrize("case", sorted(STD_READS))
def test_checker_records_the_standard_metadata_fields_read(case: str) -> None:
    """ProgramFacts.std_reads: per block, the standard_metadata fields whose value it may
    read, through any value of that type (a copy, a sub-control's parameter) or a table's byte
    count; a field that is only assigned is not read. The pipeline sets the queueing fields at
    egress only for a program that reads one (the fact, not a scan of the generated code)."""
    src, want = STD_READS[case]
    p = Pipeline.compile(src, filename=f"{case}.p4")
    assert {role: set(fs) for role, fs in p.facts.std_reads.items()} == want
    queue = {"enq_qdepth", "deq_qdepth", "enq_timestamp", "deq_timedelta"}
    assert p.reads_queue == any(queue & fs for fs in want.values())


def test_all_test_programs_compile() -> None:
    for p in sorted(PROGS.glob("*.p4")):
        if p.name == "common.p4":
            continue
        Pipeline.compile(p)


def test_project_headers_p4_parses() -> None:
    """p4/include/headers.p4 (the shadowgrad wire header) goes through the front end."""
    src = (
        '#include <core.p4>\n#include <v1model.p4>\n#include "headers.p4"\n'
        "header eth_t { bit<48> d; bit<48> s; bit<16> t; }\n"
        "struct hs { eth_t eth; shadowgrad_h sg; }\nstruct m_t { }\n"
        "parser P(packet_in pk, out hs hdr, inout m_t meta, inout standard_metadata_t sm) {\n"
        "    state start { pk.extract(hdr.eth); transition select(hdr.eth.t) {\n"
        "        0x88b6: sg; default: accept; } }\n"
        "    state sg { pk.extract(hdr.sg); verify(hdr.sg.magic == SG_MAGIC, error.NoMatch);\n"
        "        transition accept; }\n}\n"
        "control V(inout hs hdr, inout m_t meta) { apply { } }\n"
        "control I(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) { apply {\n"
        "    if (hdr.sg.isValid() && hdr.sg.kind == SG_KIND_DATA) { sm.egress_spec = 2; }\n"
        "    else { sm.egress_spec = 1; } } }\n"
        "control E(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) { apply { } }\n"
        "control D(packet_out pk, in hs hdr) { apply { pk.emit(hdr); } }\n"
        "V1Switch(P(), V(), I(), E(), V(), D()) main;\n"
    )
    p = Pipeline.compile(src, include_dirs=[ROOT / "p4" / "include"], filename="sg.p4")
    from shadowgrad.p4target.dataplane import Dataplane

    dp = Dataplane(p)
    sg = bytearray(64)
    sg[0:2] = b"\x53\x47"
    sg[3] = 1  # kind = DATA
    frame = bytes(12) + b"\x88\xb6" + bytes(sg)
    assert dp.process(1, frame) == [(2, frame)]
    sg[3] = 2
    frame2 = bytes(12) + b"\x88\xb6" + bytes(sg)
    assert dp.process(1, frame2) == [(1, frame2)]


def test_lookahead_header_and_advance() -> None:
    src = (
        PRE.replace(
            "state start { pk.extract(hdr.h); transition accept; }",
            "state start { h_t peek = pk.lookahead<h_t>(); pk.advance(8);\n"
            "        transition select(peek.b) { 0x0102: take; default: accept; } }\n"
            "    state take { pk.extract(hdr.h); transition accept; }",
        )
        + (
            "control I(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) {\n"
            "    apply { sm.egress_spec = hdr.h.isValid() ? 9w2 : 9w1; } }\n"
        )
        + POST
    )
    from shadowgrad.p4target.dataplane import Dataplane

    dp = Dataplane(Pipeline.compile(src, filename="la.p4"))
    assert dp.process(0, b"\x00\x01\x02\x03\x04\x05") == [(2, b"\x01\x02\x03\x04\x05")]
    assert dp.process(0, b"\x00\x01\x03\x03\x04\x05") == [(1, b"\x01\x03\x03\x04\x05")]


def test_mutated_sources_only_ever_raise_located_diagnostics() -> None:
    """Token-level mutations of the test programs: accepted, or P4CompileError with a location;
    never another exception (and never generated Python that fails to compile)."""
    import random

    common = (PROGS / "common.p4").read_text()
    progs = [
        p.read_text().replace('#include "common.p4"', common)
        for p in sorted(PROGS.glob("*.p4"))
        if p.name != "common.p4"
    ]
    toks = [
        ";",
        "{",
        "}",
        "(",
        ")",
        "<",
        ">",
        "=",
        ",",
        ".",
        "bit<8>",
        "hdr",
        "apply",
        "1",
        "8w1",
        "true",
        "exit",
        "&&&",
        "..",
        "[3:0]",
        "++",
        "default",
        "_",
        "table",
        "action",
        "error",
        "state",
        "transition",
        "select",
        "NoAction",
        "int<4>",
    ]
    rng = random.Random(1234)
    for _ in range(80):
        words = rng.choice(progs).split(" ")
        for _ in range(rng.randrange(1, 4)):
            j = rng.randrange(len(words))
            r = rng.random()
            if r < 0.4:
                words[j] = rng.choice(toks)
            elif r < 0.7:
                del words[j]
            else:
                words.insert(j, rng.choice(toks))
        try:
            Pipeline.compile(" ".join(words), filename="m.p4")
        except P4CompileError as e:
            assert all(
                d.split(":")[0] in ("m.p4", "core.p4", "v1model.p4") and d.split(":")[1].isdigit()
                for d in e.diagnostics
            ), e.diagnostics
