"""The control protocol's schema (shadowgrad.messages): every request and reply round-trips, and
its JSON is the one the servers and clients built by hand before the schema existed (same keys,
same values), so tools and tests that read the headers as dicts see no change."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shadowgrad import messages as m
from shadowgrad.control_client import ControllerClient, ShadowClient
from shadowgrad.errors import ControlError

#: an entry of a tensor stream (what encode_states writes; the schema does not look inside)
_ENTRY = {"box": 0, "key": "param", "dtype": "float32", "shape": [4], "frames": 1, "crc": 7}
_COMMIT = {"iteration": 3, "lr": [0.001], "clip_coef": 1.0, "scale": None, "skipped": False}
#: a load that keeps the shadow's own state of iteration 3 (generation 2, sent by rank 1)
_KEEP_LOAD: dict[str, Any] = {
    "iteration": 3,
    "optimizer": "{}",
    "layout": None,
    "entries": [],
    "keep": True,
    "generation": 2,
    "source": "rank 1",
}

#: (message class, the JSON the old hand-built code produced): replies as the servers built
#: them (shadow/node.py, shadow/_early.py, controller/service.py), requests as the clients did
#: (control_client.py, without the transport's ``op`` and ``token``)
OLD: list[tuple[type[Any], dict[str, Any]]] = [
    # -- shadow replies
    (
        m.ShadowStatus,
        {
            "ok": True,
            "shadow": 1,
            "starting": False,
            "incarnation": "0123456789abcdef",
            "loaded": True,
            "shard": 1,
            "replica": 0,
            "layout": "ab" * 32,
            "owned_bytes": 4096,
            "last_ready": 5,
            "last_applied": 5,
            "istar": 4,
            "newest_seen": 6,
            "lag": 1,
            "diverged_at": None,
            "trainers_silent_s": 0.012,
            "ranks": {"0": {"newest": 6, "silent_s": 0.01}, "1": {"newest": None, "silent_s": 2.5}},
            "generation": 3,
            "window": 8,
            "buffered": 1,
            "holds": [4],
            "available": [4, 5],
            "counters": {"data": 120, "commit": 6},
            "events": {"control_status": 2},
            "peers": {"0": {"ready_through": 5, "last_applied": 5, "diverged": False}},
            "timeline": [{"iteration": 5, "first_chunk": 1.0, "ready": 1.5}],
            "pending": {"6": {"first_chunk": 2.0, "covered": 100, "nack_rounds": 0}},
            "last_snapshot": {"iteration": 4, "path": "/tmp/s/4", "seconds": 0.5},
            "finished": None,
        },
    ),
    (
        m.ShadowStatus,  # a shadow process still starting (shadow/_early.py)
        {
            "ok": True,
            "shadow": 0,
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
            "trainers_silent_s": 0.2,
            "ranks": {},
            "generation": 0,
            "window": None,
            "buffered": 0,
            "holds": [],
            "available": [],
            "counters": {},
            "events": {},
            "peers": {},
            "timeline": [],
            "pending": {},
            "last_snapshot": None,
            "finished": {"iteration": 9, "generation": 0, "requester": "rank 0"},
            "starting": True,
            "incarnation": None,
        },
    ),
    (m.HoldReply, {"ok": True, "iteration": 4, "holds": [4, 7]}),
    (m.ReleaseReply, {"ok": True, "holds": []}),
    (
        m.FetchReply,
        {
            "ok": True,
            "iteration": 3,
            "shard": 0,
            "entries": [_ENTRY],
            "commit": _COMMIT,
            "generation": 2,
        },
    ),
    (
        m.FetchReply,
        {"ok": True, "iteration": -1, "shard": 1, "entries": [], "commit": None, "generation": 0},
    ),
    (
        m.LoadReply,
        {"ok": True, "shard": 0, "replica": 1, "iteration": 3, "generation": 2, "install_ms": 1.5},
    ),
    (
        m.LoadReply,
        {
            "ok": True,
            "shard": 0,
            "replica": 0,
            "iteration": 4,
            "generation": 2,
            "behind": True,
            "install_ms": 0.25,
        },
    ),
    (m.SnapshotReply, {"ok": True, "iteration": 4, "path": "/tmp/s/4", "seconds": 0.5}),
    (m.SnapshotReply, {"ok": True, "iteration": 4}),  # wait=false: not written yet
    (
        m.ShadowConfig,
        {
            "ok": True,
            "shard": 1,
            "replica": 1,
            "layout": '{"layout": 1}',
            "optimizer": '{"kind": "adamw"}',
            "generation": 2,
            "last_applied": 5,
            "diverged_at": None,
        },
    ),
    (
        m.FinishedReply,
        {"ok": True, "finished": {"iteration": 2, "generation": 0, "requester": "rank 0"}},
    ),
    (m.FinishedReply, {"ok": True}),  # the controller's
    # -- controller replies
    (
        m.ControllerStatus,
        {
            "live_istar": 5,
            "time": 1700000000.25,
            "ok": True,
            "source": "controller",
            "job": 7,
            "state": "finished",
            "reason": "training ended after iteration 2",
            "trainers": {"silent_s": 0.1, "ranks": {}, "iteration": 5, "shadows_reporting": 2},
            "istar": {"istar": 5, "source": [0, 1], "held": [0, 1], "generation_seen": 0},
            "held": [0, 1],
            "failure": None,
            "detections": 1,
            "finished": {"iteration": 2, "generation": 0, "requester": "rank 0"},
            "shadows": {"0": {"state": "ok", "reachable": True, "failed": False}},
            "switch": None,
            "counters": {"polls": 12},
        },
    ),
    (
        m.RestorePointReply,
        {
            "ok": True,
            "istar": 7,
            "source": [0, 3],
            "usable": [7, 8, 7, 9],
            "fresh": False,
            "reachable": 4,
            "layout": "cd" * 32,
            "held": [0, 3],
            "generation_seen": 1,
        },
    ),
    (m.ControllerReleaseReply, {"ok": True, "released": [0, 3]}),
    # -- requests
    (m.StatusRequest, {"timeline": 16}),
    (m.HoldRequest, {"iteration": 4}),
    (m.ReleaseRequest, {"iteration": 4}),
    (m.FetchRequest, {"iteration": None, "boxes": None}),
    (m.FetchRequest, {"iteration": 3, "boxes": [0, 2]}),
    (
        m.LoadRequest,
        {"iteration": -1, "optimizer": "{}", "layout": "{}", "entries": [_ENTRY]},
    ),
    (m.LoadRequest, {**_KEEP_LOAD, "reseed": True, "commit": _COMMIT}),
    (m.SnapshotRequest, {"wait": False}),
    (m.ConfigRequest, {}),
    (m.FinishedRequest, {"iteration": 2, "generation": 0, "requester": "rank 0"}),
    (m.FinishedRequest, {"iteration": None, "generation": 1, "requester": "rank 0"}),
    (m.ControllerStatusRequest, {}),
    (m.RestorePointRequest, {"requester": "rank 0"}),
    (m.RestorePointRequest, {"requester": "rank 0", "failed": 7}),
    (m.ControllerReleaseRequest, {}),
]


@pytest.mark.parametrize("cls,doc", OLD, ids=[f"{c.__name__}-{k}" for k, (c, _) in enumerate(OLD)])
def test_message_round_trips_to_the_old_json(cls: type[Any], doc: dict[str, Any]) -> None:
    msg = cls.from_json(doc)
    out = msg.to_json()
    assert out == doc
    assert set(out) == set(doc)  # the same keys, none added, none lost
    assert json.dumps(out, sort_keys=True) == json.dumps(doc, sort_keys=True)
    assert cls.from_json(json.loads(json.dumps(out))) == msg  # through the wire's JSON
    if issubclass(cls, m._Reply):
        assert msg.raw == doc


def test_every_op_has_a_message_pair_and_a_sample() -> None:
    sampled = {c for c, _ in OLD}
    for ops in (m.SHADOW_OPS, m.CONTROLLER_OPS):
        for op, (req, rep) in ops.items():
            assert req.op == op
            assert issubclass(req, m._Request) and issubclass(rep, m._Reply)
            assert req in sampled and rep in sampled, op
    assert set(m.SHADOW_OPS) == {
        "status",
        "hold",
        "release",
        "fetch",
        "load",
        "snapshot",
        "config",
        "finished",
    }
    assert set(m.CONTROLLER_OPS) == {"status", "restore_point", "finished", "release"}


@pytest.mark.parametrize(
    "cls,doc,code,field",
    [
        (m.HoldRequest, {"op": "hold"}, "bad_request", "'iteration'"),
        (m.HoldRequest, {"iteration": "3"}, "bad_request", "'iteration'"),
        (m.FetchRequest, {"iteration": None, "boxes": [0, "x"]}, "bad_request", "'boxes'"),
        (m.FinishedRequest, {"iteration": "x", "generation": 0}, "bad_request", "'iteration'"),
        (m.StatusRequest, {"timeline": True}, "bad_request", "'timeline'"),
        (m.HoldReply, {"ok": True, "iteration": 1}, "bad_reply", "'holds'"),
        (
            m.ShadowStatus,
            {**OLD[0][1], "peers": {"0": {"ready_through": 1, "last_applied": "2"}}},
            "bad_reply",
            "['peers']['0']",
        ),
        (m.RestorePointReply, [1, 2], "bad_reply", "not an object"),
    ],
)
def test_malformed_messages_are_refused_naming_the_field(
    cls: type[Any], doc: Any, code: str, field: str
) -> None:
    with pytest.raises(ControlError) as ei:
        cls.from_json(doc)
    assert ei.value.code == code
    assert field in str(ei.value)


def test_optional_fields_take_their_defaults() -> None:
    assert m.StatusRequest.from_json({"op": "status", "token": "t"}) == m.StatusRequest(16)
    assert m.SnapshotRequest.from_json({}).wait is True
    assert m.RestorePointRequest.from_json({}) == m.RestorePointRequest("client", None)
    old = {k: v for k, v in OLD[0][1].items() if k not in ("finished", "incarnation", "starting")}
    st = m.ShadowStatus.from_json(old)  # an older shadow's status
    assert (st.finished, st.incarnation, st.starting) == (None, None, False)


def _sample(cls: type[Any]) -> dict[str, Any]:
    return next(doc for c, doc in OLD if c is cls)


def _capture(client: Any, ops: Any) -> list[tuple[str, dict[str, Any]]]:
    """Replace the client's transport: record each request, answer the op's sample reply."""
    sent: list[tuple[str, dict[str, Any]]] = []

    def call(op: str, frames: Any = (), timeout_s: Any = None, **kw: Any) -> Any:
        kw.pop("copy", None)
        sent.append((op, kw))
        return _sample(ops[op][1]), []

    client.call = call
    return sent


def test_clients_send_the_old_requests_and_return_typed_replies() -> None:
    with ShadowClient("tcp://127.0.0.1:9", "t") as c:
        sent = _capture(c, m.SHADOW_OPS)
        assert isinstance(c.status(timeline=0), m.ShadowStatus)
        assert isinstance(c.hold(4), m.HoldReply)
        assert isinstance(c.release(4), m.ReleaseReply)
        assert isinstance(c.config(), m.ShadowConfig)
        assert isinstance(c.snapshot(wait=False), m.SnapshotReply)
        assert isinstance(c.finished(2, 0, "rank 0"), m.FinishedReply)
        assert isinstance(c.fetch_raw(3, boxes=[0, 2]), m.FetchReply)
        assert isinstance(c.load(3, None, "{}", generation=2, source="rank 1"), m.LoadReply)
        with pytest.warns(DeprecationWarning):
            assert isinstance(c.status_typed(), m.ShadowStatus)
    assert sent[:8] == [
        ("status", {"timeline": 0}),
        ("hold", {"iteration": 4}),
        ("release", {"iteration": 4}),
        ("config", {}),
        ("snapshot", {"wait": False}),
        ("finished", {"iteration": 2, "generation": 0, "requester": "rank 0"}),
        ("fetch", {"iteration": 3, "boxes": [0, 2]}),
        ("load", _KEEP_LOAD),
    ]
    with ControllerClient("tcp://127.0.0.1:9", "t") as cc:
        sent = _capture(cc, m.CONTROLLER_OPS)
        assert isinstance(cc.status(), m.ControllerStatus)
        assert cc.restore_point("rank 0", failed=7).istar == 7
        assert cc.release().released == (0, 3)
        assert cc.finished(None, 1, "rank 0").finished is not None  # the first sample
    assert sent == [
        ("status", {}),
        ("restore_point", {"requester": "rank 0", "failed": 7}),
        ("release", {}),
        ("finished", {"iteration": None, "generation": 1, "requester": "rank 0"}),
    ]
