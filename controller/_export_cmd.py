"""``shadowgrad export``: write one iteration the shadows hold as a ``torch.distributed.checkpoint``
directory, or check such a directory.

    shadowgrad export --spec job.toml --iteration latest --out ckpt/ [--timeout 5] [--json]
    shadowgrad export --spec job.toml --iteration 1200 --out ckpt-1200/ --force
    shadowgrad export --verify ckpt/

``latest`` is the restore point I* (the newest iteration every shard holds). The directory is
written next to ``--out`` and renamed into place when complete; an existing non-empty ``--out``
is refused unless ``--force``. ``--verify`` recomputes every file's sha256 against
``shadowgrad-manifest.json`` and checks the DCP metadata: exit 0 and ``ok``, or exit 1 and one
line per bad file. Code: :mod:`shadowgrad.controller.export`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Literal

from shadowgrad._cli import flag, seconds
from shadowgrad.errors import ConfigError, ShadowgradError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", type=Path, help="job spec (TOML)")
    p.add_argument(
        "--iteration",
        default="latest",
        help="iteration to export, or 'latest' (the restore point I*; default)",
    )
    p.add_argument("--out", type=Path, help="directory to write (must not exist or be empty)")
    flag(p, "--force", help="replace a non-empty --out")
    seconds(
        p,
        "--timeout",
        None,
        "seconds per control call (default: the spec's timeouts.rpc; fetches "
        "get more time by size)",
    )
    p.add_argument(
        "--verify",
        type=Path,
        metavar="DIR",
        default=None,
        help="check the export DIR instead of writing one",
    )
    flag(p, "--json", help="print the manifest (export) or the findings (--verify) as JSON")


def _iteration(text: str) -> int | Literal["latest"]:
    if text == "latest":
        return "latest"
    try:
        it = int(text)
    except ValueError:
        raise ConfigError("--iteration", text, "an iteration number or 'latest'") from None
    if it < -1:
        raise ConfigError("--iteration", text, "iterations start at -1 (the initial state)")
    return it


def _verify(args: argparse.Namespace) -> int:
    from shadowgrad.controller.export import verify_export

    if args.out is not None or args.spec is not None:
        raise ShadowgradError("--verify DIR takes no --spec or --out")
    problems = verify_export(args.verify)
    if args.json:
        print(
            json.dumps(
                {
                    "ok": not problems,
                    "dir": str(args.verify),
                    "problems": [{"file": p.path, "reason": p.reason} for p in problems],
                }
            )
        )
    elif problems:
        for p in problems:
            print(f"bad {p.path}: {p.reason}", file=sys.stderr)
        print(f"{args.verify}: {len(problems)} problem(s)", file=sys.stderr)
    else:
        print("ok")
    return 0 if not problems else 1


def run(args: argparse.Namespace) -> int:
    if args.verify is not None:
        return _verify(args)
    if args.spec is None or args.out is None:
        raise ShadowgradError("export needs --spec and --out (or --verify DIR)")
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError("--timeout", args.timeout, "must be > 0 seconds")
    iteration = _iteration(args.iteration)

    from shadowgrad.config import load_spec
    from shadowgrad.controller.export import export_checkpoint

    spec = load_spec(args.spec)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    manifest = export_checkpoint(
        spec, iteration, args.out, timeout_s=args.timeout, force=args.force, progress=progress
    )
    if args.json:
        print(json.dumps(manifest, sort_keys=True))
        return 0
    files = manifest["files"]
    size = sum(f["size"] for f in files.values())
    print(
        f"exported iteration {manifest['iteration']} of job {spec.job.name} "
        f"(id {spec.job.id}, generation {manifest['generation']}) to {args.out}: "
        f"{len(manifest['param_names'])} parameters, {len(manifest['module_state'])} module "
        f"tensors, user state {'yes' if manifest['user_state'] else 'no'}; "
        f"{len(files)} files, {size / 2**20:.2f} MiB"
    )
    print(f"check it with: shadowgrad export --verify {args.out}")
    return 0
