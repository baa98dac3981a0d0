"""Compiled If/Loop/Scan bodies: the body plan, its captured outer values, its counters,
and per-signature specialised plans (onnxkiln.specialize) as for the main graph: a Loop
body run with the same input shapes a second time gets its own specialised plan (unless the
session's option specialize=0 keeps every plan generic).

A body runs hooked when the run in progress on its thread is traced, cancellable (a cancel
event or a timeout) or memory-tracked; memory tracking gives it its own MemoryTracker on
top of the enclosing one (onnxkiln.memory), on the generic plan."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxkiln import sizes
from onnxkiln.dtypes import DataType
from onnxkiln.executor import CancelHook, CompiledPlan, cancelled, combine_hooks, current_cancel
from onnxkiln.memory import MemoryPlan, MemoryTracker, current_tracker, set_tracker
from onnxkiln.specialize import PlanSpecializer, Specialization
from onnxkiln.trace import active_context

__all__ = ["SubgraphRunner"]

MAX_SIGNATURES = 64  # specialisations kept per body (the oldest goes first)


class SubgraphRunner:
    """A compiled If/Loop/Scan body: picks its captured values and counts builds and runs."""

    def __init__(self, compiled: CompiledPlan, capture_index: tuple[int, ...], graph, label: str,
                 stats, specialize: bool = True) -> None:
        self._compiled = compiled
        self._specializer = PlanSpecializer(compiled, graph) if specialize else None
        self._entries: dict[tuple, Specialization] = {}
        self._index = capture_index
        self._stats = stats
        self._seen: set[tuple] = set()
        self.label = label
        self.input_names = tuple(v.name for v in graph.inputs)
        self.output_names = tuple(v.name for v in graph.outputs)
        self.output_dtypes = tuple(_declared_dtype(v) for v in graph.outputs)
        self.output_shapes = tuple(_declared_shape(v) for v in graph.outputs)
        self.output_may_alias = tuple(compiled.plan.output_may_alias)
        self._graph = graph
        self._memory: tuple[MemoryPlan, dict[int, Any]] | None = None  # on first tracked run

    def __call__(self, inputs: Sequence[Any], captured: Sequence[Any]) -> list[Any]:
        """Run the body on its formal inputs plus the captured outer values."""
        if len(inputs) != len(self.input_names):  # a kernel error naming the calling node
            raise ValueError(
                f"subgraph '{self.label}' declares {len(self.input_names)} input(s) "
                f"{list(self.input_names)} but its node passes {len(inputs)}"
            )
        values = [*inputs, *(captured[i] for i in self._index)]
        signature = tuple(_signature(v) for v in values)
        if signature[:len(inputs)] not in self._seen:
            self._seen.add(signature[:len(inputs)])
            self._stats.builds += 1
        self._stats.runs += 1
        ctx = active_context()
        cancel = current_cancel()
        outer = current_tracker()
        if cancel is None and outer is None:
            if ctx is None:
                return self._run(values, signature)
            return self._compiled.traced(values, ctx, self.label)
        stop = None
        if cancel is not None:
            if cancel.is_set():  # checked per body run: a Loop with an empty body still stops
                raise cancelled(self.label, event=cancel)
            stop = CancelHook(cancel, self._compiled.plan, self.label)
        tracer = None if ctx is None else self._compiled.tracer(ctx, self.label)
        if outer is None:
            return self._compiled.hooked(values, combine_hooks(stop, tracer))
        tracker = self._tracker(outer, values, len(inputs))
        previous = set_tracker(tracker)
        try:
            outputs = self._compiled.hooked(values, combine_hooks(stop, tracer, tracker))
        finally:
            set_tracker(previous)
        outer.inner_peak(tracker.peak)
        return outputs

    def _tracker(self, outer: MemoryTracker, values: list[Any], counted: int) -> MemoryTracker:
        """A tracker for one body run on top of what the enclosing run holds."""
        if self._memory is None:
            plan = self._compiled.plan
            self._memory = (MemoryPlan(plan, self._compiled.donations),
                            sizes.predictors(plan.steps, self._graph))
        mplan, predictors = self._memory
        return MemoryTracker(mplan, outer.limit, values, predictors, base=outer.outside(),
                             counted=counted, graph=self.label)


    def _run(self, values: list[Any], signature: tuple) -> list[Any]:
        """The body's specialised plan for this signature once it has one (built on the
        signature's second run), else the generic plan."""
        if self._specializer is None:
            return self._compiled(values)
        entry = self._entries.get(signature)
        if entry is None:
            if len(self._entries) >= MAX_SIGNATURES:
                self._entries.pop(next(iter(self._entries)))
            self._entries[signature] = Specialization(signature)
            return self._compiled(values)
        compiled = entry.compiled
        if compiled is not None:
            outputs = compiled(values)
            for i, copy in enumerate(entry.copy_outputs):  # folded constants among them
                if copy and not self.output_may_alias[i] and isinstance(outputs[i], np.ndarray):
                    outputs[i] = outputs[i].copy()
            return outputs
        if entry.building:
            return self._compiled(values)
        entry.building = True
        outputs, recorder = self._specializer.record(values)
        self._specializer.build(recorder, entry)
        return outputs


def _declared_dtype(value) -> DataType | None:
    try:
        return DataType(value.dtype) if value.dtype is not None else None
    except ValueError:
        return None


def _declared_shape(value) -> tuple[int | str | None, ...] | None:
    if value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else d.value for d in value.shape)


def _signature(value: Any) -> Any:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return (getattr(value, "dtype", None), shape)
    if isinstance(value, list):
        return ("seq", len(value))
    return type(value)
