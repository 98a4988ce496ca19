"""Job specs and identities of test jobs: the test token, the job id and records' key of the
in-process clusters, and :func:`bound_spec`, a mirror-mode job at addresses the caller already
bound (built on the library's :func:`shadowgrad.specs.loopback_spec`, which picks free ports
itself and is what a test imports for a job whose processes bind their own ports)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shadowgrad import wire
from shadowgrad.specs import loopback_spec

__all__ = ["JOB_ID", "KEY", "TOKEN", "bound_spec"]

#: the token every test job is started with (shadows, controller, trainer ranks)
TOKEN = "trainer-test-token"
#: the job id of :func:`bound_spec` jobs (the in-process clusters fed by a Producer)
JOB_ID = 77
#: the records' key the shadows of a :func:`bound_spec` job derive from :data:`TOKEN` (the
#: Producer seals with it as a trainer does)
KEY = wire.mac_key(TOKEN, JOB_ID)


def bound_spec(
    shadow_addrs: Sequence[tuple[str, int]],
    trainer_addrs: Sequence[tuple[str, int]],
    replication: int,
    *,
    name: str = "shadow-test",
    job_id: int = JOB_ID,
    gap_repair: str = "40ms",
    heartbeat: str = "20ms",
    failure_detect: str = "1s",
    rpc: str = "2s",
    snapshot_every: int = 0,
    snapshot_dir: str | None = None,
) -> dict[str, Any]:
    """A mirror-mode job spec (a dict for ``parse_spec``) whose shadows and trainers are at
    these ``(host, port)`` addresses, bound already by the caller (so no other process can take
    them in between), with short timeouts; the shadows' control ports at a free base."""
    doc = loopback_spec(
        len(trainer_addrs),
        len(shadow_addrs),
        replication=replication,
        job_id=job_id,
        gap_repair=gap_repair,
        heartbeat=heartbeat,
        rpc=rpc,
    )
    doc["job"]["name"] = name
    doc["trainers"]["addresses"] = [f"{h}:{p}" for h, p in trainer_addrs]
    doc["shadows"]["addresses"] = [f"{h}:{p}" for h, p in shadow_addrs]
    doc["shadows"]["snapshot_every"] = snapshot_every
    if snapshot_dir is not None:
        doc["shadows"]["snapshot_dir"] = snapshot_dir
    doc["timeouts"]["failure_detect"] = failure_detect
    del doc["timeouts"]["connect"]  # the default: a controller's patience with a member
    return doc
