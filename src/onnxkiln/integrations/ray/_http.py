"""The HTTP side of the Serve deployment, without Ray: body formats, errors, batching.

Request formats (POST {prefix}/predict):

- JSON, `Content-Type: application/json`:
  `{"inputs": {"x": [[1, 2, 3]]}, "dtypes": {"x": "float32"}, "outputs": ["y"]}`.
  `inputs` maps each input name to a number or a nested (rectangular) list.
  `dtypes` is optional: without it each list becomes the input's declared dtype when
  numpy casts it "same_kind" (ints -> float32, float64 -> float16 ...); otherwise it is
  sent as parsed and the session rejects it (422). With it the array is made with that
  dtype, which the session then checks; it must be a bool or numeric dtype, or the
  input's own (a string input takes "str"): other dtypes (fixed-width strings such as
  "U100000000", records, objects) are a 422 before anything is allocated. The array a
  list makes (elements x itemsize) must fit the body-size limit (else 413), checked
  before numpy allocates it. `outputs` optionally picks outputs (default all).
- npz, `Content-Type: application/x-npz`: the body of `np.savez(f, x=..., mask=...)`,
  one array per input, names as keys.
- npy, `Content-Type: application/x-npy`: the body of `np.save(f, x)` for a model with
  one required input.
- `application/octet-stream`, none, or `application/x-www-form-urlencoded` (what
  `curl --data-binary` sends by default): npy, npz or JSON as told by the first bytes.

`?outputs=a,b` picks outputs for every format. Object (pickled) arrays are refused; an
.npy header must promise exactly the bytes that follow, and an .npz must unpack to at most
the body-size limit, both checked before the arrays are made.

Responses come in the request's format unless `Accept` names another of the three:
JSON `{"outputs": {name: nested list}, "dtypes": {name: str}, "shapes": {name: [..]}}`;
npz with one array per output; npy only when one output is returned (else npz).
Errors are JSON `{"error": {"status", "type", "message"}}`: 400 for a malformed body,
413 for one over the size limit, 415 for an unknown content type, 422 with the
session's message when the model rejects the inputs (unknown or missing name, dtype,
rank, shape), 500 when the run itself fails.

Batching (see `Engine.run_batch`) is off by default: each request runs on its own.
With `batching=True` (the deployer's statement that the model treats rows independently)
the model is first checked statically (`_batch_safety`: no reduction, sort, scan,
normalization or contraction over the batch axis, every output carries the batch on axis
0) and refused with the node that fails; when it passes, requests whose arrays agree on
names, dtypes and every dim but the first are concatenated along axis 0, run once, and
split back by row counts. A request that cannot join one (other trailing shapes or dtypes,
inputs without a common symbolic first dim) runs on its own in the same batch, so
mismatched shapes cost speed, never correctness.
"""

from __future__ import annotations

import io
import json
import threading
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxkiln.dtypes import DataType
from onnxkiln.errors import (
    InputNotFoundError,
    InvalidInputError,
    InvalidOptionError,
    MemoryLimitError,
    RunCancelledError,
    SessionError,
)
from onnxkiln.integrations.ray._batch_safety import require_independent_rows
from onnxkiln.session import InferenceSession
from onnxkiln.types import IoMeta

__all__ = [
    "JSON",
    "NPY",
    "NPZ",
    "Engine",
    "HttpError",
    "Predict",
    "decode",
    "encode",
    "error_body",
    "error_for",
    "response_format",
]

JSON = "application/json"
NPY = "application/x-npy"
NPZ = "application/x-npz"
_MEDIA = {
    "application/json": "json", "text/json": "json",
    "application/x-npy": "npy", "application/npy": "npy",
    "application/x-npz": "npz", "application/npz": "npz", "application/zip": "npz",
}
_TYPES = {"json": JSON, "npy": NPY, "npz": NPZ}
_JSON_KEYS = ("inputs", "dtypes", "outputs")
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


