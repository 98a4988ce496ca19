"""P4Info emission compatible with p4c's (names, aliases, the id algorithm, scopes, defaults).

Ids: ``(prefix << 24) | (jenkins_one_at_a_time(name) & 0xFFFFFF)``; names are processed in sorted
order per resource type, ``@id`` fixes an id, and collisions linear-probe (as p4c does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .frontend.model import ProgramModel

PREFIX = {
    "action": 0x01,
    "table": 0x02,
    "value_set": 0x03,
    "controller_header": 0x04,
    "action_profile": 0x11,
    "counter": 0x12,
    "direct_counter": 0x13,
    "meter": 0x14,
    "direct_meter": 0x15,
    "register": 0x16,
    "digest": 0x17,
}

_MATCH = {"exact": 2, "lpm": 3, "ternary": 4, "range": 5, "optional": 6}
_SCOPE = {"TABLE_AND_DEFAULT": 0, "TABLE_ONLY": 1, "DEFAULT_ONLY": 2}
_UNIT = {"BOTH": 1, "BYTES": 2, "PACKETS": 3}


def jenkins_one_at_a_time(data: str) -> int:
    h = 0
    for b in data.encode():
        h = (h + b) & 0xFFFFFFFF
        h = (h + (h << 10)) & 0xFFFFFFFF
        h ^= h >> 6
    h = (h + (h << 3)) & 0xFFFFFFFF
    h ^= h >> 11
    h = (h + (h << 15)) & 0xFFFFFFFF
    return h


def p4_id(kind: str, name: str) -> int:
    """The id p4c gives ``name`` of resource type ``kind`` when nothing collides."""
    return (PREFIX[kind] << 24) | (jenkins_one_at_a_time(name) & 0xFFFFFF)


def _assign(kind: str, objs: list[Any]) -> None:
    taken: set[int] = set()
    for o in objs:
        if o.fixed_id is not None:
            o.id = o.fixed_id
            taken.add(o.id)
    for o in sorted((o for o in objs if o.fixed_id is None), key=lambda o: o.name):
        i = p4_id(kind, o.name)
        while i in taken:
            i = (PREFIX[kind] << 24) | ((i + 1) & 0xFFFFFF)
        o.id = i
        taken.add(i)


def _aliases(objs: list[Any]) -> None:
    names = [o.name for o in objs]
    for o in objs:
        parts = o.name.split(".")
        for k in range(1, len(parts) + 1):
            suffix = ".".join(parts[-k:])
            clash = [n for n in names if n == suffix or n.endswith("." + suffix)]
            if len(clash) <= 1:
                o.alias = suffix
                break
        else:
            o.alias = o.name


def assign_ids(m: ProgramModel) -> None:
    """Assign P4Runtime ids and aliases; resolve the cross references in tables/counters."""
    # what the P4Info lists first: a table (or action) left out of it takes its id after them
    _assign("action", sorted(m.actions, key=lambda a: not a.in_p4info))
    _assign("table", sorted(m.tables, key=lambda t: not t.in_p4info))
    _assign("counter", m.counters)
    _assign("direct_counter", m.direct_counters)
    _assign("register", m.registers)
    _assign("digest", m.digests)
    _assign("controller_header", m.controller_headers)
    _aliases(
        [*(a for a in m.actions if not a.in_p4info), *(t for t in m.tables if not t.in_p4info)]
    )
    _aliases(
        [
            *(a for a in m.actions if a.in_p4info),
            *(t for t in m.tables if t.in_p4info),
            *m.counters,
            *m.direct_counters,
            *m.registers,
            *m.digests,
            *m.controller_headers,
        ]
    )
    aid = {a.name: a.id for a in m.actions}
    tid = {t.name: t.id for t in m.tables}
    dcid = {c.name: c.id for c in m.direct_counters}
    for c in m.direct_counters:
        c.direct_table_id = tid[c.direct_table or ""]
    for t in m.tables:
        t.action_ids = [aid[a] for a in t.action_names]
        t.scope_ids = {aid[a]: s for a, s in t.scopes.items()}
        t.ref_annotation_ids = {aid[a]: anns for a, anns in t.ref_annotations.items()}
        t.default_action = (aid[t.default_action_name], t.default_args)
        t.direct_counter_id = dcid[t.direct_counter_name] if t.direct_counter_name else None
        t.const_entries = t.const_entries_src


def build_p4info(m: ProgramModel) -> Any:
    """The ``p4.config.v1.p4info_pb2.P4Info`` message for an id-assigned model."""
    from p4.config.v1 import p4info_pb2  # heavy import, testbed extra only

    p = p4info_pb2.P4Info()
    p.pkg_info.arch = "v1model"

    def add(entries: Any, o: Any, annotations: list[str] | None = None) -> Any:
        """A new message in ``entries`` with the preamble of ``o``."""
        msg = entries.add()
        msg.preamble.id = o.id
        msg.preamble.name = o.name
        msg.preamble.alias = o.alias
        for a in annotations or []:
            msg.preamble.annotations.append(a)
        return msg

    def add_field(entries: Any, fid: int, name: str, bitwidth: int) -> Any:
        """A new match field, action parameter or packet-metadata field in ``entries``."""
        f = entries.add()
        f.id = fid
        f.name = name
        f.bitwidth = bitwidth
        return f

    def by_id(objs: list[Any]) -> list[Any]:
        """``objs`` in id order, without those p4c leaves out of the P4Info."""
        return [o for o in sorted(objs, key=lambda o: o.id) if getattr(o, "in_p4info", True)]

    aname = {a.id: a for a in m.actions}
    for t in by_id(m.tables):
        tm = add(p.tables, t, t.annotations)
        for k in t.keys:
            add_field(tm.match_fields, k.id, k.name, k.bitwidth).match_type = _MATCH[k.match_kind]
        for a in t.action_ids:
            ar = tm.action_refs.add()
            ar.id = a
            sc = t.scope_ids.get(a, "TABLE_AND_DEFAULT")
            ar.scope = _SCOPE[sc]
            if sc == "DEFAULT_ONLY":
                ar.annotations.append("@defaultonly")
            elif sc == "TABLE_ONLY":
                ar.annotations.append("@tableonly")
            ar.annotations.extend(t.ref_annotation_ids.get(a, []))
        if t.const_default:
            tm.const_default_action_id = t.default_action[0]
        tm.initial_default_action.action_id = t.default_action[0]
        da = aname[t.default_action[0]]
        for prm, v in zip(da.params, t.default_action[1], strict=True):
            arg = tm.initial_default_action.arguments.add()
            arg.param_id = prm.id
            # p4c writes the default action's arguments at the parameter's full width
            arg.value = v.to_bytes(max(1, (prm.bitwidth + 7) // 8), "big")
        if t.direct_counter_id is not None:
            tm.direct_resource_ids.append(t.direct_counter_id)
        tm.size = t.size
        if t.is_const:
            tm.is_const_table = True
        if t.const_entries:
            tm.has_initial_entries = True
    for act in by_id(m.actions):
        am = add(p.actions, act, act.annotations)
        for prm in act.params:
            add_field(am.params, prm.id, prm.name, prm.bitwidth)
    for c in by_id(m.counters):
        cm = add(p.counters, c)
        cm.spec.unit = _UNIT[c.unit]
        cm.size = c.size
    for c in by_id(m.direct_counters):
        dm = add(p.direct_counters, c)
        dm.spec.unit = _UNIT[c.unit]
        dm.direct_table_id = c.direct_table_id
    for ch in by_id(m.controller_headers):
        hm = add(p.controller_packet_metadata, ch, [f'@controller_header("{ch.name}")'])
        for fid, fname, bw in ch.fields:
            add_field(hm.metadata, fid, fname, bw)
    for r in by_id(m.registers):
        rm = add(p.registers, r)
        rm.type_spec.bitstring.bit.bitwidth = r.bitwidth
        rm.size = r.size
    for d in by_id(m.digests):
        dg = add(p.digests, d)
        dg.type_spec.struct.name = d.name
        st = p.type_info.structs[d.name]
        for mname, bw in d.members:
            mm = st.members.add()
            mm.name = mname
            mm.type_spec.bitstring.bit.bitwidth = bw
    for ename, (width, members) in sorted(m.ser_enums.items()):
        se = p.type_info.serializable_enums[ename]
        se.underlying_type.bitwidth = width
        for mname, v in members:
            sm = se.members.add()
            sm.name = mname
            sm.value = (v & ((1 << width) - 1)).to_bytes((width + 7) // 8, "big")
    return p


def write_p4info(p4info: Any, path: str | Path) -> None:
    """Write in the format the suffix names: .txtpb/.txt (text), .json, .bin (p4c's rule)."""
    from google.protobuf import json_format, text_format  # type: ignore[import-untyped]

    path = Path(path)
    if path.suffix in (".txtpb", ".txt"):
        path.write_text(text_format.MessageToString(p4info))
    elif path.suffix == ".json":
        path.write_text(json_format.MessageToJson(p4info))
    elif path.suffix == ".bin":
        path.write_bytes(p4info.SerializeToString())
    else:
        raise ValueError(f"unknown P4Info format for {path} (use .txtpb, .txt, .json or .bin)")
