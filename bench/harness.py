"""The benchmarks in one command (issue 14): run the component benches, then generate
``docs/benchmarks.md`` from their JSON.

    .venv/bin/python bench/harness.py --quick       # each bench in its quick/short mode (minutes)
    .venv/bin/python bench/harness.py --full        # each bench with its default settings
    .venv/bin/python bench/harness.py --page-only   # regenerate the page from the JSON present
    .venv/bin/python bench/harness.py --quick --only recovery_bench   # rerun some, merge them
    make bench-quick / make bench                   # the same as the first two

The benches are the rows of :data:`BENCHES` (script, quick and full arguments, timeout, whether
it needs root, how its figures go on the page). Each runs as a subprocess of this interpreter in
a process group of its own, with a timeout (the whole group is killed past it); its output is
echoed and the last lines kept. A bench that fails, times out or cannot run here (switch_bench
needs root) is reported as such on the page; the others still run. A bench writes its JSON to a
scratch name that is moved into place only when it exits 0, so a failure never leaves a
half-written file or mixes old figures into a new run.

Where the JSON goes: ``--full`` writes each bench's JSON where the bench itself would
(``bench/results/<bench>.json``, the files docs/*.md quote); ``--quick`` writes them under
``bench/results/quick/``, so a quick run never replaces full-run figures. Both write
``bench/results/harness.json`` (mode, command, start time, wall times, exit statuses, output
tails, machine) and then the page. Before the first bench the harness times one fixed Python loop
again and again on each CPU for a few seconds (``_common.cpu_speed``, ``machine.cpu_speed``): the
page says how far the CPU time of the same work moved, since every ratio on it compares runs
that each got their own mix of the machine's speeds. The page is a pure function of the JSON
files: every date on it comes from the JSON, so ``--page-only`` regenerates it byte for byte
(``tests/test_bench_page.py`` checks that the committed page is what the committed JSON gives).

``--only NAME[,NAME]`` runs just those benches (in the same mode) and merges their entries into
the existing ``bench/results/harness.json``: the other benches' entries and the original run's
command, start, wall time and machine stay; the rerun is listed under ``reruns`` (its command,
start, wall time, machine, commit and benches) and the page says so. A rerun in the other mode
than the recorded run is refused (it would mix quick and full figures on one page); with no
harness.json the rerun's own record is the start of a new one.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common
import inband_bench  # its compare(): the in-band rows' ratios, one rule

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
QUICK_RESULTS = RESULTS / "quick"
HARNESS_JSON = RESULTS / "harness.json"
DEFAULT_PAGE = ROOT / "docs" / "benchmarks.md"
TAIL_LINES = 25
KILL_GRACE_S = 10.0

Doc = dict[str, Any]
DASH = "\u2013"  # en dash of ranges, kept out of the source as RUF001 asks
TIMES = "\u00d7"  # multiplication sign of ratios
#: auth_bench's ``rx_crc32c_impl``: how the shadow's C loop computes the CRC-32C on this CPU
_CRC_IMPLS = {
    "fold": "by carry-less-multiply folding (VPCLMULQDQ)",
    "sse42": "with the SSE4.2 crc32 instruction",
    "table": "by table (slicing-by-8)",
}
MINMAX = f"min {DASH} max"
Renderer = Callable[[Doc], list[str]]


# ---------------------------------------------------------------------------------------------
# formatting helpers (deterministic: fixed precision, no locale, no clock)
# ---------------------------------------------------------------------------------------------


def _f(x: Any, digits: int = 0, scale: float = 1.0) -> str:
    """``x * scale`` with ``digits`` decimals and thousands separators; '-' for missing."""
    if x is None or isinstance(x, bool) or not isinstance(x, int | float):
        return "-"
    return f"{x * scale:,.{digits}f}"


def _pct(x: Any) -> str:
    return "-" if not isinstance(x, int | float) else f"{100 * x:.1f} %"


def _secs(x: Any, digits: int) -> str:
    """``x`` seconds with its unit; '-' alone for missing."""
    return "-" if not isinstance(x, int | float) else f"{_f(x, digits)} s"


def _ratio(x: Any) -> str:
    return "-" if not isinstance(x, int | float) else f"{x:.3f}"


#: what each of the ranks' threads does, for the in-band CPU sentence
_THREAD_ROLES = {
    "shadowgrad-ring": "the ring engine (sealing and verifying the FINAL datagrams and the "
    "ACKs, retaining the FINAL bytes, answering NACKs, the DDP hook's futures)",
    "MainThread": "the training thread (shadowgrad's step and COMMIT)",
    "shadowgrad-health": "the health monitor (status polls of every shadow)",
    "shadowgrad-mirror": "the COMMIT sender",
}


def _thread_excess_sentence(x: Doc) -> str:
    """Where the in-band ranks' extra CPU runs, by thread (inband_bench's per-thread CPU),
    and the clean ring with the session's MACs alone where it ran."""
    ex = x.get("thread_cpu_excess_ms") or {}
    parts = [f"{_THREAD_ROLES.get(n, n)} {v:+.2f}" for n, v in ex.items() if abs(v) >= 0.05][:5]
    out = ""
    if parts:
        out += (
            " All ranks' CPU per iteration against the clean ring, by thread (ms): "
            + "; ".join(parts)
            + "."
        )
    mac = x.get("mac_cpu_ratio")
    if mac is not None:
        out += (
            f" The clean ring with the session's MACs alone (`ring_mac`) uses "
            f"{_pct(mac - 1)} more CPU than without."
        )
    beyond = x.get("beyond_mac_cpu_ratio")
    if beyond is not None:
        out += (
            f" In-band against `ring_mac` (what shadowgrad adds beyond authenticating the"
            f" bytes the shadows keep), in the same run: {_pct(beyond - 1)} more CPU per"
            f" iteration."
        )
    faults, retain, its = (
        x.get("ring_faults_excess"),
        x.get("ring_retain"),
        x.get("measured_iterations"),
    )
    if faults is not None and retain is not None and its:
        out += (
            f" The ring engine took {faults:+.0f} page faults per iteration (all ranks; a"
            f" fresh zeroed 4 KiB page each) against the clean ring's: the FINAL bytes kept for"
            f" the shadows' NACKs take new memory until {retain:.0f} iterations are held"
            f" (then the ring reuses the oldest's), and this run measured iterations"
            f" {its[0]}-{its[1]}."
        )
    return out


def _ms_of(secs: Any) -> float | None:
    x = _num(secs)
    return None if x is None else x * 1e3


def _tap_control(inband: Doc, notap: Doc | None) -> Doc | None:
    """``inband`` against ``inband_notap`` (the same session through the same switch without
    the tap), by inband_bench's own :func:`inband_bench.compare` (as its ``vs_ring``): the
    ranks' work is the same (the switch's copies and the shadows' ingest are other processes'),
    so their CPU ratio is what the machine moves the same work by in this run. None where
    either lacks a figure (older JSON)."""
    if not notap:
        return None
    try:
        vs = inband_bench.compare(inband, notap)
    except (KeyError, TypeError):
        return None
    if vs["rusage_cpu_per_iter"] is None or vs["link_bytes_per_iter"] is None:
        return None
    pe, pn = inband["per_rank_per_iter"], notap["per_rank_per_iter"]
    data, data_notap = (
        inband_bench._total(pe.get("ring_data")),
        inband_bench._total(pn.get("ring_data")),
    )
    out: Doc = {
        "rusage_cpu_s": vs["rusage_cpu_per_iter"],
        "link_bytes": vs["link_bytes_per_iter"],
        "link_datagrams": vs["link_datagrams_per_iter"],
        "ring_data": None if data is None or not data_notap else data / data_notap,
        # NACK repairs: work only the tap can cause (the control's shadows never NACK)
        "inband_nack_retx": inband_bench._total(pe.get("ring_nack_retx")),
    }
    for name, r in (("inband", inband), ("notap", notap)):
        for proc in ("switch", "shadows"):
            out[f"{name}_{proc}_ms"] = _ms_of(_get(r, "cpu_per_iter_s", proc))
    return out


def _tap_control_sentence(x: Doc) -> str:
    """The same-work control of the in-band CPU sentence (:func:`_tap_control`)."""
    c = x.get("tap_control")
    if not c:
        return ""
    data, grams, cpu = c.get("ring_data"), c.get("link_datagrams"), c["rusage_cpu_s"]
    nack = c.get("inband_nack_retx")
    co = [c.get(f"{n}_{p}_ms") for n in ("inband", "notap") for p in ("switch", "shadows")]
    load = (
        ""
        if any(v is None for v in co)
        else f" (the switch and the shadows used {_f(co[0] + co[1], 1)} ms of CPU per "
        f"iteration with the tap, {_f(co[2] + co[3], 1)} ms without)"
    )
    return (
        " Same work, other load, same run: against `inband_notap` (the same session through "
        f"the same switch without the copies to the shadows) the ranks sent {TIMES}"
        f"{_f(data, 3)} the DATA datagrams and {TIMES}{_f(c['link_bytes'], 4)} the bytes "
        f"(all datagrams {TIMES}{_f(grams, 3)}: the ACKs follow the timing), and their CPU "
        f"per iteration was {TIMES}{_f(cpu, 3)}{load}"
        + (
            f"; with the tap they also answered {_f(nack, 1)} NACK repairs per iteration, so "
            f"their CPU time moved by {100 * (cpu - 1):+.1f} % with more work to do."
            if nack
            else f": the ranks' own work was the same but for the ACKs, their CPU time moved by "
            f"{100 * (cpu - 1):+.1f} %."
        )
    )


def _ratio4(x: Any) -> str:
    return "-" if _num(x) is None else f"{x:.4f}"


def _range(lo: Any, hi: Any, digits: int = 0, scale: float = 1.0) -> str:
    if not isinstance(lo, int | float) or not isinstance(hi, int | float):
        return "-"
    return f"{_f(lo, digits, scale)} {DASH} {_f(hi, digits, scale)}"


def _numeric(cell: str) -> bool:
    return cell == "-" or cell.lstrip("-")[:1].isdigit()


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table; a column whose cells are all numbers (or '-') is right-aligned."""
    align = [
        "--:" if rows and all(_numeric(r[i]) for r in rows) else "---" for i in range(len(head))
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _faults_note(x: dict[str, Any]) -> str:
    """The page faults per iteration of ``none`` and ``mirror_sink`` (a trainer_bench stall
    row): whether the training threads' growth is the kernel faulting in fresh pages."""
    a, b = x.get("none_faults_per_iter"), x.get("sink_faults_per_iter")
    growth = x.get("main_thread_growth_s")
    if a is None or b is None or growth is None:
        return ""
    tn, ts = x.get("none_thread_faults"), x.get("sink_thread_faults")
    if isinstance(tn, dict) and isinstance(ts, dict) and "MainThread" in tn and "MainThread" in ts:
        mirror = sum(v for k, v in ts.items() if k.startswith("shadowgrad-"))
        return (
            f" Page faults per iteration, all ranks: {a:,.0f} without mirror, {b:,.0f} with it;"
            f" of them the training threads' (`MainThread`: the tensors training allocates,"
            f" whose pages the allocator sometimes hands back to the kernel)"
            f" {tn['MainThread']:,.0f} and {ts['MainThread']:,.0f}, mirror's own threads'"
            f" {mirror:,.0f}."
        )
    return (
        f" Page faults per iteration, all ranks: {a:,.0f} without mirror, {b:,.0f} with it"
        f" ({(b - a) * 4096 / 1e6:+,.0f} MB of 4 KiB pages faulted in), against the training"
        f" threads' {_f(growth, 1, 1e3)} ms of extra CPU."
    )


def _background_note(x: dict[str, Any]) -> str:
    """How rank 0's mirror sender spent its captures in ``mirror_sink`` (a stall row)."""
    bg = x.get("sink_background") or {}
    n, low = bg.get("captures"), bg.get("background_slots")
    if not isinstance(n, int) or not isinstance(low, int) or n <= 0:
        return ""
    behind, overdue = bg.get("background_behind") or 0, bg.get("background_overdue") or 0
    return (
        f" Rank 0's sender sent {low} of its {n} captures at `SCHED_IDLE` (the cycles training"
        f" leaves); {behind} of them went back to normal priority because the next capture"
        f" came first, {overdue} because they were in the background longer than a heartbeat."
    )


