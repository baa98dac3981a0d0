"""CPU kernel: onnxruntime's com.microsoft GroupQueryAttention.

Per batch entry b the cache holds T = seqlens_k[b] + 1 tokens after the step; Q =
query_seqlens[b] (default min(S, T)) of the S query rows are new tokens, written to cache rows
[P, T) with P = T - Q; query row s sits at absolute position P + s. The present buffers hold
max(past length, total_sequence_length) rows (the past buffer's length when it is a
shared, fixed-capacity buffer). Bound to device bindings (onnxkiln.kv_attention) the kernel
writes the new rows into the bindings' buffers and returns views of them as the presents.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from onnxkiln.kv_attention import capacity_error, in_place_of, note_written
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu import _gqa_decode, _numba
from onnxkiln.providers.cpu.contrib_attention import as_dt, cdt_of, merge_heads, sdpa, wants
from onnxkiln.providers.cpu.contrib_transformer import MS, cache_rows, rotate
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_OP = "GroupQueryAttention"


def _attr_str(v, default: str) -> str:
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


def _rms_heads(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Per-head RMS normalization of (..., H) by weight (H)."""
    ms = np.einsum("...i,...i->...", x, x)[..., None]
    ms *= x.dtype.type(1.0 / x.shape[-1])
    ms += x.dtype.type(eps)
    np.sqrt(ms, out=ms)
    y = x / ms
    y *= as_dt(weight, x.dtype).reshape(-1)
    return y


