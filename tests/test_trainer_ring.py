"""In-band ring all-reduce over UDP on loopback (torch.multiprocessing, gloo only for rendezvous):
identical on every rank, within fp32 tolerance of a float64 reference, identical under injected
drop/duplication/reordering, each reduced byte tagged FINAL exactly once; and the DDP comm hook."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from shadowgrad.wire import Flag, peek_header

SIZES = [1, 3, 5, 1000, 40_003, 150_000]  # elements per bucket, not multiples of the world
ITERS = 2


def _inputs(rank: int, it: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * it + 10 * rank + 7)
    return [torch.randn(n, generator=g) * (1 + 100 * (i % 2)) for i, n in enumerate(SIZES)]


def _worker(rank: int, world: int, port: int, faults: dict[str, float], out: str) -> None:
    try:
        import torch.distributed as dist

        from shadowgrad.trainer_hooks.link import FaultyLink, UdpLink
        from shadowgrad.trainer_hooks.ring import RingAllReduce, RingConfig

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        udp = UdpLink(("127.0.0.1", 0))
        addrs: list[Any] = [None] * world
        dist.all_gather_object(addrs, udp.address)
        link: Any = udp
        if faults:
            link = FaultyLink(udp, seed=rank + 1, **faults)
        cfg = RingConfig(job=9, chunk_bytes=8192, window=32, rto_s=0.01, timeout_s=60)
        ring = RingAllReduce(rank, world, link, addrs, cfg)
        finals: Counter[tuple[int, int]] = Counter()

        def tap(header: bytes, payload: bytes) -> None:
            h = peek_header(header)
            if not h.flags & Flag.RETX:
                finals[(h.iteration, h.bucket)] += h.length

        ring.tap = tap
        results = []
        for it in range(ITERS):
            bufs = _inputs(rank, it)
            for b, t in enumerate(bufs):
                ring.allreduce(it, b, t)
            results.append(bufs)
        # the DDP comm hook path: a small model, 3 SGD steps
        ring.start()
        ddp_params = _ddp_run(rank, world, ring)
        dist.barrier()
        ring.close()
        torch.save(
            {
                "results": results,
                "finals": dict(finals),
                "stats": dict(ring.stats),
                "faults": getattr(link, "counts", {}),
                "ddp": ddp_params,
            },
            out,
        )
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        raise


def _ddp_run(rank: int, world: int, ring: Any) -> dict[str, torch.Tensor]:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from shadowgrad.layout import Layout, from_module
    from shadowgrad.trainer_hooks.hooks import LayoutReducer, layout_hook

    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(20, 300), nn.ReLU(), nn.Linear(300, 300), nn.ReLU(), nn.Linear(300, 5)
    )
    model = DistributedDataParallel(net, bucket_cap_mb=0.2)
    params, buckets = from_module(net, 0.2)
    layout = Layout.build(params, buckets, 2)
    reducer = LayoutReducer(
        layout,
        dict(net.named_parameters()),
        reduce=lambda b, flat: ring.submit(100 + reducer.iteration, b, flat),
    )
    model.register_comm_hook(reducer, layout_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        g = torch.Generator().manual_seed(step * 10 + rank)
        x, y = torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    assert reducer.iteration == 3
    return {n: p.detach().clone() for n, p in net.named_parameters()}


def _stop_resource_tracker() -> None:
    """multiprocessing's spawn context leaves a resource-tracker process behind: stop it."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop is not None:
        stop()