def _table_or_not_measured(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return _table(head, rows) if rows else ["Not measured."]


def _get(d: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(d, dict):
            d = d.get(k)
        elif isinstance(d, list) and isinstance(k, int) and -len(d) <= k < len(d):
            d = d[k]
        else:
            return None
    return d


# ---------------------------------------------------------------------------------------------
# one renderer per bench: its JSON -> markdown lines (headline figures and same-run ratios)
# ---------------------------------------------------------------------------------------------


def render_wire(d: Doc) -> list[str]:
    out = [
        f"Baseline: `{d.get('baseline', 'memcpy')}`, a copy of the same chunks into a "
        "preallocated buffer in the same loop. Rates in MB/s of payload (1 MB = 1e6 B); "
        f"median and {MINMAX} of {_get(d, 'sizes', 0, 'rounds') or '?'} rounds; ratio = "
        f"median rate / memcpy's median rate (paired: per-round ratios, {MINMAX}).",
        "",
    ]
    rows: list[list[str]] = []
    for s in d.get("sizes") or []:
        for name, x in (s.get("items") or {}).items():
            p = x.get("paired_ratio") or {}
            rows.append(
                [
                    f"{_f(s.get('chunk_bytes'))} B",
                    f"`{name}`",
                    _f(x.get("mbps_median")),
                    _range(x.get("mbps_min"), x.get("mbps_max")),
                    _f(x.get("us_per_chunk_median"), 2),
                    _ratio(x.get("ratio_to_memcpy")),
                    _range(p.get("min"), p.get("max"), 3),
                ]
            )
    out += _table(
        ["chunk", "item", "MB/s", MINMAX, "µs/chunk", f"{TIMES} memcpy", f"paired {MINMAX}"], rows
    )
    ok = [s.get("roundtrip_ok") for s in d.get("sizes") or []]
    out += [
        "",
        f"Round trip (decode of what was encoded, with and without MAC): "
        f"{'ok' if ok and all(ok) else 'NOT OK'} for every size.",
    ]
    return out


def render_shadow(d: Doc) -> list[str]:
    out: list[str] = []
    a = d.get("apply")
    if isinstance(a, dict):
        bw = a.get("bandwidth") or {}
        out += [
            f"**Apply** ({_f(a.get('params'))} fp32 parameters, {a.get('threads')} threads, "
            f"{a.get('boxes')} boxes). Baseline: the memory-bandwidth bound measured in the "
            f"same run, {_f(bw.get('bound_GBps'), 1)} GB/s (best of copy "
            f"{_f(bw.get('copy_GBps'), 1)}, scale {_f(bw.get('scale_inplace_GBps'), 1)}, "
            f"add {_f(bw.get('add_inplace_GBps'), 1)}, triad {_f(bw.get('triad_GBps'), 1)}) "
            f"= {_f(bw.get('bound_params_per_s'), 0, 1e-6)} M params/s at "
            f"{a.get('bytes_per_param')} B/param. Figures from each item's best round "
            "(the JSON keeps best and median, not every round).",
            "",
        ]
        rows = []
        for key in _common.APPLY_ITEMS:
            x = a.get(key)
            if isinstance(x, dict):
                rows.append(
                    [
                        f"`{key}`",
                        _f(x.get("params_per_s"), 0, 1e-6),
                        _f(x.get("best_s"), 1, 1e3),
                        _f(x.get("median_s"), 1, 1e3),
                        _pct(x.get("ratio_to_bound")),
                        str(x.get("reps", "-")),
                    ]
                )
        out += _table(["item", "M params/s", "best ms", "median ms", "of bound", "rounds"], rows)
        out += [
            "",
            f"Replayer / torch fused AdamW: {_ratio(a.get('replayer_vs_fused'))}; target "
            f"{_pct(a.get('target_ratio'))} of the bound: "
            f"{'met' if a.get('meets_target') else 'NOT met'}.",
        ]
        over = [
            k
            for k, x in a.items()
            if isinstance(x, dict)
            and isinstance(x.get("ratio_to_bound"), int | float)
            and x["ratio_to_bound"] > 1
        ]
        if over:
            out[-1] += (
                f" Above 100 % of the bound ({', '.join(f'`{k}`' for k in over)}): the "
                "bandwidth kernels ran slower than AdamW itself, i.e. other load "
                "disturbed this run; its bound and ratios are not trustworthy."
            )
    ing = d.get("ingest")
    if isinstance(ing, dict):
        iv = ing.get("ingest_vs_bare") or {}
        rounds = iv.get("rounds")
        out += [
            "",
            f"**Ingest** ({_f(iv.get('datagram_payload'))} B DATA payloads, "
            f"{_f(iv.get('bytes_per_pass'), 0, 1e-6)} MB per pass). Baseline: a bare "
            "`recv_into` loop fed by the same producer in the same run."
            + (
                f" {rounds} interleaved rounds (the order rotates each round): median and "
                f"{MINMAX} over them; *paired*: the median of each round's own ratio. The "
                "goal takes the faster of the shadow's two receive-thread counts (*best*). "
                "*kept up*: passes in which the receiver processed every datagram the "
                "producer sent: its rate is then the producer's (which the ratio compares), "
                "a lower bound of what the receiver can take."
                if rounds
                else ""
            ),
            "",
        ]
        if rounds:
            best = str(iv.get("shadow_best_rx_threads"))
            rows = [
                [
                    "bare `recv_into`",
                    _f(iv.get("bare_recv_mbps")),
                    _range(iv.get("bare_mbps_min"), iv.get("bare_mbps_max")),
                    "1.000",
                    "-",
                    f"{_f(iv.get('bare_kept_up'))} of {rounds}",
                ]
            ]
            for k, x in sorted((iv.get("shadow_by_rx_threads") or {}).items()):
                rows.append(
                    [
                        f"shadow node, {k} receive thread{'s' if str(k) != '1' else ''}"
                        + (" (*best*)" if str(k) == best else ""),
                        _f(x.get("mbps")),
                        _range(x.get("mbps_min"), x.get("mbps_max")),
                        _ratio(x.get("ratio")),
                        _ratio(x.get("paired_ratio")),
                        f"{_f(x.get('kept_up'))} of {rounds}",
                    ]
                )
            out += _table(
                ["receiver", "MB/s", MINMAX, f"{TIMES} bare", f"paired {TIMES} bare", "kept up"],
                rows,
            )
        else:  # a JSON from before the rounds: one pass each
            out += _table(
                ["receiver", "MB/s", f"{TIMES} bare"],
                [
                    ["bare `recv_into`", _f(iv.get("bare_recv_mbps")), "1.000"],
                    ["shadow node", _f(iv.get("shadow_ingest_mbps")), _ratio(iv.get("ratio"))],
                ],
            )
        rows = []
        for opt, x in sorted((ing.get("stream") or {}).items()):
            med = x.get("median") or {}
            rows.append(
                [
                    opt,
                    _f(x.get("params")),
                    _f(x.get("period_s"), 1),
                    "yes" if x.get("keeps_up_at_1_it_per_s") else "no",
                    str(x.get("limit", "-")),
                    _f(med.get("receive_s"), 0, 1e3),
                    _f(med.get("apply_s"), 0, 1e3),
                ]
            )
        if rows:
            out += ["", "Streaming one gradient per period, paced:", ""]
            out += _table(
                [
                    "optimizer",
                    "params",
                    "period s",
                    "keeps up",
                    "limit",
                    "receive ms (median)",
                    "apply ms (median)",
                ],
                rows,
            )
    elif "ingest" in d:
        out += ["", "**Ingest**: not in this run's JSON."]
    return out


def render_auth(d: Doc) -> list[str]:
    out: list[str] = []
    ing = d.get("ingest")
    if isinstance(ing, dict):
        summ, ratios = ing.get("summary") or {}, ing.get("ratios") or {}
        out += [
            f"**End to end** ({_f(ing.get('datagram_payload'))} B DATA payloads, "
            f"{_f(ing.get('bytes_per_pass'), 0, 1e-6)} MB per pass, {ing.get('rounds')} "
            "interleaved rounds). Baseline: a bare `recv_into` loop in the same run. "
            "`bare_box` (where the run has it): the same loop receiving each datagram after the "
            "last into memory the size of the pass, faulted in beforehand, as a shadow's "
            "recycled boxes are: the kernel's copy into memory that is not in cache, without "
            "any check.",
            "",
        ]
        rows = []
        box = "bare_box" in summ
        for name in ("bare", "bare_box", "ingest_crc", "ingest_mac"):
            x = summ.get(name)
            if x is None:
                continue
            r = "1.000" if name == "bare" else _ratio(ratios.get(f"{name}_vs_bare"))
            pr = "-" if name == "bare" else _ratio(ratios.get(f"paired_{name}_vs_bare"))
            row = [
                f"`{name}`",
                _f(x.get("mbps_median")),
                _range(x.get("mbps_min"), x.get("mbps_max")),
                r,
                pr,
            ]
            if box:
                row.append(
                    _ratio(ratios.get(f"{name}_vs_bare_box"))
                    if name.startswith("ingest")
                    else ("1.000" if name == "bare_box" else "-")
                )
            rows.append([*row, _f(x.get("cpu_s_per_gb_median"), 3)])
        head = ["receiver", "MB/s", MINMAX, f"{TIMES} bare", f"paired {TIMES} bare"]
        if box:
            head.append(f"{TIMES} bare_box")
        out += _table([*head, "CPU s/GB"], rows)
    micro = d.get("micro")
    if isinstance(micro, dict):
        h = micro.get("hashes") or {}
        out += [
            "",
            f"**In process**, GB/s on {_f(h.get('buffer_bytes'))} B: "
            + ", ".join(
                f"{k[: -len('_gbps')]} {_f(v, 2)}" for k, v in h.items() if k.endswith("_gbps")
            )
            + (
                f". The data-path GMAC is {_f(h.get('gmac_over_blake2b_speed'), 1)}{TIMES} "
                f"the keyed BLAKE2b it replaced (goal: ≥ 4 GB/s and ≥ 8{TIMES}). "
                if h.get("gmac_over_blake2b_speed") is not None
                else ". "
            )
            + (
                "The shadow checks its runs of DATA in C (shadow/_rxnative.c): `rx_gmac` and "
                "`rx_crc32c` are that loop's own checks (its GMAC through the system's "
                "OpenSSL, the same tag as `wire_gmac`"
                + (
                    f"; its CRC-32C {_CRC_IMPLS.get(h['rx_crc32c_impl'], h['rx_crc32c_impl'])}"
                    if h.get("rx_crc32c_impl")
                    else ""
                )
                + "). "
                if h.get("rx_loop") == "c"
                else ""
            )
            + "DATA per MB:",
            "",
        ]
        rows = []
        for label, x in (micro.get("data") or {}).items():
            rows.append(
                [
                    f"{_f(x.get('chunk_bytes'))} B ({label})",
                    _f(x.get("sender_us_per_mb_crc")),
                    _f(x.get("sender_us_per_mb_mac")),
                    _f(x.get("receiver_us_per_mb_crc")),
                    _f(x.get("receiver_us_per_mb_mac")),
                ]
            )
        out += _table(
            ["chunk", "send µs/MB CRC", "send µs/MB MAC", "receive µs/MB CRC", "receive µs/MB MAC"],
            rows,
        )
    per = _get(d, "per_iteration", "records_per_iteration")
    if isinstance(per, dict) and per:
        out += [
            "",
            f"**Records per iteration** (period {_get(d, 'per_iteration', 'period_s')} s,"
            " COMMIT + READY refreshes), µs of CPU for the whole job:",
            "",
        ]
        rows = [
            [
                k,
                _f(_get(v, "without_mac_total", "job_total_us")),
                _f(_get(v, "with_mac_total", "job_total_us")),
                _f(_get(v, "added_by_mac", "job_total_us")),
            ]
            for k, v in sorted(per.items(), key=lambda kv: int(kv[0]))
        ]
        out += _table(["shadows", "without MAC", "with MAC", "added by MAC"], rows)
        if any(r[3].startswith("-") for r in rows):
            out += [
                "",
                "A negative cost added by the MAC is noise larger than the effect: the "
                "record timings of this run were disturbed by other load.",
            ]
    if not out:
        out = ["(no figures in this JSON)"]
    return out


def _times_range(times: Any, scale: float) -> str:
    if isinstance(times, list) and times and all(isinstance(t, int | float) for t in times):
        return _range(min(times), max(times), 1, scale)
    return "-"


def _med_range(st: Any, digits: int, scale: float) -> tuple[str, str]:
    """(median, min - max) cells of a ``{"median", "min", "max"}`` dict."""
    if not isinstance(st, dict):
        return "-", "-"
    return _f(st.get("median"), digits, scale), _range(st.get("min"), st.get("max"), digits, scale)


def _round_range(r: Doc, scale: float, digits: int = 1) -> str:
    """min - max of the per-round medians (older JSON: of the iterations)."""
    rm = r.get("round_medians_s")
    if isinstance(rm, list) and rm:
        return _range(min(rm), max(rm), digits, scale)
    return _times_range(r.get("times"), scale)


def render_trainer(d: Doc) -> list[str]:
    rounds = d.get("rounds") or 1
    out = [
        f"{d.get('world')} DDP ranks (gloo, CPU; MLP + AdamW, batch {d.get('batch')}), "
        f"{d.get('iters')} measured iterations per variant and round after "
        f"{d.get('warmup', '?')} warm-up, {rounds} interleaved rounds, "
        f"{d.get('num_shadows')} shadows. Baseline: `none` (no checkpoint) in the same run. "
        "ms/iter: median of the pooled iterations on rank 0; min "
        f"{DASH} max: of the {rounds} round medians. `name:K` checkpoints every K-th "
        "iteration; its cost per checkpoint is the excess over `none` per checkpoint "
        "(blocking stall plus the background write's spill-over into the following "
        "iterations); *durable*: `async_save` called until its future is done. "
        "`mirror` with `real` shadows runs them on the same 2 cores as the ranks (the "
        "whole-machine cost); `sink` shadows only drain their sockets (the trainer's own "
        "critical path; one thread, `MSG_TRUNC`: the kernel frees each datagram without "
        "copying it out, as little of the ranks' cores as a receiver can take).",
        "",
    ]
    rows = []
    for r in d.get("results") or []:
        if r.get("world", d.get("world")) != d.get("world") or (
            r.get("num_shadows") not in (None, d.get("num_shadows"))
        ):
            continue  # the scaling cells are rendered by render_scaling
        cost, cost_rng = _med_range(r.get("cost_per_checkpoint_s"), 1, 1e3)
        dur, _ = _med_range(r.get("durable_s"), 1, 1e3)
        rows.append(
            [
                str(r.get("size")),
                f"`{r.get('variant')}`",
                _f(r.get("params")),
                _f(r.get("median_s"), 1, 1e3),
                _round_range(r, 1e3),
                _ratio(r.get("ratio")),
                cost,
                cost_rng,
                dur,
                str(r.get("shadows") or "-"),
            ]
        )
    out += _table(
        [
            "size",
            "variant",
            "params",
            "ms/iter",
            MINMAX,
            f"{TIMES} none",
            "ms per checkpoint",
            MINMAX,
            "durable ms",
            "shadows",
        ],
        rows,
    )
    out += ["", "![trainer iteration time](img/bench_trainer.png)"]
    return out


def render_scaling(d: Doc) -> list[str]:
    out = [
        f"Mirror mode against no checkpoint as the job grows: world sizes "
        f"{d.get('worlds')}, shadow counts {d.get('shadow_counts')} (replication 1, real "
        "shadow nodes in the bench's process: they share the machine's cores with the "
        f"ranks), {d.get('rounds')} interleaved "
        f"rounds of {d.get('iters')} iterations. Model size scaling (10M {DASH} 100M) is in "
        "[trainer_bench](#trainer_bench).",
        "",
    ]
    rows = []
    for r in d.get("results") or []:
        rows.append(
            [
                str(r.get("size")),
                str(r.get("world")),
                f"`{r.get('variant')}`",
                "-" if r.get("num_shadows") is None else str(r.get("num_shadows")),
                _f(r.get("median_s"), 1, 1e3),
                _round_range(r, 1e3),
                _ratio(r.get("ratio")),
            ]
        )
    out += _table(
        ["size", "trainers", "variant", "shadows", "ms/iter", MINMAX, f"{TIMES} none"], rows
    )
    out += ["", "![scaling](img/bench_scaling.png)"]
    return out


def _mirror_met(x: Doc) -> bool:
    """The mirror-cost goal: ``mirror_sink`` at most 1 + :data:`GOAL_MIRROR` times ``none`` in
    trainer_bench and, where trainer_paired ran for the size, there too."""
    return all(
        r is None or r <= 1 + GOAL_MIRROR for r in (x.get("sink_ratio") or 9, x.get("paired_ratio"))
    )


def _floor_sentence(paired: list[Doc]) -> str:
    """What the sender's bytes cost the kernel alone (trainer_paired's bare sendmsg loop)."""
    parts = [
        f"{x['size']}: {_f(x.get('bare_send_mb'), 1)} MB per capture, a bare loop "
        f"{_f(x['bare_send_ms'], 1)} ms, the sender {_f(x['sender_cpu_ms'], 1)} ms "
        f"({TIMES}{_f(x['sender_cpu_ms'] / x['bare_send_ms'], 2)})"
        for x in paired
        if x.get("bare_send_ms") and x.get("sender_cpu_ms") is not None
    ]
    if not parts:
        return ""
    return (
        " The floor, in the same processes after the blocks: a bare `sendmsg` loop of what "
        "rank 0's sender sent per capture (datagrams of the same size to a sink, nothing "
        "sealed, one call each) against the sender thread's own CPU per capture (sealing, its "
        "Python, COMMITs and heartbeats included) — " + "; ".join(parts) + ". Moving the "
        "checkpoint's bytes through this machine's kernel costs about the bare loop's CPU "
        "whatever sends them (a little less from C: one Python call per datagram is in it), "
        "and on cores the ranks fill that CPU is wall time."
    )


def _paired_sentence(paired: list[Doc]) -> str:
    """The goal section's account of trainer_paired (``analyze``'s ``mirror_paired``)."""
    parts = [
        f"{x['size']} {_ratio(x.get('ratio'))}{TIMES} (pooled; the median pair "
        f"{_ratio(x.get('pair_median'))}{TIMES}, quartiles {_ratio(x.get('pair_q1'))}{DASH}"
        f"{_ratio(x.get('pair_q3'))}, {x.get('pairs')} pairs"
        + (
            f"; rank 0's training thread's own CPU {_ratio(x['main_cpu_ratio'])}{TIMES}"
            if x.get("main_cpu_ratio") is not None
            else ""
        )
        + ")"
        for x in paired
    ]
    return (
        "The same two variants in the same rank processes, in alternating blocks of "
        "iterations ([trainer_paired](#trainer_paired), so both get the same seconds of the "
        f"machine): `mirror_sink` {TIMES} `none` "
        + "; ".join(parts)
        + "."
        + _floor_sentence(paired)
    )


def render_paired(d: Doc) -> list[str]:
    out = [
        "`none` and `mirror_sink` (mirror mode against UDP sinks) in the same "
        f"{d.get('world')} rank processes: two copies of the model from one seed, run in "
        f"alternating blocks of iterations (`trainer_bench.py --variants paired`; which "
        "variant goes first alternates, the first iteration of a block is not timed, a mirror "
        "block ends with an untimed flush, so every timed mirror iteration runs beside the "
        "previous one's send and no plain one does). Per-iteration time on rank 0; "
        f"{TIMES} none: the pooled medians' ratio; per pair: each pair of blocks' ratio of "
        "medians. *training thread CPU*: rank 0's training thread's own CPU per timed "
        "iteration (`time.thread_time`; mirror: the capture included), medians: where it "
        "grows by more than the capture, the training itself ran slower beside the sender. "
        "*sender CPU*: rank 0's sender thread's CPU per capture (sealing, sending, COMMITs, "
        "heartbeats); *bare sendmsg*: after the blocks, in the same process, a bare "
        "`sendmsg` loop of the same bytes per capture in datagrams of the same size to a sink "
        "(nothing sealed), every rank at once, medians: the kernel's part and one Python call "
        "per datagram, with nothing sealed or kept.",
        "",
    ]
    rows = []
    for r in d.get("results") or []:
        q = r.get("pair_ratio_quartiles") or [None, None, None]
        rows.append(
            [
                str(r.get("size")),
                str(r.get("block")),
                str(len(r.get("pair_ratios") or [])),
                _f(r.get("base_median_s"), 1, 1e3),
                _f(r.get("median_s"), 1, 1e3),
                _ratio(r.get("ratio")),
                _ratio(r.get("pair_ratio_median")),
                f"{_ratio(q[0])}{DASH}{_ratio(q[2])}",
                _f(r.get("base_main_cpu_s"), 1, 1e3),
                _f(r.get("main_cpu_s"), 1, 1e3),
                _ratio(_ratio_of(r.get("main_cpu_s"), r.get("base_main_cpu_s"))),
                _f(r.get("sender_cpu_per_capture_s"), 1, 1e3),
                _f(r.get("bare_send_cpu_s"), 1, 1e3),
                " ".join(_ratio(x) for x in r.get("pair_ratios") or []),
            ]
        )
    out += _table(
        [
            "size",
            "block",
            "pairs",
            "none ms/iter",
            "mirror_sink ms/iter",
            f"{TIMES} none",
            "median pair",
            "quartiles",
            "none training thread CPU ms",
            "mirror_sink training thread CPU ms",
            f"CPU {TIMES}",
            "sender CPU ms/capture",
            "bare sendmsg ms",
            "every pair",
        ],
        rows,
    )
    return out


def render_lostwork(d: Doc) -> list[str]:
    out = [
        f"`shadowgrad demo` run {d.get('runs')} time(s) per scenario; each fault's work "
        "lost (completed iterations run again after the restore, besides the interrupted "
        "one), detection (fault -> controller's verdict) and recovery (fault -> first new "
        "iteration, or the shadow back in step) as the demo's report measured them; median "
        f"and {MINMAX} over the runs.",
        "",
    ]
    rows = []
    for sc in d.get("scenarios") or []:
        for kind, k in (sc.get("by_kind") or {}).items():
            lost = k.get("lost_iterations") or {}
            det, det_r = _med_range(k.get("detect_s"), 2, 1)
            rec, rec_r = _med_range(k.get("recover_s"), 2, 1)
            d2r, _ = _med_range(k.get("detect_to_resume_s"), 2, 1)
            rows.append(
                [
                    f"`{sc.get('scenario')}` ({sc.get('mode')}, {sc.get('topology')})",
                    kind,
                    _f(k.get("faults")),
                    _f(lost.get("median")),
                    _f(lost.get("max")),
                    det,
                    det_r,
                    rec,
                    rec_r,
                    d2r,
                ]
            )
    out += _table(
        [
            "scenario",
            "fault",
            "faults",
            "lost iterations",
            "max",
            "detect s",
            MINMAX,
            "recover s",
            MINMAX,
            "detect -> resume s",
        ],
        rows,
    )
    ok = [sc.get("ok") and sc.get("bit_exact") for sc in d.get("scenarios") or []]
    out += [
        "",
        "Every run passed the demo's checks (bit-identical resume, losses equal to an "
        "uninterrupted reference, work lost within bound): "
        + ("yes" if ok and all(ok) else "NO")
        + ".",
    ]
    return out


def render_inband(d: Doc) -> list[str]:
    out = [
        f"{d.get('world')} DDP ranks (gloo, CPU), {d.get('iters')} iterations {TIMES} "
        f"{d.get('rounds')} rounds per variant, {d.get('shadows')} shadows (replication "
        f"{d.get('replication')}). Baselines in the same run: plain DDP (`ddp`) and the clean "
        "ring (`ring`: the same ring through the same switch without shadowgrad); "
        f"per-iteration time on rank 0, median, p10 {DASH} p90 and {MINMAX}; bytes (all "
        "ranks' ring links) and CPU (getrusage) per iteration against `ring`; the switch's "
        "packet rate during the iterations. Rows `@pinned`: the ranks on other CPUs than "
        "the switch and the shadows.",
        "",
    ]
    rows = []
    for r in d.get("results") or []:
        st = r.get("stats_s") or {}
        last = r.get("shadows_at_last")
        rows.append(
            [
                str(r.get("size")),
                f"`{r.get('variant')}`",
                _f(r.get("params")),
                _f(st.get("median"), 2, 1e3),
                _range(st.get("p10"), st.get("p90"), 2, 1e3),
                _range(st.get("min"), st.get("max"), 2, 1e3),
                _ratio(r.get("ratio_to_ddp")),
                _ratio(r.get("ratio_to_ring")),
                _ratio4(_get(r, "vs_ring", "link_bytes_per_iter")),
                _ratio4(_get(r, "vs_ring", "rusage_cpu_per_iter")),
                _f(_get(r, "switch_rate", "pps_iterations")),
                "-" if last is None else ("yes" if last else "no"),
            ]
        )
    out += _table(
        [
            "size",
            "variant",
            "params",
            "ms/iter",
            f"p10 {DASH} p90",
            MINMAX,
            f"{TIMES} ddp",
            f"{TIMES} ring",
            f"bytes {TIMES} ring",
            f"CPU {TIMES} ring",
            "switch pkt/s",
            "shadows at last",
        ],
        rows,
    )
    return out


def render_reseed(d: Doc) -> list[str]:
    out = [
        f"Largest shard of a 3-shadow layout; {d.get('repeat')} repeats, median and "
        f"{MINMAX}. Baseline: a `copy_` of the same bytes into preallocated memory in the "
        "same run.",
        "",
    ]
    rows = []
    for r in d.get("results") or []:
        p, m, it = r.get("pause_ms") or {}, r.get("memcpy_ms") or {}, r.get("iteration_ms") or {}
        rows.append(
            [
                str(r.get("size")),
                _f(r.get("shard_state_bytes"), 1, 2**-20),
                _f(p.get("median"), 2),
                _range(p.get("min"), p.get("max"), 2),
                _f(m.get("median"), 2),
                _ratio(r.get("pause_vs_memcpy")),
                _f(it.get("median"), 1),
                _ratio(r.get("pause_vs_iteration")),
            ]
        )
    out += _table(
        [
            "size",
            "shard MiB",
            "pause ms",
            MINMAX,
            "memcpy ms",
            f"{TIMES} memcpy",
            "iteration ms",
            f"{TIMES} iteration",
        ],
        rows,
    )
    loads = d.get("load") or []
    if loads:
        hog = d.get("hog") or 0
        out += [
            "",
            "**Re-seed into a restarted shadow** (issue 21): a real `shadowgrad shadow` process "
            "started per repeat; *answers*: its first `status` reply (the control socket is "
            "bound before torch is imported), *ready*: the first reply no longer `starting`; "
            "then the trainer's re-seed `load` of its shard, the first one into the fresh "
            "process and the median of warm ones; *transfer*: one way, from the call until the "
            "shadow took the request off its socket, its clock related to the trainer's by "
            "status polls (`trainer.reseed`'s `send_mb_s`; the round trip less the install "
            "before). Baseline: a bare zmq round trip of the same frames to a REP socket in "
            "another process, same run (the load's round trip is what compares with it)"
            + (f"; {hog} busy loops ran meanwhile" if hog else "")
            + f". Goals: transfer ≥ {GOAL_RESEED_MB_S:.0f} MB/s, answers ≤ "
            f"{GOAL_ANSWER_S:.0f} s.",
            "",
        ]
        lrows = []
        for r in loads:
            mb = r.get("first_send_MB_s")
            ans = r.get("status_s_max")
            met = (
                isinstance(mb, int | float)
                and isinstance(ans, int | float)
                and mb >= GOAL_RESEED_MB_S
                and ans <= GOAL_ANSWER_S
            )
            lrows.append(
                [
                    f"`{r.get('model')}`",
                    _f(r.get("bytes"), 2, 1e-6),
                    f"{_f(r.get('status_s'), 2)} (max {_f(ans, 2)})",
                    f"{_f(r.get('ready_s'), 2)} (max {_f(r.get('ready_s_max'), 2)})",
                    _f(r.get("first_load_ms"), 1),
                    _f(mb),
                    _ratio(r.get("first_send_vs_zmq")),
                    _f(r.get("warm_load_MB_s")),
                    _f(r.get("zmq_MB_s")),
                    "met" if met else "missed",
                ]
            )
        out += _table(
            [
                "model",
                "shard MB",
                "answers s",
                "ready s",
                "first load ms",
                "transfer MB/s",
                f"{TIMES} zmq",
                "warm load MB/s",
                "bare zmq MB/s",
                "goal",
            ],
            lrows,
        )
    return out


def _phases(p: Any) -> str:
    if not isinstance(p, dict) or not p:
        return "-"
    return ", ".join(f"{k.replace('_', ' ')} {_f(v)}" for k, v in p.items())


def render_recovery(d: Doc) -> list[str]:
    t = d.get("timeouts") or {}
    cores_n = (d.get("machine") or {}).get("cores", "?")
    out = [
        f"World size 1, MLP + {d.get('optimizer', 'AdamW')}, a restart after "
        f"{d.get('first_iters')} iterations; {d.get('rounds')} rounds after "
        f"{d.get('warmup')} warm-up, "
        + (
            "one block per shadow count (one cluster up at a time) in which the cluster and "
            "both baselines recover once per round in a rotating order (the baselines' rows: "
            "every block's rounds; a cluster's ratios: against the baseline in its own block)"
            if "shadow_nodes" in d
            else "each variant once per round in a rotating order"
        )
        + f"; median and {MINMAX} over the rounds. Baseline: `dcp_load`, a new model + optimizer, "
        "`get_state_dict`, `dcp.load` of the same state from a local directory "
        f"({d.get('checkpoint_fs') or '?'}, files in the page cache) and `set_state_dict`, in "
        "the same run; `torch_load` is `torch.load` of a `torch.save` file + "
        "`load_state_dict`. `shadowgrad` is a new model + optimizer, `attach` and "
        f"`restore_or_start` against N shadows (replication {d.get('replication')}, "
        + (
            "`shadowgrad shadow` processes"
            if d.get("shadow_nodes") == "processes"
            else "threads of the bench's process"
        )
        + " on loopback). *restore*: from building the model until the "
        "state is in place; *+ 1st iteration*: plus one forward, backward and step."
        + (
            f" Quick mode: {d.get('rounds')} rounds, not the 5 of a full run."
            if d.get("quick")
            else ""
        ),
        "",
    ]
    rows, phases = [], []
    checked = []
    for s in d.get("sizes") or []:
        label = f"{s.get('size')} ({_f(s.get('state_bytes'), 0, 2**-20)} MiB)"
        for v in s.get("variants") or []:
            re, rb = v.get("restore_ms") or {}, v.get("restore_plus_first_ms") or {}
            q = v.get("ratio_to_dcp_load") or {}
            shadows = "-" if v.get("shadows") is None else str(v.get("shadows"))
            rows.append(
                [
                    label,
                    f"`{v.get('variant')}`",
                    shadows,
                    _f(re.get("median")),
                    _range(re.get("min"), re.get("max")),
                    _ratio(q.get("restore")),
                    _f(rb.get("median")),
                    _range(rb.get("min"), rb.get("max")),
                    _ratio(q.get("restore_plus_first")),
                ]
            )
            cores = v.get("fetch_cores_median")
            phases.append(
                [
                    label,
                    f"`{v.get('variant')}`",
                    shadows,
                    _phases(v.get("phases_ms_median")),
                    "-" if cores is None else f"{cores:.2f}",
                ]
            )
            checked.append(bool(v.get("verified")))
    out += _table(
        [
            "size (state)",
            "variant",
            "shadows",
            "restore ms",
            MINMAX,
            f"{TIMES} DCP load",
            "+ 1st iteration ms",
            MINMAX,
            f"{TIMES} DCP load",
        ],
        rows,
    )
    out += [
        "",
        "Where a restore's time goes (median ms per phase; `survey`: status of every shadow "
        "and the settle, which ends at once when nothing is left to apply, else polls every "
        f"`timeouts.gap_repair` = {t.get('gap_repair', '?')}, then the hold of I\\*; "
        "`fetch load`: fetch every shard at once, received straight into the parameters and "
        "optimizer state (the bulk channel), each chunk verified as it lands; `reseed`: the "
        "shadows start the new session from their own state of I\\*, sent again only to one "
        "that has not got it; *cores busy in "
        "fetch*: CPU seconds of the restoring process and of the shadows during `fetch load`, "
        "over its wall time — near the machine's cores, more shadows cannot make it faster):",
        "",
    ]
    out += _table(
        ["size (state)", "variant", "shadows", "phases", f"cores busy in fetch (of {cores_n})"],
        phases,
    )
    out += [
        "",
        "Restored state equal (`torch.equal`, every parameter and optimizer state "
        "tensor) to the state the previous session ended with or the files hold: "
        f"{'yes, every round' if checked and all(checked) else 'NOT verified'}.",
    ]
    return out


def render_switch(d: Doc) -> list[str]:
    out = [
        f"Program `{d.get('program')}`; {d.get('method')}. Baseline: a bare Python AF_PACKET "
        f"forward loop in the same run; goal {_pct(d.get('goal_ratio'))} of it.",
        "",
    ]
    rows = [
        [
            str(r.get("copies")),
            f"{_f(r.get('payload'))} B",
            _f(r.get("bare_pps")),
            _f(r.get("target_pps")),
            _ratio(r.get("ratio")),
            "yes" if r.get("meets_goal") else "no",
        ]
        for r in d.get("summary") or []
    ]
    out += _table(
        ["copies", "UDP payload", "bare pps", "target pps", f"{TIMES} bare", "meets goal"], rows
    )
    return out


# ---------------------------------------------------------------------------------------------
# the goals: figures derived from several benches' JSON (bench/results/summary.json)
# ---------------------------------------------------------------------------------------------

#: seed 004's MTBF (Llama 3 405B: 419 unexpected interruptions in 54 days) and run length
MTBF_S = 3.09 * 3600
TOTAL_S = 1296 * 3600
OVERHEAD_BUDGET = 0.01  #: "checkpoint frequency achievable at <= 1 % trainer overhead"
GOAL_INBAND = 0.01  #: in-band trainer CPU per iteration over the clean ring's
GOAL_INBAND_BYTES = 0.001  #: in-band trainer bytes per iteration over the clean ring's
GOAL_STALL = 10.0  #: DCP async_save every iteration stalls >= 10x more than shadowgrad
GOAL_MIRROR = 0.05  #: mirror mode against sinks costs the trainer <= 5 % over none
GOAL_RESEED_MB_S = 100.0  #: a re-seed's transfer into a restarted shadow, loopback
GOAL_ANSWER_S = 3.0  #: a restarted shadow answers its control port within this


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _trainer_rows(d: Doc | None) -> dict[tuple[str, str], Doc]:
    """(size, variant) -> result of trainer_bench's main cells (its own world and shadows)."""
    out: dict[tuple[str, str], Doc] = {}
    for r in (d or {}).get("results") or []:
        if r.get("world", d.get("world")) == (d or {}).get("world") and r.get("num_shadows") in (
            None,
            (d or {}).get("num_shadows"),
        ):
            out[(str(r.get("size")), str(r.get("variant")))] = r
    return out


def _delta(a: Any, b: Any) -> float | None:
    x, y = _num(a), _num(b)
    return None if x is None or y is None else x - y


def _ratio_of(a: Any, b: Any) -> float | None:
    x, y = _num(a), _num(b)
    return None if x is None or y is None or y <= 0 else x / y


def _excess(r: Doc | None, base: Doc | None) -> float | None:
    """Median per-iteration time over the baseline's (older JSON: difference of medians)."""
    ex = _num(_get(r, "excess_per_iteration_s", "median"))
    if ex is not None:
        return ex
    a, b = _num(_get(r, "median_s")), _num(_get(base, "median_s"))
    return None if a is None or b is None else a - b


def analyze(found: dict[str, tuple[Path, Doc | None]]) -> Doc:
    """The headline figures, derived from the benches' JSON by fixed rules (no clock, no
    measurement): what docs/benchmarks.md's *Goals* section and README's benchmark lines show,
    and what bench/results/summary.json holds. Planner figures use :mod:`shadowgrad.planner`,
    the model behind ``shadowgrad plan``."""
    from shadowgrad.planner import ledger, young_interval

    tb = found.get("trainer_bench", (Path(), None))[1]
    ib = found.get("inband_bench", (Path(), None))[1]
    rb = found.get("recovery_bench", (Path(), None))[1]
    lw = found.get("lostwork_bench", (Path(), None))[1]
    sb = found.get("shadow_bench", (Path(), None))[1]
    sw = found.get("switch_bench", (Path(), None))[1]
    out: Doc = {
        "summary": 1,
        "mtbf_s": MTBF_S,
        "total_s": TOTAL_S,
        "overhead_budget": OVERHEAD_BUDGET,
    }
    # 0. mirror_sink against none in the same processes, alternating blocks (trainer_paired)
    tp = found.get("trainer_paired", (Path(), None))[1]
    paired = []
    for r in (tp or {}).get("results") or []:
        q = r.get("pair_ratio_quartiles") or [None, None, None]
        paired.append(
            {
                "size": r.get("size"),
                "ratio": _num(r.get("ratio")),
                "pair_median": _num(r.get("pair_ratio_median")),
                "pair_q1": _num(q[0]),
                "pair_q3": _num(q[2]),
                "pairs": len(r.get("pair_ratios") or []),
                # rank 0's training thread's own CPU per iteration, mirror over plain
                "main_cpu_ratio": _ratio_of(r.get("main_cpu_s"), r.get("base_main_cpu_s")),
                # rank 0's sender thread's CPU per capture, and a bare sendmsg loop of the same
                # bytes in the same process (trainer_bench.bare_send_floor)
                "sender_cpu_ms": _ms_of(r.get("sender_cpu_per_capture_s")),
                "bare_send_ms": _ms_of(r.get("bare_send_cpu_s")),
                "bare_send_mb": None
                if _num(r.get("bare_send_bytes")) is None
                else r["bare_send_bytes"] / 1e6,
            }
        )
    if paired:
        out["mirror_paired"] = paired

    # 1. in-band against the clean ring (the same ring through the same switch, no shadowgrad:
    # no tap, no COMMITs, nothing retained, no MACs): bytes and CPU per rank and iteration
    inb: Doc = {"goal_bytes": GOAL_INBAND_BYTES, "goal_cpu": GOAL_INBAND}
    rows = {(str(r.get("size")), str(r.get("variant"))): r for r in (ib or {}).get("results") or []}
    for (size, name), r in rows.items():
        variant, _, pin = name.partition("@")
        base = rows.get((size, "ring" + ("@" + pin if pin else "")))
        vs = r.get("vs_ring") or {}
        if variant != "inband" or base is None or not vs:
            continue
        a, b = _num(_get(r, "stats_s", "median")), _num(_get(base, "stats_s", "median"))
        nbytes = _num(vs.get("link_bytes_per_iter"))
        cpu = _num(vs.get("rusage_cpu_per_iter"))
        pe, pb = r.get("per_rank_per_iter") or {}, base.get("per_rank_per_iter") or {}
        inb.setdefault("sizes", []).append(
            {
                "size": size,
                "pinned": bool(pin),
                "inband_ms": None if a is None else a * 1e3,
                "ring_ms": None if b is None else b * 1e3,
                "time_ratio": None if a is None or not b else a / b,
                "bytes_ratio": nbytes,
                "switch_rx_bytes_ratio": _num(vs.get("switch_rx_bytes_per_iter")),
                "cpu_ratio": cpu,
                "inband_bytes_per_rank_iter": pe.get("link_bytes"),
                "ring_bytes_per_rank_iter": pb.get("link_bytes"),
                "inband_cpu_per_rank_iter_s": pe.get("rusage_cpu_s"),
                "ring_cpu_per_rank_iter_s": pb.get("rusage_cpu_s"),
                "switch_cores": _get(r, "switch_rate", "cpu_cores"),
                "ddp_ratio": _num(r.get("ratio_to_ddp")),
                "shadows_at_last": r.get("shadows_at_last"),
                "bytes_met": nbytes is not None and nbytes - 1 <= GOAL_INBAND_BYTES,
                "cpu_met": cpu is not None and cpu - 1 <= GOAL_INBAND,
                # all ranks' CPU ms per iteration by thread, in-band less the clean ring
                "thread_cpu_excess_ms": {
                    n: v * 1e3 for n, v in (vs.get("thread_cpu_excess_s") or {}).items()
                },
                "mac_cpu_ratio": _num(
                    _get(
                        rows.get((size, "ring_mac" + ("@" + pin if pin else ""))) or {},
                        "vs_ring",
                        "rusage_cpu_per_iter",
                    )
                ),
                # in-band against the clean ring with the same MACs, in the same run: what
                # shadowgrad adds beyond authenticating the FINAL bytes (inband_bench's vs_ring_mac)
                "beyond_mac_cpu_ratio": _num(_get(r, "vs_ring_mac", "rusage_cpu_per_iter")),
                # the ring engine's minor page faults per iteration (all ranks) against the
                # clean ring's, and the session's retention depth (iterations of FINAL bytes)
                "ring_faults_excess": _num(_get(vs, "thread_faults_excess", "shadowgrad-ring")),
                "ring_retain": _num(_get(r, "runs", 0, "session", "ring_retain")),
                "measured_iterations": (
                    None
                    if _num((ib or {}).get("warmup")) is None
                    or _num((ib or {}).get("iters")) is None
                    else [int(ib["warmup"]), int(ib["warmup"]) + int(ib["iters"]) - 1]
                ),
                "tap_control": _tap_control(
                    r, rows.get((size, "inband_notap" + ("@" + pin if pin else "")))
                ),
            }
        )
    from shadowgrad.wire import MAC_SIZE

    for x in inb.get("sizes") or []:
        x["meets_goal"] = x["bytes_met"] and x["cpu_met"]
        r = rows[(x["size"], "inband" + ("@pinned" if x["pinned"] else ""))]
        mine = _get(r, "per_rank_per_iter", "link_bytes") or []
        theirs = x.get("ring_bytes_per_rank_iter") or []
        # the datagrams with a MAC trailer (FINAL DATA, ACKs, COMMITs; runs before the count
        # existed have none, and no breakdown)
        grams = _get(r, "per_rank_per_iter", "link_sealed") or []
        if all(_num(v) is not None for v in [*mine, *theirs, *grams]) and mine and theirs and grams:
            excess = sum(mine) - sum(theirs)
            macs = sum(grams) * MAC_SIZE
            x["bytes_excess_breakdown"] = {
                "excess": excess,
                "datagrams": sum(grams),
                "mac_size": MAC_SIZE,
                "mac_bytes": macs,
                "other": excess - macs,
            }
        x["verdict"] = "met" if x["meets_goal"] else "missed"
    out["inband"] = inb

    # 2. per-iteration stall: shadowgrad mirror against DCP async_save every iteration
    trows = _trainer_rows(tb)
    sizes = list(dict.fromkeys(k[0] for k in trows))
    stall = []
    methods = []
    for size in sizes:
        none = trows.get((size, "none"))
        t = _num(_get(none, "median_s"))
        if t is None:
            continue
        mirror, dcp = trows.get((size, "mirror")), trows.get((size, "dcp_async"))
        sm, sd = _excess(mirror, none), _excess(dcp, none)
        sink = trows.get((size, "mirror_sink"))
        ss = _excess(sink, none) if sink else None  # the trainer's own stall (sinks)
        # trainer_paired's excess, as its ratio of this run's none (the same machine window
        # as the DCP stall it is set against; the paired run's own seconds are of another)
        pr = next((p["ratio"] for p in paired if str(p.get("size")) == str(size)), None)
        sp = None if pr is None else (pr - 1.0) * t
        # the stall the 10x goal is about: the trainer's own critical path, the shadows on
        # machines of their own as the design deploys them (sinks here), the larger of
        # trainer_bench's and trainer_paired's; without either, the co-located shadows' stall
        # (an upper bound: their ingest and replay share the ranks' cores)
        own = [v for v in (ss, sp) if v is not None]
        st = max(own) if own else sm
        real_ok = None if sm is None or sd is None else sm <= sd
        stall.append(
            {
                "size": size,
                "params": _get(none, "params"),
                "iteration_s": t,
                "mirror_stall_s": sm,
                "mirror_shadows": _get(mirror, "shadows"),
                "trainer_only_stall_s": ss,
                "paired_stall_s": sp,
                "trainer_stall_s": st,
                "dcp_every_iteration_stall_s": sd,
                "dcp_over_mirror": (sd / sm) if sm and sd is not None and sm > 0 else None,
                "dcp_over_trainer": (sd / st) if st and sd is not None and st > 0 else None,
                # with real shadows co-located on the ranks' cores: no worse than DCP
                "real_within_dcp": real_ok,
                # the checkpoint's own time on the training thread (mirror: the capture;
                # DCP: get_state_dict + waiting for the previous save + async_save's staging)
                # and the CPU mirror's sender threads use off the critical path, all ranks
                "mirror_blocked_s": _num(
                    _get(sink or mirror, "blocked_per_checkpoint_s", "median")
                ),
                "dcp_blocked_s": _num(_get(dcp, "blocked_per_checkpoint_s", "median")),
                "sender_cpu_per_iter_s": _num(_get(sink or mirror, "sender_cpu_per_iter_s")),
                "world": _get(none, "world"),
                # the trainer's cost with sinks (goal: <= 1.05x none) and where its CPU goes:
                # all ranks' CPU per iteration, the sinks' (this machine's other process),
                # the cores the job keeps busy, and the training threads' growth
                "sink_ratio": _num(_get(sink, "ratio")),
                # the same in one process, alternating blocks (trainer_paired), where run
                "paired_ratio": next(
                    (p["ratio"] for p in paired if str(p.get("size")) == str(size)), None
                ),
                "mirror_ratio": _num(_get(mirror, "ratio")),
                "dcp_ratio": _num(_get(dcp, "ratio")),
                "none_cpu_per_iter_s": _num(_get(none, "ranks_cpu_per_iter_s")),
                "sink_cpu_per_iter_s": _num(_get(sink, "ranks_cpu_per_iter_s")),
                "sink_receiver_cpu_per_iter_s": _num(_get(sink, "receiver_cpu_per_iter_s")),
                "main_thread_growth_s": _delta(
                    _get(sink, "thread_cpu_per_iter_s", "MainThread"),
                    _get(none, "thread_cpu_per_iter_s", "MainThread"),
                ),
                "sink_median_s": _num(_get(sink, "median_s")),
                # page faults per iteration, all ranks: each a page the kernel zeroes
                "none_faults_per_iter": _num(_get(none, "ranks_faults_per_iter")),
                "sink_faults_per_iter": _num(_get(sink, "ranks_faults_per_iter")),
                # the same by thread name (runs before the count existed have none)
                "none_thread_faults": _get(none, "thread_faults_per_iter"),
                "sink_thread_faults": _get(sink, "thread_faults_per_iter"),
                # rank 0's mirror sender: captures, of them sent at SCHED_IDLE, and of those put
                # back to normal priority early (a newer capture came; in the background longer
                # than a heartbeat); absent in runs before the sender had a priority
                "sink_background": {
                    k: _get(sink, "extra", "mirror", k)
                    for k in (
                        "captures",
                        "background_slots",
                        "background_behind",
                        "background_overdue",
                    )
                },
                "cpus": (tb or {}).get("cpus"),
                "meets_goal": (
                    (sd is not None and st is not None and st > 0 and sd / st >= GOAL_STALL)
                    or (st is not None and st <= 0 and (sd or 0) > 0)
                )
                and real_ok is not False,
            }
        )
        # 3.-4. achievable frequency, Young-Daly interval, work lost per failure, ledger
        per_size: Doc = {"size": size, "iteration_s": t, "methods": []}
        rec = _num(_get(lw, "scenarios", 0, "by_kind", "kill_trainer", "recover_s", "median"))
        lost_it = _num(
            _get(lw, "scenarios", 0, "by_kind", "kill_trainer", "lost_iterations", "median")
        )
        lost_max = _num(
            _get(lw, "scenarios", 0, "by_kind", "kill_trainer", "lost_iterations", "max")
        )
        per_size["recovery_s"] = rec
        # shadowgrad at its stall with the shadows this run gave mirror; where those were real
        # (sharing this machine's cores), also at the trainer's own stall (sinks): the shadows
        # on machines of their own, as the design deploys them
        sg_rows = [("shadowgrad mirror", sm)]
        if _get(mirror, "shadows") == "real" and own:
            sg_rows.append(("shadowgrad mirror, shadows elsewhere (sinks)", st))
        for name, stall_s in sg_rows:
            if stall_s is None:
                continue
            t_sg = t + max(stall_s, 0.0)
            over = max(stall_s, 0.0) / t
            m: Doc = {
                "method": name,
                "overhead_every_iteration": over,
                "cost_per_checkpoint_s": max(stall_s, 0.0),
                "min_interval_iterations": 1 if over <= OVERHEAD_BUDGET else None,
                "interval_s": t_sg,
                "interval_iterations": 1,
                "lost_iterations_measured": lost_it,
                "lost_iterations_max": lost_max,
                "lost_per_failure_s": ((lost_it or 0.0) + 0.5) * t_sg,
            }
            if rec is not None:
                lg = ledger(
                    total=TOTAL_S,
                    mtbf=MTBF_S,
                    interval=t_sg,
                    cost=max(stall_s, 0.0),
                    recovery=rec,
                )
                m["useful"] = lg.useful
            per_size["methods"].append(m)
        for variant in ("dcp_async:5", "torch_save:5"):
            r = trows.get((size, variant))
            c = _num(_get(r, "cost_per_checkpoint_s", "median"))
            if r is None or c is None:
                continue
            basis = "excess per checkpoint"
            if c <= 0:
                # the run's noise is larger than the whole cost: fall back on the blocking stall
                # of the checkpoint iterations alone (a lower bound of the cost)
                c = _num(_get(r, "stall_at_checkpoint_s", "median")) or 0.0
                basis = "stall at the checkpoint (excess below noise)"
                if c <= 0:
                    per_size["methods"].append(
                        {
                            "method": variant.split(":")[0],
                            "cost_basis": "below noise",
                            "measured_every": _get(r, "every"),
                        }
                    )
                    continue
            durable = _num(_get(r, "durable_s", "median")) or 0.0
            k_min = max(1, math.ceil(c / (OVERHEAD_BUDGET * t)))
            yd = young_interval(c, MTBF_S)
            m = {
                "method": variant.split(":")[0],
                "measured_every": _get(r, "every"),
                "cost_per_checkpoint_s": c,
                "cost_basis": basis,
                "durable_s": durable,
                "cost_min_s": _num(_get(r, "cost_per_checkpoint_s", "min")),
                "cost_max_s": _num(_get(r, "cost_per_checkpoint_s", "max")),
                "overhead_every_iteration": c / t,
                "min_interval_iterations": k_min,
                "min_interval_s": k_min * t,
                "interval_s": yd,
                "interval_iterations": yd / t,
                "lost_per_failure_s": yd / 2 + durable,
            }
            if rec is not None:
                lg = ledger(total=TOTAL_S, mtbf=MTBF_S, interval=yd, cost=c, recovery=rec)
                m["useful"] = lg.useful
                m["plan"] = (
                    f"shadowgrad plan --mtbf 3.09h --total 1296h --cost {c:.4f}s "
                    f"--recovery {rec:.2f}s"
                    + (
                        f" --iteration {t + max(sm, 0.0):.4f}s --stall {max(sm, 0.0):.4f}s"
                        if sm is not None
                        else ""
                    )
                )
            per_size["methods"].append(m)
        methods.append(per_size)
    out["stall"] = stall
    out["policies"] = methods

    # 5. recovery: restore from the shadows against DCP load of the same state
    recv = []
    for sz in (rb or {}).get("sizes") or []:
        vs = {(v.get("variant"), v.get("shadows")): v for v in sz.get("variants") or []}
        dcp = vs.get(("dcp_load", None))
        one = _num(_get(vs.get(("shadowgrad", 1)), "restore_ms", "median"))
        for (variant, n), v in vs.items():
            if variant != "shadowgrad":
                continue
            ms = _num(_get(v, "restore_ms", "median"))
            ratio = _num(_get(v, "ratio_to_dcp_load", "restore"))
            # the ratio's baseline: the DCP loads of the row's own block of rounds (recorded
            # since bf7ddd0; from older JSON the ratio gives it back exactly: restore / ratio)
            block_dcp = _num(_get(v, "ratio_to_dcp_load", "dcp_load_ms"))
            if block_dcp is None and ms is not None and ratio:
                block_dcp = ms / ratio
            recv.append(
                {
                    "size": sz.get("size"),
                    "shadows": n,
                    "restore_ms": ms,
                    "dcp_load_ms": block_dcp,
                    "dcp_load_ms_all_blocks": _get(dcp, "restore_ms", "median"),
                    "ratio": ratio,
                    "ratio_plus_first": _get(v, "ratio_to_dcp_load", "restore_plus_first"),
                    # the restore from n shadows over the one from 1 (goal at 4: <= 0.5)
                    "ratio_to_one_shadow": ms / one if ms is not None and one else None,
                    "fetch_cores": v.get("fetch_cores_median"),
                    "phases_ms": v.get("phases_ms_median"),
                }
            )
    out["recovery"] = recv
    out["throughput"] = _throughput_goals(found)
    out["cores"] = _get(rb, "machine", "cores")
    out["replay_of_bandwidth"] = _num(_get(sb, "apply", "replayer_fused_adamw", "ratio_to_bound"))
    out["replay_vs_fused"] = _num(_get(sb, "apply", "replayer_vs_fused"))
    sums = [x for x in (sw or {}).get("summary") or [] if isinstance(x, dict)]
    ratios = [r for r in (_num(x.get("ratio")) for x in sums) if r is not None]
    out["switch_ratio_range"] = [min(ratios), max(ratios)] if ratios else None
    return out


#: issue 22's throughput goals: the data-path authenticator, shadow ingest against a bare
#: receive loop (with and without DATA authentication), a 100M AdamW stream at 1 it/s
GOAL_AUTH_GBPS, GOAL_AUTH_VS_BLAKE2B = 4.0, 8.0
GOAL_INGEST_MAC, GOAL_INGEST_CRC = 0.6, 0.8
#: bytes of a DATA payload the per-datagram costs are stated for
_DGRAM = 65280


def _own_work(hashes: Doc, variant: str, own_us: float) -> str:
    """What of the shadow's own per-datagram time (``own_us``, beyond ``bare_box``) the check
    itself takes, from auth_bench part B in the same run (the same 64 KiB chunk in cache: the
    GMAC with its nonce handling, or the CRC-32C), and what is left to the receive loop."""
    in_c = hashes.get("rx_loop") == "c"
    mac = variant == "ingest_mac"
    if in_c:
        key = "rx_gmac_gbps" if mac else "rx_crc32c_gbps"
    else:
        key = "wire_gmac_gbps" if mac else "crc32c_gbps"
    gbps = _num(hashes.get(key))
    if not gbps:
        return ""
    check = _DGRAM / (gbps * 1e3)  # µs per datagram payload at the micro figure's rate
    what = "the GMAC over header and payload" if mac else "the CRC-32C"
    if in_c:
        loop = (
            "the receive loop in C (shadow/_rxnative.c: one recvmsg and the header's "
            "fields and source checked per datagram) and, every 16 datagrams, CPython "
            "covering what verified (the reservation and coverage bookkeeping)"
        )
        if mac:
            what += " (the system's OpenSSL, which the C loop links)"
    else:
        loop = (
            "CPython running the loop per datagram (the header's fields and source "
            "checked, the reservation and coverage bookkeeping, the calls into the kernel "
            "and the MAC)"
        )
    return (
        f": {what} {check:.1f} µs of it (auth_bench's micro rate on a 64 KiB chunk in "
        f"cache, same run), the other {max(0.0, own_us - check):.1f} µs the receive loop "
        f"around it: {loop}"
    )


def _throughput_goals(found: dict[str, tuple[Path, Doc | None]]) -> list[Doc]:
    """One row per throughput goal: what it asks, what was measured (bench, figure), met."""
    ab = found.get("auth_bench", (Path(), None))[1]
    sb = found.get("shadow_bench", (Path(), None))[1]
    rows: list[Doc] = []
    h = _get(ab, "micro", "hashes") or {}
    gmac, over = _num(h.get("wire_gmac_gbps")), _num(h.get("gmac_over_blake2b_speed"))
    # the shadow's C receive loop verifies with its own GMAC (the system's OpenSSL): the goal
    # holds for the data path only where both meet it
    rx_gmac, b2 = _num(h.get("rx_gmac_gbps")), _num(h.get("blake2b128_keyed_gbps"))
    rx_over = rx_gmac / b2 if rx_gmac is not None and b2 else None
    met = (
        gmac is not None
        and over is not None
        and gmac >= GOAL_AUTH_GBPS
        and over >= GOAL_AUTH_VS_BLAKE2B
    )
    measured = None if gmac is None or over is None else f"{gmac:.1f} GB/s, {over:.1f}{TIMES}"
    if measured is not None and rx_gmac is not None and rx_over is not None:
        measured += f"; the shadow's C loop {rx_gmac:.1f} GB/s, {rx_over:.1f}{TIMES}"
        met = met and rx_gmac >= GOAL_AUTH_GBPS and rx_over >= GOAL_AUTH_VS_BLAKE2B
    rows.append(
        {
            "goal": f"data-path MAC ≥ {GOAL_AUTH_GBPS:g} GB/s and "
            f"≥ {GOAL_AUTH_VS_BLAKE2B:g}{TIMES} keyed BLAKE2b (64 KiB)",
            "bench": "auth_bench",
            "measured": measured,
            "met": met,
        }
    )
    summ = _get(ab, "ingest", "summary") or {}
    bare_cpu = _num(_get(summ, "bare", "cpu_s_per_gb_median"))
    box_cpu = _num(_get(summ, "bare_box", "cpu_s_per_gb_median"))
    box_r = _num(_get(ab, "ingest", "ratios", "bare_box_vs_bare"))
    for variant, goal, what in (
        ("ingest_mac", GOAL_INGEST_MAC, "with DATA authenticated"),
        ("ingest_crc", GOAL_INGEST_CRC, "CRC only"),
    ):
        r = _num(_get(ab, "ingest", "ratios", f"{variant}_vs_bare"))
        cpu = _num(_get(summ, variant, "cpu_s_per_gb_median"))
        row: Doc = {
            "goal": f"shadow ingest {what} ≥ {goal:g}{TIMES} a bare `recv_into` loop",
            "bench": "auth_bench",
            "measured": None if r is None else f"{r:.3f}{TIMES}",
            "met": r is not None and r >= goal,
        }
        if r is not None and r < goal and cpu is not None and bare_cpu is not None:
            # the limit, from the same run: the receiving thread's CPU per datagram
            def us(x: float) -> str:
                return f"{x * _DGRAM / 1e3:.1f} µs"

            row["limit"] = (
                f"the shadow's receive thread spends {cpu:.3f} CPU-s per GB "
                f"({us(cpu)} per {_DGRAM:,} B datagram) against the bare "
                f"loop's {bare_cpu:.3f} ({us(bare_cpu)})"
            )
            if box_cpu is not None and box_r is not None:
                r_box = _num(_get(ab, "ingest", "ratios", f"{variant}_vs_bare_box"))
                row["limit"] += (
                    f". The same bare loop receiving into memory the size of the pass "
                    f"(`bare_box`, no check at all) reaches {box_r:.3f}{TIMES} bare at "
                    f"{box_cpu:.3f} CPU-s per GB ({us(box_cpu)}): the kernel's copy into memory "
                    f"that is not in cache, which any receiver that places the bytes where "
                    f"they stay pays, takes {us(box_cpu - bare_cpu)} of the "
                    f"{us(cpu - bare_cpu)} per datagram the shadow adds"
                    + (
                        f" and alone leaves this goal out of reach ({box_r:.3f} < {goal:g})"
                        if box_r < goal
                        else ""
                    )
                    + "; the shadow's own work takes the other "
                    f"{us(cpu - box_cpu)} (ingest "
                    + ("-" if r_box is None else f"{r_box:.3f}{TIMES}")
                    + " `bare_box`)"
                    + _own_work(h, variant, (cpu - box_cpu) * _DGRAM / 1e3)
                    + ", on one core while the producer takes the other"
                )
            else:
                row["limit"] += (
                    ": the kernel's copy into the shard's own memory instead of one hot buffer, "
                    "the verification and the per-datagram bookkeeping in Python, on one core "
                    "while the producer takes the other"
                )
        rows.append(row)
    r = _num(_get(sb, "ingest", "ingest_vs_bare", "ratio"))
    pr = _num(_get(sb, "ingest", "ingest_vs_bare", "paired_ratio"))
    rows.append(
        {
            "goal": f"shadow ingest with DATA authenticated ≥ {GOAL_INGEST_MAC:g}{TIMES} bare "
            "(shadow_bench, which must agree)",
            "bench": "shadow_bench",
            "measured": None
            if r is None
            else f"{r:.3f}{TIMES}" + ("" if pr is None else f" (paired {pr:.3f}{TIMES})"),
            "met": r is not None and r >= GOAL_INGEST_MAC,
        }
    )
    st = _get(sb, "ingest", "stream", "adamw") or {}
    keeps = st.get("keeps_up_at_1_it_per_s")
    rows.append(
        {
            "goal": "100M-parameter AdamW stream at 1 it/s keeps up, DATA authenticated",
            "bench": "shadow_bench",
            "measured": None
            if keeps is None
            else f"{st.get('applied')} of {st.get('iterations')} applied, "
            f"receive {_f(_num(_get(st, 'median', 'receive_s')), 0, 1e3)} ms/it",
            "met": bool(keeps),
        }
    )
    return rows


def render_goals(g: Doc, speed_spread: float | None = None) -> list[str]:
    """The *Goals* section: each goal of issue 14 against its anchor, met or not, and why."""
    out = [
        "## Goals",
        "",
        "Derived from the benches' JSON below by fixed rules (`bench/harness.py` "
        "`analyze`, written to `bench/results/summary.json`); the planner figures use "
        "`shadowgrad.planner`, the model of `shadowgrad plan`, with seed 004's MTBF of "
        f"{MTBF_S / 3600:.2f} h over a {TOTAL_S / 3600:.0f} h run.",
        "",
    ]
    inb = g.get("inband") or {}

    def _sum(xs: Any) -> float | None:
        vals = [_num(v) for v in xs or []]
        return None if not vals or any(v is None for v in vals) else sum(v for v in vals if v)

    rows = []
    for x in inb.get("sizes") or []:
        rows.append(
            [
                str(x["size"]) + (" pinned" if x.get("pinned") else ""),
                _f(_sum(x.get("ring_bytes_per_rank_iter"))),
                _f(_sum(x.get("inband_bytes_per_rank_iter"))),
                _ratio4(x.get("bytes_ratio")),
                _f(_sum(x.get("ring_cpu_per_rank_iter_s")), 1, 1e3),
                _f(_sum(x.get("inband_cpu_per_rank_iter_s")), 1, 1e3),
                _ratio4(x.get("cpu_ratio")),
                _ratio(x.get("time_ratio")),
                "yes" if x.get("meets_goal") else "**no**",
            ]
        )
    out += [
        f"**In-band against the clean ring** (goal: trainer bytes per iteration at most "
        f"{_pct(GOAL_INBAND_BYTES)} more, trainer CPU per iteration at most "
        f"{_pct(GOAL_INBAND)} more): `inband` (the tap, COMMITs, FINAL retention, MACs) "
        "against `ring`, the same ring through the same P4 target without shadowgrad "
        "(inband_bench); all ranks' bytes (ring link, measured iterations) and CPU "
        "(getrusage) per iteration; `pinned`: the ranks on other CPUs than the switch and "
        "the shadows.",
        "",
    ]
    out += _table_or_not_measured(
        [
            "size",
            "ring B/iter",
            "in-band B/iter",
            f"bytes {TIMES}",
            "ring CPU ms/iter",
            "in-band CPU ms/iter",
            f"CPU {TIMES}",
            f"time {TIMES}",
            "meets goal",
        ],
        rows,
    )
    for x in inb.get("sizes") or []:
        if x.get("meets_goal"):
            continue
        extra = x.get("bytes_excess_breakdown") or {}
        where = f"{x['size']}{' pinned' if x.get('pinned') else ''}"
        if not x.get("bytes_met") and extra:
            out += [
                "",
                f"{where}, bytes: in-band sends {_f(extra.get('excess'))} B more per "
                f"iteration; {_f(extra.get('mac_bytes'))} B of them are the MAC trailers of "
                f"{_f(extra.get('datagrams'), 1)} datagrams ({extra.get('mac_size')} B "
                "each: the FINAL DATA the shadows verify, the ACKs and the COMMITs carry one, "
                f"the clean ring's none), the other {_f(extra.get('other'))} B the COMMIT "
                "records and what else the session sends.",
            ]
        if not x.get("cpu_met"):
            out += [
                "",
                f"{where}, CPU: the ranks use {_pct((x.get('cpu_ratio') or 1) - 1)} more CPU "
                f"per iteration than on the clean ring; the switch process used "
                f"{_f(x.get('switch_cores'), 2)} cores during the in-band iterations, on the "
                "same CPUs"
                + ("" if not x.get("pinned") else " (pinned: others)")
                + "."
                + _thread_excess_sentence(x)
                + (
                    ""
                    if speed_spread is None
                    else f" The CPU speed probe (above) saw the CPU time of one fixed piece "
                    f"of work move by {TIMES}{_f(speed_spread, 2)} on this machine: a "
                    f"{_pct(GOAL_INBAND)} difference is far inside what a run's mix of CPU "
                    "speeds moves."
                )
                + _tap_control_sentence(x),
            ]
    rows = [
        [
            str(x["size"]),
            _f(x.get("iteration_s"), 1, 1e3),
            _f(x.get("sink_median_s"), 1, 1e3),
            _ratio(x.get("sink_ratio")),
            _ratio(x.get("paired_ratio")),
            _ratio(x.get("mirror_ratio"))
            + ("" if x.get("mirror_shadows") in (None, "real") else f" ({x['mirror_shadows']})"),
            _ratio(x.get("dcp_ratio")),
            _f(x.get("none_cpu_per_iter_s"), 1, 1e3),
            _f(x.get("sink_cpu_per_iter_s"), 1, 1e3),
            _f(x.get("sender_cpu_per_iter_s"), 1, 1e3),
            _f(x.get("main_thread_growth_s"), 1, 1e3),
            _f(x.get("sink_receiver_cpu_per_iter_s"), 1, 1e3),
            "yes" if _mirror_met(x) else "**no**",
        ]
        for x in g.get("stall") or []
        if x.get("sink_ratio") is not None
    ]
    out += [
        "",
        f"**Mirror mode's cost to the trainer** (goal {1 + GOAL_MIRROR:.2f}{TIMES} `none` or "
        "less, against sinks: `mirror_sink`; trainer_bench, same run): median iteration, and "
        "where the CPU goes, per iteration, all ranks together: the ranks' CPU without and "
        "with mirror, of it the sender threads, the growth of the training threads' own CPU "
        "(`MainThread`, capture included), and the sinks' (UDP receivers in another "
        "process on the same cores, draining with `MSG_TRUNC`). *paired*: `mirror_sink` "
        "against `none` in the same processes, alternating blocks (trainer_paired); the goal "
        "is met where both ratios meet it.",
        "",
    ]
    out += _table_or_not_measured(
        [
            "size",
            "none ms/iter",
            "mirror_sink ms/iter",
            f"mirror_sink {TIMES}",
            f"paired {TIMES}",
            f"mirror (real shadows) {TIMES}",
            f"DCP async {TIMES}",
            "none CPU ms",
            "mirror_sink CPU ms",
            "sender threads ms",
            "training threads +ms",
            "sinks ms",
            "meets goal",
        ],
        rows,
    )
    for x in g.get("stall") or []:
        r, t, cpus = x.get("sink_ratio"), x.get("iteration_s"), x.get("cpus")
        a, b = x.get("none_cpu_per_iter_s"), x.get("sink_cpu_per_iter_s")
        rx = x.get("sink_receiver_cpu_per_iter_s") or 0.0
        if r is None or _mirror_met(x) or None in (t, cpus, a, b):
            continue
        busy = a / t
        idle = cpus - busy
        extra = b - a + rx
        room = (
            "no core is left idle to absorb it"
            if idle < 0.05
            else f"the {idle:.2f} idle cores would need {_f(extra / idle, 1, 1e3)} ms to absorb "
            f"it against a {_f(t, 1, 1e3)} ms iteration"
        )
        head = (
            f"{x['size']}: without checkpoints the ranks keep {busy:.2f} of this machine's "
            f"{cpus} cores busy; "
        )
        if extra > 0:
            body = (
                f"mirror adds {_f(extra, 1, 1e3)} ms of CPU per iteration "
                f"({_f(b - a, 1, 1e3)} ms in the ranks, {_f(rx, 1, 1e3)} ms in the sinks) and "
                f"{room}: on this machine the checkpoint's bytes cost CPU the trainers need, so "
                "wall time grows with it."
            )
        else:
            # the two variants' CPU differs by more than mirror's own cost in this run
            body = (
                f"in this run the ranks and sinks used {_f(-extra, 1, 1e3)} ms less CPU per "
                f"iteration with mirror than without ({_f(b - a, 1, 1e3)} ms in the ranks, "
                f"{_f(rx, 1, 1e3)} ms in the sinks): the variants' CPU moved by more than "
                "mirror's own cost (its sender threads' is in the table), so only the paired "
                "ratio below says what mirror costs."
            )
        out += ["", head + body + _faults_note(x) + _background_note(x)]
    if g.get("mirror_paired"):
        out += ["", _paired_sentence(g["mirror_paired"])]
    out += [
        "",
        f"**Per-iteration stall against DCP `async_save` every iteration** (goal "
        f"{GOAL_STALL:.0f}{TIMES} lower for the trainer with its shadows elsewhere; with real "
        "shadows co-located on the ranks' cores no more than DCP's): excess over `none` per "
        "iteration. *with sinks*: against UDP sinks, the trainer's own critical path without "
        "the shadows' CPU (trainer_bench `mirror_sink`); *paired*: trainer_paired's "
        "ratio (same processes, alternating blocks) times this `none`; *DCP / trainer* "
        "takes the larger of the two. *co-located*: `mirror` "
        "with its shadows (trainer_bench).",
        "",
    ]
    rows = [
        [
            str(x["size"]),
            _f(x.get("iteration_s"), 1, 1e3),
            _f(x.get("trainer_only_stall_s"), 1, 1e3),
            _f(x.get("paired_stall_s"), 1, 1e3),
            _f(x.get("dcp_every_iteration_stall_s"), 1, 1e3),
            _ratio(x.get("dcp_over_trainer")),
            _f(x.get("mirror_stall_s"), 1, 1e3)
            + (
                f" ({x['mirror_shadows']})" if x.get("mirror_shadows") not in (None, "real") else ""
            ),
            "-"
            if x.get("real_within_dcp") is None
            else ("yes" if x["real_within_dcp"] else "**no**"),
            _f(x.get("mirror_blocked_s"), 1, 1e3),
            _f(x.get("dcp_blocked_s"), 1, 1e3),
            _f(x.get("sender_cpu_per_iter_s"), 1, 1e3),
            "yes" if x.get("meets_goal") else "**no**",
        ]
        for x in g.get("stall") or []
    ]
    out += _table_or_not_measured(
        [
            "size",
            "none ms/iter",
            "with sinks ms",
            "paired ms",
            "DCP stall ms",
            f"DCP / trainer {TIMES}",
            "co-located ms",
            "co-located ≤ DCP",
            "mirror blocked ms",
            "DCP blocked ms",
            "sender CPU ms/iter",
            "meets goal",
        ],
        rows,
    )
    out += [
        "",
        "*blocked*: the checkpoint's own time on the training thread per checkpoint, timed "
        "in the rank (mirror: the capture into a staging slot; DCP: `get_state_dict`, waiting "
        "for the previous save, `async_save`'s staging). *sender CPU*: the CPU seconds per "
        "iteration of mirror's sender threads, all ranks together (with sinks): work off the "
        "critical path that competes with training only where no core is free — on this "
        "machine the ranks already fill every core, so the stall columns (wall-time excess) "
        "include it.",
    ]
    if any(not x.get("meets_goal") for x in g.get("stall") or []):
        out += [
            "",
            "Where the goal is missed: the stall columns are wall-time excess; the "
            "*blocked* column is all mirror mode puts on the training thread itself, the "
            "rest is the sender threads' and the receivers' CPU on cores the ranks already "
            "fill (see the cost table above); with `real` shadows their ingest and replay "
            "run on the same cores too.",
        ]
        for x in g.get("stall") or []:
            st, sd = x.get("trainer_stall_s"), x.get("dcp_every_iteration_stall_s")
            if x.get("meets_goal") or st is None or sd is None or st <= 0:
                continue
            bl = x.get("mirror_blocked_s")
            parts = [
                f"{x['size']}: the goal allows the trainer {_f(sd / GOAL_STALL, 1, 1e3)} ms "
                f"per iteration and it stalled {_f(st, 1, 1e3)} ms"
            ]
            if bl is not None:
                rest = st - bl
                parts.append(
                    f"the capture on the training thread (*blocked*) took {_f(bl, 1, 1e3)} ms "
                    + (
                        "of it, the rest, "
                        f"{_f(rest, 1, 1e3)} ms, is wall time lost on the cores the ranks "
                        "fill: all ranks' sender threads used "
                        f"{_f(x.get('sender_cpu_per_iter_s'), 1, 1e3)} ms of CPU per "
                        "iteration, the sinks "
                        f"{_f(x.get('sink_receiver_cpu_per_iter_s'), 1, 1e3)} ms, and the "
                        "training threads' own CPU changed by "
                        f"{_f(x.get('main_thread_growth_s'), 1, 1e3)} ms (the captures "
                        "included; trainer_bench `mirror_sink` against `none`)"
                        if rest > 0
                        else "(more than the whole stall: the rest is within the run's noise)"
                    )
                )
            if x.get("real_within_dcp") is False:
                parts.append(
                    f"with co-located shadows the stall, {_f(x.get('mirror_stall_s'), 1, 1e3)}"
                    f" ms, exceeds DCP's {_f(sd, 1, 1e3)} ms"
                )
            out += ["", "; ".join(parts) + "."]
    out += [
        "",
        "**Checkpoint frequency achievable at 1 % trainer overhead, work lost per "
        "failure, effective training time.** DCP `async_save` and `torch.save`: cost per "
        "checkpoint measured at every 5th iteration; shortest interval within the 1 % "
        "budget = cost / (1 % of an iteration); Young-Daly interval sqrt(2 cost MTBF); "
        "lost per failure = half the interval + the time until the save is durable. "
        "shadowgrad: every iteration (the shadows need every gradient), at its measured "
        "stall; lost per failure = the lost iterations the demo measured (kill_trainer, "
        "lostwork_bench) + half the interrupted iteration. *useful*: the ledger's useful "
        "fraction of the run with the demo's measured recovery time per failure for every "
        "method (the restore's own difference is in the recovery table below).",
        "",
    ]
    rows = []
    for p in g.get("policies") or []:
        for m in p.get("methods") or []:
            k = m.get("min_interval_iterations")
            rows.append(
                [
                    str(p.get("size")),
                    m["method"]
                    + (
                        " (cost: stall only, excess below noise)"
                        if str(m.get("cost_basis", "")).startswith("stall")
                        else ""
                    ),
                    _f(m.get("cost_per_checkpoint_s"), 1, 1e3),
                    _pct(m.get("overhead_every_iteration")),
                    "cost below this run's noise"
                    if m.get("cost_basis") == "below noise"
                    else ("every iteration" if k == 1 else f"every {_f(k)} it.")
                    if k
                    else "**not within 1 %**",
                    _secs(m.get("interval_s"), 1),
                    _secs(m.get("lost_per_failure_s"), 2),
                    _pct(m.get("useful")),
                ]
            )
    out += _table_or_not_measured(
        [
            "size",
            "method",
            "cost ms",
            "overhead if every it.",
            "1 % budget allows",
            "interval used",
            "lost / failure",
            "useful",
        ],
        rows,
    )
    plans = [
        m["plan"] for p in g.get("policies") or [] for m in p.get("methods") or [] if m.get("plan")
    ]
    if plans:
        out += [
            "",
            "The same ledger from the command line (each prints the periodic policy at "
            "Young's and Daly's interval and the shadowgrad row):",
            "",
            "```",
            *plans,
            "```",
        ]
    out += [
        "",
        "**Recovery time against DCP load** of the same state (recovery_bench; "
        "detection and restart are the same for every method, see lostwork_bench). "
        "*DCP load ms*: the median of the DCP loads timed in the same block of rounds as the "
        "row's restores, the baseline of its ratios (recovery_bench measures the baselines "
        "next to each cluster; the median over all blocks is in the recovery_bench section):",
        "",
    ]
    rows = [
        [
            str(x.get("size")),
            str(x.get("shadows")),
            _f(x.get("restore_ms")),
            _f(x.get("dcp_load_ms")),
            _ratio(x.get("ratio")),
            _ratio(x.get("ratio_plus_first")),
            "yes" if (_num(x.get("ratio")) or 9) <= 1 else "**no**",
            _ratio(x.get("ratio_to_one_shadow")),
            "-" if _num(x.get("fetch_cores")) is None else f"{x['fetch_cores']:.2f}",
        ]
        for x in g.get("recovery") or []
    ]
    out += _table_or_not_measured(
        [
            "size",
            "shadows",
            "restore ms",
            "DCP load ms",
            f"{TIMES} DCP load",
            f"+ 1st it. {TIMES}",
            "as fast",
            f"{TIMES} 1 shadow",
            "cores busy in fetch",
        ],
        rows,
    )
    if any((_num(x.get("ratio")) or 9) > 1 for x in g.get("recovery") or []):
        out += [
            "",
            "Where it is slower: a restore surveys the shadows, holds I\\*, fetches every "
            "shard over loopback TCP (the bulk channel: received by the kernel straight into "
            "the parameters and new optimizer-state tensors, each 1 MiB chunk CRC-checked as "
            "it lands) and starts the sender; DCP reads files in "
            "the page cache. The phases under recovery_bench say which part took the time.",
        ]
    slow4 = [
        x
        for x in g.get("recovery") or []
        if x.get("shadows") == 4 and (_num(x.get("ratio_to_one_shadow")) or 9) > 0.5
    ]
    ones = {x.get("size"): x for x in g.get("recovery") or [] if x.get("shadows") == 1}
    if slow4:
        cores = g.get("cores")

        def _why(x: Doc) -> str:
            busy = _num(_get(ones, x.get("size"), "fetch_cores"))
            if busy is None:
                return "the fetch's CPU use not measured"
            return (
                f"the fetch from 1 shadow already keeps {busy:.2f} of this machine's "
                f"{cores if cores is not None else '?'} cores busy"
            )

        out += [
            "",
            f"Restore from 4 shadows against 1 (goal {TIMES} 0.5): "
            + "; ".join(
                f"{x.get('size')} {_ratio(x.get('ratio_to_one_shadow'))}, {_why(x)}" for x in slow4
            )
            + " (*cores busy in fetch*: the restoring process and the shadows, CPU seconds "
            "over wall time). Where that is near the cores there are, the copies and "
            "checksums of the state take the CPU time they take, and more shadows only "
            "spread them over cores this machine does not have.",
        ]
    thr = g.get("throughput") or []
    if thr:
        out += [
            "",
            "**Throughput** (issue 22: the data-path authenticator, shadow ingest against a bare "
            "`recv_into` loop in the same run, a 100M-parameter AdamW stream at one iteration "
            "per second; auth_bench and shadow_bench):",
            "",
        ]
        out += _table(
            ["goal", "bench", "measured", "meets goal"],
            [
                [
                    str(x["goal"]),
                    str(x["bench"]),
                    "not measured" if x.get("measured") is None else str(x["measured"]),
                    "yes" if x.get("met") else "**no**",
                ]
                for x in thr
            ],
        )
        for x in thr:
            if x.get("limit"):
                out += ["", f"Where {x['goal'].split(' ≥')[0]} is short: {x['limit']}."]
    out += ["", "![lost work and recovery](img/bench_goals.png)"]
    return out


README_BEGIN = "<!-- bench-summary:begin (generated by bench/harness.py; do not edit) -->"
README_END = "<!-- bench-summary:end -->"


def render_readme(g: Doc, mode: str | None) -> list[str]:
    """README's benchmark lines: the goals in one line each, from the same summary."""
    out = [README_BEGIN, ""]
    where = (
        "a quick run (`make bench-quick`: small models, busy machine)"
        if mode == "quick"
        else "a full run (`make bench`)"
        if mode == "full"
        else "the committed JSON"
    )
    out.append(f"From {where}; details and spread in docs/benchmarks.md:")
    out.append("")
    for x in (g.get("inband") or {}).get("sizes") or []:
        out.append(
            f"- in-band against the clean ring, {x['size']} parameters"
            + (" (pinned)" if x.get("pinned") else "")
            + f": trainer bytes/iteration {_ratio4(x.get('bytes_ratio'))}{TIMES} (goal "
            f"{1 + GOAL_INBAND_BYTES:.3f}), CPU/iteration {_ratio4(x.get('cpu_ratio'))}{TIMES} "
            f"(goal {1 + GOAL_INBAND:.2f}); {x.get('verdict')}"
        )
    for x in g.get("stall") or []:
        out.append(
            f"- mirror-mode stall per iteration, {x['size']} parameters: the trainer "
            f"{_f(x.get('trainer_stall_s'), 1, 1e3)} ms vs DCP `async_save` every "
            f"iteration {_f(x.get('dcp_every_iteration_stall_s'), 1, 1e3)} ms "
            f"({_ratio(x.get('dcp_over_trainer'))}{TIMES}; goal {GOAL_STALL:.0f}{TIMES}), "
            f"with co-located shadows {_f(x.get('mirror_stall_s'), 1, 1e3)} ms (goal: no "
            f"more than DCP's); {'met' if x.get('meets_goal') else 'missed'}"
        )
    for p in g.get("policies") or []:
        parts = [
            f"{m['method']} {_f(m.get('lost_per_failure_s'), 2)} s"
            if m.get("lost_per_failure_s") is not None
            else f"{m['method']} - (its cost was below this run's noise)"
            for m in p.get("methods") or []
        ]
        if parts:
            out.append(
                f"- work lost per failure, {p['size']} parameters (DCP and torch.save at "
                "their Young-Daly interval for a 3.09 h MTBF): " + ", ".join(parts)
            )
    for x in g.get("recovery") or []:
        out.append(
            f"- restore from {x.get('shadows')} shadow(s), {x.get('size')}: "
            f"{_f(x.get('restore_ms'))} ms vs DCP load {_f(x.get('dcp_load_ms'))} ms "
            f"in the same block of rounds ({_ratio(x.get('ratio'))}{TIMES})"
        )
    if g.get("replay_of_bandwidth") is not None:
        line = f"- optimizer replay: {_pct(g['replay_of_bandwidth'])} of the memory-bandwidth bound"
        if g["replay_of_bandwidth"] > 1:
            # the bound is the best streaming kernel of the same run: above it, those kernels
            # ran slower than AdamW itself (other load), and only the same-run ratio to torch's
            # fused AdamW says how the replay does
            line += " (above it: other load slowed the bound's kernels in that run)"
        if g.get("replay_vs_fused") is not None:
            line += f", {_ratio(g['replay_vs_fused'])}{TIMES} torch's fused AdamW"
        out.append(line)
    if g.get("switch_ratio_range"):
        lo, hi = g["switch_ratio_range"]
        out.append(
            f"- P4 software target: {_ratio(lo)} {DASH} {_ratio(hi)}{TIMES} the packet "
            "rate of a bare AF_PACKET forward loop"
        )
    out += ["", README_END]
    return out


# ---------------------------------------------------------------------------------------------
# the bench table
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bench:
    name: str  #: also the JSON's file name: <name>.json
    title: str
    quick: tuple[str, ...]  #: arguments of a --quick run (besides --out)
    full: tuple[str, ...] = ()  #: arguments of a --full run (the script's defaults)
    timeout_quick_s: float = 300.0
    timeout_full_s: float = 1800.0
    needs_root: bool = False
    render: Renderer = field(default=render_wire, compare=False)
    script_name: str = ""  #: the script, when it is not ``<name>.py``

    @property
    def script(self) -> str:
        return f"bench/{self.script_name or self.name}.py"


_TRAINER_VARIANTS = "none,mirror,mirror_sink,dcp_async,torch_save,dcp_async:5,torch_save:5"


def _trainer_args(
    sizes: str, iters: int, warmup: int, rounds: int, variants: str, **extra: str
) -> tuple[str, ...]:
    """Arguments of a trainer_bench run: its sizes, iterations, warm-up, rounds and variants,
    then ``extra`` (``shadow_counts="1,2"`` -> ``--shadow-counts 1,2``), in that order."""
    flags = {
        "sizes": sizes,
        "iters": iters,
        "warmup": warmup,
        "rounds": rounds,
        "variants": variants,
        **extra,
    }
    return tuple(a for k, v in flags.items() for a in (f"--{k.replace('_', '-')}", str(v)))


BENCHES: tuple[Bench, ...] = (
    Bench(
        "wire_bench", "Wire codec vs memcpy", ("--quick",), render=render_wire, timeout_quick_s=120
    ),
    Bench(
        "shadow_bench",
        "Shadow: optimizer apply vs memory bandwidth, ingest vs bare UDP",
        ("--quick",),
        render=render_shadow,
    ),
    Bench(
        "auth_bench",
        "Authentication: shadow ingest bare / CRC / CRC+MAC, record costs",
        ("--params", "5e6", "--iterations", "2", "--rounds", "3"),
        render=render_auth,
    ),
    Bench(
        "trainer_bench",
        "Trainer: mirror mode vs no checkpoint, DCP async_save and "
        "torch.save every iteration and every 5th",
        _trainer_args("1M", 5, 1, 2, _TRAINER_VARIANTS),
        _trainer_args("10M,100M", 10, 2, 5, _TRAINER_VARIANTS),
        render=render_trainer,
        timeout_quick_s=400,
        timeout_full_s=3600,
    ),
    Bench(
        "trainer_scaling",
        "Scaling: mirror mode with 2 and 4 trainers, 1, 2 and 4 shadows",
        _trainer_args("1M", 5, 1, 1, "none,mirror", worlds="2,4", shadow_counts="1,2,4"),
        _trainer_args("10M", 10, 2, 5, "none,mirror", worlds="2,4", shadow_counts="1,2,4"),
        render=render_scaling,
        timeout_quick_s=400,
        timeout_full_s=3600,
        script_name="trainer_bench",
    ),
    Bench(
        "trainer_paired",
        "Trainer: mirror mode vs no checkpoint in the same processes, alternating blocks",
        # --iters is not used by this variant (--pairs and --block are)
        _trainer_args("1M", 5, 1, 1, "paired", pairs="4", block="3"),
        _trainer_args("10M,100M", 10, 2, 1, "paired", pairs="10", block="4"),
        render=render_paired,
        timeout_quick_s=400,
        timeout_full_s=1800,
        script_name="trainer_bench",
    ),
    Bench(
        "inband_bench",
        "In-band through the P4 target vs the clean ring and plain DDP",
        ("--sizes", "100K", "--iters", "10", "--warmup", "2", "--rounds", "1"),
        (
            "--rounds",
            "3",
            "--pin",
            "both",
            "--variants",
            "ddp,ring,ring_mac,mirror,inband_notap,inband",
        ),
        render=render_inband,
        timeout_quick_s=400,
        timeout_full_s=3600,
    ),
    Bench(
        "reseed_bench",
        "Self-healing pause: staging copy of one shard vs memcpy",
        ("--sizes", "1M,10M", "--repeat", "3", "--load-models", "transformer,1M"),
        render=render_reseed,
    ),
    Bench(
        "recovery_bench",
        "Recovery: restore from 1, 2, 4 shadows vs DCP load and torch.load",
        ("--quick",),
        # shadows as processes, as a deployment runs them (and what a 100M restore needs)
        ("--sizes", "1M,10M,100M", "--shadow-procs"),
        render=render_recovery,
        timeout_quick_s=240,
        timeout_full_s=3600,
    ),
    Bench(
        "lostwork_bench",
        "Work lost per failure, detection and recovery: the emulated demo",
        ("--runs", "1"),
        render=render_lostwork,
        timeout_quick_s=600,
        timeout_full_s=2400,
    ),
    Bench(
        "switch_bench",
        "P4 software target vs a bare AF_PACKET loop",
        ("--rounds", "1", "--frames-small", "5000", "--frames-large", "1000"),
        needs_root=True,
        render=render_switch,
    ),
)

NOT_MEASURED = (
    "**In-band at 100M parameters**: the in-band bench runs at 100K and 1M parameters here "
    "(the ring through a Python switch on 2 cores is too slow for 100M); the trainer and "
    "recovery benches run at 100M.",
    "**In-band overhead with real shadows on their own machines**: on 2 cores every component "
    "shares the CPUs; the page shows that interference instead of a per-component number.",
)


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def _git() -> dict[str, Any]:
    def out(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    status = out("status", "--porcelain", "--untracked-files=no")
    return {"commit": out("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "memory_GiB": _memory_gib(),
        "python": platform.python_version(),
        "torch": _common.version("torch"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "nice": os.nice(0),
    }


def _group_members(pgid: int) -> list[int]:
    """Processes still in process group ``pgid`` (from /proc; empty where it is unavailable)."""
    members = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(entry.path, "stat").read_text()
                # fields after "(comm)": state ppid pgrp ...
                if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                    members.append(int(entry.name))
    return members


def _kill_group(proc: subprocess.Popen[str]) -> int:
    """End the bench's process group (its own session, so only what the bench started): SIGTERM,
    then SIGKILL what is left after a grace period. Returns how many processes were signalled
    (0 when the bench and everything it started had already exited)."""
    signalled = 0
    for sig in (signal.SIGTERM, signal.SIGKILL):
        members = _group_members(proc.pid)
        if proc.poll() is not None and not members:
            break
        signalled = max(signalled, len(members))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline:
            proc.poll()
            if proc.returncode is not None and not _group_members(proc.pid):
                return signalled
            time.sleep(0.1)
    return signalled


def run_bench(b: Bench, mode: str, out_dir: Path) -> dict[str, Any]:
    """Run one bench as a subprocess; returns its harness.json entry."""
    final = out_dir / f"{b.name}.json"
    entry: dict[str, Any] = {"name": b.name, "script": b.script, "json": _rel(final)}
    if b.needs_root and os.geteuid() != 0:
        entry.update(status="skipped", reason="skipped: needs root", rc=None, wall_s=0.0, args=[])
        print(f"== {b.name}: skipped (needs root)", flush=True)
        return entry
    args = list(b.quick if mode == "quick" else b.full)
    timeout = b.timeout_quick_s if mode == "quick" else b.timeout_full_s
    partial = out_dir / f"{b.name}.partial.json"
    partial.unlink(missing_ok=True)
    cmd = [sys.executable, b.script, *args, "--out", _rel(partial)]
    entry["args"] = args
    entry["timeout_s"] = timeout
    print(
        f"== {b.name}: {shlex.join(['python', b.script, *args])} (timeout {timeout:.0f} s)",
        flush=True,
    )
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            tail.append(line)
            print(f"   [{b.name}] {line}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        rc: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        rc = proc.returncode
    except BaseException:  # Ctrl-C: take the bench's whole group down with us
        _kill_group(proc)
        raise
    wall = time.monotonic() - t0
    leftovers = _kill_group(proc)  # what the bench started and left running
    reader.join(timeout=5)
    doc = None
    if rc == 0 and partial.exists():
        with contextlib.suppress(ValueError, OSError):
            doc = json.loads(partial.read_text(encoding="utf-8"))
    if doc is not None:
        partial.replace(final)
        status, reason = "ok", None
    else:
        partial.unlink(missing_ok=True)
        status = "timeout" if timed_out else "failed"
        reason = (
            f"timed out after {timeout:.0f} s"
            if timed_out
            else f"exit status {rc}"
            if rc != 0
            else "exit 0 but no valid JSON written"
        )
    entry.update(
        status=status,
        reason=reason,
        rc=rc,
        wall_s=round(wall, 1),
        leftover_processes_killed=leftovers,
        output_tail=list(tail) if status != "ok" else list(tail)[-5:],
    )
    print(
        f"== {b.name}: {status}{'' if reason is None else ' (' + reason + ')'} in {wall:.1f} s",
        flush=True,
    )
    return entry


def merge_rerun(old: Doc | None, new: Doc) -> Doc:
    """harness.json after a partial rerun: ``old`` (the recorded run, or None) with the benches
    of ``new`` (the rerun's own record: only the benches it ran) in place of theirs. ``old``'s
    command, start, wall time, machine and commit stay; the rerun is appended to ``reruns``
    and its entries say which rerun they come from (a rerun none of whose entries is left, all
    run again since, is dropped). With no ``old``, ``new`` is the record."""
    if old is None:
        return new
    if old.get("mode") != new.get("mode"):
        raise ValueError(
            f"harness.json records a {old.get('mode')} run; a {new.get('mode')} "
            "rerun would mix the two on one page"
        )
    reruns = [r for r in old.get("reruns") or [] if isinstance(r, dict)]
    number = len(reruns) + 1
    reruns.append(
        {k: new.get(k) for k in ("command", "started", "wall_s", "machine", "git")}
        | {"benches": [str(e.get("name")) for e in new.get("benches") or []]}
    )
    entries = {str(e.get("name")): e for e in old.get("benches") or [] if isinstance(e, dict)}
    for e in new.get("benches") or []:
        entries[str(e.get("name"))] = {**e, "rerun": number}
    live = sorted({int(e["rerun"]) for e in entries.values() if e.get("rerun")})
    renumber = {was: now for now, was in enumerate(live, 1)}
    for n, e in entries.items():
        if e.get("rerun"):
            entries[n] = {**e, "rerun": renumber[int(e["rerun"])]}
    order = [b.name for b in BENCHES if b.name in entries]
    order += [n for n in entries if n not in order]
    return {**old, "benches": [entries[n] for n in order], "reruns": [reruns[i - 1] for i in live]}


def run_all(mode: str, command: str, only: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every bench (or those named in ``only``, merged into the recorded harness.json)."""
    out_dir = QUICK_RESULTS if mode == "quick" else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    old = _load(HARNESS_JSON) if only is not None else None
    if old is not None and old.get("mode") != mode:  # refuse before running anything
        raise SystemExit(
            f"{_rel(HARNESS_JSON)} records a {old.get('mode')} run: rerun its "
            f"benches with --{old.get('mode')}, or run them all with --{mode}"
        )
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    doc: dict[str, Any] = {
        "harness": 1,
        "mode": mode,
        "command": command,
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "results_dir": _rel(out_dir),
        "machine": machine(),
        "git": _git(),
        "benches": [],
    }
    # before any bench: how steady a CPU second is on this machine right now
    print("cpu speed probe ...", flush=True)
    doc["machine"]["cpu_speed"] = _common.cpu_speed(max(1.0, 10.0 / len(os.sched_getaffinity(0))))
    for b in BENCHES:
        if only is None or b.name in only:
            doc["benches"].append(run_bench(b, mode, out_dir))
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    doc["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if only is not None:
        doc = merge_rerun(old, doc)
    _common.atomic_write(HARNESS_JSON, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {_rel(HARNESS_JSON)}; the benches took {time.monotonic() - t0:.1f} s", flush=True)
    return doc


# ---------------------------------------------------------------------------------------------
# the page
# ---------------------------------------------------------------------------------------------


def _load(path: Path) -> Doc | None:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _when(d: Doc | None) -> str | None:
    """The run date a bench's JSON states about itself, if any."""
    for key in ("time", "started"):
        v = _get(d, key)
        if isinstance(v, str):
            return v
    return None


def _bench_json(b: Bench, harness: Doc | None, entry: Doc | None) -> tuple[Path, Doc | None]:
    """The bench's JSON path and content for the page: the file the harness run wrote when it
    ran it successfully; with no harness.json at all, ``bench/results/<bench>.json``."""
    if harness is None:
        path = RESULTS / f"{b.name}.json"
        return path, _load(path)
    if entry is None:
        return RESULTS / f"{b.name}.json", None
    path = ROOT / str(entry.get("json"))
    return path, _load(path) if entry.get("status") == "ok" else None


def _anchor(name: str) -> str:
    return "#" + name.lower()


def _entries(harness: Doc | None) -> dict[str, Doc]:
    return {
        str(e.get("name")): e for e in (harness or {}).get("benches") or [] if isinstance(e, dict)
    }


def _found(harness: Doc | None) -> dict[str, tuple[Path, Doc | None]]:
    entries = _entries(harness)
    return {b.name: _bench_json(b, harness, entries.get(b.name)) for b in BENCHES}


def cpu_speed_of(harness: Doc | None) -> tuple[Doc, str] | None:
    """The newest CPU speed probe in ``harness`` (``machine.cpu_speed`` of the latest rerun
    that has one, else of the run) and where it comes from; None when no record has one."""
    if harness is None:
        return None
    reruns = [r for r in harness.get("reruns") or [] if isinstance(r, dict)]
    for i in range(len(reruns), 0, -1):
        got = _get(reruns[i - 1], "machine", "cpu_speed")
        if isinstance(got, dict) and got.get("cpus"):
            return got, f"rerun {i}"
    got = _get(harness, "machine", "cpu_speed")
    return (got, "the run") if isinstance(got, dict) and got.get("cpus") else None


def cpu_speed_spread(probe: Doc) -> float | None:
    """The slowest sample of a :func:`_common.cpu_speed` probe over its fastest, any CPU: how
    far the CPU time of one fixed piece of work moved on this machine."""
    cpus = (probe.get("cpus") or {}).values()
    lo = [v for v in (_num(c.get("min_ms")) for c in cpus) if v]
    hi = [v for v in (_num(c.get("max_ms")) for c in cpus) if v]
    return max(hi) / min(lo) if lo and hi else None


def speed_sentence(probe: Doc, where: str) -> str:
    """The page's account of the CPU speed probe (:func:`_common.cpu_speed`)."""
    parts = []
    for cpu, c in sorted((probe.get("cpus") or {}).items(), key=lambda kv: int(kv[0])):
        parts.append(
            f"CPU {cpu} {_f(c.get('min_ms'), 1)}{DASH}{_f(c.get('max_ms'), 1)} ms (median "
            f"{_f(c.get('median_ms'), 1)}; {_pct(c.get('slow_fraction') or 0)} of its samples "
            f"at {probe.get('slow_at')}{TIMES} the fastest of any CPU or slower, "
            f"{c.get('changes')} changes between the two)"
        )
    spread = cpu_speed_spread(probe)
    return (
        f"CPU speed (`_common.cpu_speed` at the start of {where}: a fixed Python loop of "
        f"{_f(probe.get('loop_iterations'))} iterations timed again and again for "
        f"{_f(probe.get('seconds_per_cpu'), 0)} s on each CPU, nothing else of the harness "
        "running): " + "; ".join(parts) + ". The same work's CPU time moved by up to "
        f"{TIMES}{_f(spread, 2)} from one sample to another, and each CPU changes speed on "
        "its own: a CPU-time or wall-time ratio between two runs is only as good as the "
        "mix of speeds each run happened to get."
    )


def render_page(harness: Doc | None) -> str:
    """The page, from ``harness`` (harness.json) and the bench JSON it points at; when there is
    no harness.json, from each bench's file under bench/results/ as found. Nothing but the JSON
    goes into it (no clock, no absolute paths), so the same JSON gives the same page."""
    entries = _entries(harness)
    found = _found(harness)
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by bench/harness.py from the JSON in bench/results/; do not edit. -->",
        "",
    ]
    bw = _get(found["shadow_bench"][1], "apply", "bandwidth", "bound_GBps")
    if harness is None:
        lines += [
            "Generated by `python bench/harness.py --page-only`; no harness run is "
            "recorded (`bench/results/harness.json` is missing), so each section shows "
            "the bench's own JSON under `bench/results/` where there is one.",
            "",
        ]
        if bw is not None:
            lines += [f"Memory bandwidth (shadow_bench): {_f(bw, 1)} GB/s.", ""]
    else:
        m = harness.get("machine") or {}
        git = harness.get("git") or {}
        commit = git.get("commit")
        at = (
            f"; commit `{commit[:12]}`{' with local changes' if git.get('dirty') else ''}"
            if isinstance(commit, str)
            else ""
        )
        lines += [
            f"Generated by `{harness.get('command')}` from the run that started "
            f"{harness.get('started')} and took {_f(harness.get('wall_s'), 0)} s in all "
            f"({harness.get('mode')} mode; JSON in `{harness.get('results_dir')}/` and "
            f"`bench/results/harness.json`{at}). `python bench/harness.py --page-only` "
            "regenerates this page from that JSON alone.",
            "",
        ]
        reruns = [r for r in harness.get("reruns") or [] if isinstance(r, dict)]
        if reruns:
            lines += [
                "Benches rerun since and merged into that record (their sections show "
                "the rerun's figures):",
                "",
            ]
            for i, r in enumerate(reruns, 1):
                rm, rg = r.get("machine") or {}, r.get("git") or {}
                rc = rg.get("commit")
                rat = (
                    f", commit `{rc[:12]}`{' with local changes' if rg.get('dirty') else ''}"
                    if isinstance(rc, str)
                    else ""
                )
                lines.append(
                    f"{i}. `{r.get('command')}`, started {r.get('started')}, "
                    f"{_f(r.get('wall_s'), 0)} s{rat}; load average "
                    f"{rm.get('loadavg_at_start')} at the start, "
                    f"{rm.get('loadavg_at_end')} at the end, nice {rm.get('nice')}: "
                    + ", ".join(map(str, r.get("benches") or []))
                    + "."
                )
            lines.append("")
        if harness.get("mode") == "quick":
            lines += [
                "Quick mode: every bench ran with short settings (small models, few "
                "rounds) on a possibly busy machine; the figures show the shape, a full "
                "run (`make bench`) gives the numbers to quote.",
                "",
            ]
        bw_text = (
            f"{_f(bw, 1)} GB/s (best streaming kernel of shadow_bench, same run)"
            if bw is not None
            else "not measured in this run"
        )
        lines += [
            f"Machine: {m.get('cores')} cores, {_f(m.get('memory_GiB'), 1)} GiB memory, "
            f"memory bandwidth {bw_text}, Python {m.get('python')}, torch "
            f"{m.get('torch')}, {m.get('platform')}; load average "
            f"{m.get('loadavg_at_start')} at the start, {m.get('loadavg_at_end')} at the "
            f"end; the benches ran at nice {m.get('nice')}.",
            "",
        ]
        speed = cpu_speed_of(harness)
        if speed is not None:
            lines += [speed_sentence(*speed), ""]
    lines += [
        "Every ratio is against a baseline measured in the same run of the same bench; "
        "timings are reported, never asserted.",
        "",
    ]

    rows = []
    for b in BENCHES:
        e = entries.get(b.name)
        path, doc = found[b.name]
        link = f"[{b.name}]({_anchor(b.name)})"
        if harness is None:
            rows.append(
                [
                    link,
                    "not run by the harness" if doc else "not run",
                    "-",
                    f"`{_rel(path)}`" if doc else "-",
                ]
            )
        elif e is None:
            rows.append([link, "not run", "-", "-"])
        elif e.get("status") == "skipped":
            rows.append([link, str(e.get("reason")), "-", "-"])
        elif e.get("status") != "ok":
            rows.append(
                [link, f"{e.get('status')} ({e.get('reason')})", _f(e.get("wall_s"), 1), "-"]
            )
        else:
            ok = f"ok (rerun {e['rerun']})" if e.get("rerun") else "ok"
            rows.append([link, ok, _f(e.get("wall_s"), 1), f"`{e.get('json')}`"])
    lines += [*_table(["bench", "status", "wall s", "JSON"], rows), ""]
    speed = cpu_speed_of(harness)
    spread = cpu_speed_spread(speed[0]) if speed is not None else None
    lines += [*render_goals(analyze(found), spread), ""]

    for b in BENCHES:
        e = entries.get(b.name)
        path, doc = found[b.name]
        lines += [f"## {b.name}", "", f"{b.title} (`{b.script}`).", ""]
        if harness is not None and e is not None and e.get("status") != "ok":
            lines += [f"**{e.get('status')}**: {e.get('reason')}."]
            tail = e.get("output_tail") or []
            if tail and e.get("status") != "skipped":
                lines += ["", "Last lines of its output:", "", "```", *map(str, tail), "```"]
            canonical = RESULTS / f"{b.name}.json"
            if canonical.exists() and canonical.resolve() != path.resolve():
                when = _when(_load(canonical))
                lines += [
                    "",
                    f"An earlier result is in `{_rel(canonical)}`"
                    + (f" (run {when})" if when else "")
                    + "; not shown here.",
                ]
            lines.append("")
            continue
        if doc is None:
            lines += [
                "Not run."
                if not path.exists() or e is None
                else f"`{_rel(path)}` is missing or not valid JSON.",
                "",
            ]
            continue
        meta = []
        if e is not None:
            meta.append(
                f"Command `{shlex.join(['python', b.script, *(e.get('args') or [])])}`"
                f" ({_f(e.get('wall_s'), 1)} s)"
            )
        when = _when(doc)
        if when:
            meta.append(f"run {when}" if meta else f"Run {when}")
        if meta:
            lines += ["; ".join(meta) + ".", ""]
        try:
            lines += b.render(doc)
        except (TypeError, KeyError, AttributeError, ValueError) as exc:
            lines += [f"(this JSON does not have the expected shape: {type(exc).__name__})"]
        lines.append("")

    lines += [
        "## Not measured yet",
        "",
        "Issue 14 asks for these; this harness does not produce them (yet):",
        "",
    ]
    lines += [f"- {x}" for x in NOT_MEASURED]
    return "\n".join(lines).rstrip() + "\n"


SUMMARY_JSON = RESULTS / "summary.json"
README = ROOT / "README.md"
IMG = ROOT / "docs" / "img"


DEMO_BEGIN = (
    "<!-- demo-sample:begin (generated by bench/harness.py from lostwork_bench's JSON; "
    "do not edit) -->"
)
DEMO_END = "<!-- demo-sample:end -->"


def readme_block(harness: Doc | None) -> str:
    """README's generated benchmark lines (between :data:`README_BEGIN` and :data:`README_END`)."""
    return "\n".join(render_readme(analyze(_found(harness)), (harness or {}).get("mode")))


def demo_block(harness: Doc | None) -> str:
    """README's sample demo output: the summary `shadowgrad demo` printed for lostwork_bench's
    first run (rendered again from the summary it kept, by the demo's own renderer)."""
    lw = _found(harness).get("lostwork_bench", (Path(), None))[1]
    sample = _get(lw, "scenarios", 0, "sample_summary")
    lines = [DEMO_BEGIN, ""]
    if isinstance(sample, dict):
        from shadowgrad.bmv2_testbed.report import render_summary

        lines += [
            f"(the first run of lostwork_bench, started {_get(lw, 'started')}; its JSON is in "
            "bench/results/)",
            "",
            "```",
            *render_summary(sample).splitlines(),
            "```",
        ]
    else:
        lines += ["(no demo run in the benchmark JSON yet: `make bench` records one)"]
    return "\n".join([*lines, "", DEMO_END])


def update_readme(text: str, block: str, begin: str = README_BEGIN, end: str = README_END) -> str:
    """``text`` with its block between the markers ``begin`` and ``end`` replaced by ``block``."""
    a, b = text.find(begin), text.find(end)
    if a < 0 or b < a:
        raise ValueError(f"README.md has no {begin!r} ... {end!r} block")
    return text[:a] + block + text[b + len(end) :]


def _atomic_write(path: Path, text: str) -> None:
    _common.atomic_write(path, text)
    print(f"wrote {_rel(path)}", flush=True)


def write_plots(found: dict[str, tuple[Path, Doc | None]], g: Doc, out: Path) -> list[Path]:
    """The page's PNG plots (matplotlib, Agg, no timestamps in the files). Returns what it
    wrote; nothing when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots", flush=True)
        return []
    out.mkdir(parents=True, exist_ok=True)
    meta = {"Software": None}
    written = []
    tb = found.get("trainer_bench", (Path(), None))[1]
    rows = _trainer_rows(tb)
    sizes = list(dict.fromkeys(k[0] for k in rows))
    if sizes:
        fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 3.6), squeeze=False)
        for ax, size in zip(axes[0], sizes, strict=True):
            cells = [(v, r) for (sz, v), r in rows.items() if sz == size]
            med = [r.get("median_s", 0) * 1e3 for _, r in cells]
            rm = [r.get("round_medians_s") or [r.get("median_s", 0)] for _, r in cells]
            lo = [m - min(x) * 1e3 for m, x in zip(med, rm, strict=True)]
            hi = [max(x) * 1e3 - m for m, x in zip(med, rm, strict=True)]
            ax.bar(range(len(cells)), med, yerr=[lo, hi], capsize=3, color="tab:blue")
            ax.set_xticks(range(len(cells)), [v for v, _ in cells], rotation=30, ha="right")
            ax.set_ylabel("ms / iteration (rank 0)")
            ax.set_title(f"{size} parameters")
        fig.tight_layout()
        written.append(out / "bench_trainer.png")
        fig.savefig(written[-1], metadata=meta)
        plt.close(fig)
    sc = found.get("trainer_scaling", (Path(), None))[1]
    if sc and sc.get("results"):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for world in sc.get("worlds") or []:
            pts = sorted(
                (r.get("num_shadows"), r.get("ratio"))
                for r in sc["results"]
                if r.get("world") == world
                and r.get("kind") == "mirror"
                and r.get("ratio") is not None
            )
            if pts:
                ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{world} trainers"
                )
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(
            sorted(
                {int(r["num_shadows"]) for r in sc["results"] if r.get("num_shadows") is not None}
            )
        )
        ax.set_xlabel("shadows")
        ax.set_ylabel("mirror ms/iter / none")
        ax.legend()
        fig.tight_layout()
        written.append(out / "bench_scaling.png")
        fig.savefig(written[-1], metadata=meta)
        plt.close(fig)
    methods = [
        (str(p.get("size")), m) for p in g.get("policies") or [] for m in p.get("methods") or []
    ]
    if methods or g.get("recovery"):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
        names = [f"{m['method']}, {size}" for size, m in methods]
        axes[0].bar(
            range(len(methods)),
            [m.get("lost_per_failure_s") or 0 for _, m in methods],
            color="tab:red",
        )
        axes[0].set_xticks(range(len(methods)), names, fontsize=8, rotation=35, ha="right")
        axes[0].set_yscale("log")
        axes[0].set_ylabel("work lost per failure, s")
        # per model size: its restores from 1, 2, 4 shadows, then its own DCP load (the median
        # over all its blocks; each ratio on the table is to its own block's)
        labels, vals, colors = [], [], []
        rec = g.get("recovery") or []
        for size in dict.fromkeys(x.get("size") for x in rec):
            rows = [x for x in rec if x.get("size") == size]
            for x in rows:
                labels.append(f"{x.get('shadows')} shadow(s), {size}")
                vals.append(x.get("restore_ms") or 0)
                colors.append("tab:green")
            labels.append(f"DCP load, {size}")
            vals.append(rows[0].get("dcp_load_ms_all_blocks") or rows[0].get("dcp_load_ms") or 0)
            colors.append("tab:grey")
        axes[1].bar(range(len(vals)), vals, color=colors)
        axes[1].set_xticks(range(len(vals)), labels, fontsize=8, rotation=35, ha="right")
        axes[1].set_ylabel("restore ms")
        fig.tight_layout()
        written.append(out / "bench_goals.png")
        fig.savefig(written[-1], metadata=meta)
        plt.close(fig)
    for w in written:
        print(f"wrote {_rel(w)}", flush=True)
    return written


def write_page(page: Path, harness_json: Path = HARNESS_JSON) -> None:
    """The page; when it is the committed one (docs/benchmarks.md), also the derived
    summary.json, README's benchmark block and the plots."""
    harness = _load(harness_json)
    _atomic_write(page, render_page(harness))
    if page.resolve() != DEFAULT_PAGE.resolve():
        return
    found = _found(harness)
    g = analyze(found)
    _atomic_write(SUMMARY_JSON, json.dumps(g, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    text = README.read_text(encoding="utf-8")
    new = update_readme(text, readme_block(harness))
    new = update_readme(new, demo_block(harness), DEMO_BEGIN, DEMO_END)
    if new != text:
        _atomic_write(README, new)
    write_plots(found, g, IMG)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--quick",
        action="store_true",
        help="each bench in its quick/short mode; JSON under bench/results/quick/",
    )
    mode.add_argument(
        "--full",
        action="store_true",
        help="each bench with its default settings; JSON under bench/results/",
    )
    mode.add_argument(
        "--page-only",
        action="store_true",
        help="run nothing; regenerate the page from the JSON present",
    )
    ap.add_argument(
        "--page",
        type=Path,
        default=DEFAULT_PAGE,
        help=f"where the page goes (default {_rel(DEFAULT_PAGE)})",
    )
    ap.add_argument(
        "--only",
        metavar="NAME[,NAME]",
        help="run only these benches and merge them into the recorded "
        "bench/results/harness.json (same mode), then regenerate the page",
    )
    args = ap.parse_args(argv)
    only: list[str] | None = None
    if args.only is not None:
        if args.page_only:
            ap.error("--only runs benches; it does not go with --page-only")
        only = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(only) - {b.name for b in BENCHES})
        if unknown or not only:
            ap.error(
                f"--only: unknown bench(es) {', '.join(unknown) or '(none given)'}; known: "
                + ", ".join(b.name for b in BENCHES)
            )
    if not args.page_only:
        flag = "--quick" if args.quick else "--full"
        if only is not None:
            flag += f" --only {','.join(only)}"
        run_all("quick" if args.quick else "full", f"python bench/harness.py {flag}", only)
    write_page(args.page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
