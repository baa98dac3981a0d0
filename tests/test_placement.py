"""Provider selection, mixed placement, device copies and the fallback report."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxkiln as ok
from onnxkiln import partition, zoo
from onnxkiln.testing import make_model, tensor_info

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

ON_TORCH_CPU = ("testing.cuda_on_torch_cpu", "1")


def _device_session(model, providers=("cuda", "cpu"), **options):
    b = ok.InferenceSession.builder().providers(list(providers)).option(*ON_TORCH_CPU)
    for k, v in options.items():
        b = b.option(k, v)
    return b.from_graph(model)


def _steps(session):
    return [(s.provider, s.op_type) for s in session._plan.steps]


def _mixed_model():
    """Relu (device) -> Div on uint64 (no exact torch form: CPU) -> Cast -> Neg (device)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Cast", ["r"], ["u"], to=TensorProto.UINT64),
        helper.make_node("Div", ["u", "s"], ["b"]),
        helper.make_node("Cast", ["b"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Neg", ["f"], ["y"]),
    ]
    return make_model(nodes, [tensor_info("x", np.float32, [2, 3]),
                              tensor_info("s", np.uint64, [2, 3])],
                      [tensor_info("y", np.float32, [2, 3])])


def test_cpu_session_has_no_report():
    s = ok.InferenceSession.builder().device("cpu").from_graph(_mixed_model())
    assert s.execution_provider_fallback_report() is None
    assert {p for p, _ in _steps(s)} == {"cpu"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: nothing falls back")
def test_cuda_without_gpu_falls_back_whole_session_with_reason(caplog):
    partition._warned.clear()
    with caplog.at_level(logging.WARNING, logger="onnxkiln"):
        s = ok.InferenceSession.builder().device("cuda").from_graph(_mixed_model())
    report = s.execution_provider_fallback_report()
    assert report.whole_session and report.reason == "no CUDA device"
    assert report.requested_provider == "cuda" and report.fallback_provider == "cpu"
    assert report.assigned_ops["cpu"] == ["ai.onnx::Cast", "ai.onnx::Div", "ai.onnx::Neg",
                                          "ai.onnx::Relu"]
    assert "no CUDA device" in str(report)
    assert s.device_id() == ok.DeviceId(ok.DeviceType.CPU)
    assert any("no CUDA device" in r.getMessage() for r in caplog.records)
    with pytest.raises(ok.ExecutionProviderUnavailableError, match="no CUDA device"):
        ok.InferenceSession.builder().providers(["cuda"]).from_graph(_mixed_model())


def test_auto_without_gpu_is_the_cpu_and_reports_nothing():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: auto picks CUDA")
    s = ok.InferenceSession.builder().device("auto").from_graph(_mixed_model())
    assert s.execution_provider_fallback_report() is None
    assert s.device_id().type is ok.DeviceType.CPU


def test_mixed_placement_copies_only_at_boundaries_and_matches_cpu(caplog):
    model = _mixed_model()
    x = np.array([[1.5, -2, 3], [4, -5, 6]], np.float32)
    shift = np.array([[1, 2, 3], [5, 1, 2]], np.uint64)
    with caplog.at_level(logging.WARNING, logger="onnxkiln"):
        s = _device_session(model)
    expected = ok.InferenceSession.builder().device("cpu").from_graph(model).run(
        {"x": x, "s": shift})
    np.testing.assert_array_equal(s.run({"x": x, "s": shift})[0], expected[0])
    steps = _steps(s)
    # x uploaded; r and f cross; the uint64 casts run where Div is declined
    assert steps.count(("cuda", "MemcpyFromHost")) == 2  # x, then f back to the device
    assert steps.count(("cuda", "MemcpyToHost")) == 3  # s to host, r to host, y out
    assert ("cuda", "Relu") in steps and ("cuda", "Neg") in steps
    assert ("cpu", "Div") in steps
    report = s.execution_provider_fallback_report()
    assert not report.whole_session
    declined = {d.op_type: d.reason for d in report.declines}
    assert "uint64" in declined["Div"]
    assert report.assigned_ops["cpu"] == ["ai.onnx::Cast", "ai.onnx::Div"]
    assert "ai.onnx::Relu" in report.assigned_ops["cuda"]
    assert "Div" in str(report)
    assert any("fell back" in r.getMessage() for r in caplog.records)


def test_cuda_alone_turns_a_fallback_into_an_error_listing_the_nodes():
    with pytest.raises(ok.ExecutionProviderUnavailableError) as e:
        _device_session(_mixed_model(), providers=("cuda",))
    message = str(e.value)
    assert "Div" in message and "uint64" in message and "'cpu'" in message


def test_shape_subgraph_stays_on_the_host():
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = {"zero": np.array(0, np.int64), "zero1": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64)}
    model = make_model(nodes, [tensor_info("x", np.float32, ["a", 2, 3])],
                       [tensor_info("y", np.float32, ["a", 6])], initializers=inits)
    s = (ok.InferenceSession.builder().providers(["cuda", "cpu"]).option(*ON_TORCH_CPU)
         .optimization("disabled").from_graph(model))
    x = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    np.testing.assert_array_equal(s.run({"x": x})[0], x.reshape(4, 6))
    placed = {op: p for p, op in _steps(s) if not op.startswith("Memcpy")}
    assert placed["Shape"] == "cuda"  # reads only the shape: host output, no sync
    assert placed["Gather"] == placed["Unsqueeze"] == placed["Concat"] == "cpu"
    assert placed["Reshape"] == "cuda"
    reasons = {d.op_type: d.reason for d in s.execution_provider_fallback_report().declines}
    assert "shape computation kept on the host" in reasons["Gather"]
    # the shape never goes to the device and back: the only copies are x in and y out
    assert [op for _, op in _steps(s) if op.startswith("Memcpy")] == [
        "MemcpyFromHost", "MemcpyToHost"]


def test_torch_tensor_inputs_are_taken_as_they_are_and_checked():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                       [tensor_info("x", np.float32, [2, 2])],
                       [tensor_info("y", np.float32, [2, 2])])
    s = _device_session(model)
    x = torch.tensor([[1.0, -2.0], [-3.0, 4.0]])
    np.testing.assert_array_equal(s.run({"x": x})[0], [[1, 0], [0, 4]])
    with pytest.raises(ok.InvalidInputError, match="expects float32.*torch.float64"):
        s.run({"x": x.double()})
    with pytest.raises(ok.ShapeError, match="expects dim 2 at axis 1"):
        s.run({"x": torch.zeros(2, 3)})


