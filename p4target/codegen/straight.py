"""The straight-line fast path: one Python function per program, header fields as locals.

The general backend (:mod:`.general`) writes, from the checked program's IR, a module of small
functions over a per-packet context object (``C.hdr.ipv4.ttl``, ``C.std.egress_spec``, a
function per action and table). That general form covers every supported feature but costs an
object per header and a call per block, table and action. :func:`build_fast` rewrites the code
of that module's blocks, tables and actions (its tree, which the pipeline also compiles; no
generated text is read back) into one function, taking the layout of the program's state —
headers and their fields, metadata, frames, initial values, the tables' action maps — from the
checker's :class:`~.frontend.model.ProgramFacts` (by P4 names, which it names as the general code
does with :func:`.general.attr`) and the header pack formats from the general backend
(:attr:`.general.GeneralModule.pack_formats`)::

    fast(port, frames, t0, mcast, out, drop, digest, qdepth) -> None

that runs, for each frame of a batch received on ``port``, parser, verify, ingress, the v1model
traffic manager (multicast replicas, drop, unicast), and per copy egress, compute and deparser
(``t0`` is the dataplane's clock origin in microseconds), with every header, metadata and standard
metadata field a local variable (``h_ipv4_ttl``, ``m_mark``, ``s_egress_spec``), tables, actions
and sub-controls inlined (:meth:`_Builder.sub_control`: a sub-control's frame as locals of its
own, its by-reference struct parameters naming the caller's locals, scalars copied in and out),
and frames appended to ``out`` as ``(port, bytes)``; ``drop(port, reason)``
counts a drop (``internal_error`` for an exception, as the general path) and
``digest(digests)`` queues the ingress digests the way the general path does.

The traffic manager's decisions are not written here: the end of ingress and the end of
egress are :func:`..v1model.end_of_ingress` and :func:`..v1model.end_of_egress`, the functions
the general path calls, inlined (:func:`_inline_v1model`) with the fast path's locals as
arguments, the requests it never covers (resubmit, recirculate) folded to ``False``, and each
verdict turned into the template's statements for it; the constants (instance types, the
clock mask) come from :mod:`..v1model` too.

On top of the inlining, a few rewrites that hold for any program: parser offsets are folded to
constants along paths of fixed-size extracts; each extract keeps its raw struct items
(``r_ipv4_0``...), which the deparser packs back wherever the fields behind an item are written
by nothing but extracts; when no control changes header validity, the headers valid at the
deparser are a function of the parser's accept path, so the deparser is one combined
``struct.pack`` per path; a multicast copy restores only the locals that egress, compute and
deparser write; stores nobody reads are dropped (the clock is read only by programs that read a
timestamp). Each copy gets the queueing fields (``s_enq_qdepth``...) only when the checker
found that egress, compute or deparser reads one (``ProgramFacts.std_reads``, passed in by the
pipeline), as the general path does.

The rewrite is *conservative*: whenever the generated code uses something outside the shapes it
knows (a whole header or struct as a value, a parser state function, lookahead of
a header, clone, resubmit, recirculate, truncate, a ``return`` in an action, struct-typed
metadata or control locals), it gives up and the program runs on the general path only. The
dataplane picks the fast path per packet only when no per-packet logging is on; packets to the
CPU port are handed to the general packet-in code afterwards. ``tests/test_p4_fastpath.py`` runs
both paths on the same frames and compares every output byte, drop and counter.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import itertools
import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import v1model
from ..frontend.model import ProgramFacts, Scalar
from ..v1model import (
    CLOCK_MASK,
    DROP,
    ENQ_TIMESTAMP_MASK,
    FORWARD,
    PKT_REPLICATION,  # noqa: F401 - re-exported (tests compare it with the dataplane's)
    QUEUE_FIELDS,
    TRANSMIT,
)
from .general import attr

__all__ = ["FastPathUnsupported", "build_fast"]


class FastPathUnsupported(Exception):  # noqa: N818 - a reason, not an error
    """The program uses something the fast path does not cover (the message says what)."""


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` -> ['a', 'b', 'c']; None unless it is a pure attribute chain on a name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _calls_with_ctx(node: ast.Call, fn: str, n: int, ctx_at: int) -> bool:
    """``node`` is ``fn(...)`` with ``n`` arguments, the ``ctx_at``-th the packet context ``C``."""
    arg = node.args[ctx_at] if len(node.args) == n else None
    return (
        isinstance(node.func, ast.Name)
        and node.func.id == fn
        and isinstance(arg, ast.Name)
        and arg.id == "C"
    )


def _scalars(where: str, values: Mapping[str, Scalar | None]) -> dict[str, Scalar]:
    """``values`` (the checker's initial values), refused unless every one is a scalar."""
    for name, v in values.items():
        if v is None:
            raise FastPathUnsupported(f"non-constant initial value of {where}.{name}")
    return dict(values)  # type: ignore[arg-type]  # no None left


def _named(values: Mapping[str, Scalar | None]) -> dict[str, Scalar | None]:
    """``values`` (by P4 name) by the general code's attribute names, in the same order."""
    return {attr(n): v for n, v in values.items()}


class _Module:
    """What the rewrite needs to know about one program: the code of its blocks, tables and
    actions (the general backend's functions), and the layout the checker recorded (by P4
    names), named as the general code names it (:func:`~.general.attr`; a header's validity is
    its ``_v_``, first)."""

    def __init__(
        self, tree: ast.Module, facts: ProgramFacts, pack_formats: Mapping[str, str]
    ) -> None:
        self.funcs: dict[str, ast.FunctionDef] = {
            node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)
        }
        self.act_maps = facts.action_maps
        # the general code packs a header of type T with ``_SP_<T>``
        self.pack_formats = {f"_SP_{t}": fmt for t, fmt in pack_formats.items()}
        self.headers: dict[str, dict[str, Scalar]] = {}  # instance -> field -> default
        for name, fields in facts.headers.items():
            h = attr(name)
            if fields is None:
                raise FastPathUnsupported(f"header {h} is not a plain header")
            self.headers[h] = _scalars(f"hdr.{h}", {"_v_": False, **_named(fields)})
        self.meta = _scalars("meta", _named(facts.meta))
        self.std = _scalars("std", _named(facts.std))
        self.frames = {fn: _named(vs) for fn, vs in facts.frames.items()}
        self.by_ref = {fn: frozenset(attr(v) for v in vs) for fn, vs in facts.by_ref.items()}

    def frame_fields(self, block: str) -> dict[str, Scalar]:
        return _scalars(block, self.frames.get(block, {}))


