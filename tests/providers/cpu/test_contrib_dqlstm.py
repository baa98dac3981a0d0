"""com.microsoft DynamicQuantizeLSTM (providers/cpu/contrib_dqlstm.py) against onnxruntime.

onnxruntime quantizes X and each hidden state to uint8; onnxkiln quantizes X the same way but
keeps the hidden state in float32, so outputs agree within that rounding (ATOL), not exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxkiln import InferenceSession
from onnxkiln.errors import SessionError
from onnxkiln.testing import run_ort

MS = "com.microsoft"
ATOL = 2e-2
RNG = np.random.default_rng(11)


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
    theirs = run_ort(model, feeds)
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
])
def test_quantize_dynamic_models(kind, per_channel, tmp_path):
    model, feeds = float_lstm(**kind)
    q = quantized(model, tmp_path, per_channel)
    ours = compare(q, feeds)
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


def test_per_channel_zero_points_as_dequantized_lstm():
    """Distinct uint8 zero points per gate column (onnxruntime takes one only): the result is
    the onnx LSTM's with the dequantized weights and X in uint8 steps."""
    from onnxkiln.providers.cpu.contrib_dqlstm import _uint8_steps

    model, feeds = _node_model(np.uint8, True)
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    zp = RNG.integers(100, 156, (1, 20)).astype(np.uint8)
    for i in model.graph.initializer:
        if i.name == "W_zero_point":
            i.CopyFrom(numpy_helper.from_array(zp, "W_zero_point"))
    ours = InferenceSession.builder().from_graph(model).run(dict(feeds))

    def dequantized(q, scale, zero):
        w = (q.astype(np.float32) - zero[:, None, :].astype(np.float32)) * scale[:, None, :]
        return w.transpose(0, 2, 1)

    w = dequantized(init["W"], init["W_scale"], zp)
    r = dequantized(init["R"], init["R_scale"], init["R_zero_point"])
    node = helper.make_node("LSTM", ["X", "W", "R"], ["Y", "Y_h", "Y_c"], hidden_size=5)
    graph = helper.make_graph(
        [node], "f", [helper.make_tensor_value_info("X", TensorProto.FLOAT, (4, 2, 3))],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h", "Y_c")],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R")])
    reference = run_ort(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                          ir_version=8), {"X": _uint8_steps(feeds["X"])})
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
