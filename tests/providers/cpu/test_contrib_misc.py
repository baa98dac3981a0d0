"""com.microsoft ScaledSiLU, MurmurHash3 and CropAndResize (contrib_misc.py) against
onnxruntime's CPU provider."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.errors import KernelError
from onnxkiln.testing import assert_matches_ort, node_model

MS = "com.microsoft"
RNG = np.random.default_rng(11)
F32 = np.float32


def model(op, feeds, inits=None, names=None, **attrs):
    return node_model(op, feeds, initializers=inits or {}, domain=MS, input_names=names,
                      **attrs)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("scale_input", [False, True])
def test_scaled_silu(dtype, scale_input):
    x = (RNG.standard_normal((3, 7)) * 4).astype(dtype)
    feeds = {"x": x}
    if scale_input:
        feeds["s"] = np.array(1.7, F32)
    assert_matches_ort(model("ScaledSiLU", feeds, alpha=0.5), feeds, rtol=1e-3, atol=1e-3)



def test_scaled_silu_bfloat16_rounds_each_step():  # onnxruntime's Python API takes no bfloat16
    bf = ml_dtypes.bfloat16
    x = (RNG.standard_normal(50) * 4).astype(bf)
    y = InferenceSession.builder().from_graph(model("ScaledSiLU", {"x": x}, alpha=1.3)).run(
        {"x": x})[0]
    z = (x.astype(F32) * F32(1.3)).astype(bf).astype(F32)
    sig = (1 / (1 + np.exp(-z))).astype(bf).astype(F32)
    assert y.dtype == bf
    np.testing.assert_array_equal(y.astype(F32), (z * sig).astype(bf).astype(F32))


@pytest.mark.parametrize("x", [
    np.array([0, 1, -1, 2**31 - 1, -(2**31)], np.int32),
    np.array([3, 2**32 - 1], np.uint32),
    np.array([[0, -5], [2**40, 7]], np.int64),
    np.array([0, 2**63], np.uint64),
    np.array([0.0, -1.5, 3.25], np.float32),
    np.array([1e300, -0.0], np.float64),
    np.array(["", "a", "ab", "abc", "abcd", "hello world", "héllo"], object),
])
@pytest.mark.parametrize("positive,seed", [(1, 0), (0, 42), (1, 2**32 - 1)])
def test_murmur_hash3(x, positive, seed):
    m = model("MurmurHash3", {"x": x}, positive=positive, seed=seed)
    assert_matches_ort(m, {"x": x})


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("crop", [(3, 4), (1, 1), (1, 5)])
def test_crop_and_resize(mode, crop):
    x = RNG.standard_normal((2, 3, 6, 7)).astype(F32)
    rois = np.array([[0.1, 0.2, 0.8, 0.9], [0.0, 0.0, 1.0, 1.0], [-0.2, 0.5, 0.6, 1.3],
                     [0.7, 0.6, 0.2, 0.1]], F32)
    feeds = {"x": x, "rois": rois, "idx": np.array([0, 1, 1, 0], np.int32),
             "crop": np.array(crop, np.int32)}
    m = model("CropAndResize", feeds, mode=mode, extrapolation_value=-2.0)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-5)


def test_crop_and_resize_refuses_bad_batch_index():
    feeds = {"x": np.zeros((1, 1, 2, 2), F32), "rois": np.zeros((1, 4), F32),
             "idx": np.array([3], np.int32), "crop": np.array([2, 2], np.int32)}
    with pytest.raises(KernelError, match="batch_indices"):
        InferenceSession.builder().from_graph(model("CropAndResize", feeds)).run(feeds)


@pytest.mark.parametrize("size", [1, 2, 3, 6])
def test_ngram_repeat_block(size):
    ids = np.array([[1, 2, 3, 1, 2, 3, 1, 2], [4, 4, 4, 4, 0, 9, 4, 4], [0, 1, 2, 3, 4, 5, 6, 7]],
                   np.int64)
    scores = RNG.standard_normal((3, 10)).astype(F32)
    m = model("NGramRepeatBlock", {"ids": ids, "scores": scores}, ngram_size=size)
    y = assert_matches_ort(m, {"ids": ids, "scores": scores})[0]
    if size == 3:
        assert np.isneginf(y[0, 3]) and np.isneginf(y[1, 4]) and np.isneginf(y[1, 0])


@pytest.mark.parametrize("shape", [(5, 7), (1, 6, 4), (1, 1), (4, 1), (3, 9), (40, 300)])
def test_dynamic_time_warping(shape):
    cost = RNG.uniform(0, 1, shape).astype(F32)
    assert_matches_ort(model("DynamicTimeWarping", {"c": cost}), {"c": cost})


def test_dynamic_time_warping_ties():
    cost = np.zeros((4, 5), F32)
    assert_matches_ort(model("DynamicTimeWarping", {"c": cost}), {"c": cost})


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 5)])
def test_gated_add(dtype, shape):
    feeds = {"x": RNG.standard_normal(shape).astype(dtype),
             "y": RNG.standard_normal(shape).astype(dtype),
             "g": RNG.standard_normal((*shape[:-1], 1)).astype(dtype)}
    assert_matches_ort(model("GatedAdd", feeds), feeds, rtol=1e-6, atol=0)  # rounded as theirs


def test_gated_add_refuses_a_mismatched_gate():
    feeds = {"x": np.zeros((2, 3), F32), "y": np.zeros((2, 3), F32), "g": np.zeros((2, 3), F32)}
    with pytest.raises(KernelError, match="gate be"):
        InferenceSession.builder().from_graph(model("GatedAdd", feeds)).run(feeds)


BIFURCATION_SRC = np.array([756, 194, 39, 1015, 5529, 1216, 24, 72, 23, 1976, 6174, 1340, 6, 39,
                            194, 2161, 1480, 4955, 8, 7806, 65, 1091, 8, 560, 4077, 196],
                           np.int64)


@pytest.mark.parametrize("cur,prev,pred_from", [
    ([2, 756, 194, 39, 8155, 23], 0, None),
    ([2, 756, 194, 39], 3, "src"),        # prediction follows src then leaves it
    ([2], 0, "src"),                       # a prediction that matches src to the end
    ([5, 6, 39, 194], 20, "noise"),
    ([2, 8], 0, None),                     # "8" occurs twice in src
    ([1976, 6174], 0, None),
    ([4077, 196], 0, None),                # the match ends src
])
@pytest.mark.parametrize("ngrams", [(1, 3), (2, 5), (1, 1)])
def test_bifurcation_detector(cur, prev, pred_from, ngrams):
    src = BIFURCATION_SRC
    feeds = {"src": src, "cur": np.array(cur, np.int64), "prev": np.array(prev, np.int64)}
    names = ["src", "cur", "prev"]
    if pred_from is not None:
        pred = np.concatenate([src[prev:], [7]]).astype(np.int64)
        if pred_from == "noise":
            pred[2] = 99999
        elif cur == [2, 756, 194, 39]:
            pred[4] = 1
        feeds["pred"] = pred
        names.append("pred")
    m = node_model("BifurcationDetector", feeds, n_outputs=2, domain=MS, input_names=names,
                   min_ngram_size=ngrams[0], max_ngram_size=ngrams[1])
    assert_matches_ort(m, feeds)


@pytest.mark.parametrize("width", [1, 2, 3])
def test_word_conv_embedding(width):
    seq = np.array([[3, 5, 1, 0, 0, 0], [7, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6], [2, 2, 0, 4, 0, 0]],
                   np.int32)  # the last word: three ids > 0, so its first three chars count
    feeds = {"seq": seq}
    inits = {"w": RNG.standard_normal((5, 1, width, 4)).astype(F32),
             "b": RNG.standard_normal(5).astype(F32),
             "c": RNG.standard_normal((8, 4)).astype(F32)}
    m = model("WordConvEmbedding", feeds, inits, conv_window_size=width)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-6)


def test_word_conv_embedding_refuses_a_mismatched_attribute():
    feeds = {"seq": np.ones((1, 3), np.int32)}
    inits = {"w": np.zeros((2, 1, 2, 4), F32), "b": np.zeros(2, F32), "c": np.zeros((3, 4), F32)}
    with pytest.raises(KernelError, match="embedding_size attribute 3 does not match 2"):
        InferenceSession.builder().from_graph(
            model("WordConvEmbedding", feeds, inits, embedding_size=3)).run(feeds)


@pytest.mark.parametrize("layout,section", [(0, [2, 3, 3]), (1, [4, 2, 2]), (0, [8, 0, 0])])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("four_d", [False, True])
def test_m_rotary_embedding(layout, section, interleaved, four_d):
    b, s, heads, head = 2, 5, 2, 16
    x = RNG.standard_normal((b, heads, s, head) if four_d else (b, s, heads * head)).astype(F32)
    pos = RNG.integers(0, 20, (3, b, s)).astype(np.int64)
    angles = RNG.uniform(0, 6, (20, head // 2))
    feeds = {"x": x, "pos": pos, "cos": np.cos(angles).astype(F32),
             "sin": np.sin(angles).astype(F32)}
    attrs = {} if four_d else {"num_heads": heads}
    m = model("MRotaryEmbedding", feeds, mrope_section=section, mrope_layout=layout,
              interleaved=interleaved, **attrs)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["silu", "swish", "sigmoid"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("groups", [1, 3])
def test_gated_rms_norm(activation, dtype, groups):
    c = 8
    x = RNG.standard_normal((2, 4, groups * c)).astype(dtype)
    feeds = {"x": x, "scale": RNG.uniform(0.5, 1.5, c).astype(dtype),
             "gate": RNG.standard_normal(x.shape).astype(dtype)}
    m = model("GatedRMSNorm", feeds, activation=activation, epsilon=1e-5)
    tol = 1e-5 if dtype == np.float32 else 2e-3
    assert_matches_ort(m, feeds, rtol=tol, atol=tol)


@pytest.mark.parametrize("flattened", [False, True])
@pytest.mark.parametrize("scale_shape", [None, (12,), (3, 4), (4,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_branchwise_rms_norm(flattened, scale_shape, dtype):
    x = RNG.standard_normal((2, 5, 12) if flattened else (2, 5, 3, 4)).astype(dtype)
    feeds = {"x": x}
    if scale_shape is not None:
        feeds["scale"] = RNG.uniform(0.5, 1.5, scale_shape).astype(dtype)
    attrs = {"num_branches": 3} if flattened else {}
    tol = 1e-5 if dtype == np.float32 else 2e-3
    assert_matches_ort(model("BranchwiseRMSNorm", feeds, **attrs), feeds, rtol=tol, atol=tol)
