"""Device bindings on attention kernels: GroupQueryAttention, MultiHeadAttention and Attention
write the new KV positions into the bound buffer and attend over it (no present copied)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from onnx import helper

import onnxkiln as ok
from onnxkiln.testing import make_model, tensor_info

ort = pytest.importorskip("onnxruntime")

F32 = np.float32
B, N, NK, H, CAP = 2, 4, 2, 16, 48
MS = {"com.microsoft": 1}


def _providers():
    params = [pytest.param("cpu", id="cpu")]
    try:
        import torch
    except ImportError:
        params.append(pytest.param("torch", id="torch-cpu", marks=pytest.mark.skip(
            reason="torch is not installed: the CUDA provider cannot be tested")))
    else:
        params.append(pytest.param("torch", id="torch-cpu"))
        params.append(pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
            not torch.cuda.is_available(), reason="no CUDA device")))
    return params


def _session(model, where):
    b = ok.InferenceSession.builder()
    if where == "cpu":
        b = b.providers(["cpu"])
    elif where == "cuda":
        b = b.providers(["cuda", "cpu"])
    else:
        b = b.providers(["cuda", "cpu"]).option("testing.cuda_on_torch_cpu", "1")
    return b.load(model) if isinstance(model, str) else b.from_graph(model)


def _ort(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _host(x):
    return x if isinstance(x, np.ndarray) else x.cpu().numpy()


# ---------------------------------------------------------------------------------------------
# models


def _rope_tables(rows: int, rot: int):
    ang = np.arange(rows)[:, None] / (10000.0 ** (np.arange(0, rot, 2) / rot))[None, :]
    return {"cos": np.cos(ang).astype(F32), "sin": np.sin(ang).astype(F32)}


def _gqa(rotary: bool = False, packed: bool = False, dt=F32, **attrs):
    """One GroupQueryAttention node; past/present (B, NK, len, H); rotary inside when asked."""
    ins = [tensor_info("q", dt, [B, "s", (N + 2 * NK) * H if packed else N * H])]
    names = ["q", "", ""]
    if not packed:
        ins += [tensor_info("k", dt, [B, "s", NK * H]), tensor_info("v", dt, [B, "s", NK * H])]
        names = ["q", "k", "v"]
    ins += [tensor_info("past_key", dt, [B, NK, "p", H]),
            tensor_info("past_value", dt, [B, NK, "p", H]),
            tensor_info("seqlens_k", np.int32, [B]), tensor_info("total", np.int32, [])]
    names += ["past_key", "past_value", "seqlens_k", "total"]
    inits = {}
    if rotary:
        names += ["cos", "sin"]
        inits = {k: v.astype(dt) for k, v in _rope_tables(CAP, H).items()}
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=N, kv_num_heads=NK,
                            do_rotary=int(rotary), **attrs)
    outs = [tensor_info("out", dt, [B, "s", N * H]),
            tensor_info("present_key", dt, [B, NK, "t", H]),
            tensor_info("present_value", dt, [B, NK, "t", H])]
    return make_model([node], ins, outs, inits, extra_opsets=MS)


def _mha(dt=F32):
    ins = [tensor_info(n, dt, [B, "s", N * H]) for n in ("q", "k", "v")]
    ins += [tensor_info(n, dt, [B, N, "p", H]) for n in ("past_key", "past_value")]
    node = helper.make_node("MultiHeadAttention",
                            ["q", "k", "v", "", "", "", "past_key", "past_value"],
                            ["out", "present_key", "present_value"], domain="com.microsoft",
                            num_heads=N, unidirectional=1)
    outs = [tensor_info("out", dt, [B, "s", N * H]),
            tensor_info("present_key", dt, [B, N, "t", H]),
            tensor_info("present_value", dt, [B, N, "t", H])]
    return make_model([node], ins, outs, extra_opsets=MS)


def _ms_attention(share: bool):
    rng = np.random.default_rng(7)
    d = N * H
    inits = {"w": (rng.standard_normal((d, 3 * d)) * 0.2).astype(F32),
             "bias": (rng.standard_normal(3 * d) * 0.1).astype(F32)}
    names = ["x", "w", "bias", "", "past"]
    ins = [tensor_info("x", F32, [B, "s", d]), tensor_info("past", F32, [2, B, N, "p", H])]
    if share:
        names += ["", "past_len"]
        ins.append(tensor_info("past_len", np.int32, [1]))
    node = helper.make_node("Attention", names, ["out", "present"], domain="com.microsoft",
                            num_heads=N, unidirectional=1, past_present_share_buffer=int(share))
    outs = [tensor_info("out", F32, [B, "s", d]), tensor_info("present", F32, [2, B, N, "t", H])]
    return make_model([node], ins, outs, inits, extra_opsets=MS)


def _onnx_attention():
    ins = [tensor_info("q", F32, [B, "s", N * H]), tensor_info("k", F32, [B, "s", NK * H]),
           tensor_info("v", F32, [B, "s", NK * H]),
           tensor_info("past_key", F32, [B, NK, "p", H]),
           tensor_info("past_value", F32, [B, NK, "p", H])]
    node = helper.make_node("Attention", ["q", "k", "v", "", "past_key", "past_value"],
                            ["out", "present_key", "present_value"], q_num_heads=N,
                            kv_num_heads=NK, is_causal=1)
    outs = [tensor_info("out", F32, [B, "s", N * H]),
            tensor_info("present_key", F32, [B, NK, "t", H]),
            tensor_info("present_value", F32, [B, NK, "t", H])]
    return make_model([node], ins, outs, opset=23)


# ---------------------------------------------------------------------------------------------
# the decode loop: bound vs plain vs onnxruntime


class Case:
    """How one model's KV travels: names, per-binding shapes, and each step's plain feeds."""

    def __init__(self, model, kv, heads, axis, step_feeds, static=False, rows=1, oracle=None):
        self.model, self.kv, self.heads, self.axis = model, kv, heads, axis
        self.step_feeds, self.static, self.rows = step_feeds, static, rows
        self.oracle = oracle  # onnxruntime's model when it cannot run this one (growing form)

    def shape(self, length):
        lead = (2,) if self.rows == 2 else ()
        return (*lead, B, self.heads, length, H)


def _qkv(rng, s, kv_heads=NK, packed=False):
    if packed:
        return {"q": rng.standard_normal((B, s, (N + 2 * kv_heads) * H), F32)}
    return {"q": rng.standard_normal((B, s, N * H), F32),
            "k": rng.standard_normal((B, s, kv_heads * H), F32),
            "v": rng.standard_normal((B, s, kv_heads * H), F32)}


def _gqa_feeds(packed=False):
    def feeds(rng, p, s):
        return {**_qkv(rng, s, packed=packed), "seqlens_k": np.full(B, p + s - 1, np.int32),
                "total": np.array(p + s, np.int32)}
    return feeds


def _x_feeds(share):
    def feeds(rng, p, s):
        f = {"x": rng.standard_normal((B, s, N * H), F32)}
        if share:
            f["past_len"] = np.array([p], np.int32)
        return f
    return feeds


CASES = {
    "gqa": lambda: Case(_gqa(), [("past_key", "present_key"), ("past_value", "present_value")],
                        NK, 2, _gqa_feeds()),
    "gqa-rotary": lambda: Case(_gqa(rotary=True),
                               [("past_key", "present_key"), ("past_value", "present_value")],
                               NK, 2, _gqa_feeds()),
    "gqa-packed-rotary": lambda: Case(
        _gqa(rotary=True, packed=True),
        [("past_key", "present_key"), ("past_value", "present_value")], NK, 2,
        _gqa_feeds(packed=True)),
    "gqa-window-softcap": lambda: Case(
        _gqa(rotary=True, local_window_size=3, softcap=5.0),
        [("past_key", "present_key"), ("past_value", "present_value")], NK, 2, _gqa_feeds()),
    "gqa-static": lambda: Case(_gqa(rotary=True),
                               [("past_key", "present_key"), ("past_value", "present_value")],
                               NK, 2, _gqa_feeds(), static=True),
    "mha": lambda: Case(_mha(), [("past_key", "present_key"), ("past_value", "present_value")],
                        N, 2, lambda rng, p, s: _qkv(rng, s, kv_heads=N)),
    "ms-attention": lambda: Case(_ms_attention(False), [("past", "present")], N, 3,
                                 _x_feeds(False), rows=2),
    "ms-attention-static": lambda: Case(_ms_attention(True), [("past", "present")], N, 3,
                                        _x_feeds(True), static=True, rows=2,
                                        oracle=_ms_attention(False)),
    "onnx-attention": lambda: Case(_onnx_attention(),
                                   [("past_key", "present_key"), ("past_value", "present_value")],
                                   NK, 2, lambda rng, p, s: _qkv(rng, s)),
}
# Which runtimes have a kernel: the torch provider has no com.microsoft Attention (the CPU
# provider runs it, bindings then live on the torch device and the node falls back).
TORCH_KERNEL = {"ms-attention": False, "ms-attention-static": False}


def _valid(x, case, length):
    """The first `length` positions of a KV array (the part attention reads)."""
    return x[(slice(None),) * case.axis + (slice(0, length),)]


def _decode(case, where, prompt=5, steps=6):
    """Run the prompt and `steps` single tokens three ways; check each step and return the
    bindings (their write counters per step are checked here)."""
    s = _session(case.model, where)
    ref = _ort(case.oracle or case.model)
    wanted = {i.name for i in (case.oracle or case.model).graph.input}
    start = CAP if case.static else 0
    binds = [s.allocate_device_binding(i, o, ok.DataType.FLOAT, case.shape(CAP),
                                       case.shape(start)) for i, o in case.kv]
    plain_past = {i: np.zeros(case.shape(start), F32) for i, _ in case.kv}
    ort_past = {i: np.zeros(case.shape(0 if case.oracle else start), F32) for i, _ in case.kv}
    rng = np.random.default_rng(0)
    p = 0
    for step in range(steps + 1):
        n = prompt if step == 0 else 1
        feeds = case.step_feeds(rng, p, n)
        plain = s.run({**feeds, **plain_past})
        theirs = ref.run(None, {k: v for k, v in {**feeds, **ort_past}.items() if k in wanted})
        before = [b.write_stats() for b in binds]
        got = s.run_with_device_bindings(feeds, binds)
        assert got[1:] == [None] * len(case.kv)
        np.testing.assert_array_equal(_host(got[0]), plain[0], err_msg=f"step {step}")
        np.testing.assert_allclose(_host(got[0]), theirs[0], rtol=1e-5, atol=1e-5)
        length = p + n
        for b, want, oracle, was in zip(binds, plain[1:], theirs[1:], before):
            assert b.logical_shape == want.shape
            np.testing.assert_array_equal(b.read(), want, err_msg=f"{b.input_name} step {step}")
            np.testing.assert_allclose(_valid(b.read(), case, length),
                                       _valid(oracle, case, length), rtol=1e-5, atol=1e-5)
            now = b.write_stats()
            row = 4 * B * case.heads * H * case.rows  # bytes of one position
            assert now.copied_bytes == 0, "the present was copied back into the binding"
            assert now.in_place_bytes - was.in_place_bytes == n * row
            assert now.in_place_writes - was.in_place_writes == case.rows
        plain_past = {i: v for (i, _), v in zip(case.kv, plain[1:])}
        ort_past = {i: v for (i, _), v in zip(case.kv, theirs[1:])}
        p = length
    return s, binds


@pytest.mark.parametrize(("name", "where"), [
    pytest.param(name, where.values[0], id=f"{where.id}-{name}", marks=where.marks)
    for where in _providers() for name in sorted(CASES)
    if where.values[0] == "cpu" or TORCH_KERNEL.get(name, True)])
def test_bound_kv_is_written_in_place_and_matches_plain_and_onnxruntime(name, where):
    _decode(CASES[name](), where)


@pytest.mark.parametrize("where", _providers())
def test_gqa_static_cache_keeps_the_buffer_and_writes_at_seqlens_k(where):
    case = CASES["gqa-static"]()
    _, binds = _decode(case, where, prompt=3, steps=4)
    assert all(b.logical_shape == case.shape(CAP) for b in binds)
    k = binds[0].read()
    assert np.count_nonzero(k[:, :, 3 + 4:]) == 0  # nothing written past the 7 positions
    assert np.count_nonzero(k[:, :, 6]) > 0


@pytest.mark.parametrize("where", _providers())
def test_gqa_static_cache_with_a_ragged_batch(where):
    """Entries at different lengths (seqlens_k differs per row): each one's new rows land at
    its own position in the shared buffer, as in the plain kernel and onnxruntime."""
    model = _gqa(rotary=True)
    s, ref = _session(model, where), _ort(model)
    full = (B, NK, CAP, H)
    names = (("past_key", "present_key"), ("past_value", "present_value"))
    binds = [s.allocate_device_binding(i, o, ok.DataType.FLOAT, full, full) for i, o in names]
    past = {i: np.zeros(full, F32) for i, _ in names}
    theirs_past = dict(past)
    rng = np.random.default_rng(8)
    lengths = np.array([5, 3])  # a right-padded prompt of 5 rows, then single tokens
    for step in range(5):
        n = 5 if step == 0 else 1
        total = int(lengths.max()) if step == 0 else int(lengths.max()) + step
        seqlens = lengths - 1 if step == 0 else lengths + step - 1
        feeds = {**_qkv(rng, n), "seqlens_k": seqlens.astype(np.int32),
                 "total": np.array(total, np.int32)}
        plain = s.run({**feeds, **past})
        theirs = ref.run(None, {**feeds, **theirs_past})
        got = s.run_with_device_bindings(feeds, binds)
        np.testing.assert_array_equal(_host(got[0]), plain[0])
        np.testing.assert_allclose(_host(got[0]), theirs[0], rtol=1e-5, atol=1e-5)
        for b, want, oracle in zip(binds, plain[1:], theirs[1:]):
            for e, t in enumerate(seqlens + 1):  # rows past an entry's length: stale, unread
                np.testing.assert_array_equal(b.read()[e, :, :t], want[e, :, :t])
                np.testing.assert_allclose(b.read()[e, :, :t], oracle[e, :, :t], rtol=1e-5,
                                           atol=1e-5)
        past = {i: v for (i, _), v in zip(names, plain[1:])}
        theirs_past = {i: v for (i, _), v in zip(names, theirs[1:])}


@pytest.mark.parametrize("op", ["gqa", "mha"])
@pytest.mark.parametrize("where", _providers())
def test_float16_kv_bound_equals_plain(where, op):
    """float16 caches: attention computes in float32 over the rounded past and (MHA) the
    unrounded new rows, as the plain kernels do; bound and plain agree bit for bit."""
    f16 = np.float16
    model, heads = (_gqa(rotary=True, dt=f16), NK) if op == "gqa" else (_mha(f16), N)
    s = _session(model, where)
    names = ("past_key", "present_key"), ("past_value", "present_value")
    binds = [s.allocate_device_binding(i, o, ok.DataType.FLOAT16, (B, heads, CAP, H),
                                       (B, heads, 0, H)) for i, o in names]
    past = {i: np.zeros((B, heads, 0, H), f16) for i, _ in names}
    rng = np.random.default_rng(5)
    p = 0
    for n in (4, 1, 1, 1):
        feeds = {k: v.astype(f16) for k, v in _qkv(rng, n, kv_heads=heads).items()}
        if op == "gqa":
            feeds.update(seqlens_k=np.full(B, p + n - 1, np.int32), total=np.array(p + n, np.int32))
        plain = s.run({**feeds, **past})
        got = s.run_with_device_bindings(feeds, binds)
        np.testing.assert_array_equal(_host(got[0]), plain[0])
        for b, want in zip(binds, plain[1:]):
            np.testing.assert_array_equal(b.read(), want)
            assert b.write_stats().copied_bytes == 0
        past = {"past_key": plain[1], "past_value": plain[2]}
        p += n


@pytest.mark.parametrize("where", _providers())
def test_captured_static_gqa_replays_write_in_place(where):
    """A captured static-cache step (every input in a binding, total_sequence_length the
    buffer length) replays with GroupQueryAttention writing at seqlens_k in place; on the
    torch provider it is a seam (total is a host operand) and runs eagerly between segments."""
    s = _session(_gqa(rotary=True), where)
    full = (B, NK, CAP, H)
    kv = [s.allocate_device_binding(i, o, ok.DataType.FLOAT, full, full)
          for i, o in (("past_key", "present_key"), ("past_value", "present_value"))]
    shapes = {"q": (B, 1, N * H), "k": (B, 1, NK * H), "v": (B, 1, NK * H),
              "seqlens_k": (B,), "total": ()}
    ins = {n: s.allocate_device_binding(
        n, None, ok.DataType.INT32 if n in ("seqlens_k", "total") else ok.DataType.FLOAT,
        shape, shape) for n, shape in shapes.items()}
    out = s.allocate_device_output_binding("out", ok.DataType.FLOAT, (B, 1, N * H),
                                           (B, 1, N * H))
    binds = [*kv, *ins.values(), out]
    past = {"past_key": np.zeros(full, F32), "past_value": np.zeros(full, F32)}
    rng = np.random.default_rng(6)
    for p in range(5):
        feeds = {**_gqa_feeds()(rng, p, 1), "total": np.array(CAP, np.int32)}
        for name, value in feeds.items():
            ins[name].write(value)
        plain = s.run({**feeds, **past})
        if p == 0:
            assert s.try_capture_with_device_bindings({}, binds).captured
        else:
            assert s.replay_device_graph(binds)
        np.testing.assert_array_equal(out.read(), plain[0])
        for b, want in zip(kv, plain[1:]):
            np.testing.assert_array_equal(b.read(), want)
            assert b.write_stats().in_place_writes == p + 1
            assert b.write_stats().copied_bytes == 0
        past = {"past_key": plain[1], "past_value": plain[2]}


def test_bound_gqa_step_allocates_no_cache_sized_array():
    """tracemalloc sees numpy's allocations: a step that built a new present (or copied one
    back) would allocate at least one cache's worth; the in-place step allocates scores only."""
    case = CASES["gqa"]()
    cap = 4096
    s = _session(case.model, "cpu")
    binds = [s.allocate_device_binding(i, o, ok.DataType.FLOAT, (B, NK, cap, H),
                                       (B, NK, 0, H)) for i, o in case.kv]
    rng = np.random.default_rng(1)
    s.run_with_device_bindings(_gqa_feeds()(rng, 0, 2000), binds)
    feeds = _gqa_feeds()(rng, 2000, 1)
    s.run_with_device_bindings(feeds, binds)  # warm: the decode memo is built
    cache_bytes = binds[0].tensor.nbytes * 2000 // cap
    tracemalloc.start()
    try:
        for p in range(2001, 2004):
            s.run_with_device_bindings(_gqa_feeds()(rng, p, 1), binds)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < cache_bytes // 2, (peak, cache_bytes)
    assert binds[0].logical_shape == (B, NK, 2004, H)


