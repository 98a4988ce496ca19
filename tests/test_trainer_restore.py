"""Restore from the shadows (invariant 4): SIGKILL a rank at a random point, restart the job, and
its per-iteration losses and final parameters equal an uninterrupted run bit for bit; restore
from 4 ranks into 2 (global coordinates).

The training script is this file run as a program (``--worker``); the shadows are real
``ShadowNode`` s in the test process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:
    from shadowgrad.layout import Layout

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the worker


def _resnet() -> torch.nn.Module:
    """ResNet-50's BatchNorm layout (a stem, bottleneck stages of 3, 4, 6, 3 blocks, widths 64 to
    512 expanded 4x, a projection shortcut per stage: 53 BatchNorm layers, 26,560 channels,
    ~208 KiB of buffers) with grouped convolutions on 8x8 inputs, so that 2 CPU ranks train
    several iterations a second."""
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = 4 * width
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False, groups=32 if cin % 32 == 0 else 1)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False, groups=32)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, cout, 1, bias=False, groups=32)
            self.bn3 = nn.BatchNorm2d(cout)
            self.down: nn.Module | None = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False, groups=32 if cin % 32 == 0 else 1),
                    nn.BatchNorm2d(cout),
                )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    layers: list[nn.Module] = [nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)]
    layers.append(nn.ReLU())
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
            cin = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 4)]
    return nn.Sequential(*layers)


def _model(cnn: bool = False, resnet: bool = False) -> torch.nn.Module:
    from torch import nn

    if resnet:
        return _resnet()
    if cnn:  # BatchNorm: running statistics and num_batches_tracked are module buffers
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 4),
        )
    return nn.Sequential(
        nn.Linear(32, 96), nn.Tanh(), nn.Linear(96, 96), nn.Tanh(), nn.Linear(96, 4)
    )


def _batch(
    step: int, rank: int, world: int, cnn: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    # the global batch of a step is fixed; each rank takes its share (any world size)
    g = torch.Generator().manual_seed(step)
    x = torch.randn(48, 3, 8, 8, generator=g) if cnn else torch.randn(48, 32, generator=g)
    y = torch.randint(0, 4, (48,), generator=g)
    per = 48 // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def worker(argv: list[str]) -> None:
    import math

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from shadowgrad.trainer_hooks import attach

    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--amp", action="store_true", help="LR schedule + GradScaler")
    ap.add_argument("--out")
    ap.add_argument("--dump-start")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--cnn", action="store_true", help="a small CNN with BatchNorm")
    ap.add_argument("--resnet", action="store_true", help="ResNet-50's BatchNorm layout")
    ap.add_argument("--chunk-bytes", type=int, default=None, help="datagram payload size")
    ap.add_argument(
        "--software-tap",
        action="store_true",
        help="in-band: copy FINAL chunks to the shadows in software (no switch)",
    )
    args = ap.parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(_model(args.cnn, args.resnet))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    sched = scaler = None
    if args.amp:
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / 4) * 0.5 * (1 + math.cos(math.pi * s / 60))
        )
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**126, growth_interval=6)
    sg = attach(
        model,
        opt,
        args.spec,
        lr_scheduler=sched,
        grad_scaler=scaler,
        max_grad_norm=0.5,
        software_tap=args.software_tap,
        chunk_bytes=args.chunk_bytes,
    )

    def save(path: str, **extra: Any) -> None:
        torch.save(
            {"model": model.module.state_dict(), "optimizer": opt.state_dict(), **extra}, path
        )

    start = sg.restore_or_start()
    if rank == 0:
        print(f"start {start.iteration} {int(start.restored)} {start.user_state}", flush=True)
    if args.dump_start and rank == 0:
        save(args.dump_start, iteration=start.iteration)
    for step in range(start.iteration, args.steps):
        x, y = _batch(step, rank, world, args.cnn or args.resnet)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        sg.backward(loss)
        sg.step(user_state={"step": step})
        if rank == 0:
            print(f"step {step} loss {loss.item().hex()}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    ring = sg.ring
    sg.close()
    if ring is not None:  # in-band: the longest a ring send waited for window space
        print(f"ring_wait {rank} {ring.max_send_wait_s:.6f}", flush=True)
        # its counters (FINAL chunks re-sent after a late ACK: the switch copied them again)
        print(f"ring_stats {rank} {json.dumps(dict(ring.stats))}", flush=True)
    if args.out and rank == 0:
        save(args.out)
    dist.destroy_process_group()


# --------------------------------------------------------------------------- helpers


def _spec(tmp: Path, doc: dict[str, Any], name: str = "job.toml") -> Path:
    from shadowgrad.specs import spec_toml

    path = tmp / name
    path.write_text(spec_toml(doc))
    return path


def _launch(spec: Path, world: int, steps: int, *extra: str) -> Any:
    from shadowgrad.testing.processes import Ranks
    from shadowgrad.testing.specs import TOKEN

    argv = [
        sys.executable,
        __file__,
        "--worker",
        "--spec",
        str(spec),
        "--steps",
        str(steps),
        *extra,
    ]
    return Ranks(argv, world, {"SHADOWGRAD_TOKEN": TOKEN}, str(ROOT))


def _losses(text: str) -> dict[int, str]:
    # complete lines only: a running rank's last line may be half written
    return {int(m[1]): m[2] for m in re.finditer(r"^step (\d+) loss (\S+)\n", text, re.M)}


def _start(text: str) -> tuple[int, bool]:
    m = re.search(r"^start (\d+) (\d)", text, re.M)
    assert m, text[-2000:]
    return int(m[1]), bool(int(m[2]))


def _finish(ranks: Any, world: int, timeout_s: float = 240.0) -> str:
    codes = ranks.wait(timeout_s)
    text = str(ranks.output(0))
    if codes != [0] * world:
        raise AssertionError(
            f"exit codes {codes}\n"
            + "\n".join(f"--- rank {r}\n{ranks.output(r)[-3000:]}" for r in range(world))
        )
    return text


def _run_to_end(spec: Path, world: int, steps: int, *extra: str) -> str:
    """Launch ``world`` ranks for ``steps`` steps and wait for them all to exit 0; rank 0's
    output."""
    ranks = _launch(spec, world, steps, *extra)
    try:
        return _finish(ranks, world)
    finally:
        ranks.close()


def _kill_rank_when(ranks: Any, logged: int, delay: float, victim: int) -> float:
    """Once rank 0 logged step ``logged``, wait ``delay`` s and SIGKILL rank ``victim``; when
    (``time.monotonic()``) it was killed. Fails if a rank ends first."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        seen = _losses(str(ranks.output(0)))
        if seen and max(seen) >= logged:
            break
        if any(p.poll() is not None for p in ranks.procs):
            raise AssertionError("a rank ended early:\n" + ranks.output(0)[-3000:])
        time.sleep(0.005)
    time.sleep(delay)
    os.kill(ranks.procs[victim].pid, signal.SIGKILL)
    return time.monotonic()


