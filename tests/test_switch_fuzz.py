"""Fuzz a *running* target: 100,000 random and mutated frames, then a valid frame still
forwards correctly and the counters account for every frame.

* ``test_inprocess_switch_fuzz_100k``: a :class:`Switch` (ports, egress queues, dataplane)
  with in-process ports running ``l2.p4``; the accounting is exact:
  frames sent == port rx == dataplane rx == forwarded + dropped-by-reason, and the per-port
  outputs agree with an independent oracle (the destination MAC of every frame).
* ``test_sg_switch_grpc_fuzz_over_udp``: ``sg-switch-grpc`` as a subprocess with UDP loopback
  ports (``--loopback-port``), programmed over P4Runtime; accounted with the program's own
  counters read over P4Runtime (indexed per-port counter, direct counters per entry), the frames
  that came out of the UDP ports, and the kernel's UDP drop counters (``/proc/net/snmp``
  ``RcvbufErrors``, allowed for but kept at zero by pacing: after every batch a marker frame
  is sent and awaited).

Seeds are valid frames of the dataplane test programs; mutations are bit flips, byte
overwrites, truncation, extension and wholly random frames (0..200 bytes, and a few jumbo ones).
"""

from __future__ import annotations

import random
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("p4")

from p4.v1 import p4runtime_pb2

from shadowgrad.controller.p4runtime import P4RuntimeClient
from shadowgrad.freeports import free_port
from shadowgrad.p4target.dataplane import Exact, Pipeline, TableEntry
from shadowgrad.p4target.ports import InProcessPort
from shadowgrad.p4target.process import stop_process
from shadowgrad.p4target.switch import Switch
from shadowgrad.testing.processes import switch_argv

PROGS = Path(__file__).resolve().parent / "p4progs"
N_FRAMES = 100_000
DST_FWD, DST_DROP, DST_NOPORT = 0x000000000002, 0x000000000099, 0x000000000007
FWD_PORT, NOPORT = 3, 7  # port 7 is not attached: the switch drops as no_such_port
U = p4runtime_pb2.Update


def _mac(v: int) -> bytes:
    return v.to_bytes(6, "big")


