"""Reverse-mode differentiation of a graph region, for ai.onnx.preview.training::Gradient.

`GradientProgram(node, xs, zs, y)` finds the nodes that compute `y` from the tensors named
in xs and zs (plus constants), builds their CPU kernels once, and at run time evaluates
that region on the Gradient node's inputs, then walks it backwards from dy/dy = 1 with the
per-op rules below. Only ops with a rule can lie on a path from xs to y; other ops (shape
computations, constants) may appear off that path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import NodeInfo, normalize_domain
from onnxkiln.providers.cpu.registry import REGISTRY
from onnxkiln.schema import schema_defaults

__all__ = ["RULES", "GradientProgram"]

Rule = Callable[..., Sequence[np.ndarray | None]]


# ----------------------------------------------------------------------------- helpers


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum a broadcast gradient back to `shape`."""
    if g.shape == tuple(shape):
        return g
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, g.shape)) if n == 1 and m != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _is_float(a) -> bool:
    if a is None:
        return False
    dt = np.asarray(a).dtype
    return dt.kind in "fc" or dt.name == "bfloat16"


# ----------------------------------------------------------------------------- rules
# A rule gets (inputs, outputs, grads, attrs, opset): the node's input and output values,
# the gradient of each output (None where no gradient flows), and returns one gradient
# (or None) per input.


def _add(ins, outs, gs, attrs, opset):
    g = gs[0]
    return [_unbroadcast(g, np.shape(x)) for x in ins]


def _sub(ins, outs, gs, attrs, opset):
    g = gs[0]
    return [_unbroadcast(g, np.shape(ins[0])), _unbroadcast(-g, np.shape(ins[1]))]


def _mul(ins, outs, gs, attrs, opset):
    a, b = ins
    g = gs[0]
    return [_unbroadcast(g * b, np.shape(a)), _unbroadcast(g * a, np.shape(b))]


def _div(ins, outs, gs, attrs, opset):
    a, b = ins
    g = gs[0]
    ga = g / b
    return [_unbroadcast(ga, np.shape(a)), _unbroadcast(-ga * outs[0], np.shape(b))]


def _neg(ins, outs, gs, attrs, opset):
    return [-gs[0]]


def _identity(ins, outs, gs, attrs, opset):
    return [gs[0]]


def _sum(ins, outs, gs, attrs, opset):
    return [_unbroadcast(gs[0], np.shape(x)) for x in ins]


def _mean(ins, outs, gs, attrs, opset):
    g = gs[0] / np.asarray(len(ins), gs[0].dtype)
    return [_unbroadcast(g, np.shape(x)) for x in ins]


def _matmul(ins, outs, gs, attrs, opset):
    a, b = ins
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    g = gs[0].reshape((*batch, a2.shape[-2], b2.shape[-1]))
    ga = g @ np.swapaxes(b2, -1, -2)
    gb = np.swapaxes(a2, -1, -2) @ g
    return [_unbroadcast(ga, a2.shape).reshape(a.shape),
            _unbroadcast(gb, b2.shape).reshape(b.shape)]


def _gemm(ins, outs, gs, attrs, opset):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    g = gs[0]
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    op_a = a.T if attrs.get("transA") else a
    op_b = b.T if attrs.get("transB") else b
    ga = (g @ op_b.T) * g.dtype.type(alpha)
    gb = (op_a.T @ g) * g.dtype.type(alpha)
    out = [ga.T if attrs.get("transA") else ga, gb.T if attrs.get("transB") else gb]
    if c is not None:
        out.append(_unbroadcast(g * g.dtype.type(beta), np.shape(c)))
    return out


def _relu(ins, outs, gs, attrs, opset):
    return [gs[0] * (ins[0] > 0)]


def _sigmoid(ins, outs, gs, attrs, opset):
    y = outs[0]
    return [gs[0] * y * (1 - y)]


def _tanh(ins, outs, gs, attrs, opset):
    y = outs[0]
    return [gs[0] * (1 - y * y)]


def _exp(ins, outs, gs, attrs, opset):
    return [gs[0] * outs[0]]


def _log(ins, outs, gs, attrs, opset):
    return [gs[0] / ins[0]]


def _sqrt(ins, outs, gs, attrs, opset):
    return [gs[0] * 0.5 / outs[0]]


def _abs(ins, outs, gs, attrs, opset):
    return [gs[0] * np.sign(ins[0])]


def _pow(ins, outs, gs, attrs, opset):
    a, b = ins
    g = gs[0]
    ga = g * b * np.power(a, b - 1)
    out = [_unbroadcast(ga.astype(a.dtype, copy=False), np.shape(a))]
    if _is_float(b):
        with np.errstate(divide="ignore", invalid="ignore"):
            gb = g * outs[0] * np.log(a)
        out.append(_unbroadcast(gb.astype(b.dtype, copy=False), np.shape(b)))
    else:
        out.append(None)
    return out


