"""The one dtype table of the project: every element type shadowgrad handles, and its names.

:data:`DTYPES` maps a dtype's name (the name a layout, a tensor stream and a snapshot manifest use,
which is also the ``torch`` attribute name: ``"float32"``) to its :class:`DTypeInfo`: itemsize,
wire code (:class:`DType`, the DATA header's ``dtype`` field, ``None`` for a dtype that never
travels in a DATA message) and whether a :class:`~shadowgrad.layout.Layout` accepts it as a
parameter / gradient dtype. Every other dtype mapping of the project is an index over this table
built here once (:data:`LAYOUT_ITEMSIZE`, :data:`WIRE_ITEMSIZE`) or in
:mod:`shadowgrad.torch_dtypes` (the ``torch.dtype`` side); modules alias these objects instead of
keeping copies (``tests/test_contracts.py`` checks identity).

Standard library only, like :mod:`shadowgrad.wire` and :mod:`shadowgrad.layout` that use it: the
torch side lives in :mod:`shadowgrad.torch_dtypes`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from shadowgrad.errors import BadFieldError, ShadowgradError

__all__ = [
    "DType",
    "DTypeInfo",
    "DTYPES",
    "LAYOUT_ITEMSIZE",
    "WIRE_ITEMSIZE",
    "BY_CODE",
    "UnknownDTypeError",
    "dtype_info",
    "layout_itemsize",
    "wire_code",
]

_V = TypeVar("_V")


class DType(enum.IntEnum):
    """Element type of a DATA payload (header field ``dtype``); ``NONE`` for the other kinds.

    The codes are part of the wire format (``p4/include/headers.p4`` is tested against them);
    :mod:`shadowgrad.wire` re-exports this class."""

    NONE = 0
    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3
    FLOAT64 = 4
    UINT8 = 5

    @property
    def itemsize(self) -> int:
        return WIRE_ITEMSIZE[self]

    @property
    def torch_name(self) -> str:
        """Name of the matching ``torch`` dtype attribute (``"float32"`` ...)."""
        return self.name.lower()

    @classmethod
    def from_name(cls, name: str) -> DType:
        """``"float32"``, ``"torch.float32"`` or ``"FLOAT32"`` → :class:`DType`."""
        key = name.rsplit(".", 1)[-1].upper()
        try:
            return cls[key]
        except KeyError:
            raise BadFieldError(f"dtype {name!r} has no wire code") from None


@dataclass(frozen=True)
class DTypeInfo:
    """One supported dtype: ``name`` (layout / stream / ``torch`` attribute name), ``itemsize``
    in bytes, ``wire`` code (None: never a DATA payload) and ``layout`` (a parameter / gradient
    dtype that a layout accepts and the optimizer replay handles)."""

    name: str
    itemsize: int
    wire: DType | None
    layout: bool


class UnknownDTypeError(ShadowgradError, ValueError):
    """A dtype name that the table does not have, or that lacks what the caller needs."""


#: every dtype shadowgrad handles, by name; layout dtypes first, in the order error messages list
#: them. Tensor streams and snapshots carry all of them (optimizer state: ``step`` counters, ...)
DTYPES: Mapping[str, DTypeInfo] = MappingProxyType(
    {
        info.name: info
        for info in (
            DTypeInfo("float32", 4, DType.FLOAT32, True),
            DTypeInfo("float16", 2, DType.FLOAT16, True),
            DTypeInfo("bfloat16", 2, DType.BFLOAT16, True),
            DTypeInfo("float64", 8, DType.FLOAT64, True),
            DTypeInfo("int64", 8, None, False),
            DTypeInfo("int32", 4, None, False),
            DTypeInfo("uint8", 1, DType.UINT8, False),
            DTypeInfo("bool", 1, None, False),
        )
    }
)

#: itemsize in bytes of every dtype a layout accepts (``shadowgrad.layout.DTYPE_ITEMSIZE``)
LAYOUT_ITEMSIZE: Mapping[str, int] = MappingProxyType(
    {name: info.itemsize for name, info in DTYPES.items() if info.layout}
)

#: itemsize of every wire code; ``NONE`` (a message without a dtype) counts as 1
WIRE_ITEMSIZE: Mapping[DType, int] = MappingProxyType(
    {
        DType.NONE: 1,
        **{info.wire: info.itemsize for info in DTYPES.values() if info.wire is not None},
    }
)

#: the member of every wire code (a header's ``dtype`` field as read): a lookup, where
#: ``DType(code)`` is an enum call per datagram
BY_CODE: Mapping[int, DType] = MappingProxyType({int(d): d for d in DType})

if set(WIRE_ITEMSIZE) != set(DType):  # pragma: no cover - a table edit gone wrong
    raise AssertionError(f"wire codes without a table entry: {set(DType) - set(WIRE_ITEMSIZE)}")


def _lookup(table: Mapping[str, _V], name: str, *, layout: bool = False) -> _V:
    """``table[name]`` for an index by dtype name (here and :mod:`shadowgrad.torch_dtypes`);
    :class:`UnknownDTypeError` naming the supported ones (``layout``: a layout dtypes' index)."""
    try:
        return table[name]
    except (KeyError, TypeError):
        what = f"dtype {name!r} is not a layout dtype" if layout else f"unknown dtype {name!r}"
        raise UnknownDTypeError(f"{what} (supported: {', '.join(table)})") from None


def dtype_info(name: str) -> DTypeInfo:
    """The table entry of ``name`` (``"float32"``); :class:`UnknownDTypeError` if none."""
    return _lookup(DTYPES, name)


def layout_itemsize(name: str) -> int:
    """Itemsize of a layout dtype; :class:`UnknownDTypeError` for any other name."""
    return _lookup(LAYOUT_ITEMSIZE, name, layout=True)


def wire_code(name: str) -> DType:
    """Wire code of ``name``; :class:`UnknownDTypeError` if unknown or it has none."""
    code = dtype_info(name).wire
    if code is None:
        raise UnknownDTypeError(f"dtype {name!r} has no wire code")
    return code
