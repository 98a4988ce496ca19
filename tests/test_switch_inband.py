"""In-band end to end through the switch: 4 trainers whose DDP gradients are all-reduced by the
ring, across ``sg-switch-grpc`` running ``p4/shadowgrad.p4`` on loopback UDP ports, programmed
by the controller's switch driver from the job spec; 2 shards x 2 replicas of real shadows that
receive only what the switch copies (no software tap). AdamW + clipping + LR schedule +
GradScaler: the shadows end bit-exact with the trainers, also with 1% loss on one shadow port
(repaired by NACKs)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc")
pytest.importorskip("p4")

from shadowgrad.bmv2_testbed.inband import JobSwitch
from shadowgrad.config import parse_spec
from shadowgrad.specs import switch_spec
from shadowgrad.testing.cluster import shadow_cluster
from tests.test_trainer_restore import (
    _assert_shadows_hold_final,
    _finish,
    _launch,
    _layout,
    _spec,
)

STEPS = 30


def _run(
    tmp_path: Path,
    loss: dict[int, float] | None = None,
    steps: int = STEPS,
    security: dict[str, Any] | None = None,
    **switch: Any,
) -> dict[str, Any]:
    doc = switch_spec(world=4, shadows=4, replication=2, gap_repair="30ms")
    doc["security"].update(security or {})
    spec = parse_spec(doc, env={})
    path = _spec(tmp_path, doc)
    layout = _layout(4, 2)
    final = tmp_path / "final.pt"
    with JobSwitch(spec, layout, loss=loss, **switch) as sw, shadow_cluster(spec) as cluster:
        ranks = _launch(path, 4, steps, "--amp", "--out", str(final))
        try:
            text = _finish(ranks, 4)
            waits = [
                float(m[1])
                for r in range(4)
                for m in re.finditer(r"^ring_wait \d+ (\S+)$", ranks.output(r), re.M)
            ]
        finally:
            ranks.close()
        assert cluster.wait_applied(steps - 1, timeout_s=60), cluster.status()
        state = cluster.full_state(layout)
        status = cluster.status()
        counters = sw.counters()
    _assert_shadows_hold_final(final, state, text, steps, status)
    return {
        "counters": counters,
        "status": status,
        "ring_wait_s": max(waits),
        "switch": sw.final_counters,
    }


@pytest.mark.slow
def test_inband_through_the_switch_is_bit_exact(tmp_path: Path) -> None:
    out = _run(tmp_path)
    c = out["counters"]
    # the switch copied the ring's FINAL chunks: every rank tagged some, every shadow got
    # copies, both replicas of a shard the same number, nothing dropped
    assert all(p > 0 for p, _ in c["tagged"])
    assert all(p > 0 for p, _ in c["shadow_copies"])
    assert c["shadow_copies"][0] == c["shadow_copies"][2]  # shard 0: shadows 0 and 2
    assert c["shadow_copies"][1] == c["shadow_copies"][3]
    assert c["commits"][0][0] >= STEPS and all(p == 0 for p, _ in c["commits"][1:])
    assert all(p == 0 for p, _ in c["drops"].values()), c["drops"]
    for s in out["status"]:
        assert s["counters"].get("data", 0) > 0


@pytest.mark.slow
def test_inband_with_the_whole_ring_authenticated_is_bit_exact(tmp_path: Path) -> None:
    # security.authenticate_ring: every DATA datagram of the ring carries a MAC (by default
    # only the FINAL ones the switch copies to the shadows do); the next rank requires it
    out = _run(tmp_path, security={"authenticate_ring": True})
    assert all(p > 0 for p, _ in out["counters"]["shadow_copies"])
    for s in out["status"]:
        assert s["counters"].get("data", 0) > 0


@pytest.mark.slow
def test_inband_through_the_switch_with_loss_on_a_shadow_port(tmp_path: Path) -> None:
    out = _run(tmp_path, loss={5: 0.01})  # switch port 5 = shadow 0
    # the switch made every copy for shadow 0, some were lost on port 5 (the loss RNG is
    # seeded per port), and the shadow repaired them from the trainers' retained FINAL bytes
    s0 = out["status"][0]["counters"]
    copies = out["counters"]["shadow_copies"][0][0]
    assert s0.get("data", 0) < copies, (s0, copies)
    assert s0.get("retx", 0) > 0, s0
    assert out["counters"]["shadow_copies"][2][0] == copies  # its replica's port lost nothing
    s2 = out["status"][2]["counters"]
    # every copy arrived: as data, or as a duplicate of a FINAL chunk the ring re-sent
    assert s2.get("data", 0) + s2.get("duplicate", 0) == copies, (s2, copies)


@pytest.mark.slow
def test_inband_through_an_overloaded_lossless_shadow_port(tmp_path: Path) -> None:
    # shadow 0's port drains ~40 KB/s, about a quarter of what the job offers it; a queue of
    # 16 frames, a pause budget of 0.2 s per congestion episode, no headroom: copies beyond
    # the budget are dropped (counted) and the shard repairs end to end
    bound = 0.2
    out = _run(tmp_path, rate={5: "320k"}, queue_capacity=16, pause_timeout_s=bound, headroom=0)
    q = out["switch"]["queues"]["5"]
    assert q["drops"]["lossless_overflow"] > 0, q
    assert q["paused_s"] > 0
    # the shard healed end to end: repaired by NACKs, or (far behind) cloned from its replica
    # or re-seeded by the trainers
    s0 = out["status"][0]
    ev = s0["events"]
    healed = (
        s0["counters"].get("retx", 0)
        + ev.get("seeded", 0)
        + ev.get("cloned", 0)
        + ev.get("resynced", 0)
    )
    assert healed > 0, s0
    # the trainers were never held by the switch longer than the bound (the ring's longest
    # wait for window space includes its retransmission timeouts; generous slack)
    print(
        f"overloaded shadow port: {q['drops']['lossless_overflow']} copies dropped, "
        f"paused {q['paused_s']:.3f}s in all, longest pause {q['max_pause_s'] * 1e3:.0f} ms, "
        f"longest ring send wait {out['ring_wait_s'] * 1e3:.0f} ms (bound {bound * 1e3:.0f} ms)"
    )
    assert q["max_pause_s"] <= bound + 0.25
