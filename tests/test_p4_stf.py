"""STF files against the target (``p4target/stf.py``) and p4c's bmv2 STF corpus
(``../shared/p4c-stf``; skipped where it is absent): every program's result is recorded in
``tests/golden/p4c_stf_results.json``, so a program that passes today and fails tomorrow, or
one that compiles today and is rejected tomorrow, fails this test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadowgrad.p4target.pipeline import Pipeline
from shadowgrad.p4target.stf import compare_packet, run_stf
from shadowgrad.testing.v1model import v1switch

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / ".." / "shared" / "p4c-stf"
RECORD = ROOT / "tests" / "golden" / "p4c_stf_results.json"


def _rejects(program: str, old: str, new: str, msg: str) -> None:
    """``program`` with ``old`` replaced by ``new`` fails to compile with ``msg``."""
    from shadowgrad.p4target.pipeline import P4CompileError

    assert old in program
    with pytest.raises(P4CompileError, match=msg):
        Pipeline.compile(program.replace(old, new), filename="mutated.p4")


def _passes(pipe: Pipeline, stf: str, *, both_paths: bool = False) -> None:
    """``stf`` passes on ``pipe``: on the fast path (the default of :func:`run_stf`), and with
    ``both_paths`` on the general path first."""
    for fast in (False, True) if both_paths else (True,):
        r = run_stf(pipe, stf, fast_path=fast)
        assert r.ok, r.errors


PROG = v1switch(
    """
header h_t { bit<8> a; bit<8> b; bit<16> c; }
struct headers { h_t h; }
struct meta_t { }
""",
    ingress="""{
    action fwd(bit<9> port, bit<8> v) { sm.egress_spec = port; hdr.h.b = v; }
    action drop() { mark_to_drop(sm); }
    table t {
        key = { hdr.h.a: ternary; hdr.h.c: lpm @name("cc"); }
        actions = { fwd; drop; }
        default_action = drop();
    }
    apply { t.apply(); }
}""",
)


@pytest.fixture(scope="module")
def pipe() -> Pipeline:
    return Pipeline.compile(PROG, filename="stf_test.p4")


def test_compare_packet_masks_and_length() -> None:
    assert compare_packet("0102", bytes([1, 2, 3])) is None  # a prefix is enough
    assert compare_packet("0102 $", bytes([1, 2, 3])) is not None  # $: exact length
    assert compare_packet("0102$", bytes([1, 2])) is None
    assert compare_packet("0*0*", bytes([0x09, 0x0A])) is None
    assert "byte 1" in (compare_packet("0*00", bytes([0x09, 0x0A])) or "")
    assert "too short" in (compare_packet("010203", bytes([1, 2])) or "")


def test_priorities_masks_and_prefixes(pipe: Pipeline) -> None:
    stf = """
# larger STF priority wins; '*' nibbles are don't-care; lpm length from the digits
add t 10 h.a:0x1* cc:0x**** I.fwd(port:1, v:0x11)
add t 20 h.a:0x12 cc:0x12** fwd(port:2, v:0x22)
packet 0 12 00 1234
expect 2 12 22 1234 $
packet 0 13 00 1234
expect 1 13 11 1234 $
packet 0 12 00 9999
expect 1 12 11 9999
packet 0 22 00 0000
"""
    for fast in (False, True):
        r = run_stf(pipe, stf, fast_path=fast)
        assert r.ok, r.errors
        assert (r.packets, r.expects) == (4, 3)
        assert r.outputs == {
            0: [],
            1: [bytes.fromhex("13111234"), bytes.fromhex("12119999")],
            2: [bytes.fromhex("12221234")],
        }


def test_mismatches_are_reported_per_port(pipe: Pipeline) -> None:
    stf = """
add t 1 h.a:0x12 cc:0x1234/16 fwd(port:3, v:0x33)
packet 0 12 00 1234
expect 3 12 34 1234
expect 4 00
"""
    r = run_stf(pipe, stf)
    assert not r.ok
    assert any("port 3 packet 0: differs at byte 1" in e for e in r.errors), r.errors
    assert "port 4: expected 1 packet(s), got 0" in r.errors


@pytest.mark.parametrize(
    ("line", "msg"),
    [
        ("add nosuch 1 h.a:1 fwd(port:1, v:1)", "no table nosuch"),
        ("add t 1 h.zz:1 fwd(port:1, v:1)", "has no key field h.zz"),
        ("add t 1 h.a:1 fwd(port:1)", "missing argument(s) v"),
        ("add t 1 h.a:1 nop()", "no action of table I.t: nop"),
        ("frobnicate 1 2", "unsupported STF command 'frobnicate'"),
    ],
)
def test_bad_lines_name_the_problem(pipe: Pipeline, line: str, msg: str) -> None:
    r = run_stf(pipe, line + "\n", name="x.stf")
    assert not r.ok
    assert r.errors[0].startswith("x.stf:1: ") and msg in r.errors[0], r.errors


def test_multicast_and_mirroring_commands(pipe: Pipeline) -> None:
    stf = """
