"""Small process-group helpers (no-ops without torch.distributed); device-agnostic."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Group"]


class Group:
    """The trainers' process group: rank, world size, and the few collectives the hooks use.

    Collectives run on ``device`` (CUDA for NCCL, CPU otherwise).
    """

    def __init__(self, pg: Any | None) -> None:
        self.pg = pg
        self.active = dist.is_available() and dist.is_initialized()
        if self.active:
            self.rank = dist.get_rank(pg)
            self.world = dist.get_world_size(pg)
            backend = str(dist.get_backend(pg)).lower()
            self.device = (
                torch.device("cuda", torch.cuda.current_device())
                if "nccl" in backend
                else torch.device("cpu")
            )
        else:
            self.rank, self.world, self.device = 0, 1, torch.device("cpu")

    def all_min(self, value: int) -> int:
        if not self.active or self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.pg)
        return int(t.item())

    def broadcast_object(self, obj: Any, src: int) -> Any:
        if not self.active or self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self._global(src), group=self.pg, device=self.device)
        return box[0]

    def broadcast_bytes(self, data: bytes | None, src: int) -> bytes:
        """Broadcast a byte string from ``src`` (its length first, then the bytes)."""
        if not self.active or self.world == 1:
            assert data is not None
            return data
        n = torch.tensor(
            [len(data) if data is not None else 0], dtype=torch.int64, device=self.device
        )
        dist.broadcast(n, src=self._global(src), group=self.pg)
        size = int(n.item())
        if self.rank == src:
            assert data is not None
            buf = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8)
                if size
                else torch.empty(0, dtype=torch.uint8)
            )
            buf = buf.to(self.device)
        else:
            buf = torch.empty(size, dtype=torch.uint8, device=self.device)
        if size:
            dist.broadcast(buf, src=self._global(src), group=self.pg)
        return bytes(buf.cpu().numpy().tobytes())

    def _global(self, group_rank: int) -> int:
        if self.pg is None:
            return group_rank
        return int(dist.get_global_rank(self.pg, group_rank))
