"""TraceContext: one span per executed op, kept in memory, written as a Chrome trace, or
sent to OpenTelemetry.

The executor checks `ctx.enabled` once per run and then runs either the plain generated
plan function or its instrumented twin, which calls `StepTracer.start`/`finish` around
each step. Ops inside If/Loop/Scan bodies become child spans of their node's span.

A kernel that chooses its variant per call reports it with
`providers.base.report_variant` (a per-thread report, read after the call); one whose
variant is fixed when it is built exposes `variant` and `variant_reason` attributes;
otherwise the registered variant name is used.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxkiln.dtypes import from_numpy
from onnxkiln.providers.base import reported_variant

__all__ = [
    "OpTime",
    "Profile",
    "Span",
    "StepTracer",
    "TraceContext",
    "active_context",
    "chrome_events",
    "summarize",
]

_local = threading.local()  # .ctx: the context of the traced run on this thread; .parent
_PROVIDER_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_ORT_DTYPES = {"float32": "float", "float64": "double"}
_dtype_names: dict[np.dtype, str] = {}


@dataclass
class Span:
    """One timed operation: an op (category "node") or a whole run (category "session").

    Times are nanoseconds since the epoch. `parent_id` links an op inside a subgraph to
    its If/Loop/Scan node's span, and a top-level op to its run's span.
    """

    name: str
    category: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    span_id: int = 0
    parent_id: int | None = None

    @property
    def duration_ns(self) -> int:
        """end_ns - start_ns."""
        return self.end_ns - self.start_ns


class _Open:
    """A span being timed; the thread's current parent while its op runs."""

    __slots__ = ("index", "otel", "parent", "sid", "start")

    def __init__(self, index: int, sid: int, parent: _Open | None) -> None:
        self.index = index
        self.sid = sid
        self.parent = parent
        self.otel: Any = None
        self.start = 0