class HttpError(Exception):
    """A request the server refuses: HTTP status, error type and message."""

    def __init__(self, status: int, message: str, kind: str = "BadRequest",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers


@dataclass
class Predict:
    """A decoded predict request."""

    feeds: dict[str, np.ndarray]
    fmt: str  # the body's format: "json", "npy" or "npz"
    outputs: list[str] | None = None  # the outputs asked for; None for all


# --- requests -----------------------------------------------------------------------------


def media_format(content_type: str | None, body: bytes) -> str:
    """"json", "npy" or "npz" from the Content-Type (sniffed for octet-stream or none)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media in _MEDIA:
        return _MEDIA[media]
    if media.endswith("+json"):
        return "json"
    if media in ("", "application/octet-stream", "application/x-www-form-urlencoded"):
        # (curl -d and urllib send the last one when told nothing)
        if body.startswith(_NPY_MAGIC):
            return "npy"
        if body.startswith(_ZIP_MAGIC):
            return "npz"
        if body.lstrip()[:1] == b"{":
            return "json"
        raise HttpError(400, "cannot tell the body's format: send Content-Type "
                        f"{JSON}, {NPZ} or {NPY}")
    raise HttpError(415, f"unsupported Content-Type '{media}'; use {JSON}, {NPZ} or {NPY}",
                    "UnsupportedMediaType")


def decode(body: bytes, content_type: str | None, inputs: Sequence[IoMeta],
           outputs: Sequence[IoMeta], max_bytes: int, query_outputs: str | None = None
           ) -> Predict:
    """Parse a predict body into feeds; raises `HttpError` for what cannot be parsed."""
    if len(body) > max_bytes:
        raise HttpError(413, f"the body has {len(body)} bytes, over the server's limit of "
                        f"{max_bytes}", "PayloadTooLarge")
    fmt = media_format(content_type, body)
    wanted = None
    if fmt == "json":
        feeds, wanted = _decode_json(body, inputs, max_bytes)
    elif fmt == "npz":
        feeds = _decode_npz(body, max_bytes)
    else:
        feeds = _decode_single_npy(body, inputs)
    if query_outputs is not None:
        wanted = [n for n in query_outputs.split(",") if n]
    if wanted is not None:
        names = [m.name for m in outputs]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise HttpError(422, f"unknown output(s) {unknown}; the model's outputs are {names}",
                            "InputNotFoundError")
    return Predict(feeds, fmt, wanted)


def _decode_json(body: bytes, inputs: Sequence[IoMeta], max_bytes: int
                 ) -> tuple[dict[str, np.ndarray], list[str] | None]:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as e:
        raise HttpError(400, f"malformed JSON: {e}") from e
    except RecursionError as e:
        raise HttpError(400, "malformed JSON: nested too deeply") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), dict):
        raise HttpError(400, 'the JSON body must be an object {"inputs": {name: nested list}, '
                        '"dtypes": {name: dtype} (optional), "outputs": [name] (optional)}')
    extra = sorted(set(doc) - set(_JSON_KEYS))
    if extra:
        raise HttpError(400, f"unknown key(s) {extra} in the JSON body; it takes {_JSON_KEYS}")
    dtypes = doc.get("dtypes") or {}
    if not isinstance(dtypes, dict) or not all(isinstance(v, str) for v in dtypes.values()):
        raise HttpError(400, '"dtypes" must map input names to dtype names like "float32"')
    unknown = sorted(set(dtypes) - set(doc["inputs"]))
    if unknown:
        raise HttpError(400, f'"dtypes" names {unknown}, which are not in "inputs"')
    wanted = doc.get("outputs")
    if wanted is not None and (not isinstance(wanted, list)
                               or not all(isinstance(n, str) for n in wanted)):
        raise HttpError(400, '"outputs" must be a list of output names')
    metas = {m.name: m for m in inputs}
    feeds = {name: _json_array(name, value, dtypes.get(name), metas.get(name), max_bytes)
             for name, value in doc["inputs"].items()}
    return feeds, wanted


def _json_array(name: str, value: Any, dtype: str | None, meta: IoMeta | None,
                max_bytes: int) -> np.ndarray:
    if value is None or isinstance(value, dict):
        raise HttpError(400, f"input '{name}' must be a number, a string or a nested list, got "
                        f"{type(value).__name__}")
    target = _target_dtype(meta)
    if dtype is not None:
        np_dtype = _requested_dtype(name, dtype, target)
        if np_dtype is not None:
            _check_size(name, value, np_dtype.itemsize, max_bytes)
            try:
                return np.asarray(value, dtype=np_dtype)
            except (ValueError, TypeError, OverflowError) as e:
                raise HttpError(400, f"input '{name}': cannot make a {np_dtype} array: {e}"
                                ) from e
    text = _check_size(name, value, 8, max_bytes)  # numbers parse as 8-byte ints or floats
    try:
        if (text and target is None) or (target is not None and target.kind == "O"):
            return np.asarray(value, dtype=object)
        if text:  # as fixed-width str, one long string would widen every element
            raise HttpError(400, f"input '{name}' is not a rectangular nested list of numbers: "
                            f"it holds strings, and the model's input takes {target}")
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as e:
        raise HttpError(400, f"input '{name}' is not a rectangular nested list of numbers: {e}",
                        ) from e
    if arr.dtype == object:
        raise HttpError(400, f"input '{name}' is not a rectangular nested list of numbers "
                        "(mixed types, or integers out of range)")
    if target is not None and arr.dtype != target and arr.dtype.kind in "biuf":
        try:
            if np.can_cast(arr.dtype, target, "same_kind"):
                return arr.astype(target)
        except TypeError:
            pass
    return arr  # as parsed: the session says what it expected


def _requested_dtype(name: str, dtype: str, target: np.dtype | None) -> np.dtype | None:
    """The dtype a request names, if the server makes arrays of it (None: a string input's
    "str", built as the input's own); fixed-width strings, records and objects refused."""
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as e:
        raise HttpError(400, f"input '{name}': unknown dtype {dtype!r}") from e
    if target is not None and target.kind == "O" and np_dtype.kind in "OUS":
        return None
    if np_dtype.kind in "biufc" or np_dtype == target:
        return np_dtype
    expected = f"; the model's input takes {target}" if target is not None else ""
    raise HttpError(422, f"input '{name}': the server does not make arrays of dtype {dtype!r} "
                    f"({np_dtype.itemsize} bytes per element); send a bool or numeric dtype"
                    f"{expected}", "InvalidInputError")


def _check_size(name: str, value: Any, itemsize: int, max_bytes: int) -> bool:
    """Refuse (413) a nested list whose array would exceed the body-size limit; whether
    it holds strings."""
    count, text, stack = 0, False, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        else:
            count += 1
            text = text or isinstance(item, str)
    if count * itemsize > max_bytes:
        raise HttpError(413, f"input '{name}' would be {count} elements x {itemsize} bytes = "
                        f"{count * itemsize} bytes, over the server's limit of {max_bytes}",
                        "PayloadTooLarge")
    return text


def _target_dtype(meta: IoMeta | None) -> np.dtype | None:
    if meta is None or meta.kind != "tensor" or meta.dtype == DataType.UNDEFINED:
        return None
    try:
        return DataType(meta.dtype).numpy
    except Exception:  # no numpy dtype for it: leave the value as parsed
        return None


def _parse_npy(data: bytes, what: str) -> np.ndarray:
    """One .npy file; the header must promise exactly the bytes that follow."""
    fp = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except Exception as e:  # numpy raises ValueError, SyntaxError, EOFError ...
        raise HttpError(400, f"{what} is not a valid .npy file: {e}") from e
    if dtype.hasobject:
        raise HttpError(400, f"{what} holds Python objects (a pickled array), which the server "
                        "does not load; send numeric or fixed-width string arrays")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    start = fp.tell()
    if count < 0 or count * dtype.itemsize != len(data) - start:
        raise HttpError(400, f"{what} is not a valid .npy file: its header says {shape} of "
                        f"{dtype}, {count * dtype.itemsize} bytes, but {len(data) - start} "
                        "bytes follow")
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=start)
    if fortran:
        return flat.reshape(shape[::-1]).transpose().copy()
    return flat.reshape(shape).copy()


def _decode_single_npy(body: bytes, inputs: Sequence[IoMeta]) -> dict[str, np.ndarray]:
    required = [m.name for m in inputs if not m.optional]
    if len(required) != 1:
        raise HttpError(400, f"an .npy body feeds a model with one input; this one takes "
                        f"{required}: send an .npz with one array per input, or JSON")
    return {required[0]: _parse_npy(body, "the body")}


def _decode_npz(body: bytes, max_bytes: int) -> dict[str, np.ndarray]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
        members = archive.infolist()
    except Exception as e:  # BadZipFile, and anything a corrupt directory raises
        raise HttpError(400, f"the body is not a valid .npz (zip) file: {e}") from e
    total = sum(info.file_size for info in members)
    if total > max_bytes:
        raise HttpError(413, f"the .npz unpacks to {total} bytes, over the server's limit of "
                        f"{max_bytes}", "PayloadTooLarge")
    feeds: dict[str, np.ndarray] = {}
    for info in members:
        if info.is_dir():
            continue
        if not info.filename.endswith(".npy"):
            raise HttpError(400, f"the .npz holds '{info.filename}', not an .npy member")
        name = info.filename[:-4]
        if name in feeds:
            raise HttpError(400, f"the .npz holds '{info.filename}' twice")
        try:
            data = archive.read(info)
        except Exception as e:  # bad CRC, truncated data, unsupported compression
            raise HttpError(400, f"the .npz member '{info.filename}' is corrupt: {e}") from e
        feeds[name] = _parse_npy(data, f"the .npz member '{info.filename}'")
    return feeds


# --- responses ----------------------------------------------------------------------------


def response_format(request_fmt: str, accept: str | None, n_outputs: int) -> str:
    """The request's format unless Accept names one of ours; npy only for one output."""
    fmt = request_fmt
    for part in (accept or "").split(","):
        media = part.split(";")[0].strip().lower()
        if media in _MEDIA:
            fmt = _MEDIA[media]
            break
    if fmt == "npy" and n_outputs != 1:
        fmt = "npz"
    return fmt


def encode(names: Sequence[str], arrays: Sequence[np.ndarray], fmt: str) -> tuple[bytes, str]:
    """The response body and its Content-Type."""
    if fmt == "json":
        doc: dict[str, dict[str, Any]] = {"outputs": {}, "dtypes": {}, "shapes": {}}
        for name, arr in zip(names, arrays):
            doc["outputs"][name] = _json_value(name, arr)
            doc["dtypes"][name] = str(arr.dtype)
            doc["shapes"][name] = list(arr.shape)
        return json.dumps(doc).encode(), JSON
    buf = io.BytesIO()
    if fmt == "npy":
        np.save(buf, arrays[0], allow_pickle=False)
        return buf.getvalue(), NPY
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        for name, arr in zip(names, arrays):
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(arr), allow_pickle=False)
    return buf.getvalue(), NPZ


