"""com.microsoft DecoderMaskedMultiHeadAttention (contrib_dmmha.py) against onnxruntime's CPU
provider: shared past/present buffer, bias, packed QKV, masks, beam cache indirection, cross
attention."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.errors import SessionError
from onnxkiln.testing import node_model, run_ort, run_ours

RNG = np.random.default_rng(4)
F32 = np.float32
OP = "DecoderMaskedMultiHeadAttention"
NAMES = ["q", "k", "v", "mask", "attn_bias", "pk", "pv", "psl", "beam", "ind", "bias"]


def model(feeds, n_outputs=3, **attrs):
    last = max(NAMES.index(n) for n in feeds)
    names = [n if n in feeds else "" for n in NAMES[:last + 1]]
    attrs.setdefault("past_present_share_buffer", 1)
    return node_model(OP, feeds, n_outputs=n_outputs, domain="com.microsoft",
                      input_names=names, **attrs)


def self_feeds(b=2, heads=2, d=4, past=3, cap=7, dtype=F32, packed=False, bias=False,
               mask=False, attn_bias=False):
    hidden = heads * d
    f = {}
    if packed:
        f["q"] = RNG.standard_normal((b, 1, 3 * hidden))
    else:
        f |= {n: RNG.standard_normal((b, 1, hidden)) for n in ("q", "k", "v")}
    if mask:
        m = np.ones((b, past + 1), np.int32)
        m[0, :2] = 0
        f["mask"] = m
    if attn_bias:
        f["attn_bias"] = RNG.standard_normal((1, heads, 1, past + 1))
    for n in ("pk", "pv"):
        buf = np.zeros((b, heads, cap, d))
        buf[:, :, :past] = RNG.standard_normal((b, heads, past, d))
        f[n] = buf
    f["psl"] = np.array([past], np.int32)
    if bias:
        f["bias"] = RNG.standard_normal(3 * hidden) * 0.3
    return {k: (v.astype(dtype) if v.dtype == np.float64 else v) for k, v in f.items()}


def check(m, feeds, tol=1e-5):
    ours, theirs = run_ours(m, feeds), run_ort(m, feeds)
    for a, t in zip(ours, theirs):
        assert a.shape == t.shape and a.dtype == t.dtype
        np.testing.assert_allclose(a.astype(F32), t.astype(F32), rtol=tol, atol=tol)


@pytest.mark.parametrize("kw", [{}, {"bias": True}, {"mask": True}, {"attn_bias": True},
                                {"past": 0}])
def test_dmmha_self_attention(kw):
    f = self_feeds(**kw)
    check(model(f, num_heads=2), f)


@pytest.mark.parametrize("bias", [False, True])
def test_dmmha_packed_qkv_is_the_split_query(bias):
    """onnxruntime's CPU kernel fails on packed QKV (a broadcast error), so the packed form
    is checked against the unpacked one, which matches onnxruntime above."""
    f = self_feeds(packed=True, bias=bias)
    q, k, v = np.split(f["q"], 3, axis=2)
    split = {**f, "q": q, "k": k, "v": v}
    for a, b in zip(run_ours(model(f, num_heads=2), f),
                    run_ours(model(split, num_heads=2), split)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("attrs", [{"scale": 0.3}, {"mask_filter_value": -50.0}])
def test_dmmha_attributes(attrs):
    f = self_feeds(mask=True)
    check(model(f, num_heads=2, **attrs), f)


def test_dmmha_float16():
    f = self_feeds(dtype=np.float16, bias=True)
    check(model(f, num_heads=2), f, tol=2e-3)


def test_dmmha_beam_cache_indirection():
    beams, past, cap = 3, 4, 8
    f = self_feeds(b=2 * beams, past=past, cap=cap)
    f["beam"] = np.array([beams], np.int32)
    ind = RNG.integers(0, beams, (2, beams, cap)).astype(np.int32)
    f["ind"] = ind
    m = model(f, num_heads=2)
    check(m, f)
    plain = run_ours(m, {**f, "ind": np.broadcast_to(np.arange(beams, dtype=np.int32)[None, :,
                                                                                       None],
                                                     ind.shape).copy()})
    assert not np.allclose(run_ours(m, f)[0], plain[0])


def test_dmmha_cross_attention():
    b, heads, d, kv = 2, 2, 4, 5
    f = {"q": RNG.standard_normal((b, 1, heads * d)).astype(F32),
         "k": RNG.standard_normal((b, heads, kv, d)).astype(F32),
         "v": RNG.standard_normal((b, heads, kv, d)).astype(F32),
         "mask": np.array([[1] * kv, [1, 1, 1, 0, 0]], np.int32)}
    m = model(f, n_outputs=1, num_heads=heads, past_present_share_buffer=0)
    check(m, f)


@pytest.mark.parametrize("change,match", [
    ({"psl": np.array([7], np.int32)}, "past_sequence_length 7 must lie in"),
    ({"mask": np.ones((2, 9), np.int32)}, "mask_index must be"),
    ({"pk": np.zeros((2, 2, 7, 3), F32)}, "past_key/past_value must be"),
])
def test_dmmha_refuses_bad_inputs(change, match):
    f = {**self_feeds(), **change}
    with pytest.raises(SessionError, match=match):
        run_ours(model(f, num_heads=2), f)


def test_dmmha_qk_output_is_the_masked_scaled_scores():
    import onnx
    from onnx import helper

    f = self_feeds(mask=True, attn_bias=True)
    m = model(f, n_outputs=4, num_heads=2, output_qk=1)
    for i in range(4):  # onnxruntime cannot infer qk's type on its own
        m.graph.output[i].CopyFrom(helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT,
                                                                 None))
    check(m, f, tol=1e-4)
