"""Recording a bound decode step and replaying it.

A capture runs the step once, eagerly, keeping every value. The plan is then cut into
parts in order: captured segments (runs of recorded steps) and seams (runs of steps the
audit in onnxkiln.capture sent back to eager execution). Static steps are gone: their values
from the capture run are constants of the parts that read them.

- On the host a captured segment is a pre-bound replay list: generated straight-line code
  over the segment's steps, no validation, no registry lookup, and every elementwise step
  writing into the buffer it produced at capture (`out=`), so a replay allocates nothing
  for those steps. Index kernels are swapped for capture-safe ones that clamp and flag.
- On CUDA each segment is a torch CUDA graph recorded in one private memory pool after a
  warm-up on a side stream; values that a seam hands to a segment are copied into the
  segment's static inputs before its replay.

A replay checks the bindings, runs the parts, and writes bound outputs. When a value
entering a segment has another shape than at capture, or an If picked the other branch,
the rest of the step runs eagerly (its outputs stay correct) and the graph is retired.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxkiln.capture import Audit
from onnxkiln.errors import CaptureError, SessionError
from onnxkiln.executor import CompiledPlan
from onnxkiln.plan import Plan, Step, lifetimes
from onnxkiln.providers.base import KernelSpec
from onnxkiln.specialize import specialized_kernel
from onnxkiln.trace import TraceContext

__all__ = ["HostReplay", "LazyPlan", "Part", "Recorder", "build_parts", "run_parts"]


class Recorder:
    """Step hooks keeping each step's output values by slot (or only their shapes)."""

    __slots__ = ("_outs", "shapes_only", "values")

    def __init__(self, plan: Plan, shapes_only: bool = False) -> None:
        self.values: dict[int, Any] = {}
        self.shapes_only = shapes_only
        self._outs = [[s for s in (st.outputs if st.spec.multi_output else st.outputs[:1])
                       if s is not None] for st in plan.steps]

    def sizing(self, index: int, ins: tuple) -> None:
        pass

    def start(self, index: int) -> int:
        return index

    def finish(self, index: int, ins: tuple, outs: tuple) -> None:
        for s, v in zip(self._outs[index], outs):
            self.values[s] = _shape(v) if self.shapes_only else v


def _shape(value: Any) -> Any:
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else type(value)


@dataclass
class Part:
    """A run of plan steps replayed together: `captured` ones recorded, seams eager.

    `run(args)` takes the values of `entry` slots and returns those of `exit`; `eager` is
    the plain version of a captured part (taken once a replay retires the graph).
    `guards`: entry positions and the shapes they had at capture. `branches`: If steps'
    condition slots and the branch taken at capture.
    """

    captured: bool
    steps: list[int]
    entry: list[int]
    exit: list[int]
    run: Callable[[Sequence[Any]], list[Any]]
    eager: Callable[[Sequence[Any]], list[Any]] | None = None
    guards: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    branches: list[tuple[int, bool]] = field(default_factory=list)


def run_parts(parts: Sequence[Part], env: list[Any], trace: TraceContext | None = None,
              force_eager: bool = False) -> bool:
    """Run the parts over the slot values in `env`; False when the graph must retire (a
    segment's input changed shape or an If flipped: the rest ran eagerly). With `trace`,
    seams get one span per op and each captured segment one span; `force_eager` runs every
    part in its eager form."""
    valid = not force_eager
    for part in parts:
        args = [env[s] for s in part.entry]
        if valid and part.guards:
            for pos, shape in part.guards:
                if tuple(args[pos].shape) != shape:
                    valid = False
                    break
        run = part.run if valid or part.eager is None else part.eager
        if trace is None:
            outs = run(args)
        else:
            outs = _traced(part, run, args, trace, valid)
        for s, v in zip(part.exit, outs):
            env[s] = v
        for slot, taken in part.branches:
            if bool(env[slot]) != taken:
                valid = False
    return valid


def _traced(part: Part, run: Callable[[Sequence[Any]], list[Any]], args: list[Any],
            trace: TraceContext, valid: bool) -> list[Any]:
    if not part.captured or not valid:
        eager = part.run if not part.captured else part.eager
        return eager.hooked(args, eager.tracer(trace))  # type: ignore[union-attr]
    with trace.run_span("captured_segment", capture_status="replayed",
                        steps=len(part.steps), first_step=part.steps[0],
                        last_step=part.steps[-1]):
        return run(args)


