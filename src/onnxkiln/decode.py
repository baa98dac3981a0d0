"""The decode memo and view plan behind `run_with_device_bindings`.

A decode loop through persistent bindings changes only logical lengths from step to step.
The memo keys one specialisation on the binding layout (each binding's names, identity,
dtype and physical shape) and the dtype and rank of every plain input, the bindings'
logical shapes abstracted; a plain input's shape must be the one it had when the entry was
built, except dims that grew by exactly as much as some bound logical length did since (an
attention mask fed as an array one column wider each step: a logical length too). A step
with the memo's key (`replayed`) skips the validation of bound inputs (their dtype was
checked at allocation; the static dims the model declares are still compared, cheaply),
the specialisation-cache lookup and the binding-plan lookup; plain inputs are still
converted and checked one by one, with the errors of the ordinary path. A step with
another key builds anew on the ordinary path (`primed` the first time, `rebuilt` after).

The view plan: on replayed steps a bound input whose logical shape did not change keeps
its view object, and pure-view steps (Reshape, Squeeze, Unsqueeze, Identity, ...) whose
data input is such a view (or a constant) and whose other inputs are constants keep their
output from the first replay that saw the same set of unchanged bindings. That replay runs
with hooks recording those outputs; each one that really is a view of its data input (a
view of a persistent buffer stays right when the buffer's contents change) becomes a
constant of a plan compiled without its step. Views over a growing buffer are re-sliced
from it each step instead (onnxkiln.decode_views). Anything else is dispatched as usual.

`decode.verify=1` recomputes every replayed step on the ordinary path from the state
before it and raises `CaptureError` unless both agree bit for bit.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnxkiln.bindings import DeviceIoBinding, SessionBindings, copy_value, same_objects, store
from onnxkiln.decode_views import (
    Reslice,
    appends_held,
    growing_candidates,
    growing_sources,
    resliced,
)
from onnxkiln.errors import CaptureError
from onnxkiln.executor import CompiledPlan, combine_hooks
from onnxkiln.options import SessionConfig
from onnxkiln.plan import Plan, Step, lifetimes
from onnxkiln.pool import run_scope
from onnxkiln.specialize import PlanSpecializer, Specialization, SpecializationCache
from onnxkiln.trace import TraceContext
from onnxkiln.validation import InputValidator

__all__ = ["DecodeMemo", "elide_steps"]

_UPLOAD = ("onnxkiln", "MemcpyFromHost")  # a no-op for a tensor already on the device


class _Entry:
    """The memo's one specialisation: what a replayed step reuses."""

    __slots__ = ("appended", "base", "bindings", "checks", "compiled", "input_slots", "key",
                 "lengths", "plain_now", "plain_shapes", "plain_slot", "shapes", "template",
                 "view_plan", "views")

    def __init__(self, key: tuple, bindings: Sequence[DeviceIoBinding], compiled: CompiledPlan,
                 appended: frozenset[str], template: list[Any], plain_slot: dict[str, int],
                 input_slots: list[int | None], views: list[Any],
                 shapes: list[tuple[int, ...]], checks: list[tuple[int, int, int]]) -> None:
        self.key = key
        self.bindings = tuple(bindings)  # held: a replay matches them by identity
        self.compiled = compiled
        self.appended = appended
        self.template = template
        self.plain_slot = plain_slot
        self.input_slots = input_slots  # per binding: its input's position, None if none
        self.views = views
        self.shapes = shapes
        self.checks = checks
        self.view_plan: _ViewPlan | None = None
        self.base = list(shapes)  # the bound inputs' logical shapes when it was built
        self.plain_shapes: dict[int, tuple[int, ...]] = {}
        self.plain_now: tuple = ()  # this step's plain shapes, grown dims as None
        # bound dims that can move (logical < physical): (binding, axis)
        self.lengths = [(i, a) for i, (b, shape) in enumerate(zip(bindings, shapes))
                        if b.input_name for a, (n, cap) in enumerate(zip(shape, b.physical_shape))
                        if n < cap]

    def follows(self, plain: Mapping[int, tuple[int, ...]], now: Sequence[tuple[int, ...]]
                ) -> bool:
        """Whether every plain dim is as at the build or grew by exactly as much as a bound
        logical length did since (a growing attention mask, positions): a logical length.
        Only growth counts: a decode loop's lengths grow; a shrinking dim (prefill, then one
        token per step) is another shape."""
        base, built = self.base, self.plain_shapes
        for pos, shape in plain.items():
            old = built.get(pos)
            if old is None or len(old) != len(shape):
                return False
            for d, d0 in zip(shape, old):
                if d != d0 and (d < d0 or not any(now[i][a] - base[i][a] == d - d0
                                                  for i, a in self.lengths)):
                    return False
        return True


