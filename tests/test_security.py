"""Trust on the data path (issue 11), the way a user meets it: the documented mirror example
(`torchrun examples/train_mirror.py`, `shadowgrad shadow` processes) runs while a stranger
without the token forges COMMITs for the next 20 iterations (100x the learning rates) and NACKs
for a recent iteration — from its own socket and, as root, with a trainer's / a shadow's source
address. The checkpoint is untouched (shadows equal `train_plain.py` bit for bit, nothing
diverged), the stranger receives nothing, every forged record is counted under its reason, and
no log line of the run contains the token."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shadowgrad.testing.processes import run_soak


@pytest.mark.slow
def test_a_stranger_can_neither_change_the_checkpoint_nor_pull_gradients(
    tmp_path: Path, plain_refs: Path
) -> None:
    out = tmp_path / "report.json"
    r = run_soak(
        tmp_path / "work", out, "--steps", "200", "--attack", timeout_s=900, plain_dir=plain_refs
    )
    (rep,) = json.loads(out.read_text())
    assert rep["ok"], rep["failures"]
    a = rep["attack"]
    assert a["stranger_received_bytes"] == 0
    sent = a["sent"]
    assert sent["commit"] == 20 * 2 * 3  # 20 iterations x (no MAC, wrong key) x 3 shadows
    if os.geteuid() == 0:
        assert sent["commit_spoofed"] == sent["commit"] and sent["nack_spoofed"] > 0
    # every forged COMMIT counted under its reason by the shadow it reached
    counted = a["shadows_counted"]
    assert counted["unauthenticated"] + counted["bad_mac"] == sent["commit"] + sent.get(
        "commit_spoofed", 0
    )
    assert counted["unauthenticated"] == counted["bad_mac"]
    for s in rep["shadows"]:
        assert s["last_applied"] == 199 and s["diverged_at"] is None and not s["diverged"]
    # the token appears in no log, report or spec the run wrote
    token = "soak-token"  # tools/soak.py's job token
    for f in (tmp_path / "work").rglob("*"):
        if f.is_file() and f.suffix != ".pt":
            assert token not in f.read_text(errors="replace"), f
    assert token not in r.stdout and token not in r.stderr
