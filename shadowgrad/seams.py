"""The seams between shadowgrad's parts, as Protocols.

A seam is what one part calls on another that may be replaced: the controller programs the
switch through a :class:`SwitchDriver` and polls the shadows through a
:class:`ShadowStatusSource`. Each Protocol lists exactly the members its caller uses and, in its
docstring, the order in which it calls them; an in-memory fake of each, for tests, is in
:mod:`shadowgrad.testing.fakes` (mypy checks the fakes against these Protocols there).

Core (this module) imports nothing beyond the standard library and core: the real
implementations live in the subpackages (:class:`shadowgrad.controller.switch.SwitchDriver`
programs a P4Runtime switch) and satisfy these Protocols structurally.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from shadowgrad.messages import StatusLike

__all__ = ["ConvergeCounts", "ConvergeResult", "ShadowStatusSource", "SwitchDriver"]


# ------------------------------------------------------------------------------ switch driver
class ConvergeResult(Protocol):
    """What one :meth:`SwitchDriver.converge` wrote, as the controller reports it (counts of
    P4Runtime updates; :class:`shadowgrad.controller.switch.ConvergeReport` is the real one)."""

    @property
    def writes(self) -> int:
        """Every update written (entries and multicast groups); 0: the switch was right."""
        ...

    @property
    def pipeline_pushed(self) -> bool:
        """The pipeline (P4 program) had to be pushed first."""
        ...

    @property
    def inserted(self) -> int: ...

    @property
    def modified(self) -> int: ...

    @property
    def deleted(self) -> int: ...


@dataclass
class ConvergeCounts:
    """A :class:`ConvergeResult` as plain fields (the fake driver's; the P4Runtime driver's
    report adds the multicast groups)."""

    pipeline_pushed: bool = False
    inserted: int = 0
    modified: int = 0
    deleted: int = 0

    @property
    def writes(self) -> int:
        return self.inserted + self.modified + self.deleted


@runtime_checkable
class SwitchDriver(Protocol):
    """Programs one job onto the switch, for the controller (in-band mode).

    The controller (:class:`shadowgrad.controller.service.Controller`) calls, in this order:

    1. :meth:`converge` once in ``Controller.start``, before it serves anything or polls: the
       switch is made to hold exactly the job's entries and groups. An exception here aborts
       the start (it is logged as ``controller.converge_failed`` and re-raised).
    2. :meth:`counters` once per watch tick (every ``poll_s``), from the watch thread, under the
       controller's lock: ``counters()["commits"]`` (a sequence, or a mapping by rank, of
       ``(packets, bytes)`` per trainer) is the switch-side heartbeat. An exception is counted
       (``switch_counters_failed``) and the tick goes on.
    3. :meth:`converge` again every ``converge_every_s`` (after a tick) and once after
       ``Controller.reload``: it must be idempotent, writing only what differs (invariant 6).
       An exception is counted (``converge_failed``), logged and retried at the next period.

    ``reload`` may replace the driver object; the new one is then called from step 3 on.
    Steps 2 and 3 run on the controller's watch thread, reload's converge on the caller's
    thread, and the converges are not serialised with each other: an implementation must
    tolerate calls from more than one thread.
    """

    def converge(self) -> ConvergeResult:
        """Make the switch hold exactly this job's desired state; what was written."""
        ...

    def counters(self) -> Mapping[str, Any]:
        """This job's switch counters; the controller reads ``"commits"``."""
        ...


# ------------------------------------------------------------------------------ shadow statuses
@runtime_checkable
class ShadowStatusSource(Protocol):
    """Every shadow's status, for the controller: ``{shadow id: status, or None when it did not
    answer}``, a status typed (:class:`~shadowgrad.messages.ShadowStatus`) or as the dict a
    shadow serves. A plain function or lambda is one.

    The controller calls it, from its watch thread under its lock unless said otherwise:

    1. once in ``Controller.start`` (the first tick), then once per tick every ``poll_s``;
    2. repeatedly while it fixes I* (``fix_restore_point`` polls until the sources settle);
    3. once per ``restore_point`` request that is not served from the published point (on
       the control endpoint's thread).

    It must return promptly (a shadow that does not answer is None, never a wait for it) and
    should name every shadow id ``0..count-1`` (a missing id reads as not answering).
    The default source polls each shadow's control endpoint in parallel.
    """

    def __call__(self) -> Mapping[int, StatusLike | None]: ...
