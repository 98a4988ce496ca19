"""Mirror mode end to end: the example training script (4 DDP ranks, gloo) with real shadow nodes
on loopback; the shadows' state equals the trainers' state bit for bit at the end."""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

import pytest
import torch

from shadowgrad.config import parse_spec
from shadowgrad.specs import loopback_spec, spec_toml
from shadowgrad.testing.cluster import shadow_cluster
from shadowgrad.testing.processes import Ranks
from shadowgrad.testing.specs import TOKEN

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _code_lines(path: Path) -> list[str]:
    """Lines of a script without its module docstring and blank lines."""
    text = path.read_text()
    text = re.sub(r'\A"""(?:.|\n)*?"""\n', "", text)
    return [ln for ln in text.splitlines() if ln.strip()]


def test_example_adds_at_most_15_lines() -> None:
    plain = _code_lines(EXAMPLES / "train_plain.py")
    mirror = _code_lines(EXAMPLES / "train_mirror.py")
    added = [ln for ln in difflib.ndiff(plain, mirror) if ln.startswith("+ ")]
    assert 0 < len(added) <= 15, added


def losses_of(out: str) -> dict[int, str]:
    return {int(m[1]): m[2] for m in re.finditer(r"^step (\d+) loss (\S+)$", out, re.M)}


def run_example(
    spec_path: Path,
    world: int,
    steps: int,
    out: Path | None,
    timeout_s: float = 300.0,
    script: str = "train_mirror.py",
) -> tuple[str, list[int | None]]:
    argv = [sys.executable, str(EXAMPLES / script), "--steps", str(steps)]
    if script == "train_mirror.py":
        argv += ["--spec", str(spec_path)]
    if out is not None:
        argv += ["--out", str(out)]
    ranks = Ranks(argv, world, {"SHADOWGRAD_TOKEN": TOKEN}, str(ROOT))
    try:
        codes = ranks.wait(timeout_s)
        text = ranks.output(0)
        if codes != [0] * world:
            raise AssertionError(
                f"exit codes {codes}\n"
                + "\n".join(f"--- rank {r}\n{ranks.output(r)[-3000:]}" for r in range(world))
            )
        return text, codes
    finally:
        ranks.close()


@pytest.mark.slow
def test_example_4_ranks_50_iterations_bit_exact(tmp_path: Path) -> None:
    doc = loopback_spec(world=4, shadows=3)
    spec = parse_spec(doc, env={})
    spec_path = tmp_path / "job.toml"
    spec_path.write_text(spec_toml(doc))
    steps = 50
    with shadow_cluster(spec) as cluster:
        text, _ = run_example(spec_path, 4, steps, tmp_path / "final.pt")
        assert cluster.wait_applied(steps - 1, timeout_s=60), cluster.status()
        # in the layout the example's trainers loaded the shadows with
        it, shadow_params, shadow_opt = cluster.full_state()
        sts = cluster.status()
    assert it == steps - 1
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    model = final["model"]
    assert set(shadow_params) == set(model)
    for name, t in shadow_params.items():
        assert torch.equal(t, model[name]), name
    # optimizer state: the trainer's state_dict is by index in param-group order (the
    # example's groups: the weights, then the rest, each in module order)
    names_in_opt = [n for n in model if n.endswith("weight")] + [
        n for n in model if not n.endswith("weight")
    ]
    opt_state = final["optimizer"]["state"]
    for i, name in enumerate(names_in_opt):
        for key, value in opt_state[i].items():
            assert torch.equal(shadow_opt[name][key], value), (name, key)
    losses = losses_of(text)
    assert sorted(losses) == list(range(steps))
    for s in sts:
        assert s["diverged_at"] is None
    # the example's scaler starts at 2**126: some steps overflow, are skipped and back off
    assert final["scaler"]["scale"] < 2.0**126
