"""Capture-safe kernels: clamp bad indices and latch a violation bit, never raise.

A captured plan (CPU: a replay list; CUDA: torch CUDA graphs) must not stop to raise or sync
the host. `capture_safe_kernel` wraps the kernel of an indexing step: out-of-range indices
(outside [-n, n) after ONNX's negative wrap; positions outside [0, rows) for RotaryEmbedding)
are clamped into range and a `CaptureViolation` bit is OR-ed into the session's
`ViolationWord`, a 1-element int32 array on the provider's device that
`check_device_capture_error()` reads later. On torch everything stays tensor ops (no
`.item()`, no `bool(tensor)`); on numpy the clean path is one vectorised comparison and the
indices pass through untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from onnxkiln.dtypes import DataType
from onnxkiln.types import CaptureViolation

__all__ = ["GUARDED_OPS", "ViolationWord", "capture_safe_kernel", "guarded_bit"]

Kernel = Callable[..., Any]

# (domain, op_type) -> the bit its guard sets
GUARDED_OPS: dict[tuple[str, str], CaptureViolation] = {
    ("", "Gather"): CaptureViolation.GATHER_INDEX,
    ("", "GatherElements"): CaptureViolation.GATHER_INDEX,
    ("", "GatherND"): CaptureViolation.GATHER_INDEX,
    ("", "ScatterND"): CaptureViolation.SCATTER_INDEX,
    ("", "ScatterElements"): CaptureViolation.SCATTER_INDEX,
    ("", "Scatter"): CaptureViolation.SCATTER_INDEX,
    ("", "RotaryEmbedding"): CaptureViolation.POSITION_RANGE,
    ("com.microsoft", "RotaryEmbedding"): CaptureViolation.POSITION_RANGE,
}


def guarded_bit(op_type: str, domain: str = "") -> CaptureViolation | None:
    """The violation bit a capture-safe wrapper of this op sets; None: no guard needed."""
    return GUARDED_OPS.get(("" if domain == "ai.onnx" else domain, op_type))


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


class ViolationWord:
    """The latched violation bitmask of one session: a 1-element int32 array on the device.

    `empty(dtype, shape)` allocates it (a provider's `empty`: numpy on the CPU provider, a
    torch tensor on the torch provider's device). The buffer object never changes (a CUDA
    graph holds its address); `clear()` zeroes it in place.
    """

    def __init__(self, empty: Callable[[DataType, tuple[int, ...]], Any]) -> None:
        self.buffer = empty(DataType.INT32, (1,))
        self._torch = _is_torch(self.buffer)
        self.clear()

    @classmethod
    def for_provider(cls, provider: Any) -> ViolationWord:
        """A word on `provider`'s device (anything with `empty(dtype, shape)`)."""
        return cls(provider.empty)

    def flag(self, bit: CaptureViolation | int, bad: Any) -> None:
        """OR `bit` in where `bad` (a 0-d/1-element bool array or tensor, or a bool) holds;
        on torch a device op (no host sync)."""
        if self._torch:
            if _is_torch(bad):
                self.buffer.bitwise_or_(bad.reshape(1).to(self.buffer.dtype) * int(bit))
            elif bad:
                self.buffer.bitwise_or_(int(bit))
        elif bool(np.asarray(bad).reshape(-1)[0]):
            self.buffer[0] |= int(bit)

    def read(self) -> int:
        """The bitmask, read on the host (syncs on a device); does not clear."""
        if self._torch:
            return int(self.buffer.reshape(-1)[0].item())
        return int(self.buffer[0])

    def clear(self) -> None:
        """Zero the word in place (the same buffer object)."""
        if self._torch:
            self.buffer.zero_()
        else:
            self.buffer[0] = 0

    def __repr__(self) -> str:
        return f"ViolationWord({CaptureViolation(self.read())!r})"


# ---------------------------------------------------------------------------------------------
# clamping, numpy and torch


