"""Torch kernels: com.microsoft MultiHeadAttention and GroupQueryAttention.

Masks follow onnxruntime's CPU provider exactly: a masked key gets `mask_filter_value`
(default -10000) and a causally hidden key the lowest float32, both as an additive bias, so
torch's fused `scaled_dot_product_attention` computes the same softmax (no -inf, no NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from onnxkiln.dtypes import DataType
from onnxkiln.kv_attention import capacity_error, in_place_of, note_written
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._kv import append_in_place
from onnxkiln.providers.cuda._util import wants
from onnxkiln.providers.cuda.dtypes import FLOATS, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor
MS = "com.microsoft"
_LOWEST = float(torch.finfo(torch.float32).min)
_NEG_INF = float("-inf")


def _mha_supports(info: NodeInfo) -> str | None:
    why = needs(FLOATS | {DataType.INT32, DataType.INT64, DataType.BOOL},
                skip_inputs=(4,))(info)
    if why:
        return why
    present = info.input_present
    if len(present) > 8 and any(present[8:]):
        return "MultiHeadAttention with past_sequence_length/cache_indirection is left to the CPU"
    if wants(info, 3):
        return "MultiHeadAttention's qk output is left to the CPU"
    return None


def _split(x: Tensor, heads: int) -> Tensor:
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(1, 2)


def _inputs(query, key, value, bias, heads: int, ct) -> tuple[Tensor, Tensor, Tensor, bool]:
    """(q, k, v) as (B, N, S|L, H) compute-dtype tensors, and whether K/V came as BNSH."""
    if query.ndim == 5:  # packed QKV (B, S, N, 3, H)
        h = query.shape[4]
        qkv = query.to(ct)
        if bias is not None:
            qkv = qkv + bias.to(ct).reshape(3, heads, h).transpose(0, 1)
        t = qkv.permute(3, 0, 2, 1, 4)
        return t[0], t[1], t[2], False
    dq = query.shape[2]
    q = query.to(ct)
    if key.ndim == 5:  # packed KV (B, L, N, 2, H)
        h = key.shape[4]
        kv = key.to(ct)
        if bias is not None:
            bb = bias.to(ct)
            q = q + bb[:dq]
            kv = kv + bb[dq:].reshape(2, heads, h).transpose(0, 1)
        t = kv.permute(3, 0, 2, 1, 4)
        return _split(q, heads), t[0], t[1], False
    if key.ndim == 4:  # already projected (B, N, L, H)
        if bias is not None:
            q = q + bias.to(ct)[:dq]
        return _split(q, heads), key.to(ct), value.to(ct), True
    k, v = key.to(ct), value.to(ct)
    if bias is not None:
        dk = key.shape[2]
        bb = bias.to(ct)
        q, k, v = q + bb[:dq], k + bb[dq:dq + dk], v + bb[dq + dk:]
    return _split(q, heads), _split(k, heads), _split(v, heads), False


def _key_mask(mask: Tensor | None, b: int, s: int, total: int, past: int, causal: bool,
              fill: float, ct, device) -> Tensor | None:
    """The additive (B|1, 1, S|1, T) bias from a mask_index / key_padding_mask (see the CPU
    provider's key_mask for the layouts), plus the causal frontier."""
    add = None
    if mask is not None:
        j = torch.arange(total, device=device)
        if mask.ndim == 1:
            keep = j < mask[:b].to(torch.int64).unsqueeze(1)
            if mask.shape[0] == 2 * b:
                start = torch.clamp(mask[b:].to(torch.int64), max=total).unsqueeze(1)
                keep = keep & (j >= start)
            keep = keep[:, None, None, :]
        elif mask.ndim == 2:
            keep = (mask > 0)[:, None, None, :]
        elif mask.ndim == 3:
            keep = (mask > 0)[:, None]
        else:
            keep = mask[:, :, past:past + s, :total] > 0
        add = torch.zeros(keep.shape, dtype=ct, device=device).masked_fill(~keep, fill)
    if causal and total - 1 > past:
        i = torch.arange(s, device=device).unsqueeze(1)
        later = torch.arange(total, device=device).unsqueeze(0) > past + i
        if add is None:
            add = torch.zeros((1, 1, s, total), dtype=ct, device=device)
        add = add.masked_fill(later, _LOWEST)
    return add


@kernel("MultiHeadAttention", since=1, domain=MS, factory=True, multi_output=True,
        supports=_mha_supports, variant="mha.sdpa")
def multi_head_attention(info: NodeInfo) -> Callable[..., tuple]:
    """Multi-head self/cross attention with separate or packed Q/K/V, masks, attention bias
    and past/present KV (torch SDPA with an additive bias)."""
    a = info.attrs
    heads = int(a.get("num_heads", 0))
    if heads <= 0:
        raise ValueError(f"MultiHeadAttention: num_heads must be > 0, got {heads}")
    causal = bool(a.get("unidirectional", 0))
    scale_attr = a.get("scale")
    fill = float(a.get("mask_filter_value", -10000.0))
    want_pk, want_pv = wants(info, 1), wants(info, 2)

    def run(query, key=None, value=None, bias=None, key_padding_mask=None, attn_bias=None,
            past_key=None, past_value=None, past_sequence_length=None,
            cache_indirection=None, *, _into=None) -> tuple:
        dt = query.dtype
        ct = torch.float64 if dt == torch.float64 else torch.float32
        q, k, v, _ = _inputs(query, key, value, bias, heads, ct)
        b, _, s, h = q.shape
        p = 0
        presents = None
        if past_key is not None:
            p = past_key.shape[2]
            if _into is not None:  # the presents are the bindings: write the new rows only
                (k, pk), (v, pv) = (append_in_place(target, new, p, "MultiHeadAttention")
                                    for target, new in zip(_into, (k, v)))
                presents = pk, pv
            else:
                k = torch.cat((past_key.to(ct), k), dim=2)
                v = torch.cat((past_value.to(ct), v), dim=2)
        t = k.shape[2]
        mask = key_padding_mask
        if mask is not None and mask.ndim == 2 and mask.shape[1] == t - p and p:
            mask = torch.cat((torch.ones((b, p), dtype=mask.dtype, device=mask.device), mask),
                             dim=1)
        add = _key_mask(mask, b, s, t, p, causal, fill, ct, query.device)
        if attn_bias is not None:
            add = attn_bias.to(ct) if add is None else add + attn_bias.to(ct)
        scale = float(scale_attr) if scale_attr else 1.0 / math.sqrt(h)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=scale)
        out = out.transpose(1, 2).reshape(b, s, heads * v.shape[3]).to(dt)
        if presents is not None:
            return out, *presents, None
        # without a past the presents may be views of the inputs: copy the ones asked for
        pk = k.to(dt) if p or not want_pk else k.to(dt).clone()
        pv = v.to(dt) if p or not want_pv else v.to(dt).clone()
        return out, pk, pv, None

    run.kv_pairs = ((6, 1), (7, 2))
    run.kv_in_place = in_place_of(run, "mha.sdpa.kv_in_place", want_pk and want_pv)
    return run


