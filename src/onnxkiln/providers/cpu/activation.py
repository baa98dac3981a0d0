"""CPU kernels: activation functions and Clip.

Composite activations compute in float32/float64; float16 and bfloat16 inputs are widened
to float32 and the result rounded back once. Every kernel writes into buffers it allocates
(the first step writes `out=` a fresh array, so 0-d inputs still give arrays to update in
place) and never touches its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from onnxkiln.ops import special
from onnxkiln.providers.base import NodeInfo, report_variant
from onnxkiln.providers.cpu import _row_kernels
from onnxkiln.providers.cpu.math import (
    _BF16,
    _F32,
    _F64,
    _LOW_FLOATS,
    attr_str,
    const_input,
    donated,
    input_dtype,
)
from onnxkiln.providers.cpu.registry import kernel

try:  # the ufunc behind np.clip: one pass, without np.clip's Python wrapper
    from numpy._core.umath import clip as _uclip
except ImportError:  # pragma: no cover
    _uclip = np.clip

__all__: list[str] = []

Array = Any
_INF = np.inf
# exp() arguments above these overflow; clamping keeps results exact enough and warning-free.
_EXP_MAX = {_F32: 88.0, _F64: 709.0}


def _float_kernel(info: NodeInfo, run: Callable[..., Array]) -> Callable[..., Array]:
    """`run` handles float32/float64; float16 and bfloat16 go through float32 (a donated
    `out=`, see KernelSpec.inplace, is passed on for float32/float64 only)."""
    dt = input_dtype(info, 0)
    if dt is not None and dt in (_F32, _F64):  # (np.dtype("float64") == None is True)
        return run

    def widened(x: Array, out: np.ndarray | None = None) -> Array:
        dt = x.dtype
        if dt in _LOW_FLOATS:
            return run(x.astype(_F32)).astype(dt)
        return run(x) if out is None else run(x, out)

    return widened


def _pos(x: Array, out: np.ndarray | None = None) -> np.ndarray:
    """max(x, 0) for floats (NaN stays NaN) into a fresh or given buffer."""
    return _uclip(x, 0, _INF, out=np.empty_like(x) if out is None else out)


def _neg(x: Array, out: np.ndarray | None = None) -> np.ndarray:
    """min(x, 0) for floats (NaN stays NaN) into a fresh or given buffer."""
    return _uclip(x, -_INF, 0, out=np.empty_like(x) if out is None else out)


def _exp_neg_part(x: Array) -> np.ndarray:
    """exp(min(x, 0)) - 1, fresh buffer (onnxruntime's Elu/Selu/Celu use exp - 1 too)."""
    t = _neg(x)
    np.exp(t, out=t)
    np.subtract(t, 1, out=t)
    return t


# --------------------------------------------------------------------------------------
# Piecewise-linear activations


@kernel("Relu", since=1, inplace=(0,))
def relu(x: Array, out: np.ndarray | None = None) -> Array:
    """max(x, 0); floats through the clip ufunc (faster than np.maximum here)."""
    dt = x.dtype
    if dt.kind == "f":
        return _pos(x, None if out is None else donated(x, out))
    return np.maximum(x, 0)  # ints and bfloat16 (ml_dtypes keeps the dtype with a Python 0)


@kernel("LeakyRelu", since=1, factory=True, inplace=(0,))
def leaky_relu(info: NodeInfo) -> Callable[..., Any]:
    """x if x >= 0 else alpha * x."""
    alpha = float(info.attrs["alpha"])

    if alpha >= 0.0:
        pick = np.maximum if alpha <= 1.0 else np.minimum

        def fresh(x: Array) -> Array:
            y = np.multiply(x, alpha, out=np.empty_like(x))
            return pick(x, y, out=y)

    else:

        def fresh(x: Array) -> Array:
            y = _neg(x)
            np.multiply(y, alpha, out=y)
            return np.add(y, _pos(x), out=y)

    def run(x: Array, out: np.ndarray | None = None) -> Array:
        if out is not x or not out.flags.writeable:
            return fresh(x)
        return np.multiply(x, alpha, out=out, where=np.less(x, 0))  # in place: x >= 0 stays

    return _float_kernel(info, run)


def _legacy_slope(x: Array, slope: Array) -> Array:
    """Opsets 1-6: a 1-D slope of length C applies per channel (axis 1)."""
    if np.ndim(slope) == 1 and slope.size > 1 and x.ndim > 2 and slope.shape[0] == x.shape[1]:
        return slope.reshape((-1,) + (1,) * (x.ndim - 2))
    return slope


@kernel("PRelu", since=1, factory=True)
def prelu(info: NodeInfo) -> Callable[..., Any]:
    """x if x >= 0 else slope * x; slope broadcasts to X (unidirectionally)."""
    legacy = info.opset < 7
    c = const_input(info, 1)
    unit = c is not None and c.dtype.kind == "f" and c.size > 0 and c.min() >= 0 and c.max() <= 1

    def run(x: Array, slope: Array) -> Array:
        if legacy:
            slope = _legacy_slope(x, slope)
        if np.ndim(slope) > np.ndim(x):
            raise ValueError(
                f"PRelu: slope of shape {np.shape(slope)} does not broadcast to X of shape "
                f"{np.shape(x)}"
            )
        dt = x.dtype
        if dt.kind in "iu":
            y = np.multiply(x, slope, out=np.empty_like(x))
            np.copyto(y, x, where=x >= 0)
            return y
        if dt in _LOW_FLOATS:
            x, slope = x.astype(_F32), slope.astype(_F32)
        if unit:  # 0 <= slope <= 1: max(x, slope * x), two passes
            y = np.multiply(x, slope, out=np.empty_like(x))
            np.maximum(x, y, out=y)
        else:
            y = _neg(x)
            np.multiply(y, slope, out=y)
            np.add(y, _pos(x), out=y)
        return y.astype(dt) if dt in _LOW_FLOATS else y

    return run


@kernel("ThresholdedRelu", since=10, factory=True)
def thresholded_relu(info: NodeInfo) -> Callable[..., Any]:
    """x if x > alpha else 0."""
    alpha = float(info.attrs["alpha"])

    def run(x: Array) -> Array:
        return np.where(np.greater(x, alpha), x, np.zeros((), x.dtype))

    return _float_kernel(info, run)


@kernel("Shrink", since=9, factory=True)
def shrink(info: NodeInfo) -> Callable[..., Any]:
    """x + bias if x < -lambd; x - bias if x > lambd; else 0 (ints compute in float64)."""
    bias = float(info.attrs["bias"])
    lambd = float(info.attrs["lambd"])

    def run(x: Array) -> Array:
        dt = x.dtype
        v = x if dt in (_F32, _F64) else x.astype(_F32 if dt in _LOW_FLOATS else _F64)
        y = np.where(v < -lambd, v + bias, np.where(v > lambd, v - bias, 0))
        if dt.kind in "iu":
            with np.errstate(invalid="ignore"):
                return y.astype(dt)
        return y.astype(dt, copy=False)

    return run


@kernel("HardSigmoid", since=1, factory=True, inplace=(0,))
def hard_sigmoid(info: NodeInfo) -> Callable[..., Any]:
    """max(0, min(1, alpha * x + beta))."""
    alpha = float(info.attrs["alpha"])
    beta = float(info.attrs["beta"])

    def run(x: Array, out: np.ndarray | None = None) -> Array:
        y = np.multiply(x, alpha, out=donated(x, out))
        np.add(y, beta, out=y)
        return _uclip(y, 0, 1, out=y)

    return _float_kernel(info, run)


@kernel("HardSwish", since=14, factory=True)
def hard_swish(info: NodeInfo) -> Callable[..., Any]:
    """x * max(0, min(1, x / 6 + 0.5))."""

    def run(x: Array) -> Array:
        y = np.multiply(x, 1.0 / 6.0, out=np.empty_like(x))
        np.add(y, 0.5, out=y)
        _uclip(y, 0, 1, out=y)
        return np.multiply(y, x, out=y)

    kernel_fn = _float_kernel(info, run)
    kernel_fn.specialize = _flat_specializer("hardswish_flat")
    return kernel_fn


# --------------------------------------------------------------------------------------
# Smooth activations


def _sigmoid(x: Array, out: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-x)), with -x clamped so exp cannot overflow."""
    t = _uclip(x, -_EXP_MAX[x.dtype], _INF, out=donated(x, out))
    np.negative(t, out=t)
    np.exp(t, out=t)
    np.add(t, 1, out=t)
    return np.reciprocal(t, out=t)


@kernel("Sigmoid", since=1, factory=True, inplace=(0,))
def sigmoid(info: NodeInfo) -> Callable[..., Any]:
    """1 / (1 + exp(-x)); float32/float64 specialise to one numba pass (_numba_act)."""
    run = _float_kernel(info, _sigmoid)
    if run is _sigmoid:  # a shared function: give this node its own callable to annotate
        def run(x: Array, out: np.ndarray | None = None) -> Array:
            return _sigmoid(x, out)
    run.specialize = _flat_specializer("sigmoid_flat")
    return run


def _flat_specializer(name: str) -> Callable[..., Any]:
    """specialize() of a float32/float64 activation with a numba elementwise kernel."""

    def specialize(dtypes, shapes, consts):
        if dtypes[0] not in (_F32, _F64) or shapes[0] is None:
            return None
        call = _row_kernels.flat_call(name, dtypes[0])
        if call is not None:
            call.variant = f"{name.split('_')[0]}.numba"
        return call

    return specialize


@kernel("Tanh", since=1, factory=True, inplace=(0,))
def tanh(info: NodeInfo) -> Callable[..., Any]:
    """np.tanh (one ufunc, native for every float type)."""
    return np.tanh


@kernel("Elu", since=1, factory=True)
def elu(info: NodeInfo) -> Callable[..., Any]:
    """x if x > 0 else alpha * (exp(x) - 1)."""
    alpha = float(info.attrs["alpha"])

    def run(x: Array) -> Array:
        y = _exp_neg_part(x)
        np.multiply(y, alpha, out=y)
        return np.add(y, _pos(x), out=y)

    return _float_kernel(info, run)


@kernel("Selu", since=1, factory=True)
def selu(info: NodeInfo) -> Callable[..., Any]:
    """gamma * (x if x > 0 else alpha * (exp(x) - 1))."""
    alpha = float(info.attrs["alpha"])
    gamma = float(info.attrs["gamma"])

    def run(x: Array) -> Array:
        y = _exp_neg_part(x)
        np.multiply(y, alpha * gamma, out=y)
        p = _pos(x)
        np.multiply(p, gamma, out=p)
        return np.add(y, p, out=y)

    return _float_kernel(info, run)


@kernel("Celu", since=12, factory=True)
def celu(info: NodeInfo) -> Callable[..., Any]:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    alpha = float(info.attrs["alpha"])

    def run(x: Array) -> Array:
        y = _neg(x)
        np.divide(y, alpha, out=y)
        np.exp(y, out=y)
        np.subtract(y, 1, out=y)
        np.multiply(y, alpha, out=y)
        return np.add(y, _pos(x), out=y)

    return _float_kernel(info, run)


def _softplus(x: Array) -> np.ndarray:
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow, exact for x << 0."""
    t = np.absolute(x, out=np.empty_like(x))
    np.negative(t, out=t)
    np.exp(t, out=t)
    np.log1p(t, out=t)
    return np.add(t, _pos(x), out=t)


