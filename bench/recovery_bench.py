"""Recovery time (issue 14): a restarted job restoring model + optimizer state from the shadows
(1, 2 and 4 shadows, replication 1) against loading the same state from a local disk with
``torch.distributed.checkpoint`` (DCP) and with ``torch.load``, in the same run.

One model (an MLP of ``depth`` x ``Linear(width, width)``, the sizes of trainer_bench.py) with
AdamW, world size 1, in this process. For every shadow count a cluster of real shadow nodes
(``shadowgrad.shadow.testing.shadow_cluster``: threads of this process, on loopback) gets the
state of a first session (``attach`` + ``restore_or_start`` + a few ``sg.step`` with real
gradients, then ``close``). The baselines save the state of the same first iterations, trained
without shadowgrad, with ``dcp.save`` to a local temporary directory and with ``torch.save`` to
a file there (not timed). Then, per round, every variant recovers once, in an order that rotates
from round to round (load from other processes hits all alike):

* ``shadowgrad`` (N shadows) -- new model + optimizer, ``attach``, ``restore_or_start``: rank 0
  surveys the shadows (status, then polls until no shadow applies anything more: the settle, 3
  polls of ``timeouts.gap_repair``), fetches every shard of I* from them, loads it into model and
  optimizer, and loads it back into the shadows as the new session's start;
* ``dcp_load`` -- new model + optimizer, ``get_state_dict`` (which creates the optimizer state
  DCP loads into), ``dcp.load`` from the directory (no process group: single process),
  ``set_state_dict``: **the baseline of the ratios**;
* ``torch_load`` -- new model + optimizer, ``torch.load`` of the file, ``load_state_dict`` of
  both.

"restore" is the wall time from the start of the model's construction until the state is in
place; "restore + first iteration" adds one training iteration after it (forward, backward,
``sg.step`` / ``opt.step``), timed separately so the equality check between the two is left out.
After every restore, every parameter and every optimizer state tensor is compared with
``torch.equal`` to the state the restored session (or the saved files) ended with; a mismatch
fails the bench. A shadowgrad round ends by closing its session (not timed: ``close`` waits for
the shadows to apply the last iteration); the next round restores that iteration. The
checkpoint files are in the OS page cache when loaded (they were just written; the cache is
not dropped): a best case for the disk. The shadows are threads of this process, sharing its
CPU with the restoring trainer. Timings are reported, never asserted.

    .venv/bin/python bench/recovery_bench.py                 # 1M and 10M, 5 rounds
    .venv/bin/python bench/recovery_bench.py --quick         # 10M, 3 rounds (~70 s)
    .venv/bin/python bench/recovery_bench.py --sizes 1M --rounds 5 --shadows 1,2

Memory: the clusters of every shadow count stay up for the whole size (the rounds interleave),
and a restore holds several copies of the state while it fetches and assembles it; the peak
resident size was 33x to 37x the model + optimizer state (4.2 to 4.7 GiB for the 126 MB of
10M), so 100M (1.26 GB of state) is left out of the defaults: ``--sizes 100M`` needs ~50 GB.

Results: ``bench/results/recovery_bench.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common
from _common import SIZES  # model size -> (width, depth) of the MLP (as trainer_bench.py)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_OUT = ROOT / "bench" / "results" / "recovery_bench.json"
BASELINE = "dcp_load"
BATCH = 16
LR = 1e-3

State = tuple[dict[str, Any], dict[str, dict[str, Any]]]


def _now() -> float:
    return time.perf_counter()


# --------------------------------------------------------------------------- model and state


def build(size: str, seed: int) -> tuple[Any, Any]:
    """A new model (initialised from ``seed``) and a new AdamW on it."""
    import torch

    model = _common.mlp(size, seed)
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def batch(size: str, it: int) -> Any:
    import torch

    return torch.randn(BATCH, SIZES[size][0], generator=torch.Generator().manual_seed(it))


def snapshot(model: Any, opt: Any) -> State:
    """Copies of every parameter and every optimizer state tensor, by parameter name."""
    from shadowgrad.optspec import state_by_name

    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    ostate = {
        n: {k: v.detach().clone() for k, v in st.items()}
        for n, st in state_by_name(opt, model.named_parameters()).items()
    }
    return params, ostate


def check_equal(what: str, model: Any, opt: Any, ref: State) -> int:
    """Fail loudly unless model and optimizer hold exactly ``ref``; returns tensors compared."""
    import torch

    params, ostate = snapshot(model, opt)
    rparams, rstate = ref
    if set(params) != set(rparams) or set(ostate) != set(rstate):
        raise AssertionError(f"{what}: restored names differ from the reference")
    n = 0
    for name, t in rparams.items():
        if t.dtype != params[name].dtype or not torch.equal(t, params[name]):
            raise AssertionError(f"{what}: parameter {name} differs after the restore")
        n += 1
    for name, st in rstate.items():
        if set(st) != set(ostate[name]):
            raise AssertionError(
                f"{what}: optimizer state keys of {name} differ: "
                f"{sorted(ostate[name])} vs {sorted(st)}"
            )
        for k, t in st.items():
            got = ostate[name][k]
            if t.dtype != got.dtype or not torch.equal(t, got):
                raise AssertionError(
                    f"{what}: optimizer state {name}.{k} differs after the restore"
                )
            n += 1
    return n


def plain_step(model: Any, opt: Any, size: str, it: int) -> None:
    model(batch(size, it)).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def sg_step(model: Any, sg: Any, size: str, it: int) -> None:
    sg.backward(model(batch(size, it)).square().mean())
    sg.step()


# --------------------------------------------------------------------------- the variants


class Timer:
    """Named phase durations (ms) of one recovery."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = _now()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + 1000 * (_now() - t0)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*a: Any, **kw: Any) -> Any:
            with self.phase(name):
                return fn(*a, **kw)

        return timed


