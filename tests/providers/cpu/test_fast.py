"""The optional numba kernels (the `fast` extra): each one against its numpy fallback and
onnxruntime, the switches that turn numba off, and the kernel variants traces name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import scipy.special
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.providers.cpu import _numba, _row_kernels
from onnxkiln.testing import node_model, run_ort, tensor_info
from onnxkiln.trace import TraceContext

MS = "com.microsoft"
RNG = np.random.default_rng(7)


@pytest.fixture
def numba_on(monkeypatch):
    pytest.importorskip("numba", reason="numba (the `fast` extra) is not installed")
    monkeypatch.delenv(_numba.ENV, raising=False)
    monkeypatch.setattr(_numba, "ENABLED", True)
    assert _numba.disabled_reason() is None


def rand(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def ms_model(op, feeds, names=None, outs=("y",), domain=MS, opset=21, inits=None, **attrs):
    names = list(feeds) + list(inits or {}) if names is None else list(names)
    node = helper.make_node(op, names, list(outs), domain=domain, **attrs)
    inputs = [tensor_info(k, v.dtype, v.shape) for k, v in feeds.items()]
    outputs = [helper.make_value_info(o, onnx.TypeProto()) for o in outs if o]
    init = [onnx.numpy_helper.from_array(v, k) for k, v in (inits or {}).items()]
    graph = helper.make_graph([node], op.lower(), inputs, outputs, init)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10 if opset >= 21 else 8)


def traced(model, feeds):
    """(outputs, kernel_variant and reason of each node span) of one traced run."""
    ctx = TraceContext.in_memory()
    outs = InferenceSession.builder().trace(ctx).from_graph(model).run(dict(feeds))
    spans = [s for s in ctx.spans if s.category == "node"]
    return outs, [(s.attributes["kernel_variant"], s.attributes.get("kernel_variant_reason"))
                  for s in spans]


def both(monkeypatch, model, feeds, rtol=1e-5, atol=1e-5, ort=True, variant=None):
    """Run with numba on and off: both against onnxruntime (or each other) and each other."""
    fast, fast_variants = traced(model, feeds)
    monkeypatch.setattr(_numba, "ENABLED", False)
    slow, slow_variants = traced(model, feeds)
    monkeypatch.setattr(_numba, "ENABLED", True)
    refs = run_ort(model, feeds) if ort else slow
    for i, (a, b, r) in enumerate(zip(fast, slow, refs)):
        r = np.asarray(r)
        assert a.dtype == b.dtype == r.dtype and a.shape == b.shape == r.shape, i
        rt, at = (4e-3, 4e-3) if a.dtype == np.float16 else (rtol, atol)  # 1-2 float16 ulps
        np.testing.assert_allclose(a.astype(np.float64), r.astype(np.float64),
                                   rtol=rt, atol=at, err_msg=f"out {i} vs ref")
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64),
                                   rtol=rt, atol=at, err_msg=f"out {i} vs numpy")
    if variant is not None:
        assert fast_variants[0][0] == variant, fast_variants
        assert fast_variants[0][1] is None
        assert slow_variants[0][0] != variant
        assert "ENABLED = False" in slow_variants[0][1]
    return fast


# ------------------------------------------------------------------------------ Conv

CONV_CASES = [
    # x shape, W shape, attrs, variant
    ((1, 8, 9, 11), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}, "depthwise"),
    ((2, 6, 10, 7), (6, 1, 3, 3), {"group": 6, "strides": [2, 2], "pads": [1, 0, 1, 2]},
     "depthwise"),
    ((1, 4, 12, 12), (4, 1, 5, 3), {"group": 4, "strides": [2, 1], "dilations": [2, 1],
                                    "pads": [2, 1, 3, 0]}, "depthwise"),
    ((1, 5, 8, 8), (5, 1, 3, 3), {"group": 5, "auto_pad": "SAME_UPPER", "strides": [2, 2]},
     "depthwise"),
    ((1, 8, 7, 9), (12, 2, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, "grouped"),
    ((1, 6, 11, 6), (6, 3, 2, 3), {"group": 2, "strides": [3, 2], "dilations": [1, 2]},
     "grouped"),
    ((2, 4, 13), (8, 2, 3), {"group": 2, "pads": [1, 2], "strides": [2]}, "grouped"),
    ((1, 6, 9), (6, 1, 3), {"group": 6, "dilations": [3], "pads": [3, 3]}, "depthwise"),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[3]}-{c[0]}-{c[1]}")
def test_conv_numba_matches_numpy_and_ort(numba_on, monkeypatch, case, bias):
    xs, ws, attrs, kind = case
    x, w = rand(*xs), rand(*ws)
    inits = {"w": w, **({"b": rand(ws[0])} if bias else {})}
    model = node_model("Conv", {"x": x}, opset=13, initializers=inits, **attrs)
    both(monkeypatch, model, {"x": x}, rtol=1e-4, atol=1e-4, variant=f"conv.{kind}_numba")


def test_conv_numba_float16_and_runtime_weights(numba_on, monkeypatch):
    x, w = rand(1, 6, 8, 8, dtype=np.float16), rand(6, 1, 3, 3, dtype=np.float16)
    model = node_model("Conv", {"x": x}, opset=13, initializers={"w": w}, group=6,
                       pads=[1, 1, 1, 1])
    fast = both(monkeypatch, model, {"x": x}, ort=False)[0]  # onnxruntime: no float16 Conv
    m32 = node_model("Conv", {"x": x.astype(np.float32)}, opset=13,
                     initializers={"w": w.astype(np.float32)}, group=6, pads=[1, 1, 1, 1])
    ref = run_ort(m32, {"x": x.astype(np.float32)})[0]
    np.testing.assert_allclose(fast.astype(np.float32), ref, rtol=2e-3, atol=2e-3)
    x64, w64 = rand(1, 4, 6, 6, dtype=np.float64), rand(8, 2, 3, 3, dtype=np.float64)
    model = node_model("Conv", {"x": x64, "w": w64}, opset=13, group=2)  # W is an input
    fast = both(monkeypatch, model, {"x": x64, "w": w64}, rtol=1e-10, atol=1e-10, ort=False,
                variant="conv.grouped_numba")[0]
    m32 = node_model("Conv", {"x": x64.astype(np.float32), "w": w64.astype(np.float32)},
                     opset=13, group=2)
    ref = run_ort(m32, {"x": x64.astype(np.float32), "w": w64.astype(np.float32)})[0]
    np.testing.assert_allclose(fast, ref, rtol=1e-4, atol=1e-4)


def test_conv_variants_name_the_path_per_shape(numba_on, monkeypatch):
    x = rand(1, 4, 6, 6)
    cases = [({"w": rand(8, 4, 1, 1)}, {}, "conv.1x1_gemm"),
             ({"w": rand(8, 4, 3, 3)}, {}, "conv.im2col"),
             ({"w": rand(4, 1, 3, 3)}, {"group": 4}, "conv.depthwise_numba")]
    for inits, attrs, variant in cases:
        model = node_model("Conv", {"x": x}, opset=13, initializers=inits, **attrs)
        _, [(got, reason)] = traced(model, {"x": x})
        assert (got, reason) == (variant, None)
    xg = rand(1, 32, 5, 5)  # 16 channels per group: im2col + GEMM
    model = node_model("Conv", {"x": xg}, opset=13, initializers={"w": rand(8, 16, 3, 3)},
                       group=2)
    out, [(got, reason)] = traced(model, {"x": xg})
    assert got == "conv.grouped_numpy" and "GEMM is faster" in reason
    np.testing.assert_allclose(out[0], run_ort(model, {"x": xg})[0], rtol=1e-4, atol=1e-4)
    x3 = rand(1, 4, 3, 4, 5)  # 3-D: the numpy depthwise path, with the reason
    model = node_model("Conv", {"x": x3}, opset=13, initializers={"w": rand(4, 1, 2, 2, 2)},
                       group=4)
    _, [(got, reason)] = traced(model, {"x": x3})
    assert got == "conv.depthwise_numpy" and "1-D and 2-D" in reason


# ------------------------------------------------------------------------------ norms


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("axis,with_b", [(-1, True), (1, False), (2, True)])
def test_layer_norm(numba_on, monkeypatch, dtype, axis, with_b):
    x = rand(3, 5, 4, 7, dtype=dtype, scale=3.0) + dtype(2)
    norm_shape = x.shape[axis:]
    inits = {"s": rand(*norm_shape, dtype=dtype)}
    if with_b:
        inits["b"] = rand(*norm_shape, dtype=dtype)
    model = node_model("LayerNormalization", {"x": x}, n_outputs=3, opset=17,
                       initializers=inits, axis=axis, epsilon=1e-3)
    both(monkeypatch, model, {"x": x}, rtol=1e-5, atol=2e-5,
         variant="layernormalization.numba")


def test_layer_norm_broadcast_scale_falls_back(numba_on, monkeypatch):
    x = rand(4, 6)
    model = node_model("LayerNormalization", {"x": x}, opset=17,
                       initializers={"s": rand(1, 6)})
    out, [(variant, reason)] = traced(model, {"x": x})
    assert variant == "layernormalization.numpy" and "Scale" in reason
    np.testing.assert_allclose(out[0], run_ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("simplified", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("skip_shape", [(2, 5, 16), (5, 16)])
def test_skip_layer_norm(numba_on, monkeypatch, simplified, dtype, skip_shape):
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    feeds = {"x": rand(2, 5, 16, dtype=dtype), "s": rand(*skip_shape, dtype=dtype)}
    inits = {"g": rand(16, dtype=dtype), "beta": rand(16, dtype=dtype),
             "b": rand(16, dtype=dtype)}
    names = ["x", "s", "g", "b"] if simplified else ["x", "s", "g", "beta", "b"]
    if simplified:
        inits.pop("beta")
    model = ms_model(op, feeds, names, outs=("y", "m", "i", "sum"), inits=inits,
                     epsilon=1e-5)
    both(monkeypatch, model, feeds, rtol=1e-5, atol=2e-5, variant=f"{op.lower()}.numba")


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm(numba_on, monkeypatch, axis):
    x = rand(3, 4, 8)
    model = ms_model("SimplifiedLayerNormalization", {"x": x}, ["x", "s"], outs=("y", "i"),
                     domain="", opset=17, inits={"s": rand(*x.shape[axis:])}, axis=axis,
                     epsilon=1e-5)
    both(monkeypatch, model, {"x": x}, rtol=1e-5, atol=1e-5,
         variant="simplifiedlayernormalization.numba")


# ------------------------------------------------------------------------------ softmax


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis,shape", [(13, -1, (3, 4, 37)), (11, 1, (2, 5, 6)),
                                              (13, -1, (1, 1))])
def test_softmax(numba_on, monkeypatch, op, opset, axis, shape):
    x = rand(*shape, scale=5.0)
    model = node_model(op, {"x": x}, opset=opset, axis=axis)
    both(monkeypatch, model, {"x": x}, rtol=1e-5, atol=1e-5, variant=f"{op.lower()}.numba")


def test_softmax_special_values(numba_on, monkeypatch):
    x = rand(5, 9, scale=30.0)
    x[0, 3] = np.nan
    x[1, :] = -np.inf
    x[2, 4] = -np.inf
    x[3, :4] = -1e4
    model = node_model("Softmax", {"x": x}, opset=13, axis=-1)
    fast = both(monkeypatch, model, {"x": x})[0]
    assert np.isnan(fast[0]).all() and np.isnan(fast[1]).all() and fast[2, 4] == 0


def test_softmax_other_axis_and_float16_use_numpy(numba_on, monkeypatch):
    x = rand(3, 4, 5)
    model = node_model("Softmax", {"x": x}, opset=13, axis=1)
    _, [(variant, reason)] = traced(model, {"x": x})
    assert variant == "softmax.numpy" and "last axis" in reason
    x16 = x.astype(np.float16)
    model = node_model("Softmax", {"x": x16}, opset=13, axis=-1)
    both(monkeypatch, model, {"x": x16}, rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------------------ GELU


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu(numba_on, monkeypatch, dtype, approximate):
    x = rand(4, 33, dtype=dtype, scale=3.0)
    x[0, :6] = [0, -10, 10, 4, -4, 1e-3]
    model = node_model("Gelu", {"x": x}, opset=20, approximate=approximate)
    both(monkeypatch, model, {"x": x}, rtol=1e-5, atol=2e-6, variant="gelu.numba")


def test_gelu_special_values_and_scalar(numba_on, monkeypatch):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.9, -3.9, 1e-30], np.float32)
    model = node_model("Gelu", {"x": x}, opset=20)
    fast = both(monkeypatch, model, {"x": x})[0]
    assert np.isnan(fast[0]) and fast[1] == np.inf
    x0 = np.array(0.5, np.float32)
    both(monkeypatch, node_model("Gelu", {"x": x0}, opset=20), {"x": x0})


def test_gelu_erf_accuracy_dense(numba_on):
    """The polynomial erf across float32's range: GELU within 1e-6 absolute of float64."""
    fn = _numba.load("gelu")
    x = np.linspace(-12, 12, 200_001, dtype=np.float32)
    got = _row_kernels.gelu_rows(fn, x, None, False)
    t = x.astype(np.float64)
    want = 0.5 * t * (1 + scipy.special.erf(t / np.sqrt(2)))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op,bias", [("Gelu", False), ("BiasGelu", True), ("FastGelu", True),
                                     ("FastGelu", False)])
