"""Heavy optional modules load only when something needs them: `import onnxkiln` imports
neither numba, scipy nor torch, and building a session does not import numba (its kernels
load on the first run that uses them). Each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("numba", "scipy", "torch")


def _fresh(code: str) -> dict:
    """Run `code` in a new interpreter (numba switched on) and parse its last output line."""
    env = {k: v for k, v in os.environ.items() if k != "ONNXKILN_NO_NUMBA"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_onnxkiln_loads_no_heavy_module():
    loaded = _fresh(
        "import json, sys\n"
        "import onnxkiln\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n")
    assert loaded == []


_BUILD_THEN_RUN = """
import json, sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import onnxkiln

rng = np.random.default_rng(0)
graph = helper.make_graph(
    [helper.make_node("Conv", ["x", "w"], ["y"], group=4, pads=[1, 1, 1, 1]),
     helper.make_node("LayerNormalization", ["y", "s"], ["t"], axis=-1),
     helper.make_node("Softmax", ["t"], ["u"], axis=-1)],
    "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 7])],
    [helper.make_tensor_value_info("u", TensorProto.FLOAT, None)],
    [numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "w"),
     numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "s")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
session = onnxkiln.InferenceSession.builder().device("cpu").from_graph(model)
built = "numba" in sys.modules
(u,) = session.run({"x": rng.standard_normal((1, 4, 6, 7)).astype(np.float32)})
print(json.dumps({"built": built, "ran": "numba" in sys.modules,
                  "sums": u.sum(axis=-1).round(5).tolist()}))
"""


def test_building_a_session_does_not_import_numba():
    pytest.importorskip("numba", reason="numba (the `fast` extra) is not installed")
    found = _fresh(_BUILD_THEN_RUN)
    assert not found["built"], "building the session imported numba"
    assert found["ran"], "the run did not load the numba kernels"
    assert found["sums"] == [[[1.0] * 6] * 4]  # softmax rows
