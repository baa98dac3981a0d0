"""Torch kernels: elementwise arithmetic, comparisons, logic, unary math and activations."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._util import attr_str, axis_of, up
from onnxkiln.providers.cuda.dtypes import FLOATS, INTS, NUMERIC, SERVED, needs
from onnxkiln.providers.cuda.registry import kernel
from onnxkiln.providers.cuda.unsigned import UNSIGNED, lift, uint64_decline

Tensor = torch.Tensor
_BOOL = frozenset({DataType.BOOL})
_SIGNED_FLOATS = FLOATS | {DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64}


def _legacy_broadcast(info: NodeInfo) -> str | None:
    if info.attrs.get("broadcast") and info.attrs.get("axis") is not None:
        return "legacy broadcast with an axis attribute is left to the CPU"
    return None


def _unsigned(op: str, allowed, extra=None):
    """`supports` for an op that serves uint16/32/64 through unsigned.py (uint64 where exact)."""
    def supports(info: NodeInfo) -> str | None:
        if DataType.UINT64 in info.input_dtypes and uint64_decline(op):
            return uint64_decline(op)
        return needs(allowed | UNSIGNED, extra=extra)(info)
    return supports


def _register_binary(op: str, fn: Callable[[Tensor, Tensor], Tensor], since: int,
                     allowed=NUMERIC, legacy: bool = True, unsigned: bool = True) -> None:
    doc = f"{op} with multidirectional broadcasting."
    extra = _legacy_broadcast if legacy else None
    supports = needs(allowed, extra=extra)
    if unsigned:
        fn, supports = lift(op, fn), _unsigned(op, allowed, extra)

    def run(a: Tensor, b: Tensor) -> Tensor:
        return fn(a, b)

    run.__doc__ = doc
    run.__name__ = run.__qualname__ = op.lower()
    kernel(op, since=since, supports=supports)(run)


def _div(a: Tensor, b: Tensor) -> Tensor:
    if a.dtype.is_floating_point:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # C truncation, like onnxruntime


_register_binary("Add", torch.add, 1)
_register_binary("Sub", torch.sub, 1)
_register_binary("Mul", torch.mul, 1)
_register_binary("Div", _div, 1)
_register_binary("Equal", torch.eq, 1, SERVED)
_register_binary("Greater", torch.gt, 1, SERVED)
_register_binary("Less", torch.lt, 1, SERVED)
_register_binary("GreaterOrEqual", torch.ge, 12, SERVED, legacy=False)
_register_binary("LessOrEqual", torch.le, 12, SERVED, legacy=False)
_register_binary("And", torch.logical_and, 1, _BOOL, unsigned=False)
_register_binary("Or", torch.logical_or, 1, _BOOL, unsigned=False)
_register_binary("Xor", torch.logical_xor, 1, _BOOL, unsigned=False)
_register_binary("BitwiseAnd", torch.bitwise_and, 18, INTS, legacy=False)
_register_binary("BitwiseOr", torch.bitwise_or, 18, INTS, legacy=False)
_register_binary("BitwiseXor", torch.bitwise_xor, 18, INTS, legacy=False)


def _pow_supports(info: NodeInfo) -> str | None:
    why = needs(NUMERIC, skip_inputs=(1,), extra=_legacy_broadcast)(info)
    exp = info.input_dtypes[1] if len(info.input_dtypes) > 1 else None
    if why is None and exp in UNSIGNED and info.input_dtypes[0] not in FLOATS:
        # a float base converts an unsigned exponent exactly enough (as the CPU does)
        return f"Pow with a {exp} exponent needs a float base on the torch kernels"
    return why or needs(NUMERIC | UNSIGNED, skip_inputs=(0,))(info)


@kernel("Pow", since=1, supports=_pow_supports)
def pow_(a: Tensor, b: Tensor) -> Tensor:
    """a ** b in a's type (the exponent may have another type)."""
    if a.dtype == b.dtype:
        if a.dtype in (torch.float16, torch.bfloat16):
            return torch.pow(a.float(), b.float()).to(a.dtype)
        return torch.pow(a, b)
    if a.dtype.is_floating_point or b.dtype.is_floating_point:
        ct = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
        return torch.pow(a.to(ct), b.to(ct)).to(a.dtype)
    return torch.pow(a, b.to(a.dtype))


