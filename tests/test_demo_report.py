"""The emulation demo's report (``shadowgrad.bmv2_testbed.report``) on synthetic run records: the
summary's figures and verdict, report.json, the PNG plots and the terminal summary."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from shadowgrad.bmv2_testbed import report as rp

T0 = 1_700_000_000.0
STEP_S = 0.05  # a normal step of the run
REF_STEP_S = 0.048  # the reference's mean step (unfaulted, with shadowgrad)
PLAIN_STEP_S = 0.040  # the same job's mean step without shadowgrad
RESTART_STEPS_S = (0.40, 0.20)  # the first two steps after the restart: start-up, cold caches
KILL_AT = 80  # trainer 1 is killed after iteration 80 ran, before the shadows had it
SHADOW_KILL_AT = 140
N_SHADOWS = 2
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _loss(it: int) -> float:
    return 2.3 * math.exp(-it / 60.0) + 0.1 + 0.01 * math.sin(it)


def make_record(iterations: int = 200) -> dict[str, Any]:
    """A realistic record: 200 iterations; trainer 1 killed right after executing iteration 80
    (its last logged step) while the shadows had committed only 79, so it resumes at 80 and 80
    runs twice after the restart (3 s later); shadow 0 killed at iteration 140 (detected in
    0.4 s, replaced in 2 s, no trainer work lost); samples every 0.2 s."""
    t = T0 + 1.0  # the trainers start a second after the run
    steps: list[list[Any]] = []
    kill_t = shadow_t = math.nan
    it = 0
    restarted = False
    while it < iterations:
        secs = STEP_S
        if restarted and it in (KILL_AT, KILL_AT + 1):
            secs = RESTART_STEPS_S[it - KILL_AT]
        t += secs
        steps.append([t, it, secs])
        if it == KILL_AT and not restarted:
            kill_t = t + 0.01
            t = kill_t + 3.0  # detection, torchrun restart, restore from the shadows
            restarted = True
            continue  # iteration 80 was not logged: it runs again
        if it == SHADOW_KILL_AT:
            shadow_t = t + 0.01
        it += 1
    ended = t + 0.5

    samples: list[list[Any]] = []
    s = steps[0][0]
    while s < ended:
        done = [row[1] for row in steps if row[0] <= s]
        trainer = done[-1]
        down = kill_t < s < kill_t + 3.0
        if down:
            trainer = KILL_AT - 1  # what the shadows hold while the trainers are down
        istar = max(trainer - 1, 0)
        applied: list[int | None] = []
        for j in range(N_SHADOWS):
            if down:
                applied.append(KILL_AT - 1)
            elif j == 0 and shadow_t <= s < shadow_t + 2.0:
                applied.append(None)  # shadow 0 is dead until its replacement catches up
            else:
                applied.append(max(trainer - 1 - j, 0))
        samples.append([s, None if down else trainer, None if down else istar, applied])
        s += 0.2

    losses = {str(i): _loss(i).hex() for i in range(iterations)}
    return {
        "scenario": {
            "name": "kill-trainer-and-shadow",
            "model": "mlp",
            "mode": "in-band",
            "trainers": 2,
            "shards": 4,
            "replication": 2,
            "iterations": iterations,
        },
        "topology": "loopback",
        "target": "sim",
        "started": T0,
        "ended": ended,
        "losses": {"run": dict(losses), "reference": dict(losses)},
        "step_times": steps,
        "samples": samples,
        "faults": [
            {
                "kind": "kill_trainer",
                "target": 1,
                "at_iteration": KILL_AT,
                "t_inject": kill_t,
                "t_detect": kill_t + 0.35,
                "t_recovered": kill_t + 3.0,
                "last_logged": KILL_AT,
                "resumed_at": KILL_AT,
                "lost_iterations": 1,
                "note": "SIGKILL rank 1",
            },
            {
                "kind": "kill_shadow",
                "target": 0,
                "at_iteration": SHADOW_KILL_AT,
                "t_inject": shadow_t,
                "t_detect": shadow_t + 0.4,
                "t_recovered": shadow_t + 2.0,
                "last_logged": None,
                "resumed_at": None,
                "lost_iterations": 0,
                "note": "SIGKILL shadow 0; spare promoted",
            },
        ],
        "switch": {
            "replicated_packets": 123_456,
            "replicated_bytes": 187_654_321,
            "drops": {"crc": 0, "no_route": 3},
        },
        "shadow_drops": {"stale_epoch": 12, "crc": 1},
        "bit_exact": {"resume": True, "compared": 24, "differ": []},
        "reference": {"cached": True, "seconds": 9.8, "mean_step_s": REF_STEP_S},
        "plain": {"cached": False, "seconds": 8.1, "mean_step_s": PLAIN_STEP_S, "steps": 200},
        "run_window": {"began": T0 - 1.0, "ended": ended + 2.0},
        "events": [
            {"t": kill_t + 0.35, "event": "trainer.failed", "rank": 1},
            {"t": shadow_t + 0.4, "event": "shadow.failed", "shadow": 0},
        ],
    }


def test_summary_figures() -> None:
    rec = make_record()
    s = rp.summarize(rec)
    assert s["ok"] is True, s["problems"]
    assert s["problems"] == []
    assert s["iterations"] == 200
    assert s["iterations_planned"] == 200
    assert s["steps_executed"] == 201
    assert s["repeated_steps"] == 1
    assert s["faults_by_kind"] == {"kill_shadow": 1, "kill_trainer": 1}
    kill, shadow = s["faults"]
    assert (kill["kind"], kill["class"], kill["lost_iterations"]) == ("kill_trainer", "trainer", 1)
    assert kill["repeated_observed"] == 1
    assert kill["detect_s"] == pytest.approx(0.35)
    assert kill["recover_s"] == pytest.approx(3.0)
    assert kill["within_bound"] is True
    assert (shadow["class"], shadow["lost_iterations"], shadow["repeated_observed"]) == (
        "shadow",
        0,
        0,
    )
    assert shadow["detect_s"] == pytest.approx(0.4)
    assert shadow["recover_s"] == pytest.approx(2.0)
    assert 0 < kill["t_inject_s"] < shadow["t_inject_s"] < s["wall_s"]

    # the trainer overhead: the unfaulted run with shadowgrad against the plain run
    over = s["trainer_overhead"]
    assert over["checkpointed_mean_step_s"] == REF_STEP_S
    assert over["plain_mean_step_s"] == PLAIN_STEP_S
    assert over["ratio"] == pytest.approx(REF_STEP_S / PLAIN_STEP_S)
    assert over["overhead_pct"] == pytest.approx((REF_STEP_S / PLAIN_STEP_S - 1) * 100)
    assert (over["checkpointed_cached"], over["plain_cached"]) == (True, False)
    # the faulted run against the unfaulted one: the two slow steps after the restart are left
    # out, the mean is the normal step time
    fvu = s["faulted_vs_unfaulted"]
    assert fvu["steps_excluded"] == 2
    assert fvu["steps_used"] == 199
    assert fvu["run_mean_step_s"] == pytest.approx(STEP_S)
    assert over["run_median_step_s"] == fvu["run_median_step_s"] == pytest.approx(STEP_S)
    assert fvu["ratio"] == pytest.approx(STEP_S / REF_STEP_S)
    assert fvu["pct"] == pytest.approx((STEP_S / REF_STEP_S - 1) * 100)
    assert s["contradictions"] == []

    assert s["switch_replicated_bytes"] == 187_654_321
    assert s["switch_replicated_packets"] == 123_456
    assert s["drops"]["by_reason"] == {"crc": 1, "no_route": 3, "stale_epoch": 12}
    assert s["drops"]["total"] == 16
    assert s["bit_exact_resume"] is True
    assert s["losses_match"] is True
    assert s["losses_compared"] == 200
    assert s["loss_mismatches"] == []
    lags = {g["shadow"]: g for g in s["shadow_lag"]}
    assert lags[0]["unreachable_samples"] > 0
    assert lags[1]["max_lag"] == 2
    json.dumps(s, allow_nan=False)  # plain JSON, no NaN


def test_loss_mismatch_names_the_iteration() -> None:
    rec = make_record()
    rec["losses"]["run"]["123"] = (_loss(123) + 1e-7).hex()
    s = rp.summarize(rec)
    assert s["losses_match"] is False
    assert s["ok"] is False
    assert s["loss_mismatch_count"] == 1
    assert s["loss_mismatches"][0]["iteration"] == 123
    assert any("iteration 123" in p for p in s["problems"])
    text = rp.render_summary(s)
    assert "123" in text
    assert "result: FAILED" in text


def test_missing_loss_is_a_mismatch() -> None:
    rec = make_record()
    del rec["losses"]["run"]["57"]
    s = rp.summarize(rec)
    assert s["losses_match"] is False and s["ok"] is False
    assert s["loss_mismatches"][0] == {"iteration": 57, "run": None, "reference": _loss(57).hex()}


def test_shadow_fault_that_lost_work_is_not_ok() -> None:
    rec = make_record()
    rec["faults"][1]["lost_iterations"] = 1
    s = rp.summarize(rec)
    assert s["ok"] is False
    assert s["faults"][1]["within_bound"] is False
    assert any("kill_shadow" in p and "lost 1" in p for p in s["problems"])


def test_trainer_fault_that_lost_two_is_not_ok() -> None:
    rec = make_record()
    rec["faults"][0]["lost_iterations"] = 2
    s = rp.summarize(rec)
    assert s["ok"] is False
    assert any("kill_trainer" in p for p in s["problems"])


def test_lost_iterations_derived_from_step_times() -> None:
    rec = make_record()
    for f in rec["faults"]:
        f["lost_iterations"] = None
    s = rp.summarize(rec)
    assert [(f["lost_iterations"], f["lost_source"]) for f in s["faults"]] == [
        (1, "step_times"),
        (0, "step_times"),
    ]
    assert s["ok"] is True


def test_not_bit_exact() -> None:
    rec = make_record()
    rec["bit_exact"] = {"resume": False, "compared": 24, "differ": ["fc1.weight", "exp_avg.3"]}
    s = rp.summarize(rec)
    assert s["bit_exact_resume"] is False and s["ok"] is False
    text = rp.render_summary(s, colour=True)
    assert "\x1b[" in text
    last = rp.render_summary(s).splitlines()[-1]
    assert last.startswith("bit-exact resume: NO (")
    assert "fc1.weight" in last


def test_write_report_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rec = make_record()
    out = tmp_path / "demo"
    report = rp.write_report(rec, out)
    assert report["plots"] == list(rp.PLOT_FILES)
    assert report["plots_skipped"] == {}
    loaded = json.loads((out / "report.json").read_text())
    assert loaded == report
    assert loaded["record"] == rec
    assert loaded["summary"]["ok"] is True
    assert not list(out.glob(".*tmp"))  # no temporary files left behind
    assert (out / "report.json").stat().st_mode & 0o044  # not mkstemp's 0600
    for name in rp.PLOT_FILES:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC, name
        assert len(data) > 15_000, (name, len(data))

    text = rp.render_summary(report)
    lines = text.splitlines()
    assert 12 <= len(lines) <= 25, text
    assert lines[-1] == "bit-exact resume: yes"
    assert "result: OK" in text
    assert "kill_trainer" in text and "kill_shadow" in text
    assert "178.96 MiB" in text  # 187,654,321 bytes
    assert "no_route 3" in text and "stale_epoch 12" in text
    assert "faulted run vs unfaulted: x1.042 (+4.2 %)" in text
    assert (
        "trainer overhead: x1.200 (+20.0 %), 48.00 ms/step with shadowgrad vs 40.00 ms without "
        "(unfaulted runs; the one with shadowgrad cached)"
    ) in text
    assert "loss.png" in text
    assert "\x1b[" not in text


def test_empty_record_skips_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rec: dict[str, Any] = {
        "scenario": {
            "name": "empty",
            "model": "mlp",
            "mode": "mirror",
            "trainers": 1,
            "shards": 1,
            "replication": 1,
            "iterations": 10,
        },
        "topology": "netns",
        "target": "bmv2",
        "started": T0,
        "ended": T0 + 1.0,
        "losses": {"run": {}, "reference": {}},
        "step_times": [],
        "samples": [],
        "faults": [],
        "switch": None,
        "shadow_drops": {},
        "bit_exact": {"resume": True, "compared": 0, "differ": []},
        "reference": {"cached": False, "seconds": 0.0, "mean_step_s": None},
    }
    report = rp.write_report(rec, tmp_path)
    assert report["plots"] == []
    assert set(report["plots_skipped"]) == set(rp.PLOT_FILES)
    assert not list(tmp_path.glob("*.png"))
    assert json.loads((tmp_path / "report.json").read_text()) == report
    s = report["summary"]
    assert s["ok"] is False  # nothing was compared
    assert s["trainer_overhead"]["ratio"] is None
    assert s["faulted_vs_unfaulted"]["ratio"] is None
    assert s["switch_replicated_bytes"] is None
    text = rp.render_summary(report)
    assert "switch: no counters" in text
    assert text.splitlines()[-1] == "bit-exact resume: yes"


def test_partly_empty_record(tmp_path: Path) -> None:
    """Losses but no samples and no faults: only the plots with data are made."""
    pytest.importorskip("matplotlib")
    rec = make_record(iterations=30)
    rec["samples"] = []
    rec["faults"] = []
    rec["step_times"] = [row for row in rec["step_times"] if row[1] < 30][:30]
    report = rp.write_report(rec, tmp_path)
    assert report["plots"] == ["loss.png", "step_time.png"]
    assert set(report["plots_skipped"]) == {"lag.png", "recovery.png"}


def test_garbage_tolerated(tmp_path: Path) -> None:
    """Odd values in the record (missing keys, nulls, non-numbers) never crash the report."""
    pytest.importorskip("matplotlib")
    rec = make_record(iterations=20)
    rec["faults"] = [
        {
            "kind": "reload_pipeline",
            "target": None,
            "at_iteration": None,
            "t_inject": T0 + 1.2,
            "t_detect": None,
            "t_recovered": None,
            "last_logged": None,
            "resumed_at": None,
            "lost_iterations": 0,
            "note": "",
        },
        {"kind": "something_new", "t_inject": None},
    ]
    rec["samples"].append([T0 + 0.5, None, None, [None, None]])
    rec["step_times"].append(["bad", None, 1])
    del rec["events"]
    del rec["switch"]
    report = rp.write_report(copy.deepcopy(rec), tmp_path)
    assert "recovery.png" in report["plots"]
    assert any("something_new" in n for n in report["summary"]["notes"])
    rp.render_summary(report)


def test_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    report = rp.write_report(make_record(), tmp_path)
    assert report["plots"] == []
    assert not list(tmp_path.glob("*.png"))
    text = rp.render_summary(report)
    assert "plots: skipped, matplotlib is not installed" in text
    assert text.splitlines()[-1] == "bit-exact resume: yes"


# ------------------------------------------------------------------------------- detection


def _pause_obs(down_s: float, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What the runner observed of a run with shadow 0 SIGSTOPped at T0 + 10 for ``down_s``
    (failure_detect 2 s), the job finishing at T0 + 40 (``events``: the controller's)."""
    t = T0 + 10.0
    return {
        "events": [
            *events,
            {"t": T0 + 40.0, "event": "controller.job_finished", "iteration": 99},
        ],
        "samples": [[t + 0.2 * i, 50 + i, 48 + i, [48 + i, 48 + i]] for i in range(200)],
        "failure_detect_s": 2.0,
        "faults": [
            {
                "kind": "pause_shadow",
                "target": 0,
                "at_iteration": 50,
                "t_inject": t,
                "t_detect": None,
                "t_recovered": None,
                "t_back": t + down_s,
                "down_s": down_s,
                "failure_detect_s": 2.0,
                "last_logged": 50,
                "resumed_at": None,
                "lost_iterations": 0,
                "note": "",
            }
        ],
    }


