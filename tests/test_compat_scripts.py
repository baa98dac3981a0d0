"""Scripts written for onnxruntime run on onnxkiln.compat after changing only the import.

Each script below is kept as onnxruntime users write it (`import onnxruntime as rt`).
The test runs the text as is, then with that one line replaced by
`import onnxkiln.compat as rt`, and compares what both runs computed.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (test extra)")

ORT_IMPORT = "import onnxruntime as rt"
KILN_IMPORT = "import onnxkiln.compat as rt"

# onnxruntime's "Get started with scikit-learn" example (train, convert with skl2onnx,
# predict labels and probabilities), verbatim apart from max_iter and file handling.
SKLEARN_SCRIPT = """
import numpy
from sklearn.datasets import load_iris
from sklearn.model_selection import train_test_split
from sklearn.linear_model import LogisticRegression
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType
import onnxruntime as rt

iris = load_iris()
X, y = iris.data, iris.target
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
clr = LogisticRegression(max_iter=500)
clr.fit(X_train, y_train)

initial_type = [("float_input", FloatTensorType([None, 4]))]
onx = convert_sklearn(clr, initial_types=initial_type)
with open("logreg_iris.onnx", "wb") as f:
    f.write(onx.SerializeToString())

sess = rt.InferenceSession("logreg_iris.onnx", providers=rt.get_available_providers())
input_name = sess.get_inputs()[0].name
label_name = sess.get_outputs()[0].name
pred_onx = sess.run([label_name], {input_name: X_test.astype(numpy.float32)})[0]

prob_name = sess.get_outputs()[1].name
prob_rt = sess.run([prob_name], {input_name: X_test.astype(numpy.float32)})[0]

onx_nozip = convert_sklearn(clr, initial_types=initial_type,
                            options={id(clr): {"zipmap": False}})
sess2 = rt.InferenceSession(onx_nozip.SerializeToString(), providers=["CPUExecutionProvider"])
label, probabilities = sess2.run(None, {"float_input": X_test.astype(numpy.float32)})
"""

# what optimum's ORTModelForFeatureExtraction does around the session, plus mean pooling
# as sentence-transformers does it; the model file is a BERT encoder exported unfused.
OPTIMUM_SCRIPT = """
import numpy as np
import onnxruntime as rt

options = rt.SessionOptions()
options.graph_optimization_level = rt.GraphOptimizationLevel.ORT_ENABLE_ALL
options.intra_op_num_threads = 2
session = rt.InferenceSession(
    "bert_encoder.onnx", sess_options=options,
    providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
input_names = {inp.name: i for i, inp in enumerate(session.get_inputs())}
output_names = {out.name: i for i, out in enumerate(session.get_outputs())}
device = "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"

# tokenizer output: two sentences, the first padded
input_ids = np.array([[1, 17, 42, 7, 2, 0, 0, 0],
                      [1, 5, 9, 11, 13, 21, 8, 2]], dtype=np.int64)
attention_mask = (input_ids != 0).astype(np.int64)
onnx_inputs = {"input_ids": input_ids, "attention_mask": attention_mask,
               "token_type_ids": np.zeros_like(input_ids)}
onnx_inputs = {k: v for k, v in onnx_inputs.items() if k in input_names}

outputs = session.run(None, onnx_inputs)
last_hidden_state = outputs[output_names["last_hidden_state"]]
pooler_output = outputs[output_names["pooler_output"]]

mask = attention_mask[..., None].astype(np.float32)
embeddings = (last_hidden_state * mask).sum(1) / mask.sum(1)
embeddings = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)

(hidden_only,) = session.run(["last_hidden_state"], onnx_inputs)

io_binding = session.io_binding()
for name, value in onnx_inputs.items():
    io_binding.bind_cpu_input(name, value)
