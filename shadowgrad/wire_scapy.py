"""scapy layers for the shadowgrad wire format (tests, pcaps, packet crafting).

Needs scapy (``shadowgrad[testbed]``); the trainer side never imports this module. The field
list is built from :data:`shadowgrad.wire.HEADER_FIELDS`, so the layer cannot drift from the
fast codec; ``length`` and ``checksum`` are filled in at build time when left unset.

>>> from scapy.all import IP, UDP
>>> pkt = IP(dst="10.0.0.2") / UDP() / ShadowGrad(kind="DATA", dtype="FLOAT32", job=7) / payload
"""

from __future__ import annotations

from typing import Any

from scapy.fields import (
    BitField,
    ByteEnumField,
    Field,
    FlagsField,
    IntField,
    XByteField,
    XIntField,
    XLongField,
    XShortField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from shadowgrad import wire

__all__ = ["ShadowGrad", "bind_port"]

_LENGTH_AT = wire.HEADER_SIZE - 8
_FLAG_NAMES = ["FINAL", "RETX", "LAST", "SKIPPED", "CLIP", "SCALER", "b6", "b7"]


def _field(name: str, width: int) -> Field[Any, Any]:
    if name == "magic":
        return XShortField(name, wire.MAGIC)
    if name == "version":
        return XByteField(name, wire.VERSION)
    if name == "kind":
        return ByteEnumField(name, int(wire.Kind.DATA), {int(k): k.name for k in wire.Kind})
    if name == "flags":
        return FlagsField(name, 0, 8, _FLAG_NAMES)
    if name == "dtype":
        return ByteEnumField(name, 0, {int(d): d.name for d in wire.DType})
    if name == "layout":
        return XLongField(name, 0)
    if name == "length":
        return IntField(name, None)
    if name == "checksum":
        return XIntField(name, None)
    return BitField(name, 0, width)


class ShadowGrad(Packet):
    """The 56-byte shadowgrad header; the payload follows as ``Raw``."""

    name = "ShadowGrad"
    fields_desc = [_field(n, w) for n, w in wire.HEADER_FIELDS]  # noqa: RUF012 (scapy API)

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.length is None:
            pkt = pkt[:_LENGTH_AT] + len(pay).to_bytes(4, "big") + pkt[_LENGTH_AT + 4 :]
        if self.checksum is None:
            crc = wire.checksum(pkt[: wire.HEADER_SIZE] + pay)
            pkt = pkt[: wire.HEADER_SIZE - 4] + crc.to_bytes(4, "big")
        return pkt + pay

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        n = self.length if self.length is not None else len(s)
        return s[:n], s[n:]


def bind_port(port: int) -> None:
    """Also dissect UDP traffic on ``port`` (either direction) as shadowgrad."""
    bind_layers(UDP, ShadowGrad, dport=port)
    bind_layers(UDP, ShadowGrad, sport=port)


bind_port(wire.DEFAULT_UDP_PORT)