def _json_value(name: str, arr: np.ndarray) -> Any:
    if arr.dtype.kind in "biuU" or arr.dtype in (np.float16, np.float32, np.float64):
        return arr.tolist()
    if arr.dtype.kind == "O":  # strings; bytes are decoded, anything else printed
        return np.vectorize(_text, otypes=[object])(arr).tolist() if arr.size else arr.tolist()
    if arr.dtype.kind == "c":
        raise HttpError(406, f"output '{name}' is complex, which JSON cannot hold; ask for "
                        f"Accept: {NPZ}", "NotAcceptable")
    return arr.astype(np.float32).tolist()  # bfloat16, float8 ...: widened


def _text(value: Any) -> Any:
    if isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def error_body(status: int, kind: str, message: str) -> bytes:
    """The JSON body of an error response."""
    return json.dumps({"error": {"status": status, "type": kind, "message": message}}).encode()


def error_for(exc: BaseException) -> HttpError:
    """The HTTP error for what a run raised: 422 for bad inputs, 500 for failed runs."""
    if isinstance(exc, HttpError):
        return exc
    kind = type(exc).__name__
    if isinstance(exc, InputNotFoundError | InvalidInputError):
        return HttpError(422, str(exc), kind)
    if isinstance(exc, MemoryLimitError):
        return HttpError(413, str(exc), kind)
    if isinstance(exc, RunCancelledError):
        return HttpError(503, str(exc), kind)
    if isinstance(exc, SessionError):
        return HttpError(500, str(exc), kind)
    return HttpError(500, f"internal error: {kind}: {exc}", "InternalError")


