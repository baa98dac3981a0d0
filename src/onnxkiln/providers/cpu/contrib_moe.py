"""CPU kernel: com.microsoft MoE, the mixture-of-experts feed-forward block that
onnxruntime-genai's builder and the transformers optimizer write for Mixtral, Phi-MoE and
gpt-oss style models.

Each token's router logits pick its top-k experts; the token's output is the routing-weighted
sum of those experts' FFNs, y = fc2(act(fc1(x))) with weights stored (out, in). Routing
weights are the softmax over all experts at the chosen ones, renormalized over the k when
normalize_routing_weights is set. SwiGLU reads its gate and linear halves from fc1 (fused,
interleaved or concatenated) or from fc1 and fc3.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.ops import special
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)
_ACTS = ("relu", "gelu", "silu", "swiglu", "identity")


def _attr_str(info: NodeInfo, name: str, default: str) -> str:
    v = info.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def _gelu(x: np.ndarray) -> np.ndarray:
    """The tanh approximation, as onnxruntime's CPU MoE computes it."""
    c = np.float32(np.sqrt(2.0 / np.pi))
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + np.float32(0.044715) * x**3)))


class _Expert:
    """The activation of one MoE node, applied to fc1's output (tokens, fusion * inter)."""

    def __init__(self, op: str, info: NodeInfo) -> None:
        self.act = _attr_str(info, "activation_type", "relu")
        if self.act not in _ACTS:
            raise ValueError(f"{op}: activation_type must be one of {', '.join(_ACTS)} on CPU, "
                             f"got {self.act!r}")
        self.fusion = int(info.attrs.get("swiglu_fusion", 0))
        if self.fusion not in (0, 1, 2):
            raise ValueError(f"{op}: swiglu_fusion must be 0, 1 or 2, got {self.fusion}")
        self.alpha = np.float32(info.attrs.get("activation_alpha", 1.0))
        self.beta = np.float32(info.attrs.get("activation_beta", 0.0))
        limit = info.attrs.get("swiglu_limit")
        self.limit = None if limit is None else np.float32(limit)
        if int(info.attrs.get("swiglu_limit_after_activation", 0)):
            raise ValueError(f"{op}: swiglu_limit_after_activation=1 is CUDA-only")

    def fused(self) -> bool:
        return self.act == "swiglu" and self.fusion != 0

    def __call__(self, h: np.ndarray, lin: np.ndarray | None) -> np.ndarray:
        if self.act == "swiglu":
            if self.fusion == 1:
                g, lin = h[:, 0::2], h[:, 1::2]
            elif self.fusion == 2:
                g, lin = np.split(h, 2, axis=1)
            else:
                g = h
            if self.limit is not None:
                g = np.minimum(g, self.limit)
                lin = np.clip(lin, -self.limit, self.limit)
            return g * special.expit(self.alpha * g) * (lin + self.beta)
        if self.act == "relu":
            out = np.maximum(h, np.float32(0))
        elif self.act == "gelu":
            out = _gelu(h)
        elif self.act == "silu":
            out = h * special.expit(h)
        else:
            out = h
        return out if lin is None else out * lin


def routing(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """(experts (tokens, k), weights (tokens, k)) from router logits (tokens, E)."""
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    probs = e / e.sum(axis=1, keepdims=True)
    experts = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, experts, axis=1)
    if normalize:
        weights = weights / weights.sum(axis=1, keepdims=True)
    return experts, weights


