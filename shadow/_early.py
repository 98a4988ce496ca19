"""The control endpoint of a shadow process that is still starting (``shadowgrad shadow``).

A shadow process binds its control endpoint before it imports torch and the shadow node (that
takes seconds on a busy machine, more than the control clients' timeouts), so whoever polls it
sees it at once. Until the node is up, :class:`EarlyControl` answers on that socket:

* ``status`` at once, an unloaded node's :class:`~shadowgrad.messages.ShadowStatus`
  (``ShadowNode.status``) with ``"starting": true`` (the node's own reply says ``false``);
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

import logging
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import zmq

from shadowgrad import events
from shadowgrad._control_server import (
    Context,
    ControlServer,
    Handler,
    Reply,
    Request,
    Socket,
    bind_router,
    error_reply,
)
from shadowgrad._log import event
from shadowgrad.config import JobSpec
from shadowgrad.errors import ShadowgradError
from shadowgrad.messages import ShadowStatus, StatusRequest

__all__ = ["EarlyControl", "new_incarnation", "shadow_control_server", "starting_status"]

log = logging.getLogger(__name__)


def new_incarnation() -> str:
    """A shadow process's identity (ShadowStatus.incarnation): random, drawn once per start."""
    return secrets.token_hex(8)


def shadow_control_server(
    ctx: Context,
    sock: Socket,
    token: str,
    shadow_id: int,
    *,
    counters: Counter[str],
    logger: logging.Logger,
    poll_s: float,
    handlers: Mapping[str, Handler],
    name: str = "control",
    **options: Any,
) -> ControlServer:
    """The control server of shadow ``shadow_id``'s endpoint, whoever answers on it (the node,
    or :class:`EarlyControl` while the process starts): both count and log a bad token as the
    shadow's event, with its id, and run as thread ``shadow<id>-<name>``. ``options``: the rest
    of :class:`~shadowgrad._control_server.ControlServer`'s (``stop``, ``refusal``,
    ``defer``)."""
    return ControlServer(
        ctx,
        sock,
        token,
        counters=counters,
        logger=logger,
        bad_token_event=events.SHADOW_CONTROL_BAD_TOKEN,
        event_fields={"shadow": shadow_id},
        poll_s=poll_s,
        handlers=handlers,
        name=f"shadow{shadow_id}-{name}",
        **options,
    )


#: ops whose answer from an unloaded node is a fixed refusal: answered while starting
_NOT_LOADED_OPS = frozenset({"config", "hold", "fetch"})


def starting_status(
    shadow_id: int, silent_s: float, events: dict[str, int], incarnation: str | None = None
) -> ShadowStatus:
    """The ``status`` reply of shadow ``shadow_id`` while its process starts: what an unloaded
    node answers (``ShadowNode.status``, same keys), with ``starting`` true."""
    return ShadowStatus(
        shadow=shadow_id,
        loaded=False,
        shard=None,
        replica=None,
        layout=None,
        owned_bytes=None,
        last_ready=None,
        last_applied=None,
        istar=None,
        newest_seen=-1,
        lag=0,
        diverged_at=None,
        trainers_silent_s=round(max(0.0, silent_s), 3),
        ranks={},
        generation=0,
        window=None,
        buffered=0,
        holds=(),
        available=(),
        counters={},
        events=dict(events),
        peers={},
        timeline=(),
        pending={},
        last_snapshot=None,
        finished=None,
        starting=True,
        incarnation=incarnation,
        clock=time.monotonic(),
    )


class EarlyControl:
    """Shadow ``shadow_id``'s control endpoint while the process starts (module docstring).

    Binds ``control_bind`` (default ``tcp://<host>:<control_port + id>``, as the node would)
    at construction (:class:`ShadowgradError` when it cannot); :meth:`start` serves it from a
    thread (a :class:`~shadowgrad._control_server.ControlServer` of its own) until
    :meth:`handover` (or :meth:`close`)."""

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
        self.started_at = time.monotonic()
        #: this process's identity in every status (the node keeps it: ``ShadowNode(incarnation=)``)
        self.incarnation = new_incarnation()
        if control_bind is None:
            control_bind = f"tcp://{spec.shadows.control_endpoint(shadow_id)}"
        try:
            ctx, sock = bind_router(control_bind)
        except zmq.ZMQError as e:
            raise ShadowgradError(
                f"shadow {shadow_id}: cannot bind its control endpoint {control_bind}: {e}"
            ) from None
        #: the node's event counters for what was served here (control_<op>, bad requests)
        self.ev: Counter[str] = Counter()
        self._server = shadow_control_server(
            ctx,
            sock,
            token if token is not None else spec.token(),
            shadow_id,
            counters=self.ev,
            logger=log,
            poll_s=tick_s,
            handlers={
                "status": self._op_status,
                **dict.fromkeys(_NOT_LOADED_OPS, self._op_not_loaded),
            },
            name="control-early",
            defer=self._defer,
        )
        self.control_endpoint: str = self._server.endpoint

    def start(self) -> EarlyControl:
        self._server.start()
        event(log, events.SHADOW_STARTING, shadow=self.id, control=self.control_endpoint)
        return self

    def handover(
        self,
    ) -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes], list[Request]]:
        """Stop serving; return the context, the bound socket (the caller owns both now) and
        the requests kept for the node, oldest first."""
        self._server.halt()
        if self._server.error is not None:
            self.close()
            raise ShadowgradError(
                f"shadow {self.id}: control endpoint failed: {self._server.error!r}"
            )
        return self._server.handover()

    def close(self) -> None:
        """Stop serving and close the socket (a start that failed). Idempotent."""
        self._server.close()

    # ---------------------------------------------------------------- handlers

    def _defer(self, op: object) -> bool:
        """Kept for the node: every op but ``status`` and the not-loaded refusals, and those
        too once something is kept (in order, after what is already kept)."""
        return op != "status" and (bool(self._server.backlog) or op not in _NOT_LOADED_OPS)

    def _op_status(self, req: dict[str, Any], _f: list[memoryview]) -> Reply:
        StatusRequest.from_json(req)  # validated (a starting shadow has no timeline)
        return starting_status(
            self.id, time.monotonic() - self.started_at, dict(self.ev), self.incarnation
        ).to_json(), []

    def _op_not_loaded(self, _req: dict[str, Any], _f: list[memoryview]) -> Reply:
        return error_reply("not_loaded", "shadow not loaded"), []
