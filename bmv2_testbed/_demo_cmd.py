"""``shadowgrad demo [SCENARIO]``: run an emulated shadowgrad job end to end — switch, shadows,
controller, trainers on one machine — inject the scenario's faults, and report (docs/testbed.md).

``SCENARIO`` is a TOML file or the name of one in ``scenarios/`` (default: ``default``). The
topology is the best the machine allows unless ``--topology`` says otherwise: network
namespaces + veths as root (``netns``), else the switch's loopback UDP ports (``loopback``, any
user); ``mininet`` (root) builds the netns topology's hosts as Mininet hosts behind a Mininet
``P4RuntimeSwitch``, and ``--cli`` opens Mininet's CLI on the running job; ``userns`` runs the
loopback topology inside a fresh user + network namespace (``unshare -Urn``), isolated from the
host's network, for an ordinary user. ``--out`` is cleared of a previous run's artefacts first
(the cache is kept); a non-empty folder that is not
a demo's output is refused, and nothing is deleted. Exit status 0 when the report says ok
(bit-exact resume, losses equal to the reference, at most one iteration lost per trainer fault
and none per shadow fault, a report that does not contradict itself), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from shadowgrad._cli import flag, seconds

ROOT = Path(__file__).resolve().parents[1]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "scenario",
        nargs="?",
        default="default",
        help="scenario TOML file, or a name in scenarios/ (default: default)",
    )
    p.add_argument(
        "--topology",
        default="auto",
        choices=("auto", "netns", "mininet", "loopback", "userns"),
        help="auto: netns as root, else loopback; mininet: Mininet hosts behind a Mininet "
        "P4RuntimeSwitch (root, Debian's mininet)",
    )
    flag(
        p,
        "--cli",
        help="with --topology mininet: open Mininet's CLI once the faulted run's job is up; "
        "the network stays until you leave it (exit or Ctrl-D), then the report",
    )
    p.add_argument(
        "--target",
        default="auto",
        choices=("auto", "sim", "bmv2"),
        help="sim: the project's P4 target; bmv2: real simple_switch_grpc",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("demo-out"),
        help="work directory: logs, report.json, plots (default: demo-out); a previous "
        "run's artefacts in it are removed first, the cache kept",
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="cache of the reference and plain runs (default: $SHADOWGRAD_CACHE or "
        "$XDG_CACHE_HOME/shadowgrad or OUT/.cache/shadowgrad)",
    )
    seconds(p, "--timeout", 900.0, "seconds per run")
    flag(
        p,
        "--no-progress",
        help="no progress on stderr (a live line on a terminal, plain lines elsewhere)",
    )
    flag(p, "--json", help="print report.json's summary as JSON")


def _scenario_path(name: str) -> Path:
    from shadowgrad.errors import ShadowgradError

    p = Path(name)
    if p.suffix == ".toml" or p.exists():
        return p
    cand = ROOT / "scenarios" / f"{name}.toml"
    if cand.exists():
        return cand
    have = sorted(x.stem for x in (ROOT / "scenarios").glob("*.toml"))
    raise ShadowgradError(f"no scenario {name!r} (a file, or one of: {', '.join(have)})")


def _have_bmv2() -> bool:
    return shutil.which("p4c") is not None and shutil.which("simple_switch_grpc") is not None


def _userns(args: argparse.Namespace) -> int:
    """Re-run this command as root of a new user + network namespace, on its loopback."""
    from shadowgrad.errors import ShadowgradError

    if shutil.which("unshare") is None or shutil.which("ip") is None:
        raise ShadowgradError("--topology userns needs unshare (util-linux) and ip (iproute2)")
    argv = [a for a in sys.argv[1:]]
    i = argv.index("--topology") if "--topology" in argv else -1
    if i >= 0:
        argv[i + 1] = "loopback"
    else:
        argv = [a.replace("--topology=userns", "--topology=loopback") for a in argv]
    cmd = [
        "unshare",
        "-Urn",
        "sh",
        "-c",
        'ip link set lo up && exec "$@"',
        "sh",
        sys.executable,
        "-m",
        "shadowgrad.cli",
        *argv,
    ]
    import subprocess

    env = {**os.environ, "SHADOWGRAD_DEMO_TOPOLOGY_LABEL": "userns"}
    return subprocess.run(cmd, check=False, env=env).returncode


def run(args: argparse.Namespace) -> int:
    from .report import render_summary
    from .runner import Runner
    from .scenario import load_scenario

    if args.topology == "userns":
        return _userns(args)
    sc = load_scenario(_scenario_path(args.scenario))

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        runner = Runner(
            sc,
            args.out,
            topology=args.topology,
            target=args.target,
            cache_dir=args.cache,
            timeout_s=args.timeout,
            progress=not args.no_progress,
            cli=args.cli,
        )
        if runner.cleared:
            print(
                f"shadowgrad demo: {args.out} holds a previous run: removed "
                f"{', '.join(runner.cleared)} (the reference cache is kept)",
                file=sys.stderr,
                flush=True,
            )
        where = (
            "loopback ports inside a user + network namespace"
            if runner.label == "userns"
            else runner.topology
        )
        print(
            f"shadowgrad demo: scenario {sc.name} ({sc.source}), topology {where}, target "
            f"{runner.target} (the project's P4 target; real bmv2 "
            f"{'found but not driven by the demo' if _have_bmv2() else 'not installed'})",
            file=sys.stderr,
            flush=True,
        )
        args.out.mkdir(parents=True, exist_ok=True)
        record = runner.run()
        from .report import write_report

        report = write_report(record, args.out)
    finally:
        signal.signal(signal.SIGTERM, old)
    if args.json:
        print(json.dumps(report["summary"]))
    else:
        print(render_summary(report, colour=sys.stdout.isatty() and "NO_COLOR" not in os.environ))
        print(
            f"report: {args.out / 'report.json'}; plots: "
            f"{', '.join(str(args.out / p) for p in report.get('plots', []))}"
        )
    return 0 if report["summary"].get("ok") else 1
