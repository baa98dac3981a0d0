"""Torch kernels: Cast, shape and layout ops (Reshape, Transpose, Concat, Split, Slice, Pad...).

Shape-like operands (Reshape's shape, Slice's starts/ends/axes/steps, Pad's pads...) are host
inputs: they arrive as numpy arrays and never cause a device read.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch

from onnxkiln.dtypes import DataType
from onnxkiln.ops.generator import constant_value, range_values
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cuda._util import attr_str, axes_of, axis_of, ints
from onnxkiln.providers.cuda.device import current_device
from onnxkiln.providers.cuda.dtypes import (
    FLOAT8,
    SERVED,
    SUB_BYTE,
    from_carrier,
    is_sub_byte,
    needs,
    to_carrier,
    to_torch,
    to_torch_dtype,
)
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor


# ---------------------------------------------------------------------------------------
# Cast

_F8 = frozenset(to_torch_dtype(d) for d in FLOAT8)


def _target(to) -> DataType:
    name = attr_str(to) if isinstance(to, (str, bytes)) else None
    if name:
        return DataType[name.upper()]
    return DataType(int(to))


_CASTABLE = SERVED | FLOAT8 | SUB_BYTE


def _cast_supports(info: NodeInfo) -> str | None:
    try:
        dst = _target(info.attrs["to"])
    except (KeyError, ValueError):
        return "Cast: unknown target type"
    if dst not in _CASTABLE:
        return f"Cast to {dst} is not supported by the torch kernels (the CPU provider runs it)"
    return needs(_CASTABLE)(info)


def convert(x: Tensor, dst: torch.dtype, saturate: bool) -> Tensor:
    """x as `dst` with the CPU provider's Cast semantics: floats to ints truncate toward
    zero; int4/uint4/int2/uint2 wrap (two's complement) from the truncated value; float8 goes
    through float32 and, with `saturate`, clips to +-max (infinities included), else
    overflows to inf/NaN as onnx specifies."""
    if x.dtype == dst:
        return x
    x = to_carrier(x)
    if is_sub_byte(dst):
        v = x.to(torch.float32).trunc() if x.dtype.is_floating_point else x
        return from_carrier(v.to(torch.int64), dst)
    if dst in _F8:
        f = x.to(torch.float32)
        if not saturate:
            return float8_overflowing(f, dst)
        top = torch.finfo(dst).max
        return f.clamp(-top, top).to(dst)
    return x.to(torch.float32).to(dst) if x.dtype in _F8 else x.to(dst)


@kernel("Cast", since=1, factory=True, view=True, supports=_cast_supports)
def cast(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Convert to the `to` type (see `convert`); the input itself if it has that type."""
    dst = to_torch_dtype(_target(info.attrs["to"]))
    saturate = bool(int(info.attrs.get("saturate", 1)))
    return lambda x: convert(x, dst, saturate)


# |x| past which a float32 rounds out of each float8 range, and whether the tie at that
# point rounds out too (the largest value's mantissa is odd: round half to even goes up)
_F8_EDGE = {torch.float8_e4m3fn: (464.0, False), torch.float8_e4m3fnuz: (248.0, True),
            torch.float8_e5m2: (61440.0, True), torch.float8_e5m2fnuz: (61440.0, True)}


def float8_overflowing(f: Tensor, dst: torch.dtype) -> Tensor:
    """float32 -> float8 without saturation: what rounds past the range is inf (float8e5m2)
    or NaN (the types without infinities), as onnx specifies; torch's own conversion
    saturates some of those."""
    edge, tie_out = _F8_EDGE[dst]
    mag = f.abs()
    over = (mag >= edge) if tie_out else (mag > edge)
    y = f.to(dst)
    if dst == torch.float8_e5m2:
        big = torch.where(f > 0, math.inf, -math.inf).to(dst)
    else:
        big = torch.full((), math.nan, dtype=torch.float32, device=f.device).to(dst)
    return torch.where(over, big, y)


@kernel("CastLike", since=15, factory=True, view=True, supports=needs(_CASTABLE))
def cast_like(info: NodeInfo) -> Callable[[Tensor, Tensor], Tensor]:
    """Convert x to the element type of the second input (as Cast does)."""
    saturate = bool(int(info.attrs.get("saturate", 1)))
    return lambda x, like: convert(x, like.dtype, saturate)


# ---------------------------------------------------------------------------------------
# Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Identity


def _reshape_dims(x: Tensor, dims: list[int], allowzero: int) -> list[int]:
    if not allowzero:
        dims = [x.shape[i] if d == 0 and i < x.ndim else d for i, d in enumerate(dims)]
    return dims


@kernel("Reshape", since=1, until=4, factory=True, view=True, supports=needs(SERVED))
def reshape_v1(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Reshape with the `shape` attribute (0 copies a dim, -1 is inferred)."""
    dims = ints(info.attrs.get("shape") or [])
    return lambda x: x.reshape(_reshape_dims(x, dims, 0))


@kernel("Reshape", since=5, factory=True, view=True, host_inputs=(1,),
        supports=needs(SERVED, skip_inputs=(1,)))
def reshape(info: NodeInfo) -> Callable[..., Tensor]:
    """Reshape to the host shape input; allowzero=1 (opset 14+) keeps 0 as a real size."""
    allowzero = int(info.attrs.get("allowzero") or 0)
    return lambda x, shape: x.reshape(_reshape_dims(x, ints(shape), allowzero))


@kernel("Flatten", since=1, factory=True, view=True, supports=needs(SERVED))
def flatten(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """2-D: dims before `axis` into rows, the rest into columns."""
    axis = int(info.attrs["axis"])

    def run(x: Tensor) -> Tensor:
        ax = axis + x.ndim if axis < 0 else axis
        if not 0 <= ax <= x.ndim:
            raise ValueError(f"Flatten: axis {axis} out of range for rank {x.ndim}")
        return x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))

    return run


def _squeeze(x: Tensor, axes: list[int] | None) -> Tensor:
    if axes is None:
        return x.reshape([d for d in x.shape if d != 1])
    axs = axes_of(axes, x.ndim, "Squeeze")
    for a in axs:
        if x.shape[a] != 1:
            raise ValueError(f"Squeeze: axis {a} has size {x.shape[a]}, not 1")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axs])


def _unsqueeze(x: Tensor, axes: list[int]) -> Tensor:
    rank = x.ndim + len(axes)
    axs = sorted(axes_of(axes, rank, "Unsqueeze"))
    shape = list(x.shape)
    for a in axs:
        shape.insert(a, 1)
    return x.reshape(shape)


@kernel("Squeeze", since=1, until=12, factory=True, view=True, supports=needs(SERVED))
def squeeze_v1(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Drop the size-1 `axes` (attribute), or all size-1 dims."""
    axes = info.attrs.get("axes")
    axes = None if axes is None else ints(axes)
    return lambda x: _squeeze(x, axes)


@kernel("Squeeze", since=13, view=True, host_inputs=(1,),
        supports=needs(SERVED, skip_inputs=(1,)))
def squeeze(x: Tensor, axes=None) -> Tensor:
    """Drop the size-1 dims in the host `axes` input, or all size-1 dims."""
    return _squeeze(x, None if axes is None else ints(axes))


@kernel("Unsqueeze", since=1, until=12, factory=True, view=True, supports=needs(SERVED))
def unsqueeze_v1(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Insert size-1 dims at `axes` (attribute, positions in the output)."""
    axes = ints(info.attrs["axes"])
    return lambda x: _unsqueeze(x, axes)


@kernel("Unsqueeze", since=13, view=True, host_inputs=(1,),
        supports=needs(SERVED, skip_inputs=(1,)))
def unsqueeze(x: Tensor, axes) -> Tensor:
    """Insert size-1 dims at the host `axes` input (positions in the output)."""
    return _unsqueeze(x, ints(axes))


@kernel("Transpose", since=1, factory=True, view=True, supports=needs(SERVED))
def transpose(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Permute the dims by `perm` (default: reversed); a strided view."""
    perm = info.attrs.get("perm")
    perm = None if perm is None else ints(perm)

    def run(x: Tensor) -> Tensor:
        p = list(range(x.ndim))[::-1] if perm is None else perm
        if sorted(axes_of(p, x.ndim, "Transpose")) != list(range(x.ndim)):
            raise ValueError(f"Transpose: perm {p} is not a permutation of rank {x.ndim}")
        return x.permute(p)

    return run


@kernel("Identity", since=1, view=True, supports=needs(SERVED))
def identity(x: Tensor) -> Tensor:
    """The input itself."""
    return x


# ---------------------------------------------------------------------------------------
# Concat, Split


@kernel("Concat", since=1, factory=True, supports=needs(SERVED))
def concat(info: NodeInfo) -> Callable[..., Tensor]:
    """Join along `axis` (opset 1 default 1)."""
    axis = info.attrs.get("axis")
    axis = 1 if axis is None else int(axis)

    def run(*xs: Tensor) -> Tensor:
        ax = axis_of(axis, xs[0].ndim, "Concat")
        return torch.cat(xs, dim=ax)

    return run


def _split_sizes(dim: int, n: int, split: list[int] | None, num_outputs) -> list[int]:
    if split is not None:
        if sum(split) != dim or any(s < 0 for s in split) or len(split) != n:
            raise ValueError(f"Split: split {split} does not fit an axis of size {dim} into "
                             f"{n} outputs")
        return split
    if num_outputs:
        chunk = -(-dim // num_outputs)
        last = dim - chunk * (num_outputs - 1)
        if last < 0:
            raise ValueError(f"Split: cannot split an axis of size {dim} into {num_outputs} parts")
        return [chunk] * (num_outputs - 1) + [last]
    if dim % n:
        raise ValueError(f"Split: an axis of size {dim} is not evenly splittable into {n} parts")
    return [dim // n] * n


@kernel("Split", since=1, factory=True, multi_output=True, view=True, host_inputs=(1,),
        supports=needs(SERVED, skip_inputs=(1,)))
def split(info: NodeInfo) -> Callable[..., tuple]:
    """Split along `axis` by the split attribute/host input, num_outputs (18+), or evenly."""
    axis = int(info.attrs.get("axis") or 0)
    n = info.n_outputs
    num_outputs = info.attrs.get("num_outputs")
    fixed = info.attrs.get("split")
    fixed = None if fixed is None else ints(fixed)

    def run(x: Tensor, split=None) -> tuple:
        a = axis_of(axis, x.ndim, "Split")
        parts = ints(split) if split is not None else fixed
        sizes = _split_sizes(x.shape[a], n, parts, num_outputs)
        return tuple(torch.split(x, sizes, dim=a))

    return run


# ---------------------------------------------------------------------------------------
# Slice


def _slice(x: Tensor, starts, ends, axes, steps) -> Tensor:
    n = len(starts)
    axes = list(range(n)) if axes is None else axes_of(axes, x.ndim, "Slice")
    steps = [1] * n if steps is None else steps
    if not len(ends) == len(axes) == len(steps) == n:
        raise ValueError("Slice: starts, ends, axes and steps must have the same length")
    index: list[slice] = [slice(None)] * x.ndim
    flips = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ValueError("Slice: steps must not be 0")
        dim = x.shape[a]
        lo, hi, step = slice(s, e, st).indices(dim)
        if step > 0:
            index[a] = slice(lo, max(hi, lo), step)
            continue
        count = len(range(lo, hi, step))
        if count == 0:
            index[a] = slice(0, 0)
            continue
        last = lo + (count - 1) * step  # smallest index taken
        index[a] = slice(last, lo + 1, -step)
        flips.append(a)
    y = x[tuple(index)]
    return torch.flip(y, flips) if flips else y


@kernel("Slice", since=1, until=9, factory=True, view=True, supports=needs(SERVED))
def slice_v1(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Slice with starts/ends/axes attributes."""
    starts, ends = ints(info.attrs["starts"]), ints(info.attrs["ends"])
    axes = info.attrs.get("axes")
    axes = None if axes is None else ints(axes)
    return lambda x: _slice(x, starts, ends, axes, None)


@kernel("Slice", since=10, view=True, host_inputs=(1, 2, 3, 4),
        supports=needs(SERVED, skip_inputs=(1, 2, 3, 4)))
def slice_(x: Tensor, starts, ends, axes=None, steps=None) -> Tensor:
    """Slice with host starts/ends/axes/steps (negative steps copy through a flip)."""
    return _slice(x, ints(starts), ints(ends), None if axes is None else ints(axes),
                  None if steps is None else ints(steps))


# ---------------------------------------------------------------------------------------
# Expand, Tile, Pad


@kernel("Expand", since=8, view=True, host_inputs=(1,),
        supports=needs(SERVED, skip_inputs=(1,)))
def expand(x: Tensor, shape) -> Tensor:
    """Broadcast to the host `shape` (bidirectionally); a stride-0 view."""
    target = ints(shape)
    try:
        out = torch.broadcast_shapes(tuple(x.shape), tuple(target))
    except RuntimeError:
        raise ValueError(f"Expand: input shape {list(x.shape)} cannot be broadcast with shape "
                         f"{target}") from None
    return x.expand(out)


@kernel("Tile", since=6, host_inputs=(1,), supports=needs(SERVED, skip_inputs=(1,)))
def tile(x: Tensor, repeats) -> Tensor:
    """Repeat x `repeats[i]` times along each axis i."""
    reps = ints(repeats)
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        raise ValueError(f"Tile: repeats {reps} must be {x.ndim} non-negative ints")
    return x.repeat(reps) if x.ndim else x.clone()


@functools.lru_cache(maxsize=256)
def _pad_index(n: int, b: int, e: int, mode: str, device: str) -> Tensor:
    i = np.arange(-b, n + e)
    if mode == "edge":
        j = np.clip(i, 0, n - 1)
    elif mode == "wrap":
        j = np.mod(i, n)
    else:  # reflect
        if n == 1:
            j = np.zeros_like(i)
        else:
            p = 2 * (n - 1)
            j = np.mod(i, p)
            j = np.where(j >= n, p - j, j)
    return torch.as_tensor(j, dtype=torch.int64, device=device)


def _pad(x: Tensor, pads: list[int], axes: list[int] | None, mode: str, value) -> Tensor:
    r = x.ndim
    axes = list(range(r)) if axes is None else axes_of(axes, r, "Pad")
    k = len(axes)
    if len(pads) != 2 * k:
        raise ValueError(f"Pad: pads has {len(pads)} values, expected {2 * k}")
    begin, end = [0] * r, [0] * r
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[i + k]
    for a in range(r):  # negative pads crop
        if begin[a] < 0 or end[a] < 0:
            lo, hi = max(-begin[a], 0), x.shape[a] - max(-end[a], 0)
            x = x.narrow(a, lo, max(hi - lo, 0))
            begin[a], end[a] = max(begin[a], 0), max(end[a], 0)
    if mode == "constant":
        shape = [x.shape[a] + begin[a] + end[a] for a in range(r)]
        out = torch.full(shape, value, dtype=x.dtype, device=x.device)
        out[tuple(slice(begin[a], begin[a] + x.shape[a]) for a in range(r))] = x
        return out
    copied = False
    for a in range(r):
        if begin[a] or end[a]:
            if x.shape[a] == 0:
                raise ValueError(f"Pad: cannot {mode}-pad an empty axis {a}")
            idx = _pad_index(x.shape[a], begin[a], end[a], mode, str(x.device))
            x = torch.index_select(x, a, idx)
            copied = True
    return x if copied else x.clone()


def _pad_value(value, dtype: torch.dtype):
    if value is None:
        return False if dtype == torch.bool else 0
    v = np.asarray(value).reshape(-1)
    if v.size == 0:
        return 0
    v = v[0]
    return bool(v) if dtype == torch.bool else (float(v) if dtype.is_floating_point else int(v))


def _check_mode(mode: str) -> str:
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ValueError(f"Pad: unknown mode {mode!r}")
    return mode


@kernel("Pad", since=1, until=10, factory=True, supports=needs(SERVED))
def pad_v2(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Pad with pads/value attributes (opset 1 spells pads `paddings`)."""
    mode = _check_mode(attr_str(info.attrs.get("mode")) or "constant")
    pads = ints(info.attrs.get("pads") or info.attrs.get("paddings") or [])
    value = float(info.attrs.get("value") or 0.0)

    def run(x: Tensor) -> Tensor:
        return _pad(x, pads, None, mode, _pad_value(np.array(value), x.dtype))

    return run


@kernel("Pad", since=11, factory=True, host_inputs=(1, 2, 3),
        supports=needs(SERVED, skip_inputs=(1, 2, 3)))
def pad(info: NodeInfo) -> Callable[..., Tensor]:
    """Pad (constant/reflect/edge/wrap) with host pads, constant_value and axes inputs."""
    mode = _check_mode(attr_str(info.attrs.get("mode")) or "constant")

    def run(x: Tensor, pads, constant_value=None, axes=None) -> Tensor:
        v = _pad_value(constant_value, x.dtype)
        return _pad(x, ints(pads), None if axes is None else ints(axes), mode, v)

    return run


# ---------------------------------------------------------------------------------------
# Shape, Size, Constant, ConstantOfShape, Range


@kernel("Shape", since=1, factory=True, host_outputs=True, supports=needs(SERVED))
def shape(info: NodeInfo) -> Callable[[Tensor], np.ndarray]:
    """The input's shape as a host int64 array (no device read); start/end from opset 15."""
    start = int(info.attrs.get("start") or 0)
    end = info.attrs.get("end")
    end = None if end is None else int(end)
    return lambda x: np.array(tuple(x.shape)[start:end], dtype=np.int64)


@kernel("Size", since=1, host_outputs=True, supports=needs(SERVED))
def size(x: Tensor) -> np.ndarray:
    """The element count as a host int64 scalar."""
    return np.array(x.numel(), dtype=np.int64)


@kernel("Constant", since=1, factory=True, host_outputs=True)
def constant(info: NodeInfo) -> Callable[[], np.ndarray]:
    """The value attribute as a host array (the planner folds it; copies go on demand)."""
    value = constant_value(info.attrs, info.describe())
    value.flags.writeable = False
    return lambda: value


def _fill_value(info: NodeInfo) -> np.ndarray:
    v = info.attrs.get("value")
    return np.zeros((), np.float32) if v is None else np.asarray(v).reshape(-1)[:1].reshape(())


def _cos_supports(info: NodeInfo) -> str | None:
    from onnxkiln.dtypes import from_numpy

    try:
        dt = from_numpy(_fill_value(info).dtype)
    except KeyError:
        return "ConstantOfShape: unknown value type"
    if dt not in SERVED:
        return f"dtype {dt} not supported by torch kernels (ConstantOfShape value)"
    return None


@kernel("ConstantOfShape", since=9, factory=True, host_inputs=(0,), supports=_cos_supports)
def constant_of_shape(info: NodeInfo) -> Callable[..., Tensor]:
    """A device tensor of the host shape filled with `value` (default float32 zero)."""
    fill = to_torch(_fill_value(info), "cpu")
    value = fill.item()
    dtype = fill.dtype
    device = current_device()

    def run(shape) -> Tensor:
        dims = ints(shape)
        if any(d < 0 for d in dims):
            raise ValueError(f"ConstantOfShape: shape {dims} has a negative dimension")
        return torch.full(dims, value, dtype=dtype, device=device)

    return run


@kernel("Range", since=11, factory=True, host_inputs=(0, 1, 2),
        capture=CaptureSupport.READS_HOST_SCALAR,
        supports=needs(SERVED - {DataType.BOOL, DataType.UINT8}, skip_inputs=(0, 1, 2)))
def range_(info: NodeInfo) -> Callable[..., Tensor]:
    """start, start + delta, ... below limit: computed on the host by the op's rule
    (onnxkiln.ops.generator, the CPU provider's too, so both accumulate alike), then uploaded
    (its length depends only on host scalars)."""
    stash = info.attrs.get("stash_type", 1) if info.opset >= 27 else 1
    device = current_device()
    return lambda start, limit, delta: to_torch(range_values(start, limit, delta, stash), device)