class ShadowVariant:
    """Restores from ``shadows`` shadow nodes; each round's session is the next one's source."""

    def __init__(self, size: str, shadows: int, first_iters: int) -> None:
        from shadowgrad.config import parse_spec
        from shadowgrad.shadow.testing import shadow_cluster
        from shadowgrad.trainer_hooks import attach
        from shadowgrad.trainer_hooks._testing import TOKEN, loopback_spec

        self.name, self.shadows, self.size = "shadowgrad", shadows, size
        self.doc = loopback_spec(world=1, shadows=shadows, replication=1)
        self.spec = parse_spec(self.doc, env={})
        self._stack = contextlib.ExitStack()
        self.cluster = self._stack.enter_context(shadow_cluster(self.spec))
        try:
            self.attach = functools.partial(attach, spec=self.spec, token=TOKEN)
            model, opt = build(size, seed=0)
            t0 = _now()
            with self.attach(model, opt) as sg:
                start = sg.restore_or_start()
                if start.restored:
                    raise AssertionError("a new cluster already held state")
                for it in range(first_iters):
                    sg_step(model, sg, size, it)
                sg.flush(30)
            self.first_session_s = _now() - t0
            self.iteration = first_iters  # the next iteration to run
            if not self.cluster.wait_applied(first_iters - 1, timeout_s=60):
                raise AssertionError(
                    f"{shadows} shadows: iteration {first_iters - 1} not "
                    f"applied: {self.cluster.status()}"
                )
            self.ref = snapshot(model, opt)
        except BaseException:
            self._stack.close()
            raise

    def label(self) -> str:
        return f"shadowgrad/{self.shadows}"

    def recover(self, seed: int) -> dict[str, Any]:
        tm = Timer()
        t0 = _now()
        with tm.phase("build"):
            model, opt = build(self.size, seed)
        with tm.phase("attach"):
            sg = self.attach(model, opt)
        try:
            sg._survey = tm.wrap("survey", sg._survey)
            sg._restore = tm.wrap("fetch_load", sg._restore)
            sg._load_shadows = tm.wrap("reseed", sg._load_shadows)
            start = sg.restore_or_start()
            restore_ms = 1000 * (_now() - t0)
            tm.phases["other"] = restore_ms - sum(tm.phases.values())
            if (start.iteration, start.restored) != (self.iteration, True):
                raise AssertionError(
                    f"{self.label()}: restored {start}, expected iteration {self.iteration}"
                )
            tensors = check_equal(self.label(), model, opt, self.ref)
            t1 = _now()
            sg_step(model, sg, self.size, self.iteration)
            first_ms = 1000 * (_now() - t1)
        finally:
            t2 = _now()
            sg.close()
            close_ms = 1000 * (_now() - t2)
        if not self.cluster.wait_applied(self.iteration, timeout_s=30):
            raise AssertionError(
                f"{self.label()}: iteration {self.iteration} not applied after "
                f"the close: {self.cluster.status()}"
            )
        self.iteration += 1
        self.ref = snapshot(model, opt)
        return {
            "restore_ms": restore_ms,
            "first_iter_ms": first_ms,
            "phases_ms": tm.phases,
            "close_ms": close_ms,
            "tensors_checked": tensors,
        }

    def close(self) -> None:
        self._stack.close()


