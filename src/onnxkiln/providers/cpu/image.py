"""CPU kernels: SpaceToDepth, DepthToSpace, CenterCropPad, Col2Im, ImageDecoder.

Importing this module also registers the image kernels kept in sibling modules:
resize.py (Resize, Upsample), gridsample.py (GridSample, AffineGrid, DeformConv) and
detection.py (RoiAlign, NonMaxSuppression).
"""

from __future__ import annotations

import io
import math

import numpy as np

from onnxkiln.ops.attrs import attr_str, norm_axes
from onnxkiln.ops.window import int_tuple
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu._tensor_util import to_ints
from onnxkiln.providers.cpu.registry import kernel

__all__ = ["center_crop_pad", "col2im", "depth_to_space", "image_decoder", "space_to_depth"]


def _fresh(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    return y.copy() if np.may_share_memory(y, x) else y


def _block_mode(mode, op: str) -> str:
    m = (attr_str(mode) or "DCR").upper()
    if m not in ("DCR", "CRD"):
        raise ValueError(f"{op}: mode must be 'DCR' or 'CRD', got {mode!r}")
    return m


@kernel("SpaceToDepth", since=1, variant="spacetodepth.transpose")
def space_to_depth(x: np.ndarray, *, blocksize, mode) -> np.ndarray:
    """SpaceToDepth: (N, C, H, W) -> (N, C*b*b, H/b, W/b); DCR (default) or CRD (opset 28)."""
    b = int(blocksize)
    if x.ndim != 4 or b < 1 or x.shape[2] % b or x.shape[3] % b:
        raise ValueError(f"SpaceToDepth: input must be 4-D with H and W divisible by blocksize "
                         f"{b}; got shape {x.shape}")
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b)
    perm = (0, 3, 5, 1, 2, 4) if _block_mode(mode, "SpaceToDepth") == "DCR" else (0, 1, 3, 5, 2, 4)
    return _fresh(t.transpose(perm).reshape(n, c * b * b, h // b, w // b), x)


@kernel("DepthToSpace", since=1, variant="depthtospace.transpose")
def depth_to_space(x: np.ndarray, *, blocksize, mode) -> np.ndarray:
    """DepthToSpace: (N, C, H, W) -> (N, C/(b*b), H*b, W*b) in DCR (default) or CRD order."""
    b = int(blocksize)
    if x.ndim != 4 or b < 1 or x.shape[1] % (b * b):
        raise ValueError(f"DepthToSpace: input must be 4-D with C divisible by blocksize**2 "
                         f"({b * b}); got shape {x.shape}")
    n, c, h, w = x.shape
    cb = c // (b * b)
    if _block_mode(mode, "DepthToSpace") == "DCR":
        t = x.reshape(n, b, b, cb, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, cb, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return _fresh(t.reshape(n, cb, h * b, w * b), x)


@kernel("CenterCropPad", since=18, variant="centercroppad.numpy")
def center_crop_pad(x: np.ndarray, shape: np.ndarray, *, axes) -> np.ndarray:
    """CenterCropPad: crop (start rounded down) or zero-pad (extra pixel at the end) per axis."""
    target = to_ints(shape)
    ax = tuple(range(x.ndim)) if axes is None else norm_axes(tuple(axes), x.ndim, "CenterCropPad")
    if len(target) != len(ax):
        raise ValueError(f"CenterCropPad: shape has {len(target)} values for {len(ax)} axes")
    if any(t < 0 for t in target):
        raise ValueError(f"CenterCropPad: shape must be >= 0, got {list(target)}")
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
    if x.dtype == object:
        y = np.full(out_shape, "", dtype=object)
    else:
        y = np.zeros(out_shape, dtype=x.dtype)
    y[tuple(dst)] = x[tuple(src)]
    return y


@kernel("Col2Im", since=18, variant="col2im.strided_add")
def col2im(x: np.ndarray, image_shape: np.ndarray, block_shape: np.ndarray, *, dilations, pads,
           strides) -> np.ndarray:
    """Col2Im: sum column blocks (N, C*prod(block), L) back into images (N, C, *image_shape)."""
    img = to_ints(image_shape)
    blk = to_ints(block_shape)
    r = len(img)
    if len(blk) != r or x.ndim != 3:
        raise ValueError(f"Col2Im: input must be 3-D and image_shape/block_shape of equal length; "
                         f"got input {x.shape}, image_shape {list(img)}, block_shape {list(blk)}")
    dil = int_tuple(dilations, r, 1, "dilations")
    st = int_tuple(strides, r, 1, "strides")
    pd = int_tuple(pads, 2 * r, 0, "pads")
    kk = math.prod(blk)
    n, ck, total = x.shape
    if kk == 0 or ck % kk:
        raise ValueError(f"Col2Im: input dim 1 ({ck}) must be a multiple of prod(block_shape) "
                         f"({kk})")
    c = ck // kk
    padded = [img[i] + pd[i] + pd[r + i] for i in range(r)]
    counts = [(padded[i] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(r)]
    if math.prod(counts) != total or any(v <= 0 for v in counts):
        raise ValueError(f"Col2Im: input has {total} blocks but image_shape {list(img)}, "
                         f"block_shape {list(blk)}, pads, strides and dilations give {counts}")
    acc_dtype = np.dtype(np.float32) if x.dtype.kind == "V" or x.dtype == np.float16 else x.dtype
    if x.dtype == np.bool_:
        acc_dtype = np.dtype(np.bool_)
    out = np.zeros((n, c, *padded), dtype=acc_dtype)
    cols = x.reshape(n, c, *blk, *counts)
    for pos in np.ndindex(*blk):
        window = tuple(slice(pos[i] * dil[i], pos[i] * dil[i] + st[i] * (counts[i] - 1) + 1, st[i])
                       for i in range(r))
        src = cols[(slice(None), slice(None), *pos)]
        if acc_dtype == np.bool_:
            np.logical_or(out[(slice(None), slice(None), *window)], src,
                          out=out[(slice(None), slice(None), *window)])
        else:
            out[(slice(None), slice(None), *window)] += src
    crop = tuple(slice(pd[i], pd[i] + img[i]) for i in range(r))
    y = out[(slice(None), slice(None), *crop)]
    return np.ascontiguousarray(y).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------- ImageDecoder


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "ImageDecoder needs Pillow, an optional dependency of onnxkiln: install it with "
            "`pip install Pillow` (or `pip install onnxkiln[image]`)"
        ) from None
    return Image


@kernel("ImageDecoder", since=20, factory=True, capture=CaptureSupport.DATA_DEPENDENT_SHAPE,
        variant="imagedecoder.pillow")
def image_decoder(info: NodeInfo):
    """ImageDecoder: decode BMP/JPEG/PNG/TIFF/WebP/PNM... bytes to (H, W, C) uint8 via Pillow."""
    fmt = attr_str(info.attrs.get("pixel_format")) or "RGB"
    if fmt not in ("RGB", "BGR", "Grayscale"):
        raise ValueError(f"ImageDecoder: pixel_format must be RGB, BGR or Grayscale, got {fmt!r}")
    image_mod = _pillow()
    channels = 1 if fmt == "Grayscale" else 3

    def run(stream: np.ndarray) -> np.ndarray:
        data = np.ascontiguousarray(stream, dtype=np.uint8).tobytes()
        try:
            with image_mod.open(io.BytesIO(data)) as im:
                im = im.convert("L" if fmt == "Grayscale" else "RGB")
                arr = np.asarray(im, dtype=np.uint8)
        except Exception:  # the spec: an undecodable stream gives an empty matrix
            return np.zeros((0, 0, channels), dtype=np.uint8)
        if fmt == "Grayscale":
            return np.ascontiguousarray(arr.reshape(*arr.shape[:2], 1))
        if fmt == "BGR":
            arr = arr[:, :, ::-1]
        return np.ascontiguousarray(arr)

    return run
