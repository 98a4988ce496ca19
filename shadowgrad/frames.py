"""Ethernet / IPv4 / UDP framing of shadowgrad datagrams, for hosts that reach the switch
through the P4 target's loopback UDP ports (``sg-switch-grpc --loopback-port N@HOST:PORT``:
one UDP datagram carries one whole Ethernet frame).

The one definition of how such a host frames what it sends and unframes what the switch sends
back: :class:`~shadowgrad.trainer_hooks.link.FrameLink` (trainers) and the shadow node's receive
path use it, the switch driver (:mod:`shadowgrad.controller.switch`) uses :func:`port_mac` for
the MAC addresses it installs. Standard library only.

A frame is ``Ethernet(dst, src, 0x0800) / IPv4(ihl 5, ttl 64, DF, proto 17, checksum) /
UDP(sport, dport, len, checksum 0) / datagram``. The UDP checksum is 0 ("none", allowed for
IPv4): the shadowgrad header carries its own CRC-32C over header and payload.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
from typing import NamedTuple

__all__ = [
    "FRAME_OVERHEAD",
    "MAX_FRAMED_DATAGRAM",
    "Frame",
    "FrameHeader",
    "port_mac",
    "parse_mac",
    "csum16",
    "format_mac",
    "frame_header",
    "encode_frame",
    "decode_frame_header",
    "decode_frame",
]

_ETH = struct.Struct("!6s6sH")
_IP = struct.Struct("!BBHHHBBH4s4s")
_UDP = struct.Struct("!HHHH")
#: bytes a frame adds to a datagram (Ethernet 14 + IPv4 20 + UDP 8)
FRAME_OVERHEAD = _ETH.size + _IP.size + _UDP.size
#: the largest datagram whose frame still fits one loopback UDP datagram (65507 bytes)
MAX_FRAMED_DATAGRAM = 65507 - FRAME_OVERHEAD
_ETHERTYPE_IPV4 = 0x0800
_PROTO_UDP = 17


def port_mac(port: int) -> int:
    """The default MAC of the host on switch port ``port``: ``02:53:47:00:0p:pp``
    (locally administered, "SG"), used when the job spec names no MAC for it."""
    if not 0 <= port < 512:
        raise ValueError(f"switch port {port} does not fit 9 bits")
    return 0x02_53_47_00_00_00 | port


def parse_mac(text: str) -> int:
    """``"02:53:47:00:00:05"`` (or ``-`` separated) -> 48-bit int; ValueError otherwise."""
    parts = text.replace("-", ":").split(":")
    if len(parts) != 6 or not all(len(p) == 2 for p in parts):
        raise ValueError(f"not a MAC address: {text!r} (want six hex bytes, 02:53:47:00:00:05)")
    try:
        return int("".join(parts), 16)
    except ValueError:
        raise ValueError(f"not a MAC address: {text!r}") from None


def format_mac(mac: int) -> str:
    return ":".join(f"{b:02x}" for b in mac.to_bytes(6, "big"))


def csum16(data: bytes) -> int:
    """The Internet checksum (ones' complement of the 16-bit ones' complement sum; even length)."""
    s: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


@functools.lru_cache(maxsize=4096)
def _packed(host: str) -> bytes:
    return ipaddress.IPv4Address(host).packed


@functools.lru_cache(maxsize=4096)
def _text(packed: bytes) -> str:
    return str(ipaddress.IPv4Address(packed))


def frame_header(
    length: int,
    *,
    src: tuple[str, int],
    dst: tuple[str, int],
    src_mac: int,
    dst_mac: int,
    ident: int = 0,
) -> bytes:
    """The :data:`FRAME_OVERHEAD` bytes (Ethernet, IPv4, UDP) that precede a ``length``-byte
    datagram from ``src`` (IPv4, UDP port) to ``dst`` in its frame: send them and the
    datagram's parts in one gather (``sendmsg``) and the datagram is never copied."""
    if length > MAX_FRAMED_DATAGRAM:
        raise ValueError(
            f"datagram of {length} bytes does not fit a framed loopback datagram "
            f"(at most {MAX_FRAMED_DATAGRAM})"
        )
    sip, dip = _packed(src[0]), _packed(dst[0])
    total = _IP.size + _UDP.size + length
    ip0 = _IP.pack(0x45, 0, total, ident & 0xFFFF, 0x4000, 64, _PROTO_UDP, 0, sip, dip)
    ip = _IP.pack(0x45, 0, total, ident & 0xFFFF, 0x4000, 64, _PROTO_UDP, csum16(ip0), sip, dip)
    return b"".join(
        (
            _ETH.pack(dst_mac.to_bytes(6, "big"), src_mac.to_bytes(6, "big"), _ETHERTYPE_IPV4),
            ip,
            _UDP.pack(src[1], dst[1], _UDP.size + length, 0),
        )
    )


