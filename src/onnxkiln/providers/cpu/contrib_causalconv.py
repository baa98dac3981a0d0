"""CPU kernels: com.microsoft CausalConvWithState and VarlenCausalConvWithState, the stateful
causal depthwise convolution onnxruntime-genai's builder writes for Gated DeltaNet (Qwen3.5)
and Mamba layers (the varlen form over packed requests, one state each).

The input (B, C, L) is convolved per channel over [past_state, input] (the "virtual input"),
tap j of the kernel (C, 1, k) reading position t - (k - 1 - j) * dilation; optional bias and
SiLU. The carry state is the last (k - 1) * dilation virtual positions. channels_last takes
(B, L, d1, ...) activations and (B, S, d1, ...) states. ndim 1 only; state_window and the
extended channel selection are refused, as by onnxruntime's CPU provider (CUDA-only there).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.ops.special import expit
from onnxkiln.providers.base import NodeInfo
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


def conv_taps(x: np.ndarray, weight: np.ndarray, bias, head: np.ndarray, dil: int, act: str):
    """(output, carry state) in float32 of x (B, C, L) after carry `head` (B, C, S)."""
    length, k = x.shape[2], weight.shape[2]
    s = head.shape[2]
    virt = np.concatenate([head, x.astype(_F32)], axis=2)
    w = weight.astype(_F32)[:, 0]
    out = np.zeros(x.shape, _F32)
    for j in range(k):
        start = s - (k - 1 - j) * dil
        out += w[None, :, j, None] * virt[:, :, start:start + length]
    if bias is not None:
        out += bias.astype(_F32)[None, :, None]
    if act != "none":
        out *= expit(out)
    return out, virt[:, :, length:]


@kernel(OP, since=1, domain=MS, factory=True, multi_output=True, variant="causalconv_ms.taps")
def causal_conv_with_state_ms(info: NodeInfo) -> Callable[..., tuple]:
    """(output, present_state): depthwise causal taps in float32, results in the input type."""
    act, dil, channels_last = _attrs(info)

    def run(x, weight, bias=None, past=None):
        if x.ndim < 3 or (not channels_last and x.ndim != 3):
            raise ValueError(f"{OP}: input must be (batch, channels, length) or, channels_last, "
                             f"(batch, length, d1, ...), got {x.shape}")
        xf = _first(x) if channels_last else x
        b, c, _ = xf.shape
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
        out, state = conv_taps(xf, weight, bias, head, dil, act)
        out, state = out.astype(x.dtype), state.astype(x.dtype)
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


@kernel("VarlenCausalConvWithState", since=1, domain=MS, factory=True, multi_output=True,
        variant="varlen_causalconv.taps")
def varlen_causal_conv_with_state(info: NodeInfo) -> Callable[..., tuple]:
    """The same convolution over a packed (tokens, channels) batch cut by
    cumulative_sequence_length, one carry state per request; with state_update_capacity C,
    state_update (B, C, channels) holds each request's first capture_count input tokens."""
    op = "VarlenCausalConvWithState"
    act = info.attrs.get("activation", "none")
    act = act.decode() if isinstance(act, bytes) else str(act)
    dil, cap = int(info.attrs.get("dilation", 1)), int(info.attrs.get("state_update_capacity", 0))
    if act not in ("none", "silu", "swish") or dil < 1 or not 0 <= cap <= 8:
        raise ValueError(f"{op}: activation must be none/silu/swish, dilation >= 1 and "
                         f"state_update_capacity in [0, 8], got {act!r}, {dil}, {cap}")

    def run(x, weight, cu, bias=None, state=None, count=None, delta=None, prev=None):
        if delta is not None or prev is not None:
            raise ValueError(f"{op}: the dynamic two-tap mode (kernel_delta, previous_mask) is "
                             f"CUDA-only")
        if x.ndim != 2 or weight.ndim != 3 or weight.shape[:2] != (x.shape[1], 1):
            raise ValueError(f"{op}: input must be (tokens, channels) and weight (channels, 1, "
                             f"k), got {x.shape}, {weight.shape}")
        bounds = [int(v) for v in np.asarray(cu).reshape(-1)]
        batch, c, s = len(bounds) - 1, x.shape[1], (weight.shape[2] - 1) * dil
        if batch < 1 or bounds[0] != 0 or bounds[-1] != x.shape[0] or \
                np.any(np.diff(bounds) <= 0):
            raise ValueError(f"{op}: cumulative_sequence_length must rise strictly from 0 to "
                             f"{x.shape[0]}, got {bounds}")
        if state is None or state.shape != (batch, c, s):
            raise ValueError(f"{op}: initial_state {(batch, c, s)} is required, got "
                             f"{None if state is None else state.shape}")
        if bias is not None and bias.shape != (c,):
            raise ValueError(f"{op}: bias must be ({c},), got {bias.shape}")
        if (cap > 0) != (count is not None) or (count is not None and count.size != batch):
            raise ValueError(f"{op}: capture_count ({batch},) is required exactly when "
                             f"state_update_capacity > 0")
        out = np.empty(x.shape, x.dtype)
        final = np.empty_like(state)
        update = np.zeros((batch, cap, c), x.dtype)
        for r in range(batch):
            seg = x[bounds[r]:bounds[r + 1]]
            y, st = conv_taps(seg.T[None], weight, bias, state[r:r + 1].astype(_F32), dil, act)
            out[bounds[r]:bounds[r + 1]] = y[0].T.astype(x.dtype)
            final[r] = st[0].astype(state.dtype)
            if cap:
                n = max(0, min(int(np.asarray(count).reshape(-1)[r]), cap, len(seg)))
                update[r, :n] = seg[:n]
        return (out, final, update) if cap else (out, final)

    return run
