"""SessionOptions, RunOptions and their enums, with onnxruntime's names and defaults."""

from __future__ import annotations

import contextlib
import copy
import enum
import logging
import math
import threading
from collections.abc import Iterator

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
        new._config = dict(self._config)
        return new

    def __repr__(self) -> str:
        level = GraphOptimizationLevel(self.graph_optimization_level).name
        return (f"SessionOptions(graph_optimization_level={level}, "
                f"intra_op_num_threads={self.intra_op_num_threads}, "
                f"enable_profiling={self.enable_profiling})")


class _TerminateFlag:
    """What onnxkiln's `run(..., cancel=)` polls: RunOptions.terminate, read live."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def is_set(self) -> bool:
        return self._event.is_set()


TIMEOUT_KEY = "kiln.run.timeout_s"  # onnxkiln's run timeout, a RunOptions config entry


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

    __slots__ = ("_config", "_flag", "log_severity_level", "log_verbosity_level", "logid",
                 "only_execute_path_to_fetches", "synchronize_execution_providers")

    def __init__(self) -> None:
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.only_execute_path_to_fetches = False
        self.synchronize_execution_providers = True
        self._flag = _TerminateFlag()
        self._config: dict[str, str] = {}

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


def set_default_logger_severity(severity: int) -> None:
    """Global default severity (0 verbose ... 4 fatal) for sessions whose options leave
    it at -1; also the level of the "onnxkiln" logger."""
    global _default_severity
    if severity not in _LOGGING_LEVELS:
        raise InvalidOptionError(f"logger severity must be 0 to 4, got {severity!r}")
    _default_severity = severity
    logging.getLogger("onnxkiln").setLevel(_LOGGING_LEVELS[severity])


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
