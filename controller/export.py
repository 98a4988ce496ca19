"""Export one iteration held by the shadows as a ``torch.distributed.checkpoint`` directory,
check such a directory, and load it into live objects.

``export_checkpoint(spec, "latest" | I, out)`` asks every shadow for its status, picks a source
per shard (``latest``: the restore point I* by :func:`shadowgrad.restore.restore_point`, the one
rule; an explicit ``I``: a shadow whose status says it can serve ``I``), places ``hold(I)`` on
the sources, reads layout and optimizer spec (``config``), fetches every shard at ``I`` (each
tensor stream verified chunk by chunk, CRC-32C), releases the holds it placed, glues the shards
into full tensors (:func:`shadowgrad.boxes.assemble_full`) and writes, single-process,

.. code-block:: text

    {"model":     {name: tensor}            # trained parameters + module state (buffers, ...)
     "optim":     {"state": {index: {key: tensor}},          # optimizer.state_dict() form:
                   "param_groups": [{hyper..., "lr", "params": [index, ...]}]},
     "scheduler": scheduler.state_dict() at I, or None,     # from COMMIT(I)'s user-state blob
     "scaler":    GradScaler.state_dict() at I, or None,
     "user":      the user_state passed to step() at I, or None,
     "iteration": I}

with ``dcp.save`` into a temporary sibling directory that is renamed into place at the end, plus
``shadowgrad-manifest.json`` (job, iteration, layout digest, generation, the parameter names in
optimizer-index order, sha256 and size of every file DCP wrote, and ``manifest_sha256`` over the
canonical JSON of the rest). ``verify_export(dir)`` re-checks all of it; ``load_export`` loads an
export into a model, optimizer, scheduler and scaler on one process or on every rank of a
process group.

Imports neither grpc nor protobuf: it needs only the core, the shadow client and torch (which
is imported when a function runs, not when this module is imported).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from shadowgrad import __version__, events
from shadowgrad._log import event
from shadowgrad.errors import ShadowgradError
from shadowgrad.layout import shadows_of_shard

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from shadowgrad.config import JobSpec
    from shadowgrad.control_client import ShadowClient
    from shadowgrad.layout import Layout
    from shadowgrad.messages import ShadowStatus
    from shadowgrad.optspec import OptimizerSpec

__all__ = [
    "FORMAT",
    "MANIFEST",
    "ExportError",
    "Problem",
    "export_checkpoint",
    "verify_export",
    "read_manifest",
    "load_export",
]

log = logging.getLogger(__name__)

#: the manifest's ``format``
FORMAT = "shadowgrad.export/1"
#: the manifest's file name inside an export directory
MANIFEST = "shadowgrad-manifest.json"
#: assumed control-service throughput when sizing a fetch's timeout (as the trainers do)
_BULK_BYTES_PER_S = 20 * 2**20
#: attempts at ``latest`` when the restore point moves on while the holds are being placed
_LATEST_ATTEMPTS = 3
_HASH_CHUNK = 2**20

Progress = Callable[[str], None]


class ExportError(ShadowgradError):
    """An export could not be made, or an export directory is not usable."""


@dataclass(frozen=True)
class Problem:
    """One finding of :func:`verify_export`: ``path`` relative to the export directory."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


# ---------------------------------------------------------------------------------------------
# manifest
# ---------------------------------------------------------------------------------------------


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(
        doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _manifest_checksum(doc: Mapping[str, Any]) -> str:
    return hashlib.sha256(
        _canonical({k: v for k, v in doc.items() if k != "manifest_sha256"})
    ).hexdigest()


def _manifest_bytes(doc: Mapping[str, Any]) -> bytes:
    """The one byte form of a manifest (sorted keys, indent 1, ASCII, trailing newline): a
    verifier re-serialises and compares bytes, so even a whitespace byte cannot change."""
    text = json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False)
    return (text + "\n").encode("ascii")


