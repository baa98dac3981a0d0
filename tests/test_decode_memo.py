"""The decode memo and view plan of run_with_device_bindings."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxkiln as ok
from onnxkiln import decode, zoo
from onnxkiln.testing import make_model, ort_session, tensor_info

CFG = zoo.GptConfig(layers=2, hidden=32, heads=4)
HEADS, DIM = CFG.heads, CFG.hidden // CFG.heads
W = 4  # the toy model's width
PROMPT = np.array([[3, 14, 15, 92, 65]], np.int64)


def _providers():
    params = [pytest.param("cpu", id="cpu")]
    try:
        import torch  # noqa: F401
    except ImportError:
        params.append(pytest.param("torch", id="torch-cpu", marks=pytest.mark.skip(
            reason="torch is not installed: the CUDA provider cannot be tested")))
    else:
        params.append(pytest.param("torch", id="torch-cpu"))
    return params


def _session(model, where="cpu", **options):
    b = ok.InferenceSession.builder()
    if where == "cpu":
        b = b.providers(["cpu"])
    else:
        b = b.providers(["cuda", "cpu"]).option("testing.cuda_on_torch_cpu", "1")
    for key, value in options.items():
        b = b.option(key.replace("_", "."), value)
    return b.from_graph(model)


@pytest.fixture(scope="module")
def gpt():
    return zoo.gpt_decoder_step(layers=2, hidden=32, heads=4)


def _kv(s, capacity=32):
    return [s.allocate_device_binding(f"past_{kv}_{i}", f"present_{kv}_{i}", ok.DataType.FLOAT,
                                      (1, HEADS, capacity, DIM), (1, HEADS, 0, DIM))
            for i in range(CFG.layers) for kv in ("key", "value")]


def _gpt_loop(s, steps=10, binds=None):
    """Prefill PROMPT, then `steps` steps of one token each; the logits of every run."""
    binds = binds or _kv(s)
    ids, logits = PROMPT, []
    for _ in range(steps + 1):
        out = s.run_with_device_bindings({"input_ids": ids}, binds)
        logits.append(out[0])
        ids = np.array([[int(out[0][0, -1].argmax())]], np.int64)
    return logits, binds


def _gpt_plain(s, steps=10):
    past = {f"past_{kv}_{i}": np.zeros((1, HEADS, 0, DIM), np.float32)
            for i in range(CFG.layers) for kv in ("key", "value")}
    names = [m.name for m in s.outputs()]
    ids, logits = PROMPT, []
    for _ in range(steps + 1):
        out = s.run({"input_ids": ids, **past})
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], out[1:])}
        logits.append(out[0])
        ids = np.array([[int(out[0][0, -1].argmax())]], np.int64)
    return logits


def test_gpt_decode_loop_replays_and_matches_memo_off_and_plain_runs(gpt):
    s = _session(gpt)
    logits, binds = _gpt_loop(s)
    assert s.decode_memo_counts() == (1, 1, 9, 0)  # prefill primes, step 1 rebuilds (seq 1)
    assert s.cache_stats().entries == 2  # one per input_ids shape, not one per past length
    off = _session(gpt, decode_memo="0")
    off_logits, off_binds = _gpt_loop(off)
    assert off.decode_memo_counts() == (0, 0, 0, 11)
    assert off.decode_view_plan_counts() == (0, 0)
    assert off.cache_stats().entries == 11
    for a, b in zip(logits, off_logits):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(binds, off_binds):
        assert a.logical_shape == b.logical_shape == (1, HEADS, 15, DIM)
        np.testing.assert_array_equal(a.read(), b.read())
    plain = _gpt_plain(_session(gpt))
    for a, b in zip(logits, plain):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _toy_model():
    """A decoder step whose bound `position` (stable (1, 1) while decoding) and `scale` (never
    changes) feed view nodes: Reshape+Unsqueeze of position and Flatten of scale are elided
    on replays; Cast(position) copies, so it must run every step; Unsqueeze(mask) reads a
    growing binding: re-sliced from the mask's buffer each replay instead of dispatched."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Reshape", ["position", "flat"], ["pos_flat"]),
        helper.make_node("Unsqueeze", ["pos_flat", "zero"], ["pos_u"]),
        helper.make_node("Gather", ["pos_table", "pos_u"], ["pe"]),
        helper.make_node("Gather", ["tok_table", "input_ids"], ["emb"]),
        helper.make_node("Add", ["emb", "pe"], ["x"]),
        helper.make_node("Concat", ["past_k", "x"], ["present_k"], axis=1),
        helper.make_node("Unsqueeze", ["mask", "two"], ["mask_u"]),
        helper.make_node("Mul", ["present_k", "mask_u"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "one"], ["score"], keepdims=0),
        helper.make_node("Flatten", ["scale"], ["scale_2d"], axis=0),
        helper.make_node("Cast", ["position"], ["pos_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["pos_f"], ["pos_sum"], keepdims=1),
        helper.make_node("Mul", ["score", "scale_2d"], ["s2"]),
        helper.make_node("Add", ["s2", "pos_sum"], ["y"]),
    ]
    inits = {"flat": np.array([-1], np.int64), "zero": np.array([0], np.int64),
             "two": np.array([2], np.int64), "one": np.array([1], np.int64),
             "pos_table": rng.standard_normal((32, W)).astype(np.float32),
             "tok_table": rng.standard_normal((50, W)).astype(np.float32)}
    inputs = [tensor_info("input_ids", np.int64, [1, "seq"]),
              tensor_info("position", np.int64, [1, "seq"]),
              tensor_info("past_k", np.float32, [1, "past", W]),
              tensor_info("mask", np.float32, [1, "total"]),
              tensor_info("scale", np.float32, [W])]
    outputs = [tensor_info("y", np.float32, [1, W]),
               tensor_info("present_k", np.float32, [1, "total", W])]
    return make_model(nodes, inputs, outputs, inits)


SCALE = np.arange(1, W + 1, dtype=np.float32)


class Toy:
    """The toy model's bindings and its decode loop: prefill 5 tokens, then 1 per step."""

    def __init__(self, s):
        self.s = s
        self.pos = s.allocate_device_binding("position", None, ok.DataType.INT64, (1, 16), (1, 5))
        self.kv = s.allocate_device_binding("past_k", "present_k", ok.DataType.FLOAT,
                                            (1, 32, W), (1, 0, W))
        self.mask = s.allocate_device_binding("mask", None, ok.DataType.FLOAT, (1, 32), (1, 5))
        self.scale = s.allocate_device_binding("scale", None, ok.DataType.FLOAT, (W,), (W,))
        self.scale.write(SCALE)
        self.mask.write(np.ones((1, 32), np.float32))
        self.pos.write(np.arange(5).reshape(1, 5))
        self.binds = [self.pos, self.kv, self.mask, self.scale]
        self.t = 0

    def prefill(self):
        return self.s.run_with_device_bindings({"input_ids": np.arange(5).reshape(1, 5)},
                                               self.binds)[0]

    def step(self, ids=None):
        self.pos.set_logical_shape((1, 1))
        self.pos.write(np.array([[5 + self.t]]))
        self.mask.set_logical_shape((1, 6 + self.t))
        ids = np.array([[self.t % 50]]) if ids is None else ids
        self.t += 1
        return self.s.run_with_device_bindings({"input_ids": ids}, self.binds)[0]

    def loop(self, steps=10):
        return [self.prefill(), *(self.step() for _ in range(steps))]


def _toy_plain(s, steps=10, doubled_from=None):
    past, out = np.zeros((1, 0, W), np.float32), []
    ids, pos = np.arange(5).reshape(1, 5), np.arange(5).reshape(1, 5)
    for t in range(steps + 1):
        mask = np.ones((1, past.shape[1] + ids.shape[1]), np.float32)
        scale = SCALE * 2 if doubled_from is not None and t >= doubled_from else SCALE
        y, past = s.run({"input_ids": ids, "position": pos, "past_k": past, "mask": mask,
                         "scale": scale})
        out.append(y)
        ids, pos = np.array([[t % 50]]), np.array([[5 + t]])
    return out


# views reused per replay: position and scale; elided per replay after the recording one:
# Reshape, Unsqueeze, Flatten, and Unsqueeze(mask) re-sliced from the growing mask buffer,
# plus on the torch provider the uploads of position, scale, mask and past_k (no-ops for
# tensors already on the device; the last two re-sliced)
TOY_VIEW_COUNTS = {"cpu": (9 * 2 + 8 * 4, 8 * 4), "torch": (9 * 2 + 8 * 8, 8 * 8)}


@pytest.mark.parametrize("where", _providers())
def test_view_plan_counts_and_outputs_on_the_toy_decoder(where):
    model = _toy_model()
    s = _session(model, where)
    ys = Toy(s).loop()
    assert s.decode_memo_counts() == (1, 1, 9, 0)
    assert s.decode_view_plan_counts() == TOY_VIEW_COUNTS[where]
    assert s.cache_stats().entries == 2
    off = _session(model, where, decode_memo="0")
    for a, b in zip(ys, Toy(off).loop()):
        np.testing.assert_array_equal(a, b)
    plain = _toy_plain(_session(model, where))
    for a, b in zip(ys, plain):
        np.testing.assert_array_equal(a, b)


def test_changing_a_stable_binding_rebuilds_the_view_plan():
    s = _session(_toy_model())
    toy = Toy(s)
    toy.loop(4)  # replays 3, 4 elide 4 each; views reused 2 per replay
    assert s.decode_view_plan_counts() == (3 * 2 + 2 * 4, 2 * 4)
    toy.scale.set_logical_shape((W,))  # same shape: still stable
    toy.step()
    assert s.decode_view_plan_counts() == (4 * 2 + 3 * 4, 3 * 4)
    new_scale = s.allocate_device_binding("scale", None, ok.DataType.FLOAT, (W,), (W,))
    new_scale.write(SCALE * 2)
    toy.binds[3] = new_scale  # another binding object: a new key
    y = toy.step()
    assert s.decode_memo_counts() == (1, 2, 4, 0)
    toy.step()  # the first replay of the new entry records its view plan
    y3 = toy.step()
    assert s.decode_memo_counts() == (1, 2, 6, 0)
    assert s.decode_view_plan_counts() == (6 * 2 + 4 * 4, 4 * 4)
    expected = _toy_plain(_session(_toy_model()), steps=8, doubled_from=6)
    np.testing.assert_array_equal(y, expected[6])  # the new binding's values were used
    np.testing.assert_array_equal(y3, expected[8])


def test_verify_passes_and_leaves_the_ordinary_state(gpt):
    s = _session(gpt, decode_verify="1")
    logits, binds = _gpt_loop(s)
    assert s.decode_memo_counts() == (1, 1, 9, 0)
    off_logits, off_binds = _gpt_loop(_session(gpt, decode_memo="0"))
    for a, b in zip(logits, off_logits):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(binds, off_binds):
        assert a.logical_shape == b.logical_shape
        np.testing.assert_array_equal(a.read(), b.read())


@pytest.mark.parametrize("where", _providers())
def test_verify_passes_with_the_view_plan(where):
    toy = _session(_toy_model(), where, decode_verify="1")
    ys = Toy(toy).loop()
    assert toy.decode_memo_counts() == (1, 1, 9, 0)
    assert toy.decode_view_plan_counts() == TOY_VIEW_COUNTS[where]
    for a, b in zip(ys, _toy_plain(_session(_toy_model(), where))):
        np.testing.assert_array_equal(a, b)


def test_verify_catches_a_corrupt_view_plan(monkeypatch):
    # pretend every view step returns a view: Cast(position) copies, so eliding it keeps
    # the position of the recording step
    monkeypatch.setattr(decode, "_is_view_of", lambda out, base, step: True)
    s = _session(_toy_model(), decode_verify="1")
    toy = Toy(s)
    toy.prefill()
    toy.step()
    toy.step()  # the first replay records (nothing elided yet: it ran every step)
    with pytest.raises(ok.CaptureError, match=r"decode step 3 .* output 'y'"):
        toy.step()
    unverified = _session(_toy_model())
    toy = Toy(unverified)
    good = _toy_plain(_session(_toy_model()), steps=3)
    ys = [toy.prefill(), toy.step(), toy.step(), toy.step()]
    assert not np.array_equal(ys[3], good[3])  # without verify the corruption goes unseen


def test_plain_runs_and_unbound_runs_are_ineligible(gpt):
    s = _session(gpt)
    feeds = {"input_ids": PROMPT, **{f"past_{kv}_{i}": np.zeros((1, HEADS, 0, DIM), np.float32)
                                     for i in range(CFG.layers) for kv in ("key", "value")}}
    s.run(feeds)
    s.run_outputs(feeds)
    s.run_with_device_bindings(feeds, [])
    assert s.decode_memo_counts() == (0, 0, 0, 3)
    _gpt_loop(s, steps=2)
    assert s.decode_memo_counts() == (1, 1, 1, 3)
    s._decode_memo.note_ineligible()  # what a captured replay reports
    assert s.decode_memo_counts() == (1, 1, 1, 4)


def test_changed_plain_shape_rebuilds_and_replays_again(gpt):
    s = _session(gpt)
    binds = _kv(s)
    for ids in ([[1, 2, 3]], [[4]], [[5]], [[6, 7]], [[8]], [[9]], [[10]]):
        s.run_with_device_bindings({"input_ids": np.array(ids, np.int64)}, binds)
    # primed (1, 3); rebuilt at (1, 1), (1, 2), (1, 1); replayed the rest
    assert s.decode_memo_counts() == (1, 3, 3, 0)
    assert binds[0].logical_shape == (1, HEADS, 10, DIM)
    plain = _gpt_plain_ids(_session(gpt), [[[1, 2, 3]], [[4]], [[5]], [[6, 7]], [[8]], [[9]],
                                           [[10]]])
    out = s.run_with_device_bindings({"input_ids": np.array([[11]], np.int64)}, binds)[0]
    np.testing.assert_allclose(out, plain, rtol=1e-6, atol=1e-6)


def _gpt_plain_ids(s, chunks):
    past = {f"past_{kv}_{i}": np.zeros((1, HEADS, 0, DIM), np.float32)
            for i in range(CFG.layers) for kv in ("key", "value")}
    names = [m.name for m in s.outputs()]
    for ids in [*chunks, [[11]]]:
        out = s.run({"input_ids": np.array(ids, np.int64), **past})
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], out[1:])}
    return out[0]


