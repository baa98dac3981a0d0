"""CumProd (providers/cpu/index.py) and Range (tensor.py): onnxruntime and numpy references."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.testing import assert_matches_ort, node_model, run_ort

RNG = np.random.default_rng(5)
I64 = np.int64
BF16 = np.dtype(ml_dtypes.bfloat16)


def ours(op, feeds, inits=None, opset=26, **attrs):
    model = node_model(op, feeds, opset=opset, initializers=inits, **attrs)
    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def cumprod_ref(x, axis, exclusive, reverse):
    work = np.float32 if x.dtype in (np.float16, BF16) else x.dtype
    src = np.flip(x, axis).astype(work) if reverse else x.astype(work)
    out = np.cumprod(src, axis=axis, dtype=work)
    if exclusive:
        out = np.roll(out, 1, axis=axis)
        idx = [slice(None)] * x.ndim
        idx[axis] = slice(0, 1)
        out[tuple(idx)] = 1
    return (np.flip(out, axis) if reverse else out).astype(x.dtype)


def ort_has_cumprod() -> bool:
    try:
        x = np.ones(2, np.float32)
        model = node_model("CumProd", {"x": x}, opset=26, initializers={"a": np.array(0)})
        run_ort(model, {"x": x})
    except Exception:
        return False
    return True


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint32,
                                   np.uint64, np.float16, BF16])  # fmt: skip
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_cumprod_against_numpy(dtype, exclusive, reverse, axis):
    x = RNG.integers(1, 4, (3, 5)).astype(dtype)
    for a in (np.array(axis, I64), np.array([axis], np.int32)):
        y = ours("CumProd", {"x": x}, {"a": a}, exclusive=exclusive, reverse=reverse)[0]
        assert y.dtype == x.dtype and y.shape == x.shape
        want = cumprod_ref(x, axis % 2, exclusive, reverse)
        np.testing.assert_array_equal(y.astype(np.float64), want.astype(np.float64))
    y = ours("CumProd", {"x": x, "a": np.array(axis, I64)}, exclusive=exclusive,
             reverse=reverse)[0]  # fmt: skip  (axis known only at run time)
    np.testing.assert_array_equal(y.astype(np.float64), want.astype(np.float64))


@pytest.mark.skipif(not ort_has_cumprod(), reason="onnxruntime has no CumProd")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_matches_ort(dtype, exclusive, reverse):
    x = RNG.integers(1, 4, (2, 3, 4)).astype(dtype)
    for axis in (0, 2, -2):
        model = node_model("CumProd", {"x": x}, opset=26, initializers={"a": np.array(axis)},
                           exclusive=exclusive, reverse=reverse)  # fmt: skip
        assert_matches_ort(model, {"x": x})


@pytest.mark.parametrize("shape", [(0,), (4, 0), (1,), ()])
def test_cumprod_edge_shapes(shape):
    x = np.full(shape, 2.0, np.float32)
    if x.ndim == 0:
        with pytest.raises(Exception, match="axis"):
            ours("CumProd", {"x": x}, {"a": np.array(0, I64)})
        return
    y = ours("CumProd", {"x": x}, {"a": np.array(0, I64)}, exclusive=1)[0]
    np.testing.assert_array_equal(y, cumprod_ref(x, 0, 1, 0))


@pytest.mark.parametrize(("start", "limit", "delta"), [
    (0, 10, 3), (10, 4, -2), (1, 1, 1), (5, 1, 1), (-3, 3, 2), (0.5, 3.2, 0.7), (2.0, -1.0, -0.25),
])  # fmt: skip
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.int32, np.int64])
@pytest.mark.parametrize("opset", [11, 21])
def test_range_matches_ort(start, limit, delta, dtype, opset):
    if np.dtype(dtype).kind == "i" and not float(delta).is_integer():
        return
    feeds = {"s": np.array(start, dtype), "l": np.array(limit, dtype), "d": np.array(delta, dtype)}
    y = assert_matches_ort(node_model("Range", feeds, opset=opset), feeds)[0]
    assert y.dtype == dtype


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("stash", [0, 1])
def test_range_half_against_numpy(dtype, stash):
    feeds = {"s": np.array(1, dtype), "l": np.array(40, dtype), "d": np.array(0.5, dtype)}
    y = ours("Range", feeds, opset=27, stash_type=stash)[0]
    assert y.dtype == dtype and y.shape == (78,)
    np.testing.assert_allclose(y.astype(np.float32), np.arange(1, 40, 0.5), atol=0.13)