class _Rewriter(ast.NodeTransformer):
    """Maps context chains to locals within one block (``prefix`` names the control frame)."""

    def __init__(self, mod: _Module, frame: dict[str, str], uid: Iterator[int]) -> None:
        self.mod = mod
        self.uid = uid
        self.frame = frame  # frame field -> local name
        # a sub-control's by-reference parameter -> the caller's value it names, as a context
        # chain (``hdr`` -> ['C', 'hdr']): ``F.hdr.ipv4.ttl`` is ``C.hdr.ipv4.ttl``
        self.refs: dict[str, list[str]] = {}
        self.alias: str | None = None  # header bound to ``_h`` (parser and deparser code)
        self.renames: dict[str, str] = {}

    def local_for(self, ch: list[str]) -> str:
        base = ch[0]
        if base == "C":
            if len(ch) == 2 and ch[1] in ("buf", "off", "payload_off", "digests"):
                return {
                    "buf": "_buf",
                    "off": "_off",
                    "payload_off": "_poff",
                    "digests": "_digests",
                }[ch[1]]
            if (
                len(ch) == 4
                and ch[1] == "hdr"
                and ch[2] in self.mod.headers
                and ch[3] in self.mod.headers[ch[2]]
            ):
                return f"h_{ch[2]}_{ch[3]}"
            if len(ch) == 3 and ch[1] == "meta" and ch[2] in self.mod.meta:
                return f"m_{ch[2]}"
            if len(ch) == 3 and ch[1] == "std" and ch[2] in self.mod.std:
                return f"s_{ch[2]}"
        elif base == "F":
            if len(ch) == 2 and ch[1] in self.frame:
                return self.frame[ch[1]]
            if len(ch) > 2 and ch[1] in self.refs:
                return self.local_for([*self.refs[ch[1]], *ch[2:]])
        elif (
            base == "_h"
            and self.alias is not None
            and len(ch) == 2
            and ch[1] in self.mod.headers[self.alias]
        ):
            return f"h_{self.alias}_{ch[1]}"
        raise FastPathUnsupported(f"uses {'.'.join(ch)}")

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        ch = _chain(node)
        if ch is not None and ch[0] in ("C", "F", "_h"):
            # the longest prefix that names a field; the rest are methods of its value
            # (``C.hdr.ipv4.srcAddr.to_bytes``)
            for n in range(len(ch), 1, -1):
                try:
                    name = self.local_for(ch[:n])
                except FastPathUnsupported:
                    continue
                if n < len(ch) and not isinstance(node.ctx, ast.Load):
                    break
                new: ast.expr = ast.Name(name, node.ctx if n == len(ch) else ast.Load())
                for attr in ch[n:]:
                    new = ast.Attribute(new, attr, ast.Load())
                return ast.copy_location(new, node)
            raise FastPathUnsupported(f"uses {'.'.join(ch)}")
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("C", "F", "_h"):
            raise FastPathUnsupported(f"uses {node.id} as a value")
        new = self.renames.get(node.id)
        if new is not None:
            return ast.copy_location(ast.Name(new, node.ctx), node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        f = node.func
        if (
            isinstance(f, ast.Name)
            and f.id == "_hash_csum16_fold"
            and len(node.args) == 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == 16
        ):
            # inline: 0xFFFF - (ones'-complement sum), the sum being s mod 0xFFFF except that
            # a non-zero multiple of 0xFFFF sums to 0xFFFF (_hash_csum16_fold's definition)
            k = next(self.uid)
            s = self.visit(node.args[0])
            folded = ast.parse(
                f"(65534 - (_cs{k} - 1) % 65535) if (_cs{k} := S) else 65535", mode="eval"
            ).body
            assert isinstance(folded, ast.IfExp) and isinstance(folded.test, ast.NamedExpr)
            folded.test.value = s
            return ast.copy_location(folded, node)
        if _calls_with_ctx(node, "_count", 3, 2):
            node.func = ast.Name("_count_n", ast.Load())
            node.args[2] = ast.Name("s_packet_length", ast.Load())
        elif _calls_with_ctx(node, "_peek", 2, 0):
            node.func = ast.Name("_peek_b", ast.Load())
            node.args = [ast.Name("_buf", ast.Load()), ast.Name("_off", ast.Load()), node.args[1]]
        return self.generic_visit(node)


class _Builder:
    def __init__(self, mod: _Module) -> None:
        self.mod = mod
        self.uid = itertools.count()

    # -- statements of one block
    def block(self, stmts: list[ast.stmt], rw: _Rewriter) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        i = 0
        while i < len(stmts):
            st = stmts[i]
            call = self._sub_call(st)
            if call is None:
                out.extend(self.stmt(st, rw))
                i += 1
                continue
            # ``_rN = sub_K(C, args...)``, then ``lv = _rN[i]`` per copied-out argument, then
            # ``if _rN[0]: raise _EXIT`` (the general backend's ApplySub)
            var, sub, args = call
            copy_out: list[tuple[int, ast.expr]] = []
            i += 1
            while i < len(stmts):
                nxt = stmts[i]
                if not (
                    isinstance(nxt, ast.Assign)
                    and len(nxt.targets) == 1
                    and isinstance(nxt.value, ast.Subscript)
                    and isinstance(nxt.value.value, ast.Name)
                    and nxt.value.value.id == var
                    and isinstance(nxt.value.slice, ast.Constant)
                    and isinstance(nxt.value.slice.value, int)
                ):
                    break
                copy_out.append((nxt.value.slice.value, nxt.targets[0]))
                i += 1
            ex = stmts[i] if i < len(stmts) else None
            if not (
                isinstance(ex, ast.If)
                and isinstance(ex.test, ast.Subscript)
                and isinstance(ex.test.value, ast.Name)
                and ex.test.value.id == var
                and isinstance(ex.test.slice, ast.Constant)
                and ex.test.slice.value == 0
                and len(ex.body) == 1
                and isinstance(ex.body[0], ast.Raise)
                and not ex.orelse
            ):
                raise FastPathUnsupported(f"apply of {sub}: unexpected shape")
            i += 1
            out.extend(self.sub_control(sub, args, copy_out, rw))
        return out

    @staticmethod
    def _sub_call(st: ast.stmt) -> tuple[str, str, list[ast.expr]] | None:
        """``_rN = sub_K(C, args...)``: (``_rN``, ``sub_K``, args); None for anything else."""
        found = _assigned_call(st, "sub_")
        if found is None:
            return None
        assign, call, func = found
        target = assign.targets[0]
        if not (
            isinstance(target, ast.Name)
            and call.args
            and isinstance(call.args[0], ast.Name)
            and call.args[0].id == "C"
            and not call.keywords
        ):
            return None
        return target.id, func, call.args[1:]

    def sub_control(
        self,
        sub: str,
        args: list[ast.expr],
        copy_out: list[tuple[int, ast.expr]],
        rw: _Rewriter,
    ) -> list[ast.stmt]:
        """A sub-control's apply inlined where it is applied (as p4c's inliner does): its
        frame becomes locals of its own (``fs<k>_<name>``), a by-reference parameter (a struct
        argument: ``hdr``, ``meta``, ``standard_metadata``) names the caller's value itself,
        so its fields are the caller's locals; its tables and actions are inlined as the
        caller's are. A ``return`` leaves the inlined body only; an ``exit`` propagates to the
        caller's control after the out/inout scalars are copied back, as in the general
        path (``sub_K`` returns ``(exited, outs...)``, the caller copies them out and then
        raises ``_EXIT``)."""
        fn = self.mod.funcs.get(sub)
        fields = self.mod.frames.get(sub)
        refs = self.mod.by_ref.get(sub, frozenset())
        if fn is None or fields is None:
            raise FastPathUnsupported(f"sub-control {sub}")
        params = [a.arg for a in fn.args.args[1:]]
        body = fn.body
        n = len(params)
        # F = F_sub_K(); F.<p> = a<i> per parameter; the frame's init; try; return
        if len(body) < n + 3 or len(args) != n:
            raise FastPathUnsupported(f"sub-control {sub} shape")
        pnames: list[str] = []
        for p, st in zip(params, body[1 : n + 1], strict=True):
            ch = _chain(st.targets[0]) if isinstance(st, ast.Assign) else None
            if not (
                isinstance(st, ast.Assign)
                and ch is not None
                and len(ch) == 2
                and ch[0] == "F"
                and isinstance(st.value, ast.Name)
                and st.value.id == p
            ):
                raise FastPathUnsupported(f"sub-control {sub} shape")
            pnames.append(ch[1])
        init = body[n + 1 : -2]
        tr, ret = body[-2], body[-1]
        if not (
            isinstance(tr, ast.Try)
            and [ast.unparse(h.type) if h.type else "" for h in tr.handlers]
            == ["_ReturnType", "_ExitType"]
            and not tr.orelse
            and not tr.finalbody
            and isinstance(ret, ast.Return)
            and isinstance(ret.value, ast.Tuple)
        ):
            raise FastPathUnsupported(f"sub-control {sub} shape")
        # what ``_rN[i]`` (i >= 1) holds: the frame field the return tuple names
        outs: list[str] = []
        for e in ret.value.elts[1:]:
            ch = _chain(e)
            if ch is None or len(ch) != 2 or ch[0] != "F":
                raise FastPathUnsupported(f"sub-control {sub} shape")
            outs.append(ch[1])

        k = next(self.uid)
        srw = _Rewriter(self.mod, {}, self.uid)
        pre: list[ast.stmt] = []
        for f, v in fields.items():
            if f in refs:
                if f not in pnames:
                    raise FastPathUnsupported(f"sub-control {sub}: {f}")
                arg = args[pnames.index(f)]
                ch = _chain(arg)
                if ch is not None and ch[0] == "F" and len(ch) > 1 and ch[1] in rw.refs:
                    ch = [*rw.refs[ch[1]], *ch[2:]]  # the caller's own reference, passed on
                if ch is None or ch[0] != "C":
                    raise FastPathUnsupported(f"sub-control argument {ast.unparse(arg)}")
                srw.refs[f] = ch
                continue
            if v is None:
                raise FastPathUnsupported(f"non-constant initial value of {sub}.{f}")
            local = srw.frame[f] = f"fs{k}_{f}"
            if f in pnames:
                value = rw.visit(copy.deepcopy(args[pnames.index(f)]))
            else:
                value = ast.Constant(v)
            pre.append(_assign(local, value))
        inner = self.block(list(tr.body), srw)
        if _raises(inner, "_RETURN"):
            inner = [
                ast.Try(
                    inner,
                    [ast.ExceptHandler(ast.Name("_ReturnType", ast.Load()), None, [ast.Pass()])],
                    [],
                    [],
                )
            ]
        back: list[ast.stmt] = []
        for idx, target in copy_out:
            if not 1 <= idx <= len(outs) or outs[idx - 1] not in srw.frame:
                raise FastPathUnsupported(f"sub-control {sub}: copy-out {idx}")
            tgt = rw.visit(copy.deepcopy(target))
            back.append(ast.Assign([tgt], ast.Name(srw.frame[outs[idx - 1]], ast.Load()), lineno=0))
        if back and _raises(inner, "_EXIT"):
            inner = [
                ast.Try(
                    inner,
                    [
                        ast.ExceptHandler(
                            ast.Name("_ExitType", ast.Load()),
                            None,
                            [*copy.deepcopy(back), ast.Raise(ast.Name("_EXIT", ast.Load()))],
                        )
                    ],
                    [],
                    [],
                )
            ]
        return [*pre, *self.block(list(init), srw), *inner, *back]

    def stmt(self, st: ast.stmt, rw: _Rewriter) -> list[ast.stmt]:
        # alias for parser/deparser code: ``_h = C.hdr.<h>``
        if (
            isinstance(st, ast.Assign)
            and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Name)
            and st.targets[0].id == "_h"
        ):
            ch = _chain(st.value)
            if (
                ch is None
                or len(ch) != 3
                or ch[:2] != ["C", "hdr"]
                or ch[2] not in self.mod.headers
            ):
                raise FastPathUnsupported(f"_h = {ast.unparse(st.value)}")
            rw.alias = ch[2]
            return []
        # ``F = None`` / ``F = F_x()``: the frame is made of locals
        if (
            isinstance(st, ast.Assign)
            and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Name)
            and st.targets[0].id == "F"
        ):
            return []
        # ``_advance(C, bits)``
        if (
            isinstance(st, ast.Expr)
            and isinstance(st.value, ast.Call)
            and isinstance(st.value.func, ast.Name)
            and st.value.func.id == "_advance"
        ):
            call = st.value
            if len(call.args) != 2 or not (
                isinstance(call.args[0], ast.Name) and call.args[0].id == "C"
            ):
                raise FastPathUnsupported("_advance")
            bits = rw.visit(copy.deepcopy(call.args[1]))
            return [
                ast.Assign(
                    [ast.Name("_off", ast.Store())],
                    ast.Call(
                        ast.Name("_advance_b", ast.Load()),
                        [ast.Name("_buf", ast.Load()), ast.Name("_off", ast.Load()), bits],
                        [],
                    ),
                    lineno=0,
                )
            ]
        # tables: ``t_N(C, F)`` / ``x = t_N(C, F)[k]`` / ``if [not] t_N(C, F)[k]:``
        tcall = self._table_call(st)
        if tcall is not None:
            tname, kind, node = tcall
            pre, a_var, hit_var = self.table(tname, rw)
            if kind == "stmt":
                return pre
            if kind == "assign":
                assert isinstance(st, ast.Assign)
                idx = node
                val = ast.Name(a_var if idx == 0 else hit_var, ast.Load())
                tgt = rw.visit(copy.deepcopy(st.targets[0]))
                return [*pre, ast.Assign([tgt], val, lineno=0)]
            assert isinstance(st, ast.If)
            idx, negate = node
            test: ast.expr = ast.Name(a_var if idx == 0 else hit_var, ast.Load())
            if negate:
                test = ast.UnaryOp(ast.Not(), test)
            body = self._sub(st.body, rw)
            orelse = self._sub(st.orelse, rw)
            return [*pre, ast.If(test, body or [ast.Pass()], orelse)]
        # direct action call ``a_N(C, F, args...)``
        if (
            isinstance(st, ast.Expr)
            and isinstance(st.value, ast.Call)
            and isinstance(st.value.func, ast.Name)
            and st.value.func.id.startswith("a_")
        ):
            c = st.value
            if len(c.args) < 2 or not all(
                isinstance(a, ast.Name) and a.id == n
                for a, n in zip(c.args[:2], ("C", "F"), strict=False)
            ):
                raise FastPathUnsupported("action call")
            args = [rw.visit(copy.deepcopy(a)) for a in c.args[2:]]
            return self.action(st.value.func.id, args, None, rw)
        if isinstance(st, ast.Return) and st.value is not None:
            raise FastPathUnsupported("return with a value")
        if isinstance(st, ast.If):
            self._check(st.test)
            test = rw.visit(copy.deepcopy(st.test))
            return [ast.If(test, self._sub(st.body, rw) or [ast.Pass()], self._sub(st.orelse, rw))]
        if isinstance(st, ast.Try):
            handlers = []
            for h in st.handlers:
                nh = copy.copy(h)
                nh.body = self._sub(h.body, rw) or [ast.Pass()]
                handlers.append(nh)
            return [
                ast.Try(
                    self._sub(st.body, rw) or [ast.Pass()],
                    handlers,
                    self._sub(st.orelse, rw),
                    self._sub(st.finalbody, rw),
                )
            ]
        if not isinstance(
            st, (ast.Assign, ast.AugAssign, ast.Expr, ast.Raise, ast.Pass, ast.Return)
        ):
            what = (
                "a loop (a parser whose states form a cycle)" if isinstance(st, ast.While) else ""
            )
            raise FastPathUnsupported(what or f"a {type(st).__name__} statement")
        self._check(st)
        return [rw.visit(copy.deepcopy(st))]

    @staticmethod
    def _check(node: ast.AST) -> None:
        for n in ast.walk(node):
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name)
                and (n.func.id.startswith(("t_", "a_", "sub_", "st_", "_look_", "_ext_")))
            ):
                raise FastPathUnsupported(f"call of {n.func.id} in an unexpected place")
            if isinstance(n, (ast.Lambda, ast.NamedExpr)):
                raise FastPathUnsupported(f"a {type(n).__name__} expression")

    def _sub(self, stmts: list[ast.stmt], rw: _Rewriter) -> list[ast.stmt]:
        saved = rw.alias
        out = self.block(stmts, rw)
        rw.alias = saved
        return out

    @staticmethod
    def _is_tcall(node: ast.expr) -> str | None:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id.startswith("t_")
            and len(node.args) == 2
            and all(isinstance(a, ast.Name) for a in node.args)
            and [a.id for a in node.args if isinstance(a, ast.Name)] == ["C", "F"]
        ):
            return node.func.id
        return None

    def _table_call(self, st: ast.stmt) -> tuple[str, str, Any] | None:
        if isinstance(st, ast.Expr):
            t = self._is_tcall(st.value)
            return (t, "stmt", None) if t else None
        if (
            isinstance(st, ast.Assign)
            and isinstance(st.value, ast.Subscript)
            and isinstance(st.value.slice, ast.Constant)
        ):
            t = self._is_tcall(st.value.value)
            return (t, "assign", st.value.slice.value) if t else None
        if isinstance(st, ast.If):
            test = st.test
            negate = False
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, negate = test.operand, True
            if isinstance(test, ast.Subscript) and isinstance(test.slice, ast.Constant):
                t = self._is_tcall(test.value)
                return (t, "if", (test.slice.value, negate)) if t else None
        return None

    def table(self, tname: str, rw: _Rewriter) -> tuple[list[ast.stmt], str, str]:
        fn = self.mod.funcs.get(tname)
        acts = self.mod.act_maps.get(tname)
        if fn is None or acts is None or len(fn.body) < 2:
            raise FastPathUnsupported(f"table {tname}")
        k = next(self.uid)
        names = {
            "a": f"_ta{k}",
            "args": f"_targs{k}",
            "hit": f"_thit{k}",
            "d": f"_td{k}",
            "e": f"_te{k}",
        }
        *lookup, dispatch, ret = fn.body
        if not (
            isinstance(ret, ast.Return)
            and isinstance(dispatch, ast.Expr)
            and isinstance(dispatch.value, ast.Call)
            and isinstance(dispatch.value.func, ast.Subscript)
        ):
            raise FastPathUnsupported(f"table {tname} shape")
        saved = rw.renames
        rw.renames = {**saved, **names}
        try:
            pre = self.block(lookup, rw)
        finally:
            rw.renames = saved
        # dispatch: if/elif over the table's actions
        chain: list[ast.stmt] = []
        for aid, aname in acts.items():
            body = self.action(aname, None, names["args"], rw) or [ast.Pass()]
            test = ast.Compare(ast.Name(names["a"], ast.Load()), [ast.Eq()], [ast.Constant(aid)])
            chain.append(ast.If(test, body, []))
        for i in range(len(chain) - 1, 0, -1):
            prev = chain[i - 1]
            assert isinstance(prev, ast.If)
            prev.orelse = [chain[i]]
        if chain:
            last = chain[-1]
            assert isinstance(last, ast.If)
            # an unknown action id cannot happen (the control plane checks); raise like the
            # general path's dict lookup would
            last.orelse = [
                ast.Raise(
                    ast.Call(
                        ast.Name("KeyError", ast.Load()), [ast.Name(names["a"], ast.Load())], []
                    ),
                    None,
                )
            ]
        return [*pre, *chain[:1]], names["a"], names["hit"]

    def action(
        self, aname: str, args: list[ast.expr] | None, args_var: str | None, rw: _Rewriter
    ) -> list[ast.stmt]:
        fn = self.mod.funcs.get(aname)
        if fn is None:
            raise FastPathUnsupported(f"action {aname}")
        for node in ast.walk(fn):
            if isinstance(node, ast.Return) or (
                isinstance(node, ast.Name) and node.id == "_RETURN"
            ):
                raise FastPathUnsupported(f"return in action {aname}")
        params = [a.arg for a in fn.args.args[2:]]
        out: list[ast.stmt] = []
        if params:
            if args is not None:
                if len(args) != len(params):
                    raise FastPathUnsupported(f"action {aname} arity")
                for p, a in zip(params, args, strict=True):
                    out.append(ast.Assign([ast.Name(p, ast.Store())], a, lineno=0))
            else:
                assert args_var is not None
                out.append(
                    ast.Assign(
                        [ast.Tuple([ast.Name(p, ast.Store()) for p in params], ast.Store())],
                        ast.Name(args_var, ast.Load()),
                        lineno=0,
                    )
                )
        out.extend(self.block(fn.body, rw))
        return out


