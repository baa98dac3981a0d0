"""com.microsoft MoE (contrib_moe.py) against onnxruntime's CPU provider, and the layouts
that provider refuses (fc3, concatenated SwiGLU) against a dense numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.errors import SessionError
from onnxkiln.testing import node_model, run_ort, run_ours

RNG = np.random.default_rng(5)
F32 = np.float32


def moe_case(act="relu", k=2, norm=0, fusion=0, fc3=False, bias=True, experts=4, hidden=8,
             inter=6, tokens=5, dtype=F32, batched=False, **attrs):
    width = 2 if act == "swiglu" and fusion else 1
    x = RNG.standard_normal((2, tokens, hidden) if batched else (tokens, hidden))
    n = x.size // hidden
    feeds = {"x": x, "router": RNG.standard_normal((n, experts)) * 2,
             "w1": RNG.standard_normal((experts, width * inter, hidden)) / 3,
             "b1": RNG.standard_normal((experts, width * inter)) / 3 if bias else None,
             "w2": RNG.standard_normal((experts, hidden, inter)) / 3,
             "b2": RNG.standard_normal((experts, hidden)) / 3 if bias else None}
    if fc3:
        feeds["w3"] = RNG.standard_normal((experts, inter, hidden)) / 3
        feeds["b3"] = RNG.standard_normal((experts, inter)) / 3 if bias else None
    names = [name if v is not None else "" for name, v in feeds.items()]
    feeds = {name: v.astype(dtype) for name, v in feeds.items() if v is not None}
    attrs = dict(k=k, activation_type=act, normalize_routing_weights=norm,
                 swiglu_fusion=fusion, **attrs)
    return node_model("MoE", feeds, domain="com.microsoft", input_names=names, **attrs), feeds


@pytest.mark.parametrize("act", ["relu", "gelu", "silu", "identity"])
@pytest.mark.parametrize("k,norm", [(1, 0), (2, 0), (2, 1), (4, 1)])
def test_moe_matches_onnxruntime(act, k, norm):
    m, feeds = moe_case(act, k, norm)
    np.testing.assert_allclose(run_ours(m, feeds)[0], run_ort(m, feeds)[0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {}, {"activation_alpha": 1.702, "activation_beta": 1.0, "swiglu_limit": 0.5},
    {"activation_alpha": 1.702, "activation_beta": 1.0, "swiglu_limit": 7.0},
])
def test_moe_interleaved_swiglu_matches_onnxruntime(attrs):
    m, feeds = moe_case("swiglu", 2, 1, fusion=1, **attrs)
    np.testing.assert_allclose(run_ours(m, feeds)[0], run_ort(m, feeds)[0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("batched,bias", [(True, False), (False, False), (True, True)])
def test_moe_shapes_and_absent_biases(batched, bias):
    m, feeds = moe_case("silu", 2, 0, bias=bias, batched=batched, tokens=7)
    ours = run_ours(m, feeds)[0]
    assert ours.shape == feeds["x"].shape
    np.testing.assert_allclose(ours, run_ort(m, feeds)[0], rtol=1e-5, atol=1e-5)


def test_moe_float16_matches_onnxruntime():
    m, feeds = moe_case("relu", 2, 1, dtype=np.float16)
    ours, theirs = run_ours(m, feeds)[0], run_ort(m, feeds)[0]
    assert ours.dtype == np.float16
    np.testing.assert_allclose(ours.astype(F32), theirs.astype(F32), rtol=2e-3, atol=2e-3)


def _dense_reference(feeds, act, k, norm, fusion, alpha=1.0, beta=0.0):
    """Every expert on every token, weighted by the (renormalized) top-k softmax."""
    x, r = feeds["x"].reshape(-1, feeds["x"].shape[-1]), feeds["router"]
    p = np.exp(r - r.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    top = np.argsort(-r, axis=1)[:, :k]
    w = np.zeros_like(p)
    np.put_along_axis(w, top, np.take_along_axis(p, top, 1), 1)
    if norm:
        w /= w.sum(1, keepdims=True)
    out = np.zeros_like(x)
    for e in range(r.shape[1]):
        h = x @ feeds["w1"][e].T + feeds["b1"][e]
        if fusion == 2:
            g, lin = np.split(h, 2, axis=1)
        else:
            g, lin = h, x @ feeds["w3"][e].T + feeds["b3"][e]
        if act == "swiglu":
            y = g / (1 + np.exp(-alpha * g)) * (lin + beta)
        else:  # silu gated by fc3
            y = g / (1 + np.exp(-g)) * lin
        out += w[:, e:e + 1] * (y @ feeds["w2"][e].T + feeds["b2"][e])
    return out


@pytest.mark.parametrize("act,fusion,fc3", [("swiglu", 2, False), ("swiglu", 0, True),
                                            ("silu", 0, True)])
def test_moe_layouts_onnxruntime_cpu_refuses(act, fusion, fc3):
    m, feeds = moe_case(act, 2, 1, fusion=fusion, fc3=fc3, activation_beta=0.5)
    beta = 0.5 if act == "swiglu" else 0.0
    np.testing.assert_allclose(run_ours(m, feeds)[0],
                               _dense_reference(feeds, act, 2, 1, fusion, beta=beta),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change,attrs,match", [
    ({"router": np.zeros((4, 4), F32)}, {}, "router_probs must be"),
    ({"w2": np.zeros((4, 8, 5), F32)}, {}, "fc2_experts_weights must be"),
    ({"w1": np.zeros((4, 6, 7), F32)}, {}, "fc1_experts_weights must be"),
    ({}, {"k": 5}, "k must lie in"),
    ({}, {"activation_type": "tanh"}, "activation_type must be"),
    ({}, {"use_sparse_mixer": 1}, "use_sparse_mixer"),
])
def test_moe_refuses_bad_shapes_and_attributes(change, attrs, match):
    _, feeds = moe_case("relu", bias=False)
    feeds.update(change)
    names = ["x", "router", "w1", "", "w2"]
    base = {"k": 2, "activation_type": "relu"}
    m = node_model("MoE", feeds, domain="com.microsoft", input_names=names, **{**base, **attrs})
    with pytest.raises(SessionError, match=match):
        run_ours(m, feeds)
