"""The pause self-healing costs the training thread: the staging copy of one shard's state.

When a shard lost its state and has no healthy replica, the rank responsible for it copies the
shard's parameters and optimizer state (AdamW: param, exp_avg, exp_avg_sq) at the end of a step
and sends the copy in the background (docs/trainer.md, *Self-healing*). That copy is the only
time self-healing takes from training. This measures it — ``Shadowgrad._shard_states(shard,
clone=True)``, the code the step runs — for the largest shard of a 3-shadow layout, against a
bare ``torch.Tensor.copy_`` of the same number of bytes into preallocated memory (the
memory-bandwidth baseline, same run), and against one training iteration of the same model
(forward + backward + AdamW step, batch 16) for scale.

    .venv/bin/python bench/reseed_bench.py --sizes 10M,100M --repeat 5

Then the re-seed itself, into a shadow that was just restarted (``--load-models``; ``load`` in
the JSON): each repeat starts a real ``shadowgrad shadow`` process and times, from its start,
the first ``status`` reply (``status_s``: its control endpoint answers, still ``starting``) and
the first reply no longer ``starting`` (``ready_s``: torch imported, the node up), then the
trainer's re-seed ``load`` of the shard (``Shadowgrad._send_load`` over the health monitor's
kind of connection, which the status polls opened) — the first one into the fresh process and
warm ones after it; whole round trips, and the transfer alone (one way, until the shadow took
the request off its socket, its clock related to ours by status polls:
``trainer.reseed``'s send_mb_s) — against a bare zmq round trip of the same frames
to a REP socket in another process (the loopback baseline, same run). ``--hog N`` runs N busy
loops meanwhile (a loaded machine).

    .venv/bin/python bench/reseed_bench.py --sections load --load-models transformer,10M --hog 2

Writes ``bench/results/reseed_bench.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _median_ms(fn: Any, repeat: int) -> tuple[float, float, float]:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times), min(times), max(times)


def bench(size: str, repeat: int) -> dict[str, Any]:
    import torch

    from shadowgrad.config import parse_spec
    from shadowgrad.specs import loopback_spec
    from shadowgrad.trainer_hooks import attach

    width = _common.SIZES[size][0]  # the MLP of trainer_bench.py
    model = _common.mlp(size)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    spec = parse_spec(loopback_spec(world=1, shadows=3), env={})
    sg = attach(model, opt, spec, token="bench")
    x = torch.randn(16, width)

    def iteration() -> None:
        model(x).square().mean().backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)

    it_ms = _median_ms(iteration, repeat)  # also creates the optimizer state
    shard = max(range(sg.layout.num_shards), key=sg.layout.shard_bytes)
    states = sg._shard_states(shard, clone=True)
    nbytes = sum(t.numel() * t.element_size() for st in states for t in st.values())
    pause = _median_ms(lambda: sg._shard_states(shard, clone=True), repeat)
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8)
    memcpy = _median_ms(lambda: dst.copy_(src), repeat)
    return {
        "size": size,
        "params": nparams,
        "shard": shard,
        "shard_state_bytes": nbytes,
        "pause_ms": {"median": pause[0], "min": pause[1], "max": pause[2]},
        "memcpy_ms": {"median": memcpy[0], "min": memcpy[1], "max": memcpy[2]},
        "iteration_ms": {"median": it_ms[0], "min": it_ms[1], "max": it_ms[2]},
        "pause_vs_memcpy": pause[0] / memcpy[0],
        "pause_vs_iteration": pause[0] / it_ms[0],
        "GB_per_s": nbytes / (pause[0] / 1000) / 1e9,
    }


TOKEN = "reseed-bench-token"

#: a bare REP socket answering every request with a small reply: the loopback baseline of a
#: load (no shadowgrad code; the project's one ROUTER loop is shadowgrad._control_server)
_ECHO = """
import zmq
ctx = zmq.Context()
s = ctx.socket(zmq.REP)
print(s.bind_to_random_port("tcp://127.0.0.1"), flush=True)
while True:
    s.recv_multipart(copy=False)
    s.send(b'{"ok": true}')
