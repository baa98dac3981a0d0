"""Exception classes raised by onnxkiln; every one is a `SessionError`."""

from __future__ import annotations

__all__ = [
    "CaptureError",
    "DeviceBindingError",
    "EpContextError",
    "ExecutionProviderUnavailableError",
    "InputNotFoundError",
    "InvalidInputError",
    "InvalidOptionError",
    "KernelError",
    "MemoryLimitError",
    "ModelLoadError",
    "RunCancelledError",
    "RunTimeoutError",
    "SequenceOutputError",
    "SessionError",
    "ShapeError",
    "UnknownOptionError",
    "UnsupportedOpError",
]


class SessionError(RuntimeError):
    """Base class of every error onnxkiln raises on purpose."""


class ModelLoadError(SessionError):
    """The model could not be read, parsed or validated."""


class UnsupportedOpError(ModelLoadError):
    """One or more nodes have no kernel on any requested provider."""


class InvalidInputError(SessionError, ValueError):
    """An input given to `run` does not match what the model declares."""


class InputNotFoundError(SessionError, KeyError):
    """An input name is unknown, or a required input is missing."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class ShapeError(InvalidInputError):
    """An input's rank or dimensions do not match the model."""


class SequenceOutputError(SessionError):
    """`run` was asked to return a non-tensor output; use `run_outputs`."""


class ExecutionProviderUnavailableError(SessionError):
    """A requested execution provider cannot be used on this machine."""


class UnknownOptionError(SessionError, KeyError):
    """A session option key is not one onnxkiln knows."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidOptionError(SessionError, ValueError):
    """A session option has a value outside its allowed set."""


class CaptureError(SessionError):
    """Device-graph capture or replay failed."""


class DeviceBindingError(SessionError):
    """A persistent device binding is invalid for this session or run."""


class EpContextError(SessionError):
    """EPContext export or import failed."""


class MemoryLimitError(SessionError):
    """A run would exceed the session's memory limit."""


class KernelError(SessionError):
    """A kernel failed while running a node; the original exception is chained."""

    def __init__(self, message: str, *, node_name: str = "", op_type: str = "") -> None:
        super().__init__(message)
        self.node_name = node_name
        self.op_type = op_type


class RunCancelledError(SessionError):
    """A run stopped because its cancel event was set (`run(..., cancel=event)`).

    The check happens before each step and before each subgraph body run (each Loop
    iteration), so a run stops at the next node boundary; a kernel already running
    finishes first. `node_name`, `op_type` and `graph` say where it stopped ("" when
    it stopped before the first node).

    Example:
        >>> stop = threading.Event()
        >>> threading.Timer(1.0, stop.set).start()
        >>> session.run(feeds, cancel=stop)  # raises RunCancelledError after ~1 s
    """

    def __init__(self, message: str, *, node_name: str = "", op_type: str = "",
                 graph: str = "") -> None:
        super().__init__(message)
        self.node_name = node_name
        self.op_type = op_type
        self.graph = graph


class RunTimeoutError(RunCancelledError):
    """A run passed its time limit (`run(..., timeout=seconds)`); checked where a cancel
    event is. `elapsed` and `timeout` are in seconds."""

    def __init__(self, message: str, *, elapsed: float, timeout: float, node_name: str = "",
                 op_type: str = "", graph: str = "") -> None:
        super().__init__(message, node_name=node_name, op_type=op_type, graph=graph)
        self.elapsed = elapsed
        self.timeout = timeout
