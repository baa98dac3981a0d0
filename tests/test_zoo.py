"""Zoo models are valid ONNX, mean what they claim (checked on onnxruntime), and onnxkiln
matches onnxruntime on them."""

from __future__ import annotations

import collections
import dataclasses
from functools import cache

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxkiln import zoo
from onnxkiln.testing import assert_matches_ort, run_ort

# name -> (generator, config overrides, symbolic dim sizes)
CASES = {
    "mlp": (zoo.mlp, {}, {}),
    "mlp_batch2": (zoo.mlp, {}, {"batch": 2}),
    "resnet_basic": (zoo.resnet, {}, {}),
    "resnet_bottleneck_batch2": (
        zoo.resnet, {"layers": (1, 1, 1), "widths": (4, 8, 8), "bottleneck": True}, {"batch": 2}
    ),
    "bert": (zoo.bert_encoder, {}, {"seq": 8}),
    "bert_batch2_padded": (zoo.bert_encoder, {}, {"batch": 2, "seq": 7}),
    "gpt_decode_past5": (zoo.gpt_decoder_step, {}, {"seq": 1, "past_seq": 5}),
    "gpt_decode_batch2": (zoo.gpt_decoder_step, {}, {"batch": 2, "seq": 1, "past_seq": 5}),
    "gpt_prefill_empty_past": (zoo.gpt_decoder_step, {}, {"seq": 3, "past_seq": 0}),
    "gpt_range_mask_prefill_past2": (
        zoo.gpt_decoder_step, {"causal_mask": "range"}, {"batch": 2, "seq": 3, "past_seq": 2}
    ),
    "mobilenet": (zoo.mobilenet_v2, {}, {}),
    "mobilenet_batch2": (zoo.mobilenet_v2, {"image_size": 24}, {"batch": 2}),
    "lstm": (zoo.lstm, {}, {}),
    "lstm_batch2_seq9_one_layer": (zoo.lstm, {"layers": 1}, {"batch": 2, "seq": 9}),
    "lstm_three_layers": (zoo.lstm, {"layers": 3, "input_size": 4}, {"seq": 3}),
}

@cache
def _model(generator, overrides: tuple) -> onnx.ModelProto:
    return generator(seed=0, **dict(overrides))


def _case(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    generator, overrides, dims = CASES[name]
    model = _model(generator, tuple(overrides.items()))
    return model, zoo.random_inputs(model, seed=1, **dims)


@pytest.mark.parametrize("name", CASES)
def test_model_is_valid_opset17_onnx(name):
    model, _ = _case(name)
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]


@pytest.mark.parametrize("name", CASES)
def test_onnxruntime_agrees_with_reference_evaluator(name):
    model, feeds = _case(name)
    ours = ReferenceEvaluator(model).run(None, feeds)
    for got, want in zip(run_ort(model, feeds), ours):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert np.isfinite(got).all()


@pytest.mark.parametrize("optimization", ["all", "disabled"])
@pytest.mark.parametrize("name", CASES)
def test_onnxkiln_matches_onnxruntime(name, optimization):
    model, feeds = _case(name)
    assert_matches_ort(model, feeds, rtol=1e-4, atol=1e-4, optimization=optimization)


def test_gpt_decode_with_cache_equals_full_prefill():
    model = _model(zoo.gpt_decoder_step, ())
    ids = np.array([[5, 17, 42, 7]], dtype=np.int64)
    empty = zoo.random_inputs(model, batch=1, seq=3, past_seq=0)
    full = run_ort(model, {**empty, "input_ids": ids})
    prefill = run_ort(model, {**empty, "input_ids": ids[:, :3]})
    names = [o.name for o in model.graph.output]
    past = {n.replace("present", "past"): v for n, v in zip(names[1:], prefill[1:])}
    step = run_ort(model, {"input_ids": ids[:, 3:], **past})
    np.testing.assert_allclose(prefill[0], full[0][:, :3], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(step[0], full[0][:, 3:], rtol=1e-4, atol=1e-5)
    for got, want in zip(step[1:], full[1:]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_causal_mask_variants_agree():
    feeds = zoo.random_inputs(_model(zoo.gpt_decoder_step, ()), seed=3, seq=4, past_seq=3)
    trilu = run_ort(_model(zoo.gpt_decoder_step, ()), feeds)
    ranged = run_ort(_model(zoo.gpt_decoder_step, (("causal_mask", "range"),)), feeds)
    for a, b in zip(trilu, ranged):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bert_padding_does_not_change_real_tokens():
    model = _model(zoo.bert_encoder, ())
    ids = np.array([[3, 9, 27, 81, 0, 0]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 1, 0, 0]], dtype=np.int64)
    a = run_ort(model, {"input_ids": ids, "attention_mask": mask})
    b = run_ort(model, {"input_ids": ids[:, [0, 1, 2, 3, 5, 4]] + [[0, 0, 0, 0, 50, 60]],
                        "attention_mask": mask})
    np.testing.assert_allclose(a[0][:, :4], b[0][:, :4], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "small", "nodes"),
    [
        ("resnet", {"widths": (2, 2, 2, 2), "stem_width": 4, "image_size": 32}, 175),
        ("bert", {"hidden": 36, "ffn": 48, "vocab": 50, "max_positions": 16}, 512),
        ("gpt2", {"hidden": 24, "vocab": 50, "max_positions": 16}, 549),
    ],
)
def test_realistic_topologies_with_shrunk_widths(name, small, nodes):
    generator, _, realistic = zoo.MODELS[name]
    model = generator(dataclasses.replace(realistic, **small))
    assert len(model.graph.node) == nodes
    feeds = zoo.random_inputs(model, seq=5, past_seq=3)
    assert all(np.isfinite(o).all() for o in run_ort(model, feeds))


