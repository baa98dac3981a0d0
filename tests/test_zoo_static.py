"""The fixed-capacity GPT decoder step (zoo.gpt_static_decoder_step, the model device-graph
capture is for): valid, fully static ONNX; the same numbers as the growing-KV decoder step;
onnxkiln and the torch reference of bench/capture.py agree with onnxruntime on it; and the
capture benchmark's quick mode runs with identical tokens in every mode."""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxkiln as ok
from onnxkiln import zoo

ROOT = Path(__file__).resolve().parent.parent
CFG = zoo.GptConfig()
CAPACITY = 16
STEPS = 8
HEADS, DIM = CFG.heads, CFG.hidden // CFG.heads


@cache
def _static() -> onnx.ModelProto:
    return zoo.gpt_static_decoder_step(CFG, capacity=CAPACITY, seed=0)


@cache
def _growing() -> onnx.ModelProto:
    return zoo.gpt_decoder_step(CFG, seed=0)


def _ort(model: onnx.ModelProto):
    ort = pytest.importorskip("onnxruntime", reason="the reference runtime")
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _kv(past: int) -> dict[str, np.ndarray]:
    return {f"past_{kv}_{i}": np.zeros((1, HEADS, past, DIM), np.float32)
            for i in range(CFG.layers) for kv in ("key", "value")}


