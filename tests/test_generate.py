"""onnxkiln.generate on decoder graphs: greedy tokens equal onnxruntime's plain loop on
onnxruntime-genai builder graphs, the zoo's decoders and a graph with position_ids; sampling,
stop tokens, padded batches, the streaming callback, the paths and their fallbacks."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxkiln as ok
from onnxkiln import zoo
from onnxkiln.generation import DecoderLayout, DecoderLayoutError, Sampling, generate

ort = pytest.importorskip("onnxruntime")

PATHS = ("plain", "bound", "captured")


def _genai():
    try:
        from bench import genai_models
    except ImportError as e:  # the bench package is not importable from here
        pytest.skip(f"bench.genai_models does not import: {e}")
    why = genai_models.available()
    if why:
        pytest.skip(why)
    return genai_models


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def builder(request):
    """(folder, onnxkiln session, onnxruntime session) of a builder graph (GQA, rotary)."""
    gm = _genai()
    folder = gm.build(request.param, "fp32", hidden=64, layers=2)
    io = gm.DecoderIO(folder)
    return folder, ok.InferenceSession.load(io.model_path), _ort_load(io.model_path)


def _ort_load(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _ref(folder, prompt, steps):
    """onnxruntime's plain greedy loop over the folder's model (bench.genai_models.greedy)."""
    gm = _genai()
    return gm.greedy(_ort_load(gm.DecoderIO(folder).model_path), folder, prompt, steps)


# --- a decoder with attention_mask and position_ids (the form transformers exports) ---------


def _position_decoder(vocab=48, hidden=16, heads=2, positions=64, seed=0) -> onnx.ModelProto:
    """One attention layer: position embeddings by position_ids, past ++ new keys (Concat),
    attention under attention_mask [batch, total] and the causal mask."""
    rng = np.random.default_rng(seed)
    d = hidden // heads
    weights = {n: rng.standard_normal(s).astype(np.float32) * 0.5
               for n, s in [("wte", (vocab, hidden)), ("wpe", (positions, hidden)),
                            ("wq", (hidden, hidden)), ("wk", (hidden, hidden)),
                            ("wv", (hidden, hidden)), ("wout", (hidden, vocab))]}
    consts = {"heads": np.array([0, 0, heads, d], np.int64), "merge": np.array([0, 0, hidden]),
              "one": np.array(1, np.int64), "zero": np.array(0, np.int64),
              "i1": np.array([1], np.int64), "ax": np.array([1, 2], np.int64),
              "scale": np.array(1 / math.sqrt(d), np.float32),
              "neg": np.array(-1e9, np.float32)}
    n = helper.make_node
    nodes = [n("Gather", ["wte", "input_ids"], ["tok"]),
             n("Gather", ["wpe", "position_ids"], ["pos"]), n("Add", ["tok", "pos"], ["x"])]
    for t in "qkv":
        nodes += [n("MatMul", ["x", f"w{t}"], [f"{t}2"]),
                  n("Reshape", [f"{t}2", "heads"], [f"{t}3"]),
                  n("Transpose", [f"{t}3"], [f"{t}h"], perm=[0, 2, 1, 3])]
    nodes += [
        n("Concat", ["past_key_values.0.key", "kh"], ["present.0.key"], axis=2),
        n("Concat", ["past_key_values.0.value", "vh"], ["present.0.value"], axis=2),
        n("Transpose", ["present.0.key"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["qh", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s1"]),
        n("Shape", ["attention_mask"], ["mshape"]), n("Gather", ["mshape", "one"], ["total"]),
        n("Shape", ["input_ids"], ["ishape"]), n("Gather", ["ishape", "one"], ["seq"]),
        n("Sub", ["total", "seq"], ["past"]), n("Range", ["past", "total", "one"], ["qpos"]),
        n("Unsqueeze", ["qpos", "i1"], ["qcol"]), n("Range", ["zero", "total", "one"], ["kpos"]),
        n("LessOrEqual", ["kpos", "qcol"], ["causal"]),
        n("Cast", ["attention_mask"], ["mbool"], to=TensorProto.BOOL),
        n("Unsqueeze", ["mbool", "ax"], ["m4"]), n("And", ["causal", "m4"], ["allowed"]),
        n("Where", ["allowed", "s1", "neg"], ["s2"]), n("Softmax", ["s2"], ["p"], axis=-1),
        n("MatMul", ["p", "present.0.value"], ["c0"]),
        n("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]), n("Reshape", ["c1", "merge"], ["c2"]),
        n("Add", ["c2", "x"], ["y"]), n("MatMul", ["y", "wout"], ["logits"]),
    ]
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv_in, kv_out = ["batch", heads, "past", d], ["batch", heads, "total", d]
    graph = helper.make_graph(
        nodes, "position_decoder",
        [helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", i64, ["batch", "total"]),
         helper.make_tensor_value_info("position_ids", i64, ["batch", "seq"]),
         helper.make_tensor_value_info("past_key_values.0.key", f32, kv_in),
         helper.make_tensor_value_info("past_key_values.0.value", f32, kv_in)],
        [helper.make_tensor_value_info("logits", f32, ["batch", "seq", vocab]),
         helper.make_tensor_value_info("present.0.key", f32, kv_out),
         helper.make_tensor_value_info("present.0.value", f32, kv_out)],
        [numpy_helper.from_array(v, k) for k, v in {**weights, **consts}.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _write_config(folder, model, past="past_key_values.%d.key", present="present.%d.key",
                  position_ids=True, mask=True, eos=2):
    """A genai_config.json naming `model`'s inputs, so bench.genai_models.greedy can run it."""
    onnx.save(model, folder / "model.onnx")
    kv = next(i for i in model.graph.input if i.name.startswith("past"))
    dims = [d.dim_value for d in kv.type.tensor_type.shape.dim]
    ins = {"input_ids": "input_ids", "past_key_names": past,
           "past_value_names": _value_name(past)}
    if mask:
        ins["attention_mask"] = "attention_mask"
    if position_ids:
        ins["position_ids"] = "position_ids"
    layers = sum(1 for i in model.graph.input if i.name.startswith("past")) // 2
    decoder = {"filename": "model.onnx", "num_hidden_layers": layers,
               "num_key_value_heads": dims[1], "head_size": dims[3], "inputs": ins,
               "outputs": {"logits": "logits", "present_key_names": present,
                           "present_value_names": _value_name(present)}}
    (folder / "genai_config.json").write_text(
        json.dumps({"model": {"eos_token_id": eos, "decoder": decoder}}))
    return folder


