"""The emulation demo's report: a run record in; ``report.json``, PNG plots and a terminal summary
out.

The demo runner runs a scenario (trainers, shadows, a controller and a P4 switch on one machine,
faults injected) and hands over a *run record*: a JSON-shaped dict with the scenario, the losses
of the run and of a fault-free reference, the step time of the same job run without shadowgrad
(``plain``), the window the run took place in, rank 0's step times, ~5 Hz samples of the trainer
iteration, I* and every shadow's ``last_applied``, the injected faults with their detection and
recovery times, the switch's replication counters, drop counters and the bit-exactness check of
the resumed state. This module is a pure transformation of that record:

* :func:`summarize` computes the figures (work lost per fault, detection and recovery times,
  the trainer overhead: the unfaulted checkpointed run against the plain one; the faulted run
  against the unfaulted one, replicated bytes, drops, bit-exactness, whether every loss equals
  the reference's), checks that they do not contradict each other (:func:`contradictions`) and
  gives the verdict ``ok``;
* :func:`write_report` writes ``report.json`` (atomically) and the plots ``loss.png``,
  ``step_time.png``, ``lag.png`` and ``recovery.png``;
* :func:`render_summary` formats the summary for a terminal.

matplotlib is imported lazily (and only its Agg canvas is used: no display, no pyplot state); when
it is missing the plots are skipped with a note and nothing else changes. All times in the record
are wall-clock seconds (``time.time()``); the summary reports them relative to ``started``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import statistics
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "FAULT_CLASS",
    "MAX_LOST",
    "PLOT_FILES",
    "RESTART_WARMUP_STEPS",
    "contradictions",
    "render_summary",
    "summarize",
    "write_report",
]

log = logging.getLogger(__name__)

#: What each fault kind hits. Only a trainer fault may make the trainers repeat work.
FAULT_CLASS: dict[str, str] = {
    "kill_trainer": "trainer",
    "kill_shadow": "shadow",
    "pause_shadow": "shadow",
    "restart_controller": "infrastructure",
    "loss": "infrastructure",
    "reload_pipeline": "infrastructure",
}

#: The most iterations a fault of each class may cost (iterations the trainers execute twice).
#: A trainer kill re-executes at most the one iteration that was not logged yet; shadows, the
#: controller, packet loss and a pipeline reload never make the trainers repeat work.
MAX_LOST: dict[str, int] = {"trainer": 1, "shadow": 0, "infrastructure": 0}

#: What a detection may lag the end of the silence that caused it: a controller tick and a poll.
DETECT_SLACK_S = 1.0

#: Steps at the start of each resumed segment left out of the trainer's mean step time (process
#: start-up, re-connection, cold caches after a restart).
RESTART_WARMUP_STEPS = 2

#: The plots :func:`write_report` makes, in order.
PLOT_FILES: tuple[str, ...] = ("loss.png", "step_time.png", "lag.png", "recovery.png")

_DPI = 110
_MAX_LISTED = 10  # mismatching iterations / differing tensors listed in the summary

_KIND_COLOURS: dict[str, str] = {
    "kill_trainer": "#d62728",
    "kill_shadow": "#9467bd",
    "pause_shadow": "#ff7f0e",
    "restart_controller": "#8c564b",
    "loss": "#7f7f7f",
    "reload_pipeline": "#17becf",
}
_SHADOW_COLOURS = (
    "#1f77b4",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
)


# --------------------------------------------------------------------------- record access


def _num(value: Any) -> float | None:
    """``value`` as a finite float, or None (None, bools, non-numbers, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
    return None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: Any) -> Sequence[Any]:
    return value if isinstance(value, (list, tuple)) else ()


def _hex(value: Any) -> str | None:
    """A loss as its ``float.hex()`` string (floats are converted; anything else is None)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value).hex()
    return None


def _losses(record: Mapping[str, Any], which: str) -> dict[int, str]:
    """``losses[which]`` as {iteration: hex string}, sorted by iteration."""
    out: dict[int, str] = {}
    for key, value in _map(_map(record.get("losses")).get(which)).items():
        it, hx = _int(key), _hex(value)
        if it is not None and hx is not None:
            out[it] = hx
    return dict(sorted(out.items()))


def _loss_value(hx: str) -> float:
    try:
        return float.fromhex(hx)
    except (ValueError, OverflowError):
        return math.nan


def _steps(record: Mapping[str, Any]) -> list[tuple[float, int, float]]:
    """``step_times`` as (wall, iteration, seconds), in wall-clock order."""
    out: list[tuple[float, int, float]] = []
    for entry in _seq(record.get("step_times")):
        row = _seq(entry)
        if len(row) < 3:
            continue
        wall, it, secs = _num(row[0]), _int(row[1]), _num(row[2])
        if wall is not None and it is not None and secs is not None:
            out.append((wall, it, secs))
    out.sort(key=lambda r: r[0])
    return out


def _samples(
    record: Mapping[str, Any],
) -> list[tuple[float, int | None, int | None, list[int | None]]]:
    """``samples`` as (wall, trainer iteration, I*, [last_applied per shadow]), in time order."""
    out: list[tuple[float, int | None, int | None, list[int | None]]] = []
    for entry in _seq(record.get("samples")):
        row = _seq(entry)
        if len(row) < 3:
            continue
        wall = _num(row[0])
        if wall is None:
            continue
        shadows = [_int(v) for v in _seq(row[3])] if len(row) > 3 else []
        out.append((wall, _int(row[1]), _int(row[2]), shadows))
    out.sort(key=lambda r: r[0])
    return out


def _faults(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    faults = [_map(f) for f in _seq(record.get("faults"))]
    return sorted(faults, key=lambda f: _num(f.get("t_inject")) or math.inf)


def _time_marks(faults: list[Mapping[str, Any]], started: float) -> list[tuple[float, str]]:
    """(seconds since ``started``, kind) of each fault with an injection time."""
    return [
        (t - started, str(f.get("kind")))
        for f in faults
        if (t := _num(f.get("t_inject"))) is not None
    ]


def _shade_faults(axes: Sequence[Any], faults: list[Mapping[str, Any]], started: float) -> None:
    """Shade each fault's outage (injected to recovered) on every axis, in its kind's colour."""
    for f in faults:
        t0, t1 = _num(f.get("t_inject")), _num(f.get("t_recovered"))
        if t0 is not None and t1 is not None and t1 > t0:
            for a in axes:
                a.axvspan(
                    t0 - started,
                    t1 - started,
                    color=_KIND_COLOURS.get(str(f.get("kind")), "#444444"),
                    alpha=0.08,
                    zorder=0,
                )


def _counts(value: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for reason, n in _map(value).items():
        count = _int(n)
        if count is not None:
            out[str(reason)] = count
    return dict(sorted(out.items()))


def _started(record: Mapping[str, Any]) -> float:
    """The run's start: ``started``, else the earliest time in the record, else 0."""
    started = _num(record.get("started"))
    if started is not None:
        return started
    times = [s[0] for s in _steps(record)] + [s[0] for s in _samples(record)]
    times += [t for f in _faults(record) if (t := _num(f.get("t_inject"))) is not None]
    return min(times) if times else 0.0


