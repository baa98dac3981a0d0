"""CPU kernels: indexing (Slice, Gather*, Scatter*, Where, Trilu, CumSum, CumProd, NonZero...)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxkiln.ops.attrs import norm_axes, norm_axis
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu._tensor_util import const_input, to_ints
from onnxkiln.providers.cpu.registry import kernel

_I64 = np.dtype(np.int64)
_HALF = frozenset({np.dtype(np.float16), np.dtype("bfloat16")})


def _scalar_int(v: np.ndarray | int, op: str, name: str) -> int:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{op}: '{name}' must be a scalar, got shape {list(a.shape)}")
    return int(a.reshape(-1)[0])


def _first_bad(indices: np.ndarray, size: int) -> int:
    bad = indices[(indices < -size) | (indices >= size)]
    return int(bad.reshape(-1)[0]) if bad.size else 0


# Slice


def _slices(
    shape: tuple[int, ...],
    starts: tuple[int, ...],
    ends: tuple[int, ...],
    axes: tuple[int, ...] | None,
    steps: tuple[int, ...] | None,
) -> tuple[slice, ...]:
    """Python slices for ONNX starts/ends/axes/steps, clamped exactly as the spec says."""
    rank = len(shape)
    n = len(starts)
    if len(ends) != n:
        raise ValueError(f"Slice: {n} starts but {len(ends)} ends")
    axes = tuple(range(n)) if axes is None else norm_axes(axes, rank, "Slice")
    steps = (1,) * n if steps is None else steps
    if len(axes) != n or len(steps) != n:
        raise ValueError(f"Slice: starts, ends, axes and steps must have equal lengths ({n})")
    out = [slice(None)] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ValueError("Slice: steps must not be 0")
        dim = shape[a]
        if s < 0:
            s += dim
        if e < 0:
            e += dim
        if st > 0:
            s = min(max(s, 0), dim)
            e = min(max(e, 0), dim)
            out[a] = slice(s, e, st)
        elif dim == 0:
            out[a] = slice(0, 0)
        else:
            s = min(max(s, 0), dim - 1)
            e = min(max(e, -1), dim - 1)
            out[a] = slice(s, None if e < 0 else e, st)
    return tuple(out)


def _slice_fn(
    starts: tuple[int, ...] | None,
    ends: tuple[int, ...] | None,
    axes: tuple[int, ...] | None,
    steps: tuple[int, ...] | None,
    axes_known: bool,
    steps_known: bool,
) -> Callable[..., np.ndarray]:
    """The Slice kernel: slices worked out per call, or once per input signature when the
    starts/ends/axes/steps are fixed by then (specialize)."""

    def slices(shape, s=None, e=None, a=None, st=None) -> tuple[slice, ...]:
        return _slices(
            shape,
            starts if starts is not None else to_ints(s),
            ends if ends is not None else to_ints(e),
            axes if axes_known else (None if a is None else to_ints(a)),
            steps if steps_known else (None if st is None else to_ints(st)),
        )

    def run(x, s=None, e=None, a=None, st=None):
        return x[slices(x.shape, s, e, a, st)]

    given = (starts is None, ends is None, not axes_known, not steps_known)

    def specialize(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
        values = [*consts[1:5], None, None, None, None][:4]
        if shapes[0] is None or any(need and i + 1 < len(shapes) and shapes[i + 1] is not None
                                    and values[i] is None for i, need in enumerate(given)):
            return None
        sl = slices(shapes[0], *values)
        return lambda x, *_: x[sl]

    run.specialize = specialize
    return run


@kernel("Slice", since=1, until=9, factory=True, view=True)
def slice_v1(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Slice with starts/ends/axes attributes (step 1)."""
    attrs = info.attrs
    axes = attrs.get("axes")
    return _slice_fn(
        to_ints(attrs["starts"]),
        to_ints(attrs["ends"]),
        None if axes is None else to_ints(axes),
        None,
        True,
        True,
    )


