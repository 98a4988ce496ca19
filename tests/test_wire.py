"""Wire protocol: round trips, golden vectors, corruption detection, scapy and P4 agreement."""

from __future__ import annotations

import itertools
import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadowgrad import errors, wire
from shadowgrad.wire import DType, Flag, Kind

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).with_name("golden") / "wire_vectors.json"
MANY = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
data_dtypes = st.sampled_from([d for d in DType if d is not DType.NONE])


@st.composite
def data_messages(draw: st.DrawFn, max_elems: int = 512) -> tuple[dict[str, object], bytes]:
    dtype = draw(data_dtypes)
    n = draw(st.integers(1, max_elems)) * dtype.itemsize
    fields: dict[str, object] = dict(
        job=draw(u32),
        sender=draw(u16),
        iteration=draw(u64),
        seq=draw(u64),
        layout=draw(u64),
        bucket=draw(u32),
        offset=draw(st.integers(0, 2**40)) * dtype.itemsize,
        dtype=dtype,
        flags=draw(st.sampled_from([Flag(0), Flag.FINAL, Flag.FINAL | Flag.RETX, Flag.LAST])),
    )
    payload = draw(st.binary(min_size=n, max_size=n))
    return fields, payload


def _data(fields: dict[str, object], payload: bytes) -> bytes:
    return wire.encode(Kind.DATA, payload=payload, **fields)  # type: ignore[arg-type]


#: a DATA record's fields that make it a bucket's last chunk of float32 values
_FINAL: dict[str, object] = {"dtype": DType.FLOAT32, "flags": Flag.FINAL}


# ----------------------------------------------------------------------------- round trips


@MANY
@given(data_messages())
def test_data_round_trip(msg: tuple[dict[str, object], bytes]) -> None:
    fields, payload = msg
    buf = _data(fields, payload)
    assert len(buf) == wire.HEADER_SIZE + len(payload)
    out = wire.decode(buf, job=fields["job"], layout=fields["layout"])  # type: ignore[arg-type]
    h = out.header
    assert h.kind is Kind.DATA and h.length == len(payload) and h.version == wire.VERSION
    for name, value in fields.items():
        assert getattr(h, name) == value, name
    assert bytes(out.payload) == payload


def test_decode_is_zero_copy() -> None:
    payload = bytes(range(64))
    buf = bytearray(
        _data(dict(job=1, sender=0, iteration=0, seq=0, layout=0, dtype=DType.FLOAT32), payload)
    )
    msg = wire.decode(buf)
    assert msg.payload.obj is buf  # a view into the receive buffer, not a copy
    buf[wire.HEADER_SIZE] ^= 0xFF
    assert msg.payload[0] == payload[0] ^ 0xFF


def test_encode_header_scatter_gather_equals_encode() -> None:
    payload = memoryview(bytearray(range(256)) * 4)
    kw = dict(
        job=3, sender=2, iteration=10, seq=5, layout=99, dtype=DType.FLOAT16, bucket=1, offset=512
    )
    header = wire.encode_header(Kind.DATA, payload=payload, **kw)  # type: ignore[arg-type]
    assert len(header) == wire.HEADER_SIZE
    assert header + payload.tobytes() == wire.encode(Kind.DATA, payload=payload, **kw)  # type: ignore[arg-type]


@MANY
@given(
    lrs=st.lists(st.floats(allow_nan=False), max_size=8),
    clip=st.none() | st.floats(0, 1, width=32),
    scale=st.none() | st.sampled_from([2.0**k for k in range(-4, 25)]),
    skipped=st.booleans(),
    user=st.binary(max_size=256),
    iteration=u64,
)
def test_commit_round_trip(
    lrs: list[float],
    clip: float | None,
    scale: float | None,
    skipped: bool,
    user: bytes,
    iteration: int,
) -> None:
    rec = wire.CommitRecord(tuple(lrs), clip, scale, skipped, user)
    buf = rec.encode(job=9, sender=0, iteration=iteration, seq=1, layout=5)
    msg = wire.decode(buf, job=9, layout=5)
    assert msg.header.kind is Kind.COMMIT and msg.header.iteration == iteration
    assert wire.CommitRecord.from_message(msg) == rec


