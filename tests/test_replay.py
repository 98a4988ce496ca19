"""Bit-exact optimizer replay (invariant 1): shadowgrad.optspec and shadowgrad.shadow.replay.

The core proof: reference CPU training loops run 100 iterations; the gradient each trainer had
right after backward (what the all-reduce delivers, before unscale or clip) and a COMMIT record
built from what its loop did are fed to 3 shard replayers whose layout splits tensors; after
every iteration the union of the shards equals the trainer's parameters and optimizer state
under ``torch.equal``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from shadowgrad.layout import Layout, ParamSpec, from_module
from shadowgrad.optspec import (
    OptimizerSpec,
    OptSpecError,
    ParamGroupSpec,
    load_state_by_name,
    state_by_name,
)
from shadowgrad.shadow.replay import (
    ReplayDivergedError,
    ReplayError,
    ReplayInputError,
    ReplayOrderError,
    ShardReplayer,
    assemble_full,
    box_states_from_full,
)
from shadowgrad.wire import CommitRecord

ITERS = 100


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """The models here are tiny: one intra-op thread is as fast, and on a busy machine far
    faster than threads that wait for each other (tests that need threads set them)."""
    with _threads(1):
        yield


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------


class MLP(nn.Module):
    """Small MLP with a 2-D embedding (rows of 192), a long 1-D vector (odd tail) and a 0-d
    temperature, so the layout cuts 2-D and 1-D tensors and keeps a 0-d one whole."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 192)
        self.fc1 = nn.Linear(64, 192)
        self.norm = nn.LayerNorm(192)
        self.fc2 = nn.Linear(192, 96)
        self.fc3 = nn.Linear(96, 10)
        self.vec = nn.Parameter(torch.randn(4100) * 0.1)
        self.temp = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("ramp", torch.linspace(-1.0, 1.0, 4100))

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.fc1(x) + self.emb(ids)))
        h = torch.tanh(self.fc2(h))
        out: torch.Tensor = self.fc3(h) / self.temp
        return out

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, ids, y = batch
        ramp: torch.Tensor = self.ramp  # type: ignore[assignment]
        extra = (self.vec * ramp).sin().sum() * 1e-2
        return nn.functional.cross_entropy(self(x, ids), y) + extra


def mlp_batch(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (
        torch.randn(16, 64, generator=gen),
        torch.randint(0, 40, (16,), generator=gen),
        torch.randint(0, 10, (16,), generator=gen),
    )


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 16)

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.head(self.enc(x)), y)


