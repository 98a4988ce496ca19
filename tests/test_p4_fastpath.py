"""The straight-line fast path (``p4target/codegen/straight.py``) against the general path.

Every covered program (the test programs in ``tests/p4progs`` and the project's own
``p4/shadowgrad.p4``; :func:`test_coverage_is_what_we_expect` fails when the fast path accepts
one that the differential test does not run) runs the same random and mutated frames through
two dataplanes with the same table entries, defaults, multicast groups and clone sessions, one
on the fast path and one on the general path; outputs (port, bytes, order), drops by reason,
packet-ins, digests, counters, direct counters, registers and packet statistics must be
identical.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("p4")

from shadowgrad.p4target.codegen.straight import FastPathUnsupported, build_fast
from shadowgrad.p4target.dataplane import (
    Dataplane,
    Exact,
    Lpm,
    Match,
    OptionalMatch,
    Range,
    TableEntry,
    Ternary,
)
from shadowgrad.p4target.pipeline import Pipeline

PROGS = Path(__file__).resolve().parent / "p4progs"
#: every program, by name: the test programs and the switch program of the project
PATHS = {p.name: p for p in PROGS.glob("*.p4") if p.name != "common.p4"} | {
    "shadowgrad.p4": PROGS.parents[1] / "p4" / "shadowgrad.p4"
}
ALL = sorted(PATHS)
# what the fast path covers today; the rest say why not (a regression here is a slowdown)
COVERED = {
    "acl.p4",
    "basic.p4",
    "csum.p4",
    "deparse.p4",
    "hashes.p4",
    "l2.p4",
    "mcast.p4",
    "misc.p4",
    "parser_error.p4",
    "pktio.p4",
    "qdepth.p4",
    "shadowgrad.p4",
    "subctl.p4",
    "tor_like.p4",
    "wire.p4",
}
#: the programs whose traffic is the shadowgrad wire protocol
SG_TRAFFIC = {"shadowgrad.p4", "tor_like.p4"}
CPU = 255

MACS = [
    0x000000000001,
    0x000000000002,
    0x000000000099,
    0x020000000001,
    0x020000000002,
    0xFFFFFFFFFFFF,
]
IPS = [0x0A000001, 0x0A000101, 0x0A000202, 0xC0A80001]
SMALL = [0, 1, 2, 3, 4, 5, 6, 17, 255]
WORDS = [0x0800, 0x1234, 0x88B5, 0x9000, 53, 4660, 0, 1, 2, 3]


def pool(width: int) -> list[int]:
    """Candidate key and field values of a width (so that entries and frames meet)."""
    vals = {48: MACS, 32: IPS, 16: WORDS, 9: [0, 1, 2, 3, 4, CPU], 8: SMALL}.get(width, SMALL)
    return [v & ((1 << width) - 1) for v in vals]


def frame(rng: random.Random) -> bytes:
    """Ethernet / [probe] / IPv4 / UDP / tag with fields from small pools."""
    etype = rng.choice([0x0800, 0x0800, 0x0800, 0x88B5, 0x9000, 0x86DD])
    tag = bytes(
        [
            rng.choice(SMALL[:7]),
            rng.choice(SMALL),
            rng.choice([0, 1]),
            rng.choice(SMALL),
            0,
            rng.choice([0, 1, 4]),
        ]
    )
    payload = tag + bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 7, 40])))
    dport = rng.choice([4660, 4660, 53])
    proto = rng.choice([17, 17, 17, 6])
    udp = (
        (1000).to_bytes(2, "big")
        + dport.to_bytes(2, "big")
        + (8 + len(payload)).to_bytes(2, "big")
        + b"\0\0"
        + payload
    )
    ihl_ver = rng.choice([0x45, 0x45, 0x46, 0x55])
    ip = (
        bytes([ihl_ver, rng.choice([0, 4])])
        + (20 + len(udp)).to_bytes(2, "big")
        + b"\0\1"
        + rng.choice([b"\0\0", b"\x20\x01"])
        + bytes([rng.choice([1, 64]), proto])
        + rng.getrandbits(16).to_bytes(2, "big")
        + rng.choice(IPS).to_bytes(4, "big")
        + rng.choice(IPS).to_bytes(4, "big")
    )
    eth_type = etype
    mid = b""
    if etype == 0x88B5:  # probe: hops, marker, inner ethertype
        mid = bytes([rng.choice(SMALL), rng.choice(SMALL)]) + (0x0800).to_bytes(2, "big")
    elif etype == 0x9000:
        mid = bytes([rng.choice([0, 1, 200])])
    return (
        rng.choice(MACS).to_bytes(6, "big")
        + rng.choice(MACS).to_bytes(6, "big")
        + eth_type.to_bytes(2, "big")
        + mid
        + ip
        + udp
    )


def sg_frame(rng: random.Random) -> bytes:
    """Ethernet / IPv4 / UDP / shadowgrad wire header (p4/include/headers.p4) / payload, the
    traffic of tor_like.p4: DATA chunks with and without FINAL, other kinds, bad magic."""
    from shadowgrad.wire import Flag, Kind

    if rng.random() < 0.2:
        return frame(rng)
    kind = rng.choice([Kind.DATA, Kind.DATA, Kind.COMMIT, Kind.ACK])
    flags = rng.choice([Flag.FINAL, Flag.FINAL | Flag.RETX, 0, Flag.LAST])
    payload = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 16, 64])))
    magic = 0x5347 if rng.random() < 0.95 else 0x1234
    sg = (
        magic.to_bytes(2, "big")
        + bytes([1, kind, flags, 0])
        + rng.randrange(4).to_bytes(2, "big")
        + rng.choice(IPS).to_bytes(4, "big")
        + rng.choice(IPS).to_bytes(4, "big")
        + rng.getrandbits(64).to_bytes(8, "big")
        + rng.getrandbits(64).to_bytes(8, "big")
        + rng.getrandbits(64).to_bytes(8, "big")
        + rng.getrandbits(64).to_bytes(8, "big")
        + len(payload).to_bytes(4, "big")
        + rng.getrandbits(32).to_bytes(4, "big")
    )
    body = sg + payload
    udp = (
        (40000).to_bytes(2, "big")
        + (47474).to_bytes(2, "big")
        + (8 + len(body)).to_bytes(2, "big")
        + b"\x12\x34"
        + body
    )
    ip = (
        bytes([0x45, 0])
        + (20 + len(udp)).to_bytes(2, "big")
        + b"\0\1\0\0"
        + bytes([rng.choice([1, 64]), 17])
        + b"\0\0"
        + rng.choice(IPS).to_bytes(4, "big")
        + rng.choice(IPS).to_bytes(4, "big")
    )
    return (
        rng.choice(MACS).to_bytes(6, "big")
        + rng.choice(MACS).to_bytes(6, "big")
        + b"\x08\x00"
        + ip
        + udp
    )


def mutate(rng: random.Random, f: bytes) -> bytes:
    b = bytearray(f)
    for _ in range(rng.randrange(1, 4)):
        b[rng.randrange(len(b))] = rng.getrandbits(8)
    return bytes(b[: rng.randrange(len(b) + 1)]) if rng.random() < 0.5 else bytes(b)


def match(rng: random.Random, kind: str, width: int) -> Match | None:
    v = rng.choice(pool(width))
    if kind == "exact":
        return Exact(v)
    if kind == "lpm":
        plen = rng.choice([width, width, width // 2, 8]) if width >= 8 else width
        mask = ((1 << plen) - 1) << (width - plen)
        return Lpm(v & mask, plen) if plen else None
    if kind == "ternary":
        mask = rng.choice([(1 << width) - 1, 0xFF, (1 << width) - 256 if width > 8 else 1])
        return Ternary(v & mask, mask) if mask else None
    if kind == "range":
        lo = rng.randrange(0, 8)
        return Range(lo, lo + rng.randrange(0, 300))
    return OptionalMatch(v) if rng.random() < 0.7 else None


def program_state(rng: random.Random, p: Pipeline) -> list[tuple[str, Any]]:
    """Random control-plane writes, applied identically to both dataplanes."""
    ops: list[tuple[str, Any]] = []
    for t in p.tables.values():
        if t.is_const:
            continue
        acts = [a for a in t.action_ids if t.scope_ids.get(a) != "DEFAULT_ONLY"]
        for _ in range(rng.randrange(2, 10)):
            aid = rng.choice(acts)
            a = p.actions[aid]
            params = {prm.id: rng.choice(pool(prm.bitwidth)) for prm in a.params}
            ms: dict[int, Match] = {}
            for k in t.keys:
                m = match(rng, k.match_kind, k.bitwidth)
                if m is not None:
                    ms[k.id] = m
            prio = (
                rng.randrange(1, 50)
                if any(k.match_kind in ("ternary", "range", "optional") for k in t.keys)
                else 0
            )
            ops.append(("entry", TableEntry(t.id, ms, aid, params, prio)))
        if not t.const_default:
            defs = [a for a in t.action_ids if t.scope_ids.get(a) != "TABLE_ONLY"]
            aid = rng.choice(defs)
            a = p.actions[aid]
            ops.append(
                (
                    "default",
                    (t.id, aid, {prm.id: rng.choice(pool(prm.bitwidth)) for prm in a.params}),
                )
            )
    for gid in (1, 2, 3):
        reps = sorted(
            {
                (rng.choice([1, 2, 3, 4, CPU]), rng.randrange(0, 4))
                for _ in range(rng.randrange(1, 4))
            }
        )
        ops.append(("mcast", (gid, reps)))
    ops.append(("clone", (5, [(3, 3)])))
    return ops


def apply(dp: Dataplane, ops: list[tuple[str, Any]]) -> None:
    for kind, arg in ops:
        try:
            if kind == "entry":
                dp.insert_entry(arg)
            elif kind == "default":
                dp.set_default(*arg)
            elif kind == "mcast":
                dp.insert_multicast_group(*arg)
            else:
                dp.insert_clone_session(*arg)
        except Exception as e:  # duplicates and the like: skipped on both sides
            if "exist" not in str(e) and "duplicate" not in str(e).lower():
                raise


def state(dp: Dataplane, p: Pipeline) -> dict[str, Any]:
    return {
        "drops": dp.drop_counts(),
        "stats": dp.packet_counts(),
        "counters": {cid: dp.read_counter(cid) for cid in p.counters},
        "registers": {rid: dp.read_register(rid) for rid in p.registers},
        "direct": sorted(
            (e.table_id, repr(e.matches), e.counter_bytes, e.counter_packets)
            for e in dp.read_entries()
        ),
    }


def test_coverage_is_what_we_expect() -> None:
    pipes = {name: Pipeline.compile(PATHS[name]) for name in ALL}
    got = {name for name, p in pipes.items() if p.fast_unsupported is None}
    # COVERED is what test_fast_path_equals_general_path runs: every accepted program
    assert got == COVERED
    # the reasons for the rest are precise
    reasons = {name: p.fast_unsupported for name, p in pipes.items() if name not in COVERED}
    assert reasons["clone.p4"] == "uses C.clone_type"
    assert reasons["recirc.p4"] == "uses C.resubmit_fl"


def test_instance_type_constant_matches_the_dataplane() -> None:
    from shadowgrad.p4target import dataplane
    from shadowgrad.p4target.codegen import straight

    assert straight.PKT_REPLICATION == dataplane.PKT_REPLICATION


def test_unknown_shapes_are_refused() -> None:
    """A covered program's generated module with one construct the rewrite does not know
    is refused with a message naming it (and the unmodified module is accepted)."""
    p = Pipeline.compile(PROGS / "mcast.p4")
    general = p.source.split("\n_SPP0 = ")[0]
    assert "def fast(" not in general
    build_fast(ast.parse(general), p.facts, p.pack_formats)
    assert "        t_6(C, F)\n" in general
    for bad, why in (
        ("C.weird = 1", "uses C.weird"),
        ("x = C", "uses C as a value"),
        ("C.hdr.tag = C.hdr.udp", "uses C.hdr.tag"),
    ):
        with pytest.raises(FastPathUnsupported, match=why):
            build_fast(
                ast.parse(
                    general.replace("        t_6(C, F)\n", f"        t_6(C, F)\n        {bad}\n")
                ),
                p.facts,
                p.pack_formats,
            )


@pytest.mark.parametrize("prog", sorted(COVERED))
def test_fast_path_equals_general_path(prog: str) -> None:
    p = Pipeline.compile(PATHS[prog])
    fast = Dataplane(p, cpu_port=CPU)
    slow = Dataplane(p, cpu_port=CPU, fast_path=False)
    assert fast.fast_path and not slow.fast_path
    seen: dict[str, list[Any]] = {"fast": [], "slow": []}
    for name, dp in (("fast", fast), ("slow", slow)):
        dp.on_packet_in = lambda payload, md, n=name: seen[n].append(("pin", payload, md))
        dp.on_digest = lambda did, members, n=name: seen[n].append(("digest", did, members))
    rng = random.Random(prog)
    for _ in range(3):  # three control-plane states per program
        ops = program_state(rng, p)
        apply(fast, ops)
        apply(slow, ops)
        gen = sg_frame if prog in SG_TRAFFIC else frame
        for i in range(700):
            f = gen(rng)
            if i % 4 == 3:
                f = mutate(rng, f)
            if i % 50 == 49:
                f = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 40)))
            port = rng.choice([1, 1, 2, 3, CPU])
            if port == CPU and p.packet_out is not None:
                f = bytes([rng.choice([0, 1]), rng.choice([0x80, 0x00])]) + f  # port 2/3 or 0
            a = fast.process(port, f)
            b = slow.process(port, f)
            assert a == b, (i, port, f.hex())
        assert state(fast, p) == state(slow, p)
        assert seen["fast"] == seen["slow"]
        for dp in (fast, slow):
            for t in p.tables.values():
                if not t.is_const:
                    for e in dp.read_entries(t.id):
                        dp.delete_entry(e)
    assert not any(r == "internal_error" for _, r in fast.drop_counts())
    assert fast.packet_counts()["rx"] == 2100


def test_logging_uses_the_general_path() -> None:
    p = Pipeline.compile(PROGS / "mcast.p4")
    dp = Dataplane(p)
    lines: list[str] = []
    dp.on_log = lines.append
    dp.insert_multicast_group(1, [(2, 1)])
    mc = next(t for t in p.tables.values() if t.name.endswith(".mc"))
    flood = p.action_ids["McIngress.flood"]
    dp.insert_entry(
        TableEntry(
            mc.id, {mc.keys[0].id: Exact(0x020000000001)}, flood, {p.actions[flood].params[0].id: 1}
        )
    )
    out = dp.process(
        1, frame(random.Random(1))[:0] + bytes.fromhex("020000000001") * 2 + b"\x08\x00" + bytes(30)
    )
    assert len(out) == 1 and any(line.startswith("tx port=2") for line in lines)


SHAPES = """
#include "common.p4"
control SIngress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    bit<8> seen = 0;
    action set_port(bit<9> port) { standard_metadata.egress_spec = port; seen = 1; }
    action stop() { hdr.tag.info = 7; exit; }
    action mark(bit<8> v) { meta.mark = v; }
    table t1 {
        key = { hdr.tag.itype: exact; }
        actions = { set_port; stop; NoAction; }
        default_action = NoAction();
    }
    table t2 {
        key = { hdr.tag.rid: ternary; }
        actions = { mark; NoAction; }
        default_action = NoAction();
    }
    apply {
        standard_metadata.egress_spec = 1;
        if (!hdr.tag.isValid()) { exit; }
        if (t1.apply().hit) {
            hdr.tag.flags = seen;
        } else {
            mark(8w9);
        }
        switch (t2.apply().action_run) {
            mark: { hdr.tag.port = (bit<8>) meta.mark; }
            default: { hdr.tag.port = 3; }
        }
        if (hdr.tag.flags == 1) { hdr.tag.setInvalid(); }
    }
}
control SEgress(inout headers hdr, inout metadata meta,
                inout standard_metadata_t standard_metadata) {
    apply {
        if (standard_metadata.egress_port == 2) { hdr.ipv4.ttl = hdr.ipv4.ttl - 1; }
    }
}
V1Switch(CommonParser(), NoVerify(), SIngress(), SEgress(), Ipv4Checksum(),
         AllDeparser()) main;
