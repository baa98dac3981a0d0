"""CPU kernels: Attention (23-25), ai.onnx.preview::FlexAttention, LinearAttention.

The LLM building blocks around them (RMSNormalization, RotaryEmbedding, Swish, SwiGLU,
TensorScatter, CausalConvWithState) live in `transformer.py`, imported at the bottom.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

from onnxkiln.kv_attention import in_place_of
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._gemm import matmul as pool_matmul
from onnxkiln.providers.cpu.contrib_attention import append_in_place
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BF16 = np.dtype(ml_dtypes.bfloat16)
# softmax_precision attribute (an ONNX element type) -> numpy dtype.
_PRECISION = {1: _F32, 10: np.dtype(np.float16), 11: _F64, 16: _BF16}
# Attention computes the scores of at most this many elements at once (unless the
# qk_matmul_output is wanted): longer sequences go in blocks of query rows.
_BLOCK_ELEMS = 1 << 23
# Causal attention over at least this many queries also goes in blocks (about 8).
_CAUSAL_BLOCK_ROWS = 256


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """float64 stays float64; every other float type computes in float32."""
    return _F64 if dt == _F64 else _F32


def _as(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """x in dtype dt (no copy when it already is): read-only use only."""
    return x if x.dtype == dt else x.astype(dt)


def _ones(n: int, dt: np.dtype) -> np.ndarray:
    """An (n, 1) column of ones: row sums as one BLAS product."""
    return np.ones((n, 1), dtype=dt)


def _softmax_(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of a float32/float64 array, in place.

    A row that is entirely -inf (every key masked) becomes all zeros instead of NaN.
    """
    # fmax skips NaN in the max, but a NaN still reaches the row sum: the row stays NaN.
    m = np.fmax.reduce(s, axis=-1, keepdims=True)
    np.copyto(m, 0, where=m == -np.inf)
    with np.errstate(invalid="ignore"):  # inf - inf in a row holding +inf: NaN, as intended
        np.subtract(s, m, out=s)
    np.exp(s, out=s)
    total = np.matmul(s, _ones(s.shape[-1], s.dtype))
    np.copyto(total, 1, where=total == 0)
    np.reciprocal(total, out=total)
    np.multiply(s, total, out=s)
    return s


def _softmax_rounded_(s: np.ndarray, dt: np.dtype) -> np.ndarray:
    """_softmax_ for a float32 array holding 16-bit values, rounding each step to `dt`."""
    m = np.max(s, axis=-1, keepdims=True)
    np.copyto(m, 0, where=m == -np.inf)
    with np.errstate(invalid="ignore"):
        np.subtract(s, m, out=s)
    np.exp(_round_to(s, dt), out=s)
    _round_to(s, dt)
    total = _round_to(np.matmul(s, _ones(s.shape[-1], s.dtype)), dt)
    np.copyto(total, 1, where=total == 0)
    np.divide(s, total, out=s)
    return _round_to(s, dt)


