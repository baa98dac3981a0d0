"""Constant and Range, for every provider: the constant's value from whichever attribute is
set, and Range's length and values (both depend only on host values, so a device provider
computes them on the host too and copies the result)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxkiln.ops.attrs import attr_str, attr_tensor

__all__ = ["constant_value", "range_length", "range_values"]

_CONSTANT_FORMS = (
    ("value_float", np.float32, False),
    ("value_floats", np.float32, True),
    ("value_int", np.int64, False),
    ("value_ints", np.int64, True),
    ("value_string", object, False),
    ("value_strings", object, True),
)


def constant_value(attrs: Mapping[str, Any], node: str) -> np.ndarray:
    """Constant's value from `value` or a `value_*` attribute (the loader has made a
    sparse_value dense), as a fresh numpy array; `node` names the node in the error."""
    if attrs.get("value") is not None:
        return attr_tensor(attrs["value"])
    for name, dtype, is_list in _CONSTANT_FORMS:
        v = attrs.get(name)
        if v is None:
            continue
        if dtype is object:
            v = [attr_str(s) for s in v] if is_list else attr_str(v)
            out = np.empty(len(v) if is_list else (), dtype=object)
            out[...] = v
            return out
        return np.array(list(v) if is_list else v, dtype=dtype)
    raise ValueError(f"{node}: Constant sets none of its value attributes")


def _scalar(a: np.ndarray, name: str):
    if a.size != 1:
        raise ValueError(f"Range: '{name}' must be a scalar, got shape {list(a.shape)}")
    return a.reshape(-1)[0]


def range_length(start, limit, delta, integer: bool) -> int:
    """Range's element count: ceil((limit - start) / delta), at least 0; exact in integers."""
    if delta == 0:
        raise ValueError("Range: delta must not be zero")
    if integer:
        s, lim, d = int(start), int(limit), int(delta)
        return max(-((s - lim) // d), 0)
    return max(math.ceil((float(limit) - float(start)) / float(delta)), 0)


def range_values(start: np.ndarray, limit: np.ndarray, delta: np.ndarray,
                 stash: int = 1) -> np.ndarray:
    """start, start + delta, ... below limit, in start's dtype, as onnxruntime computes them:
    integers exactly, floats accumulated one delta at a time (in float32 for float16 and
    bfloat16 when `stash`, Range-27's stash_type)."""
    dtype = start.dtype
    s, lim, d = _scalar(start, "start"), _scalar(limit, "limit"), _scalar(delta, "delta")
    integer = dtype.kind in "iu"
    n = range_length(s, lim, d, integer)
    if integer:
        out = np.arange(n, dtype=dtype)
        if d != 1:
            out *= dtype.type(d)
        if s:
            out += dtype.type(s)
        return out
    work = np.dtype(np.float32) if stash and dtype.itemsize < 4 else dtype
    out = np.full(n, d, dtype=work)
    if n:
        out[0] = s
        np.cumsum(out, out=out)
    return out if work == dtype else out.astype(dtype)
