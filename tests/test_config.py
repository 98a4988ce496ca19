"""Tests of the job spec (shadowgrad.config) and its environment overrides (shadowgrad._env)."""

from __future__ import annotations

import copy
import dataclasses
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shadowgrad import _env, config
from shadowgrad.config import (
    Endpoint,
    JobSpec,
    TimeoutsSection,
    format_duration,
    load_spec,
    parse_duration,
    parse_spec,
)
from shadowgrad.errors import ConfigError
from shadowgrad.wire import DEFAULT_UDP_PORT

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOENV: dict[str, str] = {}


def base() -> dict[str, Any]:
    """A valid in-band spec with only the required keys."""
    return {
        "job": {"id": 7, "name": "t"},
        "trainers": {
            "world_size": 4,
            "addresses": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"],
        },
        "shadows": {"count": 2, "addresses": ["10.0.1.1", "10.0.1.2"]},
        "switch": {"trainer_ports": [11, 12, 13, 14], "shadow_ports": [21, 22]},
    }


def mirror() -> dict[str, Any]:
    raw = base()
    raw["job"]["mode"] = "mirror"
    raw["switch"] = {"target": "none"}
    return raw


# ------------------------------------------------------------------------------------ examples


def test_reference_example_loads() -> None:
    spec = load_spec(EXAMPLES / "job.toml", env=NOENV)
    assert spec.job.mode == "in-band"
    assert spec.switch.target == "p4target"
    assert spec.trainers.world_size == 4
    assert [str(a) for a in spec.trainers.addresses] == [
        f"10.0.0.{i}:{DEFAULT_UDP_PORT}" for i in range(1, 5)
    ]
    assert spec.shadows.count == 2
    assert spec.shadows.replication == 1
    assert spec.num_shards == 2
    assert len(spec.switch.trainer_ports) == 4
    assert len(spec.switch.shadow_ports) == 2
    assert spec.source.endswith("job.toml")


def test_loopback_example_loads() -> None:
    spec = load_spec(str(EXAMPLES / "job-loopback.toml"), env=NOENV)
    assert spec.job.mode == "mirror"
    assert spec.switch.target == "none"
    assert spec.switch.trainer_ports == () and spec.switch.shadow_ports == ()
    endpoints = [*spec.trainers.addresses, *spec.shadows.addresses]
    assert len(endpoints) == 5
    assert {e.host for e in endpoints} == {"127.0.0.1"}
    assert len({e.port for e in endpoints}) == 5
    assert spec.num_shards == 3
    controls = [spec.shadows.control_endpoint(i) for i in range(3)]
    assert len({c.port for c in controls}) == 3
    with pytest.raises(IndexError):
        spec.shadows.control_endpoint(3)


def test_the_targets_former_name_is_read_as_p4target(caplog: pytest.LogCaptureFixture) -> None:
    """Specs written when the P4 target lived in bmv2_testbed/ keep working, with a warning;
    any other unknown target is still refused."""
    raw = base()
    raw["switch"]["target"] = "bmv2_testbed"
    with caplog.at_level("WARNING", logger="shadowgrad.config"):
        spec = parse_spec(raw, env=NOENV)
    assert spec.switch.target == "p4target"
    assert "former name" in caplog.text and "switch.target" in caplog.text
    raw["switch"]["target"] = "bmv2"
    with pytest.raises(ConfigError, match="must be one of 'p4target'"):
        parse_spec(raw, env=NOENV)


def test_defaults() -> None:
    spec = parse_spec(base(), env=NOENV)
    assert spec.job.mode == "in-band"
    assert spec.trainers.backend == "gloo"
    assert spec.shadows.replication == 1
    assert spec.shadows.control_port == 47480
    assert spec.shadows.snapshot_every == 0 and spec.shadows.snapshot_dir is None
    assert spec.switch.target == "p4target"
    assert spec.switch.grpc_addr == Endpoint("127.0.0.1", 9559)
    assert spec.switch.device_id == 0
    assert spec.switch.p4_program == Path("p4/shadowgrad.p4")
    assert spec.switch.cpu_port == 510
    t = spec.timeouts
    assert (t.heartbeat_s, t.failure_detect_s, t.gap_repair_s, t.rpc_s, t.connect_s) == (
        0.5,
        3.0,
        0.2,
        2.0,
        10.0,
    )
    assert spec.security.token_env == "SHADOWGRAD_TOKEN" == _env.DEFAULT_TOKEN_ENV
    assert spec.security.token_file is None