def test_ready_ack_nack_round_trip() -> None:
    common = dict(job=1, sender=4, iteration=77, seq=3, layout=8)
    ready = wire.ReadyRecord(shard=2, replica=1, state=wire.ReadyState.APPLIED, last_applied=76)
    msg = wire.decode(wire.encode(Kind.READY, payload=ready.body(), **common))  # type: ignore[arg-type]
    assert wire.ReadyRecord.from_message(msg) == ready
    ack = wire.AckRecord(sack=0b1011)
    msg = wire.decode(wire.encode(Kind.ACK, payload=ack.body(), **common))  # type: ignore[arg-type]
    assert wire.AckRecord.from_message(msg) == ack and msg.header.seq == 3
    nack = wire.NackRecord.of([(0, 0, 1408), (3, 2816, 64)])
    msg = wire.decode(wire.encode(Kind.NACK, payload=nack.body(), **common))  # type: ignore[arg-type]
    assert wire.NackRecord.from_message(msg) == nack


# ----------------------------------------------------------------------------- corruption


@MANY
@given(data_messages(max_elems=64), st.data())
def test_any_single_byte_flip_is_detected(
    msg: tuple[dict[str, object], bytes], data: st.DataObject
) -> None:
    buf = bytearray(_data(*msg))
    i = data.draw(st.integers(0, len(buf) - 1), label="index")
    buf[i] ^= data.draw(st.integers(1, 255), label="xor")
    with pytest.raises(errors.WireError) as err:
        wire.decode(buf)
    # a specific subclass, never the generic base
    assert type(err.value) is not errors.WireError and err.value.reason != "malformed"


@MANY
@given(data_messages(max_elems=64), st.data())
def test_truncation_is_detected(msg: tuple[dict[str, object], bytes], data: st.DataObject) -> None:
    buf = _data(*msg)
    cut = data.draw(st.integers(0, len(buf) - 1))
    with pytest.raises(errors.TruncatedError):
        wire.decode(buf[:cut])


@MANY
@given(data_messages(max_elems=64), st.binary(min_size=1, max_size=128))
def test_trailing_bytes_are_detected(msg: tuple[dict[str, object], bytes], extra: bytes) -> None:
    with pytest.raises(errors.OversizeError):
        wire.decode(_data(*msg) + extra)


@MANY
@given(data_messages(max_elems=8), st.integers(wire.MAX_PAYLOAD + 1, 2**32 - 1))
def test_huge_length_field_is_detected(msg: tuple[dict[str, object], bytes], length: int) -> None:
    buf = bytearray(_data(*msg))
    struct.pack_into("!I", buf, wire.HEADER_SIZE - 8, length)
    with pytest.raises(errors.OversizeError):
        wire.decode(buf)


def _header_of_job_1(kind: Kind, **kw: Any) -> bytes:
    """``encode_header`` of job 1 with sender, iteration, seq and layout 0."""
    return wire.encode_header(kind, job=1, sender=0, iteration=0, seq=0, layout=0, **kw)


def test_oversize_payload_refused_on_encode() -> None:
    with pytest.raises(errors.OversizeError):
        _header_of_job_1(Kind.DATA, dtype=DType.UINT8, payload=bytes(wire.MAX_PAYLOAD + 1))


@MANY
@given(data_messages(max_elems=64), st.integers(0, 255).filter(lambda v: v != wire.VERSION))
def test_wrong_version_is_detected(msg: tuple[dict[str, object], bytes], version: int) -> None:
    fields, payload = msg
    header = wire.encode_header(Kind.DATA, payload=payload, version=version, **fields)  # type: ignore[arg-type]
    with pytest.raises(errors.VersionError):
        wire.decode(header + payload)


@MANY
@given(data_messages(max_elems=64), u32)
def test_foreign_job_is_detected(msg: tuple[dict[str, object], bytes], other: int) -> None:
    fields, payload = msg
    buf = _data(fields, payload)
    if other == fields["job"]:
        wire.decode(buf, job=other)
        return
    with pytest.raises(errors.ForeignJobError):
        wire.decode(buf, job=other)


