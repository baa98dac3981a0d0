"""CUDA-provider torch kernels vs the numpy CPU provider: elementwise ops (torch CPU device)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import check_node  # noqa: E402

R = np.random.default_rng(0)
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_TYPES = [np.float32, np.float16, np.float64, BF16]


def rand(shape, dtype=np.float32, lo=-3.0, hi=3.0):
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return R.integers(int(max(lo, np.iinfo(dt).min)), int(hi) + 1, size=shape).astype(dt)
    if dt.kind == "b":
        return R.random(shape) < 0.5
    return R.uniform(lo, hi, size=shape).astype(np.float32).astype(dt)


SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((), (2, 2)),
          ((0, 3), (1, 3))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("shapes", SHAPES)
def test_binary_arith(op, dtype, shapes):
    a, b = rand(shapes[0], dtype, 1, 9), rand(shapes[1], dtype, 1, 9)
    if op == "Sub" and np.dtype(dtype) == np.uint8:
        a = a + np.uint8(10)
    check_node(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.float64, np.int8, np.int16])
def test_binary_arith_more_types(op, dtype):
    check_node(op, {"a": rand((2, 3), dtype, 1, 9), "b": rand((3,), dtype, 1, 9)})


def test_integer_div_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    (y,) = check_node("Div", {"a": a, "b": b})
    assert y.tolist() == [3, -3, -3, 3, 0]


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.int32])
def test_comparisons(op, dtype):
    a, b = rand((3, 4), dtype, -2, 2), rand((4,), dtype, -2, 2)
    a[0, :] = b
    check_node(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op):
    check_node(op, {"a": rand((3, 4), bool), "b": rand((1, 4), bool)})
    check_node("Not", {"x": rand((3, 4), bool)})


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
def test_bitwise(op):
    check_node(op, {"a": rand((3, 4), np.int32, -50, 50), "b": rand((4,), np.int32, -50, 50)})
    check_node("BitwiseNot", {"x": rand((5,), np.uint8, 0, 255)})


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_mod(fmod, dtype):
    if fmod == 0 and np.dtype(dtype).kind == "f":
        pytest.skip("fmod=0 is for integers")
    a, b = rand((4, 5), dtype, -9, 9), rand((5,), dtype, 1, 4)
    b[::2] = -b[::2]
    check_node("Mod", {"a": a, "b": b}, fmod=fmod)


@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float16, np.float32),
                                    (np.int32, np.int32), (np.int64, np.float32),
                                    (np.float32, np.int64)])
def test_pow(dtypes):
    a = rand((3, 4), dtypes[0], 1, 3)
    b = rand((4,), dtypes[1], 0, 3)
    check_node("Pow", {"a": a, "b": b}, rtol=1e-3 if np.dtype(dtypes[0]).kind == "f" else None,
               atol=1e-3)


def test_bit_shift():
    a, b = rand((6,), np.uint8, 0, 255), rand((6,), np.uint8, 0, 7)
    check_node("BitShift", {"a": a, "b": b}, direction="LEFT")
    check_node("BitShift", {"a": a, "b": b}, direction="RIGHT")


@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_variadic(op, n, dtype):
    feeds = {f"x{i}": rand([(2, 3), (3,), (1, 3)][i], dtype) for i in range(n)}
    check_node(op, feeds)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
def test_variadic_int(op):
    check_node(op, {"a": rand((2, 3), np.int64), "b": rand((3,), np.int64)})


UNARY = {
    "Neg": (-3, 3), "Abs": (-3, 3), "Sign": (-3, 3), "Relu": (-3, 3), "Sqrt": (0.1, 4),
    "Exp": (-3, 3), "Log": (0.1, 4), "Reciprocal": (0.5, 4), "Floor": (-3, 3),
    "Ceil": (-3, 3), "Round": (-3, 3), "Sin": (-3, 3), "Cos": (-3, 3), "Tan": (-1, 1),
    "Asin": (-0.9, 0.9), "Acos": (-0.9, 0.9), "Atan": (-3, 3), "Sinh": (-2, 2),
    "Cosh": (-2, 2), "Asinh": (-3, 3), "Acosh": (1.1, 3), "Atanh": (-0.9, 0.9),
    "Erf": (-3, 3), "Sigmoid": (-5, 5), "Tanh": (-3, 3), "Softsign": (-3, 3),
    "Softplus": (-5, 5), "Mish": (-3, 3), "IsNaN": (-3, 3), "IsInf": (-3, 3),
    "HardSwish": (-5, 5),
}
OPSETS = {"Mish": 18, "HardSwish": 14}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", FLOAT_TYPES)
def test_unary_float(op, dtype):
    lo, hi = UNARY[op]
    x = rand((3, 5), dtype, lo, hi)
    if op == "Round":
        x.reshape(-1)[:4] = np.array([0.5, 1.5, -2.5, 2.5]).astype(dtype)
    if op in ("IsNaN", "IsInf"):
        x.reshape(-1)[:3] = np.array([np.nan, np.inf, -np.inf]).astype(dtype)
    check_node(op, {"x": x}, opset=OPSETS.get(op, 21))


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign", "Relu"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_unary_int(op, dtype):
    check_node(op, {"x": rand((4, 3), dtype, -9, 9)})


@pytest.mark.parametrize("neg,pos", [(1, 0), (0, 1), (0, 0)])
def test_isinf_directions(neg, pos):
    x = np.array([np.inf, -np.inf, 1.0, np.nan], np.float32)
    check_node("IsInf", {"x": x}, detect_negative=neg, detect_positive=pos)


ACTS = [
    ("LeakyRelu", {"alpha": 0.2}, 16), ("Elu", {"alpha": 0.7}, 6),
    ("Selu", {"alpha": 1.5, "gamma": 1.1}, 6), ("Celu", {"alpha": 0.8}, 12),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 6), ("ThresholdedRelu", {"alpha": 0.5}, 10),
    ("Shrink", {"bias": 0.5, "lambd": 1.0}, 9), ("Gelu", {}, 20),
    ("Gelu", {"approximate": "tanh"}, 20), ("Swish", {"alpha": 1.3}, 24),
]


@pytest.mark.parametrize("op,attrs,opset", ACTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_activations(op, attrs, opset, dtype):
    check_node(op, {"x": rand((3, 4), dtype)}, opset=opset, **attrs)


@pytest.mark.parametrize("slope_shape", [(1,), (4,), (3, 1)])
def test_prelu(slope_shape):
    check_node("PRelu", {"x": rand((2, 3, 4)), "s": rand(slope_shape)})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset,axis", [(11, 1), (11, -1), (11, 0), (13, 1), (13, -1), (13, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_family(op, opset, axis, dtype):
    x = rand((2, 3, 4), dtype)
    if op == "Hardmax":
        x[0, 0, :2] = x.max()
    check_node(op, {"x": x}, opset=opset, axis=axis)


def test_clip_versions():
    x = rand((3, 4))
    check_node("Clip", {"x": x}, opset=6, min=-1.0, max=0.5)
    check_node("Clip", {"x": x}, opset=1, max=0.5)
    check_node("Clip", {"x": x}, opset=13, initializers={"lo": np.float32(-1),
                                                          "hi": np.float32(1)})
    check_node("Clip", {"x": x, "hi": np.array(0.2, np.float32)}, opset=13,
               input_names=["x", "", "hi"])
    check_node("Clip", {"x": x}, opset=13)
    check_node("Clip", {"x": rand((5,), np.int32, -9, 9), "lo": np.array(-2, np.int32),
                        "hi": np.array(3, np.int32)}, opset=13)
    # min > max gives max everywhere, as ONNX says
    check_node("Clip", {"x": x, "lo": np.array(2, np.float32), "hi": np.array(1, np.float32)})


@pytest.mark.parametrize("dtype", [np.float32, np.int64, bool, np.float16])
def test_where(dtype):
    check_node("Where", {"c": rand((3, 1), bool), "x": rand((3, 4), dtype),
                         "y": rand((4,), dtype)})


CASTS = [np.float32, np.float16, np.float64, BF16, np.int64, np.int32, np.int8, np.uint8, bool]


@pytest.mark.parametrize("src", CASTS)
@pytest.mark.parametrize("dst", CASTS)
def test_cast(src, dst):
    x = rand((2, 5), src, 0, 100)
    if np.dtype(src).kind == "f":
        x.reshape(-1)[:3] = np.array([0.0, -0.0, 1.75]).astype(src)
    to = int(__import__("onnx").helper.np_dtype_to_tensor_dtype(np.dtype(dst)))
    check_node("Cast", {"x": x}, to=to)


def test_cast_opset1_string_target_and_castlike():
    x = rand((3,), np.float32, -5, 5)
    check_node("CastLike", {"x": x, "t": np.zeros(1, np.int32)}, opset=15)
    check_node("Cast", {"x": x}, to=6, opset=6)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_bit_shift_signed_and_past_the_width(dtype):
    a = np.array([1, -8, 5, -1, 3], dtype)
    b = np.array([2, 1, 70, 99, -1], dtype)
    check_node("BitShift", {"a": a, "b": b}, direction="LEFT")
    check_node("BitShift", {"a": a, "b": b}, direction="RIGHT")


def test_swiglu():
    check_node("SwiGLU", {"a": rand((3, 4)), "b": rand((3, 4))}, opset=28, alpha=1.2)
