"""``shadowgrad plan``: periodic checkpoints at their Young-Daly optimum against per-iteration
shadow checkpoints (shadowgrad), on the effective-training-time ledger of
:mod:`shadowgrad.planner`.

    shadowgrad plan --mtbf 3.09h --total 1296h --interval 1h --cost 3m
    shadowgrad plan --mtbf 3.09h --total 1296h --cost 45s --iteration 1.2s --stall 0
"""

from __future__ import annotations

import argparse
import json

from shadowgrad._cli import flag
from shadowgrad.errors import ConfigError


def _hours(text: str, option: str) -> float:
    """A duration with its unit (``3.09h``, ``45s``; ``0`` allowed) in hours."""
    from shadowgrad.config import parse_duration

    if text.strip().rstrip("smhu") in ("0", "0.0"):
        return 0.0
    return parse_duration(text, option) / 3600.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mtbf",
        required=True,
        help="mean time between failures of the job, "
        "e.g. 3.09h (Llama 3: 54 days / 419 unexpected interruptions)",
    )
    p.add_argument("--total", default="1296h", help="length of the run (default 1296h)")
    p.add_argument(
        "--cost", required=True, help="training stall of one periodic checkpoint, e.g. 3m or 45s"
    )
    p.add_argument(
        "--interval", default=None, help="the periodic policy's interval (default: Young's optimum)"
    )
    p.add_argument("--recovery", default="0s", help="restart + reload time per failure")
    p.add_argument(
        "--iteration",
        default=None,
        help="this job's iteration time, e.g. 1.2s: adds the shadowgrad row",
    )
    p.add_argument(
        "--stall",
        default="0s",
        help="shadowgrad's per-iteration trainer overhead (measured; default 0)",
    )
    flag(p, "--json", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from shadowgrad.planner import daly_interval, ledger, young_interval

    try:
        mtbf, total = _hours(args.mtbf, "--mtbf"), _hours(args.total, "--total")
        cost, recovery = _hours(args.cost, "--cost"), _hours(args.recovery, "--recovery")
        young = young_interval(cost, mtbf) if cost > 0 else None
        daly = daly_interval(cost, mtbf) if cost > 0 else None
        interval = _hours(args.interval, "--interval") if args.interval else young
        if interval is None:
            raise ConfigError("--interval", args.interval, "give it when --cost is 0")
        rows = [
            (
                "periodic",
                ledger(total=total, mtbf=mtbf, interval=interval, cost=cost, recovery=recovery),
            )
        ]
        if daly is not None and args.interval is None:
            rows.append(
                (
                    "periodic (Daly)",
                    ledger(total=total, mtbf=mtbf, interval=daly, cost=cost, recovery=recovery),
                )
            )
        if args.iteration:
            it = _hours(args.iteration, "--iteration")
            rows.append(
                (
                    "shadowgrad (every iteration)",
                    ledger(
                        total=total,
                        mtbf=mtbf,
                        interval=it,
                        cost=_hours(args.stall, "--stall"),
                        recovery=recovery,
                    ),
                )
            )
    except ConfigError:
        raise
    except ValueError as e:  # the planner's own checks (a zero MTBF, ...)
        raise ConfigError("plan", vars(args).get("mtbf"), str(e)) from None
    if args.json:
        print(
            json.dumps(
                {
                    "young_interval_h": young,
                    "daly_interval_h": daly,
                    "rows": [
                        {"policy": n, **vars(r), "useful_percent": r.useful_percent}
                        for n, r in rows
                    ],
                }
            )
        )
        return 0
    if young is not None and daly is not None:
        print(f"optimal interval: Young {young:.4f} h, Daly {daly:.4f} h")
    print(
        f"{'policy':<30} {'interval h':>10} {'failures':>9} {'lost/fail h':>11} "
        f"{'lost h':>9} {'ckpt cost h':>11} {'useful':>8}"
    )
    for name, r in rows:
        print(
            f"{name:<30} {r.interval:>10.4f} {r.failures:>9.2f} {r.lost_per_failure:>11.4f} "
            f"{r.lost:>9.2f} {r.overhead:>11.2f} {r.useful_percent:>7.2f}%"
        )
    return 0
