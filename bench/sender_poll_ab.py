"""A/B of the mirror sender's receive polling while it sends, in one process: the sender
thread's CPU per captured slot with a poll after every datagram (``_POLL_BYTES = 0``, as
before 2026-12-06) against the shipped interval, alternating blocks of slots, against
trainer_bench's UDP sink (:class:`trainer_bench.Sinks`, ``MSG_TRUNC``); DATA sealed (GMAC) as
by default, CRC-32C only with ``--no-mac``. A developer's check, not one of the harness's
benches (its ratio is shadowgrad against shadowgrad).

    python bench/sender_poll_ab.py [--chunk 65408] [--rounds 10] [--slots 5] [--no-mac]
"""

from __future__ import annotations

import argparse
import socket
import statistics

import torch
from trainer_bench import Sinks

from shadowgrad import wire
from shadowgrad.freeports import free_ports
from shadowgrad.layout import Layout, from_module
from shadowgrad.trainer_hooks._mirror import MirrorSender
from shadowgrad.trainer_hooks._plan import RankPlan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk", type=int, default=wire.chunk_for(65507, mac=True))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--slots", type=int, default=5, help="slots per block")
    ap.add_argument("--no-mac", action="store_true", help="DATA with CRC-32C only")
    args = ap.parse_args()
    (port,) = free_ports(1, socket.SOCK_DGRAM)
    sink = Sinks([port])
    try:
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(10)])  # 10.5M
        params, buckets = from_module(model)
        layout = Layout.build(params, buckets, 1, 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        snd = MirrorSender(
            RankPlan(layout, 0, 1),
            job=7,
            sock=sock,
            shadow_addrs=[("127.0.0.1", port)],
            chunk_bytes=args.chunk,
            key=wire.mac_key("ab", 7),
            authenticate_data=not args.no_mac,
        )
        grads = {n: torch.randn_like(p) for n, p in model.named_parameters()}
        shipped = MirrorSender._POLL_BYTES
        res: dict[int, list[float]] = {0: [], shipped: []}
        it = 0
        for rnd in range(args.rounds):
            for pb in (0, shipped) if rnd % 2 == 0 else (shipped, 0):
                snd._POLL_BYTES = pb
                c0 = snd.stats()["thread_cpu_s"]
                for _ in range(args.slots):
                    if not snd.capture(it, grads) or not snd.flush(10):
                        raise SystemExit("the sender dropped or did not finish a slot")
                    it += 1
                res[pb].append((snd.stats()["thread_cpu_s"] - c0) / args.slots)
        snd.close()
        for pb, xs in res.items():
            print(
                f"poll every {pb:>7} B: sender CPU per slot median "
                f"{statistics.median(xs) * 1e3:.2f} ms ("
                + " ".join(f"{x * 1e3:.1f}" for x in xs)
                + ")"
            )
        ratios = [b / a for a, b in zip(res[0], res[shipped], strict=True)]
        print(
            "shipped / every datagram, per pair: "
            + " ".join(f"{r:.3f}" for r in ratios)
            + f"; median {statistics.median(ratios):.3f}"
        )
    finally:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
