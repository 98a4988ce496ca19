"""Real shadow nodes for tests, benches and demos: every shadow of a job spec as a thread of this
process (:class:`ShadowCluster`), bound to the spec's addresses and control ports. Nothing in a
shadow deployment needs this module."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from shadowgrad._testing import TOKEN
from shadowgrad.boxes import assemble_full
from shadowgrad.config import JobSpec
from shadowgrad.control_client import ShadowClient
from shadowgrad.layout import Layout
from shadowgrad.shadow.node import ShadowNode

__all__ = ["ShadowCluster", "shadow_cluster"]


class ShadowCluster:
    """Real :class:`~shadowgrad.shadow.node.ShadowNode` s for every shadow of ``spec``, as threads
    of this process, bound to the spec's addresses and control ports."""

    def __init__(self, spec: JobSpec, token: str = TOKEN) -> None:
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
        self.clients = [ShadowClient(n.control_endpoint, token, timeout_s=30.0) for n in self.nodes]

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

    def full_state(
        self, layout: Layout, iteration: int | None = None
    ) -> tuple[int, dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """Every shard's state (replica 0) at ``iteration`` glued into full tensors."""
        exports = []
        its = set()
        for shard in range(layout.num_shards):
            res = self.clients[layout.shadows_of_shard(shard)[0]].fetch(iteration)
            its.add(res.iteration)
            exports.append([res.states[b] for b in range(len(layout.shard_entries(shard)))])
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
