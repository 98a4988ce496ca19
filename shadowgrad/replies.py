"""Typed control replies: what a shadow's or the controller's JSON reply header says.

The wire format is the JSON header of the control protocol (:mod:`shadowgrad.control_client`);
this module reads it into frozen dataclasses, in one place (every field by its annotation),
and raises :class:`~shadowgrad.errors.ControlError` with code ``bad_reply`` naming the field
when a reply is malformed (a missing key, a value of the wrong type). Every reply class keeps
the header as it came in ``raw`` (for logs, JSON output and the fields not typed here, e.g.
a status's ``timeline`` and ``pending``).

* :class:`ShadowStatus` (``status``; nested :class:`RankStatus`, :class:`PeerStatus`): what
  ``ShadowNode.status`` builds (docs/shadow.md). :func:`shadow_status` also reads the status
  dict of an in-process node, so the consumers (the restore rule, the controller, the trainers'
  health monitor, ``shadowgrad status``) use attributes whichever way a status came.
* :class:`ShadowConfig` (``config``): what a restarted replica needs to clone its shard.
* :class:`ControllerStatus` (the controller's ``status``) and :class:`RestorePointReply` (its
  ``restore_point``).

Standard library only (no torch, no zmq): the restore rule and the job view import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Self, TypeVar

from shadowgrad.errors import ControlError

__all__ = [
    "ShadowStatus",
    "RankStatus",
    "PeerStatus",
    "ShadowConfig",
    "ControllerStatus",
    "RestorePointReply",
    "StatusLike",
    "shadow_status",
    "shadow_statuses",
]

_T = TypeVar("_T")


class _Reader:
    """Typed reads of one JSON object; every failure is a ``bad_reply`` naming the field
    (``where``: the reply and the path to the object, e.g. ``status reply['peers']['1']``)."""

    def __init__(self, doc: object, where: str) -> None:
        if not isinstance(doc, Mapping):
            raise ControlError("bad_reply", f"{where} is not an object: {doc!r:.80}")
        self.doc: Mapping[str, Any] = doc
        self.where = where

    def _get(self, key: str) -> Any:
        if key not in self.doc:
            raise ControlError("bad_reply", f"{self.where} has no {key!r}")
        return self.doc[key]

    def _bad(self, key: str, want: str, got: object) -> ControlError:
        return ControlError("bad_reply", f"{self.where}[{key!r}] must be {want}, got {got!r:.80}")

    def integer(self, key: str) -> int:
        v = self._get(key)
        if not _is_int(v):
            raise self._bad(key, "an integer", v)
        return int(v)

    def opt_integer(self, key: str) -> int | None:
        v = self._get(key)
        if v is not None and not _is_int(v):
            raise self._bad(key, "an integer or null", v)
        return None if v is None else int(v)

    def flag(self, key: str) -> bool:
        v = self._get(key)
        if not isinstance(v, bool):
            raise self._bad(key, "true or false", v)
        return v

    def number(self, key: str) -> float:
        v = self._get(key)
        if not (_is_int(v) or isinstance(v, float)):
            raise self._bad(key, "a number", v)
        return float(v)

    def text(self, key: str) -> str:
        v = self._get(key)
        if not isinstance(v, str):
            raise self._bad(key, "a string", v)
        return v

    def opt_text(self, key: str) -> str | None:
        v = self._get(key)
        if v is not None and not isinstance(v, str):
            raise self._bad(key, "a string or null", v)
        return v

    def integers(self, key: str) -> tuple[int, ...]:
        v = self._get(key)
        if not isinstance(v, list) or not all(_is_int(x) for x in v):
            raise self._bad(key, "a list of integers", v)
        return tuple(int(x) for x in v)

    def objects(self, key: str) -> list[dict[str, Any]]:
        v = self._get(key)
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            raise self._bad(key, "a list of objects", v)
        return v

    def counts(self, key: str) -> dict[str, int]:
        v = self._get(key)
        if not isinstance(v, Mapping) or not all(_is_int(x) for x in v.values()):
            raise self._bad(key, "an object of integer counts", v)
        return {str(k): int(x) for k, x in v.items()}

    def opt_obj(self, key: str) -> dict[str, Any] | None:
        v = self._get(key)
        if v is not None and not isinstance(v, Mapping):
            raise self._bad(key, "an object or null", v)
        return None if v is None else dict(v)

    def table(self, key: str, parse: Callable[[_Reader], _T]) -> dict[int, _T]:
        """An object keyed by decimal ids (JSON keys are strings) -> ``{int id: parse(value)}``,
        in the reply's order."""
        v = self._get(key)
        if not isinstance(v, Mapping):
            raise self._bad(key, "an object", v)
        out: dict[int, _T] = {}
        for k, x in v.items():
            if not (isinstance(k, str) and k.lstrip("-").isdigit()):
                raise self._bad(key, "keyed by integers", k)
            out[int(k)] = parse(_Reader(x, f"{self.where}[{key!r}][{k!r}]"))
        return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# ------------------------------------------------------------------------------- reading


