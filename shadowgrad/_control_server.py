"""Server side of the control protocol: the one ZeroMQ ROUTER request loop that every control
endpoint runs (the shadow node, a shadow process while it starts, the controller service).
Standard library and zmq only (no torch: a starting shadow serves with it before importing torch).

The wire format is the one :mod:`shadowgrad.control_client` speaks: a request is a multipart
message ``[header, *frames]`` from a REQ socket (the ROUTER sees ``[identity, b"", header,
*frames]``), the header a JSON object with ``op`` and the job's ``token``; a reply is
``[header, *frames]``, the header ``{"ok": true, ...}`` or ``{"ok": false, "code": ...,
"error": ...}`` (:class:`~shadowgrad.errors.ControlError` codes).

A :class:`ControlServer` is used in this order:

1. **bind** -- :func:`bind_router` creates the context and the ROUTER socket and binds it (the
   only place a ROUTER socket is made). A shadow process binds before it imports torch.
2. **construct and register** -- ``ControlServer(ctx, sock, token, ...)`` takes the bound socket
   (it owns it from now on) and :meth:`ControlServer.register` adds a handler per op name (one
   dict: op -> :data:`Handler`). The owner passes the :class:`~collections.Counter` its events
   are counted in, the logger and the event prefix its events are logged under, and, where it
   needs them, how its handlers' exceptions are answered (``refusal``) and which requests are
   kept for later (``defer``).
3. **serve** -- :meth:`ControlServer.serve` runs the loop on the caller's thread until the
   ``stop`` event is set (the owner's thread, e.g. the node's guarded control thread), or
   :meth:`ControlServer.start` runs it on a thread of the server's own. Each request:

   a. its routing envelope is split off (no empty delimiter: counted ``control_malformed``,
      not answered); the time of receipt is :attr:`ControlServer.request_at` while it is served;
   b. its header is read and its token checked (:func:`check_request`): refused as
      ``bad_request`` or ``bad_token`` (counted ``control_<code>``; a bad token is also logged
      as the warning event ``bad_token_event``, e.g. ``shadow.control_bad_token``);
   c. ``defer(op)`` true: the request is kept, unanswered, in :attr:`ControlServer.backlog`;
   d. an op without a handler: ``bad_request`` (``unknown op``, counted ``control_bad_request``);
   e. else counted ``control_<op>`` (before the handler runs: a ``status`` reply counts itself)
      and the handler's reply is sent. A handler's exception is answered, in this order, by
      ``refusal(e)`` when that gives a ``(code, error)``; a :class:`ControlError` with its code
      and text; anything else as ``internal`` (logged with its traceback, counted
      ``control_internal``): the loop keeps serving.

   A reply that cannot be sent is counted ``control_send_error`` and logged. A reply whose
   frames are :class:`TrackedFrames` (views of memory its owner may change later, sent without
   a copy) is sent with a :class:`zmq.MessageTracker`, handed to ``frames.on_sent`` once the
   frames are queued (``None`` when the send failed: nothing of them is in flight); the owner
   waits on it before it writes that memory again.
4. **handover** (optional) -- :meth:`ControlServer.handover` stops the loop and returns the
   context, the still bound socket and the kept requests; a new server on the same socket
   (step 2) serves those first (``serve(backlog)``), so no request is lost between the two.
5. **close** -- :meth:`ControlServer.close` stops the loop (joined with a deadline) and closes
   the socket and the context.

Every wait is bounded: the loop polls with ``poll_s`` and checks ``stop`` between polls.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self

import zmq

from shadowgrad import events
from shadowgrad._log import event
from shadowgrad.errors import ControlError, ShadowgradError

__all__ = [
    "ControlServer",
    "Defer",
    "Handler",
    "Refusal",
    "Reply",
    "Request",
    "TrackedFrames",
    "bind_router",
    "check_request",
    "error_reply",
]

log = logging.getLogger(__name__)

#: a reply: its header (JSON-encoded on the wire) and binary frames (sent without a copy)
Reply = tuple[dict[str, Any], Sequence[Any]]
#: an op's handler: (request header, request frames as views of zmq's buffers) -> reply
Handler = Callable[[dict[str, Any], list[memoryview]], Reply]
#: the ``(code, error)`` of the reply to an exception a handler raised, or None (the default)
Refusal = Callable[[Exception], tuple[str, str] | None]
#: whether a request for ``op`` (as it came: any JSON value) is kept for later, not served now
Defer = Callable[[object], bool]
#: a request as the ROUTER received it: routing envelope, empty delimiter, header, frames
Request = list[zmq.Frame]

Context = zmq.Context[zmq.Socket[bytes]]
Socket = zmq.Socket[bytes]


class TrackedFrames(list[Any]):
    """A reply's frames over memory that stays its owner's: the server sends them without a
    copy and calls ``on_sent`` with the :class:`zmq.MessageTracker` of every frame (its ``done``
    once libzmq has let go of all of them: written to the connection, or the connection gone),
    or with None when the reply could not be sent. ``on_sent`` is called exactly once, on the
    server's thread, after the handler returned."""

    def __init__(
        self, frames: Iterable[Any], on_sent: Callable[[zmq.MessageTracker | None], None]
    ) -> None:
        super().__init__(frames)
        self.on_sent = on_sent


