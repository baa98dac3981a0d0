"""The compiled GroupQueryAttention decode step (providers/cpu/_gqa_decode, _numba_gqa):
one-token float32 steps agree with the numpy path and with onnxruntime, it is taken exactly
for those steps, and the numpy path runs when numba is off."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import onnxkiln as ok
from onnxkiln.providers.cpu import _gqa_decode, _numba
from onnxkiln.testing import make_model, tensor_info

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("numba", reason="the compiled decode step needs numba (the fast extra)")

F32 = np.float32
H, ROWS = 32, 64
MS = {"com.microsoft": 1}


def _tables(rot):
    ang = np.arange(ROWS)[:, None] / (10000.0 ** (np.arange(0, rot, 2) / rot))[None, :]
    return {"cos": np.cos(ang).astype(F32), "sin": np.sin(ang).astype(F32)}


def _model(n, nk, packed=False, rotary=False, rot=H, position_ids=False, **attrs):
    b = "b"
    ins = [tensor_info("q", F32, [b, "s", (n + 2 * nk) * H if packed else n * H])]
    names = ["q", "", ""]
    if not packed:
        ins += [tensor_info("k", F32, [b, "s", nk * H]), tensor_info("v", F32, [b, "s", nk * H])]
        names = ["q", "k", "v"]
    ins += [tensor_info("past_key", F32, [b, nk, "p", H]),
            tensor_info("past_value", F32, [b, nk, "p", H]),
            tensor_info("seqlens_k", np.int32, [b]), tensor_info("total", np.int32, [])]
    names += ["past_key", "past_value", "seqlens_k", "total"]
    inits = {}
    if rotary:
        names += ["cos", "sin"]
        inits = _tables(rot)
    if position_ids:
        names.append("position_ids")
        ins.append(tensor_info("position_ids", np.int64, [b, "s"]))
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=n, kv_num_heads=nk,
                            do_rotary=int(rotary), **attrs)
    outs = [tensor_info("out", F32, [b, "s", n * H]),
            tensor_info("present_key", F32, [b, nk, "t", H]),
            tensor_info("present_value", F32, [b, nk, "t", H])]
    return make_model([node], ins, outs, inits, extra_opsets=MS)


def _feeds(rng, n, nk, packed, past, seqlens, s=1):
    bsz = len(seqlens)
    f = {"past_key": rng.standard_normal((bsz, nk, past, H)).astype(F32),
         "past_value": rng.standard_normal((bsz, nk, past, H)).astype(F32),
         "seqlens_k": np.asarray(seqlens, np.int32),
         "total": np.asarray(max(seqlens) + 1, np.int32)}
    if packed:
        f["q"] = rng.standard_normal((bsz, s, (n + 2 * nk) * H)).astype(F32)
    else:
        f["q"] = rng.standard_normal((bsz, s, n * H)).astype(F32)
        f["k"] = rng.standard_normal((bsz, s, nk * H)).astype(F32)
        f["v"] = rng.standard_normal((bsz, s, nk * H)).astype(F32)
    return f


@pytest.fixture
def taken(monkeypatch):
    """Per call of _gqa_decode.decode: whether it ran the step (True) or declined (False)."""
    calls = []
    real = _gqa_decode.decode

    def counted(*args, **kwargs):
        got = real(*args, **kwargs)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(_gqa_decode, "decode", counted)
    return calls


def _numpy_session(model, monkeypatch):
    monkeypatch.setattr(_numba, "ENABLED", False)
    s = ok.InferenceSession.builder().providers(["cpu"]).from_graph(model)
    monkeypatch.setattr(_numba, "ENABLED", True)
    return s


def _three_ways(model, feeds, monkeypatch, taken):
    """(compiled, numpy path, onnxruntime) outputs; checks which path each session took."""
    plain = _numpy_session(model, monkeypatch)
    want = plain.run(feeds)
    assert taken == []  # numba off: the kernel never asks for the compiled step
    fast = ok.InferenceSession.builder().providers(["cpu"]).from_graph(model)
    got = fast.run(feeds)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return got, want, ref.run(None, feeds)


def _check(got, want, theirs, seqlens):
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], theirs[0], rtol=1e-5, atol=1e-5)
    for g, w, t in zip(got[1:], want[1:], theirs[1:]):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        for b, length in enumerate(np.asarray(seqlens) + 1):  # onnxruntime's valid rows
            np.testing.assert_allclose(g[b, :, :length], t[b, :, :length], rtol=1e-5, atol=1e-5)


HEADS = [(4, 1), (4, 2), (4, 4), (8, 2), (8, 4)]
ROTARY = [("plain", {}), ("rotary", {"rotary": True}),
          ("interleaved", {"rotary": True, "rotary_interleaved": 1}),
          ("half-rotary", {"rotary": True, "rot": H // 2})]


@pytest.mark.parametrize("n,nk", HEADS, ids=[f"n{n}-kv{k}" for n, k in HEADS])
@pytest.mark.parametrize("form", ROTARY, ids=[r[0] for r in ROTARY])
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("past,seqlens", [(0, [0]), (1, [1]), (37, [37]), (0, [0, 0]),
                                          (1, [1, 0]), (37, [37, 20])],
                         ids=["p0", "p1", "p37", "b2-p0", "b2-p1", "b2-p37"])
def test_decode_step_agrees_with_numpy_and_onnxruntime(n, nk, form, packed, past, seqlens,
                                                       monkeypatch, taken):
    attrs = dict(form[1])
    model = _model(n, nk, packed, **attrs)
    feeds = _feeds(np.random.default_rng(past * 7 + n + nk), n, nk, packed, past, seqlens)
    got, want, theirs = _three_ways(model, feeds, monkeypatch, taken)
    assert taken == [True]
    _check(got, want, theirs, seqlens)


@pytest.mark.parametrize("attrs", [{"scale": 0.3}, {"softcap": 2.5}, {"local_window_size": 5},
                                   {"local_window_size": 50, "softcap": 1.5}],
                         ids=["scale", "softcap", "window", "window-wide-softcap"])
def test_decode_step_scale_softcap_window(attrs, monkeypatch, taken):
    model = _model(8, 2, rotary=True, **attrs)
    seqlens = [37, 12]
    feeds = _feeds(np.random.default_rng(3), 8, 2, False, 37, seqlens)
    got, want, theirs = _three_ways(model, feeds, monkeypatch, taken)
    assert taken == [True]
    _check(got, want, theirs, seqlens)


def test_prompt_keeps_the_numpy_path(monkeypatch, taken):
    """Three query rows: the compiled step declines, the numpy path answers."""
    model = _model(4, 2, rotary=True)
    feeds = _feeds(np.random.default_rng(4), 4, 2, False, 5, [7], s=3)
    got, want, theirs = _three_ways(model, feeds, monkeypatch, taken)
    assert taken == [False]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_allclose(got[0], theirs[0], rtol=1e-5, atol=1e-5)


def test_bad_seqlens_still_raise(taken):
    """Out-of-range seqlens_k: the compiled step declines and the numpy path's error stands."""
    model = _model(4, 2)
    feeds = _feeds(np.random.default_rng(5), 4, 2, False, 3, [3])
    feeds["total"] = np.asarray(2, np.int32)
    s = ok.InferenceSession.builder().providers(["cpu"]).from_graph(model)
    with pytest.raises(ok.SessionError, match="exceeds total_sequence_length"):
        s.run(feeds)
    assert taken == [False]


