"""numba depthwise 2-D convolutions (loaded through `_numba.register`; imported only when a
run first needs them). Both compute output channels [c0, c1) so the caller can split the
channels across onnxkiln's pool; both are `nogil` and single-threaded.

- `depthwise_rows` works on NCHW rows: for each output row and kernel tap, one scaled
  contiguous (stride 1) or strided input row is added in; good when rows are long.
- `depthwise_cl` copies the channels into a zero-padded channels-last buffer first, so every
  tap adds one contiguous vector of channels; good for small maps with many channels (the
  7x7 stages of mobile networks), where NCHW rows are too short to vectorize.

params = (stride_h, stride_w, dil_h, dil_w, pad_top, pad_left); x (N, C, H, W), bias (C,),
out (N, C, OH, OW). `depthwise_rows` takes w as (C, KH, KW), `depthwise_cl` as (KH, KW, C).
Both apply activation `code` with parameters (p0, p1) as they write the output (see `_act`).

`bias_act_rows` adds a per-row bias and applies the same activations to a column range of a
product's output (a 1x1 or im2col conv's (M, positions)) in one pass, where numpy takes
one pass for the bias and one or more for the activation.

Inner-loop indices are cast to np.uintp: numba wraps negative signed indices around, and
that check on an index it cannot prove non-negative keeps LLVM from vectorizing the loop
(measured: 0.73 ns per element with the check, 0.15 without).
"""

from __future__ import annotations

import numpy as np

from onnxkiln.providers.cpu._numba_jit import _helper

_F0, _F1 = np.float32(0.0), np.float32(1.0)  # typed: float32 kernels stay in float32
_ACC_ELEMENTS = 2048
"""depthwise_planes accumulates this many outputs at a time, so the accumulator and the
plane rows it reads stay in L1 (measured: 112x112 maps 2x faster than one whole-map
accumulator; 56x56 and smaller maps fit either way)."""


@_helper
def _act(v, code, a, b):
    """Activation `code` of v: 0 none, 1 clip to [a, b] (Relu: [0, inf]), 2 LeakyRelu with
    slope a, 3 HardSigmoid clip(a v + b, 0, 1), 4 HardSwish v clip(a v + b, 0, 1). Written
    so that a NaN stays NaN, as numpy's maximum/clip keep it."""
    if code == 1:
        v = a if v < a else v
        return b if v > b else v
    if code == 2:
        return v * a if v < _F0 else v
    if code >= 3:
        t = v * a + b
        t = _F0 if t < _F0 else t
        t = _F1 if t > _F1 else t
        return t if code == 3 else v * t
    return v


def bias_act_rows(y, bias, code, a, b, c0, c1):
    """y[r, c0:c1] = act(y[r, c0:c1] + bias[r]) for every row r of a C-contiguous 2-D y
    (no bias added when `bias` is empty)."""
    m = y.shape[0]
    has_bias = bias.shape[0] > 0
    for r in range(m):
        row = y[r]
        if has_bias:
            bv = bias[r]
            for j in range(c0, c1):
                row[np.uintp(j)] = _act(row[np.uintp(j)] + bv, code, a, b)
        elif code != 0:
            for j in range(c0, c1):
                row[np.uintp(j)] = _act(row[np.uintp(j)], code, a, b)


