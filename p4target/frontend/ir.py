"""The checked program's code as a typed IR: what the checker produces and the backends read.

The checker (:mod:`.checker`) resolves names, types and widths and, for code that checks,
builds these nodes; it writes no target code. Every expression carries its resolved P4 type
(:mod:`.types`), so a backend knows the width and signedness of each operation without looking
anything up. Names that the checker allocates (locals ``l_x_3``, action parameters ``p_x_4``,
table, action, counter and register uids) are identifiers of the IR; the P4 names of fields and
frame variables are kept as written, and a backend maps them to its own (``codegen.general.attr``).

The general backend (:mod:`..codegen.general`, :func:`~..codegen.general.py_expr` and
:func:`~..codegen.general.py_stmts`) turns the IR into the Python the dataplane runs; the
straight-line backend (:mod:`..codegen.straight`) rewrites that Python into one function per
program. Nodes are immutable.

Expressions (``Expr``): constants, references to state (the packet context's headers, metadata
and standard metadata, a block's frame, a local, an action parameter), field selection, header
validity, P4 arithmetic with its wrap-around (:class:`Arith`, :class:`Unary`), slices,
concatenation, casts, comparisons, conditionals, tuples, a table's apply and its results, and
lookahead. Statements (``Stmt``) are listed in ``STATEMENTS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from .model import CounterInfo, DigestInfo, RegisterInfo
from .types import StructT, Ty

__all__ = [
    "ActionDef",
    "ControlDef",
    "FrameVar",
    "KeysetMatch",
    "ParserDef",
    "ParserState",
    "Program",
    "SelectCase",
    "SubControlDef",
    "TableDef",
    "TableRef",
    "Transition",
    "Advance",
    "ApplySub",
    "Arith",
    "Assign",
    "AssignSlice",
    "CallAction",
    "Checksum",
    "Clone",
    "Count",
    "DataItem",
    "Digest",
    "Emit",
    "Eval",
    "Exit",
    "Extract",
    "Hash",
    "If",
    "Init",
    "MarkToDrop",
    "Nop",
    "PreserveFieldList",
    "Random",
    "RegisterRead",
    "RegisterWrite",
    "Return",
    "SetValid",
    "Stmt",
    "Switch",
    "SwitchArm",
    "Truncate",
    "Verify",
    "Cast",
    "Cmp",
    "Concat",
    "Cond",
    "Const",
    "Entity",
    "Expr",
    "Field",
    "IsValid",
    "Logic",
    "Lookahead",
    "Ref",
    "Slice",
    "TableApply",
    "TableResult",
    "Tuple",
    "Unary",
]


@dataclass(frozen=True, eq=False, slots=True)
class Const:
    """A compile-time value (int, bool or, for ``log_msg``, str) of type ``ty``."""

    ty: Ty
    value: int | bool | str


@dataclass(frozen=True, eq=False, slots=True)
class Ref:
    """A variable. ``kind``: ``ctx`` (the packet's ``hdr``/``meta``/``std``, by ``name``),
    ``frame`` (a control local or sub-control parameter, by its P4 name), ``local`` (a block
    local) or ``param`` (an action parameter), both by the name the checker gave them."""

    ty: Ty
    kind: str
    name: str


@dataclass(frozen=True, eq=False, slots=True)
class Entity:
    """A name that is not a value (a type, table, extern instance, action, packet...): the
    checker keeps what it names beside the node; a backend never sees one in code."""

    ty: Ty


@dataclass(frozen=True, eq=False, slots=True)
class Field:
    """Field ``name`` (as written in P4) of the struct or header ``base``."""

    ty: Ty
    base: Expr
    name: str


@dataclass(frozen=True, eq=False, slots=True)
class IsValid:
    """``h.isValid()``."""

    ty: Ty
    header: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Arith:
    """``a op b`` on ``ty`` (bit<W> or int<W>), wrapping as P4 does: ``op`` is one of
    ``+ - * / % & | ^ << >> |+| |-|`` (``|+|``/``|-|`` saturate; ``/``/``%`` are unsigned)."""

    ty: Ty
    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Unary:
    """``-x`` (wraps), ``~x`` on ``ty``, or ``!x`` on a bool (``op`` ``-``, ``~``, ``!``)."""

    ty: Ty
    op: str
    x: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Logic:
    """``a && b`` / ``a || b`` (``op`` ``&&``/``||``)."""

    ty: Ty
    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Cmp:
    """``a op b`` for ``op`` in ``== != < > <= >=``, operands of one type."""

    ty: Ty
    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Slice:
    """``x[hi:lo]`` (``ty`` is bit<hi-lo+1>)."""

    ty: Ty
    x: Expr
    hi: int
    lo: int


@dataclass(frozen=True, eq=False, slots=True)
class Concat:
    """``a ++ b``."""

    ty: Ty
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Cast:
    """``(ty) x``: bit/int width or sign changes, bool <-> bit<1>, enum <-> its underlying."""

    ty: Ty
    x: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Cond:
    """``c ? a : b``."""

    ty: Ty
    c: Expr
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Tuple:
    """``{a, b, ...}`` as a value."""

    ty: Ty
    items: tuple[Expr, ...]


@dataclass(frozen=True, eq=False, slots=True)
class TableApply:
    """``t.apply()`` of the table the checker named ``table`` (type ApplyT)."""

    ty: Ty
    table: str


@dataclass(frozen=True, eq=False, slots=True)
class TableResult:
    """``.hit``, ``.miss`` or ``.action_run`` (``what``) of a table's apply."""

    ty: Ty
    what: str
    apply: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Lookahead:
    """``pkt.lookahead<ty>()`` (a bit<W> or a header type)."""

    ty: Ty


Expr: TypeAlias = (
    Const
    | Ref
    | Entity
    | Field
    | IsValid
    | Arith
    | Unary
    | Logic
    | Cmp
    | Slice
    | Concat
    | Cast
    | Cond
    | Tuple
    | TableApply
    | TableResult
    | Lookahead
)


# ---------------------------------------------------------------------------- statements
@dataclass(frozen=True, eq=False, slots=True)
class Nop:
    """Does nothing (an empty block or statement, ``log_msg``, a direct counter's count)."""


@dataclass(frozen=True, eq=False, slots=True)
class Assign:
    """``lhs = rhs`` (a struct or header is copied)."""

    lhs: Expr
    rhs: Expr


@dataclass(frozen=True, eq=False, slots=True)
class AssignSlice:
    """``lhs[hi:lo] = rhs`` (``rhs`` of type bit<hi-lo+1>)."""

    lhs: Expr
    hi: int
    lo: int
    rhs: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Init:
    """A local declared without a value: its type's default."""

    var: Ref


@dataclass(frozen=True, eq=False, slots=True)
class If:
    """``if (cond) then else other`` (``other`` None: no else)."""

    cond: Expr
    then: tuple[Stmt, ...]
    other: tuple[Stmt, ...] | None


@dataclass(frozen=True, eq=False, slots=True)
class SwitchArm:
    """Labels (fully qualified action names; empty: ``default``) and the body they share."""

    actions: tuple[str, ...]
    body: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False, slots=True)
