"""Soak the documented mirror example the way a user runs it, with faults, and report.

    .venv/bin/python tools/soak.py --steps 2000                       # clean run
    .venv/bin/python tools/soak.py --steps 2000 --runs 5              # five in a row
    .venv/bin/python tools/soak.py --steps 600 --stop-shadow 1 --at 10 --for 3
    .venv/bin/python tools/soak.py --steps 600 --kill-shadow 1 --at 8 --replication 2
    .venv/bin/python tools/soak.py --steps 300 --attack                # forged records

Starts ``shadowgrad shadow`` processes for every shadow of a job spec shaped like
``examples/job-loopback.toml`` (2 trainers, 3 shadows, its timeouts; free ports so runs can be
repeated at once), runs ``torchrun --nproc-per-node 2 examples/train_mirror.py`` at full speed,
injects the requested shadow fault (SIGSTOP/SIGCONT, or SIGKILL + restart with the same
command), then checks: every shadow applied the last iteration, none diverged, nothing dropped,
the final trainer state equals ``examples/train_plain.py``'s bit for bit (run once per step
count, cached under the work directory or ``--plain-dir``, which soaks can share), and the
shadows' state equals it too. Prints a JSON report (max lag, NACK/retransmit counts,
retransmissions after the fault settled) and exits 1 when a check failed. Every process it
starts is reaped, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOKEN = "soak-token"
#: the victim of a shadow fault has settled once it is this close to the trainers (iterations)
SETTLED_LAG = 10
#: after settling, retransmissions may be at most this share of the chunks a shadow took in: a
#: shadow starved of CPU on a loaded 2-core machine overflows its socket buffer now and then
#: (seen in CI: 111 chunks, ~18 iterations, ~3 %), which repair is for; a repair that never
#: ends retransmits a large share
RETX_AFTER_SETTLE = 0.05


def _spec_text(shadows: int, replication: int, job_id: int, controller: int | None = None) -> str:
    from shadowgrad.specs import loopback_spec, spec_toml

    doc = loopback_spec(
        2,
        shadows,
        replication=replication,
        job_id=job_id,
        gap_repair="100ms",
        heartbeat="250ms",
        rpc="1s",
    )
    doc["timeouts"]["connect"] = "5s"
    doc["job"]["name"] = "loopback"
    if controller is not None:
        doc["controller"] = {"address": f"127.0.0.1:{controller}"}
    return spec_toml(doc)


def _start(cmd: list[str], log: Path, mode: str = "ab") -> subprocess.Popen[bytes]:
    """``cmd`` in a session of its own, output to ``log`` (opened with ``mode``), recorded to be
    reaped."""
    f = log.open(mode)
    try:
        p = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=ROOT,
            start_new_session=True,
        )
        _STARTED.append(p)
        return p
    finally:
        f.close()


def _cli() -> str:
    return str(Path(sys.executable).parent / "shadowgrad")


def _controller(spec: Path, log: Path) -> subprocess.Popen[bytes]:
    return _start([_cli(), "--log-json", "controller", "--spec", str(spec)], log)


def _events(log: Path, prefix: str) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            d = json.loads(line)
            if isinstance(d, dict) and str(d.get("event", "")).startswith(prefix):
                out.append(d)
    return out


def _worker_of_rank(pid: int, rank: int) -> int | None:
    """The torchrun worker process of ``rank`` (by its RANK environment variable)."""
    for w in _descendants(pid):
        with contextlib.suppress(OSError):
            env = Path(f"/proc/{w}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in env and b"LOCAL_RANK=" + str(rank).encode() in env:
                return w
    return None


def _env() -> dict[str, str]:
    # as a user runs it: torchrun sets OMP_NUM_THREADS=1 for its workers, the shadows keep
    # torch's default thread count
    env = {**os.environ, "SHADOWGRAD_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    env.pop("OMP_NUM_THREADS", None)
    return env


SHADOW_ARGS: list[str] = []
#: every process this tool started, and the torchrun workers seen: reaped on any exit
_STARTED: list[subprocess.Popen[bytes]] = []
_WORKERS: set[int] = set()


def _reap_all() -> None:
    for p in _STARTED:
        if p.poll() is None:
            _WORKERS.update(_descendants(p.pid))
    for pid in _WORKERS:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for p in _STARTED:
        _reap(p)


def _shadow(spec: Path, k: int, log: Path) -> subprocess.Popen[bytes]:
    return _start([_cli(), "shadow", "--spec", str(spec), "--id", str(k), *SHADOW_ARGS], log)


def _torchrun(
    script: str, args: list[str], log: Path, max_restarts: int = 0
) -> subprocess.Popen[bytes]:
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts else []
    return _start(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            *restarts,
            "--master-port",
            str(_free_port()),
            # torchrun's own logs beside ours (without it every run leaves a
            # /tmp/torchelastic_* behind)
            "--log-dir",
            str(log.parent / "torchrun"),
            str(ROOT / "examples" / script),
            *args,
        ],
        log,
        "wb",
    )


def _free_port() -> int:
    from shadowgrad.freeports import free_port

    return free_port()


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(pid))
    return out


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (torchrun puts its workers in sessions of their own,
    so a process-group kill does not reach them)."""
    kids = _children()
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except (OSError, IndexError):
            continue
    return False


