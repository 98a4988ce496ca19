"""Runtime state and packet execution of the P4 software target (bmv2 ``simple_switch`` semantics).

This module is the contract between the P4 engine (front end, compiled pipeline) and the code that
serves it (P4Runtime server, ports, queues, pcap). Everything here uses **P4Runtime-level ids**
(the ids of ``Pipeline.p4info``) and plain Python ints; converting P4Runtime byte strings to ints
and back is the server's job.

Public API
==========

``Pipeline`` (re-exported from :mod:`.pipeline`)
    ``Pipeline.compile(path_or_source, include_dirs=(), *, filename=None) -> Pipeline`` raises
    :class:`~shadowgrad.p4target.pipeline.P4CompileError` (``.diagnostics``: a list of
    ``file:line:col: message`` strings). ``.p4info`` is a ``p4.config.v1.p4info_pb2.P4Info``;
    ``.to_device_config() -> bytes`` is the artefact a P4Runtime ``p4_device_config`` carries;
    ``Pipeline.from_device_config(blob, p4info=None)`` rebuilds it (and checks the p4info agrees).

``Dataplane(pipeline, *, cpu_port=None, drop_port=511)``
    Runtime state (tables, PRE, counters, registers) plus execution. Thread-safe: one lock
    serialises control-plane calls (gRPC threads) and packets (port threads). Callbacks run
    *outside* the lock, after the packet finished, so they may call back into the dataplane.

    Tables:
        ``insert_entry(e)``, ``modify_entry(e)``, ``delete_entry(e)`` with a :class:`TableEntry`;
        ``set_default(table_id, action_id, params)``, ``reset_default(table_id)``,
        ``get_default(table_id) -> TableEntry`` (``is_default=True``),
        ``read_entries(table_id | None) -> list[TableEntry]`` (const entries included, direct
        counter data filled in where the table has a direct counter),
        ``write_direct_counter(entry_key: TableEntry, bytes, packets)``.
    PRE:
        ``set_multicast_group(gid, replicas)`` (insert or replace), ``insert_multicast_group``,
        ``modify_multicast_group``, ``delete_multicast_group(gid)``,
        ``read_multicast_groups(gid | None) -> dict[gid, list[(port, instance)]]``; the same for
        clone sessions: ``insert/modify/set/delete_clone_session(sid, replicas,
        class_of_service=0, packet_length_bytes=0)``, ``read_clone_sessions(sid | None)
        -> dict[sid, CloneSession]``. Ids 1..32767 (bmv2/PI limits).
    Counters / registers:
        ``read_counter(counter_id, index | None) -> list[(index, bytes, packets)]``,
        ``write_counter(counter_id, index | None, bytes=0, packets=0)`` (None = all cells),
        ``read_register(register_id, index | None) -> list[(index, value)]``,
        ``write_register(register_id, index, value)``.
    Packets:
        ``process(ingress_port, frame) -> list[(egress_port, frame)]`` runs one packet through
        parser, verify-checksum, ingress, the traffic manager (clone/digest/resubmit/multicast/
        drop/unicast precedence), one egress per replica, compute-checksum and deparser.
        Frames whose egress port is ``cpu_port`` are not returned: the controller header
        (``@controller_header("packet_in")``) is stripped and ``on_packet_in(payload, metadata)``
        is called with ``metadata = {metadata_id: value}``.
        ``packet_out(payload, metadata) -> list[(egress_port, frame)]`` prepends the
        ``packet_out`` header built from ``metadata`` and injects the frame with
        ``ingress_port = cpu_port``.
        ``on_digest(digest_id, members: list[bytes])`` is called once per ``digest()`` executed
        (members in struct field order, each ``ceil(bitwidth/8)`` bytes big-endian).
    Observability:
        ``drop_counts() -> dict[(ingress_port, reason), int]`` (reasons in :data:`DROP_REASONS`),
        ``packet_counts() -> dict[str, int]``; ``on_log(line)`` gets one line per packet event
        when set (for ``--log-console``).

Errors: every control-plane failure raises a :class:`DataplaneError` subclass whose ``code`` is
the gRPC status-code name a P4Runtime server should answer with (``INVALID_ARGUMENT``,
``NOT_FOUND``, ``ALREADY_EXISTS``, ``OUT_OF_RANGE``, ``RESOURCE_EXHAUSTED``, ``UNIMPLEMENTED``,
``PERMISSION_DENIED``), mirroring bmv2/PI (reference §2.10).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from time import monotonic_ns as _monotonic_ns
from typing import Any

from shadowgrad.errors import ShadowgradError

from .frontend.model import ActionInfo, ConstEntry, TableInfo
from .pipeline import P4CompileError, PacketCtx, Pipeline, _ParserError
from .v1model import (
    CLOCK_MASK,
    CLONE_E2E,
    CLONE_I2E,
    DEFAULT_DROP_PORT,
    DROP,
    DROP_REASONS,
    ENQ_TIMESTAMP_MASK,
    MAX_GROUP_ID,
    MAX_PORT,
    MAX_QDEPTH,
    MAX_RECIRCULATIONS,
    PKT_EGRESS_CLONE,
    PKT_INGRESS_CLONE,
    PKT_NORMAL,
    PKT_RECIRC,  # noqa: F401 - re-exported, with the other PKT_* (defined here before)
    PKT_REPLICATION,  # noqa: F401
    PKT_RESUBMIT,  # noqa: F401
    RECIRCULATE,
    RESUBMIT,
    egress_spec_at_egress,
    end_of_egress,
    end_of_ingress,
)

__all__ = [
    "DROP_REASONS",
    "AlreadyExistsError",
    "CloneSession",
    "DataplaneError",
    "Dataplane",
    "Exact",
    "InvalidArgumentError",
    "Lpm",
    "Match",
    "NotFoundError",
    "OptionalMatch",
    "OutOfRangeError",
    "P4CompileError",
    "PermissionDeniedError",
    "Pipeline",
    "Range",
    "ResourceExhaustedError",
    "TableEntry",
    "Ternary",
    "UnimplementedError",
]

# The v1model constants (PKT_*, MAX_*, DROP_REASONS, ...) and the traffic manager's precedence
# rules (end of ingress, end of egress) live in .v1model, shared with the fast path.


# ----------------------------------------------------------------------------------- errors
class DataplaneError(ShadowgradError):
    """A control-plane request was refused; ``code`` is the gRPC status-code name."""

    code = "UNKNOWN"

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class InvalidArgumentError(DataplaneError, ValueError):
    code = "INVALID_ARGUMENT"


class NotFoundError(DataplaneError, KeyError):
    code = "NOT_FOUND"

    def __str__(self) -> str:
        return self.message


class AlreadyExistsError(DataplaneError):
    code = "ALREADY_EXISTS"


class OutOfRangeError(DataplaneError):
    code = "OUT_OF_RANGE"


class ResourceExhaustedError(DataplaneError):
    code = "RESOURCE_EXHAUSTED"


class UnimplementedError(DataplaneError):
    code = "UNIMPLEMENTED"


class PermissionDeniedError(DataplaneError):
    code = "PERMISSION_DENIED"


# ----------------------------------------------------------------------------------- entries
@dataclass(frozen=True)
class Exact:
    value: int


@dataclass(frozen=True)
class Lpm:
    value: int
    prefix_len: int


@dataclass(frozen=True)
class Ternary:
    value: int
    mask: int


@dataclass(frozen=True)
class Range:
    low: int
    high: int


@dataclass(frozen=True)
class OptionalMatch:
    value: int


Match = Exact | Lpm | Ternary | Range | OptionalMatch


@dataclass
class TableEntry:
    """One table entry, in P4Runtime terms (ids from the P4Info, values as ints).

    ``matches`` maps match-field id to a match; omitted ternary/lpm/range/optional fields are
    don't-care (P4Runtime rule: never send a zero mask). ``params`` maps action-param id to
    value. ``counter_bytes``/``counter_packets`` carry direct-counter data: filled in on read
    when the table has a direct counter; on insert/modify, when not None, they set the counter.
    """

    table_id: int
    matches: dict[int, Match] = field(default_factory=dict)
    action_id: int = 0
    params: dict[int, int] = field(default_factory=dict)
    priority: int = 0
    is_default: bool = False
    counter_bytes: int | None = None
    counter_packets: int | None = None
    metadata: bytes = b""
    is_const: bool = False


@dataclass
class CloneSession:
    replicas: list[tuple[int, int]]
    class_of_service: int = 0
    packet_length_bytes: int = 0


# ----------------------------------------------------------------------------------- tables
class _Entry:
    __slots__ = (
        "action_id",
        "args",
        "bytes",
        "is_const",
        "key",
        "matches",
        "metadata",
        "packets",
        "params",
        "priority",
        "seq",
    )

    def __init__(  # noqa: PLR0917
        self,
        matches: dict[int, Match],
        action_id: int,
        params: dict[int, int],
        args: tuple[int, ...],
        priority: int,
        key: tuple[Any, ...],
        seq: int,
        metadata: bytes,
        is_const: bool,
    ) -> None:
        self.matches = matches
        self.action_id = action_id
        self.params = params
        self.args = args
        self.priority = priority
        self.key = key
        self.seq = seq
        self.metadata = metadata
        self.is_const = is_const
        self.bytes = 0
        self.packets = 0


class _Table:
    """Entries of one table and its lookup structure (exact dict / lpm buckets / sorted list)."""

    def __init__(self, info: TableInfo, actions: dict[int, ActionInfo]) -> None:
        self.info = info
        self.actions = actions
        kinds = [k.match_kind for k in info.keys]
        if all(k == "exact" for k in kinds):
            self.kind = "exact"
        elif any(k in ("ternary", "range", "optional") for k in kinds):
            self.kind = "ternary"
        else:
            self.kind = "lpm"
        self.lpm_index = kinds.index("lpm") if self.kind == "lpm" else -1
        self.entries: dict[tuple[Any, ...], _Entry] = {}
        self.exact: dict[tuple[int, ...], _Entry] = {}
        self.lpm: dict[int, dict[tuple[int, ...], _Entry]] = {}
        self.lpm_lengths: list[int] = []
        self.ordered: list[_Entry] = []
        self.seq = 0
        self.default_action = info.default_action[0]
        self.default_args: tuple[int, ...] = info.default_action[1]
        self.counted = info.direct_counter_id is not None
        # the exact dict, for generated code to look up inline; None where lookup() must run
        self.fast: dict[tuple[int, ...], _Entry] | None = (
            self.exact if self.kind == "exact" and not self.counted else None
        )

    # -- lookup, called from generated code with the key tuple and the packet length
    def lookup(self, key: tuple[int, ...], nbytes: int) -> tuple[int, tuple[int, ...], bool]:
        e: _Entry | None
        if self.kind == "exact":
            e = self.exact.get(key)
        elif self.kind == "lpm":
            e = None
            li = self.lpm_index
            kl = list(key)
            w = self.info.keys[li].bitwidth
            v = key[li]
            for plen in self.lpm_lengths:
                kl[li] = v & (((1 << plen) - 1) << (w - plen))
                e = self.lpm[plen].get(tuple(kl))
                if e is not None:
                    break
        else:
            e = None
            for cand in self.ordered:
                if _matches(cand.key, key):
                    e = cand
                    break
        if e is None:
            return self.default_action, self.default_args, False
        if self.counted:
            e.bytes += nbytes
            e.packets += 1
        return e.action_id, e.args, True

    def rebuild(self) -> None:
        if self.kind == "exact":
            self.exact = {e.key: e for e in self.entries.values()}
            if self.fast is not None:
                self.fast = self.exact
        elif self.kind == "lpm":
            self.lpm = {}
            for e in self.entries.values():
                self.lpm.setdefault(e.key[-1], {})[e.key[:-1]] = e
            self.lpm_lengths = sorted(self.lpm, reverse=True)
        else:
            # highest priority first; among equals, earlier inserted first (deterministic)
            self.ordered = sorted(self.entries.values(), key=lambda e: (-e.priority, e.seq))


def _matches(ekey: tuple[Any, ...], key: tuple[int, ...]) -> bool:
    for (kind, a, b), v in zip(ekey, key, strict=False):  # ekey ends with priority
        if kind == 0:  # value/mask
            if v & b != a:
                return False
        elif not a <= v <= b:  # range
            return False
    return True


@dataclass
class _Counter:
    size: int
    cells: list[list[int]]


# ----------------------------------------------------------------------------------- dataplane
class Dataplane:
    """Runtime state of one loaded pipeline plus packet execution (see module docstring)."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        cpu_port: int | None = None,
        drop_port: int = DEFAULT_DROP_PORT,
        fast_path: bool = True,
    ) -> None:
        if (cpu_port is not None and not (0 < cpu_port <= MAX_PORT)) or cpu_port == drop_port:
            raise InvalidArgumentError(f"invalid cpu port {cpu_port}")
        self.pipeline = pipeline
        self.cpu_port = cpu_port
        self.drop_port = drop_port
        self._egress_spec0 = egress_spec_at_egress(drop_port)
        self.lock = threading.RLock()
        self.on_packet_in: Callable[[bytes, dict[int, int]], None] | None = None
        self.on_digest: Callable[[int, list[bytes]], None] | None = None
        self.on_log: Callable[[str], None] | None = None
        self._t0_us = time.monotonic_ns() // 1000
        self._now = 0
        self.tables: dict[int, _Table] = {
            tid: _Table(t, pipeline.actions) for tid, t in pipeline.tables.items()
        }
        self.counters: dict[int, _Counter] = {
            cid: _Counter(c.size, [[0, 0] for _ in range(c.size)])
            for cid, c in pipeline.counters.items()
        }
        self.registers: dict[int, list[int]] = {
            rid: [0] * r.size for rid, r in pipeline.registers.items()
        }
        self.mcast: dict[int, list[tuple[int, int]]] = {}
        self.clone_sessions: dict[int, CloneSession] = {}
        self._drops: dict[tuple[int, str], int] = {}
        self._stats: dict[str, int] = {
            "rx": 0,
            "tx": 0,
            "packet_in": 0,
            "packet_out": 0,
            "digests": 0,
        }
        self._pending_pin: list[tuple[bytes, dict[int, int]]] = []
        self._pending_digest: list[tuple[int, list[bytes]]] = []
        self.prog = pipeline.instantiate(self)
        # the straight-line fast path (``codegen.straight``): used per packet unless logging is on
        self._fast = self.prog.fast if fast_path else None
        self._drop_cb = self._drop  # bound once (hot path)
        self._digest_cb = self._queue_digests
        self._qdepth_cb = self._queue_depth
        self._reads_queue = pipeline.reads_queue
        #: depth in packets of a port's egress queue (set by the switch that owns the queues);
        #: the program sees it as enq_qdepth/deq_qdepth in egress when it reads them
        self.queue_depth: Callable[[int], int] | None = None
        for tid, t in pipeline.tables.items():
            for ce in t.const_entries:
                self._insert(self._const_entry(tid, ce), allow_const=True)

    def _const_entry(self, table_id: int, ce: ConstEntry) -> TableEntry:
        aid = self.pipeline.action_ids[ce.action_name]
        a = self.pipeline.actions[aid]
        matches: dict[int, Match] = {}
        for fid, (kind, x, y) in ce.matches.items():
            if kind == "exact":
                matches[fid] = Exact(x)
            elif kind == "lpm":
                matches[fid] = Lpm(x, y)
            elif kind == "ternary":
                matches[fid] = Ternary(x, y)
            elif kind == "range":
                matches[fid] = Range(x, y)
            else:
                matches[fid] = OptionalMatch(x)
        return TableEntry(
            table_id,
            matches,
            aid,
            {p.id: v for p, v in zip(a.params, ce.args, strict=True)},
            ce.priority,
            is_const=True,
        )

    # ------------------------------------------------------------------ generated-code hooks
    def now_us(self) -> int:
        return time.monotonic_ns() // 1000 - self._t0_us

    # ------------------------------------------------------------------ table operations
    def _table(self, table_id: int) -> _Table:
        t = self.tables.get(table_id)
        if t is None:
            raise NotFoundError(f"unknown table id {table_id}")
        return t

    def _check_action(
        self, t: _Table, action_id: int, params: dict[int, int], default: bool
    ) -> tuple[int, ...]:
        if action_id not in t.info.action_ids:
            if action_id in self.pipeline.actions:
                raise InvalidArgumentError(
                    f"action {self.pipeline.actions[action_id].name} is not an action of "
                    f"table {t.info.name}"
                )
            raise InvalidArgumentError(f"unknown action id {action_id}")
        scope = t.info.scope_ids.get(action_id, "TABLE_AND_DEFAULT")
        if default and scope == "TABLE_ONLY":
            raise InvalidArgumentError("cannot use a table-only action as the default action")
        if not default and scope == "DEFAULT_ONLY":
            raise InvalidArgumentError("cannot use a default-only action in a table entry")
        a = self.pipeline.actions[action_id]
        args = []
        want = {p.id for p in a.params}
        extra = set(params) - want
        if extra:
            raise InvalidArgumentError(f"unknown param id(s) {sorted(extra)} for action {a.name}")
        for p in a.params:
            if p.id not in params:
                raise InvalidArgumentError(f"missing param {p.name} for action {a.name}")
            v = params[p.id]
            if v < 0 or v >> p.bitwidth:
                raise InvalidArgumentError(
                    f"value {v} of param {p.name} does not fit in {p.bitwidth} bits"
                )
            args.append(v)
        return tuple(args)

    def _key(self, t: _Table, matches: dict[int, Match], priority: int) -> tuple[Any, ...]:
        """Validate the match and return the internal key (one item per key field)."""
        info = t.info
        ids = {k.id for k in info.keys}
        extra = set(matches) - ids
        if extra:
            raise InvalidArgumentError(f"unknown match field id(s) {sorted(extra)}")
        needs_prio = t.kind == "ternary"
        if needs_prio and priority <= 0:
            raise InvalidArgumentError(
                f"table {info.name} has ternary/range/optional fields: priority must be > 0"
            )
        if not needs_prio and priority != 0:
            raise InvalidArgumentError(
                f"table {info.name} has no ternary/range/optional field: priority must be 0"
            )
        out: list[Any] = []
        plen = 0
        for k in info.keys:
            w = k.bitwidth
            full = (1 << w) - 1
            m = matches.get(k.id)
            kind = k.match_kind

            def fits(v: int, what: str, name: str = k.name, w: int = w) -> None:
                if v < 0 or v >> w:
                    raise InvalidArgumentError(
                        f"{what} {v:#x} of field {name} does not fit in {w} bits"
                    )

            if kind == "exact":
                if not isinstance(m, Exact):
                    raise InvalidArgumentError(f"field {k.name}: exact match required")
                fits(m.value, "value")
                out.append(m.value if t.kind != "ternary" else (0, m.value, full))
            elif kind == "lpm":
                if m is None:
                    m = Lpm(0, 0)
                if not isinstance(m, Lpm):
                    raise InvalidArgumentError(f"field {k.name}: lpm match required")
                fits(m.value, "value")
                if not 0 <= m.prefix_len <= w:
                    raise InvalidArgumentError(
                        f"field {k.name}: prefix length {m.prefix_len} out of range 0..{w}"
                    )
                mask = full ^ ((1 << (w - m.prefix_len)) - 1)
                if m.value & ~mask:
                    raise InvalidArgumentError(
                        f"field {k.name}: lpm value has bits set beyond the prefix length"
                    )
                if t.kind == "lpm":
                    out.append(m.value)
                    plen = m.prefix_len
                else:
                    out.append((0, m.value, mask))
            elif kind == "ternary":
                if m is None:
                    m = Ternary(0, 0)
                if not isinstance(m, Ternary):
                    raise InvalidArgumentError(f"field {k.name}: ternary match required")
                fits(m.value, "value")
                fits(m.mask, "mask")
                if m.value & ~m.mask:
                    raise InvalidArgumentError(
                        f"field {k.name}: ternary value has bits set outside the mask"
                    )
                out.append((0, m.value, m.mask))
            elif kind == "range":
                if m is None:
                    m = Range(0, full)
                if not isinstance(m, Range):
                    raise InvalidArgumentError(f"field {k.name}: range match required")
                fits(m.low, "low")
                fits(m.high, "high")
                if m.low > m.high:
                    raise InvalidArgumentError(f"field {k.name}: range low > high")
                out.append((1, m.low, m.high))
            elif kind == "optional":
                if m is None:
                    out.append((0, 0, 0))
                    continue
                if not isinstance(m, OptionalMatch):
                    raise InvalidArgumentError(f"field {k.name}: optional match required")
                fits(m.value, "value")
                out.append((0, m.value, full))
            else:  # pragma: no cover - checker rejects other kinds
                raise UnimplementedError(f"match kind {kind}")
        if t.kind == "exact":
            return tuple(out)
        if t.kind == "lpm":
            return (*out, plen)
        return (*out, priority)

    def insert_entry(self, entry: TableEntry) -> None:
        with self.lock:
            self._insert(entry, allow_const=False)

    def _insert(self, entry: TableEntry, *, allow_const: bool) -> None:
        t = self._table(entry.table_id)
        if entry.is_default:
            raise InvalidArgumentError("use set_default (MODIFY) for the default entry")
        if t.info.is_const and not allow_const:
            raise PermissionDeniedError(f"table {t.info.name} has const entries: read-only")
        key = self._key(t, entry.matches, entry.priority)
        args = self._check_action(t, entry.action_id, entry.params, default=False)
        if key in t.entries:
            raise AlreadyExistsError(f"a matching entry already exists in {t.info.name}")
        if len(t.entries) >= t.info.size and not allow_const:
            raise ResourceExhaustedError(f"table {t.info.name} is full ({t.info.size})")
        t.seq += 1
        e = _Entry(
            dict(entry.matches),
            entry.action_id,
            dict(entry.params),
            args,
            entry.priority,
            key,
            t.seq,
            entry.metadata,
            allow_const,
        )
        if entry.counter_bytes is not None:
            e.bytes = entry.counter_bytes
        if entry.counter_packets is not None:
            e.packets = entry.counter_packets
        t.entries[key] = e
        t.rebuild()

    def _find(self, entry: TableEntry) -> tuple[_Table, tuple[Any, ...], _Entry]:
        t = self._table(entry.table_id)
        key = self._key(t, entry.matches, entry.priority)
        e = t.entries.get(key)
        if e is None:
            raise NotFoundError(f"no such entry in table {t.info.name}")
        return t, key, e

    def modify_entry(self, entry: TableEntry) -> None:
        with self.lock:
            if entry.is_default:
                self._set_default(entry.table_id, entry.action_id, entry.params)
                return
            t = self._table(entry.table_id)
            if t.info.is_const:
                raise PermissionDeniedError(f"table {t.info.name} has const entries: read-only")
            t, _key, e = self._find(entry)
            args = self._check_action(t, entry.action_id, entry.params, default=False)
            e.action_id = entry.action_id
            e.params = dict(entry.params)
            e.args = args
            e.metadata = entry.metadata
            if entry.counter_bytes is not None:
                e.bytes = entry.counter_bytes
            if entry.counter_packets is not None:
                e.packets = entry.counter_packets

    def delete_entry(self, entry: TableEntry) -> None:
        with self.lock:
            t = self._table(entry.table_id)
            if entry.is_default:
                raise InvalidArgumentError("the default entry cannot be deleted")
            if t.info.is_const:
                raise PermissionDeniedError(f"table {t.info.name} has const entries: read-only")
            t, key, _e = self._find(entry)
            del t.entries[key]
            t.rebuild()

    def set_default(self, table_id: int, action_id: int, params: dict[int, int]) -> None:
        with self.lock:
            self._set_default(table_id, action_id, params)

    def _set_default(self, table_id: int, action_id: int, params: dict[int, int]) -> None:
        t = self._table(table_id)
        if t.info.const_default and action_id != t.info.default_action[0]:
            raise PermissionDeniedError(f"table {t.info.name} has a const default action")
        args = self._check_action(t, action_id, params, default=True)
        if t.info.const_default and args != t.info.default_action[1]:
            raise PermissionDeniedError(f"table {t.info.name} has a const default action")
        t.default_action, t.default_args = action_id, args

    def reset_default(self, table_id: int) -> None:
        with self.lock:
            t = self._table(table_id)
            t.default_action, t.default_args = t.info.default_action

    def get_default(self, table_id: int) -> TableEntry:
        with self.lock:
            t = self._table(table_id)
            a = self.pipeline.actions[t.default_action]
            return TableEntry(
                table_id,
                {},
                t.default_action,
                {p.id: v for p, v in zip(a.params, t.default_args, strict=True)},
                is_default=True,
            )

    def read_entries(self, table_id: int | None = None) -> list[TableEntry]:
        with self.lock:
            tables = [self._table(table_id)] if table_id is not None else list(self.tables.values())
            out: list[TableEntry] = []
            for t in tables:
                for e in sorted(t.entries.values(), key=lambda e: e.seq):
                    out.append(
                        TableEntry(
                            t.info.id,
                            dict(e.matches),
                            e.action_id,
                            dict(e.params),
                            e.priority,
                            counter_bytes=e.bytes if t.counted else None,
                            counter_packets=e.packets if t.counted else None,
                            metadata=e.metadata,
                            is_const=e.is_const,
                        )
                    )
            return out

    def write_direct_counter(self, entry: TableEntry, nbytes: int, packets: int) -> None:
        with self.lock:
            t, _key, e = self._find(entry)
            if not t.counted:
                raise InvalidArgumentError(f"table {t.info.name} has no direct counter")
            e.bytes, e.packets = nbytes, packets

    def clear_tables(self) -> None:
        """Remove all non-const entries and restore the defaults (a pipeline reset)."""
        with self.lock:
            for t in self.tables.values():
                t.entries = {k: e for k, e in t.entries.items() if e.is_const}
                t.rebuild()
                t.default_action, t.default_args = t.info.default_action

    # ------------------------------------------------------------------ PRE
    @staticmethod
    def _check_replicas(replicas: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        reps = [(int(p), int(i)) for p, i in replicas]
        if len(set(reps)) != len(reps):
            raise InvalidArgumentError("duplicate replica (port, instance) in the entry")
        for p, i in reps:
            if not 0 <= p <= MAX_PORT:
                raise InvalidArgumentError(f"replica port {p} out of range 0..{MAX_PORT}")
            if not 0 <= i <= 0xFFFF:
                raise InvalidArgumentError(f"replica instance {i} out of range 0..65535")
        return reps

    @staticmethod
    def _check_gid(gid: int, what: str) -> None:
        if gid == 0:
            raise InvalidArgumentError(f"{what} id 0 is invalid")
        if gid < 0 or gid > MAX_GROUP_ID:
            raise OutOfRangeError(
                f"{what} id value is too high" if gid > 0 else f"{what} id {gid} invalid"
            )

    def insert_multicast_group(self, gid: int, replicas: Iterable[tuple[int, int]]) -> None:
        with self.lock:
            self._check_gid(gid, "Group")
            if gid in self.mcast:
                raise AlreadyExistsError(f"multicast group {gid} already exists")
            self.mcast[gid] = self._check_replicas(replicas)

    def modify_multicast_group(self, gid: int, replicas: Iterable[tuple[int, int]]) -> None:
        with self.lock:
            self._check_gid(gid, "Group")
            if gid not in self.mcast:
                raise NotFoundError(f"multicast group {gid} does not exist")
            self.mcast[gid] = self._check_replicas(replicas)

    def set_multicast_group(self, gid: int, replicas: Iterable[tuple[int, int]]) -> None:
        with self.lock:
            self._check_gid(gid, "Group")
            self.mcast[gid] = self._check_replicas(replicas)

    def delete_multicast_group(self, gid: int) -> None:
        with self.lock:
            self._check_gid(gid, "Group")
            if self.mcast.pop(gid, None) is None:
                raise NotFoundError(f"multicast group {gid} does not exist")

    def read_multicast_groups(self, gid: int | None = None) -> dict[int, list[tuple[int, int]]]:
        with self.lock:
            if gid:
                if gid not in self.mcast:
                    raise NotFoundError(f"multicast group {gid} does not exist")
                return {gid: list(self.mcast[gid])}
            return {g: list(r) for g, r in sorted(self.mcast.items())}

    def _clone_checks(
        self, sid: int, replicas: Iterable[tuple[int, int]], cos: int, plen: int
    ) -> CloneSession:
        self._check_gid(sid, "Clone session")
        if cos != 0:
            raise UnimplementedError("class_of_service is not supported")
        if plen != 0:
            raise UnimplementedError("packet truncation (packet_length_bytes) is not supported")
        return CloneSession(self._check_replicas(replicas), cos, plen)

    def insert_clone_session(
        self,
        sid: int,
        replicas: Iterable[tuple[int, int]],
        class_of_service: int = 0,
        packet_length_bytes: int = 0,
    ) -> None:
        with self.lock:
            s = self._clone_checks(sid, replicas, class_of_service, packet_length_bytes)
            if sid in self.clone_sessions:
                raise AlreadyExistsError(f"clone session {sid} already exists")
            self.clone_sessions[sid] = s

    def modify_clone_session(
        self,
        sid: int,
        replicas: Iterable[tuple[int, int]],
        class_of_service: int = 0,
        packet_length_bytes: int = 0,
    ) -> None:
        with self.lock:
            s = self._clone_checks(sid, replicas, class_of_service, packet_length_bytes)
            if sid not in self.clone_sessions:
                raise NotFoundError(f"clone session {sid} does not exist")
            self.clone_sessions[sid] = s

    def set_clone_session(
        self,
        sid: int,
        replicas: Iterable[tuple[int, int]],
        class_of_service: int = 0,
        packet_length_bytes: int = 0,
    ) -> None:
        with self.lock:
            self.clone_sessions[sid] = self._clone_checks(
                sid, replicas, class_of_service, packet_length_bytes
            )

    def delete_clone_session(self, sid: int) -> None:
        with self.lock:
            self._check_gid(sid, "Clone session")
            if self.clone_sessions.pop(sid, None) is None:
                raise NotFoundError(f"clone session {sid} does not exist")

    def read_clone_sessions(self, sid: int | None = None) -> dict[int, CloneSession]:
        with self.lock:
            if sid:
                if sid not in self.clone_sessions:
                    raise NotFoundError(f"clone session {sid} does not exist")
                return {sid: self.clone_sessions[sid]}
            return dict(sorted(self.clone_sessions.items()))

    # ------------------------------------------------------------------ counters / registers
    def _counter(self, cid: int) -> _Counter:
        c = self.counters.get(cid)
        if c is None:
            raise NotFoundError(f"unknown counter id {cid}")
        return c

    def read_counter(self, counter_id: int, index: int | None = None) -> list[tuple[int, int, int]]:
        with self.lock:
            c = self._counter(counter_id)
            if index is None:
                return [(i, b, p) for i, (b, p) in enumerate(c.cells)]
            if not 0 <= index < c.size:
                raise OutOfRangeError(f"counter index {index} out of range 0..{c.size - 1}")
            b, p = c.cells[index]
            return [(index, b, p)]

    def write_counter(
        self, counter_id: int, index: int | None = None, nbytes: int = 0, packets: int = 0
    ) -> None:
        with self.lock:
            c = self._counter(counter_id)
            if index is None:
                for cell in c.cells:
                    cell[0], cell[1] = nbytes, packets
                return
            if not 0 <= index < c.size:
                raise OutOfRangeError(f"counter index {index} out of range 0..{c.size - 1}")
            c.cells[index][0], c.cells[index][1] = nbytes, packets

    def read_register(self, register_id: int, index: int | None = None) -> list[tuple[int, int]]:
        with self.lock:
            r = self.registers.get(register_id)
            if r is None:
                raise NotFoundError(f"unknown register id {register_id}")
            if index is None:
                return list(enumerate(r))
            if not 0 <= index < len(r):
                raise OutOfRangeError(f"register index {index} out of range")
            return [(index, r[index])]

    def write_register(self, register_id: int, index: int, value: int) -> None:
        with self.lock:
            r = self.registers.get(register_id)
            if r is None:
                raise NotFoundError(f"unknown register id {register_id}")
            if not 0 <= index < len(r):
                raise OutOfRangeError(f"register index {index} out of range")
            w = self.pipeline.registers[register_id].bitwidth
            r[index] = value & ((1 << w) - 1)

    # ------------------------------------------------------------------ observability
    def drop_counts(self) -> dict[tuple[int, str], int]:
        with self.lock:
            return dict(self._drops)

    def packet_counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self._stats)

    def _drop(self, port: int, reason: str) -> None:
        k = (port, reason)
        self._drops[k] = self._drops.get(k, 0) + 1
        if self.on_log is not None:
            self.on_log(f"drop port={port} reason={reason}")

    # ------------------------------------------------------------------ packets
    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Run one frame received on ``ingress_port``; return the frames to transmit."""
        if type(frame) is not bytes:
            frame = bytes(frame)
        return self.process_batch(ingress_port, (frame,))

    def process_batch(self, ingress_port: int, frames: Sequence[bytes]) -> list[tuple[int, bytes]]:
        """Run frames (``bytes``) received on ``ingress_port``, in order, under one
        acquisition of the dataplane lock; return the frames to transmit, in order."""
        out: list[tuple[int, bytes]] = []
        lock = self.lock
        lock.acquire()  # acquire/release: half the cost of ``with`` (hot path)
        try:
            stats = self._stats
            stats["rx"] += len(frames)
            fast = self._fast
            if fast is not None and self.on_log is None:
                fast(
                    ingress_port,
                    frames,
                    self._t0_us,
                    self.mcast,
                    out,
                    self._drop_cb,
                    self._digest_cb,
                    self._qdepth_cb,
                )
                if out and self.cpu_port is not None:
                    out = self._split_cpu(ingress_port, out)
            else:
                for frame in frames:
                    self._now = (_monotonic_ns() // 1000 - self._t0_us) & CLOCK_MASK
                    try:
                        self._ingress(ingress_port, frame, PKT_NORMAL, None, out, 0)
                    except Exception as exc:  # never let a packet kill the caller's thread
                        self._drop(ingress_port, "internal_error")
                        if self.on_log is not None:
                            self.on_log(f"internal error: {exc!r}")
            stats["tx"] += len(out)
            if not (self._pending_pin or self._pending_digest):
                return out
            pins, self._pending_pin = self._pending_pin, []
            digs, self._pending_digest = self._pending_digest, []
        finally:
            lock.release()
        self._deliver(pins, digs)
        return out

    @property
    def fast_path(self) -> bool:
        """Whether packets run on the straight-line fast path (``codegen.straight``) when no
        per-packet logging is on; False if disabled or the program is not covered
        (``pipeline.fast_unsupported`` says why)."""
        return self._fast is not None

    def _queue_digests(self, digests: tuple[tuple[int, list[bytes]], ...]) -> None:
        """Queue a packet's ingress digests (step 2 of the end of ingress, both paths;
        see .v1model)."""
        for did, members in digests:
            self._stats["digests"] += 1
            self._pending_digest.append((did, members))

    def _split_cpu(
        self, ingress_port: int, out: list[tuple[int, bytes]]
    ) -> list[tuple[int, bytes]]:
        """The fast path's copies to the CPU port become packet-ins (as in _egress_tail)."""
        cpu = self.cpu_port
        if all(p != cpu for p, _ in out):
            return out
        rest = []
        for p, data in out:
            if p == cpu:
                self._to_cpu(ingress_port, data)
            else:
                rest.append((p, data))
        return rest

    def packet_out(self, payload: bytes, metadata: dict[int, int]) -> list[tuple[int, bytes]]:
        """Inject a P4Runtime PacketOut: prepend the packet_out header, ingress = cpu_port."""
        po = self.pipeline.packet_out
        if self.cpu_port is None:
            with self.lock:
                self._drop(0, "bad_packet_out")
            raise InvalidArgumentError("packet-out needs a cpu port (--cpu-port)")
        head = b""
        if po is not None:
            v = 0
            total = 0
            for mid, _name, bw in po.fields:
                val = metadata.get(mid, 0)
                if val < 0 or val >> bw:
                    raise InvalidArgumentError(f"packet-out metadata {mid} does not fit {bw} bits")
                v = (v << bw) | val
                total += bw
            pad = (-total) % 8
            head = (v << pad).to_bytes((total + pad) // 8, "big")
            extra = set(metadata) - {f[0] for f in po.fields}
            if extra:
                raise InvalidArgumentError(f"unknown packet-out metadata id(s) {sorted(extra)}")
        with self.lock:
            self._stats["packet_out"] += 1
        return self.process(self.cpu_port, head + bytes(payload))

    def _deliver(
        self, pins: list[tuple[bytes, dict[int, int]]], digs: list[tuple[int, list[bytes]]]
    ) -> None:
        if pins and self.on_packet_in is not None:
            for payload, md in pins:
                self.on_packet_in(payload, md)
        if digs and self.on_digest is not None:
            for did, members in digs:
                self.on_digest(did, members)

    # -- the v1model traffic manager (the order and rules: .v1model)
    def _new_ctx(self, port: int, frame: bytes, itype: int) -> PacketCtx:
        ctx: PacketCtx = self.prog.new_ctx(frame)
        std = ctx.std
        std.ingress_port = port
        std.instance_type = itype
        std.packet_length = len(frame)
        std.ingress_global_timestamp = self._now
        return ctx

    def _run_parser(self, ctx: PacketCtx) -> None:
        prog = self.prog
        try:
            prog.parse(ctx)
        except _ParserError as e:
            ctx.std.parser_error = e.code
        ctx.payload_off = ctx.off
        prog.verify(ctx)

    def _ingress(  # noqa: PLR0917
        self,
        port: int,
        frame: bytes,
        itype: int,
        preserved: tuple[PacketCtx, int] | None,
        out: list[tuple[int, bytes]],
        depth: int,
    ) -> None:
        if depth > MAX_RECIRCULATIONS:
            self._drop(port, "recirculation_limit")
            return
        prog = self.prog
        # _new_ctx and _run_parser, inlined (hot path)
        ctx: PacketCtx = prog.new_ctx(frame)
        std = ctx.std
        std.ingress_port = port
        std.instance_type = itype
        std.packet_length = len(frame)
        std.ingress_global_timestamp = self._now
        try:
            prog.parse(ctx)
        except _ParserError as e:
            std.parser_error = e.code
        ctx.payload_off = ctx.off
        prog.verify(ctx)
        if preserved is not None:
            prog.preserve(preserved[0], ctx, preserved[1])
        prog.ingress(ctx)  # the generated control catches its own exit
        std = ctx.std
        # 1. I2E clone: original packet, re-parsed, metadata reset (except field list)
        if ctx.clone_type == CLONE_I2E:
            s = self.clone_sessions.get(ctx.clone_session)
            if s is not None:
                for eport, rid in s.replicas:
                    kc = self._new_ctx(port, frame, PKT_INGRESS_CLONE)
                    self._run_parser(kc)
                    if ctx.clone_fl >= 0:
                        prog.preserve(ctx, kc, ctx.clone_fl)
                    self._egress(kc, eport, rid, out, depth)
        # 2. digests
        if ctx.digests:
            self._queue_digests(ctx.digests)
        # 3. resubmit, 4. multicast, 5. drop, 6. unicast
        verdict, reps, itype = end_of_ingress(
            ctx.resubmit_fl >= 0,
            std.mcast_grp,
            std.egress_spec,
            std.instance_type,
            self.mcast,
            self.drop_port,
        )
        if verdict == DROP:
            self._drop(port, reps)
            return
        if verdict == RESUBMIT:
            self._ingress(port, frame, itype, (ctx, ctx.resubmit_fl), out, depth + 1)
            return
        std.instance_type = itype  # FORWARD
        egress = self._egress
        last = len(reps) - 1
        if last:  # copies for all but the last replica, which takes the packet itself
            copy_ctx = prog.copy_ctx
            for eport, rid in reps[:last]:
                egress(copy_ctx(ctx), eport, rid, out, depth)
        eport, rid = reps[last]
        egress(ctx, eport, rid, out, depth)

    def _queue_depth(self, port: int, out: list[tuple[int, bytes]]) -> int:
        """Packets ahead of a copy for ``port``: its egress queue's depth plus the earlier
        frames of the batch in hand for the same port (they are queued after the batch).
        This target runs egress before the queue, so enqueue and dequeue depths are one
        value and ``deq_timedelta`` is 0."""
        f = self.queue_depth
        d = f(port) if f is not None else 0
        for p, _ in out:
            if p == port:
                d += 1
        return min(d, MAX_QDEPTH)

    def _egress(
        self, ctx: PacketCtx, eport: int, rid: int, out: list[tuple[int, bytes]], depth: int
    ) -> None:
        prog = self.prog
        std = ctx.std
        std.egress_port = eport
        std.egress_rid = rid
        std.egress_spec = self._egress_spec0
        std.egress_global_timestamp = self._now
        if self._reads_queue:
            std.enq_qdepth = std.deq_qdepth = self._queue_depth(eport, out)
            std.enq_timestamp = self._now & ENQ_TIMESTAMP_MASK
            std.deq_timedelta = 0
        if ctx.clone_type:  # class defaults 0 / -1: store only when ingress set them
            ctx.clone_type = 0
        if ctx.clone_fl != -1:
            ctx.clone_fl = -1
        prog.egress(ctx)
        if ctx.clone_type == CLONE_E2E:
            s = self.clone_sessions.get(ctx.clone_session)
            if s is not None:
                for ceport, crid in s.replicas:
                    kc = prog.copy_ctx(ctx)
                    prog.reset_meta(kc)
                    kc.std.ingress_port = std.ingress_port
                    kc.std.instance_type = PKT_EGRESS_CLONE
                    kc.std.packet_length = std.packet_length
                    if ctx.clone_fl >= 0:
                        prog.preserve(ctx, kc, ctx.clone_fl)
                    if depth < MAX_RECIRCULATIONS:
                        self._egress(kc, ceport, crid, out, depth + 1)
                    else:
                        self._drop(std.ingress_port, "recirculation_limit")
        verdict, arg = end_of_egress(std.egress_spec, self.drop_port, ctx.recirc_fl >= 0)
        if verdict == DROP:
            self._drop(std.ingress_port, arg)
            return
        prog.compute(ctx)
        data = prog.deparse(ctx)
        if (
            verdict == RECIRCULATE
            or ctx.truncate_len
            or eport == self.cpu_port
            or self.on_log is not None
        ):
            self._egress_tail(ctx, eport, rid, data, out, depth, arg)
            return
        out.append((eport, data))  # TRANSMIT

    def _egress_tail(  # noqa: PLR0917
        self,
        ctx: PacketCtx,
        eport: int,
        rid: int,
        data: bytes,
        out: list[tuple[int, bytes]],
        depth: int,
        recirc_itype: int | None,
    ) -> None:
        """The end of :meth:`_egress` for truncate, recirculate (``recirc_itype``: the
        instance type end_of_egress gave a RECIRCULATE, else None), the CPU port and logging."""
        if ctx.truncate_len:
            data = data[: ctx.truncate_len]
        if recirc_itype is not None:
            self._ingress(eport, data, recirc_itype, (ctx, ctx.recirc_fl), out, depth + 1)
            return
        if self.cpu_port is not None and eport == self.cpu_port:
            self._to_cpu(ctx.std.ingress_port, data)
            return
        if self.on_log is not None:
            self.on_log(f"tx port={eport} len={len(data)} rid={rid}")
        out.append((eport, data))

    def _to_cpu(self, ingress_port: int, data: bytes) -> None:
        if self.on_packet_in is None:
            self._drop(ingress_port, "no_packet_in_listener")
            return
        pi = self.pipeline.packet_in
        md: dict[int, int] = {}
        if pi is not None:
            total = sum(f[2] for f in pi.fields)
            nb = (total + 7) // 8
            v = int.from_bytes(data[:nb].ljust(nb, b"\0"), "big") >> (nb * 8 - total)
            shift = total
            for mid, _n, bw in pi.fields:
                shift -= bw
                md[mid] = (v >> shift) & ((1 << bw) - 1)
            data = data[nb:]
        self._stats["packet_in"] += 1
        self._pending_pin.append((data, md))