# --------------------------------------------------------------------------- segments


def _segments(
    steps: Sequence[tuple[float, int, float]], faults: Sequence[Mapping[str, Any]]
) -> list[tuple[int, int | None]]:
    """Split ``steps`` into execution segments: [(index of the first step, index of the fault
    that ended the previous segment or None)], the first segment included (cause None).

    A new segment starts at the first step after a trainer fault's injection, and wherever the
    iteration does not increase (a restart from an earlier iteration, whatever caused it; such a
    boundary is blamed on the latest fault injected before it, if any)."""
    kills = [
        (t, i)
        for i, f in enumerate(faults)
        if FAULT_CLASS.get(str(f.get("kind"))) == "trainer"
        and (t := _num(f.get("t_inject"))) is not None
    ]
    injected = [(t, i) for i, f in enumerate(faults) if (t := _num(f.get("t_inject"))) is not None]
    out: list[tuple[int, int | None]] = []
    for k, (wall, it, _) in enumerate(steps):
        if k == 0:
            out.append((0, None))
            continue
        prev_wall, prev_it, _ = steps[k - 1]
        killed = [i for t, i in kills if prev_wall < t <= wall]
        if killed:
            out.append((k, killed[-1]))
        elif it <= prev_it:
            before = [i for t, i in injected if t <= wall]
            out.append((k, before[-1] if before else None))
    return out


def _step_analysis(
    steps: Sequence[tuple[float, int, float]], faults: Sequence[Mapping[str, Any]]
) -> tuple[set[int], set[int], dict[int, int]]:
    """(indices of post-restart warm-up steps, indices of repeated executions, {fault index:
    repeated executions in the segment it started})."""
    segs = _segments(steps, faults)
    warmup: set[int] = set()
    repeated: set[int] = set()
    per_fault: dict[int, int] = {}
    seen: set[int] = set()
    bounds = [s for s, _ in segs] + [len(steps)]
    for n, (start, cause) in enumerate(segs):
        end = bounds[n + 1]
        if n > 0:
            warmup.update(range(start, min(start + RESTART_WARMUP_STEPS, end)))
        count = 0
        for k in range(start, end):
            it = steps[k][1]
            if it in seen:
                repeated.add(k)
                count += 1
            seen.add(it)
        if cause is not None:
            per_fault[cause] = per_fault.get(cause, 0) + count
    return warmup, repeated, per_fault


# --------------------------------------------------------------------------- summary


def _loss_check(
    run: Mapping[int, str], ref: Mapping[int, str], unlogged: set[int] | None = None
) -> dict[str, Any]:
    """``unlogged``: iterations a trainer fault hid: executed (the restore resumed after them)
    but killed before rank 0 printed their loss; not a mismatch when the run has no loss."""
    mismatches: list[dict[str, Any]] = []
    for it in sorted(set(run) | set(ref)):
        a, b = run.get(it), ref.get(it)
        if a is None and unlogged and it in unlogged:
            continue
        if a != b:
            mismatches.append({"iteration": it, "run": a, "reference": b})
    compared = len(set(run) & set(ref))
    return {
        "losses_match": not mismatches and compared > 0,
        "losses_compared": compared,
        "loss_mismatch_count": len(mismatches),
        "loss_mismatches": mismatches[:_MAX_LISTED],
    }


def _fault_rows(
    faults: Sequence[Mapping[str, Any]],
    observed: Mapping[int, int],
    have_steps: bool,
    started: float,
) -> tuple[list[dict[str, Any]], list[str], list[str], list[str]]:
    """(rows, problems, notes, contradictions) of the faults."""
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    notes: list[str] = []
    contra: list[str] = []
    for i, f in enumerate(faults):
        kind = str(f.get("kind"))
        cls = FAULT_CLASS.get(kind, "unknown")
        t_inject = _num(f.get("t_inject"))
        t_detect, t_recovered = _num(f.get("t_detect")), _num(f.get("t_recovered"))
        detect = t_detect - t_inject if t_inject is not None and t_detect is not None else None
        recover = (
            t_recovered - t_inject if t_inject is not None and t_recovered is not None else None
        )
        repeats = observed.get(i, 0) if have_steps else None
        lost, source = _int(f.get("lost_iterations")), "record"
        if lost is None and repeats is not None:
            lost, source = repeats, "step_times"
        elif lost is None:
            source = "unknown"
        bound = MAX_LOST.get(cls)
        within = None if bound is None or lost is None else lost <= bound
        label = f"fault {i + 1} ({kind}"
        label += f" {f.get('target')})" if f.get("target") is not None else ")"
        if cls == "unknown":
            notes.append(f"{label}: unknown kind, its work lost is not checked")
        elif lost is None:
            problems.append(f"{label}: work lost unknown (no lost_iterations, no step times)")
        elif not within:
            problems.append(f"{label}: lost {lost} iteration(s), at most {bound} allowed")
        if repeats is not None and source == "record" and lost is not None and repeats != lost:
            contra.append(
                f"{label}: the record says {lost} iteration(s) lost, the step times "
                f"show {repeats} repeated"
            )
        for what, secs in (("detect", detect), ("recover", recover)):
            if secs is not None and secs < 0:
                contra.append(f"{label}: {what} {secs:.3f} s, before the fault was injected")
        down, fd = _num(f.get("down_s")), _num(f.get("failure_detect_s"))
        seen = _num(f.get("observable_s"))
        if t_detect is None and cls == "shadow" and down is not None and fd is not None:
            # detection: the first controller event that noticed this outage (runner.py)
            if down < fd:
                notes.append(
                    f"{label}: not detected (down {down:g} s, under failure_detect {fd:g} s: "
                    "by design)"
                )
            elif seen is not None and seen < fd + DETECT_SLACK_S:
                notes.append(
                    f"{label}: not detected (down {down:g} s, silence watchable for {seen:g} s "
                    f"before the shadow was back, the next fault or the end of training: under "
                    f"failure_detect {fd:g} s + a controller tick)"
                )
            else:
                problems.append(
                    f"{label}: not detected, although down {down:g} s (failure_detect {fd:g} s)"
                )
        elif t_detect is None and cls == "trainer" and t_inject is not None:
            # a killed trainer is always declared failed: silent for failure_detect, or the
            # rerun's restart request (controller.trainer_failed either way)
            problems.append(f"{label}: no detection recorded (a trainer kill is always detected)")
        elif t_detect is None:
            notes.append(f"{label}: no detection recorded")
        if t_recovered is None:
            notes.append(f"{label}: no recovery recorded")
        rows.append(
            {
                "index": i + 1,
                "kind": kind,
                "class": cls,
                "target": f.get("target"),
                "at_iteration": _int(f.get("at_iteration")),
                "last_logged": _int(f.get("last_logged")),
                "resumed_at": _int(f.get("resumed_at")),
                "t_inject_s": None if t_inject is None else t_inject - started,
                "detect_s": detect,
                "recover_s": recover,
                "lost_iterations": lost,
                "lost_source": source,
                "repeated_observed": repeats,
                "max_lost": bound,
                "within_bound": within,
                "note": str(f.get("note") or ""),
            }
        )
    return rows, problems, notes, contra


