"""Unit tests of the trainer-side plumbing: rank slices, the COMMIT blob, the fault-injecting
link, and the layout-reduce comm hook's bookkeeping (single process)."""

from __future__ import annotations

import socket

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowgrad.blob import pack_blob, unpack_blob
from shadowgrad.errors import ShadowgradError
from shadowgrad.layout import Layout, ParamSpec
from shadowgrad.trainer_hooks._plan import RankPlan, rank_slice
from shadowgrad.trainer_hooks.link import FaultyLink, UdpLink


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    n = draw(st.integers(1, 6))
    cut = draw(st.integers(1, n))
    dtypes = [draw(st.sampled_from(["float32", "float16"])) for _ in range(2)]
    params = [
        ParamSpec(
            f"p{i}",
            tuple(draw(st.lists(st.integers(1, 40), min_size=0, max_size=2))),
            dtypes[i >= cut],
        )
        for i in range(n)
    ]  # DDP: one dtype per bucket
    names = [p.name for p in params]
    buckets = [names[:cut], names[cut:]] if cut < n else [names]
    shadows = draw(st.integers(1, 4))
    return Layout.build(
        params,
        buckets,
        shadows,
        max_piece_bytes=draw(st.integers(8, 400)),
        align_elems=draw(st.sampled_from([1, 4, 64])),
    )


@settings(max_examples=150, deadline=None)
@given(layout=layouts(), world=st.integers(1, 7))
def test_rank_slices_tile_every_bucket_once(layout: Layout, world: int) -> None:
    for b, nbytes in enumerate(layout.bucket_nbytes):
        seen = bytearray(nbytes)
        for r in range(world):
            plan = RankPlan(layout, r, world)
            for run in plan.runs:
                if run.bucket != b:
                    continue
                assert layout.locate(b, run.start).shard == run.shard
                assert layout.locate(b, run.end - 1).shard == run.shard
                for i in range(run.start, run.end):
                    seen[i] += 1
            # pieces cover the same bytes as runs, in staging order
            total = sum(p.nbytes for p in plan.pieces if p.bucket == b)
            lo, hi = rank_slice(nbytes, layout.placement(layout.buckets[b][0]).itemsize, r, world)
            assert total == hi - lo
        assert all(x == 1 for x in seen), (b, world)


def test_mixed_dtype_bucket_is_rejected() -> None:
    from shadowgrad.errors import LayoutError

    params = [ParamSpec("a", (4,), "float32"), ParamSpec("b", (4,), "float16")]
    layout = Layout.build(params, [["a", "b"]], 1)
    with pytest.raises(LayoutError, match="mixes dtypes"):
        RankPlan(layout, 0, 2)


def test_blob_roundtrip_and_rejects_garbage() -> None:
    blob = pack_blob(
        7,
        {"last_epoch": 3, "_last_lr": [0.1]},
        None,
        {"rng": torch.arange(5, dtype=torch.uint8), "pos": 12},
    )
    doc = unpack_blob(blob)
    assert doc["iteration"] == 7 and doc["scheduler"]["last_epoch"] == 3
    assert torch.equal(doc["user"]["rng"], torch.arange(5, dtype=torch.uint8))
    with pytest.raises(ShadowgradError):
        unpack_blob(b"not a torch archive")


def test_blob_is_small_and_zip_blobs_still_load() -> None:
    """A blob is torch.save's plain pickle (a few hundred bytes for a few scalars, not a zip
    archive of over a kilobyte): every COMMIT carries one. Blobs packed as a zip archive (by
    earlier versions, kept in shadows' snapshots) still load, code-free both ways."""
    import io

    blob = pack_blob(3, None, None, {"step": 3})
    assert not blob.startswith(b"PK") and len(blob) < 400
    buf = io.BytesIO()
    doc = {"v": 1, "iteration": 3, "scheduler": None, "scaler": None, "user": {"step": 3}}
    torch.save({**doc, "module": None}, buf)  # the zip archive
    assert buf.getvalue().startswith(b"PK")
    assert unpack_blob(buf.getvalue())["user"] == {"step": 3}

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("ran",))

    bad = io.BytesIO()
    torch.save({**doc, "user": Evil()}, bad, _use_new_zipfile_serialization=False)
    with pytest.raises(ShadowgradError):
        unpack_blob(bad.getvalue())


def test_faulty_link_drops_duplicates_and_reorders_deterministically() -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(1.0)
    link = FaultyLink(UdpLink(("127.0.0.1", 0)), drop=0.2, dup=0.2, reorder=0.2, seed=5)
    try:
        for i in range(200):
            link.send([i.to_bytes(2, "big")], rx.getsockname())
        link.close()
        got = []
        rx.settimeout(0.3)
        while True:
            try:
                got.append(int.from_bytes(rx.recv(10), "big"))
            except TimeoutError:
                break
    finally:
        rx.close()
    c = link.counts
    assert c["dropped"] > 10 and c["duplicated"] > 10 and c["reordered"] > 10
    assert len(got) == 200 - c["dropped"] + c["duplicated"]
    assert got != sorted(got)  # reordered
    assert set(range(200)) - set(got)  # lost some


def test_rng_state_round_trips_through_the_commit_blob() -> None:
    """rng_state() / set_rng_state(): torch, Python and NumPy generators continue exactly
    where they were, after the trip through the COMMIT blob (weights_only load)."""
    import random

    import numpy as np

    from shadowgrad.blob import pack_blob, unpack_blob
    from shadowgrad.trainer_hooks import rng_state, set_rng_state

    torch.manual_seed(3)
    random.seed(4)
    np.random.seed(5)
    torch.rand(3), random.random(), np.random.rand(), random.gauss(0, 1)
    blob = pack_blob(1, None, None, {"rng": rng_state(), "step": 1})
    assert len(blob) < 20_000
    want = (torch.rand(4), random.random(), np.random.rand(), random.gauss(0, 1))
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    set_rng_state(unpack_blob(blob)["user"]["rng"])
    got = (torch.rand(4), random.random(), np.random.rand(), random.gauss(0, 1))
    assert torch.equal(want[0], got[0]) and want[1:] == got[1:]
