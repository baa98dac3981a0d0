"""InferenceSession: the public façade (SessionBuilder, its configuration, is in
onnxkiln.builder). No op logic lives here."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxkiln import ep_context, ep_context_load, loader, optimizer, sizes, warmup
from onnxkiln.binding_plans import BindingPlans
from onnxkiln.bindings import DeviceIoBinding, SessionBindings
from onnxkiln.builder import SessionBuilder, check_trace
from onnxkiln.decode import DecodeMemo
from onnxkiln.device_graph import CaptureContext, DeviceGraphs
from onnxkiln.dtypes import DataType
from onnxkiln.errors import CaptureError, InvalidOptionError, SequenceOutputError
from onnxkiln.executor import CancelHook, CompiledPlan, cancel_scope, cancelled, combine_hooks
from onnxkiln.memory import MemoryPlan, MemoryTracker, PeakPlanner, ShapeOracle, simulate, tracking
from onnxkiln.options import SessionConfig
from onnxkiln.partition import Placement, insert_copies, place, with_context_providers
from onnxkiln.plan import BodyOptions, Plan, prune_outputs
from onnxkiln.pool import run_enter, run_leave, run_scope
from onnxkiln.providers.base import ControlFlowCounter
from onnxkiln.run_args import check_cancel, deadline, each_once, output_kind, split_run_args
from onnxkiln.specialize import PlanSpecializer, Specialization, SpecializationCache
from onnxkiln.threads import default_threads
from onnxkiln.trace import TraceContext
from onnxkiln.types import (
    CacheStats,
    CaptureDecline,
    ControlFlowStats,
    DeviceAllocationCounts,
    DeviceGraphCaptureResult,
    DeviceId,
    ExecutionProviderFallbackReport,
    IoMeta,
    MemoryStats,
    ModelMetadata,
    SessionOutput,
    WarmupShape,
)
from onnxkiln.validation import InputValidator

__all__ = ["InferenceSession", "SessionBuilder"]

_MAX_PRUNED = 16  # compiled plans kept for run(outputs=...) subsets
_INT64_MAX = (1 << 63) - 1  # the model version onnxruntime reports when none is set
_BUILDER_KEYWORDS = ("device", "providers", "optimization", "intra_op_threads", "options",
                     "trace", "warmup", "memory_limit")

logger = logging.getLogger(__name__)


class InferenceSession:
    """A loaded model ready to run: `InferenceSession("model.onnx").run({"x": x})`.

    `model` is a path, serialized bytes, an onnx.ModelProto or an onnx_ir Model or Graph.
    The keyword options are SessionBuilder's setters by name (`device`, `providers`,
    `optimization`, `intra_op_threads`, `trace`, `warmup`, `memory_limit`, and `options`
    as a mapping of `option(key, value)` pairs); `external_data_dir` is where the external
    data of a model given as bytes lies.

    Example:
        >>> session = InferenceSession("model.onnx", providers=["CPUExecutionProvider"],
        ...                            intra_op_threads=2)
    """

    def __init__(self, model: str | os.PathLike | bytes | onnx.ModelProto | ir.Model | ir.Graph,
                 /, *, external_data_dir: str | os.PathLike | None = None,
                 **options: Any) -> None:
        unknown = sorted(set(options) - set(_BUILDER_KEYWORDS))
        if unknown:
            raise InvalidOptionError(
                f"InferenceSession has no option {unknown[0]!r}; it takes "
                f"{[*_BUILDER_KEYWORDS, 'external_data_dir']}")
        SessionBuilder.configured(**options)._build_into(self, model, external_data_dir)

    def _setup(self, model: ir.Model, placement: Placement, config: SessionBuilder,
               model_path: str | os.PathLike | None = None,
               model_dir: str | os.PathLike | None = None) -> None:
        """Optimize, place, plan and compile `model` (SessionBuilder calls this)."""
        self._config = options = SessionConfig.from_options(config._options)
        self._declared_opsets = dict(model.opset_imports)  # fusions may import more
        self._ep_config = ep_context.ep_context_config(options, model_path)
        if ep_context_load.has_ep_context(model):  # a dumped context model: load its partitions
            placement = with_context_providers(placement)
            folder = Path(model_path).resolve().parent if model_path is not None else model_dir
            model = ep_context_load.load_with_contexts(model, folder, placement.providers)
        model = optimizer.optimize_and_save(model, config._optimization, placement.registries,
                                            options.optimized_model_path)
        self._ep_partitions: list[ep_context.CompiledPartition] = []
        compiler = next((p for p in placement.providers if hasattr(p, "compile")), None)
        if compiler is not None:
            model, self._ep_partitions = ep_context_load.apply_fuse(
                model, compiler, self._ep_config, model_path)
        self._model = model
        self._placement = placement
        self._optimization = config._optimization
        self._threads = config._threads if config._threads is not None else default_threads()
        self._control_flow = ControlFlowCounter()
        self._raw_plan, self._fallback = place(
            model, placement, self._control_flow,
            BodyOptions(options.memory_inplace, options.specialize))
        self._plan = self._with_copies(self._raw_plan)
        self._compiled = CompiledPlan(self._plan, inplace=options.memory_inplace)
        self._inputs = [
            loader.io_meta(model, v, optional=v.is_initializer()) for v in model.graph.inputs
        ]
        self._outputs = [loader.io_meta(model, v) for v in model.graph.outputs]
        self._output_names = [m.name for m in self._outputs]
        defaults = [self._plan.input_defaults.get(s) for s in self._plan.input_slots]
        self._validator = InputValidator(self._inputs, defaults,
                                         device=next((p for p in placement.providers
                                                      if not p.on_host), None))
        self._cache = SpecializationCache(self._specialize)
        self._specializer = (PlanSpecializer(self._compiled, model.graph)
                             if options.specialize else None)
        self._copy_outputs = self._plan.output_may_alias
        self._trace = config._trace
        self._memory_limit = config._memory_limit
        self._memory_plan = MemoryPlan(self._plan, self._compiled.donations)
        self._track_memory = (self._memory_limit is not None
                              or options.memory_track)
        self._peaks = PeakPlanner(model, self._memory_plan)
        self._last_reuses: int | None = None
        self._shape_oracle: ShapeOracle | None = None
        plans = BindingPlans(self._raw_plan, model.graph, self._with_copies,
                             [m.name for m in self._inputs], [m.name for m in self._outputs],
                             self._compiled.inplace)
        self._bindings = SessionBindings(next((p for p in placement.providers if not p.on_host),
                                              placement.providers[0]),
                                         self._inputs, self._outputs, plans)
        self._graphs = self._device_graphs()
        self._decode_memo = DecodeMemo(self._validator, self._cache, self._bindings,
                                       [m.name for m in self._outputs], self._copy_outputs,
                                       self._threads, self._model.graph.name, options,
                                       model.graph)
        self._bindings.release_hooks += [self._decode_memo.forget, self._graphs.forget]
        self._size_predictors: dict[int, Any] | None = None  # built on the first limited run
        self._pruned_plans: dict[tuple[int, ...], CompiledPlan] = {}  # outputs= selections
        self._pruned_lock = threading.Lock()
        self._last_peak: int | None = None

    def _device_graphs(self) -> DeviceGraphs:
        """The capture state over this session's plan, bindings and placement."""
        device = self._bindings.provider
        declines = self._fallback.declines if self._fallback else []
        return DeviceGraphs(CaptureContext(
            self._model.graph, [m.name for m in self._inputs], [m.name for m in self._outputs],
            self._compiled, device, None if device.on_host else device.name,
            {d.node_id: d.reason for d in declines},
            self._config.capture_allow_seams))

    # construction -----------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike) -> InferenceSession:
        """Load a model file with default settings (device "auto")."""
        return SessionBuilder().load(path)

    @classmethod
    def load_bytes(
        cls, data: bytes | bytearray | memoryview, external_data_dir: str | None = None
    ) -> InferenceSession:
        """Load a model from serialized bytes."""
        return SessionBuilder().load_bytes(data, external_data_dir)

    @classmethod
    def from_graph(cls, graph: ir.Graph | ir.Model | onnx.ModelProto) -> InferenceSession:
        """Build a session from an in-memory graph; no file or weight store needed."""
        return SessionBuilder().from_graph(graph)

    @staticmethod
    def builder() -> SessionBuilder:
        """Start a fluent configuration."""
        return SessionBuilder()

    # running ----------------------------------------------------------------
    def run(self, *args: Any, outputs: Sequence[str] | None = None,
            cancel: threading.Event | None = None,
            timeout: float | None = None) -> list[np.ndarray]:
        """Run on named inputs; returns numpy arrays in graph-output order, or the outputs
        named in `outputs`, in that order (only the nodes they depend on run).

        `run(inputs)` is the native form; onnxruntime's order works too:
        `run(None, inputs)` for every output, `run(["y"], inputs)` for some.

        `cancel`: an event (anything with `is_set()`) another thread may set to stop the
        run before its next node or Loop/Scan iteration with `RunCancelledError`; a kernel
        already running finishes first. `timeout`: seconds after which the run stops the
        same way with `RunTimeoutError` (a RunCancelledError). Without either the run has
        no per-node check.

        Example:
            >>> y, = session.run({"x": x}, timeout=5.0)  # give up after 5 s
            >>> logits, = session.run(["logits"], {"input_ids": ids})
        """
        inputs, names = split_run_args("run", args, outputs, self._output_names)
        self._decode_memo.note_ineligible()
        cancel = deadline(cancel, timeout)
        if names is None:
            return self._run(inputs, cancel=cancel, tensors=True)
        return self._run_selected(inputs, names, cancel, tensors=True)

    def run_outputs(self, *args: Any, outputs: Sequence[str] | None = None,
                    cancel: threading.Event | None = None,
                    timeout: float | None = None) -> list[SessionOutput]:
        """Run and keep each output's kind (tensor, sequence, map, optional); the forms,
        `outputs`, `cancel` and `timeout` as in `run`."""
        inputs, names = split_run_args("run_outputs", args, outputs, self._output_names)
        self._decode_memo.note_ineligible()
        cancel = deadline(cancel, timeout)
        if names is None:
            names = [m.name for m in self._outputs]
            values = self._run(inputs, cancel=cancel)
        else:
            values = self._run_selected(inputs, names, cancel, tensors=False)
        return [SessionOutput(n, output_kind(v), v) for n, v in zip(names, values)]

    def _run_selected(self, inputs: Any, names: list[str], cancel: Any,
                      tensors: bool) -> list[Any]:
        """The outputs `names` from a plan pruned to what they need (cached per subset).
        With memory tracking on, the whole plan runs (its accounting follows every step)."""
        position = {m.name: i for i, m in enumerate(self._outputs)}
        wanted = tuple(sorted({position[n] for n in names}))
        if len(wanted) == len(self._outputs) or self._track_memory:
            values = self._run(inputs, cancel=cancel, tensors=tensors)
            return each_once([values[position[n]] for n in names])
        if cancel is not None:
            check_cancel(cancel)
        compiled = self._pruned(wanted)
        values, _ = self._validator.bind(inputs)
        previous = run_enter(self._threads)
        try:
            if self._trace.enabled or cancel is not None:
                results, _ = self._run_hooked(values, self._trace, cancel, compiled)
            else:
                results = compiled(values)
        finally:
            run_leave(previous)
        metas = [self._outputs[i] for i in wanted]
        results = self._finish(results, compiled.plan.output_may_alias, tensors, metas)
        at = {p: results[k] for k, p in enumerate(wanted)}
        return each_once([at[position[n]] for n in names])

    def _pruned(self, wanted: tuple[int, ...]) -> CompiledPlan:
        """The compiled plan of the outputs at positions `wanted` (the last 16 kept)."""
        with self._pruned_lock:
            compiled = self._pruned_plans.pop(wanted, None)
            if compiled is None:
                compiled = CompiledPlan(prune_outputs(self._plan, wanted),
                                        inplace=self._compiled.inplace)
            self._pruned_plans[wanted] = compiled
            while len(self._pruned_plans) > _MAX_PRUNED:
                self._pruned_plans.pop(next(iter(self._pruned_plans)))
        return compiled

    def _run(self, inputs: Any, trace: bool = True, cancel: Any = None,
             specialize_now: bool = False, tensors: bool = False) -> list[Any]:
        if cancel is not None:
            check_cancel(cancel)
        values, signature = self._validator.bind(inputs)
        entry = self._cache.get(signature)
        compiled = entry.compiled
        previous = run_enter(self._threads)
        try:
            if (trace and self._trace.enabled) or self._track_memory or cancel is not None:
                outputs, compiled = self._run_hooked(values, self._trace if trace else None,
                                                     cancel, compiled)
            elif compiled is not None:
                outputs = compiled(values)
            elif ((entry.sightings > 1 or specialize_now) and self._specializer is not None
                  and self._cache.claim_build(entry)):
                outputs = self._record_and_build(values, entry)
            else:
                outputs = self._compiled(values)
        finally:
            run_leave(previous)
        return self._finish(outputs, self._copy_outputs if compiled is None
                            else entry.copy_outputs, tensors)

    def _finish(self, outputs: list[Any], copy: Sequence[bool], tensors: bool,
                metas: Sequence[IoMeta] | None = None) -> list[Any]:
        """Outputs the caller owns: arrays (not numpy scalars), never a constant's or an
        input's memory, never read-only; with `tensors`, only tensors (run's contract)."""
        for i, value in enumerate(outputs):
            if type(value) is np.ndarray:
                if copy[i] or not value.flags.writeable:
                    outputs[i] = value.copy()
            elif isinstance(value, np.generic):
                outputs[i] = np.asarray(value)
            elif isinstance(value, np.ndarray):
                if copy[i] or not value.flags.writeable:
                    outputs[i] = value.copy()
            elif tensors:
                raise SequenceOutputError(f"output '{(metas or self._outputs)[i].name}' is a "
                                          f"{output_kind(value)}, not a tensor; use run_outputs()")
            elif isinstance(value, list):  # elements may be the caller's own input arrays
                outputs[i] = [v.copy() if isinstance(v, np.ndarray) else v for v in value]
        return outputs

    def _record_and_build(self, values: list[Any], entry: Specialization) -> list[Any]:
        """Run the generic plan once, recording, and build the signature's specialisation
        from what it saw (onnxkiln.specialize); a failed build leaves the generic plan."""
        outputs, recorder = self._specializer.record(values)
        try:
            self._specializer.build(recorder, entry)
        except Exception:
            logger.warning("could not specialise the plan for signature %s; the generic plan "
                           "keeps running it", entry.signature, exc_info=True)
        return outputs

    def _run_hooked(self, values: list[Any], ctx: TraceContext | None,
                    cancel: Any = None, compiled: CompiledPlan | None = None
                    ) -> tuple[list[Any], CompiledPlan | None]:
        """A run with step hooks; the signature's specialised plan when it has one, except
        with memory tracking (its accounting follows the generic plan's steps). Returns the
        outputs and the specialised plan that ran (None: the generic one)."""
        tracker = None
        if self._track_memory:
            compiled = None
            if self._memory_limit is not None and self._size_predictors is None:
                self._size_predictors = sizes.predictors(self._plan.steps, self._model.graph)
            tracker = MemoryTracker(self._memory_plan, self._memory_limit or float("inf"),
                                    values, self._size_predictors)
        plan = self._compiled if compiled is None else compiled
        stop = None
        if cancel is not None:
            if cancel.is_set():
                raise cancelled("main", event=cancel)
            stop = CancelHook(cancel, plan.plan)
        with cancel_scope(cancel), tracking(tracker):
            if ctx is None or not ctx.enabled:
                outputs = plan.hooked(values, combine_hooks(stop, tracker))
            else:
                with ctx.run_span("model_run", graph=self._model.graph.name or "main"):
                    hooks = combine_hooks(stop, plan.tracer(ctx), tracker)
                    outputs = plan.hooked(values, hooks)
        if tracker is not None:
            self._last_peak, self._last_reuses = tracker.peak, tracker.reuses
            self._peaks.observe(self._cache.last_signature, tracker.sizes)
        return outputs, compiled

    def _specialize(self, signature: Any) -> Specialization:
        if self._memory_limit is None:
            return Specialization(signature)
        try:
            if self._shape_oracle is None:
                self._shape_oracle = ShapeOracle(self._model, self._plan)
            sizes = self._shape_oracle.sizes(signature)
        except Exception:  # the prediction is advisory: each step is still checked as it runs
            logger.debug("shape inference for the memory plan failed", exc_info=True)
            sizes = {}
        return Specialization(signature, simulate(self._memory_plan, sizes, self._memory_limit))

    def warmup(self, shapes: Sequence[WarmupShape]) -> None:
        """Build the specialisations of the given shape sets ahead of the first real run.

        A repeated input name starts a new shape set. Inputs a set leaves out take their
        declared shape, symbolic dims bound from the named inputs. Each set runs once,
        untraced, on zeros, recording what its specialised plan needs.
        """
        for group in warmup.shape_sets(shapes):
            self._run(warmup.feeds(self._inputs, group), trace=False, specialize_now=True)

    def set_trace_context(self, ctx: TraceContext) -> None:
        """Trace later runs into `ctx`; TraceContext.disabled() turns tracing off."""
        self._trace = check_trace(ctx)

    def last_run_peak_bytes(self) -> int | None:
        """Peak live bytes the last successful run held (inputs and activations, not
        weights; see onnxkiln.memory). Tracked only with a memory_limit or option
        memory.track=1, else None."""
        return self._last_peak

    def memory_stats(self) -> MemoryStats:
        """Planned and measured peak live bytes and in-place buffer reuse (MemoryStats).

        The planned peak runs shape inference for the last run's input signature on the
        first call per signature (sizes it cannot infer come from a tracked run of that
        signature); measured values need a memory_limit or memory.track=1.
        """
        signature = self._cache.last_signature
        planned = None if signature is None else self._peaks.peak(signature)
        return MemoryStats(planned, self._last_peak, self._last_reuses,
                           len(self._compiled.donations))

    def _with_copies(self, plan: Plan, keep_on_device: frozenset[int] = frozenset()) -> Plan:
        if not self._placement.on_device:
            return plan
        return insert_copies(plan, self._placement.providers, keep_on_device)

    # device bindings --------------------------------------------------------
    def allocate_device_binding(self, input_name: str, output_name: str | None,
                                dtype: DataType, physical_shape: Sequence[int],
                                logical_shape: Sequence[int]) -> DeviceIoBinding:
        """A persistent buffer on this session's device for an input, and with
        `output_name` for that output too (written back in place: the KV-cache pattern).

        Example:
            >>> kv = s.allocate_device_binding("past_key_0", "present_key_0",
            ...                                ok.DataType.FLOAT, (1, 12, 1024, 64), (1, 12, 0, 64))
        """
        return self._bindings.allocate(input_name, output_name, dtype, physical_shape,
                                       logical_shape)

    def allocate_device_output_binding(self, output_name: str, dtype: DataType,
                                       physical_shape: Sequence[int],
                                       logical_shape: Sequence[int]) -> DeviceIoBinding:
        """A persistent device buffer an output is written into (run returns None for it)."""
        return self._bindings.allocate(None, output_name, dtype, physical_shape, logical_shape)

    def run_with_device_bindings(self, inputs: Any, bindings: Sequence[DeviceIoBinding]
                                 ) -> list[np.ndarray | None]:
        """Run with some inputs and outputs in device bindings. Bound outputs come back as
        None (their values are in the bindings, logical shapes updated); the rest as in
        `run`. A KV output Concat(past, new) on its past's binding writes only `new`."""
        feeds = self._validator._normalise(inputs)
        bindings = self._bindings.check(feeds, bindings)
        return self._decode_memo.run(feeds, bindings, self._trace)  # onnxkiln.decode

    def device_allocation_counts(self) -> DeviceAllocationCounts | None:
        """Device allocator activity (CUDA: torch's allocator statistics); None on the CPU."""
        return self._bindings.provider.allocation_counts()

    def decode_memo_counts(self) -> tuple[int, int, int, int]:
        """(primed, rebuilt, replayed, ineligible) of the decode memo.

        A bound run whose binding layout and plain-input dtypes and ranks match the memo's
        replays it (skipping bound-input validation and the cache lookups); a plain dim may
        differ only by what a bound logical length grew. Another key builds anew (the
        first: primed, later: rebuilt). Runs without bindings, `run`/`run_outputs` and
        captured replays count as ineligible. Option decode.memo=0 turns the memo off.

        Example:
            >>> s.decode_memo_counts()  # prefill (1, 5), then 10 steps of (1, 1)
            (1, 1, 9, 0)
        """
        return self._decode_memo.counts()

    def decode_view_plan_counts(self) -> tuple[int, int]:
        """(views_reused, dispatch_elided) on replayed decode steps: binding views
        kept because their logical shape did not change, plus view steps (Reshape,
        Unsqueeze, ...) of invariant inputs whose output was reused instead of dispatched
        (counted in both)."""
        return self._decode_memo.view_plan_counts()

    def generate(self, prompt: Any, **options: Any) -> Any:
        """Tokens after `prompt` from this decoder graph: `onnxkiln.generate(self, ...)`."""
        from onnxkiln.generation import generate
        return generate(self, prompt, **options)

    # device-graph capture (onnxkiln.capture, onnxkiln.replay, onnxkiln.device_graph) ---
    def try_capture_with_device_bindings(self, inputs: Any, bindings: Sequence[DeviceIoBinding]
                                         ) -> DeviceGraphCaptureResult:
        """Run this step once and record it for `replay_device_graph`.

        Every graph output must be bound. Plain `inputs` are frozen into the graph (copied
        now, reused by every replay); what changes step to step lives in bindings the
        caller writes before each replay. The audit runs first: `NotCapturable` (nothing
        ran, an eager retry is safe) when no step could be recorded, or when any node
        declines and option capture.allow_seams is "0"; otherwise the step runs and
        `Captured(outputs, segments)` comes back, seams listed in capture_segmentation().

        Example:
            >>> res = s.try_capture_with_device_bindings({}, bindings)
            >>> while res.captured and s.replay_device_graph(bindings): ...
        """
        feeds = self._validator._normalise(inputs)
        bindings = self._bindings.check(feeds, bindings)
        bound = {b.output_name for b in bindings if b.output_name}
        unbound = [m.name for m in self._outputs if m.name not in bound]
        if unbound:
            raise CaptureError(f"every graph output must be bound to capture; unbound: {unbound} "
                               "(allocate_device_output_binding for each)")
        feeds.update((b.input_name, b.view()) for b in bindings if b.input_name)
        values, signature = self._validator.bind(feeds)
        self._cache.get(signature)
        self._decode_memo.note_ineligible()
        compiled, in_place = self._bindings.plans.get(bindings)
        with run_scope(self._threads):
            return self._graphs.capture(
                values, bindings, compiled, in_place, self._trace,
                lambda outs: self._bindings.write_back(outs, bindings, in_place))

    def replay_device_graph(self, bindings: Sequence[DeviceIoBinding]) -> bool:
        """Replay the captured step after refreshing bound inputs. True: still valid; False:
        an If flipped or a segment's input changed shape, so this step ran eagerly
        (its outputs are correct: do not run the step again) and the graph is retired:
        capture on the next step. Other bindings
        than the capture's, or a released one, raise CaptureError."""
        self._decode_memo.note_ineligible()
        with run_scope(self._threads):
            return self._graphs.replay(
                bindings, lambda outs, in_place: self._bindings.write_back(outs, bindings,
                                                                           in_place),
                lambda feeds: self._decode_memo.run_ordinary(feeds, list(bindings), self._trace),
                self._trace)

    def reset_device_graph(self) -> bool:
        """Retire the captured graph and clear the violation word; whether one was installed.
        Call it before rewinding a cache, changing shapes or releasing bindings."""
        return self._graphs.reset()

    def captured_graph_segment_count(self) -> int:
        """Segments of the installed capture: 0 none, 1 the whole graph, >= 2 segmented."""
        return self._graphs.segments if self._graphs.installed else 0

    def capture_segmentation(self) -> list[CaptureDecline]:
        """One CaptureDecline per seam of the last capture (empty for a whole capture)."""
        return list(self._graphs.segmentation)

    def check_device_capture_error(self) -> int:
        """The latched CaptureViolation bits of captured replays (0: none); not cleared."""
        return self._graphs.violations()

    # metadata ---------------------------------------------------------------
    def inputs(self) -> list[IoMeta]:
        """The graph inputs (initializer-backed ones are marked optional)."""
        return list(self._inputs)

    def outputs(self) -> list[IoMeta]:
        """The graph outputs."""
        return list(self._outputs)

    def model_metadata(self) -> ModelMetadata:
        """Producer, versions, doc string, metadata props and the opsets the model imports
        (model_version: INT64_MAX when it sets none, as onnxruntime reports)."""
        m = self._model
        return ModelMetadata(
            ir_version=m.ir_version,
            producer_name=m.producer_name or "",
            producer_version=m.producer_version or "",
            domain=m.domain or "",
            model_version=_INT64_MAX if m.model_version is None else m.model_version,
            doc_string=m.doc_string or "",
            graph_name=m.graph.name or "",
            metadata_props=dict(m.metadata_props),
            opset_imports=dict(self._declared_opsets),
        )

    def graph(self) -> ir.Graph:
        """The graph the executor runs; node ids are positions in its node order."""
        return self._model.graph

    def device_id(self) -> DeviceId:
        """The device this session runs on."""
        return self._placement.device

    def ep_context_config(self) -> ep_context.EpContextDumpConfig:
        """The EPContext dump settings from the `ep.context_*` options."""
        return self._ep_config

    def export_ep_context(self, orig_path: str | os.PathLike | None,
                          partitions: Sequence[ep_context.CompiledPartition],
                          providers: Sequence[Any] = ()) -> Path | None:
        """Write the context model for `partitions` of `graph()` per this session's
        `ep.context_*` options; returns its path (the would-be path when disabled). Each
        partition's blob comes from the provider named in it: this session's providers, or
        compiling providers given in `providers`."""
        chain = {p.name: p for p in (*self._placement.providers, *providers)}
        return ep_context.export_ep_context(self._model, orig_path, partitions, chain,
                                            self._ep_config)

    def compiled_partitions(self) -> list[ep_context.CompiledPartition]:
        """The partitions a compiling provider (fuse) compiled at build; node ids refer to
        the graph before they were rewritten into one node each."""
        return list(self._ep_partitions)

    def execution_provider_fallback_report(self) -> ExecutionProviderFallbackReport | None:
        """What did not run on the requested provider and why; None when it ran
        everything (or the CPU was asked for)."""
        return self._fallback

    def cache_stats(self) -> CacheStats:
        """Counters of the specialisation cache keyed by input signature."""
        return self._cache.stats()

    def control_flow_stats(self) -> ControlFlowStats:
        """If/Loop/Scan bodies: specialisations built (per input signature) and runs."""
        return ControlFlowStats(self._control_flow.builds, self._control_flow.runs)
