"""Every TensorProto of a model, checked before any of its data is read or mapped.

- `model_tensors(proto)`: each TensorProto wherever ONNX lets one sit (initializers, node
  attributes, model-local functions and their default attribute values, the values and
  indices of sparse tensors, subgraphs, training graphs), with words saying where.
- `check_tensor(tensor, where, base, source)`: the dims are counts, the data holds exactly
  what the dims and type declare, and external data is a regular file inside the model's
  folder `base` that holds those bytes (symlinks resolved first).
- `densify_sparse(proto, base, source)`: sparse initializers and `Constant(sparse_value)`
  become the dense tensors onnxruntime makes of them.
- `bind_external(model, base, source)`: onnx_ir's external tensors read from `base`.
- `embedded_size_problem(proto)`: what is wrong with a tensor's raw_data length, if anything.
"""

from __future__ import annotations

import functools
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PureWindowsPath

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from onnxkiln.errors import ModelLoadError

__all__ = ["MAX_DENSE_BYTES", "OutsideFolderError", "Where", "bind_external", "check_tensor",
           "densify_sparse", "embedded_size_problem", "file_in_folder", "model_tensors"]

# The dense form of a sparse tensor: at most what a tensor embedded in a protobuf can hold.
MAX_DENSE_BYTES = 2 << 30
_MAX_PATH = 4096  # bytes in a location (Linux PATH_MAX)
_MAX_NAME = 255  # bytes in one of its components (NAME_MAX)
_TENSOR = onnx.TensorProto.DESCRIPTOR.full_name
# The typed field onnx_ir reads a tensor's values from (the first that is not empty), and
# the types it may hold; sub-byte types pack their values into bytes, complex ones in pairs.
_FIELD_TYPES = {
    "int32_data": frozenset(t for t in ir.DataType if t.name not in (
        "UNDEFINED", "STRING", "FLOAT", "DOUBLE", "INT64", "UINT32", "UINT64", "COMPLEX64",
        "COMPLEX128")),
    "int64_data": frozenset({ir.DataType.INT64}),
    "uint64_data": frozenset({ir.DataType.UINT64, ir.DataType.UINT32}),
    "float_data": frozenset({ir.DataType.FLOAT, ir.DataType.COMPLEX64}),
    "double_data": frozenset({ir.DataType.DOUBLE, ir.DataType.COMPLEX128}),
}
_COMPLEX = frozenset({ir.DataType.COMPLEX64, ir.DataType.COMPLEX128})

# A message, the field of its parent it was reached through, and that parent's place.
_Place = tuple[Message, str, "_Place | None"]


class _Refused(Exception):
    """What is wrong with one tensor; check_tensor adds where it sits."""


class Where:
    """Where a tensor sits, put into words only when printed (most never are)."""

    __slots__ = ("_place",)

    def __init__(self, place: _Place) -> None:
        self._place = place

    def __str__(self) -> str:
        return _describe(self._place)


def model_tensors(proto: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, Where]]:
    """(tensor, where it sits) for every TensorProto in the model, found by walking every
    message field that can lead to one (iteratively: nesting costs no stack)."""
    pending: list[_Place] = [(proto, "", None)]
    while pending:
        place = pending.pop()
        msg = place[0]
        if msg.DESCRIPTOR.full_name == _TENSOR:
            yield msg, Where(place)
            continue
        for name, repeated in _tensor_fields(msg.DESCRIPTOR):
            if repeated:
                pending.extend((m, name, place) for m in getattr(msg, name))
            elif msg.HasField(name):
                pending.append((getattr(msg, name), name, place))


@functools.cache
def _tensor_fields(descriptor: Descriptor) -> tuple[tuple[str, bool], ...]:
    """(name, repeated) of the message fields through which a TensorProto can be reached."""
    return tuple((f.name, _is_repeated(f)) for f in descriptor.fields
                 if f.type == FieldDescriptor.TYPE_MESSAGE and _reaches_tensor(f.message_type))


def _reaches_tensor(descriptor: Descriptor) -> bool:
    seen: set[str] = set()
    pending = [descriptor]
    while pending:
        d = pending.pop()
        if d.full_name == _TENSOR:
            return True
        if d.full_name not in seen:
            seen.add(d.full_name)
            pending.extend(f.message_type for f in d.fields
                           if f.type == FieldDescriptor.TYPE_MESSAGE)
    return False


def _is_repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 6; `label` went away in 7
    return bool(flag) if flag is not None else field.label == field.LABEL_REPEATED


