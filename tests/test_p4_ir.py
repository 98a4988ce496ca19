"""The P4 target's typed IR: what the checker produces (frontend/ir.py) and what the general
backend makes of a node (codegen/general.py), tested apart from the dataplane.

* A checked program's IR carries resolved types: P4 arithmetic as ``Arith`` on bit<W> with its
  width, a select as keys plus keyset matches, a table's keys with their widths.
* The IR carries P4 names only, so the checker (the whole front end) imports nothing from a
  backend; the backends derive their Python names and header packers themselves.
* Each expression node, rendered by the general backend and evaluated, computes what P4 says
  (wrap-around of bit<W>, two's complement of int<W>, saturation, slices, concatenation,
  casts), checked against a reference written here from the P4 spec for random operands.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from shadowgrad.p4target.codegen.general import py_expr
from shadowgrad.p4target.frontend import ir
from shadowgrad.p4target.frontend.types import BitT, BoolT
from shadowgrad.p4target.pipeline import Pipeline, _div, _mod

ROOT = Path(__file__).resolve().parents[1]

PROG = """
#include <core.p4>
#include <v1model.p4>
header eth_t { bit<48> dst; bit<48> src; bit<16> type; }
header ip_t { bit<8> ttl; int<8> delta; bit<16> len; }
struct headers { eth_t eth; ip_t ip; }
struct metadata { bit<8> m; }
parser P(packet_in pkt, out headers hdr, inout metadata meta, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.eth);
        transition select(hdr.eth.type) { 0x0800: ip; 0x8000 &&& 0xF000: ip; default: accept; }
    }
    state ip { pkt.extract(hdr.ip); transition accept; }
}
control V(inout headers hdr, inout metadata meta) { apply { } }
control I(inout headers hdr, inout metadata meta, inout standard_metadata_t sm) {
    action fwd(bit<9> port) { sm.egress_spec = port; hdr.ip.ttl = hdr.ip.ttl - 1; }
    table t { key = { hdr.ip.ttl: exact; hdr.ip.delta: exact; } actions = { fwd; NoAction; } }
    apply { if (hdr.ip.isValid()) { t.apply(); } }
}
control E(inout headers hdr, inout metadata meta, inout standard_metadata_t sm) { apply { } }
control C(inout headers hdr, inout metadata meta) { apply { } }
control D(packet_out pkt, in headers hdr) { apply { pkt.emit(hdr); } }
V1Switch(P(), V(), I(), E(), C(), D()) main;
"""


def _walk(node: object) -> list[object]:
    """Every IR node under ``node`` (dataclass fields, tuples, dicts)."""
    out = [node]
    for name in getattr(type(node), "__slots__", ()):
        v = getattr(node, name)
        items = v.values() if isinstance(v, dict) else v if isinstance(v, tuple) else [v]
        for x in items:
            if hasattr(type(x), "__slots__") and type(x).__module__ == ir.__name__:
                out += _walk(x)
    return out


def test_the_checked_program_is_typed_ir() -> None:
    pipe = Pipeline.compile(PROG, filename="ir.p4")
    prog = pipe.ir
    assert isinstance(prog, ir.Program)
    assert [c.role for c in prog.controls] == ["verify", "ingress", "egress", "compute", "deparser"]
    # the parser: typed select keys, a value and a mask case, the default
    start = prog.parser.states["start"]
    assert isinstance(start.body[0], ir.Extract)
    tr = start.transition
    assert [k.ty for k in tr.keys] == [BitT(16)]
    assert [(m.kind, m.a, m.b) for c in tr.cases for m in c.matches if m] == [
        ("value", 0x0800, 0),
        ("mask", 0x8000, 0xF000),
    ]
    assert [c.target for c in tr.cases] == ["ip", "ip"] and tr.default == "accept"
    # the action: ttl - 1 is bit<8> arithmetic (it wraps), the port a bit<9> parameter
    fwd = next(d for d in prog.defs if isinstance(d, ir.ActionDef) and d.params)
    sub = next(s for s in fwd.body if isinstance(s, ir.Assign) and isinstance(s.rhs, ir.Arith))
    assert isinstance(sub.rhs, ir.Arith) and sub.rhs.op == "-" and sub.rhs.ty == BitT(8)
    assert isinstance(sub.lhs, ir.Field) and sub.lhs.name == "ttl"
    # the table: its keys with widths, the signed one typed int<8>
    table = next(d for d in prog.defs if isinstance(d, ir.TableDef))
    assert [(k.width, k.value.ty) for k in table.keys] == [(8, BitT(8)), (8, BitT(8, True))]
    # the ingress: if (isValid) { t.apply(); }
    ingress = prog.controls[1]
    cond = ingress.body[0]
    assert isinstance(cond, ir.If) and isinstance(cond.cond, ir.IsValid)
    assert isinstance(cond.then[0], ir.Eval) and isinstance(cond.then[0].expr, ir.TableApply)
    # every field read or written has the type its header declares (the backends take widths
    # and signs from the nodes, never from a lookup of their own)
    nodes = [n for block in (*prog.controls, prog.parser, *prog.defs) for n in _walk(block)]
    fields = [n for n in nodes if isinstance(n, ir.Field) and n.base.ty in (prog.headers,)]
    fields += [n for n in nodes if isinstance(n, ir.Field) and isinstance(n.base, ir.Field)]
    assert fields
    for f in fields:
        declared = f.base.ty.field(f.name)  # type: ignore[union-attr]
        assert declared is not None and f.ty == declared, (f.name, f.ty, declared)
    widths = {(f.name, str(f.ty)) for f in fields}
    assert {("ttl", "bit<8>"), ("delta", "int<8>"), ("type", "bit<16>")} <= widths, widths


def _frontend_imports(source: str) -> set[str]:
    """Every module a front-end module (``shadowgrad.p4target.frontend.X``) with ``source``
    imports, absolute (and each imported name as ``module.name``)."""
    imported: set[str] = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            imported.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = ["shadowgrad", "p4target", "frontend"][: 4 - n.level] if n.level else []
            mod = ".".join([*base, *([n.module] if n.module else [])])
            imported.add(mod)
            imported.update(f"{mod}.{a.name}" for a in n.names)
    return imported


def test_the_checker_imports_nothing_from_a_backend() -> None:
    """The IR carries P4 names only, so the checker -- the whole front end -- imports nothing
    from a backend (``codegen``: the Python names, the codecs, the code), nor the pipeline or
    the dataplane that run it (issue 25)."""
    # the scan resolves relative imports: the checker's old import of the naming rules is seen
    assert "shadowgrad.p4target.codegen.general.attr" in _frontend_imports(
        "from ..codegen.general import attr\n"
    )
    files = sorted((ROOT / "p4target" / "frontend").glob("*.py"))
    assert ROOT / "p4target" / "frontend" / "checker.py" in files
    bad = {
        f"{path.name}: {mod}"
        for path in files
        for mod in _frontend_imports(path.read_text(encoding="utf-8"))
        if mod.startswith("shadowgrad.") and not mod.startswith("shadowgrad.p4target.frontend")
    }
    assert not bad, bad


def test_facts_carry_p4_names() -> None:
    """What the checker records for the backends names fields and variables as the P4
    program does; the backends derive their own names (a field ``class`` is ``f_class`` in the
    Python, and the straight-line backend still covers the program)."""
    src = (
        PROG.replace("int<8> delta;", "int<8> class;")
        .replace("hdr.ip.delta: exact", "hdr.ip.class: exact")
        .replace("struct metadata { bit<8> m; }", "struct metadata { bit<8> m; bit<8> from; }")
    )
    pipe = Pipeline.compile(src, filename="names.p4")
    assert pipe.facts.headers == {
        "eth": {"dst": 0, "src": 0, "type": 0},
        "ip": {"ttl": 0, "class": 0, "len": 0},
    }
    assert pipe.facts.meta == {"m": 0, "from": 0}
    assert "f_class" in pipe.source and "f_from" in pipe.source
    assert pipe.fast_code is not None, pipe.fast_unsupported
    # the one-call packers are the general backend's, not the checker's
    assert pipe.pack_formats == {"eth_t": "!IHIHH", "ip_t": "!BBH"}


def _bits(t: BitT, x: int) -> int:
    """``x`` as a value of ``t`` (P4: bit<W> modulo 2^W, int<W> two's complement)."""
    x &= (1 << t.width) - 1
    return x - (1 << t.width) if t.signed and x >> (t.width - 1) else x


def _ref_arith(op: str, t: BitT, a: int, b: int) -> int:
    lo, hi = (
        (-(1 << (t.width - 1)), (1 << (t.width - 1)) - 1) if t.signed else (0, (1 << t.width) - 1)
    )
    if op == "|+|":
        return max(lo, min(hi, a + b))
    if op == "|-|":
        return max(lo, min(hi, a - b))
    ops = {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "&": lambda: a & b,
        "|": lambda: a | b,
        "^": lambda: a ^ b,
        "<<": lambda: a << b,
        ">>": lambda: a >> b,
        "/": lambda: a // b if b else 0,
        "%": lambda: a % b if b else 0,
    }
    r = ops[op]()
    return _bits(t, r)


def _eval(e: ir.Expr, env: dict[str, int]) -> object:
    """The general backend's Python for ``e``, run with the pipeline's helpers."""
    return eval(py_expr(e), {"_div": _div, "_mod": _mod}, env)


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("width", [1, 7, 8, 16, 33])
def test_arithmetic_nodes_compute_what_p4_says(width: int, signed: bool) -> None:
    rng = random.Random(width * 2 + signed)
    t = BitT(width, signed)
    a, b = ir.Ref(t, "local", "a"), ir.Ref(t, "local", "b")
    ops = ["+", "-", "*", "&", "|", "^", "|+|", "|-|", ">>", "<<"]
    if not signed:
        ops += ["/", "%"]
    for _ in range(200):
        x = _bits(t, rng.getrandbits(width))
        y = _bits(t, rng.getrandbits(width))
        for op in ops:
            bv = y
            rhs: ir.Expr = b
            if op in ("<<", ">>"):  # a shift amount is unsigned
                bv = rng.randrange(width + 2)
                rhs = ir.Ref(BitT(8), "local", "b")
            got = _eval(ir.Arith(t, op, a, rhs), {"a": x, "b": bv})
            assert got == _ref_arith(op, t, x, bv), (op, t, x, bv)
        assert _eval(ir.Unary(t, "-", a), {"a": x}) == _bits(t, -x)
        assert _eval(ir.Unary(t, "~", a), {"a": x}) == _bits(t, ~x)


def test_slices_concatenation_and_casts() -> None:
    rng = random.Random(7)
    u16, s16, u8, s8 = BitT(16), BitT(16, True), BitT(8), BitT(8, True)
    for _ in range(500):
        x = rng.getrandbits(16)
        sx = _bits(s16, x)
        v, sv = ir.Ref(u16, "local", "v"), ir.Ref(s16, "local", "v")
        # slices of bit and int values are unsigned bits of the two's complement
        assert _eval(ir.Slice(BitT(5), v, 11, 7), {"v": x}) == (x >> 7) & 31
        assert _eval(ir.Slice(BitT(5), sv, 11, 7), {"v": sx}) == (x >> 7) & 31
        # ++: a's bits above b's; the result signed when a is
        hi, lo = rng.getrandbits(8), rng.getrandbits(8)
        cat = ir.Concat(u16, ir.Ref(u8, "local", "h"), ir.Ref(u8, "local", "l"))
        assert _eval(cat, {"h": hi, "l": lo}) == hi << 8 | lo
        scat = ir.Concat(s16, ir.Ref(s8, "local", "h"), ir.Ref(u8, "local", "l"))
        assert _eval(scat, {"h": _bits(s8, hi), "l": lo}) == _bits(s16, hi << 8 | lo)
        # casts: narrowing wraps, bit <-> int reinterprets, bool <-> bit<1>
        assert _eval(ir.Cast(u8, v), {"v": x}) == x & 255
        assert _eval(ir.Cast(s8, v), {"v": x}) == _bits(s8, x)
        assert _eval(ir.Cast(u16, sv), {"v": sx}) == x
        assert _eval(ir.Cast(s16, v), {"v": x}) == sx
        assert _eval(ir.Cast(BitT(32), v), {"v": x}) == x
    flag = ir.Ref(BoolT(), "local", "f")
    assert [_eval(ir.Cast(BitT(1), flag), {"f": f}) for f in (False, True)] == [0, 1]
    one = ir.Ref(BitT(1), "local", "o")
    assert [_eval(ir.Cast(BoolT(), one), {"o": o}) for o in (0, 1)] == [False, True]