@MANY
@given(st.binary(max_size=200))
def test_random_bytes_never_crash(buf: bytes) -> None:
    try:
        wire.decode(buf)
    except errors.WireError as e:
        assert type(e) is not errors.WireError
    else:  # only a valid datagram may decode; random bytes essentially never are
        assert buf[:2] == b"SG"


def test_layout_mismatch_bad_fields_and_kinds() -> None:
    kw = dict(job=1, sender=0, iteration=0, seq=0)
    buf = wire.encode(Kind.DATA, layout=5, dtype=DType.FLOAT32, payload=bytes(8), **kw)  # type: ignore[arg-type]
    with pytest.raises(errors.LayoutMismatchError):
        wire.decode(buf, layout=6)
    with pytest.raises(errors.BadFieldError):  # misaligned DATA
        wire.encode(Kind.DATA, layout=5, dtype=DType.FLOAT32, payload=bytes(6), **kw)  # type: ignore[arg-type]
    with pytest.raises(errors.BadFieldError):  # FINAL on a COMMIT
        wire.encode(Kind.COMMIT, layout=5, flags=Flag.FINAL, **kw)  # type: ignore[arg-type]
    with pytest.raises(errors.BadFieldError):  # out-of-range field names itself
        wire.encode(Kind.ACK, layout=-1, payload=bytes(8), **kw)  # type: ignore[arg-type]
    with pytest.raises(errors.LengthMismatchError):  # a COMMIT without its body
        wire.decode(wire.encode(Kind.COMMIT, layout=0, **kw))  # type: ignore[arg-type]
    # an undefined kind with a *valid* checksum is still refused by kind
    bad = bytearray(buf)
    bad[3] = 99
    prefix = bytes(bad[: wire.HEADER_SIZE - 4])
    crc = wire.crc(bytes(bad[wire.HEADER_SIZE :]), wire.crc(prefix))
    bad[wire.HEADER_SIZE - 4 : wire.HEADER_SIZE] = crc.to_bytes(4, "big")
    with pytest.raises(errors.UnknownKindError):
        wire.decode(bad)
    with pytest.raises(errors.BadMagicError):
        wire.decode(b"XX" + buf[2:])
    with pytest.raises(errors.ChecksumError):
        wire.decode(buf[:-1] + bytes([buf[-1] ^ 1]))


# ----------------------------------------------------------------------------- golden vectors


