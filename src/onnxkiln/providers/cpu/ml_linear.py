"""CPU kernels: ai.onnx.ml linear and SVM models (LinearClassifier, LinearRegressor,
SVMClassifier, SVMRegressor), with onnxruntime's label and score conventions."""

from __future__ import annotations

import numpy as np

from onnxkiln.ops.attrs import attr_str
from onnxkiln.providers.base import NodeInfo, report_variant
from onnxkiln.providers.cpu import _numba
from onnxkiln.providers.cpu.ml_common import (
    ML,
    Finish,
    as_features,
    class_labels,
    logistic,
    post_transform,
    probit,
    update_scores,
)
from onnxkiln.providers.cpu.registry import kernel

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _vote_signature(dt: np.dtype):
    from numba import types

    def ro(t, nd):
        return types.Array(t, nd, "C", readonly=True)

    return (ro(types.float32, 2), ro(types.int32, 2), ro(types.float32, 1),
            types.Array(types.float32, 2, "C"), types.Array(types.int64, 1, "C"))


_numba.register("svm_vote_proba", "onnxkiln.providers.cpu._numba_ml", _vote_signature, (_F32,))


def _features(x: np.ndarray, op: str, dtype: np.dtype = _F64) -> np.ndarray:
    """X as [N, F] in `dtype` for the dot products (scores are rounded to float32 after)."""
    if x.dtype.kind not in "fiu":
        raise ValueError(f"{op}: X must be numeric, got {x.dtype}")
    return as_features(x, op).astype(dtype, copy=False)


def _weights(values, n_feat: int, op: str, what: str = "coefficients",
             dtype: np.dtype = _F64) -> np.ndarray:
    """A flat attribute as [K, F] rows for F features."""
    w = np.asarray(values, dtype=_F32).astype(dtype)
    if n_feat == 0 or w.size % n_feat:
        raise ValueError(f"{op}: {w.size} {what} do not split into rows of {n_feat} features")
    return w.reshape(-1, n_feat)


def _binary_labels(
    positive: np.ndarray, labels: np.ndarray | None, strings: bool
) -> np.ndarray:
    """labels[1] where `positive` else labels[0] (or 1/0, "1"/"0" without two labels)."""
    if labels is not None and labels.size == 2:
        pos, neg = labels[1], labels[0]
    else:
        pos, neg = ("1", "0") if strings else (1, 0)
    out = np.empty(positive.shape[0], dtype=object if strings else np.int64)
    out[positive] = pos
    out[~positive] = neg
    return out


def _pick(labels: np.ndarray, index: np.ndarray, op: str) -> np.ndarray:
    if index.size and index.max() >= labels.size:
        raise ValueError(f"{op}: class index {int(index.max())} but only {labels.size} labels")
    return labels[index]


# Linear models


