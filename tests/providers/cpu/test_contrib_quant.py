"""com.microsoft quantized and fused kernels (contrib_quant.py, contrib_qlinear.py,
contrib_fused.py) against onnxruntime's CPU provider, or numpy where onnxruntime lacks a case.

Notes on onnxruntime behaviour the tests steer around (see each test):
- MLAS's u8s8 GEMM on AVX2 machines without VNNI adds pairs of uint8 * int8 products in
  saturating int16, so DynamicQuantizeMatMul / MatMulIntegerToFloat with int8 B are compared
  on |B| <= 63, where no pair can saturate.
- MatMulNBits with g_idx ignores uint8 zero points in onnxruntime 1.32 (uses 2^(bits-1));
  that case is checked against numpy.
- QLinearSigmoid/QLinearConcat with an omitted zero point crash onnxruntime; numpy there.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import onnx
import pytest
import scipy.special
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.errors import KernelError
from onnxkiln.testing import assert_matches_ort, make_model, node_model, run_ort, tensor_info

MS = "com.microsoft"
RNG = np.random.default_rng(1234)
F32 = np.float32


def model(op, feeds, inits=None, names=None, **attrs):
    return node_model(op, feeds, initializers=inits or {}, domain=MS, input_names=names, **attrs)


def ours(m, feeds):
    return InferenceSession.builder().from_graph(m).run(dict(feeds))


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Values in [0, 2^bits) packed 8 // bits to a byte along the last axis, low bits first."""
    if bits == 8:
        return q.astype(np.uint8)
    per = 8 // bits
    pad = (-q.shape[-1]) % per
    q = np.concatenate([q, np.zeros((*q.shape[:-1], pad), q.dtype)], -1).astype(np.uint16)
    q = q.reshape(*q.shape[:-1], -1, per)
    out = np.zeros(q.shape[:-1], np.uint16)
    for i in range(per):
        out |= q[..., i] << (bits * i)
    return out.astype(np.uint8)


# ---------------------------------------------------------------------------------- MatMulNBits


