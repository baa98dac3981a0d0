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
from llvmlite import ir as llvm_ir
from numba import types
from numba.extending import intrinsic

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


@_inline
def _block_scale(x, m, k0, k1):
    """(127 / amax, amax / 127) of x[m, k0:k1], (0, 0) for an all-zero block: level 4's
    symmetric int8 scale of one row block."""
    amax = np.float32(0.0)
    for i in range(k0, k1):
        v = abs(x[m, i])
        if v > amax:
            amax = v
    inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
    return inv, amax / np.float32(127.0)


@_inline
def _q8(v, inv):
    """v * inv rounded half to even and clamped to int8's range, as a float32."""
    return min(max(np.rint(v * inv), np.float32(-128.0)), np.float32(127.0))


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
            inv, a_scale[m, k] = _block_scale(x, m, k0, k1)
            total = np.float32(0.0)
            for j in range(blob):
                prev = np.float32(0.0)
                for p in range(per):
                    i = k0 + j * per + p
                    q = np.float32(0.0)
                    if i < k1:
                        q = _q8(x[m, i], inv)
                    c[m, k, p, j] = q - radix * prev
                    prev = q
                    total += q
            a_sum[m, k] = total


# ---------------------------------------------------------------------------------------------
# 4-bit weights with integer SIMD: int8 x uint4 dot products in int32 (AVX-512 VNNI's vpdpbusd,
# or AVX2's vpmaddubsw + vpmaddwd)



_I8, _I16, _I32, _I64, _F = (llvm_ir.IntType(8), llvm_ir.IntType(16), llvm_ir.IntType(32),
                           llvm_ir.IntType(64), llvm_ir.FloatType())


def _intrinsic_fn(builder, name, ret, params):
    return builder.module.globals.get(name) or llvm_ir.Function(
        builder.module, llvm_ir.FunctionType(ret, params), name)