@kernel("Softplus", since=1, factory=True)
def softplus(info: NodeInfo) -> Callable[..., Any]:
    """log(exp(x) + 1)."""
    return _float_kernel(info, _softplus)


@kernel("Softsign", since=1, factory=True)
def softsign(info: NodeInfo) -> Callable[..., Any]:
    """x / (1 + |x|)."""

    def run(x: Array) -> Array:
        y = np.absolute(x, out=np.empty_like(x))
        np.add(y, 1, out=y)
        return np.divide(x, y, out=y)

    return _float_kernel(info, run)


@kernel("Mish", since=18, factory=True)
def mish(info: NodeInfo) -> Callable[..., Any]:
    """x * tanh(softplus(x)), as x * n / (n + 2) with n = e^x (e^x + 2)."""

    def run(x: Array) -> Array:
        # tanh(log(1 + u)) = ((1 + u)^2 - 1) / ((1 + u)^2 + 1) = n / (n + 2), u = e^x.
        # Past x = 20, n / (n + 2) rounds to 1 in float32 and float64 alike, so clamp there.
        u = _uclip(x, -_INF, 20.0, out=np.empty_like(x))
        np.exp(u, out=u)
        n = np.add(u, 2, out=np.empty_like(u))
        np.multiply(n, u, out=n)
        np.add(n, 2, out=u)
        np.divide(n, u, out=n)
        return np.multiply(n, x, out=n)

    return _float_kernel(info, run)


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_GELU_K = math.sqrt(2.0 / math.pi)


