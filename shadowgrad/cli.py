"""The ``shadowgrad`` command line: one console script, one subcommand per job.

Subcommands are listed in :data:`COMMANDS` as ``name -> (module, help)``; each module defines
``configure(parser)`` and ``run(args) -> int`` and keeps heavy imports inside ``run``, so
``shadowgrad --help`` stays fast and never imports grpc, torch or scapy. Later packages add
their commands to the table. This is the only place that configures logging and turns
:class:`~shadowgrad.errors.ShadowgradError` into an exit status.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from shadowgrad import __version__
from shadowgrad._log import configure as configure_logging
from shadowgrad.errors import ShadowgradError

__all__ = ["COMMANDS", "build_parser", "main"]

log = logging.getLogger(__name__)

#: subcommand -> (module defining ``configure`` and ``run``, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "spec": ("shadowgrad._cmd_spec", "validate or show a job spec (TOML), env overrides applied"),
    "layout": ("shadowgrad._cmd_layout", "compute the shard layout of a model and its digest"),
    "wire": ("shadowgrad._cmd_wire", "decode shadowgrad datagrams (hex) and check them"),
    "shadow": ("shadowgrad.shadow._cmd", "run one shadow node"),
    "plan": (
        "shadowgrad._cmd_plan",
        "checkpoint interval planner: Young-Daly vs per-iteration shadow checkpoints",
    ),
    "controller": (
        "shadowgrad.controller._service_cmd",
        "run the job's controller: failure detection, I*, holds, switch convergence",
    ),
    "status": (
        "shadowgrad.controller._status_cmd",
        "the job's health: trainers, I*, every shadow, switch counters (--watch, --json)",
    ),
    "restore": (
        "shadowgrad.controller._restore_cmd",
        "show and hold the restore point I* and what restarted trainers need",
    ),
    "export": (
        "shadowgrad.controller._export_cmd",
        "write an iteration as a torch.distributed.checkpoint directory; --verify DIR",
    ),
    "switch": (
        "shadowgrad.controller._cmd",
        "plan, program, read or clear the job's ToR switch over P4Runtime",
    ),
    "demo": (
        "shadowgrad.bmv2_testbed._demo_cmd",
        "run an emulated job (switch, shadows, controller, trainers), inject faults, report",
    ),
    "p4c": (
        "shadowgrad.p4target._compile_cmd",
        "compile a P4_16 v1model program for the software target (p4c-like)",
    ),
    "p4test": (
        "shadowgrad.p4target._p4test_cmd",
        "run STF tests (p4c's bmv2 format) on the software target: PROG.p4 [TEST.stf] or a folder",
    ),
}

#: exit status for a ShadowgradError (bad spec, bad input, ...); argparse uses 2 for usage
EXIT_ERROR = 1


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line. ``only``: the command about to run; only its module is imported
    (the others are listed with their help line): a command that must start fast, such as
    ``shadow`` (its control endpoint answers before it imports torch), does not pay for
    importing every other command's module."""
    parser = argparse.ArgumentParser(
        prog="shadowgrad",
        description="In-network per-iteration checkpointing for data-parallel training.",
    )
    parser.add_argument("--version", action="version", version=f"shadowgrad {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="default: INFO",
    )
    parser.add_argument(
        "--log-json", action="store_true", help="write logs and events as one JSON object per line"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text, description=help_text)
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:  # an extra is not installed: say so when the command is used
            p = sub.add_parser(
                name, help=f"{help_text} [unavailable: {e.name or e}]", description=help_text
            )
            p.add_argument("rest", nargs=argparse.REMAINDER)
            p.set_defaults(_run=_unavailable(name, e))
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def _unavailable(name: str, error: ImportError) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise ShadowgradError(
            f"'{name}' needs a package that is not installed ({error}); "
            "install the extra it belongs to, e.g. pip install 'shadowgrad[all]'"
        )

    return run


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # the first word naming a command is the command (no top-level option takes one as value)
    parser = build_parser(next((w for w in words if w in COMMANDS), None))
    args = parser.parse_args(words)
    configure_logging(args.log_level, json_lines=args.log_json)
    try:
        status: int = args._run(args)
    except ShadowgradError as e:
        print(f"shadowgrad {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
