"""Work lost per failure and recovery time, measured end to end: the emulated demo's faults.

Runs ``shadowgrad demo SCENARIO`` (switch, shadows, controller and trainer ranks, faults
injected: a trainer SIGKILLed, a shadow SIGKILLed or paused) ``--runs`` times per scenario and
keeps, for every fault, what its report measured (``report.json``, see docs/testbed.md):

* ``lost_iterations`` -- iterations the job had completed but ran again after the restore (the
  work lost, besides the interrupted iteration itself); its bound is one for a trainer fault
  and zero for a shadow fault
* ``detect_s``        -- fault injected -> the controller declared it
* ``recover_s``       -- fault injected -> the first new iteration after the restore (a trainer
  fault) or the shadow back at the trainers' iteration (a shadow fault)
* the run's median step time, so lost iterations convert into seconds

plus whether the resumed run was bit-identical to an uninterrupted reference (the demo checks
the parameters and every logged loss). The reference run is cached across the runs of one
bench invocation. Timings are printed, never asserted; bench/harness.py sets them against DCP
at its Young-Daly interval on docs/benchmarks.md.

    .venv/bin/python bench/lostwork_bench.py --runs 3
    .venv/bin/python bench/lostwork_bench.py --scenarios default,mirror --runs 1

Writes ``bench/results/lostwork_bench.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common

ROOT = Path(__file__).resolve().parents[1]


def _stats(xs: list[float]) -> dict[str, float] | None:
    return (
        None
        if not xs
        else {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}
    )


def run_demo(scenario: str, out: Path, cache: Path, timeout_s: float) -> dict[str, Any]:
    """One demo run; its report.json's summary (raises with the output tail if it failed)."""
    exe = Path(sys.executable).with_name("shadowgrad")
    cmd = [
        str(exe) if exe.exists() else "shadowgrad",
        "demo",
        scenario,
        "--out",
        str(out),
        "--cache",
        str(cache),
        "--no-progress",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - t0
    report = out / "report.json"
    if not report.exists():
        raise RuntimeError(
            f"{' '.join(cmd)}: exit {proc.returncode}, no report.json\n"
            f"{(proc.stdout + proc.stderr)[-3000:]}"
        )
    summary: dict[str, Any] = json.loads(report.read_text())["summary"]
    summary["exit_code"] = proc.returncode
    summary["bench_wall_s"] = wall
    return summary


def collect(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per fault kind: lost iterations / seconds, detection and recovery times, over all runs."""
    kinds: dict[str, dict[str, list[float]]] = {}
    for s in summaries:
        step = (s.get("trainer_overhead") or {}).get("run_median_step_s")
        for f in s.get("faults") or []:
            k = kinds.setdefault(
                str(f.get("kind")),
                {
                    "lost_iterations": [],
                    "lost_s": [],
                    "detect_s": [],
                    "recover_s": [],
                    "detect_to_resume_s": [],
                },
            )
            lost = f.get("lost_iterations")
            if isinstance(lost, int):
                k["lost_iterations"].append(lost)
                if isinstance(step, int | float):
                    k["lost_s"].append(lost * step)
            for key in ("detect_s", "recover_s"):
                if isinstance(f.get(key), int | float):
                    k[key].append(f[key])
            if isinstance(f.get("detect_s"), int | float) and isinstance(
                f.get("recover_s"), int | float
            ):
                k["detect_to_resume_s"].append(f["recover_s"] - f["detect_s"])
    return {
        kind: {
            "faults": len(v["detect_s"]) or len(v["lost_iterations"]),
            "max_lost_iterations": max(v["lost_iterations"], default=None),
            **{key: _stats(xs) for key, xs in v.items()},
        }
        for kind, v in kinds.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="default", help="comma list of scenarios/ names")
    ap.add_argument("--runs", type=int, default=3, help="demo runs per scenario")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per demo run")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lostwork_bench.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sg-lostwork-"))
    doc: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "runs": args.runs,
        "as_root": os.geteuid() == 0,
        "scenarios": [],
    }
    try:
        for name in args.scenarios.split(","):
            summaries = []
            for i in range(args.runs):
                s = run_demo(name, tmp / f"{name}-{i}", tmp / "cache", args.timeout)
                summaries.append(s)
                faults = ", ".join(
                    f"{f.get('kind')}: lost {f.get('lost_iterations')}, detect "
                    f"{f.get('detect_s') or 0:.2f} s, recover {f.get('recover_s') or 0:.2f} s"
                    for f in s.get("faults") or []
                )
                print(
                    f"{name} run {i + 1}/{args.runs}: ok={s.get('ok')} topology "
                    f"{s.get('topology')} {faults}",
                    flush=True,
                )
            doc["scenarios"].append(
                {
                    "scenario": name,
                    "mode": summaries[0].get("mode"),
                    "topology": summaries[0].get("topology"),
                    "trainers": (summaries[0].get("scenario") or {}).get("trainers"),
                    "shadows": (summaries[0].get("scenario") or {}).get("shadows"),
                    "ok": all(s.get("ok") for s in summaries),
                    "bit_exact": all(s.get("bit_exact_resume") for s in summaries),
                    "problems": [p for s in summaries for p in s.get("problems") or []],
                    "step_s": _stats(
                        [
                            s["trainer_overhead"]["run_median_step_s"]
                            for s in summaries
                            if isinstance(
                                (s.get("trainer_overhead") or {}).get("run_median_step_s"),
                                int | float,
                            )
                        ]
                    ),
                    "by_kind": collect(summaries),
                    # the first run's whole summary: README's sample output is rendered from it
                    "sample_summary": summaries[0],
                    "faults": [
                        {
                            k: f.get(k)
                            for k in (
                                "kind",
                                "at_iteration",
                                "lost_iterations",
                                "detect_s",
                                "recover_s",
                                "within_bound",
                            )
                        }
                        for s in summaries
                        for f in s.get("faults") or []
                    ],
                }
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _common.write_json(Path(args.out), doc)
    print(f"wrote {args.out}")
    return 0 if all(s["ok"] for s in doc["scenarios"]) else 1


if __name__ == "__main__":
    sys.exit(main())
