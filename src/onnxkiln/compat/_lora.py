"""onnxruntime's LoRA adapters: `AdapterFormat` (read and write `.onnx_adapter` files),
`LoraAdapter` (load one for runs) and the parameters `RunOptions.add_active_adapter`
feeds.

The file is a flatbuffer of onnxruntime's public schema (adapter_schema.fbs, file
identifier "TORT"): a root table Adapter {format_version, adapter_version, model_version:
int32; parameters: [Parameter]}, each Parameter {name: string; dims: [int64]; data_type:
int32 (ONNX element type numbers); raw_data: [uint8], 8-byte aligned}. The codec here is
written for exactly that schema (no flatbuffers package needed): the writer lays the
buffer out front to back (every offset points forward, as flatbuffers requires) and the
reader checks every offset and length against the buffer, so a damaged file is one clear
error. A run with active adapters feeds each parameter as the model input (or overridable
initializer) of the same name, as onnxruntime does: an adapter's value wins over a feed
of that name, and a later adapter over an earlier one. Required inputs (no default)
must still be fed by the caller: onnxruntime's Python API checks the feeds before it
adds the adapters, and so does this. As in onnxruntime 1.32, only
`run` and `run_with_ort_values` feed them; `run_with_iobinding` does not (bind the
parameters as inputs there).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxkiln.compat._errors import ort_errors_class
from onnxkiln.compat._values import OrtValue, numpy_dtype
from onnxkiln.dtypes import from_numpy
from onnxkiln.errors import InvalidInputError, ModelLoadError

__all__ = ["FORMAT_VERSION", "AdapterFormat", "LoraAdapter", "adapter_feeds",
           "decode_adapter", "encode_adapter"]

FORMAT_VERSION = 1  # the format_version onnxruntime writes and reads
_IDENTIFIER = b"TORT"
# the element types onnxruntime 1.32 reads back as LoRA parameters (it writes bool too,
# then refuses to read it): float, the signed and unsigned ints, float16 and double
_SUPPORTED = {1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
              7: "int64", 10: "float16", 11: "double", 12: "uint32", 13: "uint64"}
_FIELDS = 4  # both tables of the schema have four fields, each 4 bytes inline
_VTABLE = struct.pack("<6H", 4 + 2 * _FIELDS, 4 + 4 * _FIELDS, 4, 8, 12, 16)


class _Writer:
    """A flatbuffer written front to back: a uoffset slot is reserved where it sits and
    pointed at its target once the target's position is known (always later)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def pad(self, align: int, extra: int = 0) -> None:
        """Pad so that an object starting `extra` bytes from here is `align`-aligned."""
        self.buf += b"\0" * (-(len(self.buf) + extra) % align)

    def slot(self) -> int:
        self.buf += b"\0\0\0\0"
        return len(self.buf) - 4

    def point(self, slot: int) -> None:
        struct.pack_into("<I", self.buf, slot, len(self.buf) - slot)

    def table(self, slot: int, *fields: int | None) -> list[int]:
        """A table of four 4-byte fields (int32, or None for a uoffset to fill later)
        preceded by its vtable; `slot` points at it. Returns the uoffset slots."""
        self.pad(4)
        self.buf += _VTABLE
        self.point(slot)
        self.buf += struct.pack("<i", len(_VTABLE))  # the vtable sits just before
        slots = []
        for value in fields:
            if value is None:
                slots.append(self.slot())
            else:
                self.buf += struct.pack("<i", value)
        return slots

    def vector(self, slot: int, data: bytes, count: int, align: int) -> None:
        self.pad(max(align, 4), extra=4)  # the elements, after the length, are aligned
        self.point(slot)
        self.buf += struct.pack("<I", count) + data


def encode_adapter(adapter_version: int, model_version: int,
                   params: Mapping[str, np.ndarray]) -> bytes:
    """The `.onnx_adapter` bytes of these parameters (name -> numeric array)."""
    w = _Writer()
    root = w.slot()
    w.buf += _IDENTIFIER
    params_slot, = w.table(root, FORMAT_VERSION, adapter_version, model_version, None)
    w.pad(4)
    w.point(params_slot)
    w.buf += struct.pack("<I", len(params))
    entries = [(w.slot(), name, array) for name, array in params.items()]
    for slot, name, array in entries:
        name_slot, dims_slot, raw_slot = w.table(
            slot, None, None, int(from_numpy(array.dtype)), None)
        text = name.encode("utf-8")
        w.vector(name_slot, text + b"\0", len(text), 4)
        w.vector(dims_slot, np.asarray(array.shape, "<i8").tobytes(), array.ndim, 8)
        raw = np.ascontiguousarray(array).tobytes()
        w.vector(raw_slot, raw, len(raw), 8)
    w.pad(4)
    return bytes(w.buf)


