"""The general backend: the Python the dataplane runs for any program the checker accepts.

Written from the checked program's IR (:mod:`..frontend.ir`, :func:`module_code`): a class per
header and struct (headers' fields default to class attributes; structs keep ``__slots__``), a
codec per header type (``_unpack_``/``_ext_``/``_look_``/``_pk_``, and one ``struct`` format for
a header whose fields pack into whole bytes), one parse function from the parser's states, a
function per control, action, table and sub-control from their statements (:func:`py_expr`,
:class:`PyWriter`), the context functions (``new_ctx``, ``copy_ctx``, ``reset_meta``,
``preserve``) and the names that bind the code to the runtime. This module is the one place that
knows what Python an IR node becomes; it works from types and IR, never from P4 syntax.
:func:`build_general` returns the module as a tree, which the pipeline compiles and the
straight-line backend (:mod:`.straight`) rewrites.
"""

from __future__ import annotations

import ast
import keyword
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..frontend import ir
from ..frontend.diagnostics import Diagnostic, Loc
from ..frontend.types import (
    BitT,
    BoolT,
    EnumT,
    ErrorT,
    StackT,
    StructT,
    TupleT,
    Ty,
    UnionT,
    VarbitT,
    bit_width,
    scalar_default,
)

__all__ = [
    "Emitter",
    "HeaderCodec",
    "PyWriter",
    "GeneralModule",
    "build_general",
    "module_code",
    "attr",
    "csum16_terms",
    "default_value",
    "header_codec",
    "packed_bytes",
    "parser_code",
    "py_expr",
    "runtime_code",
    "scalar_default",
    "struct_plan",
    "types_code",
]

_RESERVED_ATTRS = {"_v_", "copy"}
PARSER_TREE_MAX = 64  # states emitted when a DAG parser is inlined as nested ifs


def attr(name: str) -> str:
    """Python attribute name for a P4 field name."""
    if keyword.iskeyword(name) or name in _RESERVED_ATTRS or name.startswith("__"):
        return "f_" + name
    return name


class Emitter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ind = 0

    def __call__(self, s: str) -> None:
        self.lines.append("    " * self.ind + s)

    @contextmanager
    def block(self, head: str) -> Iterator[None]:
        self(head)
        self.ind += 1
        n = len(self.lines)
        yield
        if len(self.lines) == n:
            self("pass")
        self.ind -= 1


def class_name(t: StructT) -> str:
    """The Python class that holds values of the struct-like type ``t`` in generated code."""
    if isinstance(t, StackT):
        assert t.elem is not None
        return f"T_{t.elem.name}_{t.size}"
    if isinstance(t, TupleT):
        return f"T_tuple_{t.index}"
    return ("H_" if t.is_header else "U_" if isinstance(t, UnionT) else "S_") + t.name


def default_value(t: Ty) -> str:
    """Python for the initial value of a variable of type ``t``."""
    if isinstance(t, StructT):
        return f"{class_name(t)}()"
    if isinstance(t, BoolT):
        return "False"
    if isinstance(t, (BitT, ErrorT, EnumT)):
        return "0"
    if isinstance(t, VarbitT):
        return "(0, 0)"  # (value, nbits)
    raise Diagnostic(Loc("<type>", 0, 0), f"cannot declare a variable of type {t}")


@dataclass(frozen=True)
class HeaderCodec:
    """How the code reads and writes a header type: ``nbytes`` on the wire; ``unpack``, the
    lines that set the fields of header ``{H}`` from its bits as one int ``{V}`` (validity
    last); ``struct``, when the fields pack into whole bytes, the ``struct`` format, the lines
    that set ``{H}``'s fields from its unpacked values ``{U}`` and the pack arguments (see
    :func:`struct_plan`)."""

    nbytes: int
    unpack: list[str]
    struct: tuple[str, list[str], list[str]] | None


def _field_value(bits: str, ft: Ty, w: int) -> str:
    """The value of a ``w``-bit header field of type ``ft`` from the expression of its bits:
    two's complement for ``int<W>``, ``bool`` for a bool field, the bits as they are else."""
    if isinstance(ft, BitT) and ft.signed:
        h = 1 << (w - 1)
        return f"(({bits}) ^ {h}) - {h}"
    if isinstance(ft, BoolT):
        return f"bool({bits})"
    return bits