def _crc32c_reference(data: bytes) -> int:
    """Bitwise CRC-32C (reflected polynomial 0x82F63B78), independent of the C package."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc_is_crc32c() -> None:
    assert _crc32c_reference(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert wire.crc(b"123456789") == 0xE3069283
    assert wire.crc(b"6789", wire.crc(b"12345")) == 0xE3069283  # chaining


def _independent_header(v: dict[str, object], payload: bytes) -> bytes:
    """Assemble a header with int.to_bytes, independent of the codec's struct format."""
    out = b""
    for name, width in wire.HEADER_FIELDS[:-1]:
        value = (
            wire.MAGIC
            if name == "magic"
            else (
                len(payload)
                if name == "length"
                else v.get(name, wire.VERSION if name == "version" else 0)
            )
        )
        out += int(value).to_bytes(width // 8, "big")  # type: ignore[call-overload]
    return out + _crc32c_reference(out + payload).to_bytes(4, "big")


def test_golden_vectors() -> None:
    vectors = json.loads(GOLDEN.read_text())
    assert len(vectors) >= 5
    for v in vectors:
        raw = bytes.fromhex(v["hex"])
        payload = bytes.fromhex(v["payload_hex"])
        fields = dict(v["fields"])
        kind = Kind[fields.pop("kind")]
        fields["flags"] = Flag(fields["flags"])
        fields["dtype"] = DType[fields["dtype"]]
        assert wire.encode(kind, payload=payload, **fields) == raw, v["name"]
        assert _independent_header({**fields, "kind": kind}, payload) + payload == raw, v["name"]
        msg = wire.decode(raw)
        assert msg.header.kind is kind and bytes(msg.payload) == payload
        for name, value in fields.items():
            assert getattr(msg.header, name) == value, (v["name"], name)


# ----------------------------------------------------------------------------- scapy, P4, docs


@MANY
@given(data_messages(max_elems=32))
def test_scapy_and_fast_codec_agree(msg: tuple[dict[str, object], bytes]) -> None:
    scapy_layer = pytest.importorskip("shadowgrad.wire_scapy")
    from scapy.packet import Raw

    fields, payload = msg
    fast = _data(fields, payload)
    pkt = scapy_layer.ShadowGrad(
        kind=int(Kind.DATA),
        flags=int(fields["flags"]),
        dtype=int(fields["dtype"]),  # type: ignore[call-overload]
        **{k: v for k, v in fields.items() if k not in ("flags", "dtype")},
    ) / Raw(payload)
    assert bytes(pkt) == fast
    parsed = scapy_layer.ShadowGrad(fast)
    assert parsed.checksum == int.from_bytes(fast[wire.HEADER_SIZE - 4 : wire.HEADER_SIZE], "big")
    assert parsed.length == len(payload) and bytes(parsed.payload) == payload
    for name in ("job", "sender", "iteration", "seq", "layout", "bucket", "offset"):
        assert getattr(parsed, name) == fields[name]


def test_scapy_dissects_udp_on_default_port() -> None:
    scapy_layer = pytest.importorskip("shadowgrad.wire_scapy")
    from scapy.layers.inet import IP, UDP

    fields = {"job": 7, "sender": 1, "iteration": 2, "seq": 3, "layout": 4, **_FINAL}
    fast = _data(fields, bytes(16))
    frame = IP(bytes(IP(dst="127.0.0.1") / UDP(sport=1234, dport=wire.DEFAULT_UDP_PORT) / fast))
    layer = frame[scapy_layer.ShadowGrad]
    assert layer.job == 7 and layer.flags.FINAL and bytes(layer) == fast


def _p4_header_fields() -> list[tuple[str, int]]:
    text = (ROOT / "p4" / "include" / "headers.p4").read_text()
    body = re.search(r"header\s+shadowgrad_h\s*\{(.*?)\}", text, re.S)
    assert body, "header shadowgrad_h not found in p4/include/headers.p4"
    return [(n, int(w)) for w, n in re.findall(r"bit<(\d+)>\s+(\w+)\s*;", body.group(1))]


def test_p4_header_matches_wire() -> None:
    assert _p4_header_fields() == list(wire.HEADER_FIELDS)
    assert sum(w for _, w in wire.HEADER_FIELDS) == 8 * wire.HEADER_SIZE
    text = (ROOT / "p4" / "include" / "headers.p4").read_text()
    consts = {
        n: int(v, 0) for n, v in re.findall(r"const\s+bit<\d+>\s+(\w+)\s*=\s*(\w+)\s*;", text)
    }
    assert consts["SG_UDP_PORT"] == wire.DEFAULT_UDP_PORT
    assert consts["SG_MAGIC"] == wire.MAGIC and consts["SG_VERSION"] == wire.VERSION
    for k in Kind:
        assert consts[f"SG_KIND_{k.name}"] == k
    for f in Flag:
        assert consts[f"SG_FLAG_{f.name}"] == f


def test_protocol_doc_documents_every_field() -> None:
    doc = (ROOT / "docs" / "protocol.md").read_text()
    offset = 0
    for name, width in wire.HEADER_FIELDS:
        row = re.search(rf"^\|\s*{offset}\s*\|\s*{width // 8}\s*\|\s*`{name}`\s*\|", doc, re.M)
        assert row, f"docs/protocol.md lacks the row for {name} at offset {offset}"
        offset += width // 8
    assert str(wire.DEFAULT_UDP_PORT) in doc


def test_the_product_program_uses_the_one_wire_header() -> None:
    """p4/shadowgrad.p4 compiles with exactly one definition of the shadowgrad header, the one
    checked above, and parses it into ``hdr.sg``."""
    pytest.importorskip("lark")
    from shadowgrad.p4target.pipeline import Pipeline

    pipe = Pipeline.compile(ROOT / "p4" / "shadowgrad.p4")
    defining = [
        f for f, text in pipe.files.items() if re.search(r"\bheader\s+shadowgrad_h\b", text)
    ]
    assert [Path(f).as_posix().endswith("p4/include/headers.p4") for f in defining] == [True]
    for f, text in pipe.files.items():
        if f not in defining:
            assert "SG_MAGIC    =" not in text and "bit<64> iteration" not in text, f
    assert re.search(
        r"struct\s+headers_t\s*\{[^}]*\bshadowgrad_h\s+sg\s*;",
        pipe.files[next(f for f in pipe.files if f.endswith("types.p4"))],
    )


# --------------------------------------------------------------------------- authentication

KEY = wire.mac_key("job-secret", 7)
#: the sealed records' header fields (of job 7, whose key is ``KEY``)
_SEALED: dict[str, object] = {"job": 7, "sender": 0, "iteration": 4, "seq": 1, "layout": 9}


def test_mac_key_is_per_job_and_never_the_token() -> None:
    assert len(KEY) == 32 and b"job-secret" not in KEY
    assert wire.mac_key("job-secret", 8) != KEY and wire.mac_key("other", 7) != KEY
    assert wire.mac_key(b"job-secret", 7) == KEY


@pytest.mark.parametrize("kind", [Kind.COMMIT, Kind.NACK, Kind.READY, Kind.ACK, Kind.DATA])
def test_sealed_records_verify_and_forgeries_do_not(kind: Kind) -> None:
    body = {
        Kind.COMMIT: wire.CommitRecord(lrs=(1e-3,)).body(),
        Kind.NACK: wire.NackRecord.of([(0, 0, 64)]).body(),
        Kind.READY: wire.ReadyRecord(0, 0, wire.ReadyState.READY, 3).body(),
        Kind.ACK: wire.AckRecord(5).body(),
        Kind.DATA: bytes(range(64)),
    }[kind]
    extra = _FINAL if kind is Kind.DATA else {}
    data = wire.encode(kind, payload=body, key=KEY, **_SEALED, **extra)  # type: ignore[arg-type]
    assert len(data) == wire.HEADER_SIZE + len(body) + wire.MAC_SIZE
    msg = wire.decode(data, job=7, layout=9, key=KEY, require=frozenset(Kind))
    assert bytes(msg.payload) == body and msg.header.length == len(body)
    assert msg.header.flags & Flag.MAC
    assert wire.peek_header(data).length == len(body)
    # without a key the datagram still decodes (MAC not checked: a receiver without the key)
    assert bytes(wire.decode(data).payload) == body
    # another job's key, or any byte changed with the CRC fixed up, fails the MAC
    with pytest.raises(errors.BadMacError):
        wire.decode(data, key=wire.mac_key("job-secret", 8))
    for pos in (10, wire.HEADER_SIZE + 1, len(data) - 1):
        forged = bytearray(data)
        forged[pos] ^= 0x01
        forged[wire.HEADER_SIZE - 4 : wire.HEADER_SIZE] = wire.checksum(forged).to_bytes(4, "big")
        with pytest.raises(errors.WireError) as ei:
            wire.decode(bytes(forged), key=KEY)
        assert ei.value.reason in ("bad_mac", "field", "length", "kind"), ei.value.reason
    # the same record unsealed: refused by a receiver that holds the key
    plain = wire.encode(kind, payload=body, **_SEALED, **extra)  # type: ignore[arg-type]
    if kind in wire.AUTHENTICATED_KINDS:
        with pytest.raises(errors.UnauthenticatedError):
            wire.decode(plain, key=KEY)
    else:  # DATA: only when the receiver requires it
        wire.decode(plain, key=KEY)
        with pytest.raises(errors.UnauthenticatedError):
            wire.decode(plain, key=KEY, require=frozenset({Kind.DATA}))


def test_encode_header_refuses_a_mac_flag_it_cannot_fill() -> None:
    with pytest.raises(errors.WireError):
        _header_of_job_1(Kind.NACK, flags=Flag.MAC, payload=wire.NackRecord.of([]).body())


def test_nonces_never_repeat_in_a_process_nor_across_a_fork() -> None:
    """The GMAC's nonce is drawn by the sender (docs/security.md): a retransmission of the same
    bytes gets a new one, a forked child does not continue its parent's sequence."""
    import os

    fields = {"job": 7, "sender": 0, "iteration": 4, "seq": 1, "layout": 9}
    first = wire.encode(Kind.ACK, payload=bytes(8), key=KEY, **fields)  # type: ignore[arg-type]
    again = wire.encode(Kind.ACK, payload=bytes(8), key=KEY, **fields)  # type: ignore[arg-type]
    trailer = slice(-wire.MAC_SIZE, -wire.TAG_SIZE)
    assert first[: -wire.MAC_SIZE] == again[: -wire.MAC_SIZE] and first[trailer] != again[trailer]
    nonces = {wire._NONCES.next() for _ in range(20000)}
    assert len(nonces) == 20000 and len({n[:8] for n in nonces}) == 1  # one epoch, a counter
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report its first nonce and leave at once
        os.write(w, wire._NONCES.next())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 64)
    os.close(r)
    os.close(w)
    assert len(child) == wire.NONCE_SIZE and child[:8] != wire._NONCES.next()[:8]
    # a new epoch every 2^32 nonces gets a new prefix
    n = wire._Nonces()
    n._count = itertools.count(2**32 - 1)
    a, b = n.next(), n.next()
    assert a[:8] != b[:8] and a[8:] == b"\xff\xff\xff\xff" and b[8:] == bytes(4)