class Switch:
    """``switch (t.apply().action_run)``: the action run is kept in ``var``; the arms are
    tried in order (labels that fall through are merged into the next arm)."""

    var: str
    on: Expr
    arms: tuple[SwitchArm, ...]


@dataclass(frozen=True, eq=False, slots=True)
class Exit:
    """``exit``."""


@dataclass(frozen=True, eq=False, slots=True)
class Return:
    """``return`` from an action or a control (``from_sub``: from a sub-control's apply)."""

    from_sub: bool


@dataclass(frozen=True, eq=False, slots=True)
class Eval:
    """An expression evaluated for its effect (a table's apply as a statement)."""

    expr: Expr


@dataclass(frozen=True, eq=False, slots=True)
class CallAction:
    """A direct call of the action the checker named ``action``."""

    action: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, eq=False, slots=True)
class ApplySub:
    """``c.apply(args)`` of the sub-control named ``sub``: ``outs`` are the non-struct
    arguments of out/inout parameters, assigned back from the call's result ``var``."""

    sub: str
    var: str
    args: tuple[Expr, ...]
    outs: tuple[Expr, ...]


@dataclass(frozen=True, eq=False, slots=True)
class SetValid:
    """``h.setValid()`` / ``h.setInvalid()``."""

    header: Expr
    valid: bool


