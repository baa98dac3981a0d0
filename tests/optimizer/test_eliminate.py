"""Basic-level clean-up: identity elimination, dead nodes and initializers, CSE."""

from __future__ import annotations

import numpy as np
import pytest

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def _x(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_identity_chain_is_removed(harness, rng):
    text = f"""{HEAD}
    g (float[3,4] x) => (float[3,4] y) {{
        a = Identity(x)
        b = Identity(a)
        y = Relu(b)
    }}"""
    model = harness.check(harness.parse(text), {"x": _x(rng, 3, 4)}, "basic", before=3, after=1)
    assert harness.ops(model) == {"Relu": 1}


def test_identity_into_graph_output_renames_its_producer(harness, rng):
    text = f"""{HEAD}
    g (float[3,4] x) => (float[3,4] y) {{
        r = Relu(x)
        y = Identity(r)
    }}"""
    model = harness.check(harness.parse(text), {"x": _x(rng, 3, 4)}, "basic", after=1)
    assert [v.name for v in model.graph.outputs] == ["y"]
    assert next(iter(model.graph)).outputs[0].name == "y"


@pytest.mark.parametrize("outputs", ["float[3,4] y", "float[3,4] r, float[3,4] y"])
def test_identity_that_must_stay(harness, rng, outputs):
    """Input -> output Identity, and an Identity between two graph outputs, are kept."""
    body = "y = Identity(x)" if "r," not in outputs else "r = Relu(x)\n y = Identity(r)"
    text = f"""{HEAD}
    g (float[3,4] x) => ({outputs}) {{
        {body}
    }}"""
    model = harness.check(harness.parse(text), {"x": _x(rng, 3, 4)}, "basic")
    assert harness.ops(model)["Identity"] == 1
    assert [v.name for v in model.graph.outputs] == [o.split()[1] for o in outputs.split(", ")]


@pytest.mark.parametrize("text,removed", [
    ("y = Dropout(x)", True),
    ("y = Dropout(x, ratio)", True),
    ("y = Dropout(x, ratio, t)", False),  # training_mode from a graph input: may be random
    ("y, mask = Dropout(x)", False),  # the mask is a graph output
])
def test_inference_dropout_is_removed(harness, rng, text, removed):
    outs = "float[3,4] y" + (", bool[3,4] mask" if "mask" in text else "")
    ins = "float[3,4] x" + (", bool t" if ", t)" in text else "")
    model_text = f"""{HEAD}
    g ({ins}) => ({outs}) {{
        ratio = Constant<value = float {{0.5}}>()
        {text}
    }}"""
    feeds = {"x": _x(rng, 3, 4)}
    if ", t)" in text:
        feeds["t"] = np.array(False)
    model = harness.optimize(harness.parse(model_text), "basic")
    assert ("Dropout" not in harness.ops(model)) == removed
    if removed:
        assert harness.ops(model) == {"Identity": 1}  # input -> output stays an Identity


def test_same_type_cast_and_identity_transpose_are_removed(harness, rng):
    text = f"""{HEAD}
    g (float[3,4] x) => (int64[3,4] y) {{
        a = Cast<to = 1>(x)
        b = Transpose<perm = [0, 1]>(a)
        c = Relu(b)
        d = Cast<to = 1>(c)
        y = Cast<to = 7>(d)
    }}"""
    model = harness.check(harness.parse(text), {"x": _x(rng, 3, 4) * 10}, "basic", after=2)
    assert harness.ops(model) == {"Relu": 1, "Cast": 1}  # d's type comes from inference


def test_one_input_concat_and_variadic_ops_are_removed(harness, rng):
    # torch.onnx writes Concat(past) before Concat(., new) in KV caches; the lone Concat
    # hid the past from the in-place append of bound caches
    text = f"""{HEAD}
    g (float[2,3,4] x, float[2,1,4] n) => (float[2,4,4] y) {{
        a = Concat<axis = -2>(x)
        b = Sum(a)
        c = Max(b)
        y = Concat<axis = -2>(c, n)
    }}"""
    feeds = {"x": _x(rng, 2, 3, 4), "n": _x(rng, 2, 1, 4)}
    model = harness.check(harness.parse(text), feeds, "basic", before=4, after=1)
    assert harness.ops(model) == {"Concat": 1}


def test_one_input_concat_with_an_axis_past_its_rank_stays(harness, rng):
    text = f"""{HEAD}
    g (float[3,4] x) => (float[3,4] y) {{
        y = Concat<axis = 5>(x)
    }}"""
    model = harness.optimize(harness.parse(text), "basic")
    assert harness.ops(model) == {"Concat": 1}


def test_dead_nodes_and_initializers_go(harness, rng):
    text = f"""{HEAD}
    g (float[3,4] x) => (float[3,4] y) {{
        unused = Mul(x, w)
        also = Relu(unused)
        y = Relu(x)
    }}"""
    proto = harness.parse(text, w=_x(rng, 3, 4))
    model = harness.check(proto, {"x": _x(rng, 3, 4)}, "basic", before=3, after=1)
    assert not model.graph.initializers


def test_common_subexpressions_merge(harness, rng):
    text = f"""{HEAD}
    g (float[3,4] x) => (float[3,4] y) {{
        a = Relu(x)
        b = Relu(x)
        c1 = Constant<value = float {{2.0}}>()
        c2 = Constant<value = float {{2.0}}>()
        ma = Mul(a, c1)
        mb = Mul(b, c2)
        y = Add(ma, mb)
    }}"""
    model = harness.check(harness.parse(text), {"x": _x(rng, 3, 4)}, "basic", after=3)
    assert harness.ops(model) == {"Relu": 1, "Mul": 1, "Add": 1}


def test_cse_merges_a_wide_fan_in_in_linear_time(harness, rng):
    """20,000 equal Relu(x) feeding one Sum merge into one (each use replaced once: a
    replacement per merge rebuilt the Sum's 20,000 inputs each time)."""
    import time

    from onnx import TensorProto, helper

    n = 20_000
    nodes = [helper.make_node("Relu", ["x"], [f"r{i}"]) for i in range(n)]
    nodes.append(helper.make_node("Sum", [f"r{i}" for i in range(n)], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    start = time.perf_counter()
    model = harness.optimize(proto, "basic")
    assert time.perf_counter() - start < 30
    assert harness.ops(model) == {"Relu": 1, "Sum": 1}
    x = np.array([1.0, -2.0, 0.5], np.float32)  # sums of these are exact in float32
    np.testing.assert_array_equal(harness.run(model, {"x": x})[0], n * np.maximum(x, 0))


def test_cse_merges_equal_chains_in_one_pass(harness, rng):
    text = f"""{HEAD}
    g (float[3,4] x) => (float[3,4] y) {{
        a1 = Relu(x)
        a2 = Exp(a1)
        a3 = Neg(a2)
        b1 = Relu(x)
        b2 = Exp(b1)
        b3 = Neg(b2)
        y = Add(a3, b3)
    }}"""
    model = harness.check(harness.parse(text), {"x": _x(rng, 3, 4)}, "basic", after=4)
    assert harness.ops(model) == {"Relu": 1, "Exp": 1, "Neg": 1, "Add": 1}


def test_cse_keeps_random_ops_and_different_attributes(harness, rng):
    text = f"""{HEAD}
    g (float[3,4] x) => (float[3,4] y, float[3,4] z) {{
        r1 = RandomNormalLike<seed = 1.0>(x)
        r2 = RandomNormalLike<seed = 1.0>(x)
        y = Add(r1, r2)
        a = LeakyRelu<alpha = 0.1>(x)
        b = LeakyRelu<alpha = 0.2>(x)
        z = Add(a, b)
    }}"""
    model = harness.optimize(harness.parse(text), "basic")
    assert harness.ops(model) == {"RandomNormalLike": 2, "LeakyRelu": 2, "Add": 2}


def test_identity_inside_a_subgraph_is_removed(harness, rng):
    text = f"""{HEAD}
    g (bool c, float[3,4] x) => (float[3,4] y) {{
        y = If(c) <
            then_branch = t () => (float[3,4] o) {{ i = Identity(x)
                                                   o = Relu(i) }},
            else_branch = e () => (float[3,4] o) {{ o = Neg(x) }}
        >
    }}"""
    feeds = {"c": np.array(True), "x": _x(rng, 3, 4)}
    model = harness.check(harness.parse(text), feeds, "basic")
    branch = next(iter(model.graph)).attributes["then_branch"].value
    assert [n.op_type for n in branch] == ["Relu"]
