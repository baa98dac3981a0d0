"""Hostile models: only `SessionError`s come out of load and run, within a time bound.

A bounded hypothesis fuzz over the mutations of `scripts/fuzz.py` (which runs the long
campaigns), then one test per hostile construct the fuzzer found or the hardening
covers: nesting depth, lying tensors, mistyped attributes, cycles, dangling names, bad
text, absurd opsets, inlining failures, unwritten outputs, subgraph arity, out of memory,
recursion, and memory limits that refuse a run before it allocates.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxkiln import (
    InferenceSession,
    InvalidInputError,
    KernelError,
    MemoryLimitError,
    ModelLoadError,
    SessionError,
)
from onnxkiln.executor import CompiledPlan
from onnxkiln.loader import MAX_SUBGRAPH_DEPTH
from onnxkiln.plan import build_plan
from onnxkiln.testing import tensor_info

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import fuzz

EXAMPLES = 200


def make_model(nodes, inputs, outputs, initializers=None) -> onnx.ModelProto:
    """A model without onnx.checker (which refuses the hostile ones on purpose)."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(autouse=True)
def _guarded():
    """Hostile allocations fail with MemoryError instead of exhausting the machine."""
    with fuzz.address_space_limit(), fuzz.quiet():
        yield


@pytest.fixture(scope="module")
def external_dir() -> str:
    return fuzz.external_dir()


# ---- the bounded fuzz -------------------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(rng=st.randoms(use_true_random=False))
def test_mutated_models_raise_only_session_errors(rng, external_dir):
    data, seed, steps = fuzz.mutate(rng)
    start = time.perf_counter()
    outcome = fuzz.execute(data, rng, external_dir, run_seconds=2.0)
    assert outcome.bug is None, f"{outcome.bug}\nseed model {seed}, mutations {steps}"
    assert time.perf_counter() - start < fuzz.LOAD_SECONDS + 2.0 + fuzz.RUN_GRACE


def test_every_seed_model_loads_and_runs():
    """The mutations start from valid models (else the fuzz only tests the loader)."""
    for name, data in fuzz.seed_models():
        session = InferenceSession.builder().device("cpu").load_bytes(data)
        outputs = session.run_outputs(fuzz.feeds_for(session, random.Random(0), wrong=False))
        assert outputs, name


# ---- nesting depth ----------------------------------------------------------------------


def _relu_model() -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["y"])],
                      [tensor_info("x", np.float32, [3])], [tensor_info("y", np.float32, [3])])


def _nested(depth: int) -> onnx.ModelProto:
    model = _relu_model()
    fuzz._wrap_in_if(model.graph, depth)  # built in place: protobuf would refuse a copy
    return model


X3 = np.array([-1.0, 0.0, 2.0], np.float32)


def test_subgraphs_nested_to_the_limit_run():
    session = InferenceSession.from_graph(_nested(MAX_SUBGRAPH_DEPTH))
    np.testing.assert_array_equal(session.run({"x": X3})[0], [0, 0, 2])


def test_subgraphs_nested_past_the_limit_fail_at_load_naming_the_depth():
    for depth in (MAX_SUBGRAPH_DEPTH + 1, 500):
        with pytest.raises(ModelLoadError, match=f"more than {MAX_SUBGRAPH_DEPTH} levels deep"):
            InferenceSession.from_graph(_nested(depth))


def test_plan_build_refuses_deep_nesting_too():
    """The planner checks on its own (graphs may come from other places than the loader)."""
    model = ir.serde.deserialize_model(_nested(MAX_SUBGRAPH_DEPTH + 1))
    from onnxkiln.providers.cpu import REGISTRY

    with pytest.raises(ModelLoadError, match=f"depth {MAX_SUBGRAPH_DEPTH + 1}"):
        build_plan(model, [REGISTRY])


def test_bytes_nested_deeper_than_protobuf_parses_fail_cleanly():
    data = _nested(40).SerializeToString()
    with pytest.raises(ModelLoadError, match="parse limit"):
        InferenceSession.load_bytes(data)


