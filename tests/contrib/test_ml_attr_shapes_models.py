"""ai.onnx.ml model ops (LinearClassifier/Regressor, SVMClassifier/Regressor, the tree
ensembles) with the attribute shapes converters write, against onnxruntime: one-class and
binary problems, missing intercepts/base_values/prob_a, int vs string labels, every
post_transform, opset-5 TreeEnsemble next to TreeEnsembleRegressor/Classifier."""

from __future__ import annotations

import numpy as np
import pytest
from ml_shapes_harness import F32, MlCase, check
from onnx import TensorProto

from onnxkiln.providers.cpu import _numba

RNG = np.random.default_rng(8)
X = RNG.standard_normal((5, 3)).astype(F32)
INT64, STRING, FLOAT = TensorProto.INT64, TensorProto.STRING, TensorProto.FLOAT
TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


def _clf_outputs(labels):
    return (("y", STRING if isinstance(labels[0], str) else INT64), ("z", FLOAT))


def _labels(n, strings=False):
    key = "classlabels_strings" if strings else "classlabels_ints"
    return key, ([f"c{i}" for i in range(n)] if strings else list(range(3, 3 + n)))


def _linear():
    cases = []
    coef1, coef3 = RNG.standard_normal(3).tolist(), RNG.standard_normal(9).tolist()
    for pt in TRANSFORMS:
        if pt == "PROBIT":  # onnxruntime leaves half of Z unwritten for a binary PROBIT model
            continue
        cases.append(MlCase(f"linear-clf-binary-one-row-{pt}", "LinearClassifier", {"x": X},
                            {"coefficients": coef1, "intercepts": [0.3], "classlabels_ints": [0, 1],
                             "post_transform": pt}, _clf_outputs([0]), rtol=1e-5, atol=1e-5))
        key, labels = _labels(3, strings=pt == "SOFTMAX")
        cases.append(MlCase(f"linear-clf-3-{pt}", "LinearClassifier", {"x": X},
                            {"coefficients": coef3, "intercepts": [0.1, -0.2, 0.3], key: labels,
                             "post_transform": pt}, _clf_outputs(labels), rtol=1e-5, atol=1e-5))
    cases += [
        MlCase("linear-clf-one-class-one-label", "LinearClassifier", {"x": X},
               {"coefficients": coef1, "intercepts": [0.5], "classlabels_ints": [7]},
               _clf_outputs([7]), ort_refuses=True),
        MlCase("linear-clf-binary-two-features-no-intercepts", "LinearClassifier",
               {"x": X[:, :2].copy()}, {"coefficients": coef1[:2], "classlabels_ints": [0, 1]},
               _clf_outputs([0]), ort_attrs={"intercepts": [0.0]}),
        MlCase("linear-clf-binary-two-rows-no-intercepts", "LinearClassifier",
               {"x": X[:, :2].copy()}, {"coefficients": coef1[:2] + coef1[1:],
                                        "classlabels_ints": [0, 1]},
               _clf_outputs([0]), ort_attrs={"intercepts": [0.0, 0.0]}),
        MlCase("linear-clf-binary-strings-no-intercepts", "LinearClassifier", {"x": X},
               {"coefficients": coef1, "classlabels_strings": ["no", "yes"],
                "post_transform": "LOGISTIC"}, _clf_outputs(["a"]),
               ort_attrs={"intercepts": [0.0]}),  # optional in the spec, required by onnxruntime
        MlCase("linear-clf-binary-two-rows-multi-class", "LinearClassifier", {"x": X},
               {"coefficients": coef1 + [-c for c in coef1], "intercepts": [0.2, -0.2],
                "classlabels_ints": [0, 1], "multi_class": 1}, _clf_outputs([0])),
        MlCase("linear-clf-int64-input", "LinearClassifier",
               {"x": np.array([[1, 2, 3], [-1, 0, 4]], np.int64)},
               {"coefficients": coef3, "intercepts": [0.0, 1.0, -1.0],
                "classlabels_ints": [0, 1, 2]}, _clf_outputs([0])),
        MlCase("linear-clf-empty-intercepts", "LinearClassifier", {"x": X},
               {"coefficients": coef3, "intercepts": [], "classlabels_ints": [0, 1, 2]},
               _clf_outputs([0]), ort_attrs={"intercepts": [0.0, 0.0, 0.0]}),
        MlCase("linear-reg-two-targets-no-intercepts", "LinearRegressor", {"x": X},
               {"coefficients": coef1 + coef1[::-1], "targets": 2}),
        MlCase("linear-reg-probit", "LinearRegressor", {"x": X},
               {"coefficients": (np.array(coef1) * 0.1).tolist(), "intercepts": [0.1],
                "post_transform": "PROBIT"}, rtol=1e-4, atol=1e-5),
        MlCase("linear-reg-double-input", "LinearRegressor", {"x": X.astype(np.float64)},
               {"coefficients": coef1, "intercepts": [1.0]},  # onnxruntime: float only
               reference=[(X @ np.array(coef1, F32) + 1).astype(F32)[:, None]]),
        MlCase("linear-reg-default-targets", "LinearRegressor", {"x": X},
               {"coefficients": coef1, "intercepts": [1.0]}),
    ]
    return cases


