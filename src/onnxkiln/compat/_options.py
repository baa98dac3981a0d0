"""SessionOptions, RunOptions and their enums, with onnxruntime's names and defaults."""

from __future__ import annotations

import contextlib
import copy
import enum
import logging
import math
import sys
import threading
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from onnxkiln.compat._errors import NotImplemented as OrtNotImplemented
from onnxkiln.compat._errors import ort_errors, ort_errors_class
from onnxkiln.errors import InvalidOptionError, UnknownOptionError

__all__ = [
    "OPTIMIZATION",
    "ExecutionMode",
    "ExecutionOrder",
    "GraphOptimizationLevel",
    "RunOptions",
    "SessionOptions",
    "copy_options",
    "effective_severity",
    "log_threshold",
    "set_default_logger_callback",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
]

_LOGGING_LEVELS = {
    0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL,
}
_default_severity = 2


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's optimization levels; each maps to an onnxkiln level (see
    `SessionOptions`)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


# onnxkiln has no layout (NCHW -> NHWC) level: ORT_ENABLE_LAYOUT runs the extended passes
OPTIMIZATION = {
    GraphOptimizationLevel.ORT_DISABLE_ALL: "disabled",
    GraphOptimizationLevel.ORT_ENABLE_BASIC: "basic",
    GraphOptimizationLevel.ORT_ENABLE_EXTENDED: "extended",
    GraphOptimizationLevel.ORT_ENABLE_LAYOUT: "extended",
    GraphOptimizationLevel.ORT_ENABLE_ALL: "all",
}


class ExecutionMode(enum.IntEnum):
    """Accepted for compatibility; onnxkiln runs a graph's nodes sequentially."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    """Accepted for compatibility; onnxkiln runs nodes in topological order."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


