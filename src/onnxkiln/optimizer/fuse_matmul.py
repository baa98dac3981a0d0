"""MatMul/Gemm fusions (extended level).

- MatMul followed by Mul/Div by a scalar constant -> com.microsoft FusedMatMul(alpha);
- Transpose swapping the last two dims feeding a MatMul -> FusedMatMul(transA/transB);
- MatMul(A 2-D, B) + Add(C) -> Gemm; MatMul(A N-D, B 2-D constant) + Add(1-D constant bias),
  optionally followed by Relu, or by com.microsoft BiasGelu/FastGelu holding the bias ->
  onnxkiln FusedMatMulBias(activation);
- Gemm -> Relu/Sigmoid/Tanh/LeakyRelu/HardSigmoid/Elu -> com.microsoft FusedGemm.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxkiln.optimizer._graph import (
    MS,
    OURS,
    Context,
    attr,
    const_array,
    const_scalar,
    const_shape,
    float_dtype,
    is_onnx,
    nodes_of,
    other_input,
    producer,
    rank,
    sole_consumer,
    static_shape,
)

__all__ = ["fuse_gemm_activation", "fuse_matmul_add", "fuse_matmul_scale",
           "fuse_matmul_transpose"]

_FLOATS = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


def _is_fused_matmul(node: ir.Node) -> bool:
    return node.domain == MS and node.op_type == "FusedMatMul" and len(node.inputs) == 2 and \
        len(node.outputs) == 1


def _matmul_like(node: ir.Node) -> bool:
    return is_onnx(node, "MatMul") or _is_fused_matmul(node)


def _fused_attrs(node: ir.Node) -> dict | None:
    """FusedMatMul's attributes with defaults (plain MatMul: all defaults); None if malformed."""
    keys = ("alpha", "transA", "transB", "transBatchA", "transBatchB")
    defaults = (1.0, 0, 0, 0, 0)
    found = {k: attr(node, k, d) for k, d in zip(keys, defaults)}
    return None if None in found.values() else found


def _emit(ctx: Context, node: ir.Node, a: ir.Value, b: ir.Value, attrs: dict,
          anchor: ir.Node, remove: list[ir.Node], stat: str) -> None:
    out = anchor.outputs[0]
    attrs = {k: (float(v) if k == "alpha" else int(v)) for k, v in attrs.items()
             if v != (1.0 if k == "alpha" else 0)}
    fused = ctx.node("FusedMatMul", [a, b], attrs, domain=MS, like=[out],
                     name="FusedMatMul")
    ctx.replace(anchor, [fused], [(out, fused.outputs[0])], remove, stat)


def fuse_matmul_scale(ctx: Context) -> bool:
    """MatMul then Mul/Div by a scalar constant -> FusedMatMul with alpha."""
    if not ctx.supports(MS, "FusedMatMul"):
        return False
    changed = False
    for node in nodes_of(ctx.model.graph, "MatMul", "FusedMatMul"):
        if node.graph is None or not _matmul_like(node) or not float_dtype(node.outputs[0]):
            continue
        y = node.outputs[0]
        user = sole_consumer(y, "Mul", "Div")
        r = rank(y)
        if user is None or r is None:
            continue
        other = other_input(user, y)
        c = const_scalar(other)
        arr = const_array(other)
        if c is None or arr.ndim > r or other.dtype != y.dtype or c == 0.0:
            continue
        if user.op_type == "Div" and user.inputs[0] is not y:
            continue
        attrs = _fused_attrs(node)
        if attrs is None:
            continue
        attrs["alpha"] = attrs["alpha"] * (1.0 / c if user.op_type == "Div" else c)
        _emit(ctx, node, node.inputs[0], node.inputs[1], attrs, user, [user, node],
              "matmul.scale")
        changed = True
    return changed


def _swap_last_two(node: ir.Node | None) -> bool:
    if node is None or not is_onnx(node, "Transpose"):
        return False
    perm = attr(node, "perm", kind=ir.AttributeType.INTS)
    n = len(perm) if perm is not None else 0
    return n >= 2 and perm == [*range(n - 2), n - 1, n - 2]


def fuse_matmul_transpose(ctx: Context) -> bool:
    """Transpose of the last two dims into MatMul/FusedMatMul as transA/transB."""
    if not ctx.supports(MS, "FusedMatMul"):
        return False
    changed = False
    for node in nodes_of(ctx.model.graph, "MatMul", "FusedMatMul"):
        if node.graph is None or not _matmul_like(node) or not float_dtype(node.outputs[0]):
            continue
        attrs = _fused_attrs(node)
        if attrs is None or attrs["transBatchA"] or attrs["transBatchB"]:
            continue
        inputs = list(node.inputs)
        remove = [node]
        for i, key in ((0, "transA"), (1, "transB")):
            t = producer(inputs[i], "Transpose")
            if _swap_last_two(t) and sole_consumer(inputs[i]) is node and \
                    node.inputs[0] is not node.inputs[1]:
                inputs[i] = t.inputs[0]
                attrs[key] = 1 - int(attrs[key])
                remove.append(t)
        if len(remove) == 1:
            continue
        _emit(ctx, node, inputs[0], inputs[1], attrs, node, remove, "matmul.transpose")
        changed = True
    return changed


