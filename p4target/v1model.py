"""The v1model architecture's constants and traffic-manager rules, in one place.

Both ways this target runs a packet take them from here: the general path in
:mod:`.dataplane` calls :func:`end_of_ingress` and :func:`end_of_egress`, and the straight-line
fast path (:mod:`.codegen.straight`) inlines the *same* functions into the code it generates (it
parses their source, substitutes its locals for the parameters and this module's constants for
their names, folds the branches its programs cannot reach and turns each ``return`` into the
statements for that verdict), so the precedence rules exist once.

Both functions are therefore written in a small, inlinable form: parameters, this module's
``int``/``str`` constants, local assignments, ``if``/``else`` and a ``return`` of a tuple whose
first item is a verdict constant at the end of every path (``codegen.straight`` refuses
anything else with :class:`~.codegen.straight.FastPathUnsupported`, and
``tests/test_p4_v1model.py`` holds them to that).

The end of ingress, in bmv2's order (``simple_switch.cpp``, ``ingress_thread``;
``../shared/reference/v1model.md`` §2.6):

1. I2E clone (``clone_type == CLONE_I2E`` and the session exists): the original bytes,
   re-parsed, metadata reset but for the preserved field list, ``PKT_INGRESS_CLONE``, one copy
   per session replica through egress;
2. the digests go to the controller;
3. - 6. :func:`end_of_ingress`: resubmit, multicast, drop, unicast.

The end of egress (§2.7): E2E clone (``CLONE_E2E``; the packet as after egress,
``PKT_EGRESS_CLONE``, into egress again), then :func:`end_of_egress`: drop, or deparse and
recirculate or transmit (a copy for the CPU port becomes a packet-in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = [
    "CLOCK_MASK",
    "CLONE_E2E",
    "CLONE_I2E",
    "DEFAULT_DROP_PORT",
    "DROP",
    "DROP_REASONS",
    "ENQ_TIMESTAMP_MASK",
    "FORWARD",
    "MAX_GROUP_ID",
    "MAX_PORT",
    "MAX_QDEPTH",
    "MAX_RECIRCULATIONS",
    "PKT_COALESCED",
    "PKT_EGRESS_CLONE",
    "PKT_INGRESS_CLONE",
    "PKT_NORMAL",
    "PKT_RECIRC",
    "PKT_REPLICATION",
    "PKT_RESUBMIT",
    "QUEUE_FIELDS",
    "RECIRCULATE",
    "RESUBMIT",
    "TRANSMIT",
    "egress_spec_at_egress",
    "end_of_egress",
    "end_of_ingress",
]

#: standard_metadata.instance_type values, bmv2's.
PKT_NORMAL: Final = 0
PKT_INGRESS_CLONE: Final = 1
PKT_EGRESS_CLONE: Final = 2
PKT_COALESCED: Final = 3  # not produced by this target
PKT_RECIRC: Final = 4
PKT_REPLICATION: Final = 5
PKT_RESUBMIT: Final = 6

#: Ports are 9 bits; the drop port is bmv2's default ``--drop-port``.
MAX_PORT: Final = 511
DEFAULT_DROP_PORT: Final = 511
#: Multicast group and clone session ids are 1..32767 (bmv2/PI).
MAX_GROUP_ID: Final = 32767
#: A resubmit/recirculate/E2E-clone loop deeper than this is cut off ("recirculation_limit").
MAX_RECIRCULATIONS: Final = 16

#: ingress/egress_global_timestamp: microseconds since the switch started, 48 bits.
CLOCK_MASK: Final = 0xFFFFFFFFFFFF
#: enq_timestamp is 32 bits.
ENQ_TIMESTAMP_MASK: Final = 0xFFFFFFFF
#: enq_qdepth / deq_qdepth are 19 bits (packets).
MAX_QDEPTH: Final = 0x7FFFF
#: The queueing fields of standard_metadata. Both paths set them per copy at the start of
#: egress, and only for a program that reads one (``ProgramFacts.std_reads``, from the checker).
QUEUE_FIELDS: Final = frozenset({"enq_qdepth", "deq_qdepth", "enq_timestamp", "deq_timedelta"})

#: PacketCtx.clone_type of a pending clone (the generated code stores ``CloneType + 1``; 0 = none).
CLONE_I2E: Final = 1
CLONE_E2E: Final = 2

#: Why the engine dropped a packet (``Dataplane.drop_counts()``).
DROP_REASONS: Final = (
    "ingress_drop",  # egress_spec == drop_port at end of ingress
    "egress_drop",  # egress_spec == drop_port after egress
    "mcast_group_unknown",  # mcast_grp set but group not programmed / empty
    "no_packet_in_listener",  # packet to cpu_port with no on_packet_in callback
    "bad_packet_out",  # packet_out without cpu_port or with bad metadata
    "recirculation_limit",  # resubmit/recirculate loop cut off
    "internal_error",  # an exception in the engine (logged); never expected
)

#: Verdicts of :func:`end_of_ingress` and :func:`end_of_egress` (the first item they return).
DROP: Final = 0  # (DROP, reason, ...): count a drop for the reason, nothing goes on
RESUBMIT: Final = 1  # (RESUBMIT, None, instance_type): ingress again, the original packet
FORWARD: Final = 2  # (FORWARD, replicas, instance_type): one egress per (port, rid)
RECIRCULATE: Final = 3  # (RECIRCULATE, instance_type): deparse, then back to the parser
TRANSMIT: Final = 4  # (TRANSMIT, None): deparse and send on egress_port


def egress_spec_at_egress(drop_port: int) -> int:
    """``egress_spec`` when egress starts: ``drop_port + 1``, so that ``mark_to_drop`` in
    egress (``egress_spec = drop_port``) is what drops there."""
    return drop_port + 1


def end_of_ingress(  # noqa: PLR0917
    resubmit: bool,
    mcast_grp: int,
    egress_spec: int,
    instance_type: int,
    groups: Mapping[int, Sequence[tuple[int, int]]],
    drop_port: int,
) -> tuple[int, Any, int]:
    """Steps 3-6 of the end of ingress: what becomes of the packet, given whether a resubmit
    is pending, ``mcast_grp``, ``egress_spec``, ``instance_type`` and the PRE's multicast
    ``groups`` (id -> replicas).

    Returns ``(verdict, detail, instance_type)``: ``(RESUBMIT, None, PKT_RESUBMIT)`` (ingress
    again with the original packet; the original path stops), ``(DROP, reason, _)``, or
    ``(FORWARD, replicas, instance_type)`` — one egress per ``(egress_port, egress_rid)`` with
    that instance type: the group's replicas with ``PKT_REPLICATION`` when ``mcast_grp`` is set
    (multicast overrides unicast; an unknown or empty group drops), else ``egress_spec`` unless
    it is the drop port, with rid 0 and the instance type unchanged.
    """
    if resubmit:
        return RESUBMIT, None, PKT_RESUBMIT
    if mcast_grp:
        replicas = groups.get(mcast_grp)
        if not replicas:
            return DROP, "mcast_group_unknown", instance_type
        return FORWARD, replicas, PKT_REPLICATION
    if egress_spec == drop_port:
        return DROP, "ingress_drop", instance_type
    return FORWARD, ((egress_spec, 0),), instance_type


def end_of_egress(egress_spec: int, drop_port: int, recirculate: bool) -> tuple[int, Any]:
    """Steps 4-7 of a copy's egress, after the E2E clones: ``(DROP, "egress_drop")`` when
    ``egress_spec`` is the drop port, else the copy is deparsed (ComputeChecksum, deparser,
    ``truncate``) and ``(RECIRCULATE, PKT_RECIRC)`` sends it back to the parser with that
    instance type when a recirculate is pending, ``(TRANSMIT, None)`` out of ``egress_port``.
    """
    if egress_spec == drop_port:
        return DROP, "egress_drop"
    if recirculate:
        return RECIRCULATE, PKT_RECIRC
    return TRANSMIT, None
