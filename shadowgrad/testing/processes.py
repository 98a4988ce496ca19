"""Child processes and waiting, for tests and benchmarks: :class:`Ranks` (a torchrun-style job's
ranks as processes), the P4 target's command line (:func:`switch_argv`, :func:`spawn_switch`),
the soak tool (:func:`run_soak`) and :func:`wait_for` (poll until true)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from shadowgrad.freeports import free_listen_port

__all__ = ["Ranks", "run_soak", "spawn_switch", "switch_argv", "wait_for"]

#: the source checkout this package is in (tools/, examples/): only an editable install has one
ROOT = Path(__file__).resolve().parents[2]


def wait_for(pred: Callable[[], object], timeout_s: float, interval_s: float = 0.01) -> bool:
    """Poll ``pred`` every ``interval_s`` until it is true or ``timeout_s`` passed; whether it
    was true in the end (asked once more at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval_s)
    return bool(pred())


class Ranks:
    """``world`` child processes of one torchrun-style job (RANK/WORLD_SIZE/MASTER_* set)."""

    def __init__(self, argv: list[str], world: int, env: dict[str, str], cwd: str) -> None:
        port = free_listen_port()  # below the ephemeral range: not taken before torch binds it
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        for r in range(world):
            e = {
                **os.environ,
                **env,
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(r),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
            }
            log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen(argv, env=e, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
            )

    def output(self, r: int) -> str:
        # pread, never seek+read: the child's stdout shares this file's offset (one open file
        # description across fork), so moving it made the child's next write land mid-file
        # and overwrite lines (seen: a loss line spliced with the tail of a later one)
        fd = self.logs[r].fileno()
        size = os.fstat(fd).st_size
        chunks = []
        off = 0
        while off < size:
            b = os.pread(fd, size - off, off)
            if not b:
                break
            chunks.append(b)
            off += len(b)
        return b"".join(chunks).decode(errors="replace")

    def wait(self, timeout_s: float) -> list[int | None]:
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(max(0.1, deadline - time.monotonic()))
        return [p.poll() for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(10)

    def close(self) -> None:
        self.kill()
        for f in self.logs:
            f.close()


def switch_argv(*args: str) -> list[str]:
    """``sg-switch-grpc ARGS`` (as ``python -m``) serving P4Runtime on a free port of
    127.0.0.1, CPU port 255; it prints ``sg-switch-grpc ready grpc=HOST:PORT`` when it serves."""
    return [
        sys.executable,
        "-m",
        "shadowgrad.p4target._switch_cmd",
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
    work: Path, out: Path, *args: str, timeout_s: float, plain_dir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``tools/soak.py ARGS --work WORK --json OUT`` from the source checkout's root, with
    ``--plain-dir`` where given (soaks that share train_plain.py's references); asserts that
    it wrote its JSON report (else shows the tails of its output)."""
    soak = ROOT / "tools" / "soak.py"
    if not soak.exists():
        raise FileNotFoundError(f"{soak}: run_soak needs a source checkout (an editable install)")
    proc = subprocess.run(
        [
            sys.executable,
            str(soak),
            *args,
            "--work",
            str(work),
            "--json",
            str(out),
            *(["--plain-dir", str(plain_dir)] if plain_dir is not None else []),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        check=False,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
