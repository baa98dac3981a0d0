"""CPU kernels: com.microsoft LinearAttention and LinearAttentionGate, the gated-delta
recurrence onnxruntime-genai's builder writes for Qwen3.5 / Gated DeltaNet layers.

LinearAttention has the ai.onnx LinearAttention's meaning (3-D packed query/key/value,
linear, gated, delta and gated_delta rules); its kernel serves it. LinearAttentionGate fuses
the gates that feed it: decay = decay_scale * softplus(a + dt_bias), beta = sigmoid(b), in
float32, results in a's type.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.ops.special import expit
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.attention import linear_attention
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)


@kernel("LinearAttention", since=1, domain=MS, factory=True, multi_output=True,
        variant="linattn_ms.recurrent")
def linear_attention_ms(info: NodeInfo) -> Callable[..., tuple]:
    """The ai.onnx LinearAttention kernel; state_window (CUDA-only in onnxruntime) refused."""
    if int(info.attrs.get("state_window", 0)):
        raise ValueError("LinearAttention: state_window is not supported on CPU")
    return linear_attention(info)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0), x)


@kernel("LinearAttentionGate", since=1, domain=MS, multi_output=True,
        variant="linattngate.numpy")
def linear_attention_gate(a: np.ndarray, dt_bias: np.ndarray, decay_scale: np.ndarray,
                          b: np.ndarray | None = None) -> tuple:
    """(decay, beta): per-head gates of shape (B, T, H); beta None when b is absent."""
    op = "LinearAttentionGate"
    if a.ndim != 3:
        raise ValueError(f"{op}: a must be (B, T, H), got {a.shape}")
    h = a.shape[2]
    if dt_bias.shape != (h,) or decay_scale.shape != (h,):
        raise ValueError(f"{op}: dt_bias and decay_scale must be ({h},), got {dt_bias.shape}, "
                         f"{decay_scale.shape}")
    if b is not None and b.shape != a.shape:
        raise ValueError(f"{op}: b must match a {a.shape}, got {b.shape}")
    z = a.astype(_F32) + dt_bias.astype(_F32)
    decay = (decay_scale.astype(_F32) * _softplus(z)).astype(a.dtype)
    beta = None if b is None else expit(b.astype(_F32)).astype(b.dtype)
    return decay, beta
