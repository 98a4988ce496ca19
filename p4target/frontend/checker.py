"""Type and semantic checker for the supported P4_16 subset on v1model.

One pass over the AST checks names, types and widths (reporting ``file:line:col: message``) and,
for code that checks, builds the program's typed IR (:mod:`.ir`, :meth:`Checker.program`): the
parser's states and transitions, the controls, actions, tables and sub-controls as typed
statements and expressions. It writes no target code; the backends (:mod:`..codegen`) do.
Along the way it records the P4Runtime model (:attr:`Checker.model`) and what the backends need
to know about the program (:meth:`Checker.facts`, a :class:`~.model.ProgramFacts`: e.g. which
standard_metadata fields each block reads, the frames' initial values).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import ast as A  # noqa: N812
from . import ir
from .diagnostics import Diagnostic, Loc
from .ir import Expr as IRExpr
from .ir import Stmt as IRStmt
from .model import (
    ActionInfo,
    ConstEntry,
    ControllerHeaderInfo,
    CounterInfo,
    DigestInfo,
    KeyInfo,
    ParamInfo,
    ProgramFacts,
    ProgramModel,
    RegisterInfo,
    Scalar,
    TableInfo,
)
from .types import (
    ApplyT,
    BitT,
    BoolT,
    EnumT,
    ErrorT,
    ExternT,
    IntLitT,
    ListT,
    OtherT,
    StackT,
    StrT,
    StructT,
    TupleT,
    Ty,
    UnionT,
    VarbitT,
    VoidT,
    bit_width,
    scalar_default,
)

INTLIT = IntLitT()
BOOL = BoolT()
ERROR = ErrorT()
VOID = VoidT()
STR = StrT()

_AFTER_INGRESS = ("egress", "compute")  # the controls that run on a replica
_DECLARABLE = (StructT, BoolT, BitT, ErrorT, EnumT, VarbitT)  # types a variable starts from


# extern functions whose semantics the target implements
BUILTIN_FUNCS = {
    "mark_to_drop",
    "hash",
    "random",
    "digest",
    "clone",
    "clone3",
    "clone_preserving_field_list",
    "resubmit_preserving_field_list",
    "recirculate_preserving_field_list",
    "truncate",
    "log_msg",
    "verify_checksum",
    "update_checksum",
    "verify_checksum_with_payload",
    "update_checksum_with_payload",
    "verify",
}
SUPPORTED_EXTERNS = {"counter", "direct_counter", "register", "packet_in", "packet_out"}
HASH_ALGOS = {"crc32", "crc16", "identity", "csum16", "xor16"}


@dataclass
class V:
    """A checked expression: its IR (which carries the type), compile-time value,
    assignability."""

    ir: IRExpr
    const: Any = None
    lvalue: bool = False
    readonly_why: str = ""
    stmt: IRStmt | None = None  # a call that is a statement (the value is void)
    after: tuple[IRStmt, ...] = ()  # statements that follow ``stmt`` (a union's invalidation)

    @property
    def ty(self) -> Ty:
        return self.ir.ty


def do(stmt: ir.Stmt, after: tuple[ir.Stmt, ...] = ()) -> V:
    """A call that is a statement (``after``: statements that follow it)."""
    return V(ir.Entity(VOID), stmt=stmt, after=after)


def union_others(h: ir.Expr) -> tuple[ir.Stmt, ...]:
    """When header ``h`` is a member of a header union: the other members made invalid (bmv2
    invalidates them whenever one member becomes valid); else nothing."""
    if not isinstance(h, ir.Field):
        return ()
    u, ut = h.base, h.base.ty
    if not isinstance(ut, UnionT):
        return ()
    return tuple(ir.SetValid(ir.Field(ft, u, n), False) for n, ft in ut.fields if n != h.name)


def _bits_struct(t: Ty) -> bool:
    """A struct (not a header, stack or union) of bit<W>/int<W>/bool/serializable enum
    fields, nested structs of them allowed: it may be a header's field."""
    if not isinstance(t, StructT) or t.is_header or isinstance(t, (StackT, UnionT, TupleT)):
        return False
    return bool(t.fields) and all(
        isinstance(lt, (BitT, BoolT)) or (isinstance(lt, EnumT) and lt.underlying is not None)
        for _p, lt in t.leaves()
    )


def struct_eq(a: ir.Expr, b: ir.Expr, t: StructT) -> ir.Expr:
    """``a == b`` for headers (both invalid, or both valid with equal fields), header unions,
    stacks (element by element, not nextIndex) and structs (field by field), as P4 defines
    them."""
    parts: list[ir.Expr] = []
    for n, ft in t.fields:
        if isinstance(t, StackT) and n == "nidx":
            continue
        fa, fb = ir.Field(ft, a, n), ir.Field(ft, b, n)
        if isinstance(ft, StructT):
            parts.append(struct_eq(fa, fb, ft))
        else:
            parts.append(ir.Cmp(BOOL, "==", fa, fb))
    eq: ir.Expr = ir.Const(BOOL, True)
    for i, p in enumerate(parts):
        eq = p if i == 0 else ir.Logic(BOOL, "&&", eq, p)
    if t.is_header:
        va, vb = ir.IsValid(BOOL, a), ir.IsValid(BOOL, b)
        both_invalid = ir.Logic(BOOL, "&&", ir.Unary(BOOL, "!", va), ir.Unary(BOOL, "!", vb))
        both_valid = ir.Logic(BOOL, "&&", ir.Logic(BOOL, "&&", va, vb), eq)
        eq = ir.Logic(BOOL, "||", both_invalid, both_valid)
    return eq


def invalidate(e: ir.Expr) -> list[ir.Stmt]:
    """Header or header union ``e`` made invalid (a union: each of its members)."""
    t = e.ty
    if isinstance(t, UnionT):
        return [ir.SetValid(ir.Field(ft, e, n), False) for n, ft in t.fields]
    return [ir.SetValid(e, False)]


def konst(ty: Ty, value: Any) -> V:
    """A compile-time value of type ``ty``."""
    return V(ir.Const(ty, value), value)


@dataclass
class Sym:
    kind: str  # const var type table action extern_inst packet control parser func
    ty: Ty | None = None
    ir: IRExpr | None = None  # the IR a var or const stands for
    value: Any = None
    data: Any = None
    readonly: str = ""  # why it cannot be assigned ("" = assignable)


class Scope:
    def __init__(self, parent: Scope | None = None) -> None:
        self.parent = parent
        self.syms: dict[str, Sym] = {}

    def lookup(self, name: str) -> Sym | None:
        s: Scope | None = self
        while s is not None:
            if name in s.syms:
                return s.syms[name]
            s = s.parent
        return None

    def add(self, name: str, sym: Sym) -> None:
        self.syms[name] = sym


@dataclass
class TableCtx:
    uid: str
    info: TableInfo
    action_syms: dict[str, ActionCtx]  # fq action name -> action
    applied: bool = False
    #: applied where a constant condition does not leave the apply out (p4c's front end
    #: removes a table applied only in such dead code, and so does the P4Info here)
    live: bool = False
    local_names: dict[str, str] = field(default_factory=dict)  # written name -> fq


@dataclass
class SubCtx:
    """An instance of a control inside another control (``C() c; ... c.apply(args);``)."""

    uid: str
    name: str
    params: list[tuple[str, Ty, str]]
    applied: bool = False
    has_tables: bool = False  # (or a sub-control that has): one apply only, as on bmv2


@dataclass
class ActionCtx:
    uid: str
    name: str  # fully qualified
    decl: A.ActionDecl
    params: list[tuple[str, Ty, str]]  # (name, type, direction)
    info: ActionInfo | None = None
    # an action with out/inout parameters is inlined at each (direct) call, its body
    # checked in the scope it was declared in; None: a function of its own
    inline_scope: Scope | None = None


@dataclass
class FnCtx:
    """A user function being inlined: where ``return`` puts the value, the flag it sets."""

    name: str
    ret: ir.Ref | None
    flag: ir.Ref
    returns: int = 0  # returns checked so far (a statement that added one may return)
    copy_out: tuple[ir.Stmt, ...] = ()  # the out/inout arguments' copy-back (also on exit)


class Poisoned(Diagnostic):
    """A use of a declaration that already failed; not reported again."""


