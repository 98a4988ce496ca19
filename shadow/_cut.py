"""The consistent-cut bookkeeping of one shadow (docs/shadow.md, "Consistent apply").

:class:`CutTracker` is pure: no sockets, no threads, no locks, no clock (a caller passes
``now``). It owns what decides when an iteration may be applied and which states must be
kept:

* the **shard view**: the newest READY record of every peer shadow (:class:`PeerView`);
* this shadow's own progress: ``last_applied``, the iterations after it that are ready
  (complete, verified, with their COMMIT), and where it diverged;
* the **two-phase apply rule** (:meth:`CutTracker.can_apply`);
* **I\\*** as seen here (:meth:`CutTracker.update_istar`, never lowered), the **holds**, and
  from both the retention of states (:meth:`CutTracker.retain_before`,
  :meth:`CutTracker.keeps`).

The cut itself (min over shards of the best replica) and what a diverged replica can serve are
the restore-point rule's (:func:`shadowgrad.restore.consistent_cut`,
:func:`shadowgrad.restore.usable`), not repeated here.
:class:`~shadowgrad.shadow.node.ShadowNode` calls the tracker under its lock and does the I/O
(READY records out, states kept or dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shadowgrad import wire
from shadowgrad.restore import consistent_cut, usable

__all__ = ["UNKNOWN", "CutTracker", "PeerView"]

#: nothing known (a peer not heard from, I* before the first cut)
UNKNOWN = -2


@dataclass
class PeerView:
    """The newest READY record of one peer shadow."""

    ready_through: int = UNKNOWN
    last_applied: int = UNKNOWN
    diverged: bool = False
    seq: int = -1
    seen: float = 0.0  # the caller's clock when the record arrived

    def usable(self) -> int:
        """The newest iteration this peer can serve (a diverged one: up to its hole)."""
        return usable(self.last_applied, self.ready_through + 1 if self.diverged else None)


class CutTracker:
    """One shadow's view of the consistent cut. ``shadow_id``: this shadow; ``retain_cut``:
    keep the state of I* when this shard applies past it (``NodeOptions.retain_cut``).

    Nothing is known before :meth:`load` (the layout says which shadows hold which shard)."""

    def __init__(self, shadow_id: int, *, retain_cut: bool = True) -> None:
        self.id = shadow_id
        self.retain_cut = retain_cut
        #: this shadow's shard (None: not loaded) and, per shard, the shadows holding it
        self.shard: int | None = None
        self.members: tuple[tuple[int, ...], ...] = ()
        #: this shadow's own progress
        self.last_applied = -1
        self.diverged_at: int | None = None
        self._ready: set[int] = set()  # iterations after last_applied that are ready here
        #: the shard view: the newest READY record per peer shadow
        self.peers: dict[int, PeerView] = {}
        #: I* as seen here (UNKNOWN until every shard is known); never lowered within a load
        self.istar = UNKNOWN
        #: iterations held for a restore (their state is kept until released)
        self.holds: set[int] = set()

    # ------------------------------------------------------------ sessions

    @property
    def loaded(self) -> bool:
        return self.shard is not None

    @property
    def num_shards(self) -> int:
        return len(self.members)

    def load(
        self, iteration: int, *, shard: int, members: Sequence[Sequence[int]], keep: bool
    ) -> None:
        """A state of ``iteration`` was installed (``load``, clone). ``members[s]``: the
        shadows of shard ``s``. ``keep``: a re-seed of the same session (what is ready after
        ``iteration``, the peers' records and the holds stay); otherwise all is forgotten."""
        self.shard = shard
        self.members = tuple(tuple(m) for m in members)
        self.last_applied = iteration
        self.diverged_at = None
        self.istar = UNKNOWN
        if keep:
            self._ready = {i for i in self._ready if i > iteration}
        else:
            self._ready.clear()
            self.peers.clear()
            self.holds.clear()

    def resynced(self, iteration: int) -> None:
        """A replica's state of ``iteration`` replaced this shadow's (resync after divergence);
        what is ready after it stays, the view and the holds too."""
        self.last_applied = iteration
        self._ready = {i for i in self._ready if i > iteration}
        self.diverged_at = None

    # ------------------------------------------------------------ own progress

    def mark_ready(self, it: int) -> None:
        """Iteration ``it`` is ready here: every owned byte verified, COMMIT(it) arrived.
        Readiness is durable until ``it`` is applied or a load/resync passes it."""
        if it > self.last_applied:
            self._ready.add(it)

    def is_ready(self, it: int) -> bool:
        return it in self._ready

    def ready_through(self) -> int:
        """The largest ``r`` such that every iteration ``last_applied+1 .. r`` is ready here
        (short of the hole when diverged)."""
        i = self.last_applied
        while i + 1 in self._ready and (self.diverged_at is None or i + 1 < self.diverged_at):
            i += 1
        return i

    def applied(self, it: int) -> None:
        """This shadow applied iteration ``it``."""
        self.last_applied = it
        self._ready.discard(it)

    def diverge(self, it: int) -> bool:
        """A hole at ``it`` cannot be repaired: no iteration ``>= it`` is applied until a
        resync or load. False (nothing changes) when diverged at or before ``it`` already."""
        if self.diverged_at is not None and self.diverged_at <= it:
            return False
        self.diverged_at = it
        return True

    def announcement(self) -> tuple[wire.ReadyState, int, int]:
        """What this shadow's READY record says: (state, header iteration, last_applied);
        -1 means none (the wire encodes it as ``2**64 - 1``)."""
        if self.diverged_at is not None:
            return wire.ReadyState.DIVERGED, self.diverged_at, self.last_applied
        r = self.ready_through()
        state = wire.ReadyState.APPLIED if r == self.last_applied else wire.ReadyState.READY
        return state, r, self.last_applied

    # ------------------------------------------------------------ the shard view

    def on_ready(
        self,
        sender: int,
        seq: int,
        *,
        last_applied: int,
        iteration: int,
        diverged: bool,
        now: float,
    ) -> str:
        """A READY record of peer ``sender`` (checked by the caller: a peer of this layout,
        its shard and replica right). Returns the rx reason: ``ready``, or ``ready_stale``
        for a record not newer (``seq``) than the last one taken from that peer."""
        peer = self.peers.get(sender)
        if peer is None:
            peer = self.peers[sender] = PeerView()
        if seq <= peer.seq:
            return "ready_stale"
        peer.seq = seq
        peer.seen = now
        peer.last_applied = last_applied
        peer.diverged = diverged
        # a diverged shard is stuck at ``iteration``: ready through the one before
        peer.ready_through = max(last_applied, iteration - 1 if diverged else iteration)
        return "ready"

    def _replicas(self) -> list[list[tuple[int, int]]]:
        """Per shard: (ready_through, last_applied) of every replica known here."""
        out: list[list[tuple[int, int]]] = []
        for shadows in self.members:
            known = []
            for sid in shadows:
                if sid == self.id:
                    known.append((self.ready_through(), self.last_applied))
                else:
                    p = self.peers.get(sid)
                    if p is not None:
                        known.append((p.ready_through, p.usable()))
            out.append(known)
        return out

    def shard_view(self) -> list[tuple[int, int]]:
        """Per shard: (best ready_through, best last_applied) over its replicas as seen here
        (UNKNOWN for a shard none of whose replicas is known)."""
        return [
            (max((r for r, _ in k), default=UNKNOWN), max((a for _, a in k), default=UNKNOWN))
            for k in self._replicas()
        ]

    def replica_applied(self, it: int) -> bool:
        """Whether a replica of this shard (another shadow), not diverged, reports ``it``
        applied."""
        if self.shard is None:
            return False
        for sid in self.members[self.shard]:
            p = self.peers.get(sid) if sid != self.id else None
            if p is not None and not p.diverged and p.last_applied >= it:
                return True
        return False

    # ------------------------------------------------------------ decisions

    def can_apply(self, i: int) -> bool:
        """The two-phase rule for ``i``: this shadow is ready for ``i`` and not diverged at or
        before it; every shard has a replica ready through ``i`` and one that applied
        ``i - 1``."""
        if self.shard is None or i != self.last_applied + 1 or i not in self._ready:
            return False
        if self.diverged_at is not None and i >= self.diverged_at:
            return False
        view = self._replicas()
        ready = consistent_cut([r for r, _ in k] for k in view)
        applied = consistent_cut([a for _, a in k] for k in view)
        return ready is not None and applied is not None and ready >= i and applied >= i - 1

    def cut(self) -> int | None:
        """The cut of the shard view now (what I* would move to; None: a shard unknown)."""
        return consistent_cut([a for _, a in k] for k in self._replicas())

    def update_istar(self) -> bool:
        """Move I* up to the cut of the shard view when it is ahead; True when it moved.
        I* never moves back (a view that fell behind leaves it where it is)."""
        if self.shard is None:
            return False
        cand = self.cut()
        if cand is None or cand <= self.istar:
            return False
        self.istar = cand
        return True

    def retain_before(self, i: int) -> bool:
        """Whether the state of ``i - 1`` must be kept when applying ``i``: it may be I* (this
        shard applies ahead of the cut; single-shard layouts: I* is this shard's progress) or
        it is held."""
        multi = self.num_shards > 1
        return (self.retain_cut and multi and self.istar < i) or (i - 1) in self.holds

    def keeps(self, it: int) -> bool:
        """Whether a retained state of ``it`` is still needed: held, or I* while this shard
        is past it."""
        return it in self.holds or it == self.istar < self.last_applied

    def hold(self, it: int) -> None:
        self.holds.add(it)

    def release(self, it: int) -> None:
        self.holds.discard(it)
