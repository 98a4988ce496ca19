"""Egress queues (rate, delay, loss, lossless pause), pcap writer, UDP/in-process ports, port
specs and the switch command line's argument parsing. No dataplane needed."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from shadowgrad.p4target import _switch_cmd as cmd
from shadowgrad.p4target.pcap import PcapWriter, read_pcap
from shadowgrad.p4target.ports import (
    InProcessPort,
    UdpPort,
    parse_iface_spec,
    parse_loopback_spec,
)
from shadowgrad.p4target.queues import EgressQueue, QueueConfig


class Sink:
    def __init__(self, delay: float = 0.0) -> None:
        self.frames: list[bytes] = []
        self.times: list[float] = []
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, frame: bytes) -> None:
        self.gate.wait(10)
        if self.delay:
            time.sleep(self.delay)
        self.frames.append(frame)
        self.times.append(time.monotonic())


def frames(n: int, size: int = 100) -> list[bytes]:
    return [i.to_bytes(4, "big") + bytes(size - 4) for i in range(n)]


# ---- pcap ------------------------------------------------------------------------------------
def test_pcap_round_trip_and_scapy_reads_it(tmp_path: Path) -> None:
    p = tmp_path / "x.pcap"
    with PcapWriter(p) as w:
        w.write(b"\x01" * 60, ts=1000.25)
        w.write(b"\x02" * 70000, ts=1001.0)  # truncated to snaplen
    got = list(read_pcap(p))
    assert [len(f) for _, f in got] == [60, 65535]
    assert got[0][0] == pytest.approx(1000.25)
    from scapy.utils import rdpcap

    pkts = rdpcap(str(p))
    assert len(pkts) == 2 and bytes(pkts[0]) == b"\x01" * 60


# ---- queues ----------------------------------------------------------------------------------
def test_lossy_queue_tail_drops_and_counts() -> None:
    sink = Sink()
    sink.gate.clear()
    q = EgressQueue(1, sink, QueueConfig(capacity=4, inline_tx=False))
    try:
        results = [q.put(f) for f in frames(10)]
        # the TX thread may have taken one frame out before blocking on the gate
        assert results.count(True) in (4, 5)
        st = q.stats()
        assert st.drops["tail_drop"] == 10 - results.count(True)
        sink.gate.set()
        assert q.drain(2)
        assert q.stats().transmitted == results.count(True)
        assert [f[:4] for f in sink.frames] == [
            f[:4] for f, ok in zip(frames(10), results, strict=True) if ok
        ]
    finally:
        q.close()


def test_rate_paces_frames() -> None:
    sink = Sink()
    # 1000-byte frames at 400 kbit/s = 20 ms each; burst 1000 B lets one go at once
    q = EgressQueue(1, sink, QueueConfig(rate_bps=400_000, burst_bytes=1000))
    try:
        t0 = time.monotonic()
        for f in frames(6, 1000):
            assert q.put(f)
        assert q.drain(5)
        elapsed = time.monotonic() - t0
        assert 0.08 <= elapsed < 2.0, elapsed
    finally:
        q.close()


def test_delay_is_added_and_order_kept() -> None:
    sink = Sink()
    q = EgressQueue(1, sink, QueueConfig(delay_s=0.05))
    try:
        t0 = time.monotonic()
        for f in frames(5):
            q.put(f)
        assert q.drain(2)
        assert sink.times[0] - t0 >= 0.045
        assert [int.from_bytes(f[:4], "big") for f in sink.frames] == list(range(5))
    finally:
        q.close()


def test_loss_is_seeded_and_counted() -> None:
    def run() -> tuple[list[bytes], int]:
        sink = Sink()
        q = EgressQueue(1, sink, QueueConfig(loss=0.3, seed=7, capacity=1000))
        try:
            for f in frames(200):
                q.put(f)
            assert q.drain(2)
            return sink.frames, q.stats().drops["emulated_loss"]
        finally:
            q.close()

    a, lost_a = run()
    b, lost_b = run()
    assert a == b and lost_a == lost_b
    assert len(a) + lost_a == 200 and 30 < lost_a < 90


def test_lossless_queue_pauses_producer_and_never_drops() -> None:
    sink = Sink(delay=0.002)  # a slow port: ~500 frames/s
    pauses: list[bool] = []
    q = EgressQueue(
        1,
        sink,
        QueueConfig(capacity=8, lossless=True, pause_timeout_s=5, inline_tx=False),
        on_pause=lambda _p, paused: pauses.append(paused),
    )
    try:
        t0 = time.monotonic()
        assert all(q.put(f) for f in frames(60))
        produce_s = time.monotonic() - t0
        assert q.drain(5)
        st = q.stats()
        assert st.transmitted == 60 and sum(st.drops.values()) == 0
        assert st.max_depth <= 8
        assert st.pause_events >= 1 and st.paused_s > 0
        assert pauses[:2] == [True, False]
        assert produce_s > 0.05  # the producer was held back
        assert [int.from_bytes(f[:4], "big") for f in sink.frames] == list(range(60))
    finally:
        q.close()


def test_lossless_pause_timeout_admits_into_headroom_then_overflows() -> None:
    sink = Sink()
    sink.gate.clear()  # egress stuck
    q = EgressQueue(
        1,
        sink,
        QueueConfig(capacity=2, lossless=True, pause_timeout_s=0.02, inline_tx=False, headroom=2),
    )
    try:
        ok = [q.put(f) for f in frames(7)]
        st = q.stats()
        assert st.headroom_admits >= 2
        assert st.drops["tail_drop"] == 0
        assert st.drops["lossless_overflow"] == ok.count(False) >= 1
    finally:
        sink.gate.set()
        q.close()


def test_transmit_errors_are_counted() -> None:
    def bad(_f: bytes) -> None:
        raise OSError("down")

    q = EgressQueue(1, bad)
    try:
        q.put(b"x" * 60)
        assert q.drain(2)
        assert q.stats().drops["tx_error"] == 1
    finally:
        q.close()


def test_put_many_inline_queued_and_closed() -> None:
    # inline (idle, unshaped): sent on this thread, in order, counted once each
    sent: list[bytes] = []
    q = EgressQueue(1, sent.append)
    try:
        assert q.put_many(frames(5)) == 5
        assert sent == frames(5)
        st = q.stats()
        assert (st.enqueued, st.transmitted, st.tx_bytes) == (5, 5, 500)
    finally:
        q.close()
    # not inline (a TX thread and a capacity): frames beyond capacity tail-drop, order kept
    sink = Sink()
    sink.gate.clear()
    q = EgressQueue(1, sink, QueueConfig(capacity=4, inline_tx=False))
    try:
        n = q.put_many(frames(10))
        assert n in (4, 5) and q.stats().drops["tail_drop"] == 10 - n
        sink.gate.set()
        assert q.drain(2)
        assert [f[:4] for f in sink.frames] == [f[:4] for f in frames(n)]
    finally:
        q.close()
    assert q.put_many(frames(2)) == 0 and q.stats().drops["closed"] == 2
    # with the port's send_many: one call per batch; what it did not send counts as tx_error
    calls: list[list[bytes]] = []

    def many(fs: Sequence[bytes]) -> tuple[int, int]:
        calls.append(list(fs))
        ok = [f for f in fs if f[3] != 3]  # frame 3 "fails"
        return len(ok), sum(len(f) for f in ok)

    q = EgressQueue(1, sent.append, transmit_many=many)
    try:
        assert q.put_many(frames(5)) == 5 and calls == [frames(5)]
        st = q.stats()
        assert (st.transmitted, st.tx_bytes, st.drops["tx_error"]) == (4, 400, 1)
    finally:
        q.close()


# ---- ports -----------------------------------------------------------------------------------
def test_udp_port_round_trip() -> None:
    got: list[tuple[int, bytes]] = []
    ev = threading.Event()

    def deliver(n: int, f: bytes) -> None:
        got.append((n, f))
        ev.set()

    port = UdpPort(3, "127.0.0.1", 0)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.settimeout(2)
    try:
        port.start(deliver)
        frame = b"\xff" * 6 + b"\x02" * 6 + b"\x08\x00" + b"hello"
        peer.sendto(frame, port.address)
        assert ev.wait(2)
        assert got == [(3, frame)]
        port.send(b"reply-frame")  # goes to the learned peer
        assert peer.recvfrom(100)[0] == b"reply-frame"
        assert port.counters()["rx_packets"] == 1 and port.counters()["tx_packets"] == 1
    finally:
        port.close()
        peer.close()


def test_udp_port_without_peer_counts_drop() -> None:
    port = UdpPort(4, "127.0.0.1", 0)
    try:
        with pytest.raises(ConnectionError):
            port.send(b"x")
        assert port.counters()["no_peer_drops"] == 1
    finally:
        port.close()


def test_in_process_port() -> None:
    seen: list[tuple[int, bytes]] = []
    p = InProcessPort(2)
    p.start(lambda n, f: seen.append((n, f)))
    p.inject(b"abc")
    p.send(b"out")
    assert seen == [(2, b"abc")]
    assert p.recv(0.1) == b"out" and p.recv(0.01) is None


def test_port_specs() -> None:
    assert parse_iface_spec("1@s1-eth1").iface == "s1-eth1"
    s = parse_loopback_spec("3@127.0.0.1:40003=127.0.0.1:50003")
    assert (s.number, s.host, s.udp_port, s.peer) == (3, "127.0.0.1", 40003, ("127.0.0.1", 50003))
    assert parse_loopback_spec("4@:0").host == "127.0.0.1"
    for bad in ("s1-eth1", "511@x", "x@eth0", "1@"):
        with pytest.raises(ValueError):
            parse_iface_spec(bad)
    for bad in ("1@host", "1@h:99999", "1@h:1=peer", "x@h:1"):
        with pytest.raises(ValueError):
            parse_loopback_spec(bad)


# ---- command line ----------------------------------------------------------------------------
def test_cli_accepts_simple_switch_grpc_argv() -> None:
    args, targs = cmd.parse_args(
        [
            "--no-p4",
            "-i",
            "1@s1-eth1",
            "-i",
            "2@s1-eth2",
            "--device-id",
            "0",
            "--thrift-port",
            "9090",
            "--log-console",
            "-L",
            "debug",
            "--pcap",
            "/tmp/pcaps",
            "--",
            "--grpc-server-addr",
            "0.0.0.0:50051",
            "--cpu-port",
            "255",
        ]
    )
    assert args.no_p4 and args.interface == ["1@s1-eth1", "2@s1-eth2"]
    assert args.thrift_port == 9090 and args.log_level == "debug" and args.pcap == "/tmp/pcaps"
    assert targs.grpc_server_addr == "0.0.0.0:50051" and targs.cpu_port == 255
    assert targs.drop_port == 511
    args, _ = cmd.parse_args(["prog.p4", "--port-rate", "1:100m", "--lossless-port", "2"])
    assert args.program == "prog.p4" and args.lossless_port == [2]


def test_cli_rejects_bad_target_options() -> None:
    with pytest.raises(SystemExit):
        cmd.parse_args(["--no-p4", "--", "--cpu-port", "511"])
    with pytest.raises(SystemExit):
        cmd.parse_args(["--no-p4", "x.p4"])


def test_units() -> None:
    assert cmd.parse_rate("100m") == 100e6
    assert cmd.parse_rate("1.5gbit") == 1.5e9
    assert cmd.parse_rate("64kbps") == 64e3
    assert cmd.parse_duration("5ms") == pytest.approx(0.005)
    assert cmd.parse_duration("200us") == pytest.approx(2e-4)
    assert cmd.parse_duration("2") == 2.0
    with pytest.raises(ValueError):
        cmd.parse_rate("fast")
    with pytest.raises(ValueError):
        cmd.parse_duration("5 parsecs")


def test_cli_errors_exit_2_without_traceback() -> None:
    r = subprocess.run(
        [
            str(Path(__file__).resolve().parents[1] / ".venv/bin/python"),
            "-m",
            "shadowgrad.p4target._switch_cmd",
            "--no-p4",
            "--port-rate",
            "9:1m",
            "--",
            "--grpc-server-addr",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "unattached port" in r.stderr and "Traceback" not in r.stderr


def test_reconfigure_to_lossless_at_run_time() -> None:
    sink = Sink(delay=0.001)
    q = EgressQueue(1, sink, QueueConfig(capacity=4, inline_tx=False))
    try:
        q.reconfigure(QueueConfig(capacity=4, lossless=True, pause_timeout_s=5, inline_tx=False))
        assert all(q.put(f) for f in frames(40))
        assert q.drain(5)
        assert q.stats().transmitted == 40 and sum(q.stats().drops.values()) == 0
        q.reconfigure(QueueConfig(capacity=4, loss=0.5, seed=1))
        for f in frames(40):
            q.put(f)
        assert q.drain(5)
        assert q.stats().drops["emulated_loss"] > 0
    finally:
        q.close()


def test_inline_fast_path_keeps_fifo_with_concurrent_producers() -> None:
    sink = Sink()
    q = EgressQueue(1, sink, QueueConfig())
    try:

        def produce(base: int) -> None:
            for i in range(500):
                q.put((base + i).to_bytes(4, "big"))

        ts = [threading.Thread(target=produce, args=(k * 1000,)) for k in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(10)
        assert q.drain(5)
        got = [int.from_bytes(f, "big") for f in sink.frames]
        assert len(got) == 1500 and q.stats().transmitted == 1500
        for k in range(3):  # each producer's frames stay in order
            mine = [g for g in got if g // 1000 == k]
            assert mine == sorted(mine) and len(mine) == 500
    finally:
        q.close()
