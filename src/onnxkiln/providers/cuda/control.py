"""Torch kernels: If, Loop and Scan with their bodies on the device.

The drivers are onnxkiln.ops.control_flow's. The decisions are read on the host: If's
condition and Loop's trip count and condition are declared host inputs, and a Loop body's
condition output is brought to the host each iteration (the body's one copy back, a sync
on a GPU), so a capture sees these nodes as seams. Carried values, scan slices and scan
outputs stay on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from onnxkiln.ops.control_flow import ArrayOps, if_kernel, loop_kernel, scan8_kernel, scan_kernel
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cuda.device import current_device
from onnxkiln.providers.cuda.dtypes import HELD, SUB_BYTE, needs, to_torch_dtype
from onnxkiln.providers.cuda.registry import kernel

__all__ = ["torch_ops"]


def torch_ops(device: torch.device) -> ArrayOps:
    """The drivers' array operations on torch tensors; new tensors go on `device`."""

    def zeros(shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
        if not isinstance(dtype, torch.dtype):
            dtype = to_torch_dtype(np.dtype(dtype))
        return torch.zeros(shape, dtype=dtype, device=device)

    return ArrayOps(asarray=lambda x: x,
                    stack=lambda items, axis: torch.stack(items, dim=axis),
                    front=lambda x, axis: torch.movedim(x, axis, 0) if axis else x,
                    reverse=lambda x: torch.flip(x, (0,)),
                    zeros=zeros,
                    copy=torch.clone,
                    errors=(RuntimeError, ValueError))


def _on_device(driver):
    def build(info: NodeInfo):
        return driver(info, torch_ops(current_device()))

    build.__doc__ = driver.__doc__
    return build


_SYNC = CaptureSupport.HOST_SYNC
# the drivers stack, flip and copy what the bodies hand back: torch's shell dtypes cannot be
_CARRIED = needs(HELD - SUB_BYTE, what="stacked or copied between iterations")
kernel("If", since=1, factory=True, multi_output=True, host_inputs=(0,), capture=_SYNC,
       supports=_CARRIED, variant="if.subgraph")(_on_device(if_kernel))
kernel("Loop", since=1, factory=True, multi_output=True, host_inputs=(0, 1), capture=_SYNC,
       supports=_CARRIED, variant="loop.subgraph")(_on_device(loop_kernel))
kernel("Scan", since=9, factory=True, multi_output=True, capture=_SYNC, supports=_CARRIED,
       variant="scan.subgraph")(_on_device(scan_kernel))
kernel("Scan", since=8, until=8, factory=True, multi_output=True, host_inputs=(0,),
       capture=_SYNC, supports=_CARRIED, variant="scan8.subgraph")(_on_device(scan8_kernel))
