"""End to end: scikit-learn models converted by skl2onnx run on onnxkiln as on onnxruntime.

Small models trained on generated data (fixed seeds) cover tree ensembles (with and without
ZipMap), linear models, SVMs and a OneHotEncoder on string columns. Labels must match exactly;
probabilities and regression values to rtol 1e-5 / atol 1e-6.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="scikit-learn is not installed (test extra)")
pytest.importorskip("skl2onnx", reason="skl2onnx is not installed (test extra)")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (test extra)")

from skl2onnx import to_onnx
from sklearn.datasets import make_classification, make_regression
from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn.svm import SVC, SVR

from onnxkiln import InferenceSession
from onnxkiln.errors import SequenceOutputError
from onnxkiln.testing import ort_session

RTOL, ATOL = 1e-5, 1e-6


# --- data and conversion ----------------------------------------------------------------------


def _classification(n_classes: int = 3, n: int = 160, seed: int = 0):
    X, y = make_classification(n, 6, n_informative=4, n_redundant=1, n_classes=n_classes,
                               random_state=seed)
    return X.astype(np.float32), y


def _regression(n: int = 160, seed: int = 0):
    X, y = make_regression(n, 5, n_informative=4, noise=0.5, random_state=seed)
    return X.astype(np.float32), y


def _convert(estimator, X, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(estimator, X[:1], options=options or None)


def _feeds(model, X) -> dict[str, np.ndarray]:
    (inp,) = model.graph.input
    return {inp.name: X}


def _ops(model) -> set[str]:
    return {n.op_type for n in model.graph.node}


def _assert_tensor(name: str, ours, theirs) -> None:
    theirs = np.asarray(theirs)
    assert isinstance(ours, np.ndarray), f"{name}: onnxkiln gave {type(ours).__name__}"
    assert ours.shape == theirs.shape, f"{name}: shape {ours.shape} vs ort {theirs.shape}"
    if theirs.dtype.kind in "fc":
        assert ours.dtype == theirs.dtype, f"{name}: dtype {ours.dtype} vs ort {theirs.dtype}"
        np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL, err_msg=name)
    else:  # labels, exactly; string labels may be str or object arrays
        same = ours.dtype.kind in "UO" if theirs.dtype.kind in "UO" else ours.dtype == theirs.dtype
        assert same, f"{name}: dtype {ours.dtype} vs ort {theirs.dtype}"
        np.testing.assert_array_equal(ours, theirs, err_msg=name)


def _assert_zipmap(name: str, ours, theirs) -> None:
    """A sequence of {label: probability} maps, compared key by key."""
    assert isinstance(ours, list | tuple), (
        f"{name}: onnxkiln returned {type(ours).__name__}, expected a sequence of maps (ZipMap)")
    assert len(ours) == len(theirs), f"{name}: {len(ours)} rows vs ort {len(theirs)}"
    for row, (a, b) in enumerate(zip(ours, theirs)):
        assert isinstance(a, dict), f"{name}[{row}]: {type(a).__name__}, not a map"
        assert sorted(a) == sorted(b), f"{name}[{row}]: keys {sorted(a)} vs ort {sorted(b)}"
        for key, want in b.items():
            got = next(k for k in a if k == key)
            assert type(got) is type(key), (
                f"{name}[{row}]: key {got!r} is {type(got).__name__}, ort's {type(key).__name__}")
            np.testing.assert_allclose(float(a[key]), want, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name}[{row}][{key!r}]")


def check(model, X) -> None:
    """Run `model` on onnxkiln and onnxruntime and compare every output."""
    feeds = _feeds(model, X)
    theirs = ort_session(model).run(None, feeds)
    names = [o.name for o in model.graph.output]
    zipmap = [o.type.HasField("sequence_type") for o in model.graph.output]
    session = InferenceSession.from_graph(model)
    if any(zipmap):
        outs = session.run_outputs(feeds)
        assert [o.name for o in outs] == names
        for out, is_seq in zip(outs, zipmap):
            want = "sequence" if is_seq else "tensor"
            assert out.kind == want, (
                f"run_outputs reports {out.name!r} as kind {out.kind!r}, expected {want!r} "
                "(ZipMap output is a sequence of maps)")
        ours = [o.value for o in outs]
        with pytest.raises(SequenceOutputError):
            session.run(feeds)
    else:
        ours = session.run(feeds)
    assert len(ours) == len(theirs)
    for name, is_seq, a, b in zip(names, zipmap, ours, theirs):
        (_assert_zipmap if is_seq else _assert_tensor)(name, a, b)


# --- tree ensembles ---------------------------------------------------------------------------


def _forest(labels: str):
    X, y = _classification()
    if labels == "str":
        y = np.array(["ant", "bee", "cat"], dtype=object)[y]
    pipe = Pipeline([("scale", StandardScaler()),
                     ("forest", RandomForestClassifier(n_estimators=8, max_depth=5,
                                                       random_state=0))])
    return pipe.fit(X, y), X


@pytest.mark.parametrize("labels", ["int", "str"])
def test_random_forest_pipeline_zipmap(labels):
    pipe, X = _forest(labels)
    model = _convert(pipe, X)
    assert {"Scaler", "TreeEnsembleClassifier", "ZipMap"} <= _ops(model), _ops(model)
    assert model.graph.output[1].type.HasField("sequence_type")
    check(model, X[:40])


@pytest.mark.parametrize("labels", ["int", "str"])
def test_random_forest_pipeline_no_zipmap(labels):
    pipe, X = _forest(labels)
    model = _convert(pipe, X, zipmap=False)
    assert "ZipMap" not in _ops(model)
    check(model, X[:40])


def test_gradient_boosting_regressor():
    X, y = _regression()
    gbr = GradientBoostingRegressor(n_estimators=20, max_depth=3, random_state=0).fit(X, y)
    model = _convert(gbr, X)
    assert "TreeEnsembleRegressor" in _ops(model) or "TreeEnsemble" in _ops(model), _ops(model)
    check(model, X[:40])


# --- linear models ----------------------------------------------------------------------------


@pytest.mark.parametrize("zipmap", [True, False])
def test_logistic_regression_pipeline_multiclass(zipmap):
    X, y = _classification(n_classes=4)
    pipe = Pipeline([("scale", StandardScaler()),
                     ("logreg", LogisticRegression(max_iter=500))]).fit(X, y)
    model = _convert(pipe, X) if zipmap else _convert(pipe, X, zipmap=False)
    assert "LinearClassifier" in _ops(model), _ops(model)
    check(model, X[:40])


def test_logistic_regression_binary():
    X, y = _classification(n_classes=2)
    model = _convert(LogisticRegression(max_iter=500).fit(X, y), X, zipmap=False)
    check(model, X[:40])


def test_ridge_pipeline():
    X, y = _regression()
    pipe = Pipeline([("scale", StandardScaler()), ("ridge", Ridge(alpha=0.3))]).fit(X, y)
    model = _convert(pipe, X)
    assert "LinearRegressor" in _ops(model), _ops(model)
    check(model, X[:40])


# --- SVMs -------------------------------------------------------------------------------------


def svc_probability(test):
    """SVC(probability=True) is deprecated from scikit-learn 1.9 (removal planned for 1.11)."""
    test = pytest.mark.filterwarnings("ignore:The `probability` parameter:FutureWarning")(test)
    return pytest.mark.skipif("probability" not in SVC().get_params(),
                              reason="this scikit-learn has no SVC(probability=True)")(test)


@pytest.mark.parametrize("n_classes", [2, 3])
@svc_probability
def test_svc_probability(n_classes):
    X, y = _classification(n_classes=n_classes, n=120)
    svc = SVC(probability=True, C=2.0, gamma="scale", random_state=0).fit(X, y)
    model = _convert(svc, X, zipmap=False)
    assert "SVMClassifier" in _ops(model), _ops(model)
    check(model, X[:40])


@svc_probability
def test_svc_pipeline_zipmap():
    X, y = _classification(n_classes=3, n=120)
    pipe = Pipeline([("scale", StandardScaler()),
                     ("svc", SVC(probability=True, random_state=0))]).fit(X, y)
    model = _convert(pipe, X)
    assert {"SVMClassifier", "ZipMap"} <= _ops(model), _ops(model)
    check(model, X[:40])


@pytest.mark.parametrize("kernel", ["rbf", "linear"])
def test_svr(kernel):
    X, y = _regression(n=120)
    svr = SVR(kernel=kernel, C=10.0, epsilon=0.1).fit(X, y)
    model = _convert(svr, X)
    assert "SVMRegressor" in _ops(model), _ops(model)
    check(model, X[:40])


# --- categorical strings ----------------------------------------------------------------------


def test_one_hot_encoder_linear_pipeline():
    rng = np.random.default_rng(3)
    colours = np.array(["red", "green", "blue", "teal"], dtype=object)
    sizes = np.array(["S", "M", "L"], dtype=object)
    X = np.stack([colours[rng.integers(0, 4, 200)], sizes[rng.integers(0, 3, 200)]], axis=1)
    score = (X[:, 0] == "red") * 1.5 + (X[:, 1] == "L") - (X[:, 0] == "blue")
    y = (score + rng.normal(0, 0.5, 200) > 0.5).astype(np.int64)
    pipe = Pipeline([("onehot", OneHotEncoder(handle_unknown="ignore")),
                     ("logreg", LogisticRegression(max_iter=500))]).fit(X, y)
    model = _convert(pipe, X, zipmap=False)
    assert {"OneHotEncoder", "LinearClassifier"} <= _ops(model), _ops(model)
    # rows seen in training plus one with an unseen category (ignored: all-zero one-hot)
    test = np.concatenate([X[:30], np.array([["purple", "M"]], dtype=object)])
    check(model, test)
