"""com.microsoft GreedySearch and Sampling (contrib_generation.py) over a tiny GPT-2 style
decoder subgraph, against onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np
import pytest
from _gpt_decoder import decoder_graph, scalar, search_model, with_outer_weights

from onnxkiln.errors import SessionError
from onnxkiln.testing import run_ort, run_ours

IDS = np.array([[5, 6, 7], [8, 9, 10]], np.int32)
BASE = {"input_ids": IDS, "max_length": scalar(12)}


def assert_sequences_match(model, feeds, pad: int) -> np.ndarray:
    """Equal to onnxruntime up to the last column where some row still generates: once every
    row has finished, onnxruntime stops and leaves the rest of its output unwritten (not
    pad: it reads back as arbitrary values), where onnxkiln writes pad_token_id."""
    ours, theirs = run_ours(model, feeds)[0], run_ort(model, feeds)[0]
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    live = np.nonzero((ours != pad).any(axis=0))[0]
    stop = int(live.max()) + 1 if live.size else ours.shape[1]
    np.testing.assert_array_equal(ours[:, :stop], theirs[:, :stop])
    assert (ours[:, stop:] == pad).all()
    return ours


@pytest.mark.parametrize("eos,pad", [(3, 0), (8, 0), (4, 1), (11, 1), (10, 0)])
def test_greedy_eos_becomes_pad(eos, pad):
    m = search_model("GreedySearch", BASE, eos_token_id=eos, pad_token_id=pad)
    out = assert_sequences_match(m, BASE, pad)
    assert not (out[:, 3:] == eos).any()


@pytest.mark.parametrize("extra,attrs", [
    ({"min_length": scalar(9)}, {"eos_token_id": 10}),
    ({"repetition_penalty": scalar(1.7, np.float32)}, {}),
    ({"repetition_penalty": scalar(0.6, np.float32)}, {}),
    ({"vocab_mask": np.array([1] * 4 + [0] + [1] * 3 + [0, 1, 0, 1, 1], np.int32)}, {}),
    ({"prefix_vocab_mask": np.random.default_rng(1).integers(0, 2, (2, 13)).astype(np.int32)},
     {}),
    ({}, {"no_repeat_ngram_size": 2}),
    ({}, {"no_repeat_ngram_size": 3}),
    ({"max_length": scalar(9)}, {"no_repeat_ngram_size": 1}),
    ({}, {"vocab_size": 13}),
], ids=["min_length", "repetition", "repetition_below_1", "vocab_mask", "prefix_vocab_mask",
        "ngram2", "ngram3", "ngram1", "vocab_size"])
def test_greedy_logits_processors(extra, attrs):
    feeds = {**BASE, **extra}
    attrs = {"eos_token_id": 3, "pad_token_id": 0, **attrs}
    assert_sequences_match(search_model("GreedySearch", feeds, **attrs), feeds, 0)


def test_greedy_processors_change_the_result():  # the cases above are not all the plain run
    plain = run_ours(search_model("GreedySearch", BASE, eos_token_id=3, pad_token_id=0), BASE)
    feeds = {**BASE, "repetition_penalty": scalar(1.7, np.float32)}
    pen = run_ours(search_model("GreedySearch", feeds, eos_token_id=3, pad_token_id=0), feeds)
    ngram = run_ours(search_model("GreedySearch", BASE, eos_token_id=3, pad_token_id=0,
                                  no_repeat_ngram_size=2), BASE)
    assert not np.array_equal(plain[0], pen[0]) and not np.array_equal(plain[0], ngram[0])


@pytest.mark.parametrize("pad,with_mask", [(0, False), (0, True), (1, False), (1, True)])
def test_greedy_padded_prompt(pad, with_mask):
    """Position ids count the non-pad ids whatever the mask says (onnxruntime's rule)."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 13, (4, 6)).astype(np.int32)
    ids[0, :2] = pad
    feeds = {"input_ids": ids, "max_length": scalar(14)}
    if with_mask:
        mask = rng.integers(0, 2, (4, 6)).astype(np.int32)
        mask[:, -1] = 1
        feeds["attention_mask"] = mask
    m = search_model("GreedySearch", feeds, eos_token_id=3, pad_token_id=pad)
    assert_sequences_match(m, feeds, pad)


def test_greedy_init_decoder_runs_first():
    m = search_model("GreedySearch", BASE, eos_token_id=3, pad_token_id=0,
                     init_decoder=decoder_graph(seed=5, name="init"))
    out = assert_sequences_match(m, BASE, 0)
    plain = run_ours(search_model("GreedySearch", BASE, eos_token_id=3, pad_token_id=0), BASE)
    assert not np.array_equal(out, plain[0])


def test_greedy_decoder_reading_outer_scope_weights():
    m = with_outer_weights("GreedySearch", BASE, eos_token_id=3, pad_token_id=0)
    assert_sequences_match(m, BASE, 0)


@pytest.mark.parametrize("layers,seed", [(1, 0), (1, 2), (3, 4)])
def test_greedy_other_decoders(layers, seed):
    feeds = {"input_ids": IDS[:1], "max_length": scalar(20)}
    m = search_model("GreedySearch", feeds, eos_token_id=30, pad_token_id=12,
                     decoder=decoder_graph(seed=seed, layers=layers))
    assert_sequences_match(m, feeds, 12)


@pytest.mark.parametrize("feeds,attrs,match", [
    ({**BASE, "max_length": scalar(3)}, {}, "greater than the input sequence length"),
    ({**BASE, "max_length": np.array([5, 6], np.int32)}, {}, "one element"),
    ({**BASE, "vocab_mask": np.ones(7, np.int32)}, {}, "vocab_mask must be"),
    ({**BASE, "prefix_vocab_mask": np.ones((3, 13), np.int32)}, {}, "prefix_vocab_mask"),
    ({**BASE, "repetition_penalty": scalar(0.0, np.float32)}, {}, "repetition_penalty"),
    ({**BASE, "attention_mask": np.ones((2, 4), np.int32)}, {}, "attention_mask must match"),
    (BASE, {"vocab_size": 50}, "exceeds the decoder's logits width"),
])
def test_greedy_refuses_bad_inputs(feeds, attrs, match):
    m = search_model("GreedySearch", feeds, eos_token_id=3, pad_token_id=0, **attrs)
    with pytest.raises(SessionError, match=match):
        run_ours(m, feeds)


@pytest.mark.parametrize("graph,attrs,match", [
    (decoder_graph(past_shape=[2, "B", "H", "P", 4]), {}, "num_heads and head_size fixed"),
    (decoder_graph(), {"model_type": 1}, "model_type 1 needs an `encoder`"),
    (decoder_graph(), {"model_type": 2}, "model_type 2 is not supported"),
])
def test_greedy_refuses_unsupported_decoders(graph, attrs, match):
    m = search_model("GreedySearch", BASE, graph=graph, eos_token_id=3, pad_token_id=0, **attrs)
    with pytest.raises(SessionError, match=match):
        run_ours(m, BASE)


# Sampling ------------------------------------------------------------------------------------

SAMPLE = {**BASE, "min_length": scalar(1), "repetition_penalty": scalar(1.0, np.float32)}


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.5])
def test_sampling_with_tiny_top_p_is_greedy(temperature):
    """top_p below every probability keeps one token per step: the draw is deterministic."""
    m = search_model("Sampling", SAMPLE, n_outputs=2, eos_token_id=3, pad_token_id=0,
                     top_p=1e-4, temperature=temperature)
    ours = assert_sequences_match(m, SAMPLE, 0)
    greedy = run_ours(search_model("GreedySearch", SAMPLE, eos_token_id=3, pad_token_id=0),
                      SAMPLE)[0]
    np.testing.assert_array_equal(ours, greedy)
    filtered = run_ours(m, SAMPLE)[1]
    assert filtered.shape == (2, 13) and (np.isfinite(filtered).sum(axis=1) == 1).all()


