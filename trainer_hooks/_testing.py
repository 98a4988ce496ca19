"""Test and demo helpers of the trainer side: loopback job specs with free ports (from
:mod:`shadowgrad._testing`), free ports and a launcher of DDP ranks as processes. Real shadow nodes
in-process are :mod:`shadowgrad.shadow.testing` (a peer package: not imported here). Nothing in a
training job needs this module.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from shadowgrad._testing import TOKEN, loopback_spec, spec_toml, switch_spec
from shadowgrad.freeports import free_port

__all__ = ["TOKEN", "loopback_spec", "switch_spec", "spec_toml", "free_port", "Ranks"]


class Ranks:
    """``world`` child processes of one torchrun-style job (RANK/WORLD_SIZE/MASTER_* set)."""

    def __init__(self, argv: list[str], world: int, env: dict[str, str], cwd: str) -> None:
        import os
        import subprocess
        import tempfile

        port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []
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
        import os

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
