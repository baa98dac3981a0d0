"""CUDA-provider torch kernels vs the numpy CPU provider: losses (NegativeLogLikelihoodLoss,
SoftmaxCrossEntropyLoss)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import check_node, reason  # noqa: E402

from onnxkiln.testing import node_model  # noqa: E402

R = np.random.default_rng(21)


def rand(shape, dtype=np.float32):
    return R.standard_normal(shape).astype(dtype)


def _labels(shape, n_classes, ignore=None):
    t = R.integers(0, n_classes, size=shape).astype(np.int64)
    if ignore is not None:
        t.flat[::3] = ignore
    return t


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1, -1])
def test_losses(op, reduction, weighted, ignore):
    x = rand((3, 5, 2, 4))
    feeds = {"x": x, "t": _labels((3, 2, 4), 5, ignore)}
    if weighted:
        feeds["w"] = np.abs(rand((5,))) + 0.1
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    n_out = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    got = check_node(op, feeds, n_outputs=n_out, opset=13, **attrs)
    assert len(got) == n_out


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_loss_dtypes(dtype, op):
    n_out = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    feeds = {"x": rand((4, 3), dtype), "t": _labels((4,), 3).astype(np.int32)}
    check_node(op, feeds, n_outputs=n_out, opset=13, reduction="mean")


def test_loss_all_ignored_mean_is_nan():
    feeds = {"x": rand((2, 3)), "t": np.array([2, 2], np.int64)}
    (y,) = check_node("NegativeLogLikelihoodLoss", feeds, opset=13, ignore_index=2)
    assert torch.isnan(y).item()


def test_loss_target_out_of_range():
    from cuda_harness import node_info

    from onnxkiln.providers.cuda import REGISTRY

    model = node_model("NegativeLogLikelihoodLoss",
                       {"x": rand((2, 3)), "t": np.array([0, 3], np.int64)}, opset=13)
    info, _, _ = node_info(model)
    fn = REGISTRY.resolve("", info.op_type, 13).build(info)
    with pytest.raises(IndexError, match="out of range"):
        fn(torch.zeros(2, 3), torch.tensor([0, 3]))


def test_loss_declines_integer_scores():
    model = node_model("NegativeLogLikelihoodLoss",
                       {"x": np.zeros((2, 3), np.int32), "t": np.zeros(2, np.int64)}, opset=13)
    assert "int32" in reason(model)