@ort_errors_class
class SessionOptions:
    """onnxruntime's session options; `InferenceSession` copies them at construction.

    Honoured: `graph_optimization_level` (-> SessionBuilder.optimization),
    `intra_op_num_threads` (0 = default; -> intra_op_threads), `enable_profiling` and
    `profile_file_prefix` (a Chrome trace written by `end_profiling()`),
    `optimized_model_filepath` (-> option "optimized_model_path"), `log_severity_level`
    (3 or 4 silence onnxkiln's warnings while the session builds and runs), and config
    entries whose keys onnxkiln knows (`ep.context_*`). Accepted and ignored, because
    onnxkiln has no such knob: `inter_op_num_threads`, `execution_mode`,
    `execution_order`, memory arena/pattern/reuse flags, `use_deterministic_compute`
    (onnxkiln is deterministic), `log_verbosity_level`, `logid`, and other config keys.
    Attribute names are fixed: a typo raises AttributeError as onnxruntime's does.

    Example:
        >>> so = SessionOptions()
        >>> so.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        >>> so.intra_op_num_threads = 2
        >>> sess = InferenceSession("model.onnx", so, providers=["CPUExecutionProvider"])
    """

    __slots__ = (
        "_config",
        "_dim_denotations",
        "_dim_names",
        "_external_files",
        "_initializers",
        "enable_cpu_mem_arena",
        "enable_mem_pattern",
        "enable_mem_reuse",
        "enable_profiling",
        "execution_mode",
        "execution_order",
        "graph_optimization_level",
        "inter_op_num_threads",
        "intra_op_num_threads",
        "log_severity_level",
        "log_verbosity_level",
        "logid",
        "optimized_model_filepath",
        "profile_file_prefix",
        "use_deterministic_compute",
        "use_per_session_threads",
    )

    def __init__(self) -> None:
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.enable_profiling = False
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.inter_op_num_threads = 0
        self.intra_op_num_threads = 0
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.optimized_model_filepath = ""
        self.profile_file_prefix = "onnxruntime_profile_"
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self._config: dict[str, str] = {}
        self._initializers: dict[str, np.ndarray] = {}
        self._external_files: dict[str, memoryview] = {}
        self._dim_names: dict[str, int] = {}
        self._dim_denotations: dict[str, int] = {}

    def add_initializer(self, name: str, value: Any) -> None:
        """Use `value` (an OrtValue, or a numpy array) for the model's initializer `name`.

        The model's initializer must have the same element type (onnxruntime reads the
        bytes as the model's type); a name the model lacks is warned about at build and
        not used, as onnxruntime ignores it.
        """
        if not isinstance(name, str):
            raise InvalidOptionError(f"add_initializer: name must be a str, got {name!r}")
        self._initializers[name] = _host_array(value, f"add_initializer({name!r})")

    def add_external_initializers(self, names: Sequence[str], values: Sequence[Any]) -> None:
        """`add_initializer` for each pair: the model's (external-data) initializers
        `names` take `values` instead of their files."""
        names, values = list(names), list(values)
        if len(names) != len(values):
            raise InvalidOptionError(
                f"add_external_initializers: {len(names)} names but {len(values)} values")
        for name, value in zip(names, values):
            self.add_initializer(name, value)

    def add_external_initializers_from_files_in_memory(
            self, names: Sequence[str], buffers: Sequence[Any], lengths: Sequence[int]) -> None:
        """The contents of the external-data files `names` (as the model's
        external_data locations spell them), given in memory: initializers stored in those
        files are read from `buffers` (their first `lengths` bytes) instead of the disk."""
        names, buffers, lengths = list(names), list(buffers), list(lengths)
        if not len(names) == len(buffers) == len(lengths):
            raise InvalidOptionError(
                "add_external_initializers_from_files_in_memory: names, buffers and lengths "
                f"differ in length ({len(names)}, {len(buffers)}, {len(lengths)})")
        for name, buf, length in zip(names, buffers, lengths):
            try:
                view = memoryview(buf).cast("B")
            except TypeError:
                raise InvalidOptionError(
                    f"add_external_initializers_from_files_in_memory: the buffer for {name!r} "
                    f"is a {type(buf).__name__}, not a bytes-like object") from None
            if isinstance(length, bool) or not isinstance(length, int) \
                    or not 0 <= length <= len(view):
                raise InvalidOptionError(
                    f"add_external_initializers_from_files_in_memory: length {length!r} for "
                    f"{name!r} is not within its buffer of {len(view)} bytes")
            self._external_files[str(name)] = view[:length]

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Make the model's free dimension `dim_name` static at `dim_value`: get_inputs()
        shows it, feeds must have it, and the plan is built for it."""
        self._dim_names[_dim_key(dim_name, "name")] = _dim_value(dim_value, dim_name)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str,
                                                  dim_value: int) -> None:
        """As by name, for the input dimensions whose denotation is `dim_denotation`
        (e.g. "DATA_BATCH")."""
        self._dim_denotations[_dim_key(dim_denotation, "denotation")] = _dim_value(
            dim_value, dim_denotation)

    def register_custom_ops_library(self, library_path: str) -> None:
        """Refused: onnxkiln cannot load onnxruntime custom-op libraries (native code
        written against onnxruntime's C API)."""
        raise OrtNotImplemented(
            f"SessionOptions.register_custom_ops_library({library_path!r}): onnxkiln cannot "
            "load onnxruntime custom-op libraries; write the op as an onnxkiln kernel "
            "(see the kernel registry) or as an ONNX function in the model")

    def add_provider_for_devices(self, *args: Any, **kwargs: Any) -> None:
        """Refused: onnxkiln has no execution-provider devices to select."""
        raise OrtNotImplemented(
            "SessionOptions.add_provider_for_devices: onnxkiln has no plugin execution "
            "providers; pass providers=[...] to InferenceSession")

    def set_provider_selection_policy(self, *args: Any, **kwargs: Any) -> None:
        """Refused: onnxkiln has no execution-provider selection policies."""
        raise OrtNotImplemented(
            "SessionOptions.set_provider_selection_policy: onnxkiln has no provider "
            "selection policies; pass providers=[...] to InferenceSession")

    def has_providers(self) -> bool:
        """False: providers are chosen by InferenceSession(providers=...)."""
        return False

    def clear_ep_context_data_read_func(self) -> None:
        """Accepted: there is no read function to clear."""

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Set a string config entry (keys onnxkiln knows are checked at session build)."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidOptionError(
                f"add_session_config_entry takes two strings, got {key!r}, {value!r}")
        self._config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        """The value set for `key`; raises if it was never set."""
        if key not in self._config:
            raise UnknownOptionError(
                f"SessionOptions does not have configuration with key: {key} "
                f"(set: {sorted(self._config)})"
            )
        return self._config[key]

    def config_entries(self) -> dict[str, str]:
        """Every config entry set so far (onnxkiln extension)."""
        return dict(self._config)

    def __copy__(self) -> SessionOptions:
        new = SessionOptions.__new__(SessionOptions)
        for name in self.__slots__:
            setattr(new, name, getattr(self, name))
        for name in ("_config", "_initializers", "_external_files", "_dim_names",
                     "_dim_denotations"):
            setattr(new, name, dict(getattr(self, name)))
        return new

    def __repr__(self) -> str:
        level = GraphOptimizationLevel(self.graph_optimization_level).name
        return (f"SessionOptions(graph_optimization_level={level}, "
                f"intra_op_num_threads={self.intra_op_num_threads}, "
                f"enable_profiling={self.enable_profiling})")


