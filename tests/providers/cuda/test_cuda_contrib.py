"""CUDA-provider torch kernels vs the numpy CPU provider: com.microsoft and onnxkiln ops."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import check_node  # noqa: E402

R = np.random.default_rng(3)
MS = "com.microsoft"


def rand(shape, dtype=np.float32, lo=-1.0, hi=1.0):
    return R.uniform(lo, hi, size=shape).astype(dtype)


@pytest.mark.parametrize("act,params", [("", []), ("Relu", []), ("LeakyRelu", [0.1]),
                                        ("Clip", [-0.5, 0.5]), ("HardSigmoid", [0.2, 0.5]),
                                        ("Sigmoid", []), ("Tanh", [])])
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv(act, params, with_z):
    feeds = {"x": rand((1, 2, 6, 6)), "w": rand((3, 2, 3, 3)), "b": rand((3,))}
    if with_z:
        feeds["z"] = rand((1, 3, 6, 6))
    attrs = {"activation_params": params} if params else {}
    if act:
        attrs["activation"] = act
    assert check_node("FusedConv", feeds, domain=MS, pads=[1, 1, 1, 1], rtol=1e-4, atol=1e-5,
               **attrs)


@pytest.mark.parametrize("act,attrs", [
    ("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2}), ("Tanh", {}), ("Sigmoid", {}),
    ("Elu", {"activation_alpha": 0.5}), ("HardSigmoid", {"activation_alpha": 0.2,
                                                          "activation_beta": 0.5}),
    ("ScaledTanh", {"activation_alpha": 0.7, "activation_beta": 1.1}), ("Softsign", {}),
    ("Softplus", {}), ("ThresholdedRelu", {"activation_alpha": 0.1}),
    ("ParametricSoftplus", {"activation_alpha": 0.7, "activation_beta": 1.1}),
    ("Selu", {"activation_alpha": 1.6, "activation_gamma": 1.05})])
def test_fused_gemm(act, attrs):
    assert check_node("FusedGemm", {"a": rand((3, 4)), "b": rand((5, 4)), "c": rand((5,))},
               domain=MS, activation=act, transB=1, alpha=0.9, **attrs)


@pytest.mark.parametrize("attrs,sa,sb", [
    ({}, (2, 3, 4), (4, 5)), ({"transA": 1, "alpha": 0.5}, (2, 4, 3), (4, 5)),
    ({"transB": 1}, (3, 4), (2, 5, 4)), ({"transBatchA": 1}, (3, 2, 4), (2, 4, 5)),
    ({"transBatchB": 1, "transB": 1}, (2, 3, 4), (5, 2, 4))])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_fused_matmul(attrs, sa, sb, dtype):
    tol = 5e-3 if dtype == np.float16 else None
    assert check_node("FusedMatMul", {"a": rand(sa, dtype), "b": rand(sb, dtype)}, domain=MS,
               rtol=tol, atol=tol, **attrs)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gelus(dtype):
    x, bias = rand((2, 3, 8), dtype, -3, 3), rand((8,), dtype)
    assert check_node("Gelu", {"x": x}, domain=MS)
    assert check_node("BiasGelu", {"x": x, "b": bias}, domain=MS)
    assert check_node("FastGelu", {"x": x}, domain=MS)
    assert check_node("FastGelu", {"x": x, "b": bias}, domain=MS)
    assert check_node("QuickGelu", {"x": x}, domain=MS, alpha=1.5)
    assert check_node("BiasSplitGelu", {"x": x, "b": bias}, domain=MS)
    assert check_node("BiasAdd", {"x": x, "b": bias, "s": rand((2, 3, 8), dtype)}, domain=MS)


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize("skip_shape", [(2, 3, 8), (3, 8)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_layer_norm(op, skip_shape, with_bias, dtype):
    d = 8
    feeds = {"x": rand((2, 3, d), dtype), "s": rand(skip_shape, dtype), "g": rand((d,), dtype)}
    names = ["x", "s", "g"]
    if op == "SkipLayerNormalization":
        feeds["beta"] = rand((d,), dtype)
        names.append("beta")
    if with_bias:
        feeds["bias"] = rand((d,), dtype)
        names.append("bias")
    assert check_node(op, feeds, domain=MS, input_names=names, n_outputs=4, epsilon=1e-5)


def test_simplified_layer_norm_ms_domain():
    assert check_node("SimplifiedLayerNormalization", {"x": rand((2, 3, 8)), "s": rand((8,))},
               domain=MS, n_outputs=2)


@pytest.mark.parametrize("act", ["", "Relu", "Gelu", "FastGelu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_fused_matmul_bias(act, dtype):
    tol = 5e-3 if dtype == np.float16 else None
    assert check_node("FusedMatMulBias", {"a": rand((2, 3, 4), dtype)}, domain="onnxkiln",
               initializers={"b": rand((4, 5), dtype), "c": rand((5,), dtype)},
               activation=act, rtol=tol, atol=tol)


SDPA = [
    ({}, None),
    ({"scale": 8.0, "divide": 1}, "add"),
    ({"transpose_k": 0, "scale": 0.3}, None),
    ({"mask_mode": "keep_true", "mask_fill": float(np.finfo(np.float32).min)}, "bool"),
    ({"mask_mode": "keep_false", "mask_fill": -10000.0}, "bool"),
    ({"mask_mode": "keep_true", "mask_fill": -10000.0}, "bool_bcast"),
]


@pytest.mark.parametrize("attrs,mask", SDPA)
def test_scaled_dot_product_attention(attrs, mask):
    b, h, s, t, d = 2, 3, 4, 5, 8
    q, k, v = rand((b, h, s, d)), rand((b, h, t, d)), rand((b, h, t, d))
    if attrs.get("transpose_k", 1) == 0:
        k = np.ascontiguousarray(k.swapaxes(-1, -2))
    feeds = {"q": q, "k": k, "v": v}
    if mask == "add":
        feeds["m"] = rand((b, 1, s, t), lo=-5, hi=0)
    elif mask == "bool":
        m = R.random((b, 1, s, t)) < 0.7
        m[0, 0, 0] = False  # a fully masked row
        feeds["m"] = m
    elif mask == "bool_bcast":
        feeds["m"] = R.random((s, t)) < 0.7
    assert check_node("ScaledDotProductAttention", feeds, domain="onnxkiln", rtol=1e-5, atol=1e-6,
               **attrs)


def test_scaled_dot_product_attention_broadcast_batch():
    q, k, v = rand((2, 3, 4, 8)), rand((1, 3, 5, 8)), rand((1, 3, 5, 8))
    assert check_node("ScaledDotProductAttention", {"q": q, "k": k, "v": v}, domain="onnxkiln")


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    per = 8 // bits
    q = q.reshape(*q.shape[:-1], -1, per).astype(np.uint8)
    out = np.zeros(q.shape[:-1], np.uint8)
    for j in range(per):
        out |= q[..., j] << (bits * j)
    return out


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("const", [True, False])
def test_matmul_nbits(bits, zp, const):
    k, n, block = 40, 6, 16
    nb = -(-k // block)
    q = R.integers(0, 1 << bits, size=(n, nb * block))
    b = _pack(q, bits).reshape(n, nb, block * bits // 8)
    scales = rand((n * nb,), lo=0.01, hi=0.1)
    weights = {"b": b, "s": scales}
    names = ["a", "b", "s"]
    if zp:
        z = R.integers(0, 1 << bits, size=(n, nb))
        per_row = -(-nb * bits // 8)
        zz = np.zeros((n, per_row * (8 // bits)), np.int64)
        zz[:, :nb] = z
        weights["z"] = _pack(zz, bits).reshape(n, per_row)
        names.append("z")
    a = rand((2, 3, k))
    feeds = {"a": a}
    inits = weights
    if not const:
        feeds.update(weights)
        inits = {}
    assert check_node("MatMulNBits", feeds, initializers=inits, input_names=names, domain=MS,
               K=k, N=n, bits=bits, block_size=block, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act,params", [("Relu", []), ("Clip", [0.0, 6.0]), ("HardSwish", []),
                                        ("Silu", []), ("HardSigmoid", [0.2, 0.5])])
def test_onnxkiln_fused_conv(act, params):
    # the optimizer's Conv -> activation node: without a torch kernel every conv of a CNN
    # placed on the device fell back to the CPU with two copies
    feeds = {"x": rand((2, 3, 7, 7)), "w": rand((4, 3, 3, 3)), "b": rand((4,))}
    attrs = {"activation": act, **({"activation_params": params} if params else {})}
    assert check_node("FusedConv", feeds, domain="onnxkiln", pads=[1, 1, 1, 1],
                      strides=[2, 2], rtol=1e-4, atol=1e-5, **attrs)
