"""Specialised row kernels: the numba row kernels (normalizations, softmax, GELU) bound to
one input shape with their constant operands prepared, so a call is one allocation and one
compiled call. Large inputs are split by rows across the intra-op pool (the kernels are
`nogil`, rows are independent, so a split computes the same bits)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxkiln.pool import active_threads, parallel_for
from onnxkiln.providers.cpu import _numba
from onnxkiln.providers.cpu._gemm import split_ranges

__all__ = ["ROWS_SPLIT_MIN", "norm_rows", "row_ranges", "softmax_rows"]

ROWS_SPLIT_MIN = 1 << 18
"""Elements below which a row kernel runs on the calling thread alone (bench/thresholds.py,
quiet 2-core VM: softmax over 131K elements split 1.10x the whole, 524K 0.67x)."""


def row_ranges(rows: int, n: int) -> tuple[tuple[int, int], ...] | None:
    """Row ranges of a split across the pool for (rows, n) elements, or None (one call)."""
    threads = active_threads()
    if threads < 2 or rows < 2 or rows * n < ROWS_SPLIT_MIN:
        return None
    ranges = split_ranges(rows, min(rows, 2 * threads), 1)
    return ranges if len(ranges) > 1 else None


def norm_rows(fn: Callable, shape: tuple[int, ...], n: int, gamma: np.ndarray,
              beta: np.ndarray | None, bias: np.ndarray | None, eps: float,
              simplified: bool, skip: bool, want_total: bool):
    """call(x, skip) -> (y, mean, inv_std, total) over rows of n for inputs of `shape`
    (the numba `norm_rows` kernel); y and total as (rows, n), mean and inv as (rows,)."""
    rows = math.prod(shape) // n if n else 0
    cdt = gamma.dtype
    flags = (int(skip), int(bias is not None), int(beta is not None), int(simplified),
             int(want_total))
    be = gamma if beta is None else beta
    bi = gamma if bias is None else bias
    ranges = row_ranges(rows, n)

    def call(x: np.ndarray, s: np.ndarray | None = None):
        x2 = np.ascontiguousarray(x).reshape(rows, n)
        s2 = x2 if s is None else np.ascontiguousarray(s).reshape(rows, n)
        y = np.empty((rows, n), cdt)
        total = np.empty((rows, n), cdt) if want_total else y
        mean = np.empty(rows, cdt)
        inv = np.empty(rows, cdt)
        if ranges is None:
            fn(x2, s2, bi, gamma, be, flags, eps, y, total, mean, inv)
        else:
            def chunk(i: int) -> None:
                lo, hi = ranges[i]
                fn(x2[lo:hi], s2[lo:hi], bi, gamma, be, flags, eps, y[lo:hi], total[lo:hi],
                   mean[lo:hi], inv[lo:hi])

            parallel_for(len(ranges), chunk)
        return y, mean, inv, total

    return call


def softmax_rows(fn: Callable, rows: int, n: int, log: bool):
    """call(x) -> y: softmax (log=True: log-softmax) of each of `rows` rows of n."""
    ranges = row_ranges(rows, n)
    flag = int(log)

    def call(x: np.ndarray) -> np.ndarray:
        x2 = np.ascontiguousarray(x).reshape(rows, n)
        y = np.empty((rows, n), x2.dtype)
        if ranges is None:
            fn(x2, y, flag)
        else:
            parallel_for(len(ranges), lambda i: fn(x2[ranges[i][0]:ranges[i][1]],
                                                   y[ranges[i][0]:ranges[i][1]], flag))
        return y

    return call


def axis_norm_specializer(fast, cdt0: np.dtype, axis: int, eps: float, simplified: bool,
                          out_dtype: Callable[[tuple], np.dtype | None], stash: np.dtype,
                          want_mean: bool, want_inv: bool):
    """specialize() of a LayerNormalization-style op (X, Scale, B; normalised over
    [axis, rank)): the numba kernel on constant Scale/B. Returns (y, mean, inv) with None
    for outputs not wanted, (y, inv) for the simplified (RMS) form; `out_dtype(dtypes)` is
    y's dtype (None: do not specialise)."""

    def specialize(dtypes, shapes, consts):
        sx = shapes[0]
        if fast is None or sx is None or dtypes[0] != cdt0 or not fast.ready():
            return None
        ax = axis + len(sx) if axis < 0 else axis
        if not 0 <= ax < len(sx):
            return None
        n, lead = math.prod(sx[ax:]), sx[:ax]
        ydt = out_dtype(dtypes)
        vecs = []
        for pos in (1, 2):
            if pos >= len(shapes) or shapes[pos] is None:
                vecs.append(None)
            elif consts[pos] is None or tuple(shapes[pos]) != tuple(sx[ax:]):
                return None
            else:
                vecs.append(np.ascontiguousarray(consts[pos], cdt0).reshape(n))
        if vecs[0] is None or n == 0 or math.prod(lead) == 0 or ydt is None:
            return None
        call = norm_rows(fast.fn, sx, n, vecs[0], vecs[1], None, eps, simplified, False, False)
        stat = (*lead, *(1,) * (len(sx) - ax))

        def special(x, *_):
            y, mean, inv, _ = call(x)
            y = y.reshape(sx).astype(ydt, copy=False)
            inv_out = inv.reshape(stat).astype(stash) if want_inv else None
            if simplified:
                return y, inv_out
            return y, mean.reshape(stat).astype(stash) if want_mean else None, inv_out

        special.variant = "layernormalization.numba"
        return special

    return specialize


