"""One session's captured device graph: capture, replay, reset, and what they report.
The audit is onnxkiln.capture; recording and the parts are onnxkiln.replay."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxkiln import capture, replay
from onnxkiln.bindings import DeviceIoBinding, copy_value
from onnxkiln.errors import CaptureError
from onnxkiln.executor import CompiledPlan
from onnxkiln.plan import Plan, Step
from onnxkiln.providers.capture_safe import ViolationWord, capture_safe_kernel
from onnxkiln.trace import StepTracer, TraceContext, step_meta
from onnxkiln.types import Captured, CaptureDecline, NotCapturable

__all__ = ["CaptureContext", "DeviceGraphs"]


@dataclass
class CaptureContext:
    """The session facts a capture needs."""

    graph: ir.Graph
    input_names: list[str]
    output_names: list[str]
    plain: CompiledPlan  # the session's ordinary plan (the growth probe runs it)
    provider: Any  # the bindings' provider (device, or the CPU)
    device_provider: str | None  # its name on a device session, else None
    fallback_reasons: dict[int, str] = field(default_factory=dict)
    allow_seams: bool = True


@dataclass
class _Installed:
    bindings: dict[int, tuple[DeviceIoBinding, Any]]  # id -> (binding, its tensor)
    fixed_logical: list[tuple[DeviceIoBinding, tuple[int, ...]]]  # non-growing bound inputs
    env_inputs: list[tuple[int, Any]]  # (slot, stable value) set before every replay
    growing_inputs: list[tuple[int, DeviceIoBinding]]  # slots re-sliced every replay
    parts: list[replay.Part]
    outputs: list[tuple[int, Any]]  # plan output slots; static ones carry their value
    n_slots: int
    in_place: frozenset[str]
    frozen_feeds: dict[str, Any]
    stores: list[_Store] = field(default_factory=list)
    host: replay.HostReplay | None = None  # all parts fused (host captures)
    passed: tuple[DeviceIoBinding, ...] | None = None  # the bindings the last check passed


@dataclass
class _Store:
    """Where one bound output goes after a replay: `target` is the binding's region of the
    capture-time shape (None: written in place by its kernel, only the logical shape moves)."""

    position: int
    binding: DeviceIoBinding
    shape: tuple[int, ...]
    target: Any


class DeviceGraphs:
    """The installed capture of one session and its counters."""

    def __init__(self, ctx: CaptureContext) -> None:
        self._ctx = ctx
        self._installed: _Installed | None = None
        self.segments = 0
        self.segmentation: list[CaptureDecline] = []
        self._word: Any = None
        self._retired_by = ""  # why the last graph went, when a release retired it
        # the growth probe and audit of earlier captures, by plan structure and binding
        # layout: a new binding set for the same plan (the next generate call) reuses them
        self._audits: dict[tuple, tuple[dict[int, int], capture.Audit]] = {}
        self._node_list: list[ir.Node] | None = None
        self._unsure = False  # the last probe guessed at followers of length 1
        self._audit_of: tuple = ()  # the key of the installed capture's audit

    # capture ------------------------------------------------------------------------
    def capture(self, values: list[Any], bindings: Sequence[DeviceIoBinding],
                compiled: CompiledPlan, in_place: frozenset[str], trace: TraceContext,
                write_back: Callable[[list[Any]], None]) -> Captured | NotCapturable:
        """Audit, then run the step once recording it; install the replay."""
        ctx, plan = self._ctx, compiled.plan
        self.reset()  # a new capture replaces the old graph, whatever its outcome
        self.segments, self.segmentation = 0, []
        slot_of = dict(zip(ctx.input_names, plan.input_slots))
        bound = {slot_of[b.input_name]: b for b in bindings if b.input_name}
        frozen = frozenset(s for s in plan.input_slots if s not in bound)
        for i, s in enumerate(plan.input_slots):  # plain inputs are frozen: keep our copy
            if s in frozen and values[i] is not None:
                values[i] = copy_value(values[i])
        key = self._audit_of = _audit_key(plan, bindings, slot_of, values)
        found = self._audits.get(key)
        if found is None:
            growing, grown = self._probe(values, plan, bindings, slot_of)
            facts = capture.AuditInputs(
                frozen, grown,
                ", ".join(repr(b.input_name) for b in bound.values() if slot_of[b.input_name]
                          in growing), ctx.device_provider, ctx.fallback_reasons,
                frozenset(bound))
            found = growing, grown, capture.audit(plan, ctx.graph, facts)
            if not self._unsure:  # a guess at an empty cache is not kept for later lengths
                if len(self._audits) >= _AUDITS_KEPT:
                    self._audits.pop(next(iter(self._audits)))
                self._audits[key] = found
        growing, grown, audit = found
        refused = self._refusal(audit)
        if refused is not None:
            return refused
        recorder = replay.Recorder(plan)
        hooks: Any = recorder
        if trace.enabled:
            hooks = _with_tracer(recorder, plan, audit, trace)
        if trace.enabled:
            with trace.run_span("model_capture", graph=ctx.graph.name or "main"):
                outputs = compiled.hooked(values, hooks)
        else:
            outputs = compiled.hooked(values, hooks)
        recorder.values.update(zip(plan.input_slots, values))
        self._install(plan, audit, recorder.values, values, bindings, bound, growing, grown,
                      in_place, slot_of)
        self.segments = max(audit.segment_count(), 1)
        self.segmentation = list(audit.declines)
        shapes = [tuple(getattr(v, "shape", ())) for v in outputs]
        write_back(outputs)
        self._installed.stores = _stores(ctx.output_names, bindings, in_place, shapes)
        return Captured(outputs, self.segments)

    def _refusal(self, audit: capture.Audit) -> NotCapturable | None:
        if audit.declines and (not self._ctx.allow_seams or audit.captured_steps == 0):
            return NotCapturable(list(audit.declines))
        return None

    def _probe(self, values: list[Any], plan: Plan, bindings: Sequence[DeviceIoBinding],
               slot_of: dict[str, int]) -> tuple[dict[int, int], frozenset[int]]:
        """The growing bound inputs (slot -> axis) and the slots whose shape changes when
        they grow by one: the ordinary plan runs on copies at the current length and one
        longer. A KV binding grows when its output is longer than its past (an appended
        Concat, an attention kernel writing in place); an input-only binding follows it when
        one of its dims is below capacity and equals the present length (a mask). At an
        empty cache (present length 1) a one-token input looks the same: such candidates
        are kept only if the cache then grows by exactly one."""
        if not any(b.input_name and b.output_name and b.logical_shape != b.physical_shape
                   for b in bindings):
            return {}, frozenset()  # every cache at capacity (a static cache): no growth
        growing: dict[int, int] = {}
        self._unsure = False
        try:
            now = self._shapes(values, {}, 0)
            growing, unsure = _growing_bindings(plan, self._ctx, bindings, slot_of, now)
            self._unsure = bool(unsure)
            if not growing:
                return growing, frozenset()
            longer = None
            if unsure:  # keep them if the cache then grows by one and the step still runs
                try:
                    longer = self._shapes(values, growing, 1)
                except Exception:
                    longer = None
                if longer is None or not _grew_by_one(self._ctx, bindings, slot_of, growing,
                                                      now, longer):
                    growing = {s: a for s, a in growing.items() if s not in unsure}
                    longer = None
            if longer is None:
                longer = self._shapes(values, growing, 1)
        except Exception:  # then every value downstream of a growing input grows
            return growing, _downstream(plan, set(growing))
        _check_not_pinned(self._ctx, plan, bindings, growing, [now, longer], values)
        grown = {s for s, shape in now.items() if longer.get(s) != shape}
        grown |= set(growing)
        for step in plan.steps:  # copy steps of the bound plan follow their input
            if step.node_id < 0 and step.inputs and step.inputs[0] in grown:
                grown.update(s for s in step.outputs if s is not None)
        return growing, frozenset(grown)

    def _shapes(self, values: list[Any], growing: dict[int, int], extra: int
                ) -> dict[int, Any]:
        """Every slot's shape in an ordinary run on `values`, the growing inputs `extra`
        positions longer."""
        plain = self._ctx.plain
        feed = [(_extended(v, growing[s], extra) if s in growing else v)
                for s, v in zip(plain.plan.input_slots, values)]
        rec = replay.Recorder(plain.plan, shapes_only=True)
        plain.hooked(feed, rec)
        return rec.values

    def _install(self, plan: Plan, audit: capture.Audit, recorded: dict[int, Any],
                 values: list[Any], bindings: Sequence[DeviceIoBinding],
                 bound: dict[int, DeviceIoBinding], growing: dict[int, int],
                 grown: frozenset[int], in_place: frozenset[str],
                 slot_of: dict[str, int]) -> None:
        baked = dict(plan.constants)
        for i, st in enumerate(plan.steps):
            if audit.static[i]:
                baked.update((s, recorded[s]) for s in st.outputs if s is not None)
        frozen_slots = {s for s in plan.input_slots if s not in bound}
        baked.update((s, recorded[s]) for s in frozen_slots if s in recorded)
        stable = {s for s in bound if s not in growing}
        word = self._violation_word()
        inp = replay.PartsInput(plan, audit, recorded, baked, stable,
                                _changing_conditions(plan, self._ctx.graph, audit, baked),
                                lambda st: _safe_kernel(st, self._nodes(), word),
                                self._recorder_for(), grown)
        parts = replay.build_parts(inp)
        host = replay.HostReplay(parts, plan) if inp.record is None else None
        self._installed = _Installed(
            {id(b): (b, b.tensor) for b in bindings},
            [(b, b.logical_shape) for s, b in bound.items() if s not in growing],
            [(s, recorded[s]) for s in stable],
            [(s, b) for s, b in bound.items() if s in growing],
            parts,
            [(s, baked.get(s, _LIVE)) for s in plan.output_slots],
            len(plan.slot_names), in_place,
            {n: recorded[s] for n, s in slot_of.items() if s in frozen_slots and s in recorded},
            host=host)

    def _nodes(self) -> list[ir.Node]:
        """The graph's nodes by id (graph.node(i) walks onnx_ir's linked list each time)."""
        if self._node_list is None:
            self._node_list = list(self._ctx.graph)
        return self._node_list

    def _violation_word(self) -> Any:
        if self._word is None:
            self._word = ViolationWord.for_provider(self._ctx.provider)
        return self._word

    def _recorder_for(self) -> Callable[..., Any] | None:
        graphs = self._graph_backend()
        if graphs is None:
            return None

        def record(compiled: CompiledPlan, args: Sequence[Any], stable: Sequence[bool],
                   part: replay.Part) -> replay.CudaSegment:
            label = f"of steps {part.steps[0]}..{part.steps[-1]}"
            return replay.CudaSegment(compiled, args, stable, graphs, label)

        return record

    def _graph_backend(self) -> Any:
        """TorchCudaGraphs on a CUDA device; None (pre-bound replay lists) elsewhere."""
        device = getattr(self._ctx.provider, "torch_device", None)
        if device is None or device.type != "cuda":
            return None
        return replay.TorchCudaGraphs(device)

    # replay -------------------------------------------------------------------------
    def replay(self, bindings: Sequence[DeviceIoBinding],
               write_back: Callable[[list[Any], frozenset[str]], None],
               eager: Callable[[dict[str, Any]], None], trace: TraceContext) -> bool:
        """Replay the installed step; False when it retired (the step ran correctly)."""
        g = self._installed
        if g is None:
            raise CaptureError(f"no captured device graph is installed{self._retired_by}; call "
                               "try_capture_with_device_bindings first (or again after "
                               "reset_device_graph / a retired replay)")
        self._check_signature(g, bindings)
        for b, shape in g.fixed_logical:
            if b._logical != shape:  # a fixed binding changed length: the graph baked it in
                eager(g.frozen_feeds)
                self.reset()
                self._audits.pop(self._audit_of, None)  # probe again at the next capture
                return False
        env: list[Any] = [None] * g.n_slots
        for s, v in g.env_inputs:
            env[s] = v
        for s, b in g.growing_inputs:
            env[s] = b.view()
        if trace.enabled:
            with trace.run_span("model_replay", graph=self._ctx.graph.name or "main"):
                valid = replay.run_parts(g.parts, env, trace)
        elif g.host is not None:
            valid = g.host(env)
        else:
            valid = replay.run_parts(g.parts, env)
        outputs = [env[s] if v is _LIVE else v for s, v in g.outputs]
        if not _store(g.stores, outputs):
            write_back(outputs, g.in_place)
        if not valid:
            self.reset()
        return valid

    def _check_signature(self, g: _Installed, bindings: Sequence[DeviceIoBinding]) -> None:
        if g.passed is not None and tuple(bindings) == g.passed:
            return  # the bindings that passed last time: a release since would have retired g
        if len(bindings) != len(g.bindings) or {id(b) for b in bindings} != g.bindings.keys():
            names = sorted(b.input_name or b.output_name or "?" for b, _ in g.bindings.values())
            raise CaptureError(f"replay_device_graph needs the bindings of the capture "
                               f"({names}), the same objects; got {list(bindings)!r}")
        for b, tensor in g.bindings.values():
            if b.released or b.tensor is not tensor:
                raise CaptureError(f"{b!r} was released or its buffer replaced since the "
                                   "capture; reset_device_graph() and capture again")
        g.passed = tuple(bindings)

    def forget(self, binding: DeviceIoBinding) -> None:
        """Retire the graph when a binding it uses is released."""
        if self._installed is not None and id(binding) in self._installed.bindings:
            self.reset()
            self._retired_by = f" (the last one was retired when {binding!r} was released)"

    def reset(self) -> bool:
        """Drop the installed graph and clear the violation word; whether one was there."""
        self._retired_by = ""
        had = self._installed is not None
        self._installed = None
        if self._word is not None:
            self._word.clear()
        return had

    @property
    def installed(self) -> bool:
        return self._installed is not None

    def violations(self) -> int:
        """The latched violation bits (0: none)."""
        return 0 if self._word is None else int(self._word.read())


_LIVE = object()  # marks an output slot whose value comes from the replay
_AUDITS_KEPT = 8


def _audit_key(plan: Plan, bindings: Sequence[DeviceIoBinding], slot_of: dict[str, int],
               values: Sequence[Any]) -> tuple:
    """What the probe and the audit of a capture depend on: the plan's structure (not its
    kernel objects, which close over the bindings), which slots are bound and how (dims
    below capacity, the lengths that may grow, abstracted) and the frozen inputs' shapes.
    Reusing a result across lengths stays correct: a binding wrongly taken as growing
    runs its nodes eagerly, one wrongly taken as fixed retires the graph when it moves."""
    steps = tuple((st.op_type, st.domain, st.inputs, st.outputs,
                   getattr(st.kernel, "variant", None)) for st in plan.steps)
    layout = tuple((slot_of.get(b.input_name) if b.input_name else None, b.output_name,
                    b.dtype, b.physical_shape,
                    tuple(n if n == p else None for n, p in zip(b.logical_shape,
                                                                b.physical_shape)))
                   for b in bindings)
    bound = {slot_of[b.input_name] for b in bindings if b.input_name}
    frozen = tuple((s, tuple(getattr(v, "shape", ())), getattr(v, "dtype", type(v)))
                   for s, v in zip(plan.input_slots, values) if s not in bound)
    return steps, layout, frozen


def _stores(names: Sequence[str], bindings: Sequence[DeviceIoBinding],
            in_place: frozenset[str], shapes: Sequence[tuple[int, ...]]) -> list[_Store]:
    by_output = {b.output_name: b for b in bindings if b.output_name}
    stores = []
    for i, (name, shape) in enumerate(zip(names, shapes)):
        b = by_output[name]
        region = tuple(slice(0, n) for n in shape) or ...  # a 0-d view, not a scalar copy
        target = None if name in in_place else b.tensor[region]
        stores.append(_Store(i, b, shape, target))
    return stores


def _store(stores: Sequence[_Store], outputs: list[Any]) -> bool:
    """Write the outputs to their bindings when each has its capture-time shape (False:
    none written, the general write-back must run)."""
    for st in stores:
        if st.target is not None and tuple(outputs[st.position].shape) != st.shape:
            return False
    for st in stores:
        value, outputs[st.position] = outputs[st.position], None
        if st.target is None:
            st.binding._logical = tuple(value.shape)
        elif isinstance(st.target, np.ndarray):
            np.copyto(st.target, value)
            st.binding._logical = st.shape
        else:
            if isinstance(value, np.ndarray):  # computed by a host node
                import torch

                value = torch.from_numpy(value)
            st.target.copy_(value)
            st.binding._logical = st.shape
    return True


def _growing_bindings(plan: Plan, ctx: CaptureContext, bindings: Sequence[DeviceIoBinding],
                      slot_of: dict[str, int], shapes: dict[int, Any]
                      ) -> tuple[dict[int, int], set[int]]:
    """Input slot -> growing axis of each bound input that grows from step to step: KV
    bindings whose output (in `shapes`, the slot shapes of an ordinary run at the current
    length) is longer than their past on one axis, and input-only bindings that follow them
    (a dim below capacity equal to a growing present's length, as a mask's is); and the
    followers matched at length 1 (a capture at an empty cache), where a one-token input
    looks the same."""
    out_slot = dict(zip(ctx.output_names, ctx.plain.plan.output_slots))
    growing: dict[int, int] = {}
    unsure: set[int] = set()
    lengths: set[int] = set()
    for b in bindings:
        if not (b.input_name and b.output_name):
            continue
        past, present = b.logical_shape, shapes.get(out_slot[b.output_name])
        if not isinstance(present, tuple) or len(present) != len(past):
            continue
        moved = [a for a, (n, m) in enumerate(zip(past, present)) if n != m]
        if len(moved) == 1 and present[moved[0]] > past[moved[0]]:
            growing[slot_of[b.input_name]] = moved[0]
            lengths.add(present[moved[0]])
    for b in bindings:
        if b.input_name is None or b.output_name is not None or not growing:
            continue
        axes = [a for a, (n, cap) in enumerate(zip(b.logical_shape, b.physical_shape))
                if n < cap and n in lengths]
        if len(axes) == 1:
            growing[slot_of[b.input_name]] = axes[0]
            if b.logical_shape[axes[0]] == 1:
                unsure.add(slot_of[b.input_name])
    return growing, unsure


def _grew_by_one(ctx: CaptureContext, bindings: Sequence[DeviceIoBinding],
                 slot_of: dict[str, int], growing: dict[int, int], now: dict[int, Any],
                 longer: dict[int, Any]) -> bool:
    """Whether every growing KV binding's output is one position longer in `longer` than
    in `now` (an input extended with it that adds tokens makes it grow by more)."""
    out_slot = dict(zip(ctx.output_names, ctx.plain.plan.output_slots))
    for b in bindings:
        slot = slot_of.get(b.input_name) if b.input_name else None
        if slot not in growing or not b.output_name:
            continue
        a, out = growing[slot], out_slot[b.output_name]
        before, after = now.get(out), longer.get(out)
        if not isinstance(before, tuple) or not isinstance(after, tuple) \
                or after[a] - before[a] != 1:
            return False
    return True


def _check_not_pinned(ctx: CaptureContext, plan: Plan, bindings: Sequence[DeviceIoBinding],
                      growing: dict[int, int], shapes: list[dict[int, Any]],
                      values: Sequence[Any]) -> None:
    """Refuse a capture whose replays could not follow the cache: a growing binding's output
    that does not grow when its past does is pinned by a frozen input (a plain attention
    mask given at capture), so every replay would write the same position again."""
    out_slot = dict(zip(ctx.output_names, ctx.plain.plan.output_slots))
    slot_of = dict(zip(ctx.input_names, plan.input_slots))
    pinned = [b for b in bindings if b.input_name and b.output_name
              and slot_of[b.input_name] in growing
              and shapes[0].get(out_slot[b.output_name]) == shapes[1].get(
                  out_slot[b.output_name])]
    if not pinned:
        return
    bound = {b.input_name for b in bindings if b.input_name}
    plain = [f"'{n}' {tuple(v.shape)}" for n, v in zip(ctx.input_names, values)
             if n not in bound and hasattr(v, "shape")]
    raise CaptureError(
        f"{pinned[0]!r} grows each step, but its output keeps its length when the past "
        f"grows: a plain input frozen at capture fixes it ({', '.join(plain) or 'none'}). "
        "Bind what changes with the cache (e.g. the attention mask: allocate_device_binding "
        "with the cache's capacity, set_logical_shape each step) instead of passing it in "
        "inputs; nothing was recorded")


def _extended(value: Any, axis: int, extra: int) -> Any:
    """A copy of `value` with `extra` more positions (zeros) on `axis`."""
    shape = list(value.shape)
    n = shape[axis]
    shape[axis] += extra
    region = (slice(None),) * axis + (slice(0, n),)
    if isinstance(value, np.ndarray):
        out = np.zeros(shape, value.dtype)
    else:
        import torch

        out = torch.zeros(shape, dtype=value.dtype, device=value.device)
    out[region] = value
    return out


def _downstream(plan: Plan, slots: set[int]) -> frozenset[int]:
    reach = set(slots)
    for step in plan.steps:
        if any(s in reach for s in step.inputs if s is not None):
            reach.update(s for s in step.outputs if s is not None)
    return frozenset(reach)


def _changing_conditions(plan: Plan, graph: ir.Graph, audit: capture.Audit,
                         baked: dict[int, Any]) -> dict[int, int]:
    """Step index -> condition slot of each eager If whose condition is not static."""
    return {i: st.inputs[0] for i, st in enumerate(plan.steps)
            if st.op_type == "If" and st.domain == "" and not audit.static[i]
            and st.inputs and st.inputs[0] is not None and st.inputs[0] not in baked}


def _safe_kernel(step: Step, nodes: Sequence[ir.Node], word: Any) -> Any:
    attrs = {}
    if step.node_id >= 0:
        attrs = {k: a.value for k, a in nodes[step.node_id].attributes.items()}
    safe = capture_safe_kernel(step, attrs, word)
    return step.kernel if safe is None else safe


def _with_tracer(recorder: replay.Recorder, plan: Plan, audit: capture.Audit,
                 trace: TraceContext) -> Any:
    """Recording hooks plus spans carrying capture_status / capture_reason."""
    from onnxkiln.executor import HookPair

    meta = []
    for (name, kernel, variant, static), seam, is_static in zip(
            step_meta(plan.steps, "main"), audit.seams, audit.static):
        status = "static" if is_static else ("seam" if seam else "captured")
        reason = seam[1] if seam else ("computed once at capture: it reads only constants, "
                                       "frozen inputs and fixed shapes" if is_static else "")
        meta.append((name, kernel, variant,
                     {**static, "capture_status": status, "capture_reason": reason}))
    return HookPair(recorder, StepTracer(trace, meta))