def _round_to(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Round x (in place) to the precision of a narrower float type, keeping x's dtype."""
    if dt.itemsize < x.dtype.itemsize:
        np.copyto(x, x.astype(dt), casting="unsafe")
    return x


# ---------------------------------------------------------------------------------------------
# Attention


def _heads_3d(x: np.ndarray, heads: int | None, name: str, attr: str) -> np.ndarray:
    """(B, S, H*D) -> a (B, H, S, D) view."""
    if heads is None or heads <= 0:
        raise ValueError(f"Attention: 3-D inputs need the {attr} attribute (> 0), got {heads}")
    b, s, hidden = x.shape
    if hidden % heads:
        raise ValueError(
            f"Attention: {name} hidden size {hidden} is not a multiple of {attr}={heads}"
        )
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _pad_mask(mask: np.ndarray, kv: int, total: int) -> np.ndarray:
    """attn_mask with its last axis padded (False / -inf) or cut to kv keys."""
    n = mask.shape[-1]
    if n > total:
        raise ValueError(
            f"Attention: attn_mask last dimension {n} exceeds the total sequence length {total}"
        )
    if n > kv:
        return mask[..., :kv]
    if n < kv:
        fill = False if mask.dtype == np.bool_ else -np.inf
        out = np.full((*mask.shape[:-1], kv), fill, dtype=mask.dtype)
        out[..., :n] = mask
        return out
    return mask


def _attention_bias(
    mask: np.ndarray | None,
    nonpad: np.ndarray | None,
    batch: int,
    sq: int,
    kv: int,
    total: int,
    past: int,
    causal: bool,
    left: int,
    right: int,
    cdt: np.dtype,
) -> np.ndarray | None:
    """The additive bias (broadcastable to (B, Hq, Sq, kv)) from mask, causal, window, nonpad."""
    bias = None
    if mask is not None:
        m = _pad_mask(mask, kv, total)
        if m.dtype == np.bool_:
            bias = np.where(m, cdt.type(0), cdt.type(-np.inf))
        else:
            bias = _as(m, cdt)
    windowed = left >= 0 or right >= 0
    if causal and not windowed and nonpad is None and past >= kv - 1:
        causal = False  # every query sees every key (e.g. one decode step after the cache)
    if not (causal or windowed or nonpad is not None):
        return bias
    j = np.arange(kv)
    allowed = None
    if causal or windowed:
        # Query i sits at absolute position i + offset; offset counts the valid keys before it.
        if nonpad is not None:
            offset = (nonpad - sq).reshape(batch, 1, 1, 1)
        else:
            offset = past
        diff = np.arange(sq)[:, None] + offset - j  # (Sq, kv) or (B, 1, Sq, kv)
        allowed = diff >= 0 if causal else np.ones(np.shape(diff), dtype=bool)
        if left >= 0:
            allowed &= diff <= left
        if right >= 0:
            allowed &= diff >= -right
    if nonpad is not None:
        valid = j < nonpad.reshape(batch, 1, 1, 1)  # (B, 1, 1, kv)
        allowed = valid if allowed is None else allowed & valid
    structural = np.where(allowed, cdt.type(0), cdt.type(-np.inf))
    return structural if bias is None else bias + structural


def _check_attention(q4, k4, v4, past_key, past_value, nonpad) -> None:
    b, hq, _, d = q4.shape
    if k4.shape[0] != b or v4.shape[0] != b:
        raise ValueError(f"Attention: batch sizes differ: Q {q4.shape}, K {k4.shape}, V {v4.shape}")
    hkv = k4.shape[1]
    if v4.shape[1] != hkv or k4.shape[2] != v4.shape[2]:
        raise ValueError(
            f"Attention: K {k4.shape} and V {v4.shape} must share heads and sequence length"
        )
    if k4.shape[3] != d:
        raise ValueError(f"Attention: Q head size {d} differs from K head size {k4.shape[3]}")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"Attention: q_num_heads {hq} must be a multiple of kv_num_heads {hkv}")
    if (past_key is None) != (past_value is None):
        raise ValueError("Attention: past_key and past_value must be given together")
    if past_key is not None:
        if nonpad is not None:
            raise ValueError("Attention: nonpad_kv_seqlen cannot be used with past_key/past_value")
        want_k = (b, hkv, past_key.shape[2], d)
        want_v = (b, hkv, past_key.shape[2], v4.shape[3])
        if past_key.shape != want_k or past_value.shape != want_v:
            raise ValueError(
                f"Attention: past_key {past_key.shape} / past_value {past_value.shape} "
                f"expected {want_k} / {want_v}"
            )
    if nonpad is not None and nonpad.shape != (b,):
        raise ValueError(f"Attention: nonpad_kv_seqlen must have shape ({b},), got {nonpad.shape}")