def _reap(
    p: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL, extra: list[int] | None = None
) -> None:
    for pid in [
        *(_descendants(p.pid) if p is not None and p.poll() is None else []),
        *(extra or []),
    ]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if p is None or p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGCONT)
        os.killpg(p.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(10)
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def _statuses(spec_path: Path) -> list[dict[str, Any] | None]:
    from shadowgrad.config import load_spec
    from shadowgrad.shadow.control import ShadowClient

    spec = load_spec(spec_path)
    out: list[dict[str, Any] | None] = []
    for k in range(spec.shadows.count):
        try:
            with ShadowClient(
                f"tcp://{spec.shadows.control_endpoint(k)}", TOKEN, timeout_s=1.0
            ) as c:
                out.append(dict(c.status(timeline=0).raw))
        except Exception:
            out.append(None)
    return out


def _last_step(log: Path) -> int:
    text = log.read_text(errors="replace") if log.exists() else ""
    steps = re.findall(r"^step (\d+) loss ", text, re.M)
    return int(steps[-1]) if steps else -1


def _losses(text: str) -> dict[int, str]:
    return {int(m[1]): m[2] for m in re.finditer(r"^step (\d+) loss (\S+)\n", text, re.M)}


def _first_step(log: Path) -> int:
    text = log.read_text(errors="replace") if log.exists() else ""
    m = re.search(r"^step (\d+) loss ", text, re.M)
    return int(m[1]) if m else -1


def _plain(refs: Path, steps: int) -> Path:
    """``train_plain.py --steps STEPS``'s final state (and its log beside it) in ``refs``, run
    once per step count: written under temporary names and renamed when complete, so that a
    killed run leaves nothing that a later soak sharing ``refs`` (``--plain-dir``) takes for a
    reference."""
    out = refs / f"plain-{steps}.pt"
    log = refs / f"plain-{steps}.log"
    if not (out.exists() and log.exists()):
        part, part_log = out.with_suffix(f".pt.{os.getpid()}"), log.with_suffix(f".{os.getpid()}")
        p = _torchrun("train_plain.py", ["--steps", str(steps), "--out", str(part)], part_log)
        try:
            rc = p.wait(3600)
        finally:
            _reap(p)
        if rc != 0 and not (part.exists() and _last_step(part_log) == steps - 1):
            raise SystemExit(f"train_plain.py failed: see {part_log}")
        os.replace(part_log, log)
        os.replace(part, out)
    return out


def _compare(a: dict[str, Any], b: dict[str, Any], path: str = "") -> list[str]:
    import torch

    bad: list[str] = []
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        ):
            bad.append(path)
        return bad
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                bad.append(f"{path}/{k} (missing)")
            else:
                bad += _compare(a[k], b[k], f"{path}/{k}")
        return bad
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{path} (length)"]
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            bad += _compare(x, y, f"{path}[{i}]")
        return bad
    return [] if a == b else [path]


def _shadow_state_matches(spec_path: Path, final: dict[str, Any], steps: int) -> list[str]:
    """The shadows' state of the last iteration against the trainer's final state."""
    import torch

    from shadowgrad.config import load_spec
    from shadowgrad.testing.cluster import fetch_from_shadows

    _layout, params, opt, _status = fetch_from_shadows(load_spec(spec_path), TOKEN, steps - 1)
    bad = [
        f"param {n}"
        for n, t in params.items()
        if not torch.equal(t, final["model"][n.removeprefix("module.")])
    ]
    # the example's param groups: weights (decay), then the rest, each in module order; the
    # optimizer's state_dict numbers parameters in that order
    names = list(final["model"])
    order = [n for n in names if n.endswith("weight")] + [
        n for n in names if not n.endswith("weight")
    ]
    for idx, name in enumerate(order):
        key = f"module.{name}" if f"module.{name}" in opt else name
        for sk, v in final["optimizer"]["state"][idx].items():
            if sk not in opt.get(key, {}):
                bad.append(f"opt {name}.{sk} (missing)")
            elif not torch.equal(opt[key][sk], v):
                bad.append(f"opt {name}.{sk}")
    return bad


