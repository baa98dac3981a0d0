"""CPU kernels: Reduce* (every opset) and ArgMax/ArgMin.

Numeric conventions, chosen to match onnxruntime's CPU provider:
- float16/bfloat16 accumulate in float32 and are cast back.
- int8..int32/uint8..uint32 arithmetic goes through float64 (exact for these types) and is
  cast back truncating toward zero and saturating at the type's bounds (NaN -> type min).
- int64/uint64 sums and products stay exact in their own type (wrapping on overflow;
  onnxruntime goes through float64 and saturates, which loses precision past 2**53).
- ReduceMax/ReduceMin/ArgMax/ArgMin on floats behave like a scan that starts at the first
  element: a NaN in the first position wins, NaNs elsewhere are ignored.
- Reducing an empty set gives 0 (Sum, Mean, L1, L2, SumSquare), 1 (Prod), -inf / the
  type's minimum (Max, LogSum, LogSumExp) and +inf / the type's maximum (Min).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.registry import kernel

Reducer = Callable[[np.ndarray, tuple[int, ...]], np.ndarray]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_NATIVE_FLOATS = frozenset({_F32, _F64})
_BLAS_MIN_SIZE = 4096  # below this np.add.reduce beats a BLAS matrix-vector product


# ---------------------------------------------------------------------------------------------
# axes handling


def _resolve_axes(raw: tuple[int, ...] | None, rank: int, noop: bool) -> tuple[int, ...]:
    """Sorted, de-duplicated, non-negative axes; empty/absent means all axes, or none if noop."""
    if not raw:
        return () if noop else tuple(range(rank))
    out = set()
    for a in raw:
        if not -rank <= a < rank:
            raise ValueError(
                f"reduction axis {a} is out of range for an input of rank {rank}: "
                f"expected a value in [{-rank}, {rank - 1}]"
            )
        out.add(a % rank)
    return tuple(sorted(out))


def _axes_tuple(value: object) -> tuple[int, ...] | None:
    """An axes attribute or tensor as a tuple of ints (None stays None)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(int(a) for a in value)
    arr = np.asarray(value)
    if arr.size == 0:
        return ()
    if arr.dtype.kind not in "iu":
        raise TypeError(f"reduction axes must be integers, got dtype {arr.dtype}")
    return tuple(int(a) for a in arr.reshape(-1))


def _first_index(axes: tuple[int, ...], rank: int) -> tuple[slice, ...]:
    """Index selecting position 0 of every reduced axis, keeping dims."""
    return tuple(slice(0, 1) if i in axes else slice(None) for i in range(rank))


def _ones(n: int, dtype: np.dtype) -> np.ndarray:
    return np.ones(n, dtype)


def _has_nan(a: np.ndarray) -> bool:
    """Whether a float array holds a NaN (a NaN makes the sum NaN; cheaper than .any())."""
    return math.isnan(np.add.reduce(a, axis=None))


def _count(shape: Sequence[int], axes: tuple[int, ...]) -> int:
    return math.prod(shape[a] for a in axes)


# ---------------------------------------------------------------------------------------------
# building blocks (all return fresh arrays with the reduced dims kept)


