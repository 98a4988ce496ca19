"""``compile``: a p4c-like front door to the P4 software target.

    shadowgrad p4c prog.p4 -o build/ --p4runtime-files build/prog.p4info.txtpb

writes ``build/prog.bin`` (the pipeline artefact the target loads as the P4Runtime
``p4_device_config``; see :mod:`shadowgrad.p4target.pipeline`) and the P4Info in every
format named by ``--p4runtime-files`` (comma-separated; the suffix picks the format, as with p4c:
``.txtpb``/``.txt`` text, ``.json``, ``.bin``). Diagnostics go to stderr as
``file:line:col: message``; the exit status is 1 when the program is rejected.

p4c-bm2-ss's command line as p4lang/tutorials' Makefile runs it works too::

    shadowgrad-p4c --p4v 16 --p4runtime-files build/X.p4.p4info.txtpb -o build/X.json X.p4

``build/X.json`` then holds the pipeline artefact (not bmv2's JSON): ``sg-switch-grpc
build/X.json`` loads it, and it is what a controller pushes as the P4Runtime device config.

``configure(parser)``/``run(args)`` plug into ``shadowgrad.cli``; ``main(argv)`` serves a
standalone console script.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from shadowgrad._cli import repeated


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", type=Path, help="the P4_16 program (v1model)")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("."),
        help="output folder (writes <stem>.bin) or a file name ending in .bin/.json",
    )
    p.add_argument(
        "--p4runtime-files",
        default="",
        help="comma-separated P4Info outputs (.txtpb, .txt, .json, .bin)",
    )
    repeated(p, "-I", help="add an include folder", type=Path, dest="include")
    repeated(p, "-D", help="define a macro, NAME or NAME=VALUE", dest="define")
    p.add_argument("--target", default="bmv2", help="accepted for p4c compatibility (bmv2)")
    p.add_argument("--arch", default="v1model", help="accepted for p4c compatibility (v1model)")
    p.add_argument("--std", default="p4-16", help="accepted for p4c compatibility (p4-16)")
    p.add_argument(
        "--p4v",
        default="16",
        help="p4c-bm2-ss's language version, as the p4lang/tutorials Makefile passes it (16)",
    )
    p.add_argument(
        "--dump-python", type=Path, default=None, help="also write the generated Python (debugging)"
    )


def run(args: argparse.Namespace) -> int:
    from .pipeline import P4CompileError, Pipeline

    for opt, want in (("target", "bmv2"), ("arch", "v1model"), ("std", "p4-16"), ("p4v", "16")):
        if getattr(args, opt) != want:
            print(
                f"error: --{opt} {getattr(args, opt)} is not supported (only {want})",
                file=sys.stderr,
            )
            return 2
    defines: dict[str, str] = {}
    for d in args.define:
        name, _, value = d.partition("=")
        defines[name] = value if _ else "1"
    try:
        pipe = Pipeline.compile(Path(args.source), include_dirs=args.include, defines=defines)
    except P4CompileError as e:
        for line in e.diagnostics:
            print(line, file=sys.stderr)
        return 1
    out: Path = args.output
    is_file = out.suffix in (".bin", ".json")
    target = out if is_file else out / (Path(args.source).stem + ".bin")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(pipe.to_device_config())
    for f in [x for x in args.p4runtime_files.split(",") if x]:
        Path(f).parent.mkdir(parents=True, exist_ok=True)
        try:
            pipe.write_p4info(f)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.dump_python is not None:
        args.dump_python.write_text(pipe.source)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="shadowgrad-p4c", description=__doc__.split("\n")[0])
    configure(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