def nbits_case(k, n, bits, block, zp_kind, dtype=F32, a_shape=(3,), bias=False, g_idx=None):
    nb = -(-k // block)
    q = RNG.integers(0, 2**bits, (n, nb, block))
    b = pack(q, bits)
    scales = RNG.uniform(0.01, 0.2, (n, nb)).astype(dtype)
    inits = {"B": b, "scales": scales}
    names = ["A", "B", "scales"]
    zf = np.full((n, nb), 2.0 ** (bits - 1), F32)
    if zp_kind == "packed":
        zq = RNG.integers(0, 2**bits, (n, nb))
        inits["zp"] = pack(zq, bits)
        zf = zq.astype(F32)
    elif zp_kind == "float":
        zf = RNG.uniform(0, 2**bits - 1, (n, nb)).astype(dtype)
        inits["zp"] = zf
        zf = zf.astype(F32)
    names.append("zp" if zp_kind else "")
    if g_idx is not None:
        inits["g"] = g_idx.astype(np.int32)
    names.append("g" if g_idx is not None else "")
    bv = None
    if bias:
        bv = RNG.standard_normal(n).astype(dtype)
        inits["bias"] = bv
    names.append("bias" if bias else "")
    while names[-1] == "":
        names.pop()
    a = RNG.standard_normal((*a_shape, k)).astype(dtype)
    # numpy reference
    if g_idx is None:
        w = ((q - zf[:, :, None]) * scales.astype(F32)[:, :, None]).reshape(n, -1)[:, :k]
    else:
        w = (q.reshape(n, -1)[:, :k] - zf[:, g_idx]) * scales.astype(F32)[:, g_idx]
    ref = a.astype(F32) @ w.T.astype(F32)
    if bv is not None:
        ref = ref + bv.astype(F32)
    return {"A": a}, inits, names, ref.astype(dtype)


NBITS_GRID = [
    (bits, block, k, zp)
    for bits in (2, 4, 8)
    for block, k in ((16, 64), (32, 100), (64, 64), (128, 300), (256, 256))
    for zp in (None, "packed", "float")
    if not (bits == 8 and zp == "float")  # onnxruntime CPU refuses 8-bit float zero points
]


@pytest.mark.parametrize("bits,block,k,zp", NBITS_GRID)
def test_matmul_nbits_float32(bits, block, k, zp):
    feeds, inits, names, _ = nbits_case(k, 12, bits, block, zp, bias=block == 32)
    m = model("MatMulNBits", feeds, inits, names, K=k, N=12, bits=bits, block_size=block)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("bits,zp", [(4, None), (4, "packed"), (4, "float"), (8, "packed"),
                                     (2, "float")])
@pytest.mark.parametrize("acc", [0, 1, 2, 4])
def test_matmul_nbits_float16(bits, zp, acc):
    feeds, inits, names, ref = nbits_case(96, 10, bits, 32, zp, dtype=np.float16, bias=True,
                                          a_shape=(2, 3))
    m = model("MatMulNBits", feeds, inits, names, K=96, N=10, bits=bits, block_size=32,
              accuracy_level=acc)
    # onnxruntime multiplies float16 in float16 (and A in int8 blocks for level 4)
    big = float(np.abs(ref.astype(F32)).max())
    assert_matches_ort(m, feeds, rtol=2e-2, atol=0.03 * big if acc == 4 else 3e-2)


@pytest.mark.parametrize("acc", [1, 2, 3, 4])
def test_matmul_nbits_accuracy_level(acc):
    feeds, inits, names, ref = nbits_case(128, 16, 4, 32, "packed", a_shape=(5,))
    m = model("MatMulNBits", feeds, inits, names, K=128, N=16, bits=4, block_size=32,
              accuracy_level=acc)
    got = ours(m, feeds)[0]
    if acc != 4:  # levels 1-3 are float32 on the CPU
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
    # level 4 quantizes A to int8 per block as onnxruntime does (test_matmulnbits.py)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("a_shape", [(), (1,), (2, 3), (2, 1, 4)])
def test_matmul_nbits_ranks_and_runtime_weights(a_shape):
    feeds, inits, names, _ = nbits_case(64, 8, 4, 16, "packed", a_shape=a_shape, bias=True)
    m = model("MatMulNBits", feeds, inits, names, K=64, N=8, bits=4, block_size=16)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-4)
    # B, scales and zero points as graph inputs: dequantized on every run
    feeds2 = {**feeds, "B": inits.pop("B"), "scales": inits.pop("scales"), "zp": inits.pop("zp")}
    m2 = model("MatMulNBits", feeds2, inits, names, K=64, N=8, bits=4, block_size=16)
    assert_matches_ort(m2, feeds2, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("zp", [None, "float", "packed"])
def test_matmul_nbits_g_idx(zp):
    k, block = 64, 16
    g = RNG.permutation(np.arange(k) // block)
    feeds, inits, names, ref = nbits_case(k, 8, 4, block, zp, g_idx=g)
    m = model("MatMulNBits", feeds, inits, names, K=k, N=8, bits=4, block_size=block)
    np.testing.assert_allclose(ours(m, feeds)[0], ref, rtol=1e-5, atol=1e-4)
    if zp != "packed":  # onnxruntime drops uint8 zero points when g_idx is given
        assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-4)
    # the trivial g_idx (k // block) changes nothing
    feeds, inits, names, ref = nbits_case(k, 8, 4, block, zp, g_idx=np.arange(k) // block)
    m = model("MatMulNBits", feeds, inits, names, K=k, N=8, bits=4, block_size=block)
    np.testing.assert_allclose(ours(m, feeds)[0], ref, rtol=1e-5, atol=1e-4)


def test_matmul_nbits_reference_only_cases():
    """8-bit float zero points and bfloat16 A (onnxruntime's CPU provider has neither)."""
    feeds, inits, names, ref = nbits_case(64, 6, 8, 32, "float")
    m = model("MatMulNBits", feeds, inits, names, K=64, N=6, bits=8, block_size=32)
    np.testing.assert_allclose(ours(m, feeds)[0], ref, rtol=1e-5, atol=1e-4)
    feeds, inits, names, ref = nbits_case(64, 6, 4, 32, "packed", dtype=F32)
    a16 = feeds["A"].astype(ml_dtypes.bfloat16)
    inits["scales"] = inits["scales"].astype(ml_dtypes.bfloat16)
    m = model("MatMulNBits", {"A": a16}, inits, names, K=64, N=6, bits=4, block_size=32)
    got = ours(m, {"A": a16})[0]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(F32), ref, rtol=3e-2, atol=0.1)


def test_matmul_nbits_empty_weight_and_cache():
    a = RNG.standard_normal((2, 64)).astype(F32)
    bias = RNG.standard_normal(8).astype(F32)
    inits = {"B": np.zeros((8, 0, 8), np.uint8), "s": np.zeros((8, 0), F32), "bias": bias}
    m = model("MatMulNBits", {"A": a}, inits, ["A", "B", "s", "", "", "bias"], K=64, N=8, bits=4,
              block_size=16)
    assert_matches_ort(m, {"A": a})
    feeds, inits, names, ref = nbits_case(64, 8, 4, 16, "packed")
    sess = InferenceSession.builder().from_graph(
        model("MatMulNBits", feeds, inits, names, K=64, N=8, bits=4, block_size=16))
    for _ in range(2):  # the second run reuses the cached dequantized weight
        np.testing.assert_allclose(sess.run(feeds)[0], ref, rtol=1e-5, atol=1e-4)
    with pytest.raises(Exception, match="bits"):
        ours(model("MatMulNBits", feeds, inits, names, K=64, N=8, bits=3, block_size=16), feeds)


# ------------------------------------------------------------------------- GatherBlockQuantized


def gbq_ref(values, scales, zp, qax, block, gax, idx):
    d = values.shape[qax]
    s = np.broadcast_to(np.repeat(scales.astype(F32), block, axis=qax).take(range(d), axis=qax),
                        values.shape)
    z = 0 if zp is None else np.repeat(zp.astype(F32), block, axis=qax).take(range(d), axis=qax)
    deq = (values.astype(F32) - z) * s
    size = values.shape[gax]
    ok = (idx >= -size) & (idx < size)
    out = np.take(deq, np.where(ok, idx, 0), axis=gax)
    mask = ok.reshape((1,) * gax + ok.shape + (1,) * (values.ndim - gax - 1))
    return np.where(mask, out, 0).astype(scales.dtype)


GBQ_GRID = [
    # (data shape, gather_axis, quantize_axis, block, index shape)
    ((6, 64), 0, 1, 16, (2, 3)),
    ((6, 40), 0, -1, 16, (4,)),
    ((32, 5), 1, 0, 16, (3,)),
    ((3, 4, 40), 1, 2, 32, (2,)),
    ((3, 4, 40), 2, 2, 16, (2, 2)),
    ((4, 128), 0, 1, 128, ()),
]


@pytest.mark.parametrize("shape,gax,qax,block,ishape", GBQ_GRID)
@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
@pytest.mark.parametrize("with_zp", [False, True])
def test_gather_block_quantized_int4(shape, gax, qax, block, ishape, dtype, with_zp):
    lo, hi = (-8, 8) if dtype == ml_dtypes.int4 else (0, 16)
    data = RNG.integers(lo, hi, shape).astype(dtype)
    q = qax % len(shape)
    sshape = tuple(-(-d // block) if i == q else d for i, d in enumerate(shape))
    scales = RNG.uniform(0.1, 1, sshape).astype(F32)
    size = shape[gax % len(shape)]
    idx = RNG.integers(-size, size, ishape).astype(np.int64)
    inits = {"data": data, "scales": scales}
    names = ["data", "idx", "scales"]
    if with_zp:
        inits["zp"] = RNG.integers(lo, hi, sshape).astype(dtype)
        names.append("zp")
    m = model("GatherBlockQuantized", {"idx": idx}, inits, names, gather_axis=gax,
              quantize_axis=qax, block_size=block)
    got = assert_matches_ort(m, {"idx": idx}, rtol=1e-6, atol=1e-6)[0]
    ref = gbq_ref(data, scales, inits.get("zp"), q, block, gax % len(shape), idx)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("k,block", [(64, 16), (40, 16), (256, 128)])
@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("sdtype", [F32, np.float16])
def test_gather_block_quantized_uint8(bits, k, block, with_zp, sdtype):
    rows = 5
    q = RNG.integers(0, 2**bits, (rows, k))
    nb = -(-k // block)
    scales = RNG.uniform(0.01, 0.1, (rows, nb)).astype(sdtype)
    inits = {"data": pack(q, bits), "scales": scales}
    names = ["data", "idx", "scales"]
    if with_zp:
        inits["zp"] = pack(RNG.integers(0, 2**bits, (rows, nb)), bits)
        names.append("zp")
    idx = np.array([[3, 1], [0, -1], [9, -6]], np.int32)  # 9 and -6 are out of range: zeros
    m = model("GatherBlockQuantized", {"idx": idx}, inits, names, bits=bits, block_size=block)
    got = assert_matches_ort(m, {"idx": idx}, rtol=1e-3 if sdtype == np.float16 else 1e-5,
                             atol=1e-4)[0]
    assert not got[2].any()


FP8 = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
       ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn]


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("block,sshape", [(16, (5, 4)), (0, (5, 1)), (16, (1, 4)), (0, (1, 1)),
                                          (32, (5, 2))])
def test_gather_block_quantized_float8(dtype, block, sshape):
    data = (RNG.standard_normal((5, 64)) * 3).astype(dtype)
    scales = RNG.uniform(0.1, 1, sshape).astype(F32)
    idx = np.array([[3, 1], [0, -1]], np.int64)
    m = model("GatherBlockQuantized", {"idx": idx}, {"data": data, "scales": scales},
              ["data", "idx", "scales"], block_size=block)
    got = assert_matches_ort(m, {"idx": idx}, rtol=0, atol=0)[0]
    b = 64 if block == 0 else block
    full = np.broadcast_to(np.repeat(scales, b, 1), (5, 64))
    np.testing.assert_array_equal(got, (data.astype(F32) * full)[idx])


def test_gather_block_quantized_float8_gather_axis_1():
    data = (RNG.standard_normal((32, 6)) * 3).astype(ml_dtypes.float8_e4m3fn)
    for sshape in ((2, 6), (2, 1)):
        scales = RNG.uniform(0.1, 1, sshape).astype(np.float16)
        idx = np.array([1, 4], np.int64)
        m = model("GatherBlockQuantized", {"idx": idx}, {"data": data, "scales": scales},
                  ["data", "idx", "scales"], block_size=16, quantize_axis=0, gather_axis=1)
        assert_matches_ort(m, {"idx": idx}, rtol=1e-3, atol=1e-3)


def test_gather_block_quantized_uint8_any_quantize_axis():
    """8-bit uint8 data quantized along axis 0 (onnxruntime's CPU kernel wants the last axis)."""
    data = RNG.integers(0, 256, (32, 6)).astype(np.uint8)
    scales = RNG.uniform(0.1, 1, (2, 6)).astype(F32)
    zp = RNG.integers(0, 256, (2, 6)).astype(np.uint8)
    idx = np.array([[31, 0], [-32, 40]], np.int64)
    m = model("GatherBlockQuantized", {"idx": idx}, {"data": data, "scales": scales, "zp": zp},
              ["data", "idx", "scales", "zp"], bits=8, block_size=16, quantize_axis=0)
    ref = gbq_ref(data, scales, zp, 0, 16, 0, idx)
    np.testing.assert_allclose(ours(m, {"idx": idx})[0], ref, rtol=1e-6, atol=1e-5)


def test_gather_block_quantized_bfloat16_and_errors():
    data = RNG.integers(-8, 8, (4, 32)).astype(ml_dtypes.int4)
    scales = RNG.uniform(0.1, 1, (4, 2)).astype(ml_dtypes.bfloat16)
    idx = np.array([2, 0], np.int64)
    m = model("GatherBlockQuantized", {"idx": idx}, {"data": data, "scales": scales},
              ["data", "idx", "scales"], block_size=16)
    got = ours(m, {"idx": idx})[0]
    ref = (data.astype(F32) * np.repeat(scales.astype(F32), 16, 1))[idx]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(F32), ref, rtol=1e-2)
    bad = model("GatherBlockQuantized", {"idx": idx}, {"data": pack(np.zeros((4, 32), int), 4),
                                                      "scales": np.ones((4, 2), F32)},
                ["data", "idx", "scales"], block_size=16, gather_axis=1, quantize_axis=0)
    with pytest.raises(Exception, match="gather_axis"):
        ours(bad, {"idx": idx})


# ---------------------------------------------------------------------------------- FusedMatMul


def orient(x, t, tb):
    if tb:
        x = np.moveaxis(x, 0, -2)
    return np.swapaxes(x, -1, -2) if t and x.ndim >= 2 else x


FMM_SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
              ((2, 3, 4, 5), (3, 2, 5, 6)), ((2, 1, 3, 4), (1, 5, 4, 6)), ((4,), (4,))]


@pytest.mark.parametrize("sa,sb", FMM_SHAPES)
@pytest.mark.parametrize("dtype", [F32, np.float64])
def test_fused_matmul(sa, sb, dtype):
    for ta, tb, tba, tbb in itertools.product((0, 1), repeat=4):
        if (tba or tbb) and not (len(sa) == len(sb) >= 3):
            continue  # onnxruntime needs equal ranks >= 3 for transBatch
        a = RNG.standard_normal(sa).astype(dtype)
        b = RNG.standard_normal(sb).astype(dtype)
        try:
            np.matmul(orient(a, ta, tba), orient(b, tb, tbb))
        except ValueError:
            continue
        m = model("FusedMatMul", {"A": a, "B": b}, alpha=0.75, transA=ta, transB=tb,
                  transBatchA=tba, transBatchB=tbb)
        assert_matches_ort(m, {"A": a, "B": b}, rtol=1e-5, atol=1e-5)


def test_fused_matmul_const_b_and_low_precision():
    a = RNG.standard_normal((3, 2, 4)).astype(F32)
    b = RNG.standard_normal((2, 5, 4)).astype(F32)
    for sa, sb, tba, tbb in (((3, 2, 4), (2, 5, 4), 1, 0), ((2, 3, 4), (2, 5, 4), 0, 0),
                             ((2, 3, 4), (5, 2, 4), 0, 1)):
        aa, bb = RNG.standard_normal(sa).astype(F32), RNG.standard_normal(sb).astype(F32)
        m = model("FusedMatMul", {"A": aa}, {"B": bb}, ["A", "B"], transB=1, alpha=2.0,
                  transBatchA=tba, transBatchB=tbb)
        assert_matches_ort(m, {"A": aa}, rtol=1e-5, atol=1e-5)
    for dt in (np.float16, ml_dtypes.bfloat16):
        a16, b16 = a.astype(dt), b.astype(dt)
        m = model("FusedMatMul", {"A": a16, "B": b16}, transB=1, alpha=2.0, transBatchA=1)
        got = ours(m, {"A": a16, "B": b16})[0]
        ref = 2.0 * np.matmul(np.moveaxis(a16.astype(F32), 0, -2),
                              np.swapaxes(b16.astype(F32), -1, -2))
        assert got.dtype == dt
        np.testing.assert_allclose(got.astype(F32), ref, rtol=2e-2, atol=5e-2)


# ---------------------------------------------------------------------- FusedConv, FusedGemm

CONV_ACTS = [("", []), ("Relu", []), ("Tanh", []), ("Sigmoid", []), ("LeakyRelu", [0.3]),
             ("Clip", [-0.5, 0.7]), ("HardSigmoid", [0.3, 0.4])]


@pytest.mark.parametrize("act,params", CONV_ACTS)
@pytest.mark.parametrize("with_b,with_z", [(True, False), (True, True), (False, True),
                                           (False, False)])
def test_fused_conv_2d(act, params, with_b, with_z):
    x = RNG.standard_normal((2, 4, 7, 6)).astype(F32)
    w = RNG.standard_normal((6, 2, 3, 3)).astype(F32)
    attrs = {"group": 2, "pads": [1, 0, 1, 2], "strides": [2, 1]}
    if act:
        attrs["activation"] = act
    if params:
        attrs["activation_params"] = params
    out_shape = (2, 6, 4, 6)
    inits = {"W": w}
    feeds = {"X": x}
    names = ["X", "W", "", ""]
    if with_b:
        inits["B"] = RNG.standard_normal(6).astype(F32)
        names[2] = "B"
    if with_z:
        feeds["Z"] = RNG.standard_normal(out_shape).astype(F32)
        names[3] = "Z"
    while names[-1] == "":
        names.pop()
    m = model("FusedConv", feeds, inits, names, **attrs)
    got = assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-5)[0]
    assert got.shape == out_shape