def fuse_matmul_add(ctx: Context) -> bool:
    """MatMul + bias Add -> Gemm (2-D A) or onnxkiln FusedMatMulBias (N-D A, 2-D B)."""
    changed = False
    for node in nodes_of(ctx.model.graph, "MatMul"):
        if node.graph is None or not is_onnx(node, "MatMul"):
            continue
        a, b = node.inputs
        y = node.outputs[0]
        if not float_dtype(y, *_FLOATS) or a is None or b is None:
            continue
        user = sole_consumer(y)
        if user is None:
            continue
        if is_onnx(user, "Add"):
            changed |= _matmul_add(ctx, node, user)
        elif user.domain == MS and user.op_type in ("BiasGelu", "FastGelu") and \
                len(user.inputs) == 2 and len(user.outputs) == 1 and user.inputs[0] is y:
            changed |= _matmul_bias_act(ctx, node, user, user.inputs[1],
                                        "Gelu" if user.op_type == "BiasGelu" else "FastGelu",
                                        [user, node])
    return changed


def _matmul_add(ctx: Context, mm: ir.Node, add: ir.Node) -> bool:
    a, b = mm.inputs
    y = mm.outputs[0]
    c = other_input(add, y)
    cshape = const_shape(c)
    if c is None or cshape is None or c.dtype != y.dtype:
        return False
    bshape = static_shape(b)
    if rank(a) == 2 and bshape is not None and len(bshape) == 2 and ctx.supports("", "Gemm"):
        m = static_shape(a)[0] if static_shape(a) is not None else None
        n = bshape[1]
        if cshape in ((n,), (1, n), ()) or (m is not None and cshape in ((m, n),
                                                                                  (m, 1))):
            gemm = ctx.node("Gemm", [a, b, c], like=add.outputs, name="Gemm")
            ctx.replace(add, [gemm], [(add.outputs[0], gemm.outputs[0])], [add, mm],
                        "matmul.add.gemm")
            return True
        return False
    if (rank(a) or 0) < 3 or const_shape(b) is None or bshape is None or len(bshape) != 2:
        return False
    if cshape != (bshape[1],):
        return False
    act = sole_consumer(add.outputs[0], "Relu")
    if act is not None:
        return _matmul_bias_act(ctx, mm, act, c, "Relu", [act, add, mm])
    return _matmul_bias_act(ctx, mm, add, c, "", [add, mm])


def _matmul_bias_act(ctx: Context, mm: ir.Node, anchor: ir.Node, bias: ir.Value, act: str,
                     remove: list[ir.Node]) -> bool:
    a, b = mm.inputs
    bshape, cshape = const_shape(b), const_shape(bias)
    if not ctx.supports(OURS, "FusedMatMulBias") or bshape is None or len(bshape) != 2 or \
            cshape != (bshape[1],) or (rank(a) or 0) < 2 or bias.dtype != mm.outputs[0].dtype:
        return False
    out = anchor.outputs[0]
    fused = ctx.node("FusedMatMulBias", [a, b, bias], {"activation": act} if act else None,
                     domain=OURS, like=[out], name="FusedMatMulBias")
    ctx.replace(anchor, [fused], [(out, fused.outputs[0])], remove, "matmul.bias")
    return True


_GEMM_ACTS = {
    "Relu": (), "Sigmoid": (), "Tanh": (),
    "LeakyRelu": (("alpha", "activation_alpha", 0.01),),
    "Elu": (("alpha", "activation_alpha", 1.0),),
    "HardSigmoid": (("alpha", "activation_alpha", 0.2), ("beta", "activation_beta", 0.5)),
}


def fuse_gemm_activation(ctx: Context) -> bool:
    """Gemm followed by an elementwise activation -> com.microsoft FusedGemm."""
    if not ctx.supports(MS, "FusedGemm"):
        return False
    changed = False
    for gemm in nodes_of(ctx.model.graph, "Gemm"):
        if gemm.graph is None or not is_onnx(gemm, "Gemm") or \
                not float_dtype(gemm.outputs[0]):
            continue
        act = sole_consumer(gemm.outputs[0], *_GEMM_ACTS)
        if act is None:
            continue
        attrs = {k: a.value for k, a in gemm.attributes.items()}
        attrs["activation"] = act.op_type
        params = {dst: attr(act, src, default) for src, dst, default in _GEMM_ACTS[act.op_type]}
        if any(v is None for v in params.values()):
            continue
        attrs.update(params)
        fused = ctx.node("FusedGemm", list(gemm.inputs), attrs, domain=MS, like=act.outputs,
                         name="FusedGemm")
        ctx.replace(act, [fused], [(act.outputs[0], fused.outputs[0])], [act, gemm],
                    "gemm.activation")
        changed = True
    return changed
