"""InferenceSession with onnxruntime's Python API, over onnxkiln.InferenceSession."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from onnxkiln.compat import _providers
from onnxkiln.compat._devices import CPU_MEMORY, OrtMemoryInfo
from onnxkiln.compat._edits import LOAD_CONFIG_ENV, apply_model_config, edit_model, has_edits
from onnxkiln.compat._errors import Fail, ort_errors_class
from onnxkiln.compat._iobinding import IOBinding
from onnxkiln.compat._lora import adapter_feeds
from onnxkiln.compat._model import ModelInfo, needed_nodes, prune
from onnxkiln.compat._options import (
    OPTIMIZATION,
    GraphOptimizationLevel,
    RunOptions,
    SessionOptions,
    copy_options,
    effective_severity,
    log_threshold,
)
from onnxkiln.compat._sparse import refuse_sparse_feeds
from onnxkiln.compat._values import ModelMetadata, NodeArg, OrtValue, check_map_feed
from onnxkiln.errors import (
    InputNotFoundError,
    InvalidInputError,
    InvalidOptionError,
    ModelLoadError,
    RunCancelledError,
)
from onnxkiln.options import KNOWN_OPTIONS
from onnxkiln.session import InferenceSession as _Session
from onnxkiln.session import SessionBuilder
from onnxkiln.trace import TraceContext
from onnxkiln.types import DeviceType

__all__ = ["InferenceSession"]

logger = logging.getLogger(__name__)
_MAX_SUBSETS = 16  # pruned sessions kept per InferenceSession (least recently used dropped)
EXTERNAL_FILE_KEY = "session.optimized_model_external_initializers_file_name"
EXTERNAL_MIN_KEY = "session.optimized_model_external_initializers_min_size_in_bytes"
ASSIGNMENT_KEY = "session.record_ep_graph_assignment_info"


class EpAssignedNode:
    """A node in `get_provider_graph_assignment_info()`: name, op_type, domain."""

    __slots__ = ("domain", "name", "op_type")

    def __init__(self, name: str, op_type: str, domain: str) -> None:
        self.name, self.op_type, self.domain = name, op_type, domain


class EpAssignedSubgraph:
    """Nodes one provider runs: `ep_name`, `get_nodes()`."""

    __slots__ = ("_nodes", "ep_name")

    def __init__(self, ep_name: str, nodes: list[EpAssignedNode]) -> None:
        self.ep_name, self._nodes = ep_name, nodes

    def get_nodes(self) -> list[EpAssignedNode]:
        return list(self._nodes)


@ort_errors_class
class InferenceSession:
    """onnxruntime's `InferenceSession` over onnxkiln: code written for onnxruntime runs
    after `import onnxkiln.compat as ort` (or `as rt`).

    `path_or_bytes` is a model path or its serialized bytes. `providers` takes
    onnxruntime's names (strings or `(name, options)` tuples): CPUExecutionProvider runs
    on onnxkiln's CPU provider; CUDAExecutionProvider asks for onnxkiln's CUDA provider,
    which falls back to the CPU with a warning when it cannot run; other onnxruntime
    providers are skipped with a warning, and unknown names raise. `providers=None` uses
    `get_available_providers()`. Extra keyword arguments onnxruntime accepts
    (`enable_fallback`, `disabled_optimizers`, ...) are accepted and ignored.

    Errors are onnxkiln's (`onnxkiln.SessionError` subclasses, all RuntimeErrors) and
    also onnxruntime's classes from `onnxruntime.capi.onnxruntime_pybind11_state`: a bad
    dtype, rank, dim, input or output name is an InvalidInputError / ShapeError /
    InputNotFoundError and an InvalidArgument; a missing file a ModelLoadError and a
    NoSuchFile, bytes that are no model an InvalidProtobuf, other load failures, kernel
    failures and a set `terminate` a Fail (the mapping: `onnxkiln.compat._errors`).

    Example:
        >>> import onnxkiln.compat as rt
        >>> sess = rt.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
        >>> name = sess.get_inputs()[0].name
        >>> label, = sess.run([sess.get_outputs()[0].name], {name: X})
    """

    def __init__(
        self,
        path_or_bytes: str | bytes | os.PathLike,
        sess_options: SessionOptions | None = None,
        providers: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(path_or_bytes, str | os.PathLike):
            self._path: Path | None = Path(os.fspath(path_or_bytes))
            self._bytes: bytes | None = None
        elif isinstance(path_or_bytes, bytes | bytearray | memoryview):
            self._path, self._bytes = None, bytes(path_or_bytes)
        else:
            raise ModelLoadError(
                f"Unable to load from type '{type(path_or_bytes)}': give a model path "
                "(str or os.PathLike) or the serialized model bytes")
        self._options = copy_options(sess_options)
        if os.environ.get(LOAD_CONFIG_ENV) == "1":
            self._load_config_from_model()
        self._fallback = bool(int(kwargs.get("enable_fallback", 1)))
        self._severity = effective_severity(self._options.log_severity_level)
        self._lock = threading.Lock()
        self._trace = TraceContext.disabled()
        self._profile_path = ""
        self._profile_start_ns = 0
        self._finalizer: weakref.finalize | None = None
        if self._options.enable_profiling:
            self._start_profiling()
        self._configure(providers, provider_options)

    # construction -------------------------------------------------------------------
    def _configure(self, providers: Any, provider_options: Any) -> None:
        names, options = _providers.normalize_providers(providers, provider_options)
        kiln = _providers.to_onnxkiln(names, options)
        builder = self._builder(kiln, main=True)
        with log_threshold(self._severity):
            if has_edits(self._options):
                session = builder.load_bytes(self._proto().SerializeToString(), self._folder())
            elif self._path is not None:
                session = builder.load(self._path)
            else:
                session = builder.load_bytes(self._bytes or b"")
        self._externalize_optimized_model()
        proto = self._proto()
        info = ModelInfo.read(proto, session.inputs(), session.outputs())
        del proto
        with self._lock:
            self._main = session
            self._kiln_providers = kiln
            self._info = info
            self._subsets: OrderedDict[frozenset[str], tuple[_Session, dict[str, int]]] = (
                OrderedDict())
            self._output_index = {a.name: i for i, a in enumerate(info.outputs)}
            self._input_names = {a.name for a in (*info.inputs, *info.overridable)}
            on_cuda = session.device_id().type is DeviceType.CUDA
            used = [(n, o) for n, o in zip(names, options)
                    if n == _providers.CPU or (n == _providers.CUDA and on_cuda)]
            self._providers = [n for n, _ in used]
            self._provider_options = {n: dict(o) for n, o in used}

    def _builder(self, providers: list[str], main: bool) -> SessionBuilder:
        so = self._options
        b = _Session.builder().providers(providers)
        try:
            level = GraphOptimizationLevel(so.graph_optimization_level)
        except ValueError:
            raise InvalidOptionError(
                f"graph_optimization_level must be a GraphOptimizationLevel, got "
                f"{so.graph_optimization_level!r}") from None
        b.optimization(OPTIMIZATION[level])
        threads = so.intra_op_num_threads
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise InvalidOptionError(
                f"intra_op_num_threads must be an int (0 = default), got {threads!r}")
        if threads > 0:  # 0 and below: the default, as onnxruntime reads them
            b.intra_op_threads(threads)
        for key, value in so.config_entries().items():
            if key in KNOWN_OPTIONS:
                b.option(key, value)
            else:
                logger.debug("session config entry '%s' has no onnxkiln equivalent; ignored",
                             key)
        if main and so.optimized_model_filepath:
            b.option("optimized_model_path", os.fspath(so.optimized_model_filepath))
        if self._trace.enabled:
            b.trace(self._trace)
        return b

    def _proto(self) -> onnx.ModelProto:
        """The ModelProto, parsed again (weights of external data stay on disk), with the
        changes the session options ask for (`add_initializer`, dimension overrides...)."""
        data = self._bytes if self._bytes is not None else Path(self._path).read_bytes()
        proto = onnx.ModelProto()
        proto.ParseFromString(data)
        return edit_model(proto, self._options) if has_edits(self._options) else proto

    def _folder(self) -> str | None:
        """Where the model's external data lives (None for a model given as bytes)."""
        return os.fspath(self._path.resolve().parent) if self._path is not None else None

    def _load_config_from_model(self) -> None:
        """ORT_LOAD_CONFIG_FROM_MODEL=1: the model's "ort_config" session options."""
        try:
            data = self._bytes if self._bytes is not None else Path(self._path).read_bytes()
            proto = onnx.ModelProto()
            proto.ParseFromString(data)
        except (OSError, DecodeError):
            return  # the build says what is wrong with the model
        apply_model_config(proto, self._options)

    def _externalize_optimized_model(self) -> None:
        """With optimized_model_filepath and the config entry
        session.optimized_model_external_initializers_file_name, move the written model's
        initializers of at least ..._min_size_in_bytes (default 1024) into that file."""
        so = self._options
        config = so.config_entries()
        name = config.get(EXTERNAL_FILE_KEY)
        if not name or not so.optimized_model_filepath:
            return
        if os.path.basename(name) != name or name in (".", ".."):
            raise InvalidOptionError(
                f"session config entry {EXTERNAL_FILE_KEY}: {name!r} must be a file name "
                "beside the optimized model, with no folder")
        text = config.get(EXTERNAL_MIN_KEY, "1024")
        if not text.isdigit():
            raise InvalidOptionError(
                f"session config entry {EXTERNAL_MIN_KEY} takes a number of bytes, got {text!r}")
        path = os.fspath(so.optimized_model_filepath)
        model = onnx.load(path)
        data_file = os.path.join(os.path.dirname(os.path.abspath(path)), name)
        if os.path.isfile(data_file):  # onnx appends to an existing file: start afresh
            os.remove(data_file)
        onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=name, size_threshold=int(text))

    def _start_profiling(self) -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now))
        millis = int(now * 1000) % 1000
        self._profile_path = f"{self._options.profile_file_prefix}_{stamp}_{millis:03d}.json"
        self._trace = TraceContext.chrome(self._profile_path)
        self._profile_start_ns = time.monotonic_ns()
        # onnxruntime writes the profile when the session is destroyed, if not before
        self._finalizer = weakref.finalize(self, self._trace.close)

    # metadata -----------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        """Graph inputs the caller feeds (initializers excluded)."""
        return list(self._info.inputs)

    def get_outputs(self) -> list[NodeArg]:
        """Graph outputs, in order."""
        return list(self._info.outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers that are also graph inputs: a feed of that name replaces them."""
        return list(self._info.overridable)

    def get_modelmeta(self) -> ModelMetadata:
        """Producer, graph name, domain, doc strings, model version, metadata props."""
        return self._info.metadata

    def get_providers(self) -> list[str]:
        """The providers this session runs on, e.g. ['CPUExecutionProvider']."""
        return list(self._providers)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Options of each provider in use, as strings."""
        return {k: dict(v) for k, v in self._provider_options.items()}

    def get_session_options(self) -> SessionOptions:
        """The session's copy of the options it was built with."""
        return self._options

    def set_providers(self, providers: Sequence[Any] | None = None,
                      provider_options: Sequence[dict[str, Any]] | None = None) -> None:
        """Rebuild the session on other providers (None: get_available_providers())."""
        self._configure(providers, provider_options)

    def disable_fallback(self) -> None:
        """Accepted for compatibility (onnxkiln's fallback happens at build)."""
        self._fallback = False

    def enable_fallback(self) -> None:
        """Accepted for compatibility (onnxkiln's fallback happens at build)."""
        self._fallback = True

    @property
    def _model_path(self) -> str | None:
        """The model path as given, or None (onnxruntime's attribute; optimum reads it)."""
        return os.fspath(self._path) if self._path is not None else None

    @property
    def _model_bytes(self) -> bytes | None:
        """The model bytes as given, or None (onnxruntime's attribute)."""
        return self._bytes

    @property
    def session(self) -> _Session:
        """The onnxkiln session behind this one (all outputs; onnxkiln extension)."""
        return self._main

    # running ------------------------------------------------------------------------
    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: RunOptions | None = None) -> list[Any]:
        """Outputs `output_names` (None or []: all) for the feeds in `input_feed`.

        Tensors come back as numpy arrays, sequences as lists, maps as dicts, an empty
        optional as None. Only the nodes the requested outputs depend on run: a pruned
        session is built once per output subset and cached (the last 16 subsets). This
        differs from onnxruntime 1.32, which runs every node whatever `output_names` (and
        RunOptions.only_execute_path_to_fetches) say: an unneeded node that would fail
        fails there and not here.

        Example:
            >>> probs, = sess.run(["probabilities"], {"input": x})
        """
        names = self._check_outputs(output_names)
        feed = self._check_feed(input_feed, run_options)
        return self._execute(names, feed, run_options)

    def run_with_ort_values(self, output_names: Sequence[str] | None,
                            input_dict_ort_values: Mapping[str, OrtValue],
                            run_options: RunOptions | None = None) -> list[OrtValue]:
        """As `run`, with OrtValue feeds and OrtValue results."""
        if not isinstance(input_dict_ort_values, Mapping):
            raise InvalidInputError(
                "run_with_ort_values takes a dict {input name: OrtValue}, got "
                f"{type(input_dict_ort_values).__name__}")
        for name, value in input_dict_ort_values.items():
            if not isinstance(value, OrtValue):
                raise InvalidInputError(
                    f"run_with_ort_values: input '{name}' is a {type(value).__name__}, not an "
                    "OrtValue; wrap it with OrtValue.ortvalue_from_numpy(x) or call run()")
        names = self._check_outputs(output_names)
        feed = self._check_feed(input_dict_ort_values, run_options)
        return [OrtValue(v) for v in self._execute(names, feed, run_options)]

    def run_async(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                  callback: Any, user_data: Any, run_options: RunOptions | None = None) -> None:
        """As `run`, on another thread: `callback(results, user_data, err)` gets the
        outputs and "" when the run succeeds, [] and the error message when it fails."""
        if not callable(callback):
            raise InvalidInputError(
                f"run_async: callback must be callable (results, user_data, err), got "
                f"{type(callback).__name__}")

        def work() -> None:
            try:
                results = self.run(output_names, input_feed, run_options)
            except Exception as e:  # reported through the callback, as onnxruntime does
                callback([], user_data, str(e) or type(e).__name__)
                return
            callback(results, user_data, "")

        threading.Thread(target=work, name="onnxkiln-run-async", daemon=True).start()

    def get_input_memory_infos(self) -> list[OrtMemoryInfo]:
        """Where each input is expected: host memory for all (onnxkiln.compat copies to a
        CUDA provider's device itself)."""
        return [CPU_MEMORY] * len(self._info.inputs)

    def get_input_epdevices(self) -> list[None]:
        """An entry per input, each None: onnxkiln has no plugin execution-provider devices
        (onnxruntime's entries may be None too)."""
        return [None] * len(self._info.inputs)

    def get_output_memory_infos(self) -> list[OrtMemoryInfo]:
        """Where each output is returned: host memory for all."""
        return [CPU_MEMORY] * len(self._info.outputs)

    def get_provider_graph_assignment_info(self) -> list[EpAssignedSubgraph]:
        """The model's nodes under the provider that runs them, one node a subgraph as
        onnxruntime's kernel-based providers report them; needs the session config entry
        session.record_ep_graph_assignment_info = "1", as in onnxruntime."""
        if self._options.config_entries().get(ASSIGNMENT_KEY) != "1":
            raise Fail(f"Session configuration entry '{ASSIGNMENT_KEY}' must be set to \"1\" "
                       "to retrieve EP graph assignment information.")
        proto = self._proto()
        nodes = [EpAssignedNode(n.name, n.op_type, n.domain) for n in proto.graph.node]
        return [EpAssignedSubgraph(self._providers[0], [node]) for node in nodes]

    def io_binding(self) -> IOBinding:
        """A new IOBinding for this session (see `run_with_iobinding`)."""
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: RunOptions | None = None
                           ) -> None:
        """Run on the binding's inputs and fill its outputs."""
        if getattr(iobinding, "_session", None) is not self:
            raise InvalidInputError("IOBinding must be used with the session that created it.")
        iobinding._run(run_options)

    def _check_outputs(self, output_names: Sequence[str] | None) -> list[str]:
        if not output_names:
            return [a.name for a in self._info.outputs]
        if isinstance(output_names, str):
            raise InvalidInputError(
                f"output_names must be a list of names, got the string {output_names!r}; "
                f"write [{output_names!r}]")
        names = list(output_names)
        for name in names:
            if name not in self._output_index:
                known = [a.name for a in self._info.outputs]
                raise InvalidInputError(
                    f"Invalid output name: {name!r}; the model's outputs are {known}")
        return names

    def _check_feed(self, input_feed: Any, run_options: Any = None) -> dict[str, Any]:
        if not isinstance(input_feed, Mapping):
            raise InvalidInputError(
                "input_feed must be a dict {input name: value}, got "
                f"{type(input_feed).__name__}")
        missing = [a.name for a in self._info.inputs
                   if a.name not in input_feed and not a.type.startswith("optional")]
        if missing:
            raise InvalidInputError(
                f"Required inputs ({missing}) are missing from input feed "
                f"({list(input_feed)}).")
        if isinstance(run_options, RunOptions):  # active LoRA adapters feed their parameters
            input_feed = adapter_feeds(input_feed, run_options._adapters)
        feed = {k: _void_as_strings(v.value if isinstance(v, OrtValue) else v)
                for k, v in input_feed.items()}
        refuse_sparse_feeds(feed, [(a.name, a.type) for a in self._info.inputs])
        for arg in self._info.inputs:
            check_map_feed(arg.name, arg.type, feed.get(arg.name))
        return feed

    def _execute(self, names: list[str], feed: dict[str, Any],
                 run_options: RunOptions | None) -> list[Any]:
        session, index = self._session_for(names)
        cancel = timeout = None
        severity = self._severity
        if run_options is not None:
            if not isinstance(run_options, RunOptions):
                raise InvalidOptionError(
                    f"run_options must be onnxkiln.compat.RunOptions, got "
                    f"{type(run_options).__name__}")
            if run_options.terminate:
                raise RunCancelledError(
                    "Exiting due to terminate flag being set to true (RunOptions.terminate); "
                    "set it back to False to run again")
            cancel = run_options._flag
            timeout = run_options.timeout_s()
            severity = effective_severity(run_options.log_severity_level, severity)
            if run_options.logid:
                logger.debug("run '%s': outputs %s", run_options.logid, names)
        with log_threshold(severity):
            results = session.run_outputs(feed, cancel=cancel, timeout=timeout)
        return [_backed(results[index[n]].value) for n in names]

    def _session_for(self, names: list[str]) -> tuple[_Session, dict[str, int]]:
        """The session computing `names` and where each lands in its outputs."""
        key = frozenset(names)
        with self._lock:
            main = self._main
            if len(key) == len(self._output_index):
                return main, self._output_index
            hit = self._subsets.get(key)
            if hit is not None:
                self._subsets.move_to_end(key)
                return hit
            info, kiln = self._info, self._kiln_providers
        keep = needed_nodes(info, sorted(key))
        if len(keep) == len(info.node_writes):
            entry = (main, self._output_index)
        else:
            wanted = [a.name for a in info.outputs if a.name in key]
            data = prune(self._proto(), info, wanted, keep).SerializeToString()
            folder = self._folder()
            with log_threshold(self._severity):
                pruned = self._builder(kiln, main=False).load_bytes(data, folder)
            entry = (pruned, {m.name: i for i, m in enumerate(pruned.outputs())})
            logger.debug("built a session for outputs %s: %d of %d nodes", wanted, len(keep),
                         len(info.node_writes))
        with self._lock:
            if self._main is main:
                self._subsets[key] = entry
                while len(self._subsets) > _MAX_SUBSETS:
                    self._subsets.popitem(last=False)
        return entry

    def _check_input_name(self, name: str, what: str) -> None:
        if name not in self._input_names:
            raise InputNotFoundError(
                f"{what}: the model has no input named {name!r}; its inputs are "
                f"{sorted(self._input_names)}")

    def _check_output_name(self, name: str, what: str) -> None:
        if name not in self._output_index:
            raise InvalidInputError(
                f"{what}: the model has no output named {name!r}; its outputs are "
                f"{list(self._output_index)}")

    # profiling ----------------------------------------------------------------------
    def end_profiling(self) -> str:
        """Write the profile (onnxruntime's Chrome trace format) and return its file
        name; "" when profiling is off or already ended. Later runs are not profiled."""
        if not self._profile_path:
            return ""
        path, self._profile_path = self._profile_path, ""
        if self._finalizer is not None:
            self._finalizer.detach()
        self._trace.close()
        return path

    def get_profiling_start_time_ns(self) -> int:
        """time.monotonic_ns() when profiling started; 0 without profiling."""
        return self._profile_start_ns

    def __repr__(self) -> str:
        source = str(self._path) if self._path is not None else "<bytes>"
        return f"InferenceSession({source}, providers={self._providers})"


def _void_as_strings(value: Any) -> Any:
    """An np.void array (fixed-size raw bytes, which keep their trailing zero bytes) as the
    strings onnxruntime reads from it: each element's bytes decoded as UTF-8."""
    if not isinstance(value, np.ndarray) or value.dtype.kind != "V" or value.dtype.names:
        return value
    try:
        strings = [bytes(item).decode("utf-8") for item in value.ravel()]
    except UnicodeDecodeError as e:
        raise InvalidInputError(f"np.void input is not UTF-8 text: {e}") from None
    return np.array(strings, dtype=object).reshape(value.shape)


def _backed(value: Any) -> Any:
    """A session-made array as onnxruntime hands it out: a view whose `.base` holds the
    buffer (programs and onnxruntime's own tests read a base as "not a separate copy");
    the same memory, no copy."""
    if type(value) is np.ndarray and value.base is None:
        return value.view()
    return value
