"""com.microsoft NGramHashMapping and VarlenNGramHashMapping (contrib_ngram_hash.py) against
onnxruntime's CPU provider: hash ids bit for bit, history through past_ids/present_ids, eos
resets, segments, packed requests and state capture."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.errors import SessionError
from onnxkiln.testing import node_model, run_ort, run_ours

RNG = np.random.default_rng(23)
OP = "NGramHashMapping"
SEGMENTS = np.array([[0, 0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 1, 1, 3]], np.int32)


def case(b=2, length=7, n=3, heads=2, dtype=np.int64, past=False, offsets=False, eos=None,
         segments=False, mult_range=2 ** 20, negative=False, ids_range=50, **attrs):
    ids = RNG.integers(0, ids_range, (b, length)).astype(dtype)
    if eos is not None:
        ids[0, 2] = ids[1, 5] = eos
    mult = (RNG.integers(1, mult_range, n) * 2 + 1).astype(dtype)
    if negative:
        mult[1] = -mult[1]
    f = {"ids": ids, "m": mult, "v": RNG.integers(5, 1000, (n - 1) * heads).astype(dtype)}
    extra = {"p": RNG.integers(0, ids_range, (b, n - 1)).astype(dtype) if past else None,
             "o": RNG.integers(0, 100, (n - 1) * heads).astype(dtype) if offsets else None,
             "e": None if eos is None else np.array(eos, dtype),
             "s": SEGMENTS[:b, :length] if segments else None}
    names = ["ids", "m", "v"] + [k if v is not None else "" for k, v in extra.items()]
    while names[-1] == "":
        names.pop()
    f |= {k: v for k, v in extra.items() if v is not None}
    m = node_model(OP, f, n_outputs=2, domain="com.microsoft", input_names=names,
                   max_ngram_size=n, n_head_per_ngram=heads, pad_id=3, **attrs)
    return m, f


def check(m, f):
    for a, t in zip(run_ours(m, f), run_ort(m, f)):
        assert a.shape == t.shape and a.dtype == t.dtype
        np.testing.assert_array_equal(a, t)


@pytest.mark.parametrize("kw", [
    {}, {"n": 4, "heads": 3}, {"n": 2, "heads": 1}, {"past": True}, {"offsets": True},
    {"dtype": np.int32}, {"negative": True}, {"negative": True, "dtype": np.int32},
    {"mult_range": 2 ** 40},
])
def test_ngram_hash(kw):
    check(*case(**kw))


def test_ngram_hash_wraps_in_the_id_type():
    check(*case(dtype=np.int32, mult_range=2 ** 29, ids_range=2 ** 31 - 1))
    check(*case(dtype=np.int64, mult_range=2 ** 61, ids_range=2 ** 62))


@pytest.mark.parametrize("kw", [
    {"eos": 7}, {"eos": 7, "reset_on_eos": 1}, {"eos": 7, "reset_on_eos": 1, "past": True},
    {"segments": True}, {"segments": True, "eos": 7}, {"segments": True, "past": True},
    {"segments": True, "past": True, "eos": 7, "reset_on_eos": 1},
    {"segments": True, "eos": 7, "reset_on_eos": 1, "n": 4},
])
def test_ngram_hash_resets(kw):
    check(*case(**kw))


def test_ngram_hash_chunks_chain_through_present_ids():
    m, f = case(length=6)
    whole, _ = run_ours(m, f)
    first, present = run_ours(*_chunk(f, 0, 4, None))
    second, _ = run_ours(*_chunk(f, 4, 6, present))
    np.testing.assert_array_equal(np.concatenate([first, second], axis=1), whole)


def _chunk(f, lo, hi, past):
    feeds = {"ids": f["ids"][:, lo:hi], "m": f["m"], "v": f["v"]}
    names = ["ids", "m", "v"]
    if past is not None:
        feeds["p"] = past
        names.append("p")
    return node_model(OP, feeds, n_outputs=2, domain="com.microsoft", input_names=names,
                      max_ngram_size=3, n_head_per_ngram=2, pad_id=3), feeds


@pytest.mark.parametrize("attrs,match", [({"max_ngram_size": 1}, "at least|>= 2")])
def test_ngram_hash_refuses_attributes(attrs, match):
    f = {"ids": np.zeros((1, 3), np.int64), "m": np.ones(3, np.int64),
         "v": np.ones(2, np.int64)}
    m = node_model(OP, f, domain="com.microsoft", n_head_per_ngram=2, pad_id=0, **attrs)
    with pytest.raises(SessionError, match=match):
        run_ours(m, f)


def test_ngram_hash_refuses_zero_vocab():
    m, f = case()
    f["v"] = np.zeros_like(f["v"])
    with pytest.raises(SessionError, match="vocab_sizes must be positive"):
        run_ours(m, f)


# VarlenNGramHashMapping -----------------------------------------------------------------

VARLEN_SEGMENTS = np.array([0, 0, 1, 0, 0, 0, 1, 1, 2], np.int32)


def varlen_case(cu=(0, 3, 4, 9), n=3, heads=2, dtype=np.int64, past=False, eos=None,
                segments=False, past_segments=False, cap=0, counts=None, n_outputs=2, **attrs):
    t, b = cu[-1], len(cu) - 1
    ids = RNG.integers(0, 50, t).astype(dtype)
    if eos is not None:
        ids[1] = ids[6] = eos
    f = {"ids": ids, "m": (RNG.integers(1, 2 ** 20, n) * 2 + 1).astype(dtype),
         "v": RNG.integers(5, 1000, (n - 1) * heads).astype(dtype), "cu": np.array(cu, np.int32)}
    extra = {"p": RNG.integers(0, 50, (b, n - 1)).astype(dtype) if past else None, "o": None,
             "e": None if eos is None else np.array(eos, dtype),
             "s": VARLEN_SEGMENTS[:t] if segments else None,
             "ps": RNG.integers(0, 2, (b, n - 1)).astype(np.int32) if past_segments else None,
             "c": np.array(counts, np.int32) if counts is not None else None}
    names = ["ids", "m", "v", "cu"] + [k if v is not None else "" for k, v in extra.items()]
    while names[-1] == "":
        names.pop()
    f |= {k: v for k, v in extra.items() if v is not None}
    m = node_model("VarlenNGramHashMapping", f, n_outputs=n_outputs, domain="com.microsoft",
                   input_names=names, max_ngram_size=n, n_head_per_ngram=heads, pad_id=3,
                   state_update_capacity=cap, **attrs)
    return m, f


@pytest.mark.parametrize("kw", [
    {}, {"n": 4}, {"past": True}, {"dtype": np.int32}, {"eos": 7, "reset_on_eos": 1},
    {"eos": 7, "reset_on_eos": 1, "past": True}, {"segments": True, "n_outputs": 3},
    {"segments": True, "past": True, "n_outputs": 3},
    {"segments": True, "past_segments": True, "past": True, "n_outputs": 3},
    {"cap": 2, "counts": [1, 5, 3], "segments": True, "past": True, "n_outputs": 4},
    {"cap": 8, "counts": [0, 9, 1], "segments": True, "n_outputs": 4},
])
def test_varlen_ngram_hash(kw):
    check(*varlen_case(**kw))


def test_varlen_equals_ngram_hash_per_request():
    m, f = varlen_case(past=True)
    out, present = run_ours(m, f)
    for r, (lo, hi) in enumerate([(0, 3), (3, 4), (4, 9)]):
        feeds = {"ids": f["ids"][None, lo:hi], "m": f["m"], "v": f["v"], "p": f["p"][r:r + 1]}
        one = node_model(OP, feeds, n_outputs=2, domain="com.microsoft",
                         input_names=["ids", "m", "v", "p"], max_ngram_size=3,
                         n_head_per_ngram=2, pad_id=3)
        ids, pres = run_ours(one, feeds)
        np.testing.assert_array_equal(out[lo:hi], ids[0])
        np.testing.assert_array_equal(present[r], pres[0])


@pytest.mark.parametrize("kw,match", [
    ({"cu": (0, 3, 3, 9)}, "rise strictly"),
    ({"n_outputs": 3}, "present_segment_ids requires segment_ids"),
    ({"cap": 2, "segments": True, "n_outputs": 4}, "capture_count"),
])
def test_varlen_ngram_hash_refuses(kw, match):
    m, f = varlen_case(**kw)
    with pytest.raises(SessionError, match=match):
        run_ours(m, f)
