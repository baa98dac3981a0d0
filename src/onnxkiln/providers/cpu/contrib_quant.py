"""CPU kernels: onnxruntime's com.microsoft block-quantized and integer matmul ops.

GatherBlockQuantized, DynamicQuantizeMatMul, MatMulIntegerToFloat and the
com.microsoft QuantizeLinear/DequantizeLinear (per tensor or per `axis`, through quant.py).

onnx knows none of these schemas, so no attribute defaults are filled in at plan time: every
kernel reads `info.attrs.get(name, default)` with onnxruntime's documented defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ml_dtypes
import numpy as np

from onnxkiln.ops.attrs import norm_axis
from onnxkiln.ops.nbits import unpack_bits
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu import contrib_nbits  # noqa: F401  (registers MatMulNBits)
from onnxkiln.providers.cpu._tensor_util import const_input
from onnxkiln.providers.cpu.quant import (
    dequantize_linear as _onnx_dequantize_linear,
)
from onnxkiln.providers.cpu.quant import (
    dynamic_quantize_linear as _dynamic_quantize_linear,
)
from onnxkiln.providers.cpu.quant import (
    quantize_linear as _onnx_quantize_linear,
)
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_U8 = np.dtype(np.uint8)
_I8 = np.dtype(np.int8)
_LOW = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})
_OUT_FLOATS = frozenset({_F32, *_LOW})
_INT4 = frozenset({np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)})
_FLOAT8 = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
        ml_dtypes.float4_e2m1fn,
    )
)
_F32_EXACT = float(1 << 24)  # integer sums below this are exact in float32


def _present(info: NodeInfo, i: int) -> bool:
    """Whether optional input i is wired to a value."""
    p = info.input_present
    return bool(p[i]) if i < len(p) else i < info.n_inputs


def _all_const(info: NodeInfo, idx: tuple[int, ...]) -> bool:
    """Whether every present input among `idx` is a plan-time constant."""
    return all(const_input(info, i) is not None for i in idx if _present(info, i))


def _check_bits(op: str, bits: int, allowed: tuple[int, ...]) -> int:
    if bits not in allowed:
        raise ValueError(f"{op}: bits must be one of {list(allowed)}, got {bits}")
    return bits


# ---------------------------------------------------------------------------------------------
# GatherBlockQuantized


def _blockwise(v: np.ndarray, p: np.ndarray, axis: int, block: int, fn) -> None:
    """fn(v, p', out=v) where p' is p repeated `block` times along `axis` (cropped to v)."""
    d, nb = v.shape[axis], p.shape[axis]
    if nb == 1 and d != 1:
        fn(v, p, out=v)
        return
    if nb * block == d:
        shp_v = (*v.shape[:axis], nb, block, *v.shape[axis + 1:])
        shp_p = (*p.shape[:axis], nb, 1, *p.shape[axis + 1:])
        vv = v.reshape(shp_v)
        fn(vv, p.reshape(shp_p), out=vv)
        return
    rep = np.repeat(p, block, axis=axis)
    fn(v, rep[(slice(None),) * axis + (slice(0, d),)], out=v)


@kernel("GatherBlockQuantized", since=1, domain=MS, factory=True,
        variant="gatherblockquantized.gather_dequant")
def gather_block_quantized(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Gather rows of block-quantized data, then dequantize them: (q - zero_point) * scale.

    data is int4/uint4 (default zero point 0), uint8 holding `bits` 2/4/8 values packed along
    the last axis (default zero point 2^(bits-1); packed zero points likewise), or float8/float4
    (no zero point; block_size 0 means one block over the whole quantize_axis; scale dims of 1
    broadcast). Indices outside [-s, s-1] give zeros.
    """
    op = "GatherBlockQuantized"
    attrs = info.attrs
    bits = int(attrs.get("bits", 4))
    block = int(attrs.get("block_size", 128))
    g_attr = int(attrs.get("gather_axis", 0))
    q_attr = int(attrs.get("quantize_axis", 1))

    def run(data: np.ndarray, indices: np.ndarray, scales: np.ndarray, zero_points=None):
        if indices.dtype.kind not in "iu":
            raise TypeError(f"{op}: indices must be int32/int64, got {indices.dtype}")
        if scales.dtype not in _OUT_FLOATS:
            raise TypeError(f"{op}: scales must be float32/float16/bfloat16, got {scales.dtype}")
        dt = data.dtype
        packed = 1
        if dt == _U8:
            _check_bits(op, bits, (2, 4, 8))
            packed = 8 // bits
        elif dt in _FLOAT8:
            if zero_points is not None:
                raise ValueError(f"{op}: zero_points must not be given for {dt} data")
        elif dt not in _INT4:
            raise TypeError(f"{op}: data must be int4, uint4, uint8, float8 or float4, got {dt}")
        if data.ndim < 1:
            raise ValueError(f"{op}: data must have rank >= 1")
        r = data.ndim
        shape = (*data.shape[:-1], data.shape[-1] * packed)  # logical shape
        gax = norm_axis(g_attr, r, op, "gather_axis")
        qax = norm_axis(q_attr, r, op, "quantize_axis")
        if dt == _U8 and gax != 0:
            raise ValueError(f"{op}: gather_axis must be 0 for uint8 data, got {g_attr}")
        if packed > 1 and (gax == qax or qax != r - 1):
            raise ValueError(
                f"{op}: with uint8 data packing {bits}-bit values, quantize_axis must be the last "
                f"axis and differ from gather_axis (got gather_axis {gax}, quantize_axis {qax})"
            )
        bs = block
        if bs == 0 and dt in _FLOAT8:
            bs = shape[qax]
        elif bs < 16 or bs & (bs - 1):
            raise ValueError(f"{op}: block_size must be a power of 2 >= 16, got {block}")
        nb = -(-shape[qax] // bs)
        if scales.ndim != r or any(
            s != (nb if i == qax else d) and not (s == 1 and dt in _FLOAT8)
            for i, (s, d) in enumerate(zip(scales.shape, shape))
        ):
            want = tuple(nb if i == qax else d for i, d in enumerate(shape))
            raise ValueError(f"{op}: scales must have shape {want} for data of logical shape "
                             f"{shape} (block_size {bs} on axis {qax}), got {scales.shape}")
        zp = None
        if zero_points is not None:
            if zero_points.dtype != dt:
                raise TypeError(f"{op}: zero_points must have data's type {dt}, got "
                                f"{zero_points.dtype}")
            zp = unpack_bits(zero_points, bits) if packed > 1 else zero_points
            if packed > 1:
                zp = zp[..., : scales.shape[-1]]
            if zp.shape != scales.shape:
                raise ValueError(f"{op}: zero_points (unpacked shape {zp.shape}) must match "
                                 f"scales {scales.shape}")
        size = shape[gax]
        out_shape = (*shape[:gax], *indices.shape, *shape[gax + 1:])
        if size == 0 or 0 in out_shape:
            return np.zeros(out_shape, scales.dtype)
        idx = indices.astype(np.int64, copy=False)
        idx = np.where(idx < 0, idx + size, idx)
        valid = (idx >= 0) & (idx < size)
        all_valid = bool(valid.all())
        if not all_valid:
            idx = np.where(valid, idx, 0)
        v = np.take(data, idx, axis=gax)
        if packed > 1:
            v = unpack_bits(v, bits)
        v = v.astype(_F32)
        # the quantize axis in the output, and the per-block parameters gathered alike
        qout = qax if qax < gax else qax + idx.ndim - 1
        if gax == qax:
            s = np.take(scales, idx // bs, axis=gax)
            zz = None if zp is None else np.take(zp, idx // bs, axis=gax)
            bsz = 1
        else:
            if scales.shape[gax] == shape[gax]:
                s = np.take(scales, idx, axis=gax)
            else:  # a float8 scale shared along the gathered axis
                s = np.expand_dims(np.squeeze(scales, axis=gax),
                                   tuple(range(gax, gax + idx.ndim)))
            zz = None if zp is None else np.take(zp, idx, axis=gax)
            bsz = bs
        if zz is None and dt == _U8:
            v -= _F32.type(1 << (bits - 1))
        elif zz is not None:
            _blockwise(v, zz.astype(_F32), qout, bsz, np.subtract)
        _blockwise(v, s.astype(_F32), qout, bsz, np.multiply)
        if not all_valid:
            mask = valid.reshape((1,) * gax + valid.shape + (1,) * (r - gax - 1))
            np.copyto(v, _F32.type(0), where=~mask)
        return v if scales.dtype == _F32 else v.astype(scales.dtype)

    return run


# ---------------------------------------------------------------------------------------------
# integer matmuls with float output


def _centered_b(b: np.ndarray, zp: np.ndarray | None, op: str) -> tuple[np.ndarray, float]:
    """(B - zero_point) in float64 and the largest column sum of |values| (exactness bound)."""
    if b.dtype not in (_U8, _I8):
        raise TypeError(f"{op}: B must be uint8 or int8, got {b.dtype}")
    bc = b.astype(_F64)
    if zp is not None:
        if zp.dtype != b.dtype:
            raise TypeError(f"{op}: b_zero_point must have B's type {b.dtype}, got {zp.dtype}")
        try:
            bc -= zp.reshape(()) if zp.size == 1 else zp
        except ValueError as e:
            raise ValueError(f"{op}: b_zero_point of shape {zp.shape} does not broadcast to B "
                             f"{b.shape} (scalar, (N,) or [..., 1, N])") from e
    bound = float(np.abs(bc).sum(axis=-2).max(initial=0.0)) if bc.ndim >= 2 else float(
        np.abs(bc).sum())
    return bc, bound


class _IntMatMul:
    """(A - a_zp) @ (B - b_zp) exactly: float32 BLAS when every dot product fits 2^24."""

    def __init__(self, info: NodeInfo, op: str, b_index: int, bzp_index: int) -> None:
        self.op = op
        self.static = _all_const(info, (b_index, bzp_index))
        self._memo: dict[np.dtype, np.ndarray] = {}
        self._prep: tuple[np.ndarray, float] | None = None

    def __call__(self, ac: np.ndarray, a_span: float, b: np.ndarray,
                 b_zp: np.ndarray | None) -> np.ndarray:
        if self.static and self._prep is not None:
            bc, bound = self._prep
        else:
            bc, bound = _centered_b(b, b_zp, self.op)
            if self.static:
                self._prep = (bc, bound)
        cdt = _F32 if bound * a_span < _F32_EXACT else _F64
        bm = self._memo.get(cdt) if self.static else None
        if bm is None:
            bm = bc.astype(cdt, copy=False)
            if self.static:
                self._memo[cdt] = bm
        a = ac.astype(cdt, copy=False)
        try:
            if bm.ndim == 2 and a.ndim > 2:
                y = (a.reshape(-1, a.shape[-1]) @ bm).reshape(*a.shape[:-1], bm.shape[1])
            else:
                y = np.matmul(a, bm)
        except ValueError as e:
            raise ValueError(f"{self.op}: cannot multiply A {ac.shape} by B {b.shape}: {e}") from e
        return y if y.dtype == _F32 else y.astype(_F32)


def _scale_out(y: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, op: str) -> np.ndarray:
    """y * scale (+ bias) for the fresh float32 accumulator y (in place when shapes allow)."""
    try:
        if scale.size == 1:
            y *= scale.reshape(())
        else:
            y = np.multiply(y, scale, dtype=_F32)
    except ValueError as e:
        raise ValueError(f"{op}: scale of shape {scale.shape} does not broadcast to the result "
                         f"{y.shape}") from e
    if bias is not None:
        if bias.ndim != 1 or y.ndim == 0 or bias.shape[0] != y.shape[-1]:
            raise ValueError(f"{op}: bias must be 1-D with the result's last dim "
                             f"({y.shape[-1] if y.ndim else 'none'}), got shape {bias.shape}")
        y += bias.astype(_F32, copy=False)
    return y


@kernel("DynamicQuantizeMatMul", since=1, domain=MS, factory=True,
        variant="dynamicquantizematmul.int_blas")
def dynamic_quantize_matmul(info: NodeInfo) -> Callable[..., np.ndarray]:
    """A is quantized to uint8 like DynamicQuantizeLinear, multiplied by the int8/uint8 B in
    exact integer arithmetic, and scaled by a_scale * b_scale (+ bias): float32 out."""
    op = "DynamicQuantizeMatMul"
    core = _IntMatMul(info, op, 1, 3)

    def run(a: np.ndarray, b: np.ndarray, b_scale: np.ndarray, b_zero_point=None, bias=None):
        if a.dtype != _F32:
            raise TypeError(f"{op}: A must be float32, got {a.dtype}")
        qa, a_scale, a_zp = _dynamic_quantize_linear(a)
        ac = qa.astype(_F32)
        ac -= _F32.type(a_zp)
        y = core(ac, 255.0, b, b_zero_point)
        return _scale_out(y, a_scale * b_scale.astype(_F32, copy=False), bias, op)

    return run


@kernel("MatMulIntegerToFloat", since=1, domain=MS, factory=True,
        variant="matmulintegertofloat.int_blas")
def matmul_integer_to_float(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = ((A - a_zp) @ (B - b_zp)) * a_scale * b_scale (+ bias), integer-exact accumulation.

    Scales broadcast against the result (scalar, per column of B, [..., 1, N] for batched
    B, [M, 1] per row of A); zero points broadcast against their operand. The output has
    a_scale's type.
    """
    op = "MatMulIntegerToFloat"
    core = _IntMatMul(info, op, 1, 5)

    def run(a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
        if a.dtype not in (_U8, _I8):
            raise TypeError(f"{op}: A must be uint8 or int8, got {a.dtype}")
        out_dt = a_scale.dtype
        if out_dt not in (_F32, np.dtype(np.float16)):
            raise TypeError(f"{op}: a_scale must be float32 or float16, got {out_dt}")
        ac = a.astype(_F32)
        span = 255.0 if a.dtype == _U8 else 128.0
        if a_zero_point is not None:
            if a_zero_point.dtype != a.dtype:
                raise TypeError(f"{op}: a_zero_point must have A's type {a.dtype}")
            try:
                ac -= (a_zero_point.reshape(()) if a_zero_point.size == 1
                       else a_zero_point).astype(_F32)
            except ValueError as e:
                raise ValueError(f"{op}: a_zero_point of shape {a_zero_point.shape} does not "
                                 f"broadcast to A {a.shape}") from e
            span = 255.0
        y = core(ac, span, b, b_zero_point)
        scale = a_scale.astype(_F32) * b_scale.astype(_F32)
        y = _scale_out(y, scale, bias, op)
        return y if out_dt == _F32 else y.astype(out_dt)

    return run


# ---------------------------------------------------------------------------------------------
# com.microsoft QuantizeLinear / DequantizeLinear: the ONNX kernels with per-axis parameters


def _as_onnx(info: NodeInfo) -> NodeInfo:
    axis = info.attrs.get("axis")
    return dataclasses.replace(info, domain="", opset=13,
                               attrs={"axis": 1 if axis is None else int(axis)})


@kernel("QuantizeLinear", since=1, domain=MS, factory=True)
def ms_quantize_linear(info: NodeInfo) -> Callable[..., np.ndarray]:
    """y = saturate(round_half_even(x / y_scale) + y_zero_point); scalar or per-`axis` (default 1)
    parameters; output type from y_zero_point (uint8 when absent): (u)int8, (u)int16, (u)int4."""
    return _onnx_quantize_linear(_as_onnx(info))


@kernel("DequantizeLinear", since=1, domain=MS, factory=True)
def ms_dequantize_linear(info: NodeInfo) -> Callable[..., np.ndarray]:
    """y = (x - x_zero_point) * x_scale for (u)int8/(u)int16/int32/(u)int4 x; scalar or
    per-`axis` (default 1) parameters; output has x_scale's type."""
    return _onnx_dequantize_linear(_as_onnx(info))
