"""Fuzz a running trainer's receive path (invariant 8, issue 11): >= 100,000 random and mutated
datagrams — random bytes, corrupted and truncated records, NACKs without a MAC or under another
key, well-formed NACKs from strangers, foreign jobs and layouts, ACKs and DATA from anyone —
into the mirror sender and into the in-band ring, directly (their datagram handlers) and over
UDP from a stranger's socket. No crash, every datagram counted under exactly one reason, no
reply to anyone but the job's shadows (the stranger receives nothing), and the genuine shadow's
NACKs are still answered."""

from __future__ import annotations

import random
import socket
import struct
import time
from typing import Any

import torch

from shadowgrad import wire
from shadowgrad.layout import Layout, from_module
from shadowgrad.testing.producer import Records
from shadowgrad.trainer_hooks._mirror import MirrorSender
from shadowgrad.trainer_hooks._plan import RankPlan
from shadowgrad.trainer_hooks.ring import RingAllReduce, RingConfig

JOB = 7
KEY = wire.mac_key("fuzz-token", JOB)
N_DIRECT = 100_000
N_UDP = 10_000


def _layout() -> tuple[torch.nn.Module, Layout]:
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))
    params, buckets = from_module(model)
    return model, Layout.build(params, buckets, 1, 1)


class Gen:
    """(datagram, from the shadow?, expected to be answered?)"""

    def __init__(self, layout: Layout, digest: int, seed: int) -> None:
        self.r = random.Random(seed)
        self.digest = digest
        self.records = Records(JOB, digest, KEY, seq=1)
        self.nb = layout.bucket_nbytes

    def _nack(self, it: int = 0, **kw: Any) -> bytes:
        """A NACK for iteration ``it`` (``kw``: other key, job or layout)."""
        return self.records.encode(
            wire.Kind.NACK, wire.NackRecord.of([(0, 0, 64)]).body(), it, **kw
        )

    def one(self) -> tuple[bytes, bool, bool]:
        r = self.r
        k = r.randrange(12)
        if k == 0:
            data = bytearray(r.randbytes(r.randrange(0, 1500)))
            if len(data) >= 2 and r.random() < 0.5:
                data[0:2] = b"SG"
            return bytes(data), r.random() < 0.5, False
        base = bytearray(self._nack())
        if k == 1:  # one byte flipped anywhere
            base[r.randrange(len(base))] ^= r.randrange(1, 256)
            return bytes(base), r.random() < 0.5, False
        if k == 2:  # truncated
            return bytes(base[: r.randrange(len(base))]), True, False
        if k == 3:  # a flipped byte with the CRC fixed up: only the MAC can tell
            base[r.randrange(wire.HEADER_SIZE, len(base))] ^= r.randrange(1, 256)
            base[52:56] = wire.checksum(base).to_bytes(4, "big")
            return bytes(base), True, False
        if k == 4:
            return self._nack(key=None), True, False  # no MAC
        if k == 5:
            return self._nack(key=wire.mac_key(r.randbytes(8), JOB)), True, False  # another key
        if k == 6:
            return self._nack(), False, False  # genuine record, stranger's socket
        if k == 7:
            return self._nack(job=JOB + 1), True, False
        if k == 8:
            return self._nack(layout=self.digest ^ 1), True, False
        if k == 9:  # an ACK (not for the mirror sender; the ring takes it only from next)
            key = KEY if r.random() < 0.5 else None
            ack = self.records.encode(
                wire.Kind.ACK, wire.AckRecord(3).body(), sender=1, seq=5, key=key
            )
            return ack, r.random() < 0.5, False
        if k == 10:  # DATA from anyone
            chunk = self.records.encode(
                wire.Kind.DATA, b"\0" * 64, 3, flags=wire.Flag.FINAL, dtype=wire.DType.FLOAT32
            )
            return chunk, r.random() < 0.5, False
        # a huge length field
        base[48:52] = struct.pack("!I", r.choice([65452, 2**31]))
        return bytes(base), True, False


def _sink() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 2**20)
    s.setblocking(False)
    return s