def _parse_manifest(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(manifest, None) or (None, why it is bad)."""
    try:
        doc = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as e:
        return None, f"does not parse as JSON ({e})"
    if not isinstance(doc, dict):
        return None, "is not a JSON object"
    if doc.get("format") != FORMAT:
        return None, f"format {doc.get('format')!r}, expected {FORMAT!r}"
    want = doc.get("manifest_sha256")
    if not isinstance(want, str) or want != _manifest_checksum(doc):
        return None, "manifest_sha256 does not match its content (edited or corrupted)"
    if _manifest_bytes(doc) != raw:
        return None, "bytes differ from the canonical form of its content (edited or corrupted)"
    files = doc.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("sha256"), str) and isinstance(v.get("size"), int)
        for v in files.values()
    ):
        return None, "has no valid 'files' table"
    for rel in files:
        parts = PurePosixPath(rel).parts
        if rel == MANIFEST or not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
            return None, f"lists the file {rel!r}, which cannot be part of an export"
    if not isinstance(doc.get("param_names"), list) or not isinstance(doc.get("iteration"), int):
        return None, "lacks param_names or iteration"
    return doc, None


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the export directory ``path``, its own checksum checked (the data files
    are not hashed; :func:`verify_export` does that). Raises :class:`ExportError`."""
    mpath = Path(path) / MANIFEST
    try:
        raw = mpath.read_bytes()
    except OSError as e:
        raise ExportError(f"{mpath}: cannot read the export manifest: {e}") from None
    doc, why = _parse_manifest(raw)
    if doc is None:
        raise ExportError(f"{mpath}: {why}")
    return doc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _walk(root: Path) -> tuple[list[str], list[str]]:
    """(regular files, other entries) under ``root``, as sorted relative POSIX paths."""
    files: list[str] = []
    other: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for d in list(dirnames):
            if (base / d).is_symlink():
                other.append((base / d).relative_to(root).as_posix())
                dirnames.remove(d)
        for name in filenames:
            p = base / name
            rel = p.relative_to(root).as_posix()
            (files if p.is_file() and not p.is_symlink() else other).append(rel)
    return sorted(files), sorted(other)


# ---------------------------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------------------------


def verify_export(path: str | os.PathLike[str]) -> list[Problem]:
    """Check an export directory; an empty list means it is intact.

    The manifest must parse, match its ``manifest_sha256`` and be byte-identical to its
    canonical form; every file it lists must exist with its size and sha256; no other file may
    be present; the DCP metadata must load (only once its checksum matched: it is a pickle) and
    list ``model.<name>`` for every parameter, and every storage file it refers to must be
    listed and long enough. A bad manifest is reported alone (nothing else can be trusted).
    """
    root = Path(path)
    if not root.is_dir():
        return [Problem(".", f"{root} is not a directory")]
    try:
        raw = (root / MANIFEST).read_bytes()
    except OSError as e:
        return [Problem(MANIFEST, f"cannot be read ({e.strerror or e})")]
    doc, why = _parse_manifest(raw)
    if doc is None:
        return [Problem(MANIFEST, str(why))]
    problems: list[Problem] = []
    listed: dict[str, dict[str, Any]] = doc["files"]
    files, other = _walk(root)
    present = set(files) - {MANIFEST}
    problems += [Problem(p, "not a regular file") for p in other]
    problems += [Problem(p, "missing") for p in sorted(set(listed) - present)]
    problems += [Problem(p, "not in the manifest") for p in sorted(present - set(listed))]
    intact: set[str] = set()
    for rel in sorted(set(listed) & present):
        want = listed[rel]
        size = (root / rel).stat().st_size
        if size != want["size"]:
            problems.append(Problem(rel, f"{size} bytes, the manifest says {want['size']}"))
        elif _sha256(root / rel) != want["sha256"]:
            problems.append(Problem(rel, "sha256 differs from the manifest"))
        else:
            intact.add(rel)
    if ".metadata" not in listed:
        problems.append(Problem(".metadata", "the manifest lists no DCP metadata"))
    elif ".metadata" in intact:
        problems += _check_metadata(root, doc, intact, listed)
    return problems


def _check_metadata(
    root: Path, doc: Mapping[str, Any], intact: set[str], listed: Mapping[str, Mapping[str, Any]]
) -> list[Problem]:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    try:
        md = FileSystemReader(str(root)).read_metadata()
    except Exception as e:  # a pickle: any exception type
        return [Problem(".metadata", f"DCP metadata does not load: {type(e).__name__}: {e}")]
    out: list[Problem] = []
    keys = md.state_dict_metadata
    missing = [n for n in doc["param_names"] if f"model.{n}" not in keys]
    if missing:
        out.append(Problem(".metadata", f"lists no tensor for parameter(s) {missing[:8]}"))
    if "iteration" not in keys:
        out.append(Problem(".metadata", "lists no 'iteration'"))
    for index, info in (md.storage_data or {}).items():
        rel = str(getattr(info, "relative_path", ""))
        end = int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0))
        if rel not in listed:
            out.append(
                Problem(".metadata", f"{index.fqn} is stored in {rel!r}, not an export file")
            )
            break
        if rel in intact and end > int(listed[rel]["size"]):
            out.append(Problem(rel, f"shorter than the metadata says ({index.fqn} ends at {end})"))
            break
    return out


