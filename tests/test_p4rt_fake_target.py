"""The P4Runtime server over the in-memory target seam (p4target/runtime_target.py): what a
client writes lands in the FakeDataplane as the server decoded it, reads come back from it, a
duplicate or a missing key fails that update only, and a new pipeline gives a fresh dataplane."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

pytest.importorskip("p4")

from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2

from shadowgrad.p4target.dataplane import Exact, Lpm, Pipeline
from shadowgrad.p4target.p4runtime_server import P4RuntimeServer
from shadowgrad.testing.fakes import FakeDataplane, FakeTarget
from tests.test_p4rt_server import (
    Client,
    Names,
    clone_entity,
    codes,
    dmac_entry,
    lpm_entry,
    mc_entity,
    names_fixture,  # noqa: F401 (fixture)
    pipeline_fixture,  # noqa: F401 (fixture)
    primary_client,
    upd,
)

U = p4runtime_pb2.Update


@pytest.fixture
def target() -> FakeTarget:
    return FakeTarget(device_id=0)


@pytest.fixture
def client(target: FakeTarget, pipeline: Pipeline) -> Iterator[Client]:
    server = P4RuntimeServer(target, "127.0.0.1:0")
    port = server.start()
    try:
        with primary_client(f"127.0.0.1:{port}", pipeline) as c:
            yield c
    finally:
        server.stop()


def _dpl(target: FakeTarget) -> FakeDataplane:
    assert target.dataplane is not None
    return target.dataplane


def test_writes_land_in_the_fake_dataplane_and_read_back(
    client: Client, target: FakeTarget, names: Names
) -> None:
    assert target.commits == 1
    dpl = _dpl(target)
    e = lpm_entry(names, 0x0A000200, 24, 0x000000000202, 2)
    client.write(
        upd(U.INSERT, e),
        upd(U.INSERT, mc_entity(7, [(1, 1), (2, 1)])),
        upd(U.INSERT, clone_entity(5, [(3, 0)])),
    )
    (entry,) = dpl.read_entries(names["MyIngress.ipv4_lpm"])
    assert list(entry.matches.values()) == [Lpm(0x0A000200, 24)]
    assert entry.action_id == names["MyIngress.ipv4_forward"]
    assert entry.params == {1: 0x202, 2: 2}
    assert dpl.groups == {7: [(1, 1), (2, 1)]}
    assert dpl.sessions[5].replicas == [(3, 0)]
    got = client.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry()))
    assert [g.table_entry for g in got] == [e.table_entry]
    got = client.read(mc_entity(0, []))
    assert got == [mc_entity(7, [(1, 1), (2, 1)])]


def test_a_dataplane_error_fails_that_update_only(
    client: Client, target: FakeTarget, names: Names
) -> None:
    ok = dmac_entry(names, 0x1, "MyIngress.l2_forward", 1)
    client.write(upd(U.INSERT, ok))
    with pytest.raises(grpc.RpcError) as ei:
        client.write(
            upd(U.INSERT, ok),  # already there
            upd(U.INSERT, dmac_entry(names, 0x2, "MyIngress.l2_forward", 2)),
            upd(U.DELETE, mc_entity(9, [])),  # no such group
        )
    assert codes(ei.value) == [code_pb2.ALREADY_EXISTS, code_pb2.OK, code_pb2.NOT_FOUND]
    keys = [list(e.matches.values()) for e in _dpl(target).read_entries()]
    assert keys == [[Exact(0x1)], [Exact(0x2)]]


def test_a_new_pipeline_is_a_fresh_dataplane(
    client: Client, target: FakeTarget, pipeline: Pipeline
) -> None:
    client.write(upd(U.INSERT, mc_entity(3, [(1, 0)])))
    first = _dpl(target)
    client.set_pipeline(pipeline)
    assert target.commits == 2 and target.dataplane is not first
    assert _dpl(target).groups == {} and client.read(mc_entity(0, [])) == []