class _Reply:
    """A reply class: a frozen dataclass whose fields are read from a reply header by their
    annotations (:data:`_READERS`), plus ``raw``, the header as it came."""

    #: the reply's name in error messages
    _what: ClassVar[str]

    @classmethod
    def from_wire(cls, header: Mapping[str, Any]) -> Self:
        """Read a reply header (ControlError ``bad_reply`` naming the field when malformed)."""
        out: Self = _read(cls, _Reader(header, f"{cls._what} reply"))
        return out


def _read(cls: Any, r: _Reader) -> Any:
    """An instance of the dataclass ``cls``, every field read from ``r`` by its annotation. A
    field with a default is optional: a reply without it (an older peer's) takes the default."""
    return cls(
        **{
            f.name: r.doc if f.name == "raw" else _READERS[str(f.type)](r, f.name)
            for f in fields(cls)
            if f.name == "raw" or f.name in r.doc or f.default is MISSING
        }
    )


def _table(cls: type) -> Callable[[_Reader, str], dict[int, Any]]:
    return lambda r, key: r.table(key, lambda sub: _read(cls, sub))


def _raw() -> Any:
    """The ``raw`` field of a reply class: the header as it came (not compared, not shown)."""
    return field(default_factory=dict, repr=False, compare=False)


# ------------------------------------------------------------------------------- shadow


@dataclass(frozen=True)
class RankStatus:
    """A trainer rank as a shadow hears it: its newest iteration, seconds since it was heard."""

    newest: int | None
    silent_s: float

    def to_json(self) -> dict[str, Any]:
        return {"newest": self.newest, "silent_s": self.silent_s}


@dataclass(frozen=True)
class PeerStatus:
    """A replica of another shard as a shadow hears it (READY soft state; -2: nothing known)."""

    ready_through: int
    last_applied: int
    diverged: bool


@dataclass(frozen=True)
class ShadowStatus(_Reply):
    """A shadow's ``status`` reply (``ShadowNode.status``; docs/shadow.md). The fields of a
    shard (``shard`` ... ``window``, ``last_ready``, ``last_applied``) are None while the
    shadow is not ``loaded``. ``ranks`` and ``peers`` are keyed by rank and shadow id."""

    _what = "status"

    shadow: int
    loaded: bool
    shard: int | None
    replica: int | None
    #: the layout's digest
    layout: str | None
    owned_bytes: int | None
    last_ready: int | None
    last_applied: int | None
    istar: int | None
    newest_seen: int
    lag: int
    diverged_at: int | None
    trainers_silent_s: float
    ranks: Mapping[int, RankStatus]
    generation: int
    window: int | None
    buffered: int
    holds: tuple[int, ...]
    available: tuple[int, ...]
    #: rx counters (datagrams by outcome) and events, by name
    counters: Mapping[str, int]
    events: Mapping[str, int]
    peers: Mapping[int, PeerStatus]
    #: rank 0's word that training ended (``finished`` op): ``{"iteration": the last iteration
    #: trained, "generation": ..., "requester": ...}``; None while the generation it serves has
    #: not finished (optional: a shadow without the op has no such key)
    finished: Mapping[str, Any] | None = None
    #: the shadow process's identity, drawn once when it starts (``EarlyControl`` hands it to
    #: the node): another value from the same shadow id means the process restarted, whatever
    #: it holds now (optional: an older shadow has no such key)
    incarnation: str | None = None
    raw: Mapping[str, Any] = _raw()


