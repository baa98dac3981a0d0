"""The numba time loops of LSTM, GRU and RNN (imported only through `_numba.load`).

A kernel runs every direction of one node: first the input projection of the whole
sequence (one GEMM, X W^T + biases, every direction side by side), then per step the
recurrent product of the state with R and one fused loop per batch row that reads the
projected input, applies the gates and updates the state (then the Y row). Rows whose
sequence has ended (sequence_lens) are left alone, so their state stays what it was after
their last step; the reverse direction walks each sequence from its own end. Inputs are
read where they lie and outputs written in place, in either layout.

Activations by code: 0 sigmoid, 1 tanh, 2 relu, computed branch-free so the row loops
vectorize (the default activations are passed as constants, which LLVM folds). float32
sigmoid is 1 / (1 + exp(-x)) with exp(x) = p(r) 2^k (the range reduction and degree-7
polynomial of `_numba_jit`, 2^k from its float bits): relative error 2e-7 at every x.
float32 tanh is x P(x^2) / Q(x^2) on |x| <= 9 (1 beyond, in float32), P and Q of degree 4,
fitted for this module by iteratively reweighted (Lawson) linear least squares in relative
error against numpy's float64 tanh: max relative error 3.4e-7 evaluated in float32. It
costs 13 operations where an exp-based form costs 40: the LSTM gate loop ran 1.7x faster
(6.5 -> 3.8 ns per element). float64 uses libm's exp and tanh.

The recurrent product (`_recur`) has two forms, chosen per call by the caller (see
`rnn_fast.product_mode`): 0 calls BLAS (np.dot of the state rows with R^T laid out
(H, gates*H), one GEMM per step); 1 is a dot loop over R's own rows (gates*H, H),
contiguous in the reduction, four weight rows per sweep of a state row. BLAS wins while R
fits in the L2 cache; with several rows and a large R the GEMM repacks R on every step,
and the dot loop, which streams each R row once for all rows, is up to 5x faster; with one
row both stream R at the same speed. So: the dot loop from 1 MB of R at every batch (R^T
then need not be kept), and from 768 KB at 8 rows. Measured in a numba loop of steps (µs
per step, float32, 1 thread, Xeon Emerald Rapids, 2 MB L2 per core, other processes
sharing the machine: +-30%), BLAS / dot loop, weights (gates*H, H):

    gates*H x H   B=1        B=2         B=4          B=8
    128 x 32      0.25/0.47  0.28/0.78   0.42/1.4     0.57/2.9
    256 x 64      0.85/1.3   0.76/2.2    1.4/3.8      1.9/6.7
    512 x 128     4.2/3.8    6.7/8.7     7.1/16       10/39
    768 x 256     8.0/14     9.4/22      18/29        100/68
    1024 x 256    11/19      24/22       117/46       135/73
    1152 x 384    26/34      41/51       354/69       442/166
    1536 x 512    101/116    1144/130    1716/414     1345/839
    2048 x 512    155/140    1050/180    989/443      1107/542
    1024 x 1024   144/151    1296/202    1768/537     1348/826
    4096 x 1024   1208/639   5928/1512   3193/2382    3385/2332

and as whole LSTM steps (product and gates, thread CPU time, µs per step, BLAS / dot):
R 1024 x 256 (1 MB) B=1 22.8/18.8, B=2 32.6/39.7, B=4 195/76; 1536 x 384 B=1 71/76,
B=2 463/118; 2048 x 512 (4 MB) B=1 171/172, B=2 898/221, B=4 1014/343.

(A hand-written axpy form over R^T, k outer and the gate columns inner, was 1.5-3x slower
than the dot loop at every size with B >= 2, and no faster than BLAS below.)
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import overload

from onnxkiln.providers.cpu._numba_jit import FASTMATH
from onnxkiln.providers.cpu._numba_jit import exp32 as _exp32

SIGMOID, TANH, RELU = 0, 1, 2
_OPTS = {"nogil": True, "fastmath": FASTMATH, "error_model": "numpy"}

_F0, _F1 = np.float32(0.0), np.float32(1.0)
_SIG_CLAMP = np.float32(80.0)  # sigmoid(-80) = 1.8e-35 stays a normal float32 (no subnormals)
_TANH_CLAMP = np.float32(9.0)  # tanh(9) rounds to 1 in float32
_TANH_P = tuple(np.float32(c) for c in (
    0.9999999795144952, 0.13381124162740374, 0.003495704732370933, 2.0610984336041202e-05,
    1.3357264162461745e-08))
_TANH_Q = tuple(np.float32(c) for c in (
    1.0, 0.46714439796865775, 0.025877426866114255, 0.0003285824795675705,
    7.777630551537129e-07))
_P0, _P1, _P2, _P3, _P4 = _TANH_P
_Q0, _Q1, _Q2, _Q3, _Q4 = _TANH_Q


def _jit(fn=None, **extra):
    """A jitted helper, cached on disk (falls back to memory where no cache can be written)."""
    def wrap(f):
        try:
            return numba.njit(cache=True, **_OPTS, **extra)(f)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return numba.njit(**_OPTS, **extra)(f)

    return wrap(fn) if fn is not None else wrap


@_jit
def _clip(x, c):
    """x clamped to [-c, c]; NaN stays NaN (selects, which vectorize, not branches)."""
    y = -c if x < -c else x
    return c if y > c else y


def _sigmoid32(x):
    return _F1 / (_F1 + _exp32(_clip(-x, _SIG_CLAMP)))


def _tanh32(x):
    x = _clip(x, _TANH_CLAMP)
    u = x * x
    p = (((_P4 * u + _P3) * u + _P2) * u + _P1) * u + _P0
    q = (((_Q4 * u + _Q3) * u + _Q2) * u + _Q1) * u + _Q0
    return _clip(x * p / q, _F1)  # the fit overshoots 1 by 2e-7 near 9


def _sigmoid64(x):
    return 1.0 / (1.0 + math.exp(-x))


def _tanh64(x):
    return math.tanh(x)


def sigmoid(x):
    """1 / (1 + exp(-x)) (numpy reference of the compiled forms)."""
    return 1 / (1 + np.exp(-x))


def tanh(x):
    """tanh(x) (numpy reference of the compiled forms)."""
    return np.tanh(x)


@overload(sigmoid, jit_options=_OPTS)
def _sigmoid_typed(x):
    return _sigmoid32 if x == types.float32 else _sigmoid64


@overload(tanh, jit_options=_OPTS)
def _tanh_typed(x):
    return _tanh32 if x == types.float32 else _tanh64


def zero(x):
    """0 in the dtype of x (a scalar or an array)."""
    return np.zeros(1, np.asarray(x).dtype)[0]


@overload(zero, jit_options=_OPTS)
def _zero_typed(x):
    dt = x.dtype if isinstance(x, types.Array) else x
    if dt == types.float32:
        return lambda x: np.float32(0.0)
    return lambda x: np.float64(0.0)


@_jit(inline="always")
def _act(code, x):
    """Activation `code` of x: every form computed, one selected, so a loop of them
    vectorizes; with a constant code LLVM drops the forms not selected."""
    s = sigmoid(x)
    t = tanh(x)
    r = x if x > 0 else zero(x)
    return s if code == SIGMOID else (t if code == TANH else r)


@_jit
def _copy(dst, src):
    for j in range(src.size):
        dst[j] = src[j]


# ------------------------------------------------------------------------ shared steps


@_jit
def _xrow(xw, t, b, lay):
    """The projected input row of step t, batch row b (layout 0: xw[t, b]; 1: xw[b, t])."""
    return xw[t, b] if lay == 0 else xw[b, t]


@_jit
def _put_y(y, row, t, d, b, lay):
    """Y[t, d, b] (layout 0) or Y[b, t, d] (layout 1) = row (a loop of its own: fused into
    the gate loops, one more output array would exceed LLVM's runtime alias checks and
    keep them scalar)."""
    _copy(y[t, d, b] if lay == 0 else y[b, t, d], row)


@_jit
def _recur(h, w, wt, out, tb, mode):
    """out[b] = h[b] @ w.T for the rows with tb[b] >= 0 (others: anything).

    w (G, H) and wt = w.T laid out (H, G). mode 0: one BLAS GEMM (h @ wt) for all rows;
    1: dot loops over w's rows, four per sweep of h[b] (wt is not read: it may be a dummy)."""
    nb, g = out.shape
    if mode == 0:
        np.dot(h, wt, out)
        return
    hn = h.shape[1]
    j = 0
    while j + 4 <= g:
        w0, w1, w2, w3 = w[j], w[j + 1], w[j + 2], w[j + 3]
        for b in range(nb):
            if tb[b] < 0:
                continue
            hb = h[b]
            s0 = s1 = s2 = s3 = zero(hb)
            for k in range(hn):
                v = hb[k]
                s0 += v * w0[k]
                s1 += v * w1[k]
                s2 += v * w2[k]
                s3 += v * w3[k]
            ob = out[b]
            ob[j], ob[j + 1], ob[j + 2], ob[j + 3] = s0, s1, s2, s3
        j += 4
    for jr in range(j, g):
        wr = w[jr]
        for b in range(nb):
            if tb[b] >= 0:
                hb = h[b]
                s = zero(hb)
                for k in range(hn):
                    s += hb[k] * wr[k]
                out[b, jr] = s


