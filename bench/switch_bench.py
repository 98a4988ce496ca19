"""Software-switch benchmark (issue 5): packets/s of the target against a bare Python loop.

Topology (root): three veth pairs; the forwarders' ends (``s1`` ingress, ``s2``/``s3``
egress) in the root namespace, the host ends in a namespace of their own
(:class:`shadowgrad.testing.bmv2.VethNamespace`), IPv6 off, MTU 9500.

Forwarders, each a separate process:

* ``bare``: a bare Python AF_PACKET loop, ``recv`` on ``s1`` and ``send`` to ``s2`` (and
  ``s3`` for two copies), with the same socket options as the target's ports (64 MiB forced
  receive buffer, ``PACKET_IGNORE_OUTGOING``);
* ``target``: ``sg-switch-grpc`` running ``tests/p4progs/mcast.p4`` (table ``mc`` on the
  destination MAC -> ``flood(grp)``; the PRE replicates, egress rewrites a tag per replica),
  programmed over P4Runtime with a 1-copy group (port 2) and a 2-copy group (ports 2, 3).

Method (so that the generator does not compete with the forwarder for the CPUs): the forwarder
is stopped (SIGSTOP), ``N`` frames are written into ``s1`` from the host side, so they wait in
the forwarder's socket buffer; then the forwarder is continued (SIGCONT) and the time until the
egress interfaces' ``tx_packets`` have grown by ``N x copies`` is measured (sysfs, polled every
2 ms). ``pps`` is ingress frames per second; ``copies_per_s`` is pps times copies. Every item
runs ``--rounds`` times, interleaved, and the best round counts (the machine is shared). Frames
are Ethernet/IPv4/UDP/tag with a 64 B or an 8 KiB UDP payload. Goal: target >= 50% of bare.

Usage (root)::

    .venv/bin/python bench/switch_bench.py            # 3 rounds
    .venv/bin/python bench/switch_bench.py --rounds 1 --frames-small 10000
    .venv/bin/python bench/switch_bench.py --profile 1:64   # cProfile of the target's hot path
    .venv/bin/python bench/switch_bench.py --cpu   # CPU us per frame without sockets

Results: ``bench/results/switch_bench.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from p4.v1 import p4runtime_pb2

from shadowgrad.controller.p4runtime import P4RuntimeClient
from shadowgrad.frames import encode_frame
from shadowgrad.p4target.dataplane import Pipeline
from shadowgrad.testing.bmv2 import VethNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "switch_bench.json"
PROG = ROOT / "tests" / "p4progs" / "mcast.p4"
TARGET_RATIO = 0.50
U = p4runtime_pb2.Update
DST = {1: 0x020000000001, 2: 0x020000000002}  # destination MAC -> number of copies

BARE = r"""
import socket, sys
ETH_P_ALL = 3
def sock(iface):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((iface, 0))
    s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)   # SO_RCVBUFFORCE, as the target's ports
    s.setsockopt(socket.SOL_SOCKET, 32, 4 << 20)    # SO_SNDBUFFORCE
    s.setsockopt(263, 23, 1)                        # PACKET_IGNORE_OUTGOING
    return s
rx = sock(sys.argv[1])
outs = [sock(i) for i in sys.argv[2:]]
print("ready", flush=True)
recv = rx.recv
if len(outs) == 1:
    send = outs[0].send
    while True:
        send(recv(65536))
else:
    sends = [o.send for o in outs]
    while True:
        f = recv(65536)
        for s in sends:
            s(f)
