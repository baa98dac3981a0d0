"""End to end: zoo transformers fused by onnxruntime's transformer optimizer run on onnxkiln.

onnxruntime.transformers.optimizer.optimize_model rewrites the unfused graphs into com.microsoft
contrib ops (Attention, EmbedLayerNormalization, SkipLayerNormalization, BiasGelu/FastGelu).
opt_level=0 runs only its Python fusion passes (levels >= 1 also need torch). The fused model
is saved the way the optimizer's users save it (save_model_to_file adds the com.microsoft
opset import), loaded from disk by onnxkiln and compared with onnxruntime to 1e-4.
"""

from __future__ import annotations

import collections
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxkiln import InferenceSession, zoo
from onnxkiln.testing import ort_session

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (test extra)")
optimizer = pytest.importorskip("onnxruntime.transformers.optimizer",
                                reason="onnxruntime.transformers is not available")

TOL = 1e-4
MS = "com.microsoft"
BERT = zoo.BertConfig(layers=2, hidden=64, heads=4, ffn=256, vocab=100, max_positions=64)
GPT = zoo.GptConfig(layers=2, hidden=64, heads=4, vocab=100, max_positions=64)


def _torch_style_mask(model: onnx.ModelProto) -> onnx.ModelProto:
    """Split the mask's Unsqueeze(axes=[1, 2]) into Unsqueeze(1) -> Unsqueeze(2).

    torch exports mask[:, None, None, :] as two Unsqueezes, and onnxruntime's BERT attention
    fusion only recognises that form of the mask path (Mul <- Sub <- Cast <- Unsqueeze <-
    Unsqueeze); zoo.bert_encoder emits one Unsqueeze, which leaves Attention unfused.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    (i, node), = [(i, n) for i, n in enumerate(graph.node)
                  if n.op_type == "Unsqueeze" and n.input[0] == "attention_mask"]
    out = node.output[0]
    graph.initializer.extend([helper.make_tensor(f"{out}/axis{a}", TensorProto.INT64, [1], [a])
                              for a in (1, 2)])
    first = helper.make_node("Unsqueeze", ["attention_mask", f"{out}/axis1"], [f"{out}/mid"],
                             name=f"{node.name}/1")
    second = helper.make_node("Unsqueeze", [f"{out}/mid", f"{out}/axis2"], [out],
                              name=f"{node.name}/2")
    del graph.node[i]
    graph.node.insert(i, second)
    graph.node.insert(i, first)
    onnx.checker.check_model(model)
    return model


def _optimize(model: onnx.ModelProto, directory, model_type: str, cfg) -> str:
    src, dst = directory / "model.onnx", directory / "model_fused.onnx"
    onnx.save(model, src)
    quiet = logging.getLogger("onnxruntime.transformers.optimizer")
    level, quiet.level = quiet.level, logging.ERROR  # "model producer not matched" warning
    try:
        fused = optimizer.optimize_model(str(src), model_type=model_type, num_heads=cfg.heads,
                                         hidden_size=cfg.hidden, opt_level=0)
    finally:
        quiet.setLevel(level)
    fused.save_model_to_file(str(dst))
    return str(dst)


def _ms_ops(path: str) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(path).graph.node if n.domain == MS)


def _compare(path: str, feeds: dict[str, np.ndarray]) -> None:
    model = onnx.load(path)
    theirs = ort_session(model).run(None, feeds)
    ours = InferenceSession.load(path).run(feeds)
    names = [o.name for o in model.graph.output]
    assert len(ours) == len(theirs)
    for name, a, b in zip(names, ours, theirs):
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype} vs ort {b.dtype}"
        assert a.shape == b.shape, f"{name}: shape {a.shape} vs ort {b.shape}"
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL, err_msg=name)


# --- BERT ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    original = _torch_style_mask(zoo.bert_encoder(BERT, seed=0))
    return original, _optimize(original, tmp_path_factory.mktemp("bert"), "bert", BERT)


def test_bert_is_fused(bert):
    _, path = bert
    ops = _ms_ops(path)
    assert ops["Attention"] == BERT.layers, ops
    assert ops["SkipLayerNormalization"] == 2 * BERT.layers, ops
    assert ops["BiasGelu"] + ops["FastGelu"] + ops["Gelu"] == BERT.layers, ops
    assert ops["EmbedLayerNormalization"] == 1, ops
    unfused = {n.op_type for n in onnx.load(path).graph.node if n.domain in ("", "ai.onnx")}
    assert not unfused & {"Softmax", "Erf", "LayerNormalization"}, unfused


def test_bert_fusion_keeps_semantics_on_ort(bert):
    """onnxruntime on the fused model agrees with onnxruntime on the unfused one."""
    original, path = bert
    feeds = zoo.random_inputs(original, seed=1, batch=3, seq=16)
    fused = ort_session(onnx.load(path)).run(None, feeds)
    for a, b in zip(fused, ort_session(original).run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)


@pytest.mark.parametrize(("batch", "seq"), [(3, 16), (1, 7)])
def test_bert_fused_matches_ort(bert, batch, seq):
    original, path = bert
    feeds = zoo.random_inputs(original, seed=batch * 100 + seq, batch=batch, seq=seq)
    _compare(path, feeds)


# --- GPT-2 decoder step -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    original = zoo.gpt_decoder_step(GPT, seed=0)
    return original, _optimize(original, tmp_path_factory.mktemp("gpt"), "gpt2", GPT)


def test_gpt2_is_fused(gpt):
    """SkipLayerNormalization and FastGelu fuse. Attention does not: onnxruntime's GPT-2
    attention fusion wants the old transformers export (one stacked past_i per layer, causal
    mask sliced from a constant bias buffer); the zoo model has past_key_i/past_value_i and a
    Trilu mask."""
    _, path = gpt
    ops = _ms_ops(path)
    assert ops["FastGelu"] == GPT.layers, ops
    assert ops["SkipLayerNormalization"] == 2 * GPT.layers, ops


@pytest.mark.parametrize(("batch", "seq", "past_seq"), [(2, 1, 5), (1, 4, 0)],
                         ids=["decode", "prefill"])
def test_gpt2_fused_matches_ort(gpt, batch, seq, past_seq):
    original, path = gpt
    feeds = zoo.random_inputs(original, seed=seq, batch=batch, seq=seq, past_seq=past_seq)
    _compare(path, feeds)
