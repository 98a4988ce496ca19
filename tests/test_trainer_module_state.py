"""Module state of any size (issue 23 item 4): buffers (BatchNorm statistics,
``num_batches_tracked``) and frozen parameters are part of the layout's shard state — buffers
streamed by rank 0 every iteration as DATA of the reserved state bucket (placed, verified,
NACK-repaired like gradients; an iteration is not ready without them), frozen parameters loaded
once per session — and come back bit-identically with a restore. No size cap, no degraded
event."""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from shadowgrad.boxes import FullStateSink, assemble_full, box_states_from_full
from shadowgrad.config import parse_spec
from shadowgrad.errors import LayoutError
from shadowgrad.layout import Layout, ParamSpec, StateSpec, from_module, state_from_module
from shadowgrad.optspec import OptimizerSpec
from shadowgrad.shadow.assembly import IterBuffer, ShardGeometry
from shadowgrad.shadow.replay import ReplayInputError, ShardReplayer
from shadowgrad.specs import loopback_spec
from shadowgrad.tensorstream import encode_states
from shadowgrad.testing import TOKEN, shadow_cluster
from shadowgrad.trainer_hooks import attach
from shadowgrad.trainer_hooks._plan import RankPlan
from shadowgrad.wire import CommitRecord, DType
from tests.test_trainer_restore import (
    _equal_states,
    _kill_rank_when,
    _launch,
    _layout,
    _losses,
    _run_to_end,
    _spec,
    _start,
)

# --------------------------------------------------------------------------- unit: layout


def _small_layout(shadows: int = 2) -> Layout:
    params = [ParamSpec("w", (64, 4), "float32"), ParamSpec("b", (4,), "float32")]
    state = [
        StateSpec("bn.running_mean", (4,), "float32", "buffer"),
        StateSpec("bn.num_batches_tracked", (), "int64", "buffer"),
        StateSpec("base.weight", (100, 3), "float32", "frozen"),
        StateSpec("bn.running_var", (4,), "float32", "buffer"),
    ]
    return Layout.build(params, [["w", "b"]], shadows, 1, state=state)


def test_layout_state_bucket_routes_and_json() -> None:
    lay = _small_layout()
    assert lay.state_bucket == len(lay.buckets) == 1
    # buffers packed shard by shard into the state bucket: the routes tile it exactly
    assert lay.state_bucket_nbytes == 16 + 8 + 16
    assert lay.state_routes[0].start == 0 and lay.state_routes[-1].end == 40
    assert all(a.end == b.start for a, b in itertools.pairwise(lay.state_routes))
    frozen = [b for b in lay.state_boxes if b.name == "base.weight"]
    assert frozen[0].bucket == -1  # never streamed
    for s in range(lay.num_shards):
        entries = lay.shard_entries(s)
        assert entries[: len(lay.shard_boxes(s))] == lay.shard_boxes(s)
        for box in lay.shard_state_boxes(s):
            if box.bucket == lay.state_bucket:
                route = next(r for r in lay.state_routes if r.shard == s)
                assert route.start <= box.bucket_offset < box.bucket_end <= route.end
    again = Layout.from_json(lay.to_json())
    assert again == lay and again.state == lay.state
    plain = Layout.build(list(lay.params), [["w", "b"]], 2, 1)
    # a layout without module state keeps its digest (and JSON) of before
    assert "state" not in plain.to_json() and plain.with_state(lay.state) == lay
    assert lay.with_state(()) == plain
    with pytest.raises(LayoutError, match="also a parameter"):
        plain.with_state([StateSpec("w", (1,), "float32", "frozen")])
    with pytest.raises(LayoutError, match="kind"):
        StateSpec("x", (1,), "float32", "trained")


def test_state_from_module_finds_buffers_and_frozen_parameters() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    m[0].requires_grad_(False)
    m[1].register_buffer("scratch", torch.zeros(3), persistent=False)
    params, _ = from_module(m)
    tensors, specs = state_from_module(m, {p.name for p in params})
    assert [(s.name, s.kind) for s in specs] == [
        ("0.weight", "frozen"),
        ("0.bias", "frozen"),
        ("1.running_mean", "buffer"),
        ("1.running_var", "buffer"),
        ("1.num_batches_tracked", "buffer"),
    ]
    assert tensors["1.num_batches_tracked"].dtype == torch.int64
    assert specs[-1].dtype == "int64" and specs[-1].shape == ()


