"""A small classic-pcap writer and reader (libpcap format 2.4, microsecond timestamps, Ethernet).

The target writes one file per port and direction, like bmv2's ``--pcap DIR``
(``<iface>_in.pcap`` / ``<iface>_out.pcap``), so tcpdump, Wireshark and scapy read them.
Writes are serialised by a lock and flushed per packet, so a file is readable while the switch
runs and complete when it stops.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PcapWriter", "read_pcap", "LINKTYPE_ETHERNET"]

LINKTYPE_ETHERNET = 1
_MAGIC = 0xA1B2C3D4
_GLOBAL = struct.Struct("<IHHiIII")
_RECORD = struct.Struct("<IIII")


class PcapWriter:
    """Append Ethernet frames to a classic pcap file; thread-safe; ``close()`` is idempotent."""

    def __init__(
        self, path: str | os.PathLike[str], snaplen: int = 65535, linktype: int = LINKTYPE_ETHERNET
    ) -> None:
        self.path = Path(path)
        self.snaplen = snaplen
        self._lock = threading.Lock()
        self._f = open(self.path, "wb")  # noqa: SIM115 (held open for the writer's lifetime)
        self._f.write(_GLOBAL.pack(_MAGIC, 2, 4, 0, 0, snaplen, linktype))
        self._f.flush()
        self.count = 0

    def write(self, frame: bytes, ts: float | None = None) -> None:
        """Append one frame (truncated to ``snaplen``) with timestamp ``ts`` (default: now)."""
        t = time.time() if ts is None else ts
        sec = int(t)
        usec = round((t - sec) * 1e6)
        if usec >= 1_000_000:
            sec, usec = sec + 1, usec - 1_000_000
        data = frame[: self.snaplen]
        rec = _RECORD.pack(sec, usec, len(data), len(frame))
        with self._lock:
            if self._f.closed:
                return
            self._f.write(rec + data)
            self._f.flush()
            self.count += 1

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_pcap(path: str | os.PathLike[str]) -> Iterator[tuple[float, bytes]]:
    """Yield ``(timestamp, frame)`` from a classic pcap file (either byte order, µs or ns)."""
    data = Path(path).read_bytes()
    if len(data) < _GLOBAL.size:
        raise ValueError(f"{path}: too short for a pcap global header")
    magic_le = struct.unpack_from("<I", data)[0]
    if magic_le in (0xA1B2C3D4, 0xA1B23C4D):
        endian = "<"
    else:
        magic_be = struct.unpack_from(">I", data)[0]
        if magic_be not in (0xA1B2C3D4, 0xA1B23C4D):
            raise ValueError(f"{path}: not a classic pcap file (magic {magic_le:#x})")
        endian = ">"
    magic = struct.unpack_from(endian + "I", data)[0]
    scale = 1e-9 if magic == 0xA1B23C4D else 1e-6
    rec = struct.Struct(endian + "IIII")
    off = _GLOBAL.size
    while off + rec.size <= len(data):
        sec, frac, incl, _orig = rec.unpack_from(data, off)
        off += rec.size
        if off + incl > len(data):
            raise ValueError(f"{path}: truncated record at offset {off - rec.size}")
        yield sec + frac * scale, data[off : off + incl]
        off += incl
