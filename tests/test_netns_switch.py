"""netns acceptance: three hosts in their own network namespaces, each on a veth whose other end
is a port of the software switch (``sg-switch-grpc`` as a subprocess, AF_PACKET ports), driven
over P4Runtime. Ping and UDP through the L2/L3 program; a broadcast is replicated by the PRE
and observed on both other hosts. Everything created is deleted, even on failure."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from p4.v1 import p4runtime_pb2

from shadowgrad.bmv2_testbed.topology import add_veth, disable_ipv6, ns_sh
from shadowgrad.errors import P4RuntimeError
from shadowgrad.p4target.pcap import read_pcap
from shadowgrad.p4target.process import stop_process, wait_switch_ready
from shadowgrad.testing.processes import spawn_switch
from tests.test_p4rt_server import Client, Names, dmac_entry, lpm_entry, mc_entity, upd

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[1]
PROG = ROOT / "tests" / "p4progs" / "rt_l2l3.p4"
U = p4runtime_pb2.Update


def sh(*args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=timeout)


def ns_python(ns: str, code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


RECV = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.settimeout(float(sys.argv[2]))
print("ready", flush=True)
try:
    data, addr = s.recvfrom(2048)
    print(addr[0], data.decode(), flush=True)
except socket.timeout:
    print("timeout", flush=True)
"""

SEND = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
s.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
"""


class Topo:
    def __init__(self, n: int = 3) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = [f"sgt{tag}h{i}" for i in range(1, n + 1)]
        self.sw_if = [f"sg{tag}s{i}" for i in range(1, n + 1)]
        self.h_if = [f"sg{tag}h{i}" for i in range(1, n + 1)]

    def create(self) -> None:
        for i, (ns, s, h) in enumerate(zip(self.ns, self.sw_if, self.h_if, strict=True), 1):
            sh("ip", "netns", "add", ns)
            add_veth(s, h, ns)
            sh("ip", "link", "set", s, "up")
            disable_ipv6(ns)
            sh("ip", "-n", ns, "link", "set", h, "address", f"00:00:00:00:00:0{i}")
            sh("ip", "-n", ns, "addr", "add", f"10.0.0.{i}/24", "brd", "10.0.0.255", "dev", h)
            sh("ip", "-n", ns, "link", "set", h, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # checksum offload would leave partial checksums the switch does not complete
            ns_sh(ns, "ethtool", "-K", h, "tx", "off", "rx", "off")
            for j in range(1, len(self.ns) + 1):
                if j != i:
                    sh(
                        "ip",
                        "-n",
                        ns,
                        "neigh",
                        "add",
                        f"10.0.0.{j}",
                        "lladdr",
                        f"00:00:00:00:00:0{j}",
                        "dev",
                        h,
                        "nud",
                        "permanent",
                    )

    def destroy(self) -> None:
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)
        for s in self.sw_if:
            sh("ip", "link", "del", s, check=False)


@pytest.fixture
def topo() -> Iterator[Topo]:
    t = Topo()
    try:
        t.create()
        yield t
    finally:
        t.destroy()


def start_switch(topo: Topo, pcap_dir: Path) -> tuple[subprocess.Popen[str], str]:
    args = [str(PROG), "--device-id", "0", "--pcap", str(pcap_dir), "-L", "warn"]
    for i, s in enumerate(topo.sw_if, 1):
        args += ["-i", f"{i}@{s}"]
    p = spawn_switch(*args)
    try:
        return p, wait_switch_ready(p, timeout_s=60)
    except P4RuntimeError:
        p.kill()
        _out, err = p.communicate(timeout=10)
        raise AssertionError(f"switch did not start: {err[-2000:]}") from None


def stop(p: subprocess.Popen[str]) -> str:
    stop_process(p)
    return p.stderr.read() if p.stderr else ""


def udp_send(ns: str, dst: str, port: str, text: str) -> None:
    """One UDP datagram ``text`` to ``dst:port`` (broadcast allowed) from namespace ``ns``."""
    sh("ip", "netns", "exec", ns, sys.executable, "-c", SEND, dst, port, text)


def test_three_hosts_ping_udp_and_multicast(topo: Topo, tmp_path: Path) -> None:
    proc, addr = start_switch(topo, tmp_path)
    client = None
    procs: list[subprocess.Popen[str]] = []
    try:
        client = Client(addr, election_id=1)
        assert client.next("arbitration").status.code == 0
        req = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=0)
        names = Names(client.stub.GetForwardingPipelineConfig(req, timeout=10).config.p4info)
        ups = [upd(U.INSERT, lpm_entry(names, 0x0A000000 + i, 32, i, i)) for i in (1, 2, 3)]
        ups.append(upd(U.INSERT, mc_entity(1, [(1, 1), (2, 2), (3, 3)])))
        ups.append(upd(U.INSERT, dmac_entry(names, 0xFFFFFFFFFFFF, "MyIngress.multicast", 1)))
        client.write(*ups)

        # ping h1 -> h2 and h3 (routed by ipv4_lpm, TTL decremented)
        for dst in ("10.0.0.2", "10.0.0.3"):
            r = sh(
                "ip",
                "netns",
                "exec",
                topo.ns[0],
                "ping",
                "-c",
                "2",
                "-i",
                "0.2",
                "-W",
                "2",
                dst,
                check=False,
                timeout=30,
            )
            assert r.returncode == 0, r.stdout + r.stderr
            assert "ttl=63" in r.stdout

        # unicast UDP h1 -> h3
        rx = ns_python(topo.ns[2], RECV, "5001", "5")
        procs.append(rx)
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        udp_send(topo.ns[0], "10.0.0.3", "5001", "unicast-hello")
        out, _ = rx.communicate(timeout=10)
        assert out.strip() == "10.0.0.1 unicast-hello"

        # broadcast from h1: the PRE copies it to h2 and h3 (not back to h1)
        rxs = [ns_python(topo.ns[k], RECV, "5002", "5") for k in (1, 2)]
        procs.extend(rxs)
        for r2 in rxs:
            assert r2.stdout is not None and r2.stdout.readline().strip() == "ready"
        udp_send(topo.ns[0], "10.0.0.255", "5002", "mcast-hello")
        outs = [r2.communicate(timeout=10)[0].strip() for r2 in rxs]
        assert outs == ["10.0.0.1 mcast-hello"] * 2
        # (h1's own sockets see the broadcast through the kernel's local delivery, so the
        # suppression of the copy toward the ingress port is checked on the switch's pcap)
        out_frames = {
            i: [f for _, f in read_pcap(tmp_path / f"{s}_out.pcap") if b"mcast-hello" in f]
            for i, s in enumerate(topo.sw_if, 1)
        }
        assert [len(out_frames[i]) for i in (1, 2, 3)] == [0, 1, 1]
        assert out_frames[2][0][18:20] == b"\x00\x02"  # egress_rid in the IPv4 id field

        # counters over P4Runtime agree, and pcap files were written per port
        ce = p4runtime_pb2.Entity()
        ce.counter_entry.counter_id = names["MyIngress.port_rx"]
        ce.counter_entry.index.index = 1
        assert client.read(ce)[0].counter_entry.data.packet_count >= 6
        assert (tmp_path / f"{topo.sw_if[0]}_in.pcap").stat().st_size > 24
        assert (tmp_path / f"{topo.sw_if[2]}_out.pcap").stat().st_size > 24
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        if client is not None:
            client.close()
        err = stop(proc)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
