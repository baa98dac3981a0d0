"""onnxkiln: an ONNX inference runtime for Python."""

from __future__ import annotations

from onnxkiln.builder import SessionBuilder
from onnxkiln.dtypes import DataType
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
    SequenceOutputError,
    SessionError,
    ShapeError,
    UnknownOptionError,
    UnsupportedOpError,
)
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
]