def _reshape_like(ins, outs, gs, attrs, opset):
    return [gs[0].reshape(np.shape(ins[0]))] + [None] * (len(ins) - 1)


def _transpose(ins, outs, gs, attrs, opset):
    perm = attrs.get("perm")
    if perm is None:
        return [gs[0].T]
    return [gs[0].transpose(np.argsort(perm))]


def _cast(ins, outs, gs, attrs, opset):
    if not _is_float(ins[0]):
        return [None]
    return [gs[0].astype(ins[0].dtype)]


def _reduce(mean: bool) -> Rule:
    def rule(ins, outs, gs, attrs, opset):
        x = ins[0]
        axes = attrs.get("axes")
        if len(ins) > 1 and ins[1] is not None:
            axes = ins[1].tolist()
        if not axes:
            axes = [] if attrs.get("noop_with_empty_axes") else list(range(x.ndim))
        axes = sorted(a % x.ndim for a in axes) if x.ndim else []
        g = gs[0]
        if not attrs.get("keepdims", 1):
            g = np.expand_dims(g, tuple(axes))
        g = np.broadcast_to(g, x.shape)
        if mean:
            count = int(np.prod([x.shape[a] for a in axes])) if axes else 1
            g = g / g.dtype.type(max(count, 1))
        return [np.array(g), None]

    return rule


def _softmax(ins, outs, gs, attrs, opset):
    if opset < 13:
        raise NotImplementedError("Gradient of Softmax before opset 13")
    y, g = outs[0], gs[0]
    axis = attrs.get("axis", -1)
    return [y * (g - np.sum(g * y, axis=axis, keepdims=True))]


RULES: dict[str, Rule] = {
    "Add": _add, "Sub": _sub, "Mul": _mul, "Div": _div, "Neg": _neg,
    "Identity": _identity, "Sum": _sum, "Mean": _mean, "MatMul": _matmul, "Gemm": _gemm,
    "Relu": _relu, "Sigmoid": _sigmoid, "Tanh": _tanh, "Exp": _exp, "Log": _log,
    "Sqrt": _sqrt, "Abs": _abs, "Pow": _pow, "Reshape": _reshape_like,
    "Flatten": _reshape_like, "Squeeze": _reshape_like, "Unsqueeze": _reshape_like,
    "Transpose": _transpose, "Cast": _cast, "ReduceSum": _reduce(False),
    "ReduceMean": _reduce(True), "Softmax": _softmax,
}


# ----------------------------------------------------------------------------- program


def _attr_value(attr: ir.Attr) -> Any:
    t, v = attr.type, attr.value
    if t == ir.AttributeType.TENSOR:
        return v.numpy()
    if t == ir.AttributeType.TENSORS:
        return [x.numpy() for x in v]
    if t in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return list(v)
    return v


def _dtype(value: ir.Value | None) -> DataType | None:
    try:
        return None if value is None or value.dtype is None else DataType(value.dtype)
    except ValueError:
        return None


class _Step:
    """One forward node of the region: its kernel, value names and attributes."""

    def __init__(self, node: ir.Node, opsets: dict[str, int]) -> None:
        domain = normalize_domain(node.domain)
        opset = opsets.get(domain) or (onnx.defs.onnx_opset_version() if domain == "" else 1)
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
               for a in node.attributes.values()):
            raise NotImplementedError(
                f"Gradient through {node.op_type} (a node with subgraphs) is not supported"
            )
        spec = REGISTRY.resolve(domain, node.op_type, opset)
        if spec is None:
            raise NotImplementedError(
                f"Gradient: no CPU kernel for {domain or 'ai.onnx'}::{node.op_type} "
                f"opset {opset}"
            )
        attrs = dict(schema_defaults(node.op_type, domain, opset))
        attrs.update({k: _attr_value(a) for k, a in node.attributes.items()})
        self.op_type = node.op_type
        self.opset = opset
        self.attrs = attrs
        self.inputs = [None if v is None else v.name for v in node.inputs]
        self.outputs = [v.name for v in node.outputs]
        info = NodeInfo(
            name=node.name or node.op_type, op_type=node.op_type, domain=domain, opset=opset,
            attrs=attrs, n_inputs=len(self.inputs), n_outputs=len(self.outputs),
            input_present=tuple(n is not None for n in self.inputs),
            output_present=tuple(bool(n) for n in self.outputs),
            input_dtypes=tuple(_dtype(v) for v in node.inputs),
            output_dtypes=tuple(_dtype(v) for v in node.outputs),
            input_shapes=(None,) * len(self.inputs),
            const_inputs=tuple(
                None if v is None or v.const_value is None else v.const_value.numpy()
                for v in node.inputs
            ),
        )
        self.kernel = spec.build(info)
        self.multi = spec.multi_output

    def run(self, env: dict[str, Any]) -> None:
        args = [None if n is None else env[n] for n in self.inputs]
        result = self.kernel(*args)
        outs = result if self.multi else (result,)
        for name, value in zip(self.outputs, outs):
            if name:
                env[name] = np.asarray(value) if isinstance(value, np.generic) else value


