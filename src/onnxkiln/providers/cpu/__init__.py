"""The CPU execution provider: numpy kernels, one module per op family."""

from __future__ import annotations

from onnxkiln.providers.cpu import (  # noqa: F401  (importing registers the kernels)
    activation,
    attention,
    cast,
    contrib_attention,
    contrib_dqlstm,
    contrib_fused,
    contrib_gqa,
    contrib_norm,
    contrib_qlinear,
    contrib_quant,
    contrib_text,
    contrib_transformer,
    control,
    conv,
    detection,
    fused,
    gridsample,
    image,
    index,
    linalg,
    loss,
    math,
    ml,
    ml_linear,
    ml_tree,
    norm,
    norm_other,
    pool,
    quant,
    random,
    reduce,
    resize,
    rnn,
    sequence,
    signal,
    sort,
    tensor,
    text,
    training,
    transformer,
)
from onnxkiln.providers.cpu.registry import REGISTRY

__all__ = ["REGISTRY"]
