"""Generated cases for the search ops (GreedySearch, Sampling, BeamSearch, WhisperBeamSearch)
over one-layer decoder subgraphs with random weights (GPT-2 style, T5 and Whisper style
encoder-decoder pairs): the logits read the whole past (so a wrong cache changes the
tokens), eos/pad handling, min_length, repetition penalty, n-gram blocking, Whisper's
prompts, temperature and timestamp rules; Sampling only with top_p small enough to keep one
token (its generator is not onnxruntime's)."""

from __future__ import annotations

import numpy as np
import onnx
from contrib_harness import F32, I32, Case, scalar, spec
from onnx import TensorProto, helper, numpy_helper

VOCAB, HEADS, HEAD = 11, 2, 4
D = HEADS * HEAD


def decoder(seed: int) -> onnx.GraphProto:
    """input_ids, position_ids, attention_mask, past_0 [2, B, H, P, hd] -> logits [B, S, V],
    present_0 = past ++ this step's keys/values; logits = embedding @ W + mean of present."""
    rng = np.random.default_rng(seed)
    inits = {"E": rng.standard_normal((VOCAB, D)) * 1.5, "Pos": rng.standard_normal((32, D)),
             "Wkv": rng.standard_normal((D, 2 * D)) * 0.5,
             "Wout": rng.standard_normal((D, VOCAB)) * 1.5,
             "Wctx": rng.standard_normal((HEAD, VOCAB)) * 2.0}
    inits = {k: v.astype(np.float32) for k, v in inits.items()}
    inits |= {"kv_shape": np.array([0, 0, 2, HEADS, HEAD], np.int64),
              "ax1": np.array([1], np.int64)}
    n = helper.make_node
    nodes = [
        n("Gather", ["E", "input_ids"], ["emb"]), n("Gather", ["Pos", "position_ids"], ["pos"]),
        n("Add", ["emb", "pos"], ["h"]), n("MatMul", ["h", "Wkv"], ["kv"]),
        n("Reshape", ["kv", "kv_shape"], ["kv5"]),
        n("Transpose", ["kv5"], ["kvt"], perm=[2, 0, 3, 1, 4]),
        n("Concat", ["past_0", "kvt"], ["present_0"], axis=3),
        n("ReduceMean", ["present_0"], ["ctx"], axes=[0, 2, 3], keepdims=0),  # [B, hd]
        n("MatMul", ["ctx", "Wctx"], ["ctx_v"]), n("Unsqueeze", ["ctx_v", "ax1"], ["ctx_b"]),
        n("MatMul", ["h", "Wout"], ["direct"]), n("Add", ["direct", "ctx_b"], ["logits"]),
    ]
    i32, f32 = TensorProto.INT32, TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("input_ids", i32, ["B", "S"]),
           helper.make_tensor_value_info("position_ids", i32, ["B", "S"]),
           helper.make_tensor_value_info("attention_mask", i32, ["B", "T"]),
           helper.make_tensor_value_info("past_0", f32, [2, "B", HEADS, "P", HEAD])]
    outs = [helper.make_tensor_value_info("logits", f32, ["B", "S", VOCAB]),
            helper.make_tensor_value_info("present_0", f32, [2, "B", HEADS, "T", HEAD])]
    return helper.make_graph(nodes, "decoder", ins, outs,
                             [numpy_helper.from_array(v, k) for k, v in inits.items()])


def _t5_step(n, ids: str, self_past: bool) -> list:
    """One decoder step of the encoder-decoder pair below: logits = embedding @ Wout + the
    mean of the self keys (past ++ this token's) @ Wctx + the mean of the cross keys @ Wx."""
    sk, kv = "present_key_self_0", "present_value_self_0"
    nodes = [n("Gather", ["E", ids], ["x"]), n("MatMul", ["x", "Wk"], ["k3"]),
             n("Unsqueeze", ["k3", "ax1"], ["k4"])]
    nodes += ([n("Concat", ["past_key_self_0", "k4"], [sk], axis=2),
               n("Concat", ["past_value_self_0", "k4"], [kv], axis=2)] if self_past else
              [n("Identity", ["k4"], [sk]), n("Identity", ["k4"], [kv])])
    return [
        *nodes,
        n("ReduceMean", [sk], ["sm"], axes=[1, 2], keepdims=0),
        n("ReduceMean", ["cross_k"], ["cm"], axes=[1, 2], keepdims=0),
        n("MatMul", ["sm", "Wctx"], ["sl"]), n("MatMul", ["cm", "Wx"], ["cl"]),
        n("Add", ["sl", "cl"], ["ctx"]), n("Unsqueeze", ["ctx", "ax1"], ["ctx_b"]),
        n("MatMul", ["x", "Wout"], ["direct"]), n("Add", ["direct", "ctx_b"], ["logits"])]


