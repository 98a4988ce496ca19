"""The trainers' side of the wire, played by a test: :class:`Producer` (rank 0 as the shadows see
it: DATA chunks per the layout, COMMIT records, NACKs answered with RETX, with injected
:class:`Faults`) and :class:`Records` (single records of a job, for fuzzing a receiver)."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shadowgrad import wire
from shadowgrad.errors import WireError
from shadowgrad.layout import Layout

from .specs import JOB_ID, KEY

__all__ = ["Faults", "Producer", "ProducerStats", "Records"]


@dataclass(frozen=True)
class Records:
    """Encodes records of job ``job`` and layout (session digest) ``layout``, sealed with
    ``key``: rank 0's with sequence number ``seq`` unless a record says otherwise."""

    job: int
    layout: int
    key: bytes | None
    seq: int = 0

    def encode(self, kind: wire.Kind, payload: bytes = b"", it: int = 0, **kw: Any) -> bytes:
        """A ``kind`` record of iteration ``it``; ``kw`` overrides header fields or adds
        others (flags, dtype, bucket, offset)."""
        fields: dict[str, Any] = {
            "job": self.job,
            "sender": 0,
            "seq": self.seq,
            "layout": self.layout,
            "key": self.key,
        }
        return wire.encode(kind, iteration=it, payload=payload, **(fields | kw))


@dataclass
class Faults:
    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    seed: int = 0
    #: (iteration, bucket, offset, shadow id) -> never deliver this chunk to that shadow
    withhold: Callable[[int, int, int, int], bool] | None = None
    #: apply drop/dup/reorder to COMMIT records too
    commits: bool = True
    #: (iteration, shadow id, is a retransmission) -> drop this COMMIT
    drop_commit: Callable[[int, int, bool], bool] | None = None


@dataclass
class ProducerStats:
    sent: Counter[str] = field(default_factory=Counter)