@pytest.mark.parametrize("shape,wshape,attrs", [
    ((2, 4, 9), (6, 2, 3), {"group": 2, "strides": [2], "pads": [1, 1]}),
    ((1, 2, 5, 5, 5), (3, 2, 2, 2, 2), {"dilations": [2, 1, 1]}),
    ((1, 3, 8, 8), (3, 1, 3, 3), {"group": 3, "auto_pad": "SAME_UPPER"}),
    ((1, 8, 5, 5), (4, 8, 1, 1), {}),
])
def test_fused_conv_shapes(shape, wshape, attrs):
    x = RNG.standard_normal(shape).astype(F32)
    w = RNG.standard_normal(wshape).astype(F32)
    m = model("FusedConv", {"X": x, "W": w}, activation="Relu", **attrs)
    assert_matches_ort(m, {"X": x, "W": w}, rtol=1e-5, atol=1e-5)
    m = model("FusedConv", {"X": x}, {"W": w}, ["X", "W"], activation="LeakyRelu",
              activation_params=[0.1], **attrs)
    assert_matches_ort(m, {"X": x}, rtol=1e-5, atol=1e-5)


def test_fused_conv_float16_and_errors():
    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float16)
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float16)
    m = model("FusedConv", {"X": x, "W": w}, activation="Sigmoid")
    got = ours(m, {"X": x, "W": w})[0]
    conv = node_model("Conv", {"X": x.astype(F32), "W": w.astype(F32)})
    ref = scipy.special.expit(ours(conv, {"X": x.astype(F32), "W": w.astype(F32)})[0])
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(F32), ref, rtol=1e-2, atol=1e-2)
    for act, params in (("LeakyRelu", []), ("Elu", [1.0]), ("Clip", [0.0])):
        with pytest.raises(Exception, match="activation"):
            ours(model("FusedConv", {"X": x, "W": w}, activation=act, activation_params=params),
                 {"X": x, "W": w})


