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


def _tables(cos_cache, sin_cache, position_ids, seqlens, b: int, h: int, total: int):
    """(cos, sin, table row per entry) of a rotary step, or None when the kernel does not
    take them. The rows are range-checked by the kernel."""
    if cos_cache is None or sin_cache is None or not (_f32_c(cos_cache) and _f32_c(sin_cache)):
        return None
    if cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape or 2 * cos_cache.shape[1] > h:
        return None
    if position_ids is None:
        return cos_cache, sin_cache, seqlens
    if position_ids.shape != (b, 1):
        return None
    rpos = np.ascontiguousarray(position_ids, _I64).reshape(b)
    if total == 1:  # a one-token first prompt: onnxruntime reads only the first element
        rpos = np.full(b, rpos[0], _I64)
    return cos_cache, sin_cache, rpos


def _presents(into, past_key, past_value, b: int, nk: int, cap: int, h: int, hv: int):
    """(past k, past v, present k, present v, copy the past?) or None: fresh presents, or the
    bound buffers (already holding the past) of an in-place step."""
    if into is None:
        if not (past_key.flags.c_contiguous and past_value.flags.c_contiguous):
            return None
        return (past_key, past_value, np.empty((b, nk, cap, h), _F32),
                np.empty((b, nk, cap, hv), _F32), 1)
    pk, pv = into[0].tensor, into[1].tensor
    if not all(isinstance(x, np.ndarray) and _f32_c(x) and x.shape[:2] == (b, nk)
               and x.shape[2] >= cap for x in (pk, pv)) or pk.shape[3] != h or pv.shape[3] != hv:
        return None  # the numpy path writes them (or raises the capacity error)
    return pk, pv, pk, pv, 0


def decode(fn: Any, n: int, nk: int, rotary: bool, interleaved: bool, scale: float | None,
           softcap: float, window: int, query, key, value, past_key, past_value, seqlens_k, total,
           cos_cache, sin_cache, position_ids, into: Sequence[Any] | None):
    """(out (B, 1, N*Hv), present_key, present_value) by `fn` (the compiled gqa_decode) for
    a float32 one-token step over a float past, or None when this call is outside what the
    kernel covers. `into`: the bindings of an in-place step (written at seqlens_k)."""
    if query.ndim != 3 or query.shape[1] != 1 or query.shape[0] == 0 or not _f32_c(query) \
            or past_key is None or past_value is None or seqlens_k is None or total is None \
            or total.size != 1:
        return None
    got = _qkv(query, key, value, n, nk)
    if got is None:
        return None
    qa, ka, va, offs, h, hv = got
    b, past_len = qa.shape[0], past_key.shape[2]
    if past_key.dtype != _F32 or past_value.dtype != _F32 or seqlens_k.shape != (b,) \
            or past_key.shape != (b, nk, past_len, h) or past_value.shape != (b, nk, past_len, hv):
        return None
    tot = int(total.reshape(-1)[0])
    seqlens = seqlens_k.astype(_I64)
    cap = max(past_len, tot)
    tables = (_NO_TABLE, _NO_TABLE, seqlens)
    if rotary:
        tables = _tables(cos_cache, sin_cache, position_ids, seqlens, b, h, tot)
    bufs = None if tables is None else _presents(into, past_key, past_value, b, nk, cap, h, hv)
    if bufs is None:
        return None
    out = np.empty((b, n * hv), _F32)
    scale = scale if scale else 1.0 / math.sqrt(h)
    reals = (np.float32(scale), np.float32(1.0 / softcap if softcap > 0 else 0.0),
             np.float32(softcap))
    dims = (n, nk, h, hv, *offs, bufs[4], int(rotary), int(interleaved), window, tot)
    if fn(qa, ka, va, *bufs[:4], seqlens, tables[2], tables[0], tables[1], dims, reals, out):
        return None  # a position outside [0, total) or the rotary tables: nothing written
    if into is None:
        return out.reshape(b, 1, n * hv), bufs[2], bufs[3]
    from onnxkiln.kv_attention import note_written

    note_written(into[0], b * nk * h * 4)
    note_written(into[1], b * nk * hv * 4)
    return out.reshape(b, 1, n * hv), bufs[2][:, :, :cap], bufs[3][:, :, :cap]
