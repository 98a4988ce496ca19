"""The consistent-cut tracker on its own (shadow/_cut.py): no sockets, no threads.

A small cluster of trackers is driven through every order of its events (each shadow's own
events in their order, the shadows' events interleaved in every way): iterations becoming
complete here, READY records sent to the peers, apply attempts, holds and a divergence. After
every event the invariants of docs/shadow.md ("Consistent apply") are checked against the
ground truth of the model (what each shadow really has complete and applied), not against the
trackers' views:

* no shadow applies ``i`` before every shard has a replica with ``i`` complete (and not behind
  a hole), nor before every shard has a replica that applied ``i - 1``;
* every shard can serve the cut of what the shards really applied (a replica at it, or one that
  retained its state), and no shadow's I* is above that cut;
* a shadow's I* never moves backwards; a held iteration stays available until released;
* at the end (all records delivered) every shadow that did not diverge applied everything.

The orders are walked depth first with the states reached so far remembered: two orders that
lead to the same state (trackers, model and the position in every shadow's event list) have
the same futures, so each state's every next event is tried once, and every order is a path
through what was walked. :func:`_orders` counts those orders.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence

import pytest

from shadowgrad import wire
from shadowgrad.layout import shadows_of_shard
from shadowgrad.restore import consistent_cut, usable
from shadowgrad.shadow._cut import UNKNOWN, CutTracker

# ---------------------------------------------------------------- the model


@dataclasses.dataclass
class _Shadow:
    """One shadow: its tracker and the ground truth the tracker does not see."""

    sid: int
    shard: int
    t: CutTracker
    complete: set[int] = dataclasses.field(default_factory=set)  # complete and verified here
    snaps: set[int] = dataclasses.field(default_factory=set)  # retained states (ShadowNode._snaps)
    seq: int = 0
    held: int | None = None

    def available(self, it: int) -> bool:
        return it == self.t.last_applied or it in self.snaps


class _Cluster:
    def __init__(self, shards: int, replication: int, *, retain_cut: bool = True) -> None:
        self.shards = shards
        members = [shadows_of_shard(s, shards, replication) for s in range(shards)]
        self.members = members
        self.nodes: list[_Shadow] = []
        for k in range(shards * replication):
            t = CutTracker(k, retain_cut=retain_cut)
            t.load(-1, shard=k % shards, members=members, keep=False)
            self.nodes.append(_Shadow(k, k % shards, t))

    # ------------------------------------------------------------ events (as ShadowNode does)

    def complete(self, k: int, it: int) -> None:
        n = self.nodes[k]
        n.complete.add(it)
        n.t.mark_ready(it)

    def diverge(self, k: int, it: int) -> None:
        self.nodes[k].t.diverge(it)

    def send(self, k: int, to: Sequence[int] | None = None) -> None:
        """``k``'s current READY record to its peers (``to``: only those)."""
        n = self.nodes[k]
        state, it, last = n.t.announcement()
        n.seq += 1
        for j in range(len(self.nodes)) if to is None else to:
            if j != k:
                self.deliver(j, k, n.seq, state, it, last)

    def deliver(self, j: int, k: int, seq: int, state: wire.ReadyState, it: int, last: int) -> str:
        t = self.nodes[j].t
        old = t.istar
        reason = t.on_ready(
            k,
            seq,
            last_applied=last,
            iteration=it,
            diverged=state is wire.ReadyState.DIVERGED,
            now=0.0,
        )
        if reason == "ready":
            self._update_istar(j, old)
        return reason

    def _update_istar(self, k: int, old: int) -> None:
        n = self.nodes[k]
        if n.t.update_istar():
            assert n.t.istar > old
            self._gc(k)
        assert n.t.istar >= old, "I* moved backwards"

    def _gc(self, k: int) -> None:
        n = self.nodes[k]
        n.snaps = {it for it in n.snaps if n.t.keeps(it)}

    def apply(self, k: int) -> bool:
        """One apply attempt of shadow ``k`` (Applier._next_job + _apply, shadow/_applier.py)."""
        n = self.nodes[k]
        i = n.t.last_applied + 1
        if not n.t.can_apply(i):
            return False
        self._check_may_apply(k, i)
        if n.t.retain_before(i) and (i - 1) not in n.snaps:
            n.snaps.add(i - 1)
        old = n.t.istar
        n.t.applied(i)
        self._update_istar(k, old)
        self._gc(k)
        return True

    def hold(self, k: int) -> None:
        """The controller holds ``k``'s I* (ControlHandlers.hold: only when available)."""
        n = self.nodes[k]
        it = n.t.istar
        if n.held is None and it != UNKNOWN and n.available(it):
            n.t.hold(it)
            n.held = it

    def release(self, k: int) -> None:
        n = self.nodes[k]
        if n.held is not None:
            n.t.release(n.held)
            n.held = None
            self._gc(k)

    # ------------------------------------------------------------ ground truth

    def _has(self, n: _Shadow, i: int) -> bool:
        d = n.t.diverged_at
        return n.t.last_applied >= i or (i in n.complete and (d is None or i < d))

    def _check_may_apply(self, k: int, i: int) -> None:
        for s, shadows in enumerate(self.members):
            ns = [self.nodes[m] for m in shadows]
            assert any(self._has(n, i) for n in ns), f"{k} applies {i}: shard {s} lacks it"
            assert any(n.t.last_applied >= i - 1 for n in ns), (
                f"{k} applies {i}: shard {s} has not applied {i - 1}"
            )

    def true_cut(self) -> int:
        cut = consistent_cut(
            [usable(self.nodes[m].t.last_applied, self.nodes[m].t.diverged_at) for m in shadows]
            for shadows in self.members
        )
        assert cut is not None
        return cut

    def check(self) -> None:
        g = self.true_cut()
        for s, shadows in enumerate(self.members):
            ns = [self.nodes[m] for m in shadows]
            assert any(
                n.available(g) and (n.t.diverged_at is None or g < n.t.diverged_at) for n in ns
            ), f"shard {s} cannot serve the cut {g}: {[(n.t.last_applied, n.snaps) for n in ns]}"
        for n in self.nodes:
            assert n.t.istar <= g, f"shadow {n.sid}: I* {n.t.istar} above what is served ({g})"
            if n.held is not None:
                assert n.available(n.held), f"shadow {n.sid}: held {n.held} was dropped"
                assert n.t.keeps(n.held)

    def settle(self) -> None:
        """Deliver every shadow's record and apply until nothing changes."""
        for _ in range(4 * len(self.nodes) + 20):
            before = [(n.t.last_applied, n.t.istar) for n in self.nodes]
            for k in range(len(self.nodes)):
                self.send(k)
            for k in range(len(self.nodes)):
                while self.apply(k):
                    self.check()
            self.check()
            if before == [(n.t.last_applied, n.t.istar) for n in self.nodes]:
                return

    def clone(self) -> _Cluster:
        c = copy.copy(self)
        c.nodes = []
        for n in self.nodes:
            t = copy.copy(n.t)
            t._ready = set(n.t._ready)
            t.peers = {k: dataclasses.replace(p) for k, p in n.t.peers.items()}
            t.holds = set(n.t.holds)
            c.nodes.append(
                dataclasses.replace(n, t=t, complete=set(n.complete), snaps=set(n.snaps))
            )
        return c

    def signature(self) -> tuple[object, ...]:
        out: list[object] = []
        for n in self.nodes:
            t = n.t
            peers = tuple(
                sorted(
                    (k, p.ready_through, p.last_applied, p.diverged, p.seq)
                    for k, p in t.peers.items()
                )
            )
            ready = tuple(i for i in range(t.last_applied + 1, t.last_applied + 8) if t.is_ready(i))
            out.append(
                (
                    t.last_applied,
                    t.diverged_at,
                    ready,
                    peers,
                    t.istar,
                    tuple(sorted(t.holds)),
                    tuple(sorted(n.snaps)),
                    tuple(sorted(n.complete)),
                    n.seq,
                    n.held,
                )
            )
        return tuple(out)