def _value_name(key_name: str) -> str:
    """The value entry's name of a key entry's (the last `key` in it is the role)."""
    head, _, tail = key_name.rpartition("key")
    return f"{head}value{tail}"


@pytest.fixture(scope="module")
def position_folder(tmp_path_factory):
    return _write_config(tmp_path_factory.mktemp("posdec"), _position_decoder())


@pytest.fixture(scope="module")
def zoo_folder(tmp_path_factory):
    return _write_config(tmp_path_factory.mktemp("zoo"), zoo.gpt_decoder_step(),
                         past="past_key_%d", present="present_key_%d", position_ids=False,
                         mask=False)


# --- greedy equals onnxruntime ----------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_builder_greedy_equals_onnxruntime_loop(builder, path):
    folder, session, _ = builder
    result = generate(session, [5, 6, 7], max_new_tokens=12, eos_token_id=None, path=path,
                      config=folder)
    assert result.tokens[0] == _ref(folder, [5, 6, 7], 12)
    assert result.path == path and result.fallbacks == []
    assert result.layout.shared_buffer and result.layout.source.endswith("genai_config.json")


def test_builder_paths_engage_their_machinery(builder):
    folder, session, _ = builder
    bound = generate(session, [5, 6], max_new_tokens=8, eos_token_id=None, path="bound",
                     config=folder)
    assert bound.counters["memo_replayed"] >= 6, bound.counters
    captured = generate(session, [5, 6], max_new_tokens=8, eos_token_id=None, path="captured",
                        config=folder)
    c = captured.counters
    assert (c["captures"], c["segments"], c["retired"], c["capture_error"]) == (1, 1, 0, 0), c
    assert c["replays"] == 5 and captured.tokens == bound.tokens
    assert len(bound.step_ms) == 7 and bound.tokens_per_second > 0


