"""The bulk channel of ``fetch`` (shadowgrad.bulk): the bytes on a TCP connection of their own,
received straight into the destination tensors, every chunk CRC-checked as it lands; a bad
chunk, a wrong ticket, a truncated stream or a stalled sender fail precisely within the
deadline; the shadow's live-serve bookkeeping ends when the send ends."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from typing import Any

import pytest
import torch

from shadowgrad import wire
from shadowgrad.boxes import FullStateSink
from shadowgrad.bulk import (
    TICKET_BYTES,
    BulkServer,
    StreamReader,
    connect_stream,
    endpoint_host,
)
from shadowgrad.errors import ControlError, ShadowgradTimeout
from shadowgrad.tensorstream import dest_bytes, encode_states, parse_entry
from shadowgrad.testing.loaded import loaded_cluster, run_applied, trainer_state
from shadowgrad.testing.training import Case, RefTrainer, compare_shard

# ------------------------------------------------------------------ the channel alone


def _tensors() -> list[tuple[int, dict[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(3)
    return [
        (
            0,
            {
                "param": torch.randn(300, 1000, generator=g),
                "exp_avg": torch.randn(300, 1000, generator=g),
            },
        ),
        (1, {"param": torch.randn(7, generator=g), "step": torch.tensor(4.0)}),
        (2, {"param": torch.empty(0)}),
    ]


@pytest.fixture
def server() -> Any:
    ev: Counter[str] = Counter()
    srv = BulkServer("127.0.0.1", ticket_ttl_s=1.0, counters=ev)
    yield srv
    srv.close()


def _offer(srv: BulkServer, chunk: int = 64 * 1024) -> tuple[list[dict[str, Any]], Any, Any]:
    entries, frames = encode_states(_tensors(), chunk_bytes=chunk)
    done: list[bool] = []
    ev = threading.Event()

    def on_done(ok: bool) -> None:
        done.append(ok)
        ev.set()

    ticket = srv.offer(frames, on_done, send_timeout_s=5.0)
    assert ticket is not None
    return entries, {"port": srv.port, "ticket": ticket, "chunk": chunk}, (done, ev)


def _receive(entries: list[dict[str, Any]], reader: StreamReader) -> dict[tuple[int, str], Any]:
    out = {}
    for e in entries:
        t = parse_entry(e)
        dest = torch.full((t.nbytes,), 0xAB, dtype=torch.uint8)
        reader.read_into(dest_bytes(t, dest), t.crcs, t.key)
        out[t.box, t.key] = dest
    return out


def test_stream_bit_exact_into_destination(server: BulkServer) -> None:
    entries, stream, (done, ev) = _offer(server)
    with connect_stream("127.0.0.1", stream, time.monotonic() + 5) as reader:
        got = _receive(entries, reader)
    for box, state in _tensors():
        for key, t in state.items():
            raw = got[box, key].view(t.dtype).reshape(t.shape)
            assert torch.equal(raw, t)
    assert ev.wait(5) and done == [True]
    assert server.ev["bulk_sent"] == 1 and server.pending == 0


def test_ticket_is_single_use_and_wrong_ticket_refused(server: BulkServer) -> None:
    entries, stream, (done, ev) = _offer(server)
    bad = dict(stream, ticket=bytes(TICKET_BYTES).hex())
    with connect_stream("127.0.0.1", bad, time.monotonic() + 5) as reader:
        t0 = time.monotonic()
        with pytest.raises(ControlError) as ei:
            _receive(entries, reader)
        assert ei.value.code == "truncated" and time.monotonic() - t0 < 2
    assert server.ev["bulk_bad_ticket"] == 1 and not done
    with connect_stream("127.0.0.1", stream, time.monotonic() + 5) as reader:
        _receive(entries, reader)
    assert ev.wait(5) and done == [True]
    # used once: the second connection gets nothing
    with connect_stream("127.0.0.1", stream, time.monotonic() + 5) as reader:
        with pytest.raises(ControlError) as ei:
            _receive(entries, reader)
        assert ei.value.code == "truncated"
    assert server.ev["bulk_bad_ticket"] == 2


def test_unclaimed_ticket_expires() -> None:
    srv = BulkServer("127.0.0.1", ticket_ttl_s=0.2)
    try:
        _, _stream, (done, ev) = _offer(srv)
        assert ev.wait(3) and done == [False]
        assert srv.ev["bulk_expired"] == 1 and srv.pending == 0
    finally:
        srv.close()


def test_corrupted_chunk_fails_checksum(server: BulkServer) -> None:
    entries, stream, _ = _offer(server)
    entries[0]["crc"][3] ^= 1
    with (
        connect_stream("127.0.0.1", stream, time.monotonic() + 5) as reader,
        pytest.raises(ControlError) as ei,
    ):
        _receive(entries, reader)
    assert ei.value.code == "checksum" and "chunk 3" in str(ei.value)


def _fake_shadow(behaviour: str) -> tuple[socket.socket, threading.Thread, list[Any]]:
    """A listener that takes the ticket and then sends half of what it should and closes
    (``truncate``) or sends half and stops sending without closing (``stall``)."""
    ls = socket.create_server(("127.0.0.1", 0))
    held: list[Any] = []

    def run() -> None:
        conn, _ = ls.accept()
        held.append(conn)
        conn.recv(TICKET_BYTES)
        conn.sendall(b"\0" * 1000)
        if behaviour == "truncate":
            conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return ls, t, held


@pytest.mark.parametrize("behaviour", ["truncate", "stall"])
def test_truncated_or_stalled_stream_fails_in_time(behaviour: str) -> None:
    ls, t, held = _fake_shadow(behaviour)
    try:
        stream = {"port": ls.getsockname()[1], "ticket": "00" * TICKET_BYTES, "chunk": 4096}
        payload = torch.zeros(10_000, dtype=torch.uint8)
        crcs = [wire.crc(bytes(4096)), wire.crc(bytes(4096)), wire.crc(bytes(10_000 - 8192))]
        t0 = time.monotonic()
        with connect_stream("127.0.0.1", stream, time.monotonic() + 0.5) as reader:
            if behaviour == "truncate":
                with pytest.raises(ControlError) as ei:
                    reader.read_into(memoryview(payload.numpy()), crcs, "x")
                assert ei.value.code == "truncated" and "chunk 0 of x" in str(ei.value)
            else:
                with pytest.raises(ShadowgradTimeout, match="stalled in x"):
                    reader.read_into(memoryview(payload.numpy()), crcs, "x")
        assert time.monotonic() - t0 < 2
    finally:
        t.join(2)
        for c in held:
            c.close()
        ls.close()


def test_stalled_receiver_ends_the_send(server: BulkServer) -> None:
    """A requester that stops reading: the send gives up at its deadline, on_done(False)."""
    big = torch.randn(16 * 2**20 // 4)
    _entries, frames = encode_states([(0, {"param": big})], chunk_bytes=2**20)
    done: list[bool] = []
    ev = threading.Event()
    ticket = server.offer(frames, lambda ok: (done.append(ok), ev.set()), send_timeout_s=0.5)
    assert ticket is not None
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(bytes.fromhex(ticket))
        assert ev.wait(5) and done == [False]
    assert server.ev["bulk_send_error"] == 1


def test_endpoint_host() -> None:
    assert endpoint_host("tcp://127.0.0.1:5555") == "127.0.0.1"
    assert endpoint_host("tcp://[::1]:5555") == "::1"
    assert endpoint_host("tcp://*:5555") == ""


def test_malformed_stream_offer() -> None:
    with pytest.raises(ControlError) as ei:
        connect_stream("127.0.0.1", {"port": 1, "ticket": "zz", "chunk": 1}, time.monotonic() + 1)
    assert ei.value.code == "bad_reply"


# ------------------------------------------------------------------ through a shadow


def test_streamed_fetch_from_shadows_bit_exact() -> None:
    trainer = RefTrainer(Case("bulk", "mlp", "adamw", iterations=8), seed=2)
    layout = trainer.layout(num_shadows=2)
    with loaded_cluster(trainer, layout) as c:
        run_applied(c, trainer, layout, range(3))
        c.expect_istar(2)
        at2 = trainer_state(trainer)
        for cl in c.clients:
            cl.hold(2)
        run_applied(c, trainer, layout, range(3, 5))
        now = trainer_state(trainer)
        for shard, cl in enumerate(c.clients):
            # a held copy and the live state, each bit for bit as over zmq
            held = cl.fetch(2, stream=True)
            assert held.iteration == 2
            assert not compare_shard(layout, shard, held.states, *at2)
            live = cl.fetch(None, stream=True)
            assert live.iteration == 4
            assert not compare_shard(layout, shard, live.states, *now)
            assert live.commit == cl.fetch(None).commit
        deadline = time.monotonic() + 5
        while any(n.ev["bulk_sent"] < 2 for n in c.nodes) and time.monotonic() < deadline:
            time.sleep(0.01)
        for n in c.nodes:  # one held copy and one live state each, sent; every serve ended
            assert n.ev["bulk_sent"] == 2 and not n.ev["bulk_send_error"]
            assert all(s.queued.wait(5) for s in n._serving)
        # the sink path of a restore: params in place, optimizer state in new tensors
        dest = {k: torch.zeros_like(v) for k, v in trainer.named.items()}
        sink = FullStateSink(layout, dest)
        for shard, cl in enumerate(c.clients):
            reply = cl.fetch_raw(4, stream=True, copy=False)
            assert reply.stream is not None and not reply.frames
            with cl.open_stream(reply, time.monotonic() + 5) as reader:
                sink.receive(shard, reply.entries, reader)
        params, opt = sink.finish()
        for k, v in now[0].items():
            assert params[k] is dest[k] and torch.equal(dest[k], v)
        for k, st in now[1].items():
            for key, v in st.items():
                assert torch.equal(opt[k][key], v)


def test_live_serve_ends_when_stream_ends() -> None:
    """The next step waits for a streamed live serve until its send ends, not longer; an
    unclaimed ticket lets it go at the ticket's expiry."""
    trainer = RefTrainer(Case("bulkq", "mlp", "sgd", iterations=8), seed=4)
    layout = trainer.layout(num_shadows=1)
    with loaded_cluster(trainer, layout) as c:
        run_applied(c, trainer, layout, range(2))
        n, cl = c.nodes[0], c.clients[0]
        reply = cl.fetch_raw(None, stream=True)
        assert reply.stream is not None
        (serve,) = n._serving
        assert not serve.queued.is_set()  # the bytes have not left
        with cl.open_stream(reply, time.monotonic() + 5) as reader:
            sink = FullStateSink(layout)
            sink.receive(0, reply.entries, reader)
        assert serve.queued.wait(2)  # ended with the send
        run_applied(c, trainer, layout, range(2, 3))
        # never claimed: the serve ends when the ticket expires (timeouts.rpc)
        cl.fetch_raw(None, stream=True)
        (serve,) = n._serving
        t0 = time.monotonic()
        assert serve.queued.wait(n.spec.timeouts.rpc_s + 2)
        assert time.monotonic() - t0 <= n.spec.timeouts.rpc_s + 1
        assert n.ev["bulk_expired"] == 1
        run_applied(c, trainer, layout, range(3, 4))
