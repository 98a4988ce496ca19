"""Client side of the control protocol (pyzmq): :class:`ShadowClient`, :class:`ControllerClient`.

Every request is one multipart message: a JSON header frame ``{"op": ..., "token": ..., ...}``
followed by binary frames (``load`` only). Every reply is a JSON header frame
``{"ok": true, ...}`` or ``{"ok": false, "code": ..., "error": ...}`` followed by binary frames
(``fetch`` only). Tensors travel as a tensor stream (:mod:`shadowgrad.tensorstream`).

Shadow ops (:class:`ShadowClient`): ``status``, ``hold``, ``release``, ``fetch``, ``load``,
``snapshot``, ``config``, ``finished`` (see docs/shadow.md); ``fetch`` replies and ``load``
requests also carry the COMMIT record of the iteration (``"commit"``, see
:func:`~shadowgrad.tensorstream.commit_to_json`). The controller's endpoint speaks the same
protocol (:class:`ControllerClient`: ``status``, ``restore_point``, ``finished``, ``release``).

Replies are read into typed dataclasses (:mod:`shadowgrad.replies`): ``status_typed`` gives a
:class:`~shadowgrad.replies.ShadowStatus`, ``config`` a :class:`~shadowgrad.replies.ShadowConfig`,
``fetch_raw`` a :class:`FetchReply`, the controller's ``status`` and ``restore_point`` a
:class:`~shadowgrad.replies.ControllerStatus` and :class:`~shadowgrad.replies.RestorePointReply`.
``ShadowClient.status`` (and ``hold``, ``release``, ``load``, ``snapshot``) still return the
reply header as a dict, for the tools and tests that keep or print it whole.

In core so that the trainer hooks, the controller and the shadows share one client; the server
side is the shadow node (``shadowgrad.shadow.node``) and the controller service.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import torch
import zmq

from shadowgrad.errors import ShadowgradTimeout
from shadowgrad.replies import (
    ControllerStatus,
    RestorePointReply,
    ShadowConfig,
    ShadowStatus,
    _Reader,
)
from shadowgrad.tensorstream import ControlError, decode_states, encode_states

__all__ = [
    "ControlClient",
    "ControllerClient",
    "ShadowClient",
    "FetchResult",
    "FetchReply",
    "ControlError",
    "ShadowStatus",
    "ShadowConfig",
    "ControllerStatus",
    "RestorePointReply",
]


@dataclass(frozen=True)
class FetchResult:
    """State of some boxes at ``iteration``: ``states[box index] = {key: tensor}``; ``commit``:
    the COMMIT record of ``iteration`` (:func:`commit_to_json` form), None when the shadow has
    none (the initial state of a fresh start)."""

    iteration: int
    states: dict[int, dict[str, torch.Tensor]]
    commit: dict[str, Any] | None = None


@dataclass(frozen=True)
class FetchReply:
    """A ``fetch`` reply before decoding: the tensor stream's ``entries`` and chunk ``frames``
    as they came (for a caller that forwards them; :func:`decode_states` verifies and decodes),
    the COMMIT record of ``iteration`` (None when the shadow has none), and the ``shard`` and
    ``generation`` the shadow serves (None when not read from a reply)."""

    iteration: int
    entries: list[dict[str, Any]]
    frames: list[bytes] | list[memoryview]
    commit: dict[str, Any] | None = None
    shard: int | None = None
    generation: int | None = None

    @classmethod
    def from_wire(cls, header: Mapping[str, Any], frames: list[Any]) -> FetchReply:
        """Read a ``fetch`` reply (ControlError ``bad_reply`` when malformed; a ``commit``
        that is not an object reads as none)."""
        r = _Reader(header, "fetch reply")
        commit = header.get("commit")
        return cls(
            r.integer("iteration"),
            r.objects("entries"),
            frames,
            commit if isinstance(commit, dict) else None,
            shard=r.integer("shard"),
            generation=r.integer("generation"),
        )

    def decode(self) -> FetchResult:
        """Verify every chunk and decode the states (ControlError)."""
        return FetchResult(self.iteration, decode_states(self.entries, self.frames), self.commit)


class ControlClient:
    """Blocking transport of a control endpoint (a shadow's or the controller's): one JSON
    request, one JSON reply, every call has a deadline.

    ``endpoint`` is a zmq address (``"tcp://127.0.0.1:47480"``). After a timeout the REQ socket
    is discarded and a fresh one is made, so one lost reply never wedges the client.
    """

    def __init__(
        self,
        endpoint: str,
        token: str,
        *,
        timeout_s: float = 2.0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._token = token
        self.timeout_s = timeout_s
        self._own_ctx = context is None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = context or zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None

    def _socket(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            s = self._ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(self.endpoint)
            self._sock = s
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        op: str,
        frames: Sequence[memoryview | bytes] = (),
        timeout_s: float | None = None,
        *,
        copy: bool = True,
        **fields: Any,
    ) -> tuple[dict[str, Any], list[Any]]:
        """Send one request; return (reply header, reply frames) or raise ControlError/timeout.
        ``copy=False``: the frames are memoryviews of zmq's own receive buffers (no copy; each
        keeps its buffer alive), else ``bytes``."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        head = json.dumps({"op": op, "token": self._token, **fields}).encode()
        s = self._socket()
        ms = max(1, int(timeout * 1000))
        try:
            if not s.poll(ms, zmq.POLLOUT):
                raise zmq.Again()
            s.send_multipart([head, *frames], copy=False)
            if not s.poll(ms, zmq.POLLIN):
                raise zmq.Again()
            if copy:
                reply: list[Any] = s.recv_multipart()
            else:
                reply = [f.buffer for f in s.recv_multipart(copy=False)]
        except zmq.Again:
            self._sock = None
            s.close(linger=0)
            raise ShadowgradTimeout(
                f"control {op!r} to {self.endpoint} got no reply within {timeout:g}s"
            ) from None
        try:
            header = json.loads(bytes(reply[0]))
        except ValueError as e:
            raise ControlError("bad_reply", f"{op!r}: reply header is not JSON: {e}") from None
        if not header.get("ok"):
            raise ControlError(str(header.get("code", "error")), str(header.get("error", "")))
        return header, list(reply[1:])

    def finished(
        self,
        iteration: int | None,
        generation: int,
        requester: str,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Tell the peer (a shadow or the controller: both serve ``finished``) that training
        (``generation`` of the job) ended normally after ``iteration``, the last iteration
        trained; a shadow's status then carries ``finished``."""
        header, _ = self.call(
            "finished",
            timeout_s=timeout_s,
            iteration=iteration,
            generation=generation,
            requester=requester,
        )
        return header


class ControllerClient(ControlClient):
    """Blocking client of the controller's control endpoint (ops ``status``,
    ``restore_point``, ``finished``; ``release`` through :meth:`call`)."""

    def status(self, timeout_s: float | None = None) -> ControllerStatus:
        """The controller's state machine, published restore point and counters."""
        header, _ = self.call("status", timeout_s=timeout_s)
        return ControllerStatus.from_wire(header)

    def restore_point(
        self, requester: str, timeout_s: float | None = None, *, failed: int | None = None
    ) -> RestorePointReply:
        """The controller's restore point (``fresh``/``reachable`` or ``istar``/``source``/
        ``layout``, with ``generation_seen``); ``requester`` names the caller in its log;
        ``failed``: the iteration the caller was given and could not fetch (the controller
        then fixes and holds a new one)."""
        extra: dict[str, Any] = {} if failed is None else {"failed": failed}
        header, _ = self.call("restore_point", timeout_s=timeout_s, requester=requester, **extra)
        return RestorePointReply.from_wire(header)


class ShadowClient(ControlClient):
    """Blocking client of one shadow's control endpoint; every call has a deadline (see
    :class:`ControlClient`)."""

    # -- ops -----------------------------------------------------------------------------

    def status(self, timeline: int = 16) -> dict[str, Any]:
        """The ``status`` reply header as it came (see :meth:`status_typed`)."""
        header, _ = self.call("status", timeline=timeline)
        return header

    def status_typed(self, timeline: int = 16) -> ShadowStatus:
        """The shadow's status, typed (ControlError ``bad_reply`` when malformed); its
        ``timeline`` and ``pending`` (``timeline`` entries of each) are in ``raw``."""
        return ShadowStatus.from_wire(self.status(timeline))

    def config(self) -> ShadowConfig:
        """Layout, optimizer and generation of the shard this shadow holds (``not_loaded``
        when it holds none)."""
        header, _ = self.call("config")
        return ShadowConfig.from_wire(header)

    def hold(self, iteration: int) -> dict[str, Any]:
        header, _ = self.call("hold", iteration=iteration)
        return header

    def release(self, iteration: int) -> dict[str, Any]:
        header, _ = self.call("release", iteration=iteration)
        return header

    def fetch_raw(
        self,
        iteration: int | None = None,
        boxes: Sequence[int] | None = None,
        timeout_s: float | None = None,
        *,
        copy: bool = True,
    ) -> FetchReply:
        """Like :meth:`fetch`, without decoding: the stream as it came (see :class:`FetchReply`;
        ``copy=False``: its frames are views of zmq's receive buffers)."""
        header, frames = self.call(
            "fetch",
            iteration=iteration,
            boxes=None if boxes is None else list(boxes),
            timeout_s=timeout_s,
            copy=copy,
        )
        return FetchReply.from_wire(header, frames)

    def fetch(
        self,
        iteration: int | None = None,
        boxes: Sequence[int] | None = None,
        timeout_s: float | None = None,
    ) -> FetchResult:
        """State at ``iteration`` (None: the newest applied) of ``boxes`` (None: all)."""
        return self.fetch_raw(iteration, boxes, timeout_s).decode()

    def load(
        self,
        iteration: int,
        states: Sequence[Mapping[str, torch.Tensor]] | None,
        optimizer_json: str,
        layout_json: str | None = None,
        *,
        timeout_s: float | None = None,
        commit: Mapping[str, Any] | None = None,
        generation: int | None = None,
        reseed: bool | None = None,
        source: str | None = None,
    ) -> dict[str, Any]:
        """Bootstrap the shadow with its shard's state at ``iteration`` (per box, shard order);
        ``commit``: COMMIT(``iteration``) (:func:`commit_to_json` form) to keep with it.
        ``generation``, ``reseed`` and ``source`` (a trainer's bootstrap or re-seed: its
        generation, whether it re-seeds a running shadow, who sends) travel only when given.
        ``states=None``: a *keep* load, no state travels: the shadow installs its own state of
        ``iteration`` (the restore point it just served: live or held) as the new session's
        start, or refuses with ``unavailable`` when it has not got it."""
        extra: dict[str, Any] = {}
        if states is None:
            entries: list[dict[str, Any]] = []
            frames: list[memoryview] = []
            extra["keep"] = True
        else:
            entries, frames = encode_states(list(enumerate(states)))
        if generation is not None:
            extra["generation"] = generation
        if reseed is not None:
            extra["reseed"] = reseed
        if source is not None:
            extra["source"] = source
        if commit is not None:
            extra["commit"] = dict(commit)
        header, _ = self.call(
            "load",
            frames,
            iteration=iteration,
            optimizer=optimizer_json,
            layout=layout_json,
            entries=entries,
            timeout_s=timeout_s,
            **extra,
        )
        return header

    def snapshot(self, wait: bool = True, timeout_s: float | None = None) -> dict[str, Any]:
        header, _ = self.call("snapshot", wait=wait, timeout_s=timeout_s)
        return header
