"""com.microsoft BeamSearch (contrib_beam.py) over a tiny GPT-2 style decoder subgraph (and,
in the scan, a T5 style pair), against onnxruntime's CPU provider: sequences,
sequences_scores and the per-step scores."""

from __future__ import annotations

import _t5_pair
import numpy as np
import pytest
from _gpt_decoder import decoder_graph, scalar, search_model, with_outer_weights

from onnxkiln.errors import SessionError
from onnxkiln.testing import run_ort, run_ours

IDS = np.array([[5, 6, 7], [8, 9, 10]], np.int32)


def feeds(beams=3, returns=2, length_penalty=1.0, max_length=10, ids=IDS, **extra):
    # onnxruntime's kernel reads inputs up to repetition_penalty even when absent: pass them
    return {"input_ids": ids, "max_length": scalar(max_length), "min_length": scalar(1),
            "num_beams": scalar(beams), "num_return_sequences": scalar(returns),
            "length_penalty": scalar(length_penalty, np.float32),
            "repetition_penalty": scalar(1.0, np.float32), **extra}


def check(f, scores=True, model=None, **attrs):
    """Sequences equal, scores within 1e-4 (float32 sums of log-softmax over the steps).

    The per-step scores (scores=True) are compared over the steps onnxkiln ran: once every
    batch item is done onnxruntime leaves the later steps unwritten (onnxkiln writes 0)."""
    m = model or search_model("BeamSearch", f, n_outputs=3 if scores else 2, **attrs)
    ours, theirs = run_ours(m, f), run_ort(m, f)
    np.testing.assert_array_equal(ours[0], theirs[0])
    for i, (a, b) in enumerate(zip(ours[1:], theirs[1:]), 1):
        assert a.shape == b.shape and a.dtype == b.dtype
        if i == 2:
            ran = int((np.abs(a).reshape(a.shape[0], -1).max(axis=1) > 0).sum())
            a, b = a[:ran], b[:ran]
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    return ours


@pytest.mark.parametrize("eos", [30, 3, 4, 8, 10, 11, 12, 1])
@pytest.mark.parametrize("early", [0, 1])
def test_beam_search_matches(eos, early):
    check(feeds(), eos_token_id=eos, pad_token_id=0, early_stopping=early)


@pytest.mark.parametrize("eos", [4, 8, 10, 11])
@pytest.mark.parametrize("penalty,returns", [(2.0, 3), (1.0, 3), (0.5, 1)])
def test_beam_search_length_penalty(eos, penalty, returns):
    check(feeds(returns=returns, length_penalty=penalty), eos_token_id=eos, pad_token_id=2)


def test_beam_search_short_length_penalty():
    check(feeds(length_penalty=0.3), eos_token_id=8, pad_token_id=2)


@pytest.mark.parametrize("beams,returns", [(1, 1), (2, 1), (4, 4), (5, 2)])
def test_beam_search_widths(beams, returns):
    """One beam included: a done item's filler steps then follow its own past, as
    onnxruntime reorders no pasts for one beam."""
    check(feeds(beams, returns, max_length=9), eos_token_id=4, pad_token_id=0)


@pytest.mark.parametrize("extra,attrs", [
    ({"min_length": scalar(8)}, {}),
    ({"repetition_penalty": scalar(1.5, np.float32)}, {}),
    ({"vocab_mask": np.array([1] * 6 + [0] + [1] * 6, np.int32)}, {}),
    ({"prefix_vocab_mask": np.random.default_rng(2).integers(0, 2, (2, 13)).astype(np.int32)},
     {}),
    ({}, {"no_repeat_ngram_size": 2}),
    ({"attention_mask": np.array([[0, 1, 1], [1, 1, 1]], np.int32)}, {}),
], ids=["min_length", "repetition", "vocab_mask", "prefix_vocab_mask", "ngram", "mask"])
def test_beam_search_processors(extra, attrs):
    f = feeds()
    f.update(extra)
    check(f, eos_token_id=8, pad_token_id=0, **attrs)


def test_beam_search_other_decoder_and_init_decoder():
    f = feeds(ids=IDS[:1], max_length=14)
    check(f, eos_token_id=5, pad_token_id=0, decoder=decoder_graph(seed=9, layers=3),
          init_decoder=decoder_graph(seed=10, layers=3, name="init"))


def test_beam_search_decoder_reading_outer_scope_weights():
    f = feeds()
    m = with_outer_weights("BeamSearch", f, n_outputs=3, eos_token_id=3, pad_token_id=0)
    ours, theirs = run_ours(m, f), run_ort(m, f)
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-4)


def test_beam_search_beats_greedy_score():
    """The best beam's summed log-probability is at least the greedy path's."""
    f = feeds(beams=4, returns=1, length_penalty=0.0, ids=IDS[:1])
    best = run_ours(search_model("BeamSearch", f, n_outputs=2, eos_token_id=30,
                                 pad_token_id=0), f)[1][0, 0]
    one = run_ours(search_model("BeamSearch", feeds(1, 1, 0.0, ids=IDS[:1]), n_outputs=2,
                                eos_token_id=30, pad_token_id=0), feeds(1, 1, 0.0, ids=IDS[:1]))
    assert best >= one[1][0, 0] - 1e-6


@pytest.mark.parametrize("f,match", [
    (feeds(beams=2, returns=3), "num_return_sequences"),
    (feeds(beams=0, returns=1), "num_beams"),
    ({**feeds(), "num_beams": np.array([2, 2], np.int32)}, "one element"),
    (feeds(max_length=3), "greater than the input sequence length"),
])
def test_beam_search_refuses_bad_inputs(f, match):
    m = search_model("BeamSearch", f, eos_token_id=3, pad_token_id=0)
    with pytest.raises(SessionError, match=match):
        run_ours(m, f)


@pytest.mark.parametrize("batch,max_length", [(3, 9), (2, 12), (1, 9)])
@pytest.mark.parametrize("kind", ["gpt", "t5"])
def test_beam_search_done_check_scan(kind, batch, max_length):
    """Random settings over fixed seeds, every one equal to onnxruntime, exact ties included.
    A full batch item is done when its worst hypothesis scores at least best / cur **
    length_penalty (float32, powf), cur the length before the step, best the maximum of
    onnxruntime's flat (batch, 2 * beams) candidate scores over [b * beams, b * beams + 2 *
    beams): from item 1 on that window starts among the previous item's candidates."""
    for seed in range(108):
        rng = np.random.default_rng(seed)
        beams = int(rng.integers(1, 5))
        f = feeds(beams, int(rng.integers(1, beams + 1)),
                  float(rng.choice([1.0, 0.5, 2.0, 0.0, 1.3])), max_length,
                  rng.integers(1, 13, (batch, 3)).astype(np.int32),
                  min_length=scalar(int(rng.integers(0, 4))))
        attrs = {"eos_token_id": int(rng.integers(1, 13)), "pad_token_id": 0,
                 "early_stopping": int(rng.random() < 0.25)}
        if kind == "gpt":
            m = search_model("BeamSearch", f, n_outputs=3, graph=decoder_graph(seed=seed),
                             **attrs)
        else:
            m = _t5_pair.search_model("BeamSearch", f, n_outputs=3, graphs=_t5_pair.pair(seed),
                                      **attrs)
        check(f, model=m)