def encode_frame(
    datagram: bytes | bytearray | memoryview,
    *,
    src: tuple[str, int],
    dst: tuple[str, int],
    src_mac: int,
    dst_mac: int,
    ident: int = 0,
) -> bytes:
    """The frame carrying ``datagram`` from ``src`` (IPv4, UDP port) to ``dst``."""
    head = frame_header(
        len(datagram), src=src, dst=dst, src_mac=src_mac, dst_mac=dst_mac, ident=ident
    )
    return head + bytes(datagram)


class FrameHeader(NamedTuple):
    """A frame's parsed headers: addresses (IPv4 as text), ports, the UDP payload's length."""

    dst_mac: int
    src_mac: int
    src: tuple[str, int]
    dst: tuple[str, int]
    length: int


class Frame(NamedTuple):
    """A decoded frame: its headers and the UDP payload (a view)."""

    header: FrameHeader
    payload: memoryview

    @property
    def src(self) -> tuple[str, int]:
        return self.header.src

    @property
    def dst(self) -> tuple[str, int]:
        return self.header.dst

    @property
    def dst_mac(self) -> int:
        return self.header.dst_mac


def decode_frame_header(head: bytes | bytearray | memoryview, size: int) -> FrameHeader | None:
    """The headers of a ``size``-byte frame whose first :data:`FRAME_OVERHEAD` bytes are
    ``head`` (its payload received elsewhere), or None when it is not an Ethernet/IPv4/UDP
    frame :func:`decode_frame` would take."""
    mv = memoryview(head)
    if size < FRAME_OVERHEAD or len(mv) < FRAME_OVERHEAD:
        return None
    dmac, smac, etype = _ETH.unpack_from(mv, 0)
    if etype != _ETHERTYPE_IPV4:
        return None
    vihl, _tos, total, _id, frag, _ttl, proto, _c, sip, dip = _IP.unpack_from(mv, _ETH.size)
    if vihl != 0x45 or proto != _PROTO_UDP or frag & 0x3FFF:
        return None
    if csum16(bytes(mv[_ETH.size : _ETH.size + _IP.size])) != 0:
        return None
    sport, dport, ulen, _uc = _UDP.unpack_from(mv, _ETH.size + _IP.size)
    if total != _IP.size + ulen or _ETH.size + total > size or ulen < _UDP.size:
        return None
    return FrameHeader(
        int.from_bytes(dmac, "big"),
        int.from_bytes(smac, "big"),
        (_text(sip), sport),
        (_text(dip), dport),
        ulen - _UDP.size,
    )


def decode_frame(frame: bytes | bytearray | memoryview) -> Frame | None:
    """The UDP payload and addresses of an Ethernet/IPv4/UDP frame, or None when ``frame`` is
    anything else (ARP, TCP, IPv4 options or fragments, a truncated or inconsistent frame).
    The IPv4 header checksum is verified (a frame with a bad one is None)."""
    mv = memoryview(frame)
    h = decode_frame_header(mv[:FRAME_OVERHEAD], len(mv))
    if h is None:
        return None
    return Frame(h, mv[FRAME_OVERHEAD : FRAME_OVERHEAD + h.length])
