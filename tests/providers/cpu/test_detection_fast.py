"""NonMaxSuppression's numba loop (classes of many boxes) against the numpy path and
onnxruntime: the same boxes kept, in the same order."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.providers.cpu import _numba
from onnxkiln.testing import make_model, tensor_info

pytest.importorskip("numba", reason="the numba NMS loop needs numba")


def _model(center: int):
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", "score"],
                            ["sel"], center_point_box=center)
    return make_model([node], [tensor_info("boxes", np.float32, [1, None, 4]),
                               tensor_info("scores", np.float32, [1, None, None]),
                               tensor_info("limit", np.int64, [1]),
                               tensor_info("iou", np.float32, [1]),
                               tensor_info("score", np.float32, [1])],
                      [tensor_info("sel", np.int64, [None, 3])], opset=11)


@pytest.mark.parametrize(("n", "classes", "iou", "limit", "center"), [
    (3000, 1, 0.5, 10_000, 0), (5000, 1, 0.3, 200, 0), (2000, 1, 0.7, 10_000, 1),
    (300, 1, 0.45, 50, 0)])
def test_many_boxes_keep_what_onnxruntime_keeps(n, classes, iou, limit, center, monkeypatch):
    rng = np.random.default_rng(n)
    xy = rng.random((n, 2)).astype(np.float32) * 300
    wh = rng.random((n, 2)).astype(np.float32) * 50
    boxes = (np.concatenate([xy, wh], 1) if center else np.concatenate([xy, xy + wh], 1))[None]
    scores = rng.random((1, classes, n)).astype(np.float32)
    scores[0, 0, ::7] = scores[0, 0, 0]  # ties: lower index first
    feeds = {"boxes": boxes, "scores": scores, "limit": np.array([limit], np.int64),
             "iou": np.array([iou], np.float32), "score": np.array([0.05], np.float32)}
    model = _model(center)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    fast = InferenceSession.from_graph(model).run(feeds)[0]
    monkeypatch.setattr(_numba, "ENABLED", False)
    plain = InferenceSession.from_graph(model).run(feeds)[0]
    np.testing.assert_array_equal(fast, plain)
    np.testing.assert_array_equal(fast, want)
    assert len(fast) == min(limit, len(want)) and len(fast) > 0
