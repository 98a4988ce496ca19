"""A compiled P4 pipeline: front end → typed IR → Python code (two backends) + P4Info, and its
artefact.

``Pipeline.compile(path_or_source)`` preprocesses, parses and checks a v1model program into its
typed IR (:mod:`.frontend.ir`), assigns P4Runtime ids the way p4c does, and has the general
backend (:func:`.codegen.general.module_code`) write one Python module from the IR (a class per
header/struct, one parse function, a function per action, table and control); the straight-line
backend (:mod:`.codegen.straight`) builds ``fast(...)`` for the programs it covers. The module's
code object is compiled once here; each :class:`~shadowgrad.p4target.dataplane.Dataplane`
executes it once to bind its runtime state, so no AST is walked per packet.

The **pipeline artefact** (``to_device_config()``; the P4Runtime ``p4_device_config``) is UTF-8
JSON::

    {"format": "shadowgrad-p4-pipeline", "version": 1, "main": "<display name of the program>",
     "files": {"<display name>": "<source text>", ...}, "include_dirs": [...]}

i.e. the program and every non-builtin file it included, so the target can rebuild the exact
pipeline (``from_device_config``) without the files. bmv2's JSON starts with ``{"header_types"``
and is refused with a clear error.
"""

from __future__ import annotations

import ast
import json
import random as _random_mod
import struct
import sys
import time
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from types import CodeType
from typing import Any

from shadowgrad.errors import ShadowgradError

from . import p4info as _p4info
from .codegen.general import GeneralModule, build_general
from .codegen.straight import FastPathUnsupported, build_fast
from .frontend import ir as p4ir
from .frontend import model as p4model
from .frontend.checker import Checker
from .frontend.diagnostics import Diagnostic
from .frontend.lexer import Preprocessor, lex
from .frontend.parser import parse_tokens
from .v1model import QUEUE_FIELDS, egress_spec_at_egress

__all__ = [
    "ARTEFACT_FORMAT",
    "P4CompileError",
    "PacketCtx",
    "Pipeline",
]

ARTEFACT_FORMAT = "shadowgrad-p4-pipeline"


class P4CompileError(ShadowgradError, ValueError):
    """The P4 source was rejected; ``diagnostics`` lists ``file:line:col: message`` lines."""

    def __init__(self, diagnostics: list[str]) -> None:
        self.diagnostics = diagnostics
        super().__init__("\n".join(diagnostics))


