"""CPU kernels: ai.onnx.ml tree ensembles (TreeEnsembleClassifier/Regressor 1-4, TreeEnsemble 5).

Every encoding is compiled once per node into one `_Forest`: interior nodes in flat arrays
(feature, threshold, normalised comparison, true/false/NaN successors) plus one self-looping
pseudo node per leaf, and a dense [leaves, targets] weight table. Prediction walks all
(sample, tree) pairs level by level with numpy index arrays, then aggregates leaf weights.
Scores, labels and post-transforms follow onnxruntime's tree aggregators.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._tensor_util import attr_str, attr_tensor
from onnxkiln.providers.cpu.ml_common import (
    ML,
    as_features,
    class_labels,
    float_attr,
    logistic,
    post_transform,
    probit,
    string_list,
    transform_rows,
)
from onnxkiln.providers.cpu.registry import kernel

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)

# normalised comparisons: GT/GTE/NEQ become LEQ/LT/EQ with swapped successors
_LEQ, _LT, _EQ, _MEMBER = 0, 1, 4, 6
_MODE_NAMES = {
    "BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3,
    "BRANCH_EQ": 4, "BRANCH_NEQ": 5, "BRANCH_MEMBER": 6, "LEAF": 7,
}
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
_CHUNK = 1 << 22  # elements of the [samples, trees, targets] gather done at once


class _Forest:
    """A compiled tree ensemble: traversal arrays and the leaf weight table."""

    def __init__(
        self,
        op: str,
        feature: np.ndarray,
        threshold: np.ndarray,
        mode: np.ndarray,
        true_next: np.ndarray,
        false_next: np.ndarray,
        missing_true: np.ndarray,
        roots: np.ndarray,
        leaf_values: np.ndarray,
        leaf_has: np.ndarray,
        members: list[np.ndarray] | None = None,
    ) -> None:
        """Successors and roots are encoded as node index >= 0 or ~leaf index < 0."""
        self.op = op
        m = feature.shape[0]
        n_leaves = leaf_values.shape[0]
        self.n_internal = m
        self.n_trees = roots.shape[0]
        self.leaf_values = leaf_values
        self.leaf_has = leaf_has
        self.all_has = bool(leaf_has.all())
        self._tables: dict[np.dtype, np.ndarray] = {}

        def enc(succ: np.ndarray) -> np.ndarray:
            succ = np.asarray(succ, dtype=np.int64)
            return np.where(succ < 0, m + ~succ, succ)

        mode = np.asarray(mode, dtype=np.int64)
        if mode.size and ((mode < 0) | (mode > 6)).any():
            raise ValueError(f"{op}: node modes must be BRANCH_* (0..6), got "
                             f"{sorted(set(mode.tolist()))}")
        t, f = enc(true_next), enc(false_next)
        nan_next = np.where(missing_true.astype(bool) | (mode == 5), t, f)
        swap = (mode == 2) | (mode == 3) | (mode == 5)
        t, f = np.where(swap, f, t), np.where(swap, t, f)
        mode = np.select([mode == 2, mode == 3, mode == 5], [_LT, _LEQ, _EQ], mode)
        self.nan_special = bool((nan_next != f).any())
        leaf_ids = np.arange(m, m + n_leaves, dtype=np.int64)
        fill = int(mode[0]) if mode.size else _LEQ
        self.feature = np.concatenate([np.asarray(feature, np.int64), np.zeros(n_leaves, np.int64)])
        self.threshold = np.concatenate([threshold, np.zeros(n_leaves, threshold.dtype)])
        self.mode = np.concatenate([mode, np.full(n_leaves, fill, np.int64)])
        self.true_next = np.concatenate([t, leaf_ids])
        self.false_next = np.concatenate([f, leaf_ids])
        self.nan_next = np.concatenate([nan_next, leaf_ids])
        self.roots = enc(roots)
        self.modes_present = sorted(set(self.mode.tolist()))
        if self.feature.size and self.feature.min() < 0:
            raise ValueError(f"{op}: negative feature id {int(self.feature.min())}")
        self.n_features = int(self.feature[:m].max()) + 1 if m else 0
        for succ in (self.true_next, self.false_next):
            if succ.size and (succ.min() < 0 or succ.max() >= m + n_leaves):
                raise ValueError(f"{op}: a node's successor is out of range")
        self.member_keys = None
        if members is not None:
            # (node, value) pairs as complex numbers: searchsorted orders them lexicographically
            nodes = np.flatnonzero(self.mode == _MEMBER)
            nodes = nodes[nodes < m]
            if len(members) < nodes.size:
                raise ValueError(
                    f"{op}: {nodes.size} BRANCH_MEMBER nodes but {len(members)} member sets"
                )
            keys = [n + 1j * np.unique(v.astype(_F64)) for n, v in zip(nodes, members)]
            self.member_keys = np.sort(np.concatenate(keys)) if keys else np.zeros(0, complex)

    # traversal

    def _compare(self, xv: np.ndarray, node: np.ndarray) -> np.ndarray:
        if len(self.modes_present) == 1:
            return self._cmp(self.modes_present[0], xv, node)
        mode = self.mode[node]
        cond = np.empty(node.shape[0], dtype=bool)
        for code in self.modes_present:
            sel = np.flatnonzero(mode == code)
            if sel.size:
                cond[sel] = self._cmp(code, xv[sel], node[sel])
        return cond

    def _cmp(self, code: int, xv: np.ndarray, node: np.ndarray) -> np.ndarray:
        if code == _MEMBER:
            keys = self.member_keys
            if keys is None or keys.size == 0:
                return np.zeros(node.shape[0], dtype=bool)
            q = node + 1j * xv.astype(_F64)
            pos = np.minimum(np.searchsorted(keys, q), keys.size - 1)
            return keys[pos] == q
        th = self.threshold[node]
        if code == _LEQ:
            return xv <= th
        if code == _LT:
            return xv < th
        return xv == th

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """Leaf index reached in every tree: [N, T] int64. X is [N, F] in compare dtype."""
        n, n_feat = x.shape
        trees = self.n_trees
        if n_feat < self.n_features:
            raise ValueError(
                f"{self.op}: X has {n_feat} features but the trees read feature "
                f"{self.n_features - 1}"
            )
        m = self.n_internal
        out = np.empty(n * trees, dtype=np.int64)
        if n * trees == 0:
            return out.reshape(n, trees)
        xf = np.ascontiguousarray(x).reshape(-1)
        node = np.tile(self.roots, n)
        pos = np.arange(n * trees)
        base = np.repeat(np.arange(n, dtype=np.int64) * n_feat, trees)
        check_nan = self.nan_special and x.dtype.kind == "f"
        for _ in range(m + 2):  # a path longer than the node count has a cycle
            done = node >= m
            n_done = int(np.count_nonzero(done))
            if n_done == node.size:
                out[pos] = node - m
                break
            if n_done * 4 > node.size:
                out[pos[done]] = node[done] - m
                keep = ~done
                node, pos, base = node[keep], pos[keep], base[keep]
            xv = xf[base + self.feature[node]]
            cond = self._compare(xv, node)
            nxt = np.where(cond, self.true_next[node], self.false_next[node])
            if check_nan:
                nan = np.isnan(xv)
                if nan.any():
                    nxt[nan] = self.nan_next[node[nan]]
            node = nxt
        else:
            raise ValueError(f"{self.op}: the trees contain a cycle (a node reaches itself)")
        return out.reshape(n, trees)

    # aggregation

    def scores(self, x: np.ndarray, aggregate: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Aggregated leaf weights [N, K] in X's dtype (summed tree by tree, as onnxruntime
        does) and, unless every leaf scores every target, which targets got a weight
        [N, K] bool (None means all)."""
        leaves = self.leaves(x)
        n, trees = leaves.shape
        dt = x.dtype
        table = self._tables.get(dt)
        if table is None:
            table = self._tables[dt] = self.leaf_values.astype(dt)
        k = table.shape[1]
        out = np.zeros((n, k), dtype=dt)
        has = None if self.all_has and trees else np.zeros((n, k), dtype=bool)
        if not trees:
            return out, has
        step = max(1, _CHUNK // max(1, trees * k))
        for s in range(0, n, step):
            lv = leaves[s : s + step]
            vals = table[lv]  # [n, T, K]
            hv = self.leaf_has[lv] if has is not None else None
            if hv is not None:
                has[s : s + step] = hv.any(axis=1)
            if aggregate in ("SUM", "AVERAGE"):
                out[s : s + step] = np.cumsum(vals, axis=1)[:, -1]
            elif hv is None:
                out[s : s + step] = vals.min(axis=1) if aggregate == "MIN" else vals.max(axis=1)
            else:
                if aggregate == "MIN":
                    red = np.where(hv, vals, np.inf).min(axis=1)
                else:
                    red = np.where(hv, vals, -np.inf).max(axis=1)
                out[s : s + step] = np.where(hv.any(axis=1), red, 0.0)
        if aggregate == "AVERAGE":
            out /= dt.type(trees)
        return out, has


def _leaf_table(
    n_leaves: int, k: int, leaf: np.ndarray, target: np.ndarray, weight: np.ndarray,
    aggregate: str, op: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Dense [leaves, K] weights (several weights of one leaf and target combine by the
    aggregate) and the matching has-a-weight mask."""
    if target.size and (target.min() < 0 or target.max() >= k):
        raise ValueError(f"{op}: target/class id {int(target.max())} is out of range [0, {k})")
    values = np.zeros((n_leaves, k), dtype=_F64)
    has = np.zeros((n_leaves, k), dtype=bool)
    w = weight.astype(_F64)
    if k == 1:
        # onnxruntime's single-target trees keep each leaf's first weight (0 without one)
        rev = np.arange(leaf.size)[::-1]
        values[leaf[rev], 0] = w[rev]
        has[:] = True
        return values, has
    if aggregate in ("SUM", "AVERAGE"):
        np.add.at(values, (leaf, target), w)
    else:
        init = np.inf if aggregate == "MIN" else -np.inf
        values.fill(init)
        (np.minimum if aggregate == "MIN" else np.maximum).at(values, (leaf, target), w)
    has[leaf, target] = True
    values[~has] = 0.0
    return values, has


# Legacy encoding (TreeEnsembleClassifier / TreeEnsembleRegressor 1-4)


def _positions(tree: np.ndarray, node: np.ndarray, qt: np.ndarray, qn: np.ndarray, op: str,
               what: str) -> np.ndarray:
    """Index into the nodes_* arrays of each (tree id, node id) query."""
    keys = np.stack([tree, node], axis=1)
    order = np.lexsort((node, tree))
    sk = keys[order]
    if sk.shape[0] > 1 and (sk[1:] == sk[:-1]).all(axis=1).any():
        raise ValueError(f"{op}: a (tree id, node id) pair appears twice in nodes_*")
    flat = sk[:, 0].astype(np.complex128) + 1j * sk[:, 1]
    q = qt.astype(np.complex128) + 1j * qn
    pos = np.searchsorted(flat, q) if flat.size else np.zeros(q.shape, np.int64)
    pos = np.minimum(pos, max(flat.size - 1, 0))
    if q.size and (flat.size == 0 or (flat[pos] != q).any()):
        bad = np.flatnonzero(flat[pos] != q)[0] if flat.size else 0
        raise ValueError(
            f"{op}: {what} refers to node (tree {int(qt[bad])}, id {int(qn[bad])}) "
            f"which is not in nodes_*"
        )
    return order[pos]


def _legacy_forest(a: Mapping[str, Any], op: str, prefix: str, k: int, aggregate: str,
                   dtype: np.dtype) -> tuple[_Forest, np.ndarray]:
    """Compile nodes_* and <prefix>_* attributes; also returns the weights (for sign tests)."""
    def ints(name: str) -> np.ndarray:
        v = a.get(name)
        return np.zeros(0, _I64) if v is None else np.asarray(v, dtype=_I64).reshape(-1)

    tree, nid = ints("nodes_treeids"), ints("nodes_nodeids")
    n = tree.size
    modes_s = string_list(a.get("nodes_modes")) or []
    feats, tids, fids = ints("nodes_featureids"), ints("nodes_truenodeids"),\
        ints("nodes_falsenodeids")
    values = float_attr(a, "nodes_values", dtype)
    if values is None:
        values = np.zeros(n, dtype)
    missing = ints("nodes_missing_value_tracks_true")
    if missing.size == 0:
        missing = np.zeros(n, _I64)
    for name, arr in (("nodes_nodeids", nid), ("nodes_modes", modes_s),
                      ("nodes_featureids", feats), ("nodes_values", values),
                      ("nodes_truenodeids", tids), ("nodes_falsenodeids", fids),
                      ("nodes_missing_value_tracks_true", missing)):
        if len(arr) != n:
            raise ValueError(f"{op}: {name} has {len(arr)} entries, nodes_treeids has {n}")
    try:
        modes = np.asarray([_MODE_NAMES[m] for m in modes_s], dtype=_I64)
    except KeyError as e:
        raise ValueError(f"{op}: unknown node mode {e.args[0]!r}") from None
    is_leaf = modes == 7
    leaf_rank = np.cumsum(is_leaf) - 1
    int_rank = np.cumsum(~is_leaf) - 1
    code = np.where(is_leaf, ~leaf_rank, int_rank)  # position -> encoded successor
    internal = np.flatnonzero(~is_leaf)
    t_pos = _positions(tree, nid, tree[internal], tids[internal], op, "nodes_truenodeids")
    f_pos = _positions(tree, nid, tree[internal], fids[internal], op, "nodes_falsenodeids")
    _, first = np.unique(tree, return_index=True)
    roots = code[np.sort(first)]

    tt, tn = ints(f"{prefix}_treeids"), ints(f"{prefix}_nodeids")
    tid = ints(f"{prefix}_ids")
    tw = float_attr(a, f"{prefix}_weights", dtype)
    tw = np.zeros(0, dtype) if tw is None else tw
    if not (tt.size == tn.size == tid.size == tw.size):
        raise ValueError(f"{op}: {prefix}_treeids/nodeids/ids/weights differ in length")
    wpos = _positions(tree, nid, tt, tn, op, f"{prefix}_nodeids")
    if tt.size and not is_leaf[wpos].all():
        bad = int(np.flatnonzero(~is_leaf[wpos])[0])
        raise ValueError(f"{op}: weight {bad} is attached to a node that is not a LEAF")
    leaf_values, leaf_has = _leaf_table(
        int(is_leaf.sum()), k, leaf_rank[wpos], tid, tw, aggregate, op
    )
    forest = _Forest(
        op, feats[internal], values[internal].astype(dtype), modes[internal], code[t_pos],
        code[f_pos], missing[internal], roots, leaf_values, leaf_has,
    )
    return forest, tw


def _compare_input(x: np.ndarray, op: str) -> np.ndarray:
    """X as [N, F] in the threshold dtype: float64 for double input, float32 otherwise."""
    if x.dtype.kind not in "fiu":
        raise ValueError(f"{op}: X must be numeric, got {x.dtype}")
    return as_features(x, op).astype(_F64 if x.dtype == _F64 else _F32, copy=False)


def _regression_finish(scores: np.ndarray, post: str, out_dtype: np.dtype) -> np.ndarray:
    """onnxruntime's regressor finish: a single target only takes PROBIT."""
    if post == "NONE" or (scores.shape[1] == 1 and post != "PROBIT"):
        return scores.astype(out_dtype)
    return transform_rows(scores, post).astype(out_dtype)


def _aggregate(value: Any, op: str) -> str:
    name = attr_str(value) if value is not None else "SUM"
    if isinstance(name, (int, np.integer)):
        if not 0 <= int(name) < 4:
            raise ValueError(f"{op}: aggregate_function {name} is not in 0..3")
        return _AGGREGATES[int(name)]
    if name not in _AGGREGATES:
        raise ValueError(f"{op}: aggregate_function {name!r} is not one of {_AGGREGATES}")
    return name


@kernel("TreeEnsembleRegressor", since=1, until=4, domain=ML, factory=True)
def tree_ensemble_regressor(info: NodeInfo):
    """Tree ensemble regression [N, n_targets] float32 (SUM/AVERAGE/MIN/MAX, base_values)."""
    op = "TreeEnsembleRegressor"
    a = info.attrs
    k = int(a.get("n_targets") or 0)
    if k < 1:
        raise ValueError(f"{op}: n_targets must be set and >= 1")
    aggregate = _aggregate(a.get("aggregate_function"), op)
    post = post_transform(a.get("post_transform"), op)
    base = float_attr(a, "base_values", _F64)
    if base is not None and base.size not in (0, k):
        raise ValueError(f"{op}: base_values has {base.size} values; expected 0 or {k}")
    use_base = base is not None and base.size == k
    forests: dict[np.dtype, _Forest] = {}

    def forest(dt: np.dtype) -> _Forest:
        if dt not in forests:
            forests[dt] = _legacy_forest(a, op, "target", k, aggregate, dt)[0]
        return forests[dt]

    forest(_F32)

    def run(x):
        v = _compare_input(x, op)
        scores, has = forest(v.dtype).scores(v, aggregate)
        if use_base:
            # targets no leaf scored stay 0, without their base value
            b = base.astype(scores.dtype)
            scores += b if has is None else np.where(has, b, scores.dtype.type(0))
        return _regression_finish(scores, post, _F32)

    return run


@kernel("TreeEnsembleClassifier", since=1, until=4, domain=ML, factory=True, multi_output=True)
def tree_ensemble_classifier(info: NodeInfo):
    """Tree ensemble classification: labels [N] (int64 or str) and scores [N, classes]."""
    op = "TreeEnsembleClassifier"
    a = info.attrs
    labels, strings = class_labels(a, op)
    if labels is None:
        raise ValueError(f"{op}: one of classlabels_strings and classlabels_int64s must be set")
    k = labels.size
    post = post_transform(a.get("post_transform"), op)
    base = float_attr(a, "base_values", _F64)
    base = np.zeros(0) if base is None else base
    if base.size not in (0, k) and not (k == 2 and base.size == 1):
        raise ValueError(f"{op}: base_values has {base.size} values; expected 0 or {k}")
    binary_case = k == 2 and len(set(a.get("class_ids") or [])) == 1
    forests: dict[np.dtype, _Forest] = {}
    weights: list[np.ndarray] = []

    def forest(dt: np.dtype) -> _Forest:
        if dt not in forests:
            forests[dt], w = _legacy_forest(a, op, "class", k, "SUM", dt)
            weights.append(w)
        return forests[dt]

    forest(_F32)
    all_positive = bool((weights[0] >= 0).all())
    if k == 2:
        # onnxruntime: with weights for both classes the label is 1/0 ("labels[1]/[0]" for
        # string labels), not an argmax
        neg_label, pos_label = (labels[0], labels[1]) if binary_case or strings else (0, 1)

    def run(x):
        v = _compare_input(x, op)
        scores, has = forest(v.dtype).scores(v, "SUM")
        if has is None:
            has = np.ones(scores.shape, dtype=bool)
        if k == 2:
            return binary(scores, has)
        if base.size:
            scores += base.astype(scores.dtype)
            has[:] = True
        n = scores.shape[0]
        best = np.where(has, scores, -np.inf).argmax(axis=1) if k else np.zeros(n, np.int64)
        y = labels[best] if k else np.zeros(n, object if strings else _I64)
        if post == "NONE":
            return y, scores.astype(_F32)
        return y, transform_rows(scores.astype(_F32), post)

    def binary(scores: np.ndarray, has: np.ndarray):
        s0, s1 = scores[:, 0], scores[:, 1]
        h0, h1 = has[:, 0], has[:, 1]
        if base.size == 2:
            # onnxruntime: once class 1 scored, its score becomes base[1] + score[0] and
            # class 0's its negation; otherwise both just take their base value
            s1_new = base[1] + s0
            s0 = np.where(h1, -s1_new, s0 + base[0])
            s1 = np.where(h1, s1_new, s1 + base[1])
            single = np.zeros(s0.shape, dtype=bool)
        else:
            # one base value (skl2onnx's binary gradient boosting): class 0's margin
            s0 = s0 + base[0] if base.size else s0
            single = ~h1
        s0 = np.where(h0, s0, 0.0).astype(_F32)
        s1 = np.where(h1, s1, 0.0).astype(_F32)
        pos_weight = np.where(h1, s1, s0)
        positive = pos_weight > (0.5 if binary_case and all_positive else 0.0)
        y = np.where(positive, pos_label, neg_label)
        y = y.astype(object) if strings else y.astype(_I64)
        z = np.empty((s0.shape[0], 2), dtype=_F32)
        z[:, 0], z[:, 1] = s0, s1
        if post != "NONE":
            z = transform_rows(z, post)
        rows = np.flatnonzero(single)
        if rows.size:
            z[rows] = _one_score(s0[rows], post, binary_case and all_positive)
        return y, z

    return run


def _one_score(s: np.ndarray, post: str, all_positive: bool) -> np.ndarray:
    """onnxruntime's two columns from a binary classifier's single class-0 score."""
    out = np.empty((s.shape[0], 2), dtype=_F32)
    if post == "PROBIT":
        out[:, 0], out[:, 1] = probit(s), 0.0
    elif all_positive:
        p = logistic(s) if post == "LOGISTIC" else s
        out[:, 0], out[:, 1] = np.float32(1.0) - p, p
    elif post == "LOGISTIC":
        out[:, 0], out[:, 1] = logistic(-s), logistic(s)
    else:
        out[:, 0], out[:, 1] = -s, s
    return out


# TreeEnsemble 5


@kernel("TreeEnsemble", since=5, domain=ML, factory=True)
def tree_ensemble(info: NodeInfo):
    """TreeEnsemble (opset 5): leaf_* weights, BRANCH_* and MEMBER modes, output in X's type."""
    op = "TreeEnsemble"
    a = info.attrs

    def ints(name: str, required: bool = True) -> np.ndarray:
        v = a.get(name)
        if v is None:
            if required:
                raise ValueError(f"{op}: attribute {name} is required")
            return np.zeros(0, _I64)
        return np.asarray(v, dtype=_I64).reshape(-1)

    feats = ints("nodes_featureids")
    n = feats.size
    splits = attr_tensor(a["nodes_splits"]).reshape(-1) if a.get("nodes_splits") is not None \
        else None
    if splits is None:
        raise ValueError(f"{op}: attribute nodes_splits is required")
    modes = attr_tensor(a["nodes_modes"]).reshape(-1).astype(_I64) \
        if a.get("nodes_modes") is not None else None
    if modes is None:
        raise ValueError(f"{op}: attribute nodes_modes is required")
    tids, tleaf = ints("nodes_truenodeids"), ints("nodes_trueleafs")
    fids, fleaf = ints("nodes_falsenodeids"), ints("nodes_falseleafs")
    missing = ints("nodes_missing_value_tracks_true", required=False)
    if missing.size == 0:
        missing = np.zeros(n, _I64)
    for name, arr in (("nodes_splits", splits), ("nodes_modes", modes),
                      ("nodes_truenodeids", tids), ("nodes_trueleafs", tleaf),
                      ("nodes_falsenodeids", fids), ("nodes_falseleafs", fleaf),
                      ("nodes_missing_value_tracks_true", missing)):
        if arr.size != n:
            raise ValueError(f"{op}: {name} has {arr.size} entries, nodes_featureids has {n}")
    if modes.size and ((modes < 0) | (modes > 6)).any():
        raise ValueError(f"{op}: nodes_modes values must be in 0..6")
    roots = ints("tree_roots")
    targets = ints("leaf_targetids")
    leaf_w = attr_tensor(a["leaf_weights"]).reshape(-1) if a.get("leaf_weights") is not None \
        else None
    if leaf_w is None or leaf_w.size != targets.size:
        raise ValueError(f"{op}: leaf_weights and leaf_targetids must be set with equal lengths")
    k = int(a.get("n_targets") or 0)
    if k < 1:
        raise ValueError(f"{op}: n_targets must be set and >= 1")
    aggregate = _aggregate(int(a.get("aggregate_function", 1)), op)
    post = post_transform(int(a.get("post_transform", 0)), op)
    members = None
    if (modes == _MEMBER).any():
        mv = a.get("membership_values")
        if mv is None:
            raise ValueError(f"{op}: BRANCH_MEMBER nodes need membership_values")
        mv = attr_tensor(mv).reshape(-1).astype(_F64)
        cuts = np.flatnonzero(np.isnan(mv))
        members = [s[~np.isnan(s)] for s in np.split(mv, cuts)]
    n_leaves = targets.size
    for name, ids, leaf in (("true", tids, tleaf), ("false", fids, fleaf)):
        limit = np.where(leaf != 0, n_leaves, n)
        if ids.size and ((ids < 0) | (ids >= limit)).any():
            raise ValueError(f"{op}: a nodes_{name}nodeids entry is out of range")
    if roots.size and ((roots < 0) | (roots >= n)).any():
        raise ValueError(f"{op}: tree_roots must index nodes_* entries [0, {n})")
    leaf_values, leaf_has = _leaf_table(
        n_leaves, k, np.arange(n_leaves), targets, leaf_w, aggregate, op
    )
    true_next = np.where(tleaf != 0, ~tids, tids)
    false_next = np.where(fleaf != 0, ~fids, fids)
    forests: dict[np.dtype, _Forest] = {}

    def forest(dt: np.dtype) -> _Forest:
        if dt not in forests:
            forests[dt] = _Forest(op, feats, splits.astype(dt), modes, true_next, false_next,
                                  missing, roots, leaf_values, leaf_has, members)
        return forests[dt]

    def run(x):
        if x.dtype.kind != "f":
            raise ValueError(f"{op}: X must be float16, float32 or float64, got {x.dtype}")
        v = as_features(x, op)
        dt = _F64 if x.dtype == _F64 else _F32
        v = v.astype(dt, copy=False)
        scores, _ = forest(dt).scores(v, aggregate)
        return _regression_finish(scores, post, x.dtype)

    return run