@kernel("Mod", since=10, factory=True, supports=_unsigned("Mod", NUMERIC))
def mod(info: NodeInfo) -> Callable[..., Tensor]:
    """fmod=0: the divisor's sign (Python %); fmod=1: the dividend's (C fmod)."""
    return lift("Mod", torch.fmod if info.attrs.get("fmod") else torch.remainder)


def _shift_supports(info: NodeInfo) -> str | None:
    left = attr_str(info.attrs.get("direction")) == "LEFT"
    return _unsigned("BitShiftLeft" if left else "BitShiftRight", INTS)(info)


@kernel("BitShift", since=11, factory=True, supports=_shift_supports)
def bit_shift(info: NodeInfo) -> Callable[..., Tensor]:
    """x << y or x >> y (direction attribute); shifts past the width give 0 (-1 for a
    negative x shifted right), as torch defines them."""
    if attr_str(info.attrs.get("direction")) == "LEFT":
        return lift("BitShiftLeft", torch.bitwise_left_shift)
    return lift("BitShiftRight", torch.bitwise_right_shift)


@kernel("BitwiseNot", since=18, supports=_unsigned("BitwiseNot", INTS))
def bitwise_not(x: Tensor) -> Tensor:
    """~x."""
    return _not(x)


_not = lift("BitwiseNot", torch.bitwise_not)


@kernel("Not", since=1, supports=needs(_BOOL))
def not_(x: Tensor) -> Tensor:
    """Logical not."""
    return torch.logical_not(x)


def _fold(fn, xs):
    return functools.reduce(fn, xs[1:], xs[0])


@kernel("Sum", since=1, supports=needs(NUMERIC))
def sum_(*xs: Tensor) -> Tensor:
    """Elementwise sum of all inputs (broadcasting)."""
    return xs[0].clone() if len(xs) == 1 else _fold(torch.add, xs)


@kernel("Max", since=1, supports=_unsigned("Max", NUMERIC))
def max_(*xs: Tensor) -> Tensor:
    """Elementwise max (NaN propagates)."""
    return xs[0].clone() if len(xs) == 1 else _fold(_maximum, xs)


@kernel("Min", since=1, supports=_unsigned("Min", NUMERIC))
def min_(*xs: Tensor) -> Tensor:
    """Elementwise min (NaN propagates)."""
    return xs[0].clone() if len(xs) == 1 else _fold(_minimum, xs)


_maximum, _minimum = lift("Max", torch.maximum), lift("Min", torch.minimum)


@kernel("Mean", since=1, supports=needs(FLOATS))
def mean_(*xs: Tensor) -> Tensor:
    """Elementwise mean; float16/bfloat16 accumulate in float32."""
    s = _fold(torch.add, [up(x) for x in xs])
    return (s / len(xs)).to(xs[0].dtype)


# ---------------------------------------------------------------------------------------
# unary math


def _register_unary(op: str, fn: Callable[[Tensor], Tensor], since: int, allowed=FLOATS):
    def run(x: Tensor) -> Tensor:
        return fn(x)

    run.__doc__ = f"{op}, elementwise."
    run.__name__ = run.__qualname__ = op.lower()
    kernel(op, since=since, supports=needs(allowed))(run)


