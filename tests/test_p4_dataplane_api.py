"""Dataplane control-plane API: validation and error codes as bmv2/PI answer them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("p4")

from shadowgrad.errors import ShadowgradError
from shadowgrad.p4target.dataplane import (
    AlreadyExistsError,
    Dataplane,
    DataplaneError,
    Exact,
    InvalidArgumentError,
    Lpm,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    Range,
    ResourceExhaustedError,
    TableEntry,
    Ternary,
    UnimplementedError,
)
from shadowgrad.p4target.pipeline import Pipeline

PROGS = Path(__file__).resolve().parent / "p4progs"


@pytest.fixture(scope="module")
def pipes() -> dict[str, Pipeline]:
    return {n: Pipeline.compile(PROGS / f"{n}.p4") for n in ("basic", "l2", "acl")}


def ids(p: Pipeline) -> dict[str, int]:
    return {
        o.preamble.name.split(".")[-1]: o.preamble.id
        for o in [*p.p4info.tables, *p.p4info.actions, *p.p4info.counters]
    }


def test_lpm_rules(pipes: dict[str, Pipeline]) -> None:
    p = pipes["basic"]
    i = ids(p)
    dp = Dataplane(p)
    fwd = {1: 1, 2: 1}
    e = TableEntry(i["ipv4_lpm"], {1: Lpm(0x0A000000, 8)}, i["ipv4_forward"], fwd)
    dp.insert_entry(e)
    with pytest.raises(AlreadyExistsError) as ei:
        dp.insert_entry(e)
    assert ei.value.code == "ALREADY_EXISTS"
    bad = [
        TableEntry(i["ipv4_lpm"], {1: Lpm(0x0A000001, 8)}, i["ipv4_forward"], fwd),  # host bits
        TableEntry(i["ipv4_lpm"], {1: Lpm(0, 33)}, i["ipv4_forward"], fwd),
        TableEntry(i["ipv4_lpm"], {1: Lpm(1 << 32, 32)}, i["ipv4_forward"], fwd),
        TableEntry(i["ipv4_lpm"], {1: Lpm(0x0B000000, 8)}, i["ipv4_forward"], fwd, priority=5),
        TableEntry(i["ipv4_lpm"], {1: Lpm(0x0B000000, 8)}, i["ipv4_forward"], {1: 1}),
        TableEntry(i["ipv4_lpm"], {1: Lpm(0x0B000000, 8)}, i["ipv4_forward"], {1: 1, 2: 512}),
        TableEntry(i["ipv4_lpm"], {2: Exact(1)}, i["ipv4_forward"], fwd),
    ]
    for b in bad:
        with pytest.raises(InvalidArgumentError) as ei2:
            dp.insert_entry(b)
        assert ei2.value.code == "INVALID_ARGUMENT"
    with pytest.raises(NotFoundError):
        dp.delete_entry(TableEntry(i["ipv4_lpm"], {1: Lpm(0x0C000000, 8)}))
    with pytest.raises(NotFoundError):
        dp.insert_entry(TableEntry(12345, {}, i["drop"]))
    dp.modify_entry(TableEntry(i["ipv4_lpm"], {1: Lpm(0x0A000000, 8)}, i["drop"]))
    (got,) = dp.read_entries(i["ipv4_lpm"])
    assert got.action_id == i["drop"] and got.matches == {1: Lpm(0x0A000000, 8)}
    dp.set_default(i["ipv4_lpm"], i["ipv4_forward"], {1: 5, 2: 6})
    d = dp.get_default(i["ipv4_lpm"])
    assert (d.action_id, d.params, d.is_default) == (i["ipv4_forward"], {1: 5, 2: 6}, True)
    dp.reset_default(i["ipv4_lpm"])
    assert dp.get_default(i["ipv4_lpm"]).action_id == i["drop"]
    dp.delete_entry(TableEntry(i["ipv4_lpm"], {1: Lpm(0x0A000000, 8)}))
    assert dp.read_entries() == []
    assert isinstance(ei.value, ShadowgradError) and isinstance(ei.value, DataplaneError)


def test_exact_size_and_ternary_rules(pipes: dict[str, Pipeline]) -> None:
    p = pipes["l2"]
    i = ids(p)
    dp = Dataplane(p)
    with pytest.raises(InvalidArgumentError):  # exact: no priority
        dp.insert_entry(TableEntry(i["dmac"], {1: Exact(1)}, i["fwd"], {1: 1}, priority=1))
    with pytest.raises(InvalidArgumentError, match="default-only"):  # implicit NoAction
        dp.insert_entry(TableEntry(i["dmac"], {1: Exact(1)}, i["NoAction"]))
    with pytest.raises(InvalidArgumentError):  # exact field missing
        dp.insert_entry(TableEntry(i["dmac"], {}, i["fwd"], {1: 1}))
    for n in range(64):
        dp.insert_entry(TableEntry(i["dmac"], {1: Exact(n)}, i["fwd"], {1: 1}))
    with pytest.raises(ResourceExhaustedError):
        dp.insert_entry(TableEntry(i["dmac"], {1: Exact(999)}, i["fwd"], {1: 1}))
    a = pipes["acl"]
    j = ids(a)
    dp2 = Dataplane(a)
    with pytest.raises(InvalidArgumentError, match="priority"):
        dp2.insert_entry(TableEntry(j["acl"], {1: Ternary(1, 1)}, j["deny"]))
    with pytest.raises(InvalidArgumentError, match="outside the mask"):
        dp2.insert_entry(TableEntry(j["acl"], {1: Ternary(3, 1)}, j["deny"], priority=1))
    with pytest.raises(InvalidArgumentError, match="low > high"):
        dp2.insert_entry(TableEntry(j["acl"], {3: Range(9, 1)}, j["deny"], priority=1))
    dp2.insert_entry(TableEntry(j["acl"], {1: Ternary(1, 1)}, j["deny"], priority=1))
    dp2.insert_entry(TableEntry(j["acl"], {1: Ternary(1, 1)}, j["deny"], priority=2))
    with pytest.raises(PermissionDeniedError):  # const entries: read-only
        dp2.insert_entry(TableEntry(j["classify"], {}, j["set_class"], {1: 1}, priority=9))
    consts = dp2.read_entries(j["classify"])
    assert [e.priority for e in consts] == [3, 2, 1] and all(e.is_const for e in consts)


def test_pre_limits(pipes: dict[str, Pipeline]) -> None:
    dp = Dataplane(pipes["l2"])
    dp.insert_multicast_group(1, [(1, 1), (2, 1)])
    with pytest.raises(AlreadyExistsError):
        dp.insert_multicast_group(1, [])
    with pytest.raises(OutOfRangeError, match="too high"):
        dp.insert_multicast_group(32768, [(1, 1)])
    with pytest.raises(InvalidArgumentError):
        dp.insert_multicast_group(0, [(1, 1)])
    with pytest.raises(InvalidArgumentError, match="duplicate"):
        dp.insert_multicast_group(2, [(1, 1), (1, 1)])
    dp.modify_multicast_group(1, [(3, 0)])
    assert dp.read_multicast_groups() == {1: [(3, 0)]}
    dp.delete_multicast_group(1)
    with pytest.raises(NotFoundError):
        dp.delete_multicast_group(1)
    with pytest.raises(UnimplementedError):
        dp.insert_clone_session(5, [(1, 0)], class_of_service=1)
    with pytest.raises(UnimplementedError):
        dp.insert_clone_session(5, [(1, 0)], packet_length_bytes=128)
    dp.insert_clone_session(5, [(1, 0)])
    assert dp.read_clone_sessions()[5].replicas == [(1, 0)]


def test_counters_api(pipes: dict[str, Pipeline]) -> None:
    p = pipes["l2"]
    i = ids(p)
    dp = Dataplane(p)
    dp.process(3, bytes(60))
    assert dp.read_counter(i["port_counter"], 3) == [(3, 60, 1)]
    assert len(dp.read_counter(i["port_counter"])) == 16
    with pytest.raises(OutOfRangeError):
        dp.read_counter(i["port_counter"], 16)
    dp.write_counter(i["port_counter"], None)
    assert dp.read_counter(i["port_counter"], 3) == [(3, 0, 0)]
    with pytest.raises(NotFoundError):
        dp.read_counter(99)
    assert dp.packet_counts()["rx"] == 1


def test_thread_safety_smoke(pipes: dict[str, Pipeline]) -> None:
    p = pipes["l2"]
    i = ids(p)
    dp = Dataplane(p)
    frame = bytes.fromhex("000000000005") + bytes(54)

    def writer() -> None:
        for n in range(200):
            e = TableEntry(i["dmac"], {1: Exact(5)}, i["fwd"], {1: n % 8})
            dp.insert_entry(e)
            dp.delete_entry(e)

    th = threading.Thread(target=writer)
    th.start()
    for _ in range(400):
        ((port, out),) = dp.process(1, frame)
        assert out == frame and 0 <= port < 8
    th.join()
    assert dp.drop_counts() == {}
