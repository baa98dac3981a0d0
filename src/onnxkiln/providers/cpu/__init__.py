"""The CPU execution provider: numpy kernels, one module per op family."""

from __future__ import annotations

from onnxkiln.providers.cpu import linalg, math, nn, reduce, tensor  # noqa: F401  (register)
from onnxkiln.providers.cpu.registry import REGISTRY

__all__ = ["REGISTRY"]
