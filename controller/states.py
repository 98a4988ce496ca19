"""The controller's job state machine: its states, the events that move it, and the one table
of allowed transitions (:data:`TRANSITIONS`).

* ``starting`` --trainers_heard--> ``running``;
* any state --trainers_failed--> ``trainers_failed`` (silence seen by the watch, or a restart
  request that is itself the evidence) --restore_requested--> ``restoring``;
* ``trainers_failed`` or ``restoring`` --recovered--> ``running``;
* any state --finished--> ``finished`` --new_run--> ``running``.

A state is a ``str`` enum: it compares equal to, formats as and serialises to the same string
as before (``"running"``), so status replies, logs and JSON are unchanged. The controller moves
only through :func:`transition`; an event its state does not allow raises
:class:`IllegalTransitionError` (the controller's guards make that a bug, never a wire input).
"""

from __future__ import annotations

from enum import StrEnum
from typing import cast

from shadowgrad.fsm import TransitionError, TransitionTable, rule

__all__ = [
    "TRANSITIONS",
    "ControllerEvent",
    "ControllerState",
    "IllegalTransitionError",
    "transition",
]


class ControllerState(StrEnum):
    """What the controller believes about the job's trainers."""

    #: no trainer heard from yet since the controller started
    STARTING = "starting"
    #: trainers heard from within ``failure_detect``
    RUNNING = "running"
    #: trainers silent (or a restart requested): I* fixed and held, waiting for a restart
    TRAINERS_FAILED = "trainers_failed"
    #: restarted trainers asked for I* and are restoring from it
    RESTORING = "restoring"
    #: rank 0 closed after the last iteration: silence is no failure until a new run
    FINISHED = "finished"


class ControllerEvent(StrEnum):
    """What happened, as the controller saw it."""

    #: the shadows hear the trainers (first time since the controller started)
    TRAINERS_HEARD = "trainers_heard"
    #: trainers silent past ``failure_detect``, or a restart request the controller had not
    #: detected as a failure yet
    TRAINERS_FAILED = "trainers_failed"
    #: a restarted trainer asked for the published restore point
    RESTORE_REQUESTED = "restore_requested"
    #: the trainers send again (a newer generation, or the same one past I* + 1)
    RECOVERED = "recovered"
    #: rank 0's ``finished``: training ended
    FINISHED = "finished"
    #: after ``finished``, a newer generation of the job runs
    NEW_RUN = "new_run"


_S, _E = ControllerState, ControllerEvent


class IllegalTransitionError(TransitionError, ValueError):
    """``event`` is not allowed in ``state`` (not in :data:`TRANSITIONS`)."""

    @property
    def event(self) -> ControllerEvent:
        return cast(ControllerEvent, self.trigger)

    def explain(self) -> str:
        return f"controller: event {super().explain()}"


#: ``(state, event) -> next state``: every transition the controller may make. A pair not in
#: the table is impossible. A pair whose next state is its state keeps the state and only
#: updates the reason (no ``controller.state`` event, as for any non-change).
TRANSITIONS: TransitionTable[ControllerState, ControllerEvent] = TransitionTable(
    [
        rule(_S.STARTING, _E.TRAINERS_HEARD, _S.RUNNING),
        # a failure: silence seen by the watch, or a restart request (the request is the
        # evidence), from any state; from trainers_failed/restoring when the published point
        # is missing or failed (it is fixed again)
        rule(ControllerState, _E.TRAINERS_FAILED, _S.TRAINERS_FAILED),
        rule((_S.TRAINERS_FAILED, _S.RESTORING), _E.RESTORE_REQUESTED, _S.RESTORING),
        rule((_S.TRAINERS_FAILED, _S.RESTORING), _E.RECOVERED, _S.RUNNING),
        rule(ControllerState, _E.FINISHED, _S.FINISHED),
        rule(_S.FINISHED, _E.NEW_RUN, _S.RUNNING),
    ],
    error=IllegalTransitionError,
)


def transition(state: ControllerState, event: ControllerEvent) -> ControllerState:
    """The state ``event`` moves ``state`` to; :class:`IllegalTransitionError` if none."""
    return TRANSITIONS.move(state, event)
