"""Torch kernels: DepthToSpace, SpaceToDepth, EyeLike, LpNormalization,
MeanVarianceNormalization, LRN, TensorScatter (KV-cache writes, indices clamped)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._util import attr_str, axis_of, up
from onnxkiln.providers.cuda.dtypes import FLOATS, SERVED, needs, to_torch_dtype
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor


def _block_mode(mode) -> str:
    m = attr_str(mode) or "DCR"
    if m not in ("DCR", "CRD"):
        raise ValueError(f"mode must be DCR or CRD, got {m!r}")
    return m


@kernel("SpaceToDepth", since=1, supports=needs(SERVED))
def space_to_depth(x: Tensor, *, blocksize, mode) -> Tensor:
    """(N, C, H, W) -> (N, C*b*b, H/b, W/b); DCR (default) or CRD."""
    b = int(blocksize)
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b)
    perm = (0, 3, 5, 1, 2, 4) if _block_mode(mode) == "DCR" else (0, 1, 3, 5, 2, 4)
    return t.permute(perm).reshape(n, c * b * b, h // b, w // b).clone(
        memory_format=torch.contiguous_format)


@kernel("DepthToSpace", since=1, supports=needs(SERVED))
def depth_to_space(x: Tensor, *, blocksize, mode) -> Tensor:
    """(N, C, H, W) -> (N, C/(b*b), H*b, W*b) in DCR (default) or CRD order."""
    b = int(blocksize)
    n, c, h, w = x.shape
    cb = c // (b * b)
    if _block_mode(mode) == "DCR":
        t = x.reshape(n, b, b, cb, h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, cb, b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return t.reshape(n, cb, h * b, w * b).clone(memory_format=torch.contiguous_format)


def _eye_supports(info: NodeInfo) -> str | None:
    dt = info.attrs.get("dtype")
    if dt is not None and DataType(int(dt)) not in SERVED:
        return f"dtype {DataType(int(dt))} not supported by torch kernels (EyeLike)"
    return needs(SERVED)(info)


@kernel("EyeLike", since=9, factory=True, supports=_eye_supports)
def eye_like(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """A 2-D tensor shaped like the input with ones on the k-th diagonal."""
    dt = info.attrs.get("dtype")
    k = int(info.attrs.get("k") or 0)
    target = None if dt is None else to_torch_dtype(int(dt))

    def run(x: Tensor) -> Tensor:
        ones = torch.ones((x.shape[0], x.shape[1]), dtype=target or x.dtype, device=x.device)
        return torch.triu(torch.tril(ones, k), k)

    return run


@kernel("LpNormalization", since=1, factory=True, supports=needs(FLOATS))
def lp_normalization(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """x / ||x||_p along `axis` (p = 1 or 2); zero where the norm is zero."""
    p, axis = int(info.attrs["p"]), int(info.attrs["axis"])
    if p not in (1, 2):
        raise ValueError(f"LpNormalization: p must be 1 or 2, got {p}")

    def run(x: Tensor) -> Tensor:
        a = axis_of(axis, x.ndim, "LpNormalization")
        xc = up(x)
        norm = torch.linalg.vector_norm(xc, ord=p, dim=a, keepdim=True)
        y = torch.where(norm != 0, xc / torch.where(norm != 0, norm, 1.0), 0.0)
        return y.to(x.dtype)

    return run


@kernel("MeanVarianceNormalization", since=9, factory=True, supports=needs(FLOATS))
def mean_variance_normalization(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """(X - E[X]) / (sqrt(E[(X - E[X])^2]) + 1e-9) over `axes`."""
    axes_attr = [int(a) for a in info.attrs["axes"]]

    def run(x: Tensor) -> Tensor:
        axes = tuple(axis_of(a, x.ndim, "MeanVarianceNormalization") for a in axes_attr)
        xc = up(x)
        d = xc - torch.mean(xc, dim=axes, keepdim=True)
        std = torch.sqrt(torch.mean(d * d, dim=axes, keepdim=True)) + 1e-9
        return (d / std).to(x.dtype)

    return run


@kernel("LRN", since=1, factory=True, supports=needs(FLOATS))
def lrn(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """X / (bias + alpha / size * sum of X^2 over `size` channels) ^ beta."""
    size = int(info.attrs["size"])
    alpha, beta, bias = (float(info.attrs[k]) for k in ("alpha", "beta", "bias"))
    lo = (size - 1) // 2

    def run(x: Tensor) -> Tensor:
        xc = up(x)
        sq = (xc * xc).reshape(x.shape[0], 1, x.shape[1], -1)  # channels as a spatial axis
        sq = F.pad(sq, (0, 0, lo, size - 1 - lo))
        acc = F.avg_pool2d(sq, (size, 1), stride=1) * size  # exact window sums
        acc = acc.reshape(xc.shape) * (alpha / size) + bias
        return (xc * torch.pow(acc, -beta)).to(x.dtype)

    return run


@kernel("TensorScatter", since=24, factory=True, supports=needs(SERVED, skip_inputs=(2,)))
def tensor_scatter(info: NodeInfo) -> Callable[..., Tensor]:
    """A copy of past_cache with `update` written along `axis` from each batch entry's write
    index (device tensor; linear mode clamps the window into the cache, circular wraps)."""
    mode = attr_str(info.attrs["mode"])
    axis_attr = int(info.attrs["axis"])
    if mode not in ("linear", "circular"):
        raise ValueError(f"TensorScatter: mode must be 'linear' or 'circular', got {mode!r}")

    def run(past: Tensor, update: Tensor, write_indices: Tensor | None = None) -> Tensor:
        r = past.ndim
        ax = axis_of(axis_attr, r, "TensorScatter")
        n, s = past.shape[ax], update.shape[ax]
        if s > n:
            raise ValueError(f"TensorScatter: update length {s} exceeds cache length {n}")
        out = past.clone()
        if s == 0 or out.numel() == 0:
            return out
        batch = past.shape[0]
        if write_indices is None:
            out.narrow(ax, 0, s).copy_(update)
            return out
        starts = write_indices.to(torch.int64).reshape(batch, 1)
        idx = starts + torch.arange(s, device=past.device)
        idx = torch.remainder(idx, n) if mode == "circular" else idx.clamp(0, n - 1)
        shape = [1] * r
        shape[0], shape[ax] = batch, s
        out.scatter_(ax, idx.reshape(shape).expand(update.shape), update)
        return out

    return run
