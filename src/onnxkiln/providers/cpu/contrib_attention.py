"""CPU kernels: onnxruntime's com.microsoft Attention and MultiHeadAttention.

Both follow onnxruntime's CPU provider: masks are additive float32 biases where a masked key
gets `mask_filter_value` (default -10000) and a causally hidden key the lowest float32, so a
fully masked row still softmaxes over its (shifted) scores. Heads are computed together with
batched matmuls in float32 (float64 for double inputs). The shared core (`sdpa`) also serves
GroupQueryAttention in `contrib_gqa.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxkiln.kv_attention import capacity_error, in_place_of, note_written
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._gemm import matmul as pool_matmul
from onnxkiln.providers.cpu.contrib_transformer import MS, rotate
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_LOWEST = float(np.finfo(np.float32).min)
# Attention scores of at most this many elements at once (longer prompts go in row blocks).
_BLOCK_ELEMS = 1 << 23


def cdt_of(dt: np.dtype) -> np.dtype:
    """float64 computes in float64; float32, float16 and bfloat16 in float32."""
    return _F64 if dt == _F64 else _F32


def as_dt(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """x as dtype dt, without a copy when it already is (read-only use)."""
    return x if x.dtype == dt else x.astype(dt)


def wants(info: NodeInfo, i: int) -> bool:
    """Whether the node asks for output i."""
    present = info.output_present
    return bool(present[i]) if i < len(present) else i < info.n_outputs


def softmax_(s: np.ndarray, sink: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis in place; `sink` adds exp(sink) to each denominator.

    A row that is entirely -inf becomes zeros instead of NaN.
    """
    m = s.max(axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink)
    # an all -inf row: shift by the lowest finite value instead (its exponentials are all 0);
    # every other row keeps its max, so one ufunc does what isneginf + copyto did
    np.maximum(m, _lowest(m.dtype), out=m)
    s -= m
    np.exp(s, out=s)
    total = s.sum(axis=-1, keepdims=True)
    if sink is not None:
        total += np.exp(sink - m)
    # the max (or the sink) contributes exp(0) = 1, so a total below 1 is an all-masked 0
    np.maximum(total, 1, out=total)
    np.reciprocal(total, out=total)
    s *= total
    return s


_LOWEST_OF: dict[np.dtype, np.generic] = {}


def _lowest(dt: np.dtype) -> np.generic:
    low = _LOWEST_OF.get(dt)
    if low is None:
        low = _LOWEST_OF[dt] = dt.type(np.finfo(dt).min)
    return low


