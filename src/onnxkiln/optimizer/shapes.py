"""Basic-level shape-subgraph folding.

Shape computations (Shape, Size, and the Gather/Slice/Unsqueeze/Concat that exporters chain
after Shape) are traced element by element: each element is a known int, or "dim j of value
a" when shape inference left that dim symbolic. Then

- a shape value whose elements are all known folds to a constant (static shapes);
- a Reshape target whose unknown elements are all "dim i of a" at position i, where the
  reshaped tensor's dim i is provably the same (same int, or same named symbol from shape
  inference that the graph inputs declare at most once: a name several input axes share is
  no promise of equal sizes), becomes a constant with 0 ("copy dim i") there:
  `x.view(b, s, heads, dh)` exports as Reshape(x, Concat(Slice(Shape(y), 0, 2), [heads, dh]))
  and turns into Reshape(x, [0, 0, heads, dh]), so its Shape/Slice/Concat die.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from onnxkiln.optimizer._graph import (
    Context,
    attr,
    const_array,
    const_shape,
    is_onnx,
    nodes_of,
    producer,
)
from onnxkiln.optimizer.fold import evaluate, to_initializer

__all__ = ["fold_reshape_targets", "fold_shapes"]

Dim = int | tuple[ir.Value, int]  # a known size, or (value, axis) for a symbolic dim
_SHAPE_OPS = ("Size", "Shape", "Gather", "Slice", "Unsqueeze", "Concat")  # what may fold
_MAX_ELEMENTS = 64


def fold_shapes(ctx: Context) -> bool:
    """Fold shape computations whose every element is statically known."""
    changed = False
    memo: dict = {}  # one per sweep: folding replaces values by equal constants only
    for graph in ctx.graphs():
        for node in nodes_of(graph, *_SHAPE_OPS):
            if node.graph is not graph or len(node.outputs) != 1:
                continue
            out = node.outputs[0]
            if not (out.uses() or out.is_graph_output()):
                continue
            array = _static_value(ctx, node, memo)
            if array is None:
                continue
            to_initializer(ctx, graph, out, array)
            graph.remove(node, safe=True)
            ctx.stats["shape.fold"] += 1
            changed = True
    return changed


def _static_value(ctx: Context, node: ir.Node, memo: dict) -> np.ndarray | None:
    if is_onnx(node, "Size"):
        x = node.inputs[0]
        if x is None or x.shape is None or not all(isinstance(d, int) for d in x.shape):
            return None
        return np.array(math.prod(x.shape), np.int64)
    if not is_onnx(node, "Shape", "Gather", "Slice", "Unsqueeze", "Concat"):
        return None
    traced = _trace(ctx, node.outputs[0], memo)
    if traced is None or not all(isinstance(d, int) for d in traced[0]):
        return None
    dims, scalar = traced
    return np.array(dims[0] if scalar else dims, np.int64)


def _trace(ctx: Context, value: ir.Value | None, memo: dict) -> tuple[list[Dim], bool] | None:
    """(elements, is 0-d) of an int64 shape value, or None when it cannot be traced. `memo`
    maps id(value) to (value, result): it holds the value, so the id is never reused."""
    if value is None:
        return None
    key = id(value)
    if key not in memo:
        memo[key] = (value, _trace_uncached(ctx, value, memo))
    return memo[key][1]


def _trace_uncached(ctx, value, memo):
    shape = const_shape(value)
    if shape is not None and (len(shape) > 1 or math.prod(shape) > _MAX_ELEMENTS):
        return None  # a weight, not a shape: do not read it
    arr = const_array(value) if shape is not None else None
    if arr is not None:
        if arr.dtype != np.int64 or arr.ndim > 1 or arr.size > _MAX_ELEMENTS:
            return None
        return [int(v) for v in arr.reshape(-1)], arr.ndim == 0
    node = producer(value, "Shape", "Gather", "Slice", "Unsqueeze", "Concat")
    if node is None:
        return None
    op = node.op_type
    if op == "Shape":
        dims = _shape_elements(node)
        return None if dims is None else (dims, False)
    if op in ("Gather", "Slice"):
        return _pick(ctx, node, memo)
    if op == "Unsqueeze":
        src = _trace(ctx, node.inputs[0], memo)
        axes = (attr(node, "axes", kind=ir.AttributeType.INTS) if len(node.inputs) < 2
                else const_array(node.inputs[1]))
        if src is None or not src[1] or axes is None or [int(a) for a in np.ravel(axes)] \
                not in ([0], [-1]):
            return None
        return src[0], False
    if op == "Concat" and attr(node, "axis", kind=ir.AttributeType.INT) in (0, -1):
        out: list[Dim] = []
        for v in node.inputs:
            part = _trace(ctx, v, memo)
            if part is None or part[1]:
                return None
            out.extend(part[0])
        return out, False
    return None


def _shape_elements(shape_node: ir.Node) -> list[Dim] | None:
    x = shape_node.inputs[0] if shape_node.inputs else None
    if x is None or x.shape is None:
        return None
    dims: list[Dim] = [d if isinstance(d, int) else (x, j) for j, d in enumerate(x.shape)]
    lo = attr(shape_node, "start", 0)
    hi = attr(shape_node, "end", len(dims))
    return dims[slice(*slice(lo, hi).indices(len(dims)))]


def _pick(ctx: Context, node: ir.Node, memo: dict) -> tuple[list[Dim], bool] | None:
    """Run the Gather/Slice on the element positions with our kernel, then map them back."""
    src = _trace(ctx, node.inputs[0], memo)
    if src is None or src[1]:
        return None
    arrays: list = [np.arange(len(src[0]), dtype=np.int64)]
    for v in node.inputs[1:]:
        a = const_array(v) if v is not None else None
        if v is not None and a is None:
            return None
        arrays.append(a)
    picked = evaluate(ctx, node, arrays)
    if picked is None or picked[0].ndim > 1:
        return None
    return [src[0][int(i)] for i in picked[0].reshape(-1)], picked[0].ndim == 0


def fold_reshape_targets(ctx: Context) -> bool:
    """Turn Reshape targets built from the input's own symbolic dims into constants."""
    changed = False
    memo: dict = {}  # one per sweep: this pass changes no traced value
    loose = _shared_input_dims(ctx.model.graph)
    for graph in ctx.graphs():
        for node in nodes_of(graph, "Reshape"):
            if node.graph is not graph or not is_onnx(node, "Reshape") or \
                    len(node.inputs) != 2 or attr(node, "allowzero", 0):
                continue
            x, target = node.inputs
            if x is None or x.shape is None or const_array(target) is not None:
                continue
            traced = _trace(ctx, target, memo)
            if traced is None or traced[1]:
                continue
            dims = [_as_copy(d, i, x, loose) for i, d in enumerate(traced[0])]
            if any(d is None for d in dims):
                continue
            value = ctx.initializer(graph, f"{node.name or 'reshape'}_shape",
                                    np.array(dims, np.int64))
            node.replace_input_with(1, value)
            ctx.stats["shape.reshape"] += 1
            changed = True
    return changed


def _shared_input_dims(graph: ir.Graph) -> set[str]:
    """Dim names the graph's inputs declare at more than one axis (onnxruntime runs inputs
    whose equal-named dims differ, so such a name does not prove two sizes equal)."""
    seen: set[str] = set()
    shared: set[str] = set()
    for value in graph.inputs:
        for d in value.shape or ():
            name = None if isinstance(d, int) else d.value
            if name is not None:
                (shared if name in seen else seen).add(name)
    return shared


def _as_copy(d: Dim, i: int, x: ir.Value, loose: set[str]) -> int | None:
    """The constant to put at target position i: the int itself, or 0 (copy x's dim i) for a
    symbolic dim known to equal x's dim i; None when neither holds."""
    if isinstance(d, int):
        return d
    a, j = d
    if i != j or i >= len(x.shape) or a.shape is None or j >= len(a.shape):
        return None
    mine, theirs = x.shape[i], a.shape[j]
    if a is x or (not isinstance(mine, int) and not isinstance(theirs, int) and
                  mine.value is not None and mine.value == theirs.value and
                  mine.value not in loose):
        return 0
    return None