def test_pause_detection_is_the_event_that_noticed_it_not_a_later_one() -> None:
    from shadowgrad.bmv2_testbed.runner import _settle_faults

    late = {"t": T0 + 43.2, "event": "controller.shadow_failed", "shadow": 0}  # the teardown
    # a 1 s pause (under failure_detect): nothing noticed it; the shadow_failed at the end of
    # the run (33 s later) is not its detection
    obs = _pause_obs(1.0, [late])
    _settle_faults(obs)
    assert obs["faults"][0]["t_detect"] is None
    s = rp.summarize({**make_record(), "faults": obs["faults"]})
    assert s["faults"][0]["detect_s"] is None
    assert any("not detected (down 1 s, under failure_detect 2 s" in n for n in s["notes"])
    assert "   -" in rp.render_summary({"summary": s})
    # a 4 s pause: the controller noticed it after failure_detect, and that is the detection
    hit = {"t": T0 + 12.3, "event": "controller.shadow_failed", "shadow": 0}
    back = {"t": T0 + 14.2, "event": "controller.shadow_back", "shadow": 0}
    obs = _pause_obs(4.0, [hit, back, late])
    _settle_faults(obs)
    assert obs["faults"][0]["t_detect"] == T0 + 12.3
    # a 4 s pause the controller did not notice in time (nothing before t_back +
    # failure_detect): no detection, and a problem: it was long enough to be noticed
    obs = _pause_obs(4.0, [{"t": T0 + 30.0, "event": "controller.shadow_failed", "shadow": 0}])
    _settle_faults(obs)
    assert obs["faults"][0]["t_detect"] is None
    s = rp.summarize({**make_record(), "faults": obs["faults"]})
    assert any("not detected, although down 4 s" in n for n in s["problems"]), s["problems"]
    assert s["ok"] is False
    # another shadow's failure is not this one's detection
    obs = _pause_obs(4.0, [{"t": T0 + 12.3, "event": "controller.shadow_failed", "shadow": 1}])
    _settle_faults(obs)
    assert obs["faults"][0]["t_detect"] is None


