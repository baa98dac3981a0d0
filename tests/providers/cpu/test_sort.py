"""Sorting kernels (providers/cpu/sort.py): TopK and Unique."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.testing import check_node as check
from onnxkiln.testing import run_node as ours
from onnxkiln.testing import tensor_info

RNG = np.random.default_rng(11)
I64 = np.int64
BF16 = np.dtype(ml_dtypes.bfloat16)



def few_values(shape, dtype):
    """Values drawn from a small set, so that ties are common."""
    return RNG.integers(0, 5, shape).astype(dtype)


def topk_ref(x, k, axis, largest):
    """Numpy reference: stable order with ties broken by the lower index."""
    key = x.astype(np.float64) if x.dtype.kind in "fV" else x.astype(object)
    n = x.shape[axis]
    moved = np.moveaxis(key, axis, -1).reshape(-1, n)
    idx = np.array([sorted(range(n), key=lambda i, r=r: (-r[i] if largest else r[i], i))[:k]
                    for r in moved.tolist()], dtype=I64)  # fmt: skip
    idx = np.moveaxis(idx.reshape(*np.moveaxis(x, axis, -1).shape[:-1], k), -1, axis)
    return np.take_along_axis(x, idx, axis), idx


# TopK


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64,
                                   np.uint8, np.uint64, np.int8])  # fmt: skip
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize(("shape", "axis", "k"), [
    ((7,), 0, 3), ((3, 6), -1, 6), ((3, 6), 0, 2), ((2, 5, 4), 1, 0), ((2, 5, 4), -3, 1),
    ((4, 9), -2, 4),
])  # fmt: skip
def test_topk_matches_ort(dtype, largest, shape, axis, k):
    x = few_values(shape, dtype)
    if dtype not in (np.float16, np.uint8, np.uint64, np.int8):  # onnxruntime lacks these
        check("TopK", {"x": x}, {"k": np.array([k], I64)}, opset=11, n=2, axis=axis,
              largest=largest)  # fmt: skip
    for opset in (11, 24):
        vals, idx = ours("TopK", {"x": x, "k": np.array([k], I64)}, opset=opset, n=2,
                         axis=axis, largest=largest)  # fmt: skip
        want_vals, want_idx = topk_ref(x, k, axis, largest)
        assert vals.dtype == x.dtype and idx.dtype == I64
        np.testing.assert_array_equal(vals, want_vals)
        np.testing.assert_array_equal(idx, want_idx)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("ties", [False, True])
def test_topk_large_axis_small_k(dtype, largest, ties):
    # Exercises the partition path (k <= n / 8); ties straddling the cut fall back to a sort.
    x = (RNG.integers(0, 6, (5, 300)) if ties else RNG.permutation(1500).reshape(5, 300) % 256)
    x = x.astype(dtype)
    for k in (1, 7, 37):
        vals, idx = ours("TopK", {"x": x, "k": np.array([k], I64)}, opset=11, n=2,
                         largest=largest)  # fmt: skip
        want_vals, want_idx = topk_ref(x, k, 1, largest)
        np.testing.assert_array_equal(vals, want_vals)
        np.testing.assert_array_equal(idx, want_idx)
        t = np.ascontiguousarray(x.T)
        vals, idx = ours("TopK", {"x": t, "k": np.array([k], I64)}, opset=11, n=2, axis=0,
                         largest=largest)  # fmt: skip
        np.testing.assert_array_equal(idx, want_idx.T)


def test_topk_nan_and_empty():
    x = RNG.standard_normal((2, 100)).astype(np.float32)
    x[0, [3, 50]] = np.nan
    check("TopK", {"x": x, "k": np.array([5], I64)}, opset=11, n=2)
    check("TopK", {"x": x, "k": np.array([5], I64)}, opset=11, n=2, largest=0)
    vals, idx = ours("TopK", {"x": np.zeros((0, 4), np.float32), "k": np.array([2], I64)},
                     opset=11, n=2)  # fmt: skip
    assert vals.shape == idx.shape == (0, 2)
    vals, idx = ours("TopK", {"x": np.zeros((3, 0), np.float32), "k": np.array([0], I64)},
                     opset=11, n=2)  # fmt: skip
    assert vals.shape == idx.shape == (3, 0)


@pytest.mark.parametrize("opset", [1, 10, 11, 24])
def test_topk_opsets(opset):
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    x[:, 2] = x[:, 5]  # ties
    if opset == 1:
        check("TopK", {"x": x}, opset=1, n=2, k=3, axis=1)
        check("TopK", {"x": x}, opset=1, n=2, k=2, axis=0)
    elif opset == 10:
        check("TopK", {"x": x, "k": np.array([3], I64)}, opset=10, n=2)
        check("TopK", {"x": x}, {"k": np.array([2], I64)}, opset=10, n=2, axis=-2)
    else:
        for largest in (0, 1):
            check("TopK", {"x": x, "k": np.array([4], I64)}, opset=opset, n=2, largest=largest)
            check("TopK", {"x": x}, {"k": np.array([1], I64)}, opset=opset, n=2, axis=0,
                  largest=largest)  # fmt: skip


def test_topk_bfloat16_and_unsorted():
    x = RNG.standard_normal((4, 10)).astype(BF16)
    vals, idx = ours("TopK", {"x": x, "k": np.array([3], I64)}, opset=24, n=2)
    want_vals, want_idx = topk_ref(x, 3, 1, True)
    assert vals.dtype == BF16
    np.testing.assert_array_equal(vals.astype(np.float32), want_vals.astype(np.float32))
    np.testing.assert_array_equal(idx, want_idx)
    y = RNG.permutation(20).astype(np.float32)  # distinct values: any order is comparable
    vals, idx = ours("TopK", {"x": y, "k": np.array([5], I64)}, opset=11, n=2, sorted=0)
    np.testing.assert_array_equal(np.sort(vals), np.sort(y)[-5:])
    np.testing.assert_array_equal(y[idx], vals)


def test_topk_values_output_only_and_errors():
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    node = helper.make_node("TopK", ["x", "k"], ["v", ""])
    graph = helper.make_graph(
        [node], "topk", [tensor_info("x", np.float32, (2, 4)), tensor_info("k", I64, (1,))],
        [tensor_info("v", np.float32, (2, 2))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=8)
    (vals,) = InferenceSession.builder().from_graph(model).run({"x": x, "k": np.array([2], I64)})
    np.testing.assert_array_equal(vals, -np.sort(-x, axis=1)[:, :2])
    with pytest.raises(Exception, match="k must be"):
        ours("TopK", {"x": x, "k": np.array([5], I64)}, opset=11, n=2)
    with pytest.raises(Exception, match="k must be"):
        ours("TopK", {"x": x, "k": np.array([-1], I64)}, opset=11, n=2)
    with pytest.raises(Exception, match="axis"):
        ours("TopK", {"x": x, "k": np.array([1], I64)}, opset=11, n=2, axis=2)


# Unique


def unique_ref(x, axis, sorted_):
    """Numpy reference built from np.unique, reordered by first occurrence if unsorted."""
    y, idx, inv, cnt = np.unique(x, return_index=True, return_inverse=True,
                                 return_counts=True, axis=axis)  # fmt: skip
    inv = inv.reshape(-1)
    if not sorted_:
        order = np.argsort(idx)
        rank = np.argsort(order)
        y = y[order] if axis is None else np.take(y, order, axis=axis)
        idx, cnt, inv = idx[order], cnt[order], rank[inv]
    return y, idx.astype(I64), inv.astype(I64), cnt.astype(I64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int8])
@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize(("shape", "axis"), [
    ((6,), None), ((3, 4), None), ((5, 3), 0), ((3, 5), 1), ((2, 4, 2), 1), ((2, 4, 2), -1),
    ((4, 3), -2), ((1,), None), ((0,), None), ((1, 1), 0),
])  # fmt: skip
def test_unique_matches_ort(dtype, sorted_, shape, axis):
    x = RNG.integers(0, 3, shape).astype(dtype)
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    got = check("Unique", {"x": x}, opset=11, n=4, **attrs)
    for a, b in zip(got, unique_ref(x, axis, sorted_)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.uint64, np.float16, BF16, np.bool_,
                                   np.complex64])  # fmt: skip
@pytest.mark.parametrize("axis", [None, 0])
def test_unique_other_types_against_numpy(dtype, axis):
    x = RNG.integers(0, 3, (6, 3)).astype(np.float32)
    if np.dtype(dtype) == np.complex64:
        x = (x + 1j * RNG.integers(0, 2, x.shape)).astype(dtype)
    else:
        x = x.astype(dtype)
    attrs = {} if axis is None else {"axis": axis}
    for sorted_ in (0, 1):
        got = ours("Unique", {"x": x}, opset=28, n=4, sorted=sorted_, **attrs)
        key = x.astype(np.float32) if x.dtype == BF16 else x
        want = unique_ref(key, axis, sorted_)
        assert got[0].dtype == x.dtype
        np.testing.assert_array_equal(got[0].astype(key.dtype), want[0])
        for a, b in zip(got[1:], want[1:]):
            assert a.dtype == I64
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_strings(axis, sorted_):
    words = np.array(["b", "", "ä", "a", "b", "日本", "", "a"], dtype=object)
    x = words.reshape(4, 2) if axis is not None else words
    x = np.concatenate([x, x[:1]]) if axis == 0 else x
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    if axis is None:
        got = check("Unique", {"x": x}, opset=11, n=4, **attrs)
    else:  # onnxruntime has no string Unique with an axis
        got = ours("Unique", {"x": x}, opset=11, n=4, **attrs)
    # reference via integer codes that sort like the strings
    _, codes = np.unique(x.reshape(-1), return_inverse=True)
    want = unique_ref(codes.reshape(x.shape), axis, sorted_)
    y = x.reshape(-1)[want[1]] if axis is None else np.take(x, want[1], axis=axis)
    assert got[0].tolist() == y.tolist()
    for a, b in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(a, b)


def test_unique_first_output_only_and_spec_examples():
    x = np.array([2, 1, 1, 3, 4, 3], np.float32)
    (y,) = ours("Unique", {"x": x}, opset=11, n=1, sorted=0)
    np.testing.assert_array_equal(y, [2, 1, 3, 4])
    x = np.array([[[1, 1], [0, 1], [2, 1], [0, 1]], [[1, 1], [0, 1], [2, 1], [0, 1]]],
                 np.float32)  # fmt: skip
    y, idx, inv, cnt = ours("Unique", {"x": x}, opset=11, n=4, axis=1)
    np.testing.assert_array_equal(y, [[[0, 1], [1, 1], [2, 1]], [[0, 1], [1, 1], [2, 1]]])
    np.testing.assert_array_equal(idx, [1, 0, 2])
    np.testing.assert_array_equal(inv, [1, 0, 2, 0])
    np.testing.assert_array_equal(cnt, [2, 1, 1])
    y, idx, inv, cnt = ours("Unique", {"x": np.zeros((0, 3), np.float32)}, opset=11, n=4, axis=0)
    assert y.shape == (0, 3) and idx.shape == inv.shape == cnt.shape == (0,)
