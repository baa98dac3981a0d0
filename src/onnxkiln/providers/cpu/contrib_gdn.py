"""CPU kernel: com.microsoft GatedDeltaNet, the token-major gated delta recurrence that
onnxruntime-genai's builder writes for Qwen3.5 / Kimi linear-attention layers.

query/key (tokens, Hq, dk) and value (tokens, Hv, dv) (or rank 4 (B, S, H, D), or packed QKV
in query); requests are cut by cu_seqlens or are uniform (batch from initial_state). Per value
head, with S the (dk, dv) state and each query/key head shared by Hv / Hq value heads:
S = exp(g) S (gated rules), then S += k (beta (v - S^T k))^T (delta rules) or S += k v^T,
o = scale * S^T q. The state in and out is V-major (B, Hv, dv, dk) float32. Optional fused
gates: softplus (-exp(a_log) * softplus(decay + dt_bias)), sigmoid/kda
(gate_lower_bound * sigmoid(exp(a_log) * (decay + dt_bias))), sigmoid beta, and L2
normalization of q and k. The compact state-update capture is not supported.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.ops.special import expit
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)
OP = "GatedDeltaNet"
_RULES = ("linear", "gated", "delta", "gated_delta")


def _s(info: NodeInfo, name: str, default: str) -> str:
    v = info.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)


class _Config:
    def __init__(self, info: NodeInfo) -> None:
        self.rule = _s(info, "update_rule", "gated_delta")
        self.gate = {"qwen": "softplus", "kda": "sigmoid"}.get(
            _s(info, "gate_activation", "none"), _s(info, "gate_activation", "none"))
        self.beta_act = _s(info, "beta_activation", "none")
        if self.rule not in _RULES:
            raise ValueError(f"{OP}: update_rule must be one of {', '.join(_RULES)}, got "
                             f"{self.rule!r}")
        if self.gate not in ("none", "softplus", "sigmoid"):
            raise ValueError(f"{OP}: gate_activation must be none, softplus or sigmoid, got "
                             f"{self.gate!r}")
        if self.beta_act not in ("none", "sigmoid"):
            raise ValueError(f"{OP}: beta_activation must be none or sigmoid, got "
                             f"{self.beta_act!r}")
        if int(info.attrs.get("state_update_capacity", 0)):
            raise ValueError(f"{OP}: compact state-update capture is not supported on CPU")
        self.scale = float(info.attrs.get("scale", 0.0))
        self.l2 = bool(int(info.attrs.get("qk_l2_norm", 0)))
        self.lower = np.float32(info.attrs.get("gate_lower_bound", -5.0))
        self.gated, self.delta = "gated" in self.rule, "delta" in self.rule


def _split_qkv(query, key, value, state):
    """(q (T, Hq, dk), k, v (T, Hv, dv), batch dims or None) from the three input spellings."""
    lead = None
    if key is None and value is None:
        if state is None:
            raise ValueError(f"{OP}: packed QKV needs initial_state for the head counts")
        hv, dv, dk = state.shape[1:]
        width = query.shape[-1] - hv * dv
        if width <= 0 or width % (2 * dk):
            raise ValueError(f"{OP}: packed QKV width {query.shape[-1]} does not fit heads "
                             f"{hv} x {dv} and head_size_qk {dk}")
        hq = width // (2 * dk)
        if query.ndim == 3:
            lead = query.shape[:2]
        flat = query.reshape(-1, query.shape[-1])
        q, k, v = np.split(flat, [hq * dk, 2 * hq * dk], axis=1)
        return q.reshape(-1, hq, dk), k.reshape(-1, hq, dk), v.reshape(-1, hv, dv), lead
    if key is None or value is None:
        raise ValueError(f"{OP}: key and value must both be present or both absent")
    if query.ndim == 4:
        lead = query.shape[:2]
        query, key, value = (x.reshape(-1, *x.shape[2:]) for x in (query, key, value))
    if query.ndim != 3 or key.shape != query.shape or value.ndim != 3 or \
            value.shape[0] != query.shape[0]:
        raise ValueError(f"{OP}: query/key must be (tokens, heads, head_size_qk) alike and "
                         f"value (tokens, heads_v, head_size_v), got {query.shape}, "
                         f"{key.shape}, {value.shape}")
    return query, key, value, lead


def _gates(cfg: _Config, decay, beta, a_log, dt_bias, tokens: int, hv: int, dk: int):
    """(g (T, Hv, 1 or dk) float32 or None, beta (T, Hv, 1) or None)."""
    g = b = None
    if cfg.gated:
        if decay is None:
            raise ValueError(f"{OP}: update_rule {cfg.rule!r} needs decay")
        g = decay.astype(_F32).reshape(tokens, hv, -1)
        if g.shape[2] not in (1, dk):
            raise ValueError(f"{OP}: decay must be (tokens, {hv}) or (tokens, {hv}, {dk}), got "
                             f"{decay.shape}")
        if cfg.gate != "none":
            if a_log is None or dt_bias is None or a_log.size != hv:
                raise ValueError(f"{OP}: gate_activation {cfg.gate!r} needs a_log ({hv},) and "
                                 f"dt_bias")
            z = g + dt_bias.astype(_F32).reshape(1, hv, -1)
            a = np.exp(a_log.astype(_F32)).reshape(1, hv, 1)
            g = (-a * np.logaddexp(np.float32(0), z) if cfg.gate == "softplus"
                 else cfg.lower * expit(a * z))
    if cfg.delta:
        if beta is None:
            raise ValueError(f"{OP}: update_rule {cfg.rule!r} needs beta")
        b = beta.astype(_F32).reshape(tokens, hv, 1)
        if cfg.beta_act == "sigmoid":
            b = expit(b)
    return g, b


def _l2(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(1e-6))


def _recur(cfg, q, k, v, g, b, state, scale):
    """One request: q, k (T, Hv, dk) (heads repeated), v (T, Hv, dv), state (Hv, dk, dv)."""
    out = np.empty(v.shape, _F32)
    for t in range(q.shape[0]):
        if g is not None:
            state = state * np.exp(g[t])[:, :, None]
        kt = k[t][:, :, None]
        if cfg.delta:
            pred = np.sum(state * kt, axis=1)  # S^T k: (Hv, dv)
            state = state + kt * (b[t] * (v[t] - pred))[:, None, :]
        else:
            state = state + kt * v[t][:, None, :]
        out[t] = np.float32(scale) * np.sum(state * q[t][:, :, None], axis=1)
    return out, state


@kernel(OP, since=1, domain=MS, factory=True, multi_output=True, variant="gdn.recurrent")
def gated_delta_net(info: NodeInfo) -> Callable[..., tuple]:
    """(output, final_state) of the gated delta recurrence, float32 inside."""
    cfg = _Config(info)

    def run(query, key=None, value=None, cu_seqlens=None, decay=None, beta=None,
            initial_state=None, a_log=None, dt_bias=None, capture_count=None, active=None):
        q, k, v, lead = _split_qkv(query, key, value, initial_state)
        tokens, hq, dk = q.shape
        hv, dv = v.shape[1:]
        if hv % hq:
            raise ValueError(f"{OP}: num_heads_v {hv} must be a multiple of num_heads_q {hq}")
        bounds = _bounds(cu_seqlens, initial_state, lead, tokens)
        batch = len(bounds) - 1
        if initial_state is not None and initial_state.shape != (batch, hv, dv, dk):
            raise ValueError(f"{OP}: initial_state must be {(batch, hv, dv, dk)}, got "
                             f"{initial_state.shape}")
        g, b = _gates(cfg, decay, beta, a_log, dt_bias, tokens, hv, dk)
        qf, kf = q.astype(_F32), k.astype(_F32)
        if cfg.l2:
            qf, kf = _l2(qf), _l2(kf)
        rep = hv // hq
        qf, kf, vf = np.repeat(qf, rep, axis=1), np.repeat(kf, rep, axis=1), v.astype(_F32)
        scale = cfg.scale or 1.0 / np.sqrt(dk)
        out = np.empty((tokens, hv, dv), _F32)
        final = np.empty((batch, hv, dv, dk), _F32)
        for r in range(batch):
            lo, hi = bounds[r], bounds[r + 1]
            s0 = (np.zeros((hv, dk, dv), _F32) if initial_state is None
                  else initial_state[r].astype(_F32).transpose(0, 2, 1))
            out[lo:hi], s = _recur(cfg, qf[lo:hi], kf[lo:hi], vf[lo:hi],
                                   None if g is None else g[lo:hi],
                                   None if b is None else b[lo:hi], s0, scale)
            final[r] = s.transpose(0, 2, 1)
        out = out.astype(query.dtype)
        return (out if lead is None else out.reshape(*lead, hv, dv)), final

    return run


def _bounds(cu_seqlens, state, lead, tokens: int) -> list[int]:
    if cu_seqlens is not None:
        cu = [int(c) for c in np.asarray(cu_seqlens).reshape(-1)]
        if len(cu) < 2 or cu[0] != 0 or cu[-1] != tokens or np.any(np.diff(cu) < 0):
            raise ValueError(f"{OP}: cu_seqlens must rise from 0 to {tokens}, got {cu}")
        return cu
    if lead is not None:
        batch = lead[0]
    elif state is not None:
        batch = state.shape[0]
    else:
        raise ValueError(f"{OP}: without cu_seqlens, initial_state gives the batch size")
    if batch <= 0 or tokens % batch:
        raise ValueError(f"{OP}: {tokens} tokens do not split into {batch} equal requests")
    step = tokens // batch
    return [i * step for i in range(batch + 1)]
