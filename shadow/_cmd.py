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


def _warm_up() -> None:
    """Pay the lazy first-use costs now, while the early control endpoint says ``starting``,
    instead of in the first ``load`` (a re-seed of a restarted shadow, which the trainers time):
    the first optimizer construction imports ``torch._dynamo`` (about 1 s on an idle machine,
    several under load), and the first layout parse, tensor-stream decode, replayer load and
    step of a process each cost more than the later ones. Walks that path once on a throwaway
    one-tensor shard."""
    import torch

    from shadowgrad.layout import Layout, from_module
    from shadowgrad.optspec import OptimizerSpec, state_by_name
    from shadowgrad.shadow.assembly import ShardGeometry
    from shadowgrad.shadow.replay import ShardReplayer, box_states_from_full
    from shadowgrad.tensorstream import decode_states, encode_states
    from shadowgrad.wire import CommitRecord

    model = torch.nn.Linear(4, 4)
    for make in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        opt = make(model.parameters(), lr=1e-3)
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    layout = Layout.from_json(Layout.build(*from_module(model), 1, 1).to_json())
    spec = OptimizerSpec.from_json(
        OptimizerSpec.from_optimizer(opt, model.named_parameters()).to_json()
    )
    named = {n: p.detach() for n, p in model.named_parameters()}
    box_states = box_states_from_full(
        layout, 0, named, state_by_name(opt, model.named_parameters())
    )
    entries, frames = encode_states(list(enumerate(box_states)))
    states = decode_states(entries, [bytes(f) for f in frames], copy=False)
    geom = ShardGeometry(layout, 0)
    replayer = ShardReplayer(layout, 0, spec)
    replayer.load(0, [states[k] for k in range(len(geom.boxes))])
    grads = [torch.zeros(b.lengths) for b in layout.shard_boxes(0)]
    replayer.step(1, grads, CommitRecord((1e-3,)))


def run(args: argparse.Namespace) -> int:
    import signal
    import threading
    from pathlib import Path

    # standard library and zmq only until the control endpoint answers (shadow/_early.py):
    # importing torch takes seconds on a busy machine
    from shadowgrad.config import load_spec
    from shadowgrad.errors import ShadowgradError
    from shadowgrad.layout import Layout
    from shadowgrad.shadow._early import EarlyControl

    if args.threads < 1:
        raise ShadowgradError(f"--threads {args.threads}: must be at least 1")
    spec = load_spec(args.spec)
    layout = None
    if args.layout is not None:
        try:
            text = Path(args.layout).read_text(encoding="utf-8")
        except OSError as e:
            raise ShadowgradError(f"cannot read layout {args.layout}: {e}") from None
        layout = Layout.from_json(text)
    early = EarlyControl(spec, args.shadow_id, control_bind=args.control_bind).start()
    try:
        import torch

        torch.set_num_threads(args.threads)
        from shadowgrad.shadow.node import ShadowNode

        _warm_up()
        ctx, sock, backlog = early.handover()
    except BaseException:
        early.close()
        raise
    try:
        node = ShadowNode(
            spec,
            args.shadow_id,
            layout=layout,
            control_socket=(ctx, sock),
            incarnation=early.incarnation,
        )
    except BaseException:
        sock.close(linger=0)
        ctx.term()
        raise
    node.ev.update(early.ev)
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        done.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    node.start(backlog)
    try:
        while not done.wait(0.2):
            if node.failed is not None:
                raise ShadowgradError(f"shadow {args.shadow_id} failed: {node.failed!r}")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        node.stop()
    return 0
