"""P4Runtime server for the software target (grpcio + the p4runtime 1.4.1 protobufs).

Behaves like PI's server in ``simple_switch_grpc`` where a controller can tell the difference:
API version ``"1.3.0"``; arbitration per (device, role) with the highest election id primary;
writes and pipeline changes only from the primary (``PERMISSION_DENIED``); a Write that fails in
any update ends with gRPC ``UNKNOWN`` whose ``grpc-status-details-bin`` is a ``google.rpc.Status``
holding one ``p4.v1.Error`` per update (``OK`` for those that succeeded); only
``CONTINUE_ON_ERROR`` atomicity; multicast group and clone session ids 1..32767; clone
``class_of_service``/``packet_length_bytes`` UNIMPLEMENTED; registers, meters and action profiles
UNIMPLEMENTED (bmv2 serves registers over Thrift only); PacketIn and digests to the primary only.

The server drives a :class:`Target` (``switch.Switch`` in production, a fake in protocol tests):
it verifies and installs pipelines and sends packet-outs to the ports; the target calls
:meth:`P4RuntimeServer.send_packet_in` and :meth:`P4RuntimeServer.send_digest` back.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from google.protobuf import any_pb2  # type: ignore[import-untyped]
from google.rpc import code_pb2, status_pb2  # type: ignore[import-untyped]
from p4.config.v1 import p4info_pb2
from p4.v1 import p4data_pb2, p4runtime_pb2, p4runtime_pb2_grpc

from shadowgrad.errors import P4RuntimeError

from . import dataplane as dp
from ._digests import DigestBuffer
from .runtime_target import RuntimeDataplane

__all__ = [
    "API_VERSION",
    "MAX_GROUP_ID",
    "P4RuntimeError",
    "Target",
    "P4RuntimeServer",
    "P4InfoIndex",
    "encode_int",
    "decode_int",
]

log = logging.getLogger(__name__)

API_VERSION = "1.3.0"
MAX_GROUP_ID = 32767
STREAM_QUEUE_MAX = 10000
_POLL_S = 0.25

SC = grpc.StatusCode
_CODE_BY_NAME: dict[str, grpc.StatusCode] = {c.name: c for c in grpc.StatusCode}


def _err(code: grpc.StatusCode, message: str) -> P4RuntimeError:
    return P4RuntimeError(message, code)


def _from_dataplane_error(e: Exception) -> P4RuntimeError:
    name = getattr(e, "code", None) or getattr(e, "grpc_code", None) or "UNKNOWN"
    if isinstance(name, grpc.StatusCode):
        return P4RuntimeError(str(e), name)
    return P4RuntimeError(str(e), _CODE_BY_NAME.get(str(name), SC.UNKNOWN))


# ---- bytes <-> int ---------------------------------------------------------------------------
def encode_int(value: int) -> bytes:
    """P4Runtime canonical bytestring: big-endian, shortest form, at least one byte."""
    if value < 0:
        raise ValueError(f"negative value {value}")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def decode_int(data: bytes, bitwidth: int, what: str) -> int:
    """Decode a bytestring (canonical or zero-padded) that must fit in ``bitwidth`` bits."""
    if not data:
        raise _err(SC.INVALID_ARGUMENT, f"{what}: empty bytestring")
    v = int.from_bytes(data, "big")
    if bitwidth and v.bit_length() > bitwidth:
        raise _err(
            SC.INVALID_ARGUMENT, f"{what}: bytestring does not fit within bitwidth {bitwidth}"
        )
    return v


# ---- P4Info index ----------------------------------------------------------------------------
@dataclass
class _Field:
    id: int
    name: str
    bitwidth: int
    match_type: int


@dataclass
class _Table:
    info: p4info_pb2.Table
    fields: dict[int, _Field]
    actions: dict[int, int]  # action id -> scope
    needs_priority: bool
    direct_counter: int | None = None


@dataclass
class P4InfoIndex:
    """Lookups by id over a P4Info, built once per pipeline."""

    p4info: p4info_pb2.P4Info
    tables: dict[int, _Table] = field(default_factory=dict)
    actions: dict[int, dict[int, int]] = field(default_factory=dict)  # action -> param -> width
    action_names: dict[int, str] = field(default_factory=dict)
    counters: dict[int, p4info_pb2.Counter] = field(default_factory=dict)
    direct_counters: dict[int, p4info_pb2.DirectCounter] = field(default_factory=dict)
    digests: dict[int, p4info_pb2.Digest] = field(default_factory=dict)
    packet_in: dict[int, int] = field(default_factory=dict)  # metadata id -> bitwidth
    packet_out: dict[int, int] = field(default_factory=dict)
    registers: set[int] = field(default_factory=set)
    meters: set[int] = field(default_factory=set)

    @classmethod
    def build(cls, p4info: p4info_pb2.P4Info) -> P4InfoIndex:
        ix = cls(p4info)
        for a in p4info.actions:
            ix.actions[a.preamble.id] = {p.id: p.bitwidth for p in a.params}
            ix.action_names[a.preamble.id] = a.preamble.name
        for dc in p4info.direct_counters:
            ix.direct_counters[dc.preamble.id] = dc
        for t in p4info.tables:
            fields = {m.id: _Field(m.id, m.name, m.bitwidth, m.match_type) for m in t.match_fields}
            needs = any(
                f.match_type
                in (
                    p4info_pb2.MatchField.TERNARY,
                    p4info_pb2.MatchField.RANGE,
                    p4info_pb2.MatchField.OPTIONAL,
                )
                for f in fields.values()
            )
            tab = _Table(t, fields, {r.id: r.scope for r in t.action_refs}, needs)
            for rid in t.direct_resource_ids:
                if rid in ix.direct_counters:
                    tab.direct_counter = rid
            ix.tables[t.preamble.id] = tab
        for c in p4info.counters:
            ix.counters[c.preamble.id] = c
        for d in p4info.digests:
            ix.digests[d.preamble.id] = d
        for cpm in p4info.controller_packet_metadata:
            widths = {m.id: m.bitwidth for m in cpm.metadata}
            if cpm.preamble.name == "packet_in":
                ix.packet_in = widths
            elif cpm.preamble.name == "packet_out":
                ix.packet_out = widths
        ix.registers = {r.preamble.id for r in p4info.registers}
        ix.meters = {m.preamble.id for m in p4info.meters} | {
            m.preamble.id for m in p4info.direct_meters
        }
        return ix

    def table(self, table_id: int) -> _Table:
        t = self.tables.get(table_id)
        if t is None:
            raise _err(SC.NOT_FOUND, f"Table id {table_id} not found")
        return t


# ---- the target ------------------------------------------------------------------------------
class Target(Protocol):
    """What the server drives (``switch.Switch``)."""

    @property
    def device_id(self) -> int: ...

    @property
    def dataplane(self) -> RuntimeDataplane | None:
        """The running dataplane (:class:`~shadowgrad.p4target.runtime_target.
        RuntimeDataplane`: its docstring says what the server calls, in which order), or None
        before a pipeline is installed."""

    def verify_pipeline(self, p4info: p4info_pb2.P4Info, device_config: bytes) -> Any:
        """Build (not install) a pipeline; raise ValueError/ShadowgradError if invalid."""

    def commit_pipeline(
        self, pipeline: Any, p4info: p4info_pb2.P4Info, device_config: bytes
    ) -> None:
        """Install a verified pipeline: fresh state, packets flow through it from now on."""

    def packet_out(self, payload: bytes, metadata: dict[int, int]) -> None:
        """Inject a PacketOut on the CPU port."""


# ---- stream connections ----------------------------------------------------------------------
_CLOSE = object()


class _Connection:
    _ids = itertools.count(1)

    def __init__(self, peer: str) -> None:
        self.id = next(self._ids)
        self.peer = peer
        self.out: queue.Queue[object] = queue.Queue(maxsize=STREAM_QUEUE_MAX)
        self.arbitrated = False
        self.role = ""
        self.election_id: int | None = None
        self.dropped = 0

    def send(self, msg: p4runtime_pb2.StreamMessageResponse) -> bool:
        try:
            self.out.put_nowait(msg)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def close(self) -> None:
        with contextlib.suppress(queue.Full):
            self.out.put_nowait(_CLOSE)


def _uint128(eid: p4runtime_pb2.Uint128) -> int:
    return (int(eid.high) << 64) | int(eid.low)


def _set_uint128(msg: p4runtime_pb2.Uint128, value: int) -> None:
    msg.high = value >> 64
    msg.low = value & ((1 << 64) - 1)


@dataclass
class ServerCounters:
    packet_in_sent: int = 0
    packet_in_dropped_no_primary: int = 0
    packet_in_dropped_queue_full: int = 0
    packet_out_received: int = 0
    packet_out_rejected: int = 0
    digest_lists_sent: int = 0
    digests_dropped: int = 0
    digests_suppressed: int = 0  # duplicates of a sample whose list is not acked yet


class P4RuntimeServer(p4runtime_pb2_grpc.P4RuntimeServicer):  # type: ignore[misc]
    """The gRPC P4Runtime service over a :class:`Target`; ``start()`` / ``stop()``."""

    def __init__(
        self, target: Target, address: str = "0.0.0.0:9559", *, max_workers: int = 16
    ) -> None:
        self.target = target
        self.address = address
        self.port = 0
        self.counters = ServerCounters()
        self._lock = threading.RLock()  # arbitration state, pipeline state
        self._conns: dict[int, _Connection] = {}
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._index: P4InfoIndex | None = None
        self._p4info: p4info_pb2.P4Info | None = None
        self._device_config = b""
        self._cookie: int | None = None
        self._saved: tuple[Any, p4info_pb2.P4Info, bytes, int | None] | None = None
        self._digest_buf: dict[int, DigestBuffer] = {}  # per digest id, made on first write
        self._sweep_stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._write_lock = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> int:
        """Bind and serve; returns the bound TCP port (useful with ``host:0``)."""
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="p4rt"),
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", 256 << 20),
                ("grpc.max_send_message_length", 256 << 20),
            ],
        )
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(self, server)
        port = int(server.add_insecure_port(self.address))
        if port == 0:
            raise OSError(f"cannot bind the P4Runtime server to {self.address}")
        server.start()
        self._server = server
        self.port = port
        self._sweep_stop.clear()
        self._sweeper = threading.Thread(
            target=self._sweep_digests, name="p4rt-digests", daemon=True
        )
        self._sweeper.start()
        log.info("P4Runtime server listening on %s (port %d)", self.address, port)
        return port

    def stop(self, grace: float = 1.0) -> None:
        """Close every stream and stop serving; waits at most ``grace`` + 2 s."""
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
        for c in conns:
            c.close()
        srv, self._server = self._server, None
        if srv is not None:
            srv.stop(grace).wait(grace + 2.0)
        self._sweep_stop.set()
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.join(2.0)

    def install_initial_pipeline(self, p4info: p4info_pb2.P4Info, device_config: bytes) -> None:
        """Record a pipeline loaded from the command line (not through P4Runtime)."""
        with self._lock:
            self._set_committed(p4info, device_config, None)

    def _set_committed(
        self, p4info: p4info_pb2.P4Info, device_config: bytes, cookie: int | None
    ) -> None:
        self._p4info = p4info
        self._index = P4InfoIndex.build(p4info)
        self._device_config = device_config
        self._cookie = cookie
        self._digest_buf.clear()

    # ---- helpers ---------------------------------------------------------------------------
    def _check_device(self, device_id: int) -> None:
        if device_id != self.target.device_id:
            raise _err(SC.NOT_FOUND, f"Invalid device id {device_id}")

    def _primary(self, role: str) -> _Connection | None:
        best: _Connection | None = None
        for c in self._conns.values():
            if (
                c.arbitrated
                and c.role == role
                and c.election_id is not None
                and (best is None or c.election_id > (best.election_id or 0))
            ):
                best = c
        return best

    def _check_primary(self, role: str, election_id: int) -> None:
        with self._lock:
            p = self._primary(role)
            if p is None or p.election_id != election_id:
                raise _err(SC.PERMISSION_DENIED, "Not primary")

    def _state(self) -> tuple[P4InfoIndex, RuntimeDataplane]:
        with self._lock:
            ix, dpl = self._index, self.target.dataplane
        if ix is None or dpl is None:
            raise _err(SC.FAILED_PRECONDITION, "No forwarding pipeline config set for this device")
        return ix, dpl

    @staticmethod
    def _abort(context: grpc.ServicerContext, e: P4RuntimeError) -> None:
        context.set_code(e.code or SC.UNKNOWN)
        context.set_details(e.message)

    # ---- Capabilities ----------------------------------------------------------------------
    def Capabilities(  # noqa: N802  # noqa: N802
        self,
        request: p4runtime_pb2.CapabilitiesRequest,
        context: grpc.ServicerContext,
    ) -> p4runtime_pb2.CapabilitiesResponse:
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    # ---- pipeline config -------------------------------------------------------------------
    def SetForwardingPipelineConfig(  # noqa: N802
        self,
        request: p4runtime_pb2.SetForwardingPipelineConfigRequest,
        context: grpc.ServicerContext,
    ) -> p4runtime_pb2.SetForwardingPipelineConfigResponse:
        try:
            self._set_pipeline(request)
        except P4RuntimeError as e:
            self._abort(context, e)
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def _set_pipeline(self, req: p4runtime_pb2.SetForwardingPipelineConfigRequest) -> None:
        act_t = p4runtime_pb2.SetForwardingPipelineConfigRequest
        self._check_device(req.device_id)
        self._check_primary(req.role, _uint128(req.election_id))
        action = req.action
        if action == act_t.RECONCILE_AND_COMMIT:
            raise _err(SC.UNIMPLEMENTED, "RECONCILE_AND_COMMIT is not supported")
        if action not in (
            act_t.VERIFY,
            act_t.VERIFY_AND_SAVE,
            act_t.VERIFY_AND_COMMIT,
            act_t.COMMIT,
        ):
            raise _err(SC.INVALID_ARGUMENT, "Invalid SetForwardingPipelineConfig action")
        with self._write_lock:
            if action == act_t.COMMIT:
                if req.HasField("config"):
                    raise _err(SC.INVALID_ARGUMENT, "COMMIT takes no config")
                with self._lock:
                    saved, self._saved = self._saved, None
                if saved is None:
                    raise _err(SC.FAILED_PRECONDITION, "No saved config to commit")
                pipeline, p4info, blob, cookie = saved
                self._commit(pipeline, p4info, blob, cookie)
                return
            if not req.HasField("config") or not req.config.HasField("p4info"):
                raise _err(SC.INVALID_ARGUMENT, "Missing P4Info in config")
            cfg = req.config
            try:
                pipeline = self.target.verify_pipeline(cfg.p4info, cfg.p4_device_config)
            except P4RuntimeError:
                raise
            except Exception as e:
                raise _err(SC.INVALID_ARGUMENT, f"Invalid device config: {e}") from e
            cookie = cfg.cookie.cookie if cfg.HasField("cookie") else None
            if action == act_t.VERIFY:
                return
            if action == act_t.VERIFY_AND_SAVE:
                with self._lock:
                    self._saved = (pipeline, cfg.p4info, cfg.p4_device_config, cookie)
                return
            self._commit(pipeline, cfg.p4info, cfg.p4_device_config, cookie)

    def _commit(
        self, pipeline: Any, p4info: p4info_pb2.P4Info, blob: bytes, cookie: int | None
    ) -> None:
        try:
            self.target.commit_pipeline(pipeline, p4info, blob)
        except Exception as e:
            raise _err(SC.INTERNAL, f"Cannot install pipeline: {e}") from e
        with self._lock:
            self._set_committed(p4info, blob, cookie)
        log.info(
            "pipeline committed (%d tables, %d actions)", len(p4info.tables), len(p4info.actions)
        )

    def GetForwardingPipelineConfig(  # noqa: N802
        self,
        request: p4runtime_pb2.GetForwardingPipelineConfigRequest,
        context: grpc.ServicerContext,
    ) -> p4runtime_pb2.GetForwardingPipelineConfigResponse:
        rt_t = p4runtime_pb2.GetForwardingPipelineConfigRequest
        resp = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        try:
            self._check_device(request.device_id)
            with self._lock:
                p4info, blob, cookie = self._p4info, self._device_config, self._cookie
            if p4info is None:
                raise _err(
                    SC.FAILED_PRECONDITION, "No forwarding pipeline config set for this device"
                )
        except P4RuntimeError as e:
            self._abort(context, e)
            return resp
        rt = request.response_type
        if cookie is not None:
            resp.config.cookie.cookie = cookie
        if rt in (rt_t.ALL, rt_t.P4INFO_AND_COOKIE):
            resp.config.p4info.CopyFrom(p4info)
        if rt in (rt_t.ALL, rt_t.DEVICE_CONFIG_AND_COOKIE):
            resp.config.p4_device_config = blob
        return resp

    # ---- Write -----------------------------------------------------------------------------
    def Write(  # noqa: N802
        self,
        request: p4runtime_pb2.WriteRequest,
        context: grpc.ServicerContext,
    ) -> p4runtime_pb2.WriteResponse:
        try:
            self._check_device(request.device_id)
            self._check_primary(request.role, _uint128(request.election_id))
            if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
                raise _err(SC.UNIMPLEMENTED, "Only CONTINUE_ON_ERROR atomicity is supported")
            ix, dpl = self._state()
        except P4RuntimeError as e:
            self._abort(context, e)
            return p4runtime_pb2.WriteResponse()
        results: list[P4RuntimeError | None] = []
        with self._write_lock:
            for upd in request.updates:
                try:
                    self._apply_update(ix, dpl, upd)
                    results.append(None)
                except P4RuntimeError as e:
                    results.append(e)
                except dp.DataplaneError as e:
                    results.append(_from_dataplane_error(e))
                except Exception as e:
                    log.exception("write update failed")
                    results.append(_err(SC.INTERNAL, f"{type(e).__name__}: {e}"))
        if any(r is not None for r in results):
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message="Write failure.")
            for r in results:
                err = p4runtime_pb2.Error(canonical_code=code_pb2.OK)
                if r is not None:
                    err.canonical_code = (r.code or SC.UNKNOWN).value[0]
                    err.message = r.message
                    err.space = "ALL-sswitch-p4org"
                a = any_pb2.Any()
                a.Pack(err)
                status.details.append(a)
            context.set_trailing_metadata(
                (("grpc-status-details-bin", status.SerializeToString()),)
            )
            context.set_code(SC.UNKNOWN)
            context.set_details("Write failure.")
        return p4runtime_pb2.WriteResponse()

    def _apply_update(
        self, ix: P4InfoIndex, dpl: RuntimeDataplane, upd: p4runtime_pb2.Update
    ) -> None:
        upd_t = p4runtime_pb2.Update
        if upd.type not in (upd_t.INSERT, upd_t.MODIFY, upd_t.DELETE):
            raise _err(SC.INVALID_ARGUMENT, "Update type must be INSERT, MODIFY or DELETE")
        ent = upd.entity
        kind = ent.WhichOneof("entity")
        if kind == "table_entry":
            self._write_table_entry(ix, dpl, upd.type, ent.table_entry)
        elif kind == "packet_replication_engine_entry":
            pre = ent.packet_replication_engine_entry
            which = pre.WhichOneof("type")
            if which == "multicast_group_entry":
                self._write_mc_group(dpl, upd.type, pre.multicast_group_entry)
            elif which == "clone_session_entry":
                self._write_clone_session(dpl, upd.type, pre.clone_session_entry)
            else:
                raise _err(SC.INVALID_ARGUMENT, "Empty PacketReplicationEngineEntry")
        elif kind == "counter_entry":
            self._write_counter(ix, dpl, upd.type, ent.counter_entry)
        elif kind == "direct_counter_entry":
            self._write_direct_counter(ix, dpl, upd.type, ent.direct_counter_entry)
        elif kind == "digest_entry":
            self._write_digest_entry(ix, upd.type, ent.digest_entry)
        elif kind == "register_entry":
            raise _err(SC.UNIMPLEMENTED, "Register writes are not supported yet")
        elif kind in ("meter_entry", "direct_meter_entry"):
            raise _err(SC.UNIMPLEMENTED, "Meters are not supported by this target")
        elif kind in ("action_profile_member", "action_profile_group"):
            raise _err(SC.UNIMPLEMENTED, "Action profiles are not supported by this target")
        else:
            raise _err(SC.UNIMPLEMENTED, f"Entity {kind} is not supported")

    # -- table entries --
    def _decode_matches(self, tab: _Table, te: p4runtime_pb2.TableEntry) -> dict[int, Any]:
        mf_t = p4info_pb2.MatchField
        out: dict[int, Any] = {}
        for m in te.match:
            f = tab.fields.get(m.field_id)
            if f is None:
                raise _err(SC.INVALID_ARGUMENT, f"Unknown match field id {m.field_id}")
            if m.field_id in out:
                raise _err(SC.INVALID_ARGUMENT, f"Duplicate match field id {m.field_id}")
            kind = m.WhichOneof("field_match_type")
            what = f"match field {f.name}"
            w = f.bitwidth
            if f.match_type == mf_t.EXACT and kind == "exact":
                out[f.id] = dp.Exact(decode_int(m.exact.value, w, what))
            elif f.match_type == mf_t.LPM and kind == "lpm":
                v = decode_int(m.lpm.value, w, what)
                plen = m.lpm.prefix_len
                if plen <= 0 or plen > w:
                    raise _err(
                        SC.INVALID_ARGUMENT,
                        f"{what}: invalid prefix length {plen} (omit don't-care fields)",
                    )
                if v & ((1 << (w - plen)) - 1):
                    raise _err(SC.INVALID_ARGUMENT, f"{what}: bits beyond prefix length set")
                out[f.id] = dp.Lpm(v, plen)
            elif f.match_type == mf_t.TERNARY and kind == "ternary":
                v = decode_int(m.ternary.value, w, what)
                mask = decode_int(m.ternary.mask, w, what + " mask")
                if mask == 0:
                    raise _err(SC.INVALID_ARGUMENT, f"{what}: zero mask (omit don't-care fields)")
                if v & ~mask:
                    raise _err(SC.INVALID_ARGUMENT, f"{what}: value has bits outside the mask")
                out[f.id] = dp.Ternary(v, mask)
            elif f.match_type == mf_t.RANGE and kind == "range":
                lo = decode_int(m.range.low, w, what)
                hi = decode_int(m.range.high, w, what)
                if lo > hi:
                    raise _err(SC.INVALID_ARGUMENT, f"{what}: low > high")
                if lo == 0 and hi == (1 << w) - 1:
                    raise _err(SC.INVALID_ARGUMENT, f"{what}: full range (omit don't-care fields)")
                out[f.id] = dp.Range(lo, hi)
            elif f.match_type == mf_t.OPTIONAL and kind == "optional":
                out[f.id] = dp.OptionalMatch(decode_int(m.optional.value, w, what))
            else:
                raise _err(
                    SC.INVALID_ARGUMENT, f"{what}: match type {kind} does not match the P4Info"
                )
        for f in tab.fields.values():
            if f.match_type == mf_t.EXACT and f.id not in out:
                raise _err(SC.INVALID_ARGUMENT, f"Missing exact match field {f.name}")
        return out

    def _decode_action(
        self, ix: P4InfoIndex, tab: _Table, te: p4runtime_pb2.TableEntry, default: bool
    ) -> tuple[int, dict[int, int]]:
        if not te.HasField("action"):
            raise _err(SC.INVALID_ARGUMENT, "Missing action")
        which = te.action.WhichOneof("type")
        if which != "action":
            raise _err(SC.UNIMPLEMENTED, "Only direct actions are supported (no action profiles)")
        act = te.action.action
        scope = tab.actions.get(act.action_id)
        if scope is None:
            raise _err(
                SC.INVALID_ARGUMENT,
                f"Action id {act.action_id} is not an action of table {tab.info.preamble.name}",
            )
        if default and scope == p4info_pb2.ActionRef.TABLE_ONLY:
            raise _err(SC.INVALID_ARGUMENT, "Action is @tableonly: cannot be a default action")
        if not default and scope == p4info_pb2.ActionRef.DEFAULT_ONLY:
            raise _err(SC.INVALID_ARGUMENT, "Action is @defaultonly: cannot be used in an entry")
        widths = ix.actions.get(act.action_id, {})
        params: dict[int, int] = {}
        for p in act.params:
            w = widths.get(p.param_id)
            if w is None:
                raise _err(SC.INVALID_ARGUMENT, f"Unknown param id {p.param_id}")
            if p.param_id in params:
                raise _err(SC.INVALID_ARGUMENT, f"Duplicate param id {p.param_id}")
            params[p.param_id] = decode_int(p.value, w, f"param {p.param_id}")
        if len(params) != len(widths):
            raise _err(
                SC.INVALID_ARGUMENT,
                f"Action {ix.action_names.get(act.action_id)} expects {len(widths)} "
                f"params, got {len(params)}",
            )
        return act.action_id, params

    def _write_table_entry(
        self, ix: P4InfoIndex, dpl: RuntimeDataplane, utype: int, te: p4runtime_pb2.TableEntry
    ) -> None:
        upd_t = p4runtime_pb2.Update
        tab = ix.table(te.table_id)
        if te.is_default_action:
            if utype != upd_t.MODIFY:
                raise _err(SC.INVALID_ARGUMENT, "The default entry can only be modified")
            if te.match:
                raise _err(SC.INVALID_ARGUMENT, "A default entry has no match key")
            if tab.info.const_default_action_id:
                raise _err(SC.PERMISSION_DENIED, "Cannot change a const default action")
            if not te.HasField("action"):
                reset = getattr(dpl, "reset_default", None)
                if reset is None:
                    raise _err(SC.UNIMPLEMENTED, "Resetting the default action is not supported")
                reset(te.table_id)
                return
            action_id, params = self._decode_action(ix, tab, te, default=True)
            dpl.set_default(te.table_id, action_id, params)
            return
        if tab.info.is_const_table:
            raise _err(SC.PERMISSION_DENIED, "Cannot write a const table")
        if te.idle_timeout_ns:
            if tab.info.idle_timeout_behavior == p4info_pb2.Table.NO_TIMEOUT:
                raise _err(SC.INVALID_ARGUMENT, "Table does not support idle timeouts")
            raise _err(SC.UNIMPLEMENTED, "Idle timeouts are not supported by this target")
        if te.HasField("meter_config"):
            raise _err(SC.UNIMPLEMENTED, "Meters are not supported by this target")
        matches = self._decode_matches(tab, te)
        if tab.needs_priority and te.priority <= 0:
            raise _err(
                SC.INVALID_ARGUMENT, "Ternary, range and optional tables need a priority > 0"
            )
        if not tab.needs_priority and te.priority != 0:
            raise _err(SC.INVALID_ARGUMENT, "Exact and LPM tables take priority 0")
        if utype == upd_t.DELETE:
            entry = dp.TableEntry(
                table_id=te.table_id, matches=matches, action_id=0, params={}, priority=te.priority
            )
            dpl.delete_entry(entry)
            return
        action_id, params = self._decode_action(ix, tab, te, default=False)
        entry = dp.TableEntry(
            table_id=te.table_id,
            matches=matches,
            action_id=action_id,
            params=params,
            priority=te.priority,
            metadata=te.metadata,
        )
        if te.HasField("counter_data") and tab.direct_counter is not None:
            entry.counter_bytes = te.counter_data.byte_count
            entry.counter_packets = te.counter_data.packet_count
        if utype == upd_t.INSERT:
            dpl.insert_entry(entry)
        else:
            dpl.modify_entry(entry)

    # -- PRE --
    @staticmethod
    def _replicas(reps: Iterable[p4runtime_pb2.Replica]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()
        for r in reps:
            if r.WhichOneof("port_kind") == "port":
                port = decode_int(r.port, 32, "replica port")
            else:
                port = r.egress_port
            key = (port, r.instance)
            if key in seen:
                raise _err(SC.INVALID_ARGUMENT, f"Duplicate replica {key}")
            seen.add(key)
            out.append(key)
        return out

    @staticmethod
    def _check_group_id(gid: int, what: str) -> None:
        if gid == 0:
            raise _err(SC.INVALID_ARGUMENT, f"{what} id 0 is invalid")
        if gid > MAX_GROUP_ID:
            raise _err(SC.OUT_OF_RANGE, f"{what} id value is too high")

    def _write_mc_group(
        self, dpl: RuntimeDataplane, utype: int, g: p4runtime_pb2.MulticastGroupEntry
    ) -> None:
        upd_t = p4runtime_pb2.Update
        gid = g.multicast_group_id
        self._check_group_id(gid, "Group")
        if utype == upd_t.DELETE:
            dpl.delete_multicast_group(gid)
            return
        replicas = self._replicas(g.replicas)
        if utype == upd_t.INSERT:
            dpl.insert_multicast_group(gid, replicas)
        else:
            dpl.modify_multicast_group(gid, replicas)

    def _write_clone_session(
        self, dpl: RuntimeDataplane, utype: int, s: p4runtime_pb2.CloneSessionEntry
    ) -> None:
        upd_t = p4runtime_pb2.Update
        self._check_group_id(s.session_id, "Clone session")
        if utype == upd_t.DELETE:
            dpl.delete_clone_session(s.session_id)
            return
        if s.class_of_service != 0:
            raise _err(SC.UNIMPLEMENTED, "class_of_service is not supported")
        if s.packet_length_bytes != 0:
            raise _err(SC.UNIMPLEMENTED, "packet_length_bytes (truncation) is not supported")
        replicas = self._replicas(s.replicas)
        if utype == upd_t.INSERT:
            dpl.insert_clone_session(s.session_id, replicas)
        else:
            dpl.modify_clone_session(s.session_id, replicas)

    # -- counters --
    def _write_counter(
        self, ix: P4InfoIndex, dpl: RuntimeDataplane, utype: int, c: p4runtime_pb2.CounterEntry
    ) -> None:
        if utype != p4runtime_pb2.Update.MODIFY:
            raise _err(SC.INVALID_ARGUMENT, "Counter entries can only be modified")
        info = ix.counters.get(c.counter_id)
        if info is None:
            raise _err(SC.NOT_FOUND, f"Counter id {c.counter_id} not found")
        if not c.HasField("index"):
            raise _err(SC.INVALID_ARGUMENT, "Writing a counter needs an index")
        if c.index.index < 0 or c.index.index >= info.size:
            raise _err(SC.OUT_OF_RANGE, f"Counter index {c.index.index} out of range")
        dpl.write_counter(c.counter_id, c.index.index, c.data.byte_count, c.data.packet_count)

    def _write_direct_counter(
        self,
        ix: P4InfoIndex,
        dpl: RuntimeDataplane,
        utype: int,
        c: p4runtime_pb2.DirectCounterEntry,
    ) -> None:
        if utype != p4runtime_pb2.Update.MODIFY:
            raise _err(SC.INVALID_ARGUMENT, "Direct counter entries can only be modified")
        te = c.table_entry
        tab = ix.table(te.table_id)
        if tab.direct_counter is None:
            raise _err(SC.INVALID_ARGUMENT, "Table has no direct counter")
        matches = self._decode_matches(tab, te)
        entry = dp.TableEntry(
            table_id=te.table_id, matches=matches, action_id=0, params={}, priority=te.priority
        )
        dpl.write_direct_counter(entry, c.data.byte_count, c.data.packet_count)

    # -- digests --
    def _write_digest_entry(
        self, ix: P4InfoIndex, utype: int, d: p4runtime_pb2.DigestEntry
    ) -> None:
        upd_t = p4runtime_pb2.Update
        if d.digest_id not in ix.digests:
            raise _err(SC.NOT_FOUND, f"Digest id {d.digest_id} not found")
        with self._lock:
            buf = self._digest_buf.setdefault(d.digest_id, DigestBuffer(d.digest_id))
            exists = buf.config is not None
            if utype == upd_t.DELETE:
                if not exists:
                    raise _err(SC.NOT_FOUND, "Digest not configured")
                buf.disable()
                return
            if utype == upd_t.INSERT and exists:
                raise _err(SC.ALREADY_EXISTS, "Digest already configured")
            if utype == upd_t.MODIFY and not exists:
                raise _err(SC.NOT_FOUND, "Digest not configured")
            cfg = p4runtime_pb2.DigestEntry.Config()
            cfg.CopyFrom(d.config)
            buf.configure(cfg)

    # ---- Read ------------------------------------------------------------------------------
    def Read(  # noqa: N802
        self,
        request: p4runtime_pb2.ReadRequest,
        context: grpc.ServicerContext,
    ) -> Iterator[p4runtime_pb2.ReadResponse]:
        try:
            self._check_device(request.device_id)
            ix, dpl = self._state()
            entities: list[p4runtime_pb2.Entity] = []
            for ent in request.entities:
                entities.extend(self._read_entity(ix, dpl, ent))
        except P4RuntimeError as e:
            self._abort(context, e)
            return
        except dp.DataplaneError as e:
            self._abort(context, _from_dataplane_error(e))
            return
        for i in range(0, max(len(entities), 1), 1000):
            yield p4runtime_pb2.ReadResponse(entities=entities[i : i + 1000])

    def _read_entity(
        self, ix: P4InfoIndex, dpl: RuntimeDataplane, ent: p4runtime_pb2.Entity
    ) -> list[p4runtime_pb2.Entity]:
        kind = ent.WhichOneof("entity")
        if kind == "table_entry":
            return self._read_table_entries(ix, dpl, ent.table_entry)
        if kind == "packet_replication_engine_entry":
            pre = ent.packet_replication_engine_entry
            which = pre.WhichOneof("type")
            out: list[p4runtime_pb2.Entity] = []
            if which == "multicast_group_entry":
                gid = pre.multicast_group_entry.multicast_group_id
                for g, reps in self._groups(dpl.read_multicast_groups(gid or None)):
                    e = p4runtime_pb2.Entity()
                    mg = e.packet_replication_engine_entry.multicast_group_entry
                    mg.multicast_group_id = g
                    for port, inst in reps:
                        mg.replicas.add(egress_port=port, instance=inst)
                    out.append(e)
            elif which == "clone_session_entry":
                sid = pre.clone_session_entry.session_id
                for s, reps, cos, plen in self._sessions(dpl.read_clone_sessions(sid or None)):
                    e = p4runtime_pb2.Entity()
                    cs = e.packet_replication_engine_entry.clone_session_entry
                    cs.session_id = s
                    cs.class_of_service = cos
                    cs.packet_length_bytes = plen
                    for port, inst in reps:
                        cs.replicas.add(egress_port=port, instance=inst)
                    out.append(e)
            else:
                raise _err(SC.INVALID_ARGUMENT, "Empty PacketReplicationEngineEntry")
            return out
        if kind == "counter_entry":
            return self._read_counters(ix, dpl, ent.counter_entry)
        if kind == "direct_counter_entry":
            te = ent.direct_counter_entry.table_entry
            req = p4runtime_pb2.TableEntry()
            req.CopyFrom(te)
            out = []
            tids = (
                [te.table_id]
                if te.table_id
                else [t for t, tab in ix.tables.items() if tab.direct_counter is not None]
            )
            for tid in tids:
                if ix.table(tid).direct_counter is None:
                    raise _err(SC.INVALID_ARGUMENT, "Table has no direct counter")
                req.table_id = tid
                req.counter_data.SetInParent()
                for e in self._read_table_entries(ix, dpl, req):
                    o = p4runtime_pb2.Entity()
                    o.direct_counter_entry.table_entry.CopyFrom(e.table_entry)
                    o.direct_counter_entry.table_entry.ClearField("counter_data")
                    o.direct_counter_entry.data.CopyFrom(e.table_entry.counter_data)
                    out.append(o)
            return out
        if kind == "digest_entry":
            out = []
            with self._lock:
                cfgs = {
                    did: b.config for did, b in self._digest_buf.items() if b.config is not None
                }
            for did, cfg in sorted(cfgs.items()):
                if ent.digest_entry.digest_id in (0, did):
                    e = p4runtime_pb2.Entity()
                    e.digest_entry.digest_id = did
                    e.digest_entry.config.CopyFrom(cfg)
                    out.append(e)
            return out
        if kind == "register_entry":
            raise _err(SC.UNIMPLEMENTED, "Register reads are not supported yet")
        if kind in ("meter_entry", "direct_meter_entry"):
            raise _err(SC.UNIMPLEMENTED, "Meters are not supported by this target")
        raise _err(SC.UNIMPLEMENTED, f"Reading {kind} is not supported")

    @staticmethod
    def _groups(
        raw: Mapping[int, list[tuple[int, int]]],
    ) -> list[tuple[int, list[tuple[int, int]]]]:
        return sorted((int(g), [(int(p), int(i)) for p, i in reps]) for g, reps in raw.items())

    @staticmethod
    def _sessions(
        raw: Mapping[int, dp.CloneSession],
    ) -> list[tuple[int, list[tuple[int, int]], int, int]]:
        return sorted(
            (int(sid), list(cs.replicas), cs.class_of_service, cs.packet_length_bytes)
            for sid, cs in raw.items()
        )

    def _entry_to_pb(
        self, ix: P4InfoIndex, e: Any, with_counter: bool, is_default: bool = False
    ) -> p4runtime_pb2.Entity:
        out = p4runtime_pb2.Entity()
        te = out.table_entry
        te.table_id = e.table_id
        tab = ix.table(e.table_id)
        for fid in sorted(e.matches):
            m = e.matches[fid]
            fm = te.match.add(field_id=fid)
            if isinstance(m, dp.Exact):
                fm.exact.value = encode_int(m.value)
            elif isinstance(m, dp.Lpm):
                fm.lpm.value = encode_int(m.value)
                fm.lpm.prefix_len = m.prefix_len
            elif isinstance(m, dp.Ternary):
                fm.ternary.value = encode_int(m.value)
                fm.ternary.mask = encode_int(m.mask)
            elif isinstance(m, dp.Range):
                fm.range.low = encode_int(m.low)
                fm.range.high = encode_int(m.high)
            elif isinstance(m, dp.OptionalMatch):
                fm.optional.value = encode_int(m.value)
        te.priority = e.priority
        if e.action_id:
            act = te.action.action
            act.action_id = e.action_id
            for pid in sorted(e.params):
                act.params.add(param_id=pid, value=encode_int(e.params[pid]))
        if is_default:
            te.is_default_action = True
        if getattr(e, "is_const", False):
            te.is_const = True
        if getattr(e, "metadata", b""):
            te.metadata = e.metadata
        if with_counter and tab.direct_counter is not None:
            te.counter_data.byte_count = e.counter_bytes or 0
            te.counter_data.packet_count = e.counter_packets or 0
        return out

    def _read_table_entries(
        self, ix: P4InfoIndex, dpl: RuntimeDataplane, te: p4runtime_pb2.TableEntry
    ) -> list[p4runtime_pb2.Entity]:
        with_counter = te.HasField("counter_data")
        out: list[p4runtime_pb2.Entity] = []
        if te.table_id:
            ix.table(te.table_id)
        if te.is_default_action:
            if not te.table_id:
                raise _err(SC.INVALID_ARGUMENT, "Reading default entries needs a table id")
            d = dpl.get_default(te.table_id)
            if d is not None:
                out.append(self._entry_to_pb(ix, d, with_counter, is_default=True))
            return out
        want: dict[int, Any] | None = None
        if te.match:
            want = self._decode_matches(ix.table(te.table_id), te)
        entries = dpl.read_entries(te.table_id or None)
        for e in entries:
            if want is not None and (e.matches != want or e.priority != te.priority):
                continue
            out.append(self._entry_to_pb(ix, e, with_counter))
        return out

    def _read_counters(
        self, ix: P4InfoIndex, dpl: RuntimeDataplane, c: p4runtime_pb2.CounterEntry
    ) -> list[p4runtime_pb2.Entity]:
        ids = [c.counter_id] if c.counter_id else sorted(ix.counters)
        out: list[p4runtime_pb2.Entity] = []
        for cid in ids:
            info = ix.counters.get(cid)
            if info is None:
                raise _err(SC.NOT_FOUND, f"Counter id {cid} not found")
            index: int | None = None
            if c.HasField("index"):
                index = c.index.index
                if index < 0 or index >= info.size:
                    raise _err(SC.OUT_OF_RANGE, f"Counter index {index} out of range")
            for idx, nbytes, npkts in dpl.read_counter(cid, index):
                e = p4runtime_pb2.Entity()
                ce = e.counter_entry
                ce.counter_id = cid
                ce.index.index = idx
                ce.data.byte_count = nbytes
                ce.data.packet_count = npkts
                out.append(e)
        return out

    # ---- StreamChannel ---------------------------------------------------------------------
    def StreamChannel(  # noqa: N802
        self,
        request_iterator: Iterator[p4runtime_pb2.StreamMessageRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[p4runtime_pb2.StreamMessageResponse]:
        conn = _Connection(context.peer())
        with self._lock:
            self._conns[conn.id] = conn
        context.add_callback(conn.close)
        reader = threading.Thread(
            target=self._stream_reader,
            args=(conn, request_iterator, context),
            name=f"p4rt-stream-{conn.id}",
            daemon=True,
        )
        reader.start()
        try:
            while True:
                try:
                    msg = conn.out.get(timeout=_POLL_S)
                except queue.Empty:
                    if not context.is_active():
                        break
                    continue
                if msg is _CLOSE:
                    break
                if isinstance(msg, P4RuntimeError):
                    context.set_code(msg.code or SC.UNKNOWN)
                    context.set_details(msg.message)
                    break
                assert isinstance(msg, p4runtime_pb2.StreamMessageResponse)
                yield msg
        finally:
            self._drop_connection(conn)

    def _drop_connection(self, conn: _Connection) -> None:
        with self._lock:
            before = self._primary(conn.role)
            if self._conns.pop(conn.id, None) is None:
                return
            after = self._primary(conn.role)
        if before is not after:
            self._notify_role(conn.role)
        log.debug("stream %d (%s) closed", conn.id, conn.peer)

    def _stream_reader(
        self,
        conn: _Connection,
        it: Iterator[p4runtime_pb2.StreamMessageRequest],
        context: grpc.ServicerContext,
    ) -> None:
        try:
            for req in it:
                which = req.WhichOneof("update")
                if which == "arbitration":
                    err = self._arbitrate(conn, req.arbitration)
                    if err is not None:
                        with contextlib.suppress(queue.Full):
                            conn.out.put_nowait(err)
                        return
                elif not conn.arbitrated:
                    with contextlib.suppress(queue.Full):
                        conn.out.put_nowait(
                            _err(
                                SC.FAILED_PRECONDITION,
                                "The first message on a stream must be an arbitration update",
                            )
                        )
                    return
                elif which == "packet":
                    self._packet_out(conn, req.packet)
                elif which == "digest_ack":
                    with self._lock:
                        buf = self._digest_buf.get(req.digest_ack.digest_id)
                        if buf is not None:
                            buf.ack(req.digest_ack.list_id)
                else:
                    self._stream_error(conn, SC.UNIMPLEMENTED, f"Stream message {which}", req)
        except grpc.RpcError:
            pass
        except Exception:
            log.exception("stream %d reader failed", conn.id)
        finally:
            conn.close()

    def _stream_error(
        self,
        conn: _Connection,
        code: grpc.StatusCode,
        message: str,
        req: p4runtime_pb2.StreamMessageRequest,
    ) -> None:
        resp = p4runtime_pb2.StreamMessageResponse()
        resp.error.canonical_code = code.value[0]
        resp.error.message = message
        if req.HasField("packet"):
            resp.error.packet_out.packet_out.CopyFrom(req.packet)
        conn.send(resp)

    def _arbitrate(
        self, conn: _Connection, arb: p4runtime_pb2.MasterArbitrationUpdate
    ) -> P4RuntimeError | None:
        if arb.device_id != self.target.device_id:
            return _err(SC.NOT_FOUND, f"Invalid device id {arb.device_id}")
        role = arb.role.name if arb.HasField("role") else ""
        if arb.HasField("role") and arb.role.HasField("config"):
            return _err(SC.UNIMPLEMENTED, "Role configs are not supported")
        eid = _uint128(arb.election_id) if arb.HasField("election_id") else None
        with self._lock:
            if conn.arbitrated and conn.role != role:
                return _err(SC.FAILED_PRECONDITION, "A stream cannot change its role")
            if eid is not None:
                for c in self._conns.values():
                    if c is not conn and c.arbitrated and c.role == role and c.election_id == eid:
                        return _err(
                            SC.INVALID_ARGUMENT, "Election id already used by another connection"
                        )
            before = self._primary(role)
            conn.arbitrated = True
            conn.role = role
            conn.election_id = eid
            after = self._primary(role)
        if before is not after or before is conn:
            self._notify_role(role)
        else:
            self._send_arbitration(conn, role, after)
        return None

    def _send_arbitration(self, conn: _Connection, role: str, primary: _Connection | None) -> None:
        resp = p4runtime_pb2.StreamMessageResponse()
        a = resp.arbitration
        a.device_id = self.target.device_id
        if role:
            a.role.name = role
        if primary is not None and primary.election_id is not None:
            _set_uint128(a.election_id, primary.election_id)
        if primary is conn:
            a.status.code = code_pb2.OK
            a.status.message = "Is primary"
        elif primary is not None:
            a.status.code = code_pb2.ALREADY_EXISTS
            a.status.message = "Is backup"
        else:
            a.status.code = code_pb2.NOT_FOUND
            a.status.message = "No primary"
        conn.send(resp)

    def _notify_role(self, role: str) -> None:
        with self._lock:
            primary = self._primary(role)
            conns = [c for c in self._conns.values() if c.arbitrated and c.role == role]
        for c in conns:
            self._send_arbitration(c, role, primary)

    def _packet_out(self, conn: _Connection, pkt: p4runtime_pb2.PacketOut) -> None:
        req = p4runtime_pb2.StreamMessageRequest(packet=pkt)
        with self._lock:
            primary = self._primary(conn.role)
            ix = self._index
        if primary is not conn:
            self.counters.packet_out_rejected += 1
            self._stream_error(conn, SC.PERMISSION_DENIED, "Not primary", req)
            return
        if ix is None or self.target.dataplane is None:
            self.counters.packet_out_rejected += 1
            self._stream_error(conn, SC.FAILED_PRECONDITION, "No pipeline", req)
            return
        md: dict[int, int] = {}
        try:
            for m in pkt.metadata:
                w = ix.packet_out.get(m.metadata_id)
                if w is None:
                    raise _err(
                        SC.INVALID_ARGUMENT, f"Unknown packet_out metadata id {m.metadata_id}"
                    )
                md[m.metadata_id] = decode_int(m.value, w, f"packet_out metadata {m.metadata_id}")
            self.target.packet_out(pkt.payload, md)
            self.counters.packet_out_received += 1
        except P4RuntimeError as e:
            self.counters.packet_out_rejected += 1
            self._stream_error(conn, e.code or SC.UNKNOWN, e.message, req)
        except Exception as e:
            self.counters.packet_out_rejected += 1
            self._stream_error(conn, SC.INTERNAL, f"{type(e).__name__}: {e}", req)

    # ---- notifications from the target -----------------------------------------------------
    def send_packet_in(self, payload: bytes, metadata: dict[int, int]) -> bool:
        """Send a PacketIn to the primary of the default role; False if nobody took it."""
        with self._lock:
            primary = self._primary("")
        if primary is None:
            self.counters.packet_in_dropped_no_primary += 1
            return False
        resp = p4runtime_pb2.StreamMessageResponse()
        resp.packet.payload = payload
        for mid in sorted(metadata):
            resp.packet.metadata.add(metadata_id=mid, value=encode_int(metadata[mid]))
        if primary.send(resp):
            self.counters.packet_in_sent += 1
            return True
        self.counters.packet_in_dropped_queue_full += 1
        return False

    def send_digest(self, digest_id: int, members: list[bytes]) -> bool:
        """Learn one digest struct (``members`` in field order) for the primary, batched and
        de-duplicated per the digest's ``DigestEntry`` config as PI does (``_digests``); only
        for digests the controller enabled. False if it was dropped (not configured, no
        primary, or the list it completed could not be queued)."""
        with self._lock:
            buf = self._digest_buf.get(digest_id)
            primary = self._primary("")
            if buf is None or buf.config is None or primary is None:
                self.counters.digests_dropped += 1
                return False
            before = buf.suppressed
            dl = buf.learn(tuple(members))
            self.counters.digests_suppressed += buf.suppressed - before
        return dl is None or self._send_digest_list(primary, dl)

    def _send_digest_list(self, primary: _Connection, dl: p4runtime_pb2.DigestList) -> bool:
        resp = p4runtime_pb2.StreamMessageResponse()
        resp.digest.CopyFrom(dl)
        if primary.send(resp):
            self.counters.digest_lists_sent += 1
            return True
        self.counters.digests_dropped += len(dl.data)
        return False

    def _sweep_digests(self) -> None:
        """Send lists whose ``max_timeout_ns`` passed and expire unacked ones (20 ms tick)."""
        while not self._sweep_stop.wait(0.02):
            due: list[p4runtime_pb2.DigestList] = []
            with self._lock:
                primary = self._primary("")
                for buf in self._digest_buf.values():
                    dl = buf.sweep()
                    if dl is not None:
                        due.append(dl)
            for dl in due:
                if primary is None:
                    self.counters.digests_dropped += len(dl.data)
                else:
                    self._send_digest_list(primary, dl)


def p4data_int(d: p4data_pb2.P4Data) -> int:
    """The integer of a bitstring P4Data (helper for clients and tests)."""
    return int.from_bytes(d.bitstring, "big")