class GradientProgram:
    """Forward and backward passes of the region computing `y` from xs and zs."""

    def __init__(self, node: ir.Node, xs: list[str], zs: list[str], y: str) -> None:
        graph = node.graph
        if graph is None:
            raise ValueError("Gradient node is not part of a graph")
        values = _values_by_name(graph)
        missing = [n for n in (*xs, *zs, y) if n not in values]
        if missing:
            raise ValueError(f"Gradient names tensors not in the graph: {missing}")
        self.xs, self.zs, self.y = xs, zs, y
        sources = set(xs) | set(zs)
        self.constants: dict[str, np.ndarray] = {}
        region = self._region(values[y], sources)
        opsets = {normalize_domain(d): v for d, v in graph.opset_imports.items()}
        self.steps = [_Step(n, opsets) for n in region]
        # values that depend on some x: only those need gradients
        active = set(xs)
        self.active_steps: list[_Step] = []
        for step in self.steps:
            if any(n in active for n in step.inputs if n):
                if step.op_type not in RULES:
                    raise NotImplementedError(
                        f"Gradient: no differentiation rule for {step.op_type} "
                        f"(supported: {', '.join(sorted(RULES))})"
                    )
                active.update(n for n in step.outputs if n)
                self.active_steps.append(step)
        self.active = active

    def _region(self, y: ir.Value, sources: set[str]) -> list[ir.Node]:
        """Nodes between the sources and y, in dependency order (post-order DFS)."""
        order: list[ir.Node] = []
        done: set[int] = set()
        visiting: set[int] = set()

        def visit_value(v: ir.Value) -> None:
            if v.name in sources:
                return
            producer = v.producer()
            if producer is not None:
                visit_node(producer)
            elif v.const_value is not None:
                self.constants[v.name] = v.const_value.numpy()
            else:
                raise ValueError(
                    f"Gradient: y depends on '{v.name}', which is neither in xs/zs nor a "
                    "constant"
                )

        def visit_node(n: ir.Node) -> None:
            key = id(n)
            if key in done:
                return
            if key in visiting:
                raise ValueError("Gradient: the differentiated region has a cycle")
            visiting.add(key)
            for v in n.inputs:
                if v is not None:
                    visit_value(v)
            visiting.discard(key)
            done.add(key)
            order.append(n)

        visit_value(y)
        return order

    def run(self, *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
        """Evaluate the region at the given xs/zs values; return dy/dx for each x."""
        env: dict[str, Any] = dict(self.constants)
        env.update(zip((*self.xs, *self.zs), inputs))
        for step in self.steps:
            step.run(env)
        y = np.asarray(env[self.y])
        grads: dict[str, np.ndarray] = {self.y: np.ones_like(y)}
        for step in reversed(self.active_steps):
            out_grads = [grads.get(n) if n else None for n in step.outputs]
            if all(g is None for g in out_grads):
                continue
            out_vals = [env.get(n) if n else None for n in step.outputs]
            out_grads = [np.zeros_like(v) if g is None and v is not None else g
                         for g, v in zip(out_grads, out_vals)]
            in_vals = [None if n is None else env[n] for n in step.inputs]
            in_grads = RULES[step.op_type](in_vals, out_vals, out_grads, step.attrs, step.opset)
            for name, value, g in zip(step.inputs, in_vals, in_grads):
                if g is None or name is None or name not in self.active:
                    continue
                g = np.asarray(g).astype(np.asarray(value).dtype, copy=False)
                prev = grads.get(name)
                grads[name] = g if prev is None else prev + g
        out = []
        for name, value in zip(self.xs, inputs):
            g = grads.get(name)
            out.append(np.zeros_like(value) if g is None else np.array(g, copy=True))
        return tuple(out)


def _values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values: dict[str, ir.Value] = {v.name: v for v in graph.inputs}
    values.update(graph.initializers)
    for n in graph:
        for v in n.outputs:
            if v.name:
                values[v.name] = v
    return values
