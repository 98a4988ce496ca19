"""The switch driver: from the job spec and the layout, the desired state of the ToR program
``p4/shadowgrad.p4`` (pipeline, table entries, multicast groups), and convergence to it over
P4Runtime — read, diff, write only the difference, so a restarted controller writes nothing
that is already right (docs/switch.md, docs/operations.md).

One class per P4 control, mirroring ``p4/`` (p4app-switchML's pattern); an ingress stage is a
sub-control instance of ``SgIngress``, so its tables and actions are named by the instance path
(``SgIngress.forward.ipv4_forward``), as p4c names them in the P4Info (:attr:`_Stage.CONTROL`):

=====================  ==========================================  ============================
class                  P4 file, control (instance)                 tables / groups it owns for
                                                                   a job
=====================  ==========================================  ============================
:class:`ForwardStage`  ``p4/ingress_forward.p4``, ``SgForward``    ``ipv4_forward``,
                       (``SgIngress.forward``)                     ``l2_forward``, ``l2_flood``
                                                                   + the job's flood group
:class:`GuardStage`    ``p4/ingress_guard.p4``, ``SgGuard``        ``jobs`` (+ the COMMIT
                       (``SgIngress.guard``)                       group), ``trainer_ports``
:class:`TapStage`      ``p4/ingress_tap.p4``, ``SgTap``            ``tap``, ``shard_groups`` +
                       (``SgIngress.tap``)                         one group per (shard, next
                                                                   hop)
:class:`EgressStage`   ``p4/egress.p4``, ``SgEgress``              ``shadow_rewrite``
=====================  ==========================================  ============================

Ownership. Every entry of a job-keyed table carries the job id in its key (two jobs on one
switch never touch each other's entries); a forwarding entry belongs to the job whose host
port it names. A job's multicast groups are one contiguous block of ids whose base is the
COMMIT group named by its ``jobs`` entry, so a restarted driver finds its block by reading;
a new job takes the lowest free block.

Convergence (:meth:`SwitchDriver.converge`): push the pipeline only if the switch does not
already run this program (the cookie is a digest of P4Info and device config; a push resets
every table, so it is never repeated), read this job's entries and groups back, and write
groups (insert/modify), then entries (delete, modify, insert), then delete groups no longer
used — an interrupted convergence leaves no entry pointing at a missing group, and a second
convergence writes nothing.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from shadowgrad import events
from shadowgrad._log import event
from shadowgrad.config import JobSpec
from shadowgrad.errors import ConfigError, ShadowgradError
from shadowgrad.layout import Layout
from shadowgrad.seams import ConvergeCounts
from shadowgrad.wire import DEFAULT_UDP_PORT

from .p4runtime import P4RuntimeClient

if TYPE_CHECKING:
    from shadowgrad import seams

__all__ = [
    "DROP_REASONS",
    "Entry",
    "SwitchState",
    "ConvergeReport",
    "SwitchDriver",
    "describe",
    "plan",
    "ForwardStage",
    "GuardStage",
    "TapStage",
    "EgressStage",
    "pipeline_cookie",
]

log = logging.getLogger(__name__)

U = p4runtime_pb2.Update
#: index -> reason of the ``SgIngress.drops`` / ``SgEgress.egress_drops`` counters
#: (``p4/include/types.p4`` DROP_*)
DROP_REASONS = ("spoofed", "foreign_job", "parser_error", "no_route", "no_rewrite")
MAX_GROUP_ID = 32767  # bmv2/PI: multicast group ids 1..32767
_BATCH = 512

MatchValue = int | tuple[int, int]


@dataclass(frozen=True, order=True)
class Entry:
    """One table entry by names: ``match`` holds ``(field, value)`` pairs sorted by field (an
    int for exact, ``(value, prefix_len)`` for lpm, ``(low, high)`` for range); ``params``
    ``(name, int)`` pairs sorted by name."""

    table: str
    match: tuple[tuple[str, MatchValue], ...]
    action: str
    params: tuple[tuple[str, int], ...] = ()
    priority: int = 0
    #: P4Runtime controller metadata: the owning job of an entry whose key has no job id
    metadata: bytes = b""

    @staticmethod
    def make(
        table: str,
        match: Mapping[str, MatchValue],
        action: str,
        params: Mapping[str, int] | None = None,
        priority: int = 0,
        *,
        metadata: bytes = b"",
    ) -> Entry:
        return Entry(
            table,
            tuple(sorted(match.items())),
            action,
            tuple(sorted((params or {}).items())),
            priority,
            metadata,
        )

    @property
    def key(self) -> tuple[str, tuple[tuple[str, MatchValue], ...], int]:
        return self.table, self.match, self.priority

    def m(self, name: str) -> MatchValue:
        return dict(self.match)[name]

    def p(self, name: str) -> int:
        return dict(self.params)[name]


@dataclass
class SwitchState:
    """A job's entries (by key) and multicast groups (id -> replica set of (port, rid))."""

    entries: dict[tuple[Any, ...], Entry] = field(default_factory=dict)
    groups: dict[int, frozenset[tuple[int, int]]] = field(default_factory=dict)

    def add(self, e: Entry) -> None:
        if e.key in self.entries and self.entries[e.key] != e:
            raise ShadowgradError(f"two desired entries with one key: {e} / {self.entries[e.key]}")
        self.entries[e.key] = e