class FileVariant:
    """Loads the state saved once in ``ckdir`` by DCP (``dcp_load``) or torch.save
    (``torch_load``)."""

    def __init__(self, name: str, size: str, path: Path, ref: State) -> None:
        self.name, self.size, self.path, self.ref = name, size, path, ref
        self.shadows = None
        self.iteration = -1  # set by the caller: the iteration after the saved state

    def label(self) -> str:
        return self.name

    def recover(self, seed: int) -> dict[str, Any]:
        import torch

        tm = Timer()
        t0 = _now()
        with tm.phase("build"):
            model, opt = build(self.size, seed)
        if self.name == "dcp_load":
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

            with warnings.catch_warnings():
                # "torch.distributed is ... uninitialized, assuming ... a single process"
                warnings.simplefilter("ignore", UserWarning)
                with tm.phase("get_state_dict"):
                    msd, osd = get_state_dict(model, opt)
                with tm.phase("read"):
                    dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(self.path))
            with tm.phase("load_state_dict"):
                set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
        else:
            with tm.phase("read"):
                sd = torch.load(self.path, weights_only=True)
            with tm.phase("load_state_dict"):
                model.load_state_dict(sd["model"])
                opt.load_state_dict(sd["optim"])
        restore_ms = 1000 * (_now() - t0)
        tm.phases["other"] = restore_ms - sum(tm.phases.values())
        tensors = check_equal(self.name, model, opt, self.ref)
        t1 = _now()
        plain_step(model, opt, self.size, self.iteration)
        first_ms = 1000 * (_now() - t1)
        return {
            "restore_ms": restore_ms,
            "first_iter_ms": first_ms,
            "phases_ms": tm.phases,
            "tensors_checked": tensors,
        }

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- one size


def _stats(xs: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "rounds": xs}


