"""The CUDA execution provider's kernels: torch ops, one module per op family.

Importing this package needs torch (onnxkiln itself never imports it unless torch is
present). The kernels are device-agnostic: they allocate on their inputs' device (or on
`device.current_device()` for outputs built from host values only), so the same kernels run
on torch's CPU device in tests.
"""

from __future__ import annotations

from onnxkiln.providers.cuda import (  # noqa: F401  (importing registers the kernels)
    attention,
    contrib,
    contrib_attention,
    control,
    elementwise,
    image_ops,
    index,
    loss,
    misc,
    ml_ops,
    nn,
    nn_extra,
    optional_ops,
    qlinear,
    quant,
    reduce,
    resize,
    rnn,
    select_ops,
    seq_ops,
    signal,
    tensor,
    training,
    vision,
)
from onnxkiln.providers.cuda.registry import REGISTRY

__all__ = ["REGISTRY"]
