"""p4c's bmv2 STF corpus through the software target (issue 26).

``run_corpus(folder)`` compiles every program of ``folder/manifest.json`` (the layout of
``../shared/p4c-stf``, see its README) with :class:`Pipeline`, runs its STF file on the fast path
(where the program has one) and on the general path, checks that both give the same frames, and
compares the P4Info with p4c's expected file. Each program gets one :class:`ProgramResult`:

* ``status``: ``pass`` (compiled, STF passed on every path), ``fail`` (compiled, the STF failed
  or the two paths differ), ``rejected`` (a located diagnostic), ``internal`` (anything else
  escaped the target: a bug, whatever the program).
* ``detail``: the first diagnostic or the first STF mismatch.
* ``p4info_identical``: whether the P4Info equals p4c's (None where p4c has no file).

``python -m shadowgrad.p4target.corpus [FOLDER] [--json OUT] [-v]`` prints the counts and the
rejections grouped by their first diagnostic.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .pipeline import P4CompileError, Pipeline
from .stf import run_stf

__all__ = ["ProgramResult", "diagnostic_group", "main", "run_corpus", "run_program"]

DEFAULT_FOLDER = Path(__file__).resolve().parents[1] / ".." / "shared" / "p4c-stf"


@dataclass
class ProgramResult:
    name: str
    status: str  # pass fail rejected internal
    detail: str = ""
    p4info_identical: bool | None = None
    fast_path: bool = False
    packets: int = 0
    expects: int = 0


def diagnostic_group(diag: str) -> str:
    """The message of a ``file:line:col: message`` diagnostic with names, numbers and quoted
    text replaced, so that the same rejection in different programs groups together."""
    msg = re.sub(r"^.*?:\d+:\d+: ", "", diag)
    msg = re.sub(r"'[^']*'", "'…'", msg)
    msg = re.sub(
        r"\b(type|field|name|action|table|header|state|member|of|function|method)"
        r" [A-Za-z_][\w.]*",
        r"\1 X",
        msg,
    )
    return re.sub(r"\b\d+\b", "N", msg)


def _p4info_identical(pipe: Pipeline, expected: Path) -> bool:
    from google.protobuf import text_format  # type: ignore[import-untyped]
    from p4.config.v1 import p4info_pb2

    want = p4info_pb2.P4Info()
    text_format.Parse(expected.read_text(), want)
    return bool(_canonical(pipe.p4info) == _canonical(want))


def _canonical(info: Any) -> Any:
    """The P4Info with every repeated top-level entity sorted by id (p4c's order is its own
    and carries no meaning) and an empty ``type_info`` dropped."""
    out = type(info)()
    out.CopyFrom(info)
    for fd in out.DESCRIPTOR.fields:
        if fd.label == fd.LABEL_REPEATED and fd.message_type is not None:
            items = list(getattr(out, fd.name))
            if items and hasattr(items[0], "preamble"):
                items.sort(key=lambda m: m.preamble.id)
                del getattr(out, fd.name)[:]
                getattr(out, fd.name).extend(items)
    if out.HasField("type_info") and out.type_info.ByteSize() == 0:
        out.ClearField("type_info")
    return out


def run_program(folder: Path, entry: dict[str, object]) -> ProgramResult:
    name = str(entry["name"])
    p4 = folder / str(entry["p4"])
    try:
        pipe = Pipeline.compile(p4)
    except P4CompileError as e:
        return ProgramResult(name, "rejected", e.diagnostics[0] if e.diagnostics else "")
    except Exception as e:  # the whole point: nothing else may escape
        tb = traceback.format_exception_only(type(e), e)[-1].strip()
        return ProgramResult(name, "internal", f"compile: {tb}")
    res = ProgramResult(name, "pass", fast_path=pipe.fast_code is not None)
    info = entry.get("p4info")
    if info:
        res.p4info_identical = _p4info_identical(pipe, folder / str(info))
    stf = (folder / str(entry["stf"])).read_text()
    try:
        runs = [run_stf(pipe, stf, fast_path=False, name=name)]
        if pipe.fast_code is not None:
            runs.append(run_stf(pipe, stf, fast_path=True, name=name))
    except Exception as e:
        tb = traceback.format_exception_only(type(e), e)[-1].strip()
        res.status, res.detail = "internal", f"run: {tb}"
        return res
    res.packets, res.expects = runs[0].packets, runs[0].expects
    for r, path in zip(runs, ("general", "fast"), strict=False):
        if not r.ok:
            res.status, res.detail = "fail", f"{path} path: {r.errors[0]}"
            return res
    if len(runs) == 2 and runs[0].outputs != runs[1].outputs:
        res.status, res.detail = "fail", "the fast and general paths send different frames"
    return res


def run_corpus(folder: Path = DEFAULT_FOLDER) -> list[ProgramResult]:
    manifest = json.loads((folder / "manifest.json").read_text())
    return [run_program(folder, e) for e in manifest["programs"]]


def summary(results: Sequence[ProgramResult]) -> str:
    n = len(results)
    compiled = [r for r in results if r.status in ("pass", "fail")]
    passed = [r for r in results if r.status == "pass"]
    same = [r for r in compiled if r.p4info_identical]
    with_info = [r for r in compiled if r.p4info_identical is not None]
    lines = [
        f"{n} programs: {len(compiled)} compile, {len(passed)} pass their STF "
        f"({sum(r.packets for r in passed)} packets, {sum(r.expects for r in passed)} expects; "
        f"{sum(1 for r in compiled if not r.fast_path)} on the general path only), "
        f"P4Info identical for {len(same)} of {len(with_info)}",
    ]
    for status in ("fail", "internal"):
        for r in results:
            if r.status == status:
                lines.append(f"  {status}: {r.name}: {r.detail}")
    groups = Counter(diagnostic_group(r.detail) for r in results if r.status == "rejected")
    lines.append(f"rejected: {sum(groups.values())}")
    for msg, c in groups.most_common():
        lines.append(f"  {c:3d}  {msg}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("folder", nargs="?", type=Path, default=DEFAULT_FOLDER)
    ap.add_argument("--json", type=Path, default=None, help="write every program's result")
    ap.add_argument("-v", action="store_true", help="list every program")
    ap.add_argument(
        "--record",
        type=Path,
        default=None,
        help="write the per-program record tests/test_p4_stf.py holds the target to (a folder)",
    )
    a = ap.parse_args(argv)
    results = run_corpus(a.folder)
    if a.v:
        for r in results:
            print(f"{r.status:9s} {r.name}: {r.detail.splitlines()[0] if r.detail else ''}")
    print(summary(results))
    if a.record is not None:
        status = {r.name: r.status for r in results}
        p4info = {r.name: r.p4info_identical for r in results if r.status == "pass"}
        for fname, doc in (("p4c_stf_results.json", status), ("p4c_stf_p4info.json", p4info)):
            (a.record / fname).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    if a.json is not None:
        a.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
