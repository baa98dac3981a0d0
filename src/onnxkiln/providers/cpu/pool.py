"""CPU kernels: MaxPool, AveragePool, LpPool, their Global forms, MaxRoiPool, MaxUnpool."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnxkiln.ops.window import Geometry, int_tuple, pool_geometry, window_counts
from onnxkiln.pool import active_threads, parallel_for
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu import _conv_special, _numba
from onnxkiln.providers.cpu._gemm import split_ranges
from onnxkiln.providers.cpu._window import compute_dtype, padded_copy, window_slices
from onnxkiln.providers.cpu.registry import kernel

__all__ = [
    "average_pool",
    "global_average_pool",
    "global_lp_pool",
    "global_max_pool",
    "lp_pool",
    "max_pool",
    "max_roi_pool",
    "max_unpool",
]

_I64 = np.dtype(np.int64)
_F32 = np.dtype(np.float32)


@dataclass(frozen=True, slots=True)
class _PoolPlan:
    geo: Geometry
    steps: tuple[tuple[tuple[slice, ...], ...], ...]  # per reduced axis: one index per tap
    divisor: np.ndarray | float | None  # AveragePool only


def _separable_steps(geo: Geometry) -> tuple[tuple[tuple[slice, ...], ...], ...]:
    """Index tuples reducing one spatial axis at a time (max/sum over a box are separable)."""
    nsp = len(geo.kernel)
    steps = []
    for i in range(nsp):
        if geo.kernel[i] == 1 and geo.strides[i] == 1 and geo.padded[i] == geo.out[i]:
            continue
        lead = (slice(None),) * (2 + i)
        steps.append(tuple((*lead, window_slices(geo, i, j)) for j in range(geo.kernel[i])))
    return tuple(steps)


def _reduce(a: np.ndarray, steps, ufunc: np.ufunc) -> np.ndarray:
    """Apply the separable window steps; the result is always a fresh array."""
    for taps in steps:
        out = np.empty(a[taps[0]].shape, dtype=a.dtype)
        if len(taps) == 1:
            np.copyto(out, a[taps[0]])
        else:
            ufunc(a[taps[0]], a[taps[1]], out=out)
            for idx in taps[2:]:
                ufunc(out, a[idx], out=out)
        a = out
    return a


def _pool_kernel(build: Callable[[tuple, np.dtype], _PoolPlan],
                 body: Callable[[np.ndarray, _PoolPlan], object]) -> Callable[..., object]:
    """A pooling kernel: `body(x, plan)` with the plan (geometry, window steps) built per
    call, or once per input signature (specialize)."""

    def run(x: np.ndarray):
        return body(x, build(x.shape, x.dtype))

    def specialize(dtypes, shapes, consts) -> Callable[..., object] | None:
        if shapes[0] is None or dtypes[0] is None:
            return None
        plan = build(shapes[0], dtypes[0])
        return lambda x: body(x, plan)

    run.specialize = specialize
    return run


def _lowest(dtype: np.dtype):
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


# ---------------------------------------------------------------------------- MaxPool


def _argmax_taps(geo: Geometry) -> tuple[tuple[slice, ...], ...]:
    """One N-d index per kernel position, row-major (first maximum in scan order wins)."""
    nsp = len(geo.kernel)
    return tuple(
        (slice(None), slice(None), *(window_slices(geo, i, pos[i]) for i in range(nsp)))
        for pos in itertools.product(*(range(k) for k in geo.kernel))
    )


def _flat_indices(arg: np.ndarray, geo: Geometry, storage_order: int) -> np.ndarray:
    """Kernel-position ids -> flat indices into the unpadded input tensor (int64)."""
    nsp = len(geo.kernel)
    sizes = geo.in_shape
    if storage_order:
        mult = [math.prod(sizes[:i]) for i in range(nsp)]
    else:
        mult = [math.prod(sizes[i + 1:]) for i in range(nsp)]
    n, c = arg.shape[:2]
    per_image = math.prod(sizes)
    flat = (np.arange(n * c, dtype=_I64) * per_image).reshape(n, c, *([1] * nsp))
    flat = np.broadcast_to(flat, arg.shape).copy()
    rest = arg.astype(_I64)
    for i in reversed(range(nsp)):
        k = geo.kernel[i]
        pos = rest % k if i else rest
        rest = rest // k
        shape = [1] * (nsp + 2)
        shape[2 + i] = geo.out[i]
        start = np.arange(geo.out[i], dtype=_I64) * geo.strides[i] - geo.pads_begin[i]
        coord = start.reshape(shape) + pos * geo.dilations[i]
        flat += coord * mult[i]
    return flat


def _max_with_indices(x: np.ndarray, geo: Geometry, taps, storage_order: int):
    dtype = x.dtype
    work = np.dtype(np.int16) if dtype.itemsize == 1 and dtype.kind in "iu" else dtype
    if work.kind == "V":
        work = np.dtype(np.float32)
    xp = padded_copy(x, geo, _lowest(work), work) if geo.needs_pad else np.asarray(x, work)
    best = xp[taps[0]].copy()
    arg = np.zeros(best.shape, dtype=np.int32)
    mask = np.empty(best.shape, dtype=bool)
    for j, idx in enumerate(taps[1:], start=1):
        view = xp[idx]
        np.greater(view, best, out=mask)
        np.copyto(best, view, where=mask)
        np.copyto(arg, j, where=mask)
    return best.astype(dtype, copy=False), _flat_indices(arg, geo, storage_order)


@kernel("MaxPool", since=1, factory=True, multi_output=True, variant="maxpool.separable")
def max_pool(info: NodeInfo):
    """MaxPool: separable per-axis max over shifted views; Indices by a per-tap argmax."""
    attrs = dict(info.attrs)
    storage_order = int(attrs.get("storage_order") or 0)
    present = info.output_present or (True,) * info.n_outputs
    want_indices = info.n_outputs > 1 and present[1]

    def build(shape: tuple, dtype: np.dtype) -> _PoolPlan:
        geo = pool_geometry(attrs, shape)
        steps = _argmax_taps(geo) if want_indices else _separable_steps(geo)
        return _PoolPlan(geo, steps, None)

    extra = (None,) * max(0, info.n_outputs - 1)

    fast = None if want_indices else _numba.lazy("maxpool_planes", _F32)

    def body(x: np.ndarray, plan: _PoolPlan):
        geo = plan.geo
        if want_indices:
            return _max_with_indices(x, geo, plan.steps, storage_order)
        work = np.dtype(np.float32) if x.dtype.kind == "V" else x.dtype
        if geo.needs_pad:
            xp = padded_copy(x, geo, _lowest(work), work)
        else:
            xp = x if work == x.dtype else x.astype(work)
        y = _reduce(xp, plan.steps, np.maximum)
        if y is x:
            y = x.copy()
        return (y.astype(x.dtype, copy=False), *extra)

    run = _pool_kernel(build, body)
    generic = run.specialize

    def specialize(dtypes, shapes, consts):
        """float32 2-D pooling without indices: the numba stride-phase kernel, channels
        split across the pool; else the separable plan."""
        sx = shapes[0]
        if (fast is None or sx is None or len(sx) != 4 or dtypes[0] != _F32
                or not fast.ready()):
            return generic(dtypes, shapes, consts)
        geo = pool_geometry(attrs, sx)
        call = _maxpool_call(fast.fn, geo, (*sx[:2], *geo.out))
        return lambda x: (call(x), *extra)

    run.specialize = specialize
    return run


def _maxpool_call(fn, geo: Geometry, out_shape: tuple[int, ...]):
    """A 2-D MaxPool of one shape through the numba kernel, channels split across the pool."""
    channels = out_shape[1]
    params = (*geo.strides, *geo.dilations, *geo.pads_begin)
    ranges = ((0, channels),)
    work = math.prod(out_shape) * math.prod(geo.kernel)
    if active_threads() > 1 and work >= _conv_special.DW_SPLIT_MIN:
        ranges = split_ranges(channels, min(2 * active_threads(), max(1, channels // 8)), 8)

    def call(x: np.ndarray) -> np.ndarray:
        x4 = np.ascontiguousarray(x)
        out = np.empty(out_shape, x4.dtype)
        parallel_for(len(ranges), lambda i: fn(x4, geo.kernel, params, *ranges[i], out))
        return out

    return call


def _maxpool_signature(dt: np.dtype) -> tuple:
    from numba import types

    i64 = types.int64
    return (types.Array(types.float32, 4, "C", readonly=True), types.UniTuple(i64, 2),
            types.UniTuple(i64, 6), i64, i64, types.Array(types.float32, 4, "C"))


_numba.register("maxpool_planes", "onnxkiln.providers.cpu._numba_conv", _maxpool_signature,
                (_F32,), {"reassoc", "contract", "nsz", "arcp"})


# ---------------------------------------------------------------------------- AveragePool / LpPool


@kernel("AveragePool", since=1, factory=True, variant="averagepool.separable")
def average_pool(info: NodeInfo):
    """AveragePool: separable per-axis sums over shifted views, divided by the window counts."""
    attrs = dict(info.attrs)
    include_pad = bool(attrs.get("count_include_pad") or 0)

    def build(shape: tuple, dtype: np.dtype) -> _PoolPlan:
        geo = pool_geometry(attrs, shape)
        div = window_counts(geo, include_pad)
        if not isinstance(div, float):
            div = np.asarray(div, dtype=compute_dtype(dtype))
        return _PoolPlan(geo, _separable_steps(geo), div)

    def body(x: np.ndarray, plan: _PoolPlan) -> np.ndarray:
        cdt = compute_dtype(x.dtype)
        div = plan.divisor
        if plan.geo.needs_pad:
            xp = padded_copy(x, plan.geo, 0, cdt)
        else:
            xp = x if x.dtype == cdt else x.astype(cdt)
        y = _reduce(xp, plan.steps, np.add)
        if y is x:
            y = x.copy()
        np.divide(y, div, out=y)
        return y.astype(x.dtype, copy=False)

    return _pool_kernel(build, body)


def _lp_power(x: np.ndarray, p: float, cdt: np.dtype, geo: Geometry | None) -> np.ndarray:
    """|x|**p in a fresh buffer (zero-padded when geo says so)."""
    buf = padded_copy(x, geo, 0, cdt) if geo is not None and geo.needs_pad else x.astype(cdt)
    if p == 2.0:
        np.square(buf, out=buf)
    else:
        np.abs(buf, out=buf)
        if p != 1.0:
            np.power(buf, cdt.type(p), out=buf)
    return buf


def _lp_root(y: np.ndarray, p: float) -> np.ndarray:
    if p == 2.0:
        np.sqrt(y, out=y)
    elif p != 1.0:
        np.power(y, y.dtype.type(1.0 / p), out=y)
    return y


@kernel("LpPool", since=1, factory=True, variant="lppool.separable")
def lp_pool(info: NodeInfo):
    """LpPool: (sum over the window of |x|**p) ** (1/p), pads contributing zeros."""
    attrs = dict(info.attrs)
    p = float(attrs.get("p") if attrs.get("p") is not None else 2)

    def build(shape: tuple, dtype: np.dtype) -> _PoolPlan:
        geo = pool_geometry(attrs, shape)
        return _PoolPlan(geo, _separable_steps(geo), None)

    def body(x: np.ndarray, plan: _PoolPlan) -> np.ndarray:
        cdt = compute_dtype(x.dtype)
        y = _reduce(_lp_power(x, p, cdt, plan.geo), plan.steps, np.add)
        return _lp_root(y, p).astype(x.dtype, copy=False)

    return _pool_kernel(build, body)


# ---------------------------------------------------------------------------- Global pools


def _global_shape(x: np.ndarray) -> tuple[int, ...]:
    if x.ndim < 3:
        raise ValueError(f"global pooling needs input (N, C, D1, ...), got shape {x.shape}")
    return (*x.shape[:2], *([1] * (x.ndim - 2)))


@kernel("GlobalAveragePool", since=1, factory=True, variant="globalaveragepool.blas")
def global_average_pool(info: NodeInfo):
    """GlobalAveragePool: per-(N, C) mean as a BLAS matrix-vector product with ones."""
    ones: dict[tuple[int, np.dtype], np.ndarray] = {}

    def run(x: np.ndarray) -> np.ndarray:
        shape = _global_shape(x)
        cdt = compute_dtype(x.dtype)
        rows = x.reshape(shape[0] * shape[1], math.prod(x.shape[2:]))
        if rows.dtype != cdt:
            rows = rows.astype(cdt)
        size = rows.shape[1]
        vec = ones.get((size, cdt))
        if vec is None:
            vec = ones[(size, cdt)] = np.ones(size, dtype=cdt)
        y = np.matmul(rows, vec)
        np.divide(y, cdt.type(size), out=y)
        return y.astype(x.dtype, copy=False).reshape(shape)

    return run


@kernel("GlobalMaxPool", since=1, variant="globalmaxpool.numpy")
def global_max_pool(x: np.ndarray) -> np.ndarray:
    """GlobalMaxPool: max over all spatial axes, kept as size-1 dims."""
    shape = _global_shape(x)
    work = x.astype(np.float32) if x.dtype.kind == "V" else x
    y = np.max(work.reshape(*shape[:2], math.prod(x.shape[2:])), axis=2)
    return y.astype(x.dtype, copy=False).reshape(shape)


@kernel("GlobalLpPool", since=1, variant="globallppool.numpy")
def global_lp_pool(x: np.ndarray, *, p) -> np.ndarray:
    """GlobalLpPool: (sum over all spatial positions of |x|**p) ** (1/p)."""
    shape = _global_shape(x)
    pf = float(p)
    buf = _lp_power(x, pf, compute_dtype(x.dtype), None)
    y = np.sum(buf.reshape(*shape[:2], math.prod(x.shape[2:])), axis=2)
    return _lp_root(y, pf).astype(x.dtype, copy=False).reshape(shape)


# ---------------------------------------------------------------------------- MaxRoiPool, MaxUnpool


def _round_half_away(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _roi_bins(start: int, end: int, pooled: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) input ranges of the `pooled` bins of one RoI axis, clipped to [0, limit)."""
    size = max(end - start + 1, 1)
    edges = np.arange(pooled + 1, dtype=np.float64) * (size / pooled)
    lo = np.clip(np.floor(edges[:-1]).astype(np.int64) + start, 0, limit)
    hi = np.clip(np.ceil(edges[1:]).astype(np.int64) + start, 0, limit)
    return lo, hi


