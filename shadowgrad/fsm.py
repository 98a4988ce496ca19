"""The state machines' one piece of machinery: a ``(state, trigger) -> state`` table and a move.

A machine declares only its states and triggers (two enums) and its rules; :func:`rule` writes
one rule for several source states at once (the whole enum for "any state"), and a rule without
a target keeps each source where it is. :class:`TransitionTable` is the read-only mapping of
every allowed pair; :meth:`TransitionTable.move` is the one way to move, and a pair not in the
table raises the machine's own :class:`TransitionError` (a bug in the caller, never a wire
input). Users: the controller's job (:mod:`shadowgrad.controller.states`) and the shadow node's
lifecycle (:mod:`shadowgrad.shadow._state`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from enum import Enum
from typing import Generic, TypeVar

from .errors import ShadowgradError

__all__ = ["TransitionError", "TransitionTable", "rule"]

S = TypeVar("S", bound=Enum)
T = TypeVar("T", bound=Enum)


class TransitionError(ShadowgradError):
    """``trigger`` is not allowed in ``state`` (``allowed``: the triggers that are); each
    machine derives its own error from it and words it with :meth:`explain`."""

    def __init__(self, state: Enum, trigger: Enum, allowed: Iterable[Enum] = ()) -> None:
        self.state = state
        self.trigger = trigger
        self.allowed = tuple(allowed)
        super().__init__(self.explain())

    def explain(self) -> str:
        return f"{self.trigger.value!r} is not allowed in state {self.state.value!r}"


def rule(sources: S | Iterable[S], trigger: T, target: S | None = None) -> dict[tuple[S, T], S]:
    """``trigger`` moves each of ``sources`` (one state, several, or a whole enum for "any
    state") to ``target``; without ``target`` each source stays where it is."""
    states: Iterable[S] = (sources,) if isinstance(sources, Enum) else sources
    return {(s, trigger): s if target is None else target for s in states}


class TransitionTable(Mapping[tuple[S, T], S], Generic[S, T]):
    """Every allowed ``(state, trigger) -> new state`` of one machine, read-only; ``error``
    is the machine's exception for a pair not in it."""

    def __init__(
        self,
        rules: Iterable[Mapping[tuple[S, T], S]],
        error: type[TransitionError],
    ) -> None:
        table: dict[tuple[S, T], S] = {}
        for r in rules:
            for pair, new in r.items():
                if table.setdefault(pair, new) is not new:
                    raise ValueError(f"two rules for {pair}: {table[pair]} and {new}")
        self._table = table
        self._error = error

    def __getitem__(self, pair: tuple[S, T]) -> S:
        return self._table[pair]

    def __iter__(self) -> Iterator[tuple[S, T]]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def allowed(self, state: S) -> list[T]:
        """The triggers ``state`` allows, in the order of the rules."""
        return [t for (s, t) in self._table if s is state]

    def move(self, state: S, trigger: T) -> S:
        """The state ``trigger`` moves ``state`` to; the machine's error if none."""
        new = self._table.get((state, trigger))
        if new is None:
            raise self._error(state, trigger, self.allowed(state))
        return new
