"""Shared fixtures: child-process reaping, logging isolation, marker gating, and a bound on
the interpreter's exit (a thread a failed test leaves behind must not hang CI)."""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest


def _children(pid: int) -> set[int]:
    """Direct children of ``pid`` from /proc (Linux); empty where /proc is unavailable."""
    out: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def _descendants(pid: int) -> set[int]:
    seen: set[int] = set()
    todo = [pid]
    while todo:
        for c in _children(todo.pop()):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def _reap(pids: set[int], grace_s: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
            for p in pids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p, os.WNOHANG)
            time.sleep(0.05)


@pytest.fixture(autouse=True)
def reap_children() -> Iterator[None]:
    """Every process a test starts is reaped: leftovers get SIGTERM, then SIGKILL, and a warning."""
    before = _descendants(os.getpid())
    yield
    leaked = _descendants(os.getpid()) - before
    if leaked:
        warnings.warn(f"test left child processes {sorted(leaked)}; reaping them", stacklevel=1)
        _reap(leaked)


@pytest.fixture(scope="session")
def plain_refs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the soaks of this session keep ``examples/train_plain.py``'s references (one per
    step count, ``tools/soak.py --plain-dir``): a step count's reference is computed once,
    not once per soak."""
    return tmp_path_factory.mktemp("plain-refs")


@pytest.fixture(autouse=True)
def isolate_root_logger() -> Iterator[None]:
    """A command run in-process (``cli.main``) replaces the root logger's handlers with one bound
    to this test's captured stderr, which pytest closes afterwards; later tests would then log
    into a closed file and lose pytest's own capture handlers. Restore the root logger."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


EXIT_GRACE_S = float(os.environ.get("SHADOWGRAD_TEST_EXIT_GRACE_S", "120"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Bound the interpreter's exit. A test that fails before its cleanup can leave a non-daemon
    thread blocked (a gRPC server's worker serving a stream that was never closed), and the
    interpreter joins those at exit: the run would hang after printing its summary. If the
    process is still alive ``EXIT_GRACE_S`` after the session ends, print every thread's stack
    and leave with the session's status (a failure if it had passed)."""

    def bound() -> None:
        time.sleep(EXIT_GRACE_S)
        left = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon]
        print(
            f"\npytest: still running {EXIT_GRACE_S:.0f} s after the session ended; "
            f"non-daemon threads left: {left}",
            file=sys.__stderr__,
            flush=True,
        )
        if sys.__stderr__ is not None:
            faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
        os._exit(int(exitstatus) or 1)

    threading.Thread(target=bound, name="exit-bound", daemon=True).start()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    have_bmv2 = bool(shutil.which("p4c") and shutil.which("simple_switch_grpc"))
    for item in items:
        if "netns" in item.keywords and not is_root:
            item.add_marker(pytest.mark.skip(reason="netns tests need root"))
        if "bmv2" in item.keywords and not have_bmv2:
            item.add_marker(pytest.mark.skip(reason="p4c and simple_switch_grpc not on PATH"))
