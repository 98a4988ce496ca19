"""FullStateSink (issue 23): the shards' tensor streams written straight into full tensors,
each chunk verified as it is copied; the same result as decode_states + assemble_full, and the
same refusals (a corrupt chunk, a missing box, boxes that disagree)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from shadowgrad.boxes import FullStateSink, ReplayError, assemble_full, box_states_from_full
from shadowgrad.errors import ControlError, ShadowgradError
from shadowgrad.layout import Layout, from_module
from shadowgrad.tensorstream import CHUNK_BYTES, decode_states, encode_states


def _state(shards: int = 3) -> tuple[Layout, dict[str, torch.Tensor], dict[str, Any]]:
    torch.manual_seed(0)
    # a weight cut into boxes over the shards, each larger than a stream chunk (several frames)
    model = torch.nn.Sequential(torch.nn.Linear(1600, 1600), torch.nn.Linear(1600, 7))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 1600)).square().mean().backward()
    opt.step()
    params, buckets = from_module(model)
    layout = Layout.build(params, buckets, shards, 1, max_piece_bytes=5 * 2**20)
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    ostate = {
        n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in model.named_parameters()
    }
    return layout, full, ostate


def _streams(layout: Layout, full: Any, ostate: Any) -> list[tuple[list[Any], list[Any]]]:
    out = []
    for shard in range(layout.num_shards):
        boxes = layout.shard_boxes(shard)
        ids = {k: (b.name, b.offsets) for k, b in enumerate(boxes)}
        states = box_states_from_full(layout, shard, full, ostate)
        entries, frames = encode_states(list(enumerate(states)), ids)
        out.append((entries, [bytes(f) for f in frames]))
    return out


def test_the_sink_equals_decode_and_assemble_and_writes_in_place() -> None:
    layout, full, ostate = _state()
    streams = _streams(layout, full, ostate)
    assert any(len(e["crc"]) > 1 for es, _ in streams for e in es), "no multi-frame tensor"
    dest = {n: torch.zeros_like(t) for n, t in full.items()}
    ptrs = {n: t.data_ptr() for n, t in dest.items()}
    sink = FullStateSink(layout, dest)
    for shard in reversed(range(layout.num_shards)):  # any order
        sink.write(shard, *streams[shard])
    params, opt_state = sink.finish()
    assert sink.in_place == set(full)
    assert {n: t.data_ptr() for n, t in params.items()} == ptrs
    ref_p, ref_o = assemble_full(
        layout,
        [
            [decode_states(*streams[s])[b] for b in range(len(layout.shard_boxes(s)))]
            for s in range(layout.num_shards)
        ],
    )
    for n, t in full.items():
        assert torch.equal(params[n], t) and torch.equal(ref_p[n], t), n
        assert opt_state[n].keys() == ostate[n].keys() == ref_o[n].keys()
        for k, v in ostate[n].items():
            assert torch.equal(opt_state[n][k], v), (n, k)
    assert (
        sink.nbytes == sum(int(e["nbytes"]) for es, _ in streams for e in es)
        and sink.nbytes > 2 * CHUNK_BYTES
    )


def test_a_corrupt_chunk_is_refused() -> None:
    layout, full, ostate = _state()
    entries, frames = _streams(layout, full, ostate)[0]
    bad = bytearray(frames[0])
    bad[len(bad) // 2] ^= 0x40
    sink = FullStateSink(layout)
    with pytest.raises(ControlError, match="checksum"):
        sink.write(0, entries, [bytes(bad), *frames[1:]])


def test_a_missing_shard_or_disagreeing_boxes_are_refused() -> None:
    layout, full, ostate = _state()
    streams = _streams(layout, full, ostate)
    sink = FullStateSink(layout)
    for shard in range(1, layout.num_shards):
        sink.write(shard, *streams[shard])
    with pytest.raises(ShadowgradError, match="no 'param' came"):
        sink.finish()
    # a box of the cut weight whose 'step' differs from its sibling boxes'
    name = next(n for n in full if sum(b.name == n for b in layout.boxes) > 1)
    ostate2 = {n: dict(st) for n, st in ostate.items()}
    ostate2[name]["step"] = ostate[name]["step"] + 1
    s1 = next(
        s for s in range(layout.num_shards) if any(b.name == name for b in layout.shard_boxes(s))
    )
    streams2 = _streams(layout, full, ostate2)
    sink = FullStateSink(layout)
    with pytest.raises(ReplayError, match="disagree"):
        for shard in range(layout.num_shards):
            sink.write(shard, *(streams2 if shard == s1 else streams)[shard])


def test_pieces_of_a_shard_come_as_box_groups_and_others_are_refused() -> None:
    """A restore fetches a shard in box groups (``fetch(boxes=...)``): each piece is written
    for its boxes only, a piece carrying a box it was not asked for is refused, and the
    shard is complete once every group came."""
    layout, full, ostate = _state(shards=1)
    entries, frames = _streams(layout, full, ostate)[0]
    nbox = len(layout.shard_boxes(0))
    assert nbox >= 2
    sink = FullStateSink(layout)
    with pytest.raises(ShadowgradError, match="not asked for"):
        sink.write(0, entries, frames, boxes=[0])
    sink = FullStateSink(layout)
    pos = 0
    for b in range(nbox):  # one box per piece, as separate streams
        own = [e for e in entries if int(e["box"]) == b]
        n = sum(len(e["crc"]) for e in own)
        sink.write(0, own, frames[pos : pos + n], boxes=[b])
        pos += n
    params, _ = sink.finish()
    for n, t in full.items():
        assert torch.equal(params[n], t), n