def soak(args: argparse.Namespace, work: Path, run: int) -> dict[str, Any]:
    refs = Path(args.plain_dir) if args.plain_dir else work
    refs.mkdir(parents=True, exist_ok=True)
    spec = work / f"job-{run}.toml"
    spec.write_text(
        _spec_text(
            args.shadows, args.replication, 7000 + run, _free_port() if args.controller else None
        ),
        encoding="utf-8",
    )
    logs = work / f"run-{run}"
    logs.mkdir(exist_ok=True)
    shadows: list[subprocess.Popen[bytes] | None] = [
        _shadow(spec, k, logs / f"shadow{k}.log") for k in range(args.shadows)
    ]
    ctl = _controller(spec, logs / "controller.log") if args.controller else None
    trainer: subprocess.Popen[bytes] | None = None
    orphans: list[int] = []  # workers of a killed torchrun
    report: dict[str, Any] = {"run": run, "steps": args.steps, "replication": args.replication}
    stranger = _Stranger() if args.attack else None
    try:
        deadline = time.monotonic() + 30
        while any(s is None for s in _statuses(spec)):
            if time.monotonic() > deadline:
                raise SystemExit("shadows did not come up")
            time.sleep(0.1)
        final = work / f"mirror-{run}.pt"
        tlog = logs / "trainer.log"
        t0 = time.monotonic()
        trainer = _torchrun(
            "train_mirror.py",
            ["--spec", str(spec), "--steps", str(args.steps), "--out", str(final)],
            tlog,
            max_restarts=args.kill_rank,
        )
        max_lag = 0
        rank_kills_left = args.kill_rank
        rank_kill_at = -1
        hogs: list[subprocess.Popen[bytes]] | None = None
        last_moved: dict[int, tuple[int, float]] = {}
        stuck_dumps: dict[int, Any] = {}
        import random

        rng = random.Random(args.seed + run)
        kills_left = args.kill_job
        # with a shadow fault as well, the whole-job kills come after it settled (a restore
        # right after a re-seed)
        shadow_fault = args.stop_shadow is not None or args.kill_shadow is not None
        kill_at = rng.randrange(20, 200) if kills_left and not shadow_fault else -1

        def trainer_step(log: Path) -> int:
            return _last_step(log)

        fault_done = args.stop_shadow is None and args.kill_shadow is None and not args.fence
        fault_at: float | None = None
        settled_retx: dict[str, int] | None = None
        settled_chunks: dict[str, int] = {}
        victim = args.stop_shadow if args.stop_shadow is not None else args.kill_shadow
        victim_nacks: tuple[int | None, float] = (None, time.monotonic())
        first_at: float | None = None
        while trainer.poll() is None or _alive(orphans):
            time.sleep(0.2)
            _WORKERS.update(_descendants(trainer.pid))
            step = _last_step(tlog)
            sts = _statuses(spec)
            if step >= 20:
                for s in sts:
                    if s is not None and s.get("last_applied") is not None:
                        max_lag = max(max_lag, step - int(s["last_applied"]))
            now = time.monotonic() - t0
            if step >= 0 and first_at is None:
                first_at = now
            # --at counts from the trainers' first iteration, not from their start (which
            # takes seconds on a busy machine): the fault always hits a running job
            running_s = -1.0 if first_at is None else now - first_at
            if kills_left and kill_at >= 0 and trainer_step(tlog) >= kill_at:
                kills_left -= 1
                # what every shadow had applied just before the kill: the restore point may
                # never be older (that would lose what they held); a job whose shadows lagged
                # (a CPU-starved machine) may repeat more than the one iteration in flight
                held = [None if s is None else s.get("last_applied") for s in _statuses(spec)]
                last = trainer_step(tlog)
                wall = time.time()
                _reap(trainer)
                if args.down:
                    time.sleep(args.down)  # the job stays dead, as when rerun by hand
                k = len(report.setdefault("job_kills", []))
                tlog = logs / f"trainer-{k + 1}.log"
                trainer = _torchrun(
                    "train_mirror.py",
                    ["--spec", str(spec), "--steps", str(args.steps), "--out", str(final)],
                    tlog,
                )
                report["job_kills"].append(
                    {
                        "last_logged": last,
                        "log": tlog.name,
                        "wall": wall,
                        "shadows_held": None
                        if None in held or not held
                        else min(int(h) for h in held),
                    }
                )
                kill_at = -1
                continue
            if rank_kills_left and rank_kill_at < 0 and step >= 0:
                rank_kill_at = step + rng.randrange(20, 150)
            if rank_kills_left and 0 <= rank_kill_at <= step:
                # one worker SIGKILLed at a random moment (mid all-reduce, mid COMMIT, ...):
                # torchrun --max-restarts restarts the group, attach() restores
                rank = rng.randrange(2)
                w = _worker_of_rank(trainer.pid, rank)
                if w is not None:
                    time.sleep(rng.random() * 0.05)
                    last = _last_step(tlog)
                    wall = time.time()
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w, signal.SIGKILL)
                    rank_kills_left -= 1
                    report.setdefault("rank_kills", []).append(
                        {
                            "rank": rank,
                            "last_logged": last,
                            "wall": wall,
                            "offset": len(tlog.read_bytes()),
                        }
                    )
                    rank_kill_at = -1
            if kills_left and kill_at < 0 and (not shadow_fault or settled_retx is not None):
                first = _first_step(tlog)
                if first >= 0:
                    kill_at = first + rng.randrange(5, 120)
            if args.hog and hogs is None and running_s >= args.at:
                spin = "import time\nt = time.monotonic() + %f\nwhile time.monotonic() < t: pass"
                hogs = [
                    subprocess.Popen([sys.executable, "-c", spin % args.hog])
                    for _ in range(os.cpu_count() or 2)
                ]
                _STARTED.extend(hogs)
                report["hog"] = {"at_step": step, "seconds": args.hog, "processes": len(hogs)}
            for k, st in enumerate(sts):
                if st is None or st.get("last_applied") is None or args.kill_job:
                    continue
                la = int(st["last_applied"])
                if la != last_moved.get(k, (None, 0.0))[0]:
                    last_moved[k] = (la, time.monotonic())
                elif time.monotonic() - last_moved[k][1] > 3 and k not in stuck_dumps:
                    with contextlib.suppress(Exception):
                        from shadowgrad.config import load_spec
                        from shadowgrad.shadow.control import ShadowClient

                        ep = load_spec(spec).shadows.control_endpoint(k)
                        with ShadowClient(f"tcp://{ep}", TOKEN, timeout_s=2.0) as c:
                            dump = dict(c.status(timeline=4).raw)
                            stuck_dumps[k] = {"step": step, "status": dump}
            if stranger is not None and "attack" not in report and step >= 20:
                report["attack"] = stranger.attack(spec, step)
            if args.fence and not fault_done and running_s >= args.at:
                fault_done = True
                report["fault"] = _fence(
                    spec, trainer, logs, step=step, steps=args.steps, out=final
                )
                orphans = report["fault"]["workers"]
                continue
            if not fault_done and running_s >= args.at:
                fault_done = True
                fault_at = now
                p = shadows[victim]
                assert p is not None
                if args.stop_shadow is not None:
                    os.killpg(p.pid, signal.SIGSTOP)
                    report["fault"] = {"kind": "sigstop", "shadow": victim, "at_step": step}
                    time.sleep(args.for_s)
                    os.killpg(p.pid, signal.SIGCONT)
                    report["fault"]["resumed_at_step"] = _last_step(tlog)
                else:
                    _reap(p)
                    report["fault"] = {"kind": "sigkill", "shadow": victim, "at_step": step}
                    time.sleep(args.for_s)
                    shadows[victim] = _shadow(spec, victim, logs / f"shadow{victim}.log")
                    report["fault"]["restarted_at_step"] = _last_step(tlog)
            if fault_at is not None and settled_retx is None and victim is not None:
                # settled: --settle s after the fault ended, the victim caught up (within
                # SETTLED_LAG iterations) and no NACK of its for a second: its repair is over
                v = sts[victim] if victim < len(sts) else None
                nacks = None if v is None else int(v["events"].get("nack_sent", 0))
                if nacks != victim_nacks[0]:
                    victim_nacks = (nacks, time.monotonic())
                if (
                    v is not None
                    and v.get("last_applied") is not None
                    and time.monotonic() - t0 > fault_at + args.for_s + args.settle
                    and step - int(v["last_applied"]) <= SETTLED_LAG
                    and time.monotonic() - victim_nacks[1] >= 1.0
                ):
                    settled_retx = _retx(sts)
                    settled_chunks = _chunks(sts)
                    report["settled_at_step"] = step
                    report["settled_s_after_fault"] = round(
                        time.monotonic() - t0 - fault_at - args.for_s, 1
                    )
            if time.monotonic() - t0 > args.timeout:
                raise SystemExit("trainer timed out")
        if args.fence:  # the old workers finished the job; torchrun itself was killed
            trainer.returncode = 0 if _last_step(tlog) == args.steps - 1 else 1
            f = report["fault"]
            if not f["old_instance_alive"]:
                f["inconclusive"] = (
                    "the old instance ended before the rerun did: run the "
                    "fence case with more --steps"
                )
                report.setdefault("fence_failures", []).append(f)
            elif not (
                f["rerun_rc"] != 0
                and f["generation_unchanged"]
                and not f["rewound"]
                and "held by pid" in f["message"]
            ):
                report.setdefault("fence_failures", []).append(f)
        text_all = tlog.read_text(errors="replace")
        for kr in report.get("rank_kills", []):
            after = text_all.encode()[kr.pop("offset") :].decode(errors="replace")
            # the lowest step logged soon after the kill: where the restarted group resumed
            firsts = [int(x) for x in re.findall(r"step (\d+) loss", after)]
            kr["resumed_at"] = min(firsts[:50]) if firsts else None
            if kr["resumed_at"] is not None:
                kr["repeated"] = kr["last_logged"] - kr["resumed_at"] + 1
        if ctl is not None:
            clog = logs / "controller.log"
            time.sleep(1.0)
            failed = _events(clog, "controller.trainer_failed")
            report["controller"] = {
                "trainer_failed": len(failed),
                "restore_points": [
                    e.get("istar") for e in _events(clog, "controller.restore_point")
                ],
                "recovered": len(_events(clog, "controller.recovered")),
                "job_finished": len(_events(clog, "controller.job_finished")),
                "shadow_failed": len(_events(clog, "controller.shadow_failed")),
                "shadow_rejoined": len(_events(clog, "controller.shadow_rejoined")),
                # (shadow, evidence) of every shadow_failed, and the shadows that rejoined
                "shadow_failures": [
                    [e.get("shadow"), e.get("evidence")]
                    for e in _events(clog, "controller.shadow_failed")
                ],
                "rejoined_shadows": [
                    e.get("shadow") for e in _events(clog, "controller.shadow_rejoined")
                ],
                "evidence": [e.get("evidence") for e in failed],
                # SIGKILL -> the controller's event (a restart request counts: torchrun restarts
                # the group faster than failure_detect)
                "detect_s": [
                    round(float(e["ts"]) - kr["wall"], 3)
                    for kr, e in zip(
                        report.get("rank_kills", []) or report.get("job_kills", []),
                        failed,
                        strict=False,
                    )
                    if "wall" in kr
                ],
            }
        for kr in report.get("job_kills", []):
            kr["resumed_at"] = _first_step(logs / kr["log"])
            kr["repeated"] = kr["last_logged"] - kr["resumed_at"] + 1
            h = kr["shadows_held"]
            # the shadows' lag at the kill (iterations the trainers had logged beyond what every
            # shadow had applied), and whether the restore went back beyond what they held
            kr["lag_at_kill"] = None if h is None else kr["last_logged"] - h
            kr["lost_held"] = h is not None and kr["resumed_at"] - 1 < h
        if report.get("job_kills"):
            reps = [k["repeated"] for k in report["job_kills"]]
            report["repeated_iterations"] = {str(v): reps.count(v) for v in sorted(set(reps))}
        if stuck_dumps:
            report["stuck"] = stuck_dumps
        for h in hogs or []:
            _reap(h)
        report["trainer_rc"] = trainer.returncode
        report["seconds"] = round(time.monotonic() - t0, 1)
        report["iterations_per_s"] = round(args.steps / report["seconds"], 1)
        sts = _statuses(spec)
        report["max_lag"] = max_lag
        report["shadows"] = [
            None
            if s is None
            else {
                "last_applied": s["last_applied"],
                "diverged_at": s["diverged_at"],
                "generation": s.get("generation"),
                "nack_sent": s["events"].get("nack_sent", 0),
                "repaired_bytes": s["events"].get("repaired_bytes", 0),
                "diverged": s["events"].get("diverged", 0),
                "reseeds": s["events"].get("seeded", 0)
                + s["events"].get("resynced", 0)
                + s["events"].get("cloned", 0),
                "events": s["events"],
                "rx": s["counters"],
            }
            for s in sts
        ]
        end_retx = _retx(sts)
        if settled_retx is not None:
            report["retx_after_settle"] = {k: end_retx[k] - settled_retx[k] for k in end_retx}
            end_chunks = _chunks(sts)
            report["chunks_after_settle"] = {
                k: end_chunks[k] - settled_chunks[k] for k in end_chunks
            }
        elif fault_at is not None:
            report["settled"] = False
        text = tlog.read_text(errors="replace")
        report["degraded_lines"] = text.count("trainer.mirror.degraded")
        m = re.findall(r"\"retx_chunks\": (\d+)", text)
        report["trainer_retx_chunks"] = [int(x) for x in m]
        fails = []
        if trainer.returncode != 0 and final.exists() and _last_step(tlog) == args.steps - 1:
            # every step ran and the state was saved; the exit code comes from the teardown
            # (seen: gloo's destroy_process_group aborting with "terminate called without an
            # active exception", in train_plain.py too): reported, not a checkpoint failure
            report["teardown_exit"] = trainer.returncode
        elif trainer.returncode != 0:
            fails.append(f"trainer exit {trainer.returncode}")
        if report.get("fence_failures"):
            fails.append(f"fencing: {report['fence_failures']}")
        for k, s in enumerate(sts):
            if s is None or s["last_applied"] != args.steps - 1:
                fails.append(f"shadow {k} at {None if s is None else s['last_applied']}")
            elif s["diverged_at"] is not None:
                fails.append(f"shadow {k} diverged at {s['diverged_at']}")
            elif (
                args.stop_shadow is None
                and args.kill_shadow is None
                and s["events"].get("diverged", 0)
            ):
                fails.append(f"shadow {k} diverged during the run")
        c = report.get("controller")
        kills = len(report.get("job_kills", [])) + len(report.get("rank_kills", []))
        if c is not None and not args.fence:
            # one detection and one recovery per kill, none for the normal end of the job
            if c["trainer_failed"] != kills or c["recovered"] != kills:
                fails.append(
                    f"controller: {c['trainer_failed']} failures detected, "
                    f"{c['recovered']} recoveries for {kills} kills"
                )
            if trainer.returncode == 0 and c["job_finished"] != 1:
                fails.append(f"controller: job_finished seen {c['job_finished']} times")
        # once the fault's repair is over, retransmissions are the repair of an odd datagram a
        # loaded machine dropped, not a repair that never ends (that is what this catches)
        for k, n in (report.get("retx_after_settle") or {}).items():
            total = report["chunks_after_settle"][k]
            if n > RETX_AFTER_SETTLE * max(total, 1):
                fails.append(
                    f"shadow {k}: {n} retransmissions of {total} chunks after "
                    f"settling (over {RETX_AFTER_SETTLE:.0%})"
                )
        if trainer.returncode == 0 and not fails:
            import torch

            mine = torch.load(final, weights_only=True)
            ref = torch.load(_plain(refs, args.steps), weights_only=True)
            bad = _compare(mine, ref)
            if bad:
                fails.append(f"final state differs from train_plain.py: {bad[:5]}")
            ref_loss = _losses((refs / f"plain-{args.steps}.log").read_text(errors="replace"))
            for log in sorted(logs.glob("trainer*.log")):
                diff = [
                    st
                    for st, v in _losses(log.read_text(errors="replace")).items()
                    if ref_loss.get(st) != v
                ]
                if diff:
                    fails.append(f"{log.name}: losses differ from train_plain.py at {diff[:5]}")
            bad = _shadow_state_matches(spec, ref, args.steps)
            if bad:
                fails.append(f"shadow state differs from train_plain.py: {bad[:5]}")
        if stranger is not None:
            a = report.setdefault("attack", {})
            time.sleep(0.5)
            a["stranger_received_bytes"] = stranger.received()
            if a["stranger_received_bytes"]:
                fails.append(f"the stranger received {a['stranger_received_bytes']} bytes")
            counted = {
                r: sum((s or {}).get("counters", {}).get(f"wire.{r}", 0) for s in sts)
                for r in ("unauthenticated", "bad_mac")
            }
            a["shadows_counted"] = counted
            sent = a.get("sent", {})
            want = sent.get("commit", 0) + sent.get("commit_spoofed", 0)
            if not sent:
                fails.append("the attack did not run")
            elif sum(counted.values()) < want:
                fails.append(f"shadows counted {counted} of {want} forged COMMITs")
        report["ok"] = not fails
        report["failures"] = fails
        return report
    finally:
        if stranger is not None:
            stranger.close()
        _reap(trainer, extra=orphans)
        _reap(ctl, signal.SIGTERM)
        for p in shadows:
            _reap(p, signal.SIGTERM)


