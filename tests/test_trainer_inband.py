"""In-band mode end to end without a switch: DDP's gradients are all-reduced by the ring over UDP
(the comm hook), the FINAL chunks are copied to 3 real shadows by a software tap standing in for
the switch, rank 0 sends the COMMITs; the shadows end bit-exact with the trainers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shadowgrad.config import parse_spec
from shadowgrad.shadow.testing import shadow_cluster
from shadowgrad.trainer_hooks._testing import loopback_spec
from tests.test_trainer_restore import _equal_states, _finish, _launch, _losses, _spec


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_inband_ring_with_software_tap_is_bit_exact(tmp_path: Path, world: int) -> None:
    doc = loopback_spec(world=world, shadows=3, mode="in-band")
    spec = _spec(tmp_path, doc)
    steps = 15
    with shadow_cluster(parse_spec(doc, env={})) as cluster:
        ranks = _launch(
            spec, world, steps, "--amp", "--software-tap", "--out", str(tmp_path / "final.pt")
        )
        try:
            text = _finish(ranks, world)
        finally:
            ranks.close()
        assert cluster.wait_applied(steps - 1, timeout_s=60), cluster.status()
        from shadowgrad.layout import Layout, from_module
        from tests.test_trainer_restore import _model

        params, buckets = from_module(_model())
        layout = Layout.build(params, buckets, 3, 1)
        it, sparams, sopt = cluster.full_state(layout)
        status = cluster.status()
    assert it == steps - 1
    assert sorted(_losses(text)) == list(range(steps))
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    names = [n for n, _ in _model().named_parameters()]
    shadow = {"model": sparams, "optimizer": {"state": {i: sopt[n] for i, n in enumerate(names)}}}
    assert not _equal_states(final, shadow)
    for s in status:
        assert s["diverged_at"] is None
        # the shadows saw FINAL data from the ring (not mirror traffic)
        assert s["counters"].get("data", 0) > 0
