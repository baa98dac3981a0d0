"""Specialisations: what a run needs for one input signature (dtypes and shapes).

The first run of a signature runs the generic plan. When the signature comes back, one
recording run notes every step's input dtypes and shapes and the values that follow from
the signature alone (shape arithmetic: Shape, Gather, Concat, Range ... of static shapes);
the specialisation built from it is a plan of its own in which

- those values are constants and the steps computing them are gone, their uploads too: a
  device kernel reading shape arithmetic done on the host (position ids, a mask made from
  shapes) reads a device constant, uploaded once when the specialisation is built;
- every kernel exposing `specialize(dtypes, shapes, consts)` is replaced by the callable it
  returns for exactly those inputs (im2col geometry, chosen variant and thread split,
  reshape targets: no per-call shape work); `consts[i]` is input i's value when the
  signature fixes it, else None;
- a step whose input shapes can still change between runs of the signature (they follow
  data: NonZero, a Reshape to a computed shape, control flow) keeps a guard: its recorded
  shapes are checked first and the generic kernel runs when they differ.

`warmup()` builds them at once. Kernels keep no shape-keyed caches of their own (at most
the last call's shape arithmetic, which a decode loop meets again every step).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxkiln.capture import NONDETERMINISTIC, VALUE_SHAPED, has_subgraphs
from onnxkiln.executor import CompiledPlan, Guard
from onnxkiln.plan import Plan, Step, lifetimes
from onnxkiln.providers.base import CaptureSupport
from onnxkiln.types import CacheStats

__all__ = ["PlanSpecializer", "SignatureFacts", "Specialization", "SpecializationCache",
           "signature_facts", "specialized_kernel"]

logger = logging.getLogger(__name__)

# contrib ops whose output shapes follow their input shapes (and attributes) only
_SHAPE_FOLLOWS_SHAPES = frozenset({
    ("com.microsoft", op) for op in (
        "FusedConv", "FusedGemm", "FusedMatMul", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
        "LayerNormalization", "BiasGelu", "FastGelu", "Gelu", "QuickGelu", "BiasAdd",
        "BiasSplitGelu", "MatMulNBits", "RotaryEmbedding", "MultiHeadAttention", "Attention",
        "EmbedLayerNormalization", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
        "QLinearGlobalAveragePool", "QLinearConcat", "QLinearLeakyRelu", "QLinearAveragePool",
        "QLinearWhere", "QLinearSoftmax", "QGemm", "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat", "QuantizeLinear", "DequantizeLinear", "GatherBlockQuantized",
        "Inverse")
})
_SHAPE_OF = frozenset({"Shape", "Size"})
FOLD_MAX_BYTES = 1 << 20
"""A value the signature fixes is kept as a constant up to this size (larger ones are
still computed per run): shape arithmetic is tiny, masks built from shapes may not be."""
FOLD_BUDGET_BYTES = 16 << 20  # per specialisation


@dataclass(frozen=True)
class SignatureFacts:
    """Per plan: `static[i]` step i's outputs are fixed by the input signature; `varying`:
    slots whose shape can change between runs of one signature."""

    static: tuple[bool, ...]
    varying: frozenset[int]


def signature_facts(plan: Plan, graph: ir.Graph | None,
                    varying_inputs: frozenset[int] = frozenset(),
                    live: frozenset[int] = frozenset()) -> SignatureFacts:
    """Which steps the input signature decides, and which shapes follow data.

    `varying_inputs`: input slots whose shape may change between runs (a decode memo's
    growing lengths); `live`: constants whose contents may change (views of persistent
    buffers): neither is ever folded."""
    static: set[int] = set(plan.constants) - live
    varying: set[int] = set(varying_inputs)
    per_step: list[bool] = []
    nodes = list(graph) if graph is not None else []  # graph.node(i) walks the list each time
    for step in plan.steps:
        ins = [s for s in step.inputs if s is not None]
        outs = [s for s in step.outputs if s is not None]
        is_static = _is_static(step, ins, static, varying)
        per_step.append(is_static)
        if is_static:
            static.update(outs)
        elif any(s in varying for s in ins) or _shape_follows_data(step, nodes, static):
            varying.update(outs)
    return SignatureFacts(tuple(per_step), frozenset(varying))


def _is_static(step: Step, ins: list[int], static: set[int], varying: set[int]) -> bool:
    if step.op_type in NONDETERMINISTIC:
        return False
    if step.domain == "" and step.op_type in _SHAPE_OF and ins:
        return ins[0] not in varying
    return all(s in static for s in ins)


def _shape_follows_data(step: Step, nodes: list[ir.Node], static: set[int]) -> bool:
    """Whether the step's output shapes may follow the contents of a non-static input."""
    if 0 <= step.node_id < len(nodes) and has_subgraphs(nodes[step.node_id]):
        return True
    if step.spec.capture is CaptureSupport.DATA_DEPENDENT_SHAPE:
        return True
    if step.domain == "":
        positions = VALUE_SHAPED.get(step.op_type, ())
        if positions is None:
            positions = range(len(step.inputs))
        return any(i < len(step.inputs) and step.inputs[i] is not None
                   and step.inputs[i] not in static for i in positions)
    return step.domain != "onnxkiln" and (step.domain, step.op_type) not in _SHAPE_FOLLOWS_SHAPES


