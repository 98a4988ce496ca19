"""Test support for shadowgrad, in one place (as ``torch.distributed.checkpoint``'s testing
utilities are): what the tests, the benchmarks and ``tools/`` use to run shadowgrad's parts
without a real cluster. No library module imports this package.

=================  ===========================================================================
module             what it holds
=================  ===========================================================================
``cluster``        :class:`ShadowCluster`, real shadow nodes as threads of this process:
                   :func:`shadow_cluster` (a job spec's shadows at its addresses) and
                   :func:`producer_cluster` (shadows fed by a test :class:`Producer`)
``training``       reference CPU training: :class:`Case`, :class:`RefTrainer`, two small
                   models, a trainer's tensors vs a shard's (``compare_shard``, ...)
``producer``       the trainers' side of the wire: :class:`Producer` (DATA, COMMIT, NACK
                   answers, :class:`Faults`), :class:`Records` (single records)
``specs``          :data:`TOKEN`, the clusters' job id and key, :func:`bound_spec` (a job at
                   addresses already bound); the library's builders are
                   :mod:`shadowgrad.specs` (``loopback_spec``, ``switch_spec``, ``spec_toml``)
``processes``      :class:`Ranks` (DDP ranks as processes), the P4 target's command line,
                   the soak tool, :func:`wait_for`
``fakes``          in-memory fakes of the seams: switch driver, shadow statuses, P4Runtime
                   dataplane and target
``bmv2``           a switch binary over P4Runtime and veths (``RealBmv2Backend``, root only;
                   needs the ``testbed`` extra)
=================  ===========================================================================

Free ports come from :mod:`shadowgrad.freeports` (library code). Importing this package is cheap:
the names below load their module (torch, the shadow node, ...) on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import ShadowCluster, producer_cluster, shadow_cluster
    from .processes import Ranks, wait_for
    from .producer import Faults, Producer
    from .specs import TOKEN
    from .training import Case, RefTrainer

__all__ = [
    "TOKEN",
    "Case",
    "Faults",
    "Producer",
    "Ranks",
    "RefTrainer",
    "ShadowCluster",
    "producer_cluster",
    "shadow_cluster",
    "wait_for",
]

_HOME = {
    "TOKEN": "specs",
    "Case": "training",
    "Faults": "producer",
    "Producer": "producer",
    "Ranks": "processes",
    "RefTrainer": "training",
    "ShadowCluster": "cluster",
    "producer_cluster": "cluster",
    "shadow_cluster": "cluster",
    "wait_for": "processes",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
