"""``shadowgrad export`` / ``--verify`` and ``load_export``, on state made by real replay.

Two real DDP ranks (this file run as a program, ``--worker``: AdamW with two param groups, an LR
schedule, a GradScaler, clipping, a BatchNorm layer, a user state) train through ``attach`` into
real shadow nodes (threads of the test process, 2 shards). Rank 0 saves its model, optimizer,
scheduler and scaler after every step: the reference. The run pauses after iteration ``PAUSE``
until the test has placed a hold on it, so an explicit earlier iteration stays exportable next
to ``latest`` (I*). The export must equal the reference bit for bit, loaded with plain
``torch.distributed.checkpoint.load`` in one process, with ``load_export`` into fresh objects,
and on every rank of a 3-process gloo group (``--load-rank``).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8
PAUSE = 4  # the explicit iteration: held by the test while training goes on to STEPS - 1
USER_NOTE = "export-test"


# --------------------------------------------------------------------------- shared


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def _lr_lambda(step: int) -> float:
    return min(1.0, (step + 1) / 3) * 0.5 * (1.0 + math.cos(math.pi * step / 20))


def _objects(model: nn.Module) -> tuple[torch.optim.Optimizer, Any, Any]:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
        lr=3e-3,
        betas=(0.9, 0.95),
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=3)
    return opt, sched, scaler


def _batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(48, 16, generator=g)
    y = torch.randint(0, 4, (48,), generator=g)
    per = 48 // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def _diff_tensors(got: dict[str, Any], want: dict[str, Any], where: str) -> list[str]:
    if set(got) != set(want):
        return [f"{where}: keys {sorted(got)} != {sorted(want)}"]
    return [
        f"{where}.{k}"
        for k, v in want.items()
        if got[k].dtype != v.dtype or not torch.equal(got[k], v)
    ]


def _diff_optim(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """Optimizer state_dicts: state bit-exact; every hyperparameter equal (``foreach`` /
    ``fused``: the export records the resolved implementation, False, for torch's None)."""
    bad: list[str] = []
    gs, ws = {int(k): v for k, v in got["state"].items()}, want["state"]
    if sorted(gs) != sorted(ws):
        return [f"optim.state indices {sorted(gs)} != {sorted(ws)}"]
    for i in ws:
        bad += _diff_tensors(gs[i], ws[i], f"optim.state[{i}]")
    if len(got["param_groups"]) != len(want["param_groups"]):
        return [*bad, "optim.param_groups: count"]
    for g, (a, b) in enumerate(zip(got["param_groups"], want["param_groups"], strict=True)):
        for key in set(a) | set(b):
            va, vb = a.get(key), b.get(key)
            if key in ("foreach", "fused"):
                va, vb = bool(va), bool(vb)
            if key == "betas":
                va, vb = tuple(va), tuple(vb)
            if va != vb:
                bad.append(f"optim.param_groups[{g}].{key}: {va!r} != {vb!r}")
    return bad


def _diff_live(
    model: nn.Module, opt: torch.optim.Optimizer, sched: Any, scaler: Any, ref: dict[str, Any]
) -> list[str]:
    bad = _diff_tensors(dict(model.state_dict()), ref["model"], "model")
    bad += _diff_optim(opt.state_dict(), ref["optim"])
    if sched.state_dict() != ref["scheduler"]:
        bad.append(f"scheduler {sched.state_dict()} != {ref['scheduler']}")
    if scaler.state_dict() != ref["scaler"]:
        bad.append(f"scaler {scaler.state_dict()} != {ref['scaler']}")
    return bad


# --------------------------------------------------------------------------- child programs


def worker(argv: list[str]) -> None:
    """One trainer rank: ``attach`` into the shadows, the reference state after every step."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from shadowgrad.trainer_hooks import attach

    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--refdir", required=True)
    ap.add_argument("--go", required=True)
    args = ap.parse_args(argv)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = _model()
    ddp = DistributedDataParallel(model)
    opt, sched, scaler = _objects(model)
    sg = attach(ddp, opt, args.spec, lr_scheduler=sched, grad_scaler=scaler, max_grad_norm=1.0)
    start = sg.restore_or_start()
    assert start.iteration == 0 and not start.restored, start
    for step in range(STEPS):
        x, y = _batch(step, rank, world)
        sg.backward(nn.functional.cross_entropy(ddp(x), y))
        sg.step(user_state={"step": step, "note": USER_NOTE})
        if rank == 0:
            torch.save(
                {
                    "model": model.state_dict(),
                    "optim": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "scaler": scaler.state_dict(),
                },
                Path(args.refdir) / f"ref{step}.pt",
            )
        if step == PAUSE:  # until the test holds iteration PAUSE on every shadow
            deadline = time.monotonic() + 90
            while not Path(args.go).exists():
                if time.monotonic() > deadline:
                    raise SystemExit("no go signal within 90 s")
                time.sleep(0.01)
    sg.close()
    dist.destroy_process_group()


def load_rank(argv: list[str]) -> None:
    """One rank of a 3-process gloo group: plain ``dcp.load`` of the model, then
    ``load_export`` into a fresh DDP model, optimizer, scheduler and scaler."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.nn.parallel import DistributedDataParallel

    from shadowgrad.controller.export import load_export

    ap = argparse.ArgumentParser()
    ap.add_argument("--export", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--iteration", type=int, required=True)
    args = ap.parse_args(argv)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    ref = torch.load(args.ref, weights_only=True)
    torch.manual_seed(100 + rank)  # different initial weights on every rank
    plain = _model().state_dict()
    dcp.load({"model": plain}, checkpoint_id=args.export)  # type: ignore[attr-defined]
    bad = _diff_tensors(dict(plain), ref["model"], "plain dcp.load model")
    model = _model()
    opt, sched, scaler = _objects(model)
    ddp = DistributedDataParallel(model)
    res = load_export(args.export, ddp, opt, sched, scaler)
    bad += _diff_live(model, opt, sched, scaler, ref)
    if res["iteration"] != args.iteration or res["user_state"] != {
        "step": args.iteration,
        "note": USER_NOTE,
    }:
        bad.append(f"load_export returned {res}")
    print(f"rank {rank} of {dist.get_world_size()}: {bad if bad else 'ok'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if not bad else 3)


if __name__ == "__main__" and "--worker" in sys.argv:
    worker([a for a in sys.argv[1:] if a != "--worker"])
    sys.exit(0)
if __name__ == "__main__" and "--load-rank" in sys.argv:
    load_rank([a for a in sys.argv[1:] if a != "--load-rank"])


# --------------------------------------------------------------------------- fixtures


@dataclass
class Job:
    spec: Any
    spec_path: Path
    cluster: Any
    refdir: Path

    def ref(self, it: int) -> dict[str, Any]:
        out: dict[str, Any] = torch.load(self.refdir / f"ref{it}.pt", weights_only=True)
        return out


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    from shadowgrad.config import parse_spec
    from shadowgrad.specs import loopback_spec, spec_toml
    from shadowgrad.testing.cluster import shadow_cluster
    from shadowgrad.testing.processes import Ranks
    from shadowgrad.testing.specs import TOKEN

    tmp = tmp_path_factory.mktemp("export-job")
    doc = loopback_spec(world=2, shadows=2)
    spec_path = tmp / "job.toml"
    spec_path.write_text(spec_toml(doc))
    spec = parse_spec(doc, env={})
    refdir = tmp / "ref"
    refdir.mkdir()
    go = tmp / "go"
    with shadow_cluster(spec) as cluster:
        argv = [
            sys.executable,
            __file__,
            "--worker",
            "--spec",
            str(spec_path),
            "--refdir",
            str(refdir),
            "--go",
            str(go),
        ]
        ranks = Ranks(argv, 2, {"SHADOWGRAD_TOKEN": TOKEN}, str(ROOT))
        try:
            deadline = time.monotonic() + 120
            while not all(
                s["last_applied"] is not None and s["last_applied"] >= PAUSE
                for s in cluster.status()
            ):
                if time.monotonic() > deadline or any(p.poll() is not None for p in ranks.procs):
                    raise AssertionError(
                        f"shadows did not reach {PAUSE}: {cluster.status()}\n"
                        + ranks.output(0)[-3000:]
                        + ranks.output(1)[-3000:]
                    )
                time.sleep(0.01)
            for c in cluster.clients:  # what a controller does to keep an iteration exportable
                c.hold(PAUSE)
            go.touch()
            codes = ranks.wait(120)
            assert codes == [0, 0], ranks.output(0)[-3000:] + ranks.output(1)[-3000:]
        finally:
            ranks.close()
        assert cluster.wait_applied(STEPS - 1, timeout_s=60)
        yield Job(spec, spec_path, cluster, refdir)


@pytest.fixture(scope="module")
def exported(job: Job, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``latest`` and the explicit iteration PAUSE, exported once (API)."""
    from shadowgrad.controller.export import export_checkpoint
    from shadowgrad.testing.specs import TOKEN

    tmp = tmp_path_factory.mktemp("exports")
    lines: list[str] = []
    latest = export_checkpoint(
        job.spec, "latest", tmp / "latest", token=TOKEN, progress=lines.append
    )
    holds_after_latest = [s["holds"] for s in job.cluster.status()]
    explicit = export_checkpoint(job.spec, PAUSE, tmp / "explicit", token=TOKEN)
    holds_after_explicit = [s["holds"] for s in job.cluster.status()]
    return {
        "latest": (tmp / "latest", latest),
        "explicit": (tmp / "explicit", explicit),
        "progress": lines,
        "holds": (holds_after_latest, holds_after_explicit),
    }


# --------------------------------------------------------------------------- export


def _plain_load(path: Path, ref: dict[str, Any]) -> dict[str, Any]:
    """``dcp.load`` in one process into a state dict shaped like the reference (zeros)."""
    import torch.distributed.checkpoint as dcp

    target: dict[str, Any] = {
        "model": {k: torch.zeros_like(v) for k, v in ref["model"].items()},
        "optim": {
            "state": {
                i: {k: torch.zeros_like(v) for k, v in st.items()}
                for i, st in ref["optim"]["state"].items()
            },
            "param_groups": copy.deepcopy(ref["optim"]["param_groups"]),
        },
        "scheduler": copy.deepcopy(ref["scheduler"]),
        "scaler": copy.deepcopy(ref["scaler"]),
        "user": {"step": -1, "note": ""},
        "iteration": -7,
    }
    for g in target["optim"]["param_groups"]:
        g["lr"] = -1.0
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(target, checkpoint_id=str(path))  # type: ignore[attr-defined]
    return target


@pytest.mark.parametrize("which", ["latest", "explicit"])
def test_export_equals_the_reference(job: Job, exported: dict[str, Any], which: str) -> None:
    from shadowgrad.controller.export import load_export

    path, manifest = exported[which]
    want_it = STEPS - 1 if which == "latest" else PAUSE
    assert manifest["iteration"] == want_it
    ref = job.ref(want_it)
    assert manifest["param_names"] == [
        "0.weight",
        "3.weight",
        "0.bias",
        "1.weight",
        "1.bias",
        "3.bias",
    ]  # optimizer-index order: decay group first
    assert {"1.running_mean", "1.running_var", "1.num_batches_tracked"} <= set(
        manifest["module_state"]
    )
    assert manifest["user_state"] and manifest["generation"] > 0
    assert manifest["job"] == {"id": job.spec.job.id, "name": job.spec.job.name}
    # 1. plain torch.distributed.checkpoint.load, one process
    got = _plain_load(path, ref)
    bad = _diff_tensors(got["model"], ref["model"], "model")
    bad += _diff_optim(got["optim"], ref["optim"])
    assert not bad, bad
    assert got["scheduler"] == ref["scheduler"] and got["scaler"] == ref["scaler"]
    assert got["user"] == {"step": want_it, "note": USER_NOTE}
    assert got["iteration"] == want_it
    # 2. load_export into fresh objects (empty optimizer state, other weights)
    torch.manual_seed(99)
    model = _model()
    opt, sched, scaler = _objects(model)
    res = load_export(path, model, opt, sched, scaler, verify=True)
    assert res["iteration"] == want_it and res["next_iteration"] == want_it + 1
    assert res["user_state"] == {"step": want_it, "note": USER_NOTE}
    assert res["missing_module_state"] == []
    assert not _diff_live(model, opt, sched, scaler, ref)
    # 3. and training goes on from it exactly as from the reference
    twin = _model()
    topt, tsched, tscaler = _objects(twin)
    twin.load_state_dict(ref["model"])
    topt.load_state_dict(ref["optim"])
    tsched.load_state_dict(ref["scheduler"])
    tscaler.load_state_dict(ref["scaler"])
    for m, o, s, sc in ((model, opt, sched, scaler), (twin, topt, tsched, tscaler)):
        x, y = _batch(want_it + 1, 0, 1)
        sc.scale(nn.functional.cross_entropy(m(x), y)).backward()
        sc.step(o)
        sc.update()
        s.step()
    assert not _diff_tensors(dict(model.state_dict()), dict(twin.state_dict()), "next step")


def test_export_holds_and_releases(job: Job, exported: dict[str, Any]) -> None:
    # one progress line per shard; the export's own hold on I* is gone afterwards, the hold
    # the test placed on PAUSE (as a controller would) is left alone
    assert len(exported["progress"]) == 2
    assert all(
        line.startswith(f"shard {i + 1}/2 from shadow ")
        for i, line in enumerate(exported["progress"])
    ), exported["progress"]
    after_latest, after_explicit = exported["holds"]
    assert after_latest == [[PAUSE], [PAUSE]]
    assert after_explicit == [[PAUSE], [PAUSE]]


def test_load_into_three_ranks(job: Job, exported: dict[str, Any], tmp_path: Path) -> None:
    from shadowgrad.testing.processes import Ranks

    path, manifest = exported["latest"]
    it = manifest["iteration"]
    argv = [
        sys.executable,
        __file__,
        "--load-rank",
        "--export",
        str(path),
        "--ref",
        str(job.refdir / f"ref{it}.pt"),
        "--iteration",
        str(it),
    ]
    ranks = Ranks(argv, 3, {}, str(ROOT))
    try:
        codes = ranks.wait(120)
        outs = [ranks.output(r) for r in range(3)]
    finally:
        ranks.close()
    assert codes == [0, 0, 0], "\n".join(f"--- rank {r}\n{o[-3000:]}" for r, o in enumerate(outs))
    for r, o in enumerate(outs):
        assert f"rank {r} of 3: ok" in o, o[-3000:]


# --------------------------------------------------------------------------- verify


def _verify_cli(path: Path) -> subprocess.CompletedProcess[str]:
    """``python -m shadowgrad.cli export --verify PATH``, as the console entry point runs it."""
    return subprocess.run(
        [sys.executable, "-m", "shadowgrad.cli", "export", "--verify", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x01 if path.name.endswith(".json") else 0xFF
    path.write_bytes(bytes(data))


def test_verify_catches_a_flipped_byte_in_every_file(
    exported: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shadowgrad.cli import main
    from shadowgrad.controller.export import MANIFEST, verify_export

    src, manifest = exported["explicit"]
    assert verify_export(src) == []
    assert main(["export", "--verify", str(src)]) == 0
    assert capsys.readouterr().out.strip() == "ok"
    files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
    assert set(files) == {*manifest["files"], MANIFEST}
    assert ".metadata" in files and any(f.endswith(".distcp") for f in files)
    n = 0
    for rel in files:
        size = (src / rel).stat().st_size
        for pos in sorted({0, size // 2, size - 1}):
            copy_dir = tmp_path / f"c{n}"
            n += 1
            shutil.copytree(src, copy_dir)
            _flip(copy_dir / rel, pos)
            problems = verify_export(copy_dir)
            assert {p.path for p in problems} == {rel}, (rel, pos, problems)
            if pos == size // 2:
                assert main(["export", "--verify", str(copy_dir)]) == 1
                err = capsys.readouterr().err
                assert f"bad {rel}: " in err, err
    # a missing and an extra file
    gone = tmp_path / "gone"
    shutil.copytree(src, gone)
    data = next(f for f in files if f.endswith(".distcp"))
    (gone / data).unlink()
    (gone / "notes.txt").write_text("x")
    problems = {(p.path, p.reason) for p in verify_export(gone)}
    assert (data, "missing") in problems and ("notes.txt", "not in the manifest") in problems
    # the real exit status of the console entry point
    bad = tmp_path / "c1"  # a flipped byte in the middle of the first file
    proc = _verify_cli(bad)
    assert proc.returncode == 1 and f"bad {files[0]}: " in proc.stderr, proc.stderr
    proc = _verify_cli(src)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


# --------------------------------------------------------------------------- CLI and errors


def _cli(job: Job, out: Path, *extra: str) -> int:
    from shadowgrad.cli import main

    return main(["export", "--spec", str(job.spec_path), "--out", str(out), *extra])


def test_wrong_token_is_refused_and_writes_nothing(
    job: Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHADOWGRAD_TOKEN", "not-the-token")
    before = [s["events"].get("control_bad_token", 0) for s in job.cluster.status()]
    assert _cli(job, tmp_path / "out", "--iteration", "latest") == 1
    err = capsys.readouterr().err
    assert "refused the token (bad_token)" in err and "SHADOWGRAD_TOKEN" in err, err
    assert list(tmp_path.iterdir()) == []
    after = [s["events"].get("control_bad_token", 0) for s in job.cluster.status()]
    assert after[0] > before[0]


def test_an_iteration_no_shadow_serves_is_named(
    job: Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from shadowgrad.testing.specs import TOKEN

    monkeypatch.setenv("SHADOWGRAD_TOKEN", TOKEN)
    for it in (2, 10**6):
        assert _cli(job, tmp_path / "out", "--iteration", str(it)) == 1
        err = capsys.readouterr().err
        assert f"no shadow can serve iteration {it} of shard 0" in err, err
    assert _cli(job, tmp_path / "out", "--iteration", "soon") == 1
    assert "--iteration" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert [s["holds"] for s in job.cluster.status()] == [[PAUSE], [PAUSE]]


def test_existing_out_is_refused_unless_force(
    job: Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from shadowgrad.controller.export import verify_export
    from shadowgrad.testing.specs import TOKEN

    monkeypatch.setenv("SHADOWGRAD_TOKEN", TOKEN)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert _cli(job, out, "--iteration", "latest") == 1
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert _cli(job, out, "--iteration", str(PAUSE), "--force", "--json") == 0
    captured = capsys.readouterr()
    manifest = json.loads(captured.out)
    assert manifest["iteration"] == PAUSE and "manifest_sha256" in manifest
    assert captured.err.count("from shadow") == 2  # the progress lines
    assert not (out / "keep.txt").exists() and verify_export(out) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _cli(job, empty) == 0  # an empty directory is fine; --iteration defaults to latest
    assert f"exported iteration {STEPS - 1} of job" in capsys.readouterr().out
    assert verify_export(empty) == []


def test_export_module_imports_no_grpc() -> None:
    code = (
        "import sys, shadowgrad.controller.export, shadowgrad.controller._export_cmd; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('grpc', 'p4runtime_sh', 'p4')"
        " or m.startswith('google.protobuf')]; assert not bad, bad"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr


def test_initial_state_from_the_replica_that_answers(tmp_path: Path) -> None:
    """One shard held twice (replication 2), loaded with the initial state (iteration -1) and
    replica 0 stopped: ``latest`` is -1 from replica 1; there is no COMMIT, so no scheduler,
    scaler, user state or LR; load_export leaves the optimizer's own LR alone."""
    from shadowgrad.config import parse_spec
    from shadowgrad.controller.export import export_checkpoint, load_export, verify_export
    from shadowgrad.layout import Layout, from_module
    from shadowgrad.optspec import OptimizerSpec
    from shadowgrad.shadow.replay import box_states_from_full
    from shadowgrad.specs import loopback_spec
    from shadowgrad.testing.cluster import shadow_cluster
    from shadowgrad.testing.specs import TOKEN

    spec = parse_spec(loopback_spec(world=1, shadows=2, replication=2), env={})
    torch.manual_seed(5)
    model = _model()
    opt, _sched, _scaler = _objects(model)
    layout = Layout.build(*from_module(model), num_shadows=2, replication=2)
    optspec = OptimizerSpec.from_optimizer(opt, model.named_parameters())
    states = box_states_from_full(
        layout, 0, {n: p.detach() for n, p in model.named_parameters()}, {}
    )
    with shadow_cluster(spec) as cluster:
        for c in cluster.clients:
            c.load(-1, states, optspec.to_json(), layout.to_json())
        cluster.nodes[0].stop()
        lines: list[str] = []
        manifest = export_checkpoint(
            spec, "latest", tmp_path / "init", token=TOKEN, timeout_s=0.5, progress=lines.append
        )
    assert manifest["iteration"] == -1 and manifest["sources"] == [1]
    assert manifest["commit"] is None and not manifest["user_state"]
    assert lines == [lines[0]] and lines[0].startswith("shard 1/1 from shadow 1:")
    assert verify_export(tmp_path / "init") == []
    fresh = _model()
    fopt, fsched, _ = _objects(fresh)
    lrs = [g["lr"] for g in fopt.param_groups]
    res = load_export(tmp_path / "init", fresh, fopt, fsched)
    assert res["iteration"] == -1 and res["user_state"] is None
    trained = {
        n: p
        for n, p in model.state_dict().items()
        if not n.startswith("1.running") and not n.endswith("num_batches_tracked")
    }
    assert not _diff_tensors({n: fresh.state_dict()[n] for n in trained}, trained, "model")
    assert res["missing_module_state"] == [
        "1.num_batches_tracked",
        "1.running_mean",
        "1.running_var",
    ]
    assert fopt.state_dict()["state"] == {}
    assert [g["lr"] for g in fopt.param_groups] == lrs  # the live LR: none was exported
