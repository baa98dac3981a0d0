"""Torch kernels: the recurrent sequence ops of opset 27, LinearAttention (linear, gated,
delta, gated_delta update rules) and CausalConvWithState (depthwise causal 1-D conv that
carries its last k-1 input steps).

Both run as a fixed sequence of device ops (one step per time step for LinearAttention, one
per kernel tap for the conv), float32 math for float16/bfloat16, no host syncs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._util import attr_str, compute_dtype
from onnxkiln.providers.cuda.dtypes import FLOATS, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor

_RULES = ("linear", "gated", "delta", "gated_delta")


def _unpack(x: Tensor, heads: int, name: str) -> Tensor:
    """(B, T, H*D) -> (T, B, H, D) float32, so that step i is one slice."""
    if x.ndim != 3:
        raise ValueError(f"LinearAttention: {name} must be rank 3 (B, T, H*D), got "
                         f"{tuple(x.shape)}")
    b, t, hd = x.shape
    if hd % heads:
        raise ValueError(f"LinearAttention: {name} last dim {hd} not a multiple of {heads} heads")
    return x.reshape(b, t, heads, hd // heads).permute(1, 0, 2, 3).float()


def _la_supports(info: NodeInfo) -> str | None:
    rule = attr_str(info.attrs.get("update_rule")) or "gated_delta"
    if rule not in _RULES:
        return f"LinearAttention: update_rule {rule!r} is not one of {list(_RULES)}"
    hq, hkv = info.attrs.get("q_num_heads"), info.attrs.get("kv_num_heads")
    if not hq or not hkv or int(hq) <= 0 or int(hkv) <= 0 or int(hq) % int(hkv):
        return (f"LinearAttention: q_num_heads ({hq}) must be a positive multiple of "
                f"kv_num_heads ({hkv})")
    return None


def _decay(decay: Tensor, b: int, t: int, hkv: int, dk: int) -> Tensor:
    """exp(decay) as (T, B, H, dk|1, 1): per key dim or per head."""
    if decay.ndim != 3 or tuple(decay.shape[:2]) != (b, t):
        raise ValueError(f"LinearAttention: decay shape {tuple(decay.shape)} expected (B, T, ...)")
    if decay.shape[2] == hkv * dk:
        g = decay.reshape(b, t, hkv, dk, 1)
    elif decay.shape[2] == hkv:
        g = decay.reshape(b, t, hkv, 1, 1)
    else:
        raise ValueError(f"LinearAttention: decay last dim {decay.shape[2]} must be kv_num_heads "
                         f"({hkv}) or kv_num_heads*d_k ({hkv * dk})")
    return torch.exp(g.permute(1, 0, 2, 3, 4).float())


def _beta(beta: Tensor, b: int, t: int, hkv: int) -> Tensor:
    if beta.ndim != 3 or tuple(beta.shape[:2]) != (b, t) or beta.shape[2] not in (hkv, 1):
        raise ValueError(f"LinearAttention: beta shape {tuple(beta.shape)} expected "
                         f"(B, T, {hkv}) or (B, T, 1)")
    return beta.reshape(b, t, beta.shape[2], 1).permute(1, 0, 2, 3).float()


@kernel("LinearAttention", since=27, factory=True, multi_output=True,
        supports=needs(FLOATS, extra=_la_supports))
def linear_attention(info: NodeInfo) -> Callable[..., tuple[Tensor, Tensor]]:
    """Recurrent linear attention over KV heads (GQA), the state kept in float32."""
    a = info.attrs
    rule = attr_str(a.get("update_rule")) or "gated_delta"
    hq, hkv = int(a["q_num_heads"]), int(a["kv_num_heads"])
    scale_attr = float(a.get("scale") or 0.0)
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    group = hq // hkv

    def run(query, key, value, past_state=None, decay=None, beta=None):
        if gated != (decay is not None):
            raise ValueError(f"LinearAttention: update_rule {rule!r} "
                             f"{'needs' if gated else 'forbids'} the decay input")
        if delta != (beta is not None):
            raise ValueError(f"LinearAttention: update_rule {rule!r} "
                             f"{'needs' if delta else 'forbids'} the beta input")
        qt, kt, vt = _unpack(query, hq, "query"), _unpack(key, hkv, "key"), \
            _unpack(value, hkv, "value")
        t, b, _, dk = qt.shape
        dv = vt.shape[3]
        if tuple(kt.shape) != (t, b, hkv, dk) or tuple(vt.shape[:3]) != (t, b, hkv):
            raise ValueError(f"LinearAttention: query {tuple(query.shape)}, key "
                             f"{tuple(key.shape)}, value {tuple(value.shape)} do not agree")
        if past_state is not None:
            if tuple(past_state.shape) != (b, hkv, dk, dv):
                raise ValueError(f"LinearAttention: past_state shape {tuple(past_state.shape)} "
                                 f"expected {(b, hkv, dk, dv)}")
            state, sdt = past_state.float().clone(), past_state.dtype
        else:
            state = torch.zeros((b, hkv, dk, dv), dtype=torch.float32, device=query.device)
            sdt = query.dtype
        qt = qt.reshape(t, b, hkv, group, dk)
        gexp = _decay(decay, b, t, hkv, dk) if gated else None
        bt = _beta(beta, b, t, hkv) if delta else None
        outs = []
        for i in range(t):
            if gated:
                state = state * gexp[i]
            k_i, v_i = kt[i], vt[i]  # (B, H, dk), (B, H, dv)
            if delta:
                retrieved = torch.matmul(k_i[:, :, None, :], state)[:, :, 0, :]  # S^T k
                v_i = (v_i - retrieved) * bt[i]
            state = state + k_i[:, :, :, None] * v_i[:, :, None, :]
            outs.append(torch.matmul(qt[i], state))  # (B, H, group, dv)
        scale = scale_attr if scale_attr != 0.0 else 1.0 / math.sqrt(dk)
        out = torch.stack(outs, dim=1) * scale  # (B, T, H, group, dv)
        return out.reshape(b, t, hq * dv).to(query.dtype), state.to(sdt)

    return run


def _cc_supports(info: NodeInfo) -> str | None:
    act = attr_str(info.attrs.get("activation")) or "none"
    if act not in ("none", "silu", "swish"):
        return f"CausalConvWithState: activation {act!r} is not none, silu or swish"
    return None


def _check_conv(x: Tensor, weight: Tensor, bias, past_state) -> int:
    """The kernel size k; ValueError when the operands do not fit (B, C, L), (C, 1, k)."""
    op = "CausalConvWithState"
    if x.ndim != 3:
        raise ValueError(f"{op}: input must be (B, C, L), got {tuple(x.shape)}")
    b, c, _ = x.shape
    if weight.ndim != 3 or weight.shape[0] != c or weight.shape[1] != 1:
        raise ValueError(f"{op}: weight must be ({c}, 1, k), got {tuple(weight.shape)}")
    k = weight.shape[2]
    if k < 1:
        raise ValueError(f"{op}: kernel size must be >= 1")
    if bias is not None and tuple(bias.shape) != (c,):
        raise ValueError(f"{op}: bias must be ({c},), got {tuple(bias.shape)}")
    if past_state is not None and tuple(past_state.shape) != (b, c, k - 1):
        raise ValueError(f"{op}: past_state must be {(b, c, k - 1)}, got "
                         f"{tuple(past_state.shape)}")
    return k


@kernel("CausalConvWithState", since=27, factory=True, multi_output=True,
        supports=needs(FLOATS, extra=_cc_supports))
def causal_conv_with_state(info: NodeInfo) -> Callable[..., tuple[Tensor, Tensor]]:
    """Depthwise causal conv over [past_state, input] (taps summed in order, as the CPU
    provider), optional SiLU; the new state is the last k-1 steps of that concatenation."""
    act = attr_str(info.attrs.get("activation")) or "none"

    def run(x, weight, bias=None, past_state=None):
        k = _check_conv(x, weight, bias, past_state)
        b, c, length = x.shape
        cdt = compute_dtype(x.dtype)
        head = torch.zeros((b, c, k - 1), dtype=cdt, device=x.device) if past_state is None \
            else past_state.to(cdt)
        padded = torch.cat([head, x.to(cdt)], dim=2)
        w = weight[:, 0, :].to(cdt)
        out = padded[:, :, :length] * w[:, 0:1]
        for i in range(1, k):
            out = out + padded[:, :, i:i + length] * w[:, i:i + 1]
        if bias is not None:
            out = out + bias.to(cdt)[:, None]
        if act != "none":
            out = out * torch.sigmoid(out)
        return out.to(x.dtype), padded[:, :, length:].to(x.dtype).contiguous()

    return run
