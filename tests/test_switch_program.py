"""PTF-style tests of the product ToR program ``p4/shadowgrad.p4`` as the switch driver programs
it: send one frame on one port, expect exactly the listed frames on the listed ports and nothing
anywhere else.

Every switch is programmed by :class:`~shadowgrad.controller.switch.SwitchDriver` from a job spec
and a layout, through the real :class:`~shadowgrad.controller.p4runtime.P4RuntimeClient` over
gRPC (never by direct Dataplane calls). The same cases run on these backends:

* ``inproc`` (always): a :class:`~shadowgrad.p4target.switch.Switch` with in-process ports
  1..14 serving P4Runtime on ``127.0.0.1:0``; a fresh switch per case;
* ``bmv2`` (marker ``bmv2``; skipped unless ``p4c`` and ``simple_switch_grpc`` are on PATH): real
  bmv2 through :class:`~shadowgrad.testing.bmv2.RealBmv2Backend` (veths in a netns,
  AF_PACKET), the pipeline from :func:`~shadowgrad.testing.bmv2.compile_program`; one
  switch process per module, reset per case by pushing the pipeline;
* ``subprocess`` (markers ``netns``, ``slow``): the same RealBmv2Backend path against this
  project's ``shadowgrad-p4c`` + ``sg-switch-grpc`` binaries, which proves that path where real
  bmv2 is not installed.

Topology (job A, the job under test; job B shares the switch in the isolation cases)::

    job A (id 7): trainers 10.0.0.1-4 on ports 1-4, shadows 10.0.1.1-4 on ports 5-8,
                  replication 2 (2 shards x 2 replicas)
    job B (id 8): trainers 10.0.2.1-2 on ports 11-12, shadows 10.0.3.1-2 on ports 13-14, r = 1
    port 9: a host of no job; port 10: unused

Hosts address every IPv4 frame to the router MAC :data:`GW_MAC`; the switch's routing rewrite
puts the destination host's MAC in. Frames carry a real UDP checksum, so that the shadow copies'
zeroed checksum is visible.
"""

from __future__ import annotations

import collections
import functools
import ipaddress
import itertools
import random
import shutil
import struct
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("p4")
pytest.importorskip("grpc")

from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from shadowgrad.config import JobSpec, parse_spec
from shadowgrad.controller.p4runtime import P4RuntimeClient
from shadowgrad.controller.switch import DROP_REASONS, STAGES, Entry, SwitchDriver, SwitchState
from shadowgrad.frames import decode_frame, encode_frame, port_mac
from shadowgrad.layout import Layout, ParamSpec, Route, from_module
from shadowgrad.p4target.pipeline import Pipeline
from shadowgrad.p4target.ports import InProcessPort
from shadowgrad.p4target.switch import Switch
from shadowgrad.wire import (
    DEFAULT_UDP_PORT,
    HEADER_FIELDS,
    HEADER_SIZE,
    CommitRecord,
    DType,
    Flag,
    Kind,
    decode,
    encode,
)

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "p4" / "shadowgrad.p4"
SG_PORT = DEFAULT_UDP_PORT
CPU_PORT = 510
PORTS = tuple(range(1, 15))
GW_MAC = 0x02_53_47_FF_FF_FE  # the router MAC every host sends IPv4 frames to
STRANGER_PORT = 9  # a port of no job
FOREIGN_JOB = 99  # a job id no driver registered
BROADCAST = 0xFFFF_FFFF_FFFF

_ETH, _IP, _UDP = 14, 20, 8
_IP_AT, _UDP_AT, _SG_AT = _ETH, _ETH + _IP, _ETH + _IP + _UDP

_ELECTION = itertools.count(2)  # every client a case opens outranks all earlier ones


# ---------------------------------------------------------------------------- the jobs
@dataclass(frozen=True)
class Host:
    ip: str
    port: int
    mac: int
    udp: int = SG_PORT


@dataclass
class Job:
    id: int
    trainers: list[Host]
    shadows: list[Host]
    spec: JobSpec
    layout: Layout

    @property
    def hosts(self) -> list[Host]:
        return [*self.trainers, *self.shadows]

    def routes(self) -> list[tuple[int, Route]]:
        return [
            (b, r) for b, rs in enumerate(self.layout.bucket_routes) for r in rs if r.end > r.start
        ]

    def replicas(self, shard: int) -> list[Host]:
        return [self.shadows[k] for k in self.layout.shadows_of_shard(shard)]