def test_layout_inferred_from_the_graph_matches_the_genai_config(builder):
    folder, session, _ = builder
    inferred = DecoderLayout.infer(session)
    config = DecoderLayout.from_genai_config(folder, session)
    for field in ("input_ids", "logits", "attention_mask", "position_ids", "kv_dims",
                  "batch_axis", "seq_axis", "shared_buffer", "static_length"):
        assert getattr(inferred, field) == getattr(config, field), field
    assert sorted(inferred.past) == sorted(config.past)
    assert generate(session, [9, 4], max_new_tokens=6, eos_token_id=None).tokens == \
        generate(folder, [9, 4], max_new_tokens=6, eos_token_id=None).tokens


@pytest.mark.parametrize("path", PATHS)
def test_zoo_decoder_greedy_equals_onnxruntime_loop(zoo_folder, path):
    session = ok.InferenceSession.from_graph(zoo.gpt_decoder_step())
    result = generate(session, [5, 6, 7], max_new_tokens=10, eos_token_id=None, path=path)
    assert result.tokens[0] == _ref(zoo_folder, [5, 6, 7], 10)
    assert result.path == path


@pytest.mark.parametrize("path", PATHS)
def test_static_cache_decoder_gives_the_growing_decoders_tokens(zoo_folder, path):
    session = ok.InferenceSession.from_graph(zoo.gpt_static_decoder_step(capacity=24))
    result = generate(session, [5, 6, 7], max_new_tokens=10, eos_token_id=None, path=path)
    assert result.layout.static_length == 24 and result.layout.cache_position == "position"
    assert result.tokens[0] == _ref(zoo_folder, [5, 6, 7], 10)
    with pytest.raises(ok.InvalidInputError, match="holds 24 positions"):
        generate(session, [5, 6, 7], max_new_tokens=30)


@pytest.mark.parametrize("path", PATHS)
def test_position_ids_graph_greedy_and_left_padded_batch(position_folder, path):
    session = ok.InferenceSession.load(position_folder / "model.onnx")
    a, b = [3, 9, 4, 17, 22], [30, 8]
    ref_a, ref_b = _ref(position_folder, a, 8), _ref(position_folder, b, 8)
    alone = generate(session, b, max_new_tokens=8, eos_token_id=None, path=path)
    assert alone.tokens[0] == ref_b and alone.layout.position_ids == "position_ids"
    ids = np.array([a, [0, 0, 0, *b]])
    mask = np.array([[1] * 5, [0, 0, 0, 1, 1]])
    batch = generate(session, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=None,
                     path=path)
    assert batch.tokens == [ref_a, ref_b]


@pytest.mark.parametrize("path", PATHS)
def test_builder_batch_with_padding_equals_rows_alone(builder, path):
    folder, session, _ = builder
    a, b = [5, 6, 7, 8, 9, 10], [40, 41]
    batch = generate(session, [a, b], max_new_tokens=10, eos_token_id=None, path=path,
                     config=folder)
    assert batch.tokens == [_ref(folder, a, 10), _ref(folder, b, 10)]


# --- stopping, sampling, callback ---------------------------------------------------------------


def test_a_stop_token_ends_its_row_and_pads_follow(position_folder):
    session = ok.InferenceSession.load(position_folder / "model.onnx")
    rows = [[3, 9, 4], [30, 8, 1]]
    free = generate(session, rows, max_new_tokens=8, eos_token_id=None)
    # the first token of row 0 that row 1 never emits and row 0 did not emit before
    at = next(i for i, t in enumerate(free.tokens[0]) if i >= 1 and t not in free.tokens[1]
              and t not in free.tokens[0][:i])
    eos = free.tokens[0][at]
    stopped = generate(session, rows, max_new_tokens=8, eos_token_id=[eos, 999],
                       pad_token_id=0)
    assert stopped.tokens == [free.tokens[0][:at + 1], free.tokens[1]]
    assert stopped.finish_reasons == ["stop", "length"]
    assert stopped.sequences[0].tolist() == [*free.tokens[0][:at + 1]] + [0] * (7 - at)


