"""MatMul/Gemm fusions: bias Add (Gemm, FusedMatMulBias), transposes and scales (FusedMatMul),
Gemm + activation (FusedGemm)."""

from __future__ import annotations

import numpy as np
import pytest

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def _w(rng, *shape):
    return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def _x(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_2d_matmul_add_relu_becomes_fused_gemm(harness, rng):
    text = f"""{HEAD}
    g (float[3,8] x) => (float[3,6] y) {{
        m = MatMul(x, w)
        a = Add(m, b)
        y = Relu(a)
    }}"""
    proto = harness.parse(text, w=_w(rng, 8, 6), b=_x(rng, 6))
    model = harness.check(proto, {"x": _x(rng, 3, 8)}, before=3, after=1)
    assert harness.ops(model) == {"com.microsoft::FusedGemm": 1}


def test_2d_matmul_add_becomes_gemm(harness, rng):
    text = f"""{HEAD}
    g (float[N,8] x) => (float[N,6] y) {{
        m = MatMul(x, w)
        y = Add(b, m)
    }}"""
    proto = harness.parse(text, w=_w(rng, 8, 6), b=_x(rng, 1, 6))
    model = harness.check(proto, {"x": _x(rng, 3, 8)}, after=1)
    assert harness.ops(model) == {"Gemm": 1}


@pytest.mark.parametrize("act", ["", "Relu"])
def test_nd_matmul_bias_becomes_fused_matmul_bias(harness, rng, act):
    tail = "a = Add(m, b)\n y = Relu(a)" if act else "y = Add(m, b)"
    text = f"""{HEAD}
    g (float[2,5,8] x) => (float[2,5,6] y) {{
        m = MatMul(x, w)
        {tail}
    }}"""
    proto = harness.parse(text, w=_w(rng, 8, 6), b=_x(rng, 6))
    model = harness.check(proto, {"x": _x(rng, 2, 5, 8)}, after=1)
    assert harness.ops(model) == {"onnxkiln::FusedMatMulBias": 1}
    node = next(iter(model.graph))
    assert (node.attributes["activation"].value if act else "") == act
    assert "onnxkiln" in model.opset_imports


def test_matmul_bias_gelu_becomes_one_node(harness, rng):
    text = f"""{HEAD}
    g (float[2,5,8] x) => (float[2,5,6] y) {{
        m = MatMul(x, w)
        a = Add(m, b)
        c = Constant<value = float {{1.4142135}}>()
        one = Constant<value = float {{1.0}}>()
        half = Constant<value = float {{0.5}}>()
        d = Div(a, c)
        e = Erf(d)
        e1 = Add(e, one)
        p = Mul(a, e1)
        y = Mul(p, half)
    }}"""
    proto = harness.parse(text, w=_w(rng, 8, 6), b=_x(rng, 6))
    model = harness.check(proto, {"x": _x(rng, 2, 5, 8)}, after=1)
    assert harness.ops(model) == {"onnxkiln::FusedMatMulBias": 1}
    assert next(iter(model.graph)).attributes["activation"].value == "Gelu"


def test_matmul_bias_with_computed_bias_is_left_alone(harness, rng):
    text = f"""{HEAD}
    g (float[2,5,8] x, float[6] b) => (float[2,5,6] y) {{
        m = MatMul(x, w)
        y = Add(m, b)
    }}"""
    proto = harness.parse(text, w=_w(rng, 8, 6))
    model = harness.check(proto, {"x": _x(rng, 2, 5, 8), "b": _x(rng, 6)}, after=2)
    assert harness.ops(model) == {"MatMul": 1, "Add": 1}


@pytest.mark.parametrize("side", ["A", "B", "both"])
def test_transposes_fold_into_fused_matmul(harness, rng, side):
    a = "at = Transpose<perm = [0, 1, 3, 2]>(a)" if side in ("A", "both") else "at = Identity(a)"
    b = "bt = Transpose<perm = [0, 1, 3, 2]>(b)" if side in ("B", "both") else "bt = Identity(b)"
    a_shape = "2,3,4,5" if side in ("A", "both") else "2,3,5,4"
    b_shape = "2,3,6,4" if side in ("B", "both") else "2,3,4,6"
    text = f"""{HEAD}
    g (float[{a_shape}] a, float[{b_shape}] b) => (float[2,3,5,6] y) {{
        {a}
        {b}
        y = MatMul(at, bt)
    }}"""
    feeds = {"a": _x(rng, *map(int, a_shape.split(","))),
             "b": _x(rng, *map(int, b_shape.split(",")))}
    model = harness.check(harness.parse(text), feeds, after=1)
    assert harness.ops(model) == {"com.microsoft::FusedMatMul": 1}
    attrs = {k: a.value for k, a in next(iter(model.graph)).attributes.items()}
    assert attrs.get("transA", 0) == (side in ("A", "both"))
    assert attrs.get("transB", 0) == (side in ("B", "both"))


def test_other_permutation_is_not_folded(harness, rng):
    text = f"""{HEAD}
    g (float[3,2,4,5] a, float[2,3,5,6] b) => (float[2,3,4,6] y) {{
        at = Transpose<perm = [1, 0, 2, 3]>(a)
        y = MatMul(at, b)
    }}"""
    feeds = {"a": _x(rng, 3, 2, 4, 5), "b": _x(rng, 2, 3, 5, 6)}
    model = harness.check(harness.parse(text), feeds, after=2)
    assert harness.ops(model) == {"Transpose": 1, "MatMul": 1}


@pytest.mark.parametrize("op,value,alpha", [("Div", 8.0, 0.125), ("Mul", 0.25, 0.25)])
def test_scalar_scale_becomes_alpha(harness, rng, op, value, alpha):
    text = f"""{HEAD}
    g (float[2,4,5] a, float[2,5,3] b) => (float[2,4,3] y) {{
        c = Constant<value = float {{{value}}}>()
        m = MatMul(a, b)
        y = {op}(m, c)
    }}"""
    feeds = {"a": _x(rng, 2, 4, 5), "b": _x(rng, 2, 5, 3)}
    model = harness.check(harness.parse(text), feeds, after=1)
    node = next(iter(model.graph))
    assert node.op_type == "FusedMatMul"
    assert node.attributes["alpha"].value == pytest.approx(alpha)


def test_division_of_a_constant_by_the_product_is_left_alone(harness, rng):
    text = f"""{HEAD}
    g (float[2,4,5] a, float[2,5,3] b) => (float[2,4,3] y) {{
        c = Constant<value = float {{8.0}}>()
        m = MatMul(a, b)
        y = Div(c, m)
    }}"""
    feeds = {"a": _x(rng, 2, 4, 5), "b": _x(rng, 2, 5, 3)}
    model = harness.check(harness.parse(text), feeds, after=2, rtol=1e-4)
    assert harness.ops(model) == {"MatMul": 1, "Div": 1}


def test_matmul_read_twice_keeps_its_add(harness, rng):
    text = f"""{HEAD}
    g (float[2,5,8] x) => (float[2,5,6] y, float[2,5,6] m) {{
        m = MatMul(x, w)
        y = Add(m, b)
    }}"""
    proto = harness.parse(text, w=_w(rng, 8, 6), b=_x(rng, 6))
    model = harness.check(proto, {"x": _x(rng, 2, 5, 8)}, after=2)
    assert harness.ops(model) == {"MatMul": 1, "Add": 1}


def test_a_fused_node_records_the_model_nodes_it_replaced(harness, rng):
    """MatMul + Add -> Gemm, then Gemm + Relu -> FusedGemm: the names are the model's."""
    from onnxkiln.optimizer._graph import FUSED_FROM, fused_from

    text = f"""{HEAD}
    g (float[3,8] x) => (float[3,6] y) {{
        m = MatMul(x, w)
        a = Add(m, b)
        y = Relu(a)
    }}"""
    proto = harness.parse(text, w=_w(rng, 8, 6), b=_x(rng, 6))
    for node, name in zip(proto.graph.node, ["mm_0", "add_1", "relu_2"]):
        node.name = name
    model = harness.check(proto, {"x": _x(rng, 3, 8)}, after=1)
    (fused,) = model.graph
    assert fused.op_type == "FusedGemm" and fused_from(fused) == ("mm_0", "add_1", "relu_2")
    assert fused.metadata_props[FUSED_FROM] == "mm_0\nadd_1\nrelu_2"
