"""The v1model traffic-manager rules (``p4target/v1model.py``): the decision tables, and
that both execution paths take them from that one module (the fast path inlines them)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest

from shadowgrad.p4target import dataplane, pipeline, v1model
from shadowgrad.p4target.codegen import straight
from shadowgrad.p4target.codegen.straight import FastPathUnsupported, _inline_v1model
from shadowgrad.p4target.pipeline import Pipeline
from shadowgrad.p4target.v1model import (
    DROP,
    FORWARD,
    PKT_NORMAL,
    PKT_RECIRC,
    PKT_REPLICATION,
    PKT_RESUBMIT,
    RECIRCULATE,
    RESUBMIT,
    TRANSMIT,
    end_of_egress,
    end_of_ingress,
)

PROGS = Path(__file__).parent / "p4progs"
GROUPS = {1: [(1, 0), (2, 5)], 2: []}
D = 511


@pytest.mark.parametrize(
    ("resubmit", "grp", "spec", "itype", "want"),
    [
        (True, 1, 3, PKT_NORMAL, (RESUBMIT, None, PKT_RESUBMIT)),  # resubmit first
        (True, 0, D, PKT_NORMAL, (RESUBMIT, None, PKT_RESUBMIT)),
        (False, 1, 3, PKT_NORMAL, (FORWARD, GROUPS[1], PKT_REPLICATION)),  # mcast over unicast
        (False, 1, D, PKT_NORMAL, (FORWARD, GROUPS[1], PKT_REPLICATION)),  # ... and over drop
        (False, 2, 3, PKT_NORMAL, (DROP, "mcast_group_unknown", PKT_NORMAL)),  # empty group
        (False, 9, 3, PKT_NORMAL, (DROP, "mcast_group_unknown", PKT_NORMAL)),  # unknown group
        (False, 0, D, PKT_NORMAL, (DROP, "ingress_drop", PKT_NORMAL)),
        (False, 0, 0, PKT_NORMAL, (FORWARD, ((0, 0),), PKT_NORMAL)),  # untouched: port 0
        (False, 0, 7, PKT_RESUBMIT, (FORWARD, ((7, 0),), PKT_RESUBMIT)),  # type unchanged
    ],
)
def test_end_of_ingress_precedence(
    resubmit: bool, grp: int, spec: int, itype: int, want: tuple[int, Any, int]
) -> None:
    got = end_of_ingress(resubmit, grp, spec, itype, GROUPS, D)
    assert got[0] == want[0] and got[1] == want[1]
    if got[0] != DROP:
        assert got[2] == want[2]


def test_end_of_egress_precedence() -> None:
    assert end_of_egress(D, D, True) == (DROP, "egress_drop")  # drop wins over recirculate
    assert end_of_egress(D, D, False) == (DROP, "egress_drop")
    assert end_of_egress(D + 1, D, True) == (RECIRCULATE, PKT_RECIRC)
    assert end_of_egress(D + 1, D, False) == (TRANSMIT, None)
    assert end_of_egress(3, D, False) == (TRANSMIT, None)
    assert v1model.egress_spec_at_egress(D) == D + 1


def test_drop_reasons_are_the_dataplanes() -> None:
    assert dataplane.DROP_REASONS is v1model.DROP_REASONS
    for reason in ("ingress_drop", "egress_drop", "mcast_group_unknown"):
        assert reason in v1model.DROP_REASONS


def test_the_rules_are_written_once() -> None:
    """No second copy of the precedence rules or constants outside v1model.py."""
    for mod in (dataplane, straight, pipeline):
        src = inspect.getsource(mod)
        for literal in (
            "'mcast_group_unknown'",
            '"mcast_group_unknown"',
            '"ingress_drop"',
            "'ingress_drop'",
            '"egress_drop"',
            "'egress_drop'",
            "281474976710655",
            "0xFFFFFFFFFFFF",
            "drop_port + 1",
        ):
            assert literal not in src, (mod.__name__, literal)
        tree = ast.parse(src)
        for node in ast.walk(tree):  # no module-level PKT_*/MAX_* definitions of their own
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    assert not (isinstance(t, ast.Name) and t.id.startswith(("PKT_", "MAX_"))), (
                        mod.__name__,
                        t.id,
                    )


def test_fast_path_inlines_the_v1model_rules() -> None:
    fast = Pipeline.compile(PROGS / "mcast.p4").source.split("def fast(", 1)[1]
    assert "drop(port, 'mcast_group_unknown')" in fast
    assert "drop(port, 'ingress_drop')" in fast
    assert "drop(port, 'egress_drop')" in fast
    assert f"s_instance_type = {PKT_REPLICATION}" in fast
    assert "end_of_ingress" not in fast and "end_of_egress" not in fast  # inlined, not called


def _bad_shape(resubmit: bool, egress_spec: int) -> tuple[int, Any]:
    while egress_spec:
        pass
    return DROP, "x"


def _no_verdict(resubmit: bool, egress_spec: int) -> tuple[int, Any]:
    if egress_spec:
        return DROP, "x"
    return RESUBMIT, None


def _falls_through(resubmit: bool, egress_spec: int) -> tuple[int, Any]:
    if egress_spec:
        return DROP, "x"
    return None  # type: ignore[return-value]


def test_the_inliner_refuses_other_shapes() -> None:
    args = {"resubmit": ast.Constant(False), "egress_spec": ast.Name("s", ast.Load())}
    drop = {DROP: lambda r: [ast.Expr(ast.Call(ast.Name("drop", ast.Load()), [r], []))]}
    with pytest.raises(FastPathUnsupported, match="unexpected while"):
        _inline_v1model(_bad_shape, args, drop)
    with pytest.raises(FastPathUnsupported, match="unexpected return"):
        _inline_v1model(_no_verdict, args, drop)
    with pytest.raises(FastPathUnsupported, match="unexpected return"):
        _inline_v1model(_falls_through, args, drop)
    with pytest.raises(FastPathUnsupported, match="parameters"):
        _inline_v1model(_no_verdict, {"resubmit": ast.Constant(False)}, drop)
    # a request folded away makes its verdict unreachable, so it needs no statements
    folded = _inline_v1model(
        _no_verdict, {"resubmit": ast.Constant(False), "egress_spec": ast.Constant(1)}, drop
    )
    assert ast.unparse(ast.Module(folded, [])) == "drop('x')"