@pytest.mark.parametrize("where", _providers())
def test_bound_gqa_past_the_capacity_is_a_binding_error(where):
    case = CASES["gqa"]()
    s = _session(case.model, where)
    binds = [s.allocate_device_binding(i, o, ok.DataType.FLOAT, (B, NK, 4, H), (B, NK, 0, H))
             for i, o in case.kv]
    rng = np.random.default_rng(2)
    s.run_with_device_bindings(_gqa_feeds()(rng, 0, 4), binds)
    with pytest.raises(ok.DeviceBindingError, match="capacity 4"):
        s.run_with_device_bindings(_gqa_feeds()(rng, 4, 1), binds)


@pytest.mark.parametrize("where", _providers())
def test_bound_mha_past_the_capacity_is_a_binding_error(where):
    case = CASES["mha"]()
    s = _session(case.model, where)
    binds = [s.allocate_device_binding(i, o, ok.DataType.FLOAT, (B, N, 3, H), (B, N, 0, H))
             for i, o in case.kv]
    rng = np.random.default_rng(3)
    s.run_with_device_bindings(_qkv(rng, 3, kv_heads=N), binds)
    with pytest.raises(ok.DeviceBindingError, match="capacity 3"):
        s.run_with_device_bindings(_qkv(rng, 1, kv_heads=N), binds)


