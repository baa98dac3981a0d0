"""com.microsoft.nchwc models as onnxruntime's own optimizer saves them (ORT_ENABLE_ALL,
optimized_model_filepath): onnxkiln runs them and matches onnxruntime running the same saved
file. The single-op cases against onnxruntime are in tests/contrib/contrib_cases_nchwc.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxkiln import InferenceSession
from onnxkiln.errors import SessionError
from onnxkiln.providers.cpu import _numba
from onnxkiln.providers.cpu.contrib_nchwc import block_size, from_blocked, to_blocked

NCHWC = "com.microsoft.nchwc"
MODELS = Path(__file__).resolve().parents[3] / "bench" / "models"


def _w(rng, name, shape):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def _cnn(kind: str) -> onnx.ModelProto:
    """Small CNNs whose optimized forms hold every nchwc op: "resnet" (NCHW-input conv, Relu
    and Clip fusions, depthwise, 1x1, MaxPool, residual Add+Relu into Sum, pools) and
    "upsample" (channels needing padding, nearest and linear Resize, LeakyRelu)."""
    rng = np.random.default_rng(1)
    mk = helper.make_node
    if kind == "resnet":
        inits = [_w(rng, "w1", (16, 3, 3, 3)), _w(rng, "b1", (16,)), _w(rng, "w2", (16, 1, 3, 3)),
                 _w(rng, "w3", (32, 16, 1, 1)), _w(rng, "b3", (32,)), _w(rng, "w4", (32, 32, 3, 3))]
        nodes = [mk("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
                 mk("Relu", ["c1"], ["r1"]),
                 mk("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=16),
                 mk("Clip", ["c2"], ["r2"]),
                 mk("Conv", ["r2", "w3", "b3"], ["c3"]),
                 mk("MaxPool", ["c3"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
                 mk("Conv", ["p1", "w4"], ["c4"], pads=[1, 1, 1, 1]),
                 mk("Add", ["c4", "p1"], ["a1"]), mk("Relu", ["a1"], ["a2"]),
                 mk("AveragePool", ["a2"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                 mk("GlobalAveragePool", ["p2"], ["g"]), mk("GlobalMaxPool", ["a2"], ["g2"])]
        outs, shape = ["g", "g2", "p2"], [2, 3, 32, 32]
    else:
        inits = [_w(rng, "w1", (20, 3, 3, 3)), _w(rng, "b1", (20,)), _w(rng, "w2", (20, 1, 3, 3)),
                 _w(rng, "w3", (24, 20, 1, 1)), _w(rng, "w4", (8, 24, 1, 1)),
                 numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc")]
        nodes = [mk("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
                 mk("LeakyRelu", ["c1"], ["l1"], alpha=0.2),
                 mk("Conv", ["l1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=20),
                 mk("Conv", ["c2", "w3"], ["c3"]),
                 mk("Resize", ["c3", "", "sc"], ["u1"], mode="nearest",
                    coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
                 mk("Resize", ["u1", "", "sc"], ["u2"], mode="linear",
                    coordinate_transformation_mode="asymmetric"),
                 mk("Resize", ["u2", "", "sc"], ["u3"], mode="linear"),
                 mk("Conv", ["u3", "w4"], ["c4"])]
        outs, shape = ["c4"], [1, 3, 8, 10]
    graph = helper.make_graph(
        nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _optimize(src: Path, dst: Path) -> onnx.ModelProto:
    """onnxruntime's own optimizer output for `src`, saved to `dst`."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(dst)
    so.log_severity_level = 3
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return onnx.load(dst)


def _compare(path: Path, model: onnx.ModelProto, feeds: dict) -> None:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    theirs = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(
        None, feeds)
    for level in ("disabled", "all"):
        session = InferenceSession.builder().optimization(level).from_graph(model)
        for _ in range(3):  # the first run is generic, later ones use the specialisations
            ours = session.run(feeds)
            assert len(ours) == len(theirs)
            for a, b in zip(ours, theirs):
                assert np.asarray(a).shape == b.shape
                np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-4)


def _nchwc_ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node if n.domain == NCHWC}


