"""onnxruntime's com.microsoft transformer ops (contrib_transformer, contrib_attention,
contrib_gqa) against onnxruntime's CPU provider, and against numpy references (or
onnxruntime runs of an equivalent model) where that provider lacks a case."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

from onnxkiln.testing import assert_matches_ort, run_ort, tensor_info

MS = "com.microsoft"
RNG = np.random.default_rng(7)
F32, F16 = np.float32, np.float16


def rand(*shape, dtype=F32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def ms_model(op, feeds, names=None, outs=("y",), out_types=None, domain=MS, opset=21, **attrs):
    """A one-node model; names/outs may hold "" for absent optional inputs/outputs."""
    names = list(feeds) if names is None else list(names)
    node = helper.make_node(op, names, list(outs), domain=domain or None, **attrs)
    inputs = [tensor_info(k, v.dtype, v.shape) for k, v in feeds.items()]
    outputs = []
    for i, o in enumerate(outs):
        if not o:
            continue
        if out_types and out_types[i] is not None:
            elem = helper.np_dtype_to_tensor_dtype(np.dtype(out_types[i]))
            outputs.append(helper.make_tensor_value_info(o, elem, None))
        else:
            outputs.append(helper.make_value_info(o, onnx.TypeProto()))
    graph = helper.make_graph([node], op.lower(), inputs, outputs)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10 if opset >= 21 else 8)


def ours(model, feeds):
    from onnxkiln import InferenceSession

    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def close(a, b, tol):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


def tol_of(dt):
    return 4e-3 if np.dtype(dt) == F16 else 2e-5


# ---------------------------------------------------------------------------------------------
# GELU family, BiasAdd, BiasSplitGelu


def gelu_ref(x):
    from scipy.special import erf

    x = x.astype(np.float64)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize("shape", [(2, 3, 8), (5, 16), (4,), (0, 8)])
def test_gelus(dt, shape):
    x, b = rand(*shape, dtype=dt, scale=2), rand(shape[-1], dtype=dt)
    for op, feeds, attrs in [
        ("Gelu", {"x": x}, {}),
        ("BiasGelu", {"x": x, "b": b}, {}),
        ("FastGelu", {"x": x}, {}),
        ("FastGelu", {"x": x, "b": b}, {}),
        ("QuickGelu", {"x": x}, {}),
        ("QuickGelu", {"x": x}, {"alpha": 0.75}),
    ]:
        assert_matches_ort(ms_model(op, feeds, **attrs), feeds, tol_of(dt), tol_of(dt))


def test_gelus_double_and_bfloat16():
    x, b = rand(3, 8, dtype=np.float64), rand(8, dtype=np.float64)
    for op, feeds in [("FastGelu", {"x": x, "b": b}), ("QuickGelu", {"x": x})]:
        assert_matches_ort(ms_model(op, feeds), feeds, 1e-6, 1e-6)  # ORT: float32-grade
    # onnxruntime's CPU provider has no double Gelu/BiasGelu nor any bfloat16 kernel here
    (y,) = ours(ms_model("BiasGelu", {"x": x, "b": b}), {"x": x, "b": b})
    close(y, gelu_ref(x + b), 1e-12)
    xb = x.astype(ml_dtypes.bfloat16)
    (y,) = ours(ms_model("Gelu", {"x": xb}), {"x": xb})
    assert y.dtype == xb.dtype
    close(y, gelu_ref(xb.astype(np.float64)), 2e-2)


@pytest.mark.parametrize("dt", [F32, F16])
def test_bias_add_and_bias_split_gelu(dt):
    # onnxruntime implements both only on CUDA: numpy references
    x, bias, skip = rand(2, 5, 8, dtype=dt), rand(8, dtype=dt), rand(2, 5, 8, dtype=dt)
    feeds = {"x": x, "b": bias, "s": skip}
    (y,) = ours(ms_model("BiasAdd", feeds), feeds)
    assert y.dtype == dt
    ref = x.astype(np.float64) + bias + skip
    close(y, ref, tol_of(dt))
    feeds = {"x": x, "b": bias}
    (y,) = ours(ms_model("BiasSplitGelu", feeds), feeds)
    t = x.astype(np.float64) + bias
    assert y.dtype == dt and y.shape == (2, 5, 4)
    close(y, t[..., :4] * gelu_ref(t[..., 4:]), tol_of(dt))


# ---------------------------------------------------------------------------------------------
# Normalizations


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize("simplified", [False, True])
@pytest.mark.parametrize(
    "xshape,skipshape", [((2, 3, 16), (2, 3, 16)), ((2, 3, 16), (1, 3, 16)),
                         ((2, 3, 16), (3, 16)), ((4, 16), (4, 16))],
)
def test_skip_layer_norm(dt, simplified, xshape, skipshape):
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    x, skip = rand(*xshape, dtype=dt), rand(*skipshape, dtype=dt)
    gamma, beta, bias = rand(16, dtype=dt), rand(16, dtype=dt), rand(16, dtype=dt)
    variants = [
        (["x", "s", "g"], ("y",), {}),
        (["x", "s", "g", "", "b"], ("y", "m", "i", "sum"), {"epsilon": 1e-5}),
        (["x", "s", "g"], ("y", "", "", "sum"), {}),
    ]
    if not simplified:
        variants.append((["x", "s", "g", "beta", "b"], ("y", "m", "i"), {}))
        variants.append((["x", "s", "g", "beta"], ("y",), {"epsilon": 1e-3}))
    else:
        variants.append((["x", "s", "g", "b"], ("y", "m", "i", "sum"), {}))
    for names, outs, attrs in variants:
        if simplified and "beta" in names:
            continue
        pool = {"x": x, "s": skip, "g": gamma, "beta": beta, "b": bias}
        if simplified and len(names) == 5:  # SkipSimplified has no beta: bias is input 3
            names = ["x", "s", "g", "b"]
        feeds = {k: pool[k] for k in names if k}
        model = ms_model(op, feeds, names, outs, **attrs)
        assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


@pytest.mark.parametrize("dt", [F32, F16, np.float64])
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_simplified_layer_norm(dt, axis):
    x = rand(2, 3, 8, dtype=dt)
    scale = rand(*x.shape[axis % 3 :], dtype=dt)
    feeds = {"x": x, "g": scale}
    for outs in (("y",), ("y", "inv")):
        model = ms_model("SimplifiedLayerNormalization", feeds, outs=outs, domain="", axis=axis)
        assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


def test_simplified_layer_norm_mixed_types_and_domains():
    x, g = rand(2, 3, 8), rand(8, dtype=F16)
    feeds = {"x": x, "g": g}
    model = ms_model("SimplifiedLayerNormalization", feeds, outs=("y", "i"), domain="",
                     epsilon=1e-3)
    assert_matches_ort(model, feeds, 2e-3, 2e-3)
    # the com.microsoft spelling (not registered by onnxruntime): same numbers
    ref = ours(model, feeds)
    got = ours(ms_model("SimplifiedLayerNormalization", feeds, outs=("y", "i"), epsilon=1e-3),
               feeds)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype
        close(a, b, 0)
    # stash_type=11 (double statistics): onnxruntime has no kernel; numpy reference
    x64 = x.astype(np.float64)
    feeds = {"x": x64, "g": g.astype(np.float64)}
    model = ms_model("SimplifiedLayerNormalization", feeds, outs=("y", "i"), domain="",
                     stash_type=11)
    y, inv = ours(model, feeds)
    ref_inv = 1 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-5)
    assert inv.dtype == np.float64
    close(inv, ref_inv, 1e-12)
    close(y, x64 * ref_inv * g, 1e-12)


@pytest.mark.parametrize("dt", [F32, F16, np.float64])
@pytest.mark.parametrize("axis", [-1, -2, 1])
def test_layer_norm_before_opset17(dt, axis):
    x = rand(2, 3, 8, dtype=dt)
    scale, bias = rand(*x.shape[axis % 3 :], dtype=dt), rand(*x.shape[axis % 3 :], dtype=dt)
    for names, outs in ((["x", "g", "b"], ("y", "m", "i")), (["x", "g"], ("y",))):
        feeds = {k: {"x": x, "g": scale, "b": bias}[k] for k in names}
        model = ms_model("LayerNormalization", feeds, names, outs, domain="", opset=13,
                         axis=axis, epsilon=1e-4)
        assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize("mask", [True, False])
@pytest.mark.parametrize("pos", [None, "1S", "BS"])
def test_embed_layer_norm(dt, segments, mask, pos):
    b, s, d = 3, 5, 16
    feeds = {
        "ids": RNG.integers(0, 20, (b, s)).astype(np.int32),
        "seg": RNG.integers(0, 2, (b, s)).astype(np.int32),
        "we": rand(20, d, dtype=dt),
        "pe": rand(8, d, dtype=dt),
        "se": rand(2, d, dtype=dt),
        "g": rand(d, dtype=dt),
        "beta": rand(d, dtype=dt),
        "m": (RNG.random((b, s)) > 0.3).astype(np.int32),
        "p": RNG.integers(0, 8, (b if pos == "BS" else 1, s)).astype(np.int32),
    }
    names = ["ids", "seg" if segments else "", "we", "pe", "se" if segments else "", "g", "beta"]
    names += ["m" if mask else ""]
    if pos:
        names.append("p")
    feeds = {k: feeds[k] for k in names if k}
    model = ms_model("EmbedLayerNormalization", feeds, names, ("y", "mi", "sum"), epsilon=1e-5)
    assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding, Trilu, Range, Inverse


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("pos", ["scalar", "BS"])
def test_rotary_embedding(dt, rank, interleaved, pos):
    b, s, n, h = 2, 3, 2, 8
    x = rand(b, s, n * h, dtype=dt) if rank == 3 else rand(b, n, s, h, dtype=dt)
    pid = np.array([2], np.int64) if pos == "scalar" else RNG.integers(0, 10, (b, s))
    cos, sin = rand(12, h // 2, dtype=dt), rand(12, h // 2, dtype=dt)
    feeds = {"x": x, "p": pid.astype(np.int64), "c": cos, "s": sin}
    cases = [{}, {"scale": 0.5}, {"is_packed_batching": 1} if pos == "BS" else {}]
    if rank == 3:  # partial rotation needs num_heads with 3-D input
        cases.append({"num_heads": n})
        part = {"x": x, "p": feeds["p"], "c": cos[:, :2].copy(), "s": sin[:, :2].copy()}
        model = ms_model("RotaryEmbedding", part, interleaved=interleaved, num_heads=n,
                         rotary_embedding_dim=4)
        assert_matches_ort(model, part, tol_of(dt), tol_of(dt))
    for attrs in cases:
        model = ms_model("RotaryEmbedding", feeds, interleaved=interleaved, **attrs)
        assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


@pytest.mark.parametrize("dt", [F32, F16, np.float64, np.int32, np.int64, np.uint8, np.bool_])
def test_trilu(dt):
    x = (RNG.standard_normal((2, 4, 5)) * 5).astype(dt)
    for upper in (0, 1):
        for k in (None, -1, 2):
            feeds = {"x": x} if k is None else {"x": x, "k": np.array(k, np.int64)}
            model = ms_model("Trilu", feeds, upper=upper)
            if np.dtype(dt) in (np.int32, np.uint8, np.bool_):  # no onnxruntime CPU kernel
                (y,) = ours(model, feeds)
                ref = (np.triu if upper else np.tril)(x, k or 0)
                assert y.dtype == x.dtype
                np.testing.assert_array_equal(y, ref)
            else:
                assert_matches_ort(model, feeds)


@pytest.mark.parametrize("dt", [F32, np.float64, np.int16, np.int32, np.int64])
def test_range(dt):
    for start, limit, delta in [(1, 10, 3), (10, 1, -2), (0, 5, None), (3, 3, 1), (2, 0, 1)]:
        feeds = {"a": np.array(start, dt), "b": np.array([limit], dt)}
        if delta is not None:
            feeds["c"] = np.array(delta, dt)
        assert_matches_ort(ms_model("Range", feeds), feeds)
    if np.dtype(dt).kind == "f":
        feeds = {k: np.array(v, dt) for k, v in (("a", 0.1), ("b", 7.3), ("c", 0.35))}
        assert_matches_ort(ms_model("Range", feeds), feeds)


@pytest.mark.parametrize("dt", [F32, F16, np.float64])
@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3, 3), (1, 1)])
def test_inverse(dt, shape):
    # seeded and diagonally dominant: well conditioned whatever order the tests run in
    r = np.random.default_rng(7).uniform(-0.5, 0.5, shape)
    x = (r + 4 * np.eye(shape[-1])).astype(dt)
    tol = 5e-3 if dt == F16 else 1e-5
    assert_matches_ort(ms_model("Inverse", {"x": x}), {"x": x}, tol, tol)


# ---------------------------------------------------------------------------------------------
# numpy attention reference (float64)


def ref_sdpa(q, k, v, scale, add=None):
    """q (B, N, S, H), k/v (B, N, T, H); add broadcast to the scores."""
    s = np.einsum("bnsh,bnth->bnst", q.astype(np.float64), k.astype(np.float64)) * scale
    if add is not None:
        s = s + add
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnst,bnth->bnsh", p, v.astype(np.float64))


def heads(x, n):
    b, s, d = x.shape
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def merge(x):
    b, n, s, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def rope_ref(x, pos, rot, interleaved=False):
    """x (..., S, H) rotated at integer positions pos (S,), base 10000."""
    inv = 1.0 / 10000 ** (np.arange(0, rot, 2) / rot)
    ang = pos[:, None] * inv
    cos, sin = np.cos(ang), np.sin(ang)
    x = x.astype(np.float64).copy()
    if interleaved:
        a, b = x[..., 0:rot:2].copy(), x[..., 1:rot:2].copy()
        x[..., 0:rot:2], x[..., 1:rot:2] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., : rot // 2].copy(), x[..., rot // 2 : rot].copy()
        x[..., : rot // 2], x[..., rot // 2 : rot] = a * cos - b * sin, a * sin + b * cos
    return x


# ---------------------------------------------------------------------------------------------
# Attention (com.microsoft)

B, S, N = 2, 3, 2


def attn_feeds(dt, d=8, width=None):
    width = width or 3 * d
    return rand(B, S, d, dtype=dt), rand(d, width, dtype=dt, scale=0.5), rand(width, dtype=dt)


MASKS = {
    "none": None,
    "1d": lambda t: np.array([t, t - 1], np.int32),
    "2b": lambda t: np.array([t, t - 1, 0, 1], np.int32),
    "3b2": lambda t: np.array([t - 1, t] + [0] * 6, np.int32),
    "2d": lambda t: (np.arange(t)[None] < np.array([[t], [t - 2]])).astype(np.int32),
    "3d": lambda t: (RNG.random((B, S, t)) > 0.3).astype(np.int32),
    "2d-allmasked": lambda t: np.stack([np.ones(t), np.zeros(t)]).astype(np.int32),
}


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("uni", [0, 1])
@pytest.mark.parametrize("past", [0, 4])
def test_attention(dt, mask, uni, past):
    x, w, bias = attn_feeds(dt)
    t = S + past
    feeds = {"x": x, "w": w, "b": bias}
    names = ["x", "w", "b", "", ""]
    if MASKS[mask] is not None:
        feeds["m"] = MASKS[mask](t)
        names[3] = "m"
    outs = ("y",)
    if past:
        feeds["p"] = rand(2, B, N, past, 4, dtype=dt)
        names[4] = "p"
        outs = ("y", "present")
    attrs = {"num_heads": N, "unidirectional": uni}
    if mask == "3d":
        attrs["mask_filter_value"] = -500.0
    model = ms_model("Attention", feeds, names, outs, **attrs)
    assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


@pytest.mark.parametrize("dt", [F32, F16])
def test_attention_attributes(dt):
    x, w, bias = attn_feeds(dt)
    feeds = {"x": x, "w": w}
    for attrs in ({"scale": 0.3}, {"unidirectional": 1, "scale": 1.0}):
        model = ms_model("Attention", feeds, outs=("y", "present"), num_heads=N, **attrs)
        assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))
    # qkv_hidden_sizes with a wider V, attention_bias broadcast over batch or heads
    x, w, bias = attn_feeds(dt, width=20)
    for ab_shape in ((1, N, S, S), (B, 1, S, S)):
        feeds = {"x": x, "w": w, "b": bias, "ab": rand(*ab_shape, dtype=dt)}
        model = ms_model("Attention", feeds, ["x", "w", "b", "", "", "ab"], num_heads=N,
                         qkv_hidden_sizes=[4, 4, 12])
        assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


def test_attention_4d_mask_share_buffer_rotary():
    """Cases onnxruntime's CPU Attention rejects, against equivalent onnxruntime runs/numpy."""
    x, w, bias = attn_feeds(F32)
    p = 2
    past_full = rand(2, B, N, 7, 4)
    mask4 = (RNG.random((B, 1, 6, 6)) > 0.3).astype(np.int32)
    # 4-D (B, 1, M, M) mask == 3-D mask rows [past, past + S), columns [0, T)
    feeds = {"x": x, "w": w, "b": bias, "m": mask4, "p": past_full[:, :, :, :p].copy()}
    got = ours(ms_model("Attention", feeds, outs=("y", "pr"), num_heads=N, unidirectional=1),
               feeds)
    feeds3 = dict(feeds, m=np.ascontiguousarray(mask4[:, 0, p : p + S, : p + S]))
    ref = run_ort(ms_model("Attention", feeds3, outs=("y", "pr"), num_heads=N, unidirectional=1),
                  feeds3)
    close(got[0], ref[0], 1e-5)
    close(got[1], ref[1], 1e-6)  # the K/V projections: BLAS and onnxruntime's MLAS round apart
    # past_present_share_buffer: present is the past buffer with rows [P, P + S) replaced
    feeds = {"x": x, "w": w, "b": bias, "p": past_full, "psl": np.array([p], np.int32)}
    model = ms_model("Attention", feeds, ["x", "w", "b", "", "p", "", "psl"], ("y", "pr"),
                     num_heads=N, past_present_share_buffer=1)
    y, present = ours(model, feeds)
    feeds2 = {"x": x, "w": w, "b": bias, "p": past_full[:, :, :, :p].copy()}
    ry, rp = run_ort(ms_model("Attention", feeds2, ["x", "w", "b", "", "p"], ("y", "pr"),
                              num_heads=N), feeds2)
    close(y, ry, 1e-5)
    assert present.shape == past_full.shape
    close(present[:, :, :, : p + S], rp, 1e-6)
    close(present[:, :, :, p + S :], past_full[:, :, :, p + S :], 0)
    # do_rotary (not in onnxruntime's CPU Attention): half-split RoPE at positions P + s
    feeds = {"x": x, "w": w, "b": bias, "p": past_full[:, :, :, :p].copy()}
    for rot in (4, 2):
        model = ms_model("Attention", feeds, ["x", "w", "b", "", "p"], ("y", "pr"), num_heads=N,
                         do_rotary=1, rotary_embedding_dim=rot, unidirectional=1)
        y, present = ours(model, feeds)
        qkv = x.astype(np.float64) @ w + bias
        pos = p + np.arange(S)
        q = rope_ref(heads(qkv[..., :8], N), pos, rot)
        k = rope_ref(heads(qkv[..., 8:16], N), pos, rot)
        kk = np.concatenate([past_full[0, :, :, :p], k], 2)
        vv = np.concatenate([past_full[1, :, :, :p], heads(qkv[..., 16:], N)], 2)
        causal = np.where(np.arange(p + S)[None] > pos[:, None], -np.inf, 0)
        close(y, merge(ref_sdpa(q, kk, vv, 0.5, causal)), 1e-5)
        close(present, np.stack([kk, vv]), 1e-5)


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention

