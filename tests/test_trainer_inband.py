"""In-band mode end to end without a switch: DDP's gradients are all-reduced by the ring over UDP
(the comm hook), the FINAL chunks are copied to 3 real shadows by a software tap standing in for
the switch, rank 0 sends the COMMITs; the shadows end bit-exact with the trainers."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadowgrad.config import parse_spec
from shadowgrad.specs import loopback_spec
from shadowgrad.testing.cluster import shadow_cluster
from tests.test_trainer_restore import _assert_shadows_hold_final, _layout, _run_to_end, _spec


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_inband_ring_with_software_tap_is_bit_exact(tmp_path: Path, world: int) -> None:
    doc = loopback_spec(world=world, shadows=3, mode="in-band")
    spec = _spec(tmp_path, doc)
    steps = 15
    final = tmp_path / "final.pt"
    with shadow_cluster(parse_spec(doc, env={})) as cluster:
        text = _run_to_end(spec, world, steps, "--amp", "--software-tap", "--out", str(final))
        assert cluster.wait_applied(steps - 1, timeout_s=60), cluster.status()
        state = cluster.full_state(_layout(3, 1))
        status = cluster.status()
    _assert_shadows_hold_final(final, state, text, steps, status)
    for s in status:  # the shadows saw FINAL data from the ring (not mirror traffic)
        assert s["counters"].get("data", 0) > 0
