"""CPU kernels: elementwise arithmetic, math, comparison, logic and bitwise ops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from onnxkiln.dtypes import to_numpy
from onnxkiln.ops import special
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._elementwise import ufunc_specializer
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BF16 = np.dtype(ml_dtypes.bfloat16)
# Types whose math numpy does not do natively (or well): widen to float32 and round back.
_LOW_FLOATS = frozenset({np.dtype(np.float16), _BF16})

Array = Any  # np.ndarray, or a numpy scalar where a 0-d result came back from a ufunc


def input_dtype(info: NodeInfo, i: int) -> np.dtype | None:
    """The numpy dtype of input i when the plan knows it, else None."""
    dts = info.input_dtypes
    if i < len(dts) and dts[i] is not None:
        try:
            return to_numpy(dts[i])
        except KeyError:
            return None
    return None


def const_input(info: NodeInfo, i: int) -> np.ndarray | None:
    """Input i's value when it is a constant of the graph, else None."""
    consts = info.const_inputs
    return consts[i] if i < len(consts) else None


def attr_str(value: str | bytes | None) -> str | None:
    """String attributes may arrive as bytes; normalise to str."""
    return value.decode() if isinstance(value, bytes) else value


def donated(x: Array, out: np.ndarray | None) -> np.ndarray:
    """The buffer a unary elementwise kernel writes into: the executor's donated `out`
    (x itself) when writeable, else a fresh array like x."""
    if out is not None and out.flags.writeable:
        return out
    return np.empty_like(x)


def _named(fn: Callable[..., Any], name: str, doc: str) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _ufunc_factory(ufunc: np.ufunc, name: str) -> Callable[[NodeInfo], Callable[..., Any]]:
    """A factory whose kernel is the numpy ufunc itself (no Python frame per call)."""

    def factory(info: NodeInfo) -> Callable[..., Any]:
        return ufunc

    return _named(factory, name, f"Elementwise {ufunc.__name__}; output dtype = input dtype.")


# --------------------------------------------------------------------------------------
# Legacy (opset 1-6) broadcasting: `broadcast`=1 with `axis` aligns B to A at `axis`.


def _legacy_align(a: Array, b: Array, axis: int) -> Array:
    if b.ndim == 0 or b.ndim >= a.ndim:
        return b
    ax = axis + a.ndim if axis < 0 else axis
    trailing = a.ndim - ax - b.ndim
    if ax < 0 or trailing < 0:
        raise ValueError(
            f"legacy broadcast: B of shape {b.shape} does not fit A of shape {a.shape} "
            f"at axis {axis}"
        )
    return b.reshape(b.shape + (1,) * trailing)


def _legacy_binary(inner: Callable[[NodeInfo], Callable[..., Any]], name: str):
    """Factory for an opset 1-6 binary op: legacy alignment around the modern kernel."""

    def factory(info: NodeInfo) -> Callable[..., Any]:
        run = inner(info)
        axis = info.attrs.get("axis")
        if not info.attrs.get("broadcast") or axis is None:
            return run  # without `axis`, legacy suffix matching is numpy's broadcasting

        def legacy(a: Array, b: Array) -> Array:
            return run(a, _legacy_align(a, b, axis))

        return legacy

    return _named(factory, name, "Opset 1-6 binary op with legacy `broadcast`/`axis`.")


# --------------------------------------------------------------------------------------
# Arithmetic


def _buffer(r: Array) -> np.ndarray | None:
    """r as an `out=` target when it is an array we own (ufuncs return scalars for 0-d)."""
    return r if isinstance(r, np.ndarray) else None


def _check_nonzero(b: Array, op: str) -> None:
    if not np.all(b):
        n = int(np.size(b) - np.count_nonzero(b))
        raise ValueError(f"{op}: integer division by zero ({n} zero element(s) in the divisor)")


def _int_div(a: Array, b: Array, out: Array = None) -> Array:
    """Integer division truncating toward zero (C / onnxruntime semantics); a donated
    `out` is ignored."""
    _check_nonzero(b, "Div")
    if a.dtype.kind == "u":
        return np.floor_divide(a, b)
    r = np.fmod(a, b)  # sign of a, so a - r is an exact multiple of b (and cannot overflow)
    buf = _buffer(r)
    r = np.subtract(a, r, out=buf)
    return np.floor_divide(r, b, out=buf)


def _div_any(a: Array, b: Array, out: Array = None) -> Array:
    if a.dtype.kind in "iu":
        return _int_div(a, b)
    if out is not None:
        try:
            return np.divide(a, b, out=out)
        except (ValueError, TypeError):  # broadcast shape, dtype or read-only: allocate
            pass
    return np.divide(a, b)


def _div_factory(info: NodeInfo) -> Callable[..., Any]:
    dt = input_dtype(info, 0)
    if dt is None:
        return _div_any
    return _int_div if dt.kind in "iu" else np.divide


