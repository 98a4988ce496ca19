"""The project's P4Runtime client: one ``StreamChannel`` (arbitration, packet-in/out, digests)
read by a thread, pipeline push and fetch, Write and Read, with a deadline on every call.

Built on the protobufs and stubs that p4runtime-shell installs (``p4.v1.p4runtime_pb2``,
``p4.v1.p4runtime_pb2_grpc``, ``p4.config.v1.p4info_pb2``) and ``grpc``; ``p4runtime_sh`` itself
is never imported (its ``setup()`` calls ``sys.exit``).

Errors: a failed Write raises :class:`P4RuntimeWriteError`, whose ``errors`` lists the updates
that failed, decoded from the ``grpc-status-details-bin`` trailer; every other failed RPC raises
:class:`P4RuntimeError` with ``code`` (a ``grpc.StatusCode``).

Reconnection: when the stream has ended (the switch went away) or an RPC failed with
``UNAVAILABLE``, :meth:`P4RuntimeClient.reconnect` opens a new channel and stream and arbitrates
again with the same election id. :meth:`~P4RuntimeClient.write` and
:meth:`~P4RuntimeClient.read` do that by themselves for a client that has connected: before the
call if the stream is known to have ended, and after a call that failed with ``UNAVAILABLE``,
which is then retried once. Only ``UNAVAILABLE`` is retried: gRPC reports it when the call could
not be delivered (no connection, connection refused or reset), so the switch did not act on it.
``DEADLINE_EXCEEDED``, ``UNKNOWN`` (a Write with per-update errors) and every other code may
mean the switch applied part of a batch, and are raised as they are. (A connection that drops
after the switch received a Write also reads ``UNAVAILABLE``; then the switch restarted and lost
its state, or the retry fails visibly, e.g. ``ALREADY_EXISTS`` for inserts already applied.)
A switch that restarted has no pipeline: push it again (:meth:`~P4RuntimeClient.set_pipeline`)
before writing.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import text_format  # type: ignore[import-untyped]
from google.rpc import status_pb2  # type: ignore[import-untyped]
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from shadowgrad.errors import P4RuntimeError

__all__ = ["P4RuntimeClient", "P4RuntimeError", "P4RuntimeWriteError"]

log = logging.getLogger(__name__)

SC = grpc.StatusCode
_CODE_BY_VALUE: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}
_U64 = (1 << 64) - 1
_JOIN_S = 5.0


def _code_name(code: int) -> str:
    c = _CODE_BY_VALUE.get(code)
    return c.name if c is not None else str(code)


class P4RuntimeWriteError(P4RuntimeError):
    """A failed Write RPC. ``errors`` holds ``(index, update, p4.v1.Error)`` for each update
    that failed (those that succeeded are left out); it is empty when the switch refused the
    RPC as a whole (no details; e.g. ``PERMISSION_DENIED``), then ``code`` tells why."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None,
        errors: Sequence[tuple[int, p4runtime_pb2.Update, p4runtime_pb2.Error]] = (),
    ) -> None:
        super().__init__(message, code)
        self.errors = list(errors)


def status_details(e: grpc.RpcError) -> list[p4runtime_pb2.Error]:
    """The per-update ``p4.v1.Error`` list of a failed Write (empty if absent), decoded from the
    ``grpc-status-details-bin`` trailer (a ``google.rpc.Status``)."""
    trailing = getattr(e, "trailing_metadata", None)
    if trailing is None:
        return []
    for k, v in trailing() or ():
        if k == "grpc-status-details-bin":
            st = status_pb2.Status()
            st.ParseFromString(v)
            errs = []
            for a in st.details:
                er = p4runtime_pb2.Error()
                if a.Unpack(er):
                    errs.append(er)
            return errs
    return []