def _run(world: int, faults: dict[str, float], tmp: Path, tag: str) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outs = [str(tmp / f"{tag}-{r}.pt") for r in range(world)]
    procs = [
        ctx.Process(target=_worker, args=(r, world, port, faults, outs[r])) for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(240)
        codes = [p.exitcode for p in procs]
        assert codes == [0] * world, codes
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        _stop_resource_tracker()
    return [torch.load(o, weights_only=True) for o in outs]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ring_allreduce_exact_and_deterministic_under_faults(world: int, tmp_path: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    clean = _run(world, {}, tmp_path, "clean")
    faulty = _run(world, {"drop": 0.01, "dup": 0.01, "reorder": 0.01}, tmp_path, "faulty")
    for it in range(ITERS):
        inputs = [_inputs(r, it) for r in range(world)]
        for b, n in enumerate(SIZES):
            ref = sum(inputs[r][b].double() for r in range(world)) / world
            got = clean[0]["results"][it][b]
            # every rank holds the same bits, in the clean and in the faulty run
            for res in (*clean, *faulty):
                assert torch.equal(res["results"][it][b], got), (it, b)
            # fp32 tolerance of the float64 reference
            tol = (
                8
                * torch.finfo(torch.float32).eps
                * sum(inputs[r][b].double().abs() for r in range(world))
                / world
                + 1e-30
            )
            assert bool(((got.double() - ref).abs() <= tol).all()), (it, b)
            # every reduced byte is sent FINAL exactly once (over all ranks), RETX aside
            tagged = sum(res["finals"].get((it, b), 0) for res in clean)
            assert tagged == 4 * n, (it, b, tagged)
    # faults were really injected and repaired
    counts: Counter[str] = Counter()
    for res in faulty:
        counts.update(res["faults"])
        counts.update(
            {
                k: v
                for k, v in res["stats"].items()
                if k in ("retx", "rx_duplicate", "rx_out_of_order")
            }
        )
    assert counts["dropped"] > 0 and counts["duplicated"] > 0 and counts["reordered"] > 0, counts
    assert counts["retx"] > 0 and counts["rx_duplicate"] > 0 and counts["rx_out_of_order"] > 0
    # the DDP hook: all ranks end with the same parameters, faults or not
    for res in (*clean[1:], *faulty):
        for name, t in clean[0]["ddp"].items():
            assert torch.equal(res["ddp"][name], t), name


def _nack_pair(retain: int, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], Any, Any]:
    """Two ranks (threads) reduce ``inputs`` (bucket 0 of iteration 0) with ``retain``, then a
    shadow NACKs rank 0's FINAL bytes: (results, rank 0's ring stats, the shadow's replies)."""
    import socket
    import time

    from shadowgrad.trainer_hooks.link import UdpLink
    from shadowgrad.trainer_hooks.ring import RingAllReduce, RingConfig
    from shadowgrad.wire import MAX_DATAGRAM, Kind, NackRecord, encode

    shadow = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    shadow.bind(("127.0.0.1", 0))
    shadow.settimeout(0.3)
    links = [UdpLink(("127.0.0.1", 0)) for _ in range(2)]
    addrs = [link.address for link in links]
    cfg = RingConfig(
        job=9,
        chunk_bytes=4096,
        rto_s=0.01,
        timeout_s=20,
        retain=retain,
        shadows=(shadow.getsockname(),),
    )
    rings = [RingAllReduce(r, 2, links[r], addrs, cfg).start() for r in range(2)]
    try:
        bufs = [t.clone() for t in inputs]
        futs = [ring.submit(0, 0, t) for ring, t in zip(rings, bufs, strict=True)]
        for f in futs:
            f.wait()
        nbytes = inputs[0].numel() * inputs[0].element_size()
        nack = encode(
            Kind.NACK,
            job=9,
            sender=0,
            iteration=0,
            seq=1,
            layout=0,
            payload=NackRecord.of([(0, 0, nbytes)]).body(),
        )
        shadow.sendto(nack, addrs[0])
        deadline = time.monotonic() + 10
        while not rings[0].stats["nack"] and time.monotonic() < deadline:
            time.sleep(0.01)
        replies = []
        with contextlib.suppress(TimeoutError):
            while True:
                replies.append(shadow.recv(MAX_DATAGRAM))
        return bufs, dict(rings[0].stats), replies
    finally:
        for ring in rings:
            ring.close(1.0)
        shadow.close()


def test_ring_without_retention_reduces_the_same_bits_and_answers_no_nack() -> None:
    g = torch.Generator().manual_seed(5)
    inputs = [torch.randn(10_001, generator=g) * (1 + 99 * r) for r in range(2)]
    kept, kept_stats, kept_replies = _nack_pair(4, inputs)
    bare, bare_stats, bare_replies = _nack_pair(0, inputs)
    for k, b in zip(kept, bare, strict=True):
        assert torch.equal(k, b)  # bit-exact, retained or not
    assert torch.equal(bare[0], bare[1])
    assert kept_stats["nack_retx"] > 0 and kept_replies  # the retaining ring answers
    assert bare_stats["nack"] == 1 and bare_stats["nack_unavailable"] == 1
    assert "nack_retx" not in bare_stats and not bare_replies  # nothing kept to resend
    assert bare_stats["data_sent"] == kept_stats["data_sent"]  # the same datagrams otherwise


def test_pooled_buffers_keep_the_retained_bytes_and_stop_allocating() -> None:
    """The ring reuses its datagram buffers (sent payloads once acknowledged, received ones
    once added, a dropped iteration's retained FINAL bytes): over loss, duplicates and
    reordering every iteration is still exact, the FINAL bytes a shadow NACKs after later
    iterations reused the pool are still that iteration's, and once ``retain`` iterations are
    held no new buffer is allocated."""
    import socket
    import time

    from shadowgrad.trainer_hooks.link import FaultyLink, UdpLink
    from shadowgrad.trainer_hooks.ring import RingAllReduce, RingConfig
    from shadowgrad.wire import MAX_DATAGRAM, Kind, NackRecord, decode, encode

    key = bytes(range(32))
    shadow = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    shadow.bind(("127.0.0.1", 0))
    shadow.settimeout(0.3)
    links = [UdpLink(("127.0.0.1", 0)) for _ in range(2)]
    addrs = [link.address for link in links]
    faulty = [
        FaultyLink(lk, drop=0.03, dup=0.03, reorder=0.03, seed=r) for r, lk in enumerate(links)
    ]
    retain = 3
    cfg = RingConfig(
        job=9,
        chunk_bytes=4096,
        rto_s=0.01,
        timeout_s=20,
        retain=retain,
        key=key,
        authenticate_data=True,
        shadows=(shadow.getsockname(),),
    )
    rings = [RingAllReduce(r, 2, faulty[r], addrs, cfg).start() for r in range(2)]
    g = torch.Generator().manual_seed(11)
    iters, n = 12, 20_001
    expected: list[torch.Tensor] = []
    allocated: list[int] = []
    try:
        for it in range(iters):
            xs = [torch.randn(n, generator=g) for _ in range(2)]
            want = xs[0] / 2 + xs[1] / 2  # world 2: one addition, the same in either order
            futs = [ring.submit(it, 0, x) for ring, x in zip(rings, xs, strict=True)]
            for f in futs:
                f.wait()
            for x in xs:
                assert torch.equal(x, want), it
            expected.append(want)
            allocated.append(sum(r.stats["buffers_allocated"] for r in rings))
        # rank 0's FINAL bytes (chunk 1 of bucket 0) of the oldest iteration still retained
        oldest = iters - retain
        lo = (n // 2) * 4
        nack = encode(
            Kind.NACK,
            job=9,
            sender=0,
            iteration=oldest,
            seq=1,
            layout=0,
            payload=NackRecord.of([(0, lo, n * 4 - lo)]).body(),
            key=key,
        )
        got = bytearray(n * 4 - lo)
        seen: dict[int, int] = {}  # offset -> length (the faulty link drops and duplicates)
        deadline = time.monotonic() + 20
        while sum(seen.values()) < len(got) and time.monotonic() < deadline:
            shadow.sendto(nack, addrs[0])  # again until every reply came
            with contextlib.suppress(TimeoutError):
                while True:
                    msg = decode(shadow.recv(MAX_DATAGRAM), job=9, key=key)
                    h = msg.header
                    assert h.iteration == oldest and h.flags & Flag.FINAL
                    got[h.offset - lo : h.offset - lo + h.length] = msg.payload
                    seen[h.offset] = h.length
        assert sum(seen.values()) == len(got)
        assert bytes(got) == expected[oldest].view(torch.uint8).numpy().tobytes()[lo:]
    finally:
        for ring in rings:
            ring.close(1.0)
        shadow.close()
    assert sum(f.counts["dropped"] for f in faulty) > 0  # the faults happened
    # once the retention filled, the pool serves nearly every datagram: without it the last
    # iterations would allocate a buffer per datagram sent and one per datagram received; a
    # few more are wanted where losses keep more in flight (out of order) than before
    sent = sum(r.stats["data_sent"] for r in rings) * (iters - retain - 2) // iters
    grown = allocated[-1] - allocated[retain + 2]
    assert allocated[retain + 2] > 0 and sent > 100 and grown <= sent // 10, (sent, allocated)


class _QueueLink:
    """A link fed by hand: ``recv_into`` takes the queued datagrams in order, ``send`` keeps
    what was sent."""

    def __init__(self) -> None:
        self.queue: list[tuple[bytes, tuple[str, int]]] = []
        self.sent: list[tuple[bytes, tuple[str, int]]] = []

    def send(self, parts: Any, addr: tuple[str, int]) -> bool:
        self.sent.append((b"".join(bytes(p) for p in parts), addr))
        return True

    def recv_into(self, buf: bytearray, timeout_s: float) -> tuple[int, tuple[str, int]] | None:
        if not self.queue:
            return None
        data, addr = self.queue.pop(0)
        buf[: len(data)] = data
        return len(data), addr

    def close(self) -> None:
        pass


def test_acks_are_delayed_in_order_and_sent_at_once_after_a_gap_or_a_duplicate() -> None:
    """The receiver acknowledges DATA in order every ``window // 4`` datagrams or
    ``ACK_DELAY_S`` after the first unacknowledged one, and at once (with the SACK bits) after a
    datagram out of order, one that fills a gap, or a duplicate."""
    import time

    from shadowgrad.trainer_hooks.ring import RingAllReduce, RingConfig
    from shadowgrad.wire import AckRecord, DType, Kind, decode, encode_header

    link = _QueueLink()
    addrs = [("127.0.0.1", 7001), ("127.0.0.1", 7002)]
    cfg = RingConfig(job=9, chunk_bytes=64, window=64, rto_s=0.04)
    ring = RingAllReduce(1, 2, link, addrs, cfg)  # receives from rank 0

    def data(seq: int) -> tuple[bytes, tuple[str, int]]:
        payload = bytes(64)
        fields: Any = dict(job=9, sender=0, iteration=0, seq=seq, layout=0, dtype=DType.FLOAT32)
        h = encode_header(Kind.DATA, payload=payload, bucket=0, offset=64 * seq, **fields)
        return h + payload, addrs[0]

    def acks() -> list[tuple[int, int]]:
        out = [decode(d, job=9) for d, _ in link.sent]
        link.sent.clear()
        return [(m.header.seq, AckRecord.from_message(m).sack) for m in out]

    link.queue = [data(s) for s in range(20)]
    ring._pump(0.0)
    assert acks() == [(16, 0)]  # after 16 in order; the other 4 wait
    ring._pump(0.0)
    assert acks() == []
    time.sleep(ring.ACK_DELAY_S * 2)
    ring._pump(0.0)
    assert acks() == [(20, 0)]  # the delay passed
    link.queue = [data(22)]  # 20 and 21 lost: at once, 22 in the SACK bitmap (bit 1)
    ring._pump(0.0)
    assert acks() == [(20, 0b10)]
    link.queue = [data(5)]  # a duplicate (our ACK was lost): at once
    ring._pump(0.0)
    assert acks() == [(20, 0b10)]
    link.queue = [data(20), data(21)]  # they fill the gap: answered at once, after the burst
    ring._pump(0.0)
    assert acks() == [(23, 0)]
    link.queue = [data(23)]  # in order again: delayed
    ring._pump(0.0)
    assert acks() == []
    time.sleep(ring.ACK_DELAY_S * 2)
    ring._pump(0.0)
    assert acks() == [(24, 0)]
    ring.close(0.1)
