"""AST of the supported P4_16 subset. Every node carries the ``Loc`` of its first token."""

from __future__ import annotations

from dataclasses import dataclass, field

from .diagnostics import Loc


@dataclass
class Annotation:
    name: str
    args: list[str | int]
    loc: Loc
    body: str | None = None  # the tokens between the parentheses as written (None: none)


def ann_get(anns: list[Annotation], name: str) -> Annotation | None:
    for a in anns:
        if a.name == name:
            return a
    return None


# ------------------------------------------------------------------------------- types
@dataclass
class TypeRef:
    loc: Loc
    kind: str  # "bit" "int" "varbit" "bool" "void" "error" "string" "name" "tuple"
    width: Expr | None = None
    name: str = ""
    args: list[TypeRef] = field(default_factory=list)
    stack: Expr | None = None  # header stack size, T[n]


# ------------------------------------------------------------------------------- expressions
@dataclass
class Expr:
    loc: Loc


@dataclass
class IntLit(Expr):
    value: int
    width: int | None
    signed: bool
    text: str = ""


@dataclass
class BoolLit(Expr):
    value: bool


@dataclass
class StrLit(Expr):
    value: str


@dataclass
class DontCare(Expr):
    """``_`` as an argument: a fresh value nobody reads."""


@dataclass
class Name(Expr):
    name: str
    top: bool = False  # written as .name


@dataclass
class Member(Expr):
    expr: Expr
    name: str
    name_loc: Loc | None = None


@dataclass
class Call(Expr):
    func: Expr
    type_args: list[TypeRef]
    args: list[Expr]


@dataclass
class Index(Expr):
    expr: Expr
    index: Expr


@dataclass
class Slice(Expr):
    expr: Expr
    hi: Expr
    lo: Expr


@dataclass
class Unary(Expr):
    op: str
    expr: Expr


@dataclass
class Binary(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass
class Cond(Expr):
    cond: Expr
    then: Expr
    other: Expr


@dataclass
class Cast(Expr):
    type: TypeRef
    expr: Expr


@dataclass
class ListExpr(Expr):
    items: list[Expr]


@dataclass
class Default(Expr):  # "default" or "_" in keysets
    pass


@dataclass
class Mask(Expr):
    value: Expr
    mask: Expr


@dataclass
class RangeKS(Expr):
    lo: Expr
    hi: Expr


# ------------------------------------------------------------------------------- statements
@dataclass
class Stmt:
    loc: Loc


@dataclass
class Assign(Stmt):
    lhs: Expr
    rhs: Expr
    op: str = ""  # a compound assignment's operator (``+`` for ``+=``), else ""


@dataclass
class CallStmt(Stmt):
    call: Expr


@dataclass
class If(Stmt):
    cond: Expr
    then: Stmt
    other: Stmt | None


@dataclass
class Block(Stmt):
    stmts: list[Stmt]


@dataclass
class SwitchCase:
    loc: Loc
    label: str | None  # None = default
    body: Block | None  # None = fall through
    value: Expr | None = None  # a label that is not a (dotted) name: its expression


@dataclass
class Switch(Stmt):
    expr: Expr
    cases: list[SwitchCase]


@dataclass
class Exit(Stmt):
    pass


@dataclass
class Return(Stmt):
    value: Expr | None


@dataclass
class Empty(Stmt):
    pass


@dataclass
class VarDecl(Stmt):
    type: TypeRef
    name: str
    init: Expr | None
    annotations: list[Annotation] = field(default_factory=list)
    const: bool = False


@dataclass
class Instantiation(Stmt):
    type: TypeRef
    args: list[Expr]
    name: str
    annotations: list[Annotation] = field(default_factory=list)


# ------------------------------------------------------------------------------- declarations
@dataclass
class Param:
    loc: Loc
    direction: str  # "", "in", "out", "inout"
    type: TypeRef
    name: str
    annotations: list[Annotation] = field(default_factory=list)
    default: Expr | None = None  # ``bit<8> x = 0``: the value of an omitted argument


@dataclass
class Field:
    loc: Loc
    type: TypeRef
    name: str
    annotations: list[Annotation]


@dataclass
class Decl:
    loc: Loc
    name: str
    annotations: list[Annotation]


@dataclass
class HeaderDecl(Decl):
    fields: list[Field]
    is_header: bool  # False: struct
    is_union: bool = False  # header_union (is_header False)


@dataclass
class TypedefDecl(Decl):
    type: TypeRef


@dataclass
class EnumDecl(Decl):
    underlying: TypeRef | None
    members: list[tuple[str, Expr | None, Loc]]


@dataclass
class ErrorDecl(Decl):
    members: list[tuple[str, Loc]]


@dataclass
class MatchKindDecl(Decl):
    members: list[tuple[str, Loc]]


@dataclass
class ExternDecl(Decl):
    type_params: list[str]
    methods: list[FunctionProto]


@dataclass
class FunctionProto(Decl):
    ret: TypeRef | None  # None for constructors
    type_params: list[str]
    params: list[Param]


@dataclass
class ActionDecl(Decl):
    params: list[Param]
    body: Block


@dataclass
class KeyElement:
    loc: Loc
    expr: Expr
    match_kind: str
    annotations: list[Annotation]


@dataclass
class ActionRef:
    loc: Loc
    name: str
    args: list[Expr]
    annotations: list[Annotation]


@dataclass
class TableEntryDecl:
    loc: Loc
    keys: list[Expr]
    action: ActionRef
    annotations: list[Annotation]
    priority: Expr | None = None


@dataclass
class TableProperty:
    loc: Loc
    name: str
    const: bool
    keys: list[KeyElement] | None = None
    actions: list[ActionRef] | None = None
    entries: list[TableEntryDecl] | None = None
    value: Expr | None = None


@dataclass
class TableDecl(Decl):
    properties: list[TableProperty]


@dataclass
class SelectCase:
    loc: Loc
    keyset: Expr
    state: str


@dataclass
class Transition:
    loc: Loc
    state: str | None
    select: list[Expr] | None = None
    cases: list[SelectCase] | None = None


@dataclass
class ParserState(Decl):
    stmts: list[Stmt]
    transition: Transition | None


@dataclass
class ParserDecl(Decl):
    type_params: list[str]
    params: list[Param]
    ctor_params: list[Param]
    locals: list[Stmt | Decl]
    states: list[ParserState]
    proto: bool  # declaration without body


@dataclass
class ControlDecl(Decl):
    type_params: list[str]
    params: list[Param]
    ctor_params: list[Param]
    locals: list[Stmt | Decl]
    body: Block | None
    proto: bool


@dataclass
class PackageDecl(Decl):
    type_params: list[str]
    params: list[Param]


@dataclass
class ConstDecl(Decl):
    type: TypeRef
    value: Expr


@dataclass
class InstanceDecl(Decl):
    inst: Instantiation


@dataclass
class FunctionDecl(Decl):
    proto: FunctionProto
    body: Block


@dataclass
class Program:
    decls: list[Decl]
