"""Generated cases for the float, tensor and text contrib ops (contrib_transformer.py,
contrib_tensor.py, contrib_fused.py, contrib_norm.py, contrib_misc.py, contrib_text.py):
one small case per attribute set and dtype."""

from __future__ import annotations

import numpy as np
from contrib_harness import F16, F32, I32, I64, Case, normal, scalar, spec

FLOATS = ((F32, 1e-5, 1e-5), (F16, 2e-3, 2e-3))


def _per_dtype(make, dtypes=FLOATS):
    return [make(dt, rtol, atol) for dt, rtol, atol in dtypes]


@spec("Gelu")
def gelu(rng):
    return _per_dtype(lambda dt, r, a: Case(np.dtype(dt).name, {"x": normal(rng, (3, 9), dt, 3)},
                                            rtol=r, atol=a))


@spec("BiasGelu")
def bias_gelu(rng):
    return _per_dtype(lambda dt, r, a: Case(np.dtype(dt).name, {"x": normal(rng, (2, 3, 8), dt, 2),
                                                                "b": normal(rng, (8,), dt)},
                                            rtol=r, atol=a))


@spec("FastGelu")
def fast_gelu(rng):
    cases = _per_dtype(lambda dt, r, a: Case(np.dtype(dt).name + "-bias",
                                             {"x": normal(rng, (2, 8), dt, 3),
                                              "b": normal(rng, (8,), dt)}, rtol=r, atol=a))
    return [*cases, Case("float32", {"x": normal(rng, (4, 5), F32, 4)})]


@spec("QuickGelu")
def quick_gelu(rng):
    return [Case(f"alpha{alpha}", {"x": normal(rng, (3, 7), F32, 3)}, {"alpha": alpha})
            for alpha in (1.702, 1.0, -0.5)]


@spec("ScaledSiLU")
def scaled_silu(rng):
    return [Case("alpha", {"x": normal(rng, (3, 7), F32, 4)}, {"alpha": 0.5}),
            Case("scale-input", {"x": normal(rng, (3, 7), F16, 4), "s": scalar(1.7, F32)},
                 rtol=2e-3, atol=2e-3)]


@spec("Inverse")
def inverse(rng):
    def make(dt, r, a):
        m = normal(rng, (2, 4, 4), dt) + np.eye(4, dtype=dt) * 4
        return Case(np.dtype(dt).name, {"x": m}, rtol=r * 10, atol=a * 10)

    return _per_dtype(make, ((F32, 1e-5, 1e-5), (np.float64, 1e-10, 1e-12)))


@spec("Trilu")
def trilu(rng):
    x = normal(rng, (2, 4, 5))
    cases = [Case(f"upper{u}-k{k}", {"x": x, "k": np.array(k, I64)}, {"upper": u})
             for u in (0, 1) for k in (-1, 0, 2)]
    cases += [Case(f"upper{u}-k{k}-past-the-edge", {"x": x, "k": np.array(k, I64)}, {"upper": u})
              for u in (0, 1) for k in (-6, 7)]
    return [*cases, Case("int64-default", {"x": rng.integers(-9, 9, (5, 3)).astype(I64)})]


@spec("Range")
def range_(rng):
    return [Case("int32", {"s": scalar(3, I32), "l": scalar(-8, I32), "d": scalar(-2, I32)}),
            Case("float-no-delta", {"s": scalar(0.5, F32), "l": scalar(4.2, F32)}),
            Case("int64", {"s": scalar(0, I64), "l": scalar(10, I64), "d": scalar(3, I64)}),
            Case("float-100-steps", {"s": scalar(0.1, F32), "l": scalar(10.0, F32),
                                     "d": scalar(0.1, F32)}),  # start + i * delta, not a sum
            Case("int16-down", {"s": scalar(5, np.int16), "l": scalar(-5, np.int16),
                                "d": scalar(-3, np.int16)}),
            Case("empty", {"s": scalar(5, I32), "l": scalar(1, I32), "d": scalar(2, I32)})]


