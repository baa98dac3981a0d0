"""CPU kernels: GridSample (16-22, N-d), AffineGrid (20), DeformConv (19-22).

All three sample an image at fractional positions. Sampling is vectorised over every
output position: each interpolation tap becomes one flat index array and one weight array,
gathered with `take_along_axis` and accumulated (2**r taps for linear, 4**r for cubic).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from onnxkiln.ops.attrs import attr_str
from onnxkiln.ops.window import int_tuple
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._window import compute_dtype
from onnxkiln.providers.cpu.registry import kernel
from onnxkiln.schema import positive_int_attr

__all__ = ["affine_grid", "deform_conv", "grid_sample"]

_F32 = np.dtype(np.float32)
_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic",
          "cubic": "cubic"}
_PADDINGS = frozenset({"zeros", "border", "reflection"})
_CUBIC_A = -0.75


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect coordinates into [lo, hi] by repeated reflection at the borders."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below = x < lo
    d = np.where(below, lo - x, x - hi)
    n = np.trunc(d / span)
    r = d - n * span
    even = np.fmod(n, 2) == 0
    inside_lo, inside_hi = lo + r, hi - r
    y = np.where(below, np.where(even, inside_lo, inside_hi), np.where(even, inside_hi, inside_lo))
    return np.where(below | (x > hi), y, x)


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """Keys cubic weights (a = -0.75) of the taps at floor-1 .. floor+2 for fraction t."""
    a = _CUBIC_A
    out = []
    for d in (t + 1.0, t, 1.0 - t, 2.0 - t):
        d2, d3 = d * d, d * d * d
        near = (a + 2.0) * d3 - (a + 3.0) * d2 + 1.0
        far = a * d3 - 5.0 * a * d2 + 8.0 * a * d - 4.0 * a
        out.append(np.where(d <= 1.0, near, far))
    return out


def _axis_taps(x: np.ndarray, size: int, mode: str, padding: str, align_corners: bool):
    """(index, weight) pairs for one spatial axis; weights are None when they are all 1."""
    lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
    if mode == "nearest":
        x = np.rint(x)
    if padding == "border" and mode != "cubic":  # cubic clamps each tap instead
        x = np.clip(x, 0, size - 1)
    elif padding == "reflection":
        x = _reflect(x, lo, hi)
    if mode == "nearest":
        taps = [(x, None)]
    else:
        fl = np.floor(x)
        if mode == "linear":
            frac = x - fl
            taps = [(fl, 1.0 - frac), (fl + 1.0, frac)]
        else:
            taps = list(zip((fl - 1.0, fl, fl + 1.0, fl + 2.0), _cubic_weights(x - fl)))
    out = []
    for pos, w in taps:
        if padding == "zeros":
            valid = (pos >= 0) & (pos <= size - 1)
            w = valid.astype(x.dtype) if w is None else np.where(valid, w, 0)
            idx = np.clip(pos, 0, max(size - 1, 0))
        elif padding == "border":
            idx = np.clip(pos, 0, size - 1)
        else:
            idx = np.clip(_reflect(pos, lo, hi), 0, size - 1)
        out.append((idx.astype(np.intp), w))
    return out


def _gather_sum(xt: np.ndarray, axis_taps, sizes, out_dtype: np.dtype) -> np.ndarray:
    """Sum over tap combinations of weight * xt[b, flat index, :]; xt is channels-last
    (B, P, C) so each gather copies contiguous rows. Returns (B, Q, C)."""
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    nb = xt.shape[0]
    acc = None
    for combo in itertools.product(*axis_taps):
        flat = combo[0][0] * strides[0]
        weight = combo[0][1]
        for (idx, w), st in zip(combo[1:], strides[1:]):
            flat = flat + idx * st
            if w is not None:
                weight = w if weight is None else weight * w
        flat = flat.reshape(nb, -1)
        g = np.stack([xt[b].take(flat[b], axis=0) for b in range(nb)]) if nb != 1 else \
            xt[0].take(flat[0], axis=0)[None]
        if g.dtype != out_dtype:
            g = g.astype(out_dtype)
        if weight is not None:
            g *= weight.reshape(nb, -1, 1).astype(out_dtype, copy=False)
        if acc is None:
            acc = g
        else:
            acc += g
    return acc


def _finish(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if y.dtype == dtype:
        return y
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        y = np.clip(np.trunc(y), info.min, info.max)
    elif dtype.kind == "b":
        y = y != 0
    return y.astype(dtype)


@kernel("GridSample", since=16, factory=True, variant="gridsample.gather")
def grid_sample(info: NodeInfo):
    """GridSample: N-d linear/nearest/cubic sampling with zeros/border/reflection padding."""
    attrs = dict(info.attrs)
    mode_name = (attr_str(attrs.get("mode")) or "linear").lower()
    if mode_name not in _MODES:
        raise ValueError(f"GridSample: mode must be linear, nearest or cubic; got {mode_name!r}")
    mode = _MODES[mode_name]
    padding = attr_str(attrs.get("padding_mode")) or "zeros"
    if padding not in _PADDINGS:
        raise ValueError(f"GridSample: padding_mode must be zeros, border or reflection; "
                         f"got {padding!r}")
    align = bool(attrs.get("align_corners") or 0)
    max_rank = 2 if info.opset < 20 else None

    def run(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
        r = x.ndim - 2
        if r < 1 or (max_rank is not None and r != max_rank):
            raise ValueError(f"GridSample-{info.opset}: X must be (N, C, D1, ...) "
                             f"{'with 2 spatial axes ' if max_rank else ''}; got {x.shape}")
        n, c = x.shape[:2]
        if grid.shape[0] != n or grid.ndim != r + 2 or grid.shape[-1] != r:
            raise ValueError(f"GridSample: grid must be (N={n}, *out, {r}); got {grid.shape}")
        sizes = x.shape[2:]
        out_sp = grid.shape[1:-1]
        gdt = np.dtype(np.float64) if grid.dtype == np.float64 else _F32
        g = grid.reshape(n, -1, r).astype(gdt)
        taps = []
        for d in range(r):  # grid[..., 0] addresses the last spatial axis
            size = sizes[d]
            v = g[:, :, r - 1 - d]
            if align:
                pos = (v + 1.0) / 2.0 * (size - 1)
            else:
                pos = ((v + 1.0) * size - 1.0) / 2.0
            taps.append(_axis_taps(pos, size, mode, padding, align))
        cdt = compute_dtype(x.dtype) if x.dtype.kind in "fc" or x.dtype.kind == "V" else _F32
        if x.dtype.kind in "iu" and x.dtype.itemsize >= 4:
            cdt = np.dtype(np.float64)
        if math.prod(sizes) == 0 or math.prod(out_sp) == 0:
            return np.zeros((n, c, *out_sp), dtype=x.dtype)
        xt = np.ascontiguousarray(x.reshape(n, c, -1).transpose(0, 2, 1))  # (N, P, C)
        if mode == "nearest" and padding != "zeros":
            y = _gather_sum(xt, taps, sizes, x.dtype)
        else:
            y = _gather_sum(xt, taps, sizes, cdt)
        y = np.ascontiguousarray(y.transpose(0, 2, 1))
        return _finish(y.reshape(n, c, *out_sp), x.dtype)

    return run


@kernel("AffineGrid", since=20, variant="affinegrid.numpy")
def affine_grid(theta: np.ndarray, size: np.ndarray, *, align_corners) -> np.ndarray:
    """AffineGrid: theta (N, 2, 3) or (N, 3, 4) applied to a [-1, 1] grid of `size`.

    A length-1 axis sits at 0 with either align_corners, as in PyTorch (onnxruntime puts it
    at 1 and the ONNX reference at -1 when align_corners=1).
    """
    dims = [int(v) for v in np.asarray(size).reshape(-1)]
    r = len(dims) - 2
    if r not in (2, 3) or theta.ndim != 3 or theta.shape[1:] != (r, r + 1):
        raise ValueError(f"AffineGrid: size must be (N, C, H, W) or (N, C, D, H, W) and theta "
                         f"(N, {r}, {r + 1}); got size {dims} and theta {theta.shape}")
    if theta.shape[0] != dims[0]:
        raise ValueError(f"AffineGrid: theta has {theta.shape[0]} matrices, size says N={dims[0]}")
    cdt = compute_dtype(theta.dtype)
    lines = []
    for length in reversed(dims[2:]):  # x (last axis) first
        if align_corners:
            v = np.linspace(-1.0, 1.0, length) if length > 1 else np.zeros(length)
        else:
            v = (2.0 * np.arange(length) + 1.0) / length - 1.0
        lines.append(v.astype(cdt))
    mesh = np.meshgrid(*reversed(lines), indexing="ij")  # spatial order D, H, W
    base = np.stack([*reversed(mesh), np.ones_like(mesh[0])], axis=-1).reshape(-1, r + 1)
    t = theta.astype(cdt)
    grid = np.matmul(base[None], np.swapaxes(t, 1, 2))  # (N, P, r)
    return grid.reshape(dims[0], *dims[2:], r).astype(theta.dtype, copy=False)


@kernel("DeformConv", since=19, factory=True, variant="deformconv.gather_gemm")
def deform_conv(info: NodeInfo):
    """DeformConv: bilinear samples at offset kernel taps (zero outside), masked, then a GEMM."""
    attrs = dict(info.attrs)
    group = positive_int_attr(attrs, "group", "DeformConv")
    offset_group = positive_int_attr(attrs, "offset_group", "DeformConv")

    def run(x, w, offset, b=None, mask=None):
        r = x.ndim - 2
        if r < 1 or w.ndim != x.ndim:
            raise ValueError(f"DeformConv: X (N, C, D1, ...) and W (oC, C/group, k1, ...) must "
                             f"have the same rank; got {x.shape} and {w.shape}")
        n, c = x.shape[:2]
        oc, cg = w.shape[:2]
        k = tuple(int(v) for v in (attrs.get("kernel_shape") or w.shape[2:]))
        if c % group or oc % group or cg * group != c or c % offset_group:
            raise ValueError(f"DeformConv: channels C={c}, oC={oc}, W {w.shape} do not fit "
                             f"group={group} and offset_group={offset_group}")
        strides = int_tuple(attrs.get("strides"), r, 1, "strides")
        dil = int_tuple(attrs.get("dilations"), r, 1, "dilations")
        pads = int_tuple(attrs.get("pads"), 2 * r, 0, "pads")
        sizes = x.shape[2:]
        out_sp = tuple((sizes[i] + pads[i] + pads[r + i] - dil[i] * (k[i] - 1) - 1) // strides[i]
                       + 1 for i in range(r))
        kk, q = math.prod(k), math.prod(out_sp)
        want = (n, offset_group * kk * r, *out_sp)
        if offset.shape != want:
            raise ValueError(f"DeformConv: offset must have shape {want}, got {offset.shape}")
        if mask is not None and mask.shape != (n, offset_group * kk, *out_sp):
            raise ValueError(f"DeformConv: mask must have shape "
                             f"{(n, offset_group * kk, *out_sp)}, got {mask.shape}")
        cdt = compute_dtype(x.dtype)
        off = offset.reshape(n, offset_group, kk, r, q).astype(cdt)
        taps = []
        grids = np.meshgrid(*(np.arange(v) for v in out_sp), indexing="ij")
        kpos = np.meshgrid(*(np.arange(v) for v in k), indexing="ij")
        for d in range(r):
            base = (grids[d].reshape(1, q) * strides[d] - pads[d]
                    + kpos[d].reshape(kk, 1) * dil[d]).astype(cdt)
            pos = (base[None, None] + off[:, :, :, d]).reshape(n, offset_group, kk * q)
            taps.append(_axis_taps(pos, sizes[d], "linear", "zeros", True))
        if mask is not None:
            m = mask.reshape(n, offset_group, kk * q).astype(cdt)
            taps[0] = [(idx, wt * m) for idx, wt in taps[0]]
        cpg = c // offset_group
        xt = x.reshape(n * offset_group, cpg, -1).transpose(0, 2, 1).astype(cdt)  # (B, P, C/og)
        cols = _gather_sum(xt, taps, sizes, cdt)  # (N*og, K*Q, C/og)
        cols = cols.reshape(n, offset_group, kk, q, cpg).transpose(0, 1, 4, 2, 3)
        cols = cols.reshape(n, group, cg * kk, q)
        wm = w.reshape(group, oc // group, cg * kk).astype(cdt, copy=False)
        y = np.matmul(wm[None], cols).reshape(n, oc, *out_sp)
        if b is not None:
            y += b.astype(cdt).reshape(1, oc, *([1] * r))
        return y.astype(x.dtype, copy=False)

    return run