L, H = 4, 4
D = N * H


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize(
    "mask", ["none", "1d", "3b2", "2d", "3d", "2d-allmasked"]
)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("outs", [("y",), ("y", "pk", "pv", "qk")])
def test_mha_cross(dt, mask, bias, outs):
    q, k, v = rand(B, S, D, dtype=dt), rand(B, L, D, dtype=dt), rand(B, L, 12, dtype=dt)
    feeds = {"q": q, "k": k, "v": v}
    names = ["q", "k", "v", "", ""]
    if bias:
        feeds["b"] = rand(2 * D + 12, dtype=dt)
        names[3] = "b"
    if MASKS[mask] is not None:
        feeds["m"] = MASKS[mask](L)
        names[4] = "m"
    if "qk" in outs and v.shape[2] != D:
        feeds["v"] = rand(B, L, D, dtype=dt)
        if bias:
            feeds["b"] = rand(3 * D, dtype=dt)
    model = ms_model("MultiHeadAttention", feeds, names, outs, [dt] * 4, num_heads=N)
    assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize("uni", [0, 1])
@pytest.mark.parametrize("mask", ["none", "1d", "2d", "3d"])
def test_mha_self_with_past(dt, uni, mask):
    q, k, v = (rand(B, S, D, dtype=dt) for _ in range(3))
    past = 5
    feeds = {"q": q, "k": k, "v": v, "b": rand(3 * D, dtype=dt)}
    names = ["q", "k", "v", "b", "", "ab", "pk", "pv"]
    feeds["ab"] = rand(1, N, S, past + S, dtype=dt)
    feeds["pk"], feeds["pv"] = rand(B, N, past, H, dtype=dt), rand(B, N, past, H, dtype=dt)
    if MASKS[mask] is not None:
        feeds["m"] = MASKS[mask](past + S)
        names[4] = "m"
    model = ms_model("MultiHeadAttention", feeds, names, ("y", "pk2", "pv2", "qk"), [dt] * 4,
                     num_heads=N, unidirectional=uni, scale=0.4, mask_filter_value=-1e3)
    assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