class _TileEmitter:
    """LLVM IR of `_tile_dots16` / `_tile_dots8`: one row against one tile of `lanes` columns.

    16 lanes: AVX-512 VNNI's vpdpbusd adds 4 uint8 x int8 products into each int32 lane. 8
    lanes (AVX2): vpmaddubsw adds pairs into int16 (at most 2 * 15 * 128 = 3840: no
    saturation) and vpmaddwd by ones adds those pairs into int32: the same integers.
    """

    def __init__(self, context, builder, signature, args, lanes):
        self.builder, self.args, self.lanes = builder, args, lanes
        self.vbytes = llvm_ir.VectorType(_I8, 4 * lanes)
        self.vint = llvm_ir.VectorType(_I32, lanes)
        self.vflt = llvm_ir.VectorType(_F, lanes)

        def ptr(i, ty):
            arr = context.make_array(signature.args[i])(context, builder, args[i])
            return builder.bitcast(arr.data, ty.as_pointer())

        self.b, self.a = ptr(0, _I8), ptr(2, _I8)
        self.sc, self.z, self.asc, self.zs, self.out = (ptr(i, _F) for i in (6, 7, 9, 10, 12))

    def const(self, value, ty=_I64):
        return llvm_ir.Constant(ty, value)

    def splat(self, value, vec):
        undef = llvm_ir.Constant(vec, llvm_ir.Undefined)
        first = self.builder.insert_element(undef, value, self.const(0, _I32))
        mask = llvm_ir.Constant(llvm_ir.VectorType(_I32, vec.count), [0] * vec.count)
        return self.builder.shuffle_vector(first, undef, mask)

    def load(self, ptr, offset, ty):
        cast = self.builder.bitcast(self.builder.gep(ptr, [offset]), ty.as_pointer())
        return self.builder.load(cast, align=1)

    def dot(self, isum, nibbles, word):
        """isum + per lane the sum of its 4 uint8 nibbles times the 4 int8 of `word`."""
        bld = self.builder
        acts = self.splat(word, self.vint)
        if self.lanes == 16:
            fn = _intrinsic_fn(bld, "llvm.x86.avx512.vpdpbusd.512", self.vint, [self.vint] * 3)
            return bld.call(fn, [isum, bld.bitcast(nibbles, self.vint), acts])
        v16 = llvm_ir.VectorType(_I16, 16)
        pairs = bld.call(_intrinsic_fn(bld, "llvm.x86.avx2.pmadd.ub.sw", v16,
                                       [self.vbytes, self.vbytes]),
                         [nibbles, bld.bitcast(acts, self.vbytes)])
        quads = bld.call(_intrinsic_fn(bld, "llvm.x86.avx2.pmadd.wd", self.vint, [v16, v16]),
                         [pairs, llvm_ir.Constant(v16, [1] * 16)])
        return bld.add(isum, quads)

    def quad(self, k, i, isum):
        """isum + the products of quad i of block k."""
        bld, args, width = self.builder, self.args, 4 * self.lanes
        g = bld.add(bld.mul(k, args[4]), i)
        raw = self.load(self.b, bld.add(args[1], bld.mul(g, self.const(width))), self.vbytes)
        nib = llvm_ir.Constant(self.vbytes, [15] * width)
        lo = bld.and_(raw, nib)
        hi = bld.and_(bld.lshr(raw, llvm_ir.Constant(self.vbytes, [4] * width)), nib)
        a_at = bld.add(args[3], bld.mul(g, self.const(8)))
        for half, bits in ((0, lo), (4, hi)):
            isum = self.dot(isum, bits, self.load(self.a, bld.add(a_at, self.const(half)), _I32))
        return isum

    def scaled(self, k, isum, acc):
        """acc + (a_scale * b_scales) * (dots - zero_points * a_sum) for block k."""
        bld, args, vflt = self.builder, self.args, self.vflt
        r = bld.add(args[11], k)
        p = bld.add(args[8], bld.mul(k, self.const(self.lanes)))
        a_s, z_s = bld.load(bld.gep(self.asc, [r])), bld.load(bld.gep(self.zs, [r]))
        value = bld.fsub(bld.sitofp(isum, vflt),
                         bld.fmul(self.load(self.z, p, vflt), self.splat(z_s, vflt)))
        step = bld.fmul(bld.fmul(self.splat(a_s, vflt), self.load(self.sc, p, vflt)), value)
        return bld.fadd(acc, step)

    def emit(self):
        """for k in blocks: isum = 0; for i in quads: isum = quad(...); acc = scaled(...)."""
        bld, args = self.builder, self.args
        entry = bld.block
        blk_head, quad_head, quad_body, blk_tail, done = (
            bld.append_basic_block(f"tile_dots.{n}")
            for n in ("block", "quad", "quad_body", "block_end", "done"))
        bld.branch(blk_head)
        bld.position_at_end(blk_head)
        k, acc = bld.phi(_I64), bld.phi(self.vflt)
        k.add_incoming(self.const(0), entry)
        acc.add_incoming(llvm_ir.Constant(self.vflt, None), entry)
        bld.cbranch(bld.icmp_signed("<", k, args[5]), quad_head, done)
        bld.position_at_end(quad_head)
        i, isum = bld.phi(_I64), bld.phi(self.vint)
        i.add_incoming(self.const(0), blk_head)
        isum.add_incoming(llvm_ir.Constant(self.vint, None), blk_head)
        bld.cbranch(bld.icmp_signed("<", i, args[4]), quad_body, blk_tail)
        bld.position_at_end(quad_body)
        i.add_incoming(bld.add(i, self.const(1)), quad_body)
        isum.add_incoming(self.quad(k, i, isum), quad_body)
        bld.branch(quad_head)
        bld.position_at_end(blk_tail)
        k.add_incoming(bld.add(k, self.const(1)), blk_tail)
        acc.add_incoming(self.scaled(k, isum, acc), blk_tail)
        bld.branch(blk_head)
        bld.position_at_end(done)
        bld.store(acc, bld.bitcast(self.out, self.vflt.as_pointer()), align=4)


_TILE_DOTS_DOC = """out[0:lanes] = one row's results for one tile of `lanes` columns over all K
    blocks, in registers: per block, the int32 dot products of `quads` groups of 4 * lanes
    bytes of b (lanes columns x 4 bytes, two 4-bit values a byte, low first) with 8 int8
    activations a group (the 4 low-nibble partners, then the 4 high-nibble ones); then
    acc += (asc[r_off + k] * sc[p_off + lanes * k + lane]) * (dot - z[...] * zs[r_off + k]),
    each operation rounded on its own (no contraction), as nbits_tiles and numpy do."""


