"""Basic-level folding: Constant lifting, constant folding with our kernels, shape folding."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.optimizer import fold

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def _x(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_constants_become_initializers_and_constant_chains_fold(harness, rng):
    text = f"""{HEAD}
    g (float[3,4] x) => (float[3,4] y) {{
        a = Constant<value = float[4] {{1.0, 2.0, 3.0, 4.0}}>()
        b = Constant<value_float = 0.5>()
        c = Mul(a, b)
        d = Sqrt(c)
        y = Add(x, d)
    }}"""
    model = harness.check(harness.parse(text), {"x": _x(rng, 3, 4)}, "basic", before=5,
                          after=1)
    (value,) = [v for v in model.graph.initializers.values() if v.uses()]
    expected = np.sqrt(np.array([1, 2, 3, 4], np.float32) * np.float32(0.5))
    assert value.const_value.numpy().tobytes() == expected.tobytes()  # bit-identical


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike", "Bernoulli"])
def test_random_ops_are_never_folded(harness, op):
    text = f"""{HEAD}
    g (float[3,4] x) => (float[3,4] y) {{
        p = Constant<value = float[3,4] {{0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5}}>()
        r = {op}(p)
        y = Add(x, r)
    }}"""
    model = harness.optimize(harness.parse(text), "basic")
    assert harness.ops(model)[op] == 1


@pytest.mark.parametrize("size,folded", [(16, True), (1024, False)])
def test_big_constant_of_shape_is_not_materialized(harness, rng, size, folded):
    text = f"""{HEAD}
    g (float[{size},{size}] x) => (float[{size},{size}] y) {{
        s = Constant<value = int64[2] {{{size}, {size}}}>()
        z = ConstantOfShape<value = float[1] {{1.0}}>(s)
        y = Add(x, z)
    }}"""
    model = harness.check(harness.parse(text), {"x": _x(rng, size, size)}, "basic")
    assert ("ConstantOfShape" not in harness.ops(model)) == folded


@pytest.mark.parametrize("shared", [False, True])
def test_transposed_weight_is_folded_only_when_nothing_else_reads_it(harness, rng, shared):
    n = 600  # 1.4 MB: above the size where folding must not duplicate memory
    extra = "g2 = Gather(w, i)\n z = ReduceSum(g2)" if shared else "z = ReduceSum(x)"
    text = f"""{HEAD}
    g (float[2,{n}] x, int64[3] i) => (float[2,{n}] y, float z) {{
        wt = Transpose<perm = [1, 0]>(w)
        y = MatMul(x, wt)
        {extra}
    }}"""
    proto = harness.parse(text, w=_x(rng, n, n))
    feeds = {"x": _x(rng, 2, n), "i": np.array([0, 5, 7])}
    model = harness.check(proto, feeds, "basic", rtol=1e-4, atol=1e-4)
    assert ("Transpose" in harness.ops(model)) == shared
    assert len(model.graph.initializers) == 1


def test_static_shape_computations_fold(harness, rng):
    text = f"""{HEAD}
    g (float[2,3,4] x) => (float[6,4] y) {{
        s = Shape(x)
        i0 = Constant<value = int64 {{0}}>()
        i1 = Constant<value = int64 {{1}}>()
        d0 = Gather(s, i0)
        d1 = Gather(s, i1)
        p = Mul(d0, d1)
        ax = Constant<value = int64[1] {{0}}>()
        pu = Unsqueeze(p, ax)
        last = Slice(s, ax, ax)
        tail = Constant<value = int64[1] {{-1}}>()
        shape = Concat<axis = 0>(pu, tail)
        y = Reshape(x, shape)
    }}"""
    model = harness.check(harness.parse(text), {"x": _x(rng, 2, 3, 4)}, "basic", after=1)
    assert harness.ops(model) == {"Reshape": 1}


def test_static_dims_of_a_symbolic_shape_fold(harness, rng):
    text = f"""{HEAD}
    g (float[N,3,4] x) => (int64 n, int64 c) {{
        s = Shape(x)
        i0 = Constant<value = int64 {{0}}>()
        i1 = Constant<value = int64 {{1}}>()
        n = Gather(s, i0)
        c = Gather(s, i1)
    }}"""
    model = harness.check(harness.parse(text), {"x": _x(rng, 5, 3, 4)}, "basic")
    assert harness.ops(model) == {"Shape": 1, "Gather": 1}  # the batch dim stays dynamic


def test_failing_node_is_left_for_run_time(harness, rng):
    text = f"""{HEAD}
    g (float[3,4] x) => (float[3,4] y) {{
        a = Constant<value = float[5] {{1.0, 2.0, 3.0, 4.0, 5.0}}>()
        s = Constant<value = int64[2] {{2, 2}}>()
        r = Reshape(a, s)
        y = Add(x, x)
        z = Add(r, r)
    }}"""
    model = harness.optimize(harness.parse(text), "basic")
    assert harness.ops(model) == {"Add": 1}  # the bad Reshape is dead: dropped, not run
    text = text.replace("=> (float[3,4] y)", "=> (float[3,4] y, float[2,2] z)")
    model = harness.optimize(harness.parse(text), "basic")
    assert harness.ops(model)["Reshape"] == 1  # it would fail: left to fail at run time


def test_folding_inside_a_subgraph(harness, rng):
    text = f"""{HEAD}
    g (bool c, float[4] x) => (float[4] y) {{
        y = If(c) <
            then_branch = t () => (float[4] o) {{
                a = Constant<value = float[4] {{1.0, 2.0, 3.0, 4.0}}>()
                b = Neg(a)
                o = Add(x, b) }},
            else_branch = e () => (float[4] o) {{ o = Neg(x) }}
        >
    }}"""
    feeds = {"c": np.array(True), "x": _x(rng, 4)}
    model = harness.check(harness.parse(text), feeds, "basic")
    branch = next(iter(model.graph)).attributes["then_branch"].value
    assert [n.op_type for n in branch] == ["Add"]


def test_graph_io_metadata_is_unchanged_by_shape_inference(harness):
    text = f"""{HEAD}
    g (float[N,4] x) => (float[N,4] y) {{
        y = Relu(x)
    }}"""
    model = harness.optimize(harness.parse(text), "basic")
    assert [str(d) for d in model.graph.outputs[0].shape] == ["N", "4"]
    assert fold.FOLD_LIMIT == 1 << 20


def _view_heads(src: str) -> str:
    """x.view(b, s, 2, 4) as torch exports it, the leading dims read from `src`."""
    return f"""{HEAD}
    g (float[B,S,8] x, float[B2,S2,8] other) => (float[B,S,2,4] y) {{
        s = Shape({src})
        zero = Constant<value = int64[1] {{0}}>()
        two = Constant<value = int64[1] {{2}}>()
        lead = Slice(s, zero, two)
        heads = Constant<value = int64[2] {{2, 4}}>()
        target = Concat<axis = 0>(lead, heads)
        y = Reshape(x, target)
    }}"""


def test_reshape_target_from_the_inputs_own_dims_becomes_constant(harness, rng):
    feeds = {"x": _x(rng, 3, 5, 8), "other": _x(rng, 3, 5, 8)}
    model = harness.check(harness.parse(_view_heads("x")), feeds, "basic", before=7, after=1)
    (node,) = model.graph
    assert node.inputs[1].const_value.numpy().tolist() == [0, 0, 2, 4]


def test_reshape_target_from_another_values_dims_stays(harness, rng):
    feeds = {"x": _x(rng, 3, 5, 8), "other": _x(rng, 3, 5, 8)}
    model = harness.check(harness.parse(_view_heads("other")), feeds, "basic")
    assert harness.ops(model) == {"Shape": 1, "Slice": 1, "Concat": 1, "Reshape": 1}


def test_reshape_target_from_another_input_sharing_the_dim_names_stays(harness, rng):
    """B and S name axes of both inputs, but inputs may differ there (onnxruntime runs them):
    copying x's dims would reshape (3, 10, 8) to (3, 10, 2, 4) instead of (6, 5, 2, 4)."""
    text = _view_heads("other").replace("float[B2,S2,8] other", "float[B,S,8] other")
    feeds = {"x": _x(rng, 3, 10, 8), "other": _x(rng, 6, 5, 8)}
    model = harness.check(harness.parse(text), feeds, "basic")
    assert harness.ops(model) == {"Shape": 1, "Slice": 1, "Concat": 1, "Reshape": 1}
    assert harness.run(model, feeds)[0].shape == (6, 5, 2, 4)


def test_reshape_target_from_a_value_derived_from_the_input_still_folds(harness, rng):
    text = _view_heads("r").replace("s = Shape(r)", "r = Relu(x)\n        s = Shape(r)")
    feeds = {"x": _x(rng, 3, 5, 8), "other": _x(rng, 1, 1, 8)}
    model = harness.check(harness.parse(text), feeds, "basic")
    assert harness.ops(model) == {"Reshape": 1}  # the Relu only fed the shape: dead
