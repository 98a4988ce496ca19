"""The controller's seams (shadowgrad/seams.py) with their in-memory fakes, and its state machine
(controller/states.py): every allowed transition of the one table, every other one refused, the
``controller.state`` event and the wire strings unchanged."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from shadowgrad.config import parse_spec
from shadowgrad.controller.service import Controller, ControllerOptions
from shadowgrad.controller.states import (
    TRANSITIONS,
    ControllerEvent,
    ControllerState,
    IllegalTransitionError,
    transition,
)
from shadowgrad.errors import ShadowgradError
from shadowgrad.seams import ShadowStatusSource, SwitchDriver
from shadowgrad.specs import loopback_spec
from shadowgrad.testing.fakes import FakeShadowStatuses, FakeSwitchDriver
from shadowgrad.testing.specs import TOKEN


def _controller(**kw: Any) -> Controller:
    """A controller of a 2-trainer, 2-shadow in-band job that ticks only when told (poll_s
    60 s) and converges the switch at every tick."""
    spec = parse_spec(loopback_spec(2, 2, mode="in-band"), env={})
    kw.setdefault("statuses", FakeShadowStatuses.silent(2))
    return Controller(
        spec, token=TOKEN, options=ControllerOptions(poll_s=60.0, converge_every_s=0.0), **kw
    )


# ------------------------------------------------------------------------------ seams
def test_the_fakes_are_the_seams() -> None:
    assert isinstance(FakeSwitchDriver(), SwitchDriver)
    assert isinstance(FakeShadowStatuses(), ShadowStatusSource)
    assert isinstance(lambda: {}, ShadowStatusSource)  # a plain callable is a source


def test_the_controller_calls_the_switch_driver_in_the_documented_order() -> None:
    """1. converge at start, 2. counters every tick (the switch-side heartbeat), 3. converge
    again every converge_every_s, writing only what drifted."""
    drv = FakeSwitchDriver(entries=5, world_size=2)
    src = FakeShadowStatuses.silent(2)
    with _controller(driver=drv, statuses=src) as ctl:
        assert drv.calls[:2] == ["converge", "counters"], drv.calls  # start: converge, tick
        first = ctl.converge_reports[0]
        assert first["initial"] and first["pipeline_pushed"] and first["writes"] == 5, first
        assert src.polls >= 1
        drv.calls.clear()
        drv.commits = [(3, 300), (4, 400)]
        drv.drift = 2  # two entries lost on the switch meanwhile
        ctl.tick()
        assert drv.calls == ["counters", "converge"], drv.calls
        assert ctl.trainers_signal()["switch_commits"] == 7
        rep = ctl.converge_reports[-1]
        assert not rep["initial"] and rep["writes"] == rep["inserted"] == 2, rep
        ctl.tick()
        assert ctl.converge_reports[-1]["writes"] == 0
        drv.fail_counters = drv.fail_converge = True  # counted, the tick goes on
        ctl.tick()
        assert ctl.ev["switch_counters_failed"] == 1 and ctl.ev["converge_failed"] == 1
        assert ctl.status()["switch"] == {"converge": ctl.converge_reports[-1]}
        # reload with a new driver: it converges at once
        new = FakeSwitchDriver(entries=1)
        rep2 = ctl.reload(ctl.spec, new)
        assert rep2 is not None and rep2["writes"] == 1 and new.calls == ["converge"]
        assert ctl.driver is new


def test_a_failing_first_convergence_aborts_the_start() -> None:
    ctl = _controller(driver=FakeSwitchDriver(fail_converge=True))
    try:
        with pytest.raises(RuntimeError, match="converge failed"):
            ctl.start()
        assert ctl.ev["converge_failed"] == 1
    finally:
        ctl.close()


def test_the_shadow_status_source_fake_marks_shadows_down() -> None:
    src = FakeShadowStatuses({0: None, 1: None})
    src.down.add(1)
    assert src() == {0: None, 1: None} and src.polls == 1
    with _controller(statuses=src) as ctl:
        assert src.polls >= 2  # the start's tick polled it
        assert all(not m.seen for m in ctl.members.values())
        assert ctl.trainers_signal()["shadows_reporting"] == 0


# ------------------------------------------------------------------------------ state machine
def test_the_states_keep_their_wire_strings() -> None:
    assert [s.value for s in ControllerState] == [
        "starting",
        "running",
        "trainers_failed",
        "restoring",
        "finished",
    ]
    assert ControllerState.RUNNING == "running" and f"{ControllerState.RUNNING}" == "running"
    assert json.dumps({"state": ControllerState.TRAINERS_FAILED}) == '{"state": "trainers_failed"}'


@pytest.mark.parametrize(("state", "what"), sorted(TRANSITIONS))
def test_every_allowed_transition(state: ControllerState, what: ControllerEvent) -> None:
    assert transition(state, what) is TRANSITIONS[(state, what)]


_ILLEGAL = [(s, e) for s in ControllerState for e in ControllerEvent if (s, e) not in TRANSITIONS]


def test_the_table() -> None:
    """The table as the controller documents it (docstring of controller/states.py)."""
    S, E = ControllerState, ControllerEvent  # noqa: N806
    expected = {
        (S.STARTING, E.TRAINERS_HEARD): S.RUNNING,
        (S.TRAINERS_FAILED, E.RESTORE_REQUESTED): S.RESTORING,
        (S.RESTORING, E.RESTORE_REQUESTED): S.RESTORING,
        (S.TRAINERS_FAILED, E.RECOVERED): S.RUNNING,
        (S.RESTORING, E.RECOVERED): S.RUNNING,
        (S.FINISHED, E.NEW_RUN): S.RUNNING,
        **{(s, E.TRAINERS_FAILED): S.TRAINERS_FAILED for s in S},
        **{(s, E.FINISHED): S.FINISHED for s in S},
    }
    assert dict(TRANSITIONS) == expected
    assert len(_ILLEGAL) == len(S) * len(E) - len(expected) > 0


@pytest.mark.parametrize(("state", "what"), _ILLEGAL)
def test_every_other_transition_is_refused(state: ControllerState, what: ControllerEvent) -> None:
    with pytest.raises(IllegalTransitionError) as ei:
        transition(state, what)
    assert isinstance(ei.value, ShadowgradError) and isinstance(ei.value, ValueError)
    assert (ei.value.state, ei.value.event) == (state, what)


def test_the_controller_moves_only_through_the_table_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="shadowgrad.controller.service")
    ctl = _controller()  # not started: no tick moves it meanwhile
    try:
        assert ctl.state == "starting" and ctl.status()["state"] == "starting"
        assert type(ctl.status()["state"]) is str
        with pytest.raises(IllegalTransitionError):
            ctl._transition(ControllerEvent.RECOVERED, "nothing failed")
        assert (ctl.state, ctl.reason) == ("starting", "started")  # unchanged
        walk = [
            (ControllerEvent.TRAINERS_HEARD, "running"),
            (ControllerEvent.TRAINERS_FAILED, "trainers_failed"),
            (ControllerEvent.RESTORE_REQUESTED, "restoring"),
            (ControllerEvent.RESTORE_REQUESTED, "restoring"),  # the reason only
            (ControllerEvent.RECOVERED, "running"),
            (ControllerEvent.FINISHED, "finished"),
            (ControllerEvent.NEW_RUN, "running"),
        ]
        for i, (what, new) in enumerate(walk):
            ctl._transition(what, f"step {i}")
            assert ctl.state == new and ctl.reason == f"step {i}"
        changes = [
            r.__dict__["fields"]
            for r in caplog.records
            if getattr(r, "event", None) == "controller.state"
        ]
        assert changes == [
            {"old": "starting", "new": "running", "reason": "step 0"},
            {"old": "running", "new": "trainers_failed", "reason": "step 1"},
            {"old": "trainers_failed", "new": "restoring", "reason": "step 2"},
            {"old": "restoring", "new": "running", "reason": "step 4"},
            {"old": "running", "new": "finished", "reason": "step 5"},
            {"old": "finished", "new": "running", "reason": "step 6"},
        ]
        assert all(type(c["old"]) is str and type(c["new"]) is str for c in changes)
    finally:
        ctl.close()