GEMM_ACTS = [
    ("Relu", {}), ("Tanh", {}), ("Sigmoid", {}), ("Softsign", {}), ("Softplus", {}),
    ("LeakyRelu", {"activation_alpha": 0.2}), ("Elu", {"activation_alpha": 0.7}),
    ("ThresholdedRelu", {"activation_alpha": 0.5}),
    ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4}),
    ("ScaledTanh", {"activation_alpha": 2.0, "activation_beta": 0.5}),
    ("ParametricSoftplus", {"activation_alpha": 2.0, "activation_beta": 0.5}),
    ("Selu", {"activation_alpha": 1.5, "activation_gamma": 2.0}),
]


@pytest.mark.parametrize("act,kw", GEMM_ACTS)
@pytest.mark.parametrize("ta,tb,cshape", [(0, 0, (4,)), (1, 0, (3, 4)), (0, 1, (3, 1)),
                                          (1, 1, ()), (0, 0, None)])
def test_fused_gemm(act, kw, ta, tb, cshape):
    a = RNG.standard_normal((5, 3) if ta else (3, 5)).astype(F32)
    b = RNG.standard_normal((4, 5) if tb else (5, 4)).astype(F32)
    feeds, inits, names = {"A": a}, {"B": b}, ["A", "B"]
    if cshape is not None:
        feeds["C"] = RNG.standard_normal(cshape).astype(F32)
        names.append("C")
    attrs = dict(kw, alpha=0.5, beta=2.0, transA=ta, transB=tb)
    if act:
        attrs["activation"] = act
    m = model("FusedGemm", feeds, inits, names, **attrs)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-5)


def test_fused_gemm_no_activation_and_missing_parameter():
    """No activation is a plain Gemm here (onnxruntime refuses a FusedGemm without one)."""
    a = RNG.standard_normal((3, 5)).astype(F32)
    b = RNG.standard_normal((4, 5)).astype(F32)
    c = RNG.standard_normal((4,)).astype(F32)
    m = model("FusedGemm", {"A": a, "B": b, "C": c}, alpha=0.5, beta=2.0, transB=1)
    np.testing.assert_allclose(ours(m, {"A": a, "B": b, "C": c})[0], 0.5 * a @ b.T + 2 * c,
                               rtol=1e-5, atol=1e-5)
    a = np.ones((2, 2), F32)
    with pytest.raises(Exception, match="alpha"):
        ours(model("FusedGemm", {"A": a, "B": a}, activation="LeakyRelu"), {"A": a, "B": a})


# ------------------------------------------------ DynamicQuantizeMatMul, MatMulIntegerToFloat


def int_b(dtype, shape):
    if dtype == np.uint8:
        return RNG.integers(0, 256, shape).astype(np.uint8)
    return RNG.integers(-63, 64, shape).astype(np.int8)  # see the module docstring


def int_zp(dtype, shape):
    lo, hi = (100, 156) if dtype == np.uint8 else (-10, 10)
    return RNG.integers(lo, hi, shape).astype(dtype)


DQMM_GRID = [
    # (A shape, B shape, b_scale shape, b_zero_point shape or None, bias)
    ((3, 8), (8, 5), (), (), False),
    ((3, 8), (8, 5), (5,), (5,), True),
    ((2, 3, 8), (8, 5), (5,), None, True),
    ((2, 3, 8), (2, 8, 5), (2, 1, 5), (2, 1, 5), False),
    ((2, 3, 8), (2, 8, 5), (), (), False),
    ((4, 300), (300, 7), (1,), (1,), True),
    ((8,), (8, 5), (), None, False),
]


@pytest.mark.parametrize("sa,sb,sss,szs,bias", DQMM_GRID)
@pytest.mark.parametrize("bdt", [np.uint8, np.int8])
@pytest.mark.parametrize("b_const", [True, False])
def test_dynamic_quantize_matmul(sa, sb, sss, szs, bias, bdt, b_const):
    a = (RNG.standard_normal(sa) * 3).astype(F32)
    b = int_b(bdt, sb)
    inits = {"bs": RNG.uniform(0.01, 0.1, sss).astype(F32)}
    feeds = {"A": a}
    (inits if b_const else feeds)["B"] = b
    names = ["A", "B", "bs", ""]
    if szs is not None:
        inits["bz"] = int_zp(bdt, szs)
        names[3] = "bz"
    if bias:
        inits["bias"] = RNG.standard_normal(sb[-1]).astype(F32)
        names.append("bias")
    while names[-1] == "":
        names.pop()
    m = model("DynamicQuantizeMatMul", feeds, inits, names)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-4)


MIF_GRID = [
    # (A shape, B shape, a_scale, b_scale, a_zp, b_zp, bias)
    ((3, 8), (8, 5), (), (), (), (), False),
    ((3, 8), (8, 5), (1,), (5,), (1,), (5,), True),
    ((2, 3, 8), (8, 5), (), (5,), None, None, True),
    ((2, 3, 8), (2, 8, 5), (), (2, 1, 5), (), (2, 1, 5), False),
    ((3, 8), (8, 5), (3, 1), (), None, None, False),
    ((8,), (8, 5), (), (), (), (), False),
    ((5, 600), (600, 4), (), (4,), (), (4,), True),
]


@pytest.mark.parametrize("sa,sb,sas,sbs,saz,sbz,bias", MIF_GRID)
@pytest.mark.parametrize("adt,bdt", [(np.uint8, np.uint8), (np.uint8, np.int8),
                                     (np.int8, np.int8)])
def test_matmul_integer_to_float(sa, sb, sas, sbs, saz, sbz, bias, adt, bdt):
    a = int_b(adt, sa) if adt == np.uint8 else RNG.integers(-128, 128, sa).astype(np.int8)
    inits = {"B": int_b(bdt, sb), "as": RNG.uniform(0.01, 0.1, sas).astype(F32),
             "bs": RNG.uniform(0.01, 0.1, sbs).astype(F32)}
    names = ["A", "B", "as", "bs", "", ""]
    if saz is not None:
        inits["az"] = int_zp(adt, saz)
        names[4] = "az"
    if sbz is not None:
        inits["bz"] = int_zp(bdt, sbz)
        names[5] = "bz"
    if bias:
        inits["bias"] = RNG.standard_normal(sb[-1]).astype(F32)
        names.append("bias")
    while names[-1] == "":
        names.pop()
    m = model("MatMulIntegerToFloat", {"A": a}, inits, names)
    assert_matches_ort(m, {"A": a}, rtol=1e-5, atol=1e-4)


