"""com.microsoft CausalConvWithState (contrib_causalconv.py) against onnxruntime's CPU
provider: taps over [past_state, input], dilation, SiLU, channels-last layouts."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.errors import SessionError
from onnxkiln.testing import node_model, run_ort, run_ours

RNG = np.random.default_rng(6)
F32 = np.float32
OP = "CausalConvWithState"


def case(b=2, c=3, length=5, k=4, dil=1, past=True, bias=True, channels_last=False,
         trailing=None, dtype=F32, override=None, **attrs):
    s = (k - 1) * dil
    tail = trailing or (c,)
    c = int(np.prod(tail))
    x = RNG.standard_normal((b, length, *tail) if channels_last else (b, c, length))
    feeds = {"x": x.astype(dtype), "w": RNG.standard_normal((c, 1, k)).astype(dtype)}
    names = ["x", "w", "b" if bias else ""]
    if bias:
        feeds["b"] = RNG.standard_normal(c).astype(dtype)
    if past:
        shape = (b, s, *tail) if channels_last else (b, c, s)
        feeds["p"] = RNG.standard_normal(shape).astype(dtype)
        names.append("p")
    feeds.update(override or {})
    attrs = {"activation": "silu", "dilation": dil, "channels_last": int(channels_last), **attrs}
    return node_model(OP, feeds, n_outputs=2, domain="com.microsoft", input_names=names,
                      **attrs), feeds


def check(m, feeds, tol=1e-5):
    for a, t in zip(run_ours(m, feeds), run_ort(m, feeds)):
        assert a.shape == t.shape and a.dtype == t.dtype
        np.testing.assert_allclose(a.astype(F32), t.astype(F32), rtol=tol, atol=tol)


@pytest.mark.parametrize("kw", [
    {}, {"activation": "none"}, {"activation": "swish"}, {"dil": 2}, {"dil": 3, "k": 3},
    {"past": False}, {"bias": False}, {"length": 1}, {"k": 1}, {"length": 2, "k": 5},
])
def test_causal_conv_matches(kw):
    check(*case(**kw))


@pytest.mark.parametrize("kw", [{"c": 4}, {"c": 5, "dil": 2}, {"trailing": (2, 3)},
                                {"trailing": (2, 2), "past": False}])
def test_causal_conv_channels_last(kw):
    check(*case(channels_last=True, **kw))


def test_causal_conv_float16():
    check(*case(dtype=np.float16), tol=2e-3)


def test_causal_conv_state_carries_across_steps():
    """Two half-length steps chained through the state equal one full-length run."""
    m, feeds = case(length=6, past=False)
    full = run_ours(m, feeds)
    shared = {"w": feeds["w"], "b": feeds["b"]}
    y1, state = run_ours(*case(length=3, past=False,
                               override={**shared, "x": feeds["x"][:, :, :3]}))
    y2, state2 = run_ours(*case(length=3, override={**shared, "x": feeds["x"][:, :, 3:],
                                                    "p": state}))
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=2), full[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(state2, full[1])


@pytest.mark.parametrize("attrs,match", [
    ({"state_window": 2}, "state_window is CUDA-only"), ({"ndim": 2}, "only ndim 1"),
    ({"activation": "gelu"}, "activation must be"), ({"dilation": 0}, "dilation must be"),
])
def test_causal_conv_refuses_attributes(attrs, match):
    m, feeds = case(**attrs)
    with pytest.raises(SessionError, match=match):
        run_ours(m, feeds)


def test_causal_conv_refuses_bad_state():
    m, feeds = case(override={"p": np.zeros((2, 3, 2), F32)})
    with pytest.raises(SessionError, match="past_state must be"):
        run_ours(m, feeds)


# VarlenCausalConvWithState ---------------------------------------------------------------


def varlen_case(cu=(0, 3, 4, 9), c=5, k=4, dil=1, bias=True, cap=0, counts=None, dtype=F32,
                **attrs):
    t, s, b = cu[-1], (k - 1) * dil, len(cu) - 1
    f = {"x": RNG.standard_normal((t, c)).astype(dtype),
         "w": RNG.standard_normal((c, 1, k)).astype(dtype), "cu": np.array(cu, np.int32)}
    names = ["x", "w", "cu", "b" if bias else ""]
    if bias:
        f["b"] = RNG.standard_normal(c).astype(dtype)
    f["s"] = RNG.standard_normal((b, c, s)).astype(dtype)
    names.append("s")
    if counts is not None:
        f["n"] = np.array(counts, np.int32)
        names.append("n")
    attrs = {"activation": "silu", "dilation": dil, "state_update_capacity": cap, **attrs}
    m = node_model("VarlenCausalConvWithState", f, n_outputs=3 if cap else 2,
                   domain="com.microsoft", input_names=names, **attrs)
    return m, f


@pytest.mark.parametrize("kw", [
    {}, {"dil": 2}, {"activation": "none", "bias": False}, {"cu": (0, 1, 2)}, {"k": 2},
    {"cap": 3, "counts": [1, 5, 2]}, {"cap": 8, "counts": [0, 1, 9]},
])
def test_varlen_causal_conv_matches(kw):
    check(*varlen_case(**kw))


def test_varlen_causal_conv_float16():
    check(*varlen_case(dtype=np.float16), tol=2e-3)


def test_varlen_equals_one_causal_conv_per_request():
    m, f = varlen_case(cu=(0, 4, 6))
    out, final = run_ours(m, f)
    for r, (lo, hi) in enumerate([(0, 4), (4, 6)]):
        one, feeds = case(b=1, c=5, length=hi - lo, override={
            "x": f["x"][lo:hi].T[None], "w": f["w"], "b": f["b"], "p": f["s"][r:r + 1]})
        y, st = run_ours(one, feeds)
        np.testing.assert_allclose(out[lo:hi], y[0].T, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(final[r], st[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kw,match", [
    ({"cu": (0, 3, 3, 9)}, "must rise strictly"),
    ({"cap": 2}, "capture_count"),
    ({"dil": 0}, "dilation >= 1"),
])
def test_varlen_causal_conv_refuses(kw, match):
    m, f = varlen_case(**kw)
    with pytest.raises(SessionError, match=match):
        run_ours(m, f)