# ---------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Conn:
    """How to reach the job's shadows: spec, token, seconds per control call."""

    spec: JobSpec
    token: str
    rpc_s: float

    def client(self, k: int, timeout_s: float | None = None) -> ShadowClient:
        """Shadow ``k``'s control client (as the trainers build it, trainer_hooks._session)."""
        from shadowgrad.control_client import ShadowClient

        ep = self.spec.shadows.control_endpoint(k)
        return ShadowClient(
            f"tcp://{ep}", self.token, timeout_s=self.rpc_s if timeout_s is None else timeout_s
        )


def _token_source(spec: JobSpec) -> str:
    sec = spec.security
    if sec.token_file is not None:
        return f"security.token_file = {sec.token_file}"
    return f"the environment variable {sec.token_env} (security.token_env)"


def _refused(spec: JobSpec, k: int, exc: Exception) -> ExportError:
    ep = spec.shadows.control_endpoint(k)
    return ExportError(
        f"shadow {k} (tcp://{ep}) refused the token (bad_token): the token from "
        f"{_token_source(spec)} is not this job's; nothing was exported ({exc})"
    )


def _statuses(conn: _Conn) -> dict[int, ShadowStatus | None]:
    from shadowgrad.errors import ControlError, ShadowgradTimeout

    spec = conn.spec
    out: dict[int, ShadowStatus | None] = {}
    for k in range(spec.shadows.count):
        try:
            with conn.client(k) as c:
                out[k] = c.status(timeline=0)
        except ControlError as e:
            if e.code == "bad_token":
                raise _refused(spec, k, e) from None
            event(log, events.EXPORT_SHADOW_ERROR, logging.WARNING, shadow=k, error=str(e))
            out[k] = None
        except ShadowgradTimeout as e:
            event(log, events.EXPORT_SHADOW_UNREACHABLE, logging.WARNING, shadow=k, error=str(e))
            out[k] = None
    return out


def _can_serve(status: ShadowStatus | None, it: int) -> bool:
    if status is None or not status.loaded:
        return False
    hole = status.diverged_at
    if hole is not None and hole <= it:
        return False
    return it in status.available or status.last_applied == it


def _describe(k: int, status: ShadowStatus | None) -> str:
    if status is None:
        return f"shadow {k}: no answer"
    if not status.loaded:
        return f"shadow {k}: not loaded"
    hole = status.diverged_at
    tail = f", diverged at {hole}" if hole is not None else ""
    return f"shadow {k}: available {list(status.available)}{tail}"