def test_matmul_integer_to_float_float16_and_int8_uint8():
    a = RNG.integers(0, 256, (3, 8)).astype(np.uint8)
    b = RNG.integers(0, 256, (8, 5)).astype(np.uint8)
    az, bz = np.array(7, np.uint8), np.array(130, np.uint8)
    sa, sb = np.array(0.02, np.float16), np.full(5, 0.03, np.float16)
    m = model("MatMulIntegerToFloat", {"A": a}, {"B": b, "as": sa, "bs": sb, "az": az, "bz": bz},
              ["A", "B", "as", "bs", "az", "bz"])
    got = ours(m, {"A": a})[0]
    ref = (a.astype(np.float64) - 7) @ (b.astype(np.float64) - 130) * (F32(sa) * sb.astype(F32))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(F32), ref, rtol=1e-3, atol=1e-2)
    a8 = RNG.integers(-128, 128, (3, 8)).astype(np.int8)  # int8 A with uint8 B: no ORT kernel
    m = model("MatMulIntegerToFloat", {"A": a8}, {"B": b, "as": np.array(F32(0.5)),
                                                 "bs": np.array(F32(0.25))},
              ["A", "B", "as", "bs"])
    np.testing.assert_allclose(ours(m, {"A": a8})[0],
                               (a8.astype(np.float64) @ b.astype(np.float64)) * 0.125, rtol=1e-6)


# --------------------------------------------------------------------------- QLinear ops

QTYPES = [np.uint8, np.int8]


def qparams(dt, n):
    info = np.iinfo(dt)
    scales = RNG.uniform(0.002, 1.0, n).astype(F32)
    zps = RNG.integers(info.min, info.max + 1, n).astype(dt)
    return scales, zps


def all_values(dt):
    return np.arange(256, dtype=np.uint8).view(dt)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("sa,sb", [((256, 256), (256, 256)), ((256, 256), ()), ((), (256, 256)),
                                   ((256, 1, 256), (256,)), ((7, 1), (1, 9)), ((1,), (3,))])
def test_qlinear_binary(op, dt, sa, sb):
    vals = all_values(dt)
    a = np.repeat(vals, 256).reshape(256, 256) if sa == (256, 256) else (
        np.repeat(vals, 256).reshape(256, 1, 256) if sa == (256, 1, 256)
        else RNG.choice(vals, sa).astype(dt))
    b = np.tile(vals, 256).reshape(256, 256) if sb == (256, 256) else (
        vals.copy() if sb == (256,) else RNG.choice(vals, sb).astype(dt))
    for _ in range(3):
        s, z = qparams(dt, 3)
        inits = {"as": s[0], "az": z[0], "bs": s[1], "bz": z[1], "cs": s[2], "cz": z[2]}
        m = model(op, {"A": a, "B": b}, inits, ["A", "as", "az", "B", "bs", "bz", "cs", "cz"])
        assert_matches_ort(m, {"A": a, "B": b})  # bit exact


def test_qlinear_binary_default_zero_points():
    a = all_values(np.uint8)
    b = a[::-1].copy()
    inits = {"as": F32(0.05), "bs": F32(0.1), "cs": F32(0.2)}
    m = model("QLinearAdd", {"A": a, "B": b}, inits, ["A", "as", "", "B", "bs", "", "cs"])
    ref = np.clip(np.rint((a * 0.05 + b * 0.1) / 0.2), 0, 255)
    np.testing.assert_allclose(ours(m, {"A": a, "B": b})[0], ref, atol=1)


@pytest.mark.parametrize("dt", QTYPES)
def test_qlinear_sigmoid(dt):
    x = all_values(dt).reshape(4, 64)
    for _ in range(4):
        s, z = qparams(dt, 2)
        inits = {"xs": s[0] * 0.2, "xz": z[0], "ys": F32(1 / 256), "yz": z[1]}
        m = model("QLinearSigmoid", {"X": x}, inits, ["X", "xs", "xz", "ys", "yz"])
        assert_matches_ort(m, {"X": x})
    # omitted zero points (onnxruntime crashes on these): against numpy
    m = model("QLinearSigmoid", {"X": x}, {"xs": F32(0.05), "ys": F32(1 / 256)},
              ["X", "xs", "", "ys"])
    info = np.iinfo(dt)
    sig = scipy.special.expit(x.astype(F32) * F32(0.05)).astype(F32)
    ref = np.clip(np.rint(sig / F32(1 / 256)), info.min, info.max).astype(dt)
    np.testing.assert_array_equal(ours(m, {"X": x})[0], ref)


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("shape,channels_last", [
    ((2, 3, 5, 7), 0), ((2, 5, 7, 3), 1), ((1, 4, 9), 0), ((2, 9, 4), 1), ((1, 3, 2, 2, 2), 0),
    ((3, 1, 1, 8), 1), ((2, 16, 30, 30), 0), ((1, 30, 30, 16), 1),
])
def test_qlinear_global_average_pool(dt, shape, channels_last):
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max + 1, shape).astype(dt)
    for _ in range(3):
        s, z = qparams(dt, 2)
        inits = {"xs": s[0], "xz": z[0], "ys": s[1], "yz": z[1]}
        m = model("QLinearGlobalAveragePool", {"X": x}, inits, ["X", "xs", "xz", "ys", "yz"],
                  channels_last=channels_last)
        assert_matches_ort(m, {"X": x})


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_qlinear_concat(dt, axis):
    vals = all_values(dt)
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    feeds, inits = {}, {}
    ys, yz = qparams(dt, 1)
    names = ["ys", "yz"]
    inits["ys"], inits["yz"] = ys[0], yz[0]
    for i, shp in enumerate(shapes):
        shp = list(shp)
        shp[axis] += i  # differ along the concat axis
        feeds[f"x{i}"] = RNG.choice(vals, shp).astype(dt)
        s, z = qparams(dt, 1)
        if i == 2:  # same parameters as Y: a plain copy
            s, z = ys, yz
        inits[f"s{i}"], inits[f"z{i}"] = s[0], z[0]
        names += [f"x{i}", f"s{i}", f"z{i}"]
    m = model("QLinearConcat", feeds, inits, names, axis=axis)
    assert_matches_ort(m, feeds)


def test_qlinear_concat_exhaustive_and_single():
    for dt in QTYPES:
        x = all_values(dt).reshape(1, 256)
        for _ in range(5):
            s, z = qparams(dt, 3)
            inits = {"ys": s[0], "yz": z[0], "s0": s[1], "z0": z[1], "s1": s[2], "z1": z[2]}
            m = model("QLinearConcat", {"a": x, "b": x[:, ::-1].copy()}, inits,
                      ["ys", "yz", "a", "s0", "z0", "b", "s1", "z1"], axis=0)
            assert_matches_ort(m, {"a": x, "b": x[:, ::-1].copy()})
        m = model("QLinearConcat", {"a": x}, {"ys": s[0], "yz": z[0], "s0": s[1], "z0": z[1]},
                  ["ys", "yz", "a", "s0", "z0"], axis=1)
        assert_matches_ort(m, {"a": x})



