"""numba versions of the ai.onnx.ml score finishing (imported only through `_numba.load`).

The numpy code in `ml_common` (post-transforms) and `ml_tree` (onnxruntime's classifier
and regressor rules) costs a dozen numpy calls per batch, which dominates a one-row
prediction; these loops do the same per row in one call. The formulas are the numpy
path's, in float32 (transcendental functions may differ from numpy's in the last bit);
the binary classifier's base-value arithmetic is float64, as there.
"""

from __future__ import annotations

import math

import numba
import numpy as np

# post-transform codes (ml_common.POST_TRANSFORMS order)
NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT = range(5)
# ml_finish's int parameters
MODE, POST, HAS, H0, H1, NBASE, ONE_POSITIVE = range(7)
REGRESS, MULTI, BINARY = range(3)

_F0, _F1, _F2, _HALF = np.float32(0.0), np.float32(1.0), np.float32(2.0), np.float32(0.5)
_ZERO_BAND = np.float32(1e-7)
_F32_MIN = np.float32(np.finfo(np.float32).min)
_SQRT2 = np.float32(1.41421356)
_ERFINV_A = np.float32(0.147)
_ERFINV_C = np.float32(2.0) / (np.float32(3.14159) * _ERFINV_A)


def _jit(fn):
    opts = {"nogil": True, "error_model": "numpy", "inline": "always"}
    try:
        return numba.njit(cache=True, **opts)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(**opts)(fn)


@_jit
def logistic(v):
    """1 / (1 + exp(-v)) without overflow (float32)."""
    s = _F1 / (_F1 + math.exp(-abs(v)))
    return _F1 - s if v < _F0 else s


@_jit
def probit(v):
    """sqrt(2) erfinv(2v - 1) with onnxruntime's closed-form erfinv (float32)."""
    x = _F2 * v - _F1
    sgn = -_F1 if x < _F0 else _F1
    t = (_F1 - x) * (_F1 + x)
    lg = math.log(t) if t > _F0 else (-np.float32(np.inf) if t == _F0 else np.float32(np.nan))
    a = _ERFINV_C + _HALF * lg
    b = lg / _ERFINV_A
    d = math.sqrt(a * a - b) - a if a * a - b >= _F0 else np.float32(np.nan)
    r = sgn * (math.sqrt(d) if d >= _F0 else np.float32(np.nan))
    return r * _SQRT2


@_jit
def post_row(z, r, post):
    """Apply a post-transform to row r of float32 z in place."""
    k = z.shape[1]
    if post == LOGISTIC:
        for j in range(k):
            z[r, j] = logistic(z[r, j])
    elif post == PROBIT:
        for j in range(k):
            z[r, j] = probit(z[r, j])
    elif post in (SOFTMAX, SOFTMAX_ZERO):
        m = -np.float32(np.inf)
        nan = False
        for j in range(k):
            v = z[r, j]
            nan |= v != v
            m = max(m, v)
        if nan:
            m = np.float32(np.nan)
        if post == SOFTMAX:
            total = _F0
            for j in range(k):
                e = math.exp(z[r, j] - m)
                z[r, j] = e
                total += e
        else:
            m = max(m, _F32_MIN) if m == m else m
            scale = math.exp(-m)
            total = _F0
            for j in range(k):
                v = z[r, j]
                if -_ZERO_BAND <= v <= _ZERO_BAND:
                    z[r, j] = v * scale
                else:
                    e = math.exp(v - m)
                    z[r, j] = e
                    total += e
        for j in range(k):
            z[r, j] = z[r, j] / total


@_jit
def _one_score(z, r, s, post, all_positive):
    """onnxruntime's two columns from a binary classifier's single class-0 score s."""
    if post == PROBIT:
        z[r, 0], z[r, 1] = probit(s), _F0
    elif all_positive:
        p = logistic(s) if post == LOGISTIC else s
        z[r, 0], z[r, 1] = _F1 - p, p
    elif post == LOGISTIC:
        z[r, 0], z[r, 1] = logistic(-s), logistic(s)
    else:
        z[r, 0], z[r, 1] = -s, s


@_jit
def _flag(has, r, j, const, rows):
    return has[r, j] != 0 if rows and const < 0 else const > 0


@_jit
def _argmax(out, has, r, rows):
    """numpy's argmax of row r, unscored targets counting as -inf (the first NaN wins)."""
    best = 0
    bv = out[r, 0] if not rows or has[r, 0] else -np.inf
    for j in range(1, out.shape[1]):
        if bv != bv:
            break
        v = out[r, j] if not rows or has[r, j] else -np.inf
        if v != v or v > bv:
            best, bv = j, v
    return best


@_jit
def _binary(out, has, fi, fb, z, lab, r):
    rows = fi[HAS] != 0
    h0 = _flag(has, r, 0, fi[H0], rows)
    h1 = _flag(has, r, 1, fi[H1], rows)
    s0, s1 = np.float64(out[r, 0]), np.float64(out[r, 1])
    single = False
    if fi[NBASE] == 2:
        s1_new = fb[1] + s0
        s0 = -s1_new if h1 else s0 + fb[0]
        s1 = s1_new if h1 else s1 + fb[1]
    else:
        if fi[NBASE] == 1:
            s0 += fb[0]
        single = not h1
    z0 = np.float32(s0 if h0 else 0.0)
    z1 = np.float32(s1 if h1 else 0.0)
    one_positive = fi[ONE_POSITIVE] != 0
    lab[r] = 1 if (z1 if h1 else z0) > (_HALF if one_positive else _F0) else 0
    if single:
        _one_score(z, r, z0, fi[POST], one_positive)
    else:
        z[r, 0], z[r, 1] = z0, z1
        post_row(z, r, fi[POST])


