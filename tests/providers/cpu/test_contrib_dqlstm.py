"""com.microsoft DynamicQuantizeLSTM (providers/cpu/contrib_dqlstm.py) against onnxruntime.

Both quantize X and each step's hidden state to uint8 and multiply with the integer weights,
so outputs agree to float rounding (ATOL). onnxruntime runs with one intra-op thread: with
more, it quantizes each thread's batch rows on their own and its results move by about 1e-3
(onnxkiln quantizes the batch as one block, onnxruntime's single-threaded result).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxkiln import InferenceSession
from onnxkiln.errors import SessionError

MS = "com.microsoft"
ATOL = 1e-5  # measured: 1e-6 at most (float rounding; integer products are exact)
RNG = np.random.default_rng(11)


def run_ort_one_thread(model, feeds) -> list[np.ndarray]:
    """onnxruntime's CPU provider with one intra-op thread (the batch quantized as one)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def float_lstm(seq=5, batch=3, inp=4, hidden=6, direction="forward", bias=True, peep=False,
               initial=False, seq_lens=False):
    """A float LSTM model with constant weights; returns (model, feeds)."""
    d = 2 if direction == "bidirectional" else 1
    inits = {"W": RNG.normal(0, 0.5, (d, 4 * hidden, inp)),
             "R": RNG.normal(0, 0.5, (d, 4 * hidden, hidden))}
    names = ["X", "W", "R", "", "", "", "", ""]
    feeds = {"X": RNG.normal(0, 1, (seq, batch, inp)).astype(np.float32)}
    if bias:
        inits["B"], names[3] = RNG.normal(0, 0.3, (d, 8 * hidden)), "B"
    if seq_lens:
        feeds["L"], names[4] = RNG.integers(1, seq + 1, batch).astype(np.int32), "L"
    if initial:
        feeds["H0"] = RNG.normal(0, 0.5, (d, batch, hidden)).astype(np.float32)
        feeds["C0"] = RNG.normal(0, 0.5, (d, batch, hidden)).astype(np.float32)
        names[5:7] = ["H0", "C0"]
    if peep:
        inits["P"], names[7] = RNG.normal(0, 0.3, (d, 3 * hidden)), "P"
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], hidden_size=hidden,
                            direction=direction)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("Y", "Y_h", "Y_c")]
    graph = helper.make_graph([node], "lstm", inputs, outputs,
                              [numpy_helper.from_array(v.astype(np.float32), k)
                               for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, feeds


def quantized(model, tmp_path, per_channel):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, src)
    quantize_dynamic(str(src), str(dst), op_types_to_quantize=["LSTM"], per_channel=per_channel,
                     weight_type=QuantType.QInt8)
    q = onnx.load(dst)
    assert [(n.domain, n.op_type) for n in q.graph.node] == [(MS, "DynamicQuantizeLSTM")]
    return q


def compare(model, feeds, atol=ATOL):
    ours = InferenceSession.builder().from_graph(model).run(dict(feeds))
    theirs = run_ort_one_thread(model, feeds)
    worst = 0.0
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        worst = max(worst, float(np.abs(a - b).max()))
    assert worst <= atol, worst
    return ours


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("kind", [
    {}, {"direction": "reverse"}, {"direction": "bidirectional"}, {"bias": False},
    {"peep": True}, {"initial": True}, {"seq_lens": True},
    {"direction": "bidirectional", "initial": True, "seq_lens": True, "peep": True},
    {"seq": 1, "batch": 1, "inp": 16, "hidden": 32},
    {"seq": 20, "batch": 4, "inp": 8, "hidden": 16},
    {"seq": 12, "batch": 6, "inp": 8, "hidden": 300, "seq_lens": True},
])
def test_quantize_dynamic_models(kind, per_channel, tmp_path):
    model, feeds = float_lstm(**kind)
    q = quantized(model, tmp_path, per_channel)
    ours = compare(q, feeds)
    if kind.get("hidden", 6) > 64:  # a wide layer's quantization error passes 0.1
        return
    floats = InferenceSession.builder().from_graph(model).run(dict(feeds))
    for a, b in zip(ours, floats):  # the int8 weights' rounding only
        np.testing.assert_allclose(a, b, atol=0.1)


def _node_model(w_dtype, per_channel, const_weights=True, seq=4, batch=2, inp=3, hidden=5):
    """DynamicQuantizeLSTM written by hand (uint8 or int8 weights, any zero point)."""
    info = np.iinfo(w_dtype)
    qw = RNG.integers(info.min, info.max + 1, (1, inp, 4 * hidden)).astype(w_dtype)
    qr = RNG.integers(info.min, info.max + 1, (1, hidden, 4 * hidden)).astype(w_dtype)
    shape = (1, 4 * hidden) if per_channel else (1,)
    low, high = (0, 1) if w_dtype == np.int8 else (info.min // 2, info.max // 2)
    params = {
        "W_scale": RNG.uniform(0.002, 0.01, shape).astype(np.float32),
        "W_zero_point": RNG.integers(low, high, shape).astype(w_dtype),
        "R_scale": RNG.uniform(0.002, 0.01, shape).astype(np.float32),
        "R_zero_point": RNG.integers(low, high, shape).astype(w_dtype),
    }
    for name in ("W_zero_point", "R_zero_point"):  # onnxruntime takes one zero point only
        params[name][...] = params[name].flat[0]
    feeds = {"X": RNG.normal(0, 1, (seq, batch, inp)).astype(np.float32)}
    weights = {"W": qw, "R": qr}
    inits = dict(params)
    if const_weights:
        inits.update(weights)
    else:
        feeds.update(weights)
    names = ["X", "W", "R", "", "", "", "", "", *params]
    node = helper.make_node("DynamicQuantizeLSTM", names, ["Y", "Y_h", "Y_c"], domain=MS,
                            hidden_size=hidden)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("Y", "Y_h", "Y_c")]
    graph = helper.make_graph([node], "dq", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)], ir_version=8)
    return model, feeds


