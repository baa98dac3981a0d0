"""com.microsoft QMoE (contrib_qmoe.py): 2/4/8-bit expert weights, per-row or block scales,
packed zero points, router_weights; against onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln.errors import SessionError
from onnxkiln.providers.cpu.contrib_qmoe import unpack_bits
from onnxkiln.testing import node_model, run_ort, run_ours

RNG = np.random.default_rng(21)
F32 = np.float32


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Little-endian bit streams: the first code in the low bits of each byte."""
    per = 8 // bits
    pad = -codes.shape[-1] % per
    codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], pad), codes.dtype)], axis=-1)
    c = codes.reshape(*codes.shape[:-1], -1, per).astype(np.uint16)
    return (c << (np.arange(per) * bits)).sum(-1).astype(np.uint8)


def quantized(e, n, k, bits, block, with_zp):
    groups = k // block if block else 1
    q = pack(RNG.integers(0, 2 ** bits, (e, n, k)).astype(np.uint8), bits)
    scales = (RNG.random((e, n, groups) if block else (e, n)) * 0.05 + 0.01).astype(F32)
    zp = None
    if with_zp:
        zshape = (e, n, groups) if block else (e, n)
        zp = pack(RNG.integers(0, 2 ** bits, zshape).astype(np.uint8), bits)
    return q, scales, zp


def qmoe_case(bits=4, block=0, zp=False, act="relu", fusion=0, k=2, norm=1, experts=4,
              hidden=32, inter=32, tokens=5, router_weights=False, const=False,
              dtype=F32, **attrs):
    width = 2 if act == "swiglu" and fusion else 1
    q1, s1, z1 = quantized(experts, width * inter, hidden, bits, block, zp)
    q2, s2, z2 = quantized(experts, hidden, inter, bits, block, zp)
    values = {"x": RNG.standard_normal((tokens, hidden)).astype(dtype),
              "r": RNG.standard_normal((tokens, experts)).astype(dtype),
              "q1": q1, "s1": s1.astype(dtype),
              "b1": (RNG.standard_normal((experts, width * inter)) / 3).astype(dtype),
              "q2": q2, "s2": s2.astype(dtype),
              "b2": (RNG.standard_normal((experts, hidden)) / 3).astype(dtype)}
    names = ["x", "r", "q1", "s1", "b1", "q2", "s2", "b2", "", "", ""]
    if zp:
        values |= {"z1": z1, "z2": z2}
        names += ["z1", "z2"]
    if router_weights:
        names += [""] * (14 - len(names)) + ["rw"]
        values["rw"] = RNG.random((tokens, experts)).astype(dtype)
    attrs = dict(k=k, activation_type=act, normalize_routing_weights=norm, swiglu_fusion=fusion,
                 expert_weight_bits=bits, **attrs)
    attrs.setdefault("weights_prepacked", 0)
    if block:
        attrs["block_size"] = block
    consts = {n: v for n, v in values.items() if const and n[0] in "qsbz"}
    feeds = {n: v for n, v in values.items() if n not in consts}
    m = node_model("QMoE", feeds, initializers=consts, domain="com.microsoft",
                   input_names=names, **attrs)
    return m, feeds


def check(m, feeds, tol=2e-6):
    ours, theirs = run_ours(m, feeds)[0], run_ort(m, feeds)[0]
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    scale = np.abs(theirs).max()
    np.testing.assert_allclose(ours.astype(F32), theirs.astype(F32), rtol=0, atol=tol * scale)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("block", [0, 16, 32])
@pytest.mark.parametrize("zp", [False, True])
def test_qmoe_matches(bits, block, zp):
    check(*qmoe_case(bits, block, zp))


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("act,fusion,attrs", [
    ("relu", 0, {}), ("silu", 0, {}), ("gelu", 0, {}),
    ("swiglu", 1, {"activation_alpha": 1.702, "activation_beta": 1.0, "swiglu_limit": 7.0}),
])
def test_qmoe_activations_and_constant_weights(act, fusion, attrs, const):
    check(*qmoe_case(4, 16, True, act, fusion, const=const, **attrs))


@pytest.mark.parametrize("norm", [0, 1])
def test_qmoe_router_weights_mix_the_chosen_experts(norm):
    check(*qmoe_case(4, router_weights=True, norm=norm))


def test_qmoe_mixed_bit_widths():
    m, feeds = qmoe_case(4, fc2_expert_weight_bits=4)
    check(m, feeds)


def test_qmoe_float16():
    check(*qmoe_case(4, 16, True, dtype=np.float16), tol=3e-3)


def test_unpack_bits_low_bits_first():
    packed = np.array([[0b11100100, 0b00011011]], np.uint8)
    assert unpack_bits(packed, 2, 8).tolist() == [[0, 1, 2, 3, 3, 2, 1, 0]]
    assert unpack_bits(packed, 4, 3).tolist() == [[4, 14, 11]]


@pytest.mark.parametrize("attrs,match", [
    ({"quant_type": "fp8"}, "quant_type 'fp8'"),
    ({"weights_prepacked": 1}, "prepacked"),
    ({"expert_weight_bits": 3}, "3 bits are not supported"),
    ({"block_size": 24}, "power of two"),
])
def test_qmoe_refuses_unsupported_attributes(attrs, match):
    m, feeds = qmoe_case(4, **{k: v for k, v in attrs.items() if k != "expert_weight_bits"})
    if "expert_weight_bits" in attrs:
        m, feeds = qmoe_case(4)
        for a in m.graph.node[0].attribute:
            if a.name == "expert_weight_bits":
                a.i = 3
    with pytest.raises(SessionError, match=match):
        run_ours(m, feeds)


def test_qmoe_refuses_bad_scales():
    from onnx import numpy_helper

    m, feeds = qmoe_case(4, 16, const=True)
    init = next(t for t in m.graph.initializer if t.name == "s1")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init)[:, :, :1], "s1"))
    with pytest.raises(SessionError, match="fc1 scales must be"):
        run_ours(m, feeds)