def test_sampling_ignores_presence_outside_custom_sampling():
    """presence_mask / presence_penalty belong to custom=1; onnxruntime ignores them otherwise."""
    mask = np.zeros((2, 13), np.int32)
    mask[:, [8, 10]] = 1
    feeds = {**SAMPLE, "presence_mask": mask}
    m = search_model("Sampling", feeds, eos_token_id=3, pad_token_id=0, top_p=1e-4,
                     presence_penalty=50.0)
    ours = assert_sequences_match(m, feeds, 0)
    assert (ours[:, 3:] == 10).any() and (ours[:, 3:] == 8).any()


def _first_step_probs(temperature: float) -> np.ndarray:
    """softmax(logits / T) of the decoder's first step on prompt [5, 6, 7]."""
    graph = decoder_graph()
    import onnx
    from onnx import helper as h

    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    past = np.zeros((2, 1, 2, 0, 4), np.float32)
    ids = IDS[:1]
    feeds = {"input_ids": ids, "position_ids": np.arange(3, dtype=np.int32)[None],
             "attention_mask": np.ones((1, 3), np.int32), "past_0": past, "past_1": past}
    logits = run_ort(model, feeds)[0][0, -1] / temperature
    e = np.exp(logits - logits.max())
    return e / e.sum()


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_sampling_draws_follow_the_softmax(temperature):
    n = 4000
    feeds = {"input_ids": np.repeat(IDS[:1], n, axis=0), "max_length": scalar(4),
             "seed": scalar(7)}
    m = search_model("Sampling", feeds, eos_token_id=30, pad_token_id=0, top_p=1.0,
                     temperature=temperature)
    tokens = run_ours(m, feeds)[0][:, 3]
    freq = np.bincount(tokens, minlength=13) / n
    probs = _first_step_probs(temperature)
    assert np.abs(freq - probs).max() < 4 * np.sqrt(probs.max() / n) + 1e-3
    assert (freq[probs < 1e-6] == 0).all()


