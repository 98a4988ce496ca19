"""Addresses compared as the kernel reports them: canonical IP text, names resolved once.

The one rule both sides use to check where a datagram came from (the trainers' answers to
NACKs, the shadows' intake of DATA, COMMIT and READY; docs/security.md).
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["canonical", "resolve"]


def canonical(addr: tuple[str, int]) -> tuple[str, int]:
    """``(ip, port)`` with an IP literal in canonical text form (anything else lowercased; no
    name resolution here — see :func:`resolve`)."""
    host, port = str(addr[0]), int(addr[1])
    try:
        return ipaddress.ip_address(host).compressed, port
    except ValueError:
        return host.lower(), port


def resolve(addr: tuple[str, int]) -> tuple[str, int]:
    """``addr`` with a host name resolved to its first IPv4/IPv6 address (once, at start-up;
    an IP literal or an unresolvable name comes back canonical)."""
    host, port = canonical(addr)
    try:
        ipaddress.ip_address(host)
        return host, port
    except ValueError:
        pass
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return host, port
    return canonical((str(info[0][4][0]), port))
