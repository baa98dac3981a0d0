"""CUDA-provider torch kernels vs the numpy CPU provider (and onnxruntime where it has the
op): sampling (GridSample, AffineGrid, DeformConv, RoiAlign), signal (DFT, STFT, windows,
MelWeightMatrix), opset-27 sequence ops, image ops and the data-dependent selections
(NonMaxSuppression, Unique)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import check, node_info, reason  # noqa: E402

from onnxkiln.providers.cuda import REGISTRY as CUDA  # noqa: E402
from onnxkiln.testing import node_model, run_ort  # noqa: E402

R = np.random.default_rng(11)


def rand(shape, dtype=np.float32, scale=1.0):
    return (R.standard_normal(shape) * scale).astype(dtype)


def both(op, feeds, *, opset=21, initializers=None, n_outputs=1, ort=True, input_names=None,
         domain="", rtol=None, atol=None, ort_tol=(1e-4, 1e-5), **attrs):
    """Torch kernels vs the CPU provider; then (ort=True) vs onnxruntime. The torch outputs."""
    model = node_model(op, feeds, n_outputs=n_outputs, opset=opset, initializers=initializers,
                       domain=domain, input_names=input_names, **attrs)
    got = check(model, feeds, rtol=rtol, atol=atol)
    if ort:
        want = run_ort(model, feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            g = g.cpu().numpy()
            assert g.shape == w.shape, f"{op}: {g.shape} vs onnxruntime's {w.shape}"
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=ort_tol[0], atol=ort_tol[1], err_msg=op)
    return got


# ------------------------------------------------------------------------------ GridSample


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(mode, padding, align):
    x, grid = rand((2, 3, 5, 6)), rand((2, 4, 7, 2), scale=0.8)
    grid[0, 0, :3] = [[-1, -1], [1, 1], [0.5, -1.0]]  # corners and a border exactly
    both("GridSample", {"x": x, "grid": grid}, opset=20, mode=mode, padding_mode=padding,
         align_corners=align)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_3d_and_ints(mode, padding):
    x, grid = rand((1, 2, 3, 4, 5)), rand((1, 2, 3, 4, 3), scale=0.9)
    both("GridSample", {"x": x, "grid": grid}, opset=22, mode=mode, padding_mode=padding,
         ort=False)  # onnxruntime's CPU GridSample is 4-D only
    xi = R.integers(-100, 100, (1, 2, 4, 4)).astype(np.int32)
    both("GridSample", {"x": xi, "grid": rand((1, 3, 3, 2))}, opset=20, mode=mode,
         padding_mode=padding, ort=False)


def test_grid_sample_ms_and_opset16():
    feeds = {"x": rand((1, 2, 4, 5)), "grid": rand((1, 3, 3, 2))}
    both("GridSample", feeds, opset=16, mode="bicubic", padding_mode="border")
    both("GridSample", feeds, domain="com.microsoft", mode="bilinear", align_corners=1,
         ort=False)


def test_grid_sample_declines_unknown_mode():
    model = node_model("GridSample", {"x": rand((1, 1, 2, 2)), "grid": rand((1, 1, 1, 2))},
                       opset=20, mode="linear")
    model.graph.node[0].attribute[0].s = b"area"
    assert "mode 'area'" in reason(model)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [1, 2, 3, 1, 4]])
def test_affine_grid(align, size):
    r = len(size) - 2
    theta = rand((size[0], r, r + 1))
    # onnxruntime places a length-1 axis differently under align_corners=1 (see the CPU kernel)
    both("AffineGrid", {"theta": theta}, opset=20, initializers={"size": np.array(size)},
         align_corners=align, ort=1 not in size[2:])


@pytest.mark.parametrize("masked", [False, True])
def test_deform_conv(masked):
    x, w = rand((2, 4, 5, 6)), rand((6, 2, 3, 3))
    off = rand((2, 2 * 9 * 2, 5, 3), scale=1.5)
    feeds = {"x": x, "w": w, "off": off, "b": rand((6,))}
    if masked:
        feeds["m"] = R.uniform(0, 1, (2, 2 * 9, 5, 3)).astype(np.float32)
    both("DeformConv", feeds, opset=22, group=2, offset_group=2, strides=[1, 2],
         pads=[1, 0, 1, 1], dilations=[1, 1], ort=False)  # no DeformConv in onnxruntime's CPU


# ------------------------------------------------------------------------------ signal


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("axis", [1, 2, -2])
@pytest.mark.parametrize("length", [None, 6, 12])
def test_dft_forward(onesided, axis, length):
    x = rand((2, 8, 9, 1))
    inits = {"axis": np.array(axis, np.int64)}
    names = ["x", "", "axis"]
    if length is not None:
        inits["n"] = np.array(length, np.int64)
        names[1] = "n"
    # onnxruntime's float32 DFT (not a radix-2 length) is a few 1e-6 of the peak off
    both("DFT", {"x": x}, opset=20, initializers=inits, input_names=names, onesided=onesided,
         ort_tol=(1e-4, 5e-5))


@pytest.mark.parametrize("onesided", [0, 1])
def test_dft_inverse_and_v17(onesided):
    x = rand((2, 5, 6, 2))
    both("DFT", {"x": x}, opset=20, inverse=1, onesided=onesided,
         ort=not onesided)  # onnxruntime refuses inverse with onesided
    both("DFT", {"x": x}, opset=17, inverse=1, axis=2, onesided=0)
    both("DFT", {"x": x.astype(np.float64)}, opset=20, inverse=0, onesided=0)


def test_stft():
    sig = rand((2, 64, 1))
    win = np.hanning(16).astype(np.float32)
    both("STFT", {"s": sig, "w": win}, opset=17, initializers={"step": np.array(8, np.int64)},
         input_names=["s", "step", "w"], onesided=1)
    both("STFT", {"s": rand((1, 40, 2))}, opset=17,
         initializers={"step": np.array(5, np.int64), "n": np.array(10, np.int64)},
         input_names=["s", "step", "", "n"], onesided=0)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("dtype", [1, 11, 7])
def test_windows(op, periodic, dtype):
    both(op, {"n": np.array(10, np.int64)}, opset=17, periodic=periodic,
         output_datatype=dtype, ort=dtype != 7)  # onnxruntime has no int64 windows


def test_mel_weight_matrix():
    inits = {"m": np.array(8, np.int64), "d": np.array(64, np.int64),
             "r": np.array(16000, np.int64), "lo": np.array(20.0, np.float32),
             "hi": np.array(7000.0, np.float32)}
    both("MelWeightMatrix", {}, opset=17, initializers=inits, output_datatype=1)


# ------------------------------------------------------------------------------ opset 27


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("past", [False, True])
def test_linear_attention(rule, past):
    b, t, hq, hkv, dk, dv = 2, 5, 4, 2, 3, 4
    feeds = {"q": rand((b, t, hq * dk)), "k": rand((b, t, hkv * dk), scale=0.5),
             "v": rand((b, t, hkv * dv))}
    names = ["q", "k", "v", "", "", ""]
    if past:
        feeds["s"] = rand((b, hkv, dk, dv))
        names[3] = "s"
    if rule.startswith("gated"):
        feeds["g"] = -np.abs(rand((b, t, hkv * dk if past else hkv)))
        names[4] = "g"
    if rule.endswith("delta"):
        feeds["beta"] = R.uniform(0, 1, (b, t, hkv)).astype(np.float32)
        names[5] = "beta"
    while not names[-1]:
        names.pop()
    both("LinearAttention", feeds, opset=27, input_names=names, n_outputs=2, ort=False,
         update_rule=rule, q_num_heads=hq, kv_num_heads=hkv, **({"scale": 0.3} if past else {}))


def test_linear_attention_fp16_and_decline():
    feeds = {"q": rand((1, 3, 4), np.float16), "k": rand((1, 3, 2), np.float16),
             "v": rand((1, 3, 2), np.float16)}
    both("LinearAttention", feeds, opset=27, n_outputs=2, ort=False, update_rule="linear",
         q_num_heads=2, kv_num_heads=1)
    model = node_model("LinearAttention", feeds, opset=27, n_outputs=2, update_rule="linear",
                       q_num_heads=3, kv_num_heads=2)
    assert "positive multiple" in reason(model)


@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("act", ["none", "silu"])
@pytest.mark.parametrize("extras", [(), ("b",), ("b", "p")])
def test_causal_conv_with_state(k, act, extras):
    b, c, length = 2, 3, 5
    feeds = {"x": rand((b, c, length)), "w": rand((c, 1, k))}
    names = ["x", "w"]
    if "b" in extras:
        feeds["b"] = rand((c,))
        names.append("b")
    if "p" in extras:
        feeds["p"] = rand((b, c, k - 1))
        names.append("p")
    both("CausalConvWithState", feeds, opset=27, input_names=names, n_outputs=2, ort=False,
         activation=act)
    half = {n: v.astype(np.float16) for n, v in feeds.items()}
    both("CausalConvWithState", half, opset=27, input_names=names, n_outputs=2, ort=False,
         activation=act)


# ------------------------------------------------------------------------------ RoiAlign, NMS


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio", [0, 2])
def test_roi_align(mode, ctm, ratio):
    x = rand((2, 3, 10, 12))
    rois = np.array([[0, 0, 9, 9], [1.5, 2.2, 7.1, 4.0], [-2, -1, 14, 12], [3, 3, 3.2, 3.1],
                     [5, 5, 11.5, 9.5]], np.float32)
    idx = np.array([0, 1, 1, 0, 1], np.int64)
    both("RoiAlign", {"x": x, "rois": rois, "i": idx}, opset=16, mode=mode,
         coordinate_transformation_mode=ctm, output_height=3, output_width=4,
         sampling_ratio=ratio, spatial_scale=0.9, ort=mode == "avg")  # ORT's max mode differs


def test_roi_align_no_rois():
    both("RoiAlign", {"x": rand((1, 2, 4, 4)), "rois": np.zeros((0, 4), np.float32),
                      "i": np.zeros(0, np.int64)}, opset=16, ort=False)


def test_roi_align_bad_batch_index():
    feeds = {"x": rand((1, 2, 4, 4)), "rois": np.array([[0, 0, 2, 2]], np.float32),
             "i": np.array([1], np.int64)}
    info, _, _ = node_info(node_model("RoiAlign", feeds, opset=16))
    run = CUDA.resolve("", "RoiAlign", 16).build(info)
    with pytest.raises(IndexError, match=r"batch_indices must lie in \[0, 1\)"):
        run(*(torch.from_numpy(v) for v in feeds.values()))


def _nms_inputs(nb, nk, ns, center):
    xy = R.uniform(0, 10, (nb, ns, 2))
    wh = R.uniform(0.5, 4, (nb, ns, 2))
    if center:
        boxes = np.concatenate([xy, wh], axis=2)
    else:  # corners, every other box given max corner first
        boxes = np.concatenate([xy, xy + wh], axis=2)
        boxes[:, ::2] = boxes[:, ::2][..., [2, 3, 0, 1]]
    scores = R.uniform(0, 1, (nb, nk, ns)).astype(np.float32)
    scores[0, 0, 3] = scores[0, 0, 5]  # a tie: the lower index goes first
    return boxes.astype(np.float32), scores


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("iou", [0.0, 0.3, 0.7])
@pytest.mark.parametrize("score", [None, 0.4])
@pytest.mark.parametrize("limit", [1, 3, 100])
def test_non_max_suppression(center, iou, score, limit):
    boxes, scores = _nms_inputs(2, 3, 40, center)
    inits = {"m": np.array([limit], np.int64), "iou": np.array([iou], np.float32)}
    names = ["b", "s", "m", "iou"]
    if score is not None:
        inits["st"] = np.array([score], np.float32)
        names.append("st")
    both("NonMaxSuppression", {"b": boxes, "s": scores}, opset=11, initializers=inits,
         input_names=names, center_point_box=center)


def test_non_max_suppression_edges():
    boxes, scores = _nms_inputs(1, 2, 6, 0)
    # no max_output_boxes_per_class: nothing is selected
    both("NonMaxSuppression", {"b": boxes, "s": scores}, opset=11)
    boxes[0, 1] = boxes[0, 2] = [1, 1, 1, 3]  # zero-area boxes never suppress
    both("NonMaxSuppression", {"b": boxes, "s": scores}, opset=11,
         initializers={"m": np.array([10], np.int64), "iou": np.array([0.0], np.float32)},
         input_names=["b", "s", "m", "iou"])


def test_non_max_suppression_many_boxes():
    """Above the pairwise-matrix size the IoU rows of the kept boxes are computed apart."""
    boxes, scores = _nms_inputs(1, 1, 4200, 0)
    both("NonMaxSuppression", {"b": boxes, "s": scores}, opset=11, ort=False,
         initializers={"m": np.array([30], np.int64), "iou": np.array([0.5], np.float32),
                       "st": np.array([0.9], np.float32)},
         input_names=["b", "s", "m", "iou", "st"])


# ------------------------------------------------------------------------------ Unique


@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.bool_])
def test_unique(sorted_, axis, dtype):
    x = R.integers(0, 3, (6, 4)).astype(dtype)
    x[3] = x[1]
    kw = {} if axis is None else {"axis": axis}
    both("Unique", {"x": x}, opset=11, n_outputs=4, sorted=sorted_,
         ort=dtype in (np.float32, np.int64), **kw)


def test_unique_nan_and_signed_zero():
    x = np.array([2.0, np.nan, -0.0, 1.0, 0.0, np.nan, 2.0], np.float32)
    for s in (0, 1):
        both("Unique", {"x": x}, opset=11, n_outputs=4, sorted=s, ort=False)
    rows = np.array([[1, np.nan], [1, np.nan], [0, 2]], np.float32)
    both("Unique", {"x": rows}, opset=11, n_outputs=4, axis=0, ort=False)
    both("Unique", {"x": np.zeros((3, 0), np.float32)}, opset=11, n_outputs=4, axis=0,
         ort=False)


# ------------------------------------------------------------------------------ image ops


@pytest.mark.parametrize("xshape,shape,axes", [((6, 5), [4, 9], None),
                                                ((6, 5, 3), [2, 7], [-2, -1]),
                                                ((6, 5, 3), [5], [0]),
                                                ((6, 5, 3), [3, 3, 3], None)])
def test_center_crop_pad(xshape, shape, axes):
    kw = {} if axes is None else {"axes": axes}
    both("CenterCropPad", {"x": rand(xshape)}, opset=18,
         initializers={"s": np.array(shape, np.int64)}, **kw)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_col2im(dtype):
    x = (rand((2, 3 * 2 * 3, 12)) * 4).astype(dtype)
    both("Col2Im", {"x": x}, opset=18, initializers={"img": np.array([5, 7], np.int64),
                                                    "blk": np.array([2, 3], np.int64)},
         strides=[2, 1], pads=[1, 0, 0, 1], dilations=[1, 2], ort=dtype == np.float32)
    x3 = rand((1, 2 * 8, 8)).astype(dtype)
    both("Col2Im", {"x": x3}, opset=18, initializers={"img": np.array([3, 3, 3], np.int64),
                                                     "blk": np.array([2, 2, 2], np.int64)},
         ort=False)


@pytest.mark.parametrize("with_shape", [False, True])
def test_max_unpool(with_shape):
    x = rand((1, 2, 2, 3))
    # each max's flat position in the (1, 2, 4, 6) MaxPool input, inside its own 2x2 window
    rows, cols = np.meshgrid(np.arange(2), np.arange(3), indexing="ij")
    pos = (2 * rows + R.integers(0, 2, (2, 2, 3))) * 6 + 2 * cols + R.integers(0, 2, (2, 2, 3))
    idx = (pos + np.arange(2)[:, None, None] * 24)[None].astype(np.int64)
    inits = {"shape": np.array([1, 2, 5, 7], np.int64)} if with_shape else None
    names = ["x", "i", "shape"] if with_shape else None
    both("MaxUnpool", {"x": x, "i": idx}, opset=11, initializers=inits, input_names=names,
         kernel_shape=[2, 2], strides=[2, 2], ort=not with_shape)


# ------------------------------------------------------------------------------ Attention


@pytest.mark.parametrize("left,right", [(1, -1), (-1, 0), (2, 1), (0, 0)])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("past", [0, 3])
def test_attention_sliding_window(left, right, causal, past):
    b, hq, hkv, s, d = 2, 4, 2, 5, 8
    feeds = {"q": rand((b, hq, s, d)), "k": rand((b, hkv, s, d)), "v": rand((b, hkv, s, d))}
    names, n_out = ["q", "k", "v"], 1
    if past:
        feeds.update(pk=rand((b, hkv, past, d)), pv=rand((b, hkv, past, d)))
        names += ["", "pk", "pv"]
        n_out = 3
    both("Attention", feeds, opset=24, input_names=names, n_outputs=n_out,
         ort=False,  # onnxruntime 1.32 rejects the window attributes
         is_causal=causal, left_window_size=left, right_window_size=right)


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("window", [-1, 1])
@pytest.mark.parametrize("mask", [False, True])
def test_attention_nonpad_kv_seqlen(causal, window, mask):
    b, h, s, t, d = 3, 2, 4, 6, 8
    feeds = {"q": rand((b, h, s, d)), "k": rand((b, h, t, d)), "v": rand((b, h, t, d))}
    names = ["q", "k", "v", ""]
    if mask:
        feeds["m"] = R.uniform(-1, 1, (b, 1, s, t)).astype(np.float32)
        names[3] = "m"
    feeds["n"] = np.array([6, 4, 5], np.int64)
    names += ["", "", "n"]
    kw = {} if window == -1 else {"left_window_size": window}  # onnxruntime has no windows
    both("Attention", feeds, opset=24, input_names=names, ort=window == -1, is_causal=causal,
         **kw)


# ------------------------------------------------------------------------------ MaxPool Indices


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((1, 2, 6, 7), {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 0]}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "dilations": [2, 1], "ceil_mode": 1,
                    "strides": [2, 2]}),
    ((1, 1, 4, 5, 6), {"kernel_shape": [2, 2, 3], "strides": [2, 2, 2]}),
])
@pytest.mark.parametrize("order", [0, 1])
def test_max_pool_indices(shape, attrs, order):
    x = rand(shape)
    both("MaxPool", {"x": x}, opset=12, n_outputs=2, storage_order=order, **attrs,
         ort=not (order and len(shape) != 4))  # onnxruntime: storage_order only in 2-D


def test_attention_nonpad_shape_error():
    q = rand((2, 2, 3, 8))
    feeds = {"q": q, "k": q, "v": q, "n": np.array([3], np.int64)}
    names = ["q", "k", "v", "", "", "", "n"]
    info, _, _ = node_info(node_model("Attention", feeds, opset=24, input_names=names))
    run = CUDA.resolve("", "Attention", 24).build(info)
    with pytest.raises(ValueError, match=r"nonpad_kv_seqlen must have shape \(2,\)"):
        run(*(torch.from_numpy(feeds[k]) if k else None for k in names))
