"""Iteration time, bytes and CPU of an in-band job through the P4 target against the same ring
without shadowgrad, the ring without copies, mirror mode and plain gloo DDP, on the same model
and batches in the same run.

For each model size (``--sizes``, parameters of an MLP) it launches ``--world`` DDP ranks (gloo,
CPU, one intra-op thread each) once per variant and round:

* ``ddp``          -- plain DDP + AdamW, no shadowgrad (the baseline of ``ratio_to_ddp``)
* ``ring``         -- the clean ring, what a user runs without shadowgrad (the baseline of
                      the in-band ratios, ``ratio_to_ring`` and ``vs_ring``): no ``attach``;
                      the session's layout, ``LayoutReducer`` comm hook and ``RingAllReduce``
                      on the same link (frames through the same switch, ``JobSwitch(tap=False)``)
                      from the same trainer address, with the session's chunk size, RTO,
                      timeout and shard cuts, but no MAC key, nothing retained for NACKs
                      (``retain=0``: the FINAL bytes are never copied), no shadows (none run)
                      and no COMMITs
* ``ring_mac`` (only when asked for) -- the clean ring with the session's MAC key,
                      ``security.authenticate_data`` and ``authenticate_ring`` (the MACs on
                      ACKs and DATA that in-band carries): in-band rows get ``vs_ring_mac`` too
* ``mirror``       -- shadowgrad mirror mode: gloo all-reduce, then every rank sends its slice
                      of the reduced gradients to the shadows itself
* ``inband_notap`` -- in-band mode: the ring all-reduce crosses ``sg-switch-grpc`` running
                      ``p4/shadowgrad.p4`` on loopback UDP ports, programmed by the controller's
                      switch driver with everything *but* the tap (``JobSwitch(tap=False)``):
                      the same ring through the same switch, no copies. The shadows get only
                      COMMITs; they are told never to NACK the missing data (else the trainers
                      would resend all of it from their retained bytes, see below) and the
                      trainers' failure detection is off, so nothing re-seeds them either
* ``inband``       -- the same with the tap: the switch copies the ring's FINAL chunks to the
                      shadows of their shard
* ``inband_notap_repair`` (only when asked for) -- the empty tap with ordinary shadows: they
                      NACK what the switch did not copy and the trainers resend it by unicast

The shadows are ``--shadows`` real shadow nodes (2 shards x 2 replicas by default) as threads of
this process, so on a small machine they share the CPUs with the ranks and the switch process.
``--pin on`` puts the ranks on one half of this process's CPUs (``taskset -c``) and the switch
process and this process (the shadows' threads) on the other half (``sched_setaffinity``; on 2
cores: ranks on CPU 0, the rest on CPU 1); ``--pin both`` runs every variant unpinned and pinned,
the pinned rows named ``VARIANT@pinned`` (``"pinned": true``; their ratios are to the pinned
``ddp`` and ``ring``).

Per-iteration time is measured on rank 0 with ``time.perf_counter`` around forward + backward +
step (the first ``--warmup`` iterations are not measured); ``--rounds`` runs of every variant
are interleaved and their iterations pooled. The report gives, per size and variant:
min/p10/p25/median/p75/p90/max and IQR, the median's ratio to ``ddp`` and to ``ring`` in the
same run, the medians of forward / backward (the all-reduce ends in it) / step, CPU seconds per
measured iteration of the ranks, the switch process and the shadows, the switch counters (FINAL
chunks tagged per rank, DATA copies per shadow, drops, per-port frames, bytes and queue drops),
whether the shadows ended at the last iteration, each rank's ring counters, and the environment.
Per rank and iteration (``per_rank_per_iter``, its ``note`` says how each is counted): the bytes
and frames the switch received on the rank's port (whole run, over ``iterations_run`` = warmup
+ iters), the datagrams and bytes its ring link sent and its TCP bytes (gloo, the health
monitor's polls) in the measured iterations, its ring counters (DATA, RETX, ACK), its CPU
seconds (``process_time`` and ``getrusage``) and wall per measured iteration, and its whole
process's CPU seconds. Where a switch runs, ``switch_rate``: every frame it received per
iteration, the packet rate in the iterations and over the ranks' wall, and the switch process's
CPU per iteration in cores (near one: the Python switch is the ring's bottleneck). In-band rows
get ``vs_ring``: bytes, datagrams and CPU per iteration against the clean ring. Nothing is
asserted.

    .venv/bin/python bench/inband_bench.py          # 100K,1M params x 40 iterations x 2 rounds
    .venv/bin/python bench/inband_bench.py --sizes 300K --iters 20 --rounds 1 \\
        --variants ddp,ring,inband_notap,inband,inband_notap_repair --pin both

Results: ``bench/results/inband_bench.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("ddp", "ring", "mirror", "inband_notap", "inband")
#: not run by default: the empty tap with shadows that repair everything by NACK, and the clean
#: ring with the session's MACs (ACKs, and DATA with security.authenticate_data)
EXTRA_VARIANTS = ("inband_notap_repair", "ring_mac")
#: the clean rings: no attach, no shadows, no COMMITs, nothing retained
RING_VARIANTS = ("ring", "ring_mac")
CLASSES = 10


# --------------------------------------------------------------------------- the model


def parse_size(text: str) -> int:
    """``"100K"`` -> 100000, ``"1M"`` -> 1000000, ``"250000"`` -> 250000."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 100K, 1M)")
    return int(float(m[1]) * {"": 1, "k": 10**3, "m": 10**6}[m[2].lower()])


def width_for(params: int, depth: int) -> int:
    """Width ``w`` of ``depth`` x (Linear(w, w), Tanh) + Linear(w, 10) closest to ``params``."""
    a, b, c = depth, depth + CLASSES, CLASSES - params
    return max(8, round((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)))


def make_model(width: int, depth: int) -> Any:
    from torch import nn

    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    layers.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*layers)


def batch(step: int, rank: int, per_rank: int, width: int) -> tuple[Any, Any]:
    """Rank ``rank``'s share of step ``step``'s global batch (the same in every variant)."""
    import torch

    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    return torch.randn(per_rank, width, generator=g), torch.randint(
        0, CLASSES, (per_rank,), generator=g
    )


