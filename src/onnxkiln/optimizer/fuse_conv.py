"""Conv fusions (extended level).

- Conv -> BatchNormalization (inference) folds into the Conv's weights and bias, computed in
  float64 and rounded once to the weights' type (new initializers; the old ones die when
  nothing else reads them);
- Conv [-> Add(z, same shape)] -> Relu/Clip/Sigmoid/Tanh/LeakyRelu/HardSigmoid ->
  com.microsoft FusedConv (activation(conv + z)), float32 only as onnxruntime's kernel;
- Conv -> HardSwish or onnxkiln Silu (after fuse_silu) -> onnxkiln FusedConv, whose conv
  applies the activation as it finishes its output (MobileNetV3, EfficientNet).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxkiln.optimizer._graph import (
    MS,
    OURS,
    Context,
    attr,
    const_array,
    float_dtype,
    is_onnx,
    nodes_of,
    other_input,
    producer,
    same_dims,
    sole_consumer,
)

__all__ = ["fold_batch_norm", "fuse_conv_activation", "fuse_conv_swish"]

_F32_MAX = float(np.finfo(np.float32).max)
_ACTIVATIONS = ("Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid")


def fold_batch_norm(ctx: Context) -> bool:
    """Fold inference BatchNormalization into the Conv before it."""
    changed = False
    for bn in nodes_of(ctx.model.graph, "BatchNormalization"):
        if bn.graph is not None and is_onnx(bn, "BatchNormalization"):
            changed |= _fold_bn(ctx, bn)
    return changed


def _inference_bn(ctx: Context, bn: ir.Node) -> bool:
    if any(o.uses() or o.is_graph_output() for o in bn.outputs[1:]):
        return False
    opset = ctx.opset("") or 1
    if opset < 7 and not attr(bn, "is_test", 0):
        return False
    return attr(bn, "spatial", 1) == 1 and attr(bn, "training_mode", 0) == 0


def _fold_bn(ctx: Context, bn: ir.Node) -> bool:
    conv = producer(bn.inputs[0], "Conv")
    if conv is None or sole_consumer(conv.outputs[0]) is not bn or not _inference_bn(ctx, bn):
        return False
    if len(bn.inputs) != 5 or any(v is None for v in bn.inputs):
        return False
    w = const_array(conv.inputs[1])
    b = const_array(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None \
        else None
    if w is None or w.dtype.kind != "f" or w.ndim < 3 or (len(conv.inputs) > 2 and
                                                          conv.inputs[2] is not None and
                                                          b is None):
        return False
    params = [const_array(v) for v in bn.inputs[1:]]
    m = w.shape[0]
    if any(p is None or p.shape != (m,) or p.dtype.kind != "f" for p in params):
        return False
    if b is not None and b.shape != (m,):
        return False
    scale, shift, mean, var = (p.astype(np.float64) for p in params)
    eps = attr(bn, "epsilon", 1e-5)
    if eps is None:
        return False
    s = scale / np.sqrt(var + float(eps))
    w2 = (w.astype(np.float64) * s.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype)
    b0 = b.astype(np.float64) if b is not None else 0.0
    b2 = ((b0 - mean) * s + shift).astype(w.dtype)
    graph = conv.graph
    wv = ctx.initializer(graph, f"{conv.inputs[1].name}_bn", w2)
    bv = ctx.initializer(graph, f"{conv.inputs[1].name}_bn_bias", b2)
    new = ctx.node("Conv", [conv.inputs[0], wv, bv], like=bn.outputs[:1], name="Conv")
    for k, a in conv.attributes.items():
        new.attributes[k] = a
    ctx.replace(bn, [new], [(bn.outputs[0], new.outputs[0])], [bn, conv], "conv.batchnorm")
    return True


def fuse_conv_activation(ctx: Context) -> bool:
    """Conv [+ Add] + activation -> com.microsoft FusedConv."""
    if not ctx.supports(MS, "FusedConv"):
        return False
    changed = False
    for act in nodes_of(ctx.model.graph, *_ACTIVATIONS):
        if act.graph is not None and is_onnx(act, *_ACTIVATIONS):
            changed |= _fuse_at(ctx, act)
    return changed


def _activation_params(ctx: Context, act: ir.Node) -> list[float] | None:
    op = act.op_type
    if op in ("Relu", "Sigmoid", "Tanh"):
        return []
    if op == "LeakyRelu":
        found = [attr(act, "alpha", 0.01)]
    elif op == "HardSigmoid":
        found = [attr(act, "alpha", 0.2), attr(act, "beta", 0.5)]
    elif (ctx.opset("") or 1) < 11:
        found = [attr(act, "min", -_F32_MAX), attr(act, "max", _F32_MAX)]
    else:
        return _clip_bounds(act)
    return None if None in found else [float(v) for v in found]


def _clip_bounds(act: ir.Node) -> list[float] | None:
    bounds = []
    for i, default in ((1, -_F32_MAX), (2, _F32_MAX)):
        v = act.inputs[i] if len(act.inputs) > i else None
        if v is None:
            bounds.append(default)
            continue
        arr = const_array(v)
        if arr is None or arr.size != 1:
            return None
        bounds.append(float(arr.reshape(())))
    return bounds


def _fuse_at(ctx: Context, act: ir.Node) -> bool:
    x = act.inputs[0]
    params = _activation_params(ctx, act)
    if params is None or not float_dtype(x):
        return False
    conv, z, add = producer(x, "Conv"), None, None
    if conv is None:
        add = producer(x, "Add")
        if add is None or sole_consumer(add.outputs[0]) is not act:
            return False
        for side in add.inputs:
            cand = producer(side, "Conv")
            other = other_input(add, side)
            if cand is not None and sole_consumer(side) is add and same_dims(side, other) \
                    and other.dtype == side.dtype:
                conv, z = cand, other
                break
    elif sole_consumer(conv.outputs[0]) is not act:
        return False
    if conv is None or not float_dtype(conv.outputs[0]):
        return False
    inputs = list(conv.inputs)
    if z is not None:
        while len(inputs) < 3:
            inputs.append(None)
        inputs.append(z)
    attrs: dict = {"activation": act.op_type}
    if params:
        attrs["activation_params"] = params
    fused = ctx.node("FusedConv", inputs, attrs, domain=MS, like=act.outputs,
                     name="FusedConv")
    for k, a in conv.attributes.items():
        fused.attributes[k] = a
    ctx.replace(act, [fused], [(act.outputs[0], fused.outputs[0])],
                [act, *([add] if add is not None else []), conv], "conv.activation")
    return True


def fuse_conv_swish(ctx: Context) -> bool:
    """Conv -> HardSwish / onnxkiln Silu -> onnxkiln FusedConv (float32, as FusedConv)."""
    if not ctx.supports(OURS, "FusedConv"):
        return False
    changed = False
    for act in nodes_of(ctx.model.graph, "HardSwish", "Silu"):
        if act.graph is None:
            continue
        ours = act.domain == OURS and act.op_type == "Silu"
        if not (ours or is_onnx(act, "HardSwish")):
            continue
        conv = producer(act.inputs[0], "Conv")
        if conv is None or sole_consumer(conv.outputs[0]) is not act or \
                not float_dtype(conv.outputs[0]):
            continue
        fused = ctx.node("FusedConv", list(conv.inputs), {"activation": act.op_type},
                         domain=OURS, like=act.outputs, name="FusedConv")
        for k, a in conv.attributes.items():
            fused.attributes[k] = a
        ctx.replace(act, [fused], [(act.outputs[0], fused.outputs[0])], [act, conv],
                    "conv.swish")
        changed = True
    return changed
