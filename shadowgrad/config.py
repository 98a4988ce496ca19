"""The job spec: one TOML file that describes a shadowgrad job (DESIGN §7).

:func:`load_spec` reads a file, :func:`parse_spec` a string or an already parsed mapping; both
apply the environment overrides of :mod:`shadowgrad._env` (``SHADOWGRAD__<SECTION>__<KEY>``)
and then validate everything, returning a frozen :class:`JobSpec`. Any problem raises
:class:`~shadowgrad.errors.ConfigError` whose message names the dotted key (``shadows.count``,
``trainers.addresses[2]``) and the offending value; an unknown section or key is an error too,
so typos never pass silently. Integers must be TOML integers (``true`` is not ``1``).

Addresses are ``"host:port"`` or ``"host"`` (port then defaults to
:data:`shadowgrad.wire.DEFAULT_UDP_PORT`, 47474); host is an IPv4 address, a bracketed IPv6
address (``"[fe80::1]:47474"``; a bare IPv6 address takes the default port) or an RFC 1123
host name. Durations are strings with an explicit unit, ``us`` ``ms`` ``s`` ``m`` or ``h``
(``"500us"``, ``"250ms"``, ``"1.5s"``, ``"2m"``), held as float seconds in fields ending in
``_s``. Relative paths are kept as written (relative to the working directory of the process
that uses them).

Keys (``*`` = required; default otherwise):

``[job]``
    ``id``\\* -- integer 0..2**32-1; the ``job`` field of every wire header.
    ``name``\\* -- 1..64 characters from ``[A-Za-z0-9_.-]``.
    ``mode`` -- ``"in-band"`` (the switch taps the all-reduce) or ``"mirror"`` (trainers send
    their reduced slices to the shadows themselves). Default ``"in-band"``.

``[trainers]``
    ``world_size``\\* -- number of data-parallel ranks, 1..65536.
    ``addresses``\\* -- one address per rank (rank order), ``len == world_size``.
    ``backend`` -- process-group backend, ``"gloo"`` or ``"nccl"``. Default ``"gloo"``.

``[shadows]``
    ``count``\\* -- number of shadow nodes, 1..65536.
    ``replication`` -- copies of each shard; ``1 <= replication <= count`` and divides
    ``count``, giving ``count // replication`` shards. Default ``1``.
    ``addresses``\\* -- one data (UDP) address per shadow, ``len == count``.
    ``control_port`` -- base TCP port of the shadows' pyzmq control endpoints: shadow ``i``
    serves on its host at ``control_port + i`` (so shadows can share a host). Default ``47480``.
    ``snapshot_every`` -- persist state to disk every N iterations; ``0`` = off. Default ``0``.
    ``snapshot_dir`` -- directory for those snapshots; required when ``snapshot_every > 0``.
    Default: none.

``[switch]``
    ``target`` -- ``"bmv2_testbed"`` (shadowgrad's P4 software target), ``"simple_switch_grpc"``
    (real bmv2) or ``"none"`` (no programmable switch; only with ``job.mode = "mirror"``).
    Default ``"bmv2_testbed"``.
    ``grpc_addr`` -- P4Runtime server, ``"host:port"``. Default ``"127.0.0.1:9559"``.
    ``device_id`` -- P4Runtime device id, 0..2**64-1. Default ``0``.
    ``p4_program`` -- P4_16 source to load. Default ``"p4/shadowgrad.p4"``.
    ``trainer_ports``\\* -- switch port of each trainer (rank order), ``len == world_size``.
    ``shadow_ports``\\* -- switch port of each shadow, ``len == shadows.count``.
    ``cpu_port`` -- the ``--cpu-port`` for PacketIn/PacketOut, 1..510. Default ``510``.
    Switch ports are v1model's 9-bit ports, 0..510; 511 is the drop port. All ports are unique
    across ``trainer_ports``, ``shadow_ports`` and ``cpu_port``. With ``target = "none"`` the
    port lists are not required and must not be given. In ``"in-band"`` mode every trainer and
    shadow address must be an IPv4 literal, since the switch matches and rewrites IPv4 headers.
    ``loopback`` -- ``"host:port"``: the hosts reach the switch through the P4 target's
    loopback UDP ports (``sg-switch-grpc --loopback-port N@host:port+N``), exchanging whole
    Ethernet frames (``shadowgrad.frames``). Default: none (the hosts' own interfaces cross
    the switch: veths, Mininet, real links).
    ``trainer_macs``, ``shadow_macs`` -- MAC of each trainer / shadow host, ``"02:53:47:00:00:05"``.
    Default ``02:53:47:00:0p:pp`` from the host's switch port (the testbed sets it).

``[timeouts]``
    ``heartbeat`` -- interval of trainer heartbeats. Default ``"500ms"``.
    ``failure_detect`` -- silence after which a member is declared failed; must exceed
    ``heartbeat``. Default ``"3s"``.
    ``gap_repair`` -- how long a shadow waits for a missing chunk before asking for it again.
    Default ``"200ms"``.
    ``rpc`` -- deadline of one control RPC. Default ``"2s"``.
    ``connect`` -- deadline for establishing a connection. Default ``"10s"``.
    Fields: ``heartbeat_s``, ``failure_detect_s``, ``gap_repair_s``, ``rpc_s``, ``connect_s``.

``[security]``
    The job's auth token comes from exactly one source, read only when
    :meth:`JobSpec.token` is called; the token is never part of the spec, its ``repr`` or
    :meth:`JobSpec.to_dict`.
    ``token_env`` -- name of the environment variable holding it. Default ``"SHADOWGRAD_TOKEN"``
    (when ``token_file`` is not given).
    ``token_file`` -- path of a file holding it (surrounding whitespace is stripped); it must
    not be readable by group or others (``chmod 600``).
    ``authenticate_data`` -- DATA chunks carry a MAC too (COMMIT, NACK, READY and ACK always
    do). Default ``true`` (docs/security.md gives the cost and what ``false`` leaves open).
    Giving both is an error.

``[controller]`` (optional)
    ``address`` -- where ``shadowgrad controller`` serves its control endpoint (ZeroMQ,
    ``"host:port"``). With it, restarted trainers take the restore point from the controller
    (falling back to the shadows when it does not answer), rank 0 tells it when training ends,
    and ``shadowgrad status`` / ``restore`` show or use its state (docs/operations.md).
    Default: no controller.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import logging
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, cast

from shadowgrad import _env
from shadowgrad.errors import ConfigError
from shadowgrad.wire import DEFAULT_UDP_PORT

__all__ = [
    "JobSpec",
    "JobSection",
    "TrainersSection",
    "ShadowsSection",
    "SwitchSection",
    "TimeoutsSection",
    "SecuritySection",
    "Endpoint",
    "load_spec",
    "parse_spec",
    "parse_duration",
    "format_duration",
]

_log = logging.getLogger(__name__)

Mode = Literal["in-band", "mirror"]
Backend = Literal["gloo", "nccl"]
Target = Literal["bmv2_testbed", "simple_switch_grpc", "none"]

MODES: Final[tuple[Mode, ...]] = ("in-band", "mirror")
BACKENDS: Final[tuple[Backend, ...]] = ("gloo", "nccl")
TARGETS: Final[tuple[Target, ...]] = ("bmv2_testbed", "simple_switch_grpc", "none")

#: whether DATA chunks carry a MAC by default (docs/security.md: the measured cost)
DEFAULT_AUTHENTICATE_DATA: Final = True
#: Base TCP port of the shadows' control endpoints (shadow i uses ``control_port + i``).
DEFAULT_CONTROL_PORT: Final = 47480
#: P4Runtime's registered port, on the loopback interface.
DEFAULT_GRPC_ADDR: Final = "127.0.0.1:9559"
DEFAULT_P4_PROGRAM: Final = "p4/shadowgrad.p4"
#: bmv2 ``--cpu-port``: must fit 9 bits, 0 is invalid and 511 is the drop port.
DEFAULT_CPU_PORT: Final = 510
#: v1model's drop port (``mark_to_drop`` sets ``egress_spec`` to it).
DROP_PORT: Final = 511
#: Highest usable v1model port (ports are 9 bits wide; 511 is the drop port).
MAX_SWITCH_PORT: Final = 510
#: Ranks and shadow ids go into the 16-bit ``sender`` field of the wire header.
MAX_MEMBERS: Final = 1 << 16

#: Every section and its keys, in documentation order (``_env`` checks overrides against it).
KNOWN_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "job": ("id", "name", "mode"),
    "trainers": ("world_size", "addresses", "backend"),
    "shadows": (
        "count",
        "replication",
        "addresses",
        "control_port",
        "snapshot_every",
        "snapshot_dir",
    ),
    "switch": (
        "target",
        "grpc_addr",
        "device_id",
        "p4_program",
        "trainer_ports",
        "shadow_ports",
        "cpu_port",
        "loopback",
        "trainer_macs",
        "shadow_macs",
    ),
    "timeouts": ("heartbeat", "failure_detect", "gap_repair", "rpc", "connect"),
    "security": ("token_env", "token_file", "authenticate_data"),
    "controller": ("address",),
}

_TIMEOUT_DEFAULTS: Final = {
    "heartbeat": "500ms",
    "failure_detect": "3s",
    "gap_repair": "200ms",
    "rpc": "2s",
    "connect": "10s",
}

# --------------------------------------------------------------------------------------------
# durations


#: unit -> (multiplier, divisor): seconds = number * multiplier / divisor (division keeps
#: "200ms" exactly equal to 0.2).
_UNITS: Final = {"us": (1, 1_000_000), "µs": (1, 1_000_000), "ms": (1, 1000), "s": (1, 1),
                 "m": (60, 1), "h": (3600, 1)}  # fmt: skip
_UNIT_LIST: Final = "us, ms, s, m, h"
_DURATION_RE: Final = re.compile(r"(?P<num>\d+(?:\.\d+)?|\.\d+)(?P<unit>[^\d.\s]*)")
_BARE_NUMBER_RE: Final = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def parse_duration(value: object, key: str = "duration") -> float:
    """Parse a duration string with an explicit unit (``"250ms"``) into float seconds.

    ``key`` names the value in the :class:`ConfigError` raised for a non-string, a bare number,
    an unknown unit, or a duration that is not positive.
    """
    if isinstance(value, bool) or not isinstance(value, str):
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ConfigError(
                key, value, f"a duration needs an explicit unit, e.g. '{value}s' ({_UNIT_LIST})"
            )
        raise ConfigError(key, value, f"expected a duration string, got {_type_name(value)}")
    text = value.strip()
    if _BARE_NUMBER_RE.fullmatch(text):
        raise ConfigError(
            key, value, f"a duration needs an explicit unit, e.g. '{text}s' ({_UNIT_LIST})"
        )
    if text.startswith("-"):
        raise ConfigError(key, value, "a duration must be positive")
    m = _DURATION_RE.fullmatch(text)
    if m is None:
        raise ConfigError(key, value, f"not a duration; write a number and a unit ({_UNIT_LIST})")
    unit = m["unit"]
    if unit not in _UNITS:
        raise ConfigError(key, value, f"unknown unit {unit!r}; units: {_UNIT_LIST}")
    mul, div = _UNITS[unit]
    seconds = float(m["num"]) * mul / div
    if not seconds > 0.0:
        raise ConfigError(key, value, "a duration must be positive")
    if not math.isfinite(seconds):
        raise ConfigError(key, value, "a duration must be finite")
    return seconds


def format_duration(seconds: float) -> str:
    """Render float seconds with a unit so that :func:`parse_duration` gives ``seconds`` back."""
    for unit in ("h", "m", "s", "ms", "us"):
        mul, div = _UNITS[unit]
        n = seconds * div / mul
        if n >= 1 and n == math.floor(n) and float(int(n)) * mul / div == seconds:
            return f"{int(n)}{unit}"
    return f"{Decimal(repr(seconds)):f}s"


# --------------------------------------------------------------------------------------------
# addresses


_HOST_LABEL_RE: Final = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def _valid_hostname(host: str) -> bool:
    if not host or len(host) > 253:
        return False
    labels = host.split(".")
    if not all(_HOST_LABEL_RE.fullmatch(label) for label in labels):
        return False
    return not labels[-1].isdigit()  # "10.0.0.256" is a bad IPv4 address, not a host name


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A network endpoint: ``host`` (IP literal without brackets, or host name) and ``port``."""

    host: str
    port: int

    @property
    def is_ip(self) -> bool:
        """Whether ``host`` is an IP literal (not a name to resolve)."""
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True

    @property
    def is_ipv4(self) -> bool:
        """Whether ``host`` is an IPv4 literal."""
        try:
            return ipaddress.ip_address(self.host).version == 4
        except ValueError:
            return False

    def _identity(self) -> tuple[str, int]:
        """A normalised form for comparing endpoints (``::1`` == ``0::1``, names folded)."""
        try:
            return (ipaddress.ip_address(self.host).compressed, self.port)
        except ValueError:
            return (self.host.lower(), self.port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @classmethod
    def parse(cls, text: object, key: str, default_port: int | None = None) -> Endpoint:
        """Parse ``"host:port"`` or ``"host"``; ``default_port=None`` makes the port required."""
        if not isinstance(text, str):
            raise ConfigError(key, text, f"expected a 'host:port' string, got {_type_name(text)}")
        port_text: str | None
        if text.startswith("["):
            m = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", text)
            if m is None:
                raise ConfigError(key, text, "malformed bracketed IPv6 address")
            host, port_text = m[1], m[2]
            try:
                if ipaddress.ip_address(host).version != 6:
                    raise ValueError(host)
            except ValueError:
                raise ConfigError(key, text, f"{host!r} is not an IPv6 address") from None
        elif text.count(":") >= 2:
            host, port_text = text, None
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ConfigError(
                    key, text, "not an IPv6 address (write '[v6addr]:port' to give a port)"
                ) from None
        else:
            host, _, rest = text.partition(":")
            port_text = rest if ":" in text else None
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                if not _valid_hostname(host):
                    raise ConfigError(
                        key, text, f"{host!r} is neither an IPv4 address nor a valid host name"
                    ) from None
        if port_text is None:
            if default_port is None:
                raise ConfigError(key, text, "a port is required ('host:port')")
            return cls(host, default_port)
        if not port_text.isdecimal() or not 1 <= int(port_text) <= 65535:
            raise ConfigError(key, text, f"port {port_text!r} is not an integer in 1..65535")
        return cls(host, int(port_text))


# --------------------------------------------------------------------------------------------
# the spec


@dataclass(frozen=True, slots=True)
class JobSection:
    """``[job]``: identity and mode of the job."""

    id: int
    name: str
    mode: Mode = "in-band"


@dataclass(frozen=True, slots=True)
class TrainersSection:
    """``[trainers]``: the data-parallel ranks, in rank order."""

    world_size: int
    addresses: tuple[Endpoint, ...]
    backend: Backend = "gloo"


@dataclass(frozen=True, slots=True)
class ShadowsSection:
    """``[shadows]``: the shadow nodes, in shadow-id order."""

    count: int
    addresses: tuple[Endpoint, ...]
    replication: int = 1
    control_port: int = DEFAULT_CONTROL_PORT
    snapshot_every: int = 0
    snapshot_dir: Path | None = None

    @property
    def num_shards(self) -> int:
        """Number of distinct shards: ``count // replication``."""
        return self.count // self.replication

    def control_endpoint(self, index: int) -> Endpoint:
        """Where shadow ``index`` serves its control endpoint: its host, ``control_port+index``."""
        if not 0 <= index < self.count:
            raise IndexError(f"shadow index {index} not in 0..{self.count - 1}")
        return Endpoint(self.addresses[index].host, self.control_port + index)


@dataclass(frozen=True, slots=True)
class SwitchSection:
    """``[switch]``: the P4 target and its port map (ports empty when ``target == "none"``)."""

    target: Target = "bmv2_testbed"
    grpc_addr: Endpoint = field(default_factory=lambda: Endpoint("127.0.0.1", 9559))
    device_id: int = 0
    p4_program: Path = Path(DEFAULT_P4_PROGRAM)
    trainer_ports: tuple[int, ...] = ()
    shadow_ports: tuple[int, ...] = ()
    cpu_port: int = DEFAULT_CPU_PORT
    #: the target's loopback UDP ports: switch port N is ``loopback.host:loopback.port + N``
    loopback: Endpoint | None = None
    trainer_macs: tuple[int, ...] = ()  #: 48-bit MACs; empty: ``frames.port_mac(port)``
    shadow_macs: tuple[int, ...] = ()

    def loopback_endpoint(self, port: int) -> Endpoint:
        """The UDP endpoint of switch port ``port`` (only with ``loopback`` set)."""
        if self.loopback is None:
            raise ValueError("switch.loopback is not set")
        return Endpoint(self.loopback.host, self.loopback.port + port)

    def trainer_mac(self, rank: int) -> int:
        from shadowgrad.frames import port_mac

        return self.trainer_macs[rank] if self.trainer_macs else port_mac(self.trainer_ports[rank])

    def shadow_mac(self, index: int) -> int:
        from shadowgrad.frames import port_mac

        return self.shadow_macs[index] if self.shadow_macs else port_mac(self.shadow_ports[index])


@dataclass(frozen=True, slots=True)
class TimeoutsSection:
    """``[timeouts]``, in float seconds."""

    heartbeat_s: float = 0.5
    failure_detect_s: float = 3.0
    gap_repair_s: float = 0.2
    rpc_s: float = 2.0
    connect_s: float = 10.0


@dataclass(frozen=True, slots=True)
class SecuritySection:
    """``[security]``: where the token is read from (exactly one of the two is set)."""

    token_env: str | None = _env.DEFAULT_TOKEN_ENV
    token_file: Path | None = None
    #: DATA chunks carry a MAC too (COMMIT, NACK, READY and ACK always do)
    authenticate_data: bool = DEFAULT_AUTHENTICATE_DATA

    def token(self, env: Mapping[str, str] | None = None) -> str:
        """Read the token now (``env`` defaults to ``os.environ``); ConfigError if unavailable."""
        if self.token_file is not None:
            key = "security.token_file"
            try:
                text = self.token_file.read_text(encoding="utf-8")
                mode = self.token_file.stat().st_mode
            except (OSError, UnicodeDecodeError) as e:
                raise ConfigError(key, str(self.token_file), f"cannot read token: {e}") from None
            if mode & 0o077:
                raise ConfigError(key, str(self.token_file),
                                  f"the token file is readable by group or others (mode "
                                  f"{mode & 0o777:04o}); make it private: chmod 600 "
                                  f"{self.token_file}")
            tok = text.strip()
            if not tok:
                raise ConfigError(key, str(self.token_file), "token file is empty")
            return tok
        assert self.token_env is not None
        source = os.environ if env is None else env
        tok = source.get(self.token_env, "").strip()
        if not tok:
            raise ConfigError(
                "security.token_env",
                self.token_env,
                f"environment variable {self.token_env} is not set or empty",
            )
        return tok


@dataclass(frozen=True, slots=True)
class ControllerSection:
    """``[controller]``: where ``shadowgrad controller`` serves its control endpoint (ZeroMQ,
    ``tcp://host:port``); ``None``: no controller (the trainers compute I* themselves)."""

    address: Endpoint | None = None


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job spec. Build it with :func:`load_spec` or :func:`parse_spec`."""

    job: JobSection
    trainers: TrainersSection
    shadows: ShadowsSection
    switch: SwitchSection = field(default_factory=SwitchSection)
    timeouts: TimeoutsSection = field(default_factory=TimeoutsSection)
    security: SecuritySection = field(default_factory=SecuritySection)
    controller: ControllerSection = field(default_factory=ControllerSection)
    #: where the spec came from (a path or ``"<string>"``); not part of equality
    source: str = field(default="<string>", compare=False)

    @property
    def num_shards(self) -> int:
        """Number of distinct shards: ``shadows.count // shadows.replication``."""
        return self.shadows.num_shards

    def token(self, env: Mapping[str, str] | None = None) -> str:
        """The job's auth token, read now from its configured source (see ``[security]``)."""
        return self.security.token(env)

    def mac_key(self, token: str | None = None) -> bytes:
        """The key that authenticates the job's records (``wire.mac_key`` of the token)."""
        from shadowgrad.wire import mac_key

        return mac_key(self.token() if token is None else token, self.job.id)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The spec as TOML-ready data (durations with units, addresses as strings, no token).

        ``parse_spec(spec.to_dict(), env={}) == spec``.
        """
        shadows: dict[str, Any] = {
            "count": self.shadows.count,
            "replication": self.shadows.replication,
            "addresses": [str(a) for a in self.shadows.addresses],
            "control_port": self.shadows.control_port,
            "snapshot_every": self.shadows.snapshot_every,
        }
        if self.shadows.snapshot_dir is not None:
            shadows["snapshot_dir"] = str(self.shadows.snapshot_dir)
        switch: dict[str, Any] = {
            "target": self.switch.target,
            "grpc_addr": str(self.switch.grpc_addr),
            "device_id": self.switch.device_id,
            "p4_program": str(self.switch.p4_program),
        }
        if self.switch.target != "none":
            switch["trainer_ports"] = list(self.switch.trainer_ports)
            switch["shadow_ports"] = list(self.switch.shadow_ports)
        switch["cpu_port"] = self.switch.cpu_port
        if self.switch.loopback is not None:
            switch["loopback"] = str(self.switch.loopback)
        from shadowgrad.frames import format_mac

        for name in ("trainer_macs", "shadow_macs"):
            if getattr(self.switch, name):
                switch[name] = [format_mac(m) for m in getattr(self.switch, name)]
        t = self.timeouts
        security: dict[str, Any] = (
            {"token_file": str(self.security.token_file)}
            if self.security.token_file is not None
            else {"token_env": self.security.token_env}
        )
        security["authenticate_data"] = self.security.authenticate_data
        return {
            "job": {"id": self.job.id, "name": self.job.name, "mode": self.job.mode},
            "trainers": {
                "world_size": self.trainers.world_size,
                "addresses": [str(a) for a in self.trainers.addresses],
                "backend": self.trainers.backend,
            },
            "shadows": shadows,
            "switch": switch,
            "timeouts": {
                "heartbeat": format_duration(t.heartbeat_s),
                "failure_detect": format_duration(t.failure_detect_s),
                "gap_repair": format_duration(t.gap_repair_s),
                "rpc": format_duration(t.rpc_s),
                "connect": format_duration(t.connect_s),
            },
            "security": security,
            **({"controller": {"address": str(self.controller.address)}}
               if self.controller.address is not None else {}),
        }

    def to_toml(self) -> str:
        """:meth:`to_dict` as TOML text (for ``shadowgrad spec show``)."""
        lines: list[str] = []
        for section, table in self.to_dict().items():
            if lines:
                lines.append("")
            lines.append(f"[{section}]")
            lines.extend(f"{key} = {_toml_value(value)}" for key, value in table.items())
        return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON string escapes are valid TOML
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


# --------------------------------------------------------------------------------------------
# parsing and validation


def load_spec(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> JobSpec:
    """Read and validate the job spec at ``path``; ``env`` (default ``os.environ``) supplies
    the ``SHADOWGRAD__*`` overrides."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(source, source, f"cannot read job spec: {e}") from None
    return parse_spec(text, source=source, env=env)


def parse_spec(
    text_or_dict: str | Mapping[str, Any],
    *,
    source: str = "<string>",
    env: Mapping[str, str] | None = None,
) -> JobSpec:
    """Validate a job spec given as TOML text or as a parsed mapping (e.g. from
    :meth:`JobSpec.to_dict`). ``source`` names it in errors; ``env`` (default ``os.environ``)
    supplies the ``SHADOWGRAD__*`` overrides."""
    if isinstance(text_or_dict, str):
        raw: Mapping[str, Any] = _loads(text_or_dict, source)
    elif isinstance(text_or_dict, Mapping):
        raw = text_or_dict
    else:
        raise ConfigError(source, text_or_dict, "expected TOML text or a mapping")
    env_map = os.environ if env is None else env
    overrides = _env.scan_overrides(env_map, KNOWN_KEYS)
    merged = _env.apply_overrides(raw, env_map, KNOWN_KEYS)
    try:
        return _build(merged, source)
    except ConfigError as e:
        if e.key.split("[")[0] in overrides:
            var = overrides[e.key.split("[")[0]][0]
            raise ConfigError(e.key, e.value, f"{e.reason} (set by {var})") from None
        raise


def _loads(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"at line (\d+)", str(e))
        lines = text.splitlines()
        value: Any = None
        if m is not None and 1 <= int(m[1]) <= len(lines):
            value = lines[int(m[1]) - 1]
        raise ConfigError(source, value, f"invalid TOML: {e}") from None


_MISSING: Final = object()
_T = TypeVar("_T")


def _type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
             dict: "table"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


class _Table:
    """One section of the raw spec: typed getters that raise ConfigError with the dotted key."""

    def __init__(self, raw: Mapping[str, Any], section: str) -> None:
        self.section = section
        value = raw.get(section, {})
        if not isinstance(value, Mapping):
            raise ConfigError(section, value, f"expected a table [{section}]")
        known = KNOWN_KEYS[section]
        for key in value:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"{section}.{key}",
                    value[key],
                    f"unknown key{hint}; keys of [{section}]: {', '.join(known)}",
                )
        self.raw: Mapping[str, Any] = value

    def key(self, name: str) -> str:
        return f"{self.section}.{name}"

    def has(self, name: str) -> bool:
        return name in self.raw

    def get(self, name: str, default: object = _MISSING) -> object:
        if name in self.raw:
            return cast(object, self.raw[name])
        if default is _MISSING:
            raise ConfigError(self.key(name), None, "required key is missing")
        return default

    def int_(
        self, name: str, default: object = _MISSING, lo: int = 0, hi: int | None = None
    ) -> int:
        return _check_int(self.get(name, default), self.key(name), lo, hi)

    def str_(self, name: str, default: object = _MISSING) -> str:
        value = self.get(name, default)
        if not isinstance(value, str):
            raise ConfigError(self.key(name), value, f"expected a string, got {_type_name(value)}")
        return value

    def choice(self, name: str, options: Sequence[_T], default: object = _MISSING) -> _T:
        value = self.str_(name, default)
        for option in options:
            if value == option:
                return option
        raise ConfigError(
            self.key(name), value, f"must be one of {', '.join(repr(o) for o in options)}"
        )

    def path(self, name: str, default: object = _MISSING) -> Path:
        value = self.str_(name, default)
        if not value or "\x00" in value:
            raise ConfigError(self.key(name), value, "expected a non-empty path")
        return Path(value)

    def list_(self, name: str) -> list[Any]:
        value = self.get(name)
        if not isinstance(value, list):
            raise ConfigError(self.key(name), value, f"expected an array, got {_type_name(value)}")
        return value


