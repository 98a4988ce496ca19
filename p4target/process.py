"""The switch binary as a child process: wait for ``sg-switch-grpc``'s ready line, stop it.

Used by :class:`~shadowgrad.bmv2_testbed.inband.JobSwitch` (the demo, the scenario runner) and by
the test harnesses (:mod:`shadowgrad.testing.bmv2`).
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import time
from typing import Any

from shadowgrad.errors import P4RuntimeError

__all__ = ["stop_process", "stop_switch", "wait_switch_ready"]


def wait_switch_ready(proc: subprocess.Popen[str], timeout_s: float = 30.0) -> str:
    """Read ``sg-switch-grpc``'s stdout until its ``sg-switch-grpc ready grpc=HOST:PORT`` line and
    return ``HOST:PORT``; raise :class:`P4RuntimeError` (with stderr's tail) if the process exits
    or ``timeout_s`` passes first. The process is left running either way."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            line = proc.stdout.readline()
            if line.startswith("sg-switch-grpc ready"):
                return line.split("grpc=")[1].split()[0]
            if not line and proc.poll() is not None:
                break
        elif proc.poll() is not None:
            break
    raise P4RuntimeError(f"switch did not start (exit {proc.poll()})")


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 10.0, kill_s: float = 5.0) -> None:
    """SIGTERM ``proc`` if it still runs, SIGKILL if it has not exited ``grace_s`` later, then
    wait up to ``kill_s`` for it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(kill_s)


def stop_switch(state: dict[str, Any]) -> None:
    """Close ``state["client"]`` and stop ``state["proc"]`` (SIGTERM, SIGKILL after 10 s),
    popping both (idempotent)."""
    client = state.pop("client", None)
    if client is not None:
        with contextlib.suppress(Exception):
            client.close()
    proc: subprocess.Popen[Any] | None = state.pop("proc", None)
    if proc is not None:
        stop_process(proc)
