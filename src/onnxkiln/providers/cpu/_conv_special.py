"""Conv specialised for one input signature (conv.py's `specialize`).

With constant weights and known shapes everything but the arithmetic is done once: the
geometry, the weight matrix in the layout its path wants, the bias, the thread split.

- 1x1 convs (one group): one GEMM per image, W (M, C) @ X (C, H*W), split over output
  columns across the pool; several images are split across the pool instead.
- im2col convs (one group): the output rows are cut into chunks; each chunk
  copies its own im2col columns and multiplies them, so the chunks run in parallel and the
  columns stay in cache; a column chunk of a product computes the same bits as the whole.
- depthwise 2-D convs with numba: `depthwise_planes` (stride-phase planes, long rows) or
  `depthwise_cl` (channels-last, small maps with many channels), channels split across the
  pool in blocks of 16.
- anything else keeps conv.py's runner for its plan kind, with the plan and prepared
  weights bound.

The bias and, for FusedConv, an activation (an `Epilogue`) are applied by one numba pass
over each image's output (`bias_act_rows`) or by the depthwise kernels as they write it:
numpy took one pass for the bias and one or two for the activation, each over an output
that is often larger than the L2 cache (MobileNet's 112x112 maps at batch 4: three passes
over 13 MB cost twice the 1x1 product itself).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from onnxkiln.ops.window import Geometry
from onnxkiln.pool import active_threads, parallel_for
from onnxkiln.providers.cpu import _gemm, _numba
from onnxkiln.providers.cpu._gemm import matmul_split, plan_split, split_ranges
from onnxkiln.providers.cpu._window import padded_copy

__all__ = ["CL_MAX_POSITIONS", "Epilogue", "depthwise_call", "epilogue_for", "finisher",
           "im2col_call", "one_by_one_call", "per_image_call"]

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _depthwise_signature(dt: np.dtype) -> tuple:
    """(x, w, bias, params, c0, c1, out) of both depthwise kernels (numba types, lazily)."""
    from numba import types

    f = types.float32 if dt == _F32 else types.float64
    i64 = types.int64
    return (types.Array(f, 4, "C", readonly=True), types.Array(f, 3, "C", readonly=True),
            types.Array(f, 1, "C", readonly=True), types.UniTuple(i64, 6), i64, i64,
            types.Array(f, 4, "C"))


def _bias_act_signature(dt: np.dtype) -> tuple:
    """(y, bias, code, a, b, c0, c1) of bias_act_rows."""
    from numba import types

    f = types.float32 if dt == _F32 else types.float64
    i64 = types.int64
    return (types.Array(f, 2, "C"), types.Array(f, 1, "C", readonly=True), i64, f, f, i64, i64)


_numba.register("bias_act_rows", "onnxkiln.providers.cpu._numba_conv", _bias_act_signature,
                (_F32, _F64), {"reassoc", "contract", "nsz", "arcp"})


def _silu_rows_signature(dt: np.dtype) -> tuple:
    """(y, r0, r1, c0, c1) of silu_rows."""
    from numba import types

    f = types.float32 if dt == _F32 else types.float64
    i64 = types.int64
    return (types.Array(f, 2, "C"), i64, i64, i64, i64)


_numba.register("silu_rows", "onnxkiln.providers.cpu._numba_act", _silu_rows_signature,
                (_F32, _F64), {"reassoc", "contract", "nsz", "arcp"})
SILU = 5
"""Epilogue code of SiLU: applied by `silu_rows` after the bias (it needs the block exp of
_numba_act, which the per-element `_act` of the conv kernels does not have)."""


def _depthwise_act_signature(dt: np.dtype) -> tuple:
    from numba import types

    f = types.float32 if dt == _F32 else types.float64
    return (*_depthwise_signature(dt), types.int64, f, f)


for _kind in ("planes", "cl"):
    _numba.register(f"depthwise_{_kind}", "onnxkiln.providers.cpu._numba_conv",
                    _depthwise_act_signature, (_F32, _F64), {"reassoc", "contract", "nsz", "arcp"})

IMAGES_SPLIT_MIN_S = 0.8e-3
"""The images of a 1x1/im2col conv are split across the pool when one call on the calling
thread took this long. Their cost follows the output they write and the im2col copies more
than their FLOPs, so it is timed rather than estimated (measured, 2 threads against 1,
quiet 2-core VM: 0.3-0.6 ms convs 1.0-1.06x, 2-4 ms ones 1.5x)."""
CL_MAX_POSITIONS = 64
"""Depthwise convs with at most this many output positions per channel take the
channels-last kernel (measured with row-blocked planes: 7x7 maps 2.2x faster than
stride-phase planes; 14x14 maps 1.6-1.7x slower at 3x3, equal at 5x5)."""
DW_SPLIT_MIN = 1_000_000
"""Multiply-adds below which a depthwise conv runs on one thread (bench/thresholds.py, quiet
2-core VM: 226K split 1.56x the whole, 1M 0.94x, 2.7M 0.84x)."""


class Epilogue(NamedTuple):
    """An activation the conv applies as it finishes its output: `code` and parameters
    (a, b) as _numba_conv._act reads them."""

    code: int
    a: float = 0.0
    b: float = 0.0


def epilogue_for(name: str, params: tuple[float, ...]) -> Epilogue | None:
    """The Epilogue of FusedConv activation `name` with its parameters in FusedConv's order
    (HardSwish and Silu: onnxkiln's FusedConv), or None when the conv cannot apply it itself
    (Tanh, Sigmoid: numpy applies them)."""
    if name == "Relu":
        return Epilogue(1, 0.0, math.inf)
    if name == "Clip" and len(params) == 2:
        return Epilogue(1, float(params[0]), float(params[1]))
    if name == "LeakyRelu" and len(params) == 1:
        return Epilogue(2, float(params[0]))
    if name == "HardSigmoid" and len(params) == 2:
        return Epilogue(3, float(params[0]), float(params[1]))
    if name == "HardSwish":
        return Epilogue(4, 1.0 / 6.0, 0.5)
    if name == "Silu":
        return Epilogue(SILU)
    return None


Finish = Callable[[np.ndarray, int, int], None]
"""finish(y, c0, c1): bias and activation over columns [c0, c1) of a C-contiguous (M, P) y."""


def finisher(bias: np.ndarray | None, epilogue: Epilogue | None, dt: np.dtype,
             ) -> Finish | None:
    """The one-pass bias + activation of `bias_act_rows` for dtype dt; None when there is
    nothing to do or numba is off (callers then add the bias with numpy and leave the
    activation to their caller)."""
    if bias is None and epilogue is None:
        return None
    handle = _numba.lazy("bias_act_rows", dt)
    if handle is None or not handle.ready():
        return None
    fn = handle.fn
    b = np.empty(0, dt) if bias is None else bias
    code, pa, pb = epilogue or Epilogue(0)
    ta, tb = dt.type(pa), dt.type(pb)
    if code != SILU:
        return lambda y, c0, c1: fn(y, b, code, ta, tb, c0, c1)
    silu = _silu_rows(dt)
    if silu is None:
        return None

    def finish(y: np.ndarray, c0: int, c1: int) -> None:
        if bias is not None:
            fn(y, b, 0, ta, tb, c0, c1)
        silu(y, 0, y.shape[0], c0, c1)

    return finish


def _silu_rows(dt: np.dtype) -> Callable | None:
    handle = _numba.lazy("silu_rows", dt)
    return handle.fn if handle is not None and handle.ready() else None


def one_by_one_call(geo: Geometry, wm: np.ndarray, bias: np.ndarray | None,
                    out_shape: tuple[int, ...], finish: Finish | None = None,
                    ) -> Callable[..., np.ndarray]:
    """A 1x1 conv of one image and one group: (M, C) @ (C, H*W), split over columns; the
    bias (and epilogue) by `finish` when given, else the bias by numpy."""
    m, c = wm.shape
    positions = math.prod(geo.out)
    split = plan_split(m, c, positions, active_threads())
    strided = any(s != 1 for s in geo.strides)
    index = (Ellipsis, *(slice(None, None, s) for s in geo.strides))
    b = None if bias is None else bias.reshape(m, 1)

    def run(x: np.ndarray, *_: object, out: np.ndarray | None = None) -> np.ndarray:
        if strided:
            x = x[index]
        xm = x.reshape(c, positions)
        if xm.dtype != wm.dtype:
            xm = xm.astype(wm.dtype)
        y = matmul_split(wm, xm, split, None if out is None else out.reshape(m, positions))
        if finish is not None:
            finish(y, 0, positions)
        elif b is not None:
            y += b
        return y.reshape(out_shape)

    return run


def im2col_call(geo: Geometry, wm: np.ndarray, bias: np.ndarray | None,
                out_shape: tuple[int, ...], finish: Finish | None = None,
                ) -> Callable[..., np.ndarray]:
    """An im2col conv of one image and one group (module doc). Large maps are cut into
    chunks of output rows, each copying and multiplying its own columns (and finishing
    them with `finish` while they are in cache); small maps with many output channels
    build the columns once and split W's rows instead (a thin column chunk would repack
    all of W for a few columns)."""
    m, k = wm.shape
    c = k // math.prod(geo.kernel)
    nsp = len(geo.out)
    rows, inner = geo.out[0], math.prod(geo.out[1:])
    positions = rows * inner
    threads = active_threads()
    big = threads > 1 and 2 * m * k * positions >= _gemm.SPLIT_MIN_FLOPS
    by_rows = big and positions >= _gemm.COL_ALIGN * threads * 2 and rows >= threads
    ranges = split_ranges(rows, threads, 1) if by_rows else ((0, rows),)
    w_split = None if by_rows else _gemm.plan_split(m, k, positions, threads)
    b = None if bias is None else bias.reshape(m, 1)
    dt = wm.dtype

    def run(x: np.ndarray, *_: object, out: np.ndarray | None = None) -> np.ndarray:
        xp = padded_copy(x, geo, 0, dt) if geo.needs_pad else x
        xp = xp[0]  # (C, *padded)
        s_c, *s_sp = xp.strides
        view = as_strided(
            xp, shape=(c, *geo.kernel, *geo.out),
            strides=(s_c, *(s * d for s, d in zip(s_sp, geo.dilations)),
                     *(s * st for s, st in zip(s_sp, geo.strides))),
            writeable=False)
        y = np.empty((m, positions), dt) if out is None else out.reshape(m, positions)

        def chunk(i: int) -> None:
            lo, hi = ranges[i]
            part = view[(Ellipsis, slice(lo, hi), *(slice(None),) * (nsp - 1))]
            cols = np.empty(part.shape, dt)
            np.copyto(cols, part, casting="unsafe")
            matmul_split(wm, cols.reshape(k, -1), w_split if not by_rows else None,
                         out=y[:, lo * inner:hi * inner])
            if finish is not None:
                finish(y, lo * inner, hi * inner)

        if by_rows:
            parallel_for(len(ranges), chunk)
        else:
            chunk(0)  # one set of columns; W's rows split across the pool (w_split)
        if finish is None and b is not None:
            y += b
        return y.reshape(out_shape)

    return run


def per_image_call(one: Callable[..., np.ndarray], out_shape: tuple[int, ...],
                   dt: np.dtype) -> Callable[..., np.ndarray]:
    """A conv of N images as N one-image convs `one(x[i:i+1], out=...)`. The first call
    runs them on the calling thread and times them; from then on they are split across
    the pool if that took IMAGES_SPLIT_MIN_S or more (each image's own split then runs on
    the thread that took it). Either way every image is computed the same way, so the
    choice never changes a bit of the result."""
    n = out_shape[0]
    split: bool | None = False
    if active_threads() > 1:
        split = True if IMAGES_SPLIT_MIN_S <= 0 else None  # None: time the first call

    def run(x: np.ndarray, *_: object) -> np.ndarray:
        nonlocal split
        out = np.empty(out_shape, dt)
        if split:
            parallel_for(n, lambda i: one(x[i:i + 1], out=out[i:i + 1]))
            return out
        start = time.perf_counter()
        for i in range(n):
            one(x[i:i + 1], out=out[i:i + 1])
        if split is None:
            split = time.perf_counter() - start >= IMAGES_SPLIT_MIN_S
        return out

    return run


def depthwise_call(fn: Callable, kind: str, geo: Geometry, w: np.ndarray, bias: np.ndarray,
                   out_shape: tuple[int, ...], epilogue: Epilogue | None = None,
                   ) -> Callable[..., np.ndarray]:
    """A 2-D depthwise conv through numba kernel `fn` ("planes" or "cl"; w prepared for it:
    (C, KH, KW) or (KH, KW, C)), channels split across the pool in blocks of 16; the kernel
    applies `epilogue` as it writes the output."""
    channels = out_shape[1]
    params = (*geo.strides, *geo.dilations, *geo.pads_begin)
    work = math.prod(out_shape) * math.prod(geo.kernel)
    threads = active_threads()
    ranges = ((0, channels),)
    if threads > 1 and work >= DW_SPLIT_MIN and channels >= 32:
        ranges = split_ranges(channels, min(2 * threads, channels // 16), 16)
    dt = w.dtype
    code, pa, pb = epilogue or Epilogue(0)
    silu = _silu_rows(dt) if code == SILU else None  # after the kernel, per channel range
    act = (0 if code == SILU else code, dt.type(pa), dt.type(pb))
    n, plane = out_shape[0], math.prod(out_shape[2:])

    def part(x4: np.ndarray, out: np.ndarray, c0: int, c1: int) -> None:
        fn(x4, w, bias, params, c0, c1, out, *act)
        if silu is not None:
            rows = out.reshape(n * channels, plane)
            for b in range(n):
                silu(rows, b * channels + c0, b * channels + c1, 0, plane)

    def run(x: np.ndarray, *_: object) -> np.ndarray:
        x4 = np.ascontiguousarray(x, dtype=dt)
        out = np.empty(out_shape, dt)
        if len(ranges) == 1:
            part(x4, out, 0, channels)
        else:
            parallel_for(len(ranges), lambda i: part(x4, out, *ranges[i]))
        return out

    run.variant = f"conv.depthwise_{kind}_numba"
    return run