def _sources(
    spec: JobSpec,
    statuses: Mapping[int, ShadowStatus | None],
    iteration: int | Literal["latest"],
) -> tuple[int, list[int]]:
    """(I, source shadow per shard)."""
    from shadowgrad.restore import restore_point

    n, r = spec.shadows.num_shards, spec.shadows.replication
    preferred: list[int] | None = None
    if iteration == "latest":
        point = restore_point(statuses, num_shards=n, replication=r)
        if point.fresh and point.reachable == 0:
            eps = ", ".join(
                f"tcp://{spec.shadows.control_endpoint(k)}" for k in range(spec.shadows.count)
            )
            raise ExportError(
                f"no shadow of job {spec.job.name!r} answers ({eps}): are they "
                "running, and is this the job's spec?"
            )
        if point.fresh:
            raise ExportError(
                f"no shadow holds state ({point.reachable} of "
                f"{spec.shadows.count} answer, none loaded): nothing to export"
            )
        it, preferred = point.istar, list(point.source)
    else:
        it = int(iteration)
        digests = {str(s.layout) for s in statuses.values() if s and s.loaded}
        if len(digests) > 1:
            shown = sorted(d[:16] for d in digests)
            raise ExportError(f"the shadows hold different layouts {shown}: not one job's state")
    chosen: list[int] = []
    for shard in range(n):
        members = list(shadows_of_shard(shard, n, r))
        if preferred is not None:
            members.sort(key=lambda k: k != preferred[shard])
        k = next((k for k in members if _can_serve(statuses.get(k), it)), None)
        if k is None:
            detail = "; ".join(_describe(m, statuses.get(m)) for m in members)
            raise ExportError(f"no shadow can serve iteration {it} of shard {shard} ({detail})")
        chosen.append(k)
    return it, chosen


@contextlib.contextmanager
def _holding(
    conn: _Conn, statuses: Mapping[int, ShadowStatus | None], sources: Sequence[int], it: int
) -> Iterator[None]:
    """``hold(it)`` on every source; on exit release the holds this export placed (a hold that
    was there before, e.g. the controller's, stays: holds are not counted)."""
    from shadowgrad.errors import ControlError

    placed: list[int] = []
    try:
        for k in sorted(set(sources)):
            st = statuses.get(k)
            before = set(() if st is None else st.holds)
            try:
                with conn.client(k) as c:
                    c.hold(it)
            except ControlError as e:
                if e.code == "bad_token":
                    raise _refused(conn.spec, k, e) from None
                raise
            if it not in before:
                placed.append(k)
        yield
    finally:
        for k in placed:
            try:
                with conn.client(k) as c:
                    c.release(it)
            except Exception as e:  # keep releasing the others; the hold is soft state
                event(
                    log,
                    events.EXPORT_RELEASE_FAILED,
                    logging.WARNING,
                    shadow=k,
                    iteration=it,
                    error=str(e),
                )


def _fetch(
    conn: _Conn, layout: Layout, sources: Sequence[int], it: int, progress: Progress | None
) -> tuple[list[list[dict[str, torch.Tensor]]], dict[str, Any] | None, set[int]]:
    """Every shard's boxes at ``it``; COMMIT(it) (shard 0's, else any shard's); generations."""
    exports: list[list[dict[str, torch.Tensor]]] = []
    commit: dict[str, Any] | None = None
    generations: set[int] = set()
    n = layout.num_shards
    for shard, k in enumerate(sources):
        nbytes = layout.shard_bytes(shard)
        bulk = max(conn.rpc_s, conn.spec.timeouts.connect_s + 3 * nbytes / _BULK_BYTES_PER_S)
        t0 = time.monotonic()
        with conn.client(k, bulk) as c:
            reply = c.fetch_raw(it)
        if reply.iteration != it or reply.shard != shard:
            raise ExportError(
                f"shadow {k} answered iteration {reply.iteration} of shard "
                f"{reply.shard}, asked for iteration {it} of shard {shard}"
            )
        states = reply.decode().states
        nbox = len(layout.shard_entries(shard))  # parameter boxes, module state
        if sorted(states) != list(range(nbox)):
            raise ExportError(
                f"shadow {k} sent boxes {sorted(states)[:8]}... of shard {shard}, "
                f"the layout has {nbox}"
            )
        exports.append([states[b] for b in range(nbox)])
        generations.add(reply.generation or 0)
        if commit is None:
            commit = reply.commit
        size = sum(len(f) for f in reply.frames)
        if progress is not None:
            progress(
                f"shard {shard + 1}/{n} from shadow {k}: {len(reply.entries)} tensors, "
                f"{size / 2**20:.2f} MiB in {time.monotonic() - t0:.2f}s"
            )
    return exports, commit, generations