def test_kill_detection_waits_for_the_restarted_shadow_but_not_past_its_return() -> None:
    from shadowgrad.bmv2_testbed.runner import _settle_faults

    obs = _pause_obs(1.0, [])
    obs["faults"][0]["kind"] = "kill_shadow"
    # the restarted process took 9 s to answer: the controller's detection 2.4 s after the kill
    # (after t_back) is this fault's; the one after its shadow_back is not
    obs["events"][:0] = [
        {"t": T0 + 12.4, "event": "controller.shadow_failed", "shadow": 0},
        {"t": T0 + 19.0, "event": "controller.shadow_back", "shadow": 0},
        {"t": T0 + 25.0, "event": "controller.shadow_failed", "shadow": 0},
    ]
    _settle_faults(obs)
    assert obs["faults"][0]["t_detect"] == T0 + 12.4
    obs["events"] = obs["events"][1:]  # only the later one: not this fault's detection
    obs["faults"][0]["t_detect"] = None
    _settle_faults(obs)
    assert obs["faults"][0]["t_detect"] is None


# ------------------------------------------------------------------------- contradictions


def _contra(s: dict[str, Any], text: str) -> bool:
    return any(text in c for c in s["contradictions"])


def test_a_report_of_two_runs_mixed_together_contradicts_itself() -> None:
    """Issue 22: a second demo into the same --out read the first run's logs along with its
    own: 600 steps executed, 300 repeated, a wall time of 1578 s for an 85 s run, a negative
    recovery, and still "result: OK". Each of these is a contradiction, and the result is
    FAILED with the reasons."""
    rec = make_record()
    earlier = make_record()
    shift = -1500.0
    old_steps = [[w + shift, it, dt] for w, it, dt in earlier["step_times"]]
    rec["step_times"] = old_steps + rec["step_times"]
    rec["started"] = old_steps[0][0]
    # the restart's "first step" was read from the earlier run's log
    rec["faults"][0]["t_recovered"] = old_steps[10][0]
    rec["events"].insert(0, {"t": T0 + shift, "event": "controller.started"})
    s = rp.summarize(rec)
    assert s["ok"] is False
    assert _contra(s, "fault 1 (kill_trainer 1): recover -") and _contra(s, "before the fault")
    assert _contra(s, "the record says 1 iteration(s) lost, the step times show")
    assert _contra(s, "step(s) repeated, but the faults account for 1")
    assert _contra(s, "201 step(s), 1 event(s), 1 fault time(s) outside this run's")
    assert _contra(s, "is longer than the run")
    assert _contra(s, "but the steps take")
    assert all(p.startswith("the report contradicts itself: ") for p in s["problems"][:3])
    text = rp.render_summary(s)
    result = next(line for line in text.splitlines() if line.startswith("result:"))
    assert result.startswith("result: FAILED, the report contradicts itself (")
    for c in s["contradictions"]:  # every contradiction is printed, none cut
        assert c in result
    assert "result: OK" not in text