# --------------------------------------------------------------------------- worker


def clean_ring(ddp: Any, spec_path: str, rank: int, *, macs: bool = False) -> Any:
    """Variant ``ring``: the ring an in-band session of ``spec_path`` runs, without shadowgrad.

    The same layout (``from_module`` + ``Layout.build`` with the spec's shadows and
    replication, so the same buckets and shard cuts), the same :class:`LayoutReducer` comm hook,
    the same link (frames through the switch's loopback port with ``switch.loopback``, else
    UDP) bound to the same trainer address, and a :class:`RingConfig` with the session's job,
    layout digest, chunk size, RTO, timeout and cuts -- but no MAC key, no DATA MACs, nothing
    retained for NACKs (``retain=0``: the FINAL bytes are never copied), no shadows; nothing
    sends COMMITs. (The session's header ``layout`` field mixes in its generation; the field
    has the same size either way.) ``macs`` (variant ``ring_mac``): the session's key and
    ``security.authenticate_data``, so ACKs (and DATA) carry the session's MACs.
    """
    from shadowgrad.config import load_spec
    from shadowgrad.frames import MAX_FRAMED_DATAGRAM
    from shadowgrad.layout import Layout, from_module
    from shadowgrad.trainer_hooks._plan import param_map
    from shadowgrad.trainer_hooks._session import NETWORK_DATAGRAM, _is_loopback
    from shadowgrad.trainer_hooks.hooks import LayoutReducer, layout_hook
    from shadowgrad.trainer_hooks.link import FrameLink, UdpLink
    from shadowgrad.trainer_hooks.ring import RingAllReduce, RingConfig
    from shadowgrad.wire import HEADER_SIZE, MAC_SIZE, MAX_DATAGRAM

    spec = load_spec(spec_path)
    module = ddp.module
    # what Shadowgrad.__init__ does (no software tap; chunk_bytes and layout not given)
    cap_mb: float | None = None
    if not getattr(ddp, "bucket_bytes_cap_default", True):
        cap_mb = ddp.bucket_bytes_cap / 2**20
    params, buckets = from_module(module, cap_mb)
    layout = Layout.build(params, buckets, spec.shadows.count, spec.shadows.replication)
    sw = spec.switch
    frames = spec.job.mode == "in-band" and sw.target != "none" and sw.loopback is not None
    hosts = [a.host for a in spec.shadows.addresses]
    room = (
        MAX_FRAMED_DATAGRAM
        if frames
        else MAX_DATAGRAM
        if all(map(_is_loopback, hosts))
        else NETWORK_DATAGRAM
    )
    tag = MAC_SIZE if spec.security.authenticate_data else 0
    chunk_bytes = (room - HEADER_SIZE - tag) // 64 * 64
    # what Shadowgrad._bind does for the ring's link
    ep = spec.trainers.addresses[rank]
    link: Any
    if frames:
        sep = sw.loopback_endpoint(sw.trainer_ports[rank])
        peers = {(a.host, a.port): sw.trainer_mac(i) for i, a in enumerate(spec.trainers.addresses)}
        peers.update(
            {(a.host, a.port): sw.shadow_mac(k) for k, a in enumerate(spec.shadows.addresses)}
        )
        link = FrameLink(
            (ep.host, ep.port), switch=(sep.host, sep.port), mac=sw.trainer_mac(rank), peers=peers
        )
    else:
        link = UdpLink((ep.host, ep.port))
    # what Shadowgrad._start_ring does, less the shadows
    t = spec.timeouts
    cfg = RingConfig(
        job=spec.job.id,
        layout=layout.digest64,
        chunk_bytes=chunk_bytes,
        rto_s=min(0.05, t.gap_repair_s / 2),
        timeout_s=max(30.0, 10 * t.failure_detect_s),
        retain=0,
        cuts=RingConfig.shard_cuts(layout.bucket_routes),
        key=spec.mac_key() if macs else None,
        authenticate_data=macs and spec.security.authenticate_data,
        authenticate_ring=spec.security.authenticate_ring,
        shadows=(),
    )
    addrs = [(a.host, a.port) for a in spec.trainers.addresses]
    ring = RingAllReduce(rank, len(addrs), link, addrs, cfg)
    reducer: LayoutReducer  # the reduce fn reads the reducer's iteration, as the session's does
    reducer = LayoutReducer(
        layout,
        param_map(module, layout),
        reduce=lambda b, flat: ring.submit(reducer.iteration, b, flat),
    )
    ddp.register_comm_hook(reducer, layout_hook)
    return ring.start()


def count_sends(link: Any) -> list[int]:
    """Count every datagram ``link`` sends from now on: ``[datagrams, bytes, sealed]`` (UDP
    payload bytes; a frame through the switch adds its Ethernet/IPv4/UDP headers on the switch
    port; ``sealed``: those whose header has the MAC flag, i.e. carry a MAC trailer)."""
    from shadowgrad.wire import HEADER_FIELDS, Flag

    # the header's flags byte (every part list starts with the header)
    at = sum(w for _n, w in HEADER_FIELDS[: [n for n, _w in HEADER_FIELDS].index("flags")]) // 8
    mac = int(Flag.MAC)
    sent = [0, 0, 0]
    inner = link.send

    def send(parts: Any, addr: Any) -> bool:
        sent[0] += 1
        sent[1] += sum(map(len, parts))
        if len(parts[0]) > at and parts[0][at] & mac:
            sent[2] += 1
        ok: bool = inner(parts, addr)
        return ok

    link.send = send  # an instance attribute: the session's COMMIT sends go through it too
    return sent


def tcp_bytes_sent() -> int | None:
    """Bytes this process's open TCP sockets sent and had acknowledged (``tcpi_bytes_acked``
    of ``TCP_INFO``, Linux): gloo's all-reduce traffic and the rendezvous store's."""
    import socket
    import struct

    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    total = 0
    for name in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        with s:  # closes the duplicate only
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
            except OSError:
                continue
            if len(info) >= 128:
                total += struct.unpack_from("Q", info, 120)[0]
    return total


