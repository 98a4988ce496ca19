"""The controller's P4Runtime client (``shadowgrad.controller.p4runtime``) against this project's
P4Runtime server, in-process on 127.0.0.1: pipeline round trip, per-update Write errors,
counters, deadlines, reconnection after a switch restart, the request log, close."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("p4")
pytest.importorskip("grpc")

import grpc
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from shadowgrad.controller.p4runtime import (
    P4RuntimeClient,
    P4RuntimeError,
    P4RuntimeWriteError,
)
from shadowgrad.p4target.dataplane import Pipeline
from shadowgrad.p4target.p4runtime_server import API_VERSION, P4RuntimeServer
from shadowgrad.p4target.switch import Switch
from tests.test_p4rt_server import (
    Names,
    dmac_entry,
    names_fixture,  # noqa: F401 (fixture ``names``)
    pipeline_fixture,  # noqa: F401 (fixture ``pipeline``: rt_l2l3.p4)
)

U = p4runtime_pb2.Update
FWD = "MyIngress.l2_forward"


@pytest.fixture
def switches() -> Iterator[Callable[..., Switch]]:
    """``start(port=0, pipeline=None)``: a started switch serving P4Runtime on 127.0.0.1;
    every one is stopped at the end."""
    made: list[Switch] = []

    def start(port: int = 0, pipeline: Pipeline | None = None) -> Switch:
        sw = Switch(device_id=0, cpu_port=255, grpc_addr=f"127.0.0.1:{port}")
        made.append(sw)
        if pipeline is not None:
            sw.load_pipeline(pipeline)
        sw.start()
        return sw

    yield start
    for sw in made:
        sw.stop()


def addr_of(sw: Switch) -> str:
    assert sw.server is not None
    return f"127.0.0.1:{sw.server.port}"


@pytest.fixture
def client(switches: Callable[..., Switch], pipeline: Pipeline) -> Iterator[P4RuntimeClient]:
    c = P4RuntimeClient(addr_of(switches()), election_id=10, timeout_s=5.0)
    try:
        c.connect(wait_s=10)
        c.set_pipeline(pipeline.p4info, pipeline.to_device_config())
        yield c
    finally:
        c.close()


def ins(e: p4runtime_pb2.Entity) -> p4runtime_pb2.Update:
    return U(type=U.INSERT, entity=e)


def dmac_entries(c: P4RuntimeClient, names: Names) -> set[bytes]:
    """The dmac keys installed (exact match values)."""
    tid = names["MyIngress.dmac"]
    got = c.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=tid))])
    return {g.table_entry.match[0].exact.value for g in got}


def mac(v: int) -> bytes:
    return v.to_bytes(max(1, (v.bit_length() + 7) // 8), "big")


def wait_until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# ---- session and pipeline ---------------------------------------------------------------------
def test_connect_capabilities_and_pipeline_round_trip(
    switches: Callable[..., Switch], pipeline: Pipeline
) -> None:
    with P4RuntimeClient(addr_of(switches()), election_id=3, timeout_s=5.0) as c:
        c.connect(wait_s=10)
        assert c.connected and c.is_primary
        c.connect()  # no-op while connected
        assert c.capabilities() == API_VERSION
        assert c.get_pipeline() == (None, b"", 0)
        config = pipeline.to_device_config()
        c.set_pipeline(pipeline.p4info, config, cookie=77)
        info, got_config, cookie = c.get_pipeline()
        assert info == pipeline.p4info
        assert got_config == config and cookie == 77


def test_not_primary_is_refused(switches: Callable[..., Switch]) -> None:
    sw = switches()
    with (
        P4RuntimeClient(addr_of(sw), election_id=5, timeout_s=5.0) as first,
        P4RuntimeClient(addr_of(sw), election_id=2, timeout_s=5.0) as second,
    ):
        first.connect(wait_s=10)
        with pytest.raises(P4RuntimeError, match="not primary") as ei:
            second.connect(wait_s=10)
        assert ei.value.code == grpc.StatusCode.ALREADY_EXISTS
        assert not second.connected


# ---- Write errors and counters ----------------------------------------------------------------
def test_batch_write_names_only_the_failed_update(client: P4RuntimeClient, names: Names) -> None:
    x = dmac_entry(names, 0x0A, FWD, 1)
    client.write([ins(x)])
    assert (client.writes, client.write_rpcs) == (1, 1)
    batch = [ins(dmac_entry(names, 0x0B, FWD, 2)), ins(x), ins(dmac_entry(names, 0x0C, FWD, 3))]
    with pytest.raises(P4RuntimeWriteError) as ei:
        client.write(batch)
    err = ei.value
    assert isinstance(err, P4RuntimeError)
    assert [(i, u) for i, u, _ in err.errors] == [(1, batch[1])]
    assert err.errors[0][2].canonical_code == code_pb2.ALREADY_EXISTS
    assert "#1" in str(err) and "ALREADY_EXISTS" in str(err)
    assert "#0" not in str(err) and "#2" not in str(err)
    # the other two were applied
    assert dmac_entries(client, names) == {mac(0x0A), mac(0x0B), mac(0x0C)}
    assert (client.writes, client.write_rpcs, client.reads) == (3, 2, 1)
    with pytest.raises(TypeError):
        client.write(ins(x))  # type: ignore[arg-type]


def test_write_refused_as_a_whole_has_no_update_errors(
    switches: Callable[..., Switch], names: Names
) -> None:
    with P4RuntimeClient(addr_of(switches()), timeout_s=5.0) as c:
        c.connect(wait_s=10)
        with pytest.raises(P4RuntimeWriteError) as ei:
            c.write([ins(dmac_entry(names, 0x0A, FWD, 1))])  # no pipeline yet
        assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert ei.value.errors == []
        assert (c.writes, c.write_rpcs) == (0, 1)


# ---- deadlines --------------------------------------------------------------------------------
class _Silent(p4runtime_pb2_grpc.P4RuntimeServicer):  # type: ignore[misc]
    """Answers nothing until ``release`` is set (at most 30 s)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def Read(self, request: Any, context: Any) -> Iterator[Any]:
        self.release.wait(30)
        yield from ()

    def Write(self, request: Any, context: Any) -> Any:
        self.release.wait(30)
        return p4runtime_pb2.WriteResponse()


