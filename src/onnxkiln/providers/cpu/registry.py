"""The CPU provider's kernel registry; kernel modules register into it on import."""

from __future__ import annotations

from onnxkiln.providers.base import KernelRegistry

REGISTRY = KernelRegistry("cpu")
kernel = REGISTRY.kernel
