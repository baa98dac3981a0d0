"""OrtValue, NodeArg and ModelMetadata as onnxruntime's Python API shows them."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from onnxkiln.compat._errors import ort_errors_class
from onnxkiln.compat._sparse import SparseTensor
from onnxkiln.dtypes import DataType, from_numpy, to_numpy
from onnxkiln.errors import DeviceBindingError, InvalidInputError, SequenceOutputError

__all__ = [
    "ModelMetadata",
    "NodeArg",
    "OrtValue",
    "OrtValueVector",
    "check_cpu_device",
    "elem_name",
    "numpy_dtype",
    "owner_of",
    "type_string",
    "view_of",
]

# data_ptr() -> the live OrtValues whose tensor starts there (IOBinding.bind_input reads
# them back); several may share a buffer, so each pointer keeps a weak set
_BY_PTR: dict[int, weakref.WeakSet[OrtValue]] = {}
_PURGE_EVERY = 1024
_registered = 0
_ELEM_NAMES = {DataType.FLOAT: "float", DataType.DOUBLE: "double"}


def elem_name(elem_type: int) -> str:
    """onnxruntime's spelling of an element type: float, double, int64, float16, string..."""
    try:
        dt = DataType(elem_type)
    except ValueError:
        return str(elem_type)
    return _ELEM_NAMES.get(dt, dt.name.lower())


