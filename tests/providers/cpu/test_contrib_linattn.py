"""com.microsoft LinearAttention and LinearAttentionGate (contrib_linattn.py) against
onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.errors import SessionError
from onnxkiln.testing import node_model, run_ort, run_ours

RNG = np.random.default_rng(12)
F32 = np.float32


def la_case(rule, b=2, t=4, hq=4, hkv=2, dk=4, dv=3, past=True, per_key=False, dtype=F32,
            **attrs):
    f = {"q": RNG.standard_normal((b, t, hq * dk)), "k": RNG.standard_normal((b, t, hkv * dk)) / 2,
         "v": RNG.standard_normal((b, t, hkv * dv))}
    names = ["q", "k", "v", "s" if past else ""]
    if past:
        f["s"] = RNG.standard_normal((b, hkv, dk, dv)) * 0.3
    if rule in ("gated", "gated_delta"):
        f["g"] = -RNG.random((b, t, hkv * dk if per_key else hkv))
        names.append("g")
    elif rule == "delta":
        names.append("")
    if rule in ("delta", "gated_delta"):
        f["beta"] = RNG.random((b, t, hkv))
        names.append("beta")
    f = {k: v.astype(dtype) for k, v in f.items()}
    m = node_model("LinearAttention", f, n_outputs=2, domain="com.microsoft", input_names=names,
                   q_num_heads=hq, kv_num_heads=hkv, update_rule=rule, **attrs)
    return m, f


def check(m, f, tol=1e-5):
    for a, t in zip(run_ours(m, f), run_ort(m, f)):
        assert a.shape == t.shape and a.dtype == t.dtype
        np.testing.assert_allclose(a.astype(F32), t.astype(F32), rtol=tol, atol=tol)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("past", [True, False])
def test_linear_attention_rules(rule, past):
    check(*la_case(rule, past=past))


@pytest.mark.parametrize("kw", [{"per_key": True}, {"scale": 0.7}, {"t": 1}, {"hq": 2}])
def test_linear_attention_variants(kw):
    check(*la_case("gated_delta" if "per_key" not in kw else "gated", **kw))


def test_linear_attention_float16():
    check(*la_case("gated_delta", dtype=np.float16), tol=3e-3)


def test_linear_attention_refuses_state_window():
    m, f = la_case("linear", state_window=2)
    with pytest.raises(SessionError, match="state_window"):
        run_ours(m, f)


@pytest.mark.parametrize("with_b", [True, False])
@pytest.mark.parametrize("dtype", [F32, np.float16])
def test_linear_attention_gate(with_b, dtype):
    f = {"a": (RNG.standard_normal((2, 3, 4)) * 3).astype(dtype),
         "dt": RNG.standard_normal(4).astype(F32),
         "ds": -np.exp(RNG.standard_normal(4)).astype(F32)}
    if with_b:
        f["b"] = RNG.standard_normal((2, 3, 4)).astype(dtype)
    m = node_model("LinearAttentionGate", f, n_outputs=2 if with_b else 1,
                   domain="com.microsoft")
    check(m, f, tol=1e-5 if dtype == F32 else 2e-3)


def test_linear_attention_gate_refuses_bad_shapes():
    f = {"a": np.zeros((2, 3, 4), F32), "dt": np.zeros(3, F32), "ds": np.zeros(4, F32)}
    m = node_model("LinearAttentionGate", f, domain="com.microsoft")
    with pytest.raises(SessionError, match="dt_bias and decay_scale must be"):
        run_ours(m, f)