def gelu_rows(fn: Callable, x: np.ndarray, bias: np.ndarray | None, tanh: bool,
              out: np.ndarray | None = None) -> np.ndarray:
    """GELU of float32 x (+ bias over the last axis) through the numba `gelu` kernel, into
    `out` (may be x) or a fresh array, rows split across the pool when large."""
    n = x.shape[-1] if x.ndim else 1
    x2 = np.ascontiguousarray(x).reshape(-1, n) if n else x.reshape(0, 0)
    y = np.empty(x.shape, x.dtype) if out is None else out
    if not x2.size:
        return y
    b = x2[0] if bias is None else np.ascontiguousarray(bias, dtype=x.dtype)
    y2 = y.reshape(x2.shape)
    flag, t = int(bias is not None), int(tanh)
    ranges = row_ranges(x2.shape[0], n)
    if ranges is None:
        fn(x2, b, flag, y2, t)
    else:
        parallel_for(len(ranges), lambda i: fn(x2[ranges[i][0]:ranges[i][1]], b, flag,
                                               y2[ranges[i][0]:ranges[i][1]], t))
    return y


def _flat_signature(dt: np.dtype) -> tuple:
    from numba import types

    f = types.float32 if dt == np.float32 else types.float64
    return (types.Array(f, 1, "C", readonly=True), types.int64, types.int64,
            types.Array(f, 1, "C"))


for _name in ("sigmoid_flat", "silu_flat", "hardswish_flat"):
    _numba.register(_name, "onnxkiln.providers.cpu._numba_act", _flat_signature,
                    (np.float32, np.float64), {"reassoc", "contract", "nsz", "arcp"})


def flat_call(name: str, dt: np.dtype) -> Callable[..., np.ndarray] | None:
    """call(x, out=None) -> y: the numba elementwise kernel `name` over x's elements (into
    `out` when given, which may be x itself), split across the pool when large; None when
    numba is off."""
    handle = _numba.lazy(name, dt)
    if handle is None or not handle.ready():
        return None
    fn = handle.fn

    def call(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        xf = np.ascontiguousarray(x).reshape(-1)
        fits = out is not None and out.shape == x.shape and out.flags.c_contiguous and \
            out.dtype == dt and out.flags.writeable
        y = out if fits else np.empty(x.shape, dt)
        yf = y.reshape(-1)
        n = xf.shape[0]
        ranges = row_ranges(n, 1) if n >= ROWS_SPLIT_MIN else None
        if ranges is None:
            fn(xf, 0, n, yf)
        else:
            parallel_for(len(ranges), lambda i: fn(xf, ranges[i][0], ranges[i][1], yf))
        return y

    return call