def _binary_factories() -> None:
    for op, ufunc in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply)):
        modern = _ufunc_factory(ufunc, op.lower())
        kernel(op, since=7, factory=True, inplace=(0, 1), specialize=ufunc_specializer)(modern)
        kernel(op, since=1, until=6, factory=True)(_legacy_binary(modern, f"{op.lower()}_legacy"))
    div = _named(_div_factory, "div", "Div; integer division truncates toward zero.")
    kernel("Div", since=7, factory=True, inplace=(0, 1), specialize=ufunc_specializer)(div)
    kernel("Div", since=1, until=6, factory=True)(_legacy_binary(div, "div_legacy"))


_binary_factories()


def _pow_general(x: Array, e: Array, out: Array = None) -> Array:
    """Pow for any base/exponent type pair; the result has the base's dtype."""
    xd, ed = x.dtype, e.dtype
    if xd.kind in "iu":  # onnxruntime: static_cast<T>(std::pow(double, double))
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return np.power(x.astype(_F64), e.astype(_F64)).astype(xd)
    if ed == xd:
        if out is not None:
            try:
                return np.power(x, e, out=out)
            except (ValueError, TypeError):  # the exponent widens the shape, or read-only
                pass
        return np.power(x, e)
    if xd in _LOW_FLOATS:
        return np.power(x.astype(_F32), e.astype(_F32)).astype(xd)
    return np.power(x, e.astype(xd))


def _cube(x: Array, out: Array = None) -> Array:
    if x.dtype in _LOW_FLOATS:
        return np.power(x, x.dtype.type(3))
    y = np.multiply(x, x)
    return np.multiply(y, x, out=_buffer(y))


def _same(x: Array, out: Array = None) -> Array:
    return out if out is not None and out.flags.writeable else np.array(x, copy=True)


def _square(x: Array, out: Array = None) -> Array:
    if out is None or not out.flags.writeable:
        return np.square(x)
    return np.square(x, out=out)


_POW_FAST: dict[float, Callable[..., Array]] = {
    1.0: _same,
    2.0: _square,
    3.0: _cube,
}


@kernel("Pow", since=7, factory=True, inplace=(0,))
def pow_(info: NodeInfo) -> Callable[..., Any]:
    """Pow; output dtype = base dtype. Constant scalar exponents 1, 2, 3 avoid np.power."""
    e = const_input(info, 1)
    if e is None or e.size != 1 or e.dtype.kind not in "fiu":
        return _pow_general
    fast = _POW_FAST.get(float(e.reshape(-1)[0]))
    if fast is None:
        return _pow_general
    e_ndim = e.ndim

    def run(x: Array, exponent: Array, out: Array = None) -> Array:
        if x.dtype.kind in "iu":
            return _pow_general(x, exponent)
        y = fast(x, out)
        if np.ndim(y) < e_ndim:  # the exponent's rank can still widen the output
            y = np.reshape(y, (1,) * (e_ndim - np.ndim(y)) + np.shape(y))
        return y

    return run


kernel("Pow", since=1, until=6, factory=True)(_legacy_binary(pow_, "pow_legacy"))


@kernel("Mod", since=10, factory=True)
def mod(info: NodeInfo) -> Callable[..., Any]:
    """Mod; fmod=0 takes the divisor's sign (Python), fmod=1 the dividend's (C fmod)."""
    ufunc = np.fmod if info.attrs.get("fmod") else np.remainder

    def run(a: Array, b: Array) -> Array:
        if a.dtype.kind in "iu":
            _check_nonzero(b, "Mod")
        return ufunc(a, b)

    return run


for _op, _since, _ufunc in (
    ("Neg", 1, np.negative),
    ("Abs", 1, np.absolute),
    ("Sqrt", 1, np.sqrt),
    ("Exp", 1, np.exp),
    ("Log", 1, np.log),
    ("Reciprocal", 1, np.reciprocal),
    ("Floor", 1, np.floor),
    ("Ceil", 1, np.ceil),
    ("Round", 11, np.rint),  # rint rounds half to even, as ONNX asks
    ("Sign", 9, np.sign),
    ("Sin", 7, np.sin),
    ("Cos", 7, np.cos),
    ("Tan", 7, np.tan),
    ("Asin", 7, np.arcsin),
    ("Acos", 7, np.arccos),
    ("Atan", 7, np.arctan),
    ("Sinh", 9, np.sinh),
    ("Cosh", 9, np.cosh),
    ("Asinh", 9, np.arcsinh),
    ("Acosh", 9, np.arccosh),
    ("Atanh", 9, np.arctanh),
    ("Not", 1, np.logical_not),
    ("BitwiseNot", 18, np.invert),
    ("BitwiseAnd", 18, np.bitwise_and),
    ("BitwiseOr", 18, np.bitwise_or),
    ("BitwiseXor", 18, np.bitwise_xor),
    ("LessOrEqual", 12, np.less_equal),
    ("GreaterOrEqual", 12, np.greater_equal),
):
    _factory = _ufunc_factory(_ufunc, _op.lower())
    _same_dtype = _op not in ("Not", "LessOrEqual", "GreaterOrEqual")  # those give bool
    kernel(_op, since=_since, factory=True, inplace=range(_ufunc.nin) if _same_dtype else (),
           specialize=ufunc_specializer)(_factory)

