"""Reduce* and ArgMax/ArgMin kernels against onnxruntime (numpy where onnxruntime can't)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest

from onnxkiln import InferenceSession
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.registry import REGISTRY
from onnxkiln.testing import assert_matches_ort, node_model, run_ort

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]
DTYPES = [np.float32, np.float16, np.int32, np.int64]
LATEST = onnx.defs.onnx_opset_version()


def input_since(op: str) -> int:
    """First opset where axes is an input rather than an attribute."""
    return 13 if op == "ReduceSum" else 18


def sample(op: str, dtype, shape, seed: int = 0) -> np.ndarray:
    """Values that keep every op well defined (positive sums for LogSum, small products)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        if op == "ReduceLogSum":
            x = rng.uniform(0.1, 2.0, shape)
        elif op == "ReduceProd":
            x = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
        else:
            x = rng.standard_normal(shape) * 2
    elif op == "ReduceLogSum":
        x = rng.integers(1, 6, shape)
    elif op == "ReduceProd":
        x = rng.integers(-3, 4, shape)
    else:
        x = rng.integers(-9, 10, shape)
    return np.asarray(x).astype(dtype)


def tolerances(dtype) -> dict:
    if np.dtype(dtype) == np.float16:
        return {"rtol": 1e-3, "atol": 1e-3}
    return {"rtol": 1e-5, "atol": 1e-5}


def reduce_model(op, x, form, axes, opset=None, **attrs):
    """Model + feeds for `op` with axes as 'attr', 'const' (initializer) or 'input' (fed)."""
    feeds = {"x": x}
    if form == "attr":
        opset = opset or 11
        if axes is not None:
            attrs["axes"] = list(axes)
        return node_model(op, feeds, opset=opset, **attrs), feeds
    opset = opset or input_since(op)
    if axes is None:
        return node_model(op, feeds, opset=opset, **attrs), feeds
    axes_arr = np.array(axes, dtype=np.int64)
    if form == "const":
        model = node_model(
            op,
            feeds,
            opset=opset,
            initializers={"axes": axes_arr},
            input_names=["x", "axes"],
            **attrs,
        )
        return model, feeds
    feeds = {"x": x, "axes": axes_arr}
    return node_model(op, feeds, opset=opset, **attrs), feeds


# (form, axes, noop_with_empty_axes, keepdims)
AXES_CASES = [
    ("attr", [1], None, 0),
    ("attr", [-1], None, 1),
    ("attr", [0, 2], None, 0),
    ("attr", None, None, 1),
    ("attr", None, None, 0),
    ("const", [1], 0, 1),
    ("const", [-1], 0, 0),
    ("const", [0, 2], 0, 1),
    ("const", [-3, -1], 0, 0),
    ("const", [2, -1], 0, 1),  # duplicates name one axis
    ("const", None, 0, 0),
    ("const", None, 1, 1),
    ("const", [], 0, 1),
    ("const", [], 1, 0),
    ("input", [1], 0, 0),
    ("input", [-1, 0], 0, 1),
    ("input", [], 0, 0),
    ("input", [], 1, 1),
]