def tf_batch(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return torch.randn(4, 8, 32, generator=gen), torch.randn(4, 8, 16, generator=gen)


def two_groups(model: nn.Module, wd: float) -> list[dict[str, Any]]:
    """Weight decay on matrices and the long vector, none on biases, norms and the 0-d temp."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 or n == "vec"]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 or n == "vec")]
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def warmup_cosine(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    def factor(i: int) -> float:
        if i < 10:
            return (i + 1) / 10
        return 0.5 * (1.0 + math.cos(math.pi * (i - 10) / (ITERS - 10)))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def sequential_warmup_cosine(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=8)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=ITERS - 8, eta_min=1e-5)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[8])


# ----------------------------------------------------------------------------------------------
# the reference trainer and its COMMIT helper
# ----------------------------------------------------------------------------------------------


@dataclass
class Case:
    make_model: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    make_opt: Callable[[nn.Module], torch.optim.Optimizer]
    make_sched: Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler] | None
    max_norm: float | None = None
    scaler: dict[str, Any] | None = None  #: GradScaler("cpu", **scaler)
    unscale: str = "explicit"  #: "explicit": scaler.unscale_ before clip/step; "in_step": not
    inf_at: tuple[int, ...] = ()  #: iterations whose gradient gets an inf after backward
    max_piece_bytes: int = 4096


class Trainer:
    """A CPU training loop; :meth:`iteration` returns the post-backward gradients by name and
    the COMMIT record describing what the loop did with them."""

    def __init__(self, case: Case, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.case = case
        self.model = case.make_model()
        self.named = dict(self.model.named_parameters())
        self.opt = case.make_opt(self.model)
        self.sched = case.make_sched(self.opt) if case.make_sched else None
        self.scaler = torch.amp.GradScaler("cpu", **case.scaler) if case.scaler else None
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.skipped: list[int] = []

    def iteration(self, i: int) -> tuple[dict[str, torch.Tensor], CommitRecord]:
        case, opt = self.case, self.opt
        opt.zero_grad(set_to_none=True)
        loss = self.model.loss(case.batch(self.gen))  # type: ignore[operator]
        lrs = tuple(float(g["lr"]) for g in opt.param_groups)  # the LR this step uses
        scale = None
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if i in case.inf_at:
            grad = self.named["fc2.weight" if "fc2.weight" in self.named else "head.weight"].grad
            assert grad is not None
            grad.view(-1)[(7 * i) % grad.numel()] = math.inf
        raw = {n: p.grad.detach().clone() for n, p in self.named.items() if p.grad is not None}
        if self.scaler is not None and case.unscale == "explicit":
            self.scaler.unscale_(opt)
        coef = None
        if case.max_norm is not None:
            total = nn.utils.clip_grad_norm_(self.model.parameters(), case.max_norm)
            # the very expression clip_grad_norm_ evaluates (fp32 0-d tensors)
            coef = float(torch.clamp(case.max_norm / (total + 1e-6), max=1.0).item())
        skipped = False
        if self.scaler is not None:
            self.scaler.step(opt)
            self.scaler.update()
            assert scale is not None
            skipped = self.scaler.get_scale() < scale  # the scaler backs off only on inf/NaN
        else:
            opt.step()
        if skipped:
            self.skipped.append(i)
        if self.sched is not None:
            self.sched.step()
        return raw, CommitRecord(lrs=lrs, clip_coef=coef, loss_scale=scale, skipped=skipped)


class Shadows:
    """The shard replayers of a layout, fed through per-shard flat byte buffers (like the node's
    reassembly buffers: each box's gradient is a view into its shard's buffer)."""

    def __init__(
        self, layout: Layout, spec: OptimizerSpec, trainer: Trainer, iteration: int = -1
    ) -> None:
        self.layout = layout
        self.reps = [ShardReplayer(layout, s, spec) for s in range(layout.num_shards)]
        self.bufs = [
            torch.empty(layout.shard_bytes(s), dtype=torch.uint8) for s in range(layout.num_shards)
        ]
        self.views: list[list[torch.Tensor]] = []
        for s in range(layout.num_shards):
            off, views = 0, []
            for box in layout.shard_boxes(s):
                dtype = {"float32": torch.float32}[box.dtype]
                views.append(self.bufs[s][off : off + box.nbytes].view(dtype).view(box.lengths))
                off += box.nbytes
            self.views.append(views)
        optim = state_by_name(trainer.opt, trainer.named)
        for s, rep in enumerate(self.reps):
            rep.load(iteration, box_states_from_full(layout, s, trainer.named, optim))

    def step(self, i: int, raw: dict[str, torch.Tensor], commit: CommitRecord) -> None:
        for s, rep in enumerate(self.reps):
            for box, view in zip(self.layout.shard_boxes(s), self.views[s], strict=True):
                full = raw[box.name]
                view.copy_(full.narrow(0, box.offsets[0], box.lengths[0]) if box.offsets else full)
            rep.step(i, self.views[s], commit)

    def assembled(self) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        return assemble_full(self.layout, [r.export(copy=False) for r in self.reps])


def assert_exact(trainer: Trainer, shadows: Shadows, i: int) -> None:
    params, states = shadows.assembled()
    assert params.keys() == trainer.named.keys()
    for name, p in trainer.named.items():
        assert torch.equal(params[name], p.detach()), (
            f"iteration {i}: parameter {name} differs, max |diff| ="
            f" {(params[name] - p.detach()).abs().max().item()}"
        )
    want = state_by_name(trainer.opt, trainer.named)
    assert states.keys() == want.keys(), f"iteration {i}: state for {sorted(states)}"
    for name, st in want.items():
        assert states[name].keys() == st.keys(), f"iteration {i}: {name} state keys"
        for key, value in st.items():
            got = states[name][key]
            assert got.dtype == value.dtype and torch.equal(got, value), (
                f"iteration {i}: {name}.{key} differs"
            )


def make_layout(model: nn.Module, max_piece_bytes: int) -> Layout:
    params, buckets = from_module(model, bucket_cap_mb=0.02)
    layout = Layout.build(params, buckets, num_shadows=3, max_piece_bytes=max_piece_bytes)
    # the proof has teeth only if tensors really are split across shards, at 64- but not always
    # 128-element boundaries
    split = [
        n
        for n in layout.placements
        if len({layout.box_shards[layout.boxes.index(b)] for b in layout.tensor_boxes(n)}) > 1
    ]
    assert len(split) >= 2, "layout does not split tensors across shards"
    cuts = [b.elem_start for b in layout.boxes if b.elem_start]
    assert cuts and all(c % 64 == 0 for c in cuts) and any(c % 128 for c in cuts)
    return layout


def run_case(case: Case, iters: int = ITERS) -> Trainer:
    trainer = Trainer(case)
    layout = make_layout(trainer.model, case.max_piece_bytes)
    spec = OptimizerSpec.from_optimizer(trainer.opt, trainer.named, scaler_unscale=case.unscale)  # type: ignore[arg-type]
    spec = OptimizerSpec.from_json(spec.to_json())  # what the shadows receive
    shadows = Shadows(layout, spec, trainer)
    assert_exact(trainer, shadows, -1)
    for i in range(iters):
        raw, commit = trainer.iteration(i)
        shadows.step(i, raw, commit)
        assert_exact(trainer, shadows, i)
    assert all(r.last_applied == iters - 1 for r in shadows.reps)
    assert trainer.skipped == sorted(set(case.inf_at))  # skips happened exactly where forced
    return trainer


# ----------------------------------------------------------------------------------------------
# the proof: (a) transformer + AdamW, (b) SGD, (c) Adam + GradScaler, (d) fused / foreach
# ----------------------------------------------------------------------------------------------


def _adamw(**kw: Any) -> Callable[[nn.Module], torch.optim.Optimizer]:
    return lambda m: torch.optim.AdamW(two_groups(m, 0.1), lr=3e-3, **kw)


@pytest.mark.slow
def test_a_transformer_adamw_clip_warmup_cosine_two_groups() -> None:
    run_case(
        Case(TinyTransformer, tf_batch, _adamw(), warmup_cosine, max_norm=1.0, max_piece_bytes=2000)
    )


@pytest.mark.parametrize(
    "sgd",
    [
        {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
        {"momentum": 0.9, "dampening": 0.2, "nesterov": False, "weight_decay": 1e-3},
        {"momentum": 0.8, "nesterov": True, "weight_decay": 1e-3, "fused": True},
    ],
    ids=["nesterov", "dampening", "fused-nesterov"],
)
def test_b_mlp_sgd_momentum(sgd: dict[str, Any]) -> None:
    def make(m: nn.Module) -> torch.optim.Optimizer:
        groups = two_groups(m, sgd["weight_decay"])
        groups[1]["lr"] = 0.02  # per-group LR
        return torch.optim.SGD(
            groups, lr=0.05, **{k: v for k, v in sgd.items() if k != "weight_decay"}
        )

    sched = lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [30, 70], 0.3)  # noqa: E731
    run_case(Case(MLP, mlp_batch, make, sched, max_norm=2.0))


# a skipped first step makes torch warn that the scheduler stepped before the optimizer
@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
@pytest.mark.parametrize(
    "scaler",
    [
        {"init_scale": 2.0**12, "growth_interval": 6},
        {"init_scale": 1000.0, "growth_factor": 1.5, "backoff_factor": 0.7, "growth_interval": 9},
    ],
    ids=["pow2-scale", "odd-scale"],
)
def test_c_mlp_adam_gradscaler_skips_and_clip_after_unscale(scaler: dict[str, Any]) -> None:
    make = lambda m: torch.optim.Adam(two_groups(m, 1e-3), lr=2e-3, amsgrad=True)  # noqa: E731
    trainer = run_case(
        Case(MLP, mlp_batch, make, warmup_cosine, max_norm=1.0, scaler=scaler, inf_at=(0, 37, 38))
    )
    assert trainer.skipped == [0, 37, 38]


@pytest.mark.parametrize("impl", [{"fused": True}, {"foreach": True}], ids=["fused", "foreach"])
def test_d_transformer_adamw_fused_and_foreach(impl: dict[str, bool]) -> None:
    run_case(
        Case(
            TinyTransformer,
            tf_batch,
            _adamw(**impl),
            sequential_warmup_cosine,
            max_norm=1.0,
            max_piece_bytes=2000,
        )
    )


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
@pytest.mark.parametrize(
    "unscale,max_norm,scaler",
    [
        ("explicit", 1.0, {"init_scale": 2.0**10, "growth_interval": 5}),
        (
            "in_step",
            None,
            {
                "init_scale": 1000.0,
                "growth_factor": 1.5,
                "backoff_factor": 0.7,
                "growth_interval": 7,
            },
        ),
    ],
    ids=["explicit-unscale-clip", "in-kernel-unscale-odd-scale"],
)
def test_d_mlp_fused_adamw_gradscaler(
    unscale: str, max_norm: float | None, scaler: dict[str, Any]
) -> None:
    """A fused optimizer under GradScaler is stepped even on a skipped iteration (the kernel
    gets found_inf): torch then creates the state lazily, so skipping iteration 0 matters."""
    trainer = run_case(
        Case(
            MLP,
            mlp_batch,
            _adamw(fused=True),
            warmup_cosine,
            max_norm=max_norm,
            scaler=scaler,
            unscale=unscale,
            inf_at=(0, 50),
        )
    )
    assert state_by_name(trainer.opt, trainer.named)  # state exists


# ----------------------------------------------------------------------------------------------
# the comparison has teeth; threads; bootstrap and resume
# ----------------------------------------------------------------------------------------------


def _mlp_adamw_case() -> Case:
    return Case(MLP, mlp_batch, _adamw(), warmup_cosine, max_norm=0.5)


@pytest.mark.parametrize("tamper", ["lr-tiny", "no-clip", "clip-coef-ulp"])
def test_tampered_commit_is_detected(tamper: str) -> None:
    """Negative control: a tiny change of one COMMIT value breaks equality at once."""
    case = _mlp_adamw_case()
    trainer = Trainer(case)
    layout = make_layout(trainer.model, case.max_piece_bytes)
    shadows = Shadows(layout, OptimizerSpec.from_optimizer(trainer.opt, trainer.named), trainer)
    for i in range(3):
        raw, c = trainer.iteration(i)
        assert c.clip_coef is not None and c.clip_coef < 1.0  # clipping is active
        if i == 2:
            if tamper == "lr-tiny":
                # torch rounds lr-derived factors to fp32, so change lr by ~8 fp32 ulps
                c = CommitRecord((c.lrs[0] * (1 + 2.0**-20), *c.lrs[1:]), c.clip_coef)
            elif tamper == "no-clip":
                c = CommitRecord(c.lrs, None)
            else:
                coef = float(torch.tensor(c.clip_coef).nextafter(torch.tensor(2.0)))
                c = CommitRecord(c.lrs, coef)
        shadows.step(i, raw, c)
        if i < 2:
            assert_exact(trainer, shadows, i)
    with pytest.raises(AssertionError, match="differs"):
        assert_exact(trainer, shadows, 2)


@contextmanager
def _threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize(
    "opt",
    [
        {"cls": "AdamW"},
        {"cls": "AdamW", "foreach": True},
        {"cls": "AdamW", "fused": True},
        {"cls": "SGD", "momentum": 0.9, "nesterov": True, "fused": True},
        {"cls": "SGD", "momentum": 0.9, "dampening": 0.1},
    ],
    ids=["adamw-forloop", "adamw-foreach", "adamw-fused", "sgd-fused", "sgd-forloop"],
)
def test_thread_count_of_trainer_and_shadow_do_not_matter(opt: dict[str, Any]) -> None:
    """Trainer with 2 intra-op threads on whole tensors, shadows with 1 thread on pieces:
    tensors large enough (> 32768 elements) that torch really splits the work by thread."""
    kw = {k: v for k, v in opt.items() if k != "cls"}
    shapes = {"w": (1571, 96), "v": (70001,)}
    torch.manual_seed(3)
    named = {n: nn.Parameter(torch.randn(s)) for n, s in shapes.items()}
    cls = getattr(torch.optim, opt["cls"])
    trainer_opt = cls(list(named.values()), lr=1e-2, weight_decay=0.01, **kw)
    params = [ParamSpec(n, s, "float32") for n, s in shapes.items()]
    layout = Layout.build(params, [list(shapes)], num_shadows=3, max_piece_bytes=60_000)
    assert len(layout.boxes) >= 8
    spec = OptimizerSpec.from_optimizer(trainer_opt, named)
    reps = [ShardReplayer(layout, s, spec) for s in range(3)]
    for s, r in enumerate(reps):
        r.load(-1, box_states_from_full(layout, s, named))
    gen = torch.Generator().manual_seed(4)
    for i in range(4):
        grads = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
        with _threads(2):
            for n, p in named.items():
                p.grad = grads[n].clone()
            trainer_opt.step()
        commit = CommitRecord((1e-2,))
        with _threads(1):
            for s, r in enumerate(reps):
                r.step(
                    i,
                    [
                        grads[b.name].narrow(0, b.offsets[0], b.lengths[0]).clone()
                        for b in layout.shard_boxes(s)
                    ],
                    commit,
                )
    got_p, got_s = assemble_full(layout, [r.export() for r in reps])
    want_s = state_by_name(trainer_opt, named)
    for n, p in named.items():
        assert torch.equal(got_p[n], p.detach())
        for k, v in want_s[n].items():
            assert torch.equal(got_s[n][k], v), f"{n}.{k}"


def test_bootstrap_mid_run_and_resume_trainer_from_shadows() -> None:
    """Shadows bootstrapped from the trainer's state at iteration 29 stay exact; a fresh trainer
    restored from the shadows' state at iteration 59 continues bit-identically."""
    case = Case(
        MLP,
        mlp_batch,
        lambda m: torch.optim.Adam(two_groups(m, 1e-3), lr=2e-3),
        warmup_cosine,
        max_norm=1.0,
        scaler={"init_scale": 2.0**8, "growth_interval": 4},
    )
    trainer = Trainer(case)
    layout = make_layout(trainer.model, case.max_piece_bytes)
    spec = OptimizerSpec.from_optimizer(trainer.opt, trainer.named)
    for i in range(30):
        trainer.iteration(i)
    shadows = Shadows(layout, spec, trainer, iteration=29)
    assert_exact(trainer, shadows, 29)
    for i in range(30, 60):
        shadows.step(i, *trainer.iteration(i))
    assert_exact(trainer, shadows, 59)

    # restore: a new trainer process would load params, optimizer state, scheduler and scaler
    restored = Trainer(case, seed=123)  # different init: everything must come from the shadows
    params, states = shadows.assembled()
    with torch.no_grad():
        for name, p in restored.named.items():
            p.copy_(params[name])
    load_state_by_name(restored.opt, restored.named, states)
    assert restored.sched is not None and trainer.sched is not None
    assert restored.scaler is not None and trainer.scaler is not None
    restored.sched.load_state_dict(trainer.sched.state_dict())
    for group, lr in zip(restored.opt.param_groups, restored.sched.get_last_lr(), strict=True):
        group["lr"] = lr  # the LR of the next step (the scheduler keeps it; groups do not)
    restored.scaler.load_state_dict(trainer.scaler.state_dict())
    restored.gen.set_state(trainer.gen.get_state())  # the user-state blob (data position)
    for i in range(60, 70):
        trainer.iteration(i)
        restored.iteration(i)
    for name, p in trainer.named.items():
        assert torch.equal(p, restored.named[name])
    want, got = (state_by_name(t.opt, t.named) for t in (trainer, restored))
    assert all(torch.equal(want[n][k], got[n][k]) for n in want for k in want[n])


# ----------------------------------------------------------------------------------------------
# API behaviour and errors
# ----------------------------------------------------------------------------------------------


def _small() -> tuple[Layout, OptimizerSpec, dict[str, nn.Parameter], torch.optim.Optimizer]:
    torch.manual_seed(0)
    named = {"a": nn.Parameter(torch.randn(300, 8)), "b": nn.Parameter(torch.randn(5))}
    opt = torch.optim.AdamW(
        [{"params": [named["a"]]}, {"params": [named["b"]], "weight_decay": 0.0}], lr=1e-3
    )
    params = [ParamSpec("a", (300, 8), "float32"), ParamSpec("b", (5,), "float32")]
    layout = Layout.build(params, [["a", "b"]], num_shadows=2, max_piece_bytes=2048)
    return layout, OptimizerSpec.from_optimizer(opt, named), named, opt


def _loaded(shard: int = 0) -> tuple[ShardReplayer, Layout, dict[str, nn.Parameter]]:
    layout, spec, named, _ = _small()
    rep = ShardReplayer(layout, shard, spec)
    rep.load(-1, box_states_from_full(layout, shard, named))
    return rep, layout, named


def _zeros(rep: ShardReplayer) -> list[torch.Tensor]:
    return [torch.zeros(b.lengths) for b in rep.boxes]


def test_order_is_enforced_and_state_untouched_on_errors() -> None:
    layout, spec, named, _ = _small()
    rep = ShardReplayer(layout, 0, spec)
    assert rep.last_applied is None
    with pytest.raises(ReplayInputError, match="before load"):
        rep.step(0, _zeros(rep), CommitRecord((1e-3, 1e-3)))
    rep.load(-1, box_states_from_full(layout, 0, named))
    before = rep.nbytes_state
    with pytest.raises(ReplayOrderError) as info:
        rep.step(1, _zeros(rep), CommitRecord((1e-3, 1e-3)))
    assert (info.value.expected, info.value.got) == (0, 1)
    rep.step(0, _zeros(rep), CommitRecord((1e-3, 1e-3)))
    assert rep.last_applied == 0
    assert rep.nbytes_state == 3 * before + 4 * len(rep.boxes)  # lazily created AdamW state
    with pytest.raises(ReplayOrderError):
        rep.step(0, _zeros(rep), CommitRecord((1e-3, 1e-3)))


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda g, c: (g[:-1], c), "gradients for shard"),
        (lambda g, c: ([g[0].double(), *g[1:]], c), "expected"),
        (lambda g, c: ([g[0][1:], *g[1:]], c), "expected"),
        (lambda g, c: (g, CommitRecord((1e-3,))), "learning rates"),
        (lambda g, c: (g, CommitRecord((1e-3, 1e-3), loss_scale=0.1)), "loss_scale"),
        (lambda g, c: (g, CommitRecord((1e-3, 1e-3), loss_scale=-4.0)), "loss_scale"),
        (lambda g, c: (g, CommitRecord((1e-3, 1e-3), clip_coef=0.1)), "clip_coef"),
    ],
    ids=["count", "dtype", "shape", "lrs", "scale-not-fp32", "scale-negative", "coef-not-fp32"],
)
def test_bad_step_input(mutate: Callable[..., Any], match: str) -> None:
    rep, _, _ = _loaded()
    grads, commit = mutate(_zeros(rep), CommitRecord((1e-3, 1e-3)))
    snapshot = rep.export()
    with pytest.raises(ReplayInputError, match=match):
        rep.step(0, grads, commit)
    assert rep.last_applied == -1
    assert all(
        torch.equal(a[k], b[k]) for a, b in zip(snapshot, rep.export(), strict=True) for k in a
    )