def _dir_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_size(
    size: str, shadow_counts: list[int], *, rounds: int, warmup: int, first_iters: int, ckroot: Path
) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    t_size = time.monotonic()
    # the baselines' state: the same first iterations without shadowgrad (the shadowgrad
    # variants' first sessions compute the same state: sg.step is opt.step here)
    model, opt = build(size, seed=0)
    for it in range(first_iters):
        plain_step(model, opt, size, it)
    ref = snapshot(model, opt)
    nparams = sum(p.numel() for p in model.parameters())
    state_bytes = sum(t.numel() * t.element_size() for t in ref[0].values()) + sum(
        t.numel() * t.element_size() for st in ref[1].values() for t in st.values()
    )
    ckdir = ckroot / f"{size}-dcp"
    ckfile = ckroot / f"{size}.pt"
    t0 = _now()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(ckdir))
    dcp_save_ms = 1000 * (_now() - t0)
    t0 = _now()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, ckfile)
    torch_save_ms = 1000 * (_now() - t0)
    del model, opt, msd, osd

    variants: list[Any] = []
    try:
        for n in shadow_counts:
            v = ShadowVariant(size, n, first_iters)
            variants.append(v)
            # the same first iterations give the same state with and without shadowgrad
            check_equal(
                f"{v.label()} first session vs plain training", *_as_model(v.ref, size), ref
            )
        for name, path in (("dcp_load", ckdir), ("torch_load", ckfile)):
            fv = FileVariant(name, size, path, ref)
            fv.iteration = first_iters
            variants.append(fv)
        per: dict[str, list[dict[str, Any]]] = {v.label(): [] for v in variants}
        for r in range(warmup + rounds):
            k = r % len(variants)
            for v in variants[k:] + variants[:k]:
                res = v.recover(seed=1000 + r)
                if r >= warmup:
                    per[v.label()].append(res)
            print(
                f"{size} round {r + 1 - warmup if r >= warmup else 'warm-up'}: "
                + ", ".join(
                    f"{v.label()} {per[v.label()][-1]['restore_ms']:.0f} ms"
                    if r >= warmup
                    else v.label()
                    for v in variants
                ),
                flush=True,
            )
        first_s = {v.label(): v.first_session_s for v in variants if isinstance(v, ShadowVariant)}
    finally:
        for v in variants:
            v.close()
    base = per[BASELINE]
    rows = []
    for v in variants:
        rs = per[v.label()]
        restore = [x["restore_ms"] for x in rs]
        first = [x["first_iter_ms"] for x in rs]
        both = [a + b for a, b in zip(restore, first, strict=True)]
        phases = {
            p: statistics.median(x["phases_ms"].get(p, 0.0) for x in rs) for p in rs[0]["phases_ms"]
        }
        paired = [a["restore_ms"] / b["restore_ms"] for a, b in zip(rs, base, strict=True)]
        paired_both = [
            (a["restore_ms"] + a["first_iter_ms"]) / (b["restore_ms"] + b["first_iter_ms"])
            for a, b in zip(rs, base, strict=True)
        ]
        row: dict[str, Any] = {
            "variant": v.name,
            "shadows": v.shadows,
            "restore_ms": _stats(restore),
            "first_iter_ms": _stats(first),
            "restore_plus_first_ms": _stats(both),
            "phases_ms_median": phases,
            "ratio_to_dcp_load": {
                "restore": statistics.median(restore)
                / statistics.median(x["restore_ms"] for x in base),
                "restore_plus_first": statistics.median(both)
                / statistics.median(x["restore_ms"] + x["first_iter_ms"] for x in base),
                "paired_restore": {
                    "median": statistics.median(paired),
                    "min": min(paired),
                    "max": max(paired),
                },
                "paired_restore_plus_first": {
                    "median": statistics.median(paired_both),
                    "min": min(paired_both),
                    "max": max(paired_both),
                },
            },
            "verified": all(x["tensors_checked"] > 0 for x in rs),
            "tensors_checked": rs[0]["tensors_checked"],
        }
        if isinstance(v, ShadowVariant):
            row["close_ms_median"] = statistics.median(x["close_ms"] for x in rs)
            row["first_session_s"] = first_s[v.label()]
        rows.append(row)
    return {
        "size": size,
        "params": nparams,
        "state_bytes": state_bytes,
        "dcp_bytes": _dir_bytes(ckdir),
        "torch_save_bytes": _dir_bytes(ckfile),
        "dcp_save_ms": dcp_save_ms,
        "torch_save_ms": torch_save_ms,
        "rounds": rounds,
        "warmup": warmup,
        "variants": rows,
        "wall_s": time.monotonic() - t_size,
    }


def _as_model(ref: State, size: str) -> tuple[Any, Any]:
    """A model + AdamW holding ``ref`` (to compare two references with check_equal)."""
    import torch

    model, opt = build(size, seed=0)
    named = dict(model.named_parameters())
    with torch.no_grad():
        for n, t in ref[0].items():
            named[n].copy_(t)
    for n, st in ref[1].items():
        opt.state[named[n]] = {k: v.clone() for k, v in st.items()}
    return model, opt


# --------------------------------------------------------------------------- main