class Producer:
    """Trainer rank 0 as the shadows see it: DATA chunks (FINAL) routed per the layout's bucket
    routes to the replicas of the owning shards, COMMIT records to every shadow, and NACKs
    answered with RETX chunks (or the COMMIT for a zero-range NACK). Faults are injected per
    (datagram, destination)."""

    def __init__(
        self,
        layout: Layout,
        *,
        chunk_bytes: int = 1408,
        faults: Faults | None = None,
        keep: int = 16,
    ) -> None:
        self.layout = layout
        self.chunk = chunk_bytes
        self.faults = faults or Faults()
        self.rng = random.Random(self.faults.seed)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 2**20)
        self.sock.settimeout(0.01)
        self.address = self.sock.getsockname()
        self.dests: list[tuple[str, int]] = []
        self.store: dict[int, tuple[list[bytes], wire.CommitRecord]] = {}
        self.keep = keep
        self.stats = ProducerStats()
        self._held: dict[int, bytes | None] = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # chunk -> destination shadows, per bucket
        self._routes: list[list[tuple[int, int, tuple[int, ...]]]] = []
        for b, nbytes in enumerate(layout.bucket_nbytes):
            chunks = []
            for off in range(0, nbytes, chunk_bytes):
                n = min(chunk_bytes, nbytes - off)
                chunks.append((off, n, self._dests_of(b, off, n)))
            self._routes.append(chunks)

    def _dests_of(self, bucket: int, off: int, n: int) -> tuple[int, ...]:
        shards = {
            r.shard for r in self.layout.bucket_routes[bucket] if r.start < off + n and off < r.end
        }
        return tuple(sorted(s for sh in shards for s in self.layout.shadows_of_shard(sh)))

    def start(self, dests: Sequence[tuple[str, int]]) -> None:
        self.dests = list(dests)
        self._thread = threading.Thread(target=self._nack_loop, name="producer-nack", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            assert not self._thread.is_alive()
        self.sock.close()

    # -- sending ---------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _header_fields(self, it: int) -> dict[str, Any]:
        """Rank 0's header fields for its next record of iteration ``it``, sealed with the
        job's key (takes the next sequence number)."""
        return {
            "job": JOB_ID,
            "sender": 0,
            "iteration": it,
            "seq": self._next_seq(),
            "layout": self.layout.digest64,
            "key": KEY,
        }

    def _emit(self, sid: int, parts: Sequence[bytes | memoryview], *, faulty: bool = True) -> None:
        """Send one datagram to shadow ``sid`` through the fault injector (lock held)."""
        f = self.faults
        dest = self.dests[sid]
        if faulty and f.drop and self.rng.random() < f.drop:
            self.stats.sent["dropped"] += 1
            return
        data = b"".join(parts)
        copies = 2 if faulty and f.dup and self.rng.random() < f.dup else 1
        if copies == 2:
            self.stats.sent["duplicated"] += 1
        for _ in range(copies):
            if (
                faulty
                and f.reorder
                and self.rng.random() < f.reorder
                and self._held.get(sid) is None
            ):
                self._held[sid] = data  # sent after the next datagram to this shadow
                self.stats.sent["reordered"] += 1
                continue
            self._send(data, dest)
            held = self._held.get(sid)
            if held is not None:
                self._held[sid] = None
                self._send(held, dest)

    def _send(self, data: bytes, dest: tuple[str, int]) -> None:
        for _ in range(200):
            try:
                self.sock.sendto(data, dest)
                self.stats.sent["datagrams"] += 1
                return
            except BlockingIOError:  # pragma: no cover - loopback send buffer full
                time.sleep(0.001)

    def flush(self) -> None:
        with self._lock:
            for sid, held in list(self._held.items()):
                if held is not None:
                    self._held[sid] = None
                    self._send(held, self.dests[sid])

    def _data(
        self, it: int, bucket: int, off: int, payload: memoryview, retx: bool
    ) -> tuple[bytes, bytes]:
        """(header, MAC tag) of a DATA chunk, sealed with the job's key as a trainer does."""
        dtype = self._dtype(bucket)
        flags = wire.Flag.FINAL | (wire.Flag.RETX if retx else 0)
        return wire.seal(
            wire.Kind.DATA,
            payload=payload,
            flags=flags,
            dtype=dtype,
            bucket=bucket,
            offset=off,
            **self._header_fields(it),
        )

    def _dtype(self, bucket: int) -> wire.DType:
        name = self.layout.buckets[bucket][0]
        return wire.DType.from_name(self.layout.placement(name).spec.dtype)

    def send_iteration(
        self,
        it: int,
        buckets: list[bytes],
        commit: wire.CommitRecord,
        *,
        commit_first: bool = False,
    ) -> None:
        with self._lock:
            self.store[it] = (buckets, commit)
            for old in [k for k in self.store if k <= it - self.keep]:
                del self.store[old]
            if commit_first:
                self._send_commit(it, commit, retx=False)
            for b, chunks in enumerate(self._routes):
                mv = memoryview(buckets[b])
                for off, n, dests in chunks:
                    payload = mv[off : off + n]
                    header, tag = self._data(it, b, off, payload, retx=False)
                    for sid in dests:
                        w = self.faults.withhold
                        if w is not None and w(it, b, off, sid):
                            self.stats.sent["withheld"] += 1
                            continue
                        self._emit(sid, (header, payload, tag))
            if not commit_first:
                self._send_commit(it, commit, retx=False)
        self.flush()

    def _send_commit(
        self, it: int, commit: wire.CommitRecord, *, retx: bool, only: int | None = None
    ) -> None:
        data = commit.encode(retx=retx, **self._header_fields(it))
        for sid in range(len(self.dests)) if only is None else (only,):
            dc = self.faults.drop_commit
            if dc is not None and dc(it, sid, retx):
                self.stats.sent["commit_dropped"] += 1
                continue
            if retx:
                self.stats.sent["commit_retx"] += 1
            self._emit(sid, (data,), faulty=self.faults.commits)

    # -- NACK service ----------------------------------------------------------------------

    def _nack_loop(self) -> None:
        buf = bytearray(wire.MAX_DATAGRAM + 1)
        while not self._stop.is_set():
            try:
                n, _addr = self.sock.recvfrom_into(buf)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                msg = wire.decode(
                    memoryview(buf)[:n], job=JOB_ID, layout=self.layout.digest64, key=KEY
                )
            except WireError:
                self.stats.sent["bad_nack"] += 1
                continue
            if msg.header.kind is not wire.Kind.NACK:
                continue
            sid = msg.header.sender
            rec = wire.NackRecord.from_message(msg)
            self.stats.sent["nacks"] += 1
            with self._lock:
                stored = self.store.get(msg.header.iteration)
                if stored is None or sid >= len(self.dests):
                    self.stats.sent["nack_unknown"] += 1
                    continue
                buckets, commit = stored
                it = msg.header.iteration
                if not rec.ranges:
                    self._send_commit(it, commit, retx=True, only=sid)
                for r in rec.ranges:
                    mv = memoryview(buckets[r.bucket])
                    for off in range(r.offset, r.offset + r.length, self.chunk):
                        n2 = min(self.chunk, r.offset + r.length - off)
                        w = self.faults.withhold
                        if w is not None and w(it, r.bucket, off - off % self.chunk, sid):
                            self.stats.sent["withheld"] += 1
                            continue
                        payload = mv[off : off + n2]
                        header, tag = self._data(it, r.bucket, off, payload, True)
                        self._emit(sid, (header, payload, tag))
                        self.stats.sent["retx"] += 1
            self.flush()