class _Reader:
    """Bounds-checked reads of a flatbuffer of the adapter schema."""

    def __init__(self, buf: bytearray, what: str) -> None:
        self.buf, self.what = buf, what

    def fail(self, why: str) -> ModelLoadError:
        return ModelLoadError(f"{self.what}: not a valid onnxruntime adapter file ({why})")

    def unpack(self, fmt: str, pos: int) -> Any:
        if pos < 0 or pos + struct.calcsize(fmt) > len(self.buf):
            raise self.fail(f"offset {pos} lies outside the {len(self.buf)} bytes")
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def deref(self, pos: int) -> int:
        return pos + self.unpack("<I", pos)

    def fields(self, table: int) -> list[int | None]:
        """Where each of the table's four fields lies (None: absent, the default)."""
        vtable = table - self.unpack("<i", table)
        size = self.unpack("<H", vtable)
        found: list[int | None] = []
        for i in range(_FIELDS):
            offset = self.unpack("<H", vtable + 4 + 2 * i) if 4 + 2 * i < size else 0
            found.append(table + offset if offset else None)
        return found

    def int32(self, pos: int | None) -> int:
        return 0 if pos is None else self.unpack("<i", pos)

    def vector(self, pos: int | None, item: int) -> tuple[int, int]:
        """(start of the elements, count) of the vector a field points at."""
        if pos is None:
            return 0, 0
        start = self.deref(pos)
        count = self.unpack("<I", start)
        if start + 4 + count * item > len(self.buf):
            raise self.fail(f"a vector of {count} items runs past the end")
        return start + 4, count


