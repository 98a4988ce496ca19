"""The Young-Daly planner (``shadowgrad plan``) reproduces the two worked examples of
docs/operations.md (1296 h of training, MTBF 3.09 h: hourly checkpoints costing 0.05 h leave
78.82 % useful, every 0.28 h at 0.0125 h 91.00 %) and its optimum is the ledger's maximum."""

from __future__ import annotations

import json
import math

import pytest

from shadowgrad.cli import main
from shadowgrad.planner import daly_interval, ledger, young_interval


@pytest.mark.parametrize(
    ("interval", "cost", "lost", "overhead", "useful"),
    [
        (1.0, 0.05, 209.71, 64.80, 78.82),
        (0.28, 0.0125, 58.72, 57.86, 91.00),
    ],
)
def test_worked_examples(
    interval: float, cost: float, lost: float, overhead: float, useful: float
) -> None:
    r = ledger(total=1296, mtbf=3.09, interval=interval, cost=cost)
    assert round(r.failures, 2) == 419.42
    assert round(r.lost, 2) == lost and round(r.overhead, 2) == overhead
    assert round(r.useful_percent, 2) == useful


def test_young_is_the_ledgers_optimum_and_daly_refines_it() -> None:
    c, m = 0.05, 3.09
    y = young_interval(c, m)
    assert y == pytest.approx(math.sqrt(2 * c * m))
    best = ledger(total=1296, mtbf=m, interval=y, cost=c).useful
    for f in (0.5, 0.8, 0.95, 1.05, 1.25, 2.0):
        assert ledger(total=1296, mtbf=m, interval=y * f, cost=c).useful < best
    d = daly_interval(c, m)
    x = c / (2 * m)
    assert d == pytest.approx(math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c)
    assert daly_interval(10.0, 3.0) == 3.0  # c >= 2M: the MTBF itself


def test_plan_cli_compares_policies_and_rejects_bad_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(
            [
                "plan",
                "--mtbf",
                "3.09h",
                "--total",
                "1296h",
                "--interval",
                "1h",
                "--cost",
                "3m",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["policy"] for r in rows] == ["periodic"]
    assert round(rows[0]["useful_percent"], 2) == 78.82
    assert (
        main(
            [
                "plan",
                "--mtbf",
                "3.09h",
                "--cost",
                "3m",
                "--iteration",
                "1.2s",
                "--stall",
                "0.01s",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["policy"] for r in rows] == [
        "periodic",
        "periodic (Daly)",
        "shadowgrad (every iteration)",
    ]
    assert rows[2]["useful"] > rows[0]["useful"]
    assert main(["plan", "--mtbf", "0h", "--cost", "3m"]) == 1
    assert "mtbf must be > 0" in capsys.readouterr().err
    assert main(["plan", "--mtbf", "3", "--cost", "3m"]) == 1  # a duration needs its unit
    assert "--mtbf" in capsys.readouterr().err
