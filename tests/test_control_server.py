"""The control server alone (``shadowgrad/_control_server.py``): token check, unknown ops,
error replies, a handler that fails, stop and close within a deadline, and the hand-over of a
bound socket with the requests kept for the next server."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from shadowgrad._control_server import ControlServer, Reply, TrackedFrames, bind_router
from shadowgrad.control_client import ControlClient
from shadowgrad.errors import ControlError, ShadowgradError, ShadowgradTimeout
from shadowgrad.testing.processes import wait_for

TOKEN = "t0ken-for-the-control-server"


def _echo(req: dict[str, Any], frames: list[memoryview]) -> Reply:
    return {"ok": True, "op": req["op"], "n": req.get("n")}, [bytes(f)[::-1] for f in frames]


def _refuse(_req: dict[str, Any], _f: list[memoryview]) -> Reply:
    raise ControlError("not_loaded", "nothing here")


def _crash(_req: dict[str, Any], _f: list[memoryview]) -> Reply:
    raise RuntimeError("handler bug")


@pytest.fixture
def server() -> Iterator[ControlServer]:
    ctx, sock = bind_router("tcp://127.0.0.1:*")
    srv = ControlServer(
        ctx,
        sock,
        TOKEN,
        poll_s=0.02,
        handlers={"echo": _echo, "refuse": _refuse, "crash": _crash},
        name="test-control",
    ).start()
    try:
        yield srv
    finally:
        srv.close(5.0)


def test_a_request_is_served_by_its_handler_with_its_frames(server: ControlServer) -> None:
    with ControlClient(server.endpoint, TOKEN, timeout_s=5) as c:
        head, frames = c.call("echo", [b"abc", b""], n=7)
    assert head == {"ok": True, "op": "echo", "n": 7}
    assert frames == [b"cba", b""]
    assert server.ev["control_echo"] == 1 and server.request_at is None


def test_a_wrong_or_missing_token_is_refused_and_counted(server: ControlServer) -> None:
    for token in ("wrong", ""):
        with ControlClient(server.endpoint, token, timeout_s=5) as c:
            with pytest.raises(ControlError) as ei:
                c.call("echo")
            assert ei.value.code == "bad_token"
    assert server.ev["control_bad_token"] == 2 and server.ev["control_echo"] == 0


def test_a_header_that_is_not_json_is_a_bad_request(server: ControlServer) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    req = ctx.socket(zmq.REQ)
    try:
        req.connect(server.endpoint)
        req.send_multipart([b"{not json"])
        assert req.poll(5000, zmq.POLLIN)
        reply = json.loads(req.recv())
        assert reply["ok"] is False and reply["code"] == "bad_request"
        assert server.ev["control_bad_request"] == 1
    finally:
        req.close(linger=0)
        ctx.term()


def test_a_request_without_its_envelope_is_dropped_and_counted(server: ControlServer) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.connect(server.endpoint)
        dealer.send_multipart([json.dumps({"op": "echo", "token": TOKEN}).encode()])
        assert wait_for(lambda: server.ev["control_malformed"] == 1, 5)
        assert not dealer.poll(200, zmq.POLLIN)  # not answered
    finally:
        dealer.close(linger=0)
        ctx.term()


def test_an_unknown_op_is_a_bad_request(server: ControlServer) -> None:
    with ControlClient(server.endpoint, TOKEN, timeout_s=5) as c, pytest.raises(ControlError) as ei:
        c.call("nope")
    assert ei.value.code == "bad_request" and "unknown op 'nope'" in str(ei.value)
    assert server.ev["control_bad_request"] == 1 and "control_nope" not in server.ev


def test_a_handlers_control_error_comes_back_with_its_code(server: ControlServer) -> None:
    with ControlClient(server.endpoint, TOKEN, timeout_s=5) as c, pytest.raises(ControlError) as ei:
        c.call("refuse")
    assert ei.value.code == "not_loaded" and "nothing here" in str(ei.value)
    assert server.ev["control_refuse"] == 1


def test_a_failing_handler_is_answered_internal_and_the_server_keeps_serving(
    server: ControlServer,
) -> None:
    with ControlClient(server.endpoint, TOKEN, timeout_s=5) as c:
        for _ in range(2):
            with pytest.raises(ControlError) as ei:
                c.call("crash")
            assert ei.value.code == "internal" and "RuntimeError: handler bug" in str(ei.value)
        head, _ = c.call("echo", n=1)
    assert head["ok"] is True
    assert server.ev["control_internal"] == 2 and server.error is None


def test_refusal_answers_a_handlers_exception_before_the_defaults() -> None:
    ctx, sock = bind_router("tcp://127.0.0.1:*")
    counters: Counter[str] = Counter()
    srv = ControlServer(
        ctx,
        sock,
        TOKEN,
        counters=counters,
        poll_s=0.02,
        refusal=lambda e: ("unavailable", str(e)) if isinstance(e, ShadowgradError) else None,
        handlers={"refuse": _refuse, "crash": _crash},
    ).start()
    try:
        with ControlClient(srv.endpoint, TOKEN, timeout_s=5) as c:
            with pytest.raises(ControlError) as ei:
                c.call("refuse")  # a ControlError is a ShadowgradError: the refusal decides
            assert ei.value.code == "unavailable"
            with pytest.raises(ControlError) as ei:
                c.call("crash")
            assert ei.value.code == "internal"
        assert counters["control_refuse"] == 1 and counters["control_internal"] == 1
    finally:
        srv.close(5.0)


def test_close_stops_the_thread_and_frees_the_endpoint_within_its_deadline() -> None:
    ctx, sock = bind_router("tcp://127.0.0.1:*")
    srv = ControlServer(ctx, sock, TOKEN, poll_s=0.05, handlers={"echo": _echo}).start()
    endpoint = srv.endpoint
    with ControlClient(endpoint, TOKEN, timeout_s=5) as c:
        assert c.call("echo")[0]["ok"]
    srv.close(2.0)  # raises ShadowgradError if the thread did not end within its deadline
    srv.close(2.0)  # idempotent
    with ControlClient(endpoint, TOKEN, timeout_s=0.3) as c, pytest.raises(ShadowgradTimeout):
        c.call("echo")
    # the address is free again: it can be bound anew
    ctx2, sock2 = bind_router(endpoint)
    sock2.close(linger=0)
    ctx2.term()


def test_serve_on_the_callers_thread_ends_when_its_stop_is_set() -> None:
    ctx, sock = bind_router("tcp://127.0.0.1:*")
    stop = threading.Event()
    srv = ControlServer(ctx, sock, TOKEN, poll_s=0.05, stop=stop, handlers={"echo": _echo})
    t = threading.Thread(target=srv.serve, daemon=True)
    t.start()
    try:
        with ControlClient(srv.endpoint, TOKEN, timeout_s=5) as c:
            assert c.call("echo")[0]["ok"]
        stop.set()
        t.join(2.0)
        assert not t.is_alive()
    finally:
        stop.set()
        t.join(5.0)
        srv.close(1.0)


def test_a_bound_socket_is_handed_over_with_the_requests_kept_for_the_next_server() -> None:
    ctx, sock = bind_router("tcp://127.0.0.1:*")
    first = ControlServer(
        ctx,
        sock,
        TOKEN,
        poll_s=0.02,
        defer=lambda op: op != "echo",
        handlers={"echo": _echo},
        name="first",
    ).start()
    endpoint = first.endpoint
    results: dict[str, Any] = {}

    def call_later() -> None:
        try:
            with ControlClient(endpoint, TOKEN, timeout_s=20) as c:
                results["reply"] = c.call("later", [b"xyz"], n=3)
        except BaseException as e:  # reported by the assertion below
            results["error"] = e

    t = threading.Thread(target=call_later, daemon=True)
    second: ControlServer | None = None
    try:
        t.start()
        assert wait_for(lambda: len(first.backlog) == 1, 5)
        # meanwhile the first server still answers what it serves
        with ControlClient(endpoint, TOKEN, timeout_s=5) as c:
            assert c.call("echo", n=1)[0]["n"] == 1
        assert not results
        ctx2, sock2, backlog = first.handover()
        assert sock2 is sock and ctx2 is ctx and len(backlog) == 1 and first.backlog == []
        first.close()  # a no-op after the hand-over: the socket is the next server's
        served: list[str] = []

        def later(req: dict[str, Any], frames: list[memoryview]) -> Reply:
            served.append(req["op"])
            return _echo(req, frames)

        second = ControlServer(ctx2, sock2, TOKEN, poll_s=0.02, handlers={"later": later})
        assert second.endpoint == endpoint
        serving = threading.Thread(target=second.serve, args=(backlog,), daemon=True)
        serving.start()
        t.join(10)
        assert "error" not in results, results.get("error")
        head, frames = results["reply"]
        assert head == {"ok": True, "op": "later", "n": 3} and frames == [b"zyx"]
        assert served == ["later"] and second.ev["control_later"] == 1
        assert first.ev["control_later"] == 0
        # and the second serves new requests on the same endpoint
        with ControlClient(endpoint, TOKEN, timeout_s=5) as c:
            assert c.call("later", n=4)[0]["n"] == 4
        second.halt()
        serving.join(5)
        assert not serving.is_alive()
    finally:
        t.join(5)
        if second is not None:
            second.close(5.0)
        else:
            first.close(5.0)


def test_tracked_frames_are_sent_without_a_copy_and_report_when_they_are_out() -> None:
    """A reply over memory its owner will change again (the shadow serving its live state) is
    sent without a copy, and its tracker says when libzmq has let go of it: once the client
    received the reply, never before the handler's memory was read."""
    memory = bytearray(b"x" * (4 * 2**20))
    trackers: list[zmq.MessageTracker | None] = []

    def live(_req: dict[str, Any], _f: list[memoryview]) -> Reply:
        return {"ok": True}, TrackedFrames([memoryview(memory)], trackers.append)

    ctx, sock = bind_router("tcp://127.0.0.1:*")
    srv = ControlServer(ctx, sock, TOKEN, poll_s=0.02, handlers={"live": live}).start()
    try:
        with ControlClient(srv.endpoint, TOKEN, timeout_s=5) as c:
            _head, frames = c.call("live")
        assert frames == [bytes(memory)]
        assert len(trackers) == 1 and trackers[0] is not None
        trackers[0].wait(5.0)  # raises NotDone past the deadline
        assert trackers[0].done
    finally:
        srv.close(5.0)
