"""Live-byte accounting for `SessionBuilder.memory_limit`.

Counted: the run's inputs and every value a step produces, from its creation until its
last use (outputs until the run returns). Not counted: weights and other constants
(resident since load), kernel scratch space, values inside If/Loop/Scan bodies (their
outputs count once the node returns). A view op's output (Reshape, Squeeze, ...) shares
its input's bytes, which stay live until both are dead.

Two checks use the same lifetimes. At specialisation build, onnx shape inference with the
run's concrete input shapes sizes every value it can, and a simulation raises
`MemoryLimitError` naming the first node whose outputs would cross the limit, before
anything runs. Values whose size depends on data are checked as the kernel returns.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxkiln.errors import MemoryLimitError
from onnxkiln.plan import Plan, Step

__all__ = ["MemoryPlan", "MemoryTracker", "ShapeOracle", "value_bytes"]

_SMALL = 4096  # initializers up to this many elements stay in the shape-inference copy


def value_bytes(value: Any) -> int:
    """Bytes held by a runtime value: arrays, sequences of arrays, scalars."""
    if isinstance(value, np.ndarray | np.generic):
        return int(value.nbytes)
    if isinstance(value, list | tuple):
        return sum(value_bytes(v) for v in value)
    return 0


class MemoryPlan:
    """Per step: the slots it writes and the slots that die after it; view aliasing."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.inputs = [s for s in plan.input_slots if s not in plan.constants]
        dead: dict[int, list[int]] = {}
        for s, last in plan.last_use.items():
            if s not in plan.constants:
                dead.setdefault(last, []).append(s)
        self.dead_before = tuple(dead.get(-1, ()))
        self.dead_after = [tuple(dead.get(i, ())) for i in range(len(plan.steps))]
        self.outputs = [tuple(s for s in st.outputs if s is not None) for st in plan.steps]
        self.view_of = [_view_source(st) for st in plan.steps]


def _view_source(step: Step) -> int | None:
    if step.spec.view and step.inputs and step.inputs[0] is not None:
        return step.inputs[0]
    return None


