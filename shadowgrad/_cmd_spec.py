"""``shadowgrad spec check|show FILE``: validate a job spec, or print it resolved as JSON."""

from __future__ import annotations

import argparse
import json


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        choices=["check", "show"],
        help="check: validate and summarise; show: the resolved spec as JSON",
    )
    p.add_argument("file", help="job spec (TOML)")


def run(args: argparse.Namespace) -> int:
    from shadowgrad.config import load_spec

    spec = load_spec(args.file)
    if args.action == "show":
        print(json.dumps(spec.to_dict(), indent=2, default=str))
        return 0
    print(
        f"{args.file}: ok — job {spec.job.name!r} (id {spec.job.id}), mode {spec.job.mode}, "
        f"{spec.trainers.world_size} trainers, {spec.shadows.count} shadows "
        f"(replication {spec.shadows.replication}, {spec.num_shards} shards), "
        f"switch {spec.switch.target}"
    )
    return 0
