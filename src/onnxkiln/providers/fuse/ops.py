"""The ops the fuse provider compiles: eligibility, and their code in numpy and numba form.

Every op has three renderings, used by codegen.py:
- `np_lines(dest, args, attrs)`: numpy statements writing the result into the float32 buffer
  `dest` (broadcast to its shape) with `out=`; `dest` never aliases an argument.
- `nb_expr(args, attrs)`: a scalar expression for the numba loop body (float64 arithmetic).
- row reductions (Softmax, LayerNormalization, RMS norms) have their own numba row code in
  codegen.py; here they only have numpy lines.
Arguments are source snippets naming float32 arrays (numpy) or scalars (numba); an absent
optional input is None.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["OPS", "REDUCTIONS", "FuseOp", "fmt"]

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_FLOAT16 = 10  # onnx TensorProto.FLOAT16


def fmt(value: float) -> str:
    """A float literal that round-trips exactly (inf/nan spelled through numpy)."""
    if math.isnan(value):
        return "np.nan"
    if math.isinf(value):
        return "np.inf" if value > 0 else "-np.inf"
    return repr(float(value))


@dataclass(frozen=True)
class FuseOp:
    """One compilable op: its arity (min, max inputs), the attributes it keeps, renderings."""

    arity: tuple[int, int]
    np_lines: Callable[[str, list[str | None], dict[str, Any]], list[str]]
    nb_expr: Callable[[list[str | None], dict[str, Any]], str] | None
    attrs: tuple[str, ...] = ()


def _ufunc(name: str) -> Callable[[str, list, dict], list[str]]:
    return lambda d, a, _: [f"np.{name}({', '.join(a)}, out={d})"]


def _unary(np_name: str, nb: str, attrs: tuple[str, ...] = ()) -> FuseOp:
    return FuseOp((1, 1), _ufunc(np_name), lambda a, _: nb.format(*a), attrs)


def _binary(np_name: str, nb: str) -> FuseOp:
    return FuseOp((2, 2), _ufunc(np_name), lambda a, _: nb.format(*a))


def _f32(x: float) -> str:
    return f"np.float32({fmt(x)})"


def _leaky_np(d: str, a: list, at: dict) -> list[str]:
    alpha = float(at["alpha"])
    pick = "maximum" if alpha <= 1.0 else "minimum"
    return [f"np.multiply({a[0]}, {_f32(alpha)}, out={d})", f"np.{pick}({a[0]}, {d}, out={d})"]


def _elu_np(d: str, a: list, at: dict) -> list[str]:
    x, alpha = a[0], _f32(float(at["alpha"]))
    return [f"np.expm1(np.minimum({x}, 0), out={d})", f"np.multiply({d}, {alpha}, out={d})",
            f"np.copyto({d}, {x}, where={x} >= 0)"]


def _selu_np(d: str, a: list, at: dict) -> list[str]:
    return [*_elu_np(d, a, at), f"np.multiply({d}, {_f32(float(at['gamma']))}, out={d})"]


def _hard_sigmoid_np(d: str, a: list, at: dict) -> list[str]:
    return [f"np.multiply({a[0]}, {_f32(float(at['alpha']))}, out={d})",
            f"np.add({d}, {_f32(float(at['beta']))}, out={d})",
            f"np.clip({d}, np.float32(0), np.float32(1), out={d})"]


def _hard_swish_np(d: str, a: list, at: dict) -> list[str]:
    return [*_hard_sigmoid_np(d, a, {"alpha": 1.0 / 6.0, "beta": 0.5}),
            f"np.multiply({d}, {a[0]}, out={d})"]


def _softsign_np(d: str, a: list, at: dict) -> list[str]:
    return [f"np.abs({a[0]}, out={d})", f"np.add({d}, np.float32(1), out={d})",
            f"np.divide({a[0]}, {d}, out={d})"]


def _gelu_np(d: str, a: list, at: dict) -> list[str]:
    x = a[0]
    if at.get("approximate", "none") == "tanh":
        return [f"np.multiply({x}, {x}, out={d})", f"np.multiply({d}, {_f32(0.044715)}, out={d})",
                f"np.add({d}, np.float32(1), out={d})", f"np.multiply({d}, {x}, out={d})",
                f"np.multiply({d}, {_f32(_SQRT_2_PI)}, out={d})", f"np.tanh({d}, out={d})",
                f"np.add({d}, np.float32(1), out={d})", f"np.multiply({d}, {x}, out={d})",
                f"np.multiply({d}, np.float32(0.5), out={d})"]
    return [f"np.multiply({x}, {_f32(_SQRT1_2)}, out={d})", f"_erf({d}, out={d})",
            f"np.add({d}, np.float32(1), out={d})", f"np.multiply({d}, {x}, out={d})",
            f"np.multiply({d}, np.float32(0.5), out={d})"]


def _gelu_nb(a: list, at: dict) -> str:
    x = a[0]
    if at.get("approximate", "none") == "tanh":
        return (f"0.5 * {x} * (1.0 + np.tanh({fmt(_SQRT_2_PI)} * ({x} + 0.044715 * {x} * {x} "
                f"* {x})))")
    return f"0.5 * {x} * (1.0 + math.erf({x} * {fmt(_SQRT1_2)}))"


def _clip_np(d: str, a: list, at: dict) -> list[str]:
    lo, hi = ([*a, None, None])[1:3]
    lo = lo if lo is not None else (_f32(at["min"]) if at.get("min") is not None else None)
    hi = hi if hi is not None else (_f32(at["max"]) if at.get("max") is not None else None)
    lines = [f"np.copyto({d}, {a[0]})"]
    if lo is not None:
        lines.append(f"np.maximum({d}, {lo}, out={d})")
    if hi is not None:
        lines.append(f"np.minimum({d}, {hi}, out={d})")
    return lines


def _clip_nb(a: list, at: dict) -> str:
    lo, hi = ([*a, None, None])[1:3]
    lo = lo if lo is not None else (fmt(at["min"]) if at.get("min") is not None else None)
    hi = hi if hi is not None else (fmt(at["max"]) if at.get("max") is not None else None)
    expr = a[0]
    if lo is not None:
        expr = f"np.maximum({expr}, {lo})"
    if hi is not None:
        expr = f"np.minimum({expr}, {hi})"
    return expr


def _cast_np(d: str, a: list, at: dict) -> list[str]:
    if at["to"] == _FLOAT16:  # round to float16 precision, as the unfused graph does
        return [f"np.copyto({d}, np.asarray({a[0]}).astype(np.float16))"]
    return [f"np.copyto({d}, {a[0]}, casting='unsafe')"]


def _cast_nb(a: list, at: dict) -> str:
    return f"_f16(float({a[0]}))" if at["to"] == _FLOAT16 else f"float({a[0]})"


def _where_np(d: str, a: list, at: dict) -> list[str]:
    return [f"np.copyto({d}, {a[2]})", f"np.copyto({d}, {a[1]}, where={a[0]})"]


def _prelu_np(d: str, a: list, at: dict) -> list[str]:
    return [f"np.multiply({a[0]}, {a[1]}, out={d})", f"np.copyto({d}, {a[0]}, where={a[0]} >= 0)"]


OPS: dict[str, FuseOp] = {
    "Abs": _unary("abs", "abs({})"),
    "Neg": _unary("negative", "(-{})"),
    "Exp": _unary("exp", "np.exp({})"),
    "Log": _unary("log", "np.log({})"),
    "Sqrt": _unary("sqrt", "np.sqrt({})"),
    "Reciprocal": _unary("reciprocal", "(1.0 / {})"),
    "Tanh": _unary("tanh", "np.tanh({})"),
    "Sin": _unary("sin", "np.sin({})"),
    "Cos": _unary("cos", "np.cos({})"),
    "Floor": _unary("floor", "np.floor({})"),
    "Ceil": _unary("ceil", "np.ceil({})"),
    "Identity": FuseOp((1, 1), lambda d, a, _: [f"np.copyto({d}, {a[0]})"], lambda a, _: a[0]),
    "Cast": FuseOp((1, 1), _cast_np, _cast_nb, ("to",)),
    "Relu": FuseOp((1, 1), lambda d, a, _: [f"np.maximum({a[0]}, np.float32(0), out={d})"],
                   lambda a, _: f"np.maximum({a[0]}, 0.0)"),
    "Sigmoid": FuseOp((1, 1), lambda d, a, _: [f"_expit({a[0]}, out={d})"],
                      lambda a, _: f"(1.0 / (1.0 + np.exp(-{a[0]})))"),
    "Erf": FuseOp((1, 1), lambda d, a, _: [f"_erf({a[0]}, out={d})"],
                  lambda a, _: f"math.erf({a[0]})"),
    "Softplus": FuseOp((1, 1), lambda d, a, _: [f"np.logaddexp({a[0]}, np.float32(0), out={d})"],
                       lambda a, _: f"(np.maximum({a[0]}, 0.0) + np.log1p(np.exp(-abs({a[0]}))))"),
    "Softsign": FuseOp((1, 1), _softsign_np, lambda a, _: f"({a[0]} / (1.0 + abs({a[0]})))"),
    "LeakyRelu": FuseOp((1, 1), _leaky_np,
                        lambda a, t: f"({a[0]} if {a[0]} >= 0.0 else {a[0]} * {fmt(t['alpha'])})",
                        ("alpha",)),
    "Elu": FuseOp((1, 1), _elu_np,
                  lambda a, t: f"({a[0]} if {a[0]} >= 0.0 else {fmt(t['alpha'])} * "
                               f"np.expm1({a[0]}))", ("alpha",)),
    "Selu": FuseOp((1, 1), _selu_np,
                   lambda a, t: f"({fmt(t['gamma'])} * ({a[0]} if {a[0]} >= 0.0 else "
                                f"{fmt(t['alpha'])} * np.expm1({a[0]})))", ("alpha", "gamma")),
    "HardSigmoid": FuseOp((1, 1), _hard_sigmoid_np,
                          lambda a, t: f"np.minimum(np.maximum({fmt(t['alpha'])} * {a[0]} + "
                                       f"{fmt(t['beta'])}, 0.0), 1.0)", ("alpha", "beta")),
    "HardSwish": FuseOp((1, 1), _hard_swish_np,
                        lambda a, _: f"({a[0]} * np.minimum(np.maximum({a[0]} / 6.0 + 0.5, 0.0), "
                                     "1.0))"),
    "Gelu": FuseOp((1, 1), _gelu_np, _gelu_nb, ("approximate",)),
    "Add": _binary("add", "({} + {})"),
    "Sub": _binary("subtract", "({} - {})"),
    "Mul": _binary("multiply", "({} * {})"),
    "Div": _binary("divide", "({} / {})"),
    "Pow": _binary("power", "({} ** {})"),
    "Max": _binary("maximum", "np.maximum({}, {})"),
    "Min": _binary("minimum", "np.minimum({}, {})"),
    "PRelu": FuseOp((2, 2), _prelu_np,
                    lambda a, _: f"({a[0]} if {a[0]} >= 0.0 else {a[0]} * {a[1]})"),
    "Where": FuseOp((3, 3), _where_np, lambda a, _: f"({a[1]} if {a[0]} else {a[2]})"),
    "Clip": FuseOp((1, 3), _clip_np, _clip_nb, ("min", "max")),
}


def _softmax_np(d: str, a: list, at: dict) -> list[str]:
    return [f"np.subtract({a[0]}, np.maximum.reduce({a[0]}, axis=-1, keepdims=True), out={d})",
            f"np.exp({d}, out={d})",
            f"np.divide({d}, np.add.reduce({d}, axis=-1, keepdims=True), out={d})"]


def _layer_norm_np(d: str, a: list, at: dict) -> list[str]:
    x, scale, bias = ([*a, None, None])[:3]
    lines = [f"_m = np.add.reduce({x}, axis=-1, keepdims=True)",
             f"_m *= np.float32(1.0 / {x}.shape[-1])",
             f"np.subtract({x}, _m, out={d})",
             f"_v = np.vecdot({d}, {d})[..., None]",
             f"_v *= np.float32(1.0 / {d}.shape[-1])",
             f"_v += {_f32(at['epsilon'])}",
             "np.sqrt(_v, out=_v)",
             f"np.divide({d}, _v, out={d})",
             f"np.multiply({d}, {scale}, out={d})"]
    if bias is not None:
        lines.append(f"np.add({d}, {bias}, out={d})")
    return lines


def _rms_norm_np(d: str, a: list, at: dict) -> list[str]:
    x, scale = a[0], a[1]
    return [f"_v = np.vecdot({x}, {x})[..., None]",
            f"_v *= np.float32(1.0 / {x}.shape[-1])",
            f"_v += {_f32(at['epsilon'])}",
            "np.sqrt(_v, out=_v)",
            f"np.divide({x}, _v, out={d})",
            f"np.multiply({d}, {scale}, out={d})"]


# op -> (numpy lines, kind for the numba row code, attributes kept, arity)
REDUCTIONS: dict[str, FuseOp] = {
    "Softmax": FuseOp((1, 1), _softmax_np, None, ("axis",)),
    "LayerNormalization": FuseOp((2, 3), _layer_norm_np, None, ("axis", "epsilon")),
    "SimplifiedLayerNormalization": FuseOp((2, 2), _rms_norm_np, None, ("axis", "epsilon")),
    "RMSNormalization": FuseOp((2, 2), _rms_norm_np, None, ("axis", "epsilon")),
}
