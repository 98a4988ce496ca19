"""In-memory fakes of shadowgrad's seams, for tests: the controller's
(:class:`FakeSwitchDriver`, :class:`FakeShadowStatuses`; seams in :mod:`shadowgrad.seams`) and
the P4Runtime server's (:class:`FakeDataplane`, :class:`FakeTarget`; seam in
:mod:`shadowgrad.p4target.runtime_target`). Each implements what its Protocol lists, and
mypy checks them against it (the ``TYPE_CHECKING`` block at the end)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shadowgrad.messages import StatusLike
from shadowgrad.p4target.dataplane import (
    AlreadyExistsError,
    CloneSession,
    Match,
    NotFoundError,
    TableEntry,
)
from shadowgrad.seams import ConvergeCounts

if TYPE_CHECKING:
    from p4.config.v1 import p4info_pb2

__all__ = [
    "FakeConvergeReport",
    "FakeDataplane",
    "FakeShadowStatuses",
    "FakeSwitchDriver",
    "FakeTarget",
]


# ------------------------------------------------------------------------------ switch driver
class FakeConvergeReport(ConvergeCounts):
    """What :meth:`FakeSwitchDriver.converge` wrote."""


@dataclass
class FakeSwitchDriver:
    """An in-memory :class:`~shadowgrad.seams.SwitchDriver`: the first :meth:`converge` "pushes the
    pipeline" and inserts ``entries`` entries, later ones write nothing unless :attr:`drift`
    entries were lost meanwhile (then re-inserted); :meth:`counters` serves :attr:`commits` (set
    a rank's ``(packets, bytes)`` to simulate COMMITs crossing the switch). ``fail_converge`` /
    ``fail_counters``: raise ``RuntimeError`` from that call. Every call is recorded in
    :attr:`calls` (``"converge"`` / ``"counters"``)."""

    entries: int = 4
    world_size: int = 2
    commits: list[tuple[int, int]] = field(default_factory=list)
    drift: int = 0
    fail_converge: bool = False
    fail_counters: bool = False
    calls: list[str] = field(default_factory=list)
    _programmed: bool = False

    def __post_init__(self) -> None:
        if not self.commits:
            self.commits = [(0, 0)] * self.world_size

    def converge(self) -> FakeConvergeReport:
        self.calls.append("converge")
        if self.fail_converge:
            raise RuntimeError("fake switch: converge failed")
        if not self._programmed:
            self._programmed = True
            return FakeConvergeReport(pipeline_pushed=True, inserted=self.entries)
        lost, self.drift = self.drift, 0
        return FakeConvergeReport(inserted=lost)

    def counters(self) -> dict[str, Any]:
        self.calls.append("counters")
        if self.fail_counters:
            raise RuntimeError("fake switch: counters failed")
        return {"commits": list(self.commits)}


class FakeShadowStatuses:
    """An in-memory :class:`~shadowgrad.seams.ShadowStatusSource`: serves :attr:`statuses` (set a
    shadow's status, or None, at will) except for the ids in :attr:`down` (served as None: not
    answering); counts the polls in :attr:`polls`."""

    def __init__(self, statuses: Mapping[int, StatusLike | None] | None = None) -> None:
        self.statuses: dict[int, StatusLike | None] = dict(statuses or {})
        self.down: set[int] = set()
        self.polls = 0

    @classmethod
    def silent(cls, count: int) -> FakeShadowStatuses:
        """``count`` shadows, none answering."""
        return cls(dict.fromkeys(range(count)))

    def __call__(self) -> dict[int, StatusLike | None]:
        self.polls += 1
        return {k: None if k in self.down else s for k, s in self.statuses.items()}


# ------------------------------------------------------------------------------ P4 target
_Key = tuple[int, tuple[tuple[int, Match], ...], int]


def _key(e: TableEntry) -> _Key:
    return (e.table_id, tuple(sorted(e.matches.items(), key=lambda kv: kv[0])), e.priority)


class FakeDataplane:
    """An in-memory :class:`~shadowgrad.p4target.runtime_target.RuntimeDataplane`: entries by
    (table, match, priority), default actions, groups, clone sessions and counters
    (``counter_size`` cells each) in dicts, with the real one's errors for a duplicate or a
    missing key. No packet goes through it, and it takes no lock (a test drives one client at a
    time)."""

    def __init__(self, counter_size: int = 16) -> None:
        self.entries: dict[_Key, TableEntry] = {}
        self.defaults: dict[int, TableEntry] = {}
        self.groups: dict[int, list[tuple[int, int]]] = {}
        self.sessions: dict[int, CloneSession] = {}
        self.counters: dict[int, list[tuple[int, int]]] = {}
        self.counter_size = counter_size

    def insert_entry(self, entry: TableEntry) -> None:
        if _key(entry) in self.entries:
            raise AlreadyExistsError("entry already exists")
        self.entries[_key(entry)] = entry

    def modify_entry(self, entry: TableEntry) -> None:
        if _key(entry) not in self.entries:
            raise NotFoundError("entry does not exist")
        self.entries[_key(entry)] = entry

    def delete_entry(self, entry: TableEntry) -> None:
        if self.entries.pop(_key(entry), None) is None:
            raise NotFoundError("entry does not exist")

    def set_default(self, table_id: int, action_id: int, params: dict[int, int]) -> None:
        self.defaults[table_id] = TableEntry(
            table_id=table_id, action_id=action_id, params=dict(params), is_default=True
        )

    def get_default(self, table_id: int) -> TableEntry:
        return self.defaults.get(table_id, TableEntry(table_id=table_id, is_default=True))

    def read_entries(self, table_id: int | None = None) -> list[TableEntry]:
        return [e for k, e in self.entries.items() if table_id is None or k[0] == table_id]

    def insert_multicast_group(self, gid: int, replicas: Iterable[tuple[int, int]]) -> None:
        if gid in self.groups:
            raise AlreadyExistsError(f"multicast group {gid} already exists")
        self.groups[gid] = list(replicas)

    def modify_multicast_group(self, gid: int, replicas: Iterable[tuple[int, int]]) -> None:
        if gid not in self.groups:
            raise NotFoundError(f"multicast group {gid} does not exist")
        self.groups[gid] = list(replicas)

    def delete_multicast_group(self, gid: int) -> None:
        if self.groups.pop(gid, None) is None:
            raise NotFoundError(f"multicast group {gid} does not exist")

    def read_multicast_groups(self, gid: int | None = None) -> dict[int, list[tuple[int, int]]]:
        if gid:
            if gid not in self.groups:
                raise NotFoundError(f"multicast group {gid} does not exist")
            return {gid: list(self.groups[gid])}
        return {g: list(r) for g, r in sorted(self.groups.items())}

    def insert_clone_session(self, sid: int, replicas: Iterable[tuple[int, int]]) -> None:
        if sid in self.sessions:
            raise AlreadyExistsError(f"clone session {sid} already exists")
        self.sessions[sid] = CloneSession(list(replicas))

    def modify_clone_session(self, sid: int, replicas: Iterable[tuple[int, int]]) -> None:
        if sid not in self.sessions:
            raise NotFoundError(f"clone session {sid} does not exist")
        self.sessions[sid] = CloneSession(list(replicas))

    def delete_clone_session(self, sid: int) -> None:
        if self.sessions.pop(sid, None) is None:
            raise NotFoundError(f"clone session {sid} does not exist")

    def read_clone_sessions(self, sid: int | None = None) -> dict[int, CloneSession]:
        if sid:
            if sid not in self.sessions:
                raise NotFoundError(f"clone session {sid} does not exist")
            return {sid: self.sessions[sid]}
        return dict(sorted(self.sessions.items()))

    def _cells(self, counter_id: int) -> list[tuple[int, int]]:
        return self.counters.setdefault(counter_id, [(0, 0)] * self.counter_size)

    def read_counter(self, counter_id: int, index: int | None = None) -> list[tuple[int, int, int]]:
        cells = self._cells(counter_id)
        if index is None:
            return [(i, b, p) for i, (b, p) in enumerate(cells)]
        b, p = cells[index]
        return [(index, b, p)]

    def write_counter(
        self, counter_id: int, index: int | None = None, nbytes: int = 0, packets: int = 0
    ) -> None:
        cells = self._cells(counter_id)
        for i in range(len(cells)) if index is None else (index,):
            cells[i] = (nbytes, packets)

    def write_direct_counter(self, entry: TableEntry, nbytes: int, packets: int) -> None:
        e = self.entries.get(_key(entry))
        if e is None:
            raise NotFoundError("entry does not exist")
        e.counter_bytes, e.counter_packets = nbytes, packets


class FakeTarget:
    """An in-memory :class:`~shadowgrad.p4target.p4runtime_server.Target`: accepts any
    pipeline (``verify_pipeline`` returns the P4Info), gives a fresh :class:`FakeDataplane` at
    every ``commit_pipeline`` and records PacketOuts in :attr:`packets_out`."""

    def __init__(self, device_id: int = 0) -> None:
        self._device_id = device_id
        self._dataplane: FakeDataplane | None = None
        self.commits = 0
        self.packets_out: list[tuple[bytes, dict[int, int]]] = []

    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def dataplane(self) -> FakeDataplane | None:
        return self._dataplane

    def verify_pipeline(self, p4info: p4info_pb2.P4Info, device_config: bytes) -> Any:
        return p4info

    def commit_pipeline(
        self, pipeline: Any, p4info: p4info_pb2.P4Info, device_config: bytes
    ) -> None:
        self._dataplane = FakeDataplane()
        self.commits += 1

    def packet_out(self, payload: bytes, metadata: dict[int, int]) -> None:
        self.packets_out.append((payload, dict(metadata)))


if TYPE_CHECKING:  # mypy checks the fakes against their seams
    from shadowgrad.p4target.p4runtime_server import Target
    from shadowgrad.p4target.runtime_target import RuntimeDataplane
    from shadowgrad.seams import ShadowStatusSource, SwitchDriver

    def _are_seams(
        driver: FakeSwitchDriver,
        statuses: FakeShadowStatuses,
        dataplane: FakeDataplane,
        target: FakeTarget,
    ) -> tuple[SwitchDriver, ShadowStatusSource, RuntimeDataplane, Target]:
        return driver, statuses, dataplane, target
