"""Reference CPU training for the shadows' tests: two small models, :class:`Case` (one
training configuration: optimizer, clipping, loss scaling with skipped steps, ...) and
:class:`RefTrainer`, a training loop that hands out each iteration's gradient and COMMIT record;
plus the glue between a trainer's tensors and a layout's shards (:func:`bucket_bytes`,
:func:`initial_states`, :func:`compare_shard`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from shadowgrad import wire
from shadowgrad.layout import Box, Layout, from_module
from shadowgrad.optspec import OptimizerSpec

__all__ = [
    "MLP",
    "Case",
    "RefTrainer",
    "TinyTransformer",
    "box_slice",
    "bucket_bytes",
    "compare_shard",
    "initial_states",
]


class MLP(nn.Module):
    def __init__(self, d_in: int = 24, hidden: int = 96, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = self.norm(torch.relu(self.fc2(h)))
        out: torch.Tensor = self.out(h)
        return out


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 32, layers: int = 2, seq: int = 12) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.enc(self.emb(x) + self.pos))
        return out


def _warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))

    return f


@dataclass
class Case:
    """One reference training configuration."""

    name: str
    model: str  # "mlp" | "transformer"
    optimizer: str  # "adamw" | "sgd"
    scaler: bool = False
    skip_at: tuple[int, ...] = ()  # iterations whose loss is made non-finite (scaler skips)
    clip: float | None = 1.0
    iterations: int = 100
    foreach: bool = False
    fused: bool = False


class RefTrainer:
    """A CPU training loop that reports, per iteration, the gradient right after backward and
    the COMMIT record of its step decision."""

    def __init__(self, case: Case, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.case = case
        self.gen = torch.Generator().manual_seed(seed + 1)
        if case.model == "mlp":
            self.model: nn.Module = MLP()
        else:
            self.model = TinyTransformer()
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.model.named_parameters() if p.dim() < 2]
        if case.optimizer == "adamw":
            self.opt: torch.optim.Optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                lr=3e-3,
                betas=(0.9, 0.95),
                eps=1e-8,
                foreach=case.foreach,
                fused=case.fused,
            )
        else:
            self.opt = torch.optim.SGD(
                [
                    {"params": decay, "weight_decay": 1e-4},
                    {"params": no_decay, "weight_decay": 0.0},
                ],
                lr=0.05,
                momentum=0.9,
                nesterov=True,
                foreach=case.foreach,
            )
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, _warmup_cosine(10, case.iterations)
        )
        self.scaler = (
            torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=7)
            if case.scaler
            else None
        )
        self.named = dict(self.model.named_parameters())

    def optimizer_spec(self) -> OptimizerSpec:
        return OptimizerSpec.from_optimizer(self.opt, self.model.named_parameters())

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.case.model == "mlp":
            x = torch.randn(16, 24, generator=self.gen)
            y = torch.randint(0, 10, (16,), generator=self.gen)
        else:
            x = torch.randint(0, 50, (4, 12), generator=self.gen)
            y = torch.randint(0, 50, (4, 12), generator=self.gen)
        return x, y

    def step(self, it: int) -> tuple[dict[str, torch.Tensor], wire.CommitRecord]:
        x, y = self._batch()
        self.opt.zero_grad(set_to_none=False)
        out = self.model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        if it in self.case.skip_at:
            loss = loss * float("inf")
        lrs = tuple(float(g["lr"]) for g in self.opt.param_groups)
        scale: float | None = None
        if self.scaler is not None:
            scale = float(self.scaler.get_scale())
            self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        else:
            loss.backward()  # type: ignore[no-untyped-call]
        grads = {n: p.grad.detach().clone() for n, p in self.named.items() if p.grad is not None}
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        skipped = self.scaler is not None and not all(
            bool(torch.isfinite(p.grad).all()) for p in self.named.values() if p.grad is not None
        )
        clip_coef: float | None = None
        if self.case.clip is not None:
            total = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.case.clip)
            clip_coef = float(torch.clamp(self.case.clip / (total + 1e-6), max=1.0))
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.sched.step()
        return grads, wire.CommitRecord(lrs, clip_coef=clip_coef, loss_scale=scale, skipped=skipped)

    def layout(self, num_shadows: int, replication: int = 1, max_piece_bytes: int = 4096) -> Layout:
        params, buckets = from_module(self.model, bucket_cap_mb=0.004)
        return Layout.build(
            params, buckets, num_shadows, replication, max_piece_bytes=max_piece_bytes
        )


def bucket_bytes(layout: Layout, grads: Mapping[str, torch.Tensor]) -> list[bytes]:
    """Each DDP bucket's flat buffer (bucket order, no padding) from per-name gradients."""
    out = []
    for names in layout.buckets:
        flat = torch.cat([grads[n].reshape(-1) for n in names])
        out.append(flat.view(torch.uint8).numpy().tobytes())
    return out


def box_slice(t: torch.Tensor, box: Box) -> torch.Tensor:
    if not box.lengths or t.dim() == 0:
        return t
    return t[box.offsets[0] : box.offsets[0] + box.lengths[0]]


def initial_states(
    layout: Layout, shard: int, named: Mapping[str, torch.Tensor]
) -> list[dict[str, torch.Tensor]]:
    """Per box of ``shard``: ``{"param": rows of the parameter}`` (iteration -1)."""
    return [
        {"param": box_slice(named[b.name].detach(), b).clone()} for b in layout.shard_boxes(shard)
    ]


def compare_shard(
    layout: Layout,
    shard: int,
    fetched: Mapping[int, Mapping[str, torch.Tensor]],
    named: Mapping[str, torch.Tensor],
    opt_state: Mapping[str, Mapping[str, torch.Tensor]],
) -> list[str]:
    """Mismatches (empty list = bit-exact) between a shard's fetched boxes and the trainer."""
    bad: list[str] = []
    boxes = layout.shard_boxes(shard)
    if sorted(fetched) != list(range(len(boxes))):
        return [f"shard {shard}: boxes {sorted(fetched)}"]
    for k, box in enumerate(boxes):
        got = fetched[k]
        want: dict[str, torch.Tensor] = {"param": box_slice(named[box.name].detach(), box)}
        for key, t in opt_state.get(box.name, {}).items():
            want[key] = box_slice(t, box) if t.dim() > 0 else t
        if set(got) != set(want):
            bad.append(f"{box.name}{box.offsets}: keys {sorted(got)} != {sorted(want)}")
            continue
        for key, t in want.items():
            g = got[key]
            if g.dtype != t.dtype or tuple(g.shape) != tuple(t.shape) or not torch.equal(g, t):
                diff = (g.double() - t.double()).abs().max().item() if g.shape == t.shape else None
                bad.append(f"{box.name}{box.offsets}[{key}]: differs (max abs {diff})")
    return bad