def test_rank0_alone_stages_and_sends_the_state_bucket() -> None:
    lay = _small_layout(3)
    p0, p1 = RankPlan(lay, 0, 2), RankPlan(lay, 1, 2)
    assert not p1.state_pieces and all(r.bucket != lay.state_bucket for r in p1.runs)
    state_runs = [r for r in p0.runs if r.bucket == lay.state_bucket]
    assert [(r.start, r.end, r.shard) for r in state_runs] == [tuple(r) for r in lay.state_routes]
    assert all(r.dtype is DType.UINT8 for r in state_runs)
    assert sum(sp.nbytes for sp in p0.state_pieces) == lay.state_bucket_nbytes
    # in-band: no gradient slices, the buffers still
    empty = RankPlan(lay, 0, 2, empty=True)
    assert empty.staging_nbytes == lay.state_bucket_nbytes and empty.state_pieces
    assert not RankPlan(lay, 1, 2, empty=True).runs


# --------------------------------------------------------------------------- unit: shadow side


def _spec_for(lay: Layout) -> OptimizerSpec:
    w = nn.Parameter(torch.zeros(64, 4))
    b = nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([w, b], lr=0.1, momentum=0.9)
    return OptimizerSpec.from_optimizer(opt, {"w": w, "b": b})


def _full(lay: Layout) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    out = {p.name: torch.randn(p.shape, generator=g) for p in lay.params}
    out["bn.running_mean"] = torch.randn(4, generator=g)
    out["bn.running_var"] = torch.rand(4, generator=g)
    out["bn.num_batches_tracked"] = torch.tensor(7)
    out["base.weight"] = torch.randn(100, 3, generator=g)
    return out


