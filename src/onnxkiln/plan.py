"""Graph -> Plan: ordered steps over numbered value slots, kernels built once per node."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxkiln.dtypes import DataType
from onnxkiln.errors import ModelLoadError, UnsupportedOpError
from onnxkiln.loader import MAX_SUBGRAPH_DEPTH
from onnxkiln.optimizer._graph import fused_from
from onnxkiln.providers.base import (
    ControlFlowCounter,
    KernelRegistry,
    KernelSpec,
    NodeInfo,
    normalize_domain,
)
from onnxkiln.schema import check_arity, schema_defaults

__all__ = ["BodyOptions", "Plan", "Step", "build_plan", "free_values", "lifetimes",
           "prune_outputs"]


@dataclass(frozen=True, slots=True)
class Step:
    """One node of the plan: its kernel and the slots it reads and writes."""

    node_id: int
    name: str
    op_type: str
    domain: str
    opset: int
    provider: str
    spec: KernelSpec
    kernel: Callable[..., Any]
    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    fused_from: tuple[str, ...] = ()  # the model's nodes an optimizer-made node replaced


@dataclass
class Plan:
    """A compiled graph: steps in execution order over value slots.

    `input_slots` follow the graph inputs (initializer-backed inputs included, with
    their initializer in `input_defaults`); `constants` maps slots to values known
    before any run; `last_use[s]` is the step after which slot s is dead.
    """

    steps: list[Step]
    slot_names: list[str]
    input_slots: list[int]
    input_defaults: dict[int, np.ndarray]
    output_slots: list[int]
    constants: dict[int, Any]
    last_use: dict[int, int]
    output_may_alias: list[bool] = field(default_factory=list)


@dataclass(frozen=True)
class BodyOptions:
    """Session options that reach If/Loop/Scan bodies: in-place donation (None: the
    environment's default) and per-signature specialised plans."""

    inplace: bool | None = None
    specialize: bool = True


def build_plan(
    model: ir.Model,
    registries: Sequence[KernelRegistry],
    stats: ControlFlowCounter | None = None,
    placer: Any = None,
    bodies: BodyOptions = BodyOptions(),
) -> Plan:
    """Resolve a kernel for every node and lay out slots; all missing kernels fail at once.

    Without a `placer` each node takes the first registry with a kernel for it; with one
    (partition.Placer: device sessions) the placer chooses and records what it declined.
    Subgraph bodies compile with the `bodies` options.
    """
    ctx = _Context(
        {normalize_domain(d): v for d, v in model.opset_imports.items()},
        tuple(registries),
        stats if stats is not None else ControlFlowCounter(),
        placer,
        bodies,
    )
    plan = _graph_plan(model.graph, ctx, (), 0)
    if ctx.missing:
        asked = ", ".join(r.provider for r in registries)
        raise UnsupportedOpError(
            f"{len(ctx.missing)} node(s) have no kernel on the requested providers ({asked}):\n  "
            + "\n  ".join(ctx.missing)
        )
    return plan


@dataclass
class _Context:
    opsets: dict[str, int]
    registries: tuple[KernelRegistry, ...]
    stats: ControlFlowCounter
    placer: Any = None
    body_options: BodyOptions = BodyOptions()
    missing: list[str] = field(default_factory=list)

    def choose(self, node_id: int, node: ir.Node, info: NodeInfo, in_slots, out_slots,
               constants: dict[int, Any]) -> tuple[KernelSpec | None, str]:
        """`in_slots`: the node's inputs, then the outer values its subgraphs capture."""
        if self.placer is not None:
            return self.placer.choose(node_id, info, in_slots, out_slots, constants)
        return _resolve(self.registries, info.domain, node.op_type, info.opset)

    def bodies(self, node_id: int, info: NodeInfo, in_slots, constants: dict[int, Any]) -> Any:
        """Where a control-flow node's bodies are placed (the placer's BodyPlacement), or
        None without a placer (every body on the session's registries)."""
        if self.placer is None:
            return None
        return self.placer.bodies(node_id, info, in_slots, constants)


def _graph_plan(graph: ir.Graph, ctx: _Context, captures: Sequence[ir.Value], depth: int) -> Plan:
    """Plan one graph; `captures` are outer-scope values appended after its inputs."""
    if depth > MAX_SUBGRAPH_DEPTH:
        raise ModelLoadError(
            f"subgraphs nest more than {MAX_SUBGRAPH_DEPTH} levels deep (graph "
            f"'{graph.name}' is at depth {depth}); flatten the control flow"
        )
    slots: dict[ir.Value, int] = {}
    names: list[str] = []

    def slot_of(value: ir.Value) -> int:
        s = slots.get(value)
        if s is None:
            s = slots[value] = len(names)
            names.append(value.name or f"<value {s}>")
        return s

    input_slots = [slot_of(v) for v in (*graph.inputs, *captures)]
    input_defaults: dict[int, np.ndarray] = {}
    constants: dict[int, Any] = {}
    for name, value in graph.initializers.items():
        array = _tensor_value(value, name)
        if value.is_graph_input():
            input_defaults[slot_of(value)] = array
        else:
            constants[slot_of(value)] = array

    steps: list[Step] = []
    external = set(input_slots) | set(constants)
    for node_id, node in enumerate(graph):
        domain = normalize_domain(node.domain)
        opset = ctx.opsets.get(domain, 1)
        graphs, per_graph, captured = _graph_attributes(node)
        in_slots = tuple(None if v is None else slot_of(v) for v in node.inputs)
        cap_slots = tuple(slot_of(v) for v in captured)
        out_slots = tuple(None if (v is None or not v.name) else slot_of(v) for v in node.outputs)
        subgraphs: dict[str, Any] = {}
        if graphs:
            bodies = ctx.bodies(node_id, _node_info(node, domain, opset, in_slots, out_slots,
                                                    constants, {}), in_slots + cap_slots,
                                constants)
            subgraphs = _subgraphs(node, graphs, per_graph, captured, bodies, ctx, depth)
        info = _node_info(node, domain, opset, in_slots, out_slots, constants, subgraphs)
        spec, provider = ctx.choose(node_id, node, info, in_slots + cap_slots, out_slots,
                                    constants)
        if spec is None:
            ctx.missing.append(_describe_missing(node, domain, opset, ctx.registries))
            continue
        kernel = _build_kernel(spec, info)
        if node.op_type == "Constant" and domain == "" and out_slots and out_slots[0] is not None:
            constants[out_slots[0]] = _run_constant(kernel, info)
            external.add(out_slots[0])
            continue
        if spec.view and in_slots and in_slots[0] in external:
            external.update(s for s in out_slots if s is not None)
        steps.append(Step(node_id, node.name or f"{node.op_type}_{node_id}", node.op_type,
                          domain, opset, provider, spec, kernel, in_slots + cap_slots,
                          out_slots, fused_from(node)))

    output_slots = [slot_of(v) for v in graph.outputs]
    last_use = lifetimes(steps, input_slots, output_slots, constants)
    if not ctx.missing:
        _check_dataflow(steps, names, input_slots, constants, output_slots)
    return Plan(steps, names, input_slots, input_defaults, output_slots, constants, last_use,
                [s in external for s in output_slots])


def prune_outputs(plan: Plan, outputs: Sequence[int]) -> Plan:
    """The plan computing only the graph outputs at positions `outputs` (in that order):
    the steps they depend on, in the same order; every input slot stays."""
    wanted = [plan.output_slots[i] for i in outputs]
    needed = set(wanted)
    keep: list[Step] = []
    for step in reversed(plan.steps):
        if any(s in needed for s in step.outputs if s is not None):
            keep.append(step)
            needed.update(s for s in step.inputs if s is not None)
    keep.reverse()
    constants = {s: v for s, v in plan.constants.items() if s in needed}
    return Plan(keep, plan.slot_names, plan.input_slots, plan.input_defaults, wanted, constants,
                lifetimes(keep, plan.input_slots, wanted, constants),
                [plan.output_may_alias[i] for i in outputs] if plan.output_may_alias else [])


def lifetimes(steps: Sequence[Step], input_slots: Sequence[int], output_slots: Sequence[int],
              constants: dict[int, Any]) -> dict[int, int]:
    """slot -> index of the last step that touches it (-1: an input no step reads);
    graph outputs and constants never die."""
    last_use: dict[int, int] = {}
    for i, step in enumerate(steps):
        for s in (*step.inputs, *step.outputs):
            if s is not None:
                last_use[s] = i
    for s in input_slots:
        last_use.setdefault(s, -1)
    for s in (*output_slots, *constants):
        last_use.pop(s, None)
    return last_use


def _graph_attributes(node: ir.Node
                      ) -> tuple[dict[str, ir.Graph], dict[str, list[ir.Value]], list[ir.Value]]:
    """The node's graph attributes, each one's captured outer values, and their union."""
    graphs = {
        name: attr.value
        for name, attr in node.attributes.items()
        if attr.type == ir.AttributeType.GRAPH
    }
    captured: list[ir.Value] = []
    per_graph: dict[str, list[ir.Value]] = {}
    for name, g in graphs.items():
        per_graph[name] = free_values(g)
        captured.extend(v for v in per_graph[name] if v not in captured)
    return graphs, per_graph, captured


def _subgraphs(node: ir.Node, graphs: dict[str, ir.Graph], per_graph: dict[str, list[ir.Value]],
               captured: list[ir.Value], bodies: Any, ctx: _Context, depth: int
               ) -> dict[str, Any]:
    """Compile each graph attribute of `node` into a runner; `bodies` (a placer's
    BodyPlacement) places each body's nodes and adds its copies."""
    from onnxkiln.executor import CompiledPlan  # executor imports this module
    from onnxkiln.subgraph import SubgraphRunner

    runners = {}
    for name, g in graphs.items():
        index = tuple(captured.index(v) for v in per_graph[name])
        body_ctx = ctx
        if bodies is not None:
            body_ctx = dataclasses.replace(ctx, placer=bodies.placer(g, index))
        plan = _graph_plan(g, body_ctx, per_graph[name], depth + 1)
        if ctx.missing:
            continue
        if bodies is not None:
            plan = bodies.finish(plan, body_ctx.placer)
        label = f"{node.name or node.op_type}.{name}"
        options = ctx.body_options
        runners[name] = SubgraphRunner(CompiledPlan(plan, inplace=options.inplace), index, g,
                                       label, ctx.stats, specialize=options.specialize)
    return runners


def free_values(graph: ir.Graph) -> list[ir.Value]:
    """Outer-scope values a graph (or any graph nested in it) reads, in first-use order."""
    defined: set[ir.Value] = set(graph.inputs) | set(graph.initializers.values())
    free: list[ir.Value] = []

    def use(v: ir.Value | None) -> None:
        if v is not None and v not in defined and v not in free:
            free.append(v)

    for node in graph:
        for v in node.inputs:
            use(v)
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                for v in free_values(attr.value):
                    use(v)
            elif attr.type == ir.AttributeType.GRAPHS:
                for g in attr.value:
                    for v in free_values(g):
                        use(v)
        defined.update(node.outputs)
    for v in graph.outputs:
        use(v)
    return free


def _resolve(registries: Sequence[KernelRegistry], domain: str, op_type: str, opset: int):
    for registry in registries:
        spec = registry.resolve(domain, op_type, opset)
        if spec is not None:
            return spec, registry.provider
    return None, ""


def _describe_missing(node: ir.Node, domain: str, opset: int, registries) -> str:
    types = ", ".join(_type_str(v) for v in node.inputs)
    text = f"'{node.name or '<unnamed>'}' {domain or 'ai.onnx'}::{node.op_type} opset {opset}"
    text += f", inputs ({types})"
    for registry in registries:
        versions = registry.versions(domain, node.op_type)
        if versions:
            spans = ", ".join(f"{a}-{b if b is not None else '∞'}" for a, b in versions)
            text += f"; {registry.provider} has {node.op_type} for opsets {spans} only"
    return text


def _type_str(value: ir.Value | None) -> str:
    if value is None:
        return "<absent>"
    dtype = str(DataType(value.dtype)) if value.dtype is not None else "?"
    if value.shape is None:
        return f"{dtype}[?]"
    return f"{dtype}[{','.join(str(d) for d in value.shape)}]"


def _node_info(node, domain, opset, in_slots, out_slots, constants, subgraphs) -> NodeInfo:
    return NodeInfo(
        name=node.name or f"{node.op_type}",
        op_type=node.op_type,
        domain=domain,
        opset=opset,
        attrs=_attributes(node, domain, opset),
        n_inputs=len(in_slots),
        n_outputs=len(out_slots),
        input_present=tuple(s is not None for s in in_slots),
        output_present=tuple(s is not None for s in out_slots),
        input_dtypes=tuple(_dtype(v) for v in node.inputs),
        output_dtypes=tuple(_dtype(v) for v in node.outputs),
        input_shapes=tuple(_shape(v) for v in node.inputs),
        const_inputs=tuple(None if s is None else constants.get(s) for s in in_slots),
        subgraphs=subgraphs,
        node=node,
    )


def _dtype(value: ir.Value | None) -> DataType | None:
    if value is None or value.dtype is None:
        return None
    try:
        return DataType(value.dtype)
    except ValueError:
        return None


def _shape(value: ir.Value | None) -> tuple[int | str | None, ...] | None:
    if value is None or value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else d.value for d in value.shape)


