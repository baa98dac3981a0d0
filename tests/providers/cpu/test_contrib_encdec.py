"""com.microsoft BeamSearch and GreedySearch with model_type 1 (a T5/BART style encoder and
decoder subgraph pair, contrib_encdec.py) against onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np
import pytest
from _gpt_decoder import scalar
from _t5_pair import pair, search_model

from onnxkiln.errors import SessionError
from onnxkiln.testing import run_ort, run_ours

# row 0 ends in the pad id (visible to the encoder), row 1 starts with it (masked)
IDS = np.array([[5, 6, 7, 0], [0, 9, 10, 11]], np.int32)


def feeds(beams=3, returns=2, length_penalty=1.0, max_length=8, min_length=1, ids=IDS, **extra):
    # onnxruntime's kernel reads inputs up to repetition_penalty even when absent: pass them
    return {"input_ids": ids, "max_length": scalar(max_length), "min_length": scalar(min_length),
            "num_beams": scalar(beams), "num_return_sequences": scalar(returns),
            "length_penalty": scalar(length_penalty, np.float32),
            "repetition_penalty": scalar(1.0, np.float32), **extra}


def check(f, graphs=None, **attrs):
    """Sequences equal, sequences_scores within 1e-4 (float32 sums of log-softmax)."""
    attrs.setdefault("pad_token_id", 0)
    m = search_model("BeamSearch", f, n_outputs=2, graphs=graphs, **attrs)
    ours, theirs = run_ours(m, f), run_ort(m, f)
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert ours[1].shape == theirs[1].shape and ours[1].dtype == theirs[1].dtype
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-4)
    return ours


@pytest.mark.parametrize("eos", [4, 11, 6, 30])
@pytest.mark.parametrize("beams,returns", [(1, 1), (3, 2), (3, 3)])
def test_beam_search_t5_matches(eos, beams, returns):
    out = check(feeds(beams, returns), eos_token_id=eos)
    assert out[0].shape == (2, returns, 8)
    assert (out[0][:, :, 0] == 1).all()  # sequences start with decoder_start_token_id


@pytest.mark.parametrize("penalty", [0.5, 2.0])
@pytest.mark.parametrize("eos", [4, 11])
def test_beam_search_t5_length_penalty(penalty, eos):
    check(feeds(3, 3, length_penalty=penalty), eos_token_id=eos, pad_token_id=2)


@pytest.mark.parametrize("min_length", [1, 4, 7])
def test_beam_search_t5_min_length(min_length):
    check(feeds(min_length=min_length), eos_token_id=11, pad_token_id=2)


@pytest.mark.parametrize("early", [0, 1])
def test_beam_search_t5_early_stopping_and_start_token(early):
    check(feeds(), eos_token_id=4, early_stopping=early, decoder_start_token_id=7)


def test_beam_search_t5_explicit_mask_and_repetition():
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], np.int32)
    f = feeds(attention_mask=mask)
    f["repetition_penalty"] = scalar(1.7, np.float32)
    check(f, eos_token_id=11)


def test_beam_search_t5_decoder_without_hidden_states():
    check(feeds(), graphs=pair(seed=3, hidden=False), eos_token_id=4)


@pytest.mark.parametrize("beams", [1, 2, 4])
def test_beam_search_t5_wider_model(beams):
    """Three layers and heads, three batch items: the cross keys/values stay with their
    batch item while the self pasts follow the beams. eos is never produced, so every
    sequence runs to max_length."""
    graphs = pair(seed=5, vocab=17, d=12, heads=3, layers=3)
    ids = np.array([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0], [0, 0, 1, 2, 3]], np.int32)
    check(feeds(beams, min(beams, 2), ids=ids, max_length=10), graphs=graphs, eos_token_id=30)


@pytest.mark.parametrize("eos", [4, 11, 6, 30, 5])
@pytest.mark.parametrize("min_length", [1, 4])
def test_greedy_search_t5(eos, min_length):
    """onnxruntime's CPU GreedySearch refuses model_type 1; its BeamSearch with one beam and
    early_stopping makes the same choices (argmax, eos then pad), so it is the oracle."""
    ids = np.array([[5, 6, 7, 0], [0, 9, 10, 11], [3, 3, 3, 3]], np.int32)
    g = {"input_ids": ids, "max_length": scalar(9), "min_length": scalar(min_length),
         "repetition_penalty": scalar(1.0, np.float32)}
    ours = run_ours(search_model("GreedySearch", g, eos_token_id=eos, pad_token_id=2), g)[0]
    f = feeds(1, 1, max_length=9, min_length=min_length, ids=ids)
    beam = search_model("BeamSearch", f, n_outputs=1, eos_token_id=eos, pad_token_id=2,
                        early_stopping=1)
    np.testing.assert_array_equal(ours, run_ort(beam, f)[0][:, 0])


def test_greedy_search_t5_refuses_ort_form_cleanly():
    g = {"input_ids": IDS, "max_length": scalar(1)}
    with pytest.raises(SessionError, match="max_length"):
        run_ours(search_model("GreedySearch", g, eos_token_id=4, pad_token_id=0), g)


def test_t5_refusals():
    f = feeds()
    tokens = {"eos_token_id": 4, "pad_token_id": 0}
    with pytest.raises(SessionError, match="decoder_start_token_id"):
        run_ours(search_model("BeamSearch", f, start=-1, **tokens), f)
    enc, dec = pair()
    del enc.output[-1]
    with pytest.raises(SessionError, match="encoder subgraph"):
        run_ours(search_model("BeamSearch", f, graphs=(enc, dec), **tokens), f)
    enc, dec = pair()
    del dec.output[-1]
    with pytest.raises(SessionError, match="decoder subgraph"):
        run_ours(search_model("BeamSearch", f, graphs=(enc, dec), **tokens), f)
    with pytest.raises(SessionError, match="Required attribute 'pad_token_id'"):
        run_ours(search_model("BeamSearch", f, eos_token_id=4), f)


def test_t5_pair_as_model_type_2_refused():
    """model_type 2 reads the pair as Whisper's: a T5 encoder (three inputs) is refused, as
    onnxruntime refuses it."""
    f = feeds()
    m = search_model("BeamSearch", f, eos_token_id=4, pad_token_id=0)
    m.graph.node[0].attribute[[a.name for a in m.graph.node[0].attribute].index("model_type")].i = 2
    with pytest.raises(Exception, match="ONNXRuntimeError"):
        run_ort(m, f)
    with pytest.raises(SessionError, match="encoder_input_ids and decoder_input_ids"):
        run_ours(m, f)
