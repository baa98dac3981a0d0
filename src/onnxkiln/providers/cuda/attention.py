"""Torch kernels: ai.onnx Attention (23+), RotaryEmbedding (ai.onnx 23+ and com.microsoft).

Attention runs torch's fused `scaled_dot_product_attention` (flash / memory-efficient on
CUDA) with an additive bias built on the device from attn_mask, the causal frontier
(bottom-right aligned past a KV cache, as ONNX asks), the sliding window and
nonpad_kv_seqlen (a device tensor: no sync); fully masked rows come out as zeros,
like the CPU provider. Soft-capping or a requested qk_matmul_output run the explicit math.
16-bit inputs compute in float32 here (the CPU provider rounds each step to the input type).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from onnxkiln.dtypes import DataType
from onnxkiln.kv_attention import in_place_of
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._kv import append_in_place
from onnxkiln.providers.cuda._util import up, wants
from onnxkiln.providers.cuda.dtypes import FLOATS, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor
MS = "com.microsoft"
_NEG_INF = float("-inf")


def _attention_supports(info: NodeInfo) -> str | None:
    why = needs(FLOATS | {DataType.BOOL, DataType.INT64}, skip_inputs=(3,))(info)
    if why:
        return why
    a = info.attrs
    for name in ("left_window_size", "right_window_size"):
        if int(a.get(name, -1)) < -1:
            return f"Attention: {name} must be -1 or >= 0, got {a[name]}"
    return None


def _check_nonpad(nonpad: Tensor | None, past_key: Tensor | None, b: int) -> None:
    if nonpad is not None and (past_key is not None or tuple(nonpad.shape) != (b,)):
        raise ValueError(f"Attention: nonpad_kv_seqlen must have shape ({b},) and comes "
                         f"without past_key/past_value; got {tuple(nonpad.shape)}")


def _heads(x: Tensor, heads, name: str) -> Tensor:
    if heads is None or int(heads) <= 0:
        raise ValueError(f"Attention: 3-D {name} needs its num_heads attribute")
    b, s, hidden = x.shape
    return x.reshape(b, s, int(heads), hidden // int(heads)).transpose(1, 2)


def _bias(mask: Tensor | None, b: int, sq: int, total: int, past: int, causal: bool,
          ct: torch.dtype, device, window: tuple[int, int] = (-1, -1),
          nonpad: Tensor | None = None) -> Tensor | None:
    """Additive (B|1, H|1, Sq, total) bias from attn_mask, the causal frontier (bottom-right
    aligned past a KV cache), the (left, right) sliding window and nonpad_kv_seqlen."""
    bias = None
    if mask is not None:
        n = mask.shape[-1]
        if n > total:
            raise ValueError(f"Attention: attn_mask last dimension {n} exceeds the total "
                             f"sequence length {total}")
        if mask.dtype == torch.bool:
            bias = torch.zeros(mask.shape, dtype=ct, device=device).masked_fill(~mask, _NEG_INF)
        else:
            bias = mask.to(ct)
        if n < total:
            bias = F.pad(bias, (0, total - n), value=_NEG_INF)
    left, right = window
    windowed = left >= 0 or right >= 0
    if causal and not windowed and nonpad is None and past >= total - 1:
        causal = False  # every query sees every key (e.g. one decode step after the cache)
    if not (causal or windowed or nonpad is not None):
        return bias
    j = torch.arange(total, device=device)
    allowed = None
    if causal or windowed:
        # query i sits at absolute position i + offset: the count of valid keys before it
        offset = past if nonpad is None else (nonpad.long() - sq).reshape(b, 1, 1, 1)
        diff = torch.arange(sq, device=device)[:, None] + offset - j  # (Sq|B,1,Sq, total)
        allowed = diff >= 0 if causal else torch.ones_like(diff, dtype=torch.bool)
        if left >= 0:
            allowed = allowed & (diff <= left)
        if right >= 0:
            allowed = allowed & (diff >= -right)
    if nonpad is not None:
        valid = j < nonpad.long().reshape(b, 1, 1, 1)
        allowed = valid if allowed is None else allowed & valid
    structural = torch.zeros(allowed.shape, dtype=ct, device=device).masked_fill(
        ~allowed, _NEG_INF)
    return structural if bias is None else bias + structural


@kernel("Attention", since=23, factory=True, multi_output=True, supports=_attention_supports,
        variant="attention.sdpa")
def attention(info: NodeInfo) -> Callable[..., tuple]:
    """Scaled dot-product attention: GQA, masks, causal, KV cache (present outputs), softcap,
    qk_matmul_output modes 0-3."""
    a = info.attrs
    causal = bool(a.get("is_causal") or 0)
    q_heads, kv_heads = a.get("q_num_heads"), a.get("kv_num_heads")
    scale_attr = a.get("scale")
    softcap = float(a.get("softcap") or 0.0)
    mode = int(a.get("qk_matmul_output_mode") or 0)
    want_pk, want_pv, want_qk = wants(info, 1), wants(info, 2), wants(info, 3)
    window = (int(a.get("left_window_size", -1)), int(a.get("right_window_size", -1)))

    def run(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad=None, *,
            _into=None):
        three = q.ndim == 3
        q4 = _heads(q, q_heads, "Q") if three else q
        k4 = _heads(k, kv_heads, "K") if three else k
        v4 = _heads(v, kv_heads, "V") if three else v
        b, hq, sq, d = q4.shape
        hkv = k4.shape[1]
        if hkv == 0 or hq % hkv:
            raise ValueError(f"Attention: q heads {hq} must be a multiple of kv heads {hkv}")
        past = 0
        _check_nonpad(nonpad, past_key, b)
        if past_key is not None:
            past = past_key.shape[2]
            if _into is not None:  # the presents are the bindings: write the new rows only
                pk, pv = (append_in_place(t, new, past, "Attention")[1]
                          for t, new in zip(_into, (k4, v4)))
            else:
                pk, pv = torch.cat((past_key, k4), dim=2), torch.cat((past_value, v4), dim=2)
        else:
            pk = k4.contiguous() if not want_pk else k4.clone()
            pv = v4.contiguous() if not want_pv else v4.clone()
        total = pk.shape[2]
        dv = pv.shape[3]
        dt = q.dtype
        ct = torch.float64 if dt == torch.float64 else torch.float32
        if total == 0:
            y = torch.zeros((b, sq, hq * dv) if three else (b, hq, sq, dv), dtype=dt,
                            device=q.device)
            qk = torch.zeros((b, hq, sq, 0), dtype=dt, device=q.device) if want_qk else None
            return y, pk, pv, qk
        scale = 1.0 / math.sqrt(d) if scale_attr is None else float(scale_attr)
        bias = _bias(attn_mask, b, sq, total, past, causal, ct, q.device, window, nonpad)
        g = hq // hkv
        qc, kc, vc = q4.to(ct), pk.to(ct), pv.to(ct)
        if g > 1:
            kc, vc = kc.repeat_interleave(g, dim=1), vc.repeat_interleave(g, dim=1)
        qk = None
        if softcap > 0 or want_qk:
            s = torch.matmul(qc, kc.transpose(-1, -2)) * scale
            qk = s if mode == 0 else None
            if softcap > 0:
                s = torch.tanh(s / softcap) * softcap
            qk = s if mode == 1 else qk
            if bias is not None:
                s = s + bias
            qk = s if mode == 2 else qk
            probs = torch.softmax(s, dim=-1)
            if bias is not None:  # rows with every key masked: zero probabilities, not NaN
                probs = probs.masked_fill(torch.amax(bias, -1, keepdim=True) == _NEG_INF, 0.0)
            qk = probs if mode == 3 else qk
            y = torch.matmul(probs, vc)
        else:
            y = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=bias, scale=scale)
        if bias is not None:  # rows with every key masked give zeros (not NaN)
            dead = torch.amax(bias, dim=-1, keepdim=True) == _NEG_INF
            y = y.masked_fill(dead, 0.0)
        y = y.to(dt)
        if three:
            y = y.transpose(1, 2).reshape(b, sq, hq * dv)
        return y, pk, pv, None if qk is None else qk.to(dt)

    run.kv_pairs = ((4, 1), (5, 2))
    run.kv_in_place = in_place_of(run, "attention.sdpa.kv_in_place", want_pk and want_pv)
    return run


# ---------------------------------------------------------------------------------------
# RotaryEmbedding


def _rotate(x4: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """x4 (..., D) with its first 2 * cos.shape[-1] channels rotated (float32 math)."""
    half = cos.shape[-1]
    rot = 2 * half
    if interleaved:
        x1, x2 = x4[..., 0:rot:2], x4[..., 1:rot:2]
    else:
        x1, x2 = x4[..., :half], x4[..., half:rot]
    x1, x2 = up(x1), up(x2)
    real = x1 * cos - x2 * sin
    imag = x1 * sin + x2 * cos
    if interleaved:
        head = torch.stack((real, imag), dim=-1).reshape(*real.shape[:-1], rot)
    else:
        head = torch.cat((real, imag), dim=-1)
    head = head.to(x4.dtype)
    if rot < x4.shape[-1]:
        return torch.cat((head, x4[..., rot:]), dim=-1)
    return head


def _rows(cache: Tensor, pos: Tensor, half: int) -> Tensor:
    """cache[pos, :half] with positions clamped into the cache (no bounds sync)."""
    n = cache.shape[0]
    idx = pos.to(torch.int64).clamp(0, max(n - 1, 0))
    return cache[:, :half][idx]


_ROPE_TYPES = needs(FLOATS | {DataType.INT64, DataType.INT32})


@kernel("RotaryEmbedding", since=23, factory=True, supports=_ROPE_TYPES, variant="rope.torch")
def rotary_embedding(info: NodeInfo) -> Callable[..., Tensor]:
    """Rotate (half-split or interleaved) the first rotary_embedding_dim channels by cos/sin;
    position_ids index the 2-D caches on the device (clamped into range)."""
    interleaved = bool(info.attrs["interleaved"])
    rot_attr = int(info.attrs["rotary_embedding_dim"])
    num_heads = info.attrs.get("num_heads")

    def run(x, cos_cache, sin_cache, position_ids=None):
        if x.ndim == 4:
            x4 = x
        else:
            if not num_heads:
                raise ValueError("RotaryEmbedding: 3-D input needs the num_heads attribute")
            b, s, hidden = x.shape
            x4 = x.reshape(b, s, int(num_heads), hidden // int(num_heads))
        d = x4.shape[-1]
        rot = rot_attr or d
        half = rot // 2
        if position_ids is not None:
            cos, sin = _rows(cos_cache, position_ids, half), _rows(sin_cache, position_ids, half)
        else:
            cos, sin = cos_cache[..., :half], sin_cache[..., :half]
        expand = 1 if x.ndim == 4 else 2
        cos, sin = up(cos).unsqueeze(expand), up(sin).unsqueeze(expand)
        return _rotate(x4, cos, sin, interleaved).reshape(x.shape)

    return run


@kernel("RotaryEmbedding", since=1, domain=MS, factory=True, supports=_ROPE_TYPES,
        variant="rope.ms.torch")
def rotary_embedding_ms(info: NodeInfo) -> Callable[..., Tensor]:
    """RoPE on (B, S, hidden) or (B, N, S, H) input with (max_len, rot/2) cos/sin caches;
    position_ids (1) is a start offset, (B, S) explicit positions, both read on the device."""
    interleaved = bool(info.attrs.get("interleaved", 0))
    num_heads = int(info.attrs.get("num_heads", 0))
    rot_attr = int(info.attrs.get("rotary_embedding_dim", 0))

    def run(x, position_ids, cos_cache, sin_cache):
        if x.ndim == 4:
            b, n, s, d = x.shape
            x4 = x.transpose(1, 2)
        else:
            b, s, hidden = x.shape
            n = num_heads if num_heads > 0 else hidden // (2 * cos_cache.shape[1])
            d = hidden // n
            x4 = x.reshape(b, s, n, d)
        rot = rot_attr if rot_attr > 0 else min(d, 2 * cos_cache.shape[1])
        half = rot // 2
        if position_ids.numel() == 1:
            pos = position_ids.reshape(-1)[:1].to(torch.int64) + torch.arange(
                s, device=x.device).unsqueeze(0)
        else:
            pos = position_ids
        cos = up(_rows(cos_cache, pos, half)).unsqueeze(2)
        sin = up(_rows(sin_cache, pos, half)).unsqueeze(2)
        out4 = _rotate(x4, cos, sin, interleaved)
        if x.ndim == 4:
            return out4.transpose(1, 2).contiguous()
        return out4.reshape(x.shape)

    return run