def test_ms_gelu_family(numba_on, monkeypatch, op, bias, dtype):
    feeds = {"x": rand(2, 3, 24, dtype=dtype, scale=3.0)}
    if bias:
        feeds["b"] = rand(24, dtype=dtype)
    model = ms_model(op, feeds)
    both(monkeypatch, model, feeds, rtol=1e-5, atol=2e-6, variant=f"{op.lower()}.numba")


def test_gelu_float64_stays_numpy(numba_on, monkeypatch):
    x = rand(3, 5, dtype=np.float64)
    model = node_model("Gelu", {"x": x}, opset=20)
    out, [(variant, reason)] = traced(model, {"x": x})
    assert variant == "gelu.numpy" and "float64" in reason
    t = x.astype(np.float64)
    np.testing.assert_allclose(out[0], 0.5 * t * (1 + scipy.special.erf(t / np.sqrt(2))),
                               rtol=1e-12)


# ------------------------------------------------------------------------------ fused ops


@pytest.mark.parametrize("activation", ["Gelu", "FastGelu"])
def test_fused_matmul_bias_gelu(numba_on, monkeypatch, activation):
    feeds = {"a": rand(2, 5, 8), "b": rand(8, 12), "bias": rand(12)}
    model = ms_model("FusedMatMulBias", feeds, domain="onnxkiln", activation=activation)
    fast = both(monkeypatch, model, feeds, ort=False, variant="matmulbias.blas_numba")[0]
    t = (feeds["a"].astype(np.float64) @ feeds["b"] + feeds["bias"])
    if activation == "Gelu":
        want = 0.5 * t * (1 + scipy.special.erf(t / np.sqrt(2)))
    else:
        want = 0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t**3)))
    np.testing.assert_allclose(fast, want, rtol=1e-5, atol=1e-5)


