"""Digest lists batched and de-duplicated as PI's DigestMgr does (``_digests.DigestBuffer``),
on an explicit clock; the gRPC wiring is tested in test_p4rt_server."""

from __future__ import annotations

import pytest

pytest.importorskip("p4")

from p4.v1 import p4runtime_pb2

from shadowgrad.p4target._digests import MIN_TIMEOUT_NS, DigestBuffer

MS = 1_000_000
A, B, C = (b"\x0a", b"\x01"), (b"\x0b", b"\x01"), (b"\x0c", b"\x02")


def buf(max_list_size: int = 0, max_timeout_ns: int = 0, ack_timeout_ns: int = 0) -> DigestBuffer:
    return DigestBuffer(
        7,
        p4runtime_pb2.DigestEntry.Config(
            max_list_size=max_list_size,
            max_timeout_ns=max_timeout_ns,
            ack_timeout_ns=ack_timeout_ns,
        ),
    )


def samples(dl: p4runtime_pb2.DigestList | None) -> list[tuple[bytes, ...]]:
    assert dl is not None
    assert dl.digest_id == 7
    return [tuple(m.bitstring for m in d.struct.members) for d in dl.data]


def test_default_config_sends_each_sample_at_once_without_suppression() -> None:
    b = buf()
    lists = [b.learn(s, now_ns=0) for s in (A, A, B)]
    assert [samples(dl) for dl in lists] == [[A], [A], [B]]
    assert [dl.list_id for dl in lists if dl is not None] == [1, 2, 3]
    assert b.suppressed == 0 and not b.sent  # nothing kept without an ack timeout


def test_list_size_duplicates_ack_and_timeout() -> None:
    b = buf(max_list_size=3, max_timeout_ns=10_000 * MS, ack_timeout_ns=60_000 * MS)
    assert b.learn(A, now_ns=0) is None
    assert b.learn(B, now_ns=1) is None
    assert b.learn(A, now_ns=2) is None  # duplicate of a sample not acked yet
    assert b.suppressed == 1
    dl = b.learn(C, now_ns=3)  # the third distinct sample fills the list
    assert samples(dl) == [A, B, C] and dl is not None and dl.list_id == 1
    assert b.learn(A, now_ns=4) is None and b.suppressed == 2  # still cached: list 1 unacked
    assert b.ack(1) and not b.ack(1) and not b.ack(99)
    assert b.learn(A, now_ns=5) is None and b.pending() == 1  # sendable again, buffered
    assert b.sweep(now_ns=5 + 9_999 * MS) is None
    dl = b.sweep(now_ns=5 + 10_000 * MS)  # max_timeout after the list's first sample
    assert samples(dl) == [A] and dl is not None and dl.list_id == 2
    assert b.sweep(now_ns=5 + 30_000 * MS) is None  # nothing buffered


def test_unacked_list_expires_after_ack_timeout() -> None:
    b = buf(ack_timeout_ns=200 * MS)
    assert samples(b.learn(A, now_ns=0)) == [A]
    assert b.learn(A, now_ns=MS) is None
    assert b.sweep(now_ns=199 * MS) is None and b.learn(A, now_ns=199 * MS) is None
    b.sweep(now_ns=200 * MS)  # list 1 expires: its samples may be sent again
    dl = b.learn(A, now_ns=201 * MS)
    assert samples(dl) == [A] and dl is not None and dl.list_id == 2
    assert b.suppressed == 2


def test_timeouts_have_pi_floor_of_100_ms() -> None:
    b = buf(max_timeout_ns=1 * MS, ack_timeout_ns=1 * MS, max_list_size=100)
    assert b.learn(A, now_ns=0) is None
    assert b.sweep(now_ns=MIN_TIMEOUT_NS - 1) is None
    assert samples(b.sweep(now_ns=MIN_TIMEOUT_NS)) == [A]
    assert b.learn(A, now_ns=MIN_TIMEOUT_NS + 1) is None  # cached until 100 ms after sending
    b.sweep(now_ns=2 * MIN_TIMEOUT_NS)
    assert b.learn(A, now_ns=2 * MIN_TIMEOUT_NS) is None and b.pending() == 1


def test_list_size_counts_only_deduplicated_samples_as_pi_does() -> None:
    # PI compares max_list_size with the samples kept for suppression: with ack_timeout_ns 0
    # none are kept, so only the timeout sends the list
    b = buf(max_list_size=2, max_timeout_ns=500 * MS)
    assert b.learn(A, now_ns=0) is None and b.learn(B, now_ns=1) is None
    assert b.learn(C, now_ns=2) is None and b.pending() == 3
    assert samples(b.sweep(now_ns=500 * MS)) == [A, B, C]


def test_reconfigure_keeps_what_is_buffered() -> None:
    b = buf(max_list_size=10, max_timeout_ns=60_000 * MS, ack_timeout_ns=60_000 * MS)
    assert b.learn(A, now_ns=0) is None
    b.configure(
        p4runtime_pb2.DigestEntry.Config(max_timeout_ns=100 * MS, ack_timeout_ns=60_000 * MS)
    )
    assert samples(b.sweep(now_ns=100 * MS)) == [A]
    assert b.learn(A, now_ns=101 * MS) is None  # the cache survived the MODIFY
    b.disable()  # DELETE: nothing buffered or cached, nothing swept; list ids go on
    assert b.sweep(now_ns=10**12) is None and not b.cache and b.pending() == 0
    b.configure(p4runtime_pb2.DigestEntry.Config(ack_timeout_ns=60_000 * MS))
    dl = b.learn(A, now_ns=10**12)
    assert samples(dl) == [A] and dl is not None and dl.list_id == 2
