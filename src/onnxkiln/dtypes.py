"""The one table between ONNX element types and numpy dtypes (ml_dtypes for small floats)."""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

__all__ = [
    "ALL",
    "BOOL",
    "FLOATS",
    "INTS",
    "NUMERIC",
    "SIGNED",
    "DataType",
    "from_numpy",
    "to_numpy",
]


class DataType(enum.IntEnum):
    """ONNX tensor element types, numbered as in `onnx.TensorProto.DataType`."""

    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26
    FLOAT6E2M3 = 27
    FLOAT6E3M2 = 28

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype that holds this type's elements."""
        return to_numpy(self)

    def __str__(self) -> str:
        return _SHORT_NAMES.get(self, self.name.lower())


_NUMPY: dict[DataType, np.dtype] = {
    DataType.FLOAT: np.dtype(np.float32),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.INT8: np.dtype(np.int8),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.STRING: np.dtype(object),
    DataType.BOOL: np.dtype(np.bool_),
    DataType.FLOAT16: np.dtype(np.float16),
    DataType.DOUBLE: np.dtype(np.float64),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.COMPLEX64: np.dtype(np.complex64),
    DataType.COMPLEX128: np.dtype(np.complex128),
    DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    DataType.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    DataType.FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DataType.FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DataType.FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DataType.UINT4: np.dtype(ml_dtypes.uint4),
    DataType.INT4: np.dtype(ml_dtypes.int4),
    DataType.FLOAT4E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
    DataType.FLOAT8E8M0: np.dtype(ml_dtypes.float8_e8m0fnu),
    DataType.UINT2: np.dtype(ml_dtypes.uint2),
    DataType.INT2: np.dtype(ml_dtypes.int2),
    DataType.FLOAT6E2M3: np.dtype(ml_dtypes.float6_e2m3fn),
    DataType.FLOAT6E3M2: np.dtype(ml_dtypes.float6_e3m2fn),
}
_FROM_NUMPY: dict[np.dtype, DataType] = {v: k for k, v in _NUMPY.items()}
_FROM_NUMPY[np.dtype("U")] = DataType.STRING
_SHORT_NAMES = {DataType.FLOAT: "float32", DataType.DOUBLE: "float64"}


def to_numpy(dtype: DataType | int) -> np.dtype:
    """numpy dtype for an ONNX element type; KeyError names the type if there is none."""
    try:
        return _NUMPY[DataType(dtype)]
    except (KeyError, ValueError):
        raise KeyError(f"ONNX element type {dtype!r} has no numpy equivalent") from None


def from_numpy(dtype: np.dtype | type) -> DataType:
    """ONNX element type for a numpy dtype (unicode and object arrays are STRING)."""
    dt = np.dtype(dtype)
    found = _FROM_NUMPY.get(dt)
    if found is not None:
        return found
    if dt.kind in "UO":
        return DataType.STRING
    raise KeyError(f"numpy dtype {dt} has no ONNX element type")


FLOATS = frozenset({DataType.FLOAT16, DataType.FLOAT, DataType.DOUBLE, DataType.BFLOAT16})
SIGNED = frozenset({DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64})
INTS = SIGNED | {DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64}
BOOL = frozenset({DataType.BOOL})
NUMERIC = FLOATS | INTS
ALL = frozenset(_NUMPY)
