"""The seam between the P4Runtime server and the switch it serves: :class:`RuntimeDataplane`, what
:class:`~shadowgrad.p4target.p4runtime_server.P4RuntimeServer` calls on a target's running
dataplane (``Target.dataplane``).

The real ones are :class:`~shadowgrad.p4target.dataplane.Dataplane` and
:class:`~shadowgrad.p4target.switch.Switch`; the in-memory fakes of both,
:class:`~shadowgrad.testing.fakes.FakeDataplane` and :class:`~shadowgrad.testing.fakes.FakeTarget`,
keep what they are given in dicts and forward no packet, so a test can check what the server
asks of a target and serve P4Runtime without a pipeline that runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from .dataplane import CloneSession, TableEntry

__all__ = ["RuntimeDataplane"]


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
       :class:`~shadowgrad.p4target.dataplane.DataplaneError` (``AlreadyExistsError``,
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


if TYPE_CHECKING:  # mypy checks the real dataplane against the seam (the fakes: in their module)
    from .dataplane import Dataplane

    def _is_seam(real: Dataplane) -> RuntimeDataplane:
        return real