class _Stranger:
    """Someone on the data network without the token (--attack, docs/security.md): forges
    COMMITs for the next 20 iterations (100x the learning rates) to every shadow and NACKs for
    a recent iteration to every trainer, from its own socket and — as root — with the source
    address of a trainer / a shadow (a raw socket). It must receive nothing back."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.raw = None
        if os.geteuid() == 0:
            with contextlib.suppress(OSError):
                self.raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        self.sent: dict[str, int] = {}

    def _spoof(self, data: bytes, src: tuple[str, int], dst: tuple[str, int]) -> None:
        import ipaddress
        import struct

        from shadowgrad.frames import csum16

        udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(data), 0) + data
        sip = ipaddress.IPv4Address(src[0]).packed
        dip = ipaddress.IPv4Address(dst[0]).packed
        ip0 = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0, sip, dip)
        ip = ip0[:10] + csum16(ip0).to_bytes(2, "big") + ip0[12:]
        assert self.raw is not None
        self.raw.sendto(ip + udp, (dst[0], 0))

    def attack(self, spec_path: Path, step: int) -> dict[str, Any]:
        import secrets

        from shadowgrad import wire
        from shadowgrad.config import load_spec
        from shadowgrad.layout import Layout
        from shadowgrad.shadow.control import ShadowClient

        spec = load_spec(spec_path)
        # what any datagram shows: job id and the header's layout field
        with ShadowClient(f"tcp://{spec.shadows.control_endpoint(0)}", TOKEN, timeout_s=5.0) as c:
            cfg = c.config()
            st = c.status(timeline=0)
        digest = wire.session_digest(Layout.from_json(cfg.layout).digest64, st.generation)
        wrong = wire.mac_key(secrets.token_hex(16), spec.job.id)
        shadows = [(a.host, a.port) for a in spec.shadows.addresses]
        trainers = [(a.host, a.port) for a in spec.trainers.addresses]
        forged = wire.CommitRecord(lrs=(0.3, 0.3), clip_coef=None, loss_scale=2.0**126)

        def header(it: int, key: bytes | None) -> dict[str, Any]:
            """A trainer's header fields for iteration ``it``, any seq, sealed with ``key``."""
            return {
                "job": spec.job.id,
                "sender": 0,
                "iteration": it,
                "seq": secrets.randbelow(2**32),
                "layout": digest,
                "key": key,
            }

        def commit(it: int, key: bytes | None) -> bytes:
            return forged.encode(**header(it, key))

        def nack(it: int, key: bytes | None) -> bytes:
            body = wire.NackRecord.of([(0, 0, 1 << 20)]).body()
            return wire.encode(wire.Kind.NACK, payload=body, **header(it, key))

        def count(what: str, n: int = 1) -> None:
            self.sent[what] = self.sent.get(what, 0) + n

        for it in range(step + 1, step + 21):
            for key in (None, wrong):
                data = commit(it, key)
                for addr in shadows:
                    self.sock.sendto(data, addr)
                    count("commit")
                    if self.raw is not None:
                        self._spoof(data, trainers[0], addr)
                        count("commit_spoofed")
        for key in (None, wrong):
            data = nack(max(0, step - 1), key)
            for addr in trainers:
                self.sock.sendto(data, addr)
                count("nack")
                if self.raw is not None:
                    self._spoof(data, shadows[0], addr)
                    count("nack_spoofed")
        return {"at_step": step, "sent": dict(self.sent)}

    def received(self) -> int:
        n = 0
        while True:
            try:
                n += len(self.sock.recv(65536))
            except (BlockingIOError, InterruptedError):
                return n

    def close(self) -> None:
        self.sock.close()
        if self.raw is not None:
            self.raw.close()


