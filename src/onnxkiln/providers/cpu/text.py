"""CPU kernels: text (StringNormalizer, StringSplit, StringConcat, RegexFullMatch, TfIdfVectorizer).

Strings are object arrays of Python str. Case mapping uses Python's str methods (full Unicode
case mapping), never the machine's installed locales, so results do not depend on the host.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from onnxkiln.ops.attrs import attr_str
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu._re2 import compile_re2
from onnxkiln.providers.cpu.registry import kernel

_OBJ = np.dtype(object)


def _text(s: object) -> str:
    return s.decode("utf-8") if isinstance(s, (bytes, bytearray)) else str(s)


def _strings(x: np.ndarray) -> list[str]:
    """The elements of a string tensor as a flat list of str."""
    items = x.reshape(-1).tolist()
    if items and not all(type(s) is str for s in items):
        items = [_text(s) for s in items]
    return items


def _object_array(items: list, shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(items), dtype=_OBJ)
    out[:] = items
    return out.reshape(shape)


# StringNormalizer


@kernel("StringNormalizer", since=10, factory=True)
def string_normalizer(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """Drop stopwords, then lower- or upper-case ([C] or [1, C] input)."""
    action = (attr_str(info.attrs.get("case_change_action")) or "NONE").upper()
    if action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(
            f"StringNormalizer: case_change_action must be NONE, LOWER or UPPER, got {action!r}"
        )
    sensitive = bool(info.attrs.get("is_case_sensitive"))
    words = [attr_str(w) for w in info.attrs.get("stopwords") or ()]
    # `locale` is accepted and ignored: case mapping is Python's (locale-independent).
    stop = frozenset(words if sensitive else (w.lower() for w in words))
    change: Callable[[str], str] | None = {
        "LOWER": str.lower, "UPPER": str.upper, "NONE": None
    }[action]  # fmt: skip

    def run(x: np.ndarray) -> np.ndarray:
        if not (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1)):
            raise ValueError(
                f"StringNormalizer: input must have shape [C] or [1, C], got {list(x.shape)}"
            )
        items = _strings(x)
        if stop:
            if sensitive:
                items = [s for s in items if s not in stop]
            else:
                items = [s for s in items if s.lower() not in stop]
        if change is not None:
            items = [change(s) for s in items]
        if not items:
            items = [""]
        return _object_array(items, (len(items),) if x.ndim == 1 else (1, len(items)))

    return run


# StringSplit


@kernel(
    "StringSplit", since=20, factory=True, multi_output=True,
    capture=CaptureSupport.DATA_DEPENDENT_SHAPE,
)  # fmt: skip
def string_split(info: NodeInfo) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Split each string on `delimiter` (whitespace runs when empty); pad with ""."""
    delimiter = attr_str(info.attrs.get("delimiter")) or None
    maxsplit = info.attrs.get("maxsplit")
    limit = -1 if maxsplit is None or maxsplit < 0 else int(maxsplit)

    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if delimiter is None:  # whitespace runs; leading and trailing whitespace dropped
            parts = [s.strip().split(None, limit) for s in _strings(x)]
        else:
            parts = [s.split(delimiter, limit) for s in _strings(x)]
        counts = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        width = int(counts.max()) if counts.size else 0
        out = np.full((len(parts), width), "", dtype=_OBJ)
        for row, p in zip(out, parts):
            row[: len(p)] = p
        return out.reshape(*x.shape, width), counts.reshape(x.shape)

    return run


# StringConcat


