"""CPU kernel: onnxruntime's com.microsoft MatMulNBits, computed as onnxruntime's CPU does.

Y = A @ dequantize(B).T (+ bias), B holding N x K weights packed 2/4/8 bits per value, with
(q - zero_point) * scale per block of `block_size` along K. What onnxruntime 1.32's CPU
kernel computes, probed on generated inputs (tests/providers/cpu/test_matmulnbits.py):

- accuracy_level 0..3: float32 (levels 2 and 3, float16 and bfloat16, are not run in lower
  precision on the CPU: their results are float32's to rounding).
- accuracy_level 4, when B, scales and zero points are constants, there is no g_idx, zero
  points are absent or packed uint8, and the bits/block_size pair has an int8 kernel (every
  block size for 4 and 8 bits, 32/64/128 for 2 bits): A is quantized to int8 per row and
  block of `block_size` along K, symmetric, scale = amax / 127 and
  q = round_half_even(a * (127 / amax)); each block's dot product with (q_B - zero_point) is
  exact in integers and scaled by a_scale * b_scale, the blocks summed in float32. Anything
  else at level 4 runs in float32, as onnxruntime does.
- with g_idx, onnxruntime ignores packed uint8 zero points (it uses 2^(bits-1)); with a
  constant B but scales or zero points fed at run time its level-4 results are garbage
  (relative error ~1). onnxkiln applies the op's definition in both cases.

Paths at level 4: with numba, products of up to NUMBA_ROWS_MAX rows of A (decode steps, small
batches) read the packed weights, never a float32 matrix: 4-bit weights through
`_numba_nbits.nbits_vnni` (AVX-512 VNNI's vpdpbusd: int8 x uint4 in int32) or `nbits_avx2`
(vpmaddubsw + vpmaddwd) where the CPU has them, everything else through `nbits_tiles`
(exact integer sums in float32 arithmetic). The numpy fallback forms the same per-block
integer products with BLAS. All give the same bits: the per-block dot products are exact
integers and the blocks are scaled and summed in the same order. Larger products (prefill)
multiply the dequantized int8 activations by float32 weights built once per node in one
GEMM, with and without numba (onnxruntime's numbers to float rounding). The float levels
use that float32 matrix and BLAS.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import NamedTuple

import ml_dtypes
import numpy as np

from onnxkiln.ops.nbits import (
    NBitsGeometry,
    block_zero_points,
    check_packing,
    dequantize_weight,
    nbits_geometry,
    unpack_bits,
)
from onnxkiln.pool import active_threads, parallel_for
from onnxkiln.providers.base import NodeInfo, report_variant
from onnxkiln.providers.cpu import _numba
from onnxkiln.providers.cpu._gemm import THIN_CHUNKS, timed_split
from onnxkiln.providers.cpu._tensor_util import const_input
from onnxkiln.providers.cpu.registry import kernel

__all__ = ["NbitsMatMul"]

MS = "com.microsoft"
OP = "MatMulNBits"
_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)
_FLOATS = frozenset({_F32, np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})
TILE = 32  # _numba_nbits.TILE (that module imports numba)
NUMBA_ROWS_MAX = 16
"""Rows of A up to which the numba kernel runs (decode steps, small batches); beyond, BLAS on
the float32 matrix wins: it computes each weight once for all rows."""
INT8_BLOCKS_2BIT = (32, 64, 128)  # the block sizes onnxruntime's 2-bit int8 kernel takes


def _tiles(v: np.ndarray, width: int) -> np.ndarray:
    """(N, ...) -> (n_tiles, ..., width): `width` consecutive rows side by side, zero-padded."""
    n_tiles = -(-v.shape[0] // width)
    pad = np.zeros((n_tiles * width, *v.shape[1:]), v.dtype)
    pad[: v.shape[0]] = v
    t = pad.reshape(n_tiles, width, *v.shape[1:])
    return np.ascontiguousarray(np.moveaxis(t, 1, -1))


INT_LANES: int | None = None
"""Columns per register of the integer 4-bit kernel: None picks the CPU's best (16 with
AVX-512 VNNI, 8 with AVX2, 0 without: the float kernel); tests set 8 or 0 to run the others."""
_HOST_LANES: list[int] = []


def int_lanes() -> int:
    """16, 8 or 0 (module INT_LANES); asks llvmlite, so only after numba has loaded."""
    best = host_lanes()
    return best if INT_LANES is None else (INT_LANES if best >= INT_LANES else 0)


def host_lanes() -> int:
    """16 with AVX-512 VNNI (+F, BW), 8 with AVX2, else 0, for the CPU numba compiles for."""
    if not _HOST_LANES:
        lanes = 0
        try:
            import llvmlite.binding as ll
            from numba.core import config

            features = ll.get_host_cpu_features()
            # numba compiles for the host unless told otherwise (NUMBA_CPU_NAME/FEATURES,
            # e.g. for a portable cache): then the intrinsics might not be selectable
            if config.CPU_NAME is None and config.CPU_FEATURES is None:
                if all(features.get(f, False) for f in ("avx512f", "avx512bw", "avx512vnni")):
                    lanes = 16
                elif features.get("avx2", False):
                    lanes = 8
        except (ImportError, RuntimeError):
            pass
        _HOST_LANES.append(lanes)
    return _HOST_LANES[0]


class _Fast(NamedTuple):
    """A node's numba kernel: prepare(a2) quantizes A; compute(prep, m, t0, t1, y) writes the
    columns of tiles t0..t1 into y."""

    prepare: Callable[[np.ndarray], tuple]
    compute: Callable[..., None]
    tiles: int
    name: str


class NbitsMatMul:
    """The product A (M, K) @ W.T for one node's constant weights, every path prepared lazily.

    `int8`: accuracy level 4 as onnxruntime computes it (module doc). Each prepared form of
    the weights (dequantized float32 for BLAS, (q - zero_point) per block for the exact
    numpy path, column tiles for numba) is built on first use and kept for the node.
    """

    def __init__(self, g: NBitsGeometry, b: np.ndarray, scales: np.ndarray,
                 zp: np.ndarray | None, int8: bool) -> None:
        check_packing(g, b, scales)
        self.g, self.int8 = g, int8
        self._b = b
        self._s = scales.reshape(g.n, g.n_blocks).astype(_F32)
        self._z = block_zero_points(g, zp)
        self._dense: np.ndarray | None = None  # W.T (K, N), dequantized
        self._ints: np.ndarray | None = None  # (k_blocks, block, N): q - zero_point
        self._tiled: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._fast_kernel: _Fast | None = None
        self.fast = _numba.lazy("nbits_tiles", _F32) if int8 else None
        self.quant = _numba.lazy("nbits_quantize", _F32) if int8 else None
        self.requant = _numba.lazy("nbits_requantize", _F32) if int8 else None
        four = int8 and g.bits == 4
        self.vnni = _numba.lazy("nbits_vnni", _F32) if four else None
        self.avx2 = _numba.lazy("nbits_avx2", _F32) if four else None
        self.quant_vnni = _numba.lazy("nbits_quantize_vnni", _F32) if four else None

    # ------------------------------------------------------------------ prepared weights
    def _centered(self) -> np.ndarray:
        g = self.g
        q = unpack_bits(self._b, g.bits).reshape(g.n, g.n_blocks, g.block).astype(_F32)
        q -= self._z[:, :, None]
        return q

    def dense(self) -> np.ndarray:
        """W.T (K, N) in float32, dequantized."""
        if self._dense is None:
            w = self._centered()
            w *= self._s[:, :, None]
            self._dense = np.ascontiguousarray(w.reshape(self.g.n, -1)[:, : self.g.k].T)
        return self._dense

    def ints(self) -> np.ndarray:
        """(q - zero_point) as float32 (k_blocks, block, N): exact small integers."""
        if self._ints is None:
            self._ints = np.ascontiguousarray(self._centered().transpose(1, 2, 0))
        return self._ints

    def tiled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(B, scales, zero points) in column tiles for nbits_tiles."""
        if self._tiled is None:
            self._tiled = (_tiles(self._b, TILE), _tiles(self._s, TILE), _tiles(self._z, TILE))
        return self._tiled

    def tiled_int(self, lanes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(B, scales, zero points) for nbits_vnni / nbits_avx2: B as (tiles, k_blocks, quads,
        lanes, 4), the 4 bytes of a column's quad side by side (the instructions sum 4
        adjacent byte products into an int32 lane)."""
        g = self.g
        b = _tiles(self._b.reshape(g.n, g.n_blocks, g.blob // 4, 4), lanes)
        return (np.ascontiguousarray(b.transpose(0, 1, 2, 4, 3)), _tiles(self._s, lanes),
                _tiles(self._z, lanes))

    # ------------------------------------------------------------------ activations
    def quantize(self, a2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Level 4's int8 activations as float32 (M, k_blocks, block) and their scales."""
        g = self.g
        m = a2.shape[0]
        x = np.zeros((m, g.n_blocks * g.block), _F32)
        x[:, : g.k] = a2
        xb = x.reshape(m, g.n_blocks, g.block)
        amax = np.abs(xb).max(axis=2)
        with np.errstate(divide="ignore"):
            inv = np.where(amax > 0, _F32.type(127) / amax, _F32.type(0)).astype(_F32)
        q = np.rint(xb * inv[:, :, None])
        np.clip(q, -128, 127, out=q)
        return q, (amax / _F32.type(127)).astype(_F32)

    def requantized(self, a2: np.ndarray) -> np.ndarray:
        """(M, K) float32: A's int8 values times their block scales (level 4's activations)."""
        if self.requant is not None and self.requant.ready():
            out = np.empty(a2.shape, _F32)
            self.requant.fn(np.ascontiguousarray(a2, _F32), self.g.k, self.g.block, out)
            return out
        q, sc = self.quantize(a2)
        q *= sc[:, :, None]
        return q.reshape(a2.shape[0], -1)[:, : self.g.k]

    # ------------------------------------------------------------------ products
    def numpy_product(self, a2: np.ndarray) -> np.ndarray:
        """(M, N) through BLAS. Level 4 with up to NUMBA_ROWS_MAX rows takes the exact
        per-block products (nbits_tiles' bits); larger ones multiply the dequantized int8
        activations by the float32 weights in one GEMM (onnxruntime's numbers to float
        rounding, at GEMM speed)."""
        if not self.int8:
            return a2 @ self.dense()
        if a2.shape[0] > NUMBA_ROWS_MAX:
            return self.requantized(a2) @ self.dense()
        q, sc = self.quantize(a2)
        dots = np.matmul(q.transpose(1, 0, 2), self.ints())  # (k_blocks, M, N), exact
        y = np.zeros(dots.shape[1:], _F32)
        s = self._s
        for k in range(self.g.n_blocks):  # block order, as nbits_tiles sums them
            y += (sc[:, k, None] * s[None, :, k]) * dots[k]
        return y

    def _int_kernel(self) -> tuple[Callable[..., None], int] | None:
        """(nbits_vnni or nbits_avx2, lanes) for 4-bit weights where the CPU has them."""
        lanes = int_lanes() if self.vnni is not None else 0
        handle = {16: self.vnni, 8: self.avx2}.get(lanes)
        if handle is None or not handle.ready() or not self.quant_vnni.ready():
            return None
        return handle.fn, lanes

    def _kernel(self) -> _Fast | None:
        """The numba kernel for this node (nbits_vnni / nbits_avx2 for 4 bits where the CPU
        has them, else nbits_tiles), built once; None when numba is off or does not import."""
        if self._fast_kernel is None:
            if (self.fast is None or self.quant is None or not self.fast.ready()
                    or not self.quant.ready()):
                return None
            g = self.g
            integer = self._int_kernel()
            # A's quantized blocks and the accumulators are kept per thread for the last row
            # count: a call allocates only its output (decode steps make 7 of these a token)
            held = threading.local()
            if integer is not None:
                (fn, lanes), quant = integer, _numba.direct(self.quant_vnni.fn)
                fn = _numba.direct(fn)
                b, s, z = self.tiled_int(lanes)
                scratch = np.empty(16, np.int32)  # unused by the kernels

                def buffers(m):
                    got = getattr(held, "bufs", None)
                    if got is None or got[0] != m:
                        got = held.bufs = (m, (np.empty((m, g.n_blocks, g.blob // 4, 8), np.int8),
                                               np.empty((m, g.n_blocks), _F32),
                                               np.empty((m, g.n_blocks), _F32)),
                                           (np.empty((m, lanes), _F32),))
                    return got

                def prepare(a2):
                    prep = buffers(a2.shape[0])[1]
                    quant(np.ascontiguousarray(a2, _F32), g.k, g.block, *prep)
                    return prep

                def compute(prep, m, t0, t1, y):
                    fn(*prep, b, s, z, m, g.n, t0, t1, scratch, *buffers(m)[2], y)
            else:
                fn, quant = _numba.direct(self.fast.fn), _numba.direct(self.quant.fn)
                b, s, z = self.tiled()

                def buffers(m):
                    got = getattr(held, "bufs", None)
                    if got is None or got[0] != m:
                        got = held.bufs = (m, (np.empty((m, g.n_blocks, 8 // g.bits, g.blob),
                                                        _F32),
                                               np.empty((m, g.n_blocks), _F32),
                                               np.empty((m, g.n_blocks), _F32)),
                                           (np.empty((m, TILE), _F32), np.empty((m, TILE), _F32)))
                    return got

                def prepare(a2):
                    prep = buffers(a2.shape[0])[1]
                    quant(np.ascontiguousarray(a2, _F32), g.k, g.block, g.bits, *prep)
                    return prep

                def compute(prep, m, t0, t1, y):
                    fn(*prep, b, s, z, g.bits, m, g.n, t0, t1, *buffers(m)[2], y)
            name = {16: "vnni", 8: "avx2"}[integer[1]] if integer is not None else "numba"
            self._fast_kernel = _Fast(prepare, compute, b.shape[0], name)
        return self._fast_kernel

    def numba_product(self, m: int) -> tuple[Callable[[np.ndarray], np.ndarray], str] | None:
        """(call(a2) -> (M, N), kernel name) for M = m rows through the numba kernel, its
        column tiles split across the pool once a whole call shows itself slow enough
        (timed_split: waking a worker costs more than small products take); None when numba
        is off, does not import, or m is large."""
        fast = self._kernel() if m <= NUMBA_ROWS_MAX else None
        if fast is None:
            return None
        n_tiles, n = fast.tiles, self.g.n
        parts = min(n_tiles, THIN_CHUNKS * active_threads())
        bounds = [(n_tiles * i // parts, n_tiles * (i + 1) // parts) for i in range(parts)]

        def whole(a2: np.ndarray) -> np.ndarray:
            y = np.empty((m, n), _F32)
            fast.compute(fast.prepare(a2), m, 0, n_tiles, y)
            return y

        def split(a2: np.ndarray) -> np.ndarray:
            prep, y = fast.prepare(a2), np.empty((m, n), _F32)
            parallel_for(parts, lambda i: fast.compute(prep, m, *bounds[i], y))
            return y

        return timed_split(whole, split if parts > 1 else None), fast.name

    def rows(self, a2: np.ndarray) -> tuple[np.ndarray, str, str | None]:
        """(A @ W.T, variant, reason) for the generic run path: the product without building
        a per-shape callable (one thread; specialisations split across the pool)."""
        m = a2.shape[0]
        fast = self._kernel() if m <= NUMBA_ROWS_MAX else None
        if fast is not None:
            y = np.empty((m, self.g.n), _F32)
            fast.compute(fast.prepare(a2), m, 0, fast.tiles, y)
            return y, f"matmulnbits.int8_{fast.name}", None
        _, variant, why = self.product(m)
        return self.numpy_product(a2), variant, why

    def product(self, m: int) -> tuple[Callable[[np.ndarray], np.ndarray], str, str | None]:
        """(call, variant, why not the numba kernel or None) for products of m rows."""
        fast = self.numba_product(m)
        if fast is not None:
            return fast[0], f"matmulnbits.int8_{fast[1]}", None
        variant = f"matmulnbits.{'int8' if self.int8 else 'fp32'}_blas"
        if not self.int8:
            return self.numpy_product, variant, None
        if m > NUMBA_ROWS_MAX:
            why = f"{m} rows > {NUMBA_ROWS_MAX}: one GEMM on the dequantized weights"
        elif self.fast is None:
            why = _numba.disabled_reason()
        else:
            why = self.fast.reason or (self.quant.reason if self.quant else None)
        return self.numpy_product, variant, why


def _int8_level(info: NodeInfo, bits: int, block: int, static: bool) -> bool:
    """Whether onnxruntime's CPU kernel quantizes A to int8 for this node (module doc)."""
    if int(info.attrs.get("accuracy_level", 0) or 0) != 4 or not static:
        return False
    if _present(info, 4):  # g_idx
        return False
    zp = const_input(info, 3) if _present(info, 3) else None
    if zp is not None and zp.dtype != _U8:
        return False
    return bits != 2 or block in INT8_BLOCKS_2BIT


def _present(info: NodeInfo, i: int) -> bool:
    p = info.input_present
    return bool(p[i]) if i < len(p) else i < info.n_inputs


def _geometry(info: NodeInfo) -> NBitsGeometry:
    g = nbits_geometry(info.attrs)
    if int(info.attrs.get("weight_prepacked", 0) or 0):
        raise ValueError(f"{OP}: weight_prepacked={info.attrs['weight_prepacked']} is a CUDA "
                         f"layout; only 0 (not prepacked) is supported on the CPU")
    return g


def _check(g: NBitsGeometry, a: np.ndarray, bias: np.ndarray | None) -> None:
    if a.ndim < 1 or a.shape[-1] != g.k:
        raise ValueError(f"{OP}: A's last dim must be K = {g.k}, got shape {a.shape}")
    if a.dtype not in _FLOATS:
        raise TypeError(f"{OP}: A must be float32/float16/bfloat16, got {a.dtype}")
    if bias is not None and bias.size != g.n:
        raise ValueError(f"{OP}: bias must have N = {g.n} values, got shape {bias.shape}")


def _finish(g: NBitsGeometry, y2: np.ndarray, a: np.ndarray, bias: np.ndarray | None
            ) -> np.ndarray:
    """The (M, N) float32 product shaped like A, plus bias, in A's dtype."""
    y = y2.reshape(*a.shape[:-1], g.n)
    if bias is not None:
        y += bias.reshape(g.n).astype(_F32, copy=False)
    return y if a.dtype == _F32 else y.astype(a.dtype)


@kernel("MatMulNBits", since=1, domain=MS, factory=True, variant="matmulnbits.fp32_blas")
def matmul_nbits(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = A @ dequantize(B).T (+ bias) at onnxruntime's precision for `accuracy_level`.

    Constant weights (the usual case) are prepared once per node (NbitsMatMul); B, scales or
    zero points fed at run time, and g_idx, are dequantized per run and multiplied in float32.
    float16/bfloat16 A is computed in float32 and the result rounded once.
    """
    g = _geometry(info)
    const = [const_input(info, i) if _present(info, i) else None for i in range(5)]
    static = all(const[i] is not None for i in (1, 2, 3) if _present(info, i))
    b0 = const[1]
    engine = None
    if static and not _present(info, 4) and b0 is not None and b0.size:
        engine = NbitsMatMul(g, b0, const[2], const[3], _int8_level(info, g.bits, g.block,
                                                                     static))

    def run(a: np.ndarray, b: np.ndarray, scales: np.ndarray, zero_points=None, g_idx=None,
            bias=None) -> np.ndarray:
        _check(g, a, bias)
        a2 = a.reshape(-1, g.k).astype(_F32, copy=False)
        if engine is not None:
            y2, variant, why = engine.rows(a2)
            report_variant(variant, why)
        elif b.size == 0:  # an omitted projection: zeros (plus bias)
            y2 = np.zeros((a2.shape[0], g.n), _F32)
        else:
            y2 = a2 @ dequantize_weight(g, b, scales, zero_points, g_idx).T
        return _finish(g, y2, a, bias)

    def specialize(dtypes, shapes, consts):
        """The product for one shape of A: its path (numba kernel or BLAS) chosen once."""
        sa = shapes[0]
        if engine is None or sa is None or not sa or sa[-1] != g.k or dtypes[0] not in _FLOATS:
            return None
        m = math.prod(sa[:-1])
        if m == 0:
            return None
        call, variant, why = engine.product(m)
        out_shape, f32 = (*sa[:-1], g.n), dtypes[0] == _F32

        def special(a, b, scales, zero_points=None, g_idx=None, bias=None):
            # the signature's first (generic) run checked these shapes and dtypes
            y = call(a.reshape(m, g.k) if f32 else a.reshape(m, g.k).astype(_F32))
            y = y.reshape(out_shape)
            if bias is not None:
                y += bias.reshape(g.n).astype(_F32, copy=False)
            return y if f32 else y.astype(a.dtype)

        special.variant, special.variant_reason = variant, why
        return special

    run.variant = "matmulnbits.fp32_blas"  # until a run chooses (building loads no numba)
    run.variant_reason = None
    if engine is not None:
        run.variant = ("matmulnbits.int8_numba" if engine.fast is not None else  # or _vnni
                       f"matmulnbits.{'int8' if engine.int8 else 'fp32'}_blas")
    run.specialize = specialize
    return run


def _signature_tiles(dt: np.dtype):
    from numba import types

    f, i64 = types.float32, types.int64

    def arr(t, nd, ro=True):
        return types.Array(t, nd, "C", readonly=ro)

    return (arr(f, 4), arr(f, 2), arr(f, 2), arr(types.uint8, 4), arr(f, 3), arr(f, 3), i64,
            i64, i64, i64, i64, arr(f, 2, False), arr(f, 2, False), arr(f, 2, False))


def _signature_quantize(dt: np.dtype):
    from numba import types

    f, i64 = types.float32, types.int64
    return (types.Array(f, 2, "C", readonly=True), i64, i64, i64, types.Array(f, 4, "C"),
            types.Array(f, 2, "C"), types.Array(f, 2, "C"))


def _signature_vnni(dt: np.dtype):
    from numba import types

    f, i64 = types.float32, types.int64

    def arr(t, nd, ro=True):
        return types.Array(t, nd, "C", readonly=ro)

    return (arr(types.int8, 4), arr(f, 2), arr(f, 2), arr(types.uint8, 5), arr(f, 3), arr(f, 3),
            i64, i64, i64, i64, arr(types.int32, 1, False), arr(f, 2, False), arr(f, 2, False))


def _signature_quantize_vnni(dt: np.dtype):
    from numba import types

    f, i64 = types.float32, types.int64
    return (types.Array(f, 2, "C", readonly=True), i64, i64, types.Array(types.int8, 4, "C"),
            types.Array(f, 2, "C"), types.Array(f, 2, "C"))


def _signature_requantize(dt: np.dtype):
    from numba import types

    f, i64 = types.float32, types.int64
    return (types.Array(f, 2, "C", readonly=True), i64, i64, types.Array(f, 2, "C"))


_numba.register("nbits_requantize", "onnxkiln.providers.cpu._numba_nbits",
                _signature_requantize, (_F32,))
_numba.register("nbits_vnni", "onnxkiln.providers.cpu._numba_nbits", _signature_vnni, (_F32,))
_numba.register("nbits_avx2", "onnxkiln.providers.cpu._numba_nbits", _signature_vnni, (_F32,))
_numba.register("nbits_quantize_vnni", "onnxkiln.providers.cpu._numba_nbits",
                _signature_quantize_vnni, (_F32,))
_numba.register("nbits_tiles", "onnxkiln.providers.cpu._numba_nbits", _signature_tiles,
                (_F32,))
_numba.register("nbits_quantize", "onnxkiln.providers.cpu._numba_nbits",
                _signature_quantize, (_F32,))