@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
def test_bound_in_place_steps_equal_plain_runs(static, packed, taken):
    """Device bindings: the compiled step writes the new row into the bound buffer at
    seqlens_k and attends over it; outputs and cache equal plain runs (which build presents)."""
    n, nk, cap, bsz = 8, 2, 24, 2
    model = _model(n, nk, packed, rotary=True, rotary_interleaved=1)
    s = ok.InferenceSession.builder().providers(["cpu"]).from_graph(model)
    shape = (bsz, nk, cap, H)
    start = shape if static else (bsz, nk, 0, H)
    binds = [s.allocate_device_binding(i, o, ok.DataType.FLOAT, shape, start)
             for i, o in (("past_key", "present_key"), ("past_value", "present_value"))]
    past = {"past_key": np.zeros(start, F32), "past_value": np.zeros(start, F32)}
    rng = np.random.default_rng(6)
    for p in range(8):
        feeds = _feeds(rng, n, nk, packed, 0, [p, p])
        del feeds["past_key"], feeds["past_value"]
        plain = s.run({**feeds, **past})
        taken.clear()
        got = s.run_with_device_bindings(feeds, binds)
        assert taken == [True], f"step {p}"
        np.testing.assert_array_equal(got[0], plain[0], err_msg=f"step {p}")
        for b, want in zip(binds, plain[1:]):
            np.testing.assert_array_equal(b.read()[:, :, : p + 1], want[:, :, : p + 1])
        past = dict(zip(("past_key", "past_value"), plain[1:]))
    for b in binds:
        stats = b.write_stats()
        assert (stats.copies, stats.in_place_writes) == (0, 8)
        assert stats.in_place_bytes == 8 * bsz * nk * H * 4


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_builder_decoder_32_greedy_tokens_equal_onnxruntime(arch, taken):
    try:
        from bench import genai_models
    except ImportError as e:  # bench/ is not installed with the package
        pytest.skip(f"bench.genai_models does not import: {e}")
    why = genai_models.available()
    if why:
        pytest.skip(why)
    folder = genai_models.build(arch, "fp32", hidden=256, layers=2)
    io = genai_models.DecoderIO(folder)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = ort.InferenceSession(str(io.model_path), so, providers=["CPUExecutionProvider"])
    s = ok.InferenceSession.builder().intra_op_threads(1).load(str(io.model_path))
    prompt = [5, 6, 7, 8]
    got = genai_models.greedy(s, folder, prompt, 32)
    assert sum(taken) == 31 * io.layers  # every one-token step of every layer
    assert got == genai_models.greedy(ref, folder, prompt, 32)