@dataclasses.dataclass(eq=False)
class _ViewPlan:
    """What replays with one view-plan key run: the entry's plan without the elided steps
    (and, from its second replay, specialised for the shapes it keeps, guarded where they
    move), the steps elided, the re-sliced views, and the constants that are views of bound
    buffers (`live`: their contents change, so nothing is folded from them)."""

    key: tuple
    compiled: CompiledPlan
    elided: int
    cuts: list[Reslice]
    live: frozenset[int]
    copy: list[bool]  # output copy flags
    runs: int = 0
    specialised: bool = False


class DecodeMemo:
    """One session's decode memo: the path of `run_with_device_bindings` and its counters.

    Example:
        >>> memo = DecodeMemo(validator, cache, bindings, ["logits"], [False], None, "main",
        ...                   SessionConfig())
        >>> outputs = memo.run(feeds, checked_bindings, TraceContext.disabled())
        >>> memo.counts()  # (primed, rebuilt, replayed, ineligible)
        (1, 0, 0, 0)
    """

    def __init__(self, validator: InputValidator, cache: SpecializationCache,
                 bindings: SessionBindings, output_names: Sequence[str],
                 copy_outputs: Sequence[bool], threads: int | None, graph_name: str,
                 options: SessionConfig, graph: Any = None) -> None:
        self._validator = validator
        self._cache = cache
        self._bindings = bindings
        self._output_names = list(output_names)
        self._copy_outputs = list(copy_outputs)
        self._threads = threads
        self._graph_name = graph_name or "main"
        self.enabled = options.decode_memo
        self.verify = options.decode_verify
        # the model graph replays specialise their plan against; None with specialize=0,
        # and under decode.verify, which compares replays bit for bit with the ordinary
        # path's generic kernels (a specialised GEMM may sum in another order)
        self._graph = graph if options.specialize and not self.verify else None
        self._lock = threading.Lock()
        self._entry: _Entry | None = None
        self._primed = self._rebuilt = self._replayed = self._ineligible = 0
        self._views_reused = self._elided = 0
        self._steps = 0  # eligible runs so far: the step number decode.verify reports

    # counters -----------------------------------------------------------------
    def counts(self) -> tuple[int, int, int, int]:
        """(primed, rebuilt, replayed, ineligible) over the session's lifetime."""
        return self._primed, self._rebuilt, self._replayed, self._ineligible

    def view_plan_counts(self) -> tuple[int, int]:
        """(views_reused, dispatch_elided) over the session's lifetime."""
        return self._views_reused, self._elided

    def note_ineligible(self) -> None:
        """Count a run that cannot use the memo (a plain run, a captured replay...)."""
        self._ineligible += 1

    def forget(self, binding: DeviceIoBinding) -> None:
        """Drop the entry if it uses `binding` (call on release: the entry's views would
        keep the released buffer's memory alive)."""
        entry = self._entry
        if entry is not None and any(b is binding for b in entry.bindings):
            self._entry = None

    # running ------------------------------------------------------------------
    def run_ordinary(self, feeds: dict[str, Any], bindings: list[DeviceIoBinding],
                     trace: TraceContext) -> list[Any]:
        """A bound run on the ordinary path, counted nowhere (a retired replay's step)."""
        return self._ordinary(feeds, bindings, _views(bindings), trace)[0]

    def run(self, feeds: dict[str, Any], bindings: list[DeviceIoBinding],
            trace: TraceContext) -> list[Any]:
        """One run with device bindings: `feeds` are the plain inputs by name, `bindings`
        already checked by SessionBindings.check."""
        if not bindings or not self.enabled or not self._lock.acquire(blocking=False):
            # no bindings, memo off, or nested / concurrent with a memoised run
            self._ineligible += 1
            return self._ordinary(feeds, bindings, _views(bindings), trace)[0]
        try:
            return self._run_eligible(feeds, bindings, trace)
        finally:
            self._lock.release()

    def _run_eligible(self, feeds: dict[str, Any], bindings: list[DeviceIoBinding],
                      trace: TraceContext) -> list[Any]:
        step = self._steps
        self._steps += 1
        entry = self._entry
        if entry is not None and same_objects(bindings, entry.bindings):
            values, plain_key, plain_shapes = self._plain(entry, feeds)
            if plain_key == entry.key and (plain_shapes == entry.plain_shapes or entry.follows(
                    plain_shapes, [b.logical_shape for b in bindings])):
                entry.plain_now = _grown_key(entry.plain_shapes, plain_shapes)
                if not self.verify:
                    outputs = self._replay(entry, values, feeds, bindings, trace)
                else:
                    outputs = self._verified(entry, values, feeds, bindings, trace, step)
                self._replayed += 1
                return outputs
        views = _views(bindings)
        shapes = [b.logical_shape for b in bindings]  # of the views, before write_back
        outputs, values, compiled, appended = self._ordinary(feeds, bindings, views, trace)
        self._entry = self._build_entry(feeds, bindings, views, shapes, values, compiled,
                                        appended)
        if self._primed == 0:  # the session's first build; any later one rebuilds
            self._primed = 1
        else:
            self._rebuilt += 1
        return outputs

    def _ordinary(self, feeds: dict[str, Any], bindings: list[DeviceIoBinding],
                  views: list[Any], trace: TraceContext | None
                  ) -> tuple[list[Any], list[Any], CompiledPlan, frozenset[str]]:
        """Today's path: full validation, the specialisation cache, the binding plan."""
        feeds = dict(feeds)
        feeds.update((b.input_name, v) for b, v in zip(bindings, views) if b.input_name)
        values, signature = self._validator.bind(feeds)
        self._cache.get(signature)
        compiled, appended = self._bindings.plans.get(bindings)
        outputs = self._execute(compiled, list(values), trace)
        self._bindings.write_back(outputs, bindings, appended)
        return self._finish(outputs), values, compiled, appended

    def _execute(self, compiled: CompiledPlan, values: list[Any], trace: TraceContext | None,
                 hooks: Any = None) -> list[Any]:
        with run_scope(self._threads):
            if trace is not None and trace.enabled:
                with trace.run_span("model_run", graph=self._graph_name):
                    return compiled.hooked(values, combine_hooks(hooks, compiled.tracer(trace)))
            if hooks is not None:
                return compiled.hooked(values, hooks)
            return compiled(values)

    def _finish(self, outputs: list[Any], copy: Sequence[bool] | None = None) -> list[Any]:
        copy = self._copy_outputs if copy is None else copy
        for i, value in enumerate(outputs):
            if isinstance(value, np.ndarray) and copy[i]:
                outputs[i] = value.copy()
        return outputs

    def _build_entry(self, feeds: dict[str, Any], bindings: list[DeviceIoBinding],
                     views: list[Any], shapes: list[tuple[int, ...]], values: list[Any],
                     compiled: CompiledPlan, appended: frozenset[str]) -> _Entry:
        specs = self._validator.by_name
        plain_slot = {name: specs[name].position for name in feeds}
        input_slots = [specs[b.input_name].position if b.input_name else None
                       for b in bindings]
        template = list(values)
        for pos in (*plain_slot.values(), *(p for p in input_slots if p is not None)):
            template[pos] = None
        checks = _dim_checks(self._validator, input_slots)
        plain_key, plain_shapes = _plain_key(self._validator, plain_slot, values)
        entry = _Entry(plain_key, bindings, compiled, appended, template,
                       plain_slot, input_slots, list(views), shapes, checks)
        entry.plain_shapes = plain_shapes
        return entry

    def _plain(self, entry: _Entry, feeds: dict[str, Any]
               ) -> tuple[list[Any], tuple, dict[int, tuple[int, ...]]]:
        """The template with the plain inputs converted and checked, their key part, and
        their shapes."""
        values = list(entry.template)
        validator = self._validator
        for name, raw in feeds.items():
            position, value = validator.convert(name, raw)
            values[position] = value
        slots = entry.plain_slot
        if slots.keys() != feeds.keys():
            slots = {name: validator.by_name[name].position for name in feeds}
        return values, *_plain_key(validator, slots, values)

    def _replay(self, entry: _Entry, values: list[Any], feeds: dict[str, Any],
                bindings: list[DeviceIoBinding], trace: TraceContext | None) -> list[Any]:
        stable = []
        shapes = [b.logical_shape for b in bindings]
        for i, (b, pos) in enumerate(zip(bindings, entry.input_slots)):
            if pos is None:
                continue
            if shapes[i] == entry.shapes[i]:
                values[pos] = entry.views[i]
                stable.append(i)
            else:
                values[pos] = entry.views[i] = b.view()
                entry.shapes[i] = shapes[i]
        if entry.checks:
            self._check_dims(entry, values, shapes)
        key = (frozenset(stable), entry.plain_now)
        plan, cuts, copy = entry.view_plan, [], self._copy_outputs
        if plan is None or plan.key != key or not all(c.source.holds(bindings)
                                                      for c in plan.cuts):
            outputs = self._record_view_plan(entry, key, values, bindings, shapes, trace)
            self._views_reused += len(stable)
        else:
            cuts = plan.cuts
            if cuts:  # views of growing buffers: re-sliced, not dispatched
                values = [*values, *(c.source.value(bindings) for c in cuts)]
            plan.runs += 1
            if plan.runs == 2 and self._graph is not None:
                outputs = self._specialise(entry, plan, values, trace)
            else:
                outputs = self._execute(plan.compiled, values, trace)
            copy = plan.copy
            self._views_reused += len(stable) + plan.elided
            self._elided += plan.elided
        self._bindings.write_back(outputs, bindings, entry.appended)
        if cuts and not appends_held(cuts, bindings, shapes):
            # an append added another count than when the views were cut: the step again on
            # the ordinary path from the lengths before it (its writes land where they did)
            entry.view_plan = None
            for b, shape in zip(bindings, shapes):
                b.set_logical_shape(shape)
            return self._ordinary(feeds, bindings, _views(bindings), trace)[0]
        return self._finish(outputs, copy)

    def _specialise(self, entry: _Entry, plan: _ViewPlan, values: list[Any],
                    trace: TraceContext | None) -> list[Any]:
        """Run the view plan recording its steps' shapes, and specialise it for them: the
        kernels built for those shapes, guarded on every value whose shape follows a
        growing length (the generic kernel runs when one moved), shape arithmetic of the
        shapes that stay folded (onnxkiln.specialize)."""
        stable = plan.key[0]
        varying = {pos for i, pos in enumerate(entry.input_slots)
                   if pos is not None and i not in stable}
        varying |= {pos for pos, shape in plan.key[1] if None in shape}
        varying |= {c.slot for c in plan.cuts}
        specializer = PlanSpecializer(plan.compiled, self._graph, frozenset(varying), plan.live)
        recorder = specializer.recorder()
        outputs = self._execute(plan.compiled, values, trace, recorder)
        built = Specialization(plan.key)
        specializer.build(recorder, built)
        if built.kernels or built.folded:
            plan.compiled = built.compiled
            plan.copy = [a or b for a, b in zip(plan.copy, built.copy_outputs)]
            plan.specialised = True
        return outputs

    def _record_view_plan(self, entry: _Entry, key: tuple, values: list[Any],
                          bindings: list[DeviceIoBinding], shapes: list[tuple[int, ...]],
                          trace: TraceContext | None) -> list[Any]:
        """Run the step recording its view candidates, and keep the view plan for `key`:
        views of unchanged bindings and constants become constants, views of growing
        buffers re-slices (onnxkiln.decode_views)."""
        plan, stable = entry.compiled.plan, key[0]
        slots = {entry.input_slots[i] for i in stable}
        candidates = _candidates(plan, slots)
        growing = [i for i, pos in enumerate(entry.input_slots)
                   if pos is not None and i not in stable]
        sources = growing_sources(plan, bindings, entry.input_slots, growing, values)
        more = growing_candidates(plan, sources, candidates, _is_candidate)
        recorder = _Recorder(candidates | more)
        outputs = self._execute(entry.compiled, values, trace,
                                recorder if candidates or more else None)
        elided = _confirmed(plan, slots, recorder.outs)
        cuts = resliced(plan, sources, bindings, shapes, recorder.outs, more)
        compiled = elide_steps(entry.compiled, elided, cuts) if elided or cuts else None
        live = frozenset(s for step, _ in elided.values() for s in step.outputs if s is not None)
        entry.view_plan = _ViewPlan(key, compiled or entry.compiled, len(elided) + len(cuts),
                                    list(cuts.values()), live, list(self._copy_outputs))
        return outputs

    def _check_dims(self, entry: _Entry, values: list[Any], shapes: list[tuple[int, ...]]
                    ) -> None:
        """The model's static dims on bound inputs, as full validation checks them (named
        dims are no contract: equal names may hold different sizes)."""
        if not all(shapes[i][axis] == want for i, axis, want in entry.checks):
            for pos in entry.input_slots:  # the ordinary path's error
                if pos is not None:
                    self._validator.check_shape(pos, values[pos])

    def _verified(self, entry: _Entry, values: list[Any], feeds: dict[str, Any],
                  bindings: list[DeviceIoBinding], trace: TraceContext | None,
                  step: int) -> list[Any]:
        """The replayed step, then the ordinary path from the state before it; both must
        agree bit for bit (decode.verify=1)."""
        provider = self._bindings.provider
        saved = [(b, b.logical_shape, copy_value(b.view())) for b in bindings
                 if b.input_name and b.output_name]
        memo = self._replay(entry, values, feeds, bindings, trace)
        memo_outputs = [_host(provider, v, copy=True) for v in memo]
        memo_bound = [(b.logical_shape, _host(provider, b.view(), copy=True))
                      for b in bindings if b.output_name]
        for b, shape, contents in saved:
            b.set_logical_shape(shape)
            store(b.tensor, tuple(slice(0, n) for n in shape), contents)
        plain, *_ = self._ordinary(feeds, bindings, _views(bindings), None)
        for name, got, want in zip(self._output_names, memo_outputs, plain):
            if not _same(got, _host(provider, want)):
                raise _mismatch(step, name, "returned value")
        for b, (shape, got) in zip([b for b in bindings if b.output_name], memo_bound):
            if shape != b.logical_shape or not _same(got, _host(provider, b.view())):
                raise _mismatch(step, b.output_name, f"bound contents (logical {shape} vs "
                                f"{b.logical_shape})")
        return plain


