"""Reassembly unit tests: exact coverage (interval set), chunk placement, gap mapping."""

from __future__ import annotations

import itertools
import random

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowgrad.layout import Layout, ParamSpec
from shadowgrad.shadow.assembly import LOCAL_ALIGN, IntervalSet, IterBuffer, ShardGeometry


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=60))
def test_interval_set_matches_a_bitmap(ops: list[tuple[int, int]]) -> None:
    s = IntervalSet()
    bitmap = np.zeros(400, dtype=bool)
    for start, n in ops:
        before = bitmap.copy()
        new = s.add(start, start + n)
        bitmap[start : start + n] = True
        # exactly the bytes that were not covered before are reported new, in order, disjoint
        want = np.zeros(400, dtype=bool)
        for a, b in new:
            assert a < b
            assert not want[a:b].any()
            want[a:b] = True
        assert (want == (bitmap & ~before)).all()
        assert s.total == int(bitmap.sum())
        ivs = list(s)
        for (a0, b0), (a1, _) in itertools.pairwise(ivs):
            assert a0 < b0 < a1  # disjoint and never adjacent
        gaps = s.gaps(0, 400)
        g = np.ones(400, dtype=bool)
        for a, b in gaps:
            g[a:b] = False
        assert (g == bitmap).all()


def _layout() -> Layout:
    params = [
        ParamSpec("a", (300, 7), "float32"),
        ParamSpec("b", (5,), "float32"),
        ParamSpec("c", (129, 3), "float16"),
        ParamSpec("d", (), "float32"),
    ]
    buckets = [["a", "b", "d"], ["c"]]
    return Layout.build(params, buckets, num_shadows=3, max_piece_bytes=2000)


def test_geometry_places_every_owned_byte_once_and_maps_gaps_back() -> None:
    layout = _layout()
    assert any(len(layout.tensor_boxes(n)) > 1 for n in ("a", "c"))  # tensors are split
    rng = random.Random(1)
    flat = [bytes(rng.randrange(256) for _ in range(n)) for n in layout.bucket_nbytes]
    for shard in range(layout.num_shards):
        geom = ShardGeometry(layout, shard)
        assert all(off % LOCAL_ALIGN == 0 for off in geom.local_offsets)
        buf = IterBuffer(geom)
        chunks = [
            (b, off, min(100, layout.bucket_nbytes[b] - off))
            for b in range(len(flat))
            for off in range(0, layout.bucket_nbytes[b], 100)
        ]
        rng.shuffle(chunks)
        holdout = chunks.pop()
        for b, off, n in chunks + chunks[:5]:  # with duplicates
            buf.place(b, off, memoryview(flat[b])[off : off + n])
        missing = geom.missing(buf.cov)
        owned_in_holdout = sum(b - a for _, a, b in geom.overlaps(*holdout))
        assert sum(n for _, _, n in missing) == owned_in_holdout
        for b, off, n in missing:
            assert holdout[0] == b and holdout[1] <= off and off + n <= holdout[1] + holdout[2]
            r = buf.place(b, off, memoryview(flat[b])[off : off + n])
            assert r.new == n
        assert buf.complete and geom.missing(buf.cov) == []
        again = buf.place(
            holdout[0],
            holdout[1],
            memoryview(flat[holdout[0]])[holdout[1] : holdout[1] + holdout[2]],
        )
        assert again.new == 0
        for box, view in zip(geom.boxes, buf.views(), strict=True):
            raw = flat[box.bucket][box.bucket_offset : box.bucket_end]
            dtype = {"float32": torch.float32, "float16": torch.float16}[box.dtype]
            want = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
            assert view.shape == box.lengths
            assert torch.equal(view.reshape(-1).view(torch.uint8), want.view(torch.uint8))
