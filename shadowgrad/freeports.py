"""Free local ports, for jobs on loopback (tests, demos, the scenario runner, benchmarks).

The one place that asks the kernel for a free port: a port is free when a socket of that kind
can bind it on ``host`` now (nothing holds it afterwards, so a caller binds it soon).
"""

from __future__ import annotations

import random
import socket

__all__ = ["free_listen_port", "free_port", "free_ports", "free_tcp_base", "free_udp_base"]


def free_port(kind: int = socket.SOCK_STREAM, host: str = "127.0.0.1") -> int:
    """A port the kernel picks as free on ``host`` for a socket of ``kind`` (TCP by default)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for outgoing connections (Linux's
    ``ip_local_port_range``; 32768 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_listen_port(host: str = "127.0.0.1") -> int:
    """A free TCP port for a server another process binds later (torch's rendezvous store):
    below the kernel's ephemeral range, so no outgoing connection is given it meanwhile (a
    :func:`free_port` is an ephemeral port: seen in CI, another connection took one between
    the pick and the bind, and the rendezvous failed with EADDRINUSE)."""
    try:
        return free_tcp_base(1, host=host, low=10000, high=max(10002, _ephemeral_low()))
    except RuntimeError:
        return free_port(host=host)


def free_ports(n: int, kind: int = socket.SOCK_DGRAM, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports (bound together, so no two are the same; UDP by default)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, kind)
            socks.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_tcp_base(
    n: int, tries: int = 200, *, host: str = "127.0.0.1", low: int = 20000, high: int = 60000
) -> int:
    """A base in ``low .. high - n - 1`` such that ``base .. base + n - 1`` are free TCP ports
    on ``host``."""
    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(low, high - n)
        ok = True
        for k in range(n):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, base + k))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no {n} consecutive free TCP ports found")


def free_udp_base(offsets: list[int], host: str = "127.0.0.1", tries: int = 200) -> int:
    """A base such that ``base + p`` is a free UDP port on ``host`` for every ``p``."""
    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(20000, 60000 - max(offsets))
        socks = []
        try:
            for p in offsets:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind((host, base + p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of UDP ports found")
