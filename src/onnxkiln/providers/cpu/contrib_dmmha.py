"""CPU kernel: com.microsoft DecoderMaskedMultiHeadAttention, one-token decoder attention over
a shared past/present buffer (convert_generation's GPT-2 and Whisper decoders with
past_present_share_buffer).

Self attention: query, key, value (B, 1, hidden) (or packed QKV in query), plus optional bias;
past_key/past_value (B, heads, max_length, head_size) hold past_sequence_length valid
positions; the new key/value are written at that position of present_key/present_value (same
buffer shape) and the token attends to all past_sequence_length + 1 positions. With beam_width
and cache_indirection (batch, beam_width, max_length), past position t of beam j is read from
the beam cache_indirection[., j, t] of the same batch item. Cross attention: key and value
are (B, heads, kv_length, head_size) already. Scores are q.k * scale (1/sqrt(head_size) by
default) plus attention_bias, with mask_filter_value added where mask_index is 0.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)
OP = "DecoderMaskedMultiHeadAttention"


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, 1, heads * d) -> (B, heads, 1, d)."""
    b, s, width = x.shape
    if s != 1 or width % heads:
        raise ValueError(f"{OP}: expected (batch, 1, hidden) with hidden a multiple of "
                         f"num_heads {heads}, got {x.shape}")
    return x.reshape(b, 1, heads, width // heads).transpose(0, 2, 1, 3)


def _qkv(query, key, value, bias, heads: int):
    """(q, k, v) as (B, heads, 1, d) float32 for self attention, bias added."""
    q = query.astype(_F32)
    if key is None and value is None:  # packed QKV: (B, 1, 3 * hidden)
        if q.ndim != 3 or q.shape[2] % 3:
            raise ValueError(f"{OP}: packed QKV query must be (batch, 1, 3 * hidden), got "
                             f"{q.shape}")
        q, k, v = np.split(q, 3, axis=2)
    elif key is None or value is None:
        raise ValueError(f"{OP}: key and value must both be present or both absent")
    else:
        k, v = key.astype(_F32), value.astype(_F32)
    if bias is not None:
        width = q.shape[2] + k.shape[2] + v.shape[2]
        if bias.shape != (width,):
            raise ValueError(f"{OP}: bias must be ({width},), got {bias.shape}")
        bq, bk, bv = np.split(bias.astype(_F32), [q.shape[2], q.shape[2] + k.shape[2]])
        q, k, v = q + bq, k + bk, v + bv
    return _heads(q, heads), _heads(k, heads), _heads(v, heads)


def _indirect(past: np.ndarray, length: int, beams: int, table: np.ndarray | None):
    """The first `length` past positions of each row, read through cache_indirection."""
    valid = past[:, :, :length]
    if table is None or beams <= 1 or length == 0:
        return valid
    rows = past.shape[0]
    if table.ndim != 3 or table.shape[0] * table.shape[1] != rows or table.shape[1] != beams \
            or table.shape[2] < length:
        raise ValueError(f"{OP}: cache_indirection must be ({rows // beams}, {beams}, >= "
                         f"{length}), got {table.shape}")
    src = table[:, :, :length].astype(np.int64)
    if src.min() < 0 or src.max() >= beams:
        raise ValueError(f"{OP}: cache_indirection holds beams outside [0, {beams})")
    parent = (np.arange(rows) // beams * beams).reshape(-1, 1) + src.reshape(rows, length)
    t = np.arange(length)
    return valid[parent, :, t].transpose(0, 2, 1, 3)  # (rows, length, heads, d) -> BHLd


def _scores(q, keys, scale, mask, bias, filt) -> np.ndarray:
    s = (q @ keys.transpose(0, 1, 3, 2)) * np.float32(scale)
    total = keys.shape[2]
    if bias is not None:
        if bias.ndim != 4 or bias.shape[2:] != (1, total):
            raise ValueError(f"{OP}: attention_bias must be (batch or 1, heads or 1, 1, "
                             f"{total}), got {bias.shape}")
        s = s + bias.astype(_F32)
    if mask is not None:
        if mask.shape != (q.shape[0], total):
            raise ValueError(f"{OP}: mask_index must be ({q.shape[0]}, {total}), got "
                             f"{mask.shape}")
        s = s + np.where(mask == 0, np.float32(filt), np.float32(0))[:, None, None, :]
    return s


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@kernel(OP, since=1, domain=MS, factory=True, multi_output=True, variant="dmmha.numpy")
def decoder_masked_mha(info: NodeInfo) -> Callable[..., tuple]:
    """One decoding step of multi-head attention; outputs (output, present_key,
    present_value, qk) with qk the scaled scores before the softmax when asked for."""
    heads = int(info.attrs.get("num_heads", 0))
    if heads <= 0:
        raise ValueError(f"{OP}: num_heads must be positive, got {heads}")
    share = bool(int(info.attrs.get("past_present_share_buffer", 0)))
    filt = float(info.attrs.get("mask_filter_value", -10000.0))
    scale_attr = float(info.attrs.get("scale", 0.0))

    def run(query, key=None, value=None, mask=None, attn_bias=None, past_key=None,
            past_value=None, past_len=None, beam_width=None, cache_ind=None, bias=None):
        if key is not None and key.ndim == 4:  # cross attention: key/value are the cache
            if value is None or value.shape[:3] != key.shape[:3]:
                raise ValueError(f"{OP}: cross attention value must match key {key.shape}")
            q = _heads(query.astype(_F32) + (0 if bias is None else
                                             bias.astype(_F32)[:query.shape[2]]), heads)
            keys, vals, pk, pv = key.astype(_F32), value.astype(_F32), None, None
        else:
            q, k, v = _qkv(query, key, value, bias, heads)
            keys, vals, pk, pv = _self_cache(k, v, past_key, past_value, past_len, beam_width,
                                             cache_ind, share)
        scale = scale_attr or 1.0 / np.sqrt(q.shape[3])
        s = _scores(q, keys, scale, mask, attn_bias, filt)
        out = (_softmax(s) @ vals).transpose(0, 2, 1, 3).reshape(q.shape[0], 1, -1)
        return out.astype(query.dtype), pk, pv, s.astype(query.dtype)

    return run


def _self_cache(k, v, past_key, past_value, past_len, beam_width, cache_ind, share):
    """(keys, values to attend, present_key, present_value) for self attention."""
    if past_key is None or past_value is None:
        raise ValueError(f"{OP}: self attention needs past_key and past_value")
    if past_key.ndim != 4 or past_value.shape != past_key.shape or \
            past_key.shape[:2] != k.shape[:2] or past_key.shape[3] != k.shape[3]:
        raise ValueError(f"{OP}: past_key/past_value must be (batch, heads, length, "
                         f"{k.shape[3]}) with batch {k.shape[0]}, got {past_key.shape}, "
                         f"{past_value.shape}")
    dtype = past_key.dtype
    if share:
        if past_len is None or np.size(past_len) != 1:
            raise ValueError(f"{OP}: past_present_share_buffer needs a one-element "
                             f"past_sequence_length")
        length = int(np.asarray(past_len).reshape(-1)[0])
        if not 0 <= length < past_key.shape[2]:
            raise ValueError(f"{OP}: past_sequence_length {length} must lie in [0, "
                             f"{past_key.shape[2]}) (the buffer's capacity)")
    else:
        length = past_key.shape[2]
    beams = 1 if beam_width is None else int(np.asarray(beam_width).reshape(-1)[0])
    pk, pv = past_key.astype(_F32), past_value.astype(_F32)
    keys = np.concatenate([_indirect(pk, length, beams, cache_ind), k], axis=2)
    vals = np.concatenate([_indirect(pv, length, beams, cache_ind), v], axis=2)
    if share:
        present_k, present_v = past_key.copy(), past_value.copy()
        present_k[:, :, length] = k[:, :, 0].astype(dtype)
        present_v[:, :, length] = v[:, :, 0].astype(dtype)
    else:
        present_k = np.concatenate([past_key, k.astype(dtype)], axis=2)
        present_v = np.concatenate([past_value, v.astype(dtype)], axis=2)
    return keys, vals, present_k, present_v
