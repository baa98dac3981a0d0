"""onnxkiln: an ONNX inference runtime for Python.

The public names load on first use (PEP 562), so `import onnxkiln` and the `onnxkiln`
command's `--help` stay cheap; `from onnxkiln import InferenceSession` works as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from onnxkiln.errors import (
    CaptureError,
    DeviceBindingError,
    EpContextError,
    ExecutionProviderUnavailableError,
    InputNotFoundError,
    InvalidInputError,
    InvalidOptionError,
    KernelError,
    MemoryLimitError,
    ModelLoadError,
    RunCancelledError,
    RunTimeoutError,
    SequenceOutputError,
    SessionError,
    ShapeError,
    UnknownOptionError,
    UnsupportedOpError,
)

if TYPE_CHECKING:
    from onnxkiln.builder import SessionBuilder
    from onnxkiln.dtypes import DataType
    from onnxkiln.generation import GenerateResult, Sampling, generate
    from onnxkiln.session import InferenceSession
    from onnxkiln.trace import Span, TraceContext
    from onnxkiln.types import (
        CacheStats,
        Captured,
        CaptureDecline,
        CaptureViolation,
        ControlFlowStats,
        DeviceId,
        DeviceType,
        IoMeta,
        MemoryStats,
        ModelMetadata,
        NotCapturable,
        SeamKind,
        SessionOutput,
        WarmupShape,
    )

_LAZY = {
    "SessionBuilder": "builder", "DataType": "dtypes", "InferenceSession": "session",
    "Span": "trace", "TraceContext": "trace",
    "generate": "generation", "GenerateResult": "generation", "Sampling": "generation",
    **dict.fromkeys(
        ["CacheStats", "Captured", "CaptureDecline", "CaptureViolation", "ControlFlowStats",
         "DeviceId", "DeviceType", "IoMeta", "MemoryStats", "ModelMetadata", "NotCapturable",
         "SeamKind", "SessionOutput", "WarmupShape"], "types"),
}


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use; submodules load on attribute access too."""
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"onnxkiln.{module}"), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"onnxkiln.{name}") is not None:
        return importlib.import_module(f"onnxkiln.{name}")
    raise AttributeError(f"module 'onnxkiln' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "CacheStats",
    "CaptureDecline",
    "CaptureError",
    "CaptureViolation",
    "Captured",
    "ControlFlowStats",
    "DataType",
    "DeviceBindingError",
    "DeviceId",
    "DeviceType",
    "EpContextError",
    "ExecutionProviderUnavailableError",
    "GenerateResult",
    "InferenceSession",
    "InputNotFoundError",
    "InvalidInputError",
    "InvalidOptionError",
    "IoMeta",
    "KernelError",
    "MemoryLimitError",
    "MemoryStats",
    "ModelLoadError",
    "ModelMetadata",
    "NotCapturable",
    "RunCancelledError",
    "RunTimeoutError",
    "Sampling",
    "SeamKind",
    "SequenceOutputError",
    "SessionBuilder",
    "SessionError",
    "SessionOutput",
    "ShapeError",
    "Span",
    "TraceContext",
    "UnknownOptionError",
    "UnsupportedOpError",
    "WarmupShape",
    "generate",
]
