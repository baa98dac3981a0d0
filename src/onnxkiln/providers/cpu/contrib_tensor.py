"""CPU kernels: onnxruntime's com.microsoft tensor ops that mirror or predate ONNX ones.

TransposeMatMul (FusedMatMul without batch transposes), ExpandDims, GatherND, Pad (pads as an
input), Unique (first-occurrence order), CDist, GridSample (4-D, onnx opset 16 mode names) and
UnfoldTensor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from onnxkiln.errors import ModelLoadError
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu.contrib_fused import fused_matmul
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.gridsample import grid_sample
from onnxkiln.providers.cpu.index import gather_nd, pad
from onnxkiln.providers.cpu.registry import kernel

_I64 = np.dtype(np.int64)


@kernel("TransposeMatMul", since=1, domain=MS, factory=True, variant="transposematmul.blas")
def transpose_matmul(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = alpha * matmul(A', B'), ' transposing the last two dims where transA/transB."""
    attrs = {k: info.attrs[k] for k in ("alpha", "transA", "transB") if k in info.attrs}
    return fused_matmul(dataclasses.replace(info, attrs=attrs))


@kernel("ExpandDims", since=1, domain=MS, view=True)
def expand_dims(x: np.ndarray, axis: np.ndarray) -> np.ndarray:
    """x with a size-1 axis inserted at the int32 scalar `axis` (in [-rank-1, rank])."""
    if axis.size != 1 or axis.dtype.kind not in "iu":
        raise ValueError(f"ExpandDims: axis must be an integer scalar, got {axis.dtype} "
                         f"{axis.shape}")
    a = int(axis.reshape(-1)[0])
    if not -x.ndim - 1 <= a <= x.ndim:
        raise ValueError(f"ExpandDims: axis {a} outside [{-x.ndim - 1}, {x.ndim}] for rank "
                         f"{x.ndim}")
    return np.expand_dims(x, a if a >= 0 else a + x.ndim + 1)


@kernel("GatherND", since=1, domain=MS, factory=True)
def gather_nd_ms(info: NodeInfo) -> Callable[..., np.ndarray]:
    """ONNX GatherND with batch_dims 0: slices addressed by the last axis of int32/int64
    indices."""
    return gather_nd(dataclasses.replace(info, domain="", opset=11, attrs={}))


@kernel("Pad", since=1, domain=MS, factory=True)
def pad_ms(info: NodeInfo) -> Callable[..., np.ndarray]:
    """ONNX Pad (constant, reflect, edge) with `pads` of shape [2 * rank] or [1, 2 * rank]."""
    mode = info.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("constant", "reflect", "edge"):
        raise ValueError(f"Pad: mode must be constant, reflect or edge, got {mode!r}")
    consts = tuple(c.reshape(-1) if i == 1 and c is not None else c
                   for i, c in enumerate(info.const_inputs))
    onnx_pad = pad(dataclasses.replace(info, domain="", opset=11, attrs={"mode": mode},
                                       const_inputs=consts, input_shapes=()))

    def run(data: np.ndarray, pads: np.ndarray, value: np.ndarray | None = None) -> np.ndarray:
        if (pads.ndim == 2 and pads.shape[0] != 1) or pads.ndim > 2:
            raise ValueError(f"Pad: pads must be [2 * rank] or [1, 2 * rank], got {pads.shape}")
        if value is not None and value.size != 1:
            raise ValueError(f"Pad: value must be a scalar, got shape {value.shape}")
        return onnx_pad(data, pads.reshape(-1), None if value is None else value.reshape(()))

    return run


@kernel("Unique", since=1, domain=MS, multi_output=True, variant="unique.sort",
        capture=CaptureSupport.DATA_DEPENDENT_SHAPE)
def unique_ms(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct values of 1-D x in order of first occurrence, each element's index into them,
    and each value's count. As in onnxruntime (a hash map of values), every NaN is distinct
    and 0.0 / -0.0 are one value, shown as its first occurrence."""
    if x.ndim != 1:
        raise ValueError(f"Unique: x must be 1-D, got shape {x.shape}")
    kw = {"equal_nan": False} if x.dtype.kind in "fc" else {}
    _, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                          return_counts=True, **kw)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return x[first[order]], rank[inverse.reshape(-1)].astype(_I64), counts[order].astype(_I64)


@kernel("CDist", since=1, domain=MS, factory=True, variant="cdist.gemm")
def cdist(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Pairwise distances between the rows of A [N, K] and B [M, K]: sqeuclidean (default) or
    euclidean."""
    unknown = sorted(set(info.attrs) - {"metric"})
    if unknown:  # onnxruntime's schema check refuses the model (skl2onnx's CDist p=3)
        raise ModelLoadError(
            f"this is an invalid model: node {info.describe()}: Unrecognized attribute: "
            f"{unknown[0]} for operator CDist (it takes only metric)")
    metric = info.attrs.get("metric", "sqeuclidean")
    metric = metric.decode() if isinstance(metric, bytes) else str(metric)
    if metric not in ("sqeuclidean", "euclidean"):
        raise ValueError(f"CDist: metric must be sqeuclidean or euclidean, got {metric!r}")

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if a.dtype != b.dtype or a.dtype.kind != "f":
            raise TypeError(f"CDist: A and B must share a float type, got {a.dtype}, {b.dtype}")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
            raise ValueError(f"CDist: A {a.shape} and B {b.shape} must be [N, K] and [M, K]")
        d = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * (a @ b.T)
        np.maximum(d, 0, out=d)
        return np.sqrt(d, out=d) if metric == "euclidean" else d

    return run


_GRID_MODES = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}


@kernel("GridSample", since=1, domain=MS, factory=True, variant="gridsample.ms.gather")
def grid_sample_ms(info: NodeInfo) -> Callable[..., np.ndarray]:
    """ONNX GridSample on 4-D X: mode bilinear (default), nearest or bicubic; padding_mode
    zeros, border or reflection; align_corners."""
    attrs = dict(info.attrs)
    mode = attrs.get("mode", "bilinear")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in _GRID_MODES:
        raise ValueError(f"GridSample: mode must be bilinear, nearest or bicubic, got {mode!r}")
    attrs["mode"] = _GRID_MODES[mode]
    return grid_sample(dataclasses.replace(info, domain="", opset=16, attrs=attrs))


@kernel("UnfoldTensor", since=1, domain=MS, factory=True, variant="unfoldtensor.windows")
def unfold_tensor(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """Every `size`-long slice of axis `dim` (default -1) `step` apart: that axis becomes the
    slice count, a new last axis of `size` holds each slice."""
    op = "UnfoldTensor"
    dim, step = int(info.attrs.get("dim", -1)), int(info.attrs.get("step", 1))
    if "size" not in info.attrs:
        raise ValueError(f"{op}: attribute size is required")
    size = int(info.attrs["size"])
    if size <= 0 or step <= 0:
        raise ValueError(f"{op}: size and step must be positive, got {size} and {step}")

    def run(x: np.ndarray) -> np.ndarray:
        if not -x.ndim <= dim < x.ndim:
            raise ValueError(f"{op}: dim {dim} outside rank {x.ndim}")
        axis = dim % x.ndim
        if x.shape[axis] < size:
            raise ValueError(f"{op}: size {size} exceeds axis {axis} of length {x.shape[axis]}")
        windows = np.lib.stride_tricks.sliding_window_view(x, size, axis=axis)
        return np.ascontiguousarray(windows[(slice(None),) * axis + (slice(None, None, step),)])

    return run
