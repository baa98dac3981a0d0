"""CUDA-provider torch kernels vs the numpy CPU provider: the training optimizers (Adagrad,
Adam, Momentum), Binarizer, ArrayFeatureExtractor and the Optional ops."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import check_node, run_graph  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from onnxkiln import loader  # noqa: E402

R = np.random.default_rng(3)
TRAINING = "ai.onnx.preview.training"


def rand(shape, dtype=np.float32):
    return R.standard_normal(shape).astype(dtype)


def _opt(op, feeds, n_outputs, **attrs):
    feeds = {"r": np.float32(0.1), "t": np.int64(attrs.pop("t", 3)), **feeds}
    return check_node(op, feeds, n_outputs=n_outputs, opset=1, domain=TRAINING, **attrs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_vars", [1, 2])
def test_adagrad(dtype, n_vars):
    xs = {f"x{i}": rand((3, 2), dtype) for i in range(n_vars)}
    gs = {f"g{i}": rand((3, 2), dtype) for i in range(n_vars)}
    hs = {f"h{i}": np.abs(rand((3, 2), dtype)) for i in range(n_vars)}
    _opt("Adagrad", xs | gs | hs, 2 * n_vars, norm_coefficient=0.01, epsilon=1e-6,
         decay_factor=0.1)


@pytest.mark.parametrize("t", [0, 4])
@pytest.mark.parametrize("post", [0.0, 0.05])
def test_adam(t, post):
    feeds = {"x": rand((4,)), "g": rand((4,)), "v": rand((4,)), "h": np.abs(rand((4,)))}
    _opt("Adam", feeds, 3, t=t, alpha=0.9, beta=0.999, epsilon=1e-7, norm_coefficient=0.01,
         norm_coefficient_post=post)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 2])
def test_momentum(mode, t):
    feeds = {"x": rand((2, 3)), "g": rand((2, 3)), "v": rand((2, 3))}
    _opt("Momentum", feeds, 2, t=t, alpha=0.9, beta=0.5, norm_coefficient=0.02, mode=mode)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_binarizer(dtype):
    x = (rand((3, 4)) * 5).astype(dtype)
    check_node("Binarizer", {"x": x}, opset=1, domain="ai.onnx.ml", threshold=0.5)


def test_binarizer_nan_is_an_error():
    from cuda_harness import node_info

    from onnxkiln.providers.cuda import REGISTRY
    from onnxkiln.testing import node_model

    info, _, _ = node_info(node_model("Binarizer", {"x": rand((3,))}, opset=1,
                                      domain="ai.onnx.ml", threshold=0.0))
    fn = REGISTRY.resolve("ai.onnx.ml", "Binarizer", 1).build(info)
    with pytest.raises(ValueError, match="element 1 is NaN"):
        fn(torch.tensor([0.0, float("nan"), 1.0]), threshold=0.0)


@pytest.mark.parametrize("shape", [(5,), (2, 5), (2, 3, 5)])
def test_array_feature_extractor(shape):
    check_node("ArrayFeatureExtractor", {"x": rand(shape), "y": np.array([4, 0, 0, 2])},
               opset=1, domain="ai.onnx.ml")


def _optional_model(op, present: bool):
    """x -> Optional(x or nothing) -> op: a model run node by node on each registry."""
    tensor_type = helper.make_tensor_type_proto(TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Optional", ["x"] if present else [], ["o"],
                              type=tensor_type),
             helper.make_node(op, ["o"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info("y")])
    return loader.from_graph(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 18)]))


@pytest.mark.parametrize("present", [True, False])
def test_optional_has_and_get_element(present):
    x = rand((2,))
    (has,) = run_graph(_optional_model("OptionalHasElement", present), {"x": x}, True)
    assert has.dtype == np.bool_ and bool(has) is present
    if present:
        (got,) = run_graph(_optional_model("OptionalGetElement", True), {"x": x}, True)
        np.testing.assert_array_equal(got, x)
    else:
        with pytest.raises(ValueError, match="empty"):
            run_graph(_optional_model("OptionalGetElement", False), {"x": x}, True)


@pytest.mark.parametrize("opset,n_out,attrs", [
    (15, 3, {"training_mode": 1, "momentum": 0.8}),
    (9, 5, {"momentum": 0.7}),
    (15, 1, {}),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_normalization_training(opset, n_out, attrs, dtype):
    x = rand((4, 3, 2, 5), dtype) * 3 + 1
    params = {"s": rand((3,), dtype), "b": rand((3,), dtype), "m": rand((3,), dtype),
              "v": np.abs(rand((3,), dtype)) + 0.5}
    check_node("BatchNormalization", {"x": x} | params, n_outputs=n_out, opset=opset,
               epsilon=1e-4, **attrs)