@spec("TransposeMatMul")
def transpose_matmul(rng):
    return [Case(f"ta{ta}-tb{tb}", {"a": normal(rng, (2, 5, 3) if ta else (2, 3, 5)),
                                    "b": normal(rng, (4, 5) if tb else (5, 4))},
                 {"transA": ta, "transB": tb, "alpha": 0.7}) for ta in (0, 1) for tb in (0, 1)]


@spec("FusedMatMul")
def fused_matmul(rng):
    cases = []
    for ta, tb, tba, tbb in ((0, 0, 0, 0), (1, 1, 0, 0), (1, 0, 1, 0), (0, 1, 0, 1)):
        a = normal(rng, (2, 3, 5) if not ta else (2, 5, 3))
        b = normal(rng, (2, 5, 4) if not tb else (2, 4, 5))
        if tba:
            a = normal(rng, (5, 2, 3))  # transBatchA: batch dims move after the matrix dims
        if tbb:
            b = normal(rng, (5, 2, 4)) if not tb else normal(rng, (4, 2, 5))
        cases.append(Case(f"{ta}{tb}{tba}{tbb}", {"a": a, "b": b},
                          {"transA": ta, "transB": tb, "transBatchA": tba, "transBatchB": tbb,
                           "alpha": 1.5}, rtol=1e-5, atol=1e-5))
    cases += [Case("broadcast-batch", {"a": normal(rng, (2, 1, 3, 5)), "b": normal(rng, (4, 5, 6))},
                   {"alpha": 0.5}, rtol=1e-5, atol=1e-5),
              Case("1d-b", {"a": normal(rng, (2, 3, 5)), "b": normal(rng, (5,))}, rtol=1e-5,
                   atol=1e-5)]
    return cases


@spec("FusedGemm")
def fused_gemm(rng):
    acts = [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2}), ("Tanh", {}),
            ("Sigmoid", {}), ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4})]
    return [Case(act, {"a": normal(rng, (4, 3)), "b": normal(rng, (5, 3)),
                       "c": normal(rng, (5,))},
                 {"activation": act, "transB": 1, "alpha": 0.8, "beta": 0.5, **extra})
            for act, extra in acts]


