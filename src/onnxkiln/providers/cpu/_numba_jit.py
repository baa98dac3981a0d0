"""The numba-compiled loops behind `_numba` (imported only through `_numba.load`).

Plain Python functions here are compiled per dtype by `_numba.load` with explicit
signatures (inputs typed read-only, so read-only initializers and memory maps match too).
Every function writes into output arrays its caller allocates and never into an input.
Single-threaded, `nogil`: the executor's intra-op threads go to BLAS; two sessions can run
these kernels from two Python threads at once.

float32 transcendental functions use branch-free polynomial forms that LLVM vectorizes
(libm's scalar `expf`/`erff` do not vectorize and are slower than numpy's):
- exp: round-to-nearest range reduction by ln 2 (split in two parts), a degree-7 Taylor
  polynomial, and 2^k built from the float bits of (k + 127) << 23 (`exp32`, which the
  activation and recurrent kernels share).
- erf: x * P(x^2) / Q(x^2) on |x| <= 3.925 (degrees 6 and 5), fitted for this module by
  weighted linear least squares against scipy.special.erf in float64 (max error 4e-9 in
  float64 arithmetic, 4e-7 evaluated in float32); beyond 3.925 erf rounds to +-1 in float32.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir as llvm_ir
from numba import types
from numba.extending import intrinsic

FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # no nnan/ninf: NaN and inf propagate

NO_CACHE: list[str] = []  # why compiled code could not be cached on disk, if it could not


def _helper(fn):
    """A jitted helper the kernels call: cached on disk where numba finds a place for it."""
    opts = {"nogil": True, "fastmath": FASTMATH, "error_model": "numpy"}
    try:
        return numba.njit(cache=True, **opts)(fn)
    except RuntimeError as e:  # "cannot cache function ...: no locator available ..."
        NO_CACHE.append(str(e))
        return numba.njit(**opts)(fn)


@intrinsic
def bits_to_f32(typingctx, bits):
    """The float32 whose bits are the int32 `bits` (an LLVM bitcast; vectorizes)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.FloatType())

    return types.float32(types.int32), codegen


_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_EXP_LO = np.float32(-87.3)  # below: exp underflows; the result is 0
_EXP_HI = np.float32(88.7)
_E7, _E6, _E5, _E4, _E3 = (np.float32(1.0 / f) for f in (5040, 720, 120, 24, 6))
_F0, _F1, _HALF = np.float32(0.0), np.float32(1.0), np.float32(0.5)
_ERF_CLAMP = np.float32(3.925)
_ERF_P = tuple(np.float32(c) for c in (
    1.1283791778757117, 0.1847447251590487, 0.05425537216640803, 0.003830580136755291,
    0.0003791625303380501, 4.683545748590534e-06, -1.3157527234408661e-08))
_ERF_Q = tuple(np.float32(c) for c in (
    0.4970592509681671, 0.11376817402994599, 0.015422876660504984, 0.0013030691762896743,
    6.309859285213298e-05))
_P0, _P1, _P2, _P3, _P4, _P5, _P6 = _ERF_P
_Q1, _Q2, _Q3, _Q4, _Q5 = _ERF_Q
_SQRT1_2 = np.float32(math.sqrt(0.5))
_GELU_A = np.float32(-2.0 * math.sqrt(2.0 / math.pi))  # -2 sqrt(2/pi)
_GELU_B = np.float32(-2.0 * math.sqrt(2.0 / math.pi) * 0.044715)


@_helper
def exp32(x):
    """exp(x) for float32 x in [-87, 88]: p(r) 2^k, r = x - k ln 2 (module doc)."""
    t = x * _LOG2E
    ki = np.int32(t + _HALF) if t >= _F0 else np.int32(t - _HALF)
    k = np.float32(ki)
    r = x - k * _LN2_HI - k * _LN2_LO
    p = _E7 * r + _E6
    p = p * r + _E5
    p = p * r + _E4
    p = p * r + _E3
    p = p * r + _HALF
    p = p * r + _F1
    p = p * r + _F1
    return p * bits_to_f32((ki + np.int32(127)) << 23)