@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("alpha", [0.01, 0.1, 0.3333, 2.0])
def test_qlinear_leaky_relu(dt, alpha):
    x = all_values(dt).reshape(4, 64)
    for _ in range(3):
        s, z = qparams(dt, 2)
        inits = {"xs": s[0], "xz": z[0], "ys": s[1], "yz": z[1]}
        m = model("QLinearLeakyRelu", {"X": x}, inits, ["X", "xs", "xz", "ys", "yz"],
                  alpha=alpha)
        assert_matches_ort(m, {"X": x})  # bit exact, saturated ends included
    m = model("QLinearLeakyRelu", {"X": x}, {"xs": F32(0.5), "ys": F32(0.25)}, ["X", "xs", "",
                                                                                "ys"])
    info = np.iinfo(dt)
    v = x.astype(F32) * F32(0.5)
    ref = np.clip(np.rint(np.where(v < 0, v * F32(0.01), v) / F32(0.25)), info.min, info.max)
    np.testing.assert_array_equal(ours(m, {"X": x})[0], ref.astype(dt))  # default alpha, zps 0


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("shape,attrs,channels_last", [
    ((1, 3, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}, 0),
    ((2, 4, 7, 9), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 0),
    ((2, 4, 7, 9), {"kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "count_include_pad": 1}, 0),
    ((2, 7, 9, 4), {"kernel_shape": [3, 2], "strides": [2, 1]}, 1),
    ((1, 2, 10), {"kernel_shape": [3], "strides": [2], "ceil_mode": 1}, 0),
    ((1, 2, 5, 5), {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}, 0),
    ((1, 2, 4, 4, 4), {"kernel_shape": [2, 2, 2]}, 0),
])
def test_qlinear_average_pool(dt, shape, attrs, channels_last):
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max + 1, shape).astype(dt)
    for _ in range(3):
        s, z = qparams(dt, 2)
        inits = {"xs": s[0], "xz": z[0], "ys": s[1], "yz": z[1]}
        m = model("QLinearAveragePool", {"X": x}, inits, ["X", "xs", "xz", "ys", "yz"],
                  channels_last=channels_last, **attrs)
        assert_matches_ort(m, {"X": x})  # bit exact


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("cshape,xshape,yshape", [((4, 5), (4, 5), (4, 5)),
                                                  ((4, 1), (1, 5), (4, 5)), ((), (3,), (2, 3))])
def test_qlinear_where(dt, cshape, xshape, yshape):
    info = np.iinfo(dt)
    feeds = {"c": np.asarray(RNG.random(cshape) < 0.5),
             "x": RNG.integers(info.min, info.max + 1, xshape).astype(dt),
             "y": RNG.integers(info.min, info.max + 1, yshape).astype(dt)}
    for same in (False, True):  # True: X already has Z's parameters (a plain copy)
        s, z = qparams(dt, 3)
        if same:
            s[0], z[0] = s[2], z[2]
        inits = {"xs": s[0], "xz": z[0], "ys": s[1], "yz": z[1], "zs": s[2], "zz": z[2]}
        m = model("QLinearWhere", feeds, inits,
                  ["c", "x", "xs", "xz", "y", "ys", "yz", "zs", "zz"])
        assert_matches_ort(m, feeds)
    bad = dict(feeds, y=feeds["y"][..., :1].repeat(2, -1) if yshape != (4, 5) else
               feeds["y"][:, :2].copy())
    m = model("QLinearWhere", bad, inits, ["c", "x", "xs", "xz", "y", "ys", "yz", "zs", "zz"])
    with pytest.raises(KernelError, match="do not broadcast"):
        ours(m, bad)

# ------------------------------------------------ com.microsoft QuantizeLinear/DequantizeLinear

QL_AXES = [(None, ()), (None, (1,)), (1, (3,)), (None, (3,)), (-1, (4,)), (0, (2,)), (2, (4,))]


@pytest.mark.parametrize("zdt", [np.uint8, np.int8, np.uint16, np.int16])
@pytest.mark.parametrize("axis,sshape", QL_AXES)
def test_ms_quantize_dequantize(zdt, axis, sshape):
    x = (RNG.standard_normal((2, 3, 4)) * 80).astype(F32)
    x.flat[:4] = [0.5, 1.5, -2.5, 1e9]  # ties and saturation
    s = RNG.uniform(0.5, 4, sshape).astype(F32)
    info = np.iinfo(zdt)
    z = RNG.integers(info.min // 2, info.max // 2 + 1, sshape).astype(zdt)
    kw = {} if axis is None else {"axis": axis}
    m = model("QuantizeLinear", {"x": x}, {"s": s, "z": z}, ["x", "s", "z"], **kw)
    y = assert_matches_ort(m, {"x": x})[0]
    assert y.dtype == zdt
    m = model("DequantizeLinear", {"y": y}, {"s": s, "z": z}, ["y", "s", "z"], **kw)
    assert_matches_ort(m, {"y": y})


@pytest.mark.parametrize("zdt", [ml_dtypes.int4, ml_dtypes.uint4])
@pytest.mark.parametrize("axis,sshape", [(None, ()), (1, (3,)), (0, (2,))])
def test_ms_quantize_dequantize_int4(zdt, axis, sshape):
    """onnxruntime's Python API returns no int4 arrays: Q -> DQ in one model, float out."""
    x = (RNG.standard_normal((2, 3, 4)) * 6).astype(F32)
    s = RNG.uniform(0.5, 2, sshape).astype(F32)
    z = np.ones(sshape, zdt)
    kw = {} if axis is None else {"axis": axis}
    q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=MS, **kw)
    d = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS, **kw)
    m = make_model([q, d], [tensor_info("x", F32, x.shape)], [tensor_info("y", F32, x.shape)],
                   initializers={"s": s, "z": z}, extra_opsets={MS: 1})
    assert_matches_ort(m, {"x": x})
    m = model("QuantizeLinear", {"x": x}, {"s": s, "z": z}, ["x", "s", "z"], **kw)
    got = ours(m, {"x": x})[0]
    assert got.dtype == zdt


def test_ms_dequantize_int32_and_defaults():
    x = np.arange(-5, 5, dtype=np.int32)
    m = model("DequantizeLinear", {"x": x}, {"s": np.array(F32(2)), "z": np.array(1, np.int32)},
              ["x", "s", "z"])
    assert_matches_ort(m, {"x": x})
    x8 = np.arange(-5, 5, dtype=np.int8)
    m = model("DequantizeLinear", {"x": x8}, {"s": np.array(F32(2))}, ["x", "s"])
    assert_matches_ort(m, {"x": x8})
    xf = np.array([0.5, 1.5, 2.5, -3, 700], F32)
    m = model("QuantizeLinear", {"x": xf}, {"s": np.array(F32(2))}, ["x", "s"])
    assert_matches_ort(m, {"x": xf})  # uint8 when the zero point is omitted
    x16 = (RNG.standard_normal((3, 4)) * 20).astype(np.float16)
    m = model("QuantizeLinear", {"x": x16}, {"s": np.array([0.5, 1, 2], np.float16),
                                            "z": np.array([-1, 0, 3], np.int8)},
              ["x", "s", "z"], axis=0)
    assert_matches_ort(m, {"x": x16})


# ------------------------------------------------------------------------------------ QGemm
# onnxruntime implements uint8 A with uint8/int8 B and int8 A with int8 B, Y of A's type or
# float; int8 B stays within |B| <= 63 (the MLAS note at the top).

QGEMM_TYPES = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]


def qgemm_case(adt, bdt, m, k, n, ta, tb, per_column, bias, quantized, alpha=1.0, a=None):
    ai = np.iinfo(adt)
    blo, bhi = (0, 255) if bdt == np.uint8 else (-63, 63)
    if a is None:
        a = RNG.integers(ai.min, ai.max + 1, (k, m) if ta else (m, k)).astype(adt)
    b = RNG.integers(blo, bhi + 1, (n, k) if tb else (k, n)).astype(bdt)
    bshape = (n,) if per_column else ()
    inits = {"as": F32(RNG.uniform(0.001, 0.1)),
             "az": np.array(RNG.integers(ai.min, ai.max + 1), adt), "B": b,
             "bs": RNG.uniform(0.001, 0.05, bshape).astype(F32),
             "bz": RNG.integers(blo, bhi + 1, bshape).astype(bdt)}
    names = ["A", "as", "az", "B", "bs", "bz"]
    if bias:
        inits["C"] = RNG.integers(-5000, 5000, bias).astype(np.int32)
    names.append("C" if bias else "")
    if quantized:
        inits["ys"], inits["yz"] = F32(RNG.uniform(0.01, 0.5)), np.array(3, adt)
        names += ["ys", "yz"]
    return model("QGemm", {"A": a}, inits, names, transA=int(ta), transB=int(tb),
                 alpha=alpha), {"A": a}