"""


def frame(dst: int, payload: int) -> bytes:
    """The frame to MAC ``dst`` with a ``payload``-byte UDP payload to the program's tag port
    (``shadowgrad.frames``' framing): the tag (zeros; egress rewrites it per replica), filler."""
    tag = bytes(6)
    return encode_frame(
        tag + b"\xab" * (payload - len(tag)),
        src=("10.0.0.1", 1000),
        dst=("10.0.0.2", 0x1234),
        src_mac=0x020000000009,
        dst_mac=dst,
        ident=1,
    )


def tx_packets(iface: str) -> int:
    return int(Path(f"/sys/class/net/{iface}/statistics/tx_packets").read_text())


class Forwarder:
    """A forwarder process that can be paused and continued."""

    def __init__(self, name: str, cmd: list[str], ready: str, log: Path) -> None:
        self.name = name
        self.log = log
        self.logf = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.logf, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith(ready):
            self.stop()
            raise RuntimeError(f"{name} did not start: {line!r} {log.read_text()[-2000:]}")
        self.ready_line = line

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.logf.close()


def program_target(addr: str) -> None:
    pipe = Pipeline.compile(PROG)
    info = pipe.p4info
    c = P4RuntimeClient(addr)
    try:
        c.connect()
        mc = next(t for t in info.tables if t.preamble.name.endswith(".mc"))
        flood = next(a for a in info.actions if a.preamble.name.endswith(".flood"))
        ups = []
        for gid, ports in ((1, [2]), (2, [2, 3])):
            e = p4runtime_pb2.Entity()
            g = e.packet_replication_engine_entry.multicast_group_entry
            g.multicast_group_id = gid
            for i, p in enumerate(ports, 1):
                g.replicas.add(egress_port=p, instance=i)
            ups.append(U(type=U.INSERT, entity=e))
            e = p4runtime_pb2.Entity()
            te = e.table_entry
            te.table_id = mc.preamble.id
            te.match.add(field_id=mc.match_fields[0].id).exact.value = DST[gid].to_bytes(6, "big")
            te.action.action.action_id = flood.preamble.id
            te.action.action.params.add(param_id=flood.params[0].id, value=gid.to_bytes(2, "big"))
            ups.append(U(type=U.INSERT, entity=e))
        c.write(ups)
    finally:
        c.close()


def measure(
    fw: Forwarder, veths: VethNamespace, *, copies: int, payload: int, n: int, timeout: float
) -> dict[str, Any]:
    outs = [veths.switch_if[p] for p in (2, 3)[:copies]]
    f = frame(DST[copies], payload)
    fw.pause()
    time.sleep(0.05)
    before = [tx_packets(i) for i in outs]
    for _ in range(n):
        veths.send(1, f)
    time.sleep(0.05)
    want = n * copies
    t0 = time.perf_counter()
    fw.resume()
    last_progress, last_total = t0, 0
    while True:
        total = sum(tx_packets(i) - b for i, b in zip(outs, before, strict=True))
        now = time.perf_counter()
        if total >= want:
            t_done = now
            break
        if total != last_total:
            last_progress, last_total = now, total
        elif now - last_progress > 1.0 or now - t0 > timeout:
            t_done = last_progress  # lost frames (kernel drops): rate over what came out
            break
        time.sleep(0.002)
    elapsed = max(t_done - t0, 1e-9)
    got = min(total, want)
    return {
        "frames": n,
        "copies": copies,
        "payload": payload,
        "frame_bytes": len(f),
        "delivered_copies": total,
        "lost_copies": want - got,
        "seconds": elapsed,
        "pps": got / copies / elapsed,
        "copies_per_s": got / elapsed,
    }


def inprocess_switch(pipe: Pipeline, ports: list[Any]) -> Any:
    """An in-process :class:`Switch` with ``ports`` and the benchmark's program and entries
    (what :func:`program_target` writes over P4Runtime: groups 1 = {2}, 2 = {2, 3})."""
    from shadowgrad.p4target.dataplane import Exact, TableEntry
    from shadowgrad.p4target.switch import Switch

    info = pipe.p4info
    mc = next(t for t in info.tables if t.preamble.name.endswith(".mc"))
    flood = next(a for a in info.actions if a.preamble.name.endswith(".flood"))
    sw = Switch()
    for port in ports:
        sw.add_port(port)
    dpl = sw.load_pipeline(pipe)
    dpl.insert_multicast_group(1, [(2, 1)])
    dpl.insert_multicast_group(2, [(2, 1), (3, 2)])
    for gid in (1, 2):
        dpl.insert_entry(
            TableEntry(
                mc.preamble.id,
                {mc.match_fields[0].id: Exact(DST[gid])},
                flood.preamble.id,
                {flood.params[0].id: gid},
            )
        )
    return sw


def profile_target(copies: int, payload: int, n: int, top: int = 25) -> None:
    """cProfile of the target's hot path: an in-process :class:`Switch` with AF_PACKET ports on
    the same veths and program, ``n`` frames preloaded, the ingress port's RX loop run on this
    thread until all are processed. Prints packets/s without and with the profiler."""
    import cProfile
    import pstats

    from shadowgrad.p4target.ports import AfPacketPort
    from shadowgrad.p4target.switch import Switch

    veths = VethNamespace([1, 2, 3])
    try:
        for p in (2, 3):
            veths.socks.pop(p).close()
        pipe = Pipeline.compile(PROG)
        for profiled in (False, True):
            ports = {p: AfPacketPort(p, veths.switch_if[p]) for p in (1, 2, 3)}
            sw = inprocess_switch(pipe, list(ports.values()))
            f = frame(DST[copies], payload)
            for _ in range(n):
                veths.send(1, f)
            time.sleep(0.1)
            rx = ports[1]

            def deliver(
                pn: int,
                frs: list[bytes],
                rx: AfPacketPort = rx,
                sw: Switch = sw,
                seen: list[int] = [0],  # noqa: B006 (one per loop)
            ) -> None:
                sw._deliver_batch(pn, frs)
                seen[0] += len(frs)
                if seen[0] >= n:
                    rx._stop.set()

            rx._deliver_batch = deliver
            prof = cProfile.Profile() if profiled else None
            t0 = time.perf_counter()
            if prof is not None:
                prof.enable()
            rx._rx_loop()
            if prof is not None:
                prof.disable()
            dt = time.perf_counter() - t0
            print(
                f"{'profiled' if profiled else 'plain':8s} {copies} copies, {payload} B: "
                f"{n / dt:,.0f} pkt/s ({dt / n * 1e6:.1f} us/pkt)"
            )
            sw.stop()
            if prof is not None:
                pstats.Stats(prof).sort_stats("tottime").print_stats(top)
    finally:
        veths.close()


def cpu_per_packet(n: int = 10000, repeat: int = 7) -> None:
    """CPU time per frame of the target's packet path without sockets (a reporting aid, much
    less sensitive to a busy machine than packets/s): an in-process :class:`Switch` with
    ports whose ``send`` only counts, the same program and entries, ``n`` frames per item
    through ``Switch._deliver_batch`` on this thread, one at a time and in the batches an RX
    port hands over when frames are waiting; the best of ``repeat`` (``time.thread_time``)."""
    from shadowgrad.p4target.ports import _PROC_BATCH, Port

    class NullPort(Port):
        def send(self, frame: bytes) -> None:
            self.tx_packets += 1

    sw = inprocess_switch(Pipeline.compile(PROG), [NullPort(p, f"null{p}") for p in (1, 2, 3)])
    try:
        deliver = sw._deliver_batch
        for payload in (64, 8192):
            for copies in (1, 2):
                f = frame(DST[copies], payload)
                cost = []
                for size in (1, _PROC_BATCH):  # a lone frame; frames waiting (as under load)
                    batch = [f] * size
                    best = float("inf")
                    for _ in range(repeat):
                        t0 = time.thread_time()
                        for _ in range(n // size):
                            deliver(1, batch)
                        best = min(best, (time.thread_time() - t0) / (n // size * size))
                    cost.append(best * 1e6)
                print(
                    f"{payload:>6} B {copies} copies: {cost[0]:6.2f} us CPU per frame alone, "
                    f"{cost[1]:6.2f} in batches of {_PROC_BATCH} (pipeline, queues, switch; "
                    "no sockets)"
                )
    finally:
        sw.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--frames-small",
        type=int,
        default=20000,
        help="frames per 64 B item (they must fit the 64 MiB socket buffer)",
    )
    ap.add_argument("--frames-large", type=int, default=3000, help="frames per 8 KiB item")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--switch", default=str(Path(sys.executable).parent / "sg-switch-grpc"))
    ap.add_argument(
        "--profile",
        metavar="COPIES:PAYLOAD",
        default=None,
        help="instead of the benchmark, cProfile the target's hot path (e.g. 1:64) in-process",
    )
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="instead of the benchmark, print the target's CPU time per frame "
        "without sockets (no root needed)",
    )
    args = ap.parse_args(argv)
    if args.cpu:
        cpu_per_packet()
        return 0
    if os.geteuid() != 0:
        print("switch_bench needs root (veths, network namespaces)", file=sys.stderr)
        return 2
    if args.profile:
        c, _, pl = args.profile.partition(":")
        profile_target(int(c), int(pl or 64), args.frames_small)
        return 0

    veths = VethNamespace([1, 2, 3])
    fws: dict[str, Forwarder] = {}
    logdir = Path(tempfile.mkdtemp(prefix="switch_bench_"))  # removed unless a run fails
    ok = False
    results: dict[str, dict[str, Any]] = {}
    try:
        for p in (2, 3):  # nobody reads the host sides of the egress veths
            veths.socks.pop(p).close()
        s1, s2, s3 = (veths.switch_if[p] for p in (1, 2, 3))

        def start(kind: str) -> Forwarder:
            """Every AF_PACKET socket on s1 gets its own copy of each frame, so only the
            forwarder being measured may exist."""
            if kind == "target":
                fw = Forwarder(
                    "target",
                    [
                        args.switch,
                        str(PROG),
                        "--device-id",
                        "0",
                        "-L",
                        "warn",
                        "-i",
                        f"1@{s1}",
                        "-i",
                        f"2@{s2}",
                        "-i",
                        f"3@{s3}",
                        "--",
                        "--grpc-server-addr",
                        "127.0.0.1:0",
                    ],
                    "sg-switch-grpc ready",
                    logdir / f"switch_bench_target_{veths.tag}.log",
                )
                fws[kind] = fw
                program_target(fw.ready_line.split("grpc=")[1].split()[0])
            else:
                copies = int(kind[-1])
                fw = Forwarder(
                    kind,
                    [sys.executable, "-c", BARE, s1, s2, s3][: 4 + copies],
                    "ready",
                    logdir / f"switch_bench_bare_{veths.tag}.log",
                )
                fws[kind] = fw
            return fw

        for _rnd in range(args.rounds):
            for kind in ("bare1", "bare2", "target"):
                fw = start(kind)
                try:
                    for payload, n in ((64, args.frames_small), (8192, args.frames_large)):
                        for copies in (1, 2):
                            if kind != "target" and copies != int(kind[-1]):
                                continue
                            r = measure(
                                fw, veths, copies=copies, payload=payload, n=n, timeout=args.timeout
                            )
                            key = f"{kind.rstrip('12')}/{copies}copy/{payload}B"
                            if key not in results or r["pps"] > results[key]["pps"]:
                                results[key] = r
                            print(
                                f"  {key:24s} {r['pps']:>12,.0f} pkt/s (lost {r['lost_copies']})",
                                flush=True,
                            )
                finally:
                    fw.stop()
                    del fws[kind]
        ok = True
    finally:
        for fw in fws.values():
            fw.stop()
        veths.close()
        if ok:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            print(f"forwarder logs kept in {logdir}", file=sys.stderr)

    rows = []
    print(
        f"\n{'payload':>8} {'copies':>6} {'bare pkt/s':>12} {'target pkt/s':>13} "
        f"{'ratio':>6}  goal >= {TARGET_RATIO:.0%}"
    )
    for payload in (64, 8192):
        for copies in (1, 2):
            b = results[f"bare/{copies}copy/{payload}B"]
            t = results[f"target/{copies}copy/{payload}B"]
            ratio = t["pps"] / b["pps"]
            rows.append(
                {
                    "payload": payload,
                    "copies": copies,
                    "bare_pps": b["pps"],
                    "target_pps": t["pps"],
                    "ratio": ratio,
                    "meets_goal": ratio >= TARGET_RATIO,
                }
            )
            print(f"{payload:>8} {copies:>6} {b['pps']:>12,.0f} {t['pps']:>13,.0f} {ratio:>6.0%}")
    doc = {
        "benchmark": "switch_bench",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "method": "preloaded socket buffer, SIGSTOP/SIGCONT, egress tx_packets; best of "
        f"{args.rounds} rounds",
        "program": str(PROG.relative_to(ROOT)),
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "goal_ratio": TARGET_RATIO,
        "summary": rows,
        "items": results,
    }
    _common.write_json(args.out, doc, indent=2, sort_keys=True)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
