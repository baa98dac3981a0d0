"""CPU kernels: onnxruntime's contrib normalizations: SkipLayerNormalization,
SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization, the pre-17
LayerNormalization and EmbedLayerNormalization (numba row kernels, numpy fallback).

onnxruntime registers these schemas itself; onnx knows none of them, so no attribute
defaults are filled in at plan time: every kernel reads `info.attrs.get(name, default)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo, report_variant
from onnxkiln.providers.cpu import _numba, _row_kernels
from onnxkiln.providers.cpu.contrib_transformer import MS, _cdt, _f, _float, _wants
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


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
            report_variant(f"{op.lower()}.numpy", fast.reason)
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
            report_variant(f"{tag}.numba")
            y2, mean, inv, _ = _numba.norm_rows(fast.fn, _f(x, cdt).reshape(rows, n), scale, b,
                                                eps, simplified)
            y = y2.reshape(x.shape).astype(out_dt, copy=False)
            if simplified:
                mean = None
        elif n == 0 or rows == 0:
            y = np.empty(x.shape, out_dt)
            mean = inv = np.zeros((rows, 1), cdt)
        else:
            report_variant(f"{tag}.numpy", _numba.disabled_reason() or (
                fast.reason or "scale/bias shapes differ from the normalized dims"
                if fast is not None else None))
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
