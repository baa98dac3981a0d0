"""Torch kernels: GridSample (16+, N-d; and com.microsoft's 4-D one), AffineGrid, DeformConv,
RoiAlign.

All three sample an image at fractional positions. As in the CPU provider, every
interpolation tap becomes one flat index tensor and one weight tensor over all output
positions, gathered from a channels-last copy of the image and accumulated (2**r taps for
linear, 4**r for cubic), so the work is a fixed number of device ops with no host syncs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cuda._util import attr_str, compute_dtype, ints
from onnxkiln.providers.cuda.dtypes import FLOATS, SERVED, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor

_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic",
          "cubic": "cubic"}
_MS_MODES = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_PADDINGS = frozenset({"zeros", "border", "reflection"})
_CUBIC_A = -0.75
_WIDE_INTS = (torch.int32, torch.int64)


def _reflect(x: Tensor, lo: float, hi: float) -> Tensor:
    """Reflect coordinates into [lo, hi] by repeated reflection at the borders."""
    span = hi - lo
    if span <= 0:
        return torch.full_like(x, lo)
    below = x < lo
    d = torch.where(below, lo - x, x - hi)
    n = torch.trunc(d / span)
    r = d - n * span
    even = torch.fmod(n, 2) == 0
    y = torch.where(below, torch.where(even, lo + r, hi - r), torch.where(even, hi - r, lo + r))
    return torch.where(below | (x > hi), y, x)


def _cubic_weights(t: Tensor) -> list[Tensor]:
    """Keys cubic weights (a = -0.75) of the taps at floor-1 .. floor+2 for fraction t."""
    a = _CUBIC_A
    out = []
    for d in (t + 1.0, t, 1.0 - t, 2.0 - t):
        d2, d3 = d * d, d * d * d
        near = (a + 2.0) * d3 - (a + 3.0) * d2 + 1.0
        far = a * d3 - 5.0 * a * d2 + 8.0 * a * d - 4.0 * a
        out.append(torch.where(d <= 1.0, near, far))
    return out


def _axis_taps(x: Tensor, size: int, mode: str, padding: str, align_corners: bool):
    """(index, weight) pairs for one spatial axis; weights are None when they are all 1."""
    lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
    if mode == "nearest":
        x = torch.round(x)  # half to even, as numpy's rint
    if padding == "border" and mode != "cubic":  # cubic clamps each tap instead
        x = x.clamp(0, size - 1)
    elif padding == "reflection":
        x = _reflect(x, lo, hi)
    if mode == "nearest":
        taps = [(x, None)]
    else:
        fl = torch.floor(x)
        if mode == "linear":
            frac = x - fl
            taps = [(fl, 1.0 - frac), (fl + 1.0, frac)]
        else:
            taps = list(zip((fl - 1.0, fl, fl + 1.0, fl + 2.0), _cubic_weights(x - fl)))
    out = []
    for pos, w in taps:
        if padding == "zeros":
            valid = (pos >= 0) & (pos <= size - 1)
            w = valid.to(x.dtype) if w is None else torch.where(valid, w, 0.0)
            idx = pos.clamp(0, max(size - 1, 0))
        elif padding == "border":
            idx = pos.clamp(0, size - 1)
        else:
            idx = _reflect(pos, lo, hi).clamp(0, size - 1)
        out.append((idx.long(), w))
    return out


def _gather_sum(xt: Tensor, axis_taps, sizes, out_dtype: torch.dtype) -> Tensor:
    """Sum over tap combinations of weight * xt[b, flat index, :]; xt is channels-last
    (B, P, C) so each gather reads contiguous rows. Returns (B, Q, C)."""
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    nb, _, c = xt.shape
    acc = None
    for combo in itertools.product(*axis_taps):
        flat = combo[0][0] * strides[0]
        weight = combo[0][1]
        for (idx, w), st in zip(combo[1:], strides[1:]):
            flat = flat + idx * st
            if w is not None:
                weight = w if weight is None else weight * w
        flat = flat.reshape(nb, -1, 1)
        g = torch.gather(xt, 1, flat.expand(nb, flat.shape[1], c)).to(out_dtype)
        if weight is not None:
            g = g * weight.reshape(nb, -1, 1).to(out_dtype)
        acc = g if acc is None else acc + g
    return acc


def _finish(y: Tensor, dtype: torch.dtype) -> Tensor:
    """The accumulated samples in the input's dtype (integers truncated and saturated)."""
    if y.dtype == dtype:
        return y
    if dtype == torch.bool:
        return y != 0
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        y = torch.trunc(y).clamp(info.min, info.max)
    return y.to(dtype)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float math for the image: low floats in float32, wide ints in float64."""
    if dtype.is_floating_point:
        return compute_dtype(dtype)
    return torch.float64 if dtype in _WIDE_INTS else torch.float32


def _grid_sampler(mode: str, padding: str, align: bool, max_rank: int | None,
                  op: str) -> Callable[[Tensor, Tensor], Tensor]:
    def run(x: Tensor, grid: Tensor) -> Tensor:
        r = x.ndim - 2
        if r < 1 or (max_rank is not None and r != max_rank):
            raise ValueError(f"{op}: X must be (N, C, D1, ...)"
                             f"{' with 2 spatial axes' if max_rank else ''}; got {tuple(x.shape)}")
        n, c = x.shape[:2]
        if grid.shape[0] != n or grid.ndim != r + 2 or grid.shape[-1] != r:
            raise ValueError(f"{op}: grid must be (N={n}, *out, {r}); got {tuple(grid.shape)}")
        sizes = tuple(x.shape[2:])
        out_sp = tuple(grid.shape[1:-1])
        if math.prod(sizes) == 0 or math.prod(out_sp) == 0:
            return torch.zeros((n, c, *out_sp), dtype=x.dtype, device=x.device)
        gdt = torch.float64 if grid.dtype == torch.float64 else torch.float32
        g = grid.reshape(n, -1, r).to(gdt)
        taps = []
        for d in range(r):  # grid[..., 0] addresses the last spatial axis
            size, v = sizes[d], g[:, :, r - 1 - d]
            pos = (v + 1.0) / 2.0 * (size - 1) if align else ((v + 1.0) * size - 1.0) / 2.0
            taps.append(_axis_taps(pos, size, mode, padding, align))
        xt = x.reshape(n, c, -1).transpose(1, 2).contiguous()  # (N, P, C)
        exact = mode == "nearest" and padding != "zeros"  # plain copies, no weights
        y = _gather_sum(xt, taps, sizes, x.dtype if exact else _work_dtype(x.dtype))
        return _finish(y.transpose(1, 2).reshape(n, c, *out_sp), x.dtype)

    return run


def _grid_supports(modes: dict[str, str]) -> Callable[[NodeInfo], str | None]:
    def extra(info: NodeInfo) -> str | None:
        mode = (attr_str(info.attrs.get("mode")) or "linear").lower()
        if mode not in modes:
            return f"GridSample: mode {mode!r} is not one of {sorted(modes)}"
        padding = attr_str(info.attrs.get("padding_mode")) or "zeros"
        if padding not in _PADDINGS:
            return f"GridSample: padding_mode {padding!r} is not zeros, border or reflection"
        return None

    return needs(SERVED, extra=extra)


@kernel("GridSample", since=16, factory=True, supports=_grid_supports(_MODES))
def grid_sample(info: NodeInfo) -> Callable[[Tensor, Tensor], Tensor]:
    """N-d (4-D before opset 20) linear/nearest/cubic sampling with zeros/border/reflection
    padding; integer images are sampled in float and truncated back."""
    mode = _MODES[(attr_str(info.attrs.get("mode")) or "linear").lower()]
    padding = attr_str(info.attrs.get("padding_mode")) or "zeros"
    align = bool(info.attrs.get("align_corners") or 0)
    return _grid_sampler(mode, padding, align, 2 if info.opset < 20 else None, "GridSample")


@kernel("GridSample", since=1, domain="com.microsoft", factory=True,
        supports=_grid_supports(_MS_MODES))
def grid_sample_ms(info: NodeInfo) -> Callable[[Tensor, Tensor], Tensor]:
    """com.microsoft GridSample on 4-D X: bilinear (default), nearest or bicubic."""
    mode = _MS_MODES[(attr_str(info.attrs.get("mode")) or "bilinear").lower()]
    padding = attr_str(info.attrs.get("padding_mode")) or "zeros"
    align = bool(info.attrs.get("align_corners") or 0)
    return _grid_sampler(mode, padding, align, 2, "GridSample")


@kernel("AffineGrid", since=20, host_inputs=(1,), supports=needs(FLOATS, skip_inputs=(1,)))
def affine_grid(theta: Tensor, size, *, align_corners) -> Tensor:
    """theta (N, 2, 3) or (N, 3, 4) applied to a [-1, 1] grid of the host `size`.

    A length-1 axis sits at 0 with either align_corners, as in PyTorch and the CPU provider.
    """
    dims = ints(size)
    r = len(dims) - 2
    if r not in (2, 3) or theta.ndim != 3 or tuple(theta.shape[1:]) != (r, r + 1):
        raise ValueError(f"AffineGrid: size must be (N, C, H, W) or (N, C, D, H, W) and theta "
                         f"(N, {r}, {r + 1}); got size {dims} and theta {tuple(theta.shape)}")
    if theta.shape[0] != dims[0]:
        raise ValueError(f"AffineGrid: theta has {theta.shape[0]} matrices, size says N={dims[0]}")
    cdt, dev = compute_dtype(theta.dtype), theta.device
    lines = []
    for length in dims[2:]:  # spatial order D, H, W
        if align_corners:
            v = torch.linspace(-1.0, 1.0, length, dtype=torch.float64, device=dev) \
                if length > 1 else torch.zeros(length, dtype=torch.float64, device=dev)
        else:
            v = (2.0 * torch.arange(length, dtype=torch.float64, device=dev) + 1.0) / length - 1.0
        lines.append(v.to(cdt))
    mesh = torch.meshgrid(*lines, indexing="ij")
    base = torch.stack([*reversed(mesh), torch.ones_like(mesh[0])], dim=-1).reshape(-1, r + 1)
    grid = torch.matmul(base[None], theta.to(cdt).transpose(1, 2))  # (N, P, r)
    return grid.reshape(dims[0], *dims[2:], r).to(theta.dtype)


def _pos_ints(info: NodeInfo, name: str) -> int:
    v = int(info.attrs.get(name) or 1)
    if v < 1:
        raise ValueError(f"DeformConv: {name} must be positive, got {v}")
    return v


def _per_axis(value, n: int, default: int, what: str) -> tuple[int, ...]:
    if value is None:
        return (default,) * n
    out = tuple(int(v) for v in value)
    if len(out) != n:
        raise ValueError(f"DeformConv: {what} must have {n} entries, got {list(out)}")
    return out


@kernel("DeformConv", since=19, factory=True, supports=needs(FLOATS))
def deform_conv(info: NodeInfo) -> Callable[..., Tensor]:
    """Bilinear samples at offset kernel taps (zero outside), masked, then a batched GEMM."""
    attrs = dict(info.attrs)
    group, offset_group = _pos_ints(info, "group"), _pos_ints(info, "offset_group")

    def run(x: Tensor, w: Tensor, offset: Tensor, b: Tensor | None = None,
            mask: Tensor | None = None) -> Tensor:
        r = x.ndim - 2
        if r < 1 or w.ndim != x.ndim:
            raise ValueError(f"DeformConv: X (N, C, D1, ...) and W (oC, C/group, k1, ...) must "
                             f"have the same rank; got {tuple(x.shape)} and {tuple(w.shape)}")
        n, c = x.shape[:2]
        oc, cg = w.shape[:2]
        k = tuple(int(v) for v in (attrs.get("kernel_shape") or w.shape[2:]))
        if c % group or oc % group or cg * group != c or c % offset_group:
            raise ValueError(f"DeformConv: channels C={c}, oC={oc}, W {tuple(w.shape)} do not "
                             f"fit group={group} and offset_group={offset_group}")
        strides = _per_axis(attrs.get("strides"), r, 1, "strides")
        dil = _per_axis(attrs.get("dilations"), r, 1, "dilations")
        pads = _per_axis(attrs.get("pads"), 2 * r, 0, "pads")
        sizes = tuple(x.shape[2:])
        out_sp = tuple((sizes[i] + pads[i] + pads[r + i] - dil[i] * (k[i] - 1) - 1) // strides[i]
                       + 1 for i in range(r))
        kk, q = math.prod(k), math.prod(out_sp)
        want = (n, offset_group * kk * r, *out_sp)
        if tuple(offset.shape) != want:
            raise ValueError(f"DeformConv: offset must have shape {want}, got "
                             f"{tuple(offset.shape)}")
        if mask is not None and tuple(mask.shape) != (n, offset_group * kk, *out_sp):
            raise ValueError(f"DeformConv: mask must have shape "
                             f"{(n, offset_group * kk, *out_sp)}, got {tuple(mask.shape)}")
        cdt, dev = compute_dtype(x.dtype), x.device
        off = offset.reshape(n, offset_group, kk, r, q).to(cdt)
        grids = torch.meshgrid(*(torch.arange(v, device=dev) for v in out_sp), indexing="ij")
        kpos = torch.meshgrid(*(torch.arange(v, device=dev) for v in k), indexing="ij")
        taps = []
        for d in range(r):
            base = (grids[d].reshape(1, q) * strides[d] - pads[d]
                    + kpos[d].reshape(kk, 1) * dil[d]).to(cdt)
            pos = (base[None, None] + off[:, :, :, d]).reshape(n, offset_group, kk * q)
            taps.append(_axis_taps(pos, sizes[d], "linear", "zeros", True))
        if mask is not None:
            m = mask.reshape(n, offset_group, kk * q).to(cdt)
            taps[0] = [(idx, wt * m) for idx, wt in taps[0]]
        cpg = c // offset_group
        xt = x.reshape(n * offset_group, cpg, -1).transpose(1, 2).to(cdt)  # (B, P, C/og)
        cols = _gather_sum(xt, taps, sizes, cdt)  # (N*og, K*Q, C/og)
        cols = cols.reshape(n, offset_group, kk, q, cpg).permute(0, 1, 4, 2, 3)
        cols = cols.reshape(n, group, cg * kk, q)
        wm = w.reshape(group, oc // group, cg * kk).to(cdt)
        y = torch.matmul(wm[None], cols).reshape(n, oc, *out_sp)
        if b is not None:
            y = y + b.to(cdt).reshape(1, oc, *([1] * r))
        return y.to(x.dtype)

    return run


def _roi_axis(start: Tensor, bin_size: Tensor, grid: Tensor, pooled: int, size: int,
              most: int):
    """Bilinear taps of one axis for every RoI, each (R, pooled * most): low, high, their
    weights, whether the sample is in range and whether it exists (s < the RoI's grid)."""
    dev, nr = start.device, start.shape[0]
    p = torch.arange(pooled, dtype=torch.float64, device=dev)[None, :, None]
    s = torch.arange(most, dtype=torch.float64, device=dev)[None, None, :]
    b = bin_size[:, None, None]
    g = grid.clamp_min(1).double()[:, None, None]
    pos = start[:, None, None] + p * b + (s + 0.5) * b / g
    exists = (s < grid[:, None, None]).expand(pos.shape).reshape(nr, -1)
    pos = pos.reshape(nr, -1)
    valid = exists & (pos >= -1.0) & (pos <= size)
    pos = pos.clamp_min(0.0)
    low = torch.floor(pos).long()
    edge = low >= size - 1
    low = low.clamp_max(size - 1)
    high = torch.where(edge, low, low + 1)
    frac = torch.where(edge, low.double(), pos) - low
    return low, high, 1.0 - frac, frac, valid, exists


def _roi_grids(boxes: Tensor, oh: int, ow: int, ratio: int, half: bool):
    """Per RoI: (y1, x1, bin height, bin width, samples per bin in y, in x)."""
    x1, y1, x2, y2 = boxes.unbind(1)
    rw, rh = x2 - x1, y2 - y1
    if not half:
        rw, rh = rw.clamp_min(1.0), rh.clamp_min(1.0)
    bh, bw = rh / oh, rw / ow
    if ratio > 0:
        gh = gw = torch.full(bh.shape, ratio, dtype=torch.int64, device=boxes.device)
    else:
        gh, gw = torch.ceil(rh / oh).long(), torch.ceil(rw / ow).long()
    return y1, x1, bh, bw, gh.clamp_min(0), gw.clamp_min(0)


def _roi_supports(info: NodeInfo) -> str | None:
    mode = attr_str(info.attrs.get("mode")) or "avg"
    if mode not in ("avg", "max"):
        return f"RoiAlign: mode {mode!r} is not avg or max"
    ctm = attr_str(info.attrs.get("coordinate_transformation_mode")) or "output_half_pixel"
    if ctm not in ("half_pixel", "output_half_pixel"):
        return f"RoiAlign: coordinate_transformation_mode {ctm!r} is not a known one"
    return None


@kernel("RoiAlign", since=10, factory=True, capture=CaptureSupport.HOST_SYNC,
        supports=needs(FLOATS | {DataType.INT64}, extra=_roi_supports))
def roi_align(info: NodeInfo) -> Callable[..., Tensor]:
    """avg or max (onnxruntime's: the max over samples of the largest weighted corner) over
    each bin's bilinear samples, every RoI's samples laid out on the device, padded to the
    largest grid, and gathered in one pass per corner. sampling_ratio > 0 fixes the grid
    and runs without a sync; sampling_ratio = 0 (adaptive) reads the largest grid (and
    checks batch_indices) on the host. With a fixed grid a batch index outside [0, N)
    gives that RoI zeros (the CPU provider raises)."""
    attrs = dict(info.attrs)
    use_max = (attr_str(attrs.get("mode")) or "avg") == "max"
    half = attr_str(attrs.get("coordinate_transformation_mode")) == "half_pixel"
    oh, ow = int(attrs.get("output_height") or 1), int(attrs.get("output_width") or 1)
    ratio = int(attrs.get("sampling_ratio") or 0)
    scale = float(attrs.get("spatial_scale") if attrs.get("spatial_scale") is not None else 1.0)

    def run(x: Tensor, rois: Tensor, batch_indices: Tensor) -> Tensor:
        if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4:
            raise ValueError(f"RoiAlign: X must be (N, C, H, W) and rois (R, 4); got "
                             f"{tuple(x.shape)} and {tuple(rois.shape)}")
        nr, (n, c, h, w) = rois.shape[0], x.shape
        bidx = batch_indices.reshape(-1).long()
        if bidx.shape[0] != nr:
            raise ValueError(f"RoiAlign: batch_indices has {bidx.shape[0]} values for {nr} rois")
        boxes = rois.double() * scale - (0.5 if half else 0.0)
        y1, x1, bh, bw, gh, gw = _roi_grids(boxes, oh, ow, ratio, half)
        if nr and ratio <= 0:  # the adaptive grid sizes the layout: one sync
            lo, hi, mh, mw = (int(v) for v in torch.stack(
                [bidx.min(), bidx.max(), gh.max(), gw.max()]).tolist())
            if lo < 0 or hi >= n:
                raise IndexError(f"RoiAlign: batch_indices must lie in [0, {n}), got "
                                 f"[{lo}, {hi}]")
        else:
            mh = mw = ratio
        if nr == 0 or mh == 0 or mw == 0:
            return torch.zeros((nr, c, oh, ow), dtype=x.dtype, device=x.device)
        return _roi_pool(x, bidx, _roi_axis(y1, bh, gh, oh, h, mh),
                         _roi_axis(x1, bw, gw, ow, w, mw), gh * gw, (oh, ow, mh, mw), use_max)

    return run


def _roi_pool(x: Tensor, bidx: Tensor, ty, tx, count: Tensor, dims, use_max: bool) -> Tensor:
    """(R, C, oh, ow): the four corners' weighted samples summed (or max-ed), then averaged
    (or max-ed) over each bin's existing samples."""
    oh, ow, mh, mw = dims
    n, c, h, w = x.shape
    nr = bidx.shape[0]
    cdt = compute_dtype(x.dtype)
    ylo, yhi, wylo, wyhi, vy, ey = ty
    xlo, xhi, wxlo, wxhi, vx, ex = tx
    ok_b = (bidx >= 0) & (bidx < n)
    valid = vy[:, :, None] & vx[:, None, :] & ok_b[:, None, None]
    img = x.permute(0, 2, 3, 1).reshape(-1, c).to(cdt)  # (N*H*W, C) rows
    base = (bidx.clamp(0, n - 1) * (h * w))[:, None, None]
    best = None
    for rows, wy in ((ylo, wylo), (yhi, wyhi)):
        for cols, wx in ((xlo, wxlo), (xhi, wxhi)):
            flat = base + rows[:, :, None] * w + cols[:, None, :]
            wgt = torch.where(valid, wy[:, :, None] * wx[:, None, :], 0.0).to(cdt)
            v = img[flat] * wgt[..., None]  # (R, oh*mh, ow*mw, C)
            best = v if best is None else torch.maximum(best, v) if use_max else best + v
    cells = best.reshape(nr, oh, mh, ow, mw, c)
    exists = (ey[:, :, None] & ex[:, None, :]).reshape(nr, oh, mh, ow, mw, 1)
    if use_max:
        pooled = cells.masked_fill(~exists, -torch.inf).amax(dim=(2, 4))
        pooled = pooled.masked_fill((count == 0).reshape(nr, 1, 1, 1), 0.0)
    else:
        div = count.clamp_min(1).to(cdt).reshape(nr, 1, 1, 1)
        pooled = cells.masked_fill(~exists, 0).sum(dim=(2, 4)) / div
    return pooled.permute(0, 3, 1, 2).to(x.dtype).contiguous()
