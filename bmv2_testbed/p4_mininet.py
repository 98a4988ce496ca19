"""Mininet nodes for P4 switches: :class:`P4RuntimeSwitch` and :class:`P4Host`, and the demo's
Mininet topology :class:`MininetNet` (docs/testbed.md, *Mininet*).

:class:`P4RuntimeSwitch` has the constructor and the behaviour of p4lang/tutorials'
``P4RuntimeSwitch`` (``utils/p4runtime_switch.py``): ``sw_path``, ``json_path``, ``grpc_port``,
``thrift_port``, ``device_id``, ``cpu_port``, ``pcap_dump``, ``log_console``, ``log_file``; its
``start()`` runs ``sw_path`` on the switch's Mininet interfaces as ``-i N@sX-ethN`` (port N is
Mininet's port number of the link), with ``--device-id``, ``--thrift-port``, the program (or
``--no-p4``) and ``-- --grpc-server-addr``/``--cpu-port``, and waits until the gRPC port
listens. So a topology written for bmv2 runs on this project's ``sg-switch-grpc`` by changing
``sw_path``, and the same class runs real ``simple_switch_grpc`` where it is installed. Two
additions: ``switch_args`` (more options before ``--``: the project target's ``--port-loss``,
``--lossless-port`` ...) and ``mtu`` (the switch-side MTU of every port). The switch is
started as a process of its own (its own session, SIGTERM then SIGKILL at ``stop()``), not as a
job of the node's shell.

:class:`P4Host` is the tutorials' ``P4Host`` (default interface renamed ``eth0``, offloads and
IPv6 off) plus what the netns topology gives a host: an MTU and static neighbours
(``neighbours={ip: mac}``, ``nud permanent``).

:class:`MininetNet` builds the demo's hosts behind one :class:`P4RuntimeSwitch` and tears all
of it down at ``close()``. Importing this module needs Mininet (``make install`` makes Debian's
importable from the venv).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mininet.net import Mininet
from mininet.node import Host, Switch

from shadowgrad.freeports import free_port

from .topology import MTU, OFFLOADS_OFF

__all__ = [
    "MininetNet",
    "P4Host",
    "P4RuntimeSwitch",
    "SWITCH_START_TIMEOUT",
    "new_mininet",
    "stop_mininet",
]

log = logging.getLogger(__name__)

#: seconds a switch has to listen on its gRPC port (the tutorials wait 10 s; the project's
#: target imports grpc and torch-free Python first, so it gets longer on a loaded machine)
SWITCH_START_TIMEOUT = 60.0


def _listening(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


class P4Host(Host):  # type: ignore[misc]
    """A host for P4 topologies: ``eth0`` with offloads and IPv6 off; ``mtu`` and static
    ``neighbours`` ({IPv4: MAC}) as the netns topology sets them."""

    def config(self, **params: Any) -> Any:
        mtu = params.pop("mtu", None)
        neighbours: dict[str, str] = params.pop("neighbours", None) or {}
        r = super().config(**params)
        intf = self.defaultIntf()
        intf.rename("eth0")
        self.cmd("ethtool -K eth0 " + " ".join(OFFLOADS_OFF))
        for conf in ("all", "default", "lo"):
            self.cmd(f"sysctl -qw net.ipv6.conf.{conf}.disable_ipv6=1")
        if mtu is not None:
            self.cmd(f"ip link set eth0 mtu {int(mtu)}")
        for ip, mac in neighbours.items():
            self.cmd(f"ip neigh replace {ip} lladdr {mac} dev eth0 nud permanent")
        return r

    def describe(self) -> str:
        i = self.defaultIntf()
        return f"{self.name}: {i.name} {i.IP()} {i.MAC()}"


class P4RuntimeSwitch(Switch):  # type: ignore[misc]
    """A P4 switch with a P4Runtime server, started by Mininet (see the module docstring)."""

    next_grpc_port = 50051
    next_thrift_port = 9090
    next_device_id = 0

    def __init__(  # noqa: PLR0917 (the tutorials' class takes these positionally)
        self,
        name: str,
        sw_path: str | None = None,
        json_path: str | None = None,
        grpc_port: int | None = None,
        thrift_port: int | None = None,
        pcap_dump: str | bool = False,
        log_console: bool = False,
        verbose: bool = False,
        device_id: int | None = None,
        enable_debugger: bool = False,
        log_file: str | None = None,
        cpu_port: int | None = None,
        priority_queues: int | None = None,
        grpc_host: str = "0.0.0.0",
        switch_args: Sequence[str] = (),
        mtu: int | None = None,
        start_timeout_s: float = SWITCH_START_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        if sw_path is None:
            raise ValueError(f"{name}: sw_path is required (simple_switch_grpc, sg-switch-grpc)")
        found = shutil.which(sw_path)
        if found is None:
            raise FileNotFoundError(f"{name}: switch binary {sw_path!r} not found on PATH")
        if json_path is not None and not Path(json_path).is_file():
            raise FileNotFoundError(f"{name}: no program file {json_path}")
        if device_id is None:
            device_id = P4RuntimeSwitch.next_device_id
        P4RuntimeSwitch.next_device_id = max(P4RuntimeSwitch.next_device_id, device_id + 1)
        if "dpid" not in kwargs and not any(c.isdigit() for c in name):
            kwargs["dpid"] = f"{device_id + 1:x}"
        super().__init__(name, **kwargs)
        self.sw_path = found
        self.json_path = json_path
        if grpc_port is None:
            grpc_port = P4RuntimeSwitch.next_grpc_port
            P4RuntimeSwitch.next_grpc_port += 1
        if thrift_port is None:
            thrift_port = P4RuntimeSwitch.next_thrift_port
            P4RuntimeSwitch.next_thrift_port += 1
        self.grpc_port = grpc_port
        self.grpc_host = grpc_host
        self.thrift_port = thrift_port
        if _listening(self.grpc_port):
            super().terminate()
            raise OSError(f"{name}: gRPC port {self.grpc_port} is bound by another process")
        self.device_id = device_id
        self.pcap_dump = pcap_dump
        self.log_console = log_console
        self.verbose = verbose
        self.enable_debugger = enable_debugger
        self.log_file = log_file or f"/tmp/p4s.{name}.log"
        self.cpu_port = cpu_port
        self.priority_queues = priority_queues
        self.switch_args = list(switch_args)
        self.mtu = mtu
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def data_ports(self) -> dict[int, str]:
        """Mininet port number -> interface name, for every data port (not the control
        interface ``lo``, which has an address)."""
        return {
            int(port): intf.name
            for port, intf in sorted(self.intfs.items())
            if not intf.IP() and intf.name != "lo"
        }

    def argv(self) -> list[str]:
        """The switch's command line, as the tutorials' class builds it."""
        args = [self.sw_path]
        for port, name in self.data_ports().items():
            args += ["-i", f"{port}@{name}"]
        if self.pcap_dump:
            args += ["--pcap", str(self.pcap_dump) if isinstance(self.pcap_dump, str) else "."]
        args += ["--device-id", str(self.device_id)]
        args.append(self.json_path if self.json_path else "--no-p4")
        if self.enable_debugger:
            args.append("--debugger")
        if self.log_console:
            args.append("--log-console")
        if self.thrift_port:
            args += ["--thrift-port", str(self.thrift_port)]
        args += self.switch_args
        args += ["--", "--grpc-server-addr", f"{self.grpc_host}:{self.grpc_port}"]
        if self.cpu_port:
            args += ["--cpu-port", str(self.cpu_port)]
        if self.priority_queues:
            args += ["--priority-queues", str(self.priority_queues)]
        return args

    def start(self, controllers: Any) -> None:
        """Configure the data ports (up, IPv6 off, ``mtu``), start the switch and wait until
        its gRPC port listens (``start_timeout_s``)."""
        for name in self.data_ports().values():
            self.cmd(f"sysctl -qw net.ipv6.conf.{name}.disable_ipv6=1")
            self.cmd(f"ip link set {name} " + (f"mtu {self.mtu} " if self.mtu else "") + "up")
        cmd = self.argv()
        log.info("starting P4 switch %s: %s", self.name, " ".join(cmd))
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while not _listening(self.grpc_port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                code = self.proc.poll()
                self.stop_datapath()
                raise RuntimeError(
                    f"P4 switch {self.name} did not start "
                    f"({'exit ' + str(code) if code is not None else 'timed out'}); "
                    f"log: {self.log_file}"
                )
            time.sleep(0.1)
        log.info("P4 switch %s is listening on gRPC port %d", self.name, self.grpc_port)

    def stop_datapath(self, grace_s: float = 10.0) -> None:
        """SIGTERM the switch process (its group), SIGKILL after ``grace_s``; idempotent."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(5)

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 (Mininet's name)
        self.stop_datapath()
        super().stop(deleteIntfs)

    def describe(self) -> str:
        return f"{self.name} -> gRPC port: {self.grpc_port}"


def new_mininet() -> Any:
    """An empty ``Mininet`` for P4 nodes (:class:`P4RuntimeSwitch`, :class:`P4Host`, no
    controller). Mininet's logger keeps its own handler (the CLI's output is printed once, not
    twice through the root logger), and Mininet's ``fixLimits`` (machine-wide sysctl raises)
    is not run: the emulation changes nothing outside its own nodes."""
    logging.getLogger("mininet").propagate = False
    Mininet.inited = True  # skip fixLimits()
    return Mininet(topo=None, switch=P4RuntimeSwitch, host=P4Host, controller=None)


def stop_mininet(net: Any) -> None:
    """Stop every P4 switch process of ``net``, then its nodes and links; a half-built network
    is stopped node by node. Never raises."""
    for sw in net.switches:
        if isinstance(sw, P4RuntimeSwitch):
            with contextlib.suppress(Exception):
                sw.stop_datapath()
    try:
        net.stop()
    except Exception as e:  # a half-built net: stop what there is
        log.warning("mininet stop: %s", e)
        for node in [*net.hosts, *net.switches]:
            with contextlib.suppress(Exception):
                node.stop(deleteIntfs=True)
            with contextlib.suppress(Exception):
                node.terminate()


class MininetNet:
    """The demo's Mininet topology: one :class:`P4Host` per host (``names[port]``, e.g.
        ``trainer0``) behind one :class:`P4RuntimeSwitch` named ``sg<tag>`` (its interfaces
        ``sg<tag>-ethN``, port N), every host with its IPv4 address (/16), its port's MAC, MTU
        ``mtu``, static neighbours for every other host, offloads and IPv6 off. The switch runs
        ``sw_path`` (default: the venv's ``sg-switch-grpc``) with ``switch_args`` and the program
    ``json_path`` (default ``--no-p4``); its gRPC server
        listens on 127.0.0.1. ``close()`` stops the switch process and the network (hosts,
        interfaces); nothing is left. Mininet's ``fixLimits`` (machine-wide sysctl raises) is not
        run: the emulation changes nothing outside its own nodes."""

    def __init__(
        self,
        hosts: list[tuple[int, str, int]],
        names: dict[int, str],
        *,
        tag: str,
        mtu: int = MTU,
        sw_path: str | None = None,
        switch_args: Sequence[str] = (),
        cpu_port: int | None = None,
        device_id: int = 0,
        log_file: str | None = None,
        json_path: str | None = None,
    ) -> None:
        import sys

        self.tag = tag
        self.net: Any = new_mininet()
        self.switch_name = f"sg{tag}"
        try:
            sw = self.net.addSwitch(
                self.switch_name,
                cls=P4RuntimeSwitch,
                sw_path=sw_path or str(Path(sys.executable).parent / "sg-switch-grpc"),
                grpc_port=free_port(),
                grpc_host="127.0.0.1",
                thrift_port=0,
                device_id=device_id,
                cpu_port=cpu_port,
                switch_args=switch_args,
                mtu=mtu + 500,
                log_file=log_file,
                json_path=json_path,
            )
            self.switch: P4RuntimeSwitch = sw
            macs = {
                ip: ":".join(f"{b:02x}" for b in mac.to_bytes(6, "big")) for _, ip, mac in hosts
            }
            self.hosts: dict[int, Any] = {}
            for port, ip, _mac in hosts:
                h = self.net.addHost(
                    names[port],
                    ip=f"{ip}/16",
                    mac=macs[ip],
                    mtu=mtu,
                    neighbours={i: m for i, m in macs.items() if i != ip},
                )
                self.net.addLink(h, sw, port2=port)
                self.hosts[port] = h
            self.net.start()
        except BaseException:
            self.close()
            raise
        self.switch_if = self.switch.data_ports()

    @property
    def grpc_addr(self) -> str:
        return self.switch.grpc_addr

    def exec_prefix(self, port: int) -> list[str]:
        """The command prefix that runs a program on the host at switch port ``port``
        (``mnexec -a PID``: into its network namespace, as Mininet's ``popen`` does)."""
        return ["mnexec", "-a", str(self.hosts[port].pid)]

    def cli(self) -> None:
        """Mininet's CLI on this network (returns when the user leaves it)."""
        from mininet.cli import CLI

        CLI(self.net)

    def stop_switch(self) -> None:
        self.switch.stop_datapath()

    def close(self) -> None:
        """Stop the switch process, then every node and link (idempotent)."""
        net, self.net = getattr(self, "net", None), None
        if net is not None:
            stop_mininet(net)

    def __enter__(self) -> MininetNet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
