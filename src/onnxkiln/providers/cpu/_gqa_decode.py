"""The float32 GroupQueryAttention decode step in one compiled pass (_numba_gqa's kernel):
which calls it takes, and their operands.

`decode` checks that a call is one the kernel covers (one query row per batch entry, float32,
packed or separate QKV, a float past, rotary tables in range), prepares the operands, and
returns None otherwise so that GroupQueryAttention keeps its numpy path (which also raises
the errors for bad input). Imports numpy only: numba loads when a run first needs the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxkiln.kv_attention import note_written
from onnxkiln.providers.cpu import _numba

__all__ = ["decode"]

_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)
_NO_TABLE = np.zeros((1, 1), np.float32)
# reassoc lets LLVM vectorize the dot products and sums (the order differs from BLAS's anyway);
# no "contract": the rotary products round separately, as numpy's, so no fused multiply-add
FASTMATH = {"reassoc", "nsz", "arcp"}


def _signature(dt: np.dtype) -> tuple:
    """The numba signature of `gqa_decode` (float32 only)."""
    from numba import types

    f = types.float32

    def arr(nd: int, ro: bool = True, t=f):
        return types.Array(t, nd, "C", readonly=ro)

    return (arr(2), arr(2), arr(2), arr(4), arr(4), arr(4, False), arr(4, False),
            arr(1, t=types.int64), arr(1, t=types.int64), arr(2), arr(2),
            types.UniTuple(types.int64, 12), types.UniTuple(f, 3), arr(2, False))


_numba.register("gqa_decode", "onnxkiln.providers.cpu._numba_gqa", _signature, (_F32,),
                FASTMATH)


def _f32_c(x: np.ndarray) -> bool:
    return x.dtype == _F32 and x.flags.c_contiguous


def _qkv(query, key, value, n: int, nk: int):
    """(q, k, v as (B, width) rows, their column offsets, head size, value head size), or
    None for shapes the kernel does not take (the numpy path checks and raises)."""
    b, _, d = query.shape
    if key is None and value is None:
        if d % (n + 2 * nk):
            return None
        h = d // (n + 2 * nk)
        qa = query.reshape(b, d)
        return qa, qa, qa, (0, n * h, (n + nk) * h), h, h
    if key is None or value is None or d % n or key.ndim != 3 or value.ndim != 3 \
            or key.shape[:2] != (b, 1) or value.shape[:2] != (b, 1) \
            or not (_f32_c(key) and _f32_c(value)):
        return None
    h = d // n
    if key.shape[2] != nk * h or value.shape[2] % nk:
        return None
    return (query.reshape(b, d), key.reshape(b, -1), value.reshape(b, -1), (0, 0, 0), h,
            value.shape[2] // nk)


def _tables_fit(cos_cache, sin_cache, position_ids, b: int, h: int) -> bool:
    """Whether the kernel takes these rotary tables (float32, C-contiguous, as wide as half a
    head at most) and position ids (one per entry); the rows are range-checked by the kernel."""
    if cos_cache is None or sin_cache is None or not (_f32_c(cos_cache) and _f32_c(sin_cache)):
        return False
    if cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape or 2 * cos_cache.shape[1] > h:
        return False
    return position_ids is None or position_ids.shape == (b, 1)


def _bound_fit(into, b: int, nk: int, h: int, hv: int) -> bool:
    """Whether the bound present buffers of an in-place step are ones the kernel writes:
    writable float32 C-contiguous (b, nk, capacity, h / hv) numpy arrays (the numpy path
    writes the others)."""
    pk, pv = into[0].tensor, into[1].tensor
    return (type(pk) is np.ndarray and type(pv) is np.ndarray and _f32_c(pk) and _f32_c(pv)
            and pk.flags.writeable and pv.flags.writeable and pk.shape[:2] == (b, nk)
            and pv.shape[:2] == (b, nk) and pk.shape[3] == h and pv.shape[3] == hv)


def decode(fn: Any, n: int, nk: int, rotary: bool, interleaved: bool, scale: float | None,
           softcap: float, window: int, query, key, value, past_key, past_value, seqlens_k, total,
           cos_cache, sin_cache, position_ids, into: Sequence[Any] | None,
           memo: list | None = None):
    """(out (B, 1, N*Hv), present_key, present_value) by `fn` (the compiled gqa_decode) for
    a float32 one-token step over a float past, or None when this call is outside what the
    kernel covers. `into`: the bindings of an in-place step (written at seqlens_k).

    `memo`: a one-entry list the node keeps; a call with the same shapes (but the past's
    length) and the same bound buffers and rotary tables (the same objects) as the last one
    skips checking them again (a decode loop makes the same call every step)."""
    if query.ndim != 3 or query.shape[1] != 1 or query.shape[0] == 0 or not _f32_c(query) \
            or past_key is None or past_value is None or seqlens_k is None or total is None \
            or total.size != 1:
        return None
    tot = int(total.reshape(-1)[0])
    past_len = past_key.shape[2]
    cap = max(past_len, tot)
    pk_shape, pv_shape = past_key.shape, past_value.shape
    # the layout of this call's fresh arrays (a step's query, key, value, past views) and the
    # objects it reuses every step (the bound buffers, the rotary tables), held by the memo
    shapes = (query.shape, None if key is None else key.shape,
              None if value is None else value.shape, pk_shape[:2], pk_shape[3:],
              pv_shape[:2], pv_shape[3:], past_key.dtype, past_value.dtype, seqlens_k.shape,
              None if position_ids is None else position_ids.shape)
    held = (None, None) if into is None else (into[0], into[1])
    hit = memo[0] if memo is not None else None
    if (hit is not None and hit[0] == shapes and hit[1] is held[0] and hit[2] is held[1]
            and hit[3] is cos_cache and hit[4] is sin_cache
            and (key is None or _f32_c(key)) and (value is None or _f32_c(value))):
        layout = hit[5]
    else:
        layout = _layout(n, nk, rotary, interleaved, scale, softcap, window, query, key, value,
                         past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                         into)
        if layout is None:
            return None
        if memo is not None:
            memo[0] = (shapes, *held, cos_cache, sin_cache, layout)
    b, h, hv, reals, dims, cos, sin = layout
    if into is None:
        if not (past_key.flags.c_contiguous and past_value.flags.c_contiguous):
            return None
        bufs = (past_key, past_value, np.empty((b, nk, cap, h), _F32),
                np.empty((b, nk, cap, hv), _F32))
    else:
        pk, pv = into[0].tensor, into[1].tensor  # checked with the layout; still the same
        if pk.shape[2] < cap or pv.shape[2] < cap:
            return None  # the numpy path raises the capacity error
        bufs = (pk, pv, pk, pv)
    seqlens = seqlens_k.astype(_I64)
    rows = seqlens
    if rotary and position_ids is not None:
        rows = np.ascontiguousarray(position_ids, _I64).reshape(b)
        if tot == 1:  # a one-token first prompt: onnxruntime reads only the first element
            rows = np.full(b, rows[0], _I64)
    qa = query.reshape(b, -1)
    ka = qa if key is None else key.reshape(b, -1)
    va = qa if value is None else value.reshape(b, -1)
    out = np.empty((b, n * hv), _F32)
    if fn(qa, ka, va, *bufs, seqlens, rows, cos, sin, (*dims, tot), reals, out):
        return None  # a position outside [0, total) or the rotary tables: nothing written
    if into is None:
        return out.reshape(b, 1, n * hv), bufs[2], bufs[3]
    note_written(into[0], b * nk * h * 4)
    note_written(into[1], b * nk * hv * 4)
    return out.reshape(b, 1, n * hv), bufs[2][:, :, :cap], bufs[3][:, :, :cap]


def _layout(n: int, nk: int, rotary: bool, interleaved: bool, scale: float | None,
            softcap: float, window: int, query, key, value, past_key, past_value, seqlens_k,
            cos_cache, sin_cache, position_ids, into):
    """What a call's operand layout fixes: (batch, head size, value head size, the kernel's
    real and integer parameters but the total length, cos, sin), or None when the kernel
    does not take it."""
    got = _qkv(query, key, value, n, nk)
    if got is None:
        return None
    qa, _, _, offs, h, hv = got
    b, past_len = qa.shape[0], past_key.shape[2]
    if past_key.dtype != _F32 or past_value.dtype != _F32 or seqlens_k.shape != (b,) \
            or past_key.shape != (b, nk, past_len, h) or past_value.shape != (b, nk, past_len, hv):
        return None
    cos, sin = _NO_TABLE, _NO_TABLE
    if rotary:
        if not _tables_fit(cos_cache, sin_cache, position_ids, b, h):
            return None
        cos, sin = cos_cache, sin_cache
    if into is not None and not _bound_fit(into, b, nk, h, hv):
        return None
    scale = scale if scale else 1.0 / math.sqrt(h)
    reals = (np.float32(scale), np.float32(1.0 / softcap if softcap > 0 else 0.0),
             np.float32(softcap))
    dims = (n, nk, h, hv, *offs, int(into is None), int(rotary), int(interleaved), window)
    return b, h, hv, reals, dims, cos, sin