@_jit
def _project(x, w, bias, has_bias, w_rows):
    """X W^T (+ the summed biases) for every step and direction: one GEMM, x (S0, S1, I)
    in either layout; w is W^T (I, D*G), or with w_rows W itself (D*G, I) (a transposed
    GEMM, as fast once W is large: no copy of W then). The result is (S0, S1, D*G)."""
    s0, s1, ni = x.shape
    g = w.shape[0] if w_rows else w.shape[1]
    xw = np.empty((s0 * s1, g), x.dtype)
    if w_rows:
        np.dot(x.reshape((s0 * s1, ni)), w.T, xw)
    else:
        np.dot(x.reshape((s0 * s1, ni)), w, xw)
    if has_bias:
        for i in range(s0 * s1):
            row = xw[i]
            for j in range(g):
                row[j] += bias[j]
    return xw.reshape((s0, s1, g))


@_jit
def _steps(tb, lens, s, rev, has_lens, nt):
    """tb[b] = the time index row b processes at step s (-1 once its sequence ended)."""
    for b in range(tb.size):
        n = lens[b] if has_lens else nt
        tb[b] = -1 if s >= n else (n - 1 - s if rev else s)


@_jit
def _init(st, init, d, lay, has):
    """The state rows of direction d: from the initial state (D, B, H) / (B, D, H), or 0."""
    for b in range(st.shape[0]):
        row = st[b]
        if has:
            src = init[d, b] if lay == 0 else init[b, d]
            for j in range(row.size):
                row[j] = src[j]
        else:
            for j in range(row.size):
                row[j] = 0


