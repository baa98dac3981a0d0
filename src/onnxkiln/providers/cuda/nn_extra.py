"""Torch kernels: LpPool, GlobalLpPool, Det, ReverseSequence and Dropout (every opset).

Semantics follow the CPU provider. Training Dropout draws its keep mask on the host from the
same seeded numpy stream as the CPU kernel (onnxkiln.ops.random: onnx's reference draws it
that way, so a seeded node reproduces onnx's outputs) and copies it to the device: a
host-to-device transfer per call, no device-to-host sync (so a captured graph would replay
one mask: those kernels say so through `capture`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from onnxkiln.ops.random import seeded_state
from onnxkiln.ops.window import pool_geometry
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cuda._util import axis_of, up, wants
from onnxkiln.providers.cuda.dtypes import FLOATS, SERVED, needs
from onnxkiln.providers.cuda.nn import _CONV, _ones_kernel, _padded, _spatial_supports
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor


def _lp_power(x: Tensor, p: float) -> Tensor:
    return x * x if p == 2.0 else x.abs() if p == 1.0 else x.abs().pow(p)


def _lp_root(y: Tensor, p: float) -> Tensor:
    return y.sqrt() if p == 2.0 else y if p == 1.0 else y.pow(1.0 / p)


@kernel("LpPool", since=1, factory=True, supports=_spatial_supports("LpPool",
                                                                     what="integer pooling"))
def lp_pool(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """(sum over the window of |x|**p) ** (1/p), pads contributing zeros; window sums are a
    ones-kernel conv, so dilations, pads and ceil_mode work as in AveragePool."""
    attrs = dict(info.attrs)
    p = float(attrs.get("p") if attrs.get("p") is not None else 2)
    geos: dict[tuple, object] = {}

    def run(x: Tensor) -> Tensor:
        geo = geos.get(tuple(x.shape))
        if geo is None:
            geo = geos[tuple(x.shape)] = pool_geometry(attrs, tuple(x.shape))
        n, c = x.shape[:2]
        nsp = x.ndim - 2
        xc = _lp_power(up(x), p)
        xp = _padded(xc, geo, 0.0).reshape(n * c, 1, *[geo.padded[i] for i in range(nsp)])
        ker = _ones_kernel(tuple(geo.kernel), xc.dtype, str(x.device))
        s = _CONV[nsp](xp, ker, None, geo.strides, 0, geo.dilations)
        return _lp_root(s.reshape(n, c, *s.shape[2:]), p).to(x.dtype)

    return run


@kernel("GlobalLpPool", since=1, factory=True, supports=needs(FLOATS))
def global_lp_pool(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """(sum over all spatial positions of |x|**p) ** (1/p)."""
    p = float(info.attrs.get("p") if info.attrs.get("p") is not None else 2)

    def run(x: Tensor) -> Tensor:
        if x.ndim < 3:
            raise ValueError(f"global pooling needs input (N, C, D1, ...), got {tuple(x.shape)}")
        s = _lp_power(up(x), p).sum(dim=tuple(range(2, x.ndim)), keepdim=True)
        return _lp_root(s, p).to(x.dtype)

    return run


@kernel("Det", since=11, supports=needs(FLOATS))
def det(x: Tensor) -> Tensor:
    """Determinant of the trailing square matrices (LU); float16/bfloat16 in float32."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Det: input must be [..., M, M], got shape {tuple(x.shape)}")
    return torch.linalg.det(up(x)).to(x.dtype)


