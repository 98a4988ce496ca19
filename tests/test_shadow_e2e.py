"""End-to-end bit-exactness over UDP (invariant 1 + 2): a reference CPU training loop, a producer
that cuts each iteration's reduced gradient into FINAL DATA chunks per the layout (tensors split
across shards) plus COMMIT records, three real shadow nodes on loopback, and after every
iteration the union of the shard states fetched through the control service equals the trainer's
parameters and optimizer state with ``torch.equal``."""

from __future__ import annotations

import pytest

from shadowgrad.testing.loaded import loaded_cluster
from shadowgrad.testing.training import Case, RefTrainer, bucket_bytes

CASES = [
    # AdamW, 2 param groups (weight decay 0.1 / 0), warm-up + cosine LR, clipping, GradScaler
    # with two skipped steps
    Case("mlp-adamw-clip-scaler", "mlp", "adamw", scaler=True, skip_at=(5, 41), clip=1.0),
    # small transformer, AdamW with the fused CPU kernel (box cuts are 64-element aligned)
    Case("transformer-adamw-fused-clip", "transformer", "adamw", clip=0.5, fused=True),
    # SGD with nesterov momentum, GradScaler with a skipped step, clipping
    Case("mlp-sgd-nesterov-scaler", "mlp", "sgd", scaler=True, skip_at=(3,), clip=1.0),
    # small transformer, SGD nesterov, foreach implementation, no clipping
    Case("transformer-sgd-nesterov-foreach", "transformer", "sgd", clip=None, foreach=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_three_shadows_bit_exact_after_every_iteration(case: Case) -> None:
    trainer = RefTrainer(case, seed=3)
    layout = trainer.layout(num_shadows=3)
    split = [n for n in (p.name for p in layout.params) if len(layout.tensor_boxes(n)) > 1]
    assert split, "the layout must split at least one tensor across boxes"
    assert any(
        len({layout.box_shards[i] for i, b in enumerate(layout.boxes) if b.name == n}) > 1
        for n in split
    ), "a split tensor must span shards"
    skipped = 0
    istars: dict[int, int] = {}
    with loaded_cluster(trainer, layout) as c:
        for it in range(case.iterations):
            grads, commit = trainer.step(it)
            skipped += commit.skipped
            c.producer.send_iteration(it, bucket_bytes(layout, grads), commit)
            c.expect_applied(it)
            for n in c.nodes:  # I* as each shadow sees it never goes backwards
                istar = n.status(timeline=0)["istar"]
                assert istar is not None and istar >= istars.get(n.id, -1)
                istars[n.id] = istar
            bad = c.check(it, trainer)
            assert not bad, f"iteration {it}: {bad[:4]}"
        c.expect_istar(case.iterations - 1)
        for n in c.nodes:
            st = n.status(timeline=4)
            assert st["istar"] == case.iterations - 1
            assert st["diverged_at"] is None
            assert [t["iteration"] for t in st["timeline"]] == list(range(96, 100))
            for t in st["timeline"]:
                assert t["first_chunk"] <= t["last_chunk"] <= t["ready"] <= t["applied"]
                assert t["commit"] <= t["ready"]
            # nothing lost, nothing rejected on a clean path (peers' READY records can arrive
            # before this shadow is loaded)
            assert set(st["counters"]) <= {"data", "commit", "ready", "not_mine", "not_loaded"}
    assert skipped == len(case.skip_at)
