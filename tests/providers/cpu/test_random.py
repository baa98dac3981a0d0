"""Random ops (providers/cpu/random.py) and Dropout training mode (norm.py).

Values are random, so the tests check shape, dtype, range, seed determinism, the seeded
stream (numpy's legacy RandomState, as onnx uses), and rough statistics.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxkiln import InferenceSession
from onnxkiln.testing import make_model, node_model, tensor_info

RNG = np.random.default_rng(3)


def session(model):
    return InferenceSession.builder().from_graph(model)


def run1(model, feeds=None):
    return session(model).run(dict(feeds or {}))


def gen_model(op, opset=22, **attrs):
    """A no-input generator node (RandomNormal/RandomUniform)."""
    return node_model(op, {}, opset=opset, **attrs)


FLOAT_TYPES = [
    (TensorProto.FLOAT, np.float32),
    (TensorProto.FLOAT16, np.float16),
    (TensorProto.DOUBLE, np.float64),
    (TensorProto.BFLOAT16, ml_dtypes.bfloat16),
]


# -------------------------------------------------------------------- RandomNormal / Uniform


@pytest.mark.parametrize(("code", "dtype"), FLOAT_TYPES, ids=lambda v: str(v))
def test_random_normal_shape_dtype_and_statistics(code, dtype):
    opset = 22 if dtype == ml_dtypes.bfloat16 else 1
    model = gen_model("RandomNormal", opset, shape=[200, 100], dtype=code, mean=3.0, scale=2.0)
    (y,) = run1(model)
    assert y.dtype == np.dtype(dtype) and y.shape == (200, 100)
    v = y.astype(np.float64)
    assert abs(v.mean() - 3.0) < 0.05 and abs(v.std() - 2.0) < 0.05


@pytest.mark.parametrize(("code", "dtype"), FLOAT_TYPES, ids=lambda v: str(v))
def test_random_uniform_range_and_statistics(code, dtype):
    opset = 22 if dtype == ml_dtypes.bfloat16 else 1
    model = gen_model("RandomUniform", opset, shape=[20000], dtype=code, low=-2.0, high=6.0)
    (y,) = run1(model)
    assert y.dtype == np.dtype(dtype) and y.shape == (20000,)
    v = y.astype(np.float64)
    assert v.min() >= -2.0 and v.max() <= 6.0
    assert abs(v.mean() - 2.0) < 0.1 and abs(v.var() - 64 / 12) < 0.2


def test_default_dtype_is_float32_and_empty_shapes():
    (y,) = run1(gen_model("RandomUniform", 1, shape=[3, 0]))
    assert y.dtype == np.float32 and y.shape == (3, 0)
    (y,) = run1(gen_model("RandomNormal", 22, shape=[4]))
    assert y.dtype == np.float32 and y.shape == (4,)


@pytest.mark.parametrize("op", ["RandomNormal", "RandomUniform"])
def test_seed_determinism_and_fresh_streams(op):
    seeded = gen_model(op, shape=[8], seed=5.0)
    s1, s2 = session(seeded), session(seeded)
    a1, a2 = s1.run({})[0], s1.run({})[0]
    b1, b2 = s2.run({})[0], s2.run({})[0]
    np.testing.assert_array_equal(a1, b1)  # same seed: the same sequence in every session
    np.testing.assert_array_equal(a2, b2)
    assert not np.array_equal(a1, a2)  # the stream advances run to run
    (other,) = run1(gen_model(op, shape=[8], seed=6.0))
    assert not np.array_equal(a1, other)
    unseeded = gen_model(op, shape=[8])
    u1, u2 = session(unseeded).run({})[0], session(unseeded).run({})[0]
    assert not np.array_equal(u1, u2)  # no seed: fresh values


def test_seeded_values_follow_numpy_random_seed_stream():
    (n,) = run1(gen_model("RandomNormal", shape=[3, 4], seed=11.0, mean=1.0, scale=0.5))
    ref = np.random.RandomState(11).standard_normal((3, 4)) * 0.5 + 1.0
    np.testing.assert_allclose(n, ref.astype(np.float32), rtol=1e-6)
    (u,) = run1(gen_model("RandomUniform", shape=[5], seed=2.0, low=1.0, high=3.0))
    ref = np.random.RandomState(2).random_sample(5) * 2.0 + 1.0
    np.testing.assert_allclose(u, ref.astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("seed", [-1.0, 2.5, 1e12])
def test_unusual_seeds_are_deterministic(seed):
    model = gen_model("RandomUniform", shape=[6], seed=seed)
    np.testing.assert_array_equal(run1(model)[0], run1(model)[0])


# ------------------------------------------------------------------------------- *Like ops


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_like_ops_take_input_shape_and_type(op, dtype):
    x = np.zeros((3, 5, 2), dtype)
    (y,) = run1(node_model(op, {"x": x}, opset=1), {"x": x})
    assert y.shape == x.shape and y.dtype == np.dtype(dtype)
    assert not np.all(y == y.reshape(-1)[0])


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike"])
def test_like_ops_dtype_attribute_and_int_input(op):
    x = np.zeros((4, 4), np.int64)
    (y,) = run1(node_model(op, {"x": x}, opset=22, dtype=TensorProto.DOUBLE, seed=1.0), {"x": x})
    assert y.dtype == np.float64 and y.shape == (4, 4)
    (z,) = run1(node_model(op, {"x": x}, opset=22, dtype=TensorProto.DOUBLE, seed=1.0), {"x": x})
    np.testing.assert_array_equal(y, z)
    if op == "RandomUniformLike":
        assert y.min() >= 0.0 and y.max() <= 1.0


def test_like_op_with_int_input_and_no_dtype_is_refused():
    x = np.zeros((2,), np.int32)
    model = node_model("RandomUniformLike", {"x": x}, opset=1)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    with pytest.raises(Exception, match="dtype"):
        run1(model, {"x": x})


# ---------------------------------------------------------------------------------- Multinomial


@pytest.mark.parametrize("opset", [7, 22])
@pytest.mark.parametrize(("code", "dtype"), [(None, np.int32), (TensorProto.INT64, np.int64)])
def test_multinomial_shape_dtype_and_frequencies(opset, code, dtype):
    probs = np.array([[0.1, 0.2, 0.7, 0.0], [0.25, 0.25, 0.25, 0.25]])
    with np.errstate(divide="ignore"):
        x = np.log(probs).astype(np.float32) + 3.0  # unnormalized log-probabilities
    attrs = {"sample_size": 20000, "seed": 4.0}
    if code is not None:
        attrs["dtype"] = code
    (y,) = run1(node_model("Multinomial", {"x": x}, opset=opset, **attrs), {"x": x})
    assert y.shape == (2, 20000) and y.dtype == np.dtype(dtype)
    assert y.min() >= 0 and y.max() <= 3
    for r in range(2):
        freq = np.bincount(y[r], minlength=4) / 20000
        np.testing.assert_allclose(freq, probs[r], atol=0.015)
    assert not (y[0] == 3).any()  # probability zero is never drawn


def test_multinomial_seeded_and_float64_input():
    x = RNG.standard_normal((3, 6))
    model = node_model("Multinomial", {"x": x}, opset=7, sample_size=5, seed=9.0)
    (a,) = run1(model, {"x": x})
    (b,) = run1(model, {"x": x})
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3, 5) and a.dtype == np.int32
    bad = {"x": np.zeros((2, 2, 2), np.float32)}
    with pytest.raises(Exception, match="batch_size, class_size"):
        run1(node_model("Multinomial", bad, opset=7), bad)


# ------------------------------------------------------------------------------------ Bernoulli


@pytest.mark.parametrize("opset", [15, 22])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_bernoulli_input_dtype_and_rate(opset, dtype):
    p = np.full((100, 100), 0.3, dtype)
    p[0, :10] = 0.0
    p[1, :10] = 1.0
    (y,) = run1(node_model("Bernoulli", {"p": p}, opset=opset), {"p": p})
    assert y.dtype == np.dtype(dtype) and y.shape == p.shape
    assert set(np.unique(y).tolist()) <= {0.0, 1.0}
    assert (y[0, :10] == 0).all() and (y[1, :10] == 1).all()
    assert abs(y[2:].mean() - 0.3) < 0.02


@pytest.mark.parametrize(
    ("code", "dtype"),
    [(TensorProto.BOOL, np.bool_), (TensorProto.INT32, np.int32), (TensorProto.UINT8, np.uint8),
     (TensorProto.DOUBLE, np.float64), (TensorProto.BFLOAT16, ml_dtypes.bfloat16)],
)
def test_bernoulli_dtype_attribute(code, dtype):
    p = RNG.uniform(0, 1, (50,)).astype(np.float32)
    (y,) = run1(node_model("Bernoulli", {"p": p}, opset=22, dtype=code), {"p": p})
    assert y.dtype == np.dtype(dtype) and y.shape == p.shape
    assert set(np.unique(y.astype(np.float64)).tolist()) <= {0.0, 1.0}


def test_bernoulli_seed_determinism():
    p = RNG.uniform(0, 1, (64,))
    model = node_model("Bernoulli", {"p": p}, opset=15, seed=0.0)
    s = session(model)
    first, second = s.run({"p": p})[0], s.run({"p": p})[0]
    np.testing.assert_array_equal(first, session(model).run({"p": p})[0])
    assert not np.array_equal(first, second)
    # the seeded draw is u < p for u from RandomState(seed)
    u = np.random.RandomState(0).random_sample(64)
    np.testing.assert_array_equal(first, (u < p).astype(np.float64))


# ---------------------------------------------------------------------------- Dropout training


def dropout_model(opset, n_outputs=2, **attrs):
    x = np.zeros((4, 5, 6), np.float32)
    feeds = {"x": x, "r": np.array(0.5, np.float32), "t": np.array(True)}
    return node_model("Dropout", feeds, n_outputs=n_outputs, opset=opset, **attrs)


@pytest.mark.parametrize("opset", [12, 13, 22])
@pytest.mark.parametrize("ratio", [0.5, 0.75, 0.1])
def test_dropout_training_matches_onnx_formula_with_seed(opset, ratio):
    x = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    feeds = {"x": x, "r": np.array(ratio, np.float32), "t": np.array(True)}
    y, mask = run1(dropout_model(opset, seed=3), feeds)
    keep = np.random.RandomState(3).random_sample(x.shape) >= np.float32(ratio)
    scale = np.float32(1) / (np.float32(1) - np.float32(ratio))
    assert mask.dtype == np.bool_ and y.dtype == np.float32
    np.testing.assert_array_equal(mask, keep)
    np.testing.assert_array_equal(y, np.where(keep, x * scale, 0).astype(np.float32))


def test_dropout_training_statistics_and_fresh_masks():
    x = np.ones((200, 100), np.float32)
    feeds = {"x": x, "r": np.array(0.3, np.float32), "t": np.array(True)}
    model = node_model("Dropout", feeds, n_outputs=2, opset=13)
    s = session(model)
    y1, m1 = s.run(feeds)
    _, m2 = s.run(feeds)
    assert abs(1 - m1.mean() - 0.3) < 0.02
    np.testing.assert_allclose(y1[m1], 1 / 0.7, rtol=1e-6)
    assert (y1[~m1] == 0).all()
    assert not np.array_equal(m1, m2)  # a new mask every run
    assert not np.array_equal(m1, session(model).run(feeds)[1])  # unseeded sessions differ


@pytest.mark.parametrize("dtype", [np.float16, np.float64, ml_dtypes.bfloat16])
def test_dropout_training_other_types_and_default_ratio(dtype):
    x = RNG.standard_normal((8, 8)).astype(dtype)
    feeds = {"x": x, "t": np.array(True)}
    model = node_model("Dropout", feeds, n_outputs=2, opset=22, input_names=["x", "", "t"],
                       seed=1)
    y, mask = run1(model, feeds)
    assert y.dtype == np.dtype(dtype) and mask.dtype == np.bool_
    keep = np.random.RandomState(1).random_sample(x.shape) >= 0.5
    np.testing.assert_array_equal(mask, keep)
    ref = np.where(keep, x.astype(np.float64) * 2, 0).astype(dtype)
    np.testing.assert_array_equal(y, ref)


def test_dropout_training_ratio_zero_and_one():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    for ratio, kept in ((0.0, True), (1.0, False)):
        feeds = {"x": x, "r": np.array(ratio, np.float32), "t": np.array(True)}
        y, mask = run1(node_model("Dropout", feeds, n_outputs=2, opset=13), feeds)
        assert mask.all() == kept and (~mask).all() != kept
        np.testing.assert_array_equal(y, x if kept else np.zeros_like(x))


def test_dropout_training_output_only():
    x = RNG.standard_normal((5, 5)).astype(np.float32)
    feeds = {"x": x, "r": np.array(0.5, np.float32), "t": np.array(True)}
    (y,) = run1(node_model("Dropout", feeds, opset=13, seed=0), feeds)
    keep = np.random.RandomState(0).random_sample(x.shape) >= 0.5
    np.testing.assert_array_equal(y, np.where(keep, x * 2, 0).astype(np.float32))


@pytest.mark.parametrize("opset", [1, 6])
def test_dropout_opset6_is_test_zero_trains(opset):
    x = np.ones((50, 40), np.float32)
    model = node_model("Dropout", {"x": x}, n_outputs=2, opset=opset, ratio=0.25)
    y, mask = run1(model, {"x": x})
    assert mask.dtype == np.float32 and set(np.unique(mask).tolist()) <= {0.0, 1.0}
    np.testing.assert_allclose(y, mask / 0.75, rtol=1e-6)
    assert abs(mask.mean() - 0.75) < 0.03
    test_mode = node_model("Dropout", {"x": x}, n_outputs=2, opset=opset, is_test=1)
    y, mask = run1(test_mode, {"x": x})
    np.testing.assert_array_equal(y, x)
    assert (mask == 1).all()


def test_dropout_opset7_to_11_is_inference_identity():
    x = RNG.standard_normal((3, 3)).astype(np.float32)
    for opset in (7, 10, 11):
        (y,) = run1(node_model("Dropout", {"x": x}, opset=opset, ratio=0.9), {"x": x})
        np.testing.assert_array_equal(y, x)


def test_random_nodes_are_not_folded_into_constants():
    nodes = [
        helper.make_node("RandomUniform", [], ["u"], shape=[4]),
        helper.make_node("Relu", ["u"], ["y"]),
    ]
    m = make_model(nodes, [], [tensor_info("y", np.float32, [4])], opset=13)
    s = session(m)
    assert not np.array_equal(s.run({})[0], s.run({})[0])
