"""Torch kernels: com.microsoft fused float ops and the optimizer's onnxkiln-domain ops.

FusedConv / FusedGemm / FusedMatMul, Gelu / BiasGelu / FastGelu / QuickGelu / BiasAdd /
BiasSplitGelu, SkipLayerNormalization / SkipSimplifiedLayerNormalization, MatMulNBits
(dequantized once on the host when its weights are constant), and onnxkiln::FusedMatMulBias /
onnxkiln::ScaledDotProductAttention. Attribute defaults are onnxruntime's (onnx has no
schema for these domains). Activations compute in float32 for float16/bfloat16.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from onnxkiln.ops.nbits import dequantize_weight, nbits_geometry
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._util import attr_str, up, wants
from onnxkiln.providers.cuda.device import current_device
from onnxkiln.providers.cuda.dtypes import FLOATS, needs, to_torch
from onnxkiln.providers.cuda.nn import _gemm, conv_fn
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor
MS = "com.microsoft"
_FLOAT = needs(FLOATS)
_SQRT1_2 = math.sqrt(0.5)
_GELU_K = math.sqrt(2.0 / math.pi)

Act = Callable[[Tensor], Tensor]

_ACTS: dict[str, tuple[tuple[str, ...], Callable[..., Act]]] = {
    "Relu": ((), lambda: torch.relu),
    "Tanh": ((), lambda: torch.tanh),
    "Sigmoid": ((), lambda: torch.sigmoid),
    "Softsign": ((), lambda: lambda y: y / (1 + torch.abs(y))),
    "Softplus": ((), lambda: lambda y: torch.logaddexp(y, torch.zeros_like(y))),
    "LeakyRelu": (("alpha",), lambda a: lambda y: torch.where(y < 0, y * a, y)),
    "Elu": (("alpha",), lambda a: lambda y: torch.where(y < 0, torch.expm1(y) * a, y)),
    "ThresholdedRelu": (("alpha",), lambda a: lambda y: torch.where(y <= a, 0.0, y)),
    "Clip": (("min", "max"), lambda lo, hi: lambda y: torch.clamp(y, lo, hi)),
    "HardSigmoid": (("alpha", "beta"), lambda a, b: lambda y: torch.clamp(y * a + b, 0, 1)),
    "ScaledTanh": (("alpha", "beta"), lambda a, b: lambda y: torch.tanh(y * b) * a),
    "ParametricSoftplus": (("alpha", "beta"), lambda a, b: lambda y: torch.logaddexp(
        y * b, torch.zeros_like(y)) * a),
    "Selu": (("alpha", "gamma"), lambda a, g: lambda y: torch.where(
        y < 0, torch.expm1(y) * a, y) * g),
    "HardSwish": ((), lambda: F.hardswish),
    "Silu": ((), lambda: F.silu),
}
_CONV_ACTS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid")
_OURS_CONV_ACTS = (*_CONV_ACTS, "HardSwish", "Silu")  # onnxkiln's FusedConv (optimizer-made)


def _activation(op: str, name: str, params: dict, allowed=None) -> Act | None:
    if not name:
        return None
    entry = _ACTS.get(name)
    if entry is None or (allowed is not None and name not in allowed):
        raise ValueError(f"{op}: unsupported activation {name!r}")
    needed, build = entry
    missing = [p for p in needed if params.get(p) is None]
    if missing:
        raise ValueError(f"{op}: activation {name} needs parameter(s) {missing}")
    return build(*(float(params[p]) for p in needed))


def _apply(y: Tensor, act: Act | None) -> Tensor:
    if act is None:
        return y
    return act(up(y)).to(y.dtype)


@kernel("FusedConv", since=1, domain=MS, factory=True, supports=_FLOAT)
def fused_conv(info: NodeInfo) -> Callable[..., Tensor]:
    """activation(Conv(X, W, B) + Z); activation parameters in `activation_params`."""
    return _fused_conv(info, _CONV_ACTS)


@kernel("FusedConv", since=1, domain="onnxkiln", factory=True, supports=_FLOAT)
def fused_conv_ours(info: NodeInfo) -> Callable[..., Tensor]:
    """onnxkiln's FusedConv (the optimizer's Conv -> activation): com.microsoft's
    activations plus HardSwish and Silu, so CNNs placed on the device stay there."""
    return _fused_conv(info, _OURS_CONV_ACTS)


def _fused_conv(info: NodeInfo, allowed: tuple[str, ...]) -> Callable[..., Tensor]:
    name = attr_str(info.attrs.get("activation"))
    plist = list(info.attrs.get("activation_params") or [])
    needed = _ACTS[name][0] if name in _ACTS else ()
    act = _activation("FusedConv", name, dict(zip(needed, plist)), allowed)
    conv_info = dataclasses.replace(info, op_type="Conv", domain="", opset=11, attrs={
        k: v for k, v in info.attrs.items() if k not in ("activation", "activation_params")})
    conv = conv_fn(conv_info)

    def run(x: Tensor, w: Tensor, b: Tensor | None = None, z: Tensor | None = None) -> Tensor:
        y = conv(x, w, b)
        if z is not None:
            y = y + z
        return _apply(y, act)

    return run


@kernel("FusedGemm", since=1, domain=MS, factory=True, supports=_FLOAT)
def fused_gemm(info: NodeInfo) -> Callable[..., Tensor]:
    """activation(alpha * A' @ B' + beta * C), parameters in activation_alpha/beta/gamma."""
    a = info.attrs
    act = _activation("FusedGemm", attr_str(a.get("activation")), {
        "alpha": a.get("activation_alpha"), "beta": a.get("activation_beta"),
        "gamma": a.get("activation_gamma")})
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    ta, tb = bool(a.get("transA", 0)), bool(a.get("transB", 0))

    def run(x: Tensor, w: Tensor, c: Tensor | None = None) -> Tensor:
        return _apply(_gemm(x, w, c, alpha=alpha, beta=beta, ta=ta, tb=tb), act)

    return run


def _orient(x: Tensor, trans: bool, trans_batch: bool) -> Tensor:
    if trans_batch:
        if x.ndim < 3:
            raise ValueError(f"FusedMatMul: transBatch needs rank >= 3, got {tuple(x.shape)}")
        x = torch.movedim(x, 0, -2)
    if trans and x.ndim >= 2:
        x = x.transpose(-1, -2)
    return x


@kernel("FusedMatMul", since=1, domain=MS, factory=True, supports=_FLOAT)
def fused_matmul(info: NodeInfo) -> Callable[..., Tensor]:
    """alpha * matmul(A', B') with transA/transB and transBatchA/transBatchB."""
    a = info.attrs
    alpha = float(a.get("alpha", 1.0))
    ta, tb = bool(a.get("transA", 0)), bool(a.get("transB", 0))
    tba, tbb = bool(a.get("transBatchA", 0)), bool(a.get("transBatchB", 0))

    def run(x: Tensor, w: Tensor) -> Tensor:
        y = torch.matmul(_orient(x, ta, tba), _orient(w, tb, tbb))
        return y * alpha if alpha != 1.0 else y

    return run


# ---------------------------------------------------------------------------------------
# GELU family


def _biased(x: Tensor, bias: Tensor | None) -> Tensor:
    return up(x) if bias is None else up(x) + up(bias)


def _gelu(t: Tensor) -> Tensor:
    return t * (torch.erf(t * _SQRT1_2) + 1) * 0.5


def _fast_gelu(t: Tensor) -> Tensor:
    return t * (torch.tanh(t * (_GELU_K + 0.044715 * _GELU_K * t * t)) + 1) * 0.5


@kernel("Gelu", since=1, domain=MS, supports=_FLOAT)
def ms_gelu(x: Tensor) -> Tensor:
    """0.5 x (1 + erf(x / sqrt 2))."""
    return _gelu(up(x)).to(x.dtype)


@kernel("BiasGelu", since=1, domain=MS, supports=_FLOAT)
def bias_gelu(a: Tensor, b: Tensor) -> Tensor:
    """Exact GELU of A + B (B 1-D over the last axis)."""
    return _gelu(_biased(a, b)).to(a.dtype)


@kernel("FastGelu", since=1, domain=MS, supports=_FLOAT)
def fast_gelu(x: Tensor, bias: Tensor | None = None) -> Tensor:
    """tanh-approximated GELU of X (+ bias)."""
    return _fast_gelu(_biased(x, bias)).to(x.dtype)


@kernel("QuickGelu", since=1, domain=MS, factory=True, supports=_FLOAT)
def quick_gelu(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """x * sigmoid(alpha x), alpha defaulting to 1.702."""
    alpha = float(info.attrs.get("alpha", 1.702))
    return lambda x: (up(x) * torch.sigmoid(up(x) * alpha)).to(x.dtype)


@kernel("BiasAdd", since=1, domain=MS, supports=_FLOAT)
def bias_add(x: Tensor, bias: Tensor, skip: Tensor) -> Tensor:
    """X + bias + skip."""
    return (up(x) + up(bias) + up(skip)).to(x.dtype)


@kernel("BiasSplitGelu", since=1, domain=MS, supports=_FLOAT)
def bias_split_gelu(x: Tensor, bias: Tensor) -> Tensor:
    """(X + bias) split in halves on the last axis: left * Gelu(right)."""
    t = _biased(x, bias)
    d = t.shape[-1] // 2
    return (t[..., :d] * _gelu(t[..., d:])).to(x.dtype)


# ---------------------------------------------------------------------------------------
# Skip(Simplified)LayerNormalization


def _skip_norm(info: NodeInfo, simplified: bool) -> Callable[..., tuple]:
    eps = float(info.attrs.get("epsilon", 1e-12))
    want_mean, want_inv, want_sum = wants(info, 1), wants(info, 2), wants(info, 3)

    def run(x, skip, gamma, *rest) -> tuple:
        if simplified:
            beta, bias = None, (rest[0] if rest else None)
        else:
            beta = rest[0] if rest else None
            bias = rest[1] if len(rest) > 1 else None
        ct = torch.float64 if x.dtype == torch.float64 else torch.float32
        s = x.to(ct) + skip.to(ct)
        if bias is not None:
            s = s + bias.to(ct).reshape(-1)
        total = s.to(x.dtype) if want_sum else None
        if simplified:
            mean = None
            inv = torch.rsqrt(torch.mean(s * s, dim=-1, keepdim=True) + eps)
            y = s * inv
        else:
            mean = torch.mean(s, dim=-1, keepdim=True)
            c = s - mean
            inv = torch.rsqrt(torch.mean(c * c, dim=-1, keepdim=True) + eps)
            y = c * inv
        y = y * gamma.to(ct).reshape(-1)
        if beta is not None:
            y = y + beta.to(ct).reshape(-1)
        mean_out = None
        if want_mean:
            mean_out = torch.zeros_like(inv, dtype=torch.float32) if mean is None else \
                mean.float()
        return y.to(x.dtype), mean_out, inv.float() if want_inv else None, total

    return run


@kernel("SkipLayerNormalization", since=1, domain=MS, factory=True, multi_output=True,
        supports=_FLOAT)
def skip_layer_normalization(info: NodeInfo) -> Callable[..., tuple]:
    """LayerNorm(input + skip (+ bias)) * gamma (+ beta) over the last axis."""
    return _skip_norm(info, simplified=False)


@kernel("SkipSimplifiedLayerNormalization", since=1, domain=MS, factory=True,
        multi_output=True, supports=_FLOAT)
def skip_simplified_layer_normalization(info: NodeInfo) -> Callable[..., tuple]:
    """RMSNorm(input + skip (+ bias)) * gamma over the last axis; the mean output is zeros."""
    return _skip_norm(info, simplified=True)


# ---------------------------------------------------------------------------------------
# MatMulNBits


def _nbits_supports(info: NodeInfo) -> str | None:
    why = needs(FLOATS, skip_inputs=(1, 2, 3, 4))(info)
    if why:
        return why
    if int(info.attrs.get("weight_prepacked", 0) or 0):
        return "MatMulNBits with prepacked weights is left to the CPU"
    return None


@kernel("MatMulNBits", since=1, domain=MS, factory=True, host_inputs=(1, 2, 3, 4),
        supports=_nbits_supports, variant="matmulnbits.dequant_matmul")
def matmul_nbits(info: NodeInfo) -> Callable[..., Tensor]:
    """A @ dequantize(B).T (+ bias): B/scales/zero_points/g_idx are host inputs, dequantized
    on the host (once, at plan time, when constant) and uploaded as a float32 weight."""
    geo = nbits_geometry(info.attrs)
    n = geo.n
    device = current_device()
    consts = [info.const_inputs[i] if i < len(info.const_inputs) else None for i in range(5)]
    present = [i < info.n_inputs and info.input_present[i] for i in range(5)]
    static = all(consts[i] is not None for i in range(1, 5) if present[i])
    fixed = None
    if static and consts[1] is not None and consts[1].size:
        fixed = to_torch(dequantize_weight(geo, consts[1], consts[2], consts[3], consts[4]).T
                         .copy(), device)

    def run(x: Tensor, b, scales, zero_points=None, g_idx=None, bias=None) -> Tensor:
        if b.size == 0:
            y = torch.zeros((*x.shape[:-1], n), dtype=torch.float32, device=x.device)
        else:
            wt = fixed
            if wt is None:
                wt = to_torch(dequantize_weight(geo, b, scales, zero_points, g_idx).T.copy(),
                              x.device)
            y = torch.matmul(x.float(), wt.to(x.device))
        if bias is not None:
            y = y + bias.float().reshape(n)
        return y.to(x.dtype)

    return run


# ---------------------------------------------------------------------------------------
# onnxkiln::FusedMatMulBias and onnxkiln::ScaledDotProductAttention

_ONNXKILN_ACTS: dict[str, Act | None] = {
    "": None, "Relu": torch.relu, "Gelu": _gelu, "FastGelu": _fast_gelu,
}


@kernel("FusedMatMulBias", since=1, domain="onnxkiln", factory=True, supports=_FLOAT)
def fused_matmul_bias(info: NodeInfo) -> Callable[..., Tensor]:
    """act(A @ B + bias) for B 2-D and bias 1-D (addmm on the flattened rows)."""
    name = attr_str(info.attrs.get("activation"))
    if name not in _ONNXKILN_ACTS:
        raise ValueError(f"FusedMatMulBias: unknown activation {name!r}")
    act = _ONNXKILN_ACTS[name]

    def run(a: Tensor, b: Tensor, bias: Tensor) -> Tensor:
        if a.dtype in (torch.float16, torch.bfloat16) and act is not None:
            y = torch.matmul(a.float(), b.float()) + bias.float()
            return act(y).to(a.dtype)
        a2 = a.reshape(-1, a.shape[-1])
        y = torch.addmm(bias, a2, b).reshape(*a.shape[:-1], b.shape[1])
        return act(y) if act is not None else y

    return run


@kernel("ScaledDotProductAttention", since=1, domain="onnxkiln", factory=True,
        supports=needs(FLOATS, skip_inputs=(3,)),
        variant="sdpa.torch")
def scaled_dot_product_attention(info: NodeInfo) -> Callable[..., Tensor]:
    """softmax(mask(Q @ K' scaled)) @ V. torch's fused SDPA serves additive masks and keep
    masks whose fill is <= -1e30 (then fill + score == fill, as the replacement gives);
    other fills run the explicit math."""
    transpose_k = bool(info.attrs.get("transpose_k", 1))
    scale = float(info.attrs.get("scale", 1.0))
    divide = bool(info.attrs.get("divide", 0))
    mode = attr_str(info.attrs.get("mask_mode")) or "add"
    if mode not in ("add", "keep_true", "keep_false"):
        raise ValueError(f"ScaledDotProductAttention: unknown mask_mode {mode!r}")
    fill = float(info.attrs.get("mask_fill", 0.0))
    factor = 1.0 / scale if divide else scale
    fused_keep = fill <= -1e30

    def run(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        kt = k if transpose_k else k.transpose(-1, -2)  # kt: (..., T, H)
        add = None
        if mask is not None:
            if mode == "add":
                add = mask.to(q.dtype)
            elif fused_keep:
                keep = mask if mode == "keep_true" else ~mask
                low = max(fill, torch.finfo(q.dtype).min)  # float16: stay finite
                add = torch.where(keep, 0.0, low).to(q.dtype)
            else:
                return _explicit(q, kt, v, mask)
        if q.shape[:-2] == kt.shape[:-2] == v.shape[:-2]:
            return F.scaled_dot_product_attention(q, kt, v, attn_mask=add, scale=factor)
        s = torch.matmul(q, kt.transpose(-1, -2)) * factor
        if add is not None:
            s = s + add
        return torch.matmul(torch.softmax(s, dim=-1), v)

    def _explicit(q, kt, v, mask):
        s = torch.matmul(q, kt.transpose(-1, -2)) * factor
        keep = mask if mode == "keep_true" else ~mask
        s = torch.where(keep, s, torch.full((), fill, dtype=s.dtype, device=s.device))
        return torch.matmul(torch.softmax(s, dim=-1), v)

    return run
