"""The software switch: ports + egress queues + dataplane + P4Runtime server + pcap, glued.

Packet path::

    port RX thread --frames waiting (1..32)--> [pcap in] --> Dataplane.process_batch(port, frames)
        --> [(egress_port, frame), ...] --> EgressQueue(egress_port).put / put_many
            (an idle unshaped queue sends on this thread; lossless queues may pause it,
             see queues.py)
    egress queue thread --> [rate, delay, loss] --> [pcap out] --> port.send(frame)

Frames to the CPU port never reach a queue: the dataplane strips the packet_in header and the
switch hands them to the P4Runtime server (PacketIn to the primary controller) and to any
``packet_in_handlers``. PacketOut from the controller runs ``Dataplane.packet_out`` on the gRPC
stream thread and the resulting frames are queued like any others.

A :class:`Switch` is usable without gRPC (tests call ``port.inject`` and ``port.recv``) and is
the :class:`~.p4runtime_server.Target` of the server when one is started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from p4.config.v1 import p4info_pb2

from .dataplane import Dataplane, Pipeline
from .p4runtime_server import P4RuntimeServer
from .pcap import PcapWriter
from .ports import Port
from .queues import EgressQueue, QueueConfig
from .v1model import DEFAULT_DROP_PORT, MAX_PORT

__all__ = ["Switch", "SWITCH_DROP_REASONS", "pfc_frame", "PFC_DST", "PFC_ETHERTYPE"]

log = logging.getLogger(__name__)
pkt_log = logging.getLogger("shadowgrad.p4target.packets")

SWITCH_DROP_REASONS = ("no_pipeline", "no_such_port", "packet_out_error")

PFC_DST = bytes.fromhex("0180c2000001")
PFC_ETHERTYPE = 0x8808
PFC_OPCODE = 0x0101


def pfc_frame(port: int, pause: bool) -> bytes:
    """An IEEE 802.1Qbb PFC frame from switch port ``port``: all eight priorities enabled,
    pause time 0xFFFF quanta (XOFF) or 0 (XON); padded to the 60-byte minimum."""
    src = bytes([0x02, 0x53, 0x47, 0x00, port >> 8, port & 0xFF])  # locally administered
    quanta = 0xFFFF if pause else 0
    body = (
        PFC_ETHERTYPE.to_bytes(2, "big")
        + PFC_OPCODE.to_bytes(2, "big")
        + (0x00FF).to_bytes(2, "big")
        + quanta.to_bytes(2, "big") * 8
    )
    return (PFC_DST + src + body).ljust(60, b"\0")


class Switch:
    """One software switch (device). ``start()`` / ``stop()``; also a context manager."""

    def __init__(
        self,
        *,
        device_id: int = 0,
        cpu_port: int | None = None,
        drop_port: int = DEFAULT_DROP_PORT,
        grpc_addr: str | None = None,
        pcap_dir: str | Path | None = None,
        log_packets: bool = False,
        pfc: bool = False,
    ) -> None:
        if cpu_port is not None and not 0 < cpu_port <= MAX_PORT:
            raise ValueError(f"cpu port must be 1..511, got {cpu_port}")
        if cpu_port is not None and cpu_port == drop_port:
            raise ValueError("the cpu port cannot be the drop port")
        self._device_id = device_id
        self.cpu_port = cpu_port
        self.drop_port = drop_port
        self.grpc_addr = grpc_addr
        self.pcap_dir = Path(pcap_dir) if pcap_dir is not None else None
        self.log_packets = log_packets
        self.pfc = pfc
        self.pfc_sent: dict[tuple[int, str], int] = {}
        self.ports: dict[int, Port] = {}
        self.queues: dict[int, EgressQueue] = {}
        self._queue_cfg: dict[int, QueueConfig] = {}
        self._pcap: dict[tuple[int, str], PcapWriter] = {}
        self._dataplane: Dataplane | None = None
        self._p4info: p4info_pb2.P4Info | None = None
        self._dp_lock = threading.Lock()
        self.server: P4RuntimeServer | None = None
        self.packet_in_handlers: list[Callable[[bytes, dict[int, int]], None]] = []
        self.digest_handlers: list[Callable[[int, list[bytes]], None]] = []
        self.drops: dict[str, int] = dict.fromkeys(SWITCH_DROP_REASONS, 0)
        self._started = False
        self._stopped = False

    # ---- Target protocol -------------------------------------------------------------------
    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def dataplane(self) -> Dataplane | None:
        return self._dataplane

    @property
    def p4info(self) -> p4info_pb2.P4Info | None:
        return self._p4info

    def verify_pipeline(self, p4info: p4info_pb2.P4Info, device_config: bytes) -> Pipeline:
        return Pipeline.from_device_config(device_config, p4info)

    def commit_pipeline(
        self, pipeline: Any, p4info: p4info_pb2.P4Info, device_config: bytes
    ) -> None:
        """Replace the running pipeline; all runtime state starts fresh (as on bmv2)."""
        dpl = Dataplane(pipeline, cpu_port=self.cpu_port, drop_port=self.drop_port)
        dpl.on_packet_in = self._on_packet_in
        dpl.on_digest = self._on_digest
        dpl.queue_depth = self._queue_depth
        if self.log_packets:
            dpl.on_log = self._on_log
        with self._dp_lock:
            self._dataplane = dpl
            self._p4info = p4info

    def _queue_depth(self, port: int) -> int:
        q = self.queues.get(port)
        return q.depth_nowait() if q is not None else 0

    def packet_out(self, payload: bytes, metadata: dict[int, int]) -> None:
        dpl = self._dataplane
        if dpl is None:
            self.drops["no_pipeline"] += 1
            raise RuntimeError("no pipeline loaded")
        self._enqueue(dpl.packet_out(payload, metadata))

    # ---- setup -----------------------------------------------------------------------------
    def load_pipeline(self, pipeline: Pipeline) -> Dataplane:
        """Install ``pipeline`` directly (the command line's positional program)."""
        self.commit_pipeline(pipeline, pipeline.p4info, b"")
        if self.server is not None:
            self.server.install_initial_pipeline(pipeline.p4info, pipeline.to_device_config())
        dpl = self._dataplane
        assert dpl is not None
        return dpl

    def add_port(self, port: Port, queue: QueueConfig | None = None) -> Port:
        """Attach ``port`` with an egress queue configured by ``queue``."""
        n = port.number
        if n in self.ports:
            raise ValueError(f"port {n} is already attached ({self.ports[n]})")
        if n in (self.drop_port, self.cpu_port):
            raise ValueError(f"port {n} is the {'drop' if n == self.drop_port else 'cpu'} port")
        cfg = queue or QueueConfig()
        self.ports[n] = port
        self._queue_cfg[n] = cfg
        if self.pcap_dir is not None:
            self.pcap_dir.mkdir(parents=True, exist_ok=True)
            for d in ("in", "out"):
                self._pcap[(n, d)] = PcapWriter(self.pcap_dir / f"{port.name}_{d}.pcap")
        many = getattr(port, "send_many", None) if (n, "out") not in self._pcap else None
        self.queues[n] = EgressQueue(
            n, self._transmitter(port), cfg, on_pause=self._on_pause, transmit_many=many
        )
        if self._started:
            port.start(self._deliver, self._deliver_batch)
        return port

    def set_queue_config(self, port: int, config: QueueConfig) -> None:
        """Change a port's egress queue at run time (rate, delay, loss, lossless, ...)."""
        q = self.queues.get(port)
        if q is None:
            raise KeyError(f"port {port} is not attached")
        q.reconfigure(config)
        self._queue_cfg[port] = config

    def set_lossless(self, port: int, lossless: bool = True) -> None:
        """Mark a port's egress queue lossless (a shadow port) or lossy again."""
        q = self.queues.get(port)
        if q is None:
            raise KeyError(f"port {port} is not attached")
        self.set_queue_config(port, dataclasses.replace(q.config, lossless=lossless))

    def start(self) -> None:
        """Start the P4Runtime server (if ``grpc_addr``) and the ports' RX threads."""
        if self._started:
            return
        self._started = True
        if self.grpc_addr is not None:
            self.server = P4RuntimeServer(self, self.grpc_addr)
            self.server.start()
            dpl = self._dataplane
            if dpl is not None and self._p4info is not None:
                self.server.install_initial_pipeline(self._p4info, dpl.pipeline.to_device_config())
        for port in self.ports.values():
            port.start(self._deliver, self._deliver_batch)

    def stop(self) -> None:
        """Stop server, ports and queues, close pcap files; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop(grace=0.5)
        # queues first: closing one wakes an RX thread paused on it, so ports then stop fast
        for q in self.queues.values():
            q.close()
        for port in self.ports.values():
            with contextlib.suppress(Exception):
                port.close()
        for w in self._pcap.values():
            w.close()

    def __enter__(self) -> Switch:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- packet path -----------------------------------------------------------------------
    def _deliver(self, port: int, frame: bytes) -> None:
        self._deliver_batch(port, (frame,))

    def _deliver_batch(self, port: int, frames: Sequence[bytes]) -> None:
        if self._pcap:
            w = self._pcap.get((port, "in"))
            if w is not None:
                for frame in frames:
                    w.write(frame)
        dpl = self._dataplane
        if dpl is None:
            self.drops["no_pipeline"] += len(frames)
            return
        outs = dpl.process_batch(port, frames)
        if not outs:
            return
        if self.pfc:
            self._enqueue(outs, ingress=port)
            return
        queues = self.queues  # _enqueue without PFC, inlined (hot path)
        if len(outs) <= 2:  # one frame's copies
            for eport, data in outs:
                q = queues.get(eport)
                if q is None:
                    self._no_such_port(eport)
                else:
                    q.put(data)
            return
        # a batch: each queue takes its frames at once, in order
        by_port: dict[int, list[bytes]] = {}
        for eport, data in outs:
            frames_out = by_port.get(eport)
            if frames_out is None:
                by_port[eport] = [data]
            else:
                frames_out.append(data)
        for eport, frames_out in by_port.items():
            q = queues.get(eport)
            if q is None:
                for _ in frames_out:
                    self._no_such_port(eport)
            else:
                q.put_many(frames_out)

    def _no_such_port(self, eport: int) -> None:
        self.drops["no_such_port"] += 1
        if self.log_packets:
            pkt_log.info("drop: egress port %d is not attached", eport)

    def _enqueue(self, outs: list[tuple[int, bytes]], ingress: int | None = None) -> None:
        for eport, data in outs:
            q = self.queues.get(eport)
            if q is None:
                self._no_such_port(eport)
                continue
            if self.pfc and ingress is not None and ingress in self.ports:
                q.put(data, on_block=self._pfc_sender(ingress))
            else:
                q.put(data)

    def _pfc_sender(self, ingress: int) -> Callable[[bool], None]:
        def send(pause: bool) -> None:
            frame = pfc_frame(ingress, pause)
            self.pfc_sent[(ingress, "xoff" if pause else "xon")] = (
                self.pfc_sent.get((ingress, "xoff" if pause else "xon"), 0) + 1
            )
            w = self._pcap.get((ingress, "out"))
            if w is not None:
                w.write(frame)
            try:
                self.ports[ingress].send(frame)  # out of band: not through the paused queue
            except Exception as e:  # the pause itself still happens
                log.debug("PFC frame on port %d failed: %s", ingress, e)

        return send

    def _transmitter(self, port: Port) -> Callable[[bytes], None]:
        w_key = (port.number, "out")
        if w_key not in self._pcap:  # no pcap: the port's send itself (hot path)
            return port.send

        def tx(frame: bytes) -> None:
            w = self._pcap.get(w_key)
            if w is not None:
                w.write(frame)
            port.send(frame)

        return tx

    def _on_packet_in(self, payload: bytes, metadata: dict[int, int]) -> None:
        if self.server is not None:
            self.server.send_packet_in(payload, metadata)
        for h in self.packet_in_handlers:
            h(payload, metadata)

    def _on_digest(self, digest_id: int, members: list[bytes]) -> None:
        if self.server is not None:
            self.server.send_digest(digest_id, members)
        for h in self.digest_handlers:
            h(digest_id, members)

    def _on_log(self, line: str) -> None:
        pkt_log.info("%s", line)

    def _on_pause(self, port: int, paused: bool) -> None:
        log.info(
            "lossless queue of port %d %s", port, "paused (XOFF)" if paused else "resumed (XON)"
        )

    # ---- observability ---------------------------------------------------------------------
    def drain(self, timeout: float = 5.0) -> bool:
        """Wait until every egress queue is empty; False on timeout."""
        return all(q.drain(timeout) for q in self.queues.values())

    def counters(self) -> dict[str, Any]:
        """Per-port, per-queue, dataplane and server counters, with drops by reason."""
        dpl = self._dataplane
        out: dict[str, Any] = {
            "switch_drops": dict(self.drops),
            "ports": {n: p.counters() for n, p in sorted(self.ports.items())},
            "queues": {n: vars(q.stats()) for n, q in sorted(self.queues.items())},
            "dataplane_drops": {f"{p}:{r}": c for (p, r), c in dpl.drop_counts().items()}
            if dpl is not None
            else {},
        }
        if self.server is not None:
            out["p4runtime"] = vars(self.server.counters)
        return out