# Ops whose opset 1-6 versions carry legacy broadcast/axis attributes.
for _op, _ufunc in (
    ("Equal", np.equal),
    ("Less", np.less),
    ("Greater", np.greater),
    ("And", np.logical_and),
    ("Or", np.logical_or),
    ("Xor", np.logical_xor),
):
    _modern = _ufunc_factory(_ufunc, _op.lower())
    kernel(_op, since=7, factory=True, specialize=ufunc_specializer)(_modern)
    kernel(_op, since=1, until=6, factory=True)(_legacy_binary(_modern, f"{_op.lower()}_legacy"))


def _erf_any(x: Array, out: Array = None) -> Array:
    dt = x.dtype
    if dt in (_F32, _F64) and out is not None:
        return special.erf(x, out=donated(x, out))
    if dt in _LOW_FLOATS:
        return special.erf(x.astype(_F32)).astype(dt)
    if dt.kind in "iu":  # opset 9-12 allow ints: erf in float64, truncated back
        return special.erf(x.astype(_F64)).astype(dt)
    return special.erf(x)


@kernel("Erf", since=9, factory=True, inplace=(0,))
def erf(info: NodeInfo) -> Callable[..., Any]:
    """Erf (`special.erf`, within 1 ulp in float32); float16/bfloat16 through float32."""
    dt = input_dtype(info, 0)
    if dt is not None and dt in (_F32, _F64):
        return special.erf
    return _erf_any


# --------------------------------------------------------------------------------------
# Variadic ops (broadcasting; opsets before 8 required equal shapes, a subset of this)


def _fold(ufunc: np.ufunc, xs: tuple[Array, ...], dtype: np.dtype | None = None) -> np.ndarray:
    """ufunc over all inputs into one fresh buffer (never a view of an input)."""
    if not xs:
        raise ValueError("variadic op needs at least one input, got none")
    first = xs[0]
    if len(xs) == 1:
        return np.array(first, dtype=dtype, copy=True)
    shape = np.broadcast_shapes(*(np.shape(x) for x in xs))
    out = np.empty(shape, dtype=dtype or first.dtype)
    ufunc(first, xs[1], out=out, dtype=out.dtype)  # dtype= picks the loop, not just the cast
    for x in xs[2:]:
        ufunc(out, x, out=out, dtype=out.dtype)
    return out


@kernel("Max", since=1)
def max_(*xs: Array) -> Array:
    """Elementwise maximum of all inputs (NaN propagates)."""
    if len(xs) == 2:
        return np.maximum(xs[0], xs[1])
    return _fold(np.maximum, xs)


@kernel("Min", since=1)
def min_(*xs: Array) -> Array:
    """Elementwise minimum of all inputs (NaN propagates)."""
    if len(xs) == 2:
        return np.minimum(xs[0], xs[1])
    return _fold(np.minimum, xs)


@kernel("Sum", since=1)
def sum_(*xs: Array) -> Array:
    """Elementwise sum of all inputs; float16/bfloat16 with 3+ inputs accumulate in float32."""
    if len(xs) == 2:
        return np.add(xs[0], xs[1])
    dt = xs[0].dtype
    if dt in _LOW_FLOATS and len(xs) > 2:
        return _fold(np.add, xs, _F32).astype(dt)
    return _fold(np.add, xs)


@kernel("Mean", since=1)
def mean(*xs: Array) -> Array:
    """Elementwise mean of all inputs; float16/bfloat16 accumulate in float32."""
    dt = xs[0].dtype
    acc = _F32 if dt in _LOW_FLOATS else None
    out = _fold(np.add, xs, acc)
    np.divide(out, len(xs), out=out)
    return out.astype(dt) if acc is not None else out


# --------------------------------------------------------------------------------------
# Predicates and bit shifts


@kernel("IsNaN", since=9, factory=True)
def isnan(info: NodeInfo) -> Callable[..., Any]:
    """IsNaN: bool mask."""
    return np.isnan


@kernel("IsInf", since=10, factory=True)
def isinf(info: NodeInfo) -> Callable[..., Any]:
    """IsInf with detect_negative / detect_positive."""
    neg = bool(info.attrs.get("detect_negative", 1))
    pos = bool(info.attrs.get("detect_positive", 1))
    if neg and pos:
        return np.isinf

    def run(x: Array) -> Array:
        if x.dtype in _LOW_FLOATS or x.dtype.kind == "V":
            x = x.astype(_F32)
        if pos:
            return np.equal(x, np.inf)
        if neg:
            return np.equal(x, -np.inf)
        return np.zeros(np.shape(x), dtype=bool)

    return run


@kernel("BitShift", since=11, factory=True)
def bit_shift(info: NodeInfo) -> Callable[..., Any]:
    """BitShift; shifts >= the bit width or negative give 0 (or -1 for negative X >> n)."""
    direction = attr_str(info.attrs.get("direction"))
    if direction == "LEFT":
        return np.left_shift
    if direction == "RIGHT":
        return np.right_shift
    raise ValueError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
