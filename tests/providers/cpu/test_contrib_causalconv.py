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