def test_negative_detection_is_a_contradiction() -> None:
    rec = make_record()
    rec["faults"][1]["t_detect"] = rec["faults"][1]["t_inject"] - 1.0
    s = rp.summarize(rec)
    assert s["faults"][1]["detect_s"] == pytest.approx(-1.0)
    assert s["contradictions"] == [
        "fault 2 (kill_shadow 0): detect -1.000 s, before the fault was injected"
    ]
    assert s["ok"] is False


def test_lost_not_equal_to_repeated_is_a_contradiction() -> None:
    """The record says the kill lost nothing, the step times show iteration 80 twice."""
    rec = make_record()
    rec["faults"][0]["lost_iterations"] = 0
    s = rp.summarize(rec)
    assert s["ok"] is False
    assert s["contradictions"] == [
        "fault 1 (kill_trainer 1): the record says 0 iteration(s) lost, the step times show "
        "1 repeated",
        "1 step(s) repeated, but the faults account for 0 iteration(s) lost",
    ]
    assert "note: fault 1" not in rp.render_summary(s)  # no longer a mere note


def test_repeats_no_fault_explains_are_a_contradiction() -> None:
    rec = make_record()
    rec["faults"] = rec["faults"][1:]  # the trainer kill not in the record: 80 ran twice anyway
    s = rp.summarize(rec)
    assert s["repeated_steps"] == 1
    assert _contra(s, "1 step(s) repeated, but the faults account for 0 iteration(s) lost")
    assert s["ok"] is False


