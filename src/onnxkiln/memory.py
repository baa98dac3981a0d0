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
(resident since load) and kernel scratch space, except where onnxkiln.sizes predicts it.
A view op's output (Reshape, Squeeze, ...) shares its input's bytes, which stay live until
both are dead; a sequence shares the tensors it got from an input sequence.

If/Loop/Scan bodies are tracked too: a body run gets its own tracker over its plan whose
`base` is what the enclosing run holds (its live values plus what the control-flow kernel
accumulated: Loop and Scan outputs stacked so far), so a body node is refused as a
top-level one is. Between iterations the kernel reports its accumulated outputs and
carried values (`hold`), checked against the limit before the next iteration and before
it stacks them. The tracker of the step running on this thread is `current_tracker()`.

Two checks use the same lifetimes. At specialisation build, onnx shape inference with the
run's concrete input shapes sizes every value it can, and a simulation raises
`MemoryLimitError` naming the first node whose outputs would cross the limit, before
anything runs. Values whose size depends on data are checked as the kernel returns.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxkiln import onnx_guard
from onnxkiln.errors import MemoryLimitError
from onnxkiln.plan import Plan, Step
from onnxkiln.skeleton import skeleton

__all__ = [
    "MemoryPlan",
    "MemoryTracker",
    "PeakPlanner",
    "ShapeOracle",
    "current_tracker",
    "inplace_positions",
    "plan_donations",
    "set_tracker",
    "simulate",
    "tracking",
    "value_bytes",
]

_SMALL_BYTES = 16384  # initializers up to this size stay in the shape-inference copy


_active = threading.local()  # .tracker: the MemoryTracker of the step running on this thread


def value_bytes(value: Any) -> int:
    """Bytes held by a runtime value: arrays, sequences of arrays (each array once), scalars."""
    if isinstance(value, np.ndarray | np.generic):
        return int(value.nbytes)
    if isinstance(value, list | tuple):
        return sum(value_bytes(v) for v in {id(v): v for v in value}.values())
    return 0


def current_tracker() -> MemoryTracker | None:
    """The tracker of the run in progress on this thread (None: no memory tracking)."""
    return getattr(_active, "tracker", None)


def set_tracker(tracker: MemoryTracker | None) -> MemoryTracker | None:
    """Make `tracker` this thread's `current_tracker()`; returns the previous one."""
    previous = getattr(_active, "tracker", None)
    _active.tracker = tracker
    return previous


@contextlib.contextmanager
def tracking(tracker: MemoryTracker | None) -> Iterator[None]:
    """Make `tracker` this thread's `current_tracker()` for the block."""
    previous = set_tracker(tracker)
    try:
        yield
    finally:
        set_tracker(previous)


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
        self.pins: dict[int, list[int]] = {}  # slot -> other storages it keeps alive

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

    def pin(self, slot: int, source: int) -> None:
        """`slot` (a sequence) also holds the storage of `source` (tensors it shares)."""
        storage = self.owner.get(source)
        if storage is not None and slot in self.owner:
            self.refs[storage] += 1
            self.pins.setdefault(slot, []).append(storage)

    def release(self, slot: int) -> None:
        storage = self.owner.pop(slot, None)
        if storage is None:
            return
        for held in (storage, *self.pins.pop(slot, ())):
            self.refs[held] -= 1
            if self.refs[held] == 0:
                del self.refs[held]
                self.live -= self.size.pop(held)