def test_released_bindings_and_new_ones(gpt):
    s = _session(gpt)
    _, binds = _gpt_loop(s, steps=3)
    for b in binds:
        b.release()
    with pytest.raises(ok.DeviceBindingError, match="released"):
        s.run_with_device_bindings({"input_ids": np.array([[1]], np.int64)}, binds)
    logits, _ = _gpt_loop(s, steps=3)
    # the new bindings rebuild at the prefill and at the first step (seq 1), then replay
    assert s.decode_memo_counts() == (1, 3, 4, 0)
    for a, b in zip(logits, _gpt_plain(_session(gpt), steps=3)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    s._decode_memo.forget(binds[0])  # not in the entry any more: nothing happens
    assert s.decode_memo_counts() == (1, 3, 4, 0)


def _errors(s, binds, ids_list):
    """Prime and replay, then run each bad input; the error type and text of each."""
    s.run_with_device_bindings({"input_ids": np.array([[1, 2]], np.int64)}, binds)
    for _ in range(3):
        s.run_with_device_bindings({"input_ids": np.array([[1]], np.int64)}, binds)
    found = []
    for feeds in ids_list:
        with pytest.raises(ok.SessionError) as e:
            s.run_with_device_bindings(feeds, binds)
        found.append((type(e.value), str(e.value)))
    return found


BAD = [
    {"input_ids": np.array([[1]], np.int32)},  # dtype
    {"input_ids": np.array([1], np.int64)},  # rank
    {"input_ids": np.array([[1]], np.int64), "input_idz": np.array([[1]], np.int64)},
    {"input_ids": "not an array"},
    {},  # missing
]


def test_bad_plain_input_on_a_replayed_step_raises_as_without_the_memo(gpt):
    s = _session(gpt)
    got = _errors(s, _kv(s), BAD)
    assert s.decode_memo_counts() == (1, 1, 2, 0)
    want = _errors(off := _session(gpt, decode_memo="0"), _kv(off), BAD)
    assert got == want
    assert [t for t, _ in got] == [ok.InvalidInputError, ok.ShapeError, ok.InputNotFoundError,
                                   ok.InvalidInputError, ok.InputNotFoundError]
    assert "cast it with x.astype(np.int64)" in got[0][1]
    assert "did you mean 'input_ids'" in got[2][1]


def _seq_differs(s):
    """After a few replays: position (bound) 2 long, input_ids (plain) 1 long, though both
    declare 'seq'; the mask 10 long, as the concatenated keys will be."""
    toy = Toy(s)
    toy.loop(3)
    past = toy.kv.read()
    toy.pos.set_logical_shape((1, 2))
    toy.pos.write(np.array([[8, 9]]))
    toy.mask.set_logical_shape((1, 10))
    feeds = {"input_ids": np.array([[1]]), "position": toy.pos.read(), "past_k": past,
             "mask": toy.mask.read(), "scale": SCALE}
    return s.run_with_device_bindings({"input_ids": np.array([[1]])}, toy.binds)[0], feeds


def test_equal_named_dims_that_differ_replay_as_onnxruntime_runs_them():
    s = _session(_toy_model())
    y, feeds = _seq_differs(s)
    assert s.decode_memo_counts() == (1, 1, 3, 0)  # no refusal, no rebuild
    np.testing.assert_allclose(y, ort_session(_toy_model()).run(["y"], feeds)[0], rtol=1e-6)
    np.testing.assert_array_equal(y, _seq_differs(_session(_toy_model(), decode_memo="0"))[0])


def test_a_real_conflict_of_bound_dims_fails_in_the_kernel_as_without_the_memo():
    def conflict(s):
        toy = Toy(s)
        toy.loop(3)
        toy.pos.set_logical_shape((1, 2))  # the keys grow by 2, the mask by 1
        with pytest.raises(ok.KernelError) as e:
            s.run_with_device_bindings({"input_ids": np.array([[1]])}, toy.binds)
        return str(e.value)

    text = conflict(_session(_toy_model()))
    assert "Mul" in text and "broadcast" in text
    assert text == conflict(_session(_toy_model(), decode_memo="0"))


def test_bound_static_dims_are_still_checked_on_replays():
    s = _session(_toy_model())
    toy = Toy(s)
    toy.loop(3)
    kv = s.allocate_device_binding("scale", None, ok.DataType.FLOAT, (W + 1,), (W + 1,))
    toy.binds[3] = kv
    with pytest.raises(ok.ShapeError, match="input 'scale' expects dim 4 at axis 0"):
        s.run_with_device_bindings({"input_ids": np.array([[1]])}, toy.binds)
    toy.binds[3] = toy.scale
    toy.scale.set_logical_shape((W - 1,))
    with pytest.raises(ok.ShapeError, match="input 'scale' expects dim 4 at axis 0"):
        s.run_with_device_bindings({"input_ids": np.array([[1]])}, toy.binds)


def test_tracing_replayed_steps_has_no_spans_for_elided_steps():
    s = _session(_toy_model())
    ctx = ok.TraceContext.in_memory()
    s.set_trace_context(ctx)
    ys = Toy(s).loop()
    assert s.decode_view_plan_counts() == TOY_VIEW_COUNTS["cpu"]
    ops = [sp.attributes.get("op_type") for sp in ctx.spans]
    assert ops.count("Reshape") == ops.count("Flatten") == 3  # prime, rebuild, recording
    assert ops.count("Cast") == ops.count("Concat") == 11
    assert sum(sp.name == "model_run" for sp in ctx.spans) == 11
    for a, b in zip(ys, _toy_plain(_session(_toy_model()))):
        np.testing.assert_array_equal(a, b)


def test_decode_memo_option_values():
    with pytest.raises(ok.InvalidOptionError, match="decode.memo"):
        ok.InferenceSession.builder().option("decode.memo", "2")
    assert ok.InferenceSession.builder().option("decode.memo", "0") is not None


def test_a_view_whose_shape_input_is_bound_is_never_elided():
    # the shape binding keeps its logical shape but its values change: Reshape must run
    m = make_model([helper.make_node("Reshape", ["data", "shape"], ["r"]),
                    helper.make_node("Identity", ["r"], ["y"])],
                   [tensor_info("data", np.float32, [6]), tensor_info("shape", np.int64, [2])],
                   [tensor_info("y", np.float32, ["a", "b"])])
    s = _session(m)
    data = s.allocate_device_binding("data", None, ok.DataType.FLOAT, (6,), (6,))
    shape = s.allocate_device_binding("shape", None, ok.DataType.INT64, (2,), (2,))
    data.write(np.arange(6, dtype=np.float32))
    for step in range(6):
        shape.write(np.array([2, 3] if step % 2 else [3, 2]))
        y, = s.run_with_device_bindings({}, [data, shape])
        np.testing.assert_array_equal(y, np.arange(6).reshape((2, 3) if step % 2 else (3, 2)))
    assert s.decode_memo_counts() == (1, 0, 5, 0)
    assert s.decode_view_plan_counts() == (5 * 2, 0)


def _weight_through_a_view():
    """y = MatMul(x, Reshape(w, [4, 3])) and z = MatMul(y, Transpose(kv)) over a growing kv:
    w a bound weight whose contents change (its Reshape is an elided view: a plan constant
    that is still live), kv a growing binding."""
    nodes = [
        helper.make_node("Reshape", ["w", "shape"], ["wm"]),
        helper.make_node("MatMul", ["x", "wm"], ["y"]),
        helper.make_node("Transpose", ["kv"], ["kvt"], perm=[1, 0]),
        helper.make_node("MatMul", ["y", "kvt"], ["z"]),
        helper.make_node("Concat", ["kv", "y"], ["kv_out"], axis=0),
    ]
    return make_model(
        nodes,
        [tensor_info("x", TensorProto.FLOAT, [1, 4]), tensor_info("w", TensorProto.FLOAT, [12]),
         tensor_info("kv", TensorProto.FLOAT, ["n", 3])],
        [tensor_info("z", TensorProto.FLOAT, [1, "m"]),
         tensor_info("kv_out", TensorProto.FLOAT, ["m", 3])],
        {"shape": np.array([4, 3], np.int64)}, opset=17)


def test_replays_specialise_their_plan_and_never_bake_a_live_binding_in():
    s = _session(_weight_through_a_view())
    w = s.allocate_device_binding("w", None, ok.DataType.FLOAT, (12,), (12,))
    kv = s.allocate_device_binding("kv", "kv_out", ok.DataType.FLOAT, (16, 3), (1, 3))
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((1, 3)).astype(np.float32)
    kv.write(cache)
    for _ in range(8):
        weight = rng.standard_normal(12).astype(np.float32)
        w.write(weight)  # the same buffer, new contents, every step
        x = rng.standard_normal((1, 4)).astype(np.float32)
        z, _ = s.run_with_device_bindings({"x": x}, [w, kv])
        y = x @ weight.reshape(4, 3)
        np.testing.assert_allclose(z, y @ cache.T, rtol=1e-5, atol=1e-6)
        cache = np.concatenate([cache, y])
        np.testing.assert_allclose(kv.read(), cache, rtol=1e-5, atol=1e-6)
    assert s.decode_memo_counts() == (1, 0, 7, 0)
    plan = s._decode_memo._entry.view_plan
    assert plan.specialised and plan.live  # the weight's view is a live constant
    generic = {st.op_type: st.kernel for st in s._decode_memo._entry.compiled.plan.steps}
    special = {st.op_type: st.kernel for st in plan.compiled.plan.steps}
    # specialised for its shapes, yet not a product over a baked-in weight
    assert special["MatMul"] is not generic["MatMul"]
    assert "_specialize_matmul" not in special["MatMul"].__qualname__


def test_specialize_off_keeps_the_generic_replay_plan():
    s = _session(_weight_through_a_view(), specialize="0")
    w = s.allocate_device_binding("w", None, ok.DataType.FLOAT, (12,), (12,))
    kv = s.allocate_device_binding("kv", "kv_out", ok.DataType.FLOAT, (16, 3), (1, 3))
    kv.write(np.ones((1, 3), np.float32))
    w.write(np.arange(12, dtype=np.float32))
    for _ in range(4):
        s.run_with_device_bindings({"x": np.ones((1, 4), np.float32)}, [w, kv])
    assert not s._decode_memo._entry.view_plan.specialised


def test_bindings_that_passed_the_checks_are_checked_again_when_the_inputs_change(gpt):
    s = _session(gpt)
    _, binds = _gpt_loop(s, steps=2)  # these bindings and names passed the checks
    past = np.zeros((1, HEADS, 1, DIM), np.float32)
    with pytest.raises(ok.DeviceBindingError, match="both given in inputs and bound"):
        s.run_with_device_bindings({"input_ids": np.array([[1]], np.int64),
                                    "past_key_0": past}, binds)
    with pytest.raises(ok.DeviceBindingError, match="bound twice"):
        s.run_with_device_bindings({"input_ids": np.array([[1]], np.int64)},
                                   [*binds, binds[0]])
    other = _session(gpt)
    with pytest.raises(ok.DeviceBindingError, match="another session"):
        other.run_with_device_bindings({"input_ids": np.array([[1]], np.int64)}, binds)
