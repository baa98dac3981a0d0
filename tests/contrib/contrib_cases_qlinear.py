"""Generated cases for the QLinear* element-wise, pooling, softmax, concat, where and QGemm
ops (contrib_qlinear.py): every zero point at both ends and the middle of its range, input
values at the type's minimum and maximum, and output scales small enough that results
saturate at both ends.
"""

from __future__ import annotations

import numpy as np
from contrib_harness import F32, I8, I32, U8, Case, qrange, qvalues, scalar, spec, zero_points

QTYPES = (U8, I8)


def _zp_triples(dt):
    """(a, b, y) zero points that rotate through 0/128/255 or -128/0/127."""
    zps = zero_points(dt)
    return [(zps[i], zps[(i + 1) % 3], zps[(i + 2) % 3]) for i in range(3)]


def _binary(rng, op):
    cases = []
    for dt in QTYPES:
        for az, bz, cz in _zp_triples(dt):
            a, b = qvalues(rng, (3, 8), dt), qvalues(rng, (1, 8), dt)
            lo, hi = qrange(dt)
            a[0, :4], b[0, :4] = [lo, hi, lo, hi], [lo, hi, hi, lo]  # every pair of extremes
            # A scale > C scale: sums run past both ends of the output range
            consts = {"as": scalar(0.05, F32), "az": scalar(az, dt), "bs": scalar(0.07, F32),
                      "bz": scalar(bz, dt), "cs": scalar(0.01 if op == "QLinearAdd" else 0.4, F32),
                      "cz": scalar(cz, dt)}
            cases.append(Case(f"{np.dtype(dt).name}-zp{az},{bz},{cz}", {"a": a, "b": b},
                              consts=consts, names=["a", "as", "az", "b", "bs", "bz", "cs", "cz"],
                              # two factors of one sign each cannot reach both ends
                              saturates=op == "QLinearAdd" or not {az, bz} <= {lo, hi}))
    return cases


@spec("QLinearAdd")
def qlinear_add(rng):
    return _binary(rng, "QLinearAdd")


@spec("QLinearMul")
def qlinear_mul(rng):
    return _binary(rng, "QLinearMul")


def _unary(rng, extra=None, scales=(0.1, 0.02)):
    cases = []
    for dt in QTYPES:
        for xz, _, yz in _zp_triples(dt):
            x = qvalues(rng, (4, 16), dt)
            consts = {"xs": scalar(scales[0], F32), "xz": scalar(xz, dt),
                      "ys": scalar(scales[1], F32), "yz": scalar(yz, dt)}
            cases.append(Case(f"{np.dtype(dt).name}-zp{xz},{yz}", {"x": x}, attrs=dict(extra or {}),
                              consts=consts, names=["x", "xs", "xz", "ys", "yz"]))
    return cases


@spec("QLinearSigmoid")
def qlinear_sigmoid(rng):
    return _unary(rng, scales=(0.1, 1 / 512))  # half the outputs clip at the top


@spec("QLinearLeakyRelu")
def qlinear_leaky_relu(rng):
    ties = []  # x_scale / y_scale = 0.5 and alpha 0.5: half steps, odd zero points
    for dt in QTYPES:
        for yz in zero_points(dt):
            consts = {"xs": scalar(0.1, F32), "xz": scalar(0, dt), "ys": scalar(0.2, F32),
                      "yz": scalar(yz, dt)}
            ties.append(Case(f"ties-{np.dtype(dt).name}-yz{yz}", {"x": qvalues(rng, (64,), dt)},
                             {"alpha": 0.5}, consts, ["x", "xs", "xz", "ys", "yz"]))
    return [*_unary(rng, {"alpha": 0.13}), *_unary(rng, {"alpha": 1.7}, scales=(0.05, 0.03)),
            *ties]


