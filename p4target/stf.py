"""STF (p4c's "simple test framework") files run against the software target.

An STF file is what p4c's bmv2 test runner (``backends/bmv2/bmv2stf.py``) feeds to
``simple_switch``: control-plane commands, packets in and the packets expected out. This module
gives it the same meaning against a :class:`~shadowgrad.p4target.dataplane.Dataplane`:

* ``packet PORT HEX`` injects a frame; ``expect PORT HEX [$]`` expects the next frame out of
  ``PORT`` to start with ``HEX`` (``*`` is a don't-care nibble; a trailing ``$`` also requires
  the exact length); ``expect PORT`` alone accepts any number of frames on ``PORT``.
* Only the ports named by a ``packet`` or ``expect`` are observed (bmv2's runner opens a pcap
  interface for those alone); on each, the number of frames out must equal the number expected.
* ``add TABLE [PRIORITY] KEY:VALUE ... ACTION(ARG:VALUE, ...)`` and ``setdefault TABLE
  ACTION(...)``: table and action names match exactly or by suffix, key names by the match
  field's name or its suffix after a ``.`` (``stack$0`` means ``stack[0]``); a ternary value
  with ``*`` digits masks them out (``V&&&M`` gives the mask), an lpm value is ``V/LEN`` or gets
  the length of its digits, a range is ``LO->HI``. A larger STF priority wins, as in bmv2's
  runner (which passes ``10000 - priority`` to bmv2, where lower wins).
* ``mirroring_add SESSION PORT``, ``mc_mgrp_create GID``, ``mc_node_create RID PORT...`` (node
  handles count from 0), ``mc_node_associate GID HANDLE``, ``register_write``/``register_reset``,
  ``counter_write``; ``wait`` does nothing (the target processes a packet before returning).

:func:`run_stf` returns an :class:`StfResult` whose ``errors`` say, per port, what differed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .dataplane import (
    Dataplane,
    DataplaneError,
    Exact,
    Lpm,
    Match,
    Range,
    TableEntry,
    Ternary,
)
from .frontend.model import ActionInfo, KeyInfo, TableInfo
from .pipeline import Pipeline

__all__ = ["StfError", "StfResult", "compare_packet", "run_stf", "run_stf_file"]


class StfError(ValueError):
    """A line of the STF file cannot be understood or names nothing in the program."""


@dataclass
class StfResult:
    ok: bool
    errors: list[str] = field(default_factory=list)
    packets: int = 0
    expects: int = 0
    #: every frame out of an observed port, in order
    outputs: dict[int, list[bytes]] = field(default_factory=dict)


def _lines(text: str) -> Iterator[tuple[int, str]]:
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            yield n, line


def compare_packet(expected: str, received: bytes) -> str | None:
    """None if ``received`` matches the STF ``expected`` hex (``*`` nibbles, ``$`` = exact
    length), else what differs."""
    exp = "".join(expected.split()).upper()
    strict = exp.endswith("$")
    if strict:
        exp = exp[:-1]
    got = received.hex().upper()
    if strict and len(got) > len(exp):
        return f"too long: {len(got) // 2} bytes, expected {len(exp) // 2}"
    if len(got) < len(exp):
        return f"too short: {len(got) // 2} bytes, expected at least {len(exp) // 2}"
    for i, c in enumerate(exp):
        if c != "*" and c != got[i]:
            return f"differs at byte {i // 2} (nibble {i}): expected {c}, got {got[i]}"
    return None


def _int(v: str) -> int:
    v = v.strip()
    try:
        return int(v, 0) if not re.fullmatch(r"0\d+", v) else int(v, 10)
    except ValueError:
        raise StfError(f"not a number: {v!r}") from None


def _digits(v: str) -> tuple[str, int, str]:
    """Split a value into prefix base digits: ('0x', 4, 'ab**')."""
    for prefix, bits in (("0x", 4), ("0b", 1), ("0o", 3)):
        if v.lower().startswith(prefix):
            return v[2:], bits, prefix
    return v, 0, ""


def _key_pair(v: str, sep: str, whole: int) -> tuple[int, int] | None:
    """A ternary or lpm key given as numbers: ``a SEP b`` as (a, b), a plain number (no
    0x/0b/0o prefix) as (it, ``whole``); None for prefixed digits (they may hold ``*``)."""
    if sep in v:
        a, b = v.split(sep, 1)
        return _int(a), _int(b)
    if not _digits(v)[1]:
        return _int(v), whole
    return None


def _ternary(v: str, width: int) -> Ternary:
    pair = _key_pair(v, "&&&", (1 << width) - 1)
    if pair is not None:
        return Ternary(*pair)
    digits, bits, _prefix = _digits(v)
    radix = 1 << bits
    value = int(digits.replace("*", "0"), radix)
    mask = 0
    for c in digits:
        mask = (mask << bits) | (0 if c == "*" else radix - 1)
    return Ternary(value, mask & ((1 << width) - 1))


def _lpm(v: str, width: int) -> Lpm:
    pair = _key_pair(v, "/", width)
    if pair is not None:
        return Lpm(*pair)
    digits, bits, _prefix = _digits(v)
    n = (len(digits) - digits.count("*")) * bits
    value = int(digits.replace("*", "0"), 1 << bits)
    return Lpm(value, min(n, width))


def _by_suffix(names: list[str], want: str, what: str) -> str:
    if want in names:
        return want
    cands = [n for n in names if n.endswith(want)]
    if len(cands) == 1:
        return cands[0]
    if cands:
        raise StfError(f"{what} {want} is ambiguous: {', '.join(sorted(cands))}")
    raise StfError(f"no {what} {want} (have {', '.join(sorted(names)) or 'none'})")


def _key_field(t: TableInfo, name: str) -> KeyInfo:
    m = re.fullmatch(r"(.*)\$([0-9]+)(.*)", name)
    if m:
        name = f"{m.group(1)}[{m.group(2)}]{m.group(3)}"
    names = {k.name: k for k in t.keys}
    if name in names:
        return names[name]
    valid = name.endswith((".valid", ".$valid$", "$valid$"))
    for k in t.keys:
        if k.name.endswith("." + name) or (
            valid and k.name.endswith(".isValid()") and name.split(".")[-1] in ("valid", "$valid$")
        ):
            base = name.rsplit(".", 1)[0] if valid else name
            if not valid or k.name[: -len(".isValid()")].endswith(base):
                return k
    raise StfError(f"table {t.name} has no key field {name} (keys: {', '.join(names) or 'none'})")


def _split_call(text: str) -> tuple[str, list[tuple[str, str]]]:
    """'act(a:1, b:2)' -> ('act', [('a','1'), ('b','2')])."""
    m = re.fullmatch(r"\s*([^\s(]+)\s*\((.*)\)\s*", text)
    if not m:
        raise StfError(f"expected an action call NAME(ARG:VALUE, ...), got {text!r}")
    args: list[tuple[str, str]] = []
    for part in m.group(2).split(","):
        if not part.strip():
            continue
        k, sep, v = part.partition(":")
        if not sep:
            raise StfError(f"action argument {part.strip()!r} is not NAME:VALUE")
        args.append((k.strip(), v.strip()))
    return m.group(1), args


class _Runner:
    def __init__(self, pipe: Pipeline, dp: Dataplane) -> None:
        self.pipe = pipe
        self.dp = dp
        self.tables = {t.name: t for t in pipe.tables.values()}
        self.mc_nodes: list[tuple[int, list[int]]] = []
        self.mc_groups: dict[int, list[int]] = {}

    def table(self, name: str) -> TableInfo:
        return self.tables[_by_suffix(list(self.tables), name, "table")]

    def action(self, t: TableInfo, name: str) -> ActionInfo:
        full = _by_suffix(list(t.action_names), name, f"action of table {t.name}:")
        return self.pipe.actions[self.pipe.action_ids[full]]

    def params(self, a: ActionInfo, args: list[tuple[str, str]]) -> dict[int, int]:
        by_name = {p.name: p for p in a.params}
        out: dict[int, int] = {}
        for k, v in args:
            if k not in by_name:
                raise StfError(f"action {a.name} has no parameter {k}")
            out[by_name[k].id] = _int(v) & ((1 << by_name[k].bitwidth) - 1)
        missing = [p.name for p in a.params if p.id not in out]
        if missing:
            raise StfError(f"action {a.name}: missing argument(s) {', '.join(missing)}")
        return out

    def add(self, rest: str) -> None:
        m = re.fullmatch(r"(\S+)\s+(.*)", rest)
        if not m:
            raise StfError("add: expected TABLE [PRIORITY] KEY:VALUE ... ACTION(...)")
        t = self.table(m.group(1))
        body = m.group(2)
        paren = body.find("(")
        if paren < 0:
            raise StfError("add: no action call")
        head, call = body[:paren], body[paren:]
        words = head.split()
        if not words:
            raise StfError("add: no action name")
        call = words.pop() + call
        if "=" in call.rsplit(")", 1)[-1]:
            call = call.rsplit("=", 1)[0]
        prio: int | None = None
        if words and re.fullmatch(r"[0-9]+", words[0]):
            prio = int(words.pop(0))
        matches: dict[int, Match] = {}
        for w in words:
            k, sep, v = w.rpartition(":")
            if not sep:
                raise StfError(f"add: key {w!r} is not NAME:VALUE")
            kf = _key_field(t, k)
            if kf.match_kind == "ternary":
                tm = _ternary(v, kf.bitwidth)
                if tm.mask:
                    matches[kf.id] = tm
            elif kf.match_kind == "lpm":
                lm = _lpm(v, kf.bitwidth)
                if lm.prefix_len:
                    matches[kf.id] = lm
            elif kf.match_kind == "range":
                lo, sep2, hi = v.partition("->")
                matches[kf.id] = Range(_int(lo), _int(hi)) if sep2 else Range(_int(v), _int(v))
            else:
                matches[kf.id] = Exact(_int(v))
        name, args = _split_call(call)
        a = self.action(t, name)
        ternary = any(k.match_kind in ("ternary", "range", "optional") for k in t.keys)
        self.dp.insert_entry(
            TableEntry(
                t.id,
                matches,
                a.id,
                self.params(a, args),
                priority=(prio + 1 if prio is not None else 1) if ternary else 0,
            )
        )

    def setdefault(self, rest: str) -> None:
        m = re.fullmatch(r"(\S+)\s+(.*)", rest)
        if not m:
            raise StfError("setdefault: expected TABLE ACTION(...)")
        t = self.table(m.group(1))
        name, args = _split_call(m.group(2))
        a = self.action(t, name)
        self.dp.set_default(t.id, a.id, self.params(a, args))

    def mc_update(self, gid: int) -> None:
        reps = [
            (p, rid)
            for h in self.mc_groups[gid]
            for p in self.mc_nodes[h][1]
            for rid in [self.mc_nodes[h][0]]
        ]
        self.dp.set_multicast_group(gid, reps)

    def register(self, name: str) -> int:
        regs = {r.name: r.id for r in self.pipe.registers.values()}
        return regs[_by_suffix(list(regs), name, "register")]

    def command(self, cmd: str, rest: str) -> None:
        w = rest.split()
        if cmd == "add":
            self.add(rest)
        elif cmd == "setdefault":
            self.setdefault(rest)
        elif cmd == "wait":
            pass
        elif cmd == "mirroring_add":
            self.dp.set_clone_session(_int(w[0]), [(_int(w[1]), 0)])
        elif cmd == "mc_mgrp_create":
            self.mc_groups[_int(w[0])] = []
            self.dp.set_multicast_group(_int(w[0]), [])
        elif cmd == "mc_node_create":
            self.mc_nodes.append((_int(w[0]), [_int(x) for x in w[1:]]))
        elif cmd == "mc_node_associate":
            gid, h = _int(w[0]), _int(w[1])
            if gid not in self.mc_groups or not 0 <= h < len(self.mc_nodes):
                raise StfError(f"mc_node_associate: unknown group {gid} or node {h}")
            self.mc_groups[gid].append(h)
            self.mc_update(gid)
        elif cmd == "register_write":
            self.dp.write_register(self.register(w[0]), _int(w[1]), _int(w[2]))
        elif cmd == "register_reset":
            rid = self.register(w[0])
            for i, _ in self.dp.read_register(rid):
                self.dp.write_register(rid, i, 0)
        else:
            raise StfError(f"unsupported STF command {cmd!r}")


def run_stf(pipe: Pipeline, text: str, *, fast_path: bool = True, name: str = "<stf>") -> StfResult:
    """Run STF ``text`` against a fresh Dataplane of ``pipe`` (see the module docstring)."""
    dp = Dataplane(pipe, fast_path=fast_path)
    runner = _Runner(pipe, dp)
    res = StfResult(ok=False)
    observed: set[int] = set()
    expected: dict[int, list[str]] = {}
    any_ok: set[int] = set()
    outputs: dict[int, list[bytes]] = {}
    for n, line in _lines(text):
        cmd, _, rest = line.partition(" ")
        rest = rest.strip()
        where = f"{name}:{n}"
        try:
            if cmd == "packet":
                port_s, _, data = rest.partition(" ")
                port = _int(port_s)
                observed.add(port)
                hexdata = "".join(data.split())
                try:
                    frame = bytes.fromhex(hexdata)
                except ValueError:
                    raise StfError(f"invalid packet data {hexdata!r}") from None
                res.packets += 1
                for p, f in dp.process(port, frame):
                    outputs.setdefault(p, []).append(f)
            elif cmd == "expect":
                port_s, _, data = rest.partition(" ")
                port = _int(port_s)
                observed.add(port)
                if "".join(data.split()):
                    expected.setdefault(port, []).append(data)
                    res.expects += 1
                else:
                    any_ok.add(port)
            else:
                runner.command(cmd, rest)
        except (StfError, DataplaneError) as e:
            res.errors.append(f"{where}: {e}")
            return res
    res.outputs = {p: outputs.get(p, []) for p in sorted(observed)}
    for (port, reason), n in sorted(dp.drop_counts().items()):
        if reason == "internal_error":
            res.errors.append(f"{n} packet(s) from port {port} hit an internal error of the target")
    for port in sorted(observed):
        if port in any_ok:
            continue
        got = outputs.get(port, [])
        want = expected.get(port, [])
        for i, w in enumerate(want):
            if i >= len(got):
                break
            diff = compare_packet(w, got[i])
            if diff:
                res.errors.append(
                    f"port {port} packet {i}: {diff}\n  expected {''.join(w.split())}\n"
                    f"  received {got[i].hex().upper()}"
                )
        if len(got) != len(want):
            res.errors.append(f"port {port}: expected {len(want)} packet(s), got {len(got)}")
    res.ok = not res.errors
    return res


def run_stf_file(pipe: Pipeline, path: str | Path, *, fast_path: bool = True) -> StfResult:
    p = Path(path)
    return run_stf(pipe, p.read_text(), fast_path=fast_path, name=str(p))