def test_an_iteration_is_complete_only_with_its_buffers_which_the_step_copies_in() -> None:
    lay = _small_layout(1)
    geom = ShardGeometry(lay, 0)
    assert geom.entries == len(lay.shard_boxes(0)) + 4
    grad_bytes = sum(b.nbytes for b in lay.shard_boxes(0))
    assert geom.owned_nbytes == grad_bytes + lay.state_bucket_nbytes
    buf = IterBuffer(geom)
    grads = torch.ones(lay.bucket_nbytes[0] // 4)
    buf.place(0, 0, memoryview(grads.numpy()).cast("B"))
    assert not buf.complete  # gradients alone do not make the iteration
    missing = geom.missing(buf.cov)
    assert missing == [(lay.state_bucket, 0, lay.state_bucket_nbytes)]  # NACKable
    new = _full(lay)
    new["bn.num_batches_tracked"] = torch.tensor(8)
    raw = torch.cat(
        [
            new[b.name].reshape(-1).view(torch.uint8)
            for b in sorted(lay.state_boxes, key=lambda b: b.bucket_offset)
            if b.bucket == lay.state_bucket
        ]
    )
    assert raw.numel() == lay.state_bucket_nbytes
    buf.place(lay.state_bucket, 0, memoryview(raw.numpy()).cast("B"))
    assert buf.complete
    rep = ShardReplayer(lay, 0, _spec_for(lay))
    rep.load(-1, box_states_from_full(lay, 0, _full(lay)))
    with pytest.raises(ReplayInputError):
        rep.load(-1, box_states_from_full(lay, 0, _full(lay))[:2])
    # a skipped step changes no parameter but takes the buffers of the iteration
    rep.step(0, buf.views(), CommitRecord((0.1,), skipped=True), buf.buffer_views())
    out = rep.export()
    params, _ = assemble_full(lay, [out])
    for name in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
        assert torch.equal(params[name], new[name]), name
    assert torch.equal(params["base.weight"], _full(lay)["base.weight"])  # frozen: as loaded
    assert torch.equal(params["w"], _full(lay)["w"])


def test_full_state_sink_takes_module_state_and_insists_on_it() -> None:
    lay = _small_layout(2)
    full = _full(lay)
    sink = FullStateSink(lay)
    for s in range(lay.num_shards):
        states = box_states_from_full(lay, s, full)
        entries, frames = encode_states(list(enumerate(states)))
        sink.write(s, entries, frames)
    params, _ = sink.finish()
    for name, t in full.items():
        assert torch.equal(params[name], t), name
    partial = FullStateSink(lay)
    for s in range(lay.num_shards):
        states = box_states_from_full(lay, s, full)[: len(lay.shard_boxes(s))]
        entries, frames = encode_states(list(enumerate(states)))
        partial.write(s, entries, frames)
    with pytest.raises(ReplayInputError, match="module state"):
        partial.finish()


# --------------------------------------------------------------------------- frozen base


class _Adapted(nn.Module):
    """A frozen base of 10.2M parameters (40 MB) with small trainable adapters and a
    BatchNorm (buffers) between them: a fine-tuning job."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(3200, 3200)
        self.base.requires_grad_(False)
        self.down = nn.Linear(3200, 16)
        self.norm = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.down(torch.relu(self.base(x))))))


def _train(model: nn.Module, sg: Any, start: int, steps: int) -> None:
    for it in range(start, start + steps):
        g = torch.Generator().manual_seed(it)
        x, y = torch.randn(16, 3200, generator=g), torch.randint(0, 3, (16,), generator=g)
        sg.backward(nn.functional.cross_entropy(model(x), y))
        sg.step(user_state={"it": it})


def _adapted(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = _Adapted()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return model, opt


def test_frozen_base_of_10m_parameters_restores_bit_identically() -> None:
    """The 40 MB frozen base is loaded once per session (never streamed), the BatchNorm buffers
    stream every iteration (with 5 % of the first sends lost: NACK-repaired); a second attach
    with another initialisation restores parameters, optimizer state, buffers and the frozen
    base bit for bit and continues identically. Nothing is marked degraded."""
    doc = loopback_spec(world=1, shadows=3, gap_repair="20ms")
    spec = parse_spec(doc, env={})
    with shadow_cluster(spec) as cluster:
        model, opt = _adapted(1)
        assert sum(p.numel() for p in model.base.parameters()) >= 10_000_000
        with attach(model, opt, spec, max_grad_norm=1.0, token=TOKEN) as sg:
            assert sg.restore_or_start().restored is False
            assert {s.kind for s in sg.layout.state} == {"frozen", "buffer"}
            assert sg._sender is not None
            sg._sender.drop_first_sends = 0.05
            sg.chunk_bytes = sg._sender.chunk_bytes = 4096
            _train(model, sg, 0, 8)
            assert sg.flush(10)
            stats = sg.stats()
            assert not sg.degraded and stats["degraded_reason"] is None
            # per iteration: the trainable gradients and the buffers only, never the base
            per_it = stats["mirror"]["data_bytes"] / 8
            trainable = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
            assert trainable <= per_it < trainable + 4096, (per_it, trainable)  # 40 MB base
            assert stats["mirror"]["retx_chunks"] > 0
        assert cluster.wait_applied(7, timeout_s=60), cluster.status()
        it, sparams, _ = cluster.full_state(sg.layout)
        assert it == 7
        for name, t in model.state_dict().items():
            assert torch.equal(sparams[name], t), name
        model2, opt2 = _adapted(99)
        assert not torch.equal(model2.base.weight, model.base.weight)
        with attach(model2, opt2, spec, max_grad_norm=1.0, token=TOKEN) as sg2:
            start = sg2.restore_or_start()
            assert (start.iteration, start.restored) == (8, True)
            sd1, sd2 = model.state_dict(), model2.state_dict()
            assert sd1.keys() == sd2.keys()
            for name in sd1:
                assert torch.equal(sd1[name], sd2[name]), name
            assert (
                _equal_states(
                    {"model": sd1, "optimizer": opt.state_dict()},
                    {"model": sd2, "optimizer": opt2.state_dict()},
                )
                == []
            )
            _train(model2, sg2, 8, 2)
            assert not sg2.degraded
        with attach(model, opt, spec, max_grad_norm=1.0, token=TOKEN) as sg1:
            sg1.restore_or_start()  # the same model again: restores iteration 9's state
            for name, t in model2.state_dict().items():
                assert torch.equal(model.state_dict()[name], t), name


# --------------------------------------------------------------------------- ResNet-50, kill


STEPS = 16


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkill_resnet50_batchnorm_layout_two_ranks_is_bit_identical(tmp_path: Path) -> None:
    """ResNet-50's BatchNorm layout (53 layers, ~208 KiB of buffers: 6x what the COMMIT record
    used to carry), 2 ranks in mirror mode, 3 shadows: a rank SIGKILLed mid-run and the job
    rerun resumes from the shadows and ends bit-identical to an uninterrupted run —
    parameters, optimizer state and every buffer — with no degraded event."""
    lay = _layout(3, 1, False, True)
    assert lay.state_bucket_nbytes >= 200 * 1024
    doc = loopback_spec(world=2, shadows=3)
    ref_spec = _spec(tmp_path, doc, "ref.toml")
    ref_out = tmp_path / "ref.pt"
    with shadow_cluster(parse_spec(doc, env={})):
        text = _run_to_end(ref_spec, 2, STEPS, "--out", str(ref_out), "--amp", "--resnet")
    ref_losses, ref_final = _losses(text), torch.load(ref_out, weights_only=True)
    assert sorted(ref_losses) == list(range(STEPS))
    assert "degraded" not in text and "module_state" not in text, text[-3000:]
    assert sum("running_mean" in k for k in ref_final["model"]) == 53

    rng = random.Random(23)
    kill_after, victim = rng.randrange(3, STEPS - 4), rng.randrange(2)
    doc = loopback_spec(world=2, shadows=3)
    spec = _spec(tmp_path, doc, "kill.toml")
    out = tmp_path / "kill.pt"
    with shadow_cluster(parse_spec(doc, env={})) as cluster:
        ranks = _launch(spec, 2, STEPS, "--amp", "--resnet")
        try:
            _kill_rank_when(ranks, kill_after, rng.uniform(0.0, 0.05), victim)
            time.sleep(0.05)
            first = _losses(str(ranks.output(0)))
            early = "".join(str(ranks.output(r)) for r in range(2))
        finally:
            ranks.close()
        text = _run_to_end(spec, 2, STEPS, "--out", str(out), "--amp", "--resnet")
        assert cluster.wait_applied(STEPS - 1, timeout_s=60), cluster.status()
        it, sparams, _ = cluster.full_state(lay)
        status = cluster.status()
    start, restored = _start(text)
    assert restored and start > 0, text[-2000:]
    assert start >= max(first) - 2, (start, max(first))
    for step, loss in {**first, **_losses(text)}.items():
        assert loss == ref_losses[step], step
    assert sorted(_losses(text)) == list(range(start, STEPS))
    final = torch.load(out, weights_only=True)
    assert _equal_states(final, ref_final) == []  # state_dict: buffers included
    assert it == STEPS - 1
    for name, t in ref_final["model"].items():  # and the shadows hold them too
        assert torch.equal(sparams[name], t), name
    assert all(s["diverged_at"] is None for s in status)
    for blob in (early, text):
        assert "trainer.degraded" not in blob and "module_state" not in blob, blob[-3000:]


# --------------------------------------------------------------------------- in-band


@pytest.mark.slow
def test_inband_streams_buffers_from_rank0_bit_exact(tmp_path: Path) -> None:
    """In-band (ring + software tap): rank 0 sends the state bucket itself, from its trainer
    address, next to its COMMITs; the shadows end with the trainers' buffers bit for bit."""
    doc = loopback_spec(world=2, shadows=3, mode="in-band")
    spec = _spec(tmp_path, doc)
    steps = 10
    final = tmp_path / "final.pt"
    lay = _layout(3, 1, True)
    assert lay.state_bucket_nbytes > 0
    with shadow_cluster(parse_spec(doc, env={})) as cluster:
        text = _run_to_end(spec, 2, steps, "--amp", "--cnn", "--software-tap", "--out", str(final))
        assert cluster.wait_applied(steps - 1, timeout_s=60), cluster.status()
        it, sparams, _ = cluster.full_state(lay)
    assert it == steps - 1 and "module_state" not in text
    saved = torch.load(final, weights_only=True)["model"]
    assert any("running_var" in n for n in saved)
    for name, t in saved.items():
        assert torch.equal(sparams[name], t), name
