"""The control protocol's schema: one request and one reply dataclass per op.

Every control endpoint (a shadow node, a starting shadow process, the controller service) and
every client (:mod:`shadowgrad.control_client`) speaks through these classes, as a ``.proto``
would be shared: the servers parse each request with its ``...Request`` class and build each
reply with its reply class; the clients build the requests and return the typed replies.

* A message is a frozen dataclass; :meth:`~_Message.to_json` gives its JSON header (a reply's
  with ``"ok": true`` first; the request's ``op`` and the job's ``token`` are added by the
  client's transport), :meth:`~_Message.from_json` reads one, every field by its annotation
  (:data:`_READERS`), raising :class:`~shadowgrad.errors.ControlError` naming the field when it
  is malformed: ``bad_request`` for a request, ``bad_reply`` for a reply. A field with a default
  is optional when read (an older peer's message without it takes the default); a field marked
  :func:`_omit` is left out of the JSON while it is None (e.g. ``load``'s ``keep``).
* Every reply keeps the header it was read from in ``raw`` (for logs and JSON output); built by a
  server, ``raw`` is empty.
* Binary frames (``load``'s state, ``fetch``'s reply) travel next to the header as a tensor
  stream (:mod:`shadowgrad.tensorstream`): ``FetchReply.frames`` is not part of its JSON.

Shadow ops (:data:`SHADOW_OPS`, docs/shadow.md): ``status`` (:class:`StatusRequest` ->
:class:`ShadowStatus`), ``hold``, ``release``, ``fetch``, ``load``, ``snapshot``, ``config``
(-> :class:`ShadowConfig`), ``finished``. Controller ops (:data:`CONTROLLER_OPS`): ``status``
(-> :class:`ControllerStatus`), ``restore_point`` (-> :class:`RestorePointReply`),
``finished``, ``release``. Error replies (``{"ok": false, "code": ..., "error": ...}``) are no
message: the client raises them as :class:`~shadowgrad.errors.ControlError`.

Standard library only (no torch, no zmq): the restore rule, the job view and a shadow process
that is still starting import it (:meth:`FetchReply.decode` imports the tensor stream when
called).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from shadowgrad.errors import ControlError

if TYPE_CHECKING:
    import torch

__all__ = [
    # shadow ops
    "StatusRequest",
    "ShadowStatus",
    "RankStatus",
    "PeerStatus",
    "HoldRequest",
    "HoldReply",
    "ReleaseRequest",
    "ReleaseReply",
    "FetchRequest",
    "FetchReply",
    "FetchResult",
    "LoadRequest",
    "LoadReply",
    "SnapshotRequest",
    "SnapshotReply",
    "ConfigRequest",
    "ShadowConfig",
    "FinishedRequest",
    "FinishedReply",
    # controller ops
    "ControllerStatusRequest",
    "ControllerStatus",
    "RestorePointRequest",
    "RestorePointReply",
    "ControllerReleaseRequest",
    "ControllerReleaseReply",
    # uniform names of the reply classes
    "StatusReply",
    "ConfigReply",
    "ControllerStatusReply",
    # tables, helpers
    "SHADOW_OPS",
    "CONTROLLER_OPS",
    "StatusLike",
    "shadow_status",
    "shadow_statuses",
]

_T = TypeVar("_T")


class _Reader:
    """Typed reads of one JSON object; every failure is a ControlError ``code`` (``bad_reply``
    or ``bad_request``) naming the field (``where``: the message and the path to the object,
    e.g. ``status reply['peers']['1']``)."""

    def __init__(self, doc: object, where: str, code: str = "bad_reply") -> None:
        if not isinstance(doc, Mapping):
            raise ControlError(code, f"{where} is not an object: {doc!r:.80}")
        self.doc: Mapping[str, Any] = doc
        self.where = where
        self.code = code

    def _get(self, key: str) -> Any:
        if key not in self.doc:
            raise ControlError(self.code, f"{self.where} has no {key!r}")
        return self.doc[key]

    def _bad(self, key: str, want: str, got: object) -> ControlError:
        return ControlError(self.code, f"{self.where}[{key!r}] must be {want}, got {got!r:.80}")

    def _checked(self, key: str, ok: Callable[[Any], bool], want: str, null: bool = False) -> Any:
        """The value at ``key`` when ``ok`` (or, with ``null``, None); else the error that it
        must be ``want``."""
        v = self._get(key)
        if not (ok(v) or (null and v is None)):
            raise self._bad(key, want, v)
        return v

    def integer(self, key: str) -> int:
        return int(self._checked(key, _is_int, "an integer"))

    def opt_integer(self, key: str) -> int | None:
        v = self._checked(key, _is_int, "an integer or null", null=True)
        return None if v is None else int(v)

    def flag(self, key: str) -> bool:
        v: bool = self._checked(key, _is_bool, "true or false")
        return v

    def opt_flag(self, key: str) -> bool | None:
        v: bool | None = self._checked(key, _is_bool, "true, false or null", null=True)
        return v

    def number(self, key: str) -> float:
        return float(self._checked(key, _is_number, "a number"))

    def opt_number(self, key: str) -> float | None:
        v = self._checked(key, _is_number, "a number or null", null=True)
        return None if v is None else float(v)

    def text(self, key: str) -> str:
        v: str = self._checked(key, _is_str, "a string")
        return v

    def opt_text(self, key: str) -> str | None:
        v: str | None = self._checked(key, _is_str, "a string or null", null=True)
        return v

    def integers(self, key: str) -> tuple[int, ...]:
        v = self._get(key)
        if not isinstance(v, list) or not all(_is_int(x) for x in v):
            raise self._bad(key, "a list of integers", v)
        return tuple(int(x) for x in v)

    def opt_integers(self, key: str) -> tuple[int, ...] | None:
        return None if self._get(key) is None else self.integers(key)

    def objects(self, key: str) -> tuple[Mapping[str, Any], ...]:
        v = self._get(key)
        if not isinstance(v, list) or not all(isinstance(x, Mapping) for x in v):
            raise self._bad(key, "a list of objects", v)
        return tuple(v)

    def counts(self, key: str) -> dict[str, int]:
        v = self._get(key)
        if not isinstance(v, Mapping) or not all(_is_int(x) for x in v.values()):
            raise self._bad(key, "an object of integer counts", v)
        return {str(k): int(x) for k, x in v.items()}

    def obj(self, key: str) -> dict[str, Any]:
        return dict(self._checked(key, _is_object, "an object"))

    def opt_obj(self, key: str) -> dict[str, Any] | None:
        v = self._checked(key, _is_object, "an object or null", null=True)
        return None if v is None else dict(v)

    def value(self, key: str) -> Any:
        """Any JSON value (a field deliberately not typed further)."""
        return self._get(key)

    def table(self, key: str, parse: Callable[[_Reader], _T]) -> dict[int, _T]:
        """An object keyed by decimal ids (JSON keys are strings) -> ``{int id: parse(value)}``,
        in the message's order."""
        v = self._checked(key, _is_object, "an object")
        out: dict[int, _T] = {}
        for k, x in v.items():
            if not (isinstance(k, str) and k.lstrip("-").isdigit()):
                raise self._bad(key, "keyed by integers", k)
            out[int(k)] = parse(_Reader(x, f"{self.where}[{key!r}][{k!r}]", self.code))
        return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_bool(v: object) -> bool:
    return isinstance(v, bool)