# --- running, batched ---------------------------------------------------------------------


class Engine:
    """Runs decoded requests on one session; thread-safe; never raises from a request.

    `batching=True` lets `run_batch` stack compatible requests, once the static check
    (`require_independent_rows`) has proven it safe on `model`, the model as written
    (default: the session's graph, whose fused ops the check does not know); it raises
    `InvalidOptionError` naming the node that mixes rows. Default: each request alone.
    """

    def __init__(self, session: InferenceSession, batching: bool = False,
                 model: ir.Model | onnx.ModelProto | None = None) -> None:
        if batching not in (True, False):
            raise InvalidOptionError(f"batching must be True or False, got {batching!r}")
        self.session = session
        if batching:
            require_independent_rows(model if model is not None else session.graph())
        self.batchable = batching
        self.reason = ("on: the model keeps rows apart (checked), so compatible requests "
                       "share a run" if batching else "off: each request runs on its own")
        self._first = {m.name: m.shape[0] if m.shape else None for m in session.inputs()
                       if not m.optional}
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "runs": 0, "stacked_runs": 0, "largest_stack": 0,
                       "errors": 0}

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def _count(self, **delta: int) -> None:
        with self._lock:
            for key, value in delta.items():
                if key == "largest_stack":
                    self._stats[key] = max(self._stats[key], value)
                else:
                    self._stats[key] += value

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | BaseException:
        """One request on its own: its outputs, or the exception it raised."""
        self._count(requests=1)
        return self._run_one(feeds)

    def _run_one(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | BaseException:
        try:
            self._count(runs=1)
            return self.session.run(feeds)
        except Exception as e:  # returned to its own request only
            self._count(errors=1)
            return e

    def run_batch(self, requests: Sequence[dict[str, np.ndarray]]
                  ) -> list[list[np.ndarray] | BaseException]:
        """Each request's outputs (or exception); compatible requests share one run."""
        self._count(requests=len(requests))
        results: list[Any] = [None] * len(requests)
        groups: dict[Any, list[int]] = {}
        for i, feeds in enumerate(requests):
            key = self._key(feeds) if self.batchable else None
            groups.setdefault(key if key is not None else ("alone", i), []).append(i)
        for members in groups.values():
            if len(members) > 1 and self._run_stacked([requests[i] for i in members],
                                                      members, results):
                continue
            for i in members:
                results[i] = self._run_one(requests[i])
        return results

    def _key(self, feeds: dict[str, np.ndarray]) -> tuple | None:
        rows = None
        key = []
        for name in sorted(feeds):
            arr = feeds[name]
            if (name not in self._first or not isinstance(self._first[name], str)
                    or not isinstance(arr, np.ndarray) or arr.ndim == 0):
                return None
            if rows is None:
                rows = arr.shape[0]
            elif arr.shape[0] != rows:
                return None
            key.append((name, arr.dtype.str, arr.shape[1:]))
        return tuple(key) if key else None

    def _run_stacked(self, group: list[dict[str, np.ndarray]], members: list[int],
                     results: list[Any]) -> bool:
        rows = [next(iter(feeds.values())).shape[0] for feeds in group]
        total = sum(rows)
        stacked = {name: np.concatenate([feeds[name] for feeds in group])
                   for name in group[0]}
        try:
            self._count(runs=1)
            outputs = self.session.run(stacked)
        except Exception:  # let each request run alone and get its own error
            return False
        if any(out.ndim == 0 or out.shape[0] != total for out in outputs):
            return False  # not per-row after all: run them one by one
        self._count(stacked_runs=1, largest_stack=len(group))
        cuts = np.cumsum(rows)[:-1]
        parts = [np.split(out, cuts) for out in outputs]
        for j, i in enumerate(members):
            results[i] = [p[j] for p in parts]
        return True