def header_codec(t: StructT) -> HeaderCodec:
    """The codec of header type ``t`` (of a header with a varbit field: its size without the
    varbit and no lines; :func:`varbit_unpack` and ``_pk_<T>`` read and write it)."""
    total = t.width
    if t.varbit is not None:
        return HeaderCodec(total // 8, [], None)
    unpack: list[str] = []
    shift = total
    leaves = [(_path(p), ft) for p, ft in t.leaves()]  # a struct field: its fields, nested
    for n, ft in leaves:
        w = bit_width(ft) or 0
        shift -= w
        m = (1 << w) - 1
        ex = f"({{V}} >> {shift}) & {m}" if shift else f"{{V}} & {m}"
        unpack.append(f"{{H}}.{n} = {_field_value(ex, ft, w)}")
    unpack.append("{H}._v_ = True")
    plan = (
        None  # a bool field is a Python bool: not in a struct format
        if any(isinstance(ft, BoolT) for _, ft in leaves)
        else struct_plan(
            [(n, bit_width(ft) or 0, isinstance(ft, BitT) and ft.signed) for n, ft in leaves]
        )
    )
    return HeaderCodec(total // 8, unpack, plan)


def _path(p: tuple[str, ...]) -> str:
    """Python for a field path (``row.e``) below a header."""
    return ".".join(attr(n) for n in p)


def types_code(structs: list[StructT], codecs: dict[str, HeaderCodec], too_short: int) -> list[str]:
    """The classes of ``structs`` (in order), each header's followed by its codec functions;
    ``too_short`` is the parser error code of PacketTooShort."""
    o = Emitter()
    # Headers are plain classes whose fields default to class attributes (hot path: a
    # packet creates every header, most are extracted, i.e. fully written, or never
    # touched); structs keep __slots__ and write every field at creation.
    for t in structs:
        with o.block(f"class {class_name(t)}:"):
            if t.is_header:
                o("_v_ = False")
                nested = [(n, ft) for n, ft in t.fields if isinstance(ft, StructT)]
                for n, ft in t.fields:
                    if not isinstance(ft, StructT):
                        o(f"{attr(n)} = {default_value(ft)}")
                if nested:  # a struct field is each header's own
                    with o.block("def __init__(self):"):
                        for n, ft in nested:
                            o(f"self.{attr(n)} = {default_value(ft)}")
            else:
                o(f"__slots__ = {tuple(attr(n) for n, _ in t.fields)!r}")
                with o.block("def __init__(self):"):
                    for n, ft in t.fields:
                        o(f"self.{attr(n)} = {default_value(ft)}")
            with o.block("def copy(self):"):
                o(f"n = _new({class_name(t)})")
                if t.is_header:
                    o("n._v_ = self._v_")
                for n, ft in t.fields:
                    a = attr(n)
                    o(f"n.{a} = self.{a}{'.copy()' if isinstance(ft, StructT) else ''}")
                o("return n")
        if t.is_header and t.varbit is not None:
            _varbit_pack(o, t)
        elif t.is_header:
            _codec_code(o, t, codecs[t.name], too_short)
    return o.lines


def _codec_code(o: Emitter, t: StructT, codec: HeaderCodec, too_short: int) -> None:
    total, nb = t.width, codec.nbytes
    # templates: {H} the header, {V} the header's bits as an int
    unpack = [ln.replace("{H}", "h").replace("{V}", "v") for ln in codec.unpack]
    if codec.struct is not None:
        fmt = codec.struct[0]
        o(f"_SU_{t.name} = _Struct({fmt!r}).unpack_from")
        o(f"_SP_{t.name} = _Struct({fmt!r}).pack")
    with o.block(f"def _unpack_{t.name}(h, v):"):
        for line in unpack:
            o(line)
    with o.block(f"def _ext_{t.name}(C, h):"):
        o("o = C.off")
        o(f"e = o + {nb}")
        with o.block("if e > len(C.buf):"):
            o(f"raise _ParserError({too_short})")
        o("C.off = e")
        # the unpack inlined: one call less per extracted header (hot path)
        o("v = int.from_bytes(C.buf[o:e], 'big')")
        for line in unpack:
            o(line)
    with o.block(f"def _look_{t.name}(C):"):
        o(f"h = {class_name(t)}()")
        o(f"_unpack_{t.name}(h, _peek(C, {total}))")
        o("return h")
    with o.block(f"def _pk_{t.name}(h):"):
        parts = []
        shift = total
        for p, ft in t.leaves():
            w = bit_width(ft) or 0
            shift -= w
            src = f"h.{_path(p)}"
            if isinstance(ft, BitT) and ft.signed:
                src = f"({src} & {(1 << w) - 1})"
            elif isinstance(ft, BoolT):
                src = f"(1 if {src} else 0)"
            parts.append(f"({src} << {shift})" if shift else src)
        o(f"return ({' | '.join(parts) or '0'}).to_bytes({nb}, 'big')")


def _varbit_layout(t: StructT) -> list[tuple[str, Ty, str]]:
    """Header ``t`` (with a varbit field) as (field, type, Python for its shift from the end of
    the header's bits); the varbit's length at run time is ``_L``."""
    vb = t.varbit
    assert vb is not None
    out: list[tuple[str, Ty, str]] = []
    shift = 0
    after = True
    for n, ft in reversed(t.fields):
        if isinstance(ft, VarbitT):
            out.append((n, ft, str(shift)))
            after = False
            continue
        w = bit_width(ft) or 0
        out.append((n, ft, str(shift) if after else f"{shift} + _L"))
        shift += w
    return out[::-1]


def varbit_unpack(t: StructT) -> list[str]:
    """Lines that set the fields of header ``{H}`` (with a varbit field of ``_L`` bits) from
    its bits as one int ``{V}`` (validity last)."""
    lines = []
    for n, ft, sh in _varbit_layout(t):
        src = f"({{V}} >> ({sh}))"
        if isinstance(ft, VarbitT):
            lines.append(f"{{H}}.{attr(n)} = ({src} & ((1 << _L) - 1), _L)")
            continue
        w = bit_width(ft) or 0
        lines.append(f"{{H}}.{attr(n)} = {_field_value(f'{src} & {(1 << w) - 1}', ft, w)}")
    lines.append("{H}._v_ = True")
    return lines


def _varbit_pack(o: Emitter, t: StructT) -> None:
    """``_pk_<T>(h)`` of a header with a varbit field: its bits, as many bytes as it has."""
    vb = t.varbit
    assert vb is not None
    with o.block(f"def _pk_{t.name}(h):"):
        o(f"V, _L = h.{attr(vb[0])}")
        parts = []
        for n, ft, sh in _varbit_layout(t):
            if isinstance(ft, VarbitT):
                parts.append(f"(V << ({sh}))")
                continue
            src = f"h.{attr(n)}"
            w = bit_width(ft) or 0
            if isinstance(ft, BitT) and ft.signed:
                src = f"({src} & {(1 << w) - 1})"
            elif isinstance(ft, BoolT):
                src = f"(1 if {src} else 0)"
            parts.append(f"({src} << ({sh}))")
        o(f"return ({' | '.join(parts)}).to_bytes(({t.width} + _L) // 8, 'big')")


def _keyset_cond(m: ir.KeysetMatch, kvar: str, key: ir.Expr) -> str:
    if m.kind == "mask":
        return f"({kvar} & {m.b}) == {m.a & m.b}"
    if m.kind == "range":
        return f"{m.a} <= {kvar} <= {m.b}"
    return f"{kvar} == {bool(m.a)}" if isinstance(key.ty, BoolT) else f"{kvar} == {m.a}"


def _transition_items(tr: ir.Transition) -> list[tuple[str, str, str]]:
    """A transition as ``(kind, text, target)`` items in order: ``line`` (a select key
    computed once, ``k0 = ...``), ``if`` (condition, target state), ``goto`` (target state),
    ``raise`` (NoMatch)."""
    out = [("line", f"k{i} = {py_expr(k)}", "") for i, k in enumerate(tr.keys)]
    for c in tr.cases:
        conds = [
            _keyset_cond(m, f"k{i}", tr.keys[i]) for i, m in enumerate(c.matches) if m is not None
        ]
        out.append(("if", " and ".join(conds) or "True", c.target))
    if tr.default is not None:
        out.append(("goto", "", tr.default))
    else:
        out.append(("raise", f"raise _ParserError({tr.no_match})", ""))
    return out


def _fits_tree(states: dict[str, list[tuple[str, str, str]]]) -> bool:
    """Inlining from start emits at most PARSER_TREE_MAX states (so no cycle)."""
    emitted = 0
    stack: list[tuple[str, tuple[str, ...]]] = [("start", ())]
    while stack:
        name, seen = stack.pop()
        if name == "accept":
            continue
        emitted += 1
        if name in seen or emitted > PARSER_TREE_MAX:
            return False
        stack.extend((t, (*seen, name)) for k, _c, t in states[name] if k in ("if", "goto"))
    return True


def parser_code(p: ir.ParserDef, w: PyWriter, prologue: list[str]) -> list[str]:
    """``parse(C)``: one function for the whole parser (hot path: no call per state), starting
    with ``prologue`` (the frame and the parser's locals). When the states reachable from start
    form a small DAG the transitions are nested ifs with the target states inlined (a tree:
    every path ends in return or raise), otherwise a loop over a state number (a transition
    sets it and continues; accept breaks) with bmv2's ParserTimeout after 1,000 states."""
    o = Emitter()
    num = {n: i for i, n in enumerate(p.states)}
    items = {n: _transition_items(st.transition) for n, st in p.states.items()}
    code: dict[str, list[str]] = {}
    for n, st in p.states.items():
        c = Emitter()
        w.stmts(c, st.body)
        code[n] = c.lines

    def jump(tgt: str) -> str:
        return "break" if tgt == "accept" else f"s = {num[tgt]}; continue"

    def emit_state(name: str, inline: bool) -> None:
        """State ``name``'s code; its transitions inline the next states (a tree) or jump to
        them (the loop over state numbers)."""
        for ln in code[name]:
            o(ln)
        for kind, text, tgt in items[name]:
            if kind in ("line", "raise"):
                o(text)
            elif not inline:
                o(jump(tgt) if kind == "goto" else f"if {text}: {jump(tgt)}")
            elif kind == "goto":
                emit_tree(tgt)
            else:
                with o.block(f"if {text}:"):
                    emit_tree(tgt)

    def emit_tree(name: str) -> None:
        if name == "accept":
            o("return")
        else:
            emit_state(name, inline=True)

    timeout = p.timeout_error
    with o.block("def parse(C):"):
        for ln in prologue:
            o(ln)
        o("_b = C.buf")  # the frame never changes while parsing
        o("_n = len(_b)")
        if _fits_tree(items):
            emit_tree("start")
            return o.lines
        o(f"s = {num['start']}")
        o("n = 0")
        with o.block("while True:"):
            # the 1001st state still runs before ParserTimeout (as one call per state did)
            with o.block("if n > 1000:"):
                o(f"raise _ParserError({timeout})")
            o("n += 1")
            for i, name in enumerate(p.states):
                with o.block(f"{'if' if i == 0 else 'elif'} s == {num[name]}:"):
                    emit_state(name, inline=False)
        with o.block("if n > 1000:"):
            o(f"raise _ParserError({timeout})")
    return o.lines


def runtime_code(
    headers_t: StructT,
    meta_t: StructT,
    std_t: StructT,
    egress_hdrs: set[str] | None,
    field_lists: dict[int, list[str]],
) -> list[str]:
    """new_ctx / copy_ctx / reset_meta / preserve for a program's types. ``egress_hdrs``: the
    headers egress and compute may write (None: any), which a replica copies; ``field_lists``:
    the metadata fields of each field list index that ``preserve`` copies."""
    o = Emitter()
    ht, mt, st = class_name(headers_t), class_name(meta_t), class_name(std_t)
    with o.block("def new_ctx(frame):"):
        o("C = PacketCtx()")
        o(f"C.hdr = {ht}()")
        o(f"C.meta = {mt}()")
        o(f"C.std = {st}()")
        o("C.buf = frame")
        o("return C")
    with o.block("def copy_ctx(C):"):
        o("K = PacketCtx()")
        eh = egress_hdrs
        if eh is None:
            o("K.hdr = C.hdr.copy()")
        else:
            # a replica only runs egress, compute checksum and the deparser, which never
            # touch the headers they do not mention: those are shared, not copied
            o("H = C.hdr")
            o(f"N = _new({ht})")
            for n, ft in headers_t.fields:
                an = attr(n)
                deep = isinstance(ft, StructT) and an in eh
                o(f"N.{an} = H.{an}{'.copy()' if deep else ''}")
            o("K.hdr = N")
        o("K.meta = C.meta.copy()")
        o("K.std = C.std.copy()")
        o("K.buf = C.buf")
        o("K.off = C.off")
        o("K.payload_off = C.payload_off")
        o("K.truncate_len = C.truncate_len")
        o("return K")
    with o.block("def reset_meta(C):"):
        o(f"C.meta = {mt}()")
        o(f"C.std = {st}()")
    lists: dict[int, list[str]] = {}
    fields = dict(meta_t.fields)
    for idx, names in field_lists.items():
        for n in names:
            cp = ".copy()" if isinstance(fields[n], StructT) else ""
            lists.setdefault(idx, []).append(f"D.meta.{attr(n)} = S.meta.{attr(n)}{cp}")
    with o.block("def preserve(S, D, idx):"):
        for idx, assigns in sorted(lists.items()):
            with o.block(f"if idx == {idx}:"):
                for a_ in assigns:
                    o(a_)
    return o.lines


def struct_plan(fields: list[tuple[str, int, bool]]) -> tuple[str, list[str], list[str]] | None:
    """A header's fields (attribute, width, signed) as one ``struct`` format (big-endian,
    B/H/I/Q pieces per byte-aligned run of fields), the lines that set ``{H}.<field>`` from the
    unpacked ``_u<i>`` values, and the pack arguments (expressions over ``{H}``). None when a
    run does not end on a byte boundary."""
    chunks: list[tuple[int, list[tuple[str, int, bool]]]] = []
    cur: list[tuple[str, int, bool]] = []
    bits = 0
    for f in fields:
        cur.append(f)
        bits += f[1]
        if bits % 8 == 0:
            chunks.append((bits // 8, cur))
            cur, bits = [], 0
    if cur or not chunks:
        return None
    fmt = "!"
    nvals = 0
    lines: list[str] = []
    pack: list[str] = []
    for nbytes, fs in chunks:
        pieces: list[int] = []
        rem = nbytes
        for size, ch in ((8, "Q"), (4, "I"), (2, "H"), (1, "B")):
            while rem >= size:
                pieces.append(size)
                fmt += ch
                rem -= size
        names = [f"_u{nvals + i}" for i in range(len(pieces))]
        nvals += len(pieces)
        if len(pieces) == 1:
            cexpr = names[0]
        else:
            parts = []
            shift = nbytes * 8
            for size, nm in zip(pieces, names, strict=True):
                shift -= size * 8
                parts.append(f"({nm} << {shift})" if shift else nm)
            cexpr = "(" + " | ".join(parts) + ")"
            if len(fs) > 1:
                lines.append(f"_c = {cexpr}")
                cexpr = "_c"
        # unpack: fields from the chunk value
        shift = nbytes * 8
        srcs = []
        for name, w, signed in fs:
            shift -= w
            m = (1 << w) - 1
            ex = (
                cexpr
                if len(fs) == 1
                else (f"({cexpr} >> {shift}) & {m}" if shift else f"{cexpr} & {m}")
            )
            if signed:
                h = 1 << (w - 1)
                ex = f"(({ex}) ^ {h}) - {h}"
            lines.append(f"{{H}}.{name} = {ex}")
            src = f"({{H}}.{name} & {m})" if signed else f"{{H}}.{name}"
            srcs.append(f"({src} << {shift})" if shift else src)
        # pack: the chunk value split into its pieces
        val = srcs[0] if len(srcs) == 1 else "(" + " | ".join(srcs) + ")"
        shift = nbytes * 8
        for size in pieces:
            shift -= size * 8
            if len(pieces) == 1:
                pack.append(val)
            else:
                pack.append(
                    f"({val} >> {shift}) & {(1 << (size * 8)) - 1}"
                    if shift
                    else f"{val} & {(1 << (size * 8)) - 1}"
                )
    lines.insert(0, f"{', '.join(f'_u{i}' for i in range(nvals))}, = {{U}}")
    return fmt, lines, pack


def csum16_terms(fl: list[tuple[str, int]]) -> str:
    """Python for a non-negative number congruent modulo 0xFFFF to the (value, width) fields
    packed as for :func:`packed_bytes` (and padded to 16-bit words as the Internet checksum
    does), and zero only when every field is: ``2**16 == 1 (mod 0xFFFF)``, so each field
    counts shifted by its bit offset modulo 16. ``_hash_csum16_fold`` turns it into the
    checksum."""
    total = sum(w for _, w in fl)
    padded = -(-total // 16) * 16
    parts = []
    shift = padded
    for p, w in fl:
        shift -= w
        k = shift % 16
        parts.append(f"({p} << {k})" if k else p)
    return "(" + " + ".join(parts) + ")"


def packed_bytes(fl: list[tuple[str, int]]) -> str:
    """Python for the bytes of (value, width) fields packed MSB-first, zero-padded at the end
    to whole bytes (how bmv2 serialises a field list for checksums and hashes)."""
    total = sum(w for _, w in fl)
    pad = (-total) % 8
    if total == 0:
        return "b''"
    parts = []
    shift = total + pad
    for p, w in fl:
        shift -= w
        parts.append(f"({p} << {shift})" if shift else p)
    return f"({' | '.join(parts)}).to_bytes({(total + pad) // 8}, 'big')"


# ---------------------------------------------------------------------------- IR -> Python
def _unsigned(x: str, t: Ty) -> str:
    """Python ``x`` (a value of ``t``) as its bits: a bool as 0/1, an int<W> masked to W bits."""
    if isinstance(t, BoolT):
        return f"(1 if {x} else 0)"
    if isinstance(t, BitT) and t.signed:
        return f"({x} & {(1 << t.width) - 1})"
    return x


def _norm(x: str, t: BitT) -> str:
    """``x`` reduced to ``t``'s range (two's complement for int<W>)."""
    m = (1 << t.width) - 1
    if t.signed:
        h = 1 << (t.width - 1)
        return f"((({x}) + {h} & {m}) - {h})"
    return f"(({x}) & {m})"


def _arith(e: ir.Arith) -> str:
    t = e.ty
    assert isinstance(t, BitT)
    a, b, op = py_expr(e.a), py_expr(e.b), e.op
    m = (1 << t.width) - 1
    h = 1 << (t.width - 1)
    if op in ("+", "-", "*", "<<"):
        return _norm(f"{a} {op} {b}", t)
    if op in ("/", "%"):
        return f"_{'div' if op == '/' else 'mod'}({a}, {b})"
    if op in ("&", "|", "^", ">>"):
        return f"({a} {op} {b})"
    add = "+" if op == "|+|" else "-"
    if t.signed:
        return f"max({-h}, min({a} {add} {b}, {h - 1}))"
    return f"min({a} + {b}, {m})" if op == "|+|" else f"max({a} - {b}, 0)"


def _unary(e: ir.Unary) -> str:
    x = py_expr(e.x)
    if e.op == "!":
        return f"(not {x})"
    t = e.ty
    assert isinstance(t, BitT)
    if e.op == "-":
        return _norm(f"-{x}", t)
    return f"(~{x})" if t.signed else f"({x} ^ {(1 << t.width) - 1})"


def _cast(e: ir.Cast) -> str:
    t, src, x = e.ty, e.x.ty, py_expr(e.x)
    if isinstance(t, BitT):
        if isinstance(src, BoolT):
            return f"(1 if {x} else 0)"
        if isinstance(src, EnumT) and src.underlying is not None:
            src = src.underlying
        if not t.signed and isinstance(src, BitT) and not src.signed and src.width <= t.width:
            return x
        return _norm(x, t)
    if isinstance(t, BoolT):
        return f"({x} == 1)"
    return x  # an enum from its underlying type


def _concat(e: ir.Concat) -> str:
    a, b, t = e.a.ty, e.b.ty, e.ty
    assert isinstance(a, BitT) and isinstance(b, BitT) and isinstance(t, BitT)
    py = f"(({_unsigned(py_expr(e.a), a)} << {b.width}) | {_unsigned(py_expr(e.b), b)})"
    if t.signed:
        h = 1 << (t.width - 1)
        py = f"(({py} + {h} & {(1 << t.width) - 1}) - {h})"
    return py


def _slice(e: ir.Slice) -> str:
    src = _unsigned(py_expr(e.x), e.x.ty)
    return f"(({src} >> {e.lo}) & {(1 << (e.hi - e.lo + 1)) - 1})"


def _ref(e: ir.Ref) -> str:
    if e.kind == "ctx":
        return f"C.{e.name}"
    if e.kind == "frame":
        return f"F.{attr(e.name)}"
    return e.name


def _table_result(e: ir.TableResult) -> str:
    a = py_expr(e.apply)
    return {"hit": f"{a}[1]", "miss": f"(not {a}[1])", "action_run": f"{a}[0]"}[e.what]


def _lookahead(e: ir.Lookahead) -> str:
    t = e.ty
    if isinstance(t, BitT):
        return f"_peek(C, {t.width})"
    assert isinstance(t, StructT)
    return f"_look_{t.name}(C)"


_EXPR: dict[type, Callable[[Any], str]] = {
    ir.Const: lambda e: repr(e.value) if isinstance(e.value, str) else str(e.value),
    ir.Ref: _ref,
    ir.Entity: lambda e: "",
    ir.Field: lambda e: f"{py_expr(e.base)}.{attr(e.name)}",
    ir.IsValid: lambda e: f"{py_expr(e.header)}._v_",
    ir.Arith: _arith,
    ir.Unary: _unary,
    ir.Logic: lambda e: f"({py_expr(e.a)} {'and' if e.op == '&&' else 'or'} {py_expr(e.b)})",
    ir.Cmp: lambda e: f"({py_expr(e.a)} {e.op} {py_expr(e.b)})",
    ir.Slice: _slice,
    ir.Concat: _concat,
    ir.Cast: _cast,
    ir.Cond: lambda e: f"({py_expr(e.a)} if {py_expr(e.c)} else {py_expr(e.b)})",
    ir.Tuple: lambda e: "(" + "".join(py_expr(i) + ", " for i in e.items) + ")",
    ir.TableApply: lambda e: f"{e.table}(C, F)",
    ir.TableResult: _table_result,
    ir.Lookahead: _lookahead,
}


def py_expr(e: ir.Expr) -> str:
    """Python for the IR expression ``e`` (over the context ``C`` and frame ``F``)."""
    return _EXPR[type(e)](e)


def _item(d: ir.DataItem) -> tuple[str, int]:
    """A field list element as (Python for its unsigned value, width)."""
    return _unsigned(py_expr(d.value), d.value.ty), d.width


def _guard(
    data: tuple[ir.DataItem, ...], fl: list[tuple[str, int]], implied: tuple[ir.Expr, ...]
) -> tuple[str, str] | None:
    """bmv2 serialises a field list leaving out the fields of headers that are invalid at the
    time: None when every header in ``data`` (``fl``: its items) is known valid (``implied``,
    or no header fields); else ``(all_valid, data)``, a test that each such header is valid
    and Python for the bytes in general."""
    valid = [None if d.header is None else f"{py_expr(d.header)}._v_" for d in data]
    checks = sorted({v for v in valid if v is not None} - {f"{py_expr(h)}._v_" for h in implied})
    if not checks:
        return None
    body = ", ".join(f"({p}, {w}, {v or 'True'})" for (p, w), v in zip(fl, valid, strict=True))
    return " and ".join(checks), f"_bits_valid(({body},))"


class PyWriter:
    """Writes IR statements as the general backend's Python, into an :class:`Emitter`;
    ``codecs``: each header type's :class:`HeaderCodec` (extract and emit are inlined);
    ``action_ids``: each action's P4Runtime id (a switch compares the action run with them)."""

    def __init__(self, codecs: dict[str, HeaderCodec], action_ids: dict[str, int]) -> None:
        self.codecs = codecs
        self.action_ids = action_ids

    def stmts(self, o: Emitter, ss: tuple[ir.Stmt, ...] | list[ir.Stmt]) -> None:
        for s in ss:
            self.stmt(o, s)

    def stmt(self, o: Emitter, s: ir.Stmt) -> None:
        if isinstance(s, ir.If):
            with o.block(f"if {py_expr(s.cond)}:"):
                self.stmts(o, s.then)
            if s.other is not None:
                with o.block("else:"):
                    self.stmts(o, s.other)
        elif isinstance(s, ir.Switch):
            o(f"{s.var} = {py_expr(s.on)}")
            for i, arm in enumerate(s.arms):
                if arm.actions:
                    cond = " or ".join(f"{s.var} == {self.action_ids[a]}" for a in arm.actions)
                    head = f"{'if' if i == 0 else 'elif'} {cond}:"
                else:
                    head = "if True:" if i == 0 else "else:"
                with o.block(head):
                    self.stmts(o, arm.body)
        elif isinstance(s, ir.Extract):
            self.extract(o, s)
        elif isinstance(s, ir.Emit):
            self.emit(o, py_expr(s.value), s.value.ty)
        elif isinstance(s, ir.ApplySub):
            r = s.var
            o(f"{r} = {s.sub}(C{_args(s.args)})")
            for i, lv in enumerate(s.outs):
                o(f"{py_expr(lv)} = {r}[{i + 1}]")
            o(f"if {r}[0]: raise _EXIT")
        else:
            o(self.line(s))

    @staticmethod
    def line(s: ir.Stmt) -> str:
        """A one-line statement."""
        return _LINE[type(s)](s)

    def extract(self, o: Emitter, s: ir.Extract) -> None:
        """``_ext_<type>`` inlined (hot path); ``_h``/``_o``/``_e``/``_x`` cannot clash with
        the checker's names (P4 locals are ``l_*``, select keys ``k*``)."""
        t = s.header.ty
        assert isinstance(t, StructT)
        c = self.codecs[t.name]
        if s.length is not None:
            self.extract_varbit(o, s, t)
            return
        o(f"_h = {py_expr(s.header)}")
        o("_o = C.off")
        o(f"_e = _o + {c.nbytes}")
        o(f"if _e > _n: raise _ParserError({s.short})")
        o("C.off = _e")
        if c.struct is not None:  # one struct.unpack_from for the whole header
            for ln in c.struct[1]:
                o(ln.replace("{U}", f"_SU_{t.name}(_b, _o)").replace("{H}", "_h"))
            o("_h._v_ = True")
        else:
            o("_x = int.from_bytes(_b[_o:_e], 'big')")
            for ln in c.unpack:
                o(ln.replace("{H}", "_h").replace("{V}", "_x"))

    @staticmethod
    def extract_varbit(o: Emitter, s: ir.Extract, t: StructT) -> None:
        """``extract(h, L)``: bmv2's checks (a header of whole bytes, ParserInvalidArgument;
        L within the varbit's maximum, HeaderTooShort; the bytes there, PacketTooShort),
        then the fields from the header's bits."""
        vb = t.varbit
        assert vb is not None and s.length is not None
        o(f"_L = {py_expr(s.length)}")
        o(f"if ({t.width} + _L) % 8: raise _ParserError({s.bad_length})")
        o(f"if _L > {vb[1].max_width}: raise _ParserError({s.too_long})")
        o(f"_h = {py_expr(s.header)}")
        o("_o = C.off")
        o(f"_e = _o + ({t.width} + _L) // 8")
        o(f"if _e > _n: raise _ParserError({s.short})")
        o("C.off = _e")
        o("_x = int.from_bytes(_b[_o:_e], 'big')")
        for ln in varbit_unpack(t):
            o(ln.replace("{H}", "_h").replace("{V}", "_x"))

    def emit(self, o: Emitter, py: str, t: Ty) -> None:
        assert isinstance(t, StructT)
        if t.is_header and t.varbit is not None:
            o(f"if {py}._v_: P.append(_pk_{t.name}({py}))")
            return
        if t.is_header:
            c = self.codecs[t.name]
            if c.struct is not None:
                args = ", ".join(a.replace("{H}", "_h") for a in c.struct[2])
                o(f"_h = {py}")
                o(f"if _h._v_: P.append(_SP_{t.name}({args}))")
            else:
                o(f"if {py}._v_: P.append(_pk_{t.name}({py}))")
            return
        if not t.fields:
            o("pass")
        for n, ft in t.fields:
            if isinstance(ft, StructT):  # a stack's nextIndex is not emitted
                self.emit(o, f"{py}.{attr(n)}", ft)


def _assign_slice(s: ir.AssignSlice) -> str:
    t = s.lhs.ty
    assert isinstance(t, BitT)
    b, r = py_expr(s.lhs), py_expr(s.rhs)
    w = s.hi - s.lo + 1
    wm = (1 << w) - 1
    full = (1 << t.width) - 1
    keep = full ^ (wm << s.lo)
    if t.signed:
        h = 1 << (t.width - 1)
        return f"{b} = ((({b} & {keep}) | (({r} & {wm}) << {s.lo})) + {h} & {full}) - {h}"
    return f"{b} = ({b} & {keep}) | ({r} << {s.lo})"


def _dynamic_data(data: tuple[ir.DataItem, ...]) -> str | None:
    """Python for the bytes of a field list with a varbit (its width known at run time), as
    bmv2 serialises it (the fields of invalid headers left out); None without a varbit."""
    if not any(isinstance(d.value.ty, VarbitT) for d in data):
        return None
    items = []
    for d in data:
        ok = "True" if d.header is None else f"{py_expr(d.header)}._v_"
        if isinstance(d.value.ty, VarbitT):
            items.append(f"(*{py_expr(d.value)}, {ok})")
        else:
            p, w = _item(d)
            items.append(f"({p}, {w}, {ok})")
    return f"_bits_valid(({''.join(i + ', ' for i in items)}))"


def _hash(s: ir.Hash) -> str:
    fl = [_item(d) for d in s.data]
    data = packed_bytes(fl)
    guard = _guard(s.data, fl, ())
    if guard is not None:
        data = f"({data} if {guard[0]} else {guard[1]})"
    data = _dynamic_data(s.data) or data
    assert isinstance(s.dst.ty, BitT)
    m = (1 << s.dst.ty.width) - 1
    return (
        f"{py_expr(s.dst)} = _hashmod(_hash_{s.algo}({data}, "
        f"{64 if s.algo == 'identity' else 32}), {py_expr(s.base)}, {py_expr(s.max)}) & {m}"
    )


def _checksum(s: ir.Checksum) -> str:
    fl = [_item(d) for d in s.data]
    guard = _guard(s.data, fl, s.implied)
    pay = " + C.buf[C.payload_off:]" if s.payload else ""
    w = s.width
    if s.algo == "csum16" and not pay and any(w_ > 0 for _, w_ in fl):
        # no bytes: a number congruent to the packed data modulo 0xFFFF (hot path)
        calc = f"_hash_csum16_fold({csum16_terms(fl)}, {w})"
    else:
        calc = f"_hash_{s.algo}({packed_bytes(fl)}{pay}, {w})"
    if guard is not None:
        # a field of an invalid header is left out of the data (bmv2's BufBuilder)
        calc = f"({calc} if {guard[0]} else _hash_{s.algo}({guard[1]}{pay}, {w}))"
    dyn = _dynamic_data(s.data)
    if dyn is not None:
        calc = f"_hash_{s.algo}({dyn}{pay}, {w})"
    c, f = py_expr(s.cond), py_expr(s.field)
    if s.verify:
        return f"if {c} and {calc} != {f}: C.std.checksum_error = 1"
    return f"if {c}: {f} = {calc}"


# ---------------------------------------------------------------------------- the module
def _frame_code(o: Emitter, fcls: str, frame: tuple[ir.FrameVar, ...]) -> None:
    """The class of a block's frame: one slot per variable, initialised to its default."""
    with o.block(f"class {fcls}:"):
        o(f"__slots__ = {tuple(attr(v.name) for v in frame)!r}")
        with o.block("def __init__(self):"):
            for v in frame:
                o(f"self.{attr(v.name)} = {'None' if v.by_ref else default_value(v.ty)}")


def _frame_line(fcls: str, frame: tuple[ir.FrameVar, ...]) -> str:
    return f"F = {fcls}()" if frame else "F = None"


def _control_code(o: Emitter, w: PyWriter, c: ir.ControlDef) -> None:
    fcls = f"F_{c.fn}"
    _frame_code(o, fcls, c.frame)
    with o.block(f"def {c.fn}(C):"):
        o(_frame_line(fcls, c.frame))
        w.stmts(o, c.init)
        if c.role == "deparser":
            o("P = []")
            w.stmts(o, c.body)
            # a large payload is joined from a view, not copied twice
            o("_b = C.buf")
            o("_o = C.payload_off")
            o("P.append(_b[_o:] if len(_b) - _o < 512 else memoryview(_b)[_o:])")
            o("return b''.join(P)")
        else:
            with o.block("try:"):
                w.stmts(o, c.body)
            with o.block("except _ExitType:"):
                o("pass")


def _table_code(o: Emitter, t: ir.TableDef) -> None:
    uid = t.uid
    with o.block(f"def {uid}(C, F):"):
        kt = "(" + "".join(p + ", " for p, _w in map(_item, t.keys)) + ")"
        # exact tables without a direct counter: the dict lookup inline (hot path)
        o(f"d = T_{uid}.fast")
        with o.block("if d is None:"):
            o(f"a, args, hit = T_{uid}.lookup({kt}, C.std.packet_length)")
        with o.block("else:"):
            o(f"e = d.get({kt})")
            with o.block("if e is None:"):
                o(f"a = T_{uid}.default_action; args = T_{uid}.default_args; hit = False")
            with o.block("else:"):
                o("a = e.action_id; args = e.args; hit = True")
        o(f"ACT_{uid}[a](C, F, *args)")
        o("return a, hit")


def _sub_code(o: Emitter, w: PyWriter, d: ir.SubControlDef) -> None:
    fcls = f"F_{d.uid}"
    _frame_code(o, fcls, d.frame)
    args = [f"a{i}" for i in range(len(d.params))]
    ret = "".join(f"F.{attr(n)}, " for n in d.outs)
    with o.block(f"def {d.uid}(C{''.join(', ' + a for a in args)}):"):
        o(f"F = {fcls}()")
        for n, a in zip(d.params, args, strict=True):
            o(f"F.{attr(n)} = {a}")
        w.stmts(o, d.init)
        with o.block("try:"):
            w.stmts(o, d.body)
        with o.block("except _ReturnType:"):
            o("pass")
        with o.block("except _ExitType:"):
            o(f"return (True, {ret})")
        o(f"return (False, {ret})")


@dataclass(frozen=True)
class GeneralModule:
    """The general backend's output: the module as a tree (what the pipeline compiles and the
    straight-line backend reads), its ``source`` (what ``--dump-python`` shows), and
    ``pack_formats``: for each header type ``T`` whose fields pack into whole bytes, the
    ``struct`` format of ``_SP_<T>``, the one call that packs it (see :func:`header_codec`)."""

    source: str
    tree: ast.Module
    pack_formats: dict[str, str]


def build_general(prog: ir.Program, action_ids: dict[str, int], filename: str) -> GeneralModule:
    """The general backend's module for a checked program (see :func:`module_code`), as a
    tree with ``filename`` in its code locations."""
    source = module_code(prog, action_ids)
    pack_formats = {}
    for t in prog.structs:
        if t.is_header:
            c = header_codec(t)
            if c.struct is not None:
                pack_formats[t.name] = c.struct[0]
    return GeneralModule(source, ast.parse(source, filename), pack_formats)


def module_code(prog: ir.Program, action_ids: dict[str, int]) -> str:
    """The general backend's module for a checked program, as source: the classes and
    codecs, the parser and controls, the actions, tables and sub-controls, the context
    functions, and the names that bind them to the runtime ``R`` (``action_ids``: P4Runtime id
    per action)."""
    codecs = {t.name: header_codec(t) for t in prog.structs if t.is_header}
    w = PyWriter(codecs, action_ids)
    o = Emitter()
    for line in types_code(prog.structs, codecs, prog.errors["PacketTooShort"]):
        o(line)
    p = prog.parser
    _frame_code(o, "F_parse", p.frame)
    init = Emitter()
    w.stmts(init, p.init)
    for line in parser_code(p, w, [_frame_line("F_parse", p.frame), *init.lines]):
        o(line)
    for c in prog.controls:
        _control_code(o, w, c)
    for d in prog.defs:
        if isinstance(d, ir.ActionDef):
            with o.block(f"def {d.uid}(C, F{''.join(', ' + p for p in d.params)}):"):
                w.stmts(o, d.body)
        elif isinstance(d, ir.TableDef):
            _table_code(o, d)
        else:
            _sub_code(o, w, d)
    egress = None if prog.egress_headers is None else {attr(h) for h in prog.egress_headers}
    lines = o.lines + runtime_code(prog.headers, prog.meta, prog.std, egress, prog.field_lists)
    for t in prog.tables:
        lines.append(f"T_{t.uid} = R.tables_by_name[{t.name!r}]")
        uids = t.action_uids or tuple(prog.actions[n] for n in t.actions)
        items = ", ".join(f"{action_ids[n]}: {u}" for n, u in zip(t.actions, uids, strict=True))
        lines.append(f"ACT_{t.uid} = {{{items}}}")
    for dg in prog.digests:
        lines.append(f"DIG_{dg.name} = {dg.id}")
    for uid, kind, info in prog.externs:
        lines.append(f"{uid} = R.{'counters' if kind == 'counter' else 'registers'}[{info.id}]")
    lines.append("DROP_PORT = R.drop_port")
    return "\n".join(lines) + "\n"


def _args(args: tuple[ir.Expr, ...]) -> str:
    return "".join(", " + py_expr(a) for a in args)


_LINE: dict[type, Callable[[Any], str]] = {
    ir.Nop: lambda s: "pass",
    ir.Assign: lambda s: (
        f"{py_expr(s.lhs)} = {py_expr(s.rhs)}{'.copy()' if isinstance(s.lhs.ty, StructT) else ''}"
    ),
    ir.AssignSlice: _assign_slice,
    ir.Init: lambda s: f"{py_expr(s.var)} = {default_value(s.var.ty)}",
    ir.Exit: lambda s: "raise _EXIT",
    ir.Return: lambda s: "raise _RETURN" if s.from_sub else "return None",
    ir.Eval: lambda s: py_expr(s.expr),
    ir.CallAction: lambda s: f"{s.action}(C, F{_args(s.args)})",
    ir.SetValid: lambda s: f"{py_expr(s.header)}._v_ = {s.valid}",
    ir.Advance: lambda s: f"_advance(C, {py_expr(s.bits)})",
    ir.Verify: lambda s: f"if not {py_expr(s.cond)}: raise _ParserError({py_expr(s.error)})",
    ir.Count: lambda s: f"_count({s.counter}, {py_expr(s.index)}, C)",
    ir.RegisterRead: lambda s: f"{py_expr(s.dst)} = _rread({s.register}, {py_expr(s.index)})",
    ir.RegisterWrite: lambda s: f"_rwrite({s.register}{_args((s.index, s.value))})",
    ir.MarkToDrop: lambda s: (
        f"{py_expr(s.std)}.egress_spec = DROP_PORT; {py_expr(s.std)}.mcast_grp = 0"
    ),
    ir.Checksum: _checksum,
    ir.Hash: _hash,
    ir.Random: lambda s: f"{py_expr(s.dst)} = _random({py_expr(s.lo)}, {py_expr(s.hi)})",
    ir.Digest: lambda s: (
        f"C.digests = (*C.digests, (DIG_{s.name}, "
        f"[{''.join(f'_be({p}, {w}), ' for p, w in map(_item, s.data))}]))"
    ),
    ir.Clone: lambda s: (
        f"C.clone_type = {2 if s.egress else 1}; C.clone_session = "
        f"{py_expr(s.session)}; C.clone_fl = {s.field_list}"
    ),
    ir.PreserveFieldList: lambda s: (
        f"C.{'recirc_fl' if s.recirculate else 'resubmit_fl'} = {s.index}"
    ),
    ir.Truncate: lambda s: f"C.truncate_len = {py_expr(s.length)}",
}
