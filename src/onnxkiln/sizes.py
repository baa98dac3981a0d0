"""Output sizes a step will allocate, predicted from its actual inputs just before it runs.

Shape inference at specialisation sizes what follows from the input shapes; what follows
from input *values* (ConstantOfShape's shape, Expand, Tile, Range, Pad, Resize, OneHot, and
broadcasting over shapes computed at run time) is only known when the step is about to run.
`memory_limit` uses these predictions to refuse such a step before it allocates anything.
A predictor returns None when it cannot tell; the size is then checked after the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

__all__ = ["SIZED_OPS", "Predictor", "predictors"]

Predictor = Callable[[Sequence[Any]], int | None]

_BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu", "Where", "And", "Or", "Xor", "Equal",
    "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Max", "Min", "Sum", "Mean",
    "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
})
_BOOL_OUT = frozenset({"And", "Or", "Xor", "Equal", "Greater", "GreaterOrEqual", "Less",
                       "LessOrEqual"})


def predictors(steps: Sequence[Any], graph: ir.Graph) -> dict[int, Predictor]:
    """step index -> predictor of the bytes its outputs will take, for the steps with one."""
    nodes = list(graph)
    found: dict[int, Predictor] = {}
    for i, step in enumerate(steps):
        if step.domain != "" or step.node_id < 0 or step.node_id >= len(nodes):
            continue
        make = _MAKERS.get(step.op_type)
        if make is not None:
            found[i] = make(nodes[step.node_id], step)
    return found


def _ints(value: Any) -> list[int] | None:
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu":
        return None
    return [int(v) for v in value.reshape(-1)]


def _prod(dims: Sequence[int]) -> int:
    return math.prod(max(int(d), 0) for d in dims)


def _itemsize(value: Any, default: int = 4) -> int:
    return int(value.dtype.itemsize) if isinstance(value, np.ndarray) else default


def _constant_of_shape(node: ir.Node, step: Any) -> Predictor:
    attr = node.attributes.get("value")
    itemsize = attr.value.dtype.itemsize if attr is not None else 4

    def predict(inputs: Sequence[Any]) -> int | None:
        shape = _ints(inputs[0])
        return None if shape is None else _prod(shape) * itemsize

    return predict


def _expand(node: ir.Node, step: Any) -> Predictor:
    def predict(inputs: Sequence[Any]) -> int | None:
        x, shape = inputs[0], _ints(inputs[1])
        if shape is None or not isinstance(x, np.ndarray):
            return None
        try:
            dims = np.broadcast_shapes(x.shape, tuple(shape))
        except ValueError:
            return None  # the kernel reports the mismatch
        return _prod(dims) * x.dtype.itemsize

    return predict


def _tile(node: ir.Node, step: Any) -> Predictor:
    def predict(inputs: Sequence[Any]) -> int | None:
        x, repeats = inputs[0], _ints(inputs[1])
        if repeats is None or not isinstance(x, np.ndarray):
            return None
        return x.nbytes * _prod(repeats)

    return predict


def _range(node: ir.Node, step: Any) -> Predictor:
    def predict(inputs: Sequence[Any]) -> int | None:
        try:
            start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in inputs[:3])
        except (TypeError, ValueError, IndexError):
            return None
        if delta == 0 or not all(math.isfinite(v) for v in (start, limit, delta)):
            return None
        return max(math.ceil((limit - start) / delta), 0) * _itemsize(inputs[0])

    return predict


def _pad(node: ir.Node, step: Any) -> Predictor:
    def predict(inputs: Sequence[Any]) -> int | None:
        x = inputs[0]
        pads = _ints(inputs[1]) if len(inputs) > 1 else None
        if pads is None or not isinstance(x, np.ndarray) or len(pads) != 2 * x.ndim:
            return None  # axes-subset pads (opset 18) and attribute pads: sized by inference
        r = x.ndim
        return _prod([x.shape[i] + pads[i] + pads[i + r] for i in range(r)]) * x.dtype.itemsize

    return predict


def _resize(node: ir.Node, step: Any) -> Predictor:
    def predict(inputs: Sequence[Any]) -> int | None:
        x = inputs[0]
        if not isinstance(x, np.ndarray):
            return None
        sizes = _ints(inputs[3]) if len(inputs) > 3 else None
        if sizes is not None and len(sizes) == x.ndim:
            return _prod(sizes) * x.dtype.itemsize
        scales = inputs[2] if len(inputs) > 2 else inputs[1] if step.op_type == "Upsample" \
            else None
        if isinstance(scales, np.ndarray) and scales.size == x.ndim:
            dims = [math.floor(d * float(s)) for d, s in zip(x.shape, scales.reshape(-1))]
            return _prod(dims) * x.dtype.itemsize
        return None

    return predict


def _one_hot(node: ir.Node, step: Any) -> Predictor:
    def predict(inputs: Sequence[Any]) -> int | None:
        indices, depth, values = inputs[:3]
        if not isinstance(indices, np.ndarray) or not isinstance(depth, np.ndarray):
            return None
        d = int(np.asarray(depth).reshape(-1)[0])
        return indices.size * max(d, 0) * _itemsize(values)

    return predict


def _broadcasting(node: ir.Node, step: Any) -> Predictor:
    bool_out = step.op_type in _BOOL_OUT

    def predict(inputs: Sequence[Any]) -> int | None:
        arrays = [v for v in inputs if isinstance(v, np.ndarray)]
        if len(arrays) < 2:
            return None
        try:
            dims = np.broadcast_shapes(*(a.shape for a in arrays))
        except ValueError:
            return None
        itemsize = 1 if bool_out else max(a.dtype.itemsize for a in arrays)
        return _prod(dims) * itemsize

    return predict


def _matmul(node: ir.Node, step: Any) -> Predictor:
    def predict(inputs: Sequence[Any]) -> int | None:
        a, b = inputs[:2]
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.ndim < 2 \
                or b.ndim < 2:
            return None
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            return None
        return _prod([*batch, a.shape[-2], b.shape[-1]]) * a.dtype.itemsize

    return predict


_MAKERS: dict[str, Callable[[ir.Node, Any], Predictor]] = {
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
    "Range": _range,
    "Pad": _pad,
    "Resize": _resize,
    "Upsample": _resize,
    "OneHot": _one_hot,
    "MatMul": _matmul,
    **dict.fromkeys(_BROADCASTING, _broadcasting),
}
SIZED_OPS = frozenset(_MAKERS)
"""ai.onnx op types with a predictor: the executor's hooked run calls `sizing` before them."""
