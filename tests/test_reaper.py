"""The reaping fixture really reaps what a test leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _descendants, _reap


def test_descendants_and_reap() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert proc.pid in _descendants(os.getpid())
        _reap({proc.pid}, grace_s=5)
        assert not os.path.exists(f"/proc/{proc.pid}")  # killed *and* waited for
        assert proc.pid not in _descendants(os.getpid())
    finally:
        proc.kill()
        proc.wait(timeout=5)


def test_leak_is_reaped_with_a_warning(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(Path(__file__).with_name("conftest.py").read_text())
    pytester.makepyfile(
        """
        import subprocess, sys
        def test_leaks():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        """
    )
    result = pytester.runpytest_subprocess(
        "-W", "default", "-p", "no:cacheprovider", "-o", "markers=netns\nbmv2\nslow"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test left child processes*"])