def _optimizer_state(
    optspec: OptimizerSpec,
    opt_state: Mapping[str, Mapping[str, Any]],
    lrs: Sequence[float] | None,
    initial_lrs: Sequence[float] | None,
) -> dict[str, Any]:
    """``optimizer.state_dict()`` form: parameters numbered in the spec's group order (as torch
    numbers them), every hyperparameter the spec records, ``lr`` (and ``initial_lr`` when a
    scheduler set it) as the optimizer had them after step I."""
    names = optspec.param_names
    unknown = sorted(set(opt_state) - set(names))
    if unknown:
        raise ExportError(f"optimizer state for {unknown[:4]}, which no param group holds")
    state = {i: dict(opt_state[n]) for i, n in enumerate(names) if n in opt_state}
    groups: list[dict[str, Any]] = []
    index = 0
    for g, group in enumerate(optspec.groups):
        doc: dict[str, Any] = {} if lrs is None else {"lr": float(lrs[g])}
        doc.update(group.kwargs())
        if initial_lrs is not None:
            doc["initial_lr"] = float(initial_lrs[g])
        doc["params"] = list(range(index, index + len(group.params)))
        index += len(group.params)
        groups.append(doc)
    return {"state": state, "param_groups": groups}


def _group_lrs(
    optspec: OptimizerSpec, rec: Any, scheduler: Any, it: int
) -> tuple[list[float] | None, list[float] | None]:
    """LR per group after step I: the scheduler's ``_last_lr`` when it kept one (the LR the next
    step would use, as in the live optimizer), else the LR step I ran with (COMMIT ``lrs``);
    None for the initial state (-1), which has no COMMIT: the groups then carry no ``lr``."""
    n = len(optspec.groups)
    last = scheduler.get("_last_lr") if isinstance(scheduler, Mapping) else None
    base = scheduler.get("base_lrs") if isinstance(scheduler, Mapping) else None
    initial = [float(x) for x in base] if isinstance(base, list) and len(base) == n else None
    if isinstance(last, list) and len(last) == n:
        return [float(x) for x in last], initial
    if rec is not None and len(rec.lrs) == n:
        return [float(x) for x in rec.lrs], initial
    if rec is None:
        event(log, events.EXPORT_WITHOUT_LR, logging.WARNING, iteration=it)
        return None, initial
    raise ExportError(
        f"no learning rate for the {n} param groups (the COMMIT record of "
        f"iteration {it} has {len(rec.lrs)})"
    )


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"--out {out} exists and is not empty (use --force to replace it)")
    if not out.parent.is_dir():
        raise ExportError(f"--out {out}: the parent directory {out.parent} does not exist")


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _install(tmp: Path, out: Path, force: bool) -> None:
    """Rename the finished ``tmp`` to ``out`` (an empty ``out`` is replaced; a non-empty one
    only with ``force``, moved aside first and deleted once the new one is in place)."""
    _check_out(out, force)
    old: Path | None = None
    if out.is_dir():
        if any(out.iterdir()):
            old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
            out.rename(old)
        else:
            out.rmdir()
    tmp.rename(out)
    _fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _save(state_dict: dict[str, Any], path: Path) -> None:
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    with warnings.catch_warnings():  # no_dist=True always warns that it assumes one process
        warnings.filterwarnings(
            "ignore", message=".*assuming the intent is to save", category=UserWarning
        )
        dcp_save(state_dict, checkpoint_id=str(path), no_dist=True)


