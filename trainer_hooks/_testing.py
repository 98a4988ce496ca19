"""Test and demo helpers: loopback job specs with free ports, and real shadow nodes in-process.

Imports the shadow package lazily; nothing in a training job needs this module.
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
from collections.abc import Iterator
from typing import Any

import torch

from shadowgrad.config import JobSpec, parse_spec
from shadowgrad.layout import Layout

__all__ = ["TOKEN", "loopback_spec", "switch_spec", "spec_toml", "ShadowCluster",
           "shadow_cluster"]

TOKEN = "trainer-test-token"


def _free_udp(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_tcp_base(n: int, tries: int = 200) -> int:
    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(20000, 60000 - n)
        ok = True
        for k in range(n):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", base + k))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no {n} consecutive free TCP ports found")


def loopback_spec(world: int, shadows: int, *, replication: int = 1, job_id: int = 4242,
                  mode: str = "mirror", gap_repair: str = "50ms", heartbeat: str = "100ms",
                  rpc: str = "5s", trainer_ports: list[int] | None = None) -> dict[str, Any]:
    """A job spec (as a dict) with every trainer and shadow on 127.0.0.1 at free ports."""
    udp = _free_udp(world + shadows)
    tports = trainer_ports if trainer_ports is not None else udp[:world]
    switch: dict[str, Any] = {"target": "none"}
    if mode == "in-band":  # switch ports are required; nothing here talks to a switch
        switch = {"target": "bmv2_testbed", "trainer_ports": list(range(1, world + 1)),
                  "shadow_ports": list(range(world + 1, world + shadows + 1))}
    return {
        "job": {"id": job_id, "name": "trainer-test", "mode": mode},
        "trainers": {"world_size": world,
                     "addresses": [f"127.0.0.1:{p}" for p in tports[:world]],
                     "backend": "gloo"},
        "shadows": {"count": shadows, "replication": replication,
                    "addresses": [f"127.0.0.1:{p}" for p in udp[world:]],
                    "control_port": _free_tcp_base(shadows)},
        "switch": switch,
        "timeouts": {"gap_repair": gap_repair, "heartbeat": heartbeat, "failure_detect": "2s",
                     "rpc": rpc, "connect": "20s"},
        "security": {"token_env": "SHADOWGRAD_TOKEN"},
    }


def _free_udp_ports(ports: list[int], host: str = "127.0.0.1", tries: int = 200) -> int:
    """A base such that ``base + p`` is a free UDP port on ``host`` for every ``p``."""
    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(20000, 60000 - max(ports))
        socks = []
        try:
            for p in ports:
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


def switch_spec(world: int, shadows: int, *, replication: int = 1, job_id: int = 4242,
                gap_repair: str = "50ms", heartbeat: str = "100ms", rpc: str = "5s",
                net: int | None = None) -> dict[str, Any]:
    """An in-band job through the P4 target's loopback UDP ports: every host has its own
    loopback IPv4 address ``127.N.T.x`` (trainers ``.1..``, shadows ``.101..``) on the shadowgrad
    UDP port, switch ports 1..world (trainers) and world+1.. (shadows), and ``switch.loopback``
    at a free base on 127.0.0.1 (port N at base + N)."""
    n = net if net is not None else random.Random().randrange(10, 250)
    t = random.Random().randrange(1, 250)
    tports = list(range(1, world + 1))
    sports = list(range(world + 1, world + shadows + 1))
    base = _free_udp_ports([*tports, *sports, 510])
    return {
        "job": {"id": job_id, "name": "switch-test", "mode": "in-band"},
        "trainers": {"world_size": world,
                     "addresses": [f"127.{n}.{t}.{i + 1}" for i in range(world)],
                     "backend": "gloo"},
        "shadows": {"count": shadows, "replication": replication,
                    "addresses": [f"127.{n}.{t}.{101 + i}" for i in range(shadows)],
                    "control_port": _free_tcp_base(shadows)},
        "switch": {"target": "bmv2_testbed", "trainer_ports": tports, "shadow_ports": sports,
                   "loopback": f"127.0.0.1:{base}"},
        "timeouts": {"gap_repair": gap_repair, "heartbeat": heartbeat, "failure_detect": "2s",
                     "rpc": rpc, "connect": "20s"},
        "security": {"token_env": "SHADOWGRAD_TOKEN"},
    }


def spec_toml(doc: dict[str, Any]) -> str:
    """The spec dict as TOML (for a spec file a child process loads)."""
    spec = parse_spec(doc, env={})
    return spec.to_toml()


class ShadowCluster:
    """Real :class:`~shadowgrad.shadow.node.ShadowNode` s for every shadow of ``spec``, as threads
    of this process, bound to the spec's addresses and control ports."""

    def __init__(self, spec: JobSpec, token: str = TOKEN) -> None:
        from shadowgrad.shadow.control import ShadowClient
        from shadowgrad.shadow.node import ShadowNode

        self.spec = spec
        self.nodes: list[Any] = []
        try:
            for k in range(spec.shadows.count):
                self.nodes.append(ShadowNode(spec, k, token=token))
            for n in self.nodes:
                n.start()
        except BaseException:
            self.close()
            raise
        self.clients = [ShadowClient(n.control_endpoint, token, timeout_s=30.0)
                        for n in self.nodes]

    def close(self) -> None:
        for c in getattr(self, "clients", []):
            c.close()
        first: BaseException | None = None
        for n in self.nodes:
            try:
                n.stop()
            except Exception as exc:
                first = first or exc
        self.nodes = []
        if first is not None:
            raise first

    def status(self) -> list[dict[str, Any]]:
        return [n.status(timeline=0) for n in self.nodes]

    def wait_applied(self, it: int, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for n in self.nodes:
                if n.failed is not None:
                    raise AssertionError(f"shadow {n.id} died: {n.failed!r}")
            sts = self.status()
            if all(s["last_applied"] is not None and s["last_applied"] >= it for s in sts):
                return True
            time.sleep(0.01)
        return False

    def full_state(self, layout: Layout, iteration: int | None = None
                   ) -> tuple[int, dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """Every shard's state (replica 0) at ``iteration`` glued into full tensors."""
        from shadowgrad.shadow.replay import assemble_full

        exports = []
        its = set()
        for shard in range(layout.num_shards):
            res = self.clients[layout.shadows_of_shard(shard)[0]].fetch(iteration)
            its.add(res.iteration)
            exports.append([res.states[b] for b in range(len(layout.shard_boxes(shard)))])
        if len(its) != 1:
            raise AssertionError(f"shards answered different iterations {sorted(its)}")
        params, opt = assemble_full(layout, exports)
        return its.pop(), params, opt


@contextlib.contextmanager
def shadow_cluster(spec: JobSpec, token: str = TOKEN) -> Iterator[ShadowCluster]:
    c = ShadowCluster(spec, token)
    try:
        yield c
    finally:
        c.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ranks:
    """``world`` child processes of one torchrun-style job (RANK/WORLD_SIZE/MASTER_* set)."""

    def __init__(self, argv: list[str], world: int, env: dict[str, str], cwd: str) -> None:
        import os
        import subprocess
        import tempfile

        port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []
        for r in range(world):
            e = {**os.environ, **env, "RANK": str(r), "WORLD_SIZE": str(world),
                 "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                 "OMP_NUM_THREADS": "1"}
            log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
            self.logs.append(log)
            self.procs.append(subprocess.Popen(argv, env=e, cwd=cwd, stdout=log,
                                               stderr=subprocess.STDOUT))

    def output(self, r: int) -> str:
        # pread, never seek+read: the child's stdout shares this file's offset (one open file
        # description across fork), so moving it made the child's next write land mid-file
        # and overwrite lines (seen: a loss line spliced with the tail of a later one)
        import os

        fd = self.logs[r].fileno()
        size = os.fstat(fd).st_size
        chunks = []
        off = 0
        while off < size:
            b = os.pread(fd, size - off, off)
            if not b:
                break
            chunks.append(b)
            off += len(b)
        return b"".join(chunks).decode(errors="replace")

    def wait(self, timeout_s: float) -> list[int | None]:
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(max(0.1, deadline - time.monotonic()))
        return [p.poll() for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(10)

    def close(self) -> None:
        self.kill()
        for f in self.logs:
            f.close()