def type_string(t: onnx.TypeProto) -> str | None:
    """"tensor(float)", "seq(tensor(int64))", "map(string,tensor(float))", "optional(...)";
    None for an empty TypeProto."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({elem_name(t.tensor_type.elem_type)})"
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({elem_name(t.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({type_string(t.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_string(t.optional_type.elem_type)})"
    if kind == "map_type":
        key = elem_name(t.map_type.key_type)
        return f"map({key},{type_string(t.map_type.value_type)})"
    return None


def numpy_dtype(element_type: Any) -> np.dtype:
    """A numpy dtype from a numpy type/dtype or an ONNX element type int."""
    if isinstance(element_type, int | np.integer) and not isinstance(element_type, bool):
        try:
            return to_numpy(int(element_type))
        except KeyError as e:
            raise InvalidInputError(str(e.args[0])) from None
    try:
        return np.dtype(element_type)
    except TypeError as e:
        raise InvalidInputError(
            f"element_type must be a numpy type (np.float32) or an ONNX element type int, "
            f"got {element_type!r}"
        ) from e


def check_cpu_device(device_type: Any, device_id: Any, what: str) -> None:
    """Refuse anything but host memory: onnxkiln.compat values live on the CPU."""
    if not isinstance(device_type, str) or device_type.lower() != "cpu":
        raise DeviceBindingError(
            f"{what}: device_type {device_type!r} is not supported; onnxkiln.compat keeps "
            "OrtValues and bindings in host memory (device_type='cpu'), and CUDA sessions "
            "copy to the device themselves"
        )
    if not isinstance(device_id, int | np.integer) or device_id < 0:
        raise DeviceBindingError(f"{what}: device_id must be an int >= 0, got {device_id!r}")


@dataclass
class NodeArg:
    """A graph input or output as `get_inputs()` / `get_outputs()` describe it.

    `type` is onnxruntime's type string ("tensor(float)", "seq(tensor(float))",
    "map(string,tensor(float))"); `shape` lists dims as ints, symbolic names (str) or
    None for an unnamed unknown dim, and is [] when the rank is unknown or the value is
    not a tensor.

    Example:
        >>> sess.get_inputs()[0]
        NodeArg(name='x', type='tensor(float)', shape=['batch', 3])
    """

    name: str
    type: str
    shape: list[int | str | None] = field(default_factory=list)


@dataclass
class ModelMetadata:
    """What `get_modelmeta()` returns, with onnxruntime's attribute names.

    Example:
        >>> meta = sess.get_modelmeta()
        >>> meta.producer_name, meta.version, meta.custom_metadata_map
        ('skl2onnx', 0, {})
    """

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


@ort_errors_class
class OrtValue:
    """A value in host memory, as onnxruntime's OrtValue: a tensor (numpy array), a
    sequence (list), a map (dict) or an empty optional (None).

    `ortvalue_from_numpy` shares memory with the array (a non-contiguous array is copied
    first); `data_ptr()` of a live OrtValue is accepted by `IOBinding.bind_input` and
    `bind_output`. Only device_type "cpu" exists here.

    Example:
        >>> v = OrtValue.ortvalue_from_numpy(np.ones((2, 3), np.float32))
        >>> v.shape(), v.data_type(), v.device_name()
        ([2, 3], 'tensor(float)', 'cpu')
    """

    __slots__ = ("__weakref__", "_value")

    def __init__(self, value: Any) -> None:
        self._value = value
        if isinstance(value, np.ndarray):
            _register(self, _ptr(value))

    # construction ------------------------------------------------------------------
    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj: Any, device_type: str = "cpu", device_id: int = 0,
                            vendor_id: int = -1) -> OrtValue:
        """Wrap an array without copying it (a non-contiguous array is copied)."""
        check_cpu_device(device_type, device_id, "ortvalue_from_numpy")
        array = np.asarray(numpy_obj)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        return cls(array)

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(cls, data: np.ndarray, onnx_element_type: int
                                           ) -> OrtValue:
        """Reinterpret `data` (e.g. uint16 bits) as `onnx_element_type` (e.g. BFLOAT16)."""
        dtype = numpy_dtype(int(onnx_element_type))
        array = np.ascontiguousarray(data)
        if array.dtype != dtype:
            if array.dtype.itemsize != dtype.itemsize or dtype.kind == "O":
                raise InvalidInputError(
                    f"ortvalue_from_numpy_with_onnx_type: {array.dtype} data cannot hold "
                    f"{elem_name(int(onnx_element_type))} elements (item sizes "
                    f"{array.dtype.itemsize} vs {dtype.itemsize})"
                )
            array = array.view(dtype)
        return cls(array)

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape: Sequence[int], element_type: Any = None,
                                     device_type: str = "cpu", device_id: int = 0,
                                     vendor_id: int = -1) -> OrtValue:
        """A zero-filled tensor of `shape` and `element_type` (numpy type or ONNX int)."""
        check_cpu_device(device_type, device_id, "ortvalue_from_shape_and_type")
        if element_type is None:
            raise InvalidInputError("ortvalue_from_shape_and_type needs an element_type")
        dims = tuple(shape)
        if not all(isinstance(d, int | np.integer) and d >= 0 for d in dims):
            raise InvalidInputError(
                f"ortvalue_from_shape_and_type: shape must hold sizes >= 0, got {shape!r}")
        dtype = numpy_dtype(element_type)
        if dtype.kind == "O":
            return cls(np.full(dims, "", dtype=object))
        return cls(np.zeros(dims, dtype=dtype))

    @classmethod
    def from_dlpack(cls, data: Any) -> OrtValue:
        """Wrap a DLPack-capable host array, or a DLPack capsule (zero-copy)."""
        if not hasattr(data, "__dlpack__"):
            data = _Capsule(data)
        return cls(np.from_dlpack(data))

    @classmethod
    def ort_value_from_sparse_tensor(cls, sparse_tensor: SparseTensor) -> OrtValue:
        """Wrap a SparseTensor (no copy)."""
        if not isinstance(sparse_tensor, SparseTensor):
            raise InvalidInputError("ort_value_from_sparse_tensor takes a SparseTensor, got "
                                    f"{type(sparse_tensor).__name__}")
        return cls(sparse_tensor)

    def as_sparse_tensor(self) -> SparseTensor:
        """The SparseTensor held; raises for any other value."""
        if not isinstance(self._value, SparseTensor):
            raise SequenceOutputError(
                f"This OrtValue does not contain SparseTensor; it holds a {_kind(self._value)}")
        return self._value

    # inspection --------------------------------------------------------------------
    def _tensor(self, what: str) -> np.ndarray:
        if not isinstance(self._value, np.ndarray):
            raise SequenceOutputError(
                f"OrtValue.{what}() needs a tensor, but this OrtValue holds a "
                f"{_kind(self._value)}; read it with .value"
            )
        return self._value

    @property
    def value(self) -> Any:
        """The held value as is: array, list, dict or None (onnxkiln extension)."""
        return self._value

    def numpy(self) -> np.ndarray:
        """The tensor as a numpy array sharing this OrtValue's memory."""
        return self._tensor("numpy").view()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self._tensor("__array__")
        if dtype is not None and np.dtype(dtype) != array.dtype:
            return array.astype(dtype)
        return array.copy() if copy else array

    def __dlpack__(self, *, stream: Any = None) -> Any:
        return self._tensor("__dlpack__").__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._tensor("__dlpack_device__").__dlpack_device__()

    def shape(self) -> list[int]:
        """The tensor's dims (a sparse tensor's dense dims)."""
        if isinstance(self._value, SparseTensor):
            return self._value.dense_shape()
        return list(self._tensor("shape").shape)

    def data_type(self) -> str:
        """onnxruntime's type string: "tensor(float)", "seq(tensor(int64))", ..."""
        return _value_type(self._value)

    def element_type(self) -> int:
        """The tensor's ONNX element type (1 = FLOAT, 7 = INT64, ...)."""
        if isinstance(self._value, SparseTensor):
            return self._value.element_type()
        return int(from_numpy(self._tensor("element_type").dtype))

    def device_name(self) -> str:
        """Always "cpu"."""
        return "cpu"

    def data_ptr(self) -> int:
        """Address of the tensor's first byte (pass it to IOBinding.bind_input)."""
        return _ptr(self._tensor("data_ptr"))

    def tensor_size_in_bytes(self) -> int:
        """Bytes the tensor's elements take."""
        return int(self._tensor("tensor_size_in_bytes").nbytes)

    def is_tensor(self) -> bool:
        """True for a tensor."""
        return isinstance(self._value, np.ndarray)

    def is_sparse_tensor(self) -> bool:
        """True for a SparseTensor (see ort_value_from_sparse_tensor)."""
        return isinstance(self._value, SparseTensor)

    def is_tensor_sequence(self) -> bool:
        """True for a sequence (a list of tensors)."""
        return isinstance(self._value, list | tuple)

    def has_value(self) -> bool:
        """False for an empty optional."""
        return self._value is not None

    def update_inplace(self, data: Any) -> None:
        """Copy `data` (same element count and dtype) into this tensor's memory."""
        target = self._tensor("update_inplace")
        source = np.asarray(data.numpy() if isinstance(data, OrtValue) else data)
        if source.size != target.size or source.dtype != target.dtype:
            raise InvalidInputError(
                f"update_inplace: got {source.dtype} data with {source.size} elements, the "
                f"OrtValue holds {target.dtype} with {target.size}"
            )
        np.copyto(target, source.reshape(target.shape))

    def __repr__(self) -> str:
        if isinstance(self._value, np.ndarray):
            return f"OrtValue({self.data_type()}, shape={self.shape()}, cpu)"
        return f"OrtValue({_value_type(self._value)})"


