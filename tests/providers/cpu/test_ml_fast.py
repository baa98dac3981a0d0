"""ai.onnx.ml kernels on both paths, numba and the numpy fallback, each against
onnxruntime and against each other: tree ensembles (ml_forest, _numba_tree, _numba_ml) over
a grid of modes, aggregates, post-transforms, NaN routing, targets, base values, batches;
SVC votes and pairwise-coupled probabilities; linear models' argmax and post-transforms;
the Normalizer."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from test_ml import (
    MODES,
    POSTS,
    _labels,
    _svc_attrs,
    gradient_boosting,
    ml_model,
    random_forest_classifier,
    random_trees,
    to_v5,
    x_with_nan,
)

from onnxkiln import InferenceSession
from onnxkiln.errors import KernelError
from onnxkiln.providers.cpu import _numba
from onnxkiln.testing import run_ort, tensor_info
from onnxkiln.trace import TraceContext

BATCHES = [0, 1, 5, 8, 70, 130]  # below and above the lockstep width (8) and block (64)


@pytest.fixture
def numba_on(monkeypatch):
    pytest.importorskip("numba", reason="numba (the `fast` extra) is not installed")
    monkeypatch.delenv(_numba.ENV, raising=False)
    monkeypatch.setattr(_numba, "ENABLED", True)


def traced(model, feeds):
    """(outputs, kernel variant, variant reason) of one traced run."""
    ctx = TraceContext.in_memory()
    outs = InferenceSession.builder().trace(ctx).from_graph(model).run(dict(feeds))
    (span,) = [s for s in ctx.spans if s.category == "node"]
    return outs, span.attributes["kernel_variant"], span.attributes.get("kernel_variant_reason")


def both(monkeypatch, model, feeds, rtol=1e-5, atol=1e-6, ort=True, exact_numpy=False,
         post="NONE", fast=True):
    """Run with numba on and off; each against onnxruntime (unless ort=False) and the two
    paths against each other: labels exactly, scores bit for bit (tree sums) or to 1e-6
    (exp and log differ in the last bit between numba and numpy; PROBIT's erfinv formula
    amplifies that to ~1e-6, hence 1e-5 there). `fast`: the numba path has work to do
    (the trace names it)."""
    outs, fast_variant, reason = traced(model, feeds)
    assert fast_variant.endswith(".numba") == fast, (fast_variant, reason)
    monkeypatch.setattr(_numba, "ENABLED", False)
    slow, slow_variant, reason = traced(model, feeds)
    monkeypatch.setattr(_numba, "ENABLED", True)
    assert slow_variant.endswith(".numpy") and "ENABLED = False" in reason
    refs = run_ort(model, feeds) if ort else slow
    for i, (a, b, r) in enumerate(zip(outs, slow, refs)):
        r = np.asarray(r)
        assert a.dtype == b.dtype and a.shape == b.shape == r.shape, (i, a.dtype, b.dtype)
        if a.dtype.kind not in "fc":
            np.testing.assert_array_equal(a, r, err_msg=f"out {i} vs ref")
            np.testing.assert_array_equal(a, b, err_msg=f"out {i} vs numpy")
            continue
        np.testing.assert_allclose(a, r, rtol=rtol, atol=atol, err_msg=f"out {i} vs ref")
        if exact_numpy:
            np.testing.assert_array_equal(a, b, err_msg=f"out {i} vs numpy")
        else:
            close = 1e-5 if post == "PROBIT" else 1e-6
            np.testing.assert_allclose(a, b, rtol=close, atol=close / 10,
                                       err_msg=f"out {i} vs numpy")
    return outs


def regressor_attrs(rng, modes=("BRANCH_LEQ",), missing=False, n_targets=3, partial=True):
    attrs, leaves = random_trees(rng, 6, 5, 4, modes=modes, missing=missing)
    tt, tn, ti, tw = [], [], [], []
    for t, nid in leaves:
        for target in range(n_targets):
            if not partial or rng.random() < 0.7:  # some leaves leave some targets unscored
                tt.append(t), tn.append(nid), ti.append(target)
                tw.append(float(np.round(rng.standard_normal(), 2)))
    attrs.update(target_treeids=tt, target_nodeids=tn, target_ids=ti, target_weights=tw)
    return attrs


MODE_SETS = {"leq": ("BRANCH_LEQ",), "lt": ("BRANCH_LT",), "gte": ("BRANCH_GTE",),
             "mixed": tuple(MODES)}


@pytest.mark.parametrize("modes", list(MODE_SETS))
@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_regressor_modes_nan_aggregates(numba_on, monkeypatch, modes, missing, aggregate):
    rng = np.random.default_rng(31)
    attrs = regressor_attrs(rng, MODE_SETS[modes], missing)
    x = x_with_nan(rng, 90, 4, nan=0.2)
    model = ml_model("TreeEnsembleRegressor", {"x": x}, n_targets=3,
                     aggregate_function=aggregate, base_values=[0.5, -0.5, 0.25], **attrs)
    both(monkeypatch, model, {"x": x}, rtol=1e-5, atol=1e-5, exact_numpy=True)


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("n_targets", [1, 3])
def test_regressor_post_transforms(numba_on, monkeypatch, post, n_targets):
    rng = np.random.default_rng(32)
    attrs = regressor_attrs(rng, n_targets=n_targets, partial=n_targets > 1)
    x = x_with_nan(rng, 60, 4, nan=0.0)
    model = ml_model("TreeEnsembleRegressor", {"x": x}, n_targets=n_targets,
                     post_transform=post, **attrs)
    both(monkeypatch, model, {"x": x}, rtol=1e-4, atol=1e-5, post=post)


@pytest.mark.parametrize("batch", BATCHES)
def test_batch_sizes(numba_on, monkeypatch, batch):
    rng = np.random.default_rng(33)
    attrs = random_forest_classifier(rng, 13, 3)  # 13 trees: one full group of 8 and a rest
    x = x_with_nan(rng, batch, 5, nan=0.0)
    model = ml_model("TreeEnsembleClassifier", {"x": x}, 2, classlabels_int64s=[3, 1, 2],
                     **attrs)
    both(monkeypatch, model, {"x": x})
    reg = gradient_boosting(rng, 11, depth=4, modes=("BRANCH_LT",))
    model = ml_model("TreeEnsembleRegressor", {"x": x}, n_targets=1, base_values=[0.5], **reg)
    both(monkeypatch, model, {"x": x}, rtol=1e-5, atol=1e-5, exact_numpy=True)


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("weights", ["all", "class0", "class1", "split"])
@pytest.mark.parametrize("base", [None, [0.25, 0.5], [-0.4]])
def test_binary_classifier_rules(numba_on, monkeypatch, post, weights, base):
    rng = np.random.default_rng(34)
    attrs, leaves = random_trees(rng, 9, 3, 3)
    ct, cn, ci, cw = [], [], [], []
    for j, (t, nid) in enumerate(leaves):
        classes = {"all": [0, 1], "class0": [0], "class1": [1], "split": [j % 2]}[weights]
        for c in classes:
            ct.append(t), cn.append(nid), ci.append(c), cw.append(float(rng.normal(0.2, 0.5)))
    attrs.update(class_treeids=ct, class_nodeids=cn, class_ids=ci, class_weights=cw)
    if base:
        attrs["base_values"] = base
    x = x_with_nan(rng, 40, 3, nan=0.0)
    model = ml_model("TreeEnsembleClassifier", {"x": x}, 2, post_transform=post,
                     classlabels_int64s=[4, 8], **attrs)
    # the binary rules for one base value beyond skl2onnx's class-0 margins, and PROBIT's
    # uninitialised second column, are not onnxruntime's: the two paths must still agree
    ort = (base is None or len(base) == 2 or weights == "class0") and post != "PROBIT"
    both(monkeypatch, model, {"x": x}, rtol=1e-5, atol=1e-6, ort=ort, post=post)


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("base", [False, True])
@pytest.mark.parametrize("labels", ["int", "str"])
def test_multiclass_classifier(numba_on, monkeypatch, post, base, labels):
    rng = np.random.default_rng(35)
    attrs = gradient_boosting(rng, 24, n_targets=4, prefix="class")  # one class per tree
    if base:
        attrs["base_values"] = [0.1, -0.2, 0.3, 0.0]
    names = {"classlabels_int64s": [0, 1, 2, 3]} if labels == "int" else \
        {"classlabels_strings": ["a", "b", "c", "d"]}
    x = x_with_nan(rng, 50, 5, nan=0.0)
    model = ml_model("TreeEnsembleClassifier", {"x": x}, 2, post_transform=post, **names,
                     **attrs)
    both(monkeypatch, model, {"x": x}, rtol=1e-5, atol=1e-6, post=post)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_5(numba_on, monkeypatch, dtype, aggregate):
    rng = np.random.default_rng(36)
    legacy = gradient_boosting(rng, 20, depth=4, modes=tuple(MODES))
    x = x_with_nan(rng, 70, 5, dtype, nan=0.1)
    model = ml_model("TreeEnsemble", {"x": x}, ml=5, aggregate_function=aggregate,
                     **to_v5(legacy, dtype=dtype))
    (y,) = both(monkeypatch, model, {"x": x}, rtol=1e-5, atol=1e-5, exact_numpy=True)
    assert y.dtype == dtype


def test_tree_ensemble_5_members_and_float16(numba_on, monkeypatch):
    rng = np.random.default_rng(37)
    attrs = to_v5(gradient_boosting(rng, 10, depth=3, n_feat=3))
    n = len(attrs["nodes_featureids"])
    modes = rng.choice([0, 6], n).astype(np.uint8)
    attrs["nodes_modes"] = numpy_helper.from_array(modes)
    sets = [sorted(rng.choice(5, rng.integers(1, 4), replace=False).tolist())
            for _ in range(int((modes == 6).sum()))]
    # 0.1 is not a float32 value: no float32 input may match it, on either path
    values = [v for s in sets for v in [*s, 0.1, np.nan]][:-1]
    attrs["membership_values"] = numpy_helper.from_array(np.array(values, np.float64))
    attrs["nodes_missing_value_tracks_true"] = rng.integers(0, 2, n).tolist()
    x = rng.integers(-1, 6, (90, 3)).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan
    x[0, :] = np.float32(0.1)
    model = ml_model("TreeEnsemble", {"x": x}, ml=5, **attrs)
    both(monkeypatch, model, {"x": x}, ort=False, exact_numpy=True)
    x16 = x.astype(np.float16)
    model = ml_model("TreeEnsemble", {"x": x16}, ml=5, **attrs)
    (y,) = both(monkeypatch, model, {"x": x16}, ort=False, exact_numpy=True)
    assert y.dtype == np.float16


def test_int_input_and_double(numba_on, monkeypatch):
    rng = np.random.default_rng(38)
    attrs = random_forest_classifier(rng, 6, 3, n_feat=3)
    x = rng.integers(-2, 3, (40, 3)).astype(np.int64)
    model = ml_model("TreeEnsembleClassifier", {"x": x}, 2, classlabels_int64s=[0, 1, 2],
                     **attrs)
    both(monkeypatch, model, {"x": x})
    xd = x_with_nan(rng, 40, 5, np.float64, nan=0.1)
    reg = regressor_attrs(rng, tuple(MODES), missing=True)
    model = ml_model("TreeEnsembleRegressor", {"x": xd}, n_targets=3, **reg)
    both(monkeypatch, model, {"x": xd}, rtol=1e-5, atol=1e-5, exact_numpy=True)


@pytest.mark.parametrize("kernel", ["LINEAR", "RBF", "POLY"])
@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("proba", [False, True])
@pytest.mark.parametrize("batch", [0, 1, 33])
def test_svc_votes_and_probabilities(numba_on, monkeypatch, kernel, k, proba, batch):
    rng = np.random.default_rng(40 + k)
    x = rng.standard_normal((batch, 3)).astype(np.float32)
    model = ml_model("SVMClassifier", {"x": x}, 2, ml=1, post_transform="NONE",
                     **_svc_attrs(rng, k, 3, kernel, proba), **_labels(k, "int"))
    both(monkeypatch, model, {"x": x}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("kind", ["int", "str"])
@pytest.mark.parametrize("batch", [0, 1, 20])
def test_linear_classifier(numba_on, monkeypatch, post, kind, batch):
    rng = np.random.default_rng(41)
    x = rng.standard_normal((batch, 4)).astype(np.float32)
    x[1:2, 0] = np.nan  # a NaN row: argmax and the transforms must agree on it
    model = ml_model("LinearClassifier", {"x": x}, 2, ml=1,
                     coefficients=rng.standard_normal(12).round(2).tolist(),
                     intercepts=[0.1, -0.2, 0.3], post_transform=post, **_labels(3, kind))
    both(monkeypatch, model, {"x": x}, rtol=1e-4, atol=1e-5, post=post)


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("targets", [1, 3])
def test_linear_regressor(numba_on, monkeypatch, post, targets):
    rng = np.random.default_rng(42)
    x = rng.standard_normal((17, 4)).astype(np.float32)
    model = ml_model("LinearRegressor", {"x": x}, ml=1, targets=targets,
                     coefficients=rng.random(4 * targets).tolist(),
                     intercepts=rng.random(targets).tolist(), post_transform=post)
    transformed = post != "NONE" and (targets > 1 or post == "PROBIT")
    both(monkeypatch, model, {"x": x}, rtol=1e-4, atol=1e-5, post=post, fast=transformed)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("shape", [(0, 4), (6,), (9, 5), (3, 0)])
def test_normalizer(numba_on, monkeypatch, norm, dtype, shape):
    rng = np.random.default_rng(43)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    if len(shape) == 2 and shape[0] > 3 and shape[1]:
        x[1] = 0  # a zero divisor: the row passes through
        x[2, 0] = -abs(x[2, 0]) - 1  # a negative row max
        if x.dtype.kind == "f":
            x[3, 1] = np.nan
    model = ml_model("Normalizer", {"x": x}, ml=1, norm=norm)
    # onnxruntime rejects some of these shapes: the paths are compared with each other
    ort = len(shape) == 2 and shape[0] > 0 and shape[1] > 0
    both(monkeypatch, model, {"x": x}, ort=ort)


def _specialised_runs(model, feeds):
    """(first run: generic kernel, third run: the signature's specialisation, its entry)."""
    session = InferenceSession.builder().from_graph(model)
    first = session.run(feeds)
    session.run(feeds)
    third = session.run(feeds)
    entry = next(iter(session._cache._entries.values()))
    assert entry.compiled is not None
    return first, third, entry


@pytest.mark.parametrize("case", ["binary", "multi", "regressor", "v5-f16", "v5-f64-1d",
                                  "int64-3d"])
def test_tree_specialisations_match_the_generic_run(numba_on, case):
    rng = np.random.default_rng(44)
    if case in ("binary", "multi", "int64-3d"):
        k = 2 if case == "binary" else 3
        attrs = random_forest_classifier(rng, 10, k, n_feat=6)
        x = x_with_nan(rng, 12, 6, nan=0.0)
        if case == "int64-3d":
            x = rng.integers(-2, 3, (4, 2, 3)).astype(np.int64)
        model = ml_model("TreeEnsembleClassifier", {"x": x}, 2, post_transform="SOFTMAX",
                         classlabels_int64s=list(range(k)), **attrs)
    elif case == "regressor":
        x = x_with_nan(rng, 9, 4, nan=0.2)
        model = ml_model("TreeEnsembleRegressor", {"x": x}, n_targets=3,
                         post_transform="LOGISTIC", base_values=[0.5, -0.5, 0.25],
                         **regressor_attrs(rng, tuple(MODES), missing=True))
    else:
        dtype = np.float16 if case == "v5-f16" else np.float64
        x = x_with_nan(rng, 1 if case.endswith("1d") else 11, 5, dtype, nan=0.1)
        if case.endswith("1d"):
            x = x.reshape(5)
        model = ml_model("TreeEnsemble", {"x": x}, ml=5,
                         **to_v5(gradient_boosting(rng, 9, depth=4), dtype=dtype))
    first, third, entry = _specialised_runs(model, {"x": x})
    assert entry.kernels == 1
    for a, b in zip(first, third):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    if case in ("binary", "multi", "regressor"):  # onnxruntime takes X only as 2-D floats
        for a, want in zip(third, run_ort(model, {"x": x})):
            np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(7,), (5, 6), (2, 3, 6)])