class LazyPlan:
    """A sub-plan of `steps` built and compiled on its first run. A host capture replays all
    its parts as one fused function (HostReplay, which reads only `steps` and `constants`),
    so a part's own plan is needed only to trace a replay or to finish a retired step: most
    captures never build it."""

    __slots__ = ("_compiled", "_of", "constants", "entry", "exit", "steps")

    def __init__(self, of: Plan, steps: list[Step], entry: list[int], exit_: list[int],
                 constants: dict[int, Any]) -> None:
        self._of, self.steps, self.entry, self.exit = of, steps, entry, exit_
        self.constants = constants
        self._compiled: CompiledPlan | None = None

    @property
    def plan(self) -> Plan:
        return self.compiled().plan

    def compiled(self) -> CompiledPlan:
        if self._compiled is None:
            plan = _sub_plan(self._of, self.steps, self.entry, self.exit, self.constants)
            self._compiled = CompiledPlan(plan, inplace=False)
        return self._compiled

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        return self.compiled()(args)

    def hooked(self, args: Sequence[Any], hooks: Any) -> list[Any]:
        return self.compiled().hooked(args, hooks)

    def tracer(self, trace: TraceContext) -> Any:
        return self.compiled().tracer(trace)


class _Retire(SessionError):
    """A fused host replay met a segment input of another shape than at capture."""


_GUARD = KernelSpec("onnxkiln", "CaptureGuard", 1, None, lambda *a: None)


class HostReplay:
    """All parts of a host capture as one generated function: segments' replay lists, seam
    kernels, and checks in between (a segment input's shape: on a change the step reruns
    part by part eagerly; an If's branch: a flip is noted, the If itself chose right).
    Saves the per-part dispatch of `run_parts` when a capture has many seams."""

    def __init__(self, parts: Sequence[Part], plan: Plan) -> None:
        self._parts = parts
        self._flipped = [False]
        steps: list[Step] = []
        consts: dict[int, Any] = {}
        produced: set[int] = set()
        entry: list[int] = []
        for part in parts:
            lazy = part.run  # a LazyPlan on the host: its steps, not its code
            consts.update(lazy.constants)
            for s in part.entry:
                if s not in produced and s not in entry:
                    entry.append(s)
            if part.captured:
                steps += [_check(part.entry[pos], _shape_check(shape), "segment input")
                          for pos, shape in part.guards]
            steps += lazy.steps
            steps += [_check(slot, _branch_check(taken, self._flipped), "If branch")
                      for slot, taken in part.branches]
            produced.update(s for st in lazy.steps for s in st.outputs if s is not None)
        exits = [s for s in dict.fromkeys(plan.output_slots) if s in produced]
        self.entry = entry
        self.exit = exits
        self._run = CompiledPlan(_sub_plan(plan, steps, entry, exits, consts), inplace=False)

    def __call__(self, env: list[Any]) -> bool:
        """Run over `env` (as run_parts does); False when the graph must retire."""
        self._flipped[0] = False
        try:
            outs = self._run([env[s] for s in self.entry])
        except _Retire:  # nothing escaped the step yet: rerun it part by part, eagerly
            run_parts(self._parts, env, force_eager=True)
            return False
        for s, v in zip(self.exit, outs):
            env[s] = v
        return not self._flipped[0]


def _check(slot: int, kernel: Callable[[Any], None], what: str) -> Step:
    return Step(-1, f"check {what}", "CaptureGuard", "onnxkiln", 1, "cpu", _GUARD, kernel,
                (slot,), (None,))


def _shape_check(shape: tuple[int, ...]) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if tuple(value.shape) != shape:
            raise _Retire("a segment input changed shape")
    return check


def _branch_check(taken: bool, flipped: list[bool]) -> Callable[[Any], None]:
    def check(cond: Any) -> None:
        if bool(cond) != taken:
            flipped[0] = True
    return check


def split(plan: Plan, audit: Audit) -> list[tuple[bool, list[int]]]:
    """Non-static step indices grouped into maximal captured / seam runs, in order."""
    groups: list[tuple[bool, list[int]]] = []
    for i in range(len(plan.steps)):
        if audit.static[i]:
            continue
        captured = audit.seams[i] is None
        if groups and groups[-1][0] == captured:
            groups[-1][1].append(i)
        else:
            groups.append((captured, [i]))
    return groups


