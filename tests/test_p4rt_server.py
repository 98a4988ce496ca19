"""P4Runtime server, in-process: arbitration, pipeline config, table entry CRUD and error codes,
PRE (multicast groups, clone sessions), counters and direct counters, packet-in/out, digests.

Everything runs against the real Pipeline/Dataplane (tests/p4progs/rt_l2l3.p4) with in-process
ports, through a real grpcio channel on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from shadowgrad.controller.p4runtime import status_details
from shadowgrad.p4target.dataplane import Pipeline
from shadowgrad.p4target.p4runtime_server import API_VERSION
from shadowgrad.p4target.ports import InProcessPort
from shadowgrad.p4target.switch import Switch

PROG = Path(__file__).resolve().parent / "p4progs" / "rt_l2l3.p4"
CPU = 255
U = p4runtime_pb2.Update


# ---- a small test client -----------------------------------------------------------------------
class Client:
    """A P4Runtime client for tests: stub, a StreamChannel with a reader thread, helpers."""

    def __init__(
        self, addr: str, device_id: int = 0, election_id: int | None = 1, role: str = ""
    ) -> None:
        self.channel = grpc.insecure_channel(addr)
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self.device_id = device_id
        self.election_id = election_id or 0
        self.role = role
        self._out: queue.Queue[p4runtime_pb2.StreamMessageRequest | None] = queue.Queue()
        self.msgs: queue.Queue[Any] = queue.Queue()
        self.stream_error: grpc.RpcError | None = None
        self._stream = self.stub.StreamChannel(self._requests())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if election_id is not None:
            self.arbitrate(election_id)

    def _requests(self) -> Iterator[p4runtime_pb2.StreamMessageRequest]:
        while True:
            m = self._out.get()
            if m is None:
                return
            yield m

    def _read(self) -> None:
        try:
            for m in self._stream:
                self.msgs.put(m)
        except grpc.RpcError as e:
            self.stream_error = e
        self.msgs.put(None)

    def send(self, m: p4runtime_pb2.StreamMessageRequest) -> None:
        self._out.put(m)

    def arbitrate(self, election_id: int, device_id: int | None = None) -> None:
        self.election_id = election_id
        r = p4runtime_pb2.StreamMessageRequest()
        r.arbitration.device_id = self.device_id if device_id is None else device_id
        r.arbitration.election_id.high = election_id >> 64
        r.arbitration.election_id.low = election_id & ((1 << 64) - 1)
        if self.role:
            r.arbitration.role.name = self.role
        self.send(r)

    def next(self, kind: str, timeout: float = 10.0) -> Any:
        """The next stream message of ``kind`` (others are skipped); None if the stream ended."""
        while True:
            m = self.msgs.get(timeout=timeout)
            if m is None:
                return None
            if m.WhichOneof("update") == kind:
                return getattr(m, kind)

    def write(
        self, *updates: p4runtime_pb2.Update, election_id: int | None = None
    ) -> p4runtime_pb2.WriteResponse:
        req = p4runtime_pb2.WriteRequest(device_id=self.device_id, role=self.role)
        eid = self.election_id if election_id is None else election_id
        req.election_id.high, req.election_id.low = eid >> 64, eid & ((1 << 64) - 1)
        req.updates.extend(updates)
        return self.stub.Write(req, timeout=10)

    def read(self, *entities: p4runtime_pb2.Entity) -> list[p4runtime_pb2.Entity]:
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id, entities=entities)
        return [e for r in self.stub.Read(req, timeout=10) for e in r.entities]

    def set_pipeline(self, pipeline: Pipeline, action: int = 3, cookie: int = 0) -> None:
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, role=self.role, action=action
        )
        req.election_id.high, req.election_id.low = (
            self.election_id >> 64,
            self.election_id & ((1 << 64) - 1),
        )
        req.config.p4info.CopyFrom(pipeline.p4info)
        req.config.p4_device_config = pipeline.to_device_config()
        if cookie:
            req.config.cookie.cookie = cookie
        self.stub.SetForwardingPipelineConfig(req, timeout=30)

    def close(self) -> None:
        self._out.put(None)
        self.channel.close()
        self._reader.join(5)


class Names:
    """Name -> id lookups over a P4Info (by full name or alias)."""

    def __init__(self, p4info: p4info_pb2.P4Info) -> None:
        self.p4info = p4info
        self.ids: dict[str, int] = {}
        for kind in (
            "tables",
            "actions",
            "counters",
            "direct_counters",
            "digests",
            "registers",
            "controller_packet_metadata",
        ):
            for o in getattr(p4info, kind):
                self.ids[o.preamble.name] = o.preamble.id
                self.ids[o.preamble.alias] = o.preamble.id

    def __getitem__(self, name: str) -> int:
        return self.ids[name]

    def field(self, table: str, name: str) -> int:
        t = next(t for t in self.p4info.tables if t.preamble.id == self[table])
        return next(m.id for m in t.match_fields if m.name == name)


def b(v: int, n: int) -> bytes:
    return v.to_bytes(n, "big")


def upd(kind: int, entity: p4runtime_pb2.Entity) -> p4runtime_pb2.Update:
    return p4runtime_pb2.Update(type=kind, entity=entity)


def codes(e: grpc.RpcError) -> list[int]:
    return [x.canonical_code for x in status_details(e)]


# ---- fixtures ----------------------------------------------------------------------------------
# (named: a module that imports them gets them as its own fixtures ``pipeline`` and ``names``)
@pytest.fixture(scope="module", name="pipeline")
def pipeline_fixture() -> Pipeline:
    """rt_l2l3.p4, compiled once per module."""
    return Pipeline.compile(PROG)


@pytest.fixture(scope="module", name="names")
def names_fixture(pipeline: Pipeline) -> Names:
    return Names(pipeline.p4info)


@pytest.fixture
def switch() -> Iterator[Switch]:
    sw = Switch(device_id=0, cpu_port=CPU, grpc_addr="127.0.0.1:0")
    for n in (1, 2, 3):
        sw.add_port(InProcessPort(n))
    sw.start()
    try:
        yield sw
    finally:
        sw.stop()


@pytest.fixture
def addr(switch: Switch) -> str:
    assert switch.server is not None
    return f"127.0.0.1:{switch.server.port}"


@contextlib.contextmanager
def primary_client(addr: str, pipeline: Pipeline) -> Iterator[Client]:
    """A client of the server at ``addr`` that won arbitration (election id 10) and set
    ``pipeline``; closed on exit."""
    c = Client(addr, election_id=10)
    try:
        assert c.next("arbitration").status.code == code_pb2.OK
        c.set_pipeline(pipeline)
        yield c
    finally:
        c.close()


@pytest.fixture
def client(addr: str, pipeline: Pipeline) -> Iterator[Client]:
    with primary_client(addr, pipeline) as c:
        yield c


def port(sw: Switch, n: int) -> InProcessPort:
    p = sw.ports[n]
    assert isinstance(p, InProcessPort)
    return p


# ---- entity builders ---------------------------------------------------------------------------
def table_entity(nm: Names, table: str) -> tuple[p4runtime_pb2.Entity, Any]:
    """An entity of table ``table`` and its ``table_entry`` to fill in."""
    e = p4runtime_pb2.Entity()
    e.table_entry.table_id = nm[table]
    return e, e.table_entry


def lpm_entry(nm: Names, dst: int, plen: int, mac: int, out_port: int) -> p4runtime_pb2.Entity:
    e, te = table_entity(nm, "MyIngress.ipv4_lpm")
    m = te.match.add(field_id=nm.field("MyIngress.ipv4_lpm", "hdr.ipv4.dstAddr"))
    m.lpm.value, m.lpm.prefix_len = encode(dst), plen
    a = te.action.action
    a.action_id = nm["MyIngress.ipv4_forward"]
    a.params.add(param_id=1, value=encode(mac))
    a.params.add(param_id=2, value=encode(out_port))
    return e


def dmac_entry(nm: Names, mac: int, action: str, value: int) -> p4runtime_pb2.Entity:
    e, te = table_entity(nm, "MyIngress.dmac")
    te.match.add(field_id=1).exact.value = encode(mac)
    te.action.action.action_id = nm[action]
    te.action.action.params.add(param_id=1, value=encode(value))
    return e


def acl_entry(nm: Names, dst: int, mask: int, action: str, prio: int) -> p4runtime_pb2.Entity:
    e, te = table_entity(nm, "MyIngress.acl")
    m = te.match.add(field_id=nm.field("MyIngress.acl", "hdr.ipv4.dstAddr"))
    m.ternary.value, m.ternary.mask = encode(dst), encode(mask)
    te.action.action.action_id = nm[action]
    te.priority = prio
    return e


def mc_entity(gid: int, reps: list[tuple[int, int]]) -> p4runtime_pb2.Entity:
    e = p4runtime_pb2.Entity()
    g = e.packet_replication_engine_entry.multicast_group_entry
    g.multicast_group_id = gid
    for p, i in reps:
        g.replicas.add(egress_port=p, instance=i)
    return e


def clone_entity(
    sid: int, reps: list[tuple[int, int]], cos: int = 0, plen: int = 0
) -> p4runtime_pb2.Entity:
    e = p4runtime_pb2.Entity()
    s = e.packet_replication_engine_entry.clone_session_entry
    s.session_id, s.class_of_service, s.packet_length_bytes = sid, cos, plen
    for p, i in reps:
        s.replicas.add(egress_port=p, instance=i)
    return e


def encode(v: int) -> bytes:
    return v.to_bytes(max(1, (v.bit_length() + 7) // 8), "big")


def ipv4_frame(
    dst_ip: str,
    src_mac: str = "00:00:00:00:01:01",
    dst_mac: str = "00:00:00:00:02:02",
    proto: int = 17,
) -> bytes:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    return bytes(
        Ether(src=src_mac, dst=dst_mac)
        / IP(src="10.0.0.1", dst=dst_ip, ttl=64, proto=proto)
        / UDP(sport=1234, dport=5678)
        / (b"x" * 20)
    )


# ---- tests: session, arbitration, pipeline -----------------------------------------------------
def test_capabilities(addr: str) -> None:
    c = Client(addr, election_id=None)
    try:
        r = c.stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=5)
        assert r.p4runtime_api_version == API_VERSION == "1.3.0"
    finally:
        c.close()


def test_arbitration_primary_backup_and_failover(addr: str) -> None:
    c1 = Client(addr, election_id=1)
    c2 = c3 = None
    try:
        a = c1.next("arbitration")
        assert a.status.code == code_pb2.OK and a.election_id.low == 1
        c2 = Client(addr, election_id=5)
        assert c2.next("arbitration").status.code == code_pb2.OK
        a = c1.next("arbitration")  # c1 is told it lost
        assert a.status.code == code_pb2.ALREADY_EXISTS and a.election_id.low == 5
        c3 = Client(addr, election_id=5)  # duplicate election id: stream refused
        assert c3.next("arbitration") is None
        assert c3.stream_error is not None
        assert c3.stream_error.code() == grpc.StatusCode.INVALID_ARGUMENT
        c2.close()
        c2 = None
        a = c1.next("arbitration")  # failover: c1 is primary again
        assert a.status.code == code_pb2.OK and a.election_id.low == 1
    finally:
        for c in (c1, c2, c3):
            if c is not None:
                c.close()


def test_arbitration_wrong_device_and_first_message(addr: str) -> None:
    c = Client(addr, device_id=7, election_id=1)
    try:
        assert c.next("arbitration") is None
        assert c.stream_error is not None
        assert c.stream_error.code() == grpc.StatusCode.NOT_FOUND
    finally:
        c.close()
    c = Client(addr, election_id=None)
    try:
        c.send(p4runtime_pb2.StreamMessageRequest(packet=p4runtime_pb2.PacketOut(payload=b"x")))
        assert c.next("arbitration") is None
        assert c.stream_error is not None
        assert c.stream_error.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        c.close()


def test_writes_need_primary_and_pipeline(addr: str, pipeline: Pipeline, names: Names) -> None:
    c = Client(addr, election_id=3)
    try:
        c.next("arbitration")
        with pytest.raises(grpc.RpcError) as ei:
            c.write(upd(U.INSERT, mc_entity(1, [(1, 1)])))
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as ei:
            c.write(upd(U.INSERT, mc_entity(1, [(1, 1)])), election_id=2)
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as ei:
            c.election_id = 2
            c.set_pipeline(pipeline)
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        c.election_id = 3
        c.set_pipeline(pipeline)
        c.write(upd(U.INSERT, mc_entity(1, [(1, 1)])))
        with pytest.raises(grpc.RpcError) as ei:
            c.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry()))
            req = p4runtime_pb2.ReadRequest(device_id=9)
            list(c.stub.Read(req, timeout=5))
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        c.close()


def test_pipeline_config_actions_and_get(addr: str, pipeline: Pipeline) -> None:
    set_req = p4runtime_pb2.SetForwardingPipelineConfigRequest
    get_req = p4runtime_pb2.GetForwardingPipelineConfigRequest
    c = Client(addr, election_id=1)
    try:
        c.next("arbitration")
        with pytest.raises(grpc.RpcError) as ei:
            c.stub.GetForwardingPipelineConfig(get_req(device_id=0), timeout=5)
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        c.set_pipeline(pipeline, action=set_req.VERIFY)
        with pytest.raises(grpc.RpcError) as ei:
            c.set_pipeline(pipeline, action=set_req.COMMIT)  # nothing saved
        assert ei.value.code() in (
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.INVALID_ARGUMENT,
        )
        c.set_pipeline(pipeline, action=set_req.VERIFY_AND_SAVE, cookie=42)
        req = set_req(device_id=0, action=set_req.COMMIT)
        req.election_id.low = 1
        c.stub.SetForwardingPipelineConfig(req, timeout=10)
        get = c.stub.GetForwardingPipelineConfig
        r = get(get_req(device_id=0, response_type=get_req.ALL), timeout=5)
        assert r.config.p4info == pipeline.p4info and r.config.cookie.cookie == 42
        assert r.config.p4_device_config == pipeline.to_device_config()
        r = get(get_req(device_id=0, response_type=get_req.COOKIE_ONLY), timeout=5)
        assert not r.config.HasField("p4info") and r.config.cookie.cookie == 42
        bad = set_req(device_id=0, action=set_req.VERIFY_AND_COMMIT)
        bad.election_id.low = 1
        bad.config.p4info.CopyFrom(pipeline.p4info)
        bad.config.p4_device_config = b"not a pipeline"
        with pytest.raises(grpc.RpcError) as ei:
            c.stub.SetForwardingPipelineConfig(bad, timeout=10)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        bad.action = set_req.RECONCILE_AND_COMMIT
        with pytest.raises(grpc.RpcError) as ei:
            c.stub.SetForwardingPipelineConfig(bad, timeout=10)
        assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        c.close()


# ---- tests: tables ----------------------------------------------------------------------------
def test_table_entry_crud_round_trip(client: Client, names: Names) -> None:
    e = lpm_entry(names, 0x0A000200, 24, 0x000000000202, 2)
    client.write(upd(U.INSERT, e))
    got = client.read(
        p4runtime_pb2.Entity(
            table_entry=p4runtime_pb2.TableEntry(table_id=names["MyIngress.ipv4_lpm"])
        )
    )
    assert len(got) == 1 and got[0].table_entry == e.table_entry
    e2 = lpm_entry(names, 0x0A000200, 24, 0x000000000303, 3)
    client.write(upd(U.MODIFY, e2))
    got = client.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry()))
    assert [g.table_entry for g in got] == [e2.table_entry]
    # exact + ternary in one batch; wildcard read over all tables
    client.write(
        upd(U.INSERT, dmac_entry(names, 0x000000000202, "MyIngress.l2_forward", 2)),
        upd(U.INSERT, acl_entry(names, 0x0A000000, 0xFF000000, "MyIngress.drop", 10)),
    )
    assert len(client.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry()))) == 3
    # read one entry by its key
    key = p4runtime_pb2.Entity()
    key.table_entry.CopyFrom(e2.table_entry)
    key.table_entry.ClearField("action")
    assert [g.table_entry for g in client.read(key)] == [e2.table_entry]
    client.write(upd(U.DELETE, key))
    got = client.read(
        p4runtime_pb2.Entity(
            table_entry=p4runtime_pb2.TableEntry(table_id=names["MyIngress.ipv4_lpm"])
        )
    )
    assert got == []


def test_default_action_modify_and_read(client: Client, names: Names) -> None:
    tid = names["MyIngress.dmac"]
    e = p4runtime_pb2.Entity()
    e.table_entry.table_id = tid
    e.table_entry.is_default_action = True
    e.table_entry.action.action.action_id = names["MyIngress.multicast"]
    e.table_entry.action.action.params.add(param_id=1, value=b"\x07")
    client.write(upd(U.MODIFY, e))
    q = p4runtime_pb2.Entity()
    q.table_entry.table_id = tid
    q.table_entry.is_default_action = True
    got = client.read(q)
    assert len(got) == 1 and got[0].table_entry.is_default_action
    assert got[0].table_entry.action == e.table_entry.action
    with pytest.raises(grpc.RpcError) as ei:
        client.write(upd(U.INSERT, e))
    assert codes(ei.value) == [code_pb2.INVALID_ARGUMENT]


def test_write_errors_are_per_update(client: Client, names: Names) -> None:
    ok = dmac_entry(names, 0x1, "MyIngress.l2_forward", 1)
    client.write(upd(U.INSERT, ok))
    bad_table = dmac_entry(names, 0x2, "MyIngress.l2_forward", 1)
    bad_table.table_entry.table_id = 0x02FFFFFF
    wrong_action = dmac_entry(names, 0x3, "MyIngress.ipv4_forward", 1)
    too_wide = dmac_entry(names, 0x4, "MyIngress.l2_forward", 1)
    too_wide.table_entry.action.action.params[0].value = b"\x02\x00"  # 512 > 9 bits
    zero_mask = acl_entry(names, 0, 0, "MyIngress.drop", 5)
    no_prio = acl_entry(names, 0x0A000000, 0xFF000000, "MyIngress.drop", 0)
    lpm_prio = lpm_entry(names, 0x0A000000, 8, 1, 1)
    lpm_prio.table_entry.priority = 3
    lpm_trailing = lpm_entry(names, 0x0A000001, 8, 1, 1)
    padded = dmac_entry(names, 0x5, "MyIngress.l2_forward", 1)
    padded.table_entry.match[0].exact.value = b"\x00" * 8 + b"\x05"  # zero-padded: accepted
    with pytest.raises(grpc.RpcError) as ei:
        client.write(
            upd(U.INSERT, ok),
            upd(U.INSERT, bad_table),
            upd(U.INSERT, wrong_action),
            upd(U.INSERT, too_wide),
            upd(U.INSERT, zero_mask),
            upd(U.INSERT, no_prio),
            upd(U.INSERT, lpm_prio),
            upd(U.INSERT, lpm_trailing),
            upd(U.MODIFY, dmac_entry(names, 0x9, "MyIngress.l2_forward", 1)),
            upd(U.INSERT, padded),
        )
    assert ei.value.code() == grpc.StatusCode.UNKNOWN
    assert codes(ei.value) == [
        code_pb2.ALREADY_EXISTS,
        code_pb2.NOT_FOUND,
        code_pb2.INVALID_ARGUMENT,
        code_pb2.INVALID_ARGUMENT,
        code_pb2.INVALID_ARGUMENT,
        code_pb2.INVALID_ARGUMENT,
        code_pb2.INVALID_ARGUMENT,
        code_pb2.INVALID_ARGUMENT,
        code_pb2.NOT_FOUND,
        code_pb2.OK,
    ]
    q = p4runtime_pb2.Entity()
    q.table_entry.CopyFrom(padded.table_entry)
    q.table_entry.ClearField("action")
    got = client.read(q)
    assert got[0].table_entry.match[0].exact.value == b"\x05"  # canonical on read
    req = p4runtime_pb2.WriteRequest(
        device_id=0, atomicity=p4runtime_pb2.WriteRequest.ROLLBACK_ON_ERROR
    )
    req.election_id.low = client.election_id
    with pytest.raises(grpc.RpcError) as ei:
        client.stub.Write(req, timeout=5)
    assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED


# ---- tests: PRE -------------------------------------------------------------------------------
def test_multicast_groups(client: Client) -> None:
    client.write(
        upd(U.INSERT, mc_entity(1, [(1, 1), (2, 2), (3, 3)])),
        upd(U.INSERT, mc_entity(32767, [(2, 0)])),
    )
    got = client.read(mc_entity(0, []))
    assert [
        (
            g.packet_replication_engine_entry.multicast_group_entry.multicast_group_id,
            [
                (r.egress_port, r.instance)
                for r in g.packet_replication_engine_entry.multicast_group_entry.replicas
            ],
        )
        for g in got
    ] == [(1, [(1, 1), (2, 2), (3, 3)]), (32767, [(2, 0)])]
    client.write(upd(U.MODIFY, mc_entity(1, [(3, 9)])))
    g = client.read(mc_entity(1, []))[0].packet_replication_engine_entry.multicast_group_entry
    assert [(r.egress_port, r.instance) for r in g.replicas] == [(3, 9)]
    byport = mc_entity(5, [])
    byport.packet_replication_engine_entry.multicast_group_entry.replicas.add(
        port=b"\x00\x02", instance=4
    )  # the 1.4 `port` bytes form
    with pytest.raises(grpc.RpcError) as ei:
        client.write(
            upd(U.INSERT, mc_entity(0, [(1, 1)])),
            upd(U.INSERT, mc_entity(32768, [(1, 1)])),
            upd(U.INSERT, mc_entity(2, [(1, 1), (1, 1)])),
            upd(U.INSERT, mc_entity(1, [(1, 1)])),
            upd(U.DELETE, mc_entity(3, [])),
            upd(U.INSERT, byport),
        )
    assert codes(ei.value) == [
        code_pb2.INVALID_ARGUMENT,
        code_pb2.OUT_OF_RANGE,
        code_pb2.INVALID_ARGUMENT,
        code_pb2.ALREADY_EXISTS,
        code_pb2.NOT_FOUND,
        code_pb2.OK,
    ]
    client.write(upd(U.DELETE, mc_entity(1, [])))
    ids = [
        g.packet_replication_engine_entry.multicast_group_entry.multicast_group_id
        for g in client.read(mc_entity(0, []))
    ]
    assert ids == [5, 32767]


def test_clone_sessions(client: Client) -> None:
    client.write(upd(U.INSERT, clone_entity(100, [(3, 0)])))
    got = client.read(clone_entity(0, []))
    s = got[0].packet_replication_engine_entry.clone_session_entry
    assert s.session_id == 100 and [(r.egress_port, r.instance) for r in s.replicas] == [(3, 0)]
    with pytest.raises(grpc.RpcError) as ei:
        client.write(
            upd(U.INSERT, clone_entity(101, [(3, 0)], cos=1)),
            upd(U.INSERT, clone_entity(102, [(3, 0)], plen=64)),
            upd(U.INSERT, clone_entity(40000, [(3, 0)])),
            upd(U.MODIFY, clone_entity(100, [(2, 0), (3, 0)])),
        )
    assert codes(ei.value) == [
        code_pb2.UNIMPLEMENTED,
        code_pb2.UNIMPLEMENTED,
        code_pb2.OUT_OF_RANGE,
        code_pb2.OK,
    ]
    client.write(upd(U.DELETE, clone_entity(100, [])))
    assert client.read(clone_entity(0, [])) == []


# ---- tests: packets, counters, packet-in/out, digests ------------------------------------------
def test_forwarding_and_counters(client: Client, names: Names, switch: Switch) -> None:
    from scapy.layers.inet import IP
    from scapy.layers.l2 import Ether

    client.write(upd(U.INSERT, lpm_entry(names, 0x0A000002, 32, 0x0000000000B2, 2)))
    frame = ipv4_frame("10.0.0.2")
    for _ in range(3):
        port(switch, 1).inject(frame)
    outs = [port(switch, 2).recv(5) for _ in range(3)]
    assert all(o is not None for o in outs)
    pkt = Ether(outs[0])
    assert pkt.dst == "00:00:00:00:00:b2" and pkt[IP].ttl == 63
    ip = pkt[IP]
    sent_csum = ip.chksum
    del ip.chksum
    assert IP(bytes(ip)).chksum == sent_csum  # checksum updated after the TTL change
    # indexed counter, one index and the whole array
    ce = p4runtime_pb2.Entity()
    ce.counter_entry.counter_id = names["MyIngress.port_rx"]
    ce.counter_entry.index.index = 1
    got = client.read(ce)
    assert [(g.counter_entry.data.packet_count, g.counter_entry.data.byte_count) for g in got] == [
        (3, 3 * len(frame))
    ]
    allc = p4runtime_pb2.Entity()
    allc.counter_entry.counter_id = names["MyIngress.port_rx"]
    assert len(client.read(allc)) == 512
    # direct counter through the table entry and through DirectCounterEntry
    q = p4runtime_pb2.Entity()
    q.table_entry.table_id = names["MyIngress.ipv4_lpm"]
    q.table_entry.counter_data.SetInParent()
    te = client.read(q)[0].table_entry
    assert te.counter_data.packet_count == 3 and te.counter_data.byte_count > 0
    dq = p4runtime_pb2.Entity()
    dq.direct_counter_entry.table_entry.table_id = names["MyIngress.ipv4_lpm"]
    d = client.read(dq)[0].direct_counter_entry
    assert d.data.packet_count == 3
    # counter writes (MODIFY only)
    w = p4runtime_pb2.Entity()
    w.counter_entry.CopyFrom(ce.counter_entry)
    w.counter_entry.data.packet_count = 0
    client.write(upd(U.MODIFY, w))
    assert client.read(ce)[0].counter_entry.data.packet_count == 0
    dw = p4runtime_pb2.Entity()
    dw.direct_counter_entry.table_entry.CopyFrom(te)
    dw.direct_counter_entry.table_entry.ClearField("action")
    dw.direct_counter_entry.table_entry.ClearField("counter_data")
    dw.direct_counter_entry.data.packet_count = 100
    client.write(upd(U.MODIFY, dw))
    assert client.read(dq)[0].direct_counter_entry.data.packet_count == 100
    bad = p4runtime_pb2.Entity()
    bad.counter_entry.counter_id = names["MyIngress.port_rx"]
    bad.counter_entry.index.index = 512
    with pytest.raises(grpc.RpcError) as ei:
        client.read(bad)
    assert ei.value.code() == grpc.StatusCode.OUT_OF_RANGE
    with pytest.raises(grpc.RpcError) as ei:
        client.write(upd(U.INSERT, w))
    assert codes(ei.value) == [code_pb2.INVALID_ARGUMENT]


def test_registers_are_unimplemented_like_bmv2(client: Client) -> None:
    e = p4runtime_pb2.Entity()
    e.register_entry.register_id = 0
    with pytest.raises(grpc.RpcError) as ei:
        client.read(e)
    assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_multicast_replicas_with_rid_rewrite(client: Client, names: Names, switch: Switch) -> None:
    from scapy.layers.inet import IP

    bcast = 0xFFFFFFFFFFFF
    client.write(
        upd(U.INSERT, mc_entity(1, [(1, 11), (2, 12), (3, 13)])),
        upd(U.INSERT, dmac_entry(names, bcast, "MyIngress.multicast", 1)),
    )
    port(switch, 1).inject(ipv4_frame("10.0.0.255", dst_mac="ff:ff:ff:ff:ff:ff"))
    got = {n: port(switch, n).recv_all(0.3) for n in (1, 2, 3)}
    assert got[1] == []  # suppressed toward the ingress port
    assert [IP(f[14:]).id for f in got[2]] == [12]
    assert [IP(f[14:]).id for f in got[3]] == [13]


def test_packet_in_and_out(client: Client, names: Names, switch: Switch, addr: str) -> None:
    client.write(upd(U.INSERT, acl_entry(names, 0x0A000063, 0xFFFFFFFF, "MyIngress.to_cpu", 10)))
    frame = ipv4_frame("10.0.0.99")
    port(switch, 2).inject(frame)
    pin = client.next("packet")
    assert pin.payload == frame
    assert [(m.metadata_id, m.value) for m in pin.metadata] == [(1, b"\x02"), (2, b"\x00")]
    # packet-out to port 3
    po = p4runtime_pb2.StreamMessageRequest()
    po.packet.payload = frame
    po.packet.metadata.add(metadata_id=1, value=b"\x03")
    client.send(po)
    assert port(switch, 3).recv(5) == frame
    # a backup's packet-out is refused with a StreamError
    backup = Client(addr, election_id=2)
    try:
        assert backup.next("arbitration").status.code == code_pb2.ALREADY_EXISTS
        backup.send(po)
        err = backup.next("error")
        assert err.canonical_code == code_pb2.PERMISSION_DENIED
        assert err.packet_out.packet_out.payload == frame
        port(switch, 2).inject(frame)  # packet-in goes to the primary only
        assert client.next("packet").payload == frame
        with pytest.raises(queue.Empty):
            backup.next("packet", timeout=0.3)
    finally:
        backup.close()


def test_digests_after_digest_entry(client: Client, names: Names, switch: Switch) -> None:
    frame = ipv4_frame("10.0.0.2", src_mac="00:00:00:00:0a:0b")
    port(switch, 1).inject(frame)  # digest not enabled: dropped, counted
    assert switch.server is not None
    assert switch.server.counters.digests_dropped == 1
    de = p4runtime_pb2.Entity()
    de.digest_entry.digest_id = names["learn_t"]
    de.digest_entry.config.max_list_size = 1
    client.write(upd(U.INSERT, de))
    assert (
        client.read(p4runtime_pb2.Entity(digest_entry=p4runtime_pb2.DigestEntry()))[
            0
        ].digest_entry.digest_id
        == names["learn_t"]
    )
    port(switch, 3).inject(frame)
    dl = client.next("digest")
    assert dl.digest_id == names["learn_t"] and dl.list_id >= 1
    members = [m.bitstring for m in dl.data[0].struct.members]
    assert members == [b"\x0a\x0b", b"\x03"]
    ack = p4runtime_pb2.StreamMessageRequest()
    ack.digest_ack.digest_id, ack.digest_ack.list_id = dl.digest_id, dl.list_id
    client.send(ack)


def test_digest_lists_batched_deduplicated_and_acked(
    client: Client, names: Names, switch: Switch
) -> None:
    """PI's DigestMgr over the stream: a list goes out full (max_list_size, counting distinct
    samples), a sample already sent is suppressed until its list is acked, a buffered sample
    goes out after max_timeout_ns, and a deleted config drops digests again."""
    assert switch.server is not None
    counters = switch.server.counters
    de = p4runtime_pb2.Entity()
    de.digest_entry.digest_id = names["learn_t"]
    de.digest_entry.config.max_list_size = 2
    de.digest_entry.config.max_timeout_ns = 3600 * 10**9
    de.digest_entry.config.ack_timeout_ns = 3600 * 10**9
    client.write(upd(U.INSERT, de))
    fa = ipv4_frame("10.0.0.2", src_mac="00:00:00:00:0a:0a")
    fb = ipv4_frame("10.0.0.2", src_mac="00:00:00:00:0b:0b")
    port(switch, 1).inject(fa)
    port(switch, 1).inject(fa)  # the same sample: suppressed, not counted toward the size
    _wait(lambda: counters.digests_suppressed == 1)
    with pytest.raises(queue.Empty):
        client.next("digest", timeout=0.3)  # one distinct sample: the list is not full
    port(switch, 1).inject(fb)
    dl = client.next("digest")
    assert dl.list_id == 1
    assert [[m.bitstring for m in d.struct.members] for d in dl.data] == [
        [b"\x0a\x0a", b"\x01"],
        [b"\x0b\x0b", b"\x01"],
    ]
    port(switch, 1).inject(fa)  # list 1 is not acked: still suppressed
    _wait(lambda: counters.digests_suppressed == 2)
    ack = p4runtime_pb2.StreamMessageRequest()
    ack.digest_ack.digest_id, ack.digest_ack.list_id = dl.digest_id, dl.list_id
    client.send(ack)
    de.digest_entry.config.max_timeout_ns = 100_000_000  # from now on: 100 ms
    client.write(upd(U.MODIFY, de))
    # the ack is handled on the stream's reader thread: resend until the sample goes out
    deadline = time.monotonic() + 10
    dl2 = None
    while dl2 is None and time.monotonic() < deadline:
        port(switch, 1).inject(fa)
        with contextlib.suppress(queue.Empty):
            dl2 = client.next("digest", timeout=0.5)
    assert dl2 is not None and dl2.list_id == 2
    assert [m.bitstring for m in dl2.data[0].struct.members] == [b"\x0a\x0a", b"\x01"]
    client.write(upd(U.DELETE, de))
    dropped = counters.digests_dropped
    port(switch, 1).inject(fb)
    _wait(lambda: counters.digests_dropped == dropped + 1)


def _wait(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_i2e_clone_through_session(client: Client, names: Names, switch: Switch) -> None:
    client.write(
        upd(U.INSERT, clone_entity(100, [(3, 0)])),
        upd(U.INSERT, lpm_entry(names, 0x0A000002, 32, 0xB2, 2)),
        upd(U.INSERT, acl_entry(names, 0x0A000002, 0xFFFFFFFF, "MyIngress.mirror", 1)),
    )
    frame = ipv4_frame("10.0.0.2")
    port(switch, 1).inject(frame)
    assert port(switch, 2).recv(5) is not None
    assert port(switch, 3).recv(5) == frame  # the clone carries the original bytes


def test_server_stop_closes_streams_promptly() -> None:
    import time

    sw = Switch(device_id=0, cpu_port=CPU, grpc_addr="127.0.0.1:0")
    sw.start()
    assert sw.server is not None
    c = Client(f"127.0.0.1:{sw.server.port}", election_id=1)
    try:
        assert c.next("arbitration").status.code == code_pb2.OK
        t0 = time.monotonic()
        sw.stop()
        assert time.monotonic() - t0 < 4
        assert c.next("arbitration", timeout=5) is None
    finally:
        c.close()
        sw.stop()
