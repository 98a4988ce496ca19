"""Option kinds the command-line modules' ``configure(parser)`` declare alike.

Each is one ``add_argument`` with the settings that kind always has: a :func:`flag` is off unless
given, a :func:`repeated` option collects every occurrence in a list (empty when never given), a
:func:`seconds` option is a float number of seconds. Help texts stay with each command.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["flag", "repeated", "seconds"]


def flag(p: argparse.ArgumentParser, *names: str, help: str) -> None:
    """``--name``: True when given, else False."""
    p.add_argument(*names, action="store_true", help=help)


def repeated(
    p: argparse.ArgumentParser,
    *names: str,
    help: str,
    metavar: str | None = None,
    type: Callable[[str], Any] | None = None,
    dest: str | None = None,
) -> None:
    """``--name X`` any number of times: the list of every ``X`` given (``[]``: none), each
    converted by ``type`` when one is given."""
    convert: dict[str, Any] = {} if type is None else {"type": type}
    p.add_argument(
        *names, action="append", default=[], metavar=metavar, dest=dest, help=help, **convert
    )


def seconds(
    p: argparse.ArgumentParser,
    name: str,
    default: float | None,
    help: str,
) -> None:
    """``--name S``: a float number of seconds (``default`` when not given)."""
    p.add_argument(name, type=float, default=default, help=help)
