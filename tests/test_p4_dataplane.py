"""Dataplane suite: small P4 programs, scapy frames in, expected frames out.

Every case talks to a *backend* through a name-based API (table/action/field names from the
P4Info, never ids), so the same cases run on

* ``inproc``: the project's target in-process (:class:`InProcessBackend`, always);
* ``bmv2``: real ``p4c`` + ``simple_switch_grpc`` (marker ``bmv2``), when both are on PATH,
  through ``shadowgrad.testing.bmv2.RealBmv2Backend`` (P4Runtime, veths in a netns);
* ``subprocess``: the same ``RealBmv2Backend`` against this project's ``shadowgrad-p4c`` +
  ``sg-switch-grpc`` binaries (markers ``netns``, ``slow``; root), which proves the backend.
"""

from __future__ import annotations

import shutil
import socket
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("scapy")
pytest.importorskip("p4")

from scapy.fields import ByteField, ShortField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers

from shadowgrad.p4target import Dataplane, Pipeline, TableEntry
from shadowgrad.p4target.dataplane import Exact, Lpm, OptionalMatch, Range, Ternary

PROGS = Path(__file__).resolve().parent / "p4progs"
CPU_PORT = 255
#: a table entry's match by field name, and an action's parameters by name
Match = dict[str, Any]
Params = dict[str, int] | None


class Tag(Packet):
    name = "Tag"
    fields_desc = [  # noqa: RUF012 (scapy's class attribute)
        ByteField("itype", 0),
        ByteField("rid", 0),
        ByteField("flags", 0),
        ByteField("port", 0),
        ShortField("info", 0),
    ]


bind_layers(UDP, Tag, dport=0x1234)


def frame(
    dst: str = "00:00:00:00:00:02",
    src: str = "00:00:00:00:00:01",
    ip_src: str = "10.0.0.1",
    ip_dst: str = "10.0.1.1",
    proto_udp: bool = True,
    dport: int = 0x1234,
    tag: dict[str, int] | None = None,
    payload: bytes = b"payload",
    **ip: Any,
) -> bytes:
    p = Ether(dst=dst, src=src) / IP(src=ip_src, dst=ip_dst, **ip)
    if proto_udp:
        p = p / UDP(sport=1000, dport=dport)
        if dport == 0x1234:
            p = p / Tag(**(tag or {}))
    return bytes(p / Raw(payload))


# ---------------------------------------------------------------------------- backends
class Backend:
    """Name-based switch driver used by every case (see module docstring)."""

    def load(self, prog: str) -> None: ...
    def insert(
        self, table: str, match: Match, action: str, params: Params = None, priority: int = 0
    ) -> None: ...
    def delete(self, table: str, match: Match, priority: int = 0) -> None: ...
    def set_default(self, table: str, action: str, params: Params = None) -> None: ...
    def mcast(self, gid: int, replicas: list[tuple[int, int]]) -> None: ...
    def clone_session(self, sid: int, replicas: list[tuple[int, int]]) -> None: ...
    def send(self, port: int, data: bytes) -> list[tuple[int, bytes]]: ...
    def counter(self, name: str, index: int) -> tuple[int, int]: ...
    def direct_counter(self, table: str, match: Match, priority: int = 0) -> tuple[int, int]: ...
    def packet_out(self, payload: bytes, **metadata: int) -> list[tuple[int, bytes]]: ...

    packet_ins: list[tuple[bytes, dict[str, int]]]
    digests: list[tuple[str, list[bytes]]]