@spec("QLinearSoftmax")
def qlinear_softmax(rng):
    cases = []
    for dt in QTYPES:
        lo, _ = qrange(dt)
        for opset, axis in ((13, -1), (12, 1), (13, 0)):
            for xz in zero_points(dt):
                x = qvalues(rng, (3, 2, 7), dt)
                # quantize_static's output parameters: scale 1/256, zero point at the bottom
                consts = {"xs": scalar(0.3, F32), "xz": scalar(xz, dt),
                          "ys": scalar(1 / 256, F32), "yz": scalar(lo, dt)}
                cases.append(Case(f"{np.dtype(dt).name}-opset{opset}-axis{axis}-zp{xz}",
                                  {"x": x}, {"opset": opset, "axis": axis}, consts,
                                  ["x", "xs", "xz", "ys", "yz"]))
        x = qvalues(rng, (64, 8), dt)
        x[:, 1:4] = x[:, :1]  # equal inputs in a row put outputs near rounding ties
        consts = {"xs": scalar(0.3, F32), "xz": scalar(0, dt), "ys": scalar(0.0031, F32),
                  "yz": scalar(lo + 3, dt)}
        cases.append(Case(f"{np.dtype(dt).name}-equal-inputs", {"x": x},
                          {"opset": 13, "axis": -1}, consts, ["x", "xs", "xz", "ys", "yz"]))
    return cases


@spec("QLinearGlobalAveragePool")
def qlinear_global_average_pool(rng):
    cases = []
    for dt in QTYPES:
        for (xz, _, yz), cl in zip(_zp_triples(dt), (0, 1, 0)):
            x = qvalues(rng, (2, 3, 4, 5), dt)
            x[0, ..., :] = qrange(dt)[1]  # whole planes at the top and the bottom
            x[1, 0] = qrange(dt)[0]
            consts = {"xs": scalar(0.1, F32), "xz": scalar(xz, dt), "ys": scalar(0.05, F32),
                      "yz": scalar(yz, dt)}
            cases.append(Case(f"{np.dtype(dt).name}-zp{xz},{yz}-cl{cl}", {"x": x},
                              {"channels_last": cl}, consts, ["x", "xs", "xz", "ys", "yz"]))
        cases += _tie_pools(rng, dt, global_pool=True)
    return cases


def _tie_pools(rng, dt, global_pool):
    """Equal x and y scales and windows of two or four taps: averages of integers land on
    half steps, so the rounding order (and float32 summation order) decides them."""
    cases = []
    for yz in zero_points(dt):
        consts = {"xs": scalar(0.1, F32), "xz": scalar(zero_points(dt)[1], dt),
                  "ys": scalar(0.1, F32), "yz": scalar(yz, dt)}
        names = ["x", "xs", "xz", "ys", "yz"]
        if global_pool:
            cases.append(Case(f"ties-{np.dtype(dt).name}-yz{yz}",
                              {"x": qvalues(rng, (2, 8, 1, 2), dt)}, {}, consts, names))
            continue
        cases.append(Case(f"ties-pad-{np.dtype(dt).name}-yz{yz}",
                          {"x": qvalues(rng, (1, 4, 5, 5), dt)},
                          {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
                          consts, names))
    return cases


@spec("QLinearAveragePool")
def qlinear_average_pool(rng):
    attr_sets = [
        {"kernel_shape": [2, 2]},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [2, 2], "channels_last": 1},
        {"kernel_shape": [3], "pads": [1, 1]},
    ]
    cases = []
    for dt in QTYPES:
        for i, attrs in enumerate(attr_sets):
            xz, _, yz = _zp_triples(dt)[i % 3]
            shape = (2, 5, 3) if len(attrs["kernel_shape"]) == 1 else (2, 3, 5, 6)
            if attrs.get("channels_last"):
                shape = (2, 5, 6, 3)
            consts = {"xs": scalar(0.1, F32), "xz": scalar(xz, dt), "ys": scalar(0.06, F32),
                      "yz": scalar(yz, dt)}
            cases.append(Case(f"{np.dtype(dt).name}-{i}", {"x": qvalues(rng, shape, dt)}, attrs,
                              consts, ["x", "xs", "xz", "ys", "yz"]))
        cases += _tie_pools(rng, dt, global_pool=False)
    return cases