"""


SUB_SHAPES = """
#include "common.p4"
/* nested sub-controls: a struct passed on by reference, a header by reference, scalars in,
 * out and inout, control locals, return, exit after a copy-out, a table in a nested one */
control Inner(inout headers h, inout tag_t t, out bit<8> got, inout bit<9> port) {
    bit<8> k = 3;
    action pick(bit<9> p) { port = p; k = 5; }
    table t3 {
        key = { t.rid: exact; }
        actions = { pick; NoAction; }
        default_action = NoAction();
    }
    apply {
        got = 0;
        if (t3.apply().hit) { got = k; }
        if (t.flags == 1) { t.info = 0x11; return; }
        if (t.info == 4) { port = 3; got = 0x44; exit; }
        h.ipv4.ttl = h.ipv4.ttl + k;
    }
}
control Outer(inout headers hdr, inout metadata meta, in bit<8> bias, inout bit<9> port) {
    Inner() inner;
    action mark(bit<8> v) { meta.mark = v + bias; }
    table t2 {
        key = { hdr.tag.itype: exact; }
        actions = { mark; NoAction; }
        default_action = NoAction();
    }
    apply {
        t2.apply();
        if (!hdr.tag.isValid()) { return; }
        inner.apply(hdr, hdr.tag, hdr.tag.port, port);  /* copied out before an exit too */
        if (hdr.tag.itype == 2) { exit; }
        hdr.tag.flags = hdr.tag.flags + 1;
    }
}
control Bump(inout bit<8> x) { apply { x = x + 1; } }
control SIngress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    Outer() outer;
    Bump() bump;
    apply {
        bit<9> port = 1;
        bit<8> b = 0;
        bump.apply(b);
        bump.apply(b);
        outer.apply(hdr, meta, b, port);
        standard_metadata.egress_spec = port;
        hdr.ipv4.diffserv = meta.mark;
    }
}
control SEgress(inout headers hdr, inout metadata meta,
                inout standard_metadata_t standard_metadata) {
    Bump() bump;
    apply {
        if (hdr.tag.isValid()) { bump.apply(hdr.tag.rid); }
    }
}
V1Switch(CommonParser(), NoVerify(), SIngress(), SEgress(), Ipv4Checksum(),
         AllDeparser()) main;
