"""Text kernels (providers/cpu/text.py, _re2.py): string ops and TfIdfVectorizer."""

from __future__ import annotations

import re

import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.providers.cpu._re2 import translate_re2
from onnxkiln.testing import assert_matches_ort, node_model

RNG = np.random.default_rng(3)


def check(op, feeds, inits=None, opset=20, n=1, **attrs):
    """Run one node on onnxkiln and onnxruntime and compare; returns onnxkiln's outputs."""
    model = node_model(op, feeds, n_outputs=n, opset=opset, initializers=inits, **attrs)
    return assert_matches_ort(model, feeds)


def ours(op, feeds, inits=None, opset=20, n=1, **attrs):
    """onnxkiln's outputs only (forms onnxruntime lacks or does differently, errors)."""
    model = node_model(op, feeds, n_outputs=n, opset=opset, initializers=inits, **attrs)
    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def S(*items, shape=None):
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out.reshape(shape if shape is not None else (len(items),))


def assert_strings(got, want):
    assert got.dtype == object and got.shape == want.shape, (got.shape, want.shape)
    assert got.tolist() == want.tolist()


# StringNormalizer: onnxruntime needs installed locales (this machine has none), so these
# compare with Python expressions.

WORDS = S("Monday", "tuesday", "MONDAY", "", "Straße", "Été", "ǅemal", "İzmir", "ΟΔΟΣ")


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("sensitive", [0, 1])
@pytest.mark.parametrize("stop", [None, ["monday", "été"], ["MONDAY", ""]])
@pytest.mark.parametrize("two_d", [False, True])
def test_string_normalizer(action, sensitive, stop, two_d):
    x = WORDS.reshape(1, -1) if two_d else WORDS
    attrs = {"case_change_action": action, "is_case_sensitive": sensitive}
    if stop is not None:
        attrs["stopwords"] = stop
    y = ours("StringNormalizer", {"x": x}, opset=10, **attrs)[0]
    keep = list(WORDS)
    if stop:
        if sensitive:
            keep = [w for w in keep if w not in stop]
        else:
            keep = [w for w in keep if w.lower() not in {s.lower() for s in stop}]
    change = {"NONE": str, "LOWER": str.lower, "UPPER": str.upper}[action]
    keep = [change(w) for w in keep] or [""]
    want = S(*keep, shape=(1, len(keep)) if two_d else (len(keep),))
    assert_strings(y, want)


def test_string_normalizer_unicode_and_empty_output():
    x = S("straße", "ǅ", "Σίσυφος ΟΔΟΣ")
    up = ours("StringNormalizer", {"x": x}, opset=10, case_change_action="UPPER")[0]
    assert up.tolist() == ["STRASSE", "Ǆ", "ΣΊΣΥΦΟΣ ΟΔΟΣ"]
    low = ours("StringNormalizer", {"x": x}, opset=10, case_change_action="LOWER",
               locale="tr_TR.UTF-8")[0]  # fmt: skip  (locale is ignored: Python's mapping)
    assert low.tolist() == ["straße", "ǆ", "σίσυφος οδος"]
    y = ours("StringNormalizer", {"x": S("a", "A", shape=(1, 2))}, opset=10, stopwords=["a"])[0]
    assert_strings(y, S("", shape=(1, 1)))
    y = ours("StringNormalizer", {"x": S("a", "A")}, opset=10, stopwords=["A", "a"],
             is_case_sensitive=1)[0]  # fmt: skip
    assert_strings(y, S(""))
    with pytest.raises(Exception, match=r"\[C\] or \[1, C\]"):
        ours("StringNormalizer", {"x": S("a", "b", "c", "d", shape=(2, 2))}, opset=10)


# StringSplit


@pytest.mark.parametrize("delimiter", [None, "", ",", "-", "<>", "ü"])
@pytest.mark.parametrize("maxsplit", [None, 0, 1, 2, -1])
def test_string_split_matches_ort(delimiter, maxsplit):
    # onnxruntime returns 0 pieces for "" with a delimiter, and only splits on " " when the
    # delimiter is empty; we follow Python's str.split (as onnx's reference), tested below.
    x = S("a,b,c", "a<>b<>c", "hello  world x", "  lead", "trail  ", "o-n--x-", "ü,üü",
          ",", "a", "a,,b", " a b  c ", "x  y ", shape=(3, 4))  # fmt: skip
    attrs = {}
    if delimiter is not None:
        attrs["delimiter"] = delimiter
    if maxsplit is not None:
        attrs["maxsplit"] = maxsplit
    check("StringSplit", {"x": x}, n=2, **attrs)