def test_generators_are_deterministic_per_seed():
    assert zoo.bert_encoder(seed=4).SerializeToString() == zoo.bert_encoder(seed=4)\
        .SerializeToString()
    assert zoo.resnet(seed=4).graph.initializer[0] != zoo.resnet(seed=5).graph.initializer[0]
    model = _model(zoo.bert_encoder, ())
    a, b = zoo.random_inputs(model, seed=2), zoo.random_inputs(model, seed=2)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_random_inputs_binds_dims_and_respects_hints():
    model = _model(zoo.bert_encoder, ())
    feeds = zoo.random_inputs(model, batch=3, seq=10)
    assert feeds["input_ids"].shape == (3, 10) and feeds["input_ids"].dtype == np.int64
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < 100
    mask = feeds["attention_mask"]
    assert mask[0].all() and set(np.unique(mask)) <= {0, 1}
    assert all((np.diff(row) <= 0).all() for row in mask)  # padding only at the end
    hintless = onnx.ModelProto()
    hintless.CopyFrom(model)
    del hintless.metadata_props[:]
    with pytest.raises(ValueError, match="'batch'"):
        zoo.random_inputs(hintless)


def test_default_model_is_small_and_runs():
    model, feeds = zoo.default_model()
    outs = run_ort(model, feeds)
    assert outs[0].shape == (1, 32, 64)
    assert sum(t.ByteSize() for t in model.graph.initializer) < 2_000_000


def test_mobilenet_v2_realistic_topology_with_shrunk_widths():
    _, _, realistic = zoo.MODELS["mobilenet"]
    stages = tuple((t, 8, n, s) for t, _, n, s in realistic.stages)
    model = zoo.mobilenet_v2(dataclasses.replace(realistic, stages=stages, stem_width=8,
                                                 last_width=16, image_size=32))
    ops = collections.Counter(n.op_type for n in model.graph.node)
    # 17 blocks: 16 expand + 17 depthwise + 17 project convs, stem and last conv
    assert ops["Conv"] == 52 and ops["BatchNormalization"] == 52 and ops["Clip"] == 35
    depthwise = [n for n in model.graph.node if n.op_type == "Conv"
                 and next(a.i for a in n.attribute if a.name == "group") > 1]
    assert len(depthwise) == 17
    assert ops["Add"] == 13  # 10 later blocks + 3 stride-1 stage starts (widths all equal)
    out = run_ort(model, zoo.random_inputs(model))
    assert out[0].shape == (1, 1000) and np.isfinite(out[0]).all()


def test_mobilenet_v2_realistic_parameter_count():
    model = zoo.mobilenet_v2(zoo.MobileNetConfig.v2())
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    bn_stats = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                   if t.name.endswith(("running_mean", "running_var")))
    assert params - bn_stats == 3_504_872  # torchvision mobilenet_v2's parameter count
    assert len(model.graph.node) == 154
    assert sum(n.op_type == "Add" for n in model.graph.node) == 10


def test_lstm_matches_a_numpy_recurrence():
    model = _model(zoo.lstm, (("layers", 1),))
    feeds = zoo.random_inputs(model, seed=2, batch=2, seq=4)
    w, r, bias = (numpy_helper.to_array(t)[0] for t in model.graph.initializer[:3])
    n = r.shape[1]
    h = c = np.zeros((2, n), np.float32)
    ys = []
    for x in feeds["x"].transpose(1, 0, 2):
        i, o, f, g = np.split(x @ w.T + h @ r.T + bias[:4 * n] + bias[4 * n:], 4, axis=1)
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        ys.append(h)
    output, logits = run_ort(model, feeds)
    np.testing.assert_allclose(output, np.stack(ys, axis=1), rtol=1e-5, atol=1e-6)
    assert logits.shape == (2, 5)
