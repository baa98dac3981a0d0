"""uint16/uint32/uint64 arithmetic for the torch kernels, through signed types where exact.

torch stores these types but has no arithmetic on them. Each op kind maps them exactly:

- "wrap" (Add, Sub, Mul, bitwise ops, left shifts): the same-width signed view; two's
  complement wraps exactly as unsigned arithmetic does.
- "order" (comparisons, Max, Min, TopK): the signed view with the sign bit flipped, which
  orders like the unsigned values (flipped back for Max/Min/TopK values).
- "widen" (Div, Mod, right shifts): uint16 -> int32, uint32 -> int64, where every value is
  non-negative; uint64 right shifts are arithmetic shifts masked to a logical one. uint64
  Div and Mod have no exact signed form (values of 2^63 and more) and stay declined.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from onnxkiln.dtypes import DataType

Tensor = torch.Tensor
UNSIGNED = frozenset({DataType.UINT16, DataType.UINT32, DataType.UINT64})
_SAME = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
_WIDE = {torch.uint16: torch.int32, torch.uint32: torch.int64}
_SIGN = {torch.int16: -(1 << 15), torch.int32: -(1 << 31), torch.int64: -(1 << 63)}

# op -> kind; the ops that accept unsigned inputs through this module
KIND = {
    "Add": "wrap", "Sub": "wrap", "Mul": "wrap", "BitwiseAnd": "wrap", "BitwiseOr": "wrap",
    "BitwiseXor": "wrap", "BitwiseNot": "wrap", "BitShiftLeft": "wrap",
    "Equal": "order", "Greater": "order", "Less": "order", "GreaterOrEqual": "order",
    "LessOrEqual": "order", "Max": "order", "Min": "order",
    "Div": "widen", "Mod": "widen", "BitShiftRight": "widen",
}


def uint64_decline(op: str) -> str | None:
    """Why `op` cannot serve uint64 exactly, else None."""
    if KIND.get(op) == "widen" and op != "BitShiftRight":
        return (f"{op} on uint64 has no exact signed form in torch (values >= 2^63); the "
                f"CPU provider runs it")
    return None


def _flip(x: Tensor) -> Tensor:
    """The signed view of an unsigned tensor, ordered as the unsigned values."""
    s = x.view(_SAME[x.dtype])
    return torch.bitwise_xor(s, _SIGN[s.dtype])


def _unflip(y: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.bitwise_xor(y, _SIGN[y.dtype]).view(dtype)


def _logical_shift_right(a: Tensor, s: Tensor) -> Tensor:
    """uint64 a >> s through int64: the arithmetic shift with the sign copies masked off."""
    x, n = a.view(torch.int64), s.view(torch.int64)
    big = (n < 0) | (n >= 64)  # (as uint64: 64 or more) -> 0
    n = torch.where(big, torch.zeros_like(n), n)
    shifted = torch.bitwise_right_shift(x, n)
    mask = torch.bitwise_left_shift(torch.ones_like(n), 64 - n) - 1
    mask = torch.where(n == 0, torch.full_like(mask, -1), mask)
    y = torch.bitwise_and(shifted, mask)
    return torch.where(big, torch.zeros_like(y), y).view(torch.uint64)


def lift(op: str, fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`fn` (a kernel over signed/float tensors) extended to unsigned inputs of one type."""
    kind = KIND[op]

    def run(*xs: Tensor) -> Tensor:
        dt = xs[0].dtype
        if dt not in _SAME:
            return fn(*xs)
        if kind == "wrap":
            return fn(*[x.view(_SAME[x.dtype]) for x in xs]).view(dt)
        if kind == "order":
            y = fn(*[_flip(x) for x in xs])
            return y if y.dtype == torch.bool else _unflip(y, dt)
        if dt == torch.uint64:  # only BitShiftRight reaches here (see uint64_decline)
            return _logical_shift_right(*xs)
        return fn(*[x.to(_WIDE[x.dtype]) for x in xs]).to(dt)

    run.__doc__ = fn.__doc__
    return run


def topk_values(x: Tensor, topk: Callable[[Tensor], tuple[Tensor, Tensor]]
                ) -> tuple[Tensor, Tensor]:
    """TopK over an unsigned tensor: sorted in the order-preserving signed view."""
    if x.dtype not in _SAME:
        return topk(x)
    values, indices = topk(_flip(x))
    return _unflip(values, x.dtype), indices