def test_a_trainer_kill_without_a_detection_is_not_ok() -> None:
    rec = make_record()
    rec["faults"][0]["t_detect"] = None
    s = rp.summarize(rec)
    assert s["ok"] is False and s["contradictions"] == []
    assert any(
        "no detection recorded (a trainer kill is always detected)" in p for p in s["problems"]
    )


def test_implausible_wall_time_is_a_contradiction() -> None:
    rec = make_record()
    rec["ended"] = rec["ended"] + 1000.0
    s = rp.summarize(rec)
    assert _contra(s, "is longer than the run") and _contra(s, "but the steps take")
    # without the run's window, the step times alone still show it
    del rec["run_window"]
    s = rp.summarize(rec)
    assert s["ok"] is False
    assert [c for c in s["contradictions"] if "wall time" in c] == [
        c for c in s["contradictions"] if "but the steps take" in c
    ]
    rec = make_record()
    rec["ended"] = rec["started"] - 5.0
    assert _contra(rp.summarize(rec), "is negative")
    # steps that add up to far more than the wall time: two runs' steps interleaved
    rec = make_record()
    rec["step_times"] = [[w, it, dt * 10] for w, it, dt in rec["step_times"]]
    assert _contra(rp.summarize(rec), "more than the")


def test_a_stale_event_is_a_contradiction() -> None:
    rec = make_record()
    rec["events"].append({"t": T0 - 500.0, "event": "controller.trainer_failed"})
    rec["samples"].insert(0, [T0 - 400.0, 3, 2, [1, 1]])
    s = rp.summarize(rec)
    window = rec["run_window"]["ended"] - rec["run_window"]["began"]
    assert s["contradictions"] == [
        f"1 sample(s), 1 event(s) outside this run's {window:.1f} s (from an earlier run's logs?)"
    ]
    assert s["ok"] is False