def _fmt_match(name: str, v: MatchValue) -> str:
    from shadowgrad.frames import format_mac

    short = name.rsplit(".", maxsplit=1)[-1]
    if name == "hdr.ipv4.dstAddr" and isinstance(v, tuple):
        return f"{short}={ipaddress.IPv4Address(v[0])}/{v[1]}"
    if name == "hdr.ethernet.dstAddr" and isinstance(v, int):
        return f"{short}={format_mac(v)}"
    if isinstance(v, tuple):
        return f"{short}={v[0]}..{v[1]}"
    return f"{short}={v}"


def _fmt_param(name: str, v: int) -> str:
    from shadowgrad.frames import format_mac

    if name == "dmac":
        return f"{name}={format_mac(v)}"
    if name == "dip":
        return f"{name}={ipaddress.IPv4Address(v)}"
    return f"{name}={v}"


def describe(state: SwitchState) -> list[str]:
    """Human-readable lines: every entry by table, then every multicast group."""
    lines: list[str] = []
    table = None
    for e in sorted(state.entries.values()):
        if e.table != table:
            table = e.table
            lines.append(f"{table}:")
        match = ", ".join(_fmt_match(k, v) for k, v in e.match)
        params = ", ".join(_fmt_param(k, v) for k, v in e.params)
        lines.append(f"  {match} -> {e.action.split('.')[-1]}({params})")
    for gid, reps in sorted(state.groups.items()):
        lines.append(f"group {gid}: " + " ".join(f"{p}/rid{r}" for p, r in sorted(reps)))
    return lines


@dataclass
class ConvergeReport(ConvergeCounts):
    """What one convergence wrote (counts of P4Runtime updates): the entries, then the
    multicast groups."""

    groups_inserted: int = 0
    groups_modified: int = 0
    groups_deleted: int = 0
    group_base: int = 0

    @property
    def writes(self) -> int:
        return super().writes + self.groups_inserted + self.groups_modified + self.groups_deleted


def pipeline_cookie(p4info: p4info_pb2.P4Info, device_config: bytes) -> int:
    """The pipeline's identity: the first 8 bytes of SHA-256(P4Info, device config)."""
    h = hashlib.sha256(p4info.SerializeToString(deterministic=True))
    h.update(device_config)
    return int.from_bytes(h.digest()[:8], "big") or 1


# ------------------------------------------------------------------------------ the job view
@dataclass(frozen=True)
class _Host:
    port: int
    mac: int
    ip: int
    udp: int


