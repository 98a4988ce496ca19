"""Trainer-side cost of checkpointing every iteration: shadowgrad mirror mode against DCP
``async_save`` and ``torch.save``, on the same model in the same run.

For each model size it launches ``--world`` DDP ranks (gloo, CPU) once per variant:

* ``none``       -- no checkpointing (the baseline)
* ``mirror``     -- shadowgrad mirror mode (``attach`` + ``sg.step``); the shadows are real
                    shadow nodes in this process (``--shadows real``) or UDP sinks that only
                    drain their sockets (``--shadows sink``: trainer-side cost alone, no shadow
                    CPU or memory)
* ``mirror_sink`` -- mirror mode against sinks whatever ``--shadows`` says, so one run gives
                    both the whole-machine cost (real shadows on the same cores) and the
                    trainer's own critical path
* ``paired``     -- ``none`` and ``mirror_sink`` in the same rank processes, in alternating
                    blocks of ``--block`` iterations (``--pairs`` of each): both see the same
                    seconds of a machine whose speed moves from second to second (opt-in; the
                    ratio of the pooled medians and every pair's ratio); after the blocks every
                    rank times a bare ``sendmsg`` loop of what its sender sent per capture
                    (:func:`bare_send_floor`: the kernel's part, the floor of the sender's CPU)
* ``dcp_async``  -- ``torch.distributed.checkpoint.async_save`` of model + optimizer every
                    iteration (waiting for the previous save first, as one must)
* ``torch_save`` -- rank 0 ``torch.save`` of model + optimizer state every iteration
* ``dcp_async:K`` / ``torch_save:K`` -- the same every K-th iteration (a periodic policy): the
                    measured iterations are a multiple of K, so the excess over ``none`` divided
                    by the number of checkpoints is the cost of one checkpoint to the trainer
                    (its blocking stall plus whatever the background write takes from the
                    iterations after it); for ``dcp_async`` the time until a save is durable
                    (``async_save`` called -> its future done) is recorded too

and reports, per size, world size and shadow count, the per-iteration time on rank 0 (median of
the pooled measured iterations, and the medians of each round), its ratio to ``none`` and, for
the periodic variants, the cost per checkpoint. ``--rounds`` runs of every variant are
interleaved (round-robin), so a slow minute of a shared machine hits every variant alike. The
mirror variants start timing once the sender's staging slots are all allocated (``attach``
prefaults ``buffer_bytes`` of them in the background, which at 1M outlasts the warm-up): the
steady state of a job past its first seconds.
Results go to a JSON file (``--out``); ``bench/harness.py`` makes docs/benchmarks.md from it.

    .venv/bin/python bench/trainer_bench.py --sizes 10M,100M --iters 10 --world 2
    .venv/bin/python bench/trainer_bench.py --sizes 1M --variants none,mirror --worlds 2,4 \\
        --shadow-counts 1,2,4        # scaling: trainers and shadows
"""

from __future__ import annotations

import argparse
import os
import resource
import select
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common
from _common import SIZES  # model size -> (width, depth) of the MLP

ROOT = Path(__file__).resolve().parents[1]
TIMES = "\u00d7"
VARIANTS = ("none", "mirror", "dcp_async", "torch_save", "dcp_async:5", "torch_save:5")


def split_variant(variant: str) -> tuple[str, int]:
    """``"dcp_async:5"`` -> ``("dcp_async", 5)``; a plain name checkpoints every iteration."""
    name, _, every = variant.partition(":")
    k = int(every) if every else 1
    if name not in ("none", "mirror", "mirror_sink", "paired", "dcp_async", "torch_save") or k < 1:
        raise ValueError(f"unknown variant {variant!r}")
    if name in ("none", "mirror", "mirror_sink", "paired") and every:
        raise ValueError(f"{name} has no interval: {variant!r}")
    return name, k


# --------------------------------------------------------------------------- worker


