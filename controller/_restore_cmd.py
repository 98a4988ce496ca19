"""``shadowgrad restore --spec job.toml``: for an operator — show the restore point I*, where
each shard comes from, hold it on those shadows, and print (or with ``--exec CMD ...`` run) what
the restarted trainers need.

With ``[controller] address`` in the spec and the controller answering, I* is the controller's
(it holds it and releases it once the trainers run again); otherwise this command applies the
same rule (:mod:`shadowgrad.restore`) to the shadows' statuses itself and places the holds,
which ``--release`` (or the end of ``--exec``) removes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shadowgrad._cli import flag

if TYPE_CHECKING:
    from shadowgrad.messages import ShadowStatus


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", required=True, type=Path, help="job spec (TOML)")
    flag(p, "--json", help="machine-readable output")
    flag(p, "--no-hold", help="only show I*, hold nothing")
    flag(p, "--release", help="release the holds placed by an earlier 'shadowgrad restore'")
    flag(p, "--no-controller", help="ask the shadows directly even when a controller is configured")
    p.add_argument(
        "--exec",
        dest="exec_cmd",
        nargs=argparse.REMAINDER,
        help="then run this command (the trainers' launch command, e.g. torchrun "
        "...) and release the holds when it exits; its exit status is returned",
    )


def _clients(spec: Any, token: str) -> Any:
    from shadowgrad.control_client import ShadowClient

    def make(k: int) -> ShadowClient:
        return ShadowClient(
            f"tcp://{spec.shadows.control_endpoint(k)}", token, timeout_s=spec.timeouts.rpc_s
        )

    return make


def _statuses(spec: Any, token: str) -> dict[int, ShadowStatus | None]:
    """Every shadow's status (None: no answer). A shadow refusing the token is an error: a
    wrong token must never read as "no state, start fresh"."""
    from shadowgrad.errors import ControlError, ShadowgradError

    make = _clients(spec, token)
    out: dict[int, ShadowStatus | None] = {}
    for k in range(spec.shadows.count):
        try:
            with make(k) as c:
                out[k] = c.status(timeline=0)
        except ControlError as e:
            if e.code == "bad_token":
                where = spec.security.token_file or spec.security.token_env
                raise ShadowgradError(
                    f"shadow {k} refused the job token ({e}): check {where}"
                ) from None
            out[k] = None
        except ShadowgradError:
            out[k] = None
    if not any(v is not None for v in out.values()):
        raise ShadowgradError(
            f"no shadow of job {spec.job.id} answers (tried "
            f"{spec.shadows.count}); is the spec right, are they running?"
        )
    return out


def _from_controller(spec: Any, token: str) -> dict[str, Any] | None:
    from shadowgrad.control_client import ControllerClient
    from shadowgrad.errors import ControlError, ShadowgradError

    t = spec.timeouts
    try:
        with ControllerClient(
            f"tcp://{spec.controller.address}", token, timeout_s=t.rpc_s + 2 * t.failure_detect_s
        ) as c:
            point = c.restore_point(requester="shadowgrad restore")
    except ControlError as e:
        if e.code == "bad_token":
            raise ShadowgradError(f"the controller refused the token: {e}") from None
        raise ShadowgradError(f"the controller has no restore point: {e}") from None
    except ShadowgradError:
        return None  # not answering: fall back to the shadows
    return {**point.raw, "by": "controller"}  # printed as the controller said it


def run(args: argparse.Namespace) -> int:
    from shadowgrad.config import load_spec
    from shadowgrad.restore import fix_restore_point, restore_point, settle

    spec = load_spec(args.spec)
    token = spec.token()
    make = _clients(spec, token)
    t = spec.timeouts
    if args.release:
        sts = _statuses(spec, token)
        released = []
        for k, st in sts.items():
            for it in () if st is None else st.holds:
                with make(k) as c:
                    c.release(int(it))
                released.append((k, int(it)))
        print(
            json.dumps({"released": released})
            if args.json
            else f"released {len(released)} hold(s): {released}"
        )
        return 0
    doc: dict[str, Any] | None = None
    if spec.controller.address is not None and not args.no_controller:
        doc = _from_controller(spec, token)
        if doc is None:
            print(
                "shadowgrad restore: the controller does not answer; asking the shadows",
                file=sys.stderr,
            )
    held_here: list[int] = []
    if doc is None:
        interval_s = max(0.05, t.gap_repair_s)
        if args.no_hold:
            settled = settle(
                lambda: _statuses(spec, token),
                _statuses(spec, token),
                interval_s=interval_s,
                timeout_s=t.failure_detect_s,
            )
            point = restore_point(
                settled, num_shards=spec.num_shards, replication=spec.shadows.replication
            )
        else:

            def hold(k: int, it: int) -> None:
                with make(k) as c:
                    c.hold(it)

            def release(k: int, it: int) -> None:
                with make(k) as c:
                    c.release(it)

            # the one rule (core): settled, computed, and held on every source
            point, held_here = fix_restore_point(
                lambda: _statuses(spec, token),
                hold,
                release,
                num_shards=spec.num_shards,
                replication=spec.shadows.replication,
                interval_s=interval_s,
                timeout_s=t.failure_detect_s,
                who="restore",
            )
        doc = {**point.to_json(), "by": "shadows"}
        if not point.fresh and not args.no_hold:
            doc["held"] = held_here
    if args.json:
        print(json.dumps(doc))
    elif doc.get("fresh"):
        print("no shadow holds state: the job starts fresh (iteration 0)")
    else:
        print(
            f"I* = {doc['istar']}  (from the {doc['by']}; the trainers resume at "
            f"iteration {int(doc['istar']) + 1})"
        )
        for shard, (k, u) in enumerate(zip(doc["source"], doc["usable"], strict=True)):
            print(f"  shard {shard}: shadow {k} (newest usable iteration {u})")
        print(f"held on shadows {doc.get('held', [])}")
        print(
            "restart the trainers with their usual launch command (e.g. the same torchrun "
            "line): attach() restores I* from the shadows and resumes"
        )
    if not args.exec_cmd:
        return 0
    try:
        rc = subprocess.run(args.exec_cmd, check=False).returncode
    finally:
        for k in held_here:
            try:
                with make(k) as c:
                    c.release(int(doc["istar"]))
            except Exception as e:  # the shadow went away: nothing is held there any more
                print(f"shadowgrad restore: release on shadow {k} failed: {e}", file=sys.stderr)
    return rc