for _op, _since, _fn, _types in (
    ("Neg", 1, torch.neg, _SIGNED_FLOATS),
    ("Abs", 1, torch.abs, NUMERIC),
    ("Sign", 9, torch.sign, NUMERIC),
    ("Relu", 1, torch.relu, _SIGNED_FLOATS),
    ("Sqrt", 1, torch.sqrt, FLOATS),
    ("Exp", 1, torch.exp, FLOATS),
    ("Log", 1, torch.log, FLOATS),
    ("Reciprocal", 1, torch.reciprocal, FLOATS),
    ("Floor", 1, torch.floor, FLOATS),
    ("Ceil", 1, torch.ceil, FLOATS),
    ("Round", 11, torch.round, FLOATS),  # half to even, as ONNX asks
    ("Sin", 7, torch.sin, FLOATS),
    ("Cos", 7, torch.cos, FLOATS),
    ("Tan", 7, torch.tan, FLOATS),
    ("Asin", 7, torch.asin, FLOATS),
    ("Acos", 7, torch.acos, FLOATS),
    ("Atan", 7, torch.atan, FLOATS),
    ("Sinh", 9, torch.sinh, FLOATS),
    ("Cosh", 9, torch.cosh, FLOATS),
    ("Asinh", 9, torch.asinh, FLOATS),
    ("Acosh", 9, torch.acosh, FLOATS),
    ("Atanh", 9, torch.atanh, FLOATS),
    ("Erf", 9, torch.erf, FLOATS),
    ("Sigmoid", 1, torch.sigmoid, FLOATS),
    ("Tanh", 1, torch.tanh, FLOATS),
    ("Softsign", 1, lambda x: x / (1 + torch.abs(x)), FLOATS),
    ("Softplus", 1, lambda x: F.softplus(up(x)).to(x.dtype), FLOATS),
    ("Mish", 18, lambda x: (up(x) * torch.tanh(F.softplus(up(x)))).to(x.dtype), FLOATS),
    ("IsNaN", 9, torch.isnan, FLOATS | _BOOL),
):
    _register_unary(_op, _fn, _since, _types)


