"""numba body of the one-pass float32 GroupQueryAttention decode step (loaded through
`_numba.register` by providers/cpu/_gqa_decode; imported only when a run first needs it).

The numpy path spends a decode step in a few dozen small dispatches per node (split, rotary
on q and k, present = past + new, scores, softmax, weighted sum). `gqa_decode` does them in
one loop nest per batch entry: rotate k into the cache row at seqlens_k, copy v there, then
for every query head rotate q, score the valid keys (the last local_window_size ones when
windowed), soft-cap, softmax (max subtracted, float32) and sum the values.

Arithmetic is float32 as in the numpy path. Rotary products and differences round exactly as
numpy's (no fused multiply-add: no "contract" flag), so the cache rows are the numpy path's
bits; the dot products, the softmax denominator and the weighted sums add in another order
than BLAS's and numpy's pairwise sums (vectorized: reassociation is allowed), and expf may
differ from numpy's vectorized exp by an ulp, so the attention output agrees to ~1e-6
relative, not bit for bit. Inner-loop indices are np.uintp (numba's negative-index check
would stop vectorization).
"""

from __future__ import annotations

import numba
import numpy as np


def _inline(fn):
    """A helper inlined into the kernel (numba IR inlining: the kernel's arithmetic flags)."""
    return numba.njit(nogil=True, inline="always", error_model="numpy")(fn)


@_inline
def _rotate_row(x, x0, h, half, interleaved, cos, sin, p, dst):
    """dst[:h] = x[x0:x0 + h] with its first 2 * half channels rotated by table row p."""
    for d in range(half):
        if interleaved:
            a, b = x[x0 + 2 * d], x[x0 + 2 * d + 1]
        else:
            a, b = x[x0 + d], x[x0 + half + d]
        c, s = cos[p, d], sin[p, d]
        re = a * c
        re -= b * s
        im = a * s
        im += b * c
        if interleaved:
            dst[2 * d], dst[2 * d + 1] = re, im
        else:
            dst[d], dst[half + d] = re, im
    for d in range(2 * half, h):
        dst[d] = x[x0 + d]


@_inline
def _fill(dst, src, keep):
    """dst rows [0, keep) from src, the rest zero (explicit loops: numba's 2-D slice copies
    are slower)."""
    zero = np.float32(0.0)
    width = dst.shape[1]
    for r in range(dst.shape[0]):
        for d in range(width):
            dst[r, np.uintp(d)] = src[r, np.uintp(d)] if r < keep else zero


@_inline
def _attend(qr, kb, vb, start, t, reals, scores, orow):
    """orow = softmax(scaled, soft-capped q.k over rows [start, t)) @ v of one head."""
    scale, inv_cap, softcap = reals
    zero = np.float32(0.0)
    h, hv = kb.shape[1], vb.shape[1]
    top = np.float32(-np.inf)
    for u in range(start, t):
        acc = zero
        for d in range(h):
            acc += qr[np.uintp(d)] * kb[u, np.uintp(d)]
        acc *= scale
        if softcap > zero:
            acc *= inv_cap
            acc = np.tanh(acc)
            acc *= softcap
        scores[u] = acc
        top = max(top, acc)
    total = zero
    for u in range(start, t):
        e = np.exp(scores[u] - top)
        scores[u] = e
        total += e
    inv = np.float32(1.0) / max(total, np.float32(1.0))  # as the numpy softmax_
    orow[:] = zero
    for u in range(start, t):
        w = scores[u] * inv
        for d in range(hv):
            orow[np.uintp(d)] += w * vb[u, np.uintp(d)]


def gqa_decode(qa, ka, va, past_k, past_v, pres_k, pres_v, pos, rpos, cos, sin, dims,
               reals, out):
    """One decode step of every batch entry b: the new key/value go to row pos[b] of
    pres_k/pres_v (first filled from past_* when dims[7], the growing form), then each query
    head attends over rows [start, pos[b] + 1) of its kv head into out[b]. Returns 0, or 1
    without writing anything when a position lies outside [0, total) or the rotary tables."""
    n, nk, h, hv, q_off, k_off, v_off, copy_past, rotary, interleaved, window, total = dims
    half = cos.shape[1] if rotary else 0
    g = n // nk
    cap = pres_k.shape[2]
    for b in range(qa.shape[0]):  # check every position before writing anything
        if pos[b] < 0 or pos[b] >= total or pos[b] >= cap:
            return 1
        if rotary and (rpos[b] < 0 or rpos[b] >= cos.shape[0]):
            return 1
    qr = np.empty(h, np.float32)
    scores = np.empty(cap, np.float32)
    for b in range(qa.shape[0]):
        p = pos[b]
        start = max(0, p + 1 - window) if window > 0 else 0
        for j in range(nk):
            kb, vb = pres_k[b, j], pres_v[b, j]  # (C, H) views: no per-element 4-D indexing
            if copy_past:
                keep = min(p, past_k.shape[2])
                _fill(kb, past_k[b, j], keep)
                _fill(vb, past_v[b, j], keep)
            _rotate_row(ka[b], k_off + j * h, h, half, interleaved, cos, sin, rpos[b], kb[p])
            vb[p] = va[b, v_off + j * hv: v_off + (j + 1) * hv]
        for i in range(n):
            _rotate_row(qa[b], q_off + i * h, h, half, interleaved, cos, sin, rpos[b], qr)
            _attend(qr, pres_k[b, i // g], pres_v[b, i // g], start, p + 1, reals, scores,
                    out[b, i * hv: (i + 1) * hv])
    return 0
