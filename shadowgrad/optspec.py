"""What the trainer's optimizer is, so a shadow can replay it bit for bit (docs/replay.md).

An :class:`OptimizerSpec` names the ``torch.optim`` class (``"AdamW"``, ``"Adam"`` or ``"SGD"``)
and, per param group, the fully qualified names of its parameters (as in the
:class:`~shadowgrad.layout.Layout`) and **every hyperparameter of the group except the learning
rate** (the LR of each step travels in the COMMIT record, so any scheduler works). It is built on
the trainer with :meth:`OptimizerSpec.from_optimizer`, travels as canonical JSON
(:meth:`OptimizerSpec.to_json`, :meth:`OptimizerSpec.from_json`) and is consumed by
``shadowgrad.shadow.replay.ShardReplayer``.

Hyperparameters kept per group (torch 2.13 names):

* Adam / AdamW: ``betas`` (two floats), ``eps``, ``weight_decay``, ``amsgrad``, ``maximize``,
  ``foreach``, ``fused``, ``capturable`` (must be false), ``differentiable`` (must be false),
  ``decoupled_weight_decay`` (true for AdamW).
* SGD: ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``, ``maximize``, ``foreach``,
  ``fused``, ``differentiable`` (must be false).

``foreach`` and ``fused`` are stored **resolved** to the implementation the trainer actually ran:
torch treats ``fused=None`` as false and resolves ``foreach=None`` per device (false on CPU,
true on CUDA), and :meth:`from_optimizer` records that answer. A shadow replays that exact
implementation, because the three implementations round differently.

``scaler_unscale`` says how the trainer's ``torch.amp.GradScaler`` unscaled the gradients; it only
matters when a loss scaler is in use:

* ``"explicit"`` (default) -- ``scaler.unscale_(optimizer)`` ran before ``scaler.step`` (the
  recipe for gradient clipping): gradients are multiplied by ``fp32(1 / fp64(scale))``, then
  clipped.
* ``"in_step"`` -- ``scaler.step(optimizer)`` without a prior ``unscale_``: any clipping saw the
  scaled gradients; a fused optimizer then divides by the scale inside its kernel, any other
  optimizer is unscaled by ``scaler.step`` right before stepping. Only for a power-of-two scale
  do the two modes agree bit for bit.

Nothing here imports torch at module import time: the trainer side and the core stay lean.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import math
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

from shadowgrad.errors import KeyedValueError

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "OptSpecError",
    "OptimizerType",
    "ScalerUnscale",
    "HyperValue",
    "ParamGroupSpec",
    "OptimizerSpec",
    "OPTIMIZER_TYPES",
    "state_by_name",
    "load_state_by_name",
]

OptimizerType: TypeAlias = Literal["AdamW", "Adam", "SGD"]
ScalerUnscale: TypeAlias = Literal["explicit", "in_step"]
HyperValue: TypeAlias = float | bool | tuple[float, float]

#: the optimizer classes a shadow can replay exactly
OPTIMIZER_TYPES: tuple[OptimizerType, ...] = ("AdamW", "Adam", "SGD")
_SCALER_UNSCALE: tuple[ScalerUnscale, ...] = ("explicit", "in_step")
_FORMAT = "shadowgrad.optspec/1"

# kind of each hyperparameter: "float" (finite, >= 0 unless noted), "any_float" (finite),
# "bool", "false" (a bool that must be False), "betas" (two floats in [0, 1))
_ADAM_HYPER: Mapping[str, str] = {
    "betas": "betas",
    "eps": "float",
    "weight_decay": "float",
    "amsgrad": "bool",
    "maximize": "bool",
    "foreach": "bool",
    "fused": "bool",
    "capturable": "false",
    "differentiable": "false",
    "decoupled_weight_decay": "bool",
}
_SGD_HYPER: Mapping[str, str] = {
    "momentum": "float",
    "dampening": "any_float",
    "weight_decay": "float",
    "nesterov": "bool",
    "maximize": "bool",
    "foreach": "bool",
    "fused": "bool",
    "differentiable": "false",
}
_HYPER: Mapping[str, Mapping[str, str]] = {
    "AdamW": _ADAM_HYPER,
    "Adam": _ADAM_HYPER,
    "SGD": _SGD_HYPER,
}
# group keys that are not hyperparameters and that a shadow does not need
_NOT_HYPER = frozenset({"params", "lr", "initial_lr"})


class OptSpecError(KeyedValueError):
    """An optimizer spec is invalid or describes an optimizer that cannot be replayed exactly.

    ``key`` is the path of the offending key (``"groups[1].hyper.eps"``, ``"type"``), ``value``
    the bad value as found (``None`` when missing).
    """


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_hyper(key: str, kind: str, value: object) -> HyperValue:
    """Validate one hyperparameter; return its canonical value (ints become floats)."""
    if kind in ("bool", "false"):
        if not isinstance(value, bool):
            raise OptSpecError(key, value, "must be a bool")
        if kind == "false" and value:
            raise OptSpecError(key, value, "not supported by shadow replay (must be false)")
        return value
    if kind == "betas":
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 2
            or not all(_is_number(b) for b in value)
        ):
            raise OptSpecError(key, value, "must be two numbers (tensors are not supported)")
        b1, b2 = float(value[0]), float(value[1])
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise OptSpecError(key, value, "betas must lie in [0, 1)")
        return (b1, b2)
    if not _is_number(value):
        raise OptSpecError(key, value, "must be a number (tensors are not supported)")
    number = float(cast(float, value))
    if not math.isfinite(number):
        raise OptSpecError(key, value, "must be finite")
    if kind == "float" and number < 0.0:
        raise OptSpecError(key, value, "must be >= 0")
    return number


@dataclass(frozen=True)
class ParamGroupSpec:
    """One param group: parameter names (fully qualified) and its hyperparameters except lr."""

    params: tuple[str, ...]
    hyper: Mapping[str, HyperValue] = field(hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "hyper", types.MappingProxyType(dict(self.hyper)))

    def kwargs(self) -> dict[str, HyperValue]:
        """The hyperparameters as a plain dict (for a ``torch.optim`` param group)."""
        return dict(self.hyper)


def _validate_group(
    opt_type: OptimizerType, index: int, group: ParamGroupSpec, seen: dict[str, int]
) -> ParamGroupSpec:
    where = f"groups[{index}]"
    if not isinstance(group, ParamGroupSpec):
        raise OptSpecError(where, group, "must be a ParamGroupSpec")
    for j, name in enumerate(group.params):
        if not isinstance(name, str) or not name:
            raise OptSpecError(f"{where}.params[{j}]", name, "must be a non-empty string")
        if name in seen:
            raise OptSpecError(
                f"{where}.params[{j}]", name, f"parameter already in groups[{seen[name]}]"
            )
        seen[name] = index
    schema = _HYPER[opt_type]
    unknown = sorted(set(group.hyper) - set(schema))
    if unknown:
        raise OptSpecError(
            f"{where}.hyper.{unknown[0]}",
            group.hyper[unknown[0]],
            f"unknown hyperparameter for {opt_type} (known: {', '.join(sorted(schema))})",
        )
    canon: dict[str, HyperValue] = {}
    for key, kind in schema.items():
        if key not in group.hyper:
            raise OptSpecError(f"{where}.hyper.{key}", None, f"required for {opt_type}")
        canon[key] = _check_hyper(f"{where}.hyper.{key}", kind, group.hyper[key])
    if canon["fused"] and canon["foreach"]:
        raise OptSpecError(f"{where}.hyper.foreach", True, "fused and foreach cannot both be true")
    if opt_type == "AdamW" and not canon["decoupled_weight_decay"]:
        raise OptSpecError(
            f"{where}.hyper.decoupled_weight_decay", False, "AdamW always decouples weight decay"
        )
    if (
        opt_type == "SGD"
        and canon["nesterov"]
        and (cast(float, canon["momentum"]) <= 0.0 or canon["dampening"] != 0.0)
    ):
        raise OptSpecError(
            f"{where}.hyper.nesterov", True, "nesterov needs momentum > 0 and dampening == 0"
        )
    return ParamGroupSpec(group.params, canon)


@dataclass(frozen=True)
class OptimizerSpec:
    """The trainer's optimizer, as a shadow needs it to replay every step exactly.

    ``type`` is the ``torch.optim`` class name; ``groups`` the param groups in the optimizer's
    order (the COMMIT record's ``lrs`` follow this order); ``scaler_unscale`` how a GradScaler
    unscaled (see the module docstring); ``torch_version`` the trainer's torch, or ``None`` when
    unknown. Construction validates everything and raises :class:`OptSpecError`.
    """

    type: OptimizerType
    groups: tuple[ParamGroupSpec, ...]
    scaler_unscale: ScalerUnscale = "explicit"
    torch_version: str | None = None
    _group_of: Mapping[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.type not in OPTIMIZER_TYPES:
            raise OptSpecError(
                "type",
                self.type,
                f"cannot replay this optimizer (supported: {', '.join(OPTIMIZER_TYPES)})",
            )
        if not isinstance(self.groups, (list, tuple)) or not self.groups:
            raise OptSpecError("groups", self.groups, "must be a non-empty list of param groups")
        if self.scaler_unscale not in _SCALER_UNSCALE:
            raise OptSpecError(
                "scaler_unscale",
                self.scaler_unscale,
                f"must be one of {', '.join(_SCALER_UNSCALE)}",
            )
        if self.torch_version is not None and (
            not isinstance(self.torch_version, str) or not self.torch_version
        ):
            raise OptSpecError("torch_version", self.torch_version, "must be a non-empty string")
        seen: dict[str, int] = {}
        groups = tuple(_validate_group(self.type, i, g, seen) for i, g in enumerate(self.groups))
        for i, g in enumerate(groups):
            if g.hyper["fused"] != groups[0].hyper["fused"]:
                raise OptSpecError(
                    f"groups[{i}].hyper.fused",
                    g.hyper["fused"],
                    "all param groups must agree on fused (as GradScaler assumes)",
                )
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "_group_of", types.MappingProxyType(seen))

    # -- queries -------------------------------------------------------------------------------

    @property
    def param_names(self) -> tuple[str, ...]:
        """Every parameter name, group by group."""
        return tuple(n for g in self.groups for n in g.params)

    def group_of(self, name: str) -> int:
        """Index of the param group holding parameter ``name``."""
        try:
            return self._group_of[name]
        except KeyError:
            raise OptSpecError("groups", name, "parameter is in no param group") from None

    def state_keys(self, group: int) -> tuple[str, ...]:
        """The per-parameter optimizer state keys torch keeps for ``group`` after a step."""
        hyper = self.groups[group].hyper
        if self.type == "SGD":
            return ("momentum_buffer",) if cast(float, hyper["momentum"]) != 0.0 else ()
        keys = ("step", "exp_avg", "exp_avg_sq")
        return (*keys, "max_exp_avg_sq") if hyper["amsgrad"] else keys

    @property
    def fused(self) -> bool:
        """True when the optimizer uses the fused kernel (all groups agree)."""
        return bool(self.groups[0].hyper["fused"])

    def optimizer_class(self) -> builtins.type[torch.optim.Optimizer]:
        """The ``torch.optim`` class to build."""
        import torch

        cls: builtins.type[torch.optim.Optimizer] = getattr(torch.optim, self.type)
        return cls

    # -- serialisation -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "type": self.type,
            "scaler_unscale": self.scaler_unscale,
            "torch_version": self.torch_version,
            "groups": [
                {
                    "params": list(g.params),
                    "hyper": {
                        k: list(v) if isinstance(v, tuple) else v
                        for k, v in sorted(g.hyper.items())
                    },
                }
                for g in self.groups
            ],
        }

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no whitespace, shortest round-trip floats)."""
        return json.dumps(
            self.to_dict(),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=True,
            allow_nan=False,
        )

    @property
    def digest(self) -> str:
        """SHA-256 of :meth:`to_json` (hex)."""
        return hashlib.sha256(self.to_json().encode("ascii")).hexdigest()

    @classmethod
    def from_json(cls, text: str | bytes) -> OptimizerSpec:
        """Parse and fully validate :meth:`to_json` output."""
        try:
            doc = json.loads(text)
        except (ValueError, TypeError) as exc:
            raise OptSpecError("<json>", None, f"does not parse: {exc}") from None
        return cls.from_dict(doc)

    @classmethod
    def from_dict(cls, doc: object) -> OptimizerSpec:
        want = {"format", "type", "scaler_unscale", "torch_version", "groups"}
        if not isinstance(doc, dict):
            raise OptSpecError("<root>", doc, "must be an object")
        unknown, missing = sorted(set(doc) - want), sorted(want - set(doc))
        if unknown:
            raise OptSpecError(
                unknown[0], doc[unknown[0]], f"unknown key (known: {', '.join(sorted(want))})"
            )
        if missing:
            raise OptSpecError(missing[0], None, "required")
        if doc["format"] != _FORMAT:
            raise OptSpecError("format", doc["format"], f"expected {_FORMAT!r}")
        raw = doc["groups"]
        if not isinstance(raw, list) or not raw:
            raise OptSpecError("groups", raw, "must be a non-empty list")
        groups: list[ParamGroupSpec] = []
        for i, g in enumerate(raw):
            if not isinstance(g, dict) or set(g) != {"params", "hyper"}:
                keys = sorted(g) if isinstance(g, dict) else g
                raise OptSpecError(f"groups[{i}]", keys, "must have exactly keys hyper, params")
            if not isinstance(g["params"], list):
                raise OptSpecError(f"groups[{i}].params", g["params"], "must be a list of names")
            if not isinstance(g["hyper"], dict):
                raise OptSpecError(f"groups[{i}].hyper", g["hyper"], "must be an object")
            groups.append(ParamGroupSpec(tuple(g["params"]), g["hyper"]))
        return cls(doc["type"], tuple(groups), doc["scaler_unscale"], doc["torch_version"])

    # -- from a live optimizer -----------------------------------------------------------------

    @classmethod
    def from_optimizer(
        cls,
        optimizer: torch.optim.Optimizer,
        named_parameters: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        *,
        scaler_unscale: ScalerUnscale = "explicit",
    ) -> OptimizerSpec:
        """Describe ``optimizer``; ``named_parameters`` names its tensors, typically
        ``model.named_parameters()`` (a tensor listed under several names keeps the first).

        Raises :class:`OptSpecError` for an optimizer that cannot be replayed exactly: another
        class (subclasses included), a tensor learning rate or hyperparameter, ``capturable``,
        ``differentiable``, an unknown hyperparameter, or a parameter without a name.
        """
        import torch

        opt_type = next(
            (t for t in OPTIMIZER_TYPES if type(optimizer) is getattr(torch.optim, t)), None
        )
        if opt_type is None:
            raise OptSpecError(
                "type",
                type(optimizer).__qualname__,
                "cannot replay this optimizer class exactly (supported:"
                f" {', '.join('torch.optim.' + t for t in OPTIMIZER_TYPES)})",
            )
        schema = _HYPER[opt_type]
        extra = sorted(set(optimizer.defaults) - set(schema) - _NOT_HYPER)
        if extra:
            raise OptSpecError(
                f"defaults.{extra[0]}",
                optimizer.defaults[extra[0]],
                "hyperparameter unknown to shadow replay (newer torch?)",
            )
        items = (
            named_parameters.items() if isinstance(named_parameters, Mapping) else named_parameters
        )
        name_of: dict[int, str] = {}
        for name, tensor in items:
            name_of.setdefault(id(tensor), name)
        groups: list[ParamGroupSpec] = []
        for i, group in enumerate(optimizer.param_groups):
            where = f"groups[{i}]"
            params: list[torch.Tensor] = list(group["params"])
            names: list[str] = []
            for j, p in enumerate(params):
                if id(p) not in name_of:
                    raise OptSpecError(
                        f"{where}.params[{j}]",
                        tuple(p.shape),
                        "parameter has no name in named_parameters",
                    )
                names.append(name_of[id(p)])
            if isinstance(group.get("lr"), torch.Tensor):
                raise OptSpecError(
                    f"{where}.lr",
                    group["lr"],
                    "a tensor learning rate is not supported (use a float)",
                )
            hyper: dict[str, Any] = {}
            for key in schema:
                if key not in group:
                    raise OptSpecError(
                        f"{where}.hyper.{key}", None, "missing from the optimizer's param group"
                    )
                value = group[key]
                if isinstance(value, torch.Tensor) or (
                    isinstance(value, (tuple, list))
                    and any(isinstance(v, torch.Tensor) for v in value)
                ):
                    raise OptSpecError(
                        f"{where}.hyper.{key}", value, "tensor hyperparameters are not supported"
                    )
                hyper[key] = value
            # record the implementation torch actually runs
            fused = bool(hyper["fused"])
            foreach = hyper["foreach"]
            if fused:
                foreach = False
            elif foreach is None:
                foreach = _default_foreach(params, bool(hyper["differentiable"]))
            hyper["fused"], hyper["foreach"] = fused, bool(foreach)
            groups.append(ParamGroupSpec(tuple(names), hyper))
        return cls(opt_type, tuple(groups), scaler_unscale, torch.__version__)


def _default_foreach(params: list[torch.Tensor], differentiable: bool) -> bool:
    """What torch resolves ``foreach=None`` to for these parameters (fused left unset)."""
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach
    except ImportError:  # pragma: no cover - private torch API moved: CUDA-only foreach default
        return not differentiable and all(p.device.type == "cuda" for p in params)
    return bool(_default_to_fused_or_foreach(params, differentiable, use_fused=False)[1])


# ---------------------------------------------------------------------------------------------
# optimizer state by parameter name (trainer side: bootstrap a shadow, restore from one)
# ---------------------------------------------------------------------------------------------


def _names_by_id(
    named_parameters: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> dict[int, str]:
    items = named_parameters.items() if isinstance(named_parameters, Mapping) else named_parameters
    out: dict[int, str] = {}
    for name, tensor in items:
        out.setdefault(id(tensor), name)
    return out


def state_by_name(
    optimizer: torch.optim.Optimizer,
    named_parameters: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> dict[str, dict[str, torch.Tensor]]:
    """``optimizer.state`` keyed by parameter name (live tensors, not copies); parameters
    without state are left out, ``None`` values are dropped."""
    import torch

    name_of = _names_by_id(named_parameters)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p)
            if not st:
                continue
            if id(p) not in name_of:
                raise OptSpecError(
                    "params", tuple(p.shape), "parameter has no name in named_parameters"
                )
            out[name_of[id(p)]] = {k: v for k, v in st.items() if isinstance(v, torch.Tensor)}
    return out


def load_state_by_name(
    optimizer: torch.optim.Optimizer,
    named_parameters: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    state: Mapping[str, Mapping[str, torch.Tensor]],
    *,
    copy: bool = True,
) -> None:
    """Load per-name optimizer ``state`` into ``optimizer`` (its param groups, hyperparameters
    and LRs are kept) through ``optimizer.load_state_dict``, which casts and places the tensors
    as torch does on a normal resume. Parameters absent from ``state`` start fresh.
    ``copy=False``: the optimizer takes the given tensors themselves where their dtype and
    device already fit (a caller that built them for it)."""
    name_of = _names_by_id(named_parameters)
    sd = optimizer.state_dict()
    index = 0
    new_state: dict[int, dict[str, torch.Tensor]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = name_of.get(id(p))
            if name is None:
                raise OptSpecError(
                    "params", tuple(p.shape), "parameter has no name in named_parameters"
                )
            if name in state:
                new_state[index] = {k: v.clone() if copy else v for k, v in state[name].items()}
            index += 1
    unknown = sorted(
        set(state)
        - {name_of[id(p)] for g in optimizer.param_groups for p in g["params"] if id(p) in name_of}
    )
    if unknown:
        raise OptSpecError("state", unknown[0], "names no parameter of this optimizer")
    sd["state"] = new_state
    optimizer.load_state_dict(sd)
