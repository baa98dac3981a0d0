"""CUDA-provider torch kernels vs the numpy CPU provider: losses (NegativeLogLikelihoodLoss,
SoftmaxCrossEntropyLoss), quantization, Cast to/from float8, the integer ops, and LpPool,
Det, ReverseSequence and Dropout."""

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


# ------------------------------------------------------------------------- quantization

_EDGES = np.array([0.0, 0.5, 1.5, 2.5, -2.5, 1e9, -1e9, np.nan, np.inf, -np.inf, 464.0, 480.0,
                   248.0, 61440.0, 57344.0 + 4096, 3e-3], np.float32)
_Q_TYPES = {2: np.uint8, 3: np.int8, 5: np.int16, 4: np.uint16}
_F8_TYPES = [17, 18, 19, 20]  # float8e4m3fn, e4m3fnuz, e5m2, e5m2fnuz


@pytest.mark.parametrize("to", sorted(_Q_TYPES))
@pytest.mark.parametrize("layout", ["tensor", "axis", "block"])
def test_quantize_dequantize_ints(to, layout):
    dt = _Q_TYPES[to]
    x = (rand((2, 6, 4)) * 40).astype(np.float32)
    x.flat[:len(_EDGES)] = _EDGES
    info = np.iinfo(dt)
    if layout == "tensor":
        scale, zp, attrs = np.float32(0.25), np.array(3, dt), {}
    elif layout == "axis":
        scale = np.abs(rand((6,))) + 0.1
        zp = R.integers(info.min // 2, info.max // 2, size=6).astype(dt)
        attrs = {"axis": 1}
    else:
        scale = np.abs(rand((2, 2, 4))) + 0.1
        zp = R.integers(info.min // 2, info.max // 2, size=(2, 2, 4)).astype(dt)
        attrs = {"axis": 1, "block_size": 3}
    (q,) = check_node("QuantizeLinear", {"x": x, "s": np.asarray(scale), "zp": zp},
                      opset=21, **attrs)
    check_node("DequantizeLinear", {"q": q.numpy(), "s": np.asarray(scale), "zp": zp},
               opset=21, **attrs)


def _f8(to):
    from onnxkiln.dtypes import DataType, to_numpy

    return to_numpy(DataType(to))


def _host_f8(t, to):
    """A torch float8 tensor as the matching ml_dtypes array."""
    return t.view(torch.uint8).numpy().view(_f8(to))


@pytest.mark.parametrize("to", _F8_TYPES)
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8_saturation(to, saturate):
    x = np.concatenate([_EDGES, rand((20,)) * 300]).astype(np.float32)
    (q,) = check_node("QuantizeLinear", {"x": x, "s": np.float32(1.0),
                                         "zp": np.zeros((), _f8(to))},
                      opset=21, saturate=saturate)
    check_node("DequantizeLinear", {"q": _host_f8(q, to), "s": np.float32(2.0)}, opset=21)


@pytest.mark.parametrize("to", _F8_TYPES)
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("src", [np.float32, np.float16, np.float64])
def test_cast_float8_edges(to, saturate, src):
    with np.errstate(over="ignore"):
        x = np.concatenate([_EDGES, rand((20,)) * 600]).astype(src)
    (y,) = check_node("Cast", {"x": x}, opset=21, to=to, saturate=saturate)
    for back in (1, 10, 6):  # float32, float16, int32
        check_node("Cast", {"x": _host_f8(y, to)}, opset=21, to=back)
    like = np.zeros((1,), _f8(to))
    check_node("CastLike", {"x": x, "like": like}, opset=21, saturate=saturate)


@pytest.mark.parametrize("precision", [None, 10, 16])
def test_quantize_precision(precision):
    x = rand((3, 5)) * 50
    attrs = {} if precision is None else {"precision": precision}
    check_node("QuantizeLinear", {"x": x, "s": np.float32(0.37), "zp": np.array(1, np.int8)},
               opset=25, **attrs)


@pytest.mark.parametrize("case", ["plain", "zeros", "positive", "negative", "empty"])
def test_dynamic_quantize_linear(case):
    x = {"plain": rand((3, 4)), "zeros": np.zeros((2, 2), np.float32),
         "positive": np.abs(rand((5,))) + 1, "negative": -np.abs(rand((5,))) - 1,
         "empty": np.zeros((0, 3), np.float32)}[case]
    check_node("DynamicQuantizeLinear", {"x": x}, n_outputs=3, opset=11)


@pytest.mark.parametrize("pair", [(np.float32, 6), (np.int32, 1), (np.uint16, 5),
                                  (np.int16, 10), (np.uint8, 9), (np.float64, 7),
                                  (np.uint64, 11)])
def test_bitcast(pair):
    src, to = pair
    x = (rand((3, 4)) * 100).astype(src)
    check_node("BitCast", {"x": x}, opset=26, to=to)


def test_quant_declines_float4():
    import ml_dtypes

    model = node_model("DequantizeLinear", {"x": np.zeros(4, ml_dtypes.float4_e2m1fn),
                                            "s": np.float32(1.0)}, opset=23)
    assert "float4e2m1" in reason(model) and "CPU provider" in reason(model)


_SUB = {22: "int4", 21: "uint4", 26: "int2", 25: "uint2"}


def _sub(to):
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, _SUB[to]))


