"""CPU kernels: shape manipulation (Reshape, Transpose, Squeeze, Split, Concat, Expand, ...)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxkiln.dtypes import to_numpy
from onnxkiln.ops.attrs import attr_tensor, norm_axes, norm_axis
from onnxkiln.ops.generator import constant_value, range_values
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu._tensor_util import const_input, to_ints
from onnxkiln.providers.cpu.registry import kernel

_I64 = np.dtype(np.int64)


Shape = tuple[int, ...]


def reshaper(target: Shape) -> Callable[..., np.ndarray]:
    """A kernel reshaping its first input to `target` (its other inputs ignored); the
    executor inlines it as `x.reshape(target)`."""

    def run(x: np.ndarray, *_: object) -> np.ndarray:
        return x.reshape(target)

    run.reshape_to = target
    return run


def _view(compute: Callable[[Shape], Shape]) -> Callable[..., np.ndarray]:
    """A view kernel whose output shape follows from its input's: worked out per call (the
    last call's kept: a decode step meets the same shape again and again), or once per input
    signature (specialize)."""
    last: list = [None]  # (input shape, output shape) of the last call

    def run(x: np.ndarray, *_: object) -> np.ndarray:
        shape = x.shape
        seen = last[0]
        if seen is None or seen[0] != shape:
            seen = last[0] = (shape, compute(shape))
        return x.reshape(seen[1])

    def specialize(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
        return None if shapes[0] is None else reshaper(compute(shapes[0]))

    run.specialize = specialize
    return run


def _view_by_input(compute: Callable[[Shape, np.ndarray], Shape]) -> Callable[..., np.ndarray]:
    """A view kernel whose output shape follows from its input's and the value of its second
    input (Reshape's shape, Squeeze's axes): specialised when that value is fixed."""

    last: list = [None]  # (input shape, the value's bytes, output shape) of the last call

    def run(x: np.ndarray, value: np.ndarray | None = None) -> np.ndarray:
        shape = x.shape
        key = None if type(value) is not np.ndarray else (value.dtype, value.shape,
                                                          value.tobytes())
        seen = last[0]
        if seen is None or key is None or seen[0] != shape or seen[1] != key:
            seen = last[0] = (shape, key, compute(shape, value))
        return x.reshape(seen[2])

    def specialize(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
        if shapes[0] is None or len(consts) < 2 or consts[1] is None:
            return None
        return reshaper(compute(shapes[0], consts[1]))

    run.specialize = specialize
    return run


def _reshape_target(shape: Shape, target: Shape, allowzero: int) -> Shape:
    """The requested shape with 0 copied from the input (unless allowzero) and -1 solved."""
    if not allowzero and 0 in target:
        if len(target) > len(shape) and 0 in target[len(shape) :]:
            raise ValueError(
                f"Reshape: shape {list(target)} has a 0 beyond the input's {len(shape)} dims"
            )
        target = tuple(shape[i] if d == 0 else d for i, d in enumerate(target))
    size = math.prod(shape)
    if target.count(-1) > 1 or any(d < -1 for d in target):
        raise ValueError(f"Reshape: invalid shape {list(target)}")
    if -1 in target:
        rest = -math.prod(target)
        if rest == 0 or size % rest:
            raise ValueError(
                f"Reshape: cannot reshape a tensor of shape {list(shape)} ({size} elements) "
                f"into {list(target)}"
            )
        target = tuple(size // rest if d == -1 else d for d in target)
    elif math.prod(target) != size:
        raise ValueError(
            f"Reshape: cannot reshape a tensor of shape {list(shape)} ({size} elements) "
            f"into {list(target)}"
        )
    return target


def _reshape_fn(target: Shape | None, allowzero: int) -> Callable[..., np.ndarray]:
    """A kernel reshaping to `target` (None: read the shape input on each call)."""
    if target is not None:
        return _view(lambda shape: _reshape_target(shape, target, allowzero))
    return _view_by_input(lambda shape, value: _reshape_target(shape, to_ints(value), allowzero))


@kernel("Reshape", since=1, until=4, factory=True, view=True)
def reshape_v1(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Reshape with the `shape` attribute (0 copies a dim, -1 is inferred)."""
    shape = info.attrs.get("shape")
    if shape is None:
        raise ValueError("Reshape (opset < 5) needs the 'shape' attribute")
    return _reshape_fn(to_ints(shape), 0)