def test_export_into_an_earlier_copy_overwrites_it_and_a_mismatch_clones() -> None:
    """The retained state of the consistent cut is copied into the previous retained copy
    (no allocation per step): same tensors, the live values, independent of the live state."""
    rep, _, _ = _loaded()
    first = rep.export()  # before the first step: no optimizer state yet
    grads = [torch.full(b.lengths, 0.5) for b in rep.boxes]
    rep.step(0, grads, CommitRecord((1e-3, 1e-3)))
    older = rep.export()
    rep.step(1, grads, CommitRecord((1e-3, 1e-3)))
    live = rep.export(copy=False)
    ptrs = [t.data_ptr() for st in older for t in st.values()]
    got = rep.export(into=older)
    assert [t.data_ptr() for st in got for t in st.values()] == ptrs  # reused, not allocated
    assert all(torch.equal(a[k], b[k]) for a, b in zip(got, live, strict=True) for k in a)
    assert all(
        a[k].data_ptr() != b[k].data_ptr() for a, b in zip(got, live, strict=True) for k in a
    )
    # a copy whose structure differs (no optimizer state: another step count) is not used
    assert any(set(a) != set(b) for a, b in zip(first, got, strict=True))
    fresh = rep.export(into=first)
    assert all(
        t.data_ptr() not in {u.data_ptr() for st in first for u in st.values()}
        for st in fresh
        for t in st.values()
    )
    assert all(torch.equal(a[k], b[k]) for a, b in zip(fresh, live, strict=True) for k in a)