@spec("FusedConv")
def fused_conv(rng):
    sets = [("Relu", {}, True, False), ("Sigmoid", {"pads": [1, 1, 1, 1]}, False, False),
            ("LeakyRelu", {"activation_params": [0.1], "strides": [2, 2]}, True, True),
            ("Clip", {"activation_params": [-0.5, 0.5], "group": 2}, True, False),
            ("Tanh", {"dilations": [2, 2]}, False, True)]
    cases = []
    for act, attrs, with_b, with_z in sets:
        groups = attrs.get("group", 1)
        x = normal(rng, (1, 4, 7, 7))
        w = normal(rng, (6, 4 // groups, 3, 3))
        oh = (7 + 2 * attrs.get("pads", [0])[0] - 2 * attrs.get("dilations", [1])[0] - 1) // \
            attrs.get("strides", [1])[0] + 1
        feeds, names = {"x": x}, ["x", "w", "b" if with_b else ""]
        consts = {"w": w} | ({"b": normal(rng, (6,))} if with_b else {})
        if with_z:
            feeds["z"] = normal(rng, (1, 6, oh, oh))
            names.append("z")
        cases.append(Case(act, feeds, {"activation": act, "kernel_shape": [3, 3], **attrs},
                          consts, names, rtol=1e-4, atol=1e-5))
    return cases


CUDA_ONLY = "a CUDA-only contrib op (stable diffusion's UNet); onnxruntime's CPU build lacks it"


def _gelu(v: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return 0.5 * v * (1 + erf(v / np.sqrt(2)))


@spec("BiasAdd", ort_lacks=CUDA_ONLY)
def bias_add(rng):
    def ref(x, b, s):
        return [(x.astype(np.float64) + b + s).astype(x.dtype)]

    return _per_dtype(lambda dt, r, a: Case(np.dtype(dt).name, {
        "x": normal(rng, (2, 3, 320), dt), "b": normal(rng, (320,), dt),
        "s": normal(rng, (2, 3, 320), dt)}, rtol=r, atol=a, reference=ref))


@spec("BiasSplitGelu", ort_lacks=CUDA_ONLY)
def bias_split_gelu(rng):
    def ref(x, b):  # (x + b) split in two along the last axis: left * gelu(right)
        v = x.astype(np.float64) + b
        left, right = np.split(v, 2, axis=-1)
        return [(left * _gelu(right)).astype(x.dtype)]

    return _per_dtype(lambda dt, r, a: Case(np.dtype(dt).name, {
        "x": normal(rng, (2, 4, 2560), dt), "b": normal(rng, (2560,), dt)}, rtol=r * 2,
        atol=a * 2, reference=ref))


@spec("ExpandDims")
def expand_dims(rng):
    return [*(Case(f"axis{ax}", {"x": normal(rng, (2, 3)), "a": scalar(ax, I32)})
              for ax in (0, 2, -1, -3)),
            Case("strings", {"x": np.array(["a", "b"], object), "a": scalar(1, I32)}),
            Case("axis-out-of-range", {"x": normal(rng, (2, 3)), "a": scalar(4, I32)},
                 refuses=True)]


@spec("GatherND")
def gather_nd(rng):
    data = normal(rng, (3, 4, 5))
    return [Case("full", {"d": data, "i": rng.integers(0, 3, (2, 3)).astype(I64)}),
            Case("partial-int32", {"d": data, "i": np.array([[[2], [0]]], I32)}),
            Case("negative", {"d": data, "i": np.array([[-1, -4], [1, 3]], I64)})]


@spec("Pad")
def pad(rng):
    x = normal(rng, (2, 3, 4))
    pads = np.array([0, 1, 2, 1, 0, 3], I64)
    cases = [Case(mode, {"x": x, "p": pads}, {"mode": mode}) for mode in ("reflect", "edge")]
    cases.append(Case("constant", {"x": x, "p": pads, "v": scalar(-2.5, F32)}))
    cases.append(Case("negative", {"x": x, "p": np.array([0, -1, 1, 0, 0, -2], I64)}))
    cases.append(Case("pads-2d", {"x": x, "p": np.array([[0, 1, 2, 1, 0, 3]], I64)}))
    cases.append(Case("reflect-at-most-dim-1", {"x": x, "p": np.array([1, 2, 3, 1, 2, 3], I64)},
                      {"mode": "reflect"}))
    cases.append(Case("reflect-past-dim-1", {"x": x, "p": np.array([0, 3, 0, 0, 0, 0], I64)},
                      {"mode": "reflect"}, refuses=True))
    return cases


@spec("Unique")
def unique(rng):
    return [Case("float", {"x": rng.integers(-3, 4, 12).astype(F32)}, n_out=3),
            Case("negative-zero", {"x": np.array([0.0, -0.0, 2, 2, -1], F32)}, n_out=3),
            Case("nans-distinct", {"x": np.array([1.0, np.nan, 1, np.nan, -0.0, 0.0], F32)},
                 n_out=3)]


@spec("CDist")
def cdist(rng):
    return [Case(metric, {"a": normal(rng, (5, 4), dt), "b": normal(rng, (3, 4), dt)},
                 {"metric": metric}, rtol=1e-5, atol=1e-5)
            for metric in ("euclidean", "sqeuclidean") for dt in (F32, np.float64)]


@spec("GridSample")
def grid_sample(rng):
    cases = []
    for mode in ("bilinear", "nearest", "bicubic"):
        for pm, ac in (("zeros", 0), ("border", 1), ("reflection", 0)):
            cases.append(Case(f"{mode}-{pm}-ac{ac}", {
                "x": normal(rng, (1, 2, 4, 5)),
                "g": rng.uniform(-1.2, 1.2, (1, 3, 4, 2)).astype(F32)},
                {"mode": mode, "padding_mode": pm, "align_corners": ac}, rtol=1e-4, atol=1e-5))
    # nearest on half-pixel points (rounded half to even) and far outside the image
    half = np.array([[[[-0.75, -0.75], [-0.25, -0.25], [0.25, 0.25], [0.75, 0.75]]]], F32)
    x = normal(rng, (1, 1, 4, 4))
    cases += [Case(f"nearest-half-pixels-{pm}", {"x": x, "g": half},
                   {"mode": "nearest", "padding_mode": pm}) for pm in ("zeros", "border")]
    far = rng.uniform(-3, 3, (1, 5, 5, 2)).astype(F32)
    cases += [Case(f"{mode}-reflection-far-ac{ac}", {"x": x, "g": far},
                   {"mode": mode, "padding_mode": "reflection", "align_corners": ac},
                   rtol=1e-4, atol=1e-5) for mode in ("bilinear", "bicubic") for ac in (0, 1)]
    return cases


@spec("UnfoldTensor")
def unfold_tensor(rng):
    x = normal(rng, (2, 7, 3))
    return [Case(f"dim{d}-size{s}-step{st}", {"x": x}, {"dim": d, "size": s, "step": st})
            for d, s, st in ((1, 3, 2), (-1, 2, 1), (1, 7, 1), (0, 1, 1))]


def _ln_inputs(rng, dt, hidden=8):
    return {"x": normal(rng, (2, 3, hidden), dt), "skip": normal(rng, (2, 3, hidden), dt),
            "gamma": normal(rng, (hidden,), dt), "beta": normal(rng, (hidden,), dt),
            "bias": normal(rng, (hidden,), dt)}


@spec("SkipLayerNormalization")
def skip_layer_norm(rng):
    cases = []
    for dt, r, a in FLOATS:
        f = _ln_inputs(rng, dt)
        cases.append(Case(f"{np.dtype(dt).name}-all-outputs", f, {"epsilon": 1e-5}, n_out=4,
                          rtol=r, atol=a))
        g = {k: f[k] for k in ("x", "skip", "gamma")}
        cases.append(Case(f"{np.dtype(dt).name}-no-beta", g, rtol=r, atol=a))
    f = _ln_inputs(rng, F32)
    cases += [Case("skip-1SH-broadcast", {**f, "skip": normal(rng, (1, 3, 8))}, n_out=4,
                   names=["x", "skip", "gamma", "beta", "bias"]),
              Case("skip-2d-broadcast", {"x": f["x"], "skip": normal(rng, (3, 8)),
                                         "gamma": f["gamma"]}),
              Case("2d-input", {"x": normal(rng, (6, 8)), "skip": normal(rng, (6, 8)),
                                "gamma": f["gamma"], "beta": f["beta"]}, n_out=4)]
    return cases


@spec("SkipSimplifiedLayerNormalization")
def skip_simplified_layer_norm(rng):
    cases = []
    for dt, r, a in FLOATS:
        f = _ln_inputs(rng, dt)
        f.pop("beta")
        cases.append(Case(f"{np.dtype(dt).name}-bias", f, {"epsilon": 1e-6}, n_out=4, rtol=r,
                          atol=a, names=["x", "skip", "gamma", "bias"]))
    return cases


@spec("SimplifiedLayerNormalization")
def simplified_layer_norm(rng):
    # onnxruntime registers this op in the ai.onnx domain only; some exporters write it in
    # com.microsoft, which onnxkiln also serves: compared with onnxruntime's ai.onnx kernel
    return [Case(f"axis{ax}", {"x": normal(rng, (2, 3, 8)), "g": normal(rng, g)},
                 {"axis": ax, "epsilon": 1e-5}, ort_domain="", n_out=2)
            for ax, g in ((-1, (8,)), (1, (3, 8)))] + [
        Case("float16-stash-float", {"x": normal(rng, (2, 3, 8), F16),
                                     "g": normal(rng, (8,), F16)}, {"stash_type": 1},
             ort_domain="", n_out=2, rtol=2e-3, atol=2e-3)]


@spec("GatedAdd")
def gated_add(rng):
    return _per_dtype(lambda dt, r, a: Case(np.dtype(dt).name, {
        "x": normal(rng, (2, 3, 6), dt), "y": normal(rng, (2, 3, 6), dt),
        "g": normal(rng, (2, 3, 1), dt)}, rtol=1e-6, atol=0))  # rounded as onnxruntime does


@spec("GatedRMSNorm")
def gated_rms_norm(rng):
    cases = []
    for act in ("silu", "sigmoid"):
        for dt, r, a in FLOATS:
            x = normal(rng, (2, 3, 16), dt)
            cases.append(Case(f"{act}-{np.dtype(dt).name}", {
                "x": x, "scale": rng.uniform(0.5, 1.5, 8).astype(dt),
                "gate": normal(rng, x.shape, dt)}, {"activation": act, "epsilon": 1e-5},
                rtol=r, atol=a))
    return cases


@spec("BranchwiseRMSNorm")
def branchwise_rms_norm(rng):
    return [Case("grouped-scale", {"x": normal(rng, (2, 5, 3, 4)),
                                   "s": rng.uniform(0.5, 1.5, (3, 4)).astype(F32)}),
            Case("flattened", {"x": normal(rng, (2, 5, 12))}, {"num_branches": 3}),
            Case("flattened-shared-scale", {"x": normal(rng, (2, 5, 12), F16),
                                            "s": rng.uniform(0.5, 1.5, 4).astype(F16)},
                 {"num_branches": 3, "epsilon": 1e-3}, rtol=2e-3, atol=2e-3)]


@spec("MurmurHash3")
def murmur_hash3(rng):
    return [Case("int32", {"x": np.array([0, 1, -1, 2**31 - 1, -(2**31)], I32)}),
            Case("string-positive0", {"x": np.array(["", "a", "héllo", "abcd"], object)},
                 {"positive": 0, "seed": 42}),
            Case("int64-seed", {"x": rng.integers(-(2**62), 2**62, 6).astype(I64)},
                 {"seed": 2**32 - 1}),
            Case("uint64", {"x": np.array([0, 1, 2**63, 2**64 - 1], np.uint64)}),
            Case("float-zeros", {"x": np.array([0.0, -0.0, 1.5, np.inf], F32)}, {"positive": 0}),
            Case("double", {"x": np.array([0.0, -0.0, 1.5, np.nan])}, {"seed": 7})]


@spec("CropAndResize")
def crop_and_resize(rng):
    feeds = {"x": normal(rng, (2, 3, 6, 7)),
             "rois": np.array([[0.1, 0.2, 0.8, 0.9], [-0.2, 0.5, 0.6, 1.3],
                               [0.7, 0.6, 0.2, 0.1]], F32),
             "idx": np.array([0, 1, 0], I32), "crop": np.array([3, 4], I32)}
    return [Case(mode, feeds, {"mode": mode, "extrapolation_value": -2.0}, rtol=1e-5, atol=1e-5)
            for mode in ("bilinear", "nearest")]


@spec("NGramRepeatBlock")
def ngram_repeat_block(rng):
    ids = np.array([[1, 2, 3, 1, 2, 3, 1, 2], [4, 4, 4, 4, 0, 9, 4, 4]], I64)
    return [Case(f"n{n}", {"ids": ids, "s": normal(rng, (2, 10))}, {"ngram_size": n})
            for n in (1, 2, 3)]


@spec("DynamicTimeWarping")
def dynamic_time_warping(rng):
    return [Case("random", {"c": rng.uniform(0, 1, (5, 7)).astype(F32)}),
            Case("ties", {"c": np.zeros((3, 4), F32)}),
            Case("one-row", {"c": rng.uniform(0, 1, (1, 6)).astype(F32)})]


@spec("BifurcationDetector")
def bifurcation_detector(rng):
    src = rng.integers(0, 30, 20).astype(I64)
    cur = np.concatenate([[2], src[:4]]).astype(I64)
    pred = np.concatenate([src[4:], [99]]).astype(I64)  # len(src) + 1 - prev tokens
    return [Case("no-pred", {"src": src, "cur": cur, "prev": scalar(0, I64)}, n_out=2,
                 attrs={"min_ngram_size": 1, "max_ngram_size": 3}),
            Case("pred", {"src": src, "cur": cur, "prev": scalar(4, I64), "pred": pred},
                 n_out=2, attrs={"min_ngram_size": 2, "max_ngram_size": 4})]


@spec("WordConvEmbedding")
def word_conv_embedding(rng):
    seq = np.array([[3, 5, 1, 0, 0, 0], [7, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6]], I32)
    return [Case(f"w{w}", {"seq": seq}, {"conv_window_size": w},
                 {"w": normal(rng, (5, 1, w, 4)), "b": normal(rng, (5,)),
                  "c": normal(rng, (8, 4))}) for w in (1, 3)]


@spec("Tokenizer")
def tokenizer(rng):
    text = np.array([["Hello world", "a,b;;c"], ["", "xyz  uvw,"]], object)
    base = {"mark": 0, "pad_value": "#", "mincharnum": 1}
    return [Case("separators", {"t": text}, {**base, "separators": [" ", ",", ";"]}),
            Case("marks-mincharnum2", {"t": text[0]},
                 {**base, "mark": 1, "mincharnum": 2, "separators": [" "]}),
            Case("tokenexp", {"t": text}, {**base, "tokenexp": "[a-z]+"}),
            Case("empty-separator-marks", {"t": text[1]},
                 {**base, "mark": 1, "separators": [""]}),
            Case("tokenexp-word-mincharnum3", {"t": text},
                 {**base, "tokenexp": "\\w+", "mincharnum": 3})]


@spec("ConvTransposeWithDynamicPads")
def conv_transpose_with_dynamic_pads(rng):
    """ConvTranspose whose pads come in as an int64 input (X, W, Pads, B)."""
    cases = []
    for name, x_shape, w_shape, pads, attrs in (
        ("2d-strided", (1, 4, 5, 5), (4, 3, 3, 3), [1, 0, 1, 2], {"strides": [2, 2]}),
        ("2d-groups-output-padding", (1, 4, 4, 4), (4, 2, 3, 3), [1, 1, 1, 1],
         {"group": 2, "strides": [2, 2], "output_padding": [1, 1]}),
        ("1d-dilated", (2, 3, 6), (3, 2, 3), [2, 1], {"dilations": [2]}),
    ):
        bias = normal(rng, (w_shape[1] * attrs.get("group", 1),))
        cases.append(Case(name, {"x": normal(rng, x_shape), "p": np.array(pads, I64)}, attrs,
                          {"w": normal(rng, w_shape), "b": bias}, ["x", "w", "p", "b"],
                          rtol=1e-5, atol=1e-5))
    return cases


@spec("MoE")
def moe(rng):
    """Mixture of experts: top-k softmax routing over expert FFNs [E, inter, hidden] /
    [E, hidden, inter]; interleaved SwiGLU doubles fc1's rows."""
    cases = []
    e, hidden, inter = 4, 8, 6
    for act, k, norm, extra in (("relu", 1, 0, {}), ("gelu", 2, 1, {}), ("silu", 2, 0, {}),
                                ("identity", 4, 1, {}),
                                ("swiglu", 2, 1, {"swiglu_fusion": 1, "activation_alpha": 1.702,
                                                  "activation_beta": 1.0,
                                                  "swiglu_limit": 7.0})):
        width = 2 if extra.get("swiglu_fusion") else 1
        x = normal(rng, (2, 3, hidden) if act == "silu" else (5, hidden))
        feeds = {"x": x, "router": normal(rng, (x.size // hidden, e), F32, 2)}
        consts = {"w1": normal(rng, (e, width * inter, hidden), F32, 1 / 3),
                  "b1": normal(rng, (e, width * inter), F32, 1 / 3),
                  "w2": normal(rng, (e, hidden, inter), F32, 1 / 3),
                  "b2": normal(rng, (e, hidden), F32, 1 / 3)}
        cases.append(Case(f"{act}-k{k}-norm{norm}", feeds,
                          {"k": k, "activation_type": act, "normalize_routing_weights": norm,
                           **extra}, consts, ["x", "router", "w1", "b1", "w2", "b2"],
                          rtol=1e-5, atol=1e-5))
    return cases
