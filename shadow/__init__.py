"""shadowgrad.shadow: the shadow node — receive, verify and reassemble FINAL gradient chunks,
replay the optimizer bit-exactly, serve and persist state (docs/shadow.md, docs/replay.md).

Main entry points (imported lazily, so ``import shadowgrad.shadow`` stays cheap):

* :class:`~shadowgrad.shadow.node.ShadowNode`, :class:`~shadowgrad.shadow.node.NodeOptions` —
  one shadow (``shadowgrad shadow --spec job.toml --id K`` runs one);
* :class:`~shadowgrad.shadow.control.ShadowClient` — the control-service client (status, hold,
  release, fetch, load, snapshot);
* :class:`~shadowgrad.shadow.replay.ShardReplayer` — the bit-exact optimizer step of one shard.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ShadowNode", "NodeOptions", "ShadowClient", "ShardReplayer"]

_WHERE = {
    "ShadowNode": "shadowgrad.shadow.node",
    "NodeOptions": "shadowgrad.shadow.node",
    "ShadowClient": "shadowgrad.shadow.control",
    "ShardReplayer": "shadowgrad.shadow.replay",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'shadowgrad.shadow' has no attribute {name!r}")
