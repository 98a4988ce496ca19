"""``attach``: the object a training script holds (see docs/trainer.md)."""

from __future__ import annotations

import base64
import logging
import os
import socket
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import torch
import zmq

from shadowgrad import events
from shadowgrad._log import event
from shadowgrad.blob import pack_blob, unpack_blob
from shadowgrad.boxes import FullStateSink, box_states_from_full
from shadowgrad.config import JobSpec, load_spec
from shadowgrad.control_client import ControllerClient, ShadowClient
from shadowgrad.errors import ConfigError, ControlError, LayoutError, ShadowgradError
from shadowgrad.frames import MAX_FRAMED_DATAGRAM
from shadowgrad.layout import Layout, from_module, state_from_module
from shadowgrad.messages import ShadowStatus
from shadowgrad.optspec import OptimizerSpec, load_state_by_name, state_by_name
from shadowgrad.restore import fix_restore_point
from shadowgrad.tensorstream import commit_to_json
from shadowgrad.wire import (
    DEFAULT_CHUNK_BYTES,
    HEADER_SIZE,
    MAC_SIZE,
    MAX_DATAGRAM,
    chunk_for,
    peek_header,
    session_digest,
)

from ._dist import Group
from ._health import HealthMonitor, health_interval, reseed_event
from ._mirror import CommitInfo, MirrorSender
from ._plan import RankPlan, param_map
from .hooks import LayoutReducer, layout_hook
from .ring import RingAllReduce