@intrinsic
def _tile_dots16(typingctx, b, b_off, a, a_off, quads, blocks, sc, z, p_off, asc, zs, r_off,
                 out):
    sig = types.void(b, b_off, a, a_off, quads, blocks, sc, z, p_off, asc, zs, r_off, out)

    def codegen(context, builder, signature, args):
        _TileEmitter(context, builder, signature, args, 16).emit()
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _tile_dots8(typingctx, b, b_off, a, a_off, quads, blocks, sc, z, p_off, asc, zs, r_off,
                out):
    sig = types.void(b, b_off, a, a_off, quads, blocks, sc, z, p_off, asc, zs, r_off, out)

    def codegen(context, builder, signature, args):
        _TileEmitter(context, builder, signature, args, 8).emit()
        return context.get_dummy_value()

    return sig, codegen


_tile_dots16.__doc__ = _tile_dots8.__doc__ = _TILE_DOTS_DOC


def nbits_vnni(qa, a_sum, a_scale, b, scales, zeros, m_len, n_len, t0, t1, d, acc, y):
    """nbits_tiles for 4-bit weights through vpdpbusd: b (tiles, k_blocks, quads, 16, 4) uint8,
    qa (M, k_blocks, quads, 8) int8 (nbits_quantize_vnni); acc (M, 16) float32 is scratch
    (d is unused: kept for the signature). Same integers, same scaling order: the same bits
    as nbits_tiles."""
    n_blocks, quads = b.shape[1], b.shape[2]
    for t in range(t0, t1):
        base = t * 16
        width = min(16, n_len - base)
        for m in range(m_len):
            _tile_dots16(b, t * n_blocks * quads * 64, qa, m * n_blocks * quads * 8, quads,
                         n_blocks, scales, zeros, t * n_blocks * 16, a_scale, a_sum,
                         m * n_blocks, acc)
            for q in range(width):
                y[m, base + q] = acc[0, q]


def nbits_avx2(qa, a_sum, a_scale, b, scales, zeros, m_len, n_len, t0, t1, d, acc, y):
    """nbits_vnni on AVX2 (vpmaddubsw + vpmaddwd), tiles of 8 columns: b (tiles, k_blocks,
    quads, 8, 4). The same bits."""
    n_blocks, quads = b.shape[1], b.shape[2]
    for t in range(t0, t1):
        base = t * 8
        width = min(8, n_len - base)
        for m in range(m_len):
            _tile_dots8(b, t * n_blocks * quads * 32, qa, m * n_blocks * quads * 8, quads,
                        n_blocks, scales, zeros, t * n_blocks * 8, a_scale, a_sum, m * n_blocks,
                        acc)
            for q in range(width):
                y[m, base + q] = acc[0, q]


def nbits_quantize_vnni(x, k_len, block, qa, a_sum, a_scale):
    """nbits_quantize's int8 values laid out for nbits_vnni: qa[m, blk, quad] holds the values
    at K offsets quad*8 + (0, 2, 4, 6) then quad*8 + (1, 3, 5, 7) of the block."""
    m_len = x.shape[0]
    n_blocks, quads = qa.shape[1], qa.shape[2]
    for m in range(m_len):
        for k in range(n_blocks):
            k0 = k * block
            k1 = min(k0 + block, k_len)
            inv, a_scale[m, k] = _block_scale(x, m, k0, k1)
            total = np.float32(0.0)
            for g in range(quads):
                for r in range(8):
                    i = k0 + g * 8 + 2 * (r % 4) + r // 4
                    q = np.float32(0.0)
                    if i < k1:
                        q = _q8(x[m, i], inv)
                    qa[m, k, g, r] = np.int8(q)
                    total += q
            a_sum[m, k] = total


def nbits_requantize(x, k_len, block, out):
    """out (M, K) = x quantized to int8 per block as nbits_quantize does, times the block's
    scale: the activations level 4 multiplies, for one GEMM on float32 weights (prefill)."""
    m_len = x.shape[0]
    for m in range(m_len):
        for k0 in range(0, k_len, block):
            k1 = min(k0 + block, k_len)
            inv, scale = _block_scale(x, m, k0, k1)
            for i in range(k0, k1):
                q = _q8(x[m, i], inv)
                out[m, i] = q * scale