# ---------------------------------------------------------------- exhaustive orders

#: an event of one shadow: ("C", it) complete, ("S", 0) send READY, ("A", 0) apply attempt,
#: ("H", 0) hold I*, ("R", 0) release, ("D", it) diverge at it
_Event = tuple[str, int]


def _run(c: _Cluster, k: int, e: _Event) -> None:
    kind, it = e
    if kind == "C":
        c.complete(k, it)
    elif kind == "S":
        c.send(k)
    elif kind == "A":
        c.apply(k)
    elif kind == "H":
        c.hold(k)
    elif kind == "R":
        c.release(k)
    elif kind == "D":
        c.diverge(k, it)
    else:
        raise AssertionError(e)


def _orders(lists: Sequence[Sequence[_Event]]) -> int:
    """How many interleavings keep every shadow's events in their order (multinomial)."""
    n = math.factorial(sum(len(x) for x in lists))
    for x in lists:
        n //= math.factorial(len(x))
    return n


def _explore(
    shards: int,
    replication: int,
    lists: Sequence[Sequence[_Event]],
    iterations: int,
    *,
    diverged: frozenset[int] = frozenset(),
    retain_cut: bool = True,
) -> tuple[int, int]:
    """Walk every interleaving of ``lists`` (one per shadow); returns (states, final states)."""
    seen: set[tuple[object, ...]] = set()
    finals = 0
    start = _Cluster(shards, replication, retain_cut=retain_cut)
    stack: list[tuple[_Cluster, tuple[int, ...]]] = [(start, (0,) * len(lists))]
    while stack:
        c, pos = stack.pop()
        key = (pos, c.signature())
        if key in seen:
            continue
        seen.add(key)
        c.check()
        moved = False
        for k, evs in enumerate(lists):
            if pos[k] == len(evs):
                continue
            moved = True
            nxt = c.clone()
            _run(nxt, k, evs[pos[k]])
            nxt.check()
            stack.append((nxt, (*pos[:k], pos[k] + 1, *pos[k + 1 :])))
        if not moved:
            finals += 1
            c.settle()
            for n in c.nodes:
                if n.sid in diverged:
                    continue
                assert n.t.last_applied == iterations - 1, (n.sid, c.signature())
                assert n.t.istar == iterations - 1, n.sid
    return len(seen), finals


