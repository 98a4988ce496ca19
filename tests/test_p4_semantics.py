"""Randomised differential test of expression semantics.

Random expression trees over ``bit<W>``/``int<W>`` header fields are compiled into one program
and evaluated by the target; an independent reference evaluator (written from the P4 spec:
wrap modulo 2^W, two's complement, saturation, slices, concatenation, casts) predicts each
result. Every expression is also emitted with all-literal operands so the checker's constant
folding is compared against the same reference.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

pytest.importorskip("p4")

from shadowgrad.p4target.dataplane import Dataplane
from shadowgrad.p4target.pipeline import Pipeline

VARS = {
    "a": (8, False),
    "b": (8, False),
    "c": (16, False),
    "d": (16, False),
    "s": (8, True),
    "t": (8, True),
    "u": (16, True),
}


def wrap(v: int, w: int, signed: bool) -> int:
    v &= (1 << w) - 1
    return v - (1 << w) if signed and v >> (w - 1) else v


def tname(w: int, s: bool) -> str:
    return f"{'int' if s else 'bit'}<{w}>"


@dataclass
class E:
    text: str  # using header fields
    ctext: str  # all operands replaced by typed literals (constant folding)
    w: int
    s: bool
    ev: Callable[[dict[str, int]], int]


def lit(v: int, w: int, s: bool) -> str:
    if s and v < 0:
        if -v < (1 << (w - 1)):
            return f"(-{w}s{-v})"
        return f"(({tname(w, s)}) {w}w{v & ((1 << w) - 1)})"
    return f"{w}{'s' if s else 'w'}{v}"


def gen(
    rng: random.Random, env: dict[str, int], depth: int, want: tuple[int, bool] | None = None
) -> E:
    if depth == 0 or rng.random() < 0.25:
        cands = [n for n, t in VARS.items() if want is None or t == want]
        if cands and rng.random() < 0.8:
            n = rng.choice(cands)
            w, s = VARS[n]
            return E(f"hdr.v.{n}", lit(env[n], w, s), w, s, lambda e, n=n: e[n])
        w, s = want or rng.choice(list(VARS.values()))
        v = wrap(rng.getrandbits(w), w, s)
        return E(lit(v, w, s), lit(v, w, s), w, s, lambda e, v=v: v)
    kind = rng.choice(["bin", "bin", "bin", "shift", "unary", "cast", "slice", "concat", "cond"])
    if want is not None and kind in ("slice", "concat"):
        kind = "cast"
    if kind == "bin":
        x = gen(rng, env, depth - 1, want)
        y = gen(rng, env, depth - 1, (x.w, x.s))
        op = rng.choice(["+", "-", "*", "&", "|", "^", "|+|", "|-|"])
        w, s = x.w, x.s
        lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if s else (0, (1 << w) - 1)

        def f(e: dict[str, int], x: E = x, y: E = y, op: str = op) -> int:
            a, b = x.ev(e), y.ev(e)
            if op == "|+|":
                return max(lo, min(hi, a + b))
            if op == "|-|":
                return max(lo, min(hi, a - b))
            r = {"+": a + b, "-": a - b, "*": a * b, "&": a & b, "|": a | b, "^": a ^ b}[op]
            return wrap(r, w, s)

        return E(f"({x.text} {op} {y.text})", f"({x.ctext} {op} {y.ctext})", w, s, f)
    if kind == "shift":
        x = gen(rng, env, depth - 1, want)
        k = rng.randrange(0, x.w + 2)
        op = rng.choice(["<<", ">>"])

        def g(e: dict[str, int], x: E = x, k: int = k, op: str = op) -> int:
            a = x.ev(e)
            return wrap(a << k, x.w, x.s) if op == "<<" else a >> k

        return E(f"({x.text} {op} {k})", f"({x.ctext} {op} {k})", x.w, x.s, g)
    if kind == "unary":
        x = gen(rng, env, depth - 1, want)
        op = rng.choice(["-", "~"])
        return E(
            f"({op}{x.text})",
            f"({op}{x.ctext})",
            x.w,
            x.s,
            lambda e, x=x, op=op: wrap(-x.ev(e) if op == "-" else ~x.ev(e), x.w, x.s),
        )
    if kind == "cast":
        w, s = want or rng.choice(list(VARS.values()))
        x = gen(rng, env, depth - 1)
        t = tname(w, s)
        return E(
            f"(({t}) {x.text})",
            f"(({t}) {x.ctext})",
            w,
            s,
            lambda e, x=x, w=w, s=s: wrap(x.ev(e), w, s),
        )
    if kind == "slice":
        x = gen(rng, env, depth - 1)
        lo_ = rng.randrange(x.w)
        hi_ = rng.randrange(lo_, x.w)
        return E(
            f"{x.text}[{hi_}:{lo_}]" if x.text.startswith("hdr") else f"({x.text})[{hi_}:{lo_}]",
            f"({x.ctext})[{hi_}:{lo_}]",
            hi_ - lo_ + 1,
            False,
            lambda e, x=x, hi_=hi_, lo_=lo_: (
                (wrap(x.ev(e), x.w, False) >> lo_) & ((1 << (hi_ - lo_ + 1)) - 1)
            ),
        )
    if kind == "concat":
        x = gen(rng, env, depth - 1)
        y = gen(rng, env, depth - 1)
        if x.w + y.w > 32:
            return x
        return E(
            f"({x.text} ++ {y.text})",
            f"({x.ctext} ++ {y.ctext})",
            x.w + y.w,
            x.s,
            lambda e, x=x, y=y: wrap(
                (wrap(x.ev(e), x.w, False) << y.w) | wrap(y.ev(e), y.w, False), x.w + y.w, x.s
            ),
        )
    # cond
    p = gen(rng, env, depth - 1)
    q = gen(rng, env, depth - 1, (p.w, p.s))
    op = rng.choice(["==", "!=", "<", "<=", ">", ">="])
    x = gen(rng, env, depth - 1, want)
    y = gen(rng, env, depth - 1, (x.w, x.s))
    cmp = {
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
        "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b,
    }[op]
    return E(
        f"({p.text} {op} {q.text} ? {x.text} : {y.text})",
        f"({p.ctext} {op} {q.ctext} ? {x.ctext} : {y.ctext})",
        x.w,
        x.s,
        lambda e, p=p, q=q, x=x, y=y, cmp=cmp: x.ev(e) if cmp(p.ev(e), q.ev(e)) else y.ev(e),
    )


def build(exprs: list[E]) -> str:
    fields = "".join(
        f"    {tname(e.w, e.s)} r{i};\n    {tname(e.w, e.s)} k{i};\n" for i, e in enumerate(exprs)
    )
    total = sum(2 * e.w for e in exprs)
    pad = (-total) % 8
    padf = f"    bit<{pad}> pad;\n" if pad else ""
    body = "".join(
        f"        hdr.r.r{i} = {e.text};\n        hdr.r.k{i} = {e.ctext};\n"
        for i, e in enumerate(exprs)
    )
    return f"""#include <core.p4>