def _raises(stmts: list[ast.stmt], name: str) -> bool:
    """Whether ``stmts`` contain ``raise <name>`` (``_EXIT``, ``_RETURN``)."""
    return any(
        isinstance(n, ast.Raise) and isinstance(n.exc, ast.Name) and n.exc.id == name
        for st in stmts
        for n in ast.walk(st)
    )


def _frame(mod: _Module, block: str, prefix: str) -> tuple[dict[str, str], list[ast.stmt]]:
    fields = mod.frame_fields(block)
    names = {f: f"{prefix}_{f}" for f in fields}
    init: list[ast.stmt] = [_assign(names[f], ast.Constant(v)) for f, v in fields.items()]
    return names, init


def _assign(name: str, value: ast.expr) -> ast.stmt:
    return ast.Assign([ast.Name(name, ast.Store())], value, lineno=0)


def _stores(stmts: list[ast.stmt]) -> set[str]:
    out: set[str] = set()
    for st in stmts:
        for node in ast.walk(st):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
    return out


_TEMPLATE = """
def fast(port, frames, t0, mcast, out, drop, digest, qdepth):
    for _buf in frames:
        try:
            INIT
            _digests = ()
            s_ingress_port = port
            s_packet_length = len(_buf)
            now = (_monotonic_ns() // 1000 - t0) & CLOCK_MASK
            s_ingress_global_timestamp = now
            _off = 0
            _path = -1
            try:
                while True:
                    PARSE
                    break
            except _ParserError as _pe:
                s_parser_error = _pe.code
            _poff = _off
            VERIFY
            INGRESS
            if _digests:
                digest(_digests)
            END_OF_INGRESS
            _multi = len(_reps) > 1
            if _multi:
                SNAPSHOT
            for _eport, _rid in _reps:
                if _multi:
                    RESTORE
                s_egress_port = _eport
                s_egress_rid = _rid
                s_egress_spec = _EGRESS_SPEC0
                s_egress_global_timestamp = now
                QUEUE
                EGRESS
                END_OF_EGRESS
                COMPUTE
                DEPARSE
                out.append((_eport, _data))
        except Exception:  # never let a packet kill the caller's thread
            drop(port, 'internal_error')
"""


