"""The decode memo, view plan and capture on the common decode loop: a KV cache that grows
one position a step and a mask (or other plain input) that grows with it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxkiln as ok
from onnxkiln import zoo
from onnxkiln.testing import make_model, ort_session, tensor_info

H, D, V = 2, 4, 16  # heads, head size, vocabulary of the Concat-KV decoder
E = H * D
CAP = 48
PROMPT = np.array([[3, 1, 4]], np.int64)
F, I64 = ok.DataType.FLOAT, ok.DataType.INT64


def _concat_decoder():
    """A one-layer attention decoder step whose present KV is Concat(past, new) on axis 2 and
    whose `attention_mask` [1, total] masks the keys (as torch exports of transformers
    decoders are): logits [1, seq, V]. Transpose(present_key) is a view over the KV buffer."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["tok", "input_ids"], ["x"])]
    for name in ("q", "k", "v"):
        nodes += [helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}_flat"]),
                  helper.make_node("Reshape", [f"{name}_flat", "heads"], [f"{name}_4d"]),
                  helper.make_node("Transpose", [f"{name}_4d"], [f"{name}_h"], perm=[0, 2, 1, 3])]
    nodes += [
        helper.make_node("Concat", ["past_key", "k_h"], ["present_key"], axis=2),
        helper.make_node("Concat", ["past_value", "v_h"], ["present_value"], axis=2),
        helper.make_node("Transpose", ["present_key"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q_h", "kt"], ["scores"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "mask_f"], ["masked"]),
        helper.make_node("Mul", ["masked", "big"], ["bias2d"]),
        helper.make_node("Unsqueeze", ["bias2d", "axes12"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["biased"]),
        helper.make_node("Softmax", ["biased"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "present_value"], ["ctx_h"]),
        helper.make_node("Transpose", ["ctx_h"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "flat"], ["ctx"]),
        helper.make_node("MatMul", ["ctx", "wo"], ["logits"]),
    ]
    inits = {"tok": rng.standard_normal((V, E)).astype(np.float32),
             **{f"w{n}": (rng.standard_normal((E, E)) / 3).astype(np.float32) for n in "qkv"},
             "wo": rng.standard_normal((E, V)).astype(np.float32),
             "heads": np.array([0, -1, H, D], np.int64), "flat": np.array([0, -1, E], np.int64),
             "one": np.array(1, np.float32), "big": np.array(-1e4, np.float32),
             "axes12": np.array([1, 2], np.int64)}
    kv_in, kv_out = [1, H, "past", D], [1, H, "total", D]
    inputs = [tensor_info("input_ids", np.int64, [1, "seq"]),
              tensor_info("attention_mask", np.int64, [1, "total"]),
              tensor_info("past_key", np.float32, kv_in),
              tensor_info("past_value", np.float32, kv_in)]
    outputs = [tensor_info("logits", np.float32, [1, "seq", V]),
               tensor_info("present_key", np.float32, kv_out),
               tensor_info("present_value", np.float32, kv_out)]
    return make_model(nodes, inputs, outputs, inits)


@pytest.fixture(scope="module")
def decoder():
    return _concat_decoder()


def _providers():
    try:
        import torch  # noqa: F401
    except ImportError:
        return [pytest.param("cpu", id="cpu"), pytest.param("torch", id="torch-cpu", marks=(
            pytest.mark.skip(reason="torch is not installed: the CUDA provider cannot be tested")))]
    return [pytest.param("cpu", id="cpu"), pytest.param("torch", id="torch-cpu")]


def _session(model, level="all", where="cpu", **options):
    b = ok.InferenceSession.builder().optimization(level)
    if where == "cpu":
        b = b.providers(["cpu"])
    else:  # the CUDA provider's torch kernels on torch's CPU device
        b = b.providers(["cuda", "cpu"]).option("testing.cuda_on_torch_cpu", "1")
    for key, value in options.items():
        b = b.option(key.replace("_", "."), value)
    return b.from_graph(model)


def _kv(s):
    return [s.allocate_device_binding(f"past_{t}", f"present_{t}", F, (1, H, CAP, D),
                                      (1, H, 0, D)) for t in ("key", "value")]


def _memo_loop(s, steps, mask_extra=0):
    """Prefill PROMPT, then `steps` one-token steps; the mask is a plain array as wide as
    the cache after the step (plus `mask_extra` per step: a dim that does not follow)."""
    kv, ids, total, out = _kv(s), PROMPT, PROMPT.shape[1], []
    for step in range(steps + 1):
        mask = np.ones((1, total + step * mask_extra), np.int64)
        logits = s.run_with_device_bindings({"input_ids": ids, "attention_mask": mask}, kv)[0]
        out.append(logits)
        ids = np.array([[int(logits[0, -1].argmax())]], np.int64)
        total += 1
    return out, kv


def _reference(run, steps):
    """The same loop with plain runs of `run(feeds) -> [logits, present_key, present_value]`."""
    past = {f"past_{t}": np.zeros((1, H, 0, D), np.float32) for t in ("key", "value")}
    ids, total, out = PROMPT, PROMPT.shape[1], []
    for _ in range(steps + 1):
        logits, pk, pv = run({"input_ids": ids, "attention_mask": np.ones((1, total), np.int64),
                              **past})
        past = {"past_key": pk, "past_value": pv}
        out.append(logits)
        ids = np.array([[int(logits[0, -1].argmax())]], np.int64)
        total += 1
    return out


VIEWS_PER_STEP = {"cpu": 1, "torch": 3}


# --- the decode memo ----------------------------------------------------------------------

@pytest.mark.parametrize("where", _providers())
def test_a_growing_plain_mask_replays_the_memo_and_matches_plain_runs_and_onnxruntime(
        decoder, where):
    s = _session(decoder, where=where)
    logits, kv = _memo_loop(s, 31)
    assert s.decode_memo_counts() == (1, 1, 30, 0)  # prefill primes, the first step rebuilds
    assert kv[0].logical_shape == (1, H, 3 + 31, D)
    off = _session(decoder, where=where, decode_memo="0")
    off_logits, _ = _memo_loop(off, 31)
    assert off.decode_memo_counts() == (0, 0, 0, 32)
    for a, b in zip(logits, off_logits):
        np.testing.assert_array_equal(a, b)
    plain = _session(decoder, where=where)
    for a, b in zip(logits, _reference(plain.run, 31)):
        np.testing.assert_array_equal(a, b)
    ref = ort_session(decoder)
    for a, b in zip(logits, _reference(lambda f: ref.run(None, f), 31)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("where", _providers())
def test_views_over_the_growing_buffer_are_re_sliced_not_dispatched(decoder, where):
    # unfused (at "all" the attention becomes one kernel reading the buffer itself)
    s = _session(decoder, "basic", where)
    logits, _ = _memo_loop(s, 31)
    # Transpose(present_key) reads the appended buffer: the first replay records it, the 29
    # after it re-slice; Unsqueeze of the plain mask is not a buffer view and still runs
    # (on torch the uploads of the bound pasts, the tensors themselves, are re-sliced too)
    per_step = VIEWS_PER_STEP[where]
    assert s.decode_view_plan_counts() == (29 * per_step, 29 * per_step)
    for a, b in zip(logits, _reference(_session(decoder, "basic", where).run, 31)):
        np.testing.assert_array_equal(a, b)
    checked = _session(decoder, "basic", where, decode_verify="1")
    _memo_loop(checked, 8)
    assert checked.decode_view_plan_counts() == (6 * per_step, 6 * per_step)


def test_verify_proves_every_growing_replay_bit_identical(decoder):
    s = _session(decoder, decode_verify="1")
    logits, _ = _memo_loop(s, 12)
    assert s.decode_memo_counts() == (1, 1, 11, 0)
    for a, b in zip(logits, _memo_loop(_session(decoder, decode_memo="0"), 12)[0]):
        np.testing.assert_array_equal(a, b)


def test_a_plain_dim_that_does_not_follow_the_cache_rebuilds(decoder):
    # the mask grows by 2 a step while the cache grows by 1: another shape every step (the
    # model then fails to broadcast, as it does on the ordinary path)
    s = _session(decoder)
    with pytest.raises(ok.SessionError):
        _memo_loop(s, 3, mask_extra=1)
    assert s.decode_memo_counts()[2] == 0


def test_prefill_then_one_token_steps_still_rebuild_once(decoder):
    s = _session(decoder)
    kv = _kv(s)
    for ids, total in (([[1, 2, 3]], 3), ([[4]], 4), ([[5]], 5), ([[6, 7]], 7), ([[8]], 8)):
        s.run_with_device_bindings({"input_ids": np.array(ids, np.int64),
                                    "attention_mask": np.ones((1, total), np.int64)}, kv)
    # primed at 3 tokens; rebuilt at 1 token, at 2 tokens, at 1 token; the 5th replayed
    assert s.decode_memo_counts() == (1, 3, 1, 0)


# --- capture ------------------------------------------------------------------------------

def _capture_bindings(s):
    kv = _kv(s)
    ids = s.allocate_device_binding("input_ids", None, I64, (1, 3), (1, 3))
    mask = s.allocate_device_binding("attention_mask", None, I64, (1, CAP), (1, 3))
    mask.write(np.ones((1, CAP), np.int64))
    logits = s.allocate_device_output_binding("logits", F, (1, 3, V), (1, 3, V))
    return kv, ids, mask, logits


def _capture_then_replay(s, binds, ids, mask, logits, steps=31):
    """Prefill (on the memo), capture the first greedy step, replay the rest; the mask grows
    one position per step. Returns every step's logits and the replays' results."""
    ids.write(PROMPT)
    s.run_with_device_bindings({}, binds)
    got = [logits.read()]
    ids.set_logical_shape((1, 1))
    replays = []
    for step in range(steps):
        ids.write(np.array([[int(got[-1][0, -1].argmax())]], np.int64))
        mask.set_logical_shape((1, 4 + step))
        if step == 0:
            res = s.try_capture_with_device_bindings({}, binds)
            assert res.captured and res.segments >= 2
        else:
            replays.append(s.replay_device_graph(binds))
        got.append(logits.read())
    return got, replays


@pytest.mark.parametrize("where", _providers())
def test_capture_of_a_growing_cache_and_mask_replays_every_step(decoder, where):
    s = _session(decoder, where=where)
    kv, ids, mask, logits = _capture_bindings(s)
    binds = [*kv, ids, mask, logits]
    got, replays = _capture_then_replay(s, binds, ids, mask, logits)
    assert replays == [True] * 30  # one capture, no retirement while the cache grows
    assert kv[0].logical_shape == (1, H, 34, D) and mask.logical_shape == (1, 34)
    assert s.check_device_capture_error() == 0
    kinds = {d.seam_kind for d in s.capture_segmentation()}
    assert kinds == {ok.SeamKind.GROWING_SHAPE}
    seams = {d.op_type for d in s.capture_segmentation()}
    assert "Concat" in seams and "Gather" not in seams  # the token's path is recorded
    for a, b in zip(got, _reference(_session(decoder, where=where).run, 31)):
        np.testing.assert_array_equal(a, b)


def test_a_new_binding_set_reuses_the_probe_audit_and_code_of_the_plan(decoder, monkeypatch):
    """What made a capture cost many steps is done once per plan, not per binding set: the
    growth probe (two runs) and audit are reused and no generated code is compiled again."""
    from onnxkiln import device_graph, executor

    s = _session(decoder)
    probes = []
    probe = device_graph.DeviceGraphs._probe
    monkeypatch.setattr(device_graph.DeviceGraphs, "_probe",
                        lambda self, *a: probes.append(1) or probe(self, *a))
    compiled = []
    monkeypatch.setattr(executor, "_CODE", {})  # as in a fresh process
    monkeypatch.setattr(executor, "compile", lambda *a: compiled.append(a[1]) or compile(*a),
                        raising=False)

    def capture():
        kv, ids, mask, logits = _capture_bindings(s)
        binds = [*kv, ids, mask, logits]
        ids.write(PROMPT)
        s.run_with_device_bindings({}, binds)
        ids.set_logical_shape((1, 1))
        mask.set_logical_shape((1, 4))
        compiled.clear()
        assert s.try_capture_with_device_bindings({}, binds).captured
        got = list(compiled)
        for step in range(3):
            ids.write(np.array([[step]], np.int64))
            mask.set_logical_shape((1, 5 + step))
            assert s.replay_device_graph(binds)
        s.reset_device_graph()
        for b in binds:
            b.release()
        return got

    assert capture() and probes == [1]  # the first capture probes and compiles
    assert capture() == [] and probes == [1]  # a second binding set: neither


# --- the example's retry pattern --------------------------------------------------------------

def _example():
    path = Path(__file__).parents[1] / "examples" / "capture_decode.py"
    spec = importlib.util.spec_from_file_location("capture_decode_growing", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


@pytest.mark.parametrize("steps", [2, 17])
def test_the_example_replays_a_growing_cache_for_n_steps(steps):
    example, cfg = _example(), zoo.GptConfig()
    model = zoo.gpt_decoder_step(cfg)
    tokens, _, counts = example.growing_replayed(_session(model), cfg, 32, 7, steps)
    assert counts == {"captured": 1, "replayed": steps - 1, "retired": 0}
    assert tokens == example.greedy_eager(_session(model), cfg, 32, 7, steps, growing=True)


def test_a_retired_replay_is_not_run_twice():
    """A replay returning False already ran its step: the loop captures on the next step, so
    the appended cache grows once per step (capturing at once grew it twice)."""
    example, cfg = _example(), zoo.GptConfig()
    model = zoo.gpt_decoder_step(cfg)
    s = _session(model)
    heads, dim = cfg.heads, cfg.hidden // cfg.heads
    kv = [s.allocate_device_binding(f"past_{k}_{i}", f"present_{k}_{i}", F, (1, heads, 32, dim),
                                    (1, heads, 0, dim))
          for i in range(cfg.layers) for k in ("key", "value")]
    ids = s.allocate_device_binding("input_ids", None, I64, (1, 3), (1, 3))
    logits = s.allocate_device_output_binding("logits", F, (1, 3, cfg.vocab),
                                              (1, 3, cfg.vocab))
    ids.write(PROMPT)
    s.run_with_device_bindings({}, [*kv, ids, logits])
    first = int(logits.read()[0, -1].argmax())
    fed = []

    def write(step, token):  # step 4 feeds two tokens: a fixed binding changes length
        row = [token, token] if step == 4 else [token]
        ids.set_logical_shape((1, len(row)))
        ids.write(np.array([row], np.int64))
        fed.append(row)

    tokens, _, counts = example.replayed_loop(s, [*kv, ids, logits], write, logits, first, 10)
    assert counts == {"captured": 2, "replayed": 7, "retired": 1}
    assert kv[0].logical_shape[2] == 3 + 11  # one position per token fed, none twice
    ref = _session(model)
    past = {f"past_{k}_{i}": np.zeros((1, heads, 0, dim), np.float32)
            for i in range(cfg.layers) for k in ("key", "value")}
    names = [m.name for m in ref.outputs()]
    expect = []
    for row in [PROMPT[0].tolist(), *fed]:
        out, *present = ref.run({"input_ids": np.array([row], np.int64), **past})
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], present)}
        expect.append(int(out[0, -1].argmax()))
    assert tokens == expect[1:]


# --- an onnxruntime-genai builder graph (GroupQueryAttention) ------------------------------

@pytest.fixture(scope="module")
def gqa():
    try:
        from bench import genai_models
    except ImportError as e:  # bench/ is not installed with the package
        pytest.skip(f"bench.genai_models does not import: {e}")
    why = genai_models.available()
    if why:
        pytest.skip(why)
    return genai_models.DecoderIO(genai_models.build("llama", "fp32", hidden=64, layers=2))


def _gqa_kv(s, io):
    shape = (1, io.kv_heads, CAP, io.head_size)
    return [s.allocate_device_binding(p, q, F, shape, (1, io.kv_heads, 0, io.head_size))
            for p, q in zip(io.past, io.present)]


def _gqa_memo_loop(s, io, steps):
    kv, tokens, total, out = _gqa_kv(s, io), PROMPT, PROMPT.shape[1], []
    for _ in range(steps + 1):
        logits = s.run_with_device_bindings(io.feeds(tokens, total, {}), kv)[0]
        out.append(logits)
        tokens = np.array([[int(logits[0, -1].argmax())]], np.int64)
        total += 1
    return out, kv


def _gqa_reference(run, io, steps):
    past, tokens, total, out = io.empty_past(), PROMPT, PROMPT.shape[1], []
    for _ in range(steps + 1):
        logits, *present = run([io.logits, *io.present], io.feeds(tokens, total, past))
        past = dict(zip(io.past, present))
        out.append(logits)
        tokens = np.array([[int(logits[0, -1].argmax())]], np.int64)
        total += 1
    return out


def test_gqa_decoder_with_a_growing_mask_replays_the_memo(gqa):
    s = ok.InferenceSession.builder().providers(["cpu"]).load(str(gqa.model_path))
    logits, kv = _gqa_memo_loop(s, gqa, 31)
    assert s.decode_memo_counts() == (1, 1, 30, 0)
    assert kv[0].logical_shape[2] == 3 + 31
    plain = ok.InferenceSession.builder().providers(["cpu"]).load(str(gqa.model_path))
    for a, b in zip(logits, _gqa_reference(plain.run, gqa, 31)):
        _same_up_to_summation_order(a, b)
    import onnxruntime as ort

    ref = ort.InferenceSession(str(gqa.model_path), providers=["CPUExecutionProvider"])
    for a, b in zip(logits, _gqa_reference(ref.run, gqa, 31)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    checked = ok.InferenceSession.builder().providers(["cpu"]).option(
        "decode.verify", "1").load(str(gqa.model_path))
    for a, b in zip(_gqa_memo_loop(checked, gqa, 6)[0], logits):
        _same_up_to_summation_order(a, b)
    assert checked.decode_memo_counts() == (1, 1, 5, 0)


def test_gqa_decoder_captures_once_and_replays_every_growing_step(gqa):
    s = ok.InferenceSession.builder().providers(["cpu"]).load(str(gqa.model_path))
    kv = _gqa_kv(s, gqa)
    vocab = s.outputs()[0].shape[-1]
    ids = s.allocate_device_binding(gqa.input_ids, None, I64, (1, 3), (1, 3))
    mask = s.allocate_device_binding(gqa.attention_mask, None, I64, (1, CAP), (1, 3))
    mask.write(np.ones((1, CAP), np.int64))
    logits = s.allocate_device_output_binding(gqa.logits, F, (1, 3, vocab), (1, 3, vocab))
    binds = [*kv, ids, mask, logits]
    got, replays = _capture_then_replay(s, binds, ids, mask, logits)
    assert replays == [True] * 30
    assert kv[0].logical_shape[2] == 3 + 31
    gqa_seams = [d for d in s.capture_segmentation() if d.op_type == "GroupQueryAttention"]
    assert len(gqa_seams) == gqa.layers
    assert all(d.seam_kind is ok.SeamKind.GROWING_SHAPE for d in gqa_seams)
    for a, b in zip(got, _gqa_memo_loop(
            ok.InferenceSession.builder().providers(["cpu"]).load(str(gqa.model_path)), gqa,
            31)[0]):
        _same_up_to_summation_order(a, b)


def _same_up_to_summation_order(a, b):
    """Replays run kernels specialised for the step's shapes (a GEMM over a prepacked
    weight), a first-sight plain run the generic ones: the sums may round differently."""
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --- a torch.onnx export of a transformers decoder with past key values --------------------

GPT2_LAYERS, GPT2_HEADS, GPT2_DIM, GPT2_VOCAB = 2, 4, 16, 128


def _export_gpt2(path):
    """transformers' GPT-2 (random weights from a config) exported with its KV cache as
    inputs and outputs: Concat(past, new) presents, a [1, total] attention_mask, the Shape /
    Range arithmetic over the past that such exports carry. Traced at one new token."""
    import torch
    import transformers as tf
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=GPT2_LAYERS, n_embd=GPT2_HEADS * GPT2_DIM, n_head=GPT2_HEADS,
                        vocab_size=GPT2_VOCAB, n_positions=128)
    model = tf.GPT2LMHeadModel(cfg).eval()

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache()
            for i in range(GPT2_LAYERS):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask,
                         past_key_values=cache, use_cache=True)
            kv = out.past_key_values
            return (out.logits, *(t for layer in kv.layers for t in (layer.keys, layer.values)))

    names = [f"{t}{i}" for i in range(GPT2_LAYERS) for t in ("k", "v")]
    past = [torch.zeros(1, GPT2_HEADS, 3, GPT2_DIM) for _ in names]
    dims = {**{f"past_{n}": {2: "past"} for n in names},
            **{f"present_{n}": {2: "total"} for n in names}, "attention_mask": {1: "total"}}
    torch.onnx.export(Step(), (torch.tensor([[5]]), torch.ones(1, 4, dtype=torch.int64), *past),
                      str(path), dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask", *(f"past_{n}" for n in names)],
                      output_names=["logits", *(f"present_{n}" for n in names)],
                      dynamic_axes=dims)
    return names


@pytest.fixture(scope="module")
def gpt2_export(tmp_path_factory):
    for module in ("torch", "transformers"):
        pytest.importorskip(module, reason=f"the export needs {module}")
    path = tmp_path_factory.mktemp("gpt2") / "gpt2_past.onnx"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values
        names = _export_gpt2(path)
    return path, names


def _gpt2_loop(s, names, steps, binds=None):
    """One token a step from an empty cache, the mask a plain array as long as the cache."""
    kv = binds or [s.allocate_device_binding(f"past_{n}", f"present_{n}", F,
                                             (1, GPT2_HEADS, CAP, GPT2_DIM),
                                             (1, GPT2_HEADS, 0, GPT2_DIM)) for n in names]
    token, out = 5, []
    for step in range(steps):
        logits = s.run_with_device_bindings({"input_ids": np.array([[token]], np.int64),
                                             "attention_mask": np.ones((1, step + 1), np.int64)},
                                            kv)[0]
        out.append(logits)
        token = int(logits[0, -1].argmax())
    return out


def test_torch_export_of_gpt2_replays_the_memo_and_re_slices_its_key_transposes(gpt2_export):
    path, names = gpt2_export
    s = ok.InferenceSession.builder().providers(["cpu"]).load(str(path))
    logits = _gpt2_loop(s, names, 32)
    assert s.decode_memo_counts() == (1, 0, 31, 0)  # every step after the first replays
    assert s.decode_view_plan_counts()[1] > 0
    import onnxruntime as ort

    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    past = {f"past_{n}": np.zeros((1, GPT2_HEADS, 0, GPT2_DIM), np.float32) for n in names}
    token = 5
    for step, got in enumerate(logits):
        want, *present = ref.run(None, {"input_ids": np.array([[token]], np.int64),
                                        "attention_mask": np.ones((1, step + 1), np.int64),
                                        **past})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        past = {f"past_{n}": v for n, v in zip(names, present)}
        token = int(got[0, -1].argmax())


def test_torch_export_of_gpt2_captures_once_and_replays_every_step(gpt2_export):
    path, names = gpt2_export
    s = ok.InferenceSession.builder().providers(["cpu"]).load(str(path))
    kv = [s.allocate_device_binding(f"past_{n}", f"present_{n}", F, (1, GPT2_HEADS, CAP, GPT2_DIM),
                                    (1, GPT2_HEADS, 0, GPT2_DIM)) for n in names]
    ids = s.allocate_device_binding("input_ids", None, I64, (1, 1), (1, 1))
    mask = s.allocate_device_binding("attention_mask", None, I64, (1, CAP), (1, 1))
    mask.write(np.ones((1, CAP), np.int64))
    logits = s.allocate_device_output_binding("logits", F, (1, 1, GPT2_VOCAB),
                                              (1, 1, GPT2_VOCAB))
    binds, token, got, replays = [*kv, ids, mask, logits], 5, [], []
    for step in range(32):
        ids.write(np.array([[token]], np.int64))
        mask.set_logical_shape((1, step + 1))
        if step == 0:
            assert s.try_capture_with_device_bindings({}, binds).captured
        else:
            replays.append(s.replay_device_graph(binds))
        got.append(logits.read())
        token = int(got[-1][0, -1].argmax())
    assert replays == [True] * 31
    assert kv[0].logical_shape[2] == 32
    memo = ok.InferenceSession.builder().providers(["cpu"]).load(str(path))
    for a, b in zip(got, _gpt2_loop(memo, names, 32)):
        np.testing.assert_array_equal(a, b)


def test_the_growing_loop_benchmark_runs_and_its_modes_agree(gqa, capsys):
    from bench import decode_growing

    assert decode_growing.main(["--hidden", "64", "--steps", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "replayed 3 of 5 runs" in out and "3 of 3 replays valid, 0 retired" in out


def test_a_plain_mask_frozen_into_a_growing_capture_is_refused(gqa):
    """Given as a plain input, the mask would be frozen: every replay would attend over the
    same length and write the same cache position again (GQA takes the length from it)."""
    s = ok.InferenceSession.builder().providers(["cpu"]).load(str(gqa.model_path))
    kv = _gqa_kv(s, gqa)
    vocab = s.outputs()[0].shape[-1]
    ids = s.allocate_device_binding(gqa.input_ids, None, I64, (1, 3), (1, 3))
    logits = s.allocate_device_output_binding(gqa.logits, F, (1, 3, vocab), (1, 3, vocab))
    binds = [*kv, ids, logits]
    ids.write(PROMPT)
    s.run_with_device_bindings({gqa.attention_mask: np.ones((1, 3), np.int64)}, binds)
    ids.set_logical_shape((1, 1))
    mask = {gqa.attention_mask: np.ones((1, 4), np.int64)}
    with pytest.raises(ok.CaptureError, match=r"'attention_mask' \(1, 4\).*allocate_device"):
        s.try_capture_with_device_bindings(mask, binds)
    assert s.captured_graph_segment_count() == 0
    assert kv[0].logical_shape[2] == 3  # nothing ran


def test_a_replay_whose_append_moved_otherwise_reruns_on_the_ordinary_path(decoder, monkeypatch):
    """When an append added another count than the re-sliced views were cut for, the step is
    run again from the lengths before it (its writes land where they did): same results."""
    from onnxkiln import decode

    s = _session(decoder, "basic")
    calls = []
    held = decode.appends_held

    def once_not(cuts, bindings, before):
        calls.append(1)
        return held(cuts, bindings, before) and len(calls) != 3

    monkeypatch.setattr(decode, "appends_held", once_not)
    logits, kv = _memo_loop(s, 8)
    assert len(calls) >= 3  # the re-sliced replays checked their appends
    assert kv[0].logical_shape == (1, H, 3 + 8, D)
    for a, b in zip(logits, _reference(_session(decoder, "basic").run, 8)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("ids_capacity", "expect"), [
    (1, {"captured": 1, "replayed": 9, "retired": 0}),
    # a (1, 1) token binding below its capacity looks like the mask at an empty cache: both
    # are dropped (extending both would append two tokens), the mask's first move retires
    # the graph, and the capture of the next step tells them apart
    (3, {"captured": 2, "replayed": 7, "retired": 1})])
def test_a_capture_at_an_empty_cache_tells_the_mask_from_the_token(decoder, ids_capacity,
                                                                  expect):
    s = _session(decoder)
    kv = _kv(s)
    ids = s.allocate_device_binding("input_ids", None, I64, (1, ids_capacity), (1, 1))
    mask = s.allocate_device_binding("attention_mask", None, I64, (1, CAP), (1, 1))
    mask.write(np.ones((1, CAP), np.int64))
    logits = s.allocate_device_output_binding("logits", F, (1, 1, V), (1, 1, V))

    def write(step, token):
        ids.write(np.array([[token]], np.int64))
        mask.set_logical_shape((1, step + 1))

    tokens, _, counts = _example().replayed_loop(s, [*kv, ids, mask, logits], write, logits,
                                                 3, 10)
    assert counts == expect
    assert kv[0].logical_shape[2] == 10
    ref, past, token = _session(decoder), {}, 3
    past = {f"past_{t}": np.zeros((1, H, 0, D), np.float32) for t in ("key", "value")}
    for step, got in enumerate(tokens):
        out, pk, pv = ref.run({"input_ids": np.array([[token]], np.int64),
                               "attention_mask": np.ones((1, step + 1), np.int64), **past})
        past = {"past_key": pk, "past_value": pv}
        token = int(out[0, -1].argmax())
        assert got == token