# ------------------------------------------------------------------------- runtime helpers
class _ParserError(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class _Exit(Exception):  # noqa: N818 - internal control flow
    pass


_EXIT = _Exit()


class _Return(Exception):  # noqa: N818 - internal control flow
    pass


_RETURN = _Return()


class PacketCtx:
    """Per-packet state the generated code works on (headers, metadata, buffer, TM flags)."""

    # class-level defaults (hot path): a new context stores only what a packet changes
    hdr: Any = None
    meta: Any = None
    std: Any = None
    buf = b""
    off = 0
    payload_off = 0
    clone_type = 0
    clone_session = 0
    clone_fl = -1
    resubmit_fl = -1
    recirc_fl = -1
    digests: tuple[tuple[int, list[bytes]], ...] = ()  # replaced, never mutated
    truncate_len = 0


def _peek(ctx: PacketCtx, bits: int) -> int:
    nb = (bits + 7) // 8
    o = ctx.off
    if o + nb > len(ctx.buf):
        raise _ParserError(1)  # PacketTooShort
    v = int.from_bytes(ctx.buf[o : o + nb], "big")
    return v >> (nb * 8 - bits)


def _advance(ctx: PacketCtx, bits: int) -> None:
    if bits % 8:
        raise _ParserError(6)  # ParserInvalidArgument
    o = ctx.off + bits // 8
    if o > len(ctx.buf):
        raise _ParserError(1)
    ctx.off = o


def _peek_b(buf: bytes, off: int, bits: int) -> int:
    """_peek for the fast path (buffer and offset as locals)."""
    nb = (bits + 7) // 8
    if off + nb > len(buf):
        raise _ParserError(1)
    return int.from_bytes(buf[off : off + nb], "big") >> (nb * 8 - bits)


def _advance_b(buf: bytes, off: int, bits: int) -> int:
    """_advance for the fast path: returns the new offset."""
    if bits % 8:
        raise _ParserError(6)
    o = off + bits // 8
    if o > len(buf):
        raise _ParserError(1)
    return o


def _count_n(cells: list[list[int]], i: int, nbytes: int) -> None:
    """_count for the fast path (packet_length as a local)."""
    if i < len(cells):
        c = cells[i]
        c[0] += nbytes
        c[1] += 1


def _count(cells: list[list[int]], i: int, ctx: PacketCtx) -> None:
    if i < len(cells):
        c = cells[i]
        c[0] += ctx.std.packet_length
        c[1] += 1


def _rread(reg: list[int], i: int) -> int:
    return reg[i] if i < len(reg) else 0


def _rwrite(reg: list[int], i: int, v: int) -> None:
    if i < len(reg):
        reg[i] = v


def _bits(fields: tuple[tuple[int, int], ...], payload: bytes) -> bytes:
    """Concatenate (value, width) MSB-first; pad to whole bytes at the end; append payload."""
    v = 0
    total = 0
    for x, w in fields:
        v = (v << w) | (x & ((1 << w) - 1))
        total += w
    pad = (-total) % 8
    return (v << pad).to_bytes((total + pad) // 8, "big") + payload


def _bits_valid(fields: tuple[tuple[int, int, bool], ...]) -> bytes:
    """As :func:`_bits` for (value, width, include) items, leaving out those not included:
    bmv2 serialises a field list without the fields of invalid headers."""
    return _bits(tuple((x, w) for x, w, ok in fields if ok), b"")


def _hash_csum16(data: bytes, width: int) -> int:
    """Internet checksum (RFC 1071). The ones'-complement sum is byte-order independent, so
    sum native 16-bit words and swap once at the end."""
    if len(data) % 2:
        data += b"\0"
    s = sum(array("H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    if _LITTLE:
        s = ((s & 0xFF) << 8) | (s >> 8)
    return (~s & 0xFFFF) & ((1 << width) - 1)


_LITTLE = sys.byteorder == "little"


def _hash_csum16_fold(s: int, width: int) -> int:
    """The Internet checksum of data given as any non-negative ``s`` congruent to it modulo
    0xFFFF and zero only for all-zero data (generated code passes a sum of shifted fields):
    the ones'-complement sum of the 16-bit words is ``s mod 0xFFFF``, except that a non-zero
    sum that is a multiple of 0xFFFF folds to 0xFFFF."""
    r = s % 0xFFFF
    if not r and s:
        r = 0xFFFF
    return (~r & 0xFFFF) & ((1 << width) - 1)


def _crc16_table() -> list[int]:
    tab = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xA001 if c & 1 else c >> 1
        tab.append(c)
    return tab


_CRC16 = _crc16_table()


def _hash_crc16(data: bytes, width: int) -> int:
    """CRC-16/ARC (poly 0x8005 reflected, init 0): bmv2's ``crc16``."""
    c = 0
    for b in data:
        c = (c >> 8) ^ _CRC16[(c ^ b) & 0xFF]
    return c & ((1 << width) - 1)


def _hash_crc32(data: bytes, width: int) -> int:
    return zlib.crc32(data) & ((1 << width) - 1)


def _hash_identity(data: bytes, width: int) -> int:
    """bmv2's ``identity``: the first (at most) 8 bytes of the data, big-endian."""
    return int.from_bytes(data[:8], "big")


def _hash_xor16(data: bytes, width: int) -> int:
    if len(data) % 2:
        data += b"\0"
    x = 0
    for i in range(0, len(data), 2):
        x ^= (data[i] << 8) | data[i + 1]
    return x & ((1 << width) - 1)


def _hashmod(h: int, base: int, mx: int) -> int:
    """v1model ``hash``: ``base + h % max``; bmv2 treats ``max == 0`` as 1 (so: ``base``)."""
    return base + h % mx if mx else base


def _be(v: int, w: int) -> bytes:
    return (v & ((1 << w) - 1)).to_bytes((w + 7) // 8, "big")


def _div(a: int, b: int) -> int:
    return a // b if b else 0


def _mod(a: int, b: int) -> int:
    return a % b if b else 0


def _rand(lo: int, hi: int) -> int:
    return _random_mod.randint(lo, hi) if hi >= lo else lo


_HELPERS: dict[str, Any] = {
    "PacketCtx": PacketCtx,
    "_ParserError": _ParserError,
    "_EXIT": _EXIT,
    "_ExitType": _Exit,
    "_RETURN": _RETURN,
    "_ReturnType": _Return,
    "_peek": _peek,
    "_advance": _advance,
    "_count": _count,
    "_rread": _rread,
    "_peek_b": _peek_b,
    "_advance_b": _advance_b,
    "_count_n": _count_n,
    "_monotonic_ns": time.monotonic_ns,
    "_rwrite": _rwrite,
    "_bits": _bits,
    "_bits_valid": _bits_valid,
    "_hash_csum16": _hash_csum16,
    "_hash_csum16_fold": _hash_csum16_fold,
    "_hash_crc16": _hash_crc16,
    "_hash_crc32": _hash_crc32,
    "_hash_identity": _hash_identity,
    "_hash_xor16": _hash_xor16,
    "_hashmod": _hashmod,
    "_be": _be,
    "_div": _div,
    "_mod": _mod,
    "_random": _rand,
    "_new": object.__new__,
    "_Struct": struct.Struct,
}


@dataclass
class Program:
    """The bound, executable functions of one pipeline instance."""

    new_ctx: Any
    copy_ctx: Any
    reset_meta: Any
    preserve: Any
    parse: Any
    verify: Any
    ingress: Any
    egress: Any
    compute: Any
    deparse: Any
    fast: Any = None  # the straight-line fast path (``codegen.straight``), None if not covered


class _Binding:
    def __init__(self, runtime: Any) -> None:
        self.tables_by_name = {t.info.name: t for t in runtime.tables.values()}
        self.counters = {cid: c.cells for cid, c in runtime.counters.items()}
        self.registers = runtime.registers
        self.drop_port = runtime.drop_port


# ------------------------------------------------------------------------- the pipeline
class Pipeline:
    """A checked, compiled P4 program plus its P4Info (see the module docstring)."""

    def __init__(  # noqa: PLR0917
        self,
        model: p4model.ProgramModel,
        general: GeneralModule,
        files: dict[str, str],
        main: str,
        include_dirs: list[str],
        defines: dict[str, str] | None = None,
        *,
        facts: p4model.ProgramFacts,
        program: p4ir.Program,
    ) -> None:
        self.model = model
        #: the checked program's typed IR, which the general backend's module was written from
        self.ir = program
        self.defines = dict(defines or {})
        #: what the checker found out about the program (not read back from ``source``)
        self.facts = facts
        #: whether the program reads the queueing fields of standard_metadata (then each copy's
        #: egress gets the depth of its port's queue; see Dataplane.queue_depth)
        self.reads_queue = facts.reads_std(QUEUE_FIELDS)
        # the general backend's module (a tree): compiled here, read by the straight-line one
        tree = general.tree
        source = general.source
        #: the general code's one-call header packers: header type -> ``struct`` format
        self.pack_formats = general.pack_formats
        self.code = compile(tree, f"<p4:{main}>", "exec")
        #: ``fast(...)`` (the straight-line backend), compiled into the same namespace; None
        #: when the program is not covered (``fast_unsupported`` says why)
        self.fast_code: CodeType | None = None
        self.fast_unsupported: str | None = None
        try:
            fast = build_fast(tree, facts, general.pack_formats)
        except FastPathUnsupported as e:
            self.fast_unsupported = str(e)
        else:
            self.fast_code = compile(fast, f"<p4-fast:{main}>", "exec")
            source = source + "\n" + ast.unparse(fast) + "\n"
        self.source = source  # generated Python, kept for debugging (``--dump-python``)
        self.files = files
        self.main = main
        self.include_dirs = include_dirs
        self.p4info = _p4info.build_p4info(model)
        self.actions: dict[int, p4model.ActionInfo] = {a.id: a for a in model.actions}
        self.action_ids: dict[str, int] = {a.name: a.id for a in model.actions}
        self.tables: dict[int, p4model.TableInfo] = {t.id: t for t in model.tables}
        self.counters: dict[int, p4model.CounterInfo] = {c.id: c for c in model.counters}
        self.direct_counters: dict[int, p4model.CounterInfo] = {
            c.id: c for c in model.direct_counters
        }
        self.registers: dict[int, p4model.RegisterInfo] = {r.id: r for r in model.registers}
        self.digests: dict[int, p4model.DigestInfo] = {d.id: d for d in model.digests}
        self.packet_in: p4model.ControllerHeaderInfo | None = None
        self.packet_out: p4model.ControllerHeaderInfo | None = None
        for ch in model.controller_headers:
            if ch.name == "packet_in":
                self.packet_in = ch
            else:
                self.packet_out = ch
        self.errors = model.errors

    # -- construction
    @classmethod
    def compile(
        cls,
        path_or_source: str | Path,
        include_dirs: list[str | Path] | tuple[str | Path, ...] = (),
        *,
        filename: str | None = None,
        defines: dict[str, str] | None = None,
    ) -> Pipeline:
        """Compile a P4 file (a ``Path``, or a ``str`` naming an existing ``.p4`` file) or
        P4 source text (any other ``str``; shown as ``filename`` or ``<string>``)."""
        dirs = [Path(d) for d in include_dirs]
        pp = Preprocessor(dirs)
        pp.predefine(defines or {})
        is_path = isinstance(path_or_source, Path) or (
            "\n" not in path_or_source and path_or_source.endswith(".p4")
        )
        try:
            if is_path:
                p = Path(path_or_source)
                main = filename or str(path_or_source)
                pp.run_file(p, main)
            else:
                main = filename or "<string>"
                pp.run_text(str(path_or_source), main, None)
            prog = parse_tokens(lex(pp))
        except Diagnostic as d:
            raise P4CompileError([str(d)]) from None
        return cls._check(prog, dict(pp.files), main, [str(d) for d in dirs], defines)

    def to_device_config(self) -> bytes:
        doc = {
            "format": ARTEFACT_FORMAT,
            "version": 1,
            "main": self.main,
            "files": self.files,
            "include_dirs": self.include_dirs,
            "defines": self.defines,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_device_config(cls, blob: bytes, p4info: Any = None) -> Pipeline:
        """Rebuild from an artefact; if ``p4info`` is given, it must describe this program."""
        try:
            doc = json.loads(blob.decode())
        except (UnicodeDecodeError, ValueError):
            raise P4CompileError(
                [
                    "<device_config>:0:0: not a shadowgrad pipeline artefact "
                    "(expected JSON from `shadowgrad p4 compile`)"
                ]
            ) from None
        if not isinstance(doc, dict) or doc.get("format") != ARTEFACT_FORMAT:
            hint = (
                " (this looks like bmv2 JSON from p4c)"
                if isinstance(doc, dict) and "header_types" in doc
                else ""
            )
            raise P4CompileError([f"<device_config>:0:0: not a shadowgrad pipeline artefact{hint}"])
        files: dict[str, str] = doc["files"]
        main: str = doc["main"]
        pipe = cls._compile_files(main, files, doc.get("include_dirs", []), doc.get("defines", {}))
        if p4info is not None:
            pipe.check_p4info(p4info)
        return pipe

    @classmethod
    def _compile_files(
        cls, main: str, files: dict[str, str], include_dirs: list[str], defines: dict[str, str]
    ) -> Pipeline:
        pp = Preprocessor([Path(d) for d in include_dirs], virtual=files)
        pp.predefine(defines)
        try:
            pp.run_text(files[main], main, Path(main).parent)
            prog = parse_tokens(lex(pp))
        except Diagnostic as d:
            raise P4CompileError([str(d)]) from None
        except KeyError:
            raise P4CompileError(
                [f"<device_config>:0:0: artefact lacks its main file {main}"]
            ) from None
        return cls._check(prog, files, main, include_dirs, defines)

    @classmethod
    def _check(
        cls,
        prog: Any,
        files: dict[str, str],
        main: str,
        include_dirs: list[str],
        defines: dict[str, str] | None = None,
    ) -> Pipeline:
        ck = Checker(prog)
        try:
            ck.run()
        except Diagnostic as d:
            ck.diags.append(d)
        if ck.diags:
            seen: list[str] = []
            for diag in ck.diags:
                if str(diag) not in seen:
                    seen.append(str(diag))
            raise P4CompileError(seen)
        try:
            _p4info.assign_ids(ck.model)
            prog = ck.program()
            return cls(
                ck.model,
                build_general(prog, ck.action_ids(), f"<p4:{main}>"),
                files,
                main,
                include_dirs,
                defines,
                facts=ck.facts(),
                program=prog,
            )
        except P4CompileError:
            raise
        except Exception as e:  # a checked program the back end cannot lower
            # never a traceback from inside the target: the checker accepted something the
            # code generator does not handle; say so as a diagnostic (a target bug to report)
            what = f"{type(e).__name__}: {e}".splitlines()[0]
            msg = "internal error: the code generator cannot compile this program"
            raise P4CompileError([f"{main}:1:1: {msg} ({what})"]) from e

    def check_p4info(self, p4info: Any) -> None:
        """Raise P4CompileError unless ``p4info`` names the same objects with the same ids."""

        def ids(p: Any) -> set[tuple[str, int, str]]:
            out = set()
            for kind in (
                "tables",
                "actions",
                "counters",
                "direct_counters",
                "registers",
                "digests",
                "controller_packet_metadata",
            ):
                for o in getattr(p, kind):
                    out.add((kind, o.preamble.id, o.preamble.name))
            return out

        mine, theirs = ids(self.p4info), ids(p4info)
        if mine != theirs:
            diff = sorted(mine ^ theirs)[:5]
            raise P4CompileError(
                [
                    f"<device_config>:0:0: the P4Info does not match the program "
                    f"(first differences: {diff})"
                ]
            )

    def instantiate(self, runtime: Any) -> Program:
        """Bind the generated code to ``runtime`` (a Dataplane); returns the entry points."""
        ns: dict[str, Any] = dict(_HELPERS)
        ns["R"] = _Binding(runtime)
        ns["_EGRESS_SPEC0"] = egress_spec_at_egress(runtime.drop_port)
        exec(self.code, ns)  # our own generated code, compiled in Pipeline.compile
        if self.fast_code is not None:
            exec(self.fast_code, ns)
        return Program(
            ns["new_ctx"],
            ns["copy_ctx"],
            ns["reset_meta"],
            ns["preserve"],
            ns["parse"],
            ns["verify"],
            ns["ingress"],
            ns["egress"],
            ns["compute"],
            ns["deparse"],
            ns.get("fast"),
        )

    def write_p4info(self, path: str | Path) -> None:
        _p4info.write_p4info(self.p4info, path)