def build_fast(
    tree: ast.Module, facts: ProgramFacts, pack_formats: Mapping[str, str]
) -> ast.Module:
    """The module that defines ``fast(...)`` (see the module docstring) for a program: ``tree``
    is the general backend's module (read, never modified), ``facts`` what the checker recorded
    about the program, ``pack_formats`` the general backend's one-call header packers
    (:attr:`~.general.GeneralModule.pack_formats`). Raises :class:`FastPathUnsupported` with the
    reason when the program is not covered."""
    mod = _Module(tree, facts, pack_formats)
    b = _Builder(mod)

    def run(block: str, prefix: str) -> list[ast.stmt]:
        names, init = _frame(mod, block, prefix)
        rw = _Rewriter(mod, names, b.uid)
        fn = mod.funcs.get(block)
        if fn is None:
            raise FastPathUnsupported(f"no {block}()")
        body = fn.body
        if block != "deparse":
            return [*init, *b.block(body, rw)]
        if not (body and isinstance(body[-1], ast.Return) and body[-1].value is not None):
            raise FastPathUnsupported("deparser shape")
        data = rw.visit(copy.deepcopy(body[-1].value))
        return [*init, *b.block(body[:-1], rw), _assign("_data", data)]

    parse = run("parse", "fp")
    raw: dict[str, int] = {}  # header -> struct items kept as r_<header>_<i>
    extract_ids: set[int] = set()
    parse = _raw_extracts(parse, mod, raw, extract_ids)
    written = _stores_except(parse, extract_ids)  # before the rewrites below copy statements
    parse = _fold_offsets(parse)
    paths: list[_Path | None] = []
    parse = _accept_paths(
        parse, _PathState({h: False for h in mod.headers}, {h: None for h in mod.headers}, 0), paths
    )
    verify = run("verify", "fv")
    ingress = run("ingress", "fi")
    egress = run("egress", "fe")
    compute = run("compute", "fc")
    deparse = run("deparse", "fd")
    for blk in (verify, ingress, egress, compute, deparse):
        for st in blk:
            for node in ast.walk(st):
                if isinstance(node, ast.Return):
                    raise FastPathUnsupported("return in a control")

    # deparser arguments made only of fields nothing but an extract writes are the extract's
    # raw struct items (fields only the deparser reads then need no splitting at all)
    written |= _stores([*verify, *ingress, *egress, *compute])
    _raw_deparse(deparse, mod, raw, written)

    state: list[str] = []
    values: list[Any] = []
    for h, fields in mod.headers.items():
        for f, v in fields.items():
            state.append(f"h_{h}_{f}")
            values.append(v)
        for i in range(raw.get(h, 0)):
            state.append(f"r_{h}_{i}")
            values.append(0)  # = the packed form of all-zero fields
    for f, v in mod.meta.items():
        state.append(f"m_{f}")
        values.append(v)
    for f, v in mod.std.items():
        state.append(f"s_{f}")
        values.append(v)
    # one unpack of a constant tuple: half the cost of an assignment per local
    init: list[ast.stmt] = [
        ast.Assign(
            [ast.Tuple([ast.Name(n, ast.Store()) for n in state], ast.Store())],
            ast.Constant(tuple(values)),  # type: ignore[arg-type]
            lineno=0,
        )
    ]
    written = _stores([*egress, *compute, *deparse])
    snap = [n for n in state if n in written]
    if snap:
        tup = ast.Tuple([ast.Name(n, ast.Load()) for n in snap], ast.Load())
        snapshot = [_assign("_snap", tup)]
        restore: list[ast.stmt] = [
            ast.Assign(
                [ast.Tuple([ast.Name(n, ast.Store()) for n in snap], ast.Store())],
                ast.Name("_snap", ast.Load()),
                lineno=0,
            )
        ]
    else:
        snapshot = [ast.Pass()]
        restore = [ast.Pass()]

    # headers valid at the deparser are a function of the parser path unless a control
    # changes validity: then one combined struct pack per path instead of one per header
    validity = {f"h_{h}__v_" for h in mod.headers}
    pre: list[ast.stmt] = []
    if not (validity & _stores([*verify, *ingress, *egress, *compute])):
        deparse = _deparse_per_path(deparse, paths, mod, pre)

    # the queueing fields, per copy, only for a program that reads them after the TM
    queue: list[ast.stmt] = [ast.Pass()]
    if facts.reads_std(QUEUE_FIELDS, ("egress", "compute", "deparser")):
        queue = ast.parse(
            "s_enq_qdepth = s_deq_qdepth = qdepth(_eport, out)\n"
            f"s_enq_timestamp = now & {ENQ_TIMESTAMP_MASK}\n"
            "s_deq_timedelta = 0\n"
        ).body

    fast = ast.parse(_TEMPLATE).body[0]
    assert isinstance(fast, ast.FunctionDef)
    parts = {
        "INIT": init,
        "PARSE": parse or [ast.Pass()],
        "VERIFY": verify,
        "INGRESS": ingress,
        "END_OF_INGRESS": _end_of_ingress(),
        "SNAPSHOT": snapshot,
        "RESTORE": restore,
        "QUEUE": queue,
        "EGRESS": egress,
        "END_OF_EGRESS": _end_of_egress(),
        "COMPUTE": compute,
        "DEPARSE": deparse,
    }
    fast = _Splice(parts).visit(fast)
    assert isinstance(fast, ast.FunctionDef)
    _cleanup(fast)
    out = ast.Module([*pre, fast], [])
    ast.fix_missing_locations(out)
    return out