def depthwise_rows(x, w, bias, params, c0, c1, out):
    """Channels [c0, c1) of a depthwise convolution, NCHW row by row."""
    sh, sw, dh, dw, pt, pl = params
    n, _, h, wd = x.shape
    kh, kw = w.shape[1], w.shape[2]
    oh, ow = out.shape[2], out.shape[3]
    for b in range(n):
        for c in range(c0, c1):
            xc = x[b, c]
            oc = out[b, c]
            wc = w[c]
            bv = bias[c]
            for oy in range(oh):
                orow = oc[oy]
                for ox in range(ow):
                    orow[ox] = bv
                for ky in range(kh):
                    iy = oy * sh - pt + ky * dh
                    if iy < 0 or iy >= h:
                        continue
                    xrow = xc[iy]
                    for kx in range(kw):
                        wv = wc[ky, kx]
                        off = kx * dw - pl
                        lo = 0 if off >= 0 else (sw - 1 - off) // sw
                        last = wd - 1 - off
                        if last < 0:
                            continue
                        hi = min(ow, last // sw + 1)
                        for i in range(hi - lo):
                            ox = lo + i
                            orow[np.uintp(ox)] += wv * xrow[np.uintp(ox * sw + off)]


def depthwise_cl(x, wt, bias, params, c0, c1, out, code, p0, p1):
    """Channels [c0, c1) of a depthwise convolution through a channels-last buffer."""
    sh, sw, dh, dw, pt, pl = params
    n, _, h, wd = x.shape
    kh, kw = wt.shape[0], wt.shape[1]
    oh, ow = out.shape[2], out.shape[3]
    cc = c1 - c0
    hp = (oh - 1) * sh + (kh - 1) * dh + 1
    wp = (ow - 1) * sw + (kw - 1) * dw + 1
    xt = np.zeros((hp, wp, cc), x.dtype)  # pads stay zero: every batch rewrites the inside
    acc = np.empty((oh * ow, cc), x.dtype)
    wc = np.empty((kh, kw, cc), x.dtype)
    for ky in range(kh):
        for kx in range(kw):
            for c in range(cc):
                wc[ky, kx, c] = wt[ky, kx, np.uintp(c0 + c)]
    rows, cols = min(h, hp - pt), min(wd, wp - pl)
    for b in range(n):
        for cb in range(0, cc, 16):  # transpose in blocks of 16 channels: 16 read streams
            ce = min(cb + 16, cc)
            for iy in range(rows):
                for ix in range(cols):
                    for c in range(cb, ce):
                        xt[iy + pt, ix + pl, np.uintp(c)] = x[b, np.uintp(c0 + c), iy, ix]
        for oy in range(oh):
            for ox in range(ow):
                p = oy * ow + ox
                for c in range(cc):
                    acc[p, c] = bias[np.uintp(c0 + c)]
                for ky in range(kh):
                    ty = oy * sh + ky * dh
                    for kx in range(kw):
                        tx = ox * sw + kx * dw
                        for c in range(cc):
                            acc[p, c] += wc[ky, kx, c] * xt[ty, tx, c]
        for cb in range(0, cc, 16):
            ce = min(cb + 16, cc)
            for p in range(oh * ow):
                oy, ox = p // ow, p % ow
                for c in range(cb, ce):
                    out[b, np.uintp(c0 + c), oy, ox] = _act(acc[p, c], code, p0, p1)


def depthwise_planes(x, w, bias, params, c0, c1, out, code, p0, p1):
    """Channels [c0, c1) of a depthwise convolution over stride-phase planes.

    Each channel's zero-padded input is split into sh * sw stride-phase planes stored flat
    with row length wq, so every kernel tap reads one contiguous span of one plane: the
    output channel is `bias + sum over taps of w * span` (columns past the output width are
    computed and dropped). One fill per channel, then per block of output rows kh * kw
    vector loops and one copy.
    """
    sh, sw, dh, dw, pt, pl = params
    n = x.shape[0]
    kh, kw = w.shape[1], w.shape[2]
    oh, ow = out.shape[2], out.shape[3]
    hq = oh + ((kh - 1) * dh) // sh
    wq = ow + ((kw - 1) * dw) // sw
    plen = hq * wq + wq  # one spare row: the last tap's span may run past the plane
    block = max(1, min(oh, _ACC_ELEMENTS // wq))  # output rows per accumulator block
    buf = np.empty(sh * sw * plen, x.dtype)
    acc = np.empty(block * wq, x.dtype)
    for b in range(n):
        for c in range(c0, c1):
            _fill_planes(x, b, c, buf, sh, sw, pt, pl, hq, wq, plen, 0)
            bv = bias[c]
            for r0 in range(0, oh, block):
                rows = min(block, oh - r0)
                span = rows * wq
                for i in range(span):
                    acc[np.uintp(i)] = bv
                for ky in range(kh):
                    for kx in range(kw):
                        wv = w[c, ky, kx]
                        ph = ((ky * dh) % sh) * sw + (kx * dw) % sw
                        start = ph * plen + ((ky * dh) // sh + r0) * wq + (kx * dw) // sw
                        for i in range(span):
                            acc[np.uintp(i)] += wv * buf[np.uintp(start + i)]
                for oy in range(rows):
                    for ox in range(ow):
                        out[b, c, r0 + oy, np.uintp(ox)] = _act(acc[np.uintp(oy * wq + ox)],
                                                                code, p0, p1)


@_helper
def _fill_planes(x, b, c, buf, sh, sw, pt, pl, hq, wq, plen, pad):
    """buf's sh * sw planes (hq, wq) <- channel c of image b, padded with `pad`, by stride
    phase."""
    h, wd = x.shape[2], x.shape[3]
    for i in range(buf.size):
        buf[np.uintp(i)] = pad
    if sw == 2:
        _fill_pairs(x, b, c, buf, sh, pt, pl, hq, wq, plen)
        return
    for py in range(sh):
        for px in range(sw):
            base = (py * sw + px) * plen
            lo = max(0, -((px - pl) // sw))  # plane columns reading inside the image
            hi = min(wq, -((px - pl - wd) // sw))
            if hi <= lo:
                continue
            for qy in range(hq):
                iy = qy * sh + py - pt
                if iy < 0 or iy >= h:
                    continue
                row = base + qy * wq
                for qx in range(lo, hi):
                    buf[np.uintp(row + qx)] = x[b, c, iy, np.uintp(qx * sw + px - pl)]


@_helper
def _fill_pairs(x, b, c, buf, sh, pt, pl, hq, wq, plen):
    """_fill_planes for a horizontal stride of 2: both column phases of an input row in one
    loop (an interleaved read LLVM vectorizes; one stride-2 read per loop it does not)."""
    h, wd = x.shape[2], x.shape[3]
    lo0, hi0 = max(0, -((0 - pl) // 2)), min(wq, -((0 - pl - wd) // 2))
    lo1, hi1 = max(0, -((1 - pl) // 2)), min(wq, -((1 - pl - wd) // 2))
    ql, qh = max(lo0, lo1), min(hi0, hi1)
    for py in range(sh):
        base0, base1 = (py * 2) * plen, (py * 2 + 1) * plen
        for qy in range(hq):
            iy = qy * sh + py - pt
            if iy < 0 or iy >= h:
                continue
            xr = x[b, c, iy]
            r0, r1 = base0 + qy * wq, base1 + qy * wq
            for qx in range(ql, qh):
                buf[np.uintp(r0 + qx)] = xr[np.uintp(2 * qx - pl)]
                buf[np.uintp(r1 + qx)] = xr[np.uintp(2 * qx + 1 - pl)]
            for qx in range(lo0, min(ql, hi0)):
                buf[np.uintp(r0 + qx)] = xr[np.uintp(2 * qx - pl)]
            for qx in range(max(qh, lo0), hi0):
                buf[np.uintp(r0 + qx)] = xr[np.uintp(2 * qx - pl)]
            for qx in range(lo1, min(ql, hi1)):
                buf[np.uintp(r1 + qx)] = xr[np.uintp(2 * qx + 1 - pl)]
            for qx in range(max(qh, lo1), hi1):
                buf[np.uintp(r1 + qx)] = xr[np.uintp(2 * qx + 1 - pl)]


def maxpool_planes(x, kernel, params, c0, c1, out):
    """Channels [c0, c1) of a 2-D MaxPool (no indices) over stride-phase planes padded with
    -inf: each kernel tap is one contiguous span of one plane (see depthwise_planes).
    kernel = (kh, kw); a NaN in a window makes its maximum NaN, as np.maximum does in the
    separable numpy kernel."""
    sh, sw, dh, dw, pt, pl = params
    kh, kw = kernel
    n = x.shape[0]
    oh, ow = out.shape[2], out.shape[3]
    hq = oh + ((kh - 1) * dh) // sh
    wq = ow + ((kw - 1) * dw) // sw
    plen = hq * wq + wq
    span = oh * wq
    buf = np.empty(sh * sw * plen, x.dtype)
    acc = np.empty(span, x.dtype)
    lowest = -np.inf
    for b in range(n):
        for c in range(c0, c1):
            _fill_planes(x, b, c, buf, sh, sw, pt, pl, hq, wq, plen, lowest)
            for i in range(span):
                acc[np.uintp(i)] = lowest
            for ky in range(kh):
                for kx in range(kw):
                    ph = ((ky * dh) % sh) * sw + (kx * dw) % sw
                    start = ph * plen + ((ky * dh) // sh) * wq + (kx * dw) // sw
                    for i in range(span):
                        v = buf[np.uintp(start + i)]
                        a = acc[np.uintp(i)]
                        if a == a and not v <= a:  # a NaN max stays; a NaN v wins
                            acc[np.uintp(i)] = v
            for oy in range(oh):
                for ox in range(ow):
                    out[b, c, oy, np.uintp(ox)] = acc[np.uintp(oy * wq + ox)]