@kernel("Gelu", since=20, factory=True)
def gelu(info: NodeInfo) -> Callable[..., Any]:
    """0.5 x (1 + erf(x / sqrt 2)); approximate="tanh" uses the tanh formula."""
    approximate = attr_str(info.attrs.get("approximate")) or "none"
    if approximate == "none":

        def run(x: Array) -> Array:
            y = np.multiply(x, _SQRT1_2, out=np.empty_like(x))
            special.erf(y, out=y)
            np.add(y, 1, out=y)
            np.multiply(y, x, out=y)
            return np.multiply(y, 0.5, out=y)

    elif approximate == "tanh":
        a = -2.0 * _GELU_K
        b = a * 0.044715

        def run(x: Array) -> Array:
            # 0.5 (1 + tanh(z)) = 1 / (1 + exp(-2z)): one exp instead of a tanh
            t = np.multiply(x, x, out=np.empty_like(x))
            np.multiply(t, b, out=t)
            np.add(t, a, out=t)
            np.multiply(t, x, out=t)  # t = -2z
            _uclip(t, -_INF, _EXP_MAX[t.dtype], out=t)
            np.exp(t, out=t)
            np.add(t, 1, out=t)
            return np.divide(x, t, out=t)

    else:
        raise ValueError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    from onnxkiln.providers.cpu import _numba  # optional compiled kernel (the `fast` extra)

    why = _numba.disabled_reason()
    dt = input_dtype(info, 0)
    if why is None and dt is not None and dt == _F64:  # (np.dtype("float64") == None is True)
        why = "float64 runs the numpy kernel (the numba one is float32)"
    fast = None if why else _numba.lazy("gelu", _F32)
    if fast is not None:
        numpy_run, tanh = run, approximate == "tanh"

        def run(x: Array) -> Array:  # the numba version; numpy for float64
            if x.dtype == _F32 and fast.ready():
                return _row_kernels.gelu_rows(fast.fn, x, None, tanh)
            if fast.reason:  # numba did not import after all
                report_variant("gelu.numpy", fast.reason)
            return numpy_run(x)

    k = _float_kernel(info, run)
    k.variant = "gelu.numba" if fast is not None else "gelu.numpy"
    k.variant_reason = why
    return k