def elide_steps(compiled: CompiledPlan, recorded: Mapping[int, tuple[Step, tuple]],
                cuts: Mapping[int, Reslice] | None = None) -> CompiledPlan:
    """`compiled`'s plan without the recorded steps, their outputs turned into constants,
    and without the `cut` steps, their outputs extra plan inputs (after the model's, in
    `cuts` order: the caller re-slices them each run).

    `recorded`: step index -> (step, its outputs as the recording run made them).
    """
    plan: Plan = compiled.plan
    cuts = cuts or {}
    constants = dict(plan.constants)
    for step, outs in recorded.values():
        written = step.outputs if step.spec.multi_output else step.outputs[:1]
        constants.update(zip([s for s in written if s is not None], outs))
    steps = [s for i, s in enumerate(plan.steps) if i not in recorded and i not in cuts]
    inputs = [*plan.input_slots, *(c.slot for c in cuts.values())]
    last_use = lifetimes(steps, inputs, plan.output_slots, constants)
    elided = dataclasses.replace(plan, steps=steps, constants=constants, last_use=last_use,
                                 input_slots=inputs)
    return CompiledPlan(elided, compiled.inplace)


class _Recorder:
    """Step hooks keeping the outputs of the candidate steps of one run."""

    __slots__ = ("_wanted", "outs")

    def __init__(self, wanted: set[int]) -> None:
        self._wanted = wanted
        self.outs: dict[int, tuple[tuple, tuple]] = {}

    def sizing(self, index: int, ins: tuple) -> None:
        pass

    def start(self, index: int) -> int:
        return index

    def finish(self, index: int, ins: tuple, outs: tuple) -> None:
        if index in self._wanted:
            self.outs[index] = (ins, outs)