# ---- hostile constructs -----------------------------------------------------------------


def _with_initializer(tensor: onnx.TensorProto) -> onnx.ModelProto:
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])],
                       [tensor_info("x", np.float32, [3])], [tensor_info("y", np.float32, [3])],
                       {"w": np.ones(3, np.float32)})
    model.graph.initializer[0].CopyFrom(tensor)
    return model


def _giant_tensor() -> onnx.TensorProto:
    t = numpy_helper.from_array(np.ones(3, np.float32), "w")
    t.dims[:] = [1 << 20, 1 << 20]  # claims 4 TiB, holds 12 bytes
    return t


def _negative_dims() -> onnx.TensorProto:
    t = numpy_helper.from_array(np.ones(3, np.float32), "w")
    t.dims[:] = [-3]
    return t


def _wrong_attr(op: str, inputs: list[str], **attrs) -> onnx.ModelProto:
    model = make_model([helper.make_node(op, inputs, ["y"])],
                       [tensor_info("x", np.float32, [2, 3])], [tensor_info("y", np.float32, None)],
                       {"i": np.array([0], np.int64)} if "i" in inputs else None)
    node = model.graph.node[0]
    del node.attribute[:]
    for name, (kind, value) in attrs.items():
        a = node.attribute.add(name=name, type=kind)
        if kind == onnx.AttributeProto.FLOAT:
            a.f = value
        elif kind == onnx.AttributeProto.STRING:
            a.s = value
        elif kind == onnx.AttributeProto.INTS:
            a.ints.extend(value)
        elif kind == onnx.AttributeProto.TENSOR:
            a.t.CopyFrom(numpy_helper.from_array(np.array(value)))
    return model


def _cycle() -> onnx.ModelProto:
    model = make_model([helper.make_node("Relu", ["x"], ["a"]),
                        helper.make_node("Add", ["a", "b"], ["y"]),
                        helper.make_node("Neg", ["y"], ["b"])],
                       [tensor_info("x", np.float32, [3])], [tensor_info("y", np.float32, [3])])
    return model


def _dangling() -> onnx.ModelProto:
    model = _relu_model()
    model.graph.node[0].input[0] = "nowhere"
    return model


def _bad_utf8_name() -> bytes:
    model = _relu_model()
    model.graph.node[0].name = "relu_NAME"
    return model.SerializeToString().replace(b"relu_NAME", b"relu_\xff\xfeME")


def _huge_opset() -> onnx.ModelProto:
    model = _relu_model()
    model.opset_import[0].version = 1 << 40
    return model


def _recursive_function() -> onnx.ModelProto:
    model = _relu_model()
    f = onnx.FunctionProto(name="F", domain="fz", input=["a"], output=["b"])
    f.opset_import.add(domain="", version=17)
    f.node.add(op_type="F", domain="fz", input=["a"], output=["b"])
    model.functions.append(f)
    model.opset_import.add(domain="fz", version=1)
    model.graph.node[0].op_type, model.graph.node[0].domain = "F", "fz"
    return model


def _constant_without_outputs() -> onnx.ModelProto:
    model = _relu_model()
    model.graph.node.add().CopyFrom(helper.make_node("Constant", [], [], value_float=1.0))
    return model