@pytest.mark.parametrize("dt", [F32, F16])
def test_mha_projected_kv_and_bias_shapes(dt):
    q = rand(B, S, D, dtype=dt)
    feeds = {"q": q, "k": rand(B, N, L, H, dtype=dt), "v": rand(B, N, L, H, dtype=dt),
             "b": rand(3 * D, dtype=dt), "ab": rand(B, 1, S, L, dtype=dt)}
    model = ms_model("MultiHeadAttention", feeds, ["q", "k", "v", "b", "", "ab"], num_heads=N)
    assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))
    feeds = {"q": q, "k": rand(B, S, D, dtype=dt), "v": rand(B, S, D, dtype=dt)}
    model = ms_model("MultiHeadAttention", feeds, num_heads=N, unidirectional=1)
    assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


@pytest.mark.parametrize("bias", [False, True])
def test_mha_packed(bias):
    """Packed QKV / KV (not in onnxruntime's CPU provider) == onnxruntime on unpacked inputs."""
    q, k, v = rand(B, S, N, H), rand(B, S, N, H), rand(B, S, N, H)
    b = rand(3 * D)
    flat = {"q": q.reshape(B, S, D), "k": k.reshape(B, S, D), "v": v.reshape(B, S, D), "b": b}
    names = ["q", "k", "v", "b" if bias else ""]
    flat = {kk: vv for kk, vv in flat.items() if kk in names}
    (ref,) = run_ort(ms_model("MultiHeadAttention", flat, names, num_heads=N, unidirectional=1),
                     flat)
    packed = {"qkv": np.stack([q, k, v], axis=3)}
    names = ["qkv", "", "", "b" if bias else ""]
    if bias:
        packed["b"] = b
    (y,) = ours(ms_model("MultiHeadAttention", packed, names, num_heads=N, unidirectional=1),
                packed)
    close(y, ref, 1e-5)
    packed = {"q": flat["q"], "kv": np.stack([k, v], axis=3)}
    names = ["q", "kv", "", "b" if bias else ""]
    if bias:
        packed["b"] = b
    (y,) = ours(ms_model("MultiHeadAttention", packed, names, num_heads=N, unidirectional=1),
                packed)
    close(y, ref, 1e-5)


