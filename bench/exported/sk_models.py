"""scikit-learn pipelines for the exported suite, converted by skl2onnx with its defaults
(classifiers end in a ZipMap: a list of {class: probability} maps).

Trained on seeded synthetic data at build time; each builder returns the ONNX model and the
manifest's description of it. Runs wherever sklearn and skl2onnx are installed (the export
venv; the project's venv has them too, which the tests use).
"""

from __future__ import annotations

from typing import Any

from bench.exported.catalog import SEED


def _data(features: int, classes: int, rows: int = 1000) -> tuple[Any, Any]:
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=rows, n_features=features, n_informative=
                               min(features, 10), n_classes=classes, random_state=SEED)
    return x.astype("float32"), y


def _convert(pipeline: Any, features: int, config: dict[str, Any]) -> tuple[Any, dict]:
    """The ONNX model of a fitted pipeline, input X (batch, features) float32."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    model = to_onnx(pipeline, initial_types=[("X", FloatTensorType([None, features]))])
    described = {
        "inputs": [{"name": "X", "dtype": "float32", "shape": ["batch", features]}],
        "outputs": [o.name for o in model.graph.output],
        "config": {"steps": [type(s).__name__ for _, s in pipeline.steps], **config},
    }
    return model, described


def logreg(config: dict[str, Any]) -> tuple[Any, dict]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = _data(20, 3)
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    return _convert(pipe, 20, {"features": 20, "classes": 3})


def svc(config: dict[str, Any]) -> tuple[Any, dict]:
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    x, y = _data(20, 2, rows=500)
    pipe = make_pipeline(StandardScaler(), SVC(probability=True, random_state=SEED)).fit(x, y)
    return _convert(pipe, 20, {"features": 20, "classes": 2, "kernel": "rbf",
                               "support_vectors": int(pipe[-1].support_vectors_.shape[0])})


def random_forest(config: dict[str, Any]) -> tuple[Any, dict]:
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.pipeline import make_pipeline

    x, y = _data(20, 3)
    forest = RandomForestClassifier(n_estimators=100, max_depth=10, random_state=SEED)
    pipe = make_pipeline(forest).fit(x, y)
    return _convert(pipe, 20, {"features": 20, "classes": 3, "trees": 100, "max_depth": 10})


def gradient_boosting(config: dict[str, Any]) -> tuple[Any, dict]:
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.pipeline import make_pipeline

    x, y = _data(20, 3)
    boost = GradientBoostingClassifier(n_estimators=100, max_depth=3, random_state=SEED)
    pipe = make_pipeline(boost).fit(x, y)
    return _convert(pipe, 20, {"features": 20, "classes": 3, "stages": 100, "max_depth": 3})


def pca(config: dict[str, Any]) -> tuple[Any, dict]:
    from sklearn.decomposition import PCA
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, _ = _data(50, 2)
    pipe = make_pipeline(StandardScaler(), PCA(n_components=10, random_state=SEED)).fit(x)
    return _convert(pipe, 50, {"features": 50, "components": 10})