def test_only_one_of_the_pair_bound_falls_back_to_copying():
    """With only past_key bound the kernel keeps its plain path; the copy back is counted."""
    case = CASES["gqa"]()
    s = _session(case.model, "cpu")
    bk = s.allocate_device_binding("past_key", "present_key", ok.DataType.FLOAT,
                                   (B, NK, CAP, H), (B, NK, 0, H))
    rng = np.random.default_rng(4)
    past_v = np.zeros((B, NK, 0, H), F32)
    feeds = _gqa_feeds()(rng, 0, 3)
    plain = s.run({**feeds, "past_key": np.zeros((B, NK, 0, H), F32), "past_value": past_v})
    out = s.run_with_device_bindings({**feeds, "past_value": past_v}, [bk])
    np.testing.assert_array_equal(out[0], plain[0])
    np.testing.assert_array_equal(bk.read(), plain[1])
    stats = bk.write_stats()
    assert (stats.copies, stats.copied_bytes, stats.in_place_writes) == (1, plain[1].nbytes, 0)


# ---------------------------------------------------------------------------------------------
# a decoder from onnxruntime-genai's model builder (GroupQueryAttention with rotary inside,
# SkipSimplifiedLayerNormalization), random weights


def _genai(arch):
    try:
        from bench import genai_models
    except ImportError as e:  # bench/ is not installed with the package
        pytest.skip(f"bench.genai_models does not import: {e}")
    why = genai_models.available()
    if why:
        pytest.skip(why)
    folder = genai_models.build(arch, "fp32", hidden=64, layers=2)
    return genai_models.DecoderIO(folder)