def _build_kernel(spec: KernelSpec, info: NodeInfo) -> Callable[..., Any]:
    try:
        last_in = max((i + 1 for i, p in enumerate(info.input_present) if p), default=0)
        check_arity(info.op_type, info.domain, info.opset, last_in)
        return spec.build(info)
    except ModelLoadError:
        raise
    except Exception as e:  # a factory rejecting the node's attributes or inputs
        raise ModelLoadError(f"node {info.describe()}: {type(e).__name__}: {e}") from e


def _run_constant(kernel: Callable[..., Any], info: NodeInfo) -> Any:
    try:
        return kernel()
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"node {info.describe()}: {type(e).__name__}: {e}") from e


def _tensor_value(value: ir.Value, name: str) -> np.ndarray:
    tensor = value.const_value
    if tensor is None:
        raise ModelLoadError(f"initializer '{name}' has no data (missing initializer)")
    try:
        array = tensor.numpy()
    except Exception as e:
        raise ModelLoadError(f"initializer '{name}' cannot be read: {e}") from e
    if array.dtype.kind == "S":  # ONNX strings are UTF-8; users see str objects
        array = np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(array)
    return array


def _attributes(node: ir.Node, domain: str, opset: int) -> dict[str, Any]:
    attrs = dict(schema_defaults(node.op_type, domain, opset))
    for name, attr in node.attributes.items():
        try:
            attrs[name] = _attr_value(attr)
        except Exception as e:  # a tensor attribute whose data does not match its dims/type
            raise ModelLoadError(
                f"node '{node.name or '<unnamed>'}' ({domain or 'ai.onnx'}::{node.op_type}): "
                f"attribute '{name}' cannot be read: {type(e).__name__}: {e}"
            ) from e
    return attrs


