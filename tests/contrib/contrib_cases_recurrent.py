"""Generated cases for the newer model-block ops: the recurrent-state ops of linear-attention
models (LinearAttention and its gate, GatedDeltaNet's update rules and packings, the causal
convolutions with a carried state), Engram's n-gram hashing and gate, hyper-connection mixes
and the grouped MoE router."""

from __future__ import annotations

import numpy as np
from contrib_harness import F16, F32, I32, Case, normal, spec

RULES = ("linear", "gated", "delta", "gated_delta")


@spec("LinearAttention")
def linear_attention(rng):
    """[B, T, H*D] q/k/v, a (B, H_kv, d_k, d_v) state, decay per head (or per key dim) and
    beta per head; 4 query heads sharing 2 KV heads."""
    b, t, hq, hkv, dk, dv = 2, 4, 4, 2, 4, 3
    cases = []
    for rule in RULES:
        for past in (True, False):
            feeds = {"q": normal(rng, (b, t, hq * dk)),
                     "k": normal(rng, (b, t, hkv * dk), F32, 0.5),
                     "v": normal(rng, (b, t, hkv * dv))}
            names = ["q", "k", "v", "s" if past else ""]
            if past:
                feeds["s"] = normal(rng, (b, hkv, dk, dv), F32, 0.3)
            if "gated" in rule:
                feeds["g"] = -rng.random((b, t, hkv)).astype(F32)
            names.append("g" if "gated" in rule else "")
            if "delta" in rule:
                feeds["beta"] = rng.random((b, t, hkv)).astype(F32)
                names.append("beta")
            while names[-1] == "":
                names.pop()
            cases.append(Case(f"{rule}-past{int(past)}", feeds,
                              {"q_num_heads": hq, "kv_num_heads": hkv, "update_rule": rule},
                              names=names, n_out=2, rtol=1e-5, atol=1e-5))
    return cases


@spec("LinearAttentionGate")
def linear_attention_gate(rng):
    """decay = decay_scale * softplus(a + dt_bias), beta = sigmoid(b), float32 inside."""
    cases = []
    for dt, tol in ((F32, 1e-5), (F16, 2e-3)):
        for with_b in (True, False):
            feeds = {"a": normal(rng, (2, 3, 4), dt, 3), "dt": normal(rng, (4,)),
                     "ds": -np.exp(normal(rng, (4,)))}
            if with_b:
                feeds["b"] = normal(rng, (2, 3, 4), dt)
            cases.append(Case(f"{np.dtype(dt).name}-b{int(with_b)}", feeds,
                              n_out=2 if with_b else 1, rtol=tol, atol=tol))
    return cases


GDN_NAMES = ["q", "k", "v", "cu", "g", "beta", "s0"]


@spec("GatedDeltaNet")
def gated_delta_net(rng):
    """Token-major q/k [T, Hq, dk], v [T, Hv, dv] with 2 query heads shared by 4 value heads,
    unit keys (the delta rules expect them), a (B, Hv, dv, dk) state; uniform and ragged
    (cu_seqlens) packing."""
    hq, hv, dk, dv = 2, 4, 4, 3
    cases = []
    for rule, cu in (*((r, None) for r in RULES), ("gated_delta", [0, 2, 7])):
        t = 6 if cu is None else cu[-1]
        k = normal(rng, (t, hq, dk))
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        feeds = {"q": normal(rng, (t, hq, dk)), "k": k, "v": normal(rng, (t, hv, dv))}
        if cu is not None:
            feeds["cu"] = np.array(cu, I32)
        if "gated" in rule:
            feeds["g"] = normal(rng, (t, hv), F32, 0.3) - 0.5
        if "delta" in rule:
            feeds["beta"] = rng.random((t, hv)).astype(F32)
        feeds["s0"] = normal(rng, (2, hv, dv, dk), F32, 0.3)
        names = [n if n in feeds else "" for n in GDN_NAMES]
        cases.append(Case(f"{rule}-{'ragged' if cu else 'uniform'}", feeds,
                          {"update_rule": rule}, names=names, n_out=2, rtol=1e-5, atol=1e-5))
    return cases