def _check(op: str, x, router, w1, w2, w3, expert: _Expert) -> tuple[int, int]:
    if x.ndim not in (2, 3):
        raise ValueError(f"{op}: input must be (tokens, hidden) or (batch, seq, hidden), got "
                         f"{x.shape}")
    tokens, hidden = int(np.prod(x.shape[:-1])), x.shape[-1]
    if w1.ndim != 3 or w1.shape[2] != hidden:
        raise ValueError(f"{op}: fc1_experts_weights must be (experts, out, {hidden}), got "
                         f"{w1.shape}")
    n_exp = w1.shape[0]
    inter = w1.shape[1] // (2 if expert.fused() else 1)
    if expert.fused() and w1.shape[1] % 2:
        raise ValueError(f"{op}: fused swiglu needs an even fc1 width, got {w1.shape[1]}")
    if router.shape != (tokens, n_exp):
        raise ValueError(f"{op}: router_probs must be ({tokens}, {n_exp}), got {router.shape}")
    if w2.shape != (n_exp, hidden, inter):
        raise ValueError(f"{op}: fc2_experts_weights must be {(n_exp, hidden, inter)}, got "
                         f"{w2.shape}")
    needs_fc3 = expert.act == "swiglu" and not expert.fused()
    if needs_fc3 and w3 is None:
        raise ValueError(f"{op}: unfused swiglu (swiglu_fusion=0) needs fc3_experts_weights")
    if w3 is not None and w3.shape != (n_exp, inter, hidden):
        raise ValueError(f"{op}: fc3_experts_weights must be {(n_exp, inter, hidden)}, got "
                         f"{w3.shape}")
    return tokens, n_exp


def _bias(b: np.ndarray | None, e: int, width: int, what: str, op: str) -> np.ndarray | float:
    if b is None:
        return np.float32(0)
    if b.ndim != 2 or b.shape[1] != width:
        raise ValueError(f"{op}: {what} must be (experts, {width}), got {b.shape}")
    return b[e].astype(_F32)


def forward(op: str, expert: _Expert, k: int, normalize: bool, x: np.ndarray,
            router: np.ndarray, w1, b1, w2, b2, w3, b3, mix: np.ndarray | None = None):
    """The MoE block on float weights (out, in); `mix` (tokens, E), when given, supplies the
    mixing weights of the experts the router picked (QMoE's router_weights)."""
    tokens, n_exp = _check(op, x, router, w1, w2, w3, expert)
    if not 1 <= k <= n_exp:
        raise ValueError(f"{op}: k must lie in [1, {n_exp}], got {k}")
    xf = x.reshape(tokens, -1).astype(_F32)
    experts, weights = routing(router.astype(_F32), k, normalize)
    if mix is not None:
        if mix.shape != router.shape:
            raise ValueError(f"{op}: router_weights must be {router.shape}, got {mix.shape}")
        weights = np.take_along_axis(mix.astype(_F32), experts, axis=1)
        if normalize:
            weights = weights / weights.sum(axis=1, keepdims=True)
    out = np.zeros_like(xf)
    for e in np.unique(experts):
        rows, slot = np.nonzero(experts == e)
        xe = xf[rows]
        h = xe @ w1[e].astype(_F32).T + _bias(b1, e, w1.shape[1], "fc1_experts_bias", op)
        lin = None
        if w3 is not None:
            lin = xe @ w3[e].astype(_F32).T + _bias(b3, e, w3.shape[1], "fc3_experts_bias", op)
        y = expert(h, lin) @ w2[e].astype(_F32).T
        y += _bias(b2, e, w2.shape[1], "fc2_experts_bias", op)
        np.add.at(out, rows, weights[rows, slot, None] * y)
    return out.reshape(x.shape).astype(x.dtype)


def moe_attrs(op: str, info: NodeInfo) -> tuple[_Expert, int, bool]:
    """(activation, k, normalize_routing_weights) of a MoE or QMoE node, checked."""
    if int(info.attrs.get("use_sparse_mixer", 0)):
        raise ValueError(f"{op}: use_sparse_mixer=1 is not supported")
    return (_Expert(op, info), int(info.attrs.get("k", 1)),
            bool(int(info.attrs.get("normalize_routing_weights", 0))))


@kernel("MoE", since=1, domain=MS, factory=True, variant="moe.numpy")
def moe(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Top-k routed expert FFNs, float32 arithmetic, output in the input's type and shape."""
    op = "MoE"
    expert, k, normalize = moe_attrs(op, info)

    def run(x, router, w1, b1=None, w2=None, b2=None, w3=None, b3=None) -> np.ndarray:
        if w2 is None:
            raise ValueError(f"{op}: fc2_experts_weights is required")
        return forward(op, expert, k, normalize, x, router, w1, b1, w2, b2, w3, b3)

    return run
