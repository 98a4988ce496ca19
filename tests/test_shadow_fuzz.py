"""Fuzz a live shadow with >= 100,000 random and mutated datagrams (invariant 3).

Accounting: 100,000 datagrams go through the node's datagram handler directly (the function the
receive thread calls, on the live node), and 20,000 more over UDP to its socket, paced in bursts
that the node must have counted before the next burst leaves; if the kernel still dropped some
(UDP ``RcvbufErrors`` in /proc/net/snmp grew), the shortfall must not exceed that growth. Every
datagram must be counted under exactly one rx reason, no state may change, and the node must
still replay the next iterations bit-exactly afterwards.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections import Counter
from typing import Any

import torch

from shadowgrad import wire
from shadowgrad.layout import Layout
from shadowgrad.shadow.node import ShadowNode
from shadowgrad.testing.cluster import producer_cluster
from shadowgrad.testing.producer import Records
from shadowgrad.testing.specs import JOB_ID, KEY
from shadowgrad.testing.training import Case, RefTrainer

N_DIRECT = 100_000
N_UDP = 20_000


def _rcvbuf_errors() -> int:
    try:
        with open("/proc/net/snmp") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    udp = [ln.split() for ln in lines if ln.startswith("Udp:")]
    head, vals = udp[0], udp[1]
    return int(vals[head.index("RcvbufErrors")]) if "RcvbufErrors" in head else 0


class Fuzzer:
    """Generates (datagram, expected reason or None for "any wire.* reason")."""

    def __init__(self, layout: Layout, last_applied: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.layout = layout
        self.la = last_applied
        self.digest = layout.digest64
        self.records = Records(JOB_ID, self.digest, KEY)
        nb = layout.bucket_nbytes
        self.valid = [  # genuine chunks of the next iteration (never sent unmutated)
            self._data(
                self.la + 1,
                b,
                off,
                bytes(self.rng.randrange(256) for _ in range(min(256, nb[b] - off))),
            )
            for b in range(len(nb))
            for off in range(0, nb[b], 256)
        ][:64]

    def _data(self, it: int, bucket: int, off: int, payload: bytes, **kw: Any) -> bytes:
        """A FINAL float32 DATA chunk, sequence number 1 (``kw``: other job, layout, flags,
        dtype or key)."""
        fields = {"seq": 1, "flags": wire.Flag.FINAL, "dtype": wire.DType.FLOAT32}
        return self.records.encode(
            wire.Kind.DATA, payload, it, bucket=bucket, offset=off, **(fields | kw)
        )

    def _resign(self, data: bytearray) -> bytes:
        """Recompute the CRC after editing header fields (a well-formed lie)."""
        data[52:56] = wire.checksum(data).to_bytes(4, "big")
        return bytes(data)

    def one(self) -> tuple[bytes, str | None]:
        r = self.rng
        kind = r.randrange(19)
        base = bytearray(r.choice(self.valid))
        if kind == 0:  # random bytes, sometimes with our magic
            data = bytearray(r.randbytes(r.randrange(0, 1500)))
            if len(data) >= 2 and r.random() < 0.5:
                data[0:2] = b"SG"
            return bytes(data), None
        if kind == 1:  # one corrupted byte anywhere (CRC-32 catches every single-byte error)
            pos = r.randrange(len(base))
            base[pos] ^= r.randrange(1, 256)
            return bytes(base), None
        if kind == 2:  # truncation
            return bytes(base[: r.randrange(len(base))]), None
        if kind == 3:  # trailing garbage
            return bytes(base) + r.randbytes(r.randrange(1, 64)), "wire.oversize"
        if kind == 4:  # huge length field
            base[48:52] = struct.pack("!I", r.choice([65452, 2**31, 2**32 - 1]))
            return bytes(base), "wire.oversize"
        if kind == 5:  # foreign job, valid checksum
            return self._data(
                self.la + 1, 0, 0, b"\0" * 8, job=JOB_ID + 1 + r.randrange(99)
            ), "wire.foreign_job"
        if kind == 6:  # other layout
            return self._data(self.la + 1, 0, 0, b"\0" * 8, layout=self.digest ^ 1), "wire.layout"
        if kind == 7:  # stale iteration
            return self._data(r.randrange(0, self.la + 1), 0, 0, b"\0" * 8), "stale"
        if kind == 8:  # out-of-layout bucket / offset
            nb = self.layout.bucket_nbytes
            if r.random() < 0.5:
                return self._data(
                    self.la + 1, len(nb) + r.randrange(1000), 0, b"\0" * 8
                ), "out_of_layout"
            b = r.randrange(len(nb))
            return self._data(
                self.la + 1, b, nb[b] - 4 + 4 * r.randrange(1, 10**6), b"\0" * 8
            ), "out_of_layout"
        if kind == 9:  # not FINAL
            return self._data(self.la + 1, 0, 0, b"\0" * 8, flags=wire.Flag.RETX), "not_final"
        if kind == 10:  # wrong dtype
            return self._data(
                self.la + 1, 0, 0, b"\0" * 8, dtype=wire.DType.FLOAT64
            ), "dtype_mismatch"
        if kind == 11:  # beyond the window
            return self._data(self.la + 5 + r.randrange(10**9), 0, 0, b"\0" * 8), "ahead_of_window"
        if kind == 12:  # COMMIT from a rank other than 0, stale, or far ahead
            c = wire.CommitRecord((1e-3,))
            which = r.randrange(3)
            it = [self.la + 1, r.randrange(self.la + 1), self.la + 10**6][which]
            return c.encode(
                job=JOB_ID,
                sender=1 if which == 0 else 0,
                iteration=it,
                seq=1,
                layout=self.digest,
                key=KEY,
            ), ["commit_not_rank0", "commit_stale", "commit_ahead"][which]
        if kind == 13:  # READY from no valid peer
            body = wire.ReadyRecord(0, 0, wire.ReadyState.READY, 0).body()
            sender = r.choice([0, 1, 999])
            return self.records.encode(
                wire.Kind.READY, body, self.la + 1, sender=sender, seq=2**62
            ), "ready_bad_sender"
        if kind == 14:  # ACK / NACK are not for shadows
            if r.random() < 0.5:
                return self.records.encode(
                    wire.Kind.ACK, wire.AckRecord(1).body()
                ), "unexpected_kind"
            return self.records.encode(
                wire.Kind.NACK, wire.NackRecord(()).body()
            ), "unexpected_kind"
        if kind == 16:  # a stranger's COMMIT / DATA: no MAC, or a MAC under another key
            c = wire.CommitRecord((0.1,))
            key = None if r.random() < 0.5 else wire.mac_key(r.randbytes(16), JOB_ID)
            data = (
                c.encode(
                    job=JOB_ID,
                    sender=0,
                    iteration=self.la + 1 + r.randrange(20),
                    seq=1,
                    layout=self.digest,
                    key=key,
                )
                if r.random() < 0.5
                else self._data(self.la + 1, 0, 0, b"\0" * 8, key=key)
            )
            return data, "wire.unauthenticated" if key is None else "wire.bad_mac"
        if kind == 15:  # bad version / kind / flags / dtype with a valid checksum
            field, value, want = r.choice(
                [
                    (2, r.randrange(2, 256), "wire.version"),
                    (3, r.choice([0, 6, 99, 255]), "wire.kind"),
                    (4, 0x08, "wire.field"),
                    (5, r.choice([0, 6, 200]), "wire.field"),
                ]
            )
            base[field] = value
            return self._resign(base), want
        # malformed bodies with valid checksums
        body = r.choice([b"", b"\0" * 7, wire.CommitRecord((1.0,)).body()[:-1]])
        return self.records.encode(wire.Kind.COMMIT, body, self.la + 1), "wire.length"


def _state(node: ShadowNode) -> tuple[dict[str, object], list[dict[str, torch.Tensor]]]:
    st = node.status(timeline=0)
    keep = {
        k: st[k]
        for k in (
            "last_applied",
            "last_ready",
            "istar",
            "newest_seen",
            "diverged_at",
            "pending",
            "available",
            "peers",
        )
    }
    ld = node._ld
    assert ld is not None
    return keep, ld.replayer.export()


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def test_fuzz_live_shadow_counts_everything_and_changes_nothing() -> None:
    case = Case("fuzz", "mlp", "adamw", iterations=6)
    trainer = RefTrainer(case, seed=9)
    layout = trainer.layout(num_shadows=1)
    with producer_cluster(layout) as c:
        node = c.nodes[0]
        c.load(trainer.named, trainer.optimizer_spec())
        for it, _ in c.send_steps(trainer, range(3)):
            c.expect_applied(it)
        meta0, state0 = _state(node)
        rx0 = sum(node.rx.values())
        fz = Fuzzer(layout, last_applied=2, seed=1234)

        # 1) the live node's datagram handler, directly
        got: Counter[str] = Counter()
        for _ in range(N_DIRECT):
            data, want = fz.one()
            reason = node.handle_datagram(data)
            got[reason] += 1
            if want is None:
                assert reason.startswith("wire."), reason
            else:
                assert reason == want, (want, reason, data[:56].hex())
        assert sum(got.values()) == N_DIRECT
        assert sum(node.rx.values()) - rx0 == N_DIRECT

        # 2) over UDP, paced
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            dest = node.data_address
            errs0 = _rcvbuf_errors()
            start = sum(node.rx.values())
            sent = 0
            for _ in range(N_UDP // 500):
                for _ in range(500):
                    data, _want = fz.one()
                    tx.sendto(data, dest)
                    sent += 1
                deadline = time.monotonic() + 5.0
                while sum(node.rx.values()) - start < sent and time.monotonic() < deadline:
                    time.sleep(0.002)
        finally:
            tx.close()
        time.sleep(0.05)
        counted = sum(node.rx.values()) - start
        dropped_by_kernel = _rcvbuf_errors() - errs0
        assert counted <= sent
        assert sent - counted <= max(0, dropped_by_kernel), (sent, counted, dropped_by_kernel)

        meta1, state1 = _state(node)
        assert meta1 == meta0
        assert _same(state0, state1)
        assert node.failed is None

        # the node still works, bit-exactly
        for it, _ in c.send_steps(trainer, range(3, case.iterations)):
            c.expect_applied(it)
        assert not c.check(case.iterations - 1, trainer)