def _faulted_vs_unfaulted(
    record: Mapping[str, Any], steps: Sequence[tuple[float, int, float]], warmup: set[int]
) -> dict[str, Any]:
    """The faulted run's mean step time against the unfaulted reference's (both with
    shadowgrad): what the faults did to the steps that ran, not what checkpointing costs."""
    used = [s[2] for k, s in enumerate(steps) if k not in warmup]
    mean = statistics.fmean(used) if used else None
    ref = _num(_map(record.get("reference")).get("mean_step_s"))
    ratio = mean / ref if mean is not None and ref is not None and ref > 0 else None
    return {
        "run_mean_step_s": mean,
        "run_median_step_s": statistics.median(used) if used else None,
        "reference_mean_step_s": ref,
        "ratio": ratio,
        "pct": None if ratio is None else (ratio - 1.0) * 100.0,
        "steps_used": len(used),
        "steps_excluded": len(steps) - len(used),
    }


def _overhead(record: Mapping[str, Any], faulted: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer overhead: the unfaulted run with shadowgrad (the reference) against the same
    job without it (``plain``), mean step times with the first steps left out of both.
    ``run_mean_step_s``/``run_median_step_s`` are the faulted run's (as in
    :func:`_faulted_vs_unfaulted`), kept for readers that convert lost iterations to seconds."""
    ref = _map(record.get("reference"))
    plain = _map(record.get("plain"))
    ckpt, base = _num(ref.get("mean_step_s")), _num(plain.get("mean_step_s"))
    ratio = ckpt / base if ckpt is not None and base is not None and base > 0 else None
    return {
        "checkpointed_mean_step_s": ckpt,
        "plain_mean_step_s": base,
        "ratio": ratio,
        "overhead_pct": None if ratio is None else (ratio - 1.0) * 100.0,
        "checkpointed_cached": bool(ref.get("cached")),
        "plain_cached": bool(plain.get("cached")) if plain else None,
        "run_mean_step_s": faulted.get("run_mean_step_s"),
        "run_median_step_s": faulted.get("run_median_step_s"),
    }


#: how far outside the run's window a timestamp of the run may lie (clock reads, a status file
#: written just before it was read)
_WINDOW_SLACK_S = 2.0


def contradictions(record: Mapping[str, Any], summary: Mapping[str, Any]) -> list[str]:
    """Where the report contradicts itself (each a sentence; none: consistent). The fault rows'
    own checks (negative detection or recovery, lost != repeated) come from :func:`summarize`;
    this adds the run as a whole: a negative wall time; repeated steps the faults do not
    account for; timestamps outside the run's window (``run_window``: a stale log or event of
    an earlier run); a wall time longer than the window, or than the steps plus the restarts
    can account for, or shorter than the step times add up to."""
    out: list[str] = []
    steps = _steps(record)
    rows = list(summary.get("faults", ()))
    wall = _num(summary.get("wall_s"))
    if wall is not None and wall < 0:
        out.append(f"wall time {wall:.1f} s is negative")
    repeated = _int(summary.get("repeated_steps")) or 0
    lost = [_int(r.get("lost_iterations")) for r in rows]
    if steps and all(v is not None for v in lost):
        accounted = sum(v for v in lost if v is not None)
        if repeated != accounted:
            out.append(
                f"{repeated} step(s) repeated, but the faults account for {accounted} "
                "iteration(s) lost"
            )
    window = _map(record.get("run_window"))
    began, ended = _num(window.get("began")), _num(window.get("ended"))
    if began is not None and ended is not None:
        lo, hi = began - _WINDOW_SLACK_S, ended + _WINDOW_SLACK_S
        stale = {
            "step(s)": sum(1 for s in steps if not lo <= s[0] <= hi),
            "sample(s)": sum(1 for s in _samples(record) if not lo <= s[0] <= hi),
            "event(s)": sum(
                1
                for e in _seq(record.get("events"))
                if (t := _num(_map(e).get("t"))) is not None and not lo <= t <= hi
            ),
            "fault time(s)": sum(
                1
                for f in _faults(record)
                for k in ("t_inject", "t_detect", "t_recovered")
                if (t := _num(f.get(k))) is not None and not lo <= t <= hi
            ),
        }
        bad = [f"{n} {what}" for what, n in stale.items() if n]
        if bad:
            out.append(
                f"{', '.join(bad)} outside this run's {ended - began:.1f} s "
                "(from an earlier run's logs?)"
            )
        if wall is not None and wall > ended - began + _WINDOW_SLACK_S:
            out.append(f"wall time {wall:.1f} s is longer than the run ({ended - began:.1f} s)")
    if steps and wall is not None and wall >= 0:
        busy = sum(s[2] for s in steps)
        restarts = sum(
            v
            for r in rows
            if r.get("class") == "trainer" and (v := _num(r.get("recover_s"))) is not None and v > 0
        )
        if wall > 1.5 * (busy + restarts) + 10.0:
            out.append(
                f"wall time {wall:.1f} s, but the steps take {busy:.1f} s and the restarts "
                f"{restarts:.1f} s"
            )
        if busy > 1.2 * (wall + max(s[2] for s in steps)) + 2.0:
            out.append(
                f"the step times add up to {busy:.1f} s, more than the {wall:.1f} s wall time "
                "(steps of overlapping runs?)"
            )
    return out


def _lag(
    samples: Sequence[tuple[float, int | None, int | None, list[int | None]]],
) -> list[dict[str, Any]]:
    nshadows = max((len(s[3]) for s in samples), default=0)
    out: list[dict[str, Any]] = []
    for j in range(nshadows):
        lags = [
            trainer - applied
            for _, trainer, _, shadows in samples
            if trainer is not None and j < len(shadows) and (applied := shadows[j]) is not None
        ]
        unreachable = sum(1 for s in samples if j >= len(s[3]) or s[3][j] is None)
        out.append(
            {
                "shadow": j,
                "max_lag": max(lags) if lags else None,
                "mean_lag": statistics.fmean(lags) if lags else None,
                "final_lag": lags[-1] if lags else None,
                "unreachable_samples": unreachable,
            }
        )
    return out


def summarize(record: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of a run record (JSON-serialisable; times in seconds).

    Fields: ``scenario`` ``name`` ``model`` ``mode`` ``topology`` ``target`` ``wall_s``
    ``iterations_planned`` ``iterations`` ``last_iteration`` ``steps_executed``
    ``repeated_steps`` ``faults_by_kind`` ``faults`` (per fault: ``index`` ``kind`` ``class``
    ``target`` ``at_iteration`` ``last_logged`` ``resumed_at`` ``t_inject_s`` ``detect_s``
    ``recover_s`` ``lost_iterations`` ``lost_source`` ``repeated_observed`` ``max_lost``
    ``within_bound`` ``note``) ``trainer_overhead`` (the unfaulted run with shadowgrad against
    the same job without it: ``checkpointed_mean_step_s`` ``plain_mean_step_s`` ``ratio``
    ``overhead_pct``) ``faulted_vs_unfaulted`` (the faulted run against the unfaulted one:
    ``run_mean_step_s`` ``reference_mean_step_s`` ``ratio`` ``pct`` ``steps_excluded``)
    ``switch_replicated_packets`` ``switch_replicated_bytes`` ``drops`` ``shadow_lag``
    ``reference`` ``plain`` ``bit_exact_resume`` ``bit_exact_compared`` ``bit_exact_differ``
    ``losses_match`` ``losses_compared`` ``loss_mismatch_count`` ``loss_mismatches``
    ``events`` ``ok`` ``problems`` ``notes`` ``contradictions``.

    ``ok``: the resumed state is bit-exact, every loss equals the reference's, every trainer
    fault lost at most one iteration and every other fault none (:data:`MAX_LOST`), every fault
    that must be detected was, and the report does not contradict itself
    (``contradictions``: negative detection or recovery times, lost != repeated steps, stale
    or implausible times, see :func:`contradictions`); ``problems`` says why not.
    """
    scenario = dict(_map(record.get("scenario")))
    started = _started(record)
    ended = _num(record.get("ended"))
    run, ref = _losses(record, "run"), _losses(record, "reference")
    steps = _steps(record)
    faults = _faults(record)
    samples = _samples(record)
    warmup, repeated, observed = _step_analysis(steps, faults)
    rows, problems, notes, contra = _fault_rows(faults, observed, bool(steps), started)

    unlogged: set[int] = set()
    for f in faults:
        lo, hi = _int(f.get("last_logged")), _int(f.get("resumed_at"))
        if lo is not None and hi is not None and hi > lo + 1:
            unlogged.update(range(lo + 1, hi))
    step_iters = {s[1] for s in steps}
    all_iters = set(run) | step_iters | unlogged
    iterations = len(all_iters)
    planned = _int(scenario.get("iterations"))
    if planned is not None and iterations < planned:
        notes.append(f"{iterations} of {planned} planned iterations ran")

    loss = _loss_check(run, ref, unlogged)
    if unlogged:
        notes.append(
            f"iterations {sorted(unlogged)} ran but a kill came before rank 0 logged their loss"
        )
    if not run:
        problems.append("no losses recorded for the run")
    elif not ref:
        problems.append("no reference losses to compare with")
    for m in loss["loss_mismatches"]:
        if m["run"] is None:
            problems.append(f"iteration {m['iteration']}: no loss in the run")
        elif m["reference"] is None:
            problems.append(f"iteration {m['iteration']}: no loss in the reference")
        else:
            problems.append(
                f"iteration {m['iteration']}: loss {m['run']} differs from the "
                f"reference's {m['reference']}"
            )
    hidden = loss["loss_mismatch_count"] - len(loss["loss_mismatches"])
    if hidden > 0:
        problems.append(f"... and {hidden} more loss mismatch(es)")

    bit = _map(record.get("bit_exact"))
    differ = [str(d) for d in _seq(bit.get("differ"))]
    compared = _int(bit.get("compared")) or 0
    bit_ok = bit.get("resume") is True and not differ
    if not bit:
        problems.append("no bit-exactness check in the record")
    elif not bit_ok:
        what = f": {', '.join(differ[:_MAX_LISTED])}" if differ else ""
        problems.append(f"resumed state not bit-exact ({len(differ)} of {compared} differ{what})")
    elif compared == 0:
        notes.append("bit-exactness check compared nothing")

    switch = _map(record.get("switch")) if record.get("switch") is not None else None
    switch_drops = _counts(switch.get("drops")) if switch is not None else {}
    shadow_drops = _counts(record.get("shadow_drops"))
    by_reason: Counter[str] = Counter(switch_drops)
    by_reason.update(shadow_drops)
    reference = _map(record.get("reference"))
    events = [_map(e) for e in _seq(record.get("events"))]

    faulted = _faulted_vs_unfaulted(record, steps, warmup)
    out: dict[str, Any] = {
        "scenario": scenario,
        "name": str(scenario.get("name", "")),
        "model": scenario.get("model"),
        "mode": scenario.get("mode"),
        "topology": record.get("topology"),
        "target": record.get("target"),
        "wall_s": None if ended is None else ended - started,
        "iterations_planned": planned,
        "iterations": iterations,
        "last_iteration": max(all_iters) if all_iters else None,
        "steps_executed": len(steps),
        "repeated_steps": len(repeated),
        "faults_by_kind": dict(sorted(Counter(r["kind"] for r in rows).items())),
        "faults": rows,
        "trainer_overhead": _overhead(record, faulted),
        "faulted_vs_unfaulted": faulted,
        "switch_replicated_packets": None
        if switch is None
        else _int(switch.get("replicated_packets")),
        "switch_replicated_bytes": None if switch is None else _int(switch.get("replicated_bytes")),
        "drops": {
            "switch": switch_drops,
            "shadow": shadow_drops,
            "by_reason": dict(sorted(by_reason.items())),
            "total": sum(by_reason.values()),
        },
        "shadow_lag": _lag(samples),
        "reference": {
            "cached": bool(reference.get("cached")),
            "seconds": _num(reference.get("seconds")),
        },
        "plain": None
        if not _map(record.get("plain"))
        else {
            "cached": bool(_map(record.get("plain")).get("cached")),
            "seconds": _num(_map(record.get("plain")).get("seconds")),
        },
        "bit_exact_resume": bit_ok,
        "bit_exact_compared": compared,
        "bit_exact_differ": differ,
        **loss,
        "events": len(events),
        "ok": False,
        "problems": problems,
        "notes": notes,
    }
    contra += contradictions(record, out)
    out["contradictions"] = contra
    out["problems"] = [f"the report contradicts itself: {c}" for c in contra] + problems
    out["ok"] = not out["problems"] and bit_ok and bool(loss["losses_match"])
    return out


