"""Normalization fusions: decomposed LayerNorm / RMSNorm, Add + LayerNorm -> SkipLayerNorm."""

from __future__ import annotations

import numpy as np
import pytest

H = 16
SQUARE = {"pow": "sq = Pow(d, two)", "mul": "sq = Mul(d, d)"}
DIVIDE = {"div": "n = Div(d, sd)", "reciprocal": "r = Reciprocal(sd)\n n = Mul(d, r)"}


def _ln_text(square: str, divide: str, opset: int = 17, axes: str = "-1",
             beta: bool = True) -> str:
    if opset >= 18:
        mean = (f"ax = Constant<value = int64[1] {{{axes}}}>()\n mu = ReduceMean(x, ax)",
                "var = ReduceMean(sq, ax)")
    else:
        mean = (f"mu = ReduceMean<axes = [{axes}]>(x)", f"var = ReduceMean<axes = [{axes}]>(sq)")
    tail = "s = Mul(n, gamma)\n y = Add(s, beta)" if beta else "y = Mul(n, gamma)"
    return f"""<ir_version: 8, opset_import: ["" : {opset}]>
    g (float[2,5,{H}] x) => (float[2,5,{H}] y) {{
        two = Constant<value = float {{2.0}}>()
        eps = Constant<value = float {{1e-5}}>()
        {mean[0]}
        d = Sub(x, mu)
        {SQUARE[square]}
        {mean[1]}
        ve = Add(var, eps)
        sd = Sqrt(ve)
        {DIVIDE[divide]}
        {tail}
    }}"""


def _params(rng, beta=True):
    p = {"gamma": (rng.standard_normal(H) * 0.1 + 1).astype(np.float32)}
    if beta:
        p["beta"] = (rng.standard_normal(H) * 0.1).astype(np.float32)
    return p


def _x(rng, shape=(2, 5, H)):
    return {"x": (rng.standard_normal(shape) * 3 + 1).astype(np.float32)}


@pytest.mark.parametrize("square", sorted(SQUARE))
@pytest.mark.parametrize("divide", sorted(DIVIDE))
@pytest.mark.parametrize("opset", [17, 18])
def test_decomposed_layer_norm_becomes_one_node(harness, rng, square, divide, opset):
    proto = harness.parse(_ln_text(square, divide, opset), **_params(rng))
    model = harness.check(proto, _x(rng), atol=1e-5, after=1)
    assert harness.ops(model) == {"LayerNormalization": 1}
    node = next(iter(model.graph))
    assert node.attributes["epsilon"].value == pytest.approx(1e-5)


def test_layer_norm_without_beta(harness, rng):
    proto = harness.parse(_ln_text("pow", "div", beta=False), **_params(rng, beta=False))
    model = harness.check(proto, _x(rng), atol=1e-5, after=1)
    assert len(next(iter(model.graph)).inputs) == 2


def test_layer_norm_over_another_axis_is_left_alone(harness, rng):
    text = _ln_text("pow", "div", axes="1").replace(f"float[2,5,{H}]", f"float[2,{H},{H}]")
    proto = harness.parse(text, **_params(rng))
    model = harness.check(proto, _x(rng, (2, H, H)), atol=1e-5)
    assert "LayerNormalization" not in harness.ops(model)


def test_rms_norm_becomes_simplified_layer_norm(harness, rng):
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[2,5,{H}] x) => (float[2,5,{H}] y) {{
        two = Constant<value = float {{2.0}}>()
        eps = Constant<value = float {{1e-6}}>()
        sq = Pow(x, two)
        var = ReduceMean<axes = [-1]>(sq)
        ve = Add(var, eps)
        sd = Sqrt(ve)
        n = Div(x, sd)
        y = Mul(n, gamma)
    }}"""
    proto = harness.parse(text, gamma=_params(rng)["gamma"])
    model = harness.check(proto, _x(rng), atol=1e-5, after=1)
    assert harness.ops(model) == {"SimplifiedLayerNormalization": 1}


def _skip_text(bias: bool, sum_out: bool) -> str:
    pre = "m = Add(a, bias)\n s = Add(m, b)" if bias else "s = Add(a, b)"
    outs = f"float[2,5,{H}] y" + (f", float[2,5,{H}] s" if sum_out else "")
    return f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[2,5,{H}] a, float[2,5,{H}] b) => ({outs}) {{
        {pre}
        y = LayerNormalization<axis = -1, epsilon = 1e-12>(s, gamma, beta)
    }}"""


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("sum_out", [False, True])
def test_add_and_layer_norm_become_skip_layer_norm(harness, rng, bias, sum_out):
    inits = _params(rng)
    if bias:
        inits["bias"] = rng.standard_normal(H).astype(np.float32)
    proto = harness.parse(_skip_text(bias, sum_out), **inits)
    feeds = {"a": _x(rng)["x"], "b": _x(rng)["x"]}
    model = harness.check(proto, feeds, atol=1e-5, after=1)
    assert harness.ops(model) == {"com.microsoft::SkipLayerNormalization": 1}
    assert [v.name for v in model.graph.outputs] == (["y", "s"] if sum_out else ["y"])


def test_skip_layer_norm_needs_equal_shapes(harness, rng):
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[2,5,{H}] a, float[1,1,{H}] b) => (float[2,5,{H}] y) {{
        s = Add(a, b)
        y = LayerNormalization<axis = -1>(s, gamma, beta)
    }}"""
    proto = harness.parse(text, **_params(rng))
    feeds = {"a": _x(rng)["x"], "b": _x(rng, (1, 1, H))["x"]}
    model = harness.check(proto, feeds, atol=1e-5, after=2)
    assert "com.microsoft::SkipLayerNormalization" not in harness.ops(model)
