"""Kernels' specialize() paths and their splits across the intra-op pool, checked against
onnxruntime and against the generic kernels of the first run (bit for bit where the math
is the same: column splits of a product are)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxkiln import InferenceSession
from onnxkiln.testing import make_model, tensor_info

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def small_split_thresholds(monkeypatch):
    """Splits from small sizes on, so that these small cases exercise the split paths (the
    tuned thresholds make a split pay on real models; bench/thresholds.py)."""
    from onnxkiln import pool
    from onnxkiln.providers.cpu import _conv_special, _elementwise, _gemm, _row_kernels

    monkeypatch.setattr(_gemm, "SPLIT_MIN_FLOPS", 2_000_000)
    monkeypatch.setattr(_gemm, "SPLIT_MIN_S", 0.0)  # constant-B products: split at once
    monkeypatch.setattr(_row_kernels, "ROWS_SPLIT_MIN", 1 << 16)
    monkeypatch.setattr(_conv_special, "DW_SPLIT_MIN", 50_000)
    monkeypatch.setattr(_conv_special, "IMAGES_SPLIT_MIN_S", 0.0)
    monkeypatch.setattr(_elementwise, "SPLIT_MIN_ELEMENTS", 1 << 17)
    monkeypatch.setattr(pool, "BACKOFF_MIN_S", 0.0)  # a stall must not turn the splits off
    monkeypatch.setattr(pool, "BACKOFF_MAX_S", 0.0)


def _runs(model, feeds, threads):
    """(first run: generic kernels, third run: specialised kernels, the entry)."""
    s = InferenceSession.builder().intra_op_threads(threads).from_graph(model)
    first = s.run(feeds)
    s.run(feeds)
    third = s.run(feeds)
    entry = next(iter(s._cache._entries.values()))
    assert entry.compiled is not None
    return first, third, entry


def _oracle(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _check(model, feeds, threads, exact=True, rtol=1e-5, atol=1e-5):
    first, third, entry = _runs(model, feeds, threads)
    for a, b, want in zip(first, third, _oracle(model, feeds)):
        if exact:
            np.testing.assert_array_equal(b, a)
        np.testing.assert_allclose(b, want, rtol=rtol, atol=atol)
    return entry


def _variants(entry):
    return [getattr(st.kernel, "variant", None) for st in entry.compiled.plan.steps]


MATMULS = [  # A shape, B shape (B constant when the last flag is set)
    ((300, 256), (256, 384), True),  # column split
    ((2, 150, 256), (256, 512), True),  # batch folded into rows, column split
    ((512, 300), (300, 40), False),  # narrow output: row split
    ((4, 8, 64, 32), (4, 8, 32, 64), False),  # batched, split over the batch
    ((3, 5), (5, 7), False),  # small: one call
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("sa", "sb", "const_b"), MATMULS)
def test_matmul_specialised_and_split(sa, sb, const_b, threads):
    a = RNG.standard_normal(sa).astype(np.float32)
    b = RNG.standard_normal(sb).astype(np.float32)
    inits = {"b": b} if const_b else {}
    inputs = [tensor_info("a", np.float32, list(sa))]
    if not const_b:
        inputs.append(tensor_info("b", np.float32, list(sb)))
    out = list(np.matmul(a, b).shape)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], inputs,
                       [tensor_info("y", np.float32, out)], inits)
    feeds = {"a": a} if const_b else {"a": a, "b": b}
    exact = len(sb) == 2 and sb[1] >= 128  # column splits keep every bit
    entry = _check(model, feeds, threads, exact=exact, rtol=1e-4, atol=1e-4)
    variant = _variants(entry)[0]
    split = threads == 2 and 2 * np.prod(sa) * sb[-1] >= 2_000_000
    assert variant.endswith("_split") == split, variant


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("trans_a", "trans_b", "alpha", "beta", "c_shape"), [
    (0, 0, 1.0, 1.0, (384,)), (1, 0, 0.5, 2.0, (1, 384)), (0, 1, 1.0, 0.0, (384,)),
    (1, 1, 2.0, 1.0, (200, 384)), (0, 0, 1.0, 1.0, None)])
def test_gemm_specialised_and_split(trans_a, trans_b, alpha, beta, c_shape, threads):
    m, k, n = 200, 256, 384
    a = RNG.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = RNG.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inits = {"b": b}
    names = ["a", "b"]
    if c_shape is not None:
        inits["c"] = RNG.standard_normal(c_shape).astype(np.float32)
        names.append("c")
    node = helper.make_node("Gemm", names, ["y"], transA=trans_a, transB=trans_b, alpha=alpha,
                            beta=beta)
    model = make_model([node], [tensor_info("a", np.float32, list(a.shape))],
                       [tensor_info("y", np.float32, [m, n])], inits)
    # split across threads, some BLAS builds round chunks differently from one call (seen:
    # OpenBLAS 0.3.31 on AMD EPYC): bit for bit only on one thread
    entry = _check(model, {"a": a}, threads, exact=threads == 1, rtol=1e-4, atol=1e-4)
    assert _variants(entry)[0] == ("gemm.blas_split" if threads == 2 else "gemm.blas")


def test_einsum_path_chosen_once_per_signature():
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    w = RNG.standard_normal((5, 6)).astype(np.float32)
    model = make_model([helper.make_node("Einsum", ["x", "w"], ["y"], equation="bij,jk->bik")],
                       [tensor_info("x", np.float32, [3, 4, 5]),
                        tensor_info("w", np.float32, [5, 6])],
                       [tensor_info("y", np.float32, [3, 4, 6])])
    _check(model, {"x": x, "w": w}, 1, rtol=1e-5)


def _view_model(node, x_shape, out_shape, inits=None):
    return make_model([node], [tensor_info("x", np.float32, list(x_shape))],
                      [tensor_info("y", np.float32, list(out_shape))], inits or {})


@pytest.mark.parametrize(("node", "x_shape", "out_shape", "inits"), [
    (helper.make_node("Reshape", ["x", "s"], ["y"]), (2, 3, 4), (6, 4),
     {"s": np.array([-1, 4], np.int64)}),
    (helper.make_node("Reshape", ["x", "s"], ["y"]), (2, 3, 4), (2, 3, 4),
     {"s": np.array([0, 0, -1], np.int64)}),
    (helper.make_node("Squeeze", ["x", "a"], ["y"]), (2, 1, 4), (2, 4),
     {"a": np.array([1], np.int64)}),
    (helper.make_node("Unsqueeze", ["x", "a"], ["y"]), (2, 4), (2, 1, 4, 1),
     {"a": np.array([1, -1], np.int64)}),
    (helper.make_node("Flatten", ["x"], ["y"], axis=2), (2, 3, 4, 5), (6, 20), None),
])
def test_view_kernels_are_inlined_reshapes(node, x_shape, out_shape, inits):
    model = _view_model(node, x_shape, out_shape, inits)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    entry = _check(model, {"x": x}, 1)
    step = entry.compiled.plan.steps[0]
    assert step.kernel.reshape_to == out_shape
    assert ".reshape(r0)" in entry.compiled.source


def test_slice_with_folded_starts_is_specialised():
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Slice", ["sh", "z", "one"], ["n"]),  # x's first dim
             helper.make_node("Sub", ["n", "one"], ["end"]),
             helper.make_node("Slice", ["x", "one", "end", "z"], ["y"])]
    inits = {"z": np.array([0], np.int64), "one": np.array([1], np.int64)}
    model = make_model(nodes, [tensor_info("x", np.float32, ["n", 3])],
                       [tensor_info("y", np.float32, [None, 3])], inits)
    x = RNG.standard_normal((7, 3)).astype(np.float32)
    entry = _check(model, {"x": x}, 1)
    assert [st.op_type for st in entry.compiled.plan.steps] == ["Slice"]


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pools_build_their_window_plan_once(op):
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    x = RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
    model = _view_model(node, x.shape, (1, 4, 5, 5))
    entry = _check(model, {"x": x}, 1, rtol=1e-5)
    assert entry.kernels == 1


@pytest.mark.parametrize(("op", "axes"), [("ReduceMean", [-1]), ("ReduceSum", [0, 2]),
                                          ("ReduceMax", None)])
def test_reductions_resolve_axes_once(op, axes):
    inputs = ["x"]
    inits = {}
    if axes is not None:
        inputs.append("axes")
        inits["axes"] = np.array(axes, np.int64)
    node = helper.make_node(op, inputs, ["y"], keepdims=1)
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    out_shape = [1 if axes is None or i in (a % 3 for a in axes) else d
                 for i, d in enumerate(x.shape)]
    model = make_model([node], [tensor_info("x", np.float32, [3, 4, 5])],
                       [tensor_info("y", np.float32, out_shape)], inits, opset=18)
    entry = _check(model, {"x": x}, 1, rtol=1e-5)
    assert entry.kernels == 1


def test_cast_picks_its_converter_once():
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT32)
    model = make_model([node], [tensor_info("x", np.float32, [4, 5])],
                       [tensor_info("y", np.int32, [4, 5])])
    x = (RNG.standard_normal((4, 5)) * 100).astype(np.float32)
    entry = _check(model, {"x": x}, 1)
    assert entry.kernels == 1


def test_resize_plan_built_once_from_folded_sizes():
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Mul", ["sh", "two"], ["sizes"]),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear")]
    inits = {"two": np.array([1, 1, 2, 2], np.int64)}
    model = make_model(nodes, [tensor_info("x", np.float32, [1, 2, 4, 5])],
                       [tensor_info("y", np.float32, [1, 2, 8, 10])], inits, opset=19)
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    entry = _check(model, {"x": x}, 1, rtol=1e-5)
    assert [st.op_type for st in entry.compiled.plan.steps] == ["Resize"]
    assert entry.kernels == 1


def _ms_model(node, inputs, outputs, inits):
    return make_model([node], inputs, outputs, inits, extra_opsets={"com.microsoft": 1})


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("rows", "simplified", "beta", "bias"), [
    (8, False, True, True), (512, False, True, False), (512, True, False, True),
    (3, True, False, False)])
def test_skip_layer_norm_specialised(rows, simplified, beta, bias, threads):
    d = 256
    x = RNG.standard_normal((2, rows, d)).astype(np.float32)
    skip = RNG.standard_normal((2, rows, d)).astype(np.float32)
    inits = {"g": RNG.standard_normal(d).astype(np.float32)}
    names = ["x", "skip", "g"]
    if beta and not simplified:
        inits["b"] = RNG.standard_normal(d).astype(np.float32)
        names.append("b")
    elif not simplified and bias:
        names.append("")
    if bias:
        inits["bias"] = RNG.standard_normal(d).astype(np.float32)
        names.append("bias")
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    node = helper.make_node(op, names, ["y", "", "", "sum"], domain="com.microsoft",
                            epsilon=1e-5)
    shape = [2, rows, d]
    model = _ms_model(node, [tensor_info("x", np.float32, shape),
                             tensor_info("skip", np.float32, shape)],
                      [tensor_info("y", np.float32, shape), tensor_info("sum", np.float32, shape)],
                      inits)
    entry = _check(model, {"x": x, "skip": skip}, threads, exact=True, rtol=1e-5, atol=1e-5)
    assert _variants(entry) == ["skiplayernormalization.numba"]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(4, 7, 64), (2, 300, 256)])
def test_layer_normalization_specialised(shape, threads):
    x = RNG.standard_normal(shape).astype(np.float32)
    inits = {"s": RNG.standard_normal(shape[-1]).astype(np.float32),
             "b": RNG.standard_normal(shape[-1]).astype(np.float32)}
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "m", "inv"], axis=-1)
    stat = [*shape[:-1], 1]
    model = make_model([node], [tensor_info("x", np.float32, list(shape))],
                       [tensor_info("y", np.float32, list(shape)),
                        tensor_info("m", np.float32, stat), tensor_info("inv", np.float32, stat)],
                       inits, opset=17)
    entry = _check(model, {"x": x}, threads, exact=True, rtol=1e-5, atol=1e-5)
    assert _variants(entry) == ["layernormalization.numba"]


def test_simplified_layer_normalization_specialised():
    """onnxruntime registers this op in its own way (no schema onnx knows): checked against
    the RMSNorm formula."""
    shape = (3, 5, 32)
    x = RNG.standard_normal(shape).astype(np.float32)
    g = RNG.standard_normal(32).astype(np.float32)
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "s"], ["y", "inv"], axis=-1,
                            epsilon=1e-6, domain="com.microsoft")
    model = _ms_model(node, [tensor_info("x", np.float32, list(shape))],
                      [tensor_info("y", np.float32, list(shape)),
                       tensor_info("inv", np.float32, [3, 5, 1])], {"s": g})
    first, third, entry = _runs(model, {"x": x}, 1)
    inv = 1 / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
    for a, b in zip(first, third):
        np.testing.assert_array_equal(b, a)
    np.testing.assert_allclose(third[0], x * inv * g, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(third[1], inv, rtol=1e-5)
    assert entry.kernels == 1


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("opset", "axis", "shape"), [
    (13, -1, (2, 4, 16, 16)), (13, 3, (2, 8, 128, 128)), (11, 1, (4, 6, 5)),
    (13, 1, (3, 4, 5))])  # the last: not the last axis, the generic kernel
def test_softmax_specialised(opset, axis, shape, threads):
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)],
                       [tensor_info("x", np.float32, list(shape))],
                       [tensor_info("y", np.float32, list(shape))], opset=opset)
    entry = _check(model, {"x": x}, threads, exact=True, rtol=1e-5, atol=1e-6)
    assert entry.kernels == (0 if (opset, axis) == (13, 1) else 1)


CONVS = [  # channels, size, kernel, stride, group (C = depthwise), batch, dilation
    (16, 30, 3, 2, 16, 1, 1), (64, 9, 5, 1, 64, 1, 1), (48, 20, 3, 1, 48, 2, 2),
    (8, 17, 3, 1, 1, 1, 1), (32, 12, 1, 2, 1, 1, 1), (32, 12, 1, 1, 1, 2, 1),
    (12, 11, 3, 2, 3, 1, 1), (6, 40, 3, 1, 1, 1, 2), (8, 13, 3, 2, 1, 3, 1)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("c", "h", "k", "s", "g", "n", "d"), CONVS)
@pytest.mark.parametrize("fused", [False, True])
def test_conv_specialised_paths(c, h, k, s, g, n, d, threads, fused):
    m = c if g == c else 24
    x = RNG.standard_normal((n, c, h, h)).astype(np.float32)
    w = RNG.standard_normal((m, c // g, k, k)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    pad = (k // 2) * d
    attrs = {"group": g, "pads": [pad] * 4, "strides": [s, s], "dilations": [d, d]}
    if fused:
        node = helper.make_node("FusedConv", ["x", "w", "b"], ["y"], domain="com.microsoft",
                                activation="Relu", **attrs)
    else:
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    o = (h + 2 * pad - d * (k - 1) - 1) // s + 1
    model = _ms_model(node, [tensor_info("x", np.float32, [n, c, h, h])],
                      [tensor_info("y", np.float32, [n, m, o, o])], {"w": w, "b": b})
    entry = _check(model, {"x": x}, threads, exact=False, rtol=1e-4, atol=1e-4)
    assert entry.kernels == 1
    variant = _variants(entry)[0]
    if g == c and g > 1:
        assert "depthwise" in variant and variant.endswith("_numba")


EPILOGUE_CONVS = [  # channels, size, kernel, stride, group, pad: each conv path
    (8, 20, 1, 1, 1, 0),  # 1x1 GEMM
    (6, 13, 3, 1, 1, 1),  # im2col
    (16, 40, 3, 1, 16, 1),  # depthwise over stride-phase planes, several row blocks
    (16, 33, 3, 2, 16, 1),  # the same at stride 2 (both column phases read together)
    (16, 31, 5, 2, 16, 0),  # stride 2, no padding, odd width
    (16, 30, 5, 2, 16, 2),  # stride 2, two columns of padding
    (32, 7, 3, 1, 32, 1),  # depthwise channels-last (small map)
]
ACTIVATIONS = [("Relu", []), ("Clip", [-0.5, 0.75]), ("LeakyRelu", [0.1]),
               ("HardSigmoid", [0.2, 0.5]), ("Tanh", [])]  # Tanh: numpy after the conv


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("c", "h", "k", "s", "g", "pad"), EPILOGUE_CONVS)
@pytest.mark.parametrize(("act", "params"), ACTIVATIONS)
def test_fused_conv_epilogue_matches_onnxruntime(c, h, k, s, g, pad, act, params, threads):
    """The conv applies FusedConv's activation as it writes its output; a NaN stays NaN."""
    m = c if g == c else 12
    x = RNG.standard_normal((2, c, h, h)).astype(np.float32)
    x[0, 0, 1, 1] = np.nan
    w = RNG.standard_normal((m, c // g, k, k)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    extra = {"activation_params": params} if params else {}
    node = helper.make_node("FusedConv", ["x", "w", "b"], ["y"], domain="com.microsoft",
                            activation=act, group=g, pads=[pad] * 4, strides=[s, s], **extra)
    o = (h + 2 * pad - k) // s + 1
    model = _ms_model(node, [tensor_info("x", np.float32, [2, c, h, h])],
                      [tensor_info("y", np.float32, [2, m, o, o])], {"w": w, "b": b})
    first, third, entry = _runs(model, {"x": x}, threads)
    want = _oracle(model, {"x": x})[0]
    np.testing.assert_array_equal(np.isnan(third[0]), np.isnan(want))
    np.testing.assert_allclose(third[0], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(third[0], first[0], rtol=1e-5, atol=1e-5)
    assert entry.kernels == 1
    special = entry.compiled.plan.steps[0].kernel
    assert special.variant.startswith("fusedconv.")
    assert special.fused_activation == (act != "Tanh")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("c", "h", "k", "s", "g", "pad"), EPILOGUE_CONVS)
@pytest.mark.parametrize("act", ["HardSwish", "Silu"])
def test_conv_swish_fuses_and_matches_onnxruntime(c, h, k, s, g, pad, act, threads):
    """Conv -> HardSwish and Conv -> Mul(x, Sigmoid(x)) become one onnxkiln FusedConv whose
    conv applies the activation (MobileNetV3's and EfficientNet's pattern)."""
    m = c if g == c else 12
    x = RNG.standard_normal((2, c, h, h)).astype(np.float32)
    x[0, 0, 1, 1] = np.nan
    w = RNG.standard_normal((m, c // g, k, k)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y0"], group=g, pads=[pad] * 4,
                              strides=[s, s])]
    if act == "HardSwish":
        nodes.append(helper.make_node("HardSwish", ["y0"], ["y"]))
    else:
        nodes += [helper.make_node("Sigmoid", ["y0"], ["sig"]),
                  helper.make_node("Mul", ["y0", "sig"], ["y"])]
    o = (h + 2 * pad - k) // s + 1
    model = make_model(nodes, [tensor_info("x", np.float32, [2, c, h, h])],
                       [tensor_info("y", np.float32, [2, m, o, o])], {"w": w, "b": b},
                       opset=14)
    first, third, entry = _runs(model, {"x": x}, threads)
    want = _oracle(model, {"x": x})[0]
    np.testing.assert_array_equal(np.isnan(third[0]), np.isnan(want))
    np.testing.assert_allclose(third[0], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(third[0], first[0], rtol=1e-5, atol=1e-5)
    steps = entry.compiled.plan.steps
    assert [(st.domain, st.op_type) for st in steps] == [("onnxkiln", "FusedConv")]
    assert steps[0].kernel.fused_activation


def test_gather_nd_with_folded_indices_is_specialised():
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "step"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "ax"], ["idx"]),
             helper.make_node("GatherND", ["x", "idx"], ["y"], batch_dims=1)]
    inits = {"one": np.array(1, np.int64), "zero": np.array(0, np.int64),
             "step": np.array(1, np.int64), "ax": np.array([-1], np.int64)}
    model = make_model(nodes, [tensor_info("x", np.float32, [4, 4, 3])],
                       [tensor_info("y", np.float32, [4, 3])], inits, opset=13)
    x = RNG.standard_normal((4, 4, 3)).astype(np.float32)
    entry = _check(model, {"x": x}, 1)
    assert [st.op_type for st in entry.compiled.plan.steps] == ["GatherND"]
    assert entry.kernels == 1


