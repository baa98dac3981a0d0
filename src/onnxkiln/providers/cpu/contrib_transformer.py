"""CPU kernels: onnxruntime's com.microsoft transformer helpers.

Gelu, BiasGelu, FastGelu, QuickGelu, BiasAdd, BiasSplitGelu, RotaryEmbedding, Trilu, Range,
Inverse. The contrib normalizations live in `contrib_norm.py`.

onnxruntime registers these contrib schemas itself; onnx knows none of them, so no attribute
defaults are filled in at plan time: every kernel here reads `info.attrs.get(name, default)`.
The attention ops live in `contrib_attention.py` and `contrib_gqa.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

from onnxkiln.ops import special
from onnxkiln.providers.base import CaptureSupport, NodeInfo, report_variant
from onnxkiln.providers.cpu import _numba, _row_kernels
from onnxkiln.providers.cpu.index import trilu as _onnx_trilu
from onnxkiln.providers.cpu.registry import kernel
from onnxkiln.providers.cpu.tensor import range_ as _onnx_range

__all__: list[str] = []

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_SQRT1_2 = math.sqrt(0.5)
_GELU_K = math.sqrt(2.0 / math.pi)


def _cdt(dt: np.dtype) -> np.dtype:
    """float64 computes in float64; every other float type in float32."""
    return _F64 if dt == _F64 else _F32


def _f(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """x as dtype dt, without a copy when it already is (read-only use)."""
    return x if x.dtype == dt else x.astype(dt)


def _float(x: np.ndarray, op: str) -> np.dtype:
    if x.dtype.kind != "f" and x.dtype != _BF16:
        raise TypeError(f"{op}: expected a float tensor, got {x.dtype}")
    return _cdt(x.dtype)


def _wants(info: NodeInfo, i: int) -> bool:
    present = info.output_present
    return bool(present[i]) if i < len(present) else i < info.n_outputs


# ---------------------------------------------------------------------------------------------
# GELU family


def gelu_inplace(t: np.ndarray) -> np.ndarray:
    """Exact GELU of a fresh float32/float64 array, in place."""
    e = np.multiply(t, t.dtype.type(_SQRT1_2))
    special.erf(e, out=e)
    e += 1
    t *= e
    t *= t.dtype.type(0.5)
    return t


def fast_gelu_inplace(t: np.ndarray) -> np.ndarray:
    """tanh-approximated GELU of a fresh float32/float64 array, in place."""
    u = np.multiply(t, t)
    u *= t.dtype.type(0.044715 * _GELU_K)
    u += t.dtype.type(_GELU_K)
    u *= t
    np.tanh(u, out=u)
    u += 1
    t *= u
    t *= t.dtype.type(0.5)
    return t


def _biased(x: np.ndarray, bias: np.ndarray | None, op: str) -> np.ndarray:
    """A fresh compute-dtype copy of x (+ bias broadcast on the last axis)."""
    cdt = _float(x, op)
    if bias is None:
        return x.astype(cdt)
    if bias.ndim != 1 or x.ndim < 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{op}: bias must be 1-D of the input's last dimension {x.shape[-1:]}, "
            f"got {bias.shape}"
        )
    return np.add(x, _f(bias, cdt), dtype=cdt)


def _gelu_factory(info: NodeInfo, tanh: bool) -> Callable[..., np.ndarray]:
    """GELU of X (+ a 1-D bias over the last axis): the float32 numba kernel when numba is
    on, else numpy (`special.erf`, or the tanh form)."""
    op = info.op_type
    tag = op.lower()
    numpy_variant = f"{tag}.{'tanh' if tanh else 'erf'}"
    why = _numba.disabled_reason()
    dt = info.input_dtypes[0] if info.input_dtypes else None
    if why is None and dt is not None and dt.numpy == _F64:
        why = "float64 runs the numpy kernel (the numba one is float32)"
    fast = None if why else _numba.lazy("gelu", _F32)
    slow = fast_gelu_inplace if tanh else gelu_inplace

    def run(x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        if fast is not None and x.dtype != _F64 and fast.ready():
            _float(x, op)
            if bias is not None and (bias.ndim != 1 or x.ndim < 1
                                     or bias.shape[0] != x.shape[-1]):
                _biased(x, bias, op)  # raises the shape error
            xc = _f(x, _F32)
            y = _row_kernels.gelu_rows(fast.fn, xc, None if bias is None else _f(bias, _F32), tanh)
            return y.astype(x.dtype, copy=False)
        if fast is not None and fast.reason:
            report_variant(numpy_variant, fast.reason)
        return slow(_biased(x, bias, op)).astype(x.dtype, copy=False)

    run.variant = f"{tag}.numba" if fast is not None else numpy_variant
    run.variant_reason = why
    return run


@kernel("Gelu", since=1, domain=MS, factory=True, variant="gelu.erf")
def ms_gelu(info: NodeInfo) -> Callable[..., np.ndarray]:
    """0.5 x (1 + erf(x / sqrt 2))."""
    return _gelu_factory(info, tanh=False)


@kernel("BiasGelu", since=1, domain=MS, factory=True, variant="biasgelu.erf")
def bias_gelu(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Exact GELU of A + B (B 1-D over the last axis)."""
    return _gelu_factory(info, tanh=False)


