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

from shadowgrad._cli import flag, seconds

EPILOG = """\
exit status:
  0  healthy: every shadow answers, is loaded, not diverged and keeps up; trainers running,
     or finished (rank 0 closed after the last iteration and told the shadows/controller)
  3  degraded: at least one problem is listed (a shadow unreachable, refusing, unloaded,
     diverged, of an older generation or lagging; a shard without a healthy replica; no
     restore point; trainers silent for timeouts.failure_detect)
  1  error: bad spec, unreadable token, a token refused (bad_token) by every shadow and
     controller that answered (not this job's token), bad option
With --watch the status is that of the last refresh (Ctrl-C ends the watch with 0).

health of a shadow: ok, lagging (behind the trainers by more than min(8, window/4)
iterations), stale (older generation), diverged, unloaded, error (it answered with an error,
e.g. bad_token), unreachable (no reply within --timeout).
"""


def configure(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument("--spec", required=True, type=Path, help="job spec (TOML)")
    flag(p, "--json", help="print the view as one JSON object (one per line with --watch)")
    flag(p, "--watch", help="refresh every --interval seconds until Ctrl-C")
    seconds(p, "--interval", 1.0, "seconds between refreshes with --watch (default 1)")
    p.add_argument("--count", type=int, default=None, help="with --watch: stop after N refreshes")
    seconds(p, "--timeout", None, "seconds to wait for each shadow's reply (default: timeouts.rpc)")


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

    st: dict[str, Any] | None = None
    if spec.controller.address is not None:
        st = _controller_state(spec, token, timeout_s)
    # the controller's word that training ended counts when the shadows were not told (an
    # older trainer, shadows that did not answer rank 0's close)
    finished = None
    if st is not None and st.get("state") == "finished":
        finished = st.get("finished") or {}
    view = collect(spec, token=token, timeout_s=timeout_s, previous=previous, finished=finished)
    if st is not None:
        view["controller_state"] = st
        problem = (
            f"controller {spec.controller.address} refused status: {st['error']}"
            if "error_code" in st
            else f"controller {spec.controller.address} unreachable: {st['error']}"
            if "error" in st
            else None
            if st.get("state") in ("running", "starting", "finished")
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
    from shadowgrad.errors import ControlError

    try:
        with ControllerClient(
            f"tcp://{spec.controller.address}", token, timeout_s=timeout_s or spec.timeouts.rpc_s
        ) as c:
            st = c.status()
    except ControlError as e:  # it answered, but refused (bad_token, ...)
        return {"error": str(e), "error_code": e.code}
    except Exception as e:  # reported in the view, never a crash
        return {"error": str(e)}
    shadows = st.shadows
    return {
        "state": st.state,
        "reason": st.reason,
        "finished": None if st.finished is None else dict(st.finished),
        # the controller's word on each shadow (ok, starting, unreachable, failed, ...)
        "shadows": {str(k): (v or {}).get("state") for k, v in (shadows or {}).items()}
        if isinstance(shadows, dict)
        else None,
        "istar": st.istar,
        "held": list(st.held),
        "failure": st.failure,
        "detections": st.detections,
        "counters": dict(st.counters),
    }


def _token_refused(spec: Any, view: dict[str, Any]) -> str | None:
    """The error when the token was refused (``bad_token``) by at least one shadow or the
    controller and accepted by none (this is not the job's token); None otherwise (a token
    refused by some shadows only is their problem, listed in the view)."""
    rows = view["shadows"]
    refused = [r["id"] for r in rows if r["error_code"] == "bad_token"]
    accepted = any(r["loaded"] is not None for r in rows)  # answered a status
    cs = view.get("controller_state")
    ctl_refused = cs is not None and cs.get("error_code") == "bad_token"
    ctl_accepted = cs is not None and "error" not in cs
    if not (refused or ctl_refused) or accepted or ctl_accepted:
        return None
    who = []
    if refused:
        who.append(f"shadow{'s' if len(refused) > 1 else ''} {', '.join(map(str, refused))}")
    if ctl_refused:
        who.append(f"the controller ({spec.controller.address})")
    sec = spec.security
    where = (
        f"security.token_file = {sec.token_file}"
        if sec.token_file is not None
        else f"the environment variable {sec.token_env} (security.token_env)"
    )
    silent = len(rows) - len(refused)
    others = f"; {silent} other shadow(s) did not answer" if silent else ""
    return (
        f"the job token was refused (bad_token) by {' and '.join(who)}{others}: "
        f"the token from {where} is not this job's token"
    )


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
    from shadowgrad.errors import ShadowgradError

    _check(args)
    spec = load_spec(args.spec)
    token = spec.token()  # ConfigError (exit 1) when it cannot be read
    tty = bool(sys.stdout.isatty())
    colour = use_colour(sys.stdout)
    if not args.watch:
        view = _collect(spec, token, args.timeout, None)
        _emit(view, args, tty=tty, colour=colour)
        refused = _token_refused(spec, view)
        if refused is not None:
            raise ShadowgradError(refused)  # exit 1: a wrong token is an error, not a state
        return exit_status(view)
    previous: dict[str, Any] | None = None
    status = 0
    n = 0
    try:
        while True:
            started = time.monotonic()
            view = _collect(spec, token, args.timeout, previous)
            _emit(view, args, tty=tty, colour=colour)
            refused = _token_refused(spec, view)
            if refused is not None:
                raise ShadowgradError(refused)  # no refresh makes a wrong token right
            status = exit_status(view)
            previous = view
            n += 1
            if args.count is not None and n >= args.count:
                return status
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return 0
