"""GELU fusions: erf and tanh forms -> com.microsoft Gelu / FastGelu / BiasGelu."""

from __future__ import annotations

import numpy as np
import pytest

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'

ERF_ORDERS = {
    # torch's export: (x * (erf(x / sqrt2) + 1)) * 0.5
    "x_first": "p = Mul(x, e1)\n y = Mul(p, half)",
    # x * ((erf + 1) * 0.5)
    "half_first": "p = Mul(e1, half)\n y = Mul(x, p)",
    # (x * 0.5) * (erf + 1)
    "scaled_x": "p = Mul(x, half)\n y = Mul(p, e1)",
}


def _erf_model(order: str, scale_op: str = "Div", sqrt2: float = 1.4142135, half: float = 0.5,
               extra_output: str = "") -> str:
    c = sqrt2 if scale_op == "Div" else 1.0 / sqrt2
    outs = "float[2,5,16] y" + (f", float[2,5,16] {extra_output}" if extra_output else "")
    return f"""{HEADER}
    g (float[2,5,16] x) => ({outs}) {{
        c = Constant<value = float {{{c}}}>()
        one = Constant<value = float {{1.0}}>()
        half = Constant<value = float {{{half}}}>()
        d = {scale_op}(x, c)
        e = Erf(d)
        e1 = Add(e, one)
        {ERF_ORDERS[order]}
    }}"""


def _feeds(rng, shape=(2, 5, 16)):
    return {"x": (rng.standard_normal(shape) * 2).astype(np.float32)}


@pytest.mark.parametrize("order", sorted(ERF_ORDERS))
@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
def test_erf_gelu_fuses_in_every_export_order(harness, rng, order, scale_op):
    model = harness.check(harness.parse(_erf_model(order, scale_op)), _feeds(rng),
                          before=8, after=1)
    assert harness.ops(model) == {"com.microsoft::Gelu": 1}


def test_erf_gelu_keeps_graph_output_name(harness, rng):
    model = harness.optimize(harness.parse(_erf_model("x_first")))
    assert [v.name for v in model.graph.outputs] == ["y"]


@pytest.mark.parametrize("kwargs", [{"sqrt2": 1.5}, {"half": 0.6}])
def test_erf_gelu_with_other_constants_is_left_alone(harness, rng, kwargs):
    model = harness.check(harness.parse(_erf_model("x_first", **kwargs)), _feeds(rng), after=5)
    assert "com.microsoft::Gelu" not in harness.ops(model)


def test_erf_gelu_intermediate_read_elsewhere_is_left_alone(harness, rng):
    text = _erf_model("x_first", extra_output="e")
    model = harness.check(harness.parse(text), _feeds(rng), after=5)
    assert "com.microsoft::Gelu" not in harness.ops(model)


def test_bias_add_folds_into_bias_gelu(harness, rng):
    text = f"""{HEADER}
    g (float[2,5,16] a) => (float[2,5,16] y) {{
        x = Add(a, bias)
        c = Constant<value = float {{1.4142135}}>()
        one = Constant<value = float {{1.0}}>()
        half = Constant<value = float {{0.5}}>()
        d = Div(x, c)
        e = Erf(d)
        e1 = Add(e, one)
        p = Mul(x, e1)
        y = Mul(p, half)
    }}"""
    proto = harness.parse(text, bias=_f32(rng.standard_normal(16)))
    model = harness.check(proto, {"a": _feeds(rng)["x"]}, before=9, after=1)
    assert harness.ops(model) == {"com.microsoft::BiasGelu": 1}


def _tanh_model(cube: str = "pow", bias: bool = False) -> str:
    cube_text = ("x3 = Pow(x, three)" if cube == "pow" else "xx = Mul(x, x)\n x3 = Mul(xx, x)")
    pre = "x = Add(a, bias)" if bias else "x = Identity(a)"
    return f"""{HEADER}
    g (float[2,5,16] a) => (float[2,5,16] y) {{
        {pre}
        three = Constant<value = float {{3.0}}>()
        c = Constant<value = float {{0.044715}}>()
        k = Constant<value = float {{0.7978845608}}>()
        one = Constant<value = float {{1.0}}>()
        half = Constant<value = float {{0.5}}>()
        {cube_text}
        cx3 = Mul(c, x3)
        inner = Add(x, cx3)
        ki = Mul(k, inner)
        t = Tanh(ki)
        hx = Mul(half, x)
        t1 = Add(one, t)
        y = Mul(hx, t1)
    }}"""


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_tanh_gelu_fuses_to_fast_gelu(harness, rng, cube):
    feeds = {"a": _feeds(rng)["x"]}
    model = harness.check(harness.parse(_tanh_model(cube)), feeds, after=1, rtol=1e-5,
                          atol=2e-6)
    assert harness.ops(model) == {"com.microsoft::FastGelu": 1}


def test_tanh_gelu_takes_its_bias(harness, rng):
    proto = harness.parse(_tanh_model(bias=True), bias=_f32(rng.standard_normal(16)))
    model = harness.check(proto, {"a": _feeds(rng)["x"]}, after=1, atol=2e-6)
    assert harness.ops(model) == {"com.microsoft::FastGelu": 1}
    assert len(next(iter(model.graph)).inputs) == 2


def test_basic_level_does_not_fuse(harness, rng):
    model = harness.check(harness.parse(_erf_model("x_first")), _feeds(rng), "basic", after=5)
    assert "com.microsoft::Gelu" not in harness.ops(model)


def _f32(values):
    return np.asarray(values, np.float32)
