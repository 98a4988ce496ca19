"""What several bench scripts share: the MLP sizes, shadow AdamW hyperparameters, machine
facts, the order of rounds that compare variants and their medians, the atomic JSON result
write, and launching the ranks of a worker, gathering what each
rank measured and writing and reading their ``RESULT`` line.

bench/ is not a package: a script imports this as ``_common`` after putting its own folder on
``sys.path`` (already there when it runs as ``python bench/<name>.py``; not when a test loads it
from its path).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")

#: model size -> (width, depth) of an MLP of depth x (Linear(width, width), ReLU)
SIZES = {"1M": (512, 4), "10M": (1024, 10), "100M": (2048, 24)}

#: torch AdamW hyperparameters (besides lr, foreach and fused) a bench's shadows replay with
ADAMW_HYPER: dict[str, Any] = {
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.01,
    "amsgrad": False,
    "maximize": False,
    "capturable": False,
    "differentiable": False,
    "decoupled_weight_decay": True,
}

#: shadow_bench's apply items, in the order its output and the page list them
APPLY_ITEMS = (
    "fused_adamw",
    "fused_adamw_box_tensors",
    "replayer_fused_adamw",
    "replayer_fused_adamw_scaler_clip",
    "replayer_forloop_adamw",
)


def mlp(size: str, seed: int = 0) -> Any:
    """A new MLP of ``SIZES[size]``, initialised from ``seed``."""
    import torch
    from torch import nn

    width, depth = SIZES[size]
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def version(pkg: str) -> str | None:
    """The installed version of distribution ``pkg``; None when it is not installed."""
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine(**extra: Any) -> dict[str, Any]:
    """Cores, Python, torch's version (then ``extra``), platform and load at the start."""
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": version("torch"),
        **extra,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "loadavg_at_start": list(os.getloadavg()),
    }


def rotation(items: Sequence[T], r: int) -> list[T]:
    """The order of round ``r`` when every item runs once per round: ``items`` rotated left by
    ``r``, so that no item is always first or last (when the machine is freshest or most
    loaded) and load from other processes hits every item alike. Every bench that compares
    variants in rounds takes its order from here."""
    k = r % len(items) if items else 0
    return [*items[k:], *items[:k]]