@pytest.mark.parametrize("name", ["job.toml", "job-loopback.toml"])
def test_round_trip(name: str) -> None:
    spec = load_spec(EXAMPLES / name, env=NOENV)
    assert parse_spec(spec.to_dict(), env=NOENV) == spec
    assert parse_spec(spec.to_toml(), env=NOENV) == spec
    assert tomllib.loads(spec.to_toml()) == spec.to_dict()


def test_round_trip_token_file_and_replication() -> None:
    raw = base()
    raw["shadows"] = {
        "count": 4,
        "replication": 2,
        "addresses": [f"10.0.1.{i}" for i in (1, 2, 3, 4)],
    }
    raw["switch"]["shadow_ports"] = [21, 22, 23, 24]
    raw["security"] = {"token_file": "/run/secrets/tok"}
    raw["timeouts"] = {"heartbeat": "1.5s", "failure_detect": "2m", "gap_repair": "500us"}
    spec = parse_spec(raw, env=NOENV)
    assert spec.num_shards == 2
    assert spec.timeouts.failure_detect_s == 120.0
    d = spec.to_dict()
    assert d["security"] == {
        "token_file": "/run/secrets/tok",
        "authenticate_data": True,
        "authenticate_ring": False,
    }
    assert d["timeouts"]["heartbeat"] == "1500ms"
    assert d["timeouts"]["gap_repair"] == "500us"
    assert parse_spec(d, env=NOENV) == spec
    assert parse_spec(spec.to_toml(), env=NOENV) == spec


def test_ipv6_and_hostnames_in_mirror_mode() -> None:
    raw = mirror()
    raw["trainers"]["addresses"] = ["[::1]:5000", "::1", "node-1.cluster.local:6000", "Node2"]
    spec = parse_spec(raw, env=NOENV)
    assert spec.trainers.addresses == (
        Endpoint("::1", 5000),
        Endpoint("::1", DEFAULT_UDP_PORT),
        Endpoint("node-1.cluster.local", 6000),
        Endpoint("Node2", DEFAULT_UDP_PORT),
    )
    assert str(spec.trainers.addresses[0]) == "[::1]:5000"
    assert parse_spec(spec.to_dict(), env=NOENV) == spec


# ------------------------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1.5s", 1.5),
        ("500us", 0.0005),
        ("1h", 3600.0),
        ("200ms", 0.2),
        (".5s", 0.5),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "seconds", [0.5, 3.0, 0.2, 0.1, 0.3, 1.5, 120.0, 90.0, 3600.0, 0.0005, 1e-7, 0.123456789, 7.25]
)
def test_format_duration_round_trips(seconds: float) -> None:
    text = format_duration(seconds)
    assert text[-1].isalpha()
    assert parse_duration(text) == seconds


# ------------------------------------------------------------------------------------ invalid

Mutator = Callable[[dict[str, Any]], None]


def _set(section: str, key: str, value: Any) -> Mutator:
    def mutate(raw: dict[str, Any]) -> None:
        raw.setdefault(section, {})[key] = value

    return mutate


def _del(section: str, key: str) -> Mutator:
    def mutate(raw: dict[str, Any]) -> None:
        del raw[section][key]

    return mutate


def _both(*mutators: Mutator) -> Mutator:
    def mutate(raw: dict[str, Any]) -> None:
        for m in mutators:
            m(raw)

    return mutate


def _to_mirror(raw: dict[str, Any]) -> None:
    raw["job"]["mode"] = "mirror"
    raw["switch"] = {"target": "none"}