@dataclass
class Specialization:
    """Shape-dependent state of one input signature.

    `compiled`: the plan specialised for it (None until the signature is seen again, or
    when nothing could be specialised: the generic plan runs), `copy_outputs` its output
    copy flags. With a memory limit, building one runs shape inference and the lifetime
    simulation (`predicted_peak` bytes, a lower bound when some sizes depend on data) and
    refuses signatures that cannot fit.
    """

    signature: Hashable
    predicted_peak: int | None = None
    compiled: CompiledPlan | None = None
    copy_outputs: tuple[bool, ...] = ()
    sightings: int = 1
    building: bool = False
    kernels: int = 0  # steps running a specialised kernel
    folded: int = 0  # steps whose values became constants


class SpecializationCache:
    """Maps an input signature to its Specialization, counting hits, misses, evictions.

    A miss builds with `build(signature)`; when that raises (a memory limit), the miss
    is counted and nothing is stored. Eviction drops the oldest entry.
    """

    def __init__(self, build: Callable[[Hashable], Specialization],
                 max_entries: int = 256) -> None:
        self._build = build
        self._entries: dict[Hashable, Specialization] = {}
        self._max = max_entries
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()
        self.last_signature: Hashable | None = None  # of the latest get(), for memory_stats

    def get(self, signature: Hashable) -> Specialization:
        """The specialisation for this signature, built on first sight."""
        self.last_signature = signature
        found = self._entries.get(signature)
        if found is not None:
            self._hits += 1
            found.sightings += 1
            return found
        with self._lock:
            found = self._entries.get(signature)
            if found is not None:  # another thread built it meanwhile
                self._hits += 1
                found.sightings += 1
                return found
            self._misses += 1
            built = self._build(signature)
            if len(self._entries) >= self._max:
                self._entries.pop(next(iter(self._entries)))
                self._evictions += 1
            self._entries[signature] = built
        return built

    def claim_build(self, entry: Specialization) -> bool:
        """Whether the caller should build `entry`'s specialised plan now (once, one thread)."""
        if entry.compiled is not None or entry.building:
            return False
        with self._lock:
            if entry.compiled is not None or entry.building:
                return False
            entry.building = True
            return True

    def specialised(self) -> int:
        """Entries holding a specialised plan."""
        return sum(1 for e in list(self._entries.values()) if e.compiled is not None)

    def stats(self) -> CacheStats:
        """Entries, hits, misses and evictions so far."""
        return CacheStats(len(self._entries), self._hits, self._misses, self._evictions)


class _Recorder:
    """Step hooks of a recording run: input dtypes/shapes per step, copies of the values
    the signature fixes."""

    __slots__ = ("budget", "facts", "folded", "inputs", "plan")

    def __init__(self, plan: Plan, facts: SignatureFacts) -> None:
        self.plan = plan
        self.facts = facts
        self.inputs: dict[int, tuple[tuple, tuple]] = {}
        self.folded: dict[int, Any] = {}
        self.budget = FOLD_BUDGET_BYTES

    def sizing(self, index: int, ins: tuple) -> None:
        pass

    def start(self, index: int) -> int:
        return index

    def finish(self, index: int, ins: tuple, outs: tuple) -> None:
        self.inputs[index] = (tuple(getattr(v, "dtype", None) for v in ins),
                              tuple(v.shape if isinstance(v, np.ndarray) else None for v in ins))
        if not self.facts.static[index]:
            return
        step = self.plan.steps[index]
        written = [s for s in (step.outputs if step.spec.multi_output else step.outputs[:1])
                   if s is not None]
        if len(written) != len(outs) or not all(_foldable(v) for v in outs):
            return
        size = sum(_nbytes(v) for v in outs)
        if size > self.budget:
            return
        self.budget -= size
        for s, v in zip(written, outs):
            self.folded[s] = _frozen_copy(v)