# --------------------------------------------------------------------------- files


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file next to ``path``, then rename it over ``path``."""
    # A fresh unique name (not mkstemp: its 0600 mode would stick to the renamed file).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_report(record: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """Write ``out_dir/report.json`` and the plots; return the report.

    The report is ``{"record": record, "summary": summarize(record), "plots": [file names
    written], "plots_skipped": {file name: why}}``. Every file is written to a temporary name and
    renamed into place, so a reader never sees half a file. Plots whose data is empty are skipped;
    without matplotlib all are (the summary rendering says so).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(record)
    plots, skipped = _plot_all(record, summary, out_dir)
    report: dict[str, Any] = {
        "record": dict(record),
        "summary": summary,
        "plots": plots,
        "plots_skipped": skipped,
    }

    def dump(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())

    _atomic_write(out_dir / "report.json", dump)
    return report


# --------------------------------------------------------------------------- plots


def _plot_all(
    record: Mapping[str, Any], summary: Mapping[str, Any], out_dir: Path
) -> tuple[list[str], dict[str, str]]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        log.warning("matplotlib is not available, no plots: %s", exc)
        return [], {name: "matplotlib is not installed" for name in PLOT_FILES}

    makers: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], Figure | str]] = {
        "loss.png": _plot_loss,
        "step_time.png": _plot_step_time,
        "lag.png": _plot_lag,
        "recovery.png": _plot_recovery,
    }
    plots: list[str] = []
    skipped: dict[str, str] = {}
    for name in PLOT_FILES:
        try:
            fig = makers[name](record, summary)
            if isinstance(fig, str):
                skipped[name] = fig
                continue
            FigureCanvasAgg(fig)

            def save(tmp: Path, fig: Figure = fig) -> None:
                fig.savefig(tmp, format="png", dpi=_DPI)

            _atomic_write(out_dir / name, save)
            plots.append(name)
        except Exception as exc:  # a plot must never cost the report
            log.exception("plot %s failed", name)
            skipped[name] = f"failed: {type(exc).__name__}: {exc}"
    return plots, skipped


