"""``shadowgrad controller``: the job's long-running controller (docs/operations.md).

It watches the job through two independent signals and acts on failures:

* **trainers** — the COMMIT heartbeats and DATA as the shadows see them (every shadow's status
  carries ``trainers_silent_s`` and, per rank, ``ranks[r].silent_s``; an idle rank 0 re-sends
  its last COMMIT every ``timeouts.heartbeat``) and, with a switch, the switch's per-port COMMIT
  counters. Silence longer than ``timeouts.failure_detect`` is a trainer failure: the
  controller fixes I* with the one rule in core (:mod:`shadowgrad.restore`), holds it on the
  source shadows and publishes it; restarted trainers (``torchrun --max-restarts`` or a rerun)
  ask the controller for it; once they send again the holds are released;
* **shadows** — their status; a shadow that does not answer for ``failure_detect`` is failed
  (r >= 2: its shard goes on from the replicas; r = 1: the shard is degraded). One that has not
  answered loaded yet is ``starting`` (the job has not started, or the trainers' first load
  keeps it busy) and is failed only after ``timeouts.connect`` without an answer; once training
  finished, shadows that go away are ``stopped``, not failed. When a failed shadow returns
  it re-joins (cloned from a replica or re-seeded by the trainers, the shadows' own mechanism)
  and the controller reports when it has caught up;
* **switch** (in-band) — programmed at start through the driver and re-converged every
  ``converge_every_s``; a restarted controller reads the switch back and writes nothing that is
  already right (invariant 6).

State machine (``state``, :mod:`shadowgrad.controller.states`, one transition table):
``starting`` → ``running`` ⇄ ``trainers_failed`` → ``restoring`` → ``running``; ``finished``
when rank 0 closes after the last iteration (silence is then no failure) until a new run
starts. Every transition is a structured event ``controller.state`` with a reason.

The control endpoint (ZeroMQ, ``[controller] address``) speaks the shadows' envelope (JSON head
with the job token, frames) and serves ``status``, ``restore_point``, ``finished`` and
``release``; a request without the token or with a wrong one is refused (``bad_token``),
logged, counted and changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from shadowgrad import events
from shadowgrad._control_server import ControlServer, Reply, bind_router
from shadowgrad._log import event
from shadowgrad.config import JobSpec
from shadowgrad.errors import ShadowgradError
from shadowgrad.messages import (
    ControllerReleaseReply,
    ControllerReleaseRequest,
    ControllerStatus,
    ControllerStatusRequest,
    FinishedReply,
    FinishedRequest,
    RestorePointReply,
    RestorePointRequest,
    ShadowStatus,
    shadow_statuses,
)
from shadowgrad.restore import NoRestorePointError, fix_restore_point, restore_point
from shadowgrad.seams import ShadowStatusSource, SwitchDriver

from .states import ControllerEvent, ControllerState, transition

if TYPE_CHECKING:
    from shadowgrad.control_client import ShadowClient

__all__ = ["Controller", "ControllerOptions"]

log = logging.getLogger(__name__)


def _refusal(e: Exception) -> tuple[str, str] | None:
    """How the control endpoint answers a handler's exception: any ShadowgradError (a
    ControlError too) as ``unavailable``; anything else is the server's ``internal``."""
    if isinstance(e, ShadowgradError):
        return "unavailable", str(e)
    return None


@dataclass(frozen=True)
class ControllerOptions:
    #: how often the shadows are polled; None: min(heartbeat, 0.25 s)
    poll_s: float | None = None
    #: how often the switch is re-converged (in-band with a driver)
    converge_every_s: float = 5.0
    #: a shadow this many iterations behind the trainers is "lagging"
    lag_iterations: int = 8