def test_string_split_python_semantics():
    x = S("", "a", "x\ty\u2003z\n", " ")
    y, z = ours("StringSplit", {"x": x}, n=2, delimiter=",")
    assert_strings(y, S("", "a", "x\ty\u2003z\n", " ", shape=(4, 1)))
    np.testing.assert_array_equal(z, [1, 1, 1, 1])
    assert z.dtype == np.int64
    y, z = ours("StringSplit", {"x": x}, n=2)
    assert_strings(y, S("", "", "", "a", "", "", "x", "y", "z", "", "", "", shape=(4, 3)))
    np.testing.assert_array_equal(z, [0, 1, 3, 0])


@pytest.mark.parametrize("shape", [(), (0,), (2, 0), (1, 1)])
def test_string_split_shapes(shape):
    x = np.full(shape, "a b", dtype=object)
    check("StringSplit", {"x": x}, n=2)


# StringConcat


@pytest.mark.parametrize(("xs", "ys"), [
    ((3,), (3,)), ((2, 3), (3,)), ((), ()), ((2, 1), (1, 4)), ((0, 2), (2,)), ((), (2, 2)),
])  # fmt: skip
def test_string_concat_matches_ort(xs, ys):
    pool = ["", "a", "bc", "日本", "ü", " ", "\u2603x"]
    x = np.empty(xs, object)
    x.reshape(-1)[:] = [pool[i % len(pool)] for i in range(x.size)]
    y = np.empty(ys, object)
    y.reshape(-1)[:] = [pool[(i * 3 + 1) % len(pool)] for i in range(y.size)]
    out = check("StringConcat", {"x": x, "y": y})[0]
    want = np.asarray(np.char.add(x.astype(str), y.astype(str)))
    assert out.tolist() == want.tolist()


# RegexFullMatch

REGEX_CASES = [
    (r"www\.[\w.-]+\.\bcom\b", ["www.google.com", "www.bbc.co.uk", "www.é.com", ""]),
    (r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)", ["a@gmail.com", "x@yahoo.com ", "@a.com"]),
    (r"a\d+", ["a1", "a\u0661", "a", "a12x"]),  # ARABIC-INDIC DIGIT ONE is not \d in RE2
    (r"(?i)\w+", ["abc", "é", "ÉÉ", "a_1"]),
    (r"(?i)é+", ["É", "éÉ", "e"]),
    (r"\s*x\s*", [" x\t", "\x0bx", "x\n"]),
    (r"a$\n?", ["a", "a\n"]),
    (r"a\z", ["a", "a\n"]),
    (r"[[:alpha:]][[:digit:]_]*", ["a1_", "é1", "1"]),
    (r"\pL+\PL", ["éa1", "ab", "日本!"]),
    (r"\p{Lu}[\p{Ll}\d]*", ["Ab1", "ab", "Éé"]),
    (r"\Qa.b\E+", ["a.bbb", "axb"]),
    (r"\x{263a}|[]x]", ["\u263a", "]", "x", "y"]),
    (r"(?P<q>['\"]).*", ["'abc", "x"]),
    (r"", ["", "a"]),
    (r"(?s).+", ["a\nb", ""]),
    (r"(?m)^a$", ["a", "a\n"]),
    (r"[^a-c]+", ["def", "dad", "\n"]),
]


@pytest.mark.parametrize(("pattern", "strings"), REGEX_CASES)
def test_regex_full_match_matches_ort(pattern, strings):
    check("RegexFullMatch", {"x": S(*strings)}, pattern=pattern)


@pytest.mark.parametrize("shape", [(0,), (2, 0), (), (2, 3)])
def test_regex_full_match_shapes(shape):
    x = np.full(shape, "ab", dtype=object)
    y = check("RegexFullMatch", {"x": x}, pattern="a.")[0]
    assert y.dtype == np.bool_ and y.shape == shape


@pytest.mark.parametrize("pattern", ["(a", r"\p{Greek}", "[[:^alpha:]]", "a[b"])
def test_regex_full_match_rejects_patterns(pattern):
    with pytest.raises(Exception, match="pattern|not supported|missing"):
        ours("RegexFullMatch", {"x": S("a")}, pattern=pattern)


def test_re2_translation():
    assert translate_re2(r"\d[\w]$") == r"(?a:\d)[0-9A-Za-z_]\Z"
    assert translate_re2("(?<n>a)[[a]") == r"(?P<n>a)[\[a]"
    assert re.fullmatch(translate_re2(r"[\s]+"), " \t\n") is not None


