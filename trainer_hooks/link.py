"""Pluggable link layer of the in-band transport: how datagrams leave and enter a rank.

:class:`UdpLink` uses kernel UDP sockets (loopback, network namespaces, Mininet, real networks).
:class:`FaultyLink` wraps any link and injects loss, duplication and reordering on the send path
(for tests of the reliable transport); :class:`TapLink` hands every datagram sent to a callback
(a software stand-in for the switch's copy to the shadows, and a probe for tests).
:class:`FrameLink` is a UDP link for a host that reaches the switch through one of the P4
target's loopback UDP ports: datagrams for hosts behind the switch travel as whole Ethernet
frames (:mod:`shadowgrad.frames`) to and from that port.
"""

from __future__ import annotations

import contextlib
import random
import select
import socket
from collections.abc import Callable, Sequence
from typing import Protocol

from shadowgrad.frames import FRAME_OVERHEAD, decode_frame_header, frame_header

__all__ = ["Address", "Link", "UdpLink", "FrameLink", "FaultyLink", "TapLink"]

Address = tuple[str, int]
Buffer = bytes | bytearray | memoryview


class Link(Protocol):
    """What the transport needs from a link."""

    def send(self, parts: Sequence[Buffer], addr: Address) -> bool:
        """Send one datagram made of ``parts`` (gather, no copy); False if it was not sent."""
        ...

    def recv_into(self, buf: bytearray, timeout_s: float) -> tuple[int, Address] | None:
        """Receive one datagram into ``buf`` within ``timeout_s``; None on timeout."""
        ...

    def close(self) -> None: ...


class UdpLink:
    """A kernel UDP socket bound to ``bind``; large socket buffers (forced when permitted)."""

    def __init__(self, bind: Address, *, bufsize: int = 16 * 2**20) -> None:
        fam = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
        self.sock = socket.socket(fam, socket.SOCK_DGRAM)
        for opt, force in ((socket.SO_RCVBUF, 33), (socket.SO_SNDBUF, 32)):  # *BUFFORCE
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, force, bufsize)
            except OSError:
                with contextlib.suppress(OSError):
                    self.sock.setsockopt(socket.SOL_SOCKET, opt, bufsize)
        self.sock.setblocking(False)
        try:
            self.sock.bind(bind)
        except OSError:
            self.sock.close()
            raise
        self.send_errors = 0

    @property
    def address(self) -> Address:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def send(self, parts: Sequence[Buffer], addr: Address) -> bool:
        try:
            self.sock.sendmsg(list(parts), (), 0, addr)
        except (BlockingIOError, OSError):
            self.send_errors += 1  # the transport retransmits
            return False
        return True

    def recv_into(self, buf: bytearray, timeout_s: float) -> tuple[int, Address] | None:
        return self._wait(lambda: self.sock.recvfrom_into(buf), timeout_s)

    def _wait(
        self, recv: Callable[[], tuple[int, Address]], timeout_s: float
    ) -> tuple[int, Address] | None:
        """``recv()`` now, else once the socket is readable within ``timeout_s``; None if
        nothing came."""
        try:
            return recv()
        except BlockingIOError:
            pass
        if timeout_s <= 0:
            return None
        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        if not ready:
            return None
        try:
            return recv()
        except BlockingIOError:
            return None

    def fileno(self) -> int:
        """The socket's descriptor: readable when a datagram waits (a transport that idles
        waits on it, with its own wake-up, instead of polling :meth:`recv_into`)."""
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()


