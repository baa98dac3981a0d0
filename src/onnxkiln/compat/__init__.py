"""onnxruntime's Python API over onnxkiln: switch existing code by changing one import.

    import onnxruntime as ort        ->    import onnxkiln.compat as ort

`InferenceSession(path_or_bytes, sess_options, providers, provider_options)`,
`run(output_names, input_feed, run_options)` (output subsets prune the graph),
`run_with_ort_values`, `get_inputs()` / `get_outputs()` (NodeArg: name, type string such
as "tensor(float)", shape with symbolic names or None), `get_overridable_initializers`,
`get_modelmeta`, `get_providers`, `get_provider_options`, `SessionOptions`,
`RunOptions` (including `terminate`, and a run timeout onnxruntime lacks: the config
entry `run_options.add_run_config_entry("kiln.run.timeout_s", "2.5")` stops a run past
2.5 s with `onnxkiln.RunTimeoutError`), `GraphOptimizationLevel`, `io_binding()` and
`OrtValue`, plus the module functions below.

Provider names map as CPUExecutionProvider -> "cpu" and CUDAExecutionProvider ->
"cuda" (falling back to the CPU with a warning when onnxkiln's CUDA provider cannot
run). Errors are onnxkiln's `SessionError` subclasses that are also onnxruntime's
exception classes (`onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument`...; the
mapping is in `onnxkiln.compat._errors`).

Programs that keep `import onnxruntime`: call `onnxkiln.compat.install()` first, or run
them with `python -m onnxkiln.compat SCRIPT [ARGS]`.

Example:
    >>> import onnxkiln.compat as rt
    >>> sess = rt.InferenceSession("logreg_iris.onnx", providers=rt.get_available_providers())
    >>> input_name = sess.get_inputs()[0].name
    >>> label_name = sess.get_outputs()[0].name
    >>> pred = sess.run([label_name], {input_name: X_test.astype(np.float32)})[0]
"""

from __future__ import annotations

from onnxkiln.compat._devices import (
    OrtAllocatorType,
    OrtArenaCfg,
    OrtDevice,
    OrtDeviceMemoryType,
    OrtDeviceVendorId,
    OrtMemoryInfo,
    OrtMemoryInfoDeviceType,
    OrtMemType,
)
from onnxkiln.compat._errors import ort_errors
from onnxkiln.compat._install import InstallError, install, installed, uninstall
from onnxkiln.compat._iobinding import IOBinding
from onnxkiln.compat._lora import AdapterFormat, LoraAdapter
from onnxkiln.compat._options import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    RunOptions,
    SessionOptions,
    set_default_logger_callback,
    set_default_logger_severity,
    set_default_logger_verbosity,
)
from onnxkiln.compat._providers import get_all_providers, get_available_providers
from onnxkiln.compat._runtime import (
    ORT_API_VERSION,
    create_and_register_allocator,
    create_and_register_allocator_v2,
    disable_telemetry_events,
    enable_telemetry_events,
    get_build_info,
    get_version_string,
    has_collective_ops,
    preload_dlls,
    set_global_thread_pool_sizes,
)
from onnxkiln.compat._runtime import set_seed as _set_seed
from onnxkiln.compat._session import InferenceSession
from onnxkiln.compat._sparse import OrtSparseFormat, SparseTensor
from onnxkiln.compat._unsupported import (
    MODULE_CLASSES,
    MODULE_FUNCTIONS,
    add_refusals,
    refusal,
    refused_class,
)
from onnxkiln.compat._values import ModelMetadata, NodeArg, OrtValue

__version__ = ORT_API_VERSION  # the onnxruntime API this follows; onnxkiln.__version__ is ours
set_seed = ort_errors(_set_seed)

# what onnxkiln cannot honour raises one clear NotImplemented naming the call
for _cls in (InferenceSession, SessionOptions, RunOptions, OrtValue):
    add_refusals(_cls)
globals().update({n: refusal(n, why) for n, why in MODULE_FUNCTIONS.items()})
globals().update({n: refused_class(n, why) for n, why in MODULE_CLASSES.items()})

__all__ = [
    "AdapterFormat",
    "ExecutionMode",
    "ExecutionOrder",
    "GraphOptimizationLevel",
    "IOBinding",
    "InferenceSession",
    "InstallError",
    "LoraAdapter",
    "ModelMetadata",
    "NodeArg",
    "OrtAllocatorType",
    "OrtArenaCfg",
    "OrtDevice",
    "OrtDeviceMemoryType",
    "OrtDeviceVendorId",
    "OrtMemType",
    "OrtMemoryInfo",
    "OrtMemoryInfoDeviceType",
    "OrtSparseFormat",
    "OrtValue",
    "RunOptions",
    "SessionOptions",
    "SparseTensor",
    "__version__",
    "create_and_register_allocator",
    "create_and_register_allocator_v2",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_all_providers",
    "get_available_providers",
    "get_build_info",
    "get_device",
    "get_version_string",
    "has_collective_ops",
    "install",
    "installed",
    "preload_dlls",
    "set_default_logger_callback",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "set_global_thread_pool_sizes",
    "set_seed",
    "uninstall",
]

def get_device() -> str:
    """"GPU" when onnxkiln's CUDA provider can run here, else "CPU"."""
    return "GPU" if "CUDAExecutionProvider" in get_available_providers() else "CPU"
