"""``p4test``: run STF tests (p4c's bmv2 test format) against the P4 software target.

    shadowgrad p4test prog.p4 [prog.stf]     # one program and its STF file
    shadowgrad p4test ../shared/p4c-stf      # a corpus: manifest.json, or every X.p4 + X.stf

One program: it is compiled (a rejected program prints its located diagnostics), its STF file
(default: the program's name with ``.stf``) runs on a fresh dataplane with the semantics of
p4c's bmv2 runner (:mod:`shadowgrad.p4target.stf`), on the general path and, where the
program has one, on the straight-line fast path; the two must send the same frames. Mismatches
are printed per port and packet, with the expected and received bytes. Exit status: 0 when the
program passes, 1 when it is rejected or fails.

A folder: every program of its ``manifest.json`` (the layout of ``../shared/p4c-stf``, see its
README) or, without one, every ``X.p4`` that has an ``X.stf`` beside it (p4c's
``testdata/p4_16_samples``). Prints the counts (compiled, passed, P4Info identical to p4c's where
the corpus has p4c's file) and the rejections grouped by their first diagnostic; ``-v`` lists
every program. Exit status: 0 when no program that compiles fails and nothing escaped the
target as an internal error (a rejected program names what it does not support), else 1.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from shadowgrad._cli import flag
from shadowgrad.errors import ShadowgradError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", type=Path, help="a P4_16 v1model program, or a corpus folder")
    p.add_argument(
        "stf", type=Path, nargs="?", default=None, help="the STF file (default: PROGRAM.stf)"
    )
    flag(p, "-v", "--verbose", help="a folder: list every program")
    p.add_argument("--json", type=Path, default=None, help="a folder: write every result")


def _folder_entries(folder: Path) -> list[dict[str, object]]:
    """The manifest's programs, or every ``X.p4`` with an ``X.stf`` beside it."""
    manifest = folder / "manifest.json"
    if manifest.is_file():
        try:
            programs = json.loads(manifest.read_text(encoding="utf-8"))["programs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ShadowgradError(f"{manifest}: not a corpus manifest ({e})") from None
        return list(programs)
    out: list[dict[str, object]] = []
    for p4 in sorted(folder.rglob("*.p4")):
        stf = p4.with_suffix(".stf")
        if stf.is_file():
            out.append(
                {
                    "name": p4.stem,
                    "p4": str(p4.relative_to(folder)),
                    "stf": str(stf.relative_to(folder)),
                }
            )
    if not out:
        raise ShadowgradError(f"{folder}: no manifest.json and no X.p4 with an X.stf beside it")
    return out


def _run_folder(args: argparse.Namespace) -> int:
    from .corpus import run_program, summary

    folder: Path = args.program
    results = [run_program(folder, e) for e in _folder_entries(folder)]
    if args.verbose:
        for r in results:
            print(f"{r.status:9s} {r.name}: {r.detail.splitlines()[0] if r.detail else ''}")
    print(summary(results))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 1 if any(r.status in ("fail", "internal") for r in results) else 0


def _run_one(args: argparse.Namespace) -> int:
    from .pipeline import P4CompileError, Pipeline
    from .stf import StfError, run_stf

    prog: Path = args.program
    stf_path: Path = args.stf if args.stf is not None else prog.with_suffix(".stf")
    try:
        text = stf_path.read_text(encoding="utf-8")
    except OSError as e:
        raise ShadowgradError(f"cannot read the STF file {stf_path}: {e}") from None
    try:
        pipe = Pipeline.compile(prog)
    except P4CompileError as e:
        for d in e.diagnostics:
            print(d)
        print(f"REJECTED {prog}")
        return 1
    paths = [False] + ([True] if pipe.fast_code is not None else [])
    runs = []
    for fast in paths:
        try:
            runs.append(run_stf(pipe, text, fast_path=fast, name=str(stf_path)))
        except StfError as e:
            print(f"{stf_path}: {e}")
            print(f"FAIL {prog}")
            return 1
    failed = False
    for fast, r in zip(paths, runs, strict=True):
        for err in r.errors:
            print(f"{'fast' if fast else 'general'} path: {err}")
            failed = True
    if len(runs) == 2 and runs[0].outputs != runs[1].outputs:
        print("the fast and general paths send different frames")
        failed = True
    r0 = runs[0]
    where = "general and fast paths" if len(runs) == 2 else "general path"
    verdict = "FAIL" if failed else "PASS"
    print(f"{verdict} {prog}: {r0.packets} packet(s), {r0.expects} expect(s), {where}")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    if args.program.is_dir():
        if args.stf is not None:
            raise ShadowgradError("a folder takes no STF file (each program has its own)")
        return _run_folder(args)
    if not args.program.is_file():
        raise ShadowgradError(f"no such program or folder: {args.program}")
    return _run_one(args)
