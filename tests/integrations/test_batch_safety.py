"""The static check that decides whether Serve may stack requests: models that keep rows
apart pass (and stacked runs then equal lone runs), models that mix them are refused with
the node and the reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import build_rowwise
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.errors import InvalidOptionError
from onnxkiln.integrations.ray._batch_safety import batching_refusal, require_independent_rows
from onnxkiln.integrations.ray._http import Engine
from onnxkiln.testing import make_model, tensor_info

X = tensor_info("x", np.float32, ["n", 4])
Y = tensor_info("y", np.float32, ["n", 4])
IMG = tensor_info("img", np.float32, ["n", 3, 8, 8])
SCORES = tensor_info("y", np.float32, ["n", 10])
I64 = np.int64


def _one(op: str, inits: dict | None = None, extra: tuple = (), opset: int = 17,
         **attrs) -> onnx.ModelProto:
    return make_model([helper.make_node(op, ["x", *extra], ["y"], **attrs)], [X], [Y],
                      inits or {}, opset=opset)


def _center() -> onnx.ModelProto:
    """y = x - mean(x over the batch): every row's answer depends on every row."""
    return make_model([helper.make_node("ReduceMean", ["x", "ax"], ["m"]),
                       helper.make_node("Sub", ["x", "m"], ["y"])], [X], [Y],
                      {"ax": np.array([0], I64)}, opset=18)


def _mlp() -> onnx.ModelProto:
    w = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
    return make_model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                       helper.make_node("Add", ["h", "b"], ["h2"]),
                       helper.make_node("Tanh", ["h2"], ["h3"]),
                       helper.make_node("Gemm", ["h3", "w", "b"], ["h4"], transB=1),
                       helper.make_node("Softmax", ["h4"], ["y"], axis=-1)],
                      [X], [Y], {"w": w, "b": np.full(4, 0.5, np.float32)})


