"""``shadowgrad status --spec job.toml [--json] [--watch [--interval S] [--count N]]
[--timeout S]``: the job's health as the shadows see it (``shadowgrad.controller.view``).

Prints the job, the trainers (newest iteration, running or silent), the restore point I* with
its source per shard, one row per shadow (shard/replica, health, applied, lag, divergence,
generation, drops) and the problems found. ``--json`` prints the view as one JSON object (one
per line and refresh with ``--watch``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

EPILOG = """\
exit status:
  0  healthy: every shadow answers, is loaded, not diverged and keeps up; trainers running
  3  degraded: at least one problem is listed (a shadow unreachable, refusing, unloaded,
     diverged, of an older generation or lagging; a shard without a healthy replica; no
     restore point; trainers silent for timeouts.failure_detect)
  1  error: bad spec, unreadable token, bad option
With --watch the status is that of the last refresh (Ctrl-C ends the watch with 0).

health of a shadow: ok, lagging (behind the trainers by more than min(8, window/4)
iterations), stale (older generation), diverged, unloaded, error (it answered with an error,
e.g. bad_token), unreachable (no reply within --timeout).
"""


def configure(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument("--spec", required=True, type=Path, help="job spec (TOML)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the view as one JSON object (one per line with --watch)",
    )
    p.add_argument(
        "--watch", action="store_true", help="refresh every --interval seconds until Ctrl-C"
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between refreshes with --watch (default 1)",
    )
    p.add_argument("--count", type=int, default=None, help="with --watch: stop after N refreshes")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for each shadow's reply (default: timeouts.rpc)",
    )


def _check(args: argparse.Namespace) -> None:
    from shadowgrad.errors import ShadowgradError

    if args.count is not None and not args.watch:
        raise ShadowgradError("--count needs --watch")
    if args.count is not None and args.count < 1:
        raise ShadowgradError(f"--count must be at least 1, got {args.count}")
    if not args.interval > 0:
        raise ShadowgradError(f"--interval must be positive, got {args.interval:g}")
    if args.timeout is not None and not args.timeout > 0:
        raise ShadowgradError(f"--timeout must be positive, got {args.timeout:g}")


def _collect(
    spec: Any, token: str, timeout_s: float | None, previous: dict[str, Any] | None
) -> dict[str, Any]:
    """Where the view comes from. The hook for the controller: when ``spec.controller.address``
    is set, a later version asks the controller for this view (``source = "controller"``) and
    falls back to polling the shadows; today it always polls the shadows (``"shadows"``)."""
    from shadowgrad.controller.view import collect

    view = collect(spec, token=token, timeout_s=timeout_s, previous=previous)
    if spec.controller.address is not None:
        view["controller_state"] = _controller_state(spec, token, timeout_s)
        st = view["controller_state"]
        problem = (
            f"controller {spec.controller.address} unreachable: {st['error']}"
            if "error" in st
            else None
            if st.get("state") in ("running", "starting")
            else f"controller: {st.get('state')} ({st.get('reason')})"
        )
        if problem is not None:
            view["problems"].append(problem)
            view["healthy"] = False
            if view["summary"].startswith("healthy"):
                view["summary"] = f"DEGRADED: {problem}"
    return view


def _controller_state(spec: Any, token: str, timeout_s: float | None) -> dict[str, Any]:
    """What the controller says (its state machine, the published I*, holds), or the error."""
    from shadowgrad.control_client import ControllerClient

    try:
        with ControllerClient(
            f"tcp://{spec.controller.address}", token, timeout_s=timeout_s or spec.timeouts.rpc_s
        ) as c:
            st = c.status()
    except Exception as e:  # reported in the view, never a crash
        return {"error": str(e)}
    return {
        "state": st.state,
        "reason": st.reason,
        "istar": st.istar,
        "held": list(st.held),
        "failure": st.failure,
        "detections": st.detections,
        "counters": dict(st.counters),
    }


def _emit(view: dict[str, Any], args: argparse.Namespace, *, tty: bool, colour: bool) -> None:
    from shadowgrad.controller.view import render_text

    out = sys.stdout
    if args.json:
        out.write(json.dumps(view, separators=(",", ":")) + "\n")
    else:
        text = render_text(view, colour=colour)
        if args.watch and tty:
            out.write("\x1b[H\x1b[2J" + text + "\n")  # clear the screen, redraw in place
        elif args.watch:
            out.write(text + "\n\n")
        else:
            out.write(text + "\n")
    out.flush()


def run(args: argparse.Namespace) -> int:
    from shadowgrad.config import load_spec
    from shadowgrad.controller.view import exit_status, use_colour

    _check(args)
    spec = load_spec(args.spec)
    token = spec.token()  # ConfigError (exit 1) when it cannot be read
    tty = bool(sys.stdout.isatty())
    colour = use_colour(sys.stdout)
    if not args.watch:
        view = _collect(spec, token, args.timeout, None)
        _emit(view, args, tty=tty, colour=colour)
        return exit_status(view)
    previous: dict[str, Any] | None = None
    status = 0
    n = 0
    try:
        while True:
            started = time.monotonic()
            view = _collect(spec, token, args.timeout, previous)
            _emit(view, args, tty=tty, colour=colour)
            status = exit_status(view)
            previous = view
            n += 1
            if args.count is not None and n >= args.count:
                return status
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return 0