def _greedy(run, io, prompt, steps, past):
    """Greedy tokens and each step's last logits; `run(feeds)` returns (logits, presents)."""
    tokens = np.asarray([prompt], np.int64)
    total, produced, logits = len(prompt), [], []
    for _ in range(steps):
        out, presents = run(io.feeds(tokens, total, past))
        if presents is not None:
            past = dict(zip(io.past, presents, strict=True))
        logits.append(np.asarray(_host(out))[0, -1].copy())
        produced.append(int(np.argmax(logits[-1])))
        tokens = np.asarray([[produced[-1]]], np.int64)
        total += 1
    return produced, logits


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
@pytest.mark.parametrize("where", _providers())
def test_genai_decoder_32_greedy_tokens_through_bound_runs(where, static, arch):
    io = _genai(arch)
    prompt, steps = [5, 6, 7, 8], 32
    cap = len(prompt) + steps
    s = _session(str(io.model_path), where)
    ref = ort.InferenceSession(str(io.model_path), providers=["CPUExecutionProvider"])
    shape = (1, io.kv_heads, cap, io.head_size)
    start = shape if static else (1, io.kv_heads, 0, io.head_size)
    past = {name: np.zeros(start, F32) for name in io.past}
    names = [io.logits, *io.present]

    def plain(feeds):
        logits, *presents = s.run(names, feeds)
        return logits, presents

    def theirs(feeds):
        logits, *presents = ref.run(names, feeds)
        return logits, presents

    binds = [s.allocate_device_binding(i, o, ok.DataType.FLOAT, shape, start)
             for i, o in zip(io.past, io.present)]

    def bound(feeds):
        feeds = {k: v for k, v in feeds.items() if k not in io.past}
        logits, *rest = s.run_with_device_bindings(feeds, binds)
        assert rest == [None] * len(binds)
        return logits, None

    want, want_logits = _greedy(plain, io, prompt, steps, past)
    oracle, oracle_logits = _greedy(theirs, io, prompt, steps, past)
    got, got_logits = _greedy(bound, io, prompt, steps, {})
    assert got == want == oracle
    # the memo's replays run kernels specialised for the step's shapes, the first-sight
    # plain runs the generic ones: equal up to the order of the GEMMs' sums
    np.testing.assert_allclose(np.stack(got_logits), np.stack(want_logits), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(np.stack(got_logits), np.stack(oracle_logits), rtol=1e-4,
                               atol=1e-4)
    row = io.kv_heads * io.head_size * 4
    for b in binds:
        stats = b.write_stats()
        assert (stats.copies, stats.in_place_writes) == (0, steps)
        assert stats.in_place_bytes == (len(prompt) + steps - 1) * row
        assert b.logical_shape == (shape if static else (1, io.kv_heads, cap - 1, io.head_size))


@pytest.mark.parametrize("name", ["gqa-rotary", "gqa-static", "mha", "ms-attention-static",
                                  "onnx-attention"])
def test_decode_verify_agrees_with_in_place_attention_writes(name):
    """decode.verify=1 replays each memoised step and recomputes it on the ordinary path from
    the saved bindings: the in-place writes must give the same bits both ways."""
    case = CASES[name]()
    s = (ok.InferenceSession.builder().providers(["cpu"]).option("decode.verify", "1")
         .from_graph(case.model))
    start = CAP if case.static else 0
    binds = [s.allocate_device_binding(i, o, ok.DataType.FLOAT, case.shape(CAP),
                                       case.shape(start)) for i, o in case.kv]
    rng = np.random.default_rng(9)
    p = 0
    for n in (4, 1, 1, 1, 1):
        s.run_with_device_bindings(case.step_feeds(rng, p, n), binds)
        p += n
    assert s.decode_memo_counts()[2] >= 3  # replayed (and verified) steps


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_gqa_cache_bound_equals_plain(bits):
    """An int8 / packed-int4 KV cache (k_quant_type PER_TENSOR): the encoded new rows go
    into the bound buffer in place; outputs and cache bytes equal the plain run's."""
    code = np.int8 if bits == 8 else np.uint8
    width = H if bits == 8 else H // 2
    ins = [tensor_info("q", F32, [B, "s", N * H]), tensor_info("k", F32, [B, "s", NK * H]),
           tensor_info("v", F32, [B, "s", NK * H]),
           tensor_info("past_key", code, [B, NK, "p", width]),
           tensor_info("past_value", code, [B, NK, "p", width]),
           tensor_info("seqlens_k", np.int32, [B]), tensor_info("total", np.int32, [])]
    names = ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total", "", "", "", "", "",
             "k_scale", "v_scale"]
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=N, kv_num_heads=NK,
                            k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR",
                            kv_cache_bit_width=bits)
    outs = [tensor_info("out", F32, [B, "s", N * H]),
            tensor_info("present_key", code, [B, NK, "t", width]),
            tensor_info("present_value", code, [B, NK, "t", width])]
    scales = {"k_scale": np.array([0.05], F32), "v_scale": np.array([0.04], F32)}
    model = make_model([node], ins, outs, scales, extra_opsets=MS)
    s = _session(model, "cpu")
    kinds = ok.DataType.INT8 if bits == 8 else ok.DataType.UINT8
    kv = (("past_key", "present_key"), ("past_value", "present_value"))
    binds = [s.allocate_device_binding(i, o, kinds, (B, NK, CAP, width), (B, NK, 0, width))
             for i, o in kv]
    past = {i: np.zeros((B, NK, 0, width), code) for i, _ in kv}
    rng = np.random.default_rng(10)
    p = 0
    for n in (3, 1, 1):
        feeds = _gqa_feeds()(rng, p, n)
        plain = s.run({**feeds, **past})
        got = s.run_with_device_bindings(feeds, binds)
        np.testing.assert_array_equal(got[0], plain[0])
        for b, want in zip(binds, plain[1:]):
            np.testing.assert_array_equal(b.read(), want)
            assert b.write_stats().copied_bytes == 0
        past = {"past_key": plain[1], "past_value": plain[2]}
        p += n
    assert binds[0].write_stats().in_place_bytes == 5 * B * NK * width


