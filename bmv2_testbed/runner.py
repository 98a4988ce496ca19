"""The scenario runner behind ``shadowgrad demo`` (docs/testbed.md).

One run starts, for the scenario's job, the ToR switch (``sg-switch-grpc`` running
``p4/shadowgrad.p4``, programmed by the controller's driver), one ``shadowgrad shadow`` process
per shadow, ``shadowgrad controller`` and the trainer ranks (:mod:`.demo_worker`), on a
topology (:mod:`.topology`: network namespaces as root, loopback ports for any user). It
injects the scenario's faults when rank 0 has logged their iteration, samples the job through
the controller's status file, and always tears everything down — processes, veths, namespaces
— also on Ctrl-C, SIGTERM or an error of its own.

A demo is three runs of the same job: an uninterrupted **reference** with shadowgrad, the same
job **plain** (plain gloo DDP, no shadowgrad: the baseline of the trainer overhead), both cached
under the cache directory, keyed by everything they depend on, and the **faulted** run; the
report compares the faulted run's final parameters and optimizer state with the reference's bit
for bit, and the reference's step time with the plain run's (:mod:`.report`).

A run reads only what it wrote: :func:`prepare_out` clears the output folder of a previous
run's artefacts first (the cache kept), and refuses a non-empty folder that is not a demo's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shadowgrad.errors import ShadowgradError
from shadowgrad.freeports import free_port
from shadowgrad.wire import chunk_for

from .progress import Progress
from .report import DETECT_SLACK_S
from .scenario import Fault, Scenario
from .topology import HOSTED, MTU, Namespaces, choose

if TYPE_CHECKING:
    from .p4_mininet import MininetNet

__all__ = ["OUT_MARKER", "Runner", "choose_target", "prepare_out", "run_scenario"]

log = logging.getLogger(__name__)

#: the ring's DATA payload on the namespaces' veths: the largest whose datagram, MAC'd, fits one
#: IPv4 packet of their MTU (a fragmented FINAL chunk is never copied to the shadows)
NETNS_CHUNK = chunk_for(MTU - 28, mac=True)
_STEP = re.compile(r"^step (\d+) loss (\S+) dt (\S+) wall (\S+)$", re.M)
_START = re.compile(r"^start (\d+) (\d)$", re.M)


def choose_target(requested: str = "auto") -> str:
    """``sim``: the project's P4 target (always available). ``bmv2``: real p4c +
    simple_switch_grpc, which the demo runner does not drive yet."""
    have = shutil.which("p4c") is not None and shutil.which("simple_switch_grpc") is not None
    if requested == "bmv2":
        if not have:
            raise ShadowgradError(
                "--target bmv2: p4c and simple_switch_grpc are not on PATH "
                "(use --target sim, the project's P4 target)"
            )
        raise ShadowgradError(
            "--target bmv2: the demo runner drives the project's P4 target "
            "only so far (the dataplane tests run on real bmv2)"
        )
    if requested not in ("auto", "sim"):
        raise ShadowgradError(f"--target {requested!r}: expected auto, sim or bmv2")
    return "sim"


#: the file that marks a folder as a demo's output (written by :func:`prepare_out`)
OUT_MARKER = ".shadowgrad-demo"
#: what a demo writes into its output folder, besides the marker and the cache
_OUT_FILES = (
    "topology.json",
    "report.json",
    "loss.png",
    "step_time.png",
    "lag.png",
    "recovery.png",
)
_OUT_DIRS = ("reference", "plain", "run")
#: a cache inside the output folder (``OUT/.cache/shadowgrad``, the default): never cleared
_OUT_CACHE = ".cache"


def _artefact(name: str) -> bool:
    """Whether ``name`` (an entry of the output folder) is something a demo writes there."""
    if name in _OUT_FILES or name in _OUT_DIRS or name == OUT_MARKER:
        return True
    # report.py's temporary files (``.report.json.<pid>.<hex>.tmp``), left by a killed run
    return name.endswith(".tmp") and any(name.startswith(f".{f}.") for f in _OUT_FILES)


def prepare_out(out: Path, cache_dir: Path | None = None) -> list[str]:
    """Make ``out`` ready for a new demo run: create it, or clear what a previous run left in
    it, so the run reads only what it writes. Returns the names removed.

    Kept: the cache (``out/.cache``, and the top entry of ``out`` that holds ``cache_dir``),
    and, in a folder marked as a demo's (:data:`OUT_MARKER`), anything a demo does not write.
    Refused (:class:`ShadowgradError`, nothing deleted): ``out`` is not a directory, ``out`` is
    the cache itself, or ``out`` is not empty and does not look like a demo's output folder
    (no marker, and entries a demo does not write, or none of its reports)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ShadowgradError(f"--out {out}: exists and is not a directory")
    keep = {_OUT_CACHE}
    if cache_dir is not None:
        try:
            rel = Path(cache_dir).resolve().relative_to(out.resolve())
        except ValueError:
            rel = None
        if rel is not None:
            if not rel.parts:
                raise ShadowgradError(
                    f"--out {out} is the reference cache itself (--cache {cache_dir}): "
                    "give the demo its own output folder"
                )
            keep.add(rel.parts[0])
    out.mkdir(parents=True, exist_ok=True)
    entries = sorted((e for e in out.iterdir() if e.name not in keep), key=lambda e: e.name)
    marked = (out / OUT_MARKER).exists()
    if entries and not marked:
        foreign = [e.name for e in entries if not _artefact(e.name)]
        reports = [e.name for e in entries if e.name in ("topology.json", "report.json")]
        if foreign or not reports:
            shown = ", ".join((foreign or [e.name for e in entries])[:6])
            more = len(foreign or entries) - 6
            raise ShadowgradError(
                f"--out {out}: the folder is not empty and is not a demo's output folder "
                f"(no {OUT_MARKER} file; "
                + (f"it holds {shown}" + (f" and {more} more" if more > 0 else ""))
                + (
                    ", which a demo does not write"
                    if foreign
                    else "; no topology.json or report.json"
                )
                + "): nothing was deleted. Give --out a new or empty folder, or one a demo wrote"
            )
    removed = []
    for e in entries:
        if not _artefact(e.name) or e.name == OUT_MARKER:
            continue  # a marked folder's other contents are not the demo's to delete
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()
        removed.append(e.name)
    (out / OUT_MARKER).write_text(
        "This folder is a shadowgrad demo's output: every run into it clears what the previous "
        "run wrote here (the cache in .cache/ is kept).\n"
    )
    return removed