@pytest.mark.parametrize("const_weights", [True, False])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("w_dtype", [np.int8, np.uint8])
def test_hand_written(w_dtype, per_channel, const_weights):
    model, feeds = _node_model(w_dtype, per_channel, const_weights)
    ours = compare(model, feeds)
    y, y_h, y_c = ours
    assert y.shape == (4, 1, 2, 5) and np.array_equal(y[-1], y_h)
    assert np.abs(y_c).max() > 0.05  # not a trivially zero state


def test_bad_zero_point_dtype():
    model, feeds = _node_model(np.int8, False)
    for init in model.graph.initializer:
        if init.name == "W_zero_point":
            init.CopyFrom(numpy_helper.from_array(np.zeros(1, np.uint8), "W_zero_point"))
    with pytest.raises(SessionError, match="W_zero_point must be int8"):
        InferenceSession.builder().from_graph(model).run(feeds)


def test_int8_zero_point_must_be_zero():
    model, feeds = _node_model(np.int8, True)
    for init in model.graph.initializer:
        if init.name == "R_zero_point":
            init.CopyFrom(numpy_helper.from_array(np.ones((1, 20), np.int8), "R_zero_point"))
    with pytest.raises(SessionError, match="int8 R needs R_zero_point 0"):
        InferenceSession.builder().from_graph(model).run(feeds)


def test_bad_scale_shape():
    model, feeds = _node_model(np.int8, False, const_weights=False)
    for init in model.graph.initializer:
        if init.name == "R_scale":
            init.CopyFrom(numpy_helper.from_array(np.ones(3, np.float32), "R_scale"))
    with pytest.raises(SessionError, match=r"R_scale must have shape \[1\] or \[1, 20\]"):
        InferenceSession.builder().from_graph(model).run(feeds)


def test_per_channel_zero_points_as_shifted_weights():
    """Distinct uint8 zero points per gate column (onnxruntime takes the first only): the
    result equals onnxruntime's on weights shifted to share one zero point, which have the
    same weight minus zero point everywhere."""
    model, feeds = _node_model(np.uint8, True)
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    q = RNG.integers(60, 190, init["W"].shape).astype(np.uint8)
    zp = RNG.integers(100, 156, (1, 20)).astype(np.uint8)
    for name, value in (("W", q), ("W_zero_point", zp)):
        _replace(model, name, value)
    ours = InferenceSession.builder().from_graph(model).run(dict(feeds))
    shifted = (q.astype(np.int64) - zp[:, None, :] + 128).astype(np.uint8)
    _replace(model, "W", shifted)
    _replace(model, "W_zero_point", np.full((1, 20), 128, np.uint8))
    theirs = run_ort_one_thread(model, feeds)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=0, atol=ATOL)


def _replace(model, name: str, value: np.ndarray) -> None:
    for init in model.graph.initializer:
        if init.name == name:
            init.CopyFrom(numpy_helper.from_array(value, name))


def test_multithreaded_onnxruntime_quantizes_rows_apart():
    """onnxruntime with 2 intra-op threads quantizes each half of a 3-row batch on its own:
    its result moves off its single-threaded one (which onnxkiln equals) by about 1e-3."""
    model, feeds = _node_model(np.int8, False, batch=3, seq=6)
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    two = ort.InferenceSession(model.SerializeToString(), opts,
                               providers=["CPUExecutionProvider"]).run(None, dict(feeds))
    ours = compare(model, feeds)
    assert max(float(np.abs(a - b).max()) for a, b in zip(ours, two)) > 10 * ATOL