class _Job:
    """What the stages need from the spec and the layout."""

    def __init__(self, spec: JobSpec, layout: Layout) -> None:
        sw = spec.switch
        if sw.target == "none":
            raise ConfigError("switch.target", "none", "the switch driver needs a switch")
        if (layout.num_shadows, layout.replication) != (
            spec.shadows.count,
            spec.shadows.replication,
        ):
            raise ConfigError(
                "shadows.count",
                spec.shadows.count,
                f"the layout has {layout.num_shadows} shadows / replication {layout.replication}",
            )
        self.id = spec.job.id
        self.world = spec.trainers.world_size
        self.layout = layout
        self.trainers: list[_Host] = []
        self.shadows: list[_Host] = []
        for kind, addrs, hosts, mac in (
            ("trainers", spec.trainers.addresses, self.trainers, sw.trainer_mac),
            ("shadows", spec.shadows.addresses, self.shadows, sw.shadow_mac),
        ):
            ports = sw.trainer_ports if kind == "trainers" else sw.shadow_ports
            for i, ep in enumerate(addrs):
                if not ep.is_ipv4:
                    raise ConfigError(
                        f"{kind}.addresses[{i}]",
                        str(ep),
                        "the switch matches and rewrites IPv4 headers",
                    )
                if spec.job.mode == "in-band" and ep.port != DEFAULT_UDP_PORT:
                    raise ConfigError(
                        f"{kind}.addresses[{i}]",
                        str(ep),
                        f"in-band through a switch needs UDP port "
                        f"{DEFAULT_UDP_PORT}: the P4 parser recognises the "
                        f"shadowgrad header by it (give each host its own IP)",
                    )
                hosts.append(_Host(ports[i], mac(i), int(ipaddress.IPv4Address(ep.host)), ep.port))
        #: the tag of the job's entries in tables without a job key (TableEntry.metadata)
        self.owner_tag = f"shadowgrad-job:{self.id}".encode()
        self.ports = frozenset(h.port for h in (*self.trainers, *self.shadows))
        self.ip_keys = frozenset((h.ip, 32) for h in (*self.trainers, *self.shadows))
        self.macs = frozenset(h.mac for h in (*self.trainers, *self.shadows))
        self.n_groups = 2 + layout.num_shards * self.world

    # group ids inside the job's block
    @staticmethod
    def commit_gid(base: int) -> int:
        return base

    @staticmethod
    def flood_gid(base: int) -> int:
        return base + 1

    def shard_gid(self, base: int, shard: int, next_rank: int) -> int:
        return base + 2 + shard * self.world + next_rank


# ------------------------------------------------------------------------------ the stages
class _Stage:
    #: the P4 control instance whose tables and actions the stage owns, as P4Info names it
    #: (a sub-control's objects are named by its instance path: ``SgIngress.forward.route``)
    CONTROL = ""
    TABLES: tuple[str, ...] = ()

    def desired(self, job: _Job, base: int, out: SwitchState) -> None:
        raise NotImplementedError

    def owns(self, job: _Job, e: Entry, base: int | None) -> bool:
        """Whether ``e`` (in one of :attr:`TABLES`) belongs to ``job``, whose group block
        starts at ``base`` (None: not programmed yet)."""
        return e.m("hdr.sg.job") == job.id

    def gids(self, job: _Job, e: Entry) -> Iterable[int]:
        """Multicast group ids an entry of this stage refers to."""
        return ()


