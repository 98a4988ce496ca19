"""Semantic types of the checked subset."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import ast as A  # noqa: N812


class Ty:
    def __str__(self) -> str:  # pragma: no cover - overridden
        return type(self).__name__


@dataclass(frozen=True)
class BitT(Ty):
    width: int
    signed: bool = False

    def __str__(self) -> str:
        return f"{'int' if self.signed else 'bit'}<{self.width}>"


@dataclass(frozen=True)
class VarbitT(Ty):
    """``varbit<max_width>``: a value is ``(value, nbits)`` at run time (``nbits`` <=
    ``max_width``, set by ``extract(h, nbits)``); two are equal when both parts are."""

    max_width: int

    def __str__(self) -> str:
        return f"varbit<{self.max_width}>"


@dataclass(frozen=True)
class IntLitT(Ty):
    def __str__(self) -> str:
        return "int"


@dataclass(frozen=True)
class BoolT(Ty):
    def __str__(self) -> str:
        return "bool"


@dataclass(frozen=True)
class StrT(Ty):
    def __str__(self) -> str:
        return "string"


@dataclass(frozen=True)
class VoidT(Ty):
    def __str__(self) -> str:
        return "void"


@dataclass(frozen=True)
class ErrorT(Ty):
    def __str__(self) -> str:
        return "error"


@dataclass(eq=False)
class EnumT(Ty):
    name: str
    members: dict[str, int]
    underlying: BitT | None

    def __str__(self) -> str:
        return f"enum {self.name}"


@dataclass(eq=False)
class StructT(Ty):
    """A header (``is_header``) or a struct. A header's ``width`` leaves out its varbit field
    (the header's minimum size)."""

    name: str
    is_header: bool
    fields: list[tuple[str, Ty]] = field(default_factory=list)
    field_anns: dict[str, list[A.Annotation]] = field(default_factory=dict)
    annotations: list[A.Annotation] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{'header' if self.is_header else 'struct'} {self.name}"

    def field(self, name: str) -> Ty | None:
        for n, t in self.fields:
            if n == name:
                return t
        return None

    @property
    def varbit(self) -> tuple[str, VarbitT] | None:
        """A header's varbit field (its name and type), if it has one."""
        for n, t in self.fields:
            if isinstance(t, VarbitT):
                return n, t
        return None

    def leaves(self) -> list[tuple[tuple[str, ...], Ty]]:
        """The fields with those of nested structs (not headers) spelled out, as (path, type)
        in order: a header's bits on the wire."""
        out: list[tuple[tuple[str, ...], Ty]] = []
        for n, t in self.fields:
            if isinstance(t, StructT) and not t.is_header:
                out.extend(((n, *p), lt) for p, lt in t.leaves())
            else:
                out.append(((n,), t))
        return out

    @property
    def width(self) -> int:
        leaves = [t for _, t in self.leaves()]
        return (
            sum(t.width for t in leaves if isinstance(t, BitT))
            + sum(t.underlying.width for t in leaves if isinstance(t, EnumT) and t.underlying)
            + sum(1 for t in leaves if isinstance(t, BoolT))
        )


@dataclass(eq=False)
class StackT(StructT):
    """A header stack ``elem[size]``: held as a struct of ``size`` headers (fields ``e0`` ..)
    and its ``nextIndex`` (field ``nidx``, bit<32>)."""

    elem: StructT | None = None
    size: int = 0

    def __str__(self) -> str:
        return f"{self.elem}[{self.size}]"


@dataclass(eq=False)
class TupleT(StructT):
    """``tuple<T1, ...>``: held as a struct of its elements (fields ``f0`` ..), read by a
    constant index. ``index``: the program's n-th distinct tuple type (a name for it)."""

    index: int = 0

    def __str__(self) -> str:
        return "tuple<" + ", ".join(str(t) for _, t in self.fields) + ">"


@dataclass(eq=False)
class UnionT(StructT):
    """A ``header_union``: held as a struct of its member headers, at most one of them valid
    (making one valid invalidates the others, as bmv2 does)."""

    def __str__(self) -> str:
        return f"header_union {self.name}"


@dataclass(eq=False)
class ExternT(Ty):
    name: str
    args: list[Ty] = field(default_factory=list)

    def __str__(self) -> str:
        return f"extern {self.name}"


@dataclass(eq=False)
class ListT(Ty):
    items: list[Ty]

    def __str__(self) -> str:
        return "{" + ", ".join(map(str, self.items)) + "}"


@dataclass(eq=False)
class ApplyT(Ty):
    """The result of ``t.apply()``."""

    table: object

    def __str__(self) -> str:
        return "table apply result"


@dataclass(eq=False)
class OtherT(Ty):
    what: str

    def __str__(self) -> str:
        return self.what


def scalar_default(t: Ty) -> int | bool | None:
    """The initial value of a variable of type ``t`` when it is a scalar: ``False`` for bool, 0
    for bit<W>, int<W>, error and enum values; None for anything else (a struct or header)."""
    if isinstance(t, BoolT):
        return False
    if isinstance(t, (BitT, ErrorT, EnumT)):
        return 0
    return None


def bit_width(t: Ty) -> int | None:
    if isinstance(t, BitT):
        return t.width
    if isinstance(t, EnumT) and t.underlying is not None:
        return t.underlying.width
    if isinstance(t, BoolT):
        return 1
    return None
