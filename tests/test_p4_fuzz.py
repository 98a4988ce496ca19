"""Random and mutated frames through every test program: no engine error, ever."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("p4")

from shadowgrad.p4target.dataplane import Dataplane, Exact, TableEntry
from shadowgrad.p4target.pipeline import Pipeline

PROGS = Path(__file__).resolve().parent / "p4progs"
SEEDS = [
    bytes.fromhex(
        "00000000000200000000000108004500002e000100004011f9c70a0000010a0001010"
        "3e8123400120000010203040506"
    )
    + b"payload"
]


@pytest.mark.parametrize(
    "prog", sorted(p.name for p in PROGS.glob("*.p4") if p.name != "common.p4")
)
def test_random_frames_never_break_the_engine(prog: str) -> None:
    p = Pipeline.compile(PROGS / prog)
    dp = Dataplane(p, cpu_port=255)
    dp.on_packet_in = lambda payload, md: None
    dp.on_digest = lambda did, members: None
    errors: list[str] = []
    dp.on_log = lambda line: errors.append(line) if "internal" in line else None
    for t in p.p4info.tables:  # a few entries so that actions run too
        if t.is_const_table or not all(m.match_type == 2 for m in t.match_fields):
            continue
        for ref in t.action_refs:
            a = next(x for x in p.p4info.actions if x.preamble.id == ref.id)
            if ref.scope == 2:
                continue
            params = {prm.id: (1 << prm.bitwidth) - 1 for prm in a.params}
            matches = {
                m.id: Exact(random.Random(ref.id).getrandbits(m.bitwidth)) for m in t.match_fields
            }
            dp.insert_entry(TableEntry(t.preamble.id, matches, a.preamble.id, params))
    dp.insert_multicast_group(1, [(1, 1), (2, 2)])
    dp.insert_clone_session(5, [(3, 3)])
    dp.insert_clone_session(6, [(4, 4)])
    rng = random.Random(prog)
    for i in range(1500):
        if i % 3 == 0:
            f = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 90)))
        else:
            b = bytearray(rng.choice(SEEDS))
            for _ in range(rng.randrange(1, 6)):
                b[rng.randrange(len(b))] = rng.getrandbits(8)
            f = bytes(b[: rng.randrange(len(b) + 1)])
        dp.process(rng.choice([0, 1, 2, 255, 511]), f)
    assert errors == []
    assert not any(r == "internal_error" for _, r in dp.drop_counts())
