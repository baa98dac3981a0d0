"""A tiny Whisper style encoder/decoder subgraph pair (model_type 2 of com.microsoft
WhisperBeamSearch and BeamSearch, as onnxruntime.transformers' Whisper export writes it for
the beam search op) and search models around it.

encoder: encoder_input_ids (float features (B, FEATURES, FRAMES)), decoder_input_ids (B, L)
-> logits (B, L, V), encoder_hidden_states (B, FRAMES, d), present_{key,value}_self_i
(B, heads, L, hd) for each layer, then present_{key,value}_cross_i (B, heads, FRAMES, hd).
decoder: input_ids (B, 1), or (B, S) for the whole-sequence form, encoder_hidden_states
(optional; read only with reads_hidden, as the export declares it unread),
past_{key,value}_self_i, past_{key,value}_cross_i -> logits, present_{key,value}_self_i.
The layers are _t5_pair's (self attention over the pasts, cross attention over the encoder's
keys and values), without a mask.
"""

from __future__ import annotations

import numpy as np
import onnx
from _t5_pair import _cross_layers, _step, _Weights
from onnx import TensorProto
from onnx import helper as h

I32 = TensorProto.INT32
F32 = TensorProto.FLOAT
FEATURES, FRAMES = 4, 6
INPUTS = ["input_features", "max_length", "min_length", "num_beams", "num_return_sequences",
          "length_penalty", "repetition_penalty", "vocab_mask", "prefix_vocab_mask",
          "attention_mask", "decoder_input_ids", "logits_processor", "cross_qk_layer_head",
          "extra_decoding_ids", "temperature"]
OUTPUTS = ["sequences", "sequences_scores", "scores", "cross_qk", "no_speech_probs"]


def _weights(seed: int, vocab: int, d: int, heads: int, layers: int) -> _Weights:
    w = _Weights(seed, vocab, d, heads, layers)
    rng = np.random.default_rng(seed + 1000)
    w.arrays["Wfeat"] = rng.standard_normal((FEATURES, d))
    w.consts["cbias"] = np.zeros(1, np.float32)  # _step's cross-attention bias: no mask
    return w


def encoder_graph(w: _Weights) -> onnx.GraphProto:
    nodes = [h.make_node("Transpose", ["encoder_input_ids"], ["f0"], perm=[0, 2, 1]),
             h.make_node("MatMul", ["f0", "Wfeat"], ["f1"]),
             h.make_node("Tanh", ["f1"], ["encoder_hidden_states"])]
    outs = [h.make_tensor_value_info("logits", F32, ["B", "L", w.vocab]),
            h.make_tensor_value_info("encoder_hidden_states", F32, ["B", FRAMES, w.d])]
    cross = _cross_layers(w, nodes, outs, "L", FRAMES)
    nodes += _step(w, "decoder_input_ids", False, None)
    ins = [h.make_tensor_value_info("encoder_input_ids", F32, ["B", FEATURES, FRAMES]),
           h.make_tensor_value_info("decoder_input_ids", I32, ["B", "L"])]
    return h.make_graph(nodes, "encoder", ins, outs + cross, w.inits(w.arrays))


def decoder_graph(w: _Weights, hidden: bool = True, whole: bool = False,
                  reads_hidden: bool = False) -> onnx.GraphProto:
    hd = w.d // w.heads
    nodes = []
    ins = [h.make_tensor_value_info("input_ids", I32, ["B", "S" if whole else 1])]
    if hidden:
        ins.append(h.make_tensor_value_info("encoder_hidden_states", F32, ["B", FRAMES, w.d]))
    outs = [h.make_tensor_value_info("logits", F32, ["B", "S" if whole else 1, w.vocab])]
    cross = []
    for i in range(w.layers):
        for kv, c in (("key", "k"), ("value", "v")):
            ins.append(h.make_tensor_value_info(f"past_{kv}_self_{i}", F32,
                                                ["B", w.heads, "P", hd]))
            cross.append(h.make_tensor_value_info(f"past_{kv}_cross_{i}", F32,
                                                  ["B", w.heads, FRAMES, hd]))
            nodes.append(h.make_node("Identity", [f"past_{kv}_cross_{i}"], [f"cross_{c}_{i}"]))
            outs.append(h.make_tensor_value_info(f"present_{kv}_self_{i}", F32,
                                                 ["B", w.heads, "T", hd]))
    nodes += _step(w, "input_ids", True, "encoder_hidden_states" if reads_hidden else None)
    return h.make_graph(nodes, "decoder", ins + cross, outs, w.inits(w.arrays))