def test_expand_and_split_specialised():
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]),
             helper.make_node("Split", ["e", "parts"], ["a", "b"], axis=1)]
    inits = {"shape": np.array([2, 5, 3], np.int64), "parts": np.array([2, 3], np.int64)}
    model = make_model(nodes, [tensor_info("x", np.float32, [1, 5, 1])],
                       [tensor_info("a", np.float32, [2, 2, 3]),
                        tensor_info("b", np.float32, [2, 3, 3])], inits, opset=13)
    x = RNG.standard_normal((1, 5, 1)).astype(np.float32)
    entry = _check(model, {"x": x}, 1)
    assert entry.kernels == 2


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m", [2, 3, 5, 8, 13, 16])
def test_few_row_products_take_the_row_kernels(m, threads):
    """2..16 rows against a constant B: the fastest of BLAS and the numba row kernels."""
    k, n = 256, 768
    a = RNG.standard_normal((1, m, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["a", "w"], ["y"])],
                       [tensor_info("a", np.float32, [1, m, k])],
                       [tensor_info("y", np.float32, [1, m, n])], {"w": w})
    entry = _check(model, {"a": a}, threads, exact=False, rtol=1e-4, atol=1e-4)
    assert _variants(entry) == ["matmul.few_rows"]
    wt = RNG.standard_normal((n, k)).astype(np.float32)  # Gemm transB: B already (N, K)
    bias = RNG.standard_normal(n).astype(np.float32)
    gemm = make_model([helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1, alpha=0.5)],
                      [tensor_info("a", np.float32, [m, k])],
                      [tensor_info("y", np.float32, [m, n])], {"w": wt, "c": bias})
    entry = _check(gemm, {"a": a[0]}, threads, exact=False, rtol=1e-4, atol=1e-4)
    assert _variants(entry) == ["gemm.few_rows"]