def _by_thread(cpu: dict[str, float]) -> dict[str, float]:
    """CPU seconds by thread name, the ranks' suffixes (``shadowgrad-ring-r2``) dropped, so
    the ranks and the variants line up; threads under 0.1 ms left out."""
    out: dict[str, float] = {}
    for name, v in cpu.items():
        key = re.sub(r"-r\d+$", "", name)
        out[key] = out.get(key, 0.0) + v
    return {k: v for k, v in out.items() if abs(v) >= 1e-4}


def _rusage_cpu_s() -> float:
    """user + system CPU seconds of this whole process so far (every thread), getrusage."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = make_model(args.width, args.depth)
    nparams = sum(p.numel() for p in net.parameters())
    model = DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sg: Any = None
    ring: Any = None
    sent: list[int] | None = None  # [datagrams, bytes] the ring's link sent
    t_start = time.perf_counter()
    if args.variant in RING_VARIANTS:
        ring = clean_ring(model, args.spec, rank, macs=args.variant == "ring_mac")
        sent = count_sends(ring.link)
        dist.barrier()  # every rank's link is bound before the first datagram
    elif args.variant != "ddp":
        from shadowgrad.trainer_hooks import attach

        sg = attach(model, opt, args.spec)
        sg.restore_or_start()
        if sg.ring is not None:
            sent = count_sends(sg.ring.link)
    t_start = time.perf_counter() - t_start
    times: list[float] = []
    phases: list[tuple[float, float, float]] = []  # forward, backward (+ reduction), step
    cpu0 = wall0 = ru0 = 0.0
    threads0: dict[str, float] = {}
    faults0: dict[str, float] = {}
    tcp0: int | None = None
    sent0 = [0, 0]
    for it in range(args.warmup + args.iters):
        if it == args.warmup:
            if rank == 0:
                print("MEASURE begin", flush=True)
            tcp0, sent0 = tcp_bytes_sent(), list(sent or (0, 0))
            cpu0, ru0, wall0 = time.process_time(), _rusage_cpu_s(), time.perf_counter()
            threads0 = _common.thread_cpu_s()
            faults0 = _common.thread_faults()
        x, y = batch(it, rank, args.batch, args.width)
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        if sg is not None:
            sg.backward(loss)
            t2 = time.perf_counter()
            sg.step()
        else:
            loss.backward()  # type: ignore[no-untyped-call]
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if it >= args.warmup:
            times.append(t3 - t0)
            phases.append((t1 - t0, t2 - t1, t3 - t2))
    # this rank's CPU time (all its threads: training, ring engine, sender, health monitor)
    # over the measured iterations, their wall time, getrusage(RUSAGE_SELF) user+sys; TCP
    # bytes sent (gloo), the ring link's datagrams and bytes; and (below) the whole process's
    # getrusage CPU seconds, start to close
    mine: dict[str, Any] = {
        "rank_loop_cpu_s": time.process_time() - cpu0,
        "rank_loop_wall_s": time.perf_counter() - wall0,
        "rank_loop_rusage_cpu_s": _rusage_cpu_s() - ru0,
        # where it went, by thread (the rank suffix of shadowgrad's thread names dropped)
        "rank_thread_cpu_s": _by_thread(_common.cpu_delta(threads0, _common.thread_cpu_s(), 1)),
        # minor page faults by thread (fresh zeroed pages: buffers allocated and freed per
        # datagram show here)
        "rank_thread_faults": _by_thread(_common.cpu_delta(faults0, _common.thread_faults(), 1)),
    }
    tcp1 = tcp_bytes_sent()
    mine["rank_tcp_bytes"] = None if tcp0 is None or tcp1 is None else tcp1 - tcp0
    mine["rank_link_datagrams"] = None if sent is None else sent[0] - sent0[0]
    mine["rank_link_bytes"] = None if sent is None else sent[1] - sent0[1]
    mine["rank_link_sealed"] = None if sent is None else sent[2] - sent0[2]
    if rank == 0:
        print("MEASURE end", flush=True)
    extra: dict[str, Any] = {}
    t_close = time.perf_counter()
    if sg is not None:
        sg.flush(30)
        extra = sg.stats()
        ring = sg.ring
        sg.close(args.close_timeout)
        if ring is not None:
            extra["ring_max_send_wait_s"] = ring.max_send_wait_s
            # iterations of FINAL bytes kept for the shadows' NACKs: until that many are held,
            # each iteration's FINAL datagrams take fresh memory (thread_faults_per_iter)
            extra["ring_retain"] = ring.cfg.retain
    elif ring is not None:
        ring.close(2.0)
        extra["ring_max_send_wait_s"] = ring.max_send_wait_s
    t_close = time.perf_counter() - t_close
    mine["rank_process_cpu_s"] = _rusage_cpu_s()  # the whole rank process, start to close
    ring_stats = _common.all_ranks(None if ring is None else dict(ring.stats))
    if any(ring_stats):  # every rank's ring counters (data_sent, retx, rx_duplicate, ...)
        extra["ring_stats"] = ring_stats
    per_rank = _common.by_rank(mine)
    if rank == 0:
        _common.print_result(
            {
                "variant": args.variant,
                "params": nparams,
                "width": args.width,
                "depth": args.depth,
                "last_iteration": args.warmup + args.iters - 1,
                "times": times,
                "phases": phases,
                "start_s": t_start,
                "close_s": t_close,
                **per_rank,  # rank_loop_cpu_s ... rank_process_cpu_s, each by rank
                "session": extra,
            },
            default=str,
        )
    dist.barrier()
    dist.destroy_process_group()  # the rank then leaves at once (_common.parse_bench_args)


# --------------------------------------------------------------------------- launcher


def spread(xs: list[float]) -> dict[str, float]:
    """min, p10, p25, p50, p75, p90, max, IQR and mean of ``xs`` (seconds)."""
    q = statistics.quantiles(xs, n=20, method="inclusive") if len(xs) > 1 else [xs[0]] * 19
    p25, p75 = q[4], q[14]
    return {
        "min": min(xs),
        "p10": q[1],
        "p25": p25,
        "median": statistics.median(xs),
        "p75": p75,
        "p90": q[17],
        "max": max(xs),
        "iqr": p75 - p25,
        "mean": statistics.fmean(xs),
        "n": len(xs),
    }


class RanksFailedError(RuntimeError):
    """A launch of the ranks that did not end with every rank's exit status 0."""

    def __init__(self, what: str, outputs: list[str]) -> None:
        super().__init__(what)
        self.outputs = outputs

    def report(self) -> str:
        return str(self) + "".join(f"\n--- rank {r}\n{o}" for r, o in enumerate(self.outputs))