# ---------------------------------------------------------------------------------------
# GroupQueryAttention


def _gqa_supports(info: NodeInfo) -> str | None:
    why = needs(FLOATS | {DataType.INT32, DataType.INT64}, skip_inputs=(6,))(info)
    if why:
        return why
    a = info.attrs
    present = info.input_present
    for i, what in ((11, "head_sink"), (14, "q_norm_weight"), (15, "k_norm_weight"),
                    (16, "query_seqlens")):
        if len(present) > i and present[i]:
            return f"GroupQueryAttention with {what} is left to the CPU"
    if int(a.get("smooth_softmax", -1)) == 1:
        return "GroupQueryAttention with smooth_softmax is left to the CPU"
    if int(a.get("qk_output", 0) or 0) and wants(info, 3):
        return "GroupQueryAttention's qk output is left to the CPU"
    if int(a.get("sliding_window_cache", 0) or 0):
        return "GroupQueryAttention with sliding_window_cache is left to the CPU"
    for name in ("k_quant_type", "v_quant_type"):
        kind = a.get(name) or "NONE"
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if kind != "NONE":
            return f"GroupQueryAttention with a quantized KV cache ({name}={kind}) is left to " \
                   f"the CPU"
    return None


def _rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    from onnxkiln.providers.cuda.attention import _rotate

    return _rotate(x, cos, sin, interleaved)


