"""Job specs of loopback jobs, as dicts ``parse_spec`` takes: every trainer and shadow on a
loopback address at free ports (:func:`loopback_spec`: mirror mode, or in-band with switch ports
nothing talks to; :func:`switch_spec`: in-band through the P4 target's loopback UDP ports), and
:func:`spec_toml` for a spec file a child process loads. Used by the scenario runner and the demo,
and by the tests (:mod:`shadowgrad.testing.specs` builds its own on :func:`loopback_spec`)."""

from __future__ import annotations

import random
from typing import Any

from shadowgrad.config import parse_spec
from shadowgrad.freeports import free_ports, free_tcp_base, free_udp_base

__all__ = ["loopback_spec", "spec_toml", "switch_spec"]


def loopback_spec(
    world: int,
    shadows: int,
    *,
    replication: int = 1,
    job_id: int = 4242,
    mode: str = "mirror",
    gap_repair: str = "50ms",
    heartbeat: str = "100ms",
    rpc: str = "5s",
    trainer_ports: list[int] | None = None,
) -> dict[str, Any]:
    """A job spec (as a dict) with every trainer and shadow on 127.0.0.1 at free ports."""
    udp = free_ports(world + shadows)
    tports = trainer_ports if trainer_ports is not None else udp[:world]
    switch: dict[str, Any] = {"target": "none"}
    if mode == "in-band":  # switch ports are required; nothing here talks to a switch
        switch = {
            "target": "p4target",
            "trainer_ports": list(range(1, world + 1)),
            "shadow_ports": list(range(world + 1, world + shadows + 1)),
        }
    return _spec(
        {"id": job_id, "name": "trainer-test", "mode": mode},
        [f"127.0.0.1:{p}" for p in tports[:world]],
        [f"127.0.0.1:{p}" for p in udp[world:]],
        switch,
        world=world,
        replication=replication,
        timeouts={"gap_repair": gap_repair, "heartbeat": heartbeat, "rpc": rpc},
    )


def _spec(
    job: dict[str, Any],
    trainers: list[str],
    shadows: list[str],
    switch: dict[str, Any],
    *,
    world: int,
    replication: int,
    timeouts: dict[str, str],
) -> dict[str, Any]:
    """The spec dict of a test job: ``world`` gloo trainers and the shadows at these addresses,
    the shadows' control ports at a free base, failure detection in 2 s."""
    return {
        "job": job,
        "trainers": {"world_size": world, "addresses": trainers, "backend": "gloo"},
        "shadows": {
            "count": len(shadows),
            "replication": replication,
            "addresses": shadows,
            "control_port": free_tcp_base(len(shadows)),
        },
        "switch": switch,
        "timeouts": {
            "gap_repair": timeouts["gap_repair"],
            "heartbeat": timeouts["heartbeat"],
            "failure_detect": "2s",
            "rpc": timeouts["rpc"],
            "connect": "20s",
        },
        "security": {"token_env": "SHADOWGRAD_TOKEN"},
    }


def switch_spec(
    world: int,
    shadows: int,
    *,
    replication: int = 1,
    job_id: int = 4242,
    gap_repair: str = "50ms",
    heartbeat: str = "100ms",
    rpc: str = "5s",
    net: int | None = None,
) -> dict[str, Any]:
    """An in-band job through the P4 target's loopback UDP ports: every host has its own
    loopback IPv4 address ``127.N.T.x`` (trainers ``.1..``, shadows ``.101..``) on the shadowgrad
    UDP port, switch ports 1..world (trainers) and world+1.. (shadows), and ``switch.loopback``
    at a free base on 127.0.0.1 (port N at base + N)."""
    n = net if net is not None else random.Random().randrange(10, 250)
    t = random.Random().randrange(1, 250)
    tports = list(range(1, world + 1))
    sports = list(range(world + 1, world + shadows + 1))
    base = free_udp_base([*tports, *sports, 510])
    return _spec(
        {"id": job_id, "name": "switch-test", "mode": "in-band"},
        [f"127.{n}.{t}.{i + 1}" for i in range(world)],
        [f"127.{n}.{t}.{101 + i}" for i in range(shadows)],
        {
            "target": "p4target",
            "trainer_ports": tports,
            "shadow_ports": sports,
            "loopback": f"127.0.0.1:{base}",
        },
        world=world,
        replication=replication,
        timeouts={"gap_repair": gap_repair, "heartbeat": heartbeat, "rpc": rpc},
    )


def spec_toml(doc: dict[str, Any]) -> str:
    """The spec dict as TOML (for a spec file a child process loads)."""
    spec = parse_spec(doc, env={})
    return spec.to_toml()
