"""``shadowgrad switch {plan,program,counters,remove} --spec job.toml --layout layout.json``:
drive the job's ToR switch (``[switch]`` of the spec: P4Runtime address, device id, program)
with the controller's switch driver (docs/switch.md).

* ``plan`` prints the entries and multicast groups the job needs (no switch contacted);
* ``program`` converges the switch to them (pushing the pipeline first if it runs another) and
  prints what it wrote — run it again and it writes nothing;
* ``counters`` prints the job's switch counters (tagged chunks, COMMITs, copies, drops);
* ``remove`` deletes the job's entries and groups (other jobs untouched).

The layout comes from ``shadowgrad layout --spec job.toml --model M:F -o layout.json``. The
pipeline: ``--p4info F --device-config F`` (real p4c's ``.p4info.txtpb`` and ``.json``, or
``shadowgrad p4c``'s ``.bin``); without them, with ``switch.target = "p4target"``, the spec's
``p4_program`` is compiled for the P4 target.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from shadowgrad._cli import flag, seconds


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("plan", "program", "counters", "remove"))
    p.add_argument("--spec", required=True, type=Path, help="job spec (TOML)")
    p.add_argument("--layout", required=True, type=Path, help="layout JSON (shadowgrad layout)")
    p.add_argument("--p4info", type=Path, help="P4Info (text format) of the pipeline")
    p.add_argument(
        "--device-config",
        type=Path,
        help="device config of the pipeline (bmv2 JSON or the target's .bin)",
    )
    p.add_argument("--request-log", type=Path, help="append every P4Runtime write request here")
    flag(
        p, "--no-tap", help="program everything but the tap (the ring runs through, nothing copied)"
    )
    seconds(p, "--timeout", 10.0, "seconds per P4Runtime call")
    flag(p, "--json", help="machine-readable output")


def _pipeline(args: argparse.Namespace, spec: Any) -> tuple[Any, bytes] | None:
    from shadowgrad.errors import ConfigError

    if args.p4info is not None or args.device_config is not None:
        if args.p4info is None or args.device_config is None:
            raise ConfigError("--p4info/--device-config", None, "give both or neither")
        from google.protobuf import text_format  # type: ignore[import-untyped]
        from p4.config.v1 import p4info_pb2

        info = p4info_pb2.P4Info()
        text_format.Merge(args.p4info.read_text(), info, allow_unknown_field=True)
        return info, args.device_config.read_bytes()
    if args.action != "program":
        return None
    if spec.switch.target != "p4target":
        raise ConfigError(
            "switch.target",
            spec.switch.target,
            "compile the program with p4c and pass --p4info and --device-config",
        )
    from shadowgrad.bmv2_testbed.inband import compile_product

    return compile_product(spec.switch.p4_program)


def run(args: argparse.Namespace) -> int:
    from shadowgrad.config import load_spec
    from shadowgrad.controller.p4runtime import P4RuntimeClient
    from shadowgrad.controller.switch import SwitchDriver, describe, plan
    from shadowgrad.layout import Layout

    spec = load_spec(args.spec)
    layout = Layout.from_json(args.layout.read_text())
    if args.action == "plan":
        want = plan(spec, layout, tap=not args.no_tap)
        print("\n".join(describe(want)))
        print(
            f"{len(want.entries)} entries, {len(want.groups)} multicast groups "
            "(group ids from 1; on a switch the driver picks the job's block)"
        )
        return 0
    pipeline = _pipeline(args, spec)
    sw = spec.switch
    with P4RuntimeClient(
        str(sw.grpc_addr),
        device_id=sw.device_id,
        election_id=1,
        timeout_s=args.timeout,
        request_log=args.request_log,
    ) as client:
        client.connect(wait_s=spec.timeouts.connect_s)
        driver = SwitchDriver(client, spec, layout, pipeline=pipeline, tap=not args.no_tap)
        out: dict[str, Any]
        if args.action == "program":
            rep = driver.converge()
            out = {
                "writes": rep.writes,
                "pipeline_pushed": rep.pipeline_pushed,
                "inserted": rep.inserted,
                "modified": rep.modified,
                "deleted": rep.deleted,
                "groups": [rep.groups_inserted, rep.groups_modified, rep.groups_deleted],
                "group_base": rep.group_base,
            }
        elif args.action == "remove":
            rep = driver.remove()
            out = {"deleted": rep.deleted, "groups_deleted": rep.groups_deleted}
        else:
            out = driver.counters()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0