def _foldable(v: Any) -> bool:
    """A host array or a device tensor (the torch provider's) small enough to keep."""
    if isinstance(v, np.ndarray | np.generic):
        return v.dtype.kind != "O" and v.nbytes <= FOLD_MAX_BYTES
    return _is_device_tensor(v) and _nbytes(v) <= FOLD_MAX_BYTES


def _is_device_tensor(v: Any) -> bool:
    torch = sys.modules.get("torch")  # a device value exists only once torch is imported
    return (torch is not None and isinstance(v, torch.Tensor) and not v.requires_grad
            and v.layout == torch.strided)


def _nbytes(v: Any) -> int:
    if isinstance(v, np.ndarray | np.generic):
        return int(v.nbytes)
    return int(v.numel()) * int(v.element_size())


def _frozen_copy(v: Any) -> Any:
    """A copy no later run can write into: read-only for arrays; a device tensor's clone
    (a constant is never donated to a kernel, and nothing else holds the clone)."""
    if not isinstance(v, np.ndarray | np.generic):
        return v.detach().clone()
    c = np.array(v, copy=True)
    c.flags.writeable = False
    return c


class PlanSpecializer:
    """Builds the specialised plans of one compiled plan (module docstring)."""

    def __init__(self, compiled: CompiledPlan, graph: ir.Graph | None,
                 varying_inputs: frozenset[int] = frozenset(),
                 live: frozenset[int] = frozenset()) -> None:
        self.compiled = compiled
        self.live = live  # constants no kernel may bake in (their contents change)
        self.facts = signature_facts(compiled.plan, graph, varying_inputs, live)

    def recorder(self) -> _Recorder:
        """Step hooks recording what a specialisation needs, for a run of the generic plan."""
        return _Recorder(self.compiled.plan, self.facts)

    def record(self, values: Sequence[Any]) -> tuple[list[Any], _Recorder]:
        """Run the generic plan once, recording what a specialisation needs."""
        recorder = self.recorder()
        return self.compiled.hooked(values, recorder), recorder

    def build(self, recorder: _Recorder, entry: Specialization) -> None:
        """Fill `entry` with the plan specialised from `recorder`'s run."""
        plan = self.compiled.plan
        folded = recorder.folded
        constants = {**plan.constants, **folded}
        fixed = {s: v for s, v in constants.items() if s not in self.live}
        steps: list[Step] = []
        guards: dict[int, Guard] = {}
        kernels = 0
        for i, step in enumerate(plan.steps):
            if self.facts.static[i] and all(s in folded for s in _written(step)):
                continue
            seen = recorder.inputs.get(i)
            special = None if seen is None else specialized_kernel(step, seen, fixed)
            if special is not None:
                shapes = tuple((s, shape) for s, shape in zip(step.inputs, seen[1])
                               if s is not None and s in self.facts.varying and shape is not None)
                if shapes:
                    guards[len(steps)] = Guard(step.kernel, shapes)
                step = dataclasses.replace(step, kernel=special)
                kernels += 1
            steps.append(step)
        external = set(plan.input_slots) | set(constants)
        for step in steps:  # views of inputs and constants may reach an output
            if step.spec.view and step.inputs and step.inputs[0] in external:
                external.update(s for s in step.outputs if s is not None)
        special_plan = Plan(steps, plan.slot_names, plan.input_slots, plan.input_defaults,
                            plan.output_slots, constants,
                            lifetimes(steps, plan.input_slots, plan.output_slots, constants),
                            [s in external for s in plan.output_slots])
        entry.compiled = CompiledPlan(special_plan, inplace=self.compiled.inplace,
                                      guards=guards)
        entry.copy_outputs = tuple(special_plan.output_may_alias)
        entry.kernels, entry.folded = kernels, len(plan.steps) - len(steps)


def _written(step: Step) -> list[int]:
    return [s for s in (step.outputs if step.spec.multi_output else step.outputs[:1])
            if s is not None]


def specialized_kernel(step: Step, seen: tuple[tuple, tuple], constants: dict[int, Any]):
    """The kernel's specialised callable for the recorded inputs, or None."""
    specialize = getattr(step.kernel, "specialize", None)
    if specialize is None and step.spec.specialize is not None:
        specialize = functools.partial(step.spec.specialize, step.kernel)
    if specialize is None:
        return None
    dtypes, shapes = seen
    consts = tuple(None if s is None else constants.get(s) for s in step.inputs)
    try:
        return specialize(dtypes, shapes, consts)
    except Exception:  # a kernel that cannot specialise these inputs keeps its generic path
        logger.debug("specialize failed for node '%s'", step.name, exc_info=True)
        return None
