"""Switch ports: AF_PACKET on Linux interfaces, UDP loopback endpoints, and in-process ports.

A port receives frames on its own RX thread and hands each to ``deliver(port_number, frame)``
(the switch runs the pipeline on that thread, so a paused lossless egress queue stops the RX
thread and therefore the reading of that port — see :mod:`.queues`). ``send(frame)`` transmits
one whole Ethernet frame; the egress queue's thread calls it.

- :class:`AfPacketPort` — ``-i N@iface``: a raw ``AF_PACKET`` socket bound to the interface, in
  promiscuous mode, with large forced socket buffers (``SO_RCVBUFFORCE``), ignoring its own
  transmissions (``PACKET_IGNORE_OUTGOING``, with a ``PACKET_OUTGOING`` check as fallback), and
  kernel drop statistics (``PACKET_STATISTICS``). Offloads: a frame that a host sends with
  checksum offload arrives with a partial checksum that nobody completes after the switch
  forwards it, so the switch turns offloads off on its own interfaces (``ethtool -K``, best
  effort) and the *hosts' interfaces must have tx checksum offload off* as well (the testbed's
  namespaces do it: :class:`.topology.Namespaces` and
  :class:`shadowgrad.testing.bmv2.VethNamespace`; see
  docs/switch-target.md and docs/testbed.md).
- :class:`UdpPort` — ``--loopback-port N@host:port[=peerhost:peerport]``: each datagram carries
  one whole Ethernet frame. Without a fixed peer, frames go to the last address heard from.
- :class:`InProcessPort` — for tests: ``inject(frame)`` delivers synchronously on the caller's
  thread; transmitted frames are collected and read with ``recv()``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "Port",
    "AfPacketPort",
    "UdpPort",
    "InProcessPort",
    "Deliver",
    "PortSpec",
    "parse_iface_spec",
    "parse_loopback_spec",
    "disable_offloads",
    "OFFLOADS",
]

log = logging.getLogger(__name__)

Deliver = Callable[[int, bytes], None]
DeliverBatch = Callable[[int, list[bytes]], None]

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
PACKET_STATISTICS = 6
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
_RX_POLL_S = 0.2
_RX_BATCH = 256  # frames read without blocking before the stop flag is checked again
# frames handed to the pipeline at once (one call, one dataplane lock) when several are waiting;
# a lone frame goes alone, so this adds no latency to light traffic
_PROC_BATCH = 32
_MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0x40)
MAX_FRAME = 65535 + 14


class Port:
    """Base class: a numbered port with an RX thread and counters."""

    kind = "port"

    def __init__(self, number: int, name: str) -> None:
        if not 0 <= number < 512:
            raise ValueError(f"port number must fit in 9 bits (0..511), got {number}")
        self.number = number
        self.name = name
        self.rx_packets = 0
        self.rx_bytes = 0
        self.tx_packets = 0
        self.tx_bytes = 0
        self.rx_errors = 0
        self._deliver: Deliver | None = None
        self._deliver_batch: DeliverBatch | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, deliver: Deliver, deliver_batch: DeliverBatch | None = None) -> None:
        """Start delivering received frames to ``deliver`` (or, where the port reads several
        frames at once, to ``deliver_batch``, in order)."""
        self._deliver = deliver
        self._deliver_batch = deliver_batch
        self._thread = threading.Thread(target=self._rx_loop, name=f"rx-{self.name}", daemon=True)
        self._thread.start()

    def _rx_loop(self) -> None:  # pragma: no cover - overridden
        pass

    def _handle(self, frame: bytes) -> None:
        self.rx_packets += 1
        self.rx_bytes += len(frame)
        if self._deliver is not None:
            try:
                self._deliver(self.number, frame)
            except Exception:  # the pipeline must never kill a port
                self.rx_errors += 1
                log.exception("processing a frame from port %d failed", self.number)

    def send(self, frame: bytes) -> None:
        raise NotImplementedError

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def counters(self) -> dict[str, int]:
        return {
            "rx_packets": self.rx_packets,
            "rx_bytes": self.rx_bytes,
            "tx_packets": self.tx_packets,
            "tx_bytes": self.tx_bytes,
            "rx_errors": self.rx_errors,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.number}@{self.name})"


OFFLOADS = ("rx", "tx", "sg", "tso", "gso", "gro", "rxvlan", "txvlan")


def disable_offloads(iface: str, netns: str | None = None) -> bool:
    """Turn off checksum, segmentation and VLAN offloads on ``iface`` with ethtool (VLAN
    offload would strip 802.1Q tags, and with them the PCP, from what AF_PACKET reads).
    Best effort: features a driver cannot change are skipped. False if ethtool is missing or
    nothing could be changed."""
    exe = shutil.which("ethtool")
    if exe is None:
        log.warning("ethtool not found: offloads on %s left as they are", iface)
        return False
    prefix = ["ip", "netns", "exec", netns] if netns is not None else []

    def run(features: tuple[str, ...]) -> bool:
        args = [a for f in features for a in (f, "off")]
        try:
            r = subprocess.run(
                [*prefix, exe, "-K", iface, *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("ethtool -K %s failed: %s", iface, e)
            return False
        return r.returncode == 0

    if run(OFFLOADS):
        return True
    results = [run((f,)) for f in OFFLOADS]
    if not any(results):
        log.warning("could not change any offload on %s", iface)
    return any(results)


class _SocketPort(Port):
    """A port over one socket (``_sock``), closed after the RX thread has stopped."""

    _sock: socket.socket

    def close(self, timeout: float = 2.0) -> None:
        super().close(timeout)
        self._sock.close()


class AfPacketPort(_SocketPort):
    """A Linux interface as a switch port (root or a user namespace with CAP_NET_RAW)."""

    kind = "af_packet"

    def __init__(
        self,
        number: int,
        iface: str,
        *,
        rcvbuf: int = 64 << 20,
        sndbuf: int = 4 << 20,
        offloads: bool = False,
    ) -> None:
        super().__init__(number, iface)
        self.iface = iface
        self.kernel_drops = 0
        self.ignore_outgoing = False
        if not offloads:
            disable_offloads(iface)
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        try:
            s.bind((iface, 0))
            for opt, force, size in (
                (socket.SO_RCVBUF, 33, rcvbuf),  # SO_RCVBUFFORCE
                (socket.SO_SNDBUF, 32, sndbuf),
            ):  # SO_SNDBUFFORCE
                try:
                    s.setsockopt(socket.SOL_SOCKET, force, size)
                except OSError:
                    s.setsockopt(socket.SOL_SOCKET, opt, size)
            try:
                s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
                self.ignore_outgoing = True
            except OSError:
                log.debug("PACKET_IGNORE_OUTGOING unsupported; filtering by pkttype")
            ifindex = socket.if_nametoindex(iface)
            mreq = struct.pack("iHH8s", ifindex, PACKET_MR_PROMISC, 0, b"")
            try:
                s.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
            except OSError as e:
                log.warning("cannot set %s promiscuous: %s", iface, e)
            # a kernel receive timeout (not Python's settimeout, which polls before every
            # recv) lets the RX thread notice close() within _RX_POLL_S
            usec = int(_RX_POLL_S * 1e6)
            s.setsockopt(
                socket.SOL_SOCKET,
                socket.SO_RCVTIMEO,
                struct.pack("ll", usec // 1_000_000, usec % 1_000_000),
            )
        except BaseException:
            s.close()
            raise
        self._sock = s
        self._read_stats()  # reset the kernel counters

    def _read_stats(self) -> None:
        with contextlib.suppress(OSError):
            raw = self._sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
            _packets, drops = struct.unpack("II", raw)
            self.kernel_drops += drops

    def _rx_loop(self) -> None:
        if self.ignore_outgoing:
            self._rx_loop_fast()
            return
        s = self._sock
        stop = self._stop
        handle = self._handle
        while not stop.is_set():
            try:
                frame, addr = s.recvfrom(MAX_FRAME)
            except (BlockingIOError, TimeoutError, InterruptedError):
                continue
            except OSError:
                if stop.is_set():
                    return
                self.rx_errors += 1
                continue
            if len(addr) > 2 and addr[2] == PACKET_OUTGOING:
                continue
            handle(frame)

    def _rx_loop_fast(self) -> None:
        """The RX loop with ``PACKET_IGNORE_OUTGOING`` (hot path): one blocking ``recv`` (with
        the kernel timeout, to notice close()), then non-blocking ones while frames are
        waiting; what was read is counted, then handed to the switch at once (up to
        ``_PROC_BATCH`` frames; a lone frame goes alone)."""
        s = self._sock
        recv = s.recv
        is_set = self._stop.is_set
        number = self.number
        deliver = self._deliver
        batch_deliver = self._deliver_batch
        while not is_set():
            try:
                frame = recv(MAX_FRAME)
            except (BlockingIOError, TimeoutError, InterruptedError):
                continue
            except OSError:
                if is_set():
                    return
                self.rx_errors += 1
                continue
            left = _RX_BATCH
            batch = [frame]
            nbytes = len(frame)
            stop = False
            while left:
                # read what is waiting (up to _PROC_BATCH frames) without blocking, count it,
                # then run it through the pipeline at once
                while len(batch) < _PROC_BATCH:
                    try:
                        frame = recv(MAX_FRAME, _MSG_DONTWAIT)
                    except (BlockingIOError, InterruptedError):
                        left = 0
                        break
                    except OSError:
                        stop = is_set()
                        if not stop:
                            self.rx_errors += 1
                        left = 0
                        break
                    batch.append(frame)
                    nbytes += len(frame)
                if not batch:
                    break
                self.rx_packets += len(batch)
                self.rx_bytes += nbytes
                try:
                    if batch_deliver is not None:
                        batch_deliver(number, batch)
                    elif deliver is not None:
                        for frame in batch:
                            deliver(number, frame)
                except Exception:  # the pipeline must never kill a port
                    self.rx_errors += 1
                    log.exception("processing frames from port %d failed", number)
                left = max(0, left - len(batch))
                batch = []
                nbytes = 0
            if stop:
                return

    def send(self, frame: bytes) -> None:
        # one datagram per send() is atomic on a packet socket: no lock needed
        self._sock.send(frame)
        self.tx_packets += 1
        self.tx_bytes += len(frame)

    def send_many(self, frames: Sequence[bytes]) -> tuple[int, int]:
        """Send ``frames`` in order, a failed one skipped (logged at debug level); returns
        (frames sent, bytes sent)."""
        send = self._sock.send
        sent = nbytes = 0
        for frame in frames:
            try:
                send(frame)
            except OSError as e:
                log.debug("transmit on port %d failed: %s", self.number, e)
            else:
                sent += 1
                nbytes += len(frame)
        self.tx_packets += sent
        self.tx_bytes += nbytes
        return sent, nbytes

    def counters(self) -> dict[str, int]:
        self._read_stats()
        return {**super().counters(), "kernel_drops": self.kernel_drops}


class UdpPort(_SocketPort):
    """A UDP endpoint as a switch port: one datagram = one whole Ethernet frame."""

    kind = "udp"

    def __init__(
        self,
        number: int,
        host: str,
        port: int,
        peer: tuple[str, int] | None = None,
        *,
        rcvbuf: int = 16 << 20,
    ) -> None:
        super().__init__(number, f"port{number}")
        self.fixed_peer = peer is not None
        self.peer = peer
        self.no_peer_drops = 0
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            s.bind((host, port))
            s.settimeout(_RX_POLL_S)
        except BaseException:
            s.close()
            raise
        self._sock = s
        self.address: tuple[str, int] = s.getsockname()[:2]

    def _rx_loop(self) -> None:
        s = self._sock
        while not self._stop.is_set():
            try:
                frame, addr = s.recvfrom(MAX_FRAME)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                self.rx_errors += 1
                continue
            if not self.fixed_peer:
                self.peer = (addr[0], addr[1])
            self._handle(frame)

    def send(self, frame: bytes) -> None:
        peer = self.peer
        if peer is None:
            self.no_peer_drops += 1
            raise ConnectionError(f"loopback port {self.number} has no peer yet")
        self._sock.sendto(frame, peer)
        self.tx_packets += 1
        self.tx_bytes += len(frame)

    def counters(self) -> dict[str, int]:
        return {**super().counters(), "no_peer_drops": self.no_peer_drops}


class InProcessPort(Port):
    """A port for tests: frames injected by the test, transmitted frames kept in a queue."""

    kind = "in_process"

    def __init__(self, number: int, name: str | None = None) -> None:
        super().__init__(number, name or f"port{number}")
        self._out: queue.Queue[bytes] = queue.Queue()

    def start(self, deliver: Deliver, deliver_batch: DeliverBatch | None = None) -> None:
        self._deliver = deliver  # inject() delivers one frame at a time, on the caller's thread

    def inject(self, frame: bytes) -> None:
        """Deliver ``frame`` as if received on this port (synchronously, on this thread)."""
        self._handle(bytes(frame))

    def send(self, frame: bytes) -> None:
        self.tx_packets += 1
        self.tx_bytes += len(frame)
        self._out.put(bytes(frame))

    def recv(self, timeout: float = 1.0) -> bytes | None:
        """The next transmitted frame, or None after ``timeout`` seconds."""
        try:
            return self._out.get(timeout=timeout)
        except queue.Empty:
            return None

    def recv_all(self, timeout: float = 0.2) -> list[bytes]:
        """Every frame transmitted until none arrives for ``timeout`` seconds."""
        out: list[bytes] = []
        while (f := self.recv(timeout)) is not None:
            out.append(f)
        return out


@dataclass(frozen=True)
class PortSpec:
    """A parsed port option: ``kind`` is ``iface`` or ``udp``."""

    number: int
    kind: str
    iface: str = ""
    host: str = ""
    udp_port: int = 0
    peer: tuple[str, int] | None = None


def _port_number(text: str, spec: str) -> int:
    try:
        n = int(text, 0)
    except ValueError:
        raise ValueError(f"bad port number in {spec!r}") from None
    if not 0 <= n < 511:
        raise ValueError(f"port number in {spec!r} must be 0..510 (511 is the drop port)")
    return n


def parse_iface_spec(spec: str) -> PortSpec:
    """``N@iface`` (simple_switch_grpc ``-i``)."""
    num, sep, iface = spec.partition("@")
    if not sep or not iface:
        raise ValueError(f"interface spec must be N@iface, got {spec!r}")
    return PortSpec(_port_number(num, spec), "iface", iface=iface)


def _hostport(text: str, spec: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port in {spec!r}")
    host = host.strip("[]") or "127.0.0.1"
    p = int(port)
    if not 0 <= p < 65536:
        raise ValueError(f"UDP port out of range in {spec!r}")
    return host, p


def parse_loopback_spec(spec: str) -> PortSpec:
    """``N@host:port`` or ``N@host:port=peerhost:peerport`` (``--loopback-port``)."""
    num, sep, rest = spec.partition("@")
    if not sep or not rest:
        raise ValueError(f"loopback spec must be N@host:port[=peer:port], got {spec!r}")
    local, eq, peer = rest.partition("=")
    host, udp = _hostport(local, spec)
    return PortSpec(
        _port_number(num, spec),
        "udp",
        host=host,
        udp_port=udp,
        peer=_hostport(peer, spec) if eq else None,
    )