@_jit
def _zero_tail(y, lens, d, lay):
    """Zero Y for direction d past each row's sequence length."""
    nt = y.shape[0] if lay == 0 else y.shape[1]
    for b in range(lens.size):
        for t in range(lens[b], nt):
            dst = y[t, d, b] if lay == 0 else y[b, t, d]
            for j in range(dst.size):
                dst[j] = 0


@_jit
def _final(out, st, lens, d, lay, has_lens):
    """Y_h/Y_c[d, b] (layout 0) or [b, d] (layout 1) = state; 0 for empty sequences."""
    for b in range(st.shape[0]):
        dst = out[d, b] if lay == 0 else out[b, d]
        if has_lens and lens[b] == 0:  # as onnxruntime: an empty sequence ends at zero
            for j in range(dst.size):
                dst[j] = 0
        else:
            _copy(dst, st[b])


@_jit
def _dims(x, r, lens, lay, has_lens):
    """(steps, batch, hidden, longest sequence)."""
    nt, nb = (x.shape[0], x.shape[1]) if lay == 0 else (x.shape[1], x.shape[0])
    longest = 0 if has_lens else nt
    if has_lens:
        for b in range(nb):
            longest = max(longest, lens[b])
    return nt, nb, r.shape[2], longest


@_jit
def _finish(y, yh, h, lens, d, lay, want_y, has_lens):
    """After direction d: zero Y past the sequence ends, write the final state."""
    if want_y and has_lens:
        _zero_tail(y, lens, d, lay)
    _final(yh, h, lens, d, lay, has_lens)


@_jit
def _scalar(like, value):
    """value (a float64) in the dtype of the array `like` (a mixed sum would be float64)."""
    buf = np.empty(1, like.dtype)
    buf[0] = value
    return buf[0]


# ------------------------------------------------------------------------------ LSTM


@_jit(inline="always")
def _lstm_row(ga, xr, hb, cb, pd, n, a0, a1, a2, input_forget, use_clip, clip):
    """One LSTM row: ga = h @ R^T (i, o, f, c), xr its input part; hb, cb updated in
    place. pd: peepholes (i, o, f), zeros when the node has none."""
    for j in range(n):
        c = cb[j]
        i = ga[j] + xr[j] + pd[j] * c
        f = ga[2 * n + j] + xr[2 * n + j] + pd[2 * n + j] * c
        g = ga[3 * n + j] + xr[3 * n + j]
        if use_clip:
            i, f, g = _clip(i, clip), _clip(f, clip), _clip(g, clip)
        i = _act(a0, i)
        f = _F1 - i if input_forget else _act(a0, f)
        c = f * c + i * _act(a1, g)
        o = ga[n + j] + xr[n + j] + pd[n + j] * c
        o = _act(a0, _clip(o, clip) if use_clip else o)
        h = o * _act(a2, c)
        cb[j] = c
        hb[j] = h