"""


@contextlib.contextmanager
def _hogs(n: int) -> Iterator[None]:
    """``n`` busy-loop processes while the block runs (a loaded machine)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _trainer(model_name: str) -> tuple[Any, int, list[dict[str, Any]], Any]:
    """A 1-rank trainer attached to ``model_name`` (``transformer``: the demo's; else an MLP
    size) after one AdamW step, with 2 shadows (2 shards): (session, its largest shard, that
    shard's box states as a re-seed captures them, the spec)."""
    import torch

    from shadowgrad.config import parse_spec
    from shadowgrad.specs import loopback_spec
    from shadowgrad.trainer_hooks import attach

    if model_name == "transformer":
        from shadowgrad.bmv2_testbed.demo_worker import batch, build_model

        model = build_model("transformer")
        x, y = batch("transformer", 0, 0, 1)
        loss = lambda: torch.nn.functional.cross_entropy(model(x), y)  # noqa: E731
    else:
        model = _common.mlp(model_name)
        xm = torch.randn(16, _common.SIZES[model_name][0])
        loss = lambda: model(xm).square().mean()  # noqa: E731
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    loss().backward()
    opt.step()
    spec = parse_spec(loopback_spec(world=1, shadows=2), env={"SHADOWGRAD_TOKEN": TOKEN})
    sg = attach(model, opt, spec, token=TOKEN)
    shard = max(range(sg.layout.num_shards), key=sg.layout.shard_bytes)
    return sg, shard, sg._shard_states(shard, clone=True), spec


def _zmq_baseline(frames: list[Any], repeat: int) -> float:
    """Median seconds of a bare zmq round trip carrying ``frames`` to a REP socket in another
    process (REQ, as the control client)."""
    import zmq

    echo = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, text=True)
    try:
        assert echo.stdout is not None
        port = int(echo.stdout.readline())
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        s = ctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://127.0.0.1:{port}")
        head = json.dumps({"op": "load", "token": TOKEN}).encode()
        times = []
        for k in range(repeat + 1):
            t0 = time.perf_counter()
            s.send_multipart([head, *frames], copy=False)
            s.recv_multipart()
            if k:  # the first one connects
                times.append(time.perf_counter() - t0)
        s.close(linger=0)
        ctx.term()
        return statistics.median(times)
    finally:
        echo.kill()
        echo.wait()


