"""numba products of a few rows (loaded through `_numba.register`; imported only when a run
first needs them): `gemv_rowsR` computes c[r0:r0+R, n0:n1] = a[r0:r0+R] @ bt[n0:n1].T, and
`axpy_rows` c[:, n0:n1] = a @ b[:, n0:n1] with B as (K, N).

OpenBLAS is weak with 2-16 rows (decode steps of a batch, batch-1 heads): it packs B for
every call, so a (4, 768) @ (768, 768) product costs 3-6x the one-row GEMV. Here B is given
transposed (bt: one contiguous row of K per output column), read once per call, and each of
its rows meets R rows of A held in registers: R dot products share every load of bt. One
function per R (1, 2, 4, 8) because the accumulators must be separate locals to stay in
registers; `rows_product` (in _gemm) covers any row count with them. Inner-loop indices are
np.uintp (numba's negative-index check would stop vectorization); `zero` is 0 in the
dtype, so the sums stay in it.
"""

from __future__ import annotations

import numpy as np


def gemv_rows1(a, bt, r0, n0, n1, zero, c):
    """One row of A against bt[n0:n1]."""
    k_len = bt.shape[1]
    for n in range(n0, n1):
        s0 = zero
        for k in range(k_len):
            s0 += bt[n, np.uintp(k)] * a[r0, np.uintp(k)]
        c[r0, n] = s0


def gemv_rows2(a, bt, r0, n0, n1, zero, c):
    """Two rows of A against bt[n0:n1]."""
    k_len = bt.shape[1]
    for n in range(n0, n1):
        s0 = s1 = zero
        for k in range(k_len):
            b = bt[n, np.uintp(k)]
            s0 += b * a[r0, np.uintp(k)]
            s1 += b * a[r0 + 1, np.uintp(k)]
        c[r0, n] = s0
        c[r0 + 1, n] = s1


def gemv_rows4(a, bt, r0, n0, n1, zero, c):
    """Four rows of A against bt[n0:n1]."""
    k_len = bt.shape[1]
    for n in range(n0, n1):
        s0 = s1 = s2 = s3 = zero
        for k in range(k_len):
            b = bt[n, np.uintp(k)]
            s0 += b * a[r0, np.uintp(k)]
            s1 += b * a[r0 + 1, np.uintp(k)]
            s2 += b * a[r0 + 2, np.uintp(k)]
            s3 += b * a[r0 + 3, np.uintp(k)]
        c[r0, n] = s0
        c[r0 + 1, n] = s1
        c[r0 + 2, n] = s2
        c[r0 + 3, n] = s3


def gemv_rows8(a, bt, r0, n0, n1, zero, c):
    """Eight rows of A against bt[n0:n1]."""
    k_len = bt.shape[1]
    for n in range(n0, n1):
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
        for k in range(k_len):
            b = bt[n, np.uintp(k)]
            s0 += b * a[r0, np.uintp(k)]
            s1 += b * a[r0 + 1, np.uintp(k)]
            s2 += b * a[r0 + 2, np.uintp(k)]
            s3 += b * a[r0 + 3, np.uintp(k)]
            s4 += b * a[r0 + 4, np.uintp(k)]
            s5 += b * a[r0 + 5, np.uintp(k)]
            s6 += b * a[r0 + 6, np.uintp(k)]
            s7 += b * a[r0 + 7, np.uintp(k)]
        c[r0, n] = s0
        c[r0 + 1, n] = s1
        c[r0 + 2, n] = s2
        c[r0 + 3, n] = s3
        c[r0 + 4, n] = s4
        c[r0 + 5, n] = s5
        c[r0 + 6, n] = s6
        c[r0 + 7, n] = s7


def axpy_rows(a, b, n0, n1, zero, c):
    """c[:, n0:n1] = a @ b[:, n0:n1] for B as (K, N): per tile of columns, one scaled row of
    B added into each row of C (the tile of C stays in L1 while B streams past once)."""
    m_len, k_len = a.shape
    tile = 1024
    for t0 in range(n0, n1, tile):
        w = min(t0 + tile, n1) - t0
        for m in range(m_len):
            for j in range(w):
                c[m, np.uintp(t0 + j)] = zero
        for k in range(k_len):
            for m in range(m_len):
                av = a[m, k]
                for j in range(w):
                    c[m, np.uintp(t0 + j)] += av * b[k, np.uintp(t0 + j)]