# --------------------------------------------------------------------------------------
# Clip


def _scalar_bound(v: Array | None, name: str) -> Array | None:
    """A Clip min/max input as a scalar of its own dtype (None if absent)."""
    if v is None:
        return None
    if np.size(v) != 1:
        raise ValueError(f"Clip: {name} must be a scalar (one element), got shape {np.shape(v)}")
    return np.reshape(v, -1)[0]


def _clip(x: Array, lo: Array | None, hi: Array | None, out: np.ndarray | None = None) -> Array:
    """Clamp x to [lo, hi] (None = unbounded); min > max gives max everywhere, as ONNX says.
    A donated `out` (x itself, see KernelSpec.inplace) takes the result when writeable."""
    if lo is None and hi is None:
        if out is not None and out.flags.writeable:
            return out  # x itself: nothing to do
        return np.array(x, copy=True)
    dt = x.dtype
    if dt == _BF16:
        y = x if lo is None else np.maximum(x, lo)
        return np.minimum(y, hi) if hi is not None else y
    if lo is None:
        lo = -_INF if dt.kind == "f" else np.iinfo(dt).min
    if hi is None:
        hi = _INF if dt.kind == "f" else np.iinfo(dt).max
    return _uclip(x, lo, hi, out=donated(x, out))


def _attr_bounds(lo: float | None, hi: float | None) -> Callable[[Array], Array]:
    """Clip with float attribute bounds, converted once per input dtype."""
    cache: dict[np.dtype, tuple[Array, Array]] = {}

    def convert(v: float | None, dt: np.dtype) -> Array | None:
        if v is None:
            return None
        with np.errstate(over="ignore"):  # FLT_MAX in float16 is inf: no bound, as meant
            return np.asarray(v, dtype=_F64).astype(dt)[()]

    def run(x: Array, out: np.ndarray | None = None) -> Array:
        dt = x.dtype
        b = cache.get(dt)
        if b is None:
            b = cache[dt] = (convert(lo, dt), convert(hi, dt))
        return _clip(x, b[0], b[1], out)

    return run


@kernel("Clip", since=1, until=5, factory=True, inplace=(0,))
def clip_1(info: NodeInfo) -> Callable[..., Any]:
    """Clip with optional min/max attributes (absent = unbounded)."""
    lo, hi = info.attrs.get("min"), info.attrs.get("max")
    return _attr_bounds(None if lo is None else float(lo), None if hi is None else float(hi))


@kernel("Clip", since=6, until=10, factory=True, inplace=(0,))
def clip_6(info: NodeInfo) -> Callable[..., Any]:
    """Clip with min/max attributes (schema defaults are -/+FLT_MAX)."""
    return _attr_bounds(float(info.attrs["min"]), float(info.attrs["max"]))


@kernel("Clip", since=11, factory=True, inplace=(0,))
def clip_11(info: NodeInfo) -> Callable[..., Any]:
    """Clip with optional min/max inputs (absent = unbounded); ints from opset 12."""
    c_lo, c_hi = const_input(info, 1), const_input(info, 2)
    if c_lo is not None or c_hi is not None:
        lo_c, hi_c = _scalar_bound(c_lo, "min"), _scalar_bound(c_hi, "max")

        def run_const(x: Array, lo: Array | None = None, hi: Array | None = None,
                      out: np.ndarray | None = None) -> Array:
            return _clip(
                x,
                lo_c if c_lo is not None else _scalar_bound(lo, "min"),
                hi_c if c_hi is not None else _scalar_bound(hi, "max"),
                out,
            )

        return run_const

    def run(x: Array, lo: Array | None = None, hi: Array | None = None,
            out: np.ndarray | None = None) -> Array:
        return _clip(x, _scalar_bound(lo, "min"), _scalar_bound(hi, "max"), out)

    return run