def _is_number(v: object) -> bool:
    return _is_int(v) or isinstance(v, float)


def _is_str(v: object) -> bool:
    return isinstance(v, str)


def _is_object(v: object) -> bool:
    return isinstance(v, Mapping)


# ------------------------------------------------------------------------------- reading, writing


def _required(f: Field[Any]) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _on_wire(f: Field[Any]) -> bool:
    return f.name != "raw" and f.metadata.get("wire", True)


#: per message class: (field name, its annotation or None for ``raw``, required), in order
_PLANS: dict[type, list[tuple[str, str | None, bool]]] = {}


def _plan(cls: type) -> list[tuple[str, str | None, bool]]:
    """How :func:`_read` reads ``cls``, worked out once per class (walking the dataclass
    fields cost more than the reading, on paths such as the trainers' status polls)."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = [
            (f.name, None if f.name == "raw" else str(f.type), _required(f))
            for f in fields(cls)
            if f.name == "raw" or _on_wire(f)
        ]
        _PLANS[cls] = plan
    return plan


def _read(cls: Any, r: _Reader) -> Any:
    """An instance of the dataclass ``cls``, every field read from ``r`` by its annotation. A
    field with a default is optional: a message without it (an older peer's) takes the default."""
    kw: dict[str, Any] = {}
    doc = r.doc
    for name, annotation, required in _plan(cls):
        if annotation is None:
            kw["raw"] = doc
        elif name in doc or required:
            kw[name] = _READERS[annotation](r, name)
    return cls(**kw)


def _write(obj: Any) -> dict[str, Any]:
    """The JSON object of the dataclass instance ``obj``, every field by its annotation (a
    field marked :func:`_omit` left out while None)."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        if not _on_wire(f):
            continue
        v = getattr(obj, f.name)
        if v is None and f.metadata.get("omit", False):
            continue
        out[f.name] = _WRITERS.get(str(f.type), _plain)(v)
    return out


def _plain(v: Any) -> Any:
    return v


def _table(cls: type) -> Callable[[_Reader, str], dict[int, Any]]:
    return lambda r, key: r.table(key, lambda sub: _read(cls, sub))


def _write_table(v: Mapping[int, Any] | None) -> dict[str, Any] | None:
    return None if v is None else {str(k): _write(x) for k, x in v.items()}


def _omit(default: Any = None) -> Any:
    """A field left out of the JSON while it is None (an optional request argument)."""
    return field(default=default, metadata={"omit": True})


def _empty() -> Any:
    """An optional object field, empty by default."""
    return field(default_factory=dict)


class _Message:
    """A message class: a frozen dataclass read from and written to a JSON header by its
    fields' annotations (module docstring)."""

    #: the message's name in error messages (the op, or the reply's name)
    _what: ClassVar[str]
    #: the ControlError code of a malformed message
    _code: ClassVar[str]
    _kind: ClassVar[str]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        """Read a message (ControlError ``bad_request``/``bad_reply`` naming the field when
        malformed; keys that are no field, e.g. ``op`` and ``token``, are ignored)."""
        out: Self = _read(cls, _Reader(doc, f"{cls._what} {cls._kind}", cls._code))
        return out

    def to_json(self) -> dict[str, Any]:
        """The message as its JSON header (a new dict)."""
        return _write(self)


class _Request(_Message):
    """A request class; ``op`` names the op it asks for (and the request in error messages,
    unless the class names itself with ``_what``)."""

    op: ClassVar[str]
    _code = "bad_request"
    _kind = "request"

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if "_what" not in cls.__dict__:
            cls._what = cls.op


@dataclass(frozen=True)
class _Reply(_Message):
    """A reply class; its JSON starts with ``"ok": true``. It is named in error messages as
    its request is (set with the op tables below)."""

    _code = "bad_reply"
    _kind = "reply"

    #: the header as it came (not compared, not shown; empty when built by a server)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False, kw_only=True)

    @classmethod
    def from_wire(cls, header: Mapping[str, Any]) -> Self:
        """Read a reply header (:meth:`from_json`)."""
        return cls.from_json(header)

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, **_write(self)}


