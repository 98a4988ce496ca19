"""``shadowgrad-run-exercise``: run a p4lang/tutorials exercise folder on a P4Runtime switch in
Mininet, with the command line of the tutorials' ``utils/run_exercise.py`` (written here to
match its behaviour and file formats, not copied)::

    shadowgrad-run-exercise -t topology.json -j build/basic.json -b sg-switch-grpc \\
        [-l logs] [-p pcaps] [-q]

It reads ``topology.json`` (``hosts`` with ``ip``, ``mac``, ``commands``; ``switches`` with
``runtime_json``, ``program``, ``cpu_port``, ``priority_queues``; ``links`` such as
``["h1", "s1-p1"]`` or ``["s1-p3", "s2-p1"]``), builds the network with
:class:`~shadowgrad.bmv2_testbed.p4_mininet.P4RuntimeSwitch` (``sw_path`` = ``-b``,
``json_path`` = the switch's ``program`` or ``-j``, ``--log-console``, ``--pcap`` into ``-p``,
its log in ``-l``/``<switch>.log``; switch number ``i`` in the file's order gets device id
``i``, gRPC port ``50051 + i`` and Thrift port ``9090 + i``, as the tutorials assign them)
and :class:`~shadowgrad.bmv2_testbed.p4_mininet.P4Host`, programs every switch from its
``sN-runtime.json`` over P4Runtime with the project's client (pipeline push, then
``table_entries``, ``multicast_group_entries``, ``clone_session_entries``; every request
logged to ``-l``/``<switch>-p4runtime-requests.txt``), runs each host's ``commands``, and opens
Mininet's CLI on stdin. Leaving the CLI (``exit``, end of input) tears the network down: the
switch processes, the hosts, the links. So does SIGTERM or SIGHUP at any time, and Ctrl-C
(SIGINT) before the CLI is open; at the CLI prompt Ctrl-C interrupts the running command, as
in Mininet.

Differences from the tutorials' script (docs/switch-target.md, *The p4lang/tutorials
workflow*):

* ``-b`` defaults to ``sg-switch-grpc`` (the tutorials: ``simple_switch``) and must be a
  P4Runtime target (its name contains ``grpc``); the Thrift-only ``P4Switch`` and a switch's
  ``cli_input`` (``simple_switch_CLI``) are refused with an error.
* Link ``latency`` and ``bandwidth`` are ignored with a logged warning (the tutorials use
  ``TCLink``, i.e. tc netem/htb, which this kernel lacks); ``0``/``"0ms"`` is no latency and is
  accepted silently.
* A gRPC port that another process already listens on is skipped, with a warning, for the
  next free one (the tutorials exit).
* Everything is checked before the network is built (the files, every table, field, action,
  parameter and value against the P4Info), and a bad file is reported as one line naming the
  file and the entry, with exit status 1, not as a traceback.
* Paths in a runtime file are relative to the current folder, as in the tutorials, or else to
  the runtime file's folder.
* The device config pushed is the ``bmv2_json`` file's bytes as they are (what
  ``shadowgrad-p4c`` writes and ``sg-switch-grpc`` loads; also what p4runtime-shell pushes to
  bmv2), not wrapped in the deprecated ``p4.tmp.P4DeviceConfig``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowgrad.errors import ShadowgradError

__all__ = [
    "ExerciseError",
    "ExerciseRunner",
    "ExerciseTopology",
    "Link",
    "SwitchProgramming",
    "encode_value",
    "load_runtime",
    "load_topology",
    "main",
]

log = logging.getLogger(__name__)

#: the tutorials' first gRPC and Thrift ports (``P4RuntimeSwitch.next_grpc_port`` ...)
GRPC_PORT_BASE = 50051
THRIFT_PORT_BASE = 9090
#: seconds to wait for a switch's P4Runtime server, and the deadline of every RPC
CONNECT_WAIT_S = 30.0
RPC_TIMEOUT_S = 30.0

_MAC = re.compile(r"^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$")
_IPV4 = re.compile(r"^(\d{1,3}\.){3}\d{1,3}$")
_SWITCH_NODE = re.compile(r"^([^-\s]+)-p(\d+)$")
_LATENCY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s)?\s*$")


class ExerciseError(ShadowgradError):
    """A bad command line, topology file or runtime file (the message names which, and
    where), or a switch that could not be programmed."""


# ------------------------------------------------------------------------------ topology
@dataclass(frozen=True)
class Link:
    """One link of ``topology.json``: ``node1``/``node2`` are node names, ``port1``/``port2``
    the switch port numbers (``None`` on a host's side)."""

    node1: str
    port1: int | None
    node2: str
    port2: int | None
    latency: str = "0ms"
    bandwidth: float | None = None


@dataclass
class ExerciseTopology:
    """A parsed ``topology.json``."""

    hosts: dict[str, dict[str, Any]]
    switches: dict[str, dict[str, Any]]
    links: list[Link]
    source: Path


def _load_json(path: Path, what: str) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise ExerciseError(f"{what} {path}: cannot read it: {e.strerror or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ExerciseError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None


def _latency_is_zero(v: Any) -> bool:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v) == 0.0
    if isinstance(v, str) and (m := _LATENCY.match(v)):
        return float(m.group(1)) == 0.0
    return False


def _parse_link(path: Path, i: int, raw: Any, hosts: dict[str, Any], switches: Any) -> Link:
    where = f"{path}: links[{i}]"
    if not isinstance(raw, list) or not 2 <= len(raw) <= 4:
        raise ExerciseError(
            f'{where}: a link is ["node1", "node2"] with an optional latency and bandwidth, '
            f"got {raw!r}"
        )
    ends: list[tuple[str, int | None]] = []
    for node in raw[:2]:
        if not isinstance(node, str):
            raise ExerciseError(f"{where}: {node!r} is not a node name")
        if node in hosts:
            ends.append((node, None))
            continue
        m = _SWITCH_NODE.match(node)
        if m is None:
            raise ExerciseError(
                f"{where}: {node!r} is neither a host of 'hosts' nor a switch port "
                f"'<switch>-p<port>' (e.g. 's1-p1')"
            )
        sw, port = m.group(1), int(m.group(2))
        if sw not in switches:
            raise ExerciseError(f"{where}: {node!r}: no switch {sw!r} in 'switches'")
        if not 1 <= port <= 510:
            raise ExerciseError(f"{where}: {node!r}: port {port} is not in 1..510")
        ends.append((sw, port))
    if ends[0][1] is None and ends[1][1] is None:
        raise ExerciseError(f"{where}: hosts are connected to switches, not to each other")
    if ends[0][1] is None or (ends[1][1] is not None and ends[0][0] > ends[1][0]):
        ends.reverse()  # host-switch links: the host second; switch links in name order
    latency = raw[2] if len(raw) > 2 else "0ms"
    bandwidth = raw[3] if len(raw) > 3 else None
    if not isinstance(latency, str | int | float) or isinstance(latency, bool):
        raise ExerciseError(f"{where}: latency {latency!r} is not a number or a string")
    if bandwidth is not None and (
        not isinstance(bandwidth, int | float) or isinstance(bandwidth, bool)
    ):
        raise ExerciseError(f"{where}: bandwidth {bandwidth!r} is not a number (Mbit/s)")
    lat = latency if isinstance(latency, str) else f"{latency}ms"
    if not _latency_is_zero(latency) or bandwidth is not None:
        log.warning(
            "%s: latency %s / bandwidth %s ignored: the link is a plain veth pair (the "
            "tutorials shape it with tc netem/htb, which this kernel does not have)",
            where,
            lat,
            bandwidth,
        )
    (n1, p1), (n2, p2) = ends
    return Link(n1, p1, n2, p2, lat, None if bandwidth is None else float(bandwidth))


def load_topology(path: str | Path) -> ExerciseTopology:
    """Read and check a tutorials ``topology.json``; raise :class:`ExerciseError` naming the
    file and the key when it is not one."""
    path = Path(path)
    doc = _load_json(path, "topology file")
    if not isinstance(doc, dict):
        raise ExerciseError(f"{path}: the topology is a JSON object, got {type(doc).__name__}")
    for key in ("hosts", "switches", "links"):
        if key not in doc:
            raise ExerciseError(f"{path}: missing key {key!r}")
    hosts, switches, raw_links = doc["hosts"], doc["switches"], doc["links"]
    if not isinstance(hosts, dict) or not isinstance(switches, dict):
        raise ExerciseError(f"{path}: 'hosts' and 'switches' are JSON objects keyed by name")
    if not isinstance(raw_links, list):
        raise ExerciseError(f"{path}: 'links' is a list")
    if not switches:
        raise ExerciseError(f"{path}: no switches")
    for name, h in hosts.items():
        where = f"{path}: hosts.{name}"
        if not isinstance(h, dict):
            raise ExerciseError(f"{where}: a host is a JSON object")
        if name in switches:
            raise ExerciseError(f"{where}: {name!r} is also a switch")
        if not isinstance(h.get("ip"), str):
            raise ExerciseError(f"{where}.ip: missing, or not a string like '10.0.1.1/24'")
        try:
            ipaddress.ip_interface(h["ip"])
        except ValueError:
            raise ExerciseError(f"{where}.ip: {h['ip']!r} is not an IP address") from None
        if "mac" in h and not (isinstance(h["mac"], str) and _MAC.match(h["mac"])):
            raise ExerciseError(f"{where}.mac: {h['mac']!r} is not a MAC address")
        cmds = h.get("commands", [])
        if not isinstance(cmds, list) or not all(isinstance(c, str) for c in cmds):
            raise ExerciseError(f"{where}.commands: a list of shell command strings")
    for name, s in switches.items():
        where = f"{path}: switches.{name}"
        if not isinstance(s, dict):
            raise ExerciseError(f"{where}: a switch is a JSON object")
        if "-" in name or not name:
            raise ExerciseError(f"{where}: a switch name has no '-' (links name 'name-pN')")
        if "cli_input" in s:
            raise ExerciseError(
                f"{where}.cli_input: programming a switch through simple_switch_CLI (Thrift) "
                f"is not supported; give a runtime_json (P4Runtime) instead"
            )
        for key in ("runtime_json", "program"):
            if key in s and not isinstance(s[key], str):
                raise ExerciseError(f"{where}.{key}: a file path")
        for key in ("cpu_port", "priority_queues"):
            if key in s:
                try:
                    s[key] = int(s[key])
                except (TypeError, ValueError):
                    raise ExerciseError(f"{where}.{key}: {s[key]!r} is not a number") from None
    links = [_parse_link(path, i, raw, hosts, switches) for i, raw in enumerate(raw_links)]
    used: dict[tuple[str, int], int] = {}
    linked: set[str] = set()
    for i, ln in enumerate(links):
        for node, port in ((ln.node1, ln.port1), (ln.node2, ln.port2)):
            if port is None:
                if node in linked:
                    raise ExerciseError(
                        f"{path}: links[{i}]: host {node!r} has a second link (a host has one)"
                    )
                linked.add(node)
            elif (node, port) in used:
                raise ExerciseError(
                    f"{path}: links[{i}]: port {port} of {node!r} is already used by "
                    f"links[{used[(node, port)]}]"
                )
            else:
                used[(node, port)] = i
    for name in hosts:
        if name not in linked:
            raise ExerciseError(f"{path}: host {name!r} has no link")
    return ExerciseTopology(dict(hosts), dict(switches), links, path)


# ------------------------------------------------------------------------------ runtime files
def encode_value(value: Any, bitwidth: int, what: str) -> bytes:
    """A runtime-file value as P4Runtime bytes of ``ceil(bitwidth / 8)`` bytes, as the
    tutorials' ``convert.encode`` does: an integer (negative: two's complement), a MAC
    ``"08:00:00:00:01:11"``, an IPv4 ``"10.0.1.1"`` or an IPv6 address; a one-element list is
    its element. ``what`` names the value in the error."""
    nbytes = max(1, math.ceil(bitwidth / 8))
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ExerciseError(f"{what}: {value!r} is not a number, MAC, IPv4 or IPv6 address string")
    if isinstance(value, int):
        n = value
        if n < 0:
            if n < -(1 << (bitwidth - 1)):
                raise ExerciseError(f"{what}: {value} does not fit in {bitwidth} bits")
            n += 1 << bitwidth
        if n >> bitwidth:
            raise ExerciseError(f"{what}: {value} does not fit in {bitwidth} bits")
        return n.to_bytes(nbytes, "big")
    if _MAC.match(value):
        raw = bytes.fromhex(value.replace(":", ""))
    elif _IPV4.match(value):
        try:
            raw = socket.inet_aton(value)
        except OSError:
            raise ExerciseError(f"{what}: {value!r} is not an IPv4 address") from None
    else:
        try:
            raw = socket.inet_pton(socket.AF_INET6, value)
        except OSError:
            raise ExerciseError(
                f"{what}: {value!r} is not a number, MAC, IPv4 or IPv6 address"
            ) from None
    if len(raw) != nbytes:
        raise ExerciseError(
            f"{what}: {value!r} is {len(raw) * 8} bits wide, the field {bitwidth} bits"
        )
    return raw


@dataclass
class SwitchProgramming:
    """What one ``sN-runtime.json`` asks of a switch: the pipeline (P4Info and device
    config) and the updates, each with a line that describes it, in the order written."""

    source: Path
    p4info_path: Path
    device_config_path: Path
    p4info: Any
    device_config: bytes
    updates: list[tuple[str, Any]] = field(default_factory=list)


def _resolve(name: str, runtime: Path, where: str) -> Path:
    for base in (Path.cwd(), runtime.parent):
        p = base / name
        if p.is_file():
            return p
    raise ExerciseError(
        f"{where}: no file {name!r} (looked in {Path.cwd()} and {runtime.parent}; "
        f"is the program compiled?)"
    )


class _P4InfoIndex:
    def __init__(self, info: Any, source: Path) -> None:
        self.info = info
        self.source = source

    def _find(self, kind: str, name: str, where: str) -> Any:
        for o in getattr(self.info, kind):
            if name in (o.preamble.name, o.preamble.alias):
                return o
        have = ", ".join(sorted(o.preamble.name for o in getattr(self.info, kind))) or "none"
        raise ExerciseError(f"{where}: no {kind[:-1]} {name!r} in {self.source} (it has: {have})")

    def table(self, name: str, where: str) -> Any:
        return self._find("tables", name, where)

    def action(self, name: str, where: str) -> Any:
        return self._find("actions", name, where)


def _table_update(ix: _P4InfoIndex, i: int, e: Any, where0: str) -> tuple[str, Any]:
    from p4.config.v1 import p4info_pb2
    from p4.v1 import p4runtime_pb2

    where = f"{where0}: table_entries[{i}]"
    if not isinstance(e, dict):
        raise ExerciseError(f"{where}: an entry is a JSON object")
    for key in ("table", "action_name"):
        if not isinstance(e.get(key), str):
            raise ExerciseError(f"{where}: missing {key!r} (a name)")
    t = ix.table(e["table"], where)
    match = e.get("match") or {}
    default = bool(e.get("default_action", False))
    priority = e.get("priority")
    params = e.get("action_params") or {}
    if not isinstance(match, dict) or not isinstance(params, dict):
        raise ExerciseError(f"{where}: 'match' and 'action_params' are JSON objects")
    if default and match:
        raise ExerciseError(f"{where}: a default_action entry has no match")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ExerciseError(f"{where}.priority: {priority!r} is not a number")
    te = p4runtime_pb2.TableEntry(table_id=t.preamble.id)
    if priority is not None:
        te.priority = priority
    mt = p4info_pb2.MatchField
    fields = {mf.name: mf for mf in t.match_fields}
    for fname, v in match.items():
        w = f"{where}.match[{fname!r}]"
        mf = fields.get(fname)
        if mf is None:
            raise ExerciseError(
                f"{w}: table {t.preamble.name} has no match field {fname!r} "
                f"(it has: {', '.join(fields) or 'none'})"
            )
        fm = te.match.add(field_id=mf.id)
        bw = mf.bitwidth
        kind = mf.match_type
        pair = isinstance(v, list) and len(v) == 2
        if kind == mt.EXACT:
            fm.exact.value = encode_value(v, bw, w)
        elif kind == mt.OPTIONAL:
            fm.optional.value = encode_value(v, bw, w)
        elif not pair:
            shape = {mt.LPM: "[value, prefix length]", mt.TERNARY: "[value, mask]"}
            raise ExerciseError(
                f"{w}: {mt.MatchType.Name(kind).lower()} match: a pair "
                f"{shape.get(kind, '[low, high]')}, got {v!r}"
            )
        elif kind == mt.LPM:
            if isinstance(v[1], bool) or not isinstance(v[1], int) or not 0 <= v[1] <= bw:
                raise ExerciseError(f"{w}: prefix length {v[1]!r} is not in 0..{bw}")
            fm.lpm.value = encode_value(v[0], bw, w)
            fm.lpm.prefix_len = v[1]
        elif kind == mt.TERNARY:
            fm.ternary.value = encode_value(v[0], bw, w)
            fm.ternary.mask = encode_value(v[1], bw, w)
        elif kind == mt.RANGE:
            fm.range.low = encode_value(v[0], bw, w)
            fm.range.high = encode_value(v[1], bw, w)
        else:
            raise ExerciseError(f"{w}: match type {kind} is not supported")
        if kind in (mt.TERNARY, mt.RANGE, mt.OPTIONAL) and not priority:
            raise ExerciseError(
                f"{where}: table {t.preamble.name} has a ternary, range or optional match: "
                f"the entry needs a non-zero 'priority'"
            )
    a = ix.action(e["action_name"], where)
    if t.action_refs and a.preamble.id not in {r.id for r in t.action_refs}:
        raise ExerciseError(
            f"{where}: action {a.preamble.name} is not an action of table {t.preamble.name}"
        )
    declared = {p.name: p for p in a.params}
    unknown = sorted(set(params) - set(declared))
    missing = [n for n in declared if n not in params]
    if unknown or missing:
        raise ExerciseError(
            f"{where}.action_params: action {a.preamble.name} takes "
            f"({', '.join(declared) or 'no parameters'})"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    act = te.action.action
    act.action_id = a.preamble.id
    for pname, p in declared.items():
        act.params.add(
            param_id=p.id,
            value=encode_value(params[pname], p.bitwidth, f"{where}.action_params.{pname}"),
        )
    if default:
        te.is_default_action = True
    up = p4runtime_pb2.Update(
        type=p4runtime_pb2.Update.MODIFY if default else p4runtime_pb2.Update.INSERT
    )
    up.entity.table_entry.CopyFrom(te)
    key = (
        "(default action)"
        if default
        else ", ".join(f"{k}={v}" for k, v in match.items()) or "(any)"
    )
    args = ", ".join(f"{k}={v}" for k, v in params.items())
    return f"{t.preamble.name}: {key} => {a.preamble.name}({args})", up


def _replicas(where: str, e: dict[str, Any]) -> list[tuple[int, int]]:
    reps = e.get("replicas")
    if not isinstance(reps, list):
        raise ExerciseError(f"{where}.replicas: a list of {{'egress_port': N, 'instance': M}}")
    out = []
    for j, r in enumerate(reps):
        if not isinstance(r, dict) or not isinstance(r.get("egress_port"), int):
            raise ExerciseError(f"{where}.replicas[{j}]: needs 'egress_port' (a number)")
        inst = r.get("instance", 0)
        if isinstance(inst, bool) or not isinstance(inst, int):
            raise ExerciseError(f"{where}.replicas[{j}].instance: {inst!r} is not a number")
        out.append((int(r["egress_port"]), inst))
    return out


def _pre_updates(conf: dict[str, Any], where0: str) -> list[tuple[str, Any]]:
    from p4.v1 import p4runtime_pb2

    out: list[tuple[str, Any]] = []
    for i, e in enumerate(conf.get("multicast_group_entries") or []):
        where = f"{where0}: multicast_group_entries[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("multicast_group_id"), int):
            raise ExerciseError(f"{where}: needs 'multicast_group_id' (a number)")
        reps = _replicas(where, e)
        up = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
        mg = up.entity.packet_replication_engine_entry.multicast_group_entry
        mg.multicast_group_id = e["multicast_group_id"]
        for port, inst in reps:
            mg.replicas.add(egress_port=port, instance=inst)
        desc = ", ".join(str(p) for p, _ in reps)
        out.append((f"Group {e['multicast_group_id']} => ({desc})", up))
    for i, e in enumerate(conf.get("clone_session_entries") or []):
        where = f"{where0}: clone_session_entries[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("clone_session_id"), int):
            raise ExerciseError(f"{where}: needs 'clone_session_id' (a number)")
        reps = _replicas(where, e)
        length = e.get("packet_length_bytes", 0)
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ExerciseError(f"{where}.packet_length_bytes: {length!r} is not a size")
        up = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
        cs = up.entity.packet_replication_engine_entry.clone_session_entry
        cs.session_id = e["clone_session_id"]
        cs.packet_length_bytes = length
        for port, inst in reps:
            cs.replicas.add(egress_port=port, instance=inst)
        desc = ", ".join(str(p) for p, _ in reps)
        trunc = f"{length}B" if length else "NO_TRUNCATION"
        out.append((f"Clone Session {e['clone_session_id']} => ({desc}) ({trunc})", up))
    return out


def load_runtime(path: str | Path) -> SwitchProgramming:
    """Read and check a tutorials ``sN-runtime.json``: its P4Info and device config files, and
    every entry against the P4Info (encoded as P4Runtime updates, nothing sent). Raises
    :class:`ExerciseError` naming the file and the entry."""
    from google.protobuf import text_format  # type: ignore[import-untyped]
    from p4.config.v1 import p4info_pb2

    path = Path(path)
    conf = _load_json(path, "runtime file")
    where = str(path)
    if not isinstance(conf, dict):
        raise ExerciseError(f"{where}: a runtime file is a JSON object")
    target = conf.get("target")
    if target != "bmv2":
        raise ExerciseError(
            f"{where}: 'target' is {target!r}; the tutorials' runtime files say 'bmv2' "
            f"(any P4Runtime switch of this kind)"
        )
    for key in ("p4info", "bmv2_json"):
        if not isinstance(conf.get(key), str) or not conf[key]:
            raise ExerciseError(f"{where}: missing key {key!r} or empty value")
    info_path = _resolve(conf["p4info"], path, f"{where}: p4info")
    cfg_path = _resolve(conf["bmv2_json"], path, f"{where}: bmv2_json")
    info = p4info_pb2.P4Info()
    try:
        text_format.Merge(info_path.read_text(), info, allow_unknown_field=True)
    except (text_format.ParseError, UnicodeDecodeError) as e:
        raise ExerciseError(f"{info_path}: not a P4Info in protobuf text format: {e}") from None
    for key in ("table_entries", "multicast_group_entries", "clone_session_entries"):
        if key in conf and not isinstance(conf[key], list):
            raise ExerciseError(f"{where}: {key!r} is a list")
    ix = _P4InfoIndex(info, info_path)
    prog = SwitchProgramming(path, info_path, cfg_path, info, cfg_path.read_bytes())
    for i, entry in enumerate(conf.get("table_entries") or []):
        prog.updates.append(_table_update(ix, i, entry, where))
    prog.updates.extend(_pre_updates(conf, where))
    return prog


def program_switch(
    name: str,
    addr: str,
    device_id: int,
    prog: SwitchProgramming,
    *,
    request_log: Path | None,
    say: Any = print,
) -> None:
    """Push ``prog``'s pipeline to the switch at ``addr`` and write its updates, one Write
    each, in order (the tutorials' ``simple_controller.program_switch``). A refused pipeline
    or update raises :class:`ExerciseError`."""
    from shadowgrad.controller.p4runtime import P4RuntimeClient
    from shadowgrad.errors import P4RuntimeError

    say(f" - Using P4Info file {prog.p4info_path}...")
    say(f" - Connecting to P4Runtime server on {addr} (device {device_id})...")
    with P4RuntimeClient(
        addr, device_id=device_id, timeout_s=RPC_TIMEOUT_S, request_log=request_log
    ) as client:
        try:
            client.connect(wait_s=CONNECT_WAIT_S)
            say(f" - Setting pipeline config ({prog.device_config_path})...")
            client.set_pipeline(prog.p4info, prog.device_config)
        except P4RuntimeError as e:
            raise ExerciseError(f"{name}: {prog.source}: {e}") from None
        n_tables = sum(1 for _, u in prog.updates if u.entity.HasField("table_entry"))
        if n_tables:
            say(f" - Inserting {n_tables} table entries...")
        for desc, up in prog.updates:
            say(f" - {desc}")
            try:
                client.write([up])
            except P4RuntimeError as e:
                raise ExerciseError(f"{name}: {prog.source}: {desc}: {e}") from None


# ------------------------------------------------------------------------------ the runner
def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _find_exe(exe: str) -> str:
    found = shutil.which(exe)
    if found is None and os.sep not in exe:
        here = Path(sys.executable).parent / exe  # the venv's own scripts
        if here.is_file() and os.access(here, os.X_OK):
            found = str(here)
    if found is None:
        raise ExerciseError(f"-b {exe}: no such executable (on PATH or as a path)")
    return found


class ExerciseRunner:
    """The tutorials' ``ExerciseRunner``: ``__init__`` reads and checks every file (nothing
    is started), :meth:`run` builds the network, programs hosts and switches, opens the CLI
    and tears everything down when it returns or on SIGTERM/SIGHUP."""

    def __init__(  # noqa: PLR0917 (the tutorials' ExerciseRunner takes these positionally)
        self,
        topo_file: str | Path,
        log_dir: str | Path,
        pcap_dir: str | Path,
        switch_json: str | Path | None,
        bmv2_exe: str = "sg-switch-grpc",
        quiet: bool = False,
    ) -> None:
        self.quiet = quiet
        self.logger("Reading topology file.")
        self.topo = load_topology(topo_file)
        if "grpc" not in Path(bmv2_exe).name:
            raise ExerciseError(
                f"-b {bmv2_exe}: only P4Runtime targets are supported (sg-switch-grpc, "
                f"simple_switch_grpc); the Thrift-only P4Switch is not"
            )
        self.bmv2_exe = _find_exe(bmv2_exe)
        self.switch_json = Path(switch_json) if switch_json else None
        self.programs: dict[str, Path | None] = {}
        for name, s in self.topo.switches.items():
            prog = Path(s["program"]) if "program" in s else self.switch_json
            if prog is not None and not prog.is_file():
                src = f"switches.{name}.program" if "program" in s else "-j"
                raise ExerciseError(f"{src}: no program file {prog} (is it compiled?)")
            self.programs[name] = prog
        self.runtime: dict[str, SwitchProgramming] = {}
        for name, s in self.topo.switches.items():
            if "runtime_json" in s:
                self.runtime[name] = load_runtime(s["runtime_json"])
        self.log_dir = Path(log_dir)
        self.pcap_dir = Path(pcap_dir)
        for d in (self.log_dir, self.pcap_dir):
            if d.exists() and not d.is_dir():
                raise ExerciseError(f"{d} exists and is not a directory")
            d.mkdir(parents=True, exist_ok=True)
        self.net: Any = None

    def logger(self, *items: str) -> None:
        if not self.quiet:
            print(" ".join(items), flush=True)

    def _say(self, line: str) -> None:
        self.logger(line)

    # -- network ----------------------------------------------------------------------------
    def create_network(self) -> None:
        """Hosts, switches (started by ``net.start()`` in :meth:`run`) and links."""
        from .p4_mininet import P4RuntimeSwitch, new_mininet

        self.logger("Building mininet topology.")
        self.net = net = new_mininet()
        taken: set[int] = set()
        for i, (name, s) in enumerate(self.topo.switches.items()):
            grpc = GRPC_PORT_BASE + i
            while grpc in taken or not _port_free(grpc):
                log.warning("gRPC port %d is in use: switch %s takes the next", grpc, name)
                grpc += 1
            taken.add(grpc)
            prog = self.programs[name]
            net.addSwitch(
                name,
                cls=P4RuntimeSwitch,
                sw_path=self.bmv2_exe,
                json_path=str(prog) if prog else None,
                grpc_port=grpc,
                thrift_port=THRIFT_PORT_BASE + i,
                device_id=i,
                log_console=True,
                pcap_dump=str(self.pcap_dir),
                log_file=str(self.log_dir / f"{name}.log"),
                cpu_port=s.get("cpu_port"),
                priority_queues=s.get("priority_queues"),
            )
        for ln in self.topo.links:
            if ln.port1 is None or ln.port2 is None:
                h_name, sw_name, sw_port = (
                    (ln.node1, ln.node2, ln.port2)
                    if ln.port1 is None
                    else (ln.node2, ln.node1, ln.port1)
                )
                h = self.topo.hosts[h_name]
                net.addHost(h_name, ip=h["ip"], mac=h.get("mac"))
                net.addLink(h_name, sw_name, port2=sw_port)
            else:
                net.addLink(ln.node1, ln.node2, port1=ln.port1, port2=ln.port2)

    def program_hosts(self) -> None:
        """Each host's ``commands``, in its shell, in order."""
        for name, h in self.topo.hosts.items():
            node = self.net.get(name)
            for cmd in h.get("commands", []):
                out = node.cmd(cmd)
                log.debug("%s: %s -> %s", name, cmd, out.strip())
                if out.strip():
                    self.logger(f"{name}$ {cmd}: {out.strip()}")

    def program_switches(self) -> None:
        """Every switch from its runtime file, over P4Runtime."""
        for name in self.topo.switches:
            prog = self.runtime.get(name)
            if prog is None:
                self.logger(f"Warning: No control plane file provided for switch {name}.")
                continue
            sw = self.net.get(name)
            self.logger(f"Configuring switch {name} using P4Runtime with file {prog.source}")
            program_switch(
                name,
                f"127.0.0.1:{sw.grpc_port}",
                sw.device_id,
                prog,
                request_log=self.log_dir / f"{name}-p4runtime-requests.txt",
                say=self._say,
            )

    def do_net_cli(self, stdin: Any = None) -> None:
        """Describe the nodes and open Mininet's CLI (returns when the user leaves it)."""
        from mininet.cli import CLI

        for s in self.net.switches:
            print(s.describe())
        for h in self.net.hosts:
            print(h.describe())
        self.logger("Starting mininet CLI")
        print(
            "\n"
            "======================================================================\n"
            "Welcome to the P4 Mininet CLI (shadowgrad-run-exercise)!\n"
            "======================================================================\n"
            f"Your P4 program runs on {Path(self.bmv2_exe).name} and your initial runtime\n"
            "configuration is loaded. You can interact with the network using the\n"
            "mininet CLI below; leaving it (exit, Ctrl-D) tears the network down.\n"
            "\n"
            f"Switch logs:           {self.log_dir}/<switchname>.log\n"
            f"P4Runtime requests:    {self.log_dir}/<switchname>-p4runtime-requests.txt\n"
            f"Switch pcaps:          {self.pcap_dir}/<switchname>-ethN_in.pcap, _out.pcap\n",
            flush=True,
        )
        CLI(self.net, stdin=stdin or sys.stdin)

    def close(self) -> None:
        """Stop the switches, hosts and links (idempotent)."""
        from .p4_mininet import stop_mininet

        net, self.net = self.net, None
        if net is not None:
            stop_mininet(net)

    def run_exercise(self, stdin: Any = None) -> None:
        """Build and start the network, program it, open the CLI; tear down when the CLI
        returns, on an error, on SIGTERM/SIGHUP (SystemExit 128+N), or on Ctrl-C outside the
        CLI (KeyboardInterrupt). A signal that arrives during the teardown waits for it."""

        def on_term(signum: int, _frame: Any) -> None:
            raise SystemExit(128 + signum)

        saved = {sig: signal.signal(sig, on_term) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            self.create_network()
            self.net.start()
            self.program_hosts()
            self.program_switches()
            self.do_net_cli(stdin)
        finally:
            held: list[int] = []
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                saved.setdefault(sig, signal.getsignal(sig))
                signal.signal(sig, lambda n, _f: held.append(n))
            try:
                self.logger("Stopping the network.")
                self.close()
            finally:
                for sig, h in saved.items():
                    signal.signal(sig, h)
            if held:
                log.info("signal %d arrived during the teardown", held[0])


# ------------------------------------------------------------------------------ command line
def configure(p: argparse.ArgumentParser) -> None:
    """run_exercise.py's options."""
    cwd = Path.cwd()
    p.add_argument("-q", "--quiet", action="store_true", help="Suppress log messages.")
    p.add_argument("-t", "--topo", default="./topology.json", help="Path to topology json")
    p.add_argument("-l", "--log-dir", default=str(cwd / "logs"), help="Folder for logs")
    p.add_argument("-p", "--pcap-dir", default=str(cwd / "pcaps"), help="Folder for pcaps")
    p.add_argument(
        "-j", "--switch_json", default=None, help="The compiled program (shadowgrad-p4c -o)"
    )
    p.add_argument(
        "-b",
        "--behavioral-exe",
        default="sg-switch-grpc",
        help="Path to behavioral executable (a P4Runtime switch; default sg-switch-grpc)",
    )


def _unmute() -> None:
    """Importing Mininet makes every logger created afterwards a ``MininetLogger`` at
    Mininet's own level (``output``, above INFO): give the project's loggers back to the root
    logger's level."""
    for name, lg in list(logging.root.manager.loggerDict.items()):
        if name.startswith("shadowgrad") and isinstance(lg, logging.Logger):
            lg.setLevel(logging.NOTSET)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="shadowgrad-run-exercise", description=(__doc__ or "").split("\n")[0]
    )
    configure(p)
    args = p.parse_args(argv)
    from shadowgrad._log import configure as configure_logging

    configure_logging("WARNING" if args.quiet else "INFO")
    try:
        from shadowgrad.bmv2_testbed.topology import can_mininet

        why = can_mininet()
        if why is not None:
            raise ExerciseError(f"cannot build a Mininet network here: {why}")
        from . import p4_mininet  # noqa: F401 (imports Mininet: see _unmute)

        _unmute()
        runner = ExerciseRunner(
            args.topo,
            args.log_dir,
            args.pcap_dir,
            args.switch_json,
            args.behavioral_exe,
            args.quiet,
        )
        runner.run_exercise()
    except ExerciseError as e:
        print(f"shadowgrad-run-exercise: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("shadowgrad-run-exercise: interrupted; the network is torn down", file=sys.stderr)
        return 130
    except SystemExit as e:
        if isinstance(e.code, int) and e.code > 128:
            print(
                f"shadowgrad-run-exercise: signal {e.code - 128}; the network is torn down",
                file=sys.stderr,
            )
        raise
    except (OSError, RuntimeError) as e:  # a switch that did not start, a port in use
        print(f"shadowgrad-run-exercise: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