@spec("CausalConvWithState")
def causal_conv_with_state(rng):
    """Depthwise causal convolution over (B, C, L) with a carried (B, C, (k-1) dilation) state:
    prefill without a state, decode steps with one, SiLU, dilation, channels_last."""
    b, c, k = 2, 3, 4
    cases = []
    for name, length, attrs, with_past in (
        ("prefill", 6, {}, False), ("decode-silu", 1, {"activation": "silu"}, True),
        ("chunk-dilated", 5, {"dilation": 2}, True),
        ("channels-last", 4, {"channels_last": 1}, True),
    ):
        state = (k - 1) * attrs.get("dilation", 1)
        cl = attrs.get("channels_last", 0)
        feeds = {"x": normal(rng, (b, length, c) if cl else (b, c, length))}
        names = ["x", "w", "bias"]
        if with_past:
            feeds["past"] = normal(rng, (b, state, c) if cl else (b, c, state))
            names.append("past")
        cases.append(Case(name, feeds, attrs, {"w": normal(rng, (c, 1, k)),
                                               "bias": normal(rng, (c,))}, names, n_out=2,
                          rtol=1e-5, atol=1e-5))
    return cases


@spec("VarlenCausalConvWithState")
def varlen_causal_conv_with_state(rng):
    """The causal convolution per request of a packed (tokens, channels) batch cut by
    cumulative_sequence_length, one (C, (k-1) dilation) carry state per request."""
    c, k = 3, 3
    cases = []
    for name, cu, attrs in (("three-requests", [0, 1, 4, 8], {}),
                            ("silu-dilated", [0, 5, 6], {"activation": "silu", "dilation": 2})):
        state = (k - 1) * attrs.get("dilation", 1)
        feeds = {"x": normal(rng, (cu[-1], c)), "cu": np.array(cu, I32),
                 "s0": normal(rng, (len(cu) - 1, c, state))}
        cases.append(Case(name, feeds, attrs, {"w": normal(rng, (c, 1, k)),
                                               "bias": normal(rng, (c,))},
                          ["x", "w", "cu", "bias", "s0"], n_out=2, rtol=1e-5, atol=1e-5))
    return cases


@spec("NGramHashMapping")
def ngram_hash_mapping(rng):
    """Engram n-gram hash ids: xor of shifted ids times odd multipliers, wrapping in the id
    type (multipliers near the type's width overflow), modulo each head's vocabulary; history
    through past_ids, eos resets, segment boundaries, head offsets."""
    cases = []
    for name, dt, n, heads, extra in (
        ("int64-wrapping", np.int64, 3, 2, {"mult": 2**61}),
        ("int32-wrapping-negative", np.int32, 3, 2, {"mult": 2**29, "negative": True}),
        ("past-offsets", np.int64, 4, 3, {"past": True, "offsets": True}),
        ("eos-reset-segments", np.int32, 3, 2, {"eos": 7, "segments": True}),
    ):
        b, length = 2, 7
        ids = rng.integers(0, 2**20, (b, length)).astype(dt)
        mult = (rng.integers(1, extra.get("mult", 2**20), n) * 2 + 1).astype(dt)
        if extra.get("negative"):
            mult[1] = -mult[1]
        feeds = {"ids": ids, "m": mult, "v": rng.integers(5, 1000, (n - 1) * heads).astype(dt)}
        names = ["ids", "m", "v", "", "", "", ""]
        if extra.get("past"):
            feeds["p"], names[3] = rng.integers(0, 2**20, (b, n - 1)).astype(dt), "p"
        if extra.get("offsets"):
            feeds["o"], names[4] = rng.integers(0, 100, (n - 1) * heads).astype(dt), "o"
        attrs = {"max_ngram_size": n, "n_head_per_ngram": heads, "pad_id": 3}
        if "eos" in extra:
            ids[0, 2] = ids[1, 5] = extra["eos"]
            feeds["e"], names[5] = np.array(extra["eos"], dt), "e"
            attrs["reset_on_eos"] = 1
        if extra.get("segments"):
            feeds["s"] = np.array([[0, 0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 1, 1, 3]], I32)
            names[6] = "s"
        while names[-1] == "":
            names.pop()
        cases.append(Case(name, feeds, attrs, names=names, n_out=2))
    return cases


