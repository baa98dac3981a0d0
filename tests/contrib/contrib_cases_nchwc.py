"""Generated cases for onnxruntime's com.microsoft.nchwc ops (contrib_nchwc.py): blocked inputs
at this CPU's block size (the one onnxruntime's own nchwc kernels use here), channel counts
that need padding, filters in onnxruntime's reordered layouts, every fused activation the
transformer writes, the Sum input, depthwise, strided, dilated and padded convs."""

from __future__ import annotations

import dataclasses

import numpy as np
from contrib_harness import F32, Case, normal, spec
from onnx import helper

from onnxkiln.providers.cpu.contrib_nchwc import block_size, to_blocked
from onnxkiln.testing import run_ort

NCHWC = "com.microsoft.nchwc"


def ort_unshaped(model, feeds):
    """onnxruntime on the model with its inputs' shapes left unknown: onnxruntime's shape
    inference for nchwc pools rejects declared 5-D blocked inputs, which its own optimizer
    never writes (the blocked values it makes are intermediate)."""
    for v in model.graph.input:
        v.CopyFrom(helper.make_tensor_value_info(v.name, v.type.tensor_type.elem_type, None))
    return run_ort(model, feeds)


def nchwc_spec(op: str):
    """`spec` for an nchwc op, its cases run on onnxruntime by `ort_unshaped`."""

    def register(fn):
        def make(rng):
            return [dataclasses.replace(c, ort_runner=ort_unshaped) for c in fn(rng)]

        make.__name__ = fn.__name__
        spec(op, domain=NCHWC)(make)
        return fn

    return register