def _drain(s: socket.socket) -> int:
    n = 0
    while True:
        try:
            n += len(s.recv(65536))
        except (BlockingIOError, InterruptedError):
            return n


def test_fuzz_the_mirror_senders_receive_path() -> None:
    model, layout = _layout()
    shadow, stranger = _sink(), _sink()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    snd = MirrorSender(
        RankPlan(layout, 0, 1),
        job=JOB,
        sock=sock,
        shadow_addrs=[shadow.getsockname()],
        chunk_bytes=4096,
        key=KEY,
    )
    addr = sock.getsockname()
    try:
        grads = {n: torch.ones_like(p) for n, p in model.named_parameters()}
        assert snd.capture(0, grads) and snd.flush(5)
        _drain(shadow)
        gen = Gen(layout, snd.digest, seed=11)
        c = snd.counters
        before = c.rx_rejected + c.nacks
        for _ in range(N_DIRECT):
            data, from_shadow, _ = gen.one()
            src = shadow.getsockname() if from_shadow else stranger.getsockname()
            snd._on_datagram(memoryview(data), src)
        assert c.rx_rejected + c.nacks - before == N_DIRECT
        assert c.nacks == 0, "nothing in the mix is a valid NACK from the shadow"
        assert c.by_reason.get("not_a_shadow", 0) > N_DIRECT // 5
        assert c.by_reason.get("bad_mac", 0) > 0 and c.by_reason.get("unauthenticated", 0) > 0
        # over UDP from the stranger's socket: counted, never answered
        for _ in range(N_UDP // 500):
            for _ in range(500):
                stranger.sendto(gen.one()[0], addr)
            deadline = time.monotonic() + 5
            while c.rx_rejected + c.nacks - before < N_DIRECT and time.monotonic() < deadline:
                time.sleep(0.002)
        time.sleep(0.3)
        assert _drain(stranger) == 0
        # the genuine shadow is still answered
        shadow.sendto(gen._nack(0), addr)
        deadline = time.monotonic() + 5
        got = 0
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
            got = _drain(shadow)
        assert got > 0 and c.nacks == 1 and c.retx_chunks > 0
    finally:
        snd.close()
        for s in (shadow, stranger):
            s.close()


class _MemLink:
    def __init__(self, me: tuple[str, int]) -> None:
        self.me = me
        self.sent: list[tuple[bytes, tuple[str, int]]] = []

    def send(self, parts: Any, addr: tuple[str, int]) -> bool:
        self.sent.append((b"".join(bytes(p) for p in parts), (addr[0], addr[1])))
        return True

    def recv_into(self, buf: bytearray, timeout_s: float) -> None:
        return None

    def close(self) -> None:
        pass


def test_fuzz_the_rings_receive_path() -> None:
    _model, layout = _layout()
    addrs = [("10.9.0.1", 47474), ("10.9.0.2", 47474)]
    shadow = ("10.9.1.1", 47474)
    stranger = ("10.9.9.9", 40000)
    link = _MemLink(addrs[0])
    ring = RingAllReduce(
        0, 2, link, addrs, RingConfig(job=JOB, layout=7, key=KEY, shadows=(shadow,))
    )
    ring._retain(0, 0, [(0, wire.DType.FLOAT32, bytes(4096))])
    gen = Gen(layout, 7, seed=12)
    before = sum(ring.stats.values())
    for _ in range(N_DIRECT):
        data, from_shadow, _ = gen.one()
        src = shadow if from_shadow else (stranger if gen.r.random() < 0.7 else addrs[1])
        ring._on_datagram(memoryview(data), src)
    assert sum(ring.stats.values()) - before == N_DIRECT
    assert ring.stats["nack"] == 0 and ring.stats["rx_not_a_peer"] > N_DIRECT // 10
    assert ring.stats["rx_bad_mac"] > 0 and ring.stats["rx_unauthenticated"] > 0
    # nothing was sent to anyone: no record in the mix deserved an answer
    assert link.sent == []
    # the genuine shadow's NACK is answered, to the shadow only
    ring._on_datagram(memoryview(gen._nack(0)), shadow)
    assert ring.stats["nack"] == 1 and link.sent
    assert {a for _d, a in link.sent} == {shadow}
