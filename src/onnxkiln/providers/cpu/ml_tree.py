"""CPU kernels: ai.onnx.ml tree ensembles (TreeEnsembleClassifier/Regressor 1-4, TreeEnsemble 5).

Every encoding is compiled once per node (and compare dtype) into one `ml_forest.Forest`,
which walks the trees in numba when it is on and in numpy otherwise. Scores, labels and
post-transforms follow onnxruntime's tree aggregators.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from onnxkiln.ops.attrs import attr_str, attr_tensor
from onnxkiln.providers.base import NodeInfo, report_variant
from onnxkiln.providers.cpu.ml_common import (
    ML,
    Finish,
    as_features,
    class_labels,
    float_attr,
    post_transform,
    string_list,
)
from onnxkiln.providers.cpu.ml_forest import MODE_NAMES, Forest, leaf_table
from onnxkiln.providers.cpu.ml_tree_rules import Binary
from onnxkiln.providers.cpu.registry import kernel

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
_MEMBER = MODE_NAMES["BRANCH_MEMBER"]
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")

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
                   dtype: np.dtype, base: np.ndarray | None = None,
                   base_all: bool = False) -> tuple[Forest, np.ndarray]:
    """Compile nodes_* and <prefix>_* attributes (base values as `Forest` takes them); also
    returns the weights (for sign tests)."""
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
        modes = np.asarray([MODE_NAMES[m] for m in modes_s], dtype=_I64)
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
    leaf_values, leaf_has = leaf_table(
        int(is_leaf.sum()), k, leaf_rank[wpos], tid, tw, aggregate, op
    )
    forest = Forest(
        op, feats[internal], values[internal].astype(dtype), modes[internal], code[t_pos],
        code[f_pos], missing[internal], roots, leaf_values, leaf_has, aggregate,
        base=base, base_all=base_all,
    )
    return forest, tw


def _compare_input(x: np.ndarray, op: str) -> np.ndarray:
    """X as [N, F] in the threshold dtype: float64 for double input, float32 otherwise."""
    if x.dtype.kind not in "fiu":
        raise ValueError(f"{op}: X must be numeric, got {x.dtype}")
    return as_features(x, op).astype(_F64 if x.dtype == _F64 else _F32, copy=False)


def _scores(forest: Forest, v: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """forest.scores(v), reporting the path taken (numba or numpy) for traces."""
    out = forest.scores(v)
    report_variant(forest.variant, forest.fast_reason)
    return out


def _specializer(forest_for: Callable[[np.dtype], Forest],
                 finish_for: Callable[[np.dtype, Forest], Finish], kinds: str = "fiu"):
    """specialize() of a tree kernel: for one input dtype and shape, the numba walk and
    finishing with their state bound, X only reshaped to [N, F] and converted (the checks
    the generic run makes hold for the whole signature). None: keep the generic run."""

    def specialize(dtypes, shapes, consts):
        dt, shape = dtypes[0], shapes[0]
        if shape is None or dt.kind not in kinds:
            return None
        cdt = _F64 if dt == _F64 else _F32
        forest = forest_for(cdt)
        n = shape[0] if len(shape) >= 2 else 1
        rows = (n, math.prod(shape[1:]) if len(shape) >= 2 else math.prod(shape))
        if rows[1] < forest.n_features:
            return None
        scores = forest.bound()
        finish = finish_for(dt, forest).bound(cdt)
        if scores is None or finish is None:
            return None
        flat = len(shape) != 2

        def run(x):
            v = x.reshape(rows) if flat else x
            return finish(*scores(v if v.dtype == cdt else v.astype(cdt)))

        run.variant, run.variant_reason = forest.variant, None
        return run

    return specialize


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
    forests: dict[np.dtype, Forest] = {}
    finish = Finish(post, k)

    def forest(dt: np.dtype) -> Forest:
        if dt not in forests:
            forests[dt] = _legacy_forest(a, op, "target", k, aggregate, dt, base)[0]
            finish.prepare(forests[dt].dtype, forests[dt].fast is not None)
        return forests[dt]

    forest(_F32)

    def run(x):
        v = _compare_input(x, op)
        return finish(*_scores(forest(v.dtype), v))

    run.specialize = _specializer(forest, lambda dt, f: finish)
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
    forests: dict[np.dtype, Forest] = {}
    # a multi-class model adds its base values to every class (then all count as scored);
    # a binary one follows its own rules (Binary)
    multi_base = base if k != 2 else None
    finishes: list[Finish] = []

    def forest(dt: np.dtype) -> Forest:
        if dt not in forests:
            forests[dt], w = _legacy_forest(a, op, "class", k, "SUM", dt, multi_base,
                                            base_all=True)
            if not finishes:
                binary = Binary(a, labels, strings, base, bool((w >= 0).all()), post,
                                forests[dt]) if k == 2 else None
                finishes.append(Finish(post, k, labels, binary))
            finishes[0].prepare(forests[dt].dtype, forests[dt].fast is not None)
        return forests[dt]

    forest(_F32)
    finish = finishes[0]

    def run(x):
        v = _compare_input(x, op)
        return finish(*_scores(forest(v.dtype), v))

    run.specialize = _specializer(forest, lambda dt, f: finish)
    return run


# TreeEnsemble 5


@kernel("TreeEnsemble", since=5, domain=ML, factory=True)
def tree_ensemble(info: NodeInfo):
    """TreeEnsemble (opset 5): leaf_* weights, BRANCH_* and MEMBER modes, output in X's type."""
    op = "TreeEnsemble"
    make_forest, k, post = _v5_forest(info.attrs, op)
    forests: dict[np.dtype, Forest] = {}
    finishes: dict[np.dtype, Finish] = {}

    def forest(dt: np.dtype) -> Forest:
        if dt not in forests:
            forests[dt] = make_forest(dt)
        return forests[dt]

    def finish_for(x_dtype: np.dtype, f: Forest) -> Finish:
        finish = finishes.get(x_dtype)
        if finish is None:  # the output is in X's type
            finish = finishes[x_dtype] = Finish(post, k, out_dtype=x_dtype)
        finish.prepare(f.dtype, f.fast is not None)
        return finish

    def run(x):
        if x.dtype.kind != "f":
            raise ValueError(f"{op}: X must be float16, float32 or float64, got {x.dtype}")
        v = as_features(x, op)
        dt = _F64 if x.dtype == _F64 else _F32
        v = v.astype(dt, copy=False)
        f = forest(dt)
        finish = finish_for(x.dtype, f)
        scores, _ = _scores(f, v)
        return finish(scores, None)

    run.specialize = _specializer(forest, finish_for, kinds="f")
    return run