RequestT = TypeVar("RequestT", bound=_Request)
ReplyT = TypeVar("ReplyT", bound=_Reply)


# ------------------------------------------------------------------------------- shadow: status


@dataclass(frozen=True)
class StatusRequest(_Request):
    """``status``: the shadow's state; ``timeline``: how many entries of its timeline (and of
    ``pending``) the reply carries; ``brief``: only what a health check reads (the trainers'
    polls): ``ranks``, ``holds``, ``available``, ``counters``, ``events``, ``peers``,
    ``timeline``, ``pending`` and ``last_snapshot`` come back empty (a shadow that does not
    know the flag answers in full)."""

    op = "status"

    timeline: int = 16
    brief: bool | None = _omit()


@dataclass(frozen=True)
class RankStatus:
    """A trainer rank as a shadow hears it: its newest iteration, seconds since it was heard."""

    newest: int | None
    silent_s: float

    def to_json(self) -> dict[str, Any]:
        return _write(self)


@dataclass(frozen=True)
class PeerStatus:
    """A replica of another shard as a shadow hears it (READY soft state; -2: nothing known)."""

    ready_through: int
    last_applied: int
    diverged: bool

    def to_json(self) -> dict[str, Any]:
        return _write(self)


@dataclass(frozen=True)
class ShadowStatus(_Reply):
    """A shadow's ``status`` reply (``ShadowNode.status``; docs/shadow.md). The fields of a
    shard (``shard`` ... ``window``, ``last_ready``, ``last_applied``) are None while the
    shadow is not ``loaded``. ``ranks`` and ``peers`` are keyed by rank and shadow id."""

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
    #: true while the shadow process starts (``EarlyControl`` answers), false from the node
    starting: bool = False
    #: the shadow's monotonic clock (seconds) as it built the reply: with the caller's own
    #: send and receive times, the offset of the two clocks (the re-seed's one-way transfer
    #: time, trainer.reseed) (optional: an older shadow has no such key)
    clock: float | None = _omit()
    #: the newest iterations' timings (``{"iteration": ..., "first_chunk": ..., ...}``, at most
    #: the request's ``timeline``) -- not typed further
    timeline: tuple[Mapping[str, Any], ...] = ()
    #: the iterations being received, by iteration (``{"first_chunk", "last_chunk", "commit",
    #: "ready", "covered", "nack_rounds"}``) -- not typed further
    pending: Mapping[str, Any] = _empty()
    #: the last snapshot written (``{"iteration", "path", "seconds"}``) or None
    last_snapshot: Mapping[str, Any] | None = None


