"""Output sizes a step will allocate, predicted from its actual inputs just before it runs.

Shape inference at specialisation sizes what follows from the graph's input shapes; what
follows from input *values* or from shapes computed at run time (ConstantOfShape's shape,
Expand, Tile, Range, Pad, Resize, OneHot, the windows' and MelWeightMatrix's sizes, DFT's
length, and any op inside a Loop body, whose inputs change per iteration) is only known
when the step is about to run. `memory_limit` uses these predictions to refuse such a step
before it allocates anything. One rule per op family: broadcasting for elementwise ops,
the input's size for unary ones, the contraction's free dims for MatMul, Gemm and Einsum,
the sum for Concat. Kernels known to work in float64 scratch count it too. A predictor
returns None when it cannot tell; the size is then checked as the kernel returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
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
_UNARY = frozenset({  # output: the first input's shape and dtype (never a view of it)
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BitwiseNot", "Ceil", "Celu",
    "Clip", "Cos", "Cosh", "CumSum", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid",
    "HardSwish", "Hardmax", "LeakyRelu", "Log", "LogSoftmax", "Mish", "Neg", "Not",
    "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softmax",
    "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "IsNaN", "IsInf",
})
_F64 = 8  # bytes per element of a float64 working copy


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


def _size_of(a: np.ndarray) -> int:
    return a.size


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
        big = max(arrays, key=_size_of)
        if all(a.shape == big.shape or (a.size == 1 and a.ndim <= big.ndim) for a in arrays):
            size = big.size  # the common cases (same shapes, a scalar operand) without numpy
        else:
            try:
                size = _prod(np.broadcast_shapes(*(a.shape for a in arrays)))
            except ValueError:
                return None
        return size * (1 if bool_out else max(a.dtype.itemsize for a in arrays))

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


def _attr(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _onnx_itemsize(elem_type: int) -> int:
    return int(onnx.helper.tensor_dtype_to_np_dtype(int(elem_type)).itemsize)


def _scalar(value: Any) -> int | None:
    found = _ints(value)
    return found[0] if found is not None and len(found) == 1 else None


def _unary(node: ir.Node, step: Any) -> Predictor:
    def predict(inputs: Sequence[Any]) -> int | None:
        x = inputs[0] if inputs else None
        return x.nbytes if isinstance(x, np.ndarray) else None

    return predict


def _cast(node: ir.Node, step: Any) -> Predictor:
    itemsize = _onnx_itemsize(_attr(node, "to", onnx.TensorProto.FLOAT))

    def predict(inputs: Sequence[Any]) -> int | None:
        x = inputs[0] if inputs else None
        return x.size * itemsize if isinstance(x, np.ndarray) else None

    return predict


def _concat(node: ir.Node, step: Any) -> Predictor:
    def predict(inputs: Sequence[Any]) -> int | None:
        arrays = [v for v in inputs if isinstance(v, np.ndarray)]
        if len(arrays) != len([v for v in inputs if v is not None]):
            return None
        return sum(a.size for a in arrays) * max((a.dtype.itemsize for a in arrays), default=0)

    return predict


def _gemm(node: ir.Node, step: Any) -> Predictor:
    trans_a, trans_b = bool(_attr(node, "transA", 0)), bool(_attr(node, "transB", 0))

    def predict(inputs: Sequence[Any]) -> int | None:
        a, b = inputs[:2]
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.ndim != 2 \
                or b.ndim != 2:
            return None
        m = a.shape[1] if trans_a else a.shape[0]
        n = b.shape[0] if trans_b else b.shape[1]
        return m * n * a.dtype.itemsize

    return predict


def _einsum(node: ir.Node, step: Any) -> Predictor:
    equation = str(_attr(node, "equation", "")).replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if not arrow:  # implicit output: the letters that occur once, in alphabetical order
        letters = lhs.replace(",", "").replace(".", "")
        rhs = ("..." if "..." in lhs else "") + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1))

    def predict(inputs: Sequence[Any]) -> int | None:
        if len(inputs) != len(terms) or not all(isinstance(v, np.ndarray) for v in inputs):
            return None
        dims: dict[str, int] = {}
        ellipses = []
        for term, x in zip(terms, inputs):
            head, dots, tail = term.partition("...")
            if len(head) + len(tail) > x.ndim or (not dots and len(term) != x.ndim):
                return None
            ellipses.append(x.shape[len(head):x.ndim - len(tail)])
            for c, d in zip(head + tail, (*x.shape[:len(head)], *x.shape[x.ndim - len(tail):])):
                dims[c] = max(dims.get(c, 1), d)
        try:
            lead = np.broadcast_shapes(*ellipses) if "..." in rhs else ()
        except ValueError:
            return None
        if any(c not in dims for c in rhs.replace("...", "")):
            return None
        return _prod([*lead, *(dims[c] for c in rhs.replace("...", ""))]) \
            * inputs[0].dtype.itemsize

    return predict


def _window(node: ir.Node, step: Any) -> Predictor:
    itemsize = _onnx_itemsize(_attr(node, "output_datatype", onnx.TensorProto.FLOAT))

    def predict(inputs: Sequence[Any]) -> int | None:
        n = _scalar(inputs[0])
        return None if n is None else max(n, 0) * (itemsize + 2 * _F64)  # float64 work

    return predict


def _mel_weight_matrix(node: ir.Node, step: Any) -> Predictor:
    itemsize = _onnx_itemsize(_attr(node, "output_datatype", onnx.TensorProto.FLOAT))

    def predict(inputs: Sequence[Any]) -> int | None:
        n_mel, n_dft = _scalar(inputs[0]), _scalar(inputs[1])
        if n_mel is None or n_dft is None:
            return None
        return (max(n_dft, 0) // 2 + 1) * max(n_mel, 0) * (itemsize + 3 * _F64)  # float64 work

    return predict


def _dft(node: ir.Node, step: Any) -> Predictor:
    onesided, inverse = bool(_attr(node, "onesided", 0)), bool(_attr(node, "inverse", 0))
    axis_attr = _attr(node, "axis", 1) if step.opset < 20 else None

    def predict(inputs: Sequence[Any]) -> int | None:
        x = inputs[0]
        if not isinstance(x, np.ndarray) or x.ndim < 2:
            return None
        length = _scalar(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        axis = axis_attr
        if axis is None:
            axis = _scalar(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else -2
        if axis is None or not -x.ndim <= axis <= x.ndim - 2:
            return None
        a = axis % x.ndim
        n = x.shape[a] if length is None else length
        if onesided and not inverse:
            n = n // 2 + 1
        elements = _prod([*x.shape[:a], n, *x.shape[a + 1:-1]])
        return elements * (2 * x.dtype.itemsize + 2 * 2 * _F64)  # complex128 work

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
    "Gemm": _gemm,
    "Einsum": _einsum,
    "Concat": _concat,
    "Cast": _cast,
    "HannWindow": _window,
    "HammingWindow": _window,
    "BlackmanWindow": _window,
    "MelWeightMatrix": _mel_weight_matrix,
    "DFT": _dft,
    **dict.fromkeys(_BROADCASTING, _broadcasting),
    **dict.fromkeys(_UNARY, _unary),
}
SIZED_OPS = frozenset(_MAKERS)
"""ai.onnx op types with a predictor: the executor's hooked run calls `sizing` before them."""