def test_environment_switch_keeps_the_numpy_path(monkeypatch, taken):
    """ONNXKILN_NO_NUMBA=1 at session build: the kernel never asks for the compiled step."""
    model = _model(4, 2, rotary=True)
    feeds = _feeds(np.random.default_rng(8), 4, 2, False, 6, [6])
    monkeypatch.setenv(_numba.ENV, "1")
    got = ok.InferenceSession.builder().providers(["cpu"]).from_graph(model).run(feeds)
    monkeypatch.delenv(_numba.ENV)
    assert taken == []
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got[0], ref.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_position_ids_pick_the_rotary_rows(monkeypatch, taken):
    """position_ids given: the rotary angle follows them, not seqlens_k; a row past the
    tables makes the compiled step decline and the numpy path raise."""
    model = _model(8, 2, rotary=True, position_ids=True)
    seqlens = [9, 4]
    feeds = _feeds(np.random.default_rng(9), 8, 2, False, 9, seqlens)
    feeds["position_ids"] = np.asarray([[30], [7]], np.int64)
    got, want, theirs = _three_ways(model, feeds, monkeypatch, taken)
    assert taken == [True]
    _check(got, want, theirs, seqlens)
    taken.clear()
    s = ok.InferenceSession.builder().providers(["cpu"]).from_graph(model)
    with pytest.raises(ok.SessionError, match="cos_cache"):
        s.run({**feeds, "position_ids": np.asarray([[3], [ROWS]], np.int64)})
    assert taken == [False]


def test_a_call_with_another_operand_layout_is_checked_again(monkeypatch, taken):
    """The node keeps the last call's checked layout: calls with fed rotary tables (new
    arrays each time) give numpy's result, a table too wide for the heads or a query that is
    not contiguous is declined to the numpy path after a call that was taken."""
    model = _model(8, 2, rotary=True)
    tables = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    del model.graph.initializer[:]
    model.graph.input.extend(tensor_info(k, F32, ["r", "w"]) for k in ("cos", "sin"))
    plain = _numpy_session(model, monkeypatch)
    fast = ok.InferenceSession.builder().providers(["cpu"]).from_graph(model)
    seqlens = [9, 4]
    for seed in (1, 2):
        feeds = {**_feeds(np.random.default_rng(seed), 8, 2, False, 9, seqlens),
                 **{k: v.copy() for k, v in tables.items()}}
        _check(fast.run(feeds), plain.run(feeds), plain.run(feeds), seqlens)
    assert taken == [True, True]
    wide = {k: np.concatenate([v, v], axis=1) for k, v in tables.items()}  # 2 * width > H
    feeds = {**feeds, **wide}
    with pytest.raises(ok.SessionError):
        plain.run(feeds)
    with pytest.raises(ok.SessionError):
        fast.run(feeds)
    assert taken[-1] is False
    feeds = {**feeds, **tables, "q": np.asfortranarray(feeds["q"])}
    np.testing.assert_allclose(fast.run(feeds)[0], plain.run(feeds)[0], rtol=1e-6, atol=1e-6)
    assert taken[-1] is False
