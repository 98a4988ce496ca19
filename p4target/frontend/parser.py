"""Recursive-descent parser for the supported P4_16 subset.

P4 needs to tell type names from other identifiers (``T x;`` vs ``f(x);``); like p4c's lexer,
this parser keeps the set of type names declared so far (declarations precede uses in P4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from . import ast as A  # noqa: N812
from .diagnostics import Diagnostic, Loc
from .lexer import KEYWORDS, Token

T = TypeVar("T")

BUILTIN_TYPES = {"bit", "int", "varbit", "bool", "void", "error", "string", "tuple"}

# binary operators: precedence (higher binds tighter), P4 spec / C order
_BINOPS: dict[str, int] = {
    "||": 1,
    "&&": 2,
    "==": 3,
    "!=": 3,
    "<": 4,
    ">": 4,
    "<=": 4,
    ">=": 4,
    "|": 5,
    "^": 6,
    "&": 7,
    "<<": 8,
    ">>": 8,
    "++": 9,
    "+": 10,
    "-": 10,
    "|+|": 10,
    "|-|": 10,
    "*": 11,
    "/": 11,
    "%": 11,
}
# operators with a compound assignment form (``a op= b``)
_COMPOUND = {"+", "-", "*", "/", "%", "<<", "&", "^", "|", "|+|", "|-|"}  # and >>= ('>' '>=')


class Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.toks = tokens
        self.i = 0
        self.types: set[str] = set()

    # ---------------------------------------------------------------- helpers
    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def at(self, text: str) -> bool:
        t = self.tok
        return t.text == text and t.kind in ("op", "id")

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.i += 1
            return True
        return False

    def expect(self, text: str, what: str | None = None) -> Token:
        t = self.tok
        if not self.at(text):
            raise Diagnostic(
                t.loc, f"expected '{text}'{' ' + what if what else ''}, found '{t.text}'"
            )
        self.i += 1
        return t

    def ident(self, what: str = "an identifier") -> Token:
        t = self.tok
        if t.kind != "id" or (
            t.text in KEYWORDS and t.text not in ("apply", "state", "type", "list")
        ):
            raise Diagnostic(t.loc, f"expected {what}, found '{t.text}'")
        self.i += 1
        return t

    def is_type_start(self, t: Token | None = None) -> bool:
        t = t or self.tok
        return t.kind == "id" and (t.text in BUILTIN_TYPES or t.text in self.types)

    # ---------------------------------------------------------------- program
    def program(self) -> A.Program:
        decls: list[A.Decl] = []
        while self.tok.kind != "eof":
            if self.accept(";"):
                continue
            decls.append(self.declaration())
        return A.Program(decls)

    def annotations(self) -> list[A.Annotation]:
        anns: list[A.Annotation] = []
        while self.at("@"):
            loc = self.tok.loc
            self.i += 1
            name = self.tok
            if name.kind != "id":
                raise Diagnostic(name.loc, "expected an annotation name after '@'")
            self.i += 1
            args: list[str | int] = []
            body: list[str] | None = None
            if self.at("(") or self.at("["):
                body = []
                close = ")" if self.at("(") else "]"
                self.i += 1
                depth = 0
                while True:
                    t = self.tok
                    if t.kind == "eof":
                        raise Diagnostic(loc, "unterminated annotation")
                    if t.text in ("(", "[") and t.kind == "op":
                        depth += 1
                    elif t.text == close and t.kind == "op" and depth == 0:
                        self.i += 1
                        break
                    elif t.text in (")", "]") and t.kind == "op":
                        depth -= 1
                    if t.kind == "str":
                        args.append(bytes(t.text[1:-1], "utf-8").decode("unicode_escape"))
                    elif t.kind == "int":
                        args.append(t.value)
                    elif t.kind == "id":
                        args.append(t.text)
                    body.append(t.text + (" " if t.text == "," else ""))
                    self.i += 1
            anns.append(A.Annotation(name.text, args, loc, None if body is None else "".join(body)))
        return anns

    def declaration(self) -> A.Decl:
        anns = self.annotations()
        t = self.tok
        loc = t.loc
        kw = t.text if t.kind == "id" else ""
        if kw in ("header", "struct", "header_union"):
            self.i += 1
            name = self.ident("a type name").text
            self.types.add(name)
            fields = self.braced(self.field_decl)
            return A.HeaderDecl(loc, name, anns, fields, kw == "header", kw == "header_union")
        if kw in {"typedef", "type"}:
            self.i += 1
            ty = self.type_ref()
            name = self.ident("a type name").text
            self.types.add(name)
            self.expect(";")
            return A.TypedefDecl(loc, name, anns, ty)
        if kw == "enum":
            self.i += 1
            under: A.TypeRef | None = None
            if self.at("bit") or self.at("int"):
                under = self.type_ref()
            name = self.ident("an enum name").text
            self.types.add(name)
            self.expect("{")
            members: list[tuple[str, A.Expr | None, Loc]] = []
            while not self.at("}"):
                m = self.ident("an enum member")
                val = None
                if self.accept("="):
                    val = self.expression()
                members.append((m.text, val, m.loc))
                if not self.accept(","):
                    break
            self.expect("}")
            return A.EnumDecl(loc, name, anns, under, members)
        if kw in ("error", "match_kind"):
            self.i += 1
            self.expect("{")
            mem: list[tuple[str, Loc]] = []
            while not self.at("}"):
                m = self.ident("a member name")
                mem.append((m.text, m.loc))
                if not self.accept(","):
                    break
            self.expect("}")
            if kw == "error":
                return A.ErrorDecl(loc, "error", anns, mem)
            return A.MatchKindDecl(loc, "match_kind", anns, mem)
        if kw == "const":
            self.i += 1
            ty = self.type_ref()
            name = self.ident("a constant name").text
            self.expect("=")
            val = self.expression()
            self.expect(";")
            return A.ConstDecl(loc, name, anns, ty, val)
        if kw == "extern":
            return self.extern_decl(anns)
        if kw == "action":
            return self.action_decl(anns)
        if kw == "parser":
            return self.parser_decl(anns)
        if kw == "control":
            return self.control_decl(anns)
        if kw == "package":
            self.i += 1
            name = self.ident("a package name").text
            self.types.add(name)
            tps = self.type_params()
            params = self.params()
            self.expect(";")
            return A.PackageDecl(loc, name, anns, tps, params)
        if kw in ("value_set",):
            raise Diagnostic(loc, "parser value sets are not supported")
        if self.is_type_start():
            # function declaration or instantiation at top level
            ty = self.type_ref()
            if self.at("("):
                args = self.arguments()
                name = self.ident("an instance name").text
                self.expect(";")
                return A.InstanceDecl(loc, name, anns, A.Instantiation(loc, ty, args, name, anns))
            fname = self.ident("a function name")
            tps = self.type_params()
            params = self.params()
            body = self.block()
            return A.FunctionDecl(
                loc, fname.text, anns, A.FunctionProto(loc, fname.text, anns, ty, tps, params), body
            )
        raise Diagnostic(loc, f"expected a declaration, found '{t.text}'")

    def type_params(self) -> list[str]:
        tps: list[str] = []
        if self.accept("<"):
            while True:
                n = self.ident("a type parameter").text
                tps.append(n)
                self.types.add(n)
                if not self.accept(","):
                    break
            self.expect(">")
        return tps

    def params(self) -> list[A.Param]:
        self.expect("(")
        ps: list[A.Param] = []
        while not self.at(")"):
            anns = self.annotations()
            loc = self.tok.loc
            d = ""
            if self.tok.text in ("in", "out", "inout") and self.tok.kind == "id":
                d = self.tok.text
                self.i += 1
            ty = self.type_ref()
            name = self.ident("a parameter name")
            default = self.expression() if self.accept("=") else None
            ps.append(A.Param(loc, d, ty, name.text, anns, default))
            if not self.accept(","):
                break
        self.expect(")")
        return ps

    def extern_decl(self, anns: list[A.Annotation]) -> A.Decl:
        loc = self.tok.loc
        self.expect("extern")
        # extern object: "extern Name {" / "extern Name<T> {"; else an extern function
        if self.tok.kind == "id" and (
            self.peek().text == "{"
            or (self.peek().text == "<" and self.tok.text not in BUILTIN_TYPES)
        ):
            name = self.ident("an extern name").text
            self.types.add(name)
            saved = set(self.types)
            tps = self.type_params()
            self.expect("{")
            methods: list[A.FunctionProto] = []
            while not self.accept("}"):
                manns = self.annotations()
                mloc = self.tok.loc
                ret: A.TypeRef | None = None
                if self.tok.text == name and self.peek().text == "(":
                    mname = name
                    self.i += 1
                else:
                    if self.accept("abstract"):
                        pass
                    ret = self.type_ref()
                    mname = self.ident("a method name").text
                mtps = self.type_params()
                ps = self.params()
                self.expect(";")
                methods.append(A.FunctionProto(mloc, mname, manns, ret, mtps, ps))
            self.types = saved | {name}
            return A.ExternDecl(loc, name, anns, tps, methods)
        ret = self.type_ref()
        name = self.ident("a function name").text
        saved = set(self.types)
        tps = self.type_params()
        ps = self.params()
        self.expect(";")
        self.types = saved
        return A.FunctionProto(loc, name, anns, ret, tps, ps)

    def action_decl(self, anns: list[A.Annotation]) -> A.ActionDecl:
        loc = self.expect("action").loc
        name = self.ident("an action name").text
        ps = self.params()
        body = self.block()
        return A.ActionDecl(loc, name, anns, ps, body)

    def block_head(
        self, kw: str
    ) -> tuple[Loc, str, set[str], list[str], list[A.Param], list[A.Param] | None]:
        """``parser``/``control`` NAME <type params> (params), then ``;`` (a declaration:
        ``ctor`` None) or [(constructor params)] ``{``. Returns loc, name, the type names in
        scope before the type params, type params, params and ``ctor``."""
        loc = self.expect(kw).loc
        name = self.ident(f"a {kw} name").text
        self.types.add(name)
        saved = set(self.types)
        tps = self.type_params()
        ps = self.params()
        if self.accept(";"):
            self.types = saved | {name}
            return loc, name, saved, tps, ps, None
        ctor = self.params() if self.at("(") else []
        self.expect("{")
        return loc, name, saved, tps, ps, ctor

    def parser_decl(self, anns: list[A.Annotation]) -> A.ParserDecl:
        loc, name, saved, tps, ps, ctor = self.block_head("parser")
        if ctor is None:
            return A.ParserDecl(loc, name, anns, tps, ps, [], [], [], True)
        locs: list[A.Stmt | A.Decl] = []
        states: list[A.ParserState] = []
        while not self.accept("}"):
            sanns = self.annotations()
            if self.at("state"):
                sloc = self.tok.loc
                self.i += 1
                sname = self.ident("a state name").text
                self.expect("{")
                stmts: list[A.Stmt] = []
                trans: A.Transition | None = None
                while not self.accept("}"):
                    if self.at("transition"):
                        trans = self.transition()
                        if not self.at("}"):
                            raise Diagnostic(
                                self.tok.loc,
                                "the transition must be the last statement of a parser state",
                            )
                        continue
                    stmts.append(self.statement(in_parser=True))
                states.append(A.ParserState(sloc, sname, sanns, stmts, trans))
            else:
                locs.append(self.local_decl(sanns))
        self.types = saved | {name}
        return A.ParserDecl(loc, name, anns, tps, ps, ctor, locs, states, False)

    def field_decl(self) -> A.Field:
        """A field of a header, header union or struct."""
        fanns = self.annotations()
        ft = self.type_ref()
        fname = self.ident("a field name")
        self.expect(";")
        return A.Field(fname.loc, ft, fname.text, fanns)

    def select_case(self) -> A.SelectCase:
        cloc = self.tok.loc
        ks = self.keyset()
        self.expect(":")
        st = self.ident("a state name").text
        self.expect(";")
        return A.SelectCase(cloc, ks, st)

    def transition(self) -> A.Transition:
        loc = self.expect("transition").loc
        if self.accept("select"):
            self.expect("(")
            exprs = [self.expression()]
            while self.accept(","):
                exprs.append(self.expression())
            self.expect(")")
            cases = self.braced(self.select_case)
            return A.Transition(loc, None, exprs, cases)
        st = self.ident("a state name").text
        self.expect(";")
        return A.Transition(loc, st)

    def keyset(self) -> A.Expr:
        loc = self.tok.loc
        if self.at("(") and self._tuple_keyset_ahead():
            self.i += 1
            items = [self.simple_keyset()]
            while self.accept(","):
                items.append(self.simple_keyset())
            self.expect(")")
            return A.ListExpr(loc, items)
        return self.simple_keyset()

    def _tuple_keyset_ahead(self) -> bool:
        """'(' starts a tuple keyset if a top-level ',' appears before the matching ')'."""
        depth = 0
        j = self.i
        while j < len(self.toks):
            t = self.toks[j]
            if t.kind == "op" and t.text in ("(", "[", "{"):
                depth += 1
            elif t.kind == "op" and t.text in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    return False
            elif t.kind == "op" and t.text == "," and depth == 1:
                return True
            elif t.kind == "eof":
                return False
            j += 1
        return False

    def simple_keyset(self) -> A.Expr:
        loc = self.tok.loc
        if self.accept("default") or self.accept("_"):
            return A.Default(loc)
        e = self.expression()
        if self.accept("&&&"):
            return A.Mask(loc, e, self.expression())
        if self.accept(".."):
            return A.RangeKS(loc, e, self.expression())
        return e

    def control_decl(self, anns: list[A.Annotation]) -> A.ControlDecl:
        loc, name, saved, tps, ps, ctor = self.block_head("control")
        if ctor is None:
            return A.ControlDecl(loc, name, anns, tps, ps, [], [], None, True)
        locs: list[A.Stmt | A.Decl] = []
        body: A.Block | None = None
        while not self.accept("}"):
            lanns = self.annotations()
            if self.at("apply"):
                if body is not None:
                    raise Diagnostic(self.tok.loc, "duplicate apply block")
                self.i += 1
                body = self.block()
                continue
            locs.append(self.local_decl(lanns))
        if body is None:
            raise Diagnostic(loc, f"control {name} has no apply block")
        self.types = saved | {name}
        return A.ControlDecl(loc, name, anns, tps, ps, ctor, locs, body, False)

    def local_decl(self, anns: list[A.Annotation]) -> A.Stmt | A.Decl:
        t = self.tok
        if self.at("action"):
            return self.action_decl(anns)
        if self.at("table"):
            return self.table_decl(anns)
        if self.at("const"):
            return self.const_decl(anns)
        if self.is_type_start():
            s = self.decl_after_type(anns)
            self.expect(";")
            return s
        if self.at("state"):
            raise Diagnostic(t.loc, "unexpected 'state' outside a parser")
        if (t.kind == "id" and t.text not in KEYWORDS and self.peek().text in ("(", "<")) or (
            t.kind == "id" and self.peek().kind == "id"
        ):
            raise Diagnostic(t.loc, f"unknown type {t.text}")
        raise Diagnostic(t.loc, f"expected a declaration, found '{t.text}'")

    def decl_after_type(self, anns: list[A.Annotation]) -> A.Stmt:
        loc = self.tok.loc
        ty = self.type_ref()
        if self.at("("):
            args = self.arguments()
            n = self.ident("an instance name")
            return A.Instantiation(loc, ty, args, n.text, anns)
        n = self.ident("a variable name")
        init = None
        if self.accept("="):
            init = self.expression()
        return A.VarDecl(loc, ty, n.text, init, anns)

    def const_decl(self, anns: list[A.Annotation]) -> A.VarDecl:
        """``const T name = value;`` declared in a control or in a block."""
        loc = self.expect("const").loc
        ty = self.type_ref()
        n = self.ident("a constant name")
        self.expect("=")
        v = self.expression()
        self.expect(";")
        return A.VarDecl(loc, ty, n.text, v, anns, const=True)

    def table_decl(self, anns: list[A.Annotation]) -> A.TableDecl:
        loc = self.expect("table").loc
        name = self.ident("a table name").text
        self.expect("{")
        props: list[A.TableProperty] = []
        while not self.accept("}"):
            panns = self.annotations()
            del panns
            ploc = self.tok.loc
            const = self.accept("const")
            pn = self.tok
            if pn.kind != "id":
                raise Diagnostic(pn.loc, f"expected a table property, found '{pn.text}'")
            self.i += 1
            pname = pn.text
            self.expect("=") if pname != "entries" or self.at("=") else None
            if pname == "key":
                keys = self.braced(self.key_element)
                props.append(A.TableProperty(ploc, pname, const, keys=keys))
            elif pname == "actions":
                acts = self.braced(self.action_ref)
                props.append(A.TableProperty(ploc, pname, const, actions=acts))
            elif pname == "entries":
                ents = self.braced(self.table_entry)
                props.append(A.TableProperty(ploc, pname, const, entries=ents))
            else:
                v = self.expression()
                self.expect(";")
                props.append(A.TableProperty(ploc, pname, const, value=v))
        return A.TableDecl(loc, name, anns, props)

    def braced(self, item: Callable[[], T]) -> list[T]:
        """``{ item item ... }``: the items up to the closing brace."""
        self.expect("{")
        items: list[T] = []
        while not self.accept("}"):
            items.append(item())
        return items

    def key_element(self) -> A.KeyElement:
        kloc = self.tok.loc
        e = self.expression()
        self.expect(":")
        mk = self.ident("a match kind").text
        kanns = self.annotations()
        self.expect(";")
        return A.KeyElement(kloc, e, mk, kanns)

    def action_ref(self) -> A.ActionRef:
        """An action of a table's ``actions`` list."""
        ref = self.action_call(self.annotations())
        self.expect(";")
        return ref

    def action_call(self, anns: list[A.Annotation]) -> A.ActionRef:
        """``name`` or ``name(args)``: an action as a table lists it or an entry runs it."""
        aloc = self.tok.loc
        an = self.dotted_name()
        args = self.arguments() if self.at("(") else []
        return A.ActionRef(aloc, an, args, anns)

    def table_entry(self) -> A.TableEntryDecl:
        eanns = self.annotations()
        eloc = self.tok.loc
        prio: A.Expr | None = None
        if self.accept("priority"):
            self.expect("=")
            prio = self.expression()
            self.expect(":")
        ks = self.keyset()
        keys_l = ks.items if isinstance(ks, A.ListExpr) else [ks]
        self.expect(":")
        action = self.action_call([])
        eanns += self.annotations()  # p4c's @priority(n) goes here
        self.expect(";")
        return A.TableEntryDecl(eloc, keys_l, action, eanns, prio)

    def dotted_name(self) -> str:
        top = self.accept(".")
        n = self.ident("a name").text
        while self.at(".") and self.peek().kind == "id":
            self.i += 1
            n += "." + self.ident().text
        return ("." if top else "") + n

    # ---------------------------------------------------------------- types
    def type_ref(self) -> A.TypeRef:
        t = self.tok
        loc = t.loc
        if t.kind != "id" or not self.is_type_start():
            raise Diagnostic(
                loc,
                f"expected a type, found '{t.text}'"
                + (" (unknown type name)" if t.kind == "id" else ""),
            )
        self.i += 1
        ty: A.TypeRef
        if t.text in ("bit", "int", "varbit"):
            width: A.Expr | None = None
            if self.accept("<"):
                if self.at("("):
                    self.i += 1
                    width = self.expression()
                    self.expect(")")
                else:
                    width = self.primary()
                self.expect(">")
            elif t.text != "int":
                width = A.IntLit(loc, 1, None, False, "1")
            ty = A.TypeRef(loc, t.text, width)
        elif t.text in ("bool", "void", "error", "string"):
            ty = A.TypeRef(loc, t.text)
        elif t.text == "tuple":
            self.expect("<")
            args = [self.type_ref()]
            while self.accept(","):
                args.append(self.type_ref())
            self.expect(">")
            ty = A.TypeRef(loc, "tuple", args=args)
        else:
            args = []
            if self.at("<") and self.is_type_start(self.peek()):
                self.i += 1
                args.append(self.type_ref())
                while self.accept(","):
                    args.append(self.type_ref())
                self.expect(">")
            ty = A.TypeRef(loc, "name", name=t.text, args=args)
        if self.at("["):
            self.i += 1
            ty.stack = self.expression()
            self.expect("]")
        return ty

    # ---------------------------------------------------------------- statements
    def block(self) -> A.Block:
        loc = self.expect("{").loc
        stmts: list[A.Stmt] = []
        while not self.accept("}"):
            if self.tok.kind == "eof":
                raise Diagnostic(loc, "unterminated block")
            stmts.append(self.statement())
        return A.Block(loc, stmts)

    def statement(self, in_parser: bool = False) -> A.Stmt:
        anns = self.annotations()
        t = self.tok
        loc = t.loc
        if self.at("{"):
            return self.block()
        if self.accept(";"):
            return A.Empty(loc)
        if t.kind == "id":
            kw = t.text
            if kw == "if":
                if in_parser:
                    raise Diagnostic(
                        loc, "'if' is not allowed in parser states on bmv2; use select"
                    )
                self.i += 1
                self.expect("(")
                c = self.expression()
                self.expect(")")
                th = self.statement()
                el = self.statement() if self.accept("else") else None
                return A.If(loc, c, th, el)
            if kw == "switch":
                return self.switch_stmt()
            if kw == "for" and self.peek().text == "(":
                raise Diagnostic(loc, "'for' loops are not supported by this target")
            if kw == "exit":
                self.i += 1
                self.expect(";")
                return A.Exit(loc)
            if kw == "return":
                self.i += 1
                v = None if self.at(";") else self.expression()
                self.expect(";")
                return A.Return(loc, v)
            if kw == "const":
                return self.const_decl(anns)
            if kw == "transition":
                raise Diagnostic(loc, "'transition' is only allowed at the end of a parser state")
            if self.is_type_start() and (
                self.peek().kind == "id"
                or (
                    self.peek().text == "<"
                    and t.text in BUILTIN_TYPES | self.types
                    and self._looks_like_decl()
                )
                or (self.peek().text == "[" and t.text in self.types)  # a stack: H[2] s;
            ):
                s = self.decl_after_type(anns)
                self.expect(";")
                return s
            if (
                self.is_type_start()
                and self.peek().text == "("
                and t.text not in ("bit", "int", "bool")
            ):
                s = self.decl_after_type(anns)
                self.expect(";")
                return s
        if (
            t.kind == "id"
            and t.text not in KEYWORDS
            and self.peek().kind == "id"
            and self.peek().text not in KEYWORDS
        ):
            raise Diagnostic(loc, f"unknown type {t.text}")
        lhs = self.expression()
        if self.accept("="):
            rhs = self.expression()
            self.expect(";")
            return A.Assign(loc, lhs, rhs)
        if self._shr_assign_at():
            self.i += 2
            rhs = self.expression()
            self.expect(";")
            return A.Assign(loc, lhs, rhs, ">>")
        if self.tok.kind == "op":
            op = self.tok.text
            if self._compound_at(op):
                self.i += 2
                rhs = self.expression()
                self.expect(";")
                return A.Assign(loc, lhs, rhs, op)
        if not isinstance(lhs, A.Call):
            raise Diagnostic(
                self.tok.loc,
                f"expected '=' or '(' , found '{self.tok.text}'"
                if not self.at(";")
                else "expression statement must be a method or function call",
            )
        self.expect(";")
        return A.CallStmt(loc, lhs)

    def _looks_like_decl(self) -> bool:
        """After a type-name token followed by '<': a generic type declaration?"""
        j = self.i + 1
        depth = 0
        while j < len(self.toks):
            t = self.toks[j]
            if t.text == "<":
                depth += 1
            elif t.text == ">":
                depth -= 1
                if depth == 0:
                    nxt = self.toks[j + 1]
                    return nxt.kind == "id" or nxt.text in ("(", ">")
            elif t.text in (";", "{", "}", "="):
                return False
            j += 1
        return False

    def switch_stmt(self) -> A.Switch:
        loc = self.expect("switch").loc
        self.expect("(")
        e = self.expression()
        self.expect(")")
        self.expect("{")
        cases: list[A.SwitchCase] = []
        while not self.accept("}"):
            cloc = self.tok.loc
            value: A.Expr | None = None
            if self.accept("default"):
                label = None
            elif self.tok.kind == "id" or self.at("."):
                label = self.dotted_name()
            else:  # a constant expression (switch on a value)
                value = self.expression()
                label = ""
            self.expect(":")
            body = self.block() if self.at("{") else None
            cases.append(A.SwitchCase(cloc, label, body, value))
        return A.Switch(loc, e, cases)

    # ---------------------------------------------------------------- expressions
    def arguments(self) -> list[A.Expr]:
        self.expect("(")
        args: list[A.Expr] = []
        while not self.at(")"):
            if self.at("_") and self.peek().text in (",", ")"):
                args.append(A.DontCare(self.tok.loc))
                self.i += 1
            else:
                args.append(self.expression())
            if not self.accept(","):
                break
        self.expect(")")
        return args

    def expression(self) -> A.Expr:
        e = self.binary(1)
        if self.at("?"):
            loc = self.tok.loc
            self.i += 1
            a = self.expression()
            self.expect(":")
            b = self.expression()
            return A.Cond(loc, e, a, b)
        return e

    def _binop(self) -> str | None:
        t = self.tok
        if t.kind != "op":
            return None
        if self._shr_assign_at():
            return None
        if (
            t.text == ">"
            and self.peek().text == ">"
            and self.peek().kind == "op"
            and self.peek().loc.line == t.loc.line
            and self.peek().loc.col == t.loc.col + 1
        ):
            op = ">>"
        else:
            op = t.text
        if op not in _BINOPS or self._compound_at(op):
            return None
        return op

    def _shr_assign_at(self) -> bool:
        """``>>=`` at the current token (lexed as '>' '>=')."""
        t, n = self.tok, self.peek()
        return (
            t.text == ">"
            and n.text == ">="
            and n.loc.line == t.loc.line
            and n.loc.col == t.loc.col + 1
        )

    def _compound_at(self, op: str) -> bool:
        """The operator ``op`` at the current token is followed right away by '=': a compound
        assignment (``+=``, ``>>=``, ``|+|=`` ...), not a binary operator."""
        if op not in _COMPOUND:
            return False
        j = self.i + 1
        if j >= len(self.toks):
            return False
        last, nxt = self.toks[j - 1], self.toks[j]
        return (
            nxt.text == "="
            and nxt.kind == "op"
            and nxt.loc.line == last.loc.line
            and nxt.loc.col == last.loc.col + len(last.text)
        )

    def binary(self, minprec: int) -> A.Expr:
        left = self.unary()
        while True:
            op = self._binop()
            if op is None or _BINOPS[op] < minprec:
                return left
            loc = self.tok.loc
            self.i += 2 if op == ">>" else 1
            right = self.binary(_BINOPS[op] + 1)
            left = A.Binary(loc, op, left, right)

    def unary(self) -> A.Expr:
        t = self.tok
        if t.kind == "op" and t.text in ("!", "~", "-", "+"):
            self.i += 1
            e = self.unary()
            if t.text == "+":
                return e
            if t.text == "-" and isinstance(e, A.IntLit) and e.width is None:
                return A.IntLit(t.loc, -e.value, None, False, "-" + e.text)
            return A.Unary(t.loc, t.text, e)
        if t.kind == "op" and t.text == "(" and self._is_cast():
            self.i += 1
            ty = self.type_ref()
            self.expect(")")
            return A.Cast(t.loc, ty, self.unary())
        return self.postfix(self.primary())

    def _is_cast(self) -> bool:
        n = self.peek()
        if n.kind != "id":
            return False
        if n.text in ("bit", "int", "bool", "varbit"):
            return True
        if n.text in self.types:
            n2 = self.peek(2)
            return n2.text in (")", "<")
        return False

    def primary(self) -> A.Expr:
        t = self.tok
        loc = t.loc
        if t.kind == "int":
            self.i += 1
            return A.IntLit(loc, t.value, t.width, t.signed, t.text)
        if t.kind == "str":
            self.i += 1
            return A.StrLit(loc, t.text[1:-1])
        if t.kind == "op":
            if t.text == "(":
                self.i += 1
                e = self.expression()
                self.expect(")")
                return e
            if t.text == "{":
                self.i += 1
                items: list[A.Expr] = []
                while not self.at("}"):
                    items.append(self.expression())
                    if not self.accept(","):
                        break
                self.expect("}")
                return A.ListExpr(loc, items)
            if t.text == ".":
                self.i += 1
                n = self.ident()
                return A.Name(loc, n.text, top=True)
            raise Diagnostic(loc, f"expected an expression, found '{t.text}'")
        if t.kind == "id":
            if t.text in {"true", "false"}:
                self.i += 1
                return A.BoolLit(loc, t.text == "true")
            if t.text in ("bit", "int", "varbit", "bool", "tuple"):
                raise Diagnostic(loc, f"unexpected type '{t.text}' in an expression")
            if t.text in KEYWORDS and t.text not in ("error", "apply", "state", "type"):
                raise Diagnostic(loc, f"expected an expression, found '{t.text}'")
            self.i += 1
            return A.Name(loc, t.text)
        raise Diagnostic(loc, f"expected an expression, found '{t.text}'")

    def postfix(self, e: A.Expr) -> A.Expr:
        while True:
            t = self.tok
            if t.kind != "op":
                return e
            if t.text == ".":
                self.i += 1
                n = self.ident("a member name")
                e = A.Member(e.loc, e, n.text, n.loc)
            elif t.text == "[":
                self.i += 1
                a = self.expression()
                if self.accept(":"):
                    b = self.expression()
                    self.expect("]")
                    e = A.Slice(t.loc, e, a, b)
                else:
                    self.expect("]")
                    e = A.Index(t.loc, e, a)
            elif t.text == "(":
                args = self.arguments()
                e = A.Call(e.loc, e, [], args)
            elif (
                t.text == "<"
                and self.is_type_start(self.peek())
                and isinstance(e, (A.Name, A.Member))
            ):
                self.i += 1
                targs = [self.type_ref()]
                while self.accept(","):
                    targs.append(self.type_ref())
                self.expect(">")
                if not self.at("("):
                    raise Diagnostic(self.tok.loc, "expected '(' after type arguments")
                args = self.arguments()
                e = A.Call(e.loc, e, targs, args)
            else:
                return e


def parse_tokens(tokens: list[Token]) -> A.Program:
    return Parser(tokens).program()
