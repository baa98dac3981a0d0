"""com.microsoft MoEGroupRouter (contrib_moe_router.py) against onnxruntime's CPU provider:
group-limited top-k routing into router_probs, and the full-score outputs."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.errors import SessionError
from onnxkiln.testing import node_model, run_ort, run_ours

RNG = np.random.default_rng(17)
F32 = np.float32
OP = "MoEGroupRouter"


def router_case(tokens=6, experts=8, full=False, proj=False, dtype=F32, lead=None, **attrs):
    shape = (tokens, 256) if proj else (*(lead or (tokens,)), experts)
    f = {"x": RNG.standard_normal(shape).astype(dtype),
         "b": (RNG.standard_normal(experts) * 0.2).astype(F32)}
    names = ["x", "b"]
    if proj:
        f["p"] = (RNG.standard_normal((experts, 256)) / 16).astype(dtype)
        names.append("p")
    m = node_model(OP, f, n_outputs=3 if full else 1, domain="com.microsoft", input_names=names,
                   **attrs)
    if full:  # the full-score form leaves router_probs out
        m.graph.node[0].output[0] = ""
        del m.graph.output[0]
    return m, f


def check(m, f, tol=1e-6):
    ours = [v for v in run_ours(m, f) if v is not None]
    theirs = run_ort(m, f)
    assert len(ours) == len(theirs)
    for a, t in zip(ours, theirs):
        assert a.shape == t.shape and a.dtype == t.dtype
        np.testing.assert_allclose(a.astype(F32), t.astype(F32), rtol=tol, atol=tol)


@pytest.mark.parametrize("attrs", [
    {"top_k": 2}, {"top_k": 3, "n_group": 4, "topk_group": 2},
    {"top_k": 2, "n_group": 4, "topk_group": 2, "group_topk": 1},
    {"top_k": 4, "n_group": 2, "topk_group": 2, "group_topk": 8},
    {"top_k": 1, "router_sentinel": -1e9},
])
def test_router_probs(attrs):
    check(*router_case(**attrs))


def test_router_probs_float16_and_3d_logits():
    check(*router_case(dtype=np.float16, top_k=2), tol=1e-3)
    check(*router_case(lead=(2, 3), top_k=2))


@pytest.mark.parametrize("proj", [False, True])
def test_router_full_scores(proj):
    check(*router_case(full=True, proj=proj, top_k=2), tol=2e-6)


@pytest.mark.parametrize("attrs,match", [
    ({"top_k": 0}, "must be positive"),
    ({"top_k": 2, "n_group": 2, "topk_group": 3}, "topk_group <= n_group"),
    ({"top_k": 2, "n_group": 3}, "multiple of n_group"),
    ({"top_k": 9}, ">= top_k"),
])
def test_router_refuses(attrs, match):
    m, f = router_case(**attrs)
    with pytest.raises(SessionError, match=match):
        run_ours(m, f)
