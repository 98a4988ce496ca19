"""The in-band ring's datagrams. It cuts them at the layout's shard boundaries: the switch maps a
FINAL datagram to the one shard owning its first byte (p4/ingress_tap.p4), so no FINAL datagram
may straddle a boundary. Property tests over random layouts and world sizes: the span function
alone (many cases), and the real ring engine over an in-memory link (threads, fewer cases). And
it seals (MACs) what shadows receive, the rest of its DATA only when asked to."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadowgrad.layout import Layout, ParamSpec, ddp_buckets
from shadowgrad.trainer_hooks.ring import RingAllReduce, RingConfig
from shadowgrad.wire import DType, Flag, Kind, encode, mac_key, peek_header

KEY = mac_key("ring-cuts-token", 1)


@st.composite
def layouts(draw: Any) -> tuple[Layout, int]:
    n = draw(st.integers(1, 6))
    params = []
    for i in range(n):
        rows = draw(st.integers(1, 300))
        cols = draw(st.sampled_from([1, 3, 64, 100]))
        params.append(ParamSpec(f"p{i}", (rows, cols), "float32"))
    cap = draw(st.sampled_from([4096, 20000, 1 << 20]))
    buckets = ddp_buckets(params, bucket_cap_bytes=cap, first_bucket_bytes=cap)
    shards = draw(st.integers(1, 4))
    replication = draw(st.integers(1, 2))
    total = sum(p.nbytes for p in params)
    piece = draw(st.sampled_from([None, max(256, total // 7), 1024]))
    lay = Layout.build(params, buckets, shards * replication, replication, max_piece_bytes=piece)
    world = draw(st.integers(1, 5))
    return lay, world


def _owner(lay: Layout, bucket: int, off: int) -> tuple[int, int, int]:
    for r in lay.bucket_routes[bucket]:
        if r.start <= off < r.end:
            return r
    raise AssertionError(f"offset {off} of bucket {bucket} in no route")


class _Net:
    """In-memory datagram network: one queue per address."""

    def __init__(self, n: int) -> None:
        self.q: list[queue.Queue[tuple[bytes, Any]]] = [queue.Queue() for _ in range(n)]
        self.sent: list[bytes] = []  # every datagram, in the order sent

    def link(self, i: int) -> _Link:
        return _Link(self, i)


class _Link:
    def __init__(self, net: _Net, i: int) -> None:
        self.net, self.i = net, i

    @property
    def address(self) -> tuple[str, int]:
        return ("mem", self.i)

    def send(self, parts: Sequence[Any], addr: tuple[str, int]) -> bool:
        data = b"".join(bytes(p) for p in parts)
        self.net.sent.append(data)
        self.net.q[addr[1]].put((data, self.address))
        return True

    def recv_into(self, buf: bytearray, timeout_s: float) -> tuple[int, Any] | None:
        try:
            data, src = (
                self.net.q[self.i].get(timeout=max(timeout_s, 0) or None)
                if timeout_s > 0
                else self.net.q[self.i].get_nowait()
            )
        except queue.Empty:
            return None
        buf[: len(data)] = data
        return len(data), src

    def close(self) -> None:
        pass


def _on_every_rank(world: int, run: Callable[[int], None]) -> None:
    """``run(rank)`` for every rank at once, one thread each; raises what any of them raised."""
    errors: list[BaseException] = []

    def guarded(r: int) -> None:
        try:
            run(r)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


@settings(max_examples=300, deadline=None)
@given(layouts(), st.sampled_from([64, 256, 1000, 8192]))
def test_spans_never_straddle_a_shard_boundary(case: tuple[Layout, int], step: int) -> None:
    lay, world = case
    cfg = RingConfig(job=1, chunk_bytes=step, cuts=RingConfig.shard_cuts(lay.bucket_routes))
    ring = RingAllReduce(0, 1, _Net(1).link(0), [("mem", 0)], cfg)
    for b, routes in enumerate(lay.bucket_routes):
        n = routes[-1].end
        for k in range(world):  # the ring's chunks of this bucket for this world size
            lo, hi = n * k // world, n * (k + 1) // world
            spans = list(ring._spans(b, lo, hi))
            if lo == hi:  # more ranks than elements: this rank's chunk is empty (seen in CI)
                assert spans == []
                continue
            assert [s[0] for s in spans] == [lo, *[s[1] for s in spans[:-1]]]
            assert not spans or spans[-1][1] == hi
            for a, z in spans:
                assert 0 < z - a <= step
                r = _owner(lay, b, a)
                assert z <= r.end, (a, z, r)
            # the ring's other datagrams (cut=False) are cut by size alone
            uncut = list(ring._spans(b, lo, hi, cut=False))
            assert uncut == [(a, min(hi, a + step)) for a in range(lo, hi, step)]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(layouts())
def test_the_rings_final_datagrams_each_belong_to_one_shard(case: tuple[Layout, int]) -> None:
    lay, world = case
    if world < 2:
        world = 2
    net = _Net(world)
    cuts = RingConfig.shard_cuts(lay.bucket_routes)
    addrs = [("mem", i) for i in range(world)]
    finals: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def tap(header: bytes, payload: bytes) -> None:
        h = peek_header(header)
        assert h.flags & Flag.FINAL
        r = _owner(lay, h.bucket, h.offset)
        assert h.offset + h.length <= r.end, (h, r)  # retransmissions too
        if not h.flags & Flag.RETX:
            with lock:
                finals.append((h.bucket, h.offset, h.length))

    rings = []
    for r in range(world):
        ring = RingAllReduce(
            r,
            world,
            net.link(r),
            addrs,
            RingConfig(job=1, chunk_bytes=700, rto_s=0.05, timeout_s=20, cuts=cuts),
        )
        ring.tap = tap
        rings.append(ring)
    sizes = [routes[-1].end // 4 for routes in lay.bucket_routes]

    def run(r: int) -> None:
        for b, n in enumerate(sizes):
            rings[r].allreduce(0, b, torch.ones(n))
        rings[r]._drain(0.5)

    # a datagram that straddles raises in tap() on the sending rank's thread
    _on_every_rank(world, run)
    covered: dict[int, int] = {}
    for b, off, length in finals:
        r = _owner(lay, b, off)
        assert off + length <= r.end, (b, off, length, r)
        covered[b] = covered.get(b, 0) + length
    # every reduced byte was tagged FINAL exactly once
    assert covered == {b: n * 4 for b, n in enumerate(sizes) if n}
    # the other DATA datagrams are cut by size alone: each is a whole 700-byte chunk or ends
    # where its ring chunk ends, whatever shard boundary it crosses
    ends = {(b, (n * (k + 1) // world) * 4) for b, n in enumerate(sizes) for k in range(world)}
    for data in net.sent:
        h = peek_header(data)
        if h.kind == Kind.DATA and not h.flags & Flag.FINAL:
            assert h.length == 700 or (h.bucket, h.offset + h.length) in ends, h


@pytest.mark.parametrize("whole_ring", [False, True])
def test_the_ring_seals_what_shadows_receive(whole_ring: bool) -> None:
    """With ``authenticate_data`` the FINAL datagrams (the switch's copies go to the shadows)
    carry the MAC; the ring's other DATA does only with ``authenticate_ring``. A FINAL datagram
    without a MAC is refused by the next rank as well, and with ``authenticate_ring`` any DATA
    without one; the sums are exact either way."""
    world, n = 4, 5000  # a power of two: the ring's mean is exact
    net = _Net(world)
    addrs = [("mem", i) for i in range(world)]
    cfg = RingConfig(
        job=1,
        chunk_bytes=1024,
        rto_s=0.05,
        timeout_s=20,
        key=KEY,
        authenticate_data=True,
        authenticate_ring=whole_ring,
    )
    rings = [RingAllReduce(r, world, net.link(r), addrs, cfg) for r in range(world)]
    inputs = [torch.arange(n, dtype=torch.float32) * (r + 1) for r in range(world)]
    outs: list[torch.Tensor | None] = [None] * world

    def run(r: int) -> None:
        t = inputs[r].clone()
        rings[r].allreduce(0, 0, t)
        outs[r] = t
        rings[r]._drain(0.3)

    _on_every_rank(world, run)
    want = sum(inputs) / world
    for out in outs:
        assert out is not None and torch.equal(out, want)
    data = [peek_header(d) for d in net.sent if peek_header(d).kind == Kind.DATA]
    finals = [h for h in data if h.flags & Flag.FINAL]
    others = [h for h in data if not h.flags & Flag.FINAL]
    assert finals and others
    assert all(h.flags & Flag.MAC for h in finals)
    assert all(bool(h.flags & Flag.MAC) == whole_ring for h in others)
    # the receive side: unsealed DATA from the previous rank
    ring = rings[1]
    fields: dict[str, Any] = dict(job=1, sender=0, iteration=9, layout=0, dtype=DType.FLOAT32)
    before = ring.stats["rx_unauthenticated"]
    final = encode(Kind.DATA, seq=ring._rx_cum, flags=Flag.FINAL, payload=bytes(64), **fields)
    ring._on_datagram(memoryview(final), addrs[0])
    assert ring.stats["rx_unauthenticated"] == before + 1
    other = encode(Kind.DATA, seq=ring._rx_cum, payload=bytes(64), **fields)
    taken = ring.stats["rx_data"]
    ring._on_datagram(memoryview(other), addrs[0])
    assert ring.stats["rx_unauthenticated"] == before + 1 + whole_ring
    assert ring.stats["rx_data"] == taken + (not whole_ring)