class InProcessBackend(Backend):
    def __init__(self, fast_path: bool = True) -> None:
        self.fast_path = fast_path
        self.dp: Dataplane | None = None
        self.packet_ins = []
        self.digests = []

    def load(self, prog: str) -> None:
        self.pipe = Pipeline.compile(PROGS / prog)
        self.dp = Dataplane(self.pipe, cpu_port=CPU_PORT, fast_path=self.fast_path)
        assert self.dp.fast_path == (self.fast_path and self.pipe.fast_unsupported is None)
        self.dp.on_packet_in = self._pin
        self.dp.on_digest = self._digest
        self.info = self.pipe.p4info

    def _pin(self, payload: bytes, md: dict[int, int]) -> None:
        assert self.pipe.packet_in is not None
        names = {i: n for i, n, _ in self.pipe.packet_in.fields}
        self.packet_ins.append((payload, {names[k]: v for k, v in md.items()}))

    def _digest(self, did: int, members: list[bytes]) -> None:
        self.digests.append((self.pipe.digests[did].name, members))

    def _obj(self, kind: str, name: str) -> Any:
        for o in getattr(self.info, kind):
            if name in (o.preamble.name, o.preamble.alias):
                return o
        raise KeyError(name)

    def _entry(
        self, table: str, match: Match, action: str | None, params: Params, priority: int
    ) -> TableEntry:
        t = self._obj("tables", table)
        ms: dict[int, Any] = {}
        for mf in t.match_fields:
            if mf.name not in match:
                continue
            v = match[mf.name]
            kind = {2: Exact, 3: Lpm, 4: Ternary, 5: Range, 6: OptionalMatch}[mf.match_type]
            ms[mf.id] = kind(*v) if isinstance(v, tuple) else kind(v)
        aid = 0
        ps: dict[int, int] = {}
        if action is not None:
            a = self._obj("actions", action)
            aid = a.preamble.id
            pid = {p.name: p.id for p in a.params}
            ps = {pid[k]: v for k, v in (params or {}).items()}
        return TableEntry(t.preamble.id, ms, aid, ps, priority)

    def insert(
        self, table: str, match: Match, action: str, params: Params = None, priority: int = 0
    ) -> None:
        assert self.dp is not None
        self.dp.insert_entry(self._entry(table, match, action, params, priority))

    def delete(self, table: str, match: Match, priority: int = 0) -> None:
        assert self.dp is not None
        self.dp.delete_entry(self._entry(table, match, None, None, priority))

    def set_default(self, table: str, action: str, params: Params = None) -> None:
        assert self.dp is not None
        e = self._entry(table, {}, action, params, 0)
        self.dp.set_default(e.table_id, e.action_id, e.params)

    def mcast(self, gid: int, replicas: list[tuple[int, int]]) -> None:
        assert self.dp is not None
        self.dp.insert_multicast_group(gid, replicas)

    def clone_session(self, sid: int, replicas: list[tuple[int, int]]) -> None:
        assert self.dp is not None
        self.dp.insert_clone_session(sid, replicas)

    def send(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        assert self.dp is not None
        return self.dp.process(port, data)

    def counter(self, name: str, index: int) -> tuple[int, int]:
        assert self.dp is not None
        ((_i, b, p),) = self.dp.read_counter(self._obj("counters", name).preamble.id, index)
        return b, p

    def direct_counter(self, table: str, match: Match, priority: int = 0) -> tuple[int, int]:
        assert self.dp is not None
        want = self._entry(table, match, None, None, priority)
        for e in self.dp.read_entries(want.table_id):
            if e.matches == want.matches and e.priority == priority:
                assert e.counter_bytes is not None and e.counter_packets is not None
                return e.counter_bytes, e.counter_packets
        raise KeyError(match)

    def packet_out(self, payload: bytes, **metadata: int) -> list[tuple[int, bytes]]:
        assert self.dp is not None and self.pipe.packet_out is not None
        ids = {n: i for i, n, _ in self.pipe.packet_out.fields}
        return self.dp.packet_out(payload, {ids[k]: v for k, v in metadata.items()})


def _bmv2_available() -> bool:
    return bool(shutil.which("p4c") and shutil.which("simple_switch_grpc"))


def _own_tool(name: str) -> str:
    """A console script of this project, next to the interpreter running the tests."""
    return str(Path(sys.executable).parent / name)


@pytest.fixture(
    scope="module",
    params=[
        "inproc",  # the straight-line fast path wherever the program is covered
        "inproc-general",  # the same cases on the general path only
        pytest.param("bmv2", marks=pytest.mark.bmv2),
        # RealBmv2Backend against OUR target: shadowgrad-p4c + sg-switch-grpc as subprocesses,
        # veths in a netns, P4Runtime; proves the backend that the bmv2 run uses
        pytest.param("subprocess", marks=[pytest.mark.netns, pytest.mark.slow]),
    ],
)
def backend_kind(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One switch process per module and backend kind (started before any test's child-process
    snapshot); ``load()`` pushes a fresh pipeline, which resets all switch state per case."""
    if request.param in ("inproc", "inproc-general"):
        yield request.param == "inproc"
        return
    if request.param == "bmv2":
        if not _bmv2_available():
            pytest.skip("p4c and simple_switch_grpc are not both on PATH")
        p4c, switch = "p4c", "simple_switch_grpc"
    else:
        p4c, switch = _own_tool("shadowgrad-p4c"), _own_tool("sg-switch-grpc")
    try:
        from shadowgrad.testing.bmv2 import RealBmv2Backend
    except ImportError:
        pytest.skip("no P4Runtime-driven real-bmv2 backend (shadowgrad.testing.bmv2) yet")
    with RealBmv2Backend(p4c=p4c, switch=switch, prog_dir=PROGS, cpu_port=CPU_PORT) as b:
        yield b


@pytest.fixture
def sw(backend_kind: Any) -> Any:
    if isinstance(backend_kind, bool):
        return InProcessBackend(fast_path=backend_kind)
    return backend_kind


def only(outs: list[tuple[int, bytes]]) -> tuple[int, Ether]:
    assert len(outs) == 1, outs
    return outs[0][0], Ether(outs[0][1])


# ---------------------------------------------------------------------------- L2 / L3
def test_l2_exact_forwarding_and_counters(sw: Backend) -> None:
    sw.load("l2.p4")
    sw.insert("dmac", {"hdr.ethernet.dstAddr": 0x000000000002}, "fwd", {"port": 3})
    sw.insert("dmac", {"hdr.ethernet.dstAddr": 0x000000000099}, "drop")
    f = frame()
    port, out = only(sw.send(1, f))
    assert port == 3 and bytes(out) == f
    assert sw.send(2, frame(dst="00:00:00:00:00:99")) == []
    # a miss (default NoAction) leaves egress_spec untouched: unicast to port 0 (bmv2 trap)
    port, _ = only(sw.send(1, frame(dst="00:00:00:00:00:77")))
    assert port == 0
    assert sw.counter("port_counter", 1) == (2 * len(f), 2)
    assert sw.counter("port_counter", 2) == (len(f), 1)
    assert sw.direct_counter("dmac", {"hdr.ethernet.dstAddr": 2}) == (len(f), 1)
    assert sw.direct_counter("dmac", {"hdr.ethernet.dstAddr": 0x99}) == (len(f), 1)


def test_lpm_forwarding_ttl_and_checksum(sw: Backend) -> None:
    sw.load("basic.p4")
    sw.insert(
        "MyIngress.ipv4_lpm",
        {"hdr.ipv4.dstAddr": (0x0A000000, 8)},
        "ipv4_forward",
        {"dstAddr": 0xAA, "port": 1},
    )
    sw.insert(
        "MyIngress.ipv4_lpm",
        {"hdr.ipv4.dstAddr": (0x0A000100, 24)},
        "ipv4_forward",
        {"dstAddr": 0xBB, "port": 2},
    )
    port, out = only(sw.send(5, frame(ip_dst="10.0.1.7", ttl=64)))
    assert port == 2 and out.dst == "00:00:00:00:00:bb" and out.src == "00:00:00:00:00:02"
    assert out[IP].ttl == 63
    ref = out[IP].copy()
    del ref.chksum
    assert out[IP].chksum == IP(bytes(ref)).chksum  # updated IPv4 checksum
    port, out = only(sw.send(5, frame(ip_dst="10.9.9.9")))
    assert port == 1 and out.dst == "00:00:00:00:00:aa"
    assert sw.send(5, frame(ip_dst="192.168.0.1")) == []  # default drop()


# ---------------------------------------------------------------------------- multicast
def test_multicast_replicas_with_rid_rewrite(sw: Backend) -> None:
    sw.load("mcast.p4")
    sw.mcast(1, [(1, 11), (2, 12), (3, 13), (4, 14)])
    sw.insert("mc", {"hdr.ethernet.dstAddr": 0xFFFFFFFFFFFF}, "flood", {"grp": 1})
    outs = sw.send(1, frame(dst="ff:ff:ff:ff:ff:ff"))
    got = {
        (p, Ether(b)[Tag].rid, Ether(b)[Tag].itype, Ether(b)[Tag].port, Ether(b).dst)
        for p, b in outs
    }
    # copy back to ingress port 1 suppressed in egress; egress_spec=9 overridden by mcast
    assert got == {
        (2, 12, 5, 2, "ff:ff:ff:ff:ff:0c"),
        (3, 13, 5, 3, "ff:ff:ff:ff:ff:0d"),
        (4, 14, 5, 4, "ff:ff:ff:ff:ff:0e"),
    }


def test_multicast_unknown_group_and_mark_to_drop(sw: Backend) -> None:
    sw.load("mcast.p4")
    sw.mcast(1, [(2, 1), (3, 2)])
    sw.insert("mc", {"hdr.ethernet.dstAddr": 0x010000000001}, "flood", {"grp": 77})
    sw.insert("mc", {"hdr.ethernet.dstAddr": 0x010000000002}, "flood_then_drop", {"grp": 1})
    assert sw.send(1, frame(dst="01:00:00:00:00:01")) == []  # unprogrammed group: no copy
    assert sw.send(1, frame(dst="01:00:00:00:00:02")) == []  # mark_to_drop cleared mcast_grp


# ---------------------------------------------------------------------------- clones
def test_i2e_clone_sees_original_packet(sw: Backend) -> None:
    sw.load("clone.p4")
    sw.clone_session(5, [(3, 31), (4, 41)])
    f = frame(tag={"flags": 1})
    outs = sw.send(1, f)
    by_port = {p: Ether(b) for p, b in outs}
    assert sorted(by_port) == [2, 3, 4]
    n = by_port[2][Tag]
    assert (n.itype, n.info, n.port) == (0, 0xAAAA, 7)
    for p, rid in ((3, 31), (4, 41)):
        c = by_port[p][Tag]
        # I2E: pre-ingress bytes re-parsed, metadata reset except @field_list(1) (meta.mark)
        assert (c.itype, c.rid, c.info, c.port) == (1, rid, 0, 7)


def test_e2e_clone_sees_egress_changes(sw: Backend) -> None:
    sw.load("clone.p4")
    sw.clone_session(6, [(9, 3)])
    outs = sw.send(1, frame(tag={"flags": 2}))
    by_port = {p: Ether(b)[Tag] for p, b in outs}
    assert sorted(by_port) == [2, 9]
    assert (by_port[2].itype, by_port[2].info) == (0, 0xBBBB)
    e = by_port[9]
    assert (e.itype, e.rid, e.info) == (2, 3, 0xBBBB)
    assert e.port == 0  # metadata reset for the clone: meta.mark not preserved (plain clone)


def test_clone_to_missing_session_is_ignored(sw: Backend) -> None:
    sw.load("clone.p4")
    outs = sw.send(1, frame(tag={"flags": 3}))
    assert [p for p, _ in outs] == [2]


# ---------------------------------------------------------------------------- ACL
def test_ternary_acl_priorities(sw: Backend) -> None:
    sw.load("acl.p4")

    def from_src(addr: int, mask: int) -> Match:  # any destination port
        return {"hdr.ipv4.srcAddr": (addr, mask), "dport": (0, 0xFFFF)}

    sw.insert("acl", from_src(0x0A000000, 0xFF000000), "allow", {"port": 1}, priority=10)
    sw.insert("acl", from_src(0x0A000005, 0xFFFFFFFF), "allow", {"port": 2}, priority=20)
    sw.insert("acl", {"hdr.ipv4.protocol": (17, 0xFF), "dport": (5000, 5999)}, "deny", priority=30)
    assert only(sw.send(7, frame(ip_src="10.0.0.5")))[0] == 2
    assert only(sw.send(7, frame(ip_src="10.0.0.6")))[0] == 1
    assert sw.send(7, frame(ip_src="10.0.0.5", dport=5500)) == []
    assert sw.send(7, frame(ip_src="11.0.0.5")) == []  # default deny
    sw.delete("acl", from_src(0x0A000005, 0xFFFFFFFF), priority=20)
    assert only(sw.send(7, frame(ip_src="10.0.0.5")))[0] == 1


def test_const_entries_source_order_is_priority(sw: Backend) -> None:
    sw.load("acl.p4")
    sw.set_default("acl", "allow", {"port": 4})
    _, out = only(sw.send(1, frame(dport=53)))
    assert out[IP].tos == 2
    _, out = only(sw.send(1, frame()))
    assert out[IP].tos == 1
    _, out = only(sw.send(1, frame(proto_udp=False)))
    assert out[IP].tos == 3


# ---------------------------------------------------------------------------- parser/deparser
def test_parser_errors_reach_ingress(sw: Backend) -> None:
    sw.load("parser_error.p4")
    ok = frame()
    assert only(sw.send(9, ok))[0] == 1
    short = bytes(Ether(dst="00:00:00:00:00:02") / Raw(b"\x45\x00\x00"))
    short = short[:12] + b"\x08\x00" + short[14:]
    port, out = only(sw.send(9, short))
    assert port == 2 and bytes(out) == short  # ethernet kept, rest is payload
    bad = bytearray(frame())
    bad[14] = 0x65  # IP version 6 in an IPv4 ethertype
    port, out = only(sw.send(9, bytes(bad)))
    assert port == 4 and bytes(out) == bytes(bad)
    nomatch = bytes(Ether(src="00:00:00:00:00:02", type=0x9001) / Raw(b"\x10" * 20))
    assert only(sw.send(9, nomatch))[0] == 3
    match = bytes(Ether(src="00:00:00:00:00:01", type=0x90AB) / Raw(b"\x10" * 20))
    assert only(sw.send(9, match))[0] == 1
    high = bytes(Ether(src="00:00:00:00:00:01", type=0x90AB) / Raw(b"\x90" * 20))
    assert only(sw.send(9, high))[0] == 3


def test_deparser_skips_invalid_headers(sw: Backend) -> None:
    sw.load("deparse.p4")
    f = frame(tag={"flags": 1}, payload=b"PAYLOAD")
    _, out = only(sw.send(1, f))
    raw = bytes(out)
    assert len(raw) == len(f) - 6  # tag (6 bytes) removed, payload kept
    assert raw.endswith(b"PAYLOAD") and raw[:42] == f[:42]
    f2 = frame(tag={"flags": 2})
    _, out = only(sw.send(1, f2))
    raw = bytes(out)
    assert raw[12:14] == b"\x88\xb5" and raw[14:18] == b"\x01\x5a\x08\x00"
    assert raw[18:] == f2[14:]


# ---------------------------------------------------------------------------- CPU port
def test_packet_in_and_out(sw: Backend) -> None:
    sw.load("pktio.p4")
    lldp = bytes(Ether(dst="01:80:c2:00:00:0e", type=0x88CC) / Raw(b"lldp-ish"))
    assert sw.send(7, lldp) == []
    assert sw.packet_ins == [(lldp, {"ingress_port": 7, "_pad": 0})]
    f = frame()
    outs = sw.packet_out(f, egress_port=5)
    assert outs == [(5, f)]


def test_digest(sw: Backend) -> None:
    sw.load("pktio.p4")
    sw.send(3, frame(src="00:00:00:00:12:34"))
    assert sw.digests == [("learn_t", [bytes.fromhex("000000001234"), b"\x00\x03"])]


# ---------------------------------------------------------------------------- semantics
def _misc(sw: Backend, itype: int, flags: int = 0, **kw: Any) -> Ether:
    return only(sw.send(1, frame(tag={"itype": itype, "flags": flags}, **kw)))[1]


def test_expression_semantics(sw: Backend) -> None:
    sw.load("misc.p4")
    sw.insert("sel", {"hdr.tag.flags": 1}, "a_one")
    sw.insert("sel", {"hdr.tag.flags": 2}, "a_two", {"v": 0x4242})
    t = _misc(sw, 1)
    assert (t[Tag].port, t[UDP].chksum, t[Tag].info, t[Tag].rid) == (4, 0xFFFE, 2, 0x33)
    t = _misc(sw, 2, flags=1, ip_src="172.16.0.1")
    assert (t[Tag].port, t[Tag].info, t[UDP].chksum, t[Tag].rid) == (0xFA, 0xAC02, 0xFFFE, 0x11)
    t = _misc(sw, 0, flags=2)
    assert (t[Tag].info, t[Tag].rid) == (0x4242, 0x22)


def test_registers_and_hash() -> None:
    b = InProcessBackend()
    b.load("misc.p4")
    assert [_misc(b, 3)[Tag].info for _ in range(3)] == [1, 2, 3]
    assert b.dp is not None
    rid = b._obj("registers", "seen").preamble.id
    assert b.dp.read_register(rid, 2) == [(2, 3)]
    t = _misc(b, 4, ip_src="10.0.0.1", ip_dst="10.0.1.1")
    data = bytes([10, 0, 0, 1, 10, 0, 1, 1])
    assert t[Tag].info == _crc16_arc(data)
    assert t[UDP].chksum == 100 + zlib.crc32(bytes([10, 0, 0, 1])) % 50


def _probe_frame(hops: int, marker: int, **kw: Any) -> bytes:
    """``frame(**kw)`` with a probe header (etherType 0x88b5) between Ethernet and IPv4."""
    f = frame(**kw)
    return f[:12] + b"\x88\xb5" + bytes([hops, marker]) + b"\x08\x00" + f[14:]


def _unprobe(outs: list[tuple[int, bytes]]) -> Ether:
    """The one output frame, its probe header (checked to be there) taken out."""
    assert len(outs) == 1, outs
    f = outs[0][1]
    assert f[12:14] == b"\x88\xb5", f.hex()
    return Ether(f[:12] + f[16:18] + f[18:])


def test_hash_inputs_as_bmv2_serialises_them(sw: Backend) -> None:
    sw.load("hashes.p4")
    # identity keeps the first 8 of the 12 bytes: srcPort ++ dstPort ++ srcAddr
    t = _misc(sw, 1, ip_src="10.9.8.7")
    assert t[IP].dst == "10.9.8.7"
    # fields of the invalid probe header are left out of the data
    src = bytes([10, 0, 0, 1])
    t = _misc(sw, 2)
    assert t[Tag].info == _crc16_arc(src)
    assert int.from_bytes(socket.inet_aton(t[IP].dst), "big") == zlib.crc32(bytes([64, 0]))
    # ... and counted when it is valid
    out = _unprobe(sw.send(1, _probe_frame(0xAB, 0xCD, tag={"itype": 2})))
    assert out[Tag].info == _crc16_arc(b"\xab" + src + b"\xcd")
    assert int.from_bytes(socket.inet_aton(out[IP].dst), "big") == zlib.crc32(bytes([64, 0xAB, 0]))
    # max 0 is taken as 1: the result is the base
    assert _misc(sw, 4)[Tag].info == 7


def test_checksum_leaves_out_fields_of_invalid_headers(sw: Backend) -> None:
    sw.load("hashes.p4")
    src = bytes([10, 0, 0, 1])
    t = _misc(sw, 3)
    assert t[UDP].chksum == _csum16(bytes([3, 0]) + src)
    out = _unprobe(sw.send(1, _probe_frame(0x12, 0x34, tag={"itype": 3})))
    assert out[UDP].chksum == _csum16(bytes([0x12, 3, 0]) + src)


def _csum16(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def test_queueing_fields_of_a_lone_packet(sw: Backend) -> None:
    # nothing queued: depth 0 in egress (and 0 in ingress), a timestamp, no ECN mark
    sw.load("qdepth.p4")
    port, t = only(sw.send(1, frame(tag={"itype": 0, "flags": 9})))
    assert port == 2
    assert (t[Tag].flags, t[Tag].info, t[Tag].port, t[Tag].rid) == (0, 0, 0, 1)
    assert t[IP].tos & 3 == 0


def test_exit_and_untagged(sw: Backend) -> None:
    sw.load("misc.p4")
    f = frame(proto_udp=False)
    assert only(sw.send(1, f))[1] == Ether(f)
    t = _misc(sw, 6, flags=0)
    assert t[Tag].port == 0
    t = _misc(sw, 6, flags=1)
    assert t[Tag].port == 0x66


def _crc16_arc(data: bytes) -> int:
    c = 0
    for x in data:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ 0xA001 if c & 1 else c >> 1
    return c


def test_resubmit_recirculate_truncate(sw: Backend) -> None:
    sw.load("recirc.p4")
    port, out = only(sw.send(1, frame(tag={"flags": 1})))
    t = out[Tag]
    assert (port, t.itype, t.port, t.rid, t.info) == (3, 6, 9, 0, 0)
    port, out = only(sw.send(1, frame(tag={"flags": 2})))
    t = out[Tag]
    assert (port, t.itype, t.port, t.info) == (3, 4, 5, 0xBEEF)
    port, out = only(sw.send(1, frame(tag={"flags": 3})))
    assert len(bytes(out)) == 20


def test_types_copies_and_signed_values(sw: Backend) -> None:
    sw.load("types.p4")
    _, out = only(sw.send(1, frame(tag={"flags": 1, "info": 0x3456})))
    t = out[Tag]
    assert (t.itype, t.rid, t.flags, t.port, t.info) == (0xFE, 0x56, 0xFF, 4, 0x1111)
    assert out[UDP].chksum == 0xFFFE


def test_sub_control_copy_in_out_return_exit(sw: Backend) -> None:
    sw.load("subctl.p4")
    sw.insert("SubIngress.classify.by_proto", {"proto": 17}, "set_port", {"p": 6})
    sw.insert("SubIngress.classify.by_proto", {"proto": 2}, "set_port", {"p": 7})
    port, out = only(sw.send(1, frame(ttl=9)))  # UDP: table sets the inout port
    assert (port, out[IP].ttl, out[IP].tos) == (6, 8, 0x77)
    port, out = only(sw.send(1, frame(proto_udp=False, proto=1, ttl=9)))  # return
    assert (port, out[IP].ttl, out[IP].tos) == (1, 9, 0x77)
    # exit ends the whole ingress: the copy-out of 'port' still happens, egress_spec is not set
    port, out = only(sw.send(1, frame(proto_udp=False, proto=2, ttl=9)))
    assert (port, out[IP].ttl, out[IP].tos) == (0, 1, 0)


def test_verify_checksum_flags_but_does_not_drop(sw: Backend) -> None:
    sw.load("csum.p4")
    good = frame(ttl=5)
    port, out = only(sw.send(1, good))
    assert port == 1 and out[IP].ttl == 4
    ref = out[IP].copy()
    del ref.chksum
    assert out[IP].chksum == IP(bytes(ref)).chksum
    bad = bytearray(good)
    bad[24] ^= 0xFF  # corrupt the IPv4 checksum
    port, out = only(sw.send(1, bytes(bad)))
    assert port == 2 and out[IP].chksum == IP(bytes(ref)).chksum  # recomputed on the way out
