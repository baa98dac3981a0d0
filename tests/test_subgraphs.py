"""Core subgraph support: graph attributes compile once, read outer values, count runs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxkiln import ControlFlowStats, InferenceSession, loader
from onnxkiln.errors import ModelLoadError
from onnxkiln.plan import free_values
from onnxkiln.testing import make_model, tensor_info


def _branch(name: str, nodes, out: str):
    return helper.make_graph(nodes, name, [], [tensor_info(out, np.float32, [2])])


def _if_model():
    """y = If(c, then: relu(x) + w, else: If(c2, -x, x * w)) with outer-scope reads."""
    inner = helper.make_node(
        "If", ["c2"], ["e"],
        then_branch=_branch("neg", [helper.make_node("Neg", ["x"], ["n"])], "n"),
        else_branch=_branch("mul", [helper.make_node("Mul", ["x", "w"], ["m"])], "m"),
    )
    node = helper.make_node(
        "If", ["c"], ["y"], name="outer_if",
        then_branch=_branch("then", [helper.make_node("Add", ["r", "w"], ["t"])], "t"),
        else_branch=_branch("else", [inner], "e"),
    )
    return make_model(
        [helper.make_node("Relu", ["x"], ["r"]), node],
        [tensor_info("x", np.float32, [2]), tensor_info("c", np.bool_, []),
         tensor_info("c2", np.bool_, [])],
        [tensor_info("y", np.float32, [2])], {"w": np.array([10, 20], np.float32)},
    )


X = np.array([1.5, -2], np.float32)


def test_branches_read_outer_values_including_nested_ones():
    s = InferenceSession.from_graph(_if_model())
    t, f = np.array(True), np.array(False)
    np.testing.assert_array_equal(s.run({"x": X, "c": t, "c2": t})[0], [11.5, 20])
    np.testing.assert_array_equal(s.run({"x": X, "c": f, "c2": t})[0], [-1.5, 2])
    np.testing.assert_array_equal(s.run({"x": X, "c": f, "c2": f})[0], [15, -40])


def test_free_values_lists_outer_reads_of_nested_graphs():
    model = loader.from_graph(_if_model())
    if_node = next(n for n in model.graph if n.op_type == "If")
    else_graph = if_node.attributes["else_branch"].value
    assert [v.name for v in free_values(else_graph)] == ["c2", "x", "w"]
    then_graph = if_node.attributes["then_branch"].value
    assert [v.name for v in free_values(then_graph)] == ["r", "w"]


def test_captured_values_are_step_inputs_so_they_live_long_enough():
    s = InferenceSession.from_graph(_if_model())
    step = next(st for st in s._plan.steps if st.op_type == "If")
    names = [s._plan.slot_names[i] for i in step.inputs]
    assert names[0] == "c" and sorted(names[1:]) == ["c2", "r", "w", "x"]


def test_control_flow_stats_count_builds_per_signature_and_runs():
    s = InferenceSession.from_graph(_if_model())
    assert s.control_flow_stats() == ControlFlowStats(0, 0)
    t, f = np.array(True), np.array(False)
    for _ in range(5):
        s.run({"x": X, "c": t, "c2": t})
    assert s.control_flow_stats() == ControlFlowStats(subgraph_builds=1, subgraph_runs=5)
    s.run({"x": X, "c": f, "c2": f})
    # else branch (new body) and its nested else branch: two more builds, two more runs
    assert s.control_flow_stats() == ControlFlowStats(subgraph_builds=3, subgraph_runs=7)


def test_if_whose_branches_produce_too_few_outputs_is_refused_at_load():
    empty = helper.make_graph([], "branch", [], [])
    node = helper.make_node("If", ["c"], ["y"], then_branch=empty, else_branch=empty)
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "g", [cond], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelLoadError, match="If has 1 output.*then_branch produces 0"):
        InferenceSession(model.SerializeToString())


def test_a_node_with_more_inputs_than_its_schema_takes_is_refused_at_load():
    # onnxruntime: INVALID_GRAPH; the kernel was called with an argument it does not take
    node = helper.make_node("ReduceMean", ["x", "axes"], ["y"])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(ModelLoadError, match="ReduceMean .opset 13. takes at most 1 inputs"):
        InferenceSession(model.SerializeToString())