def _limit_error(step: Step, before: int, out_bytes: int, limit: int, when: str,
                 graph: str = "main", what: str = "outputs") -> Exception:
    where = "" if graph == "main" else f" in subgraph '{graph}'"
    err = MemoryLimitError(
        f"memory limit exceeded at node '{step.name}' ({step.domain or 'ai.onnx'}::"
        f"{step.op_type}, node id {step.node_id}){where}: {before:,} bytes live plus "
        f"{out_bytes:,} bytes of {what} = {before + out_bytes:,} > limit {limit:,} bytes "
        f"({when}). Raise memory_limit(...) or run with smaller inputs."
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
    """Executor hooks for one run of a plan: observed live bytes, checked against the limit
    before each sized step (onnxkiln.sizes) and as each kernel returns.

    `base`: bytes held outside this plan (a body's enclosing run). `counted`: how many of
    the leading input slots hold values of this run (a body's captured outer values are
    the enclosing run's, counted there).
    """

    __slots__ = ("_base", "_graph", "_index", "_inner_peak", "_ledger", "_limit", "_mplan",
                 "_predictors", "held", "reuses", "sizes")

    def __init__(self, mplan: MemoryPlan, limit: int | float, inputs: Sequence[Any],
                 predictors: dict[int, Any] | None = None, base: int = 0,
                 counted: int | None = None, graph: str = "main") -> None:
        self._mplan = mplan
        self._limit = limit
        self._predictors = predictors or {}
        self._base = base
        self._graph = graph
        self._index = -1
        self._inner_peak = 0
        self.held = 0  # bytes the running control-flow kernel holds outside any ledger
        self._ledger = _Ledger()
        self.reuses = 0  # steps whose output was written into their donated input
        self.sizes: dict[int, int] = {}  # bytes of each value produced, by slot
        slots = mplan.plan.input_slots
        by_slot = dict(zip(slots if counted is None else slots[:counted], inputs))
        for s in mplan.inputs:
            self._ledger.own(s, value_bytes(by_slot.get(s)))
        self._ledger.peak = self._ledger.live
        for s in mplan.dead_before:
            self._ledger.release(s)

    @property
    def peak(self) -> int:
        """The largest number of live bytes seen so far, bodies' included."""
        return max(self._base + self._ledger.peak, self._inner_peak)

    @property
    def limit(self) -> int | float:
        return self._limit

    def outside(self) -> int:
        """Bytes a body run started now finds held outside it."""
        return self._base + self._ledger.live + self.held

    def inner_peak(self, nbytes: int) -> None:
        """A body run's peak (its base included)."""
        if nbytes > self._inner_peak:
            self._inner_peak = nbytes

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
        if nbytes is None:
            return
        donated = self._mplan.donated[index]
        if donated is not None:  # assumed written into the dying input, as `simulate` does
            x = ins[donated[0]]
            if isinstance(x, np.ndarray) and x.nbytes == nbytes:
                return
        live = self._base + self._ledger.live
        if live + nbytes > self._limit:
            raise _limit_error(self._mplan.plan.steps[index], live, nbytes, self._limit,
                               "predicted from its input values before running", self._graph)

    def start(self, index: int) -> int:
        self._index = index
        self.held = 0
        return index

    def hold(self, kept: int, transient: int, what: str) -> None:
        """A control-flow kernel of the running step keeps `kept` bytes (stacked outputs so
        far) and is about to hold `transient` more (carried values, a stacked copy): refuse
        now if that crosses the limit, else count `kept` as held."""
        live = self._base + self._ledger.live
        if live + kept + transient > self._limit:
            step = self._mplan.plan.steps[self._index]
            raise _limit_error(step, live, kept + transient, self._limit,
                               "checked between iterations", self._graph, what)
        self.held = kept
        self.inner_peak(live + kept + transient)

    def finish(self, index: int, ins: tuple, outs: tuple) -> None:
        ledger = self._ledger
        self.held = 0
        before = ledger.live
        donated = self._mplan.donated[index]
        reused = donated is not None and bool(outs) and outs[0] is ins[donated[0]]
        if reused:
            self.reuses += 1
        nbytes = [v.nbytes if type(v) is np.ndarray else value_bytes(v) for v in outs]
        shares = None
        for k, v in enumerate(outs):  # a sequence's tensors taken from an input sequence
            if type(v) is list:  # stay counted with that input (pinned below)
                shares = shares or {}
                shares[k], common = _shared_sequences(v, ins)
                nbytes[k] -= common
        slots = self._mplan.outputs[index]
        self.sizes.update(zip(slots, nbytes))
        _produce(ledger, self._mplan, index, nbytes, reused)
        step = self._mplan.plan.steps[index]
        for k, shared in (shares or {}).items():
            for j in shared:
                ledger.pin(slots[k], step.inputs[j])
        if self._base + ledger.live > self._limit:
            raise _limit_error(step, self._base + before, ledger.live - before, self._limit,
                               "observed after the kernel returned: its output size "
                               "could not be predicted before running", self._graph)
        if ledger.live > ledger.peak:
            ledger.peak = ledger.live
        for s in self._mplan.dead_after[index]:
            ledger.release(s)


def _shared_sequences(out: list, ins: tuple) -> tuple[tuple[int, ...], int]:
    """Positions of the input sequences sharing tensors with the sequence `out`, and the
    bytes of the tensors shared."""
    ids = {id(t): t for t in out}
    positions, common = [], {}
    for j, v in enumerate(ins):
        if type(v) is list and v is not out:
            shared = [t for t in v if id(t) in ids]
            if shared:
                positions.append(j)
                common.update((id(t), t) for t in shared)
    return tuple(positions), value_bytes(list(common.values()))


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
            onnx_guard.check_model(self._proto)  # missing required input); the checker
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
            inferred = onnx_guard.infer_shapes(proto, data_prop=True)
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
