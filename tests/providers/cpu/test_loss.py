"""SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss against onnxruntime (or numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.testing import assert_matches_ort, node_model

RNG = np.random.default_rng(77)
SHAPES = [(4, 5), (3, 5, 2), (2, 4, 3, 2), (2, 3, 2, 1, 2, 2)]


def labels_for(shape, n_classes, dtype=np.int64, ignore=None):
    labels = RNG.integers(0, n_classes, size=(shape[0], *shape[2:])).astype(dtype)
    if ignore is not None:
        labels.flat[:: 3] = ignore
    return labels


def ours(model, feeds):
    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def ref_nll(logp, labels, weights, ignore_index, reduction):
    """Plain-loop reference for the NLL part of both ops (float64)."""
    logp = logp.astype(np.float64)
    n_classes = logp.shape[1]
    moved = np.moveaxis(logp, 1, -1).reshape(-1, n_classes)
    flat = labels.reshape(-1)
    loss = np.zeros(flat.shape)
    wsum = 0.0
    for i, c in enumerate(flat):
        if ignore_index is not None and c == ignore_index:
            continue
        w = 1.0 if weights is None else float(weights[c])
        loss[i] = -moved[i, c] * w
        wsum += w
    loss = loss.reshape(labels.shape)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    with np.errstate(invalid="ignore"):
        return loss.sum() / wsum


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1, -1])
def test_sce_matches_ort(shape, reduction, weighted, ignore):
    scores = RNG.standard_normal(shape).astype(np.float32)
    feeds = {"x": scores, "t": labels_for(shape, shape[1], ignore=ignore)}
    if weighted:
        feeds["w"] = RNG.uniform(0.2, 2.0, shape[1]).astype(np.float32)
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    model = node_model("SoftmaxCrossEntropyLoss", feeds, n_outputs=2, opset=13, **attrs)
    got = assert_matches_ort(model, feeds, rtol=1e-5, atol=1e-6)
    logp = got[1].astype(np.float64)
    want = ref_nll(logp, feeds["t"], feeds.get("w"), ignore, reduction)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
def test_sce_opsets_and_label_types(opset, label_dtype):
    scores = RNG.standard_normal((3, 4, 2)).astype(np.float32)
    feeds = {"x": scores, "t": labels_for(scores.shape, 4, label_dtype)}
    model = node_model("SoftmaxCrossEntropyLoss", feeds, n_outputs=2, opset=opset)
    assert_matches_ort(model, feeds, rtol=1e-5, atol=1e-6)


def test_sce_loss_only_output():
    scores = RNG.standard_normal((5, 3)).astype(np.float32)
    feeds = {"x": scores, "t": labels_for(scores.shape, 3)}
    model = node_model("SoftmaxCrossEntropyLoss", feeds, n_outputs=1, opset=13,
                       reduction="sum")
    assert_matches_ort(model, feeds, rtol=1e-5, atol=1e-6)


def test_sce_float64_and_float16():
    scores = RNG.standard_normal((4, 6, 3))
    labels = labels_for(scores.shape, 6)
    weights = RNG.uniform(0.5, 1.5, 6)
    feeds = {"x": scores, "t": labels, "w": weights}
    model = node_model("SoftmaxCrossEntropyLoss", feeds, n_outputs=2, opset=13)
    assert_matches_ort(model, feeds, rtol=1e-12, atol=1e-12)
    feeds16 = {"x": scores.astype(np.float16), "t": labels, "w": weights.astype(np.float16)}
    model16 = node_model("SoftmaxCrossEntropyLoss", feeds16, n_outputs=2, opset=13)
    loss, logp = ours(model16, feeds16)
    assert loss.dtype == np.float16 and logp.dtype == np.float16
    shifted = feeds16["x"].astype(np.float64)
    shifted = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(logp, shifted, rtol=2e-3, atol=2e-3)
    want = ref_nll(shifted, labels, feeds16["w"].astype(np.float64), None, "mean")
    np.testing.assert_allclose(loss, want, rtol=2e-3, atol=2e-3)


def test_sce_extreme_scores_are_stable():
    scores = np.array([[1000.0, -1000.0, 0.0], [-1e4, 1e4, 5.0]], np.float32)
    feeds = {"x": scores, "t": np.array([0, 2], np.int64)}
    model = node_model("SoftmaxCrossEntropyLoss", feeds, n_outputs=2, opset=13,
                       reduction="none")
    loss, logp = ours(model, feeds)
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(logp) | (logp < -1e3))
    np.testing.assert_allclose(loss, [0.0, 1e4 - 5.0], rtol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 0, -5])
def test_nll_matches_ort(shape, reduction, weighted, ignore, opset=22):
    x = RNG.standard_normal(shape).astype(np.float32)
    feeds = {"x": x, "t": labels_for(shape, shape[1], ignore=ignore)}
    if weighted:
        feeds["w"] = RNG.uniform(0.2, 2.0, shape[1]).astype(np.float32)
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    model = node_model("NegativeLogLikelihoodLoss", feeds, opset=opset, **attrs)
    (got,) = assert_matches_ort(model, feeds, rtol=1e-5, atol=1e-6)
    want = ref_nll(x, feeds["t"], feeds.get("w"), ignore, reduction)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_nll_older_opsets(opset, reduction):
    test_nll_matches_ort((3, 5, 2), reduction, True, 1, opset=opset)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_nll_dtypes(dtype):
    x = RNG.standard_normal((3, 4, 2)).astype(dtype)
    feeds = {"x": x, "t": labels_for(x.shape, 4, np.int32)}
    model = node_model("NegativeLogLikelihoodLoss", feeds, opset=22, reduction="mean")
    (got,) = ours(model, feeds)
    assert got.dtype == dtype and got.shape == ()
    want = ref_nll(x, feeds["t"], None, None, "mean")
    tol = 1e-12 if dtype == np.float64 else 2e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_all_ignored(op):
    # sum is 0; mean is 0/0 = NaN, as onnxruntime
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    feeds = {"x": x, "t": np.full(3, 2, np.int64)}
    opset = 22 if op.startswith("Neg") else 13
    for reduction in ("sum", "mean"):
        model = node_model(op, feeds, opset=opset, reduction=reduction, ignore_index=2)
        got = assert_matches_ort(model, feeds)[0]
        assert got == 0 if reduction == "sum" else np.isnan(got)


def test_nll_out_of_range_label():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    feeds = {"x": x, "t": np.array([0, 4, 1], np.int64)}
    model = node_model("NegativeLogLikelihoodLoss", feeds, opset=22)
    with pytest.raises(Exception, match="out of range"):
        ours(model, feeds)


def test_sce_negative_label_not_ignored_is_error():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    feeds = {"x": x, "t": np.array([0, -1, 1], np.int64)}
    model = node_model("SoftmaxCrossEntropyLoss", feeds, opset=13, ignore_index=-2)
    with pytest.raises(Exception, match="out of range"):
        ours(model, feeds)
