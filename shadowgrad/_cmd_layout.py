"""``shadowgrad layout``: the shard layout of a model, its balance and its digest.

The model comes from ``--model MODULE:CALLABLE`` (called with no arguments, must return an
``nn.Module``) or from ``--params FILE``: JSON ``[[name, shape, dtype], ...]`` in model order.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from shadowgrad.errors import LayoutError


def configure(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model",
        metavar="MODULE:CALLABLE",
        help="build the model by calling this, e.g. torch.nn:Transformer",
    )
    src.add_argument("--params", type=Path, help="JSON list of [name, shape, dtype] in model order")
    p.add_argument("--spec", type=Path, help="take shadows and replication from this job spec")
    p.add_argument("--shadows", type=int, default=None, help="number of shadows (default 1)")
    p.add_argument("--replication", type=int, default=None, help="replicas per shard (default 1)")
    p.add_argument(
        "--bucket-cap-mb",
        type=float,
        default=None,
        help="DDP bucket_cap_mb (default: DDP's, 25 MiB after a 1 MiB first bucket)",
    )
    p.add_argument(
        "--max-piece-bytes",
        type=int,
        default=None,
        help="split tensors larger than this (default: total / (4 * shards))",
    )
    p.add_argument("-o", "--output", type=Path, help="write the layout JSON here")


def _load_params(args: argparse.Namespace) -> tuple[list[object], list[list[str]]]:
    from shadowgrad.layout import ParamSpec, ddp_buckets, from_module

    if args.params is not None:
        try:
            rows = json.loads(args.params.read_text())
            params = [ParamSpec(str(n), tuple(int(d) for d in s), str(t)) for n, s, t in rows]
        except (OSError, ValueError, TypeError) as e:
            raise LayoutError(f"--params {args.params}: {e}") from None
        cap = 25 * 2**20 if args.bucket_cap_mb is None else int(args.bucket_cap_mb * 2**20)
        first = 2**20 if args.bucket_cap_mb is None else cap
        return list(params), ddp_buckets(params, cap, first)
    module_name, _, attr = str(args.model).partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise LayoutError(f"--model {args.model!r}: {e}") from None
    specs, buckets = from_module(factory(), args.bucket_cap_mb)
    return list(specs), buckets


def run(args: argparse.Namespace) -> int:
    from shadowgrad.layout import Layout

    shadows, replication = args.shadows, args.replication
    if args.spec is not None:
        from shadowgrad.config import load_spec

        spec = load_spec(args.spec)
        shadows = shadows or spec.shadows.count
        replication = replication or spec.shadows.replication
    params, buckets = _load_params(args)
    layout = Layout.build(
        params,  # type: ignore[arg-type]
        buckets,
        shadows or 1,
        replication or 1,
        max_piece_bytes=args.max_piece_bytes,
    )
    total = layout.total_bytes
    mean = total / layout.num_shards
    print(
        f"{len(params)} tensors, {total / 2**20:.2f} MiB of gradient in {len(buckets)} buckets; "
        f"{layout.num_shadows} shadows = {layout.num_shards} shards x {layout.replication}"
    )
    print(f"{'shard':>5} {'shadows':>10} {'boxes':>6} {'MiB':>10} {'vs mean':>8}")
    for s in range(layout.num_shards):
        nbytes = layout.shard_bytes(s)
        shadow_ids = ",".join(str(k) for k in layout.shadows_of_shard(s))
        print(
            f"{s:>5} {shadow_ids:>10} {len(layout.shard_boxes(s)):>6} "
            f"{nbytes / 2**20:>10.3f} {nbytes / mean if mean else 1.0:>8.3f}"
        )
    print(f"digest {layout.digest} (wire layout field 0x{layout.digest64:016x})")
    if args.output is not None:
        args.output.write_text(layout.to_json())
        print(f"wrote {args.output}")
    return 0