def pair(seed: int = 0, vocab: int = 120, d: int = 8, heads: int = 2, layers: int = 2,
         hidden: bool = True, whole: bool = False,
         reads_hidden: bool = False) -> tuple[onnx.GraphProto, onnx.GraphProto]:
    """(encoder, decoder) graphs sharing random weights."""
    w = _weights(seed, vocab, d, heads, layers)
    return encoder_graph(w), decoder_graph(w, hidden, whole, reads_hidden)


def features(rng: np.random.Generator, batch: int) -> np.ndarray:
    return rng.standard_normal((batch, FEATURES, FRAMES)).astype(np.float32)


def search_model(feeds: dict, outputs=("sequences", "sequences_scores"), graphs=None,
                 op: str = "WhisperBeamSearch", **attrs) -> onnx.ModelProto:
    """A model with one `op` node (WhisperBeamSearch, or BeamSearch with model_type 2, whose
    inputs stop at logits_processor) over the pair; the feeds present become graph inputs,
    the others absent inputs; `outputs` may hold "" for an absent output."""
    last = max(INPUTS.index(k) for k in feeds)
    node_inputs = [n if n in feeds else "" for n in INPUTS[:last + 1]]
    vis = [h.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype),
                                    list(v.shape)) for n, v in feeds.items()]
    enc, dec = graphs if graphs is not None else pair()
    attrs.setdefault("model_type", 2)
    node = h.make_node(op, node_inputs, list(outputs), domain="com.microsoft", encoder=enc,
                       decoder=dec, **attrs)
    g = h.make_graph([node], "search", vis,
                     [h.make_value_info(o, onnx.TypeProto()) for o in outputs if o])
    opsets = [h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]
    return h.make_model(g, opset_imports=opsets, ir_version=8)


def with_outer_weights(feeds: dict, names=("E", "Wout"), **attrs) -> onnx.ModelProto:
    """A search model whose subgraphs read some weights from the main graph."""
    enc, dec = pair()
    moved = [t for t in enc.initializer if t.name in names]
    for g in (enc, dec):
        keep = [t for t in g.initializer if t.name not in names]
        del g.initializer[:]
        g.initializer.extend(keep)
    m = search_model(feeds, graphs=(enc, dec), **attrs)
    m.graph.initializer.extend(moved)
    return m



def shared_buffer_decoder(w_seed: int = 0, cross_qk: bool = False) -> onnx.GraphProto:
    """A decoder in the past/present-sharing form (DecoderMaskedMultiHeadAttention reading
    past_sequence_length, beam_width and cache_indirection), one layer and one head, with a
    cross_qk_0 output when `cross_qk`."""
    w = _weights(w_seed, 120, 8, 1, 1)
    vi = h.make_tensor_value_info
    kv, cross = ["B", 1, "M", w.d], ["B", 1, FRAMES, w.d]
    nodes = [h.make_node("Gather", ["E", "input_ids"], ["x"]),
             h.make_node("DecoderMaskedMultiHeadAttention",
                         ["x", "x", "x", "", "", "past_key_self_0", "past_value_self_0",
                          "past_sequence_length", "beam_width", "cache_indirection"],
                         ["att", "present_key_self_0", "present_value_self_0"],
                         domain="com.microsoft", num_heads=1, past_present_share_buffer=1),
             h.make_node("Add", ["x", "att"], ["x2"]),
             h.make_node("MatMul", ["x2", "Wout"], ["logits"])]
    outs = [vi("logits", F32, ["B", 1, 120]), vi("present_key_self_0", F32, kv),
            vi("present_value_self_0", F32, kv)]
    if cross_qk:
        nodes += [h.make_node("ReduceMean", ["past_key_cross_0"], ["cq"], axes=[3]),
                  h.make_node("Transpose", ["cq"], ["cross_qk_0"], perm=[0, 1, 3, 2])]
        outs.append(vi("cross_qk_0", F32, ["B", 1, 1, FRAMES]))
    ins = [vi("input_ids", I32, ["B", 1]), vi("encoder_hidden_states", F32, ["B", FRAMES, w.d]),
           vi("past_key_self_0", F32, kv), vi("past_value_self_0", F32, kv),
           vi("past_key_cross_0", F32, cross), vi("past_value_cross_0", F32, cross),
           vi("past_sequence_length", I32, [1]), vi("beam_width", I32, [1]),
           vi("cache_indirection", I32, ["B", "K", "M"])]
    return h.make_graph(nodes, "decoder", ins, outs, w.inits(w.arrays))
