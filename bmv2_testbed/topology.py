"""Demo and test topologies: hosts behind one switch.

* :class:`Namespaces` (root): one network namespace per host, a veth pair each —
  ``sg<tag>s<port>`` (the switch's end, in the root namespace) and ``eth0`` in the host's
  namespace with its IPv4 address, its port's MAC, MTU 9000, static neighbours for every other
  host, offloads and IPv6 off. ``close()`` removes everything it made; :func:`leftovers` lists
  anything with a tag that is still there (tests use it after a SIGKILL of the runner).
* :class:`~.p4_mininet.MininetNet` (root, Mininet): the same hosts as Mininet hosts behind a
  Mininet :class:`~.p4_mininet.P4RuntimeSwitch` (``sg<tag>-ethN``).
* loopback (any user): every host is a loopback address and the switch's ports are UDP
  sockets (``switch.loopback``); nothing to build.

``choose(requested)`` picks the best one the machine allows: namespaces as root with iproute2,
otherwise loopback.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

__all__ = [
    "HOSTED",
    "MTU",
    "OFFLOADS_OFF",
    "Namespaces",
    "add_veth",
    "choose",
    "disable_ipv6",
    "leftovers",
    "can_namespaces",
    "can_mininet",
    "ns_sh",
]

MTU = 9000
PREFIX = "sg"
#: the topologies whose hosts sit behind the switch's interfaces (one network namespace each)
HOSTED = ("netns", "mininet")


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


#: ``ethtool -K DEV`` arguments that turn every offload off (the kernel leaves no partial
#: checksums or merged segments for the switch)
OFFLOADS_OFF = ("rx", "off", "tx", "off", "sg", "off", "tso", "off", "gso", "off", "gro", "off")


def ns_sh(ns: str, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``ip netns exec NS ARGS`` (a failure ignored unless ``check``)."""
    return _sh("ip", "netns", "exec", ns, *args, check=check)


def disable_ipv6(ns: str, conf: str = "all") -> None:
    """IPv6 off for ``conf`` (``all``, ``default`` or an interface) inside namespace ``ns``, so
    the kernel sends nothing of its own there."""
    ns_sh(ns, "sysctl", "-qw", f"net.ipv6.conf.{conf}.disable_ipv6=1")


def add_veth(switch_if: str, host_if: str, ns: str) -> None:
    """A veth pair: ``switch_if`` stays in the root namespace (IPv6 off), ``host_if`` is moved
    into the existing namespace ``ns``."""
    _sh("ip", "link", "add", switch_if, "type", "veth", "peer", "name", host_if)
    _sh("ip", "link", "set", host_if, "netns", ns)
    _sh("sysctl", "-qw", f"net.ipv6.conf.{switch_if}.disable_ipv6=1", check=False)


def can_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def can_mininet() -> str | None:
    """None where the Mininet topology can run here, else why not."""
    if not can_namespaces():
        return "needs root and iproute2 (ip)"
    import importlib.util

    if importlib.util.find_spec("mininet") is None:
        return (
            "Mininet is not importable (Debian's 'mininet' package, then 'make install' "
            "links it into the venv)"
        )
    if shutil.which("mnexec") is None:
        return "mnexec (Debian's 'mininet' package) is not on PATH"
    return None


def choose(requested: str = "auto") -> str:
    """``auto`` -> ``netns`` as root with iproute2, else ``loopback``; ``mininet`` only where
    :func:`can_mininet`."""
    if requested == "auto":
        return "netns" if can_namespaces() else "loopback"
    if requested == "netns" and not can_namespaces():
        raise PermissionError(
            "--topology netns needs root and iproute2 (ip); "
            "use --topology loopback (any user) or userns"
        )
    if requested == "mininet":
        why = can_mininet()
        if why is not None:
            raise PermissionError(
                f"--topology mininet {why}; use --topology netns (root) or loopback"
            )
    return requested


def leftovers(tag: str) -> dict[str, list[str]]:
    """Namespaces and interfaces of topology ``tag`` that still exist."""
    names = _sh("ip", "netns", "list", check=False).stdout.split()
    ns = [n for n in names if n.startswith(f"{PREFIX}{tag}")]
    links = [
        p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(f"{PREFIX}{tag}")
    ]
    return {"namespaces": ns, "links": links}


class Namespaces:
    """``hosts``: (switch port, IPv4 address, MAC as int) per host."""

    def __init__(
        self, hosts: list[tuple[int, str, int]], *, mtu: int = MTU, tag: str | None = None
    ) -> None:
        self.tag = tag or secrets.token_hex(2)
        self.mtu = mtu
        self.ns: dict[int, str] = {}
        self.switch_if: dict[int, str] = {}
        self._links: list[str] = []
        try:
            for port, ip, mac in hosts:
                ns, sif, hif = (
                    f"{PREFIX}{self.tag}h{port}",
                    f"{PREFIX}{self.tag}s{port}",
                    f"{PREFIX}{self.tag}t{port}",
                )
                _sh("ip", "netns", "add", ns)
                self.ns[port] = ns
                self._links.append(sif)  # close() removes only what exists
                self.switch_if[port] = sif
                add_veth(sif, hif, ns)
                _sh("ip", "-n", ns, "link", "set", hif, "name", "eth0")
                disable_ipv6(ns)
                ns_sh(ns, "ethtool", "-K", "eth0", *OFFLOADS_OFF)
                mac_s = ":".join(f"{b:02x}" for b in mac.to_bytes(6, "big"))
                _sh("ip", "-n", ns, "link", "set", "eth0", "address", mac_s, "mtu", str(mtu))
                _sh("ip", "-n", ns, "addr", "add", f"{ip}/16", "dev", "eth0")
                _sh("ip", "-n", ns, "link", "set", "eth0", "up")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                _sh("ip", "link", "set", sif, "mtu", str(mtu + 500), "up")
            for port, _ip, _mac in hosts:
                for p2, ip2, mac2 in hosts:
                    if p2 != port:
                        m = ":".join(f"{b:02x}" for b in mac2.to_bytes(6, "big"))
                        _sh(
                            "ip",
                            "-n",
                            self.ns[port],
                            "neigh",
                            "replace",
                            ip2,
                            "lladdr",
                            m,
                            "dev",
                            "eth0",
                            "nud",
                            "permanent",
                        )
        except BaseException:
            self.close()
            raise

    def exec_prefix(self, port: int) -> list[str]:
        """The command prefix that runs a program on the host at switch port ``port``."""
        return ["ip", "netns", "exec", self.ns[port]]

    def close(self) -> None:
        for ns in self.ns.values():
            _sh("ip", "netns", "del", ns, check=False)
        for link in self._links:
            if Path(f"/sys/class/net/{link}").exists():
                _sh("ip", "link", "del", link, check=False)
        self.ns.clear()
        self._links.clear()

    def __enter__(self) -> Namespaces:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
