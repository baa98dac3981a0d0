"""Torch kernels: CenterCropPad, Col2Im and MaxUnpool, image ops that move blocks of a
tensor into a zeroed output of a shape fixed by host operands (shape, image_shape,
block_shape, output_shape) or attributes."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cuda._util import axes_of, ints
from onnxkiln.providers.cuda.dtypes import SERVED, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor


def _per_axis(value, n: int, default: int, what: str, op: str) -> tuple[int, ...]:
    if value is None:
        return (default,) * n
    out = tuple(int(v) for v in value)
    if len(out) != n:
        raise ValueError(f"{op}: {what} must have {n} entries, got {list(out)}")
    return out


@kernel("CenterCropPad", since=18, host_inputs=(1,), supports=needs(SERVED, skip_inputs=(1,)))
def center_crop_pad(x: Tensor, shape, *, axes) -> Tensor:
    """Crop (start rounded down) or zero-pad (the extra element at the end) each axis to the
    host `shape`."""
    target = ints(shape)
    ax = list(range(x.ndim)) if axes is None else axes_of(axes, x.ndim, "CenterCropPad")
    if len(target) != len(ax):
        raise ValueError(f"CenterCropPad: shape has {len(target)} values for {len(ax)} axes")
    if any(t < 0 for t in target):
        raise ValueError(f"CenterCropPad: shape must be >= 0, got {target}")
    out_shape = list(x.shape)
    src = [slice(None)] * x.ndim
    dst = [slice(None)] * x.ndim
    for a, t in zip(ax, target):
        size = x.shape[a]
        out_shape[a] = t
        if size > t:
            start = (size - t) // 2
            src[a] = slice(start, start + t)
        elif size < t:
            start = (t - size) // 2
            dst[a] = slice(start, start + size)
    y = torch.zeros(out_shape, dtype=x.dtype, device=x.device)
    y[tuple(dst)] = x[tuple(src)]
    return y


def _col2im_counts(img, blk, dil, st, pd, total: int) -> list[int]:
    r = len(img)
    padded = [img[i] + pd[i] + pd[r + i] for i in range(r)]
    counts = [(padded[i] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(r)]
    if math.prod(counts) != total or any(v <= 0 for v in counts):
        raise ValueError(f"Col2Im: input has {total} blocks but image_shape {img}, block_shape "
                         f"{blk}, pads, strides and dilations give {counts}")
    return counts


@kernel("Col2Im", since=18, host_inputs=(1, 2), supports=needs(SERVED, skip_inputs=(1, 2)))
def col2im(x: Tensor, image_shape, block_shape, *, dilations, pads, strides) -> Tensor:
    """Sum column blocks (N, C*prod(block), L) back into images (N, C, *image_shape): one
    strided add per block position (float16/bfloat16 accumulate in float32, bool ORs)."""
    img, blk = ints(image_shape), ints(block_shape)
    r = len(img)
    if len(blk) != r or x.ndim != 3:
        raise ValueError(f"Col2Im: input must be 3-D and image_shape/block_shape of equal "
                         f"length; got input {tuple(x.shape)}, image_shape {img}, "
                         f"block_shape {blk}")
    dil = _per_axis(dilations, r, 1, "dilations", "Col2Im")
    st = _per_axis(strides, r, 1, "strides", "Col2Im")
    pd = _per_axis(pads, 2 * r, 0, "pads", "Col2Im")
    kk = math.prod(blk)
    n, ck, total = x.shape
    if kk == 0 or ck % kk:
        raise ValueError(f"Col2Im: input dim 1 ({ck}) must be a multiple of prod(block_shape) "
                         f"({kk})")
    counts = _col2im_counts(img, blk, dil, st, pd, total)
    c = ck // kk
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    padded = [img[i] + pd[i] + pd[r + i] for i in range(r)]
    out = torch.zeros((n, c, *padded), dtype=acc, device=x.device)
    cols = x.reshape(n, c, *blk, *counts).to(acc)
    for pos in itertools.product(*(range(b) for b in blk)):
        window = tuple(slice(pos[i] * dil[i], pos[i] * dil[i] + st[i] * (counts[i] - 1) + 1,
                             st[i]) for i in range(r))
        view = out[(slice(None), slice(None), *window)]
        src = cols[(slice(None), slice(None), *pos)]
        if acc == torch.bool:
            view.logical_or_(src)
        else:
            view.add_(src)
    crop = tuple(slice(pd[i], pd[i] + img[i]) for i in range(r))
    return out[(slice(None), slice(None), *crop)].to(x.dtype).contiguous()


def _in_own_window(flat: np.ndarray, shape: tuple, k, s, pads_begin) -> bool:
    """Whether every index, read as a flat position in `shape`, lies in its pooling window."""
    coords = np.unravel_index(flat, shape)
    lead = np.indices(flat.shape, sparse=True)
    if not all((coords[i] == lead[i]).all() for i in range(2)):
        return False
    for i in range(len(k)):
        off = coords[2 + i] - (lead[2 + i] * s[i] - pads_begin[i])
        if ((off < 0) | (off >= k[i])).any():
            return False
    return True


@kernel("MaxUnpool", since=9, factory=True, host_inputs=(2,), capture=CaptureSupport.HOST_SYNC,
        supports=needs(SERVED | {DataType.INT64}, skip_inputs=(2,)))
def max_unpool(info: NodeInfo) -> Callable[..., Tensor]:
    """Scatter X into zeros at the flat positions I (MaxPool's Indices), as the CPU provider.

    With no output_shape (or the one the attributes give) this is one device scatter. A larger
    output_shape needs the CPU provider's reading of I (flat in output_shape unless only the
    attribute-given shape keeps every value in its pooling window; then that tensor is
    zero-padded at the end of each axis), which downloads I once.
    """
    attrs = dict(info.attrs)

    def run(x: Tensor, indices: Tensor, output_shape=None) -> Tensor:
        if tuple(indices.shape) != tuple(x.shape):
            raise ValueError(f"MaxUnpool: I shape {tuple(indices.shape)} must equal X shape "
                             f"{tuple(x.shape)}")
        nsp = x.ndim - 2
        k = _per_axis(attrs.get("kernel_shape"), nsp, 1, "kernel_shape", "MaxUnpool")
        s = _per_axis(attrs.get("strides"), nsp, 1, "strides", "MaxUnpool")
        pads = _per_axis(attrs.get("pads"), 2 * nsp, 0, "pads", "MaxUnpool")
        inferred = (*x.shape[:2], *((x.shape[2 + i] - 1) * s[i] + k[i] - pads[i] - pads[nsp + i]
                                    for i in range(nsp)))
        shape = inferred
        if output_shape is not None:
            shape = tuple(ints(output_shape))
            if len(shape) != x.ndim or shape[:2] != tuple(x.shape[:2]):
                raise ValueError(f"MaxUnpool: output_shape {list(shape)} must have rank {x.ndim} "
                                 f"and start with X's (N, C) {tuple(x.shape[:2])}")
        flat = indices.reshape(-1).long()
        scatter_shape = shape
        if shape != inferred and flat.numel():
            host = flat.cpu().numpy()
            total = math.prod(shape)
            if host.min() < 0 or host.max() >= total:
                raise IndexError(f"MaxUnpool: indices must lie in [0, {total}) for output shape "
                                 f"{shape}; got range [{host.min()}, {host.max()}]")
            i = host.reshape(x.shape)
            if (all(a >= b for a, b in zip(shape, inferred))
                    and host.max() < math.prod(inferred)
                    and not _in_own_window(i, shape, k, s, pads[:nsp])
                    and _in_own_window(i, inferred, k, s, pads[:nsp])):
                scatter_shape = inferred
        size = math.prod(scatter_shape)
        # an index outside the output lands in a spare slot, dropped (no device assert, no
        # sync; the CPU provider raises IndexError)
        flat = torch.where((flat >= 0) & (flat < size), flat, size)
        y = torch.zeros(size + 1, dtype=x.dtype, device=x.device)
        y = y.scatter(0, flat, x.reshape(-1))[:size].reshape(scatter_shape)
        if scatter_shape != shape:
            out = torch.zeros(shape, dtype=x.dtype, device=x.device)
            out[tuple(slice(0, v) for v in inferred)] = y
            y = out
        return y

    return run