def test_calls_against_a_server_that_never_answers_time_out() -> None:
    servicer = _Silent()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with P4RuntimeClient(f"127.0.0.1:{port}", timeout_s=0.5) as c:
            t0 = time.monotonic()
            with pytest.raises(P4RuntimeError) as ei:
                c.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())])
            assert time.monotonic() - t0 < 5
            assert ei.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            t0 = time.monotonic()
            with pytest.raises(P4RuntimeWriteError) as wi:
                c.write([])
            assert time.monotonic() - t0 < 5
            assert wi.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            # the stream is served by nobody: no arbitration answer
            t0 = time.monotonic()
            with pytest.raises(P4RuntimeError) as ci:
                c.connect(wait_s=5)
            assert time.monotonic() - t0 < 8
            assert ci.value.code in (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNIMPLEMENTED,
            )
    finally:
        servicer.release.set()
        server.stop(0).wait(5)


def test_tcp_peer_that_never_speaks_times_out() -> None:
    with socket.socket() as lsn:
        lsn.bind(("127.0.0.1", 0))
        lsn.listen(8)
        addr = f"127.0.0.1:{lsn.getsockname()[1]}"
        with P4RuntimeClient(addr, timeout_s=0.5) as c:
            t0 = time.monotonic()
            with pytest.raises(P4RuntimeError) as ei:
                c.connect(wait_s=0.5)
            assert time.monotonic() - t0 < 5
            assert ei.value.code == grpc.StatusCode.UNAVAILABLE
            t0 = time.monotonic()
            with pytest.raises(P4RuntimeError):
                c.read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())])
            assert time.monotonic() - t0 < 5


# ---- reconnection -----------------------------------------------------------------------------
def test_reconnect_after_switch_restart(
    switches: Callable[..., Switch], pipeline: Pipeline, names: Names
) -> None:
    sw = switches()
    addr = addr_of(sw)
    port = int(addr.rsplit(":", 1)[1])
    info, config = pipeline.p4info, pipeline.to_device_config()
    with P4RuntimeClient(addr, election_id=9, timeout_s=5.0) as c:
        c.connect(wait_s=10)
        c.set_pipeline(info, config)
        c.write([ins(dmac_entry(names, 0x0A, FWD, 1))])
        reader = c._stream.reader if c._stream is not None else None
        # restart without a pipeline: reconnect() explicitly, push the pipeline, write
        sw.stop()
        wait_until(lambda: not c.connected)
        assert reader is not None
        reader.join(5)
        assert not reader.is_alive()  # the reader ended with its stream
        sw2 = switches(port)
        c.reconnect(wait_s=10)
        assert c.connected and c.is_primary and c.reconnects == 1
        assert c.get_pipeline()[0] is None
        c.set_pipeline(info, config)
        c.write([ins(dmac_entry(names, 0x0B, FWD, 2))])
        assert dmac_entries(c, names) == {mac(0x0B)}
        # restart with the program preloaded: write() notices the ended stream and reconnects
        rpcs = c.write_rpcs
        sw2.stop()
        wait_until(lambda: not c.connected)
        switches(port, pipeline)
        c.write([ins(dmac_entry(names, 0x0C, FWD, 3))])
        assert c.reconnects == 2 and c.write_rpcs == rpcs + 1
        assert dmac_entries(c, names) == {mac(0x0C)}