def test_nonfinite_gradient_in_unskipped_step_is_divergence() -> None:
    rep, _, _ = _loaded()
    grads = _zeros(rep)
    grads[-1].view(-1)[0] = math.nan
    snapshot = rep.export()
    with pytest.raises(ReplayDivergedError, match="did not skip"):
        rep.step(0, grads, CommitRecord((1e-3, 1e-3), loss_scale=1024.0))
    assert rep.last_applied == -1
    assert all(
        torch.equal(a["param"], b["param"]) for a, b in zip(snapshot, rep.export(), strict=True)
    )
    # the same data with the trainer's skip decision is fine, and steps nothing
    rep.step(0, grads, CommitRecord((1e-3, 1e-3), loss_scale=1024.0, skipped=True))
    assert rep.last_applied == 0 and all("step" not in st for st in rep.export())


def test_fused_sgd_skipped_first_step_under_scaler_is_refused() -> None:
    named = {"w": nn.Parameter(torch.randn(256))}
    opt = torch.optim.SGD(named.values(), lr=0.1, momentum=0.9, fused=True)
    layout = Layout.build(
        [ParamSpec("w", (256,), "float32")], [["w"]], num_shadows=1, max_piece_bytes=2**20
    )
    rep = ShardReplayer(layout, 0, OptimizerSpec.from_optimizer(opt, named))
    rep.load(-1, box_states_from_full(layout, 0, named))
    grads = [torch.full((256,), math.inf)]
    with pytest.raises(ReplayDivergedError, match="uninitialised"):
        rep.step(0, grads, CommitRecord((0.1,), loss_scale=1024.0, skipped=True))
    assert rep.last_applied == -1
    # after a real first step the same skip is replayable
    rep.step(0, [torch.ones(256)], CommitRecord((0.1,), loss_scale=1.0))
    rep.step(1, grads, CommitRecord((0.1,), loss_scale=1024.0, skipped=True))


