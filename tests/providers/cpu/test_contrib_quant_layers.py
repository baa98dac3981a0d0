"""com.microsoft QAttention, QEmbedLayerNormalization, NhwcMaxPool and MatMulInteger16
(contrib_quant_layers.py) against onnxruntime's CPU provider.

int8 weights are drawn in [-63, 63]: MLAS's u8s8 GEMM without VNNI adds pairs of products in
saturating int16, which wider weights can overflow (see test_contrib_quant.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.errors import KernelError
from onnxkiln.testing import assert_matches_ort, node_model

MS = "com.microsoft"
RNG = np.random.default_rng(77)
F32 = np.float32


def model(op, feeds, inits=None, names=None, n_outputs=1, **attrs):
    return node_model(op, feeds, n_outputs=n_outputs, initializers=inits or {}, domain=MS,
                      input_names=names, **attrs)


def qrand(dtype, shape, lo=None, hi=None):
    info = np.iinfo(dtype)
    return RNG.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1,
                        shape).astype(dtype)


# ----------------------------------------------------------------------------------- QAttention


@pytest.mark.parametrize("wdt", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("const_weight", [False, True])
def test_qattention(wdt, per_column, masked, const_weight):
    b, s, d, heads = 2, 5, 8, 2
    x = qrand(np.uint8, (b, s, d))
    w = qrand(wdt, (d, 3 * d), -63 if wdt == np.int8 else None, 63 if wdt == np.int8 else None)
    ncol = 3 * d if per_column else 1
    wscale = RNG.uniform(0.005, 0.02, ncol).astype(F32)
    wzp = (qrand(wdt, (ncol,), 100, 140) if wdt == np.uint8 else np.zeros(ncol, wdt))
    feeds = {"x": x, "bias": RNG.standard_normal(3 * d).astype(F32),
             "xs": np.array(0.02, F32), "ws": wscale,
             "mask": np.array([5, 3], np.int32) if masked else None,
             "xz": np.array(128, np.uint8), "wz": wzp}
    weights = {"w": w}
    names = ["x", "w", "bias", "xs", "ws", "mask" if masked else "", "xz", "wz"]
    feeds = {k: v for k, v in feeds.items() if v is not None}
    if const_weight:
        inits = {**weights, "ws": feeds.pop("ws"), "wz": feeds.pop("wz")}
    else:
        inits, feeds = {}, {**feeds, **weights}
    m = model("QAttention", feeds, inits, names, n_outputs=1, num_heads=heads)
    assert_matches_ort(m, feeds, rtol=1e-4, atol=1e-4)


def test_qattention_past_present_and_causal():
    b, s, p, d, heads = 1, 3, 4, 8, 2
    feeds = {"x": qrand(np.uint8, (b, s, d)), "w": qrand(np.int8, (d, 3 * d), -63, 63),
             "bias": RNG.standard_normal(3 * d).astype(F32), "xs": np.array(0.03, F32),
             "ws": np.array(0.01, F32), "xz": np.array(120, np.uint8),
             "wz": np.array(0, np.int8),
             "past": RNG.standard_normal((2, b, heads, p, d // heads)).astype(F32)}
    names = ["x", "w", "bias", "xs", "ws", "", "xz", "wz", "past"]
    m = model("QAttention", feeds, None, names, n_outputs=2, num_heads=heads, unidirectional=1)
    _out, present = assert_matches_ort(m, feeds, rtol=1e-4, atol=1e-4)
    assert present.shape == (2, b, heads, p + s, d // heads)


def test_qattention_refuses_vector_input_scale():
    feeds = {"x": qrand(np.uint8, (1, 2, 4)), "w": qrand(np.int8, (4, 12)),
             "bias": np.zeros(12, F32), "xs": np.ones(2, F32), "ws": np.array(0.1, F32)}
    m = model("QAttention", feeds, None, list(feeds), num_heads=1)
    with pytest.raises(KernelError, match="input_scale must be a scalar"):
        InferenceSession.builder().from_graph(m).run(feeds)


# ---------------------------------------------------------------------- QEmbedLayerNormalization


@pytest.mark.parametrize("qdt", [np.uint8, np.int8])
@pytest.mark.parametrize("with_segment", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_qembed_layer_normalization(qdt, with_segment, with_mask):
    b, s, d, vocab = 2, 6, 16, 30
    ids = RNG.integers(0, vocab, (b, s)).astype(np.int32)

    def table(rows):
        return qrand(qdt, (rows, d))

    def scalar(v, dt):
        return np.array(v, dt)

    zp = (lambda: scalar(int(RNG.integers(100, 150)), qdt)) if qdt == np.uint8 else (
        lambda: scalar(int(RNG.integers(-10, 10)), qdt))
    feeds = {"ids": ids}
    if with_segment:
        feeds["seg"] = RNG.integers(0, 2, (b, s)).astype(np.int32)
    if with_mask:
        mask = np.ones((b, s), np.int32)
        mask[1, 4:] = 0
        feeds["mask"] = mask
    inits = {"word": table(vocab), "pos": table(s), "segt": table(2), "gamma": table(1)[0],
             "beta": table(1)[0], "word_s": scalar(0.01, F32), "pos_s": scalar(0.02, F32),
             "seg_s": scalar(0.015, F32), "gamma_s": scalar(0.01, F32),
             "beta_s": scalar(0.005, F32), "word_z": zp(), "pos_z": zp(), "seg_z": zp(),
             "gamma_z": zp(), "beta_z": zp()}
    seg = "seg" if with_segment else ""
    names = ["ids", seg, "word", "pos", "segt" if with_segment else "", "gamma", "beta",
             "mask" if with_mask else "", "word_s", "pos_s", "seg_s" if with_segment else "",
             "gamma_s", "beta_s", "word_z", "pos_z", "seg_z" if with_segment else "",
             "gamma_z", "beta_z"]
    m = model("QEmbedLayerNormalization", feeds, inits, names, n_outputs=2, epsilon=1e-12)
    assert_matches_ort(m, feeds, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------- NhwcMaxPool


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "dilations": [2, 1], "ceil_mode": 1, "strides": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
])
def test_nhwc_max_pool(dtype, attrs):
    x = qrand(dtype, (2, 7, 9, 3))
    x.flat[:4] = np.iinfo(dtype).min  # extremes survive the padding value
    x.flat[4:8] = np.iinfo(dtype).max
    m = model("NhwcMaxPool", {"x": x}, **attrs)
    assert_matches_ort(m, {"x": x})


def test_nhwc_max_pool_1d():
    x = qrand(np.uint8, (1, 10, 4))
    assert_matches_ort(model("NhwcMaxPool", {"x": x}, kernel_shape=[3]), {"x": x})


def test_nhwc_max_pool_refuses_float():
    x = np.zeros((1, 4, 4, 2), F32)
    with pytest.raises(KernelError, match="uint8 or int8"):
        InferenceSession.builder().from_graph(
            model("NhwcMaxPool", {"x": x}, kernel_shape=[2, 2])).run({"x": x})


# ------------------------------------------------------------------------------ MatMulInteger16


@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4, 2)), ((4,), (4, 3))])
def test_matmul_integer16(shapes):
    a = qrand(np.int16, shapes[0])
    b = qrand(np.int16, shapes[1])
    a.flat[0] = b.flat[0] = -32768  # the extreme product still fits int32 for K this small
    assert_matches_ort(model("MatMulInteger16", {"a": a, "b": b}), {"a": a, "b": b})


# ---------------------------------------------------------------------------------- QLinearConv


@pytest.mark.parametrize("xdt,wdt", [(np.uint8, np.uint8), (np.uint8, np.int8),
                                     (np.int8, np.int8)])
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_ms(xdt, wdt, channels_last, per_channel):
    n, c, h, w_, m, group = 2, 4, 6, 5, 6, 2
    x = qrand(xdt, (n, h, w_, c) if channels_last else (n, c, h, w_))
    lo, hi = (-63, 63) if wdt == np.int8 else (None, None)
    w = qrand(wdt, (m, c // group, 3, 3), lo, hi)
    k = m if per_channel else 1
    signed = np.dtype(xdt) == np.int8
    feeds = {"x": x}
    inits = {"xs": np.array(0.05, F32), "xz": np.array(-3 if signed else 120, xdt), "w": w,
             "ws": RNG.uniform(0.01, 0.03, k).astype(F32).reshape(-1 if per_channel else ()),
             "wz": np.zeros(k, wdt).reshape(-1 if per_channel else ()),
             "ys": np.array(0.04, F32),  # small: some outputs saturate at both ends
             "yz": np.array(5 if signed else 128, xdt),
             "bias": RNG.integers(-2000, 2000, m).astype(np.int32)}
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"]
    m_ = model("QLinearConv", feeds, inits, names, channels_last=channels_last, group=group,
               pads=[1, 0, 1, 1], strides=[1, 2], kernel_shape=[3, 3])
    y = assert_matches_ort(m_, feeds)[0]
    info = np.iinfo(xdt)
    assert (y == info.min).any() and (y == info.max).any()


# ----------------------------------------------------------------------------------- MatMulBnb4


@pytest.mark.parametrize("quant_type", [0, 1])
@pytest.mark.parametrize("k,n,block", [(32, 8, 16), (20, 3, 32), (64, 5, 64)])
@pytest.mark.parametrize("const_b", [True, False])
def test_matmul_bnb4(quant_type, k, n, block, const_b):
    b = RNG.integers(0, 256, (n * k + 1) // 2).astype(np.uint8)
    absmax = RNG.uniform(0.1, 2.0, -(-n * k // block)).astype(F32)
    a = RNG.standard_normal((2, 3, k)).astype(F32)
    consts = {"b": b, "absmax": absmax}
    feeds = {"a": a} if const_b else {"a": a, **consts}
    m = model("MatMulBnb4", feeds, consts if const_b else None, ["a", "b", "absmax"],
              K=k, N=n, block_size=block, quant_type=quant_type)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-5)


def test_matmul_bnb4_refuses_short_absmax():
    feeds = {"a": np.zeros((1, 32), F32), "b": np.zeros(64, np.uint8),
             "absmax": np.ones(1, F32)}
    m = model("MatMulBnb4", feeds, None, list(feeds), K=32, N=4, block_size=16, quant_type=1)
    with pytest.raises(KernelError, match="absmax must hold 8 values"):
        InferenceSession.builder().from_graph(m).run(feeds)


# ------------------------------------------------------------------- quantize_dynamic end to end


def test_quantize_dynamic_bert_block_matches_onnxruntime(tmp_path):
    """quantize_dynamic turns EmbedLayerNormalization + Attention into QEmbedLayerNormalization,
    DynamicQuantizeLinear and QAttention; the quantized model runs as onnxruntime runs it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from onnxkiln.testing import run_ort

    b, s, d, vocab = 2, 6, 16, 40
    weights = {"word": RNG.standard_normal((vocab, d)) * 0.5, "pos": RNG.standard_normal((s, d)),
               "segt": RNG.standard_normal((2, d)), "gamma": RNG.uniform(0.5, 1.5, d),
               "beta": RNG.standard_normal(d) * 0.1, "w": RNG.standard_normal((d, 3 * d)) * 0.3,
               "bias": RNG.standard_normal(3 * d) * 0.1}
    nodes = [
        helper.make_node("EmbedLayerNormalization",
                         ["ids", "seg", "word", "pos", "segt", "gamma", "beta", "mask"],
                         ["emb", "mask_index"], domain=MS, epsilon=1e-12),
        helper.make_node("Attention", ["emb", "w", "bias", "mask_index"], ["y"], domain=MS,
                         num_heads=2),
    ]
    graph = helper.make_graph(
        nodes, "bert_block",
        [helper.make_tensor_value_info(n, TensorProto.INT32, [b, s]) for n in ("ids", "seg",
                                                                              "mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, d])],
        [numpy_helper.from_array(v.astype(F32), k) for k, v in weights.items()])
    fp32 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)])
    onnx.save(fp32, tmp_path / "fp32.onnx")
    quantize_dynamic(tmp_path / "fp32.onnx", tmp_path / "q.onnx", weight_type=QuantType.QUInt8,
                     op_types_to_quantize=["Attention", "EmbedLayerNormalization"])
    quantized = onnx.load(tmp_path / "q.onnx")
    assert {"QAttention", "QEmbedLayerNormalization"} <= {n.op_type for n in quantized.graph.node}
    mask = np.ones((b, s), np.int32)
    mask[1, 4:] = 0
    feeds = {"ids": RNG.integers(0, vocab, (b, s)).astype(np.int32),
             "seg": RNG.integers(0, 2, (b, s)).astype(np.int32), "mask": mask}
    ours = InferenceSession.builder().from_graph(quantized).run(feeds)[0]
    np.testing.assert_allclose(ours, run_ort(quantized, feeds)[0], rtol=1e-5, atol=1e-5)