@kernel("GroupQueryAttention", since=1, domain=MS, factory=True, multi_output=True,
        host_inputs=(6,), supports=_gqa_supports, variant="gqa.sdpa")
def group_query_attention(info: NodeInfo) -> Callable[..., tuple]:
    """Grouped-query causal attention over a KV cache indexed by seqlens_k: per batch entry
    T = seqlens_k + 1 tokens after the step, the S new rows written at [T - min(S, T), ...).
    Everything data-dependent (seqlens_k, positions) stays on the device: keys are read over
    the whole cache capacity with the invalid ones masked."""
    a = info.attrs
    n, nk = int(a.get("num_heads", 0)), int(a.get("kv_num_heads", 0))
    if n <= 0 or nk <= 0 or n % nk:
        raise ValueError(f"GroupQueryAttention: num_heads {n} must be a positive multiple of "
                         f"kv_num_heads {nk}")
    scale_attr = a.get("scale")
    window = int(a.get("local_window_size", -1))
    softcap = float(a.get("softcap", 0.0) or 0.0)
    do_rotary = bool(a.get("do_rotary", 0))
    interleaved = bool(a.get("rotary_interleaved", 0))
    causal = bool(a.get("causal", 1))

    def run(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
            total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
            attention_bias=None, *unused, _into=None) -> tuple:
        dt, dev = query.dtype, query.device
        ct = torch.float64 if dt == torch.float64 else torch.float32
        b, s, d = query.shape
        if key is None:
            h = d // (n + 2 * nk)
            x = query.reshape(b, s, n + 2 * nk, h)
            q, k, v = x[:, :, :n], x[:, :, n:n + nk], x[:, :, n + nk:]
        else:
            h = d // n
            q = query.reshape(b, s, n, h)
            k = key.reshape(b, s, nk, h)
            v = value.reshape(b, s, nk, value.shape[2] // nk)
        total = int(total_sequence_length.reshape(-1)[0])
        t_b = seqlens_k.to(torch.int64) + 1  # (B,)
        q_b = torch.clamp(t_b, max=s)
        p_b = t_b - q_b
        rows = torch.arange(s, device=dev)
        pos = p_b.unsqueeze(1) + rows  # (B, S) absolute positions
        past_len = 0 if past_key is None else past_key.shape[2]
        cap = max(past_len, total)
        q, k = q.to(ct), k.to(ct)
        if do_rotary:
            if position_ids is not None:
                rpos = position_ids.to(torch.int64)
                if s == total:  # the first prompt: onnxruntime reads only one element
                    rpos = (rpos.reshape(-1)[:1] + rows).unsqueeze(0).expand(b, s)
            else:
                rpos = pos
            half = cos_cache.shape[1]
            idx = rpos.clamp(0, cos_cache.shape[0] - 1)
            cos = cos_cache[idx].to(ct).unsqueeze(2)
            sin = sin_cache[idx].to(ct).unsqueeze(2)
            q = _rope(q, cos[..., :half], sin[..., :half], interleaved)
            k = _rope(k, cos[..., :half], sin[..., :half], interleaved)
        if _into is not None and past_key is not None:
            pres = _gqa_in_place(_into, (k.to(dt), v.to(dt)), pos, cap)
        else:
            pres = _gqa_presents(past_key, past_value, k.to(dt), v.to(dt), p_b, pos, cap)
        pres_k, pres_v = pres
        key_pos = torch.arange(cap, device=dev)
        allowed = (key_pos < t_b.unsqueeze(1)).unsqueeze(1)  # (B, 1, T)
        if causal:
            last = torch.minimum(pos, (t_b - 1).unsqueeze(1)).unsqueeze(2)  # (B, S, 1)
            allowed = allowed & (key_pos <= last)
            if window > 0:
                allowed = allowed & (key_pos > last - window)
        add = torch.zeros(allowed.shape, dtype=ct, device=dev).masked_fill(
            ~allowed, _NEG_INF).unsqueeze(1)  # (B, 1, S|1, T)
        if attention_bias is not None:
            ab = attention_bias.to(ct)
            if ab.shape[3] < cap:
                ab = F.pad(ab, (0, cap - ab.shape[3]))
            add = add + ab[..., :cap]
        g = n // nk
        kk, vv = pres_k.to(ct), pres_v.to(ct)
        qh = q.transpose(1, 2)
        scale = float(scale_attr) if scale_attr else 1.0 / math.sqrt(h)
        if softcap > 0:
            kk, vv = kk.repeat_interleave(g, dim=1), vv.repeat_interleave(g, dim=1)
            sc = torch.matmul(qh, kk.transpose(-1, -2)) * scale
            sc = torch.tanh(sc / softcap) * softcap + add
            out = torch.matmul(torch.softmax(sc, dim=-1), vv)
        else:
            out = _grouped_sdpa(qh, kk, vv, add, scale)
        out = out.transpose(1, 2).reshape(b, s, n * vv.shape[3]).to(dt)
        return out, pres_k, pres_v, None

    run.kv_pairs = ((3, 1), (4, 2))
    run.kv_in_place = in_place_of(run, "gqa.sdpa.kv_in_place", True)
    return run


def _grouped_sdpa(q: Tensor, k: Tensor, v: Tensor, add: Tensor, scale: float) -> Tensor:
    """SDPA of q (B, N, S, H) over k/v (B, Nk, T, H) with N = g * Nk: the g query heads of a
    KV head become g * S rows of one head (the mask repeated to match), so the cache is read
    where it lies instead of being repeated g times."""
    b, n, s, h = q.shape
    nk, t = k.shape[1], k.shape[2]
    g = n // nk
    if g == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=scale)
    qg = q.reshape(b, nk, g * s, h)
    mask = add.expand(b, n, s, t).reshape(b, nk, g * s, t)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(b, n, s, v.shape[3])


