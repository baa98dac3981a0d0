"""Per-signature specialised plans (onnxkiln.specialize): folding what the signature fixes,
kernels' specialize(), guards where shapes follow data, and the cache around them."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxkiln import InferenceSession, WarmupShape
from onnxkiln.specialize import signature_facts
from onnxkiln.testing import make_model, tensor_info


def _shape_arith_model():
    """y = reshape(x, [batch * seq, -1]) @ w, the target computed from Shape like exporters do."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["sh", "i1"], ["s"], axis=0),
        helper.make_node("Mul", ["b", "s"], ["bs"]),
        helper.make_node("Unsqueeze", ["bs", "ax0"], ["bs1"]),
        helper.make_node("Concat", ["bs1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["x2"]),
        helper.make_node("MatMul", ["x2", "w"], ["y"]),
    ]
    inits = {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64),
             "ax0": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
             "w": np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)}
    return make_model(nodes, [tensor_info("x", np.float32, ["batch", "seq", 8])],
                      [tensor_info("y", np.float32, [None, 3])], inits, opset=13)


def _data_shaped_model():
    """z = reshape(nonzero(m) as float, [-1]) + 1: its shapes follow the data of m."""
    nodes = [
        helper.make_node("NonZero", ["m"], ["nz"]),
        helper.make_node("Cast", ["nz"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["f", "flat"], ["r"]),
        helper.make_node("Add", ["r", "one"], ["z"]),
    ]
    inits = {"flat": np.array([-1], np.int64), "one": np.ones(1, np.float32)}
    return make_model(nodes, [tensor_info("m", np.bool_, [6])],
                      [tensor_info("z", np.float32, [None])], inits, opset=13)


def _entry(session):
    return next(iter(session._cache._entries.values()))


def test_the_second_run_of_a_signature_builds_a_plan_with_shape_arithmetic_folded():
    model = _shape_arith_model()
    s = InferenceSession.from_graph(model)
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    expected = oracle.run(None, {"x": x})[0]
    first = s.run({"x": x})[0]
    assert _entry(s).compiled is None  # seen once: the generic plan ran
    for _ in range(3):
        np.testing.assert_allclose(s.run({"x": x})[0], expected, rtol=1e-6)
    entry = _entry(s)
    assert entry.compiled is not None
    np.testing.assert_array_equal(first, expected)
    kept = [st.op_type for st in entry.compiled.plan.steps]
    assert kept == ["Reshape", "MatMul"]  # Shape, Gather, Mul, Unsqueeze, Concat folded
    assert entry.folded == 6
    assert s.cache_stats().entries == 1 and s.cache_stats().hits == 3


def test_a_new_signature_gets_its_own_specialisation():
    s = InferenceSession.from_graph(_shape_arith_model())
    for shape in ((2, 5, 8), (3, 1, 8)):
        x = np.ones(shape, np.float32)
        for _ in range(2):
            y = s.run({"x": x})[0]
        assert y.shape == (shape[0] * shape[1], 3)
    assert s._cache.specialised() == 2
    assert s.cache_stats().misses == 2


def test_shapes_that_follow_data_are_guarded_and_fall_back_to_the_generic_kernel():
    model = _data_shaped_model()
    s = InferenceSession.from_graph(model)
    facts = signature_facts(s._plan, s.graph())
    assert facts.static == (False, False, False, False)
    assert all(step.outputs[0] in facts.varying for step in s._plan.steps)
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for _ in range(12):  # one signature, different data, different intermediate shapes
        m = rng.random(6) < 0.5
        np.testing.assert_array_equal(s.run({"m": m})[0], oracle.run(None, {"m": m})[0])
    assert _entry(s).compiled is not None


def test_a_kernels_specialize_is_used_for_its_recorded_inputs_and_guarded_when_they_vary():
    """A Reshape kernel specialised for one recorded input shape must not run on another."""
    s = InferenceSession.from_graph(_data_shaped_model())
    calls = []
    reshape = s._plan.steps[2]

    def specialize(dtypes, shapes, consts):
        calls.append(shapes)
        target = shapes[0]

        def special(x, shape):
            assert x.shape == target, "the guard let another shape through"
            return x.reshape(-1)

        return special

    reshape.kernel.specialize = specialize
    m1 = np.array([1, 0, 1, 0, 0, 0], bool)
    m2 = np.array([1, 1, 1, 0, 1, 0], bool)
    for m in (m1, m1, m1, m2, m1):
        np.testing.assert_array_equal(s.run({"m": m})[0], np.nonzero(m)[0] + 1.0)
    assert calls == [((1, 2), (1,))]


def test_folded_outputs_are_fresh_arrays_the_caller_owns():
    nodes = [helper.make_node("Shape", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["r"])]
    s = InferenceSession.from_graph(make_model(
        nodes, [tensor_info("x", np.float32, ["n", 2])],
        [tensor_info("y", np.int64, [2]), tensor_info("r", np.float32, ["n", 2])]))
    x = np.ones((3, 2), np.float32)
    outs = [s.run({"x": x})[0] for _ in range(3)]
    assert _entry(s).folded == 1
    outs[2][0] = 99  # the caller owns it: the next run is not affected
    y = s.run({"x": x})[0]
    assert y.tolist() == [3, 2] and y.flags.writeable and not np.shares_memory(y, outs[2])


def test_warmup_builds_the_specialisation_at_once():
    s = InferenceSession.from_graph(_shape_arith_model())
    s.warmup([WarmupShape("x", (4, 3, 8))])
    assert _entry(s).compiled is not None and s.cache_stats().misses == 1


def test_option_specialize_0_keeps_the_generic_plan():
    s = InferenceSession.builder().option("specialize", "0").from_graph(_shape_arith_model())
    x = np.ones((2, 2, 8), np.float32)
    for _ in range(3):
        s.run({"x": x})
    assert _entry(s).compiled is None


def test_random_ops_are_never_folded():
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("RandomUniformLike", ["x"], ["u"], dtype=TensorProto.FLOAT),
             helper.make_node("Add", ["u", "x"], ["y"])]
    s = InferenceSession.from_graph(make_model(
        nodes, [tensor_info("x", np.float32, [64])], [tensor_info("y", np.float32, [64])]))
    x = np.zeros(64, np.float32)
    ys = [s.run({"x": x})[0] for _ in range(4)]
    assert _entry(s).compiled is not None
    assert not np.array_equal(ys[2], ys[3])