@kernel("StringConcat", since=20)
def string_concat(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Elementwise concatenation with numpy broadcasting."""
    out = np.add(x.astype(_OBJ, copy=False), y.astype(_OBJ, copy=False), dtype=_OBJ)
    return np.asarray(out, dtype=_OBJ)


# RegexFullMatch


@kernel("RegexFullMatch", since=20, factory=True)
def regex_full_match(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """True where the whole string matches the RE2 `pattern` (run with Python's `re`)."""
    pattern = attr_str(info.attrs.get("pattern"))
    if pattern is None:
        raise ValueError("RegexFullMatch: the 'pattern' attribute is required")
    try:
        fullmatch = compile_re2(pattern).fullmatch
    except (re.error, ValueError) as e:
        raise ValueError(f"RegexFullMatch: invalid pattern {pattern!r}: {e}") from None

    def run(x: np.ndarray) -> np.ndarray:
        items = _strings(x)
        found = [fullmatch(s) is not None for s in items]
        return np.fromiter(found, dtype=np.bool_, count=len(items)).reshape(x.shape)

    return run


# TfIdfVectorizer


def _grams(
    info: NodeInfo,
) -> tuple[dict, list[tuple[int, dict[tuple, int]]], int, bool]:
    """(token -> id, [(n, gram-of-ids -> output index)], output size, string pool?)."""
    a = info.attrs
    counts = [int(c) for c in a.get("ngram_counts") or ()]
    indexes = [int(i) for i in a.get("ngram_indexes") or ()]
    strings = a.get("pool_strings")
    ints = a.get("pool_int64s")
    if (strings is None) == (ints is None):
        raise ValueError("TfIdfVectorizer: exactly one of pool_strings and pool_int64s is needed")
    pool = [attr_str(s) for s in strings] if strings is not None else [int(v) for v in ints]
    vocab: dict = {}
    ids = [vocab.setdefault(t, len(vocab)) for t in pool]
    levels: list[tuple[int, dict[tuple, int]]] = []
    k = 0
    for level, start in enumerate(counts):
        n = level + 1
        stop = counts[level + 1] if level + 1 < len(counts) else len(pool)
        if (stop - start) % n or stop < start:
            raise ValueError(
                f"TfIdfVectorizer: pool entries {start}..{stop} do not hold whole {n}-grams"
            )
        table: dict[tuple, int] = {}
        for p in range(start, stop, n):
            if k >= len(indexes):
                raise ValueError(
                    f"TfIdfVectorizer: ngram_indexes has {len(indexes)} entries, fewer than "
                    "the n-grams in the pool"
                )
            gram = tuple(ids[p : p + n])
            if gram in table:
                raise ValueError(f"TfIdfVectorizer: the pool repeats the {n}-gram {pool[p:p + n]}")
            table[gram] = indexes[k]
            k += 1
        levels.append((n, table))
    size = max(indexes) + 1 if indexes else 0
    return vocab, levels, size, strings is not None


@kernel("TfIdfVectorizer", since=9, factory=True)
def tfidf_vectorizer(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """Counts of pooled n-grams (with skips) per row, weighted by mode TF, IDF or TFIDF."""
    a = info.attrs
    mode = attr_str(a.get("mode"))
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"TfIdfVectorizer: mode must be TF, IDF or TFIDF, got {mode!r}")
    lo, hi = int(a["min_gram_length"]), int(a["max_gram_length"])
    max_skip = int(a["max_skip_count"])
    if not 1 <= lo <= hi or max_skip < 0:
        raise ValueError(
            f"TfIdfVectorizer: need 1 <= min_gram_length <= max_gram_length and "
            f"max_skip_count >= 0, got {lo}, {hi}, {max_skip}"
        )
    vocab, levels, size, string_pool = _grams(info)
    weights = a.get("weights")
    w = None
    if weights is not None and mode != "TF":  # weights[i] scales the i-th pooled n-gram
        w = np.ones(size, dtype=np.float32)
        flat_idx = [int(i) for i in a["ngram_indexes"]][: len(weights)]
        w[flat_idx] = np.asarray(weights, dtype=np.float32)[: len(flat_idx)]
    n_vocab = len(vocab) + 1  # id len(vocab) stands for "not in the pool"
    # Encode each pooled n-gram of ids as one integer (base n_vocab) for vectorised lookups.
    tables = []
    for n, table in levels:
        if n < lo or n > hi or not table:
            continue
        if n_vocab ** n >= 1 << 62:
            raise ValueError(f"TfIdfVectorizer: {n}-grams over {n_vocab} tokens are too many")
        keys = np.array(
            [sum(t * n_vocab**j for j, t in enumerate(g)) for g in table], dtype=np.int64
        )
        vals = np.fromiter(table.values(), dtype=np.int64, count=len(table))
        order = np.argsort(keys)
        tables.append((n, keys[order], vals[order]))

    unknown = len(vocab)
    if not string_pool:  # ints: a sorted table, looked up with searchsorted
        pool_keys = np.array(sorted(vocab), dtype=np.int64)
        pool_ids = np.array([vocab[v] for v in pool_keys.tolist()] + [unknown], dtype=np.int64)

    def encode(x: np.ndarray) -> np.ndarray:
        if string_pool:
            if x.dtype != _OBJ and x.dtype.kind not in "US":
                raise ValueError(f"TfIdfVectorizer: pool_strings needs string input, got {x.dtype}")
            items = _strings(x)
            get = vocab.get
            ids = np.fromiter((get(t, unknown) for t in items), np.int64, len(items))
            return ids.reshape(x.shape)
        if x.dtype.kind not in "iu":
            raise ValueError(f"TfIdfVectorizer: pool_int64s needs int input, got {x.dtype}")
        v = x.astype(np.int64, copy=False)
        pos = np.searchsorted(pool_keys, v)
        found = pos < len(pool_keys)
        found[found] = pool_keys[pos[found]] == v[found]
        return np.where(found, pool_ids[pos], unknown)

    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim not in (1, 2):
            raise ValueError(f"TfIdfVectorizer: input must be 1-D or 2-D, got {list(x.shape)}")
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        ids = encode(rows)
        n_rows, width = ids.shape
        counts = np.zeros((n_rows, size), dtype=np.float32)
        for n, keys, vals in tables:
            for skip in range(max_skip + 1 if n > 1 else 1):
                span = (n - 1) * (skip + 1)
                if span >= width:
                    break
                starts = width - span
                key = np.zeros((n_rows, starts), dtype=np.int64)
                for j in range(n):
                    off = j * (skip + 1)
                    key += ids[:, off : off + starts] * (n_vocab**j)
                pos = np.searchsorted(keys, key)
                pos[pos == len(keys)] = 0
                hit = keys[pos] == key
                r, _ = np.nonzero(hit)
                np.add.at(counts, (r, vals[pos[hit]]), 1.0)
        if mode == "IDF":
            np.minimum(counts, 1.0, out=counts)
        if w is not None:
            counts *= w
        return counts.reshape(size) if x.ndim == 1 else counts

    return run
