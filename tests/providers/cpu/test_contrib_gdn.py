"""com.microsoft GatedDeltaNet (contrib_gdn.py) against onnxruntime's CPU provider: the four
update rules, ragged and uniform packing, rank-4 and packed-QKV spellings, fused gates."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.errors import SessionError
from onnxkiln.testing import node_model, run_ort, run_ours

RNG = np.random.default_rng(13)
F32 = np.float32
NAMES = ["q", "k", "v", "cu", "g", "beta", "s0", "alog", "dtb"]


def gdn_case(rule="gated_delta", b=2, s=3, hq=2, hv=4, dk=4, dv=3, cu=None, state=True,
             per_key=False, packed=False, rank4=False, dtype=F32, **attrs):
    t = b * s if cu is None else cu[-1]
    q, v = RNG.standard_normal((t, hq, dk)), RNG.standard_normal((t, hv, dv))
    k = RNG.standard_normal((t, hq, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # the delta rules want unit keys
    fused = bool(attrs.get("gate_activation"))
    f = {}
    if packed:
        f["q"] = np.concatenate([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], 1)
    elif rank4:
        f |= {"q": q.reshape(b, s, hq, dk), "k": k.reshape(b, s, hq, dk),
              "v": v.reshape(b, s, hv, dv)}
    else:
        f |= {"q": q, "k": k, "v": v}
    if cu is not None:
        f["cu"] = np.array(cu, np.int32)
    if "gated" in rule:
        g = RNG.standard_normal((t, hv, dk) if per_key else (t, hv))
        f["g"] = g if fused else g * 0.3 - 0.5
    if "delta" in rule:
        f["beta"] = RNG.standard_normal((t, hv)) if attrs.get("beta_activation") \
            else RNG.random((t, hv))
    if rank4:
        f |= {n: f[n].reshape(b, s, *f[n].shape[1:]) for n in ("g", "beta") if n in f}
    if state:
        f["s0"] = RNG.standard_normal((b if cu is None else len(cu) - 1, hv, dv, dk)) * 0.3
    if fused:
        f["alog"], f["dtb"] = RNG.standard_normal(hv) * 0.3, RNG.standard_normal(hv)
    f = {n: x.astype(np.int32 if n == "cu" else F32 if n in ("s0", "alog", "dtb") else dtype)
         for n, x in f.items()}
    last = max(NAMES.index(n) for n in f)
    names = [n if n in f else "" for n in NAMES[:last + 1]]
    m = node_model("GatedDeltaNet", f, n_outputs=2, domain="com.microsoft", input_names=names,
                   update_rule=rule, **attrs)
    return m, f


def check(m, f, tol=1e-5):
    for a, t in zip(run_ours(m, f), run_ort(m, f)):
        assert a.shape == t.shape and a.dtype == t.dtype
        np.testing.assert_allclose(a.astype(F32), t.astype(F32), rtol=tol, atol=tol)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("per_key", [False, True])
def test_gdn_rules(rule, per_key):
    check(*gdn_case(rule, per_key=per_key))


@pytest.mark.parametrize("kw", [
    {"cu": [0, 2, 7]}, {"cu": [0, 3, 3, 5], "state": False}, {"packed": True},
    {"rank4": True}, {"hq": 4, "hv": 4}, {"s": 1},
])
def test_gdn_layouts(kw):
    check(*gdn_case(**kw))


@pytest.mark.parametrize("attrs", [
    {"gate_activation": "softplus"}, {"gate_activation": "qwen"},
    {"gate_activation": "sigmoid"}, {"gate_activation": "kda", "gate_lower_bound": -3.0},
    {"beta_activation": "sigmoid"}, {"qk_l2_norm": 1}, {"scale": 0.5},
])
def test_gdn_fused_gates_and_attributes(attrs):
    check(*gdn_case(**attrs), tol=2e-5)


def test_gdn_float16():
    check(*gdn_case(dtype=np.float16), tol=2e-3)


@pytest.mark.parametrize("kw,match", [
    ({"state": False}, "initial_state gives the batch size"),
    ({"cu": [0, 4, 2]}, "cu_seqlens must rise"),
    ({"update_rule": "fast"}, "update_rule must be"),
    ({"state_update_capacity": 2}, "compact state-update"),
])
def test_gdn_refuses(kw, match):
    rule = kw.pop("update_rule", "gated_delta")
    if rule != "gated_delta":
        m, f = gdn_case()
        for a in m.graph.node[0].attribute:
            if a.name == "update_rule":
                a.s = rule.encode()
    else:
        m, f = gdn_case(**kw)
    with pytest.raises(SessionError, match=match):
        run_ours(m, f)