def export_checkpoint(
    spec: JobSpec,
    iteration: int | Literal["latest"],
    out: str | os.PathLike[str],
    *,
    token: str | None = None,
    timeout_s: float | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write iteration ``iteration`` (an int >= -1, or ``"latest"``: the restore point I*) of
    the job ``spec`` as a DCP checkpoint directory ``out`` and return its manifest.

    ``token``: the control token (default: the spec's ``[security]`` source); ``timeout_s``:
    seconds per control call (default ``timeouts.rpc``; fetches get more by size); ``force``:
    replace a non-empty ``out``; ``progress``: called with one line per shard. Raises
    :class:`ExportError` (a ShadowgradError) and leaves nothing behind on failure.
    """
    from shadowgrad.blob import unpack_blob
    from shadowgrad.boxes import assemble_full
    from shadowgrad.errors import ControlError
    from shadowgrad.layout import Layout
    from shadowgrad.optspec import OptimizerSpec
    from shadowgrad.tensorstream import commit_from_json

    if iteration != "latest" and (
        isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < -1
    ):
        raise ExportError(f"iteration {iteration!r}: an iteration >= -1 or 'latest'")
    out = Path(out)
    _check_out(out, force)
    conn = _Conn(
        spec,
        spec.token() if token is None else token,
        spec.timeouts.rpc_s if timeout_s is None else float(timeout_s),
    )
    t_start = time.monotonic()
    attempts = _LATEST_ATTEMPTS if iteration == "latest" else 1
    for attempt in range(attempts):
        statuses = _statuses(conn)
        it, sources = _sources(spec, statuses, iteration)
        try:
            with _holding(conn, statuses, sources, it):
                with conn.client(sources[0]) as c:
                    config = c.config()
                layout = Layout.from_json(config.layout)
                optspec = OptimizerSpec.from_json(config.optimizer)
                for k in sources:
                    st = statuses[k]
                    digest = None if st is None else st.layout
                    if digest != layout.digest:
                        raise ExportError(
                            f"shadow {k} holds layout {str(digest)[:16]}, shadow "
                            f"{sources[0]}'s config says {layout.digest[:16]}"
                        )
                if layout.num_shards != spec.shadows.num_shards:
                    raise ExportError(
                        f"the layout has {layout.num_shards} shards, the spec "
                        f"{spec.shadows.num_shards}"
                    )
                exports, commit, generations = _fetch(conn, layout, sources, it, progress)
            break
        except ControlError as e:
            if e.code == "unavailable" and attempt + 1 < attempts:
                event(log, events.EXPORT_RETRY, logging.INFO, iteration=it, error=str(e))
                continue
            raise ExportError(f"iteration {it}: {e}") from None
    if len(generations) > 1:
        raise ExportError(
            f"the shards of iteration {it} come from generations "
            f"{sorted(generations)}: not one consistent cut"
        )
    params, opt_state = assemble_full(layout, exports)
    rec = None
    blob: dict[str, Any] = {}
    if commit is not None:
        _, rec = commit_from_json(commit)
        if rec.user_state:
            blob = unpack_blob(bytes(rec.user_state))
    if not blob and it >= 0:
        event(
            log,
            events.EXPORT_WITHOUT_USER_STATE,
            logging.WARNING,
            iteration=it,
            reason="no COMMIT record" if rec is None else "empty user-state blob",
        )
    lrs, initial = _group_lrs(optspec, rec, blob.get("scheduler"), it)
    # the trained parameters and the layout's module state (buffers, frozen parameters: they
    # come with the shards); a COMMIT blob of an older trainer may carry module state itself
    model: dict[str, Any] = dict(params)
    module_state = dict(blob.get("module") or {})
    clash = sorted(set(module_state) & set(model))
    if clash:
        raise ExportError(f"the COMMIT's module state names trained parameters {clash[:4]}")
    model.update(module_state)
    state_dict: dict[str, Any] = {
        "model": model,
        "optim": _optimizer_state(optspec, opt_state, lrs, initial),
        "scheduler": blob.get("scheduler"),
        "scaler": blob.get("scaler"),
        "user": blob.get("user"),
        "iteration": it,
    }
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _save(state_dict, tmp)
        files, _other = _walk(tmp)
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "job": {"id": spec.job.id, "name": spec.job.name},
            "iteration": it,
            "layout": layout.digest,
            "generation": max(generations),
            "optimizer": {"type": optspec.type, "digest": optspec.digest},
            "sources": list(sources),
            "param_names": list(optspec.param_names),
            "module_state": sorted({st.name for st in layout.state} | set(module_state)),
            "user_state": bool(blob),
            "commit": None
            if rec is None
            else {
                "lrs": [float(x) for x in rec.lrs],
                "skipped": rec.skipped,
                "clip_coef": _finite(rec.clip_coef),
                "loss_scale": _finite(rec.loss_scale),
            },
            "torch": _torch_version(),
            "shadowgrad": __version__,
            "created_unix": round(time.time(), 3),
            "files": {
                rel: {"sha256": _sha256(tmp / rel), "size": (tmp / rel).stat().st_size}
                for rel in files
            },
        }
        manifest["manifest_sha256"] = _manifest_checksum(manifest)
        with (tmp / MANIFEST).open("wb") as f:
            f.write(_manifest_bytes(manifest))
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        _install(tmp, out, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    total = sum(v["size"] for v in manifest["files"].values())
    event(
        log,
        events.EXPORT_DONE,
        iteration=it,
        out=str(out),
        files=len(files),
        bytes=total,
        seconds=round(time.monotonic() - t_start, 3),
    )
    return manifest


def _finite(x: float | None) -> float | None:
    """A JSON-safe number: a skipped step's clip coefficient may be NaN (-> null)."""
    return None if x is None or not math.isfinite(x) else float(x)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


# ---------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------


def _set_path(root: dict[str, Any], path: Sequence[str | int], value: Any) -> None:
    """Place ``value`` at ``path`` (str: dict key, int: list index), creating containers."""
    cur: Any = root
    for i, key in enumerate(path[:-1]):
        nxt_is_list = isinstance(path[i + 1], int)
        if isinstance(key, int):
            while len(cur) <= key:
                cur.append(None)
            if cur[key] is None:
                cur[key] = [] if nxt_is_list else {}
            cur = cur[key]
        else:
            cur = cur.setdefault(key, [] if nxt_is_list else {})
    last = path[-1]
    if isinstance(last, int):
        while len(cur) <= last:
            cur.append(None)
        cur[last] = value
    else:
        cur[last] = value


def load_export(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    *,
    verify: bool = False,
) -> dict[str, Any]:
    """Load the export at ``path`` into live objects; returns ``{"iteration": I,
    "next_iteration": I + 1, "user_state": ..., "missing_module_state": [...]}``.

    Works in one process and on every rank of an initialised process group (collective then:
    every rank calls it; DCP coordinates the reads). ``model`` may be DDP-wrapped. The target
    structure is built from the checkpoint's own metadata, so a fresh optimizer (empty
    ``state``) needs no dummy step: model tensors are loaded in place into
    ``model.state_dict()``; optimizer tensors into buffers of the recorded shapes, then mapped
    by parameter name (the manifest's ``param_names``) onto ``optimizer`` with
    :func:`shadowgrad.optspec.load_state_by_name` (torch's ``load_state_dict``: cast and placed
    like the parameters), and each group's hyperparameters and LR are set as at iteration I.
    The optimizer's param groups must hold the same parameters as the exported ones.
    ``scheduler`` / ``scaler``: their ``load_state_dict`` (the LR is then the scheduler's).
    ``verify``: run :func:`verify_export` first. Module state the export lacks (a buffer the
    trainer did not carry) is left as is and listed in ``missing_module_state``.
    """
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    root = Path(path)
    if verify:
        bad = verify_export(root)
        if bad:
            raise ExportError(f"{root}: " + "; ".join(str(p) for p in bad))
    manifest = read_manifest(root)
    names: list[str] = list(manifest["param_names"])
    module = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    try:
        md = FileSystemReader(str(root)).read_metadata()
    except Exception as e:
        raise ExportError(f"{root}: DCP metadata does not load: {e}") from None
    mapping: Mapping[str, Sequence[str | int]] = md.planner_data or {}
    live = module.state_dict(keep_vars=False)
    trained = {n for n, p in module.named_parameters() if p.requires_grad}
    target: dict[str, Any] = {"model": {}}
    exported_model: set[str] = set()
    for fqn, meta in md.state_dict_metadata.items():
        where = tuple(mapping.get(fqn, (fqn,)))
        if where[0] == "model" and len(where) == 2:
            name = str(where[1])
            exported_model.add(name)
            if name in live:
                target["model"][name] = live[name]
            continue
        value: Any = None
        if isinstance(meta, TensorStorageMetadata):
            value = torch.empty(meta.size, dtype=meta.properties.dtype)
        _set_path(target, where, value)
    unknown = sorted(exported_model - set(live))
    absent = sorted(n for n in set(live) - exported_model if n in trained)
    if unknown or absent:
        raise ExportError(
            f"{root}: the model does not match the export (export only: "
            f"{unknown[:6]}, model parameters not exported: {absent[:6]})"
        )
    missing_state = sorted(set(live) - exported_model)
    if missing_state:
        event(
            log, events.EXPORT_LOAD_WITHOUT_MODULE_STATE, logging.WARNING, names=missing_state[:8]
        )
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*assuming the intent is to load", category=UserWarning
        )
        dcp_load(target, checkpoint_id=str(root))
    with torch.no_grad():  # in place already; load_state_dict also covers a model that copies
        module.load_state_dict(target["model"], strict=False)
    if optimizer is not None:
        _load_optimizer(optimizer, module, names, target.get("optim") or {})
    if scheduler is not None and target.get("scheduler") is not None:
        scheduler.load_state_dict(target["scheduler"])
        if optimizer is not None and hasattr(scheduler, "get_last_lr"):
            for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr(), strict=True):
                group["lr"] = lr
    if (
        scaler is not None
        and target.get("scaler") is not None
        and (not hasattr(scaler, "is_enabled") or scaler.is_enabled())
    ):
        scaler.load_state_dict(target["scaler"])
    it = int(target["iteration"])
    return {
        "iteration": it,
        "next_iteration": it + 1,
        "user_state": target.get("user"),
        "missing_module_state": missing_state,
    }


