"""The checkpoint-interval planner: Young-Daly and the effective-training-time ledger.

Failures arrive at random with mean interval ``mtbf``; a periodic checkpoint every ``interval``
stalls training ``cost`` each time; a failure loses, on average, half an interval of work plus
the ``recovery`` time (restart, reload). Over a run of ``total`` hours the ledger is::

    failures        = total / mtbf
    lost            = failures * (interval / 2 + recovery)
    checkpoint cost = (total / interval) * cost
    useful          = (total - lost - checkpoint cost) / total
                    = 1 - interval / (2 mtbf) - cost / interval - recovery / mtbf

(a first-order model; the count of checkpoints is the continuous approximation).
Its optimum is Young's ``sqrt(2 cost mtbf)``; Daly (2006) refines it to
``sqrt(2 c M) (1 + sqrt(c / 2M) / 3 + (c / 2M) / 9) - c`` for ``c < 2M`` (else ``M``).

Per-iteration shadow checkpoints (shadowgrad) checkpoint every iteration with no stall on the
trainers (``cost`` = the measured per-iteration overhead, 0 ideally), so ``interval`` is the
iteration time and a failure loses at most one iteration (plus the sender's backlog).
Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Ledger", "ledger", "young_interval", "daly_interval"]


@dataclass(frozen=True)
class Ledger:
    """The effective-training-time ledger of one policy (all times in hours)."""

    total: float
    mtbf: float
    interval: float
    cost: float
    recovery: float
    failures: float
    lost_per_failure: float
    lost: float
    checkpoints: float
    overhead: float
    useful: float  #: fraction of ``total`` that is useful training

    @property
    def useful_percent(self) -> float:
        return 100.0 * self.useful


def _positive(name: str, value: float, *, zero_ok: bool = False) -> float:
    v = float(value)
    if math.isnan(v) or v < 0 or (v == 0 and not zero_ok) or math.isinf(v):
        raise ValueError(f"{name} must be {'>= 0' if zero_ok else '> 0'} and finite, got {value}")
    return v


def ledger(
    *, total: float, mtbf: float, interval: float, cost: float, recovery: float = 0.0
) -> Ledger:
    """The ledger for checkpoints every ``interval`` costing ``cost`` each (hours)."""
    total = _positive("total", total)
    mtbf = _positive("mtbf", mtbf)
    interval = _positive("interval", interval)
    cost = _positive("cost", cost, zero_ok=True)
    recovery = _positive("recovery", recovery, zero_ok=True)
    failures = total / mtbf
    lost_per = interval / 2 + recovery
    lost = failures * lost_per
    checkpoints = total / interval
    overhead = checkpoints * cost
    useful = (total - lost - overhead) / total
    return Ledger(
        total,
        mtbf,
        interval,
        cost,
        recovery,
        failures,
        lost_per,
        lost,
        checkpoints,
        overhead,
        useful,
    )


def young_interval(cost: float, mtbf: float) -> float:
    """Young's optimal interval ``sqrt(2 cost mtbf)``."""
    return math.sqrt(2 * _positive("cost", cost) * _positive("mtbf", mtbf))


def daly_interval(cost: float, mtbf: float) -> float:
    """Daly's (2006) higher-order optimum: ``sqrt(2cM)(1 + sqrt(c/2M)/3 + (c/2M)/9) - c`` for
    ``c < 2M``, else ``M``."""
    c, m = _positive("cost", cost), _positive("mtbf", mtbf)
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c
