"""The seam between the P4Runtime server and the switch it serves: :class:`RuntimeDataplane`, what
:class:`~shadowgrad.bmv2_testbed.p4runtime_server.P4RuntimeServer` calls on a target's running
dataplane (``Target.dataplane``), with in-memory fakes of it and of a target beside it.

The real ones are :class:`~shadowgrad.bmv2_testbed.dataplane.Dataplane` and
:class:`~shadowgrad.bmv2_testbed.switch.Switch`; :class:`FakeDataplane` and :class:`FakeTarget`
keep what they are given in dicts and forward no packet, so a test can check what the server
asks of a target and serve P4Runtime without a pipeline that runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from p4.config.v1 import p4info_pb2

from .dataplane import AlreadyExistsError, CloneSession, Match, NotFoundError, TableEntry

__all__ = ["FakeDataplane", "FakeTarget", "RuntimeDataplane"]


class RuntimeDataplane(Protocol):
    """A running pipeline's runtime state, as the P4Runtime server reads and writes it.

    The server calls, in this order:

    1. nothing until the target's ``commit_pipeline`` has installed a pipeline
       (``Target.dataplane`` is None before; a request then fails ``FAILED_PRECONDITION``).
       Each ``commit_pipeline`` gives a fresh dataplane: the server reads ``Target.dataplane``
       again at every request, never keeping an old one;
    2. per ``Write`` request, under the server's write lock (one request at a time, its updates
       in order, CONTINUE_ON_ERROR): one of the writers below per update, after the server has
       checked ids, widths and priorities against the P4Info. A writer raises a
       :class:`~shadowgrad.bmv2_testbed.dataplane.DataplaneError` (``AlreadyExistsError``,
       ``NotFoundError``, ...) to fail that update only;
    3. per ``Read`` request, not under the write lock (concurrently with writes: the dataplane
       locks its own state): the readers below, whose results are copied out at once.

    Writers: :meth:`insert_entry`, :meth:`modify_entry`, :meth:`delete_entry`,
    :meth:`set_default` (and ``reset_default(table_id)`` when the target has it: optional, the
    server answers ``UNIMPLEMENTED`` without it), the multicast group and clone session
    insert/modify/delete, :meth:`write_counter`, :meth:`write_direct_counter`.
    Readers: :meth:`read_entries`, :meth:`get_default`, :meth:`read_multicast_groups`,
    :meth:`read_clone_sessions`, :meth:`read_counter`.
    """

    # -- tables
    def insert_entry(self, entry: TableEntry) -> None: ...
    def modify_entry(self, entry: TableEntry) -> None: ...
    def delete_entry(self, entry: TableEntry) -> None: ...
    def set_default(self, table_id: int, action_id: int, params: dict[int, int]) -> None: ...
    def get_default(self, table_id: int) -> TableEntry: ...
    def read_entries(self, table_id: int | None = None) -> list[TableEntry]: ...

    # -- packet replication engine
    def insert_multicast_group(self, gid: int, replicas: Iterable[tuple[int, int]]) -> None: ...
    def modify_multicast_group(self, gid: int, replicas: Iterable[tuple[int, int]]) -> None: ...
    def delete_multicast_group(self, gid: int) -> None: ...
    def read_multicast_groups(
        self, gid: int | None = None
    ) -> Mapping[int, list[tuple[int, int]]]: ...
    def insert_clone_session(self, sid: int, replicas: Iterable[tuple[int, int]]) -> None: ...
    def modify_clone_session(self, sid: int, replicas: Iterable[tuple[int, int]]) -> None: ...
    def delete_clone_session(self, sid: int) -> None: ...
    def read_clone_sessions(self, sid: int | None = None) -> Mapping[int, CloneSession]: ...

    # -- counters: (index, bytes, packets)
    def read_counter(
        self, counter_id: int, index: int | None = None
    ) -> list[tuple[int, int, int]]: ...
    def write_counter(
        self, counter_id: int, index: int | None = None, nbytes: int = 0, packets: int = 0
    ) -> None: ...
    def write_direct_counter(self, entry: TableEntry, nbytes: int, packets: int) -> None: ...


_Key = tuple[int, tuple[tuple[int, Match], ...], int]


def _key(e: TableEntry) -> _Key:
    return (e.table_id, tuple(sorted(e.matches.items(), key=lambda kv: kv[0])), e.priority)


class FakeDataplane:
    """An in-memory :class:`RuntimeDataplane`: entries by (table, match, priority), default
    actions, groups, clone sessions and counters (``counter_size`` cells each) in dicts, with
    the real one's errors for a duplicate or a missing key. No packet goes through it, and it
    takes no lock (a test drives one client at a time)."""

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
    """An in-memory :class:`~shadowgrad.bmv2_testbed.p4runtime_server.Target`: accepts any
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


if TYPE_CHECKING:  # mypy checks the real dataplane and the fakes against the seams
    from .dataplane import Dataplane
    from .p4runtime_server import Target

    def _are_seams(
        real: Dataplane, fake: FakeDataplane, target: FakeTarget
    ) -> tuple[RuntimeDataplane, RuntimeDataplane, Target]:
        return real, fake, target
