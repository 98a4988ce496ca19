"""Helpers shared by several test modules: polling, wire records, the switch command line, the
soak tool."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowgrad import wire

ROOT = Path(__file__).resolve().parents[1]


def wait_for(pred: Callable[[], object], timeout_s: float, interval_s: float = 0.01) -> bool:
    """Poll ``pred`` every ``interval_s`` until it is true or ``timeout_s`` passed; whether it
    was true in the end (asked once more at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval_s)
    return bool(pred())


@dataclass(frozen=True)
class Records:
    """Encodes records of job ``job`` and layout (session digest) ``layout``, sealed with
    ``key``: rank 0's with sequence number ``seq`` unless a record says otherwise."""

    job: int
    layout: int
    key: bytes | None
    seq: int = 0

    def encode(self, kind: wire.Kind, payload: bytes = b"", it: int = 0, **kw: Any) -> bytes:
        """A ``kind`` record of iteration ``it``; ``kw`` overrides header fields or adds
        others (flags, dtype, bucket, offset)."""
        fields: dict[str, Any] = {
            "job": self.job,
            "sender": 0,
            "seq": self.seq,
            "layout": self.layout,
            "key": self.key,
        }
        return wire.encode(kind, iteration=it, payload=payload, **(fields | kw))


def switch_argv(*args: str) -> list[str]:
    """``sg-switch-grpc ARGS`` (as ``python -m``) serving P4Runtime on a free port of
    127.0.0.1, CPU port 255; it prints ``sg-switch-grpc ready grpc=HOST:PORT`` when it serves."""
    return [
        sys.executable,
        "-m",
        "shadowgrad.bmv2_testbed._switch_cmd",
        *args,
        "--",
        "--grpc-server-addr",
        "127.0.0.1:0",
        "--cpu-port",
        "255",
    ]


def spawn_switch(*args: str) -> subprocess.Popen[str]:
    """:func:`switch_argv` started with its stdout and stderr on pipes (text)."""
    return subprocess.Popen(
        switch_argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def run_soak(
    work: Path, out: Path, *args: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``tools/soak.py ARGS --work WORK --json OUT`` from the repository root; asserts that it
    wrote its JSON report (else shows the tails of its output)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "soak.py"),
            *args,
            "--work",
            str(work),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        check=False,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