@_helper
def _exp32(src, dst, n, shift):
    """dst[:n] = exp(src[:n] - shift), float32 (0 below the underflow bound)."""
    for j in range(n):
        v = src[j] - shift
        zero = v < _EXP_LO
        e = exp32(min(max(v, _EXP_LO), _EXP_HI))
        dst[j] = _F0 if zero else e


# ------------------------------------------------------------------------------ softmax


def softmax_rows(x, y, log):
    """Softmax (log=1: log-softmax) of each row of x (rows, n) into y; y may be x's buffer."""
    rows, n = x.shape
    row = np.empty(n, np.float32)  # a copy: _exp32 vectorizes only when src and dst differ
    for r in range(rows):
        yr = y[r]
        xr = x[r]
        m = np.float32(-np.inf)
        nan = False
        for j in range(n):
            v = xr[j]
            row[j] = v
            nan |= v != v
            m = max(m, v)
        xr = row
        if nan:  # as numpy: a NaN anywhere makes the whole row NaN
            for j in range(n):
                yr[j] = np.nan
            continue
        m32 = np.float32(m)
        if log:
            _exp32(xr, yr, n, m32)
            s = _F0
            for j in range(n):
                s += yr[j]
            c = m32 + np.float32(math.log(s))
            for j in range(n):
                yr[j] = xr[j] - c
        else:
            _exp32(xr, yr, n, m32)
            s = _F0
            for j in range(n):
                s += yr[j]
            inv = _F1 / s
            for j in range(n):
                yr[j] *= inv


# ------------------------------------------------------------------------------ GELU


def gelu(x, bias, has_bias, y, tanh_form):
    """y = GELU(x (+ bias over the last axis)) for x, y (rows, n) float32; y may alias x.

    tanh_form=0: 0.5 t (1 + erf(t / sqrt 2)); 1: t / (1 + exp(-2 sqrt(2/pi) (t + 0.044715 t^3))).
    """
    rows, n = x.shape
    tmp = np.empty(n, np.float32)
    zb = np.empty(n, np.float32)
    for r in range(rows):
        xr = x[r]
        yr = y[r]
        if has_bias:
            for j in range(n):
                tmp[j] = xr[j] + bias[j]
        else:
            for j in range(n):
                tmp[j] = xr[j]
        if tanh_form:
            for j in range(n):
                t = tmp[j]
                zb[j] = (_GELU_B * t * t + _GELU_A) * t
            _exp32(zb, yr, n, _F0)
            for j in range(n):
                yr[j] = tmp[j] / (_F1 + yr[j])
        else:
            for j in range(n):
                t = tmp[j]
                u = min(max(t * _SQRT1_2, -_ERF_CLAMP), _ERF_CLAMP)
                u2 = u * u
                p = _P6 * u2 + _P5
                p = p * u2 + _P4
                p = p * u2 + _P3
                p = p * u2 + _P2
                p = p * u2 + _P1
                p = p * u2 + _P0
                q = _Q5 * u2 + _Q4
                q = q * u2 + _Q3
                q = q * u2 + _Q2
                q = q * u2 + _Q1
                q = q * u2 + _F1
                yr[j] = _HALF * t * (_F1 + u * p / q)


# ------------------------------------------------------------------------------ norms


