"""``init_process_group``: ``torch.distributed.init_process_group`` that survives torchrun's
in-place restarts (``--max-restarts``).

With torch 2.13, every restart of a worker group under torchrun reuses the agent's TCPStore
without a per-attempt prefix, so a restarted group can read the previous attempt's gloo
addresses: its ``connectFullMesh`` then connects to ports of dead workers and fails or hangs (a
plain all-reduce script without shadowgrad fails at its second restart; pytorch/pytorch#167288 is
the NCCL flavour). Under torchelastic (``TORCHELASTIC_RESTART_COUNT`` set) this function gives
the default process group its own ``PrefixStore`` per attempt; anywhere else it is
``dist.init_process_group`` unchanged.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch.distributed as dist

__all__ = ["init_process_group"]


def init_process_group(backend: str = "gloo", *, timeout_s: float = 1800.0, **kwargs: Any) -> None:
    """Initialise the default process group from torchrun's environment. ``kwargs`` go to
    ``dist.init_process_group``; with ``init_method`` or ``store`` given, or outside
    torchelastic, nothing is changed."""
    timeout = datetime.timedelta(seconds=timeout_s)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or "init_method" in kwargs or "store" in kwargs:
        dist.init_process_group(backend, timeout=timeout, **kwargs)
        return
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    base = dist.TCPStore(  # type: ignore[attr-defined]
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=not agent and rank == 0,
        timeout=timeout,
        wait_for_workers=False,
    )
    store = dist.PrefixStore(f"shadowgrad/attempt_{attempt}", base)  # type: ignore[attr-defined]
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world, timeout=timeout, **kwargs
    )
