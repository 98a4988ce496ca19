"""The shadow's direct-run receive loop in C (shadow/_rxnative.c): its CRC-32C and GMAC against
the crc32c package and shadowgrad.wire, and Runner.run over a real loopback UDP socket fed with
wire.encode's datagrams: what verifies lands exact and counts, a forgery counts as bad, and
anything that is not the chunk expected comes back whole in the scratch buffer."""

from __future__ import annotations

import os
import random
import shutil
import socket
import sysconfig
from collections.abc import Iterator

import pytest
from crc32c import crc32c

from shadowgrad import wire
from shadowgrad.shadow import _receiver as rcv


def test_the_c_loop_is_built_where_it_can_be() -> None:
    """make install builds it (gcc, libc6-dev, libssl-dev are in the apt list): where a C compiler,
    Python's and OpenSSL's headers are present, a missing module is a broken install, not a
    fallback to take silently."""
    if shutil.which("cc") is None or not os.path.exists("/usr/include/openssl/evp.h"):
        pytest.skip("no C compiler or no OpenSSL headers: the Python loop is the fallback")
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("no Python headers")
    assert rcv._rxnative is not None


native = pytest.importorskip("shadowgrad.shadow._rxnative")
KEY = wire.mac_key("rxnative-token", 5)
JOB = 5
LAYOUT = 0x1234_5678_9ABC_DEF0
CHUNK = 256


def _runner(key: bytes | None = KEY) -> object:
    return native.Runner(
        key,
        wire.HEADER_SIZE,
        rcv._HDR_TAIL_AT,
        wire.CHECKSUM_AT,
        wire.MAC_SIZE,
        wire.NONCE_SIZE,
        wire.MAX_DATAGRAM,
    )


def test_outcomes_match_the_receivers_names() -> None:
    assert (native.FLUSH, native.EMPTY, native.OTHER) == (
        rcv._NATIVE_FLUSH,
        rcv._NATIVE_EMPTY,
        rcv._NATIVE_OTHER,
    )


IMPLS = ("auto", *native.crc32c_impls())
#: 0, 1 and 7 to 9 bytes, 65,280, and either side of every block size of every implementation: 8,
#: 3 * 256 and 3 * 8192 (the crc32 instruction's streams); the fold's 16 (its lanes), 64 (its
#: single-accumulator steps) and 256 (four accumulators)
LENGTHS = sorted(
    {0, 1, 7, 8, 9, 65280}
    | {edge + d for edge in (64, 256, 320, 512, 528, 768, 3 * 8192) for d in (-1, 0, 1)}
)


