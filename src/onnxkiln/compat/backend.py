"""`onnxruntime.backend` over onnxkiln: onnx's backend API with onnxruntime's signatures
(`prepare(model, device=None, **kwargs)`, `run`, `supports_device`, `is_compatible`).
`model` is a path, serialized bytes or an onnx.ModelProto; errors come as onnxruntime's
classes (see `onnxkiln.compat._errors`)."""

from __future__ import annotations

from typing import Any

from onnxkiln import backend as _backend
from onnxkiln.compat._errors import ort_errors

__all__ = ["is_compatible", "prepare", "run", "supports_device"]


@ort_errors
def prepare(model: Any, device: str | None = None, **kwargs: Any) -> _backend.OnnxkilnRep:
    """A prepared model; `rep.run(inputs)` returns the outputs in graph order."""
    return _backend.prepare(model, device or "CPU", **kwargs)


@ort_errors
def run(model: Any, inputs: Any, device: str | None = None, **kwargs: Any) -> tuple[Any, ...]:
    """Prepare `model` and run it once on `inputs`."""
    return prepare(model, device, **kwargs).run(inputs)


def supports_device(device: str) -> bool:
    """True for "CPU" (onnxkiln's backend serves the CPU)."""
    return _backend.supports_device(device)


def is_compatible(model: Any, device: str | None = None, **kwargs: Any) -> bool:
    """True when `device` is served (any model onnxkiln loads runs there)."""
    return supports_device(device or "CPU")
