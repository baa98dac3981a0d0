"""Attention fusion: softmax(mask(Q K^T * scale)) V -> onnxkiln ScaledDotProductAttention."""

from __future__ import annotations

import numpy as np
import pytest

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'
Q = "float[2,3,5,4] q"
K_T = "float[2,3,4,7] k"
K = "float[2,3,7,4] k"
V = "float[2,3,7,4] v"
OUT = "float[2,3,5,4] y"


def _feeds(rng, **shapes):
    return {name: rng.standard_normal(shape).astype(np.float32)
            for name, shape in shapes.items()}


def test_bert_style_attention_with_additive_mask(harness, rng):
    text = f"""{HEAD}
    g ({Q}, {K_T}, {V}, float[2,1,1,7] mask) => ({OUT}) {{
        c = Constant<value = float {{2.0}}>()
        s = MatMul(q, k)
        d = Div(s, c)
        m = Add(d, mask)
        p = Softmax<axis = -1>(m)
        y = MatMul(p, v)
    }}"""
    feeds = _feeds(rng, q=(2, 3, 5, 4), k=(2, 3, 4, 7), v=(2, 3, 7, 4), mask=(2, 1, 1, 7))
    feeds["mask"] = np.where(feeds["mask"] > 0.5, np.float32(-3.4e38), np.float32(0))
    model = harness.check(harness.parse(text), feeds, before=6, after=1)
    assert harness.ops(model) == {"onnxkiln::ScaledDotProductAttention": 1}
    attrs = {k: a.value for k, a in next(iter(model.graph)).attributes.items()}
    assert attrs == {"mask_mode": "add", "divide": 1, "scale": 2.0, "transpose_k": 0}


@pytest.mark.parametrize("keep", ["true", "false"])
def test_gpt_style_attention_with_boolean_mask_and_transposed_keys(harness, rng, keep):
    where = "Where(allowed, d, low)" if keep == "true" else "Where(allowed, low, d)"
    text = f"""{HEAD}
    g ({Q}, {K}, {V}, bool[5,7] allowed) => ({OUT}) {{
        c = Constant<value = float {{2.0}}>()
        low = Constant<value = float {{-3.4028234663852886e38}}>()
        kt = Transpose<perm = [0, 1, 3, 2]>(k)
        s = MatMul(q, kt)
        d = Div(s, c)
        m = {where}
        p = Softmax<axis = -1>(m)
        y = MatMul(p, v)
    }}"""
    feeds = _feeds(rng, q=(2, 3, 5, 4), k=(2, 3, 7, 4), v=(2, 3, 7, 4))
    feeds["allowed"] = np.tril(np.ones((5, 7), bool), 2)
    model = harness.check(harness.parse(text), feeds, after=1)
    attrs = {k: a.value for k, a in next(iter(model.graph)).attributes.items()}
    assert attrs["transpose_k"] == 1
    assert attrs["mask_mode"] == f"keep_{keep}"


def test_unmasked_attention_with_mul_scale(harness, rng):
    text = f"""{HEAD}
    g ({Q}, {K_T}, {V}) => ({OUT}) {{
        c = Constant<value = float {{0.5}}>()
        s = MatMul(q, k)
        d = Mul(c, s)
        p = Softmax<axis = 3>(d)
        y = MatMul(p, v)
    }}"""
    feeds = _feeds(rng, q=(2, 3, 5, 4), k=(2, 3, 4, 7), v=(2, 3, 7, 4))
    model = harness.check(harness.parse(text), feeds, after=1)
    attrs = {k: a.value for k, a in next(iter(model.graph)).attributes.items()}
    assert attrs == {"scale": 0.5, "transpose_k": 0}


def test_mask_that_widens_the_scores_still_matches(harness, rng):
    text = f"""{HEAD}
    g (float[1,3,5,4] q, float[1,3,4,7] k, float[1,3,7,4] v, float[2,1,5,7] mask)
        => (float[2,3,5,4] y) {{
        s = MatMul(q, k)
        m = Add(mask, s)
        p = Softmax<axis = -1>(m)
        y = MatMul(p, v)
    }}"""
    feeds = _feeds(rng, q=(1, 3, 5, 4), k=(1, 3, 4, 7), v=(1, 3, 7, 4), mask=(2, 1, 5, 7))
    model = harness.check(harness.parse(text), feeds, after=1)
    assert harness.ops(model) == {"onnxkiln::ScaledDotProductAttention": 1}


def test_softmax_over_another_axis_is_left_alone(harness, rng):
    text = f"""{HEAD}
    g ({Q}, float[2,3,4,5] k, float[2,3,5,4] v) => ({OUT}) {{
        s = MatMul(q, k)
        p = Softmax<axis = 2>(s)
        y = MatMul(p, v)
    }}"""
    feeds = _feeds(rng, q=(2, 3, 5, 4), k=(2, 3, 4, 5), v=(2, 3, 5, 4))
    model = harness.check(harness.parse(text), feeds, after=3)
    assert "onnxkiln::ScaledDotProductAttention" not in harness.ops(model)


def test_scores_read_elsewhere_are_left_alone(harness, rng):
    text = f"""{HEAD}
    g ({Q}, {K_T}, {V}) => ({OUT}, float[2,3,5,7] s) {{
        s = MatMul(q, k)
        p = Softmax<axis = -1>(s)
        y = MatMul(p, v)
    }}"""
    feeds = _feeds(rng, q=(2, 3, 5, 4), k=(2, 3, 4, 7), v=(2, 3, 7, 4))
    model = harness.check(harness.parse(text), feeds, after=3)
    assert "onnxkiln::ScaledDotProductAttention" not in harness.ops(model)
