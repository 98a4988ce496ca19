"""Atomic on-disk snapshots of one shard's state (params + optimizer state per box).

Layout of one snapshot: ``<snapshot_dir>/shadow<K>/iter<000000000123>/`` holding ``state.bin``
(every tensor's raw bytes, concatenated) and ``manifest.json`` (format, iteration, layout digest,
shard, replica, shadow id, optimizer spec JSON, and per tensor: box, key, dtype, shape, byte
offset, nbytes, CRC-32). It is written into a hidden temporary directory, each file fsynced, the
directory renamed into place and the parent fsynced: a reader sees a whole snapshot or none.
Older snapshots beyond ``keep`` are removed after a new one is in place.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from shadowgrad import wire
from shadowgrad.errors import ShadowgradError
from shadowgrad.torch_dtypes import TORCH_DTYPES

__all__ = ["SNAPSHOT_FORMAT", "SnapshotError", "write_snapshot", "read_snapshot", "list_snapshots"]

SNAPSHOT_FORMAT = "shadowgrad.shadow.snapshot/1"
#: dtype name -> torch dtype of every dtype a snapshot holds (the one dtype table's index)
_DTYPES = TORCH_DTYPES


class SnapshotError(ShadowgradError):
    """A snapshot cannot be written or read (I/O error, bad manifest, checksum mismatch)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_snapshots(root: Path, shadow_id: int) -> list[Path]:
    """Complete snapshots of ``shadow_id`` under ``root``, oldest first."""
    d = Path(root) / f"shadow{shadow_id}"
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.name.startswith("iter") and p.is_dir())


def write_snapshot(
    root: Path,
    *,
    shadow_id: int,
    shard: int,
    replica: int,
    iteration: int,
    layout_digest: str,
    optimizer_json: str,
    states: Sequence[Mapping[str, torch.Tensor]],
    keep: int = 2,
) -> Path:
    """Write ``states`` (per box, shard order) atomically; return the snapshot directory."""
    base = Path(root) / f"shadow{shadow_id}"
    final = base / f"iter{iteration:012d}"
    tmp = base / f".tmp-iter{iteration:012d}-{os.getpid()}"
    try:
        base.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        entries: list[dict[str, Any]] = []
        pos = 0
        with open(tmp / "state.bin", "wb") as f:
            for box, state in enumerate(states):
                for key in sorted(state):
                    t = state[key].detach().contiguous().reshape(-1)
                    raw = t.view(torch.uint8).numpy().data.cast("B")
                    f.write(raw)
                    entries.append(
                        {
                            "box": box,
                            "key": key,
                            "dtype": str(state[key].dtype).removeprefix("torch."),
                            "shape": list(state[key].shape),
                            "offset": pos,
                            "nbytes": raw.nbytes,
                            "crc32c": wire.crc(raw),
                        }
                    )
                    pos += raw.nbytes
            f.flush()
            os.fsync(f.fileno())
        manifest = {
            "format": SNAPSHOT_FORMAT,
            "iteration": iteration,
            "layout_digest": layout_digest,
            "shadow_id": shadow_id,
            "shard": shard,
            "replica": replica,
            "optimizer": optimizer_json,
            "boxes": len(states),
            "tensors": entries,
            "state_bytes": pos,
        }
        with open(tmp / "manifest.json", "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(base)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SnapshotError(
            f"cannot write snapshot of iteration {iteration} to {final}: {e}"
        ) from None
    for old in list_snapshots(root, shadow_id)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_snapshot(path: Path) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
    """Read and verify a snapshot: (manifest, per-box states)."""
    path = Path(path)
    try:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
        data = (path / "state.bin").read_bytes()
    except (OSError, ValueError) as e:
        raise SnapshotError(f"cannot read snapshot {path}: {e}") from None
    if manifest.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(f"{path}: format {manifest.get('format')!r}, want {SNAPSHOT_FORMAT}")
    if len(data) != manifest["state_bytes"]:
        raise SnapshotError(
            f"{path}: state.bin has {len(data)} bytes, manifest says {manifest['state_bytes']}"
        )
    states: list[dict[str, torch.Tensor]] = [{} for _ in range(int(manifest["boxes"]))]
    mv = memoryview(data)
    for ent in manifest["tensors"]:
        raw = mv[ent["offset"] : ent["offset"] + ent["nbytes"]]
        if wire.crc(raw) != ent["crc32c"]:
            raise SnapshotError(f"{path}: {ent['key']!r} of box {ent['box']} fails CRC-32")
        buf = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            if ent["nbytes"]
            else torch.empty(0, dtype=torch.uint8)
        )
        states[ent["box"]][ent["key"]] = buf.view(_DTYPES[ent["dtype"]]).reshape(ent["shape"])
    return manifest, states