class _Capsule:
    """A bare DLPack capsule (what `__dlpack__()` returned) as numpy's from_dlpack wants it:
    an object with `__dlpack__` and `__dlpack_device__` (host memory only)."""

    def __init__(self, capsule: Any) -> None:
        if type(capsule).__name__ != "PyCapsule":
            raise InvalidInputError(
                "OrtValue.from_dlpack takes an object with __dlpack__ or a DLPack capsule, "
                f"got {type(capsule).__name__}")
        self._capsule = capsule

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


@ort_errors_class
class OrtValueVector(list):
    """onnxruntime's vector of OrtValues: a list of `OrtValue` with its push_back,
    reserve, shrink_to_fit and element_type_at."""

    def push_back(self, value: OrtValue) -> None:
        if not isinstance(value, OrtValue):
            raise InvalidInputError(
                f"OrtValueVector.push_back takes an OrtValue, got {type(value).__name__}")
        self.append(value)

    def reserve(self, size: int) -> None:
        """Accepted; a Python list needs no reservation."""

    def shrink_to_fit(self) -> None:
        """Accepted; a Python list needs no shrinking."""

    def element_type_at(self, index: int) -> int:
        return self[index].element_type()


def _register(value: OrtValue, ptr: int) -> None:
    global _registered
    _BY_PTR.setdefault(ptr, weakref.WeakSet()).add(value)
    _registered += 1
    if _registered % _PURGE_EVERY == 0:
        for key in [k for k, live in _BY_PTR.items() if not live]:
            del _BY_PTR[key]


