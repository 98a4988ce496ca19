"""The control-plane model of a checked program: what P4Info describes and the runtime needs.

Ids are P4Runtime ids (assigned by :func:`shadowgrad.p4target.p4info.assign_ids` with p4c's
algorithm); ``0`` until assigned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class ParamInfo:
    id: int
    name: str
    bitwidth: int


@dataclass
class ActionInfo:
    name: str  # fully qualified, e.g. "MyIngress.drop" or "NoAction"
    params: list[ParamInfo]
    annotations: list[str] = field(default_factory=list)
    id: int = 0
    fixed_id: int | None = None
    alias: str = ""
    #: False for an action only a table left out of the P4Info uses (TableInfo.in_p4info)
    in_p4info: bool = True


@dataclass
class KeyInfo:
    id: int
    name: str
    bitwidth: int
    match_kind: str  # exact lpm ternary range optional


@dataclass
class ConstEntry:
    """A ``const entries`` entry: matches[field_id] = (kind, a, b) with kind in
    exact(v) lpm(v, plen) ternary(v, mask) range(lo, hi) optional(v)."""

    matches: dict[int, tuple[str, int, int]]
    action_name: str
    args: tuple[int, ...]
    priority: int


@dataclass
class TableInfo:
    name: str
    keys: list[KeyInfo]
    action_names: list[str]
    scopes: dict[str, str]  # action name -> TABLE_AND_DEFAULT | TABLE_ONLY | DEFAULT_ONLY
    default_action_name: str
    default_args: tuple[int, ...]
    const_default: bool
    size: int
    is_const: bool
    const_entries_src: list[ConstEntry]
    direct_counter_name: str | None = None
    id: int = 0
    fixed_id: int | None = None
    alias: str = ""
    # filled after id assignment
    action_ids: list[int] = field(default_factory=list)
    scope_ids: dict[int, str] = field(default_factory=dict)
    default_action: tuple[int, tuple[int, ...]] = (0, ())
    direct_counter_id: int | None = None
    const_entries: list[ConstEntry] = field(default_factory=list)
    annotations: list[str] = field(default_factory=list)
    # per action name: the annotations of its entry in the actions list (as p4c writes them)
    ref_annotations: dict[str, list[str]] = field(default_factory=dict)
    ref_annotation_ids: dict[int, list[str]] = field(default_factory=dict)
    #: False for a table applied only in code a constant condition leaves out: p4c's front end
    #: removes it, so the P4Info does not list it (the pipeline keeps it: the code names it)
    in_p4info: bool = True


@dataclass
class CounterInfo:
    name: str
    size: int
    unit: str  # PACKETS BYTES BOTH
    direct_table: str | None = None
    id: int = 0
    fixed_id: int | None = None
    alias: str = ""
    direct_table_id: int = 0


@dataclass
class RegisterInfo:
    name: str
    size: int
    bitwidth: int
    id: int = 0
    fixed_id: int | None = None
    alias: str = ""


@dataclass
class DigestInfo:
    name: str  # the struct type name
    members: list[tuple[str, int]]
    id: int = 0
    fixed_id: int | None = None
    alias: str = ""


@dataclass
class ControllerHeaderInfo:
    name: str  # "packet_in" / "packet_out"
    fields: list[tuple[int, str, int]]  # (id, name, bitwidth)
    id: int = 0
    fixed_id: int | None = None
    alias: str = ""


@dataclass
class ProgramModel:
    actions: list[ActionInfo] = field(default_factory=list)
    tables: list[TableInfo] = field(default_factory=list)
    counters: list[CounterInfo] = field(default_factory=list)
    direct_counters: list[CounterInfo] = field(default_factory=list)
    registers: list[RegisterInfo] = field(default_factory=list)
    digests: list[DigestInfo] = field(default_factory=list)
    controller_headers: list[ControllerHeaderInfo] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # serializable enums that are the type of a table key: name -> (width, members)
    ser_enums: dict[str, tuple[int, list[tuple[str, int]]]] = field(default_factory=dict)


#: The control blocks of a v1model pipeline, by role, in the order a packet runs them.
ROLES = ("parser", "verify", "ingress", "egress", "compute", "deparser")


#: the initial value of a scalar variable (bit<W>, int, enum, error: 0; bool: False)
Scalar = int | bool


@dataclass(frozen=True)
class ProgramFacts:
    """What the back ends need to know about a checked program beyond its P4Info, recorded by
    the checker while it types the program (never re-derived from the generated code).

    ``std_reads`` maps each block role of :data:`ROLES` to the ``standard_metadata`` fields whose
    value that block may read: through a member of any value of type ``standard_metadata_t``
    (the block's parameter, a copy, a sub-control's parameter; its actions, tables and
    sub-controls count as the block), a whole ``standard_metadata_t`` as a field list (digest,
    hash, checksum data), a table's byte counting (``packet_length``). A field that is only
    assigned is not read. Over-approximate: a block that may read a field lists it.

    The layout of the program's state, by P4 names (fields and frame variables as the program
    writes them, in declaration order, with their initial values; ``None`` where the value is not
    a scalar; a backend maps the names to its own, as the general backend's ``attr`` does):
    ``headers`` maps each member of the headers struct to its fields, or to None when the member
    is not a plain header; ``meta`` and ``std`` the user metadata and ``standard_metadata``;
    ``frames`` each block function (``parse``, ``verify``, ``ingress``, ``egress``, ``compute``,
    ``deparse``) and each sub-control function (``sub_N``) to its frame's locals (a
    sub-control's parameters first); ``by_ref`` each sub-control function to its by-reference
    parameters (a struct passed in is the caller's own value, not a copy: its frame entry is
    None). ``action_maps`` maps a table's function to its actions' functions by action id (the
    IR's uids).
    """

    std_reads: Mapping[str, frozenset[str]] = field(default_factory=dict)
    headers: Mapping[str, Mapping[str, Scalar | None] | None] = field(default_factory=dict)
    meta: Mapping[str, Scalar | None] = field(default_factory=dict)
    std: Mapping[str, Scalar | None] = field(default_factory=dict)
    frames: Mapping[str, Mapping[str, Scalar | None]] = field(default_factory=dict)
    by_ref: Mapping[str, frozenset[str]] = field(default_factory=dict)
    action_maps: Mapping[str, Mapping[int, str]] = field(default_factory=dict)

    def reads_std(self, fields: Iterable[str], roles: Iterable[str] = ROLES) -> bool:
        """Whether any of ``roles`` may read any of the standard_metadata ``fields``."""
        want = frozenset(fields)
        return any(want & self.std_reads.get(r, frozenset()) for r in roles)
