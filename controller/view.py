"""The job view: one JSON-serialisable picture of a running job's health (``shadowgrad status``).

:func:`collect` polls every shadow's ``status`` over its control endpoint (in parallel, so a
dead shadow costs one RPC timeout, not one per shadow), takes I* from the one restore-point rule
in core (:func:`shadowgrad.restore.restore_point`) and classifies every shadow, every shard and
the trainers. :func:`render_text` turns a view into the table ``shadowgrad status`` prints.

The view (``SCHEMA`` = 1; every key is always present unless marked optional):

* ``schema``, ``source`` (``"shadows"``: polled directly; ``shadowgrad status`` adds
  ``controller_state`` from the controller of ``[controller] address``; ``controller`` is
  that address or null),
  ``time`` (wall clock, s), ``elapsed_s`` (how long the poll took);
* ``job``: ``id``, ``name``, ``mode``, ``shadows``, ``shards``, ``replication``;
* ``trainers``: ``world_size``, ``iteration`` (newest iteration any shadow has seen), ``silent_s``
  (min over answering shadows of ``trainers_silent_s``), ``failure_detect_s``, ``alive``
  (``silent_s < failure_detect_s``; null when unknown), ``state`` (``running`` / ``silent`` /
  ``finished`` / ``unknown``), ``iterations_per_s`` (null without ``previous``), ``finished``
  (rank 0's word that training ended: ``iteration``, ``generation``, ``requester``, ``source``
  (``shadows``, or ``controller`` when only the controller was told); null while it runs);
* ``istar``: ``iteration`` (null when there is no restore point), ``fresh``, ``source`` (shadow
  per shard), ``usable`` (per shard), ``layout``, ``generations``, ``reason`` (why there is no
  restore point, else null), ``reachable``;
* ``shards``: per shard ``shard``, ``shadows``, ``answering``, ``usable``, ``healthy``,
  ``state`` (``ok`` / ``degraded`` / ``unavailable``);
* ``shadows``: per shadow (id order) ``id``, ``endpoint``, ``reachable``, ``error``,
  ``error_code``, ``shard``, ``replica``, ``loaded``, ``last_applied``, ``last_ready``,
  ``newest_seen``, ``istar_view``, ``lag``, ``lag_threshold``, ``diverged_at``, ``generation``,
  ``window``, ``buffered``, ``trainers_silent_s``, ``health`` (:data:`HEALTH`), ``drops``
  (reason -> count, non-zero only), ``drops_total``, ``events`` (:data:`EVENTS` -> count),
  ``rates`` (``applied_per_s``, ``drops_per_s``, ``nacks_per_s``; null without ``previous``);
* ``switch`` (optional): ``switch.counters()`` when a switch object is given;
* ``healthy`` (no problems), ``summary`` (one line), ``problems`` (human-readable strings).

This module imports no grpc/protobuf (nor torch: the shadow client is imported when polling).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

from shadowgrad.config import JobSpec
from shadowgrad.errors import ShadowgradError, ShadowgradTimeout
from shadowgrad.layout import shadows_of_shard
from shadowgrad.messages import ShadowStatus
from shadowgrad.restore import NoRestorePointError, restore_point, usable_iteration

__all__ = [
    "SCHEMA",
    "SOURCE_SHADOWS",
    "HEALTH",
    "EVENTS",
    "NOT_DROPS",
    "LAG_ITERATIONS",
    "Reply",
    "SwitchCounters",
    "collect",
    "build",
    "drops_of",
    "is_drop",
    "lag_threshold",
    "render_text",
    "use_colour",
    "exit_status",
]

SCHEMA = 1
#: ``source`` of a view polled from the shadows themselves (the only source today)
SOURCE_SHADOWS = "shadows"

#: a shadow's ``health``, best first
HEALTH = ("ok", "lagging", "stale", "diverged", "unloaded", "error", "unreachable")

#: rx counters that are not drops: the normal traffic, and redundant copies that carry nothing
#: new by design (a retransmission that raced the original, the idle rank 0's COMMIT heartbeat
#: for an applied iteration, READY soft state overtaken by a newer record). Every other rx
#: counter -- ``wire.*``, ``foreign_source``, ``bad_frame``, ``not_loaded``, ``not_final``,
#: ``stale``, ``ahead_of_window``, ``out_of_layout``, ``dtype_mismatch``, ``not_mine``,
#: ``no_buffer``, ``commit_ahead``, ``commit_not_rank0``, ``ready_bad_sender``,
#: ``ready_bad_shard``, ``unexpected_kind`` and any reason added later -- is a drop.
NOT_DROPS = frozenset(
    {
        "data",
        "retx",
        "duplicate",
        "commit",
        "commit_filled",
        "commit_duplicate",
        "commit_stale",
        "ready",
        "ready_stale",
    }
)

#: events of a shadow worth showing (always present in the view, 0 when not counted yet)
EVENTS = (
    "nack_sent",
    "nack_ranges",
    "repaired_bytes",
    "diverged",
    "resynced",
    "seeded",
    "cloned",
    "loads",
    "replay_failed",
    "resync_failed",
    "clone_failed",
    "repair_trainers_silent",
    "snapshots",
    "snapshot_failed",
    "load_stale_generation",
    "control_bad_token",
    "send_error",
)

#: a shadow is lagging when more than this many iterations behind the trainers (or a quarter
#: of its window, when that is smaller, but never below 2: iterations in flight are normal)
LAG_ITERATIONS = 8


class Reply(NamedTuple):
    """One shadow's answer to ``status``: the reply (None when there is none), and else the
    error code (``timeout``, ``unreachable``, or the code it answered, e.g. ``bad_token``),
    its text, and whether the shadow answered at all."""

    status: ShadowStatus | None
    code: str | None = None
    error: str | None = None
    reachable: bool = True


class SwitchCounters(Protocol):
    """What :func:`collect` needs of a switch: ``SwitchDriver.counters()``."""

    def counters(self) -> Mapping[str, Any]: ...


def is_drop(reason: str) -> bool:
    """Whether an rx counter of a shadow counts datagrams it rejected (see :data:`NOT_DROPS`)."""
    return reason not in NOT_DROPS


def drops_of(counters: Mapping[str, Any]) -> dict[str, int]:
    """The non-zero drop counters of a status's ``counters`` (rx), by reason."""
    return {k: int(v) for k, v in sorted(counters.items()) if is_drop(k) and int(v)}


