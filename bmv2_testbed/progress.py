"""The demo's progress on stderr: which run, iteration of total with a rate, and the faults as
they are injected, detected and recovered.

On a terminal it is one live line, redrawn at most 5 times a second, with each event printed
above it as it happens. Elsewhere (a pipe, a CI log) it is plain lines: one when a run begins,
one per tenth of the run's iterations (and at least one a minute while it moves), one per
event, one when the run ends. Never a flood: a 300-iteration run writes about a dozen lines.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

_REDRAW_S = 0.2
_PLAIN_EVERY_S = 60.0


class Progress:
    """``begin(label, total)``, ``step(iteration, istar)``, ``event(text)``, ``end()``."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None) -> None:
        self.out = stream or sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self.label = ""
        self.total = 0
        self.it = -1
        self.istar: int | None = None
        self.faults = 0
        self.t0 = time.monotonic()
        self._drawn = 0.0
        self._live = False
        self._plain_at = 0.0
        self._next_tenth = 1
        # while Mininet's CLI owns the terminal: no live line, no periodic lines (events and
        # the run's beginning and end are still printed: a few lines in all)
        self.quiet = False

    def _rate(self) -> float:
        dt = time.monotonic() - self.t0
        return (self.it + 1) / dt if dt > 0 and self.it >= 0 else 0.0

    def _line(self) -> str:
        n = max(self.total, 1)
        done = max(0, self.it + 1)
        bar = int(24 * min(done, n) / n)
        return (
            f"{self.label:>9} [{'#' * bar}{'.' * (24 - bar)}] {done}/{self.total} "
            f"{self._rate():5.1f} it/s  I* {self.istar if self.istar is not None else '-'}  "
            f"faults {self.faults}"
        )

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _clear(self) -> None:
        if self._live:
            self._write("\r\033[K")
            self._live = False

    def begin(self, label: str, total: int, note: str = "") -> None:
        self.label, self.total, self.it, self.istar, self.faults = label, total, -1, None, 0
        self.t0 = self._plain_at = time.monotonic()
        self._next_tenth = 1
        self.print(f"{label}: {total} iterations{' ' + note if note else ''}")

    def print(self, text: str) -> None:
        """A line of its own (above the live line on a terminal)."""
        self._clear()
        self._write(f"{text}\n")
        self._drawn = 0.0

    def step(self, it: int, istar: int | None = None, faults: int | None = None) -> None:
        self.it = max(self.it, it)
        if istar is not None:
            self.istar = istar
        if faults is not None:
            self.faults = faults
        if self.quiet:
            return
        now = time.monotonic()
        if self.tty:
            if now - self._drawn >= _REDRAW_S:
                self._write(f"\r{self._line()}\033[K")
                self._live, self._drawn = True, now
            return
        done = self.it + 1
        tenth = done * 10 // max(self.total, 1)
        if tenth >= self._next_tenth or (now - self._plain_at >= _PLAIN_EVERY_S and done > 0):
            self._next_tenth = tenth + 1
            self._plain_at = now
            self.print(
                f"{self.label}: iteration {done}/{self.total}, {self._rate():.1f} it/s"
                + (f", I* {self.istar}" if self.istar is not None else "")
            )

    def event(self, text: str) -> None:
        self.print(f"{self.label}: {text}")

    def end(self, text: str = "") -> None:
        dt = time.monotonic() - self.t0
        self.quiet = False
        self.print(
            f"{self.label}: done, {max(0, self.it + 1)} of {self.total} iterations in "
            f"{dt:.1f} s{'; ' + text if text else ''}"
        )
