"""Torch kernels: the integer ops MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.

torch has no general integer GEMM/convolution on CUDA, so centered operands (v - zero
point, integers) are multiplied in float32 when a bound on every dot product proves the sums
exact (below 2^24), in float64 otherwise (exact to 2^53; slow on consumer GPUs). The bound
comes from shapes and the operand types only, so no value leaves the device. Requantization
follows the CPU provider (and onnxruntime): float32(accumulator) * float32(a_scale * b_scale
/ y_scale), round half to even, add the output zero point, clamp. float8 QLinearMatMul
operands multiply in float32 and saturate to y's float8 range.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda.dtypes import FLOAT8, to_torch_dtype
from onnxkiln.providers.cuda.nn import conv_fn
from onnxkiln.providers.cuda.quant import _why_dtype, quantize_to
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor
_I8 = frozenset({DataType.INT8, DataType.UINT8})
_F8 = frozenset(to_torch_dtype(d) for d in FLOAT8)
_F32_EXACT = float(1 << 24)
_SCALE = frozenset({DataType.FLOAT})


def _exact_dtype(terms: int) -> torch.dtype:
    """float32 when `terms` products of 8-bit centered values sum exactly, else float64."""
    return torch.float32 if terms * 255.0 * 255.0 < _F32_EXACT else torch.float64


def _centered(v: Tensor, zp: Tensor | None, dt: torch.dtype) -> Tensor:
    out = v.to(dt)
    return out if zp is None else out - zp.to(dt)


def _row(v: Tensor | None) -> Tensor | None:
    """A left operand's zero point/scale: scalar, (M,) per row, or N-D [..., M, 1]."""
    if v is None or v.numel() == 1:
        return None if v is None else v.reshape(())
    return v.reshape(-1, 1) if v.ndim == 1 else v


def _col(v: Tensor | None) -> Tensor | None:
    """A right operand's: scalar, (N,) per column, or N-D [..., 1, N]."""
    if v is None or v.numel() == 1:
        return None if v is None else v.reshape(())
    return v


def _mm_check(op: str, a: Tensor, b: Tensor) -> None:
    if a.ndim < 1 or b.ndim < 1 or (b.ndim >= 2 and a.shape[-1] != b.shape[-2]):
        raise ValueError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                         f"multiplied")


def _int32(acc: Tensor, terms: int) -> Tensor:
    """An exact float accumulator as int32, wrapping as a 32-bit accumulator would."""
    if terms * 255.0 * 255.0 < 2.0 ** 31:
        return acc.to(torch.int32)
    return acc.to(torch.int64).to(torch.int32)


@kernel("MatMulInteger", since=10, factory=True,
        supports=lambda info: _why_dtype(info, {"input 0": _I8, "input 1": _I8,
                                                "input 2": _I8, "input 3": _I8}))
def matmul_integer(info: NodeInfo) -> Callable[..., Tensor]:
    """(A - a_zero_point) @ (B - b_zero_point) as int32; a_zero_point may be per row."""

    def run(a: Tensor, b: Tensor, a_zero_point: Tensor | None = None,
            b_zero_point: Tensor | None = None) -> Tensor:
        _mm_check("MatMulInteger", a, b)
        k = a.shape[-1]
        dt = _exact_dtype(k)
        acc = torch.matmul(_centered(a, _row(a_zero_point), dt),
                           _centered(b, _col(b_zero_point), dt))
        return _int32(acc, k)

    return run


def _scalar(v: Tensor, op: str, what: str) -> Tensor:
    if v.numel() != 1:
        raise ValueError(f"{op}: {what} must be a scalar (per tensor), got shape "
                         f"{tuple(v.shape)}")
    return v.reshape(()).to(torch.float32)


_QMM_TYPES = _I8 | FLOAT8


@kernel("QLinearMatMul", since=10, factory=True,
        supports=lambda info: _why_dtype(info, {
            "input 0": _QMM_TYPES, "input 1": _SCALE | {DataType.FLOAT16, DataType.BFLOAT16},
            "input 3": _QMM_TYPES, "input 6": _SCALE | {DataType.FLOAT16, DataType.BFLOAT16},
            "output 0": _QMM_TYPES}))
def qlinear_matmul(info: NodeInfo) -> Callable[..., Tensor]:
    """Quantized MatMul: (a - a_zp) @ (b - b_zp), requantized to y's scale and zero point."""
    op = "QLinearMatMul"

    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
        if a_zero_point.dtype != a.dtype or b_zero_point.dtype != b.dtype:
            raise ValueError(f"{op}: zero points must have the type of their input")
        _mm_check(op, a, b)
        floaty = a.dtype in _F8 or b.dtype in _F8
        dt = torch.float32 if floaty else _exact_dtype(a.shape[-1])
        acc = torch.matmul(_centered(a, _row(a_zero_point), dt),
                           _centered(b, _col(b_zero_point), dt)).to(torch.float32)
        mult = (_row(a_scale).to(torch.float32) * _col(b_scale).to(torch.float32)
                / _scalar(y_scale, op, "y_scale"))
        return quantize_to(acc * mult, _scalar(y_zero_point, op, "y_zero_point"),
                           y_zero_point.dtype, True)

    return run


