"""CPU kernels: onnxruntime's com.microsoft Tokenizer (what skl2onnx writes for text vectorizers).

Patterns are RE2 run through `_re2`'s translation, with RE2's leftmost-longest matching
(onnxruntime compiles them with `longest_match`): Python's `re` finds the leftmost start; a
top-level alternation takes its longest alternative there; only a pattern that can match
several lengths in other ways (a nested `|`, a lazy quantifier, a repeated group) has its
longest end searched end by end (slow on long texts). A `$` or `\\b` tested at a shorter end
of the text may then match where RE2's would not.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from onnxkiln.ops.attrs import attr_str
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._re2 import compile_re2
from onnxkiln.providers.cpu.registry import kernel
from onnxkiln.providers.cpu.text import _object_array, _strings

MS = "com.microsoft"
_START, _END = "\x02", "\x03"
_AMBIGUOUS = re.compile(r"\||[*+?}]\?|\)[*+?{]")
_FLAGS = re.compile(r"\(\?[a-zA-Z]+\)")


def _alternatives(pattern: str) -> list[str]:
    """pattern split at its top-level `|` (outside groups and classes)."""
    parts, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 1
        elif in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "^":
                i += 1
            if pattern[i + 1:i + 2] == "]":
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    return [*parts, pattern[start:]]


def _ambiguous(pattern: str) -> bool:
    return bool(_AMBIGUOUS.search(re.sub(r"\\.", "", pattern)))


class _Longest:
    """Leftmost-longest search with one compiled RE2 pattern."""

    def __init__(self, pattern: str, what: str):
        try:
            self.rx = compile_re2(pattern)
        except (re.error, ValueError) as e:
            raise ValueError(f"Tokenizer: {what} {pattern!r} is not a valid regex: {e}") from e
        flags = _FLAGS.match(pattern)
        prefix = flags.group() if flags else ""
        parts = _alternatives(pattern[len(prefix):])
        self.parts = None
        if len(parts) > 1 and not any(map(_ambiguous, parts)):
            self.parts = [compile_re2(prefix + p) for p in parts]
        self.ambiguous = self.parts is None and _ambiguous(pattern)

    def search(self, text: str, pos: int) -> tuple[int, int] | None:
        m = self.rx.search(text, pos)
        if m is None:
            return None
        start, end = m.span()
        if self.parts is not None:
            for part in self.parts:
                got = part.match(text, start)
                if got is not None and got.end() > end:
                    end = got.end()
        elif self.ambiguous:
            fullmatch = self.rx.fullmatch
            for e in range(len(text), end, -1):
                if fullmatch(text, start, e):
                    return start, e
        return start, end


def _split(pieces: list[str], sep: _Longest) -> list[str] | None:
    """Each piece split at every match of sep; None when sep matches empty (onnxruntime then
    drops the whole string's tokens)."""
    out = []
    for text in pieces:
        pos = 0
        while (span := sep.search(text, pos)) is not None:
            start, end = span
            if start == end:
                return None
            if start > pos:
                out.append(text[pos:start])
            pos = end
        if pos < len(text):
            out.append(text[pos:])
    return out


def _matches(text: str, exp: _Longest) -> list[str]:
    """The non-empty leftmost-longest matches of exp, left to right."""
    out, pos = [], 0
    while pos <= len(text) and (span := exp.search(text, pos)) is not None:
        start, end = span
        if start == end:
            pos = end + 1
            continue
        out.append(text[start:end])
        pos = end
    return out


@kernel("Tokenizer", since=1, domain=MS, factory=True)
def tokenizer(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """Strings [C] or [N, C] to their tokens [.., max_tokens], short rows padded with pad_value;
    `mark` adds start (0x02) and end (0x03) marks around each row's tokens."""
    attrs = info.attrs
    for name in ("mark", "pad_value", "mincharnum"):
        if name not in attrs:
            raise ValueError(f"Tokenizer: required attribute {name!r} is missing")
    mark = bool(attrs["mark"])
    pad = attr_str(attrs["pad_value"])
    mincharnum = int(attrs["mincharnum"])
    if mincharnum <= 0:
        raise ValueError(f"Tokenizer: mincharnum must be positive, got {mincharnum}")
    separators = [attr_str(s) for s in attrs.get("separators") or ()]
    tokenexp = attrs.get("tokenexp")
    tokenexp = None if tokenexp is None or separators else attr_str(tokenexp)
    if not separators and tokenexp is None:
        raise ValueError("Tokenizer: one of the attributes separators or tokenexp is required")
    if tokenexp == "":
        raise ValueError("Tokenizer: tokenexp must not be empty")
    chars = separators == [""] or tokenexp == "."  # onnxruntime splits into characters
    if chars and mincharnum > 1:
        raise ValueError("Tokenizer: mincharnum must be 1 to split into characters")
    if chars:
        seps, exp = [], None
    elif separators:
        seps, exp = [_Longest(s, "separator") for s in separators], None
    else:
        seps, exp = [], _Longest(tokenexp, "tokenexp")

    def tokens(text: str) -> list[str]:
        if chars:
            return list(text)
        if exp is None:
            found: list[str] | None = [text]
            for sep in seps:
                found = _split(found, sep)
                if found is None:
                    return []
        else:
            found = _matches(text, exp)
        return [t for t in found if len(t) >= mincharnum]

    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim not in (1, 2):
            raise ValueError(
                f"Tokenizer: input must have shape [C] or [N, C], got {list(x.shape)}"
            )
        if x.size == 0:
            return np.empty(x.shape[:1] if x.ndim == 1 else (x.shape[0], 0), dtype=object)
        rows = [tokens(s) for s in _strings(x)]
        width = max(map(len, rows))
        if width and mark:
            rows = [[_START, *r, _END] for r in rows]
            width += 2
        flat = [t for r in rows for t in (*r, *[pad] * (width - len(r)))]
        return _object_array(flat, (*x.shape, width))

    return run