def _describe(place: _Place | None) -> str:
    """E.g. "default of attribute 'w' of function 'local::F'"."""
    parts = []
    while place is not None:
        msg, field, place = place
        part = _part(msg, field)
        if part:
            parts.append(part)
    return " of ".join(parts)


def _part(msg: Message, field: str) -> str:
    kind = msg.DESCRIPTOR.name
    if kind == "TensorProto":
        role = field if field in ("initializer", "values", "indices") else "tensor"
        return f"{role} '{msg.name}'" if msg.name else role
    if kind == "SparseTensorProto":
        return "sparse initializer" if field == "sparse_initializer" else "sparse tensor"
    if kind == "AttributeProto":
        return (f"default of attribute '{msg.name}'" if field == "attribute_proto"
                else f"attribute '{msg.name}'")
    if kind == "NodeProto":
        return f"node '{msg.name or '<unnamed>'}' ({msg.domain or 'ai.onnx'}::{msg.op_type})"
    if kind == "GraphProto":
        return f"graph '{msg.name}'"
    if kind == "FunctionProto":
        return f"function '{msg.domain}::{msg.name}'"
    if kind == "TrainingInfoProto":
        return "training info"
    return ""


def check_tensor(tensor: onnx.TensorProto, where: Where | str, base: Path | None,
                 source: str) -> None:
    """Refuse, with a ModelLoadError naming `where`, a tensor whose data is not what it
    declares or whose external data is not a file inside `base` holding it."""
    try:
        dims = list(tensor.dims)
        if any(d < 0 for d in dims):  # numpy would read one negative dim as "infer"
            raise _Refused(f"has negative dims {dims}")
        dtype = _dtype(tensor)
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _check_external(tensor, dtype, base)
        else:
            _check_embedded(tensor, dtype)
    except _Refused as e:
        raise ModelLoadError(f"{source}: {where} {e}") from None


def _dtype(tensor: onnx.TensorProto) -> ir.DataType:
    try:
        dtype = ir.DataType(tensor.data_type)
    except ValueError:
        raise _Refused(f"has unknown data type {tensor.data_type}") from None
    if dtype == ir.DataType.UNDEFINED:
        raise _Refused("has no data type (UNDEFINED)")
    return dtype


def _nbytes(dtype: ir.DataType, dims: list[int]) -> int:
    return (math.prod(dims) * dtype.bitwidth + 7) // 8


def _check_embedded(tensor: onnx.TensorProto, dtype: ir.DataType) -> None:
    dims = list(tensor.dims)
    count = math.prod(dims)
    if tensor.HasField("raw_data"):
        if dtype == ir.DataType.STRING:
            raise _Refused("keeps strings in raw_data; strings go in string_data")
        if dtype.bitwidth < 8:  # onnx_ir unpacks these to the dims' size, whatever it read
            problem = embedded_size_problem(tensor)
            if problem:
                raise _Refused(problem)
        return  # other types: the reader checks the length (reading it here copies it)
    if dtype == ir.DataType.STRING:
        field = "string_data"
    else:
        field = next((f for f in _FIELD_TYPES if len(getattr(tensor, f))), "")
    if not field or not len(getattr(tensor, field)):
        if count:
            raise _Refused(f"declares {count} elements (dims {dims}) but holds no data")
        return
    if field != "string_data" and dtype not in _FIELD_TYPES[field]:
        raise _Refused(f"holds its values in {field}, which cannot hold {dtype.name}")
    if dtype == ir.DataType.STRING or dtype.bitwidth >= 8:
        need = count * (2 if dtype in _COMPLEX else 1)
    else:
        need = _nbytes(dtype, dims)
    have = len(getattr(tensor, field))
    if have != need:
        raise _Refused(f"holds {have} values in {field}, but dims {dims} of {dtype.name} "
                       f"need {need}")


def embedded_size_problem(tensor: onnx.TensorProto) -> str:
    """Why a tensor's raw_data cannot hold its dims ("" when it can); reads raw_data."""
    dtype = ir.DataType(tensor.data_type)
    need = _nbytes(dtype, list(tensor.dims))
    have = len(tensor.raw_data)
    if have == need:
        return ""
    return (f"has {have} bytes of raw data, but dims {list(tensor.dims)} of {dtype.name} "
            f"need {need}")