def _csum(b: bytes) -> int:
    s: int = sum(struct.unpack(f"!{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def _ipv4_udp(dst: int, payload: bytes, dport: int = 0x1234, ttl: int = 64) -> bytes:
    udp = struct.pack("!HHHH", 1000, dport, 8 + len(payload), 0) + payload
    ip = bytearray(
        struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            20 + len(udp),
            1,
            0,
            ttl,
            17,
            0,
            bytes([10, 0, 0, 1]),
            bytes([10, 0, 1, 1]),
        )
    )
    ip[10:12] = _csum(bytes(ip)).to_bytes(2, "big")
    return _mac(dst) + _mac(1) + b"\x08\x00" + bytes(ip) + udp


def seed_frames() -> list[bytes]:
    """Valid frames as the dataplane test programs expect them."""
    tag = bytes([0, 0, 1, 0, 0, 0])
    out = []
    for dst in (DST_FWD, DST_DROP, DST_NOPORT, 0x77, 0xFFFFFFFFFFFF):
        out.append(_ipv4_udp(dst, tag + b"payload"))
        out.append(_ipv4_udp(dst, b"x" * 64, dport=53))
    out.append(
        _mac(DST_FWD) + _mac(2) + b"\x88\xb5" + b"\x01\x5a\x08\x00" + _ipv4_udp(DST_FWD, tag)[14:]
    )  # probe header
    out.append(bytes.fromhex("0180c200000e") + _mac(5) + b"\x88\xcc" + b"lldp-ish")
    out.append(_mac(DST_FWD) + _mac(1) + b"\x90\xab" + b"\x10" * 20)
    out.append(_mac(DST_FWD) + _mac(1) + b"\x08\x00" + b"\x45\x00\x00")  # short IPv4
    return out


def fuzz_frames(n: int, seed: int = 1) -> Iterator[bytes]:
    rng = random.Random(seed)
    seeds = seed_frames()
    for _ in range(n):
        kind = rng.randrange(10)
        if kind == 0:  # random bytes
            yield rng.randbytes(rng.randrange(0, 200))
            continue
        b = bytearray(rng.choice(seeds))
        if kind <= 3:  # bit flips
            for _ in range(rng.randrange(1, 9)):
                i = rng.randrange(len(b) * 8)
                b[i // 8] ^= 1 << (i % 8)
        elif kind <= 5:  # byte overwrites in the header region
            for _ in range(rng.randrange(1, 6)):
                b[rng.randrange(min(len(b), 60))] = rng.getrandbits(8)
        elif kind == 6:  # truncation
            del b[rng.randrange(len(b) + 1) :]
        elif kind == 7:  # extension (now and then jumbo)
            b += rng.randbytes(rng.randrange(1, 9000 if rng.random() < 0.01 else 1500))
        elif kind == 8:  # truncate, then flip
            del b[rng.randrange(1, len(b) + 1) :]
            b[rng.randrange(len(b))] ^= 0xFF
        # kind 9: the valid seed itself
        yield bytes(b)


def expected_port(frame: bytes) -> int | None:
    """The l2.p4 oracle with the entries below: egress port, or None for a drop."""
    dst = int.from_bytes(frame[:6], "big") if len(frame) >= 14 else -1
    if dst == DST_FWD:
        return FWD_PORT
    if dst in (DST_DROP, DST_NOPORT):
        return None
    return 0  # a miss leaves egress_spec at 0 (also when ethernet did not parse)


# ----------------------------------------------------------------------------- in-process
def test_inprocess_switch_fuzz_100k() -> None:
    pipe = Pipeline.compile(PROGS / "l2.p4")
    names = {t.preamble.name: t for t in pipe.p4info.tables}
    acts = {a.preamble.name: a for a in pipe.p4info.actions}
    dmac = next(t for n, t in names.items() if n.endswith("dmac"))
    fid = dmac.match_fields[0].id
    fwd = next(a for n, a in acts.items() if n.endswith(".fwd"))
    drop = next(a for n, a in acts.items() if n.endswith(".drop"))
    ports = {n: InProcessPort(n) for n in (0, 1, 2, 3)}
    sw = Switch(cpu_port=255)
    for p in ports.values():
        sw.add_port(p)
    dpl = sw.load_pipeline(pipe)
    pid = fwd.params[0].id
    dpl.insert_entry(
        TableEntry(dmac.preamble.id, {fid: Exact(DST_FWD)}, fwd.preamble.id, {pid: FWD_PORT})
    )
    dpl.insert_entry(
        TableEntry(dmac.preamble.id, {fid: Exact(DST_NOPORT)}, fwd.preamble.id, {pid: NOPORT})
    )
    dpl.insert_entry(TableEntry(dmac.preamble.id, {fid: Exact(DST_DROP)}, drop.preamble.id, {}))
    sw.start()
    try:
        want = {0: 0, FWD_PORT: 0, None: 0}
        sent = {1: 0, 2: 0}
        t0 = time.monotonic()
        for i, f in enumerate(fuzz_frames(N_FRAMES)):
            ing = 1 + (i & 1)
            ports[ing].inject(f)
            sent[ing] += 1
            want[expected_port(f)] += 1
        elapsed = time.monotonic() - t0
        assert sw.drain(10)
        got = {n: len(p.recv_all(timeout=0.05)) for n, p in ports.items()}
        c = sw.counters()
        # every frame was received, by the ports and by the dataplane
        assert {n: c["ports"][n]["rx_packets"] for n in (1, 2)} == sent
        assert all(c["ports"][n]["rx_errors"] == 0 for n in ports)
        stats = dpl.packet_counts()
        assert stats["rx"] == N_FRAMES
        drops = dpl.drop_counts()
        assert not any(r == "internal_error" for _, r in drops), drops
        # l2.p4 is unicast: received == forwarded by the pipeline + dropped by reason
        dp_drops = sum(drops.values())
        assert stats["rx"] == stats["tx"] + dp_drops
        assert dp_drops == sum(v for (_, r), v in drops.items() if r == "ingress_drop")
        assert stats["tx"] == (
            sum(q["enqueued"] + sum(q["drops"].values()) for q in c["queues"].values())
            + c["switch_drops"]["no_such_port"]
        )
        assert all(sum(q["drops"].values()) == 0 for q in c["queues"].values())
        # the oracle: outputs per port, drops per reason
        assert got == {0: want[0], 1: 0, 2: 0, FWD_PORT: want[FWD_PORT]}
        assert dp_drops + c["switch_drops"]["no_such_port"] == want[None]
        assert {n: c["ports"][n]["tx_packets"] for n in ports} == got
        # the program's own counter saw every frame per ingress port
        pc = next(x for x in pipe.p4info.counters if x.preamble.name.endswith("port_counter"))
        assert [dpl.read_counter(pc.preamble.id, n)[0][2] for n in (1, 2)] == [sent[1], sent[2]]
        # still forwards a valid frame correctly
        good = seed_frames()[0]
        ports[1].inject(good)
        assert ports[FWD_PORT].recv(2.0) == good
        print(
            f"\n{N_FRAMES} frames in {elapsed:.1f}s ({N_FRAMES / elapsed:,.0f}/s): "
            f"fwd={got} drops={drops} no_such_port={c['switch_drops']['no_such_port']}"
        )
    finally:
        sw.stop()


# ----------------------------------------------------------------------------- subprocess
def _udp_snmp() -> dict[str, int]:
    lines = [
        ln.split()
        for ln in Path("/proc/net/snmp").read_text().splitlines()
        if ln.startswith("Udp:")
    ]
    return dict(zip(lines[0][1:], map(int, lines[1][1:]), strict=True))


UDP_FRAMES = 100_000
BATCH = 500


@pytest.mark.slow
def test_sg_switch_grpc_fuzz_over_udp(tmp_path: Path) -> None:
    pipe = Pipeline.compile(PROGS / "l2.p4")
    artefact = tmp_path / "l2.bin"
    artefact.write_bytes(pipe.to_device_config())
    # our endpoints (the peers) first, then the switch's ports
    mine = {}
    for n in (0, 1, 3):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        mine[n] = s
    theirs = {n: free_port(socket.SOCK_DGRAM) for n in mine}
    args = ["--no-p4", "--device-id", "0", "-L", "warn"]
    for n in mine:
        args += [
            "--loopback-port",
            f"{n}@127.0.0.1:{theirs[n]}=127.0.0.1:{mine[n].getsockname()[1]}",
        ]
    cmd = switch_argv(*args)
    log = tmp_path / "switch.log"
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=logf, text=True)
    client = None
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("sg-switch-grpc ready"), log.read_text()[-2000:]
        client = P4RuntimeClient(line.split("grpc=")[1].split()[0])
        client.connect()
        client.set_pipeline(pipe.p4info, artefact.read_bytes())
        info = pipe.p4info
        dmac = next(t for t in info.tables if t.preamble.name.endswith("dmac"))
        fwd = next(a for a in info.actions if a.preamble.name.endswith(".fwd"))
        drop = next(a for a in info.actions if a.preamble.name.endswith(".drop"))

        def entry(dst: int, action: int, port: int | None) -> p4runtime_pb2.Entity:
            e = p4runtime_pb2.Entity()
            te = e.table_entry
            te.table_id = dmac.preamble.id
            te.match.add(field_id=dmac.match_fields[0].id).exact.value = _mac(dst)
            te.action.action.action_id = action
            if port is not None:
                te.action.action.params.add(param_id=1, value=port.to_bytes(2, "big"))
            return e

        entries = {
            FWD_PORT: entry(DST_FWD, fwd.preamble.id, FWD_PORT),
            None: entry(DST_DROP, drop.preamble.id, None),
            NOPORT: entry(DST_NOPORT, fwd.preamble.id, NOPORT),
        }
        client.write([U(type=U.INSERT, entity=e) for e in entries.values()])

        tx = mine[1]
        dest = ("127.0.0.1", theirs[1])
        got = {0: 0, FWD_PORT: 0}
        want = {0: 0, FWD_PORT: 0, None: 0}
        markers = 0
        snmp0 = _udp_snmp()
        t0 = time.monotonic()

        def pump(until_marker: bytes | None, timeout: float = 10.0) -> None:
            deadline = time.monotonic() + timeout
            while True:
                idle = True
                for n in (0, FWD_PORT):
                    while True:
                        try:
                            data = mine[n].recv(65536)
                        except BlockingIOError:
                            break
                        idle = False
                        if until_marker is not None and data == until_marker:
                            until_marker = None
                            continue
                        got[n] += 1
                if until_marker is None and idle:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"marker not forwarded; {log.read_text()[-2000:]}")
                if idle:
                    time.sleep(0.0005)

        batch: list[bytes] = []
        for i, f in enumerate(fuzz_frames(UDP_FRAMES, seed=2)):
            batch.append(f)
            want[expected_port(f)] += 1
            if len(batch) == BATCH or i == UDP_FRAMES - 1:
                for b in batch:
                    tx.sendto(b, dest)
                marker = _ipv4_udp(DST_FWD, b"marker%08d" % markers)
                tx.sendto(marker, dest)
                markers += 1
                pump(marker)
                batch = []
        elapsed = time.monotonic() - t0
        pump(None)
        snmp1 = _udp_snmp()
        kernel_drops = snmp1["RcvbufErrors"] - snmp0["RcvbufErrors"]

        # the program's counters over P4Runtime
        ce = p4runtime_pb2.Entity()
        pc = next(x for x in info.counters if x.preamble.name.endswith("port_counter"))
        ce.counter_entry.counter_id = pc.preamble.id
        ce.counter_entry.index.index = 1
        received = client.read([ce])[0].counter_entry.data.packet_count
        hits = {}
        for k, e in entries.items():
            d = p4runtime_pb2.Entity()
            d.direct_counter_entry.table_entry.CopyFrom(e.table_entry)
            d.direct_counter_entry.table_entry.ClearField("action")
            hits[k] = client.read([d])[0].direct_counter_entry.data.packet_count

        sent = UDP_FRAMES + markers
        # every frame reached the pipeline, or the kernel counted its drop (RcvbufErrors is
        # host-wide, so other processes' drops may show up too: only "covered" is asserted)
        lost = sent - received
        assert 0 <= lost <= kernel_drops, (sent, received, kernel_drops)
        # forwarded + dropped by reason (ingress drop / no such port) == received
        forwarded = got[0] + got[FWD_PORT] + markers
        assert received == forwarded + hits[None] + hits[NOPORT]
        assert hits[FWD_PORT] == got[FWD_PORT] + markers
        if lost == 0:
            assert got == {0: want[0], FWD_PORT: want[FWD_PORT]}
            assert hits[None] + hits[NOPORT] == want[None]
        # still forwards a valid frame correctly
        good = seed_frames()[0]
        tx.sendto(good, dest)
        deadline = time.monotonic() + 5
        out = None
        while out is None and time.monotonic() < deadline:
            try:
                out = mine[FWD_PORT].recv(65536)
            except BlockingIOError:
                time.sleep(0.01)
        assert out == good
        assert proc.poll() is None, "switch died"
        print(
            f"\n{UDP_FRAMES} frames over UDP in {elapsed:.1f}s "
            f"({UDP_FRAMES / elapsed:,.0f}/s); kernel drops {kernel_drops}; "
            f"out={got} hits={hits}"
        )
    finally:
        if client is not None:
            client.close()
        stop_process(proc)
        for s in mine.values():
            s.close()
    assert proc.returncode == 0, log.read_text()[-2000:]
    assert "Traceback" not in log.read_text()