mc_mgrp_create 7
mc_node_create 100 1 2
mc_node_create 101 3
mc_node_associate 7 0
mc_node_associate 7 1
mirroring_add 5 4
"""
    _passes(pipe, stf)


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/p4c-stf is absent")
def test_p4c_stf_corpus_matches_the_record() -> None:
    from shadowgrad.p4target.corpus import run_corpus

    results = run_corpus(CORPUS)
    record = json.loads(RECORD.read_text())
    got = {r.name: r.status for r in results}
    assert not [r.name for r in results if r.status == "internal"], [
        (r.name, r.detail) for r in results if r.status == "internal"
    ]
    assert not [r for r in results if r.status == "fail"], [
        (r.name, r.detail) for r in results if r.status == "fail"
    ]
    changed = {n: (record.get(n), s) for n, s in got.items() if record.get(n) != s}
    assert not changed, f"(recorded, now) per program; update {RECORD.name} if better: {changed}"
    p4info = {r.name: r.p4info_identical for r in results if r.status == "pass"}
    recorded_p4info = json.loads((RECORD.with_name("p4c_stf_p4info.json")).read_text())
    worse = [n for n, same in p4info.items() if recorded_p4info.get(n) and not same]
    assert not worse, f"P4Info no longer identical to p4c's: {worse}"


NESTED_SLICE = PROG.replace(
    "apply { t.apply(); }",
    "apply { bit<8> n = 8w0xff; n[7:4][3:1][2:1] = 2w0; hdr.h.b = n; sm.egress_spec = 1; }",
)


def test_nested_slice_assignment_is_a_slice_of_the_base() -> None:
    # n[7:4][3:1][2:1] is n[7:4] bits 3..2 of [3:1] = n[7:6]: 0xff -> 0x3f
    p = Pipeline.compile(NESTED_SLICE, filename="nested.p4")
    _passes(p, "packet 0 01 00 0000\nexpect 1 01 3f 0000 $\n", both_paths=True)


def test_a_code_generator_failure_is_a_diagnostic(monkeypatch: pytest.MonkeyPatch) -> None:
    from shadowgrad.p4target import pipeline as pl

    def broken(*_a: object, **_k: object) -> None:
        raise SyntaxError("cannot assign to expression here")

    monkeypatch.setattr(pl, "build_general", broken)
    with pytest.raises(pl.P4CompileError) as ei:
        Pipeline.compile(PROG, filename="gen.p4")
    (d,) = ei.value.diagnostics
    assert d.startswith("gen.p4:1:1: internal error: the code generator cannot compile")
    assert "SyntaxError: cannot assign to expression here" in d


FUNCTIONS = PROG.replace(
    "control I(",
    """
