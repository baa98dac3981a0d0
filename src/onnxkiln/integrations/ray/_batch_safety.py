"""Whether requests may share a run: a static check that a model keeps its rows apart.

Stacking requests along axis 0 is only correct when output row i depends on input row i
alone. `batching_refusal(model)` follows "which axis holds the batch" from axis 0 of
every required input through the graph and returns why stacking is unsafe (naming the
node, its op and the reason), or None when it is proven safe. It refuses:

- reductions (ReduceSum, ReduceMean, ... and ArgMax/ArgMin) whose axes include the batch
  axis, or that reduce over all axes;
- TopK and CumSum along the batch axis; Unique, NonZero, Compress, Size, EyeLike,
  DynamicQuantizeLinear, and anything else that looks at the whole tensor;
- Softmax/LogSoftmax/Hardmax, LayerNormalization, RMSNormalization, LpNormalization and
  MeanVarianceNormalization whose normalized axes include the batch axis; BatchNormalization
  in training form, or over the batch axis as channels; InstanceNormalization,
  GroupNormalization, LRN, Conv and the pools unless the batch is their N axis, and
  MaxPool's second output (flat indices that count the whole batch);
- MatMul/Gemm that contract the batch axis, or multiply two requests' rows together;
- Gather, GatherElements, Slice, Split, Concat, Tile, Pad, Squeeze over the batch
  axis (picking, cutting, joining or repeating rows); Flatten and Reshape that merge it with
  other axes; broadcasting a fixed dim against it;
- the batch size (read with Shape) feeding a data computation rather than a shape
  (Reshape, Expand, ConstantOfShape, Resize);
- If, Loop and Scan reading batch-carrying values, and every op not listed in `RULES`
  (attention, recurrent, GatherND, Einsum and contrib ops included): not proven, so refused;
- outputs that do not carry the batch along axis 0.

Elementwise and broadcasting ops, Cast, Transpose, Unsqueeze and the ops above over other
axes keep (or move) the batch axis. The check reads the model as written (before
onnxkiln's fusions, which keep its meaning); ranks and static dims come from onnx shape
inference. It is conservative: a model it cannot follow (an unknown rank, a shape computed
in a way it does not read, an LSTM) is refused even when its rows are in fact independent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxkiln import onnx_guard
from onnxkiln.errors import InvalidOptionError
from onnxkiln.loader import from_graph
from onnxkiln.skeleton import skeleton

__all__ = ["RULES", "batching_refusal", "require_independent_rows"]

logger = logging.getLogger(__name__)
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


def batching_refusal(model: ir.Model | ir.Graph | onnx.ModelProto) -> str | None:
    """Why requests must not be stacked along axis 0 for `model`; None when it is safe."""
    if isinstance(model, onnx.ModelProto):
        model = from_graph(model)
    if isinstance(model, ir.Graph):
        model = ir.Model(model, ir_version=10)
    try:
        _Walk(model).run()
    except Unsafe as e:
        return str(e)
    return None


def require_independent_rows(model: ir.Model | ir.Graph | onnx.ModelProto) -> None:
    """Raise `InvalidOptionError` unless stacking requests is proven safe for `model`."""
    reason = batching_refusal(model)
    if reason is not None:
        raise InvalidOptionError(
            f"batching=True refused: {reason}. Stacked with other requests, one request's "
            "answer would depend on their rows; serve this model with batching=False (the "
            "default), which runs each request on its own")


class _Walk:
    def __init__(self, model: ir.Model) -> None:
        self.graph = model.graph
        self.opset = (model.opset_imports or model.graph.opset_imports).get("", 1)
        self.state: dict[ir.Value, State] = {}
        self.shapes = _inferred_shapes(model)

    def run(self) -> None:
        for v in self.graph.inputs:
            if v.const_value is not None:
                continue
            dims = self.dims(v)
            if not dims:
                raise Unsafe(f"input '{v.name}' declares no shape with a batch axis, so "
                             "rows of different requests cannot be told apart")
            self.state[v] = Rows(0, len(dims))
        for node in self.graph:
            self.visit(node)
        for v in self.graph.outputs:
            s = self.state.get(v)
            if not (isinstance(s, Rows) and s.axis == 0):
                where = "does not depend on the requests' rows" if s is None else (
                    f"carries the batch along axis {s.axis}" if isinstance(s, Rows)
                    else "holds the batch size")
                raise Unsafe(f"output '{v.name}' {where}, so it cannot be split back into "
                             "one answer per request along axis 0")

    def visit(self, node: ir.Node) -> None:
        carried = [v for v in _reads(node) if self.state.get(v) is not None]
        if not carried:
            return
        label = (f"node '{node.name}' ({node.op_type})" if node.name else
                 f"the {node.op_type} node making '{node.outputs[0].name}'")
        if any(a.type == ir.AttributeType.GRAPH or a.type == ir.AttributeType.GRAPHS
               for a in node.attributes.values()):
            raise Unsafe(f"{label} runs a subgraph on batch-carrying values; control flow "
                         "is not analysed, so its rows are not proven independent")
        rule = RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule is None:
            raise Unsafe(f"{label} reads batch-carrying values, and the check does not know "
                         "this op keeps rows apart")
        if node.op_type not in _DIMS_OPS:
            for v in node.inputs:
                if isinstance(self.state.get(v), Dims):
                    raise Unsafe(f"{label}: '{v.name}' holds the batch size (read with "
                                 "Shape), which here feeds a data computation")
        try:
            outs = rule(self, node)
        except Unsafe as e:
            raise Unsafe(f"{label} {e}") from None
        except Exception as e:  # a form the rule does not expect: not proven, so unsafe
            raise Unsafe(f"{label} could not be analysed ({type(e).__name__}: {e})") from None
        for v, s in zip(node.outputs, outs):
            self.state[v] = s

    # --- what is known about a value ---------------------------------------------------

    def of(self, v: ir.Value | None) -> State:
        return self.state.get(v) if v is not None else None

    def dims(self, v: ir.Value) -> tuple[Any, ...] | None:
        """Static dims (None where unknown) of a value, from the model or inference."""
        if v.const_value is not None:
            return tuple(v.const_value.shape.numpy())
        known = (tuple(d if isinstance(d, int) else None for d in v.shape)
                 if v.shape is not None else self.shapes.get(v.name))
        if known is not None and None not in known:
            return known
        return _merge(known, self.derived_dims(v))

    def derived_dims(self, v: ir.Value) -> tuple[Any, ...] | None:
        """Dims onnx inference leaves unknown but the producer keeps: a Slice with computed
        bounds keeps its other axes (position ids cut to the sequence length), a Gather
        its data's other axes."""
        node = v.producer()
        if self.of(v) is not None or node is None or node.op_type not in ("Slice", "Gather"):
            return None
        data = self.dims(node.inputs[0])
        if data is None:
            return None
        try:
            if node.op_type == "Gather":
                axis = _axis((self.ints(node, "axis") or [0])[0], len(data))
                index = self.dims(node.inputs[1])
                return None if index is None else data[:axis] + index + data[axis + 1:]
            axes = self.ints(node, "axes", 3)
        except Unsafe:
            return None
        if axes is None:
            return None
        cut = {_axis(a, len(data)) for a in axes}
        return tuple(None if i in cut else d for i, d in enumerate(data))

    def rank(self, v: ir.Value) -> int:
        s = self.of(v)
        if isinstance(s, Rows):
            return s.rank
        if isinstance(s, Dims):
            return 0 if s.scalar else 1
        dims = self.dims(v)
        if dims is None:
            raise Unsafe(f"cannot tell the rank of '{v.name}'")
        return len(dims)

    def const(self, v: ir.Value | None) -> np.ndarray | None:
        if v is None:
            return None
        if v.const_value is not None:
            return v.const_value.numpy()
        node = v.producer()
        if node is not None and node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for key, attr in node.attributes.items():
                if key == "value":
                    return attr.value.numpy()
                if key.startswith("value_"):
                    return np.asarray(attr.value)
        return None

    def ints(self, node: ir.Node, attr: str, index: int | None = None) -> list[int] | None:
        """Int list from an attribute, else from constant input `index`; None if absent."""
        if attr in node.attributes:
            value = node.attributes[attr].value
            return [int(a) for a in (value if isinstance(value, Sequence) else [value])]
        if index is not None and index < len(node.inputs) and node.inputs[index] is not None:
            arr = self.const(node.inputs[index])
            if arr is None:
                raise Unsafe(f"takes '{node.inputs[index].name}' ({attr}) from a computed "
                             "value, so the check cannot tell which axes it touches")
            return [int(a) for a in np.ravel(arr)]
        return None

    def rows(self, node: ir.Node, index: int = 0) -> Rows:
        s = self.of(node.inputs[index])
        if not isinstance(s, Rows):
            raise Unsafe("reads the batch through an input it does not treat row by row")
        return s

    def only(self, node: ir.Node, index: int = 0) -> Rows:
        """Input `index` carries the batch; no other input does."""
        for i, v in enumerate(node.inputs):
            if i != index and self.of(v) is not None:
                raise Unsafe(f"mixes requests' values in its input '{v.name}' (weights, "
                             "indices or parameters taken from the requests)")
        return self.rows(node, index)