class _IntConv:
    """sum((x - x_zp) * (w - w_zp)) over Conv windows through the float Conv kernel."""

    def __init__(self, info: NodeInfo, op: str) -> None:
        self.op = op
        self._conv = conv_fn(info)

    def __call__(self, x: Tensor, x_zp: Tensor | None, w: Tensor, w_zp: Tensor | None
                 ) -> tuple[Tensor, int]:
        for zp, v, name in ((x_zp, x, "x_zero_point"), (w_zp, w, "w_zero_point")):
            if zp is not None and zp.dtype != v.dtype:
                raise ValueError(f"{self.op}: {name} is {zp.dtype} but its input is {v.dtype}")
        if w.ndim < 3:
            raise ValueError(f"{self.op}: W must be (M, C/group, k1, ...), got shape "
                             f"{tuple(w.shape)}")
        terms = math.prod(w.shape[1:])
        dt = _exact_dtype(terms)
        if w_zp is not None and w_zp.numel() > 1:
            if w_zp.ndim != 1 or w_zp.shape[0] != w.shape[0]:
                raise ValueError(f"{self.op}: w_zero_point must be a scalar or one value per "
                                 f"output channel ({w.shape[0]})")
            w_zp = w_zp.reshape(-1, *([1] * (w.ndim - 1)))
        elif w_zp is not None:
            w_zp = w_zp.reshape(())
        if x_zp is not None:
            x_zp = _scalar(x_zp, self.op, "x_zero_point").to(dt)
        return self._conv(_centered(x, x_zp, dt), _centered(w, w_zp, dt)), terms


def _conv_int_supports(slots: dict[str, frozenset]) -> Callable[[NodeInfo], str | None]:
    def supports(info: NodeInfo) -> str | None:
        why = _why_dtype(info, slots)
        if why:
            return why
        shape = info.input_shapes[0] if info.input_shapes else None
        if shape is not None and not 3 <= len(shape) <= 5:
            return (f"{info.op_type} with {len(shape) - 2} spatial dims is left to the CPU "
                    f"(torch: 1-3)")
        return None

    return supports


@kernel("ConvInteger", since=10, factory=True, supports=_conv_int_supports(
    {"input 0": _I8, "input 1": _I8, "input 2": _I8, "input 3": _I8}))
def conv_integer(info: NodeInfo) -> Callable[..., Tensor]:
    """int32 Conv of (x - x_zero_point) and (w - w_zero_point); w_zero_point per channel."""
    core = _IntConv(info, "ConvInteger")

    def run(x, w, x_zero_point=None, w_zero_point=None) -> Tensor:
        acc, terms = core(x, x_zero_point, w, w_zero_point)
        return _int32(acc, terms)

    return run


@kernel("QLinearConv", since=10, factory=True, supports=_conv_int_supports(
    {"input 0": _I8, "input 3": _I8, "input 7": _I8, "output 0": _I8}))
def qlinear_conv(info: NodeInfo) -> Callable[..., Tensor]:
    """Quantized Conv: integer accumulation (+ int32 bias), requantized to y's scale and
    zero point; w_scale and w_zero_point may be per output channel."""
    op = "QLinearConv"
    core = _IntConv(info, op)

    def run(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
            B=None) -> Tensor:
        acc, _ = core(x, x_zero_point, w, w_zero_point)
        m, nsp = w.shape[0], w.ndim - 2
        if B is not None:
            if tuple(B.shape) != (m,):
                raise ValueError(f"{op}: B must have shape ({m},), got {tuple(B.shape)}")
            acc = acc.to(torch.float64) + B.to(torch.float64).reshape(m, *([1] * nsp))
        ws = w_scale.to(torch.float32)
        if ws.numel() > 1:
            if ws.ndim != 1 or ws.shape[0] != m:
                raise ValueError(f"{op}: w_scale must be a scalar or one value per output "
                                 f"channel ({m})")
            ws = ws.reshape(m, *([1] * nsp))
        else:
            ws = ws.reshape(())
        mult = _scalar(x_scale, op, "x_scale") * ws / _scalar(y_scale, op, "y_scale")
        return quantize_to(acc.to(torch.float32) * mult,
                           _scalar(y_zero_point, op, "y_zero_point"), y_zero_point.dtype, True)

    return run