#: a status as a client reads it, or the dict an in-process ``ShadowNode.status`` returns
StatusLike = ShadowStatus | Mapping[str, Any]


def shadow_status(status: StatusLike) -> ShadowStatus:
    """``status`` typed (read with :meth:`ShadowStatus.from_json` when it is a dict)."""
    return status if isinstance(status, ShadowStatus) else ShadowStatus.from_json(status)


def shadow_statuses(
    statuses: Mapping[int, StatusLike | None],
) -> dict[int, ShadowStatus | None]:
    """:func:`shadow_status` of every status of ``{shadow: status or None}``."""
    return {k: None if s is None else shadow_status(s) for k, s in statuses.items()}


# ------------------------------------------------------------------------------- shadow: holds


@dataclass(frozen=True)
class HoldRequest(_Request):
    """``hold``: keep ``iteration``'s state (the restore point) until released."""

    op = "hold"

    iteration: int


@dataclass(frozen=True)
class HoldReply(_Reply):
    """``hold``'s reply: the iteration held and every hold the shadow keeps now."""

    iteration: int
    holds: tuple[int, ...]


@dataclass(frozen=True)
class ReleaseRequest(_Request):
    """``release``: drop the hold on ``iteration``."""

    op = "release"

    iteration: int


@dataclass(frozen=True)
class ReleaseReply(_Reply):
    """``release``'s reply: the holds the shadow keeps now."""

    holds: tuple[int, ...]


# ------------------------------------------------------------------------------- shadow: state


