"""``shadowgrad wire``: decode and verify datagrams given in hex (arguments or stdin lines)."""

from __future__ import annotations

import argparse
import json
import sys

from shadowgrad import wire
from shadowgrad._cli import flag
from shadowgrad.errors import WireError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("hex", nargs="*", help="datagrams in hex (UDP payloads); stdin lines if none")
    p.add_argument("--job", type=int, help="reject datagrams of other jobs")
    p.add_argument("--layout", type=lambda s: int(s, 0), help="expected layout digest64")
    flag(p, "--json", help="one JSON object per datagram")


def _describe(msg: wire.Message) -> dict[str, object]:
    h = msg.header
    out: dict[str, object] = {
        "kind": h.kind.name,
        "flags": str(h.flags.name or "0"),
        "dtype": h.dtype.name,
        "sender": h.sender,
        "job": h.job,
        "bucket": h.bucket,
        "iteration": h.iteration,
        "seq": h.seq,
        "offset": h.offset,
        "layout": f"{h.layout:016x}",
        "length": h.length,
    }
    body: object = None
    if h.kind is wire.Kind.COMMIT:
        body = wire.CommitRecord.from_message(msg)
    elif h.kind is wire.Kind.READY:
        body = wire.ReadyRecord.from_message(msg)
    elif h.kind is wire.Kind.ACK:
        body = wire.AckRecord.from_message(msg)
    elif h.kind is wire.Kind.NACK:
        body = wire.NackRecord.from_message(msg)
    if body is not None:
        out["body"] = repr(body)
    return out


def run(args: argparse.Namespace) -> int:
    items = args.hex or [line.strip() for line in sys.stdin if line.strip()]
    bad = 0
    for i, text in enumerate(items):
        try:
            raw = bytes.fromhex(text)
        except ValueError as e:
            bad += 1
            print(f"#{i}: not hex: {e}")
            continue
        try:
            info = _describe(wire.decode(raw, job=args.job, layout=args.layout))
        except WireError as e:
            bad += 1
            if args.json:
                print(json.dumps({"index": i, "error": e.reason, "detail": str(e)}))
            else:
                print(f"#{i}: REJECTED ({e.reason}): {e}")
            continue
        if args.json:
            print(json.dumps({"index": i, **info}))
        else:
            print(f"#{i}: ok " + " ".join(f"{k}={v}" for k, v in info.items()))
    return 1 if bad else 0