def _is_candidate(step: Step) -> bool:
    return step.spec.view or (step.domain, step.op_type) == _UPLOAD


def _candidates(plan: Plan, stable_slots: set[int | None]) -> set[int]:
    """Steps that may be elided: pure views whose data input is a constant or invariant
    view and whose other inputs are constants (host inputs are read for their values)."""
    const = set(plan.constants)
    views = set(stable_slots)
    found = set()
    for i, step in enumerate(plan.steps):
        if not _is_candidate(step) or not step.inputs:
            continue
        data, *rest = step.inputs
        if not all(s is None or s in const for s in rest):
            continue
        if data is None or data in const:
            target = const
        elif data in views:
            target = views
        else:
            continue
        target.update(s for s in step.outputs if s is not None)
        found.add(i)
    return found


def _confirmed(plan: Plan, stable_slots: set[int | None],
               recorded: Mapping[int, tuple[tuple, tuple]]) -> dict[int, tuple[Step, tuple]]:
    """The recorded steps whose outputs really are invariant: constants in, or views of
    their (invariant) data input out; in plan order, so a refused step refuses its users."""
    const = set(plan.constants)
    views = set(stable_slots)
    elided: dict[int, tuple[Step, tuple]] = {}
    for i in sorted(recorded):
        step = plan.steps[i]
        ins, outs = recorded[i]
        data, *rest = step.inputs
        if not all(s is None or s in const for s in rest):
            continue
        if data is None or data in const:
            target = const
        elif data in views and all(_is_view_of(o, ins[0], step) for o in outs):
            target = views
        else:
            continue
        written = step.outputs if step.spec.multi_output else step.outputs[:1]
        if len(outs) != sum(s is not None for s in written):
            continue
        target.update(s for s in written if s is not None)
        elided[i] = (step, outs)
    return elided