def _steps(iterations: int) -> list[_Event]:
    out: list[_Event] = []
    for i in range(iterations):
        out += [("C", i), ("S", 0), ("A", 0)]
    return out


def test_two_shards_one_replica_every_order() -> None:
    """2 shards x 1 replica, 3 iterations: each shadow completes, announces and tries to
    apply every iteration; shadow 0 also holds its I* mid-way and releases it at the end."""
    lists = [
        [*_steps(1), ("H", 0), *_steps(3)[3:], ("R", 0)],
        _steps(3),
    ]
    assert _orders(lists) == math.comb(20, 9)
    states, finals = _explore(2, 1, lists, 3)
    assert finals >= 1 and states > 100


def test_two_shards_one_replica_hold_kept_to_the_end() -> None:
    """A hold never released pins the held iteration while both shards go on applying."""
    lists = [[*_steps(1), ("H", 0), *_steps(3)[3:]], _steps(3)]
    _explore(2, 1, lists, 3)


def test_two_shards_two_replicas_every_order() -> None:
    """2 shards x 2 replicas, 2 iterations (every order of 4 x 6 events)."""
    lists = [_steps(2) for _ in range(4)]
    assert _orders(lists) == math.factorial(24) // math.factorial(6) ** 4
    _explore(2, 2, lists, 2)


def test_two_shards_two_replicas_one_diverges_every_order() -> None:
    """2 shards x 2 replicas, 2 iterations; shadow 3 (shard 1's second replica) has iteration
    1 complete but a hole at 1 (diverged): its records must not count as shard 1 being ready
    for 1; the others get through on shadow 1."""
    lists = [
        _steps(2),
        _steps(2),
        _steps(2),
        [("C", 0), ("S", 0), ("A", 0), ("D", 1), ("C", 1), ("S", 0), ("A", 0)],
    ]
    _explore(2, 2, lists, 2, diverged=frozenset({3}))