def _sparse_model(cap, block):
    """SparseAttention (Phi-3-small's block-sparse GQA) over shared (B, NK, cap, H) buffers."""
    nb = cap // block
    mask = np.tril(np.ones((1, nb, nb), np.int32))
    mask[0, 2, 0] = 0
    rows = np.concatenate([[0], np.cumsum(mask[0].sum(1))]).astype(np.int32)[None]
    cols = np.nonzero(mask[0])[1].astype(np.int32)[None]
    ins = [tensor_info("q", F32, [B, "s", N * H]), tensor_info("k", F32, [B, "s", NK * H]),
           tensor_info("v", F32, [B, "s", NK * H]),
           tensor_info("past_key", F32, [B, NK, cap, H]),
           tensor_info("past_value", F32, [B, NK, cap, H]),
           tensor_info("total", np.int32, []), tensor_info("key_total", np.int32, [B])]
    node = helper.make_node(
        "SparseAttention", ["q", "k", "v", "past_key", "past_value", "rows", "cols", "total",
                            "key_total"],
        ["out", "present_key", "present_value"], domain="com.microsoft", num_heads=N,
        kv_num_heads=NK, sparse_block_size=block)
    outs = [tensor_info("out", F32, [B, "s", N * H]),
            tensor_info("present_key", F32, [B, NK, cap, H]),
            tensor_info("present_value", F32, [B, NK, cap, H])]
    return make_model([node], ins, outs, {"rows": rows, "cols": cols}, extra_opsets=MS)