def _cpu_flags() -> set[str] | None:
    """The first CPU's feature flags from /proc/cpuinfo (None where there is none: not x86
    Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        return None
    return None


def test_the_crc_implementations_this_cpu_runs() -> None:
    """Slicing-by-8 everywhere; the crc32 instruction with SSE4.2; the carry-less-multiply fold
    with AVX-512 and VPCLMULQDQ. An implementation the CPU lacks is refused by name."""
    impls = native.crc32c_impls()
    assert impls[0] == "table" and set(impls) <= {"table", "sse42", "fold"}
    flags = _cpu_flags()
    if flags is not None:  # what the kernel says this CPU has (and the OS enables)
        assert ("sse42" in impls) == ("sse4_2" in flags)
        assert ("fold" in impls) == ({"sse4_2", "avx512f", "vpclmulqdq"} <= flags)
    for name in {"table", "sse42", "fold", "crc"} - set(impls):
        with pytest.raises(ValueError, match=name):
            native.crc32c(b"x", 0, name)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("start", [0, 1, 3, 7])
def test_crc32c_matches_the_crc32c_package(impl: str, start: int) -> None:
    rng = os.urandom(3 * 8192 * 2 + 4096)
    for n in LENGTHS:
        data = rng[start : start + n]
        for value in (0, 0xFFFFFFFF, int.from_bytes(rng[:4], "little")):
            assert native.crc32c(data, value, impl) == crc32c(data, value), (n, value)


@pytest.mark.parametrize("impl", IMPLS)
def test_crc32c_at_random_lengths_alignments_and_values(impl: str) -> None:
    rng = random.Random(f"crc32c-{impl}")
    data = rng.randbytes(8192)
    for _ in range(2000):
        start, n, value = rng.randrange(64), rng.randrange(4096), rng.getrandbits(32)
        piece = data[start : start + n]
        assert native.crc32c(piece, value, impl) == crc32c(piece, value), (start, n, value)


def test_gmac_matches_wire_seal_and_refuses_any_change() -> None:
    payload = os.urandom(65280)
    header, trailer = wire.seal(
        wire.Kind.DATA,
        key=KEY,
        payload=payload,
        job=JOB,
        sender=0,
        iteration=1,
        seq=1,
        layout=LAYOUT,
        flags=wire.Flag.FINAL,
        dtype=wire.DType.FLOAT32,
        offset=0,
    )
    r = _runner()
    assert r.verify(header, payload, trailer)  # type: ignore[attr-defined]
    assert wire.verify_parts(KEY, header, payload, trailer)
    bad = bytearray(payload)
    bad[12345] ^= 0x10
    assert not r.verify(header, bytes(bad), trailer)  # type: ignore[attr-defined]
    h = bytearray(header)
    h[20] ^= 1
    assert not r.verify(bytes(h), payload, trailer)  # type: ignore[attr-defined]
    t = bytearray(trailer)
    t[0] ^= 1  # the nonce
    assert not r.verify(header, payload, bytes(t))  # type: ignore[attr-defined]
    other = _runner(wire.mac_key("another-token", JOB))
    assert not other.verify(header, payload, trailer)  # type: ignore[attr-defined]


def test_a_bad_layout_or_key_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        _runner(b"short")
    with pytest.raises(ValueError, match="inconsistent"):
        native.Runner(KEY, 56, 50, 52, 28, 12, 65507)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    tx.connect(rx.getsockname())
    try:
        yield rx, tx
    finally:
        rx.close()
        tx.close()


def _dgram(off: int, payload: bytes, *, auth: bool, it: int = 3) -> bytes:
    return wire.encode(
        wire.Kind.DATA,
        key=KEY if auth else None,
        job=JOB,
        sender=1,
        iteration=it,
        seq=off,
        layout=LAYOUT,
        payload=payload,
        flags=wire.Flag.FINAL,
        dtype=wire.DType.FLOAT32,
        offset=off,
    )


def _prefix(auth: bool) -> bytes:
    return _dgram(0, bytes(CHUNK), auth=auth)[: rcv._RUN_PREFIX]


@pytest.mark.parametrize("auth", [True, False], ids=["gmac", "crc"])
def test_run_lands_verified_chunks_exact_and_hands_on_the_rest(
    auth: bool, pair: tuple[socket.socket, socket.socket]
) -> None:
    rx, tx = pair
    r = _runner(KEY if auth else None)
    data = os.urandom(CHUNK * 12 + 100)
    box = bytearray(len(data) + 64)
    scratch = bytearray(wire.MAX_DATAGRAM + 1)
    src = tx.getsockname()
    base = 64  # box offset of bucket offset 0: the loop places relative to ``ls``
    seg_end = base + len(data)

    def run(ls: int, off: int, end: int, max_count: int = 16) -> tuple:
        return r.run(  # type: ignore[attr-defined, no-any-return]
            rx.fileno(), box, ls, end, seg_end, CHUNK, off, LAYOUT, _prefix(auth), src,
            max_count, scratch, auth,
        )  # fmt: skip

    # an empty socket
    assert run(base, 0, seg_end)[:5] == (native.EMPTY, base, 0, 0, 0)
    # three good chunks, then a forged fourth, then the genuine fourth: 4 counted, 1 bad
    for k in range(3):
        tx.send(_dgram(k * CHUNK, data[k * CHUNK : (k + 1) * CHUNK], auth=auth))
    forged = bytearray(_dgram(3 * CHUNK, data[3 * CHUNK : 4 * CHUNK], auth=auth))
    forged[wire.HEADER_SIZE + 5] ^= 1
    tx.send(bytes(forged))
    tx.send(_dgram(3 * CHUNK, data[3 * CHUNK : 4 * CHUNK], auth=auth))
    st, ls, off, count, bad, _, _ = run(base, 0, seg_end)
    assert (st, ls, off, count, bad) == (native.EMPTY, base + 4 * CHUNK, 4 * CHUNK, 4, 1)
    assert box[base : base + 4 * CHUNK] == data[: 4 * CHUNK]
    # max_count and the reservation's end stop the loop for the caller to cover
    for k in range(4, 8):
        tx.send(_dgram(k * CHUNK, data[k * CHUNK : (k + 1) * CHUNK], auth=auth))
    want = (native.FLUSH, ls + 2 * CHUNK, off + 2 * CHUNK, 2, 0)
    assert run(ls, off, seg_end, max_count=2)[:5] == want
    ls, off = ls + 2 * CHUNK, off + 2 * CHUNK
    assert run(ls, off, ls + CHUNK)[:5] == (native.FLUSH, ls + CHUNK, off + CHUNK, 1, 0)
    ls, off = ls + CHUNK, off + CHUNK
    assert run(ls, off, seg_end)[:5] == (native.EMPTY, ls + CHUNK, off + CHUNK, 1, 0)
    ls, off = ls + CHUNK, off + CHUNK
    assert box[base:ls] == data[:off]
    # not the chunk expected here: another iteration, a gap, a short and a long datagram, a
    # stranger's copy; each comes back whole in scratch, the run stays where it was
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger.bind(("127.0.0.1", 0))
    try:
        cases = [
            (tx, _dgram(off, data[off : off + CHUNK], auth=auth, it=4)),
            (tx, _dgram(off + CHUNK, data[off + CHUNK : off + 2 * CHUNK], auth=auth)),
            (tx, _dgram(off, data[off : off + CHUNK // 2], auth=auth)),
            (tx, _dgram(off, data[off : off + 2 * CHUNK], auth=auth)),
            (tx, _dgram(off, os.urandom(60000), auth=auth)),
            (stranger, _dgram(off, data[off : off + CHUNK], auth=auth)),
        ]
        for sock, d in cases:
            sock.sendto(d, rx.getsockname())
            st, ls2, off2, count, bad, got, frm = run(ls, off, seg_end)
            assert (st, ls2, off2, count, bad) == (native.OTHER, ls, off, 0, 0)
            assert got == len(d) and bytes(scratch[:got]) == d
            assert frm == sock.getsockname()
        # the run goes on where it was: the bytes a wrong datagram landed on are rewritten
        tx.send(_dgram(off, data[off : off + CHUNK], auth=auth))
        st, ls, off, count, bad, _, _ = run(ls, off, seg_end)
        assert (st, count, bad) == (native.EMPTY, 1, 0)
        assert box[base:ls] == data[:off]
    finally:
        stranger.close()
    # the box's last chunk is short (what is left of the box)
    for k in range(off // CHUNK, len(data) // CHUNK + 1):
        tx.send(_dgram(k * CHUNK, data[k * CHUNK : (k + 1) * CHUNK], auth=auth))
    st, ls, off, count, bad, _, _ = run(ls, off, seg_end)
    assert (st, ls, off, bad) == (native.FLUSH, seg_end, len(data), 0)
    assert box[base:seg_end] == data and box[:base] == bytes(base)