def test_array_feature_extractor_specialises_on_constant_indices(shape):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    idx = np.array([4, 0, 4, 2], np.int64)
    node = helper.make_node("ArrayFeatureExtractor", ["x", "idx"], ["z"], domain="ai.onnx.ml")
    graph = helper.make_graph([node], "afe", [tensor_info("x", x.dtype, x.shape)],
                              [helper.make_value_info("z", onnx.TypeProto())],
                              [numpy_helper.from_array(idx, "idx")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 3)])
    first, third, entry = _specialised_runs(model, {"x": x})
    assert entry.kernels == 1
    np.testing.assert_array_equal(third[0], first[0])
    np.testing.assert_array_equal(third[0], run_ort(model, {"x": x})[0])


def test_cycle_falls_back_and_is_reported(numba_on):
    attrs = {
        "nodes_treeids": [0, 0, 0], "nodes_nodeids": [0, 1, 2],
        "nodes_featureids": [0, 0, 0], "nodes_modes": ["BRANCH_LEQ", "BRANCH_LEQ", "LEAF"],
        "nodes_values": [0.5, 0.5, 0.0], "nodes_truenodeids": [1, 0, 0],
        "nodes_falsenodeids": [2, 2, 0], "target_treeids": [0], "target_nodeids": [2],
        "target_ids": [0], "target_weights": [1.0],
    }
    x = np.zeros((2, 1), np.float32)
    model = ml_model("TreeEnsembleRegressor", {"x": x}, n_targets=1, **attrs)
    session = InferenceSession.builder().from_graph(model)
    with pytest.raises(KernelError, match="cycle"):
        session.run({"x": x})