# (id, mutation of base(), exact ConfigError.key, text the message must contain besides the key)
INVALID: list[tuple[str, Mutator, str, str]] = [
    ("id-string", _set("job", "id", "7"), "job.id", "'7'"),
    ("id-bool", _set("job", "id", True), "job.id", "True"),
    ("id-too-big", _set("job", "id", 2**32), "job.id", "4294967296"),
    ("id-negative", _set("job", "id", -1), "job.id", "-1"),
    ("name-chars", _set("job", "name", "my job!"), "job.name", "my job!"),
    ("mode-unknown", _set("job", "mode", "inband"), "job.mode", "inband"),
    ("world-size-zero", _set("trainers", "world_size", 0), "trainers.world_size", "0"),
    ("world-size-float", _set("trainers", "world_size", 4.0), "trainers.world_size", "4.0"),
    ("world-size-missing", _del("trainers", "world_size"), "trainers.world_size", "<missing>"),
    (
        "addresses-length",
        _set("trainers", "addresses", ["10.0.0.1", "10.0.0.2", "10.0.0.9"]),
        "trainers.addresses",
        "10.0.0.9",
    ),
    (
        "address-bad-ipv4",
        _set("trainers", "addresses", ["10.0.0.1", "10.0.0.256", "10.0.0.3", "10.0.0.4"]),
        "trainers.addresses[1]",
        "10.0.0.256",
    ),
    (
        "address-bad-port",
        _set("trainers", "addresses", ["10.0.0.1:70000", "10.0.0.2", "10.0.0.3", "10.0.0.4"]),
        "trainers.addresses[0]",
        "10.0.0.1:70000",
    ),
    (
        "address-not-string",
        _set("shadows", "addresses", ["10.0.1.1", 42]),
        "shadows.addresses[1]",
        "42",
    ),
    (
        "address-duplicate",
        _set("shadows", "addresses", ["10.0.1.1", "10.0.0.3:47474"]),
        "shadows.addresses[1]",
        "'10.0.0.3:47474'",
    ),
    (
        "in-band-hostname",
        _set("shadows", "addresses", ["10.0.1.1", "shadow-b"]),
        "shadows.addresses[1]",
        "'shadow-b'",
    ),
    ("backend-unknown", _set("trainers", "backend", "mpi"), "trainers.backend", "mpi"),
    ("count-bool", _set("shadows", "count", False), "shadows.count", "False"),
    (
        "replication-not-dividing",
        _both(
            _set("shadows", "count", 3),
            _set("shadows", "replication", 2),
            _set("shadows", "addresses", ["10.0.1.1", "10.0.1.2", "10.0.1.3"]),
            _set("switch", "shadow_ports", [21, 22, 23]),
        ),
        "shadows.replication",
        "2",
    ),
    ("replication-over-count", _set("shadows", "replication", 5), "shadows.replication", "5"),
    ("control-port-range", _set("shadows", "control_port", 65535), "shadows.control_port", "65535"),
    (
        "snapshot-without-dir",
        _set("shadows", "snapshot_every", 10),
        "shadows.snapshot_dir",
        "snapshot_every = 10",
    ),
    ("target-unknown", _set("switch", "target", "tofino"), "switch.target", "tofino"),
    ("in-band-target-none", _set("switch", "target", "none"), "switch.target", "'none'"),
    ("grpc-no-port", _set("switch", "grpc_addr", "localhost"), "switch.grpc_addr", "localhost"),
    (
        "trainer-port-duplicate",
        _set("switch", "trainer_ports", [11, 12, 12, 14]),
        "switch.trainer_ports[2]",
        "12",
    ),
    (
        "shadow-port-overlaps-trainer",
        _set("switch", "shadow_ports", [21, 13]),
        "switch.shadow_ports[1]",
        "13",
    ),
    ("port-511-drop", _set("switch", "shadow_ports", [21, 511]), "switch.shadow_ports[1]", "511"),
    (
        "port-over-9-bits",
        _set("switch", "trainer_ports", [11, 12, 13, 600]),
        "switch.trainer_ports[3]",
        "600",
    ),
    (
        "ports-length",
        _set("switch", "shadow_ports", [21, 22, 23]),
        "switch.shadow_ports",
        "[21, 22, 23]",
    ),
    ("cpu-port-zero", _set("switch", "cpu_port", 0), "switch.cpu_port", "0"),
    ("cpu-port-taken", _set("switch", "cpu_port", 21), "switch.shadow_ports[0]", "21"),
    (
        "ports-with-target-none",
        _both(_to_mirror, _set("switch", "trainer_ports", [1, 2, 3, 4])),
        "switch.trainer_ports",
        "[1, 2, 3, 4]",
    ),
    ("duration-bare-int", _set("timeouts", "heartbeat", 5), "timeouts.heartbeat", "5"),
    ("duration-bare-string", _set("timeouts", "rpc", "2"), "timeouts.rpc", "'2'"),
    ("duration-unknown-unit", _set("timeouts", "connect", "5sec"), "timeouts.connect", "5sec"),
    ("duration-zero", _set("timeouts", "gap_repair", "0ms"), "timeouts.gap_repair", "0ms"),
    ("duration-negative", _set("timeouts", "gap_repair", "-1s"), "timeouts.gap_repair", "-1s"),
    (
        "failure-detect-not-above-heartbeat",
        _both(_set("timeouts", "heartbeat", "1s"), _set("timeouts", "failure_detect", "1000ms")),
        "timeouts.failure_detect",
        "1000ms",
    ),
    ("unknown-section", _set("sheduler", "x", 1), "sheduler", "{'x': 1}"),
    ("unknown-key", _set("trainers", "wold_size", 4), "trainers.wold_size", "world_size"),
    ("section-not-table", lambda raw: raw.update(job=3), "job", "3"),
    (
        "both-token-sources",
        _both(_set("security", "token_env", "TOK"), _set("security", "token_file", "/tmp/t")),
        "security.token_file",
        "/tmp/t",
    ),
    ("token-env-invalid", _set("security", "token_env", "1BAD"), "security.token_env", "1BAD"),
]