def interleaved(
    variants: Sequence[str], rounds: int, run: Callable[[str, int], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` rounds of ``run(variant, round)`` for every variant, in :func:`rotation`'s
    order; each result gets its ``round``, and each variant's results are in round order.
    Before each run, what the previous one left in reference cycles is collected (not
    timed): :func:`collect`."""
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in rotation(variants, r):
            collect()
            res = run(v, r)
            res["round"] = r
            runs[v].append(res)
    return runs


def collect() -> None:
    """Collect the reference cycles earlier work left, before a measurement starts, so that
    they are not freed during it: the cyclic collector runs whenever allocations set it off, on
    whichever thread, with the GIL held (one pass took 0.42 s in shadow_bench). Found with a
    stopped shadow node, which was such a cycle with its buffers (about 1 GB at 100M) until
    ``ShadowNode.stop`` made its parts refer back to it weakly: in two of three full
    shadow_bench runs the first AdamW step of the 100M stream, the part after the SGD one, took
    2.0-2.4 s instead of 0.3 s and the stream lost iterations to repair; collected first, it
    took 0.29-0.32 s and kept up (2 of 2). Other cycles remain (torch's first lazy imports keep
    their callers' frames until a collection)."""
    gc.collect()


def median(xs: Iterable[float]) -> float:
    """The median of ``xs``; NaN when there is none (a variant that never produced a figure)."""
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def paired_median(runs: dict[str, list[dict[str, Any]]], a: str, b: str, key: str) -> float:
    """The median over the rounds of ``a``'s ``key`` over ``b``'s in the same round (NaN if
    there is none): a ratio of two passes that ran seconds apart, not hours."""
    return median(x[key] / y[key] for x, y in zip(runs[a], runs[b], strict=True) if y[key])


#: a sample of :func:`cpu_speed` counts as slow at this multiple of the fastest sample of any CPU
SLOW_AT = 1.2


def _loop_ms(n: int) -> float:
    """Milliseconds of this thread's CPU time for a fixed Python loop (no memory traffic)."""
    t0 = time.thread_time()
    x = 0
    for i in range(n):
        x += i * i
    return (time.thread_time() - t0) * 1e3


def cpu_speed(seconds: float = 5.0, n: int = 200_000) -> dict[str, Any]:
    """How steady a CPU second is on this machine: the same fixed loop (``n`` iterations,
    :func:`_loop_ms`) timed again and again for ``seconds`` on each CPU this process may use,
    one CPU at a time, this process pinned to it (its affinity restored afterwards). Per CPU:
    the samples in the order taken (ms), the fastest, median and slowest, the fraction at
    least :data:`SLOW_AT` times the fastest sample of any CPU, and how often consecutive
    samples changed between the two. On a quiet host every sample is about the same; a VM
    whose CPUs share their host cores with other work shows two speeds. Run it when nothing
    else of the caller's runs."""
    mine = os.sched_getaffinity(0)
    taken: dict[int, list[float]] = {}
    try:
        for cpu in sorted(mine):
            os.sched_setaffinity(0, {cpu})
            _loop_ms(n // 10)  # warm
            ms: list[float] = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                ms.append(_loop_ms(n))
            taken[cpu] = ms
    finally:
        os.sched_setaffinity(0, mine)
    fastest = min(min(ms) for ms in taken.values())
    per: dict[str, Any] = {}
    for cpu, ms in taken.items():
        slow = [x >= SLOW_AT * fastest for x in ms]  # in the order taken
        srt = sorted(ms)
        per[str(cpu)] = {
            "samples": len(ms),
            "min_ms": round(srt[0], 3),
            "median_ms": round(srt[len(srt) // 2], 3),
            "max_ms": round(srt[-1], 3),
            "slow_fraction": round(sum(slow) / len(ms), 3),
            "changes": sum(a != b for a, b in itertools.pairwise(slow)),
            "ms": [round(x, 2) for x in ms],
        }
    return {
        "loop_iterations": n,
        "seconds_per_cpu": seconds,
        "slow_at": SLOW_AT,
        "fastest_ms": round(fastest, 3),
        "cpus": per,
    }


def atomic_write(path: Path, text: str) -> None:
    """``text`` to ``path`` (folders created) through a temporary file beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_json(
    path: Path,
    doc: Any,
    *,
    indent: int = 1,
    sort_keys: bool = False,
    default: Callable[[Any], Any] | None = None,
) -> None:
    """``doc`` as JSON with a final newline, written atomically (:func:`atomic_write`);
    ``default`` as ``json.dumps``' (what to write for what JSON has no type for)."""
    text = json.dumps(doc, indent=indent, sort_keys=sort_keys, default=default)
    atomic_write(path, text + "\n")


def parse_bench_args(
    ap: argparse.ArgumentParser, worker: Callable[[argparse.Namespace], None]
) -> argparse.Namespace:
    """``ap``'s arguments in a bench whose ranks :func:`start_ranks` launches. In such a rank
    (the hidden ``--worker``, declared here) ``worker(args)`` runs and the rank leaves at once,
    exit status 0 (an exception from it exits as Python does); in the bench itself, the
    arguments, with ``SHADOWGRAD_TOKEN`` defaulting to the token the ranks get (what the
    bench's own shadows and switch use)."""
    from shadowgrad.testing.specs import TOKEN

    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        # a DDP module still holds the gloo process group; its worker threads were torn down
        # at interpreter exit, after Python, and that aborted a rank now and then ("terminate
        # called without an active exception", exit -6, plain DDP included: 1 of 8 runs of
        # trainer_bench --variants none): leave at once, the results printed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.environ.setdefault("SHADOWGRAD_TOKEN", TOKEN)
    return args


def start_ranks(
    script: str, args: Any, *, cpus: Sequence[int] | None = None, **options: object
) -> Any:
    """``args.world`` ranks (``shadowgrad.testing.processes.Ranks``, in the repository root, with
    the test token) of ``python script --worker`` with ``--iters``, ``--warmup`` and
    ``--batch`` from ``args`` and ``options`` (``close_timeout=3`` -> ``--close-timeout 3``).
    ``cpus``: the ranks run on those CPUs only (``taskset -c``; no ``preexec_fn``, which is
    unsafe in a process with threads)."""
    from shadowgrad.testing.processes import Ranks
    from shadowgrad.testing.specs import TOKEN

    argv = [sys.executable, script, "--worker"]
    if cpus is not None:
        argv = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *argv]
    options = {"iters": args.iters, "warmup": args.warmup, "batch": args.batch, **options}
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return Ranks(argv, args.world, {"SHADOWGRAD_TOKEN": TOKEN}, str(ROOT))


def all_ranks(obj: Any) -> list[Any]:
    """``obj`` of every rank of the default process group, by rank (``all_gather_object``: a
    collective, every rank calls it)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def by_rank(mine: dict[str, Any]) -> dict[str, list[Any]]:
    """``{key: [every rank's value, by rank]}`` of each rank's ``mine`` (the same keys on every
    rank, in ``mine``'s order; a collective, :func:`all_ranks`)."""
    ranks = all_ranks(mine)
    return {k: [r[k] for r in ranks] for k in mine}


def print_result(doc: dict[str, Any], **dumps: Any) -> None:
    """``doc`` as a worker's ``RESULT {...}`` line (``json.dumps`` with ``dumps``), the line
    :func:`rank_result` reads."""
    print("RESULT " + json.dumps(doc, **dumps), flush=True)


def rank_result(out: str) -> dict[str, Any]:
    """The JSON of the ``RESULT {...}`` line in a rank's output."""
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    res: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return res


def _task_stats() -> Iterator[tuple[int, str, list[str]]]:
    """``(tid, name, fields)`` of every live thread of this process: its name is the Python
    thread's ``threading`` name (by ``native_id``), else the OS thread name (gloo's, ZeroMQ's,
    PyTorch's); ``fields`` are ``/proc/self/task/TID/stat``'s after the name (field 3 first)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as f:
                head, _, rest = f.read().rpartition(")")
        except OSError:  # a thread that just ended
            continue
        yield int(tid), names.get(int(tid)) or head.partition("(")[2] or tid, rest.split()


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of every live thread of this process by name
    (:func:`_task_stats`); threads of one name are summed. Two snapshots' difference says where
    a process's CPU went (``bench/trainer_bench.py``)."""
    import threading

    # a Python thread's own CPU clock (nanoseconds); /proc's ticks (10 ms) for the others
    exact: dict[int, float] = {}
    for t in threading.enumerate():
        if t.native_id is not None and t.ident is not None:
            # OSError: a thread that just ended; AttributeError: not Linux
            with contextlib.suppress(OSError, AttributeError):
                exact[t.native_id] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid, name, fields in _task_stats():
        cpu = exact[tid] if tid in exact else (int(fields[11]) + int(fields[12])) / tick
        out[name] = out.get(name, 0.0) + cpu
    return out


def thread_faults() -> dict[str, float]:
    """Minor page faults (pages the kernel had to supply: fresh, zeroed) of every live thread of
    this process so far, by name as in :func:`thread_cpu_s`."""
    out: dict[str, float] = {}
    for _tid, name, fields in _task_stats():
        out[name] = out.get(name, 0.0) + int(fields[7])  # field 10: minflt
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float], per: int) -> dict[str, float]:
    """``(after - before) / per`` by thread name, the largest first (threads gone by ``after``
    are left out; a thread started between the two counts from zero)."""
    d = {k: (v - before.get(k, 0.0)) / per for k, v in after.items()}
    return dict(sorted(d.items(), key=lambda kv: -kv[1]))