def _layout(shadows: int, replication: int, *model: bool) -> Layout:
    """The layout of :func:`_model` ``(*model)`` over ``shadows`` shadows (module state
    included)."""
    from shadowgrad.layout import Layout, from_module, state_from_module

    m = _model(*model)
    params, buckets = from_module(m)
    _, state = state_from_module(m, {p.name for p in params})
    return Layout.build(params, buckets, shadows, replication, state=state)


def _assert_resumed_bit_identical(
    trial: int,
    steps: int,
    first: dict[int, str],
    text: str,
    start: int,
    out: Path,
    ref_losses: dict[int, str],
    ref_final: dict[str, Any],
    status: list[dict[str, Any]],
) -> None:
    """A run of ``steps`` steps, killed and resumed (losses ``first`` before the kill, rank 0's
    output ``text`` of the run resumed at ``start``, final state in ``out``), equals the
    reference bit for bit, and no shadow diverged."""
    for step, loss in first.items():
        assert loss == ref_losses[step], f"trial {trial}: first run step {step}"
    second = _losses(text)
    assert sorted(second) == list(range(start, steps))
    for step, loss in second.items():
        assert loss == ref_losses[step], f"trial {trial}: resumed run step {step}"
    bad = _equal_states(torch.load(out, weights_only=True), ref_final)
    assert not bad, f"trial {trial}: {bad}"
    assert all(s["diverged_at"] is None for s in status)


