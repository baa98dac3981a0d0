"""erf and expit (the logistic sigmoid) in numpy, with the ufunc call form `f(x, out=y)`: the
host numerics of the CPU kernels and of the code the fuse provider generates.

erf is piecewise polynomial (tables in `_erf_tables`, fitted by `scripts/fit_erf.py`):
erf(x) = x * P_k(|x| / width - k) on the segment k nearest |x| / width, up to where erf
rounds to 1, evaluated in float64 in blocks of `_BLOCK` elements. Float32 results are within
1 ulp (denormals included), float64 within 2 ulp, as scipy.special.erf's
(tests/providers/cpu/test_special.py compares them). expit is exp(min(x, 0)) / (1 +
exp(-|x|)): neither exp overflows and the tails keep their relative accuracy.
Both keep a floating dtype (float16 and bfloat16 through float32); integers give float64.
"""

from __future__ import annotations

import numpy as np

from onnxkiln.ops import _erf_tables

__all__ = ["erf", "expit"]

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_BLOCK = 8192  # float64 temporaries of one block stay in the L2 cache


class _PiecewiseErf:
    """erf of a float64 vector from one of `_erf_tables`' fits: x * P_k(|x| / width - k)."""

    def __init__(self, width: float, amax: float, coeffs: tuple[tuple[float, ...], ...]) -> None:
        self._rows = np.array(coeffs).T.copy()  # row i: the s^i coefficient of each segment
        self._inv_width, self._amax, self._last = 1 / width, amax, len(coeffs) - 1

    def __call__(self, x: np.ndarray) -> np.ndarray:
        a = np.abs(x)
        np.minimum(a, self._amax, out=a)  # erf rounds to 1 from amax on; NaN stays NaN
        t = a * self._inv_width
        k = t + _ROUND  # t rounded to the nearest integer k, in the low bits of k's float
        seg = k.view(np.int64) - _ROUND_BITS  # (a cast to int is three times slower)
        np.clip(seg, 0, self._last, out=seg)  # NaN's bits give any index
        k -= _ROUND
        t -= k  # s in [-1/2, 1/2]
        rows = self._rows
        y = rows[-1].take(seg)
        for row in rows[-2::-1]:
            y *= t
            y += row.take(seg)
        y *= a
        return np.copysign(y, x, out=y)


_ROUND = 2.0**52  # adding it to 0 <= t < 2**51 rounds t to an integer, the float's low bits
_ROUND_BITS = np.float64(_ROUND).view(np.int64)
_ERF = {
    _F32: _PiecewiseErf(_erf_tables.F32_WIDTH, _erf_tables.F32_AMAX, _erf_tables.F32_COEFFS),
    _F64: _PiecewiseErf(_erf_tables.F64_WIDTH, _erf_tables.F64_AMAX, _erf_tables.F64_COEFFS),
}


def _work_dtype(dt: np.dtype) -> np.dtype:
    """float32 for float32 and the narrower floats, float64 otherwise."""
    return _F32 if _float_like(dt) and dt.itemsize <= 4 else _F64


def _float_like(dt: np.dtype) -> bool:
    """numpy's floats, and bfloat16 and the other ml_dtypes floats (numpy's kind 'V')."""
    return dt.kind == "f" or (dt.kind == "V" and dt.itemsize <= 2 and dt.names is None)


def _checked(name: str, x) -> np.ndarray:
    x = np.asarray(x)
    if not (_float_like(x.dtype) or x.dtype.kind in "biu"):
        raise TypeError(f"{name}: unsupported dtype {x.dtype}")
    return x


def _result(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return np.empty(x.shape, x.dtype if _float_like(x.dtype) else _F64)
    if out.shape != x.shape:
        raise ValueError(f"out has shape {out.shape}, the input {x.shape}")
    return out


def erf(x, out: np.ndarray | None = None) -> np.ndarray:
    """The error function, elementwise; written into `out` (which may be `x`) when given."""
    x = _checked("erf", x)
    res = _result(x, out)
    if out is not None and out is not x and np.may_share_memory(x, out):
        x = x.copy()
    fn = _ERF[_work_dtype(x.dtype)]
    target = res if res.flags.c_contiguous else np.empty(res.shape, res.dtype)
    flat_x, flat_out = x.reshape(-1), target.reshape(-1)
    for start in range(0, flat_x.size, _BLOCK):
        block = flat_x[start:start + _BLOCK]
        flat_out[start:start + _BLOCK] = fn(block.astype(_F64, copy=False))
    if target is not res:
        res[...] = target
    return res if res.ndim or out is not None else res[()]


def expit(x, out: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-x)), elementwise and without overflow; into `out` when given."""
    x = _checked("expit", x)
    res = _result(x, out)
    work = x.astype(_work_dtype(x.dtype), copy=False)
    e = np.abs(work)
    np.negative(e, out=e)
    np.exp(e, out=e)
    e += 1
    num = np.minimum(work, 0)  # before res is written: res may be x
    np.exp(num, out=num)
    r = np.divide(num, e, out=res if res.dtype == e.dtype else None)
    if r is not res:
        res[...] = r
    return res if res.ndim or out is not None else res[()]