def _host_array(value: Any, what: str) -> np.ndarray:
    from onnxkiln.compat._values import OrtValue

    if isinstance(value, OrtValue):
        value = value.numpy()
    if not isinstance(value, np.ndarray):
        raise InvalidOptionError(f"{what}: the value must be an OrtValue or a numpy array, got "
                                 f"{type(value).__name__}")
    return np.array(value)  # a copy: later changes to the caller's array do not leak in


def _dim_key(text: Any, what: str) -> str:
    if not isinstance(text, str) or not text:
        raise InvalidOptionError(f"free dimension override: the dimension {what} must be a "
                                 f"non-empty str, got {text!r}")
    return text


def _dim_value(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InvalidOptionError(
            f"free dimension override {name!r}: the value must be an int >= 0, got {value!r}")
    return int(value)


class _TerminateFlag:
    """What onnxkiln's `run(..., cancel=)` polls: RunOptions.terminate, read live."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def is_set(self) -> bool:
        return self._event.is_set()


TIMEOUT_KEY = "kiln.run.timeout_s"  # onnxkiln's run timeout, a RunOptions config entry


@ort_errors_class
class RunOptions:
    """Per-run options. `terminate = True`, set before the run or from another thread
    during it, stops the run at the next node with `onnxkiln.RunCancelledError` (a run
    with `terminate` already True fails at once, as onnxruntime's does); set it back to
    False to run again. `log_severity_level` 3 or 4 silences onnxkiln's warnings during
    the run; `logid` tags compat's debug log lines. Runs always prune to the requested
    outputs, as if `only_execute_path_to_fetches` were set (see `InferenceSession.run`).
    onnxruntime has no run timeout; the run config entry `kiln.run.timeout_s` (seconds, a
    decimal string) is onnxkiln's: the run stops with `onnxkiln.RunTimeoutError` (a
    RunCancelledError) at the first node or Loop/Scan iteration past it.

    Example:
        >>> ro = RunOptions()
        >>> threading.Timer(2.0, lambda: setattr(ro, "terminate", True)).start()
        >>> sess.run(None, feeds, ro)   # raises RunCancelledError if still running at 2 s
        >>> ro.add_run_config_entry("kiln.run.timeout_s", "2.5")  # the same without a timer
    """

    __slots__ = ("_adapters", "_config", "_flag", "log_severity_level", "log_verbosity_level",
                 "logid", "only_execute_path_to_fetches", "synchronize_execution_providers")

    def __init__(self) -> None:
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.only_execute_path_to_fetches = False
        self.synchronize_execution_providers = True
        self._flag = _TerminateFlag()
        self._config: dict[str, str] = {}
        self._adapters: list[Any] = []

    def add_active_adapter(self, adapter: Any) -> None:
        """Feed `adapter`'s parameters (a compat.LoraAdapter) to `run` and
        `run_with_ort_values` calls with these options (not IOBinding runs, as in
        onnxruntime), each as the model input or overridable initializer of its name;
        adapters added later win where names repeat, adapter values over the run's feeds."""
        from onnxkiln.compat._lora import LoraAdapter

        if not isinstance(adapter, LoraAdapter):
            raise InvalidOptionError("add_active_adapter takes an onnxkiln.compat.LoraAdapter, "
                                     f"got {type(adapter).__name__}")
        self._adapters.append(adapter)

    @property
    def terminate(self) -> bool:
        """Set to True to stop runs that use these options."""
        return self._flag.is_set()

    @terminate.setter
    def terminate(self, value: bool) -> None:
        if value:
            self._flag._event.set()
        else:
            self._flag._event.clear()

    def add_run_config_entry(self, key: str, value: str) -> None:
        """Set a string run config entry (kept; onnxkiln reads `kiln.run.timeout_s`)."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidOptionError(
                f"add_run_config_entry takes two strings, got {key!r}, {value!r}")
        self._config[key] = value

    def get_run_config_entry(self, key: str) -> str:
        """The value set for `key`; raises if it was never set."""
        if key not in self._config:
            raise UnknownOptionError(f"RunOptions does not have configuration with key: {key}")
        return self._config[key]

    def timeout_s(self) -> float | None:
        """The `kiln.run.timeout_s` entry in seconds (None: not set)."""
        text = self._config.get(TIMEOUT_KEY)
        if text is None:
            return None
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds <= 0:
            raise InvalidOptionError(
                f"run config entry {TIMEOUT_KEY} takes a number of seconds > 0, got {text!r}")
        return seconds


def copy_options(options: SessionOptions | None) -> SessionOptions:
    """The session's own snapshot: later changes to the caller's object do not leak in."""
    if options is None:
        return SessionOptions()
    if not isinstance(options, SessionOptions):
        raise InvalidOptionError(
            f"sess_options must be onnxkiln.compat.SessionOptions, got {type(options).__name__}"
            " (an onnxruntime.SessionOptions cannot be read here)")
    return copy.copy(options)


@ort_errors
def set_default_logger_severity(severity: int) -> None:
    """Global default severity (0 verbose ... 4 fatal) for sessions whose options leave
    it at -1; also the level of the "onnxkiln" logger."""
    global _default_severity
    if severity not in _LOGGING_LEVELS:
        raise InvalidOptionError(f"logger severity must be 0 to 4, got {severity!r}")
    _default_severity = severity
    logging.getLogger("onnxkiln").setLevel(_LOGGING_LEVELS[severity])


class _CallbackHandler(logging.Handler):
    """Hands the "onnxkiln" logger's records to an onnxruntime-style callback
    `(severity, category, logid, code_location, message)`; a callback that raises is
    reported through sys.unraisablehook, as onnxruntime does, and never stops the run."""

    def __init__(self, callback: Any) -> None:
        super().__init__()
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        severity = max((s for s, level in _LOGGING_LEVELS.items() if record.levelno >= level),
                       default=0)
        try:
            self.callback(severity, record.name, "",
                          f"{record.pathname}:{record.lineno} {record.funcName}",
                          record.getMessage())
        except Exception as e:  # a logging callback must not break the run that logs
            sys.unraisablehook(SimpleNamespace(  # the fields of sys.UnraisableHookArgs
                exc_type=type(e), exc_value=e, exc_traceback=e.__traceback__,
                err_msg="Exception in the onnxruntime logging callback", object=self.callback))


_callback_handler: _CallbackHandler | None = None


def set_default_logger_callback(callback: Any, severity: int = 2) -> None:
    """Send onnxkiln's log records (logger "onnxkiln") to `callback(severity, category,
    logid, code_location, message)` and set the default severity, as onnxruntime does;
    None removes the callback and keeps the severity."""
    global _callback_handler
    if isinstance(severity, bool) or severity not in _LOGGING_LEVELS:
        raise InvalidOptionError(f"logger severity must be 0 to 4, got {severity!r}")
    if callback is not None and not callable(callback):
        raise InvalidOptionError(
            f"set_default_logger_callback takes a callable or None, got {callback!r}")
    logger = logging.getLogger("onnxkiln")
    if _callback_handler is not None:
        logger.removeHandler(_callback_handler)
        _callback_handler = None
    if callback is not None:
        _callback_handler = _CallbackHandler(callback)
        logger.addHandler(_callback_handler)
        set_default_logger_severity(severity)


def set_default_logger_verbosity(verbosity: int) -> None:
    """Accepted for compatibility; onnxkiln has no verbose log channel."""


def effective_severity(*levels: int) -> int:
    """The first level that is set (>= 0), else the global default."""
    for level in levels:
        if isinstance(level, int) and level >= 0:
            return min(level, 4)
    return _default_severity


class _ThreadThreshold(logging.Filter):
    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread or record.levelno >= self.level


@contextlib.contextmanager
def log_threshold(severity: int) -> Iterator[None]:
    """Drop onnxkiln log records below `severity` emitted by this thread, for the block.

    Only raising the bar is scoped (severity 3: errors only, 4: fatal only); a lower
    severity than the loggers' own level would need a global change, so it does nothing.
    """
    if severity < 3:
        yield
        return
    flt = _ThreadThreshold(_LOGGING_LEVELS[severity])
    manager = logging.Logger.manager
    loggers = [lg for name, lg in list(manager.loggerDict.items())
               if isinstance(lg, logging.Logger) and (name == "onnxkiln"
                                                      or name.startswith("onnxkiln."))]
    for lg in loggers:
        lg.addFilter(flt)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(flt)
