"""Payload formats of the control protocol: the tensor stream and the COMMIT record as JSON.

A tensor stream carries box states (``[(box index, {key: tensor})]``) as *entries* in a request's
or reply's JSON header, each naming its box (index in ``Layout.shard_boxes(shard)`` order, plus
optionally the box's tensor name and offsets as a check), its key (``"param"`` or an optimizer
state key), dtype (a name of the one dtype table, :mod:`shadowgrad.dtypes`) and shape, and the
CRC-32C (``wire.crc``) of each of its chunk frames (at most :data:`CHUNK_BYTES` each), followed
by those binary frames. Receivers verify every chunk before use.

Shared by the shadow (serves ``fetch``, accepts ``load``), the trainer hooks (bootstrap, restore)
and the controller (export); the client is :mod:`shadowgrad.control_client`.
"""

from __future__ import annotations

import base64
import binascii
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from shadowgrad import wire
from shadowgrad.dtypes import DTYPES
from shadowgrad.errors import ControlError
from shadowgrad.torch_dtypes import TORCH_DTYPES

__all__ = [
    "CHUNK_BYTES",
    "ControlError",
    "encode_states",
    "decode_states",
    "iter_stream",
    "parse_entry",
    "copy_verified",
    "dest_bytes",
    "StreamEntry",
    "StreamTensor",
    "commit_to_json",
    "commit_from_json",
]

#: largest binary frame of a tensor stream
CHUNK_BYTES = 4 * 2**20

#: what a tensor stream carries: every dtype of the one table (:mod:`shadowgrad.torch_dtypes`)
_DTYPES = TORCH_DTYPES


def _dtype_name(t: torch.Tensor) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ControlError("bad_request", f"tensor dtype {name} cannot be streamed")
    return name


def _raw(t: torch.Tensor) -> memoryview:
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data.cast("B")


