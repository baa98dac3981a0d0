"""uint16/uint32/uint64 arithmetic on the torch kernels (unsigned.py's signed forms) vs the
numpy CPU provider, at the values where a signed form would go wrong: 0, the type's max,
and values with the top bit set."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import check_node, reason  # noqa: E402

from onnxkiln.testing import node_model  # noqa: E402

R = np.random.default_rng(16)
TYPES = [np.uint16, np.uint32, np.uint64]


def _vals(dt, shape=(4, 6), nonzero=False):
    info = np.iinfo(dt)
    top = int(info.max)
    edges = np.array([0, 1, top, top - 1, top // 2, top // 2 + 1, 7, 1 << 10], dtype=dt)
    x = R.integers(0, top, size=shape, dtype=dt, endpoint=True)
    x.flat[:len(edges)] = edges
    if nonzero:
        x[x == 0] = 3
    return x


@pytest.mark.parametrize("dt", TYPES)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
                                "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual",
                                "Max", "Min"])
def test_binary(dt, op):
    a, b = _vals(dt), _vals(dt)[::-1].copy()
    check_node(op, {"a": a, "b": b}, opset=18)
    check_node(op, {"a": a, "b": b[:1]}, opset=18)  # broadcast


@pytest.mark.parametrize("dt", [np.uint16, np.uint32])
@pytest.mark.parametrize("op", ["Div", "Mod"])
def test_div_mod_widened(dt, op):
    check_node(op, {"a": _vals(dt), "b": _vals(dt, nonzero=True)[::-1].copy()}, opset=13)


def test_uint64_div_mod_decline():
    a = _vals(np.uint64)
    for op in ("Div", "Mod"):
        why = reason(node_model(op, {"a": a, "b": a}, opset=13))
        assert why is not None and "uint64" in why and "CPU provider" in why


@pytest.mark.parametrize("dt", TYPES)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift(dt, direction):
    bits = np.iinfo(dt).bits
    x = _vals(dt)
    s = R.integers(0, bits, size=x.shape).astype(dt)
    s.flat[:4] = [0, 1, bits - 1, bits // 2]
    check_node("BitShift", {"x": x, "s": s}, opset=11, direction=direction)


@pytest.mark.parametrize("dt", TYPES)
def test_not_variadic_and_topk(dt):
    x = _vals(dt)
    check_node("BitwiseNot", {"x": x}, opset=18)
    check_node("Max", {"a": x, "b": x[::-1].copy(), "c": x[:, ::-1].copy()}, opset=13)
    check_node("TopK", {"x": x}, initializers={"k": np.array([3], np.int64)}, n_outputs=2,
               opset=11, axis=1)
    check_node("TopK", {"x": x}, initializers={"k": np.array([2], np.int64)}, n_outputs=2,
               opset=11, axis=0, largest=0)


@pytest.mark.parametrize("dt", [np.uint32, np.uint64])
def test_pow_unsigned_exponent(dt):
    base = np.abs(R.standard_normal((3, 4))).astype(np.float32) + 0.5
    check_node("Pow", {"a": base, "b": R.integers(0, 5, size=(3, 4)).astype(dt)}, opset=15)