@kernel("Reshape", since=5, factory=True, view=True)
def reshape(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Reshape with the shape input; allowzero=1 (opset 14+) keeps 0 as a real size."""
    const = const_input(info, 1)
    allowzero = info.attrs.get("allowzero") or 0
    return _reshape_fn(None if const is None else to_ints(const), allowzero)


@kernel("Transpose", since=1, factory=True, view=True)
def transpose(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """Permute axes (default: reverse them); returns a strided view."""
    perm = info.attrs.get("perm")
    if perm is None:
        return lambda x: x.transpose()
    order = to_ints(perm)
    if sorted(order) != list(range(len(order))):
        raise ValueError(f"Transpose: perm {list(order)} is not a permutation")

    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim != len(order):
            raise ValueError(f"Transpose: perm {list(order)} does not fit input rank {x.ndim}")
        return x.transpose(order)

    return run


def _squeeze_shape(shape: Shape, axes: Shape | None) -> Shape:
    if axes is None:
        return tuple(d for d in shape if d != 1)
    drop = norm_axes(axes, len(shape), "Squeeze")
    for a in drop:
        if shape[a] != 1:
            raise ValueError(
                f"Squeeze: axis {a} of shape {list(shape)} has size {shape[a]}, expected 1"
            )
    return tuple(d for i, d in enumerate(shape) if i not in drop)


def _unsqueeze_shape(shape: Shape, axes: Shape) -> Shape:
    new = sorted(norm_axes(axes, len(shape) + len(axes), "Unsqueeze"))
    out = list(shape)
    for a in new:
        out.insert(a, 1)
    return tuple(out)


def _squeeze_fn(axes: Shape | None) -> Callable[..., np.ndarray]:
    return _view(lambda shape: _squeeze_shape(shape, axes))


def _unsqueeze_fn(axes: Shape) -> Callable[..., np.ndarray]:
    return _view(lambda shape: _unsqueeze_shape(shape, axes))


@kernel("Squeeze", since=1, until=12, factory=True, view=True)
def squeeze_v1(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Drop size-1 axes given by the `axes` attribute (all size-1 axes when absent)."""
    axes = info.attrs.get("axes")
    return _squeeze_fn(None if axes is None else to_ints(axes))


@kernel("Squeeze", since=13, factory=True, view=True)
def squeeze(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Drop size-1 axes given by the optional `axes` input."""
    const = const_input(info, 1)
    present = info.n_inputs > 1 and (not info.input_present or info.input_present[1])
    if const is not None or not present:
        return _squeeze_fn(None if const is None else to_ints(const))
    return _view_by_input(
        lambda shape, axes: _squeeze_shape(shape, None if axes is None else to_ints(axes)))


@kernel("Unsqueeze", since=1, until=12, factory=True, view=True)
def unsqueeze_v1(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Insert size-1 axes at the output positions in the `axes` attribute."""
    return _unsqueeze_fn(to_ints(info.attrs["axes"]))


@kernel("Unsqueeze", since=13, factory=True, view=True)
def unsqueeze(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Insert size-1 axes at the output positions in the `axes` input."""
    const = const_input(info, 1)
    if const is not None:
        return _unsqueeze_fn(to_ints(const))
    return _view_by_input(lambda shape, axes: _unsqueeze_shape(shape, to_ints(axes)))


def _flatten_shape(shape: Shape, axis: int) -> Shape:
    r = len(shape)
    a = axis + r if axis < 0 else axis
    if not 0 <= a <= r:
        raise ValueError(f"Flatten: axis {axis} is out of range for rank {r} (expected [-r, r])")
    return (math.prod(shape[:a]), math.prod(shape[a:]))


@kernel("Flatten", since=1, factory=True, view=True)
def flatten(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Reshape to 2-D: dims before `axis` make the rows, the rest the columns."""
    axis = int(info.attrs.get("axis", 1))
    return _view(lambda shape: _flatten_shape(shape, axis))


@kernel("Identity", since=1, view=True)
def identity(x):
    """Return the input itself (tensors, sequences and optionals alike)."""
    return x


@kernel("Concat", since=1)
def concat(*xs: np.ndarray, axis: int | None) -> np.ndarray:
    """Join tensors along `axis` (opset 1 defaults it to 1)."""
    if axis is None:
        axis = 1
    if not xs:
        raise ValueError("Concat: needs at least one input")
    a = norm_axis(axis, xs[0].ndim, "Concat")
    try:
        return np.concatenate(xs, axis=a)
    except ValueError:
        shapes = [list(x.shape) for x in xs]
        raise ValueError(
            f"Concat: inputs must match in every dim but axis {axis}; got shapes {shapes}"
        ) from None


def _split_sizes(
    dim: int, n: int, split: tuple[int, ...] | None, num_outputs: int | None
) -> tuple[int, ...]:
    if split is not None:
        if sum(split) != dim or any(s < 0 for s in split):
            raise ValueError(f"Split: split {list(split)} does not add up to the axis size {dim}")
        if len(split) != n:
            raise ValueError(f"Split: split {list(split)} has {len(split)} parts, node has {n}")
        return split
    if num_outputs:
        chunk = -(-dim // num_outputs)
        last = dim - chunk * (num_outputs - 1)
        if last < 0:
            raise ValueError(f"Split: cannot split an axis of size {dim} into {num_outputs} parts")
        return (chunk,) * (num_outputs - 1) + (last,)
    if dim % n:
        raise ValueError(f"Split: an axis of size {dim} is not evenly splittable into {n} parts")
    return (dim // n,) * n


@kernel("Split", since=1, factory=True, multi_output=True)
def split(info: NodeInfo) -> Callable[..., tuple[np.ndarray | None, ...]]:
    """Split along `axis` by the split attribute/input, num_outputs (18+), or evenly."""
    axis = info.attrs.get("axis") or 0
    n = info.n_outputs
    num_outputs = info.attrs.get("num_outputs")
    present = info.output_present or (True,) * n
    fixed = info.attrs.get("split")
    fixed = None if fixed is None else to_ints(fixed)
    const = const_input(info, 1)
    if const is not None:
        fixed = to_ints(const)

    def pieces(shape: tuple, split: np.ndarray | None) -> tuple[tuple[slice, ...] | None, ...]:
        """The index of each wanted output (None for outputs the node leaves out)."""
        a = norm_axis(axis, len(shape), "Split")
        parts = fixed if fixed is not None or split is None else to_ints(split)
        sizes = _split_sizes(shape[a], n, parts, num_outputs)
        lead = (slice(None),) * a
        out: list[tuple[slice, ...] | None] = []
        start = 0
        for i, size in enumerate(sizes):
            wanted = i < len(present) and present[i]
            out.append((*lead, slice(start, start + size)) if wanted else None)
            start += size
        return tuple(out)

    def cut(x: np.ndarray, index: tuple) -> tuple[np.ndarray | None, ...]:
        return tuple(None if ix is None else x[ix].copy() for ix in index)

    def run(x: np.ndarray, split: np.ndarray | None = None) -> tuple[np.ndarray | None, ...]:
        return cut(x, pieces(x.shape, split))

    def specialize(dtypes, shapes, consts):
        given = len(shapes) > 1 and shapes[1] is not None
        if shapes[0] is None or (given and fixed is None and consts[1] is None):
            return None
        index = pieces(shapes[0], consts[1] if given else None)
        return lambda x, split=None: cut(x, index)

    run.specialize = specialize
    return run


def _expand(x: np.ndarray, target: tuple[int, ...]) -> np.ndarray:
    try:
        out_shape = np.broadcast_shapes(x.shape, target)
    except ValueError:
        raise ValueError(
            f"Expand: input shape {list(x.shape)} cannot be broadcast with shape {list(target)}"
        ) from None
    out = np.empty(out_shape, dtype=x.dtype)
    np.copyto(out, x)
    return out


@kernel("Expand", since=8, factory=True)
def expand(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Broadcast to `shape` (bidirectionally); always a fresh contiguous array."""
    const = const_input(info, 1)
    target = None if const is None else to_ints(const)

    def run(x: np.ndarray, shape: np.ndarray | None = None) -> np.ndarray:
        return _expand(x, target if target is not None else to_ints(shape))

    def specialize(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
        want = target if target is not None else (None if consts[1] is None
                                                  else to_ints(consts[1]))
        if shapes[0] is None or want is None:
            return None
        out_shape = np.broadcast_shapes(shapes[0], want)

        def special(x: np.ndarray, shape: np.ndarray | None = None) -> np.ndarray:
            out = np.empty(out_shape, dtype=x.dtype)
            np.copyto(out, x)
            return out

        return special

    run.specialize = specialize
    return run


def _tile(x: np.ndarray, reps: tuple[int, ...]) -> np.ndarray:
    if len(reps) != x.ndim:
        raise ValueError(
            f"Tile: repeats {list(reps)} must have one entry per dim of {list(x.shape)}"
        )
    if any(r < 0 for r in reps):
        raise ValueError(f"Tile: repeats {list(reps)} must be non-negative")
    return np.tile(x, reps) if reps else x.copy()


@kernel("Tile", since=1, until=5)
def tile_v1(x: np.ndarray, tiles: np.ndarray, axis: np.ndarray) -> np.ndarray:
    """Repeat the input `tiles` times along one `axis` (opset 1 form)."""
    reps = [1] * x.ndim
    reps[norm_axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim, "Tile")] = int(
        np.asarray(tiles).reshape(-1)[0]
    )
    return _tile(x, tuple(reps))


@kernel("Tile", since=6, factory=True)
def tile(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Repeat the input along every axis by the `repeats` input."""
    const = const_input(info, 1)
    if const is not None:
        reps = to_ints(const)
        return lambda x, repeats=None: _tile(x, reps)
    return lambda x, repeats: _tile(x, to_ints(repeats))


@kernel("Shape", since=1, factory=True)
def shape(info: NodeInfo) -> Callable[..., np.ndarray]:
    """The input's shape as int64; start/end (opset 15+) slice it, clamped to [0, rank]."""
    start = info.attrs.get("start") or 0
    end = info.attrs.get("end")
    if start == 0 and end is None:
        return lambda x: np.array(x.shape, dtype=_I64)
    return lambda x: np.array(x.shape[start:end], dtype=_I64)


@kernel("Size", since=1)
def size(x: np.ndarray) -> np.ndarray:
    """The number of elements as an int64 scalar."""
    return np.array(x.size, dtype=_I64)


@kernel("Constant", since=1, factory=True)
def constant(info: NodeInfo) -> Callable[[], np.ndarray]:
    """The value of whichever value attribute is set, built once; returned read-only."""
    value = constant_value(info.attrs, info.describe())
    value.flags.writeable = False
    return lambda: value


@kernel("ConstantOfShape", since=9, factory=True)
def constant_of_shape(info: NodeInfo) -> Callable[..., np.ndarray]:
    """A tensor of the given shape filled with `value` (default float32 zero)."""
    v = info.attrs.get("value")
    if v is not None and attr_tensor(v).size != 1:  # onnxruntime refuses it too
        raise ValueError(f"ConstantOfShape: 'value' must hold one element, got shape "
                         f"{list(attr_tensor(v).shape)}")
    fill = np.zeros((), np.float32) if v is None else attr_tensor(v).reshape(())
    dtype = fill.dtype
    zero = dtype.kind != "O" and not fill.any()

    def run(shape: np.ndarray) -> np.ndarray:
        dims = to_ints(shape)
        if any(d < 0 for d in dims):
            raise ValueError(f"ConstantOfShape: shape {list(dims)} has a negative dimension")
        return np.zeros(dims, dtype) if zero else np.full(dims, fill, dtype)

    return run


def _scalar(a: np.ndarray, name: str, op: str):
    if a.size != 1:
        raise ValueError(f"{op}: '{name}' must be a scalar, got shape {list(a.shape)}")
    return a.reshape(-1)[0]


@kernel("Range", since=11, factory=True, capture=CaptureSupport.DATA_DEPENDENT_SHAPE)
def range_(info: NodeInfo) -> Callable[..., np.ndarray]:
    """start, start+delta, ... up to limit (exclusive), accumulated as onnxruntime does."""
    stash = info.attrs.get("stash_type", 1) if info.opset >= 27 else 1
    return lambda start, limit, delta: range_values(start, limit, delta, stash)


@kernel("EyeLike", since=9)
def eye_like(x: np.ndarray, *, dtype: int | None, k: int) -> np.ndarray:
    """A 2-D tensor shaped like the input with ones on the k-th diagonal."""
    if x.ndim != 2:
        raise ValueError(f"EyeLike: input must be 2-D, got shape {list(x.shape)}")
    dt = x.dtype if dtype is None else to_numpy(dtype)
    return np.eye(x.shape[0], x.shape[1], k=k, dtype=dt)


@kernel("OneHot", since=9, factory=True)
def one_hot(info: NodeInfo) -> Callable[..., np.ndarray]:
    """on_value where index == position along the new `axis`, else off_value."""
    axis = info.attrs.get("axis", -1)

    def run(indices: np.ndarray, depth: np.ndarray, values: np.ndarray) -> np.ndarray:
        d = int(_scalar(np.asarray(depth), "depth", "OneHot"))
        if d < 1:
            raise ValueError(f"OneHot: depth must be positive, got {d}")
        if values.size != 2:
            raise ValueError(f"OneHot: values must hold [off, on], got shape {list(values.shape)}")
        flat = values.reshape(-1)
        idx = indices if indices.dtype == _I64 else indices.astype(_I64)
        idx = np.where(idx < 0, idx + d, idx)
        hot = idx[..., None] == np.arange(d, dtype=_I64)
        out = np.where(hot, flat[1:2].reshape(()), flat[0:1].reshape(()))
        a = norm_axis(axis, idx.ndim + 1, "OneHot")
        if a != idx.ndim:
            out = np.ascontiguousarray(np.moveaxis(out, -1, a))
        return out

    return run