@dataclass(frozen=True)
class FetchRequest(_Request):
    """``fetch``: the state at ``iteration`` (None: the newest applied) of ``boxes`` (None:
    all; parameter boxes, then module-state boxes). ``stream`` (left out unless true): send
    the bytes on a bulk connection of their own (:mod:`shadowgrad.bulk`) rather than as reply
    frames; a shadow without the bulk channel ignores it and sends frames."""

    op = "fetch"

    iteration: int | None = None
    boxes: tuple[int, ...] | None = None
    stream: bool | None = _omit()


@dataclass(frozen=True)
class FetchResult:
    """State of some boxes at ``iteration``: ``states[box index] = {key: tensor}``; ``commit``:
    the COMMIT record of ``iteration`` (:func:`~shadowgrad.tensorstream.commit_to_json` form),
    None when the shadow has none (the initial state of a fresh start)."""

    iteration: int
    states: dict[int, dict[str, torch.Tensor]]
    commit: dict[str, Any] | None = None


@dataclass(frozen=True)
class FetchReply(_Reply):
    """``fetch``'s reply before decoding: the tensor stream's ``entries`` and chunk ``frames``
    as they came (for a caller that forwards them; :meth:`decode` verifies and decodes; the
    frames are not part of the JSON), the COMMIT record of ``iteration`` (None when the shadow
    has none), and the ``shard`` and ``generation`` the shadow serves. ``stream`` (only when
    the request asked for one and the shadow offers it): ``{"port", "ticket", "chunk"}`` of the
    bulk connection that carries the bytes instead of frames (:mod:`shadowgrad.bulk`)."""

    iteration: int
    shard: int
    entries: tuple[Mapping[str, Any], ...]
    commit: dict[str, Any] | None
    generation: int
    frames: Sequence[Any] = field(default=(), repr=False, compare=False, metadata={"wire": False})
    stream: Mapping[str, Any] | None = _omit()

    @classmethod
    def from_wire_frames(cls, header: Mapping[str, Any], frames: Sequence[Any]) -> FetchReply:
        """Read a ``fetch`` reply header with the frames that came with it."""
        reply = cls.from_json(header)
        object.__setattr__(reply, "frames", list(frames))
        return reply

    def decode(self) -> FetchResult:
        """Verify every chunk and decode the states (ControlError)."""
        from shadowgrad.tensorstream import decode_states

        if self.stream is not None:
            raise ControlError("bad_reply", "fetch reply: the bytes are on a stream, not frames")
        states = decode_states([dict(e) for e in self.entries], list(self.frames))
        return FetchResult(self.iteration, states, self.commit)


@dataclass(frozen=True)
class LoadRequest(_Request):
    """``load``: install a shard state as ``iteration`` (the tensor stream's ``entries``, its
    chunks in the request's frames), with the optimizer (``OptimizerSpec`` JSON) and the layout
    (JSON; None: the one the shadow has). Optional (left out when None): ``keep`` (no state
    travels: the shadow installs its own state of ``iteration``), ``generation``, ``reseed``
    (the job goes on), ``source`` (who sends), ``commit`` (COMMIT of ``iteration``)."""

    op = "load"

    iteration: int
    optimizer: str
    layout: str | None
    entries: tuple[Mapping[str, Any], ...]
    keep: bool | None = _omit()
    generation: int | None = _omit()
    reseed: bool | None = _omit()
    source: str | None = _omit()
    commit: Mapping[str, Any] | None = _omit()


@dataclass(frozen=True)
class LoadReply(_Reply):
    """``load``'s reply: the shard and replica installed, at ``iteration`` of ``generation``;
    ``install_ms``: the shadow's own time on the request (the sender splits its round trip);
    ``behind`` (only when true): a re-seed older than what the shadow got on its own meanwhile,
    not installed (``iteration`` is then the shadow's own)."""

    shard: int
    replica: int
    iteration: int
    generation: int
    install_ms: float = 0.0
    behind: bool | None = _omit()
    #: the shadow's monotonic clock when it took the request off its socket (the end of the
    #: transfer, on its clock; see ``ShadowStatus.clock``)
    received_at: float | None = _omit()


