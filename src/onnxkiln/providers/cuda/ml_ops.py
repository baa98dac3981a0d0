"""Torch kernels: the ai.onnx.ml ops that are plain tensor math (Binarizer,
ArrayFeatureExtractor). The CPU provider raises on a NaN Binarizer input and on an
out-of-range feature index; checking that costs one host sync per call here (inherent to
raising the same errors)."""

from __future__ import annotations

import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.cuda.dtypes import NUMERIC, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor
ML = "ai.onnx.ml"
_ML_TYPES = frozenset({DataType.FLOAT, DataType.DOUBLE, DataType.INT64, DataType.INT32})


@kernel("Binarizer", since=1, domain=ML, supports=needs(_ML_TYPES))
def binarizer(x: Tensor, *, threshold) -> Tensor:
    """Y = 1 where X > threshold else 0, in X's type (a NaN input is an error)."""
    if x.is_floating_point() and x.numel():
        nan = torch.isnan(x.reshape(-1))
        if bool(nan.any()):  # the host sync (module docstring)
            raise ValueError(f"Binarizer: input element {int(nan.nonzero()[0, 0])} is NaN")
    th = torch.tensor(float(threshold), dtype=x.dtype if x.is_floating_point()
                      else torch.float64, device=x.device)
    return torch.gt(x, th).to(x.dtype)


@kernel("ArrayFeatureExtractor", since=1, domain=ML, supports=needs(NUMERIC, skip_inputs=(1,)))
def array_feature_extractor(x: Tensor, y: Tensor) -> Tensor:
    """Z = X[..., Y] on the last axis (a 1-D X gives [1, len(Y)])."""
    if x.ndim == 0:
        raise ValueError("ArrayFeatureExtractor: X must have at least one dimension")
    size = x.shape[-1]
    idx = y.reshape(-1).to(torch.int64)
    if idx.numel():
        bad = (idx < 0) | (idx >= size)
        if bool(bad.any()):  # the host sync (module docstring)
            raise IndexError(f"ArrayFeatureExtractor: index {int(idx[bad][0])} is out of "
                             f"range [0, {size})")
    z = torch.index_select(x, x.ndim - 1, idx)
    return z.reshape(1, -1) if x.ndim == 1 else z