def lstm_seq(x, wt, bias, r, rt, p, h0, c0, lens, params, clip, y, yh, yc):
    """Every direction of one LSTM node.

    x (T, B, I) or (B, T, I) by layout; wt (I, D*4H): W^T of every direction (or W,
    (D*4H, I), params[17]); bias
    (D*4H,): Wb + Rb; r (D, 4H, H) and rt (D, H, 4H): R and R^T; p (D, 3H) peepholes
    (zeros if none); h0, c0 initial states; lens (B,); params: see `rnn_fast.Spec`;
    y (T, D, B, H) / (B, T, D, H), yh and yc (D, B, H) / (B, D, H)."""
    n_dirs, rev0, lay, has_h0, has_c0, has_bias, has_lens, want_y, use_clip, mode, flag = \
        params[:11]
    nt, nb, n, longest = _dims(x, r, lens, lay, has_lens)
    xw = _project(x, wt, bias, has_bias, params[17])
    cl = _scalar(r, clip)
    h = np.empty((nb, n), r.dtype)
    c = np.empty((nb, n), r.dtype)
    ga = np.empty((nb, 4 * n), r.dtype)
    tb = np.empty(nb, np.int64)
    for d in range(n_dirs):
        rev = rev0 if n_dirs == 1 else d == 1
        a0, a1, a2 = params[11 + 3 * d], params[12 + 3 * d], params[13 + 3 * d]
        default = a0 == SIGMOID and a1 == TANH and a2 == TANH
        _init(h, h0, d, lay, has_h0)
        _init(c, c0, d, lay, has_c0)
        for s in range(longest):
            _steps(tb, lens, s, rev, has_lens, nt)
            _recur(h, r[d], rt[d], ga, tb, mode)
            for b in range(nb):
                t = tb[b]
                if t < 0:
                    continue
                xr = _xrow(xw, t, b, lay)[d * 4 * n:]
                if default:  # constant codes: LLVM folds the selects into one fused loop
                    _lstm_row(ga[b], xr, h[b], c[b], p[d], n, SIGMOID, TANH, TANH, flag,
                              use_clip, cl)
                else:
                    _lstm_row(ga[b], xr, h[b], c[b], p[d], n, a0, a1, a2, flag, use_clip, cl)
                if want_y:
                    _put_y(y, h[b], t, d, b, lay)
        _finish(y, yh, h, lens, d, lay, want_y, has_lens)
        _final(yc, c, lens, d, lay, has_lens)


# ------------------------------------------------------------------------------- GRU


@_jit(inline="always")
def _gru_zr(za, xr, hb, rh, n, a0, lbr, use_clip, clip):
    """z and r of one row, in place in za[:2n] (za: h @ R_zr^T; xr: the input part); for
    linear_before_reset 0 also rh = r * h, the reset state for the h gate's product."""
    for j in range(n):
        z = za[j] + xr[j]
        rg = za[n + j] + xr[n + j]
        if use_clip:
            z, rg = _clip(z, clip), _clip(rg, clip)
        z, rg = _act(a0, z), _act(a0, rg)
        za[j] = z
        za[n + j] = rg
        if not lbr:
            rh[j] = rg * hb[j]


@_jit(inline="always")
def _gru_h(za, hx, xr, hb, rbh, n, a1, lbr, use_clip, clip):
    """The new state of one row in place in hb. za: activated z, r;
    hx: the h gate's recurrent part, (r * h) @ Rh^T, or h @ Rh^T when linear_before_reset."""
    for j in range(n):
        if lbr:
            v = xr[2 * n + j] + za[n + j] * (hx[j] + rbh[j])
        else:
            v = xr[2 * n + j] + hx[j]
        v = _act(a1, _clip(v, clip) if use_clip else v)
        hb[j] = v + za[j] * (hb[j] - v)


