r"""The job spec: one TOML file that describes a shadowgrad job (DESIGN §7).

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

One schema: the section dataclasses below, the fields of :class:`JobSpec`. Each field's
metadata (``{"schema": _Key(...)}``) holds its kind, range and documentation; :data:`KNOWN_KEYS`,
:data:`DEFAULTS`, the validation of :func:`parse_spec`, :meth:`JobSpec.to_dict` and the key
reference that follows (rendered by :func:`render_keys`; a test checks that it is current) are
all derived from it, so a new key is one new field.

Keys (``*`` = required; default otherwise):

``[job]``: identity and mode of the job.
    ``id``\* -- integer 0..2**32-1; the ``job`` field of every wire header.
    ``name``\* -- string; 1..64 characters from ``[A-Za-z0-9_.-]``.
    ``mode`` -- ``"in-band"`` or ``"mirror"``; ``"in-band"``: the switch taps the all-reduce;
    ``"mirror"``: trainers send their reduced slices to the shadows themselves. Default
    ``"in-band"``.

``[trainers]``: the data-parallel ranks, in rank order.
    ``world_size``\* -- integer 1..65536; number of data-parallel ranks.
    ``addresses``\* -- array of addresses, ``len == trainers.world_size``; one per rank, in rank
    order.
    ``backend`` -- ``"gloo"`` or ``"nccl"``; the process-group backend. Default ``"gloo"``.

``[shadows]``: the shadow nodes, in shadow-id order.
    ``count``\* -- integer 1..65536; number of shadow nodes.
    ``addresses``\* -- array of addresses, ``len == shadows.count``; one data (UDP) address per
    shadow.
    ``replication`` -- integer 1..``shadows.count``; copies of each shard; must divide ``count``,
    giving ``count // replication`` shards. Default ``1``.
    ``control_port`` -- integer 1..65535; base TCP port of the shadows' pyzmq control endpoints:
    shadow ``i`` serves on its host at ``control_port + i`` (so shadows can share a host). Default
    ``47480``.
    ``snapshot_every`` -- integer >= 0; persist state to disk every N iterations; ``0`` = off.
    Default ``0``.
    ``snapshot_dir`` -- path; directory for those snapshots; required when ``snapshot_every > 0``.
    Default: none.

``[switch]``: the P4 target and its port map (ports empty when ``target == "none"``).
    Switch ports are v1model's 9-bit ports, 0..510; 511 is the drop port. All ports are unique
    across ``trainer_ports``, ``shadow_ports`` and ``cpu_port``. In ``"in-band"`` mode every
    trainer and shadow address must be an IPv4 literal, since the switch matches and rewrites IPv4
    headers.
    ``target`` -- ``"p4target"``, ``"simple_switch_grpc"`` or ``"none"``; ``"p4target"``:
    shadowgrad's P4 software target (:mod:`shadowgrad.p4target`; ``"bmv2_testbed"``, its former
    name, is read as it); ``"simple_switch_grpc"``: real bmv2; ``"none"``: no programmable switch
    (only with ``job.mode = "mirror"``). Default ``"p4target"``.
    ``grpc_addr`` -- ``"host:port"``; the P4Runtime server. Default ``"127.0.0.1:9559"``.
    ``device_id`` -- integer 0..2**64-1; P4Runtime device id. Default ``0``.
    ``p4_program`` -- path; P4_16 source to load. Default ``"p4/shadowgrad.p4"``.
    ``trainer_ports``\* -- array of switch ports 0..510, ``len == trainers.world_size``; switch
    port of each trainer, in rank order. Not with ``target = "none"``.
    ``shadow_ports``\* -- array of switch ports 0..510, ``len == shadows.count``; switch port of
    each shadow. Not with ``target = "none"``.
    ``cpu_port`` -- switch port 1..510; the ``--cpu-port`` for PacketIn/PacketOut. Default
    ``510``.
    ``loopback`` -- ``"host:port"``; the hosts reach the switch through the P4 target's loopback
    UDP ports (``sg-switch-grpc --loopback-port N@host:port+N``), exchanging whole Ethernet frames
    (``shadowgrad.frames``). Not with ``target = "none"``. Default: none (the hosts' own
    interfaces cross the switch: veths, Mininet, real links).
    ``trainer_macs`` -- array of MACs (``"02:53:47:00:00:05"``), ``len == trainers.world_size``;
    MAC of each trainer host. Not with ``target = "none"``. Default: ``02:53:47:00:0p:pp`` from
    the host's switch port (the testbed sets it).
    ``shadow_macs`` -- array of MACs (``"02:53:47:00:00:05"``), ``len == shadows.count``; MAC of
    each shadow host. Not with ``target = "none"``. Default: ``02:53:47:00:0p:pp`` from the host's
    switch port (the testbed sets it).

``[timeouts]``, in float seconds (each key is its field less the ``_s``).
    ``heartbeat`` -- duration (float seconds in ``heartbeat_s``); interval of trainer heartbeats.
    Default ``"500ms"``.
    ``failure_detect`` -- duration (float seconds in ``failure_detect_s``); silence after which a
    member is declared failed; must exceed ``heartbeat``. Default ``"3s"``.
    ``gap_repair`` -- duration (float seconds in ``gap_repair_s``); how long a shadow waits for a
    missing chunk before asking for it again. Default ``"200ms"``.
    ``rpc`` -- duration (float seconds in ``rpc_s``); deadline of one control RPC. Default
    ``"2s"``.
    ``connect`` -- duration (float seconds in ``connect_s``); deadline for establishing a
    connection. Default ``"10s"``.

``[security]``: where the token is read from (exactly one of the two is set).
    The job's auth token comes from exactly one source, read only when :meth:`JobSpec.token` is
    called; the token is never part of the spec, its ``repr`` or :meth:`JobSpec.to_dict`. Giving
    both ``token_env`` and ``token_file`` is an error.
    ``token_env`` -- string; name of the environment variable holding the token. Default:
    ``"SHADOWGRAD_TOKEN"`` (when ``token_file`` is not given).
    ``token_file`` -- path; a file holding the token (surrounding whitespace is stripped); it must
    not be readable by group or others (``chmod 600``). Default: none.
    ``authenticate_data`` -- ``true`` or ``false``; DATA chunks carry a MAC too (COMMIT, NACK,
    READY and ACK always do; docs/security.md gives the cost and what ``false`` leaves open).
    Default ``true``.
    ``authenticate_ring`` -- ``true`` or ``false``; in-band mode, with ``authenticate_data``: the
    ring's DATA that only trainers receive (reduce-scatter, all-gather forwards) carries a MAC
    too, not only the FINAL chunks the shadows receive (docs/security.md: what ``false`` leaves
    open, and the cost). Default ``false``.

``[controller]`` (optional): the job's controller; without it (``address = None``) the trainers
find the restore point themselves.
    ``address`` -- ``"host:port"``; where ``shadowgrad controller`` serves its control endpoint
    (ZeroMQ). With it, restarted trainers take the restore point from the controller (falling back
    to the shadows when it does not answer), rank 0 tells it when training ends, and ``shadowgrad
    status`` / ``restore`` show or use its state (docs/operations.md). Default: no controller.
"""