def _flaky_write(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[int]:
    """Make the server answer the first ``failures`` Writes with UNAVAILABLE (not applied)."""
    calls: list[int] = []
    real = P4RuntimeServer.Write

    def write(self: P4RuntimeServer, request: Any, context: Any) -> Any:
        calls.append(len(request.updates))
        if len(calls) <= failures:
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        return real(self, request, context)

    monkeypatch.setattr(P4RuntimeServer, "Write", write)
    return calls


def test_write_retried_once_after_reconnect_on_unavailable(
    monkeypatch: pytest.MonkeyPatch,
    switches: Callable[..., Switch],
    pipeline: Pipeline,
    names: Names,
) -> None:
    calls = _flaky_write(monkeypatch, failures=1)
    with P4RuntimeClient(addr_of(switches(0, pipeline)), timeout_s=5.0) as c:
        c.connect(wait_s=10)
        c.write([ins(dmac_entry(names, 0x0A, FWD, 1))])
        assert calls == [1, 1]
        assert (c.writes, c.write_rpcs, c.reconnects) == (1, 2, 1)
        assert dmac_entries(c, names) == {mac(0x0A)}


def test_write_not_retried_twice(
    monkeypatch: pytest.MonkeyPatch,
    switches: Callable[..., Switch],
    pipeline: Pipeline,
    names: Names,
) -> None:
    calls = _flaky_write(monkeypatch, failures=5)
    with P4RuntimeClient(addr_of(switches(0, pipeline)), timeout_s=5.0) as c:
        c.connect(wait_s=10)
        with pytest.raises(P4RuntimeWriteError) as ei:
            c.write([ins(dmac_entry(names, 0x0A, FWD, 1))])
        assert ei.value.code == grpc.StatusCode.UNAVAILABLE
        assert len(calls) == 2 and (c.writes, c.write_rpcs) == (0, 2)


# ---- request log, close -----------------------------------------------------------------------
def test_request_log(
    switches: Callable[..., Switch], pipeline: Pipeline, names: Names, tmp_path: Path
) -> None:
    path = tmp_path / "logs" / "s1-p4runtime-requests.txt"
    config = pipeline.to_device_config()
    with P4RuntimeClient(addr_of(switches()), timeout_s=5.0, request_log=path) as c:
        c.connect(wait_s=10)
        c.set_pipeline(pipeline.p4info, config)
        c.write([ins(dmac_entry(names, 0x0A, FWD, 1))])
        text = path.read_text()  # flushed per request, readable while the client is open
    stamp = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] "
    assert re.search(stamp + r"SetForwardingPipelineConfigRequest$", text, re.M)
    assert re.search(stamp + r"WriteRequest$", text, re.M)
    assert f"# p4_device_config: {len(config)} bytes" in text
    assert "tables {" not in text  # a summary of the P4Info, not the P4Info
    write_part = text[text.index("] WriteRequest") :]
    assert "updates {" in write_part and "table_entry {" in write_part
    assert f"table_id: {names['MyIngress.dmac']}" in write_part


def test_close_is_idempotent_and_ends_the_reader(
    switches: Callable[..., Switch], names: Names
) -> None:
    c = P4RuntimeClient(addr_of(switches()), timeout_s=5.0)
    with pytest.raises(P4RuntimeError):
        c.packet_out(b"x", [])  # no stream yet
    c.connect(wait_s=10)
    assert c._stream is not None
    reader = c._stream.reader
    c.packet_out(b"\0" * 64, [])  # no pipeline: the switch answers with a stream error
    wait_until(lambda: bool(c.stream_errors), 5)
    c.close()
    c.close()
    assert not reader.is_alive() and not c.connected
    with pytest.raises(P4RuntimeError, match="closed"):
        c.write([ins(dmac_entry(names, 0x0A, FWD, 1))])
    with pytest.raises(P4RuntimeError, match="closed"):
        c.reconnect(wait_s=1)