def _np_clamp(idx: np.ndarray, n: Any) -> np.ndarray:
    """Indices with negatives wrapped by n (an int or an array broadcast on the last axis) and
    the rest clipped into [0, n - 1], in idx's dtype."""
    idx = np.asarray(idx)
    wrapped = np.where(idx < 0, idx + n, idx)
    return np.clip(wrapped, 0, np.maximum(np.asarray(n) - 1, 0)).astype(idx.dtype, copy=False)


def _np_bad(idx: Any, n: int) -> bool:
    idx = np.asarray(idx)
    if idx.size <= 16:  # a token or a position: plain Python beats two reductions
        values = idx.ravel().tolist()
        return bool(values) and (min(values) < -n or max(values) >= n)
    return bool(idx.size) and (idx.min() < -n or idx.max() >= n)


def _torch_clamp(idx: Any, n: int) -> tuple[Any, Any]:
    """(indices wrapped and clamped into [0, n), 0-d bool tensor: any was outside [-n, n))."""
    wrapped = idx + (idx < 0).to(idx.dtype) * n
    bad = ((wrapped < 0) | (wrapped >= n)).any()
    return wrapped.clamp(0, max(n - 1, 0)), bad


def _axis(axis: int, rank: int) -> int | None:
    a = axis + rank if axis < 0 else axis
    return a if 0 <= a < rank else None


def _guard_axis(kernel: Kernel, bit: CaptureViolation, word: ViolationWord, axis: int,
                data_pos: int = 0) -> Kernel:
    """Guard for kernel(data, indices, ...) with indices along `axis` of data."""
    def safe(*args: Any) -> Any:
        data, indices = args[data_pos], args[data_pos + 1]
        a = _axis(axis, len(data.shape))
        if a is None:  # the kernel itself reports a bad axis (a plan-time constant)
            return kernel(*args)
        n = data.shape[a]
        if _is_torch(indices):
            fixed, bad = _torch_clamp(indices, n)
            word.flag(bit, bad)
        elif _np_bad(indices, n):
            fixed = _np_clamp(indices, n)
            word.flag(bit, True)
        else:
            return kernel(*args)
        return kernel(*args[:data_pos + 1], fixed, *args[data_pos + 2:])
    return safe


def _guard_nd(kernel: Kernel, bit: CaptureViolation, word: ViolationWord,
              batch_dims: int) -> Kernel:
    """Guard for kernel(data, indices, ...) whose indices' last axis addresses data dims
    batch_dims .. batch_dims + k."""
    def safe(data: Any, indices: Any, *rest: Any) -> Any:
        k = indices.shape[-1] if len(indices.shape) else 0
        dims = tuple(data.shape[batch_dims:batch_dims + k])
        if not k or len(dims) != k:  # a shape error: the kernel reports it
            return kernel(data, indices, *rest)
        if _is_torch(indices):
            import torch
            cols, flags = [], []
            for j, n in enumerate(dims):
                col, bad = _torch_clamp(indices[..., j], n)
                cols.append(col)
                flags.append(bad)
            fixed = torch.stack(cols, dim=-1)
            word.flag(bit, torch.stack(flags).any())
            return kernel(data, fixed, *rest)
        lim = np.asarray(dims, dtype=np.int64)
        idx = np.asarray(indices)
        if idx.size and ((idx < -lim) | (idx >= lim)).any():
            word.flag(bit, True)
            return kernel(data, _np_clamp(idx, lim), *rest)
        return kernel(data, indices, *rest)
    return safe


def _positions(pos: Any, n: int, bit: CaptureViolation, word: ViolationWord) -> Any:
    """Positions clamped into [0, n) (no wrap: a negative position is a violation)."""
    if _is_torch(pos):
        bad = ((pos < 0) | (pos >= n)).any()
        word.flag(bit, bad)
        return pos.clamp(0, max(n - 1, 0))
    p = np.asarray(pos)
    if p.size and (p.min() < 0 or p.max() >= n):
        word.flag(bit, True)
        return np.clip(p, 0, max(n - 1, 0)).astype(p.dtype, copy=False)
    return pos


