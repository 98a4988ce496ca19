"""Client side of the control protocol (pyzmq): :class:`ShadowClient`, :class:`ControllerClient`.

Every request is one multipart message: a JSON header frame ``{"op": ..., "token": ..., ...}``
followed by binary frames (``load`` only). Every reply is a JSON header frame
``{"ok": true, ...}`` or ``{"ok": false, "code": ..., "error": ...}`` followed by binary frames
(``fetch`` only). Tensors travel as a tensor stream (:mod:`shadowgrad.tensorstream`).

The headers are the messages of :mod:`shadowgrad.messages` (one request and one reply class per
op, shared with the servers): every op method builds its ``...Request``, sends it and returns
the typed reply, never the header as a dict (each reply keeps it in ``raw``). Shadow ops
(:class:`ShadowClient`): ``status`` (:class:`~shadowgrad.messages.ShadowStatus`), ``hold``,
``release``, ``fetch`` (``fetch_raw``: the :class:`~shadowgrad.messages.FetchReply` before
decoding), ``load``, ``snapshot``, ``config`` (:class:`~shadowgrad.messages.ShadowConfig`),
``finished`` (see docs/shadow.md); ``fetch`` replies and ``load`` requests also carry the COMMIT
record of the iteration (``"commit"``, see :func:`~shadowgrad.tensorstream.commit_to_json`).
The controller's endpoint speaks the same protocol (:class:`ControllerClient`: ``status``,
``restore_point``, ``finished``, ``release``). :meth:`ControlClient.call` is the transport
(an op by name, the reply header as a dict), for tools and tests that send what no client
method would.

In core so that the trainer hooks, the controller and the shadows share one client; the server
side is the shadow node (``shadowgrad.shadow.node``) and the controller service.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Self

import torch
import zmq

from shadowgrad.bulk import StreamReader, connect_stream, endpoint_host
from shadowgrad.errors import ShadowgradTimeout
from shadowgrad.messages import (
    ConfigRequest,
    ControllerReleaseReply,
    ControllerReleaseRequest,
    ControllerStatus,
    ControllerStatusRequest,
    FetchReply,
    FetchRequest,
    FetchResult,
    FinishedReply,
    FinishedRequest,
    HoldReply,
    HoldRequest,
    LoadReply,
    LoadRequest,
    ReleaseReply,
    ReleaseRequest,
    ReplyT,
    RestorePointReply,
    RestorePointRequest,
    ShadowConfig,
    ShadowStatus,
    SnapshotReply,
    SnapshotRequest,
    StatusRequest,
    _Request,
)
from shadowgrad.tensorstream import ControlError, dest_bytes, encode_states, parse_entry
from shadowgrad.torch_dtypes import TORCH_DTYPES

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

    def ask(
        self,
        request: _Request,
        reply: type[ReplyT],
        frames: Sequence[memoryview | bytes] = (),
        timeout_s: float | None = None,
        *,
        copy: bool = True,
    ) -> tuple[ReplyT, list[Any]]:
        """Send ``request`` (its op, its JSON) and read the reply as ``reply`` (ControlError
        ``bad_reply`` naming the field when malformed); also the reply's frames."""
        header, out = self.call(request.op, frames, timeout_s, copy=copy, **request.to_json())
        return reply.from_json(header), out

    def finished(
        self,
        iteration: int | None,
        generation: int,
        requester: str,
        timeout_s: float | None = None,
    ) -> FinishedReply:
        """Tell the peer (a shadow or the controller: both serve ``finished``) that training
        (``generation`` of the job) ended normally after ``iteration``, the last iteration
        trained; a shadow's status then carries ``finished`` (as its reply does)."""
        out, _ = self.ask(
            FinishedRequest(iteration, generation, requester), FinishedReply, timeout_s=timeout_s
        )
        return out


class ControllerClient(ControlClient):
    """Blocking client of the controller's control endpoint (ops ``status``,
    ``restore_point``, ``finished``, ``release``)."""

    def status(self, timeout_s: float | None = None) -> ControllerStatus:
        """The controller's state machine, published restore point and counters."""
        out, _ = self.ask(ControllerStatusRequest(), ControllerStatus, timeout_s=timeout_s)
        return out

    def restore_point(
        self, requester: str, timeout_s: float | None = None, *, failed: int | None = None
    ) -> RestorePointReply:
        """The controller's restore point (``fresh``/``reachable`` or ``istar``/``source``/
        ``layout``, with ``generation_seen``); ``requester`` names the caller in its log;
        ``failed``: the iteration the caller was given and could not fetch (the controller
        then fixes and holds a new one)."""
        out, _ = self.ask(
            RestorePointRequest(requester, failed), RestorePointReply, timeout_s=timeout_s
        )
        return out

    def release(self, timeout_s: float | None = None) -> ControllerReleaseReply:
        """Drop the holds of the published restore point (the shadows released)."""
        out, _ = self.ask(ControllerReleaseRequest(), ControllerReleaseReply, timeout_s=timeout_s)
        return out