bit<8> inc(inout bit<8> x) { x = x + 1; return x; }
bit<8> early(in bit<8> v) {
    if (v > 10) { return 1; }
    v = v + 1;
    return v + 2;
}
void setb(out bit<8> o) { o = 7; return; o = 9; }
control I(""",
).replace(
    "apply { t.apply(); }",
    """apply {
        bit<8> a = hdr.h.a;
        hdr.h.b = a + inc(a);  // left to right: the old a, then inc's result
        hdr.h.c = (bit<16>)early(hdr.h.a);
        bool z = hdr.h.a == 0 && inc(a) == 0;  // inc runs only when h.a == 0
        hdr.h.c[15:8] = z ? 8w0xff : a;
        bit<8> o;
        setb(o);
        hdr.h.a = hdr.h.a + o;
        sm.egress_spec = 1;
    }""",
)


def test_functions_copy_in_copy_out_return_and_evaluation_order() -> None:
    p = Pipeline.compile(FUNCTIONS, filename="functions.p4")
    stf = """
packet 0 05 00 0000
expect 1 0c 0b 0608 $
packet 0 00 00 0000
expect 1 07 01 0203 $
packet 0 14 00 0000
expect 1 1b 29 1501 $
"""
    _passes(p, stf, both_paths=True)


@pytest.mark.parametrize(
    ("decl", "call", "msg"),
    [
        ("bit<8> f(in bit<8> x) { return; }", "hdr.h.b = f(1);", "function f must return a value"),
        ("void f() { }", "hdr.h.b = f();", "function f returns no value"),
        ("bit<8> f(in bit<8> x) { return x; }", "hdr.h.b = f(1, 2);", "takes 1 argument(s)"),
        ("bit<8> f(in bit<8> x) { return f(x); }", "hdr.h.b = f(1);", "function f calls itself"),
    ],
)
def test_function_errors_are_located(decl: str, call: str, msg: str) -> None:
    from shadowgrad.p4target.pipeline import P4CompileError

    src = PROG.replace("control I(", decl + "\ncontrol I(").replace("t.apply();", call)
    with pytest.raises(P4CompileError) as ei:
        Pipeline.compile(src, filename="f.p4")
    assert any(msg in d and d.startswith("f.p4:") for d in ei.value.diagnostics), ei.value


INOUT_ACTIONS = PROG.replace(
    "action drop()",
    """action bump(inout bit<8> v, out bit<16> w, bit<8> by) {
        v = v + by;
        w = 16w0x0102;
        if (v == 8w0x30) { exit; }  // the arguments are still copied back
        v = v + 1;
    }
    action drop()""",
).replace(
    "apply { t.apply(); }",
    "apply { sm.egress_spec = 1; bump(hdr.h.b, hdr.h.c, hdr.h.a); hdr.h.a = 0; }",
)


def test_inout_and_out_action_parameters_copy_back_also_on_exit() -> None:
    p = Pipeline.compile(INOUT_ACTIONS, filename="inout.p4")
    stf = """
packet 0 05 10 ffff
expect 1 00 16 0102 $
packet 0 20 10 ffff
expect 1 20 30 0102 $
"""
    _passes(p, stf, both_paths=True)


def test_an_inout_action_cannot_be_in_a_table() -> None:
    from shadowgrad.p4target.pipeline import P4CompileError

    src = INOUT_ACTIONS.replace("actions = { fwd; drop; }", "actions = { fwd; drop; bump; }")
    with pytest.raises(P4CompileError, match="has directional parameters and cannot be used"):
        Pipeline.compile(src, filename="t.p4")


LIST_INIT = PROG.replace(
    "control I(",
    "h_t mk(in bit<8> x) { return { x, x + 1, 16w7 }; }\ncontrol I(",
).replace(
    "apply { t.apply(); }",
    """apply {
        h_t tmp = { 1, 2, 3 };  // a list initializer makes the header valid
        hdr.h = mk(hdr.h.a);
        hdr.h.c = hdr.h.c + tmp.c + (tmp.isValid() ? 16w0x100 : 16w0);
        sm.egress_spec = 1;
    }""",
)


def test_list_initializers_of_headers() -> None:
    p = Pipeline.compile(LIST_INIT, filename="list.p4")
    _passes(p, "packet 0 05 00 0000\nexpect 1 05 06 010a $\n", both_paths=True)
    bad = LIST_INIT.replace("{ 1, 2, 3 }", "{ 1, 2 }")
    from shadowgrad.p4target.pipeline import P4CompileError

    with pytest.raises(P4CompileError, match="has 2 element"):
        Pipeline.compile(bad, filename="list.p4")


STACKS = v1switch(
    """
header h_t { bit<8> v; }
header n_t { bit<8> n; }
struct headers { n_t n; h_t[3] s; }
struct meta_t { }
""",
    parser="""{
    state start { pkt.extract(hdr.n); transition loop; }
    state loop {
        pkt.extract(hdr.s.next);
        transition select(hdr.s.last.v) { 0: accept; default: loop; }
    }
}""",
    ingress="""{
    apply {
        sm.egress_spec = 1;
        if (sm.parser_error == error.StackOutOfBounds) { sm.egress_spec = 2; }
        hdr.n.n = (bit<8>)hdr.s.lastIndex;
        if (hdr.n.n == 0) {
            hdr.s.push_front(1);
            hdr.s[0].setValid();
            hdr.s[0].v = 0xaa;
        } else {
            hdr.s.pop_front(1);
        }
        hdr.s[hdr.n.n].v = hdr.s[hdr.n.n].v + 1;  // run-time index; out of range: no write
    }
}""",
    deparser="{ apply { pkt.emit(hdr.n); pkt.emit(hdr.s); } }",
)


def test_header_stacks_next_last_push_pop_and_run_time_index() -> None:
    p = Pipeline.compile(STACKS, filename="stacks.p4")
    stf = """
# one element (v = 0): lastIndex 0; push_front(1) -> [aa, 00], s[0] += 1 -> ab
packet 0 ff 00 77
expect 1 00 ab 00 77 $
# two elements: lastIndex 1; pop_front(1) -> [00], s[1] invalid: no write, not emitted
packet 0 ff 05 00 77
expect 1 01 00 77 $
# four non-zero elements overflow the stack of 3: StackOutOfBounds, the three kept
packet 0 ff 01 02 03 04 00
expect 2 02 02 03 04 00 $
"""
    _passes(p, stf, both_paths=True)


@pytest.mark.parametrize(
    ("old", "new", "msg"),
    [
        ("hdr.s[0].v = 0xaa;", "hdr.s[3].v = 0xaa;", "index 3 is out of range"),
        ("hdr.s.pop_front(1);", "hdr.s.pop_front(hdr.n.n);", "needs a non-negative constant"),
        ("hdr.n.n = (bit<8>)hdr.s.lastIndex;", "hdr.n.n = hdr.s.next.v;", "only supported as"),
    ],
)
def test_header_stack_errors(old: str, new: str, msg: str) -> None:
    _rejects(STACKS, old, new, msg)


UNIONS = v1switch(
    """
header t_t { bit<8> t; }
header a_t { bit<8> a; }
header b_t { bit<16> b; }
header_union u_t { a_t a; b_t b; }
struct headers { t_t t; u_t u; u_t[2] s; a_t x; }
struct meta_t { }
""",
    parser="""{
    state start {
        pkt.extract(hdr.t);
        transition select(hdr.t.t) { 1: one; 2: two; 3: stk; default: accept; }
    }
    state one { pkt.extract(hdr.u.a); transition accept; }
    state two { pkt.extract(hdr.u.b); transition accept; }
    state stk { pkt.extract(hdr.s.next.b); pkt.extract(hdr.s.next.a); transition accept; }
}""",
    ingress="""{
    apply {
        sm.egress_spec = hdr.u.isValid() ? 9w1 : 9w2;
        if (hdr.u.a.isValid()) {
            hdr.u.b.setValid();  // invalidates u.a
            hdr.u.b.b = 0xbbbb;
        } else if (hdr.u.b.isValid()) {
            hdr.x.setValid();
            hdr.x.a = 0xcc;
            hdr.u.a = hdr.x;  // a valid header assigned: u.b becomes invalid
        } else if (hdr.s[0].isValid()) {
            hdr.s.push_front(1);  // s[0] (both members) invalid, s[1] = old s[0]
            hdr.s[0].a.setValid();
            hdr.s[0].a.a = 0xdd;
        }
    }
}""",
    deparser="""{
    apply { pkt.emit(hdr.t); pkt.emit(hdr.u); pkt.emit(hdr.s); }
}""",
)


def test_header_unions_one_member_valid() -> None:
    p = Pipeline.compile(UNIONS, filename="unions.p4")
    stf = """
# u.a extracted; setValid of u.b invalidates u.a
packet 0 01 11 77
expect 1 01 bb bb 77 $
# u.b extracted; u.a = x (valid) invalidates u.b
packet 0 02 11 22 77
expect 1 02 cc 77 $
# no member: the union is invalid
packet 0 00 77
expect 2 00 77 $
# a stack of unions: s[0].b, s[1].a; push_front(1) drops s[1], invalidates s[0]
packet 0 03 11 22 33 77
expect 2 03 dd 11 22 77 $
"""
    _passes(p, stf)


@pytest.mark.parametrize(
    ("old", "new", "msg"),
    [
        ("hdr.u.b.setValid();", "hdr.u.setValid();", "setValid\\(\\) needs a header"),
        ("pkt.extract(hdr.u.a);", "pkt.extract(hdr.u);", "extract needs a header"),
        ("pkt.extract(hdr.s.next.a);", "pkt.extract(hdr.s.next);", "needs a member of next"),
        ("header_union u_t { a_t a;", "header_union u_t { bit<8> a;", "not a header"),
    ],
)
def test_header_union_errors(old: str, new: str, msg: str) -> None:
    _rejects(UNIONS, old, new, msg)


VARBIT = v1switch(
    """
header l_t { bit<8> n; bit<8> e; }
header v_t { bit<4> a; bit<4> b; varbit<32> opt; bit<8> tail; }
struct headers { l_t l; v_t v; v_t w; }
struct meta_t { varbit<32> keep; }
""",
    parser="""{
    state start {
        pkt.extract(hdr.l);
        pkt.extract(hdr.v, (bit<32>)hdr.l.n);
        transition select(hdr.v.tail) { 0xee: two; default: accept; }
    }
    state two { pkt.extract(hdr.w, (bit<32>)hdr.l.n); transition accept; }
}""",
    ingress="""{
    apply {
        sm.egress_spec = 1;
        if (sm.parser_error == error.PacketTooShort) { hdr.l.e = 1; }
        if (sm.parser_error == error.HeaderTooShort) { hdr.l.e = 4; }
        if (sm.parser_error == error.ParserInvalidArgument) { hdr.l.e = 6; }
        if (hdr.w.isValid()) {
            if (hdr.v.opt == hdr.w.opt) { sm.egress_spec = 2; }
            m.keep = hdr.v.opt;  // swap the two varbit values
            hdr.v.opt = hdr.w.opt;
            hdr.w.opt = m.keep;
        }
    }
}""",
    checksum="""{
    apply {
        update_checksum(hdr.v.isValid(), { hdr.v.a, hdr.v.opt }, hdr.v.tail, HashAlgorithm.xor16);
    }
}""",
    deparser="""{
    apply { pkt.emit(hdr.l); pkt.emit(hdr.v); pkt.emit(hdr.w); }
}""",
)


def test_varbit_extract_emit_compare_and_checksum() -> None:
    p = Pipeline.compile(VARBIT, filename="varbit.p4")
    stf = """
# 16 bits of options: a=1 b=2 opt=abcd tail; xor16 over (a, opt) = 0x1abc ^ 0xd000 -> 0xcabc
packet 0 10 00 12 abcd 55 77
expect 1 10 00 12 abcd bc 77 $
# no options: the header is 2 bytes; xor16 over 4 bits 0x1 padded -> 0x1000 -> tail 00
packet 0 00 00 12 55 77
expect 1 00 00 12 00 77 $
# 4 bits of options: not whole bytes, ParserInvalidArgument (6); v not extracted
packet 0 04 00 12 a5 55 77
expect 1 04 06 12 a5 55 77 $
# 40 bits: over varbit<32>, HeaderTooShort (4)
packet 0 28 00 12 0102030405 55
expect 1 28 04 12 0102030405 55 $
# 16 bits but only 2 bytes left: PacketTooShort (1)
packet 0 10 00 12 ab
expect 1 10 01 12 ab $
# two headers (tail ee), equal options: port 2; swapped (still equal)
packet 0 08 00 12 ab ee 34 ab 00 77
expect 2 08 00 12 ab ** 34 ab ** 77 $
# different options: swapped
packet 0 08 00 12 ab ee 34 cd 00 77
expect 1 08 00 12 cd ** 34 ab ** 77 $
"""
    _passes(p, stf)


@pytest.mark.parametrize(
    ("old", "new", "msg"),
    [
        ("pkt.extract(hdr.v, (bit<32>)hdr.l.n);", "pkt.extract(hdr.v);", "needs a length"),
        ("pkt.extract(hdr.l);", "pkt.extract(hdr.l, 8);", "has no varbit field"),
        ("varbit<32> opt;", "varbit<32> opt; varbit<8> o2;", "more than one varbit"),
        ("if (hdr.v.opt == hdr.w.opt)", "if (hdr.v.opt < hdr.w.opt)", "needs numeric"),
        ("sm.egress_spec = 2;", "sm.egress_spec = (bit<9>)hdr.v.opt;", "cannot cast"),
    ],
)
def test_varbit_errors(old: str, new: str, msg: str) -> None:
    _rejects(VARBIT, old, new, msg)


OPASSIGN = v1switch(
    """
header h_t { bit<8> a; bit<8> b; bit<8> c; bit<8> d; bit<8> i; }
header e_t { bit<8> x; }
struct headers { h_t h; e_t[2] s; }
struct meta_t { }
bit<8> bump(inout bit<8> x) { bit<8> r = x; x += 1; return r; }
""",
    parser="""{
    state start { pkt.extract(hdr.h); pkt.extract(hdr.s.next); pkt.extract(hdr.s.next);
                  transition accept; }
}""",
    ingress="""{
    apply {
        sm.egress_spec = 1;
        hdr.h.a += 0x10;
        hdr.h.b >>= 2;
        hdr.h.c |+|= 0xf0;
        hdr.h.d[3:0] <<= 1;
        hdr.s[bump(hdr.h.i) & 1].x ^= 0xff;  // index evaluated once: i read, then bumped
        hdr.h.a = hdr.h.a >> 1;
    }
}""",
    deparser="{ apply { pkt.emit(hdr.h); pkt.emit(hdr.s); } }",
)


def test_compound_assignments() -> None:
    p = Pipeline.compile(OPASSIGN, filename="opassign.p4")
    stf = """
packet 0 02 84 20 ff 01 11 22
expect 1 09 21 ff fe 02 11 dd $
packet 0 02 84 20 ff 00 11 22
expect 1 09 21 ff fe 01 ee 22 $
"""
    _passes(p, stf)


BOUND = v1switch(
    """
header h_t { bit<8> k; bit<8> a; bit<8> b; bit<8> c; }
struct headers { h_t h; }
struct meta_t { }
""",
    ingress="""{
    action setbyte(out bit<8> reg, bit<8> val) { reg = val; }
    action bump(inout bit<8> x, in bit<8> by) {
        if (x == 0) { return; }
        x = x + by;
    }
    table ta {
        key = { hdr.h.k : exact; }
        actions = { setbyte(hdr.h.a); NoAction; }
        default_action = setbyte(hdr.h.a, 0xee);
    }
    table tb {
        key = { hdr.h.k : exact; }
        actions = { setbyte(hdr.h.b); bump(hdr.h.c, hdr.h.k); }
        default_action = bump(hdr.h.c, hdr.h.k);
    }
    apply { sm.egress_spec = 1; ta.apply(); tb.apply(); }
}""",
)


def test_action_arguments_bound_in_the_actions_list() -> None:
    p = Pipeline.compile(BOUND, filename="bound.p4")
    # the P4Info lists each action once, with its directionless parameters only
    acts = {a.preamble.name: [x.name for x in a.params] for a in p.p4info.actions}
    assert acts["I.setbyte"] == ["val"] and acts["I.bump"] == []
    stf = """
add I.ta h.k:0x01 I.setbyte(val:0x11)
add I.tb h.k:0x01 I.setbyte(val:0x22)
# k=1: ta writes a, tb writes b (the same action bound to another field)
packet 0 01 00 00 05
expect 1 01 11 22 05 $
# k=2: the defaults: a = ee; c += k (c != 0)
packet 0 02 00 00 05
expect 1 02 ee 00 07 $
# c = 0: bump returns early
packet 0 03 00 00 00
expect 1 03 ee 00 00 $
"""
    assert p.fast_unsupported is None
    _passes(p, stf, both_paths=True)


def test_bool_fields_in_headers() -> None:
    src = PROG.replace(
        "header h_t { bit<8> a; bit<8> b; bit<16> c; }",
        "header h_t { bit<7> a; bool f; bit<8> b; bit<16> c; }",
    ).replace(
        "apply { t.apply(); }",
        "apply { sm.egress_spec = hdr.h.f ? 9w2 : 9w1; hdr.h.f = !hdr.h.f; }",
    )
    p = Pipeline.compile(src, filename="hbool.p4")
    # a = 1 and f (the last bit of the first byte) true: port 2, f cleared; then f false
    stf = "packet 0 03 00 0000\nexpect 2 02 00 0000 $\npacket 0 02 00 0000\nexpect 1 03 00 0000 $\n"
    _passes(p, stf, both_paths=True)


EQUALITY = v1switch(
    """
header h_t { bit<8> a; bit<8> b; }
header r_t { bit<8> r; }
struct pair_t { h_t x; bit<8> y; }
struct headers { r_t r; h_t p; h_t q; h_t[2] s; }
struct meta_t { }
""",
    parser="""{
    state start {
        pkt.extract(hdr.r);
        pkt.extract(hdr.p);
        transition select(hdr.r.r) { 0: accept; default: more; }
    }
    state more { pkt.extract(hdr.q); pkt.extract(hdr.s.next); transition accept; }
}""",
    ingress="""{
    apply {
        sm.egress_spec = 1;
        bit<8> r = 0;
        if (hdr.p == hdr.q) { r = r | 1; }      // both valid and equal, or both invalid
        h_t[2] t;                               // a local stack: both elements invalid
        t[0] = hdr.p;
        if (t == hdr.s) { r = r | 2; }          // element by element
        pair_t u = { hdr.p, 7 };
        pair_t v = { hdr.q, 7 };
        if (u != v) { r = r | 4; }
        hdr.r.r = r;
    }
}""",
    deparser="{ apply { pkt.emit(hdr); } }",
)


def test_header_stack_and_struct_equality() -> None:
    p = Pipeline.compile(EQUALITY, filename="eq.p4")
    stf = """
# p = q = s[0]: all equal
packet 0 01 0102 0102 0102
expect 1 03 0102 0102 0102 $
# q differs: p != q, t (= [p, invalid]) == s (= [s0, invalid]) since s0 = p
packet 0 01 0102 0103 0102
expect 1 06 0102 0103 0102 $
# only p valid: p != q (q invalid), t != s (s[0] invalid)
packet 0 00 0102 ffff
expect 1 04 0102 ffff $
"""
    _passes(p, stf, both_paths=True)


def test_stack_of_varbit_headers_and_next_index_after_a_failed_extract() -> None:
    src = VARBIT.replace(
        "struct headers { l_t l; v_t v; v_t w; }", "struct headers { l_t l; v_t[2] s; }"
    ).replace(
        """        pkt.extract(hdr.v, (bit<32>)hdr.l.n);
        transition select(hdr.v.tail) { 0xee: two; default: accept; }
    }
    state two { pkt.extract(hdr.w, (bit<32>)hdr.l.n); transition accept; }""",
        """        pkt.extract(hdr.s.next, (bit<32>)hdr.l.n);
        pkt.extract(hdr.s.next, (bit<32>)hdr.l.n + 8);
        transition accept;
    }""",
    )
    src = src.replace(
        """        if (hdr.w.isValid()) {
            if (hdr.v.opt == hdr.w.opt) { sm.egress_spec = 2; }
            m.keep = hdr.v.opt;  // swap the two varbit values
            hdr.v.opt = hdr.w.opt;
            hdr.w.opt = m.keep;
        }""",
        "        hdr.l.n = (bit<8>)hdr.s.lastIndex;",
    ).replace("{ hdr.v.a, hdr.v.opt }, hdr.v.tail", "{ hdr.s[0].a }, hdr.s[0].tail")
    src = src.replace("hdr.v.isValid()", "false").replace(
        "pkt.emit(hdr.v); pkt.emit(hdr.w);", "pkt.emit(hdr.s);"
    )
    p = Pipeline.compile(src, filename="vstack.p4")
    stf = """