def test_failed_optimizer_step_poisons_until_load(monkeypatch: pytest.MonkeyPatch) -> None:
    rep, layout, named = _loaded()

    def boom(*_: Any, **__: Any) -> None:
        raise RuntimeError("kernel exploded")

    assert rep._opt is not None
    monkeypatch.setattr(rep._opt, "step", boom)
    with pytest.raises(ReplayDivergedError, match="kernel exploded"):
        rep.step(0, _zeros(rep), CommitRecord((1e-3, 1e-3)))
    monkeypatch.undo()
    with pytest.raises(ReplayDivergedError, match="load a state first"):
        rep.step(0, _zeros(rep), CommitRecord((1e-3, 1e-3)))
    rep.load(-1, box_states_from_full(layout, 0, named))
    rep.step(0, _zeros(rep), CommitRecord((1e-3, 1e-3)))


def test_load_validates_and_copies() -> None:
    layout, spec, named, opt = _small()
    rep = ShardReplayer(layout, 0, spec)
    for p in named.values():
        p.grad = torch.ones_like(p)
    opt.step()
    optim = state_by_name(opt, named)
    good = box_states_from_full(layout, 0, named, optim)
    bad_cases: list[tuple[list[dict[str, torch.Tensor]], str]] = [
        (good[:-1], "box states"),
        ([{k: v for k, v in good[0].items() if k != "param"}, *good[1:]], "no 'param'"),
        ([{k: v for k, v in good[0].items() if k != "exp_avg"}, *good[1:]], "state keys"),
        ([{**good[0], "exp_avg": good[0]["exp_avg"][1:]}, *good[1:]], "'exp_avg' is"),
        ([{**good[0], "step": torch.ones(2)}, *good[1:]], "0-d floating"),
    ]
    for states, match in bad_cases:
        with pytest.raises(ReplayInputError, match=match):
            rep.load(0, states)
        assert rep.last_applied is None
    with pytest.raises(ReplayInputError, match="iteration"):
        rep.load(-2, good)
    rep.load(0, good)
    with torch.no_grad():
        named["a"].add_(1.0)  # the replayer owns copies
    exported = rep.export()
    assert not torch.equal(exported[0]["param"], good[0]["param"])
    assert exported[0]["step"].item() == 1.0
    live = rep.export(copy=False)
    assert live[0]["param"].data_ptr() != exported[0]["param"].data_ptr()


