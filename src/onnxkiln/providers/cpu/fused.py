"""CPU kernels for the optimizer's own fused ops, domain "onnxkiln" (opset 1).

Each one computes exactly what the subgraph it replaces computes, in the same order of
floating-point operations, but in place on its own fresh buffers:

- Silu(X): X * sigmoid(X) (Mul(x, Sigmoid(x)) as exporters write it), in one pass.
- FusedConv(X, W, B; activation, activation_params and Conv's attributes): com.microsoft's
  FusedConv with HardSwish and Silu among its activations too (MobileNetV3's and
  EfficientNet's Conv -> activation), which the conv applies as it finishes its output.
- FusedMatMulBias(A, B, bias; activation): act(A @ B + bias), B 2-D, bias 1-D over the last
  axis; activation "" (none), "Relu", "Gelu" (exact, erf) or "FastGelu" (tanh form).
- ScaledDotProductAttention(Q, K, V, mask?; transpose_k, scale, divide, mask_mode,
  mask_fill): softmax(mask(Q @ K' (/ or *) scale)) @ V over the last axis, where K' is K
  with its last two dims swapped when transpose_k=1, and the mask is added (mask_mode "add")
  or selects (mask_fill where the boolean mask is False: "keep_true"; where it is True:
  "keep_false").
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo, report_variant
from onnxkiln.providers.cpu import _numba, _row_kernels
from onnxkiln.providers.cpu._gemm import matmul as pool_matmul
from onnxkiln.providers.cpu.activation import sigmoid as _sigmoid_kernel
from onnxkiln.providers.cpu.contrib_fused import OURS_CONV_ACTIVATIONS, fused_conv_kernel
from onnxkiln.providers.cpu.contrib_transformer import fast_gelu_inplace, gelu_inplace
from onnxkiln.providers.cpu.registry import kernel

__all__ = ["DOMAIN"]

DOMAIN = "onnxkiln"
_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def _attr_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _relu_(y: np.ndarray) -> np.ndarray:
    return np.maximum(y, 0, out=y)


_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray] | None] = {
    "": None, "Relu": _relu_, "Gelu": gelu_inplace, "FastGelu": fast_gelu_inplace,
}


@kernel("FusedConv", since=1, domain=DOMAIN, factory=True, variant="fusedconv.im2col")
def fused_conv(info: NodeInfo) -> Callable[..., np.ndarray]:
    """activation(Conv(X, W, B)): com.microsoft FusedConv's activations plus HardSwish and
    Silu."""
    return fused_conv_kernel(info, OURS_CONV_ACTIVATIONS)


@kernel("Silu", since=1, domain=DOMAIN, factory=True, variant="silu.numpy", inplace=(0,))
def silu(info: NodeInfo) -> Callable[..., np.ndarray]:
    """x * sigmoid(x): the Sigmoid kernel's numpy form then one product; float32/float64
    specialise to one numba pass."""
    sig = _sigmoid_kernel(info)

    def run(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        s = sig(x)
        y = out if out is not None and out.shape == x.shape and out.dtype == s.dtype else s
        return np.multiply(s, x, out=y)

    def specialize(dtypes, shapes, consts):
        if dtypes[0] not in _FAST or shapes[0] is None:
            return None
        call = _row_kernels.flat_call("silu_flat", dtypes[0])
        if call is not None:
            call.variant = "silu.numba"
        return call

    run.specialize = specialize
    return run


@kernel("FusedMatMulBias", since=1, domain=DOMAIN, factory=True, variant="matmulbias.blas")
def fused_matmul_bias(info: NodeInfo) -> Callable[..., np.ndarray]:
    """act(A @ B + bias) for B 2-D and bias 1-D of B's column count, in one output buffer."""
    name = _attr_str(info.attrs.get("activation"))
    if name not in _ACTIVATIONS:
        raise ValueError(f"FusedMatMulBias: unknown activation {name!r}; "
                         f"expected one of {sorted(_ACTIVATIONS)}")
    act = _ACTIVATIONS[name]
    why = _numba.disabled_reason() if name in ("Gelu", "FastGelu") else None
    fast = _numba.lazy("gelu") if name in ("Gelu", "FastGelu") and why is None else None
    tanh = name == "FastGelu"

    def run(a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
        if b.ndim != 2 or bias.shape != (b.shape[1],) or a.ndim < 1 or \
                a.shape[-1] != b.shape[0]:
            raise ValueError(f"FusedMatMulBias: A {a.shape}, B {b.shape} and bias "
                             f"{bias.shape} do not fit A @ B + bias")
        if a.dtype not in _FAST or b.dtype != a.dtype or bias.dtype != a.dtype:
            y = np.matmul(a.astype(np.float32), b.astype(np.float32)) + bias
            if act is not None:
                act(y)
            return y.astype(a.dtype)
        lead = a.shape[:-1]
        a2 = a.reshape(math.prod(lead), a.shape[-1]) if a.flags.c_contiguous else None
        y = pool_matmul(a2, b) if a2 is not None else pool_matmul(a, b)
        if fast is not None and y.dtype == np.float32 and fast.ready():  # bias, GELU: 1 pass
            return _row_kernels.gelu_rows(fast.fn, y, bias, tanh, out=y).reshape(*lead, b.shape[1])
        if fast is not None and fast.reason:
            report_variant("matmulbias.blas", fast.reason)
        y += bias
        if act is not None:
            act(y)
        return y.reshape(*lead, b.shape[1])

    run.variant = "matmulbias.blas_numba" if fast is not None else "matmulbias.blas"
    run.variant_reason = why
    return run


def _ones(n: int, dt: np.dtype) -> np.ndarray:
    return np.ones((n, 1), dtype=dt)


def _softmax_last_(s: np.ndarray, fast=None) -> np.ndarray:
    """Softmax over the last axis of a fresh float32/float64 array, in place (as Softmax-13)."""
    s2 = s.reshape(-1, s.shape[-1])
    if fast is not None and s.dtype == np.float32 and s.flags.c_contiguous and s.size:
        fast(s2, s2, 0)
        return s
    m = np.fmax.reduce(s2, axis=1, keepdims=True)
    s2 -= m
    np.exp(s2, out=s2)
    s2 /= np.matmul(s2, _ones(s2.shape[1], s2.dtype))
    return s


@kernel("ScaledDotProductAttention", since=1, domain=DOMAIN, factory=True,
        variant="sdpa.blas")
def scaled_dot_product_attention(info: NodeInfo) -> Callable[..., np.ndarray]:
    """softmax(mask(Q @ K' scaled)) @ V, the Q/K/V batch dims broadcasting as MatMul's."""
    transpose_k = bool(info.attrs.get("transpose_k", 1))
    scale = float(info.attrs.get("scale", 1.0))
    divide = bool(info.attrs.get("divide", 0))
    mode = _attr_str(info.attrs.get("mask_mode")) or "add"
    if mode not in ("add", "keep_true", "keep_false"):
        raise ValueError(f"ScaledDotProductAttention: unknown mask_mode {mode!r}")
    fill = float(info.attrs.get("mask_fill", 0.0))
    why = _numba.disabled_reason()
    fast = None if why else _numba.lazy("softmax_rows")

    def run(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask=None) -> np.ndarray:
        kt = np.swapaxes(k, -1, -2) if transpose_k else k
        s = pool_matmul(q, kt)
        dt = s.dtype
        if dt not in _FAST:
            raise TypeError(f"ScaledDotProductAttention: float32/float64 only, got {dt}")
        if scale != 1.0 or divide:
            if divide:
                s /= dt.type(scale)
            else:
                s *= dt.type(scale)
        if mask is not None:
            s = _apply_mask(s, mask, mode, fill)
        if fast is not None and not fast.ready():
            report_variant("sdpa.blas", fast.reason)
        return pool_matmul(_softmax_last_(s, fast.fn if fast is not None else None), v)

    run.variant = "sdpa.blas_numba" if fast is not None else "sdpa.blas"
    run.variant_reason = why
    return run


def _apply_mask(s: np.ndarray, mask: np.ndarray, mode: str, fill: float) -> np.ndarray:
    same = np.broadcast_shapes(s.shape, mask.shape) == s.shape
    if mode == "add":
        if same and mask.dtype == s.dtype:
            s += mask
            return s
        return np.add(s, mask).astype(s.dtype, copy=False)
    keep = mask if mode == "keep_true" else ~mask
    if same:
        np.copyto(s, s.dtype.type(fill), where=~keep)
        return s
    return np.where(keep, s, s.dtype.type(fill))
