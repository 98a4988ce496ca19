"""The control endpoint of a shadow process that is still starting (``shadowgrad shadow``).

A shadow process binds its control endpoint before it imports torch and the shadow node (that
takes seconds on a busy machine, more than the control clients' timeouts), so whoever polls it
sees it at once. Until the node is up, :class:`EarlyControl` answers on that socket:

* ``status`` at once, in the shape of an unloaded node's reply (``ShadowNode.status``) with
  ``"starting": true`` (the node's own reply says ``false``);
* ``config``, ``hold`` and ``fetch`` at once with the ``not_loaded`` refusal an unloaded node
  gives; a request that is not JSON or has a wrong token with the refusal the node gives
  (:func:`shadowgrad._control_server.check_request`);
* every other request (``load``, ``release``, ``snapshot``, ``finished``, an unknown op), and
  every request after one of those but ``status``, is kept, in order, and served by the node as
  soon as it is up: a ``load`` sent to a starting shadow waits for it instead of failing.

:meth:`EarlyControl.handover` stops the thread and gives the bound socket, its context and the
kept requests to the node (``ShadowNode(control_socket=...)``, ``ShadowNode.start(backlog)``),
so no request is lost between the two. Standard library and zmq only: no torch here.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import Counter
from typing import Any

import zmq

from shadowgrad._control_server import check_request, error_reply
from shadowgrad._log import event
from shadowgrad.config import JobSpec
from shadowgrad.errors import ShadowgradError

__all__ = ["EarlyControl", "new_incarnation", "starting_status"]

log = logging.getLogger(__name__)


def new_incarnation() -> str:
    """A shadow process's identity (ShadowStatus.incarnation): random, drawn once per start."""
    return secrets.token_hex(8)


#: ops whose answer from an unloaded node is a fixed refusal: answered while starting
_NOT_LOADED_OPS = frozenset({"config", "hold", "fetch"})

#: a request as the ROUTER received it: routing envelope, empty delimiter, header, frames
Request = list[zmq.Frame]


def starting_status(
    shadow_id: int, silent_s: float, events: dict[str, int], incarnation: str | None = None
) -> dict[str, Any]:
    """The ``status`` reply of shadow ``shadow_id`` while its process starts: what an unloaded
    node answers (``ShadowNode.status``, same keys), plus ``"starting": true``."""
    return {
        "ok": True,
        "shadow": shadow_id,
        "loaded": False,
        "shard": None,
        "replica": None,
        "layout": None,
        "owned_bytes": None,
        "last_ready": None,
        "last_applied": None,
        "istar": None,
        "newest_seen": -1,
        "lag": 0,
        "diverged_at": None,
        "trainers_silent_s": round(max(0.0, silent_s), 3),
        "ranks": {},
        "generation": 0,
        "window": None,
        "buffered": 0,
        "holds": [],
        "available": [],
        "counters": {},
        "events": dict(events),
        "peers": {},
        "timeline": [],
        "pending": {},
        "last_snapshot": None,
        "finished": None,
        "starting": True,
        "incarnation": incarnation,
    }


class EarlyControl:
    """Shadow ``shadow_id``'s control endpoint while the process starts (module docstring).

    Binds ``control_bind`` (default ``tcp://<host>:<control_port + id>``, as the node would)
    at construction (:class:`ShadowgradError` when it cannot); :meth:`start` serves it from a
    thread until :meth:`handover` (or :meth:`close`)."""

    def __init__(
        self,
        spec: JobSpec,
        shadow_id: int,
        *,
        token: str | None = None,
        control_bind: str | None = None,
        tick_s: float = 0.05,
    ) -> None:
        if not 0 <= shadow_id < spec.shadows.count:
            raise ShadowgradError(f"shadow id {shadow_id} not in 0..{spec.shadows.count - 1}")
        self.id = shadow_id
        self._token = token if token is not None else spec.token()
        self._tick_ms = max(1, int(tick_s * 1000))
        self.started_at = time.monotonic()
        #: this process's identity in every status (the node keeps it: ``ShadowNode(incarnation=)``)
        self.incarnation = new_incarnation()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._rep = self._ctx.socket(zmq.ROUTER)
        self._rep.setsockopt(zmq.LINGER, 0)
        if control_bind is None:
            control_bind = f"tcp://{spec.shadows.control_endpoint(shadow_id)}"
        try:
            self._rep.bind(control_bind)
        except zmq.ZMQError as e:
            self._rep.close(linger=0)
            self._ctx.term()
            raise ShadowgradError(
                f"shadow {shadow_id}: cannot bind its control endpoint {control_bind}: {e}"
            ) from None
        last = self._rep.getsockopt(zmq.LAST_ENDPOINT)
        self.control_endpoint: str = last.decode() if isinstance(last, bytes) else str(last)
        #: the node's event counters for what was served here (control_<op>, bad requests)
        self.ev: Counter[str] = Counter()
        self._backlog: list[Request] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> EarlyControl:
        self._thread = threading.Thread(
            target=self._guard, name=f"shadow{self.id}-control-early", daemon=True
        )
        self._thread.start()
        event(log, "shadow.starting", shadow=self.id, control=self.control_endpoint)
        return self

    def handover(
        self,
    ) -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes], list[Request]]:
        """Stop serving; return the context, the bound socket (the caller owns both now) and
        the requests kept for the node, oldest first."""
        self._halt()
        if self._error is not None:
            self.close()
            raise ShadowgradError(f"shadow {self.id}: control endpoint failed: {self._error!r}")
        backlog, self._backlog = self._backlog, []
        return self._ctx, self._rep, backlog

    def close(self) -> None:
        """Stop serving and close the socket (a start that failed). Idempotent."""
        self._halt()
        self._backlog = []
        self._rep.close(linger=0)
        self._ctx.term()

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _guard(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # the node takes over the socket; it must know
            self._error = e
            log.exception("shadow %d: early control thread died", self.id)

    def _loop(self) -> None:
        rep = self._rep
        while not self._stop.is_set():
            if not rep.poll(self._tick_ms, zmq.POLLIN):
                continue
            try:
                parts = rep.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            sep = next((k for k, p in enumerate(parts) if len(p.bytes) == 0), None)
            if sep is None or sep + 1 >= len(parts):
                self.ev["control_malformed"] += 1
                continue
            reply = self._serve(parts[sep + 1].bytes)
            if reply is None:
                self._backlog.append(parts)
                continue
            envelope = [p.bytes for p in parts[: sep + 1]]
            try:
                rep.send_multipart([*envelope, json.dumps(reply).encode()])
            except zmq.ZMQError as e:
                self.ev["control_send_error"] += 1
                log.warning("control reply failed: %s", e)

    def _serve(self, head: bytes) -> dict[str, Any] | None:
        """The reply to a request now, or None: the node serves it once it is up."""
        req, refused = check_request(head, self._token)
        if refused is not None:
            if refused["code"] == "bad_token":
                self.ev["control_bad_token"] += 1
                event(
                    log,
                    "shadow.control_bad_token",
                    logging.WARNING,
                    shadow=self.id,
                    op=str(req.get("op")),
                )
            else:
                self.ev["control_bad_request"] += 1
            return refused
        op = req.get("op")
        if op == "status":
            self.ev["control_status"] += 1
            return starting_status(
                self.id, time.monotonic() - self.started_at, dict(self.ev), self.incarnation
            )
        if self._backlog or op not in _NOT_LOADED_OPS:
            return None  # in order, after what is already kept
        self.ev[f"control_{op}"] += 1
        return error_reply("not_loaded", "shadow not loaded")