class ShadowClient(ControlClient):
    """Blocking client of one shadow's control endpoint; every call has a deadline (see
    :class:`ControlClient`)."""

    # -- ops -----------------------------------------------------------------------------

    def status(self, timeline: int = 16, *, brief: bool = False) -> ShadowStatus:
        """The shadow's status, typed (ControlError ``bad_reply`` when malformed); its
        ``timeline`` and ``pending`` carry ``timeline`` entries each; ``brief``: a health
        check's fields only (:class:`~shadowgrad.messages.StatusRequest`)."""
        out, _ = self.ask(StatusRequest(timeline, brief or None), ShadowStatus)
        return out

    def status_typed(self, timeline: int = 16) -> ShadowStatus:
        """Deprecated: :meth:`status` (which is typed now)."""
        warnings.warn(
            "ShadowClient.status_typed() is deprecated: status() returns the typed status",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.status(timeline)

    def config(self) -> ShadowConfig:
        """Layout, optimizer and generation of the shard this shadow holds (``not_loaded``
        when it holds none)."""
        out, _ = self.ask(ConfigRequest(), ShadowConfig)
        return out

    def hold(self, iteration: int) -> HoldReply:
        """Keep ``iteration``'s state until released (``unavailable`` when not held here)."""
        out, _ = self.ask(HoldRequest(iteration), HoldReply)
        return out

    def release(self, iteration: int) -> ReleaseReply:
        """Drop the hold on ``iteration``."""
        out, _ = self.ask(ReleaseRequest(iteration), ReleaseReply)
        return out

    def fetch_raw(
        self,
        iteration: int | None = None,
        boxes: Sequence[int] | None = None,
        timeout_s: float | None = None,
        *,
        copy: bool = True,
        stream: bool = False,
    ) -> FetchReply:
        """Like :meth:`fetch`, without decoding: the stream as it came (see :class:`FetchReply`;
        ``copy=False``: its frames are views of zmq's receive buffers). ``stream``: ask for
        the bytes on a bulk connection (:mod:`shadowgrad.bulk`); when the reply offers one
        (``reply.stream``: a shadow without it sends frames) the caller must read it, within
        the ticket's life, with :meth:`open_stream`."""
        request = FetchRequest(
            iteration, None if boxes is None else tuple(boxes), True if stream else None
        )
        header, frames = self.call(request.op, (), timeout_s, copy=copy, **request.to_json())
        return FetchReply.from_wire_frames(header, frames)

    def open_stream(self, reply: FetchReply, deadline: float) -> StreamReader:
        """Connect to the bulk stream ``reply`` offers (on this shadow's control host) and
        present its ticket; everything, reading included, by ``deadline`` (monotonic)."""
        if reply.stream is None:
            raise ControlError("bad_reply", "fetch reply offers no stream")
        return connect_stream(endpoint_host(self.endpoint), reply.stream, deadline)

    def fetch(
        self,
        iteration: int | None = None,
        boxes: Sequence[int] | None = None,
        timeout_s: float | None = None,
        *,
        stream: bool = False,
    ) -> FetchResult:
        """State at ``iteration`` (None: the newest applied) of ``boxes`` (None: all), in new
        tensors. ``stream``: the bytes over the bulk channel when the shadow offers it (the
        whole call then has ``timeout_s`` for the request and as much again for the bytes)."""
        reply = self.fetch_raw(iteration, boxes, timeout_s, stream=stream)
        if reply.stream is None:
            return reply.decode()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        states: dict[int, dict[str, torch.Tensor]] = {}
        with self.open_stream(reply, time.monotonic() + timeout) as reader:
            for entry in reply.entries:
                t = parse_entry(entry)
                buf = torch.empty(t.nbytes, dtype=torch.uint8)
                reader.read_into(dest_bytes(t, buf), t.crcs, f"{t.key!r} of box {t.box}")
                states.setdefault(t.box, {})[t.key] = buf.view(TORCH_DTYPES[t.dtype]).reshape(
                    t.shape
                )
        return FetchResult(reply.iteration, states, reply.commit)

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
    ) -> LoadReply:
        """Bootstrap the shadow with its shard's state at ``iteration`` (per box, shard order);
        ``commit``: COMMIT(``iteration``) (:func:`commit_to_json` form) to keep with it.
        ``generation``, ``reseed`` and ``source`` (a trainer's bootstrap or re-seed: its
        generation, whether it re-seeds a running shadow, who sends) travel only when given.
        ``states=None``: a *keep* load, no state travels: the shadow installs its own state of
        ``iteration`` (the restore point it just served: live or held) as the new session's
        start, or refuses with ``unavailable`` when it has not got it."""
        if states is None:
            entries: list[dict[str, Any]] = []
            frames: list[memoryview] = []
        else:
            entries, frames = encode_states(list(enumerate(states)))
        request = LoadRequest(
            iteration,
            optimizer_json,
            layout_json,
            tuple(entries),
            keep=True if states is None else None,
            generation=generation,
            reseed=reseed,
            source=source,
            commit=None if commit is None else dict(commit),
        )
        out, _ = self.ask(request, LoadReply, frames, timeout_s)
        return out

    def snapshot(self, wait: bool = True, timeout_s: float | None = None) -> SnapshotReply:
        """Write the consistent iteration to ``shadows.snapshot_dir`` now."""
        out, _ = self.ask(SnapshotRequest(wait), SnapshotReply, timeout_s=timeout_s)
        return out