@pytest.mark.parametrize("case", AXES_CASES, ids=lambda c: f"{c[0]}-{c[1]}-noop{c[2]}-keep{c[3]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_matches_ort(op, dtype, case):
    form, axes, noop, keepdims = case
    x = sample(op, dtype, (2, 3, 4))
    attrs = {"keepdims": keepdims}
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    model, feeds = reduce_model(op, x, form, axes, **attrs)
    assert_matches_ort(model, feeds, **tolerances(dtype))


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize(
    ("form", "opset"),
    [("attr", 1), ("attr", 11), ("attr", 12), ("attr", 13), ("const", LATEST)],
)
def test_reduce_every_opset_form(op, form, opset):
    if form == "attr":
        opset = min(opset, input_since(op) - 1)  # ReduceSum takes axes as an input from 13
    if op in ("ReduceLogSum", "ReduceLogSumExp") and opset >= 28:
        dtypes = [np.float32]
    else:
        dtypes = [np.float32, np.int64]
    for dtype in dtypes:
        x = sample(op, dtype, (3, 2, 5), seed=opset)
        model, feeds = reduce_model(op, x, form, [0, -1], opset=opset, keepdims=0)
        assert_matches_ort(model, feeds)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_empty_tensor(op, dtype):
    # ReduceMean of an empty set: onnxruntime gives 0; Max/Min/LogSum*: -inf/+inf/dtype bounds
    x = np.zeros((2, 0, 3), dtype=dtype)
    for axes, keepdims in [([1], 1), ([0], 0), ([0, 2], 0), (None, 1)]:
        model, feeds = reduce_model(op, x, "const", axes, keepdims=keepdims)
        assert_matches_ort(model, feeds)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_scalar_input(op, keepdims):
    x = np.array(1.5, dtype=np.float32)
    for form, axes in [("attr", None), ("const", None), ("const", [])]:
        model, feeds = reduce_model(op, x, form, axes, keepdims=keepdims)
        (out,) = assert_matches_ort(model, feeds)
        assert out.shape == ()


@pytest.mark.parametrize(
    ("shape", "axes"),
    [
        ((64, 128), [1]),
        ((64, 128), [0]),
        ((64, 128), [0, 1]),
        ((4, 32, 64), [1, 2]),
        ((4, 32, 64), [0, 1]),
        ((4, 32, 64), [1]),
        ((4, 32, 64), [0, 2]),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceL2", "ReduceLogSumExp"])
def test_reduce_large(op, dtype, shape, axes):
    # big enough for the BLAS row/column-sum path
    x = sample(op, dtype, shape, seed=3)
    model, feeds = reduce_model(op, x, "const", axes, keepdims=0)
    tol = {"rtol": 2e-3, "atol": 1e-2} if dtype == np.float16 else {"rtol": 1e-4, "atol": 1e-4}
    assert_matches_ort(model, feeds, **tol)


def test_reduce_log_sum_exp_is_stable():
    x = np.array([[1000.0, 999.0, -1000.0], [-1000.0, -1001.0, -np.inf]], dtype=np.float32)
    x = np.concatenate([x, [[np.inf, 1.0, 2.0], [-np.inf, -np.inf, -np.inf]]]).astype(np.float32)
    model, feeds = reduce_model("ReduceLogSumExp", x, "const", [1], keepdims=0)
    (out,) = assert_matches_ort(model, feeds)
    np.testing.assert_allclose(out[:2], [1000.3132617, -999.6867383], rtol=1e-6)
    assert out[2] == np.inf and out[3] == -np.inf


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int_mean_truncates_toward_zero(dtype):
    x = np.array([[-7, 3, 2], [5, 4, -1], [-7, -3, -2], [-1, 0, 0]], dtype=dtype)
    for axes in ([1], [0], None):
        model, feeds = reduce_model("ReduceMean", x, "const", axes, keepdims=1)
        assert_matches_ort(model, feeds)
    model, feeds = reduce_model("ReduceMean", x, "const", [1], keepdims=0)
    (out,) = assert_matches_ort(model, feeds)
    np.testing.assert_array_equal(out, [0, 2, -4, 0])


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceLogSum", "ReduceLogSumExp"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int_transcendental_matches_ort(op, dtype):
    # truncation toward zero, log of a negative sum -> dtype min, exp(x - max) in the int type
    x = np.array([[-7, 3, 2], [5, 4, -1], [-5, -5, -5], [-1, -2, -3], [2, 2, 2]], dtype=dtype)
    for axes in ([1], [0]):
        model, feeds = reduce_model(op, x, "const", axes, keepdims=0)
        assert_matches_ort(model, feeds)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceProd", "ReduceSumSquare"])
def test_int32_saturates_like_ort(op):
    big = 2**31 - 1
    x = np.array([[big, 5], [big, big], [-(2**31), -1], [-big, -big]], dtype=np.int32)
    for axes in ([1], [0], None):
        model, feeds = reduce_model(op, x, "const", axes, keepdims=1)
        assert_matches_ort(model, feeds)


def test_int64_sum_is_exact():
    # onnxruntime goes through float64 here and returns 2**60; we keep int64 exact
    x = np.array([[2**60 + 1, 1]], dtype=np.int64)
    out = run_ours(*reduce_model("ReduceSum", x, "const", [1], keepdims=0))
    np.testing.assert_array_equal(out, [2**60 + 2])
    out = run_ours(*reduce_model("ReduceMean", x, "const", [1], keepdims=0))
    np.testing.assert_array_equal(out, [2**59 + 1])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_max_min_nan_like_ort(op, dtype):
    # A NaN in the first position wins, NaNs elsewhere are skipped. onnxruntime agrees on
    # short rows; on long rows its SIMD tree also drops some non-NaN neighbours of a
    # non-leading NaN, so there we only check where NaNs appear and use numpy for values.
    x = np.arange(12, dtype=dtype).reshape(4, 3)
    x[0, 0] = x[1, 1] = x[2, -1] = np.nan
    for axes in ([1], [0], None):
        model, feeds = reduce_model(op, x, "const", axes, keepdims=0)
        assert_matches_ort(model, feeds)
    x = np.arange(80, dtype=dtype).reshape(4, 20)
    x[0, 0] = x[1, 1] = x[2, -1] = np.nan
    model, feeds = reduce_model(op, x, "const", [1], keepdims=0)
    out = run_ours(model, feeds)
    theirs = run_ort(model, feeds)[0]
    np.testing.assert_array_equal(np.isnan(out), np.isnan(theirs))
    nan_skipping = np.nanmax if op == "ReduceMax" else np.nanmin
    np.testing.assert_array_equal(out[1:], nan_skipping(x[1:], axis=1))


@pytest.mark.parametrize("opset", [12, 18, 20])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float64])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_max_min_more_dtypes(op, dtype, opset):
    x = np.array([[1, 7, 3], [200 if dtype != np.int8 else -100, 0, 5]]).astype(dtype)
    form = "attr" if opset < 18 else "const"
    for axes in ([1], [0], None):
        model, feeds = reduce_model(op, x, form, axes, opset=opset, keepdims=0)
        assert_matches_ort(model, feeds)
    empty = np.zeros((2, 0), dtype=dtype)
    model, feeds = reduce_model(op, empty, form, [1], opset=opset, keepdims=0)
    assert_matches_ort(model, feeds)


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_max_min_wide_unsigned(op, dtype):
    # onnxruntime has no uint32/uint64 ReduceMax/ReduceMin kernel: compare with numpy
    x = np.array([[1, 7, 3], [2**32 - 1, 0, 5]]).astype(dtype)
    ref = np.max if op == "ReduceMax" else np.min
    for axes in ([1], [0]):
        out = run_ours(*reduce_model(op, x, "const", axes, keepdims=0))
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, ref(x, axis=tuple(axes)))
    out = run_ours(*reduce_model(op, np.zeros((2, 0), dtype), "const", [1], keepdims=0))
    info = np.iinfo(dtype)
    np.testing.assert_array_equal(out, [info.min if op == "ReduceMax" else info.max] * 2)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_max_min_bool(op):
    x = np.array([[True, False], [False, False], [True, True]])
    for axes in ([1], [0], None):
        model, feeds = reduce_model(op, x, "const", axes, opset=20, keepdims=1)
        assert_matches_ort(model, feeds)
    # onnxruntime refuses an empty bool reduction; the spec says the type's min (max for Min)
    empty = np.zeros((2, 0), dtype=bool)
    out = run_ours(*reduce_model(op, empty, "const", [1], opset=20, keepdims=0))
    np.testing.assert_array_equal(out, [op == "ReduceMin"] * 2)
    assert out.dtype == np.bool_


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_bfloat16_against_float32(op):
    x32 = sample(op, np.float32, (3, 4), seed=5)
    x = x32.astype(ml_dtypes.bfloat16)
    ref = run_ours(*reduce_model(op, x.astype(np.float32), "const", [1], keepdims=1))
    out = run_ours(*reduce_model(op, x, "const", [1], keepdims=1))
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------------------------------------
# ArgMax / ArgMin


