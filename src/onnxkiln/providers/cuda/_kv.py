"""In-place KV writes shared by the torch attention kernels (see onnxkiln.kv_attention)."""

from __future__ import annotations

import torch

from onnxkiln.kv_attention import capacity_error, note_written

Tensor = torch.Tensor


def append_in_place(target, new: Tensor, start: int, op: str) -> tuple[Tensor, Tensor]:
    """Write `new` (B, N, L, H) into the bound buffer at [start, start + L) on axis 2 and
    return (keys/values in new's dtype, the present: a view of the buffer's first start + L
    rows). The first equals the past (rounded to the buffer's dtype) joined to the unrounded
    new rows, as the plain kernel's concatenation gives."""
    buf = target.tensor
    end = start + new.shape[2]
    if end > buf.shape[2]:
        raise capacity_error(target, op, end, 2)
    buf[:, :, start:end] = new
    note_written(target, new.numel() * buf.element_size())
    present = buf[:, :, :end]
    if present.dtype == new.dtype:
        return present, present
    both = present.to(new.dtype)
    both[:, :, start:end] = new
    return both, present