def test_empty_shard_and_single_tensor_whole() -> None:
    named = {"t": nn.Parameter(torch.tensor(2.0))}
    opt = torch.optim.SGD(named.values(), lr=0.1, momentum=0.9)
    layout = Layout.build([ParamSpec("t", (), "float32")], [["t"]], num_shadows=3)
    spec = OptimizerSpec.from_optimizer(opt, named)
    reps = [ShardReplayer(layout, s, spec) for s in range(3)]
    assert sorted(len(r.boxes) for r in reps) == [0, 0, 1]
    for s, r in enumerate(reps):
        r.load(-1, box_states_from_full(layout, s, named))
    for i in range(3):
        named["t"].grad = torch.tensor(float(i + 1))
        opt.step()
        for s, r in enumerate(reps):
            r.step(
                i, [named["t"].grad.clone() for _ in layout.shard_boxes(s)], CommitRecord((0.1,))
            )
    params, states = assemble_full(layout, [r.export() for r in reps])
    assert torch.equal(params["t"], named["t"].detach())
    assert torch.equal(states["t"]["momentum_buffer"], opt.state[named["t"]]["momentum_buffer"])


def test_assemble_full_detects_inconsistent_boxes() -> None:
    layout, spec, named, _ = _small()
    assert len(layout.tensor_boxes("a")) >= 2
    reps = [ShardReplayer(layout, s, spec) for s in range(2)]
    for s, r in enumerate(reps):
        r.load(-1, box_states_from_full(layout, s, named))
        r.step(0, _zeros(r), CommitRecord((1e-3, 1e-3)))
    exports = [r.export() for r in reps]
    assemble_full(layout, exports)
    exports[0][0]["step"] += 1.0
    with pytest.raises(ReplayError, match="disagree on 'step'"):
        assemble_full(layout, exports)
    exports[0][0].pop("step")
    with pytest.raises(ReplayError, match="disagree on optimizer state"):
        assemble_full(layout, exports)
    with pytest.raises(ReplayInputError, match="shard exports"):
        assemble_full(layout, exports[:1])