# 8 then 16 bits of options: both extracted, lastIndex 1
packet 0 08 00 12 ab 55 34 cdef 66 77
expect 1 01 00 12 ab 55 34 cdef 66 77 $
# 32 then 40 bits: the second is HeaderTooShort, not pushed: lastIndex 0
packet 0 20 00 12 01020304 55 34 0102030405 66
expect 1 00 04 12 01020304 55 34 0102030405 66 $
"""
    _passes(p, stf)


def test_entry_priority_annotations_and_default_parameter_values() -> None:
    src = (
        PROG.replace(
            "action fwd(bit<9> port, bit<8> v) {",
            "action fwd(bit<9> port, bit<8> v = 0x77) {",
        )
        .replace(
            "        default_action = drop();",
            "        default_action = drop();\n"
            "        const entries = {\n"
            "            (0x01 &&& 0x0f, 0x0000 &&& 0x0000) : fwd(1) @priority(3);\n"
            "            (0x11, 0x0000 &&& 0x0000) : fwd(2, 0x22);\n"
            "            (0x11 &&& 0xff, 0x0000 &&& 0x0000) : fwd(3, 0x33) @priority(1);\n"
            "        }",
        )
        .replace("hdr.h.c: lpm", "hdr.h.c: ternary")
    )
    p = Pipeline.compile(src, filename="prio.p4")
    stf = """
