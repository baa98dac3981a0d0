"""numba loops behind MatMulNBits at accuracy level 4 (loaded through `_numba.register`;
imported only when a run first needs them).

`nbits_tiles` computes y[:, tiles t0..t1) of A @ W.T straight from the packed weights: B is
repacked once (contrib_nbits._tiles) into tiles of TILE output columns, each tile holding,
per K block and byte j, the TILE bytes of its columns side by side. The innermost loops run
across output columns (contiguous, no reduction), so they vectorize without fastmath and the
arithmetic order is exactly the one written here.

A byte's values are never unpacked with integer shifts (numba widens integer arithmetic to
int64, which does not vectorize well): with f = float(byte) and f_p = floor(f / 2^(bits*p)),
value p is f_p - 2^bits * f_(p+1), so sum_p a_p * value_p = sum_p c_p * f_p with
c_0 = a_0 and c_p = a_p - 2^bits * a_(p-1). `nbits_quantize` writes the int8 activations in
that form. Every term is an integer, and every partial sum of a block stays below 2^24, so a
block's sum s is exact in float32; s - zero_point * sum(a) is then the exact integer dot
product of the int8 activations with (q - zero_point), scaled as
acc += (a_scale * b_scale) * dot, block after block, the order contrib_nbits' numpy path uses:
both give the same bits.
"""

from __future__ import annotations

import numba
import numpy as np

TILE = 32  # output columns per tile: four AVX2 (two AVX-512) float32 registers


def nbits_tiles(c, a_sum, a_scale, b, scales, zeros, bits, m_len, n_len, t0, t1, s, acc, y):
    """y[:m_len, columns of tiles t0..t1); s and acc (m_len, TILE) are scratch."""
    n_blocks, per, blob = c.shape[1], c.shape[2], c.shape[3]
    f1 = np.float32(1.0 / (1 << bits))
    f2 = np.float32(1.0 / (1 << (2 * bits)))
    f3 = np.float32(1.0 / (1 << (3 * bits)))
    for t in range(t0, t1):
        for m in range(m_len):
            for q in range(TILE):
                acc[m, q] = 0.0
        for k in range(n_blocks):
            for m in range(m_len):
                for q in range(TILE):
                    s[m, q] = 0.0
            for j in range(0, blob, 4):  # blob is a multiple of 4 (block >= 16)
                for m in range(m_len):
                    if per == 1:
                        _bytes8(c, b, s, m, k, t, j)
                    elif per == 2:
                        _bytes4(c, b, s, m, k, t, j, f1)
                    else:
                        _bytes2(c, b, s, m, k, t, j, f1, f2, f3)
            for m in range(m_len):
                asc, zs = a_scale[m, k], a_sum[m, k]
                for q in range(TILE):
                    acc[m, q] += (asc * scales[t, k, q]) * (s[m, q] - zeros[t, k, q] * zs)
        base = t * TILE
        width = min(TILE, n_len - base)
        for m in range(m_len):
            for q in range(width):
                y[m, base + q] = acc[m, q]


def _inline(fn):
    """A helper inlined into the kernel (numba IR inlining: the kernel's IEEE arithmetic)."""
    return numba.njit(nogil=True, inline="always", error_model="numpy")(fn)


@_inline
def _bytes8(c, b, s, m, k, t, j):
    """s[m] += the products of bytes j..j+3 (8-bit values) of tile t's columns (full arrays
    and indices: slices would cost a reference count each)."""
    a0, a1, a2, a3 = c[m, k, 0, j], c[m, k, 0, j + 1], c[m, k, 0, j + 2], c[m, k, 0, j + 3]
    for q in range(TILE):
        s[m, q] += (a0 * np.float32(b[t, k, j, q]) + a1 * np.float32(b[t, k, j + 1, q])) + (
            a2 * np.float32(b[t, k, j + 2, q]) + a3 * np.float32(b[t, k, j + 3, q]))


@_inline
def _bytes4(c, b, s, m, k, t, j, f1):
    """s[m] += the products of bytes j..j+3 (two 4-bit values each) of tile t's columns: four
    bytes per update, so the sum's trip through memory is paid once for them."""
    a0, a1, a2, a3 = c[m, k, 0, j], c[m, k, 0, j + 1], c[m, k, 0, j + 2], c[m, k, 0, j + 3]
    h0, h1, h2, h3 = c[m, k, 1, j], c[m, k, 1, j + 1], c[m, k, 1, j + 2], c[m, k, 1, j + 3]
    for q in range(TILE):
        v0, v1 = np.float32(b[t, k, j, q]), np.float32(b[t, k, j + 1, q])
        v2, v3 = np.float32(b[t, k, j + 2, q]), np.float32(b[t, k, j + 3, q])
        s[m, q] += ((a0 * v0 + h0 * np.floor(v0 * f1)) + (a1 * v1 + h1 * np.floor(v1 * f1))) + (
            (a2 * v2 + h2 * np.floor(v2 * f1)) + (a3 * v3 + h3 * np.floor(v3 * f1)))


@_inline
def _bytes2(c, b, s, m, k, t, j, f1, f2, f3):
    """s[m] += the products of bytes j..j+3 (four 2-bit values each) of tile t's columns."""
    for i in range(j, j + 4):
        c0, c1, c2, c3 = c[m, k, 0, i], c[m, k, 1, i], c[m, k, 2, i], c[m, k, 3, i]
        for q in range(TILE):
            v = np.float32(b[t, k, i, q])
            s[m, q] += (c0 * v + c1 * np.floor(v * f1)) + (
                c2 * np.floor(v * f2) + c3 * np.floor(v * f3))


def nbits_quantize(x, k_len, block, bits, c, a_sum, a_scale):
    """Quantize each row block of x (M, K) to int8 as onnxruntime's level 4 does
    (scale = amax / 127, round_half_even(a * (127 / amax)), zero past K) and write the
    coefficient planes c (M, k_blocks, per, blob), the blocks' sums and scales."""
    m_len = x.shape[0]
    n_blocks, per, blob = c.shape[1], c.shape[2], c.shape[3]
    radix = np.float32(1 << bits)
    for m in range(m_len):
        for k in range(n_blocks):
            k0 = k * block
            k1 = min(k0 + block, k_len)
            amax = np.float32(0.0)
            for i in range(k0, k1):
                v = abs(x[m, i])
                if v > amax:
                    amax = v
            inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
            a_scale[m, k] = amax / np.float32(127.0)
            total = np.float32(0.0)
            for j in range(blob):
                prev = np.float32(0.0)
                for p in range(per):
                    i = k0 + j * per + p
                    q = np.float32(0.0)
                    if i < k1:
                        q = min(max(np.rint(x[m, i] * inv), np.float32(-128.0)),
                                np.float32(127.0))
                    c[m, k, p, j] = q - radix * prev
                    prev = q
                    total += q
            a_sum[m, k] = total