class ForwardStage(_Stage):
    """``p4/ingress_forward.p4`` (control ``SgForward``, instance ``SgIngress.forward``): a /32
    route and an L2 entry per host, broadcast flooded to the job's other hosts."""

    CONTROL = "SgIngress.forward"
    IPV4_FORWARD = f"{CONTROL}.ipv4_forward"
    L2_FORWARD = f"{CONTROL}.l2_forward"
    L2_FLOOD = f"{CONTROL}.l2_flood"
    TABLES = (IPV4_FORWARD, L2_FORWARD, L2_FLOOD)

    def desired(self, job: _Job, base: int, out: SwitchState) -> None:
        hosts = [*job.trainers, *job.shadows]
        tag = job.owner_tag
        for h in hosts:
            # (table, match, action, params) of the host's route, L2 entry and flood entry
            entries: tuple[tuple[str, Mapping[str, MatchValue], str, Mapping[str, int]], ...] = (
                (
                    self.IPV4_FORWARD,
                    {"hdr.ipv4.dstAddr": (h.ip, 32)},
                    f"{self.CONTROL}.route",
                    {"port": h.port, "dmac": h.mac},
                ),
                (
                    self.L2_FORWARD,
                    {"hdr.ethernet.dstAddr": h.mac},
                    f"{self.CONTROL}.bridge",
                    {"port": h.port},
                ),
                (
                    self.L2_FLOOD,
                    {"standard_metadata.ingress_port": h.port},
                    f"{self.CONTROL}.flood",
                    {"grp": job.flood_gid(base)},
                ),
            )
            for table, match, action, params in entries:
                out.add(Entry.make(table, match, action, params, metadata=tag))
        out.groups[job.flood_gid(base)] = frozenset((h.port, 0) for h in hosts)

    def owns(self, job: _Job, e: Entry, base: int | None) -> bool:
        # a forwarding entry is the job's if it carries the job's tag (controller metadata),
        # or — for a switch whose target drops metadata — if it names one of the job's host
        # ports, or its key is one of the job's host addresses (a host that moved to another
        # port), or it floods to the job's group (the port a host moved away from)
        if e.metadata:
            return e.metadata == job.owner_tag
        if e.table == self.L2_FLOOD:
            return e.m("standard_metadata.ingress_port") in job.ports or (
                base is not None and e.p("grp") == job.flood_gid(base)
            )
        if dict(e.params).get("port") in job.ports:
            return True
        if e.table == self.IPV4_FORWARD:
            return e.m("hdr.ipv4.dstAddr") in job.ip_keys
        return e.m("hdr.ethernet.dstAddr") in job.macs

    def gids(self, job: _Job, e: Entry) -> Iterable[int]:
        return (e.p("grp"),) if e.table == self.L2_FLOOD else ()


class GuardStage(_Stage):
    """``p4/ingress_guard.p4`` (control ``SgGuard``, instance ``SgIngress.guard``): the job
    (its COMMIT group: every shadow) and its trainer ports."""

    CONTROL = "SgIngress.guard"
    JOBS = f"{CONTROL}.jobs"
    TRAINER_PORTS = f"{CONTROL}.trainer_ports"
    TABLES = (JOBS, TRAINER_PORTS)

    def desired(self, job: _Job, base: int, out: SwitchState) -> None:
        out.add(
            Entry.make(
                self.JOBS,
                {"hdr.sg.job": job.id},
                f"{self.CONTROL}.job_known",
                {"commit_grp": job.commit_gid(base)},
            )
        )
        for rank, h in enumerate(job.trainers):
            out.add(
                Entry.make(
                    self.TRAINER_PORTS,
                    {"standard_metadata.ingress_port": h.port, "hdr.sg.job": job.id},
                    f"{self.CONTROL}.trainer",
                    {"rank": rank},
                )
            )
        out.groups[job.commit_gid(base)] = frozenset(
            (h.port, k + 1) for k, h in enumerate(job.shadows)
        )

    def gids(self, job: _Job, e: Entry) -> Iterable[int]:
        return (e.p("commit_grp"),) if e.table == self.JOBS else ()


class TapStage(_Stage):
    """``p4/ingress_tap.p4`` (control ``SgTap``, instance ``SgIngress.tap``): one range entry
    per route of the layout ((bucket, bytes) -> shard), and per (shard, next hop) a group
    {next hop, every replica of the shard}."""

    CONTROL = "SgIngress.tap"
    TAP = f"{CONTROL}.tap"
    SHARD_GROUPS = f"{CONTROL}.shard_groups"
    TABLES = (TAP, SHARD_GROUPS)

    def desired(self, job: _Job, base: int, out: SwitchState) -> None:
        lay = job.layout
        for b, routes in enumerate(lay.bucket_routes):
            for r in routes:
                if r.end <= r.start:
                    continue
                out.add(
                    Entry.make(
                        self.TAP,
                        {
                            "hdr.sg.job": job.id,
                            "hdr.sg.bucket": b,
                            "hdr.sg.offset": (r.start, r.end - 1),
                        },
                        f"{self.CONTROL}.to_shard",
                        {"shard": r.shard},
                        priority=1,
                    )
                )
        for s in range(lay.num_shards):
            replicas = [(job.shadows[k].port, k + 1) for k in lay.shadows_of_shard(s)]
            for t, h in enumerate(job.trainers):
                gid = job.shard_gid(base, s, t)
                out.add(
                    Entry.make(
                        self.SHARD_GROUPS,
                        {
                            "hdr.sg.job": job.id,
                            "meta.shard": s,
                            "standard_metadata.egress_spec": h.port,
                        },
                        f"{self.CONTROL}.replicate",
                        {"grp": gid},
                    )
                )
                out.groups[gid] = frozenset([(h.port, 0), *replicas])

    def gids(self, job: _Job, e: Entry) -> Iterable[int]:
        return (e.p("grp"),) if e.table == self.SHARD_GROUPS else ()


