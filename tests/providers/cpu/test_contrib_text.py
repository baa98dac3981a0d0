"""com.microsoft Tokenizer (providers/cpu/contrib_text.py), against onnxruntime and sklearn."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.errors import SessionError
from onnxkiln.testing import assert_matches_ort, node_model

MS = "com.microsoft"


def S(*items, shape=None):
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out.reshape(shape if shape is not None else (len(items),))


def check(x, mark=0, pad_value="#", mincharnum=1, **attrs):
    """Tokenize x on onnxkiln and onnxruntime, assert equal; returns onnxkiln's output."""
    model = node_model("Tokenizer", {"x": x}, domain=MS, opset=17, mark=mark,
                       pad_value=pad_value, mincharnum=mincharnum, **attrs)
    return assert_matches_ort(model, {"x": x})[0]


TEXTS = S("a b  c", "dd", "", "  lead and trail  ", "日本 語 é", "x;y,z", "tab\there\nnl")


@pytest.mark.parametrize("mark", [0, 1])
@pytest.mark.parametrize("mincharnum", [1, 2, 3])
@pytest.mark.parametrize("separators", [[" "], [" ", ";", ","], [r"\s+"], ["[;,]", r"\s"],
                                        ["b", "ab"], ["a|ab", " "], [""], [" ", ""], ["x*"],
                                        ["(?i)X"]])
def test_separators(separators, mark, mincharnum):
    if separators == [""] and mincharnum > 1:
        pytest.skip("refused (test_bad_attributes)")
    check(TEXTS, mark=mark, mincharnum=mincharnum, separators=separators)


@pytest.mark.parametrize("mark", [0, 1])
@pytest.mark.parametrize("mincharnum", [1, 2])
@pytest.mark.parametrize("tokenexp", [r"\w+", r"[a-z]+", r"\b\w\w+\b", "a|ab", "o*", r"(b)(c)",
                                      r"[[:alpha:]]\d", r"[a-zA-Z0-9_]+|[^a-zA-Z0-9_\s]", r"\pL+",
                                      "a*?b?", ".", "(?i)B|bc", "(ab)+|a", "[|]|b c"])
def test_tokenexp(tokenexp, mark, mincharnum):
    if tokenexp == "." and mincharnum > 1:
        pytest.skip("refused (test_bad_attributes)")
    x = S("Hello world, foo-bar 12", "ab abc A1 b2", "", "oooh no", "héllo wörld", "bc xbcx")
    check(x, mark=mark, mincharnum=mincharnum, tokenexp=tokenexp)


def test_values_shapes_and_marks():
    y = check(S("a b  c", "dd"), separators=[" "])
    assert y.tolist() == [["a", "b", "c"], ["dd", "#", "#"]]
    y = check(S("a b  c", "dd"), mark=1, separators=[" "])
    assert y.tolist() == [["\x02", "a", "b", "c", "\x03"], ["\x02", "dd", "\x03", "#", "#"]]
    y = check(S("a b", "c", "", "x y z", shape=(2, 2)), separators=[" "])
    assert y.shape == (2, 2, 3) and y[1, 0].tolist() == ["#"] * 3
    # no token anywhere: width 0, no marks
    assert check(S("", "hello"), mark=1, mincharnum=6, separators=[" "]).shape == (2, 0)
    y = check(S("hello", "abcdefgh"), mark=1, mincharnum=6, separators=[" "])
    assert y.tolist() == [["\x02", "\x03", "#"], ["\x02", "abcdefgh", "\x03"]]
    # mincharnum counts characters, not UTF-8 bytes
    assert check(S("é", "aé"), mincharnum=2, separators=[" "]).tolist() == [["#"], ["aé"]]
    # separators are applied one after the other; leftmost-longest matches
    assert check(S("ab"), separators=["b", "ab"]).tolist() == [["a"]]
    assert check(S("xaby"), separators=["a|ab"]).tolist() == [["x", "y"]]
    assert check(S("ab"), tokenexp="a|ab").tolist() == [["ab"]]
    # an empty separator match drops the whole string
    assert check(S("axb cd"), separators=[" ", "x*"]).shape == (1, 0)


@pytest.mark.parametrize("shape", [(0,), (0, 2), (2, 0)])
def test_empty_input(shape):
    check(np.empty(shape, dtype=object), mark=1, separators=[" "])