def _check_external(tensor: onnx.TensorProto, dtype: ir.DataType, base: Path | None) -> None:
    info = {e.key: e.value for e in tensor.external_data}
    if len(info) != len(tensor.external_data):  # readers differ on which one wins
        keys = [e.key for e in tensor.external_data]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise _Refused(f"has external data with the key(s) {twice} given more than once")
    location = info.get("location", "")
    shown = repr(location) if len(location) <= 200 else f"{location[:200]!r}..."
    at = f"has external data at {shown}"
    if not location:
        raise _Refused("has external data but no location")
    if dtype == ir.DataType.STRING:
        raise _Refused(f"{at}, but strings cannot be stored as external data")
    if base is None:
        raise _Refused(
            f"{at}, but the model has no folder to read it from (it was given as bytes or in "
            "memory); pass external_data_dir= to load_bytes, or load the model by path")
    try:
        _, st = file_in_folder(location, base)
    except OutsideFolderError as e:
        raise _Refused(f"{at}{e}") from None
    offset, length = _count(info, "offset", at), _count(info, "length", at)
    need = _nbytes(dtype, list(tensor.dims))
    if length is not None and length != need:
        raise _Refused(f"{at} with length {length}, but dims {list(tensor.dims)} of "
                       f"{dtype.name} take {need} bytes")
    if (offset or 0) + need > st.st_size:
        raise _Refused(f"{at}: needs bytes up to {(offset or 0) + need} but the file has "
                       f"{st.st_size} (truncated data?)")


class OutsideFolderError(ValueError):
    """A file name that does not lead to a regular file inside the model's folder; the
    message continues "<what> names '<location>'"."""


