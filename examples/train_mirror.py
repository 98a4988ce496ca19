"""examples/train_plain.py with shadowgrad: every iteration is checkpointed into the shadows.

Start the shadows of the job spec first, then run under torchrun (or any launcher that sets
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), with the job token in SHADOWGRAD_TOKEN:

    torchrun --nproc-per-node 4 examples/train_mirror.py --spec job.toml --steps 50

Run it again after a crash, or let ``torchrun --max-restarts N`` restart it: it resumes from the
newest iteration the shadows hold. Diff it against train_plain.py to see what shadowgrad adds.
"""

import argparse
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shadowgrad.trainer_hooks import attach, init_process_group, rng_state, set_rng_state


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 64, generator=g)
    return x, (x[:, :8].sum(dim=1) > 0).long()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--spec", required=True, help="shadowgrad job spec (TOML)")
    ap.add_argument("--out", default=None, help="rank 0 saves the final state here")
    args = ap.parse_args()
    init_process_group("gloo")  # dist.init_process_group that survives torchrun --max-restarts
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
    sg = attach(model, opt, args.spec, lr_scheduler=sched, grad_scaler=scaler, max_grad_norm=1.0)
    start = sg.restore_or_start()
    if start.restored:  # RNGs and data position come back as the user state of the last step
        set_rng_state(start.user_state["rng"])
    for step in range(start.iteration, args.steps):
        x, y = batch(step, rank)
        loss = nn.functional.cross_entropy(model(x), y)
        sg.backward(loss)  # scaler.scale(loss).backward()
        # unscale, clip, optimizer + scaler step, scheduler, zero_grad, COMMIT
        sg.step(user_state={"rng": rng_state(), "step": step})
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
    sg.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