@pytest.mark.parametrize(
    ("mutate", "key", "shown"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_spec(mutate: Mutator, key: str, shown: str) -> None:
    raw = base()
    mutate(raw)
    with pytest.raises(ConfigError) as exc:
        parse_spec(raw, env=NOENV)
    message = str(exc.value)
    assert exc.value.key == key
    assert key in message
    assert shown in message


def test_invalid_specs_are_many() -> None:
    assert len({c[2].split("[")[0] for c in INVALID}) >= 15


def test_toml_syntax_error() -> None:
    text = '[job]\nid = 7\nname = = "x"\n'
    with pytest.raises(ConfigError) as exc:
        parse_spec(text, source="bad.toml", env=NOENV)
    message = str(exc.value)
    assert exc.value.key == "bad.toml"
    assert 'name = = "x"' in message  # the offending line
    assert "line 3" in message


def test_load_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as exc:
        load_spec(path, env=NOENV)
    assert str(path) in str(exc.value)


def test_load_syntax_error_names_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("[job\nid = 1\n")
    with pytest.raises(ConfigError) as exc:
        load_spec(path, env=NOENV)
    assert exc.value.key == str(path)
    assert "[job" in str(exc.value)


# ------------------------------------------------------------------------------------ env


def test_env_overrides_apply_and_win() -> None:
    env = {
        "SHADOWGRAD__SWITCH__GRPC_ADDR": "127.0.0.1:9560",
        "SHADOWGRAD__SHADOWS__COUNT": "4",
        "SHADOWGRAD__SHADOWS__REPLICATION": "2",
        "SHADOWGRAD__SHADOWS__ADDRESSES": '["10.0.2.1", "10.0.2.2", "10.0.2.3", "10.0.2.4"]',
        "SHADOWGRAD__SWITCH__SHADOW_PORTS": "[31, 32, 33, 34]",
        "SHADOWGRAD__TIMEOUTS__HEARTBEAT": "100ms",
        "SHADOWGRAD__JOB__NAME": '"quoted-name"',
        "SHADOWGRAD_TOKEN": "not-an-override",
        "UNRELATED": "x",
    }
    spec = load_spec(EXAMPLES / "job.toml", env=env)
    assert spec.switch.grpc_addr == Endpoint("127.0.0.1", 9560)
    assert spec.shadows.count == 4
    assert spec.num_shards == 2
    assert spec.shadows.addresses[3] == Endpoint("10.0.2.4", DEFAULT_UDP_PORT)
    assert spec.switch.shadow_ports == (31, 32, 33, 34)
    assert spec.timeouts.heartbeat_s == 0.1
    assert spec.job.name == "quoted-name"
    # untouched keys keep the file's values
    assert spec.job.id == 7
    assert spec.timeouts.failure_detect_s == 3.0


def test_load_spec_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHADOWGRAD__JOB__ID", "99")
    assert load_spec(EXAMPLES / "job.toml").job.id == 99


def test_apply_overrides_copies_and_creates_sections() -> None:
    raw = base()
    before = copy.deepcopy(raw)
    out = _env.apply_overrides(raw, {"SHADOWGRAD__TIMEOUTS__RPC": "3s"})
    assert raw == before
    assert out["timeouts"] == {"rpc": "3s"}
    assert _env.ENV_PREFIX == "SHADOWGRAD__"
    assert _env.override_var("switch", "grpc_addr") == "SHADOWGRAD__SWITCH__GRPC_ADDR"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4", 4),
        ("true", True),
        ('"x"', "x"),
        ("[1, 2]", [1, 2]),
        ("127.0.0.1:9560", "127.0.0.1:9560"),
        ("250ms", "250ms"),
        ("", ""),
        ("1\nother = 2", "1\nother = 2"),
    ],
)
def test_parse_value(text: str, value: Any) -> None:
    assert _env.parse_value(text) == value


