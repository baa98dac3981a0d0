"""CUDA-provider torch kernels vs the numpy CPU provider: reductions, matmul, conv, pooling,
normalizations."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import check_node  # noqa: E402

R = np.random.default_rng(2)
I64 = np.int64
BF16 = np.dtype(ml_dtypes.bfloat16)


def rand(shape, dtype=np.float32, lo=-2.0, hi=2.0):
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return R.integers(-5 if dt.kind == "i" else 0, 6, size=shape).astype(dt)
    return R.uniform(lo, hi, size=shape).astype(np.float32).astype(dt)


REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes", [None, (1,), (0, -1)])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce(op, axes, keepdims, opset):
    lo = 0.1 if op == "ReduceLogSum" else -2.0
    x = rand((2, 3, 4), lo=lo)
    attrs = {"keepdims": keepdims}
    inits = {}
    as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    if axes is not None:
        if as_input:
            inits["a"] = np.array(axes, I64)
        else:
            attrs["axes"] = list(axes)
    assert check_node(op, {"x": x}, initializers=inits, opset=opset, **attrs)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float16])
def test_reduce_types(op, dtype):
    assert check_node(op, {"x": rand((3, 4), dtype)}, initializers={"a": np.array([1], I64)},
               opset=18)


def test_reduce_noop_and_empty():
    x = rand((2, 3))
    assert check_node("ReduceSum", {"x": x}, initializers={"a": np.zeros(0, I64)},
               noop_with_empty_axes=1)
    e = rand((2, 0))
    for op in ("ReduceSum", "ReduceMax", "ReduceProd", "ReduceMin"):
        assert check_node(op, {"x": e}, initializers={"a": np.array([1], I64)}, opset=18)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_arg(op, last, keepdims):
    x = np.array([[1, 3, 3, 0], [2, 2, 1, 1], [0, 5, 5, 0]], np.float32)
    assert check_node(op, {"x": x}, axis=1, keepdims=keepdims, select_last_index=last)
    assert check_node(op, {"x": x.astype(np.int32)}, axis=0, keepdims=keepdims,
               select_last_index=last)


@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 2)),
                                    ((3, 4), (4,)), ((2, 1, 3, 4), (3, 4, 2))])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.float64])
def test_matmul(shapes, dtype):
    tol = {np.dtype(np.float16): 5e-3, BF16: 5e-2}.get(np.dtype(dtype))
    assert check_node("MatMul", {"a": rand(shapes[0], dtype), "b": rand(shapes[1], dtype)},
               rtol=tol, atol=tol)


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (5,), (3, 5), (1, 1)])
def test_gemm(ta, tb, c_shape):
    a = rand((4, 3) if ta else (3, 4))
    b = rand((5, 4) if tb else (4, 5))
    feeds = {"a": a, "b": b}
    if c_shape is not None:
        feeds["c"] = rand(c_shape)
    assert check_node("Gemm", feeds, transA=ta, transB=tb, alpha=0.7, beta=1.3)


def test_gemm_old_opset():
    assert check_node("Gemm", {"a": rand((3, 4)), "b": rand((4, 5)), "c": rand((3, 5))}, opset=6)


CONVS = [
    ((1, 2, 7, 7), (4, 2, 3, 3), {}),
    ((2, 4, 8, 6), (4, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 1]}),
    ((1, 2, 9, 9), (3, 2, 3, 2), {"dilations": [2, 1], "pads": [0, 1, 2, 0]}),
    ((1, 2, 7, 8), (3, 2, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 7, 8), (3, 2, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    ((1, 2, 7, 8), (3, 2, 3, 3), {"auto_pad": "VALID"}),
    ((2, 3, 10), (4, 3, 3), {"pads": [2, 1]}),
    ((1, 2, 4, 5, 6), (2, 2, 2, 3, 2), {"strides": [1, 2, 1]}),
    ((1, 4, 5, 5), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVS)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(xs, ws, attrs, bias):
    feeds = {"x": rand(xs), "w": rand(ws)}
    if bias:
        feeds["b"] = rand((ws[0],))
    assert check_node("Conv", feeds, rtol=1e-4, atol=1e-4, **attrs)


def test_conv_float16():
    assert check_node("Conv", {"x": rand((1, 2, 5, 5), np.float16), "w": rand((3, 2, 3, 3),
                                                                        np.float16)},
               rtol=1e-2, atol=1e-2)


CONVT = [
    ((1, 2, 3, 3), (2, 3, 3, 3), {}),
    ((1, 2, 3, 4), (2, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 3, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_padding": [1, 1]}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 7]}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 4, 3, 3), (4, 1, 2, 2), {"group": 2, "dilations": [2, 1]}),
    ((2, 2, 5), (2, 3, 3), {"strides": [3], "pads": [1, 2]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVT)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose(xs, ws, attrs, bias):
    feeds = {"x": rand(xs), "w": rand(ws)}
    if bias:
        feeds["b"] = rand((ws[1] * attrs.get("group", 1),))
    assert check_node("ConvTranspose", feeds, rtol=1e-4, atol=1e-4, **attrs)


POOLS = [
    ((1, 2, 7, 7), {"kernel_shape": [3, 3]}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 8, 7), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 8, 7), {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 8, 7), {"kernel_shape": [3, 3], "strides": [3, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [0, 1, 2, 0]}),
    ((2, 3, 10), {"kernel_shape": [3], "strides": [2], "pads": [1, 2]}),
    ((1, 1, 5, 4, 6), {"kernel_shape": [2, 2, 3], "strides": [1, 2, 2], "ceil_mode": 1}),
]


@pytest.mark.parametrize("xs,attrs", POOLS)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "AveragePool_incl"])
def test_pool(xs, attrs, op):
    attrs = dict(attrs)
    if op == "AveragePool_incl":
        op = "AveragePool"
        attrs["count_include_pad"] = 1
    assert check_node(op, {"x": rand(xs)}, opset=19, **attrs)


def test_global_pools_and_old_maxpool():
    x = rand((2, 3, 4, 5))
    assert check_node("GlobalAveragePool", {"x": x})
    assert check_node("GlobalMaxPool", {"x": x})
    assert check_node("MaxPool", {"x": x}, opset=8, kernel_shape=[2, 2])
    assert check_node("GlobalAveragePool", {"x": x.astype(np.float16)})


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("opset", [9, 15])
def test_batch_norm(dtype, opset):
    c = 3
    assert check_node("BatchNormalization", {"x": rand((2, c, 4, 4), dtype)}, opset=opset,
               initializers={"s": rand((c,), dtype), "b": rand((c,), dtype),
                             "m": rand((c,), dtype), "v": rand((c,), dtype, 0.5, 2)},
               epsilon=1e-3)


def test_instance_and_group_norm():
    x = rand((2, 4, 3, 5))
    assert check_node("InstanceNormalization", {"x": x, "s": rand((4,)), "b": rand((4,))})
    assert check_node("GroupNormalization", {"x": x, "s": rand((2,)), "b": rand((2,))},
               num_groups=2, opset=18)
    assert check_node("GroupNormalization", {"x": x, "s": rand((4,)), "b": rand((4,))},
               num_groups=2, opset=21)


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_layer_norm(axis, dtype):
    x = rand((2, 3, 4), dtype)
    shape = x.shape[axis:] if axis > 0 else x.shape[-1:]
    feeds = {"x": x, "s": rand(shape, dtype), "b": rand(shape, dtype)}
    assert check_node("LayerNormalization", feeds, n_outputs=3, axis=axis, opset=17)


def test_layer_norm_pre17_and_rms():
    x = rand((2, 3, 4))
    assert check_node("LayerNormalization", {"x": x, "s": rand((4,))}, opset=13, n_outputs=3)
    assert check_node("SimplifiedLayerNormalization", {"x": x, "s": rand((4,))}, n_outputs=2)
    assert check_node("RMSNormalization", {"x": x, "s": rand((3, 4))}, axis=1, opset=23)


LSTMS = [
    ({}, False, False),
    ({"direction": "bidirectional"}, True, False),
    ({"direction": "reverse", "clip": 0.5}, True, True),
    ({"layout": 1, "input_forget": 1}, True, False),
    ({"direction": "bidirectional", "activations": ["HardSigmoid", "Tanh", "Relu"] * 2,
      "activation_alpha": [0.3, 0.3], "activation_beta": [0.4, 0.4]}, False, True),
]


@pytest.mark.parametrize("attrs,extras,lens", LSTMS)
def test_lstm(attrs, extras, lens):
    t, b, i, h = 5, 3, 4, 6
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    x = rand((b, t, i) if layout else (t, b, i), lo=-1, hi=1)
    feeds = {"x": x, "w": rand((dirs, 4 * h, i), lo=-.5, hi=.5),
             "r": rand((dirs, 4 * h, h), lo=-.5, hi=.5)}
    names = ["x", "w", "r"]
    if extras:
        feeds["b"] = rand((dirs, 8 * h), lo=-.5, hi=.5)
        names.append("b")
    else:
        names.append("")
    if lens:
        feeds["sl"] = np.array([5, 2, 0], np.int32)
        names.append("sl")
    else:
        names.append("")
    if extras:
        st = (b, dirs, h) if layout else (dirs, b, h)
        feeds["h0"], feeds["c0"] = rand(st), rand(st)
        feeds["p"] = rand((dirs, 3 * h), lo=-.5, hi=.5)
        names += ["h0", "c0", "p"]
    while names and names[-1] == "":
        names.pop()
    assert check_node("LSTM", feeds, input_names=names, n_outputs=3, hidden_size=h, rtol=1e-5,
               atol=1e-5, **attrs)


RESIZES = [
    ({"mode": "nearest"}, (1.0, 1.0, 2.0, 3.0), None),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
      "nearest_mode": "floor"}, (1.0, 1.0, 0.5, 1.7), None),
    ({"mode": "nearest", "nearest_mode": "ceil",
      "coordinate_transformation_mode": "align_corners"}, None, (1, 2, 7, 3)),
    ({"mode": "linear"}, (1.0, 1.0, 2.0, 1.5), None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None,
     (1, 2, 3, 9)),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
     (1.0, 1.0, 0.6, 2.0), None),
    ({"mode": "linear", "antialias": 1}, (1.0, 1.0, 0.5, 0.5), None),
    ({"mode": "cubic", "cubic_coeff_a": -0.5}, (1.0, 1.0, 1.5, 2.0), None),
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
      "extrapolation_value": 3.0}, None, (1, 2, 4, 4)),
    ({"mode": "nearest", "axes": [3, 2]}, (2.0, 0.5), None),
    ({"mode": "linear", "keep_aspect_ratio_policy": "not_larger", "axes": [2, 3]}, None,
     (6, 9)),
]


@pytest.mark.parametrize("attrs,scales,sizes", RESIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_resize(attrs, scales, sizes, dtype):
    x = rand((1, 2, 4, 5), dtype)
    inits = {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32)}
    names = ["x", "", "", ""]
    if scales is not None:
        inits["scales"] = np.array(scales, np.float32)
        names[2] = "scales"
    if sizes is not None:
        inits["sizes"] = np.array(sizes, I64)
        names[3] = "sizes"
        inits.pop("scales")
    if attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        inits["roi"] = np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], np.float32)
        names[1] = "roi"
    else:
        inits.pop("roi")
    while names[-1] == "":
        names.pop()
    inits = {k: v for k, v in inits.items() if k in names}
    assert check_node("Resize", {"x": x}, initializers=inits, input_names=names, opset=19,
               rtol=1e-5, atol=1e-5, **attrs)


def test_resize_10_and_upsample():
    x = rand((1, 2, 3, 4))
    assert check_node("Resize", {"x": x}, initializers={"s": np.array([1, 1, 2, 1.5], np.float32)},
               opset=10, mode="linear")
    assert check_node("Upsample", {"x": x}, initializers={"s": np.array([1, 1, 2, 2], np.float32)},
               opset=9)
    assert check_node("Upsample", {"x": x}, opset=7, scales=[1.0, 1.0, 2.0, 3.0])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_bool(op):
    x = np.array([[True, False], [False, False]])
    assert check_node(op, {"x": x}, initializers={"a": np.array([1], I64)}, opset=20)
    assert check_node(op, {"x": np.zeros((2, 0), bool)}, initializers={"a": np.array([1], I64)},
               opset=20)


@pytest.mark.parametrize("op", ["RNN", "GRU"])
@pytest.mark.parametrize("attrs,extras,lens", [
    ({}, False, False),
    ({"direction": "bidirectional", "clip": 0.7}, True, True),
    ({"direction": "reverse", "layout": 1, "linear_before_reset": 1}, True, True),
    ({"linear_before_reset": 1}, True, False),
])
def test_rnn_gru(op, attrs, extras, lens):
    attrs = dict(attrs)
    if op == "RNN":
        attrs.pop("linear_before_reset", None)
    gates = {"RNN": 1, "GRU": 3}[op]
    t, b, i, h = 4, 3, 3, 5
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    feeds = {"x": rand((b, t, i) if layout else (t, b, i), lo=-1, hi=1),
             "w": rand((dirs, gates * h, i), lo=-.5, hi=.5),
             "r": rand((dirs, gates * h, h), lo=-.5, hi=.5)}
    names = ["x", "w", "r"]
    if extras:
        feeds["b"] = rand((dirs, 2 * gates * h), lo=-.5, hi=.5)
        feeds["h0"] = rand((b, dirs, h) if layout else (dirs, b, h))
    if lens:
        feeds["sl"] = np.array([4, 1, 0], np.int32)
    names += ["b" if extras else "", "sl" if lens else "", "h0" if extras else ""]
    while names[-1] == "":
        names.pop()
    assert check_node(op, feeds, input_names=names, n_outputs=2, hidden_size=h, rtol=1e-5,
               atol=1e-5, **attrs)