@kernel("MaxRoiPool", since=1, variant="maxroipool.reduceat")
def max_roi_pool(x: np.ndarray, rois: np.ndarray, *, pooled_shape, spatial_scale) -> np.ndarray:
    """MaxRoiPool: max over each RoI's pooled_shape grid of bins (empty bins give 0)."""
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 5:
        raise ValueError(f"MaxRoiPool expects X (N, C, H, W) and rois (R, 5); got "
                         f"{x.shape} and {rois.shape}")
    ph, pw = (int(v) for v in pooled_shape)
    n, c, h, w = x.shape
    cdt = compute_dtype(x.dtype)
    out = np.zeros((rois.shape[0], c, ph, pw), dtype=cdt)
    r = rois.astype(np.float64)
    batch = r[:, 0].astype(np.int64)
    if batch.size and (batch.min() < 0 or batch.max() >= n):
        raise IndexError(f"MaxRoiPool: roi batch index out of range [0, {n}): {batch.tolist()}")
    box = _round_half_away(r[:, 1:] * float(spatial_scale)).astype(np.int64)
    for i in range(r.shape[0]):
        x1, y1, x2, y2 = box[i]
        hlo, hhi = _roi_bins(y1, y2, ph, h)
        wlo, whi = _roi_bins(x1, x2, pw, w)
        top, bottom, left, right = hlo.min(), hhi.max(), wlo.min(), whi.max()
        if bottom <= top or right <= left:
            continue
        region = np.full((c, bottom - top + 1, right - left + 1), -np.inf, dtype=cdt)
        region[:, :-1, :-1] = x[batch[i], :, top:bottom, left:right]
        hidx = np.stack([hlo - top, hhi - top], axis=1).ravel()
        widx = np.stack([wlo - left, whi - left], axis=1).ravel()
        rows = np.maximum.reduceat(region, hidx, axis=1)[:, ::2]
        cells = np.maximum.reduceat(rows, widx, axis=2)[:, :, ::2]
        empty = (hhi <= hlo)[:, None] | (whi <= wlo)[None, :]
        out[i] = np.where(empty, 0, cells)
    return out.astype(x.dtype, copy=False)