def _load_optimizer(
    optimizer: torch.optim.Optimizer,
    module: torch.nn.Module,
    names: Sequence[str],
    saved: Mapping[str, Any],
) -> None:
    """The exported optimizer state by parameter name, then the exported hyperparameters."""
    from shadowgrad.optspec import load_state_by_name

    named = dict(module.named_parameters())
    name_of = {id(p): n for n, p in named.items()}
    groups = saved.get("param_groups") or []
    if len(groups) != len(optimizer.param_groups):
        raise ExportError(
            f"the export has {len(groups)} param groups, the optimizer "
            f"{len(optimizer.param_groups)}"
        )
    for g, (doc, live) in enumerate(zip(groups, optimizer.param_groups, strict=True)):
        want = {names[int(i)] for i in doc.get("params") or ()}
        have = {name_of.get(id(p), "?") for p in live["params"]}
        if want != have:
            raise ExportError(
                f"param group {g} holds {sorted(have)[:4]}..., the export's "
                f"{sorted(want)[:4]}...: not the exported optimizer"
            )
    state = {names[int(i)]: st for i, st in (saved.get("state") or {}).items()}
    load_state_by_name(optimizer, named, state)
    for doc, live in zip(groups, optimizer.param_groups, strict=True):
        for key, value in doc.items():
            if key != "params":
                live[key] = value
