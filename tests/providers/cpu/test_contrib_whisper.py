"""com.microsoft WhisperBeamSearch (contrib_whisper.py), and BeamSearch with model_type 2, over
a tiny Whisper style encoder and decoder pair, against onnxruntime's CPU provider: sequences
equal, sequences_scores and the per-step scores (the processed log-probs, so every banned
token shows) within 1e-4."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _gpt_decoder import scalar
from _whisper_pair import features, pair, search_model, shared_buffer_decoder, with_outer_weights

from onnxkiln.errors import ModelLoadError, SessionError
from onnxkiln.testing import ort_session, run_ort, run_ours

# token layout in Whisper's order: text ids below eos, then the special ids, then timestamps
TOKENS = {"eos_token_id": 90, "pad_token_id": 89, "decoder_start_token_id": 91,
          "translate_token_id": 92, "transcribe_token_id": 93, "start_of_lm_token_id": 94,
          "no_speech_token_id": 95, "no_timestamps_token_id": 96,
          "beginning_timestamp_token_id": 97}
# BeamSearch's schema has the first three only
BEAM_TOKENS = {k: TOKENS[k] for k in ("eos_token_id", "pad_token_id", "decoder_start_token_id")}
PROMPTS = ([91], [91, 93], [91, 92], [91, 93, 96])
ALL = ("sequences", "sequences_scores", "scores")


def feeds(batch=2, beams=3, returns=2, max_length=10, penalty=1.0, seed=0, **extra):
    return {"input_features": features(np.random.default_rng(seed), batch),
            "max_length": scalar(max_length), "min_length": scalar(1),
            "num_beams": scalar(beams), "num_return_sequences": scalar(returns),
            "length_penalty": scalar(penalty, np.float32), **extra}


def check(f, outputs=ALL, **attrs):
    """Both runtimes on one model; the per-step scores are compared over the steps onnxkiln
    ran (after every batch item is done onnxruntime leaves the rest unwritten)."""
    attrs = {**(BEAM_TOKENS if attrs.get("op") == "BeamSearch" else TOKENS), **attrs}
    m = attrs.pop("model", None) or search_model(f, outputs, **attrs)
    ours, theirs = run_ours(m, f), run_ort(m, f)
    assert len(ours) == len(theirs)
    np.testing.assert_array_equal(ours[0], theirs[0])
    for i, (a, b) in enumerate(zip(ours[1:], theirs[1:]), 1):
        assert a.shape == b.shape and a.dtype == b.dtype, (i, a.shape, b.shape)
        if outputs[i] == "scores":
            ran = int((np.abs(a).reshape(a.shape[0], -1).max(axis=1) > 0).sum())
            a, b = a[:ran], b[:ran]
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    return ours


def prompt(ids, batch=2) -> np.ndarray:
    return np.array([ids] * batch, np.int32)


@pytest.mark.parametrize("beams,returns", [(1, 1), (3, 2), (4, 4)])
@pytest.mark.parametrize("early", [0, 1])
def test_whisper_beam_search_matches(beams, returns, early):
    check(feeds(beams=beams, returns=returns), early_stopping=early)


@pytest.mark.parametrize("ids", PROMPTS[1:])
def test_whisper_decoder_input_ids(ids):
    out = check(feeds(decoder_input_ids=prompt(ids)))
    assert (out[0][:, :, :len(ids)] == ids).all()


@pytest.mark.parametrize("ids", PROMPTS)
@pytest.mark.parametrize("vocab", [120, 200])  # 200: room for the first timestamp's cap
def test_whisper_timestamp_processor(ids, vocab):
    out = check(feeds(decoder_input_ids=prompt(ids), logits_processor=scalar(1)),
                graphs=pair(6, vocab=vocab))
    assert (out[0] >= TOKENS["beginning_timestamp_token_id"]).any()  # timestamps were chosen


@pytest.mark.parametrize("extra,attrs", [
    ({"temperature": scalar(0.5, np.float32)}, {}),
    ({"temperature": scalar(1.7, np.float32), "min_length": scalar(6)}, {}),
    ({"repetition_penalty": scalar(1.4, np.float32)}, {}),
    ({"vocab_mask": (np.arange(120) % 7 != 3).astype(np.int32)}, {}),
    ({"prefix_vocab_mask": np.random.default_rng(2).integers(0, 2, (2, 120)).astype(np.int32)},
     {}),
    ({}, {"no_repeat_ngram_size": 2}),
    ({"length_penalty": scalar(0.5, np.float32)}, {}),
], ids=["temperature", "temperature-min-length", "repetition", "vocab-mask", "prefix-mask",
        "ngram", "length-penalty"])
def test_whisper_processors(extra, attrs):
    check({**feeds(decoder_input_ids=prompt([91, 93])), **extra}, **attrs)


@pytest.mark.parametrize("hidden,whole", [(False, False), (True, True)],
                         ids=["no-hidden-states", "whole-sequence-input-ids"])
def test_whisper_decoder_forms(hidden, whole):
    check(feeds(decoder_input_ids=prompt([91, 93])), graphs=pair(4, hidden=hidden, whole=whole))


def test_whisper_outer_scope_weights_and_ignored_inputs():
    """Weights read from the main graph; a 3-D attention_mask and extra_decoding_ids are
    checked and unused, as by onnxruntime's CPU kernel."""
    f = feeds(attention_mask=np.zeros((2, 4, 6), np.int32),
              extra_decoding_ids=np.array([[5, 6], [7, -1]], np.int32))
    check(f, model=with_outer_weights(f, outputs=ALL, **TOKENS))


