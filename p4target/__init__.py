"""shadowgrad.p4target: the P4 software target, a stand-in for bmv2 ``simple_switch_grpc``.

It takes P4_16 v1model *source*, checks and compiles it once into Python code
(:class:`Pipeline`), executes packets with bmv2's v1model semantics (:class:`Dataplane`), emits a
p4c-compatible P4Info, and is served over P4Runtime with ports on veths, loopback UDP or
in-process (:mod:`.switch`, the ``sg-switch-grpc`` command; ``shadowgrad-p4c`` compiles). Needs
the ``shadowgrad[testbed]`` extra; see docs/p4target.md and docs/switch-target.md. The emulation
testbed that runs jobs on it (topologies, Mininet, scenarios, the demo) is
:mod:`shadowgrad.bmv2_testbed`.
"""

from .dataplane import (
    CloneSession,
    Dataplane,
    DataplaneError,
    Exact,
    Lpm,
    OptionalMatch,
    Range,
    TableEntry,
    Ternary,
)
from .pipeline import P4CompileError, Pipeline

__all__ = [
    "Pipeline",
    "P4CompileError",
    "Dataplane",
    "DataplaneError",
    "TableEntry",
    "Exact",
    "Lpm",
    "Ternary",
    "Range",
    "OptionalMatch",
    "CloneSession",
]