def block_weight(w: np.ndarray, b: int, blocked_in: bool) -> np.ndarray:
    """OIHW to onnxruntime's reordered filter (dims padded, data in block order): the
    inverse of contrib_nchwc.unblock_weight, written independently of it."""
    o, i, kh, kw = w.shape
    op = -(-o // b) * b
    ip = -(-i // b) * b if blocked_in else i
    wp = np.zeros((op, ip, kh, kw), F32)
    wp[:o, :i] = w
    if blocked_in:
        v = wp.reshape(op // b, b, ip // b, b, kh, kw).transpose(0, 2, 4, 5, 3, 1)
    else:
        v = wp.reshape(op // b, b, ip, kh, kw).transpose(0, 2, 3, 4, 1)
    return np.ascontiguousarray(v).reshape(op, ip, kh, kw)


def _blocked(rng, n, c, h, w):
    return to_blocked(normal(rng, (n, c, h, w)), block_size())


def _padded(v: np.ndarray, b: int) -> np.ndarray:
    out = np.zeros(-(-v.size // b) * b, F32)
    out[: v.size] = v
    return out


@nchwc_spec("ReorderInput")
def reorder_input(rng):
    return [Case("nchw-c12", {"x": normal(rng, (2, 12, 3, 4))}, {"channels_last": 0}),
            Case("nchw-c32", {"x": normal(rng, (1, 32, 2, 3))}),
            Case("nhwc-c20", {"x": normal(rng, (1, 3, 4, 20))}, {"channels_last": 1})]


@nchwc_spec("ReorderOutput")
def reorder_output(rng):
    b = block_size()
    return [Case("c5", {"x": _blocked(rng, 2, 5, 3, 4)}, {"channels": 5}),
            Case(f"c{2 * b}", {"x": _blocked(rng, 1, 2 * b, 2, 3)}, {"channels": 2 * b}),
            Case("nhwc-c20", {"x": _blocked(rng, 1, 20, 4, 3)},
                 {"channels": 20, "channels_last": 1})]


def _conv_case(rng, cid, c, o, k, *, nchw_in=False, depthwise=False, bias=True, sum_=False,
               attrs=None, hw=(9, 8)):
    b = block_size()
    x = normal(rng, (1, c, *hw))
    feeds = {"x": x if nchw_in else to_blocked(x, b)}
    w = normal(rng, (o, 1 if depthwise else c, k, k), scale=0.3)
    consts = {"w": block_weight(w, b, blocked_in=not (nchw_in or depthwise))}
    names = ["x", "w"]
    if bias:
        consts["bias"] = _padded(normal(rng, (o,)), b)
    names.append("bias" if bias else "")
    a = {"group": -(-c // b) * b if depthwise else 1, **(attrs or {})}
    if sum_:
        st, p = a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0])
        keff = [(k - 1) * d + 1 for d in a.get("dilations", [1, 1])]
        oh = (hw[0] + p[0] + p[2] - keff[0]) // st[0] + 1
        ow = (hw[1] + p[1] + p[3] - keff[1]) // st[1] + 1
        feeds["s"] = to_blocked(normal(rng, (1, o, oh, ow)), b)
        names.append("s")
    while names[-1] == "":
        names.pop()
    return Case(cid, feeds, a, consts, names, rtol=1e-4, atol=1e-4)


@nchwc_spec("Conv")
def conv(rng):
    b = block_size()
    return [
        _conv_case(rng, "nchw-input-c3-stride2", 3, 20, 3, nchw_in=True,
                   attrs={"pads": [1, 1, 1, 1], "strides": [2, 2], "activation": "Relu"}),
        _conv_case(rng, "blocked-c20-o24-pads", 20, 24, 3, attrs={"pads": [1, 0, 1, 2]}),
        _conv_case(rng, f"blocked-c{b}-1x1-nobias", b, 2 * b, 1, bias=False),
        _conv_case(rng, "depthwise-c20-stride2", 20, 20, 3, depthwise=True,
                   attrs={"pads": [1, 1, 1, 1], "strides": [2, 2],
                          "activation": "HardSwish"}),
        _conv_case(rng, "dilated-sum-relu", 12, 12, 3, sum_=True,
                   attrs={"pads": [2, 2, 2, 2], "dilations": [2, 2], "activation": "Relu"}),
        _conv_case(rng, "sum-noact", 8, 8, 1, sum_=True),
        _conv_case(rng, "sigmoid", 8, 8, 1, attrs={"activation": "Sigmoid"}),
        _conv_case(rng, "tanh", 8, 8, 1, attrs={"activation": "Tanh"}),
        _conv_case(rng, "clip", 8, 8, 1, attrs={"activation": "Clip",
                                                "activation_params": [-0.5, 0.7]}),
        _conv_case(rng, "leakyrelu", 8, 8, 1, attrs={"activation": "LeakyRelu",
                                                     "activation_params": [0.1]}),
        _conv_case(rng, "hardsigmoid", 8, 8, 1, attrs={
            "activation": "HardSigmoid", "activation_params": [1 / 6, 0.5]}),
        _conv_case(rng, "auto-pad-same-upper", 8, 8, 3, attrs={"auto_pad": "SAME_UPPER"}),
    ]


@nchwc_spec("MaxPool")
def max_pool(rng):
    return [Case("k3s2p1", {"x": _blocked(rng, 1, 20, 9, 8)},
                 {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
            Case("k2-ceil-dilated", {"x": _blocked(rng, 2, 8, 7, 7)},
                 {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1,
                  "dilations": [2, 2]})]


@nchwc_spec("AveragePool")
def average_pool(rng):
    return [Case("k3p1-exclude-pad", {"x": _blocked(rng, 1, 20, 6, 5)},
                 {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, rtol=1e-5, atol=1e-6),
            Case("k3p1-include-pad-s2", {"x": _blocked(rng, 1, 8, 7, 6)},
                 {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2],
                  "count_include_pad": 1}, rtol=1e-5, atol=1e-6)]


@nchwc_spec("GlobalAveragePool")
def global_average_pool(rng):
    return [Case("c20", {"x": _blocked(rng, 2, 20, 5, 6)}, rtol=1e-5, atol=1e-6)]


@nchwc_spec("GlobalMaxPool")
def global_max_pool(rng):
    return [Case("c20", {"x": _blocked(rng, 2, 20, 5, 6)})]


@nchwc_spec("Upsample")
def upsample(rng):
    x = _blocked(rng, 1, 20, 3, 4)
    return [Case("nearest-2x3", {"x": x}, {"scales": [1, 1, 2, 3], "mode": "nearest"}),
            Case("linear-asymmetric", {"x": x}, {"scales": [1, 1, 2, 2], "mode": "linear",
                                                 "coordinate_transformation_mode":
                                                 "asymmetric"}, rtol=1e-5, atol=1e-5),
            Case("linear-half-pixel", {"x": x}, {"scales": [1, 1, 3, 2], "mode": "linear",
                                                 "coordinate_transformation_mode":
                                                 "half_pixel"}, rtol=1e-5, atol=1e-5)]