def test_two_shards_two_replicas_one_replica_lags_every_order() -> None:
    """2 shards x 2 replicas, 2 iterations; shadow 2 (shard 0's second replica) gets nothing
    until the others are done: shard 0 goes on through shadow 0."""
    lists = [_steps(2), _steps(2), [("S", 0)], _steps(2)]
    seen, _ = _explore(2, 2, lists, 2, diverged=frozenset({2}))
    assert seen > 10


def test_the_walk_catches_a_broken_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The invariants bite: without keeping the state of I*, without rule 3 (apply once every
    shard is ready, whatever they applied) or without rule 2, some order breaks them."""
    with pytest.raises(AssertionError, match="cannot serve the cut"):
        _explore(2, 1, [_steps(3), _steps(3)], 3, retain_cut=False)

    def no_rule3(self: CutTracker, i: int) -> bool:
        view = self.shard_view()
        return i == self.last_applied + 1 and self.is_ready(i) and all(r >= i for r, _ in view)

    monkeypatch.setattr(CutTracker, "can_apply", no_rule3)
    with pytest.raises(AssertionError, match=r"has not applied|cannot serve the cut"):
        _explore(2, 1, [_steps(3), _steps(3)], 3)

    def ready_here(self: CutTracker, i: int) -> bool:
        return i == self.last_applied + 1 and self.is_ready(i)

    monkeypatch.setattr(CutTracker, "can_apply", ready_here)
    with pytest.raises(AssertionError, match="lacks it"):
        _explore(2, 1, [_steps(2), _steps(2)], 2)


# ---------------------------------------------------------------- targeted cases


def _tracker(sid: int = 0, shards: int = 2, replication: int = 1, **kw: bool) -> CutTracker:
    t = CutTracker(sid, **kw)
    members = [shadows_of_shard(s, shards, replication) for s in range(shards)]
    t.load(-1, shard=sid % shards, members=members, keep=False)
    return t


def _ready(t: CutTracker, k: int, seq: int, last: int, it: int, *, diverged: bool = False) -> str:
    return t.on_ready(k, seq, last_applied=last, iteration=it, diverged=diverged, now=1.0)


def test_nothing_known_before_a_load() -> None:
    t = CutTracker(0)
    assert not t.loaded and not t.can_apply(0) and not t.update_istar()
    assert not t.replica_applied(0)
    t.mark_ready(0)
    assert t.ready_through() == 0  # own progress is known, the cut is not


def test_announcement_states() -> None:
    t = _tracker()
    assert t.announcement() == (wire.ReadyState.APPLIED, -1, -1)
    t.mark_ready(0)
    t.mark_ready(2)  # 1 missing: ready through 0 only
    assert t.announcement() == (wire.ReadyState.READY, 0, -1)
    t.diverge(1)
    assert t.announcement() == (wire.ReadyState.DIVERGED, 1, -1)
    assert t.ready_through() == 0
    assert not t.diverge(3)  # diverged before already: nothing changes
    assert t.diverged_at == 1
    assert t.diverge(0) and t.diverged_at == 0


def test_two_phase_rule_waits_for_every_shard() -> None:
    t = _tracker()
    t.mark_ready(0)
    assert not t.can_apply(0)  # shard 1 unknown
    assert _ready(t, 1, 5, -1, -1) == "ready"
    assert not t.can_apply(0)  # shard 1 not ready for 0
    assert _ready(t, 1, 6, -1, 0) == "ready"
    assert t.can_apply(0) and not t.can_apply(1)
    t.applied(0)
    t.mark_ready(1)
    assert _ready(t, 1, 7, -1, 1) == "ready"
    assert not t.can_apply(1)  # shard 1 ready for 1 but has not applied 0 (rule 3)
    assert _ready(t, 1, 8, 0, 1) == "ready"
    assert t.can_apply(1)


def test_stale_and_reordered_ready_records_change_nothing() -> None:
    t = _tracker()
    assert _ready(t, 1, 10, 2, 3) == "ready"
    view = t.shard_view()
    assert _ready(t, 1, 9, 5, 6) == "ready_stale"  # older record arriving late
    assert _ready(t, 1, 10, 5, 6) == "ready_stale"  # a duplicate
    assert t.shard_view() == view and t.peers[1].ready_through == 3


def test_peer_restart_lowers_the_view_but_never_istar() -> None:
    """A restarted (re-seeded) peer announces an older state with a newer seq: the view
    follows it (the two-phase rule waits for it), I* stays where it was."""
    t = _tracker()
    for i in range(3):
        t.mark_ready(i)
    assert _ready(t, 1, 1, 1, 2) == "ready"
    assert t.can_apply(0)
    t.applied(0)
    t.applied(1)
    assert t.update_istar() and t.istar == 1
    # shard 1 restarted and was re-seeded at 0: its new incarnation sends a newer seq
    assert _ready(t, 1, 100, 0, 0) == "ready"
    assert t.shard_view()[1] == (0, 0)
    assert not t.update_istar() and t.istar == 1
    assert not t.can_apply(2)  # shard 1 has not applied 1 any more


def test_stale_generation_load_forgets_the_view_and_holds_keep_load_does_not() -> None:
    t = _tracker()
    t.mark_ready(0)
    t.mark_ready(5)
    _ready(t, 1, 1, 3, 4)
    t.hold(3)
    t.update_istar()
    assert t.istar == -1
    # a re-seed of the same session at 2 keeps what is ready after it, the view and holds
    t.load(2, shard=0, members=t.members, keep=True)
    assert t.istar == UNKNOWN and t.last_applied == 2
    assert not t.is_ready(0) and t.is_ready(5)
    assert 1 in t.peers and t.holds == {3}
    # a new generation (a new job instance) starts from nothing known
    t.load(0, shard=0, members=t.members, keep=False)
    assert not t.peers and not t.holds and not t.is_ready(5)
    assert t.istar == UNKNOWN and not t.update_istar()


def test_resync_keeps_the_view_and_what_is_ready_after_it() -> None:
    t = _tracker()
    for i in (0, 1, 4):
        t.mark_ready(i)
    t.diverge(2)
    _ready(t, 1, 1, 3, 4)
    assert t.ready_through() == 1
    t.resynced(3)
    assert t.diverged_at is None and t.last_applied == 3 and t.ready_through() == 4
    assert 1 in t.peers


def test_diverged_peer_counts_only_up_to_its_hole() -> None:
    """2 shards x 2 replicas, seen from shadow 0: shard 1's replicas are 1 and 3."""
    t = _tracker(0, 2, 2)
    t.mark_ready(0)
    t.mark_ready(1)
    # shadow 3 diverged at 1 (applied 0), shadow 1 ready through 0 only
    assert _ready(t, 3, 1, 0, 1, diverged=True) == "ready"
    assert t.peers[3].ready_through == 0 and t.peers[3].diverged
    assert t.peers[3].usable() == 0
    _ready(t, 1, 1, -1, 0)
    assert t.can_apply(0)
    t.applied(0)
    assert not t.can_apply(1)  # the only replica past 0 is diverged at 1
    _ready(t, 1, 2, 0, 1)
    assert t.can_apply(1)
    t.update_istar()
    assert t.istar == 0