@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("dtype", [*DTYPES, np.uint8, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_matches_ort(op, dtype, select_last_index):
    # few distinct values: plenty of ties
    x = np.random.default_rng(1).integers(0, 3, (3, 4, 5)).astype(dtype)
    for axis, keepdims in [(0, 1), (1, 0), (-1, 1), (-3, 0)]:
        model = node_model(
            op,
            {"x": x},
            opset=13,
            axis=axis,
            keepdims=keepdims,
            select_last_index=select_last_index,
        )
        (out,) = assert_matches_ort(model, {"x": x})
        assert out.dtype == np.int64


@pytest.mark.parametrize("opset", [1, 11, 12, LATEST])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_opsets_and_defaults(op, opset):
    x = np.array([[1, 3, 3, 0], [2, 2, 0, 0]], dtype=np.float32)
    (out,) = assert_matches_ort(node_model(op, {"x": x}, opset=opset), {"x": x})
    assert out.shape == (1, 4)
    (out,) = assert_matches_ort(node_model(op, {"x": x}, opset=opset, axis=-1), {"x": x})
    np.testing.assert_array_equal(out, [[1], [0]] if op == "ArgMax" else [[3], [2]])
    if opset >= 12:
        model = node_model(op, {"x": x}, opset=opset, axis=1, select_last_index=1, keepdims=0)
        (out,) = assert_matches_ort(model, {"x": x})
        np.testing.assert_array_equal(out, [2, 1] if op == "ArgMax" else [3, 3])


@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_nan_like_ort(op, dtype, select_last_index):
    for n in (3, 20):
        x = np.arange(4 * n, dtype=dtype).reshape(4, n)
        x[0, 0] = x[1, 1] = x[2, -1] = np.nan
        for axis in (0, 1):
            model = node_model(
                op, {"x": x}, opset=13, axis=axis, select_last_index=select_last_index
            )
            assert_matches_ort(model, {"x": x})


def test_arg_empty_other_axis():
    x = np.zeros((2, 0, 3), dtype=np.float32)
    (out,) = assert_matches_ort(node_model("ArgMax", {"x": x}, opset=13, axis=0), {"x": x})
    assert out.shape == (1, 0, 3)


def test_arg_bfloat16():
    x = np.array([[1, 3, 2], [5, 4, 5]], dtype=np.float32)
    out = run_ours(node_model("ArgMin", {"x": x}, opset=13, axis=1, keepdims=0), {"x": x})
    xb = x.astype(ml_dtypes.bfloat16)
    model = node_model("ArgMax", {"x": xb}, opset=13, axis=1, keepdims=0, select_last_index=1)
    np.testing.assert_array_equal(run_ours(model, {"x": xb}), [1, 2])
    np.testing.assert_array_equal(out, [0, 1])


# ---------------------------------------------------------------------------------------------
# kernels called directly: errors, no aliasing, runtime axes


def run_ours(model, feeds):
    return InferenceSession.builder().from_graph(model).run(dict(feeds))[0]


def build(op, opset, attrs, const_inputs=()):
    schema = onnx.defs.get_schema(op, opset)
    full = {
        name: onnx.helper.get_attribute_value(a.default_value)
        for name, a in schema.attributes.items()
        if a.default_value.type
    }
    full.update(attrs)
    n_inputs = max(1, len(const_inputs))
    info = NodeInfo(
        name="n",
        op_type=op,
        domain="",
        opset=opset,
        attrs=full,
        n_inputs=n_inputs,
        n_outputs=1,
        const_inputs=tuple(const_inputs),
    )
    return REGISTRY.resolve("", op, opset).build(info)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_out_of_range_axis_raises(op):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        build(op, 11, {"axes": [2]})(x)
    with pytest.raises(ValueError, match="axis -3 is out of range"):
        build(op, LATEST, {})(x, np.array([-3], np.int64))
    with pytest.raises(ValueError, match="axis 0 is out of range"):
        build(op, LATEST, {}, (None, np.array([0], np.int64)))(np.float32(1.0))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_errors(op):
    with pytest.raises(ValueError, match="out of range"):
        build(op, 13, {"axis": 2})(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="empty axis"):
        build(op, 13, {"axis": 1})(np.ones((2, 0), np.float32))
    with pytest.raises(ValueError, match="out of range"):
        build(op, 13, {})(np.array(1.0, np.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_noop_returns_fresh_array(op, dtype):
    x = sample(op, dtype, (2, 3))
    x.flags.writeable = False
    for kernel, args in [
        (build(op, LATEST, {"noop_with_empty_axes": 1}), (x,)),
        (build(op, LATEST, {"noop_with_empty_axes": 1}), (x, np.array([], np.int64))),
        (build(op, LATEST, {}), (x, np.array([0, 1], np.int64))),
    ]:
        out = np.asarray(kernel(*args))
        assert out.dtype == x.dtype
        assert not np.shares_memory(out, x)


def test_runtime_axes_change_between_calls():
    run = build("ReduceSum", 13, {"keepdims": 0})
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(run(x, np.array([0], np.int64)), x.sum(0))
    np.testing.assert_array_equal(run(x, np.array([2, 1], np.int64)), x.sum((1, 2)))
    np.testing.assert_array_equal(run(x, None), x.sum())
    np.testing.assert_array_equal(run(x[0], np.array([-1], np.int64)), x[0].sum(-1))


def scan_reference(x: np.ndarray, axis: int, largest: bool, last: bool):
    """Max/min and its index by a left-to-right scan (onnxruntime's NaN behaviour)."""
    moved = np.moveaxis(x, axis, -1)
    values = np.empty(moved.shape[:-1], x.dtype)
    index = np.empty(moved.shape[:-1], np.int64)
    for pos in np.ndindex(values.shape):
        row = moved[pos]
        best, at = row[0], 0
        for j in range(1, len(row)):
            better = row[j] > best if largest else row[j] < best
            if better or (last and row[j] == best):
                best, at = row[j], j
        values[pos], index[pos] = best, at
    return values, index


@pytest.mark.parametrize("largest", [True, False])
def test_nan_scan_semantics_on_strided_input(largest):
    rng = np.random.default_rng(7)
    base = rng.integers(0, 4, (5, 6, 7)).astype(np.float32)
    base[rng.random(base.shape) < 0.2] = np.nan
    x = base.transpose(2, 0, 1)[:, ::-1]  # not contiguous
    op = "ReduceMax" if largest else "ReduceMin"
    arg = "ArgMax" if largest else "ArgMin"
    for axis in range(3):
        reduce = build(op, 18, {"keepdims": 0}, (None, np.array([axis], np.int64)))
        ref_values, _ = scan_reference(x, axis, largest, last=False)
        np.testing.assert_array_equal(reduce(x, np.array([axis], np.int64)), ref_values)
        for last in (0, 1):
            idx = build(arg, 13, {"axis": axis, "keepdims": 0, "select_last_index": last})(x)
            np.testing.assert_array_equal(idx, scan_reference(x, axis, largest, bool(last))[1])
