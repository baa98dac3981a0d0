"""onnxruntime's SparseTensor and OrtSparseFormat: a sparse tensor in host memory, in COO
or CSR(C) layout, as onnxruntime's Python API builds and reads it.

The numeric buffers are the caller's arrays (no copy when they are contiguous and of the
right dtype) and come back as read-only views; string values are copied, as onnxruntime
copies them. onnxkiln runs no sparse kernels: a SparseTensor fed to a session is refused
as onnxruntime refuses it for a dense input, and no session returns one.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnxkiln.compat._errors import NotImplemented as OrtNotImplemented
from onnxkiln.compat._errors import ort_errors_class
from onnxkiln.dtypes import from_numpy
from onnxkiln.errors import InvalidInputError

__all__ = ["OrtSparseFormat", "SparseTensor", "refuse_sparse_feeds"]


class OrtSparseFormat(enum.IntEnum):
    """onnxruntime's sparse layouts (its enum values)."""

    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4


def _readonly(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class _CooView:
    """`SparseTensor.as_coo_view()`: the COO indices (linear, or (nnz, 2) coordinates)."""

    def __init__(self, indices: np.ndarray) -> None:
        self._indices = indices

    def indices(self) -> np.ndarray:
        """The indices as a read-only int64 array."""
        return _readonly(self._indices)


class _CsrView:
    """`SparseTensor.as_csrc_view()`: the CSR inner (column) and outer (row start) indices."""

    def __init__(self, inner: np.ndarray, outer: np.ndarray) -> None:
        self._inner, self._outer = inner, outer

    def inner(self) -> np.ndarray:
        """The column index of each value, read-only int64."""
        return _readonly(self._inner)

    def outer(self) -> np.ndarray:
        """Where each row's values start (rows + 1 entries), read-only int64."""
        return _readonly(self._outer)


def _shape(dense_shape: Any) -> list[int]:
    dims = np.asarray(dense_shape)
    if dims.ndim != 1 or (dims.size and dims.dtype.kind not in "iu") or np.any(dims < 0):
        raise InvalidInputError(
            f"SparseTensor: dense_shape must be a 1-D list of sizes >= 0, got {dense_shape!r}")
    return [int(d) for d in dims]


def _values(values: Any) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise InvalidInputError(
            f"SparseTensor: values must be a 1-D array, got {array.ndim} dims")
    if array.dtype.kind in "USO":  # strings are copied, as onnxruntime copies them
        return np.array([str(v) for v in array], dtype=object)
    try:
        from_numpy(array.dtype)
    except (KeyError, ValueError, TypeError) as e:
        raise InvalidInputError(f"SparseTensor: values of dtype {array.dtype} have no ONNX "
                                "element type") from e
    return np.ascontiguousarray(array)


def _indices(indices: Any, what: str) -> np.ndarray:
    array = np.asarray(indices)
    if array.size and array.dtype.kind not in "iu":
        raise InvalidInputError(f"SparseTensor: {what} must be integers, got {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.int64)


def _check_device(ort_device: Any, what: str) -> None:
    device_type = getattr(ort_device, "device_type", None)
    if device_type is None:
        raise InvalidInputError(f"{what}: ort_device must be an OrtDevice, got "
                                f"{type(ort_device).__name__}")
    if device_type() != 0:
        raise OrtNotImplemented(
            f"{what}: not supported by onnxkiln for device type {device_type()}; "
            "onnxkiln.compat keeps sparse tensors in host memory (OrtDevice.make('cpu', 0))")


def _check_range(indices: np.ndarray, bound: int, what: str) -> None:
    if indices.size and (indices.min() < 0 or indices.max() >= bound):
        raise InvalidInputError(
            f"SparseTensor: {what} must lie in [0, {bound}), got [{indices.min()}, "
            f"{indices.max()}]")


@ort_errors_class
class SparseTensor:
    """A sparse tensor in host memory, built with `sparse_coo_from_numpy` or
    `sparse_csr_from_numpy` (onnxruntime's constructors) and read with `values()`,
    `as_coo_view()`, `as_csrc_view()`. Indices are checked against the dense shape here
    (onnxruntime does not check them).

    Example:
        >>> st = SparseTensor.sparse_coo_from_numpy([9, 9], np.float32([1, 2]),
        ...                                         np.int64([3, 15]), OrtDevice.make("cpu", 0))
        >>> st.format(), st.data_type(), st.as_coo_view().indices()
        (<OrtSparseFormat.ORT_SPARSE_COO: 1>, 'sparse_tensor(float)', array([ 3, 15]))
    """

    __slots__ = ("_format", "_indices", "_shape", "_values")

    def __init__(self, fmt: OrtSparseFormat, shape: list[int], values: np.ndarray,
                 indices: tuple[np.ndarray, ...]) -> None:
        self._format, self._shape, self._values, self._indices = fmt, shape, values, indices

    @classmethod
    def sparse_coo_from_numpy(cls, dense_shape: Any, values: Any, coo_indices: Any,
                              ort_device: Any) -> SparseTensor:
        """A COO tensor: `coo_indices` holds one linear index per value, or (row, column)
        pairs of a 2-D tensor (shape (nnz, 2), or flat with 2 * nnz entries)."""
        _check_device(ort_device, "SparseTensor.sparse_coo_from_numpy")
        shape, vals = _shape(dense_shape), _values(values)
        indices, nnz = _indices(coo_indices, "coo_indices"), len(vals)
        if indices.size == nnz and indices.ndim == 1:
            _check_range(indices, int(np.prod(shape)), "linear COO indices")
        elif indices.size == 2 * nnz and indices.ndim in (1, 2) and nnz:
            if len(shape) != 2:
                raise InvalidInputError("SparseTensor: (row, column) COO indices need a 2-D "
                                        f"dense_shape, got {shape}")
            indices = indices.reshape(nnz, 2)
            _check_range(indices[:, 0], shape[0], "COO row indices")
            _check_range(indices[:, 1], shape[1], "COO column indices")
        else:
            raise InvalidInputError(
                f"SparseTensor: coo_indices has {indices.size} entries; it must hold one "
                f"per value ({nnz}) or two per value ({2 * nnz})")
        return cls(OrtSparseFormat.ORT_SPARSE_COO, shape, vals, (indices,))

    @classmethod
    def sparse_csr_from_numpy(cls, dense_shape: Any, values: Any, inner_indices: Any,
                              outer_indices: Any, ort_device: Any) -> SparseTensor:
        """A CSR tensor of a 2-D shape: `inner_indices` the column of each value,
        `outer_indices` where each row starts (rows + 1 entries; none when empty)."""
        _check_device(ort_device, "SparseTensor.sparse_csr_from_numpy")
        shape, vals = _shape(dense_shape), _values(values)
        inner = _indices(inner_indices, "inner_indices")
        outer = _indices(outer_indices, "outer_indices")
        if len(shape) != 2:
            raise InvalidInputError(f"SparseTensor: CSR needs a 2-D dense_shape, got {shape}")
        if inner.ndim != 1 or outer.ndim != 1 or inner.size != len(vals):
            raise InvalidInputError(
                f"SparseTensor: inner_indices must be 1-D with one entry per value "
                f"({len(vals)}), got shape {inner.shape}")
        if outer.size != shape[0] + 1 and not (outer.size == 0 and len(vals) == 0):
            raise InvalidInputError(
                f"SparseTensor: outer_indices must hold rows + 1 = {shape[0] + 1} entries, "
                f"got {outer.size}")
        if outer.size and (outer[0] != 0 or outer[-1] != len(vals) or np.any(np.diff(outer) < 0)):
            raise InvalidInputError(
                f"SparseTensor: outer_indices must rise from 0 to the value count "
                f"{len(vals)}, got {outer.tolist()}")
        _check_range(inner, shape[1], "CSR inner (column) indices")
        return cls(OrtSparseFormat.ORT_SPARSE_CSRC, shape, vals, (inner, outer))

    def values(self) -> np.ndarray:
        """The non-zero values, read-only (strings: an object array of str)."""
        return _readonly(self._values)

    def _view_error(self, wanted: str) -> InvalidInputError:
        return InvalidInputError(f"This sparse tensor does not contain {wanted} format "
                                 f"(it holds {self._format.name})")

    def as_coo_view(self) -> _CooView:
        """The COO indices; raises unless the tensor is COO."""
        if self._format != OrtSparseFormat.ORT_SPARSE_COO:
            raise self._view_error("COO")
        return _CooView(self._indices[0])

    def as_csrc_view(self) -> _CsrView:
        """The CSR(C) inner and outer indices; raises unless the tensor is CSR."""
        if self._format != OrtSparseFormat.ORT_SPARSE_CSRC:
            raise self._view_error("CSR(C)")
        return _CsrView(*self._indices)

    def as_blocksparse_view(self) -> Any:
        """Raises: onnxruntime's Python API builds no block-sparse tensor, nor does this."""
        raise self._view_error("BlockSparse")

    def to_cuda(self, ort_device: Any) -> SparseTensor:
        """Refused: onnxkiln.compat keeps sparse tensors in host memory."""
        raise OrtNotImplemented(
            "SparseTensor.to_cuda: not supported by onnxkiln; onnxkiln.compat keeps sparse "
            "tensors in host memory (there is no CUDA copy of them)")

    def format(self) -> OrtSparseFormat:
        """The layout: ORT_SPARSE_COO or ORT_SPARSE_CSRC."""
        return self._format

    def dense_shape(self) -> list[int]:
        """The dims of the dense tensor this stands for."""
        return list(self._shape)

    def element_type(self) -> int:
        """The values' ONNX element type (1 = FLOAT, 8 = STRING, ...)."""
        return 8 if self._values.dtype.kind == "O" else int(from_numpy(self._values.dtype))

    def data_type(self) -> str:
        """onnxruntime's type string: "sparse_tensor(float)", "sparse_tensor(string)"..."""
        from onnxkiln.compat._values import elem_name

        return f"sparse_tensor({elem_name(self.element_type())})"

    def device_name(self) -> str:
        """Always "cpu"."""
        return "cpu"

    def to_dense(self) -> np.ndarray:
        """The dense array (onnxkiln extension; values at repeated indices are summed
        for numbers, the last one kept for strings)."""
        dense = np.zeros(int(np.prod(self._shape)), dtype=self._values.dtype)
        if self._values.dtype.kind == "O":
            dense[:] = ""
        if self._format == OrtSparseFormat.ORT_SPARSE_COO:
            index = self._indices[0]
            flat = index if index.ndim == 1 else index[:, 0] * self._shape[1] + index[:, 1]
        else:
            inner, outer = self._indices
            rows = np.repeat(np.arange(self._shape[0]), np.diff(outer)) if outer.size else inner
            flat = rows * self._shape[1] + inner
        if self._values.dtype.kind == "O":
            dense[flat] = self._values
        else:
            np.add.at(dense, flat, self._values)
        return dense.reshape(self._shape)

    def __repr__(self) -> str:
        return (f"SparseTensor({self.data_type()}, {self._format.name}, "
                f"dense_shape={self._shape}, nnz={len(self._values)})")


def refuse_sparse_feeds(feed: Mapping[str, Any], declared: Sequence[tuple[str, str]]) -> None:
    """Raise InvalidInputError for a SparseTensor fed to any input, as onnxruntime refuses
    one fed to a dense input; onnxkiln has no sparse kernels to take it."""
    types = dict(declared)
    for name, value in feed.items():
        if isinstance(value, SparseTensor):
            raise InvalidInputError(
                f"input with name: '{name}' expected to be of type {types.get(name, '?')} but "
                f"received a sparse tensor ({value.data_type()}); onnxkiln runs no sparse "
                "kernels: pass SparseTensor.to_dense() for a dense input")