def _wait_prefault(sg: Any, timeout_s: float = 60.0) -> None:
    """Before the timed iterations: wait until the mirror sender's prefault thread has
    allocated (and so touched) all the staging slots it will (``slots_max``, fewer when an
    allocation failed), which at small sizes outlasts the warm-up, so the timing is the steady
    state a job reaches in its first seconds."""
    if sg is None:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = sg.stats().get("mirror", {})
        if m.get("slots_allocated", 0) >= m.get("slots_max", 0):
            return
        time.sleep(0.02)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // args.world))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    width = SIZES[args.size][0]
    if args.variant == "paired":
        _paired(args)
        dist.destroy_process_group()
        return
    net = _common.mlp(args.size)
    nparams = sum(p.numel() for p in net.parameters())
    model = DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sg: Any = None
    fut: Any = None
    # DCP's background save runs collectives: give it its own group, or they interleave with
    # DDP's all-reduces on the default group
    kind, every = split_variant(args.variant)
    ckpt_pg = dist.new_group(backend="gloo") if kind == "dcp_async" else None
    durable: list[float] = []  # async_save called -> its future done, seconds
    ckdir = Path(args.ckdir)
    if kind in ("mirror", "mirror_sink"):
        from shadowgrad.trainer_hooks import attach

        sg = attach(
            model, opt, args.spec, max_grad_norm=1.0, background_sender=bool(args.background)
        )
        sg.restore_or_start()
    times: list[float] = []
    ckpt: list[bool] = []
    # the checkpoint's own time on the training thread per measured iteration: mirror's
    # capture (the copy into a staging slot), DCP's get_state_dict + wait for the previous
    # save + async_save's staging, torch.save; and this rank's CPU (all threads) and the
    # mirror sender thread's over the measured iterations
    blocked: list[float] = []
    cpu0 = 0.0
    flt0 = 0
    threads0: dict[str, float] = {}
    tflt0: dict[str, float] = {}
    mirror0: dict[str, Any] = {}
    for it in range(args.warmup + args.iters):
        if it == args.warmup:
            _wait_prefault(sg)
            cpu0 = time.process_time()
            flt0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            threads0 = _common.thread_cpu_s()
            tflt0 = _common.thread_faults()
            mirror0 = sg.stats().get("mirror", {}) if sg is not None else {}
        # a periodic policy saves on the first iteration of every window of ``every`` measured
        # ones (so a background write's spill-over falls inside the window it belongs to), and
        # once in the warm-up (its one-time set-up is not a checkpoint's cost)
        save = it == 0 or (it >= args.warmup and (it - args.warmup) % every == 0)
        x = torch.randn(args.batch, width)
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        if sg is not None:
            sg.backward(loss)
            sg.step()
        else:
            plain_step(model, opt, loss)
            tb = time.perf_counter()
            if kind == "dcp_async" and save:
                import torch.distributed.checkpoint as dcp
                from torch.distributed.checkpoint.state_dict import get_state_dict

                if fut is not None:
                    fut.result()
                msd, osd = get_state_dict(model, opt)
                fut = dcp.async_save(
                    {"model": msd, "optim": osd},
                    checkpoint_id=str(ckdir / f"it{it % 2}"),
                    process_group=ckpt_pg,
                )
                if it >= args.warmup:
                    t_call = time.perf_counter()
                    fut.add_done_callback(
                        lambda _f, t=t_call: durable.append(time.perf_counter() - t)
                    )
            elif kind == "torch_save" and save and rank == 0:
                torch.save(
                    {"model": model.module.state_dict(), "optim": opt.state_dict()},
                    ckdir / "ckpt.pt",
                )
            tb = time.perf_counter() - tb
        dt = time.perf_counter() - t0
        if it >= args.warmup:
            times.append(dt)
            if kind in ("dcp_async", "torch_save"):
                blocked.append(tb)
            ckpt.append(save and kind in ("dcp_async", "torch_save"))
    cpu = (time.process_time() - cpu0) / args.iters
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt0) / args.iters
    threads = _common.cpu_delta(threads0, _common.thread_cpu_s(), args.iters)
    thread_faults = _common.cpu_delta(tflt0, _common.thread_faults(), args.iters)
    mirror1 = sg.stats().get("mirror", {}) if sg is not None else {}
    if fut is not None:
        fut.result()
    extra: dict[str, Any] = {}
    sender_cpu = None
    if sg is not None:
        n = mirror1["captures"] - mirror0["captures"]
        blocked = [(mirror1["capture_s"] - mirror0["capture_s"]) / max(1, n)] * args.iters
        if mirror1.get("thread_cpu_s") is not None and mirror0.get("thread_cpu_s") is not None:
            sender_cpu = (mirror1["thread_cpu_s"] - mirror0["thread_cpu_s"]) / args.iters
        sg.flush(30)
        extra = sg.stats()
        sg.close()
    per_rank = _common.by_rank(
        {
            "rank_cpu_per_iter_s": cpu,
            # page faults (minor: fresh or reclaimed pages the kernel zeroes) per iteration
            "rank_faults_per_iter": faults,
            "sender_cpu_per_iter_s": sender_cpu,
            # CPU seconds per measured iteration by thread name
            "thread_cpu_per_iter_s": threads,
            # and page faults: whose allocations they are (the training thread's own tensors,
            # or mirror's threads)
            "thread_faults_per_iter": thread_faults,
        }
    )
    dist.barrier()
    if rank == 0:
        _common.print_result(
            {
                "size": args.size,
                "variant": args.variant,
                "params": nparams,
                "times": times,
                "checkpointed": ckpt,
                "blocked_s": blocked,
                **per_rank,
                "durable_s": durable,
                "every": every,
                "world": args.world,
                "extra": extra,
            }
        )
    dist.destroy_process_group()


