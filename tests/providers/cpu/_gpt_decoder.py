"""A tiny GPT-2 style decoder subgraph (token and position embeddings, attention layers with a
past state per layer, a vocab projection) and search-op models around it, for the
GreedySearch / BeamSearch / Sampling tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

I32 = TensorProto.INT32
F32 = TensorProto.FLOAT
OUTPUTS = {"BeamSearch": ["sequences", "sequences_scores", "scores"],
           "GreedySearch": ["sequences"], "Sampling": ["sequences", "filtered_logits"]}
INPUTS = {
    "GreedySearch": ["input_ids", "max_length", "min_length", "repetition_penalty",
                     "vocab_mask", "prefix_vocab_mask", "attention_mask"],
    "Sampling": ["input_ids", "max_length", "min_length", "repetition_penalty", "vocab_mask",
                 "prefix_vocab_mask", "attention_mask", "presence_mask", "seed"],
    "BeamSearch": ["input_ids", "max_length", "min_length", "num_beams", "num_return_sequences",
                   "length_penalty", "repetition_penalty", "vocab_mask", "prefix_vocab_mask",
                   "attention_mask"],
}


def _attention(p: str, x: str, layer: int, d: int, heads: int, rng, init) -> list:
    nodes = []
    for w in "qkv":
        init(p + "W" + w, (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32))
        nodes += [h.make_node("MatMul", [x, p + "W" + w], [p + w]),
                  h.make_node("Reshape", [p + w, "shp"], [p + w + "r"]),
                  h.make_node("Transpose", [p + w + "r"], [p + w + "t"], perm=[0, 2, 1, 3])]
    return [
        *nodes,
        h.make_node("Split", [f"past_{layer}", "split11"], [p + "pk", p + "pv"], axis=0),
        h.make_node("Squeeze", [p + "pk", "ax0"], [p + "pk2"]),
        h.make_node("Squeeze", [p + "pv", "ax0"], [p + "pv2"]),
        h.make_node("Concat", [p + "pk2", p + "kt"], [p + "K"], axis=2),
        h.make_node("Concat", [p + "pv2", p + "vt"], [p + "V"], axis=2),
        h.make_node("Unsqueeze", [p + "K", "ax0"], [p + "Ku"]),
        h.make_node("Unsqueeze", [p + "V", "ax0"], [p + "Vu"]),
        h.make_node("Concat", [p + "Ku", p + "Vu"], [f"present_{layer}"], axis=0),
        h.make_node("Transpose", [p + "K"], [p + "KT"], perm=[0, 1, 3, 2]),
        h.make_node("MatMul", [p + "qt", p + "KT"], [p + "s"]),
        h.make_node("Add", [p + "s", "bias"], [p + "sb"]),
        h.make_node("Softmax", [p + "sb"], [p + "a"], axis=-1),
        h.make_node("MatMul", [p + "a", p + "V"], [p + "o"]),
        h.make_node("Transpose", [p + "o"], [p + "ot"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", [p + "ot", "shp_back"], [p + "or"]),
        h.make_node("Add", [x, p + "or"], [p + "x"]),
    ]


def decoder_graph(seed: int = 0, vocab: int = 13, d: int = 8, heads: int = 2, layers: int = 2,
                  name: str = "decoder", past_shape=None,
                  logit_scale: float = 1.5) -> onnx.GraphProto:
    """input_ids, position_ids, attention_mask (int32), past_i (2, B, heads, P, d/heads) ->
    logits (B, S, vocab), present_i; attention over past and new keys, masked by the mask."""
    rng = np.random.default_rng(seed)
    hd = d // heads
    inits = []

    def init(n, a):
        inits.append(nh.from_array(np.asarray(a), n))

    init("E", (rng.standard_normal((vocab, d)) * 1.5).astype(np.float32))
    init("P", (rng.standard_normal((64, d)) * 0.5).astype(np.float32))
    init("Wout", (rng.standard_normal((d, vocab)) * logit_scale).astype(np.float32))
    init("shp", np.array([0, 0, heads, hd], np.int64))
    init("shp_back", np.array([0, 0, d], np.int64))
    init("one", np.array(1.0, np.float32))
    init("neg", np.array(-1e4, np.float32))
    init("ax12", np.array([1, 2], np.int64))
    init("ax0", np.array([0], np.int64))
    init("split11", np.array([1, 1], np.int64))
    nodes = [
        h.make_node("Gather", ["E", "input_ids"], ["emb"]),
        h.make_node("Gather", ["P", "position_ids"], ["pos"]),
        h.make_node("Add", ["emb", "pos"], ["h0"]),
        h.make_node("Cast", ["attention_mask"], ["maskf"], to=F32),
        h.make_node("Sub", ["one", "maskf"], ["inv"]),
        h.make_node("Mul", ["inv", "neg"], ["bias2"]),
        h.make_node("Unsqueeze", ["bias2", "ax12"], ["bias"]),
    ]
    ins = [h.make_tensor_value_info("input_ids", I32, ["B", "S"]),
           h.make_tensor_value_info("position_ids", I32, ["B", "S"]),
           h.make_tensor_value_info("attention_mask", I32, ["B", "T"])]
    outs = [h.make_tensor_value_info("logits", F32, ["B", "S", vocab])]
    x = "h0"
    for layer in range(layers):
        nodes += _attention(f"l{layer}_", x, layer, d, heads, rng, init)
        x = f"l{layer}_x"
        shape = past_shape or [2, "B", heads, "P", hd]
        ins.append(h.make_tensor_value_info(f"past_{layer}", F32, shape))
        outs.append(h.make_tensor_value_info(f"present_{layer}", F32, [2, "B", heads, "T", hd]))
    nodes.append(h.make_node("MatMul", [x, "Wout"], ["logits"]))
    return h.make_graph(nodes, name, ins, outs, inits)


_KIND = {"input_ids": I32, "max_length": I32, "min_length": I32, "num_beams": I32,
         "num_return_sequences": I32, "length_penalty": F32, "repetition_penalty": F32,
         "vocab_mask": I32, "prefix_vocab_mask": I32, "attention_mask": I32,
         "presence_mask": I32, "seed": I32}


def search_model(op: str, feeds: dict, n_outputs: int = 1, graph=None, **attrs) -> onnx.ModelProto:
    """A model with one `op` node over `graph` (default decoder_graph()); the feeds present
    become graph inputs, the others absent inputs."""
    names = INPUTS[op]
    last = max(names.index(k) for k in feeds)
    node_inputs = [n if n in feeds else "" for n in names[:last + 1]]
    vis = [h.make_tensor_value_info(n, _KIND[n], list(np.shape(feeds[n]))) for n in feeds]
    outs = OUTPUTS[op][:n_outputs]
    attrs.setdefault("decoder", graph if graph is not None else decoder_graph())
    node = h.make_node(op, node_inputs, outs, domain="com.microsoft", **attrs)
    g = h.make_graph([node], "search", vis, [h.make_value_info(o, onnx.TypeProto()) for o in outs])
    opsets = [h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]
    return h.make_model(g, opset_imports=opsets, ir_version=8)


def scalar(v, dtype=np.int32) -> np.ndarray:
    return np.array([v], dtype)


def with_outer_weights(op: str, feeds: dict, names=("E", "Wout"), **attrs) -> onnx.ModelProto:
    """A search model whose decoder reads some weights from the main graph (as
    convert_generation writes it when it shares initializers between subgraphs)."""
    g = decoder_graph()
    moved = [t for t in g.initializer if t.name in names]
    keep = [t for t in g.initializer if t.name not in names]
    del g.initializer[:]
    g.initializer.extend(keep)
    m = search_model(op, feeds, graph=g, **attrs)
    m.graph.initializer.extend(moved)
    return m