__all__ = ["Start", "StepInfo", "Shadowgrad", "attach"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: the UDP payload of a datagram in one 1500-byte-MTU IPv4 packet (no fragmentation: the
#: switch's parser, and the tap, see only first fragments)
NETWORK_DATAGRAM = 1500 - 20 - 8
assert chunk_for(NETWORK_DATAGRAM, mac=False) == DEFAULT_CHUNK_BYTES
#: Linux's ``IP_MTU`` (``getsockopt`` on a connected socket: the path MTU the kernel uses)
_IP_MTU = getattr(socket, "IP_MTU", 14)


def path_mtu(host: str, port: int) -> int | None:
    """The MTU of the path to ``(host, port)`` as this host's kernel sees it (None where it
    cannot say: not Linux, no route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return int(s.getsockopt(socket.IPPROTO_IP, _IP_MTU))
    except OSError:
        return None


def check_unfragmented(
    chunk_bytes: int, mac: bool, dests: list[tuple[str, int]], *, key: str = "chunk_bytes"
) -> None:
    """Raise :class:`ConfigError` when a DATA datagram of ``chunk_bytes`` (MAC'd with ``mac``)
    would be IP-fragmented on the way to any of ``dests``: a switch parses only a first
    fragment, so it never copies such a FINAL chunk to the shadows, which then repair every one
    of them by NACK (seen: 9,008-byte datagrams on 9,000-MTU veths, two thirds of each
    iteration repaired, and a kill of the rank that had to answer lost an extra iteration)."""
    need = 20 + 8 + HEADER_SIZE + (MAC_SIZE if mac else 0) + chunk_bytes
    for host, port in dests:
        mtu = path_mtu(host, port)
        if mtu is not None and need > mtu:
            fits = chunk_for(mtu - 28, mac=mac)
            raise ConfigError(
                key,
                chunk_bytes,
                f"its datagrams ({need} bytes with IPv4, UDP, the header"
                f"{' and the MAC' if mac else ''}) exceed the MTU {mtu} of the path to {host}: "
                "they would be fragmented, and the switch copies only first fragments to the "
                f"shadows (the largest that fits: {fits})",
            )


#: default memory for staging + retransmit slots, per rank (allocated as needed)
DEFAULT_BUFFER_BYTES = 256 * 2**20
#: most staging + retransmit slots (iterations) a rank keeps
MAX_SLOTS = 1024
#: a restore fetches each shard in pieces of about this many parameter bytes (with the
#: optimizer state: ~3x), at most FETCH_IN_FLIGHT requests at once
FETCH_PIECE_BYTES = 8 * 2**20
FETCH_IN_FLIGHT = 6
#: ZeroMQ I/O threads of a restore (their kernel copies run in parallel on as many cores)
FETCH_IO_THREADS = 2
#: ask the shadows for the bulk channel (shadowgrad.bulk): each piece received straight into
#: the parameters and optimizer state, no zmq message in between
FETCH_STREAM = True


class _FetchFailedError(ShadowgradError):
    """A rank could not fetch the restore point it was given (every rank raises it)."""


class Start(NamedTuple):
    """Where training begins: the ``iteration`` to run next, the user state saved with the
    iteration before it (``None`` on a fresh start), and whether state came from the shadows."""

    iteration: int
    user_state: Any
    restored: bool


@dataclass(frozen=True)
class StepInfo:
    """What :meth:`Shadowgrad.step` did for ``iteration``."""

    iteration: int
    skipped: bool
    lrs: tuple[float, ...]
    grad_norm: torch.Tensor | None
    sent: bool


def _is_loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("::1", "localhost")


class Shadowgrad:
    """Per-iteration checkpointing of one DDP rank into the shadows (create with :func:`attach`).

    The object owns the end of every iteration: :meth:`step` captures the reduced gradients for
    the shadows, unscales (GradScaler), clips (``max_grad_norm``), steps the optimizer through
    the scaler, updates the scaler, steps the LR scheduler, zeroes the gradients and emits the
    COMMIT record. Nothing in it waits for a shadow.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        spec: JobSpec | str | os.PathLike[str],
        *,
        lr_scheduler: Any = None,
        grad_scaler: Any = None,
        max_grad_norm: float | None = None,
        norm_type: float = 2.0,
        process_group: Any = None,
        token: str | None = None,
        chunk_bytes: int | None = None,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        layout: Layout | None = None,
        layout_reduce: bool = True,
        software_tap: bool = False,
        background_sender: bool = True,
    ) -> None:
        self.spec = spec if isinstance(spec, JobSpec) else load_spec(Path(spec))
        ddp = model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else None
        self.ddp = ddp
        self.module: torch.nn.Module = ddp.module if ddp is not None else model
        self.optimizer = optimizer
        self.scheduler = lr_scheduler
        self.scaler = grad_scaler if grad_scaler is not None and grad_scaler.is_enabled() else None
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.norm_type = float(norm_type)
        pg = (
            process_group
            if process_group is not None
            else (getattr(ddp, "process_group", None) if ddp is not None else None)
        )
        self.group = Group(pg)
        if self.group.world != self.spec.trainers.world_size:
            raise ConfigError(
                "trainers.world_size",
                self.spec.trainers.world_size,
                f"the process group has {self.group.world} ranks",
            )
        self._token = token if token is not None else self.spec.token()
        #: the key of the job's records (never the token itself on the wire)
        self._key = self.spec.mac_key(self._token)
        if layout is None:
            cap_mb: float | None = None
            if ddp is not None and not getattr(ddp, "bucket_bytes_cap_default", True):
                cap_mb = ddp.bucket_bytes_cap / 2**20
            params, buckets = from_module(self.module, cap_mb)
            layout = Layout.build(
                params, buckets, self.spec.shadows.count, self.spec.shadows.replication
            )
        #: the module state that is not a trained parameter (buffers, frozen parameters): part
        #: of the layout's shard state, buffers streamed by rank 0 every iteration
        self._module_state, state = state_from_module(self.module, {p.name for p in layout.params})
        if layout.state != state:
            if layout.state:
                raise LayoutError(
                    "the given layout's module state (buffers, frozen parameters) is not this"
                    " model's"
                )
            layout = layout.with_state(state)
        self.layout = layout
        self.params = param_map(self.module, layout)
        self._named = dict(self.module.named_parameters())
        self.optspec = OptimizerSpec.from_optimizer(
            optimizer, self._named, scaler_unscale="explicit"
        )
        self._hyper = self._hyper_now()
        self.plan = RankPlan(layout, self.group.rank, self.group.world)
        sw = self.spec.switch
        #: in-band through a P4 switch (not the software tap): the switch copies FINAL chunks
        #: and fans COMMITs out; with ``switch.loopback`` the ring crosses it as frames
        self.via_switch = (
            self.spec.job.mode == "in-band" and not software_tap and sw.target != "none"
        )
        self.frames = self.via_switch and sw.loopback is not None
        if chunk_bytes is None:
            # the largest UDP payload a datagram may have: a loopback one, one framed for the
            # target's loopback ports, or one that fits a 1500-byte MTU; then the chunk is what
            # is left after the header (and the DATA MAC tag), in whole 64-byte granules
            hosts = [a.host for a in self.spec.shadows.addresses]
            room = (
                MAX_FRAMED_DATAGRAM
                if self.frames
                else MAX_DATAGRAM
                if all(map(_is_loopback, hosts))
                else NETWORK_DATAGRAM
            )
            chunk_bytes = chunk_for(room, mac=self.spec.security.authenticate_data)
        if self.via_switch and not self.frames:
            # the ring's FINAL chunks go to the next rank through the switch, which taps them
            ring = [(a.host, a.port) for a in self.spec.trainers.addresses]
            nxt = ring[(self.group.rank + 1) % len(ring)] if ring else None
            check_unfragmented(
                chunk_bytes,
                self.spec.security.authenticate_data,
                [*([nxt] if nxt else []), *((a.host, a.port) for a in self.spec.shadows.addresses)],
            )
        self.chunk_bytes = chunk_bytes
        per_slot = max(1, self.plan.staging_nbytes)
        self.slots = int(min(MAX_SLOTS, max(4, buffer_bytes // per_slot)))
        self._buffer_bytes = buffer_bytes
        #: mirror: a capture's DATA leaves at SCHED_IDLE while the sender keeps up
        #: (trainer_hooks/_priority.py); False: always at the training thread's priority
        self.background_sender = background_sender
        self.mode = self.spec.job.mode
        self._iteration: int | None = None
        self._sender: MirrorSender | None = None
        self._degraded_reason: str | None = None
        self._start_problem: str | None = None
        self._restored_commit: dict[str, Any] | None = None
        #: a restore wrote part of the parameters and then failed (a fresh start is not safe)
        self._params_dirty = False
        #: the restore point's holds (rank 0's survey), released once the shadows are loaded
        self._held_after_restore: list[int] = []
        self._closed = False
        #: this instance's generation of the job (fencing, DESIGN invariant 8) and the value of
        #: the header's layout field that carries it
        self.generation = 0
        self._digest = layout.digest64
        self._sock: socket.socket | None = None
        self._link: Any = None
        self.health: HealthMonitor | None = None
        self._health_ctx: tuple[Any, dict[int, Any]] = (None, {})
        #: parameters in the order the user's clip_grad_norm_(model.parameters()) sums them
        self._clip_params = [p for p in self.module.parameters() if p.requires_grad]
        #: the module buffers rank 0 streams every iteration (the layout's state bucket)
        self._buffers = {
            st.name: self._module_state[st.name] for st in layout.state if st.kind == "buffer"
        }
        #: the layout's parameters in layout order (COMMIT.no_grad indexes them)
        self._layout_params = [self.params[p.name] for p in layout.params]
        self.software_tap = software_tap
        self.ring: RingAllReduce | None = None
        self.reducer: LayoutReducer | None = None
        if self.mode == "in-band":
            if ddp is None:
                raise ConfigError("job.mode", self.mode, "in-band mode needs a DDP model")
            # the DDP model keeps its comm hook (and so the reducer) for its life: the reducer
            # refers to this session weakly, so a closed session does not live on in the model
            me = weakref.ref(self)

            def ring_reduce(bucket: int, flat: torch.Tensor) -> torch.futures.Future[Any]:
                session = me()
                if session is None:
                    raise ShadowgradError(
                        "in-band mode: the shadowgrad session this DDP model was attached to "
                        "is closed and gone; a DDP model takes one comm hook for its life, so "
                        "train a new DDP model with a new session"
                    )
                return session._ring_reduce(bucket, flat)

            self.reducer = LayoutReducer(layout, self.params, pg, reduce=ring_reduce)
            ddp.register_comm_hook(self.reducer, layout_hook)
        elif ddp is not None and layout_reduce:
            self.reducer = LayoutReducer(layout, self.params, pg)
            ddp.register_comm_hook(self.reducer, layout_hook)

    def _ring_reduce(self, bucket: int, flat: torch.Tensor) -> torch.futures.Future[Any]:
        if self.ring is None or self.reducer is None:
            raise ShadowgradError("in-band mode: call restore_or_start() before training")
        return self.ring.submit(self.reducer.iteration, bucket, flat)

    # -- properties ----------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def iteration(self) -> int:
        """The iteration the next :meth:`step` commits."""
        if self._iteration is None:
            raise ShadowgradError("call restore_or_start() before training")
        return self._iteration

    @property
    def degraded(self) -> bool:
        """True while the shadows cannot produce this job's current state: a shard without a
        healthy replica (unloaded, diverged, unreachable, fenced — as the health monitor last
        saw them), an iteration dropped for the shadows that no re-seed has covered yet, or a
        lasting condition (``stats()["degraded_reason"]`` says which). It turns false again
        once the shards healed."""
        return self._why_degraded() is not None

    def _why_degraded(self) -> str | None:
        if self._degraded_reason is not None:
            return self._degraded_reason  # lasting: hyperparameters changed
        h = self.health
        if h is not None and h.fenced:
            return "fenced"
        if h is not None and h.unhealthy_shards():
            return self._start_problem or "unhealthy_shards"
        s = self._sender
        if s is not None and s.last_drop is not None and (h is None or not h.covered(s.last_drop)):
            return "dropped_iterations"
        return None

    def stats(self) -> dict[str, Any]:
        why = self._why_degraded()
        out: dict[str, Any] = {
            "iteration": self._iteration,
            "degraded": why is not None,
            "degraded_reason": why,
            "slots": self.slots,
            "chunk_bytes": self.chunk_bytes,
            "generation": self.generation,
        }
        if self.reducer is not None:
            # layout-bucket reductions, and how many reduced DDP's bucket in place (no copies)
            out["reducer"] = {
                "reductions": self.reducer.reductions,
                "zero_copy": self.reducer.zero_copy,
            }
        if self._sender is not None:
            out["mirror"] = self._sender.stats()
        if self.health is not None:
            out["health"] = self.health.summary()
        return out

    # -- shadows --------------------------------------------------------------------------

    def _client(self, k: int, timeout_s: float) -> ShadowClient:
        ep = self.spec.shadows.control_endpoint(k)
        return ShadowClient(f"tcp://{ep}", self._token, timeout_s=timeout_s)

    def _bulk_timeout(self, nbytes: int) -> float:
        return self.spec.timeouts.connect_s + nbytes / (20 * 2**20)

    def _degrade(self, reason: str, *, lasting: bool = True, **fields: Any) -> None:
        """Log a degradation; ``lasting``: it stays (self-healing cannot undo it). A start
        without the shadows is not lasting: the health monitor seeds them when they come."""
        if lasting and self._degraded_reason is None:
            self._degraded_reason = reason
        elif not lasting and self._start_problem is None:
            self._start_problem = reason
        event(
            log, events.TRAINER_DEGRADED, logging.WARNING, rank=self.rank, reason=reason, **fields
        )

    def _statuses(self, *, report: bool) -> dict[int, ShadowStatus | None]:
        out: dict[int, ShadowStatus | None] = {}
        for k in range(self.spec.shadows.count):
            try:
                with self._client(k, self.spec.timeouts.rpc_s) as c:
                    out[k] = c.status(timeline=0)
            except Exception as exc:
                out[k] = None
                if report:
                    event(
                        log,
                        events.TRAINER_SHADOW_UNREACHABLE,
                        logging.WARNING,
                        shadow=k,
                        error=str(exc),
                    )
        return out

    def _ask_controller(self, failed: int | None = None) -> dict[str, Any] | None:
        """Rank 0, with ``[controller] address`` in the spec: the controller's restore point
        (it fixed I* when it detected the failure, or fixes it now); None when it does not
        answer (the trainers then survey the shadows themselves, with the same rule).
        ``failed``: the iteration it gave before, which could not be fetched."""
        t = self.spec.timeouts
        # the controller may be settling and holding I* (up to 4 x failure_detect)
        point = self._call_controller(
            t.rpc_s + 5 * t.failure_detect_s,
            lambda c: c.restore_point(requester=f"rank {self.rank}", failed=failed),
        )
        if point is None:
            return None
        generation = max(point.generation_seen + 1, time.time_ns() // 1_000_000)
        if point.fresh:
            return {"mode": "fresh", "reachable": point.reachable, "generation": generation}
        if point.layout != self.layout.digest:
            raise ShadowgradError(
                f"the controller's restore point is of layout {str(point.layout)[:16]}, "
                f"this trainer uses {self.layout.digest[:16]}: not this job's state"
            )
        event(
            log,
            events.TRAINER_RESTORE_POINT,
            istar=point.istar,
            generation=generation,
            source=list(point.source),
            by="controller",
        )
        return {
            "mode": "restore",
            "istar": point.istar,
            "source": list(point.source),
            "generation": generation,
            "held": [],  # the controller's holds: it releases them
        }

    def _survey(self, failed: int | None = None, *, ask: bool = True) -> dict[str, Any]:
        """Rank 0: the decision (fresh / restore at I*): the controller's, when one answers
        (``ask``), else from the status of every shadow with the core rule, held on its
        sources before it is used. ``failed``: the I* of the previous attempt, which some
        rank could not fetch."""
        if ask:
            asked = self._ask_controller(failed)
            if asked is not None:
                return asked
        layout = self.layout
        t = self.spec.timeouts
        polled: list[dict[int, ShadowStatus | None]] = []

        def poll() -> dict[int, ShadowStatus | None]:
            polled.append(self._statuses(report=not polled))
            return polled[-1]

        def hold(k: int, it: int) -> None:
            with self._client(k, t.rpc_s) as c:
                c.hold(it)

        def release(k: int, it: int) -> None:
            with self._client(k, t.rpc_s) as c:
                c.release(it)

        # the one rule, in core (shadowgrad.restore): settle, I*, held on its sources
        point, held = fix_restore_point(
            poll,
            hold,
            release,
            num_shards=layout.num_shards,
            replication=layout.replication,
            digest=layout.digest,
            interval_s=max(0.05, t.gap_repair_s),
            timeout_s=t.failure_detect_s,
            who="trainer",
        )
        # a new generation for this instance: above every generation a shadow has seen, so the
        # shadows fence out any older instance that is still sending
        seen = max((s.generation for st in polled for s in st.values() if s), default=0)
        generation = max(seen + 1, time.time_ns() // 1_000_000)
        if point.fresh:
            return {"mode": "fresh", "reachable": point.reachable, "generation": generation}
        event(
            log,
            events.TRAINER_RESTORE_POINT,
            istar=point.istar,
            generation=generation,
            shards=[
                {"shadow": k, "usable": a} for a, k in zip(point.usable, point.source, strict=True)
            ],
        )
        return {
            "mode": "restore",
            "istar": point.istar,
            "source": list(point.source),
            "generation": generation,
            "held": held,  # this rank's holds: released once every rank fetched
        }

    def _shard_states(self, shard: int, *, clone: bool) -> list[dict[str, torch.Tensor]]:
        """The live state of ``shard``'s boxes (params + optimizer state, then its module state),
        on the CPU; ``clone``: copies (a re-seed captures them on the training thread, then
        sends them in the background while training changes the originals)."""
        params = {n: p.detach() for n, p in self.params.items()}
        params.update((n, t.detach()) for n, t in self._module_state.items())
        opt_state = {
            n: {k: v.detach() for k, v in st.items()}
            for n, st in state_by_name(self.optimizer, self._named).items()
        }
        states = box_states_from_full(self.layout, shard, params, opt_state)
        if clone:
            return [
                {key: v.to("cpu", copy=True).contiguous() for key, v in st.items()} for st in states
            ]
        return [{key: v.cpu().contiguous() for key, v in st.items()} for st in states]

    def _send_load(
        self,
        k: int,
        iteration: int,
        states: list[dict[str, Any]] | None,
        commit: dict[str, Any] | None,
        *,
        reseed: bool,
        client: ShadowClient | None = None,
    ) -> tuple[float | None, float | None]:
        """``load`` the box states of shadow ``k``'s shard (``states=None``: a keep load, the
        shadow installs its own state of ``iteration``). ``client``: one already connected
        to shadow ``k`` (the health monitor's), used and kept open; else a new connection.
        Returns the seconds the shadow says it spent installing the state and when it took
        the request off its socket (its monotonic clock); each None if it does not say."""
        shard, _ = self.layout.shard_of_shadow(k)
        timeout = self._bulk_timeout(3 * self.layout.shard_bytes(shard))
        c = client if client is not None else self._client(k, timeout)
        try:
            reply = c.load(
                iteration,
                states,
                self.optspec.to_json(),
                self.layout.to_json(),
                timeout_s=timeout,
                commit=commit,
                generation=self.generation,
                reseed=reseed,
                source=f"rank {self.rank}",
            )
        finally:
            if client is None:
                c.close()
        install = reply.install_ms / 1000 if "install_ms" in reply.raw else None
        return install, reply.received_at

    def _load_shadows(
        self, iteration: int, commit: dict[str, Any] | None = None, *, keep: bool = False
    ) -> bool:
        """Bootstrap the shadows this rank is responsible for (``k % world == rank``) with the
        live model and optimizer state, as the state after ``iteration`` (``commit``: keep
        COMMIT(iteration) with it, for the next restore). ``keep`` (after a restore of
        ``iteration``): first ask each shadow to keep its own state of ``iteration`` as the new
        session's start (nothing travels); only a shadow that has not got it is sent the
        state."""
        ok = True
        for k in range(self.spec.shadows.count):
            if k % self.group.world != self.rank:
                continue
            shard, _ = self.layout.shard_of_shadow(k)
            try:
                if keep:
                    try:
                        self._send_load(k, iteration, None, commit, reseed=False)
                        continue
                    except ControlError as exc:
                        if exc.code not in ("unavailable", "not_loaded"):
                            raise
                        event(log, events.TRAINER_KEEP_REFUSED, shadow=k, reason=str(exc))
                self._send_load(
                    k, iteration, self._shard_states(shard, clone=False), commit, reseed=False
                )
            except Exception as exc:
                ok = False
                event(log, events.TRAINER_LOAD_FAILED, logging.WARNING, shadow=k, error=str(exc))
        return ok

    # -- start / restore ----------------------------------------------------------------

    def restore_or_start(self, *, first_iteration: int = 0) -> Start:
        """Restore from the shadows if they hold this job's state, else start fresh.

        Collective: every rank calls it. A fresh start loads the current model and optimizer
        state into the shadows as the state before ``first_iteration``; a restore fetches the
        newest iteration I* every shard holds (each rank fetches a 1/N share of the shards, the
        shares are exchanged over the process group), loads model, optimizer, scheduler, scaler,
        re-seeds the shadows with it and returns ``Start(I* + 1, user_state, True)``.
        """
        if self._iteration is not None:
            raise ShadowgradError("restore_or_start() was already called")
        g = self.group
        # fencing: take this rank's addresses before touching any shadow, so a rerun next to a
        # still-running instance fails here, at once, and changes nothing
        bind_error = self._bind()
        if g.all_min(0 if bind_error else 1) == 0:
            self._close_sockets()
            raise ShadowgradError(
                bind_error
                or "another rank could not bind its trainer address"
                " (see its error): is an earlier instance still running?"
            )
        # a decision can be stale by the time it is used (a shadow moved on, or went away):
        # ask again (the controller fixes a new one), then survey the shadows without it
        failed: int | None = None
        attempts = 3
        decision: dict[str, Any] | None = None
        for attempt in range(1, attempts + 1):
            decision = None
            if g.rank == 0:
                try:
                    decision = self._survey(failed, ask=attempt < attempts)
                except ShadowgradError as exc:
                    decision = {"mode": "error", "error": str(exc)}
            decision = g.broadcast_object(decision, src=0)
            assert decision is not None
            if decision["mode"] == "error":
                self._close_sockets()
                raise ShadowgradError(decision["error"])
            self.generation = int(decision.get("generation", 0))
            self._digest = session_digest(self.layout.digest64, self.generation)
            if decision["mode"] == "fresh":
                break
            try:
                start = self._restore(
                    int(decision["istar"]), list(decision["source"]), decision.get("held", [])
                )
                break
            except _FetchFailedError as exc:
                failed = int(decision["istar"])
                if attempt == attempts:
                    self._close_sockets()
                    raise ShadowgradError(str(exc)) from None
                if g.rank == 0:
                    event(
                        log,
                        events.TRAINER_RESTORE_RETRY,
                        logging.WARNING,
                        istar=failed,
                        attempt=attempt,
                        error=str(exc),
                        next="ask the controller again"
                        if attempt + 1 < attempts and self.spec.controller.address is not None
                        else "survey the shadows",
                    )
        assert decision is not None
        if decision["mode"] == "fresh":
            start = Start(first_iteration, None, False)
            if self._params_dirty:
                self._close_sockets()
                raise ShadowgradError(
                    "a failed restore overwrote part of the model's parameters and the shadows"
                    " no longer hold a state to restore: start the job again"
                )
            if decision.get("reachable", 1) == 0:
                self._degrade("no_shadow_reachable", lasting=False)
                ok = False
            else:
                ok = self._load_shadows(first_iteration - 1)
        else:
            ok = self._load_shadows(start.iteration - 1, self._restored_commit, keep=True)
            # the holds of the restore point kept it for the keep loads; a load ends them on
            # the shadows it reached, this ends the others
            self._release_held(self._held_after_restore, start.iteration - 1)
            self._held_after_restore = []
        if g.all_min(int(ok)) == 0:
            self._degrade("bootstrap_failed", lasting=False)
        self._iteration = start.iteration
        if self.reducer is not None:
            self.reducer.iteration = start.iteration
        self._start_sender()
        self._start_health()
        event(
            log,
            events.TRAINER_START,
            rank=self.rank,
            iteration=start.iteration,
            restored=start.restored,
            degraded=self.degraded,
            generation=self.generation,
        )
        return start

    def _release_held(self, held: list[int], istar: int) -> None:
        for k in held:
            try:
                with self._client(k, self.spec.timeouts.rpc_s) as c:
                    c.release(istar)
            except Exception as exc:
                event(log, events.TRAINER_RELEASE_FAILED, logging.WARNING, shadow=k, error=str(exc))

    def _restore(self, istar: int, source: list[int], held: list[int]) -> Start:
        """Fetch I* (held on ``source`` by the controller, or by rank 0's survey: ``held``,
        released by the caller once the shadows are loaded, here when the fetch failed) and
        load it. Raises :class:`_FetchFailedError` on every rank when some rank could not fetch
        (the caller decides again)."""
        g = self.group
        layout = self.layout
        # every rank fetches every shard itself, all at once: each shard in pieces of about
        # FETCH_PIECE_BYTES (box groups), several requests in flight on connections of their
        # own, so the shadow prepares one piece while the last one travels and the one before
        # is copied; each reply's chunks verified and copied once, straight into the
        # parameters (in place) and into new optimizer state tensors; rank r starts at shard r,
        # to spread the ranks over the shadows
        sink = FullStateSink(layout, {n: p.detach() for n, p in self.params.items()})
        if sink.in_place:
            self._params_dirty = True  # a failed fetch may leave them half written
        order = [(g.rank + j) % layout.num_shards for j in range(layout.num_shards)]
        pieces = [(shard, grp) for shard in order for grp in _box_groups(layout, shard)]
        commit: dict[str, Any] | None = None
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context(io_threads=FETCH_IO_THREADS)

        def fetch(shard: int, boxes: list[int]) -> dict[str, Any] | None:
            k = source[shard]
            ep = f"tcp://{self.spec.shadows.control_endpoint(k)}"
            timeout = self._bulk_timeout(3 * layout.shard_bytes(shard))
            deadline = time.monotonic() + timeout
            with ShadowClient(ep, self._token, timeout_s=timeout, context=ctx) as c:
                # the bytes on the shadow's bulk channel, straight into their place; a shadow
                # without one answers with frames (zmq's buffers, then one copy)
                reply = c.fetch_raw(istar, boxes=boxes, copy=False, stream=FETCH_STREAM)
                reader = c.open_stream(reply, deadline) if reply.stream is not None else None
            if reply.iteration != istar:
                if reader is not None:
                    reader.close()
                raise ShadowgradError(f"shadow {k} answered iteration {reply.iteration}")
            if reader is None:
                sink.write(shard, reply.entries, reply.frames, boxes=boxes)
            else:
                with reader:
                    sink.receive(shard, reply.entries, reader, boxes=boxes)
            return reply.commit

        error: str | None = None
        t0 = time.perf_counter()
        try:
            workers = max(1, min(FETCH_IN_FLIGHT, len(pieces)))
            with ThreadPoolExecutor(workers, "sg-restore") as pool:
                futures = [(shard, pool.submit(fetch, shard, grp)) for shard, grp in pieces]
                for shard, fut in futures:
                    try:
                        got = fut.result()
                    except Exception as exc:
                        if error is None:
                            error = (
                                f"fetch of shard {shard} from shadow {source[shard]} failed: {exc}"
                            )
                        continue
                    if shard == 0 and commit is None:
                        commit = got
        finally:
            ctx.term()
        try:
            params, opt_state = sink.finish() if error is None else ({}, {})
        except ShadowgradError as exc:
            error = f"the fetched state of iteration {istar} is inconsistent: {exc}"
        failed = g.all_min(0 if error else 1) == 0
        if failed:
            if g.rank == 0:
                self._release_held(held, istar)
            raise _FetchFailedError(error or "restore failed on another rank")
        fetch_s = time.perf_counter() - t0
        with torch.no_grad():
            for name, p in self.params.items():
                if name not in sink.in_place:
                    p.copy_(params[name].to(p.device))
            # buffers and frozen parameters of I*, bit for bit (they came with the shards)
            for name, t in self._module_state.items():
                t.copy_(params[name].to(t.device))
        self._params_dirty = False
        self._held_after_restore = held if g.rank == 0 else []
        if opt_state:
            load_state_by_name(self.optimizer, self._named, opt_state, copy=False)
        user: Any = None
        self._restored_commit = commit
        if istar >= 0 and (commit is None or "user_state" not in commit):
            if self.scheduler is not None or self.scaler is not None:
                raise ShadowgradError(
                    f"the shadows' fetch reply carries no COMMIT record for iteration {istar}:"
                    " the LR scheduler and grad scaler cannot be restored"
                )
            event(
                log,
                events.TRAINER_RESTORE_WITHOUT_USER_STATE,
                logging.WARNING,
                rank=self.rank,
                iteration=istar,
            )
        elif istar >= 0:
            assert commit is not None
            blob = unpack_blob(base64.b64decode(commit["user_state"]))
            if self.scheduler is not None and blob.get("scheduler") is not None:
                self.scheduler.load_state_dict(blob["scheduler"])
                for group, lr in zip(
                    self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True
                ):
                    group["lr"] = lr
            if self.scaler is not None and blob.get("scaler") is not None:
                self.scaler.load_state_dict(blob["scaler"])
            user = blob.get("user")
        event(
            log,
            events.TRAINER_RESTORED,
            rank=self.rank,
            iteration=istar,
            fetch_ms=round(1000 * fetch_s, 1),
            bytes=sink.nbytes,
            fetch_mb_s=round(sink.nbytes / fetch_s / 1e6, 1) if fetch_s > 0 else None,
        )
        return Start(istar + 1, user, True)

    def _bind(self) -> str | None:
        """Bind this rank's sockets (mirror mode: the trainer address is the sender's socket,
        DATA out and NACKs in; in-band mode it belongs to the ring's link, which carries the
        COMMITs too, and the sender's socket is ephemeral). Returns an error message naming
        the holder, or None."""
        from .link import FrameLink, UdpLink

        ep = self.spec.trainers.addresses[self.rank]
        inband = self.mode == "in-band"
        fam = socket.AF_INET6 if ":" in ep.host else socket.AF_INET
        sock = socket.socket(fam, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 2**20)
        try:
            sock.bind((ep.host, 0 if inband else ep.port))
            self._sock = sock
            if inband and self.frames:
                sw = self.spec.switch
                sep = sw.loopback_endpoint(sw.trainer_ports[self.rank])
                peers = {
                    (a.host, a.port): sw.trainer_mac(i)
                    for i, a in enumerate(self.spec.trainers.addresses)
                }
                peers.update(
                    {
                        (a.host, a.port): sw.shadow_mac(k)
                        for k, a in enumerate(self.spec.shadows.addresses)
                    }
                )
                self._link = FrameLink(
                    (ep.host, ep.port),
                    switch=(sep.host, sep.port),
                    mac=sw.trainer_mac(self.rank),
                    peers=peers,
                )
            elif inband:
                self._link = UdpLink((ep.host, ep.port))
        except OSError as exc:
            sock.close()
            self._sock = None
            holder = _udp_port_holder(ep.port)
            return f"rank {self.rank} cannot bind its trainer address {ep}: {exc.strerror}" + (
                f" -- held by {holder}: an instance of this job is still running (stop "
                "it first; the shadows were not touched)"
                if holder
                else " (is an instance of this job still running? the shadows were not touched)"
            )
        return None

    def _close_sockets(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._link is not None:
            self._link.close()
            self._link = None

    def _start_sender(self) -> None:
        inband = self.mode == "in-band"
        sock = self._sock
        assert sock is not None
        self._sock = None
        pin = any(p.is_cuda for p in self.params.values()) and torch.cuda.is_available()
        # in-band, COMMITs leave from the trainer address too (the shadows take COMMITs only
        # from there), through the ring's link (framed to the switch with switch.loopback)
        link = self._link if inband else None
        shadow_addrs = [(a.host, a.port) for a in self.spec.shadows.addresses]
        # in-band, the sender carries rank 0's COMMITs and module buffers (the ring the rest)
        plan = (
            RankPlan(self.layout, self.rank, self.group.world, empty=True) if inband else self.plan
        )
        slots = self.slots
        if inband:
            slots = (
                1
                if not plan.staging_nbytes
                else int(min(MAX_SLOTS, max(4, self._buffer_bytes // plan.staging_nbytes)))
            )
        self._sender = MirrorSender(
            plan,
            job=self.spec.job.id,
            sock=sock,
            shadow_addrs=shadow_addrs,
            chunk_bytes=self.chunk_bytes,
            slots=slots,
            commits=self.rank == 0,
            heartbeat_s=self.spec.timeouts.heartbeat_s,
            pin_memory=pin,
            digest=self._digest,
            on_unavailable=_weakly(self._on_history_gone),
            commit_fanout=self.via_switch,
            commit_send=(lambda data, addr: link.send([data], addr)) if link is not None else None,
            send_parts=link.send if link is not None else None,
            key=self._key,
            authenticate_data=self.spec.security.authenticate_data,
            background=self.background_sender,
        )
        if inband:
            self._start_ring(shadow_addrs)

    def _on_history_gone(self, addr: tuple[str, int], iteration: int) -> None:
        """A shadow NACKed an iteration this rank can no longer resend: re-seed it now."""
        if self.health is None:
            return
        for k, a in enumerate(self.spec.shadows.addresses):
            if (a.host, a.port) == (addr[0], addr[1]):
                self.health.request(k, f"history_gone:{iteration}")

    def _start_health(self) -> None:
        import zmq

        spec, token = self.spec, self._token
        t = spec.timeouts
        # one context and one client per shadow for the monitor's polls and re-seeds (its
        # thread only): a re-seed goes over the connection the polls keep open
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        clients: dict[int, ShadowClient] = {}
        self._health_ctx = (ctx, clients)
        # the monitor's callbacks refer to this session weakly (it owns the monitor): a closed
        # session, its mirror slots with it, goes with the last reference to it
        me = weakref.ref(self)

        def client(k: int) -> ShadowClient:
            c = clients.get(k)
            if c is None:
                ep = spec.shadows.control_endpoint(k)
                c = clients[k] = ShadowClient(
                    f"tcp://{ep}", token, timeout_s=min(1.0, t.rpc_s), context=ctx
                )
            return c

        def status(k: int) -> ShadowStatus:
            return client(k).status(timeline=0, brief=True)

        def load(
            k: int, iteration: int, states: list[dict[str, Any]], commit: dict[str, Any] | None
        ) -> tuple[float | None, float | None]:
            session = me()
            if session is None:
                raise ShadowgradError("the shadowgrad session is gone: nothing to re-seed from")
            return session._send_load(k, iteration, states, commit, reseed=True, client=client(k))

        def progress() -> int | None:
            session = me()
            return None if session is None else session._iteration

        self.health = HealthMonitor(
            self.layout,
            rank=self.rank,
            world=self.group.world,
            generation=self.generation,
            status=status,
            load=load,
            # six looks per failure_detect (what bounds noticing a failed shadow), at most every
            # 0.1 s and at least every 0.5 s: each look is a status call to every shadow, CPU
            # on a core the training needs (the trainers' heartbeat has nothing to do with it)
            interval_s=health_interval(t.failure_detect_s),
            grace_s=t.failure_detect_s,
            reseed_timeout_s=max(10.0, 3 * t.failure_detect_s),
            progress=progress,
        ).start()

    def _start_ring(self, shadow_addrs: list[tuple[str, int]]) -> None:
        from .ring import RingConfig

        t = self.spec.timeouts
        addrs = [(a.host, a.port) for a in self.spec.trainers.addresses]
        link = self._link
        assert link is not None
        self._link = None
        cfg = RingConfig(
            job=self.spec.job.id,
            layout=self._digest,
            chunk_bytes=self.chunk_bytes,
            rto_s=min(0.05, t.gap_repair_s / 2),
            timeout_s=max(30.0, 10 * t.failure_detect_s),
            # a rank's FINAL bytes per iteration are its 1/N share, the size of a
            # mirror staging slot: keep as many iterations for shadow repairs as the
            # slot budget allows (trainers may run well ahead of slow shadows)
            retain=max(4, self.slots),
            cuts=RingConfig.shard_cuts(self.layout.bucket_routes),
            key=self._key,
            authenticate_data=self.spec.security.authenticate_data,
            authenticate_ring=self.spec.security.authenticate_ring,
            shadows=tuple(shadow_addrs),
        )
        ring = RingAllReduce(self.rank, self.group.world, link, addrs, cfg)
        sender = self._sender
        assert sender is not None
        ring.on_commit_nack = sender.request_commit
        ring.state_bucket = self.layout.state_bucket
        ring.on_state_nack = sender.request_ranges
        if self.software_tap:
            layout = self.layout
            dests = [
                [shadow_addrs[k] for k in layout.shadows_of_shard(s)]
                for s in range(layout.num_shards)
            ]

            def tap(header: bytes, payload: bytes) -> None:
                h = peek_header(header)
                shards = {
                    r.shard
                    for r in layout.bucket_routes[h.bucket]
                    if r.start < h.offset + h.length and r.end > h.offset
                }
                for shard in sorted(shards):
                    for addr in dests[shard]:
                        link.send([header, payload], addr)

            ring.tap = tap
        self.ring = ring.start()

    # -- the iteration --------------------------------------------------------------------

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, through the grad scaler when there is one."""
        if self.scaler is not None:
            scaled: torch.Tensor = self.scaler.scale(loss)
            scaled.backward()  # type: ignore[no-untyped-call]
        else:
            loss.backward()  # type: ignore[no-untyped-call]

    def _hyper_now(self) -> list[dict[str, Any]]:
        skip = ("params", "lr", "initial_lr")
        return [{k: v for k, v in g.items() if k not in skip} for g in self.optimizer.param_groups]

    def step(self, user_state: Any = None, *, zero_grad: bool = True) -> StepInfo:
        """Finish the iteration: capture, unscale, clip, step, update, schedule, COMMIT.

        ``user_state`` (rank 0's is kept) is any small object of dicts, lists, numbers, strings
        and tensors (dataloader position, RNG state); it comes back from
        :meth:`restore_or_start` after a restore.
        """
        it = self.iteration
        opt = self.optimizer
        sender = self._sender
        sent = False
        # parameters without a gradient this iteration (unused): the optimizer skips them, the
        # COMMIT names them so the shadows skip them too
        no_grad = tuple(i for i, p in enumerate(self._layout_params) if p.grad is None)
        if sender is not None and (self.mode == "mirror" or sender.plan.state_pieces):
            # mirror: this rank's gradient slices; rank 0 (both modes): the module buffers
            mine = {n: p.grad for n, p in self.params.items()} if self.mode == "mirror" else {}
            sent = sender.capture(it, mine, self._buffers)
        lrs = tuple(float(g["lr"]) for g in opt.param_groups)
        scale: torch.Tensor | None = None
        scaler = self.scaler
        if scaler is not None:
            if scaler._scale is None:
                raise ShadowgradError(
                    "the grad scaler has no scale: use sg.backward(loss) or "
                    "scaler.scale(loss).backward()"
                )
            scale = scaler._scale.detach().clone()
            scaler.unscale_(opt)
        norm: torch.Tensor | None = None
        coef: torch.Tensor | None = None
        if self.max_grad_norm is not None:
            # exactly what clip_grad_norm_(model.parameters(), max_norm) computes: the norm is
            # summed in module order (param-group order rounds differently), then the same
            # coefficient clamp(max_norm / (norm + 1e-6), max=1) multiplies every gradient
            plist = self._clip_params
            grads = [p.grad for p in plist if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, self.norm_type)
            torch.nn.utils.clip_grads_with_norm_(plist, self.max_grad_norm, norm)
            coef = torch.clamp(self.max_grad_norm / (norm + 1e-6), max=1.0)
        if scaler is not None:
            scaler.step(opt)
            found = scaler._per_optimizer_states[id(opt)]["found_inf_per_device"]
            skipped = bool(sum(v.item() for v in found.values()))
            scaler.update()
        else:
            opt.step()
            skipped = False
        if self.scheduler is not None:
            self.scheduler.step()
        if self._hyper_now() != self._hyper:
            self._degrade("hyperparameters_changed", iteration=it)
            self._hyper = self._hyper_now()
        info: CommitInfo | None = None
        if sender is not None and self.rank == 0:
            blob = pack_blob(
                it,
                self.scheduler.state_dict() if self.scheduler is not None else None,
                scaler.state_dict() if scaler is not None else None,
                user_state,
            )
            ready = None
            dev = [t for t in (coef, scale) if t is not None and t.is_cuda]
            if dev:
                ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
                ready.record()
            coef_cpu = coef.to("cpu", non_blocking=True) if coef is not None else None
            scale_cpu = scale.to("cpu", non_blocking=True) if scale is not None else None
            info = CommitInfo(it, lrs, coef_cpu, scale_cpu, skipped, blob, ready, no_grad)
            sender.commit(info)
        if self.health is not None and self.health.wants_reseed:
            self._reseed(it, info)
        if zero_grad:
            opt.zero_grad(set_to_none=True)
        self._iteration = it + 1
        return StepInfo(it, skipped, lrs, norm, sent)

    def _reseed(self, iteration: int, info: CommitInfo | None) -> None:
        """Capture the state after ``iteration`` of every shard the health monitor wants
        re-seeded (one staging copy each: the pause self-healing costs) and hand it to the
        monitor's thread, which sends it."""
        health = self.health
        assert health is not None
        commit = commit_to_json(iteration, info.record()) if info is not None else None
        for shard, shadows in health.take_wanted().items():
            t0 = time.perf_counter()
            states = self._shard_states(shard, clone=True)
            pause = time.perf_counter() - t0
            health.submit(iteration, shadows, states, commit, pause)

    # -- shutdown -------------------------------------------------------------------------

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait (at most ``timeout_s``) until everything queued was sent. For tests/shutdown."""
        return self._sender.flush(timeout_s) if self._sender is not None else True

    def close(self, timeout_s: float | None = None, *, finished: bool = True) -> None:
        """Send what is queued, then keep answering the shadows' repair requests until they
        applied the last iteration (or gave up on it, or ``timeout_s`` passed; default
        ``max(30 s, timeouts.failure_detect)``), then stop. Training is over: this may wait;
        it returns at once when every shadow has applied the last iteration.

        ``finished`` (rank 0): tell the controller that training ended normally, first — the
        waits below are silence on the data path that it must not take for a failure (seen in
        CI: a close that took longer than ``failure_detect`` was reported as a trainer
        failure) — and, once the last iteration was sent, every shadow (their status then says
        ``finished``, so ``shadowgrad status`` after a clean end is no alarm, with or without a
        controller). Leaving a ``with`` block by an exception passes False."""
        if self._closed:
            return
        self._closed = True
        if self.rank == 0 and finished:
            self._tell_controller_finished()
        wait = max(30.0, self.spec.timeouts.failure_detect_s) if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        if self._sender is not None:
            self._sender.flush(wait)
            if self._iteration is not None and self._iteration > 0:
                self._wait_applied(self._iteration - 1, deadline)
            self._sender.close(max(1.0, deadline - time.monotonic()))
        # the monitor's clients are closed once its thread ended (nothing uses them any more)
        if self.health is not None and self.health.close():
            ctx, clients = self._health_ctx
            for c in clients.values():
                c.close()
            ctx.term()
        if self.ring is not None:
            self.ring.close(max(1.0, deadline - time.monotonic()))
        if self.rank == 0 and finished:
            self._tell_shadows_finished()
        self._close_sockets()

    def _tell_shadows_finished(self) -> None:
        """Training ended normally: every shadow records it (``finished`` op; its status then
        says so), once the last iteration was sent and waited for. Best effort, all shadows at
        once, a short timeout each: a shadow that does not answer is named in an event."""
        from concurrent.futures import ThreadPoolExecutor

        if self._iteration is None:
            return
        last, count = self._iteration - 1, self.spec.shadows.count
        timeout = min(self.spec.timeouts.rpc_s, 2.0)

        def one(k: int) -> str | None:
            try:
                with self._client(k, timeout) as c:
                    c.finished(last, self.generation, requester=f"rank {self.rank}")
            except Exception as exc:  # best effort: a dead shadow has nothing to record
                return str(exc)
            return None

        with ThreadPoolExecutor(max_workers=max(1, min(count, 16))) as pool:
            errors = {k: e for k, e in enumerate(pool.map(one, range(count))) if e is not None}
        if errors:
            event(
                log,
                events.TRAINER_FINISHED_NOT_TOLD,
                logging.WARNING,
                rank=self.rank,
                iteration=last,
                shadows=errors,
            )

    def _tell_controller_finished(self) -> None:
        """Training ended normally: the controller must not take the silence for a failure."""
        # the last iteration trained (``_iteration`` is the next one a step commits)
        last = None if self._iteration is None else self._iteration - 1
        # best effort: the controller may be down
        self._call_controller(
            self.spec.timeouts.rpc_s,
            lambda c: c.finished(last, self.generation, requester=f"rank {self.rank}"),
        )

    def _call_controller(
        self, timeout_s: float, ask: Callable[[ControllerClient], _T]
    ) -> _T | None:
        """``ask`` the controller of ``[controller] address``; None without one, or when it
        does not answer (logged: ``trainer.controller_unreachable``)."""
        addr = self.spec.controller.address
        if addr is None:
            return None
        try:
            with ControllerClient(f"tcp://{addr}", self._token, timeout_s=timeout_s) as c:
                return ask(c)
        except Exception as exc:
            event(
                log,
                events.TRAINER_CONTROLLER_UNREACHABLE,
                logging.WARNING,
                address=str(addr),
                error=str(exc),
            )
            return None

    def _wait_applied(self, iteration: int, deadline: float) -> bool:
        """Until every shadow that can still confirm applied ``iteration``. A shadow that
        cannot is not waited for: unreachable for a second, diverged, serving another
        generation, or unloaded (a shard that needs a re-seed gets the final state now)."""
        from ._health import classify

        first_seen: dict[int, float] = {}
        seeded: set[int] = set()
        lost: list[int] = []
        while time.monotonic() < deadline and not lost:
            sts = self._statuses(report=False)
            now = time.monotonic()
            waiting = []
            for k, st in sts.items():
                state = classify(st, self.generation)
                if state == "healthy":
                    if _as_int(None if st is None else st.last_applied) < iteration:
                        waiting.append(k)
                    continue
                if state == "fenced" or now - first_seen.setdefault(k, now) > (
                    1.0 if state == "unreachable" else 5.0
                ):
                    # cannot confirm (and the other shards cannot apply past it either)
                    lost.append(k)
                    continue
                if state != "unreachable" and k % self.group.world == self.rank and k not in seeded:
                    seeded.add(k)
                    self._seed_at_close(k, iteration)
                waiting.append(k)
            if not waiting and not lost:
                return True
            if not lost:
                time.sleep(0.05)
        event(
            log,
            events.TRAINER_CLOSE_UNCONFIRMED,
            logging.WARNING,
            rank=self.rank,
            iteration=iteration,
            cannot_confirm=lost,
        )
        return False

    def _seed_at_close(self, k: int, iteration: int) -> None:
        """Training is over: seed shadow ``k`` with the final state, so it confirms at once."""
        shard, _ = self.layout.shard_of_shadow(k)
        try:
            self._send_load(k, iteration, self._shard_states(shard, clone=False), None, reseed=True)
        except Exception as exc:
            reseed_event(log, self.rank, k, iteration, error=exc)
            return
        reseed_event(log, self.rank, k, iteration, shard=shard, at="close")

    def __enter__(self) -> Shadowgrad:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(finished=exc_type is None)


def _as_int(value: Any, default: int = -1) -> int:
    return default if value is None else int(value)


def _udp_port_holder(port: int) -> str | None:
    """``pid N (cmdline)`` of a local process holding UDP ``port`` (Linux /proc), or None."""
    inodes: set[str] = set()
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) > 9 and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except OSError:
            continue
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in fds):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                return f"pid {pid} ({cmd[:120]})"
        except OSError:
            continue
    return None


def _box_groups(layout: Layout, shard: int) -> list[list[int]]:
    """``shard``'s box indices in consecutive groups of about :data:`FETCH_PIECE_BYTES` of
    parameter bytes (a box larger than that is a group of its own)."""
    groups: list[list[int]] = [[]]
    size = 0
    for b, box in enumerate(layout.shard_entries(shard)):  # parameter boxes, module state
        if groups[-1] and size + box.nbytes > FETCH_PIECE_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(b)
        size += box.nbytes
    return [g for g in groups if g]


def attach(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    spec: JobSpec | str | os.PathLike[str],
    *,
    lr_scheduler: Any = None,
    grad_scaler: Any = None,
    max_grad_norm: float | None = None,
    **options: Any,
) -> Shadowgrad:
    """Attach shadowgrad to a (DDP-wrapped) model and its optimizer; see :class:`Shadowgrad`.

    ``spec`` is a :class:`~shadowgrad.config.JobSpec` or the path of its TOML file; the LR
    scheduler, the AMP grad scaler and the clipping norm are restored and replayed with the
    optimizer; ``options`` are :class:`Shadowgrad`'s other keywords. Then call
    :meth:`Shadowgrad.restore_or_start` once and :meth:`Shadowgrad.step` every iteration.
    """
    return Shadowgrad(
        model,
        optimizer,
        spec,
        lr_scheduler=lr_scheduler,
        grad_scaler=grad_scaler,
        max_grad_norm=max_grad_norm,
        **options,
    )


def _weakly(method: Callable[..., None]) -> Callable[..., None]:
    """``method`` (bound, returning nothing), called through a weak reference to its object:
    a callback a session hands to a part it owns, which must not keep the session alive (a
    closed session and its buffers go with the last reference to it, not at the cyclic
    collector's next pass). Once the object is gone, a call does nothing."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        m = ref()
        if m is not None:
            m(*args)

    return call