def _fence(
    spec: Path, trainer: subprocess.Popen[bytes], logs: Path, *, step: int, steps: int, out: Path
) -> dict[str, Any]:
    """SIGKILL the torchrun agent only (its workers live on, holding the trainer ports), rerun
    the same command at once: it must fail fast, naming the live instance, and leave the
    shadows' generation and progress alone."""
    before = _statuses(spec)
    workers = _descendants(trainer.pid)
    os.kill(trainer.pid, signal.SIGKILL)
    # the old workers are paused (SIGSTOP) while the rerun starts: on a loaded 2-core machine
    # the rerun needs ~25 s to import torch and rendezvous before it binds, and an old job that
    # finished by then would free its ports (the rerun would rightly take over, and the case
    # would prove nothing). A paused instance still holds its ports: the fence must still hold.
    for w in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(w, signal.SIGSTOP)
    t0 = time.monotonic()
    rerun = _torchrun(
        "train_mirror.py",
        ["--spec", str(spec), "--steps", str(steps), "--out", str(out)],
        logs / "rerun.log",
    )
    try:
        rc = rerun.wait(120)
    finally:
        _reap(rerun)
        took = time.monotonic() - t0
        # conclusive only if the old instance was still there when the rerun ended
        old_alive = bool(workers) and all(_alive([w]) for w in workers)
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGCONT)
    after = _statuses(spec)
    text = (logs / "rerun.log").read_text(errors="replace")
    msg = next((ln for ln in text.splitlines() if "cannot bind its trainer address" in ln), "")
    gens = [
        (b or {}).get("generation") == (a or {}).get("generation")
        for b, a in zip(before, after, strict=True)
    ]
    back = [
        int((a or {}).get("last_applied") or -1) < int((b or {}).get("last_applied") or -1)
        for b, a in zip(before, after, strict=True)
    ]
    return {
        "kind": "fence",
        "workers": workers,
        "at_step": step,
        "rerun_rc": rc,
        "rerun_seconds": round(took, 1),
        "old_instance_alive": old_alive,
        "message": msg.strip()[-300:],
        "generation_unchanged": all(gens),
        "rewound": any(back),
    }