def test_whisper_no_speech_probs_read_zero():
    """onnxruntime's CPU kernel checks no_speech_token_id but never writes no_speech_probs
    (its values are whatever memory it got): onnxkiln writes zeros; the rest matches."""
    outputs = ("sequences", "sequences_scores", "", "", "no_speech_probs")
    f = feeds()
    m = search_model(f, outputs, **TOKENS)
    ours, theirs = run_ours(m, f), run_ort(m, f)
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-4, atol=1e-4)
    assert ours[2].shape == theirs[2].shape == (2,) and ours[2].dtype == theirs[2].dtype
    assert not ours[2].any()


def test_whisper_decoder_reading_hidden_states_gets_them():
    """A decoder that reads encoder_hidden_states gets the encoder's (repeated per beam).
    onnxruntime's CPU kernel hands it an uninitialized buffer of that shape instead (its
    results then change from run to run), so there is nothing to compare with: onnxkiln's
    runs repeat and differ from the same pair whose decoder ignores the states."""
    f = feeds(decoder_input_ids=prompt([91, 93]))
    m = search_model(f, ALL, graphs=pair(4, reads_hidden=True), **TOKENS)
    first, again = run_ours(m, f), run_ours(m, f)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    unread = run_ours(search_model(f, ALL, graphs=pair(4), **TOKENS), f)
    assert not np.allclose(first[2], unread[2])


def test_whisper_all_done_after_the_first_step():
    """Every item done on the encoder's logits: onnxruntime still runs the decoder once."""
    mask = np.zeros(120, np.int32)
    mask[7] = 1
    out = check(feeds(beams=1, returns=1, vocab_mask=mask), eos_token_id=7, early_stopping=1)
    rows = np.abs(out[2]).reshape(out[2].shape[0], -1).max(axis=1)
    assert (rows[:2] > 0).all() and not rows[2:].any()


def test_whisper_scan_against_onnxruntime():
    """Random settings, fixed seeds: batch, beams, returns, length penalty, early stopping,
    prompts, temperature, repetition penalty, n-grams and the timestamp processor."""
    for seed in range(24):
        rng = np.random.default_rng(700 + seed)
        beams = int(rng.integers(1, 5))
        batch = int(rng.integers(1, 4))
        f = feeds(batch, beams, int(rng.integers(1, beams + 1)), int(rng.integers(6, 13)),
                  float(rng.choice([1.0, 0.5, 2.0, 0.0])), seed=seed,
                  decoder_input_ids=prompt(PROMPTS[seed % 4], batch),
                  logits_processor=scalar(seed % 2))
        if seed % 3 == 0:
            f["temperature"] = scalar(float(rng.choice([0.5, 1.5])), np.float32)
        if seed % 5 == 0:
            f["repetition_penalty"] = scalar(1.4, np.float32)
        attrs = {"early_stopping": int(rng.random() < 0.3),
                 "no_repeat_ngram_size": 2 if seed % 7 == 0 else 0}
        if seed % 4 == 3:
            attrs["eos_token_id"] = int(rng.integers(0, 90))
        check(f, graphs=pair(seed, hidden=bool(seed % 2)), **attrs)