def _cnn(bn: dict | None = None, flatten: str = "shape") -> onnx.ModelProto:
    """Conv, BatchNorm, Relu, MaxPool, then flatten (x.view(x.size(0), -1) as torch
    exports it, or Flatten) and a Gemm head."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["img", "cw"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["bn"],
                              **(bn or {})),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2])]
    if flatten == "shape":
        nodes += [helper.make_node("Shape", ["p"], ["sh"]),
                  helper.make_node("Gather", ["sh", "zero"], ["n0"]),
                  helper.make_node("Unsqueeze", ["n0", "zax"], ["n1"]),
                  helper.make_node("Concat", ["n1", "m1"], ["newshape"], axis=0),
                  helper.make_node("Reshape", ["p", "newshape"], ["f"])]
    else:
        nodes.append(helper.make_node("Flatten", ["p"], ["f"], axis=int(flatten)))
    nodes.append(helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1))
    inits = {"cw": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
             "s": np.ones(4, np.float32), "bb": np.zeros(4, np.float32),
             "mu": np.full(4, 0.1, np.float32), "var": np.ones(4, np.float32),
             "zero": np.array(0, I64), "zax": np.array([0], I64), "m1": np.array([-1], I64),
             "fw": rng.standard_normal((10, 64)).astype(np.float32),
             "fb": np.zeros(10, np.float32)}
    return make_model(nodes, [IMG], [SCORES], inits, opset=15)


def _attention_rows() -> onnx.ModelProto:
    """Self-attention within each row: x [n, 4] -> [n, 2, 2], scores over the last axes."""
    return make_model([helper.make_node("Reshape", ["x", "shape"], ["q"]),
                       helper.make_node("Transpose", ["q"], ["kt"], perm=[0, 2, 1]),
                       helper.make_node("MatMul", ["q", "kt"], ["att"]),
                       helper.make_node("Softmax", ["att"], ["p"], axis=-1),
                       helper.make_node("MatMul", ["p", "q"], ["o"]),
                       helper.make_node("Reshape", ["o", "flat"], ["y"])],
                      [X], [Y], {"shape": np.array([0, 2, 2], I64),
                                 "flat": np.array([-1, 4], I64)})


def _attention_across_rows() -> onnx.ModelProto:
    """Attention with the batch as the sequence: softmax(x x^T) x."""
    return make_model([helper.make_node("Transpose", ["x"], ["xt"]),
                       helper.make_node("MatMul", ["x", "xt"], ["att"]),
                       helper.make_node("Softmax", ["att"], ["p"], axis=-1),
                       helper.make_node("MatMul", ["p", "x"], ["y"])], [X], [Y])


SAFE = {
    "rowwise": build_rowwise,
    "mlp": _mlp,
    "cnn, torch-style flatten": _cnn,
    "cnn, Flatten": lambda: _cnn(flatten="1"),
    "layernorm over the last axis": lambda: _one(
        "LayerNormalization", {"g": np.ones(4, np.float32), "b": np.zeros(4, np.float32)},
        ("g", "b"), axis=-1),
    "softmax over the last axis": lambda: _one("Softmax", axis=1),
    "cumsum along a row": lambda: _one("CumSum", {"a": np.array(1, I64)}, ("a",)),
    "attention within rows": _attention_rows,
}

UNSAFE = {
    "centering": (_center, "ReduceMean node making 'm' reduces over the batch axis"),
    "reduce over all axes": (lambda: make_model(
        [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=1),
         helper.make_node("Sub", ["x", "m"], ["y"])], [X], [Y]), "all axes"),
    "softmax over the batch": (lambda: _one("Softmax", axis=0), "along the batch axis"),
    "old softmax flattening everything": (lambda: _one("Softmax", opset=11, axis=0),
                                          "block of axes"),
    "layernorm from axis 0": (lambda: _one(
        "LayerNormalization", {"g": np.ones(4, np.float32)}, ("g",), axis=0),
        "include the batch axis"),
    "batchnorm in training form": (lambda: _cnn({"training_mode": 1}), "training form"),
    "attention across rows": (_attention_across_rows,
                              "multiplies two requests' rows together"),
    "topk over the batch": (lambda: make_model(
        [helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=0)], [X],
        [Y, tensor_info("i", np.int64, ["n", 4])], {"k": np.array([1], I64)}),
        "sorts along the batch axis"),
    "cumsum over the batch": (lambda: _one("CumSum", {"a": np.array(0, I64)}, ("a",)),
                              "sums along the batch axis"),
    "flatten at axis 0": (lambda: _cnn(flatten="0"), "merges the batch axis"),
    "divide by the batch size": (lambda: make_model(
        [helper.make_node("Shape", ["x"], ["sh"], start=0, end=1),
         helper.make_node("Cast", ["sh"], ["nf"], to=1),
         helper.make_node("Div", ["x", "nf"], ["y"])], [X], [Y]), "holds the batch size"),
    "gather rows": (lambda: _one("Gather", {"i": np.array([0, 0], I64)}, ("i",)),
                    "picks rows"),
    "unknown op": (lambda: _one("Einsum", equation="ij->ij"), "does not know this op"),
    "output with the batch on axis 1": (lambda: make_model(
        [helper.make_node("Transpose", ["x"], ["y"])], [X],
        [tensor_info("y", np.float32, [4, "n"])]), "output 'y' carries the batch along axis 1"),
}


@pytest.mark.parametrize("name", sorted(SAFE))
def test_models_that_keep_rows_apart_pass_and_stacking_equals_lone_runs(name):
    model = SAFE[name]()
    assert batching_refusal(model) is None
    session = InferenceSession.from_graph(model)
    feeds_of = {m.name: m for m in session.inputs()}
    rng = np.random.default_rng(3)
    requests = [{n: rng.standard_normal((rows, *m.shape[1:])).astype(np.float32)
                 for n, m in feeds_of.items()} for rows in (1, 3, 2)]
    engine = Engine(session, batching=True, model=model)
    stacked = engine.run_batch(requests)
    assert engine.stats()["stacked_runs"] == 1
    for feeds, got in zip(requests, stacked):
        for a, b in zip(got, session.run(feeds)):
            # a stacked GEMM may round apart from lone ones (outputs here reach ~80)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", sorted(UNSAFE))
def test_models_that_mix_rows_are_refused_naming_the_node(name):
    build, needle = UNSAFE[name]
    reason = batching_refusal(build())
    assert reason is not None
    assert needle in reason, reason
    with pytest.raises(InvalidOptionError, match="batching=True refused"):
        require_independent_rows(build())


def test_the_refusal_names_node_op_and_why():
    reason = batching_refusal(_center())
    assert reason == ("the ReduceMean node making 'm' reduces over the batch axis (axis 0), "
                      "so each answer would mix every request's rows")
    assert "output 'y' does not depend on the requests' rows" in batching_refusal(make_model(
        [helper.make_node("Constant", [], ["y"], value=onnx.numpy_helper.from_array(
            np.zeros((1, 4), np.float32)))], [X], [Y]))


def test_control_flow_over_batch_values_is_refused():
    body = helper.make_graph([helper.make_node("Identity", ["x"], ["out"])], "b", [],
                             [tensor_info("out", np.float32, ["n", 4])])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=body,
                                         else_branch=body)],
                       [X], [Y], {"c": np.array(True)})
    assert "control flow is not analysed" in batching_refusal(model)
