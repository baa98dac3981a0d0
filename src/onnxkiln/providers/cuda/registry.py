"""The CUDA provider's kernel registry; kernel modules register into it on import."""

from __future__ import annotations

from onnxkiln.providers.base import KernelRegistry

REGISTRY = KernelRegistry("cuda", default_variant="torch")
kernel = REGISTRY.kernel
