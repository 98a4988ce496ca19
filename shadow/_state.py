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

from shadowgrad.errors import ShadowgradError

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

#: every allowed ``(state, trigger) -> new state``; a pair not here is impossible
TABLE: dict[tuple[NodeState, Trigger], NodeState] = {
    # a load installs a whole state from anywhere but STOPPED (and clears a divergence)
    **{(s, T.LOAD): S.LIVE for s in (S.UNLOADED, S.CLONING, S.LIVE, S.DIVERGED, S.RESYNCING)},
    (S.UNLOADED, T.CLONE): S.CLONING,
    (S.LIVE, T.CLONE): S.LIVE,  # overtaken: a load while the replica was asked
    (S.DIVERGED, T.CLONE): S.DIVERGED,  # overtaken: a load, then a divergence
    (S.CLONING, T.CLONE_FAILED): S.UNLOADED,
    (S.LIVE, T.CLONE_FAILED): S.LIVE,  # overtaken: a load during the fetch
    (S.DIVERGED, T.CLONE_FAILED): S.DIVERGED,  # overtaken: a load, then a divergence
    (S.LIVE, T.DIVERGE): S.DIVERGED,
    (S.DIVERGED, T.DIVERGE): S.DIVERGED,  # the hole moved earlier
    (S.RESYNCING, T.DIVERGE): S.RESYNCING,  # the hole moved earlier during the fetch
    (S.DIVERGED, T.RESYNC): S.RESYNCING,
    (S.LIVE, T.RESYNC): S.LIVE,  # overtaken: a load while the replica was asked
    (S.RESYNCING, T.RESYNC_FAILED): S.DIVERGED,
    (S.LIVE, T.RESYNC_FAILED): S.LIVE,  # overtaken: a load during the fetch
    (S.DIVERGED, T.RESYNC_FAILED): S.DIVERGED,  # overtaken: a load, then a divergence
    (S.RESYNCING, T.RESYNCED): S.LIVE,
    (S.LIVE, T.RESYNCED): S.LIVE,  # overtaken: a load during the fetch
    (S.DIVERGED, T.RESYNCED): S.LIVE,  # overtaken: a load, a divergence; the install clears it
    **{(s, T.STOP): S.STOPPED for s in S},  # stop is idempotent
}
del S, T


class StateError(ShadowgradError, RuntimeError):
    """A lifecycle transition the table does not allow (a bug in the node)."""

    def __init__(self, state: NodeState, trigger: Trigger) -> None:
        self.state = state
        self.trigger = trigger
        allowed = sorted(t.value for (s, t) in TABLE if s is state)
        super().__init__(
            f"impossible shadow lifecycle transition: {trigger.value!r} in state "
            f"{state.value!r} (allowed there: {', '.join(allowed) or 'nothing'})"
        )


def transition(state: NodeState, trigger: Trigger) -> NodeState:
    """The state after ``trigger`` in ``state``; :class:`StateError` when impossible."""
    new = TABLE.get((state, trigger))
    if new is None:
        raise StateError(state, trigger)
    return new