# TfIdfVectorizer

POOL_INTS = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7]  # 4 unigrams, 3 bigrams
POOL_STRS = ["two", "three", "five", "four", "five", "six", "seven", "eight", "six", "seven"]


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize(("lo", "hi"), [(1, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("skip", [0, 1, 5])
@pytest.mark.parametrize("weighted", [False, True])
def test_tfidf_int_pool_matches_ort(mode, lo, hi, skip, weighted):
    attrs = {"mode": mode, "min_gram_length": lo, "max_gram_length": hi, "max_skip_count": skip,
             "ngram_counts": [0, 4], "ngram_indexes": [0, 1, 2, 3, 4, 5, 6],
             "pool_int64s": POOL_INTS}  # fmt: skip
    if weighted:
        attrs["weights"] = [0.5, 1.5, 2.0, 1.0, 3.0, 0.25, 4.0]
    x = np.array([1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8, 2, 5, 6], np.int32)
    check("TfIdfVectorizer", {"x": x}, opset=9, **attrs)
    check("TfIdfVectorizer", {"x": x.reshape(3, 5).astype(np.int64)}, opset=9, **attrs)


def test_tfidf_string_pool_and_index_mapping():
    names = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
    ints = RNG.integers(1, 9, (4, 12))
    strs = np.vectorize(lambda i: names.get(i, "one"), otypes=[object])(ints)
    attrs = {"mode": "TFIDF", "min_gram_length": 1, "max_gram_length": 2, "max_skip_count": 2,
             "ngram_counts": [0, 4], "ngram_indexes": [6, 0, 5, 1, 4, 2, 3],
             "weights": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]}  # fmt: skip
    a = check("TfIdfVectorizer", {"x": strs}, opset=9, pool_strings=POOL_STRS, **attrs)[0]
    b = check("TfIdfVectorizer", {"x": ints}, opset=9, pool_int64s=POOL_INTS, **attrs)[0]
    np.testing.assert_array_equal(a, b)


def test_tfidf_trigrams_sparse_indexes_and_empty_level():
    attrs = {"mode": "TF", "min_gram_length": 1, "max_gram_length": 3, "max_skip_count": 1,
             "ngram_counts": [0, 0, 0], "ngram_indexes": [9, 2, 5, 7],
             "pool_int64s": [1, 2, 2, 1, 1, 2, 1, 1, 1, 2, 2, 2]}  # fmt: skip
    x = RNG.integers(1, 3, (3, 9)).astype(np.int64)
    y = check("TfIdfVectorizer", {"x": x}, opset=9, **attrs)[0]
    assert y.shape == (3, 10) and y.dtype == np.float32
    # numpy reference: count (a, b, c) windows with gap g in {1, 2}, over the trigram pool
    ref = np.zeros((3, 10), np.float32)
    grams = {tuple(attrs["pool_int64s"][i : i + 3]): attrs["ngram_indexes"][i // 3]
             for i in range(0, 12, 3)}  # fmt: skip
    for r in range(3):
        for g in (1, 2):
            for s in range(9 - 2 * g):
                key = (x[r, s], x[r, s + g], x[r, s + 2 * g])
                if key in grams:
                    ref[r, grams[key]] += 1
    np.testing.assert_array_equal(y, ref)


def test_tfidf_edge_inputs():
    attrs = {"mode": "TF", "min_gram_length": 1, "max_gram_length": 2, "max_skip_count": 0,
             "ngram_counts": [0, 4], "ngram_indexes": [0, 1, 2, 3, 4, 5, 6],
             "pool_int64s": POOL_INTS}  # fmt: skip
    y = check("TfIdfVectorizer", {"x": np.array([5], np.int64)}, opset=9, **attrs)[0]
    np.testing.assert_array_equal(y, [0, 0, 1, 0, 0, 0, 0])
    y = ours("TfIdfVectorizer", {"x": np.zeros((2, 0), np.int64)}, opset=9, **attrs)[0]
    assert y.shape == (2, 7) and not y.any()
    strs = S("", "é", "", "é", shape=(2, 2))
    y = check("TfIdfVectorizer", {"x": strs}, opset=9, mode="TF", min_gram_length=1,
              max_gram_length=2, max_skip_count=0, ngram_counts=[0, 2], ngram_indexes=[0, 1, 2],
              pool_strings=["", "é", "", "é"])[0]  # fmt: skip
    np.testing.assert_array_equal(y, [[1, 1, 1], [1, 1, 1]])