def _attr_value(attr: ir.Attr) -> Any:
    t, v = attr.type, attr.value
    if t == ir.AttributeType.TENSOR:
        return v.numpy()
    if t == ir.AttributeType.TENSORS:
        return [x.numpy() for x in v]
    if t in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return list(v)
    if t == ir.AttributeType.GRAPHS:
        return list(v)
    return v


def _check_dataflow(steps: list[Step], names: list[str], input_slots: list[int],
                    constants: dict[int, Any], output_slots: list[int]) -> None:
    """Every value a step or the graph output reads is written before: a single-output
    kernel writes only its node's first output, so a used extra output is an error."""
    defined = set(input_slots) | set(constants)
    unwritten: dict[int, Step] = {}
    for step in steps:
        for s in step.inputs:
            if s is not None and s not in defined:
                raise ModelLoadError(
                    f"node '{step.name}' ({step.domain or 'ai.onnx'}::{step.op_type}) reads "
                    f"'{names[s]}', {_never_written(s, unwritten)}")
        written = step.outputs if step.spec.multi_output else step.outputs[:1]
        defined.update(s for s in written if s is not None)
        unwritten.update((s, step) for s in step.outputs[len(written):] if s is not None)
    for s in output_slots:
        if s not in defined:
            raise ModelLoadError(f"graph output '{names[s]}' is never produced: "
                                 f"{_never_written(s, unwritten)}")


def _never_written(slot: int, unwritten: dict[int, Step]) -> str:
    step = unwritten.get(slot)
    if step is None:
        return "which nothing produces before it (undefined, or a cycle through a subgraph)"
    index = step.outputs.index(slot)
    return (f"output {index} of node '{step.name}' ({step.domain or 'ai.onnx'}::"
            f"{step.op_type}), which its kernel does not produce (it has one output); "
            "remove the extra output")