def test_every_row_stopping_ends_the_loop(zoo_folder):
    session = ok.InferenceSession.from_graph(zoo.gpt_decoder_step())
    first = generate(session, [5, 6, 7], max_new_tokens=8, eos_token_id=None).tokens[0]
    at = next(i for i, t in enumerate(first) if t != first[0])  # its first new token
    result = generate(session, [5, 6, 7], max_new_tokens=20, eos_token_id=first[at])
    assert result.tokens == [first[:at + 1]] and len(result.step_ms) == at


def test_sampling_is_reproducible_and_top_k_1_is_greedy(builder):
    folder, session, _ = builder
    common = {"max_new_tokens": 10, "eos_token_id": None, "config": folder}
    greedy = generate(session, [5, 6, 7], **common).tokens
    hot = {"do_sample": True, "temperature": 2.0}
    one = generate(session, [5, 6, 7], seed=7, **hot, **common).tokens
    assert generate(session, [5, 6, 7], seed=7, **hot, **common).tokens == one
    again = generate(session, [5, 6, 7], rng=np.random.default_rng(7), **hot, **common).tokens
    assert again == one
    assert generate(session, [5, 6, 7], seed=8, **hot, **common).tokens != one
    assert one != greedy
    assert generate(session, [5, 6, 7], seed=3, do_sample=True, top_k=1, **common).tokens == \
        greedy


def test_sampling_filters_and_repetition_penalty():
    rng = np.random.default_rng(0)
    logits = np.array([1.0, 3.0, 2.9, -1.0], np.float32)
    nucleus = Sampling(do_sample=True, top_p=0.05)
    assert {nucleus.choose(logits, np.array([]), rng) for _ in range(50)} == {1}
    top2 = Sampling(do_sample=True, top_k=2, temperature=5.0)
    assert {top2.choose(logits, np.array([]), rng) for _ in range(200)} == {1, 2}
    penalty = Sampling(repetition_penalty=1.2)  # 3.0 / 1.2 = 2.5 < 2.9
    assert penalty.choose(logits, np.array([1]), rng) == 2
    assert Sampling().choose(logits, np.array([1]), rng) == 1
    with pytest.raises(ok.InvalidInputError, match="top_p"):
        Sampling(top_p=0.0)


def test_callback_sees_every_token_and_can_stop(position_folder):
    session = ok.InferenceSession.load(position_folder / "model.onnx")
    seen = []
    full = generate(session, [[3, 9], [4, 5, 6]], max_new_tokens=6, eos_token_id=None,
                    callback=lambda step, toks: seen.append((step, toks)))
    assert [s for s, _ in seen] == list(range(6))
    assert np.array([t for _, t in seen]).T.tolist() == full.tokens

    def stop_after_three(step, toks):
        return step < 2

    cut = generate(session, [[3, 9], [4, 5, 6]], max_new_tokens=6, eos_token_id=None,
                   callback=stop_after_three)
    assert cut.tokens == [t[:3] for t in full.tokens]
    assert cut.finish_reasons == ["callback", "callback"]


# --- refusals and fallbacks -------------------------------------------------------------------


def test_a_non_decoder_graph_is_refused_naming_what_is_missing():
    session = ok.InferenceSession.from_graph(zoo.mlp())
    with pytest.raises(DecoderLayoutError, match="input_ids.*past/present KV pairs"):
        generate(session, [1, 2, 3])
    assert issubclass(DecoderLayoutError, ok.SessionError)


