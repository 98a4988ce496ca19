"""The ``torch.dtype`` side of the one dtype table (:mod:`shadowgrad.dtypes`).

Indexes over :data:`shadowgrad.dtypes.DTYPES`, built once here; modules alias these objects
instead of keeping their own copies (``tests/test_contracts.py`` checks identity). Separate from
:mod:`shadowgrad.dtypes` only so that the layout and wire modules stay free of torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

from shadowgrad.dtypes import DTYPES, LAYOUT_ITEMSIZE, DType, UnknownDTypeError, _lookup

__all__ = [
    "TORCH_DTYPES",
    "LAYOUT_TORCH_DTYPES",
    "DTYPE_NAMES",
    "GRAD_WIRE_DTYPES",
    "torch_dtype",
    "layout_torch_dtype",
    "dtype_name",
]


def _torch(name: str) -> torch.dtype:
    dt = getattr(torch, name)
    if not isinstance(dt, torch.dtype):  # pragma: no cover - a table edit gone wrong
        raise AssertionError(f"torch.{name} is not a dtype")
    return dt


#: every dtype of the table: name -> torch dtype (what tensor streams and snapshots carry)
TORCH_DTYPES: Mapping[str, torch.dtype] = MappingProxyType({name: _torch(name) for name in DTYPES})

#: the layout (parameter / gradient) dtypes: name -> torch dtype
LAYOUT_TORCH_DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {name: TORCH_DTYPES[name] for name in LAYOUT_ITEMSIZE}
)

#: torch dtype -> name, for every dtype of the table
DTYPE_NAMES: Mapping[torch.dtype, str] = MappingProxyType(
    {dt: name for name, dt in TORCH_DTYPES.items()}
)


def _grad_wire() -> dict[torch.dtype, DType]:
    out: dict[torch.dtype, DType] = {}
    for name, dt in LAYOUT_TORCH_DTYPES.items():
        code = DTYPES[name].wire
        if code is None:  # pragma: no cover - a table edit gone wrong
            raise AssertionError(f"layout dtype {name} has no wire code")
        out[dt] = code
    return out


#: wire code of every gradient (layout) dtype, by torch dtype: what the transport may send
GRAD_WIRE_DTYPES: Mapping[torch.dtype, DType] = MappingProxyType(_grad_wire())


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` -> ``torch.float32`` for any dtype of the table (UnknownDTypeError)."""
    return _lookup(TORCH_DTYPES, name)


def layout_torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` -> ``torch.float32`` for a layout dtype only (UnknownDTypeError)."""
    return _lookup(LAYOUT_TORCH_DTYPES, name, layout=True)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (UnknownDTypeError for a dtype not in the table)."""
    try:
        return DTYPE_NAMES[dtype]
    except (KeyError, TypeError):
        raise UnknownDTypeError(
            f"dtype {dtype} is not one shadowgrad handles (supported: {', '.join(TORCH_DTYPES)})"
        ) from None
