"""CUDA-provider torch kernels vs the numpy CPU provider: Attention and RotaryEmbedding."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import check_node, reason  # noqa: E402

from onnxkiln.testing import node_model  # noqa: E402

R = np.random.default_rng(4)
MS = "com.microsoft"


def rand(shape, dtype=np.float32, lo=-1.0, hi=1.0):
    return R.uniform(lo, hi, size=shape).astype(dtype)


CASES = [
    # (q heads, kv heads, 3-D?, mask kind, causal, past, extra attrs, n_outputs)
    (4, 4, False, None, False, 0, {}, 1),
    (4, 2, False, "bool", False, 0, {}, 1),
    (4, 1, True, "float", True, 0, {"scale": 0.3}, 1),
    (2, 2, False, None, True, 3, {}, 3),
    (2, 2, False, "bool_short", True, 2, {}, 3),
    (2, 2, False, "dead", False, 0, {}, 1),
    (2, 2, False, "float", False, 0, {"softcap": 2.0}, 1),
    (2, 1, False, "float", True, 2, {"qk_matmul_output_mode": 0}, 4),
    (2, 2, False, "float", False, 0, {"qk_matmul_output_mode": 1, "softcap": 1.5}, 4),
    (2, 2, False, "bool", False, 0, {"qk_matmul_output_mode": 2}, 4),
    (2, 2, False, "float", True, 1, {"qk_matmul_output_mode": 3}, 4),
]


@pytest.mark.parametrize("hq,hkv,three,mask,causal,past,attrs,n_out", CASES)
def test_attention(hq, hkv, three, mask, causal, past, attrs, n_out):
    b, s, t, d = 2, 3, 4, 8
    total = t + past
    if three:
        feeds = {"q": rand((b, s, hq * d)), "k": rand((b, t, hkv * d)),
                 "v": rand((b, t, hkv * d))}
        attrs = {**attrs, "q_num_heads": hq, "kv_num_heads": hkv}
    else:
        feeds = {"q": rand((b, hq, s, d)), "k": rand((b, hkv, t, d)), "v": rand((b, hkv, t, d))}
    names = ["q", "k", "v"]
    if mask == "bool":
        feeds["m"] = R.random((b, 1, s, total)) < 0.7
    elif mask == "bool_short":
        feeds["m"] = R.random((s, total - 1)) < 0.8
    elif mask == "dead":
        m = R.random((b, hq, s, total)) < 0.7
        m[1, 0, 2] = False
        feeds["m"] = m
    elif mask == "float":
        feeds["m"] = rand((s, total), lo=-3, hi=0)
    names.append("m" if mask else "")
    if past:
        feeds["pk"] = rand((b, hkv, past, d))
        feeds["pv"] = rand((b, hkv, past, d))
        names += ["pk", "pv"]
    while names[-1] == "":
        names.pop()
    check_node("Attention", feeds, input_names=names, n_outputs=n_out, opset=23,
               is_causal=int(causal), rtol=1e-5, atol=1e-5, **attrs)


def test_attention_float16():
    q, k, v = (rand((1, 2, 3, 8), np.float16) for _ in range(3))
    check_node("Attention", {"q": q, "k": k, "v": v}, opset=23, is_causal=1, rtol=2e-2,
               atol=2e-2)


def test_attention_declines_bad_window():
    q = rand((1, 2, 3, 8))
    why = reason(node_model("Attention", {"q": q, "k": q, "v": q}, opset=24,
                            left_window_size=-2))
    assert why is not None and "left_window_size must be -1 or >= 0" in why


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot", [0, 4])
@pytest.mark.parametrize("three", [False, True])
@pytest.mark.parametrize("with_pos", [False, True])
def test_rotary_embedding(interleaved, rot, three, with_pos):
    b, h, s, d = 2, 3, 4, 8
    x = rand((b, s, h * d)) if three else rand((b, h, s, d))
    half = (rot or d) // 2
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot}
    if three:
        attrs["num_heads"] = h
    if with_pos:
        feeds = {"x": x, "cos": rand((10, half)), "sin": rand((10, half)),
                 "p": R.integers(0, 10, size=(b, s)).astype(np.int64)}
    else:
        feeds = {"x": x, "cos": rand((b, s, half)), "sin": rand((b, s, half))}
    check_node("RotaryEmbedding", feeds, opset=23, **attrs)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("four", [False, True])
@pytest.mark.parametrize("pos", ["offset", "explicit"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rotary_embedding_ms(interleaved, four, pos, dtype):
    b, n, s, d = 2, 2, 3, 8
    x = rand((b, n, s, d), dtype) if four else rand((b, s, n * d), dtype)
    p = np.array([2], np.int64) if pos == "offset" else \
        R.integers(0, 12, size=(b, s)).astype(np.int64)
    check_node("RotaryEmbedding", {"x": x, "p": p, "cos": rand((12, d // 2), dtype),
                                   "sin": rand((12, d // 2), dtype)}, domain=MS,
               interleaved=interleaved, **({} if four else {"num_heads": n}))


MHA = [
    ("separate", None, False, False, False),
    ("separate", "2d", True, False, True),
    ("separate", "1d", False, True, False),
    ("separate", "1d2b", False, False, False),
    ("separate", "3d", True, True, False),
    ("separate", "4d", False, False, True),
    ("packed_qkv", None, True, False, False),
    ("packed_kv", "2d", True, False, False),
    ("projected", None, False, True, False),
]


@pytest.mark.parametrize("layout,mask,with_bias,causal,past", MHA)
def test_multi_head_attention(layout, mask, with_bias, causal, past):
    b, s, n, h = 2, 3, 2, 4
    lk = 3 if layout in ("separate", "packed_qkv") else 5
    d = n * h
    p = 2 if past else 0
    t = lk + p
    feeds, names = {}, []
    if layout == "packed_qkv":
        feeds["q"] = rand((b, s, n, 3, h))
        names += ["q", "", ""]
    elif layout == "packed_kv":
        feeds["q"], feeds["k"] = rand((b, s, d)), rand((b, lk, n, 2, h))
        names += ["q", "k", ""]
    elif layout == "projected":
        feeds["q"], feeds["k"], feeds["v"] = rand((b, s, d)), rand((b, n, lk, h)), \
            rand((b, n, lk, h))
        names += ["q", "k", "v"]
    else:
        feeds["q"], feeds["k"], feeds["v"] = rand((b, s, d)), rand((b, lk, d)), rand((b, lk, d))
        names += ["q", "k", "v"]
    if with_bias:
        feeds["bias"] = rand((3 * d,))
        names.append("bias")
    else:
        names.append("")
    m = {None: None, "2d": (R.random((b, t)) < 0.7).astype(np.int32),
         "1d": np.array([2, t], np.int32), "1d2b": np.array([3, 2, 1, 0], np.int32),
         "3d": (R.random((b, s, t)) < 0.7).astype(np.int32),
         "4d": (R.random((b, 1, p + s + 1, t + 1)) < 0.7).astype(np.int32)}[mask]
    if m is not None:
        feeds["m"] = m
        names.append("m")
    else:
        names.append("")
    if layout == "separate" and mask is None:
        feeds["ab"] = rand((1, n, s, t))
        names.append("ab")
    else:
        names.append("")
    if past:
        feeds["pk"], feeds["pv"] = rand((b, n, p, h)), rand((b, n, p, h))
        names += ["pk", "pv"]
    while names[-1] == "":
        names.pop()
    check_node("MultiHeadAttention", feeds, input_names=names, domain=MS,
               n_outputs=3 if past or layout == "projected" else 1, num_heads=n,
               unidirectional=int(causal),
               rtol=1e-5, atol=1e-5)


GQA = [
    # (s, past_len, total, seqlens, packed, rotary, pos_ids, attrs)
    (4, 0, 4, [3, 3], False, False, False, {}),
    (4, 0, 4, [3, 1], True, True, False, {}),
    (1, 6, 6, [4, 2], False, True, True, {}),
    (2, 5, 7, [6, 3], False, False, False, {"local_window_size": 2}),
    (3, 0, 3, [2, 2], False, False, False, {"softcap": 1.5}),
    (1, 4, 5, [4, 1], True, False, False, {"do_bias": 1}),
    (4, 0, 4, [3, 3], False, True, True, {"rotary_interleaved": 1}),
]


@pytest.mark.parametrize("s,past_len,total,seqlens,packed,rotary,pos_ids,attrs", GQA)
def test_group_query_attention(s, past_len, total, seqlens, packed, rotary, pos_ids, attrs):
    b, n, nk, h = 2, 4, 2, 8
    attrs = dict(attrs)
    do_bias = attrs.pop("do_bias", 0)
    feeds, names = {}, []
    if packed:
        feeds["q"] = rand((b, s, (n + 2 * nk) * h))
        names += ["q", "", ""]
    else:
        feeds["q"], feeds["k"], feeds["v"] = rand((b, s, n * h)), rand((b, s, nk * h)), \
            rand((b, s, nk * h))
        names += ["q", "k", "v"]
    if past_len:
        feeds["pk"], feeds["pv"] = rand((b, nk, past_len, h)), rand((b, nk, past_len, h))
        names += ["pk", "pv"]
    else:
        names += ["", ""]
    feeds["sl"] = np.array(seqlens, np.int32)
    feeds["tot"] = np.array([total], np.int32)
    names += ["sl", "tot"]
    if rotary:
        feeds["cos"], feeds["sin"] = rand((16, h // 2)), rand((16, h // 2))
        names += ["cos", "sin"]
        attrs["do_rotary"] = 1
        if pos_ids:
            feeds["pid"] = R.integers(0, 16, size=(b, s)).astype(np.int64)
            names.append("pid")
    if do_bias:
        while len(names) < 10:
            names.append("")
        feeds["ab"] = rand((b, 1, s, total))
        names.append("ab")
    check_node("GroupQueryAttention", feeds, input_names=names, domain=MS, n_outputs=3,
               num_heads=n, kv_num_heads=nk, rtol=1e-5, atol=1e-5, **attrs)
