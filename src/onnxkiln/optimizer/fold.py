"""Basic-level folding: Constant nodes to initializers, shape inference, constant folding with
our own kernels (shape computations are folded in `shapes.py`).

Folding runs a node once at optimize time through `onnxkiln.eager.dispatch`, so a folded value
is bit-identical to what the node would compute at run time. It never folds random ops, ops
with subgraphs, sequence/optional results, or a result much bigger than the inputs it frees
(ConstantOfShape/Expand/Tile blow-ups, a transposed copy of a weight something else still
reads): see `_worth_folding`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxkiln import onnx_guard
from onnxkiln.errors import SessionError
from onnxkiln.optimizer._graph import (
    Context,
    const_array,
    constant_attr_array,
    is_const,
    is_onnx,
    nodes_of,
)
from onnxkiln.optimizer.eliminate import RANDOM_OPS
from onnxkiln.skeleton import skeleton

__all__ = ["evaluate", "fold_constants", "forget_negative_dims", "infer_shapes", "lift_constants",
           "to_initializer"]

logger = logging.getLogger(__name__)

FOLD_LIMIT = 1 << 20  # bytes: a folded result above this must not grow the model's memory
_NEVER_FOLD = RANDOM_OPS | {"Constant", "Identity"}


def lift_constants(ctx: Context) -> bool:
    """Turn Constant nodes (tensor or number attributes) into initializers of their graph."""
    changed = False
    for graph in ctx.graphs():
        for node in nodes_of(graph, "Constant"):
            if not is_onnx(node, "Constant") or len(node.attributes) != 1:
                continue
            out = node.outputs[0]
            if out.is_graph_output():
                continue
            array = constant_attr_array(node)
            if array is None:
                continue
            to_initializer(ctx, graph, out, array)
            graph.remove(node, safe=True)
            ctx.stats["constant.lift"] += 1
            changed = True
    return changed


def to_initializer(ctx: Context, graph: ir.Graph, old: ir.Value, array: np.ndarray) -> None:
    """Replace the value `old` by a new initializer holding `array`, taking over its name."""
    name = old.name or ctx.name("folded")
    old.name = ctx.name(f"{name}__folded")
    value = ir.Value(name=name, shape=ir.Shape(array.shape),
                     type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=ir.Tensor(array))
    graph.register_initializer(value)
    old.replace_all_uses_with(value, replace_graph_outputs=True)


def forget_negative_dims(ctx: Context) -> bool:
    """Make negative declared dims (paddle2onnx writes -1 for "any size") unknown, as
    onnxruntime reads them, so no pass takes them for sizes."""
    changed = False
    for graph in ctx.graphs():
        values = [*graph.inputs, *graph.outputs, *(v for n in graph for v in n.outputs)]
        for value in values:
            shape = value.shape
            if shape is None or not any(isinstance(d, int) and d < 0 for d in shape):
                continue
            value.shape = ir.Shape([None if isinstance(d, int) and d < 0 else d
                                    for d in shape])
            changed = True
    return changed


def infer_shapes(ctx: Context) -> bool:
    """onnx shape inference (with data propagation) into the main graph's value shapes/types.

    Runs on a copy without the large initializers' data, and only when onnx's checker accepts
    that copy (its C++ inference can crash the process on malformed models, such as ones
    whose map-typed I/O the loader had to blank). Graph inputs and outputs keep what the
    model declares (the session's public metadata). Never fails: no inference, no change.
    """
    graph = ctx.model.graph
    serde_log = logging.getLogger("onnx_ir.serde")  # warns per output typed with a shape only
    level = serde_log.level
    serde_log.setLevel(logging.ERROR)
    try:
        proto = skeleton(ctx.model, value_info=True)
        onnx_guard.check_model(proto)
        inferred = onnx_guard.infer_shapes(proto, check_type=False,
                                           strict_mode=False, data_prop=True)
    except Exception as e:  # inference is an aid, never a failure
        logger.debug("shape inference skipped: %s", e)
        return False
    finally:
        serde_log.setLevel(level)
    values = {v.name: v for node in graph for v in node.outputs if v.name}
    # what the IR already knew, as sent: an inferred entry equal to its hint adds nothing
    # (exporters that write value_info for every intermediate leave most of them so)
    hints = {vi.name: vi.SerializeToString() for vi in proto.graph.value_info}
    changed = False
    for info in inferred.graph.value_info:
        value = values.get(info.name)
        if value is None or value.is_graph_output():
            continue
        hint = hints.get(info.name)
        if hint is not None and hint == info.SerializeToString():
            continue
        found = ir.serde.deserialize_value_info_proto(info, None)
        if value.type is None and found.type is not None:
            value.type = found.type
            changed = True
        if found.shape is not None:
            changed |= _merge_shape(value, found.shape)
    return changed


def _merge_shape(value: ir.Value, shape: ir.Shape) -> bool:
    if value.shape is None:
        value.shape = shape
        return True
    before = _dims(value.shape)
    try:
        value.merge_shapes(shape)
    except ValueError:  # conflicting dims: keep what the model said
        return False
    return _dims(value.shape) != before


def _dims(shape: ir.Shape) -> tuple:
    """The shape's dims as comparable plain values (ints, symbol names, None)."""
    return tuple(d if isinstance(d, int) else d.value for d in shape)


def fold_constants(ctx: Context) -> bool:
    """Evaluate nodes whose inputs are all constants and replace them by initializers."""
    changed = False
    for graph in ctx.graphs():
        for node in list(graph):
            if node.graph is graph and _fold_node(ctx, graph, node):
                changed = True
    return changed


def _fold_node(ctx: Context, graph: ir.Graph, node: ir.Node) -> bool:
    if (node.op_type in _NEVER_FOLD and node.domain in ("", "ai.onnx")) or \
            id(node) in ctx.unfoldable:
        return False
    if not node.inputs or not all(v is None or is_const(v) for v in node.inputs):
        return False
    if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) or a.is_ref()
           for a in node.attributes.values()):
        return False
    if _shared_weight(node):
        ctx.unfoldable.add(id(node))
        return False
    arrays = []
    for v in node.inputs:
        if v is None:
            arrays.append(None)
            continue
        a = const_array(v)
        if a is None or a.dtype.kind == "O":
            return False
        arrays.append(a)
    if all(a is None for a in arrays) or not _small_enough(node, arrays):
        return False
    outputs = evaluate(ctx, node, arrays)
    if outputs is None or not _worth_folding(node, arrays, outputs):
        ctx.unfoldable.add(id(node))
        return False
    for out, array in zip(node.outputs, outputs):
        if out.name == "" or not (out.uses() or out.is_graph_output()):
            continue
        if out.dtype is not None and out.dtype != ir.DataType.from_numpy(array.dtype):
            return False
    for out, array in zip(node.outputs, outputs):
        if out.uses() or out.is_graph_output():
            to_initializer(ctx, graph, out, array)
    graph.remove(node, safe=True)
    ctx.stats["constant.fold"] += 1
    return True


