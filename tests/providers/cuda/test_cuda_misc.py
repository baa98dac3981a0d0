"""CUDA-provider torch kernels vs the numpy CPU provider: image, misc normalization and
TensorScatter ops."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import check_node  # noqa: E402

R = np.random.default_rng(5)


def rand(shape, dtype=np.float32):
    return R.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space(mode):
    assert check_node("DepthToSpace", {"x": rand((2, 8, 3, 2))}, blocksize=2, mode=mode)
    assert check_node("SpaceToDepth", {"x": rand((2, 2, 4, 6))}, blocksize=2)


@pytest.mark.parametrize("k", [0, 1, -2])
@pytest.mark.parametrize("dtype", [None, 7])
def test_eye_like(k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    assert check_node("EyeLike", {"x": rand((3, 5))}, **attrs)


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization(p):
    x = rand((3, 4))
    x[1] = 0
    assert check_node("LpNormalization", {"x": x}, p=p, axis=-1)


def test_mvn_and_lrn():
    assert check_node("MeanVarianceNormalization", {"x": rand((2, 3, 4, 5))})
    assert check_node("LRN", {"x": rand((2, 5, 3, 3))}, size=3, alpha=0.001, beta=0.75, bias=1.0)
    assert check_node("LRN", {"x": rand((2, 6, 4))}, size=4, alpha=0.01, beta=0.5, bias=2.0)


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("with_idx", [False, True])
def test_tensor_scatter(mode, with_idx):
    past, upd = rand((2, 3, 6, 4)), rand((2, 3, 2, 4))
    feeds = {"p": past, "u": upd}
    if with_idx:
        feeds["i"] = np.array([1, 5 if mode == "circular" else 4], np.int64)
    assert check_node("TensorScatter", feeds, opset=24, axis=-2, mode=mode)