@dataclass(frozen=True)
class SnapshotRequest(_Request):
    """``snapshot``: write the consistent iteration to ``shadows.snapshot_dir`` now; ``wait``:
    answer when it is written."""

    op = "snapshot"

    wait: bool = True


@dataclass(frozen=True)
class SnapshotReply(_Reply):
    """``snapshot``'s reply: the iteration written and, once written (always with ``wait``),
    its ``path`` and the ``seconds`` it took."""

    iteration: int
    path: str | None = _omit()
    seconds: float | None = _omit()


@dataclass(frozen=True)
class ConfigRequest(_Request):
    """``config``: what a restarted replica needs to clone this shard."""

    op = "config"


@dataclass(frozen=True)
class ShadowConfig(_Reply):
    """A shadow's ``config`` reply: what a restarted replica needs to clone its shard (the
    layout and optimizer as JSON text, the generation it serves)."""

    shard: int
    replica: int
    layout: str
    optimizer: str
    generation: int
    last_applied: int
    diverged_at: int | None


# ------------------------------------------------------------------------------- finished


@dataclass(frozen=True)
class FinishedRequest(_Request):
    """``finished`` (a shadow's and the controller's): training (``generation`` of the job)
    ended normally after ``iteration`` (the last iteration trained, or None); ``requester``
    names the caller in the log."""

    op = "finished"

    iteration: int | None
    #: required by a shadow; the controller takes the newest its shadows serve when None
    generation: int | None
    requester: str = "client"


@dataclass(frozen=True)
class FinishedReply(_Reply):
    """``finished``'s reply: a shadow's carries the record it keeps (``{"iteration",
    "generation", "requester"}``, as its status's ``finished``); the controller's none."""

    finished: Mapping[str, Any] | None = _omit()


# ------------------------------------------------------------------------------- controller


@dataclass(frozen=True)
class ControllerStatusRequest(_Request):
    """The controller's ``status``."""

    op = "status"
    _what = "controller status"


@dataclass(frozen=True)
class ControllerStatus(_Reply):
    """The controller's ``status`` reply: its state machine (``state``, ``reason``), the
    published restore point (``istar``: a ``restore_point`` reply, ``{"error": ...}``, or None
    before a failure), the shadows holding it, the failure being handled, how many failures it
    detected, its counters. The optional fields (an older controller may lack them) are not
    typed further: what the shadows say about the ``trainers``, the ``shadows`` by id (their
    state as members), the ``switch``'s last convergence, the ``finished`` record."""

    state: str
    reason: str
    istar: Mapping[str, Any] | None
    held: tuple[int, ...]
    failure: Mapping[str, Any] | None
    detections: int
    counters: Mapping[str, int]
    live_istar: int | None
    #: wall-clock time of the reply (``time.time()``)
    time: float | None = None
    #: ``"controller"``
    source: str | None = None
    #: the job's id
    job: int | None = None
    trainers: Mapping[str, Any] | None = None
    finished: Mapping[str, Any] | None = None
    shadows: Mapping[str, Any] | None = None
    switch: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RestorePointRequest(_Request):
    """The controller's ``restore_point``: ``requester`` names the caller in its log;
    ``failed`` (left out when None): the iteration the caller was given and could not fetch."""

    op = "restore_point"

    requester: str = "client"
    failed: int | None = _omit()


@dataclass(frozen=True)
class RestorePointReply(_Reply):
    """The controller's ``restore_point`` reply (``RestorePoint.to_json`` plus the shadows it
    ``held`` I* on and the newest generation the shadows have seen). ``istar`` is -1 and
    ``source`` empty when ``fresh``."""

    istar: int
    source: tuple[int, ...]
    usable: tuple[int, ...]
    fresh: bool
    reachable: int
    #: the layout's digest (None when fresh)
    layout: str | None
    held: tuple[int, ...]
    generation_seen: int


