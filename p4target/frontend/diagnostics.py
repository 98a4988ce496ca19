"""Source locations and diagnostics (``file:line:col: message``) shared by the front end."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Loc:
    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


NOLOC = Loc("<builtin>", 0, 0)


class Diagnostic(Exception):  # noqa: N818 (a located message, raised internally)
    """One located error; the front end collects these into ``P4CompileError``."""

    def __init__(self, loc: Loc, message: str) -> None:
        self.loc = loc
        self.message = message
        super().__init__(f"{loc}: {message}")

    def __str__(self) -> str:
        return f"{self.loc}: {self.message}"
