"""Demo scenarios: one TOML file each (``scenarios/*.toml``, docs/testbed.md).

    name = "default"
    model = "mlp"              # mlp | transformer
    mode = "in-band"           # in-band | mirror
    trainers = 4
    shards = 2
    replication = 2
    iterations = 300
    sleep = "0ms"              # extra per-step compute time of every rank

    [[faults]]
    kind = "kill_trainer"      # kill_trainer | kill_shadow | pause_shadow | restart_controller
    target = 2                 #   | loss
    at = 120                   # when rank 0 has logged this iteration
    down = "1s"                # kill_shadow / pause_shadow: how long it stays down

    [[faults]]
    kind = "loss"              # from the start: drop `percent` % on shadow `target`'s port
    target = 0
    percent = 2.0

Every error names the key and the value (:class:`ScenarioError`).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shadowgrad.config import parse_duration
from shadowgrad.errors import ShadowgradError

__all__ = ["FAULT_KINDS", "Fault", "Scenario", "ScenarioError", "load_scenario", "parse_scenario"]

FAULT_KINDS = ("kill_trainer", "kill_shadow", "pause_shadow", "restart_controller", "loss")
_TOP = (
    "name",
    "model",
    "mode",
    "trainers",
    "shards",
    "replication",
    "iterations",
    "sleep",
    "seed",
    "faults",
)
_FAULT = ("kind", "target", "at", "down", "percent")


class ScenarioError(ShadowgradError):
    """A scenario file is invalid; the message names the key and the value."""


@dataclass(frozen=True)
class Fault:
    kind: str
    target: int | None = None
    at: int | None = None
    down_s: float = 1.0
    percent: float = 0.0


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str = "mlp"
    mode: str = "in-band"
    trainers: int = 4
    shards: int = 2
    replication: int = 2
    iterations: int = 300
    sleep_s: float = 0.0
    seed: int = 0
    faults: tuple[Fault, ...] = field(default=())
    source: str = "<string>"

    @property
    def shadows(self) -> int:
        return self.shards * self.replication

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["faults"] = [asdict(f) for f in self.faults]
        d["shadows"] = self.shadows
        return d

    def reference_key(self, topology: str, chunk_bytes: int | None) -> str:
        """What an uninterrupted reference run depends on (faults excepted): its cache key."""
        doc = {k: v for k, v in self.to_json().items() if k not in ("faults", "source", "name")}
        doc["topology"] = topology
        doc["chunk_bytes"] = chunk_bytes
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _int(doc: dict[str, Any], key: str, where: str, lo: int, hi: int, *, default: int) -> int:
    v = doc.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ScenarioError(f"{where}{key} = {v!r}: expected an integer in {lo}..{hi}")
    return v


def parse_scenario(doc: dict[str, Any], source: str = "<string>") -> Scenario:
    """Validate a parsed scenario TOML document."""
    from .demo_worker import MODELS

    for k in doc:
        if k not in _TOP:
            raise ScenarioError(f"{source}: unknown key {k!r}; keys: {', '.join(_TOP)}")
    name = doc.get("name", Path(source).stem)
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"name = {name!r}: expected a non-empty string")
    model = doc.get("model", "mlp")
    if model not in MODELS:
        raise ScenarioError(f"model = {model!r}: expected one of {', '.join(MODELS)}")
    mode = doc.get("mode", "in-band")
    if mode not in ("in-band", "mirror"):
        raise ScenarioError(f"mode = {mode!r}: expected 'in-band' or 'mirror'")
    trainers = _int(doc, "trainers", "", 1, 16, default=4)
    shards = _int(doc, "shards", "", 1, 16, default=2)
    replication = _int(doc, "replication", "", 1, 4, default=2)
    iterations = _int(doc, "iterations", "", 2, 1_000_000, default=300)
    seed = _int(doc, "seed", "", 0, 2**31 - 1, default=0)
    if 48 % trainers:
        raise ScenarioError(f"trainers = {trainers}: must divide the global batch of 48")
    sleep = parse_duration(doc["sleep"], "sleep") if "sleep" in doc else 0.0
    faults = []
    for i, f in enumerate(doc.get("faults", [])):
        where = f"faults[{i}]."
        if not isinstance(f, dict):
            raise ScenarioError(f"faults[{i}] = {f!r}: expected a table ([[faults]])")
        for k in f:
            if k not in _FAULT:
                raise ScenarioError(f"{where}{k}: unknown key; keys: {', '.join(_FAULT)}")
        kind = f.get("kind")
        if kind not in FAULT_KINDS:
            raise ScenarioError(f"{where}kind = {kind!r}: expected one of {', '.join(FAULT_KINDS)}")
        target: int | None = None
        if kind in ("kill_trainer",):
            target = _int(f, "target", where, 0, trainers - 1, default=0)
        elif kind in ("kill_shadow", "pause_shadow", "loss"):
            target = _int(f, "target", where, 0, shards * replication - 1, default=0)
        at: int | None = None
        if kind != "loss":
            at = _int(f, "at", where, 0, iterations - 2, default=iterations // 2)
        down = parse_duration(f["down"], where + "down") if "down" in f else 1.0
        percent = f.get("percent", 0.0)
        if kind == "loss" and (
            isinstance(percent, bool)
            or not isinstance(percent, int | float)
            or not 0 < float(percent) < 50
        ):
            raise ScenarioError(f"{where}percent = {percent!r}: expected a number in (0, 50)")
        if kind == "loss" and mode != "in-band":
            raise ScenarioError(f"{where}kind = 'loss' needs mode = 'in-band' (the switch drops)")
        faults.append(Fault(kind, target, at, down, float(percent)))
    return Scenario(
        name,
        model,
        mode,
        trainers,
        shards,
        replication,
        iterations,
        sleep,
        seed,
        tuple(sorted(faults, key=lambda x: -1 if x.at is None else x.at)),
        source,
    )


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ScenarioError(f"cannot read scenario {p}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{p}: invalid TOML: {e}") from None
    return parse_scenario(doc, str(p))
