"""Cast and CastLike (providers/cpu/cast.py) against onnxruntime and the spec's tables."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxkiln import InferenceSession
from onnxkiln.testing import assert_matches_ort, make_model, node_model, run_ort, tensor_info

NUMERIC = [
    np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16,
    np.int32, np.uint32, np.int64, np.uint64, np.bool_,
]  # fmt: skip


def onnx_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def ours(model, feeds):
    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def values_for(dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.array([True, False, True])
    if dt.kind == "u":
        return np.array([0, 1, 7, 100, 255], dt)
    if dt.kind == "i":
        return np.array([0, 1, -1, 100, -128, 127], dt)
    return np.array([0.0, -0.0, 1.0, -1.5, 2.75, 100.25, -120.9, 0.1], dt)


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("dst", NUMERIC, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("src", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_cast_numeric_matrix(src, dst, opset):
    x = values_for(src)
    if np.dtype(dst).kind == "u" and np.dtype(src).kind == "f":
        x = np.abs(x)  # float -> unsigned is undefined for negatives
    model = node_model("Cast", {"x": x}, opset=opset, to=onnx_type(dst))
    (y,) = assert_matches_ort(model, {"x": x})
    if src == dst:
        np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize(
    "dst", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64]
)
@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16])
def test_cast_float_to_int_out_of_range_like_onnxruntime(src, dst):
    with np.errstate(over="ignore"):
        x = np.array([300.0, -1.0, -129.0, 200.5, 65537.5, -40000.0, 1e4, -2.7], src)
    if src != np.float16:
        x = np.concatenate([x, np.array([1e10, -1e10, 3e9, np.nan, np.inf], src)])
    model = node_model("Cast", {"x": x}, opset=13, to=onnx_type(dst))
    with np.errstate(invalid="ignore", over="ignore"):
        assert_matches_ort(model, {"x": x})


@pytest.mark.parametrize("src", [np.int64, np.uint64, np.int32])
def test_cast_int_wraps(src):
    big = 2**31 + 5 if src != np.int32 else 2**31 - 5
    x = np.array([200, 65535, 70000, big, -1 if src != np.uint64 else 9], src)
    for dst in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.float16):
        model = node_model("Cast", {"x": x}, opset=13, to=onnx_type(dst))
        assert_matches_ort(model, {"x": x})


def test_cast_double_to_half_rounds_through_float():
    x = np.array([0.1, 1e6, 65519.99, 2049.0000001, -3.3e-8], np.float64)
    model = node_model("Cast", {"x": x}, opset=13, to=TensorProto.FLOAT16)
    assert_matches_ort(model, {"x": x})


@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16])
def test_cast_float_to_string(src):
    x = np.array(
        [0.1, 1 / 3, 1e10, 1.5e-7, -0.0, 123456789.0, np.nan, np.inf, -np.inf, 3.0, 100.0, 2**24],
        np.float64,
    )
    with np.errstate(over="ignore"):
        x = x.astype(src)
    model = node_model("Cast", {"x": x}, opset=13, to=TensorProto.STRING)
    (y,) = assert_matches_ort(model, {"x": x})
    assert y.dtype == object and isinstance(y[0], str)


@pytest.mark.parametrize("src", [np.int64, np.int8, np.uint8, np.uint64, np.bool_])
def test_cast_int_bool_to_string(src):
    x = values_for(src).reshape(-1, 1)
    model = node_model("Cast", {"x": x}, opset=13, to=TensorProto.STRING)
    assert_matches_ort(model, {"x": x})


@pytest.mark.parametrize(
    "dst", [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.uint64, np.int8]
)
def test_cast_string_to_number(dst):
    if np.dtype(dst).kind == "f":
        texts = ["3.14", "1e-5", "1E8", "+INF", "inf", "-INF", "NaN", " 2", "100.5", "-0", ".5",
                 "5.", "infinity", "-2.5e3  ", "0x10", "3.14abc", "1_000", "1e40"]  # fmt: skip
    else:
        texts = ["100", "-7", "100.5", " 3", "+4", "0", "1e3", "255", "256"]
    x = np.array(texts, dtype=object).reshape(-1, 1)
    model = node_model("Cast", {"x": x}, opset=13, to=onnx_type(dst))
    with np.errstate(over="ignore"):
        assert_matches_ort(model, {"x": x})


def test_cast_string_to_bool_and_empty():
    x = np.array(["2", "-1", "0", "1"], dtype=object)
    assert_matches_ort(node_model("Cast", {"x": x}, opset=13, to=TensorProto.BOOL), {"x": x})
    e = np.empty((0, 2), dtype=object)
    assert_matches_ort(node_model("Cast", {"x": e}, opset=13, to=TensorProto.FLOAT), {"x": e})
    assert_matches_ort(node_model("Cast", {"x": e}, opset=13, to=TensorProto.STRING), {"x": e})


def test_cast_string_parse_error_is_clear():
    x = np.array(["12", "abc"], dtype=object)
    model = node_model("Cast", {"x": x}, opset=13, to=TensorProto.FLOAT)
    with pytest.raises(Exception, match="cannot convert string 'abc'"):
        ours(model, {"x": x})


def test_cast_opset1_type_name():
    x = np.array([1.5, -2.5, 3.0], np.float32)
    (y,) = ours(node_model("Cast", {"x": x}, opset=1, to="INT32"), {"x": x})
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [1, -2, 3])


def chain_model(x: np.ndarray, mid: int, opset: int, **attrs) -> onnx.ModelProto:
    """float -> `mid` -> float: lets onnxruntime check types its numpy bridge cannot return."""
    nodes = [
        helper.make_node("Cast", ["x"], ["m"], to=mid, **attrs),
        helper.make_node("Cast", ["m"], ["y"], to=TensorProto.FLOAT),
    ]
    return make_model(
        nodes, [tensor_info("x", x.dtype, x.shape)], [tensor_info("y", np.float32, x.shape)],
        opset=opset,
    )  # fmt: skip


SPECIALS = np.array(
    [0.0, -0.0, 0.3, -1.7, 3.14159, 1e-3, 1e-6, 200.0, 448.0, 464.0, 500.0, 1e6, -1e6,
     57344.0, 60000.0, np.inf, -np.inf, np.nan],
    np.float32,
)  # fmt: skip


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize(
    "mid", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2, TensorProto.BFLOAT16]
)
@pytest.mark.parametrize("src", [np.float32, np.float16, np.float64])
def test_cast_small_floats_round_trip_vs_onnxruntime(mid, saturate, src):
    with np.errstate(over="ignore"):
        x = SPECIALS.astype(src)
    attrs = {"saturate": saturate} if mid != TensorProto.BFLOAT16 else {}
    assert_matches_ort(chain_model(x, mid, 19, **attrs), {"x": x}, rtol=0, atol=0)


def test_cast_e5m2_tie_above_max_is_inf_per_spec():
    # onnxruntime gives NaN for 61440 (halfway between 57344 and 65536) without saturate;
    # the spec's table says values rounding above the max become Inf for E5M2.
    x = np.array([61440.0, -61440.0], np.float32)
    model = node_model("Cast", {"x": x}, opset=19, to=TensorProto.FLOAT8E5M2, saturate=0)
    np.testing.assert_array_equal(ours(model, {"x": x})[0].astype(np.float32), [np.inf, -np.inf])


def test_cast_float8_bits_vs_onnxruntime():
    x = SPECIALS
    for saturate in (0, 1):
        model = node_model("Cast", {"x": x}, opset=19, to=TensorProto.FLOAT8E4M3FN,
                           saturate=saturate)  # fmt: skip
        (mine,) = ours(model, {"x": x})
        (theirs,) = run_ort(model, {"x": x})
        assert mine.dtype == ml_dtypes.float8_e4m3fn
        np.testing.assert_array_equal(mine.view(np.uint8), np.asarray(theirs).view(np.uint8))


@pytest.mark.parametrize(
    ("to", "dtype"),
    [(TensorProto.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz),
     (TensorProto.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz)],
)  # fmt: skip
def test_cast_fnuz_saturation_table(to, dtype):
    x = np.array([np.inf, -np.inf, 1e9, -1e9, 0.3, -0.0, np.nan], np.float32)
    top = float(ml_dtypes.finfo(dtype).max)
    sat = ours(node_model("Cast", {"x": x}, opset=19, to=to, saturate=1), {"x": x})[0]
    want = np.array([top, -top, top, -top, 0.3, 0, np.nan], dtype).astype(np.float32)
    np.testing.assert_array_equal(sat.astype(np.float32), want)
    raw = ours(node_model("Cast", {"x": x}, opset=19, to=to, saturate=0), {"x": x})[0]
    assert np.isnan(raw.astype(np.float32)[[0, 1, 2, 3, 6]]).all()
    assert raw.view(np.uint8)[5] == 0  # no negative zero in FNUZ types


@pytest.mark.parametrize("src", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.float16])
def test_cast_from_small_floats_numpy(src):
    x = np.array([0.5, -3.0, 7.25, 100.0, -0.0], np.float32).astype(src)
    for to, want in ((TensorProto.FLOAT, np.float32), (TensorProto.INT32, np.int32),
                     (TensorProto.STRING, object), (TensorProto.BOOL, np.bool_)):  # fmt: skip
        (y,) = ours(node_model("Cast", {"x": x}, opset=21, to=to), {"x": x})
        f = x.astype(np.float32)
        expected = {object: np.array([f"{v:.8g}" for v in f.tolist()], object)}.get(want)
        np.testing.assert_array_equal(y, f.astype(want) if expected is None else expected)


@pytest.mark.parametrize(
    ("to", "dtype"),
    [(TensorProto.INT4, ml_dtypes.int4), (TensorProto.UINT4, ml_dtypes.uint4),
     (TensorProto.INT2, ml_dtypes.int2), (TensorProto.UINT2, ml_dtypes.uint2),
     (TensorProto.FLOAT4E2M1, ml_dtypes.float4_e2m1fn)],
)  # fmt: skip
def test_cast_packed_types(to, dtype):
    from onnx.reference import ReferenceEvaluator

    for x in (np.array([7, -3, 12, -9, 1, 0], np.int32),
              np.array([7.6, -3.5, 2.5, 0.25, 6.0, -100.0], np.float32)):  # fmt: skip
        model = node_model("Cast", {"x": x}, opset=25, to=to)
        (y,) = ours(model, {"x": x})
        (ref,) = ReferenceEvaluator(model).run(None, {"x": x})
        assert y.dtype == dtype
        np.testing.assert_array_equal(y.astype(np.float32), ref.astype(np.float32))
        back = ours(node_model("Cast", {"y": y}, opset=25, to=TensorProto.FLOAT), {"y": y})[0]
        np.testing.assert_array_equal(back, y.astype(np.float32))


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_e8m0(round_mode, saturate):
    from onnx.reference import ReferenceEvaluator

    normal = np.array([1.0, 1.5, 1.4, 1.6, 3.0, 0.75, 1024.0, 1e-20, 7e25], np.float32)
    model = node_model("Cast", {"x": normal}, opset=25, to=TensorProto.FLOAT8E8M0,
                       saturate=saturate, round_mode=round_mode)  # fmt: skip
    (y,) = ours(model, {"x": normal})
    (ref,) = ReferenceEvaluator(model).run(None, {"x": normal})
    assert y.dtype == ml_dtypes.float8_e8m0fnu
    np.testing.assert_array_equal(y.view(np.uint8), ref.view(np.uint8))
    special = np.array([0.0, np.nan, np.inf, 2.0**127 * 1.9], np.float32)  # spec's table
    model = node_model("Cast", {"x": special}, opset=25, to=TensorProto.FLOAT8E8M0,
                       saturate=saturate, round_mode=round_mode)  # fmt: skip
    (y,) = ours(model, {"x": special})
    want = [0, 255, 254, 254] if saturate else [255, 255, 255, 255]
    if round_mode == "down":
        want[3] = 254
    np.testing.assert_array_equal(y.view(np.uint8), want)


@pytest.mark.parametrize("opset", [15, 19, 21])
@pytest.mark.parametrize(
    ("src", "dst"),
    [(np.float32, np.int64), (np.int32, np.float16), (np.float64, np.float32),
     (np.float32, object), (object, np.float64), (np.bool_, np.float32), (np.int8, np.int8)],
)  # fmt: skip
def test_cast_like(opset, src, dst):
    x = values_for(src) if src is not object else np.array(["1.5", "-2", "NaN"], dtype=object)
    target = np.array(["a"], dtype=object) if dst is object else np.zeros(1, dst)
    assert_matches_ort(
        node_model("CastLike", {"x": x, "t": target}, opset=opset), {"x": x, "t": target}
    )
    if dst is not object:
        model = node_model("CastLike", {"x": x}, opset=opset, initializers={"t": target})
        assert_matches_ort(model, {"x": x})


def test_cast_like_saturate():
    x = np.array([1e6, -1e6, 0.3], np.float32)
    t = np.zeros(1, ml_dtypes.float8_e4m3fn)
    for saturate, want in ((1, [448, -448, 0.3125]), (0, [np.nan, np.nan, 0.3125])):
        model = node_model("CastLike", {"x": x, "t": t}, opset=19, saturate=saturate)
        (y,) = ours(model, {"x": x, "t": t})
        np.testing.assert_array_equal(y.astype(np.float32), want)
