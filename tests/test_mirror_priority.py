"""The mirror sender's priority (trainer_hooks/_priority.py): DATA at SCHED_IDLE while the sender
keeps up, its own policy again for everything else, when it falls behind, or when a slot was in
the background too long."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from shadowgrad.trainer_hooks._priority import ThreadPriority, background_available
from tests.test_trainer_heal import _mirror

needs_sched = pytest.mark.skipif(
    not background_available(), reason="this process cannot come back from SCHED_IDLE"
)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: torch.randn_like(p) for n, p in model.named_parameters()}


def _policy(tid: int) -> int:
    return os.sched_getscheduler(tid)


@needs_sched
def test_thread_priority_lowers_and_restores_the_bound_thread_from_another_thread() -> None:
    prio = ThreadPriority(True)
    bound = threading.Event()
    done = threading.Event()
    tid: list[int] = []

    def target() -> None:
        prio.bind()
        tid.append(threading.get_native_id())
        bound.set()
        done.wait(10.0)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    try:
        assert bound.wait(10.0)
        before = _policy(tid[0])
        prio.lower()
        assert prio.low and _policy(tid[0]) == os.SCHED_IDLE
        prio.lower()  # already low: nothing changes, counted once
        assert prio.lowered == 1
        prio.restore(behind=True)  # from this thread, as a capture does
        assert not prio.low and _policy(tid[0]) == before
        assert (prio.behind, prio.overdue) == (1, 0)
        prio.restore(behind=True)  # not low: nothing to do, not counted
        assert prio.behind == 1
    finally:
        done.set()
        t.join(10.0)


def test_thread_priority_disabled_never_touches_the_thread() -> None:
    prio = ThreadPriority(False)
    prio.bind()
    prio.lower()
    assert not prio.low and prio.lowered == 0
    assert _policy(0) != getattr(os, "SCHED_IDLE", -1)


@needs_sched
def test_sender_sends_data_in_the_background_and_everything_else_at_its_own_policy() -> None:
    with _mirror() as (model, _layout, sink, snd, _addr):
        tid = snd._thread.native_id
        assert tid is not None
        before = _policy(tid)
        for it in range(3):
            assert snd.capture(it, _grads(model))
            assert snd.flush(10.0)
        st = snd.stats()
        assert st["background_slots"] == 3 and st["dropped_iterations"] == 0
        assert _policy(tid) == before != os.SCHED_IDLE  # back after every slot
        got = 0
        sink.settimeout(0.5)
        while True:
            try:
                sink.recv(70000)
            except TimeoutError:
                break
            got += 1
        assert got == st["data_chunks"] > 0


@needs_sched
def test_a_capture_while_the_previous_one_is_sent_in_the_background_restores_the_sender() -> None:
    with _mirror() as (model, _layout, _sink, snd, _addr):
        tid = snd._thread.native_id
        assert tid is not None
        # the sender is (as if) in the middle of a slot at SCHED_IDLE: the next capture must put
        # it back at once, whatever it is doing
        with snd._lock:
            snd.priority.lower()
        assert _policy(tid) == os.SCHED_IDLE
        assert snd.capture(0, _grads(model))
        assert _policy(tid) != os.SCHED_IDLE
        assert snd.flush(10.0)
        assert snd.stats()["background_behind"] == 1


@needs_sched
def test_a_slot_in_the_background_longer_than_a_heartbeat_goes_back_to_normal_priority() -> None:
    with _mirror(heartbeat_s=0.0) as (model, _layout, _sink, snd, _addr):
        # heartbeat 0: the first poll point finds the slot overdue (a poll every 4 KiB chunk:
        # the slot is 129 KiB)
        snd._POLL_BYTES = 4096
        assert snd.capture(0, _grads(model))
        assert snd.flush(10.0)
        st = snd.stats()
        assert st["background_slots"] == 1 and st["background_overdue"] == 1


def test_background_sender_false_sends_at_normal_priority() -> None:
    with _mirror(background=False) as (model, _layout, _sink, snd, _addr):
        assert snd.capture(0, _grads(model))
        assert snd.flush(10.0)
        st = snd.stats()
        assert st["background_slots"] == 0 and st["data_chunks"] > 0
