"""The torch device kernels allocate on when no input tensor tells them (ConstantOfShape...).

Kernels whose outputs derive only from host values (ConstantOfShape, Range, EyeLike with a
host shape) read `current_device()` once, when their factory runs at plan time; the provider
wraps planning in `device_scope(device)`. Everything else allocates on its inputs' device.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

__all__ = ["current_device", "device_scope"]

_DEVICE: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar(
    "onnxkiln_cuda_device", default=None
)


def current_device() -> torch.device:
    """The device set by the innermost `device_scope`, else cuda when available, else cpu."""
    dev = _DEVICE.get()
    if dev is not None:
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextlib.contextmanager
def device_scope(device: torch.device | str) -> Iterator[torch.device]:
    """Kernels built inside this block allocate host-derived outputs on `device`."""
    dev = torch.device(device)
    token = _DEVICE.set(dev)
    try:
        yield dev
    finally:
        _DEVICE.reset(token)
