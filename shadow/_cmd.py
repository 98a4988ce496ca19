"""``shadowgrad shadow --spec job.toml --id K``: run one shadow node until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", required=True, help="job spec (TOML)")
    p.add_argument(
        "--id",
        type=int,
        required=True,
        dest="shadow_id",
        help="this shadow's index in shadows.addresses",
    )
    p.add_argument(
        "--layout",
        default=None,
        help="layout JSON (shadowgrad layout output); otherwise it comes with 'load'",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for the optimizer replay (default 1: the replay "
        "is memory-bound, and a shadow sharing cores with trainers or other "
        "shadows must not spin idle OpenMP threads on them)",
    )
    p.add_argument(
        "--control-bind",
        default=None,
        help="zmq bind address of the control endpoint (default tcp://<host>:<control_port + id>)",
    )


def run(args: argparse.Namespace) -> int:
    import signal
    import threading
    from pathlib import Path

    import torch

    from shadowgrad.config import load_spec
    from shadowgrad.errors import ShadowgradError
    from shadowgrad.layout import Layout
    from shadowgrad.shadow.node import ShadowNode

    if args.threads < 1:
        raise ShadowgradError(f"--threads {args.threads}: must be at least 1")
    torch.set_num_threads(args.threads)
    spec = load_spec(args.spec)
    layout = None
    if args.layout is not None:
        try:
            text = Path(args.layout).read_text(encoding="utf-8")
        except OSError as e:
            raise ShadowgradError(f"cannot read layout {args.layout}: {e}") from None
        layout = Layout.from_json(text)
    node = ShadowNode(spec, args.shadow_id, layout=layout, control_bind=args.control_bind)
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        done.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    node.start()
    try:
        while not done.wait(0.2):
            if node.failed is not None:
                raise ShadowgradError(f"shadow {args.shadow_id} failed: {node.failed!r}")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        node.stop()
    return 0
