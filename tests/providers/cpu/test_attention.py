"""Attention, FlexAttention, LinearAttention and the LLM blocks (RMSNormalization,
RotaryEmbedding, Swish, SwiGLU, TensorScatter, CausalConvWithState) against onnxruntime
and against plain numpy references written from the ONNX spec."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxkiln.testing import assert_matches_ort, node_model, tensor_info

RNG = np.random.default_rng(2024)
NEG = -np.inf


def rand(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def ours(model, feeds):
    from onnxkiln import InferenceSession

    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def close(a, b, rtol=1e-5, atol=1e-6):
    a = np.asarray(a)
    b = np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)


def attention_model(feeds, names, outputs, opset, **attrs):
    """An Attention node model with explicit (possibly absent "") input and output names."""
    node = helper.make_node("Attention", names, outputs, **attrs)
    inputs = [tensor_info(k, v.dtype, v.shape) for k, v in feeds.items()]
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in outputs if o]
    graph = helper.make_graph([node], "attention", inputs, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model)
    by_name = {vi.name: vi for vi in inferred.graph.output}
    del model.graph.output[:]
    model.graph.output.extend(by_name[o] for o in outputs if o)
    return model


# ---------------------------------------------------------------------------------------------
# numpy reference for Attention, written from the spec text (float64, loops over positions)


def ref_attention(
    q,
    k,
    v,
    mask=None,
    past_k=None,
    past_v=None,
    nonpad=None,
    *,
    is_causal=0,
    scale=None,
    q_num_heads=None,
    kv_num_heads=None,
    softcap=0.0,
    qk_matmul_output_mode=0,
    left_window_size=-1,
    right_window_size=-1,
):
    three_d = q.ndim == 3

    def to4(x, h):
        b, s, hid = x.shape
        return x.reshape(b, s, h, hid // h).transpose(0, 2, 1, 3)

    if three_d:
        q, k, v = to4(q, q_num_heads), to4(k, kv_num_heads), to4(v, kv_num_heads)
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    past = 0
    if past_k is not None:
        past = past_k.shape[2]
        k = np.concatenate([past_k.astype(np.float64), k], axis=2)
        v = np.concatenate([past_v.astype(np.float64), v], axis=2)
    b, hq, sq, d = q.shape
    hkv, total = k.shape[1], k.shape[2]
    kr = np.repeat(k, hq // hkv, axis=1)
    vr = np.repeat(v, hq // hkv, axis=1)
    scale = 1 / math.sqrt(d) if scale is None else scale
    raw = q @ kr.transpose(0, 1, 3, 2) * scale
    capped = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
    bias = np.zeros((b, hq, sq, total))
    if mask is not None:
        m = mask
        if m.shape[-1] < total:
            fill = False if m.dtype == bool else NEG
            m = np.concatenate(
                [m, np.full((*m.shape[:-1], total - m.shape[-1]), fill, m.dtype)], axis=-1
            )
        bias = bias + (np.where(m, 0.0, NEG) if m.dtype == bool else m.astype(np.float64))
    for bi in range(b):
        offset = past if nonpad is None else int(nonpad[bi]) - sq
        for i in range(sq):
            p = i + offset
            for j in range(total):
                ok = not is_causal or j <= p
                ok = ok and (left_window_size < 0 or j >= p - left_window_size)
                ok = ok and (right_window_size < 0 or j <= p + right_window_size)
                ok = ok and (nonpad is None or j < nonpad[bi])
                if not ok:
                    bias[bi, :, i, j] = NEG
    with_bias = capped + bias
    dead = np.all(bias == NEG, axis=-1, keepdims=True)
    mx = np.max(np.where(dead, 0, with_bias), axis=-1, keepdims=True)
    e = np.exp(np.where(dead, NEG, with_bias) - mx)
    probs = e / np.where(dead, 1, e.sum(-1, keepdims=True))
    probs = np.where(dead, 0, probs)
    y = probs @ vr
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(b, sq, -1)
    qk = [raw, capped, with_bias, probs][qk_matmul_output_mode]
    return y, k, v, qk


# ---------------------------------------------------------------------------------------------
# Attention against onnxruntime


def _qkv(b, hq, hkv, sq, skv, d, dv, three_d, dtype):
    if three_d:
        return (
            rand(b, sq, hq * d, dtype=dtype),
            rand(b, skv, hkv * d, dtype=dtype),
            rand(b, skv, hkv * dv, dtype=dtype),
        )
    return (
        rand(b, hq, sq, d, dtype=dtype),
        rand(b, hkv, skv, d, dtype=dtype),
        rand(b, hkv, skv, dv, dtype=dtype),
    )


@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (6, 2), (4, 1)])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("opset", [23, 24])
def test_attention_heads_vs_ort(three_d, heads, causal, opset):
    hq, hkv = heads
    q, k, v = _qkv(2, hq, hkv, 3, 5, 8, 6, three_d, np.float32)
    attrs = {"is_causal": causal}
    if three_d:
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    model = node_model("Attention", {"Q": q, "K": k, "V": v}, opset=opset, **attrs)
    assert_matches_ort(model, {"Q": q, "K": k, "V": v}, rtol=1e-5, atol=1e-5)
    ref = ref_attention(q, k, v, is_causal=causal, q_num_heads=hq, kv_num_heads=hkv)[0]
    close(ours(model, {"Q": q, "K": k, "V": v})[0], ref, 1e-5, 1e-5)


@pytest.mark.parametrize(
    "mask_shape,mask_dtype",
    [
        ((3, 5), np.bool_),
        ((2, 4, 3, 5), np.bool_),
        ((2, 1, 3, 5), np.bool_),
        ((3, 5), np.float32),
        ((4, 3, 5), np.float32),
        ((1, 5), np.float32),
        ((5,), np.bool_),
    ],
)
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_masks_vs_ort(mask_shape, mask_dtype, causal):
    q, k, v = _qkv(2, 4, 2, 3, 5, 8, 8, False, np.float32)
    if mask_dtype == np.bool_:
        mask = RNG.random(mask_shape) < 0.7
        mask[..., 0] = True  # keep every row attending something (onnxruntime gives NaN else)
    else:
        mask = rand(*mask_shape)
    feeds = {"Q": q, "K": k, "V": v, "M": mask}
    model = node_model("Attention", feeds, opset=23, is_causal=causal)
    if mask.ndim > 1 and mask.shape[-2] == 3:  # onnxruntime does not broadcast over queries
        assert_matches_ort(model, feeds, rtol=1e-5, atol=1e-5)
    close(ours(model, feeds)[0], ref_attention(q, k, v, mask, is_causal=causal)[0], 1e-5, 1e-5)


@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("sq", [1, 3])
def test_attention_past_present_vs_ort(three_d, heads, causal, sq):
    hq, hkv = heads
    q, k, v = _qkv(2, hq, hkv, sq, sq, 8, 4, three_d, np.float32)
    pk, pv = rand(2, hkv, 4, 8), rand(2, hkv, 4, 4)
    feeds = {"Q": q, "K": k, "V": v, "PK": pk, "PV": pv}
    attrs = {"is_causal": causal}
    if three_d:
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    model = node_model(
        "Attention",
        feeds,
        n_outputs=3,
        opset=23,
        input_names=["Q", "K", "V", "", "PK", "PV"],
        **attrs,
    )
    got = assert_matches_ort(model, feeds, rtol=1e-5, atol=1e-5)
    ref = ref_attention(q, k, v, None, pk, pv, is_causal=causal, q_num_heads=hq, kv_num_heads=hkv)
    for a, r in zip(got, ref[:3]):
        close(a, r, 1e-5, 1e-5)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("softcap", [0.0, 1.5])
def test_attention_qk_output_modes(mode, softcap):
    q, k, v = _qkv(1, 4, 2, 3, 5, 8, 8, False, np.float32)
    mask = rand(3, 5)
    feeds = {"Q": q, "K": k, "V": v, "M": mask}
    model = node_model(
        "Attention",
        feeds,
        n_outputs=4,
        opset=23,
        input_names=["Q", "K", "V", "M"],
        qk_matmul_output_mode=mode,
        softcap=softcap,
        scale=0.3,
    )
    got = ours(model, feeds)
    ref = ref_attention(q, k, v, mask, scale=0.3, softcap=softcap, qk_matmul_output_mode=mode)
    close(got[0], ref[0], 1e-5, 1e-5)
    close(got[3], ref[3], 1e-5, 1e-5)
    assert_matches_ort(model, feeds, rtol=1e-5, atol=1e-5)  # mode 0 is the raw QK^T


def test_attention_float16_vs_ort_and_reference():
    q, k, v = _qkv(2, 4, 2, 4, 6, 16, 16, False, np.float16)
    mask = rand(4, 6, dtype=np.float16)
    feeds = {"Q": q, "K": k, "V": v, "M": mask}
    model = node_model("Attention", feeds, opset=23, is_causal=1)
    got = assert_matches_ort(model, feeds, rtol=5e-3, atol=5e-3)[0]
    assert got.dtype == np.float16
    close(got, ref_attention(q, k, v, mask, is_causal=1)[0], 5e-3, 5e-3)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
@pytest.mark.parametrize("precision", [None, 1, 11])
def test_attention_dtypes_and_softmax_precision(dtype, precision):
    q, k, v = _qkv(1, 2, 1, 3, 4, 8, 8, True, dtype)
    feeds = {"Q": q, "K": k, "V": v}
    attrs = {"q_num_heads": 2, "kv_num_heads": 1, "qk_matmul_output_mode": 3}
    if precision is not None:
        attrs["softmax_precision"] = precision
    model = node_model("Attention", feeds, n_outputs=4, opset=24, **attrs)
    got = ours(model, feeds)
    assert got[0].dtype == dtype and got[3].dtype == dtype  # mode-3 output is emitted in T1
    tol = {np.float16: 5e-3, ml_dtypes.bfloat16: 3e-2, np.float64: 1e-12}[dtype]
    if dtype == np.float64 and precision == 1:
        tol = 1e-6  # a float32 softmax
    ref = ref_attention(q, k, v, q_num_heads=2, kv_num_heads=1, qk_matmul_output_mode=3)
    close(got[0], ref[0], tol, tol)
    close(got[3], ref[3], tol, tol)


def test_attention_fully_masked_rows_are_zero():
    q, k, v = _qkv(1, 2, 2, 3, 4, 8, 8, False, np.float32)
    mask = np.ones((3, 4), bool)
    mask[1] = False  # row 1 attends nothing
    mask[:, 0] = False
    feeds = {"Q": q, "K": k, "V": v, "M": mask}
    for opset in (23, 24, 25):
        model = node_model("Attention", feeds, n_outputs=4, opset=opset, qk_matmul_output_mode=3)
        y, *_, probs = ours(model, feeds)
        assert not np.isnan(y).any() and not np.isnan(probs).any()
        assert (y[:, :, 1] == 0).all() and (probs[:, :, 1] == 0).all()
        ref = ref_attention(q, k, v, mask, qk_matmul_output_mode=3)
        close(y, ref[0])
        close(probs, ref[3])


def test_attention_float_mask_all_neginf_row_and_inf_logits():
    q, k, v = _qkv(1, 1, 1, 2, 3, 4, 4, False, np.float32)
    q[0, 0, 0] = np.inf  # logits of row 0 are +-inf/NaN, but its bias masks every key
    mask = np.array([[NEG, NEG, NEG], [0.0, -1.0, 2.0]], np.float32)
    feeds = {"Q": q, "K": k, "V": v, "M": mask}
    y = ours(node_model("Attention", feeds, opset=23), feeds)[0]
    assert (y[0, 0, 0] == 0).all()
    close(y[0, 0, 1], ref_attention(q, k, v, mask)[0][0, 0, 1])


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("nonpad", [[6, 3], [2, 8], [1, 0]])
@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_nonpad_kv_seqlen(causal, nonpad, with_mask):
    q, k, v = _qkv(2, 4, 2, 3, 8, 8, 8, False, np.float32)
    nonpad = np.array(nonpad, np.int64)
    feeds = {"Q": q, "K": k, "V": v}
    names = ["Q", "K", "V", "", "", "", "N"]
    mask = None
    if with_mask:
        mask = RNG.random((2, 1, 3, 8)) < 0.8
        feeds["M"] = mask
        names[3] = "M"
    feeds["N"] = nonpad
    for n_out in (1, 4):
        model = attention_model(
            feeds, names, ["Y", "", "", "QK"][:n_out], 24, is_causal=causal, qk_matmul_output_mode=3
        )
        got = ours(model, feeds)
        ref = ref_attention(q, k, v, mask, nonpad=nonpad, is_causal=causal, qk_matmul_output_mode=3)
        close(got[0], ref[0], 1e-5, 1e-5)
        if n_out == 4:
            close(got[1], ref[3], 1e-5, 1e-5)


def test_attention_nonpad_matches_ort_without_causal():
    q, k, v = _qkv(2, 2, 2, 3, 6, 8, 8, False, np.float32)
    feeds = {"Q": q, "K": k, "V": v, "N": np.array([4, 6], np.int64)}
    model = node_model("Attention", feeds, opset=24, input_names=["Q", "K", "V", "", "", "", "N"])
    assert_matches_ort(model, feeds, rtol=1e-5, atol=1e-5)


def test_attention_short_mask_is_padded_with_neginf():
    q, k, v = _qkv(1, 2, 2, 2, 3, 4, 4, False, np.float32)
    pk, pv = rand(1, 2, 3, 4), rand(1, 2, 3, 4)
    for mask in (rand(2, 4), np.array([[True, False, True, True]] * 2)):
        feeds = {"Q": q, "K": k, "V": v, "M": mask, "PK": pk, "PV": pv}
        model = node_model("Attention", feeds, n_outputs=3, opset=24)
        got = ours(model, feeds)
        close(got[0], ref_attention(q, k, v, mask, pk, pv)[0], 1e-5, 1e-5)


@pytest.mark.parametrize("window", [(2, -1), (1, 2), (0, 0), (-1, 1)])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("cache", ["none", "past", "nonpad"])
def test_attention_sliding_window(window, causal, cache):
    left, right = window
    q, k, v = _qkv(2, 4, 2, 3, 4, 8, 8, False, np.float32)
    feeds = {"Q": q, "K": k, "V": v}
    names = ["Q", "K", "V"]
    kw = {}
    if cache == "past":
        kw = {"past_k": rand(2, 2, 3, 8), "past_v": rand(2, 2, 3, 8)}
        feeds.update(PK=kw["past_k"], PV=kw["past_v"])
        names += ["", "PK", "PV"]
    elif cache == "nonpad":
        kw = {"nonpad": np.array([4, 3], np.int64)}
        feeds["N"] = kw["nonpad"]
        names += ["", "", "", "N"]
    model = attention_model(
        feeds, names, ["Y"], 25, is_causal=causal, left_window_size=left, right_window_size=right
    )
    ref = ref_attention(
        q, k, v, is_causal=causal, left_window_size=left, right_window_size=right, **kw
    )
    close(ours(model, feeds)[0], ref[0], 1e-5, 1e-5)


def test_attention_present_outputs_do_not_alias_inputs():
    for three_d in (False, True):
        q, k, v = _qkv(1, 2, 2, 2, 2, 4, 4, three_d, np.float32)
        feeds = {"Q": q, "K": k, "V": v}
        attrs = {"q_num_heads": 2, "kv_num_heads": 2} if three_d else {}
        model = node_model("Attention", feeds, n_outputs=3, opset=23, **attrs)
        _, pk, pv = ours(model, feeds)
        assert not np.shares_memory(pk, k) and not np.shares_memory(pv, v)
        k4 = k.reshape(1, 2, 2, 4).transpose(0, 2, 1, 3) if three_d else k
        np.testing.assert_array_equal(pk, k4)


@pytest.mark.parametrize(
    "case",
    [
        "plain",
        "causal",
        "causal_past",
        "causal_nonpad",
        "window",
        "mask_rows",
        "mask_cols",
        "three_d",
        "fp16",
    ],
)
@pytest.mark.parametrize("elems,causal_rows", [(200, 256), (3000, 256), (1 << 30, 8)])
def test_attention_query_blocks(monkeypatch, case, elems, causal_rows):
    """Long inputs go through blocks of query rows; they must give the one-block results."""
    from onnxkiln.providers.cpu import attention as mod

    monkeypatch.setattr(mod, "_BLOCK_ELEMS", elems)  # 1 or 5 query rows per block
    monkeypatch.setattr(mod, "_CAUSAL_BLOCK_ROWS", causal_rows)  # or 5 rows behind a frontier
    three_d = case == "three_d"
    dtype = np.float16 if case == "fp16" else np.float32
    q, k, v = _qkv(2, 4, 2, 37, 37, 8, 6, three_d, dtype)
    feeds = {"Q": q, "K": k, "V": v}
    names = ["Q", "K", "V"]
    attrs = {"is_causal": int(case.startswith("causal") or case in ("three_d", "fp16"))}
    kw = {}
    if three_d:
        attrs.update(q_num_heads=4, kv_num_heads=2)
        kw.update(q_num_heads=4, kv_num_heads=2)
    if case == "causal_past":
        kw.update(past_k=rand(2, 2, 5, 8), past_v=rand(2, 2, 5, 6))
        feeds.update(PK=kw["past_k"], PV=kw["past_v"])
        names += ["", "PK", "PV"]
    if case == "causal_nonpad":
        kw["nonpad"] = feeds["N"] = np.array([37, 30], np.int64)
        names += ["", "", "", "N"]
    if case == "window":
        attrs.update(left_window_size=3, right_window_size=2)
    if case.startswith("mask"):
        shape = (2, 1, 37, 37) if case == "mask_rows" else (37,)
        kw["mask"] = feeds["M"] = rand(*shape)
        names.append("M")
    model = attention_model(feeds, names, ["Y"], 25, **attrs)
    ref = ref_attention(
        q,
        k,
        v,
        kw.pop("mask", None),
        **kw,
        is_causal=attrs["is_causal"],
        left_window_size=attrs.get("left_window_size", -1),
        right_window_size=attrs.get("right_window_size", -1),
    )[0]
    tol = 5e-3 if dtype == np.float16 else 1e-5
    got = ours(model, feeds)[0]
    assert got.dtype == dtype
    close(got, ref, tol, tol)


@pytest.mark.parametrize(
    "shapes,attrs",
    [
        (((1, 3, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)), {}),  # 3 q heads over 2 kv heads
        (((1, 2, 4, 8), (1, 2, 4, 6), (1, 2, 4, 8)), {}),  # head sizes differ
        (((1, 4, 8), (1, 4, 8), (1, 4, 8)), {}),  # 3-D without head counts
        (((1, 4, 8), (1, 4, 8), (1, 4, 8)), {"q_num_heads": 3, "kv_num_heads": 1}),
        (((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)), {"q_num_heads": 4}),  # disagrees with Q
        (((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8), (3, 4)), {}),  # mask rows != queries
    ],
)
def test_attention_bad_shapes_raise(shapes, attrs):
    from onnxkiln.errors import KernelError

    feeds = {n: rand(*s) for n, s in zip("QKVM", shapes)}
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Attention", list(feeds), ["Y"], **attrs)],
            "g",
            [tensor_info(n, np.float32, None) for n in feeds],
            [tensor_info("Y", np.float32, None)],
        ),
        opset_imports=[helper.make_opsetid("", 23)],
        ir_version=10,
    )
    with pytest.raises(KernelError) as info:
        ours(model, feeds)
    assert isinstance(info.value.__cause__, ValueError)


# ---------------------------------------------------------------------------------------------
# FlexAttention


def _flex_model(feeds, score_mod=None, prob_mod=None, **attrs):
    if score_mod is not None:
        attrs["score_mod"] = score_mod
    if prob_mod is not None:
        attrs["prob_mod"] = prob_mod
    node = helper.make_node(
        "FlexAttention", ["Q", "K", "V"], ["Y"], domain="ai.onnx.preview", **attrs
    )
    graph = helper.make_graph(
        [node],
        "flex",
        [tensor_info(k, v.dtype, v.shape) for k, v in feeds.items()],
        [tensor_info("Y", feeds["Q"].dtype, None)],
    )
    return helper.make_model(
        graph,
        ir_version=10,
        opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid("ai.onnx.preview", 1)],
    )


def _unary_graph(op, elem, **attrs):
    return helper.make_graph(
        [helper.make_node(op, ["s", "c"], ["o"], **attrs)],
        "mod",
        [helper.make_tensor_value_info("s", elem, None)],
        [helper.make_tensor_value_info("o", elem, None)],
        [helper.make_tensor("c", elem, [], [0.5])],
    )


def _ref_flex(q, k, v, scale=None, score_fn=None, prob_fn=None):
    g = q.shape[1] // k.shape[1]
    kr, vr = (np.repeat(x.astype(np.float64), g, axis=1) for x in (k, v))
    s = q.astype(np.float64) @ kr.transpose(0, 1, 3, 2)
    s *= 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    if score_fn:
        s = score_fn(s)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    if prob_fn:
        p = prob_fn(p)
    return p @ vr


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_flex_attention_plain(heads, dtype):
    q, k, v = _qkv(2, heads[0], heads[1], 3, 5, 8, 6, False, dtype)
    feeds = {"Q": q, "K": k, "V": v}
    got = ours(_flex_model(feeds, scale=0.2), feeds)[0]
    assert got.dtype == dtype
    tol = {np.float32: 1e-5, np.float16: 3e-3, np.float64: 1e-12}[dtype]
    close(got, _ref_flex(q, k, v, float(np.float32(0.2))), tol, tol)


def test_flex_attention_score_and_prob_mods():
    q, k, v = _qkv(1, 2, 2, 3, 4, 8, 8, False, np.float32)
    feeds = {"Q": q, "K": k, "V": v}
    elem = TensorProto.FLOAT
    model = _flex_model(
        feeds, score_mod=_unary_graph("Mul", elem), prob_mod=_unary_graph("Add", elem)
    )
    ref = _ref_flex(q, k, v, score_fn=lambda s: s * 0.5, prob_fn=lambda p: p + 0.5)
    close(ours(model, feeds)[0], ref, 1e-5, 1e-5)
    # float64 scores reach a double softmax_precision subgraph
    model = _flex_model(
        feeds, score_mod=_unary_graph("Mul", TensorProto.DOUBLE), softmax_precision=11
    )
    close(ours(model, feeds)[0], _ref_flex(q, k, v, score_fn=lambda s: s * 0.5), 1e-5, 1e-5)


# ---------------------------------------------------------------------------------------------
# LinearAttention


def _ref_linear(q, k, v, past, decay, beta, hq, hkv, rule, scale=0.0):
    b, t, _ = q.shape
    dk = q.shape[2] // hq
    dv = v.shape[2] // hkv
    q4 = q.reshape(b, t, hq, dk).astype(np.float64)
    k4 = k.reshape(b, t, hkv, dk).astype(np.float64)
    v4 = v.reshape(b, t, hkv, dv).astype(np.float64)
    init = np.zeros((b, hkv, dk, dv)) if past is None else past.astype(np.float64)
    state = init.copy()
    out = np.zeros((b, t, hq, dv))
    scale = scale or 1 / math.sqrt(dk)
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hkv)
            s = init[bi, kh].copy()
            for i in range(t):
                if decay is not None:
                    g = decay[bi, i].reshape(hkv, -1)[kh].astype(np.float64)
                    s = np.exp(g)[:, None] * s
                kv = v4[bi, i, kh]
                if beta is not None:
                    bt = beta[bi, i].reshape(-1)
                    bt = bt[kh] if bt.size == hkv else bt[0]
                    kv = bt * (kv - s.T @ k4[bi, i, kh])
                s = s + np.outer(k4[bi, i, kh], kv)
                out[bi, i, h] = scale * q4[bi, i, h] @ s
            if h % (hq // hkv) == 0:
                state[bi, kh] = s
    return out.reshape(b, t, hq * dv), state


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("with_past", [False, True])
def test_linear_attention(rule, heads, with_past):
    hq, hkv = heads
    b, t, dk, dv = 2, 5, 4, 3
    feeds = {"q": rand(b, t, hq * dk), "k": rand(b, t, hkv * dk) * 0.5, "v": rand(b, t, hkv * dv)}
    names = ["q", "k", "v", "", "", ""]
    past = decay = beta = None
    if with_past:
        past = feeds["p"] = rand(b, hkv, dk, dv)
        names[3] = "p"
    if rule in ("gated", "gated_delta"):
        decay = feeds["g"] = -np.abs(rand(b, t, hkv * dk if rule == "gated" else hkv))
        names[4] = "g"
    if rule in ("delta", "gated_delta"):
        beta = feeds["bt"] = RNG.uniform(0, 1, (b, t, hkv)).astype(np.float32)
        names[5] = "bt"
    while names[-1] == "":
        names.pop()
    model = node_model(
        "LinearAttention",
        feeds,
        n_outputs=2,
        opset=27,
        input_names=names,
        q_num_heads=hq,
        kv_num_heads=hkv,
        update_rule=rule,
    )
    got = ours(model, feeds)
    ref = _ref_linear(feeds["q"], feeds["k"], feeds["v"], past, decay, beta, hq, hkv, rule)
    close(got[0], ref[0], 1e-4, 1e-5)
    close(got[1], ref[1], 1e-4, 1e-5)
    assert_matches_ort(model, feeds, rtol=1e-4, atol=1e-5)


def test_linear_attention_float16_and_missing_inputs():
    feeds = {
        "q": rand(1, 3, 8, dtype=np.float16),
        "k": rand(1, 3, 8, dtype=np.float16),
        "v": rand(1, 3, 8, dtype=np.float16),
    }
    model = node_model(
        "LinearAttention",
        feeds,
        n_outputs=2,
        opset=27,
        q_num_heads=2,
        kv_num_heads=2,
        update_rule="linear",
        scale=0.5,
    )
    y, state = ours(model, feeds)
    assert y.dtype == np.float16 and state.dtype == np.float16
    ref = _ref_linear(*(feeds[n] for n in "qkv"), None, None, None, 2, 2, "linear", 0.5)
    close(y, ref[0], 5e-3, 5e-3)
    bad = node_model(
        "LinearAttention", feeds, n_outputs=2, opset=27, q_num_heads=2, kv_num_heads=2
    )  # gated_delta without decay/beta
    with pytest.raises(Exception, match="decay"):
        ours(bad, feeds)


# ---------------------------------------------------------------------------------------------
# RMSNormalization, RotaryEmbedding, Swish, SwiGLU


@pytest.mark.parametrize(
    "shape,axis", [((2, 3, 8), -1), ((2, 3, 8), 1), ((4, 6), 0), ((2, 3, 4, 5), -2), ((3, 1), -1)]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rms_normalization_vs_ort(shape, axis, dtype):
    x = rand(*shape, dtype=dtype)
    scale = rand(*shape[axis:], dtype=dtype)
    feeds = {"X": x, "S": scale}
    model = node_model("RMSNormalization", feeds, opset=23, axis=axis, epsilon=1e-3)
    tol = 1e-5 if dtype == np.float32 else 2e-3
    got = assert_matches_ort(model, feeds, rtol=tol, atol=tol)[0]
    ax = tuple(range(axis % x.ndim, x.ndim))
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(axis=ax, keepdims=True) + 1e-3) * scale
    close(got, ref, tol, tol)


def test_rms_normalization_double_and_broadcast_scale():
    x = rand(2, 3, 4, dtype=np.float64)
    s = rand(1, 4, dtype=np.float64)
    model = node_model("RMSNormalization", {"X": x, "S": s}, opset=23, axis=1, stash_type=11)
    got = ours(model, {"X": x, "S": s})[0]
    ref = x / np.sqrt((x**2).mean(axis=(1, 2), keepdims=True) + 1e-5) * s
    assert got.dtype == np.float64
    close(got, ref, 1e-12, 1e-12)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot_dim", [0, 4])
@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("pos_ids", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rotary_embedding_vs_ort(interleaved, rot_dim, three_d, pos_ids, dtype):
    b, h, s, d = 2, 3, 4, 8
    half = (rot_dim or d) // 2
    x = rand(b, s, h * d, dtype=dtype) if three_d else rand(b, h, s, d, dtype=dtype)
    if pos_ids:
        cos, sin = rand(10, half, dtype=dtype), rand(10, half, dtype=dtype)
        feeds = {"X": x, "C": cos, "S": sin, "P": RNG.integers(0, 10, (b, s))}
    else:
        feeds = {"X": x, "C": rand(b, s, half, dtype=dtype), "S": rand(b, s, half, dtype=dtype)}
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot_dim}
    if three_d:
        attrs["num_heads"] = h
    model = node_model("RotaryEmbedding", feeds, opset=23, **attrs)
    tol = 1e-6 if dtype == np.float32 else 2e-3
    got = assert_matches_ort(model, feeds, rtol=tol, atol=tol)[0]
    # numpy reference in (B, S, H, D) layout
    x4 = x.reshape(b, s, h, d) if three_d else x.transpose(0, 2, 1, 3)
    x4 = x4.astype(np.float64)
    c, sn = feeds["C"].astype(np.float64), feeds["S"].astype(np.float64)
    if pos_ids:
        c, sn = c[feeds["P"]], sn[feeds["P"]]
    c, sn = c[:, :, None], sn[:, :, None]
    rot = rot_dim or d
    y = x4.copy()
    i1 = np.arange(0, rot, 2) if interleaved else np.arange(half)
    i2 = i1 + 1 if interleaved else i1 + half
    y[..., i1] = x4[..., i1] * c - x4[..., i2] * sn
    y[..., i2] = x4[..., i1] * sn + x4[..., i2] * c
    y = y.reshape(x.shape) if three_d else y.transpose(0, 2, 1, 3)
    close(got, y, tol, tol)


def test_rotary_embedding_bad_position_raises():
    feeds = {
        "X": rand(1, 1, 2, 4),
        "C": rand(3, 2),
        "S": rand(3, 2),
        "P": np.array([[0, 3]], np.int64),
    }
    with pytest.raises(Exception, match="position_ids"):
        ours(node_model("RotaryEmbedding", feeds, opset=23), feeds)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_swish_vs_ort(alpha, dtype):
    x = rand(3, 17, dtype=dtype, scale=4.0)
    x[0, :3] = [-100, 0, 100]
    model = node_model("Swish", {"X": x}, opset=24, alpha=alpha)
    tol = 1e-3 if dtype == np.float16 else 1e-6
    got = assert_matches_ort(model, {"X": x}, rtol=tol, atol=tol)[0]
    x64 = x.astype(np.float64)
    close(got, x64 / (1 + np.exp(-alpha * x64)), tol, tol)


@pytest.mark.parametrize("alpha", [1.0, 1.702])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_swiglu(alpha, dtype):
    a, b = rand(2, 5, 8, dtype=dtype, scale=3.0), rand(2, 5, 8, dtype=dtype)
    feeds = {"A": a, "B": b}
    got = ours(node_model("SwiGLU", feeds, opset=28, alpha=alpha), feeds)[0]
    assert got.dtype == dtype
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    tol = {np.float32: 1e-6, np.float16: 2e-3, ml_dtypes.bfloat16: 1e-2}[dtype]
    close(got, a64 / (1 + np.exp(-alpha * a64)) * b64, tol, tol)
    with pytest.raises(Exception, match="same shape"):
        ours(node_model("SwiGLU", {"A": a, "B": b[:, :1]}, opset=28), {"A": a, "B": b[:, :1]})


# ---------------------------------------------------------------------------------------------
# TensorScatter, CausalConvWithState


def _ref_scatter(past, update, idx, axis, mode):
    out = past.copy()
    axis %= past.ndim
    n = past.shape[axis]
    for pre in np.ndindex(past.shape[:axis]):
        for s in range(update.shape[axis]):
            j = idx[pre[0]] + s
            out[(*pre, j % n if mode == "circular" else j)] = update[(*pre, s)]
    return out


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1, 2])
@pytest.mark.parametrize("with_idx", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_tensor_scatter(mode, axis, with_idx, dtype):
    past = rand(3, 4, 6, 5).astype(dtype)
    ushape = list(past.shape)
    ushape[axis] = 2
    update = rand(*ushape).astype(dtype)
    feeds = {"P": past, "U": update}
    n = past.shape[axis]
    idx = np.array([0, 1, n - 1 if mode == "circular" else n - 2], np.int64)
    if with_idx:
        feeds["W"] = idx
    else:
        idx = np.zeros(3, np.int64)
    model = node_model("TensorScatter", feeds, opset=24, mode=mode, axis=axis)
    got = ours(model, feeds)[0]
    np.testing.assert_array_equal(got, _ref_scatter(past, update, idx, axis, mode))
    assert not np.shares_memory(got, past)
    if dtype != np.float16:
        assert_matches_ort(model, feeds)


def test_tensor_scatter_linear_out_of_range_raises():
    feeds = {"P": rand(1, 4, 2), "U": rand(1, 2, 2), "W": np.array([3], np.int64)}
    with pytest.raises(Exception, match="outside"):
        ours(node_model("TensorScatter", feeds, opset=24), feeds)


@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("length", [1, 2, 7])
@pytest.mark.parametrize("bias,past", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("act", ["none", "silu"])
def test_causal_conv_with_state(k, length, bias, past, act):
    b, c = 2, 3
    feeds = {"x": rand(b, c, length), "w": rand(c, 1, k)}
    names = ["x", "w"]
    full = np.zeros((b, c, k - 1), np.float32)
    if bias:
        feeds["b"] = rand(c)
        names.append("b")
    if past:
        feeds["p"] = full = rand(b, c, k - 1)
        names += [""] * (3 - len(names)) + ["p"]
    model = node_model(
        "CausalConvWithState", feeds, n_outputs=2, opset=27, input_names=names, activation=act
    )
    y, state = ours(model, feeds)
    padded = np.concatenate([full, feeds["x"]], axis=2).astype(np.float64)
    ref = sum(padded[:, :, i : i + length] * feeds["w"][:, 0, i][:, None] for i in range(k))
    if bias:
        ref = ref + feeds["b"][:, None]
    if act == "silu":
        ref = ref / (1 + np.exp(-ref))
    close(y, ref, 1e-5, 1e-6)
    close(state, padded[:, :, length:], 0, 0)
    assert_matches_ort(model, feeds, rtol=1e-5, atol=1e-6)


def test_causal_conv_with_state_float16():
    feeds = {"x": rand(1, 2, 5, dtype=np.float16), "w": rand(2, 1, 3, dtype=np.float16)}
    model = node_model("CausalConvWithState", feeds, n_outputs=2, opset=27, activation="swish")
    y, state = ours(model, feeds)
    assert y.dtype == np.float16 and state.dtype == np.float16
    assert_matches_ort(model, feeds, rtol=2e-3, atol=2e-3)


def test_attention_without_keys_gives_zeros():
    q, k, v = _qkv(1, 2, 2, 3, 0, 4, 5, False, np.float32)
    feeds = {"Q": q, "K": k, "V": v}
    y, qk = ours(attention_model(feeds, ["Q", "K", "V"], ["Y", "", "", "QK"], 23), feeds)
    assert y.shape == (1, 2, 3, 5) and not y.any()
    assert qk.shape == (1, 2, 3, 0)


def test_attention_value_type_differs_from_query():
    q, k = _qkv(1, 2, 2, 3, 4, 8, 8, False, np.float32)[:2]
    v = rand(1, 2, 4, 6, dtype=np.float16)
    pk, pv = rand(1, 2, 2, 8), rand(1, 2, 2, 6, dtype=np.float16)
    feeds = {"Q": q, "K": k, "V": v, "PK": pk, "PV": pv}
    names = ["Q", "K", "V", "", "PK", "PV"]
    y, _, present_v = ours(attention_model(feeds, names, ["Y", "PrK", "PrV"], 23), feeds)
    assert y.dtype == np.float32 and present_v.dtype == np.float16
    close(y, ref_attention(q, k, v, None, pk, pv)[0], 1e-3, 1e-3)