def _title(summary: Mapping[str, Any], what: str) -> str:
    name = summary.get("name") or "run"
    bits = [
        str(b)
        for b in (
            summary.get("model"),
            summary.get("mode"),
            summary.get("topology"),
            summary.get("target"),
        )
        if b
    ]
    return f"{what} — {name}" + (f" ({', '.join(bits)})" if bits else "")


def _fault_markers(ax: Axes, marks: Iterable[tuple[float, str]], *, label: bool = True) -> None:
    """Vertical lines at x for each (x, kind), labelled by kind at the top of the axes."""
    from matplotlib.lines import Line2D

    kinds: list[str] = []
    for x, kind in marks:
        colour = _KIND_COLOURS.get(kind, "#444444")
        ax.axvline(x, color=colour, linestyle="--", linewidth=1.3, alpha=0.9, zorder=1)
        if label:
            ax.text(
                x,
                0.98,
                f" {kind}",
                transform=ax.get_xaxis_transform(),
                rotation=90,
                va="top",
                ha="right",
                fontsize=8,
                color=colour,
            )
        if kind not in kinds:
            kinds.append(kind)
    if label and kinds:
        handles, _ = ax.get_legend_handles_labels()
        extra = [
            Line2D(
                [], [], color=_KIND_COLOURS.get(k, "#444444"), linestyle="--", label=f"fault: {k}"
            )
            for k in kinds
        ]
        ax.legend(handles=[*handles, *extra], fontsize=8, loc="best")


def _figure(
    rows: int = 1, *, height: float = 4.8, ratios: Sequence[float] | None = None
) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, height), layout="constrained")
    kw: dict[str, Any] = {"height_ratios": list(ratios)} if ratios else {}
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False, gridspec_kw=kw)
    return fig, [a for row in axes for a in row]


def _plot_loss(record: Mapping[str, Any], summary: Mapping[str, Any]) -> Figure | str:
    run, ref = _losses(record, "run"), _losses(record, "reference")
    if not run and not ref:
        return "no losses recorded"
    fig, (ax, dax) = _figure(2, height=5.6, ratios=(3, 1))
    curves: list[tuple[dict[int, str], str, float, str, dict[str, Any]]] = [
        (ref, "#999999", 4, "reference (no faults)", {"alpha": 0.55}),
        (run, "#1f77b4", 1.3, "run (faults injected)", {}),
    ]
    for losses, colour, width, label, style in curves:
        if losses:
            ax.plot(
                list(losses),
                [_loss_value(v) for v in losses.values()],
                color=colour,
                linewidth=width,
                label=label,
                **style,
            )
    bad = [m["iteration"] for m in summary.get("loss_mismatches", ()) if m.get("run") is not None]
    if bad:
        ax.plot(
            bad,
            [_loss_value(run[i]) for i in bad],
            "x",
            color="#d62728",
            markersize=8,
            markeredgewidth=2,
            label="differs from reference",
        )
    both = sorted(set(run) & set(ref))
    diffs = [_loss_value(run[i]) - _loss_value(ref[i]) for i in both]
    dax.plot(
        both,
        diffs,
        color="#d62728" if any(d != 0 for d in diffs) else "#2ca02c",
        linewidth=1.2,
        marker="." if len(both) < 60 else None,
    )
    dax.axhline(0.0, color="#444444", linewidth=0.8)
    dax.set_ylabel("run - reference")
    dax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax.set_title(_title(summary, "Training loss"))
    ax.grid(alpha=0.3)
    dax.grid(alpha=0.3)
    marks = []
    for f in _faults(record):
        at = _int(f.get("at_iteration"))
        if at is None:
            at = _int(f.get("last_logged"))
        if at is not None:
            marks.append((float(at), str(f.get("kind"))))
    _fault_markers(ax, marks)
    _fault_markers(dax, marks, label=False)
    if not marks:
        ax.legend(fontsize=8, loc="best")
    verdict = (
        "all losses equal the reference's"
        if summary.get("losses_match")
        else (f"{summary.get('loss_mismatch_count', 0)} loss(es) differ")
    )
    dax.set_title(verdict, fontsize=9)
    return fig