def test_unpaddable_batches_and_bad_arguments_are_refused():
    session = ok.InferenceSession.from_graph(zoo.gpt_decoder_step())
    with pytest.raises(DecoderLayoutError, match="no attention_mask"):
        generate(session, [[1, 2, 3], [4]])
    with pytest.raises(ok.InvalidInputError, match="path must be"):
        generate(session, [1, 2], path="fast")
    with pytest.raises(ok.InvalidInputError, match="at least one token"):
        generate(session, [[1], []])
    with pytest.raises(ok.InvalidInputError, match="nothing to generate"):
        generate(session, [1, 2], max_length=2)
    static = ok.InferenceSession.from_graph(zoo.gpt_static_decoder_step(capacity=8))
    with pytest.raises(DecoderLayoutError, match="fixed batch of 1"):
        generate(static, [[1], [2]])


def test_capture_declined_falls_back_to_the_bound_step(zoo_folder):
    model = zoo.gpt_decoder_step()
    strict = ok.InferenceSession.builder().option("capture.allow_seams", "0").from_graph(model)
    result = generate(strict, [5, 6, 7], max_new_tokens=6, eos_token_id=None, path="captured")
    assert result.path == "bound" and "not capturable" in result.fallbacks[0]
    assert result.tokens[0] == _ref(zoo_folder, [5, 6, 7], 6)


def test_the_docs_page_example_runs():
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "generate.md"
    code = re.search(r"```python\n(.*?)```", page.read_text(), re.DOTALL).group(1)
    scope: dict = {}
    exec(compile(code, "generate.md", "exec"), scope)
    assert scope["result"].path == "captured" and scope["result"].counters["replays"] >= 5
    assert [len(t) for t in scope["sampled"].tokens] == [8, 8]


