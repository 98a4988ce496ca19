"""The demo's progress output (bmv2_testbed/progress.py): plain lines off a terminal (a run's
start and end, one per tenth, one per event: never a flood), a live line on one."""

from __future__ import annotations

import io

from shadowgrad.bmv2_testbed.progress import Progress


def test_plain_lines_name_the_run_the_iteration_and_the_events_and_do_not_flood() -> None:
    out = io.StringIO()
    p = Progress(out, tty=False)
    p.begin("reference", 300, "(the reference)")
    for it in range(300):
        p.step(it, istar=max(0, it - 3), faults=0)
        if it == 100:
            p.event("fault kill_trainer (rank 2) injected at iteration 100")
    p.end()
    lines = out.getvalue().splitlines()
    assert lines[0] == "reference: 300 iterations (the reference)"
    assert "reference: fault kill_trainer (rank 2) injected at iteration 100" in lines
    assert lines[-1].startswith("reference: done, 300 of 300 iterations in ")
    steps = [line for line in lines if line.startswith("reference: iteration ")]
    assert len(steps) == 10, lines  # one per tenth
    assert steps[0].startswith("reference: iteration 30/300, ") and "it/s" in steps[0]
    assert steps[-1].startswith("reference: iteration 300/300, ")
    assert "\r" not in out.getvalue()


def test_live_line_on_a_terminal_is_redrawn_and_events_go_above_it() -> None:
    out = io.StringIO()
    p = Progress(out, tty=True)
    p.begin("run", 10)
    p.step(0, istar=None, faults=0)
    p.event("fault kill_shadow (shadow 1) injected at iteration 0")
    p.step(1)
    text = out.getvalue()
    assert "\r      run [" in text and "1/10" in text
    # the event clears the live line, is printed on a line of its own, and the line comes back
    assert "\r\033[Krun: fault kill_shadow (shadow 1) injected at iteration 0\n" in text
    assert text.rstrip("\033[K").endswith("faults 0") and "2/10" in text.split("\n")[-1]


def test_quiet_keeps_the_events_only() -> None:
    out = io.StringIO()
    p = Progress(out, tty=False)
    p.begin("run", 10)
    p.quiet = True
    for it in range(10):
        p.step(it)
    p.event("fault x injected")
    assert out.getvalue().splitlines() == ["run: 10 iterations", "run: fault x injected"]