def sdpa(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    add: np.ndarray | None = None,
    *,
    bias: np.ndarray | None = None,
    softcap: float = 0.0,
    sink: np.ndarray | None = None,
    qk_mode: int = 0,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Scaled dot-product attention over heads, grouped when K/V have fewer heads than Q.

    q (B, N, S, H), k (B, Nk, T, H), v (B, Nk, T, Hv), all in the compute dtype; N is a
    multiple of Nk (query head h reads kv head h // (N / Nk)). Scores are
    scale * q k^T, soft-capped (softcap * tanh(x / softcap)) when softcap > 0, plus `add` (the
    mask) and `bias` (attention_bias), both broadcastable to (B, N, S, T). `sink` (N,) is a
    per-head logit joining every softmax denominator. qk_mode 1 returns the scores before
    the softmax, 2 the probabilities (both (B, N, S, T)). Returns (out (B, N, S, Hv), qk).
    """
    b, n, s, _ = q.shape
    nk, t = k.shape[1], k.shape[2]
    rows = max(1, _BLOCK_ELEMS // max(1, b * n * t))
    if qk_mode == 0 and s > rows:  # long prompts: blocks of query rows bound the scores' size
        out = np.empty((b, n, s, v.shape[3]), np.result_type(q.dtype, v.dtype))
        for r0 in range(0, s, rows):
            r1 = min(s, r0 + rows)
            part = [None if x is None else x[..., r0:r1, :] if x.shape[2] > 1 else x
                    for x in (add, bias)]  # fmt: skip
            out[:, :, r0:r1] = sdpa(q[:, :, r0:r1], k, v, scale, part[0], bias=part[1],
                                    softcap=softcap, sink=sink)[0]  # fmt: skip
        return out, None
    g = n // nk
    qg = q.reshape(b, nk, g * s, q.shape[3])
    sc = pool_matmul(qg, k.swapaxes(-1, -2))  # (B, Nk, G*S, T)
    if scale != 1.0:
        sc *= sc.dtype.type(scale)
    if softcap > 0.0:
        sc *= sc.dtype.type(1.0 / softcap)
        np.tanh(sc, out=sc)
        sc *= sc.dtype.type(softcap)
    sc5 = sc.reshape(b, nk, g, s, t)
    for extra in (add, bias):
        if extra is not None:
            sc5 += _group(extra, nk, g)
    qk = sc5.reshape(b, n, s, t).copy() if qk_mode == 1 else None
    sink5 = None if sink is None else sink.reshape(1, nk, g, 1, 1).astype(sc.dtype, copy=False)
    softmax_(sc5, sink5)
    if qk_mode == 2:
        qk = sc5.reshape(b, n, s, t).copy()
    out = pool_matmul(sc, v)  # (B, Nk, G*S, Hv)
    return out.reshape(b, n, s, v.shape[3]), qk


def _group(x: np.ndarray, nk: int, g: int) -> np.ndarray:
    """A (b?, n?, s?, t) array as (b?, nk?, g?, s?, t) for grouped heads."""
    if x.ndim != 4:
        raise ValueError(f"attention mask/bias must be 4-D after broadcasting, got {x.shape}")
    h = x.shape[1]
    if h == 1:
        return x[:, :, None]
    return x.reshape(x.shape[0], nk, g, *x.shape[2:])


def split_heads(x: np.ndarray, heads: int, op: str, name: str) -> np.ndarray:
    """(B, S, heads*H) -> a (B, heads, S, H) view."""
    if x.ndim != 3:
        raise ValueError(f"{op}: {name} must be 3-D (batch, sequence, hidden), got {x.shape}")
    b, s, hidden = x.shape
    if heads <= 0 or hidden % heads:
        raise ValueError(f"{op}: {name} hidden size {hidden} is not a multiple of {heads} heads")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """(B, N, S, H) -> a fresh (B, S, N*H) array of dtype."""
    b, n, s, h = x.shape
    out = np.empty((b, s, n, h), dtype)
    np.copyto(out, x.transpose(0, 2, 1, 3), casting="unsafe")
    return out.reshape(b, s, n * h)


def key_mask(
    mask: np.ndarray | None,
    batch: int,
    s: int,
    total: int,
    past: int,
    causal: bool,
    filter_value: float,
    cdt: np.dtype,
    op: str,
) -> np.ndarray | None:
    """The additive (B or 1, 1, S or 1, T) mask from a mask_index / key_padding_mask.

    1-D (B): keys at or past each end position masked; (2B): also keys before the start
    positions; (3B + 2): the first B values as end positions. 2-D (B, T) and 3-D (B, S, T):
    zero entries masked. 4-D (B, 1, M, M): rows [past, past + S) and columns [0, T) of a
    raw mask. Masked keys get filter_value; keys after a query (causal) the lowest float.
    """
    add = None
    if mask is not None:
        j = np.arange(total)
        if mask.ndim == 1:
            n = mask.shape[0]
            if n not in (batch, 2 * batch, 3 * batch + 2):
                raise ValueError(
                    f"{op}: 1-D mask must have {batch}, {2 * batch} or {3 * batch + 2} "
                    f"values, got {n}"
                )
            keep = j < mask[:batch, None]
            if n == 2 * batch:
                keep &= j >= np.minimum(mask[batch:, None], total)
            keep = keep[:, None, None, :]
        elif mask.ndim == 2:
            if mask.shape != (batch, total):
                raise ValueError(f"{op}: 2-D mask shape {mask.shape} expected {(batch, total)}")
            keep = (mask > 0)[:, None, None, :]
        elif mask.ndim == 3:
            if mask.shape != (batch, s, total):
                raise ValueError(f"{op}: 3-D mask shape {mask.shape} expected {(batch, s, total)}")
            keep = (mask > 0)[:, None]
        elif mask.ndim == 4:
            if mask.shape[0] != batch or mask.shape[1] != 1 or min(mask.shape[2:]) < past + s or (
                mask.shape[3] < total
            ):
                raise ValueError(
                    f"{op}: 4-D mask shape {mask.shape} expected ({batch}, 1, M, M) with "
                    f"M >= {max(past + s, total)}"
                )
            keep = mask[:, :, past : past + s, :total] > 0
        else:
            raise ValueError(f"{op}: mask must be 1-D to 4-D, got {mask.shape}")
        add = np.where(keep, cdt.type(0), cdt.type(filter_value))
    if causal:
        later = np.arange(total)[None, :] > (past + np.arange(s))[:, None]  # (S, T)
        if later.any():
            low = cdt.type(_LOWEST)
            if add is None:
                add = np.where(later, low, cdt.type(0))[None, None]
            else:
                add = np.where(later, low, add)
    return add


def _check_bias4(bias: np.ndarray | None, b: int, n: int, s: int, t: int, op: str) -> None:
    if bias is None:
        return
    if (
        bias.ndim != 4
        or bias.shape[0] not in (1, b)
        or bias.shape[1] not in (1, n)
        or bias.shape[2:] != (s, t)
    ):
        raise ValueError(
            f"{op}: attention_bias shape {bias.shape} expected ({b} or 1, {n} or 1, {s}, {t})"
        )


def append_in_place(target, new: np.ndarray, start: int, axis: int, op: str,
                    lead: tuple = ()) -> tuple[np.ndarray, np.ndarray]:
    """Write `new` (compute dtype) into the bound buffer at [start, start + L) on `axis`
    (after the `lead` indices) and return (keys/values in the compute dtype, the present: a
    view of the buffer's first start + L rows). The compute array equals what concatenating
    the past (rounded to dt) with the unrounded new rows gives, as the plain kernel does."""
    buf = target.tensor[lead] if lead else target.tensor
    end = start + new.shape[axis]
    if end > buf.shape[axis]:
        raise capacity_error(target, op, end, axis + len(lead))
    pre = (slice(None),) * axis
    buf[(*pre, slice(start, end))] = new
    note_written(target, new.size * buf.itemsize)
    present = buf[(*pre, slice(0, end))]
    if present.dtype == new.dtype:
        return present, present
    both = present.astype(new.dtype)
    both[(*pre, slice(start, end))] = new
    return both, present


def rope_tables(positions: np.ndarray, rot: int, cdt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin (..., rot/2) for integer positions, frequencies base 10000^(-2i/rot)."""
    inv = 1.0 / (10000.0 ** (np.arange(0, rot, 2, dtype=np.float64) / rot))
    ang = positions[..., None].astype(np.float64) * inv
    return np.cos(ang).astype(cdt), np.sin(ang).astype(cdt)


# ---------------------------------------------------------------------------------------------
# Attention


@kernel("Attention", since=1, domain=MS, factory=True, multi_output=True, variant="ms_attn.sdpa")
def ms_attention(info: NodeInfo) -> Callable[..., tuple]:
    """Self-attention with packed QKV projection weights, masks, past/present (com.microsoft)."""
    op = "Attention"
    a = info.attrs
    heads = int(a.get("num_heads", 0))
    if heads <= 0:
        raise ValueError(f"{op}: num_heads must be > 0, got {heads}")
    sizes = a.get("qkv_hidden_sizes")
    causal = bool(a.get("unidirectional", 0))
    scale_attr = a.get("scale")
    filt = float(a.get("mask_filter_value", -10000.0))
    do_rotary = bool(a.get("do_rotary", 0))
    rot_attr = int(a.get("rotary_embedding_dim", 0))
    share = bool(a.get("past_present_share_buffer", 0))
    want_present = wants(info, 1)

    def run(x, weights, bias=None, mask_index=None, past=None, attn_bias=None, past_len=None,
            *, _into=None):
        if x.ndim != 3:
            raise ValueError(f"{op}: input must be 3-D (batch, sequence, hidden), got {x.shape}")
        b, s, din = x.shape
        if weights.ndim != 2 or weights.shape[0] != din:
            raise ValueError(f"{op}: weights shape {weights.shape} expected ({din}, D)")
        width = weights.shape[1]
        if sizes:
            dq, dk, dv = (int(v) for v in sizes)
        else:
            if width % 3:
                raise ValueError(f"{op}: weights width {width} is not divisible by 3")
            dq = dk = dv = width // 3
        if dq + dk + dv != width or dq != dk or min(dq, dv) <= 0 or dq % heads or dv % heads:
            raise ValueError(
                f"{op}: qkv_hidden_sizes {[dq, dk, dv]} invalid for weights {weights.shape} "
                f"and {heads} heads"
            )
        if bias is not None and bias.shape != (width,):
            raise ValueError(f"{op}: bias shape {bias.shape} expected ({width},)")
        cdt = cdt_of(x.dtype)
        qkv = pool_matmul(as_dt(x, cdt), as_dt(weights, cdt))
        if bias is not None:
            qkv += as_dt(bias, cdt)
        q = split_heads(qkv[..., :dq], heads, op, "Q")
        k = split_heads(qkv[..., dq : dq + dk], heads, op, "K")
        v = split_heads(qkv[..., dq + dk :], heads, op, "V")
        hq, hv = dq // heads, dv // heads
        p = 0
        if past is not None:
            want = (2, b, heads, past.shape[3] if past.ndim == 5 else -1, hq)
            if past.ndim != 5 or past.shape != want or hq != hv:
                raise ValueError(
                    f"{op}: past shape {past.shape} expected (2, {b}, {heads}, P, {hq})"
                )
            if share:
                if past_len is None or past_len.size != 1:
                    raise ValueError(
                        f"{op}: past_present_share_buffer needs a one-element past_sequence_length"
                    )
                p = int(past_len.reshape(-1)[0])
                if not 0 <= p <= past.shape[3] - s:
                    raise ValueError(
                        f"{op}: past_sequence_length {p} + sequence {s} exceeds the buffer "
                        f"length {past.shape[3]}"
                    )
            else:
                p = past.shape[3]
        if do_rotary:
            rot = rot_attr or hq
            if rot % 2 or rot > hq:
                raise ValueError(f"{op}: rotary_embedding_dim {rot} must be even and <= {hq}")
            cos, sin = rope_tables(p + np.arange(s), rot, cdt)
            q = rotate(q, cos, sin, False)
            k = rotate(k, cos, sin, False)
        present = None
        if past is not None and _into is not None:  # the present is the binding
            present, kk, vv = _attention_in_place(_into[0], past, k, v, p, share, cdt, op)
        elif past is not None and share:
            present = past.copy()
            present[0, :, :, p : p + s] = k
            present[1, :, :, p : p + s] = v
            kk = as_dt(present[0, :, :, : p + s], cdt)
            vv = as_dt(present[1, :, :, : p + s], cdt)
        elif past is not None:
            kk = np.concatenate([as_dt(past[0], cdt), k], axis=2)
            vv = np.concatenate([as_dt(past[1], cdt), v], axis=2)
        else:
            kk, vv = k, v
        t = p + s
        if want_present and present is None:
            present = np.empty((2, b, heads, t, hq), x.dtype)
            present[0] = kk
            present[1] = vv
        add = key_mask(mask_index, b, s, t, p, causal, filt, cdt, op)
        _check_bias4(attn_bias, b, heads, s, t, op)
        ab = None if attn_bias is None else as_dt(attn_bias, cdt)
        scale = float(scale_attr) if scale_attr else 1.0 / math.sqrt(hq)
        out, _ = sdpa(q, kk, vv, scale, add, bias=ab)
        return merge_heads(out, x.dtype), present

    run.kv_pairs = ((4, 1),)
    run.kv_in_place = in_place_of(run, "ms_attn.sdpa.kv_in_place", want_present)
    return run


def _attention_in_place(target, past, k, v, p: int, share: bool, cdt: np.dtype, op: str):
    """(present, keys, values) of a com.microsoft Attention step whose past (2, B, N, P, H)
    is a binding's view: the new rows written at p (share: past_sequence_length; else the
    past's end); the present is a view of the buffer, P rows (share) or p + S."""
    if share:  # keys are read back from the buffer, as the plain kernel reads its present
        buf = target.tensor
        s = k.shape[2]
        buf[0, :, :, p : p + s] = k
        buf[1, :, :, p : p + s] = v
        note_written(target, k.size * buf.itemsize)  # two writes, as the growing form counts
        note_written(target, v.size * buf.itemsize)
        present = buf[:, :, :, : past.shape[3]]
        return present, as_dt(present[0, :, :, : p + s], cdt), as_dt(present[1, :, :, : p + s], cdt)
    kk, _ = append_in_place(target, k, p, 2, op, (0,))
    vv, _ = append_in_place(target, v, p, 2, op, (1,))
    return target.tensor[:, :, :, : p + k.shape[2]], kk, vv


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention


def _mha_inputs(query, key, value, bias, heads: int, cdt: np.dtype, op: str):
    """(q, k, v) as (B, N, S|L, H) compute-dtype arrays and whether K/V came as BNSH."""
    if query.ndim == 5:  # packed QKV (B, S, N, 3, H)
        if key is not None or value is not None:
            raise ValueError(f"{op}: packed QKV query takes no key or value")
        _, _, n, three, h = query.shape
        if n != heads or three != 3:
            raise ValueError(f"{op}: packed QKV shape {query.shape} expected (B, S, {heads}, 3, H)")
        qkv = as_dt(query, cdt)
        if bias is not None:
            qkv = qkv + as_dt(bias, cdt).reshape(3, heads, h).transpose(1, 0, 2)
        t = qkv.transpose(3, 0, 2, 1, 4)  # (3, B, N, S, H)
        return t[0], t[1], t[2], False
    if query.ndim != 3:
        raise ValueError(f"{op}: query must be 3-D or packed 5-D, got {query.shape}")
    dq = query.shape[2]
    q = as_dt(query, cdt)
    if key is None:
        raise ValueError(f"{op}: key is required unless query is packed QKV")
    if key.ndim == 5:  # packed KV (B, L, N, 2, H)
        if value is not None:
            raise ValueError(f"{op}: packed KV key takes no value")
        _, _, n, two, h = key.shape
        if n != heads or two != 2 or n * h != dq:
            raise ValueError(f"{op}: packed KV shape {key.shape} expected (B, L, {heads}, 2, H)")
        kv = as_dt(key, cdt)
        if bias is not None:
            bb = as_dt(bias, cdt)
            q = q + bb[:dq]
            kv = kv + bb[dq:].reshape(2, heads, h).transpose(1, 0, 2)
        t = kv.transpose(3, 0, 2, 1, 4)
        return split_heads(q, heads, op, "query"), t[0], t[1], False
    if value is None:
        raise ValueError(f"{op}: value is required with a 3-D or 4-D key")
    if key.ndim == 4:  # already projected (B, N, L, H): bias only touches Q
        if value.ndim != 4 or key.shape[1] != heads or value.shape[1] != heads:
            raise ValueError(
                f"{op}: 4-D key {key.shape} / value {value.shape} expected (B, {heads}, L, H)"
            )
        if bias is not None:
            q = q + as_dt(bias, cdt)[:dq]
        return split_heads(q, heads, op, "query"), as_dt(key, cdt), as_dt(value, cdt), True
    if key.ndim != 3 or value.ndim != 3 or key.shape[:2] != value.shape[:2]:
        raise ValueError(f"{op}: key {key.shape} / value {value.shape} must be (B, L, D)")
    k, v = as_dt(key, cdt), as_dt(value, cdt)
    if bias is not None:
        dk, dv = key.shape[2], value.shape[2]
        if bias.shape != (dq + dk + dv,):
            raise ValueError(f"{op}: bias shape {bias.shape} expected ({dq + dk + dv},)")
        bb = as_dt(bias, cdt)
        q = q + bb[:dq]
        k = k + bb[dq : dq + dk]
        v = v + bb[dq + dk :]
    return (
        split_heads(q, heads, op, "query"),
        split_heads(k, heads, op, "key"),
        split_heads(v, heads, op, "value"),
        False,
    )


@kernel(
    "MultiHeadAttention", since=1, domain=MS, factory=True, multi_output=True, variant="mha.sdpa"
)
def multi_head_attention(info: NodeInfo) -> Callable[..., tuple]:
    """Multi-head self/cross attention with separate or packed Q/K/V (com.microsoft)."""
    op = "MultiHeadAttention"
    a = info.attrs
    heads = int(a.get("num_heads", 0))
    if heads <= 0:
        raise ValueError(f"{op}: num_heads must be > 0, got {heads}")
    causal = bool(a.get("unidirectional", 0))
    scale_attr = a.get("scale")
    filt = float(a.get("mask_filter_value", -10000.0))
    want_pk, want_pv, want_qk = wants(info, 1), wants(info, 2), wants(info, 3)

    def run(
        query,
        key=None,
        value=None,
        bias=None,
        key_padding_mask=None,
        attn_bias=None,
        past_key=None,
        past_value=None,
        past_sequence_length=None,
        cache_indirection=None,
        *,
        _into=None,
    ):
        cdt = cdt_of(query.dtype)
        q, k, v, projected = _mha_inputs(query, key, value, bias, heads, cdt, op)
        b, _, s, h = q.shape
        if k.shape[0] != b or k.shape[3] != h:
            raise ValueError(f"{op}: key {k.shape} does not match query heads {q.shape}")
        if (past_key is None) != (past_value is None):
            raise ValueError(f"{op}: past_key and past_value must be given together")
        if cache_indirection is not None and past_key is not None:
            raise ValueError(f"{op}: cache_indirection (beam search) is not supported")
        p = 0
        if past_key is not None:
            if projected:
                raise ValueError(f"{op}: past_key cannot be used with 4-D (projected) key/value")
            want_k = (b, heads, past_key.shape[2], h)
            want_v = (b, heads, past_key.shape[2], v.shape[3])
            if past_key.shape != want_k or past_value.shape != want_v:
                raise ValueError(
                    f"{op}: past_key {past_key.shape} / past_value {past_value.shape} expected "
                    f"{want_k} / {want_v}"
                )
            p = past_key.shape[2]
            if _into is not None:  # the presents are the bindings: write the new rows only
                (k, pk), (v, pv) = (append_in_place(target, new, p, 2, op)
                                    for target, new in zip(_into, (k, v)))
            else:
                k = np.concatenate([as_dt(past_key, cdt), k], axis=2)
                v = np.concatenate([as_dt(past_value, cdt), v], axis=2)
        t = k.shape[2]
        mask = key_padding_mask
        if mask is not None and mask.ndim == 2 and mask.shape[1] == t - p and p:
            mask = np.concatenate([np.ones((b, p), mask.dtype), mask], axis=1)
        add = key_mask(mask, b, s, t, p, causal, filt, cdt, op)
        _check_bias4(attn_bias, b, heads, s, t, op)
        ab = None if attn_bias is None else as_dt(attn_bias, cdt)
        scale = float(scale_attr) if scale_attr else 1.0 / math.sqrt(h)
        out, qk = sdpa(q, k, v, scale, add, bias=ab, qk_mode=1 if want_qk else 0)
        dt = query.dtype
        if qk is not None:
            with np.errstate(over="ignore"):  # the lowest float32 is -inf in float16
                qk = qk.astype(dt)
        if _into is not None and past_key is not None:
            return merge_heads(out, dt), pk, pv, qk
        fresh = p > 0 and dt == cdt  # concatenated with the past: no input shares memory
        return (
            merge_heads(out, dt),
            (k if fresh else k.astype(dt)) if want_pk else None,
            (v if fresh else v.astype(dt)) if want_pv else None,
            qk,
        )

    run.kv_pairs = ((6, 1), (7, 2))
    run.kv_in_place = in_place_of(run, "mha.sdpa.kv_in_place", want_pk and want_pv)
    return run