from __future__ import annotations

import difflib
import inspect
import ipaddress
import json
import logging
import math
import os
import re
import textwrap
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal, cast, get_type_hints

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
    "render_keys",
]

_log = logging.getLogger(__name__)

Mode = Literal["in-band", "mirror"]
Backend = Literal["gloo", "nccl"]
Target = Literal["p4target", "simple_switch_grpc", "none"]

MODES: Final[tuple[Mode, ...]] = ("in-band", "mirror")
BACKENDS: Final[tuple[Backend, ...]] = ("gloo", "nccl")
TARGETS: Final[tuple[Target, ...]] = ("p4target", "simple_switch_grpc", "none")
#: former spellings of ``switch.target`` still read (the P4 target lived in bmv2_testbed/)
TARGET_ALIASES: Final[tuple[tuple[str, Target], ...]] = (("bmv2_testbed", "p4target"),)

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
# the schema

_Kind = Literal["int", "str", "choice", "bool", "path", "endpoint", "duration", "addresses",
               "switch_port", "switch_ports", "macs"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Key:
    """How one key is read, checked and documented: the ``"schema"`` entry of the metadata of
    its section field, ``field(default=..., metadata={"schema": _Key("int", "...", max=9)})``.
    A field without a default is a required key."""

    kind: _Kind
    #: the text of the key reference (after the kind and range, which are generated)
    doc: str
    #: integers and switch ports (each port, for an array): the lowest value allowed
    min: int = 0
    #: integers: the highest value allowed, or the dotted key of an earlier integer key
    max: int | str | None = None
    #: arrays: the dotted key of the earlier integer that gives their length
    length: str | None = None
    #: ``"choice"``: the allowed strings
    choices: tuple[str, ...] = ()
    #: ``"choice"``: former spellings still accepted, each read as its choice (with a warning)
    aliases: tuple[tuple[str, str], ...] = ()
    #: durations: the unit of the field, ``"s"`` (float seconds; the key drops the ``_s``)
    unit: str | None = None
    #: strings: a regular expression the whole value must match, and the error if it does not
    pattern: str | None = None
    pattern_error: str = ""
    #: required although the field has a default (used when the key does not apply)
    required: bool = False
    #: only with a switch: must not be given with ``switch.target = "none"``
    needs_switch: bool = False
    #: what the key reference says about the default, instead of the default itself
    default_doc: str | None = None


def _per_host(kind: _Kind, doc: str, length: str, **options: Any) -> Any:
    """The field of a switch key with a value for each trainer or shadow (``length``: the key
    that counts them), empty by default."""
    key = _Key(kind, doc, length=length, needs_switch=True, **options)
    return field(default=(), metadata={"schema": key})


def _key_of(f: Field[Any]) -> _Key:
    key = f.metadata.get("schema")
    if not isinstance(key, _Key):
        raise TypeError(f"section field {f.name!r} has no 'schema' metadata")
    return key


def _schema_fields(section: type[Any]) -> Iterator[tuple[str, Field[Any], _Key]]:
    """The keys of a section dataclass: ``(TOML key, field, schema)`` in field order."""
    for f in fields(section):
        key = _key_of(f)
        yield (f.name.removesuffix(f"_{key.unit}") if key.unit else f.name), f, key


def _default(f: Field[Any]) -> Any:
    """The field's default (``MISSING`` when it has none)."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _required(f: Field[Any], key: _Key) -> bool:
    return key.required or _default(f) is MISSING


def _to_toml(key: _Key, value: Any) -> Any:
    """A field value as TOML-ready data (durations with units, addresses as strings)."""
    if key.kind == "duration":
        return format_duration(value)
    if key.kind in ("endpoint", "path"):
        return str(value)
    if key.kind == "addresses":
        return [str(a) for a in value]
    if key.kind == "switch_ports":
        return list(value)
    if key.kind == "macs":
        from shadowgrad.frames import format_mac

        return [format_mac(m) for m in value]
    return value


# --------------------------------------------------------------------------------------------
# the spec


@dataclass(frozen=True, slots=True)
class JobSection:
    """``[job]``: identity and mode of the job."""

    id: int = field(
        metadata={
            "schema": _Key("int", "the ``job`` field of every wire header.", max=(1 << 32) - 1)
        }
    )
    name: str = field(
        metadata={
            "schema": _Key(
                "str",
                "1..64 characters from ``[A-Za-z0-9_.-]``.",
                pattern=r"[A-Za-z0-9_.-]{1,64}",
                pattern_error="must be 1..64 characters from [A-Za-z0-9_.-]",
            )
        }
    )
    mode: Mode = field(
        default="in-band",
        metadata={
            "schema": _Key(
                "choice",
                '``"in-band"``: the switch taps the all-reduce; ``"mirror"``: trainers send '
                "their reduced slices to the shadows themselves.",
                choices=MODES,
            )
        },
    )


@dataclass(frozen=True, slots=True)
class TrainersSection:
    """``[trainers]``: the data-parallel ranks, in rank order."""

    world_size: int = field(
        metadata={"schema": _Key("int", "number of data-parallel ranks.", min=1, max=MAX_MEMBERS)}
    )
    addresses: tuple[Endpoint, ...] = field(
        metadata={
            "schema": _Key(
                "addresses", "one per rank, in rank order.", length="trainers.world_size"
            )
        }
    )
    backend: Backend = field(
        default="gloo",
        metadata={"schema": _Key("choice", "the process-group backend.", choices=BACKENDS)},
    )


@dataclass(frozen=True, slots=True)
class ShadowsSection:
    """``[shadows]``: the shadow nodes, in shadow-id order."""

    count: int = field(
        metadata={"schema": _Key("int", "number of shadow nodes.", min=1, max=MAX_MEMBERS)}
    )
    addresses: tuple[Endpoint, ...] = field(
        metadata={
            "schema": _Key(
                "addresses", "one data (UDP) address per shadow.", length="shadows.count"
            )
        }
    )
    replication: int = field(
        default=1,
        metadata={
            "schema": _Key(
                "int",
                "copies of each shard; must divide ``count``, giving ``count // replication`` "
                "shards.",
                min=1,
                max="shadows.count",
            )
        },
    )
    control_port: int = field(
        default=DEFAULT_CONTROL_PORT,
        metadata={
            "schema": _Key(
                "int",
                "base TCP port of the shadows' pyzmq control endpoints: shadow ``i`` serves on "
                "its host at ``control_port + i`` (so shadows can share a host).",
                min=1,
                max=65535,
            )
        },
    )
    snapshot_every: int = field(
        default=0,
        metadata={"schema": _Key("int", "persist state to disk every N iterations; ``0`` = off.")},
    )
    snapshot_dir: Path | None = field(
        default=None,
        metadata={
            "schema": _Key(
                "path", "directory for those snapshots; required when ``snapshot_every > 0``."
            )
        },
    )

    @property
    def num_shards(self) -> int:
        """Number of distinct shards: ``count // replication``."""
        return self.count // self.replication

    def control_endpoint(self, index: int) -> Endpoint:
        """Where shadow ``index`` serves its control endpoint: its host, ``control_port+index``."""
        if not 0 <= index < self.count:
            raise IndexError(f"shadow index {index} not in 0..{self.count - 1}")
        return Endpoint(self.addresses[index].host, self.control_port + index)


_DEFAULT_MACS: Final = "``02:53:47:00:0p:pp`` from the host's switch port (the testbed sets it)"


@dataclass(frozen=True, slots=True)
class SwitchSection:
    """``[switch]``: the P4 target and its port map (ports empty when ``target == "none"``).

    Switch ports are v1model's 9-bit ports, 0..510; 511 is the drop port. All ports are unique
    across ``trainer_ports``, ``shadow_ports`` and ``cpu_port``. In ``"in-band"`` mode every
    trainer and shadow address must be an IPv4 literal, since the switch matches and rewrites
    IPv4 headers.
    """

    target: Target = field(
        default="p4target",
        metadata={
            "schema": _Key(
                "choice",
                '``"p4target"``: shadowgrad\'s P4 software target (:mod:`shadowgrad.p4target`;'
                ' ``"bmv2_testbed"``, its former name, is read as it); '
                '``"simple_switch_grpc"``: real bmv2; ``"none"``: no programmable switch '
                '(only with ``job.mode = "mirror"``).',
                choices=TARGETS,
                aliases=TARGET_ALIASES,
            )
        },
    )
    grpc_addr: Endpoint = field(
        default=Endpoint.parse(DEFAULT_GRPC_ADDR, "switch.grpc_addr"),
        metadata={"schema": _Key("endpoint", "the P4Runtime server.")},
    )
    device_id: int = field(
        default=0, metadata={"schema": _Key("int", "P4Runtime device id.", max=(1 << 64) - 1)}
    )
    p4_program: Path = field(
        default=Path(DEFAULT_P4_PROGRAM), metadata={"schema": _Key("path", "P4_16 source to load.")}
    )
    trainer_ports: tuple[int, ...] = _per_host(
        "switch_ports",
        "switch port of each trainer, in rank order.",
        "trainers.world_size",
        required=True,
    )
    shadow_ports: tuple[int, ...] = _per_host(
        "switch_ports", "switch port of each shadow.", "shadows.count", required=True
    )
    cpu_port: int = field(
        default=DEFAULT_CPU_PORT,
        metadata={
            "schema": _Key("switch_port", "the ``--cpu-port`` for PacketIn/PacketOut.", min=1)
        },
    )
    #: the target's loopback UDP ports: switch port N is ``loopback.host:loopback.port + N``
    loopback: Endpoint | None = field(
        default=None,
        metadata={
            "schema": _Key(
                "endpoint",
                "the hosts reach the switch through the P4 target's loopback UDP ports "
                "(``sg-switch-grpc --loopback-port N@host:port+N``), exchanging whole Ethernet "
                "frames (``shadowgrad.frames``).",
                needs_switch=True,
                default_doc="none (the hosts' own "
                "interfaces cross the switch: veths, Mininet, real links)",
            )
        },
    )
    #: 48-bit MACs; empty: ``frames.port_mac(port)``
    trainer_macs: tuple[int, ...] = _per_host(
        "macs", "MAC of each trainer host.", "trainers.world_size", default_doc=_DEFAULT_MACS
    )
    shadow_macs: tuple[int, ...] = _per_host(
        "macs", "MAC of each shadow host.", "shadows.count", default_doc=_DEFAULT_MACS
    )

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
    """``[timeouts]``, in float seconds (each key is its field less the ``_s``)."""

    heartbeat_s: float = field(
        default=0.5,
        metadata={"schema": _Key("duration", "interval of trainer heartbeats.", unit="s")},
    )
    failure_detect_s: float = field(
        default=3.0,
        metadata={
            "schema": _Key(
                "duration",
                "silence after which a member is declared failed; must exceed ``heartbeat``.",
                unit="s",
            )
        },
    )
    gap_repair_s: float = field(
        default=0.2,
        metadata={
            "schema": _Key(
                "duration",
                "how long a shadow waits for a missing chunk before asking for it again.",
                unit="s",
            )
        },
    )
    rpc_s: float = field(
        default=2.0, metadata={"schema": _Key("duration", "deadline of one control RPC.", unit="s")}
    )
    connect_s: float = field(
        default=10.0,
        metadata={"schema": _Key("duration", "deadline for establishing a connection.", unit="s")},
    )


@dataclass(frozen=True, slots=True)
class SecuritySection:
    """``[security]``: where the token is read from (exactly one of the two is set).

    The job's auth token comes from exactly one source, read only when :meth:`JobSpec.token` is
    called; the token is never part of the spec, its ``repr`` or :meth:`JobSpec.to_dict`.
    Giving both ``token_env`` and ``token_file`` is an error.
    """

    token_env: str | None = field(
        default=_env.DEFAULT_TOKEN_ENV,
        metadata={
            "schema": _Key(
                "str",
                "name of the environment variable holding the token.",
                pattern=r"[A-Za-z_][A-Za-z0-9_]*",
                pattern_error="not a valid environment variable name",
                default_doc=f'``"{_env.DEFAULT_TOKEN_ENV}"`` (when ``token_file`` is not given)',
            )
        },
    )
    token_file: Path | None = field(
        default=None,
        metadata={
            "schema": _Key(
                "path",
                "a file holding the token (surrounding whitespace is stripped); it must not be "
                "readable by group or others (``chmod 600``).",
            )
        },
    )
    #: DATA chunks carry a MAC too (COMMIT, NACK, READY and ACK always do)
    authenticate_data: bool = field(
        default=DEFAULT_AUTHENTICATE_DATA,
        metadata={
            "schema": _Key(
                "bool",
                "DATA chunks carry a MAC too (COMMIT, NACK, READY and ACK always do; "
                "docs/security.md gives the cost and what ``false`` leaves open).",
            )
        },
    )
    #: in-band: the ring's trainer-to-trainer DATA carries a MAC too (not only the FINAL chunks)
    authenticate_ring: bool = field(
        default=False,
        metadata={
            "schema": _Key(
                "bool",
                "in-band mode, with ``authenticate_data``: the ring's DATA that only trainers "
                "receive (reduce-scatter, all-gather forwards) carries a MAC too, not only the "
                "FINAL chunks the shadows receive (docs/security.md: what ``false`` leaves open, "
                "and the cost).",
            )
        },
    )

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
                raise ConfigError(
                    key,
                    str(self.token_file),
                    f"the token file is readable by group or others (mode "
                    f"{mode & 0o777:04o}); make it private: chmod 600 "
                    f"{self.token_file}",
                )
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
    """``[controller]`` (optional): the job's controller; without it (``address = None``) the
    trainers find the restore point themselves."""

    address: Endpoint | None = field(
        default=None,
        metadata={
            "schema": _Key(
                "endpoint",
                "where ``shadowgrad controller`` serves its control endpoint (ZeroMQ). With "
                "it, restarted trainers take the restore point from the controller (falling back "
                "to the shadows when it does not answer), rank 0 tells it when training ends, and "
                "``shadowgrad status`` / ``restore`` show or use its state (docs/operations.md).",
                default_doc="no controller",
            )
        },
    )


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job spec. Build it with :func:`load_spec` or :func:`parse_spec`.

    Every field but ``source`` is a section: its name is the TOML table, its dataclass the
    schema of that table's keys.
    """

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

        Keys whose value is unset (``None`` or empty) are left out, and so is a section left
        empty. ``parse_spec(spec.to_dict(), env={}) == spec``.
        """
        out: dict[str, dict[str, Any]] = {}
        for name in _SECTIONS:
            values = getattr(self, name)
            table = {
                key: _to_toml(schema, value)
                for key, f, schema in _schema_fields(type(values))
                if (value := getattr(values, f.name)) is not None and value != ()
            }
            if table:
                out[name] = table
        return out

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
# what the schema gives: sections, keys, defaults, the key reference

Sections = Mapping[str, type[Any]]


def _sections_of(spec: type[Any]) -> dict[str, type[Any]]:
    """The sections of a spec dataclass: its fields whose type is a dataclass, in order."""
    hints = get_type_hints(spec)
    return {f.name: hints[f.name] for f in fields(spec) if is_dataclass(hints[f.name])}


def _known_keys(sections: Sections) -> dict[str, tuple[str, ...]]:
    return {name: tuple(key for key, _, _ in _schema_fields(cls)) for name, cls in sections.items()}


def _defaults(sections: Sections) -> dict[str, dict[str, Any]]:
    return {
        name: {key: _to_toml(schema, d) for key, f, schema in _schema_fields(cls)
               if (d := _default(f)) is not MISSING and d is not None and d != ()}
        for name, cls in sections.items()
    }  # fmt: skip


#: Section name -> section dataclass, in documentation order (the fields of :class:`JobSpec`).
_SECTIONS: Final[Mapping[str, type[Any]]] = _sections_of(JobSpec)

#: Every section and its keys, in documentation order (``_env`` checks overrides against it).
KNOWN_KEYS: Final[Mapping[str, tuple[str, ...]]] = _known_keys(_SECTIONS)

#: Every section and the default of each of its keys that has one, as TOML-ready data.
DEFAULTS: Final[Mapping[str, Mapping[str, Any]]] = _defaults(_SECTIONS)


def _bound(value: int | str) -> str:
    if isinstance(value, str):
        return f"``{value}``"
    if value >= 1 << 20 and value & (value + 1) == 0:
        return f"2**{value.bit_length()}-1"
    return str(value)


def _kind_doc(f: Field[Any], key: _Key) -> str:
    """The generated start of a key's entry: what kind of value, in which range."""
    length = f"``len == {key.length}``"
    ports = f"{key.min}..{MAX_SWITCH_PORT}"
    if key.kind == "int":
        if key.max is None:
            return f"integer >= {key.min}"
        return f"integer {key.min}..{_bound(key.max)}"
    if key.kind == "choice":
        *first, last = (f'``"{c}"``' for c in key.choices)
        return f"{', '.join(first)} or {last}" if first else last
    if key.kind == "duration":
        return f"duration (float seconds in ``{f.name}``)"
    return {
        "str": "string",
        "bool": "``true`` or ``false``",
        "path": "path",
        "endpoint": '``"host:port"``',
        "addresses": f"array of addresses, {length}",
        "switch_port": f"switch port {ports}",
        "switch_ports": f"array of switch ports {ports}, {length}",
        "macs": f'array of MACs (``"02:53:47:00:00:05"``), {length}',
    }[key.kind]


def _fill(text: str, indent: str = "") -> str:
    return textwrap.fill(
        " ".join(text.split()),
        width=98,
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def render_keys(sections: Sections | None = None) -> str:
    r"""The key reference (reStructuredText) rendered from the section dataclasses: for each
    section its docstring, then each key with its kind, range, doc and default, ``\*`` marking
    the required ones. The module docstring ends with it."""
    blocks: list[str] = []
    for cls in (_SECTIONS if sections is None else sections).values():
        summary, *notes = inspect.cleandoc(cls.__doc__ or "").split("\n\n")
        lines = [_fill(summary), *(_fill(note, "    ") for note in notes)]
        for key, f, schema in _schema_fields(cls):
            required = _required(f, schema)
            star = "\\*" if required else ""
            entry = f"``{key}``{star} -- {_kind_doc(f, schema)}; {schema.doc}"
            if schema.needs_switch:
                entry += ' Not with ``target = "none"``.'
            default = _default(f)
            if schema.default_doc is not None:
                entry += f" Default: {schema.default_doc}."
            elif default is None:
                entry += " Default: none."
            elif not required:
                entry += f" Default ``{_toml_value(_to_toml(schema, default))}``."
            lines.append(_fill(entry, "    "))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


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


def _type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
             dict: "table"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


class _Table:
    """One section of the raw spec; raises ConfigError for a key not in ``known``."""

    def __init__(self, raw: Mapping[str, Any], section: str, known: tuple[str, ...]) -> None:
        self.section = section
        value = raw.get(section, {})
        if not isinstance(value, Mapping):
            raise ConfigError(section, value, f"expected a table [{section}]")
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

    def get(self, name: str, default: object = None) -> object:
        return cast(object, self.raw.get(name, default))


def _check_int(value: object, key: str, lo: int, hi: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, value, f"expected an integer, got {_type_name(value)}")
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(key, value, f"must be an integer in {bound}")
    return value


def _switch_port(value: object, key: str, lo: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value == DROP_PORT:
        raise ConfigError(key, value, f"port {DROP_PORT} is v1model's drop port")
    return _check_int(value, key, lo, MAX_SWITCH_PORT)


def _mac(value: object, key: str) -> int:
    from shadowgrad.frames import parse_mac

    try:
        return parse_mac(value if isinstance(value, str) else repr(value))
    except ValueError as exc:
        raise ConfigError(key, value, str(exc)) from None


def _parse_value(schema: _Key, value: object, key: str, parsed: Mapping[str, Any]) -> Any:
    """Check ``value``, given for the dotted ``key``, against its schema and convert it;
    ``parsed`` holds the values of the keys before it (for bounds and lengths named by key)."""
    kind = schema.kind
    if kind == "int":
        hi = parsed[schema.max] if isinstance(schema.max, str) else schema.max
        return _check_int(value, key, schema.min, hi)
    if kind == "switch_port":
        return _switch_port(value, key, schema.min)
    if kind == "duration":
        return parse_duration(value, key)
    if kind == "endpoint":
        return Endpoint.parse(value, key)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(key, value, "must be true or false")
        return value
    if kind in ("str", "choice", "path"):
        if not isinstance(value, str):
            raise ConfigError(key, value, f"expected a string, got {_type_name(value)}")
        if kind == "choice" and value not in schema.choices:
            now = dict(schema.aliases).get(value)
            if now is None:
                options = ", ".join(repr(o) for o in schema.choices)
                raise ConfigError(key, value, f"must be one of {options}")
            _log.warning("%s = %r is a former name of %r: read as %r", key, value, now, now)
            value = now
        if kind == "path" and (not value or "\x00" in value):
            raise ConfigError(key, value, "expected a non-empty path")
        if schema.pattern is not None and not re.fullmatch(schema.pattern, value):
            raise ConfigError(key, value, schema.pattern_error)
        return Path(value) if kind == "path" else value
    if not isinstance(value, list):
        raise ConfigError(key, value, f"expected an array, got {_type_name(value)}")
    if schema.length is not None and len(value) != parsed[schema.length]:
        raise ConfigError(
            key, value, f"has {len(value)} entries but {schema.length} = {parsed[schema.length]}"
        )
    item: Callable[[object, str], object] = {
        "addresses": lambda v, k: Endpoint.parse(v, k, DEFAULT_UDP_PORT),
        "switch_ports": lambda v, k: _switch_port(v, k, schema.min),
        "macs": _mac,
    }[kind]
    return tuple(item(v, f"{key}[{i}]") for i, v in enumerate(value))


def _build(raw: Mapping[str, Any], source: str, sections: Sections | None = None) -> JobSpec:
    """Read every key of every section (in order) by its schema, run the checks that relate
    keys to each other, and build the spec. ``sections`` replaces the schema (tests)."""
    sections = _SECTIONS if sections is None else sections
    known = KNOWN_KEYS if sections is _SECTIONS else _known_keys(sections)
    for section in raw:
        if section not in known:
            close = difflib.get_close_matches(str(section), known, n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise ConfigError(
                str(section),
                raw[section],
                f"unknown section{hint}; sections: {', '.join(known)}",
            )
    tables = {name: _Table(raw, name, known[name]) for name in known}  # unknown keys fail first
    parsed: dict[str, Any] = {}  # dotted key -> value, as read so far
    built: dict[str, Any] = {}
    for name, cls in sections.items():
        t = tables[name]
        values: dict[str, Any] = {}
        for key, f, schema in _schema_fields(cls):
            if schema.needs_switch and parsed.get("switch.target") == "none":
                value = _default(f)  # _check_switch refuses the key if it is given
            elif t.has(key):
                value = _parse_value(schema, t.get(key), t.key(key), parsed)
            elif _required(f, schema):
                raise ConfigError(t.key(key), None, "required key is missing")
            else:
                value = _default(f)
            values[f.name] = parsed[t.key(key)] = value
        check = _CHECKS.get(name)
        if check is not None:
            check(tables, values, parsed)
        built[name] = cls(**values)
    return JobSpec(**built, source=source)


# the checks that relate keys to each other, after a section's keys are read: (tables, the
# section's field values (may be changed), every dotted key read so far)
_Check = Callable[[Mapping[str, _Table], dict[str, Any], Mapping[str, Any]], None]


def _check_shadows(tables: Mapping[str, _Table], v: dict[str, Any], p: Mapping[str, Any]) -> None:
    t = tables["shadows"]
    count, replication, control_port = v["count"], v["replication"], v["control_port"]
    if count % replication:
        raise ConfigError(t.key("replication"), replication, f"must divide shadows.count = {count}")
    if control_port + count - 1 > 65535:
        raise ConfigError(
            t.key("control_port"),
            control_port,
            f"shadow i uses control_port + i, and {control_port} + {count - 1} exceeds 65535",
        )
    if v["snapshot_every"] > 0 and v["snapshot_dir"] is None:
        raise ConfigError(
            t.key("snapshot_dir"),
            None,
            f"required when shadows.snapshot_every = {v['snapshot_every']}",
        )
    seen: dict[tuple[str, int], str] = {}
    for prefix in ("trainers", "shadows"):
        for i, ep in enumerate(p[f"{prefix}.addresses"]):
            key = f"{prefix}.addresses[{i}]"
            if ep._identity() in seen:
                raw_value = tables[prefix].raw["addresses"][i]
                raise ConfigError(key, raw_value, f"same address as {seen[ep._identity()]}")
            seen[ep._identity()] = key


def _check_switch(tables: Mapping[str, _Table], v: dict[str, Any], p: Mapping[str, Any]) -> None:
    t = tables["switch"]
    if v["target"] == "none":
        if p["job.mode"] == "in-band":
            raise ConfigError(
                t.key("target"),
                v["target"],
                "job.mode = 'in-band' needs a switch; use mode = 'mirror'",
            )
        for key, _, schema in _schema_fields(SwitchSection):
            if schema.needs_switch and t.has(key):
                raise ConfigError(
                    t.key(key), t.get(key), "has no meaning with switch.target = 'none'"
                )
        return
    used: dict[int, str] = {v["cpu_port"]: "switch.cpu_port"}
    for name in ("trainer_ports", "shadow_ports"):
        for i, port in enumerate(v[name]):
            key = f"switch.{name}[{i}]"
            if port in used:
                raise ConfigError(key, port, f"port {port} is also {used[port]}")
            used[port] = key
    if p["job.mode"] == "in-band":
        for prefix in ("trainers", "shadows"):
            for i, ep in enumerate(p[f"{prefix}.addresses"]):
                if not ep.is_ipv4:
                    raise ConfigError(
                        f"{prefix}.addresses[{i}]",
                        tables[prefix].raw["addresses"][i],
                        "in-band mode needs IPv4 addresses (the switch rewrites IPv4 headers)",
                    )
    if v["loopback"] is not None:
        top = v["loopback"].port + max(used)
        if top > 65535:
            raise ConfigError(
                t.key("loopback"),
                t.get("loopback"),
                f"base port + switch port reaches {top} > 65535",
            )


def _check_timeouts(tables: Mapping[str, _Table], v: dict[str, Any], p: Mapping[str, Any]) -> None:
    t = tables["timeouts"]
    if v["failure_detect_s"] <= v["heartbeat_s"]:
        defaults = DEFAULTS["timeouts"]
        heartbeat = t.get("heartbeat", defaults["heartbeat"])
        raise ConfigError(
            t.key("failure_detect"),
            t.get("failure_detect", defaults["failure_detect"]),
            f"must be longer than timeouts.heartbeat = {heartbeat!r}",
        )


def _check_security(tables: Mapping[str, _Table], v: dict[str, Any], p: Mapping[str, Any]) -> None:
    t = tables["security"]
    if t.has("token_file"):
        if t.has("token_env"):
            raise ConfigError(
                t.key("token_file"),
                t.get("token_file"),
                "give exactly one of security.token_env and security.token_file",
            )
        v["token_env"] = None
    elif v["token_env"].startswith(_env.ENV_PREFIX):
        raise ConfigError(
            t.key("token_env"), v["token_env"], f"{_env.ENV_PREFIX}* names are spec overrides"
        )


_CHECKS: Final[Mapping[str, _Check]] = {
    "shadows": _check_shadows,
    "switch": _check_switch,
    "timeouts": _check_timeouts,
    "security": _check_security,
}