@pytest.mark.parametrize("adt,bdt", QGEMM_TYPES)
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("bias", [None, (6,), (5, 6), (1, 1)])
@pytest.mark.parametrize("quantized", [False, True])
def test_qgemm(adt, bdt, ta, tb, per_column, bias, quantized):
    for alpha in (1.0, 0.37):
        m, feeds = qgemm_case(adt, bdt, 5, 7, 6, ta, tb, per_column, bias, quantized, alpha)
        got = assert_matches_ort(m, feeds, rtol=0, atol=0)[0]  # bit exact
        assert got.dtype == (adt if quantized else F32)


@pytest.mark.parametrize("adt,bdt", QGEMM_TYPES)
def test_qgemm_saturates_and_long_k(adt, bdt):
    ai = np.iinfo(adt)
    a = np.full((4, 64), ai.max, adt)
    a[1], a[2, ::2] = ai.min, ai.min  # rows far above and below the output range
    m, feeds = qgemm_case(adt, bdt, 4, 64, 8, 0, 0, True, (8,), True, 3.0, a=a)
    y = assert_matches_ort(m, feeds, rtol=0, atol=0)[0]
    assert {ai.min, ai.max} <= set(np.unique(y).tolist())
    # K large enough that the sums leave float32's exact range: float64 accumulation
    m, feeds = qgemm_case(adt, bdt, 3, 1200, 5, 0, 1, False, (5,), True)
    assert_matches_ort(m, feeds, rtol=0, atol=0)
    m, feeds = qgemm_case(adt, bdt, 3, 1200, 5, 1, 0, True, None, False)
    assert_matches_ort(m, feeds, rtol=0, atol=0)


def test_qgemm_int8_a_uint8_b_and_errors():
    """int8 A with uint8 B has no onnxruntime kernel: against numpy."""
    a = RNG.integers(-128, 128, (3, 4)).astype(np.int8)
    b = RNG.integers(0, 256, (4, 2)).astype(np.uint8)
    inits = {"as": F32(0.5), "az": np.array(-3, np.int8), "B": b, "bs": F32(0.25),
             "bz": np.array(7, np.uint8)}
    m = model("QGemm", {"A": a}, inits, ["A", "as", "az", "B", "bs", "bz"], alpha=2.0)
    ref = (a.astype(np.int64) + 3) @ (b.astype(np.int64) - 7) * 0.25
    np.testing.assert_array_equal(ours(m, {"A": a})[0], ref.astype(F32))
    bad_c = dict(inits, C=np.zeros((3,), np.int32))
    m = model("QGemm", {"A": a}, bad_c, ["A", "as", "az", "B", "bs", "bz", "C"])
    with pytest.raises(KernelError, match="C .* does not broadcast"):
        ours(m, {"A": a})
    bad_bs = dict(inits, bs=np.ones(3, F32))
    m = model("QGemm", {"A": a}, bad_bs, ["A", "as", "az", "B", "bs", "bz"])
    with pytest.raises(KernelError, match="b_scale must be a scalar or have one value"):
        ours(m, {"A": a})
    m = model("QGemm", {"A": a}, inits, ["A", "as", "az", "B", "bs", "bz"], transB=1)
    with pytest.raises(KernelError, match="do not multiply"):
        ours(m, {"A": a})


# --------------------------------------------------------------------------- QLinearSoftmax


def softmax_model(x, xs, xz, ys, yz, opset, axis=None):
    m = model("QLinearSoftmax", {"X": x}, {"xs": xs, "xz": xz, "ys": ys, "yz": yz},
              ["X", "xs", "xz", "ys", "yz"], **({} if axis is None else {"axis": axis}))
    m.graph.node[0].attribute.append(helper.make_attribute("opset", opset))  # not a kwarg:
    return m  # node_model's own `opset` parameter would take it


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("shape,axis", [((4, 10), None), ((4, 10), 0), ((2, 3, 5), 1),
                                        ((2, 3, 5), -1), ((2, 4, 3, 7), 2), ((3, 300), 1),
                                        ((2, 4, 3, 7), 0)])
def test_qlinear_softmax(dt, opset, shape, axis):
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max + 1, shape).astype(dt)
    for xs in (F32(0.02), F32(0.3), F32(1.5)):
        ys, yz = qparams(dt, 1)
        m = softmax_model(x, xs, np.array(info.min + 5, dt), ys[0] * F32(0.02), yz[0], opset,
                          axis)
        assert_matches_ort(m, {"X": x})  # bit exact
    m = softmax_model(x, F32(0.1), np.array(0, dt), F32(1 / 256), np.array(info.min, dt),
                      opset, axis)  # the output parameters quantize_static writes
    assert_matches_ort(m, {"X": x})


@pytest.mark.parametrize("dt", QTYPES)
def test_qlinear_softmax_equal_inputs(dt):
    """Rows with several equal values put some outputs on a rounding tie: one step of
    onnxruntime at most there (its float32 steps are followed, but not every bit of them)."""
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max + 1, (200, 8)).astype(dt)
    x[:, 1:4] = x[:, :1]
    for xs in (F32(0.02), F32(0.3), F32(1.5)):
        ys, yz = qparams(dt, 1)
        m = softmax_model(x, xs, np.array(0, dt), ys[0] * F32(0.02), yz[0], 13, -1)
        got, want = ours(m, {"X": x})[0], run_ort(m, {"X": x})[0]
        assert got.dtype == want.dtype == dt and got.shape == want.shape
        diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
        assert diff.max() <= 1 and (diff > 0).mean() < 0.02


def test_qlinear_softmax_saturates_and_flattens():
    x = np.array([[0, 0, 0, 255], [10, 10, 10, 10]], np.uint8)
    m = softmax_model(x, F32(0.5), np.array(0, np.uint8), F32(1 / 512), np.array(0, np.uint8),
                      13)
    np.testing.assert_array_equal(ours(m, {"X": x})[0], [[0, 0, 0, 255], [128, 128, 128, 128]])
    # opset 12 at axis 1 normalizes over the last two dims together
    x3 = np.zeros((2, 2, 2), np.int8)
    m = softmax_model(x3, F32(1), np.array(0, np.int8), F32(1 / 256), np.array(-128, np.int8),
                      12, 1)
    np.testing.assert_array_equal(ours(m, {"X": x3})[0], np.full((2, 2, 2), -64, np.int8))
    # one dominant int8 value: 128 above the zero point saturates to 127
    x1 = np.array([[127, -128, -128]], np.int8)
    m = softmax_model(x1, F32(1), np.array(0, np.int8), F32(1 / 256), np.array(-128, np.int8),
                      13)
    np.testing.assert_array_equal(assert_matches_ort(m, {"X": x1})[0], [[127, -128, -128]])
    x0 = np.zeros((0, 3), np.uint8)
    for opset in (12, 13):  # no rows: an empty result, as onnxruntime
        m = softmax_model(x0, F32(0.1), np.array(0, np.uint8), F32(1 / 256),
                          np.array(0, np.uint8), opset, 1)
        assert assert_matches_ort(m, {"X": x0})[0].shape == (0, 3)
    m = softmax_model(x3, F32(1), np.array(0, np.int8), F32(1 / 256), np.array(0, np.uint8), 13)
    with pytest.raises(KernelError, match="X is int8 but y_zero_point is uint8"):
        ours(m, {"X": x3})