def test_separators_win_over_tokenexp():
    assert check(S("Hello world"), separators=[" "], tokenexp="l").tolist() == [["Hello", "world"]]


def _session(**attrs):
    model = node_model("Tokenizer", {"x": S("a")}, domain=MS, opset=17, **attrs)
    return InferenceSession.builder().from_graph(model)


@pytest.mark.parametrize("attrs, words", [
    ({"mark": 0, "pad_value": "#", "mincharnum": 1}, "separators or tokenexp"),
    ({"mark": 0, "pad_value": "#", "mincharnum": 0, "separators": [" "]}, "mincharnum"),
    ({"mark": 0, "pad_value": "#", "mincharnum": 1, "tokenexp": ""}, "tokenexp"),
    ({"mark": 0, "pad_value": "#", "mincharnum": 1, "tokenexp": "("}, "not a valid regex"),
    ({"mark": 0, "pad_value": "#", "mincharnum": 1, "separators": ["("]}, "not a valid regex"),
    ({"mark": 0, "mincharnum": 1, "separators": [" "]}, "pad_value"),
    ({"mark": 0, "pad_value": "#", "mincharnum": 2, "separators": [""]}, "characters"),
    ({"mark": 0, "pad_value": "#", "mincharnum": 2, "tokenexp": "."}, "characters"),
])
def test_bad_attributes(attrs, words):
    with pytest.raises(SessionError, match=words):
        _session(**attrs).run({"x": S("a")})


@pytest.mark.parametrize("shape", [(), (1, 1, 1)])
def test_bad_rank(shape):
    model = node_model("Tokenizer", {"x": S("a")}, domain=MS, opset=17, mark=0, pad_value="#",
                       mincharnum=1, separators=[" "])
    model.graph.input[0].type.tensor_type.ClearField("shape")
    session = InferenceSession.builder().from_graph(model)
    with pytest.raises(SessionError, match=r"\[C\] or \[N, C\]"):
        session.run({"x": np.full(shape, "a", dtype=object)})


# skl2onnx's CountVectorizer and TfidfVectorizer pipelines, end to end

CORPUS = np.array([
    "The quick brown fox jumps over the lazy dog.",
    "Never jump over the lazy dog quickly!",
    "A fox, a dog; and THE cat: friends?",
    "dog dog dog fox",
    "",
    "Ünïcödé wörds and the brown cat",
], dtype=object)


def _vectorizers():
    from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

    return [
        (CountVectorizer(), None),
        (CountVectorizer(ngram_range=(1, 2)), None),
        (TfidfVectorizer(), None),
        (TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True), None),
        (CountVectorizer(), {"separators": [" ", r"\.", r"\?", ",", ";", ":", "!"]}),
        (TfidfVectorizer(), {"tokenexp": r"\b\w+\b"}),
    ]


def _without_normalizer(model):
    """The model with StringNormalizer as Identity: onnxruntime's needs installed locales
    (this machine has none), so it is fed text lowercased here instead."""
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for node in model.graph.node:
        if node.op_type == "StringNormalizer":
            node.op_type = "Identity"
            del node.attribute[:]
    return model


@pytest.mark.parametrize("index", range(6))
def test_skl2onnx_vectorizers(index):
    pytest.importorskip("skl2onnx")
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import StringTensorType

    from onnxkiln.testing import run_ort

    vec, options = _vectorizers()[index]
    vec.fit(CORPUS)
    model = to_onnx(vec, initial_types=[("text", StringTensorType([None, 1]))],
                    options={id(vec): options} if options else None, target_opset=17)
    assert any(n.op_type == "Tokenizer" for n in model.graph.node)
    ours = InferenceSession.builder().from_graph(model).run({"text": CORPUS.reshape(-1, 1)})[0]
    lower = np.array([t.lower() for t in CORPUS], dtype=object).reshape(-1, 1)
    theirs = run_ort(_without_normalizer(model), {"text": lower})[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert ours.sum() > 0
    if options is None and vec.ngram_range == (1, 1):
        # skl2onnx's token pattern is ASCII-only and keeps one-letter words (sklearn drops
        # them, which changes its n-grams): sklearn's unigrams agree on ASCII rows
        ascii_rows = [i for i, t in enumerate(CORPUS) if t.isascii()]
        want = vec.transform(CORPUS[ascii_rows]).toarray()
        np.testing.assert_allclose(ours[ascii_rows], want, rtol=1e-5, atol=1e-6)
