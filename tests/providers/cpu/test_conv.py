"""Conv and ConvTranspose kernels against onnxruntime (numpy/float32 where onnxruntime can't)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.registry import REGISTRY
from onnxkiln.testing import assert_matches_ort, make_model, node_model, run_ort, tensor_info

TOL = {np.float32: {"rtol": 1e-4, "atol": 1e-4}, np.float16: {"rtol": 1e-2, "atol": 1e-2}}

# (id, X shape, W shape, attributes); each covers one or more attributes of the spec.
CONV_CASES = [
    ("plain", (1, 4, 7, 7), (6, 4, 3, 3), {}),
    (
        "batch_group_stride_asym_pads",
        (2, 4, 7, 8),
        (6, 2, 3, 3),
        {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1]},
    ),
    ("depthwise", (2, 6, 9, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    (
        "depthwise_stride_dilation_asym",
        (2, 6, 9, 8),
        (6, 1, 3, 3),
        {"group": 6, "pads": [1, 0, 2, 1], "strides": [2, 2], "dilations": [1, 2]},
    ),
    (
        "depthwise_stride3_kernel5x3",
        (1, 5, 11, 9),
        (5, 1, 5, 3),
        {"group": 5, "strides": [3, 2], "pads": [2, 1, 2, 1]},
    ),
    (
        "depthwise_multiplier",
        (1, 6, 9, 8),
        (12, 1, 3, 3),
        {"group": 6, "auto_pad": "SAME_LOWER", "strides": [2, 2]},
    ),
    ("pointwise", (1, 4, 7, 7), (6, 4, 1, 1), {}),
    ("pointwise_group_stride", (2, 4, 7, 7), (6, 2, 1, 1), {"group": 2, "strides": [2, 3]}),
    ("pointwise_padded", (1, 4, 7, 7), (6, 4, 1, 1), {"pads": [1, 1, 0, 0]}),
    ("dilations", (1, 3, 10, 9), (4, 3, 3, 2), {"dilations": [2, 3], "pads": [1, 2, 0, 1]}),
    ("same_upper", (1, 3, 9, 8), (4, 3, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    ("same_lower", (1, 3, 9, 8), (4, 3, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    ("valid", (1, 4, 7, 7), (6, 4, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ("explicit_kernel_shape", (1, 4, 6, 6), (5, 4, 2, 3), {"kernel_shape": [2, 3]}),
    ("conv1d", (2, 3, 11), (5, 3, 3), {"dilations": [2], "strides": [2], "pads": [2, 1]}),
    ("conv1d_depthwise", (1, 4, 11), (4, 1, 3), {"group": 4, "strides": [2], "pads": [2, 1]}),
    (
        "conv3d",
        (1, 2, 5, 6, 7),
        (3, 2, 2, 3, 2),
        {"strides": [1, 2, 1], "pads": [0, 1, 1, 1, 0, 0]},
    ),
    (
        "conv3d_depthwise",
        (1, 4, 5, 6, 7),
        (4, 1, 3, 3, 3),
        {"group": 4, "strides": [2, 1, 2], "pads": [1, 1, 1, 1, 0, 1], "dilations": [1, 2, 1]},
    ),
]

TRANSPOSE_CASES = [
    ("plain", (1, 4, 5, 5), (4, 3, 3, 3), {}),
    ("stride", (2, 4, 5, 5), (4, 3, 3, 3), {"strides": [2, 2]}),
    (
        "asym_pads_output_padding",
        (2, 4, 5, 6),
        (4, 3, 3, 2),
        {"strides": [2, 3], "pads": [1, 0, 2, 1], "output_padding": [1, 2]},
    ),
    (
        "group_dilations",
        (2, 4, 5, 6),
        (4, 2, 3, 2),
        {"group": 2, "strides": [2, 1], "dilations": [2, 3], "pads": [1, 0, 0, 1]},
    ),
    (
        "depthwise_output_shape",
        (1, 4, 5, 6),
        (4, 1, 3, 3),
        {"group": 4, "strides": [2, 2], "output_shape": [10, 12]},
    ),
    ("output_shape_odd", (1, 4, 5, 6), (4, 2, 3, 3), {"strides": [2, 2], "output_shape": [11, 12]}),
    (
        "output_shape_same_upper",
        (1, 4, 5, 6),
        (4, 2, 3, 3),
        {"strides": [2, 2], "output_shape": [10, 11], "auto_pad": "SAME_UPPER"},
    ),
    ("same_upper", (1, 4, 5, 6), (4, 2, 4, 3), {"strides": [3, 2], "auto_pad": "SAME_UPPER"}),
    ("same_lower", (1, 4, 5, 6), (4, 2, 4, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    (
        "same_upper_1x1_clamped",
        (1, 2, 5, 6),
        (2, 2, 1, 1),
        {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    ),
    (
        "valid_output_padding",
        (1, 4, 5, 6),
        (4, 2, 3, 3),
        {"strides": [2, 2], "auto_pad": "VALID", "output_padding": [1, 1]},
    ),
    ("pointwise", (1, 4, 5, 6), (4, 2, 1, 1), {}),
    ("pointwise_stride", (1, 4, 5, 6), (4, 2, 1, 1), {"strides": [2, 2]}),
    ("convt1d", (1, 3, 7), (3, 2, 3), {"strides": [2], "pads": [1, 2]}),
    (
        "convt3d",
        (1, 2, 3, 4, 5),
        (2, 3, 2, 3, 2),
        {"strides": [2, 1, 2], "pads": [0, 1, 1, 1, 0, 0], "output_padding": [1, 0, 1]},
    ),
]


def _case_ids(cases):
    return [c[0] for c in cases]


def _arrays(x_shape, w_shape, n_bias, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(n_bias).astype(dtype)
    return x, w, b


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CONV_CASES, ids=_case_ids(CONV_CASES))
def test_conv_matches_ort(case, dtype):
    _, xs, ws, attrs = case
    x, w, b = _arrays(xs, ws, ws[0], dtype)
    # bias and weights as initializers (the factory's prepared-once path)
    model = node_model("Conv", {"x": x}, initializers={"w": w, "b": b}, **attrs)
    assert_matches_ort(model, {"x": x}, **TOL[dtype])
    # weights as a run-time input, no bias
    model = node_model("Conv", {"x": x, "w": w}, **attrs)
    assert_matches_ort(model, {"x": x, "w": w}, **TOL[dtype])


BIAS_CASES = CONV_CASES[:6] + CONV_CASES[14:]


@pytest.mark.parametrize("case", BIAS_CASES, ids=_case_ids(BIAS_CASES))
def test_conv_runtime_bias(case):
    _, xs, ws, attrs = case
    x, w, b = _arrays(xs, ws, ws[0], np.float32, seed=1)
    feeds = {"x": x, "w": w, "b": b}
    assert_matches_ort(node_model("Conv", feeds, **attrs), feeds, **TOL[np.float32])


@pytest.mark.parametrize("opset", [1, 10, 11, 22])
def test_conv_opsets(opset):
    x, w, b = _arrays((1, 4, 8, 7), (6, 2, 3, 3), 6, np.float32)
    attrs = {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2]}
    model = node_model("Conv", {"x": x}, initializers={"w": w, "b": b}, opset=opset, **attrs)
    if opset < 7:  # onnxruntime has no Conv-1 kernel: compare to the same node at opset 11
        ours = InferenceSession.builder().from_graph(model).run({"x": x})[0]
        ref = node_model("Conv", {"x": x}, initializers={"w": w, "b": b}, opset=11, **attrs)
        np.testing.assert_allclose(ours, run_ort(ref, {"x": x})[0], rtol=1e-4, atol=1e-4)
    else:
        assert_matches_ort(model, {"x": x}, **TOL[np.float32])


def _same_pads(in_sp, k, s, d, upper):
    pads_b, pads_e = [], []
    for size, kk, st, dd in zip(in_sp, k, s, d):
        out = -(-size // st)
        total = max(0, (out - 1) * st + (kk - 1) * dd + 1 - size)
        b = total // 2 if upper else total - total // 2
        pads_b.append(b)
        pads_e.append(total - b)
    return pads_b + pads_e


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("group", [1, 6])
def test_conv_same_with_dilations(auto_pad, group):
    """onnxruntime rejects auto_pad SAME with dilations; compare to its explicit-pads result."""
    x, w, b = _arrays((1, 6, 9, 8), (6, 6 // group, 3, 3), 6, np.float32)
    attrs = {"group": group, "strides": [2, 1], "dilations": [2, 3]}
    model = node_model("Conv", {"x": x}, initializers={"w": w, "b": b}, auto_pad=auto_pad, **attrs)
    ours = InferenceSession.builder().from_graph(model).run({"x": x})[0]
    pads = _same_pads((9, 8), (3, 3), (2, 1), (2, 3), auto_pad == "SAME_UPPER")
    ref = node_model("Conv", {"x": x}, initializers={"w": w, "b": b}, pads=pads, **attrs)
    expected = run_ort(ref, {"x": x})[0]
    assert ours.shape == (1, 6, 5, 8)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("dtype", [np.float64, ml_dtypes.bfloat16])
def test_other_float_types(op, dtype):
    """onnxruntime lacks these types here: compare to its float32 result."""
    x, w, b = _arrays((2, 4, 6, 7), (4, 2, 3, 3), 4, np.float32)
    x, w, b = (a.astype(dtype) for a in (x, w, b))
    attrs = {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2]}
    model = node_model(op, {"x": x}, initializers={"w": w, "b": b}, opset=22, **attrs)
    ours = InferenceSession.builder().from_graph(model).run({"x": x})[0]
    f32 = [a.astype(np.float32) for a in (x, w, b)]
    ref = node_model(op, {"x": f32[0]}, initializers={"w": f32[1], "b": f32[2]}, **attrs)
    expected = run_ort(ref, {"x": f32[0]})[0]
    assert ours.dtype == np.dtype(dtype)
    tol = 1e-5 if dtype == np.float64 else 3e-2
    np.testing.assert_allclose(ours.astype(np.float32), expected, rtol=tol, atol=tol * 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=_case_ids(TRANSPOSE_CASES))
def test_conv_transpose_matches_ort(case, dtype):
    _, xs, ws, attrs = case
    x, w, b = _arrays(xs, ws, ws[1] * attrs.get("group", 1), dtype)
    model = node_model("ConvTranspose", {"x": x}, initializers={"w": w, "b": b}, **attrs)
    assert_matches_ort(model, {"x": x}, **TOL[dtype])
    model = node_model("ConvTranspose", {"x": x, "w": w}, **attrs)
    assert_matches_ort(model, {"x": x, "w": w}, **TOL[dtype])


@pytest.mark.parametrize("opset", [1, 11, 22])
def test_conv_transpose_opsets(opset):
    x, w, b = _arrays((1, 4, 5, 6), (4, 2, 3, 3), 4, np.float32)
    attrs = {"group": 2, "strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 0]}
    inits = {"w": w, "b": b}
    model = node_model("ConvTranspose", {"x": x}, initializers=inits, opset=opset, **attrs)
    if opset < 7:
        ours = InferenceSession.builder().from_graph(model).run({"x": x})[0]
        ref = node_model("ConvTranspose", {"x": x}, initializers=inits, opset=11, **attrs)
        np.testing.assert_allclose(ours, run_ort(ref, {"x": x})[0], rtol=1e-4, atol=1e-4)
    else:
        assert_matches_ort(model, {"x": x}, **TOL[np.float32])


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_plan_cache_per_shape(op):
    """One session, dynamic spatial dims: each shape gets its own plan and right answer."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    node = helper.make_node(op, ["x", "w"], ["y"], **attrs)
    model = make_model(
        [node],
        [tensor_info("x", np.float32, [None, 4, "h", "w"])],
        [tensor_info("y", np.float32, [None, 4, None, None])],
        initializers={"w": w},
    )
    session = InferenceSession.builder().from_graph(model)
    for shape in [(1, 4, 8, 8), (2, 4, 5, 9), (1, 4, 8, 8)]:
        x = rng.standard_normal(shape).astype(np.float32)
        ours = session.run({"x": x})[0]
        np.testing.assert_allclose(ours, run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _build(op, attrs, const_inputs, n_inputs, opset=21):
    schema = onnx.defs.get_schema(op, opset)
    full = dict.fromkeys(schema.attributes)
    full.update(
        {
            k: v.default_value and helper.get_attribute_value(v.default_value)
            for k, v in schema.attributes.items()
            if v.default_value.type
        }
    )
    full.update(attrs)
    info = NodeInfo("n", op, "", opset, full, n_inputs, 1, const_inputs=const_inputs)
    return REGISTRY.resolve("", op, opset).build(info)


@pytest.mark.parametrize(
    "attrs",
    [{"group": 4, "pads": [1, 1, 1, 1]}, {}, {"pads": [1, 0, 0, 1]}],
    ids=["depthwise", "pointwise", "im2col"],
)
def test_conv_never_writes_or_aliases_inputs(attrs):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3) if attrs.get("group") else (4, 4, 1, 1)).astype(np.float32)
    for a in (x, w):
        a.flags.writeable = False
    run = _build("Conv", attrs, (None, w, None), 2)
    y = run(x, w)
    assert not np.shares_memory(y, x) and not np.shares_memory(y, w)
    assert y.flags.writeable


def test_conv_channel_mismatch_raises():
    run = _build("Conv", {"group": 2}, (), 2)
    x = np.zeros((1, 4, 5, 5), np.float32)
    with pytest.raises(ValueError, match="group 2"):
        run(x, np.zeros((4, 4, 3, 3), np.float32))


def test_conv_input_smaller_than_kernel_raises():
    run = _build("Conv", {}, (), 2)
    with pytest.raises(ValueError, match="smaller than"):
        run(np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 1, 3, 3), np.float32))


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("group", [0, -2])
def test_conv_group_below_one_is_refused_not_read_as_one(op, group):
    """onnxruntime refuses group=0 too; reading it as the default would run another model."""
    with pytest.raises(ValueError, match=f"'group' must be >= 1, got {group}"):
        _build(op, {"group": group}, (), 2)
