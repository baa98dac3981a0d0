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


def _loop_model():
    """v = Loop(3) { relu(v + one) * two }: elementwise steps a body may run in place."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Add", ["v", "one"], ["a"]),
         helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("Mul", ["r", "two"], ["v_out"])],
        "body", [tensor_info("i", np.int64, []), tensor_info("cond", np.bool_, []),
                 tensor_info("v", np.float32, [4096])],
        [tensor_info("cond_out", np.bool_, []), tensor_info("v_out", np.float32, [4096])])
    loop = helper.make_node("Loop", ["m", "", "v0"], ["v"], name="loop", body=body)
    return make_model([loop], [tensor_info("v0", np.float32, [4096])],
                      [tensor_info("v", np.float32, [4096])],
                      {"m": np.array(3, np.int64), "one": np.ones(4096, np.float32),
                       "two": np.full(4096, 2, np.float32)})


def _body_runners(session):
    """The SubgraphRunners a session's steps hold (in their kernels' closures)."""
    from onnxkiln.subgraph import SubgraphRunner

    return [cell.cell_contents for step in session._plan.steps
            for cell in getattr(step.kernel, "__closure__", None) or ()
            if isinstance(cell.cell_contents, SubgraphRunner)]


@pytest.mark.parametrize("inplace", ["0", "1"])
def test_memory_inplace_option_reaches_loop_bodies(inplace, monkeypatch):
    monkeypatch.setenv("ONNXKILN_INPLACE", "1" if inplace == "0" else "0")  # the option wins
    s = InferenceSession.builder().option("memory.inplace", inplace).from_graph(_loop_model())
    (body,) = _body_runners(s)
    assert body._compiled.inplace is (inplace == "1")
    assert bool(body._compiled.donations) is (inplace == "1")
    v0 = np.linspace(-1, 1, 4096, dtype=np.float32)
    expected = v0
    for _ in range(3):
        expected = np.maximum(expected + 1, 0) * 2
    for _ in range(3):  # generic, recording and specialised body plans
        np.testing.assert_array_equal(s.run({"v0": v0})[0], expected)


def test_specialize_option_keeps_loop_bodies_generic():
    on = InferenceSession.from_graph(_loop_model())
    off = InferenceSession.builder().option("specialize", "0").from_graph(_loop_model())
    v0 = np.zeros(4096, np.float32)
    for s in (on, off):
        for _ in range(3):
            np.testing.assert_array_equal(s.run({"v0": v0})[0], np.full(4096, 14, np.float32))
    (body_on,), (body_off,) = _body_runners(on), _body_runners(off)
    assert any(e.compiled is not None for e in body_on._entries.values())
    assert body_off._entries == {}
