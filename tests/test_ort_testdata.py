"""scripts/ort_testdata.py: the models it rebuilds for onnxruntime's Python API tests load
in onnxruntime and in onnxkiln.compat alike, with the inputs and outputs the tests assert."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import onnxkiln.compat as rt

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (test extra)")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ort_testdata.py"
NEEDS_USER_DATA = {"model_with_external_initializer_come_from_user.onnx"}


@pytest.fixture(scope="module")
def testdata(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("ort_testdata", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path_factory.mktemp("python")
    names = module.build(folder, log=lambda line: None)
    return folder / "testdata", names


def _signature(sess):
    return [(a.name, a.type, a.shape) for a in (*sess.get_inputs(), *sess.get_outputs())]


def test_every_model_loads_alike(testdata):
    folder, names = testdata
    models = [n for n in names if n.endswith(".onnx") and n not in NEEDS_USER_DATA]
    assert len(models) >= 20
    for name in models:
        path = str(folder / name)
        assert _signature(rt.InferenceSession(path)) == _signature(ort.InferenceSession(path)), name


def test_ml_models_compute_what_the_tests_assert(testdata):
    folder, _ = testdata
    for runtime in (ort, rt):
        tree = runtime.InferenceSession(str(folder / "tree_ensemble_as_tensor.onnx"))
        x = np.array([[0, 1, 1.7999999523162842, 3], [0, 1, 1.79999995232, 3]], np.float64)
        assert tree.run(None, {"X": x})[0].tolist() == [[0.7284910678863525],
                                                        [0.9134243130683899]]
        vectorize = runtime.InferenceSession(str(folder / "pipeline_vectorize.onnx"))
        got = vectorize.run(None, {"float_input": {0: 25.0, 1: 5.13, 2: 0.0}})[0]
        np.testing.assert_allclose(got, [[49.752754]], rtol=1e-6)
        label = runtime.InferenceSession(str(folder / "LabelEncoder.onnx"))
        assert label.run(None, {"input": np.array([["4"]])})[0].tolist() == [[3]]