@pytest.mark.parametrize("to", sorted(_SUB))
@pytest.mark.parametrize("src", [np.float32, np.float16, np.int8, np.int32, np.int64])
def test_cast_sub_byte(to, src):
    x = np.array([0, 1, -1, 2.7, -2.7, 7, 8, -8, -9, 15, 16, 100, -100, 3.5], np.float64)
    x = x.astype(src)
    (y,) = check_node("Cast", {"x": x}, opset=25, to=to)  # wraps like a C cast
    host = y.view(torch.int8 if "u" not in _SUB[to] else torch.uint8).numpy().astype(_sub(to))
    for back in (1, 10, 3, 7):  # float32, float16, int8, int64
        check_node("Cast", {"x": host}, opset=25, to=back)
    check_node("CastLike", {"x": x, "like": np.zeros(1, _sub(to))}, opset=25)


@pytest.mark.parametrize("to", sorted(_SUB))
@pytest.mark.parametrize("layout", ["tensor", "axis", "block"])
def test_quantize_dequantize_sub_byte(to, layout):
    dt = _sub(to)
    lo, hi = (-8, 7) if _SUB[to] == "int4" else (0, 15) if _SUB[to] == "uint4" else \
        (-2, 1) if _SUB[to] == "int2" else (0, 3)
    x = (rand((2, 6, 4)) * 6).astype(np.float32)
    x.flat[:6] = [np.nan, np.inf, -np.inf, 0.5, 1.5, -2.5]
    if layout == "tensor":
        scale, zp, attrs = np.float32(0.5), np.array(hi // 2, np.int8).astype(dt), {}
    elif layout == "axis":
        scale = np.abs(rand((6,))) + 0.2
        zp = R.integers(lo, hi + 1, size=6).astype(np.int8).astype(dt)
        attrs = {"axis": 1}
    else:
        scale = np.abs(rand((2, 2, 4))) + 0.2
        zp = R.integers(lo, hi + 1, size=(2, 2, 4)).astype(np.int8).astype(dt)
        attrs = {"axis": 1, "block_size": 3}
    (q,) = check_node("QuantizeLinear", {"x": x, "s": np.asarray(scale), "zp": zp},
                      opset=25, **attrs)
    host = q.view(torch.int8 if "u" not in _SUB[to] else torch.uint8).numpy().astype(dt)
    check_node("DequantizeLinear", {"q": host, "s": np.asarray(scale), "zp": zp}, opset=25,
               **attrs)


# ------------------------------------------------------------------------- integer ops


def _q(shape, dt):
    info = np.iinfo(dt)
    return R.integers(info.min, info.max + 1, size=shape).astype(dt)


@pytest.mark.parametrize("k", [7, 300])  # 300: past float32's exact range, float64 path
@pytest.mark.parametrize("dts", [(np.uint8, np.uint8), (np.int8, np.uint8), (np.uint8, np.int8)])
@pytest.mark.parametrize("zp", ["none", "scalar", "per_row_col"])
def test_matmul_integer(k, dts, zp):
    a, b = _q((2, 3, k), dts[0]), _q((k, 4), dts[1])
    feeds = {"a": a, "b": b}
    if zp == "scalar":
        feeds |= {"za": _q((), dts[0]), "zb": _q((), dts[1])}
    elif zp == "per_row_col":
        feeds |= {"za": _q((3,), dts[0]), "zb": _q((4,), dts[1])}
    check_node("MatMulInteger", feeds, opset=10)


@pytest.mark.parametrize("k", [5, 400])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("per_col", [False, True])
def test_qlinear_matmul(k, dt, per_col):
    a, b = _q((3, k), dt), _q((k, 4), dt)
    n = 4 if per_col else 1
    feeds = {"a": a, "sa": np.float32(0.02), "za": _q((), dt), "b": b,
             "sb": (np.abs(rand((n,))) * 0.05 + 0.01).reshape(() if n == 1 else (n,)),
             "zb": _q((n,), dt).reshape(() if n == 1 else (n,)),
             "sy": np.float32(0.5 * k / 5), "zy": _q((), dt)}
    check_node("QLinearMatMul", feeds, opset=21)


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_qlinear_conv_and_conv_integer(group, per_channel, bias):
    x, w = _q((1, 4, 6, 5), np.uint8), _q((6, 4 // group, 3, 3), np.int8)
    wzp = _q((6,), np.int8) if per_channel else _q((), np.int8)
    attrs = {"group": group, "pads": [1, 0, 1, 1], "strides": [1, 2]}
    check_node("ConvInteger", {"x": x, "w": w, "xz": _q((), np.uint8), "wz": wzp},
               opset=10, **attrs)
    ws = np.abs(rand((6,))) * 0.01 + 0.001 if per_channel else np.float32(0.004)
    feeds = {"x": x, "xs": np.float32(0.05), "xz": _q((), np.uint8), "w": w,
             "ws": ws.astype(np.float32), "wz": wzp, "ys": np.float32(0.3),
             "yz": _q((), np.uint8)}
    if bias:
        feeds["b"] = R.integers(-5000, 5000, size=6).astype(np.int32)
    check_node("QLinearConv", feeds, opset=10, **attrs)


# ------------------------------------------------------------- LpPool, Det, ReverseSequence


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 0, 2, 1], "strides": [2, 1]},
    {"kernel_shape": [2, 2], "dilations": [2, 1], "ceil_mode": 1, "strides": [2, 2]},
    {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER"},
])
def test_lp_pool(p, attrs):
    check_node("LpPool", {"x": rand((2, 3, 7, 6))}, opset=18, p=p, **attrs)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_lp_pool_1d_3d_and_global(dtype):
    check_node("LpPool", {"x": rand((1, 2, 9), dtype)}, opset=18, p=2, kernel_shape=[3])
    check_node("LpPool", {"x": rand((1, 2, 4, 4, 4), dtype)}, opset=18, p=1,
               kernel_shape=[2, 2, 2])
    check_node("GlobalLpPool", {"x": rand((2, 3, 4, 5), dtype)}, opset=2, p=3)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (5, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_det(shape, dtype):
    check_node("Det", {"x": rand(shape, dtype)}, opset=11, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axes", [(1, 0), (0, 1)])
def test_reverse_sequence(axes):
    batch_axis, time_axis = axes
    shape = [4, 5, 2] if batch_axis == 1 else [5, 4, 2]
    lens = np.array([4, 1, 0, 3, 2][:shape[batch_axis]], np.int64)
    check_node("ReverseSequence", {"x": rand(shape), "lens": lens}, opset=10,
               batch_axis=batch_axis, time_axis=time_axis)


# ---------------------------------------------------------------------------------- Dropout


@pytest.mark.parametrize("ratio", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("seed", [0, 7])
def test_dropout_training_matches_the_cpu_stream(ratio, seed):
    feeds = {"x": rand((3, 4, 5))}
    inits = {"r": np.float32(ratio), "t": np.array(True)}
    check_node("Dropout", feeds, initializers=inits, n_outputs=2, opset=13, seed=seed)


def test_dropout_old_opsets():
    x = rand((3, 4))
    check_node("Dropout", {"x": x}, n_outputs=2, opset=6, ratio=0.4, is_test=1)
    check_node("Dropout", {"x": x}, n_outputs=2, opset=6, ratio=0.4, seed=3)
    check_node("Dropout", {"x": x}, n_outputs=2, opset=7, ratio=0.4)
    check_node("Dropout", {"x": x}, n_outputs=2, opset=10, ratio=0.4)


def test_session_runs_storage_types_on_the_torch_provider():
    """uint32 arithmetic, float8 and int4 Casts and an int4 DequantizeLinear are placed on
    the torch provider in a real session (claims accepts their types) and agree with the CPU
    session."""
    from onnx import TensorProto, helper

    import onnxkiln

    nodes = [helper.make_node("Add", ["a", "a"], ["s"]),
             helper.make_node("Cast", ["f"], ["f8"], to=TensorProto.FLOAT8E4M3FN),
             helper.make_node("Cast", ["f8"], ["back"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["f"], ["i4"], to=TensorProto.INT4),
             helper.make_node("DequantizeLinear", ["i4", "sc"], ["dq"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("a", TensorProto.UINT32, [3]),
                     helper.make_tensor_value_info("f", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info(n, t, [3]) for n, t in
         [("s", TensorProto.UINT32), ("back", TensorProto.FLOAT), ("dq", TensorProto.FLOAT)]],
        [helper.make_tensor("sc", TensorProto.FLOAT, [], [0.5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"a": np.array([1, 2**32 - 1, 7], np.uint32),
             "f": np.array([1.5, -600.0, 9.0], np.float32)}
    dev = onnxkiln.InferenceSession.builder().providers(["cuda", "cpu"]).option(
        "testing.cuda_on_torch_cpu", "1").from_graph(model)
    placed = {(s.provider, s.op_type) for s in dev._plan.steps}
    assert {("cuda", "Add"), ("cuda", "Cast"), ("cuda", "DequantizeLinear")} <= placed
    cpu = onnxkiln.InferenceSession.builder().device("cpu").from_graph(model)
    for got, want in zip(dev.run(None, feeds), cpu.run(None, feeds)):
        assert np.asarray(got).dtype == np.asarray(want).dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