_SAFE_OPS = (ast.Add, ast.Sub, ast.Mult, ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift, ast.RShift)


def _pure(e: ast.AST) -> bool:
    """Whether dropping the expression changes nothing: no calls (but the clock, so that a
    program that reads no timestamp skips it), nothing that can raise."""
    if isinstance(e, (ast.Name, ast.Constant)):
        return True
    if isinstance(e, ast.BinOp):
        ok = isinstance(e.op, _SAFE_OPS) or (
            isinstance(e.op, (ast.FloorDiv, ast.Mod))
            and isinstance(e.right, ast.Constant)
            and isinstance(e.right.value, int)
            and e.right.value != 0
        )
        return ok and _pure(e.left) and _pure(e.right)
    if isinstance(e, ast.UnaryOp):
        return _pure(e.operand)
    if isinstance(e, ast.BoolOp):
        return all(_pure(v) for v in e.values)
    if isinstance(e, ast.Compare):
        return _pure(e.left) and all(_pure(c) for c in e.comparators)
    if isinstance(e, ast.IfExp):
        return _pure(e.test) and _pure(e.body) and _pure(e.orelse)
    if isinstance(e, ast.Call):
        return isinstance(e.func, ast.Name) and e.func.id == "_monotonic_ns" and not e.args
    return False