def _is_view_of(out: Any, base: Any, step: Step) -> bool:
    """Whether `out` reads `base`'s memory (so it follows changes of its contents)."""
    if (step.domain, step.op_type) == _UPLOAD:
        return out is base
    if isinstance(out, np.ndarray) and isinstance(base, np.ndarray):
        return np.may_share_memory(out, base)  # a fresh copy never overlaps
    storage = getattr(out, "untyped_storage", None)
    if storage is not None and hasattr(base, "untyped_storage"):
        return out.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    return False


def _views(bindings: Sequence[DeviceIoBinding]) -> list[Any]:
    return [b.view() if b.input_name else None for b in bindings]


def _plain_key(validator: InputValidator, slots: Mapping[str, int], values: list[Any]
               ) -> tuple[tuple, dict[int, tuple[int, ...]]]:
    """The plain inputs' key part (position, dtype or type, rank) and their shapes: the
    shapes are compared apart, since dims that follow a logical length may move."""
    on_device = validator.device is not None
    key, shapes = [], {}
    for pos in sorted(slots.values()):
        v = values[pos]
        if isinstance(v, np.ndarray) or (on_device and hasattr(v, "shape")):
            shapes[pos] = tuple(v.shape)
            key.append((pos, v.dtype, len(shapes[pos])))
        else:
            key.append((pos, type(v), None))
    return tuple(key), shapes