@pytest.mark.parametrize(
    "var",
    [
        "SHADOWGRAD__SWITCH__GRPC_ADRR",  # unknown key
        "SHADOWGRAD__SWICH__GRPC_ADDR",  # unknown section
        "SHADOWGRAD__SWITCH",  # no key
        "SHADOWGRAD__SWITCH__GRPC__ADDR",  # too many parts
    ],
)
def test_override_unknown_rejected(var: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_spec(EXAMPLES / "job.toml", env={var: "v4lue"})
    assert exc.value.key == var
    assert var in str(exc.value) and "v4lue" in str(exc.value)


def test_bad_override_value_names_variable() -> None:
    with pytest.raises(ConfigError) as exc:
        load_spec(EXAMPLES / "job.toml", env={"SHADOWGRAD__SHADOWS__COUNT": "two"})
    message = str(exc.value)
    assert exc.value.key == "shadows.count"
    assert "'two'" in message and "SHADOWGRAD__SHADOWS__COUNT" in message


# ------------------------------------------------------------------------------------ token

SECRET = "s3cr3t-t0ken-value"


def test_token_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = base()
    raw["security"] = {"token_env": "MY_JOB_TOKEN"}
    spec = parse_spec(raw, env=NOENV)
    assert spec.token({"MY_JOB_TOKEN": f"{SECRET}\n"}) == SECRET
    monkeypatch.setenv("MY_JOB_TOKEN", SECRET)
    assert spec.token() == SECRET
    assert SECRET not in repr(spec) and SECRET not in str(spec.to_dict())
    assert SECRET not in spec.to_toml()


def test_token_env_missing() -> None:
    spec = parse_spec(base(), env=NOENV)
    with pytest.raises(ConfigError) as exc:
        spec.token({})
    assert exc.value.key == "security.token_env"
    assert "SHADOWGRAD_TOKEN" in str(exc.value)
    with pytest.raises(ConfigError):
        spec.token({"SHADOWGRAD_TOKEN": "  "})


def test_token_from_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"{SECRET}\n")
    os.chmod(path, 0o600)
    raw = base()
    raw["security"] = {"token_file": str(path)}
    spec = parse_spec(raw, env=NOENV)
    assert spec.security.token_env is None
    assert spec.token({"SHADOWGRAD_TOKEN": "other"}) == SECRET
    assert SECRET not in repr(spec) and SECRET not in spec.to_toml()


