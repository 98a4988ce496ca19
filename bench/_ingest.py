"""Shadow ingest benchmark: ``ingest_bench()`` (meant for bench/shadow_bench.py).

Run: ``.venv/bin/python bench/_ingest.py [--json out.json] [--params 100e6] [--optimizer sgd]``

A. **Ingest vs bare receive.** A producer process (pre-encoded 64 KiB DATA datagrams, sent
   flat out with ``sendto``) streams the same bytes twice: once at a bare ``recv_into`` loop,
   once at a real :class:`~shadowgrad.shadow.node.ShadowNode` (decode + GMAC + placement +
   coverage), warmed to steady state first (:func:`warm`: its iterations applied, so the
   measured ones place into recycled buffers, as in a running job), with one and with two
   receive threads. Each side's MB/s is the bytes it *processed* over the time between its
   first and last datagram; all see the same offered load (the producer's own rate is printed
   too), so loss under overload shows up as a lower rate, not a wrong one. The three passes run
   in ``rounds`` interleaved rounds (:func:`interleaved`, as auth_bench's part A): the ratio is
   of the medians, and the paired ratio the median of each round's own.
B. **Streaming a 100M-parameter gradient per iteration.** A producer process computes the
   headers (CRC) of a fresh iteration's 64 KiB chunks while pacing them at ``--rate`` MB/s,
   sends the COMMIT, and answers NACKs with RETX; one shadow owns the whole model and replays
   an optimizer step per iteration. Paced at one iteration per second, does every iteration get
   applied, and with how much delay? The report breaks each iteration down into receive time
   (first -> last chunk), repair, and apply (ready -> applied), and names the limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common

CHUNK = 65280  # 64 KiB-ish DATA payload, a multiple of 64 bytes (fits MAX_PAYLOAD = 65451)
TOKEN = "bench-token"
JOB = 4242


def _layout(n_params: int, num_shadows: int = 1) -> Any:
    from shadowgrad.layout import Layout, ParamSpec

    rows = 4096
    per = max(1, n_params // 10 // rows)
    params = [ParamSpec(f"w{i}", (per, rows), "float32") for i in range(10)]
    bucket_cap = 25 * 2**20
    buckets: list[list[str]] = []
    size = 0
    for p in params:
        if not buckets or size >= bucket_cap:
            buckets.append([])
            size = 0
        buckets[-1].append(p.name)
        size += p.nbytes
    return Layout.build(params, buckets, num_shadows)


# --------------------------------------------------------------------------- producer process


def data_fields(
    layout: Any, it: int, seq: int, bucket: int, offset: int, *, payload: Any, retx: bool = False
) -> dict[str, Any]:
    """The header fields of a FINAL (and with ``retx`` RETX) fp32 DATA datagram of the bench's
    trainer (sender 0), for ``wire.encode`` / ``encode_header`` / ``seal``."""
    from shadowgrad import wire

    return {
        "job": JOB,
        "sender": 0,
        "iteration": it,
        "seq": seq,
        "layout": layout.digest64,
        "payload": payload,
        "flags": wire.Flag.FINAL | (wire.Flag.RETX if retx else 0),
        "dtype": wire.DType.FLOAT32,
        "bucket": bucket,
        "offset": offset,
    }


def producer_setup(cfg: dict[str, Any]) -> tuple[Any, tuple[str, int], socket.socket, list[bytes]]:
    """A producer's layout, destination, sending socket (bound to ``cfg["bind_port"]``, else
    any port) and one iteration's gradient per bucket (random, seeded)."""
    import numpy as np

    from shadowgrad.layout import Layout

    layout = Layout.from_json(cfg["layout"])
    dest = (cfg["host"], cfg["port"])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", cfg.get("bind_port", 0)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 * 2**20)
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(n // 4, dtype=np.float32).tobytes() for n in layout.bucket_nbytes]
    return layout, dest, sock, grads


def send_burst(sock: socket.socket, dest: tuple[str, int], dgrams: list[bytes]) -> None:
    """Say ready, wait for ``go`` on stdin, send ``dgrams`` flat out, print what was sent."""
    print(json.dumps({"ready": len(dgrams)}), flush=True)
    sys.stdin.readline()  # go
    t0 = time.perf_counter()
    nbytes = 0
    for d in dgrams:
        sock.sendto(d, dest)
        nbytes += len(d)
    dt = time.perf_counter() - t0
    print(json.dumps({"sent": len(dgrams), "bytes": nbytes, "seconds": dt}), flush=True)


def _producer_main(argv: list[str]) -> None:
    cfg = json.loads(argv[0])
    from shadowgrad import wire
    from shadowgrad.errors import WireError

    layout, dest, sock, grads = producer_setup(cfg)
    seq = 0

    key = wire.mac_key(TOKEN, JOB)  # sealed as a trainer seals (security.authenticate_data)

    def header(
        it: int, b: int, off: int, payload: memoryview, retx: bool = False
    ) -> tuple[bytes, bytes]:
        nonlocal seq
        seq += 1
        fields = data_fields(layout, it, seq, b, off, payload=payload, retx=retx)
        return wire.seal(wire.Kind.DATA, key=key, **fields)

    def datagram(it: int, b: int, off: int, g: bytes) -> bytes:
        h, tag = header(it, b, off, memoryview(g)[off : off + CHUNK])
        return h + g[off : off + CHUNK] + tag

    if cfg["mode"] == "burst":  # part A: pre-encoded, flat out
        first = cfg.get("first_iteration", 0)
        dgrams = [
            datagram(it, b, off, g)
            for it in range(first, first + cfg["iterations"])
            for b, g in enumerate(grads)
            for off in range(0, len(g), CHUNK)
        ]
        send_burst(sock, dest, dgrams)
        return

    # part B: paced stream, COMMIT, NACK service
    period, rate = cfg["period_s"], cfg["rate_mbps"] * 1e6
    sock.settimeout(0.0005)
    buf = bytearray(wire.MAX_DATAGRAM + 1)
    stats = {"retx": 0, "nacks": 0, "send_s": []}

    def serve_nacks() -> None:
        while True:
            try:
                n, addr = sock.recvfrom_into(buf)
            except (TimeoutError, BlockingIOError):
                return
            try:
                msg = wire.decode(memoryview(buf)[:n], job=JOB, key=key)
            except WireError:
                continue
            if msg.header.kind is not wire.Kind.NACK:
                continue
            stats["nacks"] += 1
            it = msg.header.iteration
            rec = wire.NackRecord.from_message(msg)
            if not rec.ranges:
                sock.sendto(
                    commit.encode(
                        job=JOB,
                        sender=0,
                        iteration=it,
                        seq=0,
                        layout=layout.digest64,
                        retx=True,
                        key=key,
                    ),
                    addr,
                )
            t_r = time.perf_counter()
            sent_r = 0
            for r in rec.ranges:
                mv = memoryview(grads[r.bucket])
                for off in range(r.offset, r.offset + r.length, CHUNK):
                    p = mv[off : min(off + CHUNK, r.offset + r.length)]
                    h, tag = header(it, r.bucket, off, p, True)
                    sock.sendmsg([h, p, tag], [], 0, addr)
                    stats["retx"] += 1
                    sent_r += len(p)
                    ahead = t_r + sent_r / rate - time.perf_counter()
                    if ahead > 0.002:
                        time.sleep(ahead)

    commit = wire.CommitRecord((1e-3,))
    print(json.dumps({"ready": 1}), flush=True)
    sys.stdin.readline()
    t_start = time.perf_counter()
    for it in range(cfg["iterations"]):
        t_it = t_start + it * period
        while time.perf_counter() < t_it:
            serve_nacks()
            time.sleep(0.0005)
        t0 = time.perf_counter()
        sent = 0
        for b, g in enumerate(grads):
            mv = memoryview(g)
            for off in range(0, len(g), CHUNK):
                p = mv[off : off + CHUNK]
                h, tag = header(it, b, off, p)
                sock.sendmsg([h, p, tag], [], 0, dest)
                sent += len(p)
                ahead = t0 + sent / rate - time.perf_counter()
                if ahead > 0.002:
                    serve_nacks()
                    time.sleep(ahead)
        sock.sendto(
            commit.encode(job=JOB, sender=0, iteration=it, seq=0, layout=layout.digest64, key=key),
            dest,
        )
        stats["send_s"].append(time.perf_counter() - t0)
    t_end = time.perf_counter() + cfg["drain_s"]
    while time.perf_counter() < t_end:
        serve_nacks()
        time.sleep(0.0005)
    print(json.dumps(stats), flush=True)


class _Producer:
    """A producer process (``script --producer``) sending ``iterations`` of ``layout``'s
    gradient to 127.0.0.1:``port``; ``extra`` completes its config."""

    script = os.path.abspath(__file__)

    def __init__(self, layout: Any, port: int, iterations: int, **extra: Any) -> None:
        cfg = {
            "layout": layout.to_json(),
            "host": "127.0.0.1",
            "port": port,
            "iterations": iterations,
            **extra,
        }
        self.proc = subprocess.Popen(
            [sys.executable, self.script, "--producer", json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.ready = json.loads(self._ready_line())

    def _ready_line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"producer exited with {self.proc.returncode} before ready")
        return line

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, timeout_s: float) -> dict[str, Any]:
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return res

    def reap(self) -> None:
        """Kill the producer if it still runs (a pass that failed midway) and wait for it."""
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def __enter__(self) -> _Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.reap()


# --------------------------------------------------------------------------- helpers


def _spec(shadow_port: int, trainer_port: int, name: str = "ingest-bench", **sections: Any) -> Any:
    """The job spec of one trainer and one shadow on loopback; ``sections`` add to it."""
    from shadowgrad.config import parse_spec

    return parse_spec(
        {
            "job": {"id": JOB, "name": name, "mode": "mirror"},
            "trainers": {"world_size": 1, "addresses": [f"127.0.0.1:{trainer_port}"]},
            "shadows": {"count": 1, "addresses": [f"127.0.0.1:{shadow_port}"]},
            "switch": {"target": "none"},
            "timeouts": {"gap_repair": "100ms", "heartbeat": "100ms", "rpc": "60s"},
            **sections,
        },
        env={},
    )


def _udp(rcvbuf: int = 64 * 2**20) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind(("127.0.0.1", 0))
    return s


def recv_all(
    sock: socket.socket, expected: int, dest: bytearray | None = None
) -> tuple[int, int, float, float]:
    """Receive until ``expected`` datagrams came or none for 0.5 s: how many, their bytes, and
    when the first and the last came (``perf_counter``). Into one 64 KiB buffer, or with
    ``dest`` each datagram right after the last one in it (from the start again at its end)."""
    sock.settimeout(0.5)
    got = nbytes = 0
    t_first = t_last = 0.0
    if dest is None:
        buf = memoryview(bytearray(65536))
        view, span = buf, 0
    else:
        view, span = memoryview(dest), len(dest) - 65536
    pos = 0
    while got < expected:
        try:
            n = sock.recv_into(view[pos : pos + 65536] if span else buf)
        except TimeoutError:
            break
        if span:
            pos = pos + n if pos + n < span else 0
        t_last = time.perf_counter()
        if got == 0:
            t_first = t_last
        got += 1
        nbytes += n
    return got, nbytes, t_first, t_last


def wait_rx_quiet(node: Any, poll_s: float, timeout_s: float = 5.0) -> None:
    """Until ``node`` stops counting received datagrams (polled every ``poll_s``)."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while time.monotonic() < deadline:
        n_now = sum(node.rx.values())
        if n_now == last:
            break
        last = n_now
        time.sleep(poll_s)


def _free_udp_port() -> int:
    from shadowgrad.freeports import free_port

    return free_port(socket.SOCK_DGRAM)


def _optimizer(layout: Any, optimizer: str) -> Any:
    """The OptimizerSpec a bench shadow replays: fused AdamW or foreach SGD over every param."""
    from shadowgrad.optspec import OptimizerSpec, ParamGroupSpec

    names = tuple(p.name for p in layout.params)
    if optimizer == "adamw":
        hyper: dict[str, Any] = {**_common.ADAMW_HYPER, "foreach": False, "fused": True}
        return OptimizerSpec("AdamW", (ParamGroupSpec(names, hyper),))
    hyper = {
        "momentum": 0.9,
        "dampening": 0.0,
        "weight_decay": 0.0,
        "nesterov": False,
        "maximize": False,
        "foreach": True,
        "fused": False,
        "differentiable": False,
    }
    return OptimizerSpec("SGD", (ParamGroupSpec(names, hyper),))


def start_node(
    spec: Any, sock: Any, layout: Any, optimizer: str, *, token: str, options: Any
) -> Any:
    """A started ShadowNode on ``sock`` owning shard 0 of ``layout``, loaded with zeros and
    ``optimizer``'s replay (stopped again if loading fails)."""
    import torch

    from shadowgrad.control_client import ShadowClient
    from shadowgrad.shadow.node import ShadowNode

    node = ShadowNode(
        spec, 0, token=token, sock=sock, control_bind="tcp://127.0.0.1:*", options=options
    ).start()
    try:
        opt = _optimizer(layout, optimizer)
        states = [
            {"param": torch.zeros(b.lengths, dtype=torch.float32)} for b in layout.shard_boxes(0)
        ]
        with ShadowClient(node.control_endpoint, token, timeout_s=120) as cl:
            cl.load(-1, states, opt.to_json(), layout.to_json())
    except BaseException:
        node.stop()
        raise
    return node


def _node(layout: Any, optimizer: str, window: int, rx_threads: int = 1) -> tuple[Any, Any]:
    from shadowgrad.shadow.node import NodeOptions

    sock = _udp()
    node = start_node(
        _spec(sock.getsockname()[1], _free_udp_port()),
        sock,
        layout,
        optimizer,
        token=TOKEN,
        options=NodeOptions(window=window, rx_threads=rx_threads),
    )
    return node, sock


def warm(node: Any, layout: Any, iterations: int, token: str, authenticate_data: bool) -> int:
    """Steady state: feed iterations ``0..iterations-1`` and their COMMITs through the node's
    own receive entry point (``handle_datagram``, in-process) and wait until they are applied,
    so the measured pass places into recycled iteration buffers as a running job does (a fresh
    node allocates and zeroes one per iteration on its first chunk). Returns the first
    iteration to measure."""
    from shadowgrad import wire

    key = wire.mac_key(token, JOB)
    src = (node.spec.trainers.addresses[0].host, node.spec.trainers.addresses[0].port)
    seq = 0
    zeros = bytes(CHUNK)
    for it in range(iterations):
        for b, nbytes in enumerate(layout.bucket_nbytes):
            for off in range(0, nbytes, CHUNK):
                seq += 1
                p = zeros[: min(CHUNK, nbytes - off)]
                d = wire.encode(
                    wire.Kind.DATA,
                    key=key if authenticate_data else None,
                    **data_fields(layout, it, seq, b, off, payload=p),
                )
                node.handle_datagram(d, src)
    for it in range(iterations):
        seq += 1
        node.handle_datagram(
            wire.CommitRecord((1e-3,)).encode(
                job=JOB, sender=0, iteration=it, seq=seq, layout=layout.digest64, key=key
            ),
            src,
        )
    deadline = time.monotonic() + 120
    while node.status(timeline=0)["last_applied"] < iterations - 1:
        if time.monotonic() > deadline or node.failed is not None:
            raise RuntimeError(f"warm-up not applied: {node.status(timeline=0)['counters']}")
        time.sleep(0.02)
    return iterations


# --------------------------------------------------------------------------- the bench


def _bare_pass(layout: Any, iterations: int) -> dict[str, Any]:
    """One pass of the producer at a bare ``recv_into`` loop."""
    bare = _udp()
    try:
        with _Producer(layout, bare.getsockname()[1], iterations, mode="burst") as prod:
            expected = prod.ready["ready"]
            prod.go()
            got, nbytes, t_first, t_last = recv_all(bare, expected)
            sent = prod.result(30)
    finally:
        bare.close()
    return {
        "mbps": nbytes / max(1e-9, t_last - t_first) / 1e6,
        "received": got,
        "datagrams": expected,
        "kept_up": got >= expected,
        "bytes": sent["bytes"],
        "producer_mbps": sent["bytes"] / sent["seconds"] / 1e6,
    }


def _shadow_pass(layout: Any, iterations: int, rx_threads: int) -> dict[str, Any]:
    """One pass of the producer at a shadow node with ``rx_threads`` receive threads, warmed to
    steady state first (as auth_bench: the measured iterations place into recycled buffers)."""
    node, sock = _node(layout, "sgd", window=iterations, rx_threads=rx_threads)
    try:
        first = warm(node, layout, iterations, TOKEN, True)
        with _Producer(
            layout,
            sock.getsockname()[1],
            iterations,
            mode="burst",
            first_iteration=first,
            bind_port=node.spec.trainers.addresses[0].port,
        ) as prod:
            expected = prod.ready["ready"]
            rx0 = sum(node.rx.values())
            bytes0 = node.status(timeline=0)["events"].get("data_bytes", 0)  # the warm-up's
            prod.go()
            sent = prod.result(60)
        wait_rx_quiet(node, 0.3)
        st = node.status(timeline=iterations)
        firsts = [p["first_chunk"] for p in st["pending"].values() if p["first_chunk"]]
        lasts = [p["last_chunk"] for p in st["pending"].values() if p["last_chunk"]]
        data_bytes = st["events"].get("data_bytes", 0) - bytes0
        counted = sum(node.rx.values()) - rx0
        return {
            "mbps": data_bytes / max(1e-9, max(lasts) - min(firsts)) / 1e6,
            "counted": counted,
            # every datagram the producer sent was processed: the rate is then the producer's
            # (a lower bound of the receiver's), not the receiver's own limit
            "kept_up": counted >= expected,
            "data_bytes": data_bytes,
            "producer_mbps": sent["bytes"] / sent["seconds"] / 1e6,
        }
    finally:
        node.stop()


#: part A's passes: the bare loop, the shadow with one and with two receive threads
_A_VARIANTS = ("bare", "rx1", "rx2")


def _part_a(n_params: int, iterations: int, rounds: int = 5) -> dict[str, Any]:
    layout = _layout(n_params)

    def run(v: str, r: int) -> dict[str, Any]:
        res = (
            _bare_pass(layout, iterations)
            if v == "bare"
            else _shadow_pass(layout, iterations, int(v[2:]))
        )
        print(
            f"  [ingest] round {r} {v:<4} {res['mbps']:7.0f} MB/s (producer "
            f"{res['producer_mbps']:.0f} MB/s, load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
        return res

    runs = _common.interleaved(_A_VARIANTS, max(1, rounds), run)

    def med(v: str, key: str = "mbps") -> float:
        return _common.median(x[key] for x in runs[v])

    bare_mbps = med("bare")
    shadow: dict[int, dict[str, Any]] = {}
    for v in _A_VARIANTS[1:]:
        shadow[int(v[2:])] = {
            "mbps": med(v),
            "mbps_min": min(x["mbps"] for x in runs[v]),
            "mbps_max": max(x["mbps"] for x in runs[v]),
            "counted": min(x["counted"] for x in runs[v]),
            "data_bytes": med(v, "data_bytes"),
            "producer_mbps": med(v, "producer_mbps"),
            "kept_up": sum(bool(x["kept_up"]) for x in runs[v]),
            "ratio": med(v) / bare_mbps if bare_mbps else None,
            "paired_ratio": _common.paired_median(runs, v, "bare", "mbps"),
        }
    best = max(shadow, key=lambda k: shadow[k]["mbps"])
    return {
        "datagram_payload": CHUNK,
        "datagrams": runs["bare"][0]["datagrams"],
        "bytes_per_pass": runs["bare"][0]["bytes"],
        "rounds": len(runs["bare"]),
        "producer_mbps_bare_run": med("bare", "producer_mbps"),
        "bare_recv_mbps": bare_mbps,
        "bare_mbps_min": min(x["mbps"] for x in runs["bare"]),
        "bare_mbps_max": max(x["mbps"] for x in runs["bare"]),
        "bare_received": min(x["received"] for x in runs["bare"]),
        "bare_kept_up": sum(bool(x["kept_up"]) for x in runs["bare"]),
        "shadow_ingest_mbps": shadow[best]["mbps"],
        "shadow_best_rx_threads": best,
        "shadow_by_rx_threads": shadow,
        # medians over the rounds, as auth_bench's "x bare"; the paired ratio beside it
        "ratio": shadow[best]["ratio"],
        "paired_ratio": shadow[best]["paired_ratio"],
        "runs": runs,
    }


def _part_b(
    n_params: int, iterations: int, optimizer: str, rate_mbps: float, period_s: float
) -> dict[str, Any]:
    layout = _layout(n_params)
    _common.collect()  # the previous part's nodes, before this one allocates its own
    node, sock = _node(layout, optimizer, window=2)
    try:
        with _Producer(
            layout,
            sock.getsockname()[1],
            iterations,
            mode="stream",
            period_s=period_s,
            rate_mbps=rate_mbps,
            drain_s=120.0,
            bind_port=node.spec.trainers.addresses[0].port,
        ) as prod:
            t0 = time.time()
            prod.go()
            deadline = time.monotonic() + iterations * period_s + 30
            while time.monotonic() < deadline:
                now = node.status(timeline=0)
                if now["last_applied"] >= iterations - 1 or now["diverged_at"] is not None:
                    break
                time.sleep(0.05)
            t_done = time.time()
        st = node.status(timeline=iterations)
    finally:
        node.stop()
    tl = st["timeline"]
    per = [
        {
            "iteration": t["iteration"],
            "receive_s": t["last_chunk"] - t["first_chunk"],
            "ready_after_commit_s": t["ready"] - t["commit"],
            "apply_s": t["applied"] - t["ready"],
            "applied_at_s": t["applied"] - t0,
        }
        for t in tl
    ]
    applied = st["last_applied"] + 1
    # delay of each iteration: applied time minus the time its first chunk was due
    delays = [p["applied_at_s"] - p["iteration"] * period_s for p in per]
    keeps_up = (
        applied == iterations
        and bool(delays)
        and max(delays) <= 2 * period_s
        and delays[-1] - delays[0] < 0.5 * period_s
    )
    med = {
        k: statistics.median(p[k] for p in per) if per else None
        for k in ("receive_s", "ready_after_commit_s", "apply_s")
    }
    limit = (
        "keeps up"
        if keeps_up
        else "diverged: repair failed"
        if st["diverged_at"] is not None
        else (
            "apply (optimizer step)"
            if med["apply_s"] and med["apply_s"] > period_s / 2
            else "receive path (recv + CRC-32 + copy)"
            if med["receive_s"] and med["receive_s"] > period_s / 2
            else "loss and repair (NACK/RETX)"
        )
    )
    return {
        "params": sum(p.numel for p in layout.params),
        "bytes_per_iteration": layout.total_bytes,
        "optimizer": optimizer,
        "period_s": period_s,
        "producer_rate_mbps": rate_mbps,
        "iterations": iterations,
        "applied": applied,
        "wall_s": t_done - t0,
        "keeps_up_at_1_it_per_s": keeps_up,
        "limit": limit,
        "median": med,
        "per_iteration": per,
        "delays_s": delays,
        "counters": st["counters"],
        "nacks_sent": st["events"].get("nack_sent", 0),
        "diverged_at": st["diverged_at"],
        "repaired_bytes": st["events"].get("repaired_bytes", 0),
    }


def ingest_bench(
    n_params: int = 100_000_000,
    optimizers: Sequence[str] = ("sgd", "adamw"),
    iterations: int = 5,
    *,
    rate_mbps: float = 800.0,
    burst_params: int = 25_000_000,
    burst_iterations: int = 3,
    rounds: int = 5,
) -> dict[str, Any]:
    """Run part A (``rounds`` interleaved rounds), then part B once per optimizer; print a
    summary; return JSON-able results."""
    a = _part_a(burst_params, burst_iterations, rounds)
    sh = a["shadow_by_rx_threads"]
    print(
        f"[ingest] bare recv_into {a['bare_recv_mbps']:.0f} MB/s, shadow ingest "
        f"{a['shadow_ingest_mbps']:.0f} MB/s -> {100 * (a['ratio'] or 0):.0f}% (target >= 60%;"
        f" paired {100 * a['paired_ratio']:.0f}%; medians of {a['rounds']} rounds)"
        f" [1 rx thread {sh[1]['mbps']:.0f} MB/s, 2 rx threads {sh[2]['mbps']:.0f} MB/s];"
        f" producer offered {a['producer_mbps_bare_run']:.0f} MB/s (bare run); bare got "
        f"{a['bare_received']}/{a['datagrams']} datagrams, shadow counted "
        f"{sh[1]['counted']}/{sh[2]['counted']}; {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f}"
    )
    streams: dict[str, Any] = {}
    for optimizer in optimizers:
        b = _part_b(n_params, iterations, optimizer, rate_mbps, 1.0)
        streams[optimizer] = b
        m = b["median"]
        fmt = {k: "n/a" if v is None else f"{v:.2f}s" for k, v in m.items()}
        print(
            f"[stream] {b['params'] / 1e6:.0f}M params ({b['bytes_per_iteration'] / 1e6:.0f} MB)"
            f" per iteration, {optimizer}, paced at 1 it/s ({rate_mbps:.0f} MB/s bursts): "
            f"applied {b['applied']}/{b['iterations']}, keeps up: "
            f"{b['keeps_up_at_1_it_per_s']}; median receive {fmt['receive_s']}, ready after "
            f"COMMIT {fmt['ready_after_commit_s']}, apply {fmt['apply_s']}; limit: "
            f"{b['limit']}; NACKs {b['nacks_sent']}; per-iteration delay (applied - due) "
            f"{', '.join(f'{d:.2f}' for d in b['delays_s'])} s; load "
            f"{os.getloadavg()[0]:.1f}"
        )
    return {"ingest_vs_bare": a, "stream": streams, "cpus": os.cpu_count()}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--producer":
        _producer_main(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], action="append", default=None)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--rate", type=float, default=800.0, help="producer MB/s within a burst")
    ap.add_argument("--rounds", type=int, default=5, help="part A's interleaved rounds")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    res = ingest_bench(
        int(args.params),
        args.optimizer or ("sgd", "adamw"),
        args.iterations,
        rate_mbps=args.rate,
        rounds=args.rounds,
    )
    if args.json:
        _common.write_json(Path(args.json), res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