def test_replica_applied_ignores_diverged_and_other_shards() -> None:
    t = _tracker(0, 2, 2)  # shard 0: shadows 0 and 2
    _ready(t, 1, 1, 9, 9)  # another shard
    assert not t.replica_applied(3)
    _ready(t, 2, 1, 5, 6, diverged=True)
    assert not t.replica_applied(3)
    _ready(t, 2, 2, 5, 5)
    assert t.replica_applied(5) and not t.replica_applied(6)


def test_replication_two_one_replica_lags() -> None:
    """Shard 1's replica 3 lags far behind: the cut and the rule use the best replica."""
    t = _tracker(0, 2, 2)
    _ready(t, 2, 1, 4, 5)  # own shard's other replica
    _ready(t, 1, 1, 4, 5)
    _ready(t, 3, 1, -1, -1)
    for i in range(6):
        t.mark_ready(i)
    assert t.update_istar() and t.istar == 4
    for i in range(5):
        assert t.can_apply(i)
        t.applied(i)
    assert t.can_apply(5)
    # the lagging replica catching up changes nothing
    _ready(t, 3, 2, 2, 3)
    assert t.istar == 4 and t.can_apply(5)


def test_retention_and_holds() -> None:
    t = _tracker()
    _ready(t, 1, 1, 0, 1)
    t.mark_ready(0)
    t.mark_ready(1)
    assert t.retain_before(0)  # I* unknown (< 0): keep the state at -1
    t.applied(0)
    t.update_istar()
    assert t.istar == 0
    assert t.retain_before(1)  # applying 1 while I* is 0
    t.applied(1)
    assert t.keeps(0)
    _ready(t, 1, 2, 1, 1)
    assert t.update_istar() and t.istar == 1
    assert not t.keeps(0)  # I* passed it
    t.hold(0)
    assert t.keeps(0)
    t.release(0)
    assert not t.keeps(0)
    # one shard: I* is the shard's own progress, nothing kept unless held
    one = _tracker(0, 1, 1)
    assert not one.retain_before(0)
    one.hold(-1)
    assert one.retain_before(0) and not one.retain_before(1)
    no = _tracker(retain_cut=False)
    assert not no.retain_before(0)