def test_threads_running_one_signature_at_once_all_get_right_answers():
    model = _shape_arith_model()
    s = InferenceSession.builder().intra_op_threads(2).from_graph(model)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((2, 4, 8)).astype(np.float32) for _ in range(4)]
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = [oracle.run(None, {"x": x})[0] for x in xs]
    errors = []

    def worker(x, want):
        try:
            for _ in range(25):
                np.testing.assert_allclose(s.run({"x": x})[0], want, rtol=1e-5)
        except Exception as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=pair) for pair in zip(xs, expected)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert _entry(s).compiled is not None


@pytest.mark.parametrize("threads", [1, 2])
def test_specialised_and_generic_plans_agree_bit_for_bit(threads):
    model = _shape_arith_model()
    special = InferenceSession.builder().intra_op_threads(threads).from_graph(model)
    generic = InferenceSession.builder().option("specialize", "0").from_graph(model)
    x = np.random.default_rng(7).standard_normal((3, 7, 8)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(special.run({"x": x})[0], generic.run({"x": x})[0])


def test_loop_bodies_get_specialised_plans_of_their_own():
    """A Loop body run with the same shapes again folds its own shape arithmetic."""
    body = helper.make_graph(
        [helper.make_node("Shape", ["acc_in"], ["sh"]),
         helper.make_node("Reshape", ["acc_in", "sh"], ["same"]),
         helper.make_node("Add", ["same", "x"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, None)])
    loop = helper.make_node("Loop", ["n", "", "acc0"], ["acc"], body=body)
    model = make_model([loop], [tensor_info("n", np.int64, []),
                                tensor_info("acc0", np.float32, ["a", "b"]),
                                tensor_info("x", np.float32, ["a", "b"])],
                       [tensor_info("acc", np.float32, ["a", "b"])], opset=13)
    s = InferenceSession.from_graph(model)
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    feeds = {"n": np.array(5, np.int64), "acc0": np.zeros((2, 3), np.float32), "x": x}
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(s.run(feeds)[0], oracle.run(None, feeds)[0], rtol=1e-6)
    bodies = _runners(s)
    assert len(bodies) == 1
    entry = next(iter(bodies[0]._entries.values()))
    assert entry.compiled is not None and entry.folded == 1  # Shape folded per signature
    np.testing.assert_allclose(s.run(feeds)[0], 5 * x, rtol=1e-6)


def _runners(session):
    from onnxkiln.subgraph import SubgraphRunner

    found = []
    for step in session._plan.steps:
        closure = getattr(step.kernel, "__closure__", None) or ()
        for cell in closure:
            value = cell.cell_contents
            if isinstance(value, SubgraphRunner):
                found.append(value)
            elif isinstance(value, dict):
                found.extend(v for v in value.values() if isinstance(v, SubgraphRunner))
    return found


def test_on_a_device_the_upload_of_folded_shape_arithmetic_becomes_a_device_constant():
    pytest.importorskip("torch", reason="the torch provider's kernels are torch ops")
    # y = x[::-1]: the indices come from x's shape (host shape arithmetic), a device Gather
    # reads them
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "i0"], ["n"], axis=0),
             helper.make_node("Sub", ["n", "one"], ["last"]),
             helper.make_node("Range", ["last", "minus1", "minus1"], ["rev"]),
             helper.make_node("Gather", ["x", "rev"], ["y"], axis=0)]
    inits = {"i0": np.array(0, np.int64), "one": np.array(1, np.int64),
             "minus1": np.array(-1, np.int64)}
    model = make_model(nodes, [tensor_info("x", np.float32, ["n", 4])],
                       [tensor_info("y", np.float32, ["n", 4])], inits, opset=13)
    s = InferenceSession(model, device="cuda", options={"testing.cuda_on_torch_cpu": "1"})
    names = s._plan.slot_names
    uploads = [names[st.inputs[0]] for st in s._plan.steps if st.op_type == "MemcpyFromHost"]
    assert uploads == ["x", "rev"]  # the generic plan uploads the indices every run
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(s.run({"x": x})[0], x[::-1])
    plan = _entry(s).compiled.plan
    assert [(st.op_type, [plan.slot_names[i] for i in st.inputs]) for st in plan.steps] == [
        ("MemcpyFromHost", ["x"]), ("Gather", ["x@cuda", "rev@cuda"]),
        ("MemcpyToHost", ["y"])]
    indices = next(v for k, v in plan.constants.items() if plan.slot_names[k] == "rev@cuda")
    assert type(indices).__module__ == "torch" and indices.tolist() == [4, 3, 2, 1, 0]
    x2 = x + 1  # same signature, other values: the folded indices still hold
    np.testing.assert_array_equal(s.run({"x": x2})[0], x2[::-1])
