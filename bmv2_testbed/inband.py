"""Run an in-band job's switch: ``sg-switch-grpc`` (or any binary with simple_switch_grpc's
command line) on the job's loopback UDP ports (or on given interfaces), running
``p4/shadowgrad.p4``, programmed from the job spec and the layout by the controller's switch
driver.

::

    with JobSwitch(spec, layout, loss={5: 0.01}) as sw:   # switch port 5 drops 1% of frames
        ... run trainers and shadows (their spec has switch.loopback) ...
        sw.driver.counters()

Each trainer/shadow port N is ``--loopback-port N@<loopback host>:<base + N>=<host address>``,
so frames for a host go to the UDP address its FrameLink (trainer) or shadow node listens on.
Every shadow port is lossless (``--lossless-port``): a burst toward a slow shadow pauses the
switch's reading of the ingress port, up to ``pause_timeout_s``, instead of tail-dropping
(docs/switch.md, *Lossless shadow ports*). The process is always reaped (``close``, also at
interpreter exit).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypedDict, Unpack

from shadowgrad.config import JobSpec
from shadowgrad.controller.p4runtime import P4RuntimeClient
from shadowgrad.controller.switch import ConvergeReport, SwitchDriver
from shadowgrad.errors import ConfigError
from shadowgrad.layout import Layout
from shadowgrad.p4target.pipeline import Pipeline

__all__ = [
    "AttachedSwitch",
    "JobSwitch",
    "PRODUCT_PROGRAM",
    "SwitchOptions",
    "compile_product",
    "switch_options",
]

#: the ToR program, in the source tree
PRODUCT_PROGRAM = Path(__file__).resolve().parent.parent / "p4" / "shadowgrad.p4"
_COMPILED: dict[Path, tuple[Any, bytes]] = {}


def compile_product(program: Path | None = None) -> tuple[Any, bytes]:
    """(P4Info, device config) of ``p4/shadowgrad.p4`` for this target (cached)."""
    path = Path(program or PRODUCT_PROGRAM).resolve()
    if path not in _COMPILED:
        pipe = Pipeline.compile(path)
        _COMPILED[path] = (pipe.p4info, pipe.to_device_config())
    return _COMPILED[path]


class AttachedSwitch(Protocol):
    """A running switch that :class:`JobSwitch` programs but did not start."""

    grpc_addr: str
    log_file: str

    def argv(self) -> list[str]: ...

    def stop_datapath(self) -> None: ...


class SwitchOptions(TypedDict, total=False):
    """The keyword arguments of :func:`switch_options` (their defaults are there), as
    :class:`JobSwitch` takes them and passes them on."""

    loss: Mapping[int, float] | None
    rate: Mapping[int, str] | None
    delay: Mapping[int, str] | None
    lossless: bool
    pause_timeout_s: float
    queue_capacity: int
    headroom: int
    extra_args: Sequence[str]


def switch_options(
    spec: JobSpec,
    *,
    loss: Mapping[int, float] | None = None,
    rate: Mapping[int, str] | None = None,
    delay: Mapping[int, str] | None = None,
    lossless: bool = True,
    pause_timeout_s: float = 1.0,
    queue_capacity: int = 1024,
    headroom: int = 4096,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The job's ``sg-switch-grpc`` options before ``--`` (per-port loss, rate and delay; the
    shadow ports lossless; queue sizes), whoever starts the switch."""
    cmd: list[str] = []
    for port, p in (loss or {}).items():
        cmd += ["--port-loss", f"{port}:{p}"]
    for port, r in (rate or {}).items():
        cmd += ["--port-rate", f"{port}:{r}"]
    for port, d in (delay or {}).items():
        cmd += ["--port-delay", f"{port}:{d}"]
    if lossless:
        for port in spec.switch.shadow_ports:
            cmd += ["--lossless-port", str(port)]
    return [
        *cmd,
        "--pause-timeout",
        f"{pause_timeout_s}s",
        "--queue-capacity",
        str(queue_capacity),
        "--lossless-headroom",
        str(headroom),
        *extra_args,
    ]


def _reap(state: dict[str, Any]) -> None:
    from shadowgrad.p4target.process import stop_switch

    stop_switch(state)
    log = state.pop("log", None)
    if log is not None:
        log.close()


