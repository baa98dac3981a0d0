"""Attention fusion (extended level).

    MatMul(Q, K') [-> Div/Mul by a scalar] [-> Add(mask) | Where(cond, ., fill)]
        -> Softmax(last axis) -> MatMul(., V)

becomes one onnxkiln ScaledDotProductAttention(Q, K, V[, mask]), K' being either K itself
or Transpose(K) swapping its last two dims (then absorbed). Every intermediate must be read
only by the next node of the pattern; float32/float64 only. The kernel repeats the same
operations in the same order, so results match the unfused graph to rounding.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxkiln.optimizer._graph import (
    OURS,
    Context,
    attr,
    const_array,
    float_dtype,
    is_const,
    is_onnx,
    nodes_of,
    other_input,
    producer,
    rank,
    sole_consumer,
)

__all__ = ["fuse_attention"]

_FLOATS = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


def fuse_attention(ctx: Context) -> bool:
    """Fuse every softmax(QK^T)V chain into ScaledDotProductAttention."""
    if not ctx.supports(OURS, "ScaledDotProductAttention"):
        return False
    changed = False
    for node in nodes_of(ctx.model.graph, "Softmax"):
        if node.graph is not None and is_onnx(node, "Softmax"):
            changed |= _fuse_at(ctx, node)
    return changed


def _private_producer(value: ir.Value | None, *ops: str) -> ir.Node | None:
    node = producer(value, *ops)
    if node is None or value is None or sole_consumer(value) is None:
        return None
    return node


def _last_axis(softmax: ir.Node, ctx: Context) -> bool:
    r = rank(softmax.inputs[0])
    axis = attr(softmax, "axis", -1 if (ctx.opset("") or 1) >= 13 else 1)
    return axis == -1 or (r is not None and axis == r - 1)


def _mask_options(value: ir.Value) -> list[tuple[ir.Value, dict, ir.Node | None]]:
    """Ways to read value as mask(scores): (scores, mask attributes, mask node); the last
    option is always "no mask"."""
    options: list[tuple[ir.Value, dict, ir.Node | None]] = []
    node = _private_producer(value, "Add", "Where")
    if node is not None and node.op_type == "Add":
        a, b = node.inputs
        for scores, mask in ((a, b), (b, a)):
            if scores is not None and mask is not None and mask.dtype == scores.dtype:
                options.append((scores, {"mask_mode": "add", "_mask": mask}, node))
    elif node is not None:
        cond, x, y = node.inputs
        for scores, fill, mode in ((x, y, "keep_true"), (y, x, "keep_false")):
            f = const_array(fill)
            if f is not None and f.size == 1 and cond is not None and scores is not None \
                    and cond.dtype == ir.DataType.BOOL and fill.dtype == scores.dtype:
                options.append((scores, {"mask_mode": mode, "mask_fill": float(f.reshape(())),
                                         "_mask": cond}, node))
    options.append((value, {}, None))
    return options


def _fuse_at(ctx: Context, softmax: ir.Node) -> bool:
    probs = softmax.outputs[0]
    if not _last_axis(softmax, ctx) or not float_dtype(probs, *_FLOATS):
        return False
    out_mm = sole_consumer(probs, "MatMul")
    if out_mm is None or out_mm.inputs[0] is not probs or out_mm.inputs[1] is probs:
        return False
    for scores, attrs, mask_node in _mask_options(softmax.inputs[0]):
        if mask_node is not None and sole_consumer(scores) is not mask_node:
            continue
        found = _scores(scores, dict(attrs))
        if found is None:
            continue
        attrs, q, k, chain = found
        v = out_mm.inputs[1]
        mask = attrs.pop("_mask", None)
        inputs = [q, k, v] + ([mask] if mask is not None else [])
        node = ctx.node("ScaledDotProductAttention", inputs, attrs, domain=OURS,
                        like=out_mm.outputs, name="Attention")
        remove = [out_mm, softmax, *([mask_node] if mask_node else []), *chain]
        ctx.replace(out_mm, [node], [(out_mm.outputs[0], node.outputs[0])], remove,
                    "attention")
        return True
    return False


def _scores(scores: ir.Value, attrs: dict) -> tuple[dict, ir.Value, ir.Value, list] | None:
    """scores = [scale](Q @ K'): (attributes, Q, K, the nodes matched)."""
    chain: list[ir.Node] = []
    qk = scores
    scale_node = _private_producer(scores, "Div", "Mul")
    if scale_node is not None:
        a, b = scale_node.inputs
        if scale_node.op_type == "Div":
            c, qk = const_array(b), a
            attrs["divide"] = 1
        else:
            qk = a if is_const(b) else b
            c = const_array(other_input(scale_node, qk))
        if c is None or c.size != 1 or c.dtype.kind != "f" or c.ndim > (rank(qk) or 0):
            return None
        attrs["scale"] = float(c.reshape(()))
        chain.append(scale_node)
    mm = _private_producer(qk, "MatMul")
    if mm is None or (rank(mm.inputs[0]) or 0) < 2 or (rank(mm.inputs[1]) or 0) < 2:
        return None
    chain.append(mm)
    q, k = mm.inputs
    t = _private_producer(k, "Transpose")
    perm = attr(t, "perm", kind=ir.AttributeType.INTS) if t is not None else None
    n = len(perm) if perm is not None else 0
    if t is not None and n >= 2 and perm == [*range(n - 2), n - 1, n - 2]:
        k = t.inputs[0]
        attrs["transpose_k"] = 1
        chain.append(t)
    else:
        attrs["transpose_k"] = 0
    return attrs, q, k, chain
