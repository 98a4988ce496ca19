"""The switch glue with the real pipeline: lossless vs lossy egress queues behind a slow port,
pcap per port, drop reasons, and the command line with UDP loopback ports (frames in and out
over UDP, entries over P4Runtime, SIGTERM exits 0)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from p4.v1 import p4runtime_pb2
from scapy.layers.l2 import Ether

from shadowgrad.freeports import free_ports
from shadowgrad.p4target.dataplane import Exact, Lpm, Pipeline, TableEntry
from shadowgrad.p4target.pcap import read_pcap
from shadowgrad.p4target.ports import InProcessPort
from shadowgrad.p4target.process import wait_switch_ready
from shadowgrad.p4target.queues import QueueConfig
from shadowgrad.p4target.switch import PFC_DST, Switch
from shadowgrad.testing.processes import spawn_switch
from tests.test_p4rt_server import Client, Names, ipv4_frame, lpm_entry, upd

ROOT = Path(__file__).resolve().parents[1]
PROG = ROOT / "tests" / "p4progs" / "rt_l2l3.p4"


class SlowPort(InProcessPort):
    """A port that takes ``delay`` seconds per transmitted frame."""

    def __init__(self, number: int, delay: float) -> None:
        super().__init__(number)
        self.delay = delay

    def send(self, frame: bytes) -> None:
        time.sleep(self.delay)
        super().send(frame)


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return Pipeline.compile(PROG)


def route(sw: Switch, names: Names, dst: int, port: int) -> None:
    assert sw.dataplane is not None
    sw.dataplane.insert_entry(
        TableEntry(
            table_id=names["MyIngress.ipv4_lpm"],
            matches={1: Lpm(dst, 32)},
            action_id=names["MyIngress.ipv4_forward"],
            params={1: 0xB0 + port, 2: port},
        )
    )


def make_switch(pipeline: Pipeline, lossless: bool, tmp: Path | None = None) -> Switch:
    sw = Switch(device_id=0, cpu_port=255, pcap_dir=tmp)
    sw.add_port(InProcessPort(1))
    sw.add_port(SlowPort(2, 0.001), QueueConfig(capacity=16, pause_timeout_s=5, inline_tx=False))
    sw.load_pipeline(pipeline)
    sw.start()
    if lossless:
        sw.set_lossless(2)  # as the controller marks a shadow port
    assert sw.queues[2].config.lossless == lossless
    return sw


@pytest.mark.parametrize("lossless", [True, False])
def test_lossless_queue_pauses_ingress_lossy_queue_drops(
    pipeline: Pipeline, lossless: bool
) -> None:
    names = Names(pipeline.p4info)
    sw = make_switch(pipeline, lossless)
    try:
        route(sw, names, 0x0A000002, 2)
        n = 150
        p1 = sw.ports[1]
        assert isinstance(p1, InProcessPort)
        for i in range(n):
            p1.inject(ipv4_frame("10.0.0.2", src_mac=f"00:00:00:00:{i >> 8:02x}:{i & 255:02x}"))
        assert sw.drain(10)
        st = sw.queues[2].stats()
        p2 = sw.ports[2]
        assert isinstance(p2, InProcessPort)
        got = p2.recv_all(0.1)
        if lossless:
            assert len(got) == n and st.transmitted == n
            assert sum(st.drops.values()) == 0 and st.pause_events >= 1
            assert st.max_depth <= 16
            srcs = [f[6:12] for f in got]
            assert srcs == sorted(srcs)  # order kept
        else:
            assert st.drops["tail_drop"] > 0
            assert len(got) + st.drops["tail_drop"] == n
        c = sw.counters()
        assert c["queues"][2]["drops"]["tail_drop"] == st.drops["tail_drop"]
    finally:
        sw.stop()


def test_pfc_frames_out_of_the_paused_ingress_port(pipeline: Pipeline) -> None:
    names = Names(pipeline.p4info)
    sw = Switch(device_id=0, cpu_port=255, pfc=True)
    p1 = sw.add_port(InProcessPort(1))
    sw.add_port(
        SlowPort(2, 0.002),
        QueueConfig(capacity=4, lossless=True, pause_timeout_s=5, inline_tx=False),
    )
    sw.load_pipeline(pipeline)
    sw.start()
    try:
        assert isinstance(p1, InProcessPort)
        route(sw, names, 0x0A000002, 2)
        for _ in range(20):
            p1.inject(ipv4_frame("10.0.0.2"))
        assert sw.drain(5)
        back = p1.recv_all(0.1)
        assert back and all(f[:6] == PFC_DST and f[12:14] == b"\x88\x08" for f in back)
        assert len(back[0]) == 60 and back[0][14:16] == b"\x01\x01"
        assert back[0][18:20] == b"\xff\xff" and back[-1][18:34] == bytes(16)  # XOFF .. XON
        assert sw.pfc_sent[(1, "xoff")] == sw.pfc_sent[(1, "xon")] >= 1
        assert sum(sw.queues[2].stats().drops.values()) == 0
    finally:
        sw.stop()


def test_pcap_per_port_and_switch_drop_reasons(pipeline: Pipeline, tmp_path: Path) -> None:
    names = Names(pipeline.p4info)
    sw = Switch(device_id=0, cpu_port=255, pcap_dir=tmp_path)
    p1 = sw.add_port(InProcessPort(1, "h1-eth0"))
    sw.add_port(InProcessPort(2))
    sw.start()
    try:
        assert isinstance(p1, InProcessPort)
        frame = ipv4_frame("10.0.0.2")
        p1.inject(frame)  # no pipeline yet
        assert sw.drops["no_pipeline"] == 1
        sw.load_pipeline(pipeline)
        route(sw, names, 0x0A000002, 2)
        route(sw, names, 0x0A000007, 7)  # port 7 is not attached
        p1.inject(frame)
        p1.inject(ipv4_frame("10.0.0.7"))
        assert sw.drain(5)
        assert sw.drops["no_such_port"] == 1
        assert sw.dataplane is not None
        sw.dataplane.insert_entry(
            TableEntry(
                table_id=names["MyIngress.dmac"],
                matches={1: Exact(0xFFFFFFFFFFFF)},
                action_id=names["MyIngress.multicast"],
                params={1: 99},
            )
        )
        p1.inject(ipv4_frame("10.9.9.9", dst_mac="ff:ff:ff:ff:ff:ff"))  # group 99 unknown
        assert any(r == "mcast_group_unknown" for (_p, r) in sw.dataplane.drop_counts())
    finally:
        sw.stop()
    ins = [f for _, f in read_pcap(tmp_path / "h1-eth0_in.pcap")]
    outs = [f for _, f in read_pcap(tmp_path / "port2_out.pcap")]
    assert ins[:2] == [frame, frame] and len(ins) == 4
    assert len(outs) == 1 and outs[0][14 + 8] == 63  # TTL decremented


# ---- the command line with UDP loopback ports --------------------------------------------------
@pytest.fixture
def cli_switch(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, list[int]]]:
    sw1, sw2, peer1, peer2 = free_ports(4)
    p = spawn_switch(
        str(PROG),
        "--loopback-port",
        f"1@127.0.0.1:{sw1}=127.0.0.1:{peer1}",
        "--loopback-port",
        f"2@127.0.0.1:{sw2}=127.0.0.1:{peer2}",
        "--port-delay",
        "2:20ms",
        "--lossless-port",
        "2",
        "--pcap",
        str(tmp_path),
        "--log-console",
        "--thrift-port",
        "9090",
    )
    try:
        yield p, wait_switch_ready(p), [sw1, sw2, peer1, peer2]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def test_cli_udp_loopback_ports_end_to_end(
    cli_switch: tuple[subprocess.Popen[str], str, list[int]],
) -> None:
    proc, addr, (sw1, _sw2, peer1, peer2) = cli_switch
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client = None
    try:
        rx.bind(("127.0.0.1", peer2))
        rx.settimeout(5)
        tx.bind(("127.0.0.1", peer1))
        client = Client(addr, election_id=1)
        assert client.next("arbitration").status.code == 0
        req = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=0)
        names = Names(client.stub.GetForwardingPipelineConfig(req, timeout=10).config.p4info)
        client.write(upd(p4runtime_pb2.Update.INSERT, lpm_entry(names, 0x0A000002, 32, 0xB2, 2)))
        frame = ipv4_frame("10.0.0.2")
        t0 = time.monotonic()
        tx.sendto(frame, ("127.0.0.1", sw1))
        out, _ = rx.recvfrom(4096)
        assert time.monotonic() - t0 >= 0.018  # --port-delay 2:20ms
        assert out[:6] == bytes.fromhex("0000000000b2") and out[14 + 8] == 63
    finally:
        if client is not None:
            client.close()
        rx.close()
        tx.close()
    proc.send_signal(signal.SIGTERM)
    _o, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err[-2000:]
    assert "--thrift-port 9090 ignored" in err
    assert "tx port=2" in err  # --log-console packet events


def test_stop_leaves_no_threads_even_with_a_paused_producer(pipeline: Pipeline) -> None:
    import threading

    names = Names(pipeline.p4info)
    before = set(threading.enumerate())
    sw = Switch(device_id=0, cpu_port=255, grpc_addr="127.0.0.1:0")
    p1 = sw.add_port(InProcessPort(1))
    gate = threading.Event()

    class StuckPort(InProcessPort):
        def send(self, frame: bytes) -> None:
            gate.wait(120)  # released by the test; the bound only keeps a failed run finite

    sw.add_port(
        StuckPort(2), QueueConfig(capacity=1, lossless=True, pause_timeout_s=60, inline_tx=False)
    )
    sw.load_pipeline(pipeline)
    sw.start()
    assert sw.server is not None
    c = Client(f"127.0.0.1:{sw.server.port}", election_id=1)
    try:
        assert isinstance(p1, InProcessPort)
        route(sw, names, 0x0A000002, 2)
        producer = threading.Thread(
            target=lambda: [p1.inject(ipv4_frame("10.0.0.2")) for _ in range(5)]
        )
        producer.start()
        # the port's send is stuck until the gate opens, so the pause lasts: a slow machine only
        # delays when the loop sees it
        deadline = time.monotonic() + 30
        while not sw.queues[2].paused and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sw.queues[2].paused
        t0 = time.monotonic()
        sw.stop()  # wakes the paused producer (its frames count as "closed" drops)
        producer.join(5)
        stop_s = time.monotonic() - t0
    finally:
        gate.set()  # release the port's stuck send so its thread can end
        c.close()
        sw.stop()
    assert stop_s < 6 and not producer.is_alive()
    assert sw.queues[2].stats().drops["closed"] >= 1
    time.sleep(0.3)
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert left == []


def test_batch_delivery_equals_frame_by_frame() -> None:
    """A batch from an RX port (Switch._deliver_batch, one pipeline call) gives every egress
    port the same frames in the same order as delivering them one at a time."""
    pipe = Pipeline.compile(ROOT / "tests" / "p4progs" / "mcast.p4")
    mc = next(t for t in pipe.tables.values() if t.name.endswith(".mc"))
    flood = pipe.action_ids["McIngress.flood"]
    grp = pipe.actions[flood].params[0].id
    got: dict[str, dict[int, list[bytes]]] = {}
    batch = [
        bytes.fromhex(f"02000000000{1 + i % 2}")
        + bytes.fromhex("020000000009")
        + b"\x90\x00"
        + i.to_bytes(4, "big")
        + bytes(40)
        for i in range(40)
    ]
    for mode in ("single", "batch"):
        sw = Switch(device_id=0)
        for n in (1, 2, 3):
            sw.add_port(InProcessPort(n))
        dpl = sw.load_pipeline(pipe)
        dpl.insert_multicast_group(1, [(2, 1)])
        dpl.insert_multicast_group(2, [(2, 1), (3, 2)])
        for gid in (1, 2):
            dpl.insert_entry(
                TableEntry(mc.id, {mc.keys[0].id: Exact(0x020000000000 + gid)}, flood, {grp: gid})
            )
        sw.start()
        try:
            if mode == "single":
                for f in batch:
                    sw._deliver(1, f)
            else:
                sw._deliver_batch(1, batch)
            assert sw.drain(5)
            out: dict[int, list[bytes]] = {}
            for n in (2, 3):
                port = sw.ports[n]
                assert isinstance(port, InProcessPort)
                out[n] = port.recv_all()
            got[mode] = out
        finally:
            sw.stop()
    assert len(got["batch"][2]) == 40 and len(got["batch"][3]) == 20
    assert got["batch"] == got["single"]


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "general"])
def test_egress_sees_its_queue_depth(fast_path: bool) -> None:
    """enq_qdepth/deq_qdepth in egress = frames ahead in the egress port's queue, counting the
    earlier frames of the same RX batch; the P4 program marks ECN from 3 on (qdepth.p4)."""
    from scapy.layers.inet import IP

    from tests.test_p4_dataplane import Tag, frame

    pipe = Pipeline.compile(ROOT / "tests" / "p4progs" / "qdepth.p4")
    sw = Switch(device_id=0)
    sw.add_port(InProcessPort(1))
    # a 2 s delay holds every frame in port 2's queue while the next ones are processed
    sw.add_port(InProcessPort(2), QueueConfig(delay_s=2.0, inline_tx=False))
    dpl = sw.load_pipeline(pipe)
    if not fast_path:
        dpl._fast = None
    sw.start()
    try:
        frames = [frame(tag={"itype": 0, "flags": 9}, payload=bytes([i])) for i in range(10)]
        for f in frames[:5]:
            sw._deliver(1, f)
        sw._deliver_batch(1, frames[5:])
        assert sw.queues[2].depth == 10
        assert sw.drain(10)
        p2 = sw.ports[2]
        assert isinstance(p2, InProcessPort)
        got = [Ether(f) for f in p2.recv_all(0.1)]
    finally:
        sw.stop()
    assert [t[Tag].info for t in got] == list(range(10))
    assert [t[Tag].port for t in got] == list(range(10))
    assert all(t[Tag].flags == 0 and t[Tag].rid == 1 for t in got)
    assert [t[IP].tos & 3 for t in got] == [0, 0, 0] + [3] * 7