def _assert_shadows_hold_final(
    final: Path,
    state: tuple[int, dict[str, Any], dict[str, Any]],
    text: str,
    steps: int,
    status: list[dict[str, Any]],
) -> None:
    """Rank 0 logged every step, and the shadows' full state (``state``: iteration, parameters,
    optimizer state by name) is the last iteration's and equals the trainers' final state saved
    in ``final``, with no shadow diverged."""
    it, sparams, sopt = state
    assert it == steps - 1
    assert sorted(_losses(text)) == list(range(steps))
    saved = torch.load(final, weights_only=True)
    names = [n for n, _ in _model().named_parameters()]
    shadow = {"model": sparams, "optimizer": {"state": {i: sopt[n] for i, n in enumerate(names)}}}
    assert not _equal_states(saved, shadow)
    for s in status:
        assert s["diverged_at"] is None


def _reference(
    tmp: Path, steps: int, amp: bool, *extra: str
) -> tuple[dict[int, str], dict[str, Any]]:
    from shadowgrad.config import parse_spec
    from shadowgrad.specs import loopback_spec
    from shadowgrad.testing.cluster import shadow_cluster

    doc = loopback_spec(world=4, shadows=3)
    spec = _spec(tmp, doc, "ref.toml")
    out = tmp / "ref.pt"
    with shadow_cluster(parse_spec(doc, env={})):
        text = _run_to_end(spec, 4, steps, "--out", str(out), *(["--amp"] if amp else []), *extra)
    return _losses(text), torch.load(out, weights_only=True)