def _parameter(r: _Reader, table: int) -> tuple[str, np.ndarray]:
    name_at, dims_at, type_at, raw_at = r.fields(table)
    start, length = r.vector(name_at, 1)
    name = bytes(r.buf[start:start + length]).decode("utf-8", errors="replace")
    start, ndims = r.vector(dims_at, 8)
    if not ndims:
        raise r.fail(f"parameter {name!r} has no dims")
    dims = np.frombuffer(r.buf, "<i8", ndims, start).tolist()
    elem = r.int32(type_at)
    if elem not in _SUPPORTED:
        raise r.fail(f"parameter {name!r} has data_type {elem}, not one of the LoRA "
                     f"parameter types {sorted(_SUPPORTED)}")
    dtype = numpy_dtype(elem)
    start, nbytes = r.vector(raw_at, 1)
    if any(d < 0 for d in dims) or int(np.prod(dims)) * dtype.itemsize != nbytes:
        raise r.fail(f"parameter {name!r}: dims {dims} of {dtype} do not take its "
                     f"{nbytes} bytes")
    return name, np.frombuffer(r.buf, dtype, nbytes // dtype.itemsize, start).reshape(dims)


def decode_adapter(data: bytes | bytearray, what: str = "adapter"
                   ) -> tuple[int, int, int, dict[str, np.ndarray]]:
    """(format_version, adapter_version, model_version, {name: array}) of adapter bytes;
    the arrays view `data` (pass a bytearray for writable ones)."""
    r = _Reader(bytearray(data) if isinstance(data, bytes) else data, what)
    if len(r.buf) < 8 or bytes(r.buf[4:8]) != _IDENTIFIER:
        raise r.fail("it lacks the file identifier 'TORT'")
    fmt_at, adapter_at, model_at, params_at = r.fields(r.deref(0))
    versions = r.int32(fmt_at), r.int32(adapter_at), r.int32(model_at)
    if versions[0] != FORMAT_VERSION:
        raise r.fail(f"format_version {versions[0]}, onnxkiln reads {FORMAT_VERSION}")
    start, count = r.vector(params_at, 4)
    params = dict(_parameter(r, r.deref(start + 4 * i)) for i in range(count))
    return (*versions, params)


def _read_file(path: Any, what: str) -> tuple[int, int, int, dict[str, np.ndarray]]:
    try:
        with open(os.fspath(path), "rb") as f:
            data = bytearray(f.read())
    except OSError as e:
        raise ModelLoadError(f"{what}: cannot read {path!r}: {e.strerror or e}") from e
    return decode_adapter(data, f"{what} {os.fspath(path)!r}")


def _check_version(value: Any, what: str) -> int:
    if not isinstance(value, int | np.integer) or not -2**31 <= int(value) < 2**31:
        raise InvalidInputError(f"AdapterFormat.{what} takes an int32, got {value!r}")
    return int(value)


@ort_errors_class
class AdapterFormat:
    """An `.onnx_adapter` file's contents, as onnxruntime's AdapterFormat: versions and
    named parameters (numeric OrtValues); `export_adapter` writes a file onnxruntime
    reads, `read_adapter` reads one onnxruntime wrote.

    Example:
        >>> fmt = AdapterFormat()
        >>> fmt.set_adapter_version(1); fmt.set_model_version(1)
        >>> fmt.set_parameters({"lora_A": OrtValue.ortvalue_from_numpy(a)})
        >>> fmt.export_adapter("my.onnx_adapter")
    """

    def __init__(self) -> None:
        self._format_version = 0
        self._adapter_version = 0
        self._model_version = 0
        self._params: dict[str, np.ndarray] = {}

    @staticmethod
    def read_adapter(file_path: Any) -> AdapterFormat:
        """The contents of an `.onnx_adapter` file."""
        fmt, adapter, model, params = _read_file(file_path, "AdapterFormat.read_adapter")
        result = AdapterFormat()
        result._format_version, result._adapter_version = fmt, adapter
        result._model_version, result._params = model, params
        return result

    def export_adapter(self, file_path: Any) -> None:
        """Write the versions and parameters as an `.onnx_adapter` file."""
        data = encode_adapter(self._adapter_version, self._model_version, self._params)
        try:
            with open(os.fspath(file_path), "wb") as f:
                f.write(data)
        except OSError as e:
            raise InvalidInputError(f"AdapterFormat.export_adapter: cannot write "
                                    f"{file_path!r}: {e.strerror or e}") from e

    def get_format_version(self) -> int:
        """The file's format version (0 until read from a file)."""
        return self._format_version

    def get_adapter_version(self) -> int:
        return self._adapter_version

    def set_adapter_version(self, adapter_version: int) -> None:
        self._adapter_version = _check_version(adapter_version, "set_adapter_version")

    def get_model_version(self) -> int:
        return self._model_version

    def set_model_version(self, model_version: int) -> None:
        self._model_version = _check_version(model_version, "set_model_version")

    def get_parameters(self) -> dict[str, OrtValue]:
        """name -> OrtValue (sharing this object's memory)."""
        return {name: OrtValue(array) for name, array in self._params.items()}

    def set_parameters(self, params: Mapping[str, Any]) -> None:
        """Replace the parameters: name -> OrtValue (or array) of a numeric tensor."""
        if not isinstance(params, Mapping):
            raise InvalidInputError("AdapterFormat.set_parameters takes a dict {name: "
                                    f"OrtValue}}, got {type(params).__name__}")
        self._params = {str(name): _numeric(name, value) for name, value in params.items()}


def _numeric(name: Any, value: Any) -> np.ndarray:
    array = value.value if isinstance(value, OrtValue) else value
    if not isinstance(array, np.ndarray):
        raise InvalidInputError(f"adapter parameter {name!r} must be a tensor OrtValue, got "
                                f"{type(array).__name__}")
    try:
        elem = int(from_numpy(array.dtype))
    except (KeyError, ValueError, TypeError):
        elem = 0
    if elem not in _SUPPORTED:
        raise InvalidInputError(
            f"adapter parameter {name!r}: LoRA parameters are numeric tensors of "
            f"{', '.join(_SUPPORTED.values())} (what onnxruntime reads), got {array.dtype}")
    if array.ndim == 0:
        raise InvalidInputError(f"adapter parameter {name!r}: onnxruntime reads no 0-d "
                                "parameters; give it shape [1]")
    return array


@ort_errors_class
class LoraAdapter:
    """A loaded adapter for `RunOptions.add_active_adapter`, as onnxruntime's LoraAdapter
    (`Load(path)`; the file is read into memory once)."""

    def __init__(self) -> None:
        self._params: dict[str, np.ndarray] = {}

    def Load(self, adapter_file_path: str) -> None:
        """Read an `.onnx_adapter` file; its parameters replace any loaded before."""
        self._params = _read_file(adapter_file_path, "LoraAdapter.Load")[3]

    @property
    def parameters(self) -> dict[str, np.ndarray]:
        """name -> array of the loaded parameters (onnxkiln extension)."""
        return dict(self._params)


def adapter_feeds(feed: Mapping[str, Any], adapters: list[LoraAdapter]) -> Mapping[str, Any]:
    """`feed` with every active adapter's parameters fed by name (adapters win)."""
    if not adapters:
        return feed
    merged = dict(feed)
    for adapter in adapters:
        merged.update(adapter._params)
    return merged