def plain_step(model: Any, opt: Any, loss: Any) -> None:
    """The rest of a plain iteration without shadowgrad (variant ``none`` and the plain half of
    ``paired``): backward, clipping at 1.0, the optimizer step, gradients set to None."""
    import torch

    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _paired(args: argparse.Namespace) -> None:
    """Variant ``paired``: ``none`` and ``mirror_sink`` in the same rank processes, in
    alternating blocks of ``--block`` iterations (``--pairs`` blocks of each, which goes first
    alternating too), so both see the same seconds of the machine. Two copies of the model from
    the same seed: plain DDP + AdamW + clipping (``none``) and DDP + ``attach`` against the sinks
    (``mirror_sink``). The first iteration of every block is not timed; a mirror block ends
    with ``sg.flush`` (untimed), so every timed mirror iteration runs beside the previous one's
    send, as in a run of its own, and no plain iteration does."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from shadowgrad.trainer_hooks import attach

    width = SIZES[args.size][0]
    plain = DistributedDataParallel(_common.mlp(args.size))
    opt_a = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    model = DistributedDataParallel(_common.mlp(args.size))
    opt_b = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sg = attach(model, opt_b, args.spec, max_grad_norm=1.0, background_sender=bool(args.background))
    sg.restore_or_start()

    def one(mirror: bool) -> tuple[float, float]:
        """One iteration: its wall time and the training thread's own CPU time."""
        x = torch.randn(args.batch, width)
        c0 = time.thread_time()
        t0 = time.perf_counter()
        if mirror:
            loss = model(x).square().mean()
            sg.backward(loss)
            sg.step()
        else:
            loss = plain(x).square().mean()
            plain_step(plain, opt_a, loss)
        return time.perf_counter() - t0, time.thread_time() - c0

    for _ in range(args.warmup):
        one(False)
        one(True)
    _wait_prefault(sg)
    sg.flush(60)
    blocks: list[dict[str, Any]] = []
    for p in range(args.pairs):
        for mirror in (False, True) if p % 2 == 0 else (True, False):
            timed = [one(mirror) for _ in range(args.block)][1:]
            if mirror:
                sg.flush(60)
            blocks.append(
                {
                    "pair": p,
                    "variant": "mirror_sink" if mirror else "none",
                    "times": [t for t, _ in timed],
                    "cpu": [c for _, c in timed],
                }
            )
    stats = sg.stats()
    sg.flush(30)
    sg.close()
    dist.barrier()  # every rank's floor runs beside the other ranks' floors, as their senders ran
    floor = bare_send_floor(args.spec, stats.get("mirror") or {}, args.pairs)
    dist.barrier()
    if dist.get_rank() == 0:
        base = [t for b in blocks if b["variant"] == "none" for t in b["times"]]
        mine = [t for b in blocks if b["variant"] == "mirror_sink" for t in b["times"]]
        # the training thread's own CPU per timed iteration (rank 0; the capture included)
        base_cpu = [c for b in blocks if b["variant"] == "none" for c in b["cpu"]]
        mine_cpu = [c for b in blocks if b["variant"] == "mirror_sink" for c in b["cpu"]]
        pair_ratios = []
        for p in range(args.pairs):
            m = {b["variant"]: statistics.median(b["times"]) for b in blocks if b["pair"] == p}
            pair_ratios.append(m["mirror_sink"] / m["none"])
        _common.print_result(
            {
                "size": args.size,
                "variant": "paired",
                "params": sum(p.numel() for p in plain.parameters()),
                "times": mine,
                "base_times": base,
                "main_cpu": mine_cpu,
                "base_main_cpu": base_cpu,
                "blocks": blocks,
                "pair_ratios": pair_ratios,
                "ratio": statistics.median(mine) / statistics.median(base),
                "pair_ratio_median": statistics.median(pair_ratios),
                "block": args.block,
                "checkpointed": [False] * len(mine),
                "blocked_s": [],
                "world": args.world,
                "extra": {"mirror": stats.get("mirror", {}), "bare_send": floor},
            }
        )