io_binding.bind_output("last_hidden_state")
session.run_with_iobinding(io_binding)
bound_hidden = io_binding.copy_outputs_to_cpu()[0]
"""


def _run(script: str, module_import: str, folder, monkeypatch) -> dict:
    text = script.replace(ORT_IMPORT, module_import)
    changed = [a for a, b in zip(script.splitlines(), text.splitlines()) if a != b]
    assert changed == [ORT_IMPORT] or module_import == ORT_IMPORT
    monkeypatch.chdir(folder)
    namespace: dict = {"__name__": "__main__"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CUDA unavailable, sklearn convergence...
        exec(compile(text, f"<{module_import}>", "exec"), namespace)
    return namespace


def _both(script: str, tmp_path, monkeypatch) -> tuple[dict, dict]:
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    theirs = _run(script, ORT_IMPORT, tmp_path, monkeypatch)
    ours = _run(script, KILN_IMPORT, tmp_path, monkeypatch)
    assert ours["rt"].__name__ == "onnxkiln.compat"
    return ours, theirs


def test_sklearn_getting_started_script(tmp_path, monkeypatch):
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (test extra)")
    pytest.importorskip("skl2onnx", reason="skl2onnx is not installed (test extra)")
    ours, theirs = _both(SKLEARN_SCRIPT, tmp_path, monkeypatch)

    assert [(a.name, a.type, a.shape) for a in ours["sess"].get_outputs()] == [
        (a.name, a.type, a.shape) for a in theirs["sess"].get_outputs()]
    np.testing.assert_array_equal(ours["pred_onx"], theirs["pred_onx"])
    np.testing.assert_array_equal(ours["pred_onx"], ours["clr"].predict(ours["X_test"]))

    assert len(ours["prob_rt"]) == len(theirs["prob_rt"]) == len(ours["X_test"])
    for p, q in zip(ours["prob_rt"], theirs["prob_rt"]):
        assert sorted(p) == sorted(q) == [0, 1, 2]
        for k in q:
            assert p[k] == pytest.approx(q[k], rel=1e-5, abs=1e-6)

    np.testing.assert_array_equal(ours["label"], theirs["label"])
    np.testing.assert_allclose(ours["probabilities"], theirs["probabilities"],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours["probabilities"],
                               ours["clr"].predict_proba(ours["X_test"]), rtol=1e-4, atol=1e-5)


def test_optimum_style_feature_extraction_script(tmp_path, monkeypatch):
    from onnxkiln import zoo

    onnx.save(zoo.bert_encoder(), tmp_path / "bert_encoder.onnx")
    ours, theirs = _both(OPTIMUM_SCRIPT, tmp_path, monkeypatch)

    assert ours["device"] == theirs["device"]
    assert ours["input_names"] == theirs["input_names"] == {"input_ids": 0,
                                                            "attention_mask": 1}
    for name in ("last_hidden_state", "pooler_output", "embeddings", "hidden_only",
                 "bound_hidden"):
        assert ours[name].dtype == theirs[name].dtype == np.float32, name
        assert ours[name].shape == theirs[name].shape, name
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    np.testing.assert_array_equal(ours["hidden_only"], ours["last_hidden_state"])
    np.testing.assert_array_equal(ours["bound_hidden"], ours["last_hidden_state"])


def test_unchanged_script_under_python_m_onnxkiln_compat(tmp_path, monkeypatch):
    """The script keeps `import onnxruntime as rt` and runs on onnxkiln all the same."""
    import subprocess
    import sys

    from onnxkiln import zoo

    onnx.save(zoo.bert_encoder(), tmp_path / "bert_encoder.onnx")
    script = tmp_path / "feature_extraction.py"
    script.write_text(OPTIMUM_SCRIPT + (
        "\nnp.savez('out.npz', embeddings=embeddings, bound_hidden=bound_hidden)"
        "\nprint(rt.__name__, rt.__version__)\n"))
    done = subprocess.run([sys.executable, "-m", "onnxkiln.compat", str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["onnxkiln.compat", "1.32.0"]
    ours = np.load(tmp_path / "out.npz")
    theirs = _run(OPTIMUM_SCRIPT, ORT_IMPORT, tmp_path, monkeypatch)
    for name in ("embeddings", "bound_hidden"):
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