def t5_pair(seed: int) -> tuple[onnx.GraphProto, onnx.GraphProto]:
    """A one-layer, one-head T5 style encoder/decoder pair (model_type 1): the encoder gives
    the first logits (for decoder_input_ids), tanh(embedding @ Wenc) as hidden states, the
    self key/value of the first token and the cross key/value; keys equal values."""
    rng = np.random.default_rng(seed)
    w = {"E": rng.standard_normal((VOCAB, D)) * 1.5, "Wenc": rng.standard_normal((D, D)),
         "Wk": rng.standard_normal((D, D)), "Wout": rng.standard_normal((D, VOCAB)) * 1.5,
         "Wctx": rng.standard_normal((D, VOCAB)), "Wx": rng.standard_normal((D, VOCAB))}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "ax1"))
    n, i32, f32 = helper.make_node, TensorProto.INT32, TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    kv4 = ["B", 1, "T", D]
    enc_nodes = [n("Gather", ["E", "encoder_input_ids"], ["e"]),
                 n("MatMul", ["e", "Wenc"], ["eh"]), n("Tanh", ["eh"], ["encoder_hidden_states"]),
                 n("Unsqueeze", ["encoder_hidden_states", "ax1"], ["cross_k"]),
                 n("Identity", ["cross_k"], ["present_key_cross_0"]),
                 n("Identity", ["cross_k"], ["present_value_cross_0"]),
                 *_t5_step(n, "decoder_input_ids", False)]
    enc = helper.make_graph(
        enc_nodes, "encoder",
        [vi("encoder_input_ids", i32, ["B", "S"]), vi("encoder_attention_mask", i32, ["B", "S"]),
         vi("decoder_input_ids", i32, ["B", 1])],
        [vi("logits", f32, ["B", 1, VOCAB]), vi("encoder_hidden_states", f32, ["B", "S", D]),
         vi("present_key_self_0", f32, kv4), vi("present_value_self_0", f32, kv4),
         vi("present_key_cross_0", f32, kv4), vi("present_value_cross_0", f32, kv4)], inits)
    dec = helper.make_graph(
        [n("Identity", ["past_key_cross_0"], ["cross_k"]), *_t5_step(n, "input_ids", True)],
        "decoder",
        [vi("input_ids", i32, ["B", 1]), vi("encoder_attention_mask", i32, ["B", "S"]),
         vi("past_key_self_0", f32, kv4), vi("past_value_self_0", f32, kv4),
         vi("past_key_cross_0", f32, kv4), vi("past_value_cross_0", f32, kv4)],
        [vi("logits", f32, ["B", 1, VOCAB]), vi("present_key_self_0", f32, kv4),
         vi("present_value_self_0", f32, kv4)], inits)
    return enc, dec


