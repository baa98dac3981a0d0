"""Tree ensembles with the attribute shapes converters write, against onnxruntime:
TreeEnsembleRegressor/Classifier (ai.onnx.ml 1-4) and TreeEnsemble (opset 5) on the same
small forest; aggregate functions, missing/one/per-target base_values, NaN routing, every
branch mode, binary classifiers with one weight per leaf, int and string labels."""

from __future__ import annotations

import numpy as np
import pytest
from ml_shapes_harness import F32, MlCase, check
from onnx import TensorProto, helper

from onnxkiln.providers.cpu import _numba

RNG = np.random.default_rng(21)
X = RNG.standard_normal((6, 3)).astype(F32)
X[0] = [0.1, -0.3, 0.5]  # exactly on every threshold: LEQ/LT and GTE/GT part ways
X[1, 1] = np.nan
INT64, STRING, FLOAT = TensorProto.INT64, TensorProto.STRING, TensorProto.FLOAT

# two trees: (feature, threshold, true child, false child) per interior node; leaves None
TREES = [
    {0: (0, 0.1, 1, 2), 1: (1, -0.3, 3, 4), 2: None, 3: None, 4: None},
    {0: (2, 0.5, 1, 2), 1: None, 2: None},
]


def forest(mode="BRANCH_LEQ", missing_true=None):
    """The legacy nodes_* attributes of TREES, one mode for every interior node."""
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values",
                         "nodes_modes", "nodes_truenodeids", "nodes_falsenodeids")}
    for t, nodes in enumerate(TREES):
        for nid, node in nodes.items():
            f, v, tr, fa = node if node else (0, 0.0, 0, 0)
            for k, val in zip(a, (t, nid, f, v, mode if node else "LEAF", tr, fa)):
                a[k].append(val)
    if missing_true is not None:
        a["nodes_missing_value_tracks_true"] = [missing_true] * len(a["nodes_modes"])
    return a


def leaves():
    return [(t, nid) for t, nodes in enumerate(TREES) for nid, n in nodes.items() if n is None]


def regressor_targets(n_targets=1, prefix="target"):
    a = {f"{prefix}_treeids": [], f"{prefix}_nodeids": [], f"{prefix}_ids": [],
         f"{prefix}_weights": []}
    for t, nid in leaves():
        for j in range(n_targets):
            for k, val in zip(a, (t, nid, j, float(RNG.uniform(-1, 1)))):
                a[k].append(val)
    return a


def _int64_input():
    """int64 X (the spec's T includes it; onnxruntime's kernels are float and double only):
    against onnxruntime on the same values as float32."""
    from ml_shapes_harness import _ort, build

    x = np.array([[0, -1, 1], [1, 0, 0], [3, 4, -5]], np.int64)
    attrs = {**forest(), **regressor_targets(), "n_targets": 1}
    as_float = MlCase("f", "TreeEnsembleRegressor", {"x": x.astype(F32)}, attrs)
    return MlCase("ter-int64-input", "TreeEnsembleRegressor", {"x": x}, attrs,
                  reference=_ort(build(as_float), as_float.feeds))


def _reg(name, attrs=None, mode="BRANCH_LEQ", n_targets=1, **kw):
    return MlCase(f"ter-{name}", "TreeEnsembleRegressor", {"x": X},
                  {**forest(mode, kw.pop("missing_true", None)), **regressor_targets(n_targets),
                   "n_targets": n_targets, **(attrs or {})}, rtol=1e-5, atol=1e-6, **kw)


