"""Basic-level clean-up passes: identity elimination, dead nodes, common subexpressions.

onnx_ir ships passes with these names; ours differ where it matters here. Identity
elimination also drops inference-mode Dropout, same-type Cast, identity Transpose and
one-input Concat/Sum/Max/Min/Mean, and
never renames a value that is itself a graph input/output or lives in an outer scope (onnx_ir's
renames the input of an Identity between two graph outputs and loses one output name). CSE
also skips Bernoulli and Dropout, runs in subgraphs, and merges equal small initializers
first so that nodes reading equal constants are seen as equal.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from onnxkiln.optimizer._graph import Context, attr, const_array, is_onnx

__all__ = ["eliminate_common_subexpressions", "eliminate_dead", "eliminate_identities"]

RANDOM_OPS = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
    "Multinomial", "Dropout", "Sampling",
})
PURE_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "onnxkiln"})
_DEDUP_LIMIT = 1024  # elements: larger initializers are never compared by content
_TENSOR_ATTR_LIMIT = 1024


def eliminate_identities(ctx: Context) -> bool:
    """Remove nodes that return their input unchanged; True when the graph changed."""
    changed = False
    for graph in ctx.graphs():
        for node in list(graph):
            if not _is_identity(node, ctx):
                continue
            if _bypass(node, graph) or _to_identity(ctx, node):
                ctx.stats["identity"] += 1
                changed = True
    return changed


def _to_identity(ctx: Context, node: ir.Node) -> bool:
    """A Dropout/Cast/Transpose that must stay (graph input to output) becomes an Identity."""
    if is_onnx(node, "Identity") or any(v.uses() or v.is_graph_output()
                                        for v in node.outputs[1:]):
        return False
    new = ctx.node("Identity", [node.inputs[0]], like=node.outputs[:1], name="Identity")
    ctx.replace(node, [new], [(node.outputs[0], new.outputs[0])], [node], "identity.kept")
    return True


def _is_identity(node: ir.Node, ctx: Context) -> bool:
    if not node.inputs or node.inputs[0] is None or any(a.is_ref() for a in
                                                        node.attributes.values()):
        return False
    x = node.inputs[0]
    if is_onnx(node, "Identity"):
        return len(node.outputs) == 1
    if is_onnx(node, "Dropout"):
        if len(node.outputs) > 1 and (node.outputs[1].uses() or
                                      node.outputs[1].is_graph_output()):
            return False
        opset = ctx.opset("") or 1
        if opset < 7:
            return bool(attr(node, "is_test", 0))
        if opset < 12:
            return True
        if len(node.inputs) < 3 or node.inputs[2] is None:
            return True
        training = const_array(node.inputs[2])
        return training is not None and training.size == 1 and not bool(training.reshape(()))
    if is_onnx(node, "Cast") and len(node.outputs) == 1:
        return x.dtype is not None and attr(node, "to", kind=ir.AttributeType.INT) == x.dtype.value
    if is_onnx(node, "CastLike") and len(node.inputs) == 2 and node.inputs[1] is not None:
        return x.dtype is not None and x.dtype == node.inputs[1].dtype
    if is_onnx(node, "Concat", "Sum", "Max", "Min", "Mean") and len(node.inputs) == 1:
        # one input: torch.onnx writes Concat(past) before Concat(., new) in KV caches
        return len(node.outputs) == 1 and _axis_in_range(node, x)
    if is_onnx(node, "Transpose"):
        perm = attr(node, "perm", kind=ir.AttributeType.INTS)
        return perm is not None and perm == list(range(len(perm))) and (
            x.shape is None or len(x.shape) == len(perm))
    return False


def _axis_in_range(node: ir.Node, x: ir.Value) -> bool:
    """A one-input Concat whose axis fits its input's known rank (else its error must stay)."""
    if not is_onnx(node, "Concat"):
        return True
    axis = attr(node, "axis", kind=ir.AttributeType.INT)
    return axis is not None and x.shape is not None and -len(x.shape) <= axis < len(x.shape)


def _bypass(node: ir.Node, graph: ir.Graph) -> bool:
    """Point the node's readers at its input and drop it; False when it must stay."""
    x, y = node.inputs[0], node.outputs[0]
    assert x is not None
    if any(v.uses() or v.is_graph_output() for v in node.outputs[1:]):
        return False
    if y.is_graph_output():
        own = x.producer() is not None and x.producer().graph is graph
        if not own or x.is_graph_output() or x.is_graph_input() or x.is_initializer():
            return False
        for i, out in enumerate(graph.outputs):
            if out is y:
                graph.outputs[i] = x
        name = y.name
        y.name = f"{name}__bypassed"
        x.name = name
        if x.shape is None:
            x.shape = y.shape
    y.replace_all_uses_with(x)
    graph.remove(node, safe=True)
    return True


def eliminate_dead(ctx: Context) -> bool:
    """Remove nodes and initializers nothing reads (graph outputs are always read)."""
    removed = _dead_in(ctx.model.graph)
    ctx.stats["dead"] += removed
    return removed > 0