@pytest.mark.parametrize("content", [None, "", "\n  \n"])
def test_token_file_missing_or_empty(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    raw = base()
    raw["security"] = {"token_file": str(path)}
    spec = parse_spec(raw, env=NOENV)
    with pytest.raises(ConfigError) as exc:
        spec.token()
    assert exc.value.key == "security.token_file"
    assert str(path) in str(exc.value)


def test_spec_is_frozen() -> None:
    spec = parse_spec(base(), env=NOENV)
    with pytest.raises(AttributeError):
        spec.job = spec.job  # type: ignore[misc]
    assert isinstance(spec, JobSpec)
    assert hash(spec.trainers.addresses[0]) == hash(Endpoint("10.0.0.1", DEFAULT_UDP_PORT))


def test_token_file_readable_by_others_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text(SECRET)
    os.chmod(path, 0o644)
    raw = base()
    raw["security"] = {"token_file": str(path)}
    spec = parse_spec(raw, env=NOENV)
    with caplog.at_level("DEBUG"), pytest.raises(ConfigError) as ei:
        spec.token()
    msg = str(ei.value)
    assert "readable by group or others" in msg and "0644" in msg and "chmod 600" in msg
    assert SECRET not in msg and SECRET not in caplog.text
    os.chmod(path, 0o600)
    assert spec.token() == SECRET


# ------------------------------------------------------------------------------------ schema

SECTIONS = {
    "job": config.JobSection,
    "trainers": config.TrainersSection,
    "shadows": config.ShadowsSection,
    "switch": config.SwitchSection,
    "timeouts": config.TimeoutsSection,
    "security": config.SecuritySection,
    "controller": config.ControllerSection,
}


def test_known_keys_are_the_section_fields() -> None:
    assert list(config.KNOWN_KEYS) == list(SECTIONS)
    for name, cls in SECTIONS.items():
        fields = dataclasses.fields(cls)
        assert all(isinstance(f.metadata.get("schema"), config._Key) for f in fields)
        keys = tuple(f.name.removesuffix("_s") if name == "timeouts" else f.name for f in fields)
        assert config.KNOWN_KEYS[name] == keys


def test_defaults_are_the_dataclass_defaults() -> None:
    """Writing every default out changes nothing: DEFAULTS and the dataclasses agree."""
    assert config.DEFAULTS["timeouts"] == {
        "heartbeat": "500ms", "failure_detect": "3s", "gap_repair": "200ms", "rpc": "2s",
        "connect": "10s",
    }  # fmt: skip
    assert config.DEFAULTS["switch"]["grpc_addr"] == config.DEFAULT_GRPC_ADDR
    assert "trainer_ports" not in config.DEFAULTS["switch"]  # required (unless target = none)
    raw = base()
    for section, defaults in config.DEFAULTS.items():
        raw.setdefault(section, {}).update(defaults)
    assert parse_spec(raw, env=NOENV) == parse_spec(base(), env=NOENV)


def test_docstring_key_reference_is_current() -> None:
    marker = "Keys (``*`` = required; default otherwise):\n\n"
    doc = config.__doc__ or ""
    assert marker in doc
    assert doc.partition(marker)[2] == config.render_keys(), (
        "the key reference that ends shadowgrad/config.py's docstring is stale: "
        "replace it with the output of shadowgrad.config.render_keys()"
    )


def test_key_reference_lists_every_key() -> None:
    text = config.render_keys()
    for section, keys in config.KNOWN_KEYS.items():
        assert f"``[{section}]``" in text
        for key in keys:
            assert f"    ``{key}``" in text
    assert "``world_size``\\* -- integer 1..65536;" in text  # required, range from metadata
    assert '``backend`` -- ``"gloo"`` or ``"nccl"``;' in text


@dataclasses.dataclass(frozen=True)
class _TimeoutsWithDrain(TimeoutsSection):
    drain_s: float = dataclasses.field(
        default=1.5, metadata={"schema": config._Key("duration", "how long to drain.", unit="s")}
    )


def test_a_new_field_becomes_a_key_everywhere() -> None:
    """Adding a field to a section dataclass is all it takes: the keys, the defaults, the key
    reference, parsing and validation, and to_dict follow."""
    sections = {**SECTIONS, "timeouts": _TimeoutsWithDrain}
    assert config._known_keys(sections)["timeouts"] == (*config.KNOWN_KEYS["timeouts"], "drain")
    assert config._defaults(sections)["timeouts"]["drain"] == "1500ms"
    rendered = " ".join(config.render_keys(sections).split())
    assert (
        "``drain`` -- duration (float seconds in ``drain_s``); how long to drain. "
        'Default ``"1500ms"``.'
    ) in rendered
    raw = base()
    raw["timeouts"] = {"drain": "3s"}
    spec = config._build(raw, "<test>", sections)
    assert isinstance(spec.timeouts, _TimeoutsWithDrain)
    assert spec.timeouts.drain_s == 3.0
    assert spec.to_dict()["timeouts"]["drain"] == "3s"
    assert config._build(base(), "<test>", sections).timeouts == _TimeoutsWithDrain()
    raw["timeouts"] = {"drain": 3}
    with pytest.raises(ConfigError) as exc:
        config._build(raw, "<test>", sections)
    assert exc.value.key == "timeouts.drain" and "explicit unit" in str(exc.value)
    raw["timeouts"] = {"drian": "3s"}
    with pytest.raises(ConfigError) as exc:
        config._build(raw, "<test>", sections)
    assert exc.value.key == "timeouts.drian" and "did you mean 'drain'" in str(exc.value)
    with pytest.raises(ConfigError) as exc:  # the real schema has no such key
        parse_spec({**base(), "timeouts": {"drain": "3s"}}, env=NOENV)
    assert exc.value.key == "timeouts.drain"