def run_ranks(
    args: argparse.Namespace,
    variant: str,
    width: int,
    spec_path: Path | None,
    close_timeout: float,
    *,
    probe: Callable[[], dict[str, float | None]] | None = None,
    cpus: list[int] | None = None,
) -> dict[str, Any]:
    """Run ``--world`` ranks of the worker (on ``cpus`` only, if given); every child is reaped
    (killed on a timeout).

    ``probe()`` (CPU counters of this process and the switch) is sampled when rank 0 reports the
    start and the end of its measured iterations; the differences go to ``res["window_cpu_s"]``.
    """
    ranks = _common.start_ranks(
        __file__,
        args,
        cpus=cpus,
        variant=variant,
        width=width,
        depth=args.depth,
        close_timeout=close_timeout,
        spec=spec_path or "",
    )
    samples: dict[str, dict[str, float | None]] = {}
    try:
        deadline = time.monotonic() + args.timeout
        while (
            probe is not None
            and len(samples) < 2
            and time.monotonic() < deadline
            and any(p.poll() is None for p in ranks.procs)
        ):
            text = ranks.output(0)
            for mark in ("begin", "end"):
                if mark not in samples and f"\nMEASURE {mark}\n" in "\n" + text:
                    samples[mark] = probe()
            time.sleep(0.01)
        codes = ranks.wait(max(0.1, deadline - time.monotonic()))
        out = ranks.output(0)
        if codes != [0] * args.world:
            raise RanksFailedError(
                f"{variant}: exit codes {codes} (timeout {args.timeout}s)",
                [ranks.output(r) for r in range(args.world)],
            )
    finally:
        ranks.close()
    res = _common.rank_result(out)
    if len(samples) == 2:
        b, e = samples["begin"], samples["end"]
        res["window_cpu_s"] = {
            k: None if b[k] is None or e[k] is None else e[k] - b[k]  # type: ignore[operator]
            for k in b
        }
    return res