class Checker:
    def __init__(self, program: A.Program) -> None:
        self.prog = program
        self.diags: list[Diagnostic] = []
        self.g = Scope()
        self.model = ProgramModel()
        self.uid = 0
        self.errors: dict[str, int] = {}
        self.structs: list[StructT] = []
        self.actions_by_name: dict[str, ActionCtx] = {}
        self.tables: list[TableCtx] = []
        self.ext_binds: list[tuple[str, str, CounterInfo | RegisterInfo]] = []
        self.counters: dict[str, CounterInfo] = {}
        self.registers: dict[str, RegisterInfo] = {}
        self.digests: dict[str, DigestInfo] = {}
        # the program's IR: the parser, the controls, and the actions, tables and
        # sub-controls in declaration order
        self.parser: ir.ParserDef | None = None
        self.controls: list[ir.ControlDef] = []
        self.defs: list[ir.ActionDef | ir.TableDef | ir.SubControlDef] = []
        # members of the headers struct that egress or compute-checksum code mentions (None:
        # any may be written); a replica shares the others with its original (copy_ctx)
        self.egress_hdrs: set[str] | None = set()
        self.direct_counters: dict[str, CounterInfo] = {}
        self.top_actions: dict[str, A.ActionDecl] = {}
        self.roles: dict[str, A.Decl] = {}
        self.ctl_name = ""
        self.ctl_role = ""
        # the current block's frame
        self.frame_vars: list[ir.FrameVar] = []
        # what the back ends need to know (ProgramFacts), by P4 names: block function -> frame
        # defaults
        self.frames: dict[str, dict[str, Scalar | None]] = {}
        self.by_ref: dict[str, set[str]] = {}  # sub-control function -> by-reference params
        self.headers_t: StructT | None = None
        self.meta_t: StructT | None = None
        self.std_t: StructT | None = None
        self.used_action_uids: set[str] = set()
        # actions called directly from control code (not from another action's body): p4c
        # lists them in the P4Info (its front end gives each call a hidden table)
        self.direct_actions: dict[str, ActionCtx] = {}
        self.action_depth = 0  # > 0 while an action's body is checked
        #: > 0 while the branch of a constant condition that never runs is checked (``if
        #: (false)``, ``true ? a : b``'s ``b``): its applies and calls are not uses for the P4Info
        self.dead = 0
        self.in_sub_apply = False
        # block role -> standard_metadata fields its code may read (ProgramFacts.std_reads)
        self.std_reads: dict[str, set[str]] = {}
        self.assign_target = False  # the member being checked is only assigned (lvalue)
        # statements a user function call in the expression being checked runs first (the
        # calls are inlined before the statement that contains them); None outside statements
        self.prelude: list[ir.Stmt] | None = None
        # the user functions being inlined, innermost last
        self.fn_stack: list[FnCtx] = []
        self.stack_types: dict[tuple[str, int], StackT] = {}
        self.tuple_types: dict[str, TupleT] = {}

    # ------------------------------------------------------------------ diagnostics
    def err(self, loc: Loc, msg: str) -> None:
        self.diags.append(Diagnostic(loc, msg))

    def add_diag(self, d: Diagnostic) -> None:
        if not isinstance(d, Poisoned):
            self.diags.append(d)

    def fresh(self, base: str) -> str:
        self.uid += 1
        return f"{base}{self.uid}"

    # ------------------------------------------------------------------ facts
    def note_std_read(self, *fields: str) -> None:
        """The block being checked may read these fields of standard_metadata."""
        if self.ctl_role:
            self.std_reads.setdefault(self.ctl_role, set()).update(fields)

    def facts(self) -> ProgramFacts:
        """What the back ends need to know about the checked program (see ProgramFacts); call
        after ids are assigned."""
        assert self.headers_t and self.meta_t and self.std_t

        def defaults(t: StructT) -> dict[str, Scalar | None]:
            return {n: scalar_default(ft) for n, ft in t.fields}

        headers: dict[str, dict[str, Scalar | None] | None] = {}
        for n, ft in self.headers_t.fields:
            headers[n] = defaults(ft) if isinstance(ft, StructT) and ft.is_header else None
        aid = self.action_ids()
        return ProgramFacts(
            std_reads={role: frozenset(fs) for role, fs in sorted(self.std_reads.items())},
            headers=headers,
            meta=defaults(self.meta_t),
            std=defaults(self.std_t),
            frames={fn: dict(vs) for fn, vs in self.frames.items()},
            by_ref={fn: frozenset(vs) for fn, vs in self.by_ref.items()},
            action_maps={
                tc.uid: {aid[n]: tc.action_syms[n].uid for n in tc.info.action_names}
                for tc in self.tables
            },
        )

    def action_ids(self) -> dict[str, int]:
        """Action name -> P4Runtime id (-1 for an action no table lists); after ids are
        assigned."""
        aid = {a.name: a.id for a in self.model.actions}
        for ac in self.actions_by_name.values():
            if ac.name not in aid and ac.uid:
                aid.setdefault(ac.name, -1)
        return aid

    # ------------------------------------------------------------------ top level
    def run(self) -> None:
        for d in self.prog.decls:
            try:
                self.top_decl(d)
            except Diagnostic as e:
                self.diags.append(e)
        if self.diags:
            return
        main = self.g.lookup("main")
        if main is None or main.kind != "main":
            self.err(
                self.prog.decls[-1].loc if self.prog.decls else Loc("<input>", 1, 1),
                "no 'main' instantiation of V1Switch(...) found",
            )
            return
        self.compile_pipeline(main.data)

    def top_decl(self, d: A.Decl) -> None:
        if isinstance(d, A.HeaderDecl):
            self.declare_struct(d)
        elif isinstance(d, A.TypedefDecl):
            self.g.add(d.name, Sym("type", self.resolve_type(d.type, self.g)))
        elif isinstance(d, A.EnumDecl):
            self.declare_enum(d)
        elif isinstance(d, A.ErrorDecl):
            for n, loc in d.members:
                if n in self.errors:
                    self.err(loc, f"duplicate error member {n}")
                self.errors.setdefault(n, len(self.errors))
            self.g.add("error", Sym("type", ERROR))
        elif isinstance(d, A.MatchKindDecl):
            mk = self.g.lookup("$match_kind")
            kinds: set[str] = mk.data if mk else set()
            kinds |= {n for n, _ in d.members}
            self.g.add("$match_kind", Sym("mk", data=kinds))
        elif isinstance(d, A.ConstDecl):
            ty = self.resolve_type(d.type, self.g)
            v = self.coerce(self.expr(d.value, self.g), ty, d.value.loc)
            if v.const is None:
                self.err(
                    d.value.loc, f"the value of constant {d.name} is not a compile-time constant"
                )
            self.g.add(d.name, Sym("const", ty, ir=v.ir, value=v.const))
        elif isinstance(d, A.ExternDecl):
            self.g.add(d.name, Sym("type", ExternT(d.name), data=d))
        elif isinstance(d, A.FunctionProto):
            self.g.add(d.name, Sym("func", data=d))
        elif isinstance(d, A.ActionDecl):
            self.top_actions[d.name] = d
            self.g.add(d.name, Sym("action", data=("top", d)))
        elif isinstance(d, A.ParserDecl):
            self.g.add(d.name, Sym("parser", data=d))
        elif isinstance(d, A.ControlDecl):
            self.g.add(d.name, Sym("control", data=d))
        elif isinstance(d, A.PackageDecl):
            self.g.add(d.name, Sym("package", data=d))
        elif isinstance(d, A.InstanceDecl):
            self.top_instance(d)
        elif isinstance(d, A.FunctionDecl):
            if d.proto.type_params:
                self.err(d.loc, "generic function declarations are not supported")
            self.g.add(d.proto.name, Sym("userfunc", data=d))
        else:  # pragma: no cover
            self.err(d.loc, f"unsupported declaration {type(d).__name__}")

    def declare_struct(self, d: A.HeaderDecl) -> None:
        t = (UnionT if d.is_union else StructT)(
            d.name,
            d.is_header,
            annotations=d.annotations,
        )
        seen: set[str] = set()
        for f in d.fields:
            if f.name in seen:
                self.err(f.loc, f"duplicate field {f.name} in {t}")
            seen.add(f.name)
            try:
                ft = self.resolve_type(f.type, self.g)
            except Diagnostic as e:
                self.diags.append(e)
                continue
            if d.is_header:
                if isinstance(ft, VarbitT) and t.varbit is not None:
                    self.err(f.loc, f"{t} has more than one varbit field")
                    continue
                if not (
                    isinstance(ft, (BitT, VarbitT, BoolT))
                    or (isinstance(ft, EnumT) and ft.underlying)
                    or _bits_struct(ft)
                ):
                    self.err(
                        f.loc,
                        f"header field {f.name} has type {ft}; only bit<W>, int<W>, bool, "
                        "varbit<W> and serializable enums are supported in headers",
                    )
                    continue
            elif d.is_union:
                if not (isinstance(ft, StructT) and ft.is_header and not isinstance(ft, StackT)):
                    self.err(f.loc, f"header_union member {f.name} has type {ft}, not a header")
                    continue
            elif isinstance(ft, (ExternT, IntLitT, StrT, VoidT)):
                self.err(f.loc, f"struct field {f.name} cannot have type {ft}")
                continue
            t.fields.append((f.name, ft))
            t.field_anns[f.name] = f.annotations
        if d.is_header and t.varbit is not None and any(_bits_struct(ft) for _n, ft in t.fields):
            self.err(d.loc, f"header {d.name} has both a varbit and a struct field")
        if d.is_header and t.width % 8:
            self.err(d.loc, f"header {d.name} is {t.width} bits long, not a multiple of 8")
        self.structs.append(t)
        self.g.add(d.name, Sym("type", t))

    def declare_enum(self, d: A.EnumDecl) -> None:
        under: BitT | None = None
        if d.underlying is not None:
            u = self.resolve_type(d.underlying, self.g)
            if not isinstance(u, BitT):
                raise Diagnostic(d.underlying.loc, "enum underlying type must be bit<W> or int<W>")
            under = u
        members: dict[str, int] = {}
        for i, (n, e, loc) in enumerate(d.members):
            if n in members:
                self.err(loc, f"duplicate enum member {n}")
            if under is not None:
                if e is None:
                    self.err(loc, f"member {n} of serializable enum {d.name} needs a value")
                    continue
                v = self.coerce(self.expr(e, self.g), under, e.loc)
                if v.const is None:
                    self.err(e.loc, "enum member value must be a compile-time constant")
                    continue
                members[n] = int(v.const)
            else:
                members[n] = i
        self.g.add(d.name, Sym("type", EnumT(d.name, members, under)))

    def top_instance(self, d: A.InstanceDecl) -> None:
        inst = d.inst
        tn = inst.type.name
        sym = self.g.lookup(tn)
        if sym is None or sym.kind != "package":
            if (
                sym is not None
                and sym.kind == "type"
                and isinstance(sym.ty, ExternT)
                and tn in ("counter", "register")
            ):
                # shared by every control (ingress and egress), named without a control
                self.instantiate(inst, self.g)
            elif sym is not None and sym.kind == "type" and isinstance(sym.ty, ExternT):
                self.err(d.loc, f"extern {tn} cannot be instantiated at top level on this target")
            else:
                self.err(inst.type.loc, f"unknown package type {tn}")
            return
        if tn != "V1Switch":
            self.err(inst.type.loc, f"package {tn} is not supported; use V1Switch (v1model)")
            return
        if d.name != "main":
            self.err(d.loc, "the V1Switch instance must be called 'main'")
            return
        roles = ["parser", "verify", "ingress", "egress", "compute", "deparser"]
        if len(inst.args) != 6:
            self.err(d.loc, f"V1Switch takes 6 arguments, {len(inst.args)} given")
            return
        blocks: dict[str, A.Decl] = {}
        for role, a in zip(roles, inst.args, strict=True):
            if not (isinstance(a, A.Call) and isinstance(a.func, A.Name) and not a.args):
                self.err(a.loc, f"V1Switch argument for the {role} must be Name()")
                return
            s = self.g.lookup(a.func.name)
            want = "parser" if role == "parser" else "control"
            if s is None or s.kind != want:
                self.err(a.loc, f"{a.func.name} is not a {want}")
                return
            blk = s.data
            if blk.proto:
                self.err(a.loc, f"{a.func.name} is only declared, not defined")
                return
            blocks[role] = blk
        self.g.add("main", Sym("main", data=blocks))

    # ------------------------------------------------------------------ types
    def resolve_type(self, t: A.TypeRef, scope: Scope) -> Ty:
        if t.stack is not None:
            return self.stack_type(t, scope)
        if t.kind in ("bit", "int"):
            if t.width is None:
                if t.kind == "int":
                    return INTLIT
                return BitT(1)
            w = self.expr(t.width, scope)
            if w.const is None or isinstance(w.const, bool) or int(w.const) <= 0:
                raise Diagnostic(
                    t.width.loc,
                    "the width of a bit/int type must be a positive compile-time constant",
                )
            if int(w.const) > 2048:
                raise Diagnostic(t.width.loc, "width too large (max 2048)")
            return BitT(int(w.const), t.kind == "int")
        if t.kind == "varbit":
            vw = self.expr(t.width, scope).const if t.width is not None else None
            if not isinstance(vw, int) or isinstance(vw, bool) or vw <= 0:
                raise Diagnostic(t.loc, "the width of a varbit must be a positive constant")
            if vw > 2048:
                raise Diagnostic(t.loc, "width too large (max 2048)")
            return VarbitT(vw)
        if t.kind == "bool":
            return BOOL
        if t.kind == "error":
            return ERROR
        if t.kind == "void":
            return VOID
        if t.kind == "string":
            return STR
        if t.kind == "tuple":
            return self.tuple_type(t, scope)
        s = scope.lookup(t.name)
        if s is None or s.kind != "type" or s.ty is None:
            raise Diagnostic(t.loc, f"unknown type {t.name}")
        if isinstance(s.ty, ExternT):
            return ExternT(s.ty.name, [self.resolve_type(a, scope) for a in t.args])
        if t.args:
            raise Diagnostic(t.loc, f"type {t.name} takes no type arguments")
        return s.ty

    # ------------------------------------------------------------------ expressions
    def tuple_type(self, t: A.TypeRef, scope: Scope) -> TupleT:
        """``tuple<T1, ...>``: a struct of its elements (fields ``f0`` ..), one per spelling."""
        items = [self.resolve_type(a, scope) for a in t.args]
        for a, it in zip(t.args, items, strict=True):
            if not isinstance(it, _DECLARABLE):
                raise Diagnostic(a.loc, f"a tuple element cannot have type {it}")
        key = "tuple<" + ", ".join(map(str, items)) + ">"
        if key not in self.tuple_types:
            tt = TupleT(
                key,
                False,
                [(f"f{i}", it) for i, it in enumerate(items)],
                index=len(self.tuple_types),
            )
            self.tuple_types[key] = tt
            self.structs.append(tt)
        return self.tuple_types[key]

    def stack_type(self, t: A.TypeRef, scope: Scope) -> StackT:
        """``H[n]``: a struct of n headers and the stack's nextIndex (see StackT)."""
        assert t.stack is not None
        elem = self.resolve_type(A.TypeRef(t.loc, t.kind, t.width, t.name, t.args), scope)
        if not (isinstance(elem, StructT) and (elem.is_header or isinstance(elem, UnionT))):
            raise Diagnostic(t.loc, f"a stack holds headers or header unions, not {elem}")
        n = self.expr(t.stack, scope)
        if not isinstance(n.const, int) or isinstance(n.const, bool) or not 0 < n.const <= 256:
            raise Diagnostic(t.stack.loc, "a header stack's size must be a constant 1..256")
        key = (elem.name, int(n.const))
        if key not in self.stack_types:
            st = StackT(
                f"{elem.name}[{key[1]}]",
                False,
                [*((f"e{i}", elem) for i in range(key[1])), ("nidx", BitT(32))],
                elem=elem,
                size=key[1],
            )
            self.stack_types[key] = st
            self.structs.append(st)
        return self.stack_types[key]

    def stack_elem(self, base: V, idx: ir.Expr, last: bool = False) -> V:
        """Element ``idx`` (a run-time bit<32>) of stack ``base``; ``last``: ``idx`` is
        nextIndex and the element is the one before it. Out of range: the last element
        (P4 leaves the value unspecified)."""
        st = base.ty
        assert isinstance(st, StackT) and st.elem is not None
        u32 = BitT(32)
        e: ir.Expr = ir.Field(st.elem, base.ir, f"e{st.size - 1}")
        for i in reversed(range(st.size - 1)):
            c = ir.Cmp(BOOL, "==", idx, ir.Const(u32, i + 1 if last else i))
            e = ir.Cond(st.elem, c, ir.Field(st.elem, base.ir, f"e{i}"), e)
        return V(e, readonly_why="an element at a run-time index cannot be assigned")

    def index_expr(self, e: A.Index, scope: Scope) -> V:
        base = self.expr(e.expr, scope)
        if isinstance(base.ty, TupleT):
            k = self.expr(e.index, scope).const
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < len(base.ty.fields):
                raise Diagnostic(e.index.loc, f"a {base.ty} is indexed by a constant in range")
            ft = base.ty.fields[k][1]
            return V(
                ir.Field(ft, base.ir, f"f{k}"), lvalue=base.lvalue, readonly_why=base.readonly_why
            )
        if not isinstance(base.ty, StackT):
            raise Diagnostic(e.loc, f"cannot index a value of type {base.ty}")
        i = self.expr(e.index, scope)
        if i.const is not None:
            k = int(i.const)
            if not 0 <= k < base.ty.size:
                raise Diagnostic(e.index.loc, f"index {k} is out of range for {base.ty}")
            assert base.ty.elem is not None
            return V(
                ir.Field(base.ty.elem, base.ir, f"e{k}"),
                lvalue=base.lvalue,
                readonly_why=base.readonly_why,
            )
        if not isinstance(i.ty, BitT):
            raise Diagnostic(e.index.loc, f"a stack index must be bit<W> or int<W>, not {i.ty}")
        idx = i.ir if i.ty == BitT(32) else ir.Cast(BitT(32), i.ir)
        return self.stack_elem(base, idx)

    def stack_member(self, base: V, name: str, loc: Loc) -> V:
        st = base.ty
        assert isinstance(st, StackT) and st.elem is not None
        nidx = ir.Field(BitT(32), base.ir, "nidx")
        if name == "size":
            return konst(BitT(32), st.size)
        if name == "lastIndex":
            return V(ir.Arith(BitT(32), "-", nidx, ir.Const(BitT(32), 1)))
        if name == "last":
            return self.stack_elem(base, nidx, last=True)
        if name == "next":
            raise Diagnostic(loc, "a stack's next is only supported as the argument of extract")
        raise Diagnostic(loc, f"{st} has no member {name}")

    def stack_shift(self, base: V, m: str, e: A.Call, scope: Scope) -> V:
        """push_front(k) / pop_front(k) as bmv2 does them: shift the elements by k (copies),
        invalidate the k freed ones, move nextIndex by k within 0..size."""
        st = base.ty
        assert isinstance(st, StackT) and st.elem is not None
        self.args_n(e, 1, m)
        k_v = self.expr(e.args[0], scope)
        if not isinstance(k_v.const, int) or isinstance(k_v.const, bool) or k_v.const < 0:
            raise Diagnostic(e.args[0].loc, f"{m} needs a non-negative constant count")
        if not base.lvalue:
            raise Diagnostic(e.loc, f"cannot call {m}() on a read-only stack")
        k, n = int(k_v.const), st.size
        el = [ir.Field(st.elem, base.ir, f"e{i}") for i in range(n)]
        out: list[ir.Stmt] = []
        u32 = BitT(32)
        nidx = ir.Field(u32, base.ir, "nidx")
        if m == "push_front":
            for i in reversed(range(k, n)):
                out.append(ir.Assign(el[i], el[i - k]))
            for i in range(min(k, n)):
                out.extend(invalidate(el[i]))
            up = ir.Arith(u32, "+", nidx, ir.Const(u32, k))
            full = ir.Cmp(BOOL, ">=", nidx, ir.Const(u32, max(n - k, 0)))
            out.append(ir.Assign(nidx, ir.Cond(u32, full, ir.Const(u32, n), up)))
        else:
            for i in range(n - k):
                out.append(ir.Assign(el[i], el[i + k]))
            for i in range(max(n - k, 0), n):
                out.extend(invalidate(el[i]))
            down = ir.Arith(u32, "-", nidx, ir.Const(u32, k))
            low = ir.Cmp(BOOL, "<", nidx, ir.Const(u32, k))
            out.append(ir.Assign(nidx, ir.Cond(u32, low, ir.Const(u32, 0), down)))
        if self.prelude is None:
            raise Diagnostic(e.loc, f"{m}() is a statement")
        self.prelude.extend(out)
        return do(ir.Nop())

    def coerce(self, v: V, ty: Ty, loc: Loc, what: str = "") -> V:
        """Implicit conversion of ``v`` to ``ty`` (int literals only), else a type error."""
        if v.ty == ty or v.ty is ty:
            return v
        if isinstance(v.ir, ir.Tuple) and isinstance(v.ty, ListT) and isinstance(ty, StructT):
            # a list initializer of a header (which it makes valid) or struct: field by field
            if len(v.ir.items) != len(ty.fields):
                raise Diagnostic(
                    loc,
                    f"{what or 'expression'} has {len(v.ir.items)} element(s), "
                    f"{ty} has {len(ty.fields)} field(s)",
                )
            items = []
            for (fname, fty), item in zip(ty.fields, v.ir.items, strict=True):
                iv = V(item, item.value if isinstance(item, ir.Const) else None)
                items.append(
                    self.coerce(iv, fty, loc, f"field {fname} of {what or 'the value'}").ir
                )
            return V(ir.Tuple(ty, tuple(items)))
        if isinstance(v.ty, IntLitT) and isinstance(ty, BitT):
            c = int(v.const)
            w = ty.width
            if ty.signed:
                if not -(1 << (w - 1)) <= c < (1 << w):
                    raise Diagnostic(loc, f"value {c} does not fit in {ty}")
                c = ((c + (1 << (w - 1))) & ((1 << w) - 1)) - (1 << (w - 1))
            else:
                if c >> w and c > 0:
                    raise Diagnostic(loc, f"value {c} does not fit in {ty}")
                c &= (1 << w) - 1
            return konst(ty, c)
        raise Diagnostic(
            loc,
            f"{what or 'expression'} has type {v.ty}, expected {ty}"
            + (
                "; an explicit cast is needed"
                if isinstance(v.ty, BitT) and isinstance(ty, BitT)
                else ""
            ),
        )

    @contextlib.contextmanager
    def dead_if(self, dead: bool) -> Iterator[None]:
        """Check what the block runs as code a constant condition leaves out when ``dead``."""
        self.dead += dead
        try:
            yield
        finally:
            self.dead -= dead

    def cond(self, e: A.Expr, scope: Scope) -> V:
        v = self.expr(e, scope)
        if not isinstance(v.ty, BoolT):
            raise Diagnostic(e.loc, f"condition must be bool, not {v.ty}")
        return v

    def expr(self, e: A.Expr, scope: Scope) -> V:
        if isinstance(e, A.IntLit):
            if e.width is None:
                return konst(INTLIT, e.value)
            return konst(BitT(e.width, e.signed), e.value)
        if isinstance(e, A.BoolLit):
            return konst(BOOL, e.value)
        if isinstance(e, A.StrLit):
            return konst(STR, e.value)
        if isinstance(e, A.Name):
            return self.name_expr(e, scope)
        if isinstance(e, A.Member):
            return self.member_expr(e, scope)
        if isinstance(e, A.Call):
            return self.call(e, scope, stmt=False)
        if isinstance(e, A.Slice):
            return self.slice_expr(e, scope)
        if isinstance(e, A.Index):
            return self.index_expr(e, scope)
        if isinstance(e, A.DontCare):
            raise Diagnostic(e.loc, "'_' is only allowed as an out argument or in extract")
        if isinstance(e, A.Unary):
            return self.unary_expr(e, scope)
        if isinstance(e, A.Binary):
            return self.binary_expr(e, scope)
        if isinstance(e, A.Cond):
            c = self.cond(e.cond, scope)
            m1 = len(self.prelude) if self.prelude is not None else 0
            with self.dead_if(c.const is False):
                a = self.expr(e.then, scope)
            m2 = len(self.prelude) if self.prelude is not None else 0
            with self.dead_if(c.const is True):
                b = self.expr(e.other, scope)
            if self.prelude is not None and len(self.prelude) > m1:
                # a branch calls a function: only the chosen branch runs its calls
                a_pre, b_pre = tuple(self.prelude[m1:m2]), tuple(self.prelude[m2:])
                del self.prelude[m1:]
                c = self.temp(c)
                self.prelude.append(ir.If(c.ir, a_pre or (ir.Nop(),), b_pre or None))
            a, b = self.unify(a, b, e.loc, "?:")
            if isinstance(a.ty, IntLitT):
                raise Diagnostic(e.loc, "the branches of ?: need a width (cast one of them)")
            if c.const is not None and a.const is not None and b.const is not None:
                r = a if c.const else b
                return V(r.ir, r.const)
            return V(ir.Cond(a.ty, c.ir, a.ir, b.ir))
        if isinstance(e, A.Cast):
            return self.cast_expr(e, scope)
        if isinstance(e, A.ListExpr):
            items: list[V] = []
            ends: list[int] = []
            for i in e.items:
                items.append(self.expr(i, scope))
                ends.append(len(self.prelude) if self.prelude is not None else 0)
            # an element keeps its value from before a later element's calls (left to right)
            for k in reversed(range(len(items))):
                if not isinstance(items[k].ty, ListT):  # (a nested list stays a list)
                    items[k] = self.spill_before(items[k], ends[k])
            return V(ir.Tuple(ListT([i.ty for i in items]), tuple(i.ir for i in items)))
        if isinstance(e, (A.Mask, A.RangeKS, A.Default)):
            raise Diagnostic(e.loc, "keyset expression outside select/entries")
        raise Diagnostic(e.loc, f"unsupported expression {type(e).__name__}")

    def name_expr(self, e: A.Name, scope: Scope) -> V:
        s = (self.g if e.top else scope).lookup(e.name)
        if s is None:
            raise Diagnostic(e.loc, f"undeclared name {e.name}")
        if s.kind == "poison":
            raise Poisoned(e.loc, f"{e.name} has errors")
        if s.kind == "const":
            assert s.ir is not None
            return V(s.ir, s.value)
        if s.kind == "var":
            assert s.ir is not None
            return V(s.ir, None, lvalue=not s.readonly, readonly_why=s.readonly)
        if s.kind == "type":
            assert s.ty is not None
            return V(ir.Entity(OtherT("type")), s.ty)
        if s.kind in ("table", "extern_inst", "packet", "action", "func", "subctl", "subparser"):
            return V(ir.Entity(OtherT(s.kind)), s)
        raise Diagnostic(e.loc, f"{e.name} cannot be used in an expression")

    def member_expr(self, e: A.Member, scope: Scope) -> V:
        target, self.assign_target = self.assign_target, False
        if isinstance(e.expr, A.Name) and e.expr.name == "error":
            if e.name not in self.errors:
                raise Diagnostic(e.name_loc or e.loc, f"unknown error {e.name}")
            c = self.errors[e.name]
            return konst(ERROR, c)
        base = self.expr(e.expr, scope)
        if isinstance(base.ty, OtherT) and base.ty.what == "type":
            t = base.const
            if isinstance(t, EnumT):
                if e.name not in t.members:
                    raise Diagnostic(e.name_loc or e.loc, f"{t} has no member {e.name}")
                c = t.members[e.name]
                return konst(t, c)
            raise Diagnostic(e.name_loc or e.loc, f"cannot select member {e.name} of type {t}")
        if isinstance(base.ty, StackT):
            return self.stack_member(base, e.name, e.name_loc or e.loc)
        if isinstance(base.ty, StructT):
            ft = base.ty.field(e.name)
            if ft is None:
                raise Diagnostic(e.name_loc or e.loc, f"{base.ty} has no field {e.name}")
            if (
                is_ctx(base.ir, "hdr")
                and self.ctl_role in _AFTER_INGRESS
                and self.egress_hdrs is not None
            ):
                self.egress_hdrs.add(e.name)
            if base.ty is self.std_t and not target:
                self.note_std_read(e.name)
            return V(
                ir.Field(ft, base.ir, e.name),
                None,
                lvalue=base.lvalue,
                readonly_why=base.readonly_why,
            )
        if isinstance(base.ty, ApplyT):
            if e.name in ("hit", "miss"):
                return V(ir.TableResult(BOOL, e.name, base.ir))
            if e.name == "action_run":
                return V(ir.TableResult(OtherT("action_run"), e.name, base.ir), base.ty.table)
            raise Diagnostic(e.name_loc or e.loc, f"a table apply result has no member {e.name}")
        raise Diagnostic(e.name_loc or e.loc, f"cannot select member {e.name} of {base.ty}")

    def slice_expr(self, e: A.Slice, scope: Scope) -> V:
        b = self.expr(e.expr, scope)
        if not isinstance(b.ty, BitT):
            raise Diagnostic(e.loc, f"cannot slice a value of type {b.ty}")
        hi = self.expr(e.hi, scope).const
        lo = self.expr(e.lo, scope).const
        if not isinstance(hi, int) or not isinstance(lo, int) or isinstance(hi, bool):
            raise Diagnostic(e.loc, "slice bounds must be compile-time constants")
        if not 0 <= lo <= hi < b.ty.width:
            raise Diagnostic(e.loc, f"slice [{hi}:{lo}] out of range for {b.ty}")
        w = hi - lo + 1
        const = None if b.const is None else (int(b.const) >> lo) & ((1 << w) - 1)
        return V(
            ir.Slice(BitT(w), b.ir, hi, lo), const, lvalue=b.lvalue, readonly_why=b.readonly_why
        )

    def cast_expr(self, e: A.Cast, scope: Scope) -> V:
        ty = self.resolve_type(e.type, scope)
        v = self.expr(e.expr, scope)
        src = v.ty
        if src == ty or src is ty:
            return v
        if isinstance(ty, BitT):
            w = ty.width
            m = (1 << w) - 1
            h = 1 << (w - 1)
            if isinstance(src, EnumT) and src.underlying is not None:
                src = src.underlying
            if isinstance(src, (BitT, IntLitT)):
                if v.const is not None:
                    c = int(v.const) & m
                    if ty.signed and c >= h:
                        c -= 1 << w
                    return konst(ty, c)
                return V(ir.Cast(ty, v.ir))
            if isinstance(src, BoolT) and w == 1 and not ty.signed:
                if v.const is not None:
                    return konst(ty, int(v.const))
                return V(ir.Cast(ty, v.ir))
        if isinstance(ty, BoolT) and isinstance(src, BitT) and src.width == 1:
            if v.const is not None:
                return konst(BOOL, bool(v.const))
            return V(ir.Cast(BOOL, v.ir))
        if isinstance(ty, BoolT) and isinstance(src, IntLitT) and v.const in (0, 1):
            return konst(BOOL, bool(v.const))
        if (
            isinstance(ty, EnumT)
            and ty.underlying is not None
            and (src == ty.underlying or isinstance(src, IntLitT))
        ):
            return V(ir.Cast(ty, v.ir), v.const)
        raise Diagnostic(e.loc, f"cannot cast {v.ty} to {ty}")

    def unify(self, a: V, b: V, loc: Loc, op: str) -> tuple[V, V]:
        if isinstance(a.ty, IntLitT) and not isinstance(b.ty, IntLitT):
            return self.coerce(a, b.ty, loc), b
        if isinstance(b.ty, IntLitT) and not isinstance(a.ty, IntLitT):
            return a, self.coerce(b, a.ty, loc)
        if a.ty != b.ty and a.ty is not b.ty:
            raise Diagnostic(
                loc,
                f"operands of '{op}' have different types {a.ty} and {b.ty}"
                + (
                    "; a cast is needed"
                    if isinstance(a.ty, BitT) and isinstance(b.ty, BitT)
                    else ""
                ),
            )
        return a, b

    def unary_expr(self, e: A.Unary, scope: Scope) -> V:
        v = self.expr(e.expr, scope)
        if e.op == "!":
            if not isinstance(v.ty, BoolT):
                raise Diagnostic(e.loc, f"operator '!' needs a bool, not {v.ty}")
            if v.const is not None:
                return konst(BOOL, not v.const)
            return V(ir.Unary(BOOL, "!", v.ir))
        if isinstance(v.ty, IntLitT):
            c = -int(v.const) if e.op == "-" else ~int(v.const)
            if e.op == "~":
                raise Diagnostic(e.loc, "operator '~' needs a value with a width")
            return konst(INTLIT, c)
        if not isinstance(v.ty, BitT):
            raise Diagnostic(e.loc, f"operator '{e.op}' needs bit<W> or int<W>, not {v.ty}")
        return self.arith(e.op, v, None, e.loc)

    def arith(self, op: str, a: V, b: V | None, loc: Loc) -> V:
        """Arithmetic on fixed-width values (``a``, ``b`` of the same BitT)."""
        t = a.ty
        assert isinstance(t, BitT)
        w = t.width
        m = (1 << w) - 1
        h = 1 << (w - 1)

        def cnorm(x: int) -> int:
            x &= m
            return x - (1 << w) if t.signed and x >= h else x

        if b is None:
            if a.const is not None:
                return konst(t, cnorm(-int(a.const) if op == "-" else ~int(a.const)))
            return V(ir.Unary(t, op, a.ir))
        ca, cb = a.const, b.const
        if ca is not None and cb is not None:
            x, y = int(ca), int(cb)
            r: int
            if op == "+":
                r = x + y
            elif op == "-":
                r = x - y
            elif op == "*":
                r = x * y
            elif op == "/":
                if y == 0:
                    raise Diagnostic(loc, "division by zero")
                r = x // y
            elif op == "%":
                if y == 0:
                    raise Diagnostic(loc, "division by zero")
                r = x % y
            elif op == "&":
                r = x & y
            elif op == "|":
                r = x | y
            elif op == "^":
                r = x ^ y
            elif op in ("|+|", "|-|"):
                r = x + y if op == "|+|" else x - y
                r = max(-h, min(h - 1, r)) if t.signed else max(0, min(m, r))
            else:  # pragma: no cover
                raise Diagnostic(loc, f"operator {op}")
            r = cnorm(r)
            return konst(t, r)
        if op in ("/", "%") and t.signed:
            raise Diagnostic(loc, f"operator '{op}' on signed values is not supported")
        if op not in ("+", "-", "*", "/", "%", "&", "|", "^", "|+|", "|-|"):  # pragma: no cover
            raise Diagnostic(loc, f"unsupported operator {op}")
        return V(ir.Arith(t, op, a.ir, b.ir))

    def binary_expr(self, e: A.Binary, scope: Scope) -> V:
        op = e.op
        a = self.expr(e.left, scope)
        mark = len(self.prelude) if self.prelude is not None else 0
        b = self.expr(e.right, scope)
        if op in ("&&", "||"):
            for v, side in ((a, e.left), (b, e.right)):
                if not isinstance(v.ty, BoolT):
                    raise Diagnostic(side.loc, f"operator '{op}' needs bool operands, not {v.ty}")
            if self.prelude is not None and len(self.prelude) > mark:
                # the right operand calls a function: only when the left one does not decide
                b_pre = tuple(self.prelude[mark:])
                del self.prelude[mark:]
                a = self.temp(a)
                guard = a.ir if op == "&&" else ir.Unary(BOOL, "!", a.ir)
                self.prelude.append(ir.If(guard, b_pre, None))
            if a.const is not None and b.const is not None:
                r = (a.const and b.const) if op == "&&" else (a.const or b.const)
                return konst(BOOL, bool(r))
            return V(ir.Logic(BOOL, op, a.ir, b.ir))
        a = self.spill_before(a, mark)
        if op in ("<<", ">>"):
            if not isinstance(b.ty, (BitT, IntLitT)) or (
                b.ty == BitT(b.ty.width, True) if isinstance(b.ty, BitT) else False
            ):
                raise Diagnostic(e.right.loc, f"shift amount must be unsigned, not {b.ty}")
            if isinstance(b.ty, IntLitT) and int(b.const) < 0:
                raise Diagnostic(e.right.loc, "negative shift amount")
            if isinstance(a.ty, IntLitT):
                if b.const is None:
                    raise Diagnostic(
                        e.left.loc,
                        "shifting an int literal by a run-time amount "
                        "needs a width (cast the literal)",
                    )
                r = int(a.const) << int(b.const) if op == "<<" else int(a.const) >> int(b.const)
                return konst(INTLIT, r)
            if not isinstance(a.ty, BitT):
                raise Diagnostic(e.left.loc, f"cannot shift a value of type {a.ty}")
            t = a.ty
            m = (1 << t.width) - 1
            if a.const is not None and b.const is not None:
                x = int(a.const)
                r = (x << int(b.const)) if op == "<<" else (x >> int(b.const))
                r &= m
                if t.signed and r >> (t.width - 1):
                    r -= 1 << t.width
                return konst(t, r)
            return V(ir.Arith(t, op, a.ir, b.ir))
        if op == "++":
            for v, side in ((a, e.left), (b, e.right)):
                if not isinstance(v.ty, BitT):
                    raise Diagnostic(
                        side.loc, f"operand of '++' must be bit<W> or int<W>, not {v.ty}"
                    )
            assert isinstance(a.ty, BitT) and isinstance(b.ty, BitT)
            wa, wb = a.ty.width, b.ty.width
            t = BitT(wa + wb, a.ty.signed)
            if a.const is not None and b.const is not None:
                c = ((int(a.const) & ((1 << wa) - 1)) << wb) | (int(b.const) & ((1 << wb) - 1))
                if t.signed and c >> (t.width - 1):
                    c -= 1 << t.width
                return konst(t, c)
            return V(ir.Concat(t, a.ir, b.ir))
        if op in ("==", "!=", "<", ">", "<=", ">="):
            a, b = self.unify(a, b, e.loc, op)
            if op in ("<", ">", "<=", ">=") and not isinstance(a.ty, (BitT, IntLitT)):
                raise Diagnostic(e.loc, f"operator '{op}' needs numeric operands, not {a.ty}")
            if isinstance(a.ty, StructT) and op in ("==", "!="):
                eq = struct_eq(a.ir, b.ir, a.ty)
                return V(eq if op == "==" else ir.Unary(BOOL, "!", eq))
            if isinstance(a.ty, (StructT, ListT, OtherT)):
                raise Diagnostic(e.loc, f"cannot compare values of type {a.ty}")
            if a.const is not None and b.const is not None:
                r = bool(eval(f"{a.const!r} {op} {b.const!r}"))  # ints/bools only
                return konst(BOOL, r)
            return V(ir.Cmp(BOOL, op, a.ir, b.ir))
        if op in ("+", "-", "*", "/", "%", "&", "|", "^", "|+|", "|-|"):
            if isinstance(a.ty, IntLitT) and isinstance(b.ty, IntLitT):
                x, y = int(a.const), int(b.const)
                if op in ("|+|", "|-|"):
                    raise Diagnostic(e.loc, f"operator '{op}' needs a value with a width")
                if op in ("/", "%") and y == 0:
                    raise Diagnostic(e.loc, "division by zero")
                r = {
                    "+": x + y,
                    "-": x - y,
                    "*": x * y,
                    "/": x // y if y else 0,
                    "%": x % y if y else 0,
                    "&": x & y,
                    "|": x | y,
                    "^": x ^ y,
                }[op]
                return konst(INTLIT, r)
            a, b = self.unify(a, b, e.loc, op)
            if not isinstance(a.ty, BitT):
                raise Diagnostic(
                    e.loc, f"operator '{op}' needs bit<W> or int<W> operands, not {a.ty}"
                )
            return self.arith(op, a, b, e.loc)
        raise Diagnostic(e.loc, f"unsupported operator '{op}'")

    # ------------------------------------------------------------------ calls
    def call(self, e: A.Call, scope: Scope, stmt: bool) -> V:
        f = e.func
        if isinstance(f, A.Member):
            m = f.name
            # header validity
            if m in ("isValid", "setValid", "setInvalid"):
                base = self.expr(f.expr, scope)
                if isinstance(base.ty, UnionT) and m == "isValid":
                    # a union is valid when one of its members is
                    if e.args:
                        raise Diagnostic(e.loc, f"{m}() takes no arguments")
                    members = [
                        ir.IsValid(BOOL, ir.Field(ft, base.ir, n)) for n, ft in base.ty.fields
                    ]
                    any_valid: ir.Expr = ir.Const(BOOL, False)
                    for i, mv in enumerate(members):
                        any_valid = mv if i == 0 else ir.Logic(BOOL, "||", any_valid, mv)
                    return V(any_valid)
                if not (isinstance(base.ty, StructT) and base.ty.is_header):
                    raise Diagnostic(f.loc, f"{m}() needs a header, not {base.ty}")
                if e.args:
                    raise Diagnostic(e.loc, f"{m}() takes no arguments")
                if m == "isValid":
                    return V(ir.IsValid(BOOL, base.ir))
                if not base.lvalue:
                    raise Diagnostic(e.loc, f"cannot call {m}() on a read-only header")
                if m == "setValid":
                    return do(ir.SetValid(base.ir, True), union_others(base.ir))
                return do(ir.SetValid(base.ir, False))
            if isinstance(f.expr, A.Name) and m == "apply":
                ds = scope.lookup(f.expr.name)
                if ds is not None and ds.kind in ("control", "parser"):
                    raise Diagnostic(
                        f.loc,
                        f"applying {ds.kind} type {f.expr.name} directly is not supported; "
                        "instantiate it",
                    )
            bs = self.expr(f.expr, scope)
            if isinstance(bs.ty, StackT) and m in ("push_front", "pop_front"):
                return self.stack_shift(bs, m, e, scope)
            if isinstance(bs.ty, OtherT) and isinstance(bs.const, Sym):
                s: Sym = bs.const
                if s.kind == "table":
                    if m != "apply":
                        raise Diagnostic(f.loc, f"table has no method {m}")
                    if e.args:
                        raise Diagnostic(e.loc, "apply() takes no arguments")
                    tc: TableCtx = s.data
                    if tc.applied:
                        raise Diagnostic(
                            e.loc,
                            f"table {tc.info.name} is applied more than once "
                            "(bmv2 allows one apply per control)",
                        )
                    tc.applied = True
                    tc.live = tc.live or not self.dead
                    return V(ir.TableApply(ApplyT(tc), tc.uid))
                if s.kind == "packet":
                    return self.packet_call(s, m, e, scope)
                if s.kind == "subparser":
                    if m != "apply":
                        raise Diagnostic(f.loc, f"a parser instance has no method {m}")
                    return self.subparser_apply(s.data, e, scope)
                if s.kind == "subctl":
                    if m != "apply":
                        raise Diagnostic(f.loc, f"a control instance has no method {m}")
                    if not stmt:
                        raise Diagnostic(e.loc, "applying a control is a statement, not a value")
                    return self.subctl_apply(s.data, e, scope)
                if s.kind == "extern_inst":
                    return self.extern_method(s, m, e, scope)
            raise Diagnostic(f.loc, f"unknown method {m}")
        if isinstance(f, A.Name):
            s2 = scope.lookup(f.name)
            if s2 is None:
                raise Diagnostic(f.loc, f"undeclared function {f.name}")
            if s2.kind == "action":
                return self.direct_action_call(s2, e, scope)
            if s2.kind == "userfunc":
                return self.user_func_call(s2.data, e, scope, stmt)
            if s2.kind == "func":
                if f.name not in BUILTIN_FUNCS:
                    raise Diagnostic(
                        f.loc, f"extern function {f.name} is not supported by this target"
                    )
                return self.builtin_call(f.name, e, scope)
            raise Diagnostic(f.loc, f"{f.name} is not a function or action")
        raise Diagnostic(e.loc, "unsupported call")

    def args_n(self, e: A.Call, n: int, name: str) -> None:
        if len(e.args) != n:
            raise Diagnostic(
                e.loc, f"{name} takes {n} argument{'s' if n != 1 else ''}, {len(e.args)} given"
            )

    def lvalue(self, e: A.Expr, scope: Scope, *, read: bool = False) -> V:
        """``e`` as an assignment target; ``read``: its old value is read too (not only
        replaced), which :meth:`note_std_read` needs to know."""
        self.assign_target = not read and isinstance(e, A.Member)
        try:
            v = self.expr(e, scope)
        finally:
            self.assign_target = False
        if is_ctx(v.ir, "hdr") and self.ctl_role in _AFTER_INGRESS:
            self.egress_hdrs = None  # the whole headers struct written: copy every header
        if not v.lvalue:
            why = f" ({v.readonly_why})" if v.readonly_why else ""
            raise Diagnostic(e.loc, f"expression is not assignable{why}")
        return v

    def runtime_index_now(self, e: A.Expr, scope: Scope, loc: Loc) -> tuple[A.Index, V, int] | None:
        """:meth:`runtime_index`, its value kept in a fresh local (in the prelude)."""
        rt = self.runtime_index(e, scope)
        if rt is None:
            return None
        if self.prelude is None:
            raise Diagnostic(loc, "a run-time stack index cannot be assigned here")
        return rt[0], self.temp(rt[1], "idx"), rt[2]

    def runtime_index(self, e: A.Expr, scope: Scope) -> tuple[A.Index, V, int] | None:
        """The outermost stack index with a run-time value in l-value ``e`` (its index
        checked, once), or None."""
        found: tuple[A.Index, V, int] | None = None
        x = e
        while isinstance(x, (A.Member, A.Slice, A.Index)):
            if isinstance(x, A.Index):
                mark = len(self.prelude) if self.prelude is not None else 0
                try:
                    base_t = self.expr(x.expr, scope).ty
                finally:
                    if self.prelude is not None:
                        del self.prelude[mark:]
                if isinstance(base_t, StackT):
                    i = self.expr(x.index, scope)
                    if i.const is None:
                        if not isinstance(i.ty, BitT):
                            raise Diagnostic(
                                x.index.loc, f"a stack index must be bit<W>, not {i.ty}"
                            )
                        found = (x, i, base_t.size)
            x = x.expr
        return found

    @staticmethod
    def init_assigns(ref: ir.Ref, rhs: ir.Expr) -> list[ir.Stmt]:
        """A fresh local ``ref`` set to ``rhs`` (a list initializer needs the value first)."""
        pre: list[ir.Stmt] = [ir.Init(ref)] if isinstance(rhs, ir.Tuple) else []
        return [*pre, *Checker.assigns(ref, rhs)]

    @staticmethod
    def assigns(lhs: ir.Expr, rhs: ir.Expr) -> list[ir.Stmt]:
        """``lhs = rhs``; a list initializer of a header or struct (a Tuple of that type) is
        assigned field by field, a header's made valid first."""
        if isinstance(rhs, ir.Tuple) and isinstance(rhs.ty, StructT):
            out: list[ir.Stmt] = [ir.SetValid(lhs, True)] if rhs.ty.is_header else []
            for (fname, fty), item in zip(rhs.ty.fields, rhs.items, strict=True):
                out.extend(Checker.assigns(ir.Field(fty, lhs, fname), item))
            return out
        return [ir.Assign(lhs, rhs)]

    def assign(
        self,
        lhs_e: A.Expr,
        rhs: V,
        scope: Scope,
        loc: Loc,
        rt_index: tuple[A.Index, V, int] | None = None,
    ) -> list[ir.Stmt]:
        """``lhs_e = rhs``; ``rt_index``: the run-time stack index of ``lhs_e`` already
        evaluated (into a local, by :meth:`runtime_index_now`), as P4 evaluates the left side
        first."""
        rt = rt_index or self.runtime_index_now(lhs_e, scope, loc)
        if rt is not None:
            # a write through a run-time stack index: one branch per element, as p4c's
            # HSIndexSimplifier does for bmv2 (an index out of range writes nothing)
            node, t, size = rt
            other: tuple[ir.Stmt, ...] | None = None
            for i in reversed(range(size)):
                lit = A.IntLit(node.index.loc, i, None, False)
                sub = _replace_index(lhs_e, node, A.Index(node.loc, node.expr, lit))
                c = ir.Cmp(BOOL, "==", t.ir, ir.Const(t.ty, i))
                other = (ir.If(c, tuple(self.assign(sub, rhs, scope, loc)), other),)
            return list(other or ())
        if isinstance(lhs_e, A.Slice):
            # a slice of a slice is a slice of the innermost base: x[7:4][3:1] is x[7:5]
            inner_e: A.Expr = lhs_e
            while isinstance(inner_e, A.Slice):
                inner_e = inner_e.expr
            base = self.lvalue(inner_e, scope, read=True)
            sl = self.slice_expr(lhs_e, scope)
            assert isinstance(sl.ty, BitT) and isinstance(base.ty, BitT)
            r = self.coerce(rhs, sl.ty, loc, "right-hand side")
            assert isinstance(sl.ir, ir.Slice)
            hi, lo, inner = sl.ir.hi, sl.ir.lo, sl.ir.x
            while isinstance(inner, ir.Slice):
                hi, lo, inner = hi + inner.lo, lo + inner.lo, inner.x
            return [ir.AssignSlice(base.ir, hi, lo, r.ir)]
        lv = self.lvalue(lhs_e, scope)
        r = self.coerce(rhs, lv.ty, loc, "right-hand side")
        out = self.assigns(lv.ir, r.ir)
        others = union_others(lv.ir)
        if others:  # a union member assigned a valid header: the others become invalid
            out.append(ir.If(ir.IsValid(BOOL, lv.ir), others, None))
        return out

    def packet_call(self, s: Sym, m: str, e: A.Call, scope: Scope) -> V:
        kind = s.data
        if kind == "in":
            if self.ctl_role != "parser":
                raise Diagnostic(e.loc, "packet_in methods are only allowed in the parser")
            if m == "extract":
                if len(e.args) == 2:
                    return self.extract_varbit(e, scope)
                self.args_n(e, 1, "extract")
                a0 = e.args[0]
                if isinstance(a0, A.DontCare):
                    # extract<H>(_): the bytes are read into a header nobody reads
                    if len(e.type_args) != 1:
                        raise Diagnostic(a0.loc, "extract(_) needs the header type: extract<H>(_)")
                    ht = self.resolve_type(e.type_args[0], scope)
                    if not (isinstance(ht, StructT) and ht.is_header) or ht.varbit is not None:
                        raise Diagnostic(a0.loc, f"extract needs a fixed-size header, not {ht}")
                    assert self.prelude is not None
                    ref = ir.Ref(ht, "local", self.fresh("l_dc_"))
                    self.prelude.append(ir.Init(ref))
                    return do(ir.Extract(ref, self.errors["PacketTooShort"]))
                if isinstance(a0, A.Member) and a0.name == "next":
                    st = self.lvalue(a0.expr, scope)
                    if isinstance(st.ty, StackT):
                        return self.extract_next(st, None, a0.loc)
                if (
                    isinstance(a0, A.Member)
                    and isinstance(a0.expr, A.Member)
                    and a0.expr.name == "next"
                ):
                    # stack_of_unions.next.member
                    st = self.lvalue(a0.expr.expr, scope)
                    if isinstance(st.ty, StackT):
                        return self.extract_next(st, a0.name, a0.name_loc or a0.loc)
                h = self.lvalue(e.args[0], scope)
                if not (isinstance(h.ty, StructT) and h.ty.is_header):
                    raise Diagnostic(e.args[0].loc, f"extract needs a header, not {h.ty}")
                if h.ty.varbit is not None:
                    raise Diagnostic(
                        e.loc, f"extract of {h.ty} (with a varbit field) needs a length in bits"
                    )
                ext = ir.Extract(h.ir, self.errors["PacketTooShort"])
                return do(ext, union_others(h.ir))
            if m == "lookahead":
                if len(e.type_args) != 1 or e.args:
                    raise Diagnostic(e.loc, "lookahead needs one type argument and no arguments")
                t = self.resolve_type(e.type_args[0], scope)
                if isinstance(t, BitT) or (
                    isinstance(t, StructT) and t.is_header and t.varbit is None
                ):
                    return V(ir.Lookahead(t))
                if (
                    isinstance(t, StructT)
                    and not isinstance(t, (StackT, UnionT))
                    and t.fields
                    and all(isinstance(ft, (BitT, BoolT)) for _n, ft in t.fields)
                ):
                    return self.lookahead_struct(t)
                raise Diagnostic(e.loc, f"lookahead<{t}> is not supported")
            if m == "advance":
                self.args_n(e, 1, "advance")
                a = self.coerce(self.expr(e.args[0], scope), BitT(32), e.args[0].loc)
                return do(ir.Advance(a.ir))
            raise Diagnostic(e.func.loc, f"packet_in has no method {m} on this target")
        if self.ctl_role != "deparser":
            raise Diagnostic(e.loc, "packet_out.emit is only allowed in the deparser")
        if m != "emit":
            raise Diagnostic(e.func.loc, f"packet_out has no method {m}")
        self.args_n(e, 1, "emit")
        v = self.expr(e.args[0], scope)
        if not isinstance(v.ty, StructT):
            raise Diagnostic(e.args[0].loc, f"emit needs a header or struct, not {v.ty}")
        self.check_emit(v.ty)
        return do(ir.Emit(v.ir))

    def lookahead_struct(self, t: StructT) -> V:
        """``lookahead<S>()`` of a struct of bit<W>/int<W>/bool fields: its bits looked at as
        one bit<W>, then each field from its slice (MSB first, as a header would be)."""
        assert self.prelude is not None
        total = sum(bit_width(ft) or 0 for _n, ft in t.fields)
        bits = self.temp(V(ir.Lookahead(BitT(total))), "la")
        ref = ir.Ref(t, "local", self.fresh("l_la_"))
        self.prelude.append(ir.Init(ref))
        hi = total - 1
        for n, ft in t.fields:
            w = bit_width(ft) or 0
            sl: ir.Expr = ir.Slice(BitT(w), bits.ir, hi, hi - w + 1)
            if isinstance(ft, BoolT):
                sl = ir.Cmp(BOOL, "==", sl, ir.Const(BitT(1), 1))
            elif isinstance(ft, BitT) and ft.signed:
                sl = ir.Cast(ft, sl)
            self.prelude.append(ir.Assign(ir.Field(ft, ref, n), sl))
            hi -= w
        return V(ref)

    def extract_varbit(self, e: A.Call, scope: Scope) -> V:
        """``pkt.extract(h, nbits)``: header ``h`` with ``nbits`` bits in its varbit field."""
        a0 = e.args[0]
        if isinstance(a0, A.Member) and a0.name == "next":
            st = self.lvalue(a0.expr, scope)
            if isinstance(st.ty, StackT):
                n = self.coerce(self.expr(e.args[1], scope), BitT(32), e.args[1].loc, "the length")
                return self.extract_next(st, None, a0.loc, n.ir)
        h = self.lvalue(e.args[0], scope)
        if not (isinstance(h.ty, StructT) and h.ty.is_header):
            raise Diagnostic(e.args[0].loc, f"extract needs a header, not {h.ty}")
        if h.ty.varbit is None:
            raise Diagnostic(e.loc, f"{h.ty} has no varbit field; extract takes one argument")
        n = self.coerce(self.expr(e.args[1], scope), BitT(32), e.args[1].loc, "the length")
        ext = ir.Extract(
            h.ir,
            self.errors["PacketTooShort"],
            n.ir,
            self.errors["ParserInvalidArgument"],
            self.errors["HeaderTooShort"],
        )
        return do(ext, union_others(h.ir))

    def extract_next(self, st: V, member: str | None, loc: Loc, length: ir.Expr | None = None) -> V:
        """``pkt.extract(stack.next)``: a full stack is parser error StackOutOfBounds, else
        the element at nextIndex is extracted and then nextIndex moves on (not when the
        extract fails, as bmv2 pushes the element only after it is extracted). ``member``: a
        stack of header unions, ``stack.next.member`` (the element's other members made
        invalid); ``length``: the varbit length of ``extract(stack.next, length)``."""
        t = st.ty
        assert isinstance(t, StackT) and self.prelude is not None and t.elem is not None
        if isinstance(t.elem, UnionT) != (member is not None):
            what = "a member of next" if member is None else "next"
            raise Diagnostic(loc, f"extract of a stack of {t.elem} needs {what}")
        mt: Ty | None = None
        if member is not None:
            mt = t.elem.field(member)
            if mt is None:
                raise Diagnostic(loc, f"{t.elem} has no member {member}")
        u32 = BitT(32)
        nidx = ir.Field(u32, st.ir, "nidx")
        room = ir.Cmp(BOOL, "<", nidx, ir.Const(u32, t.size))
        self.prelude.append(ir.Verify(room, ir.Const(ERROR, self.errors["StackOutOfBounds"])))
        h = self.stack_elem(st, nidx).ir
        if member is not None:
            assert mt is not None
            h = ir.Field(mt, h, member)
        assert isinstance(h.ty, StructT)
        if (h.ty.varbit is not None) != (length is not None):
            if length is None:
                raise Diagnostic(loc, f"extract of {h.ty} (with a varbit field) needs a length")
            raise Diagnostic(loc, f"{h.ty} has no varbit field; extract takes one argument")
        bump = ir.Assign(nidx, ir.Arith(u32, "+", nidx, ir.Const(u32, 1)))
        ext = ir.Extract(
            h,
            self.errors["PacketTooShort"],
            length,
            self.errors["ParserInvalidArgument"] if length is not None else 0,
            self.errors["HeaderTooShort"] if length is not None else 0,
        )
        return do(ext, (*union_others(h), bump))

    def check_emit(self, t: StructT) -> None:
        """A struct to emit holds only headers and structs of them."""
        if t.is_header:
            return
        for n, ft in t.fields:
            if isinstance(t, StackT) and n == "nidx":
                continue
            if not isinstance(ft, StructT):
                raise Diagnostic(
                    Loc("<emit>", 0, 0),
                    f"cannot emit struct {t.name}: field {n} is not a header or struct",
                )
            self.check_emit(ft)

    def extern_method(self, s: Sym, m: str, e: A.Call, scope: Scope) -> V:
        kind, info, uid = s.data
        if kind == "counter":
            if m != "count":
                raise Diagnostic(e.func.loc, f"counter has no method {m}")
            self.args_n(e, 1, "count")
            i = self.coerce(self.expr(e.args[0], scope), BitT(32), e.args[0].loc, "index")
            self.note_std_read("packet_length")  # bytes counted
            return do(ir.Count(uid, i.ir))
        if kind == "direct_counter":
            if m != "count":
                raise Diagnostic(e.func.loc, f"direct_counter has no method {m}")
            self.args_n(e, 0, "count")
            return do(ir.Nop())  # bmv2 counts every hit of the owning table
        if kind == "register":
            assert isinstance(info, RegisterInfo)
            elt = s.ty
            assert isinstance(elt, BitT)
            if m == "read":
                self.args_n(e, 2, "read")
                dst = self.lvalue(e.args[0], scope)
                if dst.ty != elt:
                    raise Diagnostic(
                        e.args[0].loc, f"register read into {dst.ty}, register holds {elt}"
                    )
                i = self.coerce(self.expr(e.args[1], scope), BitT(32), e.args[1].loc, "index")
                return do(ir.RegisterRead(dst.ir, uid, i.ir))
            if m == "write":
                self.args_n(e, 2, "write")
                i = self.coerce(self.expr(e.args[0], scope), BitT(32), e.args[0].loc, "index")
                v = self.coerce(self.expr(e.args[1], scope), elt, e.args[1].loc, "value")
                return do(ir.RegisterWrite(uid, i.ir, v.ir))
            raise Diagnostic(e.func.loc, f"register has no method {m}")
        raise Diagnostic(e.func.loc, f"unsupported extern method {m}")

    def fields_list(self, e: A.Expr, scope: Scope, what: str) -> tuple[ir.DataItem, ...]:
        """A ``{a, b, ...}`` list (or a struct/header) as data items: each value, its width
        and, for a field of a header, that header."""
        if isinstance(e, A.ListExpr):
            vals = [(self.expr(i, scope), i.loc) for i in e.items]
            headers = [self.header_of(v.ir) for v, _ in vals]
        else:
            v = self.expr(e, scope)
            if not isinstance(v.ty, StructT):
                raise Diagnostic(e.loc, f"{what} must be a list {{...}} or a struct")
            vals = [(V(ir.Field(ft, v.ir, n)), e.loc) for n, ft in v.ty.fields]
            if v.ty is self.std_t:
                self.note_std_read(*(n for n, _ in v.ty.fields))
            headers = [v.ir if v.ty.is_header else None] * len(vals)
        out: list[ir.DataItem] = []
        for (v, loc), h in zip(vals, headers, strict=True):
            w = bit_width(v.ty)
            if isinstance(v.ty, VarbitT) and what != "digest data":
                w = v.ty.max_width  # the value's own length counts (its nbits, at run time)
            if w is None:
                raise Diagnostic(loc, f"{what}: element of type {v.ty} has no fixed width")
            out.append(ir.DataItem(v.ir, w, h))
        return tuple(out)

    @staticmethod
    def header_of(e: ir.Expr) -> ir.Expr | None:
        """The header whose field ``e`` is, else None."""
        if isinstance(e, ir.Field) and isinstance(e.base.ty, StructT) and e.base.ty.is_header:
            return e.base
        return None

    def valid_in(self, e: A.Expr, scope: Scope) -> tuple[ir.Expr, ...]:
        """The headers a condition requires to be valid: ``h.isValid()`` joined by ``&&``."""
        if isinstance(e, A.Binary) and e.op == "&&":
            return self.valid_in(e.left, scope) + self.valid_in(e.right, scope)
        if (
            isinstance(e, A.Call)
            and isinstance(e.func, A.Member)
            and e.func.name == "isValid"
            and not e.args
        ):
            base = self.expr(e.func.expr, scope)
            if isinstance(base.ty, StructT) and base.ty.is_header:
                return (base.ir,)
        return ()

    def algo(self, e: A.Expr, scope: Scope) -> str:
        v = self.expr(e, scope)
        if not (isinstance(v.ty, EnumT) and v.ty.name == "HashAlgorithm"):
            raise Diagnostic(e.loc, f"expected a HashAlgorithm, not {v.ty}")
        name = next(k for k, c in v.ty.members.items() if c == v.const)
        if name not in HASH_ALGOS:
            raise Diagnostic(
                e.loc,
                f"HashAlgorithm.{name} is not supported (supported: "
                f"{', '.join(sorted(HASH_ALGOS))})",
            )
        return name

    def builtin_call(self, name: str, e: A.Call, scope: Scope) -> V:
        a = e.args
        if name == "mark_to_drop":
            self.args_n(e, 1, name)
            v = self.expr(a[0], scope)
            if not (isinstance(v.ty, StructT) and v.ty.name == "standard_metadata_t"):
                raise Diagnostic(a[0].loc, "mark_to_drop needs standard_metadata")
            return do(ir.MarkToDrop(v.ir))
        if name == "verify":
            if self.ctl_role != "parser":
                raise Diagnostic(e.loc, "verify() is only allowed in the parser")
            self.args_n(e, 2, name)
            c = self.cond(a[0], scope)
            er = self.expr(a[1], scope)
            if not isinstance(er.ty, ErrorT):
                raise Diagnostic(a[1].loc, f"verify needs an error, not {er.ty}")
            return do(ir.Verify(c.ir, er.ir))
        if name in (
            "verify_checksum",
            "update_checksum",
            "verify_checksum_with_payload",
            "update_checksum_with_payload",
        ):
            role = "verify" if name.startswith("verify") else "compute"
            if self.ctl_role != role:
                where = "VerifyChecksum" if role == "verify" else "ComputeChecksum"
                raise Diagnostic(e.loc, f"{name} is only allowed in the {where} control")
            self.args_n(e, 4, name)
            c = self.cond(a[0], scope)
            fl = self.fields_list(a[1], scope, "checksum data")
            implied = self.valid_in(a[0], scope)
            alg = self.algo(a[3], scope)
            if role == "verify":
                ck = self.expr(a[2], scope)
                w = bit_width(ck.ty)
                if w is None:
                    raise Diagnostic(a[2].loc, f"checksum field of type {ck.ty}")
            else:
                ck = self.lvalue(a[2], scope)
                w = bit_width(ck.ty)
                if w is None or not isinstance(ck.ty, BitT):
                    raise Diagnostic(a[2].loc, f"checksum field of type {ck.ty}")
            return do(
                ir.Checksum(
                    role == "verify",
                    c.ir,
                    fl,
                    implied,
                    ck.ir,
                    w,
                    alg,
                    name.endswith("payload"),
                )
            )
        if name == "hash":
            self.args_n(e, 5, name)
            dst = self.lvalue(a[0], scope)
            if not isinstance(dst.ty, BitT) or dst.ty.signed:
                raise Diagnostic(a[0].loc, f"hash result must be bit<W>, not {dst.ty}")
            alg = self.algo(a[1], scope)
            base = self.expr(a[2], scope)
            mx = self.expr(a[4], scope)
            for v, x in ((base, a[2]), (mx, a[4])):
                if not isinstance(v.ty, (BitT, IntLitT)):
                    raise Diagnostic(x.loc, f"hash base/max must be bit<W>, not {v.ty}")
            fl = self.fields_list(a[3], scope, "hash data")
            return do(ir.Hash(dst.ir, alg, base.ir, fl, mx.ir))
        if name == "random":
            self.args_n(e, 3, name)
            dst = self.lvalue(a[0], scope)
            lo = self.coerce(self.expr(a[1], scope), dst.ty, a[1].loc)
            hi = self.coerce(self.expr(a[2], scope), dst.ty, a[2].loc)
            return do(ir.Random(dst.ir, lo.ir, hi.ir))
        if name == "digest":
            self.args_n(e, 2, name)
            rcv = self.coerce(self.expr(a[0], scope), BitT(32), a[0].loc, "receiver")
            del rcv
            st: StructT | None = None
            if e.type_args:
                t = self.resolve_type(e.type_args[0], scope)
                if not isinstance(t, StructT) or t.is_header:
                    raise Diagnostic(e.loc, f"digest type must be a struct, not {t}")
                st = t
            else:
                dv = self.expr(a[1], scope)
                if not isinstance(dv.ty, StructT) or dv.ty.is_header:
                    raise Diagnostic(a[1].loc, "digest data must be a struct (or give digest<T>)")
                st = dv.ty
            fl = self.fields_list(a[1], scope, "digest data")
            if len(fl) != len(st.fields):
                raise Diagnostic(
                    a[1].loc,
                    f"digest data has {len(fl)} elements, struct "
                    f"{st.name} has {len(st.fields)} fields",
                )
            for item, (fname, ft) in zip(fl, st.fields, strict=True):
                w = item.width
                if bit_width(ft) != w:
                    raise Diagnostic(
                        a[1].loc, f"digest element for {fname} is {w} bits, field is {ft}"
                    )
            if st.name not in self.digests:
                self.digests[st.name] = DigestInfo(
                    st.name, [(n, bit_width(t) or 0) for n, t in st.fields]
                )
            return do(ir.Digest(st.name, fl))
        if name in ("clone", "clone3", "clone_preserving_field_list"):
            n = {"clone": 2, "clone3": 3, "clone_preserving_field_list": 3}[name]
            self.args_n(e, n, name)
            ct = self.expr(a[0], scope)
            if not (isinstance(ct.ty, EnumT) and ct.ty.name == "CloneType") or ct.const is None:
                raise Diagnostic(a[0].loc, "expected CloneType.I2E or CloneType.E2E")
            want = "ingress" if ct.const == 0 else "egress"
            if self.ctl_role != want:
                raise Diagnostic(
                    e.loc,
                    f"clone of type {'I2E' if ct.const == 0 else 'E2E'} is "
                    f"only allowed in the {want} control",
                )
            sess = self.coerce(self.expr(a[1], scope), BitT(32), a[1].loc, "session")
            flist = -1
            if name == "clone_preserving_field_list":
                f = self.coerce(self.expr(a[2], scope), BitT(8), a[2].loc, "field list index")
                if f.const is None:
                    raise Diagnostic(a[2].loc, "field list index must be a constant")
                flist = int(f.const)
            elif name == "clone3":
                self.expr(a[2], scope)
            return do(ir.Clone(ct.const == 1, sess.ir, flist))
        if name in ("resubmit_preserving_field_list", "recirculate_preserving_field_list"):
            self.args_n(e, 1, name)
            want = "ingress" if name.startswith("resubmit") else "egress"
            if self.ctl_role != want:
                raise Diagnostic(e.loc, f"{name} is only allowed in the {want} control")
            f = self.coerce(self.expr(a[0], scope), BitT(8), a[0].loc, "field list index")
            if f.const is None:
                raise Diagnostic(a[0].loc, "field list index must be a constant")
            return do(ir.PreserveFieldList(want == "egress", int(f.const)))
        if name == "truncate":
            self.args_n(e, 1, name)
            n_ = self.coerce(self.expr(a[0], scope), BitT(32), a[0].loc, "length")
            return do(ir.Truncate(n_.ir))
        if name == "log_msg":
            if not a:
                raise Diagnostic(e.loc, "log_msg needs a message")
            for x in a:
                self.expr(x, scope)
            return do(ir.Nop())
        raise Diagnostic(e.loc, f"{name} is not supported")  # pragma: no cover

    def temp(self, v: V, base: str = "t") -> V:
        """Run ``v`` now (into a fresh local, in the prelude) and stand for that value."""
        assert self.prelude is not None
        ref = ir.Ref(v.ty, "local", self.fresh(f"l_{base}_"))
        self.prelude.append(ir.Assign(ref, v.ir))
        return V(ref)

    def spill_before(self, v: V, mark: int) -> V:
        """``v`` was evaluated before the prelude statements from ``mark`` on (a later
        operand's function calls): keep its value from before them, as P4 evaluates operands
        left to right."""
        if self.prelude is None or len(self.prelude) == mark or v.const is not None:
            return v
        if isinstance(v.ty, (IntLitT, OtherT, VoidT, StrT)):
            return v
        ref = ir.Ref(v.ty, "local", self.fresh("l_t_"))
        self.prelude.insert(mark, ir.Assign(ref, v.ir))
        return V(ref)

    def user_func_call(self, d: A.FunctionDecl, e: A.Call, scope: Scope, stmt: bool) -> V:
        """Inline a call of a function declared in the program (see :meth:`inline_call`)."""
        pr = d.proto
        ret_t = self.resolve_type(pr.ret, self.g) if pr.ret is not None else VOID
        if not isinstance(ret_t, (*_DECLARABLE, VoidT)):
            raise Diagnostic(pr.loc, f"function {pr.name} returns unsupported type {ret_t}")
        params: list[tuple[str, Ty, str]] = []
        for p in pr.params:
            t = self.resolve_type(p.type, self.g)
            if not isinstance(t, _DECLARABLE):
                raise Diagnostic(
                    p.type.loc, f"function parameter {p.name} has unsupported type {t}"
                )
            params.append((p.name, t, p.direction))
        e = A.Call(e.loc, e.func, e.type_args, self.with_defaults(pr.params, e.args))
        return self.inline_call(
            f"function {pr.name}", pr.name, params, d.body.stmts, self.g, e, scope, ret_t, stmt
        )

    def inline_call(  # noqa: PLR0917
        self,
        what: str,
        name: str,
        params: list[tuple[str, Ty, str]],
        body_stmts: list[A.Stmt],
        body_scope: Scope,
        e: A.Call,
        scope: Scope,
        ret_t: Ty,
        stmt: bool,
    ) -> V:
        """Inline a call of a function, or of an action with out/inout parameters: the
        arguments are copied in (``in``/``inout``/directionless) into fresh locals, left to
        right, the body runs with ``return`` setting the result and skipping the rest, and
        ``out``/``inout`` arguments are copied back, all in the prelude of the statement that
        contains the call."""
        if self.prelude is None or self.ctl_role == "parser":
            raise Diagnostic(
                e.loc,
                f"calls of {what} are only supported in the statements of controls and actions",
            )
        if any(f.name == name for f in self.fn_stack) or len(self.fn_stack) > 16:
            raise Diagnostic(e.loc, f"{what} calls itself")
        if len(e.args) != len(params):
            raise Diagnostic(e.loc, f"{what} takes {len(params)} argument(s), {len(e.args)} given")
        if not stmt and isinstance(ret_t, VoidT):
            raise Diagnostic(e.loc, f"{what} returns no value")
        inner = Scope(body_scope)
        outs: list[tuple[A.Expr, ir.Ref, tuple[A.Index, V, int] | None]] = []
        for (pn, t, direction), x in zip(params, e.args, strict=True):
            ref = ir.Ref(t, "local", self.fresh(f"l_{pn}_"))
            if isinstance(x, A.DontCare) and direction in ("out", "inout"):
                self.prelude.append(ir.Init(ref))  # `_`: a value nobody reads back
            elif direction in ("out", "inout"):
                # a run-time stack index in the argument is computed once, here
                rt = self.runtime_index_now(x, scope, x.loc)
                px, psc = self.pinned(x, scope, rt)
                if rt is None:
                    lv = self.lvalue(x, scope, read=direction == "inout")
                else:
                    lv = self.expr(px, psc)
                if direction == "inout":
                    v = self.coerce(lv, t, x.loc, f"argument {pn}")
                    self.prelude.extend(self.init_assigns(ref, v.ir))
                else:
                    self.prelude.append(ir.Init(ref))
                outs.append((x, ref, rt))
            else:
                v = self.coerce(self.expr(x, scope), t, x.loc, f"argument {pn}")
                self.prelude.extend(self.init_assigns(ref, v.ir))
            inner.add(pn, Sym("var", t, ir=ref))
        ret = None
        if not isinstance(ret_t, VoidT):
            ret = ir.Ref(ret_t, "local", self.fresh(f"l_{name}_ret_"))
            self.prelude.append(ir.Init(ret))
        flag = ir.Ref(BOOL, "local", self.fresh(f"l_{name}_done_"))
        self.prelude.append(ir.Assign(flag, ir.Const(BOOL, False)))
        copy_out = tuple(c for x, ref, rt in outs for c in self.assign(x, V(ref), scope, x.loc, rt))
        self.fn_stack.append(FnCtx(what, ret, flag, copy_out=copy_out))
        try:
            body = self.stmts(body_stmts, inner)
        finally:
            self.fn_stack.pop()
        self.prelude.extend(body)
        self.prelude.extend(copy_out)
        if ret is None:
            return do(ir.Nop())
        return V(ret)

    def direct_action_call(self, s: Sym, e: A.Call, scope: Scope) -> V:
        ac = self.action_ctx(s)
        e = A.Call(e.loc, e.func, e.type_args, self.with_defaults(ac.decl.params, e.args))
        if not self.action_depth and not self.dead:
            self.direct_actions.setdefault(ac.name, ac)
        if ac.inline_scope is not None:
            self.action_depth += 1
            try:
                return self.inline_call(
                    f"action {ac.name}",
                    ac.uid,
                    ac.params,
                    ac.decl.body.stmts,
                    ac.inline_scope,
                    e,
                    scope,
                    VOID,
                    True,
                )
            finally:
                self.action_depth -= 1
        if len(e.args) != len(ac.params):
            raise Diagnostic(
                e.loc, f"action {ac.name} takes {len(ac.params)} argument(s), {len(e.args)} given"
            )
        args = []
        for (pn, pt, _d), x in zip(ac.params, e.args, strict=True):
            args.append(self.coerce(self.expr(x, scope), pt, x.loc, f"argument {pn}").ir)
        self.used_action_uids.add(ac.uid)
        return do(ir.CallAction(ac.uid, tuple(args)))

    # ------------------------------------------------------------------ statements
    def stmts(self, ss: list[A.Stmt], scope: Scope) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        fn = self.fn_stack[-1] if self.fn_stack else None
        for i, s in enumerate(ss):
            before = fn.returns if fn is not None else 0
            try:
                out.extend(self.stmt(s, scope))
            except Diagnostic as d:
                self.add_diag(d)
            if fn is not None and fn.returns != before and i + 1 < len(ss):
                # in a function, a statement that may return skips the rest when it did
                rest = self.stmts(ss[i + 1 :], scope)
                if rest:
                    out.append(ir.If(ir.Unary(BOOL, "!", fn.flag), tuple(rest), None))
                break
        return out

    def stmt(self, s: A.Stmt, scope: Scope) -> list[ir.Stmt]:
        """The statements of ``s``, after those its function calls run first."""
        outer = self.prelude
        self.prelude = []
        try:
            out = self.stmt_body(s, scope)
            return [*self.prelude, *out] if self.prelude else out
        finally:
            self.prelude = outer

    def stmt_body(self, s: A.Stmt, scope: Scope) -> list[ir.Stmt]:
        if isinstance(s, A.Block):
            return self.stmts(s.stmts, Scope(scope)) or [ir.Nop()]
        if isinstance(s, A.Empty):
            return [ir.Nop()]
        if isinstance(s, A.Assign):
            if self.ctl_role == "deparser":
                raise Diagnostic(s.loc, "assignments are not allowed in the deparser")
            rt = self.runtime_index_now(s.lhs, scope, s.loc)  # the left side first
            if s.op:
                return self.compound_assign(s, scope, rt)
            rhs = self.expr(s.rhs, scope)
            return self.assign(s.lhs, rhs, scope, s.rhs.loc, rt)
        if isinstance(s, A.CallStmt):
            v = self.call(s.call, scope, stmt=True) if isinstance(s.call, A.Call) else None
            if v is None:
                raise Diagnostic(s.loc, "not a call")
            return [v.stmt if v.stmt is not None else ir.Eval(v.ir), *v.after]
        if isinstance(s, A.If):
            if self.ctl_role == "parser":
                raise Diagnostic(s.loc, "'if' is not allowed in parser states; use select")
            c = self.cond(s.cond, scope)
            with self.dead_if(c.const is False):
                then = tuple(self.stmt(s.then, Scope(scope)))
            with self.dead_if(c.const is True):
                other = None if s.other is None else tuple(self.stmt(s.other, Scope(scope)))
            return [ir.If(c.ir, then, other)]
        if isinstance(s, A.Switch):
            return self.switch_stmt(s, scope)
        if isinstance(s, A.Exit):
            if self.ctl_role in ("parser", "deparser"):
                raise Diagnostic(s.loc, f"'exit' is not allowed in the {self.ctl_role}")
            # exit in an inlined call: its arguments are copied back first (innermost first)
            return [*(c for f in reversed(self.fn_stack) for c in f.copy_out), ir.Exit()]
        if isinstance(s, A.Return):
            if self.fn_stack:
                fn = self.fn_stack[-1]
                out: list[ir.Stmt] = []
                if fn.ret is not None:
                    if s.value is None:
                        raise Diagnostic(s.loc, f"{fn.name} must return a value")
                    v = self.coerce(
                        self.expr(s.value, scope), fn.ret.ty, s.value.loc, "return value"
                    )
                    out.extend(self.assigns(fn.ret, v.ir))
                elif s.value is not None:
                    raise Diagnostic(s.loc, f"{fn.name} returns no value")
                fn.returns += 1
                return [*out, ir.Assign(fn.flag, ir.Const(BOOL, True))]
            if s.value is not None:
                raise Diagnostic(s.loc, "return with a value is not supported")
            if self.ctl_role in ("parser",):
                raise Diagnostic(s.loc, "'return' is not allowed in the parser")
            return [ir.Return(self.in_sub_apply)]
        if isinstance(s, A.VarDecl):
            return self.local_var(s, scope, frame=False)
        if isinstance(s, A.Instantiation):
            raise Diagnostic(s.loc, "instantiations are only allowed at control level")
        raise Diagnostic(s.loc, f"unsupported statement {type(s).__name__}")  # pragma: no cover

    def pinned(
        self, e: A.Expr, scope: Scope, rt: tuple[A.Index, V, int] | None
    ) -> tuple[A.Expr, Scope]:
        """L-value ``e`` as read with its run-time stack index ``rt`` already computed (the
        index replaced by a name for that value, in a scope of its own)."""
        if rt is None:
            return e, scope
        node, idx, _size = rt
        sc = Scope(scope)
        name = self.fresh("$idx")  # not a P4 name
        sc.add(name, Sym("var", idx.ty, ir=idx.ir, readonly="a computed index"))
        return _replace_index(e, node, A.Index(node.loc, node.expr, A.Name(node.loc, name))), sc

    def compound_assign(
        self, s: A.Assign, scope: Scope, rt: tuple[A.Index, V, int] | None
    ) -> list[ir.Stmt]:
        """``a op= b``: ``a = a op b`` with ``a`` evaluated once (a run-time stack index in it
        is the value already computed, ``rt``)."""
        lhs, sc = self.pinned(s.lhs, scope, rt)
        if rt is None:
            self.lvalue(lhs, sc, read=True)  # assignable (a clear message if not)
        rhs = self.expr(A.Binary(s.loc, s.op, lhs, s.rhs), sc)
        return self.assign(s.lhs, rhs, scope, s.rhs.loc, rt)

    def local_var(self, s: A.VarDecl, scope: Scope, frame: bool) -> list[ir.Stmt]:
        """Declare the variable; returns the statements that initialise it."""
        ty = self.resolve_type(s.type, scope)
        if isinstance(ty, (ExternT, IntLitT, VoidT, StrT)) and not (
            s.const and isinstance(ty, IntLitT)  # `const int x = 5;` names a constant
        ):
            raise Diagnostic(s.type.loc, f"cannot declare a variable of type {ty}")
        if scope.syms.get(s.name) is not None:
            raise Diagnostic(s.loc, f"{s.name} is already declared in this scope")
        if s.const:
            if s.init is None:
                raise Diagnostic(s.loc, "a constant needs a value")
            v = self.coerce(self.expr(s.init, scope), ty, s.init.loc)
            if v.const is None:
                raise Diagnostic(
                    s.init.loc, f"the value of constant {s.name} is not a compile-time constant"
                )
            scope.add(s.name, Sym("const", ty, ir=v.ir, value=v.const))
            return []
        init = None
        if s.init is not None:
            init = self.coerce(self.expr(s.init, scope), ty, s.init.loc, "initializer")
        ref = (
            ir.Ref(ty, "frame", s.name)
            if frame
            else ir.Ref(ty, "local", self.fresh(f"l_{s.name}_"))
        )
        if (frame or init is None) and not isinstance(ty, _DECLARABLE):
            raise Diagnostic(s.type.loc, f"cannot declare a variable of type {ty}")
        if frame:
            self.frame_vars.append(ir.FrameVar(s.name, ty))
        scope.add(s.name, Sym("var", ty, ir=ref))
        if init is not None:
            return self.init_assigns(ref, init.ir)
        return [] if frame else [ir.Init(ref)]

    def value_switch(self, s: A.Switch, v: V, scope: Scope) -> list[ir.Stmt]:
        """``switch (e) { 1: {...} 2: 3: {...} default: {...} }`` on a bit<W>, int<W>, enum or
        error value: ``e`` evaluated once, then an if/else chain over the labels (constants;
        labels without a body fall through to the next body)."""
        if not isinstance(v.ty, (BitT, EnumT, ErrorT)):
            raise Diagnostic(s.expr.loc, f"cannot switch on a value of type {v.ty}")
        key = v if v.const is not None else self.temp(v, "sw")
        groups: list[tuple[list[ir.Expr], list[ir.Stmt]]] = []
        pending: list[ir.Expr] = []
        seen: set[Any] = set()
        default: list[ir.Stmt] | None = None
        for c in s.cases:
            if default is not None:
                raise Diagnostic(c.loc, "default must be the last switch label")
            if c.label is None:
                if pending:
                    raise Diagnostic(c.loc, "fall-through into default is not supported")
                if c.body is None:
                    raise Diagnostic(c.loc, "default label needs a body")
                default = self.stmt(c.body, Scope(scope))
                continue
            le: A.Expr | None = c.value
            if le is None:
                parts = (c.label or "").lstrip(".").split(".")
                le = A.Name(c.loc, parts[0], top=(c.label or "").startswith("."))
                for p in parts[1:]:
                    le = A.Member(c.loc, le, p, c.loc)
            lv = self.coerce(self.expr(le, scope), v.ty, c.loc, "switch label")
            if lv.const is None:
                raise Diagnostic(c.loc, "a switch label must be a compile-time constant")
            if lv.const in seen:
                raise Diagnostic(c.loc, "duplicate switch label")
            seen.add(lv.const)
            pending.append(ir.Cmp(BOOL, "==", key.ir, lv.ir))
            if c.body is None:
                continue
            groups.append((pending, self.stmt(c.body, Scope(scope))))
            pending = []
        out: tuple[ir.Stmt, ...] | None = tuple(default) if default is not None else None
        for conds, body in reversed(groups):
            cond = conds[0]
            for x in conds[1:]:
                cond = ir.Logic(BOOL, "||", cond, x)
            out = (ir.If(cond, tuple(body) or (ir.Nop(),), out),)
        return list(out or (ir.Nop(),))

    def switch_stmt(self, s: A.Switch, scope: Scope) -> list[ir.Stmt]:
        if self.ctl_role == "parser":
            raise Diagnostic(s.loc, "'switch' is not allowed in parser states; use select")
        v = self.expr(s.expr, scope)
        if not (isinstance(v.ty, OtherT) and v.ty.what == "action_run"):
            return self.value_switch(s, v, scope)
        tc: TableCtx = v.const
        var = self.fresh("sw")
        arms: list[ir.SwitchArm] = []
        pending: list[str] = []
        seen: set[str] = set()
        has_default = False
        for c in s.cases:
            if c.label is None:
                has_default = True
                if pending:
                    raise Diagnostic(c.loc, "fall-through into default is not supported")
                if c.body is None:
                    raise Diagnostic(c.loc, "default label needs a body")
                arms.append(ir.SwitchArm((), tuple(self.stmt(c.body, Scope(scope)))))
                continue
            if has_default:
                raise Diagnostic(c.loc, "default must be the last switch label")
            if c.label is None or c.value is not None:
                raise Diagnostic(c.loc, "a switch on action_run takes action names as labels")
            fq = tc.local_names.get(c.label)
            if fq is None:
                raise Diagnostic(c.loc, f"{c.label} is not an action of table {tc.info.name}")
            if fq in seen:
                raise Diagnostic(c.loc, f"duplicate switch label {c.label}")
            seen.add(fq)
            pending.append(fq)
            if c.body is None:
                continue
            arms.append(ir.SwitchArm(tuple(pending), tuple(self.stmt(c.body, Scope(scope)))))
            pending = []
        if pending:
            arms.append(ir.SwitchArm(tuple(pending), (ir.Nop(),)))
        return [ir.Switch(var, v.ir, tuple(arms))]

    # ------------------------------------------------------------------ controls
    def action_ctx(self, s: Sym) -> ActionCtx:
        return s.data if isinstance(s.data, ActionCtx) else self.top_action_ctx(s.data[1])

    def top_action_ctx(self, d: A.ActionDecl) -> ActionCtx:
        if d.name in self.actions_by_name:
            return self.actions_by_name[d.name]
        return self.define_action(d, self.g, d.name, top=True)

    def fq_name(self, local: str, anns: list[A.Annotation], top: bool = False) -> str:
        a = A.ann_get(anns, "name")
        if a is not None and a.args and isinstance(a.args[0], str):
            n = a.args[0]
            if n.startswith("."):
                return n[1:]
            return n if top or not self.ctl_name else f"{self.ctl_name}.{n}"
        return local if top or not self.ctl_name else f"{self.ctl_name}.{local}"

    def define_action(self, d: A.ActionDecl, scope: Scope, fq: str, top: bool) -> ActionCtx:
        params: list[tuple[str, Ty, str]] = []
        inner = Scope(scope)
        pys: list[str] = []

        def plane(p: A.Param) -> bool:
            """A parameter the control plane could give (a bit<W>, bool or serializable enum)."""
            try:
                t = self.resolve_type(p.type, scope)
            except Diagnostic:
                return True  # reported below
            return isinstance(t, (BitT, BoolT)) or (isinstance(t, EnumT) and bool(t.underlying))

        if any(p.direction in ("out", "inout") or not plane(p) for p in d.params):
            # only a direct call can pass out/inout arguments or headers and structs: inlined
            # at each call
            for p in d.params:
                t = self.resolve_type(p.type, scope)
                if not isinstance(t, _DECLARABLE):
                    raise Diagnostic(
                        p.type.loc, f"action parameter {p.name} has unsupported type {t}"
                    )
                params.append((p.name, t, p.direction))
            ac = ActionCtx(self.fresh("a_"), fq, d, params, inline_scope=scope)
            self.actions_by_name.setdefault(fq, ac)
            return ac
        for p in d.params:
            t = self.resolve_type(p.type, scope)
            if not isinstance(t, (BitT, BoolT)) and not (isinstance(t, EnumT) and t.underlying):
                raise Diagnostic(p.type.loc, f"action parameter {p.name} has unsupported type {t}")
            py = self.fresh(f"p_{p.name}_")
            pys.append(py)
            params.append((p.name, t, p.direction))
            ro = "action parameters are read-only"
            inner.add(p.name, Sym("var", t, ir=ir.Ref(t, "param", py), readonly=ro))
        uid = self.fresh("a_")
        ac = ActionCtx(uid, fq, d, params)
        self.actions_by_name.setdefault(fq, ac)
        self.action_depth += 1
        try:
            body = tuple(self.stmts(d.body.stmts, inner))
        finally:
            self.action_depth -= 1
        self.defs.append(ir.ActionDef(uid, tuple(pys), body))
        return ac

    def compile_pipeline(self, blocks: dict[str, Any]) -> None:
        parser = blocks["parser"]
        ps = parser.params
        if len(ps) != 4:
            self.err(parser.loc, "the v1model parser takes 4 parameters")
            return
        try:
            ht = self.resolve_type(ps[1].type, self.g)
            mt = self.resolve_type(ps[2].type, self.g)
            st = self.resolve_type(ps[3].type, self.g)
        except Diagnostic as d:
            self.diags.append(d)
            return
        if not (isinstance(ht, StructT) and not ht.is_header):
            self.err(ps[1].loc, f"the parsed headers must be a struct, not {ht}")
            return
        if not (isinstance(mt, StructT) and not mt.is_header):
            self.err(ps[2].loc, f"the metadata must be a struct, not {mt}")
            return
        if not (isinstance(st, StructT) and st.name == "standard_metadata_t"):
            self.err(ps[3].loc, "the 4th parser parameter must be standard_metadata_t")
            return
        self.headers_t, self.meta_t, self.std_t = ht, mt, st
        roles = [
            ("parser", "parse"),
            ("verify", "verify"),
            ("ingress", "ingress"),
            ("egress", "egress"),
            ("compute", "compute"),
            ("deparser", "deparse"),
        ]
        for role, fn in roles:
            try:
                self.compile_block(role, fn, blocks[role])
            except Diagnostic as d:
                self.diags.append(d)
        self.controller_headers()
        self.finish_model()

    def bind_params(self, role: str, d: Any, scope: Scope) -> None:
        want = {
            "parser": ["packet_in", "H", "M", "S"],
            "verify": ["H", "M"],
            "ingress": ["H", "M", "S"],
            "egress": ["H", "M", "S"],
            "compute": ["H", "M"],
            "deparser": ["packet_out", "H"],
        }[role]
        if len(d.params) != len(want):
            raise Diagnostic(
                d.loc, f"{d.name} must take {len(want)} parameters for the {role} of V1Switch"
            )
        for p, w in zip(d.params, want, strict=True):
            t = self.resolve_type(p.type, scope)
            if w in ("packet_in", "packet_out"):
                if not (isinstance(t, ExternT) and t.name == w):
                    raise Diagnostic(p.loc, f"parameter {p.name} must be a {w}")
                scope.add(p.name, Sym("packet", data="in" if w == "packet_in" else "out"))
                continue
            exp = {"H": self.headers_t, "M": self.meta_t, "S": self.std_t}[w]
            if t is not exp:
                raise Diagnostic(p.type.loc, f"parameter {p.name} has type {t}, expected {exp}")
            ctx = {"H": "hdr", "M": "meta", "S": "std"}[w]
            ro = (
                ""
                if p.direction in ("inout", "out")
                else f"parameter {p.name} is '{p.direction or 'directionless'}'"
            )
            scope.add(p.name, Sym("var", t, ir=ir.Ref(t, "ctx", ctx), readonly=ro))

    def control_locals(self, decls: list[Any], scope: Scope) -> list[ir.Stmt]:
        """Declare a control's locals (actions, tables, instances, variables) in ``scope``; a
        bad one is reported and poisoned. Returns the statements that initialise the frame."""
        init: list[ir.Stmt] = []
        tables: list[TableCtx] = []
        for loc_d in decls:
            try:
                init.extend(self.control_local(loc_d, scope, tables))
            except Diagnostic as e:
                self.add_diag(e)
                name = getattr(loc_d, "name", None)
                if isinstance(name, str) and scope.syms.get(name) is None:
                    scope.add(name, Sym("poison"))
        return init

    def compile_block(self, role: str, fn: str, d: Any) -> None:
        self.ctl_name = (
            A.ann_get(d.annotations, "name") and str(A.ann_get(d.annotations, "name").args[0])  # type: ignore[union-attr]
        ) or d.name
        self.ctl_role = role
        self.frame_vars = []
        scope = Scope(self.g)
        self.bind_params(role, d, scope)
        init = tuple(self.control_locals(d.locals, scope))
        frame = tuple(self.frame_vars)
        self.frames[fn] = {v.name: scalar_default(v.ty) for v in frame}
        if role == "parser":
            self.compile_parser(d, scope, frame, init)
            return
        assert d.body is not None
        body = tuple(self.stmts(d.body.stmts, Scope(scope)))
        self.controls.append(ir.ControlDef(role, fn, frame, init, body))

    def define_subcontrol(self, decl: A.ControlDecl, inst: A.Instantiation, scope: Scope) -> None:
        if decl.proto:
            raise Diagnostic(inst.loc, f"control {decl.name} is only declared, not defined")
        if inst.args or decl.ctor_params:
            raise Diagnostic(inst.loc, "control constructor parameters are not supported")
        if scope.syms.get(inst.name):
            raise Diagnostic(inst.loc, f"{inst.name} is already declared")
        name = self.fq_name(inst.name, inst.annotations)
        uid = self.fresh("sub_")
        n_tables = len(self.tables)
        saved = (self.ctl_name, self.frame_vars, self.in_sub_apply)
        self.ctl_name, self.frame_vars, self.in_sub_apply = name, [], False
        try:
            sc = Scope(self.g)
            params: list[tuple[str, Ty, str]] = []
            for p in decl.params:
                t = self.resolve_type(p.type, sc)
                # a struct passed in is the caller's (by reference); anything else starts from
                # its type's default, so externs, literals, void and strings cannot be one
                by_ref = p.direction != "out" and isinstance(t, StructT)
                if not by_ref and not isinstance(t, _DECLARABLE):
                    raise Diagnostic(
                        p.loc, f"sub-control parameter {p.name} of type {t} is not supported"
                    )
                self.frame_vars.append(ir.FrameVar(p.name, t, by_ref))
                ro = (
                    ""
                    if p.direction in ("inout", "out")
                    else f"parameter {p.name} is '{p.direction or 'directionless'}'"
                )
                sc.add(p.name, Sym("var", t, ir=ir.Ref(t, "frame", p.name), readonly=ro))
                params.append((p.name, t, p.direction))
            init = self.control_locals(decl.locals, sc)
            self.in_sub_apply = True
            assert decl.body is not None
            body = self.stmts(decl.body.stmts, Scope(sc))
            outs = tuple(
                n for n, t, d in params if d in ("out", "inout") and not isinstance(t, StructT)
            )
            self.frames[uid] = {
                v.name: None if v.by_ref else scalar_default(v.ty) for v in self.frame_vars
            }
            self.by_ref[uid] = {v.name for v in self.frame_vars if v.by_ref}
            self.defs.append(
                ir.SubControlDef(
                    uid,
                    tuple(self.frame_vars),
                    tuple(n for n, _t, _d in params),
                    outs,
                    tuple(init),
                    tuple(body),
                )
            )
        finally:
            self.ctl_name, self.frame_vars, self.in_sub_apply = saved
        sub = SubCtx(uid, name, params, has_tables=len(self.tables) > n_tables)
        scope.add(inst.name, Sym("subctl", data=sub))

    def subparser_apply(self, d: A.ParserDecl, e: A.Call, scope: Scope) -> V:
        """``p.apply(pkt, args)`` of a parser instance inside the parser: a sub-parser of one
        state (``start``, ending in ``transition accept``) is inlined where it is applied, as
        p4c inlines it: arguments copied in (``out`` ones start at their type's default, a
        header invalid), ``out``/``inout`` ones copied back when it accepts, not when it
        stops with a parser error."""
        if d.proto or len(d.states) != 1 or d.states[0].name != "start":
            raise Diagnostic(
                e.loc, f"parser {d.name}: only a sub-parser of one state (start) is supported"
            )
        st = d.states[0]
        tr = st.transition
        if tr is None or tr.select is not None or tr.state != "accept" or d.locals:
            raise Diagnostic(
                e.loc,
                f"parser {d.name}: a sub-parser must go from start to accept, without locals",
            )
        if d.type_params:
            raise Diagnostic(e.loc, f"generic parser {d.name} is not supported")
        e = A.Call(e.loc, e.func, e.type_args, self.with_defaults(d.params, e.args))
        if len(e.args) != len(d.params):
            raise Diagnostic(
                e.loc, f"{d.name}.apply takes {len(d.params)} argument(s), {len(e.args)} given"
            )
        assert self.prelude is not None
        inner = Scope(self.g)
        copy_back: list[tuple[A.Expr, ir.Ref]] = []
        for p, x in zip(d.params, e.args, strict=True):
            t = self.resolve_type(p.type, self.g)
            if isinstance(t, ExternT) and t.name == "packet_in":
                xs = scope.lookup(x.name) if isinstance(x, A.Name) else None
                if xs is None or xs.kind != "packet" or xs.data != "in":
                    raise Diagnostic(x.loc, f"argument {p.name} must be the parser's packet_in")
                inner.add(p.name, xs)
                continue
            if not isinstance(t, _DECLARABLE):
                raise Diagnostic(p.loc, f"sub-parser parameter {p.name} of type {t}")
            ref = ir.Ref(t, "local", self.fresh(f"l_{p.name}_"))
            if p.direction == "out":
                self.lvalue(x, scope)
                self.prelude.append(ir.Init(ref))
            else:
                v = (
                    self.lvalue(x, scope, read=True)
                    if p.direction == "inout"
                    else self.expr(x, scope)
                )
                v = self.coerce(v, t, x.loc, f"argument {p.name}")
                self.prelude.extend(self.init_assigns(ref, v.ir))
            if p.direction in ("out", "inout"):
                copy_back.append((x, ref))
            inner.add(p.name, Sym("var", t, ir=ref))
        self.prelude.extend(self.stmts(st.stmts, inner))
        for x, ref in copy_back:
            self.prelude.extend(self.assign(x, V(ref), scope, x.loc))
        return do(ir.Nop())

    def subctl_apply(self, sub: SubCtx, e: A.Call, scope: Scope) -> V:
        if sub.applied and sub.has_tables:
            # its tables would be applied twice, which bmv2 does not allow
            raise Diagnostic(
                e.loc, f"control instance {sub.name} (with tables) is applied more than once"
            )
        sub.applied = True
        if len(e.args) != len(sub.params):
            raise Diagnostic(
                e.loc, f"{sub.name}.apply takes {len(sub.params)} argument(s), {len(e.args)} given"
            )
        if self.ctl_role in _AFTER_INGRESS:
            self.egress_hdrs = None  # references escape into the sub-control: copy all
        args: list[ir.Expr] = []
        copy_out: list[ir.Expr] = []
        for (pn, pt, d), x in zip(sub.params, e.args, strict=True):
            if d in ("out", "inout"):
                lv = self.lvalue(x, scope, read=True)  # passed in as the frame's value
                if lv.ty != pt and lv.ty is not pt:
                    raise Diagnostic(
                        x.loc, f"argument for {d} parameter {pn} has type {lv.ty}, expected {pt}"
                    )
                args.append(lv.ir)
                if not isinstance(pt, StructT):
                    copy_out.append(lv.ir)
            else:
                args.append(self.coerce(self.expr(x, scope), pt, x.loc, f"argument {pn}").ir)
        return do(ir.ApplySub(sub.uid, self.fresh("_r"), tuple(args), tuple(copy_out)))

    def control_local(self, d: Any, scope: Scope, tables: list[TableCtx]) -> list[ir.Stmt]:
        if isinstance(d, A.ActionDecl):
            if self.ctl_role in ("parser", "deparser", "verify", "compute"):
                raise Diagnostic(d.loc, f"actions are not supported in the {self.ctl_role}")
            if scope.syms.get(d.name):
                raise Diagnostic(d.loc, f"{d.name} is already declared")
            ac = self.define_action(d, scope, self.fq_name(d.name, d.annotations), top=False)
            scope.add(d.name, Sym("action", data=ac))
        elif isinstance(d, A.TableDecl):
            if self.ctl_role not in ("ingress", "egress"):
                raise Diagnostic(d.loc, f"tables are not allowed in the {self.ctl_role}")
            tc = self.table(d, scope)
            tables.append(tc)
            scope.add(d.name, Sym("table", data=tc))
        elif isinstance(d, A.Instantiation):
            self.instantiate(d, scope)
        elif isinstance(d, A.VarDecl):
            # its initialiser runs at each apply, calls first (as in a statement)
            outer = self.prelude
            self.prelude = []
            try:
                out = self.local_var(d, scope, frame=True)
                return [*self.prelude, *out]
            finally:
                self.prelude = outer
        else:
            raise Diagnostic(d.loc, f"unsupported declaration in {self.ctl_name}")
        return []

    def instantiate(self, d: A.Instantiation, scope: Scope) -> None:
        ts = scope.lookup(d.type.name) if d.type.kind == "name" else None
        if (
            ts is not None
            and ts.kind == "control"
            and self.ctl_role in ("ingress", "egress", "verify", "compute")
        ):
            self.define_subcontrol(ts.data, d, scope)
            return
        if ts is not None and ts.kind == "parser" and self.ctl_role == "parser":
            if scope.syms.get(d.name):
                raise Diagnostic(d.loc, f"{d.name} is already declared")
            if d.args or ts.data.ctor_params:
                raise Diagnostic(d.loc, "parser constructor parameters are not supported")
            scope.add(d.name, Sym("subparser", data=ts.data))
            return
        if ts is not None and ts.kind in ("control", "parser"):
            raise Diagnostic(
                d.loc,
                f"instantiating {ts.kind} {d.type.name} inside "
                f"{self.ctl_name} is not supported (no sub-{ts.kind}s on "
                "this target)",
            )
        t = self.resolve_type(d.type, scope)
        if not isinstance(t, ExternT):
            raise Diagnostic(
                d.loc,
                f"cannot instantiate {t}"
                + ("; sub-parsers/sub-controls are not supported" if isinstance(t, OtherT) else ""),
            )
        if t.name not in ("counter", "direct_counter", "register"):
            raise Diagnostic(d.type.loc, f"extern {t.name} is not supported by this target")
        fq = self.fq_name(d.name, d.annotations)
        fixed = self.fixed_id(d.annotations)
        uid = self.fresh("X")
        consts = []
        for x in d.args:
            consts.append(self.expr(x, scope))
        if t.name == "counter":
            if (
                len(consts) != 2
                or consts[0].const is None
                or not isinstance(consts[1].ty, EnumT)
                or consts[1].ty.name != "CounterType"
            ):
                raise Diagnostic(d.loc, "counter(size, CounterType.x) expected")
            unit = ["PACKETS", "BYTES", "BOTH"][int(consts[1].const)]
            info = CounterInfo(fq, int(consts[0].const), unit, fixed_id=fixed)
            self.model.counters.append(info)
            self.ext_binds.append((uid, "counter", info))
            scope.add(d.name, Sym("extern_inst", data=("counter", info, uid)))
        elif t.name == "direct_counter":
            if (
                len(consts) != 1
                or not isinstance(consts[0].ty, EnumT)
                or consts[0].ty.name != "CounterType"
            ):
                raise Diagnostic(d.loc, "direct_counter(CounterType.x) expected")
            unit = ["PACKETS", "BYTES", "BOTH"][int(consts[0].const)]
            info = CounterInfo(fq, 0, unit, fixed_id=fixed)
            self.direct_counters[fq] = info
            scope.add(d.name, Sym("extern_inst", data=("direct_counter", info, uid)))
        else:
            if len(t.args) != 1 or not isinstance(t.args[0], BitT):
                raise Diagnostic(d.type.loc, "register<bit<W>> or register<int<W>> expected")
            if len(consts) != 1 or consts[0].const is None:
                raise Diagnostic(d.loc, "register(size) with a constant size expected")
            rinfo = RegisterInfo(fq, int(consts[0].const), t.args[0].width, fixed_id=fixed)
            self.model.registers.append(rinfo)
            self.ext_binds.append((uid, "register", rinfo))
            scope.add(d.name, Sym("extern_inst", t.args[0], data=("register", rinfo, uid)))

    @staticmethod
    def fixed_id(anns: list[A.Annotation]) -> int | None:
        a = A.ann_get(anns, "id")
        if a is not None and a.args and isinstance(a.args[0], int):
            return a.args[0]
        return None

    # ------------------------------------------------------------------ tables
    def table(self, d: A.TableDecl, scope: Scope) -> TableCtx:
        fq = self.fq_name(d.name, d.annotations)
        props = {p.name: p for p in d.properties}
        for p in d.properties:
            if p.name not in (
                "key",
                "actions",
                "default_action",
                "size",
                "entries",
                "counters",
                "support_timeout",
            ):
                raise Diagnostic(p.loc, f"table property {p.name} is not supported")
        mk = self.g.lookup("$match_kind")
        kinds_ok = {"exact", "lpm", "ternary", "range", "optional"}
        keys: list[KeyInfo] = []
        key_ir: list[ir.DataItem] = []
        key_tys: list[Ty] = []
        if "key" in props:
            for i, k in enumerate(props["key"].keys or []):
                if mk is None or k.match_kind not in mk.data:
                    raise Diagnostic(k.loc, f"unknown match kind {k.match_kind}")
                if k.match_kind not in kinds_ok:
                    raise Diagnostic(k.loc, f"match kind {k.match_kind} is not supported")
                v = self.expr(k.expr, scope)
                w = bit_width(v.ty)
                if isinstance(v.ty, ErrorT) and k.match_kind == "exact":
                    w = 32  # an error matched by its code (bmv2 keeps it in 32 bits)
                if w is None:
                    raise Diagnostic(k.expr.loc, f"key of type {v.ty} cannot be matched")
                kn = A.ann_get(k.annotations, "name")
                name = str(kn.args[0]) if kn and kn.args else expr_text(k.expr)
                keys.append(KeyInfo(i + 1, name, w, k.match_kind))
                key_ir.append(ir.DataItem(v.ir, w, None))
                key_tys.append(v.ty)
                if isinstance(v.ty, EnumT) and v.ty.underlying is not None:
                    # p4c describes a serializable enum key's type in the P4Info's type_info
                    self.model.ser_enums[v.ty.name] = (
                        v.ty.underlying.width,
                        list(v.ty.members.items()),
                    )
        if sum(1 for k in keys if k.match_kind == "lpm") > 1:
            raise Diagnostic(d.loc, f"table {d.name} has more than one lpm key (bmv2 allows one)")
        if "actions" not in props:
            raise Diagnostic(d.loc, f"table {d.name} has no actions property")
        acts: dict[str, ActionCtx] = {}
        local_names: dict[str, str] = {}
        scopes: dict[str, str] = {}
        bound: dict[str, int] = {}  # actions with arguments bound in the list: how many
        ref_anns: dict[str, list[str]] = {}
        for ar in props["actions"].actions or []:
            s = (self.g if ar.name.startswith(".") else scope).lookup(ar.name.lstrip("."))
            if s is None or s.kind != "action":
                raise Diagnostic(ar.loc, f"{ar.name} is not an action")
            ac = self.action_ctx(s)
            if ar.args:
                ac = self.bound_action(ac, ar, scope)
                bound[ac.name] = len(ar.args)
            if any(dd for _n, _t, dd in ac.params):
                raise Diagnostic(
                    ar.loc,
                    f"action {ac.name} has directional parameters and cannot be used in a table",
                )
            if ac.inline_scope is not None:
                raise Diagnostic(
                    ar.loc,
                    f"action {ac.name} has parameters the control plane cannot give "
                    "(headers or structs) and cannot be used in a table",
                )
            if ac.name in acts:
                raise Diagnostic(ar.loc, f"action {ar.name} listed twice")
            acts[ac.name] = ac
            local_names[ar.name.lstrip(".")] = ac.name
            local_names.setdefault(ac.name, ac.name)
            if A.ann_get(ar.annotations, "defaultonly"):
                scopes[ac.name] = "DEFAULT_ONLY"
            elif A.ann_get(ar.annotations, "tableonly"):
                scopes[ac.name] = "TABLE_ONLY"
            other = [
                ann_text(a)
                for a in ar.annotations
                if a.name not in ("defaultonly", "tableonly", *_P4INFO_OWN_ANNS)
            ]
            if other:
                ref_anns[ac.name] = other
        const_default = False
        if "default_action" in props:
            p = props["default_action"]
            const_default = p.const
            de = p.value
            assert de is not None
            dcall = de if isinstance(de, A.Call) else A.Call(de.loc, de, [], [])
            if not isinstance(dcall.func, A.Name):
                raise Diagnostic(de.loc, "default_action must be an action call")
            s = scope.lookup(dcall.func.name)
            if s is None or s.kind != "action":
                raise Diagnostic(de.loc, f"{dcall.func.name} is not an action")
            dac = self.action_ctx(s)
            if dac.name not in acts:
                raise Diagnostic(
                    de.loc,
                    f"default action {dcall.func.name} is not in the actions of table {d.name}",
                )
            if scopes.get(dac.name) == "TABLE_ONLY":
                raise Diagnostic(de.loc, f"action {dcall.func.name} is @tableonly")
            dac = acts[dac.name]
            # the bound arguments are written again; only the others are the default's data
            dargs = self.const_args(dac, dcall.args[bound.get(dac.name, 0) :], de.loc, scope)
        else:
            nas = self.g.lookup("NoAction")
            if nas is None:
                raise Diagnostic(d.loc, "NoAction is not declared (include <core.p4>)")
            dac = self.action_ctx(nas)
            if dac.name not in acts:
                acts[dac.name] = dac
                scopes[dac.name] = "DEFAULT_ONLY"
            dargs = ()
        size = 1024
        if "size" in props:
            sv = self.expr(props["size"].value, scope)  # type: ignore[arg-type]
            if sv.const is None or int(sv.const) <= 0:
                raise Diagnostic(props["size"].loc, "size must be a positive constant")
            size = int(sv.const)
        dc_name: str | None = None
        if "counters" in props:
            cv = props["counters"].value
            s = scope.lookup(cv.name) if isinstance(cv, A.Name) else None
            if s is None or s.kind != "extern_inst" or s.data[0] != "direct_counter":
                raise Diagnostic(props["counters"].loc, "counters must name a direct_counter")
            dci: CounterInfo = s.data[1]
            if dci.direct_table:
                raise Diagnostic(
                    props["counters"].loc,
                    f"direct counter {dci.name} is already used by table {dci.direct_table}",
                )
            dci.direct_table = fq
            dc_name = dci.name
        entries: list[ConstEntry] = []
        is_const = False
        if "entries" in props:
            p = props["entries"]
            is_const = p.const
            if not p.const:
                raise Diagnostic(p.loc, "only 'const entries' are supported")
            ents = p.entries or []
            for ent, prio in zip(ents, self.entry_priorities(ents), strict=True):
                entries.append(self.const_entry(ent, keys, acts, local_names, scope, prio, key_tys))
        uid = self.fresh("t_")
        info = TableInfo(
            fq,
            keys,
            list(acts),
            scopes,
            dac.name,
            dargs,
            const_default,
            size,
            is_const,
            entries,
            dc_name,
            fixed_id=self.fixed_id(d.annotations),
        )
        info.ref_annotations = ref_anns
        tc = TableCtx(uid, info, acts, local_names=local_names)
        self.tables.append(tc)
        self.model.tables.append(info)
        self.note_std_read("packet_length")  # bytes counted by a direct counter
        self.defs.append(ir.TableDef(uid, tuple(key_ir)))
        return tc

    def entry_priorities(self, ents: list[A.TableEntryDecl]) -> list[int]:
        """The priority of each const entry as the target orders them (the highest wins):
        earlier entries first; with p4c's ``@priority(n)`` annotation, as bmv2 orders them,
        the smallest n first, an entry without one counting as its position (1, 2, ...)."""
        bmv2: list[int] = []
        annotated = False
        for i, ent in enumerate(ents):
            a = A.ann_get(ent.annotations, "priority")
            if a is None:
                bmv2.append(i + 1)
                continue
            if len(a.args) != 1 or not isinstance(a.args[0], int) or a.args[0] < 0:
                raise Diagnostic(a.loc, "@priority needs one non-negative integer")
            if ent.priority is not None:
                raise Diagnostic(a.loc, "an entry has both 'priority =' and @priority")
            bmv2.append(a.args[0])
            annotated = True
        if not annotated:
            return [len(ents) - i for i in range(len(ents))]
        top = max(bmv2) + 1
        return [top - b for b in bmv2]

    def bound_action(self, ac: ActionCtx, ar: A.ActionRef, scope: Scope) -> ActionCtx:
        """``a(x, y)`` in a table's actions list: the action's directional parameters bound to
        ``x, y`` (evaluated when the action runs) and its directionless ones left to the
        control plane; for this table, a function of the directionless parameters that calls
        ``a`` (inlined when it has out/inout parameters, copy-in/copy-out as a direct call)."""
        k = len(ar.args)
        dirs = [d for _n, _t, d in ac.params]
        if k > len(dirs) or "" in dirs[:k] or any(dirs[k:]):
            n = sum(1 for d in dirs if d)
            raise Diagnostic(
                ar.loc,
                f"the actions list must bind exactly the directional parameters of action "
                f"{ac.name} ({n}), not {k}",
            )
        inner = Scope(scope)
        pys: list[str] = []
        names: list[A.Expr] = []
        for pn, t, _d in ac.params[k:]:
            if not isinstance(t, (BitT, BoolT)) and not (isinstance(t, EnumT) and t.underlying):
                raise Diagnostic(ar.loc, f"action parameter {pn} has unsupported type {t}")
            py = self.fresh(f"p_{pn}_")
            pys.append(py)
            arg = self.fresh("$arg")  # not a P4 name
            ro = "action parameters are read-only"
            inner.add(arg, Sym("var", t, ir=ir.Ref(t, "param", py), readonly=ro))
            names.append(A.Name(ar.loc, arg))
        call = A.Call(ar.loc, A.Name(ar.loc, ac.decl.name), [], [*ar.args, *names])
        outer = self.prelude
        self.prelude = []
        self.action_depth += 1  # a table's action, not a direct call
        try:
            v = self.direct_action_call(Sym("action", data=ac), call, inner)
            body = [*self.prelude, v.stmt if v.stmt is not None else ir.Nop(), *v.after]
        finally:
            self.prelude = outer
            self.action_depth -= 1
        uid = self.fresh("a_")
        self.defs.append(ir.ActionDef(uid, tuple(pys), tuple(body)))
        return ActionCtx(uid, ac.name, ac.decl, list(ac.params[k:]))

    @staticmethod
    def with_defaults(params: list[A.Param], args: list[A.Expr]) -> list[A.Expr]:
        """``args`` for ``params`` with the trailing omitted ones given their default values
        (``bit<8> x = 0``), as far as the parameters have them."""
        out = list(args)
        for p in params[len(args) :]:
            if p.default is None:
                break
            out.append(p.default)
        return out

    def const_args(
        self, ac: ActionCtx, args: list[A.Expr], loc: Loc, scope: Scope
    ) -> tuple[int, ...]:
        args = self.with_defaults(ac.decl.params[len(ac.decl.params) - len(ac.params) :], args)
        if len(args) != len(ac.params):
            raise Diagnostic(
                loc, f"action {ac.name} takes {len(ac.params)} argument(s), {len(args)} given"
            )
        out = []
        for (pn, pt, _d), x in zip(ac.params, args, strict=True):
            v = self.coerce(self.expr(x, scope), pt, x.loc, f"argument {pn}")
            if v.const is None:
                raise Diagnostic(x.loc, "action arguments here must be compile-time constants")
            c = int(v.const)
            if isinstance(pt, BitT) and pt.signed:
                c &= (1 << pt.width) - 1
            out.append(c)
        return tuple(out)

    def const_entry(  # noqa: PLR0917
        self,
        ent: A.TableEntryDecl,
        keys: list[KeyInfo],
        acts: dict[str, ActionCtx],
        local_names: dict[str, str],
        scope: Scope,
        prio: int,
        key_tys: list[Ty],
    ) -> ConstEntry:
        if len(ent.keys) != len(keys):
            raise Diagnostic(
                ent.loc, f"entry has {len(ent.keys)} key values, table has {len(keys)} keys"
            )
        matches: dict[int, tuple[str, int, int]] = {}
        for k, ks, kt in zip(keys, ent.keys, key_tys, strict=True):
            full = (1 << k.bitwidth) - 1
            t = BitT(k.bitwidth)

            def cv(x: A.Expr, t: BitT = t, kt: Ty = kt) -> int:
                v = self.expr(x, scope)
                if isinstance(kt, ErrorT) and isinstance(v.ty, ErrorT):
                    v = konst(t, v.const)  # an error key: the error's code
                elif isinstance(v.ty, BoolT) and t.width == 1:
                    v = konst(t, None if v.const is None else int(v.const))
                elif isinstance(v.ty, EnumT) and v.ty.underlying:
                    v = V(ir.Cast(v.ty.underlying, v.ir), v.const)
                v = self.coerce(v, t, x.loc, "key value")
                if v.const is None:
                    raise Diagnostic(x.loc, "entry key values must be compile-time constants")
                return int(v.const)

            if isinstance(ks, A.Default):
                if k.match_kind == "exact":
                    raise Diagnostic(ks.loc, f"exact key {k.name} cannot be a wildcard")
                continue
            if isinstance(ks, A.Mask):
                v, m = cv(ks.value), cv(ks.mask)
                if k.match_kind == "lpm":
                    plen = bin(m).count("1")
                    if m != (full ^ ((1 << (k.bitwidth - plen)) - 1)):
                        raise Diagnostic(ks.loc, "lpm mask must be a prefix mask")
                    matches[k.id] = ("lpm", v & m, plen)
                elif k.match_kind == "ternary":
                    matches[k.id] = ("ternary", v & m, m)
                else:
                    raise Diagnostic(ks.loc, f"a mask cannot be used with a {k.match_kind} key")
            elif isinstance(ks, A.RangeKS):
                if k.match_kind != "range":
                    raise Diagnostic(ks.loc, f"a range cannot be used with a {k.match_kind} key")
                matches[k.id] = ("range", cv(ks.lo), cv(ks.hi))
            else:
                v = cv(ks)
                if k.match_kind == "exact":
                    matches[k.id] = ("exact", v, 0)
                elif k.match_kind == "lpm":
                    matches[k.id] = ("lpm", v, k.bitwidth)
                elif k.match_kind == "ternary":
                    matches[k.id] = ("ternary", v, full)
                elif k.match_kind == "range":
                    matches[k.id] = ("range", v, v)
                else:
                    matches[k.id] = ("optional", v, 0)
        an = ent.action.name.lstrip(".")
        fq = local_names.get(an)
        if fq is None:
            raise Diagnostic(ent.action.loc, f"{an} is not an action of this table")
        ac = acts[fq]
        args = self.const_args(ac, ent.action.args, ent.action.loc, scope)
        needs_prio = any(k.match_kind in ("ternary", "range", "optional") for k in keys)
        if ent.priority is not None:
            pv = self.expr(ent.priority, scope)
            if pv.const is None:
                raise Diagnostic(ent.priority.loc, "priority must be a constant")
            prio = int(pv.const)
        return ConstEntry(matches, fq, args, prio if needs_prio else 0)

    # ------------------------------------------------------------------ parser
    def compile_parser(
        self,
        d: A.ParserDecl,
        scope: Scope,
        frame: tuple[ir.FrameVar, ...],
        init: tuple[ir.Stmt, ...],
    ) -> None:
        states = {s.name: s for s in d.states}
        if "start" not in states:
            raise Diagnostic(d.loc, f"parser {d.name} has no start state")
        for s in d.states:
            if s.name in ("accept", "reject"):
                raise Diagnostic(s.loc, f"state {s.name} cannot be defined")

        def check_target(name: str, loc: Loc) -> None:
            if name == "reject":
                raise Diagnostic(
                    loc, "explicit 'reject' is not supported on bmv2; use verify(cond, error.X)"
                )
            if name != "accept" and name not in states:
                raise Diagnostic(loc, f"unknown parser state {name}")

        compiled: dict[str, ir.ParserState] = {}
        for st in d.states:
            try:
                sc = Scope(scope)
                body = tuple(self.stmts(st.stmts, sc))
                tr = st.transition
                if tr is None:
                    raise Diagnostic(st.loc, f"state {st.name} has no transition")
                if tr.select is None:
                    check_target(tr.state or "", tr.loc)
                    trans = ir.Transition((), (), tr.state or "", -1)
                else:
                    trans = self.select(tr, sc, check_target)
                compiled[st.name] = ir.ParserState(body, trans)
            except Diagnostic as e:
                self.diags.append(e)
        if len(compiled) != len(states):
            return  # diagnostics reported; no code
        self.parser = ir.ParserDef(
            frame,
            init,
            {n: compiled[n] for n in states},
            self.errors.get("ParserTimeout", 5),
        )

    def select(self, tr: A.Transition, scope: Scope, check_target: Any) -> ir.Transition:
        """A select transition: its keys, its cases up to the first default, that default."""
        assert tr.select is not None and tr.cases is not None
        kv = [self.expr(x, scope) for x in tr.select]
        for i, v in enumerate(kv):
            if isinstance(v.ty, (IntLitT, StructT, ListT, OtherT)):
                raise Diagnostic(tr.select[i].loc, f"cannot select on a value of type {v.ty}")
        keys = tuple(v.ir for v in kv)
        cases: list[ir.SelectCase] = []
        for c in tr.cases:
            check_target(c.state, c.loc)
            ks = c.keyset
            items = ks.items if isinstance(ks, A.ListExpr) else [ks]
            if len(items) == 1 and isinstance(items[0], A.Default):
                return ir.Transition(keys, tuple(cases), c.state, self.errors["NoMatch"])
            if len(items) != len(kv):
                raise Diagnostic(c.loc, f"keyset has {len(items)} elements, select has {len(kv)}")
            matches = tuple(
                self.keyset_match(it, k, scope) for it, k in zip(items, kv, strict=True)
            )
            cases.append(ir.SelectCase(matches, c.state))
        return ir.Transition(keys, tuple(cases), None, self.errors["NoMatch"])

    def keyset_match(self, it: A.Expr, k: V, scope: Scope) -> ir.KeysetMatch | None:
        def const(x: A.Expr) -> int:
            v = self.expr(x, scope)
            if isinstance(k.ty, (BoolT, ErrorT, EnumT)):
                if v.ty != k.ty and v.ty is not k.ty:
                    raise Diagnostic(x.loc, f"keyset value has type {v.ty}, select key {k.ty}")
            else:
                v = self.coerce(v, k.ty, x.loc, "keyset value")
            if v.const is None:
                raise Diagnostic(x.loc, "keyset values must be compile-time constants")
            return int(v.const)

        if isinstance(it, A.Default):
            return None
        if isinstance(it, A.Mask):
            if not isinstance(k.ty, BitT):
                raise Diagnostic(it.loc, f"a mask needs a bit<W> key, not {k.ty}")
            return ir.KeysetMatch("mask", const(it.value), const(it.mask))
        if isinstance(it, A.RangeKS):
            return ir.KeysetMatch("range", const(it.lo), const(it.hi))
        return ir.KeysetMatch("value", const(it))

    # ------------------------------------------------------------------ types
    def field_lists(self) -> dict[int, list[str]]:
        """The metadata fields of each ``@field_list`` index."""
        assert self.meta_t is not None
        lists: dict[int, list[str]] = {}
        for n, _ft in self.meta_t.fields:
            a = A.ann_get(self.meta_t.field_anns.get(n, []), "field_list")
            for idx in a.args if a is not None else []:
                if isinstance(idx, int):
                    lists.setdefault(idx, []).append(n)
        return lists

    def controller_headers(self) -> None:
        for t in self.structs:
            a = A.ann_get(t.annotations, "controller_header")
            if a is None or not t.is_header:
                continue
            if not a.args or a.args[0] not in ("packet_in", "packet_out"):
                self.err(a.loc, '@controller_header needs "packet_in" or "packet_out"')
                continue
            flds = [(i + 1, n, bit_width(ft) or 0) for i, (n, ft) in enumerate(t.fields)]
            self.model.controller_headers.append(ControllerHeaderInfo(str(a.args[0]), flds))

    def finish_model(self) -> None:
        if self.diags:
            return
        table_acts: dict[str, ActionCtx] = {}
        # a table applied only where a constant condition leaves it out: p4c's front end
        # removes it (and what only it used) before the P4Info is written
        live_acts: set[str] = set()
        for tc in self.tables:
            tc.info.in_p4info = tc.live or not tc.applied
            if tc.info.in_p4info:
                live_acts.update(tc.info.action_names)
            for n in tc.info.action_names:
                table_acts.setdefault(n, tc.action_syms[n])
        for name, ac in self.direct_actions.items():
            if name not in table_acts:
                # p4c's hidden table for the call: every argument is given at the call, the
                # parameters become locals, the action has none
                table_acts[name] = ActionCtx(ac.uid, ac.name, ac.decl, [])
        for name, ac in table_acts.items():
            # (an action bound in an actions list: its directionless parameters)
            ps = [ParamInfo(i + 1, n, bit_width(t) or 0) for i, (n, t, _d) in enumerate(ac.params)]
            # p4c lists an action's annotations but those the P4Info says otherwise
            anns = [ann_text(a) for a in ac.decl.annotations if a.name not in _P4INFO_OWN_ANNS]
            ac.info = ActionInfo(name, ps, anns, fixed_id=self.fixed_id(ac.decl.annotations))
            ac.info.in_p4info = name in live_acts or name in self.direct_actions
            self.model.actions.append(ac.info)
        for dc in self.direct_counters.values():
            if dc.direct_table is None:
                continue  # unused direct counter: p4c omits it too
            self.model.direct_counters.append(dc)
        self.model.digests.extend(self.digests.values())
        self.model.errors = list(self.errors)

    # ------------------------------------------------------------------ output
    def program(self) -> ir.Program:
        """The checked program as IR (call after a run without diagnostics)."""
        assert self.headers_t and self.meta_t and self.std_t and self.parser
        return ir.Program(
            structs=list(self.structs),
            headers=self.headers_t,
            meta=self.meta_t,
            std=self.std_t,
            parser=self.parser,
            controls=list(self.controls),
            defs=list(self.defs),
            actions={n: ac.uid for n, ac in self.actions_by_name.items()},
            tables=[
                ir.TableRef(
                    tc.uid,
                    tc.info.name,
                    tuple(tc.info.action_names),
                    tuple(tc.action_syms[n].uid for n in tc.info.action_names),
                )
                for tc in self.tables
            ],
            externs=list(self.ext_binds),
            digests=list(self.model.digests),
            field_lists=self.field_lists(),
            egress_headers=None if self.egress_hdrs is None else set(self.egress_hdrs),
            errors=dict(self.errors),
        )