@spec("QLinearConcat")
def qlinear_concat(rng):
    cases = []
    for dt in QTYPES:
        for axis, (z0, z1, yz) in zip((1, 0, -1), _zp_triples(dt)):
            x0, x1, x2 = (qvalues(rng, (2, 3, 4), dt) for _ in range(3))
            consts = {"ys": scalar(0.04, F32), "yz": scalar(yz, dt), "s0": scalar(0.1, F32),
                      "z0": scalar(z0, dt), "s1": scalar(0.02, F32), "z1": scalar(z1, dt),
                      "s2": scalar(0.04, F32), "z2": scalar(yz, dt)}
            names = ["ys", "yz", "x0", "s0", "z0", "x1", "s1", "z1", "x2", "s2", "z2"]
            cases.append(Case(f"{np.dtype(dt).name}-axis{axis}", {"x0": x0, "x1": x1, "x2": x2},
                              {"axis": axis}, consts, names))
    return cases


@spec("QLinearWhere")
def qlinear_where(rng):
    cases = []
    for dt in QTYPES:
        for xz, yz, zz in _zp_triples(dt):
            feeds = {"c": rng.integers(0, 2, (3, 1, 5)).astype(bool),
                     "x": qvalues(rng, (4, 5), dt), "y": qvalues(rng, (3, 4, 1), dt)}
            consts = {"xs": scalar(0.1, F32), "xz": scalar(xz, dt), "ys": scalar(0.3, F32),
                      "yz": scalar(yz, dt), "zs": scalar(0.15, F32), "zz": scalar(zz, dt)}
            cases.append(Case(f"{np.dtype(dt).name}-zp{xz},{yz},{zz}", feeds, consts=consts,
                              names=["c", "x", "xs", "xz", "y", "ys", "yz", "zs", "zz"]))
    return cases


def _weights(rng, dt, shape):
    """Weights for MLAS's integer GEMMs: the full range for uint8; int8 within +-63, since
    MLAS's u8s8 kernel on AVX2 machines without VNNI sums pairs of products in saturating
    int16, so wider int8 weights would compare onnxkiln against an artefact of the CPU."""
    if dt == U8:
        return qvalues(rng, shape, dt)
    w = rng.integers(-63, 64, shape).astype(dt)
    w.reshape(-1)[:2] = [-63, 63]
    return w


@spec("QGemm")
def qgemm(rng):
    cases = []
    for adt, bdt in ((U8, U8), (U8, I8), (I8, I8)):
        for i, (az, _, yz) in enumerate(_zp_triples(adt)):
            ta, tb = i % 2, (i // 2) % 2
            a = qvalues(rng, (6, 4) if ta else (4, 6), adt)
            a[0], a[1] = qrange(adt)[1], qrange(adt)[0]  # whole rows at both ends
            bz = [0, 3, -5][i] if bdt == I8 else [0, 128, 255][i]
            consts = {"as": scalar(0.05, F32), "az": scalar(az, adt),
                      "B": _weights(rng, bdt, (5, 6) if tb else (6, 5)),
                      "bs": rng.uniform(0.01, 0.05, 5 if i else ()).astype(F32),
                      "bz": np.full(5 if i else (), bz, bdt),
                      "C": rng.integers(-3000, 3000, (5,)).astype(I32)}
            names = ["a", "as", "az", "B", "bs", "bz", "C"]
            if i != 1:  # quantized output, with a small scale so it saturates
                consts |= {"ys": scalar(0.02, F32), "yz": scalar(yz, adt)}
                names += ["ys", "yz"]
            cases.append(Case(f"{np.dtype(adt).name}{np.dtype(bdt).name}-{i}", {"a": a},
                              {"transA": ta, "transB": tb, "alpha": [1.0, 0.37, 2.0][i]},
                              consts, names, rtol=0, atol=0, saturates=i != 1))
    return cases