def file_in_folder(location: str, base: Path) -> tuple[Path, os.stat_result]:
    """The regular file that `location` (relative, as a model writes it) names inside the
    folder `base`, and its stat: no NUL, no over-long name, no absolute path, drive or '..',
    no symlink leading out, no FIFO or folder."""
    if "\0" in location:
        raise OutsideFolderError(", which contains a NUL byte; refused")
    parts = location.replace("\\", "/").split("/")
    if (len(location.encode("utf-8", "surrogatepass")) > _MAX_PATH
            or any(len(p.encode("utf-8", "surrogatepass")) > _MAX_NAME for p in parts)):
        raise OutsideFolderError(f", which is longer than a file path can be ({len(location)} "
                                 "characters); refused")
    loc = Path(location)
    windows = PureWindowsPath(location)
    if loc.is_absolute() or windows.drive or windows.is_absolute() or ".." in parts:
        raise OutsideFolderError(f", which escapes the model folder '{base}'; refused")
    base = Path(base).resolve()
    try:
        full = (base / loc).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise OutsideFolderError(f", which cannot be resolved: {e}") from None
    if not full.is_relative_to(base):
        raise OutsideFolderError(
            f", which resolves to '{full}' outside the model folder '{base}'; refused")
    try:
        st = os.stat(full)
    except FileNotFoundError:
        raise OutsideFolderError(f": file '{full}' is missing") from None
    except OSError as e:
        raise OutsideFolderError(f": file '{full}' cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutsideFolderError(f": '{full}' is not a regular file")
    return full, st


def _count(info: dict[str, str], key: str, at: str) -> int | None:
    text = info.get(key)
    if text is None or text == "":
        return None
    if not (text.isascii() and text.isdecimal()):
        raise _Refused(f"{at} with {key} {text[:40]!r}, which is not a byte count")
    return int(text)


def densify_sparse(proto: onnx.ModelProto, base: Path | None, source: str) -> None:
    """Replace sparse initializers by dense ones and `Constant(sparse_value=...)` by
    `Constant(value=...)`, in every graph; refuse sparse attributes anywhere else. The
    tensors must have passed `check_tensor`."""
    graphs: list[onnx.GraphProto] = [proto.graph]
    nodes: list[onnx.NodeProto] = [n for f in proto.functions for n in f.node]
    for func in proto.functions:
        for a in func.attribute_proto:
            if a.HasField("sparse_tensor") or len(a.sparse_tensors):
                raise ModelLoadError(
                    f"{source}: default of attribute '{a.name}' of function "
                    f"'{func.domain}::{func.name}' is a sparse tensor, which onnxkiln reads "
                    "only as Constant's sparse_value")
    while graphs or nodes:
        if graphs:
            graph = graphs.pop()
            for sparse in graph.sparse_initializer:
                where = f"sparse initializer '{sparse.values.name}' of graph '{graph.name}'"
                graph.initializer.append(
                    onnx.numpy_helper.from_array(_dense(sparse, base, source, where),
                                                 sparse.values.name))
            del graph.sparse_initializer[:]
            nodes.extend(graph.node)
            continue
        node = nodes.pop()
        for a in node.attribute:
            if a.HasField("g"):
                graphs.append(a.g)
            graphs.extend(a.graphs)
        _densify_constant(node, base, source)


def _densify_constant(node: onnx.NodeProto, base: Path | None, source: str) -> None:
    sparse_types = (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS)
    for i, a in enumerate(node.attribute):
        if not (a.HasField("sparse_tensor") or len(a.sparse_tensors) or a.type in sparse_types):
            continue
        label = f"node '{node.name or '<unnamed>'}' ({node.domain or 'ai.onnx'}::{node.op_type})"
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or (
                a.name != "sparse_value") or not a.HasField("sparse_tensor"):
            raise ModelLoadError(
                f"{source}: attribute '{a.name}' of {label} is a sparse tensor, which onnxkiln "
                "reads only as Constant's sparse_value")
        dense = _dense(a.sparse_tensor, base, source, f"attribute 'sparse_value' of {label}")
        node.attribute[i].CopyFrom(onnx.helper.make_attribute(
            "value", onnx.numpy_helper.from_array(dense, a.sparse_tensor.values.name)))


def _dense(sparse: onnx.SparseTensorProto, base: Path | None, source: str,
           where: str) -> np.ndarray:
    """The dense array of a sparse tensor whose values and indices passed check_tensor."""
    def refuse(problem: str) -> ModelLoadError:
        return ModelLoadError(f"{source}: {where} {problem}")

    dims = list(sparse.dims)
    if any(d < 0 for d in dims):
        raise refuse(f"has negative dims {dims}")
    if not sparse.HasField("values"):
        raise refuse("has no values")
    values = _array(sparse.values, base)
    if values.ndim != 1:
        raise refuse(f"has values of shape {list(values.shape)}; they must be 1-D")
    size = math.prod(dims)
    if size * values.itemsize > MAX_DENSE_BYTES:
        raise refuse(f"would be {size * values.itemsize} bytes dense (dims {dims}); at most "
                     f"{MAX_DENSE_BYTES} are allowed")
    nnz = values.shape[0]
    indices = (_array(sparse.indices, base) if sparse.HasField("indices")
               else np.zeros((0,), np.int64))
    if indices.dtype != np.int64:
        raise refuse(f"has indices of type {indices.dtype}; they must be int64")
    if indices.shape == (nnz, len(dims)) and len(dims) > 1:
        if nnz and ((indices < 0).any() or (indices >= np.array(dims)).any()):
            raise refuse(f"has an index outside its dims {dims}")
        flat = np.ravel_multi_index(tuple(indices.T), dims) if nnz else indices.reshape(0)
    elif indices.shape == (nnz,) or indices.shape == (nnz, 1):
        flat = indices.reshape(-1)
        if nnz and (flat.min() < 0 or flat.max() >= size):
            raise refuse(f"has an index outside its {size} elements")
    else:
        raise refuse(f"has indices of shape {list(indices.shape)} for {nnz} values of dims "
                     f"{dims}; they must be [{nnz}] or [{nnz}, {len(dims)}]")
    if values.dtype == object:
        dense = np.full(size, b"", dtype=object)
    else:
        dense = np.zeros(size, dtype=values.dtype)
    dense[flat] = values
    return dense.reshape(dims)


def _array(tensor: onnx.TensorProto, base: Path | None) -> np.ndarray:
    array = ir.serde.deserialize_tensor(tensor, base or "").numpy()
    return np.array(array)  # a copy: nothing keeps the file mapped


def bind_external(model: ir.Model, base: Path | None, source: str) -> None:
    """Point every external tensor of `model` at the folder `base`, checking once more
    that the file it will map lies inside it."""
    graphs = [*model.graphs()]
    attributes = []
    for func in model.functions.values():
        graphs.extend([func.graph, *func.graph.subgraphs()])
        attributes.extend(func.attributes.values())
    tensors = []
    for graph in graphs:
        tensors.extend(v.const_value for v in graph.initializers.values())
        attributes.extend(a for node in graph for a in node.attributes.values())
    for a in attributes:
        if a.is_ref() or a.value is None:
            continue
        if a.type == ir.AttributeType.TENSOR:
            tensors.append(a.value)
        elif a.type == ir.AttributeType.TENSORS:
            tensors.extend(a.value)
    for tensor in tensors:
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        if base is None:
            raise ModelLoadError(f"{source}: tensor '{tensor.name}' has external data but "
                                 "the model has no folder to read it from")
        tensor.base_dir = base
        if not Path(tensor.path).resolve().is_relative_to(base):
            raise ModelLoadError(
                f"{source}: tensor '{tensor.name}' has external data at "
                f"'{tensor.location}', outside the model folder '{base}'; refused")