# all three match 0x11: @priority(1) wins (bmv2: the smallest), then entry 2 (priority 2)
packet 0 11 00 0000
expect 3 11 33 0000 $
# only the first matches; its v is the default 0x77
packet 0 21 00 0000
expect 1 21 77 0000 $
"""
    _passes(p, stf)


def test_switch_on_a_value() -> None:
    src = PROG.replace(
        "struct headers { h_t h; }",
        "enum bit<8> K { A = 1, B = 2 }\nconst bit<8> FIVE = 5;\nstruct headers { h_t h; }",
    ).replace(
        "apply { t.apply(); }",
        """apply {
        sm.egress_spec = 1;
        switch (hdr.h.a + 1) {
            2: { hdr.h.b = 0x10; }
            3:
            FIVE: { hdr.h.b = 0x20; }
            default: { hdr.h.b = 0xff; }
        }
        switch ((K)hdr.h.a) {
            K.B: { sm.egress_spec = 2; }
        }
    }""",
    )
    p = Pipeline.compile(src, filename="sw.p4")
    stf = """
packet 0 01 00 0000
expect 1 01 10 0000 $
packet 0 02 00 0000
expect 2 02 20 0000 $
packet 0 04 00 0000
expect 1 04 20 0000 $
packet 0 07 00 0000
expect 1 07 ff 0000 $
"""
    _passes(p, stf, both_paths=True)


def test_dont_care_arguments_and_lookahead_of_a_struct() -> None:
    from shadowgrad.p4target.pipeline import P4CompileError

    src = (
        PROG.replace(
            "struct headers { h_t h; }",
            "struct two_t { bit<4> hi; int<4> lo; bool f; bit<7> rest; }\n"
            "struct headers { h_t h; }\n"
            "void put(out bit<8> x, in bit<8> v) { x = v; }",
        )
        .replace(
            "state start { pkt.extract(hdr.h); transition accept; }",
            "state start {\n"
            "        two_t la = pkt.lookahead<two_t>();\n"
            "        pkt.extract<h_t>(_);\n"
            "        pkt.extract(hdr.h);\n"
            "        transition select(la.f, la.lo) { (true, -1): accept; default: reject_it; }\n"
            "    }\n"
            "    state reject_it { verify(false, error.NoMatch); transition accept; }",
        )
        .replace(
            "apply { t.apply(); }",
            "apply { put(_, 1); sm.egress_spec = sm.parser_error == error.NoError ? 9w1 : 9w2; }",
        )
    )
    p = Pipeline.compile(src, filename="dc.p4")
    stf = """