class _Peephole(ast.NodeTransformer):
    """``x >> 0`` and ``x << 0`` (from slices ``[7:0]``) are ``x``."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if (
            isinstance(node.op, (ast.RShift, ast.LShift))
            and isinstance(node.right, ast.Constant)
            and node.right.value == 0
        ):
            return node.left
        return node


def _cleanup(fn: ast.FunctionDef) -> None:
    """Peepholes, then drop stores nobody reads (to a fixpoint): pure assignments to such
    names, and such names from the initialising tuple unpack."""
    _Peephole().visit(fn)
    _drop_aliases(fn)
    while True:
        loads = {
            n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
        removed = False
        for node in ast.walk(fn):
            for field in ("body", "orelse", "finalbody"):
                stmts = getattr(node, field, None)
                if not isinstance(stmts, list):
                    continue
                if not stmts:  # emptied by an earlier rewrite: a body needs a statement
                    if field == "body":
                        node.body = [ast.Pass()]  # type: ignore[attr-defined]
                    continue
                if not isinstance(stmts[0], ast.stmt):
                    continue
                keep: list[ast.stmt] = []
                for st in stmts:
                    if isinstance(st, ast.Assign) and len(st.targets) == 1:
                        tgt = st.targets[0]
                        if isinstance(tgt, ast.Name) and tgt.id not in loads and _pure(st.value):
                            removed = True
                            continue
                        init: Any = (
                            st.value.value if isinstance(st.value, ast.Constant) else None
                        )  # the initialising unpack of a constant tuple
                        if isinstance(tgt, ast.Tuple) and isinstance(init, tuple):
                            pairs = [
                                (t, v)
                                for t, v in zip(tgt.elts, init, strict=True)
                                if not (isinstance(t, ast.Name) and t.id not in loads)
                            ]
                            if len(pairs) != len(tgt.elts):
                                removed = True
                                if not pairs:
                                    continue
                                keep.append(
                                    ast.Assign(
                                        [ast.Tuple([t for t, _ in pairs], ast.Store())],
                                        ast.Constant(tuple(v for _, v in pairs)),  # type: ignore[arg-type]
                                        lineno=0,
                                    )
                                )
                                continue
                    keep.append(st)
                setattr(node, field, keep or [ast.Pass()])
        if not removed:
            return


def _drop_aliases(fn: ast.FunctionDef) -> None:
    """``_b = _buf`` (the parser's and deparser's name for the frame) is ``_buf``; without a
    digest statement, the template's ``_digests`` bookkeeping goes."""
    stores: dict[str, list[ast.expr]] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    stores.setdefault(t.id, []).append(n.value)
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and isinstance(
            n.target, ast.Name
        ):
            stores.setdefault(n.target.id, []).append(ast.Constant(None))
        elif isinstance(n, (ast.For, ast.comprehension)):
            for x in ast.walk(n.target):
                if isinstance(x, ast.Name):
                    stores.setdefault(x.id, []).append(ast.Constant(None))
        elif isinstance(n, ast.Tuple) and isinstance(n.ctx, ast.Store):
            for e in n.elts:
                if isinstance(e, ast.Name):
                    stores.setdefault(e.id, []).append(ast.Constant(None))
    alias = all(isinstance(v, ast.Name) and v.id == "_buf" for v in stores.get("_b", []))
    no_digest = [type(v) for v in stores.get("_digests", [])] == [ast.Tuple]

    class Rewrite(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if alias and node.id == "_b" and isinstance(node.ctx, ast.Load):
                return ast.copy_location(ast.Name("_buf", ast.Load()), node)
            return node

        def visit_Assign(self, node: ast.Assign) -> ast.AST | None:
            t = node.targets[0]
            if (
                len(node.targets) == 1
                and isinstance(t, ast.Name)
                and ((alias and t.id == "_b") or (no_digest and t.id == "_digests"))
            ):
                return None
            return self.generic_visit(node)

        def visit_If(self, node: ast.If) -> ast.AST | None:
            if no_digest and isinstance(node.test, ast.Name) and node.test.id == "_digests":
                return None
            return self.generic_visit(node)

    Rewrite().visit(fn)


def _assigned_call(st: ast.stmt, prefix: str) -> tuple[ast.Assign, ast.Call, str] | None:
    """``target = f(...)`` (one target) where ``f`` is a name starting with ``prefix``: the
    assignment, the call and ``f``; None for anything else."""
    if not (
        isinstance(st, ast.Assign)
        and len(st.targets) == 1
        and isinstance(st.value, ast.Call)
        and isinstance(st.value.func, ast.Name)
        and st.value.func.id.startswith(prefix)
    ):
        return None
    return st, st.value, st.value.func.id


def _raw_extracts(
    stmts: list[ast.stmt], mod: _Module, raw: dict[str, int], extract_ids: set[int]
) -> list[ast.stmt]:
    """Give each extract's struct items names of their own: ``_u0, _u1 = _SU_t(...)``
    followed by ``h_X_a = <_u0, _u1 ...>`` … ``h_X__v_ = True`` becomes
    ``r_X_0, r_X_1 = _SU_t(...)`` and the field assignments read those. ``raw[X]`` is the
    item count; the field assignments' ids go to ``extract_ids`` (they are not "writes")."""
    fields_of = {f"h_{h}_{f}": h for h, fs in mod.headers.items() for f in fs}
    out: list[ast.stmt] = []
    i = 0
    while i < len(stmts):
        st = stmts[i]
        if isinstance(st, ast.If):
            st.body = _raw_extracts(st.body, mod, raw, extract_ids)
            st.orelse = _raw_extracts(st.orelse, mod, raw, extract_ids)
        found = _assigned_call(st, "_SU_")
        target = found[0].targets[0] if found is not None else None
        if (
            found is not None
            and isinstance(target, ast.Tuple)
            and all(isinstance(e, ast.Name) for e in target.elts)
        ):
            temps = [e.id for e in target.elts if isinstance(e, ast.Name)]
            j = i + 1
            header = None
            while j < len(stmts):
                a = stmts[j]
                if not (
                    isinstance(a, ast.Assign)
                    and len(a.targets) == 1
                    and isinstance(a.targets[0], ast.Name)
                    and a.targets[0].id in fields_of
                ):
                    break
                h = fields_of[a.targets[0].id]
                if header is None:
                    header = h
                if h != header or not all(
                    isinstance(n, (ast.Name, ast.Constant, ast.BinOp, ast.operator, ast.Load))
                    for n in ast.walk(a.value)
                ):
                    break
                j += 1
            if header is not None and raw.get(header, len(temps)) == len(temps):
                raw[header] = len(temps)
                names = {t: f"r_{header}_{k}" for k, t in enumerate(temps)}
                found[0].targets[0] = ast.Tuple(
                    [ast.Name(names[t], ast.Store()) for t in temps], ast.Store()
                )
                out.append(st)
                for a in stmts[i + 1 : j]:
                    renamed = _Rename(names).visit(a)
                    extract_ids.add(id(renamed))
                    out.append(renamed)
                i = j
                continue
        out.append(st)
        i += 1
    return out


def _stores_except(stmts: list[ast.stmt], skip: set[int]) -> set[str]:
    """Names stored by ``stmts`` outside the statements whose ids are in ``skip``."""
    out: set[str] = set()

    def walk(node: ast.AST) -> None:
        if id(node) in skip:
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        for child in ast.iter_child_nodes(node):
            walk(child)

    for st in stmts:
        walk(st)
    return out


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        new = self.names.get(node.id)
        return ast.copy_location(ast.Name(new, node.ctx), node) if new else node


def _raw_deparse(
    deparse: list[ast.stmt], mod: _Module, raw: dict[str, int], written: set[str]
) -> None:
    """In the deparser's ``if h_X__v_: P.append(_SP_X(args))``, an argument made only of
    fields of X that nothing but an extract writes becomes X's raw struct item."""
    for node in ast.walk(ast.Module(deparse, [])):
        if not (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Name)
            and node.test.id.startswith("h_")
            and node.test.id.endswith("__v_")
        ):
            continue
        h = node.test.id[2:-4]
        if h not in raw or len(node.body) != 1 or not isinstance(node.body[0], ast.Expr):
            continue
        call = node.body[0].value
        if not (
            isinstance(call, ast.Call)
            and len(call.args) == 1
            and isinstance(call.args[0], ast.Call)
            and len(call.args[0].args) == raw[h]
        ):
            continue
        args = call.args[0].args
        prefix = f"h_{h}_"
        for k, a in enumerate(args):
            names = [n.id for n in ast.walk(a) if isinstance(n, ast.Name)]
            if names and all(
                n.startswith(prefix)
                and n != f"{prefix}_v_"
                and n[len(prefix) :] in mod.headers[h]
                and n not in written
                for n in names
            ):
                args[k] = ast.Name(f"r_{h}_{k}", ast.Load())


_OFFSETS = ("_off", "_o", "_e")  # the parser's cursor and its extract temporaries


class _Subst(ast.NodeTransformer):
    def __init__(self, known: dict[str, int]) -> None:
        self.known = known

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.known:
            return ast.copy_location(ast.Constant(self.known[node.id]), node)
        return node


def _const_int(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _const_int(node.left), _const_int(node.right)
        if a is not None and b is not None:
            return a + b
    return None


def _fold_offsets(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """Constant offsets in the parser: along a path of fixed-size extracts the cursor is a
    compile-time constant, so ``_o = _off; _e = _o + 14; if _e > _n: ...; _off = _e``
    becomes ``if 14 > _n: ...; _off = 14`` and the unpack reads at a constant offset.
    ``_off`` itself is always stored (a parser error reads it); ``_o``/``_e`` are stored
    only where a later join needs them."""
    try:
        out, _ = _fold(stmts, {"_off": 0})
    except FastPathUnsupported:
        return stmts
    return out


def _fold(stmts: list[ast.stmt], known: dict[str, int]) -> tuple[list[ast.stmt], dict[str, int]]:
    out: list[ast.stmt] = []
    for st in stmts:
        if (
            isinstance(st, ast.Assign)
            and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Name)
            and st.targets[0].id in _OFFSETS
        ):
            name = st.targets[0].id
            value = _Subst(known).visit(copy.deepcopy(st.value))
            c = _const_int(value)
            if c is None:
                known.pop(name, None)
                out.append(ast.Assign(st.targets, value, lineno=0))
            else:
                known[name] = c
                if name == "_off":
                    out.append(_assign(name, ast.Constant(c)))
            continue
        if isinstance(st, ast.If):
            test = _Subst(known).visit(copy.deepcopy(st.test))
            body, kb = _fold(st.body, dict(known))
            orelse, ke = _fold(st.orelse, dict(known))
            ends = [(b, k) for b, k in ((body, kb), (orelse, ke)) if not _terminates(b)]
            merged: dict[str, int] = {}
            for name in _OFFSETS:
                vals = {k.get(name) for _, k in ends}
                if len(vals) == 1 and None not in vals:
                    merged[name] = vals.pop()  # type: ignore[assignment]
                elif not ends:
                    pass
                else:  # not one constant after the join: store it where it was constant
                    for b, k in ends:
                        if name in k:
                            b.append(_assign(name, ast.Constant(k[name])))
            if ends:
                known.clear()
                known.update(merged)
            out.append(ast.If(test, body or [ast.Pass()], orelse))
            continue
        if isinstance(st, (ast.Try, ast.While, ast.For, ast.With)):
            raise FastPathUnsupported("parser control flow")
        for node in ast.walk(st):
            if (
                isinstance(node, ast.Name)
                and isinstance(node.ctx, ast.Store)
                and node.id in _OFFSETS
            ):
                raise FastPathUnsupported("parser offset")
        out.append(_Subst(known).visit(copy.deepcopy(st)))
    return out, known


def _terminates(stmts: list[ast.stmt]) -> bool:
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Break)):
        return True
    if isinstance(last, ast.If):
        return _terminates(last.body) and _terminates(last.orelse)
    return False