@pytest.mark.parametrize("name", ["mlp", "bert", "gpt2"])
def test_zoo_models_on_the_torch_provider_match_the_cpu(name):
    generator, small, _ = zoo.MODELS[name]
    model = generator(small)
    feeds = zoo.random_inputs(model, seed=1)
    expected = ok.InferenceSession.builder().device("cpu").from_graph(model).run(feeds)
    got = _device_session(model).run(feeds)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_sequences_stay_on_the_host():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("SequenceConstruct", ["r", "x"], ["seq"]),
        helper.make_node("Identity", ["seq"], ["seq2"]),
        helper.make_node("SequenceAt", ["seq2", "one"], ["back"]),
        helper.make_node("Neg", ["back"], ["y"]),
    ]
    model = make_model(nodes, [tensor_info("x", np.float32, [3])],
                       [tensor_info("y", np.float32, [3])], {"one": np.array(1, np.int64)})
    s = (ok.InferenceSession.builder().providers(["cuda", "cpu"]).option(*ON_TORCH_CPU)
         .optimization("disabled").from_graph(model))
    x = np.array([-1, 2, -3], np.float32)
    np.testing.assert_array_equal(s.run({"x": x})[0], -x)
    placed = {op: p for p, op in _steps(s) if not op.startswith("Memcpy")}
    assert placed["Identity"] == "cpu" and placed["Relu"] == placed["Neg"] == "cuda"
    reasons = {d.op_type: d.reason for d in s.execution_provider_fallback_report().declines}
    assert "reads a sequence or optional" in reasons["Identity"]


def _scaler_cast_model(then_relu: bool):
    """Scaler (ai.onnx.ml: no torch kernel) -> Cast -> an output (or -> Relu -> an output)."""
    nodes = [helper.make_node("Scaler", ["x"], ["s"], domain="ai.onnx.ml", offset=[1.0, 2.0],
                              scale=[2.0, 0.5]),
             helper.make_node("Cast", ["s"], ["d"], to=TensorProto.DOUBLE)]
    if then_relu:
        nodes.append(helper.make_node("Relu", ["d"], ["y"]))
    out = "y" if then_relu else "d"
    return make_model(nodes, [tensor_info("x", np.float32, [3, 2])],
                      [tensor_info(out, np.float64, [3, 2])],
                      opset=17, extra_opsets={"ai.onnx.ml": 3})


@pytest.mark.parametrize("then_relu", [False, True], ids=["cast_out", "cast_relu_out"])
def test_a_node_between_host_nodes_stays_on_the_host(then_relu):
    s = _device_session(_scaler_cast_model(then_relu))
    x = np.array([[3, 4], [1, 2], [-1, 0]], np.float32)
    expected = ((x - [1, 2]) * [2, 0.5]).astype(np.float64)
    np.testing.assert_array_equal(s.run({"x": x})[0], np.maximum(expected, 0) if then_relu
                                  else expected)
    cast = next(p for p, op in _steps(s) if op == "Cast")
    declined = {d.op_type: d.reason for d in s.execution_provider_fallback_report().declines}
    if then_relu:  # its reader runs on the device: the Cast goes with it, one upload
        assert cast == "cuda" and "Cast" not in declined
        assert [op for _, op in _steps(s)].count("MemcpyFromHost") == 1
    else:  # up and straight back down would be its only reason to be on the device
        assert cast == "cpu" and "saves copying them up and back" in declined["Cast"]
        assert [op for _, op in _steps(s)].count("MemcpyFromHost") == 0  # nothing goes up
