"""The optimize() pipeline on the zoo models: every level matches onnxruntime, node counts only
go down, the saved model loads (and runs in onnxruntime where it uses only its ops)."""

from __future__ import annotations

from functools import cache

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxkiln import loader, zoo
from onnxkiln.errors import InvalidOptionError
from onnxkiln.optimizer import LEVELS, OptimizeReport, optimize, save
from onnxkiln.testing import ort_session

CASES = {  # name -> (generator, small config, symbolic dim sizes)
    "mlp": (zoo.mlp, zoo.MlpConfig(), {"batch": 2}),
    "resnet": (zoo.resnet, zoo.ResNetConfig(), {}),
    "resnet_bottleneck": (zoo.resnet, zoo.ResNetConfig(layers=(1, 1), widths=(4, 8),
                                                       bottleneck=True), {"batch": 2}),
    "bert": (zoo.bert_encoder, zoo.BertConfig(), {"batch": 2, "seq": 7}),
    "gpt2_decode": (zoo.gpt_decoder_step, zoo.GptConfig(), {"seq": 1, "past_seq": 5}),
    "gpt2_prefill_range_mask": (zoo.gpt_decoder_step, zoo.GptConfig(causal_mask="range"),
                                {"batch": 2, "seq": 3, "past_seq": 2}),
}


@cache
def _case(name: str):
    generator, cfg, dims = CASES[name]
    proto = generator(cfg, seed=0)
    feeds = zoo.random_inputs(proto, seed=1, **dims)
    return proto, feeds, ort_session(proto).run(None, feeds)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_zoo_model_matches_onnxruntime_at_every_level(harness, name, level):
    proto, feeds, expected = _case(name)
    model = harness.optimize(proto, level)
    got = harness.run(model, feeds)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    assert [v.name for v in model.graph.outputs] == [o.name for o in proto.graph.output]
    assert [v.name for v in model.graph.inputs] == [i.name for i in proto.graph.input]


@pytest.mark.parametrize("name", sorted(CASES))
def test_node_counts_only_go_down(harness, name):
    proto = _case(name)[0]
    counts = [len(harness.optimize(proto, level).graph) for level in LEVELS]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == len(proto.graph.node)
    assert counts[2] < counts[1]  # every zoo model has something to fuse


@pytest.mark.parametrize("name", ["bert", "gpt2_decode", "resnet"])
def test_optimizing_twice_changes_nothing_more(harness, name):
    model = harness.optimize(_case(name)[0], "all")
    before = harness.ops(model)
    report = OptimizeReport()
    optimize(model, "all", report=report)
    assert harness.ops(model) == before
    assert not {k: v for k, v in report.items() if k != "dead" and v}


def test_untouched_weights_are_not_copied():
    proto = _case("bert")[0]
    model = loader.from_graph(proto)
    tensors = {name: v.const_value for name, v in model.graph.initializers.items()}
    optimize(model, "all")
    kept = [n for n in model.graph.initializers if n in tensors]
    assert "encoder.layer.0.intermediate.dense.weight" in kept
    assert all(model.graph.initializers[n].const_value is tensors[n] for n in kept)


def test_report_counts_rewrites():
    report = OptimizeReport()
    optimize(loader.from_graph(_case("bert")[0]), "all", report=report)
    layers = zoo.BertConfig().layers
    assert report["attention"] == layers
    assert report["gelu.erf"] == layers
    assert report["layernorm.skip"] == 2 * layers
    assert report.seconds > 0


def test_unknown_level_is_an_error():
    with pytest.raises(InvalidOptionError, match="basic"):
        optimize(loader.from_graph(_case("mlp")[0]), "aggressive")


@pytest.mark.parametrize("name", ["resnet", "mlp"])
def test_saved_contrib_model_runs_in_onnxruntime(harness, tmp_path, name):
    proto, feeds, expected = _case(name)
    model = harness.optimize(proto, "all")
    path = tmp_path / "opt.onnx"
    save(model, path)
    onnx.checker.check_model(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for a, b in zip(session.run(None, feeds), expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    reloaded = loader.load_path(path)
    assert harness.ops(reloaded) == harness.ops(model)


def test_saved_model_with_onnxkiln_ops_loads_as_far_as_onnxruntime_can(harness, tmp_path):
    proto, feeds, expected = _case("bert")
    model = harness.optimize(proto, "all")
    path = tmp_path / "bert.opt.onnx"
    save(model, path)
    saved = onnx.load(str(path))
    onnx.checker.check_model(saved)
    assert {o.domain: o.version for o in saved.opset_import}["onnxkiln"] == 1
    with pytest.raises(Exception, match="onnxkiln"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = harness.run(loader.load_path(path), feeds)  # and it runs here as saved
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["bert", "gpt2_decode"])
def test_portable_model_runs_in_onnxruntime(harness, tmp_path, name):
    proto, feeds, expected = _case(name)
    model = optimize(loader.from_graph(proto), "all", portable=True)
    assert "onnxkiln" not in {n.domain for n in model.graph}
    assert len(model.graph) < len(proto.graph.node)
    path = tmp_path / "portable.onnx"
    save(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for a, b in zip(session.run(None, feeds), expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_models_with_gradient_are_left_as_they_are(harness):
    text = """<ir_version: 8, opset_import: ["" : 17, "ai.onnx.preview.training" : 1]>
    g (float[3,4] x, float[4,2] w) => (float[3,2] y, float[4,2] dw) {
        i = Identity(x)
        m = MatMul(i, w)
        y = Relu(m)
        dw = ai.onnx.preview.training.Gradient<xs = ["w"], y = "y">(x, w)
    }"""
    model = harness.optimize(harness.parse(text), "all")
    assert harness.ops(model) == {"Identity": 1, "MatMul": 1, "Relu": 1,
                                  "ai.onnx.preview.training::Gradient": 1}


def test_malformed_nodes_are_left_for_the_planner_to_report():
    from onnx import helper

    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1.0, 0.0]),
             helper.make_node("Constant", [], [], value_float=1.0),
             helper.make_node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 3])],
                              [helper.make_tensor_value_info("y", 1, [3, 2])])
    model = loader.from_graph(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]))
    optimize(model, "all")
    assert [n.op_type for n in model.graph] == ["Transpose", "Relu"]  # the Constant was dead
