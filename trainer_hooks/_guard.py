"""Who a trainer answers, and how much: the source check and the repair budget shared by the
mirror sender and the in-band ring (DESIGN invariant 8; docs/security.md).

A trainer answers a NACK only if it comes from one of the job's shadows (the spec's addresses)
and carries a valid MAC, and only to the address it came from; what it resends per shadow is
bounded by a token bucket (``rate_bytes_s``, burst ``burst_bytes``), so even a shadow that asks
for everything over and over gets at most that — repair needs no more.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable

from shadowgrad._addr import canonical, resolve

__all__ = [
    "canonical",
    "resolve",
    "Peers",
    "RepairBudget",
    "REPAIR_RATE_BYTES_S",
    "REPAIR_BURST_BYTES",
]

#: default repair budget per shadow: 256 MiB/s, bursts of 64 MiB
REPAIR_RATE_BYTES_S = 256 * 2**20
REPAIR_BURST_BYTES = 64 * 2**20


class Peers:
    """A set of allowed source addresses (canonical)."""

    def __init__(self, addrs: Iterable[tuple[str, int]]) -> None:
        self._set = frozenset(resolve(a) for a in addrs)

    def __contains__(self, addr: object) -> bool:
        if not isinstance(addr, tuple) or len(addr) < 2:
            return False
        host, port = addr[0], addr[1]
        if (host, port) in self._set:
            return True
        try:
            return (ipaddress.ip_address(host).compressed, port) in self._set
        except ValueError:
            return False


class RepairBudget:
    """A token bucket of resend bytes per requesting address."""

    def __init__(
        self, rate_bytes_s: float = REPAIR_RATE_BYTES_S, burst_bytes: float = REPAIR_BURST_BYTES
    ) -> None:
        self.rate = float(rate_bytes_s)
        self.burst = float(burst_bytes)
        self._tokens: dict[tuple[str, int], tuple[float, float]] = {}
        self.refused_bytes = 0

    def take(self, addr: tuple[str, int], nbytes: int) -> bool:
        """Spend ``nbytes`` of ``addr``'s budget; False (nothing spent) if it has not enough."""
        now = time.monotonic()
        tokens, last = self._tokens.get(addr, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens < nbytes:
            self._tokens[addr] = (tokens, now)
            self.refused_bytes += nbytes
            return False
        self._tokens[addr] = (tokens - nbytes, now)
        return True