def _v5_forest(a: Mapping[str, Any], op: str) -> tuple[Callable[[np.dtype], Forest], int, str]:
    """Check and compile the opset-5 attributes: (the Forest for a compare dtype, the
    target count, the post-transform)."""

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
    members = _v5_members(a, modes, op)
    n_leaves = targets.size
    _v5_check_links(n, n_leaves, (tids, tleaf), (fids, fleaf), roots, op)
    leaf_values, leaf_has = leaf_table(
        n_leaves, k, np.arange(n_leaves), targets, leaf_w, aggregate, op
    )
    true_next = np.where(tleaf != 0, ~tids, tids)
    false_next = np.where(fleaf != 0, ~fids, fids)

    def make(dt: np.dtype) -> Forest:
        return Forest(op, feats, splits.astype(dt), modes, true_next, false_next, missing, roots,
                      leaf_values, leaf_has, aggregate, members)

    return make, k, post


def _v5_members(a: Mapping[str, Any], modes: np.ndarray, op: str) -> list[np.ndarray] | None:
    """The BRANCH_MEMBER nodes' value sets (membership_values, NaN-separated), in order."""
    if not (modes == _MEMBER).any():
        return None
    mv = a.get("membership_values")
    if mv is None:
        raise ValueError(f"{op}: BRANCH_MEMBER nodes need membership_values")
    mv = attr_tensor(mv).reshape(-1).astype(_F64)
    cuts = np.flatnonzero(np.isnan(mv))
    return [s[~np.isnan(s)] for s in np.split(mv, cuts)]


def _v5_check_links(n: int, n_leaves: int, true: tuple, false: tuple, roots: np.ndarray,
                    op: str) -> None:
    """Successors index nodes (or leaves, where flagged) and roots index nodes."""
    for name, (ids, leaf) in (("true", true), ("false", false)):
        limit = np.where(leaf != 0, n_leaves, n)
        if ids.size and ((ids < 0) | (ids >= limit)).any():
            raise ValueError(f"{op}: a nodes_{name}nodeids entry is out of range")
    if roots.size and ((roots < 0) | (roots >= n)).any():
        raise ValueError(f"{op}: tree_roots must index nodes_* entries [0, {n})")