def _next_past(names: list[str], outputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {n.replace("present", "past"): v for n, v in zip(names[1:], outputs[1:])}


@cache
def _ort_static_run() -> tuple[list[int], list[np.ndarray], list[dict[str, np.ndarray]]]:
    """Greedy tokens fed at each step, the logits, and the full feeds, by onnxruntime."""
    sess = _ort(_static())
    names = [o.name for o in sess.get_outputs()]
    past, token = _kv(CAPACITY), 3
    tokens, logits, feeds = [], [], []
    for step in range(STEPS):
        feed = {**zoo.static_decode_feeds(step, token, CAPACITY), **past}
        out = sess.run(None, feed)
        tokens.append(token)
        logits.append(out[0])
        feeds.append(feed)
        past = _next_past(names, out)
        token = int(out[0][0, -1].argmax())
    return tokens, logits, feeds


def test_static_model_is_valid_and_fully_static():
    model = _static()
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    for vi in [*model.graph.input, *model.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), vi.name
    ins = [(vi.name, [d.dim_value for d in vi.type.tensor_type.shape.dim])
           for vi in model.graph.input]
    kv = [1, HEADS, CAPACITY, DIM]
    assert ins[:3] == [("input_ids", [1, 1]), ("position", [1]),
                       ("attention_mask", [1, CAPACITY])]
    assert ins[3:] == [(f"past_{k}_{i}", kv) for i in range(CFG.layers) for k in ("key", "value")]
    assert [o.name for o in model.graph.output] == [o.name for o in _growing().graph.output]
    assert sum(n.op_type == "ScatterND" for n in model.graph.node) == 2 * CFG.layers


def test_same_seed_same_weights_as_growing_model():
    static = {t.name: numpy_helper.to_array(t) for t in _static().graph.initializer}
    growing = {t.name: numpy_helper.to_array(t) for t in _growing().graph.initializer}
    assert static.keys() == growing.keys()
    for name, value in growing.items():
        np.testing.assert_array_equal(static[name], value, err_msg=name)


def test_static_decode_feeds():
    feeds = zoo.static_decode_feeds(3, 42, 8)
    assert feeds["input_ids"].tolist() == [[42]] and feeds["input_ids"].dtype == np.int64
    assert feeds["position"].tolist() == [3] and feeds["position"].dtype == np.int64
    mask = feeds["attention_mask"]
    assert mask.shape == (1, 8) and mask.dtype == np.float32
    assert (mask[0, :4] == 0).all() and (mask[0, 4:] == np.finfo(np.float32).min).all()
    with pytest.raises(ValueError, match="capacity"):
        zoo.static_decode_feeds(8, 1, 8)


def test_static_matches_growing_kv_model_over_greedy_steps():
    tokens, static_logits, _ = _ort_static_run()
    sess = _ort(_growing())
    names = [o.name for o in sess.get_outputs()]
    past = _kv(0)
    for step, token in enumerate(tokens):
        out = sess.run(None, {"input_ids": np.array([[token]], np.int64), **past})
        np.testing.assert_allclose(static_logits[step], out[0], rtol=1e-4, atol=1e-4,
                                   err_msg=f"step {step}")
        past = _next_past(names, out)
    assert len(set(tokens)) > 1  # a real decode, not one token repeated


def test_static_present_holds_growing_cache_prefix():
    _, _, feeds = _ort_static_run()
    sess = _ort(_growing())
    past = _kv(0)
    names = [o.name for o in sess.get_outputs()]
    for feed in feeds:
        out = sess.run(None, {"input_ids": feed["input_ids"], **past})
        past = _next_past(names, out)
    last = _ort(_static()).run(None, feeds[-1])
    for i, name in enumerate(names[1:], start=1):
        np.testing.assert_allclose(last[i][:, :, :STEPS], past[name.replace("present", "past")],
                                   rtol=1e-5, atol=1e-5, err_msg=name)
        assert not last[i][:, :, STEPS:].any(), name  # slots after the position untouched


def test_onnxkiln_matches_onnxruntime_on_static_model():
    _, logits, feeds = _ort_static_run()
    session = ok.InferenceSession.from_graph(_static())
    ort_sess = _ort(_static())
    for step, feed in enumerate(feeds):
        got = session.run(feed)
        np.testing.assert_allclose(got[0], logits[step], rtol=1e-4, atol=1e-5,
                                   err_msg=f"step {step}")
        want = ort_sess.run(None, feed)
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _bench():
    sys.path.insert(0, str(ROOT))
    try:
        from bench import capture
    finally:
        sys.path.remove(str(ROOT))
    return capture


def test_torch_reference_matches_onnxruntime():
    pytest.importorskip("torch", reason="the torch reference forward")
    capture = _bench()
    _, logits, feeds = _ort_static_run()
    ref = capture.TorchStaticGpt(_static(), CFG, CAPACITY, "cpu")
    for step, feed in enumerate(feeds):
        got = ref.step(feed["input_ids"], feed["position"], feed["attention_mask"]).numpy()
        np.testing.assert_allclose(got, logits[step], rtol=1e-4, atol=1e-5,
                                   err_msg=f"step {step}")
    ref.reset()
    assert not any(t.any() for t in ref.keys)


def test_capture_bench_small_mode(tmp_path, capsys):
    pytest.importorskip("torch", reason="the torch reference rows")
    capture = _bench()
    out = tmp_path / "capture.json"
    rc = capture.main(["--small", "--json", str(out)])
    printed = capsys.readouterr().out
    summary = json.loads(out.read_text())
    assert rc == 0, printed
    assert summary["tokens_match"] is True, printed
    modes = summary["modes"]
    for mode in ("eager", "memo", "torch"):
        assert "error" not in modes[mode], printed
    if hasattr(ok.InferenceSession, "try_capture_with_device_bindings"):
        assert "error" not in modes["replay"], printed
        assert modes["replay"]["capture_error"] == 0
        assert modes["replay"]["segments"] >= 1
    else:
        assert "does not exist yet" in modes["replay"]["error"]
    ran = {m: r for m, r in modes.items() if "error" not in r}
    for grow in (False, True):  # the growing-KV modes are compared among themselves
        streams = {tuple(r["tokens"]) for m, r in ran.items() if m.startswith("grow-") == grow}
        assert len(streams) == 1 and len(next(iter(streams))) == 3
    for r in ran.values():
        assert r["ms"] > 0 and r["first_ms"] > 0
    assert "tokens match" in printed
