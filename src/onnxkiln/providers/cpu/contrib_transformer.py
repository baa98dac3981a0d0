"""CPU kernels: onnxruntime's com.microsoft transformer helpers.

SkipLayerNormalization, SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization,
the pre-17 LayerNormalization, EmbedLayerNormalization, Gelu, BiasGelu, FastGelu, QuickGelu,
BiasAdd, BiasSplitGelu, RotaryEmbedding, Trilu, Range, Inverse.

onnxruntime registers these contrib schemas itself; onnx knows none of them, so no attribute
defaults are filled in at plan time: every kernel here reads `info.attrs.get(name, default)`.
The attention ops live in `contrib_attention.py` and `contrib_gqa.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu import _numba, _row_kernels, _special
from onnxkiln.providers.cpu.index import trilu as _onnx_trilu
from onnxkiln.providers.cpu.registry import kernel
from onnxkiln.providers.cpu.tensor import range_ as _onnx_range

__all__: list[str] = []

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_SQRT1_2 = math.sqrt(0.5)
_GELU_K = math.sqrt(2.0 / math.pi)


def _cdt(dt: np.dtype) -> np.dtype:
    """float64 computes in float64; every other float type in float32."""
    return _F64 if dt == _F64 else _F32


def _f(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """x as dtype dt, without a copy when it already is (read-only use)."""
    return x if x.dtype == dt else x.astype(dt)


def _float(x: np.ndarray, op: str) -> np.dtype:
    if x.dtype.kind != "f" and x.dtype != _BF16:
        raise TypeError(f"{op}: expected a float tensor, got {x.dtype}")
    return _cdt(x.dtype)


def _wants(info: NodeInfo, i: int) -> bool:
    present = info.output_present
    return bool(present[i]) if i < len(present) else i < info.n_outputs


# ---------------------------------------------------------------------------------------------
# GELU family


def gelu_inplace(t: np.ndarray) -> np.ndarray:
    """Exact GELU of a fresh float32/float64 array, in place."""
    e = np.multiply(t, t.dtype.type(_SQRT1_2))
    _special.erf(e, out=e)
    e += 1
    t *= e
    t *= t.dtype.type(0.5)
    return t


def fast_gelu_inplace(t: np.ndarray) -> np.ndarray:
    """tanh-approximated GELU of a fresh float32/float64 array, in place."""
    u = np.multiply(t, t)
    u *= t.dtype.type(0.044715 * _GELU_K)
    u += t.dtype.type(_GELU_K)
    u *= t
    np.tanh(u, out=u)
    u += 1
    t *= u
    t *= t.dtype.type(0.5)
    return t


def _biased(x: np.ndarray, bias: np.ndarray | None, op: str) -> np.ndarray:
    """A fresh compute-dtype copy of x (+ bias broadcast on the last axis)."""
    cdt = _float(x, op)
    if bias is None:
        return x.astype(cdt)
    if bias.ndim != 1 or x.ndim < 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{op}: bias must be 1-D of the input's last dimension {x.shape[-1:]}, "
            f"got {bias.shape}"
        )
    return np.add(x, _f(bias, cdt), dtype=cdt)


def _gelu_factory(info: NodeInfo, tanh: bool) -> Callable[..., np.ndarray]:
    """GELU of X (+ a 1-D bias over the last axis): the float32 numba kernel when numba is
    on, else numpy (scipy's erf, or the tanh form)."""
    op = info.op_type
    tag = op.lower()
    numpy_variant = f"{tag}.{'tanh' if tanh else 'erf'}"
    why = _numba.disabled_reason()
    dt = info.input_dtypes[0] if info.input_dtypes else None
    if why is None and dt is not None and dt.numpy == _F64:
        why = "float64 runs the numpy kernel (the numba one is float32)"
    fast = None if why else _numba.lazy("gelu", _F32)
    slow = fast_gelu_inplace if tanh else gelu_inplace

    def run(x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        if fast is not None and x.dtype != _F64 and fast.ready():
            _float(x, op)
            if bias is not None and (bias.ndim != 1 or x.ndim < 1
                                     or bias.shape[0] != x.shape[-1]):
                _biased(x, bias, op)  # raises the shape error
            xc = _f(x, _F32)
            y = _numba.gelu_rows(fast.fn, xc, None if bias is None else _f(bias, _F32), tanh)
            return y.astype(x.dtype, copy=False)
        if fast is not None and fast.reason:
            run.variant, run.variant_reason = numpy_variant, fast.reason
        return slow(_biased(x, bias, op)).astype(x.dtype, copy=False)

    run.variant = f"{tag}.numba" if fast is not None else numpy_variant
    run.variant_reason = why
    return run


@kernel("Gelu", since=1, domain=MS, factory=True, variant="gelu.erf")
def ms_gelu(info: NodeInfo) -> Callable[..., np.ndarray]:
    """0.5 x (1 + erf(x / sqrt 2))."""
    return _gelu_factory(info, tanh=False)


@kernel("BiasGelu", since=1, domain=MS, factory=True, variant="biasgelu.erf")
def bias_gelu(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Exact GELU of A + B (B 1-D over the last axis)."""
    return _gelu_factory(info, tanh=False)


@kernel("FastGelu", since=1, domain=MS, factory=True, variant="fastgelu.tanh")
def fast_gelu(info: NodeInfo) -> Callable[..., np.ndarray]:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) of X (+ bias)."""
    return _gelu_factory(info, tanh=True)


@kernel("QuickGelu", since=1, domain=MS, factory=True, variant="quickgelu.expit")
def quick_gelu(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """x * sigmoid(alpha x), alpha defaulting to 1.702."""
    alpha = float(info.attrs.get("alpha", 1.702))

    def run(x: np.ndarray) -> np.ndarray:
        t = _biased(x, None, "QuickGelu")
        g = np.multiply(t, t.dtype.type(alpha))
        _special.expit(g, out=g)
        t *= g
        return t.astype(x.dtype, copy=False)

    return run


@kernel("BiasAdd", since=1, domain=MS, variant="biasadd.numpy")
def bias_add(x: np.ndarray, bias: np.ndarray, skip: np.ndarray) -> np.ndarray:
    """X + bias + skip for X, skip (N, S, C) and bias (C)."""
    if x.ndim != 3 or skip.shape != x.shape:
        raise ValueError(
            f"BiasAdd: X and skip must be the same 3-D shape, got {x.shape}, {skip.shape}"
        )
    if bias.shape != x.shape[-1:]:
        raise ValueError(f"BiasAdd: bias must have shape {x.shape[-1:]}, got {bias.shape}")
    cdt = _float(x, "BiasAdd")
    y = np.add(x, _f(bias, cdt), dtype=cdt)
    y += _f(skip, cdt)
    return y.astype(x.dtype, copy=False)


@kernel("BiasSplitGelu", since=1, domain=MS, variant="biassplitgelu.erf")
def bias_split_gelu(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """(X + bias) split in halves on the last axis: left * Gelu(right)."""
    if x.ndim != 3:
        raise ValueError(f"BiasSplitGelu: X must be 3-D (N, S, D), got {x.shape}")
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"BiasSplitGelu: hidden dimension {d} must be even")
    t = _biased(x, bias, "BiasSplitGelu")
    right = gelu_inplace(np.ascontiguousarray(t[..., d // 2 :]))
    right *= t[..., : d // 2]
    return right.astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# Normalizations


def _rows(x: np.ndarray, op: str) -> tuple[np.ndarray, int]:
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"{op}: input must have a non-empty last dimension, got {x.shape}")
    return x.reshape(-1, x.shape[-1]), x.shape[-1]


def _check_vec(v: np.ndarray | None, n: int, op: str, name: str) -> None:
    if v is not None and v.size != n:
        raise ValueError(f"{op}: {name} must have {n} elements (hidden size), got {v.shape}")


def _layer_norm_rows(s2: np.ndarray, eps: float, simplified: bool):
    """(normalized rows, mean or None, inv_std) for a fresh 2-D compute-dtype array, in place."""
    n = s2.shape[1]
    cdt = s2.dtype
    ones = np.full((n, 1), 1.0 / n, cdt)
    if simplified:
        mean = None
        ms = np.einsum("ij,ij->i", s2, s2)[:, None]
        ms *= cdt.type(1.0 / n)
    else:
        mean = np.matmul(s2, ones)
        s2 -= mean
        ms = np.einsum("ij,ij->i", s2, s2)[:, None]
        ms *= cdt.type(1.0 / n)
    ms += cdt.type(eps)
    np.sqrt(ms, out=ms)
    np.reciprocal(ms, out=ms)
    s2 *= ms
    return s2, mean, ms


def _skip_norm_factory(info: NodeInfo, simplified: bool) -> Callable[..., tuple]:
    op = info.op_type
    eps = float(info.attrs.get("epsilon", 1e-12))
    want_mean, want_inv, want_sum = _wants(info, 1), _wants(info, 2), _wants(info, 3)
    dt0 = info.input_dtypes[0] if info.input_dtypes else None
    cdt0 = _cdt(dt0.numpy) if dt0 is not None else _F32
    fast = _numba.lazy("norm_rows", cdt0)

    def run(x, skip, gamma, *rest):
        if simplified:
            beta, bias = None, (rest[0] if rest else None)
        else:
            beta = rest[0] if rest else None
            bias = rest[1] if len(rest) > 1 else None
        if x.ndim not in (2, 3):
            raise ValueError(f"{op}: input must be 2-D or 3-D, got {x.shape}")
        d = x.shape[-1]
        if skip.shape != x.shape and skip.shape not in (x.shape[-2:], (1, *x.shape[-2:])):
            raise ValueError(f"{op}: skip shape {skip.shape} does not fit input {x.shape}")
        for v, name in ((gamma, "gamma"), (beta, "beta"), (bias, "bias")):
            _check_vec(v, d, op, name)
        cdt = _float(x, op)
        stat = (*x.shape[:-1], 1)
        if fast is not None and cdt == cdt0 and x.size and fast.ready():
            y2, mean, inv, total = _numba.norm_rows(
                fast.fn, _f(x, cdt).reshape(-1, d), gamma, beta, eps, simplified,
                skip=_f(skip, cdt).reshape(-1, d), bias=bias, want_total=want_sum)
            return (
                y2.reshape(x.shape).astype(x.dtype, copy=False),
                (np.zeros(stat, _F32) if simplified else mean.reshape(stat).astype(_F32))
                if want_mean else None,
                inv.reshape(stat).astype(_F32) if want_inv else None,
                total.reshape(x.shape).astype(x.dtype, copy=False) if want_sum else None,
            )
        if fast is not None and fast.reason:
            run.variant, run.variant_reason = f"{op.lower()}.numpy", fast.reason
        s = np.add(_f(x, cdt), _f(skip, cdt))
        if bias is not None:
            s += _f(bias, cdt).reshape(-1)
        total = s.astype(x.dtype) if want_sum else None
        s2 = s
        y2, mean, inv = _layer_norm_rows(s2.reshape(-1, d), eps, simplified)
        y2 *= _f(gamma, cdt).reshape(-1)
        if beta is not None:
            y2 += _f(beta, cdt).reshape(-1)
        mean_out = None
        if want_mean:
            mean_out = (
                np.zeros(stat, _F32) if mean is None else mean.reshape(stat).astype(_F32)
            )
        inv_out = inv.reshape(stat).astype(_F32) if want_inv else None
        return y2.reshape(x.shape).astype(x.dtype, copy=False), mean_out, inv_out, total

    def specialize(dtypes, shapes, consts):
        """The numba kernel on constant gamma/beta/bias, operands prepared once."""
        sx = shapes[0]
        if (fast is None or sx is None or len(sx) not in (2, 3) or dtypes[0] != cdt0
                or shapes[1] != sx or not fast.ready()):
            return None
        d, rows = sx[-1], math.prod(sx[:-1])
        vecs = []
        for pos in ((2, None, 3) if simplified else (2, 3, 4)):  # gamma, beta, bias
            if pos is None or pos >= len(shapes) or shapes[pos] is None:
                vecs.append(None)
            elif consts[pos] is None or consts[pos].size != d:
                return None  # not constant (or the wrong size: the generic path says so)
            else:
                vecs.append(np.ascontiguousarray(consts[pos], cdt0).reshape(d))
        gamma, beta, bias = vecs
        if gamma is None:
            return None
        return _skip_norm_special(fast.fn, sx, rows, d, gamma, beta, bias, eps, simplified,
                                  (want_mean, want_inv, want_sum))

    run.variant = f"{op.lower()}.{'numba' if fast is not None else 'numpy'}"
    run.variant_reason = _numba.disabled_reason()
    run.specialize = specialize
    return run


def _skip_norm_special(fn, shape, rows, d, gamma, beta, bias, eps, simplified, wants):
    """(Skip)LayerNorm for one input shape: one numba call on prepared operands."""
    want_mean, want_inv, want_sum = wants
    stat = (*shape[:-1], 1)
    call = _row_kernels.norm_rows(fn, shape, d, gamma, beta, bias, eps, simplified, True, want_sum)

    def special(x, skip, *_):
        y, mean, inv, total = call(x, skip)
        return (y.reshape(shape),
                (np.zeros(stat, _F32) if simplified else mean.reshape(stat).astype(_F32))
                if want_mean else None,
                inv.reshape(stat).astype(_F32) if want_inv else None,
                total.reshape(shape) if want_sum else None)

    special.variant = "skiplayernormalization.numba"
    return special


@kernel("SkipLayerNormalization", since=1, domain=MS, factory=True, multi_output=True)
def skip_layer_normalization(info: NodeInfo) -> Callable[..., tuple]:
    """LayerNorm(input + skip (+ bias)) * gamma (+ beta) over the last axis."""
    return _skip_norm_factory(info, simplified=False)


@kernel("SkipSimplifiedLayerNormalization", since=1, domain=MS, factory=True, multi_output=True)
def skip_simplified_layer_normalization(info: NodeInfo) -> Callable[..., tuple]:
    """RMSNorm(input + skip (+ bias)) * gamma over the last axis; the mean output is zeros."""
    return _skip_norm_factory(info, simplified=True)


def _stash(info: NodeInfo, op: str) -> np.dtype:
    stash = int(info.attrs.get("stash_type", 1))
    if stash not in (1, 11):
        raise ValueError(f"{op}: stash_type must be 1 (float) or 11 (double), got {stash}")
    return _F64 if stash == 11 else _F32


def _norm_axis_factory(info: NodeInfo, simplified: bool) -> Callable[..., tuple]:
    op = info.op_type
    axis = int(info.attrs.get("axis", -1))
    eps = float(info.attrs.get("epsilon", 1e-5))
    stash = _stash(info, op)
    stat_i = 1 if simplified else 2  # output index of inv_std_var
    want_mean = not simplified and _wants(info, 1)
    want_inv = _wants(info, stat_i)
    dt0 = info.input_dtypes[0] if info.input_dtypes else None
    cdt0 = _F64 if _F64 in (dt0.numpy if dt0 is not None else None, stash) else _F32
    fast = _numba.lazy("norm_rows", cdt0)
    tag = op.lower()

    def run(x, scale, b=None):
        ax = axis + x.ndim if axis < 0 else axis
        if not 0 <= ax < x.ndim:
            raise ValueError(f"{op}: axis {axis} out of range for rank {x.ndim}")
        lead = x.shape[:ax]
        n = math.prod(x.shape[ax:])
        rows = math.prod(lead)
        cdt = _F64 if _F64 in (x.dtype, stash) else _F32
        out_dt = scale.dtype
        stat = (*lead, *(1,) * (x.ndim - ax))
        if (fast is not None and cdt == cdt0 and n and rows and scale.shape == x.shape[ax:]
                and (b is None or b.shape == x.shape[ax:]) and fast.ready()):
            run.variant, run.variant_reason = f"{tag}.numba", None
            y2, mean, inv, _ = _numba.norm_rows(fast.fn, _f(x, cdt).reshape(rows, n), scale, b,
                                                eps, simplified)
            y = y2.reshape(x.shape).astype(out_dt, copy=False)
            if simplified:
                mean = None
        elif n == 0 or rows == 0:
            y = np.empty(x.shape, out_dt)
            mean = inv = np.zeros((rows, 1), cdt)
        else:
            run.variant = f"{tag}.numpy"
            run.variant_reason = _numba.disabled_reason() or (
                fast.reason or "scale/bias shapes differ from the normalized dims"
                if fast is not None else None)
            y2, mean, inv = _layer_norm_rows(x.reshape(rows, n).astype(cdt), eps, simplified)
            y = y2.reshape(x.shape)
            try:
                y *= _f(scale, cdt)
                if b is not None:
                    y += _f(b, cdt)
            except ValueError as e:
                raise ValueError(
                    f"{op}: scale {scale.shape} / bias do not broadcast to X {x.shape}"
                ) from e
            y = y.astype(out_dt, copy=False)
        inv_out = inv.reshape(stat).astype(stash) if want_inv else None
        if simplified:
            return y, inv_out
        mean_out = mean.reshape(stat).astype(stash) if want_mean else None
        return y, mean_out, inv_out

    if stash == cdt0:  # the numba kernel's statistics are in the stash type
        run.specialize = _row_kernels.axis_norm_specializer(
            fast, cdt0, axis, eps, simplified, lambda dts: dts[1] if len(dts) > 1 else None,
            stash, want_mean, want_inv)
    run.variant = f"{tag}.{'numba' if fast is not None else 'numpy'}"
    run.variant_reason = _numba.disabled_reason()
    return run


@kernel("SimplifiedLayerNormalization", since=1, factory=True, multi_output=True)
def simplified_layer_normalization(info: NodeInfo) -> Callable[..., tuple]:
    """RMSNorm over dims [axis, rank): X / sqrt(mean(X^2) + epsilon) * scale (ai.onnx, ORT)."""
    return _norm_axis_factory(info, simplified=True)


kernel("SimplifiedLayerNormalization", since=1, domain=MS, factory=True, multi_output=True)(
    simplified_layer_normalization
)


@kernel("LayerNormalization", since=1, until=16, factory=True, multi_output=True)
def layer_normalization_contrib(info: NodeInfo) -> Callable[..., tuple]:
    """onnxruntime's LayerNormalization for ai.onnx opsets before 17 (outputs in scale's type)."""
    return _norm_axis_factory(info, simplified=False)


@kernel("EmbedLayerNormalization", since=1, domain=MS, factory=True, multi_output=True)
def embed_layer_normalization(info: NodeInfo) -> Callable[..., tuple]:
    """LayerNorm(word[ids] + position[pos] (+ segment[seg])); mask_index = per-row mask sums."""
    eps = float(info.attrs.get("epsilon", 1e-12))
    want_mask, want_sum = _wants(info, 1), _wants(info, 2)

    def lookup(table: np.ndarray, ids: np.ndarray, name: str) -> np.ndarray:
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise IndexError(
                f"EmbedLayerNormalization: {name} ids must lie in [0, {table.shape[0]}), got "
                f"[{ids.min()}, {ids.max()}]"
            )
        return table[ids]

    def run(ids, seg, word, pos_table, seg_table, gamma, beta, mask=None, position_ids=None):
        if ids.ndim != 2:
            raise ValueError(f"EmbedLayerNormalization: input_ids must be 2-D, got {ids.shape}")
        b, s = ids.shape
        d = word.shape[-1]
        cdt = _float(word, "EmbedLayerNormalization")
        if position_ids is None:
            pos = np.arange(s)[None, :]
        else:
            if position_ids.shape not in ((b, s), (1, s)):
                raise ValueError(
                    f"EmbedLayerNormalization: position_ids shape {position_ids.shape} "
                    f"expected {(b, s)} or {(1, s)}"
                )
            pos = position_ids
        emb = lookup(word, ids, "word").astype(cdt, copy=False)
        emb = emb + lookup(pos_table, pos, "position").astype(cdt, copy=False)
        if seg is not None and seg_table is not None:
            if seg.shape != ids.shape:
                raise ValueError(
                    f"EmbedLayerNormalization: segment_ids {seg.shape} must match {ids.shape}"
                )
            emb += lookup(seg_table, seg, "segment").astype(cdt, copy=False)
        total = emb.astype(word.dtype) if want_sum else None
        y2, _, _ = _layer_norm_rows(emb.reshape(-1, d), eps, simplified=False)
        y2 *= _f(gamma, cdt).reshape(-1)
        y2 += _f(beta, cdt).reshape(-1)
        mask_index = None
        if want_mask:
            if mask is None:
                mask_index = np.zeros(b, np.int32)
            else:
                if mask.shape != ids.shape:
                    raise ValueError(
                        f"EmbedLayerNormalization: mask {mask.shape} must match {ids.shape}"
                    )
                mask_index = mask.sum(axis=1, dtype=np.int32)
        return y2.reshape(b, s, d).astype(word.dtype, copy=False), mask_index, total

    return run


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding (com.microsoft)


def rotate(x4: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """x4 (..., D) with its first 2 * cos.shape[-1] channels rotated; cos/sin broadcast.

    Returns a fresh array of x4's dtype; the arithmetic runs in float32 (float64 for double).
    """
    half = cos.shape[-1]
    rot = 2 * half
    cdt = _cdt(x4.dtype)
    if interleaved:
        x1, x2 = x4[..., 0:rot:2], x4[..., 1:rot:2]
    else:
        x1, x2 = x4[..., :half], x4[..., half:rot]
    x1 = _f(x1, cdt)
    x2 = _f(x2, cdt)
    real = x1 * cos
    real -= x2 * sin
    imag = x1 * sin
    imag += x2 * cos
    out = np.empty(x4.shape, x4.dtype)
    if interleaved:
        np.copyto(out[..., 0:rot:2], real, casting="unsafe")
        np.copyto(out[..., 1:rot:2], imag, casting="unsafe")
    else:
        np.copyto(out[..., :half], real, casting="unsafe")
        np.copyto(out[..., half:rot], imag, casting="unsafe")
    if rot < x4.shape[-1]:
        out[..., rot:] = x4[..., rot:]
    return out


def cache_rows(cache: np.ndarray, pos: np.ndarray, op: str, name: str) -> np.ndarray:
    """cache[pos] with a clear error for positions outside the cache."""
    n = cache.shape[0]
    if pos.size and (pos.min() < 0 or pos.max() >= n):
        raise IndexError(
            f"{op}: positions must lie in [0, {n}) of {name}, got [{pos.min()}, {pos.max()}]"
        )
    return cache[pos]


@kernel("RotaryEmbedding", since=1, domain=MS, factory=True, variant="rope.ms.numpy")
def rotary_embedding_ms(info: NodeInfo) -> Callable[..., np.ndarray]:
    """RoPE on (B, S, hidden) or (B, N, S, H) input with (max_len, rot/2) cos/sin caches."""
    interleaved = bool(info.attrs.get("interleaved", 0))
    packed = bool(info.attrs.get("is_packed_batching", 0))
    num_heads = int(info.attrs.get("num_heads", 0))
    rot_attr = int(info.attrs.get("rotary_embedding_dim", 0))
    op = "RotaryEmbedding"
    if rot_attr > 0 and num_heads <= 0:
        raise ValueError(f"{op}: num_heads must be provided with rotary_embedding_dim")

    def run(x, position_ids, cos_cache, sin_cache):
        if cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape:
            raise ValueError(
                f"{op}: cos_cache/sin_cache must be the same 2-D shape, got "
                f"{cos_cache.shape}, {sin_cache.shape}"
            )
        if x.ndim == 4:
            b, n, s, d = x.shape
            x4 = x.transpose(0, 2, 1, 3)  # (B, S, N, H)
        elif x.ndim == 3:
            b, s, hidden = x.shape
            if num_heads > 0:
                n = num_heads
            else:
                n = hidden // (2 * cos_cache.shape[1]) if cos_cache.shape[1] else 0
            if n <= 0 or hidden % n:
                raise ValueError(
                    f"{op}: cannot split hidden size {hidden} into heads (num_heads={num_heads})"
                )
            d = hidden // n
            x4 = x.reshape(b, s, n, d)
        else:
            raise ValueError(f"{op}: input must be 3-D or 4-D, got {x.shape}")
        rot = rot_attr if rot_attr > 0 else min(d, 2 * cos_cache.shape[1])
        if rot % 2 or rot > d or rot // 2 > cos_cache.shape[1]:
            raise ValueError(
                f"{op}: rotary dim {rot} must be even, <= head size {d} and <= 2 * cache width "
                f"{cos_cache.shape[1]}"
            )
        pid = np.asarray(position_ids, np.int64)
        if pid.size == 1 and not packed:
            pos = pid.reshape(-1)[0] + np.arange(s)[None, :]
        elif pid.shape == (b, s):
            pos = pid
        else:
            raise ValueError(f"{op}: position_ids shape {pid.shape} expected (1) or {(b, s)}")
        cdt = _cdt(x.dtype)
        half = rot // 2
        cos = cache_rows(cos_cache[:, :half], pos, op, "cos_cache").astype(cdt, copy=False)
        sin = cache_rows(sin_cache[:, :half], pos, op, "sin_cache").astype(cdt, copy=False)
        out4 = rotate(x4, cos[:, :, None, :], sin[:, :, None, :], interleaved)
        if x.ndim == 4:
            return np.ascontiguousarray(out4.transpose(0, 2, 1, 3))
        return out4.reshape(x.shape)

    return run


# ---------------------------------------------------------------------------------------------
# Trilu, Range, Inverse


kernel("Trilu", since=1, domain=MS, factory=True)(_onnx_trilu)


@kernel("Range", since=1, domain=MS, factory=True, capture=CaptureSupport.DATA_DEPENDENT_SHAPE)
def range_ms(info: NodeInfo) -> Callable[..., np.ndarray]:
    """start, start + delta, ... below limit; delta defaults to 1."""
    inner = _onnx_range(info)

    def run(start: np.ndarray, limit: np.ndarray, delta: np.ndarray | None = None) -> np.ndarray:
        if delta is None:
            delta = np.ones((), start.dtype)
        if not start.dtype == limit.dtype == delta.dtype:
            raise TypeError(
                f"Range: start, limit and delta must share a type, got {start.dtype}, "
                f"{limit.dtype}, {delta.dtype}"
            )
        return inner(start, limit, delta)

    return run


@kernel("Inverse", since=1, domain=MS, variant="inverse.lapack")
def inverse(x: np.ndarray) -> np.ndarray:
    """The inverse of each square matrix in the last two axes."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Inverse: input must be [..., N, N], got {x.shape}")
    cdt = _float(x, "Inverse")
    try:
        y = np.linalg.inv(_f(x, cdt))
    except np.linalg.LinAlgError as e:
        raise ValueError(f"Inverse: a matrix in the batch is singular ({e})") from e
    return y.astype(x.dtype, copy=False)