"""


def _fast_equals_general(p: Pipeline, *, seed: int) -> None:
    """Three rounds of random table state, each with 500 random frames on ports 1-3: the fast
    path's output and state equal the general path's."""
    fast = Dataplane(p, cpu_port=CPU)
    slow = Dataplane(p, cpu_port=CPU, fast_path=False)
    rng = random.Random(seed)
    for _ in range(3):
        ops = program_state(rng, p)
        apply(fast, ops)
        apply(slow, ops)
        for _ in range(500):
            f = frame(rng)
            port = rng.choice([1, 2, 3])
            assert fast.process(port, f) == slow.process(port, f), f.hex()
        assert state(fast, p) == state(slow, p)
        for dp in (fast, slow):
            for t in p.tables.values():
                for e in dp.read_entries(t.id):
                    dp.delete_entry(e)


def test_sub_control_shapes_equal() -> None:
    """Sub-controls inlined by the fast path (nested, by-reference structs and headers, scalar
    copy-in/copy-out, control locals, return, exit after a copy-out, applied in egress):
    covered and equal to the general path."""
    p = Pipeline.compile(SUB_SHAPES, [PROGS], filename="sub_shapes.p4")
    assert p.fast_unsupported is None, p.fast_unsupported
    assert {t.name for t in p.tables.values()} == {"SIngress.outer.t2", "SIngress.outer.inner.t3"}
    _fast_equals_general(p, seed=11)


def test_control_flow_shapes_equal() -> None:
    """Direct action calls, exit inside an action, hit/miss, switch on action_run, setInvalid,
    control locals: covered and equal to the general path."""
    p = Pipeline.compile(SHAPES, [PROGS], filename="shapes.p4")
    assert p.fast_unsupported is None, p.fast_unsupported
    _fast_equals_general(p, seed=7)