@contextlib.contextmanager
def _shadow_process(spec_path: Path, k: int) -> Iterator[tuple[subprocess.Popen[bytes], Any]]:
    """``shadowgrad shadow --spec SPEC --id k`` while the block runs: (process, its log)."""
    env = {**os.environ, "SHADOWGRAD_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "shadowgrad.cli", "shadow", "--spec", str(spec_path)]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([*cmd, "--id", str(k)], env=env, stdout=log, stderr=log)
        try:
            yield proc, log
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _restart_and_load(
    sg: Any, shard: int, states: list[dict[str, Any]], spec_path: Path, warm: int
) -> dict[str, float]:
    """Start shadow ``shard`` (replica 0) as a fresh process; the seconds until it answers,
    until it is ready, its first re-seed load and the median of ``warm`` more."""
    from shadowgrad.control_client import ShadowClient
    from shadowgrad.errors import ShadowgradTimeout
    from shadowgrad.messages import ShadowStatus
    from shadowgrad.trainer_hooks._health import PeerClock, _send_fields

    k = shard
    ep = f"tcp://{sg.spec.shadows.control_endpoint(k)}"
    t0 = time.monotonic()
    with _shadow_process(spec_path, k) as (proc, log), ShadowClient(ep, TOKEN, timeout_s=0.5) as c:
        st: ShadowStatus | None = None
        while st is None:
            if proc.poll() is not None or time.monotonic() - t0 > 120:
                log.seek(0)
                raise RuntimeError(f"shadow {k} did not answer: {log.read()[-2000:]!r}")
            with contextlib.suppress(ShadowgradTimeout):
                st = c.status(timeline=0)
        status_s = time.monotonic() - t0
        while st.starting:
            time.sleep(0.005)
            if time.monotonic() - t0 > 120:
                raise RuntimeError(f"shadow {k} still starting after 120 s")
            # the hand-over from the early socket to the node may miss one poll's deadline
            with contextlib.suppress(ShadowgradTimeout):
                st = c.status(timeline=0)
        ready_s = time.monotonic() - t0
        # the shadow's clock against ours, from status polls, as the health monitor keeps it
        clock = PeerClock()
        for _ in range(5):
            a = time.monotonic()
            st = c.status(timeline=0)
            if st.clock is not None:
                clock.add(a, time.monotonic(), st.clock, st.incarnation)
        loads, sends = [], []
        for it in range(warm + 1):
            t1 = time.monotonic()
            install, received = sg._send_load(k, it, states, None, reseed=True, client=c)
            loads.append(time.monotonic() - t1)
            # as trainer.reseed splits the round trip: one way, to the shadow's receipt
            at = None if received is None else clock.ours(received)
            f = _send_fields(1, loads[-1], install, None if at is None else at - t1)
            sends.append(f["send_ms"] / 1000)
    return {
        "status_s": status_s,
        "ready_s": ready_s,
        "first_load_s": loads[0],
        "warm_load_s": statistics.median(loads[1:]) if warm else loads[0],
        "first_send_s": sends[0],
        "warm_send_s": statistics.median(sends[1:]) if warm else sends[0],
    }


def bench_load(model_name: str, repeat: int, warm: int = 3) -> dict[str, Any]:
    from shadowgrad.tensorstream import encode_states

    sg, shard, states, spec = _trainer(model_name)
    try:
        nbytes = sum(int(v.nbytes) for st in states for v in st.values())
        with tempfile.TemporaryDirectory() as tmp:
            spec_path = Path(tmp) / "job.toml"
            spec_path.write_text(spec.to_toml(), encoding="utf-8")
            runs = [_restart_and_load(sg, shard, states, spec_path, warm) for _ in range(repeat)]
        _, frames = encode_states(list(enumerate(states)))
        base = _zmq_baseline(frames, max(5, repeat))
    finally:
        sg.close(finished=False)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    first, warm_s = med("first_load_s"), med("warm_load_s")
    first_send, warm_send = med("first_send_s"), med("warm_send_s")
    return {
        "model": model_name,
        "shard": shard,
        "bytes": nbytes,
        "tensors": sum(len(st) for st in states),
        "status_s": med("status_s"),
        "status_s_max": max(r["status_s"] for r in runs),
        "ready_s": med("ready_s"),
        "ready_s_max": max(r["ready_s"] for r in runs),
        "first_load_ms": 1000 * first,
        "warm_load_ms": 1000 * warm_s,
        "zmq_ms": 1000 * base,
        "first_load_MB_s": nbytes / first / 1e6,
        "warm_load_MB_s": nbytes / warm_s / 1e6,
        "zmq_MB_s": nbytes / base / 1e6,
        # the transfer alone (one way, to the shadow's receipt): trainer.reseed's send_mb_s;
        # against zmq's round trip it flatters by the reply's way back (load_vs_zmq does not)
        "first_send_MB_s": nbytes / first_send / 1e6,
        "warm_send_MB_s": nbytes / warm_send / 1e6,
        "first_send_vs_zmq": base / first_send,
        "first_load_vs_zmq": base / first,
        "warm_load_vs_zmq": base / warm_s,
        "runs": runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10M,100M")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--sections",
        default="pause,load",
        help="pause (the staging copy), load (restart a shadow, re-seed it); a run of only "
        "some writes only those: give it an --out of its own",
    )
    ap.add_argument(
        "--load-models",
        default="transformer,1M,10M",
        help="models of the load section: transformer (the demo's) or MLP sizes",
    )
    ap.add_argument("--hog", type=int, default=0, help="busy loops during the load section")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "reseed_bench.json"))
    args = ap.parse_args()
    import torch

    sections = set(args.sections.split(","))
    rows = [bench(s, args.repeat) for s in args.sizes.split(",")] if "pause" in sections else []
    loads: list[dict[str, Any]] = []
    if "load" in sections:
        with _hogs(args.hog):
            loads = [bench_load(m, args.repeat) for m in args.load_models.split(",")]
    for r in rows:
        print(
            f"{r['size']:>5} ({r['params'] / 1e6:.1f}M params, shard {r['shard']}: "
            f"{r['shard_state_bytes'] / 2**20:.1f} MiB): pause {r['pause_ms']['median']:.1f} ms"
            f" = {r['pause_vs_memcpy']:.2f}x memcpy ({r['memcpy_ms']['median']:.1f} ms), "
            f"{r['pause_vs_iteration']:.2f}x one iteration ({r['iteration_ms']['median']:.0f} "
            "ms)",
            flush=True,
        )
    for r in loads:
        print(
            f"re-seed {r['model']:>11} (shard {r['shard']}: {r['bytes'] / 1e6:.2f} MB, "
            f"{r['tensors']} tensors): restarted shadow answers in {r['status_s']:.2f} s, "
            f"ready in {r['ready_s']:.2f} s; first load {r['first_load_ms']:.1f} ms = "
            f"{r['first_load_MB_s']:.0f} MB/s (transfer {r['first_send_MB_s']:.0f} MB/s = "
            f"{r['first_send_vs_zmq']:.2f}x zmq), warm {r['warm_load_MB_s']:.0f} MB/s; bare zmq "
            f"{r['zmq_MB_s']:.0f} MB/s (first load {r['first_load_vs_zmq']:.2f}x, warm "
            f"{r['warm_load_vs_zmq']:.2f}x of it)"
            + (f" [{args.hog} busy loops]" if args.hog else ""),
            flush=True,
        )
    doc = {
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": __import__("os").cpu_count(),
        },
        "repeat": args.repeat,
        "results": rows,
        "hog": args.hog,
        "load": loads,
    }
    _common.write_json(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
