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
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxkiln import onnx_guard
from onnxkiln.errors import InvalidOptionError
from onnxkiln.integrations.ray._batch_rules import (
    DIMS_OPS,
    RULES,
    Dims,
    Rows,
    State,
    Unsafe,
    axis_index,
)
from onnxkiln.loader import from_graph
from onnxkiln.skeleton import skeleton

__all__ = ["RULES", "batching_refusal", "require_independent_rows"]

logger = logging.getLogger(__name__)


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
        if node.op_type not in DIMS_OPS:
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
                axis = axis_index((self.ints(node, "axis") or [0])[0], len(data))
                index = self.dims(node.inputs[1])
                return None if index is None else data[:axis] + index + data[axis + 1:]
            axes = self.ints(node, "axes", 3)
        except Unsafe:
            return None
        if axes is None:
            return None
        cut = {axis_index(a, len(data)) for a in axes}
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