def _split_qkv(query, key, value, n: int, nk: int, cdt: np.dtype):
    """(q (B,S,N,H), k (B,S,Nk,H), v (B,S,Nk,Hv)) in the compute dtype."""
    if query.ndim != 3:
        raise ValueError(f"{_OP}: query must be 3-D (batch, sequence, hidden), got {query.shape}")
    b, s, d = query.shape
    if key is None:
        if value is not None:
            raise ValueError(f"{_OP}: value given without key")
        if d % (n + 2 * nk):
            raise ValueError(
                f"{_OP}: packed QKV width {d} is not a multiple of num_heads + 2 * kv_num_heads "
                f"= {n + 2 * nk}"
            )
        h = d // (n + 2 * nk)
        x = as_dt(query, cdt).reshape(b, s, n + 2 * nk, h)
        return x[:, :, :n], x[:, :, n : n + nk], x[:, :, n + nk :]
    if value is None:
        raise ValueError(f"{_OP}: key given without value")
    if d % n:
        raise ValueError(f"{_OP}: query hidden size {d} is not a multiple of num_heads {n}")
    h = d // n
    if key.ndim != 3 or value.ndim != 3 or key.shape[:2] != (b, s) or value.shape[:2] != (b, s):
        raise ValueError(
            f"{_OP}: key {key.shape} / value {value.shape} must be ({b}, {s}, kv_hidden)"
        )
    if key.shape[2] != nk * h or value.shape[2] % nk:
        raise ValueError(
            f"{_OP}: key hidden size {key.shape[2]} must be kv_num_heads * head_size = {nk * h}"
        )
    q = as_dt(query, cdt).reshape(b, s, n, h)
    k = as_dt(key, cdt).reshape(b, s, nk, h)
    v = as_dt(value, cdt).reshape(b, s, nk, value.shape[2] // nk)
    return q, k, v


def _scalar_int(x: np.ndarray | None, name: str) -> int:
    if x is None:
        raise ValueError(f"{_OP}: input {name} is required")
    if x.size != 1:
        raise ValueError(f"{_OP}: {name} must hold one value, got shape {x.shape}")
    return int(x.reshape(-1)[0])


class _Codec:
    """How one KV cache is stored: float, int8 (8-bit) or two int4 per uint8 (4-bit).

    Quantized values are round-half-even(x / scale) saturated to the integer range; 4-bit
    values are offset by 8 and packed low nibble first. `scale` broadcasts to the
    (B, Nk, T, H) cache: one value (PER_TENSOR) or (1, Nk, 1, H) (PER_CHANNEL).
    """

    def __init__(self, kind: str, bits: int, name: str) -> None:
        if kind not in ("NONE", "PER_TENSOR", "PER_CHANNEL"):
            raise ValueError(f"{_OP}: {name}_quant_type must be NONE, PER_TENSOR or PER_CHANNEL")
        if kind != "NONE" and bits not in (4, 8):
            raise ValueError(f"{_OP}: kv_cache_bit_width must be 4 or 8, got {bits}")
        self.kind, self.bits, self.name = kind, bits, name
        self.dtype = None if kind == "NONE" else np.dtype(np.uint8 if bits == 4 else np.int8)

    def scale(self, scale: np.ndarray | None, nk: int, h: int) -> np.ndarray | None:
        if self.kind == "NONE":
            return None
        if scale is None:
            raise ValueError(f"{_OP}: {self.name}_quant_type {self.kind} needs {self.name}_scale")
        s = np.asarray(scale, np.float32)
        if self.kind == "PER_TENSOR":
            if s.size != 1:
                raise ValueError(f"{_OP}: PER_TENSOR {self.name}_scale must hold one value")
            return s.reshape(1, 1, 1, 1)
        if s.size != nk * h:
            raise ValueError(
                f"{_OP}: PER_CHANNEL {self.name}_scale must have {nk * h} values "
                f"(1, {nk}, 1, {h}), got {s.shape}"
            )
        return s.reshape(1, nk, 1, h)

    def encode(self, x: np.ndarray, scale: np.ndarray | None, dt: np.dtype) -> np.ndarray:
        """(B, S, Nk, H) float -> stored (B, S, Nk, H or H/2)."""
        if self.kind == "NONE":
            return x.astype(dt, copy=False)
        q = np.rint(x / scale.transpose(0, 2, 1, 3))
        if self.bits == 8:
            return np.clip(q, -128, 127).astype(np.int8)
        q = (np.clip(q, -8, 7) + 8).astype(np.uint8)
        return q[..., 0::2] | (q[..., 1::2] << 4)

    def decode(self, c: np.ndarray, scale: np.ndarray | None, cdt: np.dtype) -> np.ndarray:
        """Stored (B, Nk, T, H or H/2) -> float (B, Nk, T, H)."""
        if self.kind == "NONE":
            return as_dt(c, cdt)
        if self.bits == 8:
            x = c.astype(cdt)
        else:
            x = np.empty((*c.shape[:-1], 2 * c.shape[-1]), cdt)
            x[..., 0::2] = c & 15
            x[..., 1::2] = c >> 4
            x -= 8
        x *= scale
        return x


def _full_cache(k, v, past_key, past_value, p_b, q_b, pos, cap, ragged, keep_past=False):
    """Present buffers (B, Nk, cap, H): past rows [0, P), new rows at [P, P + S), zeros after
    (or, with keep_past, the rest of the past buffer, as when past and present share it)."""
    b, s, nk, h = k.shape
    past_len = 0 if past_key is None else past_key.shape[2]
    keep = np.minimum(p_b, past_len)
    if keep_past and past_len == cap:
        pres_k, pres_v = past_key.copy(), past_value.copy()
    elif (keep == keep[0]).all():  # one pass: copy rows [0, P), zero the rest
        p0 = int(keep[0]) if b else 0
        pres_k = np.empty((b, nk, cap, h), k.dtype)
        pres_v = np.empty((b, nk, cap, v.shape[3]), v.dtype)
        for pres, past in ((pres_k, past_key), (pres_v, past_value)):
            if p0:
                pres[:, :, :p0] = past[:, :, :p0]
            pres[:, :, p0:] = 0
    else:
        pres_k = np.zeros((b, nk, cap, h), k.dtype)
        pres_v = np.zeros((b, nk, cap, v.shape[3]), v.dtype)
        old = (np.arange(past_len)[None, :] < keep[:, None])[:, None, :, None]
        np.copyto(pres_k[:, :, :past_len], past_key, where=old)
        np.copyto(pres_v[:, :, :past_len], past_value, where=old)
    rows = np.arange(s)[None, :]
    write = pos < cap
    if ragged:  # only the valid rows of a right-padded chunk enter the cache
        write &= rows < q_b[:, None]
    bi = np.broadcast_to(np.arange(b)[:, None], (b, s))
    if write.all():
        pres_k[bi, :, pos] = k
        pres_v[bi, :, pos] = v
    else:
        pres_k[bi[write], :, pos[write]] = k[write]
        pres_v[bi[write], :, pos[write]] = v[write]
    return pres_k, pres_v


def _cache_in_place(targets, k, v, p_b, q_b, pos, cap, ragged):
    """Write the new rows into the bound buffers (B, Nk, C, H) in place and return their
    first `cap` rows as the presents: rows outside [P, P + S) keep what the buffer holds
    (the plain kernel zeroes them; attention never reads them as valid keys)."""
    b, s = pos.shape
    out = []
    for target, new in zip(targets, (k, v)):
        buf = target.tensor
        if buf.shape[2] < cap:
            raise capacity_error(target, _OP, cap, 2)
        if not ragged and b and (p_b == p_b[0]).all():  # one slice: a decode step, a prompt
            p0 = int(p_b[0])
            end = min(p0 + s, cap)
            rows = new[:, : end - p0].transpose(0, 2, 1, 3)
            buf[:, :, p0:end] = rows
        else:
            write = pos < cap
            if ragged:
                write &= np.arange(s)[None, :] < q_b[:, None]
            bi = np.broadcast_to(np.arange(b)[:, None], (b, s))
            rows = new[write]
            buf[bi[write], :, pos[write]] = rows
        note_written(target, rows.nbytes)
        out.append(buf[:, :, :cap])
    return out


def _resident(t: np.ndarray, cap: int, window: int) -> np.ndarray:
    """L(T): how many most recent positions a window-sized cache of capacity cap holds."""
    g = cap - window + 1
    over = np.maximum(t - cap, 0)
    return np.where(t <= cap, t, t - g * (-(-over // g)))


def _window_cache(k, v, past_key, past_value, p_b, q_b, t_b, window):
    """Keys/values for a window-sized cache (sliding_window_cache=1).

    Returns (k rows, v rows) (B, Nk, R, H) holding absolute positions key_pos (B, R) where
    valid (B, R), and the present buffers: rows [0, L(T)) = the L(T) most recent positions.
    """
    b, s, nk, h = k.shape
    cap = past_key.shape[2]
    lp = _resident(p_b, cap, window)  # resident rows before the step
    width = int((lp + q_b).max())
    kcat = np.zeros((b, nk, max(width, 1), h), past_key.dtype)
    vcat = np.zeros((b, nk, max(width, 1), v.shape[3]), past_value.dtype)
    old = (np.arange(cap)[None, :] < lp[:, None])[:, None, :, None]
    n_old = min(cap, kcat.shape[2])
    np.copyto(kcat[:, :, :n_old], past_key[:, :, :n_old], where=old[:, :, :n_old])
    np.copyto(vcat[:, :, :n_old], past_value[:, :, :n_old], where=old[:, :, :n_old])
    rows = np.arange(s)[None, :]
    write = rows < q_b[:, None]
    dest = lp[:, None] + rows
    bi = np.broadcast_to(np.arange(b)[:, None], (b, s))
    kcat[bi[write], :, dest[write]] = k[write]
    vcat[bi[write], :, dest[write]] = v[write]
    base = p_b - lp  # absolute position of row 0
    key_pos = base[:, None] + np.arange(kcat.shape[2])[None, :]
    valid = np.arange(kcat.shape[2])[None, :] < (lp + q_b)[:, None]
    lt = _resident(t_b, cap, window)
    pres_k = np.zeros(past_key.shape, past_key.dtype)
    pres_v = np.zeros(past_value.shape, past_value.dtype)
    r = np.arange(cap)[None, :]
    src = (t_b - lt - base)[:, None] + r  # (B, C) kcat rows
    keep = r < lt[:, None]
    bi = np.broadcast_to(np.arange(b)[:, None], (b, cap))
    pres_k[bi[keep], :, r.repeat(b, 0)[keep]] = kcat[bi[keep], :, src[keep]]
    pres_v[bi[keep], :, r.repeat(b, 0)[keep]] = vcat[bi[keep], :, src[keep]]
    return kcat, vcat, key_pos, valid, pres_k, pres_v


@kernel(
    "GroupQueryAttention", since=1, domain=MS, factory=True, multi_output=True, variant="gqa.sdpa"
)
def group_query_attention(info: NodeInfo) -> Callable[..., tuple]:
    """Grouped-query causal attention over a KV cache indexed by seqlens_k (com.microsoft)."""
    a = info.attrs
    n = int(a.get("num_heads", 0))
    nk = int(a.get("kv_num_heads", 0))
    if n <= 0 or nk <= 0 or n % nk:
        raise ValueError(
            f"{_OP}: num_heads {n} must be a positive multiple of kv_num_heads {nk}"
        )
    scale_attr = a.get("scale")
    window = int(a.get("local_window_size", -1))
    softcap = float(a.get("softcap", 0.0) or 0.0)
    do_rotary = bool(a.get("do_rotary", 0))
    interleaved = bool(a.get("rotary_interleaved", 0))
    causal = bool(a.get("causal", 1))
    smooth = int(a.get("smooth_softmax", -1)) == 1
    qk_output = int(a.get("qk_output", 0))
    sliding = bool(a.get("sliding_window_cache", 0))
    if sliding and window <= 0:
        raise ValueError(f"{_OP}: sliding_window_cache needs local_window_size > 0")
    bits = int(a.get("kv_cache_bit_width", 8) or 8)
    codec_k = _Codec(_attr_str(a.get("k_quant_type"), "NONE"), bits, "k")
    codec_v = _Codec(_attr_str(a.get("v_quant_type"), "NONE"), bits, "v")
    if not causal and window >= 0:
        raise ValueError(f"{_OP}: local_window_size must be -1 when causal is 0")
    if qk_output not in (0, 1, 2):
        raise ValueError(f"{_OP}: qk_output must be 0, 1 or 2, got {qk_output}")
    eps_qk = float(a.get("qk_norm_epsilon", 1e-6))
    eps_q = float(a.get("q_norm_epsilon", eps_qk))
    eps_k = float(a.get("k_norm_epsilon", eps_qk))
    want_pk, want_pv = wants(info, 1), wants(info, 2)
    want_qk = qk_output and wants(info, 3)
    # one compiled pass for float32 one-token steps (_gqa_decode); None keeps the numpy path
    plain = not sliding and codec_k.kind == codec_v.kind == "NONE" and not smooth
    fast = _numba.lazy("gqa_decode", np.float32) if plain and not want_qk else None
    layout: list = [None]  # the last decode call's checked operand layout (_gqa_decode)
    entry: list = [None]

    def run(
        query,
        key=None,
        value=None,
        past_key=None,
        past_value=None,
        seqlens_k=None,
        total_sequence_length=None,
        cos_cache=None,
        sin_cache=None,
        position_ids=None,
        attention_bias=None,
        head_sink=None,
        k_scale=None,
        v_scale=None,
        q_norm_weight=None,
        k_norm_weight=None,
        query_seqlens=None,
        *,
        _block=None,
        _keep_past=False,
        _into=None,
    ):
        if fast is not None and _block is None and not _keep_past and attention_bias is None \
                and head_sink is None and q_norm_weight is None and k_norm_weight is None \
                and query_seqlens is None and fast.ready():
            if entry[0] is None:  # the compiled step's entry point, found once
                entry[0] = _numba.direct(fast.fn)
            got = _gqa_decode.decode(
                entry[0], n, nk, do_rotary, interleaved, scale_attr, softcap, window, query, key,
                value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
                sin_cache, position_ids, _into if past_key is not None else None, layout,
            )
            if got is not None:
                return got[0], got[1] if want_pk else None, got[2] if want_pv else None, None
        dt = query.dtype
        cdt = cdt_of(dt)
        q, k, v = _split_qkv(query, key, value, n, nk, cdt)
        b, s, _, h = q.shape
        total = _scalar_int(total_sequence_length, "total_sequence_length")
        if seqlens_k is None or seqlens_k.shape != (b,):
            got = None if seqlens_k is None else seqlens_k.shape
            raise ValueError(f"{_OP}: seqlens_k must have shape ({b},), got {got}")
        t_b = seqlens_k.astype(np.int64) + 1
        if (t_b < 1).any():
            raise ValueError(f"{_OP}: seqlens_k must be >= 0, got {seqlens_k.tolist()}")
        if query_seqlens is not None:
            if query_seqlens.shape != (b,):
                raise ValueError(
                    f"{_OP}: query_seqlens must have shape ({b},), got {query_seqlens.shape}"
                )
            q_b = query_seqlens.astype(np.int64)
            if (q_b < 0).any() or (q_b > np.minimum(s, t_b)).any():
                raise ValueError(
                    f"{_OP}: query_seqlens {q_b.tolist()} must lie in [0, min(S, seqlens_k + 1)]"
                )
        else:
            q_b = np.minimum(s, t_b)
        p_b = t_b - q_b
        if (past_key is None) != (past_value is None):
            raise ValueError(f"{_OP}: past_key and past_value must be given together")
        past_len = 0 if past_key is None else past_key.shape[2]
        if past_key is not None and (
            past_key.shape[:3] != (b, nk, past_len) or past_value.shape[:3] != (b, nk, past_len)
        ):
            raise ValueError(
                f"{_OP}: past_key {past_key.shape} / past_value {past_value.shape} expected "
                f"({b}, {nk}, {past_len}, head_size)"
            )
        cap = past_len if sliding else max(past_len, total)
        if sliding and (past_key is None or cap < window):
            raise ValueError(
                f"{_OP}: sliding_window_cache needs past_key/past_value with a capacity of at "
                f"least local_window_size {window}, got {past_len}"
            )
        if int(t_b.max()) > total or (not sliding and int(t_b.max()) > cap):
            raise ValueError(
                f"{_OP}: seqlens_k + 1 = {t_b.tolist()} exceeds total_sequence_length {total}"
            )
        if q_norm_weight is not None or k_norm_weight is not None:
            if q_norm_weight is None or k_norm_weight is None:
                raise ValueError(f"{_OP}: q_norm_weight and k_norm_weight go together")
            q = _rms_heads(q, q_norm_weight, eps_q)
            k = _rms_heads(k, k_norm_weight, eps_k)
        rows = np.arange(s)
        first_prompt = query_seqlens is None and s == total
        pos = p_b[:, None] + rows  # (B, S) absolute positions
        if do_rotary:
            if cos_cache is None or sin_cache is None:
                raise ValueError(f"{_OP}: do_rotary needs cos_cache and sin_cache")
            if cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape:
                raise ValueError(
                    f"{_OP}: cos_cache/sin_cache must be the same 2-D shape, got "
                    f"{cos_cache.shape}, {sin_cache.shape}"
                )
            half = cos_cache.shape[1]
            if 2 * half > h:
                raise ValueError(f"{_OP}: rotary dim {2 * half} exceeds head size {h}")
            if position_ids is not None:
                if position_ids.shape != (b, s):
                    raise ValueError(
                        f"{_OP}: position_ids shape {position_ids.shape} expected {(b, s)}"
                    )
                rpos = position_ids.astype(np.int64)
                if first_prompt:  # onnxruntime reads only the first element then
                    rpos = np.broadcast_to(rpos[0, 0] + rows, (b, s))
            else:
                rpos = pos
            cos = cache_rows(cos_cache, rpos, _OP, "cos_cache").astype(cdt, copy=False)
            sin = cache_rows(sin_cache, rpos, _OP, "sin_cache").astype(cdt, copy=False)
            cos, sin = cos[:, :, None, :], sin[:, :, None, :]
            q = rotate(q, cos, sin, interleaved)
            k = rotate(k, cos, sin, interleaved)
        ks = codec_k.scale(k_scale, nk, h)
        vs = codec_v.scale(v_scale, nk, v.shape[3])
        k = codec_k.encode(k, ks, dt)
        v = codec_v.encode(v, vs, dt)
        for past, new, name in ((past_key, k, "past_key"), (past_value, v, "past_value")):
            if past is not None and (past.dtype != new.dtype or past.shape[3] != new.shape[3]):
                raise ValueError(
                    f"{_OP}: {name} {past.dtype} {past.shape} does not match the cache format "
                    f"{new.dtype} with {new.shape[3]} values per row"
                )
        if sliding:
            kcat, vcat, key_pos, valid, pres_k, pres_v = _window_cache(
                k, v, past_key, past_value, p_b, q_b, t_b, window
            )
        else:
            if _into is not None and past_key is not None:  # the presents are the bindings
                pres_k, pres_v = _cache_in_place(
                    _into, k, v, p_b, q_b, pos, cap, query_seqlens is not None
                )
            else:
                pres_k, pres_v = _full_cache(
                    k, v, past_key, past_value, p_b, q_b, pos, cap, query_seqlens is not None,
                    _keep_past,
                )
            tmax = int(t_b.max())
            kcat, vcat = pres_k[:, :, :tmax], pres_v[:, :, :tmax]
            key_pos = np.arange(tmax)[None, :]
            valid = key_pos < t_b[:, None]
        kk = codec_k.decode(kcat, ks, cdt)
        vv = codec_v.decode(vcat, vs, cdt)
        tk = kk.shape[2]
        add = None
        if s == 1 and not sliding and window <= 0 and _block is None and (t_b == tk).all():
            allowed = None  # a decode step over full rows reads every cached key: no mask
        else:  # allowed[b, s, i]: query row s of entry b may read cached key i
            allowed = valid[:, None, :]
            last = np.minimum(pos, t_b[:, None] - 1)
            if causal:  # padding rows (past T) attend like the last valid row, as onnxruntime
                allowed = allowed & (key_pos[:, None, :] <= last[:, :, None])
                if window > 0:
                    allowed &= key_pos[:, None, :] > last[:, :, None] - window
            allowed = allowed[:, None]  # (B, 1, S or 1, T)
            if _block is not None:  # per-head block-sparse layouts: (B, N, S, T)
                allowed = allowed & _block(last, key_pos)
        if allowed is not None and not allowed.all():
            add = np.where(allowed, cdt.type(0), cdt.type(-np.inf))
            if add.shape[2] == 1 and s > 1:
                add = np.broadcast_to(add, (b, add.shape[1], s, tk))
        bias = None
        if attention_bias is not None:
            ab = attention_bias
            need = int(key_pos.max()) + 1 if key_pos.size else 0
            if (
                ab.ndim != 4
                or ab.shape[0] not in (1, b)
                or ab.shape[1] not in (1, n)
                or ab.shape[2] != s
                or ab.shape[3] < min(need, int(t_b.max()))
            ):
                raise ValueError(
                    f"{_OP}: attention_bias shape {ab.shape} expected ({b} or 1, {n} or 1, "
                    f"{s}, {total})"
                )
            if sliding:  # columns are absolute positions
                idx = np.clip(key_pos, 0, ab.shape[3] - 1)[:, None, None, :]
                ab = np.broadcast_to(ab, (b, *ab.shape[1:]))
                bias = as_dt(np.take_along_axis(ab, idx, axis=3), cdt)
            else:
                bias = as_dt(ab[..., :tk], cdt)
        sink = None
        if head_sink is not None:
            if head_sink.shape != (n,):
                raise ValueError(f"{_OP}: head_sink must have shape ({n},), got {head_sink.shape}")
            sink = as_dt(head_sink, cdt)
        elif smooth:
            sink = np.zeros(n, cdt)
        scale = float(scale_attr) if scale_attr else 1.0 / math.sqrt(h)
        qh = q.transpose(0, 2, 1, 3)
        out, qk = sdpa(
            qh,
            kk,
            vv,
            scale,
            add,
            bias=bias,
            softcap=softcap,
            sink=sink,
            qk_mode=qk_output if want_qk else 0,
        )
        qk_out = None
        if qk is not None:
            if qk_output == 1 and add is not None:  # masked scores read as 0, as in onnxruntime
                qk = np.where(allowed, qk, qk.dtype.type(0))
            qk_out = np.zeros((b, n, s, max(total, tk)), dt)
            with np.errstate(over="ignore", invalid="ignore"):
                if sliding:
                    idx = np.broadcast_to(key_pos[:, None, None, :], qk.shape)
                    np.put_along_axis(qk_out, np.minimum(idx, qk_out.shape[3] - 1), qk, axis=3)
                else:
                    qk_out[..., :tk] = qk
                qk_out = qk_out[..., :total]
        return (
            merge_heads(out, dt),
            pres_k if want_pk else None,
            pres_v if want_pv else None,
            qk_out,
        )

    run.kv_pairs = ((3, 1), (4, 2))
    run.kv_in_place = in_place_of(run, "gqa.sdpa.kv_in_place", not sliding and want_pk and want_pv)
    return run


# ---------------------------------------------------------------------------------------------
# SparseAttention


def _dense_layouts(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(L, nb, nb) booleans from the CSR block mask (block_row_indices, block_col_indices)."""
    op = "SparseAttention"
    if rows.ndim != 2 or cols.ndim != 2 or rows.shape[0] != cols.shape[0]:
        raise ValueError(
            f"{op}: block_row_indices {rows.shape} / block_col_indices {cols.shape} must be "
            f"(num_layout, max_blocks + 1) / (num_layout, max_nnz_blocks)"
        )
    n_layout, nb = rows.shape[0], rows.shape[1] - 1
    dense = np.zeros((n_layout, nb, nb), bool)
    for lay in range(n_layout):  # a handful of layouts
        counts = np.diff(rows[lay].astype(np.int64))
        if (counts < 0).any() or rows[lay, -1] > cols.shape[1]:
            raise ValueError(f"{op}: block_row_indices of layout {lay} are not a valid CSR")
        c = cols[lay, : rows[lay, -1]]
        if c.size and (c.min() < 0 or c.max() >= nb):
            raise IndexError(f"{op}: block_col_indices must lie in [0, {nb}) for layout {lay}")
        dense[lay, np.repeat(np.arange(nb), counts), c] = True
    return dense


@kernel(
    "SparseAttention", since=1, domain=MS, factory=True, multi_output=True, variant="sparse.sdpa"
)
def sparse_attention(info: NodeInfo) -> Callable[..., tuple]:
    """Block-sparse causal grouped-query attention over a shared KV buffer (com.microsoft)."""
    op = "SparseAttention"
    a = info.attrs
    block = int(a.get("sparse_block_size", 0))
    if block <= 0:
        raise ValueError(f"{op}: sparse_block_size must be > 0, got {block}")
    n = int(a.get("num_heads", 0))
    keys = ("num_heads", "kv_num_heads", "scale", "do_rotary", "rotary_interleaved")
    inner = group_query_attention(
        dataclasses.replace(info, attrs={k: a[k] for k in keys if k in a})
    )
    consts = info.const_inputs
    fixed = None
    if len(consts) > 6 and consts[5] is not None and consts[6] is not None:
        fixed = _dense_layouts(consts[5], consts[6])

    def run(query, key, value, past_key, past_value, rows, cols, total, key_total,
            cos_cache=None, sin_cache=None, *, _into=None):  # fmt: skip
        dense = fixed if fixed is not None else _dense_layouts(rows, cols)
        n_layout, nb = dense.shape[:2]
        if n % n_layout:
            raise ValueError(f"{op}: num_heads {n} is not a multiple of {n_layout} layouts")
        head_layout = dense[np.arange(n) % n_layout]  # (N, nb, nb)

        def allowed(last: np.ndarray, key_pos: np.ndarray) -> np.ndarray:
            rb, cb = last // block, key_pos // block
            if rb.size and rb.max() >= nb:
                raise ValueError(
                    f"{op}: position {int(last.max())} is beyond the block mask "
                    f"({nb} blocks of {block})"
                )
            cb = np.minimum(cb, nb - 1)
            return head_layout[:, rb[:, :, None], cb[:, None, :]].transpose(1, 0, 2, 3)

        if key_total is None or key_total.ndim != 1:
            raise ValueError(f"{op}: key_total_sequence_lengths must be 1-D (batch_size)")
        seqlens = key_total.astype(np.int32) - 1
        return inner(
            query, key, value, past_key, past_value, seqlens, total, cos_cache, sin_cache,
            _block=allowed, _keep_past=True, _into=_into,
        )

    run.kv_pairs = ((3, 1), (4, 2))
    run.kv_in_place = in_place_of(run, "sparse.sdpa.kv_in_place", wants(info, 1) and wants(info, 2))
    return run
