"""The shadow node's lifecycle: one enum, one ``(state, trigger) -> state`` table, one function.

Pure (no sockets, threads or logging): :class:`shadow.node.ShadowNode` holds the state under
its ``_lock``, moves it with :func:`transition` only and logs every move as the event
``shadow.state`` (``shadowgrad.events.SHADOW_STATE``).

States (docs/shadow.md "Lifecycle"):

- ``UNLOADED``: no shard state yet (a new or restarted shadow); it waits for a ``load`` or,
  with replication > 1, clones its shard from a replica.
- ``CLONING``: unloaded, fetching its shard from a replica that answered with a usable state.
- ``LIVE``: loaded, applying iterations as they become ready.
- ``DIVERGED``: loaded, with a hole it could not repair; applies nothing past it and waits to
  resynchronise from a replica (or for a ``load``).
- ``RESYNCING``: diverged, fetching and installing a replica's newer state.
- ``STOPPED``: the threads are stopped and the sockets closed (terminal).

The fetches of ``CLONING`` and ``RESYNCING`` run on the apply thread without the lock, so a
``load`` (control thread) and a divergence (receive thread) may overtake them: the table lists
those interleavings too (marked "overtaken"), with the state the node's data then has; any
other pair is impossible and :func:`transition` raises :class:`StateError`.
"""

from __future__ import annotations

import enum

from shadowgrad.fsm import TransitionError, TransitionTable, rule

__all__ = ["TABLE", "NodeState", "StateError", "Trigger", "transition"]


class NodeState(enum.Enum):
    UNLOADED = "unloaded"
    CLONING = "cloning"
    LIVE = "live"
    DIVERGED = "diverged"
    RESYNCING = "resyncing"
    STOPPED = "stopped"


class Trigger(enum.Enum):
    """What moves the state (the ``reason`` of the ``shadow.state`` event)."""

    #: a shard state was installed: ``load`` (bootstrap, restore, re-seed) or a clone's install
    LOAD = "load"
    #: an unloaded shadow starts fetching its shard from a replica
    CLONE = "clone"
    #: that fetch or its install failed
    CLONE_FAILED = "clone_failed"
    #: a hole cannot be repaired (or a replay failed): the cut tracker diverged
    DIVERGE = "diverge"
    #: a diverged shadow starts fetching a replica's state past its hole
    RESYNC = "resync"
    #: that fetch or its install failed
    RESYNC_FAILED = "resync_failed"
    #: the replica's state was installed (the cut tracker resynced)
    RESYNCED = "resynced"
    #: ``stop``
    STOP = "stop"


S, T = NodeState, Trigger


class StateError(TransitionError, RuntimeError):
    """A lifecycle transition the table does not allow (a bug in the node)."""

    def explain(self) -> str:
        allowed = sorted(t.value for t in self.allowed)
        return (
            f"impossible shadow lifecycle transition: {self.trigger.value!r} in state "
            f"{self.state.value!r} (allowed there: {', '.join(allowed) or 'nothing'})"
        )


#: every allowed ``(state, trigger) -> new state``; a pair not here is impossible. The
#: "overtaken" rules keep the state: a ``load`` (or a load, then a divergence) overtook a fetch.
TABLE: TransitionTable[NodeState, Trigger] = TransitionTable(
    [
        # a load installs a whole state from anywhere but STOPPED (and clears a divergence)
        rule((S.UNLOADED, S.CLONING, S.LIVE, S.DIVERGED, S.RESYNCING), T.LOAD, S.LIVE),
        rule(S.UNLOADED, T.CLONE, S.CLONING),
        rule((S.LIVE, S.DIVERGED), T.CLONE),  # overtaken: the replica was asked
        rule(S.CLONING, T.CLONE_FAILED, S.UNLOADED),
        rule((S.LIVE, S.DIVERGED), T.CLONE_FAILED),  # overtaken during the fetch
        rule(S.LIVE, T.DIVERGE, S.DIVERGED),
        rule((S.DIVERGED, S.RESYNCING), T.DIVERGE),  # the hole moved earlier (during the fetch)
        rule(S.DIVERGED, T.RESYNC, S.RESYNCING),
        rule(S.LIVE, T.RESYNC),  # overtaken: a load while the replica was asked
        rule(S.RESYNCING, T.RESYNC_FAILED, S.DIVERGED),
        rule((S.LIVE, S.DIVERGED), T.RESYNC_FAILED),  # overtaken during the fetch
        # the replica's state was installed; overtaken: a load (and a divergence) during the
        # fetch, which the install clears
        rule((S.RESYNCING, S.LIVE, S.DIVERGED), T.RESYNCED, S.LIVE),
        rule(NodeState, T.STOP, S.STOPPED),  # stop is idempotent
    ],
    error=StateError,
)
del S, T


def transition(state: NodeState, trigger: Trigger) -> NodeState:
    """The state after ``trigger`` in ``state``; :class:`StateError` when impossible."""
    return TABLE.move(state, trigger)