def _proc_cpu_s(pid: int) -> float | None:
    """user + system CPU seconds of process ``pid`` (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_halves() -> tuple[list[int], list[int]]:
    """(A, B): the CPUs this process may use, split into two disjoint halves (``--pin``: the
    ranks on A; the switch and this process, the shadows' threads, on B)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit(f"--pin needs at least 2 CPUs, this process may use {cpus}")
    half = len(cpus) // 2
    return cpus[:half], cpus[half:]


def set_affinity(pid: int, cpus: Any) -> None:
    """Every thread of process ``pid`` on ``cpus`` (``sched_setaffinity`` sets one thread;
    threads started later inherit their starter's)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = [str(pid)]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that just ended
            os.sched_setaffinity(int(tid), cpus)


def _shadow_summary(cluster: Any) -> list[dict[str, Any]]:
    out = []
    for s in cluster.status():
        c = s.get("counters", {})
        out.append(
            {
                "last_applied": s.get("last_applied"),
                "diverged_at": s.get("diverged_at"),
                "lag": s.get("lag"),
                "counters": {k: c[k] for k in sorted(c)},
            }
        )
    return out


def _switch_summary(final: dict[str, Any]) -> dict[str, Any]:
    """Per switch port: frames in/out, queue drops, pauses (from the target's final counters)."""
    ports = final.get("ports", {})
    queues = final.get("queues", {})
    out: dict[str, Any] = {}
    for port in sorted(ports, key=int):
        p, q = ports[port], queues.get(port, {})
        out[port] = {
            "rx_packets": p.get("rx_packets"),
            "rx_bytes": p.get("rx_bytes"),
            "tx_packets": p.get("tx_packets"),
            "tx_bytes": p.get("tx_bytes"),
            "max_queue_depth": q.get("max_depth"),
            "queue_drops": sum((q.get("drops") or {}).values()),
            "paused_s": q.get("paused_s"),
        }
    return {
        "ports": out,
        "switch_drops": final.get("switch_drops"),
        "dataplane_drops": final.get("dataplane_drops"),
    }


def run_variant(
    args: argparse.Namespace,
    variant: str,
    width: int,
    layout: Any,
    tmp: Path,
    *,
    pinned: bool = False,
) -> dict[str, Any]:
    """One variant: its switch and shadows (if any) around one launch of the ranks.

    ``pinned``: the ranks on one half of this process's CPUs, the switch and this process (the
    shadows' threads) on the other (:func:`cpu_halves`); this process's affinity is restored
    afterwards."""
    if not pinned:
        return _run_variant(args, variant, width, layout, tmp, ranks_cpus=None)
    mine = os.sched_getaffinity(0)
    ranks_cpus, other = cpu_halves()
    # before the switch and the shadows start: their processes and threads inherit it
    set_affinity(os.getpid(), other)
    try:
        res = _run_variant(args, variant, width, layout, tmp, ranks_cpus=ranks_cpus)
    finally:
        set_affinity(os.getpid(), mine)
    res["affinity"] = {"ranks": ranks_cpus, "switch_and_shadows": other}
    return res


def _run_variant(
    args: argparse.Namespace,
    variant: str,
    width: int,
    layout: Any,
    tmp: Path,
    *,
    ranks_cpus: list[int] | None,
) -> dict[str, Any]:
    from shadowgrad.bmv2_testbed.inband import JobSwitch
    from shadowgrad.config import parse_spec
    from shadowgrad.specs import loopback_spec, spec_toml, switch_spec
    from shadowgrad.testing.cluster import shadow_cluster

    if variant == "ddp":
        t0 = time.monotonic()
        res = run_ranks(args, variant, width, None, args.close_timeout, cpus=ranks_cpus)
        res["ranks_wall_s"] = time.monotonic() - t0
        res["iterations_run"] = args.warmup + args.iters
        return res
    timeouts = {"gap_repair": args.gap_repair, "heartbeat": "200ms", "rpc": "5s"}
    if variant == "mirror":
        doc = loopback_spec(
            world=args.world, shadows=args.shadows, replication=args.replication, **timeouts
        )
    else:
        doc = switch_spec(
            world=args.world, shadows=args.shadows, replication=args.replication, **timeouts
        )
    spec = parse_spec(doc, env={})
    spec_path = tmp / f"{variant}-{width}.toml"
    spec_path.write_text(spec_toml(doc))
    shadow_spec = spec
    close_timeout = args.close_timeout
    if variant == "inband_notap":
        # with an empty tap the shadows get COMMITs only; a shadow that holds COMMIT(i) and no
        # data NACKs after timeouts.gap_repair and the trainers resend every FINAL chunk from
        # their retained bytes (variant inband_notap_repair). Here the shadows never repair (a
        # gap_repair longer than the run; the trainers' spec is unchanged), so nothing but the
        # ring and the COMMITs crosses the switch. They cannot reach the last iteration: the
        # ranks' close() gives up on them after a short timeout (outside the measurement).
        # The trainers' health monitor would see them stuck after timeouts.failure_detect and
        # re-seed them (a full state load during the measurement): a long failure_detect in
        # the trainers' spec too (it only sets failure detection, nothing on the happy path).
        shadow_spec = parse_spec(
            {**doc, "timeouts": {**doc["timeouts"], "gap_repair": "3600s"}}, env={}
        )
        doc["timeouts"]["failure_detect"] = "3600s"
        spec = parse_spec(doc, env={})
        spec_path.write_text(spec_toml(doc))
        close_timeout = min(close_timeout, 2.0)
    last = args.warmup + args.iters - 1
    settle = 1.0 if variant == "inband_notap" else args.settle
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        sw = None
        if variant != "mirror":
            sw = stack.enter_context(JobSwitch(spec, layout, tap=variant == "inband"))
            if ranks_cpus is not None:  # started with this process's affinity; made sure
                set_affinity(sw.proc.pid, os.sched_getaffinity(0))
        # the clean ring: no shadows at all (nothing sends COMMITs)
        cluster = (
            None if variant in RING_VARIANTS else stack.enter_context(shadow_cluster(shadow_spec))
        )
        out["setup_s"] = time.monotonic() - t0
        pid = sw.proc.pid if sw is not None else None

        def probe() -> dict[str, float | None]:
            # this process: the shadows' threads (and the P4Runtime client); the switch is a
            # process of its own
            return {
                "shadows": None if cluster is None else time.process_time(),
                "switch": None if pid is None else _proc_cpu_s(pid),
            }

        t0 = time.monotonic()
        res = run_ranks(
            args, variant, width, spec_path, close_timeout, probe=probe, cpus=ranks_cpus
        )
        out["ranks_wall_s"] = time.monotonic() - t0
        if cluster is not None:
            t0 = time.monotonic()
            out["shadows_at_last"] = cluster.wait_applied(last, timeout_s=settle)
            out["shadows_settle_s"] = time.monotonic() - t0
            out["shadows"] = _shadow_summary(cluster)
        if sw is not None:
            c = sw.counters()
            out["switch_counters"] = {
                "tagged": c["tagged"],
                "commits": c["commits"],
                "shadow_copies": c["shadow_copies"],
                "shard_copies": c["shard_copies"],
                "drops": {k: v for k, v in c["drops"].items() if v[0]},
            }
        t0 = time.monotonic()
        stack.close()
        out["teardown_s"] = time.monotonic() - t0
        if sw is not None:
            out["switch_ports"] = _switch_summary(sw.final_counters)
            ports = out["switch_ports"]["ports"]
            # what each rank sent into the switch over the whole run (its trainer port's
            # received frames, Ethernet/IPv4/UDP headers included), and everything the switch
            # received on any port
            tports = [str(p) for p in spec.switch.trainer_ports]
            out["switch_rank_rx_bytes"] = [(ports.get(p) or {}).get("rx_bytes") for p in tports]
            out["switch_rank_rx_packets"] = [(ports.get(p) or {}).get("rx_packets") for p in tports]
            out["switch_rx_packets"] = sum(p.get("rx_packets") or 0 for p in ports.values())
    out["iterations_run"] = args.warmup + args.iters
    res.update(out)
    return res


def _per_rank(runs: list[dict[str, Any]], key: str, per: int) -> list[float | None] | None:
    """``run[key][rank] / per`` for every rank, the median over the rounds (None where absent)."""
    if not runs or not runs[0].get(key):
        return None
    out: list[float | None] = []
    for k in range(len(runs[0][key])):
        vals = [r[key][k] / per for r in runs if r.get(key) and r[key][k] is not None]
        out.append(statistics.median(vals) if vals else None)
    return out


def _threads_per_iter(
    runs: list[dict[str, Any]], per: int, key: str = "rank_thread_cpu_s"
) -> dict[str, float] | None:
    """CPU seconds per iteration by thread name, all ranks together (``rank_thread_cpu_s``;
    ``key="rank_thread_faults"``: minor page faults), the median over the rounds; the largest
    first."""
    names = {n for r in runs for per_rank in r.get(key) or [] for n in per_rank}
    if not names:
        return None
    out = {}
    for n in names:
        vals = [sum(per_rank.get(n, 0.0) for per_rank in r[key]) / per for r in runs if r.get(key)]
        out[n] = statistics.median(vals)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _ring_per_rank(runs: list[dict[str, Any]], counter: str, per: int) -> list[float | None] | None:
    """Ring counter ``counter`` of every rank (whole run) / ``per``, the median over the rounds."""
    vals = []
    for r in runs:
        rs = (r.get("session") or {}).get("ring_stats")
        if rs:
            vals.append({"x": [None if st is None else st.get(counter, 0) for st in rs]})
    return _per_rank(vals, "x", per)


def _total(xs: list[float | None] | None) -> float | None:
    return None if xs is None or any(x is None for x in xs) else sum(x for x in xs if x)


def summarize(size: str, variant: str, runs: list[dict[str, Any]], buckets: int) -> dict[str, Any]:
    """One row of the report: the iterations of every round of ``variant`` pooled."""
    times = [t for r in runs for t in r["times"]]
    phases = list(zip(*[ph for r in runs for ph in r.pop("phases")], strict=True))
    first = runs[0]

    its = len(first["times"])

    def per_iter(get: Callable[[dict[str, Any]], float | None]) -> float | None:
        vals = [v / its for v in map(get, runs) if v is not None]
        return statistics.median(vals) if vals else None

    entry: dict[str, Any] = {
        "size": size,
        "variant": variant,
        "params": first["params"],
        "width": first["width"],
        "depth": first["depth"],
        "buckets": buckets,
        "stats_s": spread(times),
        "phase_median_s": {
            k: statistics.median(v)
            for k, v in zip(("forward", "backward", "step"), phases, strict=True)
        },
        "round_medians_s": [r["median_s"] for r in runs],
        # CPU seconds per measured iteration (median over the rounds): all ranks together,
        # the switch process, this process (the shadows' threads)
        "cpu_per_iter_s": {
            "ranks": per_iter(lambda r: sum(r["rank_loop_cpu_s"])),
            "switch": per_iter(lambda r: (r.get("window_cpu_s") or {}).get("switch")),
            "shadows": per_iter(lambda r: (r.get("window_cpu_s") or {}).get("shadows")),
        },
        "shadows_at_last": None
        if "shadows_at_last" not in first
        else all(r["shadows_at_last"] for r in runs),
    }
    ran = first["iterations_run"]
    # per rank and iteration, the median over the rounds
    pr: dict[str, Any] = {
        "note": "switch_rx_*: the frames the switch received on the rank's trainer port over "
        "the whole run (start, warmup, measured iterations, close; Ethernet/IPv4/UDP headers "
        "included) / iterations_run (warmup + iters); ring_*: the rank's ring counters "
        "(DATA first sends, retransmissions, ACKs, NACK repairs) over the whole run / "
        "iterations_run; link_*: the datagrams (UDP payload "
        "bytes) the rank's ring link sent during the measured iterations / iters; tcp_bytes: "
        "the rank's TCP bytes sent and acknowledged (gloo) during the measured iterations / "
        "iters; cpu_s: time.process_time, rusage_cpu_s: getrusage(RUSAGE_SELF) user+sys, "
        "wall_s: perf_counter, over the measured iterations / iters; process_cpu_s: the "
        "whole rank process's getrusage CPU seconds, start to close (not per iteration)",
        "iterations_run": ran,
        "switch_rx_bytes": _per_rank(runs, "switch_rank_rx_bytes", ran),
        "switch_rx_packets": _per_rank(runs, "switch_rank_rx_packets", ran),
        "link_bytes": _per_rank(runs, "rank_link_bytes", its),
        "link_datagrams": _per_rank(runs, "rank_link_datagrams", its),
        "link_sealed": _per_rank(runs, "rank_link_sealed", its),
        "ring_data": _ring_per_rank(runs, "data_sent", ran),
        "ring_retx": _ring_per_rank(runs, "retx", ran),
        "ring_acks": _ring_per_rank(runs, "ack_sent", ran),
        "ring_nack_retx": _ring_per_rank(runs, "nack_retx", ran),
        "tcp_bytes": _per_rank(runs, "rank_tcp_bytes", its),
        "cpu_s": _per_rank(runs, "rank_loop_cpu_s", its),
        "rusage_cpu_s": _per_rank(runs, "rank_loop_rusage_cpu_s", its),
        "wall_s": _per_rank(runs, "rank_loop_wall_s", its),
        "process_cpu_s": _per_rank(runs, "rank_process_cpu_s", 1),
    }
    entry["per_rank_per_iter"] = pr
    # all ranks' CPU per iteration by thread: where an in-band rank's CPU goes beyond the ring's
    entry["thread_cpu_per_iter_s"] = _threads_per_iter(runs, its)
    entry["thread_faults_per_iter"] = _threads_per_iter(runs, its, "rank_thread_faults")
    if "switch_rx_packets" in first:
        # the software switch's load: every frame it received (all ports) per iteration
        # run, that over the mean measured iteration (the rate while training), that over
        # the ranks' whole wall (process start to exit), and the switch process's CPU per
        # iteration over the median iteration (near 1 core or more: the switch can be the
        # ring's bottleneck; it is one Python process)
        pkts = statistics.median(r["switch_rx_packets"] for r in runs)
        mean_it = statistics.fmean(times)
        sw_cpu = entry["cpu_per_iter_s"]["switch"]
        entry["switch_rate"] = {
            "rx_packets": pkts,
            "rx_packets_per_iter": pkts / ran,
            "pps_iterations": pkts / ran / mean_it if mean_it else None,
            "pps_ranks_wall": statistics.median(
                r["switch_rx_packets"] / r["ranks_wall_s"] for r in runs
            ),
            "cpu_cores": None if sw_cpu is None else sw_cpu / entry["stats_s"]["median"],
        }
    entry["runs"] = runs
    cpu = [v for v in entry["cpu_per_iter_s"].values() if v is not None]
    # everything runs on this host's cores: an iteration cannot be shorter than all the CPU
    # it costs spread over them (close to the median where the host is CPU bound)
    entry["cpu_bound_iter_s"] = sum(cpu) / (os.cpu_count() or 1)
    return entry


def thread_excess(
    entry: dict[str, Any], base: dict[str, Any], key: str = "thread_cpu_per_iter_s"
) -> dict[str, float] | None:
    """``entry``'s CPU seconds per iteration (all ranks) by thread less ``base``'s, the
    largest first: which threads the in-band ranks' extra CPU runs on (the ring engine, the
    training thread, the health monitor, the COMMIT sender, ZeroMQ's I/O threads);
    ``key="thread_faults_per_iter"``: the same for minor page faults."""
    a, b = entry.get(key), base.get(key)
    if not a or not b:
        return None
    d = {n: a.get(n, 0.0) - b.get(n, 0.0) for n in set(a) | set(b)}
    return dict(sorted(d.items(), key=lambda kv: -abs(kv[1])))


def compare(entry: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``entry`` against ``base`` (the clean ring): ratios of the median iteration, of the
    bytes per iteration (all ranks: into the switch, out of the ring links) and of the ranks'
    CPU seconds per iteration, and the CPU difference by thread (``thread_cpu_excess_s``)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    pe, pb = entry["per_rank_per_iter"], base["per_rank_per_iter"]
    return {
        "median": ratio(entry["stats_s"]["median"], base["stats_s"]["median"]),
        "switch_rx_bytes_per_iter": ratio(
            _total(pe["switch_rx_bytes"]), _total(pb["switch_rx_bytes"])
        ),
        "link_bytes_per_iter": ratio(_total(pe["link_bytes"]), _total(pb["link_bytes"])),
        "link_datagrams_per_iter": ratio(
            _total(pe["link_datagrams"]), _total(pb["link_datagrams"])
        ),
        "cpu_per_iter": ratio(_total(pe["cpu_s"]), _total(pb["cpu_s"])),
        "rusage_cpu_per_iter": ratio(_total(pe["rusage_cpu_s"]), _total(pb["rusage_cpu_s"])),
        "thread_cpu_excess_s": thread_excess(entry, base),
        "thread_faults_excess": thread_excess(entry, base, "thread_faults_per_iter"),
    }


def _fmt(xs: list[float | None] | None, scale: float, spec: str) -> str:
    return "-" if xs is None else "/".join("-" if x is None else f"{x * scale:{spec}}" for x in xs)


def print_row(e: dict[str, Any]) -> None:
    st, pm = e["stats_s"], e["phase_median_s"]
    ratio = "-" if e["ratio_to_ddp"] is None else f"{e['ratio_to_ddp']:.2f}x"
    ring = "-" if e.get("ratio_to_ring") is None else f"{e['ratio_to_ring']:.3f}x"
    at_last = e["shadows_at_last"]
    pr = e["per_rank_per_iter"]
    print(
        f"{e['size']:>5} {e['params'] / 1e6:6.3f}M  {e['variant']:<26} median "
        f"{st['median'] * 1e3:7.1f} ms  p10/p90 {st['p10'] * 1e3:6.1f}/{st['p90'] * 1e3:6.1f}"
        f"  IQR {st['iqr'] * 1e3:6.1f}  ratio {ratio:>6} (ring {ring})  fwd/bwd/step "
        f"{pm['forward'] * 1e3:.1f}/{pm['backward'] * 1e3:.1f}/{pm['step'] * 1e3:.1f} ms"
        + "  cpu/iter ranks/switch/shadows "
        + "/".join("-" if v is None else f"{v * 1e3:.0f}" for v in e["cpu_per_iter_s"].values())
        + f" ms (/{os.cpu_count()} cores: {e['cpu_bound_iter_s'] * 1e3:.0f} ms)"
        + ("" if at_last is None else f"  shadows at last: {at_last}"),
        flush=True,
    )
    # per rank and iteration (see per_rank_per_iter.note in the JSON)
    line = (
        f"{'':15}per rank/iter: switch rx {_fmt(pr['switch_rx_bytes'], 1, '.0f')} B, "
        f"link {_fmt(pr['link_bytes'], 1, '.0f')} B in {_fmt(pr['link_datagrams'], 1, '.1f')} "
        f"datagrams (ring DATA/RETX/ACK {_fmt(pr['ring_data'], 1, '.1f')} | "
        f"{_fmt(pr['ring_retx'], 1, '.1f')} | {_fmt(pr['ring_acks'], 1, '.1f')}), "
        f"tcp {_fmt(pr['tcp_bytes'], 1, '.0f')} B, "
        f"cpu {_fmt(pr['cpu_s'], 1e3, '.1f')} ms (rusage {_fmt(pr['rusage_cpu_s'], 1e3, '.1f')})"
        f", wall {_fmt(pr['wall_s'], 1e3, '.1f')} ms"
    )
    rate = e.get("switch_rate")
    if rate is not None:
        cores = rate["cpu_cores"]
        line += (
            f"; switch {rate['rx_packets_per_iter']:.0f} pkts/iter, "
            f"{rate['pps_iterations'] or 0:.0f} pkt/s in iterations "
            f"({rate['pps_ranks_wall']:.0f} over the ranks' wall), "
            + ("-" if cores is None else f"{cores:.2f}")
            + " cores"
        )
    for base in ("ring", "ring_mac"):
        vs = e.get(f"vs_{base}")
        if vs:
            line += f"; vs {base}: " + ", ".join(
                f"{k} {'-' if v is None else f'{v:.4f}x'}"
                for k, v in vs.items()
                if k not in ("median", "thread_cpu_excess_s", "thread_faults_excess")
            )
            excess = vs.get("thread_cpu_excess_s")
            if excess:
                line += (
                    " (CPU ms/iter by thread: "
                    + ", ".join(f"{n} {v * 1e3:+.2f}" for n, v in list(excess.items())[:6])
                    + ")"
                )
    print(line, flush=True)


def environment() -> dict[str, Any]:
    import torch

    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg(),
        "git_commit": commit or None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="ddp", help=argparse.SUPPRESS)
    ap.add_argument("--width", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--spec", default="", help=argparse.SUPPRESS)
    ap.add_argument(
        "--sizes", default="100K,1M", help="comma list of parameter counts (100K, 1M, 250000)"
    )
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma list of " + ",".join(VARIANTS + EXTRA_VARIANTS),
    )
    ap.add_argument("--iters", type=int, default=40, help="measured iterations per variant")
    ap.add_argument("--warmup", type=int, default=5, help="iterations not measured")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="runs of every variant, interleaved; their iterations are pooled",
    )
    ap.add_argument("--world", type=int, default=4, help="DDP ranks (gloo, CPU)")
    ap.add_argument("--depth", type=int, default=4, help="hidden Linear(w, w) layers of the MLP")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and iteration")
    ap.add_argument("--shadows", type=int, default=4, help="shadow nodes (real, in-process)")
    ap.add_argument("--replication", type=int, default=2)
    ap.add_argument("--gap-repair", default="100ms", help="timeouts.gap_repair of the spec")
    ap.add_argument(
        "--settle",
        type=float,
        default=30.0,
        help="seconds to wait for the shadows to apply the last iteration",
    )
    ap.add_argument(
        "--close-timeout", type=float, default=30.0, help="sg.close() timeout in the ranks (s)"
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="per variant (s)")
    ap.add_argument(
        "--retries",
        type=int,
        default=1,
        help="relaunches of a variant whose ranks failed (recorded in the JSON)",
    )
    ap.add_argument(
        "--pin",
        choices=("off", "on", "both"),
        default="off",
        help="on: the ranks on one half of the CPUs, the switch and the shadows on the other "
        "(rows named VARIANT@pinned); both: every variant unpinned and pinned",
    )
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "inband_bench.json"))
    args = _common.parse_bench_args(ap, worker)  # a rank never returns from it
    import torch

    from shadowgrad.bmv2_testbed.inband import compile_product
    from shadowgrad.layout import Layout, from_module

    torch.set_num_threads(1)  # the in-process shadows: one intra-op thread, like the ranks
    variants = [v for v in args.variants.split(",") if v]
    bad = sorted(set(variants) - set(VARIANTS) - set(EXTRA_VARIANTS))
    if bad:
        ap.error(f"unknown variants {bad}")
    pins = {"off": [False], "on": [True], "both": [False, True]}[args.pin]
    if True in pins:
        cpu_halves()  # fails early on a single CPU
    #: (row name, variant, pinned)
    rows = [(v + ("@pinned" if p else ""), v, p) for v in variants for p in pins]
    t_run = time.monotonic()
    report: dict[str, Any] = {
        "benchmark": "inband_bench",
        "command": shlex.join(["python", "bench/inband_bench.py", *sys.argv[1:]]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "env": environment(),
        "world": args.world,
        "iters": args.iters,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "batch_per_rank": args.batch,
        "depth": args.depth,
        "shadows": args.shadows,
        "replication": args.replication,
        "gap_repair": args.gap_repair,
        "pin": args.pin,
        "timing": "rank 0, perf_counter around forward + "
        "backward + step; ratio = median / median of ddp in the same run (ratio_to_ring: of "
        "ring; both with the same pinning)",
        "results": [],
    }
    if any(v.startswith("inband") or v in RING_VARIANTS for v in variants):
        t0 = time.monotonic()
        compile_product()
        report["p4_compile_s"] = time.monotonic() - t0
    tmp = Path(tempfile.mkdtemp(prefix="sg-inband-bench-"))
    try:
        for size in args.sizes.split(","):
            target = parse_size(size)
            width = width_for(target, args.depth)
            params, buckets = from_module(make_model(width, args.depth))
            layout = Layout.build(params, buckets, args.shadows, args.replication)
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in rows}
            for rnd in range(args.rounds):  # rounds interleave the variants (drift, load)
                for name, variant, pinned in rows:
                    t0 = time.monotonic()
                    load0 = os.getloadavg()[0]
                    failures: list[str] = []
                    while True:
                        try:
                            res = run_variant(args, variant, width, layout, tmp, pinned=pinned)
                            break
                        except RanksFailedError as exc:
                            # a failed launch is kept (full rank outputs in a file outside the
                            # repository) and retried up to --retries times
                            log = Path(
                                tempfile.mkstemp(prefix="inband-bench-fail-", suffix=".log")[1]
                            )
                            log.write_text(exc.report())
                            failures.append(f"{exc} (rank outputs: {log})")
                            print(
                                f"  {size} {name} round {rnd}: FAILED, {failures[-1]}\n"
                                + exc.report()[-3000:],
                                flush=True,
                            )
                            if len(failures) > args.retries:
                                raise
                    res["failed_attempts"] = failures
                    res["wall_s"] = time.monotonic() - t0
                    res["loadavg_1min"] = [load0, os.getloadavg()[0]]
                    res["round"] = rnd
                    res["median_s"] = statistics.median(res["times"])
                    runs[name].append(res)
                    print(
                        f"  {size} {name} round {rnd}: median {res['median_s'] * 1e3:.1f} "
                        f"ms, {res['wall_s']:.0f} s wall, load {load0:.1f}",
                        flush=True,
                    )
            entries = {}
            for name, variant, pinned in rows:
                entry = summarize(size, name, runs[name], len(layout.buckets))
                entry["pinned"] = pinned
                entries[variant, pinned] = entry
            for (variant, pinned), entry in entries.items():
                med = entry["stats_s"]["median"]
                ddp = entries.get(("ddp", pinned))
                ring = entries.get(("ring", pinned))
                ring_mac = entries.get(("ring_mac", pinned))
                entry["ratio_to_ddp"] = None if ddp is None else med / ddp["stats_s"]["median"]
                entry["ratio_to_ring"] = None if ring is None else med / ring["stats_s"]["median"]
                if ring is not None and (variant.startswith("inband") or variant == "ring_mac"):
                    # in-band against the clean ring (acceptance: bytes per iteration equal
                    # but for the COMMIT record, <= 0.1 % more; CPU per iteration <= 1 % more)
                    entry["vs_ring"] = compare(entry, ring)
                if ring_mac is not None and variant.startswith("inband"):
                    # against the clean ring with the session's MACs: what is left is the
                    # COMMITs, the tap and the session's own work
                    entry["vs_ring_mac"] = compare(entry, ring_mac)
                report["results"].append(entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    for entry in report["results"]:
        print_row(entry)
    report["runtime_s"] = time.monotonic() - t_run
    report["env"]["loadavg_at_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    _common.write_json(Path(args.out), report, default=str)
    print(f"wrote {args.out} ({report['runtime_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
