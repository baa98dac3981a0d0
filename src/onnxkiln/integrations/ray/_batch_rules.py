"""The per-op rules of the batch-axis walk (`_batch_safety`): what each op does to the axis
that holds the batch, as the `State` of its outputs, or `Unsafe` with the reason."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

if TYPE_CHECKING:
    from onnxkiln.integrations.ray._batch_safety import _Walk

__all__ = ["DIMS_OPS", "RULES", "Dims", "Rows", "State", "Unsafe", "axis_index"]

_FULL = 2**31 - 1  # a Slice end at or past this keeps the whole axis

@dataclass(frozen=True)
class Rows:
    """A tensor that carries the batch along `axis` (of `rank` dims)."""

    axis: int
    rank: int


@dataclass(frozen=True)
class Dims:
    """An int tensor read from a shape: "B" is the batch size, ints or None are fixed."""

    entries: tuple[Any, ...]
    scalar: bool = False


State = Rows | Dims | None


class Unsafe(Exception):
    """Why a node makes stacking unsafe."""


def axis_index(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


# --- the rules: each returns the state of every output, or raises Unsafe -----------------


def _broadcast(w: _Walk, node: ir.Node, values: Sequence[ir.Value | None]) -> Rows:
    values = [v for v in values if v is not None]
    out_rank = max(w.rank(v) for v in values)
    axes = {s.axis + out_rank - s.rank for v in values if isinstance(s := w.of(v), Rows)}
    if len(axes) != 1:
        raise Unsafe("combines values that carry the batch along different axes")
    axis = axes.pop()
    for v in values:
        if w.of(v) is None:
            dims = w.dims(v)
            pos = axis - (out_rank - len(dims))
            if pos >= 0 and dims[pos] != 1:
                raise Unsafe(f"broadcasts '{v.name}' (dim {dims[pos]}) against the batch axis")
    return Rows(axis, out_rank)


def _elementwise(w: _Walk, node: ir.Node) -> list[State]:
    return [_broadcast(w, node, node.inputs)] * len(node.outputs)


def _first_input(w: _Walk, node: ir.Node) -> list[State]:  # CastLike, Dropout
    return [_broadcast(w, node, node.inputs[:1])] * len(node.outputs)


def _reduce(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    axes = w.ints(node, "axes", 1)
    if not axes:
        if node.attributes.get("noop_with_empty_axes") and node.attributes[
                "noop_with_empty_axes"].value:
            return [s]
        raise Unsafe("reduces over all axes, the batch axis with them")
    return [_reduced(s, axes, node)]


def _arg_reduce(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    return [_reduced(s, w.ints(node, "axis") or [0], node)]


def _reduced(s: Rows, axes: list[int], node: ir.Node) -> Rows:
    axes = sorted({axis_index(a, s.rank) for a in axes})
    if s.axis in axes:
        raise Unsafe(f"reduces over the batch axis (axis {s.axis}), so each answer would "
                     "mix every request's rows")
    keep = node.attributes["keepdims"].value if "keepdims" in node.attributes else 1
    if keep:
        return s
    return Rows(s.axis - sum(a < s.axis for a in axes), s.rank - len(axes))


def _along(default: int, what: str) -> Callable[[_Walk, ir.Node], list[State]]:
    """Ops that work along one `axis` (CumSum, TopK, LpNormalization ...)."""

    def rule(w: _Walk, node: ir.Node) -> list[State]:
        s = w.only(node)
        axis = w.ints(node, "axis", 1 if node.op_type == "CumSum" else None)
        axis = axis_index((axis or [default])[0], s.rank)
        if axis == s.axis:
            raise Unsafe(f"{what} along the batch axis (axis {s.axis})")
        return [s] * len(node.outputs)

    return rule


def _softmax(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    if w.opset >= 13:
        axis = axis_index((w.ints(node, "axis") or [-1])[0], s.rank)
        if axis == s.axis:
            raise Unsafe(f"normalizes along the batch axis (axis {s.axis})")
    elif s.axis >= axis_index((w.ints(node, "axis") or [1])[0], s.rank):
        raise Unsafe("normalizes over a block of axes that includes the batch axis")
    return [s]


def _layer_norm(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    if s.axis >= axis_index((w.ints(node, "axis") or [-1])[0], s.rank):
        raise Unsafe(f"normalizes over axes that include the batch axis (axis {s.axis})")
    return [s] * len(node.outputs)


def _mvn(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    axes = [axis_index(a, s.rank) for a in (w.ints(node, "axes") or [0, 2, 3])]
    if s.axis in axes:
        raise Unsafe(f"normalizes over the batch axis (axes {axes})")
    return [s]


def _batch_norm(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    training = "training_mode" in node.attributes and node.attributes["training_mode"].value
    if training or (w.opset < 14 and any(v.name for v in node.outputs[1:])):
        raise Unsafe("is in training form: its mean and variance come from the whole batch")
    if s.axis == 1:
        raise Unsafe("treats the batch axis as its channel axis")
    return [s] + [None] * (len(node.outputs) - 1)


def _leading(w: _Walk, node: ir.Node) -> list[State]:
    """Ops defined per item of their N axis (axis 0): Conv, pools, instance norms."""
    s = w.only(node)
    if s.axis != 0:
        raise Unsafe(f"works per item of axis 0, but the batch is on axis {s.axis}")
    if node.op_type == "MaxPool" and len(node.outputs) > 1 and node.outputs[1].name:
        raise Unsafe("returns flat indices, which count the rows of the whole batch")
    return [Rows(0, s.rank)] * len(node.outputs)


def _matmul(a_index: int, b_index: int) -> Callable[[_Walk, ir.Node], list[State]]:
    def rule(w: _Walk, node: ir.Node) -> list[State]:
        a, b = node.inputs[a_index], node.inputs[b_index]
        for i, v in enumerate(node.inputs):
            if i not in (a_index, b_index) and w.of(v) is not None:
                raise Unsafe(f"takes its parameter '{v.name}' from the requests")
        ra, rb = w.rank(a), w.rank(b)
        out_rank = (ra - 1 if rb == 1 else rb - 1) if 1 in (ra, rb) else max(ra, rb)
        axes = set()
        for v, r, row, other in ((a, ra, -2, b), (b, rb, -1, a)):
            s = w.of(v)
            if s is None:
                continue
            contracted = r - 1 if v is a else r - 2
            if r == 1 or s.axis == contracted:
                raise Unsafe(f"contracts the batch axis of '{v.name}' (a sum over the "
                             "requests' rows)")
            if s.axis == r + row:  # the row axis of A, the column axis of B
                axes.add(out_rank + row if 1 not in (ra, rb) else out_rank - 1)
                continue
            axis = s.axis + out_rank - r if 1 not in (ra, rb) else s.axis
            dims = w.dims(other) if w.of(other) is None else None
            pos = axis - (out_rank - len(dims)) if dims is not None else -1
            if dims is not None and 0 <= pos < len(dims) - 2 and dims[pos] != 1:
                raise Unsafe(f"broadcasts '{other.name}' against the batch axis")
            axes.add(axis)
        if len(axes) != 1:
            raise Unsafe("multiplies two requests' rows together (outer product of batches)")
        return [Rows(axes.pop(), out_rank)]

    return rule


def _gemm(w: _Walk, node: ir.Node) -> list[State]:
    trans_a = "transA" in node.attributes and node.attributes["transA"].value
    s = w.of(node.inputs[0])
    if w.of(node.inputs[1]) is not None or not isinstance(s, Rows):
        raise Unsafe("takes its weights (or only its bias) from the requests")
    if s.axis != (1 if trans_a else 0):
        raise Unsafe("contracts the batch axis (a sum over the requests' rows)")
    out = Rows(0, 2)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        c = w.of(node.inputs[2])
        if isinstance(c, Rows) and c.axis + 2 - c.rank != 0:
            raise Unsafe("adds a bias that carries the batch along its columns")
        if c is None:
            dims = w.dims(node.inputs[2])
            if dims is None or (len(dims) == 2 and dims[0] != 1):
                raise Unsafe("broadcasts its bias against the batch axis")
    return [out]


def _transpose(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    perm = w.ints(node, "perm") or list(range(s.rank))[::-1]
    return [Rows(perm.index(s.axis), s.rank)]


def _unsqueeze(w: _Walk, node: ir.Node) -> list[State]:
    s = w.of(node.inputs[0])
    axes = w.ints(node, "axes", 1) or []
    if isinstance(s, Dims):
        if not s.scalar or axes not in ([0], [-1]):
            raise Unsafe("reshapes the batch size")
        return [Dims(s.entries)]
    s = w.only(node)
    out_rank = s.rank + len(axes)
    kept = [i for i in range(out_rank) if i not in {axis_index(a, out_rank) for a in axes}]
    return [Rows(kept[s.axis], out_rank)]


def _squeeze(w: _Walk, node: ir.Node) -> list[State]:
    s = w.of(node.inputs[0])
    axes = w.ints(node, "axes", 1)
    if isinstance(s, Dims):
        if s.scalar or len(s.entries) != 1:
            raise Unsafe("reshapes the batch size")
        return [Dims(s.entries, scalar=True)]
    s = w.only(node)
    if axes is None:
        raise Unsafe("squeezes every axis of size 1, the batch axis of a one-row request "
                     "among them")
    axes = {axis_index(a, s.rank) for a in axes}
    if s.axis in axes:
        raise Unsafe("squeezes the batch axis")
    return [Rows(s.axis - sum(a < s.axis for a in axes), s.rank - len(axes))]


def _flatten(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    axis = axis_index((w.ints(node, "axis") or [1])[0], s.rank)
    if (s.axis, axis) != (0, 1):
        raise Unsafe(f"merges the batch axis (axis {s.axis}) with other axes (flattening "
                     f"at axis {axis})")
    return [Rows(0, 2)]


def _shape_entries(w: _Walk, v: ir.Value) -> tuple[Any, ...]:
    s = w.of(v)
    if isinstance(s, Dims):
        return s.entries
    arr = w.const(v)
    if arr is None:
        raise Unsafe(f"takes its shape '{v.name}' from a computed value the check cannot read")
    return tuple(int(x) for x in np.ravel(arr))


def _reshape(w: _Walk, node: ir.Node) -> list[State]:
    s = w.of(node.inputs[0])
    if not isinstance(s, Rows) or s.axis != 0:
        raise Unsafe("reshapes a value whose batch is not on axis 0")
    entries = _shape_entries(w, node.inputs[1])
    allow_zero = "allowzero" in node.attributes and node.attributes["allowzero"].value
    if not entries or "B" in entries[1:]:
        raise Unsafe("moves the batch size to another axis")
    first = entries[0]
    if first == "B" or (first == 0 and not allow_zero):
        return [Rows(0, len(entries))]
    if first == -1 and all(isinstance(e, int) and e > 0 for e in entries[1:]):
        dims = w.dims(node.inputs[0])
        rest = dims[1:] if dims is not None and len(dims) == s.rank else (None,)
        if all(isinstance(d, int) for d in rest) and np.prod(rest) == np.prod(entries[1:]):
            return [Rows(0, len(entries))]
    raise Unsafe("may merge or split rows: its new first dim is not the batch size")


def _expand(w: _Walk, node: ir.Node) -> list[State]:
    entries = _shape_entries(w, node.inputs[1])
    s = w.of(node.inputs[0])
    rank = w.rank(node.inputs[0])
    out_rank = max(rank, len(entries))
    b = [i + out_rank - len(entries) for i, e in enumerate(entries) if e == "B"]
    if s is None:
        if len(b) != 1:
            raise Unsafe("expands to a shape with the batch size on several axes")
        return [Rows(b[0], out_rank)]
    if not isinstance(s, Rows):
        raise Unsafe("expands the batch size")
    axis = s.axis + out_rank - rank
    pos = axis - (out_rank - len(entries))
    if any(i != axis for i in b) or (pos >= 0 and entries[pos] not in (1, "B")):
        raise Unsafe("repeats rows along the batch axis")
    return [Rows(axis, out_rank)]


def _constant_of_shape(w: _Walk, node: ir.Node) -> list[State]:
    entries = _shape_entries(w, node.inputs[0])
    b = [i for i, e in enumerate(entries) if e == "B"]
    if len(b) != 1:
        raise Unsafe("makes a tensor with the batch size on several axes")
    return [Rows(b[0], len(entries))]


def _shape(w: _Walk, node: ir.Node) -> list[State]:
    s = w.rows(node)
    dims = w.dims(node.inputs[0]) or (None,) * s.rank
    if len(dims) != s.rank:
        dims = (None,) * s.rank
    entries = tuple("B" if i == s.axis else d for i, d in enumerate(dims))
    start = w.ints(node, "start") or [0]
    end = w.ints(node, "end")
    picked = entries[start[0]:end[0] if end else None]
    return [Dims(picked) if "B" in picked else None]


def _gather(w: _Walk, node: ir.Node) -> list[State]:
    data, indices = node.inputs[0], node.inputs[1]
    sd, si = w.of(data), w.of(indices)
    if isinstance(sd, Dims) and si is None:
        idx = w.const(indices)
        if idx is None:
            raise Unsafe("picks from the batch size with computed indices")
        picked = tuple(sd.entries[int(i)] for i in np.ravel(idx))
        return [Dims(picked, scalar=idx.ndim == 0) if "B" in picked else None]
    rank = w.rank(data)
    axis = axis_index((w.ints(node, "axis") or [0])[0], rank)
    if isinstance(sd, Rows) and si is None:
        if sd.axis == axis:
            raise Unsafe("picks rows along the batch axis")
        ri = w.rank(indices)
        return [Rows(sd.axis if sd.axis < axis else sd.axis + ri - 1, rank + ri - 1)]
    if sd is None and isinstance(si, Rows):
        return [Rows(axis + si.axis, rank + si.rank - 1)]
    raise Unsafe("indexes requests' values with other requests' indices")


def _gather_elements(w: _Walk, node: ir.Node) -> list[State]:
    sd, si = w.of(node.inputs[0]), w.of(node.inputs[1])
    if not (isinstance(sd, Rows) and sd == si):
        raise Unsafe("needs data and indices that both carry the batch on the same axis")
    if axis_index((w.ints(node, "axis") or [0])[0], sd.rank) == sd.axis:
        raise Unsafe("picks along the batch axis")
    return [si]


def _slice(w: _Walk, node: ir.Node) -> list[State]:
    s = w.of(node.inputs[0])
    for v in node.inputs[1:]:
        if v is not None and w.of(v) is not None:
            raise Unsafe(f"takes its bounds '{v.name}' from the requests")
    starts, ends = w.const(node.inputs[1]), w.const(node.inputs[2])
    if isinstance(s, Dims):
        axes = w.ints(node, "axes", 3) or [0]
        steps = w.ints(node, "steps", 4) or [1]
        if starts is None or ends is None or axes not in ([0], [-1]):
            raise Unsafe("cuts the batch size with bounds the check cannot read")
        picked = s.entries[int(starts[0]):int(min(ends[0], _FULL)):steps[0]]
        return [Dims(picked) if "B" in picked else None]
    s = w.only(node)
    n = len(starts) if starts is not None else len(w.dims(node.inputs[1]) or ())
    axes = [axis_index(a, s.rank) for a in (w.ints(node, "axes", 3) or range(n))]
    if s.axis in axes:
        i = axes.index(s.axis)
        steps = w.ints(node, "steps", 4) or [1] * len(axes)
        if (starts is None or ends is None or int(starts[i]) != 0 or int(ends[i]) < _FULL
                or steps[i] != 1):
            raise Unsafe("cuts rows along the batch axis")
    return [s]


def _split(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    if axis_index((w.ints(node, "axis") or [0])[0], s.rank) == s.axis:
        raise Unsafe("splits along the batch axis")
    return [s] * len(node.outputs)


def _concat(w: _Walk, node: ir.Node) -> list[State]:
    states = [w.of(v) for v in node.inputs]
    if any(isinstance(s, Dims) for s in states):
        if any(isinstance(s, Rows) for s in states):
            raise Unsafe("joins the batch size with requests' values")
        entries: list[Any] = []
        for v, s in zip(node.inputs, states):
            if isinstance(s, Dims):
                entries.extend(s.entries)
            elif (arr := w.const(v)) is not None:
                entries.extend(int(x) for x in np.ravel(arr))
            elif (dims := w.dims(v)) and len(dims) == 1 and isinstance(dims[0], int):
                entries.extend([None] * dims[0])
            else:
                raise Unsafe("joins the batch size with a shape of unknown length")
        return [Dims(tuple(entries))]
    first = next(s for s in states if s is not None)
    if any(s != first for s in states):
        raise Unsafe("joins requests' values with values that do not carry the batch "
                     "(they would need the batch size along the batch axis)")
    if axis_index(w.ints(node, "axis")[0], first.rank) == first.axis:
        raise Unsafe("joins along the batch axis")
    return [first]


def _tile(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    repeats = w.ints(node, "repeats", 1)
    if repeats[s.axis] != 1:
        raise Unsafe("repeats rows along the batch axis")
    return [s]


def _pad(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    pads = w.ints(node, "pads", 1)
    axes = w.ints(node, "axes", 3) or list(range(s.rank))
    axes = [axis_index(a, s.rank) for a in axes]
    if s.axis in axes:
        i = axes.index(s.axis)
        if pads[i] != 0 or pads[i + len(axes)] != 0:
            raise Unsafe("pads the batch axis")
    return [s]


def _resize(w: _Walk, node: ir.Node) -> list[State]:
    s = w.rows(node)
    if any(w.of(v) is not None for v in node.inputs[1:3]):
        raise Unsafe("takes its scales from the requests")
    axes = w.ints(node, "axes")
    if axes is not None and s.axis not in [axis_index(a, s.rank) for a in axes]:
        return [s]
    scales_index = 1 if node.op_type == "Upsample" else 2
    scales = w.const(node.inputs[scales_index]) if len(node.inputs) > scales_index else None
    if scales is not None and scales.size:
        if scales[s.axis] != 1:
            raise Unsafe("scales the batch axis")
        return [s]
    sizes = node.inputs[3] if len(node.inputs) > 3 else None
    if sizes is not None and isinstance(w.of(sizes), Dims):
        entries = w.of(sizes).entries
        if entries[s.axis] == "B" and entries.count("B") == 1:
            return [s]
    raise Unsafe("resizes to sizes that do not keep the batch size on the batch axis")


def _quantize(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    scale = w.dims(node.inputs[1]) if len(node.inputs) > 1 else ()
    per_axis = scale is None or (len(scale) > 0 and scale != (1,))
    if per_axis and axis_index((w.ints(node, "axis") or [1])[0], s.rank) == s.axis:
        raise Unsafe("quantizes with one scale per row of the batch axis")
    return [s]


def _one_hot(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    axis = axis_index((w.ints(node, "axis") or [-1])[0], s.rank + 1)
    return [Rows(s.axis if s.axis < axis else s.axis + 1, s.rank + 1)]


def _trilu(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    if s.axis >= s.rank - 2:
        raise Unsafe("works on a matrix whose rows are the batch axis")
    return [s]


def _identity_dims(w: _Walk, node: ir.Node) -> list[State]:
    s = w.of(node.inputs[0])
    if isinstance(s, Dims):
        return [s]
    return _first_input(w, node) if node.op_type == "CastLike" else _elementwise(w, node)


def _names(text: str) -> list[str]:
    return text.split()


_ELEMENTWISE = _names(
    "Abs Acos Acosh Add And Asin Asinh Atan Atanh BitShift BitwiseAnd BitwiseNot BitwiseOr "
    "BitwiseXor Ceil Celu Clip Cos Cosh Div Elu Equal Erf Exp Floor Gelu Greater "
    "GreaterOrEqual HardSigmoid HardSwish IsInf IsNaN LeakyRelu Less LessOrEqual Log Max Mean "
    "Min Mish Mod Mul Neg Not Or Pow PRelu Reciprocal Relu Round Selu Shrink Sigmoid Sign Sin "
    "Sinh Softplus Softsign Sqrt Sub Sum Tan Tanh ThresholdedRelu Where Xor")
_LEADING = _names(
    "AveragePool Conv ConvInteger ConvTranspose DepthToSpace GlobalAveragePool GlobalLpPool "
    "GlobalMaxPool GroupNormalization InstanceNormalization LpPool LRN MaxPool QLinearConv "
    "SpaceToDepth")
_REDUCE = _names("ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin "
                   "ReduceProd ReduceSum ReduceSumSquare")

RULES: dict[str, Callable[[_Walk, ir.Node], list[State]]] = {
    **dict.fromkeys(_ELEMENTWISE, _elementwise),
    **dict.fromkeys(_LEADING, _leading),
    **dict.fromkeys(_REDUCE, _reduce),
    "ArgMax": _arg_reduce, "ArgMin": _arg_reduce,
    "Cast": _identity_dims, "CastLike": _identity_dims, "Identity": _identity_dims,
    "Dropout": _first_input,
    "Softmax": _softmax, "LogSoftmax": _softmax, "Hardmax": _softmax,
    "LayerNormalization": _layer_norm, "RMSNormalization": _layer_norm,
    "MeanVarianceNormalization": _mvn, "BatchNormalization": _batch_norm,
    "LpNormalization": _along(-1, "normalizes"), "CumSum": _along(0, "sums"),
    "TopK": _along(-1, "sorts"),
    "MatMul": _matmul(0, 1), "MatMulInteger": _matmul(0, 1), "QLinearMatMul": _matmul(0, 3),
    "Gemm": _gemm,
    "Transpose": _transpose, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Flatten": _flatten, "Reshape": _reshape, "Expand": _expand,
    "ConstantOfShape": _constant_of_shape, "Shape": _shape,
    "Gather": _gather, "GatherElements": _gather_elements, "Slice": _slice,
    "Split": _split, "Concat": _concat, "Tile": _tile, "Pad": _pad,
    "Resize": _resize, "Upsample": _resize,
    "QuantizeLinear": _quantize, "DequantizeLinear": _quantize,
    "OneHot": _one_hot, "Trilu": _trilu,
}
"""The ops the check knows, by ai.onnx op type; any other op reading the batch refuses."""

# ops whose rule reads the batch size (a `Dims`) itself; elsewhere it refuses
DIMS_OPS = {"Cast", "CastLike", "Identity", "Unsqueeze", "Squeeze", "Gather", "Slice", "Concat",
             "Reshape", "Expand", "ConstantOfShape", "Resize"}