def error_reply(code: str, error: str) -> dict[str, Any]:
    """The reply header of a refused or failed request."""
    return {"ok": False, "code": code, "error": error}


def check_request(head: bytes, token: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(request, None)`` when the request header ``head`` may be served; else ``(request,
    error reply)``: ``bad_request`` when it is not a JSON object (the request is then ``{}``),
    ``bad_token`` when its token is not the job's ``token`` (compared in constant time)."""
    try:
        req = json.loads(head)
        if not isinstance(req, dict):
            raise ValueError("request is not an object")
    except ValueError as e:
        return {}, error_reply("bad_request", f"not JSON: {e}")
    tok = req.get("token")
    if not isinstance(tok, str) or not hmac.compare_digest(tok.encode(), token.encode()):
        return req, error_reply("bad_token", "wrong or missing job token")
    return req, None


def bind_router(address: str) -> tuple[Context, Socket]:
    """A new context and a ROUTER socket (linger 0) bound to ``address`` (a zmq address;
    ``tcp://127.0.0.1:*`` picks a free port). Raises :class:`zmq.ZMQError` when it cannot bind,
    both closed then (the caller words the error)."""
    ctx: Context = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.bind(address)
    except zmq.ZMQError:
        sock.close(linger=0)
        ctx.term()
        raise
    return ctx, sock


class ControlServer:
    """The request loop of one bound ROUTER socket (module docstring: call order, what is
    counted and how errors are answered).

    ``counters``: where the events are counted (the owner's, e.g. ``ShadowNode.ev``);
    ``logger``, ``bad_token_event`` and ``event_fields``: how its events are logged (the
    :mod:`shadowgrad.events` name of a refused token, with ``event_fields`` and ``op``);
    ``poll_s``: the poll interval (how
    long a stop may take to be seen); ``stop``: the event that ends :meth:`serve` (default: the
    server's own; an owner passes its own to stop every thread at once); ``name``: the thread's
    name (:meth:`start`) and the label in the log."""

    def __init__(
        self,
        ctx: Context,
        sock: Socket,
        token: str,
        *,
        counters: Counter[str] | None = None,
        logger: logging.Logger | None = None,
        bad_token_event: str = events.CONTROL_BAD_TOKEN,
        event_fields: Mapping[str, Any] | None = None,
        poll_s: float = 0.1,
        stop: threading.Event | None = None,
        refusal: Refusal | None = None,
        defer: Defer | None = None,
        handlers: Mapping[str, Handler] | None = None,
        name: str = "control",
    ) -> None:
        self._ctx = ctx
        self._sock = sock
        self._token = token
        self.ev: Counter[str] = counters if counters is not None else Counter()
        self._log = logger or log
        self._bad_token_event = bad_token_event
        self._fields = dict(event_fields or {})
        self._poll_ms = max(1, int(poll_s * 1000))
        self._stop = stop if stop is not None else threading.Event()
        self._refusal = refusal
        self._defer = defer
        self._handlers: dict[str, Handler] = dict(handlers or {})
        self.name = name
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        #: the bound address (the port picked when it was ``*``)
        self.endpoint: str = last.decode() if isinstance(last, bytes) else str(last)
        #: when the request being served was received (``time.perf_counter``); None between
        self.request_at: float | None = None
        #: the same request's receipt on the monotonic clock (a peer relates it to its own
        #: clock: ``LoadReply.received_at``); the last request's once it is served
        self.received_at: float | None = None
        #: requests kept unanswered (``defer``), oldest first
        self.backlog: list[Request] = []
        #: what ended the server's own thread (:meth:`start`), if anything did
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    # ---------------------------------------------------------------- handlers

    def register(self, op: str, handler: Handler) -> None:
        """Serve ``op`` with ``handler`` (replacing the one it had)."""
        self._handlers[op] = handler

    @property
    def ops(self) -> frozenset[str]:
        """The ops served."""
        return frozenset(self._handlers)

    # ---------------------------------------------------------------- loop

    def serve(self, backlog: Iterable[Sequence[zmq.Frame]] = ()) -> None:
        """Serve ``backlog`` (requests kept by a server before this one, oldest first), then
        every request until ``stop`` is set. On the calling thread."""
        for parts in backlog:
            if self._stop.is_set():
                return
            self.handle(parts)
        sock = self._sock
        while not self._stop.is_set():
            if not sock.poll(self._poll_ms, zmq.POLLIN):
                continue
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            self.handle(parts, time.monotonic())

    def handle(self, parts: Sequence[zmq.Frame], received_at: float | None = None) -> None:
        """Serve one request as the ROUTER received it and send the reply (or keep it).
        ``received_at``: when it was taken off the socket (``time.monotonic()``; a handler
        reads it as :attr:`received_at`); now, for a kept one."""
        sep = next((k for k, p in enumerate(parts) if len(p) == 0), None)
        if sep is None or sep + 1 >= len(parts):
            self.ev["control_malformed"] += 1
            return
        self.request_at = time.perf_counter()
        self.received_at = time.monotonic() if received_at is None else received_at
        try:
            reply = self._dispatch(parts[sep + 1].bytes, [p.buffer for p in parts[sep + 2 :]])
        finally:
            self.request_at = None
        if reply is None:
            self.backlog.append(list(parts))
            return
        head, frames = reply
        envelope = [p.bytes for p in parts[: sep + 1]]
        tracked = frames if isinstance(frames, TrackedFrames) else None
        tracker: zmq.MessageTracker | None = None
        try:
            if tracked is not None:
                zframes = [zmq.Frame(f, copy=False, track=True) for f in tracked]
                tracker = zmq.MessageTracker(*zframes)
                frames = zframes
            self._sock.send_multipart([*envelope, json.dumps(head).encode(), *frames], copy=False)
        except zmq.ZMQError as e:
            tracker = None
            self.ev["control_send_error"] += 1
            self._log.warning("%s reply failed: %s", self.name, e)
        finally:
            if tracked is not None:
                tracked.on_sent(tracker)

    def _dispatch(self, head: bytes, frames: list[memoryview]) -> Reply | None:
        """The reply to one request, or None: kept (``defer``)."""
        req, refused = check_request(head, self._token)
        if refused is not None:
            self.ev[f"control_{refused['code']}"] += 1
            if refused["code"] == "bad_token":
                event(
                    self._log,
                    self._bad_token_event,
                    logging.WARNING,
                    **self._fields,
                    op=str(req.get("op")),
                )
            return refused, []
        op = req.get("op")
        if self._defer is not None and self._defer(op):
            return None
        handler = self._handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            self.ev["control_bad_request"] += 1
            return error_reply("bad_request", f"unknown op {op!r}"), []
        self.ev[f"control_{op}"] += 1
        try:
            return handler(req, frames)
        except Exception as e:
            answer = self._refusal(e) if self._refusal is not None else None
            if answer is not None:
                return error_reply(*answer), []
            if isinstance(e, ControlError):
                return error_reply(e.code, str(e)), []
            self.ev["control_internal"] += 1
            self._log.exception("%s: op %r failed", self.name, op)
            return error_reply("internal", f"{type(e).__name__}: {e}"), []

    # ---------------------------------------------------------------- own thread, stop

    def start(self) -> Self:
        """Serve on a thread of the server's own (daemon, named ``name``) until :meth:`halt`,
        :meth:`handover` or :meth:`close`; what ends it early is kept in :attr:`error`."""
        self._thread = threading.Thread(target=self._guard, name=self.name, daemon=True)
        self._thread.start()
        return self

    def _guard(self) -> None:
        try:
            self.serve()
        except BaseException as e:  # the owner must know (handover, close)
            self.error = e
            self._log.exception("%s: control thread died", self.name)

    def halt(self, timeout_s: float = 5.0) -> None:
        """Set ``stop`` and join the server's own thread, if it has one, within ``timeout_s``
        (:class:`ShadowgradError` when it did not end: the socket is still in use)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise ShadowgradError(f"{self.name}: did not stop within {timeout_s:g}s")
            self._thread = None

    def handover(self, timeout_s: float = 5.0) -> tuple[Context, Socket, list[Request]]:
        """Stop serving; return the context, the bound socket (the caller owns both now) and
        the kept requests, oldest first. The server is closed for its part."""
        self.halt(timeout_s)
        backlog, self.backlog = self.backlog, []
        self._closed = True
        return self._ctx, self._sock, backlog

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving (:meth:`halt`) and close the socket and the context. Idempotent; a
        no-op after :meth:`handover`."""
        self.halt(timeout_s)
        if self._closed:
            return
        self._closed = True
        self.backlog = []
        self._sock.close(linger=0)
        self._ctx.term()
