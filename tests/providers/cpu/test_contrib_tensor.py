"""com.microsoft TransposeMatMul, ExpandDims, GatherND, Pad, Unique and CDist
(contrib_tensor.py) against onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.errors import KernelError, ModelLoadError
from onnxkiln.testing import assert_matches_ort, node_model

MS = "com.microsoft"
RNG = np.random.default_rng(5)
F32 = np.float32


def model(op, feeds, inits=None, names=None, n_outputs=1, **attrs):
    return node_model(op, feeds, n_outputs=n_outputs, initializers=inits or {}, domain=MS,
                      input_names=names, **attrs)


def ours(m, feeds):
    return InferenceSession.builder().from_graph(m).run(dict(feeds))


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_transpose_matmul(ta, tb):  # onnxruntime registers float32 only
    a = RNG.standard_normal((2, 4, 3) if ta else (2, 3, 4)).astype(F32)
    b = RNG.standard_normal((5, 4) if tb else (4, 5)).astype(F32)
    m = model("TransposeMatMul", {"a": a, "b": b}, transA=ta, transB=tb, alpha=0.5)
    assert_matches_ort(m, {"a": a, "b": b}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_expand_dims(axis):
    x = RNG.standard_normal((2, 3)).astype(F32)
    feeds = {"x": x, "axis": np.array(axis, np.int32)}
    assert_matches_ort(model("ExpandDims", feeds), feeds)


def test_expand_dims_refuses_out_of_range_axis():
    feeds = {"x": np.zeros((2, 3), F32), "axis": np.array(3, np.int32)}
    with pytest.raises(KernelError, match="axis 3 outside"):
        ours(model("ExpandDims", feeds), feeds)


@pytest.mark.parametrize("idt", [np.int64, np.int32])
def test_gather_nd(idt):
    data = RNG.standard_normal((3, 4, 5)).astype(F32)
    idx = np.array([[[0, 1], [2, 3]], [[1, -1], [0, 0]]], idt)
    feeds = {"data": data, "idx": idx}
    assert_matches_ort(model("GatherND", feeds), feeds)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads_2d", [False, True])
def test_pad(mode, pads_2d):
    x = RNG.standard_normal((3, 4)).astype(F32)
    pads = np.array([1, 2, 2, 0], np.int64)
    feeds = {"x": x, "pads": pads.reshape(1, -1) if pads_2d else pads}
    names = ["x", "pads"]
    if mode == "constant":
        feeds["v"] = np.array([1.5], F32)
        names.append("v")
    assert_matches_ort(model("Pad", feeds, names=names, mode=mode), feeds)


def test_pad_constant_pads_initializer():
    x = RNG.standard_normal((2, 3, 2)).astype(F32)
    m = model("Pad", {"x": x}, {"pads": np.array([[0, 1, 0, 1, 0, 2]], np.int64)})
    assert_matches_ort(m, {"x": x})


@pytest.mark.parametrize("x", [
    np.array([2, 1, 1, 3, 4, 3, 1], np.float32),
    np.array([0.5, -1.0, 0.5, 7.0], np.float32),
    np.array([5], np.float32),
])
def test_unique(x):
    assert_matches_ort(model("Unique", {"x": x}, n_outputs=3), {"x": x})


def test_unique_integers_first_occurrence_order():  # onnxruntime registers float only
    y, idx, counts = ours(model("Unique", {"x": np.array([4, 2, 4, 9, 2, 2], np.int64)},
                                n_outputs=3), {"x": np.array([4, 2, 4, 9, 2, 2], np.int64)})
    np.testing.assert_array_equal(y, [4, 2, 9])
    np.testing.assert_array_equal(idx, [0, 1, 0, 2, 1, 1])
    np.testing.assert_array_equal(counts, [2, 3, 1])


@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cdist(metric, dtype):
    a = RNG.standard_normal((4, 3)).astype(dtype)
    b = RNG.standard_normal((5, 3)).astype(dtype)
    b[0] = a[0]  # a zero distance stays zero (no negative round-off under the root)
    m = model("CDist", {"a": a, "b": b}, metric=metric)
    assert_matches_ort(m, {"a": a, "b": b}, rtol=1e-5, atol=1e-5)


def test_cdist_refuses_an_attribute_outside_its_schema_as_onnxruntime():
    """skl2onnx writes CDist(metric="minkowski", p=3); onnxruntime refuses the model as an
    invalid graph (INVALID_GRAPH: Unrecognized attribute: p) and so does onnxkiln."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (test extra)")
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph

    feeds = {"a": np.zeros((2, 3), F32), "b": np.zeros((4, 3), F32)}
    m = model("CDist", feeds, metric="minkowski", p=3)
    with pytest.raises(InvalidGraph, match="Unrecognized attribute: p for operator CDist"):
        ort.InferenceSession(m.SerializeToString())
    with pytest.raises(ModelLoadError, match="Unrecognized attribute: p for operator CDist"):
        ours(m, feeds)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample(mode, padding_mode, align_corners):
    x = RNG.standard_normal((2, 3, 5, 6)).astype(F32)
    grid = RNG.uniform(-1.2, 1.2, (2, 4, 3, 2)).astype(F32)
    m = model("GridSample", {"x": x, "grid": grid}, mode=mode, padding_mode=padding_mode,
              align_corners=align_corners)
    assert_matches_ort(m, {"x": x, "grid": grid}, rtol=1e-5, atol=1e-5)


def test_grid_sample_refuses_onnx20_mode_name():
    feeds = {"x": np.zeros((1, 1, 2, 2), F32), "grid": np.zeros((1, 1, 1, 2), F32)}
    with pytest.raises(ModelLoadError, match="bilinear, nearest or bicubic"):
        ours(model("GridSample", feeds, mode="linear"), feeds)


@pytest.mark.parametrize("dim,size,step", [(-1, 3, 1), (0, 2, 2), (1, 4, 3), (1, 7, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])  # onnxruntime: no uint8
def test_unfold_tensor(dim, size, step, dtype):
    x = RNG.integers(0, 100, (3, 7, 5)).astype(dtype)
    assert_matches_ort(model("UnfoldTensor", {"x": x}, dim=dim, size=size, step=step), {"x": x})
