"""Event names live in one module (shadowgrad.events): the library names every event it emits by
a constant there (never a literal), and every constant is emitted somewhere (AST scan)."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

from shadowgrad import events

ROOT = Path(__file__).resolve().parents[1]
#: the library's folders (tests, tools and bench only read events)
LIBRARY = ("shadowgrad", "shadow", "controller", "trainer_hooks", "bmv2_testbed")


def _files() -> list[Path]:
    return [p for d in LIBRARY for p in sorted((ROOT / d).rglob("*.py"))]


def _event_name_args() -> list[tuple[Path, int, ast.expr]]:
    """The name argument of every ``event(logger, name, ...)`` and ``self._note(name, ...)``."""
    out = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
            if name == "event" and len(node.args) >= 2:
                out.append((path, node.lineno, node.args[1]))
            elif name == "_note" and node.args:
                out.append((path, node.lineno, node.args[0]))
    return out


def _constants_used() -> set[str]:
    """Every ``events.NAME`` referenced in the library (outside the events module)."""
    used = set()
    for path in _files():
        if path == ROOT / "shadowgrad" / "events.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "events"
            ):
                used.add(node.attr)
    return used


def test_the_module_names_events_once_each() -> None:
    names = events.all_names()
    assert len(names) > 50
    assert len(set(names.values())) == len(names), "two constants name the same event"
    for const, value in names.items():
        assert re.fullmatch(r"[a-z]+(\.[a-z_]+)+", value), const
        assert value.split(".")[0] in {
            "control",
            "shadow",
            "controller",
            "restore",
            "export",
            "trainer",
        }
    for failed, retry in events.HOLD_EVENTS.values():
        assert failed in names.values() and retry in names.values()


def test_every_constant_has_a_docstring() -> None:
    tree = ast.parse((ROOT / "shadowgrad" / "events.py").read_text())
    body = tree.body
    documented = {
        a.targets[0].id
        for a, nxt in itertools.pairwise(body)
        if isinstance(a, ast.Assign)
        and isinstance(a.targets[0], ast.Name)
        and isinstance(nxt, ast.Expr)
        and isinstance(nxt.value, ast.Constant)
        and isinstance(nxt.value.value, str)
    }
    assert set(events.all_names()) <= documented


def test_the_library_names_no_event_by_a_literal() -> None:
    calls = _event_name_args()
    assert len(calls) > 60
    bad = []
    for path, line, arg in calls:
        for node in ast.walk(arg):
            if isinstance(node, ast.Constant | ast.JoinedStr):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {ast.unparse(arg)}")
    assert not bad, "event names must be shadowgrad.events constants:\n" + "\n".join(bad)


def test_every_event_emitted_is_in_the_module_and_every_constant_is_used() -> None:
    names = events.all_names()
    used = _constants_used()
    unknown = {u for u in used if u.isupper() and u not in names and u != "HOLD_EVENTS"}
    assert not unknown, f"events.{sorted(unknown)} do not exist"
    # the hold events are used through HOLD_EVENTS (by who runs the restore rule)
    assert "HOLD_EVENTS" in used
    via_table = {k for k, v in names.items() for pair in events.HOLD_EVENTS.values() if v in pair}
    unused = set(names) - used - via_table
    assert not unused, f"constants never emitted: {sorted(unused)}"