def _check_int(value: object, key: str, lo: int, hi: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, value, f"expected an integer, got {_type_name(value)}")
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(key, value, f"must be an integer in {bound}")
    return value


def _addresses(table: _Table, name: str, expected: int, size_key: str) -> tuple[Endpoint, ...]:
    items = table.list_(name)
    if len(items) != expected:
        raise ConfigError(
            table.key(name), items, f"has {len(items)} entries but {size_key} = {expected}"
        )
    return tuple(
        Endpoint.parse(item, f"{table.key(name)}[{i}]", DEFAULT_UDP_PORT)
        for i, item in enumerate(items)
    )


def _switch_ports(table: _Table, name: str, expected: int, size_key: str) -> tuple[int, ...]:
    items = table.list_(name)
    if len(items) != expected:
        raise ConfigError(
            table.key(name), items, f"has {len(items)} entries but {size_key} = {expected}"
        )
    ports: list[int] = []
    for i, item in enumerate(items):
        ports.append(_switch_port(item, f"{table.key(name)}[{i}]", lo=0))
    return tuple(ports)


def _switch_port(value: object, key: str, lo: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value == DROP_PORT:
        raise ConfigError(key, value, f"port {DROP_PORT} is v1model's drop port")
    return _check_int(value, key, lo, MAX_SWITCH_PORT)


def _build(raw: Mapping[str, Any], source: str) -> JobSpec:
    for section in raw:
        if section not in KNOWN_KEYS:
            close = difflib.get_close_matches(str(section), KNOWN_KEYS, n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise ConfigError(
                str(section),
                raw[section],
                f"unknown section{hint}; sections: {', '.join(KNOWN_KEYS)}",
            )
    tables = {name: _Table(raw, name) for name in KNOWN_KEYS}  # unknown keys fail first

    t = tables["job"]
    job_id = t.int_("id", hi=(1 << 32) - 1)
    name = t.str_("name")
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise ConfigError(t.key("name"), name, "must be 1..64 characters from [A-Za-z0-9_.-]")
    job = JobSection(job_id, name, t.choice("mode", MODES, "in-band"))

    t = tables["trainers"]
    world_size = t.int_("world_size", lo=1, hi=MAX_MEMBERS)
    trainers = TrainersSection(
        world_size,
        _addresses(t, "addresses", world_size, "trainers.world_size"),
        t.choice("backend", BACKENDS, "gloo"),
    )

    t = tables["shadows"]
    count = t.int_("count", lo=1, hi=MAX_MEMBERS)
    replication = t.int_("replication", 1, lo=1, hi=count)
    if count % replication:
        raise ConfigError(t.key("replication"), replication, f"must divide shadows.count = {count}")
    addresses = _addresses(t, "addresses", count, "shadows.count")
    control_port = t.int_("control_port", DEFAULT_CONTROL_PORT, lo=1, hi=65535)
    if control_port + count - 1 > 65535:
        raise ConfigError(
            t.key("control_port"),
            control_port,
            f"shadow i uses control_port + i, and {control_port} + {count - 1} exceeds 65535",
        )
    snapshot_every = t.int_("snapshot_every", 0, lo=0)
    snapshot_dir = t.path("snapshot_dir") if t.has("snapshot_dir") else None
    if snapshot_every > 0 and snapshot_dir is None:
        raise ConfigError(
            t.key("snapshot_dir"), None, f"required when shadows.snapshot_every = {snapshot_every}"
        )
    shadows = ShadowsSection(
        count, addresses, replication, control_port, snapshot_every, snapshot_dir
    )

    seen: dict[tuple[str, int], str] = {}
    for prefix, eps in (("trainers", trainers.addresses), ("shadows", shadows.addresses)):
        for i, ep in enumerate(eps):
            key = f"{prefix}.addresses[{i}]"
            if ep._identity() in seen:
                raw_value = tables[prefix].raw["addresses"][i]
                raise ConfigError(key, raw_value, f"same address as {seen[ep._identity()]}")
            seen[ep._identity()] = key

    t = tables["switch"]
    target = t.choice("target", TARGETS, "bmv2_testbed")
    if target == "none" and job.mode == "in-band":
        raise ConfigError(
            t.key("target"), target, "job.mode = 'in-band' needs a switch; use mode = 'mirror'"
        )
    grpc_addr = Endpoint.parse(t.get("grpc_addr", DEFAULT_GRPC_ADDR), t.key("grpc_addr"))
    device_id = t.int_("device_id", 0, lo=0, hi=(1 << 64) - 1)
    p4_program = t.path("p4_program", DEFAULT_P4_PROGRAM)
    cpu_port = _switch_port(t.get("cpu_port", DEFAULT_CPU_PORT), t.key("cpu_port"), lo=1)
    trainer_ports: tuple[int, ...] = ()
    shadow_ports: tuple[int, ...] = ()
    if target == "none":
        for name in ("trainer_ports", "shadow_ports"):
            if t.has(name):
                raise ConfigError(
                    t.key(name), t.get(name), "has no meaning with switch.target = 'none'"
                )
    else:
        trainer_ports = _switch_ports(t, "trainer_ports", world_size, "trainers.world_size")
        shadow_ports = _switch_ports(t, "shadow_ports", count, "shadows.count")
        used: dict[int, str] = {cpu_port: "switch.cpu_port"}
        for name, ports in (("trainer_ports", trainer_ports), ("shadow_ports", shadow_ports)):
            for i, port in enumerate(ports):
                key = f"switch.{name}[{i}]"
                if port in used:
                    raise ConfigError(key, port, f"port {port} is also {used[port]}")
                used[port] = key
    if job.mode == "in-band":
        for prefix, eps in (("trainers", trainers.addresses), ("shadows", shadows.addresses)):
            for i, ep in enumerate(eps):
                if not ep.is_ipv4:
                    raise ConfigError(
                        f"{prefix}.addresses[{i}]",
                        tables[prefix].raw["addresses"][i],
                        "in-band mode needs IPv4 addresses (the switch rewrites IPv4 headers)",
                    )
    loopback: Endpoint | None = None
    macs: dict[str, tuple[int, ...]] = {"trainer_macs": (), "shadow_macs": ()}
    if target == "none":
        for name in ("loopback", *macs):
            if t.has(name):
                raise ConfigError(
                    t.key(name), t.get(name), "has no meaning with switch.target = 'none'"
                )
    else:
        if t.has("loopback"):
            loopback = Endpoint.parse(t.get("loopback"), t.key("loopback"))
            top = loopback.port + max((*trainer_ports, *shadow_ports, cpu_port))
            if top > 65535:
                raise ConfigError(t.key("loopback"), t.get("loopback"),
                                  f"base port + switch port reaches {top} > 65535")
        from shadowgrad.frames import parse_mac

        for name, n, size_key in (("trainer_macs", world_size, "trainers.world_size"),
                                  ("shadow_macs", count, "shadows.count")):
            if not t.has(name):
                continue
            items = t.list_(name)
            if len(items) != n:
                raise ConfigError(t.key(name), items,
                                  f"has {len(items)} entries but {size_key} = {n}")
            vals = []
            for i, item in enumerate(items):
                try:
                    vals.append(parse_mac(item if isinstance(item, str) else repr(item)))
                except ValueError as exc:
                    raise ConfigError(f"{t.key(name)}[{i}]", item, str(exc)) from None
            macs[name] = tuple(vals)
    switch = SwitchSection(
        target, grpc_addr, device_id, p4_program, trainer_ports, shadow_ports, cpu_port,
        loopback, macs["trainer_macs"], macs["shadow_macs"]
    )

    t = tables["timeouts"]
    secs = {k: parse_duration(t.get(k, d), t.key(k)) for k, d in _TIMEOUT_DEFAULTS.items()}
    if secs["failure_detect"] <= secs["heartbeat"]:
        raise ConfigError(
            t.key("failure_detect"),
            t.get("failure_detect", _TIMEOUT_DEFAULTS["failure_detect"]),
            "must be longer than timeouts.heartbeat = "
            f"{t.get('heartbeat', _TIMEOUT_DEFAULTS['heartbeat'])!r}",
        )
    timeouts = TimeoutsSection(
        secs["heartbeat"], secs["failure_detect"], secs["gap_repair"], secs["rpc"], secs["connect"]
    )

    t = tables["security"]
    if t.has("token_env") and t.has("token_file"):
        raise ConfigError(
            t.key("token_file"),
            t.get("token_file"),
            "give exactly one of security.token_env and security.token_file",
        )
    auth_data = t.get("authenticate_data", DEFAULT_AUTHENTICATE_DATA)
    if not isinstance(auth_data, bool):
        raise ConfigError(t.key("authenticate_data"), auth_data, "must be true or false")
    if t.has("token_file"):
        security = SecuritySection(token_env=None, token_file=t.path("token_file"),
                                   authenticate_data=auth_data)
    else:
        token_env = t.str_("token_env", _env.DEFAULT_TOKEN_ENV)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token_env):
            raise ConfigError(
                t.key("token_env"), token_env, "not a valid environment variable name"
            )
        if token_env.startswith(_env.ENV_PREFIX):
            raise ConfigError(
                t.key("token_env"), token_env, f"{_env.ENV_PREFIX}* names are spec overrides"
            )
        security = SecuritySection(token_env=token_env, authenticate_data=auth_data)

    t = tables["controller"]
    controller = ControllerSection(
        Endpoint.parse(t.get("address"), t.key("address")) if t.has("address") else None)

    return JobSpec(job, trainers, shadows, switch, timeouts, security, controller, source)
