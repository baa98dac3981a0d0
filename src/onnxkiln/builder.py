"""SessionBuilder: the fluent configuration of an InferenceSession."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir

from onnxkiln import loader
from onnxkiln.errors import InvalidOptionError, ModelLoadError, SessionError
from onnxkiln.options import OPTIMIZATION_LEVELS, check_option
from onnxkiln.partition import KNOWN_PROVIDERS, select_providers
from onnxkiln.trace import TraceContext
from onnxkiln.types import WarmupShape

if TYPE_CHECKING:
    from onnxkiln.session import InferenceSession

__all__ = ["SessionBuilder", "check_trace"]

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

    def providers(self, providers: Sequence[str]) -> SessionBuilder:
        """Explicit provider priority list, e.g. ["cuda", "cpu"]; overrides `device`."""
        if isinstance(providers, str) or not isinstance(providers, Sequence) or not all(
                isinstance(p, str) for p in providers):
            raise InvalidOptionError(f"providers takes a list of names, got {providers!r}")
        if not providers:
            raise InvalidOptionError("providers([...]) needs at least one provider")
        for name in providers:
            if name.lower().split(":")[0] not in KNOWN_PROVIDERS:
                raise InvalidOptionError(
                    f"unknown provider '{name}'; known providers are {list(KNOWN_PROVIDERS)}")
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
        """Threads BLAS may use inside one op (applied through threadpoolctl per run);
        default: the physical cores this process may use."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidOptionError(f"intra_op_threads must be an int >= 1, got {n!r}")
        self._threads = n
        return self

    def option(self, key: str, value: str) -> SessionBuilder:
        """A string session option; unknown keys and bad values raise at once."""
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

    def load(self, path: str | os.PathLike) -> InferenceSession:
        """Build a session from a model file."""
        return self._build(lambda: loader.load_path(path), model_path=path)

    def load_bytes(
        self, data: bytes | bytearray | memoryview, external_data_dir: str | None = None
    ) -> InferenceSession:
        """Build a session from serialized model bytes."""
        return self._build(lambda: loader.load_bytes(data, external_data_dir),
                           model_dir=external_data_dir)

    def from_graph(self, graph: ir.Graph | ir.Model | onnx.ModelProto) -> InferenceSession:
        """Build a session from an in-memory graph or model."""
        return self._build(lambda: loader.from_graph(graph))

    def _build(self, read: Callable[[], ir.Model], model_path: str | os.PathLike | None = None,
               model_dir: str | os.PathLike | None = None) -> InferenceSession:
        """Load, plan and warm up; whatever fails comes out as a SessionError."""
        from onnxkiln.session import InferenceSession  # the session module imports this one

        try:
            model = read()
            placement = select_providers(self._device, self._providers, self._options)
            session = InferenceSession(model, placement, self, model_path, model_dir)
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