def test_mark_ready_of_an_applied_iteration_is_ignored() -> None:
    t = _tracker()
    t.applied(0)
    t.mark_ready(0)
    assert not t.is_ready(0) and t.ready_through() == 0
    assert not t.can_apply(2)  # only last_applied + 1 can be applied


@pytest.mark.parametrize(
    ("per_shard", "cut"),
    [([[1, 3], [2]], 2), ([[5], [], [1]], None), ([], None), ([[-1], [0, -1]], -1)],
)
def test_consistent_cut(per_shard: list[list[int]], cut: int | None) -> None:
    assert consistent_cut(per_shard) == cut


def test_usable() -> None:
    assert usable(4, None) == 4
    assert usable(4, 3) == 2
    assert usable(4, 9) == 4


# ---------------------------------------------------------------- through a live node


def test_node_refuses_ready_of_a_stale_generation_and_an_old_seq() -> None:
    """What reaches the tracker is checked first: a READY of an older generation of the job
    (another session digest) is a wire error; a replayed record of a peer is ``ready_stale``;
    neither changes the shard view."""
    from shadowgrad.testing.cluster import producer_cluster
    from shadowgrad.testing.producer import Records
    from shadowgrad.testing.specs import JOB_ID, KEY
    from shadowgrad.testing.training import Case, RefTrainer, initial_states

    case = Case("cut", "mlp", "sgd", iterations=1)
    trainer = RefTrainer(case, seed=3)
    layout = trainer.layout(num_shadows=2)
    with producer_cluster(layout) as c:
        opt = trainer.optimizer_spec().to_json()
        for n, cl in zip(c.nodes, c.clients, strict=True):
            shard, _ = layout.shard_of_shadow(n.id)
            st = initial_states(layout, shard, trainer.named)
            cl.load(-1, st, opt, layout.to_json(), generation=2)
        c.expect_istar(-1)  # the peers heard from each other (nothing trained: generation 2)
        node = c.nodes[0]
        shard1, replica1 = layout.shard_of_shadow(1)
        body = wire.ReadyRecord(shard1, replica1, wire.ReadyState.APPLIED, 50).body()
        for gen, seq, want in [(1, 2**62, "wire.layout"), (2, 1, "ready_stale")]:
            records = Records(JOB_ID, wire.session_digest(layout.digest64, gen), KEY)
            data = records.encode(wire.Kind.READY, body, 50, sender=1, seq=seq)
            before = node.status(timeline=0)["peers"]
            assert node.handle_datagram(data) == want
            assert node.status(timeline=0)["peers"] == before
            assert node.status(timeline=0)["istar"] == -1