def lag_threshold(window: int | None) -> int:
    """Lag (iterations) above which a shadow with buffer window ``window`` is lagging."""
    if not window:
        return LAG_ITERATIONS
    return max(2, min(LAG_ITERATIONS, int(window) // 4))


# ------------------------------------------------------------------------------- polling


def _poll(spec: JobSpec, token: str, timeout_s: float) -> dict[int, Reply]:
    """``{shadow: Reply}``, every shadow polled at once (one thread each, at most 256)."""
    import zmq

    from shadowgrad.control_client import ShadowClient
    from shadowgrad.errors import ControlError

    count = spec.shadows.count
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()

    def one(k: int) -> Reply:
        ep = f"tcp://{spec.shadows.control_endpoint(k)}"
        try:
            with ShadowClient(ep, token, timeout_s=timeout_s, context=ctx) as c:
                return Reply(c.status(timeline=0))
        except ShadowgradTimeout:
            return Reply(None, "timeout", f"no reply from {ep} within {timeout_s:g}s", False)
        except ControlError as e:  # it answered, but refused (bad_token, ...)
            return Reply(None, e.code, str(e), True)
        except (ShadowgradError, zmq.ZMQError, OSError, ValueError) as e:
            return Reply(None, "unreachable", f"{ep}: {e}", False)

    try:
        with ThreadPoolExecutor(
            max_workers=max(1, min(count, 256)), thread_name_prefix="sg-status"
        ) as pool:
            results = list(pool.map(one, range(count)))
    finally:
        ctx.term()
    return dict(enumerate(results))


def collect(
    spec: JobSpec,
    *,
    token: str | None = None,
    timeout_s: float | None = None,
    switch: SwitchCounters | None = None,
    previous: Mapping[str, Any] | None = None,
    finished: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Poll every shadow of ``spec`` (``status`` over its control endpoint, ``timeout_s``
    each, default ``timeouts.rpc``; all at once) and return the job view (module docstring).
    ``token``: the job's token (default ``spec.token()``); ``switch``: an object with
    ``counters()`` (e.g. a ``SwitchDriver``) whose counters join the view; ``previous``: an
    earlier view of the same job, for rates; ``finished``: the controller's word that training
    ended (see :func:`build`). Never raises for a shadow that is down or refuses the request:
    that is what the view reports."""
    tok = spec.token() if token is None else token
    timeout = spec.timeouts.rpc_s if timeout_s is None else float(timeout_s)
    if not timeout > 0:
        raise ShadowgradError(f"timeout must be positive, got {timeout_s!r}")
    t0 = time.monotonic()
    now = time.time()
    polled = _poll(spec, tok, timeout)
    sw: dict[str, Any] | None = None
    if switch is not None:
        try:
            sw = dict(switch.counters())
        except Exception as e:  # the switch is optional: report, do not fail the view
            sw = {"error": f"{type(e).__name__}: {e}"}
    return build(
        spec,
        polled,
        now=now,
        elapsed_s=time.monotonic() - t0,
        switch=sw,
        previous=previous,
        finished=finished,
    )


# ------------------------------------------------------------------------------- the view


def _rate(new: Any, old: Any, dt: float | None) -> float | None:
    if dt is None or new is None or old is None or not dt > 0 or new < old:
        return None
    return round((float(new) - float(old)) / dt, 3)


def _shadow_row(spec: JobSpec, k: int, reply: Reply) -> dict[str, Any]:
    num_shards = spec.num_shards
    s = reply.status
    drops = drops_of(s.counters) if s is not None else {}
    events = s.events if s is not None else {}
    return {
        "id": k,
        "endpoint": f"tcp://{spec.shadows.control_endpoint(k)}",
        "reachable": reply.reachable,
        "error": reply.error,
        "error_code": reply.code,
        "shard": k % num_shards,
        "replica": k // num_shards,
        "loaded": None if s is None else s.loaded,
        "last_applied": None if s is None else s.last_applied,
        "last_ready": None if s is None else s.last_ready,
        "newest_seen": None if s is None else s.newest_seen,
        "istar_view": None if s is None else s.istar,
        "lag": None,
        "lag_threshold": lag_threshold(None if s is None else s.window),
        "diverged_at": None if s is None else s.diverged_at,
        "generation": None if s is None else s.generation,
        "window": None if s is None else s.window,
        "buffered": None if s is None else s.buffered,
        "trainers_silent_s": None if s is None else s.trainers_silent_s,
        "health": "unreachable",
        "drops": drops,
        "drops_total": sum(drops.values()),
        "events": {e: int(events.get(e, 0)) for e in EVENTS},
        "rates": None,
    }


def build(
    spec: JobSpec,
    polled: Mapping[int, Reply],
    *,
    now: float | None = None,
    elapsed_s: float = 0.0,
    switch: Mapping[str, Any] | None = None,
    previous: Mapping[str, Any] | None = None,
    finished: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The view from already polled replies, ``polled[shadow]`` (what :func:`collect` gathers;
    a controller that polls the shadows itself builds the same view; a shadow missing from
    ``polled`` counts as unreachable). ``finished``: another witness that training ended (the
    controller's ``finished``: ``iteration``, ``generation``), used when no shadow says so and
    no shadow serves a newer generation than it names."""
    t = spec.timeouts
    num_shards, replication = spec.num_shards, spec.shadows.replication
    replies = {
        k: polled.get(k, Reply(None, "unreachable", "not polled", False))
        for k in range(spec.shadows.count)
    }
    statuses = {k: r.status for k, r in replies.items()}
    answering = {k: s for k, s in statuses.items() if s is not None}
    rows = [_shadow_row(spec, k, r) for k, r in replies.items()]
    problems: list[str] = []

    # trainers: as the shadows hear them
    iteration = max((s.newest_seen for s in answering.values()), default=None)
    silent_s = min((s.trainers_silent_s for s in answering.values()), default=None)
    alive = None if silent_s is None else silent_s < t.failure_detect_s
    state = "unknown" if alive is None else "running" if alive else "silent"
    ended = _finished_of(answering, finished)
    if ended is not None:
        state = "finished"  # rank 0 closed after the last iteration: its silence is no alarm
    trainers: dict[str, Any] = {
        "world_size": spec.trainers.world_size,
        "iteration": iteration,
        "silent_s": silent_s,
        "failure_detect_s": t.failure_detect_s,
        "alive": alive,
        "state": state,
        "iterations_per_s": None,
        "finished": ended,
    }

    # I*: the one rule, in core
    istar: dict[str, Any] = {
        "iteration": None,
        "fresh": False,
        "source": [],
        "usable": [],
        "layout": None,
        "generations": [],
        "reason": None,
        "reachable": len(answering),
    }
    try:
        point = restore_point(statuses, num_shards=num_shards, replication=replication)
    except NoRestorePointError as e:
        istar["reason"] = str(e)
    except ShadowgradError as e:  # shadows holding another layout: another job's state
        istar["reason"] = str(e)
    else:
        silent_shadows = spec.shadows.count - point.reachable
        if point.fresh and silent_shadows:
            # the rule calls "nothing loaded among those answering" fresh; with shadows that do
            # not answer (or refuse), whether they hold state is not known: report no I*
            istar["reason"] = (
                f"unknown: {silent_shadows} of {spec.shadows.count} shadows did not answer and "
                "none of the others holds state"
            )
        else:
            istar.update(
                iteration=point.istar,
                fresh=point.fresh,
                source=list(point.source),
                usable=list(point.usable),
                layout=point.digest,
                generations=list(point.generations),
                reachable=point.reachable,
            )

    # every shadow
    loaded_gens = [s.generation for s in answering.values() if s.loaded]
    job_gen = max(loaded_gens) if loaded_gens else None
    for row in rows:
        k = row["id"]
        s = statuses[k]
        if s is None:
            row["health"] = "error" if row["reachable"] else "unreachable"
            where = f"shadow {k} (shard {row['shard']}, replica {row['replica']})"
            if row["reachable"]:
                hint = " (wrong job token?)" if row["error_code"] == "bad_token" else ""
                problems.append(f"{where} refused status: {row['error']}{hint}")
            else:
                problems.append(f"{where} unreachable: {row['error']}")
            continue
        if not s.loaded:
            row["health"] = "unloaded"
            problems.append(f"shadow {k} is not loaded (holds no state)")
            continue
        la = row["last_applied"]
        if iteration is not None and la is not None:
            row["lag"] = max(0, iteration - int(la))
        if row["diverged_at"] is not None:
            row["health"] = "diverged"
            problems.append(
                f"shadow {k} diverged at iteration {row['diverged_at']} "
                "(waiting for a resync or a re-seed)"
            )
        elif job_gen is not None and int(row["generation"] or 0) < job_gen:
            row["health"] = "stale"
            problems.append(
                f"shadow {k} holds generation {row['generation']}, the job runs "
                f"{job_gen} (an older instance's state)"
            )
        elif row["lag"] is not None and row["lag"] > row["lag_threshold"]:
            row["health"] = "lagging"
            problems.append(
                f"shadow {k} is lagging: {row['lag']} iterations behind "
                f"(applied {la}, trainers at {iteration})"
            )
        else:
            row["health"] = "ok"

    # every shard
    shards = []
    for shard in range(num_shards):
        members = shadows_of_shard(shard, num_shards, replication)
        ans = [m for m in members if statuses[m] is not None]
        usable = [m for m in ans if usable_iteration(answering[m]) is not None]
        healthy = [m for m in members if rows[m]["health"] in ("ok", "lagging")]
        st = "unavailable" if not usable else "ok" if len(healthy) == len(members) else "degraded"
        if st == "unavailable":
            why = (
                "no replica answers"
                if not ans
                else f"no replica holds usable state ({len(ans)} of {len(members)} answer)"
            )
            problems.append(f"shard {shard} unavailable: {why} (replication {replication})")
        elif st == "degraded":
            problems.append(
                f"shard {shard} degraded: {len(healthy)} of {len(members)} replicas healthy"
            )
        shards.append(
            {
                "shard": shard,
                "shadows": list(members),
                "answering": len(ans),
                "usable": len(usable),
                "healthy": len(healthy),
                "state": st,
            }
        )

    if istar["reason"] is not None:
        problems.append(f"no restore point: {istar['reason']}")
    if state == "silent":
        problems.append(
            f"trainers silent for {silent_s:.1f}s (failure_detect "
            f"{t.failure_detect_s:g}s): the job is stopped, crashed or restarting"
        )
    elif state == "unknown":
        problems.append("trainers: unknown (no shadow answers)")
    if switch is not None and "error" in switch:
        problems.append(f"switch counters unavailable: {switch['error']}")

    # rates against an earlier view
    if previous is not None:
        dt = None
        if previous.get("time") is not None and now is not None:
            dt = now - float(previous["time"])
        prev_t = previous.get("trainers") or {}
        trainers["iterations_per_s"] = _rate(iteration, prev_t.get("iteration"), dt)
        prev_rows = {int(r["id"]): r for r in previous.get("shadows") or []}
        for row in rows:
            p = prev_rows.get(row["id"])
            if p is None or row["last_applied"] is None or p.get("generation") != row["generation"]:
                continue
            row["rates"] = {
                "applied_per_s": _rate(row["last_applied"], p.get("last_applied"), dt),
                "drops_per_s": _rate(row["drops_total"], p.get("drops_total"), dt),
                "nacks_per_s": _rate(
                    row["events"]["nack_sent"], (p.get("events") or {}).get("nack_sent"), dt
                ),
            }

    ok = sum(r["health"] == "ok" for r in rows)
    if not problems:
        summary = (
            f"healthy: I* = {istar['iteration']}, trainers {state} at iteration "
            f"{iteration}, {ok}/{len(rows)} shadows ok"
        )
    else:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        summary = f"DEGRADED: {problems[0]}{more}"
    view: dict[str, Any] = {
        "schema": SCHEMA,
        "source": SOURCE_SHADOWS,
        "controller": (None if spec.controller.address is None else str(spec.controller.address)),
        "time": now if now is not None else time.time(),
        "elapsed_s": round(elapsed_s, 3),
        "job": {
            "id": spec.job.id,
            "name": spec.job.name,
            "mode": spec.job.mode,
            "shadows": spec.shadows.count,
            "shards": num_shards,
            "replication": replication,
        },
        "trainers": trainers,
        "istar": istar,
        "shards": shards,
        "shadows": rows,
        "healthy": not problems,
        "summary": summary,
        "problems": problems,
    }
    if switch is not None:
        view["switch"] = switch
    return view


def _finished_of(
    answering: Mapping[int, ShadowStatus], witness: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Whether training ended: a loaded shadow of the job's generation (the newest served)
    says so for that generation; else ``witness`` (the controller), unless a shadow serves a
    newer generation than it names (a new run)."""
    gens = [s.generation for s in answering.values() if s.loaded]
    job_gen = max(gens) if gens else None
    for s in answering.values():
        f = s.finished
        if f is not None and s.loaded and s.generation == job_gen == f.get("generation"):
            return {**dict(f), "source": "shadows"}
    if witness is None:
        return None
    wgen = witness.get("generation")
    if job_gen is not None and isinstance(wgen, int) and job_gen > wgen:
        return None
    return {
        "iteration": witness.get("iteration"),
        "generation": wgen,
        "requester": witness.get("requester"),
        "source": "controller",
    }


def exit_status(view: Mapping[str, Any]) -> int:
    """``shadowgrad status``'s exit status for a view: 0 healthy, 3 degraded."""
    return 0 if view.get("healthy") else 3


# ------------------------------------------------------------------------------- text

_RED, _YELLOW, _GREEN, _BOLD, _RESET = "\x1b[31m", "\x1b[33m", "\x1b[32m", "\x1b[1m", "\x1b[0m"
_HEALTH_COLOUR = {
    "ok": _GREEN,
    "lagging": _YELLOW,
    "unloaded": _YELLOW,
    "stale": _RED,
    "diverged": _RED,
    "error": _RED,
    "unreachable": _RED,
}


def use_colour(stream: Any) -> bool:
    """ANSI colours: only on a terminal, and never with ``NO_COLOR`` set (no-color.org)."""
    isatty = getattr(stream, "isatty", None)
    return (
        bool(isatty and isatty())
        and "NO_COLOR" not in os.environ
        and os.environ.get("TERM") != "dumb"
    )


def _fmt(v: Any) -> str:
    return "-" if v is None else str(v)


def _drops_text(row: Mapping[str, Any], top: int = 3) -> str:
    total = int(row.get("drops_total") or 0)
    if not total:
        return "0"
    items = sorted((row.get("drops") or {}).items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{k} {v}" for k, v in items[:top])
    if len(items) > top:
        shown += ", ..."
    return f"{total} ({shown})"


def render_text(view: Mapping[str, Any], *, colour: bool = False) -> str:
    """The view as the plain-text table of ``shadowgrad status`` (ANSI colours if asked)."""

    def paint(text: str, code: str | None) -> str:
        return f"{code}{text}{_RESET}" if colour and code else text

    job, tr, ist = view["job"], view["trainers"], view["istar"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(view["time"])))
    title = (
        f"job {job['id']} {job['name']} ({job['mode']}): {job['shadows']} shadows, "
        f"{job['shards']} shards x {job['replication']} "
        f"{'replica' if job['replication'] == 1 else 'replicas'}"
    )
    lines = [paint(title, _BOLD) + f"   {when}   source: {view['source']}"]
    silent = "-" if tr["silent_s"] is None else f"{tr['silent_s']:.2f}s"
    tstate = paint(
        tr["state"],
        {"running": _GREEN, "finished": _GREEN, "silent": _RED}.get(tr["state"], _YELLOW),
    )
    if tr.get("finished") is not None:
        tstate += f" (training ended after iteration {_fmt(tr['finished'].get('iteration'))})"
    rate = "" if tr.get("iterations_per_s") is None else f", {tr['iterations_per_s']:g} it/s"
    lines.append(
        f"trainers: iteration {_fmt(tr['iteration'])}, {tstate}, silent {silent} "
        f"(failure_detect {tr['failure_detect_s']:g}s){rate}"
    )
    cs = view.get("controller_state")
    if cs is not None:
        if "error" in cs:
            lines.append("controller: " + paint(f"unreachable ({cs['error']})", _RED))
        else:
            held = (cs.get("istar") or {}).get("istar")
            extra = f", I* {held} held on {cs.get('held')}" if cs.get("held") else ""
            by_state: dict[str, list[str]] = {}
            for k, v in (cs.get("shadows") or {}).items():
                if v not in (None, "ok"):
                    by_state.setdefault(str(v), []).append(str(k))
            extra += "".join(f"; shadows {st}: {', '.join(ks)}" for st, ks in by_state.items())
            lines.append(
                "controller: "
                + paint(
                    str(cs.get("state")),
                    _GREEN if cs.get("state") in ("running", "finished") else _YELLOW,
                )
                + f" ({cs.get('reason')}){extra}"
            )
    if ist["reason"] is not None:
        lines.append("I*: " + paint(f"none: {ist['reason']}", _RED))
    elif ist["fresh"]:
        lines.append("I*: -1 (fresh: no shadow holds state)")
    else:
        srcs = ", ".join(f"shard {s} <- shadow {k}" for s, k in enumerate(ist["source"]))
        lines.append(f"I*: {ist['iteration']}   sources: {srcs}")
    head = (
        f"{'shadow':>6}  {'shard/rep':<9}  {'health':<11}  {'applied':>8}  {'lag':>5}  "
        f"{'diverged':>8}  {'gen':>13}  drops"
    )
    lines.append(head)
    for r in view["shadows"]:
        health = f"{r['health']:<11}"
        lines.append(
            f"{r['id']:>6}  {str(r['shard']) + '/' + str(r['replica']):<9}  "
            f"{paint(health, _HEALTH_COLOUR.get(r['health']))}  {_fmt(r['last_applied']):>8}  "
            f"{_fmt(r['lag']):>5}  {_fmt(r['diverged_at']):>8}  {_fmt(r['generation']):>13}  "
            f"{_drops_text(r)}"
        )
    if view.get("switch") is not None:
        sw = view["switch"]
        if "error" in sw:
            lines.append("switch: " + paint(str(sw["error"]), _RED))
        else:
            drops = sw.get("drops") or {}
            lines.append(f"switch: drops {drops}" if drops else "switch: counters read")
    problems: Sequence[str] = view["problems"]
    if problems:
        lines.append(paint(f"problems ({len(problems)}):", _RED))
        lines += [f"  - {p}" for p in problems]
    lines.append(paint(view["summary"], _GREEN if view["healthy"] else _RED))
    return "\n".join(lines)