def _retx(sts: list[dict[str, Any] | None]) -> dict[str, int]:
    return {
        str(k): 0 if s is None else int(s["counters"].get("retx", 0)) for k, s in enumerate(sts)
    }


def _chunks(sts: list[dict[str, Any] | None]) -> dict[str, int]:
    """Chunks that brought new bytes (first sends and retransmissions) per shadow."""
    return {
        str(k): 0
        if s is None
        else int(s["counters"].get("retx", 0)) + int(s["counters"].get("data", 0))
        for k, s in enumerate(sts)
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--shadows", type=int, default=3)
    ap.add_argument("--replication", type=int, default=1, help="must divide --shadows")
    ap.add_argument("--stop-shadow", type=int, default=None, help="SIGSTOP this shadow")
    ap.add_argument("--kill-shadow", type=int, default=None, help="SIGKILL + restart it")
    ap.add_argument(
        "--kill-job",
        type=int,
        default=0,
        metavar="N",
        help="SIGKILL the whole job (torchrun and workers) N times at random "
        "moments, rerunning the same command each time",
    )
    ap.add_argument(
        "--kill-rank",
        type=int,
        default=0,
        metavar="N",
        help="SIGKILL one random worker N times at random moments; torchrun "
        "--max-restarts N restarts the group",
    )
    ap.add_argument(
        "--controller",
        action="store_true",
        help="run 'shadowgrad controller' for the job ([controller] address in the "
        "spec): the trainers take I* from it; its events are reported",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--fence",
        action="store_true",
        help="SIGKILL torchrun (workers live on) and rerun it at once",
    )
    ap.add_argument(
        "--at",
        type=float,
        default=10.0,
        help="fault this many seconds after the trainers' first iteration",
    )
    ap.add_argument(
        "--down",
        type=float,
        default=0.0,
        help="--kill-job: seconds the job stays dead before the rerun (default 0)",
    )
    ap.add_argument(
        "--for", dest="for_s", type=float, default=3.0, help="stopped for / restarted after (s)"
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=5.0,
        help="at least this long after the fault (and once the victim caught up "
        "and stopped NACKing), retransmissions are counted (s)",
    )
    ap.add_argument(
        "--shadow-threads", type=int, default=None, help="pass --threads to every shadowgrad shadow"
    )
    ap.add_argument(
        "--hog",
        type=float,
        default=0.0,
        metavar="S",
        help="at --at, keep every core busy for S seconds (CPU contention)",
    )
    ap.add_argument(
        "--attack",
        action="store_true",
        help="a stranger without the token forges COMMITs and NACKs at step 20 "
        "(spoofed sources too as root); it must change and receive nothing",
    )
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--work", default=None, help="work directory (default: a temp dir)")
    ap.add_argument(
        "--plain-dir",
        default=None,
        help="where train_plain.py's references are kept, one per step count, for soaks to "
        "share (default: the work directory)",
    )
    ap.add_argument("--json", default=None, help="write the reports here")
    args = ap.parse_args()
    if args.shadow_threads is not None:
        SHADOW_ARGS[:] = ["--threads", str(args.shadow_threads)]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="sg-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    reports = []
    for run in range(args.runs):
        rep = soak(args, work, run)
        reports.append(rep)
        print(json.dumps(rep), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1), encoding="utf-8")
    return 0 if all(r["ok"] for r in reports) else 1


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupted)
    rc = 130
    try:
        rc = main()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # reaping is not interrupted again
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _reap_all()
    sys.exit(rc)