# ---------------------------------------------------------------------------------------------
# GroupQueryAttention

GQA_INPUTS = ["q", "k", "v", "pk", "pv", "sl", "ts", "cos", "sin", "pid", "ab", "sink",
              "ks", "vs", "qn", "kn", "qs"]


def gqa_case(b, n, nk, h, s, past, seqlens, total, *, dt=F32, packed=False, cache_dt=None,
             **extra):
    """Feeds and input names for a GroupQueryAttention node."""
    feeds = {}
    if packed:
        feeds["q"] = rand(b, s, (n + 2 * nk) * h, dtype=dt)
    else:
        feeds["q"] = rand(b, s, n * h, dtype=dt)
        feeds["k"], feeds["v"] = rand(b, s, nk * h, dtype=dt), rand(b, s, nk * h, dtype=dt)
    if past is not None:
        if cache_dt is None:
            feeds["pk"] = rand(b, nk, past, h, dtype=dt)
            feeds["pv"] = rand(b, nk, past, h, dtype=dt)
        else:
            w = h // 2 if cache_dt == np.uint8 else h
            lo, hi = (0, 256) if cache_dt == np.uint8 else (-128, 128)
            feeds["pk"] = RNG.integers(lo, hi, (b, nk, past, w)).astype(cache_dt)
            feeds["pv"] = RNG.integers(lo, hi, (b, nk, past, w)).astype(cache_dt)
    feeds["sl"] = np.array(seqlens, np.int32)
    feeds["ts"] = np.array(total, np.int32)
    feeds.update({k: v for k, v in extra.items() if v is not None})
    names = [x if x in feeds else "" for x in GQA_INPUTS]
    while names[-1] == "":
        names.pop()
    return feeds, names


