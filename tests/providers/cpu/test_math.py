"""Elementwise math, comparison, logic and bitwise kernels against onnxruntime (and numpy)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxkiln.errors import KernelError
from onnxkiln.testing import assert_matches_ort, node_model
from onnxkiln.testing import run_ours as ours

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

F32, F16, F64 = np.float32, np.float16, np.float64
BF16 = ml_dtypes.bfloat16
TOL = {F32: (1e-5, 1e-6), F64: (1e-12, 1e-12), F16: (1e-3, 1e-3)}



def rand(dtype, shape, lo=-3.0, hi=3.0, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        lo = 0 if np.dtype(dtype).kind == "u" else int(lo * 4)
        return np.asarray(rng.integers(lo, int(hi * 4) + 1, size=shape), dtype)
    return np.asarray(rng.uniform(lo, hi, size=shape), dtype)


def check(op, feeds, dtype=F32, opset=21, rtol=None, atol=None, **attrs):
    r, a = TOL.get(dtype, (0, 0))
    model = node_model(op, feeds, opset=opset, **attrs)
    return assert_matches_ort(model, feeds, rtol if rtol is not None else r, atol or a)


# ---------------------------------------------------------------------------- unary
UNARY_DOMAIN = {
    "Neg": (-3, 3),
    "Abs": (-3, 3),
    "Sqrt": (0.1, 4),
    "Exp": (-5, 5),
    "Log": (0.1, 9),
    "Reciprocal": (0.5, 4),
    "Floor": (-3, 3),
    "Ceil": (-3, 3),
    "Round": (-3, 3),
    "Sign": (-3, 3),
    "Sin": (-3, 3),
    "Cos": (-3, 3),
    "Tan": (-1.2, 1.2),
    "Asin": (-0.99, 0.99),
    "Acos": (-0.99, 0.99),
    "Atan": (-3, 3),
    "Sinh": (-3, 3),
    "Cosh": (-3, 3),
    "Asinh": (-3, 3),
    "Acosh": (1.01, 4),
    "Atanh": (-0.99, 0.99),
    "Erf": (-3, 3),
}
F64_OPS = {"Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal", "Floor", "Ceil", "Round", "Sign"}
F64_OPS |= {"Sin", "Cos"}


@pytest.mark.parametrize("op", sorted(UNARY_DOMAIN))
@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("shape", [(2, 3, 4), (), (0, 3)])
def test_unary_float(op, dtype, shape):
    if dtype is F64 and op not in F64_OPS:
        pytest.skip("onnxruntime has no float64 kernel")
    lo, hi = UNARY_DOMAIN[op]
    check(op, {"x": rand(dtype, shape, lo, hi)}, dtype)


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_unary_int(op, dtype):
    if op == "Neg" and np.dtype(dtype).kind == "u":
        pytest.skip("Neg has no unsigned types")
    check(op, {"x": rand(dtype, (3, 5))}, dtype)


@pytest.mark.parametrize("opset", [6, 13, 22])
@pytest.mark.parametrize("op", ["Exp", "Sqrt", "Sin", "Floor"])
def test_unary_opsets(op, opset):
    if op == "Sin" and opset < 7:
        opset = 7
    check(op, {"x": rand(F32, (4, 4), 0.1, 3)}, opset=opset)


def test_round_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49, 3.51], F32)
    (y,) = check("Round", {"x": x})
    np.testing.assert_array_equal(y, [0, 2, 2, -0, -2, -2, 0, 4])


@pytest.mark.parametrize("op", ["Exp", "Sqrt", "Erf", "Sin", "Abs", "Neg", "Round", "Sign"])
def test_unary_bfloat16(op):
    x = rand(F32, (3, 4), 0.1, 2).astype(BF16)
    (y,) = ours(node_model(op, {"x": x}), {"x": x})
    ref = {"Erf": None, "Round": np.rint, "Sign": np.sign, "Abs": np.abs, "Neg": np.negative}
    fn = ref.get(op) or getattr(np, op.lower(), None)
    if op == "Erf":
        import scipy.special

        fn = scipy.special.erf
    assert y.dtype == BF16
    np.testing.assert_allclose(y.astype(F32), fn(x.astype(F32)), rtol=1e-2)


def test_erf_float16_via_float32():
    x = np.linspace(-3, 3, 41).astype(F16)
    (y,) = check("Erf", {"x": x}, F16)
    assert y.dtype == F16


# ---------------------------------------------------------------------------- binary
SHAPES = [((3, 1), (1, 4)), ((2, 3, 4), ()), ((), ()), ((4,), (2, 3, 4)), ((0, 3), (1, 3))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int32, np.int64, np.int8, np.uint8])
@pytest.mark.parametrize("shapes", SHAPES)
def test_arith(op, dtype, shapes):
    a = rand(dtype, shapes[0], seed=1)
    b = rand(dtype, shapes[1], 0.5, 3, seed=2)
    if op == "Div":
        b = np.where(b == 0, np.ones((), dtype), b).astype(dtype)
    check(op, {"a": a, "b": b}, dtype)


@pytest.mark.parametrize("opset", [7, 13, 14])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_arith_opsets(op, opset):
    check(op, {"a": rand(F32, (2, 3)), "b": rand(F32, (3,), 1, 2)}, opset=opset)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_int_div_truncates(dtype):
    a = np.array([7, -7, 7, -7, 0, 6, -6, 1, -1], dtype)
    b = np.array([2, 2, -2, -2, 3, 3, -4, 5, 5], dtype)
    (y,) = check("Div", {"a": a, "b": b}, dtype)
    np.testing.assert_array_equal(y, [3, -3, -3, 3, 0, 2, 1, 0, 0])


@pytest.mark.parametrize("op", ["Div", "Mod"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint8])
def test_int_division_by_zero_raises(op, dtype):
    a, b = np.array([1, 2], dtype), np.array([1, 0], dtype)
    with pytest.raises(KernelError, match="integer division by zero") as info:
        ours(node_model(op, {"a": a, "b": b}), {"a": a, "b": b})
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("opset", [1, 6])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow"])
def test_legacy_broadcast_axis(op, opset):
    a = rand(F32, (2, 3, 4, 5), 0.5, 2)
    b = rand(F32, (3, 4), 0.5, 2, seed=3)
    model = node_model(op, {"a": a, "b": b}, opset=opset, broadcast=1, axis=1)
    (y,) = ours(model, {"a": a, "b": b})
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
    ref = fn.get(op, np.power)(a, b[:, :, None])
    np.testing.assert_allclose(y, ref, rtol=1e-6)
    assert y.dtype == F32


def test_legacy_broadcast_suffix_and_compare():
    a, b = rand(F32, (2, 3)), rand(F32, (3,), seed=4)
    for op, fn in (("Add", np.add), ("Greater", np.greater), ("Equal", np.equal)):
        (y,) = ours(node_model(op, {"a": a, "b": b}, opset=1, broadcast=1), {"a": a, "b": b})
        np.testing.assert_array_equal(y, fn(a, b))


# ---------------------------------------------------------------------------- Pow
@pytest.mark.parametrize(
    ("tx", "te"),
    [
        *[(F32, F32), (F32, np.int64), (F32, np.int32), (F16, F16), (F16, F32), (F64, F32)],
        *[(np.int32, np.int32), (np.int64, np.int64), (np.int32, F32), (np.int64, F32)],
    ],
)
@pytest.mark.parametrize("shapes", [((3, 1), (1, 4)), ((2, 3), ()), ((), ())])
def test_pow_types(tx, te, shapes):
    rng = np.random.default_rng(5)
    x = rng.uniform(0.5, 3, size=shapes[0])
    e = rng.uniform(0, 2.5, size=shapes[1])
    if np.dtype(tx).kind == "i":
        x = np.round(x * 2)
    if np.dtype(te).kind == "i":
        e = np.round(e)
    x, e = np.asarray(x, tx), np.asarray(e, te)
    check("Pow", {"x": x, "e": e}, tx if tx in TOL else F32, opset=15, rtol=1e-5)


@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("exponent", [1.0, 2.0, 3.0, 0.5, -1.0])
@pytest.mark.parametrize("eshape", [(), (1,), (1, 1, 1)])
def test_pow_const_exponent(dtype, exponent, eshape):
    x = rand(dtype, (2, 3), -2, 2)
    if exponent == 0.5:
        x = np.abs(x)
    e = np.full(eshape, exponent, dtype)
    model = node_model("Pow", {"x": x}, initializers={"e": e})
    r, a = TOL[dtype]
    (y,) = assert_matches_ort(model, {"x": x}, r * 2, a)
    assert y.dtype == dtype


@pytest.mark.parametrize("opset", [7, 12, 13])
def test_pow_opsets(opset):
    check("Pow", {"x": rand(F32, (3, 4), 0.5, 2), "e": rand(F32, (4,), 0, 2)}, opset=opset)


# ---------------------------------------------------------------------------- Mod
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_int(dtype, fmod):
    a = np.array([7, -7, 7, -7, 0, 6, 13, 100], dtype=np.int64)
    b = np.array([3, 3, -3, -3, 5, 4, -5, 7], dtype=np.int64)
    if np.dtype(dtype).kind == "u":
        a, b = np.abs(a), np.abs(b)
    check("Mod", {"a": a.astype(dtype), "b": b.astype(dtype)}, dtype, fmod=fmod)


@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("shapes", [((3, 1), (1, 4)), ((2, 3), ())])
def test_mod_float_fmod(dtype, shapes):
    a = rand(dtype, shapes[0], -5, 5)
    b = rand(dtype, shapes[1], 0.5, 2, seed=7)
    check("Mod", {"a": a, "b": b}, dtype, fmod=1)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_mod_float_floor_opset28(dtype):
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, -0.0, 1.0, -1.0], dtype)
    b = np.array([2.0, 2.0, -2.0, -2.0, -3.0, 3.0, np.inf, np.inf], dtype)
    (y,) = check("Mod", {"a": a, "b": b}, dtype, opset=28, fmod=0)
    np.testing.assert_array_equal(y, [1.5, 0.5, -0.5, -1.5, -0.0, 0.0, 1.0, np.inf])
    assert np.signbit(y[4]) and not np.signbit(y[5])


# ---------------------------------------------------------------------------- variadic
@pytest.mark.parametrize("op", ["Min", "Max", "Sum", "Mean"])
@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize(
    "shapes", [[(2, 3)], [(3, 1), (1, 4)], [(2, 3, 4), (4,), ()], [(0, 2), (1, 2)]]
)
def test_variadic(op, dtype, shapes):
    feeds = {f"x{i}": rand(dtype, s, seed=i) for i, s in enumerate(shapes)}
    check(op, feeds, dtype)


@pytest.mark.parametrize("op", ["Min", "Max"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_min_max_int(op, dtype):
    feeds = {f"x{i}": rand(dtype, (2, 5), seed=i) for i in range(3)}
    check(op, feeds, dtype)


@pytest.mark.parametrize("op", ["Min", "Max"])
def test_min_max_nan_propagates(op):
    a = np.array([1.0, np.nan, 3.0, np.nan], F32)
    b = np.array([np.nan, 2.0, 1.0, np.nan], F32)
    (y,) = check(op, {"a": a, "b": b})
    assert np.isnan(y[[0, 1, 3]]).all()


@pytest.mark.parametrize("opset", [6, 8, 13])
@pytest.mark.parametrize("op", ["Sum", "Mean", "Max"])
def test_variadic_opsets(op, opset):
    feeds = {f"x{i}": rand(F32, (2, 3), seed=i) for i in range(3)}
    check(op, feeds, opset=opset)


def test_mean_bfloat16():
    xs = [rand(F32, (2, 3), seed=i).astype(BF16) for i in range(3)]
    feeds = {f"x{i}": x for i, x in enumerate(xs)}
    (y,) = ours(node_model("Mean", feeds), feeds)
    assert y.dtype == BF16
    ref = sum(x.astype(F32) for x in xs) / 3
    np.testing.assert_allclose(y.astype(F32), ref, rtol=1e-2)


# ---------------------------------------------------------------------------- compare / logic
CMP = ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]


@pytest.mark.parametrize("op", CMP)
@pytest.mark.parametrize("dtype", [F32, F16, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("shapes", SHAPES)
def test_compare(op, dtype, shapes):
    a = np.asarray(np.round(rand(dtype, shapes[0], seed=1)), dtype)
    b = np.asarray(np.round(rand(dtype, shapes[1], seed=2)), dtype)
    (y,) = check(op, {"a": a, "b": b}, dtype)
    assert y.dtype == np.bool_


@pytest.mark.parametrize("opset", [7, 9, 13])
@pytest.mark.parametrize("op", ["Equal", "Less", "Greater"])
def test_compare_opsets(op, opset):
    dtype = np.int32 if opset < 11 and op == "Equal" else F32
    a, b = np.round(rand(dtype, (3, 4))), np.round(rand(dtype, (4,), seed=3))
    check(op, {"a": a, "b": b}, opset=opset)


def test_equal_bool_and_string():
    a, b = np.array([True, False, True]), np.array([True, True, False])
    check("Equal", {"a": a, "b": b})
    s = np.array(["ab", "c", ""], dtype=object)
    t = np.array(["ab", "d", ""], dtype=object)
    (y,) = check("Equal", {"a": s, "b": t}, opset=19)
    np.testing.assert_array_equal(y, [True, False, True])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("opset", [7, 21])
def test_logic(op, shapes, opset):
    a = np.asarray(rand(np.int32, shapes[0], seed=1) > 0)
    b = np.asarray(rand(np.int32, shapes[1], seed=2) > 0)
    check(op, {"a": a, "b": b}, opset=opset)


def test_not():
    x = rand(np.int32, (3, 4)) > 0
    (y,) = check("Not", {"x": x})
    np.testing.assert_array_equal(y, ~x)


# ---------------------------------------------------------------------------- predicates
SPECIAL = np.array([1.0, -np.inf, np.inf, np.nan, 0.0, -2.5], F32)


@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_isnan(dtype):
    (y,) = check("IsNaN", {"x": SPECIAL.astype(dtype)}, dtype)
    assert y.dtype == np.bool_


@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize(("neg", "pos"), [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_isinf(dtype, neg, pos):
    x = SPECIAL.astype(dtype)
    check("IsInf", {"x": x}, dtype, detect_negative=neg, detect_positive=pos)


@pytest.mark.parametrize("dtype", [BF16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_isnan_isinf_small_floats(dtype):
    x = SPECIAL.astype(dtype)
    ref = SPECIAL.astype(dtype).astype(F32)
    (nan,) = ours(node_model("IsNaN", {"x": x}, opset=20), {"x": x})
    np.testing.assert_array_equal(nan, np.isnan(ref))
    model = node_model("IsInf", {"x": x}, opset=20, detect_negative=0)
    (inf,) = ours(model, {"x": x})
    np.testing.assert_array_equal(inf, ref == np.inf)


# ---------------------------------------------------------------------------- bits
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_unsigned(dtype, direction):
    x = np.array([[1, 2, 255], [16, 7, 128]], dtype)
    y = np.array([1, 3, 2], dtype)
    check("BitShift", {"x": x, "y": y}, dtype, opset=11, direction=direction)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_signed_opset28(dtype, direction):
    x = np.array([1, -8, 5, -128, 64, -1], dtype)
    y = np.array([1, 2, 3, 1, 0, 1], dtype)
    check("BitShift", {"x": x, "y": y}, dtype, opset=28, direction=direction)


def test_bitshift_out_of_range():
    x = np.array([1, -8, 5, -128], np.int8)
    s = np.array([8, 9, -1, 100], np.int8)
    feeds = {"x": x, "s": s}
    (left,) = ours(node_model("BitShift", feeds, opset=28, direction="LEFT"), feeds)
    (right,) = ours(node_model("BitShift", feeds, opset=28, direction="RIGHT"), feeds)
    np.testing.assert_array_equal(left, [0, 0, 0, 0])
    np.testing.assert_array_equal(right, [0, -1, 0, -1])
    assert left.dtype == right.dtype == np.int8


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
@pytest.mark.parametrize("shapes", [((3, 1), (1, 4)), ((2, 3), ())])
def test_bitwise(op, dtype, shapes):
    a, b = rand(dtype, shapes[0], seed=8), rand(dtype, shapes[1], seed=9)
    check(op, {"a": a, "b": b}, dtype, opset=18)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8, np.uint64])
def test_bitwise_not(dtype):
    check("BitwiseNot", {"x": rand(dtype, (2, 5))}, dtype, opset=18)


def test_pow_int_base_const_exponent():
    x = np.array([[-3, -2, 0, 1, 5]], np.int64)
    model = node_model("Pow", {"x": x}, initializers={"e": np.array(3, np.int64)})
    (y,) = assert_matches_ort(model, {"x": x})
    np.testing.assert_array_equal(y, x**3)


def test_erf_int_opset9():
    x = np.array([-9, -1, 0, 1, 9], np.int32)
    (y,) = ours(node_model("Erf", {"x": x}, opset=9), {"x": x})
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [-1, 0, 0, 0, 1])


@pytest.mark.parametrize(
    ("op", "dtype"),
    [("Div", np.int32), ("Div", F16), ("Erf", F16), ("Erf", BF16), ("Pow", F16), ("Sum", F16)],
)
def test_kernels_without_plan_time_dtypes(op, dtype):
    """Kernels built without input dtypes (unknown at plan time) pick the path per call."""
    from onnxkiln.dtypes import from_numpy
    from onnxkiln.providers.base import NodeInfo
    from onnxkiln.providers.cpu.registry import REGISTRY
    from onnxkiln.schema import schema_defaults as _schema_defaults

    n = 1 if op == "Erf" else 3 if op == "Sum" else 2
    xs = [np.asarray(rand(F32, (2, 3), 1, 3, seed=i), dtype) for i in range(n)]
    spec = REGISTRY.resolve("", op, 21)
    results = []
    for dts in ((None,) * n, (from_numpy(np.dtype(dtype)),) * n):
        info = NodeInfo(
            name="n",
            op_type=op,
            domain="",
            opset=21,
            attrs=_schema_defaults(op, "", 21),
            n_inputs=n,
            n_outputs=1,
            input_dtypes=dts,
            const_inputs=(None,) * n,
        )
        results.append(spec.build(info)(*xs))
    assert results[0].dtype == results[1].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(results[0], results[1])