HOSTILE = {
    "giant tensor": (lambda: _with_initializer(_giant_tensor()), ModelLoadError,
                     "initializer 'w' .*12 bytes of raw data, but dims"),
    "negative dims": (lambda: _with_initializer(_negative_dims()), ModelLoadError, "'w'"),
    "Transpose perm is a float": (
        lambda: _wrong_attr("Transpose", ["x"], perm=(onnx.AttributeProto.FLOAT, 1.5)),
        SessionError, "Transpose"),
    "Gather axis is a string": (
        lambda: _wrong_attr("Gather", ["x", "i"], axis=(onnx.AttributeProto.STRING, b"one")),
        SessionError, "Gather"),
    "Flatten axis is a tensor": (
        lambda: _wrong_attr("Flatten", ["x"], axis=(onnx.AttributeProto.TENSOR, [1, 2])),
        SessionError, "Flatten"),
    "Transpose perm out of range": (
        lambda: _wrong_attr("Transpose", ["x"], perm=(onnx.AttributeProto.INTS, [1 << 40, -9])),
        SessionError, "Transpose"),
    "cycle": (_cycle, ModelLoadError, "cycle"),
    "dangling name": (_dangling, ModelLoadError, "nowhere"),
    "huge opset": (_huge_opset, ModelLoadError, "version 1099511627776"),
    "recursive local function": (_recursive_function, ModelLoadError, "inline"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_model_raises_a_clear_session_error(case):
    build, error, match = HOSTILE[case]
    model = build()
    for load in (InferenceSession.from_graph,
                 lambda m: InferenceSession.load_bytes(m.SerializeToString())):
        with pytest.raises(error, match=match):
            load(model).run({"x": np.ones(model.graph.input[0].type.tensor_type.shape.dim[0]
                                          .dim_value or 2, np.float32).reshape(-1)
                             if len(model.graph.input[0].type.tensor_type.shape.dim) == 1
                             else np.ones((2, 3), np.float32)})


def test_name_that_is_not_utf8_is_refused_at_load():
    with pytest.raises(ModelLoadError, match="not UTF-8"):
        InferenceSession.load_bytes(_bad_utf8_name())


def test_constant_node_without_outputs_is_harmless():
    y = InferenceSession.from_graph(_constant_without_outputs()).run({"x": X3})[0]
    np.testing.assert_array_equal(y, [0, 0, 2])


def test_unused_extra_output_of_a_single_output_op_is_ignored():
    model = _relu_model()
    model.graph.node[0].output.append("unused_extra")
    for session in (InferenceSession.from_graph(model),
                    InferenceSession.builder().memory_limit(1 << 20).from_graph(model)):
        np.testing.assert_array_equal(session.run({"x": X3})[0], [0, 0, 2])


def test_used_extra_output_of_a_single_output_op_fails_at_load():
    model = _relu_model()
    model.graph.node[0].output.append("extra")
    model.graph.node.append(helper.make_node("Neg", ["extra"], ["z"]))
    model.graph.output.append(tensor_info("z", np.float32, [3]))
    with pytest.raises(ModelLoadError, match="output 1 of node .*does not produce"):
        InferenceSession.from_graph(model)


def test_if_branch_with_formal_inputs_names_the_if_node():
    branch = helper.make_graph([helper.make_node("Identity", ["p"], ["o"])], "b",
                               [tensor_info("p", np.float32, [3])],
                               [tensor_info("o", np.float32, [3])])
    model = make_model([helper.make_node("If", ["c"], ["y"], name="the_if",
                                         then_branch=branch, else_branch=branch)],
                       [tensor_info("c", np.bool_, [])], [tensor_info("y", np.float32, [3])])
    session = InferenceSession.from_graph(model)
    with pytest.raises(KernelError, match="the_if.*declares 1 input") as info:
        session.run({"c": np.array(True)})
    assert info.value.node_name == "the_if"


def test_missing_required_input_with_memory_limit_does_not_crash_shape_inference():
    """onnx's C++ shape inference segfaults on this node; the memory plan must not run it."""
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("LabelEncoder", [""], ["y"], domain="ai.onnx.ml",
                              keys_int64s=[0, 1], values_strings=["a", "b"])], "g",
            [tensor_info("x", np.int64, [2])], [tensor_info("y", TensorProto.STRING, [2])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
        ir_version=8)
    session = InferenceSession.builder().memory_limit(1 << 20).from_graph(model)
    with pytest.raises(SessionError):
        session.run({"x": np.array([0, 1])})


# ---- run-time failures become SessionErrors ---------------------------------------------


def _shape_from_input() -> onnx.ModelProto:
    return make_model(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], name="fill",
                          value=numpy_helper.from_array(np.array([1.0], np.float32)))],
        [tensor_info("shape", np.int64, [2])], [tensor_info("y", np.float32, None)])


