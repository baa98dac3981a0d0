"""Generated cases for the attention family and its embeddings (contrib_attention.py,
contrib_gqa.py, contrib_transformer.py, contrib_misc.py, contrib_norm.py): prompt and decode
shapes, masks, past caches, rotary variants; one small case per attribute set."""

from __future__ import annotations

import numpy as np
from contrib_harness import F16, F32, I32, I64, Case, normal, scalar, spec

TOL = {np.dtype(F32): 2e-5, np.dtype(F16): 4e-3}


def _tol(dt):
    return TOL[np.dtype(dt)]


@spec("Attention")
def attention(rng):
    b, s, d, heads = 2, 4, 16, 2
    cases = []
    for name, extra, attrs in (
        ("plain", {}, {}),
        ("mask-lengths", {"mask": np.array([4, 2], I32)}, {}),
        ("mask-2d-unidirectional", {"mask": np.array([[1, 1, 1, 0], [1, 1, 1, 1]], I32)},
         {"unidirectional": 1}),
        ("scale-attention-bias", {"ab": normal(rng, (1, heads, s, s))}, {"scale": 0.2}),
        ("qkv-hidden-sizes", {}, {"qkv_hidden_sizes": [16, 16, 8]}),
        ("mask-filter-value", {"mask": np.array([[1, 1, 0, 0], [1, 0, 1, 1]], I32)},
         {"mask_filter_value": -1000.0}),
    ):
        width = sum(attrs.get("qkv_hidden_sizes", [3 * d]))
        feeds = {"x": normal(rng, (b, s, d)), **extra}
        consts = {"w": normal(rng, (d, width), F32, 0.3), "bias": normal(rng, (width,))}
        names = ["x", "w", "bias", "mask" if "mask" in extra else "", "",
                 "ab" if "ab" in extra else ""]
        while names[-1] == "":
            names.pop()
        cases.append(Case(name, feeds, {"num_heads": heads, **attrs}, consts, names,
                          rtol=2e-5, atol=2e-5))
    consts = {"w": normal(rng, (d, 3 * d), F16, 0.3), "bias": normal(rng, (3 * d,), F16)}
    cases.append(Case("float16", {"x": normal(rng, (b, s, d), F16)}, {"num_heads": heads},
                      consts, ["x", "w", "bias"], rtol=4e-3, atol=4e-3))
    consts = {"w": normal(rng, (d, 3 * d), F32, 0.3), "bias": normal(rng, (3 * d,))}
    for name, mask in (("mask-3d", rng.integers(0, 2, (b, s, s)).astype(I32)),
                       ("mask-end-and-start", np.array([4, 3, 0, 1], I32))):
        cases.append(Case(name, {"x": normal(rng, (b, s, d)), "m": mask}, {"num_heads": heads},
                          consts, ["x", "w", "bias", "m"], rtol=2e-5, atol=2e-5))
    past = normal(rng, (2, b, heads, 3, d // heads))
    cases.append(Case("decode-past-unidirectional", {"x": normal(rng, (b, 1, d)), "past": past},
                      {"num_heads": heads, "unidirectional": 1},
                      {"w": normal(rng, (d, 3 * d), F32, 0.3), "bias": normal(rng, (3 * d,))},
                      ["x", "w", "bias", "", "past"], n_out=2, rtol=2e-5, atol=2e-5))
    return cases


@spec("MultiHeadAttention")
def multi_head_attention(rng):
    b, s, kv, n, h = 2, 3, 5, 2, 8
    cases = []
    for dt in (F32, F16):
        q, k, v = (normal(rng, (b, t, n * h), dt) for t in (s, kv, kv))
        t = _tol(dt)
        cases.append(Case(f"{np.dtype(dt).name}-cross", {"q": q, "k": k, "v": v},
                          {"num_heads": n}, rtol=t, atol=t))
        cases.append(Case(f"{np.dtype(dt).name}-bias-padding-mask", {
            "q": q, "k": k, "v": v, "bias": normal(rng, (3 * n * h,), dt),
            "m": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], I32)}, {"num_heads": n},
            rtol=t, atol=t))
    qs = normal(rng, (b, 1, n * h))
    cases.append(Case("decode-past-unidirectional", {
        "q": qs, "k": normal(rng, (b, 1, n * h)), "v": normal(rng, (b, 1, n * h)),
        "pk": normal(rng, (b, n, 4, h)), "pv": normal(rng, (b, n, 4, h))},
        {"num_heads": n, "unidirectional": 1, "scale": 0.5},
        names=["q", "k", "v", "", "", "", "pk", "pv"], n_out=3, rtol=2e-5, atol=2e-5))
    q, k, v = (normal(rng, (b, t, n * h)) for t in (s, kv, kv))
    for name, mask in (("padding-lengths", np.array([5, 2], I32)),
                       ("padding-3d", rng.integers(0, 2, (b, s, kv)).astype(I32))):
        cases.append(Case(name, {"q": q, "k": k, "v": v, "m": mask}, {"num_heads": n},
                          names=["q", "k", "v", "", "m"], rtol=2e-5, atol=2e-5))
    cases.append(Case("bnsh-key-value", {"q": q, "k": normal(rng, (b, n, kv, h)),
                                         "v": normal(rng, (b, n, kv, h))}, {"num_heads": n},
                      rtol=2e-5, atol=2e-5))
    cases.append(Case("attention-bias", {"q": normal(rng, (b, s, n * h)),
                                         "k": normal(rng, (b, kv, n * h)),
                                         "v": normal(rng, (b, kv, n * h)),
                                         "ab": normal(rng, (1, n, s, kv))},
                      {"num_heads": n}, names=["q", "k", "v", "", "", "ab"], rtol=2e-5,
                      atol=2e-5))
    return cases