class _PathState:
    """What the parser knows on a path: header validity, each extracted header's input
    offset, the cursor (None where not a compile-time fact)."""

    def __init__(
        self, valid: dict[str, bool | None], where: dict[str, int | None], off: int | None
    ) -> None:
        self.valid = valid
        self.where = where
        self.off = off

    def copy(self) -> _PathState:
        return _PathState(dict(self.valid), dict(self.where), self.off)

    def join(self, ends: list[_PathState]) -> None:
        """The state after an ``if`` whose falling-through branches end in ``ends``."""
        if not ends:
            return
        for d, name in ((self.valid, "valid"), (self.where, "where")):
            for h in list(d):
                vals = {getattr(e, name)[h] for e in ends}
                d[h] = vals.pop() if len(vals) == 1 else None
        offs = {e.off for e in ends}
        self.off = offs.pop() if len(offs) == 1 else None


@dataclass
class _Path:
    valid: dict[str, bool]
    where: dict[str, int | None]
    end: int | None  # the cursor at accept: where the payload starts


def _accept_paths(
    stmts: list[ast.stmt], state: _PathState, paths: list[_Path | None]
) -> list[ast.stmt]:
    """Parser statements with each ``return`` (accept) replaced by ``_path = k; break``;
    ``paths[k]`` is what is known at that accept (None where validity is not known)."""
    out: list[ast.stmt] = []
    for st in stmts:
        if isinstance(st, ast.Return):
            k = len(paths)
            known = all(v is not None for v in state.valid.values())
            paths.append(
                _Path({h: bool(v) for h, v in state.valid.items()}, dict(state.where), state.off)
                if known
                else None
            )
            out.append(_assign("_path", ast.Constant(k if known else -1)))
            out.append(ast.Break())
            continue
        if isinstance(st, ast.If):
            body_state, else_state = state.copy(), state.copy()
            body = _accept_paths(st.body, body_state, paths)
            orelse = _accept_paths(st.orelse, else_state, paths)
            state.join(
                [
                    v
                    for b, v in ((st.body, body_state), (st.orelse, else_state))
                    if not _terminates(b)
                ]
            )
            out.append(ast.If(st.test, body or [ast.Pass()], orelse))
            continue
        if isinstance(st, ast.Try):
            for node in ast.walk(st):
                if isinstance(node, ast.Return):
                    raise FastPathUnsupported("accept inside try in the parser")
        # an extract's raw unpack: r_X_0, ... = _SU_t(_buf, <offset>)
        if (
            isinstance(st, ast.Assign)
            and isinstance(st.targets[0], ast.Tuple)
            and isinstance(st.value, ast.Call)
            and isinstance(st.value.func, ast.Name)
            and st.value.func.id.startswith("_SU_")
        ):
            first = st.targets[0].elts[0] if st.targets[0].elts else None
            if isinstance(first, ast.Name) and first.id.startswith("r_"):
                h = first.id[2:].rsplit("_", 1)[0]
                at = st.value.args[1] if len(st.value.args) == 2 else None
                if h in state.where:
                    state.where[h] = (
                        at.value if isinstance(at, ast.Constant) and type(at.value) is int else None
                    )
        for node in ast.walk(st):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                if node.id == "_off":
                    state.off = (
                        st.value.value
                        if isinstance(st, ast.Assign)
                        and isinstance(st.value, ast.Constant)
                        and type(st.value.value) is int
                        else None
                    )
                elif node.id.startswith("h_") and node.id.endswith("__v_"):
                    h = node.id[2:-4]
                    if (
                        isinstance(st, ast.Assign)
                        and isinstance(st.value, ast.Constant)
                        and isinstance(st.value.value, bool)
                        and h in state.valid
                    ):
                        state.valid[h] = st.value.value
                    elif h in state.valid:
                        state.valid[h] = None
        out.append(st)
    return out


_ITEM_SIZE = {"B": 1, "H": 2, "I": 4, "Q": 8}


def _path_pack(
    emits: list[tuple[str, str, list[ast.expr]]], path: _Path
) -> tuple[str, list[ast.expr], int | None]:
    """The format and arguments that write the headers valid on ``path``, and where in the
    input the payload may start instead (None: at ``_poff``). Items that are raw extract
    values and lie back to back in the input (2 or more) become one ``Ns`` item cut from the
    input; a run that reaches the end of the parsed headers is left to the payload slice."""
    items: list[tuple[str, ast.expr, int | None]] = []  # format, argument, input offset
    for h, fmt, args in emits:
        if not path.valid[h]:
            continue
        at = path.where.get(h)
        for i, (c, a) in enumerate(zip(fmt, args, strict=True)):
            raw = at is not None and isinstance(a, ast.Name) and a.id == f"r_{h}_{i}"
            items.append((c, copy.deepcopy(a), at if raw else None))
            if at is not None:
                at += _ITEM_SIZE[c]
    out_fmt = ""
    out_args: list[ast.expr] = []
    i = 0
    tail: int | None = None
    while i < len(items):
        c, a, at = items[i]
        j, end = i + 1, (at + _ITEM_SIZE[c]) if at is not None else None
        while j < len(items) and end is not None and items[j][2] == end:
            end += _ITEM_SIZE[items[j][0]]
            j += 1
        if at is not None and end is not None and j == len(items) and end == path.end:
            tail = at  # the payload slice starts here
            break
        if at is not None and end is not None and j - i >= 2:
            out_fmt += f"{end - at}s"
            out_args.append(
                ast.Subscript(
                    ast.Name("_buf", ast.Load()),
                    ast.Slice(ast.Constant(at), ast.Constant(end)),
                    ast.Load(),
                )
            )
            i = j
            continue
        out_fmt += c
        out_args.append(a)
        i += 1
    return out_fmt, out_args, tail


def _deparse_per_path(
    deparse: list[ast.stmt], paths: list[_Path | None], mod: _Module, pre: list[ast.stmt]
) -> list[ast.stmt]:
    """``if _path == k: <one pack of the headers valid on path k> + payload`` for every
    known parser path, the generic deparser otherwise. The generic deparser must be a
    sequence of ``if h_X__v_: P.append(_SP_X(...))``; anything else keeps it as it is."""
    emits: list[tuple[str, str, list[ast.expr]]] = []  # header, format, pack args
    for st in deparse:
        if (
            isinstance(st, ast.Assign)
            and isinstance(st.targets[0], ast.Name)
            and st.targets[0].id in ("P", "_b", "_o", "_data")
        ):
            continue
        if (
            isinstance(st, ast.Expr)
            and isinstance(st.value, ast.Call)
            and isinstance(st.value.func, ast.Attribute)
            and isinstance(st.value.func.value, ast.Name)
            and st.value.func.value.id == "P"
            and st.value.args
            and isinstance(st.value.args[0], ast.IfExp)
        ):
            continue  # the payload
        if (
            isinstance(st, ast.If)
            and isinstance(st.test, ast.Name)
            and st.test.id.startswith("h_")
            and st.test.id.endswith("__v_")
            and not st.orelse
            and len(st.body) == 1
            and isinstance(st.body[0], ast.Expr)
        ):
            call = st.body[0].value
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "append"
                and len(call.args) == 1
                and isinstance(call.args[0], ast.Call)
                and isinstance(call.args[0].func, ast.Name)
                and call.args[0].func.id in mod.pack_formats
            ):
                fmt = mod.pack_formats[call.args[0].func.id]
                if fmt.startswith("!"):
                    emits.append((st.test.id[2:-4], fmt[1:], list(call.args[0].args)))
                    continue
        return deparse  # a shape we do not specialise
    arms: list[tuple[int, list[ast.stmt]]] = []
    for k, path in enumerate(paths):
        if path is None:
            continue
        fmt, args, tail = _path_pack(emits, path)
        start = "_poff" if tail is None else str(tail)
        if not fmt:  # nothing rewritten: the frame itself (from where the headers start)
            body = ast.parse(f"_data = _buf[{start}:]").body
        else:
            name = f"_SPP{k}"
            pre.append(_assign(name, ast.parse(f"_Struct('!{fmt}').pack", mode="eval").body))
            hdr = ast.Call(ast.Name(name, ast.Load()), args, [])
            body = [
                _assign("_hd", hdr),
                *ast.parse(
                    f"_data = _hd + _buf[{start}:] if len(_buf) - {start} < 512 "
                    f"else b''.join((_hd, memoryview(_buf)[{start}:]))"
                ).body,
            ]
        arms.append((k, body))
    if not arms:
        return deparse

    def tree(arms: list[tuple[int, list[ast.stmt]]]) -> list[ast.stmt]:
        # every non-negative _path has an arm: a balanced tree of ``<`` tests finds it
        if len(arms) == 1:
            return arms[0][1]
        mid = len(arms) // 2
        test = ast.Compare(ast.Name("_path", ast.Load()), [ast.Lt()], [ast.Constant(arms[mid][0])])
        return [ast.If(test, tree(arms[:mid]), tree(arms[mid:]))]

    test = ast.Compare(ast.Name("_path", ast.Load()), [ast.Lt()], [ast.Constant(0)])
    return [ast.If(test, deparse, tree(arms))]