def test_sampling_top_p_keeps_the_nucleus():
    n, top_p = 2000, 0.8
    feeds = {"input_ids": np.repeat(IDS[:1], n, axis=0), "max_length": scalar(4),
             "seed": scalar(3)}
    m = search_model("Sampling", feeds, eos_token_id=30, pad_token_id=0, top_p=top_p,
                     temperature=3.0)
    tokens = run_ours(m, feeds)[0][:, 3]
    probs = _first_step_probs(3.0)
    order = np.argsort(-probs)
    before = np.cumsum(probs[order]) - probs[order]
    nucleus = set(order[before < top_p].tolist())
    assert set(np.unique(tokens).tolist()) == nucleus and len(nucleus) > 1


def test_sampling_seed_reproduces():
    feeds = {**SAMPLE, "seed": scalar(11)}
    m = search_model("Sampling", feeds, eos_token_id=30, pad_token_id=0, temperature=2.0)
    a, b = run_ours(m, feeds)[0], run_ours(m, feeds)[0]
    np.testing.assert_array_equal(a, b)
    others = [run_ours(m, {**feeds, "seed": scalar(s)})[0] for s in (12, 13, 14)]
    assert any(not np.array_equal(a, o) for o in others)


@pytest.mark.parametrize("attrs,match", [
    ({"temperature": 0.0}, "temperature must be > 0"),
    ({"top_p": 1.5}, "top_p must lie in"),
    ({"custom": 1}, "custom=1"),
    ({"min_tokens_to_keep": 0}, "min_tokens_to_keep"),
])
def test_sampling_refuses_bad_attributes(attrs, match):
    m = search_model("Sampling", SAMPLE, eos_token_id=3, pad_token_id=0, **attrs)
    with pytest.raises(SessionError, match=match):
        run_ours(m, SAMPLE)


@pytest.mark.parametrize("op", ["GreedySearch", "Sampling"])
@pytest.mark.parametrize("drop", ["eos_token_id", "pad_token_id"])
def test_a_search_node_without_a_required_token_id_is_refused_as_onnxruntime_does(op, drop):
    ort = pytest.importorskip("onnxruntime", reason="the refusal is checked against onnxruntime")
    import onnxkiln as ok

    attrs = {"eos_token_id": 2, "pad_token_id": 0, "model_type": 0}
    del attrs[drop]
    feeds = {"input_ids": np.array([[5, 6]], np.int32), "max_length": scalar(6)}
    model = search_model(op, feeds, **attrs).SerializeToString()
    with pytest.raises(Exception, match="INVALID_GRAPH"):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    with pytest.raises(ok.ModelLoadError, match=f"Required attribute '{drop}' is missing"):
        ok.InferenceSession(model)