#: a status as a client reads it, or the dict an in-process ``ShadowNode.status`` returns
StatusLike = ShadowStatus | Mapping[str, Any]


def shadow_status(status: StatusLike) -> ShadowStatus:
    """``status`` typed (read with :meth:`ShadowStatus.from_wire` when it is a dict)."""
    return status if isinstance(status, ShadowStatus) else ShadowStatus.from_wire(status)


def shadow_statuses(
    statuses: Mapping[int, StatusLike | None],
) -> dict[int, ShadowStatus | None]:
    """:func:`shadow_status` of every status of ``{shadow: status or None}``."""
    return {k: None if s is None else shadow_status(s) for k, s in statuses.items()}


@dataclass(frozen=True)
class ShadowConfig(_Reply):
    """A shadow's ``config`` reply: what a restarted replica needs to clone its shard (the
    layout and optimizer as JSON text, the generation it serves)."""

    _what = "config"

    shard: int
    replica: int
    layout: str
    optimizer: str
    generation: int
    last_applied: int
    diverged_at: int | None
    raw: Mapping[str, Any] = _raw()


# ------------------------------------------------------------------------------- controller


@dataclass(frozen=True)
class RestorePointReply(_Reply):
    """The controller's ``restore_point`` reply (``RestorePoint.to_json`` plus the shadows it
    ``held`` I* on and the newest generation the shadows have seen). ``istar`` is -1 and
    ``source`` empty when ``fresh``."""

    _what = "restore_point"

    istar: int
    source: tuple[int, ...]
    usable: tuple[int, ...]
    fresh: bool
    reachable: int
    #: the layout's digest (None when fresh)
    layout: str | None
    held: tuple[int, ...]
    generation_seen: int
    raw: Mapping[str, Any] = _raw()


@dataclass(frozen=True)
class ControllerStatus(_Reply):
    """The controller's ``status`` reply: its state machine (``state``, ``reason``), the
    published restore point (``istar``: a ``restore_point`` reply, ``{"error": ...}``, or None
    before a failure), the shadows holding it, the failure being handled, how many failures it
    detected, its counters. The rest (``trainers``, ``shadows``, ``switch``, ...) is in
    ``raw``."""

    _what = "controller status"

    state: str
    reason: str
    istar: Mapping[str, Any] | None
    held: tuple[int, ...]
    failure: Mapping[str, Any] | None
    detections: int
    counters: Mapping[str, int]
    live_istar: int | None
    raw: Mapping[str, Any] = _raw()


#: how a field is read, by its annotation (``from __future__ import annotations``: a string)
_READERS: dict[str, Callable[[_Reader, str], Any]] = {
    "int": _Reader.integer,
    "int | None": _Reader.opt_integer,
    "bool": _Reader.flag,
    "float": _Reader.number,
    "str": _Reader.text,
    "str | None": _Reader.opt_text,
    "tuple[int, ...]": _Reader.integers,
    "Mapping[str, int]": _Reader.counts,
    "Mapping[str, Any] | None": _Reader.opt_obj,
    "Mapping[int, RankStatus]": _table(RankStatus),
    "Mapping[int, PeerStatus]": _table(PeerStatus),
}

for _cls in (
    RankStatus,
    PeerStatus,
    ShadowStatus,
    ShadowConfig,
    RestorePointReply,
    ControllerStatus,
):
    _unread = {str(f.type) for f in fields(_cls) if f.name != "raw"} - set(_READERS)
    if _unread:  # pragma: no cover - a field added without a reader
        raise AssertionError(f"{_cls.__name__}: no reader for {sorted(_unread)}")