def _gqa_presents(past_key, past_value, k: Tensor, v: Tensor, p_b: Tensor, pos: Tensor,
                  cap: int) -> list[Tensor]:
    """New present buffers (B, Nk, cap, H): the past's first p_b rows, the new rows at pos."""
    b, s = pos.shape
    nk, dev, dt = k.shape[2], k.device, k.dtype
    past_len = 0 if past_key is None else past_key.shape[2]
    pres = []
    for past, new in ((past_key, k), (past_value, v)):
        buf = torch.zeros((b, nk, cap + s, new.shape[3]), dtype=dt, device=dev)
        if past is not None and past_len:
            keep = torch.arange(past_len, device=dev).unsqueeze(0) < \
                torch.clamp(p_b, max=past_len).unsqueeze(1)  # (B, P)
            buf[:, :, :past_len] = torch.where(keep[:, None, :, None], past,
                                               torch.zeros((), dtype=dt, device=dev))
        bi = torch.arange(b, device=dev).unsqueeze(1).expand(b, s)
        buf = buf.transpose(1, 2)  # (B, cap + S, Nk, H) view
        buf[bi, pos] = new  # every row has its own slot: no duplicate writes
        pres.append(buf.transpose(1, 2)[:, :, :cap])
    return pres


def _gqa_in_place(targets, new: tuple[Tensor, Tensor], pos: Tensor, cap: int) -> list[Tensor]:
    """The new rows written into the bound (B, Nk, C, H) buffers at pos; their first cap rows
    are the presents. Positions stay on the device (no sync): one past the capacity (a
    seqlens_k larger than the cache, which the plain kernel drops) is clamped to its last
    row."""
    b, s = pos.shape
    bi = torch.arange(b, device=pos.device).unsqueeze(1).expand(b, s)
    pres = []
    for target, rows in zip(targets, new):
        buf = target.tensor
        if buf.shape[2] < cap:
            raise capacity_error(target, "GroupQueryAttention", cap, 2)
        buf.transpose(1, 2)[bi, pos.clamp(max=cap - 1)] = rows
        note_written(target, rows.numel() * buf.element_size())
        pres.append(buf[:, :, :cap])
    return pres
