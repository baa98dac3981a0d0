"""Generated cases for the search ops (GreedySearch, Sampling, BeamSearch) over a one-layer
GPT-2 style decoder subgraph with random weights: the logits read the whole past (so a wrong
cache changes the tokens), eos/pad handling, min_length, repetition penalty, n-gram blocking;
Sampling only with top_p small enough to keep one token (its generator is not onnxruntime's)."""

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
    return [Case("3-beams-2-returned", feeds, attrs, n_out=2, rtol=1e-4, atol=1e-5, opset=17)]