def test_a_sealed_datagrams_crc_covers_the_header_and_the_mac_the_rest() -> None:
    body = bytes(range(64))
    data = bytearray(_data({**_SEALED, **_FINAL, "key": KEY}, body))
    assert int.from_bytes(data[52:56], "big") == wire.crc(bytes(data[:52])) == wire.checksum(data)
    data[wire.HEADER_SIZE + 3] ^= 0x80  # a payload bit: the CRC does not see it, the MAC does
    with pytest.raises(errors.BadMacError):
        wire.decode(bytes(data), key=KEY)
    data[wire.HEADER_SIZE + 3] ^= 0x80
    data[20] ^= 0x01  # a header bit: the CRC sees it first
    with pytest.raises(errors.ChecksumError):
        wire.decode(bytes(data), key=KEY)
    data[20] ^= 0x01
    assert bytes(wire.decode(bytes(data), key=KEY).payload) == body
    with pytest.raises(errors.BadFieldError):
        wire.decode(bytes(data), key=b"short")  # not a wire.mac_key


def test_seal_in_place_equals_seal_and_copies_no_payload() -> None:
    buf = memoryview(bytearray(range(256)) * 4)
    at, n = 128, 512
    fields = {"job": 7, "sender": 1, "iteration": 3, "seq": 2, "layout": 9, "bucket": 1}
    payload = bytes(buf[at : at + n])
    dgram, trailer = wire.seal_in_place(
        Kind.DATA, key=KEY, buf=buf, at=at, length=n, dtype=DType.FLOAT32, offset=64, **fields
    )
    assert dgram.obj is buf.obj and dgram.nbytes == wire.HEADER_SIZE + n  # a view, no copy
    msg = wire.decode(bytes(dgram) + trailer, job=7, layout=9, key=KEY, require=frozenset(Kind))
    assert bytes(msg.payload) == payload and msg.header.offset == 64
    header, _ = wire.seal(
        Kind.DATA, key=KEY, payload=payload, dtype=DType.FLOAT32, offset=64, **fields
    )
    assert bytes(dgram[: wire.HEADER_SIZE]) == header  # the same header as seal()'s
    with pytest.raises(errors.BadFieldError):  # no room for the header
        wire.seal_in_place(
            Kind.DATA, key=KEY, buf=buf, at=8, length=64, dtype=DType.FLOAT32, **fields
        )