def _shared_weight(node: ir.Node) -> bool:
    """Whether an input above FOLD_LIMIT is also read elsewhere: a (Transpose, Cast...) of a
    shared weight would be a second copy of it, so it is not even read to find out."""
    for v in node.inputs:
        tensor = v.const_value if v is not None else None
        if tensor is not None and tensor.nbytes > FOLD_LIMIT and \
                any(use.node is not node for use in v.uses()):
            return True
    return False


def evaluate(ctx: Context, node: ir.Node, arrays: list) -> list[np.ndarray] | None:
    """The node's outputs on these input arrays, from our kernels; None when it fails."""
    from onnxkiln.eager import dispatch

    try:
        attrs = {name: _attr_value(a) for name, a in node.attributes.items()}
        outs = dispatch(node.op_type, arrays, attrs, domain=node.domain,
                        opset=ctx.opset(node.domain) or 1, n_outputs=len(node.outputs))
    except (SessionError, ValueError, TypeError, KeyError, IndexError, NotImplementedError,
            ArithmeticError) as e:
        logger.debug("not folding %s (%s): %s", node.name, node.op_type, e)
        return None
    result = []
    for o in outs:
        if not isinstance(o, np.ndarray | np.generic) or np.asarray(o).dtype.kind == "O":
            return None
        result.append(np.asarray(o))
    return result if len(result) == len(node.outputs) else None


def _attr_value(a: ir.Attr) -> Any:
    """An attribute as kernels receive it from the planner."""
    if a.type == ir.AttributeType.TENSOR:
        return a.value.numpy()
    if a.type == ir.AttributeType.TENSORS:
        return [t.numpy() for t in a.value]
    if a.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return list(a.value)
    return a.value


def _small_enough(node: ir.Node, arrays: list) -> bool:
    """Refuse before running ops whose result size explodes from small inputs."""
    est = _estimated_elements(node, arrays)
    if est is None:
        return True
    in_bytes = sum(a.nbytes for a in arrays if a is not None)
    return est * 8 <= FOLD_LIMIT or est * 8 <= 2 * in_bytes


def _estimated_elements(node: ir.Node, arrays: list) -> int | None:
    op = node.op_type if node.domain in ("", "ai.onnx") else ""
    try:
        if op == "ConstantOfShape":
            return math.prod(int(d) for d in arrays[0].reshape(-1))
        if op == "Expand":
            return math.prod(np.broadcast_shapes(arrays[0].shape,
                                                 tuple(int(d) for d in arrays[1])))
        if op == "Tile":
            return arrays[0].size * math.prod(int(r) for r in arrays[1].reshape(-1))
        if op == "Range":
            start, limit, delta = (float(a.reshape(())) for a in arrays[:3])
            return max(0, math.ceil((limit - start) / delta)) if delta else None
        if op == "OneHot":
            return arrays[0].size * int(abs(arrays[1].reshape(-1)[0]))
        if op in ("Resize", "Upsample", "Pad", "Col2Im", "EyeLike", "CenterCropPad"):
            return None if sum(a.nbytes for a in arrays if a is not None) < 4096 else 1 << 40
    except (ValueError, TypeError, OverflowError, IndexError, AttributeError):
        return 1 << 40
    return None


def _worth_folding(node: ir.Node, arrays: list, outputs: list[np.ndarray]) -> bool:
    """A result above FOLD_LIMIT must come from inputs only this node reads (which then die),
    at most twice their size: folding must not leave a second copy of a weight behind."""
    out_bytes = sum(o.nbytes for o in outputs)
    if out_bytes <= FOLD_LIMIT:
        return True
    freed = 0
    for v, a in zip(node.inputs, arrays):
        if v is None or a is None:
            continue
        if all(use.node is node for use in v.uses()) and not v.is_graph_output():
            freed += a.nbytes
    return out_bytes <= 2 * freed
