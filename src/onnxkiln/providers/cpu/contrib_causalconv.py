"""CPU kernel: com.microsoft CausalConvWithState, the stateful causal depthwise convolution
onnxruntime-genai's builder writes for Gated DeltaNet (Qwen3.5) and Mamba layers.

The input (B, C, L) is convolved per channel over [past_state, input] (the "virtual input"),
tap j of the kernel (C, 1, k) reading position t - (k - 1 - j) * dilation; optional bias and
SiLU. The carry state is the last (k - 1) * dilation virtual positions. channels_last takes
(B, L, d1, ...) activations and (B, S, d1, ...) states. ndim 1 only; state_window and the
extended channel selection are refused, as by onnxruntime's CPU provider (CUDA-only there).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._special import expit
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)
OP = "CausalConvWithState"
_CUDA_ONLY = ("state_window", "state_update_capacity", "state_length", "input_channel_offset",
              "input_channels")


def _attrs(info: NodeInfo) -> tuple[str, int, bool]:
    act = info.attrs.get("activation", "none")
    act = act.decode() if isinstance(act, bytes) else str(act)
    if act not in ("none", "silu", "swish"):
        raise ValueError(f"{OP}: activation must be none, silu or swish, got {act!r}")
    if int(info.attrs.get("ndim", 1)) != 1:
        raise ValueError(f"{OP}: only ndim 1 is supported on CPU, got "
                         f"{int(info.attrs.get('ndim', 1))}")
    dil = int(info.attrs.get("dilation", 1))
    if dil < 1:
        raise ValueError(f"{OP}: dilation must be >= 1, got {dil}")
    for name in _CUDA_ONLY:
        if int(info.attrs.get(name, 0)):
            raise ValueError(f"{OP}: {name} is CUDA-only")
    if int(info.attrs.get("state_channels_last", -1)) not in (-1,):
        raise ValueError(f"{OP}: state_channels_last is CUDA-only")
    return act, dil, bool(int(info.attrs.get("channels_last", 0)))


def _first(x: np.ndarray) -> np.ndarray:
    """(B, L, d1, ...) -> (B, C, L)."""
    return np.moveaxis(x.reshape(x.shape[0], x.shape[1], -1), 1, 2)


def _last(x: np.ndarray, like: tuple[int, ...]) -> np.ndarray:
    """(B, C, L) -> (B, L, d1, ...) with the trailing dims of `like`."""
    return np.moveaxis(x, 2, 1).reshape(x.shape[0], x.shape[2], *like[2:])


@kernel(OP, since=1, domain=MS, factory=True, multi_output=True, variant="causalconv_ms.taps")
def causal_conv_with_state_ms(info: NodeInfo) -> Callable[..., tuple]:
    """(output, present_state): depthwise causal taps in float32, results in the input type."""
    act, dil, channels_last = _attrs(info)

    def run(x, weight, bias=None, past=None):
        if x.ndim < 3 or (not channels_last and x.ndim != 3):
            raise ValueError(f"{OP}: input must be (batch, channels, length) or, channels_last, "
                             f"(batch, length, d1, ...), got {x.shape}")
        xf = _first(x) if channels_last else x
        b, c, length = xf.shape
        if weight.ndim != 3 or weight.shape[:2] != (c, 1) or weight.shape[2] < 1:
            raise ValueError(f"{OP}: weight must be ({c}, 1, k), got {weight.shape}")
        k = weight.shape[2]
        s = (k - 1) * dil
        if bias is not None and bias.shape != (c,):
            raise ValueError(f"{OP}: bias must be ({c},), got {bias.shape}")
        if past is None:
            head = np.zeros((b, c, s), _F32)
        else:
            head = _past(past, x.shape, b, c, s, channels_last).astype(_F32)
        virt = np.concatenate([head, xf.astype(_F32)], axis=2)
        w = weight.astype(_F32)[:, 0]
        out = np.zeros((b, c, length), _F32)
        for j in range(k):
            start = s - (k - 1 - j) * dil
            out += w[None, :, j, None] * virt[:, :, start:start + length]
        if bias is not None:
            out += bias.astype(_F32)[None, :, None]
        if act != "none":
            out *= expit(out)
        out, state = out.astype(x.dtype), virt[:, :, length:].astype(x.dtype)
        if channels_last:
            return _last(out, x.shape), _last(state, (b, s, *x.shape[2:]))
        return out, state

    return run


def _past(past: np.ndarray, xshape, b: int, c: int, s: int, channels_last: bool):
    """past_state as (B, C, S), checked."""
    want = (b, s, *xshape[2:]) if channels_last else (b, c, s)
    if past.shape != want:
        raise ValueError(f"{OP}: past_state must be {want}, got {past.shape}")
    return _first(past) if channels_last else past