@pytest.mark.parametrize("numba_on", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("kind,expect", [
    ("resnet", {"Conv", "MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool",
                "ReorderOutput"}),
    ("upsample", {"Conv", "Upsample", "ReorderOutput"}),
])
def test_models_saved_by_onnxruntime(kind, expect, numba_on, tmp_path, monkeypatch):
    monkeypatch.setattr(_numba, "ENABLED", numba_on)
    src = tmp_path / f"{kind}.onnx"
    onnx.save(_cnn(kind), src)
    model = _optimize(src, tmp_path / f"{kind}-opt.onnx")
    assert expect <= _nchwc_ops(model), _nchwc_ops(model)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    _compare(tmp_path / f"{kind}-opt.onnx", model, {"x": x})


@pytest.mark.parametrize("name", ["mobilenetv3-small-ts", "efficientnet-b0-ts"])
def test_bench_cnns_saved_by_onnxruntime(name, tmp_path):
    """Real CNNs: HardSwish/HardSigmoid/Sigmoid fusions, ReorderInput around SE blocks."""
    src = MODELS / f"{name}.onnx"
    if not src.exists():
        pytest.skip(f"{src} is not built here (bench/models is made by the bench scripts)")
    model = _optimize(src, tmp_path / "opt.onnx")
    assert {"Conv", "ReorderInput", "ReorderOutput", "GlobalAveragePool"} <= _nchwc_ops(model)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    _compare(tmp_path / "opt.onnx", model, {model.graph.input[0].name: x})


def test_blocked_layout_round_trip():
    b = block_size()
    x = np.arange(2 * 5 * 2 * 3, dtype=np.float32).reshape(2, 5, 2, 3)
    y = to_blocked(x, b)
    assert y.shape == (2, b, 2, 3)
    flat = y.reshape(2, 1, 2, 3, b)  # memory order [N, Cp/b, H, W, b]
    assert flat[1, 0, 1, 2, 4] == x[1, 4, 1, 2] and (flat[..., 5:] == 0).all()
    np.testing.assert_array_equal(from_blocked(y, b, 5), x)
    nhwc = np.moveaxis(x, 1, -1)
    np.testing.assert_array_equal(from_blocked(to_blocked(nhwc, b, True), b, 5, True), nhwc)


def _node(op, feeds, consts=None, **attrs):
    inputs = list(feeds) + list(consts or {})
    g = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], domain=NCHWC, **attrs)], "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in feeds],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in (consts or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid(NCHWC, 1)], ir_version=8)


@pytest.mark.parametrize("op,feeds,consts,attrs,match", [
    ("ReorderOutput", {"x": np.zeros((1, 5, 2, 2), np.float32)}, None, {"channels": 5},
     "multiple of"),
    ("ReorderOutput", {"x": np.zeros((1, 16, 2, 2), np.float32)}, None, {"channels": 40},
     "does not fit"),
    ("Upsample", {"x": np.zeros((1, 16, 2, 2), np.float32)}, None, {"scales": [1, 2, 2, 2]},
     "N and C scales"),
    ("Conv", {"x": np.zeros((1, 20, 4, 4), np.float32)},
     {"w": np.zeros((16, 20, 1, 1), np.float32)}, {}, "neither under nor a multiple"),
    ("Conv", {"x": np.zeros((1, 16, 4, 4), np.float32)},
     {"w": np.zeros((16, 16, 1, 1), np.float32)}, {"activation": "Gelu"}, "activation"),
])
def test_bad_input_is_refused(op, feeds, consts, attrs, match):
    """Shapes chosen to be wrong for both blocks MLAS uses (8 and 16)."""
    with pytest.raises(SessionError, match=match):
        InferenceSession.builder().optimization("disabled").from_graph(
            _node(op, feeds, consts, **attrs)).run(feeds)


def block_weight(w: np.ndarray, b: int, blocked_in: bool) -> np.ndarray:
    """OIHW (channels multiples of b) to onnxruntime's reordered filter order."""
    o, i, kh, kw = w.shape
    if blocked_in:
        v = w.reshape(o // b, b, i // b, b, kh, kw).transpose(0, 2, 4, 5, 3, 1)
    else:
        v = w.reshape(o // b, b, i, kh, kw).transpose(0, 2, 3, 4, 1)
    return np.ascontiguousarray(v).reshape(w.shape)


def _reblock_filters(model: onnx.ModelProto, old: int, new: int) -> None:
    """Rewrite the nchwc Conv filters of `model` from block `old` to block `new` (for
    channel counts that are multiples of both, so only the data order changes)."""
    inits = {t.name: t for t in model.graph.initializer}
    graph_inputs = {v.name for v in model.graph.input}
    for node in model.graph.node:
        if node.domain != NCHWC or node.op_type != "Conv":
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        blocked_in = node.input[0] not in graph_inputs and group == 1
        tensor = inits[node.input[1]]
        w = numpy_helper.to_array(tensor)
        # block_weight is a permutation here: invert it through the positions it moves
        perm = block_weight(np.arange(w.size, dtype=np.float32).reshape(w.shape), old,
                            blocked_in).astype(np.int64)
        plain = np.empty(w.size, np.float32)
        plain[perm.reshape(-1)] = w.reshape(-1)
        tensor.CopyFrom(numpy_helper.from_array(
            block_weight(plain.reshape(w.shape), new, blocked_in), tensor.name))


def test_block_of_8_as_avx2_machines_write(tmp_path, monkeypatch):
    """The block-8 layout (onnxruntime on AVX2 CPUs), checked on any CPU: the model saved
    here has its filters reordered to block 8 and runs with block 8 against onnxruntime
    on the original file (its channel counts are multiples of 16, so nothing else moves)."""
    from onnxkiln.providers.cpu import contrib_nchwc

    src = tmp_path / "resnet.onnx"
    onnx.save(_cnn("resnet"), src)
    model = _optimize(src, tmp_path / "opt.onnx")
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    theirs = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    _reblock_filters(model, block_size(), 8)
    monkeypatch.setattr(contrib_nchwc, "block_size", lambda: 8)
    ours = InferenceSession.builder().optimization("disabled").from_graph(model).run({"x": x})
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-4)
