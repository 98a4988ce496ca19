"""AF_PACKET ports on a veth whose peer lives in a namespace created here: receive, transmit,
own transmissions not seen, kernel-drop statistics readable. Cleaned up even on failure."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from shadowgrad.bmv2_testbed.topology import add_veth, disable_ipv6
from shadowgrad.p4target.ports import AfPacketPort

pytestmark = pytest.mark.netns


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=20)


@pytest.fixture
def veth() -> Iterator[tuple[str, str, str]]:
    tag = f"{os.getpid() % 100000}"
    ns, a, b = f"sgp{tag}", f"sg{tag}pa", f"sg{tag}pb"
    try:
        sh("ip", "netns", "add", ns)
        add_veth(a, b, ns)
        disable_ipv6(ns)
        sh("ip", "link", "set", a, "up")
        sh("ip", "-n", ns, "link", "set", b, "up")
        yield ns, a, b
    finally:
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", a, check=False)


RAW = """
import socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((sys.argv[1], 0))
if sys.argv[2] == "send":
    for i in range(int(sys.argv[3])):
        s.send(b"\\x02" * 6 + b"\\x04" * 6 + b"\\x88\\xb5" + i.to_bytes(4, "big") + b"\\0" * 46)
else:
    s.settimeout(3)
    print("ready", flush=True)
    while True:
        try:
            f = s.recv(2048)
        except socket.timeout:
            break
        if f[12:14] == b"\\x88\\xb6":
            print(f[14:18].hex(), flush=True)
            if int(sys.argv[3]) == 1:
                break
"""


@contextlib.contextmanager
def _receiver(ns: str, dev: str, frames: int) -> Iterator[subprocess.Popen[str]]:
    """``RAW ... recv`` on ``dev`` in namespace ``ns``, ready (it printed so) for ``frames``
    test frames; killed at the end if it still runs."""
    rx = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", RAW, dev, "recv", str(frames)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        yield rx
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait(5)


def test_af_packet_port_rx_tx(veth: tuple[str, str, str]) -> None:
    ns, a, b = veth
    got: list[bytes] = []
    done = threading.Event()

    def deliver(_n: int, f: bytes) -> None:
        if f[12:14] == b"\x88\xb5":
            got.append(f)
            if len(got) == 20:
                done.set()

    port = AfPacketPort(1, a)
    try:
        port.start(deliver)
        sh("ip", "netns", "exec", ns, sys.executable, "-c", RAW, b, "send", "20")
        assert done.wait(5), len(got)
        assert [int.from_bytes(f[14:18], "big") for f in got] == list(range(20))
        with _receiver(ns, b, 1) as rx:
            port.send(b"\x04" * 6 + b"\x02" * 6 + b"\x88\xb6" + b"\xca\xfe\xba\xbe" + bytes(46))
            out, _ = rx.communicate(timeout=10)
        assert out.strip() == "cafebabe"
        with _receiver(ns, b, 3) as rx:
            burst = [
                b"\x04" * 6 + b"\x02" * 6 + b"\x88\xb6" + i.to_bytes(4, "big") + bytes(46)
                for i in range(3)
            ]
            assert port.send_many(burst) == (3, 3 * 64)
            out, _ = rx.communicate(timeout=10)
        assert out.split() == ["00000000", "00000001", "00000002"]
        time.sleep(0.1)
        # the switch never sees its own transmission
        assert not any(f[12:14] == b"\x88\xb6" for f in got)
        c = port.counters()
        assert c["tx_packets"] == 4 and c["rx_packets"] >= 20 and c["kernel_drops"] == 0
    finally:
        port.close()


def test_af_packet_port_hands_waiting_frames_over_in_batches(veth: tuple[str, str, str]) -> None:
    """Frames that wait in the socket reach ``deliver_batch`` in order, at most 32 at a time,
    counted before they are handed over; the per-frame ``deliver`` is not used."""
    ns, a, b = veth
    batches: list[list[bytes]] = []
    done = threading.Event()
    counted: list[int] = []
    port = AfPacketPort(1, a)

    def deliver(_n: int, f: bytes) -> None:
        raise AssertionError("per-frame delivery with a batch callback")

    def deliver_batch(_n: int, frames: list[bytes]) -> None:
        counted.append(port.rx_packets)
        batches.append([f for f in frames if f[12:14] == b"\x88\xb5"])
        if sum(len(x) for x in batches) >= 500:
            done.set()

    try:
        port.start(deliver, deliver_batch)
        # the sender writes 500 frames back to back; the port reads them as they come
        sh("ip", "netns", "exec", ns, sys.executable, "-c", RAW, b, "send", "500")
        assert done.wait(10), sum(len(x) for x in batches)
        got = [int.from_bytes(f[14:18], "big") for x in batches for f in x]
        assert got == list(range(500))
        assert max(len(x) for x in batches) <= 32
        assert port.rx_errors == 0
        # rx_packets had already counted each batch when it was handed over
        total = 0
        for c, x in zip(counted, batches, strict=True):
            total += len(x)
            assert c >= total
    finally:
        port.close()