def _dead_in(graph: ir.Graph) -> int:
    removed = 0
    for node in reversed(list(graph)):
        if not any(v.uses() or v.is_graph_output() for v in node.outputs):
            graph.remove(node, safe=True)
            removed += 1
            continue
        for a in node.attributes.values():
            if a.type == ir.AttributeType.GRAPH:
                removed += _dead_in(a.value)
            elif a.type == ir.AttributeType.GRAPHS:
                for g in a.value:
                    removed += _dead_in(g)
    for name, value in list(graph.initializers.items()):
        if not (value.uses() or value.is_graph_input() or value.is_graph_output()):
            del graph.initializers[name]
            removed += 1
    return removed


def eliminate_common_subexpressions(ctx: Context) -> bool:
    """Merge nodes with the same op, attributes and input values; True when any merged."""
    changed = _dedupe_initializers(ctx)
    for graph in ctx.graphs():
        # nodes by op and inputs; attributes are frozen only when two nodes share those
        seen: dict[tuple, list[list]] = {}
        merged: dict[ir.Value, ir.Value] = {}  # a merged node's output -> the kept one's
        dropped: list[ir.Node] = []
        for node in list(graph):
            head = _cse_head(node, merged)
            if head is None:
                continue
            group = seen.get(head)
            if group is None:
                seen[head] = [[_UNFROZEN, node]]
                continue
            attrs = _attr_key(node)
            if attrs is None:
                continue
            first = _same_attrs(group, attrs)
            if first is None:
                group.append([attrs, node])
                continue
            if any(v.is_graph_output() for v in node.outputs):
                continue
            merged.update(zip(node.outputs, first.outputs))
            dropped.append(node)
            ctx.stats["cse"] += 1
            changed = True
        _replace_uses(merged)
        for node in dropped:
            graph.remove(node, safe=True)
    return changed


def _replace_uses(merged: dict[ir.Value, ir.Value]) -> None:
    """Point every use of each key of `merged` at its value, rebuilding each user's inputs
    once: `replace_input_with` rebuilds them per call, quadratic for a Sum of 100,000 merged
    inputs (the usage bookkeeping is onnx_ir's own, as that method does it)."""
    users = {use.node: None for old in merged for use in old.uses()}
    for node in users:
        inputs = node.inputs
        new = tuple(merged.get(v, v) if v is not None else None for v in inputs)
        for i, (a, b) in enumerate(zip(inputs, new)):
            if a is not b:
                a._remove_usage(node, i)
                b._add_usage(node, i)
        node._inputs = new


_UNFROZEN: Any = object()


def _same_attrs(group: list[list], attrs: tuple) -> ir.Node | None:
    """The first node of the group whose frozen attributes equal `attrs` (freezing those
    not frozen yet)."""
    for entry in group:
        if entry[0] is _UNFROZEN:
            entry[0] = _attr_key(entry[1])
        if entry[0] is not None and entry[0] == attrs:
            return entry[1]
    return None


def _cse_head(node: ir.Node, merged: dict[ir.Value, ir.Value]) -> tuple | None:
    """What two mergeable nodes share besides attributes (inputs seen through the merges
    made so far); None for nodes never merged."""
    if node.domain not in PURE_DOMAINS or (is_onnx(node, *RANDOM_OPS)):
        return None
    return (node.domain, node.op_type, node.overload, len(node.outputs),
            tuple(id(merged.get(v, v)) if v is not None else None for v in node.inputs))


def _attr_key(node: ir.Node) -> tuple | None:
    """The node's attributes frozen for comparison; None when one cannot be (subgraphs,
    references)."""
    attrs = []
    for name, a in sorted(node.attributes.items()):
        frozen = _freeze_attr(a)
        if frozen is None:
            return None
        attrs.append((name, frozen))
    return tuple(attrs)


def _freeze_attr(a: ir.Attr) -> Any:
    if a.is_ref() or a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        return None
    if a.type == ir.AttributeType.TENSOR:
        t = a.value
        if t.size > _TENSOR_ATTR_LIMIT:
            return ("tensor-id", id(t))
        arr = t.numpy()
        return (arr.dtype.str, arr.shape, arr.tobytes())
    if a.type == ir.AttributeType.TENSORS:
        return ("tensors-id", id(a.value))
    if a.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return (a.type.value, tuple(a.value))
    if a.type in (ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING):
        return (a.type.value, a.value)
    return ("other-id", id(a.value))


def _dedupe_initializers(ctx: Context) -> bool:
    """Make readers of equal small initializers read one of them."""
    changed = False
    for graph in ctx.graphs():
        first: dict[tuple, ir.Value] = {}
        for value in list(graph.initializers.values()):
            tensor = value.const_value
            if (tensor is None or value.is_graph_input() or value.is_graph_output()
                    or tensor.size > _DEDUP_LIMIT):
                continue
            try:
                arr = tensor.numpy()
            except Exception:
                continue
            if arr.dtype.kind == "O":
                continue
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            keep = first.setdefault(key, value)
            if keep is value or not value.uses():
                continue
            value.replace_all_uses_with(keep)
            ctx.stats["cse.initializer"] += 1
            changed = True
    return changed