class _Proc:
    """A child process in its own session (killed as a group), with its log file."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: dict[str, str], cwd: Path
    ) -> None:
        self.name, self.argv, self.log, self.env, self.cwd = name, argv, log_path, env, cwd
        with log_path.open("ab") as f:
            self.p = subprocess.Popen(
                argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.p.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(10)

    def stop(self, grace_s: float = 5.0) -> None:
        if self.p.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.p.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self.signal(signal.SIGKILL)  # anything the process left in its group

    def restart(self) -> _Proc:
        return _Proc(self.name, self.argv, self.log, self.env, self.cwd)


class Runner:
    """One scenario on one topology. ``work``: where logs, specs and the report go."""

    def __init__(
        self,
        scenario: Scenario,
        work: Path,
        *,
        topology: str = "auto",
        target: str = "auto",
        cache_dir: Path | None = None,
        progress: bool = False,
        timeout_s: float = 900.0,
        cli: bool = False,
    ) -> None:
        self.sc = scenario
        self.work = work
        self.topology = choose(topology)
        self.target = choose_target(target)
        if self.sc.mode == "mirror" and self.topology in HOSTED:
            # mirror mode does not use the switch: its trainers send to the shadows directly
            self.topology = "loopback"
        self.cache_dir = cache_dir or Path(
            os.environ.get(
                "SHADOWGRAD_CACHE",
                Path(os.environ.get("XDG_CACHE_HOME", work / ".cache")) / "shadowgrad",
            )
        )
        # a run reads only what it wrote: the previous run's logs, events and report go first
        self.cleared = prepare_out(work, self.cache_dir)
        self.progress: Progress | None = Progress() if progress else None
        if cli and self.topology != "mininet":
            raise ShadowgradError(
                f"--cli opens Mininet's CLI: it needs --topology mininet (this run: "
                f"{self.topology})"
            )
        self.cli = cli
        self.timeout_s = timeout_s
        self._procs: list[_Proc] = []
        self._net: Namespaces | MininetNet | None = None
        self._switch: Any = None
        self.chunk = NETNS_CHUNK if self.hosted else None
        self.run_id = secrets.token_hex(8)
        self.label = os.environ.get("SHADOWGRAD_DEMO_TOPOLOGY_LABEL", self.topology)
        work.mkdir(parents=True, exist_ok=True)
        (work / "topology.json").write_text(
            json.dumps(
                {
                    "topology": self.topology,
                    "label": self.label,
                    "run_id": self.run_id,
                    "tag": self.run_id[:4],
                    "target": self.target,
                    "pid": os.getpid(),
                }
            )
        )

    # ---------------------------------------------------------------- the job

    def _spec_doc(self) -> dict[str, Any]:
        from shadowgrad.specs import loopback_spec, switch_spec

        sc = self.sc
        t = {
            "gap_repair": "30ms",
            "heartbeat": "100ms",
            "failure_detect": "2s",
            "rpc": "5s",
            "connect": "20s",
        }
        if self.hosted:
            world, shadows = sc.trainers, sc.shadows
            doc: dict[str, Any] = {
                "job": {"id": 5000 + secrets.randbelow(1000), "name": sc.name, "mode": "in-band"},
                "trainers": {
                    "world_size": world,
                    "addresses": [f"10.0.0.{i + 1}" for i in range(world)],
                    "backend": "gloo",
                },
                "shadows": {
                    "count": shadows,
                    "replication": sc.replication,
                    "addresses": [f"10.0.1.{i + 1}" for i in range(shadows)],
                    "control_port": 47480,
                },
                "switch": {
                    "target": "p4target",
                    "trainer_ports": list(range(1, world + 1)),
                    "shadow_ports": list(range(world + 1, world + shadows + 1)),
                },
                "controller": {"address": "10.0.0.1:47600"},
            }
        elif sc.mode == "in-band":
            doc = switch_spec(world=sc.trainers, shadows=sc.shadows, replication=sc.replication)
            doc["controller"] = {"address": f"127.0.0.1:{free_port()}"}
        else:
            doc = loopback_spec(world=sc.trainers, shadows=sc.shadows, replication=sc.replication)
            doc["controller"] = {"address": f"127.0.0.1:{free_port()}"}
        doc["job"]["name"] = sc.name
        if sc.mode == "in-band":
            from .inband import PRODUCT_PROGRAM

            doc["switch"]["p4_program"] = str(Path(PRODUCT_PROGRAM).resolve())
        doc["timeouts"] = t
        doc["security"] = {"token_env": "SHADOWGRAD_TOKEN"}
        return doc

    def _layout(self) -> Any:
        from shadowgrad.layout import Layout, from_module

        from .demo_worker import build_model

        params, buckets = from_module(build_model(self.sc.model))
        return Layout.build(params, buckets, self.sc.shadows, self.sc.replication)

    @property
    def hosted(self) -> bool:
        """Whether every trainer and shadow is a host of its own behind the switch's
        interfaces (``netns``, ``mininet``) rather than a loopback address."""
        return self.topology in HOSTED

    def _hosted_switch(
        self,
        spec: Any,
        layout: Any,
        d: Path,
        *,
        loss: dict[int, float] | None = None,
        tap: bool = True,
    ) -> Any:
        """The hosts (namespaces, or Mininet hosts) and the programmed switch between them."""
        from shadowgrad.frames import port_mac

        from .inband import JobSwitch, switch_options

        sw = spec.switch
        hosts = [
            (p, ep.host, port_mac(p))
            for p, ep in [
                *zip(sw.trainer_ports, spec.trainers.addresses, strict=True),
                *zip(sw.shadow_ports, spec.shadows.addresses, strict=True),
            ]
        ]
        if self.topology == "netns":
            self._net = Namespaces(hosts, tag=self.run_id[:4])
            return JobSwitch(spec, layout, loss=loss, interfaces=self._net.switch_if, tap=tap)
        from .p4_mininet import MininetNet

        names = {p: f"trainer{r}" for r, p in enumerate(sw.trainer_ports)}
        names.update({p: f"shadow{k}" for k, p in enumerate(sw.shadow_ports)})
        net = MininetNet(
            hosts,
            names,
            tag=self.run_id[:4],
            switch_args=switch_options(spec, loss=loss),
            cpu_port=sw.cpu_port,
            device_id=sw.device_id,
            log_file=str(d / "switch.log"),
        )
        self._net = net
        return JobSwitch(spec, layout, attached=net.switch, tap=tap)

    def _prefix(self, port: int | None) -> list[str]:
        if self._net is None or port is None:
            return []
        return self._net.exec_prefix(port)

    def _start(
        self, name: str, argv: list[str], port: int | None, d: Path, env: dict[str, str]
    ) -> _Proc:
        p = _Proc(name, [*self._prefix(port), *argv], d / f"{name}.log", env, Path.cwd())
        self._procs.append(p)
        return p

    def _ranks(
        self,
        spec: Any,
        path: Path,
        d: Path,
        env: dict[str, str],
        *,
        attempt: int,
        final: Path | None,
        plain: bool = False,
    ) -> list[_Proc]:
        """The trainer ranks of one attempt; ``plain``: without shadowgrad (plain DDP)."""
        sc = self.sc
        master = "10.0.0.1" if self.hosted else "127.0.0.1"
        # below the kernel's ephemeral range (32768-60999): a rerun's rank 0 once drew 43138,
        # a local port the controller's connections from the same host held (EADDRINUSE, and
        # the other ranks waited on the store); the job's own ports are 474xx-476xx
        port = 20000 + secrets.randbelow(12000) if self.hosted else free_port()
        out = []
        for r in range(sc.trainers):
            e = {
                **env,
                "RANK": str(r),
                "WORLD_SIZE": str(sc.trainers),
                "LOCAL_RANK": str(r),
                "MASTER_ADDR": master,
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
            }
            if self.hosted:
                e["GLOO_SOCKET_IFNAME"] = "eth0"
            argv = [
                sys.executable,
                "-m",
                "shadowgrad.bmv2_testbed.demo_worker",
                *(["--plain"] if plain else ["--spec", str(path)]),
                "--model",
                sc.model,
                "--steps",
                str(sc.iterations),
            ]
            if final is not None:
                argv += ["--out", str(final)]
            if self.chunk is not None and not plain:
                argv += ["--chunk-bytes", str(self.chunk)]
            if sc.sleep_s:
                argv += ["--sleep", str(sc.sleep_s)]
            tport = spec.switch.trainer_ports[r] if self.hosted else None
            out.append(self._start(f"rank{r}-{attempt}", argv, tport, d, e))
        return out

    def execute(self, label: str, faults: tuple[Fault, ...]) -> dict[str, Any]:
        """One run of the job with ``faults``; returns what it observed (see report.py)."""
        from shadowgrad.config import parse_spec
        from shadowgrad.specs import spec_toml

        sc = self.sc
        d = self._fresh_dir(label)
        doc = self._spec_doc()
        spec = parse_spec(doc, env={})
        layout = self._layout()
        (d / "layout.json").write_text(layout.to_json())
        token = secrets.token_hex(16)
        # every process of this run (the switch included) carries the marker: a test or an
        # operator can find anything left behind (there must be nothing)
        os.environ["SHADOWGRAD_DEMO_RUN"] = self.run_id
        env = {**os.environ, "SHADOWGRAD_TOKEN": token, "PYTHONUNBUFFERED": "1"}
        env.pop("OMP_NUM_THREADS", None)
        final = d / "final.pt"
        final.unlink(missing_ok=True)
        obs: dict[str, Any] = {
            "label": label,
            "steps": [],
            "samples": [],
            "faults": [],
            "starts": [],
            "failure_detect_s": spec.timeouts.failure_detect_s,
        }
        t_begin = time.time()
        try:
            if sc.mode == "in-band":
                from .inband import JobSwitch

                loss = {
                    spec.switch.shadow_ports[f.target]: f.percent / 100
                    for f in faults
                    if f.kind == "loss" and f.target is not None
                }
                if self.hosted:
                    self._switch = self._hosted_switch(spec, layout, d, loss=loss or None)
                else:
                    self._switch = JobSwitch(spec, layout, loss=loss or None)
                    doc.setdefault("switch", {})["grpc_addr"] = self._switch.grpc_addr
            path = d / "job.toml"
            path.write_text(spec_toml(doc))
            cli = str(Path(sys.executable).parent / "shadowgrad")
            shadows: dict[int, _Proc] = {}
            for k in range(sc.shadows):
                port = spec.switch.shadow_ports[k] if self.hosted else None
                shadows[k] = self._start(
                    f"shadow{k}", [cli, "shadow", "--spec", str(path), "--id", str(k)], port, d, env
                )
            status_file = d / "controller-status.json"
            ctl_argv = [
                cli,
                "--log-json",
                "controller",
                "--spec",
                str(path),
                "--status-json",
                str(status_file),
                "--status-interval",
                "0.2",
            ]
            ctl_port: int | None = None
            if self.hosted:
                ctl_argv.append("--no-switch")  # the switch's gRPC is in the root namespace
                ctl_port = spec.switch.trainer_ports[0]
            elif sc.mode == "in-band":
                # above the runner's own client (election id 1): the controller is the primary
                ctl_argv += ["--layout", str(d / "layout.json"), "--election-id", "2"]
            ctl = self._start("controller", ctl_argv, ctl_port, d, env)
            time.sleep(1.0)
            attempt = 0
            ranks = self._ranks(spec, path, d, env, attempt=attempt, final=final)
            live = _LiveFaults(self.progress, d / "controller.log")
            cli_thread: threading.Thread | None = None
            if self.progress is not None:
                self.progress.begin(label, sc.iterations, self._run_note(label, faults))
            pending = [f for f in faults if f.kind != "loss"]
            timers: list[tuple[float, Any]] = []
            read_pos = 0
            rank0_log = ranks[0].log
            last_logged = -1
            open_fault: dict[str, Any] | None = None
            deadline = time.monotonic() + self.timeout_s
            while True:
                now = time.monotonic()
                if now > deadline:
                    raise ShadowgradError(
                        f"{label}: the run did not finish in {self.timeout_s:.0f}s (logs in {d})"
                    )
                # rank 0's output since the last look
                text = rank0_log.read_text(errors="replace") if rank0_log.exists() else ""
                new, read_pos = text[read_pos:], len(text)
                cut = new.rfind("\n") + 1  # complete lines only
                read_pos -= len(new) - cut
                new = new[:cut]
                for m in _START.finditer(new):
                    obs["starts"].append(
                        {
                            "attempt": attempt,
                            "iteration": int(m[1]),
                            "restored": bool(int(m[2])),
                            "wall": time.time(),
                        }
                    )
                    if open_fault is not None and open_fault["resumed_at"] is None:
                        open_fault["resumed_at"] = int(m[1])
                for m in _STEP.finditer(new):
                    it, wall = int(m[1]), float(m[4])
                    obs["steps"].append([wall, it, float(m[3]), m[2], attempt])
                    last_logged = max(last_logged, it) if open_fault is None else it
                    if open_fault is not None and open_fault["t_recovered"] is None:
                        open_fault["t_recovered"] = wall
                        live.resumed(open_fault, it)
                        open_fault = None
                        last_logged = it
                # sample the job through the controller
                with contextlib.suppress(OSError, ValueError):
                    st = json.loads(status_file.read_text())
                    obs["samples"].append(
                        [
                            float(st.get("time") or time.time()),
                            st["trainers"].get("iteration"),
                            st.get("live_istar"),
                            [
                                (st["shadows"].get(str(k)) or {}).get("last_applied")
                                for k in range(sc.shadows)
                            ],
                        ]
                    )
                for when, action in [t for t in timers if t[0] <= now]:
                    timers.remove((when, action))
                    action()
                # faults due
                while (
                    pending
                    and pending[0].at is not None
                    and last_logged >= pending[0].at
                    and open_fault is None
                ):
                    f = pending.pop(0)
                    rec: dict[str, Any] = {
                        "kind": f.kind,
                        "target": f.target,
                        "at_iteration": f.at,
                        "t_inject": time.time(),
                        "t_detect": None,
                        "t_recovered": None,
                        "last_logged": last_logged,
                        "resumed_at": None,
                        "lost_iterations": 0 if f.kind != "kill_trainer" else None,
                        "note": "",
                    }
                    obs["faults"].append(rec)
                    live.injected(rec)
                    if f.kind == "kill_trainer":
                        assert f.target is not None
                        ranks[f.target].kill()
                        for r in ranks:  # the others hang in the all-reduce: a launcher
                            r.kill()  # (torchrun) would take them down too
                        attempt += 1
                        ranks = self._ranks(spec, path, d, env, attempt=attempt, final=final)
                        rank0_log, read_pos = ranks[0].log, 0
                        open_fault = rec
                        rec["note"] = f"rank {f.target} SIGKILLed; the job rerun"
                    elif f.kind in ("kill_shadow", "pause_shadow"):
                        assert f.target is not None
                        k = f.target
                        if f.kind == "kill_shadow":
                            shadows[k].kill()

                            def back(k: int = k) -> None:
                                shadows[k] = shadows[k].restart()
                                self._procs.append(shadows[k])

                            rec["note"] = f"shadow {k} SIGKILLed, restarted after {f.down_s}s"
                        else:
                            shadows[k].signal(signal.SIGSTOP)

                            def back(k: int = k) -> None:
                                shadows[k].signal(signal.SIGCONT)

                            rec["note"] = f"shadow {k} SIGSTOPped for {f.down_s}s"
                        rec["t_back"] = None
                        rec["down_s"] = f.down_s
                        rec["failure_detect_s"] = spec.timeouts.failure_detect_s
                        timers.append((now + f.down_s, back))

                        def mark(rec: dict[str, Any] = rec) -> None:
                            rec["t_back"] = time.time()

                        timers.append((now + f.down_s, mark))
                    elif f.kind == "restart_controller":
                        ctl.kill()
                        ctl = ctl.restart()
                        self._procs.append(ctl)
                        rec["note"] = "shadowgrad controller SIGKILLed and restarted"
                if all(r.p.poll() is not None for r in ranks) and not timers:
                    break
                live.poll(obs)
                if self.progress is not None:
                    self.progress.step(
                        last_logged,
                        obs["samples"][-1][2] if obs["samples"] else None,
                        len(obs["faults"]),
                    )
                if self.cli and label == "run" and cli_thread is None and obs["steps"]:
                    cli_thread = self._open_cli()
                elif cli_thread is not None and not cli_thread.is_alive() and self.progress:
                    self.progress.quiet = False  # the user left the CLI: the live line again
                time.sleep(0.1)
            self._ranks_done(label, ranks)
            time.sleep(0.5)  # the controller's last status and events
            obs["events"] = _events(d / "controller.log")
            obs["final_status"] = self._final_status(path, spec, env)
            # the controller stops first: closing the switch (netns: the controller reaches the
            # shadows through it) and stopping the shadows is the job's teardown, not news
            ctl.stop(grace_s=3.0)
            if self._switch is not None:
                c = self._switch.counters()
                obs["switch"] = {
                    "replicated_packets": sum(int(p) for p, _ in c.get("shadow_copies", [])),
                    "replicated_bytes": sum(int(b) for _, b in c.get("shadow_copies", [])),
                    "drops": {k: int(v[0]) for k, v in (c.get("drops") or {}).items()},
                }
            t_done = time.time()
            if cli_thread is not None:
                self._wait_cli(cli_thread)
            if self._switch is not None:
                self._switch.close()  # its final port counters: the emulated loss
                fc = self._switch.final_counters or {}
                assert obs["switch"] is not None
                obs["switch"]["emulated_loss"] = sum(
                    int((q.get("drops") or {}).get("emulated_loss", 0))
                    for q in (fc.get("queues") or {}).values()
                )
            obs["began"] = t_begin
            obs["seconds"] = t_done - t_begin  # the run, not the time spent in the CLI after it
            obs["final"] = str(final)
            _settle_faults(obs)
            return obs
        finally:
            self._teardown()

    def _ranks_done(self, label: str, ranks: list[_Proc]) -> None:
        """The ranks have exited: end the progress line; any rank that failed is an error
        that carries the tails of the ranks' logs."""
        if self.progress is not None:
            self.progress.end()
        codes = [r.p.returncode for r in ranks]
        if codes != [0] * len(ranks):
            tails = "\n".join(
                f"--- {r.log.name}\n{r.log.read_text(errors='replace')[-2000:]}" for r in ranks
            )
            raise ShadowgradError(f"{label}: trainer exit codes {codes}\n{tails}")

    def _fresh_dir(self, label: str) -> Path:
        """``work/label``, emptied: a run's logs are opened for appending (a restarted process
        goes on in its log), so nothing of an earlier run may be there."""
        d = self.work / label
        if d.is_symlink() or d.is_file():
            d.unlink()
        elif d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def execute_plain(self, label: str = "plain") -> dict[str, Any]:
        """The job without shadowgrad: the same ranks, model, batches, optimizer, clipping and
        schedule as plain gloo DDP (``demo_worker --plain``): no shadows, no controller, no
        tap. On netns the ranks' traffic still crosses the switch (it is their only network),
        programmed with everything but the tap; on loopback gloo talks over the loopback
        directly (the switch's UDP ports only carry shadowgrad's ring). Returns rank 0's steps
        and the run's seconds."""
        from shadowgrad.config import parse_spec

        d = self._fresh_dir(label)
        doc = self._spec_doc()
        spec = parse_spec(doc, env={})
        os.environ["SHADOWGRAD_DEMO_RUN"] = self.run_id
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("OMP_NUM_THREADS", None)
        obs: dict[str, Any] = {"label": label, "steps": [], "faults": [], "samples": []}
        t_begin = time.time()
        try:
            if self.hosted:
                self._switch = self._hosted_switch(spec, self._layout(), d, tap=False)
            ranks = self._ranks(spec, d / "job.toml", d, env, attempt=0, final=None, plain=True)
            deadline = time.monotonic() + self.timeout_s
            last = -1
            if self.progress is not None:
                self.progress.begin(label, self.sc.iterations, "(the same job without shadowgrad)")
            while any(r.p.poll() is None for r in ranks):
                if time.monotonic() > deadline:
                    raise ShadowgradError(
                        f"{label}: the run did not finish in {self.timeout_s:.0f}s (logs in {d})"
                    )
                if self.progress is not None:
                    text = ranks[0].log.read_text(errors="replace")
                    found = [int(m[1]) for m in _STEP.finditer(text)]
                    last = found[-1] if found else last
                    self.progress.step(last)
                time.sleep(0.2)
            self._ranks_done(label, ranks)
            text = ranks[0].log.read_text(errors="replace")
            obs["steps"] = [
                [float(m[4]), int(m[1]), float(m[3]), m[2], 0] for m in _STEP.finditer(text)
            ]
            obs["began"] = t_begin
            obs["seconds"] = time.time() - t_begin
            return obs
        finally:
            self._teardown()

    def _final_status(self, path: Path, spec: Any, env: dict[str, str]) -> dict[str, Any]:
        """``shadowgrad status --json`` from a trainer's host (it reaches every shadow)."""
        cli = str(Path(sys.executable).parent / "shadowgrad")
        port = spec.switch.trainer_ports[0] if self.hosted else None
        try:
            out = subprocess.run(
                [*self._prefix(port), cli, "status", "--spec", str(path), "--json"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
            return dict(json.loads(out.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError, subprocess.TimeoutExpired) as e:
            return {"error": str(e)}

    def _run_note(self, label: str, faults: tuple[Fault, ...]) -> str:
        if label == "reference":
            return "(the reference: with shadowgrad, no faults)"
        kinds = [f.kind for f in faults]
        return f"(the faulted run: {', '.join(kinds) if kinds else 'no faults'})"

    def _open_cli(self) -> threading.Thread:
        """Mininet's CLI on the running job's network, on a thread of its own (the runner goes
        on injecting faults and sampling); the live progress line keeps quiet meanwhile."""
        net = self._net
        assert net is not None and hasattr(net, "cli")
        if self.progress is not None:
            self.progress.print(
                "mininet: the job is up; Mininet's CLI is open (pingall, trainer0 ip -s link, "
                "shadow0 tcpdump -c 5 -ni eth0 ...). The network stays up until you leave it "
                "(exit or Ctrl-D)."
            )
            self.progress.quiet = True
        else:
            print("mininet: the job is up; Mininet's CLI is open", file=sys.stderr, flush=True)

        def run() -> None:
            try:
                net.cli()
            except Exception as e:  # the network was torn down under it (Ctrl-C)
                log.debug("mininet CLI ended: %s", e)

        t = threading.Thread(target=run, name="mininet-cli", daemon=True)
        t.start()
        return t

    def _wait_cli(self, cli: threading.Thread) -> None:
        """Keep the network (the switch still running) until the user leaves the CLI."""
        if cli.is_alive():
            print(
                "mininet: the job has finished; the network stays up until you leave the CLI "
                "(exit or Ctrl-D)",
                file=sys.stderr,
                flush=True,
            )
        while cli.is_alive():
            cli.join(0.5)
        if self.progress is not None:
            self.progress.quiet = False

    def _teardown(self) -> None:
        """Stop everything this run started. A Ctrl-C or SIGTERM cannot interrupt it; one that
        arrives meanwhile is held and acted on once it is done (KeyboardInterrupt), unless an
        exception is already on its way out (a second Ctrl-C of the same interruption)."""
        import threading

        main = threading.current_thread() is threading.main_thread()
        held: list[int] = []

        def hold(signum: int, _frame: Any) -> None:
            held.append(signum)

        saved = (
            {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
            if main
            else {}
        )
        unwinding = sys.exc_info()[0] is not None
        try:
            self._teardown_all()
        finally:
            for sig, h in saved.items():
                signal.signal(sig, h)
        if held and not unwinding:
            # e.g. a Ctrl-C while the reference run was being torn down: the demo stops here
            # instead of going on to the faulted run as if nothing had been asked
            raise KeyboardInterrupt(f"signal {held[0]} during teardown")

    def _teardown_all(self) -> None:
        for p in reversed(self._procs):
            with contextlib.suppress(Exception):
                p.signal(signal.SIGCONT)  # a paused shadow must be able to exit
                p.stop(grace_s=3.0)
        self._procs.clear()
        if self._switch is not None:
            with contextlib.suppress(Exception):
                self._switch.close()
            self._switch = None
        if self._net is not None:
            self._net.close()
            self._net = None

    # ---------------------------------------------------------------- the demo

    def reference(self) -> dict[str, Any]:
        """The uninterrupted run (cached): losses, step times and the final state's path."""
        key = self.sc.reference_key(self.topology, self.chunk)
        cdir = self.cache_dir / "reference" / key
        meta = cdir / "reference.json"
        if meta.exists() and (cdir / "final.pt").exists():
            ref: dict[str, Any] = json.loads(meta.read_text())
            if self.progress is not None:
                self.progress.print(f"reference: cached ({cdir})")
            ref["cached"] = True
            ref["final"] = str(cdir / "final.pt")
            return ref
        obs = self.execute("reference", ())
        cdir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(obs["final"], cdir / "final.pt")
        ref = {
            "losses": {str(s[1]): s[3] for s in obs["steps"]},
            "mean_step_s": _mean([s[2] for s in obs["steps"][2:]]),
            "seconds": obs["seconds"],
            "key": key,
        }
        meta.write_text(json.dumps(ref))
        ref["cached"] = False
        ref["final"] = str(cdir / "final.pt")
        return ref

    def plain(self) -> dict[str, Any]:
        """The job without shadowgrad (cached like the reference): its step times."""
        key = self.sc.reference_key(self.topology, self.chunk)
        cdir = self.cache_dir / "plain" / key
        meta = cdir / "plain.json"
        if meta.exists():
            with contextlib.suppress(ValueError, OSError):
                cached: dict[str, Any] = json.loads(meta.read_text())
                if isinstance(cached, dict) and cached.get("mean_step_s") is not None:
                    if self.progress is not None:
                        self.progress.print(f"plain: cached ({cdir})")
                    cached["cached"] = True
                    return cached
        obs = self.execute_plain("plain")
        times = [s[2] for s in obs["steps"][2:]]
        out = {
            "mean_step_s": _mean(times),
            "median_step_s": statistics.median(times) if times else None,
            "steps": len(obs["steps"]),
            "seconds": obs["seconds"],
            "key": key,
            "losses": {str(s[1]): s[3] for s in obs["steps"]},
        }
        cdir.mkdir(parents=True, exist_ok=True)
        tmp = meta.with_name(f".{meta.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(out))
        os.replace(tmp, meta)
        out["cached"] = False
        return out

    def run(self) -> dict[str, Any]:
        """Reference and plain runs (cached) + the faulted run -> the run record of report.py."""
        ref = self.reference()
        plain = self.plain()
        obs = self.execute("run", self.sc.faults)
        return self._record(ref, obs, plain)

    def _record(
        self, ref: dict[str, Any], obs: dict[str, Any], plain: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        import torch

        mine = torch.load(obs["final"], weights_only=True)
        theirs = torch.load(ref["final"], weights_only=True)
        differ = [
            f"model.{k}"
            for k in theirs["model"]
            if not torch.equal(mine["model"][k], theirs["model"][k])
        ]
        so, st = mine["optimizer"]["state"], theirs["optimizer"]["state"]
        compared = len(theirs["model"])
        for i in st:
            for k, v in st[i].items():
                compared += 1
                if not torch.equal(so[i][k], v):
                    differ.append(f"optimizer.state[{i}].{k}")
        fs = obs.get("final_status") or {}
        drops: dict[str, int] = {}
        for row in fs.get("shadows") or []:
            for r, n in (row.get("drops") or {}).items():
                drops[r] = drops.get(r, 0) + int(n)
        losses: dict[str, str] = {}
        for s in obs["steps"]:
            losses[str(s[1])] = s[3]  # the last execution of each iteration
        t0 = obs["steps"][0][0] if obs["steps"] else time.time()
        return {
            "scenario": self.sc.to_json(),
            "topology": self.label,
            "target": self.target,
            "started": t0,
            "ended": obs["steps"][-1][0] if obs["steps"] else t0,
            "losses": {"run": losses, "reference": ref["losses"]},
            "step_times": [[s[0], s[1], s[2]] for s in obs["steps"]],
            "samples": obs["samples"],
            "faults": obs["faults"],
            "switch": obs.get("switch"),
            "shadow_drops": drops,
            "bit_exact": {"resume": not differ, "compared": compared, "differ": differ[:20]},
            "reference": {
                "cached": ref["cached"],
                "seconds": ref["seconds"],
                "mean_step_s": ref["mean_step_s"],
            },
            # the same job without shadowgrad: the baseline of the trainer overhead
            "plain": None
            if plain is None
            else {
                "cached": plain.get("cached"),
                "seconds": plain.get("seconds"),
                "mean_step_s": plain.get("mean_step_s"),
                "median_step_s": plain.get("median_step_s"),
                "steps": plain.get("steps"),
                "losses_equal_reference": _equal_losses(plain.get("losses"), ref["losses"]),
            },
            # when this run (the faulted one) began and ended: everything it observed is inside
            "run_window": {
                "began": obs.get("began"),
                "ended": None
                if obs.get("began") is None
                else float(obs["began"]) + float(obs["seconds"]),
            },
            "events": obs.get("events", []),
            "final_status_summary": fs.get("summary"),
            # what each shadow received and how (its rx counters and events: the share that
            # arrived by NACK repair instead of the switch's copy shows here)
            "shadow_rx": [
                {
                    "id": row.get("id"),
                    "drops": row.get("drops") or {},
                    "events": {k: v for k, v in (row.get("events") or {}).items() if v},
                }
                for row in fs.get("shadows") or []
            ],
            "shadow_repaired_bytes": sum(
                int((row.get("events") or {}).get("repaired_bytes", 0))
                for row in fs.get("shadows") or []
            ),
        }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _equal_losses(a: Any, b: Any) -> list[int] | None:
    """[iterations whose loss is the same bit for bit, iterations compared] of two
    {iteration: hex} maps, or None when one is missing."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    common = set(a) & set(b)
    return [sum(1 for k in common if a[k] == b[k]), len(common)]


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                d = json.loads(line)
                if isinstance(d, dict) and "event" in d:
                    out.append(
                        {
                            "t": float(d.get("ts", 0.0)),
                            **{k: v for k, v in d.items() if k not in ("ts", "level", "logger")},
                        }
                    )
    return out


def _settle_faults(obs: dict[str, Any]) -> None:
    """Detection and recovery times from the controller's events and the samples; work lost."""
    events = obs.get("events", [])
    fd = float(obs.get("failure_detect_s") or 0.0)
    for f in obs["faults"]:
        t = f["t_inject"]
        if f["kind"] == "kill_trainer":
            det = [
                e["t"] for e in events if e["event"] == "controller.trainer_failed" and e["t"] >= t
            ]
            f["t_detect"] = min(det) if det else None
            if f["resumed_at"] is not None and f["last_logged"] is not None:
                f["lost_iterations"] = max(0, f["last_logged"] - f["resumed_at"] + 1)
        elif f["kind"] in ("kill_shadow", "pause_shadow"):
            end = _outage_end(f, obs, fd)
            # the first event that noticed this outage: a shadow_failed of this shadow after the
            # fault and before the outage ended (one later is about something else: another
            # fault, the job being torn down); none when nothing noticed (a pause shorter than
            # failure_detect goes unnoticed by design)
            det = [
                e["t"]
                for e in events
                if e["event"] == "controller.shadow_failed"
                and e.get("shadow") == f["target"]
                and t <= e["t"] <= end
            ]
            f["t_detect"] = min(det) if det else None
            # how long the controller could have watched the silence: the outage, cut short
            # when training ended (then nothing is watched) or another fault began
            f["observable_s"] = round(min(float(f.get("down_s") or 0.0), end - t), 3)
            back = f.get("t_back") or t
            for wall, it, _istar, applied in obs["samples"]:
                a = applied[f["target"]] if f["target"] < len(applied) else None
                if wall >= back and it is not None and a is not None and a >= it - 2:
                    f["t_recovered"] = wall
                    break
        elif f["kind"] == "restart_controller":
            det = [e["t"] for e in events if e["event"] == "controller.started" and e["t"] >= t]
            f["t_recovered"] = min(det) if det else None


def _outage_end(f: dict[str, Any], obs: dict[str, Any], fd: float) -> float:
    """When the outage a shadow fault caused was over, as far as detecting it goes: the
    controller saw the shadow back (``controller.shadow_back``), the next fault on the same
    shadow, or training finished (``controller.job_finished``), whichever came first; for a
    pause also ``t_back + failure_detect`` (+ a tick): a resumed process answers at once, so
    a silence that started during the pause is noticed by then or never."""
    t, k = f["t_inject"], f["target"]
    ends = [
        e["t"]
        for e in obs.get("events", [])
        if e["t"] >= t
        and (
            (e["event"] == "controller.shadow_back" and e.get("shadow") == k)
            or e["event"] == "controller.job_finished"
        )
    ]
    ends += [
        g["t_inject"]
        for g in obs["faults"]
        if g["kind"] in ("kill_shadow", "pause_shadow")
        and g.get("target") == k
        and g["t_inject"] > t
    ]
    if f["kind"] == "pause_shadow" and f.get("t_back") is not None:
        ends.append(float(f["t_back"]) + fd + DETECT_SLACK_S)
    return min(ends, default=math.inf)


class _LiveFaults:
    """Says on the progress output when a fault is injected, when the controller detected it
    (its events, read from its log as they come) and when it recovered. Only for the user's
    eyes: the report's figures come from :func:`_settle_faults` after the run."""

    def __init__(self, progress: Progress | None, controller_log: Path) -> None:
        self.progress = progress
        self.log = controller_log
        self.pos = 0
        self.said: set[tuple[int, str]] = set()
        self.faults: list[dict[str, Any]] = []

    def _say(self, rec: dict[str, Any], what: str, text: str) -> None:
        key = (id(rec), what)
        if self.progress is None or key in self.said:
            return
        self.said.add(key)
        self.progress.event(text)

    @staticmethod
    def _name(rec: dict[str, Any]) -> str:
        if rec["kind"] == "kill_trainer":
            return f"kill_trainer (rank {rec['target']})"
        if rec["kind"] in ("kill_shadow", "pause_shadow"):
            return f"{rec['kind']} (shadow {rec['target']})"
        return str(rec["kind"])

    def injected(self, rec: dict[str, Any]) -> None:
        self.faults.append(rec)
        self._say(
            rec,
            "inject",
            f"fault {self._name(rec)} injected at iteration "
            f"{rec['last_logged']}: {rec.get('note') or ''}".rstrip(": "),
        )

    def resumed(self, rec: dict[str, Any], it: int) -> None:
        dt = time.time() - rec["t_inject"]
        self._say(
            rec,
            "recover",
            f"fault {self._name(rec)} recovered: the job resumed at "
            f"iteration {it}, {dt:.1f} s after the kill",
        )

    def poll(self, obs: dict[str, Any]) -> None:
        if self.progress is None or not self.faults:
            return
        new: list[dict[str, Any]] = []
        with contextlib.suppress(OSError):
            with self.log.open("rb") as f:
                f.seek(self.pos)
                chunk = f.read()
            cut = chunk.rfind(b"\n") + 1
            self.pos += cut
            for line in chunk[:cut].decode(errors="replace").splitlines():
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        doc = json.loads(line)
                        if isinstance(doc, dict) and "event" in doc:
                            new.append(doc)
        for doc in new:
            t = float(doc.get("ts") or time.time())
            for rec in self.faults:
                if t < rec["t_inject"]:
                    continue
                ev = doc["event"]
                hit = (ev == "controller.trainer_failed" and rec["kind"] == "kill_trainer") or (
                    ev == "controller.shadow_failed"
                    and rec["kind"] in ("kill_shadow", "pause_shadow")
                    and doc.get("shadow") == rec["target"]
                )
                if hit:
                    self._say(
                        rec,
                        "detect",
                        f"fault {self._name(rec)} detected by the "
                        f"controller after {t - rec['t_inject']:.1f} s ({ev})",
                    )
                if ev == "controller.started" and rec["kind"] == "restart_controller":
                    self._say(
                        rec,
                        "recover",
                        f"fault {self._name(rec)} recovered: the "
                        f"controller is back after {t - rec['t_inject']:.1f} s",
                    )
        for rec in self.faults:
            if rec["kind"] not in ("kill_shadow", "pause_shadow") or rec.get("t_back") is None:
                continue
            k = rec["target"]
            for wall, it, _istar, applied in obs["samples"][-5:]:
                a = applied[k] if k < len(applied) else None
                if wall >= rec["t_back"] and it is not None and a is not None and a >= it - 2:
                    self._say(
                        rec,
                        "recover",
                        f"fault {self._name(rec)} recovered: shadow {k} "
                        f"caught up (iteration {a}), {wall - rec['t_inject']:.1f} s "
                        "after the fault",
                    )
                    break


def run_scenario(scenario: Scenario, work: Path, **kw: Any) -> dict[str, Any]:
    """Run the demo (reference + faulted run) and write the report into ``work``."""
    from .report import write_report

    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(scenario, work, **kw)
    record = runner.run()
    report: dict[str, Any] = write_report(record, work)
    return report