def ml_finish(out, has, fi, fb, z, lab):
    """Scores [N, K] (and which targets scored, when fi[HAS]) -> float32 z [N, K] and, for
    classifiers, the label index lab [N]: a regressor's post-transform, a multi-class
    argmax and post-transform, or onnxruntime's binary rules with base values fb."""
    mode = fi[MODE]
    rows = fi[HAS] != 0
    for r in range(out.shape[0]):
        if mode == BINARY:
            _binary(out, has, fi, fb, z, lab, r)
            continue
        if mode == MULTI:
            lab[r] = _argmax(out, has, r, rows)
        for j in range(out.shape[1]):
            z[r, j] = out[r, j]
        post_row(z, r, fi[POST])


# ------------------------------------------------------------------------------ SVM

_R_LO, _R_HI = np.float32(1e-7), np.float32(1 - 1e-7)
_EPS = np.float32(0.005)


@_jit
def _coupling(r, q, p, qp):
    """libsvm's pairwise coupling of one sample (float32, up to 100 iterations): class
    probabilities p [K] from pairwise probabilities r [K, K]; q, qp are scratch."""
    k = p.shape[0]
    for i in range(k):
        d = _F0
        for j in range(k):
            d += r[j, i] * r[j, i]
            q[i, j] = -(r[j, i] * r[i, j])
        q[i, i] = d - r[i, i] * r[i, i]
    for i in range(k):
        p[i] = np.float32(1.0 / k)
    eps = _EPS / np.float32(k)
    for _ in range(100):
        pqp = _F0
        for i in range(k):
            acc = _F0
            for j in range(k):
                acc += q[i, j] * p[j]
            qp[i] = acc
            pqp += p[i] * acc
        err = _F0
        for i in range(k):
            err = max(err, abs(qp[i] - pqp))
        if not err >= eps:  # converged (a NaN stops too, as in the numpy version)
            break
        for t in range(k):
            qtt = q[t, t]
            diff = (-qp[t] + pqp) / qtt
            p[t] += diff
            one = _F1 + diff
            pqp = (pqp + diff * (diff * qtt + _F2 * qp[t])) / one / one
            for j in range(k):
                qp[j] = (qp[j] + diff * q[t, j]) / one
            for j in range(k):
                p[j] = p[j] / one


def svm_vote_proba(dec, pairs, ab, probs, best):
    """One-vs-one SVC outputs from the decision values dec [N, P] of the class pairs
    pairs [P, 2]: best [N] is the class with the most pairwise wins (the first on ties);
    with ab = (prob_a[:P], prob_b[:P]) set, probs [N, K] are the pairwise-coupled
    probabilities (Platt-scaled pairs clipped to [1e-7, 1 - 1e-7]). probs is [N, K] (the
    class count) either way."""
    n, n_pairs = dec.shape
    k = probs.shape[1]
    votes = np.zeros(k, np.int64)
    r = np.zeros((k, k), np.float32)
    q = np.empty((k, k), np.float32)
    qp = np.empty(k, np.float32)
    for s in range(n):
        votes[:] = 0
        for t in range(n_pairs):
            votes[pairs[t, 0] if dec[s, t] > _F0 else pairs[t, 1]] += 1
        top = 0
        for c in range(1, k):
            if votes[c] > votes[top]:
                top = c
        best[s] = top
        if ab.shape[0] == 0:
            continue
        for t in range(n_pairs):
            v = _F1 - logistic(dec[s, t] * ab[t] + ab[n_pairs + t])
            if v == v:
                v = min(max(v, _R_LO), _R_HI)
            r[pairs[t, 0], pairs[t, 1]] = v
            r[pairs[t, 1], pairs[t, 0]] = _F1 - v
        _coupling(r, q, probs[s], qp)


# ------------------------------------------------------------------------------ Normalizer

NORM_MAX, NORM_L1, NORM_L2 = range(3)


def normalize_rows(v, norm, out):
    """Normalizer over the rows of v [N, C] (arithmetic in v's dtype) into float32 out:
    divide by the max of the row's non-NaN values (NaN when all are), the |v| sum, or for
    L2 sign(v) sqrt(v^2 / sum v^2); a row whose divisor is 0 passes through."""
    n, c = v.shape
    for r in range(n):
        d = v.dtype.type(0) if c == 0 else v[r, 0]
        if norm == NORM_MAX:
            for j in range(1, c):
                x = v[r, j]
                if d != d or x > d:  # np.fmax: NaN only loses to a number
                    d = x
        else:
            d = v.dtype.type(0)
            for j in range(c):
                x = v[r, j]
                d += abs(x) if norm == NORM_L1 else x * x
        if d == 0:
            for j in range(c):
                out[r, j] = v[r, j]
        elif norm == NORM_L2:
            for j in range(c):
                x = v[r, j]
                q = math.sqrt(x * x / d)
                out[r, j] = -q if x < 0 else q
        else:
            for j in range(c):
                out[r, j] = v[r, j] / d