@dataclass(frozen=True)
class ControllerReleaseRequest(_Request):
    """The controller's ``release``: drop the holds of the published restore point."""

    op = "release"
    _what = "controller release"


@dataclass(frozen=True)
class ControllerReleaseReply(_Reply):
    """The controller's ``release`` reply: the shadows whose holds it released."""

    released: tuple[int, ...]


#: the reply classes under the op's name (the classes keep their established names)
StatusReply = ShadowStatus
ConfigReply = ShadowConfig
ControllerStatusReply = ControllerStatus

#: a shadow's ops: op -> (request class, reply class)
SHADOW_OPS: Mapping[str, tuple[type[_Request], type[_Reply]]] = {
    "status": (StatusRequest, ShadowStatus),
    "hold": (HoldRequest, HoldReply),
    "release": (ReleaseRequest, ReleaseReply),
    "fetch": (FetchRequest, FetchReply),
    "load": (LoadRequest, LoadReply),
    "snapshot": (SnapshotRequest, SnapshotReply),
    "config": (ConfigRequest, ShadowConfig),
    "finished": (FinishedRequest, FinishedReply),
}

#: the controller's ops: op -> (request class, reply class)
CONTROLLER_OPS: Mapping[str, tuple[type[_Request], type[_Reply]]] = {
    "status": (ControllerStatusRequest, ControllerStatus),
    "restore_point": (RestorePointRequest, RestorePointReply),
    "finished": (FinishedRequest, FinishedReply),
    "release": (ControllerReleaseRequest, ControllerReleaseReply),
}

for _request, _reply in (*SHADOW_OPS.values(), *CONTROLLER_OPS.values()):
    _reply._what = _request._what

#: how a field is read, by its annotation (``from __future__ import annotations``: a string)
_READERS: dict[str, Callable[[_Reader, str], Any]] = {
    "int": _Reader.integer,
    "int | None": _Reader.opt_integer,
    "bool": _Reader.flag,
    "bool | None": _Reader.opt_flag,
    "float": _Reader.number,
    "float | None": _Reader.opt_number,
    "str": _Reader.text,
    "str | None": _Reader.opt_text,
    "tuple[int, ...]": _Reader.integers,
    "tuple[int, ...] | None": _Reader.opt_integers,
    "tuple[Mapping[str, Any], ...]": _Reader.objects,
    "Mapping[str, int]": _Reader.counts,
    "Mapping[str, Any]": _Reader.obj,
    "Mapping[str, Any] | None": _Reader.opt_obj,
    "dict[str, Any] | None": _Reader.opt_obj,
    "Mapping[int, RankStatus]": _table(RankStatus),
    "Mapping[int, PeerStatus]": _table(PeerStatus),
}


def _list(v: Sequence[Any] | None) -> list[Any] | None:
    return None if v is None else list(v)


def _dict(v: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if v is None else dict(v)


def _dicts(v: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(x) for x in v]


#: how a field is written, by its annotation (a JSON value already when not here)
_WRITERS: dict[str, Callable[[Any], Any]] = {
    "tuple[int, ...]": _list,
    "tuple[int, ...] | None": _list,
    "tuple[Mapping[str, Any], ...]": _dicts,
    "Mapping[str, int]": _dict,
    "Mapping[str, Any]": _dict,
    "Mapping[str, Any] | None": _dict,
    "dict[str, Any] | None": _dict,
    "Mapping[int, RankStatus]": _write_table,
    "Mapping[int, PeerStatus]": _write_table,
}

_CLASSES: tuple[Any, ...] = (
    RankStatus,
    PeerStatus,
    *(c for pair in (*SHADOW_OPS.values(), *CONTROLLER_OPS.values()) for c in pair),
)
for _cls in _CLASSES:
    _unread = {str(f.type) for f in fields(_cls) if _on_wire(f)} - set(_READERS)
    if _unread:  # pragma: no cover - a field added without a reader
        raise AssertionError(f"{_cls.__name__}: no reader for {sorted(_unread)}")