def norm_rows(x, skip, bias, gamma, beta, flags, eps, y, total, mean, inv):
    """(Skip)LayerNorm / RMSNorm of each row of x (rows, n), all in x's dtype.

    s = x (+ skip[row % skip_rows]) (+ bias); flags = (has_skip, has_bias, has_beta,
    simplified, want_total). total[row] = s when want_total. y = (s - mean) * inv * gamma
    (+ beta), with mean = 0 for RMSNorm; mean[row] and inv[row] = 1/sqrt(var + eps) returned.
    """
    rows, n = x.shape
    has_skip, has_bias, has_beta, simplified, want_total = flags
    srows = skip.shape[0]
    inv_n = 1.0 / n
    for r in range(rows):
        xr = x[r]
        yr = y[r]
        if has_skip or has_bias:
            sr = skip[r % srows] if has_skip else xr
            for j in range(n):
                v = xr[j]
                if has_skip:
                    v += sr[j]
                if has_bias:
                    v += bias[j]
                yr[j] = v
            if want_total:
                tr = total[r]
                for j in range(n):
                    tr[j] = yr[j]
            src = yr
        else:
            src = xr
        acc = 0.0  # statistics accumulate in float64
        if not simplified:
            for j in range(n):
                acc += src[j]
        mean[r] = acc * inv_n
        mu = mean[r]  # back in x's dtype
        var = 0.0
        for j in range(n):
            d = src[j] - mu
            var += d * d
        inv[r] = 1.0 / math.sqrt(var * inv_n + eps)
        iv = inv[r]
        if has_beta:
            for j in range(n):
                yr[j] = (src[j] - mu) * iv * gamma[j] + beta[j]
        else:
            for j in range(n):
                yr[j] = (src[j] - mu) * iv * gamma[j]


# ------------------------------------------------------------------------------ conv


@_helper
def _axpy(acc, seg, wv):
    """acc += wv * seg (kept a separate function: LLVM vectorizes it here, not inlined)."""
    for i in range(acc.size):
        acc[i] += wv * seg[i]


@_helper
def _copy(dst, src, start, step):
    """dst[:] = src[start::step][:dst.size]."""
    if step == 1:
        seg = src[start:start + dst.size]
        for i in range(dst.size):
            dst[i] = seg[i]
    else:
        for i in range(dst.size):
            dst[i] = src[start + i * step]


def conv2d(x, w, bias, params, out):
    """Direct grouped 2-D convolution (depthwise when w has one input channel per group).

    x (N, C, H, W), w (M, C/g, KH, KW), bias (M,) (zeros when the node has none), out
    (N, M, OH, OW); params = (stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, group).
    Each group's zero-padded input is split once into stride-phase planes (one plane for
    stride 1), stored flat with row length wq; every kernel tap then reads one contiguous
    span of one plane, so an output channel is a sum of scaled contiguous spans (columns
    past the output width are computed and dropped).
    """
    sh, sw, dh, dw, pt, pl, group = params
    n_batch, _, h, wd = x.shape
    m, cg, kh, kw = w.shape
    oh, ow = out.shape[2], out.shape[3]
    mg = m // group
    hq = oh + ((kh - 1) * dh) // sh
    wq = ow + ((kw - 1) * dw) // sw
    plen = hq * wq + wq
    span = oh * wq
    buf = np.zeros((sh * sw, cg, plen), x.dtype)
    acc = np.empty(span, x.dtype)
    for b in range(n_batch):
        for g in range(group):
            for py in range(sh):
                for px in range(sw):
                    ph = py * sw + px
                    # plane columns qx reading input columns qx * sw + px - pl in [0, wd)
                    lo = max(0, -((px - pl) // sw))
                    hi = min(wq, -((px - pl - wd) // sw))
                    if hi <= lo:
                        continue
                    i0 = lo * sw + px - pl
                    for ci in range(cg):
                        plane = x[b, g * cg + ci]
                        for qy in range(hq):
                            iy = qy * sh + py - pt
                            if 0 <= iy < h:
                                _copy(buf[ph, ci, qy * wq + lo:qy * wq + hi], plane[iy], i0, sw)
            for mo in range(mg):
                co = g * mg + mo
                bv = bias[co]
                for i in range(span):
                    acc[i] = bv
                for ci in range(cg):
                    for ky in range(kh):
                        for kx in range(kw):
                            wv = w[co, ci, ky, kx]
                            ph = ((ky * dh) % sh) * sw + (kx * dw) % sw
                            off = ((ky * dh) // sh) * wq + (kx * dw) // sw
                            _axpy(acc, buf[ph, ci, off:off + span], wv)
                oc = out[b, co]
                for oy in range(oh):
                    row = acc[oy * wq:oy * wq + ow]
                    orow = oc[oy]
                    for j in range(ow):
                        orow[j] = row[j]