@dataclass(frozen=True, eq=False, slots=True)
class Extract:
    """``pkt.extract(h)``; too few bytes left: parser error ``short``. ``pkt.extract(h,
    length)`` of a header with a varbit field: ``length`` bits (bit<32>) for that field; a
    header whose total is not whole bytes is parser error ``bad_length``
    (ParserInvalidArgument), a length over the field's maximum ``too_long``
    (HeaderTooShort), as bmv2 checks them."""

    header: Expr
    short: int
    length: Expr | None = None
    bad_length: int = 0
    too_long: int = 0


@dataclass(frozen=True, eq=False, slots=True)
class Advance:
    """``pkt.advance(bits)``."""

    bits: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Emit:
    """``pkt.emit(x)``: a header if valid, or each header of a struct in field order."""

    value: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Verify:
    """``verify(cond, error)``."""

    cond: Expr
    error: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Count:
    """``c.count(index)`` of the indirect counter the checker named ``counter``."""

    counter: str
    index: Expr


@dataclass(frozen=True, eq=False, slots=True)
class RegisterRead:
    """``r.read(dst, index)`` of the register the checker named ``register``."""

    dst: Expr
    register: str
    index: Expr


@dataclass(frozen=True, eq=False, slots=True)
class RegisterWrite:
    """``r.write(index, value)``."""

    register: str
    index: Expr
    value: Expr


@dataclass(frozen=True, eq=False, slots=True)
class MarkToDrop:
    """``mark_to_drop(std)``."""

    std: Expr


@dataclass(frozen=True, eq=False, slots=True)
class DataItem:
    """One element of a field list (checksum, hash or digest data) and, when it is a field
    of a header, that header (bmv2 leaves out the fields of invalid headers)."""

    value: Expr
    width: int
    header: Expr | None


@dataclass(frozen=True, eq=False, slots=True)
class Checksum:
    """``verify_checksum[_with_payload]`` (``verify``) or ``update_checksum[...]``: when
    ``cond``, the checksum ``algo`` of ``data`` (and the payload) is compared with, or
    written to, ``field`` (of ``width`` bits). ``implied`` are the headers ``cond`` itself
    requires valid."""

    verify: bool
    cond: Expr
    data: tuple[DataItem, ...]
    implied: tuple[Expr, ...]
    field: Expr
    width: int
    algo: str
    payload: bool


@dataclass(frozen=True, eq=False, slots=True)
class Hash:
    """``hash(dst, algo, base, data, max)``."""

    dst: Expr
    algo: str
    base: Expr
    data: tuple[DataItem, ...]
    max: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Random:
    """``random(dst, lo, hi)``."""

    dst: Expr
    lo: Expr
    hi: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Digest:
    """``digest<T>(receiver, data)``: the digest of struct ``name``, its fields' values."""

    name: str
    data: tuple[DataItem, ...]


@dataclass(frozen=True, eq=False, slots=True)
class Clone:
    """``clone``/``clone3``/``clone_preserving_field_list``: ``egress`` is E2E (else I2E);
    ``field_list`` -1 when none is preserved."""

    egress: bool
    session: Expr
    field_list: int


@dataclass(frozen=True, eq=False, slots=True)
class PreserveFieldList:
    """``resubmit_preserving_field_list`` (``recirculate`` False) or
    ``recirculate_preserving_field_list``."""

    recirculate: bool
    index: int


@dataclass(frozen=True, eq=False, slots=True)
class Truncate:
    """``truncate(length)``."""

    length: Expr


Stmt: TypeAlias = (
    Nop
    | Assign
    | AssignSlice
    | Init
    | If
    | Switch
    | Exit
    | Return
    | Eval
    | CallAction
    | ApplySub
    | SetValid
    | Extract
    | Advance
    | Emit
    | Verify
    | Count
    | RegisterRead
    | RegisterWrite
    | MarkToDrop
    | Checksum
    | Hash
    | Random
    | Digest
    | Clone
    | PreserveFieldList
    | Truncate
)


