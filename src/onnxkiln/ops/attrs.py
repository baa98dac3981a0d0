"""Attribute and axis parsing shared by every provider's kernels and the `ops` modules."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["attr_str", "attr_tensor", "decode_strings", "norm_axes", "norm_axis"]


def norm_axis(axis: int, rank: int, op: str, what: str = "axis") -> int:
    """`axis` in [-rank, rank-1] made non-negative; ValueError otherwise."""
    if -rank <= axis < rank:
        return axis + rank if axis < 0 else axis
    raise ValueError(f"{op}: {what} {axis} is out of range for a tensor of rank {rank}")


def norm_axes(axes: tuple[int, ...], rank: int, op: str) -> tuple[int, ...]:
    """Each axis normalised by `norm_axis`; repeated axes are a ValueError."""
    out = tuple(norm_axis(a, rank, op) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: axes {list(axes)} repeat an axis (rank {rank})")
    return out


def attr_str(value: Any) -> str | None:
    """A STRING attribute as str (attributes may arrive as bytes)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8")
    return value


def decode_strings(arr: np.ndarray) -> np.ndarray:
    """An array of bytes/str elements as an object array of str (onnxruntime's form)."""
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, s in enumerate(arr.reshape(-1).tolist()):
        flat[i] = s.decode("utf-8") if isinstance(s, (bytes, bytearray)) else str(s)
    return out


def attr_tensor(value: Any) -> np.ndarray:
    """A TENSOR attribute (numpy array, onnx_ir tensor or TensorProto) as a numpy array."""
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "numpy"):
        arr = np.asarray(value.numpy())
    else:  # an onnx.TensorProto
        from onnx import numpy_helper

        arr = numpy_helper.to_array(value)
    if arr.dtype.kind in "OSU":
        arr = decode_strings(arr)
    return arr