class EgressStage(_Stage):
    """``p4/egress.p4``: shadow ``k``'s copies (egress_rid ``k + 1``) get its MAC, IPv4 address
    and UDP port."""

    CONTROL = "SgEgress"
    SHADOW_REWRITE = f"{CONTROL}.shadow_rewrite"
    TABLES = (SHADOW_REWRITE,)

    def desired(self, job: _Job, base: int, out: SwitchState) -> None:
        for k, h in enumerate(job.shadows):
            out.add(
                Entry.make(
                    self.SHADOW_REWRITE,
                    {"hdr.sg.job": job.id, "standard_metadata.egress_rid": k + 1},
                    f"{self.CONTROL}.to_shadow",
                    {"dmac": h.mac, "dip": h.ip, "dport": h.udp},
                )
            )


STAGES: tuple[_Stage, ...] = (ForwardStage(), GuardStage(), TapStage(), EgressStage())


def _plan(job: _Job, base: int, tap: bool) -> SwitchState:
    out = SwitchState()
    for stage in STAGES:
        if tap or not isinstance(stage, TapStage):
            stage.desired(job, base, out)
    return out


def plan(spec: JobSpec, layout: Layout, base: int = 1, *, tap: bool = True) -> SwitchState:
    """The entries and groups a job needs, its group block starting at ``base`` (what
    :meth:`SwitchDriver.converge` writes; no switch contacted)."""
    return _plan(_Job(spec, layout), base, tap)


