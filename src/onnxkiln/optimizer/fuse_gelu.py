"""GELU fusions (extended level).

- exact GELU as exporters write it, 0.5 * x * (1 + erf(x / sqrt 2)) in any of its Mul orders,
  with Div by sqrt 2 or Mul by 1/sqrt 2 -> com.microsoft Gelu;
- tanh GELU (GPT-2's gelu_new), 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),
  x^3 as Pow(x, 3) or x * x * x -> com.microsoft FastGelu;
- Add(x, bias) feeding either (bias a 1-D constant over the last axis) -> BiasGelu /
  FastGelu with its bias input;
- Mul(x, Sigmoid(x)) (SiLU) -> onnxkiln Silu.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from onnxkiln.optimizer._graph import (
    MS,
    OURS,
    Context,
    close,
    const_scalar,
    const_shape,
    consumers,
    float_dtype,
    is_onnx,
    nodes_of,
    other_input,
    producer,
    rank,
    sole_consumer,
)

__all__ = ["fuse_bias_gelu", "fuse_gelu", "fuse_silu"]

_SQRT2 = math.sqrt(2.0)
_K = math.sqrt(2.0 / math.pi)
_FLOATS = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)


def fuse_gelu(ctx: Context) -> bool:
    """Replace erf/tanh GELU subgraphs by one com.microsoft Gelu / FastGelu node."""
    changed = False
    for node in nodes_of(ctx.model.graph, "Erf", "Tanh"):
        if node.graph is None:
            continue
        if is_onnx(node, "Erf") and ctx.supports(MS, "Gelu"):
            changed |= _erf_gelu(ctx, node)
        elif is_onnx(node, "Tanh") and ctx.supports(MS, "FastGelu"):
            changed |= _tanh_gelu(ctx, node)
    return changed


def _scaled_by(value: ir.Value, factor: float) -> tuple[ir.Value, ir.Node] | None:
    """(x, node) when value = x * factor, as Mul(x, c) or Div(x, 1/c)."""
    node = producer(value, "Mul", "Div")
    if node is None or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if node.op_type == "Div":
        return (a, node) if close(const_scalar(b), 1.0 / factor) else None
    if close(const_scalar(b), factor):
        return a, node
    if close(const_scalar(a), factor):
        return b, node
    return None


def _half_product(tail: ir.Value, x: ir.Value) -> tuple[ir.Node, list[ir.Node]] | None:
    """Match 0.5 * x * tail in its three export orders; returns (last node, its Mul nodes)."""
    m1 = sole_consumer(tail, "Mul")
    if m1 is None:
        return None
    other = other_input(m1, tail)
    if other is x:  # (x * tail) * 0.5
        m2 = sole_consumer(m1.outputs[0], "Mul")
        if m2 is not None and close(const_scalar(other_input(m2, m1.outputs[0])), 0.5):
            return m2, [m1, m2]
        return None
    if other is not None and close(const_scalar(other), 0.5):  # x * (tail * 0.5)
        m2 = sole_consumer(m1.outputs[0], "Mul")
        if m2 is not None and other_input(m2, m1.outputs[0]) is x:
            return m2, [m1, m2]
        return None
    half = producer(other, "Mul")  # (x * 0.5) * tail
    if half is not None and len(consumers(half.outputs[0])) == 1 and \
            not half.outputs[0].is_graph_output():
        h_other = other_input(half, x)
        if h_other is not None and close(const_scalar(h_other), 0.5):
            return m1, [half, m1]
    return None


def _plus_one(value: ir.Value) -> ir.Node | None:
    add = sole_consumer(value, "Add")
    if add is None or not close(const_scalar(other_input(add, value)), 1.0):
        return None
    return add


def _erf_gelu(ctx: Context, erf: ir.Node) -> bool:
    scaled = _scaled_by(erf.inputs[0], 1.0 / _SQRT2)
    if scaled is None:
        return False
    x, div = scaled
    if not float_dtype(x, *_FLOATS) or len(consumers(div.outputs[0])) != 1 or \
            div.outputs[0].is_graph_output():
        return False
    add = _plus_one(erf.outputs[0])
    if add is None:
        return False
    found = _half_product(add.outputs[0], x)
    if found is None:
        return False
    last, muls = found
    gelu = ctx.node("Gelu", [x], domain=MS, like=last.outputs, name="Gelu")
    ctx.replace(last, [gelu], [(last.outputs[0], gelu.outputs[0])], [*muls, add, erf, div],
                "gelu.erf")
    return True


def _cube(value: ir.Value, x: ir.Value) -> list[ir.Node] | None:
    """The nodes computing value = x^3 (Pow(x, 3) or x * x * x), each read only once."""
    node = producer(value, "Pow", "Mul")
    if node is None or len(consumers(value)) != 1 or value.is_graph_output():
        return None
    if node.op_type == "Pow":
        return [node] if node.inputs[0] is x and close(const_scalar(node.inputs[1]), 3.0) \
            else None
    a, b = node.inputs
    sq, lone = (a, b) if b is x else (b, a)
    if lone is not x:
        return None
    sq_node = producer(sq, "Mul")
    if sq_node is None or list(sq_node.inputs) != [x, x] or len(consumers(sq)) != 1:
        return None
    return [node, sq_node]


def _tanh_gelu(ctx: Context, tanh: ir.Node) -> bool:
    scaled = _scaled_by(tanh.inputs[0], _K)
    if scaled is None:
        return False
    inner, k_node = scaled
    add = producer(inner, "Add")
    if add is None or len(consumers(inner)) != 1 or len(consumers(k_node.outputs[0])) != 1:
        return False
    for x, cubic in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        c = _scaled_by(cubic, 0.044715) if cubic is not None else None
        if c is None or x is None or not float_dtype(x, *_FLOATS):
            continue
        cube_value, c_node = c
        cube = _cube(cube_value, x)
        if cube is None or len(consumers(cubic)) != 1:
            continue
        one = _plus_one(tanh.outputs[0])
        found = _half_product(one.outputs[0], x) if one is not None else None
        if found is None:
            return False
        last, muls = found
        fast = ctx.node("FastGelu", [x], domain=MS, like=last.outputs, name="FastGelu")
        ctx.replace(last, [fast], [(last.outputs[0], fast.outputs[0])],
                    [*muls, one, tanh, k_node, add, c_node, *cube], "gelu.tanh")
        return True
    return False


def fuse_bias_gelu(ctx: Context) -> bool:
    """Add(x, bias) -> Gelu/FastGelu becomes BiasGelu(x, bias) / FastGelu(x, bias)."""
    changed = False
    for node in nodes_of(ctx.model.graph, "Gelu", "FastGelu"):
        if node.graph is None or node.domain != MS or len(node.inputs) != 1 or \
                len(node.outputs) != 1:
            continue
        target = {"Gelu": "BiasGelu", "FastGelu": "FastGelu"}.get(node.op_type)
        if target is None or not ctx.supports(MS, target):
            continue
        add = producer(node.inputs[0], "Add")
        if add is None or len(consumers(add.outputs[0])) != 1 or \
                add.outputs[0].is_graph_output():
            continue
        split = _bias_split(add)
        if split is None:
            continue
        x, bias = split
        fused = ctx.node(target, [x, bias], domain=MS, like=node.outputs, name=target)
        ctx.replace(node, [fused], [(node.outputs[0], fused.outputs[0])], [node, add],
                    "gelu.bias")
        changed = True
    return changed


def _bias_split(add: ir.Node) -> tuple[ir.Value, ir.Value] | None:
    """(x, bias) for Add(x, bias) with bias a constant 1-D vector as long as x's last dim,
    x of known rank >= 1 and the same element type (the sum then has x's shape)."""
    for x, bias in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        b = const_shape(bias)
        if x is None or b is None or len(b) != 1 or x.shape is None or (rank(x) or 0) < 1:
            continue
        last = x.shape[-1]
        if isinstance(last, int) and last == b[0] and x.dtype == bias.dtype:
            return x, bias
    return None


def fuse_silu(ctx: Context) -> bool:
    """Mul(x, Sigmoid(x)) (SiLU/Swish as exporters write it, EfficientNet's activation) ->
    onnxkiln Silu: one pass instead of the sigmoid's passes and the product's."""
    if not ctx.supports(OURS, "Silu"):
        return False
    changed = False
    for sig in nodes_of(ctx.model.graph, "Sigmoid"):
        if sig.graph is None or not is_onnx(sig, "Sigmoid") or not float_dtype(sig.inputs[0],
                                                                                 *_FLOATS):
            continue
        x, s = sig.inputs[0], sig.outputs[0]
        mul = sole_consumer(s, "Mul")
        if mul is None or s.is_graph_output() or other_input(mul, s) is not x:
            continue
        silu = ctx.node("Silu", [x], domain=OURS, like=mul.outputs, name="Silu")
        ctx.replace(mul, [silu], [(mul.outputs[0], silu.outputs[0])], [mul, sig], "silu")
        changed = True
    return changed