def encode_states(
    states: Sequence[tuple[int, Mapping[str, torch.Tensor]]],
    box_ids: Mapping[int, tuple[str, tuple[int, ...]]] | None = None,
    *,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[list[dict[str, Any]], list[memoryview]]:
    """``[(box index, {key: tensor})]`` -> (entries for the JSON header, chunk frames of at
    most ``chunk_bytes`` each, views of the tensors where they are contiguous)."""
    entries: list[dict[str, Any]] = []
    frames: list[memoryview] = []
    for box, state in states:
        for key in sorted(state):
            t = state[key]
            raw = _raw(t)
            crcs: list[int] = []
            for lo in range(0, raw.nbytes, chunk_bytes):
                chunk = raw[lo : lo + chunk_bytes]
                crcs.append(wire.crc(chunk))
                frames.append(chunk)
            entry: dict[str, Any] = {
                "box": box,
                "key": key,
                "dtype": _dtype_name(t),
                "shape": list(t.shape),
                "nbytes": raw.nbytes,
                "crc": crcs,
            }
            if box_ids is not None and box in box_ids:
                entry["name"], offsets = box_ids[box]
                entry["offsets"] = list(offsets)
            entries.append(entry)
    return entries, frames


def _frame_tensor(chunk: memoryview) -> torch.Tensor:
    """A uint8 tensor over ``chunk``'s memory, no copy (read-only memory: never written)."""
    if chunk.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():  # torch warns (once) that the buffer is not writable
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(chunk, dtype=torch.uint8)


class StreamEntry(NamedTuple):
    """One entry of a tensor stream, validated (:func:`parse_entry`): ``box``, ``key``,
    ``dtype`` (its name in the one dtype table), ``shape``, ``nbytes`` and the CRC-32C of each
    chunk, ``crcs``."""

    box: int
    key: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    crcs: list[int]
    entry: Mapping[str, Any]


class StreamTensor(NamedTuple):
    """One tensor of a tensor stream, its entry validated: ``box``, ``key``, ``dtype`` (its
    name in the one dtype table), ``shape``, ``nbytes`` and its ``chunks`` as ``(frame, CRC)``
    pairs, not yet verified (:func:`copy_verified` verifies each as it copies it)."""

    box: int
    key: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    chunks: list[tuple[memoryview, int]]
    entry: Mapping[str, Any]


def parse_entry(entry: Mapping[str, Any]) -> StreamEntry:
    """One entry of a stream's manifest, checked (fields, dtype, shape against ``nbytes``;
    ControlError ``bad_request``)."""
    try:
        box = int(entry["box"])
        key = str(entry["key"])
        dtype = str(entry["dtype"])
        _DTYPES[dtype]
        shape = tuple(int(d) for d in entry["shape"])
        nbytes = int(entry["nbytes"])
        crcs = [int(c) for c in entry["crc"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ControlError("bad_request", f"malformed tensor entry {entry!r}: {e}") from None
    itemsize = DTYPES[dtype].itemsize
    if nbytes < 0 or nbytes % itemsize or nbytes // itemsize != _numel(shape):
        raise ControlError("bad_request", f"{key!r} of box {box}: shape {shape} vs {nbytes} B")
    return StreamEntry(box, key, dtype, shape, nbytes, crcs, entry)


def iter_stream(
    entries: Sequence[Mapping[str, Any]], frames: Sequence[memoryview | bytes]
) -> Iterator[StreamTensor]:
    """The tensors of a stream in order, each entry checked against its frames (sizes, shape,
    dtype; ControlError ``bad_request``); CRCs are checked by whoever consumes the chunks."""
    pos = 0
    for entry in entries:
        e = parse_entry(entry)
        box, key, nbytes, crcs = e.box, e.key, e.nbytes, e.crcs
        if pos + len(crcs) > len(frames):
            raise ControlError("bad_request", f"tensor stream ends inside {key!r} of box {box}")
        chunks = [(memoryview(frames[pos + k]).cast("B"), crc) for k, crc in enumerate(crcs)]
        pos += len(crcs)
        if sum(c.nbytes for c, _ in chunks) != nbytes:
            got = sum(c.nbytes for c, _ in chunks)
            raise ControlError("bad_request", f"{key!r} of box {box}: {got} of {nbytes} B")
        yield StreamTensor(box, key, e.dtype, e.shape, nbytes, chunks, entry)
    if pos != len(frames):
        raise ControlError("bad_request", f"{len(frames) - pos} unexpected trailing frames")


def copy_verified(t: StreamTensor, dest: torch.Tensor) -> None:
    """Verify every chunk of ``t`` (CRC-32C; ControlError ``checksum``) and copy it into
    ``dest`` (contiguous, ``t.nbytes`` bytes), chunk by chunk: the stream's one copy."""
    if not dest.is_contiguous() or dest.numel() * dest.element_size() != t.nbytes:
        raise ControlError("bad_request", f"{t.key!r} of box {t.box}: destination does not fit")
    flat = dest.reshape(-1).view(torch.uint8) if t.nbytes else dest
    lo = 0
    for k, (chunk, crc) in enumerate(t.chunks):
        if wire.crc(chunk) != crc:
            raise ControlError("checksum", f"chunk {k} of {t.key!r} (box {t.box}) fails CRC-32")
        if chunk.nbytes:
            flat[lo : lo + chunk.nbytes].copy_(_frame_tensor(chunk))
        lo += chunk.nbytes


def dest_bytes(t: StreamEntry | StreamTensor, dest: torch.Tensor) -> memoryview:
    """``dest`` (contiguous CPU, ``t.nbytes`` bytes) as a writable byte memoryview, no copy
    (ControlError ``bad_request`` when it does not fit)."""
    if (
        dest.device.type != "cpu"
        or not dest.is_contiguous()
        or dest.numel() * dest.element_size() != t.nbytes
    ):
        raise ControlError("bad_request", f"{t.key!r} of box {t.box}: destination does not fit")
    if t.nbytes == 0:
        return memoryview(bytearray())
    flat = dest.reshape(-1).view(torch.uint8)
    view: memoryview = flat.numpy().data
    return view.cast("B")


def decode_states(
    entries: Sequence[Mapping[str, Any]],
    frames: Sequence[memoryview | bytes],
    *,
    copy: bool = True,
) -> dict[int, dict[str, torch.Tensor]]:
    """Reverse of :func:`encode_states`; verifies every chunk's CRC-32 (ControlError).

    ``copy=False``: a tensor that came in one frame is a view of that frame's memory (no copy;
    it stays valid while the frame is referenced, and must not be written): for a caller that
    copies the states anyway (the shadow's ``load``). Tensors of several frames are
    assembled into new memory either way."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for t in iter_stream(entries, frames):
        dtype = _DTYPES[t.dtype]
        if not copy and len(t.chunks) == 1:
            chunk, crc = t.chunks[0]
            if wire.crc(chunk) != crc:
                raise ControlError("checksum", f"chunk 0 of {t.key!r} (box {t.box}) fails CRC-32")
            buf = _frame_tensor(chunk)
        else:
            buf = torch.empty(t.nbytes, dtype=torch.uint8)
            copy_verified(t, buf)
        out.setdefault(t.box, {})[t.key] = buf.view(dtype).reshape(t.shape)
    return out


def commit_to_json(iteration: int, rec: wire.CommitRecord) -> dict[str, Any]:
    """The COMMIT record of ``iteration`` as it travels in ``fetch`` replies and ``load``
    requests: ``{"iteration", "lrs", "clip_coef", "loss_scale", "skipped", "user_state"}``
    (``user_state`` base64; ``clip_coef`` / ``loss_scale`` null when not used)."""
    return {
        "iteration": int(iteration),
        "lrs": [float(x) for x in rec.lrs],
        "clip_coef": None if rec.clip_coef is None else float(rec.clip_coef),
        "loss_scale": None if rec.loss_scale is None else float(rec.loss_scale),
        "skipped": bool(rec.skipped),
        "user_state": base64.b64encode(bytes(rec.user_state)).decode("ascii"),
        "no_grad": [int(i) for i in rec.no_grad],
    }


def _opt_float(doc: Mapping[str, Any], key: str) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    # not necessarily finite: the clip coefficient of a skipped (overflowed) step may be NaN
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ControlError("bad_request", f"commit.{key} = {v!r} is not a number or null")
    return float(v)


def commit_from_json(doc: Any) -> tuple[int, wire.CommitRecord]:
    """Reverse of :func:`commit_to_json`, validating every field (ControlError)."""
    if not isinstance(doc, Mapping):
        raise ControlError("bad_request", f"commit is not an object: {doc!r}")
    it = doc.get("iteration")
    if isinstance(it, bool) or not isinstance(it, int) or it < 0:
        raise ControlError("bad_request", f"commit.iteration = {it!r} is not an iteration")
    lrs = doc.get("lrs")
    if (
        not isinstance(lrs, list)
        or len(lrs) > 0xFFFF
        or any(isinstance(x, bool) or not isinstance(x, int | float) for x in lrs)
    ):
        raise ControlError("bad_request", f"commit.lrs = {lrs!r} is not a list of numbers")
    skipped = doc.get("skipped", False)
    if not isinstance(skipped, bool):
        raise ControlError("bad_request", f"commit.skipped = {skipped!r} is not a boolean")
    blob = doc.get("user_state", "")
    if not isinstance(blob, str):
        raise ControlError("bad_request", "commit.user_state is not a base64 string")
    try:
        user = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ControlError("bad_request", f"commit.user_state is not base64: {e}") from None
    nograd = doc.get("no_grad", [])
    if (
        not isinstance(nograd, list)
        or len(nograd) > 0xFFFF
        or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in nograd)
        or sorted(set(nograd)) != nograd
    ):
        raise ControlError(
            "bad_request", f"commit.no_grad = {nograd!r} is not an ascending list of indices"
        )
    rec = wire.CommitRecord(
        tuple(float(x) for x in lrs),
        clip_coef=_opt_float(doc, "clip_coef"),
        loss_scale=_opt_float(doc, "loss_scale"),
        skipped=skipped,
        user_state=user,
        no_grad=tuple(nograd),
    )
    return it, rec


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