def test_overhead_lines_without_a_plain_run_and_of_an_older_summary() -> None:
    rec = make_record()
    del rec["plain"]
    s = rp.summarize(rec)
    assert s["ok"] is True  # the overhead is a figure, not a verdict
    text = rp.render_summary(s)
    assert "trainer overhead: n/a (no run without shadowgrad to compare with)" in text
    assert "faulted run vs unfaulted: x1.042 (+4.2 %), 50.00 vs 48.00 ms/step" in text
    # a summary written before the plain run existed (bench/results' sample): its only figure
    # was the faulted run against the unfaulted one, and it is labelled as such
    old = {k: v for k, v in rp.summarize(make_record()).items() if k != "faulted_vs_unfaulted"}
    old.pop("contradictions")
    old["trainer_overhead"] = {
        "run_mean_step_s": 0.06677,
        "reference_mean_step_s": 0.07246,
        "ratio": 0.921,
        "overhead_pct": -7.9,
        "steps_excluded": 2,
    }
    text = rp.render_summary(old)
    assert "trainer overhead: n/a (this report has no run without shadowgrad)" in text
    assert (
        "faulted run vs unfaulted: x0.921 (-7.9 %), 66.77 vs 72.46 ms/step "
        "(2 post-restart steps left out)"
    ) in text
    assert "result: OK" in text


