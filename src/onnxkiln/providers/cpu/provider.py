"""The CPU execution provider: numpy arrays in host memory, the numpy kernel registry."""

from __future__ import annotations

from onnxkiln.providers.base import HostProvider
from onnxkiln.providers.cpu.registry import REGISTRY

__all__ = ["CpuProvider"]


class CpuProvider(HostProvider):
    """Runs numpy kernels; host and device are the same memory, so copies are no-ops."""

    name = "cpu"
    registry = REGISTRY