def whisper_pair(seed: int, frames: int = 5, features: int = 4,
                 vocab: int = 120) -> tuple[onnx.GraphProto, onnx.GraphProto]:
    """A one-layer, one-head Whisper style pair (model_type 2): the encoder reads float
    features (B, features, frames), gives the first logits for decoder_input_ids (B, L),
    tanh(features @ Wenc) as hidden states, the self key/value of the prompt and the cross
    key/value; the decoder declares the hidden states but reads the cross keys."""
    rng = np.random.default_rng(seed)
    w = {"E": rng.standard_normal((vocab, D)) * 1.5, "Wenc": rng.standard_normal((features, D)),
         "Wk": rng.standard_normal((D, D)), "Wout": rng.standard_normal((D, vocab)) * 1.5,
         "Wctx": rng.standard_normal((D, vocab)), "Wx": rng.standard_normal((D, vocab))}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "ax1"))
    n, i32, f32 = helper.make_node, TensorProto.INT32, TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    kv4, cross4 = ["B", 1, "T", D], ["B", 1, frames, D]
    enc = helper.make_graph(
        [n("Transpose", ["encoder_input_ids"], ["ft"], perm=[0, 2, 1]),
         n("MatMul", ["ft", "Wenc"], ["eh"]), n("Tanh", ["eh"], ["encoder_hidden_states"]),
         n("Unsqueeze", ["encoder_hidden_states", "ax1"], ["cross_k"]),
         n("Identity", ["cross_k"], ["present_key_cross_0"]),
         n("Identity", ["cross_k"], ["present_value_cross_0"]),
         *_t5_step(n, "decoder_input_ids", False)], "encoder",
        [vi("encoder_input_ids", f32, ["B", features, frames]),
         vi("decoder_input_ids", i32, ["B", "L"])],
        [vi("logits", f32, ["B", "L", vocab]),
         vi("encoder_hidden_states", f32, ["B", frames, D]),
         vi("present_key_self_0", f32, kv4), vi("present_value_self_0", f32, kv4),
         vi("present_key_cross_0", f32, cross4), vi("present_value_cross_0", f32, cross4)], inits)
    dec = helper.make_graph(
        [n("Identity", ["past_key_cross_0"], ["cross_k"]), *_t5_step(n, "input_ids", True)],
        "decoder",
        [vi("input_ids", i32, ["B", 1]), vi("encoder_hidden_states", f32, ["B", frames, D]),
         vi("past_key_self_0", f32, kv4), vi("past_value_self_0", f32, kv4),
         vi("past_key_cross_0", f32, cross4), vi("past_value_cross_0", f32, cross4)],
        [vi("logits", f32, ["B", 1, vocab]), vi("present_key_self_0", f32, kv4),
         vi("present_value_self_0", f32, kv4)], inits)
    return enc, dec


def _prompt(rng, batch=2, length=3):
    return rng.integers(1, VOCAB, (batch, length)).astype(I32)


@spec("GreedySearch")
def greedy_search(rng):
    ids = _prompt(rng)
    base = {"decoder": decoder(1), "eos_token_id": 2, "pad_token_id": 0, "model_type": 0}
    return [
        Case("plain", {"ids": ids, "max": scalar([9], I32)}, base, opset=17),
        Case("min-length-penalty", {"ids": ids, "max": scalar([10], I32),
                                    "min": scalar([7], I32), "rp": scalar([1.5], F32)},
             base, opset=17),
        Case("no-repeat-2gram", {"ids": ids, "max": scalar([12], I32)},
             {**base, "no_repeat_ngram_size": 2}, opset=17),
        # token 6 ends the first row two steps in while the second runs to max_length (when
        # every row stops early, onnxruntime leaves the columns past the stop unwritten)
        Case("one-row-stops-early", {"ids": ids, "max": scalar([9], I32)},
             {**base, "eos_token_id": 6}, opset=17),
    ]


@spec("Sampling")
def sampling(rng):
    ids = _prompt(rng)
    # top_p below every token's probability keeps the top token only: the draw cannot matter
    attrs = {"decoder": decoder(2), "eos_token_id": 2, "pad_token_id": 0, "model_type": 0,
             "top_p": 1e-6, "temperature": 0.7}
    return [Case("top-p-one-token", {"ids": ids, "max": scalar([8], I32)}, attrs, opset=17)]


@spec("BeamSearch")
def beam_search(rng):
    ids = _prompt(rng)
    attrs = {"decoder": decoder(3), "eos_token_id": 2, "pad_token_id": 0, "model_type": 0,
             "early_stopping": 0}
    feeds = {"ids": ids, "max": scalar([8], I32), "min": scalar([1], I32),
             "beams": scalar([3], I32), "ret": scalar([2], I32), "lp": scalar([1.0], F32)}
    enc, dec = t5_pair(4)
    t5 = {"encoder": enc, "decoder": dec, "decoder_start_token_id": 1, "eos_token_id": 2,
          "pad_token_id": 0, "model_type": 1, "early_stopping": 0}
    # decoder_input_ids is unused and logits_processor only checked by onnxruntime's CPU
    # kernel for model_types 0 and 1 (its one processor, timestamps, needs model_type 2)
    names = ["ids", "max", "min", "beams", "ret", "lp", "", "", "", "", "dii", "lproc"]
    extra = {**feeds, "dii": np.array([[1, 4], [1, 5]], I32), "lproc": scalar([1], I32)}
    tol = {"n_out": 2, "rtol": 1e-4, "atol": 1e-5, "opset": 17}
    return [Case("3-beams-2-returned", feeds, attrs, **tol),
            Case("t5-encoder-decoder", feeds, t5, **tol),
            Case("decoder-input-ids-logits-processor", extra, attrs, names=names, **tol),
            Case("t5-decoder-input-ids-logits-processor", extra, t5, names=names, **tol),
            Case("negative-logits-processor", {**extra, "lproc": scalar([-1], I32)}, t5,
                 names=names, refuses=True, **tol),
            *_beam_search_whisper(rng, tol)]


