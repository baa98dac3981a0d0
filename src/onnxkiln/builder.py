"""SessionBuilder: the fluent configuration of an InferenceSession."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir

from onnxkiln import loader
from onnxkiln.errors import InvalidOptionError, ModelLoadError, SessionError
from onnxkiln.options import OPTIMIZATION_LEVELS, SessionConfig, check_option
from onnxkiln.partition import KNOWN_PROVIDERS, select_providers
from onnxkiln.trace import TraceContext
from onnxkiln.types import WarmupShape

if TYPE_CHECKING:
    from onnxkiln.session import InferenceSession

__all__ = ["SessionBuilder", "check_trace"]

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_ORT_PROVIDERS = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda"}


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
        self._trace = TraceContext.disabled()
        self._memory_limit: int | None = None

    def device(self, device: str) -> SessionBuilder:
        """"auto" (default), "cpu", "cuda" or "cuda:N"."""
        if not isinstance(device, str) or not _DEVICE.match(device.lower()):
            raise InvalidOptionError(
                f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}"
            )
        self._device = device.lower()
        return self

    def providers(self, providers: Sequence[str | tuple[str, Mapping[str, Any]]]
                  ) -> SessionBuilder:
        """Explicit provider priority list, e.g. ["cuda", "cpu"]; overrides `device`.
        onnxruntime's names are aliases: "CUDAExecutionProvider" (optionally as a
        `(name, {"device_id": N})` tuple) is "cuda[:N]", "CPUExecutionProvider" is "cpu"."""
        if isinstance(providers, str) or not isinstance(providers, Sequence):
            raise InvalidOptionError(
                f"providers takes a list of names, got {providers!r}")
        names = [_provider_name(p) for p in providers]
        if not names:
            raise InvalidOptionError("providers([...]) needs at least one provider")
        self._providers = names
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
        """Threads BLAS may use inside one op (applied through threadpoolctl per run);
        default: the physical cores this process may use."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidOptionError(f"intra_op_threads must be an int >= 1, got {n!r}")
        self._threads = n
        return self

    def option(self, key: str, value: str) -> SessionBuilder:
        """A string session option (`onnxkiln.options.OPTIONS` lists every key, its values and
        what it does); unknown keys and bad values raise at once."""
        self._options[key] = check_option(key, value)
        return self

    def trace(self, ctx: TraceContext) -> SessionBuilder:
        """Where op spans go (see TraceContext); disabled by default."""
        self._trace = check_trace(ctx)
        return self

    def warmup(self, shapes: Sequence[WarmupShape]) -> SessionBuilder:
        """Input shapes whose specialisations are built at load time (see
        InferenceSession.warmup; a repeated input name starts a new shape set)."""
        if isinstance(shapes, WarmupShape) or not all(
                isinstance(w, WarmupShape) for w in shapes):
            raise InvalidOptionError(f"warmup takes a list of WarmupShape, got {shapes!r}")
        self._warmup = list(shapes)
        return self

    def memory_limit(self, nbytes: int) -> SessionBuilder:
        """Most bytes of live values a run may hold (inputs and activations, not weights);
        a run that would exceed it raises MemoryLimitError (see onnxkiln.memory)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise InvalidOptionError(f"memory_limit takes a byte count >= 1, got {nbytes!r}")
        self._memory_limit = nbytes
        return self

    @classmethod
    def configured(cls, *, device: str | None = None, providers: Sequence[Any] | None = None,
                   optimization: str | None = None, intra_op_threads: int | None = None,
                   options: Mapping[str, str] | None = None, trace: TraceContext | None = None,
                   warmup: Sequence[WarmupShape] | None = None,
                   memory_limit: int | None = None) -> SessionBuilder:
        """A builder with these settings, each as its setter of the same name takes it
        (`options` a mapping of `option(key, value)` pairs); None keeps the default."""
        builder = cls()
        for name, value in (("device", device), ("providers", providers),
                            ("optimization", optimization),
                            ("intra_op_threads", intra_op_threads), ("trace", trace),
                            ("warmup", warmup), ("memory_limit", memory_limit)):
            if value is not None:
                getattr(builder, name)(value)
        if options is not None:
            if not isinstance(options, Mapping):
                raise InvalidOptionError(f"options takes a mapping {{key: value}}, got "
                                         f"{type(options).__name__}")
            for key, value in options.items():
                builder.option(key, value)
        return builder

    def build(self, model: Any, external_data_dir: str | os.PathLike | None = None
              ) -> InferenceSession:
        """Build a session from a path, serialized bytes, an onnx.ModelProto or an onnx_ir
        model or graph (what `InferenceSession(model)` takes)."""
        return self._build_into(None, model, external_data_dir)

    def _build_into(self, session: InferenceSession | None, model: Any,
                    external_data_dir: str | os.PathLike | None) -> InferenceSession:
        if isinstance(model, str | os.PathLike):
            if external_data_dir is not None:
                raise InvalidOptionError("external_data_dir is for models given as bytes; a "
                                         "model file's external data is read beside it")
            return self._build(lambda: loader.load_path(model, self._max_inlined_nodes()),
                               model_path=model, into=session)
        if isinstance(model, bytes | bytearray | memoryview):
            folder = None if external_data_dir is None else str(external_data_dir)
            return self._build(lambda: loader.load_bytes(
                model, folder, max_inlined_nodes=self._max_inlined_nodes()),
                model_dir=folder, into=session)
        if isinstance(model, onnx.ModelProto | ir.Model | ir.Graph | onnx.GraphProto):
            return self._build(lambda: loader.from_graph(model, self._max_inlined_nodes()),
                               into=session)
        raise ModelLoadError(
            "a model is a path, serialized bytes, an onnx.ModelProto or an onnx_ir Model or "
            f"Graph; got {type(model).__name__}")

    def load(self, path: str | os.PathLike) -> InferenceSession:
        """Build a session from a model file."""
        if not isinstance(path, str | os.PathLike):
            what = ("bytes: use load_bytes(data)"
                    if isinstance(path, bytes | bytearray | memoryview) else
                    "a model in memory: use from_graph(model)"
                    if isinstance(path, onnx.ModelProto | ir.Model | ir.Graph) else
                    f"a {type(path).__name__}")
            raise ModelLoadError(f"load() takes a file path, got {what} (or build(model), "
                                     "which takes any of them)")
        return self._build_into(None, path, None)

    def load_bytes(
        self, data: bytes | bytearray | memoryview, external_data_dir: str | None = None
    ) -> InferenceSession:
        """Build a session from serialized model bytes."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ModelLoadError(f"load_bytes() takes serialized bytes, got a "
                                     f"{type(data).__name__} (build(model) takes any model)")
        return self._build_into(None, data, external_data_dir)

    def from_graph(self, graph: ir.Graph | ir.Model | onnx.ModelProto) -> InferenceSession:
        """Build a session from an in-memory graph or model."""
        return self._build(lambda: loader.from_graph(graph, self._max_inlined_nodes()))

    def _max_inlined_nodes(self) -> int:
        return SessionConfig.from_options(self._options).load_max_inlined_nodes

    def _build(self, read: Callable[[], ir.Model], model_path: str | os.PathLike | None = None,
               model_dir: str | os.PathLike | None = None,
               into: InferenceSession | None = None) -> InferenceSession:
        """Load, plan and warm up; whatever fails comes out as a SessionError."""
        from onnxkiln.session import InferenceSession  # the session module imports this one

        try:
            model = read()
            placement = select_providers(self._device, self._providers,
                                         SessionConfig.from_options(self._options))
            session = into if into is not None else InferenceSession.__new__(InferenceSession)
            session._setup(model, placement, self, model_path, model_dir)
            if self._warmup:
                session.warmup(self._warmup)
        except SessionError:
            raise
        except MemoryError as e:
            raise ModelLoadError(f"out of memory while loading the model: {e}") from e
        except RecursionError as e:
            raise ModelLoadError(f"the model nests too deeply to load: {e}") from e
        except Exception as e:  # each layer wraps its own errors; reaching here is a bug
            raise ModelLoadError(
                f"loading the model failed: {type(e).__name__}: {e} (a bug in onnxkiln; please "
                "report it with the model)"
            ) from e
        return session