def bare_send_floor(spec_path: str, mirror: dict[str, Any], reps: int) -> dict[str, Any] | None:
    """What moving the sender's bytes through the kernel costs without shadowgrad: a bare
    ``sendmsg`` loop, in this process (after its sender closed), of one capture's worth of what
    the sender sent (``data_bytes / captures``), in datagrams of its size (``data_bytes /
    data_chunks``: a header's worth of zeros + a slice of one preallocated buffer, nothing
    sealed or encoded) to the first sink of the spec, ``reps`` times; the loop's thread CPU
    per capture, median and all, beside the sender thread's own CPU per capture
    (``thread_cpu_s / captures``: its heartbeats and COMMITs included). None without figures."""
    from shadowgrad.config import load_spec
    from shadowgrad.wire import HEADER_SIZE, MAC_SIZE

    captures, chunks = int(mirror.get("captures") or 0), int(mirror.get("data_chunks") or 0)
    nbytes = int(mirror.get("data_bytes") or 0)
    if not captures or not chunks or not nbytes:
        return None
    per_capture, chunk = nbytes // captures, max(1, nbytes // chunks)
    spec = load_spec(spec_path)
    sink = spec.shadows.addresses[0]
    addr = (sink.host, sink.port)
    data = memoryview(bytearray(per_capture))  # touched: zeros written by bytearray
    # the sender's datagram carries the header and, sealed, the MAC trailer around the payload
    head = bytes(HEADER_SIZE + (MAC_SIZE if spec.security.authenticate_data else 0))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    cpu: list[float] = []
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 * 2**20)
        for _ in range(max(1, reps)):
            c0 = time.thread_time()
            for off in range(0, per_capture, chunk):
                while True:
                    try:
                        sock.sendmsg([head, data[off : off + chunk]], (), 0, addr)
                        break
                    except BlockingIOError:  # the sinks' buffers are full: let them drain
                        time.sleep(0.0005)
            cpu.append(time.thread_time() - c0)
            time.sleep(0.05)  # the sinks drain between captures, as between iterations
    finally:
        sock.close()
    return {
        "bytes_per_capture": per_capture,
        "datagram_payload": chunk,
        "cpu_s": cpu,
        "cpu_median_s": statistics.median(cpu),
        "sender_cpu_per_capture_s": float(mirror.get("thread_cpu_s") or 0.0) / captures,
    }


# --------------------------------------------------------------------------- launcher


def _free_udp(n: int) -> list[int]:
    from shadowgrad.freeports import free_ports

    return free_ports(n, socket.SOCK_DGRAM)


class Sinks:
    """UDP sockets that drain and count whatever reaches them (``--shadows sink``).

    A sink stands for a shadow on another machine, so it spends as little of the ranks' cores
    as it can: one thread for all the sockets, non-blocking, woken by ``select``, then emptying
    them all every millisecond while datagrams come (:attr:`PASS_S`). ``MSG_TRUNC`` into a
    1-byte buffer makes the kernel free each datagram without copying its payload out (the
    call still returns the datagram's full length, counted in :attr:`bytes`)."""

    PASS_S = 0.001

    def __init__(self, ports: list[int]) -> None:
        self.socks = []
        for p in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 2**20)
            s.bind(("127.0.0.1", p))
            s.setblocking(False)
            self.socks.append(s)
        self.counts = [0] * len(self.socks)  # bytes received, per socket
        self.stop = False
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    @property
    def bytes(self) -> int:
        return sum(self.counts)

    def _drain(self) -> None:
        buf = bytearray(1)
        trunc = socket.MSG_TRUNC
        socks, counts = self.socks, self.counts
        while not self.stop:
            try:
                ready, _, _ = select.select(socks, [], [], 0.1)
            except (OSError, ValueError):
                return
            # a burst: empty every socket, then again after a millisecond, until a pass finds
            # nothing (one wake-up per millisecond of sending, not one per datagram)
            while ready and not self.stop:
                ready = []
                for i, s in enumerate(socks):
                    n = counts[i]
                    try:
                        while True:
                            n += s.recv_into(buf, 1, trunc)
                    except BlockingIOError:
                        pass
                    except OSError:
                        return
                    if n != counts[i]:
                        counts[i] = n
                        ready.append(s)
                time.sleep(self.PASS_S)

    def close(self) -> None:
        self.stop = True
        self.thread.join(2)
        for s in self.socks:
            s.close()


