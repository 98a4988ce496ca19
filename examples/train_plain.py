"""Plain DDP training: AdamW, warm-up + cosine LR, gradient clipping and a GradScaler.

The baseline that examples/train_mirror.py adds shadowgrad to (diff the two files). Run under
torchrun (or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):

    torchrun --nproc-per-node 4 examples/train_plain.py --steps 50
"""

import argparse
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 64, generator=g)
    return x, (x[:, :8].sum(dim=1) > 0).long()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--out", default=None, help="rank 0 saves the final state here")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(64, 128),
        nn.GELU(),
        nn.Linear(128, 128),
        nn.GELU(),
        nn.LayerNorm(128),
        nn.Linear(128, 2),
    )
    model = DistributedDataParallel(net)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=3e-3
    )
    warm = 5
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warm)
            * 0.5
            * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))
        ),
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**126, growth_interval=10)
    for step in range(0, args.steps):
        x, y = batch(step, rank)
        loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step {step} loss {loss.item().hex()}", flush=True)
    if args.out and rank == 0:
        torch.save(
            {
                "model": model.module.state_dict(),
                "optimizer": opt.state_dict(),
                "scaler": scaler.state_dict(),
            },
            args.out,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
