"""CPU kernel: com.microsoft MoEGroupRouter, the group-limited sigmoid router (noaux_tc) of
DeepSeek-V3 / BailingMoeV3 style MoE layers, feeding MoE / QMoE.

s = sigmoid(logits); experts fall into n_group equal groups; each group scores the sum of its
group_topk best (s + expert_bias); the topk_group best groups stay; the top_k best experts by
(s + expert_bias) among those are selected. router_probs holds log(max(s, 1e-20)) at the
selected experts and router_sentinel elsewhere. The full-score form returns selection_scores
(s + expert_bias) and router_weights (s) instead, optionally after projecting activations by
projection_weight.
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
OP = "MoEGroupRouter"


def _select(biased: np.ndarray, top_k: int, n_group: int, topk_group: int,
            group_topk: int) -> np.ndarray:
    """(tokens, top_k) expert indices chosen group-limited from biased scores (tokens, E)."""
    tokens, experts = biased.shape
    per = experts // n_group
    grouped = biased.reshape(tokens, n_group, per)
    take = min(group_topk, per)
    group_score = -np.sort(-grouped, axis=2)[:, :, :take].sum(axis=2)
    groups = np.argsort(-group_score, axis=1, kind="stable")[:, :topk_group]
    allowed = np.zeros((tokens, n_group), bool)
    np.put_along_axis(allowed, groups, True, axis=1)
    masked = np.where(np.repeat(allowed, per, axis=1), biased, -np.inf)
    return np.argsort(-masked, axis=1, kind="stable")[:, :top_k]


@kernel(OP, since=1, domain=MS, factory=True, multi_output=True, variant="moerouter.numpy")
def moe_group_router(info: NodeInfo) -> Callable[..., tuple]:
    """(router_probs, selection_scores, router_weights), the ones the node asks for."""
    top_k = int(info.attrs.get("top_k", 0))
    n_group = int(info.attrs.get("n_group", 1))
    topk_group = int(info.attrs.get("topk_group", 1))
    group_topk = int(info.attrs.get("group_topk", 2))
    sentinel = np.float32(info.attrs.get("router_sentinel", -10000.0))
    if min(top_k, n_group, topk_group, group_topk) < 1 or topk_group > n_group:
        raise ValueError(f"{OP}: top_k, n_group, group_topk and topk_group must be positive "
                         f"with topk_group <= n_group, got {top_k}, {n_group}, {group_topk}, "
                         f"{topk_group}")
    present = tuple(info.output_present) + (False,) * 3
    full = present[1] or present[2]
    if full and (present[0] or not present[2] or n_group != 1 or topk_group != 1):
        raise ValueError(f"{OP}: the full-score outputs need router_weights, no router_probs "
                         f"and n_group = topk_group = 1")

    def run(logits, bias, projection=None):
        experts = bias.shape[0] if bias.ndim == 1 else -1
        if bias.ndim != 1 or experts % n_group or top_k > experts:
            raise ValueError(f"{OP}: expert_bias must be (experts,) with experts a multiple of "
                             f"n_group {n_group} and >= top_k {top_k}, got {bias.shape}")
        x = logits.astype(_F32)
        if projection is not None:
            if not full or x.ndim != 2 or projection.shape != (experts, x.shape[1]):
                raise ValueError(f"{OP}: projection_weight ({experts}, {x.shape[-1]}) needs the "
                                 f"full-score outputs and 2-D activations, got "
                                 f"{projection.shape}")
            x = x @ projection.astype(_F32).T
        if x.shape[-1] != experts:
            raise ValueError(f"{OP}: logits must end in {experts} experts, got {logits.shape}")
        s = expit(x.reshape(-1, experts))
        biased = s + bias.astype(_F32)
        if full:
            return None, biased, s
        chosen = _select(biased, top_k, n_group, topk_group, group_topk)
        probs = np.full(s.shape, sentinel, _F32)
        picked = np.take_along_axis(s, chosen, axis=1)
        np.put_along_axis(probs, chosen, np.log(np.maximum(picked, np.float32(1e-20))), axis=1)
        return probs.astype(logits.dtype), None, None

    return run