def _svm_attrs(kernel, n_classes, vpc):
    n_sv = sum(vpc)
    return {"kernel_type": kernel, "kernel_params": [0.3, 0.1, 2.0],
            "support_vectors": RNG.standard_normal(n_sv * 3).tolist(),
            "vectors_per_class": vpc,
            "coefficients": RNG.standard_normal((n_classes - 1) * n_sv).tolist(),
            "rho": RNG.standard_normal(n_classes * (n_classes - 1) // 2).tolist()}


def _svm():
    cases = []
    for kernel in ("LINEAR", "POLY", "RBF", "SIGMOID"):
        a = _svm_attrs(kernel, 2, [2, 3])
        cases.append(MlCase(f"svc-binary-{kernel}", "SVMClassifier", {"x": X},
                            {**a, "classlabels_ints": [0, 1]}, _clf_outputs([0]), rtol=1e-4,
                            atol=1e-5))
    a = _svm_attrs("RBF", 2, [2, 2])
    cases.append(MlCase("svc-binary-prob", "SVMClassifier", {"x": X},
                        {**a, "classlabels_strings": ["a", "b"], "prob_a": [-1.5], "prob_b": [0.2]},
                        _clf_outputs(["a"]), rtol=1e-4, atol=1e-5))
    a = _svm_attrs("RBF", 3, [2, 1, 2])
    cases.append(MlCase("svc-3-no-prob", "SVMClassifier", {"x": X},
                        {**a, "classlabels_ints": [1, 2, 3]}, _clf_outputs([0]), rtol=1e-4,
                        atol=1e-5))
    cases.append(MlCase("svc-3-prob", "SVMClassifier", {"x": X},
                        {**a, "classlabels_ints": [1, 2, 3], "prob_a": [-1.0, -2.0, -0.5],
                         "prob_b": [0.1, 0.0, -0.1]}, _clf_outputs([0]), rtol=1e-4, atol=1e-5))
    for pt in ("LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"):
        cases += [MlCase(f"svc-3-no-prob-{pt}", "SVMClassifier", {"x": X},
                         {**a, "classlabels_ints": [1, 2, 3], "post_transform": pt},
                         _clf_outputs([0]), rtol=1e-4, atol=1e-5),
                  MlCase(f"svc-binary-{pt}", "SVMClassifier", {"x": X},
                         {**_svm_attrs("RBF", 2, [1, 2]), "classlabels_ints": [0, 1],
                          "post_transform": pt}, _clf_outputs([0]), rtol=1e-4, atol=1e-5)]
    cases.append(MlCase("svc-linear-no-support-vectors", "SVMClassifier", {"x": X},
                        {"kernel_type": "LINEAR", "coefficients": RNG.standard_normal(9).tolist(),
                         "rho": [0.1, 0.2, 0.3], "classlabels_ints": [0, 1, 2]},
                        _clf_outputs([0]), rtol=1e-4, atol=1e-5,
                        ort_attrs={"kernel_params": [0.0, 0.0, 0.0]}))
    cases.append(MlCase("svc-linear-binary-no-support-vectors", "SVMClassifier", {"x": X},
                        {"kernel_type": "LINEAR", "coefficients": RNG.standard_normal(3).tolist(),
                         "rho": [0.1], "classlabels_ints": [0, 1],
                         "kernel_params": [0.1, 0.0, 3.0]},
                        _clf_outputs([0]), ort_refuses=True))  # one row: both refuse
    sv = RNG.standard_normal(4 * 3).tolist()
    cases += [MlCase(f"svr-rbf-one-class{one_class}", "SVMRegressor", {"x": X},
                     {"kernel_type": "RBF", "kernel_params": [0.3, 0.0, 3.0],
                      "support_vectors": sv, "n_supports": 4,
                      "coefficients": RNG.standard_normal(4).tolist(), "rho": [0.2],
                      "one_class": one_class}, rtol=1e-4, atol=1e-5) for one_class in (0, 1)]
    cases.append(MlCase("svr-linear-no-support-vectors", "SVMRegressor", {"x": X},
                        {"kernel_type": "LINEAR", "coefficients": [0.5, -1.0, 2.0], "rho": [0.3],
                         "n_supports": 0}, rtol=1e-5, atol=1e-5,
                        ort_attrs={"kernel_params": [0.0, 0.0, 0.0]}))
    return cases


def _many_rows():
    """41 rows through the numba score finishing and SVC voting loops."""
    x = RNG.standard_normal((41, 3)).astype(F32)
    a = _svm_attrs("RBF", 3, [2, 1, 2])
    return [
        MlCase("svc-3-prob-many-rows", "SVMClassifier", {"x": x},
               {**a, "classlabels_ints": [1, 2, 3], "prob_a": [-1.0, -2.0, -0.5],
                "prob_b": [0.1, 0.0, -0.1]}, _clf_outputs([0]), rtol=1e-4, atol=1e-5),
        MlCase("linear-clf-3-softmax-many-rows", "LinearClassifier", {"x": x},
               {"coefficients": RNG.standard_normal(9).tolist(), "intercepts": [0.1, 0, -0.1],
                "classlabels_strings": ["a", "b", "c"], "post_transform": "SOFTMAX"},
               _clf_outputs(["a"]), rtol=1e-5, atol=1e-6),
    ]


CASES = [*_linear(), *_svm(), *_many_rows()]


@pytest.mark.parametrize("numba_on", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_onnxruntime(case, numba_on, monkeypatch):
    monkeypatch.setattr(_numba, "ENABLED", numba_on)  # read at plan time: both paths
    assert check(case) == case.expected()