@spec("VarlenNGramHashMapping")
def varlen_ngram_hash_mapping(rng):
    """NGramHashMapping over packed requests cut by cumulative_sequence_length, one history
    row each (past_ids), eos resets inside the packed batch."""
    cases = []
    for name, dt, extra in (("int64", np.int64, {}), ("int32-past", np.int32, {"past": True}),
                            ("eos-past", np.int64, {"past": True, "eos": 7})):
        cu, n, heads = [0, 3, 4, 9], 3, 2
        ids = rng.integers(0, 2**20, cu[-1]).astype(dt)
        feeds = {"ids": ids, "m": (rng.integers(1, 2**20, n) * 2 + 1).astype(dt),
                 "v": rng.integers(5, 1000, (n - 1) * heads).astype(dt), "cu": np.array(cu, I32)}
        names = ["ids", "m", "v", "cu"]
        attrs = {"max_ngram_size": n, "n_head_per_ngram": heads, "pad_id": 3}
        if extra.get("past"):
            feeds["p"] = rng.integers(0, 2**20, (len(cu) - 1, n - 1)).astype(dt)
            names.append("p")
        if "eos" in extra:
            ids[1] = ids[6] = extra["eos"]
            feeds["e"] = np.array(extra["eos"], dt)
            names += ["", "e"]
            attrs["reset_on_eos"] = 1
        cases.append(Case(name, feeds, attrs, names=names, n_out=2))
    return cases


@spec("HyperConnectionPreMix")
def hyper_connection_pre_mix(rng):
    """Sum over C residual branches of x (B, S, C, H) weighted by pre_mix, grouped (4-D x) or
    flattened (num_branches)."""
    b, s, c, h = 2, 3, 4, 5
    return [Case("grouped-scale", {"x": normal(rng, (b, s, c, h)), "p": normal(rng, (b, s, c, 1))},
                 {"reduction_scale": 0.5}),
            Case("grouped-per-channel", {"x": normal(rng, (b, s, c, h)),
                                         "p": normal(rng, (b, s, c, h))}),
            Case("flattened", {"x": normal(rng, (b, s, c * h)), "p": normal(rng, (b, s, c))},
                 {"num_branches": c}),
            Case("float16", {"x": normal(rng, (b, s, c, h), F16), "p": normal(rng, (b, s, c), F16)},
                 rtol=2e-3, atol=2e-3)]


@spec("HyperConnectionPostMix")
def hyper_connection_post_mix(rng):
    """Branches x (B, S, C, H) mixed by stream_mix (B, S, C, C) plus the block output spread
    by post_mix."""
    b, s, c, h = 2, 3, 4, 5
    cases = []
    for name, x, p, mix, attrs in (
        ("with-stream-mix", (b, s, c, h), (b, s, c), True, {}),
        ("no-stream-mix-per-channel", (b, s, c, h), (b, s, c, h), False, {}),
        ("flattened", (b, s, c * h), (b, s, c), True, {"num_branches": c}),
    ):
        feeds = {"x": normal(rng, x), "bo": normal(rng, (b, s, h)), "p": normal(rng, p)}
        if mix:
            feeds["sm"] = normal(rng, (b, s, c, c))
        cases.append(Case(name, feeds, attrs, rtol=1e-5, atol=1e-5))
    return cases


@spec("EngramGate")
def engram_gate(rng):
    """Engram's gate over keys/queries (B, S, C, H) with RMS-norm scales, applied to value
    (B, S, H); the normed form also returns the conv-side RMS norm."""
    b, s, c, h = 2, 3, 4, 5

    def scale(dt=F32):
        return (1 + 0.1 * rng.standard_normal((c, h))).astype(dt)

    cases = []
    for name, normed, dt, attrs, tol in (("plain", False, F32, {}, 1e-5),
                                         ("normed-eps", True, F32, {"epsilon": 1e-3}, 1e-5),
                                         ("float16-normed", True, F16, {}, 4e-3)):
        feeds = {"k": normal(rng, (b, s, c, h), dt), "q": normal(rng, (b, s, c, h), dt),
                 "v": normal(rng, (b, s, h), dt), "ks": scale(dt), "qs": scale(dt)}
        if normed:
            feeds["cs"] = scale(dt)
        cases.append(Case(name, feeds, attrs, n_out=2 if normed else 1, rtol=tol, atol=tol))
    return cases


@spec("MoEGroupRouter")
def moe_group_router(rng):
    """Group-limited top-k routing of router logits (tokens, experts) plus a per-expert
    correction bias, into router_probs."""
    cases = []
    for name, attrs in (("top2", {"top_k": 2}),
                        ("groups", {"top_k": 3, "n_group": 4, "topk_group": 2}),
                        ("group-topk", {"top_k": 2, "n_group": 4, "topk_group": 2,
                                        "group_topk": 1}),
                        ("sentinel", {"top_k": 1, "router_sentinel": -1e9})):
        feeds = {"x": normal(rng, (6, 8)), "b": normal(rng, (8,), F32, 0.2)}
        cases.append(Case(name, feeds, attrs))
    return cases
