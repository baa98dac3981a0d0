"""onnx_guard: onnx's C++ checker and inference where a crash cannot end the process."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxkiln import InferenceSession, onnx_guard

F = TensorProto.FLOAT
ML = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 2)]  # as skl2onnx writes


def _tree_then_encoder() -> onnx.ModelProto:
    """A TreeEnsembleRegressor whose (untyped) output a LabelEncoder reads: onnx's C++
    inference dereferences the missing type (skl2onnx writes this for decision_path)."""
    tree = helper.make_node(
        "TreeEnsembleRegressor", ["X"], ["leaf"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_values=[0.5, 0.0, 0.0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
        target_weights=[1.0, 2.0])
    encode = helper.make_node("LabelEncoder", ["leaf"], ["name"], domain="ai.onnx.ml",
                              keys_floats=[1.0, 2.0], values_strings=["left", "right"],
                              default_string="?")
    graph = helper.make_graph([tree, encode], "g", [helper.make_tensor_value_info("X", F,
                                                                                  [None, 1])],
                              [helper.make_tensor_value_info("name", TensorProto.STRING,
                                                             [None, 1])])
    return helper.make_model(graph, opset_imports=ML, ir_version=8)


def test_a_crash_in_onnx_inference_is_an_error_not_a_dead_process():
    with pytest.raises(onnx_guard.OnnxCrashError, match="crashed or hung"):
        onnx_guard.infer_shapes(_tree_then_encoder())
    # the worker restarts: the next fragile call works
    onnx_guard.check_model(_tree_then_encoder())


def test_the_worker_returns_what_onnx_returns():
    model = _tree_then_encoder()
    del model.graph.node[1]
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("leaf", F, None))
    inferred = onnx_guard.infer_shapes(model)
    assert inferred.SerializeToString() == onnx.shape_inference.infer_shapes(
        model).SerializeToString()


def test_onnx_errors_keep_their_class_across_the_worker():
    model = _tree_then_encoder()
    model.graph.node[1].input[0] = "nowhere"
    with pytest.raises(onnx.checker.ValidationError, match="nowhere"):
        onnx_guard.check_model(model)


def test_only_models_with_fragile_domains_go_to_the_worker():
    model = _tree_then_encoder()
    assert onnx_guard.is_fragile(model)
    plain = helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=helper.make_graph(
            [model.graph.node[0]], "then", [], [helper.make_tensor_value_info("leaf", F, None)]),
            else_branch=helper.make_graph([], "else", [], []))],
        "g", [], []))
    assert onnx_guard.is_fragile(plain)  # an ai.onnx.ml node inside a subgraph
    del plain.graph.node[0].attribute[:]
    assert not onnx_guard.is_fragile(plain)


def test_a_session_loads_and_runs_a_model_onnx_inference_crashes_on():
    session = InferenceSession.builder().from_graph(_tree_then_encoder())
    (names,) = session.run({"X": np.array([[0.2], [0.9]], np.float32)})
    np.testing.assert_array_equal(names, np.array([["left"], ["right"]], dtype=object))


def test_a_model_over_the_size_bound_is_not_sent(monkeypatch):
    monkeypatch.setattr(onnx_guard, "MAX_GUARDED_BYTES", 16)
    with pytest.raises(onnx_guard.OnnxCrashError, match="bound"):
        onnx_guard.check_model(_tree_then_encoder())