@kernel("LinearClassifier", since=1, domain=ML, factory=True, multi_output=True)
def linear_classifier(info: NodeInfo):
    """Scores X @ W^T + b (float32), labels by argmax; one score column is a binary model:
    score > 0 picks labels[1] and Z becomes [1 - p, p] (p the logistic under LOGISTIC).

    The row count is the intercepts' count. Without intercepts (optional in the spec, which
    onnxruntime nonetheless requires) a two-label model may have one row or two: the one
    whose width matches X's feature count is used."""
    op = "LinearClassifier"
    a = info.attrs
    coef = a.get("coefficients")
    if not coef:
        raise ValueError(f"{op}: coefficients must be set")
    intercepts = a.get("intercepts")
    labels, strings = class_labels(a, op, "classlabels_ints")
    post = post_transform(a.get("post_transform"), op)
    if labels is None:
        raise ValueError(f"{op}: one of classlabels_strings and classlabels_ints must be set")
    if intercepts:
        return _linear_classifier(coef, intercepts, labels, strings, post, len(intercepts))
    rows = [n for n in ((1, 2) if labels.size == 2 else (labels.size,)) if len(coef) % n == 0]
    if len(rows) < 2:
        return _linear_classifier(coef, None, labels, strings, post,
                                  rows[0] if rows else labels.size)
    by_width = {len(coef) // n: _linear_classifier(coef, None, labels, strings, post, n)
                for n in rows}

    def run(x):
        fn = by_width.get(x.shape[-1] if x.ndim else 0, by_width[len(coef) // 2])
        out = fn(x)
        for name in ("variant", "variant_reason"):  # what the trace reports
            if hasattr(fn, name):
                setattr(run, name, getattr(fn, name))
        return out

    return run


def _linear_classifier(coef, intercepts, labels, strings, post, n_classes):
    op = "LinearClassifier"
    if len(coef) % n_classes:
        raise ValueError(f"{op}: {len(coef)} coefficients for {n_classes} classes")
    if n_classes == 1 and labels.size != 2:
        raise ValueError(f"{op}: one coefficient row is a binary model and needs exactly 2 "
                         f"class labels, got {labels.size}")
    if n_classes > 1 and labels.size != n_classes:
        raise ValueError(f"{op}: {n_classes} coefficient rows but {labels.size} class labels")
    w = _weights(coef, len(coef) // n_classes, op, dtype=_F32).T.copy()
    b = np.asarray(intercepts or [0.0] * n_classes, dtype=_F32)
    finish = Finish(post, n_classes, labels)  # argmax and post-transform, numba when on
    finish.prepare(_F32)

    def run(x):
        v = _features(x, op, _F32)
        if v.shape[1] != w.shape[0]:
            raise ValueError(f"{op}: X has {v.shape[1]} features, the model expects {w.shape[0]}")
        scores = v @ w
        scores += b
        if n_classes > 1:
            out = finish(scores, None)
            report_variant(finish.variant(op), finish.reason)
            return out
        s = scores[:, 0]
        y = np.where(s > 0, labels[1], labels[0])
        return y.astype(object) if strings else y, _binary_pair(s, post)

    return run


def _binary_pair(s: np.ndarray, post: str) -> np.ndarray:
    """onnxruntime's two columns for a one-score linear/SVM binary model: [1 - p, p] with
    p = logistic(s) under LOGISTIC, else s. Under PROBIT onnxruntime probits the first N
    values of the buffer in place: row-major, the leading half holds probit(s)."""
    n = s.shape[0]
    p = logistic(s) if post == "LOGISTIC" else s
    z = np.empty((n, 2), dtype=_F32)
    z[:, 0] = np.float32(1.0) - p
    z[:, 1] = p
    if post == "PROBIT":
        z.reshape(-1)[:n] = probit(s)
    return z


@kernel("LinearRegressor", since=1, domain=ML, factory=True)
def linear_regressor(info: NodeInfo):
    """Y = X @ W^T + b for `targets` outputs, then the post-transform."""
    op = "LinearRegressor"
    a = info.attrs
    targets = int(a.get("targets", 1))
    coef = a.get("coefficients") or []
    if targets < 1 or len(coef) % targets:
        raise ValueError(f"{op}: {len(coef)} coefficients do not split into {targets} targets")
    w = _weights(coef, len(coef) // targets, op, dtype=_F32) if coef \
        else np.zeros((targets, 0), _F32)
    intercepts = a.get("intercepts")
    if intercepts and len(intercepts) != targets:
        raise ValueError(f"{op}: {len(intercepts)} intercepts for {targets} targets")
    b = np.asarray(intercepts or [0.0] * targets, dtype=_F32)
    w = w.T.copy()
    post = post_transform(a.get("post_transform"), op)
    finish = Finish(post, targets)  # the post-transform, in numba when it is on
    finish.prepare(_F32)

    def run(x):
        v = _features(x, op, _F32)
        if v.shape[1] != w.shape[0]:
            raise ValueError(f"{op}: X has {v.shape[1]} features, the model expects {w.shape[0]}")
        scores = v @ w
        scores += b
        out = finish(scores, None)
        report_variant(finish.variant(op), finish.reason)
        return out

    return run


# SVM


class _SvmKernel:
    """The kernel function K(X, V) of an SVM: LINEAR, POLY, RBF or SIGMOID, against the
    support vectors V [M, F] (their squared norms for RBF computed once, here)."""

    def __init__(self, info: NodeInfo, op: str, sv: np.ndarray) -> None:
        self.kind = attr_str(info.attrs.get("kernel_type", "LINEAR"))
        if self.kind not in ("LINEAR", "POLY", "RBF", "SIGMOID"):
            raise ValueError(f"{op}: kernel_type {self.kind!r} is not LINEAR/POLY/RBF/SIGMOID")
        params = list(info.attrs.get("kernel_params") or [])
        if params and len(params) < 3:
            raise ValueError(f"{op}: kernel_params needs 3 values (gamma, coef0, degree)")
        g, c, d = (np.float32(p) for p in (params[:3] if params else (0.0, 0.0, 0.0)))
        self.gamma, self.coef0, self.degree = float(g), float(c), float(d)
        self.sv_t = np.ascontiguousarray(sv.T)
        self.sv_norms = (sv * sv).sum(axis=1)[None, :]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """[N, F] -> [N, M] float64."""
        if self.kind == "RBF":
            d2 = (x * x).sum(axis=1)[:, None] + self.sv_norms - 2.0 * (x @ self.sv_t)
            np.maximum(d2, 0.0, out=d2)
            d2 *= -self.gamma
            return np.exp(d2, out=d2)
        k = x @ self.sv_t
        if self.kind == "LINEAR":
            return k
        k = self.gamma * k + self.coef0
        if self.kind == "SIGMOID":
            return np.tanh(k)
        with np.errstate(invalid="ignore", over="ignore"):
            return np.power(k, self.degree)


def _multiclass_probability(r: np.ndarray) -> np.ndarray:
    """libsvm's pairwise coupling: class probabilities [N, K] from pairwise r [N, K, K]."""
    n, k, _ = r.shape
    q = -(r.transpose(0, 2, 1) * r)  # q[i, j] = -r[j, i] * r[i, j]
    diag = np.einsum("nji,nji->ni", r, r) - np.einsum("nii,nii->ni", r, r)
    idx = np.arange(k)
    q[:, idx, idx] = diag
    q = q.astype(_F32)
    p = np.full((n, k), 1.0 / k, dtype=_F32)
    eps = np.float32(0.005) / np.float32(k)
    active = np.arange(n)
    for _ in range(100):
        if active.size == 0:
            break
        qa, pa = q[active], p[active]
        qp = np.einsum("nij,nj->ni", qa, pa).astype(_F32)
        pqp = (pa * qp).sum(axis=1).astype(_F32)
        err = np.abs(qp - pqp[:, None]).max(axis=1)
        keep = err >= eps
        active, qa, pa, qp, pqp = active[keep], qa[keep], pa[keep], qp[keep], pqp[keep]
        if active.size == 0:
            break
        for t in range(k):
            qtt = qa[:, t, t]
            diff = ((-qp[:, t] + pqp) / qtt).astype(_F32)
            pa[:, t] += diff
            one = np.float32(1.0) + diff
            pqp = ((pqp + diff * (diff * qtt + np.float32(2.0) * qp[:, t])) / one / one)
            qp = (qp + diff[:, None] * qa[:, t, :]) / one[:, None]
            pa /= one[:, None]
        p[active] = pa
    return p


class _OneVsOne:
    """An SVC's decision values for every class pair, the vote winner and (with prob_a and
    prob_b) libsvm's pairwise-coupled probabilities; the votes and the coupling run in
    numba when it is on (`_numba_ml.svm_vote_proba`, loaded on first use), else in numpy."""

    def __init__(self, info: NodeInfo, op: str, k: int, coef: np.ndarray, rho: np.ndarray,
                 prob_a: np.ndarray, prob_b: np.ndarray, per_class: np.ndarray) -> None:
        a = info.attrs
        n_vectors = int(per_class.sum())
        n_pairs = k * (k - 1) // 2
        flat = a.get("support_vectors") or []
        if not flat or len(flat) % n_vectors:
            raise ValueError(f"{op}: {len(flat)} support_vectors values for {n_vectors} vectors")
        sv = _weights(flat, len(flat) // n_vectors, op, "support_vectors")
        self.kern = _SvmKernel(info, op, sv)
        self.n_feat = sv.shape[1]
        if per_class.size != k:
            raise ValueError(
                f"{op}: vectors_per_class has {per_class.size} entries for {k} classes"
            )
        if coef.size != (k - 1) * n_vectors:
            raise ValueError(
                f"{op}: {coef.size} coefficients; expected (classes - 1) * vectors = "
                f"{(k - 1) * n_vectors}"
            )
        if rho.size < n_pairs:
            raise ValueError(f"{op}: rho has {rho.size} values for {n_pairs} class pairs")
        self.have_proba = prob_a.size > 0
        if self.have_proba and prob_a.size < n_pairs:
            raise ValueError(f"{op}: prob_a has {prob_a.size} values for {n_pairs} class pairs")
        c = coef.reshape(k - 1, n_vectors)
        start = np.concatenate([[0], np.cumsum(per_class)])
        # decision p = sum_{v in i} c[j-1, v] K[v] + sum_{v in j} c[i, v] K[v] + rho[p]
        self.pair_w = np.zeros((n_vectors, n_pairs))
        self.pairs = np.empty((n_pairs, 2), dtype=np.int64)
        p = 0
        for i in range(k):
            for j in range(i + 1, k):
                si, sj = slice(start[i], start[i + 1]), slice(start[j], start[j + 1])
                self.pair_w[si, p] = c[j - 1, si]
                self.pair_w[sj, p] = c[i, sj]
                self.pairs[p] = i, j
                p += 1
        self.pair_rho = rho[:n_pairs]
        self.k, self.prob_a, self.prob_b = k, prob_a[:n_pairs], prob_b[:n_pairs]
        ab = np.concatenate([self.prob_a, self.prob_b]) if self.have_proba else prob_a[:0]
        self._ab = np.ascontiguousarray(ab, dtype=_F32)
        self._pairs32 = self.pairs.astype(np.int32)
        self.fast = _numba.lazy("svm_vote_proba", _F32)
        self.reason = _numba.disabled_reason()

    def decisions(self, v: np.ndarray) -> np.ndarray:
        """[N, pairs] float32 decision values of float64 X [N, F]."""
        return (self.kern(v) @ self.pair_w + self.pair_rho).astype(_F32)

    def votes(self, dec: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(vote winner [N], class probabilities [N, K] or None without prob_a/prob_b)."""
        if self.fast is not None and self.fast.ready():
            n = dec.shape[0]
            best = np.empty(n, np.int64)
            probs = np.empty((n, self.k), _F32)  # its width is K, read or not
            self.fast.fn(dec, self._pairs32, self._ab, probs, best)
            return best, probs if self.have_proba else None
        if self.fast is not None:
            self.fast, self.reason = None, self.fast.reason
        n = dec.shape[0]
        winners = np.where(dec > 0, self.pairs[:, 0], self.pairs[:, 1])
        votes = np.zeros((n, self.k), dtype=np.int64)
        rows = np.arange(n)
        for p in range(self.pairs.shape[0]):
            votes[rows, winners[:, p]] += 1
        maxclass = votes.argmax(axis=1)
        if not self.have_proba:
            return maxclass, None
        val = np.float32(1.0) - logistic(dec * self.prob_a + self.prob_b)
        val = np.clip(val, np.float32(1e-7), np.float32(1 - 1e-7))
        r = np.zeros((n, self.k, self.k), dtype=_F32)
        i, j = self.pairs[:, 0], self.pairs[:, 1]
        r[:, i, j] = val
        r[:, j, i] = np.float32(1.0) - val
        return maxclass, _multiclass_probability(r)


@kernel("SVMClassifier", since=1, domain=ML, factory=True, multi_output=True)
def svm_classifier(info: NodeInfo):
    """One-vs-one SVC (support vectors) or linear SVM (coefficients only), with optional
    pairwise-coupled probabilities (prob_a/prob_b), labels and scores as onnxruntime gives."""
    op = "SVMClassifier"
    a = info.attrs
    labels, _ = class_labels(a, op, "classlabels_ints")
    if labels is None:
        raise ValueError(f"{op}: one of classlabels_strings and classlabels_ints must be set")
    k = labels.size
    post = post_transform(a.get("post_transform"), op)
    coef = np.asarray(a.get("coefficients") or [], dtype=_F32).astype(_F64)
    if coef.size == 0:
        raise ValueError(f"{op}: coefficients must be set")
    rho = np.asarray(a.get("rho") or [], dtype=_F32).astype(_F64)
    prob_a = np.asarray(a.get("prob_a") or [], dtype=_F32)
    prob_b = np.asarray(a.get("prob_b") or [], dtype=_F32)
    if prob_a.size != prob_b.size:
        raise ValueError(f"{op}: prob_a has {prob_a.size} values but prob_b {prob_b.size}")
    per_class = np.asarray(a.get("vectors_per_class") or [], dtype=np.int64)
    all_positive = bool((coef >= 0).all())
    binary = k * (k - 1) // 2 == 1
    svc = _OneVsOne(info, op, k, coef, rho, prob_a, prob_b, per_class) \
        if per_class.sum() > 0 else None
    if svc is None:
        if coef.size % k:
            raise ValueError(f"{op}: {coef.size} coefficients for {k} classes")
        w = coef.reshape(k, -1)
        b0 = float(rho[0]) if rho.size else 0.0
    n_feat = svc.n_feat if svc else w.shape[1]

    def label_from(maxclass: np.ndarray, max_weight: np.ndarray | None) -> np.ndarray:
        return _svm_labels(labels, maxclass, max_weight, binary, all_positive, op)

    def run(x):
        v = _features(x, op)
        if v.shape[1] != n_feat:
            raise ValueError(f"{op}: X has {v.shape[1]} features, the model expects {n_feat}")
        if svc is None:
            n = v.shape[0]
            scores = (v @ w.T + b0).astype(_F32)
            maxclass = scores.argmax(axis=1)
            y = label_from(maxclass, scores[np.arange(n), maxclass])
            return y, update_scores(scores, post) if post != "NONE" else scores
        dec = svc.decisions(v)
        maxclass, probs = svc.votes(dec)
        report_variant("svmclassifier.numba" if svc.fast else "svmclassifier.numpy",
                       svc.reason)
        y = label_from(maxclass, None)
        if probs is not None:
            return y, update_scores(probs, post) if post != "NONE" else probs
        if k <= 2:
            return y, _svc_binary_pair(dec[:, 0], post)
        return y, update_scores(dec, post) if post != "NONE" else dec

    return run


def _svm_labels(labels: np.ndarray, maxclass: np.ndarray, max_weight: np.ndarray | None,
                binary: bool, all_positive: bool, op: str) -> np.ndarray:
    """The label of the vote winner (SVC, max_weight None: onnxruntime passes it weight 0,
    which never flips a binary label) or, for linear SVMs, of the top score."""
    if not binary:
        return _pick(labels, maxclass, op)
    if max_weight is None:
        return labels[maxclass]
    # binary: onnxruntime's rules on the top score
    positive = max_weight >= 0.5 if all_positive else max_weight > 0
    out = labels[maxclass]
    out[positive] = labels[1]
    return out


def _svc_binary_pair(d: np.ndarray, post: str) -> np.ndarray:
    """onnxruntime's two columns for a binary SVC decision value d: [-d, d] (NONE),
    [1 - p, p] with p = logistic(d) (LOGISTIC) or d (SOFTMAX*), [probit(d), d] (PROBIT)."""
    z = np.empty((d.shape[0], 2), dtype=_F32)
    z[:, 1] = d
    if post == "NONE":
        z[:, 0] = -d
    elif post == "PROBIT":
        z[:, 0] = probit(d)
    else:
        p = logistic(d) if post == "LOGISTIC" else d
        z[:, 0] = np.float32(1.0) - p
        z[:, 1] = p
    return z


@kernel("SVMRegressor", since=1, domain=ML, factory=True)
def svm_regressor(info: NodeInfo):
    """Support-vector regression (or linear when n_supports is 0); one-class gives +1/-1."""
    op = "SVMRegressor"
    a = info.attrs
    n_sv = int(a.get("n_supports", 0))
    coef = np.asarray(a.get("coefficients") or [], dtype=_F32).astype(_F64)
    if coef.size == 0:
        raise ValueError(f"{op}: coefficients must be set")
    rho = np.asarray(a.get("rho") or [0.0], dtype=_F32).astype(_F64)
    one_class = bool(a.get("one_class", 0))
    post_transform(a.get("post_transform"), op)  # validated; onnxruntime ignores it
    if n_sv > 0:
        flat = a.get("support_vectors") or []
        if len(flat) % n_sv:
            raise ValueError(f"{op}: {len(flat)} support_vectors values for {n_sv} vectors")
        sv = _weights(flat, len(flat) // n_sv, op, "support_vectors")
        kern = _SvmKernel(info, op, sv)
        if coef.size != n_sv:
            raise ValueError(f"{op}: {coef.size} coefficients for {n_sv} support vectors")
        n_feat = sv.shape[1]
    else:
        n_feat = coef.size

    def run(x):
        v = _features(x, op)
        if v.shape[1] != n_feat:
            raise ValueError(f"{op}: X has {v.shape[1]} features, the model expects {n_feat}")
        if n_sv > 0:
            s = kern(v) @ coef + rho[0]
        else:
            s = v @ coef + rho[0]
        scores = s.astype(_F32).reshape(-1, 1)
        if one_class:
            return np.where(scores > 0, np.float32(1.0), np.float32(-1.0))
        return scores  # onnxruntime applies no post_transform to SVMRegressor

    return run
