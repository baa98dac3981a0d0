"""Memory planning: in-place donation of dying buffers, and live-byte accounting.

In-place: `plan_donations` picks, per step whose kernel declares `inplace` input positions
(see `inplace_positions`), a dying input whose buffer the kernel may write its result into.
The static check: the value is produced by a non-view step of this plan (not a graph input,
output, initializer or constant, nor a captured outer value), this step is its last use,
it is read once by the step, and no view of it (Reshape, Squeeze...) is still live or read
by the same step. The executor adds a runtime guard (an ndarray owning its data whose only
references are the executor's own, see executor.py) and the kernel falls back to a fresh
buffer when the donated one does not fit (broadcasting, dtype, read-only).

Accounting for `SessionBuilder.memory_limit` / `memory.track`:

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
from onnxkiln.skeleton import skeleton

__all__ = [
    "MemoryPlan",
    "MemoryTracker",
    "PeakPlanner",
    "ShapeOracle",
    "inplace_positions",
    "plan_donations",
    "simulate",
    "value_bytes",
]

_SMALL_BYTES = 16384  # initializers up to this size stay in the shape-inference copy


def value_bytes(value: Any) -> int:
    """Bytes held by a runtime value: arrays, sequences of arrays, scalars."""
    if isinstance(value, np.ndarray | np.generic):
        return int(value.nbytes)
    if isinstance(value, list | tuple):
        return sum(value_bytes(v) for v in value)
    return 0


def inplace_positions(step: Step) -> tuple[int, ...]:
    """Input positions whose buffer the step's kernel may write its result into when the
    executor passes it as `out=` (`KernelSpec.inplace`)."""
    return step.spec.inplace


def plan_donations(plan: Plan) -> dict[int, tuple[int, int]]:
    """Step index -> (input position, slot) of the dying input it may overwrite.

    Only single-output steps whose kernel declares in-place positions; the first
    position whose value passes the static check (module docstring) wins.
    """
    excluded = set(plan.input_slots) | set(plan.constants) | set(plan.output_slots)
    root: dict[int, int] = {}  # slot -> the slot owning its storage (itself unless a view)
    members: dict[int, list[int]] = {}
    for step in plan.steps:
        source = _view_source(step)
        for s in step.outputs:
            if s is None or s in root:
                continue
            r = s if source is None else root.get(source, source)
            root[s] = r
            members.setdefault(r, []).append(s)
    never = len(plan.steps)
    donations: dict[int, tuple[int, int]] = {}
    for i, step in enumerate(plan.steps):
        positions = inplace_positions(step)
        if (not positions or step.spec.multi_output or not step.outputs
                or step.outputs[0] is None):
            continue
        for p in positions:
            s = step.inputs[p] if p < len(step.inputs) else None
            if (s is None or s in excluded or root.get(s) != s
                    or plan.last_use.get(s) != i or step.inputs.count(s) != 1):
                continue
            group = members[s]
            if any(m in excluded or plan.last_use.get(m, never) > i for m in group):
                continue
            if any(root.get(t) == s for t in step.inputs if t is not None and t != s):
                continue
            donations[i] = (p, s)
            break
    return donations


class MemoryPlan:
    """Per step: the slots it writes and the slots that die after it; view aliasing and
    the in-place donations the executor makes (`donated[i]`: (position, slot) or None)."""

    def __init__(self, plan: Plan, donations: dict[int, tuple[int, int]] | None = None
                 ) -> None:
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
        donations = plan_donations(plan) if donations is None else donations
        self.donated = [donations.get(i) for i in range(len(plan.steps))]


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


def simulate(mplan: MemoryPlan, sizes: dict[int, int | None], limit: int | float) -> int:
    """Walk the plan with known sizes (unknown count 0); raise at the first crossing.

    Returns the predicted peak, a lower bound when some sizes are unknown. A donated
    input of the same size as the output, at least MIN_DONATE_BYTES, is assumed reused
    (the runtime guard may still refuse it, e.g. when a kernel keeps a reference).
    """
    from onnxkiln.executor import MIN_DONATE_BYTES as min_donate  # executor imports us

    ledger = _Ledger()
    for s in mplan.inputs:
        ledger.own(s, sizes.get(s) or 0)
    ledger.peak = ledger.live
    for s in mplan.dead_before:
        ledger.release(s)
    for i, step in enumerate(mplan.plan.steps):
        before = ledger.live
        out_sizes = [sizes.get(s) or 0 for s in mplan.outputs[i]]
        donated = mplan.donated[i]
        reused = (donated is not None and bool(out_sizes) and out_sizes[0] >= min_donate
                  and out_sizes[0] > 0 and sizes.get(donated[1]) == out_sizes[0])
        _produce(ledger, mplan, i, out_sizes, reused)
        if ledger.live > limit:
            raise _limit_error(step, before, ledger.live - before, limit,
                               "predicted from shape inference before running")
        ledger.peak = max(ledger.peak, ledger.live)
        for s in mplan.dead_after[i]:
            ledger.release(s)
    return ledger.peak


def _produce(ledger: _Ledger, mplan: MemoryPlan, i: int, nbytes: Sequence[int],
             reused: bool = False) -> None:
    outputs = mplan.outputs[i]
    if reused and ledger.alias(outputs[0], mplan.donated[i][1]):  # type: ignore[index]
        return  # written into the dying input's buffer: no new bytes
    source = mplan.view_of[i]
    for s, n in zip(outputs, nbytes):
        if source is None or not ledger.alias(s, source):
            ledger.own(s, n)


class MemoryTracker:
    """Executor hooks for one run: observed live bytes, checked as each kernel returns."""

    __slots__ = ("_ledger", "_limit", "_mplan", "_predictors", "reuses", "sizes")

    def __init__(self, mplan: MemoryPlan, limit: int | float, inputs: Sequence[Any],
                 predictors: dict[int, Any] | None = None) -> None:
        self._mplan = mplan
        self._limit = limit
        self._predictors = predictors or {}
        self._ledger = _Ledger()
        self.reuses = 0  # steps whose output was written into their donated input
        self.sizes: dict[int, int] = {}  # bytes of each value produced, by slot
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

    def sizing(self, index: int, ins: tuple) -> None:
        """Refuse a step whose outputs, sized from its input values (onnxkiln.sizes), would
        cross the limit: before its kernel allocates anything."""
        predict = self._predictors.get(index)
        if predict is None:
            return
        try:
            nbytes = predict(ins)
        except Exception:  # malformed inputs: the kernel itself reports them
            return
        live = self._ledger.live
        if nbytes is not None and live + nbytes > self._limit:
            raise _limit_error(self._mplan.plan.steps[index], live, nbytes, self._limit,
                               "predicted from its input values before running")

    def start(self, index: int) -> int:
        return index

    def finish(self, index: int, ins: tuple, outs: tuple) -> None:
        ledger = self._ledger
        before = ledger.live
        donated = self._mplan.donated[index]
        reused = donated is not None and bool(outs) and outs[0] is ins[donated[0]]
        if reused:
            self.reuses += 1
        nbytes = [value_bytes(v) for v in outs]
        self.sizes.update(zip(self._mplan.outputs[index], nbytes))
        _produce(ledger, self._mplan, index, nbytes, reused)
        if ledger.live > self._limit:
            step = self._mplan.plan.steps[index]
            raise _limit_error(step, before, ledger.live - before, self._limit,
                               "observed after the kernel returned: its output size "
                               "could not be inferred before running")
        if ledger.live > ledger.peak:
            ledger.peak = ledger.live
        for s in self._mplan.dead_after[index]:
            ledger.release(s)


class PeakPlanner:
    """Planned peak live bytes per input signature: `simulate` over value sizes from onnx
    shape inference, completed by the sizes a tracked run of the signature observed
    (inference knows nothing of custom-domain ops such as the optimizer's fusions).
    Computed on demand and cached: `memory_stats()` costs nothing until asked for."""

    def __init__(self, model: ir.Model, mplan: MemoryPlan) -> None:
        self._model = model
        self._mplan = mplan
        self._oracle: ShapeOracle | None = None
        self._inferred: dict[Hashable, dict[int, int | None]] = {}
        self._observed: dict[Hashable, dict[int, int]] = {}
        self._peaks: dict[Hashable, int] = {}

    def observe(self, signature: Hashable, sizes: dict[int, int]) -> None:
        """Value sizes a tracked run with this signature measured."""
        self._observed[signature] = sizes
        self._peaks.pop(signature, None)

    def peak(self, signature: Hashable) -> int:
        """Predicted peak for this signature (a lower bound while sizes are unknown)."""
        found = self._peaks.get(signature)
        if found is None:
            sizes = dict(self._infer(signature))
            for s, n in self._observed.get(signature, {}).items():
                if sizes.get(s) is None:
                    sizes[s] = n
            found = self._peaks[signature] = simulate(self._mplan, sizes, math.inf)
        return found

    def _infer(self, signature: Hashable) -> dict[int, int | None]:
        found = self._inferred.get(signature)
        if found is None:
            try:
                if self._oracle is None:
                    self._oracle = ShapeOracle(self._model, self._mplan.plan)
                found = self._oracle.sizes(signature)  # type: ignore[arg-type]
            except Exception:  # advisory: unknown sizes count 0
                found = {}
            self._inferred[signature] = found
        return found


class ShapeOracle:
    """Value sizes by onnx shape inference with concrete input shapes.

    Keeps one copy of the model without its large initializers (they become typed
    inputs), so each new signature costs one inference, not a copy of the weights.
    """

    def __init__(self, model: ir.Model, plan: Plan) -> None:
        self._plan = plan
        self._proto: onnx.ModelProto | None = skeleton(model, _SMALL_BYTES)
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