GQA_NAMES = ["q", "k", "v", "pk", "pv", "sl", "ts", "cos", "sin"]


def _gqa(rng, dt, n, nk, h, s, past, seqlens, total, rotary=False, packed=False):
    b = len(seqlens)
    if packed:  # query holds Q, K and V; key and value absent
        feeds = {"q": normal(rng, (b, s, (n + 2 * nk) * h), dt)}
    else:
        feeds = {"q": normal(rng, (b, s, n * h), dt), "k": normal(rng, (b, s, nk * h), dt),
                 "v": normal(rng, (b, s, nk * h), dt)}
    if past:
        feeds["pk"], feeds["pv"] = (normal(rng, (b, nk, past, h), dt) for _ in range(2))
    feeds["sl"], feeds["ts"] = np.array(seqlens, I32), scalar(total, I32)
    if rotary:
        feeds["cos"], feeds["sin"] = normal(rng, (16, h // 2), dt), normal(rng, (16, h // 2), dt)
    names = [x if x in feeds else "" for x in GQA_NAMES]
    while names[-1] == "":
        names.pop()
    return feeds, names


@spec("GroupQueryAttention")
def group_query_attention(rng):
    cases = []
    for dt in (F32, F16):
        t = _tol(dt)
        for scen, (s, past, seqlens, total), attrs in (
            ("prompt", (3, 0, [2, 2], 3), {}),
            ("decode", (1, 5, [5, 5], 6), {"softcap": 1.5}),
            ("decode-ragged-window", (1, 5, [5, 3], 6), {"local_window_size": 2}),
            ("chunk-rotary", (3, 5, [7], 8), {"do_rotary": 1, "rotary_interleaved": 1}),
            ("prompt-smooth", (3, 0, [2, 2], 3), {"smooth_softmax": 1, "scale": 0.3}),
            ("decode-static-buffer-packed", (1, 8, [5, 2], 6), {"packed": True}),
            ("prompt-softcap-window1", (3, 0, [2, 2], 3),
             {"softcap": 2.0, "local_window_size": 1}),
        ):
            feeds, names = _gqa(rng, dt, 4, 2, 16, s, past, seqlens, total,
                                rotary="do_rotary" in attrs, packed=attrs.pop("packed", False))
            cases.append(Case(f"{np.dtype(dt).name}-{scen}", feeds,
                              {"num_heads": 4, "kv_num_heads": 2, **attrs}, names=names,
                              n_out=3, rtol=t, atol=t))
    return cases


def _csr(mask):
    """block_row_indices / block_col_indices (padded with -1) of (L, nb, nb) block masks."""
    rows = [np.concatenate([[0], np.cumsum(m.sum(1))]) for m in mask]
    cols = [np.nonzero(m)[1] for m in mask]
    width = max(len(c) for c in cols)
    cols = [np.pad(c, (0, width - len(c)), constant_values=-1) for c in cols]
    return np.array(rows, I32), np.array(cols, I32)


def _ort_shared_buffers(model, feeds):
    """onnxruntime's CPU SparseAttention wants past and present in one buffer (io binding)."""
    import onnxruntime as ort

    from onnxkiln.testing import ort_session

    sess = ort_session(model)
    io = sess.io_binding()
    caches = {k: ort.OrtValue.ortvalue_from_numpy(feeds[k].copy()) for k in ("pk", "pv")}
    for k, v in feeds.items():
        if k in caches:
            io.bind_ortvalue_input(k, caches[k])
        else:
            io.bind_cpu_input(k, v)
    outs = [o.name for o in model.graph.output]
    io.bind_output(outs[0])
    io.bind_ortvalue_output(outs[1], caches["pk"])
    io.bind_ortvalue_output(outs[2], caches["pv"])
    sess.run_with_iobinding(io)
    return [np.array(o.numpy(), copy=True) for o in (io.get_outputs()[0], caches["pk"],
                                                      caches["pv"])]


@spec("SparseAttention")
def sparse_attention(rng):
    cases = []
    b, n, nk, h, cap, block = 2, 4, 2, 16, 48, 16
    mask = np.tril(np.ones((2, 3, 3), int))
    mask[0, 2, 0] = mask[1, 2, 1] = 0
    rows, cols = _csr(mask)
    for s, total, rotary in ((40, 40, 0), (1, 41, 1)):
        feeds = {"q": normal(rng, (b, s, n * h)), "k": normal(rng, (b, s, nk * h)),
                 "v": normal(rng, (b, s, nk * h)), "pk": normal(rng, (b, nk, cap, h)),
                 "pv": normal(rng, (b, nk, cap, h)), "ri": rows, "ci": cols,
                 "ts": scalar(total, I32), "kt": np.array([total, total], I32)}
        names = list(feeds)
        attrs = {"num_heads": n, "kv_num_heads": nk, "sparse_block_size": block}
        if rotary:
            feeds["c"], feeds["s"] = normal(rng, (64, h // 2)), normal(rng, (64, h // 2))
            names += ["c", "s"]
            attrs["do_rotary"] = 1

        def only_filled(outs, total=total):  # cache rows past total_sequence_length: unused
            return [outs[0], outs[1][:, :, :total], outs[2][:, :, :total]]

        cases.append(Case(f"s{s}-total{total}-rotary{rotary}", feeds, attrs, names=names,
                          n_out=3, rtol=2e-5, atol=2e-5, ort_runner=_ort_shared_buffers,
                          project=only_filled))
    return cases


@spec("RotaryEmbedding")
def rotary_embedding(rng):
    cases = []
    b, s, n, h = 2, 3, 2, 8
    for inter in (0, 1):
        for dt in (F32, F16):
            t = _tol(dt)
            cos, sin = normal(rng, (10, h // 2), dt), normal(rng, (10, h // 2), dt)
            pid = rng.integers(0, 10 - s, (b, s)).astype(I64)
            cases.append(Case(f"3d-inter{inter}-{np.dtype(dt).name}", {
                "x": normal(rng, (b, s, n * h), dt), "p": pid, "c": cos, "s": sin},
                {"interleaved": inter, "num_heads": n}, rtol=t, atol=t))
        cases.append(Case(f"4d-offset-partial-inter{inter}", {
            "x": normal(rng, (b, n, s, 2 * h)), "p": np.array([2], I64),
            "c": normal(rng, (10, h // 2)), "s": normal(rng, (10, h // 2))},
            {"interleaved": inter, "rotary_embedding_dim": h, "num_heads": n}))
    cs = {"c": normal(rng, (10, h // 2)), "s": normal(rng, (10, h // 2))}
    cases += [Case("packed-batching", {"x": normal(rng, (1, 6, n * h)),
                                       "p": np.array([[0, 1, 2, 0, 1, 2]], I64), **cs},
                   {"num_heads": n, "is_packed_batching": 1}),
              Case("scale", {"x": normal(rng, (b, s, n * h)),
                             "p": rng.integers(0, 10 - s, (b, s)).astype(I64), **cs},
                   {"num_heads": n, "scale": 0.5})]
    return cases


@spec("MRotaryEmbedding")
def m_rotary_embedding(rng):
    cases = []
    b, s, heads, head = 2, 4, 2, 16
    for layout, section, inter in ((0, [2, 3, 3], 0), (1, [4, 2, 2], 1), (0, [8, 0, 0], 1)):
        angles = rng.uniform(0, 6, (20, head // 2))
        cases.append(Case(f"layout{layout}-{section}-inter{inter}", {
            "x": normal(rng, (b, s, heads * head)),
            "p": rng.integers(0, 20, (3, b, s)).astype(I64),
            "c": np.cos(angles).astype(F32), "s": np.sin(angles).astype(F32)},
            {"mrope_section": section, "mrope_layout": layout, "interleaved": inter,
             "num_heads": heads}))
    return cases


@spec("EmbedLayerNormalization")
def embed_layer_normalization(rng):
    b, s, d, vocab = 2, 5, 8, 13
    consts = {"word": normal(rng, (vocab, d)), "pos": normal(rng, (s + 2, d)),
              "segt": normal(rng, (2, d)), "gamma": normal(rng, (d,)), "beta": normal(rng, (d,))}
    mask = np.ones((b, s), I32)
    mask[1, 3:] = 0
    ids = rng.integers(0, vocab, (b, s)).astype(I32)
    seg = rng.integers(0, 2, (b, s)).astype(I32)
    cases = [Case("segments-mask-sum", {"ids": ids, "seg": seg, "mask": mask}, {"epsilon": 1e-12},
                  consts, ["ids", "seg", "word", "pos", "segt", "gamma", "beta", "mask"],
                  n_out=3, rtol=1e-5, atol=1e-5),
             Case("no-segment-mask-type0", {"ids": ids, "mask": mask}, {"mask_index_type": 0},
                  {k: v for k, v in consts.items() if k != "segt"},
                  ["ids", "", "word", "pos", "", "gamma", "beta", "mask"], n_out=2, rtol=1e-5,
                  atol=1e-5),
             Case("position-ids", {"ids": ids, "pid": rng.integers(0, s + 2, (b, s)).astype(I32)},
                  {}, {k: v for k, v in consts.items() if k != "segt"},
                  ["ids", "", "word", "pos", "", "gamma", "beta", "", "pid"], n_out=2, rtol=1e-5,
                  atol=1e-5),
             Case("position-ids-one-row", {"ids": ids, "pid": np.arange(s, dtype=I32)[None]}, {},
                  {k: v for k, v in consts.items() if k != "segt"},
                  ["ids", "", "word", "pos", "", "gamma", "beta", "", "pid"], n_out=2, rtol=1e-5,
                  atol=1e-5),
             Case("float16", {"ids": ids}, {},
                  {k: v.astype(F16) for k, v in consts.items() if k != "segt"},
                  ["ids", "", "word", "pos", "", "gamma", "beta"], n_out=2, rtol=3e-3,
                  atol=3e-3)]
    return cases


DMMHA_NAMES = ["q", "k", "v", "mask", "ab", "pk", "pv", "psl", "beam", "ind", "bias"]


@spec("DecoderMaskedMultiHeadAttention")
def decoder_masked_multi_head_attention(rng):
    """One-token decoder attention over a shared past/present buffer of capacity 7 holding
    `past` positions (written at past_sequence_length); beams read it through
    cache_indirection."""
    heads, d, past, cap = 2, 4, 3, 7
    cases = []
    for name, batch, extra in (("plain", 2, {}), ("bias", 2, {"bias"}), ("mask", 2, {"mask"}),
                               ("attention-bias", 2, {"ab"}), ("beams", 6, {"beam"})):
        feeds = {n: normal(rng, (batch, 1, heads * d)) for n in ("q", "k", "v")}
        if "mask" in extra:
            feeds["mask"] = np.ones((batch, past + 1), I32)
            feeds["mask"][0, :2] = 0
        if "ab" in extra:
            feeds["ab"] = normal(rng, (1, heads, 1, past + 1))
        for n in ("pk", "pv"):
            buf = np.zeros((batch, heads, cap, d), F32)
            buf[:, :, :past] = normal(rng, (batch, heads, past, d))
            feeds[n] = buf
        feeds["psl"] = np.array([past], I32)
        if "beam" in extra:
            feeds["beam"] = np.array([3], I32)
            feeds["ind"] = rng.integers(0, 3, (2, 3, cap)).astype(I32)
        if "bias" in extra:
            feeds["bias"] = normal(rng, (3 * heads * d,), F32, 0.3)
        last = max(DMMHA_NAMES.index(n) for n in feeds)
        names = [n if n in feeds else "" for n in DMMHA_NAMES[:last + 1]]
        cases.append(Case(name, feeds, {"num_heads": heads, "past_present_share_buffer": 1},
                          names=names, n_out=3, rtol=1e-5, atol=1e-5))
    return cases