@kernel("Slice", since=10, factory=True, view=True)
def slice_(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Slice with starts/ends/axes/steps inputs; negative steps walk backwards."""
    consts = [const_input(info, i) for i in range(1, 5)]
    present = [i < info.n_inputs and (not info.input_present or info.input_present[i])
               for i in range(1, 5)]  # fmt: skip
    s, e, a, st = (None if c is None else to_ints(c) for c in consts)
    return _slice_fn(s, e, a, st, a is not None or not present[2], st is not None or not present[3])


# Gather family


def _gather_error(
    indices: np.ndarray, size: int, axis: int, shape: tuple[int, ...], op: str = "Gather"
) -> IndexError:
    return IndexError(
        f"{op}: index {_first_bad(indices, size)} is out of range for axis {axis} "
        f"of size {size} (data shape {list(shape)}; valid indices are [-{size}, {size - 1}])"
    )


@kernel("Gather", since=1, factory=True)
def gather(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Take slices along `axis` at the given (possibly negative) indices."""
    axis = info.attrs.get("axis") or 0

    def run(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        a = norm_axis(axis, x.ndim, "Gather")
        if indices.ndim == 0:
            n, i = x.shape[a], int(indices)
            if not -n <= i < n:
                raise _gather_error(indices, n, a, x.shape)
            r = x[i] if a == 0 else x[(slice(None),) * a + (i,)]
            return r.copy() if isinstance(r, np.ndarray) else np.array(r, dtype=x.dtype)
        try:
            if a == 0:
                return x[indices]
            return x[(slice(None),) * a + (indices,)]
        except IndexError:
            raise _gather_error(indices, x.shape[a], a, x.shape) from None

    return run


@kernel("GatherElements", since=11, factory=True)
def gather_elements(info: NodeInfo) -> Callable[..., np.ndarray]:
    """out[i][j][k] = data[index][j][k] along `axis`, shaped like the indices."""
    axis = info.attrs.get("axis") or 0

    def run(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        if indices.ndim != x.ndim:
            raise ValueError(
                f"GatherElements: indices rank {indices.ndim} differs from data rank {x.ndim}"
            )
        a = norm_axis(axis, x.ndim, "GatherElements")
        data = x
        if any(i != a and n != d for i, (n, d) in enumerate(zip(indices.shape, x.shape))):
            if any(i != a and n > d for i, (n, d) in enumerate(zip(indices.shape, x.shape))):
                raise ValueError(
                    f"GatherElements: indices shape {list(indices.shape)} exceeds data shape "
                    f"{list(x.shape)} outside axis {a}"
                )
            data = x[tuple(slice(None) if i == a else slice(0, n)
                           for i, n in enumerate(indices.shape))]  # fmt: skip
        try:
            return np.take_along_axis(data, indices, axis=a)
        except IndexError:
            raise _gather_error(indices, x.shape[a], a, x.shape, "GatherElements") from None

    return run


def _normalized_nd(indices: np.ndarray, dims: tuple[int, ...], op: str) -> np.ndarray:
    """Indices over `dims` in the last axis, negatives wrapped, bounds checked."""
    lim = np.array(dims, dtype=_I64)
    idx = indices.astype(_I64, copy=False)
    if idx.size:
        idx = np.where(idx < 0, idx + lim, idx)
        bad = (idx < 0) | (idx >= lim)
        if bad.any():
            where = [int(w) for w in np.argwhere(bad)[0]]
            raise IndexError(
                f"{op}: index {int(indices[tuple(where)])} at indices{where} is out of "
                f"range for a dimension of size {dims[where[-1]]}"
            )
    return idx


@kernel("GatherND", since=11, factory=True)
def gather_nd(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Gather slices addressed by the last axis of `indices`, after `batch_dims` (12+)."""
    b = info.attrs.get("batch_dims") or 0

    def plan(data_shape: tuple, indices: np.ndarray) -> tuple:
        """(table shape, (batch index, flat index), output shape) of one gather."""
        k = indices.shape[-1] if indices.ndim else 0
        if indices.ndim < 1 or k > len(data_shape) - b or data_shape[:b] != indices.shape[:b]:
            raise ValueError(
                f"GatherND: indices shape {list(indices.shape)} does not fit data shape "
                f"{list(data_shape)} with batch_dims={b}"
            )
        batch = data_shape[:b]
        mid = indices.shape[b:-1]
        dims = data_shape[b : b + k]
        rest = data_shape[b + k :]
        n_batch = math.prod(batch)
        idx = _normalized_nd(indices, dims, "GatherND").reshape(n_batch, math.prod(mid), k)
        strides = np.array([math.prod(dims[j + 1 :]) for j in range(k)], dtype=_I64)
        flat = idx @ strides if k else np.zeros(idx.shape[:2], _I64)
        return ((n_batch, math.prod(dims), *rest), (np.arange(n_batch)[:, None], flat),
                (*batch, *mid, *rest))

    def run(data: np.ndarray, indices: np.ndarray) -> np.ndarray:
        table, where, out_shape = plan(data.shape, indices)
        return data.reshape(table)[where].reshape(out_shape)

    def specialize(dtypes, shapes, consts):
        """Indices the signature fixes (a mask gather of exported attention): checked and
        flattened once."""
        if shapes[0] is None or consts[1] is None:
            return None
        table, where, out_shape = plan(shapes[0], np.asarray(consts[1]))
        return lambda data, indices: data.reshape(table)[where].reshape(out_shape)

    run.specialize = specialize
    return run


_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(info: NodeInfo) -> np.ufunc | None:
    mode = info.attrs.get("reduction") or "none"
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode == "none":
        return None
    if mode not in _REDUCE:
        raise ValueError(f"{info.op_type}: unknown reduction {mode!r}")
    return _REDUCE[mode]


@kernel("ScatterND", since=11, factory=True)
def scatter_nd(info: NodeInfo) -> Callable[..., np.ndarray]:
    """A copy of data with `updates` written (or reduced, 16+) at the addressed slices."""
    ufunc = _reduction(info)

    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
        k = indices.shape[-1]
        want = indices.shape[:-1] + data.shape[k:]
        if k > data.ndim or updates.shape != want:
            raise ValueError(
                f"ScatterND: updates shape {list(updates.shape)} should be {list(want)} for "
                f"data {list(data.shape)} and indices {list(indices.shape)}"
            )
        idx = _normalized_nd(indices, data.shape[:k], "ScatterND")
        where = tuple(idx[..., j] for j in range(k))
        out = data.copy()
        if ufunc is None:
            out[where] = updates
        else:
            ufunc.at(out, where, updates)
        return out

    return run


def _scatter_elements_fn(axis: int, ufunc: np.ufunc | None) -> Callable[..., np.ndarray]:
    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
        if indices.shape != updates.shape or indices.ndim != data.ndim:
            raise ValueError(
                f"ScatterElements: indices {list(indices.shape)} and updates "
                f"{list(updates.shape)} must have equal shapes of data's rank {data.ndim}"
            )
        a = norm_axis(axis, data.ndim, "ScatterElements")
        n = data.shape[a]
        idx = indices.astype(_I64, copy=False)
        if idx.size:
            if idx.min() < -n or idx.max() >= n:
                raise _gather_error(idx, n, a, data.shape, "ScatterElements")
            idx = np.where(idx < 0, idx + n, idx)
        where = list(np.ogrid[tuple(slice(0, s) for s in indices.shape)])
        where[a] = idx
        out = data.copy()
        if ufunc is None:
            out[tuple(where)] = updates
        else:
            ufunc.at(out, tuple(where), updates)
        return out

    return run


@kernel("ScatterElements", since=11, factory=True)
def scatter_elements(info: NodeInfo) -> Callable[..., np.ndarray]:
    """A copy of data with updates written (or reduced, 16+) at per-element indices."""
    return _scatter_elements_fn(info.attrs.get("axis") or 0, _reduction(info))


@kernel("Scatter", since=9, factory=True)
def scatter(info: NodeInfo) -> Callable[..., np.ndarray]:
    """The deprecated name of ScatterElements without reduction."""
    return _scatter_elements_fn(info.attrs.get("axis") or 0, None)


# Pad


def _pad(
    x: np.ndarray, pads: tuple[int, ...], mode: str, value, axes: tuple[int, ...] | None
) -> np.ndarray:
    rank = x.ndim
    axes = tuple(range(rank)) if axes is None else norm_axes(axes, rank, "Pad")
    n = len(axes)
    if len(pads) != 2 * n:
        raise ValueError(f"Pad: pads has {len(pads)} values, expected {2 * n} for axes {axes}")
    begin = [0] * rank
    end = [0] * rank
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[i + n]
    if min(begin, default=0) < 0 or min(end, default=0) < 0:  # negative pads crop
        x = x[tuple(slice(max(-b, 0), d - max(-e, 0)) for b, e, d in zip(begin, end, x.shape))]
        begin = [max(b, 0) for b in begin]
        end = [max(e, 0) for e in end]
    if mode == "constant":
        shape = tuple(d + b + e for d, b, e in zip(x.shape, begin, end))
        if x.dtype.kind != "O" and not value:
            out = np.zeros(shape, x.dtype)
        else:
            out = np.full(shape, value, x.dtype)
        out[tuple(slice(b, b + d) for b, d in zip(begin, x.shape))] = x
        return out
    if mode not in ("reflect", "edge", "wrap"):
        raise ValueError(f"Pad: unknown mode {mode!r}")
    if not any(begin) and not any(end):
        return x.copy()
    for a, (b, e, d) in enumerate(zip(begin, end, x.shape)):
        if (b or e) and d == 0:
            raise ValueError(f"Pad: cannot {mode}-pad empty axis {a} (shape {list(x.shape)})")
        if mode == "reflect" and max(b, e) > d - 1:
            raise ValueError(
                f"Pad: reflect pads ({b}, {e}) exceed the maximum {d - 1} for axis {a} "
                f"(shape {list(x.shape)})"
            )
    try:
        return np.pad(x, list(zip(begin, end)), mode=mode)
    except ValueError as err:
        raise ValueError(f"Pad: {mode} padding of shape {list(x.shape)} failed: {err}") from None


def _mode(info: NodeInfo) -> str:
    mode = info.attrs.get("mode") or "constant"
    return mode.decode() if isinstance(mode, bytes) else mode


@kernel("Pad", since=1, until=10, factory=True)
def pad_v2(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Pad with the `pads` (opset 1: `paddings`) and `value` attributes."""
    pads = info.attrs.get("pads")
    if pads is None:
        pads = info.attrs.get("paddings")
    pads = to_ints(pads)
    mode = _mode(info)
    value = float(info.attrs.get("value") or 0.0)
    return lambda x: _pad(x, pads, mode, x.dtype.type(value), None)


@kernel("Pad", since=11, factory=True)
def pad(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Pad with pads/constant_value/axes (18+) inputs; constant, reflect, edge, wrap (19+)."""
    mode = _mode(info)
    c_pads, c_value, c_axes = (const_input(info, i) for i in (1, 2, 3))
    fixed_pads = None if c_pads is None else to_ints(c_pads)
    fixed_axes = None if c_axes is None else to_ints(c_axes)

    def run(x, pads, constant_value=None, axes=None):
        p = fixed_pads if fixed_pads is not None else to_ints(pads)
        ax = fixed_axes if fixed_axes is not None else (None if axes is None else to_ints(axes))
        cv = c_value if c_value is not None else constant_value
        if cv is None or cv.size == 0:
            value = "" if x.dtype.kind == "O" else 0
        else:
            value = cv.reshape(-1)[0]
        return _pad(x, p, mode, value, ax)

    return run


# Where / Trilu / CumSum


@kernel("Where", since=9)
def where(condition: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Elementwise select with broadcasting: x where condition, else y."""
    return np.where(condition, x, y)


@kernel("Trilu", since=14, factory=True)
def trilu(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Keep the upper (or lower) triangle of the last two axes, offset by k."""
    upper = info.attrs.get("upper", 1)
    c = const_input(info, 1)
    fixed = None if c is None else _scalar_int(c, "Trilu", "k")
    op = np.triu if upper else np.tril

    def run(x: np.ndarray, k: np.ndarray | None = None) -> np.ndarray:
        kk = fixed if fixed is not None else (0 if k is None else _scalar_int(k, "Trilu", "k"))
        if x.ndim < 2:
            raise ValueError(f"Trilu: input must have rank >= 2, got shape {list(x.shape)}")
        return op(x, kk)

    return run


@kernel("CumSum", since=11, factory=True)
def cumsum(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Running sum along `axis`; exclusive and reverse variants; half types sum in float32."""
    exclusive = info.attrs.get("exclusive") or 0
    reverse = info.attrs.get("reverse") or 0
    c = const_input(info, 1)
    fixed = None if c is None else _scalar_int(c, "CumSum", "axis")

    def run(x: np.ndarray, axis: np.ndarray) -> np.ndarray:
        a = norm_axis(fixed if fixed is not None else _scalar_int(axis, "CumSum", "axis"),
                      x.ndim, "CumSum")  # fmt: skip
        work = np.dtype(np.float32) if x.dtype in _HALF else x.dtype
        src = np.flip(x, a) if reverse else x
        if exclusive:
            out = np.zeros(x.shape, work)
            lead = (slice(None),) * a
            if x.shape[a] > 1:
                np.cumsum(src[(*lead, slice(0, -1))], axis=a, dtype=work,
                          out=out[(*lead, slice(1, None))])  # fmt: skip
        else:
            out = np.cumsum(src, axis=a, dtype=work)
        if reverse:
            out = np.flip(out, a)
        return out if work == x.dtype else out.astype(x.dtype)

    return run


@kernel("CumProd", since=26, factory=True)
def cumprod(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Running product along `axis`; exclusive and reverse variants; half types in float32."""
    exclusive = info.attrs.get("exclusive") or 0
    reverse = info.attrs.get("reverse") or 0
    c = const_input(info, 1)
    fixed = None if c is None else _scalar_int(c, "CumProd", "axis")

    def run(x: np.ndarray, axis: np.ndarray) -> np.ndarray:
        a = norm_axis(fixed if fixed is not None else _scalar_int(axis, "CumProd", "axis"),
                      x.ndim, "CumProd")  # fmt: skip
        work = np.dtype(np.float32) if x.dtype in _HALF else x.dtype
        src = np.flip(x, a) if reverse else x
        if exclusive:
            out = np.ones(x.shape, work)
            lead = (slice(None),) * a
            if x.shape[a] > 1:
                np.cumprod(src[(*lead, slice(0, -1))], axis=a, dtype=work,
                           out=out[(*lead, slice(1, None))])  # fmt: skip
        else:
            out = np.cumprod(src, axis=a, dtype=work)
        if reverse:
            out = np.flip(out, a)
        return out if work == x.dtype else out.astype(x.dtype)

    return run


# Data-dependent shapes


@kernel("NonZero", since=9, capture=CaptureSupport.DATA_DEPENDENT_SHAPE)
def nonzero(x: np.ndarray) -> np.ndarray:
    """Indices of the non-zero elements, shape (rank, count); a scalar counts as rank 1."""
    if x.ndim == 0:
        x = x.reshape(1)
    return np.array(np.nonzero(x), dtype=_I64).reshape(x.ndim, -1)


@kernel("Compress", since=9, capture=CaptureSupport.DATA_DEPENDENT_SHAPE)
def compress(x: np.ndarray, condition: np.ndarray, *, axis: int | None) -> np.ndarray:
    """Slices along `axis` (or elements of the flattened input) where condition is true."""
    cond = condition.reshape(-1).astype(bool, copy=False)
    if axis is None:
        flat = x.reshape(-1)
        if cond.size > flat.size:
            cond = cond[: flat.size]
        return np.compress(cond, flat)
    a = norm_axis(axis, x.ndim, "Compress")
    if cond.size > x.shape[a]:  # onnxruntime ignores entries past the axis, even true ones
        cond = cond[: x.shape[a]]
    return np.compress(cond, x, axis=a)


@kernel("ReverseSequence", since=10, factory=True)
def reverse_sequence(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Reverse the first sequence_lens[b] steps along time_axis for each batch entry b."""
    batch_axis = info.attrs.get("batch_axis", 1)
    time_axis = info.attrs.get("time_axis", 0)

    def run(x: np.ndarray, sequence_lens: np.ndarray) -> np.ndarray:
        b = norm_axis(batch_axis, x.ndim, "ReverseSequence")
        t = norm_axis(time_axis, x.ndim, "ReverseSequence")
        if b == t:
            raise ValueError("ReverseSequence: batch_axis and time_axis must differ")
        n_batch, n_time = x.shape[b], x.shape[t]
        lens = sequence_lens.reshape(-1).astype(_I64, copy=False)
        if lens.size != n_batch or (lens.size and (lens.min() < 0 or lens.max() > n_time)):
            raise ValueError(
                f"ReverseSequence: sequence_lens {lens.tolist()} must have {n_batch} entries "
                f"in [0, {n_time}]"
            )
        steps = np.arange(n_time, dtype=_I64)
        lim = lens[:, None]
        idx = np.where(steps < lim, lim - 1 - steps, steps)  # (batch, time)
        if t < b:
            idx = idx.T
        shape = [1] * x.ndim
        shape[b], shape[t] = n_batch, n_time
        return np.take_along_axis(x, idx.reshape(shape), axis=t)

    return run
