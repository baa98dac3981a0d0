"""Pooling kernels against onnxruntime (numpy/float32 where onnxruntime can't)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.testing import assert_matches_ort, node_model, run_ort

TOL = {np.float32: {"rtol": 1e-5, "atol": 1e-5}, np.float16: {"rtol": 1e-2, "atol": 1e-2}}

# (id, X shape, attributes); windowed pools share these.
CASES = [
    ("k3", (1, 3, 7, 7), {"kernel_shape": [3, 3]}),
    ("k2s2", (2, 3, 8, 7), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("asym_pads", (2, 3, 8, 7), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1]}),
    (
        "ceil_pads",
        (2, 3, 8, 7),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    ("ceil", (2, 3, 9, 7), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    (
        "ceil_asym",
        (2, 3, 9, 7),
        {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [0, 1, 1, 0], "ceil_mode": 1},
    ),
    (
        "same_upper",
        (1, 3, 9, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    ),
    (
        "same_lower",
        (1, 3, 9, 8),
        {"kernel_shape": [4, 3], "strides": [2, 3], "auto_pad": "SAME_LOWER"},
    ),
    ("valid", (1, 3, 9, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    (
        "dilations",
        (1, 3, 10, 9),
        {"kernel_shape": [3, 2], "strides": [1, 2], "dilations": [2, 3], "pads": [1, 1, 2, 1]},
    ),
    (
        "dilations_ceil",
        (1, 3, 10, 9),
        {"kernel_shape": [3, 2], "strides": [2, 2], "dilations": [2, 2], "ceil_mode": 1},
    ),
    ("pool1d", (2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    (
        "pool3d",
        (1, 2, 6, 7, 5),
        {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1], "pads": [0, 1, 1, 1, 0, 0]},
    ),
    (
        "pool3d_ceil",
        (1, 2, 6, 7, 5),
        {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "ceil_mode": 1},
    ),
    ("identity", (1, 2, 6, 7), {"kernel_shape": [1, 1]}),
]
IDS = [c[0] for c in CASES]


def sample(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        lo = np.iinfo(dtype).min
        return rng.integers(lo, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def check(op, x, attrs, dtype, opset=21, n_outputs=1):
    model = node_model(op, {"x": x}, n_outputs=n_outputs, opset=opset, **attrs)
    tol = TOL.get(dtype, TOL[np.float32])
    return assert_matches_ort(model, {"x": x}, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint8])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_max_pool(case, dtype):
    _, shape, attrs = case
    x = sample(shape, dtype)
    check("MaxPool", x, attrs, dtype)
    check("MaxPool", x, attrs, dtype, n_outputs=2)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_max_pool_indices_column_major(case):
    _, shape, attrs = case
    check(
        "MaxPool",
        sample(shape, np.float32, 1),
        {**attrs, "storage_order": 1},
        np.float32,
        n_outputs=2,
    )


@pytest.mark.parametrize("opset", [1, 8, 10, 12, 22])
def test_max_pool_opsets(opset):
    x = sample((2, 3, 8, 7), np.float32)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}
    if opset >= 10:
        attrs.update(ceil_mode=1)
    check("MaxPool", x, attrs, np.float32, opset=opset, n_outputs=1 if opset < 8 else 2)


def test_max_pool_ties_pick_first_in_scan_order():
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 1::2, 1::2] = 1.0
    check("MaxPool", x, {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}, np.float32, n_outputs=2)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_average_pool(case, dtype, include_pad):
    _, shape, attrs = case
    check("AveragePool", sample(shape, dtype), {**attrs, "count_include_pad": include_pad}, dtype)


@pytest.mark.parametrize("opset", [1, 7, 10, 11, 19, 22])
def test_average_pool_opsets(opset):
    x = sample((2, 3, 8, 7), np.float32)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}
    if opset >= 7:
        attrs.update(count_include_pad=1)
    if opset >= 10:
        attrs.update(ceil_mode=1)
    if opset >= 19:
        attrs.update(dilations=[1, 2])
    if opset == 1:  # no onnxruntime kernel for AveragePool-1: same node at opset 7
        model = node_model("AveragePool", {"x": x}, opset=1, **attrs)
        ours = InferenceSession.builder().from_graph(model).run({"x": x})[0]
        ref = run_ort(node_model("AveragePool", {"x": x}, opset=7, **attrs), {"x": x})[0]
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)
    else:
        check("AveragePool", x, attrs, np.float32, opset=opset)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_lp_pool(case, dtype, p):
    _, shape, attrs = case
    check("LpPool", sample(shape, dtype), {**attrs, "p": p}, dtype)


@pytest.mark.parametrize("opset", [2, 11, 18])
def test_lp_pool_opsets(opset):
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "p": 3}
    if opset >= 18:
        attrs.update(ceil_mode=1, dilations=[1, 2])
    check("LpPool", sample((2, 3, 8, 7), np.float32), attrs, np.float32, opset=opset)


def test_lp_pool_opset1_float_p():
    """LpPool-1 (float p) has no onnxruntime kernel: compare to a numpy expression."""
    x = sample((1, 2, 6, 6), np.float32)
    model = node_model("LpPool", {"x": x}, opset=1, kernel_shape=[2, 2], strides=[2, 2], p=2.5)
    ours = InferenceSession.builder().from_graph(model).run({"x": x})[0]
    win = np.abs(x).reshape(1, 2, 3, 2, 3, 2) ** 2.5
    np.testing.assert_allclose(ours, win.sum(axis=(3, 5)) ** (1 / 2.5), rtol=1e-5)


GLOBAL_SHAPES = [(2, 3, 5, 6), (1, 4, 7), (1, 2, 3, 4, 5), (2, 3, 1, 1)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", GLOBAL_SHAPES)
@pytest.mark.parametrize(
    ("op", "attrs", "opset"),
    [
        ("GlobalAveragePool", {}, 21),
        ("GlobalMaxPool", {}, 21),
        ("GlobalLpPool", {}, 21),
        ("GlobalLpPool", {"p": 3}, 21),
        ("GlobalLpPool", {"p": 1}, 21),
        ("GlobalAveragePool", {}, 1),
        ("GlobalMaxPool", {}, 1),
        ("GlobalLpPool", {}, 2),
    ],
)
def test_global_pools(op, attrs, opset, shape, dtype):
    if dtype == np.float16 and opset < 21:
        pytest.skip("onnxruntime has no float16 kernel at this opset")
    check(op, sample(shape, dtype), attrs, dtype, opset=opset)


@pytest.mark.parametrize("opset", [1, 22])
def test_global_pools_numpy_reference(opset):
    """Versions / types onnxruntime lacks (GlobalLpPool-1 float p, -22; float64)."""
    x = sample((2, 3, 4, 5), np.float64)
    p_attr = {"p": 3.0} if opset == 1 else {"p": 3}
    expect = {
        "GlobalAveragePool": x.mean(axis=(2, 3), keepdims=True),
        "GlobalMaxPool": x.max(axis=(2, 3), keepdims=True),
        "GlobalLpPool": (np.abs(x) ** 3).sum(axis=(2, 3), keepdims=True) ** (1 / 3),
    }
    for op, want in expect.items():
        attrs = p_attr if op == "GlobalLpPool" else {}
        model = node_model(op, {"x": x}, opset=opset, **attrs)
        ours = InferenceSession.builder().from_graph(model).run({"x": x})[0]
        assert ours.dtype == np.float64
        np.testing.assert_allclose(ours, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
def test_bfloat16_pools(op):
    """bfloat16 (opset 22): compare to onnxruntime's float32 result on the same values."""
    x = sample((1, 3, 6, 7), np.float32).astype(ml_dtypes.bfloat16)
    attrs = {} if op.startswith("Global") else {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1]}
    model = node_model(op, {"x": x}, opset=22, **attrs)
    ours = InferenceSession.builder().from_graph(model).run({"x": x})[0]
    x32 = x.astype(np.float32)
    expected = run_ort(node_model(op, {"x": x32}, **attrs), {"x": x32})[0]
    assert ours.dtype == x.dtype
    np.testing.assert_allclose(ours.astype(np.float32), expected, rtol=1e-2, atol=1e-2)


