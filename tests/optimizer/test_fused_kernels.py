"""The onnxkiln-domain fused kernels (providers/cpu/fused.py) against numpy expressions."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special

from onnxkiln.eager import dispatch


def _run(op, inputs, **attrs):
    return dispatch(op, inputs, attrs, domain="onnxkiln", opset=1, n_outputs=1)[0]


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


ACTS = {
    "": lambda y: y,
    "Relu": lambda y: np.maximum(y, 0),
    "Gelu": lambda y: 0.5 * y * (1 + scipy.special.erf(y / np.sqrt(2))),
    "FastGelu": lambda y: 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3))),
}


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("layout", ["contiguous", "strided", "2d"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_matmul_bias(act, layout, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 5, 8)).astype(dtype)
    if layout == "strided":
        a = rng.standard_normal((2, 8, 5)).astype(dtype).transpose(0, 2, 1)
    elif layout == "2d":
        a = a[0]
    b = rng.standard_normal((8, 6)).astype(dtype)
    bias = rng.standard_normal(6).astype(dtype)
    a_copy = a.copy()
    y = _run("FusedMatMulBias", [a, b, bias], activation=act)
    assert y.dtype == dtype and y.shape == (*a.shape[:-1], 6)
    np.testing.assert_allclose(y, ACTS[act](a @ b + bias), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a, a_copy)  # inputs untouched


def test_fused_matmul_bias_rejects_mismatched_shapes():
    with pytest.raises(Exception, match="do not fit"):
        _run("FusedMatMulBias", [np.ones((2, 3), np.float32), np.ones((4, 5), np.float32),
                                 np.ones(5, np.float32)])


@pytest.mark.parametrize("transpose_k", [0, 1])
@pytest.mark.parametrize("divide", [0, 1])
def test_sdpa_additive_mask(transpose_k, divide):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    k = rng.standard_normal((2, 3, 7, 4)).astype(np.float32)
    v = rng.standard_normal((2, 3, 7, 4)).astype(np.float32)
    mask = np.where(rng.random((2, 1, 1, 7)) > 0.7, -1e9, 0).astype(np.float32)
    kk = k if transpose_k else np.swapaxes(k, -1, -2).copy()
    y = _run("ScaledDotProductAttention", [q, kk, v, mask], transpose_k=transpose_k,
             scale=2.0, divide=divide, mask_mode="add")
    s = q @ np.swapaxes(k, -1, -2)
    s = s / 2.0 if divide else s * 2.0
    np.testing.assert_allclose(y, _softmax(s + mask) @ v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["keep_true", "keep_false"])
def test_sdpa_boolean_mask_and_broadcast(mode):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 3, 5, 4)).astype(np.float32)
    k = rng.standard_normal((1, 3, 7, 4)).astype(np.float32)
    v = rng.standard_normal((1, 3, 7, 4)).astype(np.float32)
    allowed = rng.random((2, 1, 5, 7)) > 0.3  # widens the batch: a fresh result, not in place
    y = _run("ScaledDotProductAttention", [q, k, v, allowed], mask_mode=mode, mask_fill=-1e30)
    keep = allowed if mode == "keep_true" else ~allowed
    s = np.where(keep, q @ np.swapaxes(k, -1, -2), np.float32(-1e30))
    assert y.shape == (2, 3, 5, 4)
    np.testing.assert_allclose(y, _softmax(s) @ v, rtol=1e-5, atol=1e-6)


def test_sdpa_rejects_integer_inputs_and_bad_mode():
    ints = np.ones((1, 2, 2), np.int32)
    with pytest.raises(Exception, match="float32/float64"):
        _run("ScaledDotProductAttention", [ints, ints, ints])
    with pytest.raises(Exception, match="mask_mode"):
        _run("ScaledDotProductAttention", [ints, ints, ints], mask_mode="xor")