def _regressors():
    cases = [_reg(f"agg-{agg}", {"aggregate_function": agg})
             for agg in ("SUM", "AVERAGE", "MIN", "MAX")]
    cases += [_reg(f"mode-{m}", mode=m) for m in ("BRANCH_LT", "BRANCH_GTE", "BRANCH_GT",
                                                 "BRANCH_EQ", "BRANCH_NEQ")]
    cases += [
        _reg("missing-tracks-true", missing_true=1),
        _reg("base-values-one", {"base_values": [0.5]}),
        _reg("two-targets-base-values", {"base_values": [0.5, -1.0]}, n_targets=2),
        _reg("two-targets-one-base-value", {"base_values": [0.5]}, n_targets=2,
             ort_refuses=True),
        _reg("two-targets-average", {"aggregate_function": "AVERAGE"}, n_targets=2),
        _reg("probit", {"post_transform": "PROBIT"}),
        _int64_input(),
    ]
    t = {**forest(), **regressor_targets()}
    as_tensor = {"nodes_values_as_tensor": helper.make_tensor(
        "v", TensorProto.DOUBLE, [len(t["nodes_values"])], t.pop("nodes_values")),
        "target_weights_as_tensor": helper.make_tensor(
        "w", TensorProto.DOUBLE, [len(t["target_weights"])], t.pop("target_weights")),
        "base_values_as_tensor": helper.make_tensor("b", TensorProto.DOUBLE, [1], [0.25])}
    cases.append(MlCase("ter-double-attrs", "TreeEnsembleRegressor", {"x": X.astype(np.float64)},
                        {**t, **as_tensor, "n_targets": 1}, ml_opset=3))
    return cases


def _clf(name, labels, weights_per_leaf, attrs=None, x=X, **kw):
    """A TreeEnsembleClassifier over TREES; `weights_per_leaf` class ids get a weight each."""
    a = {"class_treeids": [], "class_nodeids": [], "class_ids": [], "class_weights": []}
    for t, nid in leaves():
        for c in weights_per_leaf:
            for k, val in zip(a, (t, nid, c, float(RNG.uniform(-1, 1)))):
                a[k].append(val)
    key = "classlabels_strings" if isinstance(labels[0], str) else "classlabels_int64s"
    out = (("y", STRING if isinstance(labels[0], str) else INT64), ("z", FLOAT))
    return MlCase(f"tec-{name}", "TreeEnsembleClassifier", {"x": x},
                  {**forest(), **a, key: labels, **(attrs or {})}, out, rtol=1e-5, atol=1e-6,
                  **kw)


def _classifiers():
    cases = []
    for pt in ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"):
        cases += [_clf(f"binary-one-weight-{pt}", [0, 1], [0], {"post_transform": pt}),
                  _clf(f"binary-one-weight-labels37-{pt}", [3, 7], [0], {"post_transform": pt}),
                  _clf(f"binary-two-weights-{pt}", ["n", "y"], [0, 1], {"post_transform": pt}),
                  _clf(f"three-{pt}", [1, 2, 3], [0, 1, 2], {"post_transform": pt})]
    cases += [
        _clf("binary-one-weight-class1", [0, 1], [1]),
        _clf("binary-one-base-value", [0, 1], [0], {"base_values": [0.3]}),
        _clf("binary-two-base-values", [0, 1], [0, 1], {"base_values": [0.3, -0.2]}),
        _clf("three-base-values", [0, 1, 2], [0, 1, 2], {"base_values": [0.1, 0.2, 0.3]}),
        _clf("three-sparse-weights", ["a", "b", "c"], [2]),
    ]
    return cases


def _v5(legacy: dict, leaf_prefix: str, n_targets: int, **attrs) -> dict:
    """TreeEnsemble (opset 5) attributes for the same forest as `legacy`."""
    modes = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
             "BRANCH_NEQ": 5}
    leaf_ids = {key: i for i, key in enumerate(leaves())}
    inner = [(t, nid) for t, nodes in enumerate(TREES) for nid, n in nodes.items() if n]
    inner_ids = {key: i for i, key in enumerate(inner)}
    a = {"nodes_featureids": [], "nodes_truenodeids": [], "nodes_trueleafs": [],
         "nodes_falsenodeids": [], "nodes_falseleafs": []}
    splits, mode_codes = [], []
    for t, nid in inner:
        f, v, tr, fa = TREES[t][nid]
        a["nodes_featureids"].append(f)
        splits.append(v)
        mode_codes.append(modes[legacy["nodes_modes"][0]])
        for child, side in ((tr, "true"), (fa, "false")):
            is_leaf = TREES[t][child] is None
            a[f"nodes_{side}leafs"].append(int(is_leaf))
            a[f"nodes_{side}nodeids"].append(leaf_ids[(t, child)] if is_leaf
                                             else inner_ids[(t, child)])
    weights = {(t, n, j): w for t, n, j, w in zip(
        legacy[f"{leaf_prefix}_treeids"], legacy[f"{leaf_prefix}_nodeids"],
        legacy[f"{leaf_prefix}_ids"], legacy[f"{leaf_prefix}_weights"])}
    # one leaf entry per (leaf, target) pair that has a weight, in leaf order
    order = [(leaf_ids[(t, n)], j, w) for (t, n, j), w in weights.items()]
    return {**a, "tree_roots": [inner_ids[(t, 0)] for t in range(len(TREES))],
            "nodes_splits": helper.make_tensor("s", TensorProto.FLOAT, [len(splits)], splits),
            "nodes_modes": helper.make_tensor("m", TensorProto.UINT8, [len(mode_codes)],
                                              mode_codes),
            "leaf_targetids": [j for _, j, _ in order],
            "leaf_weights": helper.make_tensor("w", TensorProto.FLOAT, [len(order)],
                                               [w for _, _, w in order]),
            "n_targets": n_targets, **attrs}