def test_a_shadow_kill_training_outran_is_a_note_not_a_problem() -> None:
    """A shadow killed for 2.5 s (failure_detect 2 s) when training ends 1.8 s later: the
    controller stops watching at the end of training, so nothing could notice it (the CI run
    that failed on exactly this); the same kill with training going on is a problem."""
    from shadowgrad.bmv2_testbed.runner import _settle_faults

    obs = _pause_obs(2.5, [])
    obs["faults"][0]["kind"] = "kill_shadow"
    obs["events"] = [{"t": T0 + 11.8, "event": "controller.job_finished", "iteration": 99}]
    _settle_faults(obs)
    assert obs["faults"][0]["observable_s"] == pytest.approx(1.8)
    s = rp.summarize({**make_record(), "faults": obs["faults"]})
    assert not any("not detected" in p for p in s["problems"]), s["problems"]
    assert any("silence watchable for 1.8 s" in n for n in s["notes"]), s["notes"]
    obs = _pause_obs(3.5, [])
    obs["faults"][0]["kind"] = "kill_shadow"
    _settle_faults(obs)
    assert obs["faults"][0]["observable_s"] == pytest.approx(3.5)
    s = rp.summarize({**make_record(), "faults": obs["faults"]})
    assert any("not detected, although down 3.5 s" in n for n in s["problems"]), s["problems"]


@pytest.mark.parametrize("mode", ["in-band", "mirror"])
def test_an_overhead_below_one_says_why(mode: str) -> None:
    s = rp.summarize(make_record())
    s["mode"] = mode
    s["trainer_overhead"] = {
        **s["trainer_overhead"],
        "checkpointed_mean_step_s": 0.06895,
        "plain_mean_step_s": 0.07717,
        "ratio": 0.893,
        "overhead_pct": -10.7,
    }
    text = rp.render_summary(s)
    assert "trainer overhead: x0.893 (-10.7 %), 68.95 ms/step with shadowgrad vs 77.17" in text
    why = "no saving from checkpointing" if mode == "in-band" else "the step times' noise"
    assert "below x1: " in text and why in text
    # at x1 or above there is nothing to explain
    s["trainer_overhead"]["ratio"] = 1.02
    assert "below x1" not in rp.render_summary(s)
