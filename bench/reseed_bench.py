"""The pause self-healing costs the training thread: the staging copy of one shard's state.

When a shard lost its state and has no healthy replica, the rank responsible for it copies the
shard's parameters and optimizer state (AdamW: param, exp_avg, exp_avg_sq) at the end of a step
and sends the copy in the background (docs/trainer.md, *Self-healing*). That copy is the only
time self-healing takes from training. This measures it — ``Shadowgrad._shard_states(shard,
clone=True)``, the code the step runs — for the largest shard of a 3-shadow layout, against a
bare ``torch.Tensor.copy_`` of the same number of bytes into preallocated memory (the
memory-bandwidth baseline, same run), and against one training iteration of the same model
(forward + backward + AdamW step, batch 16) for scale.

    .venv/bin/python bench/reseed_bench.py --sizes 10M,100M --repeat 5

Writes ``bench/results/reseed_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _median_ms(fn: Any, repeat: int) -> tuple[float, float, float]:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times), min(times), max(times)


def bench(size: str, repeat: int) -> dict[str, Any]:
    import torch

    from shadowgrad.config import parse_spec
    from shadowgrad.trainer_hooks import attach
    from shadowgrad.trainer_hooks._testing import loopback_spec

    width = _common.SIZES[size][0]  # the MLP of trainer_bench.py
    model = _common.mlp(size)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    spec = parse_spec(loopback_spec(world=1, shadows=3), env={})
    sg = attach(model, opt, spec, token="bench")
    x = torch.randn(16, width)

    def iteration() -> None:
        model(x).square().mean().backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)

    it_ms = _median_ms(iteration, repeat)  # also creates the optimizer state
    shard = max(range(sg.layout.num_shards), key=sg.layout.shard_bytes)
    states = sg._shard_states(shard, clone=True)
    nbytes = sum(t.numel() * t.element_size() for st in states for t in st.values())
    pause = _median_ms(lambda: sg._shard_states(shard, clone=True), repeat)
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8)
    memcpy = _median_ms(lambda: dst.copy_(src), repeat)
    return {
        "size": size,
        "params": nparams,
        "shard": shard,
        "shard_state_bytes": nbytes,
        "pause_ms": {"median": pause[0], "min": pause[1], "max": pause[2]},
        "memcpy_ms": {"median": memcpy[0], "min": memcpy[1], "max": memcpy[2]},
        "iteration_ms": {"median": it_ms[0], "min": it_ms[1], "max": it_ms[2]},
        "pause_vs_memcpy": pause[0] / memcpy[0],
        "pause_vs_iteration": pause[0] / it_ms[0],
        "GB_per_s": nbytes / (pause[0] / 1000) / 1e9,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10M,100M")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "reseed_bench.json"))
    args = ap.parse_args()
    import torch

    rows = [bench(s, args.repeat) for s in args.sizes.split(",")]
    for r in rows:
        print(
            f"{r['size']:>5} ({r['params'] / 1e6:.1f}M params, shard {r['shard']}: "
            f"{r['shard_state_bytes'] / 2**20:.1f} MiB): pause {r['pause_ms']['median']:.1f} ms"
            f" = {r['pause_vs_memcpy']:.2f}x memcpy ({r['memcpy_ms']['median']:.1f} ms), "
            f"{r['pause_vs_iteration']:.2f}x one iteration ({r['iteration_ms']['median']:.0f} "
            "ms)",
            flush=True,
        )
    doc = {
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": __import__("os").cpu_count(),
        },
        "repeat": args.repeat,
        "results": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