def test_pools_dynamic_shapes_reuse_session():
    from onnx import helper

    from onnxkiln.testing import make_model, tensor_info

    node = helper.make_node(
        "MaxPool",
        ["x"],
        ["y", "i"],
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
        ceil_mode=1,
    )
    model = make_model(
        [node],
        [tensor_info("x", np.float32, [None, 2, None, None])],
        [
            tensor_info("y", np.float32, [None, 2, None, None]),
            tensor_info("i", np.int64, [None, 2, None, None]),
        ],
    )
    session = InferenceSession.builder().from_graph(model)
    for shape in [(1, 2, 8, 8), (2, 2, 5, 9), (1, 2, 8, 8)]:
        x = sample(shape, np.float32, seed=shape[3])
        for a, b in zip(session.run({"x": x}), run_ort(model, {"x": x})):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(
    ("pooled", "scale"), [([2, 2], 1.0), ([3, 4], 0.5), ([7, 7], 1.0), ([2, 3], 2.0)]
)
def test_max_roi_pool(pooled, scale, dtype):
    x = sample((2, 3, 12, 10), dtype)
    rois = np.array(
        [
            [0, 1, 1, 6, 8],
            [1, 0, 0, 9, 11],
            [1, 2.4, 3.5, 3.6, 3.2],
            [0, 7, 2, 20, 30],
            [1, -3, -2, 4, 5],
            [0, 5, 5, 5, 5],
        ],
        dtype,
    )
    feeds = {"x": x, "rois": rois}
    model = node_model("MaxRoiPool", feeds, pooled_shape=pooled, spatial_scale=scale)
    assert_matches_ort(model, feeds, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(
    ("shape", "attrs", "give_shape"),
    [
        ((2, 3, 6, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}, False),
        ((2, 3, 7, 7), {"kernel_shape": [2, 2], "strides": [2, 2]}, True),
        ((1, 2, 6, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 1, 0, 0]}, False),
        ((1, 2, 9), {"kernel_shape": [3], "strides": [3]}, False),
    ],
)
def test_max_unpool_roundtrip(shape, attrs, give_shape, dtype):
    x = sample(shape, dtype)
    y, idx = run_ort(node_model("MaxPool", {"x": x}, n_outputs=2, **attrs), {"x": x})
    feeds = {"y": y, "i": idx}
    inits = {"s": np.array(shape, np.int64)} if give_shape else None
    model = node_model("MaxUnpool", feeds, initializers=inits, **attrs)
    assert_matches_ort(model, feeds, rtol=0, atol=0)


def test_max_unpool_bad_index_raises():
    feeds = {"y": np.ones((1, 1, 2, 2), np.float32), "i": np.array([[[[0, 1], [2, 99]]]])}
    model = node_model("MaxUnpool", feeds, kernel_shape=[2, 2], strides=[2, 2])
    with pytest.raises(Exception, match="indices must lie in") as info:
        InferenceSession.builder().from_graph(model).run(feeds)
    # the executor wraps kernel errors in KernelError; the kernel's own type is the cause
    assert isinstance(info.value, IndexError) or isinstance(info.value.__cause__, IndexError)