@pytest.mark.parametrize("f,attrs,match", [
    (feeds(logits_processor=scalar(1)), {"beginning_timestamp_token_id": -1},
     "beginning_timestamp_token_id"),
    (feeds(logits_processor=scalar(-1)), {}, "logits_processor must be >= 0"),
    (feeds(max_length=3, decoder_input_ids=prompt([91, 93])), {}, "at least 2"),
    (feeds(attention_mask=np.ones((2, 6), np.int32)), {}, "attention_mask must be 3-D"),
    (feeds(extra_decoding_ids=np.ones((3, 2), np.int32)), {}, "extra_decoding_ids"),
    (feeds(), {"decoder_start_token_id": -1}, "decoder_start_token_id"),
], ids=["timestamps-without-begin", "negative-logits-processor", "max-length-too-short",
        "2d-attention-mask", "extra-ids-batch", "no-start-token"])
def test_whisper_refuses_what_onnxruntime_refuses(f, attrs, match):
    m = search_model(f, **{**TOKENS, **attrs})
    with pytest.raises(Exception, match="ONNXRuntimeError"):
        run_ort(m, f)
    with pytest.raises(SessionError, match=match):
        run_ours(m, f)


def test_whisper_refuses_no_speech_probs_without_its_token():
    f = feeds()
    tokens = {k: v for k, v in TOKENS.items() if k != "no_speech_token_id"}
    m = search_model(f, ("sequences", "", "", "", "no_speech_probs"), **tokens)
    with pytest.raises(Exception, match="ONNXRuntimeError"):
        run_ort(m, f)
    with pytest.raises(SessionError, match="no_speech_token_id"):
        run_ours(m, f)


@pytest.mark.parametrize("drop,extra,match", [
    ("pad_token_id", {}, "Required attribute 'pad_token_id'"),
    ("", {"top_p": 0.5}, "Unrecognized attribute: top_p"),
])
def test_whisper_refuses_what_the_schema_check_refuses(drop, extra, match):
    """onnxruntime refuses the model when it loads it: so does the session build."""
    f = feeds()
    tokens = {k: v for k, v in TOKENS.items() if k != drop}
    m = search_model(f, **tokens, **extra)
    with pytest.raises(Exception, match="ONNXRuntimeError"):
        ort_session(m)
    with pytest.raises(ModelLoadError, match=match):
        run_ours(m, f)


def test_whisper_refuses_cross_qk_as_onnxruntime_cpu():
    """decoder_output_cross_qk with a decoder giving cross_qk_0: onnxruntime's CPU kernel
    fails at run ("CPU beam search current not support output cross QK")."""
    f = {**feeds(), "cross_qk_layer_head": np.array([[0, 0]], np.int32)}
    graphs = (pair(0, heads=1, layers=1)[0], shared_buffer_decoder(cross_qk=True))
    m = search_model(f, ("sequences", "", "", "cross_qk"), graphs=graphs,
                     decoder_output_cross_qk=1, **TOKENS)
    with pytest.raises(Exception, match="not support output cross QK"):
        run_ort(m, f)
    with pytest.raises(SessionError, match="decoder_output_cross_qk"):
        run_ours(m, f)


def test_whisper_refuses_shared_buffer_decoders():
    """Decoders sharing a past/present buffer are refused. onnxruntime's CPU kernel accepts
    them but leaves their cache_indirection uninitialized (its initialization is CUDA-only):
    its DecoderMaskedMultiHeadAttention then fails on an out-of-range beam index or reads
    whatever the memory held, so there is no result to compare with."""
    graphs = (pair(0, heads=1, layers=1)[0], shared_buffer_decoder())
    m = search_model(feeds(), graphs=graphs, **TOKENS)
    with pytest.raises(SessionError, match="past/present buffer"):
        run_ours(m, feeds())


# BeamSearch with model_type 2 ----------------------------------------------------------------
# onnxruntime's BeamSearch runs a Whisper pair as its WhisperBeamSearch does, within
# BeamSearch's schema: decoder_input_ids is the prompt, temperature 1, no timestamp token ids
# (so logits_processor 1 fails), no cross_qk or no_speech_probs output.


def beam(f, outputs=ALL, **attrs):
    return check(f, outputs, op="BeamSearch", model_type=2, **attrs)


def beam_model(f, outputs=ALL, **attrs) -> onnx.ModelProto:
    attrs = {**BEAM_TOKENS, "model_type": 2, **attrs}
    return search_model(f, outputs, op="BeamSearch",
                        **{k: v for k, v in attrs.items() if v is not None})


