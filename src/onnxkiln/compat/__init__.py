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
run). Errors are onnxkiln's `SessionError` subclasses, not onnxruntime's exception
classes; see `InferenceSession`.

Example:
    >>> import onnxkiln.compat as rt
    >>> sess = rt.InferenceSession("logreg_iris.onnx", providers=rt.get_available_providers())
    >>> input_name = sess.get_inputs()[0].name
    >>> label_name = sess.get_outputs()[0].name
    >>> pred = sess.run([label_name], {input_name: X_test.astype(np.float32)})[0]
"""

from __future__ import annotations

from onnxkiln.compat._iobinding import IOBinding
from onnxkiln.compat._options import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    RunOptions,
    SessionOptions,
    set_default_logger_severity,
    set_default_logger_verbosity,
)
from onnxkiln.compat._providers import get_all_providers, get_available_providers
from onnxkiln.compat._session import InferenceSession
from onnxkiln.compat._values import ModelMetadata, NodeArg, OrtValue

__all__ = [
    "ExecutionMode",
    "ExecutionOrder",
    "GraphOptimizationLevel",
    "IOBinding",
    "InferenceSession",
    "ModelMetadata",
    "NodeArg",
    "OrtValue",
    "RunOptions",
    "SessionOptions",
    "get_all_providers",
    "get_available_providers",
    "get_device",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
]


def get_device() -> str:
    """"GPU" when onnxkiln's CUDA provider can run here, else "CPU"."""
    return "GPU" if "CUDAExecutionProvider" in get_available_providers() else "CPU"