def owner_of(ptr: int) -> OrtValue | None:
    """The live OrtValue whose data_ptr() is `ptr` (the largest, if several), if any."""
    live = list(_BY_PTR.get(int(ptr), ()))
    if not live:
        _BY_PTR.pop(int(ptr), None)
        return None
    return max(live, key=lambda v: v._value.nbytes)


def view_of(owner: OrtValue, dtype: np.dtype, shape: Sequence[int], what: str) -> np.ndarray:
    """`owner`'s memory seen as `dtype[shape]` (it must fit in the owner's buffer)."""
    base = owner._tensor("data_ptr")
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise DeviceBindingError(f"{what}: shape {list(dims)} has a negative dim; a bound "
                                 "buffer needs its exact shape")
    if base.dtype == dtype and base.shape == dims:
        return base
    if dtype.kind == "O" or base.dtype.kind == "O":
        raise DeviceBindingError(
            f"{what}: string tensors cannot be reinterpreted; bind the OrtValue as it is "
            f"({base.dtype}[{list(base.shape)}])"
        )
    need = math.prod(dims) * dtype.itemsize
    if need > base.nbytes:
        raise DeviceBindingError(
            f"{what}: {elem_name(int(from_numpy(dtype)))}{list(dims)} needs {need} bytes, but "
            f"the buffer behind that pointer holds {base.nbytes}"
        )
    return base.reshape(-1).view(np.uint8)[:need].view(dtype).reshape(dims)


def _ptr(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def _kind(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return "empty optional" if value is None else type(value).__name__


def _value_type(value: Any) -> str:
    if isinstance(value, np.ndarray | np.generic):
        try:
            return f"tensor({elem_name(int(from_numpy(value.dtype)))})"
        except KeyError:
            return f"tensor({value.dtype})"
    if isinstance(value, list | tuple):
        inner = _value_type(value[0]) if value else "tensor(undefined)"
        return f"seq({inner})"
    if isinstance(value, dict):
        if not value:
            return "map(int64,tensor(float))"
        key = next(iter(value))
        key_name = "string" if isinstance(key, str) else "int64"
        return f"map({key_name},{_value_type(np.asarray(value[key]))})"
    if isinstance(value, SparseTensor):
        return value.data_type()
    return "optional(undefined)" if value is None else type(value).__name__


_MAP_KEYS = {"int64": "int64_t", "string": "string"}


def check_map_feed(name: str, declared: str, value: Any) -> None:
    """Refuses a dict fed to a map input as onnxruntime's feed conversion does (onnxkiln's
    kernels would otherwise read a float key 0.5 as 0, or a bytes key as text): the first
    key says the map's key type, which must be the input's; int64 maps take only integer
    keys; values must be real numbers (or 0-d numeric arrays) and become floats, so only
    maps of float values can be fed; an empty dict is refused."""
    if not isinstance(value, dict) or not declared.startswith("map("):
        return
    if not value:
        raise InvalidInputError(
            f"Size of dictionary is empty, unable to run the prediction (input '{name}').")
    key_type, value_type = declared[4:-1].split(",", 1)
    first = next(iter(value))
    if isinstance(first, bytes):
        raise InvalidInputError(
            f"Key type must be int or string (not {type(first)}) for input '{name}'.")
    given = "string" if isinstance(first, str) else "int64"
    if given != key_type:
        raise InvalidInputError(
            f"Unexpected input data type. Actual: ((map({given},{value_type}))) , expected: "
            f"(({declared})) for input '{name}'.")
    c_type = _MAP_KEYS.get(key_type, key_type)
    for key, item in value.items():
        if key_type == "int64" and not isinstance(key, int | np.integer):
            raise InvalidInputError(f"Unexpected key type  {type(key)}, it cannot be linked "
                                    f"to C type {c_type} for input '{name}'.")
        if not isinstance(item, int | float | np.integer | np.floating) and not (
                isinstance(item, np.ndarray) and item.ndim == 0 and item.dtype.kind in "biuf"):
            raise InvalidInputError(f"Unexpected value type  {type(item)}, it cannot be "
                                    f"linked to C type {c_type} for input '{name}'.")
    if value_type != "tensor(float)":  # onnxruntime makes every dict a map of floats
        raise InvalidInputError(
            f"Unexpected input data type. Actual: ((map({given},tensor(float)))) , expected: "
            f"(({declared})) for input '{name}': a dict feeds only maps of float values")
