"""``shadowgrad controller --spec job.toml [--layout layout.json]``: run the job's controller
until SIGINT/SIGTERM (docs/operations.md).

In-band jobs with a switch (``switch.target`` not ``none``) are programmed through the switch
driver first (``--layout`` is then required: ``shadowgrad layout ... -o layout.json``) and kept
converged; ``--no-switch`` leaves the switch to someone else. The control endpoint is
``[controller] address`` of the spec (or ``--bind``); trainers and ``shadowgrad status`` /
``restore`` find the controller there. SIGHUP re-reads the spec (a failed shadow replaced at a
new address): the switch is converged to it, writing only the entries that changed.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shadowgrad._cli import flag, seconds

if TYPE_CHECKING:
    from shadowgrad.seams import SwitchDriver as SwitchDriverSeam


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", required=True, type=Path, help="job spec (TOML)")
    p.add_argument("--layout", type=Path, help="layout JSON (needed to program a switch)")
    p.add_argument(
        "--bind",
        help="control endpoint, e.g. tcp://0.0.0.0:47600 "
        "(default: [controller] address of the spec)",
    )
    flag(p, "--no-switch", help="do not program or watch the switch (another process owns it)")
    p.add_argument("--p4info", type=Path, help="P4Info (text) of the pipeline (real p4c)")
    p.add_argument("--device-config", type=Path, help="device config of the pipeline")
    p.add_argument("--request-log", type=Path, help="append every P4Runtime write request here")
    p.add_argument(
        "--election-id",
        type=int,
        default=1,
        help="P4Runtime election id (the highest connected client is the primary)",
    )
    seconds(
        p, "--poll", None, "seconds between polls of the shadows (default: min(heartbeat, 0.25))"
    )
    p.add_argument(
        "--status-json",
        type=Path,
        help="rewrite this file with the controller's status every --status-interval",
    )
    seconds(p, "--status-interval", 1.0, "seconds between --status-json rewrites (default 1)")
    seconds(
        p, "--duration", None, "stop after this many seconds (default: run until SIGINT/SIGTERM)"
    )


def run(args: argparse.Namespace) -> int:
    from shadowgrad.config import load_spec
    from shadowgrad.errors import ConfigError

    from .service import Controller, ControllerOptions

    spec = load_spec(args.spec)
    bind = args.bind
    if bind is None and spec.controller.address is None:
        raise ConfigError(
            "controller.address",
            None,
            'give [controller] address = "host:port" in the spec or --bind',
        )
    client: Any = None
    driver: SwitchDriverSeam | None = None
    layout: Any = None
    pipeline: Any = None
    SwitchDriver: Any = None  # noqa: N806 (the class, imported with the switch extra)
    if spec.switch.target != "none" and not args.no_switch:
        if args.layout is None:
            raise ConfigError(
                "--layout",
                None,
                "programming the switch needs the layout "
                "(shadowgrad layout --spec ... --model ... -o layout.json), or "
                "pass --no-switch",
            )
        from shadowgrad.layout import Layout

        from ._cmd import _pipeline
        from .p4runtime import P4RuntimeClient
        from .switch import SwitchDriver

        layout = Layout.from_json(args.layout.read_text())
        ns = argparse.Namespace(
            p4info=args.p4info, device_config=args.device_config, action="program"
        )
        pipeline = _pipeline(ns, spec)
        sw = spec.switch
        client = P4RuntimeClient(
            str(sw.grpc_addr),
            device_id=sw.device_id,
            election_id=args.election_id,
            timeout_s=spec.timeouts.rpc_s * 5,
            request_log=args.request_log,
        )
        client.connect(wait_s=spec.timeouts.connect_s)
        driver = SwitchDriver(client, spec, layout, pipeline=pipeline)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    reload = threading.Event()

    def on_hup(_signum: int, _frame: Any) -> None:
        reload.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    old[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hup)
    ctl = Controller(spec, driver=driver, bind=bind, options=ControllerOptions(poll_s=args.poll))
    t_end = None if args.duration is None else time.monotonic() + args.duration
    try:
        ctl.start()
        while not stop.wait(min(1.0, max(0.05, args.status_interval))):
            if reload.is_set():
                reload.clear()
                try:  # SIGHUP: re-read the spec (a shadow replaced at a new address)
                    new = load_spec(args.spec)
                    if driver is not None:
                        driver = SwitchDriver(client, new, layout, pipeline=pipeline)
                    ctl.reload(new, driver)
                except Exception as e:  # a bad edit keeps the running spec
                    logging.getLogger(__name__).error("reload of %s failed: %s", args.spec, e)
            if args.status_json is not None:
                tmp = args.status_json.with_suffix(".tmp")
                tmp.write_text(json.dumps(ctl.status()))
                tmp.replace(args.status_json)
            if t_end is not None and time.monotonic() >= t_end:
                break
    finally:
        ctl.close()
        if client is not None:
            client.close()
        for s, h in old.items():
            signal.signal(s, h)
    return 0