_BUILD_THEN_RUN = """
import sys
import numpy as np
import onnx
from onnxkiln import InferenceSession
from onnxkiln.providers.cpu import _numba
model = onnx.load_model_from_string(sys.stdin.buffer.read())
session = InferenceSession.builder().from_graph(model)
print("numba" in sys.modules)
x = np.zeros((3, 5), np.float32)
session.run({"x": x})
loaded = _numba.stats()["compiled"]
session.run({"x": x + 1})
print(loaded, _numba.stats()["compiled"])
"""


def test_kernels_load_on_the_first_run_not_at_build(numba_on):
    """Building a session imports no numba; the first run loads the walk and the
    finishing (compiled, or read from the disk cache); later runs load nothing."""
    rng = np.random.default_rng(39)
    attrs = random_forest_classifier(rng, 4, 3)
    x = x_with_nan(rng, 3, 5, nan=0.0)
    model = ml_model("TreeEnsembleClassifier", {"x": x}, 2, post_transform="SOFTMAX",
                     classlabels_int64s=[0, 1, 2], **attrs)
    out = subprocess.run([sys.executable, "-c", _BUILD_THEN_RUN],
                         input=model.SerializeToString(), capture_output=True, check=True)
    imported, counts = out.stdout.decode().split("\n")[:2]
    assert imported == "False", out.stderr.decode()
    assert counts == "2 2", counts