#include <v1model.p4>
header vals_t {{ bit<8> a; bit<8> b; bit<16> c; bit<16> d; int<8> s; int<8> t; int<16> u; }}
header res_t {{
{fields}{padf}}}
struct hs {{ vals_t v; res_t r; }}
struct m_t {{ }}
parser P(packet_in pk, out hs hdr, inout m_t meta, inout standard_metadata_t sm) {{
    state start {{ pk.extract(hdr.v); transition accept; }}
}}
control N(inout hs hdr, inout m_t meta) {{ apply {{ }} }}
control I(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) {{
    apply {{
        sm.egress_spec = 1;
        hdr.r.setValid();
{body}    }}
}}
control E(inout hs hdr, inout m_t meta, inout standard_metadata_t sm) {{ apply {{ }} }}
control D(packet_out pk, in hs hdr) {{ apply {{ pk.emit(hdr.v); pk.emit(hdr.r); }} }}
V1Switch(P(), N(), I(), E(), N(), D()) main;
"""


@pytest.mark.parametrize("seed", range(6))
def test_expressions_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    env = {n: wrap(rng.getrandbits(w), w, s) for n, (w, s) in VARS.items()}
    exprs = [gen(rng, env, rng.randrange(1, 5)) for _ in range(60)]
    dp = Dataplane(Pipeline.compile(build(exprs), filename=f"expr{seed}.p4"))
    raw = b"".join((env[n] & ((1 << w) - 1)).to_bytes(w // 8, "big") for n, (w, _s) in VARS.items())
    ((_port, out),) = dp.process(0, raw)
    bits = int.from_bytes(out[len(raw) :], "big")
    nbits = (len(out) - len(raw)) * 8
    pos = nbits
    for i, e in enumerate(exprs):
        want = e.ev(env)
        for which in ("r", "k"):
            pos -= e.w
            got = wrap((bits >> pos) & ((1 << e.w) - 1), e.w, e.s)
            assert got == want, (which, i, e.text if which == "r" else e.ctext, got, want)