def test_decode_real_bench_runs_and_agrees_with_onnxruntime(tmp_path, capsys):
    _genai()
    from bench import decode_real

    out = tmp_path / "rows.json"
    code = decode_real.main(["--models", "llama-fp32", "--hidden", "64", "--tokens", "6",
                             "--rounds", "2", "--threads", "1", "--modes", "ort-loop",
                             "ok-plain", "ok-plain-cold", "ok-memo", "ok-captured", "--json",
                             str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert code == 0 and {r["mode"] for r in rows} == {"ort-loop", "ok-plain", "ok-plain-cold",
                                                       "ok-memo", "ok-captured"}
    assert all(r.get("tokens_match", True) and r["tok_s"] > 0 for r in rows), rows
    assert "x ort-loop" in capsys.readouterr().out


def _combined_kv_decoder(vocab=32, heads=2, d=4, seed=1) -> onnx.ModelProto:
    """A toy decoder whose cache is one [2, batch, heads, past, d] entry per layer
    (`past_key_values.0` -> `present.0`, the older exporters' form); the logits read the
    mean over the whole cache, so every step depends on the past."""
    rng = np.random.default_rng(seed)
    hidden = heads * d
    inits = {"wte": rng.standard_normal((vocab, hidden)).astype(np.float32),
             "wout": rng.standard_normal((hidden, vocab)).astype(np.float32),
             "split": np.array([0, 0, heads, d], np.int64), "ax0": np.array([0], np.int64),
             "axes": np.array([0, 3], np.int64), "merge": np.array([0, 1, hidden], np.int64)}
    n = helper.make_node
    nodes = [n("Gather", ["wte", "input_ids"], ["e"]), n("Reshape", ["e", "split"], ["e4"]),
             n("Transpose", ["e4"], ["kv"], perm=[0, 2, 1, 3]),
             n("Unsqueeze", ["kv", "ax0"], ["kv1"]), n("Concat", ["kv1", "kv1"], ["kv2"], axis=0),
             n("Concat", ["past_key_values.0", "kv2"], ["present.0"], axis=3),
             n("ReduceMean", ["present.0", "axes"], ["pooled"], keepdims=0),
             n("Reshape", ["pooled", "merge"], ["h"]), n("MatMul", ["h", "wout"], ["logits"])]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "combined_kv",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("past_key_values.0", f32,
                                       [2, "batch", heads, "past_sequence", d])],
        [helper.make_tensor_value_info("logits", f32, ["batch", 1, vocab]),
         helper.make_tensor_value_info("present.0", f32, [2, "batch", heads, "total", d])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("path", PATHS)
def test_combined_past_key_values_entry_is_inferred_and_decoded(path):
    model = _combined_kv_decoder()
    session = ok.InferenceSession.from_graph(model)
    layout = DecoderLayout.infer(session)
    assert (layout.past, layout.present) == (("past_key_values.0",), ("present.0",))
    assert (layout.batch_axis, layout.seq_axis, layout.kv_dims) == (1, 3, (2, 0, 2, 0, 4))
    reference = _ort_load_bytes(model)
    past, ids, expected = np.zeros((2, 1, 2, 0, 4), np.float32), np.array([[3, 1, 4]]), []
    for _ in range(8):  # onnxruntime's plain loop
        logits, past = reference.run(None, {"input_ids": ids, "past_key_values.0": past})
        expected.append(int(logits[0, -1].argmax()))
        ids = np.array([[expected[-1]]])
    result = generate(session, [3, 1, 4], max_new_tokens=8, eos_token_id=None, path=path)
    assert result.tokens[0] == expected and result.path == path


def _ort_load_bytes(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_bindings_refused_fall_back_to_plain_run(monkeypatch, zoo_folder):
    session = ok.InferenceSession.from_graph(zoo.gpt_decoder_step())

    def refuse(*args, **kwargs):
        raise ok.DeviceBindingError("no bindings on this provider")

    monkeypatch.setattr(session, "allocate_device_binding", refuse)
    result = generate(session, [5, 6, 7], max_new_tokens=5, eos_token_id=None)
    assert result.path == "plain" and result.fallbacks == [
        "captured: no bindings on this provider", "bound: no bindings on this provider"]
    assert result.tokens[0] == _ref(zoo_folder, [5, 6, 7], 5)


def test_generate_is_a_top_level_function_and_a_session_method():
    session = ok.InferenceSession.from_graph(zoo.gpt_decoder_step())
    direct = generate(session, [5, 6, 7], max_new_tokens=6, eos_token_id=None).tokens
    assert ok.generate(session, [5, 6, 7], max_new_tokens=6, eos_token_id=None).tokens == direct
    assert session.generate([5, 6, 7], max_new_tokens=6, eos_token_id=None).tokens == direct
    assert type(session.generate([5], max_new_tokens=1)) is ok.GenerateResult


@pytest.mark.parametrize("right", [False, True], ids=["left_rows", "right_rows"])
@pytest.mark.parametrize("additive", [False, True], ids=["ones", "additive"])
def test_a_mask_binding_updated_column_by_column_equals_the_whole_mask(right, additive):
    """After the prompt a bound mask gets only each step's new columns; it must always hold
    what the timeline's whole mask says, through a width change (a fixed full-width mask)."""
    from onnxkiln.bindings import DeviceIoBinding
    from onnxkiln.dtypes import DataType, from_numpy
    from onnxkiln.generation_runners import Timeline
    from onnxkiln.providers.cpu.provider import CpuProvider

    dtype = np.float32 if additive else np.int64
    layout = DecoderLayout("ids", "logits", ("p",), ("q",), (0, 1, 0, 4), 0, 2,
                           attention_mask="mask", mask_dtype=dtype, shared_buffer=right)
    rows, capacity = [[5, 6, 7], [8]], 12
    timeline = Timeline(layout, rows, 0, capacity)
    mask = DeviceIoBinding(None, CpuProvider(), "mask", None, from_numpy(np.dtype(dtype)),
                           (2, capacity), (2, 0))
    mask.write(np.full((2, capacity), 7, dtype))  # stale contents a fresh buffer may hold
    timeline.advance(timeline.width, True, mask=False)
    timeline.write_mask(mask, timeline.width, True)
    for step in range(6):
        if step == 3:  # as a capture does: the whole buffer from now on
            timeline.mask_width = capacity
            mask.set_logical_shape(mask.physical_shape)
        timeline.advance(1, False, mask=False)
        timeline.write_mask(mask, 1, False)
        np.testing.assert_array_equal(mask.read(), timeline.mask())
    assert DataType(mask.dtype) == from_numpy(np.dtype(dtype))