def _reads(node: ir.Node) -> list[ir.Value]:
    """The node's inputs and what its subgraphs read from outside them."""
    values = [v for v in node.inputs if v is not None]
    for attr in node.attributes.values():
        graphs = ([attr.value] if attr.type == ir.AttributeType.GRAPH
                  else list(attr.value) if attr.type == ir.AttributeType.GRAPHS else [])
        for g in graphs:
            for inner in ir.traversal.RecursiveGraphIterator(g):
                values.extend(v for v in inner.inputs if v is not None)
    return values


def _merge(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    if a is None or b is None or len(a) != len(b):
        return a if a is not None else b
    return tuple(x if x is not None else y for x, y in zip(a, b))


def _inferred_shapes(model: ir.Model) -> dict[str, tuple[Any, ...] | None]:
    """Value name -> dims (None for symbolic) from onnx shape inference; {} if it fails."""
    try:
        proto = onnx_guard.infer_shapes(skeleton(model), check_type=False,
                                        strict_mode=False, data_prop=True)
    except Exception as e:  # inference is an aid: without it, unknown ranks refuse
        logger.debug("shape inference skipped: %s", e)
        return {}
    shapes: dict[str, tuple[Any, ...] | None] = {}
    for info in proto.graph.value_info:
        t = info.type.tensor_type
        if t.HasField("shape"):
            shapes[info.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                      for d in t.shape.dim)
    return shapes


def _axis(axis: int, rank: int) -> int:
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
    axes = sorted({_axis(a, s.rank) for a in axes})
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
        axis = _axis((axis or [default])[0], s.rank)
        if axis == s.axis:
            raise Unsafe(f"{what} along the batch axis (axis {s.axis})")
        return [s] * len(node.outputs)

    return rule


def _softmax(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    if w.opset >= 13:
        axis = _axis((w.ints(node, "axis") or [-1])[0], s.rank)
        if axis == s.axis:
            raise Unsafe(f"normalizes along the batch axis (axis {s.axis})")
    elif s.axis >= _axis((w.ints(node, "axis") or [1])[0], s.rank):
        raise Unsafe("normalizes over a block of axes that includes the batch axis")
    return [s]


def _layer_norm(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    if s.axis >= _axis((w.ints(node, "axis") or [-1])[0], s.rank):
        raise Unsafe(f"normalizes over axes that include the batch axis (axis {s.axis})")
    return [s] * len(node.outputs)


def _mvn(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    axes = [_axis(a, s.rank) for a in (w.ints(node, "axes") or [0, 2, 3])]
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
    kept = [i for i in range(out_rank) if i not in {_axis(a, out_rank) for a in axes}]
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
    axes = {_axis(a, s.rank) for a in axes}
    if s.axis in axes:
        raise Unsafe("squeezes the batch axis")
    return [Rows(s.axis - sum(a < s.axis for a in axes), s.rank - len(axes))]


def _flatten(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    axis = _axis((w.ints(node, "axis") or [1])[0], s.rank)
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
    axis = _axis((w.ints(node, "axis") or [0])[0], rank)
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
    if _axis((w.ints(node, "axis") or [0])[0], sd.rank) == sd.axis:
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
    axes = [_axis(a, s.rank) for a in (w.ints(node, "axes", 3) or range(n))]
    if s.axis in axes:
        i = axes.index(s.axis)
        steps = w.ints(node, "steps", 4) or [1] * len(axes)
        if (starts is None or ends is None or int(starts[i]) != 0 or int(ends[i]) < _FULL
                or steps[i] != 1):
            raise Unsafe("cuts rows along the batch axis")
    return [s]


def _split(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    if _axis((w.ints(node, "axis") or [0])[0], s.rank) == s.axis:
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
    if _axis(w.ints(node, "axis")[0], first.rank) == first.axis:
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
    axes = [_axis(a, s.rank) for a in axes]
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
    if axes is not None and s.axis not in [_axis(a, s.rank) for a in axes]:
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
    if per_axis and _axis((w.ints(node, "axis") or [1])[0], s.rank) == s.axis:
        raise Unsafe("quantizes with one scale per row of the batch axis")
    return [s]


def _one_hot(w: _Walk, node: ir.Node) -> list[State]:
    s = w.only(node)
    axis = _axis((w.ints(node, "axis") or [-1])[0], s.rank + 1)
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
_DIMS_OPS = {"Cast", "CastLike", "Identity", "Unsqueeze", "Squeeze", "Gather", "Slice", "Concat",
             "Reshape", "Expand", "ConstantOfShape", "Resize"}