class FrameLink(UdpLink):
    """A :class:`UdpLink` bound to this host's address ``bind`` (an IPv4 address and UDP port)
    whose datagrams to the hosts in ``peers`` (address -> MAC) cross the switch: each leaves
    as an Ethernet/IPv4/UDP frame (source MAC ``mac``) in one datagram to ``switch``, the UDP
    endpoint of this host's switch port, and each datagram from ``switch`` is a frame whose
    UDP payload is delivered, with the frame's IPv4/UDP source as its address. Datagrams to and
    from anyone else are plain UDP (a shadow's NACK sent straight to the trainer). Frames not
    addressed to ``bind`` or not IPv4/UDP are dropped and counted (``rx_bad_frames``)."""

    def __init__(
        self,
        bind: Address,
        *,
        switch: Address,
        mac: int,
        peers: dict[Address, int],
        bufsize: int = 16 * 2**20,
    ) -> None:
        super().__init__(bind, bufsize=bufsize)
        self.me = (bind[0], int(bind[1]))
        self.switch = (switch[0], int(switch[1]))
        self.mac = mac
        self.peers = dict(peers)
        self._ident = 0
        self._head = bytearray(FRAME_OVERHEAD)  # a received frame's headers
        self.rx_bad_frames = 0
        self.tx_frames = 0
        self.rx_frames = 0

    def send(self, parts: Sequence[Buffer], addr: Address) -> bool:
        dmac = self.peers.get((addr[0], int(addr[1])))
        if dmac is None:
            return super().send(parts, addr)
        self._ident = (self._ident + 1) & 0xFFFF
        head = frame_header(
            sum(memoryview(p).nbytes for p in parts),
            src=self.me,
            dst=addr,
            src_mac=self.mac,
            dst_mac=dmac,
            ident=self._ident,
        )
        if not super().send([head, *parts], self.switch):  # one gather: nothing copied
            return False
        self.tx_frames += 1
        return True

    def recv_into(self, buf: bytearray, timeout_s: float) -> tuple[int, Address] | None:
        """A frame's payload lands straight in ``buf``: its headers in a buffer of their own
        (one ``recvmsg_into``); a plain datagram (not from the switch) is put back together."""
        head = self._head
        parts = [head, buf]
        while True:
            got = self._recv_parts(parts, timeout_s)
            if got is None:
                return None
            n, src = got
            if (src[0], src[1]) != self.switch:  # its first FRAME_OVERHEAD bytes are in head
                k = min(n, len(buf))
                if k > FRAME_OVERHEAD:
                    buf[FRAME_OVERHEAD:k] = buf[: k - FRAME_OVERHEAD]
                buf[: min(k, FRAME_OVERHEAD)] = head[: min(k, FRAME_OVERHEAD)]
                return k, src
            f = decode_frame_header(head, n)
            if f is None or f.dst != self.me or f.length > len(buf):  # len(buf): truncated
                self.rx_bad_frames += 1
                timeout_s = 0.0
                continue
            self.rx_frames += 1
            return f.length, f.src

    def _recv_parts(self, parts: list[bytearray], timeout_s: float) -> tuple[int, Address] | None:
        def recv() -> tuple[int, Address]:
            n, _anc, _flags, addr = self.sock.recvmsg_into(parts)
            return n, addr

        return self._wait(recv, timeout_s)


class FaultyLink:
    """Wraps a link; each sent datagram is dropped with probability ``drop``, sent twice with
    probability ``dup``, or held back and sent after the next one with probability ``reorder``.
    Deterministic for a given ``seed``."""

    def __init__(
        self,
        inner: Link,
        *,
        drop: float = 0.0,
        dup: float = 0.0,
        reorder: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.inner = inner
        self.drop, self.dup, self.reorder = drop, dup, reorder
        self.rng = random.Random(seed)
        self.held: tuple[bytes, Address] | None = None
        self.counts = {"sent": 0, "dropped": 0, "duplicated": 0, "reordered": 0}

    def send(self, parts: Sequence[Buffer], addr: Address) -> bool:
        self.counts["sent"] += 1
        r = self.rng.random()
        if r < self.drop:
            self.counts["dropped"] += 1
            return True
        data = b"".join(bytes(p) for p in parts)
        if r < self.drop + self.reorder and self.held is None:
            self.counts["reordered"] += 1
            self.held = (data, addr)
            return True
        ok = self.inner.send([data], addr)
        if r > 1.0 - self.dup:
            self.counts["duplicated"] += 1
            self.inner.send([data], addr)
        self._release()
        return ok

    def _release(self) -> None:
        if self.held is not None:
            data, addr = self.held
            self.held = None
            self.inner.send([data], addr)

    def recv_into(self, buf: bytearray, timeout_s: float) -> tuple[int, Address] | None:
        self._release()  # a held datagram never waits for ever
        return self.inner.recv_into(buf, timeout_s)

    def close(self) -> None:
        self._release()
        self.inner.close()


class TapLink:
    """Wraps a link; ``tap(parts, addr)`` sees every datagram before it is sent."""

    def __init__(self, inner: Link, tap: Callable[[Sequence[Buffer], Address], None]) -> None:
        self.inner = inner
        self.tap = tap

    def send(self, parts: Sequence[Buffer], addr: Address) -> bool:
        self.tap(parts, addr)
        return self.inner.send(parts, addr)

    def recv_into(self, buf: bytearray, timeout_s: float) -> tuple[int, Address] | None:
        return self.inner.recv_into(buf, timeout_s)

    def close(self) -> None:
        self.inner.close()