@dataclass
class _Member:
    reachable: bool = True
    since: float = 0.0  # monotonic: when it became (un)reachable
    last_ok: float = 0.0  # monotonic: its last status answer
    seen: bool = False  # answered at least once since the controller started
    #: answered loaded at least once (its job started): until then the shadow is "starting"
    #: (the trainers' first load may keep it from answering for a while) and is failed only
    #: after timeouts.connect without an answer
    started: bool = False
    #: not answering since training finished: the job is being shut down, no failure
    stopped: bool = False
    failed: bool = False
    rejoining: bool = False
    #: the process identity it last answered with (ShadowStatus.incarnation; None: not known)
    incarnation: str | None = None

    def state(self) -> str:
        """``ok``, ``starting``, ``unreachable`` (not answering, not failed yet), ``failed``,
        ``rejoining`` (failed, answering again, not caught up yet) or ``stopped``."""
        if self.failed:
            return "rejoining" if self.rejoining else "failed"
        if self.stopped:
            return "stopped"
        if not self.started:
            return "starting"
        return "ok" if self.reachable else "unreachable"


class Controller:
    """The controller of one job. ``driver``: a :class:`~shadowgrad.seams.SwitchDriver` (the
    P4Runtime one is :class:`~shadowgrad.controller.switch.SwitchDriver`; in-band; None in
    mirror mode or when another process owns the switch). ``endpoints``: shadow id -> control
    endpoint (default: the spec's); ``statuses``: a :class:`~shadowgrad.seams.
    ShadowStatusSource`, a callable returning every shadow's status, typed or as a dict
    (default: polled from the endpoints). The seams' docstrings say when each is called."""

    def __init__(
        self,
        spec: JobSpec,
        *,
        token: str | None = None,
        driver: SwitchDriver | None = None,
        bind: str | None = None,
        options: ControllerOptions | None = None,
        statuses: ShadowStatusSource | None = None,
        endpoints: Mapping[int, str] | None = None,
    ) -> None:
        self.spec = spec
        self.opts = options or ControllerOptions()
        self._token = token if token is not None else spec.token()
        self.driver: SwitchDriver | None = driver
        t = spec.timeouts
        self.poll_s = self.opts.poll_s if self.opts.poll_s is not None else min(t.heartbeat_s, 0.25)
        # a status is small and local: a shadow that does not answer in this long is counted
        # as not answering (failure_detect of those makes it failed), so one dead shadow never
        # stalls a tick for timeouts.rpc
        self._poll_timeout_s = min(t.rpc_s, max(0.2, t.failure_detect_s / 4))
        if bind is None and spec.controller.address is not None:
            bind = f"tcp://{spec.controller.address}"
        self.bind = bind
        self._endpoints = (
            dict(endpoints)
            if endpoints is not None
            else {k: f"tcp://{spec.shadows.control_endpoint(k)}" for k in range(spec.shadows.count)}
        )
        self._poll_statuses: Callable[[], dict[int, ShadowStatus | None]] = (
            self._poll_shadows if statuses is None else lambda: shadow_statuses(statuses())
        )
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, spec.shadows.count), thread_name_prefix="ctl-poll"
        )
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: the control endpoint's request loop (when ``bind`` is set; from :meth:`start`)
        self._control: ControlServer | None = None
        self.ev: Counter[str] = Counter()
        self._refused: set[int] = set()  # shadows that refused our token (logged once each)
        self.state = ControllerState.STARTING
        self.reason = "started"
        self.statuses: dict[int, ShadowStatus | None] = {}
        self.members = {
            k: _Member(since=time.monotonic(), last_ok=time.monotonic())
            for k in range(spec.shadows.count)
        }
        self.istar: dict[str, Any] | None = None  # the published restore point
        self.held: list[int] = []
        self.failure: dict[str, Any] | None = None
        self.detections: list[dict[str, Any]] = []
        self.converge_reports: list[dict[str, Any]] = []
        self._switch_commits: tuple[int, float] | None = None  # (total COMMITs, when it moved)
        self._next_converge = 0.0
        self._generation_at_failure: int | None = None
        #: rank 0's ``finished`` (iteration, generation, requester) while state is "finished"
        self.finished: dict[str, Any] | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> Controller:
        if self.driver is not None:
            self._converge(initial=True)
        if self.bind is not None:
            try:
                ctx, rep = bind_router(self.bind)
            except zmq.ZMQError as e:
                raise ShadowgradError(f"controller: cannot bind {self.bind}: {e}") from None
            self._control = ControlServer(
                ctx,
                rep,
                self._token,
                counters=self.ev,
                logger=log,
                bad_token_event=events.CONTROLLER_CONTROL_BAD_TOKEN,
                poll_s=0.1,
                stop=self._stop,
                refusal=_refusal,
                handlers={
                    "status": self._op_status,
                    "restore_point": self._op_restore_point,
                    "finished": self._op_finished,
                    "release": self._op_release,
                },
                name="ctl-control",
            )
            self._spawn(self._control.serve, "ctl-control")
        try:
            self.tick()
        except Exception as e:  # the watch loop retries; a bad first poll is no reason to stop
            self.ev["tick_error"] += 1
            log.exception("controller tick failed: %s", e)
        self._spawn(self._watch_loop, "ctl-watch")
        event(
            log,
            events.CONTROLLER_STARTED,
            job=self.spec.job.id,
            mode=self.spec.job.mode,
            bind=self.bind,
            switch=self.driver is not None,
        )
        return self

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        th = threading.Thread(target=target, name=name, daemon=True)
        th.start()
        self._threads.append(th)

    def close(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(5.0)
        self._threads.clear()
        if self._control is not None:
            self._control.close(0.0)
            self._control = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Controller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- polling

    def _client(self, k: int, timeout_s: float) -> ShadowClient:
        from shadowgrad.control_client import ShadowClient

        return ShadowClient(self._endpoints[k], self._token, timeout_s=timeout_s)

    def _one(self, k: int) -> ShadowStatus | None:
        from shadowgrad.errors import ControlError

        try:
            with self._client(k, self._poll_timeout_s) as c:
                return c.status(timeline=0)
        except ControlError as e:
            if e.code == "bad_token":
                self.ev["shadow_refused_token"] += 1
                if k not in self._refused:  # once per shadow, not once per poll
                    self._refused.add(k)
                    event(
                        log,
                        events.CONTROLLER_SHADOW_REFUSED_TOKEN,
                        level=logging.ERROR,
                        shadow=k,
                        error=str(e),
                    )
            return None
        except Exception as e:  # unreachable, timeout, ...: reported by the caller
            log.debug("status of shadow %d failed: %s", k, e)
            return None

    def _poll_shadows(self) -> dict[int, ShadowStatus | None]:
        futs = {k: self._pool.submit(self._one, k) for k in range(self.spec.shadows.count)}
        out: dict[int, ShadowStatus | None] = {}
        for k, f in futs.items():
            try:
                out[k] = f.result(timeout=self._poll_timeout_s + 1.0)
            except Exception:
                out[k] = None
        return out

    def _watch_loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.tick()
            except Exception as e:  # never let one bad tick stop the watch
                self.ev["tick_error"] += 1
                log.exception("controller tick failed: %s", e)

    # ---------------------------------------------------------------- detection

    def _generation_seen(self) -> int:
        """The newest generation a shadow that answered the last poll serves (0: none)."""
        return max((s.generation for s in self.statuses.values() if s), default=0)

    def trainers_signal(self) -> dict[str, Any]:
        """What the shadows (and the switch) say about the trainers."""
        sts = [s for s in self.statuses.values() if s is not None and s.loaded]
        silent = [s.trainers_silent_s for s in sts]
        ranks: dict[str, dict[str, Any]] = {}
        for s in sts:
            for r, d in s.ranks.items():
                cur = ranks.get(str(r))
                if cur is None or d.silent_s < float(cur["silent_s"]):
                    ranks[str(r)] = d.to_json()
        newest = max((s.newest_seen for s in sts), default=None)
        out: dict[str, Any] = {
            "silent_s": min(silent) if silent else None,
            "ranks": ranks,
            "iteration": newest,
            "shadows_reporting": len(sts),
        }
        if self._switch_commits is not None:
            out["switch_commits"] = self._switch_commits[0]
            out["switch_silent_s"] = round(time.monotonic() - self._switch_commits[1], 3)
        return out

    def tick(self) -> None:
        """One round: poll the shadows (and the switch counters), detect, act."""
        statuses = self._poll_statuses()
        now = time.monotonic()
        with self._lock:
            self.statuses = statuses
            self._watch_switch(now)
            self._watch_shadows(now)
            self._watch_trainers(now)
        if self.driver is not None and now >= self._next_converge:
            self._converge(initial=False)

    def _watch_switch(self, now: float) -> None:
        if self.driver is None:
            return
        try:
            c = self.driver.counters()
        except Exception as e:
            self.ev["switch_counters_failed"] += 1
            log.debug("switch counters failed: %s", e)
            return
        commits = c.get("commits") or []
        per_rank = commits.values() if isinstance(commits, Mapping) else commits
        total = sum(int(v[0]) for v in per_rank)  # (packets, bytes) per trainer rank
        if self._switch_commits is None or self._switch_commits[0] != total:
            self._switch_commits = (total, now)

    def _watch_shadows(self, now: float) -> None:
        fd = self.spec.timeouts.failure_detect_s
        for k, m in self.members.items():
            st = self.statuses.get(k)
            if st is not None:
                m.last_ok, m.seen, m.stopped = now, True, False
                restarted = (
                    st.incarnation is not None
                    and m.incarnation is not None
                    and st.incarnation != m.incarnation
                )
                if st.incarnation is not None:
                    m.incarnation = st.incarnation
                if (
                    m.started
                    and (restarted or not st.loaded)
                    and not m.failed
                    and self.state != ControllerState.FINISHED
                ):
                    # it had state and is another process now, or answers without its state: it
                    # restarted and lost what it held. A process that answers while still
                    # starting can be back within failure_detect, and one re-seeded (or cloned
                    # from its replica) at once can answer loaded again before the next poll:
                    # its new incarnation tells either apart from a shadow that never went away
                    why = "a new process" if restarted else "answers without its state"
                    self._shadow_failed(k, m, f"{why} (restarted)")
                    m.reachable = False  # it went away, however briefly: back just below
                m.started = m.started or st.loaded
                if not m.reachable:
                    m.reachable, m.since = True, now
                    if m.failed:
                        m.rejoining = True
                        event(
                            log,
                            events.CONTROLLER_SHADOW_BACK,
                            shadow=k,
                            loaded=st.loaded,
                            last_applied=st.last_applied,
                        )
                if m.rejoining and st.loaded and st.diverged_at is None:
                    it = self.trainers_signal().get("iteration")
                    la = st.last_applied
                    if la is not None and (
                        it is None or int(it) - int(la) <= self.opts.lag_iterations
                    ):
                        m.rejoining = m.failed = False
                        event(
                            log,
                            events.CONTROLLER_SHADOW_REJOINED,
                            shadow=k,
                            last_applied=la,
                            down_s=round(now - m.since, 3),
                        )
                continue
            if m.reachable:
                # unreachable since its last answer (the poll before this one)
                m.reachable, m.since = False, m.last_ok
            if self.state == ControllerState.FINISHED:
                # training ended: shadows going away now are the job being shut down (the
                # demo closes the switch, an operator stops them), not failures. When a new
                # run starts, one still away is starting again, with its start deadline from
                # then
                if not m.stopped and not m.failed:
                    event(log, events.CONTROLLER_SHADOW_STOPPED, shadow=k, after="finished")
                m.stopped, m.started, m.since = not m.failed, False, now
                continue
            # a shadow not started yet (never answered loaded since the controller started: it
            # starts with or after the controller, and the trainers' first load may keep it
            # busy) is "starting": failed only once it had timeouts.connect to come up
            limit = fd if m.started else max(fd, self.spec.timeouts.connect_s)
            if not m.failed and now - m.since >= limit:
                self._shadow_failed(
                    k,
                    m,
                    f"no status reply for {now - m.since:.1f}s"
                    if m.started
                    else f"not started (never answered loaded) in {now - m.since:.1f}s"
                    if m.seen
                    else f"never answered in {now - m.since:.1f}s since the controller started",
                )

    def _shadow_failed(self, k: int, m: _Member, evidence: str) -> None:
        from shadowgrad.layout import shadows_of_shard

        m.failed = True
        self.ev["shadow_failures"] += 1
        shard = k % self.spec.num_shards
        peers = [
            j
            for j in shadows_of_shard(shard, self.spec.num_shards, self.spec.shadows.replication)
            if j != k and self.statuses.get(j) is not None
        ]
        event(
            log,
            events.CONTROLLER_SHADOW_FAILED,
            level=logging.WARNING,
            shadow=k,
            shard=shard,
            replicas_answering=peers,
            degraded=not peers,
            evidence=evidence,
        )

    def _watch_trainers(self, now: float) -> None:
        fd = self.spec.timeouts.failure_detect_s
        sig = self.trainers_signal()
        silent = sig["silent_s"]
        if silent is None:
            return  # no loaded shadow: nothing to say about the trainers yet
        if self.state == ControllerState.FINISHED:
            gen = self._generation_seen()
            if self._generation_at_failure is None:
                self._generation_at_failure = gen  # finished before the first poll
            elif silent < fd and gen > self._generation_at_failure:
                self._transition(
                    ControllerEvent.NEW_RUN, f"a new run of the job (generation {gen})"
                )
            return
        if self.state in (ControllerState.STARTING, ControllerState.RUNNING):
            if self.state == ControllerState.STARTING and silent < fd:
                self._transition(ControllerEvent.TRAINERS_HEARD, "trainers heard from")
            if silent >= fd:
                self._trainers_failed(sig, evidence="shadows")
        elif (
            self.state in (ControllerState.TRAINERS_FAILED, ControllerState.RESTORING)
            and silent < fd
        ):
            gen = self._generation_seen()
            newer = self._generation_at_failure is None or gen > self._generation_at_failure
            istar = (self.istar or {}).get("istar")
            # a paused job that goes on (same generation) sends iterations past I* + 1
            resumed = (
                istar is not None
                and sig.get("iteration") is not None
                and int(sig["iteration"]) > int(istar) + 1
            )
            if newer or resumed:
                self._recovered(sig, gen)

    def _trainers_failed(
        self, sig: dict[str, Any], *, evidence: str, requester: str | None = None
    ) -> None:
        ranks = sig.get("ranks") or {}
        quiet = sorted(ranks, key=lambda r: -float(ranks[r]["silent_s"]))
        member = f"rank {quiet[0]}" if quiet else "trainers"
        self.failure = {
            "member": member,
            "evidence": evidence,
            "requester": requester,
            "signal": sig,
            "wall": time.time(),
        }
        self.detections.append(self.failure)
        self.ev["trainer_failures"] += 1
        self._generation_at_failure = self._generation_seen()
        event(
            log,
            events.CONTROLLER_TRAINER_FAILED,
            level=logging.WARNING,
            member=member,
            evidence=evidence,
            requester=requester,
            silent_s=sig.get("silent_s"),
            ranks={r: d.get("silent_s") for r, d in ranks.items()},
            switch_silent_s=sig.get("switch_silent_s"),
            last_iteration=sig.get("iteration"),
        )
        self._transition(ControllerEvent.TRAINERS_FAILED, f"{member} silent ({evidence})")
        try:
            self._fix_istar()
        except ShadowgradError as e:
            self.istar = {"error": str(e)}
            event(log, events.CONTROLLER_RESTORE_POINT_FAILED, level=logging.ERROR, error=str(e))

    def _recovered(self, sig: dict[str, Any], generation: int) -> None:
        held, self.held = self.held, []
        istar = (self.istar or {}).get("istar")
        for k in held:
            self._release(k, istar)
        down = None if self.failure is None else round(time.time() - self.failure["wall"], 3)
        event(
            log,
            events.CONTROLLER_RECOVERED,
            istar=istar,
            generation=generation,
            iteration=sig.get("iteration"),
            down_s=down,
            released=held,
        )
        self.ev["recoveries"] += 1
        self._transition(
            ControllerEvent.RECOVERED, f"trainers running again (generation {generation})"
        )

    def _transition(self, what: ControllerEvent, reason: str) -> None:
        """The one way ``state`` changes: :func:`~shadowgrad.controller.states.transition`
        (IllegalTransitionError, changing nothing, if ``what`` is not allowed now); a change
        is the event ``controller.state`` (old, new, reason); the reason is updated always."""
        new = transition(self.state, what)
        if new != self.state:
            event(log, events.CONTROLLER_STATE, old=self.state.value, new=new.value, reason=reason)
        self.state, self.reason = new, reason

    # ---------------------------------------------------------------- I*

    def _fix_istar(self) -> dict[str, Any]:
        """Settle, compute I* with the core rule and hold it on its sources (recomputed and
        held again when a source moved on meanwhile: :func:`~shadowgrad.restore.
        fix_restore_point`), then publish it. Never publishes a point held nowhere: when no
        attempt holds, NoRestorePointError (the trainers then survey the shadows)."""
        t = self.spec.timeouts
        old = (self.istar or {}).get("istar")
        old_held, self.held = self.held, []
        for k in old_held:  # a new decision replaces the old one (and its holds)
            self._release(k, old)

        def hold(k: int, it: int) -> None:
            with self._client(k, t.rpc_s) as c:
                c.hold(it)

        def release(k: int, it: int) -> None:
            self._release(k, it)

        def poll() -> dict[int, ShadowStatus | None]:
            self.statuses = self._poll_statuses()
            return self.statuses

        point, held = fix_restore_point(
            poll,
            hold,
            release,
            num_shards=self.spec.num_shards,
            replication=self.spec.shadows.replication,
            interval_s=max(0.05, min(t.gap_repair_s, self.poll_s)),
            timeout_s=t.failure_detect_s,
            who="controller",
            first=self.statuses,
        )
        self.held = held
        doc = point.to_json()
        doc["held"] = list(self.held)
        doc["generation_seen"] = self._generation_seen()
        self.istar = doc
        event(
            log,
            events.CONTROLLER_RESTORE_POINT,
            istar=point.istar,
            fresh=point.fresh,
            source=list(point.source),
            usable=list(point.usable),
            held=self.held,
        )
        return doc

    def _release(self, k: int, istar: Any) -> None:
        if istar is None:
            return
        try:
            with self._client(k, self.spec.timeouts.rpc_s) as c:
                c.release(int(istar))
        except Exception as e:
            event(
                log, events.CONTROLLER_RELEASE_FAILED, level=logging.WARNING, shadow=k, error=str(e)
            )

    def restore_point(
        self, requester: str = "operator", failed: int | None = None
    ) -> dict[str, Any]:
        """The restore point restarted trainers use: the published one while the failure is
        being handled; otherwise (a restart the controller had not detected yet, e.g.
        torchrun restarting faster than failure_detect) the request is itself the evidence.
        ``failed``: the requester could not fetch that iteration (the published point, if it
        is that one, is stale: it is fixed and held anew)."""
        with self._lock:
            if (
                self.state in (ControllerState.TRAINERS_FAILED, ControllerState.RESTORING)
                and self.istar is not None
                and "error" not in self.istar
            ):
                if failed is not None and self.istar.get("istar") == failed:
                    event(
                        log,
                        events.CONTROLLER_RESTORE_POINT_STALE,
                        level=logging.WARNING,
                        istar=failed,
                        requester=requester,
                    )
                    try:
                        self._fix_istar()
                    except ShadowgradError as e:
                        self.istar = {"error": str(e)}
                        raise
                self._transition(
                    ControllerEvent.RESTORE_REQUESTED, f"restart requested by {requester}"
                )
                return dict(self.istar)
            self.statuses = self._poll_statuses()
            if not any(s is not None and s.loaded for s in self.statuses.values()):
                # a new job (no shadow holds state yet): not a failure
                point = restore_point(
                    self.statuses,
                    num_shards=self.spec.num_shards,
                    replication=self.spec.shadows.replication,
                )
                return {
                    **point.to_json(),
                    "held": [],
                    "generation_seen": self._generation_seen(),
                }
            self._trainers_failed(
                self.trainers_signal(), evidence="restart request", requester=requester
            )
            if self.istar is None or "error" in self.istar:
                raise NoRestorePointError((self.istar or {}).get("error", "no restore point"))
            self._transition(ControllerEvent.RESTORE_REQUESTED, f"restart requested by {requester}")
            return dict(self.istar)

    def reload(self, spec: JobSpec, driver: SwitchDriver | None = None) -> dict[str, Any] | None:
        """Take an updated spec (``shadowgrad controller`` on SIGHUP): e.g. a failed shadow
        replaced at another address. The job, the counts and the token must not change; with a
        switch, the driver of the new spec converges at once, writing only the entries that
        differ (the replaced shadow's rewrite and route). Returns that convergence report."""
        if (
            spec.job.id,
            spec.shadows.count,
            spec.shadows.replication,
            spec.trainers.world_size,
        ) != (
            self.spec.job.id,
            self.spec.shadows.count,
            self.spec.shadows.replication,
            self.spec.trainers.world_size,
        ):
            raise ShadowgradError(
                "reload: the job id, shadow count, replication and world size "
                "cannot change under a running controller; restart it"
            )
        with self._lock:
            changed = [
                k
                for k in range(spec.shadows.count)
                if spec.shadows.addresses[k] != self.spec.shadows.addresses[k]
                or spec.shadows.control_endpoint(k) != self.spec.shadows.control_endpoint(k)
            ]
            self.spec = spec
            self._endpoints = {
                k: f"tcp://{spec.shadows.control_endpoint(k)}" for k in range(spec.shadows.count)
            }
            if driver is not None:
                self.driver = driver
            event(log, events.CONTROLLER_RELOADED, changed_shadows=changed, source=spec.source)
        if self.driver is not None:
            self._converge(initial=False)
            return self.converge_reports[-1] if self.converge_reports else None
        return None

    # ---------------------------------------------------------------- switch

    def _converge(self, *, initial: bool) -> None:
        self._next_converge = time.monotonic() + self.opts.converge_every_s
        driver = self.driver
        if driver is None:
            return
        try:
            rep = driver.converge()
        except Exception as e:
            self.ev["converge_failed"] += 1
            event(log, events.CONTROLLER_CONVERGE_FAILED, level=logging.ERROR, error=str(e))
            if initial:
                raise
            return
        doc = {
            "writes": rep.writes,
            "pipeline_pushed": rep.pipeline_pushed,
            "inserted": rep.inserted,
            "modified": rep.modified,
            "deleted": rep.deleted,
            "initial": initial,
        }
        self.converge_reports.append(doc)
        del self.converge_reports[:-16]
        if initial or rep.writes:
            event(
                log,
                events.CONTROLLER_SWITCH_CONVERGED
                if initial
                else events.CONTROLLER_SWITCH_REPAIRED,
                level=logging.INFO if initial else logging.WARNING,
                **doc,
            )

    # ---------------------------------------------------------------- view

    def live_istar(self) -> int | None:
        """I* of the statuses last polled (None: none yet)."""
        try:
            point = restore_point(
                self.statuses,
                num_shards=self.spec.num_shards,
                replication=self.spec.shadows.replication,
            )
        except ShadowgradError:
            return None
        return None if point.fresh else point.istar

    def _member_json(self, k: int, m: _Member) -> dict[str, Any]:
        st = self.statuses.get(k)
        return {
            "state": m.state(),
            "reachable": m.reachable,
            "failed": m.failed,
            "rejoining": m.rejoining,
            "last_applied": None if st is None else st.last_applied,
            "diverged_at": None if st is None else st.diverged_at,
        }

    def status(self) -> dict[str, Any]:
        """What ``status`` answers, as its JSON header (also usable in-process)."""
        return self.status_reply().to_json()

    def status_reply(self) -> ControllerStatus:
        """The ``status`` reply."""
        with self._lock:
            return ControllerStatus(
                live_istar=self.live_istar(),
                time=time.time(),
                source="controller",
                job=self.spec.job.id,
                state=self.state.value,
                reason=self.reason,
                trainers=self.trainers_signal(),
                istar=self.istar,
                held=tuple(self.held),
                failure=self.failure,
                detections=len(self.detections),
                finished=self.finished if self.state == ControllerState.FINISHED else None,
                shadows={str(k): self._member_json(k, m) for k, m in self.members.items()},
                switch=None
                if self.driver is None
                else {"converge": self.converge_reports[-1] if self.converge_reports else None},
                counters=dict(self.ev),
            )

    # ---------------------------------------------------------------- control endpoint

    def _op_status(self, req: dict[str, Any], _f: list[memoryview]) -> Reply:
        ControllerStatusRequest.from_json(req)
        return self.status_reply().to_json(), []

    def _op_restore_point(self, req: dict[str, Any], _f: list[memoryview]) -> Reply:
        r = RestorePointRequest.from_json(req)
        point = self.restore_point(r.requester, failed=r.failed)
        return RestorePointReply(
            istar=point["istar"],
            source=tuple(point["source"]),
            usable=tuple(point["usable"]),
            fresh=point["fresh"],
            reachable=point["reachable"],
            layout=point["layout"],
            held=tuple(point["held"]),
            generation_seen=point["generation_seen"],
        ).to_json(), []

    def _op_finished(self, req: dict[str, Any], _f: list[memoryview]) -> Reply:
        # rank 0's close(): the end of training, not a failure
        r = FinishedRequest.from_json(req)
        with self._lock:
            # the generation that finished: the trainer's own word (a controller restarted
            # just before may not have polled the shadows yet, and a 0 read from no statuses
            # made its first poll look like "a new run"), else what the shadows serve
            seen = [s.generation for s in self.statuses.values() if s]
            finished = r.generation if r.generation is not None else max(seen, default=None)
            if self.state in ("trainers_failed", "restoring") and (
                finished is None
                or self._generation_at_failure is None
                or finished > self._generation_at_failure
            ):
                # a rerun so short that it ended before a poll saw it run: it recovered
                self._recovered(self.trainers_signal(), finished or 0)
            self._generation_at_failure = finished
            self.finished = {
                "iteration": r.iteration,
                "generation": self._generation_at_failure,
                "requester": r.requester,
            }
            event(log, events.CONTROLLER_JOB_FINISHED, **self.finished)
            self._transition(
                ControllerEvent.FINISHED, f"training ended after iteration {r.iteration}"
            )
        return FinishedReply().to_json(), []

    def _op_release(self, req: dict[str, Any], _f: list[memoryview]) -> Reply:
        ControllerReleaseRequest.from_json(req)
        with self._lock:
            held, self.held = self.held, []
            for k in held:
                self._release(k, (self.istar or {}).get("istar"))
        return ControllerReleaseReply(tuple(held)).to_json(), []