@kernel("Attention", since=23, factory=True, multi_output=True, variant="attention.sdpa")
def attention(info: NodeInfo) -> Callable[..., tuple]:
    """Scaled dot-product attention: GQA, masks, causal/window, KV cache, softcap."""
    a = info.attrs
    causal = bool(a.get("is_causal") or 0)
    q_heads, kv_heads = a.get("q_num_heads"), a.get("kv_num_heads")
    scale_attr = a.get("scale")
    softcap = float(a.get("softcap") or 0.0)
    mode = int(a.get("qk_matmul_output_mode") or 0)
    precision = a.get("softmax_precision")
    left = int(a.get("left_window_size", -1))
    right = int(a.get("right_window_size", -1))
    if mode not in (0, 1, 2, 3):
        raise ValueError(f"Attention: qk_matmul_output_mode must be 0..3, got {mode}")
    if precision is not None and precision not in _PRECISION:
        raise ValueError(f"Attention: unsupported softmax_precision {precision}")
    if left < -1 or right < -1:
        raise ValueError(
            f"Attention: window sizes must be -1 or >= 0, got left={left} right={right}"
        )
    present = info.output_present
    want_pk = len(present) > 1 and present[1]
    want_pv = len(present) > 2 and present[2]
    want_qk = len(present) > 3 and present[3]

    def run(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None,
            *, _into=None):
        if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
            raise ValueError(
                f"Attention: Q, K, V must all be 3-D or all 4-D, got {q.shape}, {k.shape}, "
                f"{v.shape}"
            )
        if q.ndim == 3:
            q4 = _heads_3d(q, q_heads, "Q", "q_num_heads")
            k4 = _heads_3d(k, kv_heads, "K", "kv_num_heads")
            v4 = _heads_3d(v, kv_heads, "V", "kv_num_heads")
        else:
            q4, k4, v4 = q, k, v
            if q_heads not in (None, q.shape[1]) or kv_heads not in (None, k.shape[1]):
                raise ValueError(
                    f"Attention: q_num_heads={q_heads}, kv_num_heads={kv_heads} disagree with "
                    f"the 4-D inputs Q {q.shape}, K {k.shape}"
                )
        nonpad = None if nonpad_kv_seqlen is None else np.asarray(nonpad_kv_seqlen, np.int64)
        _check_attention(q4, k4, v4, past_key, past_value, nonpad)
        b, hq, sq, d = q4.shape
        hkv = k4.shape[1]
        group = hq // hkv
        dv = v4.shape[3]
        t1 = q.dtype
        cdt = _compute_dtype(t1)

        past = 0
        if past_key is not None:
            past = past_key.shape[2]
            if _into is not None:  # past and present share bindings: see onnxkiln.kv_attention
                pk, pv = (append_in_place(t, new, past, 2, "Attention")[1]
                          for t, new in zip(_into, (k4, v4)))
            else:
                pk = np.concatenate((past_key, k4), axis=2)
                pv = np.concatenate((past_value, v4), axis=2)
        else:
            pk = np.array(k4) if want_pk else k4
            pv = np.array(v4) if want_pv else v4
        total = pk.shape[2]
        kv = total
        if nonpad is not None and not want_qk:  # keys past every nonpad length never count
            kv = max(1, min(total, int(nonpad.max(initial=0))))

        scale = 1.0 / math.sqrt(d) if scale_attr is None else float(scale_attr)
        # 16-bit T1: round every step to T1 as the spec's op-by-op pattern does (the softmax
        # too, unless softmax_precision asks otherwise), computing each step in float32.
        low = t1.itemsize < cdt.itemsize
        sdt = _PRECISION[precision] if precision is not None else (t1 if low else cdt)
        qs = np.empty((b, hq, sq, d), cdt)
        if low:  # Q and K each scaled by sqrt(scale) in T1
            root = cdt.type(t1.type(math.sqrt(scale)))
            np.multiply(q4, root, out=qs, casting="unsafe")
            kk = np.multiply(pk[:, :, :kv], root, dtype=cdt)
            _round_to(qs, t1)
            _round_to(kk, t1)
        else:
            np.multiply(q4, cdt.type(scale), out=qs, casting="unsafe")
            kk = _as(pk[:, :, :kv], cdt)
        vv = _as(pv[:, :, :kv], cdt)
        if attn_mask is not None:
            mshape = (*attn_mask.shape[:-1], total)
            if attn_mask.ndim > 4 or np.broadcast_shapes(mshape, (b, hq, sq, total)) != (
                b,
                hq,
                sq,
                total,
            ):
                raise ValueError(
                    f"Attention: attn_mask {attn_mask.shape} does not broadcast to "
                    f"(batch, q_heads, q_seq, total_seq) = {(b, hq, sq, total)}"
                )
        if total == 0:  # no keys at all: every row is fully masked
            qk = np.zeros((b, hq, sq, 0), t1) if want_qk else None
            y = np.zeros((b, sq, hq * dv) if q.ndim == 3 else (b, hq, sq, dv), t1)
            return y, pk, pv, qk
        bias = _attention_bias(attn_mask, nonpad, b, sq, kv, total, past, causal, left, right, cdt)
        step = _Step(t1, cdt, sdt, group, softcap, mode if want_qk else -1)
        # A causal (or right-window) frontier lets blocks of query rows skip the keys past it.
        frontier = (causal or right >= 0) and sq >= _CAUSAL_BLOCK_ROWS
        if want_qk or (b * hq * sq * kv <= _BLOCK_ELEMS and not frontier):
            # Query heads of one group share their K/V head: stack them as rows of one GEMM.
            y, qk_out = step(qs.reshape(b, hkv, group * sq, d), kk, vv, bias)
            y = y.reshape(b, hq, sq, dv)
            if q.ndim == 4:
                return y.astype(t1, copy=False), pk, pv, qk_out
            out = np.empty((b, sq, hq, dv), t1)
            np.copyto(out, y.transpose(0, 2, 1, 3), casting="unsafe")
            return out.reshape(b, sq, hq * dv), pk, pv, qk_out

        # Blocks of query rows bound the score memory; behind a frontier each block only reads
        # the keys it may attend.
        out = np.empty((b, sq, hq, dv) if q.ndim == 3 else (b, hq, sq, dv), t1)
        out4 = out.transpose(0, 2, 1, 3) if q.ndim == 3 else out
        rows = max(1, _BLOCK_ELEMS // (b * hq * kv))
        if causal or right >= 0:
            rows = min(rows, max(_CAUSAL_BLOCK_ROWS // 4, -(-sq // 8)))
        reach = right if right >= 0 and not causal else 0
        front = (int((nonpad - sq).max()) if nonpad is not None else past) + reach
        qs5 = qs.reshape(b, hkv, group, sq, d)
        per_row = bias is not None and bias.ndim >= 2 and bias.shape[-2] != 1
        for i0 in range(0, sq, rows):
            i1 = min(sq, i0 + rows)
            kend = kv if not (causal or right >= 0) else max(1, min(kv, i1 + front))
            qg = qs5[:, :, :, i0:i1].reshape(b, hkv, group * (i1 - i0), d)
            bb = None
            if bias is not None:
                bb = bias[..., i0:i1, :kend] if per_row else bias[..., :kend]
            y, _ = step(qg, kk[:, :, :kend], vv[:, :, :kend], bb)
            np.copyto(out4[:, :, i0:i1], y.reshape(b, hq, i1 - i0, dv), casting="unsafe")
        if q.ndim == 3:
            out = out.reshape(b, sq, hq * dv)
        return out, pk, pv, None

    run.kv_pairs = ((4, 1), (5, 2))
    run.kv_in_place = in_place_of(run, "attention.sdpa.kv_in_place", want_pk and want_pv)
    return run


class _Step:
    """Attention for one block of query rows, given scaled Q, K/V and the additive bias."""

    __slots__ = ("cdt", "group", "mode", "sdt", "softcap", "t1")

    def __init__(self, t1, cdt, sdt, group: int, softcap: float, mode: int) -> None:
        self.t1, self.cdt, self.sdt = t1, cdt, sdt
        self.group, self.softcap, self.mode = group, softcap, mode

    def __call__(self, qg, kk, vv, bias):
        """qg (B, Hkv, G*n, D), kk (B, Hkv, S, D), vv (B, Hkv, S, Dv) -> (y, qk output or None)."""
        t1, cdt, sdt, mode = self.t1, self.cdt, self.sdt, self.mode
        b, hkv, gn, _ = qg.shape
        shape4 = (b, hkv * self.group, gn // self.group, kk.shape[2])
        s4 = _round_to(pool_matmul(qg, kk.swapaxes(-1, -2)).reshape(shape4), t1)
        qk_out = s4.astype(t1) if mode == 0 else None
        if self.softcap > 0:
            cap = cdt.type(t1.type(self.softcap))
            np.divide(s4, cap, out=s4)
            np.tanh(_round_to(s4, t1), out=s4)
            np.multiply(_round_to(s4, t1), cap, out=s4)
            _round_to(s4, t1)
        if mode == 1:
            qk_out = s4.astype(t1)
        if bias is not None:
            np.add(s4, bias, out=s4)
            _round_to(s4, t1)
        if mode == 2:
            qk_out = s4.astype(t1)
        if sdt == _F64 and cdt != _F64:
            probs = _softmax_(s4.astype(_F64))
        elif sdt.itemsize < cdt.itemsize:
            probs = _softmax_rounded_(_round_to(s4, sdt), sdt)
        else:
            probs = _softmax_(s4)
        if bias is not None:
            # Fully-masked rows (decided on the bias, not the maybe-NaN logits) give zeros.
            dead = bias.max(axis=-1, keepdims=True) == -np.inf
            if dead.any():
                np.copyto(probs, 0, where=dead)
        if mode == 3:
            qk_out = probs.astype(t1)
        probs = _round_to(_as(probs, cdt), t1)  # the probabilities are cast to T1 for the MatMul
        return pool_matmul(probs.reshape(b, hkv, gn, shape4[3]), vv), qk_out


# ---------------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview)


@kernel(
    "FlexAttention", since=1, domain="ai.onnx.preview", factory=True, variant="flexattention.sdpa"
)
def flex_attention(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Softmax(score_mod(Q K^T * scale)) -> prob_mod -> @ V, with GQA head groups."""
    scale_attr = info.attrs.get("scale")
    precision = info.attrs.get("softmax_precision")
    if precision is not None and precision not in _PRECISION:
        raise ValueError(f"FlexAttention: unsupported softmax_precision {precision}")
    score_mod = info.subgraphs.get("score_mod")
    prob_mod = info.subgraphs.get("prob_mod")

    def modify(graph, x: np.ndarray, captured: tuple, what: str) -> np.ndarray:
        out = graph([x], captured)
        if len(out) != 1:
            raise ValueError(f"FlexAttention: {what} must return 1 output, got {len(out)}")
        y = np.asarray(out[0])
        if y.shape != x.shape:
            raise ValueError(
                f"FlexAttention: {what} must keep the shape {x.shape}, returned {y.shape}"
            )
        return y

    def run(q, k, v, *captured):
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            raise ValueError(
                f"FlexAttention: Q, K, V must be rank 4, got {q.shape}, {k.shape}, {v.shape}"
            )
        b, hq, sq, d = q.shape
        _, hkv, skv, _ = k.shape
        if k.shape[0] != b or v.shape[0] != b or v.shape[1] != hkv or v.shape[2] != skv:
            raise ValueError(f"FlexAttention: K {k.shape} and V {v.shape} do not match Q {q.shape}")
        if k.shape[3] != d:
            raise ValueError(f"FlexAttention: Q head size {d} differs from K's {k.shape[3]}")
        if hkv == 0 or hq % hkv:
            raise ValueError(f"FlexAttention: Q heads {hq} not a multiple of K/V heads {hkv}")
        group = hq // hkv
        sdt = _PRECISION[precision] if precision is not None else _compute_dtype(q.dtype)
        cdt = _compute_dtype(sdt)
        scale = 1.0 / math.sqrt(d) if scale_attr is None else float(scale_attr)
        qs = np.empty(q.shape, cdt)
        np.multiply(q, cdt.type(scale), out=qs, casting="unsafe")
        scores = pool_matmul(qs.reshape(b, hkv, group * sq, d), _as(k, cdt).swapaxes(-1, -2))
        s4 = scores.reshape(b, hq, sq, skv)
        if score_mod is not None:
            s4 = _as(modify(score_mod, s4.astype(sdt, copy=False), captured, "score_mod"), cdt)
            s4 = np.array(s4)  # a subgraph may hand back one of its own inputs; we write below
        elif sdt != cdt:
            _round_to(s4, sdt)
        probs = _softmax_(s4)
        if prob_mod is not None:
            probs = _as(modify(prob_mod, probs.astype(sdt, copy=False), captured, "prob_mod"), cdt)
        elif sdt != cdt:
            _round_to(probs, sdt)
        y = pool_matmul(probs.reshape(b, hkv, group * sq, skv), _as(v, cdt))
        return y.reshape(b, hq, sq, v.shape[3]).astype(v.dtype, copy=False)

    return run


# ---------------------------------------------------------------------------------------------
# LinearAttention


def _unpack(x: np.ndarray, heads: int, name: str) -> np.ndarray:
    """(B, T, H*D) float32 -> (B, H, T, D) view."""
    if x.ndim != 3:
        raise ValueError(f"LinearAttention: {name} must be rank 3 (B, T, H*D), got {x.shape}")
    b, t, hd = x.shape
    if hd % heads:
        raise ValueError(f"LinearAttention: {name} last dim {hd} not a multiple of {heads} heads")
    return x.reshape(b, t, heads, hd // heads).transpose(0, 2, 1, 3)


@kernel("LinearAttention", since=27, factory=True, multi_output=True, variant="linattn.recurrent")
def linear_attention(info: NodeInfo) -> Callable[..., tuple]:
    """Recurrent linear attention (linear, gated, delta, gated_delta), GQA over KV heads."""
    a = info.attrs
    rule = a.get("update_rule", "gated_delta")
    rule = rule.decode() if isinstance(rule, bytes) else rule
    hq, hkv = a.get("q_num_heads"), a.get("kv_num_heads")
    scale_attr = float(a.get("scale") or 0.0)
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ValueError(f"LinearAttention: unknown update_rule {rule!r}")
    if not hq or not hkv or hq <= 0 or hkv <= 0 or hq % hkv:
        raise ValueError(
            f"LinearAttention: q_num_heads ({hq}) must be a positive multiple of kv_num_heads "
            f"({hkv})"
        )
    gated = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    group = hq // hkv

    def run(query, key, value, past_state=None, decay=None, beta=None):
        if gated != (decay is not None):
            need = "needs" if gated else "forbids"
            raise ValueError(f"LinearAttention: update_rule {rule!r} {need} the decay input")
        if delta != (beta is not None):
            need = "needs" if delta else "forbids"
            raise ValueError(f"LinearAttention: update_rule {rule!r} {need} the beta input")
        q4 = _unpack(query, hq, "query")
        k4 = _unpack(key, hkv, "key")
        v4 = _unpack(value, hkv, "value")
        b, _, t, dk = q4.shape
        dv = v4.shape[3]
        if k4.shape[:3] != (b, hkv, t) or k4.shape[3] != dk or v4.shape[:3] != (b, hkv, t):
            raise ValueError(
                f"LinearAttention: query {query.shape}, key {key.shape}, value {value.shape} "
                "do not agree"
            )
        f32 = _F32
        if past_state is not None:
            if past_state.shape != (b, hkv, dk, dv):
                raise ValueError(
                    f"LinearAttention: past_state shape {past_state.shape} expected "
                    f"{(b, hkv, dk, dv)}"
                )
            state = past_state.astype(f32)  # always a fresh copy we may update in place
            sdt = past_state.dtype
        else:
            state = np.zeros((b, hkv, dk, dv), f32)
            sdt = query.dtype
        # Per-step operands as (T, B, H, ...) so that step i is one contiguous slice.
        qt = np.ascontiguousarray(q4.transpose(2, 0, 1, 3), dtype=f32).reshape(t, b, hkv, group, dk)
        kt = np.ascontiguousarray(k4.transpose(2, 0, 1, 3), dtype=f32)
        vt = np.ascontiguousarray(v4.transpose(2, 0, 1, 3), dtype=f32)
        if gated:
            if decay.ndim != 3 or decay.shape[:2] != (b, t):
                raise ValueError(f"LinearAttention: decay shape {decay.shape} expected (B, T, ...)")
            if decay.shape[2] == hkv * dk:
                g = decay.reshape(b, t, hkv, dk, 1)
            elif decay.shape[2] == hkv:
                g = decay.reshape(b, t, hkv, 1, 1)
            else:
                raise ValueError(
                    f"LinearAttention: decay last dim {decay.shape[2]} must be kv_num_heads "
                    f"({hkv}) or kv_num_heads*d_k ({hkv * dk})"
                )
            gexp = np.exp(np.ascontiguousarray(g.transpose(1, 0, 2, 3, 4), dtype=f32))
        if delta:
            if beta.ndim != 3 or beta.shape[:2] != (b, t) or beta.shape[2] not in (hkv, 1):
                raise ValueError(
                    f"LinearAttention: beta shape {beta.shape} expected (B, T, {hkv}) or (B, T, 1)"
                )
            bt = np.ascontiguousarray(
                beta.reshape(b, t, beta.shape[2], 1).transpose(1, 0, 2, 3), dtype=f32
            )
        out = np.empty((t, b, hkv, group, dv), f32)
        for i in range(t):
            if gated:
                state *= gexp[i]
            k_i = kt[i]  # (B, H, dk)
            if delta:
                retrieved = np.matmul(k_i[:, :, None, :], state)[:, :, 0, :]  # S^T k: (B, H, dv)
                v_i = (vt[i] - retrieved) * bt[i]
            else:
                v_i = vt[i]
            state += k_i[:, :, :, None] * v_i[:, :, None, :]
            np.matmul(qt[i], state, out=out[i])
        scale = scale_attr if scale_attr != 0.0 else 1.0 / math.sqrt(dk)
        out *= f32.type(scale)
        y = np.empty((b, t, hq * dv), query.dtype)
        np.copyto(y.reshape(b, t, hkv, group, dv), out.transpose(1, 0, 2, 3, 4), casting="unsafe")
        return y, state.astype(sdt, copy=False)

    return run