# ----------------------------------------------------------------------------- queue wake-ups
def test_inline_tx_still_wakes_drainers_and_queued_frames() -> None:
    """The inline-transmit path wakes the TX thread only when frames wait behind it or drain()
    waits (p4target/queues.py): a drainer and frames queued during a slow inline send are
    both still served promptly, in FIFO order."""
    import threading

    from shadowgrad.p4target.queues import EgressQueue, QueueConfig

    sent: list[bytes] = []
    gate = threading.Event()

    def slow_send(frame: bytes) -> None:
        if frame == b"first":
            gate.wait(5)
        sent.append(frame)

    q = EgressQueue(1, slow_send, QueueConfig())
    try:
        t = threading.Thread(target=q.put, args=(b"first",))  # inline, blocks in send
        t.start()
        deadline = time.monotonic() + 5
        while not q._busy and time.monotonic() < deadline:
            time.sleep(0.001)
        assert q.put(b"second")  # queued behind the inline send
        drained: list[bool] = []
        d = threading.Thread(target=lambda: drained.append(q.drain(5)))
        d.start()
        time.sleep(0.05)
        t_set = time.monotonic()
        gate.set()
        t.join(5)
        d.join(5)
        assert drained == [True]
        assert time.monotonic() - t_set < 2.0  # woken, not timed out
        assert sent == [b"first", b"second"]
        assert q.put(b"third") and q.drain(1) and sent[-1] == b"third"
        assert q.stats().transmitted == 3
    finally:
        q.close()
