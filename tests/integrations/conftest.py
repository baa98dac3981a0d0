"""Models shared by the integration tests."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxkiln.testing import make_model, tensor_info

W = np.linspace(-1, 1, 8, dtype=np.float32)


def build_rowwise(with_s: bool = True) -> onnx.ModelProto:
    """x [batch, 8], s [batch, 1] -> scaled = Relu(x*w + s) [batch, 8], top = max of scaled
    [batch], label = argmax [batch] (int64). Every op is exact per row, so any batching
    of the rows gives bit-identical results. Without `s` the model adds 0.25 instead."""
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["t"]),
        helper.make_node("Add", ["t", "s"], ["u"]),
        helper.make_node("Relu", ["u"], ["scaled"]),
        helper.make_node("ReduceMax", ["scaled", "axes"], ["top"], keepdims=0),
        helper.make_node("ArgMax", ["u"], ["label"], axis=1, keepdims=0),
    ]
    inputs = [tensor_info("x", np.float32, ["batch", 8])]
    inits = {"w": W, "axes": np.array([1], np.int64)}
    if with_s:
        inputs.append(tensor_info("s", np.float32, ["batch", 1]))
    else:
        inits["s"] = np.array([0.25], np.float32)
    return make_model(
        nodes, inputs,
        [tensor_info("scaled", np.float32, ["batch", 8]), tensor_info("top", np.float32, ["batch"]),
         tensor_info("label", np.int64, ["batch"])],
        inits, name="rowwise")


def rowwise_reference(x: np.ndarray, s: np.ndarray | float = 0.25) -> list[np.ndarray]:
    """What the rowwise model computes, in numpy (s = 0.25 for the one-input model)."""
    u = x * W + np.float32(s) if np.isscalar(s) else x * W + s
    scaled = np.maximum(u, 0)
    return [scaled, scaled.max(axis=1), u.argmax(axis=1)]


@pytest.fixture(scope="module")
def rowwise() -> onnx.ModelProto:
    return build_rowwise()


@pytest.fixture(scope="module")
def rowwise_x_path(tmp_path_factory):
    """The one-input model (x only) saved to a file."""
    path = tmp_path_factory.mktemp("models") / "rowwise_x.onnx"
    onnx.save(build_rowwise(with_s=False), path)
    return path