def _sum(y: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Sum over `axes`, keepdims; float32/float64 row/column sums go through BLAS gemv."""
    if y.size >= _BLAS_MIN_SIZE and axes and y.dtype in _NATIVE_FLOATS and y.flags.c_contiguous:
        nd, k = y.ndim, len(axes)
        kd_shape = tuple(1 if i in axes else s for i, s in enumerate(y.shape))
        if axes[0] == nd - k and axes[-1] == nd - 1:  # trailing block: row sums
            inner = math.prod(y.shape[nd - k :])
            return (y.reshape(-1, inner) @ _ones(inner, y.dtype)).reshape(kd_shape)
        if axes[0] == 0 and axes[-1] == k - 1:  # leading block: column sums
            outer = math.prod(y.shape[:k])
            return (_ones(outer, y.dtype) @ y.reshape(outer, -1)).reshape(kd_shape)
    return np.add.reduce(y, axis=axes, keepdims=True)


def _as_float(x: np.ndarray) -> np.ndarray:
    """x itself for float32/float64, else a float32 (half floats) or float64 (ints) copy."""
    if x.dtype in _NATIVE_FLOATS:
        return x
    return x.astype(_F64 if x.dtype.kind in "iub" else _F32)


def _saturate(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Float -> integer dtype: truncate toward zero, clamp to the type's range, NaN -> min."""
    info = np.iinfo(dtype)
    out = np.empty(v.shape, dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        np.copyto(out, v, casting="unsafe")
        hi = v >= float(info.max)
        lo = (v <= float(info.min)) | np.isnan(v)
    if hi.any():
        out[hi] = info.max
    if lo.any():
        out[lo] = info.min
    return out


def _back(r: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast a float result back to the input dtype (saturating for integers)."""
    if r.dtype == dtype:
        return r
    if dtype.kind in "iu":
        return _saturate(r, dtype)
    return r.astype(dtype)


def _is_wide_int(dtype: np.dtype) -> bool:
    return dtype.kind in "iu" and dtype.itemsize == 8


def _extreme(dtype: np.dtype, low: bool):
    """Identity for max (low=True) or min reductions: -inf/+inf or the type's bounds."""
    if dtype.kind == "b":
        return not low
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if low else info.max
    return -np.inf if low else np.inf


# ---------------------------------------------------------------------------------------------
# reducers: (x, axes) -> fresh array of x's dtype with reduced dims kept


def _reduce_sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if _is_wide_int(x.dtype):
        return np.add.reduce(x, axis=axes, keepdims=True)
    return _back(_sum(_as_float(x), axes), x.dtype)


def _reduce_mean(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    n = _count(x.shape, axes)
    if _is_wide_int(x.dtype):
        s = np.add.reduce(x, axis=axes, keepdims=True)
        if n > 1:  # integer division truncating toward zero, like C
            q = np.abs(s) // n if x.dtype.kind == "i" else s // n
            if x.dtype.kind == "i":
                np.negative(q, out=q, where=s < 0)
            s = q.astype(x.dtype, copy=False)
        return s
    s = _sum(_as_float(x), axes)
    if n > 1:  # an empty reduction gives 0, as onnxruntime does
        s /= s.dtype.type(n)
    return _back(s, x.dtype)


def _reduce_prod(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if _is_wide_int(x.dtype):
        return np.multiply.reduce(x, axis=axes, keepdims=True)
    return _back(np.multiply.reduce(_as_float(x), axis=axes, keepdims=True), x.dtype)


def _reduce_l1(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if _is_wide_int(x.dtype):
        return np.add.reduce(np.abs(x), axis=axes, keepdims=True)
    return _back(_sum(np.abs(_as_float(x)), axes), x.dtype)


def _sum_square_float(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    xf = _as_float(x)
    return _sum(np.multiply(xf, xf), axes)


def _reduce_sum_square(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if _is_wide_int(x.dtype):
        return np.add.reduce(np.multiply(x, x), axis=axes, keepdims=True)
    return _back(_sum_square_float(x, axes), x.dtype)


def _reduce_l2(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    s = _sum_square_float(x, axes)
    return _back(np.sqrt(s, out=s), x.dtype)


def _reduce_log_sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    s = _sum(_as_float(x), axes)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.log(s, out=s)
    return _back(s, x.dtype)


def _reduce_log_sum_exp(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if x.dtype.kind in "iub":
        # onnxruntime evaluates exp(x - max) in the integer type: every term is 0 or 1, so
        # the sum counts the maxima; the result is trunc(max + log(count)).
        m = _max_plain(x, axes)
        count = np.add.reduce(x == m, axis=axes, keepdims=True, dtype=_F64)
        with np.errstate(divide="ignore"):
            r = np.log(count, out=count)
        r += m
        return _saturate(r, x.dtype)
    xf = _as_float(x)
    m = _max_plain(xf, axes)
    np.copyto(m, 0, where=~np.isfinite(m))  # a non-finite max (+-inf, nan) would poison x - m
    t = np.subtract(xf, m)
    np.exp(t, out=t)
    s = _sum(t, axes)
    with np.errstate(divide="ignore"):
        np.log(s, out=s)
    s += m
    return _back(s, x.dtype)


def _max_plain(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if x.size == 0:
        return np.maximum.reduce(x, axis=axes, keepdims=True, initial=_extreme(x.dtype, True))
    return np.maximum.reduce(x, axis=axes, keepdims=True)


def _make_extreme(largest: bool) -> Reducer:
    plain = np.maximum if largest else np.minimum
    nan_skipping = np.fmax if largest else np.fmin

    def reduce_extreme(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        dtype = x.dtype
        if dtype.kind in "iubf":
            xs = x
        else:  # bfloat16 and other ml_dtypes floats: exact in float32
            xs = x.astype(_F32)
        if x.size == 0:
            init = _extreme(xs.dtype, largest)
            r = plain.reduce(xs, axis=axes, keepdims=True, initial=init)
            return r if r.dtype == dtype else r.astype(dtype)
        r = plain.reduce(xs, axis=axes, keepdims=True)
        if xs.dtype.kind == "f" and _has_nan(r):
            # onnxruntime's scan: a leading NaN sticks, later NaNs are skipped
            r = nan_skipping.reduce(xs, axis=axes, keepdims=True)
            first = xs[_first_index(axes, x.ndim)]
            np.copyto(r, first, where=np.isnan(first))
        return r if r.dtype == dtype else r.astype(dtype)

    return reduce_extreme


_REDUCERS: dict[str, tuple[Reducer, int]] = {
    # op: (reducer, first opset taking axes as an input)
    "ReduceSum": (_reduce_sum, 13),
    "ReduceMean": (_reduce_mean, 18),
    "ReduceMax": (_make_extreme(True), 18),
    "ReduceMin": (_make_extreme(False), 18),
    "ReduceProd": (_reduce_prod, 18),
    "ReduceL1": (_reduce_l1, 18),
    "ReduceL2": (_reduce_l2, 18),
    "ReduceLogSum": (_reduce_log_sum, 18),
    "ReduceLogSumExp": (_reduce_log_sum_exp, 18),
    "ReduceSumSquare": (_reduce_sum_square, 18),
}


# ---------------------------------------------------------------------------------------------
# factories and registration


def _const_input(info: NodeInfo, i: int) -> np.ndarray | None:
    return info.const_inputs[i] if len(info.const_inputs) > i else None


def _apply(reduce: Reducer, data: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """Run a reducer and drop the reduced dims unless keepdims."""
    if data.ndim == 0:  # numpy reductions of 0-d arrays give scalars; work on shape (1,)
        return reduce(data.reshape(1), ()).reshape(())
    r = reduce(data, axes)
    if keepdims or not axes:
        return r
    return r.reshape([s for i, s in enumerate(r.shape) if i not in axes])


_UNKNOWN = object()


def _axes_value(consts: tuple) -> object:
    """The axes input's value when the signature fixes it (absent: None), else _UNKNOWN."""
    if len(consts) < 2:
        return None
    return _UNKNOWN if consts[1] is None else _axes_tuple(consts[1])


def _specializer(reduce: Reducer, raw_axes: Callable[[tuple], object], noop: bool,
                 keepdims: bool):
    """specialize() of a reduction: its axes resolved once for the input's rank."""

    def specialize(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
        raw = raw_axes(consts)
        present = len(shapes) > 1 and shapes[1] is not None
        if shapes[0] is None or (raw is _UNKNOWN and present):
            return None
        ax = _resolve_axes(None if raw is _UNKNOWN else raw, len(shapes[0]), noop)
        return lambda data, *_: _apply(reduce, data, ax, keepdims)

    return specialize


def _attr_axes_factory(op: str, reduce: Reducer) -> Callable[[NodeInfo], Callable]:
    def factory(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
        keepdims = bool(info.attrs.get("keepdims", 1))
        noop = bool(info.attrs.get("noop_with_empty_axes") or 0)
        raw = _axes_tuple(info.attrs.get("axes"))

        def run(data: np.ndarray) -> np.ndarray:
            return _apply(reduce, data, _resolve_axes(raw, data.ndim, noop), keepdims)

        run.specialize = _specializer(reduce, lambda consts: raw, noop, keepdims)
        return run

    factory.__name__ = factory.__qualname__ = f"{op.lower()}_axes_attribute"
    factory.__doc__ = f"{op} with axes as an attribute."
    return factory


def _input_axes_factory(op: str, reduce: Reducer) -> Callable[[NodeInfo], Callable]:
    def factory(info: NodeInfo) -> Callable[..., np.ndarray]:
        keepdims = bool(info.attrs.get("keepdims", 1))
        noop = bool(info.attrs.get("noop_with_empty_axes") or 0)
        const = _const_input(info, 1)
        if const is not None:
            raw = _axes_tuple(const)

            def run_const(data: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
                return _apply(reduce, data, _resolve_axes(raw, data.ndim, noop), keepdims)

            run_const.specialize = _specializer(reduce, lambda consts: raw, noop, keepdims)
            return run_const

        def run(data: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
            ax = _resolve_axes(_axes_tuple(axes), data.ndim, noop)
            return _apply(reduce, data, ax, keepdims)

        run.specialize = _specializer(reduce, _axes_value, noop, keepdims)
        return run

    factory.__name__ = factory.__qualname__ = f"{op.lower()}_axes_input"
    factory.__doc__ = f"{op} with axes as an optional input."
    return factory


for _op, (_reduce, _input_since) in _REDUCERS.items():
    kernel(_op, since=1, until=_input_since - 1, factory=True)(_attr_axes_factory(_op, _reduce))
    kernel(_op, since=_input_since, factory=True)(_input_axes_factory(_op, _reduce))


# ---------------------------------------------------------------------------------------------
# ArgMax / ArgMin


def _gather_base(shape: tuple[int, ...], axis: int) -> tuple[np.ndarray, int]:
    """Flat offsets of position 0 along `axis` (dims kept) and the axis stride, C order."""
    outer = math.prod(shape[:axis])
    n = shape[axis]
    inner = math.prod(shape[axis + 1 :])
    base = np.arange(outer)[:, None] * (n * inner) + np.arange(inner)[None, :]
    kd_shape = tuple(1 if i == axis else s for i, s in enumerate(shape))
    return base.reshape(kd_shape), inner


def _gather(x: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    """x's values at `idx` (dims kept) along `axis`; cheaper than np.take_along_axis."""
    if not x.flags.c_contiguous:
        return np.take_along_axis(x, idx, axis)
    base, stride = _gather_base(x.shape, axis)
    return x.reshape(-1)[base + idx * stride]


def _arg_factory(op: str, largest: bool) -> Callable[[NodeInfo], Callable]:
    arg = np.argmax if largest else np.argmin
    nan_fill = -np.inf if largest else np.inf

    def factory(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
        axis_attr = int(info.attrs.get("axis") or 0)
        keepdims = bool(info.attrs.get("keepdims", 1))
        last = bool(info.attrs.get("select_last_index") or 0)

        def locate(x: np.ndarray, axis: int) -> np.ndarray:
            if not last:
                return arg(x, axis=axis, keepdims=True)
            n = x.shape[axis]
            return (n - 1) - arg(np.flip(x, axis), axis=axis, keepdims=True)

        def run(data: np.ndarray) -> np.ndarray:
            rank = data.ndim
            if not -rank <= axis_attr < rank:
                raise ValueError(
                    f"{op}: axis {axis_attr} is out of range for an input of rank {rank}: "
                    f"expected a value in [{-rank}, {rank - 1}]"
                )
            axis = axis_attr % rank
            if data.shape[axis] == 0:
                raise ValueError(
                    f"{op}: cannot take the index of an empty axis {axis} "
                    f"(input shape {data.shape})"
                )
            x = data
            if x.dtype.kind not in "iubf":  # bfloat16 and other ml_dtypes floats
                x = x.astype(_F32)
            idx = locate(x, axis)
            if (
                x.dtype.kind == "f"
                and x.size
                and _has_nan(x if x.size <= 2048 else _gather(x, idx, axis))
            ):
                # onnxruntime scans from the first element: a leading NaN wins,
                # later NaNs never compare greater/smaller and are skipped.
                nan = np.isnan(x)
                idx = locate(np.where(nan, nan_fill, x), axis)
                first = nan[_first_index((axis,), rank)]
                np.copyto(idx, 0, where=first)
            idx = idx.astype(np.int64, copy=False)
            return idx if keepdims else idx.reshape(idx.shape[:axis] + idx.shape[axis + 1 :])

        return run

    factory.__name__ = factory.__qualname__ = op.lower()
    factory.__doc__ = f"{op}: int64 indices along `axis` (select_last_index from opset 12)."
    return factory


kernel("ArgMax", since=1, factory=True)(_arg_factory("ArgMax", True))
kernel("ArgMin", since=1, factory=True)(_arg_factory("ArgMin", False))