# ---------------------------------------------------------------------------- declarations
@dataclass(frozen=True, eq=False, slots=True)
class FrameVar:
    """A variable of a block's frame (its locals that live across its code): a control local
    or a sub-control parameter; ``by_ref``: a struct argument, set by the call."""

    name: str
    ty: Ty
    by_ref: bool = False


@dataclass(frozen=True, eq=False, slots=True)
class ActionDef:
    """An action: the names the checker gave its parameters, and its body."""

    uid: str
    params: tuple[str, ...]
    body: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False, slots=True)
class TableDef:
    """A table's apply: look up ``keys`` (each with its width), run the action found."""

    uid: str
    keys: tuple[DataItem, ...]


@dataclass(frozen=True, eq=False, slots=True)
class SubControlDef:
    """A control instantiated inside another: its parameters are frame variables (the first
    ``len(params)`` of ``frame``); ``outs``: the non-struct out/inout ones, returned."""

    uid: str
    frame: tuple[FrameVar, ...]
    params: tuple[str, ...]
    outs: tuple[str, ...]
    init: tuple[Stmt, ...]
    body: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False, slots=True)
class ControlDef:
    """One of V1Switch's controls (``role``: verify, ingress, egress, compute, deparser),
    as function ``fn``: its frame, the frame's initialisation, its body."""

    role: str
    fn: str
    frame: tuple[FrameVar, ...]
    init: tuple[Stmt, ...]
    body: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False, slots=True)
class KeysetMatch:
    """One key's part of a select case: ``value`` (``a``), ``mask`` (``a &&& b``) or
    ``range`` (``a .. b``)."""

    kind: str
    a: int
    b: int = 0


@dataclass(frozen=True, eq=False, slots=True)
class SelectCase:
    """A select case: per key, its match (None: ``_``), and the next state."""

    matches: tuple[KeysetMatch | None, ...]
    target: str


@dataclass(frozen=True, eq=False, slots=True)
class Transition:
    """A state's transition: ``select(keys)`` over ``cases`` in order, then ``default`` (a
    state, or None: parser error ``no_match``); a plain ``transition s`` has no keys."""

    keys: tuple[Expr, ...]
    cases: tuple[SelectCase, ...]
    default: str | None
    no_match: int


@dataclass(frozen=True, eq=False, slots=True)
class ParserState:
    """A parser state: its statements, then its transition."""

    body: tuple[Stmt, ...]
    transition: Transition


@dataclass(frozen=True, eq=False, slots=True)
class ParserDef:
    """The parser: its frame, the frame's initialisation, its states in declaration order
    (``start`` among them; ``accept`` is a target, never a state) and the error code of
    ParserTimeout."""

    frame: tuple[FrameVar, ...]
    init: tuple[Stmt, ...]
    states: dict[str, ParserState]
    timeout_error: int


@dataclass(frozen=True, eq=False, slots=True)
class TableRef:
    """A table as the runtime knows it: the checker's ``uid``, its P4Info ``name`` and the
    fully qualified names of its actions."""

    uid: str
    name: str
    actions: tuple[str, ...]
    action_uids: tuple[str, ...] = ()  # the function run for each action (per table: an
    # action with arguments bound in the actions list has one per table)


@dataclass(eq=False, slots=True)
class Program:
    """A checked program: the typed declarations (``structs``, with the parser's headers,
    metadata and standard metadata types), the blocks (parser first, then the controls in
    V1Switch order), the actions, tables and sub-controls in declaration order, and the
    names that bind the code to the runtime: ``actions`` (fully qualified name -> uid),
    ``tables``, ``externs`` (uid, ``counter``/``register``, its P4Info entry), ``digests``
    (their P4Info entries; ids are read once assigned), the metadata's ``field_lists``
    (index -> fields) and ``egress_headers`` (the headers egress may touch; None: any)."""

    structs: list[StructT]
    headers: StructT
    meta: StructT
    std: StructT
    parser: ParserDef
    controls: list[ControlDef]
    defs: list[ActionDef | TableDef | SubControlDef]
    actions: dict[str, str]
    tables: list[TableRef]
    externs: list[tuple[str, str, CounterInfo | RegisterInfo]]
    digests: list[DigestInfo]
    field_lists: dict[int, list[str]]
    egress_headers: set[str] | None
    errors: dict[str, int]
