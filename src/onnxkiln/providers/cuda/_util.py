"""Small helpers shared by the torch kernels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from onnxkiln.providers.base import NodeInfo

_LOW = (torch.float16, torch.bfloat16)


def ints(a: Any) -> list[int]:
    """A host shape-like operand (numpy array, list, scalar) as a list of Python ints."""
    return [int(v) for v in np.asarray(a).reshape(-1)]


def axis_of(axis: int, rank: int, op: str) -> int:
    """`axis` normalised into [0, rank); ValueError when out of range."""
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < max(rank, 1):
        raise ValueError(f"{op}: axis {axis} out of range for rank {rank}")
    return ax


def axes_of(axes: Sequence[int], rank: int, op: str) -> list[int]:
    """Each axis normalised; ValueError on duplicates or out-of-range ones."""
    out = [axis_of(int(a), rank, op) for a in axes]
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: repeated axis in {list(axes)}")
    return out


def compute_dtype(dt: torch.dtype) -> torch.dtype:
    """float16/bfloat16 compute in float32; other dtypes as they are."""
    return torch.float32 if dt in _LOW else dt


def up(x: torch.Tensor) -> torch.Tensor:
    """x in its compute dtype (float32 for float16/bfloat16)."""
    return x.float() if x.dtype in _LOW else x


def attr_str(value: Any) -> str:
    """A string attribute as str (bytes decoded, None -> '')."""
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)


def wants(info: NodeInfo, i: int) -> bool:
    """Whether the node uses output i."""
    present = info.output_present
    return bool(present[i]) if i < len(present) else i < info.n_outputs


def host_input(info: NodeInfo, i: int) -> np.ndarray | None:
    """The value of input i when it is a plan-time constant, else None."""
    if i < len(info.const_inputs):
        return info.const_inputs[i]
    return None