def test_replayer_rejects_spec_layout_mismatch_and_dtype_policy() -> None:
    layout, spec, _, _ = _small()
    other = OptimizerSpec(spec.type, (spec.groups[0],))
    with pytest.raises(ReplayInputError, match="'b' is in no param group"):
        ShardReplayer(layout, 0, other)
    with pytest.raises(ReplayInputError, match="dtype_policy"):
        ShardReplayer(layout, 0, spec, dtype_policy="fp32")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# OptimizerSpec
# ----------------------------------------------------------------------------------------------


def test_spec_from_optimizer_records_resolved_flags_and_round_trips() -> None:
    _, spec, named, opt = _small()
    assert spec.type == "AdamW" and len(spec.groups) == 2
    assert spec.groups[0].params == ("a",) and spec.groups[1].params == ("b",)
    g0, g1 = spec.groups[0].hyper, spec.groups[1].hyper
    assert g0["weight_decay"] == 0.01 and g1["weight_decay"] == 0.0
    assert g0["betas"] == (0.9, 0.999) and g0["foreach"] is False and g0["fused"] is False
    assert "lr" not in g0 and spec.torch_version == torch.__version__
    assert spec.state_keys(0) == ("step", "exp_avg", "exp_avg_sq")
    text = spec.to_json()
    assert OptimizerSpec.from_json(text) == spec
    assert OptimizerSpec.from_json(text).to_json() == text
    assert json.loads(text)["groups"][0]["hyper"]["betas"] == [0.9, 0.999]
    assert len(spec.digest) == 64
    sgd = OptimizerSpec.from_optimizer(torch.optim.SGD(named.values(), lr=0.1), named)
    assert sgd.state_keys(0) == () and sgd.groups[0].hyper["momentum"] == 0.0
    # a tensor listed under two names keeps the first, as DDP and the layout do
    alias = OptimizerSpec.from_optimizer(
        opt, [("a", named["a"]), ("a2", named["a"]), ("b", named["b"])]
    )
    assert alias.param_names == ("a", "b")


class _MyAdamW(torch.optim.AdamW):
    pass