def test_sparse_attention_shared_buffer_bound_in_place():
    """SparseAttention's past and present are one buffer by definition (onnxruntime's CPU
    kernel demands it): bound, the new rows go straight in; equal to plain runs bit for bit and
    to onnxruntime run through I/O binding on one persistent buffer."""
    cap, block = 64, 16
    model = _sparse_model(cap, block)
    s = _session(model, "cpu")
    full = (B, NK, cap, H)
    kv = (("past_key", "present_key"), ("past_value", "present_value"))
    binds = [s.allocate_device_binding(i, o, ok.DataType.FLOAT, full, full) for i, o in kv]
    ref = _ort(model)
    caches = {i: ort.OrtValue.ortvalue_from_numpy(np.zeros(full, F32)) for i, _ in kv}
    past = {i: np.zeros(full, F32) for i, _ in kv}
    rng = np.random.default_rng(11)
    p = 0
    for n in (20, 1, 1, 1):
        feeds = {**_qkv(rng, n), "total": np.array(p + n, np.int32),
                 "key_total": np.full(B, p + n, np.int32)}
        plain = s.run({**feeds, **past})
        got = s.run_with_device_bindings(feeds, binds)
        io = ref.io_binding()
        io.bind_output("out")
        for name, value in feeds.items():
            io.bind_cpu_input(name, value)
        for i, o in kv:
            io.bind_ortvalue_input(i, caches[i])
            io.bind_ortvalue_output(o, caches[i])
        ref.run_with_iobinding(io)
        np.testing.assert_array_equal(got[0], plain[0])
        np.testing.assert_allclose(got[0], io.get_outputs()[0].numpy(), rtol=2e-5, atol=2e-5)
        for b, want, (i, _) in zip(binds, plain[1:], kv):
            np.testing.assert_array_equal(b.read(), want)
            np.testing.assert_allclose(b.read()[:, :, : p + n], caches[i].numpy()[:, :, : p + n],
                                       rtol=1e-6, atol=1e-6)
            assert b.write_stats().copied_bytes == 0
        past = {i: v for (i, _), v in zip(kv, plain[1:])}
        p += n
