"""com.microsoft HyperConnectionPreMix, HyperConnectionPostMix and EngramGate
(contrib_hyperconn.py) against onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.errors import SessionError
from onnxkiln.testing import node_model, run_ort, run_ours

RNG = np.random.default_rng(19)
F32, F16 = np.float32, np.float16
B, S, C, H = 2, 3, 4, 5


def check(op, feeds, n=1, tol=1e-6, **attrs):
    m = node_model(op, feeds, n_outputs=n, domain="com.microsoft", **attrs)
    for a, t in zip(run_ours(m, feeds), run_ort(m, feeds)):
        assert a.shape == t.shape and a.dtype == t.dtype
        np.testing.assert_allclose(a.astype(F32), t.astype(F32), rtol=tol, atol=tol)


def r(*shape, dtype=F32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("gate", [(B, S, C), (B, S, C, 1), (B, S, C, H)])
def test_pre_mix_grouped(gate):
    check("HyperConnectionPreMix", {"x": r(B, S, C, H), "p": r(*gate)}, reduction_scale=0.5)


@pytest.mark.parametrize("gate", [(B, S, C), (B, S, C * H)])
def test_pre_mix_flattened(gate):
    check("HyperConnectionPreMix", {"x": r(B, S, C * H), "p": r(*gate)}, num_branches=C)


def test_pre_mix_float16():
    check("HyperConnectionPreMix", {"x": r(B, S, C, H, dtype=F16), "p": r(B, S, C, dtype=F16)},
          tol=2e-3)


@pytest.mark.parametrize("gate", [(B, S, C), (B, S, C, 1), (B, S, C, H)])
@pytest.mark.parametrize("with_mix", [True, False])
def test_post_mix(gate, with_mix):
    feeds = {"x": r(B, S, C, H), "bo": r(B, S, H), "p": r(*gate)}
    if with_mix:
        feeds["sm"] = r(B, S, C, C)
    check("HyperConnectionPostMix", feeds, tol=1e-5)


def test_post_mix_flattened_and_float16():
    check("HyperConnectionPostMix", {"x": r(B, S, C * H), "bo": r(B, S, H), "p": r(B, S, C),
                                     "sm": r(B, S, C, C)}, tol=1e-5, num_branches=C)
    check("HyperConnectionPostMix", {"x": r(B, S, C, H, dtype=F16), "bo": r(B, S, H, dtype=F16),
                                     "p": r(B, S, C, dtype=F16)}, tol=3e-3)


def _scale(dtype=F32):
    return (1 + 0.1 * RNG.standard_normal((C, H))).astype(dtype)


@pytest.mark.parametrize("normed,attrs", [(False, {}), (True, {}), (True, {"epsilon": 1e-3})])
def test_engram_gate(normed, attrs):
    feeds = {"k": r(B, S, C, H), "q": r(B, S, C, H), "v": r(B, S, H), "ks": _scale(),
             "qs": _scale()}
    if normed:
        feeds["cs"] = _scale()
    check("EngramGate", feeds, n=2 if normed else 1, tol=1e-5, **attrs)


def test_engram_gate_float16():
    feeds = {"k": r(B, S, C, H, dtype=F16), "q": r(B, S, C, H, dtype=F16),
             "v": r(B, S, H, dtype=F16), "ks": _scale(F16), "qs": _scale(F16),
             "cs": _scale(F16)}
    check("EngramGate", feeds, n=2, tol=4e-3)


@pytest.mark.parametrize("op,feeds,attrs,match", [
    ("HyperConnectionPreMix", {"x": r(B, S, 21), "p": r(B, S, C)}, {"num_branches": C},
     "divisible by num_branches"),
    ("HyperConnectionPreMix", {"x": r(B, S, C, H), "p": r(B, S, 3)}, {}, "pre_mix must be"),
    ("HyperConnectionPostMix", {"x": r(B, S, C, H), "bo": r(B, S, 4), "p": r(B, S, C)}, {},
     "block_output must be"),
    ("HyperConnectionPostMix", {"x": r(B, S, C, H), "bo": r(B, S, H), "p": r(B, S, C),
                                "sm": r(B, S, C, 3)}, {}, "stream_mix must be"),
    ("EngramGate", {"k": r(B, S, C, H), "q": r(B, S, C, H), "v": r(B, S, H),
                    "ks": r(C, 4), "qs": r(C, H)}, {}, "key_norm_scale must be"),
])
def test_refusals(op, feeds, attrs, match):
    m = node_model(op, feeds, domain="com.microsoft", **attrs)
    with pytest.raises(SessionError, match=match):
        run_ours(m, feeds)
