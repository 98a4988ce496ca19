"""Dedicated lossless shadow ports (docs/switch.md), on the product program in-process:
a shadow port limited to a quarter of the offered rate pauses a burst instead of dropping it
(no copy lost, drop counters 0), and under sustained overload spends its pause budget, then
drops (counted) so that the trainer's port is never held longer than the bound. The end-to-end
half (the shard repairs through such a port, training bit-exact) is in test_switch_inband.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

pytest.importorskip("grpc")
pytest.importorskip("p4")

from shadowgrad.bmv2_testbed.inband import compile_product
from shadowgrad.config import parse_spec
from shadowgrad.controller.p4runtime import P4RuntimeClient
from shadowgrad.controller.switch import SwitchDriver
from shadowgrad.frames import encode_frame, port_mac
from shadowgrad.layout import Layout, from_module
from shadowgrad.p4target.ports import InProcessPort
from shadowgrad.p4target.queues import QueueConfig
from shadowgrad.p4target.switch import Switch
from shadowgrad.wire import DType, Flag, Kind, encode

PAYLOAD = 1024
FRAME = 14 + 20 + 8 + 56 + PAYLOAD
RATE_FPS = 100  # the shadow port drains 100 frames/s
PAUSE_S = 0.4
CAPACITY = 8


def _job() -> tuple[Any, Layout]:
    doc = {
        "job": {"id": 3, "name": "lossless", "mode": "in-band"},
        "trainers": {"world_size": 2, "addresses": ["10.0.0.1", "10.0.0.2"]},
        "shadows": {"count": 2, "replication": 1, "addresses": ["10.0.1.1", "10.0.1.2"]},
        "switch": {"target": "p4target", "trainer_ports": [1, 2], "shadow_ports": [3, 4]},
        "security": {"token_env": "X"},
    }
    spec = parse_spec(doc, env={})
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 4))
    params, buckets = from_module(model)
    return spec, Layout.build(params, buckets, 2, 1)


class _Rig:
    def __init__(self) -> None:
        self.spec, self.layout = _job()
        self.sw = Switch(device_id=0, cpu_port=510, grpc_addr="127.0.0.1:0")
        self.ports = {p: InProcessPort(p) for p in (1, 2, 4)}
        for p in self.ports.values():
            self.sw.add_port(p)
        self.slow = InProcessPort(3)  # shadow 0
        self.sw.add_port(
            self.slow,
            QueueConfig(
                capacity=CAPACITY,
                rate_bps=RATE_FPS * FRAME * 8,
                burst_bytes=FRAME,
                lossless=True,
                pause_timeout_s=PAUSE_S,
                headroom=0,
            ),
        )
        self.sw.start()
        assert self.sw.server is not None
        self.client = P4RuntimeClient(f"127.0.0.1:{self.sw.server.port}")
        self.client.connect()
        self.driver = SwitchDriver(self.client, self.spec, self.layout, pipeline=compile_product())
        self.driver.converge()
        # byte ranges of shard 0 (shadow 0's copies)
        self.ranges = [
            (b, r.start, r.end)
            for b, rs in enumerate(self.layout.bucket_routes)
            for r in rs
            if r.shard == 0 and r.end - r.start >= PAYLOAD
        ]
        self.n = 0

    def final(self) -> bytes:
        b, start, end = self.ranges[self.n % len(self.ranges)]
        off = start + (self.n * PAYLOAD) % max(PAYLOAD, end - start - PAYLOAD) // 8 * 8
        off = min(off, end - PAYLOAD)
        dgram = encode(
            Kind.DATA,
            job=3,
            sender=0,
            iteration=self.n,
            seq=self.n,
            layout=1,
            payload=bytes(PAYLOAD),
            flags=Flag.FINAL,
            dtype=DType.FLOAT32,
            bucket=b,
            offset=off,
        )
        self.n += 1
        return encode_frame(
            dgram,
            src=("10.0.0.1", 47474),
            dst=("10.0.0.2", 47474),
            src_mac=port_mac(1),
            dst_mac=port_mac(2),
        )

    def send(self, count: int, fps: float | None) -> float:
        """Inject ``count`` FINAL chunks on trainer 0's port (at ``fps``, or at once); the
        longest a single inject was held by the switch."""
        longest = 0.0
        t_next = time.monotonic()
        for _ in range(count):
            frame = self.final()
            t0 = time.monotonic()
            self.ports[1].inject(frame)
            longest = max(longest, time.monotonic() - t0)
            if fps:
                t_next += 1 / fps
                time.sleep(max(0.0, t_next - time.monotonic()))
        return longest

    def close(self) -> None:
        self.client.close()
        self.sw.stop()


@pytest.fixture
def rig() -> Any:
    r = _Rig()
    yield r
    r.close()


def test_a_burst_within_the_pause_bound_loses_no_copy(rig: _Rig) -> None:
    # 40 frames at once into a queue of 8 that drains 100/s: ~0.3 s of pauses < 0.4 s bound
    burst = 40
    held = rig.send(burst, None)
    assert rig.sw.drain(10)
    got = rig.slow.recv_all(0.2)
    st = rig.sw.queues[3].stats()
    assert len(got) == burst, (len(got), st)
    assert sum(st.drops.values()) == 0 and st.pause_events >= 1
    assert all(p == 0 for p, _ in rig.driver.counters()["drops"].values())
    # the next hop got every chunk too, and the producer was held, but within the bound
    assert len(rig.ports[2].recv_all(0.2)) == burst
    # the pause budget is accounting, not a timing target: the slack covers thread scheduling
    assert 0 < st.paused_s <= PAUSE_S + 0.5
    print(f"burst of {burst}: paused {st.paused_s:.3f}s, longest inject {held * 1e3:.0f} ms")


@pytest.mark.slow
def test_sustained_overload_drops_counted_and_never_holds_the_trainer_past_the_bound(
    rig: _Rig,
) -> None:
    # offered 4x the shadow port's rate for 3 s
    count = 4 * RATE_FPS * 3
    held = rig.send(count, 4 * RATE_FPS)
    assert rig.sw.drain(30)
    got = rig.slow.recv_all(0.2)
    st = rig.sw.queues[3].stats()
    dropped = st.drops["lossless_overflow"]
    assert dropped > 0 and len(got) + dropped == count, (len(got), st)
    # every chunk still reached the ring's next hop
    assert len(rig.ports[2].recv_all(0.2)) == count
    # one congestion episode: its pauses add up to the bound at most
    assert st.paused_s <= PAUSE_S + 0.5 and st.max_pause_s <= PAUSE_S + 0.5, (st, held)
    print(
        f"sustained 4x overload: {dropped}/{count} copies dropped (counted), paused "
        f"{st.paused_s:.3f}s in all, longest inject {held * 1e3:.0f} ms (bound "
        f"{PAUSE_S * 1e3:.0f} ms)"
    )
