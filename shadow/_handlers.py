"""The shadow node's control handlers (the ``control`` thread's side of :class:`ShadowNode`).

:class:`ControlHandlers` answers the ops of the control endpoint (``status``, ``hold``,
``release``, ``fetch``, ``load``, ``snapshot``, ``config``, ``finished``) for one node, which
serves them through the core's control server (:mod:`shadowgrad._control_server`). It holds no
state of its own: every handler works on the node's, under the node's ``_lock`` / ``_cond``
(and ``_state_lock`` for the replayer's tensors), exactly as when they were the node's
``_op_*`` methods.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from shadowgrad import events
from shadowgrad._control_server import TrackedFrames
from shadowgrad.bulk import STREAM_CHUNK_BYTES
from shadowgrad.layout import Layout
from shadowgrad.messages import (
    FetchReply,
    FetchRequest,
    FinishedReply,
    FinishedRequest,
    HoldReply,
    HoldRequest,
    LoadRequest,
    ReleaseReply,
    ReleaseRequest,
    ShadowConfig,
    SnapshotReply,
    SnapshotRequest,
    StatusRequest,
)
from shadowgrad.optspec import OptimizerSpec
from shadowgrad.shadow.control import (
    CHUNK_BYTES,
    ControlError,
    commit_from_json,
    commit_to_json,
    decode_states,
    encode_states,
)

if TYPE_CHECKING:
    from shadowgrad.shadow.node import ShadowNode

__all__ = ["ControlHandlers"]


class ControlHandlers:
    """The control ops of ``node``: each takes the request's JSON header and its frames and
    returns the reply's header and frames (or raises ``ControlError``)."""

    def __init__(self, node: ShadowNode) -> None:
        self.node = node

    def table(self) -> dict[str, Any]:
        """The handlers by op name (``ControlServer(handlers=...)``)."""
        return {
            "status": self.status,
            "hold": self.hold,
            "release": self.release,
            "fetch": self.fetch,
            "load": self.load,
            "snapshot": self.snapshot,
            "config": self.config,
            "finished": self.finished,
        }

    def finished(
        self, req: dict[str, Any], _f: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        """Rank 0's ``close()`` after the last iteration: training ended normally (the
        trainers' silence from now on is no failure). ``iteration``: the last iteration
        trained (or null); ``generation``: the job instance that ended (an older one than the
        generation served is refused, ``stale_generation``)."""
        n = self.node
        r = FinishedRequest.from_json(req)
        it, gen = r.iteration, r.generation
        if gen is None:
            raise ControlError("bad_request", "finished request['generation'] must be an integer")
        with n._lock:
            if gen < n._generation:
                raise ControlError(
                    "stale_generation",
                    f"finished of generation {gen}: this shadow serves generation "
                    f"{n._generation} of the job",
                )
            n._finished = {
                "iteration": it,
                "generation": gen,
                "requester": r.requester,
            }
            n._note(
                events.SHADOW_FINISHED,
                logging.INFO,
                count=False,
                iteration=it,
                generation=gen,
                last_applied=n._last_applied if n._ld is not None else None,
            )
            return FinishedReply(dict(n._finished)).to_json(), []

    def status(self, req: dict[str, Any], _f: list[memoryview]) -> tuple[dict[str, Any], list[Any]]:
        n = self.node
        r = StatusRequest.from_json(req)
        return n.status_reply(r.timeline, brief=bool(r.brief)).to_json(), []

    def hold(self, req: dict[str, Any], _f: list[memoryview]) -> tuple[dict[str, Any], list[Any]]:
        n = self.node
        it = HoldRequest.from_json(req).iteration
        deadline = time.monotonic() + n.spec.timeouts.rpc_s
        with n._cond:
            if n._ld is None:
                raise ControlError("not_loaded", "shadow not loaded")
            if it != n._last_applied and it not in n._snaps:
                raise ControlError(
                    "unavailable",
                    f"iteration {it} not held here (available "
                    f"{sorted({*n._snaps, n._last_applied})})",
                )
            n._cut.hold(it)
            # a step of it+1 may have been chosen before the hold (and not retained it): wait
            # for it to finish (every write of _applying back to None notifies the condition)
            while n._applying == it + 1:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ControlError(
                        "unavailable", f"hold({it}) raced with a step that did not finish"
                    )
                n._cond.wait(remaining)
            if it != n._last_applied and it not in n._snaps:
                n._cut.release(it)
                raise ControlError(
                    "unavailable", f"iteration {it} was replaced while the hold was being placed"
                )
            return HoldReply(it, tuple(sorted(n._cut.holds))).to_json(), []

    def release(
        self, req: dict[str, Any], _f: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        n = self.node
        it = ReleaseRequest.from_json(req).iteration
        with n._lock:
            n._cut.release(it)
            n._gc_snaps()
            return ReleaseReply(tuple(sorted(n._cut.holds))).to_json(), []

    def fetch(self, req: dict[str, Any], _f: list[memoryview]) -> tuple[dict[str, Any], list[Any]]:
        n = self.node
        r = FetchRequest.from_json(req)
        ld = n._ld
        if ld is None:
            raise ControlError("not_loaded", "shadow not loaded")
        want = r.iteration
        nbox = ld.geom.entries  # parameter boxes, then module-state boxes
        boxes = list(range(nbox)) if r.boxes is None else list(r.boxes)
        for b in boxes:
            if not 0 <= b < nbox:
                raise ControlError("bad_request", f"box {b} not in 0..{nbox - 1}")
        with n._state_lock:
            with n._lock:
                it = n._last_applied if want is None else want
                snap = n._lend_snap(it)
                current = it == n._last_applied
                if n._diverged_at is not None and n._diverged_at <= it:
                    raise ControlError("unavailable", f"diverged at {n._diverged_at}")
                commit = n._commits.get(it)
            serve = None
            if snap is not None:  # a copy of its own, never written: sent as it is
                states = [(b, snap[b]) for b in boxes]
            elif current:
                # the live tensors themselves, no copy: the next step waits until the reply
                # has left (ShadowNode._quiesce_serves), so what is sent is iteration ``it``
                live = ld.replayer.export(copy=False)
                states = [(b, live[b]) for b in boxes]
                serve = n._serve_live()
            else:
                raise ControlError("unavailable", f"iteration {it} not available here")
        # the bulk channel when asked for (shadowgrad.bulk): the manifest here, the bytes on a
        # connection of their own; the live-serve bookkeeping ends when that send ends
        bulk = n._bulk() if r.stream else None
        try:
            ids = {
                k: (box.name, box.offsets)
                for k, box in enumerate(ld.geom.boxes + ld.geom.state_boxes)
            }
            chunk = STREAM_CHUNK_BYTES if bulk is not None else CHUNK_BYTES
            entries, frames = encode_states(states, ids, chunk_bytes=chunk)
            stream: dict[str, Any] | None = None
            if bulk is not None:
                nbytes = sum(f.nbytes for f in frames)
                ticket = bulk.offer(
                    frames,
                    (lambda _ok: serve.sent(None)) if serve is not None else (lambda _ok: None),
                    send_timeout_s=n.spec.timeouts.connect_s + nbytes / (20 * 2**20),
                )
                if ticket is not None:
                    stream = {"port": bulk.port, "ticket": ticket, "chunk": chunk}
                    frames = []
            reply = FetchReply(it, ld.shard, tuple(entries), commit, n._generation, stream=stream)
            head = reply.to_json()
        except BaseException:
            if serve is not None:
                serve.sent(None)
            raise
        if stream is not None or serve is None:
            return head, frames
        return head, TrackedFrames(frames, serve.sent)

    def config(self, req: dict[str, Any], _f: list[memoryview]) -> tuple[dict[str, Any], list[Any]]:
        """What a restarted replica needs to clone this shard: layout, optimizer, generation."""
        n = self.node
        with n._lock:
            ld = n._ld
            if ld is None:
                raise ControlError("not_loaded", "shadow not loaded")
            return ShadowConfig(
                shard=ld.shard,
                replica=ld.replica,
                layout=ld.layout.to_json(),
                optimizer=ld.optimizer_json,
                generation=n._generation,
                last_applied=n._last_applied,
                diverged_at=n._diverged_at,
            ).to_json(), []

    def load(
        self, req: dict[str, Any], frames: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        # from the request's receipt (its header parsed, its token checked: part of the
        # shadow's time, not of the transfer)
        n = self.node
        t0 = n._control.request_at or time.perf_counter()
        r = LoadRequest.from_json(req)
        layout_json = r.layout
        ld = n._ld
        known = [x for x in (None if ld is None else ld.layout, n._layout_hint) if x is not None]
        if layout_json is not None:
            # the layout this shadow holds already (a re-seed, a restore): no parse (canonical
            # JSON, so the same text is the same layout)
            same = next((x for x in known if x.to_json() == layout_json), None)
            layout = same if same is not None else Layout.from_json(layout_json)
        elif n._ld is not None:
            layout = n._ld.layout
        elif n._layout_hint is not None:
            layout = n._layout_hint
        else:
            raise ControlError("bad_request", "load without a layout, and none was given")
        iteration = r.iteration
        commit: dict[str, Any] | None = None
        if r.commit is not None:
            c_it, c_rec = commit_from_json(dict(r.commit))  # validated, kept normalised
            if c_it != iteration:
                raise ControlError(
                    "bad_request",
                    f"load of iteration {iteration} with the COMMIT of iteration {c_it}",
                )
            commit = commit_to_json(c_it, c_rec)
        opt_json = r.optimizer
        opt = OptimizerSpec.from_json(opt_json)
        # keep: no state in the request; install this shadow's own state of ``iteration`` (the
        # restore point it served: live, or a held snapshot) as the new session's start
        # views of the request's frames where a tensor came in one (ShardReplayer.load copies)
        states = None if r.keep else decode_states([dict(e) for e in r.entries], frames, copy=False)
        reply = n._applier.load_state(
            layout,
            iteration,
            states,
            opt_json,
            opt,
            commit=commit,
            generation=r.generation or 0,
            reseed=bool(r.reseed),
            source="load" if r.source is None else r.source,
        )
        # the sender splits its round trip into the transfer and this (trainer.reseed)
        install_ms = round(1000 * (time.perf_counter() - t0), 3)
        received = n._control.received_at
        return replace(reply, install_ms=install_ms, received_at=received).to_json(), []

    def snapshot(
        self, req: dict[str, Any], _f: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        n = self.node
        if n.spec.shadows.snapshot_dir is None:
            raise ControlError("bad_request", "shadows.snapshot_dir is not configured")
        info = n._applier.maybe_snapshot(force=SnapshotRequest.from_json(req).wait)
        if info is None:
            raise ControlError("unavailable", "no consistent iteration available to snapshot")
        if "error" in info:
            raise ControlError("internal", str(info["error"]))
        info = dict(info)  # the writer may still be filling it in (wait=false)
        return SnapshotReply(info["iteration"], info.get("path"), info.get("seconds")).to_json(), []