def check_trace(ctx: Any) -> TraceContext:
    """`ctx` if it is a TraceContext, else a clear InvalidOptionError."""
    if not isinstance(ctx, TraceContext):
        raise InvalidOptionError(
            f"trace takes a TraceContext (e.g. TraceContext.chrome('trace.json')), got {ctx!r}")
    return ctx


def _provider_name(entry: Any) -> str:
    """An onnxkiln provider name from a native one or an onnxruntime alias (with options)."""
    name, opts = entry, {}
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], Mapping):
        name, opts = entry
    if not isinstance(name, str):
        raise InvalidOptionError(
            f"providers takes a list of names (or (name, options) pairs), got {entry!r}")
    if name in _ORT_PROVIDERS:
        native = _ORT_PROVIDERS[name]
        device = str(opts.get("device_id", "0"))
        if native == "cuda" and not device.isdigit():
            raise InvalidOptionError(f"{name} option device_id must be an int >= 0, got "
                                     f"{opts['device_id']!r}")
        ignored = sorted(set(map(str, opts)) - {"device_id"})
        if ignored:
            warnings.warn(f"{name} options {ignored} have no onnxkiln equivalent; ignored",
                          stacklevel=4)
        return f"cuda:{int(device)}" if native == "cuda" and int(device) else native
    if name.endswith("ExecutionProvider"):
        raise InvalidOptionError(
            f"'{name}' is an onnxruntime provider onnxkiln does not serve; it serves "
            "CPUExecutionProvider ('cpu') and CUDAExecutionProvider ('cuda')")
    if opts:
        raise InvalidOptionError(f"provider '{name}' takes no options; got {dict(opts)}")
    if name.lower().split(":")[0] not in KNOWN_PROVIDERS:
        raise InvalidOptionError(
            f"unknown provider '{name}'; known providers are {list(KNOWN_PROVIDERS)} (or "
            "onnxruntime's CPUExecutionProvider / CUDAExecutionProvider)")
    return name