def _grown_key(base: Mapping[int, tuple[int, ...]], now: Mapping[int, tuple[int, ...]]
               ) -> tuple:
    """The plain shapes with the dims that grew since `base` (logical lengths) as None."""
    return tuple((pos, tuple(None if d != d0 else d for d, d0 in zip(shape, base[pos])))
                 for pos, shape in now.items())


def _dim_checks(validator: InputValidator, input_slots: Sequence[int | None]
                ) -> list[tuple[int, int, int]]:
    """What replays check on bound inputs' logical shapes: (binding, axis, size) for each
    static dim the model declares."""
    checks = []
    for i, pos in enumerate(input_slots):
        shape = None if pos is None else validator.specs[pos].meta.shape
        if shape is not None:
            checks.extend((i, axis, dim) for axis, dim in enumerate(shape)
                          if isinstance(dim, int))
    return checks


def _host(provider: Any, value: Any, copy: bool = False) -> Any:
    if value is None or isinstance(value, list | dict):
        return value
    host = provider.to_host(value)
    return np.array(host, copy=True) if copy else np.asarray(host)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.kind in "fc":
            return bool(np.array_equal(a, b, equal_nan=True))
        if a.dtype.kind in "biuO":
            return bool(np.array_equal(a, b))
        return a.tobytes() == b.tobytes()  # bfloat16, float8...: bitwise
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b or a == b


def _mismatch(step: int, name: str | None, what: str) -> CaptureError:
    return CaptureError(
        f"decode.verify: memoised decode step {step} differs from the ordinary path in "
        f"output '{name}' ({what}); the memo or view plan reused something that changed "
        "(a bug in onnxkiln; please report it with the model)")