# ------------------------------------------------ models written by onnxruntime's quantizer


def _float_model(nodes, weights, x_shape, y_shape, opset):
    inits = {k: (RNG.standard_normal(s) * 0.5).astype(F32) for k, s in weights.items()}
    return make_model(nodes, [tensor_info("x", F32, x_shape)], [tensor_info("y", F32, y_shape)],
                      initializers=inits, opset=opset)


def mlp_head():
    """Gemm -> Relu -> MatMul + Add -> Sigmoid -> Gemm -> Softmax, the shape of a Linear head."""
    n = helper.make_node
    nodes = [n("Gemm", ["x", "w1", "b1"], ["h"], transB=1), n("Relu", ["h"], ["r"]),
             n("MatMul", ["r", "w2"], ["m"]), n("Add", ["m", "b2"], ["a"]),
             n("Sigmoid", ["a"], ["s"]), n("Gemm", ["s", "w3", "b3"], ["z"]),
             n("Softmax", ["z"], ["y"], axis=-1)]
    weights = {"w1": (16, 8), "b1": (16,), "w2": (16, 12), "b2": (12,), "w3": (12, 5),
               "b3": (5,)}
    return _float_model(nodes, weights, (4, 8), (4, 5), 17), (4, 8)


def attention_block():
    """One attention head with a residual, LayerNormalization and a Gelu MLP."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wq"], ["q0"]), n("Add", ["q0", "bq"], ["q"]),
             n("MatMul", ["x", "wk"], ["k0"]), n("Add", ["k0", "bk"], ["k"]),
             n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), n("MatMul", ["q", "kt"], ["sc"]),
             n("Softmax", ["sc"], ["att"], axis=-1), n("MatMul", ["att", "x"], ["ctx"]),
             n("Add", ["ctx", "x"], ["res"]),
             n("LayerNormalization", ["res", "g", "be"], ["ln"], axis=-1),
             n("MatMul", ["ln", "w1"], ["f0"]), n("Add", ["f0", "b1"], ["f1"]),
             n("Gelu", ["f1"], ["ge"]), n("MatMul", ["ge", "w2"], ["f2"]),
             n("Add", ["f2", "b2"], ["y"])]
    weights = {"wq": (8, 8), "bq": (8,), "wk": (8, 8), "bk": (8,), "g": (8,), "be": (8,),
               "w1": (8, 16), "b1": (16,), "w2": (16, 8), "b2": (8,)}
    return _float_model(nodes, weights, (2, 5, 8), (2, 5, 8), 20), (2, 5, 8)


def small_cnn():
    """Conv / LeakyRelu / pooling / residual Add and Mul / Concat / Sigmoid, Gemm out."""
    n = helper.make_node
    nodes = [n("Conv", ["x", "cw", "cb"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "cw2", "cb2"], ["c2"], pads=[1, 1, 1, 1]),
             n("LeakyRelu", ["c2"], ["l2"], alpha=0.1),
             n("AveragePool", ["l2"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "cw3", "cb3"], ["c3"], strides=[2, 2]),
             n("Add", ["ap", "c3"], ["s"]), n("Mul", ["s", "ap"], ["mu"]),
             n("Concat", ["mu", "s"], ["cc"], axis=1), n("Sigmoid", ["cc"], ["sg"]),
             n("GlobalAveragePool", ["sg"], ["g"]), n("Flatten", ["g"], ["f"]),
             n("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    weights = {"cw": (4, 3, 3, 3), "cb": (4,), "cw2": (6, 4, 3, 3), "cb2": (6,),
               "cw3": (6, 4, 1, 1), "cb3": (6,), "fw": (10, 12), "fb": (10,)}
    return _float_model(nodes, weights, (1, 3, 8, 8), (1, 10), 17), (1, 3, 8, 8)


def quantize_qoperator(float_model, x_shape, tmp_path, activation, weight, per_channel):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": RNG.standard_normal(x_shape).astype(F32)}
                               for _ in range(8)])

        def get_next(self):
            return next(self.feeds, None)

    src, dst = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    src.write_bytes(float_model.SerializeToString())
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=activation, weight_type=weight, per_channel=per_channel)
    return onnx.load(str(dst))


QUANTIZED_OPS = {
    mlp_head: {"QGemm", "QLinearAdd", "QLinearSigmoid", "QLinearSoftmax"},
    attention_block: {"QLinearAdd", "QLinearSoftmax"},
    small_cnn: {"QGemm", "QLinearAdd", "QLinearMul", "QLinearLeakyRelu", "QLinearAveragePool",
                "QLinearConcat", "QLinearSigmoid", "QLinearGlobalAveragePool"},
}


@pytest.mark.parametrize("build", [mlp_head, attention_block, small_cnn])
@pytest.mark.parametrize("activation,weight", [("QUInt8", "QInt8"), ("QInt8", "QInt8"),
                                               ("QUInt8", "QUInt8")])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_static_qoperator_models(build, activation, weight, per_channel, tmp_path):
    """onnxruntime's quantizer in QOperator format, its com.microsoft ops between
    QuantizeLinear and DequantizeLinear (with QLinearConv / QLinearMatMul from onnx).

    Every integer op is bit exact, so models without QLinearSoftmax match exactly. With it,
    outputs are held to one step of the last quantized tensor: onnxruntime's softmax can
    round a value on a tie the other way (see its test), and that step carries through the
    ops after it (on these seeded inputs they match exactly too)."""
    from onnxruntime.quantization import QuantType

    float_model, x_shape = build()
    m = quantize_qoperator(float_model, x_shape, tmp_path, QuantType[activation],
                           QuantType[weight], per_channel)
    ops = {nd.op_type for nd in m.graph.node if nd.domain == MS}
    assert ops == QUANTIZED_OPS[build]
    last_dq = next(nd for nd in reversed(m.graph.node) if nd.op_type == "DequantizeLinear")
    step = onnx.numpy_helper.to_array(
        next(t for t in m.graph.initializer if t.name == last_dq.input[1]))
    session = InferenceSession.builder().from_graph(m)
    for _ in range(3):
        x = (RNG.standard_normal(x_shape) * 2).astype(F32)
        got, want = session.run({"x": x})[0], run_ort(m, {"x": x})[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        if "QLinearSoftmax" in ops:
            np.testing.assert_allclose(got, want, rtol=0, atol=float(step) * 1.001)
        else:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["mlp", "resnet", "bert", "gpt2", "mobilenet"])
def test_quantize_static_qoperator_zoo(name, tmp_path):
    """onnxkiln's zoo models (small configs), quantized by onnxruntime in QOperator format,
    calibrated on random feeds: they load and match onnxruntime (the float ops after the last
    DequantizeLinear, LayerNormalization or Gelu in BERT, differ by float rounding only)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from onnxkiln import zoo

    gen, config, _ = zoo.MODELS[name]
    float_model = gen(config)
    feeds = [zoo.random_inputs(float_model, seed=s) for s in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(feeds[1:])

        def get_next(self):
            return next(self.feeds, None)

    src, dst = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    src.write_bytes(float_model.SerializeToString())
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    m = onnx.load(str(dst))
    assert {nd.op_type for nd in m.graph.node if nd.domain == MS} & {"QGemm", "QLinearSoftmax"}
    assert_matches_ort(m, feeds[0], rtol=1e-5, atol=1e-5)