def _guard_rope(kernel: Kernel, word: ViolationWord) -> Kernel:
    """ai.onnx RotaryEmbedding(x, cos_cache, sin_cache, position_ids=None)."""
    bit = CaptureViolation.POSITION_RANGE

    def safe(x: Any, cos_cache: Any, sin_cache: Any, position_ids: Any = None) -> Any:
        if position_ids is None or len(cos_cache.shape) != 2:
            return kernel(x, cos_cache, sin_cache, position_ids)
        fixed = _positions(position_ids, cos_cache.shape[0], bit, word)
        return kernel(x, cos_cache, sin_cache, fixed)
    return safe


def _guard_rope_ms(kernel: Kernel, word: ViolationWord) -> Kernel:
    """com.microsoft RotaryEmbedding(input, position_ids, cos_cache, sin_cache): a 1-element
    position_ids is a start offset (positions start .. start + S - 1), else (B, S)."""
    bit = CaptureViolation.POSITION_RANGE

    def safe(x: Any, position_ids: Any, cos_cache: Any, sin_cache: Any) -> Any:
        rank = len(x.shape)
        if len(cos_cache.shape) != 2 or rank not in (3, 4):
            return kernel(x, position_ids, cos_cache, sin_cache)
        n = cos_cache.shape[0]
        count = position_ids.numel() if _is_torch(position_ids) else np.size(position_ids)
        s = x.shape[2] if rank == 4 else x.shape[1]
        if count != 1 or s == 1:
            return kernel(x, _positions(position_ids, n, bit, word), cos_cache, sin_cache)
        b = x.shape[0]
        if _is_torch(position_ids):  # explicit (B, S) positions, clamped on the device
            import torch
            start = position_ids.reshape(-1)[:1]
            pos = start + torch.arange(s, device=start.device, dtype=start.dtype)
            pos = _positions(pos, n, bit, word)
            return kernel(x, pos.unsqueeze(0).expand(b, s), cos_cache, sin_cache)
        start = int(np.asarray(position_ids).reshape(-1)[0])
        if start >= 0 and start + s <= n:
            return kernel(x, position_ids, cos_cache, sin_cache)
        dtype = np.asarray(position_ids).dtype
        pos = _positions(np.arange(start, start + s, dtype=dtype), n, bit, word)
        return kernel(x, np.broadcast_to(pos, (b, s)).copy(), cos_cache, sin_cache)
    return safe


def capture_safe_kernel(step: Any, attrs: Mapping[str, Any],
                        word: ViolationWord) -> Kernel | None:
    """A kernel with `step.kernel`'s call signature that clamps out-of-range indices into
    range and flags `word` instead of raising, for a step whose op indexes; None when the op
    needs no guard. `attrs`: the node's attributes as plain values (missing: ONNX defaults).

    A kernel carrying `capture_safe(word)` (the in-place KV writes of onnxkiln.bindings)
    provides its own variant. Torch kernels with an `.unchecked` twin (providers/cuda/index.py)
    are wrapped around that twin, so the replay has no bounds sync."""
    own = getattr(step.kernel, "capture_safe", None)
    if callable(own):
        return own(word)
    bit = guarded_bit(step.op_type, step.domain)
    if bit is None:
        return None
    inner = getattr(step.kernel, "unchecked", step.kernel)
    op = step.op_type
    if step.domain == "com.microsoft":
        safe = _guard_rope_ms(inner, word)
    elif op == "RotaryEmbedding":
        safe = _guard_rope(inner, word)
    elif op == "GatherND":
        safe = _guard_nd(inner, bit, word, int(attrs.get("batch_dims") or 0))
    elif op == "ScatterND":
        safe = _guard_nd(inner, bit, word, 0)
    else:  # Gather, GatherElements, ScatterElements, Scatter
        safe = _guard_axis(inner, bit, word, int(attrs.get("axis") or 0))
    safe.__wrapped__ = step.kernel
    safe.violation_bit = bit
    variant = (getattr(step.kernel, "variant", None)
               or getattr(getattr(step, "spec", None), "variant", ""))
    safe.variant = f"{variant or op.lower()}.capture_safe"
    return safe
