"""InferenceSession and SessionBuilder: the public façade. No op logic lives here."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxkiln import loader
from onnxkiln.dtypes import DataType
from onnxkiln.errors import InputNotFoundError, InvalidOptionError, SequenceOutputError
from onnxkiln.executor import CompiledPlan
from onnxkiln.options import OPTIMIZATION_LEVELS, check_option
from onnxkiln.partition import Placement, select_providers
from onnxkiln.plan import build_plan
from onnxkiln.providers.base import ControlFlowCounter
from onnxkiln.specialize import SpecializationCache
from onnxkiln.threads import thread_limit
from onnxkiln.types import (
    CacheStats,
    ControlFlowStats,
    DeviceId,
    IoMeta,
    ModelMetadata,
    SessionOutput,
    WarmupShape,
)
from onnxkiln.validation import InputValidator

__all__ = ["InferenceSession", "SessionBuilder"]

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class SessionBuilder:
    """Fluent configuration; each setter returns the builder, `load*` builds the session.

    Example:
        >>> s = InferenceSession.builder().device("cpu").intra_op_threads(2).load("m.onnx")
    """

    def __init__(self) -> None:
        self._device = "auto"
        self._providers: list[str] | None = None
        self._optimization = "all"
        self._threads: int | None = None
        self._options: dict[str, str] = {}
        self._warmup: list[WarmupShape] = []

    def device(self, device: str) -> SessionBuilder:
        """"auto" (default), "cpu", "cuda" or "cuda:N"."""
        if not isinstance(device, str) or not _DEVICE.match(device.lower()):
            raise InvalidOptionError(
                f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}"
            )
        self._device = device.lower()
        return self

    def providers(self, providers: Sequence[str]) -> SessionBuilder:
        """Explicit provider priority list, e.g. ["cuda", "cpu"]; overrides `device`."""
        if isinstance(providers, str) or not all(isinstance(p, str) for p in providers):
            raise InvalidOptionError(f"providers takes a list of names, got {providers!r}")
        self._providers = list(providers)
        return self

    def optimization(self, level: str) -> SessionBuilder:
        """Graph optimization level: "disabled", "basic", "extended" or "all" (default)."""
        if level not in OPTIMIZATION_LEVELS:
            raise InvalidOptionError(
                f"optimization level must be one of {list(OPTIMIZATION_LEVELS)}, got {level!r}"
            )
        self._optimization = level
        return self

    def intra_op_threads(self, n: int) -> SessionBuilder:
        """Threads BLAS may use inside one op (applied through threadpoolctl per run)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidOptionError(f"intra_op_threads must be an int >= 1, got {n!r}")
        self._threads = n
        return self

    def option(self, key: str, value: str) -> SessionBuilder:
        """A string session option; unknown keys and bad values raise at once."""
        self._options[key] = check_option(key, value)
        return self

    def warmup(self, shapes: Sequence[WarmupShape]) -> SessionBuilder:
        """Input shapes whose specialisations are built at load time."""
        self._warmup = list(shapes)
        return self

    def load(self, path: str | os.PathLike) -> InferenceSession:
        """Build a session from a model file."""
        return self._build(loader.load_path(path))

    def load_bytes(
        self, data: bytes | bytearray | memoryview, external_data_dir: str | None = None
    ) -> InferenceSession:
        """Build a session from serialized model bytes."""
        return self._build(loader.load_bytes(data, external_data_dir))

    def from_graph(self, graph: ir.Graph | ir.Model | onnx.ModelProto) -> InferenceSession:
        """Build a session from an in-memory graph or model."""
        return self._build(loader.from_graph(graph))

    def _build(self, model: ir.Model) -> InferenceSession:
        placement = select_providers(self._device, self._providers)
        session = InferenceSession(model, placement, self)
        if self._warmup:
            session.warmup(self._warmup)
        return session