def _tree_ensemble_5():
    cases = []
    for agg, code in (("SUM", 1), ("AVERAGE", 0), ("MIN", 2), ("MAX", 3)):
        for mode in ("BRANCH_LEQ", "BRANCH_GT"):
            legacy = {**forest(mode), **regressor_targets(2)}
            cases.append(MlCase(f"te5-{agg}-{mode}", "TreeEnsemble", {"x": X},
                                _v5(legacy, "target", 2, aggregate_function=code), ml_opset=5,
                                rtol=1e-5, atol=1e-6))
    legacy = {**forest(), **regressor_targets(1)}
    member = _v5(legacy, "target", 1)
    codes = [0] * len(member["nodes_featureids"])
    codes[-1] = 6  # tree 1's root: x[2] in {0, -1, 2} (NaN ends each node's set; onnxruntime
    # implements integer sets only)
    member["nodes_modes"] = helper.make_tensor("m", TensorProto.UINT8, [len(codes)], codes)
    member["membership_values"] = helper.make_tensor("mv", TensorProto.FLOAT, [4],
                                                     [0.0, -1.0, 2.0, np.nan])
    xm = X.copy()  # integer codes: onnxruntime's answer for a non-integer x depends on the set
    xm[:, 2] = [-1.0, 2.0, 0.0, 3.0, 1.0, np.nan]
    cases.append(MlCase("te5-member", "TreeEnsemble", {"x": xm}, member, ml_opset=5))
    cases.append(MlCase("te5-missing-tracks-true", "TreeEnsemble", {"x": X},
                        _v5(legacy, "target", 1, nodes_missing_value_tracks_true=[1, 0, 1]),
                        ml_opset=5))
    cases.append(_clf("missing-tracks-true-logistic", [0, 1], [0],
                      {"post_transform": "LOGISTIC",
                       "nodes_missing_value_tracks_true": [1] * len(forest()["nodes_modes"])}))
    cases.append(MlCase("te5-default-aggregate", "TreeEnsemble", {"x": X},
                        _v5(legacy, "target", 1), ml_opset=5))
    cases.append(MlCase("te5-probit", "TreeEnsemble", {"x": X},
                        _v5(legacy, "target", 1, post_transform=4), ml_opset=5, rtol=1e-5,
                        atol=1e-5))
    return cases


def _many_rows():
    """37 rows: the numba walk's blocks of 8 (sample, tree) chains, full and partial."""
    x = RNG.standard_normal((37, 3)).astype(F32)
    x[::5, 1] = np.nan
    legacy = {**forest(), **regressor_targets(2)}
    return [
        MlCase("ter-many-rows", "TreeEnsembleRegressor", {"x": x},
               {**legacy, "n_targets": 2, "aggregate_function": "AVERAGE"}),
        MlCase("te5-many-rows", "TreeEnsemble", {"x": x}, _v5(legacy, "target", 2),
               ml_opset=5),
        _clf("many-rows-softmax", [0, 1, 2], [0, 1, 2], {"post_transform": "SOFTMAX"}, x=x),
    ]


CASES = [*_regressors(), *_classifiers(), *_tree_ensemble_5(), *_many_rows()]


@pytest.mark.parametrize("numba_on", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_onnxruntime(case, numba_on, monkeypatch):
    monkeypatch.setattr(_numba, "ENABLED", numba_on)  # read at plan time: both paths
    assert check(case) == case.expected()
