"""The demo's training program: one data-parallel rank (``RANK``/``WORLD_SIZE``/``MASTER_*`` from
the launcher) training a small model on generated data with shadowgrad attached.

    python -m shadowgrad.bmv2_testbed.demo_worker --spec job.toml --model mlp --steps 300
    python -m shadowgrad.bmv2_testbed.demo_worker --plain --model mlp --steps 300

``--plain`` trains the same model on the same batches with the same optimizer, clipping and
schedule *without shadowgrad*: plain gloo DDP (``loss.backward()``, ``clip_grad_norm_``,
``opt.step()``), no shadows, no switch program, nothing imported from shadowgrad's trainer
hooks. The demo times it as the baseline of the trainer overhead (docs/testbed.md).

Models (no downloads): ``mlp`` (3 linear layers) and ``transformer`` (a 2-layer encoder over
random token sequences). AdamW with weight decay, gradient clipping and a warm-up + cosine LR
schedule. Rank 0 prints ``start I RESTORED`` once and ``step I loss HEX dt SECONDS`` per step;
``--out`` saves the final model and optimizer state (rank 0).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["MODELS", "build_model", "batch", "main"]

MODELS = ("mlp", "transformer")
GLOBAL_BATCH = 48
VOCAB, SEQ = 64, 16


class _Tiny(nn.Module):
    """A 2-layer transformer encoder classifying random token sequences."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 48)
        layer = nn.TransformerEncoderLayer(48, 4, 96, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(48, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.enc(self.emb(x)).mean(dim=1))
        return out


def build_model(name: str) -> nn.Module:
    """The scenario's model, deterministic given ``torch.manual_seed(0)`` before the call."""
    torch.manual_seed(0)
    if name == "mlp":
        return nn.Sequential(
            nn.Linear(32, 96), nn.Tanh(), nn.Linear(96, 96), nn.Tanh(), nn.Linear(96, 4)
        )
    if name == "transformer":
        return _Tiny()
    raise ValueError(f"unknown model {name!r}; models: {', '.join(MODELS)}")


def batch(name: str, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s share of step ``step``'s global batch (the same for any world size)."""
    g = torch.Generator().manual_seed(step)
    if name == "transformer":
        x = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=g)
        y = (x[:, 0] % 4).long()
    else:
        x = torch.randn(GLOBAL_BATCH, 32, generator=g)
        y = torch.randint(0, 4, (GLOBAL_BATCH,), generator=g)
    per = GLOBAL_BATCH // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def main(argv: Sequence[str] | None = None) -> int:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=None, help="the job spec (required unless --plain)")
    ap.add_argument("--plain", action="store_true", help="plain DDP, without shadowgrad")
    ap.add_argument("--model", choices=MODELS, default="mlp")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--chunk-bytes", type=int, default=None)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds of 'compute' per step")
    args = ap.parse_args(argv)
    if args.spec is None and not args.plain:
        ap.error("--spec is required (or --plain)")
    if args.plain:
        import datetime

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1800))
    else:
        from shadowgrad.trainer_hooks import init_process_group

        init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(build_model(args.model))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    total = args.steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / total))
    )
    sg = None
    first = 0
    if not args.plain:
        from shadowgrad.trainer_hooks import attach

        sg = attach(
            model,
            opt,
            args.spec,
            lr_scheduler=sched,
            max_grad_norm=1.0,
            chunk_bytes=args.chunk_bytes,
        )
        start = sg.restore_or_start()
        first = start.iteration
        if rank == 0:
            print(f"start {start.iteration} {int(start.restored)}", flush=True)
    elif rank == 0:
        print("start 0 0", flush=True)
    for step in range(first, args.steps):
        t0 = time.perf_counter()
        x, y = batch(args.model, step, rank, world)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if sg is not None:
            sg.backward(loss)
            sg.step(user_state={"step": step})
        else:
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        if args.sleep:
            time.sleep(args.sleep)
        if rank == 0:
            print(
                f"step {step} loss {float(loss.item()).hex()} dt {time.perf_counter() - t0:.6f} "
                f"wall {time.time():.6f}",
                flush=True,
            )
    if sg is not None:
        sg.close()
    if args.out and rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict()}, args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