@pytest.mark.parametrize(
    "make,key",
    [
        (_MyAdamW, "type"),
        (torch.optim.RMSprop, "type"),
        (lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(0.01)), "groups[0].lr"),
        (lambda ps: torch.optim.Adam(ps, capturable=True), "groups[0].hyper.capturable"),
        (
            lambda ps: torch.optim.SGD(ps, lr=0.1, differentiable=True),
            "groups[0].hyper.differentiable",
        ),
        (
            lambda ps: torch.optim.AdamW(ps, betas=(torch.tensor(0.9), torch.tensor(0.99))),
            "groups[0].hyper.betas",
        ),
    ],
    ids=["subclass", "rmsprop", "tensor-lr", "capturable", "differentiable", "tensor-beta"],
)
def test_spec_rejects_what_cannot_be_replayed(make: Callable[..., Any], key: str) -> None:
    named = {"w": nn.Parameter(torch.randn(4))}
    with pytest.raises(OptSpecError) as info:
        OptimizerSpec.from_optimizer(make(list(named.values())), named)
    assert info.value.key == key


def test_spec_rejects_unnamed_parameter() -> None:
    p, q = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(3))
    with pytest.raises(OptSpecError, match="no name") as info:
        OptimizerSpec.from_optimizer(torch.optim.SGD([p, q], lr=0.1), {"p": p})
    assert info.value.key == "groups[0].params[1]"


def _doc() -> dict[str, Any]:
    named = {"w": nn.Parameter(torch.randn(4)), "v": nn.Parameter(torch.randn(4))}
    opt = torch.optim.SGD(
        [{"params": [named["w"]]}, {"params": [named["v"]]}], lr=0.1, momentum=0.9, nesterov=True
    )
    doc: dict[str, Any] = json.loads(OptimizerSpec.from_optimizer(opt, named).to_json())
    return doc


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        obj: Any = doc
        parts = path.split("/")
        for part in parts[:-1]:
            obj = obj[int(part)] if isinstance(obj, list) else obj[part]
        if value is _DELETE:
            del obj[parts[-1]]
        else:
            obj[int(parts[-1]) if isinstance(obj, list) else parts[-1]] = value

    return apply


_DELETE = object()


@pytest.mark.parametrize(
    "edit,key",
    [
        (_set("type", "RMSprop"), "type"),
        (_set("format", "x/2"), "format"),
        (_set("extra", 1), "extra"),
        (_set("groups", []), "groups"),
        (_set("scaler_unscale", "never"), "scaler_unscale"),
        (_set("groups/0/hyper/momentum", "0.9"), "groups[0].hyper.momentum"),
        (_set("groups/0/hyper/momentum", -1.0), "groups[0].hyper.momentum"),
        (_set("groups/1/hyper/nesterov", 1), "groups[1].hyper.nesterov"),
        (_set("groups/1/hyper/dampening", 0.5), "groups[1].hyper.nesterov"),
        (_set("groups/0/hyper/eps", 1e-8), "groups[0].hyper.eps"),
        (_set("groups/0/hyper/momentum", _DELETE), "groups[0].hyper.momentum"),
        (_set("groups/0/hyper/differentiable", True), "groups[0].hyper.differentiable"),
        (_set("groups/0/hyper/foreach", True), "groups[0].hyper.foreach"),
        (_set("groups/1/hyper/fused", True), "groups[1].hyper.fused"),
        (_set("groups/1/params/0", "w"), "groups[1].params[0]"),
        (_set("groups/1/params/0", ""), "groups[1].params[0]"),
        (_set("groups/0/extra", 1), "groups[0]"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_spec_json_errors_name_the_key(edit: Callable[[dict[str, Any]], None], key: str) -> None:
    doc = _doc()
    if key == "groups[0].hyper.foreach":
        doc["groups"][0]["hyper"]["fused"] = True  # fused and foreach together
        doc["groups"][1]["hyper"]["fused"] = True
    edit(doc)
    with pytest.raises(OptSpecError) as info:
        OptimizerSpec.from_json(json.dumps(doc))
    assert info.value.key == key, str(info.value)
    assert key in str(info.value)


def test_spec_json_not_json() -> None:
    with pytest.raises(OptSpecError, match="does not parse"):
        OptimizerSpec.from_json("{nope")
    with pytest.raises(OptSpecError, match="must be an object"):
        OptimizerSpec.from_json("[]")


def test_spec_direct_construction_is_validated() -> None:
    with pytest.raises(OptSpecError, match="decoupled"):
        OptimizerSpec(
            "AdamW",
            (
                ParamGroupSpec(
                    ("w",),
                    {
                        "betas": (0.9, 0.99),
                        "eps": 1e-8,
                        "weight_decay": 0.0,
                        "amsgrad": False,
                        "maximize": False,
                        "foreach": False,
                        "fused": False,
                        "capturable": False,
                        "differentiable": False,
                        "decoupled_weight_decay": False,
                    },
                ),
            ),
        )
