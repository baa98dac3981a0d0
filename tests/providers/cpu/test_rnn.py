"""RNN, GRU and LSTM against onnxruntime (layout 1 and float16 against our own layout 0)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.registry import REGISTRY
from onnxkiln.testing import assert_matches_ort, node_model

RNG = np.random.default_rng(1234)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
OPS = list(GATES)


def make_case(op, *, direction="forward", T=4, B=3, n_in=5, H=6, bias=True, seq=None,
              init=False, peep=False, layout=0, dtype=np.float32, opset=22, n_out=None,
              **attrs):
    """(model, feeds) for one recurrent node with random weights."""
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    x_shape = (T, B, n_in) if layout == 0 else (B, T, n_in)
    feeds = {
        "X": RNG.standard_normal(x_shape).astype(dtype),
        "W": (RNG.standard_normal((d, g * H, n_in)) * 0.5).astype(dtype),
        "R": (RNG.standard_normal((d, g * H, H)) * 0.5).astype(dtype),
    }
    names = ["X", "W", "R"]
    if bias:
        feeds["B"] = RNG.standard_normal((d, 2 * g * H)).astype(dtype)
    names.append("B" if bias else "")
    if seq is not None:
        feeds["L"] = np.array(seq, np.int32)
    names.append("L" if seq is not None else "")
    state_shape = (d, B, H) if layout == 0 else (B, d, H)
    if init:
        feeds["h0"] = RNG.standard_normal(state_shape).astype(dtype)
    names.append("h0" if init else "")
    if op == "LSTM":
        if init:
            feeds["c0"] = RNG.standard_normal(state_shape).astype(dtype)
        names.append("c0" if init else "")
        if peep:
            feeds["P"] = RNG.standard_normal((d, 3 * H)).astype(dtype)
        names.append("P" if peep else "")
    while names[-1] == "":
        names.pop()
    if layout:
        attrs["layout"] = layout
    n_out = n_out or (3 if op == "LSTM" else 2)
    model = node_model(op, feeds, n_outputs=n_out, opset=opset, input_names=names,
                       hidden_size=H, direction=direction, **attrs)
    return model, feeds


def ours(model, feeds):
    return InferenceSession.builder().from_graph(model).run(dict(feeds))


# ----------------------------------------------------------------------------- vs onnxruntime


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize(
    "config",
    [
        {},
        {"bias": False},
        {"init": True},
        {"seq": [4, 2, 3], "init": True},
        {"seq": [1, 4, 0], "init": True},
        {"clip": 0.5, "init": True},
        {"T": 1, "B": 1, "H": 1},
    ],
    ids=["plain", "nobias", "init", "seqlens", "seqlens_zero", "clip", "tiny"],
)
def test_matches_ort(op, direction, config):
    model, feeds = make_case(op, direction=direction, **config)
    assert_matches_ort(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [7, 14, 22])
def test_opsets(op, opset):
    model, feeds = make_case(op, opset=opset, init=True)
    assert_matches_ort(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", OPS)
def test_float64_matches_float32(op):
    # onnxruntime's CPU recurrent kernels are float32 only
    model32, feeds32 = make_case(op, direction="bidirectional", seq=[2, 4, 3], init=True)
    model64, _ = make_case(op, direction="bidirectional", seq=[2, 4, 3], init=True,
                           dtype=np.float64)
    feeds64 = {k: v.astype(np.float64) if v.dtype == np.float32 else v
               for k, v in feeds32.items()}
    for a, b in zip(ours(model64, feeds64), ours(model32, feeds32)):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("config", [{}, {"seq": [2, 4, 1]}, {"clip": 0.3}])
def test_lstm_peepholes(direction, config):
    model, feeds = make_case("LSTM", peep=True, init=True, direction=direction, **config)
    assert_matches_ort(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("peep", [False, True])
def test_lstm_input_forget(peep):
    model, feeds = make_case("LSTM", input_forget=1, peep=peep, init=True)
    assert_matches_ort(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("seq", [None, [3, 1, 4]])
def test_gru_linear_before_reset(direction, seq):
    model, feeds = make_case("GRU", linear_before_reset=1, init=True, direction=direction,
                             seq=seq)
    assert_matches_ort(model, feeds, rtol=1e-4, atol=1e-5)


ACTIVATIONS = [
    ("Relu", None, None), ("Tanh", None, None), ("Sigmoid", None, None),
    ("Affine", 0.3, 0.7), ("LeakyRelu", None, None), ("LeakyRelu", 0.3, None),
    ("ThresholdedRelu", 0.3, None), ("ScaledTanh", 0.6, 0.7), ("HardSigmoid", None, None),
    ("HardSigmoid", 0.3, 0.4), ("Elu", None, None), ("Elu", 0.5, None),
    ("Softsign", None, None), ("Softplus", None, None),
]


@pytest.mark.parametrize(("act", "alpha", "beta"), ACTIVATIONS)
def test_rnn_activations(act, alpha, beta):
    attrs = {"activations": [act]}
    if alpha is not None:
        attrs["activation_alpha"] = [alpha]
    if beta is not None:
        attrs["activation_beta"] = [beta]
    model, feeds = make_case("RNN", init=True, **attrs)
    assert_matches_ort(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("op", "acts", "alphas", "betas", "direction"),
    [
        ("LSTM", ["HardSigmoid", "ScaledTanh", "LeakyRelu"], [0.3, 0.6, 0.2], [0.4, 0.5],
         "forward"),
        ("LSTM", ["Relu", "Affine", "Elu"], [0.3, 0.6], [0.4], "forward"),
        ("GRU", ["HardSigmoid", "ScaledTanh", "Sigmoid", "Tanh"], [0.3, 0.6], [0.4, 0.5],
         "bidirectional"),
        ("RNN", ["Relu", "Tanh"], [], [], "bidirectional"),
    ],
)
def test_activation_lists(op, acts, alphas, betas, direction):
    attrs = {"activations": acts}
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    model, feeds = make_case(op, direction=direction, init=True, **attrs)
    assert_matches_ort(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("act", "explicit"),
    [("Affine", ([1.0], [0.0])), ("ThresholdedRelu", ([1.0], [])),
     ("ScaledTanh", ([1.0], [1.0]))],
)
def test_activation_spec_defaults(act, explicit):
    # onnxruntime uses 0 for these defaults; we follow the spec's ONNX operator defaults
    base, feeds = make_case("RNN", init=True, activations=[act])
    alpha, beta = explicit
    attrs = {"activation_alpha": alpha}
    if beta:
        attrs["activation_beta"] = beta
    got = ours(base, feeds)
    want = ours(make_explicit(base, attrs), feeds)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_activations_given_once_serve_both_directions():
    short, feeds = make_case("GRU", direction="bidirectional", activations=["Sigmoid", "Softsign"])
    full = make_explicit(short, {"activations": ["Sigmoid", "Softsign"] * 2})
    for a, b in zip(ours(short, feeds), ours(full, feeds)):
        np.testing.assert_array_equal(a, b)


def make_explicit(model, attrs):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    node = m.graph.node[0]
    keep = [a for a in node.attribute if a.name not in attrs]
    del node.attribute[:]
    node.attribute.extend(keep)
    for k, v in attrs.items():
        node.attribute.append(helper.make_attribute(k, v))
    return m


# ----------------------------------------------------------------------------- layout, dtypes


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_layout1_matches_layout0(op, direction):
    # onnxruntime does not implement layout=1; compare with our layout 0 on transposed data
    model1, feeds1 = make_case(op, layout=1, init=True, seq=[3, 4, 1], direction=direction,
                               opset=14)
    model0, _ = make_case(op, init=True, seq=[3, 4, 1], direction=direction, opset=14)
    feeds0 = dict(feeds1)
    feeds0["X"] = feeds1["X"].transpose(1, 0, 2)
    for k in ("h0", "c0"):
        if k in feeds1:
            feeds0[k] = feeds1[k].transpose(1, 0, 2)
    out1 = ours(model1, feeds1)
    out0 = ours(model0, feeds0)
    np.testing.assert_allclose(out1[0], out0[0].transpose(2, 0, 1, 3), rtol=1e-6)
    for a, b in zip(out1[1:], out0[1:]):
        np.testing.assert_allclose(a, b.transpose(1, 0, 2), rtol=1e-6)
    assert out1[0].shape == (3, 4, 2 if direction == "bidirectional" else 1, 6)


@pytest.mark.parametrize("op", OPS)
def test_float16_matches_float32(op):
    model32, feeds32 = make_case(op, init=True, seq=[4, 2, 3], direction="bidirectional")
    feeds16 = {k: v.astype(np.float16) if v.dtype == np.float32 else v
               for k, v in feeds32.items()}
    model16, _ = make_case(op, init=True, seq=[4, 2, 3], direction="bidirectional",
                           dtype=np.float16)
    ref = ours(model32, {k: v.astype(np.float32) if v.dtype == np.float16 else v
                         for k, v in feeds16.items()})
    got = ours(model16, feeds16)
    for a, b in zip(got, ref):
        assert a.dtype == np.float16
        np.testing.assert_allclose(a.astype(np.float32), b, rtol=2e-3, atol=2e-3)


def test_opset1_matches_opset7():
    model1, feeds = make_case("LSTM", opset=1, init=True)
    model7, _ = make_case("LSTM", opset=7, init=True)
    for a, b in zip(ours(model1, feeds), ours(model7, feeds)):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- semantics


def test_seq_lens_zero_past_end_and_last_state():
    model, feeds = make_case("GRU", seq=[2, 4, 1], init=True, direction="bidirectional")
    y, y_h = ours(model, feeds)
    assert np.all(y[2:, :, 0] == 0) and np.all(y[1:, :, 2] == 0)
    np.testing.assert_array_equal(y_h[0, 0], y[1, 0, 0])  # forward: last valid step
    np.testing.assert_array_equal(y_h[1, 0], y[0, 1, 0])  # reverse: first step


@pytest.mark.parametrize("op", OPS)
def test_absent_outputs(op):
    model, feeds = make_case(op, init=True)
    full = ours(model, feeds)
    node = model.graph.node[0]
    node.output[0] = ""
    del model.graph.output[0]
    got = ours(model, feeds)
    for a, b in zip(got, full[1:]):
        np.testing.assert_array_equal(a, b)


def test_only_y_output():
    model, feeds = make_case("LSTM", n_out=1, init=True)
    assert_matches_ort(model, feeds, rtol=1e-4, atol=1e-5)


def test_inputs_not_modified():
    model, feeds = make_case("LSTM", init=True, peep=True, seq=[4, 2, 3])
    copies = {k: v.copy() for k, v in feeds.items()}
    ours(model, feeds)
    for k in feeds:
        np.testing.assert_array_equal(feeds[k], copies[k])


def gru_kernel(n_inputs=6):
    info = NodeInfo(name="n", op_type="GRU", domain="", opset=22,
                    attrs={"direction": "forward", "layout": 0, "linear_before_reset": 0,
                           "hidden_size": None},
                    n_inputs=n_inputs, n_outputs=2, input_present=(True,) * n_inputs,
                    output_present=(True, True))
    return REGISTRY.resolve("", "GRU", 22).build(info)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"R": np.zeros((1, 18, 5), np.float32)}, "R must have shape"),
        ({"W": np.zeros((1, 18, 4), np.float32)}, "W must have"),
        ({"B": np.zeros((1, 30), np.float32)}, "B must have"),
        ({"L": np.array([5, 1, 1], np.int32)}, "sequence_lens"),
        ({"L": np.array([4, 1], np.int32)}, "sequence_lens"),
        ({"h0": np.zeros((1, 2, 6), np.float32)}, "initial state"),
        ({"X": np.zeros((4, 3), np.float32)}, "X must be 3-D"),
    ],
)
def test_bad_shapes(change, match):
    _, feeds = make_case("GRU", init=True, seq=[4, 4, 4])
    feeds.update(change)
    run = gru_kernel()
    with pytest.raises(ValueError, match=match):
        run(feeds["X"], feeds["W"], feeds["R"], feeds["B"], feeds["L"], feeds["h0"])


def test_unknown_activation():
    model, feeds = make_case("RNN", activations=["Swish"])
    with pytest.raises(Exception, match="unsupported activation"):
        InferenceSession.builder().from_graph(model).run(feeds)
