"""Authentication cost: shadow ingest with and without DATA authentication against the bare UDP
receive loop, in one run, plus what record authentication costs per iteration.

Run (defaults: 25M params x 3 iterations = 300 MB per pass, 5 interleaved rounds; ~30 s on 2
cores)::

    .venv/bin/python bench/auth_bench.py --out bench/results/auth_bench.json
    .venv/bin/python bench/auth_bench.py --rounds 5 --iterations 4 --shadows 8 --period 0.5

A. **End to end**, the approach of ``bench/_ingest.py`` part A (whose helpers this imports): a
   producer process streams pre-encoded 64 KiB DATA datagrams flat out, from a socket bound to
   the spec's trainer address, at

   * ``bare``       -- a bare ``recv_into`` loop (the baseline of the ratios);
   * ``bare_box``   -- the same loop receiving each datagram after the last in memory the size
     of the pass (faulted in beforehand, as a shadow's recycled iteration buffers are): what
     the kernel's copy into memory that is not in cache costs, without any check; the
     shadows' own work is what they add to it;
   * ``ingest_crc`` -- a real :class:`~shadowgrad.shadow.node.ShadowNode` with
     ``security.authenticate_data = false``: DATA is CRC-32C-checked only;
   * ``ingest_mac`` -- the same with ``authenticate_data = true`` (the shipped default): DATA is
     sealed by the producer (``wire.seal``: header + payload + 28-byte trailer) and the shadow
     verifies the header's CRC-32C and the GMAC tag (AES-256-GCM as a MAC).

   Each shadow pass is a fresh node warmed to steady state first: ``--iterations`` iterations
   and their COMMITs fed in-process and applied, so the measured iterations place into recycled
   buffers (a cold node spends as much zeroing new iteration buffers as on the rest of ingest).
   The producer outruns both shadows, which therefore drain a full receive queue and process
   what fits (bare keeps up); the rate is their processing rate, the rest is dropped.
   The variants run in ``--rounds`` interleaved rounds (the order rotates each round). Per pass:
   MB/s = bytes *processed* (bare: received; shadow: new DATA bytes placed) over first -> last
   datagram, as in ``_ingest.py``; CPU = CPU time of the receiving thread (bare: the loop's
   thread, shadow: its rx thread) per GB processed. Medians over rounds; ratios from medians and
   the median of the per-round (paired) ratios.
B. **In-process micro-benchmarks** (median of repeats, timeit-style): the authenticator
   candidates on a 64 KiB buffer (GB/s): keyed BLAKE2b-128 (the previous scheme), HMAC-SHA256,
   keyed BLAKE3 where installed, ChaCha20-Poly1305 and AES-256-GCM with associated data only,
   wire's GMAC with its nonce draw, against CRC-32C and memcpy; COMMIT / READY / NACK records
   encoded with and without the key and decoded with and without it (us each); DATA sealing
   (``wire.seal`` against ``wire.encode_header``) and DATA verification per MB at the loopback
   chunk (65408 B) and the MTU chunk (1408 B): the sender-side and in-process receiver-side
   cost of ``authenticate_data``.
C. **Per iteration**: rank 0 encodes one COMMIT per shadow and each shadow verifies it; each
   shadow seals a READY every 50 ms (and ~2 on state changes per iteration) that each of its
   ``S - 1`` peers verifies; NACKs are rare (one is priced separately). Given for
   ``--shadows`` (and 1/2/4/8) at ``--period`` seconds per iteration, plus the DATA share for a
   ``--model-params`` model.

Timings are reported, never asserted. Every child process is reaped (try/finally).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _common
import _ingest as ING  # noqa: N812

ROOT = Path(__file__).resolve().parent.parent
TOKEN_ENV = "SHADOWGRAD_AUTH_BENCH_TOKEN"
VARIANTS = ("bare", "bare_box", "ingest_crc", "ingest_mac")


CHUNK: int = ING.CHUNK  # 65280-byte DATA payloads, as in _ingest.py
TOKEN: str = ING.TOKEN
JOB: int = ING.JOB


# --------------------------------------------------------------------------- producer process


def _producer_main(argv: list[str]) -> None:
    """Pre-encode every datagram (sealed with the job's key when ``cfg["seal"]``), wait for
    ``go``, send them flat out from the trainer address, print what was sent."""
    cfg = json.loads(argv[0])
    from shadowgrad import wire

    # bound to cfg["bind_port"], the spec's trainer address
    layout, dest, sock, grads = ING.producer_setup(cfg)
    key = wire.mac_key(TOKEN, JOB) if cfg["seal"] else None
    dgrams: list[bytes] = []
    seq = 0
    first = cfg.get("first_iteration", 0)
    for it in range(first, first + cfg["iterations"]):
        for b, g in enumerate(grads):
            for off in range(0, len(g), CHUNK):
                seq += 1
                p = g[off : off + CHUNK]
                fields = ING.data_fields(layout, it, seq, b, off, payload=p)
                if key is not None:
                    header, tag = wire.seal(wire.Kind.DATA, key=key, **fields)
                    dgrams.append(header + p + tag)
                else:
                    dgrams.append(wire.encode_header(wire.Kind.DATA, **fields) + p)
    ING.send_burst(sock, dest, dgrams)


class _Producer(ING._Producer):  # type: ignore[misc]
    """``_ingest._Producer`` (go / result / reap, a context manager), launching this file's
    producer."""

    script = os.path.abspath(__file__)


# --------------------------------------------------------------------------- part A


def _node(layout: Any, authenticate_data: bool, window: int) -> Any:
    """A loaded ShadowNode owning the whole layout (SGD replay; nothing is applied here)."""

    from shadowgrad.shadow.node import NodeOptions

    sock = ING._udp()
    spec = ING._spec(
        sock.getsockname()[1],
        ING._free_udp_port(),
        "auth-bench",
        security={"token_env": TOKEN_ENV, "authenticate_data": authenticate_data},
    )
    return ING.start_node(
        spec, sock, layout, "sgd", token=TOKEN, options=NodeOptions(window=window, rx_threads=1)
    )


def _thread_cpu(name: str) -> Callable[[], float]:
    """CPU-time clock of the live thread called ``name``."""
    for t in threading.enumerate():
        if t.name == name and t.ident is not None:
            clk = time.pthread_getcpuclockid(t.ident)
            return lambda: time.clock_gettime(clk)
    raise RuntimeError(f"no thread {name!r}")


def _pass_bare(layout: Any, iterations: int, *, box: bool = False) -> dict[str, Any]:
    """The bare loop into one hot buffer, or with ``box`` into a buffer the size of the pass,
    each datagram after the last (as a shadow places a stream's chunks into its boxes)."""
    sock = ING._udp()
    prod = None
    dest = None
    if box:
        dest = bytearray(layout.total_bytes * iterations + 2 * 65536)
        dest[::4096] = b"\x01" * len(range(0, len(dest), 4096))  # faulted in, as reused boxes are
    try:
        prod = _Producer(
            layout,
            sock.getsockname()[1],
            iterations,
            bind_port=ING._free_udp_port(),
            seal=False,
        )
        expected = prod.ready["ready"]
        cpu0 = time.thread_time()
        prod.go()
        got, nbytes, t_first, t_last = ING.recv_all(sock, expected, dest=dest)
        cpu = time.thread_time() - cpu0
        sent = prod.result(60)
    finally:
        if prod is not None:
            prod.reap()
        sock.close()
    return {
        "mbps": nbytes / max(1e-9, t_last - t_first) / 1e6,
        "cpu_s": cpu,
        "cpu_s_per_gb": cpu / max(1e-12, nbytes / 1e9),
        "bytes": nbytes,
        "datagrams": expected,
        "received": got,
        "producer_mbps": sent["bytes"] / sent["seconds"] / 1e6,
    }


def _pass_node(layout: Any, iterations: int, authenticate_data: bool) -> dict[str, Any]:
    node = _node(layout, authenticate_data, window=iterations)
    prod = None
    try:
        first = ING.warm(node, layout, iterations, TOKEN, authenticate_data)
        rx_cpu = _thread_cpu("shadow0-rx0")
        prod = _Producer(
            layout,
            node.sock.getsockname()[1],
            iterations,
            first_iteration=first,
            bind_port=node.spec.trainers.addresses[0].port,
            seal=authenticate_data,
        )
        expected = prod.ready["ready"]
        st0 = node.status(timeline=0)
        rx0 = sum(node.rx.values())
        cpu0, pcpu0 = rx_cpu(), time.process_time()
        prod.go()
        sent = prod.result(60)
        ING.wait_rx_quiet(node, 0.2)
        # the rx thread idles in recv (timeout tick_s) meanwhile: a few us per tick
        cpu, pcpu = rx_cpu() - cpu0, time.process_time() - pcpu0
        st = node.status(timeline=iterations)
        if node.failed is not None:
            raise RuntimeError(f"shadow thread died: {node.failed!r}")
    finally:
        if prod is not None:
            prod.reap()
        node.stop()
    firsts = [p["first_chunk"] for p in st["pending"].values() if p["first_chunk"]]
    lasts = [p["last_chunk"] for p in st["pending"].values() if p["last_chunk"]]
    data_bytes = st["events"].get("data_bytes", 0) - st0["events"].get("data_bytes", 0)
    span = max(lasts) - min(firsts) if firsts and lasts else 0.0
    return {
        "mbps": data_bytes / max(1e-9, span) / 1e6,
        "cpu_s": cpu,
        "cpu_s_per_gb": cpu / max(1e-12, data_bytes / 1e9),
        "process_cpu_s_per_gb": pcpu / max(1e-12, data_bytes / 1e9),
        "bytes": data_bytes,
        "datagrams": expected,
        "counted": sum(node.rx.values()) - rx0,
        "counters": {
            k: n for k, v in st["counters"].items() if (n := v - st0["counters"].get(k, 0))
        },
        "nack_sent": st["events"].get("nack_sent", 0) - st0["events"].get("nack_sent", 0),
        "producer_mbps": sent["bytes"] / sent["seconds"] / 1e6,
    }


def part_a(n_params: int, iterations: int, rounds: int) -> dict[str, Any]:
    layout = ING._layout(n_params)

    def run(v: str, r: int) -> dict[str, Any]:
        res = (
            _pass_bare(layout, iterations, box=v == "bare_box")
            if v.startswith("bare")
            else _pass_node(layout, iterations, authenticate_data=v == "ingest_mac")
        )
        print(
            f"  round {r} {v:<10} {res['mbps']:7.0f} MB/s  {res['cpu_s_per_gb']:.3f} "
            f"CPU-s/GB  (producer {res['producer_mbps']:.0f} MB/s, load "
            f"{os.getloadavg()[0]:.1f})",
            flush=True,
        )
        return res

    runs = _common.interleaved(VARIANTS, rounds, run)
    summary = {
        v: {
            "mbps_median": _common.median([x["mbps"] for x in rs]),
            "mbps_min": min(x["mbps"] for x in rs),
            "mbps_max": max(x["mbps"] for x in rs),
            "cpu_s_per_gb_median": _common.median([x["cpu_s_per_gb"] for x in rs]),
            "producer_mbps_median": _common.median([x["producer_mbps"] for x in rs]),
        }
        for v, rs in runs.items()
    }

    def paired(a: str, b: str, key: str) -> float:
        return _common.paired_median(runs, a, b, key)

    m = {v: s["mbps_median"] for v, s in summary.items()}
    c = {v: s["cpu_s_per_gb_median"] for v, s in summary.items()}
    ratios = {
        "bare_box_vs_bare": m["bare_box"] / m["bare"],
        "paired_bare_box_vs_bare": paired("bare_box", "bare", "mbps"),
        "ingest_crc_vs_bare_box": m["ingest_crc"] / m["bare_box"],
        "ingest_mac_vs_bare_box": m["ingest_mac"] / m["bare_box"],
        "ingest_crc_vs_bare": m["ingest_crc"] / m["bare"],
        "ingest_mac_vs_bare": m["ingest_mac"] / m["bare"],
        "ingest_mac_vs_ingest_crc": m["ingest_mac"] / m["ingest_crc"],
        "paired_ingest_crc_vs_bare": paired("ingest_crc", "bare", "mbps"),
        "paired_ingest_mac_vs_bare": paired("ingest_mac", "bare", "mbps"),
        "paired_ingest_mac_vs_ingest_crc": paired("ingest_mac", "ingest_crc", "mbps"),
        "cpu_per_gb_mac_over_crc": c["ingest_mac"] / c["ingest_crc"],
        "cpu_s_per_gb_added_by_data_mac": c["ingest_mac"] - c["ingest_crc"],
    }
    return {
        "params": sum(p.numel for p in layout.params),
        "iterations_per_pass": iterations,
        "bytes_per_pass": layout.total_bytes * iterations,
        "datagram_payload": CHUNK,
        "rounds": rounds,
        "summary": summary,
        "ratios": ratios,
        "runs": runs,
    }


# --------------------------------------------------------------------------- part B


def _per_call(fn: Callable[[], object], target_s: float = 0.02, repeat: int = 7) -> float:
    """Median seconds per call of ``fn`` over ``repeat`` timings of ~``target_s`` each."""
    t = timeit.Timer(fn)
    number = 1
    while True:
        dt = t.timeit(number)
        if dt >= target_s / 4 or number >= 1 << 22:
            break
        number *= 4
    number = max(1, int(number * target_s / max(dt, 1e-9)))
    return statistics.median(t.repeat(repeat=repeat, number=number)) / number


def part_b() -> dict[str, Any]:
    import numpy as np
    from crc32c import crc32c

    from shadowgrad import wire

    key = wire.mac_key(TOKEN, JOB)
    layout64 = 0x1234_5678_9ABC_DEF0
    buf = np.random.default_rng(1).bytes(65536)

    # the candidates for the data-path authenticator, on the same buffer in this process; the
    # project's is wire's GMAC (AES-256-GCM, associated data only, nonce drawn per datagram)
    import hmac as _hmac

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    gcm, chacha = AESGCM(key), ChaCha20Poly1305(key)
    nonce = bytes(12)
    dst = bytearray(len(buf))
    candidates: dict[str, Any] = {
        "crc32c": lambda: crc32c(buf),
        "memcpy": lambda: dst.__setitem__(slice(None), buf),
        "blake2b128_keyed": lambda: hashlib.blake2b(buf, key=key, digest_size=16).digest(),
        "hmac_sha256": lambda: _hmac.digest(key, buf, "sha256"),
        "chacha20poly1305_aad": lambda: chacha.encrypt(nonce, b"", buf),
        "aes256gcm_aad": lambda: gcm.encrypt(nonce, b"", buf),
        "wire_gmac": lambda: wire._trailer(key, buf),
    }
    try:
        import blake3  # type: ignore[import-not-found]

        candidates["blake3_keyed"] = lambda: blake3.blake3(buf, key=key).digest(16)
    except ImportError:
        pass
    # the shadow's receive loop checks runs of DATA in C (shadow/_rxnative.c) with its own GMAC
    # (the system's OpenSSL libcrypto) and CRC-32C, where that extension was built
    rx_loop = "python"
    rx_crc_impl: str | None = None
    try:
        from shadowgrad.shadow import _rxnative
        from shadowgrad.shadow._receiver import _HDR_TAIL_AT

        runner = _rxnative.Runner(
            key,
            wire.HEADER_SIZE,
            _HDR_TAIL_AT,
            wire.CHECKSUM_AT,
            wire.MAC_SIZE,
            wire.NONCE_SIZE,
            wire.MAX_DATAGRAM,
        )
        rx_hdr, rx_pay = buf[: wire.HEADER_SIZE], buf[wire.HEADER_SIZE :]
        rx_tr = wire._trailer(key, buf)
        if not runner.verify(rx_hdr, rx_pay, rx_tr):
            raise RuntimeError("the C loop's GMAC refuses wire's tag")
        candidates["rx_gmac"] = lambda: runner.verify(rx_hdr, rx_pay, rx_tr)
        candidates["rx_crc32c"] = lambda: _rxnative.crc32c(buf)
        rx_loop = "c"
        rx_crc_impl = _rxnative.crc32c_impls()[-1]  # the one it picks for 64 KiB
    except ImportError:
        pass
    times = {name: _per_call(f) for name, f in candidates.items()}
    t_crc, t_b2 = times["crc32c"], times["blake2b128_keyed"]
    hashes: dict[str, Any] = {
        "buffer_bytes": len(buf),
        "scheme": "aes256gcm_aad (wire_gmac: with the nonce draw)",
        # where the shadow's runs are checked: "c" (rx_gmac, rx_crc32c) or "python" (wire_gmac,
        # crc32c)
        "rx_loop": rx_loop,
        "rx_crc32c_impl": rx_crc_impl,
        **{f"{name}_gbps": len(buf) / t / 1e9 for name, t in times.items()},
        **{f"{name}_us": t * 1e6 for name, t in times.items()},
        "blake2b_over_crc32c_time": t_b2 / t_crc,
        "gmac_over_blake2b_speed": t_b2 / times["wire_gmac"],
    }

    base = {"job": JOB, "sender": 0, "iteration": 1234, "seq": 99, "layout": layout64}
    commit = wire.CommitRecord((1e-3, 1e-4), clip_coef=0.5, loss_scale=65536.0)
    ready = wire.ReadyRecord(0, 1, wire.ReadyState.APPLIED, 1233)
    nack = wire.NackRecord.of([(3, 65280 * 7, 65280)])
    records: dict[str, Any] = {}
    for name, body, flags, kind in (
        ("COMMIT", commit.body(), commit.flags, wire.Kind.COMMIT),
        ("READY", ready.body(), wire.Flag(0), wire.Kind.READY),
        ("NACK", nack.body(), wire.Flag(0), wire.Kind.NACK),
    ):
        plain = wire.encode(kind, payload=body, flags=flags, **base)
        sealed = wire.encode(kind, payload=body, flags=flags, key=key, **base)
        wire.decode(sealed, job=JOB, layout=layout64, key=key)  # it verifies
        r = {
            "body_bytes": len(body),
            "encode_header_us": _per_call(
                lambda k=kind, b=body, f=flags: wire.encode_header(k, payload=b, flags=f, **base)
            )
            * 1e6,
            "seal_us": _per_call(
                lambda k=kind, b=body, f=flags: wire.seal(k, key=key, payload=b, flags=f, **base)
            )
            * 1e6,
            "encode_us": _per_call(
                lambda k=kind, b=body, f=flags: wire.encode(k, payload=b, flags=f, **base)
            )
            * 1e6,
            "encode_key_us": _per_call(
                lambda k=kind, b=body, f=flags: wire.encode(k, payload=b, flags=f, key=key, **base)
            )
            * 1e6,
            "decode_us": _per_call(lambda d=plain: wire.decode(d, job=JOB, layout=layout64)) * 1e6,
            "decode_key_us": _per_call(
                lambda d=sealed: wire.decode(d, job=JOB, layout=layout64, key=key)
            )
            * 1e6,
        }
        r["seal_extra_us"] = r["encode_key_us"] - r["encode_us"]
        r["verify_extra_us"] = r["decode_key_us"] - r["decode_us"]
        records[name] = r

    data: dict[str, Any] = {}
    payload_all = np.random.default_rng(2).bytes(65408)
    for label, chunk in (("loopback_65408", 65408), ("mtu_1408", wire.DEFAULT_CHUNK_BYTES)):
        p = memoryview(payload_all)[:chunk]
        f = {
            **base,
            "flags": wire.Flag.FINAL,
            "dtype": wire.DType.FLOAT32,
            "bucket": 0,
            "offset": 0,
            "payload": p,
        }
        h_plain = wire.encode_header(wire.Kind.DATA, **f)
        h_sealed, tag = wire.seal(wire.Kind.DATA, key=key, **f)
        d_plain = h_plain + bytes(p)
        d_sealed = h_sealed + bytes(p) + tag
        t_hdr = _per_call(lambda f=f: wire.encode_header(wire.Kind.DATA, **f))
        t_seal = _per_call(lambda f=f: wire.seal(wire.Kind.DATA, key=key, **f))
        t_dec = _per_call(
            lambda d=d_plain: wire.decode(
                d, job=JOB, layout=layout64, key=key, require=wire.AUTHENTICATED_KINDS
            )
        )
        t_dec_k = _per_call(
            lambda d=d_sealed: wire.decode(
                d,
                job=JOB,
                layout=layout64,
                key=key,
                require=wire.AUTHENTICATED_KINDS | {wire.Kind.DATA},
            )
        )
        per_mb = 1e6 / chunk
        data[label] = {
            "chunk_bytes": chunk,
            "chunks_per_mb": per_mb,
            "encode_header_us": t_hdr * 1e6,
            "seal_us": t_seal * 1e6,
            "decode_crc_us": t_dec * 1e6,
            "decode_mac_us": t_dec_k * 1e6,
            "sender_us_per_mb_crc": t_hdr * 1e6 * per_mb,
            "sender_us_per_mb_mac": t_seal * 1e6 * per_mb,
            "sender_extra_us_per_mb": (t_seal - t_hdr) * 1e6 * per_mb,
            "receiver_us_per_mb_crc": t_dec * 1e6 * per_mb,
            "receiver_us_per_mb_mac": t_dec_k * 1e6 * per_mb,
            "receiver_extra_us_per_mb": (t_dec_k - t_dec) * 1e6 * per_mb,
            "wire_overhead_mac": wire.MAC_SIZE / (chunk + wire.HEADER_SIZE),
        }
    return {"hashes": hashes, "records": records, "data": data}


# --------------------------------------------------------------------------- part C


def part_c(
    b: dict[str, Any],
    a: dict[str, Any] | None,
    *,
    shadows: int,
    period_s: float,
    ready_refresh_s: float,
    model_params: float,
    replication: int,
) -> dict[str, Any]:
    rec = b["records"]
    readies = period_s / ready_refresh_s + 2  # refreshes + READY/APPLIED state changes

    def job(s: int) -> dict[str, Any]:
        def cost(seal: str, verify: str) -> dict[str, float]:
            trainer = s * rec["COMMIT"][seal]
            shadow = rec["COMMIT"][verify] + readies * (
                rec["READY"][seal] + (s - 1) * rec["READY"][verify]
            )
            return {
                "trainer_rank0_us": trainer,
                "per_shadow_us": shadow,
                "job_total_us": trainer + s * shadow,
            }

        return {
            "shadows": s,
            "added_by_mac": cost("seal_extra_us", "verify_extra_us"),
            "with_mac_total": cost("encode_key_us", "decode_key_us"),
            "without_mac_total": cost("encode_us", "decode_us"),
        }

    per_iter = {str(s): job(s) for s in sorted({1, 2, 4, 8, shadows})}
    nack = {"per_nack_added_us": rec["NACK"]["seal_extra_us"] + rec["NACK"]["verify_extra_us"]}
    mb = model_params * 4 / 1e6  # fp32 gradient bytes per iteration, MB
    d = b["data"]
    data_cost: dict[str, Any] = {
        "model_params": model_params,
        "gradient_mb_per_iteration": mb,
        "replication": replication,
        "trainer_seal_added_ms_loopback_chunk": d["loopback_65408"]["sender_extra_us_per_mb"]
        * mb
        * replication
        / 1e3,
        "trainer_seal_added_ms_mtu_chunk": d["mtu_1408"]["sender_extra_us_per_mb"]
        * mb
        * replication
        / 1e3,
        "shadow_verify_added_ms_micro_loopback_chunk": d["loopback_65408"][
            "receiver_extra_us_per_mb"
        ]
        * mb
        / 1e3,
        "shadow_verify_added_ms_micro_mtu_chunk": d["mtu_1408"]["receiver_extra_us_per_mb"]
        * mb
        / 1e3,
    }
    if a is not None:
        data_cost["shadow_verify_added_ms_end_to_end"] = (
            a["ratios"]["cpu_s_per_gb_added_by_data_mac"] * mb
        )  # CPU-s/GB x GB -> ms
    return {
        "period_s": period_s,
        "ready_refresh_s": ready_refresh_s,
        "readies_per_shadow_per_iteration": readies,
        "shadows": shadows,
        "records_per_iteration": per_iter,
        "nack": nack,
        "data_per_iteration": data_cost,
    }


# --------------------------------------------------------------------------- report


def environment() -> dict[str, Any]:
    import crc32c
    import torch

    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "crc32c": getattr(crc32c, "__version__", None),
        "openssl": __import__("ssl").OPENSSL_VERSION,
        "machine": platform.machine(),
        "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg(),
        "git_commit": commit or None,
        "git_dirty": bool(dirty),
    }


def report(res: dict[str, Any]) -> None:
    a, b, c = res.get("ingest"), res["micro"], res["per_iteration"]
    if a is not None:
        s, r = a["summary"], a["ratios"]
        print(
            f"\nA. end to end ({a['bytes_per_pass'] / 1e6:.0f} MB/pass of {CHUNK}-byte DATA, "
            f"{a['rounds']} rounds, medians)"
        )
        print(
            f"  {'variant':<11}{'MB/s':>8}{'min-max':>14}{'CPU-s/GB':>10}{'vs bare':>9}"
            f"{'producer':>10}"
        )
        for v in VARIANTS:
            x = s[v]
            print(
                f"  {v:<11}{x['mbps_median']:8.0f}{x['mbps_min']:8.0f}-{x['mbps_max']:<5.0f}"
                f"{x['cpu_s_per_gb_median']:10.3f}"
                f"{x['mbps_median'] / s['bare']['mbps_median']:9.0%}"
                f"{x['producer_mbps_median']:10.0f}"
            )
        print(
            f"  ingest_mac / ingest_crc: {r['ingest_mac_vs_ingest_crc']:.0%} MB/s (paired "
            f"{r['paired_ingest_mac_vs_ingest_crc']:.0%}); CPU/GB x"
            f"{r['cpu_per_gb_mac_over_crc']:.2f} (+{r['cpu_s_per_gb_added_by_data_mac']:.3f}"
            " CPU-s/GB)"
        )
    h = b["hashes"]
    rates = ", ".join(f"{k[: -len('_gbps')]} {v:.2f}" for k, v in h.items() if k.endswith("_gbps"))
    print(
        f"\nB. micro: 64 KiB, GB/s: {rates}; the GMAC is "
        f"{h['gmac_over_blake2b_speed']:.1f}x keyed BLAKE2b"
    )
    print(f"  {'record':<7}{'encode':>8}{'+key':>8}{'decode':>8}{'+key':>8}   (us)")
    for name, x in b["records"].items():
        print(
            f"  {name:<7}{x['encode_us']:8.2f}{x['encode_key_us']:8.2f}{x['decode_us']:8.2f}"
            f"{x['decode_key_us']:8.2f}"
        )
    for label, x in b["data"].items():
        print(
            f"  DATA {label}: seal {x['sender_us_per_mb_mac']:.0f} vs header "
            f"{x['sender_us_per_mb_crc']:.0f} us/MB (+{x['sender_extra_us_per_mb']:.0f}); "
            f"verify {x['receiver_us_per_mb_mac']:.0f} vs CRC {x['receiver_us_per_mb_crc']:.0f}"
            f" us/MB (+{x['receiver_extra_us_per_mb']:.0f})"
        )
    print(
        f"\nC. per iteration ({c['period_s']:g} s/iteration, READY every "
        f"{c['ready_refresh_s'] * 1e3:.0f} ms): us added by record MACs"
    )
    print(f"  {'shadows':>7}{'rank 0':>9}{'per shadow':>12}{'job total':>11}")
    for s, x in c["records_per_iteration"].items():
        y = x["added_by_mac"]
        print(
            f"  {s:>7}{y['trainer_rank0_us']:9.1f}{y['per_shadow_us']:12.1f}"
            f"{y['job_total_us']:11.1f}"
        )
    dc = c["data_per_iteration"]
    e2e = dc.get("shadow_verify_added_ms_end_to_end")
    print(
        f"  DATA MAC for {dc['model_params'] / 1e6:.0f}M fp32 params "
        f"({dc['gradient_mb_per_iteration']:.0f} MB): trainer seal +"
        f"{dc['trainer_seal_added_ms_loopback_chunk']:.0f} ms (64 KiB chunks) / +"
        f"{dc['trainer_seal_added_ms_mtu_chunk']:.0f} ms (1408 B chunks) x{dc['replication']}"
        f" replicas; shadow verify +"
        f"{dc['shadow_verify_added_ms_micro_loopback_chunk']:.0f} ms (micro)"
        + ("" if e2e is None else f", +{e2e:.0f} ms CPU (end to end)")
    )


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--producer":
        _producer_main(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--params", type=float, default=25e6, help="parameters per pass iteration")
    ap.add_argument("--iterations", type=int, default=3, help="iterations per pass")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the variants")
    ap.add_argument("--shadows", type=int, default=4, help="shadows of the per-iteration figure")
    ap.add_argument("--period", type=float, default=1.0, help="seconds per training iteration")
    ap.add_argument("--ready-refresh", type=float, default=0.05, help="READY refresh period (s)")
    ap.add_argument(
        "--model-params",
        type=float,
        default=100e6,
        help="model size of the per-iteration DATA figure",
    )
    ap.add_argument("--replication", type=int, default=1, help="copies of each DATA chunk sent")
    ap.add_argument("--micro-only", action="store_true", help="skip part A")
    ap.add_argument("--out", default=None, help="write the JSON results here")
    args = ap.parse_args()
    t0 = time.monotonic()
    from shadowgrad.config import DEFAULT_AUTHENTICATE_DATA

    res: dict[str, Any] = {
        "env": environment(),
        "args": vars(args),
        "default_authenticate_data_at_run": DEFAULT_AUTHENTICATE_DATA,
    }
    print(
        f"auth bench: {res['env']['cpus']} CPUs, load {os.getloadavg()[0]:.1f}, git "
        f"{(res['env']['git_commit'] or '?')[:10]}",
        flush=True,
    )
    res["micro"] = part_b()
    res["ingest"] = (
        None if args.micro_only else part_a(int(args.params), args.iterations, args.rounds)
    )
    res["per_iteration"] = part_c(
        res["micro"],
        res["ingest"],
        shadows=args.shadows,
        period_s=args.period,
        ready_refresh_s=args.ready_refresh,
        model_params=args.model_params,
        replication=args.replication,
    )
    res["wall_s"] = time.monotonic() - t0
    report(res)
    print(f"\nwall {res['wall_s']:.0f} s", flush=True)
    if args.out:
        _common.write_json(Path(args.out), res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
