"""Runs a Plan. The plan is compiled to straight-line Python: one local per value,
kernels and constants bound as globals, a `del` after each value's last use. The
hot path therefore does no dict lookups by name, no loop and no slot indexing.
A second generated function wraps each step in hook calls (tracing, memory limits,
cancellation); subgraph bodies (onnxkiln.subgraph) take it when the run in progress on
their thread is traced or cancellable.

In-place: on the steps `memory.plan_donations` clears statically, the call passes the
dying input's array as `out=` when a runtime guard holds: it is an ndarray of at least
MIN_DONATE_BYTES that owns its data (`base is None`, or a view of a base nothing else
references) and whose reference count is exactly the one local variable's (calibrated at
import with the same guard expression), so an array still held anywhere else (a kernel
cache, a live view, a sequence, the caller) is never passed.
The kernel falls back to a fresh buffer when the array does not fit; a bare ufunc kernel
is retried without `out=` when numpy refuses it (broadcast shape, casting, read-only).
`ONNXKILN_INPLACE=0` in the environment (read when a plan is compiled) or the session
option `memory.inplace=0` turns donation off.

Every exception a run lets out is a `SessionError`: a kernel's exception becomes a
`KernelError` naming the node (the original chained), out-of-memory and recursion
errors included.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from onnxkiln.errors import KernelError, RunCancelledError, RunTimeoutError, SessionError
from onnxkiln.memory import plan_donations
from onnxkiln.plan import Plan, Step
from onnxkiln.sizes import SIZED_OPS
from onnxkiln.trace import StepTracer, TraceContext, step_meta

__all__ = [
    "CancelHook",
    "CompiledPlan",
    "Deadline",
    "Guard",
    "HookPair",
    "StepHooks",
    "cancel_scope",
    "cancelled",
    "combine_hooks",
    "current_cancel",
]

_counter = itertools.count()
_state = threading.local()  # .cancel: the cancel event of the run in progress on this thread


def current_cancel() -> Any:
    """The cancel event of the run in progress on this thread (None without one)."""
    return getattr(_state, "cancel", None)


@dataclass(frozen=True, slots=True)
class Guard:
    """A step specialised for input shapes that may change between runs of one signature:
    `shapes` are (slot, shape) pairs checked before the call; when one differs the step
    runs `fallback` (the generic kernel) instead."""

    fallback: Callable[..., Any]
    shapes: tuple[tuple[int, tuple[int, ...]], ...]


_CODE: dict[Any, Any] = {}
_CODE_KEPT = 64  # a big model's code object is a few MB
_CODE_LOCK = threading.Lock()


def _compiled(source: str, filename: str, exact: bool = False) -> Any:
    """The code object of generated `source`, compiled once per source text: plans of one
    structure (the binding plans of each new binding set, the replay of each capture of a
    plan) differ only in the kernels and constants their namespace binds. A hit carries the
    filename of the plan that compiled it first: the caller adopts it, so the lines of a
    kernel error still map to its steps (the same source has the same lines). `exact`: the
    code must carry `filename` (a plan's hooked variant, whose filename is already set)."""
    key = (source, filename) if exact else source
    code = _CODE.get(key)
    if code is None:
        code = compile(source, filename, "exec")
        with _CODE_LOCK:
            if len(_CODE) >= _CODE_KEPT:
                _CODE.pop(next(iter(_CODE)))
            code = _CODE.setdefault(key, code)
    return code


class CompiledPlan:
    """A plan turned into two generated Python functions over the same steps.

    `run(inputs)` is the hot path: straight-line kernel calls, nothing else.
    `run_hooked(inputs, h)` calls the StepHooks `h` around every step (tracing, memory
    accounting...); a run picks one of the two, so the untraced path carries no per-op
    check at all.
    """

    def __init__(self, plan: Plan, inplace: bool | None = None,
                 guards: dict[int, Guard] | None = None) -> None:
        self.plan = plan
        self.filename = f"<onnxkiln plan {next(_counter)}>"
        if inplace is None:
            inplace = inplace_default()
        self.inplace = inplace and _RC is not None
        guards = guards or {}
        self.donations = plan_donations(plan) if self.inplace else {}
        for i in guards:  # a guarded step may take either kernel: it never writes in place
            self.donations.pop(i, None)
        source, self._line_steps = _generate(plan, self.donations, guards)
        namespace: dict[str, Any] = {"_rc": sys.getrefcount, "_nd": np.ndarray, "_RC": _RC,
                                     "_MIN": MIN_DONATE_BYTES, "_sole": _sole_base,
                                     "_OutErr": (ValueError, TypeError),
                                     "_out_or_plain": _out_or_plain}
        for i, step in enumerate(plan.steps):
            namespace[f"k{i}"] = step.kernel
            if _inline_reshape(step) is not None:
                namespace[f"r{i}"] = step.kernel.reshape_to
        for i, guard in guards.items():
            namespace[f"f{i}"] = guard.fallback
            for j, (_, shape) in enumerate(guard.shapes):
                namespace[f"g{i}_{j}"] = shape
        for s, value in plan.constants.items():
            namespace[f"c{s}"] = value
        run_source, hooked_source = source.split("def run_hooked(", 1)
        code = _compiled(run_source, self.filename)
        self.filename = code.co_filename  # a plan of this structure compiled it first
        exec(code, namespace)
        self._namespace = namespace
        self._hooked_source = "def run_hooked(" + hooked_source
        self._hooked_line0 = run_source.count("\n")
        self._fn: Callable[[Sequence[Any]], list[Any]] = namespace["run"]
        self._hooked_fn: Callable[[Sequence[Any], StepHooks], list[Any]] | None = None
        self.source = source
        self._trace_meta: dict[str, list] = {}

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        """Run the plan on values given in `plan.input_slots` order."""
        try:
            return self._fn(inputs)
        except SessionError:
            raise
        except Exception as e:
            raise self._kernel_error(e) from e

    def _hooked(self, inputs: Sequence[Any], hooks: StepHooks) -> list[Any]:
        """The hooked function, compiled on first use: most plans never run with hooks, and
        compiling both costs a session build twice as much."""
        fn = self._hooked_fn
        if fn is None:
            padded = "\n" * self._hooked_line0 + self._hooked_source  # keep line numbers
            exec(_compiled(padded, self.filename, exact=True), self._namespace)
            fn = self._hooked_fn = self._namespace["run_hooked"]
        return fn(inputs, hooks)

    def hooked(self, inputs: Sequence[Any], hooks: StepHooks) -> list[Any]:
        """Run with `hooks.start`/`hooks.finish` around every step."""
        try:
            return self._hooked(inputs, hooks)
        except SessionError:
            raise
        except Exception as e:
            raise self._kernel_error(e) from e

    def traced(self, inputs: Sequence[Any], ctx: TraceContext, graph: str = "main") -> list[Any]:
        """Run with one span per step into `ctx` (call inside `ctx.run_span()`)."""
        return self.hooked(inputs, self.tracer(ctx, graph))

    def tracer(self, ctx: TraceContext, graph: str = "main") -> StepTracer:
        """Hooks that record one span per step of this plan into `ctx`."""
        meta = self._trace_meta.get(graph)
        if meta is None:
            meta = self._trace_meta[graph] = step_meta(self.plan.steps, graph)
        return StepTracer(ctx, meta)

    def _kernel_error(self, e: Exception) -> SessionError:
        step = self._failed_step(e)
        if step is None:
            return SessionError(
                f"run failed outside any node: {type(e).__name__}: {e} (a bug in onnxkiln; "
                "please report it with the model)"
            )
        where = (f"node '{step.name}' ({step.domain or 'ai.onnx'}::{step.op_type} opset "
                 f"{step.opset}, node id {step.node_id})")
        if isinstance(e, MemoryError):
            message = (f"{where} ran out of memory: {type(e).__name__}: {e}. Use smaller "
                       "inputs, or set memory_limit(...) on the builder to stop runs that "
                       "cannot fit with MemoryLimitError")
        elif isinstance(e, RecursionError):
            message = (f"{where} exceeded Python's recursion limit ({e}): the model nests "
                       "subgraphs or sequences too deeply to run")
        else:
            message = f"{where} failed: {type(e).__name__}: {e}"
        return KernelError(message, node_name=step.name, op_type=step.op_type)

    def _failed_step(self, error: BaseException) -> Step | None:
        for frame, lineno in traceback.walk_tb(error.__traceback__):
            if frame.f_code.co_filename == self.filename:
                index = self._line_steps.get(lineno)
                return None if index is None else self.plan.steps[index]
        return None


def inplace_default() -> bool:
    """In-place donation unless `ONNXKILN_INPLACE` is "0" (benchmarks compare both)."""
    return os.environ.get("ONNXKILN_INPLACE", "1").strip() != "0"


COMPACT_STEPS = 2000
"""Plans with more steps retry a refused ufunc `out=` through `_out_or_plain`, not a try
block per step: compiling one function with tens of thousands of try blocks grows faster
than linearly (a 100,000-node chain took minutes)."""


def _out_or_plain(kernel: np.ufunc, out: np.ndarray, *args: Any) -> Any:
    """kernel(*args, out=out), or kernel(*args) where the ufunc refuses that `out`."""
    try:
        return kernel(*args, out=out)
    except (ValueError, TypeError):
        return kernel(*args)


MIN_DONATE_BYTES = 4096
"""Smaller arrays are not donated: numpy's allocator caches them cheaply, and a ufunc
writing into its own single-element input takes a slow overlap path (~2 µs measured)."""


def _guard(var: str) -> str:
    """The runtime donation guard: `var` is an ndarray of at least MIN_DONATE_BYTES that
    owns its data or is a view of an array only it references (a kernel's reshaped
    temporary, e.g. MatMul's), and only its local variable references it (`_RC` is
    calibrated)."""
    return (f"_nd is type({var}) and {var}.nbytes >= _MIN and ({var}.base is None or "
            f"_sole({var})) and _rc({var}) == _RC")


def _sole_base(v: np.ndarray) -> bool:
    """Whether v's base is an array owning its data that nothing but v references."""
    b = v.base
    return type(b) is np.ndarray and b.base is None and sys.getrefcount(b) == _RC_BASE


def _base_count(v: np.ndarray) -> int:
    """`_sole_base`'s reference count of v.base, measured the same way (for calibration)."""
    b = v.base
    return sys.getrefcount(b)


_RC_BASE = _base_count(np.empty(8).reshape(2, 4))


def _calibrate() -> int | None:
    """`sys.getrefcount` of an array held by one local, inside the guard expression
    (`_guard` with `_MIN` 0 and `_RC` replaced by the count itself), as the generated code
    evaluates it; None (no donation at all) if two runs of the probe disagree."""
    guard = _guard("v0").replace(" == _RC", "")
    source = f"def probe():\n    v0 = _new(1024)\n    return {guard}\n"
    namespace: dict[str, Any] = {"_rc": sys.getrefcount, "_nd": np.ndarray, "_MIN": 0,
                                 "_new": np.empty, "_sole": _sole_base}
    exec(compile(source, "<onnxkiln calibrate>", "exec"), namespace)
    a, b = namespace["probe"](), namespace["probe"]()
    return a if a == b and type(a) is int and a >= 1 else None


_RC = _calibrate()


def _generate(plan: Plan, donations: dict[int, tuple[int, int]] | None = None,
              guards: dict[int, Guard] | None = None) -> tuple[str, dict[int, int]]:
    """Source of `run` and `run_hooked`, and a map from kernel-call line to step index."""
    donations = donations or {}
    guards = guards or {}

    def ref(slot: int | None) -> str:
        if slot is None:
            return "None"
        return f"c{slot}" if slot in plan.constants else f"v{slot}"

    # a single-output kernel writes only its node's first output; extra unused outputs of
    # the node (the plan refuses used ones) are never bound, so there is nothing to delete
    unwritten = {s for step in plan.steps if not step.spec.multi_output
                 for s in step.outputs[1:] if s is not None}
    dead_at: dict[int, list[int]] = {}
    for s, last in plan.last_use.items():
        if s not in plan.constants and s not in unwritten:
            dead_at.setdefault(last, []).append(s)
    lines: list[str] = []
    line_steps: dict[int, int] = {}

    def emit(text: str, step: int | None = None) -> None:
        if step is not None:
            line_steps[len(lines) + 1] = step
        lines.append("    " + text)

    def dels(i: int) -> None:
        if dead_at.get(i):
            emit(f"del {', '.join(f'v{s}' for s in sorted(dead_at[i]))}")

    for hooked in (False, True):
        lines.append("def run_hooked(inputs, h):" if hooked else "def run(inputs):")
        if plan.input_slots:
            emit(f"{', '.join(f'v{s}' for s in plan.input_slots)}, = inputs")
        dels(-1)
        for i, step in enumerate(plan.steps):
            args = ", ".join(ref(s) for s in step.inputs)
            written = step.outputs if step.spec.multi_output else step.outputs[:1]
            outs = [s for s in written if s is not None]
            if hooked:
                if step.domain == "" and step.op_type in SIZED_OPS:
                    emit(f"h.sizing({i}, ({args}{',' if step.inputs else ''}))", i)
                emit(f"_h = h.start({i})")
            if i in guards:
                checks = " and ".join(f"v{slot}.shape == g{i}_{j}"
                                      for j, (slot, _) in enumerate(guards[i].shapes))
                emit(f"if {checks}:", i)
                _emit_call(lambda text, at=None: emit("    " + text, at), i, step, f"k{i}", args)
                emit("else:")
                _emit_call(lambda text, at=None: emit("    " + text, at), i, step, f"f{i}", args)
            elif i in donations:
                _emit_donating(emit, i, step, args, donations[i][1],
                               compact=len(plan.steps) > COMPACT_STEPS)
            else:
                _emit_call(emit, i, step, f"k{i}", args)
            if hooked:
                emit(f"h.finish(_h, ({args}{',' if step.inputs else ''}), "
                     f"({''.join(f'v{s}, ' for s in outs)}))")
            dels(i)
        emit(f"return [{', '.join(ref(s) for s in plan.output_slots)}]")
    return "\n".join(lines) + "\n", line_steps


def _inline_reshape(step: Step) -> tuple[int, ...] | None:
    """The target of a kernel that only reshapes its first input (tensor.reshaper), which
    the generated code writes as `x.reshape(target)` instead of a call."""
    target = getattr(step.kernel, "reshape_to", None)
    if (type(target) is tuple and not step.spec.multi_output and step.inputs
            and step.inputs[0] is not None and step.outputs and step.outputs[0] is not None):
        return target
    return None


def _emit_call(emit: Callable[..., None], i: int, step: Step, kernel: str, args: str) -> None:
    """The kernel call of step i and the binding of its outputs."""
    if kernel == f"k{i}" and _inline_reshape(step) is not None:
        first = args.split(", ")[0]
        emit(f"v{step.outputs[0]} = {first}.reshape(r{i})", i)
    elif step.spec.multi_output:
        emit(f"_t = {kernel}({args})", i)
        for j, s in enumerate(step.outputs):
            if s is not None:
                emit(f"v{s} = _t[{j}]", i)
        emit("del _t")  # the tuple would keep its items' reference counts up
    elif step.outputs and step.outputs[0] is not None:
        emit(f"v{step.outputs[0]} = {kernel}({args})", i)
    else:
        emit(f"{kernel}({args})", i)


def _emit_donating(emit: Callable[..., None], i: int, step: Step, args: str, slot: int,
                   compact: bool = False) -> None:
    """The call with the dying input v{slot} as `out=` when the runtime guard holds, else
    the plain call; a bare ufunc (it raises instead of falling back) is retried without,
    by a try block or, when `compact`, by `_out_or_plain`."""
    plain = f"v{step.outputs[0]} = k{i}({args})"
    emit(f"if {_guard(f'v{slot}')}:", i)
    if isinstance(step.kernel, np.ufunc) and compact:
        emit(f"    v{step.outputs[0]} = _out_or_plain(k{i}, v{slot}, {args})", i)
    elif isinstance(step.kernel, np.ufunc):
        emit("    try:")
        emit(f"        v{step.outputs[0]} = k{i}({args}, out=v{slot})", i)
        emit("    except _OutErr:")
        emit("        " + plain, i)
    else:
        emit(f"    v{step.outputs[0]} = k{i}({args}, out=v{slot})", i)
    emit("else:")
    emit("    " + plain, i)


@runtime_checkable
class StepHooks(Protocol):
    """What a hooked run calls around its steps (tracing, memory accounting, cancellation,
    recording for specialisation, decode and capture).

    `sizing(i, ins)` before a step whose output size follows from its input values (see
    onnxkiln.sizes), `start(i)` before step i, returning a token, and `finish(token, ins,
    outs)` after it, with the values the kernel read and made."""

    def sizing(self, index: int, ins: tuple) -> None: ...

    def start(self, index: int) -> Any: ...

    def finish(self, token: Any, ins: tuple, outs: tuple) -> None: ...


class CancelHook:
    """Step hooks that stop a run before the next step once `event` is set."""

    __slots__ = ("_event", "_graph", "_steps")

    def __init__(self, event: Any, plan: Plan, graph: str = "main") -> None:
        self._event = event
        self._steps = plan.steps
        self._graph = graph

    def sizing(self, index: int, ins: tuple) -> None:
        pass

    def start(self, index: int) -> None:
        if self._event.is_set():
            raise cancelled(self._graph, self._steps[index], self._event)

    def finish(self, token: Any, ins: tuple, outs: tuple) -> None:
        pass


def cancelled(graph: str, step: Step | None = None, event: Any = None) -> RunCancelledError:
    """The error a cancelled run raises, naming where it stopped (a `RunTimeoutError`
    when `event` is a `Deadline` that passed its time)."""
    if step is None:
        where = f"before running {'graph' if graph == 'main' else 'subgraph'} '{graph}'"
        named: dict[str, str] = {"graph": graph}
    else:
        where = (f"before node '{step.name}' ({step.domain or 'ai.onnx'}::{step.op_type}, "
                 f"node id {step.node_id}) in graph '{graph}'")
        named = {"node_name": step.name, "op_type": step.op_type, "graph": graph}
    if isinstance(event, Deadline) and event.expired():
        elapsed = time.monotonic() - event.started
        return RunTimeoutError(f"run timed out {where}: {elapsed:.3f} s elapsed, over the "
                               f"timeout of {event.timeout:g} s", elapsed=elapsed,
                               timeout=event.timeout, **named)
    return RunCancelledError(f"run cancelled {where}: the cancel event was set", **named)


class Deadline:
    """A cancel event that is also set once `timeout` seconds have passed since it was
    made (`run(..., timeout=...)`); `cancel`, when given, still sets it early."""

    __slots__ = ("_cancel", "_end", "started", "timeout")

    def __init__(self, timeout: float, cancel: Any = None) -> None:
        self.timeout = timeout
        self.started = time.monotonic()
        self._end = self.started + timeout
        self._cancel = cancel

    def expired(self) -> bool:
        """Whether the time is up."""
        return time.monotonic() >= self._end

    def is_set(self) -> bool:
        cancel = self._cancel
        return (cancel is not None and cancel.is_set()) or time.monotonic() >= self._end


@contextlib.contextmanager
def cancel_scope(event: Any) -> Iterator[None]:
    """Make `event` the cancel event of this thread's run, so subgraph bodies check it."""
    previous = getattr(_state, "cancel", None)
    _state.cancel = event
    try:
        yield
    finally:
        _state.cancel = previous


def combine_hooks(*hooks: StepHooks | None) -> StepHooks | None:
    """One hooks object running the given ones (None entries skipped) in order."""
    present = [h for h in hooks if h is not None]
    if not present:
        return None
    combined = present[-1]
    for h in reversed(present[:-1]):
        combined = HookPair(h, combined)
    return combined


class HookPair:
    """Two sets of step hooks run as one (tracing and memory accounting)."""

    __slots__ = ("first", "second")

    def __init__(self, first: StepHooks, second: StepHooks) -> None:
        self.first = first
        self.second = second

    def sizing(self, index: int, ins: tuple) -> None:
        self.first.sizing(index, ins)
        self.second.sizing(index, ins)

    def start(self, index: int) -> tuple[Any, Any]:
        return self.first.start(index), self.second.start(index)

    def finish(self, tokens: tuple[Any, Any], ins: tuple, outs: tuple) -> None:
        self.first.finish(tokens[0], ins, outs)
        self.second.finish(tokens[1], ins, outs)
