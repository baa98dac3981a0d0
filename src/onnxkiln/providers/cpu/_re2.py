"""RE2 patterns run with Python's `re`: a small translation of the syntax that differs.

Translated so that matches agree with RE2 (what onnxruntime uses for RegexFullMatch):
- `\\d \\w \\b` (and negations) are ASCII-only in RE2: emitted as `(?a:...)` groups, and as
  ASCII ranges inside character classes; `\\s` is `[\\t\\n\\f\\r ]` (no `\\v`).
- `$` without the `m` flag matches only at the end of the text (Python's also before a final
  newline): emitted as `\\Z`. `\\z` -> `\\Z`; `\\Q...\\E` literals; `\\x{hex}`; `(?<name>`.
- POSIX classes `[[:alpha:]]` (ASCII) and Unicode general categories `\\pL`, `\\p{Lu}`,
  `\\PN`, `\\p{^L}`, `\\p{Any}`.
Known differences that remain: RE2 rejects backreferences, lookaround, atomic groups and
possessive quantifiers, which Python accepts; Unicode scripts (`\\p{Greek}`), `\\C`, the `U`
flag, flags set in mid-pattern and negated POSIX classes raise ValueError; `\\D \\W \\S`
inside a character class keep Python's Unicode meaning.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

import numpy as np

__all__ = ["compile_re2", "translate_re2"]

_POSIX = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9", "graph": "!-~", "lower": "a-z",
    "print": " -~", "punct": "!-/:-@\\[-`{-~", "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z",
    "word": "0-9A-Za-z_", "xdigit": "0-9A-Fa-f",
}  # fmt: skip
_OUTSIDE = {
    "d": r"(?a:\d)", "D": r"(?a:\D)", "w": r"(?a:\w)", "W": r"(?a:\W)", "b": r"(?a:\b)",
    "B": r"(?a:\B)", "s": "[\\t\\n\\f\\r ]", "S": "[^\\t\\n\\f\\r ]", "z": r"\Z",
}  # fmt: skip
_INSIDE = {"d": "0-9", "w": "0-9A-Za-z_", "s": "\\t\\n\\f\\r "}
_MULTILINE = re.compile(r"\(\?[a-zA-Z]*m[a-zA-Z-]*[:)]")


@functools.cache
def _categories() -> dict[str, str]:
    """Two-letter Unicode general category -> class body of `\\U` ranges (built once)."""
    names = list(map(unicodedata.category, map(chr, range(sys.maxunicode + 1))))
    kinds, codes = np.unique(np.array(names), return_inverse=True)
    starts = np.flatnonzero(np.diff(codes, prepend=-1))
    ends = np.append(starts[1:], len(codes)) - 1
    bodies: dict[str, list[str]] = {str(k): [] for k in kinds}
    for a, b, k in zip(starts.tolist(), ends.tolist(), codes[starts].tolist()):
        bodies[str(kinds[k])].append(_span(a, b))
    return {k: "".join(v) for k, v in bodies.items()}


def _span(a: int, b: int) -> str:
    return f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}"


def _category(name: str) -> str:
    """Class body for a general category name (L, Lu, N, ..., Any)."""
    if name == "Any":
        return _span(0, sys.maxunicode)
    cats = _categories()
    parts = [body for cat, body in sorted(cats.items()) if cat == name or cat[0] == name]
    if len(name) not in (1, 2) or not parts:
        raise ValueError(f"Unicode class \\p{{{name}}} is not supported (general categories only)")
    return "".join(parts)


def _property(p: str, i: int) -> tuple[str, bool, int]:
    """Parse the name after `\\p` / `\\P` at p[i:]: (category body, negated, next index)."""
    if i >= len(p):
        raise ValueError("\\p at the end of the pattern")
    if p[i] == "{":
        end = p.find("}", i)
        if end < 0:
            raise ValueError("missing } after \\p{")
        name, i = p[i + 1 : end], end + 1
    else:
        name, i = p[i], i + 1
    negated = name.startswith("^")
    return _category(name.lstrip("^")), negated, i


def _hex_escape(p: str, i: int) -> tuple[str, int]:
    """`\\x{...}` at p[i-2:] (i after 'x'): as `\\U` escape."""
    end = p.find("}", i)
    if end < 0:
        raise ValueError("missing } after \\x{")
    return f"\\U{int(p[i + 1 : end], 16):08x}", end + 1


def translate_re2(pattern: str) -> str:
    """The Python `re` pattern matching what RE2 matches for `pattern`."""
    p, out, i, n = pattern, [], 0, len(pattern)
    multiline = bool(_MULTILINE.search(p))
    in_class = False
    while i < n:
        c = p[i]
        if c == "\\":
            if i + 1 >= n:
                raise ValueError("trailing backslash")
            e = p[i + 1]
            i += 2
            if e == "Q":
                end = p.find("\\E", i)
                end = n if end < 0 else end
                out.append(re.escape(p[i:end]))
                i = end + 2
            elif e in "pP":
                body, neg, i = _property(p, i)
                neg ^= e == "P"
                if in_class:
                    if neg:
                        raise ValueError("negated \\p inside a character class is not supported")
                    out.append(body)
                else:
                    out.append(f"[{'^' if neg else ''}{body}]")
            elif e == "x" and i < n and p[i] == "{":
                esc, i = _hex_escape(p, i)
                out.append(esc)
            elif e == "C":
                raise ValueError("\\C (any byte) is not supported")
            elif in_class:
                out.append(_INSIDE.get(e, "\\" + e))
            else:
                out.append(_OUTSIDE.get(e, "\\" + e))
        elif in_class:
            if c == "]":
                in_class = False
                out.append(c)
                i += 1
            elif c == "[" and p.startswith("[:", i):
                end = p.find(":]", i + 2)
                name = p[i + 2 : end] if end > 0 else ""
                if name not in _POSIX:
                    raise ValueError(f"POSIX class [:{name}:] is not supported")
                out.append(_POSIX[name])
                i = end + 2
            else:
                out.append("\\" + c if c in "[&~|" else c)
                i += 1
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            if p.startswith("^", i):
                out.append("^")
                i += 1
            if p.startswith("]", i):  # a leading ] is literal
                out.append("\\]")
                i += 1
        elif c == "$" and not multiline:
            out.append(r"\Z")
            i += 1
        elif p.startswith("(?<", i) and not p.startswith(("(?<=", "(?<!"), i):
            out.append("(?P<")
            i += 3
        else:
            out.append(c)
            i += 1
    if in_class:
        raise ValueError("missing ] in character class")
    return "".join(out)


def compile_re2(pattern: str) -> re.Pattern[str]:
    """Compile an RE2 pattern for Python's `re` (ValueError or re.error if unsupported)."""
    return re.compile(translate_re2(pattern))
