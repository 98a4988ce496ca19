"""Digest lists the way PI's ``DigestMgr`` (behind ``simple_switch_grpc``) builds them.

One :class:`DigestBuffer` per configured digest. Per ``DigestEntry.Config``:

* ``max_timeout_ns == 0``: every learned sample goes out at once in a list of its own;
  otherwise samples accumulate and the list goes out ``max_timeout_ns`` after its first sample
  (PI's sweep takes between one and two periods; the period is at least 100 ms, as in PI), or
  as soon as it holds ``max_list_size`` samples — counted, as PI counts them, among the samples
  kept for duplicate suppression, so the size bound applies only with ``ack_timeout_ns > 0``.
* ``ack_timeout_ns > 0``: a sample that was sent is not sent again until the client acks its
  list (``DigestListAck``) or ``ack_timeout_ns`` passes (at least 100 ms); with 0 nothing is
  suppressed.

List ids count from 1 per digest. The owner (the P4Runtime server) serialises calls with its
lock and sends what :meth:`learn` and :meth:`sweep` return.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from p4.v1 import p4runtime_pb2

__all__ = ["MIN_TIMEOUT_NS", "DigestBuffer"]

#: PI's floor for both periodic sweeps (``min_max_timeout_ns``, ``min_ack_timeout_ns``)
MIN_TIMEOUT_NS = 100_000_000

Sample = tuple[bytes, ...]


@dataclass
class _Sent:
    keys: list[Sample]
    at_ns: int


@dataclass
class DigestBuffer:
    digest_id: int
    #: None until a DigestEntry enables the digest (and again after DELETE)
    config: p4runtime_pb2.DigestEntry.Config | None = None
    next_list_id: int = 1
    cache: set[Sample] = field(default_factory=set)
    sent: dict[int, _Sent] = field(default_factory=dict)
    _data: list[Sample] = field(default_factory=list)
    _keys: list[Sample] = field(default_factory=list)
    _first_ns: int = 0
    suppressed: int = 0

    def configure(self, config: p4runtime_pb2.DigestEntry.Config) -> None:
        """INSERT or MODIFY: the limits apply from now on; what is buffered and cached stays."""
        self.config = config

    def disable(self) -> None:
        """DELETE: drop what is buffered and cached; list ids keep counting (as in PI)."""
        self.config = None
        self.cache.clear()
        self.sent.clear()
        self._data = []
        self._keys = []

    def learn(self, sample: Sample, now_ns: int | None = None) -> p4runtime_pb2.DigestList | None:
        """Take one sample of an enabled digest; returns a list to send now, if one is due."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        cfg = self.config
        assert cfg is not None, "learn() on a digest that is not enabled"
        if cfg.ack_timeout_ns > 0:
            if sample in self.cache:
                self.suppressed += 1
                return None
            self.cache.add(sample)
            self._keys.append(sample)
        if not self._data:
            self._first_ns = now
        self._data.append(sample)
        if (cfg.max_list_size and len(self._keys) >= cfg.max_list_size) or cfg.max_timeout_ns == 0:
            return self._send(now)
        return None

    def sweep(self, now_ns: int | None = None) -> p4runtime_pb2.DigestList | None:
        """Periodic work: the buffered list once it is ``max_timeout_ns`` old; cache entries
        of lists unacked for ``ack_timeout_ns``."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        cfg = self.config
        if cfg is None:
            return None
        if cfg.ack_timeout_ns > 0:
            limit = max(cfg.ack_timeout_ns, MIN_TIMEOUT_NS)
            for list_id in [i for i, s in self.sent.items() if now - s.at_ns >= limit]:
                self._purge(list_id)
        if (
            self._data
            and cfg.max_timeout_ns > 0
            and now - self._first_ns >= max(cfg.max_timeout_ns, MIN_TIMEOUT_NS)
        ):
            return self._send(now)
        return None

    def ack(self, list_id: int) -> bool:
        """The client acked a list: its samples may be sent again. False if unknown."""
        if list_id not in self.sent:
            return False
        self._purge(list_id)
        return True

    def pending(self) -> int:
        return len(self._data)

    def _purge(self, list_id: int) -> None:
        for k in self.sent.pop(list_id).keys:
            self.cache.discard(k)

    def _send(self, now: int) -> p4runtime_pb2.DigestList:
        from .p4runtime_server import encode_int  # the server imports this module

        dl = p4runtime_pb2.DigestList(
            digest_id=self.digest_id, list_id=self.next_list_id, timestamp=time.time_ns()
        )
        for sample in self._data:
            d = dl.data.add()
            for v in sample:
                d.struct.members.add(bitstring=encode_int(int.from_bytes(v, "big")))
        if self._keys:
            self.sent[self.next_list_id] = _Sent(self._keys, now)
        self.next_list_id += 1
        self._data = []
        self._keys = []
        return dl
