"""Generated cases for the quantize/dequantize, integer matmul, block-quantized and
quantized-layer contrib ops (contrib_quant.py, contrib_quant_layers.py, contrib_dqlstm.py):
zero points at both ends and the middle of their range, values at the type's limits,
rounding ties, and the first/last nibble of packed 2/4-bit weights."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from contrib_cases_qlinear import _weights
from contrib_harness import F16, F32, I8, I32, U8, Case, normal, qrange, qvalues, scalar, spec
from contrib_harness import zero_points as zero_points_of

INT4, UINT4 = ml_dtypes.int4, ml_dtypes.uint4


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Values in [0, 2^bits) packed 8 // bits to a byte along the last axis, low bits first."""
    per = 8 // bits
    q = np.concatenate([q, np.zeros((*q.shape[:-1], (-q.shape[-1]) % per), q.dtype)], -1)
    q = q.astype(np.uint16).reshape(*q.shape[:-1], -1, per)
    return sum(q[..., i] << (bits * i) for i in range(per)).astype(U8)


def _ties(scale: float, n: int, span: float) -> np.ndarray:
    """float32 values that land on half steps of `scale` (rounding ties), both signs, and far
    past both ends of any integer range."""
    half = (np.arange(n) - n // 2 + 0.5).astype(F32) * F32(scale)
    return np.concatenate([half, np.array([span, -span], F32) * F32(scale)]).astype(F32)


@spec("QuantizeLinear")
def quantize_linear(rng):
    cases = []
    for dt in (U8, I8, np.uint16, np.int16):
        lo, hi = qrange(dt)
        for zp in (lo, 0 if lo < 0 else (hi + 1) // 2, hi):
            x = _ties(0.5, 12, 2.0 * (hi - lo) + 5)
            cases.append(Case(f"{np.dtype(dt).name}-zp{zp}", {"x": x},
                              consts={"s": scalar(0.5, F32), "z": scalar(zp, dt)},
                              saturates=True))
    x = normal(rng, (2, 3, 4), F32, 60)
    cases.append(Case("per-axis-int8", {"x": x}, {"axis": 1},
                      {"s": np.array([0.5, 0.25, 2], F32), "z": np.array([-128, 0, 127], I8)}))
    cases.append(Case("float16-no-zp", {"x": normal(rng, (5,), F16, 90)},
                      consts={"s": scalar(0.5, F16)}))
    cases.append(Case("float16-infinities", {"x": np.array([np.inf, -np.inf, 65504, -65504,
                                                               0.5, 1.5], F16)},
                      consts={"s": scalar(1.0, F16), "z": scalar(0, I8)}))
    cases.append(Case("nan", {"x": np.array([np.nan, 1.0], F32)},
                      consts={"s": scalar(1.0, F32), "z": scalar(3, U8)}))
    # onnxruntime returns no int4 arrays: compared after a Cast to 8 bits
    cases += [Case(f"{np.dtype(dt).name}-zp{zp}", {"x": _ties(0.5, 8, 40)},
                   consts={"s": scalar(0.5, F32), "z": scalar(zp, dt)}, widen=True)
              for dt, zps in ((INT4, (-8, 0, 7)), (UINT4, (0, 8, 15))) for zp in zps]
    return cases


@spec("DequantizeLinear")
def dequantize_linear(rng):
    cases = []
    for dt in (U8, I8, np.uint16, np.int16, I32):
        lo, hi = qrange(dt) if dt != I32 else (-(2**20), 2**20)
        for zp in (lo, hi) if dt != I32 else (0,):
            x = qvalues(rng, (3, 5), dt) if dt != I32 else rng.integers(lo, hi, (3, 5)).astype(dt)
            cases.append(Case(f"{np.dtype(dt).name}-zp{zp}", {"x": x},
                              consts={"s": scalar(0.37, F32), "z": scalar(zp, dt)}))
    cases.append(Case("per-axis-uint8", {"x": qvalues(rng, (2, 3, 4), U8)}, {"axis": -1},
                      {"s": rng.uniform(0.1, 1, 4).astype(F32),
                       "z": np.array([0, 128, 255, 7], U8)}))
    for dt, zps in ((INT4, (-8, 7)), (UINT4, (0, 15))):
        lo, hi = (-8, 7) if dt == INT4 else (0, 15)
        for zp in zps:  # int4 tensors go in as constants (onnxruntime's Python API takes none)
            x = np.concatenate([[lo, hi, hi, lo], rng.integers(lo, hi + 1, 7)]).astype(dt)
            cases.append(Case(f"{np.dtype(dt).name}-zp{zp}-odd-length", {},
                              consts={"x": x, "s": scalar(0.5, F32), "z": scalar(zp, dt)}))
    return cases


@spec("DynamicQuantizeMatMul")
def dynamic_quantize_matmul(rng):
    cases = []
    for bdt in (U8, I8):
        for i, bz in enumerate(zero_points_of(bdt)):
            a = normal(rng, (3, 16), F32, 3)
            a[0, 0], a[1, 1] = 0.0, -0.0  # the quantization range always includes 0
            if i == 1:
                a = np.abs(a)  # all positive: A's zero point lands at 0
            consts = {"B": _weights(rng, bdt, (16, 5)),
                      "bs": rng.uniform(0.01, 0.1, 5 if i else ()).astype(F32),
                      "bz": np.full(5 if i else (), bz if bdt == U8 else 0, bdt),
                      "bias": normal(rng, (5,))}
            cases.append(Case(f"{np.dtype(bdt).name}-{i}", {"a": a}, consts=consts,
                              names=["a", "B", "bs", "bz", "bias"], rtol=1e-5, atol=1e-4))
    for name, a in (("a-zeros", np.zeros((2, 8), F32)), ("a-constant", np.full((2, 8), 3.0, F32))):
        cases.append(Case(name, {"a": a}, consts={"B": qvalues(rng, (8, 3), U8),
                                                  "bs": scalar(0.1, F32), "bz": scalar(128, U8)},
                          names=["a", "B", "bs", "bz"], rtol=1e-5, atol=1e-4))
    return cases


@spec("MatMulIntegerToFloat")
def matmul_integer_to_float(rng):
    cases = []
    for adt, bdt in ((U8, U8), (U8, I8), (I8, I8)):
        for i, (az, bz) in enumerate(zip(zero_points_of(adt), zero_points_of(bdt))):
            if bdt == I8:
                bz = [0, -5, 3][i]  # keeps |B - bz| small, see _weights
            consts = {"B": _weights(rng, bdt, (8, 5)), "as": scalar(0.04, F32),
                      "bs": rng.uniform(0.01, 0.1, 5).astype(F32), "az": scalar(az, adt),
                      "bz": np.full(5, bz, bdt), "bias": normal(rng, (5,))}
            cases.append(Case(f"{np.dtype(adt).name}{np.dtype(bdt).name}-zp{az},{bz}",
                              {"a": qvalues(rng, (2, 3, 8), adt)}, consts=consts,
                              names=["a", "B", "as", "bs", "az", "bz", "bias"], rtol=1e-5,
                              atol=1e-4))
    return cases


@spec("MatMulInteger16")
def matmul_integer16(rng):
    return [Case("int16", {"a": qvalues(rng, (3, 4), np.int16),
                           "b": rng.integers(-300, 300, (4, 5)).astype(np.int16)})]


@spec("NhwcMaxPool")
def nhwc_max_pool(rng):
    sets = [{"kernel_shape": [2, 2]}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
            {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
            {"kernel_shape": [2, 2], "dilations": [2, 2]}]
    return [Case(f"{np.dtype(dt).name}-{i}", {"x": qvalues(rng, (2, 6, 7, 3), dt)}, attrs)
            for dt in (U8, I8) for i, attrs in enumerate(sets)]


@spec("QLinearConv")
def qlinear_conv(rng):
    cases = []
    for xdt, wdt in ((U8, U8), (U8, I8), (I8, I8)):
        for cl, (xz, yz) in zip((0, 1), ((zero_points_of(xdt)[0], zero_points_of(xdt)[2]),
                                         (zero_points_of(xdt)[2], zero_points_of(xdt)[1]))):
            x = qvalues(rng, (1, 6, 5, 4) if cl else (1, 4, 6, 5), xdt)
            consts = {"xs": scalar(0.05, F32), "xz": scalar(xz, xdt),
                      "w": _weights(rng, wdt, (6, 2, 3, 3)),
                      "ws": rng.uniform(0.01, 0.03, 6 if cl else ()).astype(F32),
                      "wz": np.full(6 if cl else (), 128 if wdt == U8 else 0, wdt),
                      "ys": scalar(0.04, F32),
                      "yz": scalar(yz, xdt), "b": rng.integers(-2000, 2000, 6).astype(I32)}
            cases.append(Case(f"{np.dtype(xdt).name}{np.dtype(wdt).name}-cl{cl}", {"x": x},
                              {"channels_last": cl, "group": 2, "pads": [1, 0, 1, 1],
                               "strides": [1, 2], "kernel_shape": [3, 3]}, consts,
                              ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                              saturates=True))
    x = qvalues(rng, (1, 2, 7, 7), U8)
    consts = {"xs": scalar(0.05, F32), "xz": scalar(255, U8), "w": _weights(rng, I8, (3, 2, 3, 3)),
              "ws": scalar(0.02, F32), "wz": scalar(0, I8), "ys": scalar(0.03, F32),
              "yz": scalar(0, U8)}
    cases += [Case(name, {"x": x}, {"kernel_shape": [3, 3], **attrs}, consts,
                   ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"])
              for name, attrs in (("same-upper-strided", {"auto_pad": "SAME_UPPER",
                                                          "strides": [2, 1]}),
                                  ("dilated-padded", {"dilations": [2, 2], "pads": [2, 1, 0, 2]}))]
    return cases
