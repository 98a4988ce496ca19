"""Wire protocol benchmark (issue 14, component ratio): the codec of :mod:`shadowgrad.wire`
against a plain copy of the same payload bytes, in one run.

For each DATA payload size the same random payload (``--total`` bytes) is cut into chunks of
that size, and every item below makes one pass over all of it, chunk by chunk, in the same
Python loop shape:

* ``memcpy``        -- copy each chunk into its place in a preallocated buffer of the whole
                       payload (``memoryview`` slice assignment, as a reassembly buffer is
                       filled): **the baseline of the ratios**;
* ``encode_header`` -- :func:`wire.encode_header` of a DATA datagram (header packed, CRC-32C over
                       header and payload, payload not copied: the senders' path, which then
                       ``sendmsg([header, payload])``);
* ``encode``        -- :func:`wire.encode`: the same plus header + payload joined into one
                       ``bytes`` (a copy);
* ``decode``        -- :func:`wire.decode` of the pre-encoded datagrams with ``job`` and
                       ``layout`` checks (CRC-32C verified, payload returned as a view);
* ``seal``          -- :func:`wire.seal`: the header (its CRC-32C over the header only) and the
                       28-byte trailer, a fresh nonce and the AES-256-GCM tag over header and
                       payload used as a MAC (the senders' path with
                       ``security.authenticate_data``, the shipped default);
* ``decode_mac``    -- :func:`wire.decode` of the sealed datagrams with the job's key, DATA
                       required to carry a MAC (the header's CRC-32C and the GMAC verified).

``memcpy_bulk`` (the whole payload in one slice assignment) is given for scale; it is not the
baseline. Sizes (``--sizes``, default): 1344 B (the MTU chunk with the DATA MAC: what a trainer
picks for a 1500-byte MTU with ``authenticate_data``), 1408 B (:data:`wire.DEFAULT_CHUNK_BYTES`,
the MTU chunk without the MAC) and 65408 B (the loopback chunk: the largest datagram less the
header, in 64-byte granules). Every item is warmed once, then ``--rounds`` rounds run, each
item once per round in an order that rotates (load from other processes hits all alike). Per
item: MB/s (1 MB = 1e6 payload bytes) median, min and max over the rounds; ``ratio_to_memcpy``
is the median rate over memcpy's median rate, and ``paired_ratio`` the median, min and max of
the per-round ratios. Before timing, every datagram is decoded once and its payload compared
with the original (plain and sealed). Timings are reported, never asserted.

    .venv/bin/python bench/wire_bench.py             # 64 MB per pass, 10 rounds
    .venv/bin/python bench/wire_bench.py --quick     # 16 MB per pass, 5 rounds (< 30 s)
    .venv/bin/python bench/wire_bench.py --sizes 1408,65408 --total 8000000 --rounds 7

Results: ``bench/results/wire_bench.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shadowgrad import wire

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "wire_bench.json"
#: UDP payload room of a 1500-byte MTU (as trainer_hooks._session.NETWORK_DATAGRAM)
MTU_DATAGRAM = 1500 - 20 - 8
MTU_CHUNK_MAC = (MTU_DATAGRAM - wire.HEADER_SIZE - wire.MAC_SIZE) // 64 * 64  # 1344
LOOPBACK_CHUNK = (wire.MAX_DATAGRAM - wire.HEADER_SIZE) // 64 * 64  # 65408
DEFAULT_SIZES = (MTU_CHUNK_MAC, wire.DEFAULT_CHUNK_BYTES, LOOPBACK_CHUNK)
BASELINE = "memcpy"
ITEMS = ("memcpy", "encode_header", "encode", "decode", "seal", "decode_mac", "memcpy_bulk")
JOB = 7
SENDER = 3
ITERATION = 12
LAYOUT = 0x5EED5EED5EED5EED
TOKEN = "wire-bench-token"


def payload_bytes(total: int, seed: int = 14) -> bytes:
    """``total`` pseudo-random bytes (a gradient's bytes compress no better)."""
    return random.Random(seed).randbytes(total)


def _fields(offset: int, chunk: memoryview) -> dict[str, Any]:
    return {
        "job": JOB,
        "sender": SENDER,
        "iteration": ITERATION,
        "seq": offset // 4,
        "layout": LAYOUT,
        "payload": chunk,
        "flags": wire.Flag.FINAL,
        "dtype": wire.DType.FLOAT32,
        "bucket": 0,
        "offset": offset,
    }


def split(payload: bytes, chunk: int) -> list[tuple[int, memoryview]]:
    """``(offset, view)`` of each chunk of ``payload``; ``chunk`` a multiple of 4 (FLOAT32)."""
    if chunk <= 0 or chunk % 4:
        raise ValueError(f"chunk {chunk} must be a positive multiple of 4")
    mv = memoryview(payload)
    return [(o, mv[o : o + chunk]) for o in range(0, len(payload), chunk)]


def encode_datagrams(payload: bytes, chunk: int, key: bytes | None = None) -> list[bytes]:
    """The DATA datagrams of ``payload`` in chunks of ``chunk`` bytes, sealed with ``key``."""
    return [wire.encode(wire.Kind.DATA, key=key, **_fields(o, c)) for o, c in split(payload, chunk)]


def decode_datagrams(datagrams: list[bytes], key: bytes | None = None) -> bytes:
    """Verify every datagram (MAC required with ``key``) and put the payload back together."""
    require = wire.AUTHENTICATED_KINDS | {wire.Kind.DATA}
    out = bytearray()
    for d in datagrams:
        msg = wire.decode(d, job=JOB, layout=LAYOUT, key=key, require=require)
        if msg.header.offset != len(out):
            raise AssertionError(f"chunk at {msg.header.offset}, expected {len(out)}")
        out += msg.payload
    return bytes(out)


def items_for(payload: bytes, chunk: int, key: bytes) -> dict[str, Callable[[], object]]:
    """One pass over ``payload`` per item (see the module docstring), same chunks for all."""
    chunks = split(payload, chunk)
    dst = bytearray(len(payload))
    dmv = memoryview(dst)
    plain = encode_datagrams(payload, chunk)
    sealed = encode_datagrams(payload, chunk, key)
    require = wire.AUTHENTICATED_KINDS | {wire.Kind.DATA}
    kind = wire.Kind.DATA

    def memcpy() -> None:
        for o, c in chunks:
            dmv[o : o + len(c)] = c

    def memcpy_bulk() -> None:
        dmv[:] = payload

    def encode_header() -> None:
        for o, c in chunks:
            wire.encode_header(kind, **_fields(o, c))

    def encode() -> None:
        for o, c in chunks:
            wire.encode(kind, **_fields(o, c))

    def decode() -> None:
        for d in plain:
            wire.decode(d, job=JOB, layout=LAYOUT)

    def seal() -> None:
        for o, c in chunks:
            wire.seal(kind, key=key, **_fields(o, c))

    def decode_mac() -> None:
        for d in sealed:
            wire.decode(d, job=JOB, layout=LAYOUT, key=key, require=require)

    fns: dict[str, Callable[[], object]] = {
        "memcpy": memcpy,
        "encode_header": encode_header,
        "encode": encode,
        "decode": decode,
        "seal": seal,
        "decode_mac": decode_mac,
        "memcpy_bulk": memcpy_bulk,
    }
    return {name: fns[name] for name in ITEMS}


def bench_size(chunk: int, total: int, rounds: int, *, seed: int = 14) -> dict[str, Any]:
    """All items for one payload size: round-trip check, warm-up, ``rounds`` rotating rounds."""
    total = max(chunk, total // chunk * chunk)
    payload = payload_bytes(total, seed)
    key = wire.mac_key(TOKEN, JOB)
    # correctness first: what is encoded decodes back to the same bytes, with and without MAC
    roundtrip = (
        decode_datagrams(encode_datagrams(payload, chunk)) == payload
        and decode_datagrams(encode_datagrams(payload, chunk, key), key) == payload
    )
    if not roundtrip:
        raise AssertionError(f"chunk {chunk}: decode(encode(payload)) != payload")
    fns = items_for(payload, chunk, key)
    for fn in fns.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in _common.rotation(names, r):
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    rates = {name: [total / t / 1e6 for t in ts] for name, ts in times.items()}
    base = rates[BASELINE]
    base_med = statistics.median(base)
    items: dict[str, Any] = {}
    for name, rs in rates.items():
        paired = [x / b for x, b in zip(rs, base, strict=True)]
        items[name] = {
            "mbps_median": statistics.median(rs),
            "mbps_min": min(rs),
            "mbps_max": max(rs),
            "mbps_rounds": rs,
            "us_per_chunk_median": statistics.median(times[name]) / (total // chunk) * 1e6,
            "ratio_to_memcpy": statistics.median(rs) / base_med,
            "paired_ratio": {
                "median": statistics.median(paired),
                "min": min(paired),
                "max": max(paired),
            },
        }
    return {
        "chunk_bytes": chunk,
        "total_bytes": total,
        "chunks": total // chunk,
        "datagram_bytes": chunk + wire.HEADER_SIZE,
        "datagram_bytes_mac": chunk + wire.HEADER_SIZE + wire.MAC_SIZE,
        "roundtrip_ok": roundtrip,
        "rounds": rounds,
        "items": items,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 MB per pass, 5 rounds")
    ap.add_argument(
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        help="comma list of DATA payload sizes in bytes (multiples of 4)",
    )
    ap.add_argument(
        "--total",
        type=int,
        default=0,
        help="payload bytes per pass (default 64e6; 16e6 with --quick)",
    )
    ap.add_argument("--rounds", type=int, default=0, help="timed rounds (default 10; 5 --quick)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    total = args.total or (16_000_000 if args.quick else 64_000_000)
    rounds = args.rounds or (5 if args.quick else 10)
    sizes = [int(s) for s in args.sizes.split(",")]
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    doc: dict[str, Any] = {
        "bench": "wire_bench",
        "command": "python bench/wire_bench.py" + (" --quick" if args.quick else ""),
        "time": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": _common.machine(crc32c=_common.version("crc32c")),
        "baseline": BASELINE,
        "method": "one pass over the payload per item, chunk by chunk; MB/s = 1e6 payload "
        f"bytes/s; warm-up then {rounds} rotating rounds; median, min, max",
        "mac_size": wire.MAC_SIZE,
        "header_size": wire.HEADER_SIZE,
        "sizes": [],
    }
    print(
        f"{'chunk B':>8} {'item':<14} {'MB/s med':>9} {'min':>8} {'max':>8} "
        f"{'us/chunk':>9} {'x memcpy':>9}"
    )
    for chunk in sizes:
        r = bench_size(chunk, total, rounds)
        doc["sizes"].append(r)
        for name, x in r["items"].items():
            print(
                f"{chunk:>8} {name:<14} {x['mbps_median']:>9.0f} {x['mbps_min']:>8.0f} "
                f"{x['mbps_max']:>8.0f} {x['us_per_chunk_median']:>9.2f} "
                f"{x['ratio_to_memcpy']:>9.3f}",
                flush=True,
            )
    doc["wall_s"] = time.monotonic() - t0
    _common.write_json(args.out, doc)
    print(f"wrote {args.out} ({doc['wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
