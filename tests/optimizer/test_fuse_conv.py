"""Conv fusions: BatchNormalization folding, activation and residual-Add fusion (FusedConv)."""

from __future__ import annotations

import numpy as np
import pytest

X = "float[1,3,9,9] x"
Y = "float[1,4,9,9] y"


def _conv_params(rng, bias=True):
    p = {"w": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)}
    if bias:
        p["b"] = (rng.standard_normal(4) * 0.1).astype(np.float32)
    return p


def _bn_params(rng):
    return {
        "scale": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "shift": rng.normal(0, 0.1, 4).astype(np.float32),
        "mean": rng.normal(0, 0.1, 4).astype(np.float32),
        "var": rng.uniform(0.5, 1.5, 4).astype(np.float32),
    }


def _feeds(rng, shape=(1, 3, 9, 9)):
    return {"x": rng.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("bias", [False, True])
def test_batch_norm_folds_into_conv(harness, rng, bias):
    conv_in = "x, w, b" if bias else "x, w"
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g ({X}) => ({Y}) {{
        c = Conv<kernel_shape = [3, 3], pads = [1, 1, 1, 1]>({conv_in})
        y = BatchNormalization<epsilon = 1e-3>(c, scale, shift, mean, var)
    }}"""
    proto = harness.parse(text, **_conv_params(rng, bias), **_bn_params(rng))
    model = harness.check(proto, _feeds(rng), before=2, after=1, atol=1e-5)
    assert harness.ops(model) == {"Conv": 1}
    assert set(model.graph.initializers) == {"w_bn", "w_bn_bias"}  # the old weights died


def test_training_batch_norm_is_not_folded(harness, rng):
    text = f"""<ir_version: 8, opset_import: ["" : 15]>
    g ({X}) => ({Y}) {{
        c = Conv<kernel_shape = [3, 3], pads = [1, 1, 1, 1]>(x, w, b)
        y = BatchNormalization<training_mode = 1>(c, scale, shift, mean, var)
    }}"""
    proto = harness.parse(text, **_conv_params(rng), **_bn_params(rng))
    model = harness.optimize(proto)
    assert harness.ops(model)["BatchNormalization"] == 1


ACTIVATIONS = {
    "Relu": ("y = Relu(c)", []),
    "LeakyRelu": ("y = LeakyRelu<alpha = 0.2>(c)", [0.2]),
    "Clip": ("y = Clip(c, lo, hi)", [0.0, 6.0]),
    "Sigmoid": ("y = Sigmoid(c)", []),
    "HardSigmoid": ("y = HardSigmoid<alpha = 0.3, beta = 0.4>(c)", [0.3, 0.4]),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_conv_activation_becomes_fused_conv(harness, rng, name):
    line, params = ACTIVATIONS[name]
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g ({X}) => ({Y}) {{
        lo = Constant<value = float {{0.0}}>()
        hi = Constant<value = float {{6.0}}>()
        c = Conv<kernel_shape = [3, 3], pads = [1, 1, 1, 1]>(x, w, b)
        {line}
    }}"""
    model = harness.check(harness.parse(text, **_conv_params(rng)), _feeds(rng), after=1,
                          atol=1e-5)
    assert harness.ops(model) == {"com.microsoft::FusedConv": 1}
    node = next(iter(model.graph))
    assert node.attributes["activation"].value == name
    got = list(node.attributes["activation_params"].value) if params else []
    assert got == pytest.approx(params)


def test_conv_add_relu_takes_the_residual_as_z(harness, rng):
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[1,4,9,9] x) => (float[1,4,9,9] y) {
        c = Conv<kernel_shape = [3, 3], pads = [1, 1, 1, 1]>(x, w, b)
        s = Add(c, x)
        y = Relu(s)
    }"""
    inits = {"w": (rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32)}
    model = harness.check(harness.parse(text, **inits), _feeds(rng, (1, 4, 9, 9)),
                          before=3, after=1, atol=1e-5)
    assert harness.ops(model) == {"com.microsoft::FusedConv": 1}
    assert [v.name for v in next(iter(model.graph)).inputs] == ["x", "w", "b", "x"]


def test_broadcast_add_is_not_a_residual(harness, rng):
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g ({X}, float[1,4,1,1] z) => ({Y}) {{
        c = Conv<kernel_shape = [3, 3], pads = [1, 1, 1, 1]>(x, w, b)
        s = Add(c, z)
        y = Relu(s)
    }}"""
    feeds = {**_feeds(rng), "z": rng.standard_normal((1, 4, 1, 1)).astype(np.float32)}
    model = harness.check(harness.parse(text, **_conv_params(rng)), feeds, after=3, atol=1e-5)
    assert "com.microsoft::FusedConv" not in harness.ops(model)


def test_conv_read_twice_is_not_fused(harness, rng):
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g ({X}) => ({Y}, float[1,4,9,9] c) {{
        c = Conv<kernel_shape = [3, 3], pads = [1, 1, 1, 1]>(x, w, b)
        y = Relu(c)
    }}"""
    model = harness.check(harness.parse(text, **_conv_params(rng)), _feeds(rng), after=2,
                          atol=1e-5)
    assert harness.ops(model) == {"Conv": 1, "Relu": 1}