class _Splice(ast.NodeTransformer):
    """Replaces the template's placeholder statements (bare names) with statement lists."""

    def __init__(self, parts: dict[str, list[ast.stmt]]) -> None:
        self.parts = parts

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field, old in ast.iter_fields(node):
            if isinstance(old, list) and old and isinstance(old[0], ast.stmt):
                new: list[ast.stmt] = []
                for st in old:
                    if (
                        isinstance(st, ast.Expr)
                        and isinstance(st.value, ast.Name)
                        and st.value.id in self.parts
                    ):
                        new.extend(self.parts[st.value.id])
                    else:
                        v = self.visit(st)
                        if isinstance(v, ast.stmt):
                            new.append(v)
                setattr(node, field, new or [ast.Pass()])
            elif isinstance(old, list):
                setattr(node, field, [self.visit(x) if isinstance(x, ast.AST) else x for x in old])
            elif isinstance(old, ast.AST):
                setattr(node, field, self.visit(old))
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == "CLOCK_MASK":
            return ast.copy_location(ast.Constant(CLOCK_MASK), node)
        return node


# ------------------------------------------------------------ the traffic manager, inlined
def _name(n: str) -> ast.expr:
    return ast.Name(n, ast.Load())


def _dropped(reason: ast.expr) -> list[ast.stmt]:
    """A DROP verdict in the template: count it against the ingress port, next frame/copy."""
    call = ast.Call(_name("drop"), [_name("port"), reason], [])
    return [ast.Expr(call), ast.Continue()]


def _end_of_ingress() -> list[ast.stmt]:
    """v1model.end_of_ingress over the template's locals (no resubmit: not covered). A
    FORWARD leaves the copies in ``_reps`` and their instance type in ``s_instance_type``."""

    def forward(reps: ast.expr, itype: ast.expr) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for name, value in (("_reps", reps), ("s_instance_type", itype)):
            if not (isinstance(value, ast.Name) and value.id == name):
                out.append(_assign(name, value))
        return out

    args = {
        "resubmit": ast.Constant(False),
        "mcast_grp": _name("s_mcast_grp"),
        "egress_spec": _name("s_egress_spec"),
        "instance_type": _name("s_instance_type"),
        "groups": _name("mcast"),
        "drop_port": _name("DROP_PORT"),
    }
    return _inline_v1model(
        v1model.end_of_ingress,
        args,
        {
            DROP: lambda reason, _itype: _dropped(reason),
            FORWARD: forward,
        },
        {"replicas": "_reps"},
    )


def _end_of_egress() -> list[ast.stmt]:
    """v1model.end_of_egress over the template's locals (no recirculate: not covered); a
    TRANSMIT goes on to compute and deparser."""
    args = {
        "egress_spec": _name("s_egress_spec"),
        "drop_port": _name("DROP_PORT"),
        "recirculate": ast.Constant(False),
    }
    return _inline_v1model(
        v1model.end_of_egress,
        args,
        {
            DROP: _dropped,
            TRANSMIT: lambda _none: [],
        },
    )


@functools.cache
def _function_def(fn: Callable[..., Any]) -> ast.FunctionDef:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError) as e:  # no source: run the general path
        raise FastPathUnsupported(f"no source for v1model.{fn.__name__}") from e
    fdef = tree.body[0]
    if not (isinstance(fdef, ast.FunctionDef) and fdef.name == fn.__name__):
        raise FastPathUnsupported(f"v1model.{fn.__name__}: not a plain function")
    return fdef


def _inline_v1model(
    fn: Callable[..., Any],
    args: dict[str, ast.expr],
    verdicts: dict[int, Callable[..., list[ast.stmt]]],
    names: dict[str, str] | None = None,
) -> list[ast.stmt]:
    """The body of ``fn`` (a :mod:`..v1model` rule, in the form that module describes) as
    statements: parameters replaced by ``args``, its other locals renamed ``_tm_<name>`` (or
    as ``names`` says), the module's ``int``/``str`` constants by their values, ``if`` on a
    constant folded, and each ``return (VERDICT, *items)`` by ``verdicts[VERDICT](*items)`` —
    which must exist for every verdict still reachable. Anything else is refused."""
    what = f"v1model.{fn.__name__}"
    fdef = _function_def(fn)
    params = [a.arg for a in fdef.args.args]
    if set(params) != set(args) or fdef.args.vararg or fdef.args.kwarg or fdef.args.kwonlyargs:
        raise FastPathUnsupported(f"{what}: parameters {params}")
    body = list(fdef.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    local = {
        n.id
        for st in body
        for n in ast.walk(st)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    consts = getattr(fn, "__globals__", {})

    class Subst(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id in args:
                if not isinstance(node.ctx, ast.Load):
                    raise FastPathUnsupported(f"{what} assigns its parameter {node.id}")
                return ast.copy_location(copy.deepcopy(args[node.id]), node)
            if node.id in local:
                new = (names or {}).get(node.id, f"_tm_{node.id}")
                return ast.copy_location(ast.Name(new, node.ctx), node)
            v = consts.get(node.id, Ellipsis)
            if v is None or type(v) in (int, str, bool):
                return ast.copy_location(ast.Constant(v), node)
            raise FastPathUnsupported(f"{what} uses {node.id}")

    def lower(stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for i, st in enumerate(stmts):
            if isinstance(st, ast.Return):
                r = st.value
                v = (
                    r.elts[0].value
                    if isinstance(r, ast.Tuple) and r.elts and isinstance(r.elts[0], ast.Constant)
                    else None
                )
                if type(v) is not int or v not in verdicts:
                    raise FastPathUnsupported(
                        f"{what}: unexpected return {ast.unparse(r) if r else None}"
                    )
                assert isinstance(r, ast.Tuple)
                return [*out, *verdicts[v](*r.elts[1:])]
            if isinstance(st, ast.If):
                rest = stmts[i + 1 :]
                if isinstance(st.test, ast.Constant):  # a request the fast path never has
                    return [*out, *lower([*(st.body if st.test.value else st.orelse), *rest])]
                body = lower([*st.body, *rest])
                orelse = lower([*st.orelse, *rest])
                if body and isinstance(body[-1], ast.Continue):  # the else needs no block
                    return [*out, ast.If(st.test, body, []), *orelse]
                return [*out, ast.If(st.test, body or [ast.Pass()], orelse)]
            if not isinstance(st, ast.Assign):
                raise FastPathUnsupported(f"{what}: unexpected {ast.unparse(st)}")
            out.append(st)
        raise FastPathUnsupported(f"{what}: a path without a verdict")

    return lower([Subst().visit(copy.deepcopy(st)) for st in body])