def _rpc_code(e: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(e, "code", None)
    return code() if callable(code) else None


def _rpc_details(e: grpc.RpcError) -> str:
    details = getattr(e, "details", None)
    return (details() if callable(details) else None) or str(e)


def _set_eid(msg: Any, election_id: int) -> None:
    msg.election_id.high = election_id >> 64
    msg.election_id.low = election_id & _U64


class _Stream:
    """One StreamChannel call: its outgoing queue, its reader thread and what it saw. A new one
    is made on every (re)connect; the reader ends when the stream ends."""

    def __init__(self, client: P4RuntimeClient, stub: Any) -> None:
        self.client = client
        self.out: queue.Queue[p4runtime_pb2.StreamMessageRequest | None] = queue.Queue()
        self.arb: queue.Queue[p4runtime_pb2.MasterArbitrationUpdate | None] = queue.Queue()
        self.ended = threading.Event()
        self.error: grpc.RpcError | None = None
        self.call = stub.StreamChannel(self._requests())
        self.reader = threading.Thread(target=self._read, name="p4rt-stream", daemon=True)
        self.reader.start()

    def _requests(self) -> Iterator[p4runtime_pb2.StreamMessageRequest]:
        while (m := self.out.get()) is not None:
            yield m

    def _read(self) -> None:
        c = self.client
        try:
            for m in self.call:
                kind = m.WhichOneof("update")
                if kind == "arbitration":
                    c.arbitration = m.arbitration
                    self.arb.put(m.arbitration)
                elif kind == "packet":
                    c.packet_ins.put(m.packet)
                elif kind == "digest":
                    c.digests.put(m.digest)
                    ack = p4runtime_pb2.StreamMessageRequest()
                    ack.digest_ack.digest_id = m.digest.digest_id
                    ack.digest_ack.list_id = m.digest.list_id
                    self.out.put(ack)
                elif kind == "error":
                    c.stream_errors.append(m.error)
                    log.warning("P4Runtime stream error: %s", m.error)
        except grpc.RpcError as e:
            self.error = e
            if _rpc_code(e) != SC.CANCELLED:
                log.info("P4Runtime stream to %s ended: %s", c.addr, _rpc_details(e))
        except Exception:
            log.exception("P4Runtime stream reader failed")
        finally:
            self.ended.set()
            self.arb.put(None)
            self.out.put(None)  # ends the request iterator

    def send(self, m: p4runtime_pb2.StreamMessageRequest) -> None:
        self.out.put(m)

    def close(self) -> None:
        self.out.put(None)
        with contextlib.suppress(Exception):
            self.call.cancel()
        if self.reader is not threading.current_thread():
            self.reader.join(_JOIN_S)
            if self.reader.is_alive():
                log.warning("P4Runtime stream reader did not end within %.0fs", _JOIN_S)


class P4RuntimeClient:
    """A P4Runtime controller session with one device.

    ``timeout_s`` is the deadline of every RPC and of the wait for the arbitration answer (and
    how long a reconnect that :meth:`write`/:meth:`read` start waits for the switch).
    ``request_log``, when given, is a file to which every Write and SetForwardingPipelineConfig
    request is appended in protobuf text format (like p4lang/tutorials'
    ``logs/s1-p4runtime-requests.txt``). ``role`` is the P4Runtime role name ("" = default).

    Counters: ``writes`` (updates the switch accepted, over all Write RPCs; a partly failed
    batch counts its updates that succeeded), ``write_rpcs`` and ``reads`` (Write and Read RPCs
    issued, retries included), ``reconnects``. PacketIns and digest lists land in the queues
    ``packet_ins`` and ``digests`` (digest lists are acked); stream errors in ``stream_errors``.
    Thread-safe; also a context manager (which closes, and does not connect).
    """

    def __init__(
        self,
        addr: str,
        device_id: int = 0,
        election_id: int = 1,
        *,
        timeout_s: float = 10.0,
        request_log: str | Path | None = None,
        role: str = "",
    ) -> None:
        if not 0 < election_id < (1 << 128):
            raise ValueError(f"election id must be 1..2**128-1, got {election_id}")
        self.addr = addr
        self.device_id = device_id
        self.election_id = election_id
        self.timeout_s = timeout_s
        self.role = role
        self.request_log = Path(request_log) if request_log is not None else None
        self.packet_ins: queue.Queue[p4runtime_pb2.PacketIn] = queue.Queue()
        self.digests: queue.Queue[p4runtime_pb2.DigestList] = queue.Queue()
        self.stream_errors: list[p4runtime_pb2.StreamError] = []
        self.arbitration: p4runtime_pb2.MasterArbitrationUpdate | None = None
        self.writes = 0
        self.write_rpcs = 0
        self.reads = 0
        self.reconnects = 0
        self._conn_lock = threading.RLock()  # channel and stream changes
        self._count_lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._stream: _Stream | None = None
        self._connected_once = False
        self._closed = False

    # ---- connection ------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """True while the stream opened by :meth:`connect` is up."""
        s = self._stream
        return s is not None and not s.ended.is_set()

    @property
    def is_primary(self) -> bool:
        """True if the latest arbitration update said this client is primary."""
        a = self.arbitration
        return self.connected and a is not None and a.status.code == 0

    def _check_open(self) -> None:
        if self._closed:
            raise P4RuntimeError(f"P4Runtime client for {self.addr} is closed")

    def _stub_now(self) -> Any:
        with self._conn_lock:
            self._check_open()
            if self._channel is None:
                self._channel = grpc.insecure_channel(
                    self.addr,
                    options=[
                        ("grpc.max_receive_message_length", 256 << 20),
                        ("grpc.max_send_message_length", 256 << 20),
                    ],
                )
                self._stub = p4runtime_pb2_grpc.P4RuntimeStub(self._channel)
            return self._stub

    def connect(self, wait_s: float = 30.0) -> None:
        """Wait up to ``wait_s`` for the switch, open the stream and become primary (waiting
        ``timeout_s`` for the answer). A no-op while connected. Raises :class:`P4RuntimeError`:
        ``UNAVAILABLE`` if the switch did not answer in time, ``DEADLINE_EXCEEDED`` without an
        arbitration answer, the answer's code (e.g. ``ALREADY_EXISTS``) if not primary."""
        with self._conn_lock:
            if self.connected:
                return
            self._open(wait_s)

    def reconnect(self, wait_s: float = 30.0) -> None:
        """Drop the channel and stream, open new ones (waiting up to ``wait_s`` for the switch)
        and arbitrate again with the same election id. The pipeline is not pushed: a switch
        that restarted needs :meth:`set_pipeline` again."""
        with self._conn_lock:
            self._check_open()
            self._drop()
            self._open(wait_s)
            self.reconnects += 1
            log.info("P4Runtime client reconnected to %s", self.addr)

    def _open(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        stub = self._stub_now()
        assert self._channel is not None
        fut = grpc.channel_ready_future(self._channel)
        try:
            fut.result(timeout=wait_s)
        except grpc.FutureTimeoutError:
            fut.cancel()
            raise P4RuntimeError(
                f"P4Runtime server {self.addr} not reachable within {wait_s:g}s", SC.UNAVAILABLE
            ) from None
        while True:
            err = self._arbitrate(stub)
            if err is None:
                self._connected_once = True
                return
            self._drop_stream()
            # right after a reconnect the switch may not have dropped our old stream yet and
            # refuses the election id as in use (INVALID_ARGUMENT): try again while time is left
            if err.code != SC.INVALID_ARGUMENT or time.monotonic() + 0.1 > deadline:
                raise err
            time.sleep(0.1)

    def _arbitrate(self, stub: Any) -> P4RuntimeError | None:
        """Open a stream and ask to be primary; None if it is, else the error."""
        s = _Stream(self, stub)
        self._stream = s
        r = p4runtime_pb2.StreamMessageRequest()
        r.arbitration.device_id = self.device_id
        _set_eid(r.arbitration, self.election_id)
        if self.role:
            r.arbitration.role.name = self.role
        s.send(r)
        try:
            upd = s.arb.get(timeout=self.timeout_s)
        except queue.Empty:
            return P4RuntimeError(
                f"{self.addr}: no arbitration answer within {self.timeout_s:g}s",
                SC.DEADLINE_EXCEEDED,
            )
        if upd is None:
            why = _rpc_details(s.error) if s.error is not None else "closed"
            code = _rpc_code(s.error) if s.error is not None else None
            return P4RuntimeError(
                f"{self.addr}: stream ended during arbitration: {why}", code or SC.UNAVAILABLE
            )
        if upd.status.code != 0:
            return P4RuntimeError(
                f"{self.addr}: not primary for device {self.device_id} (election id "
                f"{self.election_id}): {upd.status.message!r}",
                _CODE_BY_VALUE.get(upd.status.code, SC.UNKNOWN),
            )
        return None

    def _drop_stream(self) -> None:
        s, self._stream = self._stream, None
        if s is not None:
            s.close()

    def _drop(self) -> None:
        self._drop_stream()
        ch, self._channel, self._stub = self._channel, None, None
        if ch is not None:
            with contextlib.suppress(Exception):
                ch.close()

    def _ensure_stream(self) -> None:
        """Reconnect first if this client connected once and its stream has ended since."""
        with self._conn_lock:
            self._check_open()
            if self._connected_once and not self.connected:
                self.reconnect(self.timeout_s)

    def _retry_after(self, e: grpc.RpcError) -> str | None:
        """After a failed call: reconnect if that is the cure. None if the call should be
        retried, else why it should not (for the error message; "" = not a connection error)."""
        if _rpc_code(e) != SC.UNAVAILABLE or not self._connected_once:
            return ""
        try:
            self.reconnect(self.timeout_s)
        except P4RuntimeError as re:
            return f" (reconnect failed: {re})"
        return None

    def close(self) -> None:
        """End the stream (joining its reader, at most 5 s) and the channel; idempotent."""
        with self._conn_lock:
            if self._closed:
                return
            self._closed = True
            self._drop()

    def __enter__(self) -> P4RuntimeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- request log -----------------------------------------------------------------------
    def _log_request(self, kind: str, text: str) -> None:
        if self.request_log is None:
            return
        now = datetime.datetime.now()
        stamp = now.strftime("%Y-%m-%d %H:%M:%S.") + f"{now.microsecond // 1000:03d}"
        with self._log_lock:
            self.request_log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.request_log, "a", encoding="utf-8") as f:
                f.write(f"[{stamp}] {kind}\n{text}\n")
                f.flush()

    def _log_pipeline(self, req: p4runtime_pb2.SetForwardingPipelineConfigRequest) -> None:
        if self.request_log is None:
            return
        short = p4runtime_pb2.SetForwardingPipelineConfigRequest()
        short.CopyFrom(req)
        short.config.ClearField("p4info")
        short.config.ClearField("p4_device_config")
        info = req.config.p4info
        name = info.pkg_info.name or "-"
        summary = (
            f"# p4info: {name}: {len(info.tables)} tables, {len(info.actions)} actions, "
            f"{len(info.counters)} counters, {len(info.direct_counters)} direct "
            f"counters, {len(info.digests)} digests, {len(info.registers)} registers\n"
            f"# p4_device_config: {len(req.config.p4_device_config)} bytes\n"
        )
        self._log_request(
            "SetForwardingPipelineConfigRequest", text_format.MessageToString(short) + summary
        )

    # ---- pipeline --------------------------------------------------------------------------
    def set_pipeline(
        self, p4info: p4info_pb2.P4Info, device_config: bytes, cookie: int = 0
    ) -> None:
        """SetForwardingPipelineConfig(VERIFY_AND_COMMIT): install a program (which resets all
        switch state)."""
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            role=self.role,
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
        )
        _set_eid(req, self.election_id)
        req.config.p4info.CopyFrom(p4info)
        req.config.p4_device_config = device_config
        req.config.cookie.cookie = cookie
        self._log_pipeline(req)
        try:
            self._stub_now().SetForwardingPipelineConfig(req, timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise P4RuntimeError(
                f"SetForwardingPipelineConfig: {_rpc_details(e)}", _rpc_code(e)
            ) from None

    def get_pipeline(self) -> tuple[p4info_pb2.P4Info | None, bytes, int]:
        """GetForwardingPipelineConfig(ALL): ``(p4info, device_config, cookie)``;
        ``(None, b"", 0)`` when no pipeline is set (the switch answers FAILED_PRECONDITION)."""
        req = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.ALL,
        )
        try:
            resp = self._stub_now().GetForwardingPipelineConfig(req, timeout=self.timeout_s)
        except grpc.RpcError as e:
            if _rpc_code(e) == SC.FAILED_PRECONDITION:
                return None, b"", 0
            raise P4RuntimeError(
                f"GetForwardingPipelineConfig: {_rpc_details(e)}", _rpc_code(e)
            ) from None
        cfg = resp.config
        p4info = cfg.p4info if cfg.HasField("p4info") else None
        return p4info, bytes(cfg.p4_device_config), int(cfg.cookie.cookie)

    def capabilities(self) -> str:
        """The switch's P4Runtime API version (Capabilities RPC)."""
        try:
            resp = self._stub_now().Capabilities(
                p4runtime_pb2.CapabilitiesRequest(), timeout=self.timeout_s
            )
        except grpc.RpcError as e:
            raise P4RuntimeError(f"Capabilities: {_rpc_details(e)}", _rpc_code(e)) from None
        return str(resp.p4runtime_api_version)

    # ---- Write / Read ----------------------------------------------------------------------
    def write(self, updates: Sequence[p4runtime_pb2.Update]) -> None:
        """One Write RPC (``CONTINUE_ON_ERROR``) with ``updates``, in order. Raises
        :class:`P4RuntimeWriteError` if it fails (the other updates of the batch were applied),
        :class:`P4RuntimeError` if it could not be sent (reconnecting failed). Retried once
        after a reconnect on ``UNAVAILABLE`` only (see the module docstring)."""
        if isinstance(updates, p4runtime_pb2.Update):
            raise TypeError("write() takes a sequence of Updates, not one Update")
        ups = list(updates)
        req = p4runtime_pb2.WriteRequest(device_id=self.device_id, role=self.role)
        _set_eid(req, self.election_id)
        req.updates.extend(ups)
        self._ensure_stream()
        retried = False
        while True:
            self._log_request(
                "WriteRequest" + (" (retry after reconnect)" if retried else ""),
                text_format.MessageToString(req),
            )
            with self._count_lock:
                self.write_rpcs += 1
            try:
                self._stub_now().Write(req, timeout=self.timeout_s)
            except grpc.RpcError as e:
                why = "" if retried else self._retry_after(e)
                if why is None:
                    retried = True
                    continue
                raise self._write_error(e, ups, why) from None
            with self._count_lock:
                self.writes += len(ups)
            return

    def _write_error(
        self, e: grpc.RpcError, ups: list[p4runtime_pb2.Update], why: str
    ) -> P4RuntimeWriteError:
        details = status_details(e)
        failed = [
            (i, ups[i], er) for i, er in enumerate(details[: len(ups)]) if er.canonical_code != 0
        ]
        if details:
            with self._count_lock:
                self.writes += min(len(details), len(ups)) - len(failed)
        code = _rpc_code(e)
        if failed:
            kinds = p4runtime_pb2.Update.Type
            parts = [
                f"#{i} {kinds.Name(u.type)} {u.entity.WhichOneof('entity')}: "
                f"{_code_name(er.canonical_code)}: {er.message}"
                for i, u, er in failed
            ]
            msg = f"Write: {len(failed)} of {len(ups)} updates failed: " + "; ".join(parts)
        else:
            msg = f"Write: {code.name if code else 'error'}: {_rpc_details(e)}{why}"
        return P4RuntimeWriteError(msg, code, failed)

    def read(self, entities: Iterable[p4runtime_pb2.Entity]) -> list[p4runtime_pb2.Entity]:
        """One Read RPC for ``entities`` (wildcards allowed); every entity of every response.
        The whole stream of responses has the ``timeout_s`` deadline. Retried once after a
        reconnect on ``UNAVAILABLE`` (a read has no effect, so also one cut off midway)."""
        if isinstance(entities, p4runtime_pb2.Entity):
            raise TypeError("read() takes a sequence of Entities, not one Entity")
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id, role=self.role)
        req.entities.extend(entities)
        self._ensure_stream()
        retried = False
        while True:
            with self._count_lock:
                self.reads += 1
            out: list[p4runtime_pb2.Entity] = []
            try:
                for resp in self._stub_now().Read(req, timeout=self.timeout_s):
                    out.extend(resp.entities)
            except grpc.RpcError as e:
                why = "" if retried else self._retry_after(e)
                if why is None:
                    retried = True
                    continue
                code = _rpc_code(e)
                raise P4RuntimeError(
                    f"Read: {code.name if code else 'error'}: {_rpc_details(e)}{why}", code
                ) from None
            return out

    # ---- stream ----------------------------------------------------------------------------
    def packet_out(self, payload: bytes, metadata: Sequence[tuple[int, bytes]] = ()) -> None:
        """Queue a PacketOut (``metadata`` as ``(metadata_id, value)``) on the stream; errors
        the switch reports come back in ``stream_errors``."""
        s = self._stream
        if s is None or s.ended.is_set():
            raise P4RuntimeError(f"P4Runtime stream to {self.addr} is not open", SC.UNAVAILABLE)
        r = p4runtime_pb2.StreamMessageRequest()
        r.packet.payload = payload
        for mid, value in metadata:
            r.packet.metadata.add(metadata_id=mid, value=value)
        s.send(r)