# lookahead: hi 0, lo -1 (f), f true: the first 4 bytes skipped, the next 4 extracted
packet 0 0f 80 0000 01 02 0304 99
expect 1 01 02 0304 99 $
packet 0 0f 00 0000 01 02 0304 99
expect 2 01 02 0304 99 $
"""
    _passes(p, stf)
    with pytest.raises(P4CompileError, match="'_' is only allowed"):
        Pipeline.compile(src.replace("put(_, 1);", "put(hdr.h.a, _);"), filename="dc.p4")


def test_actions_with_header_parameters_are_inlined() -> None:
    from shadowgrad.p4target.pipeline import P4CompileError

    src = PROG.replace(
        "action drop() { mark_to_drop(sm); }",
        "action drop() { mark_to_drop(sm); }\n"
        "    action cp(in h_t v, h_t w) { hdr.h.a = v.b; hdr.h.b = w.a; }",
    ).replace("apply { t.apply(); }", "apply { cp(hdr.h, {7, 8, 9}); sm.egress_spec = 1; }")
    p = Pipeline.compile(src, filename="hp.p4")
    _passes(p, "packet 0 01 02 0304\nexpect 1 02 07 0304 $\n")
    with pytest.raises(P4CompileError, match="cannot be used in a table"):
        Pipeline.compile(src.replace("actions = { fwd; drop; }", "actions = { fwd; drop; cp; }"))


def test_inout_argument_at_a_run_time_stack_index() -> None:
    src = OPASSIGN.replace(
        "        hdr.s[bump(hdr.h.i) & 1].x ^= 0xff;  // index evaluated once: i read, then bumped",
        "        inc(hdr.s[bump(hdr.h.i) & 1].x);  // the index computed once (i bumped once)",
    ).replace(
        "bit<8> bump(",
        "void inc(inout bit<8> v) { v = v + 1; }\nbit<8> bump(",
    )
    p = Pipeline.compile(src, filename="rtinout.p4")
    stf = """