@functools.cache
def _model() -> tuple[tuple[ParamSpec, ...], tuple[tuple[str, ...], ...]]:
    """A small model's ParamSpecs and its DDP buckets (two buckets with a 10 KiB cap)."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    params, buckets = from_module(model, bucket_cap_mb=0.01)
    return tuple(params), tuple(tuple(b) for b in buckets)


@functools.cache
def _layout(num_shadows: int, replication: int) -> Layout:
    params, buckets = _model()
    return Layout.build(params, buckets, num_shadows, replication)


def make_job(
    job_id: int,
    trainers: Sequence[str],
    trainer_ports: Sequence[int],
    shadows: Sequence[str],
    shadow_ports: Sequence[int],
    replication: int,
) -> Job:
    spec = parse_spec(
        {
            "job": {"id": job_id, "name": f"job{job_id}", "mode": "in-band"},
            "trainers": {"world_size": len(trainers), "addresses": list(trainers)},
            "shadows": {
                "count": len(shadows),
                "replication": replication,
                "addresses": list(shadows),
            },
            "switch": {
                "trainer_ports": list(trainer_ports),
                "shadow_ports": list(shadow_ports),
                "cpu_port": CPU_PORT,
            },
        },
        env={},
    )
    return Job(
        job_id,
        [Host(ip, p, port_mac(p)) for ip, p in zip(trainers, trainer_ports, strict=True)],
        [Host(ip, p, port_mac(p)) for ip, p in zip(shadows, shadow_ports, strict=True)],
        spec,
        _layout(len(shadows), replication),
    )


def job_a(shadow_ips: Sequence[str] | None = None) -> Job:
    return make_job(
        7,
        [f"10.0.0.{i}" for i in range(1, 5)],
        [1, 2, 3, 4],
        shadow_ips or [f"10.0.1.{i}" for i in range(1, 5)],
        [5, 6, 7, 8],
        2,
    )


def job_b() -> Job:
    return make_job(8, ["10.0.2.1", "10.0.2.2"], [11, 12], ["10.0.3.1", "10.0.3.2"], [13, 14], 1)


# ---------------------------------------------------------------------------- frames
def _mac(v: int) -> bytes:
    return v.to_bytes(6, "big")


def _csum16(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def udp_checksum(frame: bytes) -> int:
    """The UDP checksum of an Ethernet/IPv4/UDP frame (pseudo header included)."""
    ip = frame[_IP_AT:_UDP_AT]
    udp = frame[_UDP_AT:]
    pseudo = ip[12:20] + b"\0\x11" + len(udp).to_bytes(2, "big")
    return _csum16(pseudo + udp[:6] + b"\0\0" + udp[8:]) or 0xFFFF


def ipv4_checksum_ok(frame: bytes) -> bool:
    return _csum16(frame[_IP_AT:_UDP_AT]) == 0


def ip_frame(
    src: Host,
    dst_ip: str,
    datagram: bytes,
    *,
    dport: int = SG_PORT,
    dst_mac: int = GW_MAC,
    ident: int = 0,
) -> bytes:
    """``datagram`` from host ``src`` to ``dst_ip`` (UDP ``dport``), with a real UDP checksum."""
    f = bytearray(
        encode_frame(
            datagram,
            src=(src.ip, src.udp),
            dst=(dst_ip, dport),
            src_mac=src.mac,
            dst_mac=dst_mac,
            ident=ident,
        )
    )
    f[_UDP_AT + 6 : _UDP_AT + 8] = udp_checksum(bytes(f)).to_bytes(2, "big")
    return bytes(f)


def routed(frame: bytes, to: Host) -> bytes:
    """``frame`` as the switch forwards it to ``to``: the destination MAC rewritten, nothing else
    (no TTL change, so the IPv4 checksum stays)."""
    return _mac(to.mac) + frame[6:]


def shadow_copy(frame: bytes, shadow: Host) -> bytes:
    """``frame`` as the switch copies it to ``shadow``: MAC, IPv4 destination and UDP port of the
    shadow, IPv4 checksum recomputed, UDP checksum 0; the shadowgrad datagram unchanged."""
    f = bytearray(frame)
    f[0:6] = _mac(shadow.mac)
    f[_IP_AT + 16 : _IP_AT + 20] = ipaddress.IPv4Address(shadow.ip).packed
    f[_IP_AT + 10 : _IP_AT + 12] = b"\0\0"
    f[_IP_AT + 10 : _IP_AT + 12] = _csum16(bytes(f[_IP_AT:_UDP_AT])).to_bytes(2, "big")
    f[_UDP_AT + 2 : _UDP_AT + 4] = shadow.udp.to_bytes(2, "big")
    f[_UDP_AT + 6 : _UDP_AT + 8] = b"\0\0"
    return bytes(f)


def arp_request(src: Host, target_ip: str) -> bytes:
    """An ARP who-has broadcast from ``src`` (42 bytes, not padded)."""
    return (
        _mac(BROADCAST)
        + _mac(src.mac)
        + b"\x08\x06"
        + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1)
        + _mac(src.mac)
        + ipaddress.IPv4Address(src.ip).packed
        + b"\0" * 6
        + ipaddress.IPv4Address(target_ip).packed
    )


def _payload(n: int, *key: int) -> bytes:
    return random.Random(hash(key)).randbytes(n)


def data_dgram(
    job: Job,
    rank: int,
    bucket: int,
    offset: int,
    length: int,
    *,
    iteration: int = 1,
    seq: int = 0,
    final: bool = True,
    job_id: int | None = None,
) -> bytes:
    return encode(
        Kind.DATA,
        job=job.id if job_id is None else job_id,
        sender=rank,
        iteration=iteration,
        seq=seq,
        layout=job.layout.digest64,
        payload=_payload(length, rank, bucket, offset, iteration),
        flags=Flag.FINAL if final else 0,
        dtype=DType.FLOAT32,
        bucket=bucket,
        offset=offset,
    )


def commit_dgram(
    job: Job, rank: int = 0, *, iteration: int = 1, job_id: int | None = None
) -> bytes:
    rec = CommitRecord(lrs=(0.1, 0.01), clip_coef=0.5, user_state=b"loader@3")
    return rec.encode(
        job=job.id if job_id is None else job_id,
        sender=rank,
        iteration=iteration,
        seq=iteration,
        layout=job.layout.digest64,
    )


def chunk(
    job: Job, rank: int, bucket: int, offset: int, length: int, *, to: int | None = None, **kw: Any
) -> bytes:
    """A DATA chunk (FINAL unless ``final=False``) from trainer ``rank`` to its ring's next hop
    (or to trainer ``to``)."""
    dst = job.trainers[(rank + 1) % len(job.trainers) if to is None else to]
    return ip_frame(job.trainers[rank], dst.ip, data_dgram(job, rank, bucket, offset, length, **kw))


def describe(frames: Iterable[tuple[int, bytes]]) -> list[str]:
    out = []
    for port, f in sorted(frames):
        fr = decode_frame(f)
        if fr is None:
            out.append(f"port {port}: {len(f)} bytes, dst {f[:6].hex(':')} type {f[12:14].hex()}")
            continue
        what = ""
        if len(fr.payload) >= HEADER_SIZE:
            h = struct.unpack_from("!HBBB", fr.payload)
            what = f" sg magic={h[0]:#x} kind={h[2]} flags={h[3]:#x}"
        out.append(
            f"port {port}: {len(f)} bytes, dst {fr.dst_mac:012x} {fr.src} -> {fr.dst}"
            f" udp_csum={f[_UDP_AT + 6 : _UDP_AT + 8].hex()}{what}"
        )
    return out


def expect(got: Sequence[tuple[int, bytes]], want: Iterable[tuple[int, bytes]]) -> None:
    """Exactly ``want`` came out (as a multiset of (port, frame)), nothing else."""
    g, w = collections.Counter(got), collections.Counter(want)
    if g != w:
        missing, extra = w - g, g - w
        raise AssertionError(
            "frames differ:\n  missing: "
            + "\n           ".join(describe(missing.elements()) or ["-"])
            + "\n  extra:   "
            + "\n           ".join(describe(extra.elements()) or ["-"])
        )


# ---------------------------------------------------------------------------- backends
class Backend:
    """A switch running nothing yet, reachable over P4Runtime at :attr:`addr`, with ports
    :data:`PORTS`. ``open()`` starts each case on a clean switch."""

    name = ""
    addr = ""
    pipeline: tuple[p4info_pb2.P4Info, bytes]

    def open(self) -> None:
        raise NotImplementedError

    def send(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Send ``frame`` into ``port``; every frame that comes out of any port."""
        return self.send_many([(port, frame)])

    def send_many(self, frames: Sequence[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        raise NotImplementedError

    def end_case(self) -> None:
        """After a case (its clients are closed)."""

    def close(self) -> None:
        raise NotImplementedError


class InProcessBackend(Backend):
    name = "inproc"

    def __init__(self) -> None:
        pipe = Pipeline.compile(PROGRAM)
        self.pipeline = (pipe.p4info, pipe.to_device_config())
        self.sw: Switch | None = None
        self.ports: dict[int, InProcessPort] = {}

    def open(self) -> None:
        self.end_case()
        sw = Switch(device_id=0, cpu_port=CPU_PORT, grpc_addr="127.0.0.1:0")
        self.ports = {n: InProcessPort(n) for n in PORTS}
        for p in self.ports.values():
            sw.add_port(p)
        sw.start()
        assert sw.server is not None
        self.sw = sw
        self.addr = f"127.0.0.1:{sw.server.port}"

    def send_many(self, frames: Sequence[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        assert self.sw is not None
        for port, f in frames:
            self.ports[port].inject(f)  # synchronous: the pipeline has run when it returns
        assert self.sw.drain(10)
        out = []
        for n, p in self.ports.items():
            while (sent := p.recv(0)) is not None:
                out.append((n, sent))
        return out

    def end_case(self) -> None:
        if self.sw is not None:
            self.sw.stop()
            self.sw = None

    def close(self) -> None:
        self.end_case()


class BinaryBackend(Backend):
    """A switch binary with simple_switch_grpc's command line (real bmv2, or sg-switch-grpc)
    through :class:`RealBmv2Backend`: its switch process, veths and P4Runtime address are
    reused; the pipeline comes from :func:`compile_program`. Each case starts with a pipeline
    push (cookie 0), which resets every table, group and counter, so the driver pushes again."""

    BATCH = 16  # frames in flight at once (bmv2's queues are short)

    def __init__(self, name: str, p4c: str, switch: str) -> None:
        from shadowgrad.testing.bmv2 import RealBmv2Backend, compile_program

        self.name = name
        self.rb = RealBmv2Backend(p4c=p4c, switch=switch, ports=PORTS, cpu_port=CPU_PORT)
        try:
            self.pipeline = compile_program(p4c, PROGRAM, self.rb.workdir / "shadowgrad")
        except BaseException:
            self.rb.close()
            raise
        self.addr = self.rb.grpc_addr

    def open(self) -> None:
        with P4RuntimeClient(self.addr, election_id=next(_ELECTION), timeout_s=30) as c:
            c.connect(wait_s=30)
            c.set_pipeline(*self.pipeline, cookie=0)
            # a pipeline push resets tables and counters; delete multicast groups too, in case
            # the target keeps its PRE state across pushes
            g = p4runtime_pb2.Entity()
            g.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
            stale = [
                r.packet_replication_engine_entry.multicast_group_entry.multicast_group_id
                for r in c.read([g])
            ]
            ups = []
            for gid in stale:
                e = p4runtime_pb2.Entity()
                e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = gid
                ups.append(p4runtime_pb2.Update(type=p4runtime_pb2.Update.DELETE, entity=e))
            if ups:
                c.write(ups)
        self.rb.veths.drain()

    def send_many(self, frames: Sequence[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        v = self.rb.veths
        out: list[tuple[int, bytes]] = []
        for i in range(0, len(frames), self.BATCH):
            v.drain()
            for port, f in frames[i : i + self.BATCH]:
                v.send(port, f)
            out += v.collect(self.rb.first_timeout, self.rb.quiet, limit=30.0)
        return out

    def close(self) -> None:
        self.rb.close()


def _own_tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.fixture(
    scope="module",
    params=[
        "inproc",
        pytest.param("bmv2", marks=pytest.mark.bmv2),
        pytest.param("subprocess", marks=[pytest.mark.netns, pytest.mark.slow]),
    ],
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    b: Backend
    if request.param == "inproc":
        b = InProcessBackend()
    elif request.param == "bmv2":
        if not (shutil.which("p4c") and shutil.which("simple_switch_grpc")):
            pytest.skip("p4c and simple_switch_grpc are not both on PATH")
        b = BinaryBackend("bmv2", "p4c", "simple_switch_grpc")
    else:
        b = BinaryBackend("subprocess", _own_tool("shadowgrad-p4c"), _own_tool("sg-switch-grpc"))
    try:
        yield b
    finally:
        b.close()


@dataclass
class Bench:
    """One case: the backend's clean switch, the clients opened on it (closed at the end)."""

    backend: Backend
    clients: list[P4RuntimeClient] = field(default_factory=list)

    def client(self) -> P4RuntimeClient:
        c = P4RuntimeClient(self.backend.addr, election_id=next(_ELECTION), timeout_s=30)
        self.clients.append(c)
        c.connect(wait_s=30)
        return c

    def driver(self, job: Job, client: P4RuntimeClient | None = None) -> SwitchDriver:
        return SwitchDriver(
            client or self.client(), job.spec, job.layout, pipeline=self.backend.pipeline
        )

    def program(self, job: Job, client: P4RuntimeClient | None = None) -> SwitchDriver:
        d = self.driver(job, client)
        d.converge()
        return d

    def send(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        return self.backend.send(port, frame)

    def send_many(self, frames: Sequence[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        return self.backend.send_many(frames)

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self.backend.end_case()


@pytest.fixture
def tb(backend: Backend) -> Iterator[Bench]:
    backend.open()
    t = Bench(backend)
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def a(tb: Bench) -> tuple[Job, SwitchDriver]:
    """Job A programmed on the case's switch."""
    job = job_a()
    return job, tb.program(job)


def dump(client: P4RuntimeClient, info: p4info_pb2.P4Info) -> tuple[list[bytes], list[Any]]:
    """Every table entry (canonical bytes, sorted) and every multicast group on the switch."""
    ents = []
    for t in info.tables:
        e = p4runtime_pb2.Entity()
        e.table_entry.table_id = t.preamble.id
        ents.append(e)
    entries = []
    for r in client.read(ents):
        te = r.table_entry
        canon = p4runtime_pb2.TableEntry(table_id=te.table_id, priority=te.priority)
        canon.match.extend(sorted(te.match, key=lambda m: m.field_id))
        canon.action.action.action_id = te.action.action.action_id
        canon.action.action.params.extend(sorted(te.action.action.params, key=lambda p: p.param_id))
        entries.append(canon.SerializeToString(deterministic=True))
    g = p4runtime_pb2.Entity()
    g.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
    groups = sorted(
        (
            m.multicast_group_id,
            sorted(
                (int.from_bytes(rep.port, "big") if rep.port else rep.egress_port, rep.instance)
                for rep in m.replicas
            ),
        )
        for r in client.read([g])
        for m in [r.packet_replication_engine_entry.multicast_group_entry]
    )
    return sorted(entries), groups


def all_entries(d: SwitchDriver) -> list[Entry]:
    """Every entry of every table on the switch, decoded by the driver's codec."""
    ents = []
    for t in d.codec.info.tables:
        e = p4runtime_pb2.Entity()
        e.table_entry.table_id = t.preamble.id
        ents.append(e)
    return [x for r in d.client.read(ents) if (x := d.codec.decode(r.table_entry)) is not None]


def state_of(d: SwitchDriver) -> tuple[dict[Any, Any], dict[int, frozenset[tuple[int, int]]]]:
    mine: SwitchState = d.read_state()[0]
    return dict(mine.entries), dict(mine.groups)


ZERO = (0, 0)


def zero_counters(job: Job) -> dict[str, Any]:
    return {
        "tagged": [ZERO] * len(job.trainers),
        "commits": [ZERO] * len(job.trainers),
        "shadow_copies": [ZERO] * len(job.shadows),
        "shard_copies": [ZERO] * job.layout.num_shards,
        "drops": dict.fromkeys(DROP_REASONS, ZERO),
    }


def _add(cell: tuple[int, int], nbytes: int, n: int = 1) -> tuple[int, int]:
    return cell[0] + n, cell[1] + n * nbytes


# ---------------------------------------------------------------------------- P4Info
def test_p4info_sg_key_widths_match_the_wire_header_and_fast_path_covers_it() -> None:
    pipe = Pipeline.compile(PROGRAM)
    assert pipe.fast_unsupported is None
    wire = dict(HEADER_FIELDS)
    keys: dict[str, int] = {}
    for t in pipe.p4info.tables:
        for mf in t.match_fields:
            if mf.name.startswith("hdr.sg."):
                assert keys.setdefault(mf.name, mf.bitwidth) == mf.bitwidth
                assert mf.bitwidth == wire[mf.name.removeprefix("hdr.sg.")], mf.name
    assert keys == {"hdr.sg.job": 32, "hdr.sg.bucket": 32, "hdr.sg.offset": 64}
    # the other keys and parameters the driver encodes
    tables = {
        t.preamble.name: {m.name: m.bitwidth for m in t.match_fields} for t in pipe.p4info.tables
    }
    assert tables["SgIngress.forward.ipv4_forward"] == {"hdr.ipv4.dstAddr": 32}
    assert tables["SgIngress.guard.trainer_ports"]["standard_metadata.ingress_port"] == 9
    assert tables["SgIngress.tap.shard_groups"] == {
        "hdr.sg.job": 32,
        "meta.shard": 16,
        "standard_metadata.egress_spec": 9,
    }
    assert tables["SgEgress.shadow_rewrite"] == {
        "hdr.sg.job": 32,
        "standard_metadata.egress_rid": 16,
    }
    actions = {a.preamble.name: {p.name: p.bitwidth for p in a.params} for a in pipe.p4info.actions}
    assert actions["SgIngress.forward.route"] == {"port": 9, "dmac": 48}
    assert actions["SgEgress.to_shadow"] == {"dmac": 48, "dip": 32, "dport": 16}
    counters = {c.preamble.name: c.size for c in pipe.p4info.counters}
    assert counters["SgIngress.drops"] >= len(DROP_REASONS)
    # every name, as p4c names them: a stage is a sub-control instance of SgIngress, so its
    # tables and actions are SgIngress.<instance>.<name> (alias: the bare name)
    assert {(t.preamble.name, t.preamble.alias) for t in pipe.p4info.tables} == {
        ("SgIngress.forward.ipv4_forward", "ipv4_forward"),
        ("SgIngress.forward.l2_forward", "l2_forward"),
        ("SgIngress.forward.l2_flood", "l2_flood"),
        ("SgIngress.guard.jobs", "jobs"),
        ("SgIngress.guard.trainer_ports", "trainer_ports"),
        ("SgIngress.tap.tap", "tap"),
        ("SgIngress.tap.shard_groups", "shard_groups"),
        ("SgEgress.shadow_rewrite", "shadow_rewrite"),
    }
    assert set(actions) == {
        "NoAction",
        "SgIngress.drop",
        "SgIngress.forward.route",
        "SgIngress.forward.bridge",
        "SgIngress.forward.flood",
        "SgIngress.guard.job_known",
        "SgIngress.guard.trainer",
        "SgIngress.tap.to_shard",
        "SgIngress.tap.replicate",
        "SgEgress.to_shadow",
    }
    assert set(counters) == {
        "SgIngress.drops",
        "SgIngress.tagged_chunks",
        "SgIngress.commits",
        "SgEgress.shadow_copies",
        "SgEgress.egress_drops",
    }
    # the driver's stage classes own exactly the program's tables
    owned = [t for stage in STAGES for t in stage.TABLES]
    assert sorted(owned) == sorted(tables)


# ---------------------------------------------------------------------------- 1: the tap
def _check_shadow_copy(out: bytes, sent: bytes, shadow: Host, job: Job) -> None:
    """The copy, checked field by field (independently of :func:`shadow_copy`)."""
    assert out[0:6] == _mac(shadow.mac)
    assert out[6:_IP_AT] == sent[6:_IP_AT]
    assert out[_IP_AT + 16 : _IP_AT + 20] == ipaddress.IPv4Address(shadow.ip).packed
    assert out[_IP_AT + 12 : _IP_AT + 16] == sent[_IP_AT + 12 : _IP_AT + 16]  # source kept
    assert ipv4_checksum_ok(out)
    assert struct.unpack_from("!HHHH", out, _UDP_AT) == (
        SG_PORT,
        shadow.udp,
        len(sent) - _UDP_AT,
        0,
    )
    assert out[_SG_AT:] == sent[_SG_AT:]
    msg = decode(out[_SG_AT:], job=job.id, layout=job.layout.digest64)
    assert msg.header.flags & Flag.FINAL


def test_final_chunk_reaches_next_hop_and_every_replica_of_its_shard(
    tb: Bench, a: tuple[Job, SwitchDriver]
) -> None:
    job, _d = a
    world = len(job.trainers)
    shards_seen = set()
    for i, (bucket, r) in enumerate(job.routes()):
        n = min(64, r.end - r.start)
        for offset in sorted({r.start, r.end - n, r.end - 4}):
            length = min(n, r.end - offset)
            for rank in range(world):
                nxt = job.trainers[(rank + 1) % world]
                f = chunk(job, rank, bucket, offset, length, iteration=i + 1)
                assert ipv4_checksum_ok(f) and f[_UDP_AT + 6 : _UDP_AT + 8] != b"\0\0"
                got = tb.send(job.trainers[rank].port, f)
                want = [(nxt.port, routed(f, nxt))]
                want += [(s.port, shadow_copy(f, s)) for s in job.replicas(r.shard)]
                expect(got, want)
                for port, out in got:
                    if port == nxt.port:
                        assert out[6:] == f[6:]  # byte-identical apart from the dst MAC
                    else:
                        _check_shadow_copy(
                            out, f, next(s for s in job.shadows if s.port == port), job
                        )
                shards_seen.add(r.shard)
    assert shards_seen == set(range(job.layout.num_shards))


# ---------------------------------------------------------------------------- 2: no copies
def test_untagged_traffic_is_only_forwarded(tb: Bench, a: tuple[Job, SwitchDriver]) -> None:
    job, d = a
    t = job.trainers
    bucket, r = job.routes()[1]
    # DATA without FINAL (reduce-scatter phase) from every trainer port
    for rank in range(len(t)):
        f = chunk(job, rank, bucket, r.start, 64, final=False)
        expect(
            tb.send(t[rank].port, f),
            [(t[(rank + 1) % len(t)].port, routed(f, t[(rank + 1) % len(t)]))],
        )
    # a FINAL chunk sent straight to a shadow (a retransmission): no group, only forwarded
    s = job.replicas(r.shard)[0]
    f = ip_frame(t[0], s.ip, data_dgram(job, 0, bucket, r.start, 64))
    expect(tb.send(t[0].port, f), [(s.port, routed(f, s))])
    # a FINAL chunk outside every route of its bucket: forwarded, no copies
    end = job.layout.bucket_nbytes[bucket]
    f = ip_frame(t[1], t[2].ip, data_dgram(job, 1, bucket, end, 64))
    expect(tb.send(t[1].port, f), [(t[2].port, routed(f, t[2]))])
    # the first fragment of a FINAL chunk (MF set, offset 0): not parsed as shadowgrad, so
    # only forwarded, never copied (its payload is cut short)
    f = bytearray(chunk(job, 2, bucket, r.start, 64))
    f[_IP_AT + 6] |= 0x20  # flags: MF
    f[_IP_AT + 10 : _IP_AT + 12] = b"\0\0"
    f[_IP_AT + 10 : _IP_AT + 12] = _csum16(bytes(f[_IP_AT : _IP_AT + 20])).to_bytes(2, "big")
    frag = bytes(f)
    expect(tb.send(t[2].port, frag), [(t[3].port, routed(frag, t[3]))])
    # ordinary UDP and a non-shadowgrad port, from a host of no job
    stranger = Host("192.168.9.9", STRANGER_PORT, port_mac(STRANGER_PORT))
    f = ip_frame(stranger, t[3].ip, b"not shadowgrad", dport=5000)
    expect(tb.send(STRANGER_PORT, f), [(t[3].port, routed(f, t[3]))])
    c = d.counters()
    assert c["shadow_copies"] == [ZERO] * len(job.shadows)
    assert c["tagged"][0][0] == 1 and c["tagged"][1][0] == 1  # the two FINALs were tagged
    assert c["drops"] == dict.fromkeys(DROP_REASONS, ZERO)


# ---------------------------------------------------------------------------- 3: the guard
def test_tagged_from_non_trainer_ports_and_foreign_jobs_are_dropped(
    tb: Bench, a: tuple[Job, SwitchDriver]
) -> None:
    job, d = a
    bucket, r = job.routes()[0]
    shadow0 = job.shadows[0]
    stranger = Host("192.168.9.9", STRANGER_PORT, port_mac(STRANGER_PORT))
    want = zero_counters(job)
    drops = want["drops"]
    cases = [  # (ingress port, frame, drop reason)
        (
            shadow0.port,
            ip_frame(shadow0, job.trainers[1].ip, data_dgram(job, 0, bucket, r.start, 64)),
            "spoofed",
        ),
        (shadow0.port, ip_frame(shadow0, job.shadows[1].ip, commit_dgram(job)), "spoofed"),
        (
            STRANGER_PORT,
            ip_frame(stranger, job.trainers[1].ip, data_dgram(job, 0, bucket, r.start, 64)),
            "spoofed",
        ),
        (STRANGER_PORT, ip_frame(stranger, job.shadows[0].ip, commit_dgram(job)), "spoofed"),
        # a trainer port, but a job this switch does not serve
        (
            job.trainers[0].port,
            ip_frame(
                job.trainers[0],
                job.trainers[1].ip,
                data_dgram(job, 0, bucket, r.start, 64, job_id=FOREIGN_JOB),
            ),
            "foreign_job",
        ),
        (
            job.trainers[0].port,
            ip_frame(job.trainers[0], job.shadows[0].ip, commit_dgram(job, job_id=FOREIGN_JOB)),
            "foreign_job",
        ),
    ]
    for port, f, reason in cases:
        expect(tb.send(port, f), [])
        drops[reason] = _add(drops[reason], len(f))
        assert d.counters() == want, (port, reason)


# ---------------------------------------------------------------------------- 4: COMMIT, 2 jobs
def test_commit_reaches_every_shadow_of_its_job_only(tb: Bench) -> None:
    ja, jb = job_a(), job_b()
    client = tb.client()
    da = tb.program(ja, client)
    db = tb.program(jb, client)
    sa, sb = state_of(da), state_of(db)
    assert sa[0] and sb[0]
    assert not set(sa[0]) & set(sb[0]) and not set(sa[1]) & set(sb[1])  # disjoint
    # COMMIT from job A's rank 0: one rewritten copy per shadow of A, none to B
    for jx, dx in ((ja, da), (jb, db)):
        f = ip_frame(jx.trainers[0], jx.shadows[0].ip, commit_dgram(jx))
        got = tb.send(jx.trainers[0].port, f)
        expect(got, [(s.port, shadow_copy(f, s)) for s in jx.shadows])
        for port, out in got:
            _check_commit_copy(out, f, next(s for s in jx.shadows if s.port == port), jx)
        c = dx.counters()
        assert c["commits"] == [(1, len(f))] + [ZERO] * (len(jx.trainers) - 1)
        assert c["shadow_copies"] == [ZERO] * len(jx.shadows)  # DATA copies only
    # a trainer port of job B cannot send job A's FINAL chunks (and vice versa)
    bucket, r = ja.routes()[0]
    f = ip_frame(jb.trainers[0], ja.trainers[1].ip, data_dgram(ja, 0, bucket, r.start, 64))
    expect(tb.send(jb.trainers[0].port, f), [])
    f2 = ip_frame(ja.trainers[0], jb.trainers[1].ip, data_dgram(jb, 0, bucket, r.start, 64))
    expect(tb.send(ja.trainers[0].port, f2), [])
    assert da.counters()["drops"]["spoofed"] == (2, len(f) + len(f2))
    # job B's FINAL chunks go to B's shard replicas only
    rank = 1
    bucket, r = jb.routes()[-1]
    f = chunk(jb, rank, bucket, r.start, 64)
    expect(
        tb.send(jb.trainers[rank].port, f),
        [(jb.trainers[0].port, routed(f, jb.trainers[0]))]
        + [(s.port, shadow_copy(f, s)) for s in jb.replicas(r.shard)],
    )
    # removing B leaves A's state as it was, and A still works
    before = state_of(da)
    rep = db.remove()
    assert rep.deleted == len(sb[0]) and rep.groups_deleted == len(sb[1])
    assert state_of(da) == before == sa
    assert state_of(db) == ({}, {})
    f = ip_frame(ja.trainers[0], ja.shadows[0].ip, commit_dgram(ja, iteration=2))
    expect(tb.send(ja.trainers[0].port, f), [(s.port, shadow_copy(f, s)) for s in ja.shadows])
    f = ip_frame(jb.trainers[0], jb.shadows[0].ip, commit_dgram(jb, iteration=2))
    expect(tb.send(jb.trainers[0].port, f), [])  # B has no route any more
    # and B comes back where it was
    assert tb.program(jb, client).read_state()[0].entries == sb[0]
    assert state_of(db) == sb and state_of(da) == sa


def _check_commit_copy(out: bytes, sent: bytes, shadow: Host, job: Job) -> None:
    assert out[0:6] == _mac(shadow.mac)
    assert out[_IP_AT + 16 : _IP_AT + 20] == ipaddress.IPv4Address(shadow.ip).packed
    assert ipv4_checksum_ok(out)
    assert struct.unpack_from("!HH", out, _UDP_AT + 2) == (shadow.udp, len(sent) - _UDP_AT)
    assert out[_UDP_AT + 6 : _UDP_AT + 8] == b"\0\0"
    msg = decode(out[_SG_AT:], job=job.id, layout=job.layout.digest64)
    assert CommitRecord.from_message(msg) == CommitRecord(
        lrs=(0.1, 0.01), clip_coef=0.5, user_state=b"loader@3"
    )


# ---------------------------------------------------------------------------- 5: counters
def test_counters_account_for_a_known_mix(tb: Bench, a: tuple[Job, SwitchDriver]) -> None:
    job, d = a
    t = job.trainers
    want = zero_counters(job)
    stranger = Host("192.168.9.9", STRANGER_PORT, port_mac(STRANGER_PORT))
    frames: list[tuple[int, bytes]] = []
    routes = job.routes()
    k = 0
    for rank in range(len(t)):  # rank r sends r + 1 FINAL chunks, each to its next hop
        for _ in range(rank + 1):
            bucket, r = routes[k % len(routes)]
            k += 1
            f = chunk(job, rank, bucket, r.start, min(128, r.end - r.start), iteration=k)
            frames.append((t[rank].port, f))
            want["tagged"][rank] = _add(want["tagged"][rank], len(f))
            for s in job.layout.shadows_of_shard(r.shard):
                want["shadow_copies"][s] = _add(want["shadow_copies"][s], len(f))
            want["shard_copies"][r.shard] = _add(want["shard_copies"][r.shard], len(f), 2)
    for rank, n in ((0, 3), (2, 1)):  # COMMITs: rank 0 three, rank 2 one
        for it in range(n):
            f = ip_frame(t[rank], job.shadows[0].ip, commit_dgram(job, rank, iteration=it))
            frames.append((t[rank].port, f))
            want["commits"][rank] = _add(want["commits"][rank], len(f))
    for rank in range(2):  # untagged DATA: counted nowhere
        bucket, r = routes[rank]
        frames.append((t[rank].port, chunk(job, rank, bucket, r.start, 32, final=False)))
    bucket, r = routes[0]
    drops = want["drops"]
    for port, f, reason in (
        (
            job.shadows[1].port,
            ip_frame(job.shadows[1], t[0].ip, data_dgram(job, 1, bucket, r.start, 32)),
            "spoofed",
        ),
        (STRANGER_PORT, ip_frame(stranger, job.shadows[0].ip, commit_dgram(job)), "spoofed"),
        (
            t[3].port,
            ip_frame(t[3], t[0].ip, data_dgram(job, 3, bucket, r.start, 32, job_id=FOREIGN_JOB)),
            "foreign_job",
        ),
        (
            t[1].port,
            _bad_magic(ip_frame(t[1], t[2].ip, data_dgram(job, 1, bucket, r.start, 32))),
            "parser_error",
        ),
        (
            t[2].port,
            ip_frame(t[2], "10.9.9.9", data_dgram(job, 2, bucket, r.start, 32)),
            "no_route",
        ),
    ):
        frames.append((port, f))
        drops[reason] = _add(drops[reason], len(f))
    got = tb.send_many(frames)
    n_final = sum(x[0] for x in want["tagged"])
    assert len(got) == 3 * n_final + 4 * 4 + 2  # next hop + 2 replicas; 4 shadows per COMMIT
    c = d.counters()
    assert c == want
    assert [x[0] for x in c["tagged"]] == [1, 2, 3, 4]
    assert [x[0] for x in c["commits"]] == [3, 0, 1, 0]


# ---------------------------------------------------------------------------- 6: parser, ARP
def _bad_magic(f: bytes) -> bytes:
    """``f`` with the shadowgrad magic overwritten (UDP checksum fixed up)."""
    b = bytearray(f)
    b[_SG_AT : _SG_AT + 2] = b"XX"
    b[_UDP_AT + 6 : _UDP_AT + 8] = udp_checksum(bytes(b)).to_bytes(2, "big")
    return bytes(b)


def test_bad_magic_and_truncated_header_are_parser_errors(
    tb: Bench, a: tuple[Job, SwitchDriver]
) -> None:
    job, d = a
    t = job.trainers
    bucket, r = job.routes()[0]
    want = zero_counters(job)
    f = _bad_magic(chunk(job, 0, bucket, r.start, 64))
    expect(tb.send(t[0].port, f), [])
    want["drops"]["parser_error"] = (1, len(f))
    assert d.counters() == want
    # a shadowgrad UDP port with fewer bytes than the header: also a parser error
    short = ip_frame(t[1], t[2].ip, b"SG\x01\x01")
    expect(tb.send(t[1].port, short), [])
    want["drops"]["parser_error"] = (2, len(f) + len(short))
    assert d.counters() == want


def test_arp_broadcast_floods_to_the_jobs_other_hosts(tb: Bench) -> None:
    ja, jb = job_a(), job_b()
    client = tb.client()
    da = tb.program(ja, client)
    tb.program(jb, client)
    for src in (ja.trainers[0], ja.shadows[2]):
        f = arp_request(src, ja.trainers[1].ip)
        expect(tb.send(src.port, f), [(h.port, f) for h in ja.hosts if h.port != src.port])
    f = arp_request(jb.trainers[1], jb.trainers[0].ip)
    expect(
        tb.send(jb.trainers[1].port, f),
        [(h.port, f) for h in jb.hosts if h.port != jb.trainers[1].port],
    )
    # from a port of no job: no flood group, dropped as no_route
    stranger = Host("192.168.9.9", STRANGER_PORT, port_mac(STRANGER_PORT))
    f = arp_request(stranger, ja.trainers[0].ip)
    expect(tb.send(STRANGER_PORT, f), [])
    assert da.counters()["drops"] == {**dict.fromkeys(DROP_REASONS, ZERO), "no_route": (1, len(f))}


# ---------------------------------------------------------------------------- 7: idempotence
def test_converge_is_idempotent_across_restarts_and_writes_only_the_difference(tb: Bench) -> None:
    job = job_a()
    c0 = tb.client()
    d0 = tb.driver(job, c0)
    rep = d0.converge()
    assert rep.pipeline_pushed
    assert (
        rep.inserted
        == len(d0.desired(rep.group_base).entries)
        == c0.writes - len(d0.desired(rep.group_base).groups)
    )
    assert rep.groups_inserted == d0.job.n_groups and rep.modified == rep.deleted == 0
    info = tb.backend.pipeline[0]
    first = dump(c0, info)
    assert (len(first[0]), len(first[1])) == (rep.inserted, rep.groups_inserted)
    first_state = state_of(d0)
    assert first_state == (d0.desired(rep.group_base).entries, d0.desired(rep.group_base).groups)
    c0.close()
    for _restart in range(2):
        c = tb.client()
        d = tb.driver(job, c)
        rep = d.converge()
        assert rep.writes == 0 and not rep.pipeline_pushed, rep
        assert c.writes == 0 and c.write_rpcs == 0
        assert dump(c, info) == first
        assert state_of(d) == first_state
        c.close()
    # shadow 1 moves to another IPv4 address
    ips = [f"10.0.1.{i}" for i in range(1, 5)]
    ips[1] = "10.0.1.22"
    moved = job_a(ips)
    c = tb.client()
    d = tb.driver(moved, c)
    rep = d.converge()
    assert (rep.deleted, rep.inserted, rep.modified) == (1, 1, 1), rep
    assert (rep.groups_inserted, rep.groups_modified, rep.groups_deleted) == (0, 0, 0)
    assert not rep.pipeline_pushed and c.writes == 3
    entries, groups = state_of(d)
    assert groups == first_state[1]
    old, new = set(first_state[0].items()), set(entries.items())
    assert {e.table for _, e in old - new} == {
        "SgIngress.forward.ipv4_forward",
        "SgEgress.shadow_rewrite",
    }
    rep = tb.driver(moved, c).converge()
    assert rep.writes == 0
    # the data plane now copies shard 1 to 10.0.1.22, routes there, and not to the old address
    k = 1
    shard = job.layout.shard_of_shadow(k)[0]
    bucket, r = next((b, r) for b, r in moved.routes() if r.shard == shard)
    f = chunk(moved, 2, bucket, r.start, 64)
    got = tb.send(moved.trainers[2].port, f)
    expect(
        got,
        [(moved.trainers[3].port, routed(f, moved.trainers[3]))]
        + [(s.port, shadow_copy(f, s)) for s in moved.replicas(shard)],
    )
    out = dict(got)[moved.shadows[k].port]
    assert out[_IP_AT + 16 : _IP_AT + 20] == ipaddress.IPv4Address("10.0.1.22").packed
    t0 = moved.trainers[0]
    f = ip_frame(t0, "10.0.1.22", b"hello", dport=5000)
    expect(tb.send(t0.port, f), [(6, routed(f, moved.shadows[k]))])
    f = ip_frame(t0, "10.0.1.2", b"hello", dport=5000)
    expect(tb.send(t0.port, f), [])
    assert d.counters()["drops"]["no_route"] == (1, len(f))


# ---------------------------------------------------------------------------- 8: r = 2, volume
N_CHUNKS = 1000


def test_both_replicas_receive_every_final_chunk_of_their_shard(
    tb: Bench, a: tuple[Job, SwitchDriver]
) -> None:
    job, d = a
    t = job.trainers
    world = len(t)
    pieces = []  # every 256-byte piece of every route, each in one shard
    for bucket, r in job.routes():
        for off in range(r.start, r.end, 256):
            pieces.append((bucket, off, min(256, r.end - off), r.shard))
    frames: list[tuple[int, bytes]] = []
    want_shard: dict[int, set[tuple[int, int, int]]] = collections.defaultdict(set)
    want_hop: dict[int, set[tuple[int, int, int]]] = collections.defaultdict(set)
    want = zero_counters(job)
    it = 0
    i = 0
    while len(frames) < N_CHUNKS:
        it += 1
        for bucket, off, length, shard in pieces:
            rank = i % world
            i += 1
            nxt = t[(rank + 1) % world]
            f = chunk(job, rank, bucket, off, length, iteration=it, seq=i)
            frames.append((t[rank].port, f))
            want_shard[shard].add((it, bucket, off))
            want_hop[nxt.port].add((it, bucket, off))
            want["tagged"][rank] = _add(want["tagged"][rank], len(f))
            for k in job.layout.shadows_of_shard(shard):
                want["shadow_copies"][k] = _add(want["shadow_copies"][k], len(f))
            want["shard_copies"][shard] = _add(want["shard_copies"][shard], len(f), 2)
    got = tb.send_many(frames)
    by_port: dict[int, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for port, out in got:
        assert ipv4_checksum_ok(out)
        fr = decode_frame(out)
        assert fr is not None
        h = decode(fr.payload, job=job.id, layout=job.layout.digest64).header
        by_port[port].append((h.iteration, h.bucket, h.offset))
        if port in {s.port for s in job.shadows}:
            shadow = next(s for s in job.shadows if s.port == port)
            assert fr.dst == (shadow.ip, shadow.udp) and out[_UDP_AT + 6 : _UDP_AT + 8] == b"\0\0"
    assert len(got) == 3 * len(frames)
    for k, s in enumerate(job.shadows):
        keys = by_port.pop(s.port)
        shard = job.layout.shard_of_shadow(k)[0]
        assert len(keys) == len(set(keys)) and set(keys) == want_shard[shard], s
    for trainer in t:
        keys = by_port.pop(trainer.port)
        assert len(keys) == len(set(keys)) and set(keys) == want_hop[trainer.port]
    assert not by_port  # nothing anywhere else
    assert want_shard[0] | want_shard[1] == {k for ks in want_hop.values() for k in ks}
    assert d.counters() == want
    assert sum(x[0] for x in want["tagged"]) == len(frames) >= N_CHUNKS


# ---------------------------------------------------------------------------- hosts that move
def test_moving_a_trainer_to_another_port_moves_its_entries(
    tb: Bench, a: tuple[Job, SwitchDriver]
) -> None:
    job, d = a
    ips = [h.ip for h in job.trainers]
    moved = make_job(
        job.id, ips, [1, 10, 3, 4], [h.ip for h in job.shadows], [h.port for h in job.shadows], 2
    )
    rep = tb.driver(moved, d.client).converge()
    # the flood group and the two shard groups whose next hop is rank 1
    assert (rep.groups_inserted, rep.groups_modified, rep.groups_deleted) == (0, 3, 0)
    port_fields = ("port", "standard_metadata.ingress_port", "standard_metadata.egress_spec")
    left = [
        e for e in all_entries(d) if 2 in [v for k, v in (*e.params, *e.match) if k in port_fields]
    ]
    assert left == [], left
    t0 = moved.trainers[0]
    f = ip_frame(t0, ips[1], b"hello", dport=5000)
    expect(tb.send(t0.port, f), [(10, routed(f, moved.trainers[1]))])
