"""CPU kernel: com.microsoft ConvTransposeWithDynamicPads, ConvTranspose whose pads arrive as
an int64 input at run time (older PyTorch exporters of models with computed output padding)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.conv import conv_transpose
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []


@kernel("ConvTransposeWithDynamicPads", since=1, domain=MS, factory=True,
        variant="convtranspose.dynamicpads")
def conv_transpose_dynamic_pads(info: NodeInfo) -> Callable[..., np.ndarray]:
    """The ConvTranspose kernel with pads from the Pads input (begin values, then end values,
    one per spatial axis), built at each run since Pads may change between runs (no cache
    of our own). Pads is required, as onnxruntime requires it."""
    op = "ConvTransposeWithDynamicPads"

    def build(pads: tuple[int, ...]):
        attrs = dict(info.attrs)
        attrs["pads"] = list(pads)
        attrs.pop("auto_pad", None)
        consts = (*info.const_inputs[:2], info.const_inputs[3] if len(info.const_inputs) > 3
                  else None)
        return conv_transpose(dataclasses.replace(info, attrs=attrs, const_inputs=consts))

    def run(x: np.ndarray, w: np.ndarray, pads: np.ndarray | None = None,
            b: np.ndarray | None = None) -> np.ndarray:
        if pads is None:
            raise ValueError(f"{op}: the Pads input is required")
        p = np.asarray(pads)
        if p.dtype.kind not in "iu" or p.shape != (2 * (x.ndim - 2),):
            raise ValueError(f"{op}: Pads must be int64 of shape ({2 * (x.ndim - 2)},) for a "
                             f"{x.ndim}-D input, got {p.dtype} {p.shape}")
        if (p < 0).any():
            raise ValueError(f"{op}: Pads must be non-negative, got {p.tolist()}")
        return build(tuple(int(v) for v in p))(x, w, b)

    return run