@dataclass
class PartsInput:
    """What building the parts needs from the capture run."""

    plan: Plan
    audit: Audit
    values: dict[int, Any]  # every slot's value in the capture run (inputs included)
    baked: dict[int, Any]  # constants and static values
    stable: set[int]  # slots whose object is the same on every replay (fixed binding views)
    cond_slots: dict[int, int]  # step index of an If with a changing condition -> its slot
    kernel_for: Callable[[Step], Any]  # the capture-safe kernel of a recorded step
    record: Callable[..., Any] | None = None  # CUDA: (compiled, args, stable) -> Segment
    grown: frozenset[int] = frozenset()  # slots whose shape follows a growing binding


def build_parts(inp: PartsInput) -> list[Part]:
    """The parts of a replay (see the module docstring)."""
    plan, groups = inp.plan, split(inp.plan, inp.audit)
    later_reads: list[set[int]] = []
    needed = set(plan.output_slots)
    for _, idx in reversed(groups):
        later_reads.append(set(needed))
        for i in idx:
            needed.update(s for s in plan.steps[i].inputs if s is not None)
    later_reads.reverse()
    parts: list[Part] = []
    from_segment: dict[int, Any] = {}  # CUDA: exits of recorded segments -> their objects
    for (captured, idx), later in zip(groups, later_reads):
        steps = [plan.steps[i] for i in idx]
        produced = {s for st in steps for s in st.outputs if s is not None}
        entry: list[int] = []
        for st in steps:
            for s in st.inputs:
                if s is not None and s not in produced and s not in inp.baked and s not in entry:
                    entry.append(s)
        exit_ = [s for st in steps for s in st.outputs
                 if s is not None and s in later and s not in inp.baked]
        consts = {s: inp.baked[s] for st in steps for s in st.inputs if s in inp.baked}
        eager = LazyPlan(plan, steps, entry, exit_, consts)
        part = Part(captured, idx, entry, exit_, eager)
        if captured:
            _make_captured(part, inp, steps, consts, from_segment)
            if isinstance(part.run, CudaSegment):
                from_segment.update(zip(exit_, part.run.outputs))
        else:
            part.branches = [(inp.cond_slots[i], bool(inp.values[inp.cond_slots[i]]))
                             for i in idx if i in inp.cond_slots]
        parts.append(part)
    return parts


def _make_captured(part: Part, inp: PartsInput, steps: list[Step], consts: dict[int, Any],
                   from_segment: dict[int, Any]) -> None:
    """Turn a captured part into its replay form (prealloc'd list or a CUDA graph).
    `from_segment`: the static output objects of segments recorded before this one (a graph
    reads them in place)."""
    part.eager, plan = part.run, inp.plan
    stable = inp.stable | from_segment.keys()
    part.guards = [(k, tuple(inp.values[s].shape)) for k, s in enumerate(part.entry)
                   if s not in stable and hasattr(inp.values[s], "shape")]
    safe, special = [], set()
    for st in steps:
        kernel = inp.kernel_for(st)
        fixed = _fixed_shapes(st, inp) if kernel is st.kernel and inp.record is None else None
        if fixed is not None:  # not a capture-safe variant: specialised for its shapes
            special.add(len(safe))
        safe.append(fixed or dataclasses.replace(st, kernel=kernel))
    if inp.record is None:
        safe = _preallocated(safe, inp.values, consts, part.entry, special)
        part.run = LazyPlan(plan, safe, part.entry, part.exit, consts)
        return
    if all(st.op_type == "MemcpyFromHost" for st in steps):
        return  # only uploads of bound inputs (the tensors themselves): nothing to record
    compiled = LazyPlan(plan, safe, part.entry, part.exit, consts).compiled()
    args = [from_segment.get(s, inp.values[s]) for s in part.entry]
    part.run = inp.record(compiled, args, [s in stable for s in part.entry], part)


