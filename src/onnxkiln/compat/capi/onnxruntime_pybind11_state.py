"""`onnxruntime.capi.onnxruntime_pybind11_state` over onnxkiln: onnxruntime's exception
classes (see `onnxkiln.compat._errors` for which onnxkiln error becomes which) and the
names onnxruntime's native module exports that onnxkiln.compat serves (its `OrtValue` is
onnxkiln.compat's; `SessionIOBinding`, which wraps onnxruntime's native session, refuses)."""

from __future__ import annotations

from onnxkiln.compat import (
    AdapterFormat,
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    LoraAdapter,
    ModelMetadata,
    NodeArg,
    OrtAllocatorType,
    OrtArenaCfg,
    OrtDevice,
    OrtDeviceMemoryType,
    OrtMemoryInfo,
    OrtMemoryInfoDeviceType,
    OrtMemType,
    OrtSparseFormat,
    OrtValue,
    RunOptions,
    SessionOptions,
    SparseTensor,
    disable_telemetry_events,
    enable_telemetry_events,
    get_all_providers,
    get_available_providers,
    get_build_info,
    get_device,
    get_version_string,
    set_default_logger_severity,
    set_default_logger_verbosity,
    set_seed,
)
from onnxkiln.compat._errors import (
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelLoaded,
    NoModel,
    NoSuchFile,
    NotImplemented,
    RuntimeException,
)
from onnxkiln.compat._unsupported import refused_class
from onnxkiln.compat._values import OrtValueVector

# the native binding onnxruntime's IOBinding wraps (`SessionIOBinding(sess._sess)`)
SessionIOBinding = refused_class(
    "SessionIOBinding", "onnxkiln has no native session under InferenceSession; use "
    "InferenceSession.io_binding()")

__all__ = [
    "AdapterFormat",
    "EPFail",
    "EngineError",
    "ExecutionMode",
    "ExecutionOrder",
    "Fail",
    "GraphOptimizationLevel",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "LoraAdapter",
    "ModelLoaded",
    "ModelMetadata",
    "NoModel",
    "NoSuchFile",
    "NodeArg",
    "NotImplemented",
    "OrtAllocatorType",
    "OrtArenaCfg",
    "OrtDevice",
    "OrtDeviceMemoryType",
    "OrtMemType",
    "OrtMemoryInfo",
    "OrtMemoryInfoDeviceType",
    "OrtSparseFormat",
    "OrtValue",
    "OrtValueVector",
    "RunOptions",
    "RuntimeException",
    "SessionIOBinding",
    "SessionOptions",
    "SparseTensor",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_all_providers",
    "get_available_providers",
    "get_build_info",
    "get_device",
    "get_version_string",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "set_seed",
]