def gqa_model(feeds, names, n, nk, outs=("y", "pk2", "pv2"), **attrs):
    dt = feeds["q"].dtype
    return ms_model("GroupQueryAttention", feeds, names, outs, [dt, None, None, dt],
                    num_heads=n, kv_num_heads=nk, **attrs)


# (batch, sequence, past buffer, seqlens_k, total): prompt, padded prompt, static-buffer
# prompt, decode (dynamic and static buffer), ragged decode, chunked prefill (batch 1)
SCENARIOS = {
    "prompt": (2, 3, None, [2, 2], 3),
    "prompt-pad": (2, 4, None, [3, 1], 4),
    "prompt-static": (2, 3, 8, [2, 1], 3),
    "decode": (2, 1, 5, [5, 5], 6),
    "decode-ragged": (2, 1, 5, [5, 3], 6),
    "decode-static": (2, 1, 8, [5, 2], 6),
    "chunk": (1, 3, 5, [7], 8),
    "chunk-static": (1, 3, 10, [7], 8),
}


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize(
    "heads,attrs",
    [((4, 2), {}), ((2, 2), {"scale": 0.3}), ((4, 1), {"local_window_size": 2}),
     ((4, 2), {"softcap": 1.5}), ((4, 2), {"smooth_softmax": 1}), ((4, 2), {"causal": 0}),
     ((4, 2), {"packed": True})],
)
def test_gqa(dt, scenario, heads, attrs):
    b, s, past, seqlens, total = SCENARIOS[scenario]
    attrs = dict(attrs)
    packed = attrs.pop("packed", False)
    n, nk = heads
    feeds, names = gqa_case(b, n, nk, 16, s, past, seqlens, total, dt=dt, packed=packed)
    model = gqa_model(feeds, names, n, nk, **attrs)
    if ("local_window_size" in attrs or "causal" in attrs) and min(seqlens) + 1 < s:
        assert_valid_rows(model, feeds, seqlens, tol_of(dt))
    else:
        assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