@_jit
def _gru_step(xw, r, rt, rt2, rbh, h, za, hh, rh, tb, y, d, fa, ga, flags, clip):
    """One step of one GRU direction for every running row."""
    lay, want_y, use_clip, mode, lbr = flags
    nb, n = h.shape
    col = d * 3 * n
    default = fa == SIGMOID and ga == TANH
    if lbr:  # one product for the three gates
        _recur(h, r, rt, za, tb, mode)
    else:
        _recur(h, r[:2 * n], rt, za, tb, mode)
    for b in range(nb):
        if tb[b] >= 0:
            xr = _xrow(xw, tb[b], b, lay)[col:]
            if default:
                _gru_zr(za[b], xr, h[b], rh[b], n, SIGMOID, lbr, use_clip, clip)
            else:
                _gru_zr(za[b], xr, h[b], rh[b], n, fa, lbr, use_clip, clip)
    if not lbr:
        _recur(rh, r[2 * n:], rt2, hh, tb, mode)
    for b in range(nb):
        if tb[b] >= 0:
            xr = _xrow(xw, tb[b], b, lay)[col:]
            hx = za[b, 2 * n:] if lbr else hh[b]
            if default:
                _gru_h(za[b], hx, xr, h[b], rbh, n, TANH, lbr, use_clip, clip)
            else:
                _gru_h(za[b], hx, xr, h[b], rbh, n, ga, lbr, use_clip, clip)
            if want_y:
                _put_y(y, h[b], tb[b], d, b, lay)



def gru_seq(x, wt, bias, r, rt, rt2, rbh, h0, lens, params, clip, y, yh):
    """Every direction of one GRU node (gates z, r, h).

    As `lstm_seq`, with bias = Wb + Rb, but with linear_before_reset the h gate's Rb is
    left out of it: it is rbh (D, H) (zeros if none), added to that gate's recurrent part
    before the reset. rt: R^T of the z, r gates (D, H, 2H), rt2: of the h gate (D, H, H);
    with linear_before_reset rt is all of R^T (D, H, 3H) and rt2 is not read."""
    n_dirs, rev0, lay, has_h0, _, has_bias, has_lens, want_y, use_clip, mode, lbr = \
        params[:11]
    nt, nb, n, longest = _dims(x, r, lens, lay, has_lens)
    xw = _project(x, wt, bias, has_bias, params[17])
    cl = _scalar(r, clip)
    h = np.empty((nb, n), r.dtype)
    za = np.empty((nb, 3 * n if lbr else 2 * n), r.dtype)
    hh = np.empty((nb, n), r.dtype)
    rh = np.zeros((nb, n), r.dtype)
    tb = np.empty(nb, np.int64)
    for d in range(n_dirs):
        rev = rev0 if n_dirs == 1 else d == 1
        fa, ga = params[11 + 3 * d], params[12 + 3 * d]
        _init(h, h0, d, lay, has_h0)
        for s in range(longest):
            _steps(tb, lens, s, rev, has_lens, nt)
            _gru_step(xw, r[d], rt[d], rt2[min(d, rt2.shape[0] - 1)], rbh[d], h, za, hh, rh,
                      tb, y, d, fa, ga, (lay, want_y, use_clip, mode, lbr), cl)
        _finish(y, yh, h, lens, d, lay, want_y, has_lens)


# ------------------------------------------------------------------------------- RNN


@_jit(inline="always")
def _rnn_row(ga, xr, hb, n, code, use_clip, clip):
    for j in range(n):
        v = ga[j] + xr[j]
        hb[j] = _act(code, _clip(v, clip) if use_clip else v)


def rnn_seq(x, wt, bias, r, rt, h0, lens, params, clip, y, yh):
    """Every direction of one RNN node: H = f(X W^T + H R^T + Wb + Rb); as `lstm_seq`."""
    n_dirs, rev0, lay, has_h0, _, has_bias, has_lens, want_y, use_clip, mode, _ = params[:11]
    nt, nb, n, longest = _dims(x, r, lens, lay, has_lens)
    xw = _project(x, wt, bias, has_bias, params[17])
    cl = _scalar(r, clip)
    h = np.empty((nb, n), r.dtype)
    ga = np.empty((nb, n), r.dtype)
    tb = np.empty(nb, np.int64)
    for d in range(n_dirs):
        rev = rev0 if n_dirs == 1 else d == 1
        code = params[11 + 3 * d]
        _init(h, h0, d, lay, has_h0)
        for s in range(longest):
            _steps(tb, lens, s, rev, has_lens, nt)
            _recur(h, r[d], rt[d], ga, tb, mode)
            for b in range(nb):
                if tb[b] < 0:
                    continue
                xr = _xrow(xw, tb[b], b, lay)[d * n:]
                if code == TANH:  # the default, as a constant: one fused loop
                    _rnn_row(ga[b], xr, h[b], n, TANH, use_clip, cl)
                else:
                    _rnn_row(ga[b], xr, h[b], n, code, use_clip, cl)
                if want_y:
                    _put_y(y, h[b], tb[b], d, b, lay)
        _finish(y, yh, h, lens, d, lay, want_y, has_lens)