packet 0 02 84 20 ff 01 11 22
expect 1 09 21 ff fe 02 11 23 $
packet 0 02 84 20 ff 00 11 22
expect 1 09 21 ff fe 01 12 22 $
"""
    _passes(p, stf)


def test_table_key_of_type_error() -> None:
    src = PROG.replace(
        'key = { hdr.h.a: ternary; hdr.h.c: lpm @name("cc"); }',
        "key = { sm.parser_error: exact; }\n"
        "        const entries = {\n"
        "            error.PacketTooShort : fwd(2, 0xee); error.NoError : fwd(1, 0x11); }",
    )
    p = Pipeline.compile(src, filename="errkey.p4")
    stf = "packet 0 01 02 0304\nexpect 1 01 11 0304 $\npacket 0 01\nexpect 2 01 $\n"
    _passes(p, stf)


def test_top_level_register_shared_by_ingress_and_egress() -> None:
    src = (
        PROG.replace(
            "control V(",
            "register<bit<8>>(4) r;\ncontrol V(",
        )
        .replace(
            "apply { t.apply(); }",
            "apply { sm.egress_spec = 1; r.write(0, hdr.h.a); }",
        )
        .replace(
            "inout standard_metadata_t sm) { apply { } }",
            "inout standard_metadata_t sm) {\n"
            "    apply { bit<8> v; r.read(v, 0); hdr.h.b = v + 1; }\n}",
        )
    )
    p = Pipeline.compile(src, filename="treg.p4")
    assert [r.preamble.name for r in p.p4info.registers] == ["r"]
    _passes(p, "packet 0 05 00 0000\nexpect 1 05 06 0000 $\n")


def test_const_int_locals() -> None:
    src = PROG.replace(
        "    action drop() {",
        "    const int BASE = 0x40;\n    action drop() {",
    ).replace(
        "apply { t.apply(); }",
        "apply { const int K = 2; sm.egress_spec = 1; hdr.h.b = (bit<8>)(BASE + K); }",
    )
    p = Pipeline.compile(src, filename="cint.p4")
    _passes(p, "packet 0 01 00 0000\nexpect 1 01 42 0000 $\n")


def test_struct_fields_in_headers() -> None:
    src = (
        PROG.replace(
            "header h_t { bit<8> a; bit<8> b; bit<16> c; }",
            "struct in_t { bit<4> x; bool f; bit<3> y; }\n"
            "struct row_t { bit<8> a; in_t i; }\n"
            "header h_t { row_t r; bit<16> c; }",
        )
        .replace(
            'key = { hdr.h.a: ternary; hdr.h.c: lpm @name("cc"); }',
            "key = { hdr.h.r.a: exact; }",
        )
        .replace("hdr.h.b = v;", "hdr.h.r.i.y = (bit<3>)v; hdr.h.r.i.f = !hdr.h.r.i.f;")
    )
    p = Pipeline.compile(src, filename="hstruct.p4")
    stf = """