def assert_valid_rows(model, feeds, seqlens, tol):
    """Outputs of padding query rows (past seqlens_k + 1) are unspecified; onnxruntime's
    float32 path gives them a different sliding window than its float16/output_qk path."""
    got, ref = ours(model, feeds), run_ort(model, feeds)
    for bi, t in enumerate(np.array(seqlens) + 1):
        close(got[0][bi, :t], ref[0][bi, :t], tol)
    for a, r in zip(got[1:], ref[1:]):
        assert a.dtype == r.dtype
        close(a, r, tol)


@pytest.mark.parametrize("scenario", ["prompt", "prompt-pad", "decode-ragged", "chunk"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("dt", [F32, F16])
def test_gqa_rotary(scenario, interleaved, dt):
    b, s, past, seqlens, total = SCENARIOS[scenario]
    cos, sin = rand(16, 8, dtype=dt), rand(16, 8, dtype=dt)
    for pid in (None, RNG.integers(0, 16 - s, (b, s)).astype(np.int64)):
        for packed in (False, True):
            feeds, names = gqa_case(b, 4, 2, 16, s, past, seqlens, total, dt=dt, packed=packed,
                                    cos=cos, sin=sin, pid=pid)
            model = gqa_model(feeds, names, 4, 2, do_rotary=1, rotary_interleaved=interleaved)
            assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))
    # a rotary dimension (16) smaller than the head size (32)
    feeds, names = gqa_case(b, 2, 1, 32, s, past, seqlens, total, dt=dt, cos=cos, sin=sin)
    model = gqa_model(feeds, names, 2, 1, do_rotary=1, rotary_interleaved=interleaved)
    assert_matches_ort(model, feeds, tol_of(dt), tol_of(dt))


@pytest.mark.parametrize("scenario", ["prompt", "prompt-pad", "decode-ragged", "chunk-static"])
def test_gqa_bias_sink_softcap(scenario):
    b, s, past, seqlens, total = SCENARIOS[scenario]
    for ab_shape in ((b, 4, s, total), (1, 1, s, total)):
        for attrs in ({}, {"softcap": 2.0, "local_window_size": 3}):
            feeds, names = gqa_case(b, 4, 2, 16, s, past, seqlens, total,
                                    ab=rand(*ab_shape), sink=rand(4))
            model = gqa_model(feeds, names, 4, 2, **attrs)
            assert_valid_rows(model, feeds, seqlens, 2e-5)


@pytest.mark.parametrize("mode", [1, 2])
def test_gqa_qk_output(mode):
    # no past context: against onnxruntime (masked scores read 0 there)
    b, s, past, seqlens, total = SCENARIOS["prompt-pad"]
    feeds, names = gqa_case(b, 4, 2, 16, s, past, seqlens, total)
    model = gqa_model(feeds, names, 4, 2, outs=("y", "", "", "qk"), qk_output=mode)
    assert_matches_ort(model, feeds, 2e-5, 2e-5)
    # with past context onnxruntime 1.32's CPU output_qk is garbled: numpy reference
    b, s, past, seqlens, total = SCENARIOS["decode-ragged"]
    feeds, names = gqa_case(b, 4, 2, 16, s, past, seqlens, total)
    model = gqa_model(feeds, names, 4, 2, outs=("y", "pk2", "", "qk"), qk_output=mode)
    _, pk, qk = ours(model, feeds)
    assert qk.shape == (b, 4, s, total)
    q = heads(feeds["q"], 4).astype(np.float64)
    for bi, t in enumerate(np.array(seqlens) + 1):
        kk = np.repeat(pk[bi : bi + 1, :, :t], 2, axis=1)
        sc = np.einsum("bnsh,bnth->bnst", q[bi : bi + 1], kk) / 4
        want = sc if mode == 1 else np.exp(sc) / np.exp(sc).sum(-1, keepdims=True)
        close(qk[bi, :, :, :t], want[0], 1e-5)
        close(qk[bi, :, :, t:], 0 * qk[bi, :, :, t:], 0)


@pytest.mark.parametrize(
    "b,s,past,seqlens,total,qs",
    [(2, 4, 10, [5, 2], 10, [3, 2]), (2, 4, 10, [5, 2], 10, [0, 1]), (2, 4, 6, [5, 3], 10, [2, 1]),
     (2, 1, 10, [5, 3], 10, [1, 0]), (2, 4, 10, [5, 3], 6, [4, 4])],
)
def test_gqa_query_seqlens(b, s, past, seqlens, total, qs):
    """Right-padded chunks: rows [0, Q) of the output and the cache rows must match."""
    cos, sin = rand(16, 8), rand(16, 8)
    for attrs in ({}, {"local_window_size": 3}, {"do_rotary": 1}):
        feeds, names = gqa_case(b, 4, 2, 16, s, past, seqlens, total, cos=cos, sin=sin,
                                qs=np.array(qs, np.int32))
        model = gqa_model(feeds, names, 4, 2, **attrs)
        got, ref = ours(model, feeds), run_ort(model, feeds)
        for bi, q in enumerate(qs):
            close(got[0][bi, :q], ref[0][bi, :q], 2e-5)
        close(got[1], ref[1], 1e-6)
        close(got[2], ref[2], 1e-6)