@pytest.mark.parametrize(("op", "a_shape", "b_shape"), [
    ("Add", (4, 256, 512), (512,)), ("Mul", (1, 64, 56, 56), (1, 64, 1, 1)),
    ("Sub", (3, 200, 300), (3, 200, 300)), ("Equal", (1, 300, 600), (300, 1)),
    ("Exp", (2, 300, 300), None)])
def test_large_elementwise_steps_split_across_the_pool(op, a_shape, b_shape):
    a = RNG.standard_normal(a_shape).astype(np.float32)
    feeds, inputs, names = {"a": a}, [tensor_info("a", np.float32, list(a_shape))], ["a"]
    if b_shape is not None:
        b = RNG.standard_normal(b_shape).astype(np.float32)
        if op == "Equal":
            b = np.round(b)
            feeds["a"] = a = np.round(a)
        feeds["b"] = b
        inputs.append(tensor_info("b", np.float32, list(b_shape)))
        names.append("b")
    out_shape = list(np.broadcast_shapes(a_shape, b_shape or a_shape))
    out_dt = np.bool_ if op == "Equal" else np.float32
    model = make_model([helper.make_node(op, names, ["y"])], inputs,
                       [tensor_info("y", out_dt, out_shape)])
    entry = _check(model, feeds, 2, exact=True, rtol=1e-6, atol=0)
    assert _variants(entry)[0].endswith(".split")
    entry1 = _runs(model, feeds, 1)[2]
    assert entry1.kernels == 0  # one thread: the ufunc itself


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_silu_is_fused_and_sigmoid_runs_in_one_pass(dtype, threads):
    """Mul(x, Sigmoid(x)) becomes onnxkiln Silu; both it and a lone Sigmoid specialise to
    the numba elementwise kernels (float32 within 1e-6 of onnxruntime)."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"]),
             helper.make_node("Sigmoid", ["y"], ["z"])]
    shape = [2, 64, 40, 40]
    model = make_model(nodes, [tensor_info("x", dtype, shape)],
                       [tensor_info("z", dtype, shape)])
    x = (RNG.standard_normal(shape) * 6).astype(dtype)
    entry = _check(model, {"x": x}, threads, exact=False, rtol=1e-6, atol=1e-6)
    assert [st.op_type for st in entry.compiled.plan.steps] == ["Silu", "Sigmoid"]
    assert _variants(entry) == ["silu.numba", "sigmoid.numba"]


def test_hard_swish_specialises_to_one_pass():
    shape = [1, 16, 56, 56]
    model = make_model([helper.make_node("HardSwish", ["x"], ["y"])],
                       [tensor_info("x", np.float32, shape)],
                       [tensor_info("y", np.float32, shape)], opset=14)
    x = (RNG.standard_normal(shape) * 5).astype(np.float32)
    entry = _check(model, {"x": x}, 1, exact=False, rtol=1e-6, atol=1e-6)
    assert _variants(entry) == ["hardswish.numba"]


def test_timed_split_takes_the_split_only_after_a_slow_whole_call(monkeypatch):
    """Constant-B products time their second whole call and split from then on only if it
    took SPLIT_MIN_S (their cost is memory, not FLOPs); one thread never splits."""
    import time

    from onnxkiln.pool import run_scope
    from onnxkiln.providers.cpu import _gemm

    monkeypatch.setattr(_gemm, "SPLIT_MIN_S", 0.005)
    calls: list[str] = []

    def slow(a):
        calls.append("whole")
        time.sleep(0.01)
        return a

    def fast(a):
        calls.append("whole")
        return a

    def split(a):
        calls.append("split")
        return a

    with run_scope(2):
        product = _gemm.timed_split(slow, split)
        assert [product(i) for i in range(4)] == [0, 1, 2, 3]
        assert calls == ["whole", "whole", "split", "split"]
        calls.clear()
        product = _gemm.timed_split(fast, split)
        [product(i) for i in range(4)]
        assert calls == ["whole"] * 4
    with run_scope(1):
        assert _gemm.timed_split(slow, split) is slow
