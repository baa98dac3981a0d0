"""A tiny T5/BART style encoder/decoder subgraph pair (model_type 1 of com.microsoft BeamSearch
and GreedySearch, as onnxruntime.transformers' convert_generation writes them) and search
models around it.

encoder: encoder_input_ids, encoder_attention_mask, decoder_input_ids (int32) -> logits
(B, 1, V), encoder_hidden_states (B, S, d), present_{key,value}_self_i (B, heads, 1, hd) for
each layer, then present_{key,value}_cross_i (B, heads, S, hd).
decoder: input_ids (B, 1), encoder_attention_mask, encoder_hidden_states (optional),
past_{key,value}_self_i, past_{key,value}_cross_i -> logits, present_{key,value}_self_i.
The encoder's logits are the decoder's first step on decoder_input_ids with no self past.
"""

from __future__ import annotations

import numpy as np
import onnx
from _gpt_decoder import _KIND, INPUTS, OUTPUTS
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

I32 = TensorProto.INT32
F32 = TensorProto.FLOAT


class _Weights:
    def __init__(self, seed: int, vocab: int, d: int, heads: int, layers: int) -> None:
        rng = np.random.default_rng(seed)
        self.vocab, self.d, self.heads, self.layers = vocab, d, heads, layers
        self.arrays = {"E": rng.standard_normal((vocab, d)) * 1.5,
                       "Wenc": rng.standard_normal((d, d)) / np.sqrt(d),
                       "Wout": rng.standard_normal((d, vocab)) * 1.5}
        for i in range(layers):
            for w in ("q", "k", "v", "ck", "cv", "cq"):
                self.arrays[f"l{i}_W{w}"] = rng.standard_normal((d, d)) / np.sqrt(d)
        self.consts = {"shp": np.array([0, 0, heads, d // heads], np.int64),
                       "shp_back": np.array([0, 0, d], np.int64),
                       "ax12": np.array([1, 2], np.int64),
                       "one": np.array(1.0, np.float32), "neg": np.array(-1e4, np.float32)}

    def inits(self, names) -> list:
        out = [nh.from_array(v.astype(np.float32), k) for k, v in self.arrays.items() if k in names]
        return out + [nh.from_array(v, k) for k, v in self.consts.items()]


def _heads(src: str, w: str, out: str) -> list:
    """out = src @ w split into heads: (B, heads, L, hd)."""
    return [h.make_node("MatMul", [src, w], [out + "_m"]),
            h.make_node("Reshape", [out + "_m", "shp"], [out + "_r"]),
            h.make_node("Transpose", [out + "_r"], [out], perm=[0, 2, 1, 3])]


def _attend(q: str, k: str, v: str, bias: str | None, out: str) -> list:
    nodes = [h.make_node("Transpose", [k], [out + "_kt"], perm=[0, 1, 3, 2]),
             h.make_node("MatMul", [q, out + "_kt"], [out + "_s"])]
    s = out + "_s"
    if bias is not None:
        nodes.append(h.make_node("Add", [s, bias], [out + "_sb"]))
        s = out + "_sb"
    return [*nodes, h.make_node("Softmax", [s], [out + "_a"], axis=-1),
            h.make_node("MatMul", [out + "_a", v], [out + "_o"]),
            h.make_node("Transpose", [out + "_o"], [out + "_t"], perm=[0, 2, 1, 3]),
            h.make_node("Reshape", [out + "_t", "shp_back"], [out])]


def _step(w: _Weights, ids: str, self_past: bool, extra_hidden: str | None) -> list:
    """Decoder-step nodes: ids (B, 1) -> logits, present_{key,value}_self_i; reads
    cross_k_i / cross_v_i and the mask bias `cbias`."""
    nodes = [h.make_node("Gather", ["E", ids], ["x0"])]
    x = "x0"
    if extra_hidden is not None:  # the decoder also reads encoder_hidden_states
        nodes += [h.make_node("ReduceMean", [extra_hidden], ["hmean"], axes=[1], keepdims=1),
                  h.make_node("Add", [x, "hmean"], ["x0h"])]
        x = "x0h"
    for i in range(w.layers):
        p = f"l{i}_"
        nodes += _heads(x, p + "Wq", p + "q") + _heads(x, p + "Wk", p + "k")
        nodes += _heads(x, p + "Wv", p + "v")
        k, v = f"present_key_self_{i}", f"present_value_self_{i}"
        if self_past:
            nodes += [h.make_node("Concat", [f"past_key_self_{i}", p + "k"], [k], axis=2),
                      h.make_node("Concat", [f"past_value_self_{i}", p + "v"], [v], axis=2)]
        else:
            nodes += [h.make_node("Identity", [p + "k"], [k]),
                      h.make_node("Identity", [p + "v"], [v])]
        nodes += _attend(p + "q", k, v, None, p + "sa")
        nodes += [h.make_node("Add", [x, p + "sa"], [p + "x1"])]
        nodes += _heads(p + "x1", p + "Wcq", p + "cq")
        nodes += _attend(p + "cq", f"cross_k_{i}", f"cross_v_{i}", "cbias", p + "ca")
        nodes += [h.make_node("Add", [p + "x1", p + "ca"], [p + "x"])]
        x = p + "x"
    return [*nodes, h.make_node("MatMul", [x, "Wout"], ["logits"])]


def _mask_bias() -> list:
    return [h.make_node("Cast", ["encoder_attention_mask"], ["maskf"], to=F32),
            h.make_node("Sub", ["one", "maskf"], ["inv"]),
            h.make_node("Mul", ["inv", "neg"], ["bias2"]),
            h.make_node("Unsqueeze", ["bias2", "ax12"], ["cbias"])]


def _cross_layers(w: _Weights, nodes: list, outs: list, self_len, cross_len) -> list:
    """Add each layer's cross keys/values over encoder_hidden_states (nodes) and its self
    present outputs (outs); return the cross present outputs (self: `self_len` positions,
    cross: `cross_len`)."""
    hd = w.d // w.heads
    cross = []
    for i in range(w.layers):
        nodes += _heads("encoder_hidden_states", f"l{i}_Wck", f"cross_k_{i}")
        nodes += _heads("encoder_hidden_states", f"l{i}_Wcv", f"cross_v_{i}")
        nodes += [h.make_node("Identity", [f"cross_k_{i}"], [f"present_key_cross_{i}"]),
                  h.make_node("Identity", [f"cross_v_{i}"], [f"present_value_cross_{i}"])]
        for kv in ("key", "value"):
            outs.append(h.make_tensor_value_info(f"present_{kv}_self_{i}", F32,
                                                 ["B", w.heads, self_len, hd]))
            cross.append(h.make_tensor_value_info(f"present_{kv}_cross_{i}", F32,
                                                  ["B", w.heads, cross_len, hd]))
    return cross


def encoder_graph(w: _Weights) -> onnx.GraphProto:
    nodes = [h.make_node("Gather", ["E", "encoder_input_ids"], ["e0"]),
             h.make_node("MatMul", ["e0", "Wenc"], ["e1"]),
             h.make_node("Tanh", ["e1"], ["encoder_hidden_states"]), *_mask_bias()]
    outs = [h.make_tensor_value_info("logits", F32, ["B", 1, w.vocab]),
            h.make_tensor_value_info("encoder_hidden_states", F32, ["B", "S", w.d])]
    cross = _cross_layers(w, nodes, outs, 1, "S")
    nodes += _step(w, "decoder_input_ids", False, None)
    ins = [h.make_tensor_value_info(n, I32, ["B", s]) for n, s in
           (("encoder_input_ids", "S"), ("encoder_attention_mask", "S"), ("decoder_input_ids", 1))]
    return h.make_graph(nodes, "encoder", ins, outs + cross, w.inits(w.arrays))


def decoder_graph(w: _Weights, hidden: bool = True) -> onnx.GraphProto:
    hd = w.d // w.heads
    nodes = _mask_bias()
    ins = [h.make_tensor_value_info("input_ids", I32, ["B", 1]),
           h.make_tensor_value_info("encoder_attention_mask", I32, ["B", "S"])]
    if hidden:
        ins.append(h.make_tensor_value_info("encoder_hidden_states", F32, ["B", "S", w.d]))
    outs = [h.make_tensor_value_info("logits", F32, ["B", 1, w.vocab])]
    cross = []
    for i in range(w.layers):
        for kv, c in (("key", "k"), ("value", "v")):
            ins.append(h.make_tensor_value_info(f"past_{kv}_self_{i}", F32,
                                                ["B", w.heads, "P", hd]))
            cross.append(h.make_tensor_value_info(f"past_{kv}_cross_{i}", F32,
                                                  ["B", w.heads, "S", hd]))
            nodes.append(h.make_node("Identity", [f"past_{kv}_cross_{i}"], [f"cross_{c}_{i}"]))
            outs.append(h.make_tensor_value_info(f"present_{kv}_self_{i}", F32,
                                                 ["B", w.heads, "T", hd]))
    nodes += _step(w, "input_ids", True, "encoder_hidden_states" if hidden else None)
    return h.make_graph(nodes, "decoder", ins + cross, outs, w.inits(w.arrays))


def pair(seed: int = 0, vocab: int = 13, d: int = 8, heads: int = 2, layers: int = 2,
         hidden: bool = True) -> tuple[onnx.GraphProto, onnx.GraphProto]:
    """(encoder, decoder) graphs sharing random weights."""
    w = _Weights(seed, vocab, d, heads, layers)
    return encoder_graph(w), decoder_graph(w, hidden)


def search_model(op: str, feeds: dict, n_outputs: int = 1, graphs=None, start: int = 1,
                 **attrs) -> onnx.ModelProto:
    """A model with one model_type=1 `op` node over the pair; feeds present become graph
    inputs, the others absent inputs."""
    names = INPUTS[op]
    last = max(names.index(k) for k in feeds)
    node_inputs = [n if n in feeds else "" for n in names[:last + 1]]
    vis = [h.make_tensor_value_info(n, _KIND[n], list(np.shape(feeds[n]))) for n in feeds]
    outs = OUTPUTS[op][:n_outputs]
    enc, dec = graphs if graphs is not None else pair()
    attrs.setdefault("decoder_start_token_id", start)
    node = h.make_node(op, node_inputs, outs, domain="com.microsoft", model_type=1, encoder=enc,
                       decoder=dec, **attrs)
    g = h.make_graph([node], "search", vis, [h.make_value_info(o, onnx.TypeProto()) for o in outs])
    opsets = [h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]
    return h.make_model(g, opset_imports=opsets, ir_version=8)
