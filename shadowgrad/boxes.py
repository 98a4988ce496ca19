"""Box states: one shard's slice of a trainer's full state, and back (shared contract).

A box (``Layout.shard_boxes(shard)``) is a row range of one parameter; its *state* is
``{"param": rows, <torch optimizer state key>: rows or a 0-d scalar}``. The trainer hooks cut
their live state into box states to bootstrap or re-seed a shadow
(:func:`box_states_from_full`); a restore, the controller's export and the tests glue the exports
of all shards back into full tensors (:func:`assemble_full`). The shadow's optimizer replay
(``shadowgrad.shadow.replay``) keeps its state in the same form and re-exports these names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from shadowgrad.errors import ShadowgradError
from shadowgrad.layout import Box, Layout
from shadowgrad.torch_dtypes import LAYOUT_TORCH_DTYPES

__all__ = [
    "ReplayError",
    "ReplayInputError",
    "BoxState",
    "box_rows",
    "box_where",
    "box_states_from_full",
    "assemble_full",
]

#: one box's state: ``"param"`` plus the torch optimizer state keys
BoxState = dict[str, torch.Tensor]


class ReplayError(ShadowgradError, RuntimeError):
    """Base class of the replay errors."""


class ReplayInputError(ReplayError, ValueError):
    """Bad input: wrong number, shape or dtype of tensors, bad state keys, a COMMIT that does not
    fit the spec (group count, a scale not representable in fp32, ...). Nothing was changed."""


def box_rows(tensor: torch.Tensor, box: Box) -> torch.Tensor:
    """The box's rows of a full tensor (a view); the tensor itself for a 0-d box."""
    if not box.offsets:
        return tensor
    return tensor.narrow(0, box.offsets[0], box.lengths[0])


def box_where(box: Box) -> str:
    """The box for a message: ``'name'`` or ``'name' rows [a, b)``."""
    if not box.offsets:
        return repr(box.name)
    return f"{box.name!r} rows [{box.offsets[0]}, {box.offsets[0] + box.lengths[0]})"


def box_states_from_full(
    layout: Layout,
    shard: int,
    model_state: Mapping[str, torch.Tensor],
    optim_state: Mapping[str, Mapping[str, torch.Tensor | None]] | None = None,
) -> list[BoxState]:
    """Cut a trainer's full state into the box states of ``shard`` (for a shadow's
    ``ShardReplayer.load``, locally or through the control protocol's ``load``).

    ``model_state`` maps parameter names to full tensors (``model.state_dict()`` or
    ``dict(model.named_parameters())``); ``optim_state`` maps names to that parameter's torch
    optimizer state (:func:`shadowgrad.optspec.state_by_name`); a name without state, or
    ``optim_state=None``, means a fresh optimizer. Tensors shaped like the parameter are cut to
    the box's rows, 0-d ones (``step``) are shared by every box; ``None`` values are dropped.
    The results are **views** of the inputs (``load`` copies them).
    """
    optim_state = optim_state or {}
    out: list[BoxState] = []
    for box in layout.shard_boxes(shard):
        spec_shape = layout.placement(box.name).spec.shape
        full = model_state.get(box.name)
        if not isinstance(full, torch.Tensor):
            raise ReplayInputError(f"model state has no tensor for parameter {box.name!r}")
        if tuple(full.shape) != spec_shape:
            raise ReplayInputError(
                f"model state {box.name!r} has shape {tuple(full.shape)},"
                f" the layout says {spec_shape}"
            )
        st: BoxState = {"param": box_rows(full.detach(), box)}
        for key, value in (optim_state.get(box.name) or {}).items():
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise ReplayInputError(
                    f"optimizer state {box.name!r}.{key} is a {type(value).__name__}, not a tensor"
                )
            if tuple(value.shape) == spec_shape:
                st[key] = box_rows(value.detach(), box)
            elif value.dim() == 0:
                st[key] = value.detach()
            else:
                raise ReplayInputError(
                    f"optimizer state {box.name!r}.{key} has shape {tuple(value.shape)}: neither"
                    f" the parameter's {spec_shape} nor a scalar"
                )
        out.append(st)
    return out


def assemble_full(
    layout: Layout, per_shard_exports: Sequence[Sequence[Mapping[str, torch.Tensor]]]
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Glue the ``ShardReplayer.export`` of every shard (index = shard) into full tensors.

    Returns ``(params_by_name, optim_state_by_name)``; a parameter whose boxes hold no optimizer
    state is absent from the second. Raises :class:`ReplayError` when the boxes of a tensor
    disagree: different state keys, or different 0-d values (``step``).
    """
    if len(per_shard_exports) != layout.num_shards:
        raise ReplayInputError(
            f"{len(per_shard_exports)} shard exports, the layout has {layout.num_shards} shards"
        )
    params = {
        p.name: torch.empty(p.shape, dtype=LAYOUT_TORCH_DTYPES[p.dtype]) for p in layout.params
    }
    states: dict[str, dict[str, torch.Tensor]] = {}
    keys_of: dict[str, tuple[set[str], Box]] = {}
    for shard, export in enumerate(per_shard_exports):
        boxes = layout.shard_boxes(shard)
        if len(export) != len(boxes):
            raise ReplayInputError(
                f"shard {shard} export has {len(export)} boxes, the layout has {len(boxes)}"
            )
        for box, st in zip(boxes, export, strict=True):
            full = params[box.name]
            piece = st.get("param")
            if not isinstance(piece, torch.Tensor) or tuple(piece.shape) != box.lengths:
                raise ReplayInputError(
                    f"shard {shard} box {box_where(box)}: bad or missing 'param'"
                )
            box_rows(full, box).copy_(piece)
            keys = set(st) - {"param"}
            first = keys_of.setdefault(box.name, (keys, box))
            if first[0] != keys:
                raise ReplayError(
                    f"boxes of {box.name!r} disagree on optimizer state: {box_where(first[1])} has"
                    f" {sorted(first[0])}, {box_where(box)} has {sorted(keys)}"
                )
            tstate = states.setdefault(box.name, {}) if keys else {}
            for key in keys:
                value = st[key]
                if box.lengths and value.dim() == 0:  # a scalar shared by all boxes ("step")
                    prev = tstate.get(key)
                    if prev is None:
                        tstate[key] = value.detach().clone()
                    elif not torch.equal(prev, value):
                        raise ReplayError(
                            f"boxes of {box.name!r} disagree on {key!r}: {prev.item()} vs"
                            f" {value.item()} ({box_where(box)})"
                        )
                elif tuple(value.shape) == box.lengths:
                    if key not in tstate:
                        tstate[key] = torch.empty(full.shape, dtype=value.dtype)
                    box_rows(tstate[key], box).copy_(value)
                else:
                    raise ReplayInputError(
                        f"shard {shard} box {box_where(box)}: state {key!r} has"
                        f" shape {tuple(value.shape)}"
                    )
    return params, states