def test_fused_attention_softmax(numba_on, monkeypatch):
    feeds = {"q": rand(2, 3, 5, 8), "k": rand(2, 3, 7, 8), "v": rand(2, 3, 7, 8),
             "m": rand(1, 1, 5, 7)}
    model = ms_model("ScaledDotProductAttention", feeds, domain="onnxkiln", scale=8.0,
                     divide=1)
    fast = both(monkeypatch, model, feeds, ort=False, variant="sdpa.blas_numba")[0]
    s = feeds["q"].astype(np.float64) @ np.swapaxes(feeds["k"], -1, -2) / 8.0 + feeds["m"]
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(fast, (e / e.sum(-1, keepdims=True)) @ feeds["v"],
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ MatMul


def test_matmul_variants():
    cases = [((4, 5), (5, 3), "matmul.gemm_2d"), ((2, 4, 5), (5, 3), "matmul.folded_2d"),
             ((2, 4, 5), (2, 5, 3), "matmul.batched"), ((5,), (5, 3), "matmul.gemm_2d")]
    for sa, sb, variant in cases:
        feeds = {"a": rand(*sa), "b": rand(*sb)}
        model = node_model("MatMul", feeds, opset=13)
        out, [(got, _)] = traced(model, feeds)
        assert got == variant
        np.testing.assert_allclose(out[0], feeds["a"] @ feeds["b"], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ switches


def test_env_var_switches_numba_off(monkeypatch):
    monkeypatch.setenv(_numba.ENV, "1")
    assert "ONNXKILN_NO_NUMBA" in _numba.disabled_reason()
    assert _numba.load("conv2d") is None
    x = rand(1, 6, 7, 7)
    model = node_model("Conv", {"x": x}, opset=13, initializers={"w": rand(6, 1, 3, 3)},
                       group=6, pads=[1, 1, 1, 1])
    out, [(variant, reason)] = traced(model, {"x": x})
    assert variant == "conv.depthwise_numpy" and "ONNXKILN_NO_NUMBA" in reason
    np.testing.assert_allclose(out[0], run_ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_missing_numba_falls_back(monkeypatch):
    """As when numba is not installed: every numba kernel keeps its numpy path."""
    monkeypatch.delenv(_numba.ENV, raising=False)
    monkeypatch.setattr(_numba, "_installed", False)
    assert "not installed" in _numba.disabled_reason()
    x = rand(2, 3, 16)
    model = ms_model("SkipLayerNormalization", {"x": x, "s": rand(2, 3, 16)},
                     inits={"g": rand(16), "beta": rand(16)})
    out, [(variant, reason)] = traced(model, {"x": x, "s": model_feed(model, x)})
    assert variant == "skiplayernormalization.numpy" and "not installed" in reason
    ref = run_ort(model, {"x": x, "s": model_feed(model, x)})
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-5, atol=1e-5)
    g = rand(4, 9, scale=3.0)
    out, [(variant, reason)] = traced(node_model("Gelu", {"x": g}, opset=20), {"x": g})
    assert variant == "gelu.numpy" and "not installed" in reason


def model_feed(model, x):
    return np.linspace(-1, 1, x.size, dtype=np.float32).reshape(x.shape)


def _four_kernel_model():
    return helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=4),
         helper.make_node("Gelu", ["y"], ["z"]),
         helper.make_node("LayerNormalization", ["z", "s"], ["t"], axis=-1),
         helper.make_node("Softmax", ["t"], ["u"], axis=-1)],
        "g", [tensor_info("x", np.float32, ["n", 4, "h", "w"])],
        [tensor_info("u", np.float32, None)],
        [onnx.numpy_helper.from_array(rand(4, 1, 3, 3), "w"),
         onnx.numpy_helper.from_array(rand(7), "s")]),
        opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def test_kernels_load_on_first_run(numba_on, monkeypatch):
    """Building the session loads no kernel; the first run loads the four it needs (from
    the disk cache, or compiled), later runs of other shapes load nothing more."""
    monkeypatch.setattr(_numba, "_compiled", {})  # as in a fresh process
    model = _four_kernel_model()
    ctx = TraceContext.in_memory()
    before = _numba.stats()["compiled"]
    session = InferenceSession.builder().trace(ctx).from_graph(model)
    assert _numba.stats()["compiled"] == before
    assert _numba._compiled == {}
    for x in (rand(1, 4, 5, 9), rand(2, 4, 9, 9)):  # a new shape: a new plan, no loading
        (u,) = session.run({"x": x})
        np.testing.assert_allclose(u, run_ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
        assert _numba.stats()["compiled"] == before + 4
    assert sorted(name for name, _ in _numba._compiled) == [
        "conv2d", "gelu", "norm_rows", "softmax_rows"]
    variants = [s.attributes["kernel_variant"] for s in ctx.spans if s.category == "node"]
    assert variants[:4] == ["conv.depthwise_numba", "gelu.numba", "layernormalization.numba",
                            "softmax.numba"]


def test_numba_failing_on_first_use_falls_back(numba_on, monkeypatch):
    """A session built while numba looked usable, whose first run finds it does not
    import: every kernel takes its numpy path and says why."""
    model = _four_kernel_model()
    session = InferenceSession.builder().trace(ctx := TraceContext.in_memory()) \
        .from_graph(model)
    monkeypatch.setattr(_numba, "_compiled", {})
    monkeypatch.setattr(_numba, "_import_error", None)
    monkeypatch.setitem(__import__("sys").modules, "numba", None)
    x = rand(1, 4, 6, 9)
    (u,) = session.run({"x": x})
    np.testing.assert_allclose(u, run_ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    spans = [s for s in ctx.spans if s.category == "node"]
    assert [s.attributes["kernel_variant"] for s in spans] == [
        "conv.depthwise_numpy", "gelu.numpy", "layernormalization.numpy", "softmax.numpy"]
    assert all("does not import" in s.attributes["kernel_variant_reason"] for s in spans)


def test_numba_that_does_not_import_falls_back(numba_on, monkeypatch):
    """An installed numba that fails to import (e.g. older than numpy) means numpy kernels."""
    monkeypatch.setattr(_numba, "_compiled", {})
    monkeypatch.setattr(_numba, "_import_error", None)
    monkeypatch.setitem(__import__("sys").modules, "numba", None)
    assert _numba.load("gelu") is None
    assert "does not import" in _numba.disabled_reason()
    x = rand(3, 8)
    model = node_model("Softmax", {"x": x}, opset=13, axis=-1)
    out, [(variant, _)] = traced(model, {"x": x})
    assert variant == "softmax.numpy"
    np.testing.assert_allclose(out[0], run_ort(model, {"x": x})[0], rtol=1e-6, atol=1e-6)
