"""onnxruntime's exception classes, and the mapping that makes onnxkiln's errors raised
through `onnxkiln.compat` instances of them.

onnxruntime raises `Fail`, `InvalidArgument`, `NoSuchFile`... from
`onnxruntime.capi.onnxruntime_pybind11_state`. Here each is a `SessionError` subclass,
and an onnxkiln error leaving a compat call is given a class deriving from both its own
class and the onnxruntime class onnxruntime raises in that case, so `except
InvalidArgument` and `except onnxkiln.InvalidInputError` both catch it:

    InvalidInputError, ShapeError, InputNotFoundError,
    InvalidOptionError, UnknownOptionError, DeviceBindingError -> InvalidArgument
    ModelLoadError: the file does not exist                     -> NoSuchFile
    ModelLoadError: the bytes are not a ModelProto              -> InvalidProtobuf
    ModelLoadError: a map input type outside the node's schema  -> InvalidGraph
    ModelLoadError otherwise, UnsupportedOpError                -> Fail
    KernelError, MemoryLimitError, RunCancelledError,
    RunTimeoutError, CaptureError, SequenceOutputError          -> Fail
    ExecutionProviderUnavailableError, EpContextError           -> EPFail

onnxruntime itself raises `Fail` for kernel failures, type errors in the graph, unknown
ops and a set `terminate` flag, which is why those map there. A missing required input
stays an `InvalidInputError` (a ValueError, which is what onnxruntime raises there) and is
an `InvalidArgument` too. `NoModel`, `EngineError`, `RuntimeException`, `ModelLoaded` and
`NotImplemented` exist for code that names them; onnxkiln raises `NotImplemented` where
it cannot honour an onnxruntime call (a custom-op library, a CUDA-only option).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from onnxkiln import errors as _kiln
from onnxkiln.errors import SessionError

__all__ = [
    "EPFail",
    "EngineError",
    "Fail",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoaded",
    "NoModel",
    "NoSuchFile",
    "NotImplemented",
    "RuntimeException",
    "ort_errors",
    "ort_errors_class",
    "translate",
]

_MODULE = "onnxruntime.capi.onnxruntime_pybind11_state"


def _ort_class(name: str, doc: str) -> type[SessionError]:
    return type(name, (SessionError,), {"__doc__": doc, "__module__": _MODULE})


Fail = _ort_class("Fail", "onnxruntime's FAIL status: a failure with no more specific code.")
InvalidArgument = _ort_class("InvalidArgument", "onnxruntime's INVALID_ARGUMENT status.")
NoSuchFile = _ort_class("NoSuchFile", "onnxruntime's NO_SUCHFILE status: no model file.")
NoModel = _ort_class("NoModel", "onnxruntime's NO_MODEL status.")
EngineError = _ort_class("EngineError", "onnxruntime's ENGINE_ERROR status.")
RuntimeException = _ort_class("RuntimeException", "onnxruntime's RUNTIME_EXCEPTION status.")
InvalidProtobuf = _ort_class("InvalidProtobuf", "onnxruntime's INVALID_PROTOBUF status.")
ModelLoaded = _ort_class("ModelLoaded", "onnxruntime's MODEL_LOADED status.")
NotImplemented = _ort_class(
    "NotImplemented", "onnxruntime's NOT_IMPLEMENTED status: onnxkiln cannot honour the call.")
InvalidGraph = _ort_class("InvalidGraph", "onnxruntime's INVALID_GRAPH status.")
EPFail = _ort_class("EPFail", "onnxruntime's EP_FAIL status: an execution provider failed.")

ORT_CLASSES = (Fail, InvalidArgument, NoSuchFile, NoModel, EngineError, RuntimeException,
               InvalidProtobuf, ModelLoaded, NotImplemented, InvalidGraph, EPFail)

# checked in order: the first onnxkiln base class that matches decides
_BY_KILN_CLASS: tuple[tuple[type[SessionError], type[SessionError]], ...] = (
    (_kiln.InvalidInputError, InvalidArgument),
    (_kiln.InputNotFoundError, InvalidArgument),
    (_kiln.InvalidOptionError, InvalidArgument),
    (_kiln.UnknownOptionError, InvalidArgument),
    (_kiln.DeviceBindingError, InvalidArgument),
    (_kiln.ExecutionProviderUnavailableError, EPFail),
    (_kiln.EpContextError, EPFail),
)

_combined: dict[tuple[type, type], type] = {}
F = TypeVar("F", bound=Callable[..., Any])


def ort_class_for(error: SessionError) -> type[SessionError]:
    """The onnxruntime class onnxruntime raises where onnxkiln raised `error`."""
    for kiln_cls, ort_cls in _BY_KILN_CLASS:
        if isinstance(error, kiln_cls):
            return ort_cls
    if isinstance(error, _kiln.ModelLoadError) and not isinstance(error, _kiln.UnsupportedOpError):
        text = str(error).lower()
        if isinstance(error.__cause__, FileNotFoundError) or "no such file" in text \
                or "does not exist" in text:
            return NoSuchFile
        if "protobuf" in text or "not a valid onnx" in text or "parse" in text:
            return InvalidProtobuf
        if "this is an invalid model" in text:
            return InvalidGraph
    return Fail


def translate(error: BaseException) -> BaseException:
    """`error`, its class now also the matching onnxruntime class (in place; the message,
    attributes and traceback stay). Errors that are not onnxkiln's pass unchanged."""
    if not isinstance(error, SessionError) or isinstance(error, ORT_CLASSES):
        return error
    ort_cls = ort_class_for(error)
    key = (type(error), ort_cls)
    cls = _combined.get(key)
    if cls is None:
        base = type(error)
        cls = type(base.__name__, (base, ort_cls), {
            "__module__": base.__module__, "__qualname__": base.__qualname__,
            "__doc__": base.__doc__})
        _combined[key] = cls
    with contextlib.suppress(TypeError):  # a layout Python will not swap: left as it is
        error.__class__ = cls
    return error


def ort_errors(func: F) -> F:
    """Decorate a compat entry point: onnxkiln errors leave it as onnxruntime classes."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SessionError as e:
            translate(e)
            raise
    return wrapper  # type: ignore[return-value]


def ort_errors_class(cls: type) -> type:
    """Apply `ort_errors` to every public method of `cls`, and to __init__."""
    for name, value in list(vars(cls).items()):
        if name.startswith("_") and name != "__init__":
            continue
        if inspect.isfunction(value):
            setattr(cls, name, ort_errors(value))
        elif isinstance(value, staticmethod | classmethod):
            setattr(cls, name, type(value)(ort_errors(value.__func__)))
    return cls
