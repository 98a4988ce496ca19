"""The shadow node's applier: the ``apply`` thread's side of :class:`ShadowNode`.

:class:`Applier` steps the :class:`~shadowgrad.shadow.replay.ShardReplayer` for iteration
``last_applied + 1`` once the two-phase rule allows it (docs/shadow.md, "Consistent apply"),
keeps the state of the consistent cut I* when this shard applies ahead of it, clones its shard
from a replica when it has none (a restarted shadow), resynchronises from a replica when
diverged, installs a whole shard state (``load``, clone, resync) and starts background disk
snapshots (one writer thread at a time).

It runs on the ``apply`` thread, except :meth:`Applier.load_state` and a forced
:meth:`Applier.maybe_snapshot`, which the control thread calls too (the ``load`` and
``snapshot`` ops). State: the node's protocol state (the session ``_ld``, ``_iters``, the cut
tracker, ``_snaps``, ``_commits``, ``_timeline``, ``_applying``, ``_gen``, the lifecycle) is
read and written under the node's ``_lock`` (``_cond`` wakes this thread); the replayer's
tensors are stepped, exported and replaced under the node's ``_state_lock`` (taken before
``_lock`` when both are held). Its own: the clone/resync retry times (this thread only) and the
snapshot writer (``_snap_lock``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import zmq

from shadowgrad import events, wire
from shadowgrad._log import event
from shadowgrad.errors import ShadowgradError
from shadowgrad.layout import Layout
from shadowgrad.messages import LoadReply, ShadowConfig, ShadowStatus
from shadowgrad.optspec import OptimizerSpec
from shadowgrad.shadow._receiver import _Iter
from shadowgrad.shadow._state import NodeState, StateError, Trigger
from shadowgrad.shadow.assembly import IterBuffer, ShardGeometry
from shadowgrad.shadow.control import (
    ControlError,
    FetchResult,
    ShadowClient,
    commit_from_json,
    commit_to_json,
)
from shadowgrad.shadow.replay import ReplayError, ShardReplayer
from shadowgrad.shadow.snapshot import write_snapshot

if TYPE_CHECKING:
    from shadowgrad.shadow.node import ShadowNode

__all__ = ["Applier"]

#: the node's logger: its events and messages come from one place whichever thread logs them
log = logging.getLogger("shadowgrad.shadow.node")

#: what a control call to a replica (clone, resync) may fail with: skip that replica
_PEER_ERRORS = (ShadowgradError, zmq.ZMQError, KeyError, ValueError)

_T = TypeVar("_T")


@dataclass
class _Loaded:
    """Everything that exists only after ``load``."""

    layout: Layout
    shard: int
    replica: int
    geom: ShardGeometry
    replayer: ShardReplayer
    optimizer_json: str
    pool: list[IterBuffer] = field(default_factory=list)
    #: iterations with a buffer at once (NodeOptions.window / window_bytes)
    window: int = 4
    #: buffers allocated so far (lazily, up to ``window``)
    allocated: int = 0


class Applier:
    """The apply side of ``node``: its thread's loop (:meth:`loop`), the two-phase rule's
    check (:meth:`can_apply`), installing a shard state (:meth:`load_state`) and snapshots
    (:meth:`maybe_snapshot`)."""

    def __init__(self, node: ShadowNode) -> None:
        self.node = node
        self._next_clone = 0.0
        self._next_resync = 0.0
        #: the snapshot writer: one at a time; its fields under ``_snap_lock``
        self._snap_lock = threading.Lock()
        self.snap_thread: threading.Thread | None = None
        self._snap_next = node.spec.shadows.snapshot_every
        #: the last snapshot written ({iteration, path, seconds} or {iteration, error})
        self.last_snapshot: dict[str, Any] | None = None

    def loop(self) -> None:
        n = self.node
        while not n._stop.is_set():
            with n._cond:
                job = self._next_job()
                if job is None:
                    n._cond.wait(n.opts.tick_s * 5)
                    job = self._next_job()
            if job is None:
                self._maybe_resync()
                self.maybe_snapshot()
                continue
            self._apply(*job)
            self.maybe_snapshot()

    def _next_job(self) -> tuple[int, _Iter, bool, int] | None:
        n = self.node
        if n._ld is None:
            return None
        i = n._last_applied + 1
        if not self.can_apply(i):
            return None
        rec = n._iters[i]
        # with one shard, I* is this shard's own progress: nothing to keep
        retain = n._cut.retain_before(i) and (i - 1) not in n._snaps
        n._applying = i
        return i, rec, retain, n._gen

    def can_apply(self, i: int) -> bool:
        """Two-phase rule (:meth:`CutTracker.can_apply`), for an iteration buffered here."""
        n = self.node
        rec = n._iters.get(i)
        if rec is None or not rec.ready():
            return False
        return n._cut.can_apply(i)

    def _apply(self, i: int, rec: _Iter, retain: bool, gen: int) -> None:
        n = self.node
        ld = n._ld
        assert ld is not None and rec.buf is not None and rec.commit is not None
        with n._state_lock:
            with n._lock:
                if gen != n._gen:  # a load replaced the state since this step was chosen
                    return
            n._quiesce_serves()  # the step writes the tensors a fetch may still be sending
            if retain:
                with n._lock:
                    spare, n._snap_spare = n._snap_spare, None
                snap = ld.replayer.export(into=spare)  # copies
                with n._lock:
                    n._snaps[i - 1] = snap
                    n.ev["cut_copies"] += 1
            try:
                ld.replayer.step(i, rec.buf.views(), rec.commit, rec.buf.buffer_views())
            except ReplayError as e:
                failed: ReplayError | None = e
            else:
                failed = None
        if failed is not None:
            with n._lock:
                n._applying = None
                n._cond.notify_all()  # a hold waiting for this step (ControlHandlers.hold)
                if gen != n._gen:
                    return
                n._note(events.SHADOW_REPLAY_FAILED, logging.ERROR, iteration=i, error=str(failed))
                n._diverge(i, rec.buf.cov.total)
            return
        with n._lock:
            if gen != n._gen:
                return
            n._cut.applied(i)
            n._applying = None
            n._commits[i] = commit_to_json(i, rec.commit)
            n._iters.pop(i, None)
            ld.pool.append(rec.buf)
            rec.buf = None
            n._timeline[i] = {
                "first_chunk": rec.t_first,
                "last_chunk": rec.t_last,
                "commit": rec.t_commit,
                "ready": rec.t_ready,
                "applied": time.time(),
            }
            while len(n._timeline) > n.opts.timeline_len:
                n._timeline.popitem(last=False)
            n.ev["applied"] += 1
            n._update_istar()
            n._gc_snaps()
            n._receiver.send_ready(retx=False)
            n._cond.notify_all()

    def _maybe_clone(self) -> None:
        """A shadow without state (restarted) clones its shard from a healthy replica. With
        replication 1 there is none: the trainers see it unloaded and seed it (docs/shadow.md)."""
        n = self.node
        now = time.monotonic()
        sh = n.spec.shadows
        if sh.replication < 2 or now < self._next_clone:
            return
        self._next_clone = now + max(0.5, n.opts.resync_interval_s)
        # the replicas follow from the counts alone (Layout.shadows_of_shard): shadow k holds
        # shard k % num_shards, so no layout is needed to know whom to ask
        shards = sh.count // sh.replication
        replicas = [n.id % shards + r * shards for r in range(sh.replication)]
        for sid in replicas:
            if sid == n.id or n._state is not NodeState.UNLOADED or n._stop.is_set():
                continue
            got = self._fetch_newest(
                sid, self._clone_source, Trigger.CLONE, Trigger.CLONE_FAILED, self._clone_failed
            )
            if got is None:
                continue
            (cfg, layout), res = got
            try:
                self.load_state(
                    layout,
                    res.iteration,
                    res.states,
                    cfg.optimizer,
                    OptimizerSpec.from_json(cfg.optimizer),
                    commit=res.commit,
                    generation=cfg.generation,
                    reseed=False,
                    source=f"shadow {sid}",
                )
            except StateError:
                raise
            except (ShadowgradError, ReplayError) as e:
                with n._lock:
                    n._move(Trigger.CLONE_FAILED)
                n._note(events.SHADOW_CLONE_FAILED, logging.WARNING, replica=sid, error=str(e))
                continue
            n.ev["cloned"] += 1
            return

    def _maybe_resync(self) -> None:
        n = self.node
        if n._state is NodeState.UNLOADED:
            self._maybe_clone()
            return
        with n._lock:
            # (RESYNCING and CLONING are this thread's own, and over when it gets here)
            if n._state is not NodeState.DIVERGED:
                return
            assert n._ld is not None and n._diverged_at is not None
            now = time.monotonic()
            if now < self._next_resync:
                return
            self._next_resync = now + n.opts.resync_interval_s
            d: int = n._diverged_at
            replicas = [s for s in n._ld.layout.shadows_of_shard(n._ld.shard) if s != n.id]
            # prefer replicas known to be past the hole
            peers = n._cut.peers
            replicas.sort(key=lambda s: -(peers[s].last_applied if s in peers else -9))

        def past_hole(client: ShadowClient) -> ShadowStatus | None:
            st = client.status(timeline=0)
            if st.diverged_at is not None or st.last_applied is None or st.last_applied < d:
                return None
            return st

        for sid in replicas:
            got = self._fetch_newest(
                sid, past_hole, Trigger.RESYNC, Trigger.RESYNC_FAILED, self._resync_failed
            )
            if got is None:
                continue
            _, res = got
            self._install(res.iteration, res.states, source=f"shadow {sid}", commit=res.commit)
            return

    def _clone_source(self, client: ShadowClient) -> tuple[ShadowConfig, Layout] | None:
        """A replica to clone from: its config and layout (None: it is diverged itself)."""
        cfg = client.config()
        if cfg.diverged_at is not None:
            return None
        return cfg, Layout.from_json(cfg.layout)

    def _clone_failed(self, sid: int, e: Exception) -> None:
        n = self.node
        if not isinstance(e, ControlError) or e.code != "not_loaded":
            n.ev["clone_failed"] += 1
            log.debug("shadow %d: clone from shadow %d failed: %s", n.id, sid, e)

    def _resync_failed(self, sid: int, e: Exception) -> None:
        self.node._note(events.SHADOW_RESYNC_FAILED, logging.WARNING, replica=sid, error=str(e))

    def _fetch_newest(
        self,
        sid: int,
        probe: Callable[[ShadowClient], _T | None],
        start: Trigger,
        failed: Trigger,
        on_error: Callable[[int, Exception], None],
    ) -> tuple[_T, FetchResult] | None:
        """Fetch the newest state of replica ``sid`` (clone, resync): ``probe`` asks it first
        whether it qualifies (None: skip it), then the lifecycle moves by ``start`` and the
        whole shard is fetched. A replica that cannot answer (``_PEER_ERRORS``) is skipped
        (None): the lifecycle moves by ``failed`` when the fetch had started, then
        ``on_error``."""
        n = self.node
        fetching = False
        try:
            with self._peer_client(sid) as client:
                info = probe(client)
                if info is None:
                    return None
                with n._lock:
                    n._move(start)
                fetching = True
                return info, self._peer_fetch(client)
        except StateError:
            raise
        except _PEER_ERRORS as e:
            if fetching:
                with n._lock:
                    n._move(failed)
            on_error(sid, e)
            return None

    def _peer_control(self, sid: int) -> str:
        n = self.node
        ep = n._peer_controls.get(sid)
        return ep if ep is not None else f"tcp://{n.spec.shadows.control_endpoint(sid)}"

    def _peer_client(self, sid: int) -> ShadowClient:
        n = self.node
        return ShadowClient(self._peer_control(sid), n._token, timeout_s=n.spec.timeouts.rpc_s)

    def _peer_fetch(self, client: ShadowClient) -> FetchResult:
        """The newest state a replica holds (clone, resync): a whole shard, a longer deadline."""
        n = self.node
        return client.fetch(None, timeout_s=max(n.spec.timeouts.rpc_s, 30.0))

    def _install(
        self,
        iteration: int,
        states: Mapping[int, Mapping[str, torch.Tensor]],
        source: str,
        commit: dict[str, Any] | None = None,
    ) -> None:
        """Resync: load a replica's state of ``iteration`` and continue with buffered data."""
        n = self.node
        ld = n._ld
        assert ld is not None
        try:
            boxes = [dict(states[k]) for k in range(ld.geom.entries)]
            with n._state_lock:
                n._quiesce_serves()
                ld.replayer.load(iteration, boxes)
        except (KeyError, ReplayError) as e:
            with n._lock:
                n._move(Trigger.RESYNC_FAILED)
            n._note(events.SHADOW_RESYNC_FAILED, logging.WARNING, source=source, error=str(e))
            return
        with n._lock:
            n._gen += 1
            old = n._last_applied
            n._cut.resynced(iteration)
            n._move(Trigger.RESYNCED)
            for it in [k for k in n._iters if k <= iteration]:
                rec = n._iters.pop(it)
                if rec.buf is not None:
                    ld.pool.append(rec.buf)
            n._drop_snaps()
            n._commits.clear()
            if commit is not None:
                try:
                    c_it, c_rec = commit_from_json(commit)
                    if c_it == iteration:
                        n._commits[iteration] = commit_to_json(c_it, c_rec)
                except ControlError as e:
                    log.warning("shadow %d: resync from %s: bad COMMIT: %s", n.id, source, e)
            n._note(
                events.SHADOW_RESYNC,
                logging.WARNING,
                counter="resynced",
                shard=ld.shard,
                source=source,
                iteration=iteration,
                previous=old,
            )
            n._update_istar()
            n._receiver.send_ready(retx=False)
            n._cond.notify_all()

    def maybe_snapshot(self, force: bool = False) -> dict[str, Any] | None:
        n = self.node
        every = n.spec.shadows.snapshot_every
        root = n.spec.shadows.snapshot_dir
        if root is None or (every <= 0 and not force):
            return None
        with self._snap_lock:
            return self._snapshot_locked(force, every, root)

    def _snapshot_locked(self, force: bool, every: int, root: Path) -> dict[str, Any] | None:
        n = self.node
        if self.snap_thread is not None and self.snap_thread.is_alive():
            if force:
                self.snap_thread.join(60.0)
            else:
                return None
        with n._lock:
            ld = n._ld
            it = n._cut.istar
            if ld is None or it < 0 or (not force and it < self._snap_next):
                return None
            states = n._lend_snap(it)
            current = it == n._last_applied
        if states is None and not current:
            return None
        if states is None:
            with n._state_lock:
                with n._lock:
                    if n._last_applied != it:
                        return None
                states = ld.replayer.export()  # clones
        self._snap_next = (it // every + 1) * every if every > 0 else self._snap_next
        info: dict[str, Any] = {"iteration": it}
        kw: dict[str, Any] = {
            "shadow_id": n.id,
            "shard": ld.shard,
            "replica": ld.replica,
            "iteration": it,
            "layout_digest": ld.layout.digest,
            "optimizer_json": ld.optimizer_json,
            "states": states,
        }

        def write() -> None:
            t0 = time.monotonic()
            try:
                path = write_snapshot(Path(root), **kw)
            except ShadowgradError as e:
                info["error"] = str(e)
                n._note(events.SHADOW_SNAPSHOT_FAILED, logging.ERROR, iteration=it, error=str(e))
                return
            info["path"] = str(path)
            info["seconds"] = time.monotonic() - t0
            n.ev["snapshots"] += 1
            self.last_snapshot = info
            event(log, events.SHADOW_SNAPSHOT, shadow=n.id, iteration=it, path=str(path))

        self.snap_thread = threading.Thread(target=write, name=f"shadow{n.id}-snap", daemon=True)
        self.snap_thread.start()
        if force:
            self.snap_thread.join(120.0)
        return info

    def _own_replayer(
        self, layout: Layout, iteration: int, opt_json: str, opt: Any
    ) -> ShardReplayer:
        """A ``keep`` load: this shadow's own state of ``iteration`` as a replayer (the live one
        when it stands at ``iteration`` with the same optimizer, else a new one loaded from the
        live state or the held snapshot of ``iteration``). ``unavailable`` when this shadow
        does not have it. The caller holds ``_state_lock`` (no step meanwhile)."""
        n = self.node
        ld = n._ld
        with n._lock:
            last, snap, div = n._last_applied, n._lend_snap(iteration), n._diverged_at
        if ld is None or ld.layout != layout:
            raise ControlError("unavailable", "keep: this shadow holds no state of this layout")
        if div is not None and div <= iteration:
            raise ControlError("unavailable", f"keep: diverged at {div}")
        if iteration == last:
            if ld.optimizer_json == opt_json:
                return ld.replayer
            states = ld.replayer.export(copy=False)
        elif snap is not None:
            states = [snap[b] for b in range(ld.geom.entries)]
        else:
            raise ControlError(
                "unavailable", f"keep: iteration {iteration} not held here (at {last})"
            )
        replayer = ShardReplayer(layout, ld.shard, opt)
        replayer.load(iteration, [dict(st) for st in states])
        return replayer

    def load_state(
        self,
        layout: Layout,
        iteration: int,
        states: Mapping[int, Mapping[str, torch.Tensor]] | None,
        opt_json: str,
        opt: Any,
        *,
        commit: dict[str, Any] | None,
        generation: int,
        reseed: bool,
        source: str,
    ) -> LoadReply:
        """Install a whole shard state as ``iteration`` (``load``, and the clone of a restarted
        replica); ``states=None``: this shadow's own state of ``iteration`` (a ``keep`` load,
        :meth:`_own_replayer`). ``reseed``: the job goes on (self-healing), so data already
        buffered for later iterations of the same generation is kept; otherwise everything in
        flight is dropped."""
        n = self.node
        n._check_layout(layout)
        shard, replica = layout.shard_of_shadow(n.id)
        geom = ShardGeometry(layout, shard)
        replayer: ShardReplayer | None = None
        if states is not None:
            if sorted(states) != list(range(geom.entries)):
                raise ControlError(
                    "bad_request",
                    f"load has boxes {sorted(states)}, shard {shard} has {geom.entries}",
                )
            replayer = ShardReplayer(layout, shard, opt)
            replayer.load(iteration, [dict(states[k]) for k in range(geom.entries)])
        window = n.opts.window
        if window is None:
            per = max(1, geom.local_nbytes)
            window = max(4, min(n.opts.max_window, n.opts.window_bytes // per))
        with n._state_lock:
            if replayer is None:
                replayer = self._own_replayer(layout, iteration, opt_json, opt)
            with n._lock:
                return self._start_session(
                    layout,
                    replayer,
                    shard=shard,
                    replica=replica,
                    geom=geom,
                    iteration=iteration,
                    opt_json=opt_json,
                    window=window,
                    commit=commit,
                    generation=generation,
                    reseed=reseed,
                    source=source,
                    kept=states is None,
                )

    def _start_session(
        self,
        layout: Layout,
        replayer: ShardReplayer,
        *,
        shard: int,
        replica: int,
        geom: ShardGeometry,
        iteration: int,
        opt_json: str,
        window: int,
        commit: dict[str, Any] | None,
        generation: int,
        reseed: bool,
        source: str,
        kept: bool,
    ) -> LoadReply:
        """The session bookkeeping of a load (both locks held)."""
        n = self.node
        if generation < n._generation:
            n.ev["load_stale_generation"] += 1
            raise ControlError(
                "stale_generation",
                f"load of generation {generation}: this "
                f"shadow serves generation {n._generation} of the job (a "
                "newer instance started; this one is fenced out)",
            )
        old = n._ld
        same = old is not None and old.layout == layout and old.shard == shard
        keep = reseed and same and generation == n._generation
        if keep and n._diverged_at is None and n._last_applied > iteration:
            # a re-seed captured before this shadow got further on its own (it cloned its
            # replica or caught up while the state travelled): installing it would take the
            # shard back, and at the end of training nothing would bring the last iteration
            # again (seen: a shadow seeded with 1 at 2 waited for 2 forever)
            n._note(
                events.SHADOW_SEED_BEHIND,
                logging.INFO,
                iteration=iteration,
                last_applied=n._last_applied,
                source=source,
            )
            return LoadReply(shard, replica, n._last_applied, generation, behind=True)
        if same and old is not None:
            pool, allocated, geom = old.pool, old.allocated, old.geom
            for it, rec in list(n._iters.items()):
                if keep and it > iteration:
                    continue
                del n._iters[it]
                if rec.buf is not None:
                    pool.append(rec.buf)
        else:
            pool, allocated = [], 0
            n._iters.clear()
        n._ld = _Loaded(
            layout,
            shard,
            replica,
            geom,
            replayer,
            opt_json,
            pool,
            window=window,
            allocated=allocated,
        )
        n._gen += 1
        n._generation = generation
        n._digest = wire.session_digest(layout.digest64, generation)
        # own progress at iteration, I* unknown; the peers' records and holds stay with keep
        n._cut.load(
            iteration,
            shard=shard,
            members=[layout.shadows_of_shard(s) for s in range(layout.num_shards)],
            keep=keep,
        )
        n._move(Trigger.LOAD)
        n._applying = None
        n._trainer_rx_at = time.monotonic()  # a LOAD comes from the trainers
        n._drop_snaps()
        n._commits = {iteration: commit} if commit is not None else {}
        if not keep:
            # the senders of the old job (e.g. ranks 2, 3 before a 4 -> 2 restore) are gone
            n._bucket_senders.clear()
            n._rank_newest.clear()
            n._rank_rx_at.clear()
            n._newest_seen = iteration
        else:
            n._newest_seen = max(n._newest_seen, iteration)
        self._snap_next = n.spec.shadows.snapshot_every
        n.ev["loads"] += 1
        if kept:
            n.ev["loads_kept"] += 1  # installed its own state: nothing travelled
        n._note(
            events.SHADOW_SEEDED if reseed else events.SHADOW_LOAD,
            logging.WARNING if reseed else logging.INFO,
            count=reseed,
            shard=shard,
            replica=replica,
            iteration=iteration,
            source=source,
            generation=generation,
            layout=layout.digest[:16],
            boxes=geom.entries,
            kept_ahead=len(n._iters),
            own_state=kept,
        )
        n._update_istar()
        n._receiver.send_ready(retx=False)
        if reseed and commit is None and iteration >= 0:
            # seeded by a rank other than 0: ask rank 0 for COMMIT(iteration), so a restore
            # at I* = iteration still has the scheduler, scaler and user state
            n._receiver.send_nack(iteration, [], commit_missing=True)
        n._cond.notify_all()
        return LoadReply(shard, replica, iteration, generation)