def _spec_doc(world: int, shadows: int, data_mac: bool = True) -> dict[str, Any]:
    """The job's spec: loopback, ``world`` trainers, ``shadows`` shadows; ``data_mac=False``
    turns ``security.authenticate_data`` off (DATA with the CRC-32C only)."""
    from shadowgrad.specs import loopback_spec

    doc = loopback_spec(
        world=world, shadows=shadows, rpc="1s", heartbeat="200ms", gap_repair="100ms"
    )
    if not data_mac:
        doc.setdefault("security", {})["authenticate_data"] = False
    return doc


def run_variant(
    args: argparse.Namespace, size: str, variant: str, spec_path: Path, ckdir: Path
) -> dict[str, Any]:
    ranks = _common.start_ranks(
        __file__,
        args,
        size=size,
        variant=variant,
        world=args.world,
        spec=spec_path,
        ckdir=ckdir,
        block=args.block,
        pairs=args.pairs,
        background=int(args.background_sender),
    )
    try:
        codes = ranks.wait(args.timeout)
        out = ranks.output(0)
        if codes != [0] * args.world:
            raise RuntimeError(
                f"{size}/{variant}: exit codes {codes}\n{out[-3000:]}\n" + ranks.output(1)[-2000:]
            )
    finally:
        ranks.close()
    return _common.rank_result(out)