def _resident(t, cap, window):
    g = cap - window + 1
    return t if t <= cap else t - g * -(-(t - cap) // g)


@pytest.mark.parametrize(
    "b,cap,window,steps,opts",
    [(1, 6, 4, [3] + [1] * 7 + [3, 5], {}), (1, 4, 4, [2, 1, 1, 1, 1], {"rot": True}),
     (2, 5, 3, [1] * 7, {"ab": True}),
     (2, 6, 3, [(4, [4, 2]), (4, [1, 4]), (4, [3, 0]), (1, [1, 1]), (4, [4, 4])], {})],
)
def test_gqa_sliding_window_cache(b, cap, window, steps, opts):
    """A decode loop over a window-sized cache; compares the resident rows [0, L(T))."""
    cos, sin = rand(64, 8), rand(64, 8)
    pk = np.zeros((b, 1, cap, 16), F32)
    pv = pk.copy()
    ref_k, ref_v = pk.copy(), pv.copy()
    t = np.zeros(b, int)
    for step in steps:
        s, q = (step, [step] * b) if isinstance(step, int) else step
        q = np.array(q)
        t_new = t + q
        total = int(t_new.max())
        extra = {"cos": cos, "sin": sin} if opts.get("rot") else {}
        if opts.get("ab"):
            extra["ab"] = rand(b, 1, s, total)
        if not isinstance(step, int):
            extra["qs"] = q.astype(np.int32)
        feeds, names = gqa_case(b, 2, 1, 16, s, cap, list(t_new - 1), total, **extra)
        feeds["pk"], feeds["pv"] = pk, pv
        model = gqa_model(feeds, names, 2, 1, sliding_window_cache=1, local_window_size=window,
                          do_rotary=int(bool(opts.get("rot"))))
        got = ours(model, feeds)
        ref = run_ort(model, dict(feeds, pk=ref_k, pv=ref_v))
        for bi in range(b):
            close(got[0][bi, : q[bi]], ref[0][bi, : q[bi]], 2e-5)
            n_res = _resident(int(t_new[bi]), cap, window)
            close(got[1][bi, :, :n_res], ref[1][bi, :, :n_res], 1e-6)
            close(got[2][bi, :, :n_res], ref[2][bi, :, :n_res], 1e-6)
        pk, pv, ref_k, ref_v, t = got[1], got[2], ref[1], ref[2], t_new


@pytest.mark.parametrize("cache_dt,bits", [(np.int8, 8), (np.uint8, 4)])
@pytest.mark.parametrize("qtype", ["PER_TENSOR", "PER_CHANNEL"])
@pytest.mark.parametrize("scenario", ["prompt", "decode-ragged", "chunk"])
def test_gqa_quantized_cache(cache_dt, bits, qtype, scenario):
    b, s, past, seqlens, total = SCENARIOS[scenario]
    shape = (1,) if qtype == "PER_TENSOR" else (1, 2, 1, 16)
    ks = (0.02 + 0.01 * RNG.random(shape)).astype(F32)
    vs = (0.03 + 0.01 * RNG.random(shape)).astype(F32)
    if past is None:
        past = 0  # an empty quantized past fixes the cache type
    feeds, names = gqa_case(b, 4, 2, 16, s, past, seqlens, total, cache_dt=cache_dt, ks=ks,
                            vs=vs)
    model = gqa_model(feeds, names, 4, 2, k_quant_type=qtype, v_quant_type=qtype,
                      kv_cache_bit_width=bits)
    assert_matches_ort(model, feeds, 2e-5, 2e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_gqa_qk_norm(packed):
    """q/k_norm_weight (rejected by onnxruntime's CPU provider): == onnxruntime on inputs
    normalized per head beforehand (the norm comes before rotary)."""
    b, s, past, seqlens, total = SCENARIOS["decode-ragged"]
    cos, sin = rand(16, 8), rand(16, 8)
    qn, kn = rand(16), rand(16)
    feeds, names = gqa_case(b, 4, 2, 16, s, past, seqlens, total, packed=packed, cos=cos,
                            sin=sin, qn=qn, kn=kn)
    model = gqa_model(feeds, names, 4, 2, do_rotary=1, qk_norm_epsilon=1e-3)
    got = ours(model, feeds)

    def rms(x, w):
        x4 = x.reshape(*x.shape[:2], -1, 16).astype(np.float64)
        y = x4 / np.sqrt((x4**2).mean(-1, keepdims=True) + 1e-3) * w
        return y.reshape(x.shape).astype(F32)

    pre = dict(feeds)
    del pre["qn"], pre["kn"]
    if packed:
        q = pre["q"].reshape(b, s, 8, 16).copy()
        q[:, :, :4] = rms(pre["q"][..., :64], qn).reshape(b, s, 4, 16)
        q[:, :, 4:6] = rms(pre["q"][..., 64:96], kn).reshape(b, s, 2, 16)
        pre["q"] = q.reshape(b, s, 128)
    else:
        pre["q"], pre["k"] = rms(pre["q"], qn), rms(pre["k"], kn)
    ref = run_ort(gqa_model(pre, names[: names.index("qn")], 4, 2, do_rotary=1), pre)
    for a, r in zip(got, ref):
        close(a, r, 2e-5)



def test_attention_ops_bfloat16():
    """bfloat16 (no onnxruntime CPU kernel): == onnxruntime float32 on the rounded inputs."""
    bf = ml_dtypes.bfloat16
    cases = []
    feeds, names = gqa_case(*SCENARIOS["decode-ragged"][:1], 4, 2, 16,
                            *SCENARIOS["decode-ragged"][1:])
    cases.append((gqa_model(feeds, names, 4, 2), feeds))
    f = {"q": rand(B, S, D), "k": rand(B, L, D), "v": rand(B, L, D), "b": rand(3 * D)}
    cases.append((ms_model("MultiHeadAttention", f, outs=("y", "pk", "pv"), num_heads=N), f))
    x, w, bias = attn_feeds(F32)
    f = {"x": x, "w": w, "b": bias}
    cases.append((ms_model("Attention", f, outs=("y", "p"), num_heads=N, unidirectional=1), f))
    for model, f32 in cases:
        rounded = {k: v.astype(bf).astype(F32) if v.dtype == F32 else v for k, v in f32.items()}
        low = {k: v.astype(bf) if v.dtype == F32 else v for k, v in f32.items()}
        ref = run_ort(model, rounded)
        for vi in model.graph.input:
            if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
                vi.type.tensor_type.elem_type = onnx.TensorProto.BFLOAT16
        got = ours(model, low)
        for a, r in zip(got, ref):
            assert a.dtype == bf
            close(a.astype(F32), r, 3e-2)



# ---------------------------------------------------------------------------------------------
# SparseAttention


def _csr(mask):
    """block_row_indices / block_col_indices (padded with -1) of (L, nb, nb) block masks."""
    rows = [np.concatenate([[0], np.cumsum(m.sum(1))]) for m in mask]
    cols = [np.nonzero(m)[1] for m in mask]
    width = max(len(c) for c in cols)
    cols = [np.pad(c, (0, width - len(c)), constant_values=-1) for c in cols]
    return np.array(rows, np.int32), np.array(cols, np.int32)


def _sparse_case(s, key_total, packed=False, rotary=False):
    b, n, nk, h, cap, block = 2, 4, 2, 16, 64, 16
    mask = np.tril(np.ones((2, 4, 4), int))
    mask[0, 2, 0] = mask[1, 3, 1] = 0
    rows, cols = _csr(mask)
    feeds = {"q": rand(b, s, (n + 2 * nk if packed else n) * h)}
    if not packed:
        feeds["k"], feeds["v"] = rand(b, s, nk * h), rand(b, s, nk * h)
    feeds.update(pk=rand(b, nk, cap, h), pv=rand(b, nk, cap, h), ri=rows, ci=cols,
                 ts=np.array(max(key_total), np.int32), kt=np.array(key_total, np.int32))
    names = ["q", "" if packed else "k", "" if packed else "v", "pk", "pv", "ri", "ci", "ts", "kt"]
    attrs = {}
    if rotary:
        feeds["c"], feeds["s"] = rand(64, 8), rand(64, 8)
        names += ["c", "s"]
        attrs = {"do_rotary": 1, "rotary_interleaved": int(rotary == "interleaved")}
    model = ms_model("SparseAttention", feeds, names, ("y", "pk2", "pv2"), num_heads=n,
                     kv_num_heads=nk, sparse_block_size=block, **attrs)
    return model, feeds, mask


def _run_ort_shared(model, feeds):
    """onnxruntime's CPU SparseAttention demands past and present share one buffer."""
    import onnxruntime as ort

    from onnxkiln.testing import ort_session

    sess = ort_session(model)
    io = sess.io_binding()
    caches = {k: ort.OrtValue.ortvalue_from_numpy(feeds[k].copy()) for k in ("pk", "pv")}
    for k, v in feeds.items():
        if k in caches:
            io.bind_ortvalue_input(k, caches[k])
        else:
            io.bind_cpu_input(k, v)
    io.bind_output("y")
    io.bind_ortvalue_output("pk2", caches["pk"])
    io.bind_ortvalue_output("pv2", caches["pv"])
    sess.run_with_iobinding(io)
    outs = [io.get_outputs()[0], caches["pk"], caches["pv"]]
    return [np.array(o.numpy(), copy=True) for o in outs]


@pytest.mark.parametrize(
    "s,total,opts",
    [(40, 40, {}), (1, 41, {}), (3, 41, {"packed": True}), (5, 45, {"rotary": True}),
     (40, 40, {"rotary": "interleaved"})],
)
def test_sparse_attention(s, total, opts):
    model, feeds, _ = _sparse_case(s, [total, total], **opts)
    got, ref = ours(model, feeds), _run_ort_shared(model, feeds)
    close(got[0], ref[0], 2e-5)
    close(got[1][:, :, :total], ref[1][:, :, :total], 1e-6)
    close(got[2][:, :, :total], ref[2][:, :, :total], 1e-6)
    close(got[1][:, :, total:], feeds["pk"][:, :, total:], 0)  # the shared buffer's tail


def test_sparse_attention_ragged_batch():
    """Different key lengths per batch entry: numpy reference (onnxruntime 1.32's CPU kernel
    disagrees with its own documentation there)."""
    s, key_total = 1, [41, 30]
    model, feeds, mask = _sparse_case(s, key_total)
    y, pk, pv = ours(model, feeds)
    q = heads(feeds["q"], 4)
    kn, vn = heads(feeds["k"], 2), heads(feeds["v"], 2)
    for bi, t in enumerate(key_total):
        want_k = feeds["pk"][bi].copy()
        want_k[:, t - s : t] = kn[bi]
        close(pk[bi], want_k, 0)
        want_v = feeds["pv"][bi].copy()
        want_v[:, t - s : t] = vn[bi]
        close(pv[bi], want_v, 0)
        for hd in range(4):
            pos = t - 1
            keys = [j for j in range(t) if mask[hd % 2][pos // 16, j // 16]]
            sc = q[bi, hd, 0].astype(np.float64) @ want_k[hd // 2, keys].T / 4
            p = np.exp(sc - sc.max())
            close(y[bi, 0, hd * 16 : (hd + 1) * 16], p @ want_v[hd // 2, keys] / p.sum(), 1e-5)