def _in_own_window(flat: np.ndarray, shape: tuple, k, s, pads_begin) -> bool:
    """Whether every index, read as a flat position in `shape`, lies in its pooling window."""
    coords = np.unravel_index(flat, shape)
    lead = np.indices(flat.shape, sparse=True)
    if not all((coords[i] == lead[i]).all() for i in range(2)):
        return False
    for i in range(len(k)):
        start = lead[2 + i] * s[i] - pads_begin[i]
        off = coords[2 + i] - start
        if ((off < 0) | (off >= k[i])).any():
            return False
    return True


@kernel("MaxUnpool", since=9, factory=True, variant="maxunpool.scatter")
def max_unpool(info: NodeInfo):
    """MaxUnpool: scatter X into zeros at the flat positions I (MaxPool's Indices output).

    With an output_shape larger than the shape kernel_shape/strides/pads give, I is read as
    flat positions in output_shape (MaxPool's input; onnxruntime, PyTorch) unless that puts
    some value outside its pooling window while reading I in the attribute-given shape does
    not: then that tensor is zero-padded at the end of each axis, as the ONNX backend test
    test_maxunpool_export_with_output_shape expects.
    """
    attrs = dict(info.attrs)

    def run(x: np.ndarray, indices: np.ndarray, output_shape: np.ndarray | None = None):
        if indices.shape != x.shape:
            raise ValueError(f"MaxUnpool: I shape {indices.shape} must equal X shape {x.shape}")
        nsp = x.ndim - 2
        k = int_tuple(attrs.get("kernel_shape"), nsp, 1, "kernel_shape")
        s = int_tuple(attrs.get("strides"), nsp, 1, "strides")
        pads = int_tuple(attrs.get("pads"), 2 * nsp, 0, "pads")
        inferred = (*x.shape[:2], *((x.shape[2 + i] - 1) * s[i] + k[i] - pads[i] - pads[nsp + i]
                                    for i in range(nsp)))
        shape = inferred
        if output_shape is not None:
            shape = tuple(int(v) for v in np.asarray(output_shape).ravel())
            if len(shape) != x.ndim or shape[:2] != x.shape[:2]:
                raise ValueError(f"MaxUnpool: output_shape {list(shape)} must have rank {x.ndim} "
                                 f"and start with X's (N, C) {x.shape[:2]}")
        total = math.prod(shape)
        flat = indices.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= total):
            raise IndexError(f"MaxUnpool: indices must lie in [0, {total}) for output shape "
                             f"{shape}; got range [{flat.min()}, {flat.max()}]")
        grow = (shape != inferred and all(a >= b for a, b in zip(shape, inferred))
                and flat.size and flat.max() < math.prod(inferred)
                and not _in_own_window(indices, shape, k, s, pads[:nsp])
                and _in_own_window(indices, inferred, k, s, pads[:nsp]))
        scatter_shape = inferred if grow else shape
        y = np.zeros(math.prod(scatter_shape), dtype=x.dtype)
        y[flat] = x.reshape(-1)
        y = y.reshape(scatter_shape)
        if grow:
            out = np.zeros(shape, dtype=x.dtype)
            out[tuple(slice(0, n) for n in inferred)] = y
            y = out
        return y

    return run