@pytest.mark.parametrize("beams,returns", [(1, 1), (3, 2), (4, 4)])
@pytest.mark.parametrize("early", [0, 1])
def test_beam_search_model_type_2_matches(beams, returns, early):
    beam(feeds(beams=beams, returns=returns), early_stopping=early)


@pytest.mark.parametrize("ids", PROMPTS)
@pytest.mark.parametrize("processor", [None, 0, 2], ids=["absent", "0", "2"])
def test_beam_search_model_type_2_prompt(ids, processor):
    """decoder_input_ids start the sequences; logits_processor other than 1 adds nothing."""
    extra = {} if processor is None else {"logits_processor": scalar(processor)}
    out = beam(feeds(decoder_input_ids=prompt(ids), **extra))
    assert (out[0][:, :, :len(ids)] == ids).all()


@pytest.mark.parametrize("extra,attrs", [
    ({"min_length": scalar(6)}, {}),
    ({"repetition_penalty": scalar(1.4, np.float32)}, {}),
    ({"vocab_mask": (np.arange(120) % 7 != 3).astype(np.int32)}, {}),
    ({"prefix_vocab_mask": np.random.default_rng(2).integers(0, 2, (2, 120)).astype(np.int32)},
     {}),
    ({}, {"no_repeat_ngram_size": 2}),
    ({"length_penalty": scalar(0.5, np.float32)}, {}),
], ids=["min-length", "repetition", "vocab-mask", "prefix-mask", "ngram", "length-penalty"])
def test_beam_search_model_type_2_processors(extra, attrs):
    beam({**feeds(decoder_input_ids=prompt([91, 93])), **extra}, **attrs)


@pytest.mark.parametrize("hidden,whole", [(False, False), (True, True)],
                         ids=["no-hidden-states", "whole-sequence-input-ids"])
def test_beam_search_model_type_2_decoder_forms(hidden, whole):
    beam(feeds(decoder_input_ids=prompt([91, 93])), graphs=pair(4, hidden=hidden, whole=whole))


def test_beam_search_model_type_2_outer_weights_and_ignored_inputs():
    """Weights read from the main graph; a 3-D attention_mask checked and unused, as by
    onnxruntime. (Its BeamSearch, unlike its WhisperBeamSearch, then fails on a missing
    outer weight when an init_decoder holds an initializer of that name; onnxkiln builds
    init_decoder and never runs it, as for a pair without outer weights.)"""
    f = feeds(attention_mask=np.zeros((2, 4, 6), np.int32))
    check(f, model=with_outer_weights(f, outputs=ALL, op="BeamSearch", model_type=2,
                                      **BEAM_TOKENS))


def test_beam_search_model_type_2_all_done_after_the_first_step():
    """Every item done on the encoder's logits: the decoder still runs once."""
    mask = np.zeros(120, np.int32)
    mask[7] = 1
    out = beam(feeds(beams=1, returns=1, vocab_mask=mask), eos_token_id=7, early_stopping=1)
    rows = np.abs(out[2]).reshape(out[2].shape[0], -1).max(axis=1)
    assert (rows[:2] > 0).all() and not rows[2:].any()


def test_beam_search_model_type_2_is_whisper_beam_search():
    """On one pair and one set of inputs BeamSearch gives WhisperBeamSearch's outputs (no
    temperature, no timestamp processor), bit for bit."""
    f = feeds(decoder_input_ids=prompt([91, 93]), repetition_penalty=scalar(1.2, np.float32))
    ours = run_ours(beam_model(f), f)
    whisper = run_ours(search_model(f, ALL, **TOKENS), f)
    for a, b in zip(ours, whisper, strict=True):
        np.testing.assert_array_equal(a, b)