def _plot_step_time(record: Mapping[str, Any], summary: Mapping[str, Any]) -> Figure | str:
    steps = _steps(record)
    if not steps:
        return "no step times recorded"
    started = _started(record)
    faults = _faults(record)
    warmup, repeated, _ = _step_analysis(steps, faults)
    fig, (ax,) = _figure(1)
    xs = [s[0] - started for s in steps]
    ms = [s[2] * 1000.0 for s in steps]
    starts = {start for start, _ in _segments(steps, faults)}
    line_x: list[float] = []
    line_y: list[float] = []
    for k, (x, y) in enumerate(zip(xs, ms, strict=True)):
        if k in starts and k:
            line_x.append(math.nan)  # no line across a restart
            line_y.append(math.nan)
        line_x.append(x)
        line_y.append(y)
    ax.plot(line_x, line_y, color="#1f77b4", linewidth=0.8, alpha=0.6, zorder=2)
    normal = [k for k in range(len(steps)) if k not in warmup and k not in repeated]
    series: list[tuple[list[int], str, str, int, str, dict[str, Any]]] = [
        (normal, ".", "#1f77b4", 4, "step", {"zorder": 3}),
        (sorted(repeated), "s", "#d62728", 6, "repeated iteration", {"fillstyle": "none"}),
        (
            sorted(warmup - repeated),
            "o",
            "#ff7f0e",
            6,
            "after restart (not in the mean)",
            {"fillstyle": "none"},
        ),
    ]
    for ks, marker, color, size, label, style in series:
        if ks or label == "step":
            ax.plot(
                [xs[k] for k in ks],
                [ms[k] for k in ks],
                marker,
                color=color,
                markersize=size,
                label=label,
                **{"zorder": 4, **style},
            )
    over = _map(summary.get("faulted_vs_unfaulted") or summary.get("trainer_overhead"))
    mean, ref = _num(over.get("run_mean_step_s")), _num(over.get("reference_mean_step_s"))
    plain = _num(_map(summary.get("trainer_overhead")).get("plain_mean_step_s"))
    means: list[tuple[float | None, str, str, dict[str, Any]]] = [
        (mean, "faulted run mean", "#1f77b4", {}),
        (ref, "unfaulted run mean", "#555555", {"linestyle": ":"}),
        (plain, "without shadowgrad", "#2ca02c", {"linestyle": "--"}),
    ]
    for value, what, color, style in means:
        if value is not None:
            ms_value = value * 1000.0
            ax.axhline(
                ms_value, color=color, linewidth=1.0, label=f"{what} {ms_value:.1f} ms", **style
            )
    _shade_faults([ax], faults, started)
    ax.set_xlabel("wall time since start (s)")
    ax.set_ylabel("trainer step time, rank 0 (ms)")
    ratio = _num(over.get("ratio"))
    cost = _num(_map(summary.get("trainer_overhead")).get("ratio")) if plain is not None else None
    # the title has room for one figure: the overhead (the legend has every mean)
    if cost is not None:
        extra = f": overhead x{cost:.3f}"
    elif ratio is not None:
        extra = f": faulted x{ratio:.3f} the unfaulted run"
    else:
        extra = ""
    ax.set_title(_title(summary, "Per-iteration trainer time") + extra)
    ax.grid(alpha=0.3)
    # Keep a very slow restart step from flattening everything else: cap the axis at a
    # generous multiple of the typical step, and say so.
    typical = statistics.median(ms)
    top = max(ms)
    if typical > 0 and top > 8 * typical:
        ax.set_ylim(0, 8 * typical)
        ax.text(
            0.01,
            0.97,
            f"axis capped; slowest step {top:.0f} ms",
            fontsize=8,
            transform=ax.transAxes,
            va="top",
        )
    else:
        ax.set_ylim(bottom=0)
    marks = _time_marks(faults, started)
    _fault_markers(ax, marks)
    if not marks:
        ax.legend(fontsize=8, loc="best")
    return fig


def _nan(v: int | None) -> float:
    return math.nan if v is None else float(v)


def _plot_lag(record: Mapping[str, Any], summary: Mapping[str, Any]) -> Figure | str:
    samples = _samples(record)
    if not samples or all(
        s[1] is None and s[2] is None and all(v is None for v in s[3]) for s in samples
    ):
        return "no samples recorded"
    started = _started(record)
    nshadows = max((len(s[3]) for s in samples), default=0)
    fig, (ax, lax) = _figure(2, height=6.4, ratios=(3, 2))
    xs = [s[0] - started for s in samples]
    lines: list[tuple[list[int | None], str, float, str, dict[str, Any]]] = [
        ([s[1] for s in samples], "black", 1.6, "trainer iteration", {}),
        ([s[2] for s in samples], "#d4a017", 1.4, "I* (committed)", {"linestyle": "--"}),
    ]
    for ys, colour, width, label, style in lines:
        ax.step(
            xs,
            [_nan(y) for y in ys],
            where="post",
            color=colour,
            linewidth=width,
            label=label,
            **style,
        )
    for j in range(nshadows):
        colour = _SHADOW_COLOURS[j % len(_SHADOW_COLOURS)]
        applied = [_nan(s[3][j]) if j < len(s[3]) else math.nan for s in samples]
        ax.step(
            xs,
            applied,
            where="post",
            color=colour,
            linewidth=1.0,
            alpha=0.85,
            label=f"shadow {j} last_applied",
        )
        lag = [_nan(s[1]) - a for s, a in zip(samples, applied, strict=True)]
        lax.step(xs, lag, where="post", color=colour, linewidth=1.0, label=f"shadow {j}")
        down = [x for x, a in zip(xs, applied, strict=True) if math.isnan(a)]
        if down:
            lax.plot(down, [0.0] * len(down), "|", color=colour, markersize=8)
    faults = _faults(record)
    _shade_faults([ax, lax], faults, started)
    ax.set_ylabel("iteration")
    ax.set_title(_title(summary, "Trainer, I* and shadows"))
    lax.set_ylabel("lag (iterations)")
    lax.set_xlabel("wall time since start (s)")
    lax.set_title(
        "lag = trainer iteration - shadow last_applied (| : shadow unreachable)", fontsize=9
    )
    ax.grid(alpha=0.3)
    lax.grid(alpha=0.3)
    marks = _time_marks(faults, started)
    _fault_markers(ax, marks)
    _fault_markers(lax, marks, label=False)
    if not marks:
        ax.legend(fontsize=8, loc="best")
    if nshadows:
        lax.legend(fontsize=8, loc="upper left")
    return fig