def _fixed_shapes(step: Step, inp: PartsInput) -> Step | None:
    """The step with its kernel specialised for the capture's input shapes, or None. Only
    when none of them follows a growing binding: a segment's entry shapes are checked
    before it runs, and the steps inside are shape-deterministic (what is not is a seam)."""
    if isinstance(step.kernel, np.ufunc) or any(s is not None and s in inp.grown
                                                for s in step.inputs):
        return None
    ins = [None if s is None else inp.baked[s] if s in inp.baked else inp.values.get(s)
           for s in step.inputs]
    if any(s is not None and not isinstance(v, np.ndarray) for s, v in zip(step.inputs, ins)):
        return None
    seen = (tuple(getattr(v, "dtype", None) for v in ins),
            tuple(getattr(v, "shape", None) for v in ins))
    special = specialized_kernel(step, seen, inp.baked)
    return None if special is None else dataclasses.replace(step, kernel=special)


def _preallocated(steps: list[Step], values: dict[int, Any], consts: dict[int, Any],
                  entry: Sequence[int], special: set[int]) -> list[Step]:
    """Elementwise steps (ufuncs, kernels taking `out=`; not the `special`ised ones) write
    into their capture-time output buffer: one the step owns alone, never an input,
    constant or other buffer."""
    foreign = {id(values[s]) for s in entry} | {id(v) for v in consts.values()}
    taken: set[int] = set()
    out = []
    for i, st in enumerate(steps):
        buf = values.get(st.outputs[0]) if st.outputs and st.outputs[0] is not None else None
        takes_out = i not in special and (isinstance(st.kernel, np.ufunc)
                                          or bool(st.spec.inplace))
        if (takes_out and not st.spec.multi_output and type(buf) is np.ndarray
                and buf.base is None and buf.flags.writeable and buf.flags.c_contiguous
                and id(buf) not in foreign and id(buf) not in taken):
            taken.add(id(buf))
            kernel = functools.partial(st.kernel, out=buf)
            st = dataclasses.replace(st, kernel=_named(kernel, st.kernel))
        out.append(st)
    return out


def _named(kernel: functools.partial, inner: Any) -> functools.partial:
    variant = getattr(inner, "variant", None)
    if variant is not None:
        kernel.variant = variant  # type: ignore[attr-defined]
    return kernel


def _sub_plan(plan: Plan, steps: list[Step], entry: list[int], exit_: list[int],
              consts: dict[int, Any]) -> Plan:
    last = lifetimes(steps, entry, exit_, consts)
    return Plan(list(steps), plan.slot_names, list(entry), {}, list(exit_), dict(consts), last,
                [False] * len(exit_))


class CudaSegment:
    """One captured segment as a device graph with static inputs and outputs.

    Inputs the graph may read in place (`stable`: a fixed binding's view, a previous
    segment's output) are used as they are; the others are cloned into static tensors that
    each replay refills. `graphs.record(fn, label)` returns (outputs, replay): with
    TorchCudaGraphs a torch CUDA graph; tests use an eager stand-in with the same contract.
    """

    def __init__(self, compiled: CompiledPlan, args: Sequence[Any], stable: Sequence[bool],
                 graphs: Any, label: str) -> None:
        for a in args:
            if not hasattr(a, "copy_"):
                raise CaptureError(f"segment {label}: an input is a {type(a).__name__}, not a "
                                   "device tensor; it cannot be bound into a device graph")
        self.inputs = [a if keep else a.clone() for a, keep in zip(args, stable)]
        self._copy = [i for i, keep in enumerate(stable) if not keep]
        self.outputs, self._replay = graphs.record(lambda: compiled(self.inputs), label)

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        inputs = self.inputs
        for i in self._copy:
            inputs[i].copy_(args[i])
        self._replay()
        return self.outputs


class TorchCudaGraphs:
    """Records segments as torch CUDA graphs sharing one private memory pool."""

    def __init__(self, device: Any) -> None:
        import torch

        self._torch, self._device = torch, device
        self._pool = torch.cuda.graph_pool_handle()

    def record(self, fn: Callable[[], list[Any]], label: str
               ) -> tuple[list[Any], Callable[[], None]]:
        """Warm `fn` up on a side stream (as torch requires), then capture it."""
        torch, device = self._torch, self._device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = fn()
        except Exception as e:
            raise CaptureError(f"recording segment {label} failed: {type(e).__name__}: {e}. A "
                               "kernel in it synchronises with the host without declaring it "
                               "(KernelSpec.capture); run this model eagerly") from e
        graph.replay()  # this step's values in the static outputs, for the next segment
        return outputs, graph.replay