class TraceContext:
    """Where spans go. `enabled` is the flag the executor checks (once per run).

    Example:
        >>> ctx = TraceContext.in_memory()
        >>> session.set_trace_context(ctx); session.run(feeds)
        >>> [s.name for s in ctx.spans if s.category == "node"]
        ['Conv', 'Relu', ...]
    """

    def __init__(self, kind: str, path: Path | None = None, tracer: Any = None) -> None:
        self.kind = kind
        self.enabled = kind != "disabled"
        self.path = path
        self.spans: list[Span] = []
        self._keep = kind in ("memory", "chrome")
        self._tracer = tracer
        self._ids = itertools.count(1)
        self._epoch = time.time_ns() - time.perf_counter_ns()
        self._origin = time.time_ns()
        self._atexit = None
        if kind == "chrome":
            self._atexit = _flush_at_exit(self)
            atexit.register(self._atexit)

    @classmethod
    def disabled(cls) -> TraceContext:
        """No tracing (the default): the executor runs the plain plan function."""
        return cls("disabled")

    @classmethod
    def in_memory(cls) -> TraceContext:
        """Keep spans in `ctx.spans`."""
        return cls("memory")

    @classmethod
    def chrome(cls, path: str | os.PathLike) -> TraceContext:
        """Chrome trace JSON in onnxruntime's profile format, written by `flush()`,
        `close()`, on leaving `with ctx:` and at interpreter exit. Spans also stay in
        `ctx.spans` (every run of the context's life is in the file)."""
        return cls("chrome", path=Path(path))

    @classmethod
    def opentelemetry(cls, tracer: Any = None) -> TraceContext:
        """Spans into OpenTelemetry (`tracer`, or the global provider's "onnxkiln" tracer).
        A run's span is a child of the caller's current span. Needs opentelemetry-api."""
        try:
            from opentelemetry import trace as otel
        except ImportError as e:
            raise ImportError(
                "TraceContext.opentelemetry needs opentelemetry-api; install it with "
                "pip install 'onnxkiln[otel]'"
            ) from e
        return cls("otel", tracer=tracer if tracer is not None else otel.get_tracer("onnxkiln"))

    def __repr__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return f"TraceContext({self.kind}{where}, {len(self.spans)} spans)"

    # recording ---------------------------------------------------------------------
    def _now(self) -> int:
        return time.perf_counter_ns() + self._epoch

    def _open(self, index: int, name: str, parent: _Open | None) -> _Open:
        op = _Open(index, next(self._ids), parent)
        op.start = self._now()
        if self._tracer is not None:
            op.otel = _otel_start(self._tracer, name, parent, op.start)
        return op

    def _close(self, op: _Open, name: str, category: str, attributes: dict[str, Any],
               end: int | None = None) -> None:
        if end is None:
            end = self._now()
        if self._keep:
            parent = op.parent.sid if op.parent is not None else None
            self.spans.append(Span(name, category, op.start, end, attributes, op.sid, parent))
        if op.otel is not None:
            op.otel.set_attributes(_otel_attributes(attributes))
            op.otel.end(end_time=end)

    @contextlib.contextmanager
    def run_span(self, name: str = "model_run", **attributes: Any) -> Iterator[None]:
        """Trace a whole run: sets this thread's active context so subgraphs trace too."""
        prev_ctx, prev_parent = getattr(_local, "ctx", None), getattr(_local, "parent", None)
        op = self._open(-1, name, prev_parent)
        _local.ctx, _local.parent = self, op
        try:
            yield
        finally:
            _local.ctx, _local.parent = prev_ctx, prev_parent
            attributes["thread_id"] = threading.get_native_id()
            self._close(op, name, "session", attributes)

    def clear(self) -> None:
        """Forget the spans recorded so far."""
        self.spans.clear()

    # output ------------------------------------------------------------------------
    def flush(self) -> Path | None:
        """Write the Chrome trace file (chrome contexts); returns its path."""
        if self.kind != "chrome" or self.path is None:
            return None
        events = chrome_events(self.spans, self._origin)
        tmp = self.path.with_name(self.path.name + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("[\n" + ",\n".join(json.dumps(e, separators=(",", ":")) for e in events)
                    + "\n]\n")
        os.replace(tmp, self.path)
        return self.path

    def close(self) -> None:
        """Flush and stop recording; later runs are untraced."""
        self.flush()
        self.enabled = False
        if self._atexit is not None:
            atexit.unregister(self._atexit)
            self._atexit = None

    def __enter__(self) -> TraceContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StepTracer:
    """The hooks a plan's instrumented function calls around each step of one run."""

    __slots__ = ("_ctx", "_meta", "_tid")

    def __init__(self, ctx: TraceContext, meta: Sequence[tuple[str, Any, str, dict]]) -> None:
        self._ctx = ctx
        self._meta = meta
        self._tid = threading.get_native_id()

    def sizing(self, index: int, ins: tuple) -> None:
        """Output-size checks are the memory tracker's; spans need nothing here."""

    def start(self, index: int) -> _Open:
        """Open step `index`'s span; it is this thread's parent while the kernel runs."""
        ctx = self._ctx
        op = _Open(index, next(ctx._ids), getattr(_local, "parent", None))
        if ctx._tracer is not None:
            op.otel = _otel_start(ctx._tracer, self._meta[index][0], op.parent,
                                  time.perf_counter_ns() + ctx._epoch)
        _local.parent = op
        reported_variant()  # a report left by an untraced call is not this step's
        op.start = time.perf_counter_ns() + ctx._epoch
        return op

    def finish(self, op: _Open, ins: tuple, outs: tuple) -> None:
        """Close the span with the shapes and dtypes the kernel saw and made."""
        end = time.perf_counter_ns() + self._ctx._epoch
        _local.parent = op.parent
        name, kernel, variant, static = self._meta[op.index]
        made = reported_variant()
        if made is not None:
            chosen, reason = made
        else:
            chosen, reason = getattr(kernel, "variant", None), getattr(kernel, "variant_reason",
                                                                        None)
        in_shapes, in_dtypes = _describe(ins)
        out_shapes, out_dtypes = _describe(outs)
        attributes = {
            **static,
            "kernel_variant": chosen or variant,
            "input_shapes": in_shapes, "input_dtypes": in_dtypes,
            "output_shapes": out_shapes, "output_dtypes": out_dtypes,
            "thread_id": self._tid,
        }
        if reason:
            attributes["kernel_variant_reason"] = reason
        self._ctx._close(op, name, "node", attributes, end)


def step_meta(steps: Sequence[Any], graph: str) -> list[tuple[str, Any, str, dict]]:
    """Per step: span name, kernel, registered variant and the static attributes (with
    `fused_from`, the model's node names, on a node the optimizer made from them)."""
    return [
        (s.op_type, s.kernel, s.spec.variant,
         {"node_id": s.node_id, "node": s.name, "op_type": s.op_type,
          "domain": s.domain or "ai.onnx", "provider": s.provider, "graph": graph,
          **({"fused_from": list(s.fused_from)} if s.fused_from else {})})
        for s in steps
    ]


def active_context() -> TraceContext | None:
    """The context of the traced run in progress on this thread (for subgraph runners)."""
    return getattr(_local, "ctx", None)


def _describe(values: tuple) -> tuple[list, list]:
    shapes, dtypes = [], []
    for v in values:
        if type(v) is np.ndarray:
            shapes.append(v.shape)
            dtypes.append(_dtype_names.get(v.dtype) or _dtype_name(v.dtype))
        elif isinstance(v, np.ndarray | np.generic):
            shapes.append(tuple(v.shape))
            dtypes.append(_dtype_name(v.dtype))
        elif v is None:
            shapes.append(None)
            dtypes.append("none")
        elif isinstance(v, list | tuple | dict):
            shapes.append((len(v),))
            dtypes.append("map" if isinstance(v, dict) else "sequence")
        else:
            shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
            shapes.append(tuple(shape) if shape is not None else None)
            dtypes.append(str(dtype) if dtype is not None else type(v).__name__)
    return shapes, dtypes


def _dtype_name(dtype: np.dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        try:
            name = str(from_numpy(dtype))
        except KeyError:
            name = str(dtype)
        _dtype_names[dtype] = name
    return name


def chrome_events(spans: Sequence[Span], origin_ns: int) -> list[dict[str, Any]]:
    """onnxruntime-style profile events ("ph": "X", µs since `origin_ns`), sorted by ts."""
    pid = os.getpid()
    events = []
    for s in spans:
        a = s.attributes
        event: dict[str, Any] = {
            "cat": "Node" if s.category == "node" else "Session",
            "pid": pid,
            "tid": a.get("thread_id", pid),
            "dur": round(s.duration_ns / 1000, 3),
            "ts": round((s.start_ns - origin_ns) / 1000, 3),
            "ph": "X",
            "name": f"{a['node']}_kernel_time" if s.category == "node" else s.name,
            "args": _chrome_args(s) if s.category == "node" else {},
        }
        events.append(event)
    events.sort(key=lambda e: (e["ts"], -e["dur"]))
    return events


def _chrome_args(span: Span) -> dict[str, Any]:
    a = span.attributes
    args = {
        "op_name": a["op_type"],
        "provider": _PROVIDER_NAMES.get(a["provider"], a["provider"]),
        "node_index": str(a["node_id"]),
        "input_type_shape": _type_shapes(a["input_shapes"], a["input_dtypes"]),
        "output_type_shape": _type_shapes(a["output_shapes"], a["output_dtypes"]),
        "kernel_variant": a["kernel_variant"],
        "domain": a["domain"],
        "graph": a["graph"],
    }
    if "kernel_variant_reason" in a:
        args["kernel_variant_reason"] = a["kernel_variant_reason"]
    if "fused_from" in a:
        args["fused_from"] = a["fused_from"]
    return args


def _type_shapes(shapes: list, dtypes: list) -> list[dict[str, list]]:
    return [{_ORT_DTYPES.get(d, d): list(s) if s is not None else []}
            for s, d in zip(shapes, dtypes)]


def _otel_start(tracer: Any, name: str, parent: _Open | None, start: int) -> Any:
    from opentelemetry import trace as otel

    context = None
    if parent is not None and parent.otel is not None:
        context = otel.set_span_in_context(parent.otel)
    return tracer.start_span(name, context=context, start_time=start)


def _otel_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes scalars and flat lists: shapes become strings like "1x3x8"."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if key.endswith("_shapes"):
            out[key] = ["?" if s is None else "x".join(map(str, s)) for s in value]
        elif isinstance(value, list):
            out[key] = [str(v) for v in value]
        else:
            out[key] = value
    return out


def _flush_at_exit(ctx: TraceContext):
    ref = weakref.ref(ctx)

    def flush() -> None:
        live = ref()
        if live is not None and live.spans:
            live.flush()

    return flush


@dataclass
class OpTime:
    """Aggregated self time (span time minus its child spans) of an op type or a node;
    a node the optimizer fused keeps the model's node names it replaced in `fused_from`."""

    op_type: str
    count: int = 0
    self_ns: int = 0
    fused_from: tuple[str, ...] = ()


@dataclass
class Profile:
    """What `summarize` makes of a list of spans: runs and self time per op type / node."""

    runs: int
    run_ns: int
    by_op: dict[str, OpTime]
    by_node: dict[str, OpTime]


def summarize(spans: Sequence[Span]) -> Profile:
    """Self time per op type and per node (keyed "graph/node") over all runs in `spans`."""
    children: dict[int, int] = {}
    for s in spans:
        if s.parent_id is not None:
            children[s.parent_id] = children.get(s.parent_id, 0) + s.duration_ns
    runs = [s for s in spans if s.category == "session"]
    by_op: dict[str, OpTime] = {}
    by_node: dict[str, OpTime] = {}
    for s in spans:
        if s.category != "node":
            continue
        own = s.duration_ns - children.get(s.span_id, 0)
        a = s.attributes
        key = a["node"] if a["graph"] == "main" else f"{a['graph']}/{a['node']}"
        for table, k in ((by_op, s.name), (by_node, key)):
            entry = table.setdefault(k, OpTime(s.name))
            entry.count += 1
            entry.self_ns += own
        by_node[key].fused_from = tuple(a.get("fused_from", ()))
    return Profile(len(runs), sum(s.duration_ns for s in runs), by_op, by_node)