add I.t h.r.a:0x01 I.fwd(port:3, v:5)
# r.a 01, i = x 0xa, f 1, y 0 -> y 5, f 0
packet 0 01 a8 0304
expect 3 01 a5 0304 $
"""
    _passes(p, stf)


def test_tuples_and_control_initialisers_with_calls() -> None:
    src = (
        PROG.replace(
            "struct headers { h_t h; }",
            "struct headers { h_t h; }\n"
            "typedef tuple<bit<8>, bool> pair_t;\n"
            "bit<8> bump(inout bit<8> x) { x = x + 1; return x; }",
        )
        .replace(
            "    action drop() {",
            "    pair_t p = { hdr.h.a, true };\n"
            "    tuple<bit<8>, bit<8>> q = { hdr.h.b, bump(hdr.h.b) };  // b read, then bumped\n"
            "    action drop() {",
        )
        .replace(
            "apply { t.apply(); }",
            "apply { sm.egress_spec = p[1] ? 9w1 : 9w2; hdr.h.a = q[0] + p[0];"
            " hdr.h.c[7:0] = q[1]; }",
        )
    )
    p = Pipeline.compile(src, filename="tup.p4")
    _passes(p, "packet 0 01 10 0000\nexpect 1 11 11 0011 $\n")


SUBPARSER = v1switch(
    """
header a_t { bit<8> kind; }
header b_t { bit<8> v; bit<8> w; }
struct headers { a_t a; b_t b; }
struct meta_t { bit<8> got; }
parser Sub(packet_in pkt, out b_t b, inout meta_t m, in bit<8> add, out bit<8> r) {
    state start {
        pkt.extract(b);
        bit<8> t = b.v + add;
        m.got = t;
        r = b.w;
        verify(b.w != 0xff, error.NoMatch);
        transition accept;
    }
}
""",
    parser="""{
    Sub() sub;
    bit<8> r = 7;
    state start {
        pkt.extract(hdr.a);
        sub.apply(pkt, hdr.b, m, hdr.a.kind, r);
        hdr.a.kind = r;
        transition accept;
    }
}""",
    ingress="""{
    apply {
        sm.egress_spec = sm.parser_error == error.NoError ? 9w1 : 9w2;
        hdr.b.v = m.got;
    }
}""",
    deparser="{ apply { pkt.emit(hdr); } }",
)


def test_sub_parser_of_one_state_is_inlined() -> None:
    from shadowgrad.p4target.pipeline import P4CompileError

    p = Pipeline.compile(SUBPARSER, filename="subp.p4")
    stf = """
# b extracted by the sub-parser, got = v + kind, r (out) copied back into a.kind
packet 0 03 10 22 99
expect 1 22 13 22 99 $
# the sub-parser's verify fails: NoMatch, nothing copied back (b stays invalid, m.got 0,
# a.kind 05); b's bytes were consumed by the sub-parser's copy
packet 0 05 10 ff 99
expect 2 05 99 $
"""
    _passes(p, stf)
    two = SUBPARSER.replace(
        "        transition accept;\n    }\n}\nparser P(",
        "        transition more;\n    }\n    state more { transition accept; }\n}\nparser P(",
    )
    with pytest.raises(P4CompileError, match="only a sub-parser of one state"):
        Pipeline.compile(two, filename="subp2.p4")
