"""The CUDA execution provider: torch tensors on a device, kernels written as torch ops.

The same provider runs on torch's CPU device (the `testing.cuda_on_torch_cpu` option), which
is how CI checks every torch kernel without a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import NodeInfo, registry_claims
from onnxkiln.providers.cuda.device import device_scope
from onnxkiln.providers.cuda.dtypes import HELD, from_torch, to_numpy, to_torch, to_torch_dtype
from onnxkiln.providers.cuda.registry import REGISTRY
from onnxkiln.types import DeviceAllocationCounts, DeviceId, DeviceType

__all__ = ["TorchProvider"]


class TorchProvider:
    """Kernels on one torch device; values are torch tensors resident there."""

    name = "cuda"
    on_host = False
    registry = REGISTRY

    def __init__(self, device: torch.device) -> None:
        import onnxkiln.providers.cuda  # noqa: F401  (registers the kernels)

        self.torch_device = device

    @property
    def device(self) -> DeviceId:
        """The device in the public API's terms (the CPU when testing on torch's CPU)."""
        if self.torch_device.type == "cuda":
            return DeviceId(DeviceType.CUDA, self.torch_device.index or 0)
        return DeviceId(DeviceType.CPU)

    def planning(self) -> contextlib.AbstractContextManager:
        """Kernels built inside allocate host-derived outputs on this device."""
        return device_scope(self.torch_device)

    def claims(self, info: NodeInfo) -> str | None:
        """None when a torch kernel serves this node (op, opset, dtypes), else why not."""
        node = info.node
        if node is not None:
            for v in (*node.inputs, *node.outputs):
                if v is not None and v.type is not None and not isinstance(v.type, ir.TensorType):
                    return f"'{v.name}' is a {v.type}: sequences and optionals stay on the host"
        for kind, dtypes in (("input", info.input_dtypes), ("output", info.output_dtypes)):
            for i, dtype in enumerate(dtypes):
                if dtype is not None and dtype not in HELD:
                    return f"{kind} {i} has type {DataType(dtype)}, which torch kernels do not run"
        return registry_claims(self.registry, info)

    def adopt(self, value: Any) -> torch.Tensor | None:
        """An input already on a device, as a torch tensor without copying: torch tensors,
        and `__dlpack__` objects (cupy, jax...) whose memory is on a CUDA device. None for
        host data, which the session converts to numpy."""
        if isinstance(value, torch.Tensor):
            return value
        device = getattr(value, "__dlpack_device__", None)
        if device is not None and not isinstance(value, np.ndarray) and device()[0] == 2:
            return torch.from_dlpack(value)  # 2: kDLCUDA
        return None

    @staticmethod
    def array_dtype(tensor: torch.Tensor) -> np.dtype:
        """The numpy dtype matching a tensor's (object when no ONNX type maps to it)."""
        try:
            return from_torch(tensor.dtype).numpy
        except KeyError:
            return np.dtype(object)

    def to_device(self, value: Any) -> Any:
        """Upload a host array (a tensor already on this device is taken as it is)."""
        if value is None or isinstance(value, list | dict):
            return value
        if isinstance(value, torch.Tensor):
            return value if value.device == self.torch_device else value.to(self.torch_device)
        if not isinstance(value, np.ndarray | np.generic) and hasattr(value, "__dlpack__"):
            return torch.from_dlpack(value).to(self.torch_device)
        return to_torch(np.asarray(value), self.torch_device)

    def to_host(self, value: Any) -> Any:
        """Download a tensor as a numpy array of its own (host values pass through)."""
        if not isinstance(value, torch.Tensor):
            return value
        array = to_numpy(value)
        # on torch's CPU device .numpy() shares the tensor's memory (a binding, a weight)
        return array.copy() if value.device.type == "cpu" else array

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on torch's CPU device)."""
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)

    def empty(self, dtype: DataType, shape: Sequence[int]) -> torch.Tensor:
        """A zeroed device buffer (device bindings allocate through this)."""
        return torch.zeros(tuple(shape), dtype=to_torch_dtype(dtype), device=self.torch_device)

    def allocation_counts(self) -> DeviceAllocationCounts | None:
        """torch's CUDA allocator statistics for this device; None off CUDA."""
        if self.torch_device.type != "cuda":
            return None
        stats = torch.cuda.memory_stats(self.torch_device)
        return DeviceAllocationCounts(
            allocations=int(stats.get("allocation.all.allocated", 0)),
            frees=int(stats.get("allocation.all.freed", 0)),
            bytes_in_use=int(stats.get("allocated_bytes.all.current", 0)),
            peak_bytes=int(stats.get("allocated_bytes.all.peak", 0)),
        )