def _stats(xs: list[float]) -> dict[str, float] | None:
    return None if not xs else {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def summarize(runs: list[dict[str, Any]], base_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one (size, world, shadows, variant) from its rounds; ``base_runs`` are the
    same rounds of ``none`` (per round: the excess over that round's ``none`` median)."""
    times = [t for r in runs for t in r["times"]]
    med = statistics.median(times)
    round_medians = [statistics.median(r["times"]) for r in runs]
    out: dict[str, Any] = {
        "median_s": med,
        "round_medians_s": round_medians,
        "rounds": len(runs),
        "min_s": min(times),
        "max_s": max(times),
    }
    if base_runs:
        base = statistics.median([t for r in base_runs for t in r["times"]])
        out["ratio"] = med / base
        out["round_ratios"] = [
            statistics.median(r["times"]) / statistics.median(b["times"])
            for r, b in zip(runs, base_runs, strict=False)
        ]
        per_ckpt = []
        stall = []
        for r, b in zip(runs, base_runs, strict=False):
            n = sum(r.get("checkpointed") or [])
            bmed = statistics.median(b["times"])
            if n:
                per_ckpt.append((sum(r["times"]) - len(r["times"]) * bmed) / n)
                stall += [t - bmed for t, c in zip(r["times"], r["checkpointed"], strict=True) if c]
        out["cost_per_checkpoint_s"] = _stats(per_ckpt)
        out["stall_at_checkpoint_s"] = _stats(stall)
        out["excess_per_iteration_s"] = _stats(
            [
                statistics.median(r["times"]) - statistics.median(b["times"])
                for r, b in zip(runs, base_runs, strict=False)
            ]
        )
    out["durable_s"] = _stats([d for r in runs for d in r.get("durable_s") or []])
    # the checkpoint's own time on the training thread, per checkpoint (mirror: the capture
    # of every iteration; DCP / torch.save: the call on the iterations that save)
    own = [b for r in runs for b, c in zip(r.get("blocked_s") or [], _saves(r), strict=False) if c]
    out["blocked_per_checkpoint_s"] = _stats(own)

    def per_rank_sum(key: str) -> float | None:
        vals = [sum(v) for r in runs if (v := r.get(key)) and None not in v]
        return statistics.median(vals) if vals else None

    # CPU seconds per measured iteration, all ranks together (median over the rounds), and
    # the part of it that is mirror's sender threads (off the critical path)
    out["ranks_cpu_per_iter_s"] = per_rank_sum("rank_cpu_per_iter_s")
    out["sender_cpu_per_iter_s"] = per_rank_sum("sender_cpu_per_iter_s")
    # page faults per measured iteration, all ranks together: each one a page the kernel
    # zeroes, on the thread that touched it (most often the training thread)
    out["ranks_faults_per_iter"] = per_rank_sum("rank_faults_per_iter")
    # where it goes: CPU per measured iteration by thread name, all ranks summed, the median
    # over the rounds (the main thread is "MainThread"; gloo's, ZeroMQ's by their OS names)
    for key in ("thread_cpu_per_iter_s", "thread_faults_per_iter"):
        names = {n for r in runs for per in r.get(key) or [] for n in per}
        by_thread = {
            n: statistics.median(sum(per.get(n, 0.0) for per in r[key]) for r in runs if r.get(key))
            for n in names
        }
        out[key] = dict(sorted(by_thread.items(), key=lambda kv: -kv[1]))
    rx = [v for r in runs if (v := r.get("receiver_cpu_per_iter_s")) is not None]
    out["receiver_cpu_per_iter_s"] = statistics.median(rx) if rx else None
    return out


def paired_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Variant ``paired`` over its rounds: the ratio of the pooled medians (mirror iterations
    over plain ones, all blocks of all rounds) and every pair of blocks' ratio of medians."""
    mine = [t for r in runs for t in r["times"]]
    base = [t for r in runs for t in r["base_times"]]
    pairs = [x for r in runs for x in r["pair_ratios"]]
    cpu = [c for r in runs for c in r.get("main_cpu") or []]
    base_cpu = [c for r in runs for c in r.get("base_main_cpu") or []]
    floors = [f for r in runs if (f := (r.get("extra") or {}).get("bare_send"))]
    return {
        "ratio": statistics.median(mine) / statistics.median(base),
        "base_median_s": statistics.median(base),
        # rank 0's training thread's own CPU per iteration, medians (mirror: capture included)
        "main_cpu_s": statistics.median(cpu) if cpu else None,
        "base_main_cpu_s": statistics.median(base_cpu) if base_cpu else None,
        "pair_ratios": pairs,
        "pair_ratio_median": statistics.median(pairs),
        "pair_ratio_quartiles": statistics.quantiles(pairs, n=4) if len(pairs) > 1 else None,
        "block": runs[0].get("block"),
        # rank 0: its sender thread's CPU per capture and a bare sendmsg loop of the same bytes
        # in the same process (bare_send_floor), medians over the rounds
        "sender_cpu_per_capture_s": (
            statistics.median(f["sender_cpu_per_capture_s"] for f in floors) if floors else None
        ),
        "bare_send_cpu_s": (
            statistics.median(f["cpu_median_s"] for f in floors) if floors else None
        ),
        "bare_send_bytes": floors[0]["bytes_per_capture"] if floors else None,
        "bare_send_datagram": floors[0]["datagram_payload"] if floors else None,
    }


def _ms(label: str, secs: float | None) -> str:
    return "" if secs is None else f"{label} {secs * 1e3:.1f} ms"


def _saves(run: dict[str, Any]) -> list[bool]:
    """Which measured iterations of ``run`` took a checkpoint (mirror: every one)."""
    if run.get("checkpointed") and any(run["checkpointed"]):
        return list(run["checkpointed"])
    return [bool(run.get("extra", {}).get("mirror"))] * len(run["times"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="10M", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--spec", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ckdir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--background", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="10M,100M", help="comma list of " + ",".join(SIZES))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--iters",
        type=int,
        default=10,
        help="measured iterations per variant and round (a multiple of every K)",
    )
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved runs of every variant")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--world", type=int, default=2, help="DDP ranks (gloo, CPU)")
    ap.add_argument("--worlds", default="", help="comma list of world sizes (default: --world)")
    ap.add_argument("--num-shadows", type=int, default=2)
    ap.add_argument(
        "--shadow-counts",
        default="",
        help="comma list of shadow counts for mirror (default: --num-shadows)",
    )
    ap.add_argument(
        "--shadows",
        choices=("real", "sink", "auto"),
        default="auto",
        help="auto: real shadows where this machine's available memory holds them "
        f"({REAL_BYTES_PER_PARAM} bytes per parameter), else sinks",
    )
    ap.add_argument(
        "--data-mac",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="security.authenticate_data of the job (--no-data-mac: DATA with the CRC only)",
    )
    ap.add_argument(
        "--background-sender",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mirror: the sender sends at SCHED_IDLE while it keeps up (attach's "
        "background_sender; --no-background-sender: always at normal priority)",
    )
    ap.add_argument("--block", type=int, default=4, help="paired: iterations per block")
    ap.add_argument("--pairs", type=int, default=8, help="paired: blocks of each variant")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "trainer_bench.json"))
    args = _common.parse_bench_args(ap, worker)  # a rank never returns from it
    import torch

    # the in-process real shadows replay with one intra-op thread, as `shadowgrad shadow` does
    # by default (--threads 1): idle OpenMP workers would spin on the cores the ranks use
    torch.set_num_threads(1)
    variants = args.variants.split(",")
    if "paired" in variants and (args.block < 2 or args.pairs < 1):
        ap.error("paired needs --block 2 or more (a block's first iteration is not timed)")
    for v in variants:
        _, k = split_variant(v)
        if args.iters % k:
            ap.error(f"--iters {args.iters} is not a multiple of {v}'s interval {k}")
    worlds = [int(w) for w in (args.worlds or str(args.world)).split(",")]
    counts = [int(c) for c in (args.shadow_counts or str(args.num_shadows)).split(",")]
    report: dict[str, Any] = {
        "world": worlds[0],
        "worlds": worlds,
        "iters": args.iters,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "batch": args.batch,
        "num_shadows": counts[0],
        "cpus": len(os.sched_getaffinity(0)),
        "shadow_counts": counts,
        "results": [],
    }
    tmp = Path(tempfile.mkdtemp(prefix="sg-trainer-bench-"))
    try:
        for size in args.sizes.split(","):
            for world in worlds:
                # (variant, shadows) cells of this size and world; shadow counts only vary mirror
                cells = [
                    (v, n)
                    for v in variants
                    for n in (counts if split_variant(v)[0] == "mirror" else [None])
                ]
                runs: dict[tuple[str, int | None], list[dict[str, Any]]] = {c: [] for c in cells}
                walls: dict[tuple[str, int | None], float] = dict.fromkeys(cells, 0.0)
                for rnd in range(args.rounds):
                    for variant, nshadows in cells:
                        res = _one(args, size, world, variant, nshadows=nshadows, tmp=tmp, rnd=rnd)
                        walls[(variant, nshadows)] += res.pop("wall_s")
                        runs[(variant, nshadows)].append(res)
                        print(
                            f"{size:>5} world {world} round {rnd + 1}/{args.rounds} "
                            f"{variant:<13}{'' if nshadows is None else f' {nshadows} shadows'}"
                            f" median {statistics.median(res['times']) * 1000:9.1f} ms/iter"
                            + (
                                f" (none {statistics.median(res['base_times']) * 1000:.1f}: "
                                f"{TIMES}{res['ratio']:.3f}; per pair "
                                + " ".join(f"{x:.3f}" for x in res["pair_ratios"])
                                + ")"
                                if variant == "paired"
                                else ""
                            ),
                            flush=True,
                        )
                base_runs = runs.get(("none", None), [])
                for (variant, nshadows), rs in runs.items():
                    kind, every = split_variant(variant)
                    entry: dict[str, Any] = {
                        "size": size,
                        "variant": variant,
                        "kind": kind,
                        "every": every,
                        "world": world,
                        "params": rs[0]["params"],
                        "num_shadows": nshadows,
                        "shadows": rs[0].get("shadows"),
                        "wall_s": walls[(variant, nshadows)],
                        "times": [t for r in rs for t in r["times"]],
                        "extra": rs[-1].get("extra"),
                        "shadow_status": rs[-1].get("shadow_status"),
                        "sink_bytes": rs[-1].get("sink_bytes"),
                    }
                    entry.update(summarize(rs, base_runs if variant != "none" else rs))
                    if variant == "paired":
                        entry.update(paired_summary(rs))
                    elif variant != "none" and not base_runs:
                        entry["ratio"] = None
                    report["results"].append(entry)
                    ratio = "-" if entry.get("ratio") is None else f"{entry['ratio']:.3f}x"
                    print(
                        f"{size:>5} {entry['params'] / 1e6:7.1f}M params world {world} "
                        f"{variant:<13} median {entry['median_s'] * 1000:9.1f} ms/iter "
                        f"ratio {ratio}"
                        + (f" ({entry['shadows']} shadows x{nshadows})" if kind == "mirror" else "")
                        + _ms(
                            "  blocked/ckpt",
                            (entry["blocked_per_checkpoint_s"] or {}).get("median"),
                        )
                        + _ms("  cpu/iter ranks", entry["ranks_cpu_per_iter_s"])
                        + _ms(" of it sender threads", entry["sender_cpu_per_iter_s"])
                        + (
                            f"  faults/iter {entry['ranks_faults_per_iter']:.0f}"
                            if entry.get("ranks_faults_per_iter") is not None
                            else ""
                        )
                        + _ms("  rank 0 sender cpu/capture", entry.get("sender_cpu_per_capture_s"))
                        + _ms(" bare sendmsg of its bytes", entry.get("bare_send_cpu_s")),
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _common.write_json(Path(args.out), report)
    print(f"wrote {args.out}")
    return 0


#: what a mirror run with real in-process shadows holds at its peak, per model parameter: the
#: ranks' model, gradients, AdamW state, DDP buckets and staging slots, the shadows' replicas,
#: optimizer state and iteration buffers (measured: 16.6 GB used at 100.7M parameters, 2 ranks,
#: 2 shadows, ``free -m`` every 10 s)
REAL_BYTES_PER_PARAM = 170


def _real_fits(params: int) -> bool:
    """Whether real shadows for ``params`` fit in this machine's available memory."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return params <= 12e6
    return params * REAL_BYTES_PER_PARAM <= avail


def _one(
    args: argparse.Namespace,
    size: str,
    world: int,
    variant: str,
    *,
    nshadows: int | None,
    tmp: Path,
    rnd: int,
) -> dict[str, Any]:
    """One run of one variant: ``world`` ranks, with real shadows / sinks for mirror."""
    from shadowgrad.config import parse_spec
    from shadowgrad.specs import spec_toml
    from shadowgrad.testing.cluster import shadow_cluster

    kind, _ = split_variant(variant)
    tag = f"{size}-w{world}-{variant.replace(':', '_')}-s{nshadows}-r{rnd}"
    ckdir = tmp / tag
    ckdir.mkdir()
    doc = _spec_doc(world, nshadows or args.num_shadows, data_mac=args.data_mac)
    spec_path = tmp / f"{tag}.toml"
    spec_path.write_text(spec_toml(doc))
    mode = "sink" if kind in ("mirror_sink", "paired") else args.shadows
    if mode == "auto":
        mode = "real" if _real_fits(SIZES[size][0] ** 2 * SIZES[size][1]) else "sink"
    if kind in ("mirror_sink", "paired"):
        kind = "mirror"
    wargs = argparse.Namespace(**{**vars(args), "world": world})
    t0 = time.monotonic()
    cpu0 = time.process_time()  # this process: the sinks' or the real shadows' threads
    try:
        if kind == "mirror" and mode == "real":
            with shadow_cluster(parse_spec(doc, env={})) as cluster:
                res = run_variant(wargs, size, variant, spec_path, ckdir)
                res["shadow_status"] = [
                    {k: s[k] for k in ("last_applied", "diverged_at", "lag")}
                    for s in cluster.status()
                ]
        elif kind == "mirror":
            ports = [int(a.rsplit(":", 1)[1]) for a in doc["shadows"]["addresses"]]
            sinks = Sinks(ports)
            try:
                res = run_variant(wargs, size, variant, spec_path, ckdir)
            finally:
                sinks.close()
            res["sink_bytes"] = sinks.bytes
        else:
            res = run_variant(wargs, size, variant, spec_path, ckdir)
    finally:
        shutil.rmtree(ckdir, ignore_errors=True)
    res["shadows"] = mode if kind == "mirror" else None
    res["wall_s"] = time.monotonic() - t0
    # the CPU the shadows' side took on the same cores (sinks draining, or real shadows'
    # ingest and replay), per iteration the ranks ran (warmup included: they receive it too)
    res["receiver_cpu_per_iter_s"] = (time.process_time() - cpu0) / (args.warmup + args.iters)
    return res


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
