"""``sg-switch-grpc``: the software target's command line, argv-compatible with
``simple_switch_grpc``::

    sg-switch-grpc [--no-p4 | PROGRAM] -i 1@s1-eth1 -i 2@s1-eth2 --device-id 0 \\
        [--thrift-port 9090] [--log-console] [-L info] [--pcap DIR] \\
        [--loopback-port 3@127.0.0.1:40003[=127.0.0.1:50003]] \\
        [--port-rate 1:100m] [--port-delay 1:5ms] [--port-loss 1:0.01] [--lossless-port 2] \\
        -- --grpc-server-addr 0.0.0.0:9559 --cpu-port 255 [--drop-port 511]

PROGRAM is a P4_16 source (``.p4``, compiled at start) or a pipeline artefact (the
``p4_device_config`` bytes that ``compile`` writes, e.g. ``build/prog.bin``), the counterpart of
bmv2's JSON. Options bmv2 has but this target does not need (``--thrift-port``,
``--priority-queues``, ``--dump-packet-data``, ...) are accepted and ignored with a note. On
SIGTERM/SIGINT the switch stops cleanly. Once serving, one line
``sg-switch-grpc ready grpc=HOST:PORT`` goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shadowgrad._cli import flag, repeated

from .queues import QueueConfig
from .v1model import DEFAULT_DROP_PORT, MAX_PORT

__all__ = ["main", "build_parser", "parse_args", "parse_rate", "parse_duration"]

log = logging.getLogger("shadowgrad.p4target.switch")

PROG = "sg-switch-grpc"
_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "off": logging.CRITICAL + 10,
}


def parse_rate(text: str) -> float:
    """``100m``, ``1.5g``, ``64k``, ``1000`` bit/s; an optional ``bit``/``bps`` suffix."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(bit|bps|b)?(/s)?\s*", text.lower())
    if not m:
        raise ValueError(f"bad rate {text!r} (e.g. 100m, 1g, 64kbit)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    v = float(m.group(1)) * scale
    if v <= 0:
        raise ValueError(f"rate must be > 0: {text!r}")
    return v


def parse_duration(text: str) -> float:
    """``5ms``, ``200us``, ``0.1s``, ``1`` (seconds)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|ms|us|ns)?\s*", text.lower())
    if not m:
        raise ValueError(f"bad duration {text!r} (e.g. 5ms, 200us, 0.1s)")
    return float(m.group(1)) * {"s": 1.0, None: 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[m.group(2)]


def _parse_loss(text: str) -> float:
    t = text.strip()
    v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    if not 0 <= v < 1:
        raise ValueError(f"loss must be in [0, 1): {text!r}")
    return v


def _per_port(items: list[str], conv: Any, what: str) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for item in items:
        num, sep, val = item.partition(":")
        if not sep:
            raise ValueError(f"--port-{what} takes PORT:VALUE, got {item!r}")
        try:
            out[int(num)] = conv(val)
        except ValueError as e:
            raise ValueError(f"--port-{what} {item!r}: {e}") from None
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="P4_16 v1model software switch with P4Runtime "
        "(a stand-in for simple_switch_grpc). Target options go after '--'.",
    )
    p.add_argument("program", nargs="?", help="P4 source (.p4) or pipeline artefact (.bin)")
    flag(p, "--no-p4", help="start without a program; it arrives by SetForwardingPipelineConfig")
    repeated(
        p,
        "-i",
        "--interface",
        help="attach a Linux interface as port N (AF_PACKET)",
        metavar="N@IFACE",
    )
    repeated(
        p,
        "--loopback-port",
        help="port N as a UDP endpoint; each datagram is one Ethernet frame",
        metavar="N@HOST:PORT[=PEER:PORT]",
    )
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument(
        "--thrift-port",
        type=int,
        default=None,
        help="accepted for compatibility; there is no Thrift server",
    )
    flag(p, "--log-console", help="log packet events to stderr")
    p.add_argument("--log-file", default=None, help="log to this file instead of stderr")
    flag(p, "--log-flush", help="accepted (always flushed)")
    p.add_argument("-L", "--log-level", default="info", choices=sorted(_LEVELS))
    p.add_argument(
        "--pcap",
        nargs="?",
        const=".",
        default=None,
        metavar="DIR",
        help="write <iface>_in.pcap / <iface>_out.pcap per port into DIR",
    )
    p.add_argument("--dump-packet-data", type=int, default=None, help="accepted, ignored")
    for opt in ("--nanolog", "--notifications-addr", "--restore-state", "--state-file"):
        p.add_argument(opt, default=None, help="bmv2 option: accepted, ignored")
    flag(p, "--debugger", help="bmv2 option: accepted, ignored")
    repeated(p, "--port-rate", help="egress rate of port N in bit/s (100m, 1g)", metavar="N:RATE")
    repeated(p, "--port-delay", help="constant egress delay of port N (5ms)", metavar="N:DELAY")
    repeated(
        p, "--port-loss", help="egress loss probability of port N (0.01 or 1%%)", metavar="N:P"
    )
    repeated(
        p,
        "--lossless-port",
        help="make port N's egress queue lossless (pause, never tail-drop)",
        metavar="N",
        type=int,
    )
    p.add_argument(
        "--queue-capacity",
        type=int,
        default=1024,
        metavar="PKTS",
        help="egress queue depth in packets (default 1024)",
    )
    p.add_argument(
        "--pause-timeout",
        type=parse_duration,
        default=1.0,
        metavar="DUR",
        help="longest a lossless queue pauses a producer per frame (default 1s)",
    )
    p.add_argument(
        "--lossless-headroom",
        type=int,
        default=4096,
        metavar="PKTS",
        help="packets a lossless queue admits past a timed-out pause before it "
        "drops (default 4096)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the loss RNGs")
    flag(
        p,
        "--pfc",
        help="emit 802.1Qbb PFC XOFF/XON frames out of an ingress port while a "
        "lossless queue pauses it",
    )
    p.add_argument(
        "--p4info",
        default=None,
        help="P4Info text file to check a .bin artefact against (optional)",
    )
    return p


def build_target_parser() -> argparse.ArgumentParser:
    t = argparse.ArgumentParser(prog=f"{PROG} ... --", add_help=False)
    t.add_argument("--grpc-server-addr", default="0.0.0.0:9559")
    t.add_argument("--cpu-port", type=int, default=None)
    t.add_argument("--drop-port", type=int, default=DEFAULT_DROP_PORT)
    t.add_argument("--priority-queues", type=int, default=None, help="accepted, ignored")
    return t


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        main_argv, target_argv = argv[:i], argv[i + 1 :]
    else:
        main_argv, target_argv = argv, []
    p = build_parser()
    args = p.parse_args(main_argv)
    targs = build_target_parser().parse_args(target_argv)
    if args.no_p4 and args.program:
        p.error("--no-p4 and a program are mutually exclusive")
    if targs.cpu_port is not None and not 0 < targs.cpu_port <= MAX_PORT:
        p.error("--cpu-port must be 1..511")
    if targs.cpu_port is not None and targs.cpu_port == targs.drop_port:
        p.error("--cpu-port cannot equal --drop-port")
    return args, targs


def _load_program(path: str, p4info_path: str | None) -> Any:
    from .dataplane import Pipeline

    src = Path(path)
    if src.suffix == ".p4":
        return Pipeline.compile(src)
    p4info = None
    if p4info_path:
        from google.protobuf import text_format  # type: ignore[import-untyped]
        from p4.config.v1 import p4info_pb2

        p4info = p4info_pb2.P4Info()
        text_format.Merge(Path(p4info_path).read_text(), p4info, allow_unknown_field=True)
    return Pipeline.from_device_config(src.read_bytes(), p4info)


def _configure_logging(args: argparse.Namespace) -> None:
    from shadowgrad import _log

    level = _LEVELS[args.log_level]
    _log.configure(level if args.log_level != "off" else logging.CRITICAL)
    if args.log_file:
        h = logging.FileHandler(args.log_file)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)-5s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.handlers[:] = [h]
    logging.getLogger().setLevel(level)
    pkt = logging.getLogger("shadowgrad.p4target.packets")
    pkt.setLevel(logging.INFO if args.log_console else logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    args, targs = parse_args(sys.argv[1:] if argv is None else argv)
    _configure_logging(args)
    from .ports import AfPacketPort, Port, UdpPort, parse_iface_spec, parse_loopback_spec

    if args.thrift_port is not None:
        log.info(
            "--thrift-port %d ignored: this target has no Thrift server "
            "(registers are read in-process, not over Thrift)",
            args.thrift_port,
        )
    if targs.priority_queues:
        log.info("--priority-queues ignored: one egress queue per port")
    try:
        rates = _per_port(args.port_rate, parse_rate, "rate")
        delays = _per_port(args.port_delay, parse_duration, "delay")
        losses = _per_port(args.port_loss, _parse_loss, "loss")
        specs = [parse_iface_spec(s) for s in args.interface] + [
            parse_loopback_spec(s) for s in args.loopback_port
        ]
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    numbers = [s.number for s in specs]
    dup = {n for n in numbers if numbers.count(n) > 1}
    if dup:
        print(f"{PROG}: error: port(s) {sorted(dup)} given twice", file=sys.stderr)
        return 2
    unknown = (set(rates) | set(delays) | set(losses) | set(args.lossless_port)) - set(numbers)
    if unknown:
        print(
            f"{PROG}: error: per-port options for unattached port(s) {sorted(unknown)}",
            file=sys.stderr,
        )
        return 2

    from .switch import Switch

    pipeline = None
    if args.program:
        try:
            pipeline = _load_program(args.program, args.p4info)
        except Exception as e:  # compile errors carry file:line:col diagnostics
            diags = getattr(e, "diagnostics", None)
            print(f"{PROG}: cannot load {args.program}: {e}", file=sys.stderr)
            for d in diags or ():
                print(f"  {d}", file=sys.stderr)
            return 1

    sw = Switch(
        device_id=args.device_id,
        cpu_port=targs.cpu_port,
        drop_port=targs.drop_port,
        grpc_addr=targs.grpc_server_addr,
        pcap_dir=args.pcap,
        log_packets=args.log_console,
        pfc=args.pfc,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        for s in specs:
            port: Port
            if s.kind == "iface":
                port = AfPacketPort(s.number, s.iface)
            else:
                port = UdpPort(s.number, s.host, s.udp_port, s.peer)
            sw.add_port(
                port,
                QueueConfig(
                    capacity=args.queue_capacity,
                    rate_bps=rates.get(s.number),
                    delay_s=delays.get(s.number, 0.0),
                    loss=losses.get(s.number, 0.0),
                    seed=args.seed + s.number,
                    lossless=s.number in args.lossless_port,
                    pause_timeout_s=args.pause_timeout,
                    headroom=args.lossless_headroom,
                ),
            )
        if pipeline is not None:
            sw.load_pipeline(pipeline)
        sw.start()
        assert sw.server is not None
        host = targs.grpc_server_addr.rpartition(":")[0] or "0.0.0.0"
        print(
            f"{PROG} ready grpc={host}:{sw.server.port} device_id={args.device_id} "
            f"ports={sorted(sw.ports)}",
            flush=True,
        )
        while not stop.wait(0.5):
            pass
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    finally:
        # the ports' and queues' counters (drops by reason, pauses) for whoever ran us
        with contextlib.suppress(Exception):
            print(
                f"{PROG} counters {json.dumps(sw.counters(), default=str)}",
                file=sys.stderr,
                flush=True,
            )
        sw.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
