"""Environment overrides for the job spec: the one place shadowgrad reads ``SHADOWGRAD__*``.

A variable ``SHADOWGRAD__<SECTION>__<KEY>`` overrides key ``<key>`` of section ``[<section>]``
of the job spec before the spec is validated (section and key are matched case-insensitively,
so ``SHADOWGRAD__SWITCH__GRPC_ADDR=127.0.0.1:9560`` sets ``switch.grpc_addr``). The value is
read as a TOML value when it is one (``4``, ``true``, ``"x"``, ``[1, 2]``) and taken as a plain
string otherwise (``127.0.0.1:9560``, ``250ms``). A variable that names no known section or key
is an error naming the variable, so a misspelt override never goes unnoticed.

The default name of the environment variable that holds the job's auth token
(:data:`DEFAULT_TOKEN_ENV`) lives here too; the token itself is only read when asked for
(:meth:`shadowgrad.config.JobSpec.token`). It has a single underscore, so it is never mistaken
for an override.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Collection, Mapping
from typing import Any

from shadowgrad.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "DEFAULT_TOKEN_ENV",
    "override_var",
    "parse_value",
    "scan_overrides",
    "apply_overrides",
]

#: Prefix of every override variable; section and key follow, separated by ``__``.
ENV_PREFIX = "SHADOWGRAD__"
#: Separator between prefix, section and key in an override variable's name.
_SEP = "__"
#: Environment variable that holds the job's auth token unless ``security.token_env`` or
#: ``security.token_file`` says otherwise.
DEFAULT_TOKEN_ENV = "SHADOWGRAD_TOKEN"


def override_var(section: str, key: str) -> str:
    """The name of the variable that overrides ``section.key``."""
    return f"{ENV_PREFIX}{section.upper()}{_SEP}{key.upper()}"


def parse_value(text: str) -> Any:
    """Read an override's value: a TOML value if ``text`` is exactly one, else ``text`` itself."""
    try:
        doc = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    if set(doc) != {"v"}:  # "1\nother = 2" parses, but is not one value
        return text
    return doc["v"]


def _known_keys() -> Mapping[str, Collection[str]]:
    from shadowgrad.config import KNOWN_KEYS

    return KNOWN_KEYS


def scan_overrides(
    env: Mapping[str, str], known: Mapping[str, Collection[str]] | None = None
) -> dict[str, tuple[str, Any]]:
    """Find the overrides in ``env``: ``{"section.key": (variable name, parsed value)}``.

    ``known`` maps each section to its keys (default: the job spec's schema). Raises
    :class:`ConfigError` naming the variable when it is malformed or names an unknown section
    or key.
    """
    schema = _known_keys() if known is None else known
    found: dict[str, tuple[str, Any]] = {}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        parts = var[len(ENV_PREFIX) :].split(_SEP)
        if len(parts) != 2 or not all(parts):
            raise ConfigError(
                var, env[var], f"an override must be named {ENV_PREFIX}<SECTION>{_SEP}<KEY>"
            )
        section, key = (p.lower() for p in parts)
        if section not in schema:
            raise ConfigError(
                var, env[var], f"unknown section {section!r}; sections: {', '.join(schema)}"
            )
        if key not in schema[section]:
            raise ConfigError(
                var,
                env[var],
                f"unknown key {key!r} in section [{section}]; keys: {', '.join(schema[section])}",
            )
        dotted = f"{section}.{key}"
        if dotted in found:
            raise ConfigError(var, env[var], f"{found[dotted][0]} also overrides {dotted}")
        found[dotted] = (var, parse_value(env[var]))
    return found


def apply_overrides(
    raw: Mapping[str, Any],
    env: Mapping[str, str],
    known: Mapping[str, Collection[str]] | None = None,
) -> dict[str, Any]:
    """Return a copy of the raw spec ``raw`` with the overrides found in ``env`` applied.

    ``raw`` is not modified. A section missing from ``raw`` is created. See
    :func:`scan_overrides` for ``known`` and the errors raised.
    """
    out: dict[str, Any] = copy.deepcopy(dict(raw))
    for dotted, (var, value) in scan_overrides(env, known).items():
        section, key = dotted.split(".")
        table = out.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(section, table, f"expected a table (to apply {var})")
        table[key] = value
    return out
