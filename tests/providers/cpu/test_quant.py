"""Quantization kernels (providers/cpu/quant.py) against onnxruntime, or numpy where it can't."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxkiln import InferenceSession
from onnxkiln.testing import assert_matches_ort, make_model, node_model, run_ort, tensor_info

RNG = np.random.default_rng(7)
INT_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(ml_dtypes.uint4): (0, 15),
    np.dtype(ml_dtypes.int4): (-8, 7),
    np.dtype(ml_dtypes.uint2): (0, 3),
    np.dtype(ml_dtypes.int2): (-2, 1),
}
FLOAT8 = [
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e5m2fnuz,
]


def ours(model, feeds):
    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def onnx_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def name(dtype) -> str:
    return np.dtype(dtype).name


def is_ml(dtype) -> bool:
    """An ml_dtypes type (onnxruntime's Python API can't take or return most of them)."""
    return np.dtype(dtype).type.__module__.startswith("ml_dtypes")


def sample(shape, scale=40.0, dtype=np.float32):
    """Values with exact .5 ties (round half to even), specials and out-of-range values."""
    x = RNG.standard_normal(shape) * scale
    flat = x.reshape(-1)
    ties = [0.25, -0.25, 0.75, 1.25, -1.25, 2.5e3, -3e5, 1e-30]
    flat[: min(len(ties), flat.size)] = ties[: flat.size]
    return x.astype(dtype)


def q_model(op, x, inits, opset, *, cast=False, feed_params=False, **attrs):
    """`op`(x, *inits); with `cast`, the output goes through Cast(float) so onnxruntime's
    Python API can return types numpy lacks (int4, float8...)."""
    if not cast:
        feeds = {"x": x, **(inits if feed_params else {})}
        return node_model(op, feeds, opset=opset, initializers={} if feed_params else inits,
                          input_names=["x", *inits], **attrs)
    nodes = [
        helper.make_node(op, ["x", *inits], ["q"], **attrs),
        helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT),
    ]
    inputs = [tensor_info("x", x.dtype, x.shape)]
    outputs = [tensor_info("y", np.float32, x.shape)]
    return make_model(nodes, inputs, outputs, initializers=inits, opset=opset)


def assert_same(model, feeds, rtol=0.0, atol=0.0):
    """Ours equals onnxruntime exactly (NaN where it has NaN)."""
    (a,) = ours(model, feeds)
    (b,) = run_ort(model, feeds)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    return a


def quantize_ref(x, scale, zp, dtype, saturate=True):
    """numpy reference for QuantizeLinear with broadcastable scale/zp (float32 division)."""
    q = x.astype(np.float32) / np.asarray(scale, np.float32)
    dt = np.dtype(dtype)
    if dt in INT_RANGES:
        lo, hi = INT_RANGES[dt]
        q = np.rint(q) + (0 if zp is None else np.asarray(zp).astype(np.float32))
        return np.clip(np.nan_to_num(q, nan=lo), lo, hi).astype(dt)
    if zp is not None:
        q = q + np.asarray(zp).astype(np.float32)
    if saturate and dt in {np.dtype(t) for t in FLOAT8}:
        top = float(ml_dtypes.finfo(dt).max)
        q = np.clip(q, -top, top)
    return q.astype(dt)


# ------------------------------------------------------------------------------- QuantizeLinear

Q_TYPES = [  # (zero point type, opsets to test)
    (np.uint8, [10, 13, 19, 21, 25]),
    (np.int8, [10, 13, 21]),
    (np.uint16, [21, 25]),
    (np.int16, [21]),
    (ml_dtypes.uint4, [21, 25]),
    (ml_dtypes.int4, [21]),
    (ml_dtypes.uint2, [25]),
    (ml_dtypes.int2, [25]),
]


@pytest.mark.parametrize(
    ("zdt", "opset"), [(z, o) for z, opsets in Q_TYPES for o in opsets],
    ids=lambda v: name(v) if not isinstance(v, int) else str(v),
)
def test_quantize_per_tensor_integer_types(zdt, opset):
    x = sample((3, 4, 5))
    if opset >= 19:
        x.reshape(-1)[8:11] = [np.nan, np.inf, -np.inf]
    lo, hi = INT_RANGES[np.dtype(zdt)]
    zp = np.array((lo + hi + 1) // 2 if lo == 0 else -1, zdt)
    inits = {"s": np.array(0.5, np.float32), "z": zp}
    model = q_model("QuantizeLinear", x, inits, opset, cast=is_ml(zdt))
    y = assert_same(model, {"x": x})
    ref = quantize_ref(x, 0.5, zp, zdt).astype(np.float32)
    np.testing.assert_array_equal(y.astype(np.float32), ref)


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("opset", [19, 21, 25])
@pytest.mark.parametrize("zdt", FLOAT8, ids=name)
def test_quantize_float8_saturation(zdt, opset, saturate):
    top = float(ml_dtypes.finfo(zdt).max)
    x = np.array([0.0, -0.0, 1.3, -7.77, top * 0.9, top * 1.01, top * 3, -top * 3, np.inf,
                  -np.inf, np.nan, 1e-9], np.float32)
    inits = {"s": np.array(0.5, np.float32), "z": np.array(0, zdt)}
    model = q_model("QuantizeLinear", x, inits, opset, cast=True, saturate=saturate)
    y = assert_same(model, {"x": x})
    (raw,) = ours(q_model("QuantizeLinear", x, inits, opset, saturate=saturate), {"x": x})
    assert raw.dtype == np.dtype(zdt)
    np.testing.assert_array_equal(raw.view(np.uint8), quantize_ref(x, 0.5, None, zdt,
                                                                   bool(saturate)).view(np.uint8))
    assert np.isfinite(y[:10]).all() == bool(saturate) or zdt == ml_dtypes.float8_e5m2


@pytest.mark.parametrize("opset", [10, 13, 21])
def test_quantize_int32_input(opset):
    # onnxruntime has no int32-input QuantizeLinear; from opset 19 the scale is int32 as well
    x = (RNG.integers(-300, 300, (4, 6))).astype(np.int32)
    x[0, :3] = [3, -9, 15]  # ties of x / 6
    scale = np.array(6, np.int32) if opset >= 19 else np.array(6.0, np.float32)
    (y,) = ours(node_model("QuantizeLinear", {"x": x}, opset=opset,
                           initializers={"s": scale}), {"x": x})
    assert y.dtype == np.uint8
    np.testing.assert_array_equal(y, np.clip(np.rint(x / 6.0), 0, 255).astype(np.uint8))


def test_quantize_without_zero_point_is_uint8():
    x = sample((3, 5))
    model = node_model("QuantizeLinear", {"x": x}, opset=13,
                       initializers={"s": np.array(0.2, np.float32)})
    (y,) = assert_matches_ort(model, {"x": x})
    np.testing.assert_array_equal(y, quantize_ref(x, 0.2, None, np.uint8))


def test_quantize_output_dtype_attribute():
    x = sample((2, 8))
    model = q_model("QuantizeLinear", x, {"s": np.array(0.25, np.float32)}, 21,
                    output_dtype=TensorProto.INT8)
    y = assert_same(model, {"x": x})
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, quantize_ref(x, 0.25, None, np.int8))


@pytest.mark.parametrize(("axis", "zdt"), [(1, np.uint8), (-1, np.int8), (0, np.int16)])
@pytest.mark.parametrize("feed_params", [False, True])
def test_quantize_per_axis(axis, zdt, feed_params):
    x = sample((3, 4, 5))
    n = x.shape[axis]
    scale = RNG.uniform(0.1, 2.0, n).astype(np.float32)
    zp = RNG.integers(-5, 5, n).astype(zdt) if zdt != np.uint8 else np.arange(n, dtype=zdt)
    inits = {"s": scale, "z": zp}
    model = q_model("QuantizeLinear", x, inits, 21, feed_params=feed_params, axis=axis)
    feeds = {"x": x, **(inits if feed_params else {})}
    y = assert_same(model, feeds)
    shape = [1, 1, 1]
    shape[axis] = n
    np.testing.assert_array_equal(y, quantize_ref(x, scale.reshape(shape), zp.reshape(shape), zdt))


@pytest.mark.parametrize(("block", "zdt"), [(2, np.int8), (3, np.uint8), (4, ml_dtypes.int4)])
def test_quantize_blocked(block, zdt):
    x = sample((4, 7))
    nb = -(-7 // block)
    scale = RNG.uniform(0.1, 2.0, (4, nb)).astype(np.float32)
    zp = RNG.integers(0, 3, (4, nb)).astype(zdt)
    inits = {"s": scale, "z": zp}
    model = q_model("QuantizeLinear", x, inits, 21, cast=is_ml(zdt), axis=1, block_size=block)
    (y,) = ours(model, {"x": x})
    full = np.repeat(scale, block, axis=1)[:, :7]
    ref = quantize_ref(x, full, np.repeat(zp, block, axis=1)[:, :7], zdt)
    np.testing.assert_array_equal(y, ref.astype(y.dtype))
    if not is_ml(zdt):
        assert_same(model, {"x": x})


def test_quantize_blocked_bad_block_size_is_clear():
    x = sample((4, 7))
    model = q_model("QuantizeLinear", x, {"s": np.ones((4, 2), np.float32)}, 21, axis=1,
                    block_size=2)
    with pytest.raises(Exception, match="block_size 2"):
        ours(model, {"x": x})


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_quantize_half_precision_inputs(dtype):
    x = np.clip(sample((4, 6), scale=20.0), -6e4, 6e4).astype(dtype)
    inits = {"s": np.array(0.3, dtype), "z": np.array(3, np.int8)}
    model = q_model("QuantizeLinear", x, inits, 21)
    (y,) = ours(model, {"x": x})
    # division in the scale's type: the quotient is rounded to float16/bfloat16 first
    with np.errstate(over="ignore"):
        q = (x.astype(np.float32) / np.float32(np.array(0.3, dtype))).astype(dtype)
    np.testing.assert_array_equal(y, quantize_ref(q, 1.0, np.int8(3), np.int8))
    if dtype == np.float16:  # onnxruntime divides in float32: equal away from rounding ties
        (theirs,) = run_ort(model, {"x": x})
        assert np.abs(y.astype(np.int32) - theirs).max() <= 1


def test_quantize_precision_attribute():
    x = np.array([1000.3, -2.6, 7.45, 3.0], np.float32)
    s = np.array(0.1, np.float32)
    model = q_model("QuantizeLinear", x, {"s": s, "z": np.array(0, np.int16)}, 23,
                    precision=TensorProto.FLOAT16)
    (y,) = ours(model, {"x": x})
    q = (x.astype(np.float16).astype(np.float32) / np.float32(np.float16(0.1))).astype(np.float16)
    np.testing.assert_array_equal(y, np.rint(q.astype(np.float32)).astype(np.int16))
    plain_model = q_model("QuantizeLinear", x, {"s": s, "z": np.array(0, np.int16)}, 23)
    (plain,) = ours(plain_model, {"x": x})
    np.testing.assert_array_equal(plain, quantize_ref(x, s, None, np.int16))


def test_quantize_float4_and_e8m0_scale():
    x = np.array([0.0, 0.3, -0.8, 1.3, 2.6, 5.0, 7.0, 100.0, -100.0, -0.1], np.float32)
    model = q_model("QuantizeLinear", x, {"s": np.array(0.5, np.float32),
                                          "z": np.array(0, ml_dtypes.float4_e2m1fn)}, 23)
    (y,) = ours(model, {"x": x})
    assert y.dtype == np.dtype(ml_dtypes.float4_e2m1fn)
    np.testing.assert_array_equal(y.astype(np.float32),
                                  (x / 0.5).astype(ml_dtypes.float4_e2m1fn).astype(np.float32))
    assert y.astype(np.float32).max() == 6.0  # saturates, no inf
    s = np.array(0.25, ml_dtypes.float8_e8m0fnu)
    model = q_model("QuantizeLinear", x, {"s": s, "z": np.array(0, np.int8)}, 24)
    (y,) = ours(model, {"x": x})
    np.testing.assert_array_equal(y, quantize_ref(x, 0.25, None, np.int8))


# ----------------------------------------------------------------------------- DequantizeLinear

DQ_TYPES = [
    (np.uint8, [10, 13, 21]),
    (np.int8, [10, 19, 25]),
    (np.int32, [10, 21]),
    (np.uint16, [21]),
    (np.int16, [21]),
    (ml_dtypes.uint4, [21]),
    (ml_dtypes.int4, [21, 25]),
    (ml_dtypes.int2, [25]),
    (ml_dtypes.uint2, [25]),
    (ml_dtypes.float8_e4m3fn, [19, 21]),
    (ml_dtypes.float8_e5m2, [19]),
    (ml_dtypes.float8_e4m3fnuz, [21]),
    (ml_dtypes.float8_e5m2fnuz, [21]),
]


def values_of(dtype, shape):
    dt = np.dtype(dtype)
    if dt in INT_RANGES:
        lo, hi = INT_RANGES[dt]
        return RNG.integers(lo, hi + 1, shape).astype(dt)
    if dt == np.int32:
        return RNG.integers(-(2**20), 2**20, shape).astype(dt)
    return (RNG.standard_normal(shape) * 8).astype(dt)


@pytest.mark.parametrize(
    ("xdt", "opset"), [(t, o) for t, opsets in DQ_TYPES for o in opsets],
    ids=lambda v: name(v) if not isinstance(v, int) else str(v),
)
def test_dequantize_per_tensor(xdt, opset):
    x = values_of(xdt, (3, 5))
    zp = None
    if np.dtype(xdt) in INT_RANGES:
        zp = np.array(INT_RANGES[np.dtype(xdt)][1] // 2, xdt)
    inits = {"s": np.array(0.37, np.float32)}
    if zp is not None:
        inits["z"] = zp
    model = q_model("DequantizeLinear", x, inits, opset)
    feeds = {"x": x}
    (y,) = ours(model, feeds)
    assert y.dtype == np.float32
    ref = (x.astype(np.float32) - (0 if zp is None else zp.astype(np.float32))) * np.float32(0.37)
    np.testing.assert_allclose(y, ref, rtol=1e-6)
    if not is_ml(xdt):
        assert_same(model, feeds)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_dequantize_per_axis(axis):
    x = values_of(np.int8, (3, 4, 5))
    n = x.shape[axis]
    inits = {"s": RNG.uniform(0.1, 1.0, n).astype(np.float32),
             "z": RNG.integers(-3, 3, n).astype(np.int8)}
    model = q_model("DequantizeLinear", x, inits, 21, axis=axis)
    assert_same(model, {"x": x}, rtol=1e-6)


def test_dequantize_blocked_and_output_dtype():
    x = values_of(ml_dtypes.int4, (2, 6, 3))
    s = RNG.uniform(0.1, 1.0, (2, 2, 3)).astype(np.float32)
    zp = RNG.integers(-2, 2, (2, 2, 3)).astype(ml_dtypes.int4)
    model = q_model("DequantizeLinear", x, {"s": s, "z": zp}, 23, axis=1, block_size=4,
                    output_dtype=TensorProto.FLOAT16)
    (y,) = ours(model, {"x": x})
    assert y.dtype == np.float16
    full_s = np.repeat(s, 4, axis=1)[:, :6]
    full_z = np.repeat(zp.astype(np.float32), 4, axis=1)[:, :6]
    np.testing.assert_array_equal(y, ((x.astype(np.float32) - full_z) * full_s).astype(np.float16))


@pytest.mark.parametrize("sdt", [np.float16, ml_dtypes.bfloat16])
def test_dequantize_half_scale_gives_half_output(sdt):
    x = values_of(np.uint8, (4, 4))
    inits = {"s": np.array(0.02, sdt), "z": np.array(128, np.uint8)}
    model = q_model("DequantizeLinear", x, inits, 21)
    (y,) = ours(model, {"x": x})
    assert y.dtype == np.dtype(sdt)
    ref = (x.astype(np.float32) - 128) * np.float32(np.array(0.02, sdt))
    np.testing.assert_array_equal(y, ref.astype(sdt))
    if sdt == np.float16:
        assert_same(model, {"x": x})


def test_dequantize_e8m0_scale_and_zero_point_type_check():
    x = values_of(np.int8, (5,))
    s = np.array(8.0, ml_dtypes.float8_e8m0fnu)
    (y,) = ours(q_model("DequantizeLinear", x, {"s": s}, 24, output_dtype=TensorProto.FLOAT),
                {"x": x})
    np.testing.assert_array_equal(y, x.astype(np.float32) * 8)
    xb = x.view(np.uint8)
    bad = q_model("DequantizeLinear", xb, {"s": np.array(1.0, np.float32),
                                           "z": np.array(0, np.int8)}, 21)
    with pytest.raises(Exception, match="zero_point"):
        ours(bad, {"x": xb})


def test_quantize_dequantize_round_trip_feeds_and_0d():
    x = np.array(3.3, np.float32)
    feeds = {"x": x, "s": np.array(0.1, np.float32), "z": np.array(10, np.uint8)}
    model = node_model("QuantizeLinear", feeds, opset=21)
    (y,) = assert_matches_ort(model, feeds)
    assert y.shape == () and y == 43
    empty = {"x": np.zeros((0, 3), np.float32), "s": feeds["s"], "z": feeds["z"]}
    (e,) = assert_matches_ort(node_model("QuantizeLinear", empty, opset=21), empty)
    assert e.shape == (0, 3)


# ------------------------------------------------------------------------ DynamicQuantizeLinear


@pytest.mark.parametrize(
    "x",
    [
        sample((3, 7), 3.0),
        np.abs(sample((10,), 3.0)) + 1,
        -np.abs(sample((2, 5), 3.0)) - 0.5,
        np.zeros((4,), np.float32),
        np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32),
    ],
    ids=["mixed", "positive", "negative", "zeros", "spec_example"],
)
def test_dynamic_quantize_linear(x):
    x = x.astype(np.float32)
    model = node_model("DynamicQuantizeLinear", {"x": x}, n_outputs=3, opset=11)
    y, scale, zp = assert_matches_ort(model, {"x": x}, rtol=0, atol=0)
    assert y.dtype == np.uint8 and scale.shape == () and zp.dtype == np.uint8


# ------------------------------------------------------------------------------- QLinearMatMul


def reduced(v):
    """int8 values in [-64, 63]: onnxruntime's x86 u8*s8 kernels saturate int16 pair sums
    (vpmaddubsw) on full-range int8 weights, so comparisons with it use 7-bit weights."""
    return (v // 2).astype(v.dtype) if v.dtype == np.int8 else v


def qmm_inputs(adt, bdt, shape_a, shape_b, per_col=False):
    a = values_of(adt, shape_a)
    b = values_of(bdt, shape_b)
    if adt != bdt:
        b = reduced(b)
    n = shape_b[-1]
    lo_a, hi_a = INT_RANGES[np.dtype(adt)]
    lo_b, hi_b = INT_RANGES[np.dtype(bdt)]
    b_scale = RNG.uniform(0.002, 0.01, n if per_col else ()).astype(np.float32)
    b_zp = (RNG.integers(lo_b // 2, hi_b // 2 + 1, n) if per_col else (lo_b + hi_b) // 3)
    return {
        "a": a, "a_scale": np.array(0.0066, np.float32), "a_zero_point": np.array(
            (lo_a + hi_a) // 2, adt),
        "b": b, "b_scale": b_scale, "b_zero_point": np.asarray(b_zp).astype(bdt),
        "y_scale": np.array(0.05 * max(shape_a[-1], 1) / 64, np.float32),
        "y_zero_point": np.array(10, np.uint8 if adt == np.uint8 else np.int8),
    }


@pytest.mark.parametrize("const_b", [False, True])
@pytest.mark.parametrize(
    ("adt", "bdt"), [(np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8)],
    ids=lambda d: name(d),
)
@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [((2, 4), (4, 3)), ((2, 3, 16), (16, 5)), ((2, 3, 300), (2, 300, 4)), ((5, 40), (40, 7))],
    ids=["2d", "3d_x_2d", "batched_long_k", "mid"],
)
def test_qlinear_matmul(adt, bdt, shape_a, shape_b, const_b):
    feeds = qmm_inputs(adt, bdt, shape_a, shape_b)
    inits = {}
    if const_b:
        inits = {k: feeds.pop(k) for k in ("b", "b_scale", "b_zero_point")}
    order = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale",
             "y_zero_point"]
    model = node_model("QLinearMatMul", feeds, opset=21 if adt != bdt else 10,
                       initializers=inits, input_names=order)
    assert_matches_ort(model, feeds, rtol=0, atol=0)


def qmm_reference(f):
    """Exact integer product, requantized in float32 like onnxruntime."""
    az = f["a_zero_point"].astype(np.int64)
    acc = (f["a"].astype(np.int64) - az) @ (f["b"].astype(np.int64) - f["b_zero_point"])
    mult = f["a_scale"] * f["b_scale"] / f["y_scale"]
    q = np.rint(acc.astype(np.float32) * mult) + f["y_zero_point"].astype(np.float32)
    lo, hi = INT_RANGES[f["y_zero_point"].dtype]
    return np.clip(q, lo, hi).astype(f["y_zero_point"].dtype)


@pytest.mark.parametrize("const_b", [False, True])
@pytest.mark.parametrize("k", [6, 300, 2000])
def test_qlinear_matmul_full_range_u8s8_against_numpy(k, const_b):
    feeds = qmm_inputs(np.uint8, np.int8, (3, k), (k, 4))
    feeds["b"] = values_of(np.int8, (k, 4))  # full int8 range
    feeds["a"][0] = 255
    feeds["b"][:, 0] = -128  # large sums: the float32 path must not be taken unless exact
    feeds["y_scale"] = np.array(0.0066 * 0.00705 * k * 40, np.float32)
    ref = qmm_reference(feeds)
    inits = {k_: feeds.pop(k_) for k_ in ("b", "b_zero_point")} if const_b else {}
    order = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale",
             "y_zero_point"]
    (y,) = ours(node_model("QLinearMatMul", feeds, opset=21, initializers=inits,
                           input_names=order), feeds)
    np.testing.assert_array_equal(y, ref)


def test_qlinear_matmul_per_column_and_float16_scales():
    feeds = qmm_inputs(np.uint8, np.int8, (3, 8), (8, 5), per_col=True)
    order = list(feeds)
    (y,) = assert_matches_ort(node_model("QLinearMatMul", feeds, opset=21, input_names=order),
                              feeds, rtol=0, atol=0)
    f16 = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in feeds.items()}
    (y16,) = ours(node_model("QLinearMatMul", f16, opset=21, input_names=order), f16)
    assert np.abs(y16.astype(np.int32) - y.astype(np.int32)).max() <= 1


def test_qlinear_matmul_float8():
    a = (RNG.standard_normal((3, 4)) * 4).astype(ml_dtypes.float8_e4m3fn)
    b = (RNG.standard_normal((4, 2)) * 4).astype(ml_dtypes.float8_e4m3fn)
    feeds = {"a": a, "a_scale": np.array(0.5, np.float32),
             "a_zero_point": np.array(0, a.dtype), "b": b,
             "b_scale": np.array(2.0, np.float32), "b_zero_point": np.array(0, b.dtype),
             "y_scale": np.array(0.25, np.float32),
             "y_zero_point": np.array(0, ml_dtypes.float8_e5m2)}
    (y,) = ours(node_model("QLinearMatMul", feeds, opset=21), feeds)
    ref = (a.astype(np.float32) * 0.5) @ (b.astype(np.float32) * 2.0) / 0.25
    assert y.dtype == np.dtype(ml_dtypes.float8_e5m2)
    np.testing.assert_array_equal(y, ref.astype(ml_dtypes.float8_e5m2))


# ------------------------------------------------------------------ QLinearConv and ConvInteger

CONV_CASES = [
    ("plain", (1, 3, 6, 6), (4, 3, 3, 3), {}),
    ("pads_strides", (2, 4, 7, 8), (6, 2, 3, 2),
     {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1]}),
    ("depthwise", (1, 4, 7, 7), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    ("pointwise", (1, 8, 5, 5), (3, 8, 1, 1), {}),
    ("same_upper_1d", (1, 2, 9), (3, 2, 4), {"auto_pad": "SAME_UPPER", "strides": [2]}),
    ("dilated", (1, 3, 9, 8), (2, 3, 2, 3), {"dilations": [2, 3], "pads": [1, 2, 0, 1]}),
    ("deep_k", (1, 64, 5, 5), (8, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("const_w", [True, False])
@pytest.mark.parametrize("xdt", [np.uint8, np.int8], ids=name)
@pytest.mark.parametrize(("case", "xs", "ws", "attrs"), CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_qlinear_conv(case, xs, ws, attrs, xdt, const_w):
    x = values_of(xdt, xs)
    w = values_of(np.int8, ws)
    if xdt == np.uint8:
        w = reduced(w)
    m = ws[0]
    per_channel = case in ("plain", "depthwise", "deep_k")
    feeds = {
        "x": x, "x_scale": np.array(0.02, np.float32), "x_zero_point": np.array(5, xdt),
        "w": w,
        "w_scale": (RNG.uniform(0.001, 0.01, m) if per_channel else np.array(0.004)).astype(
            np.float32),
        "w_zero_point": np.zeros(m if per_channel else (), np.int8),
        "y_scale": np.array(0.05, np.float32), "y_zero_point": np.array(3, xdt),
        "B": RNG.integers(-500, 500, m).astype(np.int32),
    }
    order = list(feeds)
    inits = {}
    if const_w:
        inits = {k: feeds.pop(k) for k in ("w", "w_scale", "w_zero_point", "B")}
    model = node_model("QLinearConv", feeds, opset=10, initializers=inits, input_names=order,
                       **attrs)
    assert_matches_ort(model, feeds, rtol=0, atol=0)


@pytest.mark.parametrize("with_zp", [True, False])
@pytest.mark.parametrize(("case", "xs", "ws", "attrs"), CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_integer(case, xs, ws, attrs, with_zp):
    x = values_of(np.uint8, xs)
    w = values_of(np.uint8, ws)
    feeds = {"x": x, "w": w}
    if with_zp:
        feeds.update(x_zero_point=np.array(128, np.uint8), w_zero_point=np.array(100, np.uint8))
    model = node_model("ConvInteger", feeds, opset=10, **attrs)
    (y,) = assert_matches_ort(model, feeds)
    assert y.dtype == np.int32


def test_conv_integer_per_channel_w_zero_point_against_numpy():
    x = values_of(np.int8, (1, 2, 4, 4))
    w = values_of(np.int8, (3, 2, 2, 2))
    wzp = np.array([1, -2, 3], np.int8)
    feeds = {"x": x, "w": w, "x_zero_point": np.array(-1, np.int8)}
    model = node_model("ConvInteger", feeds, opset=10, initializers={"w_zero_point": wzp})
    (y,) = ours(model, feeds)
    xc = x.astype(np.int64) + 1
    wc = w.astype(np.int64) - wzp.reshape(3, 1, 1, 1)
    ref = np.zeros((1, 3, 3, 3), np.int64)
    for i in range(3):
        for j in range(3):
            ref[0, :, i, j] = np.einsum("ckl,mckl->m", xc[0, :, i:i + 2, j:j + 2], wc)
    np.testing.assert_array_equal(y, ref)


# ----------------------------------------------------------------------------------- BitCast


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (np.float32, np.int32), (np.int64, np.float64), (np.uint16, np.float16),
        (np.float16, ml_dtypes.bfloat16), (np.int8, ml_dtypes.float8_e4m3fn),
        (np.bool_, np.uint8), (ml_dtypes.int4, ml_dtypes.uint4),
        (ml_dtypes.uint4, ml_dtypes.float4_e2m1fn), (ml_dtypes.int2, ml_dtypes.uint2),
        (np.complex64, np.float64), (np.uint8, np.bool_),
    ],
    ids=lambda d: name(d),
)
def test_bitcast(src, dst):
    dt = np.dtype(src)
    if dt.kind == "b":
        x = np.array([[True, False, True]])
    elif dt in INT_RANGES:
        lo, hi = INT_RANGES[dt]
        x = np.arange(lo, hi + 1).astype(dt).reshape(1, -1)
    elif dt.kind == "c":
        x = (RNG.standard_normal((2, 3)) + 1j).astype(dt)
    else:
        x = (RNG.standard_normal((2, 3)) * 10).astype(dt)
    if dt == np.uint8:
        x = np.array([[0, 1, 2, 255]], np.uint8)
    model = node_model("BitCast", {"x": x}, opset=26, to=onnx_type(dst))
    (y,) = ours(model, {"x": x})
    assert y.dtype == np.dtype(dst) and y.shape == x.shape
    if np.dtype(dst).kind == "b":
        np.testing.assert_array_equal(y, x != 0)
    else:
        np.testing.assert_array_equal(y.view(np.uint8), x.view(np.uint8))


def test_bitcast_width_mismatch_is_clear():
    x = np.zeros(3, np.float32)
    model = node_model("BitCast", {"x": x}, opset=26, to=TensorProto.INT64)
    with pytest.raises(Exception, match="widths must match"):
        ours(model, {"x": x})