def test_out_of_memory_in_a_kernel_is_a_kernel_error():
    session = InferenceSession.from_graph(_shape_from_input())
    with pytest.raises(KernelError, match="'fill'.*ran out of memory") as info:
        session.run({"shape": np.array([1 << 30, 1 << 30], np.int64)})  # 4 EiB
    assert isinstance(info.value.__cause__, MemoryError)


def test_recursion_error_in_a_kernel_is_a_kernel_error():
    session = InferenceSession.from_graph(_relu_model())

    def recurse(x):
        return recurse(x)

    plan = session._plan
    steps = [dataclasses.replace(plan.steps[0], kernel=recurse)]
    compiled = CompiledPlan(dataclasses.replace(plan, steps=steps))
    with pytest.raises(KernelError, match="recursion limit") as info:
        compiled([X3])
    assert isinstance(info.value.__cause__, RecursionError)


# ---- memory limits ----------------------------------------------------------------------


def test_output_over_the_memory_limit_fails_before_allocating():
    """A 4 GiB ConstantOfShape with a constant shape: predicted and refused before it runs."""
    model = make_model(
        [helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill",
                          value=numpy_helper.from_array(np.array([1.0], np.float32))),
         helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0)],
        [tensor_info("x", np.float32, [1])], [tensor_info("y", np.float32, [])],
        {"shape": np.array([1024, 1024, 1024], np.int64)})
    session = InferenceSession.builder().memory_limit(256 << 20).from_graph(model)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryLimitError, match="'fill'.*before running") as info:
            session.run({"x": np.zeros(1, np.float32)})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"{peak:,} bytes allocated before refusing"
    assert info.value.node_name == "fill"


def test_data_dependent_output_over_the_limit_is_caught_before_the_kernel_runs():
    session = InferenceSession.builder().memory_limit(16 << 20).from_graph(_shape_from_input())
    with pytest.raises(MemoryLimitError,
                       match="'fill'.*predicted from its input values before running"):
        session.run({"shape": np.array([2048, 4096], np.int64)})  # 32 MiB
    np.testing.assert_array_equal(
        session.run({"shape": np.array([2, 2], np.int64)})[0], np.ones((2, 2), np.float32))


# ---- hostile inputs and last-resort wrapping --------------------------------------------


class _BrokenArray:
    def __array__(self, *args, **kwargs):
        raise RuntimeError("cannot export")


def test_inputs_numpy_cannot_convert_are_invalid_input_errors():
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph([helper.make_node("SequenceLength", ["s"], ["n"])], "g", [seq],
                          [helper.make_tensor_value_info("n", TensorProto.INT64, [])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = InferenceSession.from_graph(model)
    for bad in (["a", "b"], [[[1.0], [2.0, 3.0]]], [_BrokenArray()]):
        with pytest.raises(InvalidInputError, match="input 's' .*cannot be converted"):
            session.run({"s": bad})
    with pytest.raises(InvalidInputError, match="input 'x' .*RuntimeError: cannot export"):
        InferenceSession.from_graph(_relu_model()).run({"x": _BrokenArray()})


@pytest.mark.parametrize("error, match", [
    (MemoryError("no room"), "out of memory while loading"),
    (RecursionError("too deep"), "nests too deeply"),
    (AttributeError("oops"), "a bug in onnxkiln"),
])
def test_unexpected_load_failures_still_come_out_as_model_load_errors(monkeypatch, error, match):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr("onnxkiln.loader.from_graph", fail)
    with pytest.raises(ModelLoadError, match=match) as info:
        InferenceSession.from_graph(_relu_model())
    assert info.value.__cause__ is error