def _beam_search_whisper(rng, tol: dict) -> list[Case]:
    """BeamSearch with model_type 2, as onnxruntime runs it: WhisperBeamSearch's loop with
    decoder_input_ids as the prompt, temperature 1 and no timestamp token ids."""
    enc, dec = whisper_pair(6)
    attrs = {"eos_token_id": 90, "pad_token_id": 89, "decoder_start_token_id": 91,
             "model_type": 2, "encoder": enc, "decoder": dec, "early_stopping": 0}
    feeds = {"features": rng.standard_normal((2, 4, 5)).astype(F32), "max": scalar([9], I32),
             "min": scalar([1], I32), "beams": scalar([3], I32), "ret": scalar([2], I32),
             "lp": scalar([1.0], F32)}
    names = ["features", "max", "min", "beams", "ret", "lp", "", "", "", "", "dii", "lproc"]
    prompted = {**feeds, "dii": np.array([[91, 93]] * 2, I32), "lproc": scalar([0], I32)}
    return [Case("whisper-model-type-2", feeds, attrs, **tol),
            Case("whisper-prompt-per-step-scores", prompted, attrs, names=names,
                 **{**tol, "n_out": 3, "atol": 1e-4}),
            # logits_processor 1 is the timestamp processor: BeamSearch has no
            # beginning_timestamp_token_id, so onnxruntime fails its range check
            Case("whisper-timestamps-refused", {**prompted, "lproc": scalar([1], I32)}, attrs,
                 names=names, refuses=True, **tol),
            # and its schema check refuses WhisperBeamSearch's attributes
            Case("whisper-timestamp-attribute-refused", feeds,
                 {**attrs, "beginning_timestamp_token_id": 97}, refuses=True, **tol)]


@spec("WhisperBeamSearch")
def whisper_beam_search(rng):
    enc, dec = whisper_pair(5)
    tokens = {"eos_token_id": 90, "pad_token_id": 89, "decoder_start_token_id": 91,
              "translate_token_id": 92, "transcribe_token_id": 93, "start_of_lm_token_id": 94,
              "no_timestamps_token_id": 96, "beginning_timestamp_token_id": 97,
              "model_type": 2, "encoder": enc, "decoder": dec}
    feeds = {"features": rng.standard_normal((2, 4, 5)).astype(F32), "max": scalar([9], I32),
             "min": scalar([1], I32), "beams": scalar([3], I32), "ret": scalar([2], I32),
             "lp": scalar([1.0], F32)}
    names = ["features", "max", "min", "beams", "ret", "lp", "", "", "", "", "dii", "lproc", "",
             "", "temp"]
    prompted = {**feeds, "dii": np.array([[91, 93]] * 2, I32), "lproc": scalar([1], I32),
                "temp": scalar([0.8], F32)}
    tol = {"n_out": 2, "rtol": 1e-4, "atol": 1e-5, "opset": 17}
    return [Case("3-beams-2-returned", feeds, tokens, **tol),
            Case("prompt-timestamps-temperature", prompted, tokens, names=names, **tol),
            Case("per-step-scores", prompted, tokens, names=names,
                 **{**tol, "n_out": 3, "atol": 1e-4}),
            # onnxruntime's CPU kernel refuses the cross QK output
            Case("cross-qk-refused", feeds, {**tokens, "decoder_output_cross_qk": 1},
                 refuses=True, **tol),
            # and runs no decoder step when max_length is the prompt's length + 1
            Case("max-length-prompt-plus-one", {**prompted, "max": scalar([3], I32)}, tokens,
                 names=names, refuses=True, **tol)]
