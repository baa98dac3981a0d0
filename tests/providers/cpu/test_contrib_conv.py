"""com.microsoft ConvTransposeWithDynamicPads (contrib_conv.py) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.errors import SessionError
from onnxkiln.testing import node_model, run_ort, run_ours

RNG = np.random.default_rng(8)
OP = "ConvTransposeWithDynamicPads"


def case(nd, pads, bias=True, dtype=np.float32, **attrs):
    group = attrs.get("group", 1)
    feeds = {"x": RNG.standard_normal((2, 4, *([5] * nd))).astype(dtype),
             "w": RNG.standard_normal((4, 3, *([3] * nd))).astype(dtype),
             "p": np.array(pads, np.int64)}
    names = ["x", "w", "p"]
    if bias:
        feeds["b"] = RNG.standard_normal(3 * group).astype(dtype)
        names.append("b")
    return node_model(OP, feeds, domain="com.microsoft", input_names=names, **attrs), feeds


@pytest.mark.parametrize("nd,pads,attrs", [
    (2, [1, 0, 0, 1], {}),
    (2, [2, 1, 1, 2], {"strides": [2, 2]}),
    (1, [1, 2], {"strides": [3], "dilations": [2]}),
    (2, [0, 0, 1, 1], {"group": 2, "output_padding": [1, 1], "strides": [2, 2]}),
    (3, [1, 0, 1, 0, 1, 0], {"strides": [1, 2, 1]}),
])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose_dynamic_pads_matches(nd, pads, attrs, bias):
    m, feeds = case(nd, pads, bias, **attrs)
    ours = run_ours(m, feeds)[0]
    np.testing.assert_allclose(ours, run_ort(m, feeds)[0], rtol=1e-5, atol=1e-5)


def test_conv_transpose_dynamic_pads_change_between_runs():
    from onnxkiln import InferenceSession

    m, feeds = case(2, [0, 0, 0, 0], strides=[2, 2])
    sess = InferenceSession.builder().from_graph(m)
    for pads in ([0, 0, 0, 0], [1, 1, 1, 1], [2, 0, 0, 2]):
        f = {**feeds, "p": np.array(pads, np.int64)}
        np.testing.assert_allclose(sess.run(f)[0], run_ort(m, f)[0], rtol=1e-5, atol=1e-5)


def test_conv_transpose_dynamic_pads_float16():
    m, feeds = case(2, [1, 1, 0, 0], dtype=np.float16)
    np.testing.assert_allclose(run_ours(m, feeds)[0].astype(np.float32),
                               run_ort(m, feeds)[0].astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("pads,match", [([1, 1], "Pads must be int64 of shape"),
                                        ([1, -1, 0, 0], "non-negative")])
def test_conv_transpose_dynamic_pads_refuses_bad_pads(pads, match):
    m, feeds = case(2, pads)
    with pytest.raises(SessionError, match=match):
        run_ours(m, feeds)


def test_conv_transpose_dynamic_pads_requires_pads():
    feeds = {"x": np.zeros((1, 4, 3, 3), np.float32), "w": np.zeros((4, 3, 3, 3), np.float32)}
    m = node_model(OP, feeds, domain="com.microsoft", input_names=["x", "w"])
    with pytest.raises(SessionError, match="Pads input is required"):
        run_ours(m, feeds)