# ------------------------------------------------------------------------------ codec
def _enc(value: int, bits: int) -> bytes:
    if value < 0 or value >> bits:
        raise ValueError(f"{value:#x} does not fit in {bits} bits")
    return value.to_bytes(max(1, (bits + 7) // 8), "big")


def _dec(b: bytes) -> int:
    return int.from_bytes(b, "big")


class _Codec:
    """Names <-> P4Runtime ids of one P4Info."""

    def __init__(self, info: p4info_pb2.P4Info) -> None:
        self.info = info
        self.tables = {t.preamble.name: t for t in info.tables}
        self.table_by_id = {t.preamble.id: t for t in info.tables}
        self.actions = {a.preamble.name: a for a in info.actions}
        self.action_by_id = {a.preamble.id: a for a in info.actions}
        self.counters = {c.preamble.name: c for c in info.counters}

    def table(self, name: str) -> Any:
        try:
            return self.tables[name]
        except KeyError:
            raise ShadowgradError(
                f"the switch's P4Info has no table {name!r}: is it running p4/shadowgrad.p4?"
            ) from None

    def encode(self, e: Entry) -> p4runtime_pb2.TableEntry:
        t = self.table(e.table)
        te = p4runtime_pb2.TableEntry(
            table_id=t.preamble.id, priority=e.priority, metadata=e.metadata
        )
        match = dict(e.match)
        mt = p4info_pb2.MatchField
        for mf in t.match_fields:
            if mf.name not in match:
                continue
            v, w = match[mf.name], mf.bitwidth
            fm = te.match.add(field_id=mf.id)
            if mf.match_type == mt.EXACT:
                assert isinstance(v, int)
                fm.exact.value = _enc(v, w)
            elif mf.match_type == mt.LPM:
                assert isinstance(v, tuple)
                fm.lpm.value, fm.lpm.prefix_len = _enc(v[0], w), v[1]
            elif mf.match_type == mt.RANGE:
                assert isinstance(v, tuple)
                fm.range.low, fm.range.high = _enc(v[0], w), _enc(v[1], w)
            else:
                raise ShadowgradError(f"match type {mf.match_type} of {mf.name} not used here")
        a = self.actions[e.action]
        te.action.action.action_id = a.preamble.id
        params = dict(e.params)
        for p in a.params:
            te.action.action.params.add(param_id=p.id, value=_enc(params[p.name], p.bitwidth))
        return te

    def decode(self, te: p4runtime_pb2.TableEntry) -> Entry | None:
        t = self.table_by_id.get(te.table_id)
        if t is None:
            return None
        fields = {mf.id: mf for mf in t.match_fields}
        match: dict[str, MatchValue] = {}
        for fm in te.match:
            mf = fields[fm.field_id]
            kind = fm.WhichOneof("field_match_type")
            if kind == "exact":
                match[mf.name] = _dec(fm.exact.value)
            elif kind == "lpm":
                match[mf.name] = (_dec(fm.lpm.value), fm.lpm.prefix_len)
            elif kind == "range":
                match[mf.name] = (_dec(fm.range.low), _dec(fm.range.high))
            else:
                return None
        a = self.action_by_id.get(te.action.action.action_id)
        if a is None:
            return None
        pnames = {p.id: p.name for p in a.params}
        params = {pnames[p.param_id]: _dec(p.value) for p in te.action.action.params}
        return Entry.make(
            t.preamble.name,
            match,
            a.preamble.name,
            params,
            te.priority,
            metadata=bytes(te.metadata),
        )


# ------------------------------------------------------------------------------ the driver
class SwitchDriver:
    """Programs one job onto a switch running ``p4/shadowgrad.p4`` (see the module docstring).

    ``client`` is a connected :class:`~shadowgrad.controller.p4runtime.P4RuntimeClient`.
    ``pipeline`` is ``(p4info, device_config)`` — the artefact of ``shadowgrad-p4c`` or real
    ``p4c`` — pushed by :meth:`converge` unless the switch already runs it; without it the
    switch must already run the program (its P4Info is read back).
    """

    def __init__(
        self,
        client: P4RuntimeClient,
        spec: JobSpec,
        layout: Layout,
        *,
        pipeline: tuple[p4info_pb2.P4Info, bytes] | None = None,
        tap: bool = True,
    ) -> None:
        #: ``tap=False`` leaves the tap empty (the same ring, no copies: a benchmark baseline)
        self.tap = tap
        self.client = client
        self.spec = spec
        self.job = _Job(spec, layout)
        self.pipeline = pipeline
        self._codec: _Codec | None = None
        self.base: int | None = None

    # -- pipeline ------------------------------------------------------------------------
    def ensure_pipeline(self) -> bool:
        """Push the pipeline unless the switch already runs it; True if it was pushed."""
        info, _config, cookie = self.client.get_pipeline()
        if self.pipeline is None:
            if info is None:
                raise ShadowgradError("the switch runs no pipeline and none was given")
            self._codec = _Codec(info)
            return False
        want_info, want_config = self.pipeline
        want = pipeline_cookie(want_info, want_config)
        if info is not None and cookie == want:
            self._codec = _Codec(info)
            return False
        self.client.set_pipeline(want_info, want_config, cookie=want)
        self._codec = _Codec(want_info)
        event(log, events.SWITCH_PIPELINE_PUSHED, job=self.job.id, cookie=f"{want:016x}")
        return True

    @property
    def codec(self) -> _Codec:
        if self._codec is None:
            info, _c, _k = self.client.get_pipeline()
            if info is None:
                raise ShadowgradError("the switch runs no pipeline")
            self._codec = _Codec(info)
        return self._codec

    # -- reading -------------------------------------------------------------------------
    def _read_entries(self) -> list[Entry]:
        codec = self.codec
        ents = []
        for stage in STAGES:
            for name in stage.TABLES:
                e = p4runtime_pb2.Entity()
                e.table_entry.table_id = codec.table(name).preamble.id
                ents.append(e)
        out = []
        for r in self.client.read(ents):
            d = codec.decode(r.table_entry)
            if d is not None:
                out.append(d)
        return out

    def _read_groups(self) -> dict[int, frozenset[tuple[int, int]]]:
        e = p4runtime_pb2.Entity()
        e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        groups: dict[int, frozenset[tuple[int, int]]] = {}
        for r in self.client.read([e]):
            g = r.packet_replication_engine_entry.multicast_group_entry
            reps = []
            for rep in g.replicas:
                port = _dec(rep.port) if rep.port else rep.egress_port
                reps.append((port, rep.instance))
            groups[g.multicast_group_id] = frozenset(reps)
        return groups

    def _stage_of(self, table: str) -> _Stage:
        for s in STAGES:
            if table in s.TABLES:
                return s
        raise KeyError(table)

    def read_state(self) -> tuple[SwitchState, set[int]]:
        """This job's entries and groups on the switch, and the group ids other jobs use."""
        job = self.job
        all_groups = self._read_groups()
        entries = self._read_entries()
        # the base of this job's block (its COMMIT group), if programmed before
        self.base = None
        for e in entries:
            if e.table == GuardStage.JOBS and e.m("hdr.sg.job") == job.id:
                self.base = e.p("commit_grp")
        mine = SwitchState()
        my_gids: set[int] = set()
        for e in entries:
            st = self._stage_of(e.table)
            if st.owns(job, e, self.base):
                mine.entries[e.key] = e
                my_gids.update(st.gids(job, e))
        others = set(all_groups) - my_gids
        mine.groups = {g: r for g, r in all_groups.items() if g in my_gids}
        return mine, others

    def desired(self, base: int) -> SwitchState:
        return _plan(self.job, base, self.tap)

    def _allocate(self, others: set[int]) -> int:
        n = self.job.n_groups
        if (
            self.base is not None
            and self.base + n - 1 <= MAX_GROUP_ID
            and not any(g in others for g in range(self.base, self.base + n))
        ):
            return self.base
        base = 1
        while base + n - 1 <= MAX_GROUP_ID:
            clash = [g for g in range(base, base + n) if g in others]
            if not clash:
                return base
            base = max(clash) + 1
        raise ShadowgradError(f"no free block of {n} multicast group ids on the switch")

    # -- convergence ---------------------------------------------------------------------
    def converge(self) -> ConvergeReport:
        """Make the switch hold exactly this job's desired state (idempotent)."""
        rep = ConvergeReport()
        rep.pipeline_pushed = self.ensure_pipeline()
        have, others = self.read_state()
        base = self._allocate(others)
        rep.group_base = base
        want = self.desired(base)
        codec = self.codec

        def group_update(kind: Any, gid: int, replicas: Iterable[tuple[int, int]]) -> Any:
            e = p4runtime_pb2.Entity()
            g = e.packet_replication_engine_entry.multicast_group_entry
            g.multicast_group_id = gid
            for port, rid in sorted(replicas):
                g.replicas.add(egress_port=port, instance=rid)
            return U(type=kind, entity=e)

        def entry_update(kind: Any, e: Entry) -> Any:
            ent = p4runtime_pb2.Entity()
            te = codec.encode(e)
            if kind == U.DELETE:
                te.ClearField("action")
            ent.table_entry.CopyFrom(te)
            return U(type=kind, entity=ent)

        # 1. groups the new entries need
        ups: list[Any] = []
        for gid, reps in sorted(want.groups.items()):
            if gid in others:
                raise ShadowgradError(f"multicast group {gid} belongs to another job")
            if gid not in have.groups:
                ups.append(group_update(U.INSERT, gid, reps))
                rep.groups_inserted += 1
            elif have.groups[gid] != reps:
                ups.append(group_update(U.MODIFY, gid, reps))
                rep.groups_modified += 1
        self._write(ups)
        # 2. entries: stale ones out first (an entry's key may be re-used by a new one)
        ups = []
        for key, e in sorted(have.entries.items(), key=lambda kv: kv[1]):
            if key not in want.entries:
                ups.append(entry_update(U.DELETE, e))
                rep.deleted += 1
        self._write(ups)
        ups = []
        for key, e in sorted(want.entries.items(), key=lambda kv: kv[1]):
            old = have.entries.get(key)
            if old is None:
                ups.append(entry_update(U.INSERT, e))
                rep.inserted += 1
            elif old != e:
                ups.append(entry_update(U.MODIFY, e))
                rep.modified += 1
        self._write(ups)
        # 3. groups nobody refers to any more
        ups = []
        for gid in sorted(have.groups):
            if gid not in want.groups:
                ups.append(group_update(U.DELETE, gid, ()))
                rep.groups_deleted += 1
        self._write(ups)
        self.base = base
        event(
            log,
            events.SWITCH_CONVERGED,
            job=self.job.id,
            writes=rep.writes,
            inserted=rep.inserted,
            modified=rep.modified,
            deleted=rep.deleted,
            groups=(rep.groups_inserted, rep.groups_modified, rep.groups_deleted),
            pipeline_pushed=rep.pipeline_pushed,
            group_base=base,
        )
        return rep

    def remove(self) -> ConvergeReport:
        """Delete every entry and group of this job (other jobs are untouched)."""
        rep = ConvergeReport()
        have, _others = self.read_state()
        codec = self.codec
        ups = []
        for e in sorted(have.entries.values()):
            ent = p4runtime_pb2.Entity()
            te = codec.encode(e)
            te.ClearField("action")
            ent.table_entry.CopyFrom(te)
            ups.append(U(type=U.DELETE, entity=ent))
            rep.deleted += 1
        self._write(ups)
        ups = []
        for gid in sorted(have.groups):
            e = p4runtime_pb2.Entity()
            e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = gid
            ups.append(U(type=U.DELETE, entity=e))
            rep.groups_deleted += 1
        self._write(ups)
        return rep

    def _write(self, ups: Sequence[Any]) -> None:
        for i in range(0, len(ups), _BATCH):
            self.client.write(ups[i : i + _BATCH])

    # -- counters ------------------------------------------------------------------------
    def _counter(self, name: str) -> dict[int, tuple[int, int]]:
        """All cells of an indexed counter: index -> (packets, bytes)."""
        c = self.codec.counters.get(name)
        if c is None:
            raise ShadowgradError(f"the switch's P4Info has no counter {name!r}")
        e = p4runtime_pb2.Entity()
        e.counter_entry.counter_id = c.preamble.id
        out = {}
        for r in self.client.read([e]):
            d = r.counter_entry.data
            out[r.counter_entry.index.index] = (d.packet_count, d.byte_count)
        return out

    def counters(self) -> dict[str, Any]:
        """This job's switch counters, as ``(packets, bytes)``: ``tagged[rank]`` (FINAL chunks
        from the trainer's port), ``commits[rank]`` (the switch-side heartbeat),
        ``shadow_copies[k]`` (DATA copies sent to shadow k), ``shard_copies[s]`` (the sum over
        the shard's replicas), and the switch-wide ``drops`` by reason."""
        job = self.job
        tagged = self._counter("SgIngress.tagged_chunks")
        commits = self._counter("SgIngress.commits")
        copies = self._counter("SgEgress.shadow_copies")
        drops = self._counter("SgIngress.drops")
        edrops = self._counter("SgEgress.egress_drops")
        zero = (0, 0)
        shadow = [copies.get(h.port, zero) for h in job.shadows]
        shard = []
        for s in range(job.layout.num_shards):
            ks = job.layout.shadows_of_shard(s)
            shard.append((sum(shadow[k][0] for k in ks), sum(shadow[k][1] for k in ks)))
        return {
            "tagged": [tagged.get(h.port, zero) for h in job.trainers],
            "commits": [commits.get(h.port, zero) for h in job.trainers],
            "shadow_copies": shadow,
            "shard_copies": shard,
            "drops": {
                r: (
                    drops.get(i, zero)[0] + edrops.get(i, zero)[0],
                    drops.get(i, zero)[1] + edrops.get(i, zero)[1],
                )
                for i, r in enumerate(DROP_REASONS)
            },
        }


if TYPE_CHECKING:  # mypy checks that the P4Runtime driver is the controller's switch seam

    def _is_switch_driver(d: SwitchDriver) -> seams.SwitchDriver:
        return d