@kernel("IsInf", since=10, factory=True, supports=needs(FLOATS | _BOOL))
def is_inf(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Infinity mask, optionally only the negative or only the positive ones."""
    neg = bool(info.attrs.get("detect_negative", 1))
    pos = bool(info.attrs.get("detect_positive", 1))
    if neg and pos:
        return torch.isinf
    if pos:
        return torch.isposinf
    if neg:
        return torch.isneginf
    return lambda x: torch.zeros_like(x, dtype=torch.bool)


# ---------------------------------------------------------------------------------------
# activations with attributes


@kernel("LeakyRelu", since=1, supports=needs(FLOATS))
def leaky_relu(x: Tensor, *, alpha: float) -> Tensor:
    """x for x >= 0, alpha * x otherwise."""
    return torch.where(x >= 0, x, x * alpha)


@kernel("Elu", since=1, supports=needs(FLOATS))
def elu(x: Tensor, *, alpha: float) -> Tensor:
    """x for x > 0, alpha (exp(x) - 1) otherwise."""
    return torch.where(x > 0, x, (torch.expm1(up(x)) * alpha).to(x.dtype))


@kernel("Selu", since=1, supports=needs(FLOATS))
def selu(x: Tensor, *, alpha: float, gamma: float) -> Tensor:
    """gamma * (x for x > 0, alpha (exp(x) - 1) otherwise)."""
    y = torch.where(x > 0, up(x), torch.expm1(up(x)) * alpha) * gamma
    return y.to(x.dtype)


@kernel("Celu", since=12, supports=needs(FLOATS))
def celu(x: Tensor, *, alpha: float) -> Tensor:
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
    xf = up(x)
    y = torch.clamp_min(xf, 0) + torch.clamp_max(torch.expm1(xf / alpha) * alpha, 0)
    return y.to(x.dtype)


@kernel("HardSigmoid", since=1, supports=needs(FLOATS))
def hard_sigmoid(x: Tensor, *, alpha: float, beta: float) -> Tensor:
    """clamp(alpha x + beta, 0, 1)."""
    return torch.clamp(up(x) * alpha + beta, 0, 1).to(x.dtype)


@kernel("HardSwish", since=14, supports=needs(FLOATS))
def hard_swish(x: Tensor) -> Tensor:
    """x * clamp(x / 6 + 1/2, 0, 1)."""
    xf = up(x)
    return (xf * torch.clamp(xf * (1.0 / 6.0) + 0.5, 0, 1)).to(x.dtype)


@kernel("ThresholdedRelu", since=10, supports=needs(FLOATS))
def thresholded_relu(x: Tensor, *, alpha: float) -> Tensor:
    """x where x > alpha, else 0."""
    return torch.where(x > alpha, x, torch.zeros((), dtype=x.dtype, device=x.device))


@kernel("Shrink", since=9, supports=needs(FLOATS))
def shrink(x: Tensor, *, bias: float, lambd: float) -> Tensor:
    """x + bias below -lambd, x - bias above lambd, 0 between."""
    xf = up(x)
    zero = torch.zeros((), dtype=xf.dtype, device=x.device)
    y = torch.where(xf < -lambd, xf + bias, torch.where(xf > lambd, xf - bias, zero))
    return y.to(x.dtype)


@kernel("PRelu", since=7, supports=needs(_SIGNED_FLOATS))
def prelu(x: Tensor, slope: Tensor) -> Tensor:
    """x for x >= 0, slope * x otherwise (slope broadcasts to x)."""
    return torch.where(x < 0, x * slope, x)


@kernel("Gelu", since=20, factory=True, supports=needs(FLOATS))
def gelu(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """GELU, exact (erf) or approximate="tanh"."""
    approx = attr_str(info.attrs.get("approximate")) or "none"
    if approx not in ("none", "tanh"):
        raise ValueError(f"Gelu: approximate must be 'none' or 'tanh', got {approx!r}")
    return lambda x: F.gelu(up(x), approximate=approx).to(x.dtype)


@kernel("Swish", since=24, supports=needs(FLOATS))
def swish(x: Tensor, *, alpha: float) -> Tensor:
    """x * sigmoid(alpha x)."""
    xf = up(x)
    return (xf * torch.sigmoid(xf * alpha)).to(x.dtype)


@kernel("SwiGLU", since=28, supports=needs(FLOATS))
def swiglu(a: Tensor, b: Tensor, *, alpha: float) -> Tensor:
    """Swish_alpha(A) * B for same-shape A, B."""
    af = up(a)
    return (af * torch.sigmoid(af * alpha) * up(b)).to(a.dtype)


# ---------------------------------------------------------------------------------------
# Softmax family


def _softmax_factory(info: NodeInfo, fn) -> Callable[[Tensor], Tensor]:
    axis = int(info.attrs["axis"])
    coerce_2d = info.opset < 13
    op = info.op_type

    def run(x: Tensor) -> Tensor:
        ax = axis_of(axis, x.ndim, op)
        if coerce_2d and ax != x.ndim - 1:
            rows = math.prod(x.shape[:ax])
            return fn(x.reshape(rows, -1), 1).reshape(x.shape)
        return fn(x, ax)

    return run


def _hardmax(x: Tensor, dim: int) -> Tensor:
    if x.numel() == 0:
        return torch.zeros_like(x)
    idx = torch.argmax(x, dim=dim, keepdim=True)
    return torch.zeros_like(x).scatter_(dim, idx, 1)


@kernel("Softmax", since=1, factory=True, supports=needs(FLOATS))
def softmax(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """exp(x - max) / sum over `axis` (opset < 13: over the 2-D coerced tail)."""
    return _softmax_factory(info, lambda x, d: torch.softmax(x, d))


@kernel("LogSoftmax", since=1, factory=True, supports=needs(FLOATS))
def log_softmax(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """log of Softmax over `axis` (opset < 13: over the 2-D coerced tail)."""
    return _softmax_factory(info, lambda x, d: torch.log_softmax(x, d))


@kernel("Hardmax", since=1, factory=True, supports=needs(FLOATS))
def hardmax(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """One at the first maximum along `axis`, zero elsewhere."""
    return _softmax_factory(info, _hardmax)


# ---------------------------------------------------------------------------------------
# Clip, Where


def _clip_bounds(x: Tensor, lo: float | None, hi: float | None) -> Tensor:
    if lo is None and hi is None:
        return x.clone()
    return torch.clamp(x, lo, hi)


@kernel("Clip", since=1, until=10, factory=True, supports=needs(FLOATS))
def clip_attr(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """Clip with min/max attributes (absent: unbounded)."""
    lo, hi = info.attrs.get("min"), info.attrs.get("max")
    lo = None if lo is None else float(lo)
    hi = None if hi is None else float(hi)
    return lambda x: _clip_bounds(x, lo, hi)


@kernel("Clip", since=11, supports=needs(NUMERIC))
def clip(x: Tensor, lo: Tensor | None = None, hi: Tensor | None = None) -> Tensor:
    """Clip with optional 0-d min/max device tensors (no host read); min > max gives max."""
    if lo is None and hi is None:
        return x.clone()
    return torch.clamp(x, lo, hi)


@kernel("Where", since=9, supports=needs(SERVED))
def where(cond: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """x where cond else y, broadcasting all three."""
    return torch.where(cond, x, y)