class InferenceSession:
    """A loaded model ready to run: `InferenceSession.load(path).run({"x": x})`."""

    def __init__(self, model: ir.Model, placement: Placement, config: SessionBuilder) -> None:
        self._model = model
        self._placement = placement
        self._optimization = config._optimization
        self._threads = config._threads
        self._options = dict(config._options)
        self._control_flow = ControlFlowCounter()
        self._plan = build_plan(model, placement.registries, self._control_flow)
        self._compiled = CompiledPlan(self._plan)
        self._inputs = [_io_meta(v, optional=v.is_initializer()) for v in model.graph.inputs]
        self._outputs = [_io_meta(v) for v in model.graph.outputs]
        defaults = [self._plan.input_defaults.get(s) for s in self._plan.input_slots]
        self._validator = InputValidator(self._inputs, defaults)
        self._cache = SpecializationCache(self._compiled)
        self._copy_outputs = self._plan.output_may_alias

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
    def run(self, inputs: Any) -> list[np.ndarray]:
        """Run on named inputs; returns numpy arrays in graph-output order."""
        values = self._run(inputs)
        for meta, value in zip(self._outputs, values):
            if not isinstance(value, np.ndarray):
                raise SequenceOutputError(
                    f"output '{meta.name}' is a {_kind(value)}, not a tensor; use run_outputs()"
                )
        return values

    def run_outputs(self, inputs: Any) -> list[SessionOutput]:
        """Run and keep each output's kind (tensor, sequence, map, optional)."""
        return [
            SessionOutput(meta.name, _kind(value), value)
            for meta, value in zip(self._outputs, self._run(inputs))
        ]

    def _run(self, inputs: Any) -> list[Any]:
        values, signature = self._validator.bind(inputs)
        runner = self._cache.get(signature)
        with thread_limit(self._threads):
            outputs = runner(values)
        for i, value in enumerate(outputs):
            if isinstance(value, np.generic):
                outputs[i] = np.asarray(value)
            elif isinstance(value, np.ndarray) and (
                self._copy_outputs[i] or not value.flags.writeable
            ):
                outputs[i] = value.copy()
        return outputs

    def warmup(self, shapes: Sequence[WarmupShape]) -> None:
        """Build specialisations for the given input shapes by one synthetic run."""
        feeds: dict[str, np.ndarray] = {}
        for ws in shapes:
            meta = next((m for m in self._inputs if m.name == ws.input_name), None)
            if meta is None:
                raise InputNotFoundError(
                    f"warmup names unknown input '{ws.input_name}'; the model's inputs are "
                    f"{[m.name for m in self._inputs]}"
                )
            dtype = DataType(ws.dtype if ws.dtype is not None else meta.dtype)
            feeds[ws.input_name] = np.zeros(tuple(ws.shape), dtype=dtype.numpy)
        self._run(feeds)

    # metadata ---------------------------------------------------------------
    def inputs(self) -> list[IoMeta]:
        """The graph inputs (initializer-backed ones are marked optional)."""
        return list(self._inputs)

    def outputs(self) -> list[IoMeta]:
        """The graph outputs."""
        return list(self._outputs)

    def model_metadata(self) -> ModelMetadata:
        """Producer, versions, doc string, metadata props and opset imports."""
        m = self._model
        return ModelMetadata(
            ir_version=m.ir_version,
            producer_name=m.producer_name or "",
            producer_version=m.producer_version or "",
            domain=m.domain or "",
            model_version=m.model_version or 0,
            doc_string=m.doc_string or "",
            graph_name=m.graph.name or "",
            metadata_props=dict(m.metadata_props),
            opset_imports=dict(m.opset_imports),
        )

    def graph(self) -> ir.Graph:
        """The graph the executor runs; node ids are positions in its node order."""
        return self._model.graph

    def device_id(self) -> DeviceId:
        """The device this session runs on."""
        return self._placement.device

    def cache_stats(self) -> CacheStats:
        """Counters of the specialisation cache keyed by input signature."""
        return self._cache.stats()

    def control_flow_stats(self) -> ControlFlowStats:
        """If/Loop/Scan bodies: specialisations built (per input signature) and runs."""
        return ControlFlowStats(self._control_flow.builds, self._control_flow.runs)


def _kind(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return "tensor"
    if isinstance(value, list | tuple):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    if value is None:
        return "optional"
    return "tensor"


def _io_meta(value: ir.Value, optional: bool = False) -> IoMeta:
    t = value.type
    kind = "tensor"
    if isinstance(t, ir.SequenceType):
        kind = "sequence"
    elif isinstance(t, ir.OptionalType):
        kind, optional = "optional", True
    dtype = DataType(value.dtype) if value.dtype is not None else DataType.UNDEFINED
    shape = None
    if value.shape is not None and kind == "tensor":
        shape = tuple(d if isinstance(d, int) else d.value for d in value.shape)
    return IoMeta(value.name or "", dtype, shape, kind, optional)
