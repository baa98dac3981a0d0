"""Small helpers of the CPU kernels: constant inputs and integer operands (attribute and axis
parsing is onnxkiln.ops.attrs)."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxkiln.providers.base import NodeInfo

__all__ = ["const_input", "to_ints"]


def const_input(info: NodeInfo, i: int) -> np.ndarray | None:
    """Input i's value when it is a constant known at plan time, else None."""
    consts = info.const_inputs
    return consts[i] if i < len(consts) else None


def to_ints(value: Any) -> tuple[int, ...]:
    """A 0-d/1-d integer array (or a sequence of ints) as a tuple of Python ints."""
    if isinstance(value, np.ndarray):
        return tuple(value.reshape(-1).tolist())
    return tuple(int(v) for v in value)