class JobSwitch:
    """The switch of one in-band job on loopback ports (see the module docstring).

    ``loss``/``rate``/``delay``: per switch port, the target's ``--port-loss`` (probability),
    ``--port-rate`` (``"100m"``) and ``--port-delay`` (``"5ms"``). ``lossless``: make every shadow
    port lossless (default). ``extra_args``: more switch options (before ``--``). ``tap=False``
    programs everything but the tap (the ring runs through the switch, nothing is copied).
    ``interfaces`` (switch port -> Linux interface): attach those instead of loopback ports
    (``-i N@iface``; veths to hosts in network namespaces, root needed). ``attached``: a switch
    someone else started (a Mininet :class:`~.p4_mininet.P4RuntimeSwitch`, started with
    :func:`switch_options`): it is only programmed here, and ``close()`` stops it through
    ``attached.stop_datapath()`` and reads its final counters from ``attached.log_file``.
    """

    def __init__(
        self,
        spec: JobSpec,
        layout: Layout,
        *,
        switch_cmd: Sequence[str] | None = None,
        start_timeout_s: float = 60.0,
        request_log: str | Path | None = None,
        tap: bool = True,
        interfaces: Mapping[int, str] | None = None,
        attached: AttachedSwitch | None = None,
        **options: Unpack[SwitchOptions],
    ) -> None:
        sw = spec.switch
        if sw.loopback is None and interfaces is None and attached is None:
            raise ConfigError(
                "switch.loopback",
                None,
                "JobSwitch runs the job's switch on "
                "loopback UDP ports (set switch.loopback) or on interfaces "
                "(give interfaces={port: ifname})",
            )
        self.spec = spec
        self.final_counters: dict[str, Any] = {}
        self._state: dict[str, Any] = {}
        self._finalizer = weakref.finalize(self, _reap, self._state)
        self.attached = attached
        opts = switch_options(spec, **options)
        cmd = list(switch_cmd or [sys.executable, "-m", "shadowgrad.p4target._switch_cmd"])
        cmd += ["--no-p4", "--device-id", str(sw.device_id)]
        hosts = [
            *zip(sw.trainer_ports, spec.trainers.addresses, strict=True),
            *zip(sw.shadow_ports, spec.shadows.addresses, strict=True),
        ]
        for port, ep in hosts if attached is None else ():
            if interfaces is not None:
                cmd += ["-i", f"{port}@{interfaces[port]}"]
                continue
            lb = sw.loopback_endpoint(port)
            cmd += ["--loopback-port", f"{port}@{lb.host}:{lb.port}={ep.host}:{ep.port}"]
        cmd += [
            *opts,
            "--",
            "--grpc-server-addr",
            "127.0.0.1:0",
            "--cpu-port",
            str(sw.cpu_port),
        ]
        self.cmd = cmd
        if attached is not None:
            self.cmd = list(attached.argv())
            self.log_path = Path(attached.log_file)
        else:
            self.log_path = Path(tempfile.mkstemp(prefix="sg-switch-", suffix=".log")[1])
        try:
            if attached is not None:
                self.grpc_addr = attached.grpc_addr
            else:
                self._spawn(cmd, start_timeout_s)
            client = P4RuntimeClient(
                self.grpc_addr, device_id=sw.device_id, request_log=request_log
            )
            self._state["client"] = client
            client.connect(wait_s=start_timeout_s)
            self.client = client
            self.driver = SwitchDriver(client, spec, layout, pipeline=compile_product(), tap=tap)
            self.report: ConvergeReport = self.driver.converge()
        except BaseException:
            self.close()
            raise

    def _spawn(self, cmd: list[str], start_timeout_s: float) -> None:
        logf = open(self.log_path, "w")  # noqa: SIM115 (closed by the finalizer)
        self._state["log"] = logf
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=logf, stdin=subprocess.DEVNULL, text=True
        )
        self._state["proc"] = proc
        self.proc = proc
        from shadowgrad.p4target.process import wait_switch_ready

        try:
            self.grpc_addr = wait_switch_ready(proc, start_timeout_s)
        except Exception as exc:
            raise RuntimeError(f"{exc}:\n{self.log()[-3000:]}") from None
        assert proc.stdout is not None
        proc.stdout.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def counters(self) -> dict[str, Any]:
        return self.driver.counters()

    def close(self) -> None:
        """Stop the switch (SIGTERM) and keep its final port/queue counters in
        :attr:`final_counters` (drops by reason, pauses; what P4Runtime cannot read)."""
        self._finalizer()
        if self.attached is not None:
            self.attached.stop_datapath()  # it prints its final counters as it stops
        for line in self.log().splitlines():
            if line.startswith("sg-switch-grpc counters "):
                with contextlib.suppress(ValueError):
                    self.final_counters = json.loads(line.split(" ", 2)[2])
        if self.attached is None:  # an attached switch's log is its owner's
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def __enter__(self) -> JobSwitch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
