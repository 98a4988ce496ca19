"""A parser whose states form a cycle: the general backend writes it as a loop over a state
number (every test program in tests/p4progs is a small DAG, written as nested ifs), counts the
states it ran and raises ParserTimeout after 1,000 of them; the packet then reaches ingress with
``parser_error`` set, as every parser error does on this target."""

from __future__ import annotations

import pytest

pytest.importorskip("p4")

from shadowgrad.p4target.dataplane import Dataplane
from shadowgrad.p4target.pipeline import Pipeline

LOOP_P4 = """
#include <core.p4>
#include <v1model.p4>

header ethernet_t { bit<48> dst; bit<48> src; bit<16> etherType; }
header tag_t { bit<8> more; bit<8> val; }
struct headers { ethernet_t ethernet; tag_t tag; }
struct metadata { bit<16> count; bit<8> sum; }

parser LoopParser(packet_in pkt, out headers hdr, inout metadata meta,
                  inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) { 0x9999: parse_tag; default: accept; }
    }
    state parse_tag {
        pkt.extract(hdr.tag);
        meta.count = meta.count + 1;
        meta.sum = meta.sum + hdr.tag.val;
        transition select(hdr.tag.more) { 1: parse_tag; default: accept; }
    }
}
control NoVerify(inout headers hdr, inout metadata meta) { apply { } }
control Ing(inout headers hdr, inout metadata meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = (bit<9>) meta.count;
        hdr.ethernet.src[7:0] = meta.sum;
        if (sm.parser_error != error.NoError) { hdr.ethernet.src[15:8] = 0xEE; }
    }
}
control Eg(inout headers hdr, inout metadata meta, inout standard_metadata_t sm) { apply { } }
control NoCsum(inout headers hdr, inout metadata meta) { apply { } }
control Dep(packet_out pkt, in headers hdr) {
    apply { pkt.emit(hdr.ethernet); pkt.emit(hdr.tag); }
}
V1Switch(LoopParser(), NoVerify(), Ing(), Eg(), NoCsum(), Dep()) main;
"""


def _tags(k: int) -> bytes:
    """``k`` tags, values 1..k, each but the last saying another follows."""
    return b"".join(bytes([1 if i < k - 1 else 0, i + 1]) for i in range(k))


@pytest.fixture(scope="module")
def pipe() -> Pipeline:
    return Pipeline.compile(LOOP_P4, filename="loop.p4")


def test_a_cyclic_parser_is_a_loop_over_states(pipe: Pipeline) -> None:
    parse = pipe.source.split("def parse(C):", 1)[1].split("\ndef ", 1)[0]
    assert "while True:" in parse and "if n > 1000:" in parse
    assert pipe.fast_unsupported == "a loop (a parser whose states form a cycle)"


@pytest.mark.parametrize("k", [1, 2, 5, 40])
def test_each_tag_is_one_more_trip_round_the_loop(pipe: Pipeline, k: int) -> None:
    dp = Dataplane(pipe, cpu_port=255)
    frame = bytes(12) + b"\x99\x99" + _tags(k) + b"payload"
    # egress port = tags parsed; src's low byte = their sum; the last tag is the one emitted
    want = bytes(11) + bytes([k * (k + 1) // 2 % 256]) + b"\x99\x99" + b"\x00" + bytes([k])
    assert dp.process(1, frame) == [(k, want + b"payload")]


def test_parser_timeout_after_1000_states(pipe: Pipeline) -> None:
    """1,100 tags that all say "more": start and 1,000 tag states run, then ParserTimeout; the
    packet goes on to ingress with parser_error set (count 1,000 -> port 1000 mod 512)."""
    dp = Dataplane(pipe, cpu_port=255)
    out = dp.process(1, bytes(12) + b"\x99\x99" + b"\x01\x02" * 1100)
    assert len(out) == 1
    port, frame = out[0]
    assert port == 1000 % 512
    assert frame[10] == 0xEE and frame[11] == 2000 % 256