def _plot_recovery(record: Mapping[str, Any], summary: Mapping[str, Any]) -> Figure | str:
    rows = list(summary.get("faults", ()))
    if not rows:
        return "no faults injected"
    from matplotlib.patches import Patch

    fig, (ax,) = _figure(1, height=max(2.6, 1.2 + 0.75 * len(rows)))
    labels: list[str] = []
    span = max(
        [
            v
            for r in rows
            for v in (_num(r.get("detect_s")), _num(r.get("recover_s")))
            if v is not None
        ]
        or [1.0]
    )
    for y, r in enumerate(rows):
        detect, recover = _num(r.get("detect_s")), _num(r.get("recover_s"))
        target = f" {r['target']}" if r.get("target") is not None else ""
        at = f" @it {r['at_iteration']}" if r.get("at_iteration") is not None else ""
        t0 = _num(r.get("t_inject_s"))
        when = f"\nt={t0:.1f} s" if t0 is not None else ""
        labels.append(f"#{r['index']} {r['kind']}{target}{at}{when}")
        if detect is not None:
            ax.barh(y, detect, left=0, height=0.5, color="#ff7f0e")
        if recover is not None:
            left = detect if detect is not None and detect <= recover else 0.0
            ax.barh(y, recover - left, left=left, height=0.5, color="#2ca02c")
        ax.plot(
            [0], [y], marker="v", color=_KIND_COLOURS.get(str(r["kind"]), "#444444"), markersize=9
        )
        parts = []
        if detect is not None:
            parts.append(f"detect {detect:.2f} s")
        if recover is not None:
            parts.append(f"recovered {recover:.2f} s")
        lost = r.get("lost_iterations")
        parts.append(f"lost {lost if lost is not None else '?'}")
        end = max(v for v in (detect, recover, 0.0) if v is not None)
        text = (
            ", ".join(parts)
            if detect is not None or recover is not None
            else ("no detection or recovery recorded; " + parts[-1])
        )
        ax.text(end + span * 0.01, y, text, va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(-span * 0.02, span * 1.6)
    ax.set_xlabel("seconds since the fault was injected")
    ax.set_title(_title(summary, "Fault detection and recovery"))
    ax.grid(axis="x", alpha=0.3)
    ax.legend(
        handles=[
            Patch(color="#ff7f0e", label="inject → detect"),
            Patch(color="#2ca02c", label="detect → recovered"),
        ],
        fontsize=8,
        loc="lower right",
    )
    return fig


# --------------------------------------------------------------------------- terminal


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _secs(v: Any) -> str:
    x = _num(v)
    return "-" if x is None else f"{x:.3f}"


def _reasons(counts: Mapping[str, int]) -> str:
    nonzero = {k: v for k, v in counts.items() if v}
    return ", ".join(f"{k} {v}" for k, v in nonzero.items()) if nonzero else "none"


def _overhead_lines(s: Mapping[str, Any]) -> list[str]:
    """``trainer overhead`` (the unfaulted run with shadowgrad against the same job without
    it) and ``faulted run vs unfaulted`` (both with shadowgrad). A summary from before the plain
    run existed has only the second figure, under ``trainer_overhead``: it is shown as such."""
    over = _map(s.get("trainer_overhead"))
    legacy = "faulted_vs_unfaulted" not in s
    fvu = over if legacy else _map(s.get("faulted_vs_unfaulted"))
    lines = []
    ckpt, base = _num(over.get("checkpointed_mean_step_s")), _num(over.get("plain_mean_step_s"))
    ratio, pct = _num(over.get("ratio")), _num(over.get("overhead_pct"))
    if legacy:
        lines.append("trainer overhead: n/a (this report has no run without shadowgrad)")
    elif ckpt is None or base is None or ratio is None or pct is None:
        lines.append(
            "trainer overhead: n/a ("
            + ("no unfaulted run" if ckpt is None else "no run without shadowgrad")
            + " to compare with)"
        )
    else:
        cached = {
            (True, True): "; both cached",
            (True, False): "; the one with shadowgrad cached",
            (False, True): "; the one without cached",
        }.get((bool(over.get("checkpointed_cached")), bool(over.get("plain_cached"))), "")
        lines.append(
            f"trainer overhead: x{ratio:.3f} ({pct:+.1f} %), {ckpt * 1000:.2f} ms/step with "
            f"shadowgrad vs {base * 1000:.2f} ms without (unfaulted runs{cached})"
        )
        if ratio < 1:
            mode = s.get("mode") or _map(s.get("scenario")).get("mode")
            lines.append(
                "  below x1: "
                + (
                    "in-band, the job with shadowgrad all-reduces over its own UDP ring through "
                    "the switch, the job without it over gloo's TCP: their difference and the "
                    "step times' noise show here, no saving from checkpointing"
                    if mode == "in-band"
                    else "both runs all-reduce with gloo and shadowgrad only adds work: the "
                    "difference is the step times' noise"
                )
            )
    mean, ref = _num(fvu.get("run_mean_step_s")), _num(fvu.get("reference_mean_step_s"))
    f_ratio = _num(fvu.get("ratio"))
    f_pct = _num(fvu.get("overhead_pct" if legacy else "pct"))
    if mean is None:
        lines.append("faulted run vs unfaulted: n/a (no step times)")
    elif f_ratio is None or ref is None or f_pct is None:
        lines.append(f"faulted run vs unfaulted: {mean * 1000:.2f} ms/step, no unfaulted run")
    else:
        lines.append(
            f"faulted run vs unfaulted: x{f_ratio:.3f} ({f_pct:+.1f} %), {mean * 1000:.2f} "
            f"vs {ref * 1000:.2f} ms/step ({fvu.get('steps_excluded', 0)} post-restart steps "
            "left out)"
        )
    return lines


def render_summary(report_or_summary: Mapping[str, Any], *, colour: bool = False) -> str:
    """The terminal summary of a report (from :func:`write_report`) or of a summary (from
    :func:`summarize`); ``colour`` adds ANSI colours. Ends with ``bit-exact resume: yes`` or
    ``bit-exact resume: NO (...)``."""
    is_report = "summary" in report_or_summary
    s = _map(report_or_summary["summary"]) if is_report else report_or_summary

    def paint(text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if colour else text

    sc = _map(s.get("scenario"))
    lines: list[str] = []
    desc = [str(v) for v in (sc.get("model"), sc.get("mode")) if v is not None]
    for key, word in (
        ("trainers", "trainers"),
        ("shards", "shards"),
        ("replication", "replication"),
    ):
        if sc.get(key) is not None:
            desc.append(f"{word} {sc[key]}")
    lines.append(
        paint(f"scenario {s.get('name') or '?'}", "1") + (f": {', '.join(desc)}" if desc else "")
    )
    wall = _num(s.get("wall_s"))
    lines.append(
        f"topology {s.get('topology') or '?'}, target {s.get('target') or '?'}"
        + (f", {wall:.1f} s wall" if wall is not None else "")
    )
    planned = s.get("iterations_planned")
    of = f" of {planned}" if planned is not None else ""
    lines.append(
        f"iterations: {s.get('iterations', 0)}{of} ({s.get('steps_executed', 0)} "
        f"steps executed, {s.get('repeated_steps', 0)} repeated)"
    )
    cached = " (cached)" if _map(s.get("reference")).get("cached") else ""
    if s.get("losses_match"):
        lines.append(f"losses: all {s.get('losses_compared', 0)} equal the reference's{cached}")
    else:
        bad = [str(m.get("iteration")) for m in s.get("loss_mismatches", ())]
        lines.append(
            paint(
                f"losses: {s.get('loss_mismatch_count', 0)} differ from the "
                f"reference (first: {', '.join(bad) or 'none compared'})",
                "31",
            )
        )
    rows = list(s.get("faults", ()))
    by_kind = _map(s.get("faults_by_kind"))
    lines.append(
        f"faults: {len(rows)}"
        + (f" ({', '.join(f'{k}: {v}' for k, v in by_kind.items())})" if rows else "")
    )
    if rows:
        lines.append(
            f"  {'kind':<19}{'target':>6}{'at':>6}{'detect s':>10}{'recover s':>11}{'lost':>6}"
        )
        for r in rows:
            lost = r.get("lost_iterations")
            cell = f"{'?' if lost is None else lost:>6}"
            if r.get("within_bound") is False or lost is None:
                cell = paint(cell, "31")
            target = "-" if r.get("target") is None else str(r["target"])
            at = "-" if r.get("at_iteration") is None else str(r["at_iteration"])
            lines.append(
                f"  {r.get('kind')!s:<19}{target:>6}{at:>6}"
                f"{_secs(r.get('detect_s')):>10}{_secs(r.get('recover_s')):>11}" + cell
            )
    lines += _overhead_lines(s)
    nbytes = s.get("switch_replicated_bytes")
    if nbytes is None and s.get("switch_replicated_packets") is None:
        lines.append("switch: no counters")
    else:
        packets = s.get("switch_replicated_packets")
        lines.append(
            f"switch replicated: {_human_bytes(nbytes)}"
            + (f" in {packets:,} packets" if isinstance(packets, int) else "")
        )
    drops = _map(s.get("drops"))
    lines.append(
        f"drops: switch: {_reasons(_map(drops.get('switch')))}; "
        f"shadows: {_reasons(_map(drops.get('shadow')))}"
    )
    lags = [
        f"shadow {g.get('shadow')}: {g.get('max_lag')}"
        for g in s.get("shadow_lag", ())
        if g.get("max_lag") is not None
    ]
    if lags:
        lines.append(f"max shadow lag (iterations): {', '.join(lags)}")
    if is_report:
        plots = list(report_or_summary.get("plots", ()))
        skipped = _map(report_or_summary.get("plots_skipped"))
        if plots:
            lines.append(f"plots: {', '.join(plots)}")
        reasons = sorted(set(skipped.values()))
        if not plots and reasons == ["matplotlib is not installed"]:
            lines.append("plots: skipped, matplotlib is not installed")
        else:
            for name, why in skipped.items():
                lines.append(f"plot {name} skipped: {why}")
    for note in s.get("notes", ()):
        lines.append(f"note: {note}")
    problems = list(s.get("problems", ()))
    contra = [str(c) for c in s.get("contradictions", ())]
    if s.get("ok"):
        lines.append(paint("result: OK", "32;1"))
    elif contra:
        # every contradiction is shown: a report that contradicts itself says where
        rest = [p for p in problems if not str(p).startswith("the report contradicts itself")]
        shown = rest[:2] + ([f"... {len(rest) - 2} more"] if len(rest) > 2 else [])
        lines.append(
            paint("result: FAILED, the report contradicts itself", "31;1")
            + f" ({'; '.join(contra + shown)})"
        )
    else:
        shown = problems[:3] + ([f"... {len(problems) - 3} more"] if len(problems) > 3 else [])
        lines.append(paint("result: FAILED", "31;1") + (f" ({'; '.join(shown)})" if shown else ""))
    if s.get("bit_exact_resume"):
        lines.append(paint("bit-exact resume: yes", "32;1"))
    else:
        differ = [str(d) for d in s.get("bit_exact_differ", ())]
        if differ:
            more = f", +{len(differ) - _MAX_LISTED} more" if len(differ) > _MAX_LISTED else ""
            why = (
                f"{len(differ)} of {s.get('bit_exact_compared', 0)} differ: "
                f"{', '.join(differ[:_MAX_LISTED])}{more}"
            )
        else:
            why = "not checked" if not s.get("bit_exact_compared") else "resume not bit-exact"
        lines.append(paint(f"bit-exact resume: NO ({why})", "31;1"))
    return "\n".join(lines)