@kernel("ReverseSequence", since=10, factory=True, supports=needs(SERVED, skip_inputs=(1,)))
def reverse_sequence(info: NodeInfo) -> Callable[[Tensor, Tensor], Tensor]:
    """Reverse the first sequence_lens[b] steps along time_axis for each batch entry b.

    Lengths outside [0, T] are clamped (the CPU provider raises; checking would need a host
    sync)."""
    batch_axis = int(info.attrs.get("batch_axis", 1))
    time_axis = int(info.attrs.get("time_axis", 0))

    def run(x: Tensor, sequence_lens: Tensor) -> Tensor:
        b = axis_of(batch_axis, x.ndim, "ReverseSequence")
        t = axis_of(time_axis, x.ndim, "ReverseSequence")
        if b == t:
            raise ValueError("ReverseSequence: batch_axis and time_axis must differ")
        n_batch, n_time = x.shape[b], x.shape[t]
        lens = sequence_lens.reshape(-1).to(torch.int64)
        if lens.numel() != n_batch:
            raise ValueError(f"ReverseSequence: sequence_lens has {lens.numel()} entries, "
                             f"the batch {n_batch}")
        lim = lens.clamp(0, n_time)[:, None]
        steps = torch.arange(n_time, device=x.device)[None, :]
        idx = torch.where(steps < lim, lim - 1 - steps, steps)  # (batch, time)
        if t < b:
            idx = idx.T
        shape = [1] * x.ndim
        shape[b], shape[t] = n_batch, n_time
        idx = idx.reshape(shape).expand(x.shape)
        return torch.gather(x, t, idx)

    return run


# ---------------------------------------------------------------------------------- Dropout


def _keep_mask(state, shape: tuple[int, ...], ratio: float, device) -> Tensor:
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"Dropout: ratio must be in [0, 1], got {ratio}")
    keep = state.random_sample(shape) >= ratio
    return torch.from_numpy(keep).to(device, non_blocking=True)


def _train(x: Tensor, ratio: float, state, mask_dtype: torch.dtype | None, want: bool):
    """keep where u >= ratio (u ~ U[0, 1) from the CPU kernel's stream), scaled 1/(1-ratio)."""
    keep = _keep_mask(state, tuple(x.shape), ratio, x.device)
    xc = up(x)
    y = torch.zeros_like(xc)
    if ratio < 1.0:
        one = np.float64(1) if xc.dtype == torch.float64 else np.float32(1)
        scale = float(one / (one - one.dtype.type(ratio)))  # rounded as the CPU kernel's
        y = torch.where(keep, xc * scale, y)
    mask = keep.to(mask_dtype or x.dtype) if want else None
    return y.to(x.dtype), mask


def _state(info: NodeInfo):
    return seeded_state(info.attrs.get("seed"))


def _ones(x: Tensor, want: bool, dtype: torch.dtype) -> Tensor | None:
    return torch.ones(x.shape, dtype=dtype, device=x.device) if want else None


_DROPOUT = needs(SERVED, skip_inputs=(1, 2))


@kernel("Dropout", since=1, until=6, factory=True, multi_output=True, view=True,
        supports=_DROPOUT, capture=CaptureSupport.ALLOCATES)
def dropout_v1(info: NodeInfo) -> Callable[[Tensor], tuple]:
    """is_test != 0: the input and a mask of ones (type T); is_test == 0 (the default) trains."""
    ratio, want = float(info.attrs["ratio"]), wants(info, 1)
    if not info.attrs.get("is_test"):
        state = _state(info)
        return lambda x: _train(x, ratio, state, None, want)
    return lambda x: (x, _ones(x, want, x.dtype))


@kernel("Dropout", since=7, until=11, factory=True, multi_output=True, view=True,
        supports=_DROPOUT)
def dropout_legacy(info: NodeInfo) -> Callable[[Tensor], tuple]:
    """The input as is (no training switch), a mask of ones (type T before opset 10)."""
    want = wants(info, 1)
    return lambda x: (x, _ones(x, want, torch.bool if info.opset >= 10 else x.dtype))


@kernel("Dropout", since=12, factory=True, multi_output=True, view=True, host_inputs=(1, 2),
        supports=_DROPOUT, capture=CaptureSupport.READS_HOST_SCALAR)
def dropout(info: NodeInfo) -> Callable[..., tuple]:
    """The input and an all-true mask unless training_mode is true with a non-zero ratio
    (default 0.5): then dropout with the CPU kernel's seeded stream."""
    state, want = _state(info), wants(info, 1)

    def run(x: Tensor, ratio=None, training_mode=None) -> tuple:
        if training_mode is not None and bool(np.asarray(training_mode)):
            r = 0.5 if ratio is None else float(np.asarray(ratio, dtype=np.float64))
            if r != 0.0:
                return _train(x, r, state, torch.bool, want)
        return x, _ones(x, want, torch.bool)

    return run