@given(
    seq=st.integers(0, 2**32 - 1),
    iteration=st.integers(0, 2**32 - 1),
    bucket=st.integers(0, 2**16 - 1),
    offset=st.integers(0, 2**40).map(lambda x: x * 4),
    n=st.integers(1, 300).map(lambda x: x * 4),
    last=st.booleans(),
    retx=st.booleans(),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_data_sealer_writes_seal_in_place_s_header_and_a_tag_that_verifies(
    seq: int, iteration: int, bucket: int, offset: int, n: int, last: bool, retx: bool
) -> None:
    """The sender's fast DATA sealer: the same header bytes as seal_in_place (the one encoder),
    a trailer that decode() verifies, and the payload untouched (a view, no copy)."""
    fields = {"job": 7, "sender": 3, "layout": 2**63 + 5}
    flags = Flag.FINAL | (Flag.LAST if last else 0) | (Flag.RETX if retx else 0)
    sealer = wire.DataSealer(KEY, **fields)
    a = memoryview(bytearray(range(256)) * 8)
    b = memoryview(bytearray(a))
    at = 100
    payload = bytes(a[at : at + n])
    trailer = sealer.seal(
        a,
        at,
        n,
        iteration=iteration,
        seq=seq,
        flags=int(flags),
        dtype=int(DType.FLOAT32),
        bucket=bucket,
        offset=offset,
    )
    _, ref = wire.seal_in_place(
        Kind.DATA,
        key=KEY,
        buf=b,
        at=at,
        length=n,
        iteration=iteration,
        seq=seq,
        flags=flags,
        dtype=DType.FLOAT32,
        bucket=bucket,
        offset=offset,
        **fields,
    )
    assert bytes(a) == bytes(b)  # header written in place, the same bytes; payload untouched
    assert len(trailer) == len(ref) == wire.MAC_SIZE and trailer[:12] != ref[:12]  # own nonce
    dgram = bytes(a[at - wire.HEADER_SIZE : at + n]) + trailer
    msg = wire.decode(dgram, job=7, layout=2**63 + 5, key=KEY, require=frozenset(Kind))
    assert bytes(msg.payload) == payload and msg.header.offset == offset
    assert msg.header.seq == seq and msg.header.flags == flags | Flag.MAC
    bad = bytearray(dgram)
    bad[-1] ^= 1
    with pytest.raises(errors.WireError):
        wire.decode(bytes(bad), key=KEY)


def test_data_sealer_refuses_what_seal_in_place_refuses_by_name() -> None:
    sealer = wire.DataSealer(KEY, job=7, sender=3, layout=9)
    buf = memoryview(bytearray(4096))
    ok = {
        "iteration": 1,
        "seq": 1,
        "flags": int(Flag.FINAL),
        "dtype": int(DType.FLOAT32),
        "bucket": 0,
        "offset": 0,
    }
    with pytest.raises(errors.BadFieldError, match="room"):
        sealer.seal(buf, 8, 64, **ok)
    with pytest.raises(errors.BadFieldError, match="itemsize"):
        sealer.seal(buf, 128, 62, **ok)
    with pytest.raises(errors.BadFieldError, match="seq"):
        sealer.seal(buf, 128, 64, **{**ok, "seq": 2**64})
    with pytest.raises(errors.BadFieldError, match="flags"):
        sealer.seal(buf, 128, 64, **{**ok, "flags": int(Flag.SKIPPED)})
    with pytest.raises(errors.BadFieldError, match="job"):
        wire.DataSealer(KEY, job=-1, sender=3, layout=9)


def test_chunk_for_fits_the_datagram_and_a_fragmenting_chunk_is_refused() -> None:
    """``chunk_for`` leaves room for the header and (authenticated) the MAC trailer; a chunk
    whose datagrams would be IP-fragmented on the way is refused with the size that fits (the
    switch parses first fragments only, so it would never copy those FINAL chunks)."""
    from shadowgrad.errors import ConfigError
    from shadowgrad.trainer_hooks._session import check_unfragmented, path_mtu

    assert wire.chunk_for(9000 - 28, mac=True) == 8832  # 8896 + 56 + 28 + 28 = 9008 > 9000
    assert wire.chunk_for(1500 - 28, mac=False) == wire.DEFAULT_CHUNK_BYTES
    with pytest.raises(ValueError, match="no room"):
        wire.chunk_for(wire.HEADER_SIZE + wire.MAC_SIZE + 63, mac=True)
    mtu = path_mtu("127.0.0.1", 9)
    assert mtu is not None and mtu >= 1500
    fits = wire.chunk_for(mtu - 28, mac=True)
    check_unfragmented(fits, True, [("127.0.0.1", 9)])
    with pytest.raises(ConfigError, match=f"MTU {mtu} .* largest that fits: {fits}"):
        check_unfragmented(fits + 64, True, [("127.0.0.1", 9)])