@kernel("FastGelu", since=1, domain=MS, factory=True, variant="fastgelu.tanh")
def fast_gelu(info: NodeInfo) -> Callable[..., np.ndarray]:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) of X (+ bias)."""
    return _gelu_factory(info, tanh=True)


@kernel("QuickGelu", since=1, domain=MS, factory=True, variant="quickgelu.expit")
def quick_gelu(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """x * sigmoid(alpha x), alpha defaulting to 1.702."""
    alpha = float(info.attrs.get("alpha", 1.702))

    def run(x: np.ndarray) -> np.ndarray:
        t = _biased(x, None, "QuickGelu")
        g = np.multiply(t, t.dtype.type(alpha))
        special.expit(g, out=g)
        t *= g
        return t.astype(x.dtype, copy=False)

    return run


@kernel("BiasAdd", since=1, domain=MS, variant="biasadd.numpy")
def bias_add(x: np.ndarray, bias: np.ndarray, skip: np.ndarray) -> np.ndarray:
    """X + bias + skip for X, skip (N, S, C) and bias (C)."""
    if x.ndim != 3 or skip.shape != x.shape:
        raise ValueError(
            f"BiasAdd: X and skip must be the same 3-D shape, got {x.shape}, {skip.shape}"
        )
    if bias.shape != x.shape[-1:]:
        raise ValueError(f"BiasAdd: bias must have shape {x.shape[-1:]}, got {bias.shape}")
    cdt = _float(x, "BiasAdd")
    y = np.add(x, _f(bias, cdt), dtype=cdt)
    y += _f(skip, cdt)
    return y.astype(x.dtype, copy=False)


@kernel("BiasSplitGelu", since=1, domain=MS, variant="biassplitgelu.erf")
def bias_split_gelu(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """(X + bias) split in halves on the last axis: left * Gelu(right)."""
    if x.ndim != 3:
        raise ValueError(f"BiasSplitGelu: X must be 3-D (N, S, D), got {x.shape}")
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"BiasSplitGelu: hidden dimension {d} must be even")
    t = _biased(x, bias, "BiasSplitGelu")
    right = gelu_inplace(np.ascontiguousarray(t[..., d // 2 :]))
    right *= t[..., : d // 2]
    return right.astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding (com.microsoft)


def rotate(x4: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """x4 (..., D) with its first 2 * cos.shape[-1] channels rotated; cos/sin broadcast.

    Returns a fresh array of x4's dtype; the arithmetic runs in float32 (float64 for double).
    """
    half = cos.shape[-1]
    rot = 2 * half
    cdt = _cdt(x4.dtype)
    if interleaved:
        x1, x2 = x4[..., 0:rot:2], x4[..., 1:rot:2]
    else:
        x1, x2 = x4[..., :half], x4[..., half:rot]
    x1 = _f(x1, cdt)
    x2 = _f(x2, cdt)
    real = x1 * cos
    real -= x2 * sin
    imag = x1 * sin
    imag += x2 * cos
    out = np.empty(x4.shape, x4.dtype)
    if interleaved:
        np.copyto(out[..., 0:rot:2], real, casting="unsafe")
        np.copyto(out[..., 1:rot:2], imag, casting="unsafe")
    else:
        np.copyto(out[..., :half], real, casting="unsafe")
        np.copyto(out[..., half:rot], imag, casting="unsafe")
    if rot < x4.shape[-1]:
        out[..., rot:] = x4[..., rot:]
    return out


def cache_rows(cache: np.ndarray, pos: np.ndarray, op: str, name: str) -> np.ndarray:
    """cache[pos] with a clear error for positions outside the cache."""
    n = cache.shape[0]
    if pos.size and (pos.min() < 0 or pos.max() >= n):
        raise IndexError(
            f"{op}: positions must lie in [0, {n}) of {name}, got [{pos.min()}, {pos.max()}]"
        )
    return cache[pos]


@kernel("RotaryEmbedding", since=1, domain=MS, factory=True, variant="rope.ms.numpy")
def rotary_embedding_ms(info: NodeInfo) -> Callable[..., np.ndarray]:
    """RoPE on (B, S, hidden) or (B, N, S, H) input with (max_len, rot/2) cos/sin caches."""
    interleaved = bool(info.attrs.get("interleaved", 0))
    packed = bool(info.attrs.get("is_packed_batching", 0))
    num_heads = int(info.attrs.get("num_heads", 0))
    rot_attr = int(info.attrs.get("rotary_embedding_dim", 0))
    op = "RotaryEmbedding"
    if rot_attr > 0 and num_heads <= 0:
        raise ValueError(f"{op}: num_heads must be provided with rotary_embedding_dim")

    def run(x, position_ids, cos_cache, sin_cache):
        if cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape:
            raise ValueError(
                f"{op}: cos_cache/sin_cache must be the same 2-D shape, got "
                f"{cos_cache.shape}, {sin_cache.shape}"
            )
        if x.ndim == 4:
            b, n, s, d = x.shape
            x4 = x.transpose(0, 2, 1, 3)  # (B, S, N, H)
        elif x.ndim == 3:
            b, s, hidden = x.shape
            if num_heads > 0:
                n = num_heads
            else:
                n = hidden // (2 * cos_cache.shape[1]) if cos_cache.shape[1] else 0
            if n <= 0 or hidden % n:
                raise ValueError(
                    f"{op}: cannot split hidden size {hidden} into heads (num_heads={num_heads})"
                )
            d = hidden // n
            x4 = x.reshape(b, s, n, d)
        else:
            raise ValueError(f"{op}: input must be 3-D or 4-D, got {x.shape}")
        rot = rot_attr if rot_attr > 0 else min(d, 2 * cos_cache.shape[1])
        if rot % 2 or rot > d or rot // 2 > cos_cache.shape[1]:
            raise ValueError(
                f"{op}: rotary dim {rot} must be even, <= head size {d} and <= 2 * cache width "
                f"{cos_cache.shape[1]}"
            )
        pid = np.asarray(position_ids, np.int64)
        if pid.size == 1 and not packed:
            pos = pid.reshape(-1)[0] + np.arange(s)[None, :]
        elif pid.shape == (b, s):
            pos = pid
        else:
            raise ValueError(f"{op}: position_ids shape {pid.shape} expected (1) or {(b, s)}")
        cdt = _cdt(x.dtype)
        half = rot // 2
        cos = cache_rows(cos_cache[:, :half], pos, op, "cos_cache").astype(cdt, copy=False)
        sin = cache_rows(sin_cache[:, :half], pos, op, "sin_cache").astype(cdt, copy=False)
        out4 = rotate(x4, cos[:, :, None, :], sin[:, :, None, :], interleaved)
        if x.ndim == 4:
            return np.ascontiguousarray(out4.transpose(0, 2, 1, 3))
        return out4.reshape(x.shape)

    return run


# ---------------------------------------------------------------------------------------------
# Trilu, Range, Inverse


kernel("Trilu", since=1, domain=MS, factory=True)(_onnx_trilu)


@kernel("Range", since=1, domain=MS, factory=True, capture=CaptureSupport.DATA_DEPENDENT_SHAPE)
def range_ms(info: NodeInfo) -> Callable[..., np.ndarray]:
    """start, start + delta, ... below limit; delta defaults to 1."""
    inner = _onnx_range(info)

    def run(start: np.ndarray, limit: np.ndarray, delta: np.ndarray | None = None) -> np.ndarray:
        if delta is None:
            delta = np.ones((), start.dtype)
        if not start.dtype == limit.dtype == delta.dtype:
            raise TypeError(
                f"Range: start, limit and delta must share a type, got {start.dtype}, "
                f"{limit.dtype}, {delta.dtype}"
            )
        return inner(start, limit, delta)

    return run


@kernel("Inverse", since=1, domain=MS, variant="inverse.lapack")
def inverse(x: np.ndarray) -> np.ndarray:
    """The inverse of each square matrix in the last two axes."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Inverse: input must be [..., N, N], got {x.shape}")
    cdt = _float(x, "Inverse")
    try:
        y = np.linalg.inv(_f(x, cdt))
    except np.linalg.LinAlgError as e:
        raise ValueError(f"Inverse: a matrix in the batch is singular ({e})") from e
    return y.astype(x.dtype, copy=False)
