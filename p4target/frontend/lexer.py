"""Preprocessor (``#include``, object-like ``#define``, conditionals) and lexer for P4_16.

The preprocessor works line by line on comment-stripped text and keeps each line's origin, so
every token carries the ``file:line:col`` of the text it came from (a macro's tokens carry the
location of its use).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .diagnostics import Diagnostic, Loc

BUILTIN_INCLUDE = Path(__file__).resolve().parent.parent / "p4include"

KEYWORDS = frozenset(
    {
        "action",
        "apply",
        "bit",
        "bool",
        "const",
        "control",
        "default",
        "else",
        "enum",
        "error",
        "exit",
        "extern",
        "false",
        "header",
        "header_union",
        "if",
        "in",
        "inout",
        "int",
        "match_kind",
        "out",
        "package",
        "parser",
        "return",
        "select",
        "state",
        "struct",
        "switch",
        "table",
        "transition",
        "true",
        "tuple",
        "typedef",
        "varbit",
        "void",
        "value_set",
        "type",
        "list",
        "abstract",
    }
)


@dataclass(frozen=True)
class Token:
    kind: str  # "id", "int", "str", "op", "eof"
    text: str
    loc: Loc
    value: int = 0
    width: int | None = None
    signed: bool = False

    def __repr__(self) -> str:
        return f"Token({self.kind},{self.text!r},{self.loc})"


_OPS = [
    "&&&",
    "|+|",
    "|-|",
    "++",
    "..",
    "<<",
    "&&",
    "||",
    "==",
    "!=",
    "<=",
    ">=",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "<",
    ">",
    ";",
    ":",
    ",",
    ".",
    "=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "&",
    "|",
    "^",
    "~",
    "!",
    "?",
    "@",
    "#",
]
_INT_BODY = r"(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|0[dD][0-9_]+|[0-9][0-9_]*)"
_TOKEN_RE = re.compile(
    r"(?P<ws>[ \t\r\f\v]+)"
    r"|(?P<int>(?:[0-9]+[ws])?" + _INT_BODY + r")"
    r"|(?P<id>[A-Za-z_][A-Za-z0-9_]*)"
    r'|(?P<str>"(?:[^"\\\n]|\\.)*")'
    r"|(?P<op>" + "|".join(re.escape(o) for o in _OPS) + ")"
)


def parse_int(text: str, loc: Loc) -> tuple[int, int | None, bool]:
    width: int | None = None
    signed = False
    m = re.match(r"([0-9]+)([ws])(.*)$", text)
    body = text
    if m and not text.lower().startswith(("0x", "0b", "0o", "0d")):
        width, signed, body = int(m.group(1)), m.group(2) == "s", m.group(3)
    b = body.replace("_", "")
    low = b.lower()
    try:
        if low.startswith("0x"):
            v = int(low[2:], 16)
        elif low.startswith("0b"):
            v = int(low[2:], 2)
        elif low.startswith("0o"):
            v = int(low[2:], 8)
        elif low.startswith("0d"):
            v = int(low[2:], 10)
        else:
            v = int(b, 10)
    except ValueError:
        raise Diagnostic(loc, f"malformed integer literal '{text}'") from None
    if width is not None:
        if width == 0 or width > 2048:
            raise Diagnostic(loc, f"invalid width {width} in literal '{text}'")
        if not signed and v >> width:
            raise Diagnostic(loc, f"value of '{text}' does not fit in bit<{width}>")
        if signed and v >= (1 << (width - 1)):
            raise Diagnostic(loc, f"value of '{text}' does not fit in int<{width}>")
    return v, width, signed


def _strip_comments(text: str, file: str) -> str:
    """Replace comments with spaces, keeping newlines (so line numbers stay right)."""
    out: list[str] = []
    i, n = 0, len(text)
    line = 1
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise Diagnostic(Loc(file, line, 1), "unterminated comment")
            chunk = text[i : j + 2]
            out.append("".join("\n" if ch == "\n" else " " for ch in chunk))
            line += chunk.count("\n")
            i = j + 2
        else:
            if c == "\n":
                line += 1
            out.append(c)
            i += 1
    return "".join(out)


class Preprocessor:
    """A small C preprocessor: enough for P4 programs (includes, guards, object-like and
    function-like macros; no ``#``/``##`` in macro bodies)."""

    def __init__(self, include_dirs: list[Path], virtual: dict[str, str] | None = None) -> None:
        self.include_dirs = [*include_dirs, BUILTIN_INCLUDE]
        self.virtual = virtual or {}
        self.macros: dict[str, list[Token]] = {}
        # function-like macros: name -> (parameters, body)
        self.fmacros: dict[str, tuple[list[str], list[Token]]] = {}
        self.tokens: list[Token] = []
        self.files: dict[str, str] = {}
        self.depth = 0

    def predefine(self, defines: dict[str, str]) -> None:
        """``-D NAME=VALUE`` definitions from the command line."""
        for name, value in defines.items():
            self.macros[name] = tokenize_line(value, Loc("<command line>", 1, 1), {})

    def run_file(self, path: Path, display: str | None = None) -> None:
        try:
            text = path.read_text()
        except OSError as e:
            raise Diagnostic(Loc(str(path), 0, 0), f"cannot read: {e.strerror}") from None
        self.run_text(text, display or str(path), path.parent)

    def run_text(self, text: str, file: str, base: Path | None) -> None:
        self.files[file] = text
        self.depth += 1
        if self.depth > 50:
            raise Diagnostic(Loc(file, 1, 1), "#include nested too deeply")
        text = _strip_comments(text, file)
        raw = text.split("\n")
        # conditional stack: (active, any_branch_taken, parent_active)
        cond: list[list[bool]] = []
        active = True
        i = 0
        while i < len(raw):
            lineno = i + 1
            s = raw[i]
            while s.endswith("\\") and i + 1 < len(raw):
                i += 1
                s = s[:-1] + " " + raw[i]
            i += 1
            st = s.lstrip()
            if not st.startswith("#"):
                if active and self.fmacros and _open_call(s, self.fmacros):
                    # a function-like macro's arguments go on over the next lines
                    while i < len(raw) and s.count("(") > s.count(")"):
                        if raw[i].lstrip().startswith("#"):
                            break
                        s = s + " " + raw[i]
                        i += 1
                if active and st:
                    tokenize_line(s, Loc(file, lineno, 1), self.macros, self.tokens, self.fmacros)
                continue
            col = len(s) - len(st) + 1
            loc = Loc(file, lineno, col)
            m = re.match(r"#\s*([A-Za-z_]+)\s*(.*)$", st)
            if not m:
                if active and st.strip() != "#":
                    raise Diagnostic(loc, "malformed preprocessor directive")
                continue
            d, rest = m.group(1), m.group(2).strip()
            if d in ("ifdef", "ifndef"):
                name = rest.split()[0] if rest else ""
                val = (name in self.macros or name in self.fmacros) == (d == "ifdef")
                cond.append([active and val, val, active])
                active = active and val
            elif d == "if":
                val = self._eval(rest, loc) if active else False
                cond.append([active and val, val, active])
                active = active and val
            elif d == "elif":
                if not cond:
                    raise Diagnostic(loc, "#elif without #if")
                top = cond[-1]
                val = (not top[1]) and top[2] and self._eval(rest, loc)
                top[0] = val
                top[1] = top[1] or val
                active = val
            elif d == "else":
                if not cond:
                    raise Diagnostic(loc, "#else without #if")
                top = cond[-1]
                top[0] = top[2] and not top[1]
                top[1] = True
                active = top[0]
            elif d == "endif":
                if not cond:
                    raise Diagnostic(loc, "#endif without #if")
                cond.pop()
                active = cond[-1][0] if cond else True
            elif not active:
                continue
            elif d == "define":
                mm = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(\(?)(.*)$", rest)
                if not mm:
                    raise Diagnostic(loc, "malformed #define")
                name, body = mm.group(1), mm.group(3)
                params: list[str] | None = None
                if mm.group(2):
                    pm = re.match(
                        r"\s*([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)?\s*\)", body
                    )
                    if not pm:
                        raise Diagnostic(loc, f"malformed parameter list of macro {name}")
                    params = [x.strip() for x in (pm.group(1) or "").split(",") if x.strip()]
                    if len(set(params)) != len(params):
                        raise Diagnostic(loc, f"duplicate parameter in macro {name}")
                    body = body[pm.end() :]
                bcol = col + len(st) - len(body)
                toks = tokenize_line(body, Loc(file, lineno, bcol), {})
                if any(t.text == "#" for t in toks):
                    raise Diagnostic(loc, "'#' and '##' in macro bodies are not supported")
                self.macros.pop(name, None)
                self.fmacros.pop(name, None)
                if params is None:
                    self.macros[name] = toks
                else:
                    self.fmacros[name] = (params, toks)
            elif d == "undef":
                self.macros.pop(rest.split()[0] if rest else "", None)
                self.fmacros.pop(rest.split()[0] if rest else "", None)
            elif d == "include":
                self._include(rest, loc, base)
            elif d == "error":
                raise Diagnostic(loc, f"#error {rest}")
            elif d in ("pragma", "line", "warning"):
                continue
            else:
                raise Diagnostic(loc, f"unknown preprocessor directive #{d}")
        if cond:
            raise Diagnostic(Loc(file, len(raw), 1), "unterminated #if")
        self.depth -= 1

    def _include(self, rest: str, loc: Loc, base: Path | None) -> None:
        m = re.match(r'(?:"([^"]+)"|<([^>]+)>)', rest)
        if not m:
            raise Diagnostic(loc, "malformed #include")
        name = m.group(1) or m.group(2)
        dirs = ([base] if m.group(1) and base is not None else []) + self.include_dirs
        for d in dirs:
            p = d / name
            shown = str(p) if d != BUILTIN_INCLUDE else name
            if shown in self.virtual:
                self.run_text(self.virtual[shown], shown, p.parent)
                return
            if p.is_file():
                self.run_file(p, shown)
                return
        raise Diagnostic(loc, f"cannot find include file '{name}'")

    def _eval(self, expr: str, loc: Loc) -> bool:
        e = re.sub(
            r"defined\s*\(\s*([A-Za-z_]\w*)\s*\)|defined\s+([A-Za-z_]\w*)",
            lambda m: (
                "1" if (m.group(1) or m.group(2)) in (self.macros.keys() | self.fmacros) else "0"
            ),
            expr,
        )

        def sub(m: re.Match[str]) -> str:
            toks = self.macros.get(m.group(0))
            if toks is None:
                return "0"
            return " ".join(t.text for t in toks) or "0"

        e = re.sub(r"[A-Za-z_]\w*", sub, e)
        e = e.replace("&&", " and ").replace("||", " or ").replace("!=", " != ")
        e = re.sub(r"!(?!=)", " not ", e)
        if not re.fullmatch(r"[\s0-9a-fA-FxX()<>=!+\-*/%andotr]*", e):
            raise Diagnostic(loc, f"cannot evaluate #if expression '{expr}'")
        try:
            return bool(eval(e, {"__builtins__": {}}, {}))  # restricted arithmetic only
        except Exception:
            raise Diagnostic(loc, f"cannot evaluate #if expression '{expr}'") from None


FMacros = dict[str, tuple[list[str], list[Token]]]


def _open_call(line: str, fmacros: FMacros) -> bool:
    """``line`` calls a function-like macro and leaves a parenthesis open."""
    if line.count("(") <= line.count(")"):
        return False
    return any(m.group(1) in fmacros for m in re.finditer(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(", line))


def tokenize_line(
    text: str,
    loc: Loc,
    macros: dict[str, list[Token]],
    out: list[Token] | None = None,
    fmacros: FMacros | None = None,
) -> list[Token]:
    res: list[Token] = [] if out is None else out
    if fmacros:
        res.extend(expand_tokens(tokenize_line(text, loc, {}), macros, fmacros, set()))
        return res
    pos = 0
    n = len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        tloc = Loc(loc.file, loc.line, loc.col + pos)
        if not m:
            raise Diagnostic(tloc, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        s = m.group(0)
        pos = m.end()
        if kind == "ws":
            continue
        if kind == "int":
            if pos < n and (text[pos].isalnum() or text[pos] == "_"):
                raise Diagnostic(tloc, f"malformed integer literal '{s}{text[pos]}...'")
            v, w, sg = parse_int(s, tloc)
            res.append(Token("int", s, tloc, v, w, sg))
        elif kind == "id" and s in macros:
            _expand(s, tloc, macros, res, set())
        else:
            res.append(Token(kind, s, tloc))
    return res


def _expand(
    name: str, loc: Loc, macros: dict[str, list[Token]], res: list[Token], active: set[str]
) -> None:
    if name in active:
        res.append(Token("id", name, loc))
        return
    for t in macros[name]:
        if t.kind == "id" and t.text in macros:
            _expand(t.text, loc, macros, res, active | {name})
        else:
            res.append(Token(t.kind, t.text, loc, t.value, t.width, t.signed))


def expand_tokens(
    toks: list[Token], macros: dict[str, list[Token]], fmacros: FMacros, active: set[str]
) -> list[Token]:
    """``toks`` with object-like and function-like macros expanded (the arguments of a call
    expanded first, the result scanned again; a macro is not expanded inside itself). Tokens
    from a macro body take the location of the use."""
    out: list[Token] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        name = t.text
        if t.kind != "id" or name in active:
            out.append(t)
            i += 1
            continue
        if name in macros:
            body = [Token(b.kind, b.text, t.loc, b.value, b.width, b.signed) for b in macros[name]]
            out.extend(expand_tokens(body, macros, fmacros, active | {name}))
            i += 1
            continue
        if name not in fmacros or i + 1 >= len(toks) or toks[i + 1].text != "(":
            out.append(t)
            i += 1
            continue
        args: list[list[Token]] = [[]]
        depth = 0
        j = i + 1
        while True:
            j += 1
            if j >= len(toks):
                raise Diagnostic(t.loc, f"unterminated call of macro {name}")
            a = toks[j]
            if a.text == ")" and depth == 0:
                break
            if a.text == "," and depth == 0:
                args.append([])
                continue
            depth += {"(": 1, ")": -1}.get(a.text, 0)
            args[-1].append(a)
        params, fbody = fmacros[name]
        if not params and args == [[]]:
            args = []
        if len(args) != len(params):
            raise Diagnostic(
                t.loc, f"macro {name} takes {len(params)} argument(s), {len(args)} given"
            )
        expanded = [expand_tokens(a, macros, fmacros, active) for a in args]
        sub: list[Token] = []
        for b in fbody:
            if b.kind == "id" and b.text in params:
                sub.extend(expanded[params.index(b.text)])
            else:
                sub.append(Token(b.kind, b.text, t.loc, b.value, b.width, b.signed))
        out.extend(expand_tokens(sub, macros, fmacros, active | {name}))
        i = j + 1
    return out


def lex(pp: Preprocessor) -> list[Token]:
    toks = list(pp.tokens)
    end = toks[-1].loc if toks else Loc("<input>", 1, 1)
    toks.append(Token("eof", "<end of input>", end))
    return toks
