"""Trainer-side cost of checkpointing every iteration: shadowgrad mirror mode against DCP
``async_save`` and ``torch.save``, on the same model in the same run.

For each model size it launches ``--world`` DDP ranks (gloo, CPU) once per variant:

* ``none``       -- no checkpointing (the baseline)
* ``mirror``     -- shadowgrad mirror mode (``attach`` + ``sg.step``); the shadows are real
                    shadow nodes in this process (``--shadows real``) or UDP sinks that only
                    drain their sockets (``--shadows sink``: trainer-side cost alone, no shadow
                    CPU or memory)
* ``dcp_async``  -- ``torch.distributed.checkpoint.async_save`` of model + optimizer every
                    iteration (waiting for the previous save first, as one must)
* ``torch_save`` -- rank 0 ``torch.save`` of model + optimizer state every iteration

and reports the median per-iteration time on rank 0 and its ratio to ``none``. Results go to a
JSON file (``--out``) that docs/trainer.md's table is made from.

    .venv/bin/python bench/trainer_bench.py --sizes 10M,100M --iters 10 --world 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("none", "mirror", "dcp_async", "torch_save")
#: model size -> (width, depth) of an MLP of depth x Linear(width, width)
SIZES = {"1M": (512, 4), "10M": (1024, 10), "100M": (2048, 24)}


# --------------------------------------------------------------------------- worker


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // args.world))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    width, depth = SIZES[args.size]
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    net = nn.Sequential(*layers)
    nparams = sum(p.numel() for p in net.parameters())
    model = DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sg: Any = None
    fut: Any = None
    # DCP's background save runs collectives: give it its own group, or they interleave with
    # DDP's all-reduces on the default group
    ckpt_pg = dist.new_group(backend="gloo") if args.variant == "dcp_async" else None
    ckdir = Path(args.ckdir)
    if args.variant == "mirror":
        from shadowgrad.trainer_hooks import attach

        sg = attach(model, opt, args.spec, max_grad_norm=1.0)
        sg.restore_or_start()
    times: list[float] = []
    for it in range(args.warmup + args.iters):
        x = torch.randn(args.batch, width)
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        if sg is not None:
            sg.backward(loss)
            sg.step()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if args.variant == "dcp_async":
                import torch.distributed.checkpoint as dcp
                from torch.distributed.checkpoint.state_dict import get_state_dict

                if fut is not None:
                    fut.result()
                msd, osd = get_state_dict(model, opt)
                fut = dcp.async_save({"model": msd, "optim": osd},
                                     checkpoint_id=str(ckdir / f"it{it % 2}"),
                                     process_group=ckpt_pg)
            elif args.variant == "torch_save" and rank == 0:
                torch.save({"model": model.module.state_dict(), "optim": opt.state_dict()},
                           ckdir / "ckpt.pt")
        dt = time.perf_counter() - t0
        if it >= args.warmup:
            times.append(dt)
    if fut is not None:
        fut.result()
    extra: dict[str, Any] = {}
    if sg is not None:
        sg.flush(30)
        extra = sg.stats()
        sg.close()
    dist.barrier()
    if rank == 0:
        print("RESULT " + json.dumps({"size": args.size, "variant": args.variant,
                                      "params": nparams, "times": times, "extra": extra}),
              flush=True)
    dist.destroy_process_group()


# --------------------------------------------------------------------------- launcher


def _free_udp(n: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Sinks:
    """UDP sockets that drain and count whatever reaches them (``--shadows sink``)."""

    def __init__(self, ports: list[int]) -> None:
        self.socks = []
        for p in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 2**20)
            s.bind(("127.0.0.1", p))
            s.settimeout(0.1)
            self.socks.append(s)
        self.bytes = 0
        self.stop = False
        self.threads = [threading.Thread(target=self._drain, args=(s,), daemon=True)
                        for s in self.socks]
        for t in self.threads:
            t.start()

    def _drain(self, s: socket.socket) -> None:
        buf = bytearray(65536)
        while not self.stop:
            try:
                self.bytes += s.recv_into(buf)
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self.stop = True
        for t in self.threads:
            t.join(2)
        for s in self.socks:
            s.close()


def _spec_doc(world: int, shadows: int) -> dict[str, Any]:
    from shadowgrad.trainer_hooks._testing import loopback_spec

    return loopback_spec(world=world, shadows=shadows, rpc="1s", heartbeat="200ms",
                         gap_repair="100ms")


def run_variant(args: argparse.Namespace, size: str, variant: str, spec_path: Path,
                ckdir: Path) -> dict[str, Any]:
    from shadowgrad.trainer_hooks._testing import TOKEN, Ranks

    argv = [sys.executable, __file__, "--worker", "--size", size, "--variant", variant,
            "--iters", str(args.iters), "--warmup", str(args.warmup), "--batch",
            str(args.batch), "--world", str(args.world), "--spec", str(spec_path),
            "--ckdir", str(ckdir)]
    ranks = Ranks(argv, args.world, {"SHADOWGRAD_TOKEN": TOKEN}, str(ROOT))
    try:
        codes = ranks.wait(args.timeout)
        out = ranks.output(0)
        if codes != [0] * args.world:
            raise RuntimeError(f"{size}/{variant}: exit codes {codes}\n{out[-3000:]}\n"
                               + ranks.output(1)[-2000:])
    finally:
        ranks.close()
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    res: dict[str, Any] = json.loads(line[len("RESULT "):])
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="10M", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--spec", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ckdir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="10M,100M", help="comma list of " + ",".join(SIZES))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--iters", type=int, default=10, help="measured iterations per variant")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--world", type=int, default=2, help="DDP ranks (gloo, CPU)")
    ap.add_argument("--num-shadows", type=int, default=2)
    ap.add_argument("--shadows", choices=("real", "sink", "auto"), default="auto",
                    help="auto: real shadows up to 10M parameters, sinks above (memory)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "trainer_bench.json"))
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    os.environ.setdefault("SHADOWGRAD_TOKEN", "trainer-test-token")
    from shadowgrad.trainer_hooks._testing import shadow_cluster, spec_toml

    from shadowgrad.config import parse_spec

    report: dict[str, Any] = {"world": args.world, "iters": args.iters, "batch": args.batch,
                              "num_shadows": args.num_shadows, "results": []}
    tmp = Path(tempfile.mkdtemp(prefix="sg-trainer-bench-"))
    try:
        for size in args.sizes.split(","):
            base: float | None = None
            for variant in args.variants.split(","):
                ckdir = tmp / f"{size}-{variant}"
                ckdir.mkdir()
                doc = _spec_doc(args.world, args.num_shadows)
                spec_path = tmp / f"{size}-{variant}.toml"
                spec_path.write_text(spec_toml(doc))
                mode = args.shadows
                if mode == "auto":
                    mode = "real" if SIZES[size][0] ** 2 * SIZES[size][1] <= 12e6 else "sink"
                t0 = time.monotonic()
                if variant == "mirror" and mode == "real":
                    with shadow_cluster(parse_spec(doc, env={})) as cluster:
                        res = run_variant(args, size, variant, spec_path, ckdir)
                        res["shadow_status"] = [
                            {k: s[k] for k in ("last_applied", "diverged_at", "lag")}
                            for s in cluster.status()]
                elif variant == "mirror":
                    ports = [int(a.rsplit(":", 1)[1]) for a in doc["shadows"]["addresses"]]
                    sinks = Sinks(ports)
                    try:
                        res = run_variant(args, size, variant, spec_path, ckdir)
                    finally:
                        sinks.close()
                    res["sink_bytes"] = sinks.bytes
                else:
                    res = run_variant(args, size, variant, spec_path, ckdir)
                shutil.rmtree(ckdir, ignore_errors=True)
                med = statistics.median(res["times"])
                res["median_s"] = med
                res["shadows"] = mode if variant == "mirror" else None
                res["wall_s"] = time.monotonic() - t0
                if variant == "none":
                    base = med
                res["ratio"] = None if base is None else med / base
                report["results"].append(res)
                ratio = "-" if res["ratio"] is None else f"{res['ratio']:.2f}x"
                print(f"{size:>5} {res['params'] / 1e6:7.1f}M params  {variant:<11} "
                      f"median {med * 1000:9.1f} ms/iter  ratio {ratio}"
                      + (f"  ({mode} shadows)" if variant == "mirror" else ""), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