def is_ctx(e: ir.Expr, name: str) -> bool:
    """Whether ``e`` is the packet context's ``hdr``, ``meta`` or ``std``."""
    return isinstance(e, ir.Ref) and e.kind == "ctx" and e.name == name


_P4INFO_OWN_ANNS = {"name", "id", "brief", "description"}  # in the P4Info's own fields


def ann_text(a: A.Annotation) -> str:
    """An annotation as p4c writes it in the P4Info (``@noWarn("unused")``)."""
    return f"@{a.name}" if a.body is None else f"@{a.name}({a.body})"


def expr_text(e: A.Expr) -> str:
    """Source-like text of a key expression (P4Info match-field names; ``h.isValid()`` is
    ``h.$valid$`` as p4c names it)."""
    if (
        isinstance(e, A.Call)
        and isinstance(e.func, A.Member)
        and e.func.name == "isValid"
        and not e.args
    ):
        return f"{expr_text(e.func.expr)}.$valid$"
    if isinstance(e, A.Name):
        return ("." if e.top else "") + e.name
    if isinstance(e, A.Member):
        return f"{expr_text(e.expr)}.{e.name}"
    if isinstance(e, A.Call):
        return f"{expr_text(e.func)}({', '.join(expr_text(a) for a in e.args)})"
    if isinstance(e, A.Slice):
        return f"{expr_text(e.expr)}[{expr_text(e.hi)}:{expr_text(e.lo)}]"
    if isinstance(e, A.IntLit):
        return e.text or str(e.value)
    if isinstance(e, A.Index):
        return f"{expr_text(e.expr)}[{expr_text(e.index)}]"
    if isinstance(e, A.Cast):
        return f"({e.type.kind}) {expr_text(e.expr)}"
    if isinstance(e, A.Binary):
        return f"{expr_text(e.left)} {e.op} {expr_text(e.right)}"
    return "<expr>"


def _replace_index(e: A.Expr, node: A.Index, new: A.Index) -> A.Expr:
    """``e`` (a chain of members, slices and indexes) with ``node`` replaced by ``new``."""
    if e is node:
        return new
    if isinstance(e, A.Member):
        return A.Member(e.loc, _replace_index(e.expr, node, new), e.name, e.name_loc)
    if isinstance(e, A.Slice):
        return A.Slice(e.loc, _replace_index(e.expr, node, new), e.hi, e.lo)
    if isinstance(e, A.Index):
        return A.Index(e.loc, _replace_index(e.expr, node, new), e.index)
    return e
