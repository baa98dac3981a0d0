"""Softmax family, normalizations, Dropout and LRN against onnxruntime (or numpy)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxkiln.testing import assert_matches_ort, build_kernel, node_model, run_ort
from onnxkiln.testing import run_ours as ours


def build(op, opset, attrs=None, *, const=(), n_inputs=1, n_outputs=1):
    """A kernel straight from the CPU registry."""
    return build_kernel(op, opset, attrs, const=const, n_inputs=n_inputs, n_outputs=n_outputs)


RNG = np.random.default_rng(4321)
TOL = {np.float32: (1e-5, 1e-5), np.float64: (1e-10, 1e-12), np.float16: (1e-3, 2e-3)}


def rand(shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def positive(shape, dtype=np.float32):
    return RNG.uniform(0.5, 2.0, size=shape).astype(dtype)



# ------------------------------------------------------------------- Softmax, LogSoftmax, Hardmax

SOFTMAX_OPS = ["Softmax", "LogSoftmax", "Hardmax"]


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3, None])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_family_axes(op, opset, axis, dtype):
    if opset == 1 and axis is not None and axis < 0:
        pytest.skip("negative axes start at opset 11")
    if opset == 1 and dtype == np.float16:
        pytest.skip("onnxruntime inserts an opset-1 Cast it cannot load for float16 at opset 1")
    feeds = {"x": rand((2, 3, 4, 5), dtype, scale=3.0)}
    attrs = {} if axis is None else {"axis": axis}
    assert_matches_ort(node_model(op, feeds, opset=opset, **attrs), feeds, *TOL[dtype])


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("shape", [(7,), (3, 1), (1, 6), (0, 5), (4, 0)])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_family_small_and_empty(op, shape, opset):
    if op == "Hardmax" and 0 in shape and opset == 11:
        pytest.skip("onnxruntime rejects an empty Hardmax-11 input")
    feeds = {"x": rand(shape)}
    attrs = {"axis": 0} if len(shape) == 1 else {}
    assert_matches_ort(node_model(op, feeds, opset=opset, **attrs), feeds)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_is_stable_for_large_inputs(op):
    feeds = {"x": rand((3, 50), scale=1000.0)}
    (y,) = assert_matches_ort(node_model(op, feeds, opset=13), feeds, 1e-5, 1e-4)
    assert np.isfinite(y).all()


def test_softmax_float64_and_hardmax_ties():
    feeds = {"x": rand((4, 6), np.float64)}
    assert_matches_ort(node_model("Softmax", feeds, opset=13, axis=0), feeds, *TOL[np.float64])
    feeds = {"x": np.array([[1, 3, 3, 0], [2, 2, 2, 2]], np.float32)}
    (y,) = assert_matches_ort(node_model("Hardmax", feeds, opset=13), feeds)
    np.testing.assert_array_equal(y, [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_softmax_bfloat16_against_float32():
    x = rand((3, 8)).astype(ml_dtypes.bfloat16)
    run = build("Softmax", 13, {"axis": -1})
    y = run(x)
    assert y.dtype == ml_dtypes.bfloat16
    xf = x.astype(np.float32)
    ref = np.exp(xf - xf.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_float16_rounds_once_from_float32_as_onnxruntime(op, axis):
    # wide rows: evaluated step by step in float16 the sum drifts and most values move
    x = rand((4, 512, 3), np.float16, scale=3.0)
    y = ours(node_model(op, {"x": x}, opset=13, axis=axis), {"x": x})[0]
    xf = x.astype(np.float32)
    shifted = xf - xf.max(axis, keepdims=True)
    total = np.exp(shifted).sum(axis, keepdims=True)
    ref = shifted - np.log(total) if op == "LogSoftmax" else np.exp(shifted) / total
    assert y.dtype == np.float16
    assert np.mean(y == ref.astype(np.float16)) > 0.99  # rounding ties aside, bit for bit
    (ort_y,) = run_ort(node_model(op, {"x": x}, opset=13, axis=axis), {"x": x})
    np.testing.assert_allclose(y.astype(np.float32), ort_y.astype(np.float32), rtol=2 ** -10,
                               atol=1e-6)
    assert np.mean(y == ort_y) > 0.99


def test_softmax_non_contiguous_input():
    x = rand((5, 4, 3)).transpose(2, 0, 1)
    y = build("Softmax", 13, {"axis": -1})(x)
    ref = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(y, ref / ref.sum(-1, keepdims=True), rtol=1e-6)


# ---------------------------------------------------------------------------- BatchNormalization


def bn_feeds(shape, dtype, c=None):
    c = shape[1] if c is None and len(shape) > 1 else (c or 1)
    return {
        "x": rand(shape, dtype),
        "scale": rand((c,), dtype),
        "b": rand((c,), dtype),
        "mean": rand((c,), dtype),
        "var": positive((c,), dtype),
    }


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (1, 2, 2, 3, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_batchnorm_inference(opset, shape, dtype):
    feeds = bn_feeds(shape, dtype)
    model = node_model("BatchNormalization", feeds, opset=opset, epsilon=1e-3)
    assert_matches_ort(model, feeds, *TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_batchnorm_constant_params(dtype):
    feeds = bn_feeds((2, 4, 3, 3), dtype)
    x = {"x": feeds.pop("x")}
    model = node_model("BatchNormalization", x, opset=15, initializers=feeds)
    assert_matches_ort(model, x, *TOL[dtype])
    x2 = {"x": rand((1, 4, 5), dtype)}  # same node, another rank: the fold is redone per rank
    model = node_model("BatchNormalization", x2, opset=15, initializers=feeds)
    assert_matches_ort(model, x2, *TOL[dtype])


def test_batchnorm_1d_input_has_one_channel():
    feeds = bn_feeds((6,), np.float32)
    (y,) = ours(node_model("BatchNormalization", feeds, opset=15), feeds)
    f = feeds
    ref = (f["x"] - f["mean"]) / np.sqrt(f["var"] + 1e-5) * f["scale"] + f["b"]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_batchnorm_training_mode_outputs(shape, dtype):
    feeds = bn_feeds(shape, dtype)
    model = node_model(
        "BatchNormalization", feeds, n_outputs=3, opset=15, training_mode=1, momentum=0.8
    )
    rtol, atol = TOL[dtype]
    assert_matches_ort(model, feeds, rtol * 3, atol * 3)


def test_batchnorm_opset9_training_outputs():
    feeds = bn_feeds((3, 2, 4), np.float32)
    model = node_model("BatchNormalization", feeds, n_outputs=5, opset=9, momentum=0.7)
    assert_matches_ort(model, feeds, 1e-5, 1e-5)


@pytest.mark.parametrize("opset", [6, 7])
def test_batchnorm_spatial_zero_against_numpy(opset):
    x = rand((2, 3, 4))
    p = {k: rand((3, 4)) for k in ("scale", "b", "mean")}
    p["var"] = positive((3, 4))
    feeds = {"x": x, **p}
    attrs = {"spatial": 0, "epsilon": 1e-3}
    if opset == 6:
        attrs["is_test"] = 1
    (y,) = ours(node_model("BatchNormalization", feeds, opset=opset, **attrs), feeds)
    ref = (x - p["mean"]) / np.sqrt(p["var"] + 1e-3) * p["scale"] + p["b"]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_batchnorm_bad_param_size_is_clear():
    run = build(
        "BatchNormalization", 15, {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0}, n_inputs=5
    )
    f = bn_feeds((2, 3, 4), np.float32, c=3)
    with pytest.raises(ValueError, match="scale must have 3 elements"):
        run(f["x"], rand((4,)), f["b"], f["mean"], f["var"])


# ---------------------------------------------------------------------------- LayerNormalization


@pytest.mark.parametrize("axis", [-1, -2, 1, 0, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layernorm(axis, dtype, with_bias):
    shape = (2, 3, 8)
    tail = shape[axis:]
    feeds = {"x": rand(shape, dtype, scale=2.0) + 1, "scale": rand(tail, dtype)}
    if with_bias:
        feeds["b"] = rand(tail, dtype)
    model = node_model("LayerNormalization", feeds, n_outputs=3, opset=17, axis=axis)
    assert_matches_ort(model, feeds, *TOL[dtype])


def test_layernorm_broadcast_scale_constant_and_only_y():
    feeds = {"x": rand((2, 5, 16))}
    inits = {"scale": rand((1, 16)), "b": rand((16,))}
    model = node_model("LayerNormalization", feeds, opset=17, initializers=inits, epsilon=1e-3)
    assert_matches_ort(model, feeds)


def test_layernorm_float64_and_bfloat16():
    feeds = {"x": rand((3, 4), np.float64), "scale": rand((4,), np.float64)}
    model = node_model("LayerNormalization", feeds, n_outputs=3, opset=17)
    (y, mean, inv) = ours(model, feeds)
    assert (y.dtype, mean.dtype, inv.dtype) == (np.float64, np.float32, np.float32)
    x = feeds["x"]
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref * feeds["scale"], rtol=1e-9)
    xb = rand((3, 8)).astype(ml_dtypes.bfloat16)
    run = build(
        "LayerNormalization",
        17,
        {"axis": -1, "epsilon": 1e-5, "stash_type": 1},
        n_inputs=2,
        n_outputs=3,
    )
    yb, mb, ib = run(xb, np.ones(8, ml_dtypes.bfloat16))
    assert yb.dtype == ml_dtypes.bfloat16 and mb.dtype == np.float32 and mb.shape == (3, 1)
    assert ib.shape == (3, 1)
    xf = xb.astype(np.float32)
    ref = (xf - xf.mean(-1, keepdims=True)) / np.sqrt(xf.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(yb.astype(np.float32), ref, rtol=2e-2, atol=2e-2)


# ----------------------------------------------------------------- Instance and Group normalization


@pytest.mark.parametrize("opset", [6, 22])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 3, 3), (2, 2, 2, 3, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_instancenorm(opset, shape, dtype):
    c = shape[1]
    feeds = {"x": rand(shape, dtype), "scale": rand((c,), dtype), "b": rand((c,), dtype)}
    model = node_model("InstanceNormalization", feeds, opset=opset, epsilon=1e-4)
    assert_matches_ort(model, feeds, *TOL[dtype])


def test_instancenorm_opset1_constant_params():
    feeds = {"x": rand((2, 3, 4, 4))}
    inits = {"scale": rand((3,)), "b": rand((3,))}
    model = node_model("InstanceNormalization", feeds, opset=1, initializers=inits)
    (y,) = ours(model, feeds)
    x = feeds["x"]
    ref = (x - x.mean((2, 3), keepdims=True)) / np.sqrt(x.var((2, 3), keepdims=True) + 1e-5)
    ref = ref * inits["scale"][:, None, None] + inits["b"][:, None, None]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_groupnorm(opset, groups, dtype):
    shape = (2, 4, 3, 5)
    k = 4 if opset >= 21 else groups
    feeds = {"x": rand(shape, dtype), "scale": rand((k,), dtype), "bias": rand((k,), dtype)}
    model = node_model("GroupNormalization", feeds, opset=opset, num_groups=groups)
    assert_matches_ort(model, feeds, *TOL[dtype])


def test_groupnorm_bad_groups_is_clear():
    run = build(
        "GroupNormalization", 21, {"epsilon": 1e-5, "num_groups": 3, "stash_type": 1}, n_inputs=3
    )
    with pytest.raises(ValueError, match="num_groups=3 must divide"):
        run(rand((1, 4, 2)), rand((4,)), rand((4,)))


# ------------------------------------------------------------------ LpNormalization, MVN, LRN


@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_lp_normalization(opset, p, axis, dtype):
    if opset == 1 and dtype == np.float16:
        pytest.skip("onnxruntime inserts an opset-1 Cast it cannot load for float16 at opset 1")
    feeds = {"x": rand((3, 4, 5), dtype)}
    model = node_model("LpNormalization", feeds, opset=opset, p=p, axis=axis)
    assert_matches_ort(model, feeds, *TOL[dtype])


def test_lp_normalization_zero_norm_gives_zero():
    x = rand((3, 4))
    x[1] = 0
    feeds = {"x": x}
    (y,) = assert_matches_ort(node_model("LpNormalization", feeds, opset=22, p=2), feeds)
    np.testing.assert_array_equal(y[1], 0)


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize("axes", [None, [0, 2, 3], [1], [-1], [2, 3], [0, 1, 2, 3]])
def test_mean_variance_normalization(opset, axes):
    feeds = {"x": rand((2, 3, 4, 5), scale=2.0) + 1}
    attrs = {} if axes is None else {"axes": axes}
    model = node_model("MeanVarianceNormalization", feeds, opset=opset, **attrs)
    assert_matches_ort(model, feeds, 1e-4, 1e-5)


def test_mean_variance_normalization_float16():
    # onnxruntime's opset-13 function body mixes float16 and float; opset 9 has a kernel.
    feeds = {"x": rand((2, 3, 4, 5), np.float16)}
    model = node_model("MeanVarianceNormalization", feeds, opset=11)
    assert_matches_ort(model, feeds, 2e-3, 2e-3)


@pytest.mark.parametrize(("opset", "dtype"), [(1, np.float32), (13, np.float32), (13, np.float16)])
@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn(opset, size, dtype):
    feeds = {"x": rand((2, 6, 3, 4), dtype)}
    model = node_model("LRN", feeds, opset=opset, size=size, alpha=1e-2, beta=0.6, bias=2.0)
    assert_matches_ort(model, feeds, *TOL[dtype])


def lrn_reference(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    c = x.shape[1]
    y = np.empty_like(x)
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c - 1, i + size // 2)
        sq = np.square(x[:, lo : hi + 1]).sum(axis=1)
        y[:, i] = x[:, i] / (bias + alpha / size * sq) ** beta
    return y


@pytest.mark.parametrize("size", [2, 4, 9])
@pytest.mark.parametrize("shape", [(1, 5, 7), (2, 6, 3, 2)])
def test_lrn_even_sizes_and_other_ranks_against_numpy(size, shape):
    # onnxruntime only takes odd sizes and 4-D inputs.
    feeds = {"x": rand(shape)}
    (y,) = ours(node_model("LRN", feeds, opset=13, size=size, alpha=0.5), feeds)
    np.testing.assert_allclose(y, lrn_reference(feeds["x"], size, alpha=0.5), rtol=1e-5)


# -------------------------------------------------------------------------------------- Dropout


@pytest.mark.parametrize("opset", [7, 10, 12, 13, 22])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dropout_inference_with_mask(opset, dtype):
    feeds = {"x": rand((2, 3, 4), dtype)}
    model = node_model("Dropout", feeds, n_outputs=2, opset=opset)
    if opset < 12:
        # onnxruntime leaves the mask all zero (False) before opset 12; we report every element
        # as kept, the meaning opset 12 gives an inference-mode mask. Before 10 it has type T.
        y, mask = ours(model, feeds)
        np.testing.assert_array_equal(y, feeds["x"])
        assert mask.dtype == (dtype if opset < 10 else np.bool_) and (mask == 1).all()
        return
    y, mask = assert_matches_ort(model, feeds)
    assert mask.dtype == np.bool_ and mask.all()


@pytest.mark.parametrize("opset", [1, 6, 13])
def test_dropout_output_only(opset):
    feeds = {"x": rand((3, 4))}
    attrs = {"is_test": 1} if opset < 7 else {}
    (y,) = ours(node_model("Dropout", feeds, opset=opset, **attrs), feeds)
    np.testing.assert_array_equal(y, feeds["x"])


@pytest.mark.parametrize(
    ("ratio", "training"), [(None, False), (0.3, False), (0.0, True), (0.7, None)]
)
def test_dropout_ratio_and_training_mode_inputs(ratio, training):
    feeds = {"x": rand((4, 5))}
    names = ["x"]
    if ratio is not None or training is not None:
        feeds["r"] = np.array(0.5 if ratio is None else ratio, np.float32)
        names.append("r")
    if training is not None:
        feeds["t"] = np.array(training)
        names.append("t")
    model = node_model("Dropout", feeds, n_outputs=2, opset=13, input_names=names)
    y, mask = assert_matches_ort(model, feeds)
    np.testing.assert_array_equal(y, feeds["x"])
    assert mask.all()