def test_beam_search_model_type_2_scan_against_onnxruntime():
    """Random settings, fixed seeds: batch, beams, returns, max_length, length penalty, early
    stopping, prompts (or decoder_start_token_id alone), logits_processor absent, 0 or 2,
    min_length, repetition penalty, vocab mask, n-grams, eos ids, the decoder forms, an unused
    3-D attention_mask and init_decoder."""
    for seed in range(32):
        rng = np.random.default_rng(900 + seed)
        beams, batch = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        extra = {"min_length": scalar(int(rng.integers(0, 5)))}
        if seed % 4:
            extra["decoder_input_ids"] = prompt(PROMPTS[seed % 4], batch)
        if seed % 3:
            extra["logits_processor"] = scalar(int(rng.choice([0, 2])))
        if seed % 5 == 0:
            extra["repetition_penalty"] = scalar(1.3, np.float32)
        if seed % 6 == 1:
            extra["vocab_mask"] = (rng.random(120) > 0.1).astype(np.int32)
        if seed % 8 == 2:
            extra["attention_mask"] = np.zeros((batch, 4, 6), np.int32)
        f = feeds(batch, beams, int(rng.integers(1, beams + 1)), int(rng.integers(6, 13)),
                  float(rng.choice([1.0, 0.5, 2.0, 0.0])), seed=seed, **extra)
        attrs = {"early_stopping": int(rng.random() < 0.3),
                 "no_repeat_ngram_size": 2 if seed % 7 == 0 else 0}
        if seed % 3 == 0:
            attrs["eos_token_id"] = int(rng.integers(0, 89))
        if seed % 9 == 4:
            attrs["init_decoder"] = pair(seed + 1)[1]
        graphs = pair(seed, hidden=bool(seed % 2), whole=seed % 10 == 5)
        beam(f, graphs=graphs, **attrs)


@pytest.mark.parametrize("f,attrs,match", [
    (feeds(logits_processor=scalar(1)), {}, "no such attribute"),
    (feeds(decoder_input_ids=prompt([91, 93]), logits_processor=scalar(1)), {},
     "beginning_timestamp_token_id"),
    (feeds(logits_processor=scalar(-1)), {}, "logits_processor must be >= 0"),
    (feeds(max_length=3, decoder_input_ids=prompt([91, 93])), {}, "at least 2"),
    (feeds(max_length=2), {}, "at least 2"),
    (feeds(attention_mask=np.ones((2, 6), np.int32)), {}, "attention_mask must be 3-D"),
    (feeds(), {"decoder_start_token_id": -1}, "decoder_start_token_id"),
    ({**feeds(), "input_features": np.ones((2, 4, 6), np.int32)}, {},
     "input_features must be float32"),
], ids=["timestamps", "timestamps-prompted", "negative-logits-processor",
        "max-length-too-short", "max-length-2-no-prompt", "2d-attention-mask", "no-start-token",
        "int-features"])
def test_beam_search_model_type_2_refuses_what_onnxruntime_refuses(f, attrs, match):
    m = beam_model(f, **attrs)
    with pytest.raises(Exception, match="ONNXRuntimeError"):
        run_ort(m, f)
    with pytest.raises(SessionError, match=match):
        run_ours(m, f)


@pytest.mark.parametrize("f,outputs,attrs,match", [
    (feeds(), ALL, {"beginning_timestamp_token_id": 97},
     "Unrecognized attribute: beginning_timestamp_token_id .*WhisperBeamSearch"),
    (feeds(), ALL, {"decoder_output_cross_qk": 1}, "Unrecognized attribute: decoder_output_cro"),
    (feeds(), ALL, {"no_speech_token_id": 95}, "Unrecognized attribute: no_speech_token_id"),
    (feeds(), ALL, {"pad_token_id": None}, "Required attribute 'pad_token_id'"),
    (feeds(), ALL, {"eos_token_id": None}, "Required attribute 'eos_token_id'"),
    (feeds(temperature=scalar(0.5, np.float32)), ALL, {}, "input size 15, at most 12"),
    (feeds(), (*ALL, "cross_qk"), {}, "output size 4, at most 3"),
    (feeds(), ALL, {"model_type": 3}, "model_type 3 is not supported"),
], ids=["timestamp-attribute", "cross-qk-attribute", "no-speech-attribute", "no-pad", "no-eos",
        "temperature-input", "cross-qk-output", "model-type-3"])
def test_beam_search_model_type_2_refuses_at_load(f, outputs, attrs, match):
    """What onnxruntime refuses when it loads the model (its schema check, or model_type
    outside 0-2) is refused when the session is built."""
    m = beam_model(f, outputs, **attrs)
    with pytest.raises(Exception, match="ONNXRuntimeError"):
        ort_session(m)
    with pytest.raises(ModelLoadError, match=match):
        run_ours(m, f)


def test_beam_search_model_type_2_refuses_shared_buffer_decoders():
    """As WhisperBeamSearch: onnxruntime's CPU kernel leaves their cache_indirection
    uninitialized, so there is no result to compare with."""
    graphs = (pair(0, heads=1, layers=1)[0], shared_buffer_decoder())
    with pytest.raises(SessionError, match="past/present buffer"):
        run_ours(beam_model(feeds(), graphs=graphs), feeds())
