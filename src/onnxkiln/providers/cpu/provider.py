"""The CPU execution provider: numpy arrays in host memory, the numpy kernel registry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import NodeInfo, registry_claims
from onnxkiln.providers.cpu.registry import REGISTRY
from onnxkiln.types import DeviceId, DeviceType

__all__ = ["CpuProvider"]


class CpuProvider:
    """Runs numpy kernels; host and device are the same memory, so copies are no-ops."""

    name = "cpu"
    on_host = True
    registry = REGISTRY
    device = DeviceId(DeviceType.CPU)

    def claims(self, info: NodeInfo) -> str | None:
        """None when a numpy kernel serves the node, else why not."""
        return registry_claims(self.registry, info)

    def to_device(self, value: Any) -> Any:
        """Host arrays stay as they are; other arrays (dlpack, torch) come to the host."""
        if value is None or isinstance(value, np.ndarray | list | dict):
            return value
        if hasattr(value, "__dlpack__") and not hasattr(value, "__array__"):
            return np.from_dlpack(value)
        return np.asarray(value)

    def to_host(self, value: Any) -> Any:
        """Already on the host."""
        return value

    def synchronize(self) -> None:
        """Numpy kernels finish before they return."""

    def empty(self, dtype: DataType, shape: Sequence[int]) -> np.ndarray:
        """A zeroed host buffer."""
        return np.zeros(tuple(shape), DataType(dtype).numpy)

    def allocation_counts(self) -> None:
        """Host allocations are not counted (numpy uses malloc)."""
        return None