class _Ledger:
    """Storages and the slots that reference them; `live` is the sum of live storages."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.owner: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.refs: dict[int, int] = {}

    def own(self, slot: int, nbytes: int) -> None:
        self.owner[slot] = slot
        self.size[slot] = nbytes
        self.refs[slot] = 1
        self.live += nbytes

    def alias(self, slot: int, source: int) -> bool:
        storage = self.owner.get(source)
        if storage is None:
            return False
        self.owner[slot] = storage
        self.refs[storage] += 1
        return True

    def release(self, slot: int) -> None:
        storage = self.owner.pop(slot, None)
        if storage is None:
            return
        self.refs[storage] -= 1
        if self.refs[storage] == 0:
            del self.refs[storage]
            self.live -= self.size.pop(storage)


def _limit_error(step: Step, before: int, out_bytes: int, limit: int, when: str) -> Exception:
    err = MemoryLimitError(
        f"memory limit exceeded at node '{step.name}' ({step.domain or 'ai.onnx'}::"
        f"{step.op_type}, node id {step.node_id}): {before:,} bytes live plus {out_bytes:,} "
        f"bytes of outputs = {before + out_bytes:,} > limit {limit:,} bytes ({when}). Raise "
        "memory_limit(...) or run with smaller inputs."
    )
    err.node_name, err.op_type = step.name, step.op_type  # type: ignore[attr-defined]
    err.live_bytes, err.output_bytes, err.limit = before, out_bytes, limit  # type: ignore[attr-defined]
    return err


def simulate(mplan: MemoryPlan, sizes: dict[int, int | None], limit: int) -> int:
    """Walk the plan with known sizes (unknown count 0); raise at the first crossing.

    Returns the predicted peak, a lower bound when some sizes are unknown.
    """
    ledger = _Ledger()
    for s in mplan.inputs:
        ledger.own(s, sizes.get(s) or 0)
    ledger.peak = ledger.live
    for s in mplan.dead_before:
        ledger.release(s)
    for i, step in enumerate(mplan.plan.steps):
        before = ledger.live
        _produce(ledger, mplan, i, [sizes.get(s) or 0 for s in mplan.outputs[i]])
        if ledger.live > limit:
            raise _limit_error(step, before, ledger.live - before, limit,
                               "predicted from shape inference before running")
        ledger.peak = max(ledger.peak, ledger.live)
        for s in mplan.dead_after[i]:
            ledger.release(s)
    return ledger.peak


def _produce(ledger: _Ledger, mplan: MemoryPlan, i: int, nbytes: Sequence[int]) -> None:
    source = mplan.view_of[i]
    for s, n in zip(mplan.outputs[i], nbytes):
        if source is None or not ledger.alias(s, source):
            ledger.own(s, n)


class MemoryTracker:
    """Executor hooks for one run: observed live bytes, checked as each kernel returns."""

    __slots__ = ("_ledger", "_limit", "_mplan")

    def __init__(self, mplan: MemoryPlan, limit: int, inputs: Sequence[Any]) -> None:
        self._mplan = mplan
        self._limit = limit
        self._ledger = _Ledger()
        by_slot = dict(zip(mplan.plan.input_slots, inputs))
        for s in mplan.inputs:
            self._ledger.own(s, value_bytes(by_slot.get(s)))
        self._ledger.peak = self._ledger.live
        for s in mplan.dead_before:
            self._ledger.release(s)

    @property
    def peak(self) -> int:
        """The largest number of live bytes seen so far."""
        return self._ledger.peak

    def start(self, index: int) -> int:
        return index

    def finish(self, index: int, ins: tuple, outs: tuple) -> None:
        ledger = self._ledger
        before = ledger.live
        _produce(ledger, self._mplan, index, [value_bytes(v) for v in outs])
        if ledger.live > self._limit:
            step = self._mplan.plan.steps[index]
            raise _limit_error(step, before, ledger.live - before, self._limit,
                               "observed after the kernel returned: its output size "
                               "could not be inferred before running")
        if ledger.live > ledger.peak:
            ledger.peak = ledger.live
        for s in self._mplan.dead_after[index]:
            ledger.release(s)


class ShapeOracle:
    """Value sizes by onnx shape inference with concrete input shapes.

    Keeps one copy of the model without its large initializers (they become typed
    inputs), so each new signature costs one inference, not a copy of the weights.
    """

    def __init__(self, model: ir.Model, plan: Plan) -> None:
        self._plan = plan
        self._proto: onnx.ModelProto | None = _skeleton(model)
        try:  # onnx's C++ shape inference can crash the process on a malformed node (a
            onnx.checker.check_model(self._proto)  # missing required input); the checker
        except Exception:  # refuses those, and then only the run-time checks apply
            self._proto = None

    def sizes(self, signature: Sequence[Hashable]) -> dict[int, int | None]:
        """Bytes per slot of `plan` for this input signature (None: not inferable)."""
        if self._proto is None:
            return {s: None if shape is None else math.prod(shape) * np.dtype(dtype).itemsize
                    for s, (dtype, shape) in zip(self._plan.input_slots, signature)}
        proto = onnx.ModelProto()
        proto.CopyFrom(self._proto)
        shapes = dict(zip((v.name for v in proto.graph.input), _input_shapes(signature)))
        for vi in proto.graph.input:
            shape = shapes.get(vi.name)
            if shape is not None and vi.type.HasField("tensor_type"):
                dims = vi.type.tensor_type.shape
                dims.Clear()
                for d in shape:
                    dims.dim.add().dim_value = d
        try:
            inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
        except Exception:  # inference is advisory; runtime checks still apply
            inferred = proto
        known = {vi.name: _bytes_of(vi) for vi in (*inferred.graph.value_info,
                                                   *inferred.graph.output)}
        slots = {name: s for s, name in enumerate(self._plan.slot_names)}
        out: dict[int, int | None] = {s: known.get(name) for name, s in slots.items()}
        for s, (dtype, shape) in zip(self._plan.input_slots, signature):
            if shape is not None:
                out[s] = math.prod(shape) * np.dtype(dtype).itemsize
        return out


def _input_shapes(signature: Sequence[Hashable]) -> list[tuple[int, ...] | None]:
    return [shape for _, shape in signature]  # type: ignore[misc]


def _bytes_of(vi: onnx.ValueInfoProto) -> int | None:
    t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if t is None or not t.HasField("shape") or t.elem_type in (0, onnx.TensorProto.STRING):
        return None
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return math.prod(dims) * itemsize


def _skeleton(model: ir.Model) -> onnx.ModelProto:
    """The model without large initializer data: nodes, inputs, outputs, small constants."""
    g = model.graph
    graph = onnx.GraphProto(name=g.name or "graph")
    graph.node.extend(ir.serde.serialize_node(n) for n in g)
    graph.input.extend(ir.serde.serialize_value(v) for v in g.inputs)
    graph.output.extend(ir.serde.serialize_value(v) for v in g.outputs)
    for name, value in g.initializers.items():
        tensor = value.const_value
        if tensor is not None and math.prod(tensor.shape.numpy()) <= _SMALL:
            graph.initializer.append(ir.serde.serialize_tensor(tensor))
        elif not value.is_graph_input() and tensor is not None:
            graph.input.append(onnx.helper.make_tensor_value_info(
                name, int(tensor.dtype), list(tensor.shape.numpy())))
    proto = onnx.helper.make_model(graph, ir_version=model.ir_version)
    del proto.opset_import[:]
    proto.opset_import.extend(
        onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items())
    proto.functions.extend(ir.serde.serialize_function(f) for f in model.functions.values())
    return proto
