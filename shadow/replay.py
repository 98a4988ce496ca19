"""Bit-exact optimizer replay for one shard of the model (issue 3 part 4, invariant 1).

A :class:`ShardReplayer` owns, for every box of ``layout.shard_boxes(shard)`` (in that order),
the parameter slice and its optimizer state, in the trainer's dtypes. For each iteration it
takes the fully reduced gradient of its boxes (what the all-reduce delivered, *before* the trainer
unscaled or clipped it) and the iteration's :class:`~shadowgrad.wire.CommitRecord`, and repeats
exactly what the trainer did:

1. loss scaling (``commit.loss_scale``): the same
   ``torch._amp_foreach_non_finite_check_and_unscale_`` call ``GradScaler.unscale_`` makes, with
   ``inv_scale = fp32(1 / fp64(scale))``, or, for a fused optimizer in
   ``scaler_unscale="in_step"`` mode, the scale handed to the kernel;
2. clipping (``commit.clip_coef``): gradients multiplied by the clamped coefficient as a 0-d
   tensor of the norm's dtype, as ``torch.nn.utils.clip_grad_norm_`` does;
3. the step, unless skipped: a real ``torch.optim`` optimizer of the trainer's class and flags,
   built over the box tensors, with each group's LR taken from ``commit.lrs``.

Its module state (``layout.shard_state_boxes(shard)``: buffers and frozen parameters, whole
tensors, after the boxes in every state list) has no optimizer: a step copies the iteration's
buffer bytes in, raw (bit-identical whatever the dtype, ``num_batches_tracked`` included), skipped
step or not; frozen parameters change only by :meth:`ShardReplayer.load`.

Stepping torch's own optimizer over pieces of the trainer's tensors is exact because every update
is element-wise: the for-loop and ``foreach`` paths give the same bits for any cut, and the fused
CPU kernel does too as long as each cut is a multiple of its vector width from the tensor start,
which the layout guarantees (cuts at multiples of ``align_elems`` = 64 elements). See
``docs/replay.md``.

:func:`box_states_from_full` cuts a trainer's full state into box states (to bootstrap a
shadow); :func:`assemble_full` glues the exports of all shards back into full tensors. Both, the
box state form and the input errors are shared contracts that live in core
(:mod:`shadowgrad.boxes`) and are re-exported here.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import torch

from shadowgrad import events
from shadowgrad._log import event
from shadowgrad.boxes import (
    BoxState,
    ReplayError,
    ReplayInputError,
    assemble_full,
    box_states_from_full,
    box_where,
    check_state_entry,
)
from shadowgrad.layout import Box, Layout
from shadowgrad.optspec import OptimizerSpec
from shadowgrad.torch_dtypes import LAYOUT_TORCH_DTYPES
from shadowgrad.torch_dtypes import TORCH_DTYPES as _ALL_DTYPES
from shadowgrad.wire import CommitRecord

__all__ = [
    "ReplayError",
    "ReplayInputError",
    "ReplayOrderError",
    "ReplayDivergedError",
    "BoxState",
    "ShardReplayer",
    "box_states_from_full",
    "assemble_full",
    "TORCH_DTYPES",
]

logger = logging.getLogger(__name__)

#: layout dtype name -> torch dtype (the one dtype table's index, :mod:`shadowgrad.torch_dtypes`)
TORCH_DTYPES: Mapping[str, torch.dtype] = LAYOUT_TORCH_DTYPES


class ReplayOrderError(ReplayError):
    """``step`` was called for an iteration other than ``last_applied + 1``. Nothing changed."""

    def __init__(self, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        super().__init__(f"iteration {got} out of order: expected {expected}")


class ReplayDivergedError(ReplayError):
    """The shard cannot vouch for its state: the COMMIT contradicts its own data (non-finite
    gradients in a step the trainer did not skip; the state is unchanged then), or the optimizer
    step failed half-way (the replayer refuses to step again until :meth:`ShardReplayer.load`)."""


def _fits(value: float, dtype: torch.dtype) -> bool:
    """``value`` survives a round trip through ``dtype`` (NaN counts as surviving)."""
    back = torch.tensor(value, dtype=dtype).item()
    return back == value or (math.isnan(value) and math.isnan(back))


class ShardReplayer:
    """Parameters and optimizer state of one shard, stepped exactly as the trainer steps them.

    ``dtype_policy="trainer"`` (the only policy): each box is held in its layout dtype and the
    optimizer state is whatever torch keeps for it (same dtype as the parameter; ``step`` a 0-d
    fp32 tensor) -- any other choice would break bit-exactness.

    Call :meth:`load` once (fresh parameters with ``iteration=-1``, or a state to resume from),
    then :meth:`step` for every iteration in order. Not thread-safe: one caller at a time.
    """

    def __init__(
        self,
        layout: Layout,
        shard: int,
        spec: OptimizerSpec,
        *,
        dtype_policy: Literal["trainer"] = "trainer",
    ) -> None:
        if dtype_policy != "trainer":
            raise ReplayInputError(
                f"dtype_policy {dtype_policy!r}: only 'trainer' keeps replay bit-exact"
            )
        self.layout = layout
        self.shard = shard
        self.spec = spec
        self.boxes: tuple[Box, ...] = layout.shard_boxes(shard)
        known = set(spec.param_names)
        missing = [p.name for p in layout.params if p.name not in known]
        if missing:
            raise ReplayInputError(
                f"layout parameter {missing[0]!r} is in no param group of the optimizer spec"
                f" ({len(missing)} missing)"
            )
        if spec.torch_version is not None and spec.torch_version != torch.__version__:
            logger.warning(
                "optimizer spec recorded torch %s, this shadow runs torch %s: replay is only"
                " bit-exact with the same torch build",
                spec.torch_version,
                torch.__version__,
            )
        self.state_boxes: tuple[Box, ...] = layout.shard_state_boxes(shard)
        #: module state (buffers, frozen parameters), whole tensors
        self._mstate = [
            torch.empty(b.lengths, dtype=_ALL_DTYPES[b.dtype]) for b in self.state_boxes
        ]
        self._dtypes = [TORCH_DTYPES[b.dtype] for b in self.boxes]
        self._params = [
            torch.nn.Parameter(torch.empty(b.lengths, dtype=dt))
            for b, dt in zip(self.boxes, self._dtypes, strict=True)
        ]
        index = {p.name: i for i, p in enumerate(layout.params)}
        #: layout parameter index of each box (COMMIT.no_grad names parameters by it)
        self._box_param = [index[b.name] for b in self.boxes]
        # clip_grad_norm_'s coefficient has the dtype of the total norm: the promotion of all
        # gradient dtypes of the model (torch.stack of the per-tensor norms)
        self._clip_dtype: torch.dtype = functools.reduce(
            torch.promote_types, (TORCH_DTYPES[p.dtype] for p in layout.params)
        )
        by_dtype: dict[torch.dtype, list[int]] = defaultdict(list)
        for i, dt in enumerate(self._dtypes):
            by_dtype[dt].append(i)
        self._by_dtype = [tuple(v) for v in by_dtype.values()]
        self._group_of_box = [spec.group_of(b.name) for b in self.boxes]
        torch_groups: list[dict[str, object]] = []
        self._group_index: list[int] = []  # spec group index of each torch param group
        for g, group in enumerate(spec.groups):
            members = [self._params[i] for i, gi in enumerate(self._group_of_box) if gi == g]
            if members:
                torch_groups.append({"params": members, **group.kwargs(), "lr": 0.0})
                self._group_index.append(g)
        self._opt: torch.optim.Optimizer | None = None
        if torch_groups:
            build: Callable[[list[dict[str, object]]], torch.optim.Optimizer] = (
                spec.optimizer_class()
            )  # every group carries all of its hyperparameters
            self._opt = build(torch_groups)
        self._fused_amp = spec.fused
        self._last_applied: int | None = None
        self._broken = False
        logger.debug(
            "shard %d replayer: %d boxes, %d bytes of parameters, %s",
            shard,
            len(self.boxes),
            layout.shard_bytes(shard),
            spec.type,
        )

    # -- properties ----------------------------------------------------------------------------

    @property
    def last_applied(self) -> int | None:
        """The last iteration applied (``-1``: initial parameters), ``None`` before :meth:`load`."""
        return self._last_applied

    @property
    def nbytes_state(self) -> int:
        """Bytes held now: parameters plus optimizer state (torch creates the state lazily on
        the first step, so a fresh AdamW shard grows to about 3x its parameter bytes)."""
        total = sum(p.nbytes for p in self._params) + sum(t.nbytes for t in self._mstate)
        if self._opt is not None:
            for st in self._opt.state.values():
                total += sum(v.nbytes for v in st.values() if isinstance(v, torch.Tensor))
        return total

    # -- state in and out ----------------------------------------------------------------------

    def load(self, iteration: int, states: Sequence[Mapping[str, torch.Tensor]]) -> None:
        """Replace the whole shard state; afterwards ``last_applied == iteration``.

        ``states`` has one mapping per box (``shard_boxes`` order) with ``"param"`` (box-shaped)
        and either no optimizer state (a fresh optimizer) or exactly the keys torch keeps for the
        box's param group (:meth:`OptimizerSpec.state_keys`), then one ``{"param": tensor}`` per
        module-state box. Tensors are copied; the caller keeps ownership of its own. Everything
        is validated before anything changes.
        """
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < -1:
            raise ReplayInputError(f"iteration must be an int >= -1, got {iteration!r}")
        nbox = len(self.boxes)
        if len(states) != nbox + len(self.state_boxes):
            raise ReplayInputError(
                f"{len(states)} box states for shard {self.shard}, which has"
                f" {nbox + len(self.state_boxes)}"
            )
        for i, (box, st) in enumerate(zip(self.boxes, states[:nbox], strict=True)):
            self._check_box_state(i, box, st)
        mstate = [
            check_state_entry(self.shard, box, st)
            for box, st in zip(self.state_boxes, states[nbox:], strict=True)
        ]
        with torch.no_grad():
            for dst, src in zip(self._mstate, mstate, strict=True):
                dst.copy_(src)
            states = states[:nbox]
            for i, st in enumerate(states):
                p = self._params[i]
                p.copy_(st["param"])
                if self._opt is None:
                    continue
                self._opt.state.pop(p, None)
                fresh: dict[str, torch.Tensor] = {}
                for key, value in st.items():
                    if key == "param":
                        continue
                    if key == "step":
                        fresh[key] = value.detach().to("cpu", copy=True)
                    else:
                        fresh[key] = torch.empty_like(p).copy_(value)
                if fresh:
                    self._opt.state[p] = fresh
        self._last_applied = iteration
        self._broken = False
        logger.info(
            "shard %d loaded at iteration %d (%d boxes)", self.shard, iteration, len(self.boxes)
        )

    def _check_box_state(self, i: int, box: Box, st: Mapping[str, torch.Tensor]) -> None:
        where = f"box {i} ({box_where(box)})"
        if "param" not in st:
            raise ReplayInputError(f"{where}: no 'param' tensor")
        want = set(self.spec.state_keys(self._group_of_box[i]))
        got = set(st) - {"param"}
        if got and got != want:
            raise ReplayInputError(
                f"{where}: optimizer state keys {sorted(got)}, expected {sorted(want)} or none"
            )
        for key, value in st.items():
            if not isinstance(value, torch.Tensor):
                raise ReplayInputError(
                    f"{where}: {key!r} is a {type(value).__name__}, not a tensor"
                )
            if key == "step":
                if value.dim() != 0 or not value.is_floating_point():
                    raise ReplayInputError(
                        f"{where}: 'step' must be a 0-d floating tensor,"
                        f" got shape {tuple(value.shape)} {value.dtype}"
                    )
                continue
            if tuple(value.shape) != box.lengths or value.dtype != self._dtypes[i]:
                raise ReplayInputError(
                    f"{where}: {key!r} is {tuple(value.shape)} {value.dtype},"
                    f" expected {box.lengths} {self._dtypes[i]}"
                )

    def export(
        self, *, copy: bool = True, into: Sequence[BoxState] | None = None
    ) -> list[BoxState]:
        """Per box (``shard_boxes`` order): ``"param"`` and the optimizer state torch holds.

        With ``copy=True`` (default) every tensor is a copy the caller owns: fresh clones, or
        with ``into`` (an earlier export of the same shard that nobody else uses any more) the
        same tensors overwritten, in one pass and without allocating — when its keys, shapes
        and dtypes all match, else it is ignored. With ``copy=False`` the tensors are the live
        ones, detached: the caller must not modify them, and they change at the next
        :meth:`step` or :meth:`load` (cheap, for a caller that serialises them before stepping
        again).
        """
        live: list[BoxState] = []
        for p in self._params:
            st: BoxState = {"param": p.detach()}
            if self._opt is not None:
                st.update(
                    (k, v.detach())
                    for k, v in self._opt.state.get(p, {}).items()
                    if isinstance(v, torch.Tensor)
                )
            live.append(st)
        live.extend({"param": t.detach()} for t in self._mstate)
        if not copy:
            return live
        if into is not None and _same_structure(live, into):
            out = [dict(st) for st in into]
            dsts = [t for st in out for t in st.values()]
            srcs = [st_live[k] for st_live, st in zip(live, out, strict=True) for k in st]
            torch._foreach_copy_(dsts, srcs)
            return out
        return [{k: v.clone() for k, v in st.items()} for st in live]

    # -- the step --------------------------------------------------------------------------------

    def step(
        self,
        iteration: int,
        grads: Sequence[torch.Tensor],
        commit: CommitRecord,
        buffers: Sequence[tuple[int, torch.Tensor]] = (),
    ) -> None:
        """Apply iteration ``iteration`` (must be ``last_applied + 1``).

        ``grads`` holds one tensor per box (box shape and dtype, CPU): the reduced gradient as
        the all-reduce delivered it, before any unscaling or clipping. They are unscaled and
        clipped **in place** and no reference to them is kept after the call. ``buffers``: the
        iteration's module buffers, ``(index into state_boxes, raw bytes)`` (every streamed
        buffer of the shard), copied in as they are. On :class:`ReplayInputError`,
        :class:`ReplayOrderError` or a non-finite check failing, the state is unchanged.
        """
        if self._last_applied is None:
            raise ReplayInputError(f"shard {self.shard}: step before load")
        if self._broken:
            raise ReplayDivergedError(
                f"shard {self.shard}: a previous step failed half-way; load a state first"
            )
        if iteration != self._last_applied + 1:
            raise ReplayOrderError(self._last_applied + 1, iteration)
        scale, coef = self._check_step_input(grads, commit)
        for j, raw in buffers:
            if not 0 <= j < len(self._mstate) or raw.nbytes != self._mstate[j].nbytes:
                raise ReplayInputError(f"shard {self.shard}: bad bytes for module state {j}")
        grads = list(grads)
        skipped = commit.skipped
        explicit = self.spec.scaler_unscale == "explicit"

        if scale is not None and self._fused_amp:
            # GradScaler.step with a fused optimizer calls optimizer.step even when it skips: the
            # kernel gets found_inf (and, without a prior unscale_, the scale) and returns early
            # -- but torch still creates missing state and bumps `step` by 1 - found_inf.
            if explicit:
                found = self._unscale(grads, scale.double().reciprocal().float())
                self._clip(grads, coef)
            else:
                self._clip(grads, coef)
                found = self._unscale(grads, torch.ones((), dtype=torch.float32))
            self._check_found(iteration, found, skipped)
            if skipped:
                self._check_fused_sgd_first_skip(iteration)
            found_inf = torch.full((), 1.0 if skipped else 0.0, dtype=torch.float32)
            self._apply(
                iteration,
                grads,
                commit,
                found_inf=found_inf,
                grad_scale=None if explicit else scale,
            )
        elif skipped:
            pass  # the trainer never called optimizer.step: nothing to do at all
        elif scale is not None:
            if explicit:
                found = self._unscale(grads, scale.double().reciprocal().float())
                self._clip(grads, coef)
            else:
                self._clip(grads, coef)
                found = self._unscale(grads, scale.double().reciprocal().float())
            self._check_found(iteration, found, skipped)
            self._apply(iteration, grads, commit)
        else:
            self._clip(grads, coef)
            self._apply(iteration, grads, commit)
        for j, raw in buffers:  # the buffers after iteration i, whatever the optimizer did
            self._mstate[j].reshape(-1).view(torch.uint8).copy_(raw)
        self._last_applied = iteration
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "shard %d applied iteration %d%s",
                self.shard,
                iteration,
                " (skipped step)" if skipped else "",
            )

    def _check_step_input(
        self, grads: Sequence[torch.Tensor], commit: CommitRecord
    ) -> tuple[torch.Tensor | None, float | None]:
        if not isinstance(commit, CommitRecord):
            raise ReplayInputError(f"commit must be a CommitRecord, got {type(commit).__name__}")
        if len(commit.lrs) != len(self.spec.groups):
            raise ReplayInputError(
                f"COMMIT carries {len(commit.lrs)} learning rates, the"
                f" optimizer has {len(self.spec.groups)} param groups"
            )
        if len(grads) != len(self.boxes):
            raise ReplayInputError(
                f"{len(grads)} gradients for shard {self.shard}, which has {len(self.boxes)} boxes"
            )
        for i, (g, box) in enumerate(zip(grads, self.boxes, strict=True)):
            if (
                not isinstance(g, torch.Tensor)
                or tuple(g.shape) != box.lengths
                or g.dtype != self._dtypes[i]
                or g.device.type != "cpu"
            ):
                got = (
                    f"{tuple(g.shape)} {g.dtype} on {g.device}"
                    if isinstance(g, torch.Tensor)
                    else type(g).__name__
                )
                raise ReplayInputError(
                    f"gradient {i} ({box_where(box)}) is {got}, expected"
                    f" {box.lengths} {self._dtypes[i]} on cpu"
                )
        scale: torch.Tensor | None = None
        if commit.loss_scale is not None:
            s = commit.loss_scale
            if not (math.isfinite(s) and s > 0.0 and _fits(s, torch.float32)):
                raise ReplayInputError(
                    f"COMMIT loss_scale {s!r} is not a positive finite fp32"
                    " value (GradScaler keeps its scale in fp32)"
                )
            scale = torch.tensor(s, dtype=torch.float32)
        coef = commit.clip_coef
        if coef is not None and not _fits(coef, self._clip_dtype):
            raise ReplayInputError(
                f"COMMIT clip_coef {coef!r} is not a {self._clip_dtype}"
                " value (clip_grad_norm_ computes it in the gradients' dtype)"
            )
        return scale, coef

    def _unscale(self, grads: list[torch.Tensor], inv_scale: torch.Tensor) -> bool:
        """GradScaler._unscale_grads_ on CPU; True when a non-finite gradient was found."""
        found = torch.zeros((), dtype=torch.float32)
        for idxs in self._by_dtype:
            torch._amp_foreach_non_finite_check_and_unscale_(
                [grads[i] for i in idxs], found, inv_scale
            )
        return bool(found.item())

    def _clip(self, grads: list[torch.Tensor], coef: float | None) -> None:
        """clip_grad_norm_'s multiply by its clamped coefficient (a no-op when it is 1)."""
        if coef is None or coef == 1.0:
            return
        coef_t = torch.tensor(coef, dtype=self._clip_dtype)
        for idxs in self._by_dtype:
            torch._foreach_mul_([grads[i] for i in idxs], coef_t)

    def _diverged(
        self, iteration: int, reason: str, why: str, level: int = logging.WARNING
    ) -> ReplayDivergedError:
        """Log ``shadow.replay.diverged`` (``reason``: a label) and the error to raise."""
        event(
            logger,
            events.SHADOW_REPLAY_DIVERGED,
            level,
            shard=self.shard,
            iteration=iteration,
            reason=reason,
        )
        return ReplayDivergedError(f"shard {self.shard} iteration {iteration}: {why}")

    def _check_found(self, iteration: int, found: bool, skipped: bool) -> None:
        if found and not skipped:
            raise self._diverged(
                iteration,
                "nonfinite_grad_not_skipped",
                "non-finite gradients, but the COMMIT says the trainer did not skip the step",
            )

    def _check_fused_sgd_first_skip(self, iteration: int) -> None:
        """torch's fused SGD allocates momentum buffers with ``empty_like`` on a first step and
        its kernel returns before writing them when found_inf is set: the trainer is left with
        uninitialised memory that no replay can reproduce."""
        if self.spec.type != "SGD" or self._opt is None:
            return
        for group in self._opt.param_groups:
            if group["momentum"] != 0 and any(
                "momentum_buffer" not in self._opt.state.get(p, {}) for p in group["params"]
            ):
                raise self._diverged(
                    iteration,
                    "fused_sgd_skipped_first_step",
                    "fused SGD skipped its first step under GradScaler; torch leaves the momentum"
                    " buffer uninitialised on the trainer, so it cannot be replayed",
                )

    def _apply(
        self,
        iteration: int,
        grads: list[torch.Tensor],
        commit: CommitRecord,
        *,
        found_inf: torch.Tensor | None = None,
        grad_scale: torch.Tensor | None = None,
    ) -> None:
        opt = self._opt
        if opt is None:
            return
        for group, g in zip(opt.param_groups, self._group_index, strict=True):
            group["lr"] = float(commit.lrs[g])
        amp = found_inf is not None
        try:
            skip = set(commit.no_grad)
            for p, grad, pi in zip(self._params, grads, self._box_param, strict=True):
                # a parameter without a gradient this iteration: torch's optimizer skips it
                # (no decay, no moment update, its step count stays), and so does the replay
                p.grad = None if pi in skip else grad
            if amp:
                # what GradScaler.step hands a fused optimizer
                setattr(opt, "grad_scale", grad_scale)  # noqa: B010
                setattr(opt, "found_inf", found_inf)  # noqa: B010
            opt.step()
        except Exception as exc:
            self._broken = True
            raise self._diverged(
                iteration, "step_failed", f"optimizer step failed: {exc}", logging.ERROR
            ) from exc
        finally:
            for p in self._params:
                p.grad = None
            if amp:
                for attr in ("grad_scale", "found_inf"):
                    if hasattr(opt, attr):
                        delattr(opt, attr)


def _same_structure(a: Sequence[BoxState], b: Sequence[BoxState]) -> bool:
    """Whether two exports have the same boxes, keys (in order), shapes, dtypes and devices."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if list(x) != list(y):
            return False
        for k, t in x.items():
            u = y[k]
            if t.shape != u.shape or t.dtype != u.dtype or t.device != u.device:
                return False
    return True