def _equal_states(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    bad = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sorted(sa) == sorted(sb)
    for i in sa:
        for k, v in sa[i].items():
            if not torch.equal(v, sb[i][k]):
                bad.append(f"opt[{i}].{k}")
    return bad


# --------------------------------------------------------------------------- tests

STEPS = 30


def _kill_trial(
    tmp: Path,
    trial: int,
    amp: bool,
    ref_losses: dict[int, str],
    ref_final: dict[str, Any],
    *more: str,
) -> dict[str, Any]:
    from shadowgrad.config import parse_spec
    from shadowgrad.specs import loopback_spec
    from shadowgrad.testing.cluster import shadow_cluster

    rng = random.Random(1000 + trial)
    kill_after = rng.randrange(2, STEPS - 4)
    victim = rng.randrange(4)
    delay = rng.uniform(0.0, 0.03)
    doc = loopback_spec(world=4, shadows=3)
    spec = _spec(tmp, doc, f"trial{trial}.toml")
    out = tmp / f"trial{trial}.pt"
    extra = [*(["--amp"] if amp else []), *more]
    with shadow_cluster(parse_spec(doc, env={})) as cluster:
        ranks = _launch(spec, 4, STEPS, *extra)
        try:
            _kill_rank_when(ranks, kill_after, delay, victim)
            time.sleep(0.05)
            first = _losses(str(ranks.output(0)))
        finally:
            ranks.close()  # the others hang in a collective: kill them too
        text = _run_to_end(spec, 4, STEPS, "--out", str(out), *extra)
        cluster_status = cluster.status()
    start, restored = _start(text)
    assert restored or start == 0
    _assert_resumed_bit_identical(
        trial, STEPS, first, text, start, out, ref_losses, ref_final, cluster_status
    )
    return {
        "kill_after": kill_after,
        "victim": victim,
        "last_logged": max(first, default=-1),
        "resumed_at": start,
    }


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 4 kill/restart trials: ~75 s on 2 shared cores (10: ~180 s)
@pytest.mark.parametrize("amp", [False, True], ids=["adamw-clip", "adamw-clip-sched-scaler"])
def test_sigkill_a_rank_then_restore_is_bit_identical(tmp_path: Path, amp: bool) -> None:
    # the restore of the LR scheduler, the grad scaler and the user state needs the COMMIT
    # record of I* from the shadows' fetch reply
    # 4 trials in the full variant (SHADOWGRAD_KILL_TRIALS=20 for a long run; the soaks in
    # test_trainer_heal kill the documented example 23 more times); the plain one is a quick
    # cross-check
    trials = int(os.environ.get("SHADOWGRAD_KILL_TRIALS", "4" if amp else "1"))
    ref_losses, ref_final = _reference(tmp_path, STEPS, amp)
    assert sorted(ref_losses) == list(range(STEPS))
    results = [_kill_trial(tmp_path, t, amp, ref_losses, ref_final) for t in range(trials)]
    print(results)
    # bounded loss of work: the restart repeats at most the iterations in flight when the rank
    # died: rank 0 may have logged one iteration further, and the victim's mirror sender (a
    # background thread that never stalls training) may not yet have sent its slice of the
    # iteration before — seen once in a CI run on 2 loaded cores (logged 18, resumed at 16).
    # (Once logged 21, resumed at 17: the idle sender slept in a 20 ms select that a capture
    # could not interrupt; it now wakes at once — test_trainer_local checks that.)
    assert all(r["resumed_at"] >= r["last_logged"] - 2 for r in results), results


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkill_restore_with_batchnorm_is_bit_identical(tmp_path: Path) -> None:
    """A CNN with BatchNorm: the running statistics and num_batches_tracked (module buffers,
    not parameters) stream to the shadows with every iteration and come back with the restore,
    so parameters, optimizer state *and* buffers after a kill and restart equal an
    uninterrupted run."""
    ref_losses, ref_final = _reference(tmp_path, STEPS, True, "--cnn")
    assert any("running_mean" in k for k in ref_final["model"])
    results = [_kill_trial(tmp_path, t, True, ref_losses, ref_final, "--cnn") for t in range(2)]
    print(results)
    assert all(r["resumed_at"] >= r["last_logged"] - 2 for r in results), results


@pytest.mark.slow
def test_restore_from_4_ranks_into_2(tmp_path: Path) -> None:
    from shadowgrad.config import parse_spec
    from shadowgrad.specs import loopback_spec
    from shadowgrad.testing.cluster import shadow_cluster

    doc4 = loopback_spec(world=4, shadows=3)
    spec4 = _spec(tmp_path, doc4, "w4.toml")
    doc2 = {
        **doc4,
        "trainers": {
            **doc4["trainers"],
            "world_size": 2,
            "addresses": doc4["trainers"]["addresses"][:2],
        },
    }
    spec2 = _spec(tmp_path, doc2, "w2.toml")
    with shadow_cluster(parse_spec(doc4, env={})) as cluster:
        amp = ["--amp"]
        _run_to_end(spec4, 4, 12, "--out", str(tmp_path / "w4.pt"), *amp)
        assert cluster.wait_applied(11, timeout_s=60)
        start_dump = ["--dump-start", str(tmp_path / "w2start.pt")]
        text = _run_to_end(spec2, 2, 16, *start_dump, *amp, "--out", str(tmp_path / "w2.pt"))
        assert cluster.wait_applied(15, timeout_s=60)
    assert _start(text) == (12, True)
    # the user state of iteration 11 came back from the shadows (COMMIT(11) in the fetch reply)
    assert re.search(r"^start 12 1 \{'step': 11\}", text, re.M), text[:500]
    w4 = torch.load(tmp_path / "w4.pt", weights_only=True)
    w2 = torch.load(tmp_path / "w2start.pt", weights_only=True)
    assert not _equal_states(w2, w4)
    assert sorted(_losses(text)) == list(range(12, 16))


if __name__ == "__main__" and "--worker" in sys.argv:
    sys.path.insert(0, str(ROOT))
    worker([a for a in sys.argv[1:] if a != "--worker"])


def test_reading_a_running_rank_output_never_corrupts_it() -> None:
    # the restore tests poll rank 0's output while it trains; reading must not move the offset
    # the child writes at (it once overwrote lines: a loss read back spliced with a later one)
    from shadowgrad.testing.processes import Ranks

    code = "for i in range(3000):\n    print(f'step {i} loss 0x1.{i:013x}p+0', flush=True)\n"
    ranks = Ranks([sys.executable, "-c", code], 1, {}, str(ROOT))
    try:
        while ranks.procs[0].poll() is None:
            for step, loss in _losses(ranks.output(0)).items():
                assert loss == f"0x1.{step:013x}p+0", step
        assert ranks.wait(30) == [0]
        seen = _losses(ranks.output(0))
        assert sorted(seen) == list(range(3000))
        assert all(loss == f"0x1.{step:013x}p+0" for step, loss in seen.items())
    finally:
        ranks.close()


class _StaleController:
    """A controller that always answers ``restore_point`` with the same old iteration
    (``istar``, which the shadows no longer hold): a decision gone stale. Counts the requests
    and what they said had failed."""

    def __init__(self, token: str, istar: int, shadows: int, layout: str) -> None:
        import threading

        import zmq

        self.token, self.istar, self.shadows, self.layout = token, istar, shadows, layout
        self.requests: list[dict[str, Any]] = []
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"127.0.0.1:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import json

        import zmq

        from shadowgrad._control_server import check_request

        while not self._stop.is_set():
            if not self._sock.poll(50, zmq.POLLIN):
                continue
            parts = self._sock.recv_multipart()
            sep = next(i for i, p in enumerate(parts) if len(p) == 0)
            req, refused = check_request(parts[sep + 1], self.token)
            if refused is not None:
                reply: dict[str, Any] = refused
            elif req.get("op") == "restore_point":
                self.requests.append(req)
                reply = {
                    "ok": True,
                    "istar": self.istar,
                    "source": list(range(self.shadows)),
                    "usable": [self.istar] * self.shadows,
                    "fresh": False,
                    "reachable": self.shadows,
                    "layout": self.layout,
                    "held": list(range(self.shadows)),
                    "generation_seen": 0,
                }
            else:
                reply = {"ok": True}
            self._sock.send_multipart([*parts[: sep + 1], json.dumps(reply).encode()])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(linger=0)
        self._ctx.term()


def test_restarted_trainers_never_die_on_a_stale_restore_point(tmp_path: Path) -> None:
    """The controller's restore point cannot be fetched (the shadows moved on): the trainers
    ask it again, saying which iteration failed, then survey the shadows themselves, restore
    the newest iteration every shard holds and resume bit-identically (issue 21)."""
    from shadowgrad.config import parse_spec
    from shadowgrad.specs import loopback_spec
    from shadowgrad.testing.cluster import shadow_cluster
    from shadowgrad.testing.specs import TOKEN

    ref_losses, ref_final = _reference(tmp_path, STEPS, False)
    doc = loopback_spec(world=4, shadows=3)
    spec = _spec(tmp_path, doc, "plain.toml")
    out = tmp_path / "stale.pt"
    with shadow_cluster(parse_spec(doc, env={})) as cluster:
        first_text = _run_to_end(spec, 4, STEPS // 2)  # 0 .. 14 on the shadows
        stale = _StaleController(TOKEN, istar=3, shadows=3, layout=cluster.status()[0]["layout"])
        try:
            doc_ctl = {**doc, "controller": {"address": stale.address}}
            spec_ctl = _spec(tmp_path, doc_ctl, "stale.toml")
            text = _run_to_end(spec_ctl, 4, STEPS, "--out", str(out))
        finally:
            stale.close()
        status = cluster.status()
    assert [r.get("failed") for r in stale.requests] == [None, 3], stale.requests
    assert text.count("trainer.restore_retry") == 2, text[-4000:]
    start, restored = _start(text)
    assert restored and start == STEPS // 2
    first = _losses(first_text)
    _assert_resumed_bit_identical(0, STEPS, first, text, start, out, ref_losses, ref_final, status)
