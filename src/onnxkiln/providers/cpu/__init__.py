"""The CPU execution provider: numpy kernels, one module per op family."""

from __future__ import annotations

from onnxkiln.providers.cpu import (  # noqa: F401  (importing registers the kernels)
    activation,
    cast,
    control,
    conv,
    index,
    linalg,
    math,
    norm,
    pool,
    reduce,
    tensor,
)
from onnxkiln.providers.cpu.registry import REGISTRY

__all__ = ["REGISTRY"]
