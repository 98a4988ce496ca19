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

import ipaddress
import struct
from typing import NamedTuple

__all__ = [
    "FRAME_OVERHEAD",
    "MAX_FRAMED_DATAGRAM",
    "Frame",
    "port_mac",
    "parse_mac",
    "csum16",
    "format_mac",
    "encode_frame",
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


class Frame(NamedTuple):
    """A decoded frame: addresses (IPv4 as text), ports, and the UDP payload (a view)."""

    dst_mac: int
    src_mac: int
    src: tuple[str, int]
    dst: tuple[str, int]
    payload: memoryview


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
    n = len(datagram)
    if n > MAX_FRAMED_DATAGRAM:
        raise ValueError(
            f"datagram of {n} bytes does not fit a framed loopback datagram "
            f"(at most {MAX_FRAMED_DATAGRAM})"
        )
    sip = ipaddress.IPv4Address(src[0]).packed
    dip = ipaddress.IPv4Address(dst[0]).packed
    total = _IP.size + _UDP.size + n
    ip0 = _IP.pack(0x45, 0, total, ident & 0xFFFF, 0x4000, 64, _PROTO_UDP, 0, sip, dip)
    ip = _IP.pack(0x45, 0, total, ident & 0xFFFF, 0x4000, 64, _PROTO_UDP, csum16(ip0), sip, dip)
    return b"".join(
        (
            _ETH.pack(dst_mac.to_bytes(6, "big"), src_mac.to_bytes(6, "big"), _ETHERTYPE_IPV4),
            ip,
            _UDP.pack(src[1], dst[1], _UDP.size + n, 0),
            bytes(datagram),
        )
    )


def decode_frame(frame: bytes | bytearray | memoryview) -> Frame | None:
    """The UDP payload and addresses of an Ethernet/IPv4/UDP frame, or None when ``frame`` is
    anything else (ARP, TCP, IPv4 options or fragments, a truncated or inconsistent frame).
    The IPv4 header checksum is verified (a frame with a bad one is None)."""
    mv = memoryview(frame)
    if len(mv) < FRAME_OVERHEAD:
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
    if total != _IP.size + ulen or _ETH.size + total > len(mv) or ulen < _UDP.size:
        return None
    start = FRAME_OVERHEAD
    return Frame(
        int.from_bytes(dmac, "big"),
        int.from_bytes(smac, "big"),
        (str(ipaddress.IPv4Address(sip)), sport),
        (str(ipaddress.IPv4Address(dip)), dport),
        mv[start : start + ulen - _UDP.size],
    )