def _maxrss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fs_type(path: Path) -> str | None:
    """The file system type of the mount holding ``path`` (from /proc/mounts)."""
    best, kind = "", None
    with contextlib.suppress(OSError):
        real = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if (
                len(parts) > 2
                and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/"))
                and len(parts[1]) >= len(best)
            ):
                best, kind = parts[1], parts[2]
    return kind


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10M only, 3 rounds, 2 first iterations")
    ap.add_argument(
        "--sizes",
        default="",
        help="comma list of " + ",".join(SIZES) + " (default 1M,10M; 10M with --quick)",
    )
    ap.add_argument("--shadows", default="1,2,4", help="comma list of shadow counts")
    ap.add_argument("--rounds", type=int, default=0, help="timed rounds (default 5; 3 --quick)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    ap.add_argument(
        "--first-iters",
        type=int,
        default=0,
        help="iterations of the first session, whose state is restored (default 3; 2 with --quick)",
    )
    ap.add_argument(
        "--tmp",
        type=Path,
        default=None,
        help="where the checkpoint files go (default: the system's temp dir)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    sizes = (args.sizes or ("10M" if args.quick else "1M,10M")).split(",")
    rounds = args.rounds or (3 if args.quick else 5)
    args.first_iters = args.first_iters or (2 if args.quick else 3)
    counts = [int(s) for s in args.shadows.split(",")]
    import torch

    from shadowgrad.trainer_hooks._testing import loopback_spec

    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    ckroot = Path(tempfile.mkdtemp(prefix="sg-recovery-bench-", dir=args.tmp))
    doc: dict[str, Any] = {
        "bench": "recovery_bench",
        "command": "python bench/recovery_bench.py" + (" --quick" if args.quick else ""),
        "time": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            **_common.machine(torch_threads=torch.get_num_threads()),
            "nice": os.nice(0),
        },
        "baseline": BASELINE,
        "quick": args.quick,
        "rounds": rounds,
        "warmup": args.warmup,
        "first_iters": args.first_iters,
        "batch": BATCH,
        "optimizer": f"AdamW(lr={LR})",
        "shadow_counts": counts,
        "replication": 1,
        "timeouts": {
            k: v
            for k, v in loopback_spec(world=1, shadows=1)["timeouts"].items()
            if k in ("gap_repair", "rpc", "heartbeat")
        },
        "checkpoint_fs": _fs_type(ckroot),
        "page_cache": "not dropped",
        "method": "per round every variant recovers once, order rotating; restore = new model + "
        "optimizer until the state is in place; first iteration = one forward, "
        "backward and step after it; median, min, max over the rounds after "
        f"{args.warmup} warm-up round(s); every restore checked with torch.equal",
        "sizes": [],
    }
    try:
        for size in sizes:
            r = bench_size(
                size,
                counts,
                rounds=rounds,
                warmup=args.warmup,
                first_iters=args.first_iters,
                ckroot=ckroot,
            )
            doc["sizes"].append(r)
            print(
                f"{size} ({r['params'] / 1e6:.1f}M params, {r['state_bytes'] / 2**20:.0f} MiB "
                f"of state), median of {rounds} rounds:"
            )
            print(
                f"  {'variant':<14} {'shadows':>7} {'restore ms':>10} {'min':>8} {'max':>8} "
                f"{'x dcp':>7} {'+1st it ms':>10} {'x dcp':>7}"
            )
            for v in r["variants"]:
                re, rb, q = v["restore_ms"], v["restore_plus_first_ms"], v["ratio_to_dcp_load"]
                print(
                    f"  {v['variant']:<14} {v['shadows'] or '-':>7} {re['median']:>10.0f} "
                    f"{re['min']:>8.0f} {re['max']:>8.0f} {q['restore']:>7.2f} "
                    f"{rb['median']:>10.0f} {q['restore_plus_first']:>7.2f}",
                    flush=True,
                )
    finally:
        shutil.rmtree(ckroot, ignore_errors=True)
    doc["wall_s"] = time.monotonic() - t0
    doc["machine"]["loadavg_at_end"] = list(os.getloadavg())
    doc["max_rss_MiB"] = _maxrss_mib()
    _common.write_json(args.out, doc)
    print(f"wrote {args.out} ({doc['wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
