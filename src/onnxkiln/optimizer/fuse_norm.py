"""Normalization fusions (extended level).

- LayerNorm written out: d = x - ReduceMean(x); d / Sqrt(ReduceMean(d^2) + eps) * gamma + beta
  (Pow(d, 2) or d * d; Div or Mul by Reciprocal) -> LayerNormalization(axis=-1);
- RMSNorm written out: x / Sqrt(ReduceMean(x^2) + eps) * gamma -> RMSNormalization (opset
  >= 23) or SimplifiedLayerNormalization (ai.onnx domain, as onnxruntime registers it);
- Add(a, b) [+ bias] -> LayerNormalization over the last axis -> com.microsoft
  SkipLayerNormalization, whose 4th output carries the sum when something else reads it.

Reductions must be over exactly the last axis (axes [-1] or [rank-1], keepdims=1), gamma and
beta constant 1-D vectors of the last dim's size.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxkiln.optimizer._graph import (
    MS,
    Context,
    attr,
    close,
    const_array,
    const_scalar,
    const_shape,
    consumers,
    float_dtype,
    is_onnx,
    nodes_of,
    other_input,
    producer,
    rank,
    same_dims,
    sole_consumer,
)

__all__ = ["fuse_layer_norm", "fuse_rms_norm", "fuse_skip_layer_norm"]

_FLOATS = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


def _last_axis_mean(node: ir.Node | None, x: ir.Value, ctx: Context) -> bool:
    """Whether node is ReduceMean(x) over exactly the last axis with keepdims."""
    if node is None or not is_onnx(node, "ReduceMean") or node.inputs[0] is not x:
        return False
    if attr(node, "keepdims", 1) != 1 or attr(node, "noop_with_empty_axes", 0):
        return False
    if (ctx.opset("") or 1) >= 18:
        axes = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        axes = None if axes is None else [int(a) for a in axes.reshape(-1)]
    else:
        axes = attr(node, "axes", kind=ir.AttributeType.INTS)
    r = rank(x)
    return axes is not None and len(axes) == 1 and r is not None and axes[0] in (-1, r - 1)


def _square_of(value: ir.Value, x: ir.Value) -> ir.Node | None:
    node = producer(value, "Pow", "Mul")
    if node is None or len(consumers(value)) != 1 or value.is_graph_output():
        return None
    if node.op_type == "Pow":
        ok = node.inputs[0] is x and close(const_scalar(node.inputs[1]), 2.0)
    else:
        ok = node.inputs[0] is x and node.inputs[1] is x
    return node if ok else None


def _rsqrt_chain(mean_sq: ir.Node) -> tuple[float, ir.Node, ir.Node] | None:
    """mean_sq -> Add(eps) -> Sqrt: (eps, add, sqrt), each read once."""
    add = sole_consumer(mean_sq.outputs[0], "Add")
    if add is None:
        return None
    eps = const_scalar(other_input(add, mean_sq.outputs[0]))
    sqrt = sole_consumer(add.outputs[0], "Sqrt")
    if eps is None or eps < 0 or sqrt is None:
        return None
    return eps, add, sqrt


def _normalized(num: ir.Value, sqrt: ir.Node) -> tuple[ir.Node, list[ir.Node]] | None:
    """num / sqrt, as Div(num, sqrt) or Mul(num, Reciprocal(sqrt))."""
    user = sole_consumer(sqrt.outputs[0], "Div", "Reciprocal")
    if user is None:
        return None
    if user.op_type == "Div":
        return (user, [user]) if list(user.inputs) == [num, sqrt.outputs[0]] else None
    mul = sole_consumer(user.outputs[0], "Mul")
    if mul is None or other_input(mul, user.outputs[0]) is not num:
        return None
    return mul, [user, mul]


def _affine(value: ir.Value, op: str, size) -> tuple[ir.Node, ir.Value] | None:
    """value op const-vector (Mul by gamma / Add beta) read once: (node, vector value)."""
    node = sole_consumer(value, op)
    if node is None:
        return None
    vec = other_input(node, value)
    if not isinstance(size, int) or const_shape(vec) != (size,):
        return None
    return node, vec


def fuse_layer_norm(ctx: Context) -> bool:
    """Decomposed LayerNorm over the last axis -> LayerNormalization."""
    if not ctx.supports("", "LayerNormalization"):
        return False
    changed = False
    for node in nodes_of(ctx.model.graph, "Sub"):
        if node.graph is not None and is_onnx(node, "Sub"):
            changed |= _layer_norm_at(ctx, node)
    return changed


def _layer_norm_at(ctx: Context, sub: ir.Node) -> bool:
    x, mean_v = sub.inputs
    if x is None or not float_dtype(x, *_FLOATS) or x.shape is None:
        return False
    mean = producer(mean_v)
    if not _last_axis_mean(mean, x, ctx) or len(consumers(mean_v)) != 1:
        return False
    d = sub.outputs[0]
    if d.is_graph_output() or len(consumers(d)) != 2:
        return False
    sq = next((_square_of(u.outputs[0], d) for u in consumers(d)
               if is_onnx(u, "Pow", "Mul")), None)
    var = sole_consumer(sq.outputs[0], "ReduceMean") if sq is not None else None
    if var is None or not _last_axis_mean(var, sq.outputs[0], ctx):
        return False
    chain = _rsqrt_chain(var)
    if chain is None:
        return False
    eps, add, sqrt = chain
    norm = _normalized(d, sqrt)
    if norm is None:
        return False
    last, div_nodes = norm
    size = x.shape[-1]
    scale = _affine(last.outputs[0], "Mul", size)
    if scale is None:
        return False
    mul, gamma = scale
    shift = _affine(mul.outputs[0], "Add", size)
    end, beta = shift if shift is not None else (mul, None)
    ln = ctx.node("LayerNormalization", [x, gamma, beta], {"axis": -1, "epsilon": eps},
                  like=end.outputs, name="LayerNorm")
    ctx.replace(end, [ln], [(end.outputs[0], ln.outputs[0])],
                [end, mul, *div_nodes, sqrt, add, var, sq, sub, mean], "layernorm")
    return True


def fuse_rms_norm(ctx: Context) -> bool:
    """Decomposed RMSNorm over the last axis -> RMSNormalization / SimplifiedLayerNorm."""
    opset = ctx.opset("") or 1
    op = "RMSNormalization" if opset >= 23 else "SimplifiedLayerNormalization"
    if not ctx.supports("", op):
        return False
    changed = False
    for node in nodes_of(ctx.model.graph, "ReduceMean"):
        if node.graph is not None and is_onnx(node, "ReduceMean"):
            changed |= _rms_norm_at(ctx, node, op)
    return changed


def _rms_norm_at(ctx: Context, var: ir.Node, op: str) -> bool:
    sq = producer(var.inputs[0], "Pow", "Mul")
    if sq is None:
        return False
    x = sq.inputs[0]
    if x is None or not float_dtype(x, *_FLOATS) or x.shape is None or \
            _square_of(sq.outputs[0], x) is None or not _last_axis_mean(var, sq.outputs[0], ctx):
        return False
    if producer(x, "Sub") is not None and _last_axis_mean(producer(producer(x).inputs[1]),
                                                          producer(x).inputs[0], ctx):
        return False  # a centred input: this is LayerNorm's variance, not RMSNorm
    chain = _rsqrt_chain(var)
    if chain is None:
        return False
    eps, add, sqrt = chain
    norm = _normalized(x, sqrt)
    if norm is None:
        return False
    last, div_nodes = norm
    scale = _affine(last.outputs[0], "Mul", x.shape[-1])
    if scale is None:
        return False
    mul, gamma = scale
    node = ctx.node(op, [x, gamma], {"axis": -1, "epsilon": eps}, like=mul.outputs,
                    name="RMSNorm")
    ctx.replace(mul, [node], [(mul.outputs[0], node.outputs[0])],
                [mul, *div_nodes, sqrt, add, var, sq], "rmsnorm")
    return True


def fuse_skip_layer_norm(ctx: Context) -> bool:
    """LayerNormalization(Add(a, b) [+ bias]) over the last axis -> SkipLayerNormalization."""
    if not ctx.supports(MS, "SkipLayerNormalization"):
        return False
    changed = False
    for node in nodes_of(ctx.model.graph, "LayerNormalization"):
        if node.graph is not None and is_onnx(node, "LayerNormalization"):
            changed |= _skip_at(ctx, node)
    return changed


def _skip_at(ctx: Context, ln: ir.Node) -> bool:
    s = ln.inputs[0]
    add = producer(s, "Add")
    if add is None or any(o.uses() or o.is_graph_output() for o in ln.outputs[1:]):
        return False
    if attr(ln, "axis", -1) not in (-1, (rank(s) or 0) - 1) or rank(s) != 3:
        return False
    if attr(ln, "stash_type", 1) != 1 or not float_dtype(s, *_FLOATS) or s.shape is None:
        return False
    size = s.shape[-1]
    gamma, beta = ln.inputs[1], ln.inputs[2] if len(ln.inputs) > 2 else None
    for v in (gamma, beta):
        if v is not None and const_shape(v) != (size,):
            return False
    a, b = add.inputs
    if not (same_dims(a, s) and same_dims(b, s)):
        return False
    remove = [add]
    bias = None
    for i, side in enumerate((a, b)):  # fold a bias Add on one side into the node's bias
        inner = producer(side, "Add")
        if inner is None or len(consumers(side)) != 1 or side.is_graph_output():
            continue
        for x, vec in ((inner.inputs[0], inner.inputs[1]), (inner.inputs[1], inner.inputs[0])):
            if const_shape(vec) == (size,) and same_dims(x, s) and \
                    vec.dtype == s.dtype:
                a, b = (x, b) if i == 0 else (a, x)
                bias = vec
                remove.append(inner)
                break
        if bias is not None:
            break
    keep_sum = len(consumers(s)) > 1 or s.is_graph_output()
    inputs = [a, b, gamma, beta, bias]
    while inputs and inputs[-1] is None:
        inputs.pop()
    eps = attr(ln, "epsilon", 1e-5)
    if eps is None:
        return False
    attrs = {"epsilon": float(eps)}
    node = ctx.node("SkipLayerNormalization", inputs, attrs, domain=MS,
                    like=[ln.outputs[0], s, s, s] if keep_sum else [ln.outputs[0]],
                    num_outputs=4 if keep_sum else 1, name="SkipLayerNorm")
    if keep_sum:
        for o in node.outputs[1:3]:
            o.name = ""
            o.type = None
            o.shape = None
    mapping = [(ln.outputs[0], node.outputs[0])]
    if keep_sum:
        mapping.append((s, node.outputs[3]))
    ctx.replace(ln, [node], mapping, [ln, *remove], "layernorm.skip")
    return True
