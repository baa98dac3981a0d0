"""Device-graph capture and replay on the CPU: the audit, segmentation, replay
against eager runs, branch flips, binding signatures, violation bits, tracing."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper

import onnxkiln as ok
from onnxkiln import zoo

F, I64 = ok.DataType.FLOAT, ok.DataType.INT64
TORCH_CPU = {"providers": ["cuda", "cpu"], "testing.cuda_on_torch_cpu": "1"}


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(v, k) for k, v in dict(inits).items()])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def _session(model, torch: bool = False, **options) -> ok.InferenceSession:
    b = ok.InferenceSession.builder()
    if torch:
        pytest.importorskip("torch", reason="the torch provider needs torch")
        b = b.providers(["cuda", "cpu"]).option("testing.cuda_on_torch_cpu", "1")
    else:
        b = b.device("cpu")
    for k, v in options.items():
        b = b.option(k, v)
    return b.from_graph(model)


def _vi(name, dtype, shape):
    return oh.make_tensor_value_info(name, dtype, shape)


def _read(b) -> np.ndarray:
    return b.read()


# --- a whole capture ---------------------------------------------------------------------

def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((8, 16)).astype(np.float32),
             "b1": rng.standard_normal(16).astype(np.float32),
             "w2": rng.standard_normal((16, 4)).astype(np.float32)}
    nodes = [oh.make_node("MatMul", ["x", "w1"], ["a"]), oh.make_node("Add", ["a", "b1"], ["b"]),
             oh.make_node("Relu", ["b"], ["c"]), oh.make_node("MatMul", ["c", "w2"], ["d"]),
             oh.make_node("Softmax", ["d"], ["y"], axis=-1)]
    return _model(nodes, [_vi("x", T.FLOAT, [4, 8])], [_vi("y", T.FLOAT, [4, 4])], inits)


@pytest.mark.parametrize("torch", [False, True], ids=["numpy", "torch_cpu"])
def test_whole_capture_replays_like_eager_runs(torch):
    s = ref = _session(_mlp(), torch)  # replays must equal the same session's eager runs
    xb = s.allocate_device_binding("x", None, F, (4, 8), (4, 8))
    yb = s.allocate_device_output_binding("y", F, (4, 4), (4, 4))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    xb.write(x)
    res = s.try_capture_with_device_bindings({}, [xb, yb])
    assert res.captured and res.segments == 1 and res.outputs == [None]
    assert s.captured_graph_segment_count() == 1 and s.capture_segmentation() == []
    np.testing.assert_array_equal(yb.read(), ref.run({"x": x})[0])
    for _ in range(50):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        xb.write(x)
        assert s.replay_device_graph([yb, xb]) is True  # order does not matter
        np.testing.assert_array_equal(yb.read(), ref.run({"x": x})[0])
    assert s.check_device_capture_error() == 0
    assert s.reset_device_graph() is True and s.reset_device_graph() is False
    assert s.captured_graph_segment_count() == 0
    with pytest.raises(ok.CaptureError, match="try_capture_with_device_bindings first"):
        s.replay_device_graph([xb, yb])


def test_cpu_replay_writes_elementwise_steps_into_their_capture_buffers():
    nodes = [oh.make_node("Mul", ["x", "three"], ["a"]), oh.make_node("Sin", ["a"], ["b"]),
             oh.make_node("Add", ["b", "x"], ["c"]), oh.make_node("Tanh", ["c"], ["y"])]
    m = _model(nodes, [_vi("x", T.FLOAT, [64, 64])], [_vi("y", T.FLOAT, [64, 64])],
               {"three": np.array(3, np.float32)})
    s = _session(m)
    xb = s.allocate_device_binding("x", None, F, (64, 64), (64, 64))
    yb = s.allocate_device_output_binding("y", F, (64, 64), (64, 64))
    xb.write(np.ones((64, 64), np.float32))
    s.try_capture_with_device_bindings({}, [xb, yb])
    steps = s._graphs._installed.parts[0].run.plan.steps
    buffers = {st.op_type: st.kernel.keywords["out"] for st in steps
               if "out" in getattr(st.kernel, "keywords", {})}
    assert {"Mul", "Add", "Tanh"} <= set(buffers), buffers
    assert len({id(b) for b in buffers.values()}) == len(buffers)  # one buffer per step
    x = np.random.default_rng(4).standard_normal((64, 64)).astype(np.float32)
    xb.write(x)
    assert s.replay_device_graph([xb, yb])
    np.testing.assert_array_equal(yb.read(), s.run({"x": x})[0])
    np.testing.assert_array_equal(buffers["Tanh"], yb.read())  # the replay wrote into it


def test_cpu_replay_runs_kernels_specialised_for_the_capture_shapes():
    s = _session(_mlp())
    xb = s.allocate_device_binding("x", None, F, (4, 8), (4, 8))
    yb = s.allocate_device_output_binding("y", F, (4, 4), (4, 4))
    xb.write(np.ones((4, 8), np.float32))
    assert s.try_capture_with_device_bindings({}, [xb, yb]).captured
    generic = [st.kernel for st in s._compiled.plan.steps if st.op_type == "MatMul"]
    replayed = [st.kernel for st in s._graphs._installed.parts[0].run.plan.steps
                if st.op_type == "MatMul"]
    assert replayed and not set(replayed) & set(generic)
    rng = np.random.default_rng(5)
    for _ in range(5):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        xb.write(x)
        assert s.replay_device_graph([xb, yb])
        np.testing.assert_allclose(yb.read(), s.run({"x": x})[0], rtol=1e-6, atol=1e-7)


def test_plain_inputs_are_frozen_at_capture():
    nodes = [oh.make_node("Add", ["x", "b"], ["y"])]
    m = _model(nodes, [_vi("x", T.FLOAT, [3]), _vi("b", T.FLOAT, [3])], [_vi("y", T.FLOAT, [3])])
    s = _session(m)
    xb = s.allocate_device_binding("x", None, F, (3,), (3,))
    yb = s.allocate_device_output_binding("y", F, (3,), (3,))
    b = np.ones(3, np.float32)
    xb.write(np.arange(3, dtype=np.float32))
    s.try_capture_with_device_bindings({"b": b}, [xb, yb])
    b[:] = 100  # the caller's array changes; the graph keeps the values it captured
    xb.write(np.full(3, 5, np.float32))
    assert s.replay_device_graph([xb, yb])
    np.testing.assert_array_equal(yb.read(), [6, 6, 6])


def test_every_output_must_be_bound():
    s = _session(_mlp())
    xb = s.allocate_device_binding("x", None, F, (4, 8), (4, 8))
    with pytest.raises(ok.CaptureError, match=r"unbound: \['y'\]"):
        s.try_capture_with_device_bindings({}, [xb])


# --- seams ---------------------------------------------------------------------------------

def _nonzero_model(op: str) -> onnx.ModelProto:
    if op == "NonZero":
        find = [oh.make_node("NonZero", ["a"], ["nz"]), oh.make_node("Cast", ["nz"], ["f"], to=1)]
    else:
        find = [oh.make_node("Unique", ["a"], ["f"], sorted=1)]
    nodes = [oh.make_node("Mul", ["x", "two"], ["a"]), *find,
             oh.make_node("ReduceSum", ["f"], ["count"], keepdims=0),
             oh.make_node("Relu", ["a"], ["z"])]
    return _model(nodes, [_vi("x", T.FLOAT, [6])],
                  [_vi("count", T.FLOAT, []), _vi("z", T.FLOAT, [6])],
                  {"two": np.array(2, np.float32)})


def _nonzero_bindings(s):
    return (s.allocate_device_binding("x", None, F, (6,), (6,)),
            s.allocate_device_output_binding("count", F, (), ()),
            s.allocate_device_output_binding("z", F, (6,), (6,)))


@pytest.mark.parametrize("op", ["NonZero", "Unique"])
def test_segmented_capture_around_a_data_dependent_seam(op):
    s = _session(_nonzero_model(op))
    ref = _session(_nonzero_model(op))
    xb, cb, zb = _nonzero_bindings(s)
    xb.write(np.array([0, 1, -2, 0, 3, 0], np.float32))
    res = s.try_capture_with_device_bindings({}, [xb, cb, zb])
    assert res.captured and res.segments == 2
    seams = s.capture_segmentation()
    kinds = [(d.op_type, d.seam_kind) for d in seams]
    assert kinds[0] == (op, ok.SeamKind.DATA_DEPENDENT_SHAPE)
    assert all(k is ok.SeamKind.DATA_DEPENDENT_SHAPE for _, k in kinds)
    assert [d.op_type for d in seams] == ([op, "Cast", "ReduceSum"] if op == "NonZero"
                                          else [op, "ReduceSum"])
    assert "output shape depends on data" in seams[0].reason
    assert f"through node '{seams[0].node_name}'" in seams[1].reason
    rng = np.random.default_rng(2)
    for _ in range(20):  # the number of nonzeros changes every step
        x = np.where(rng.random(6) < 0.5, 0, rng.integers(-3, 4, 6)).astype(np.float32)
        xb.write(x)
        assert s.replay_device_graph([xb, cb, zb])
        count, z = ref.run({"x": x})
        np.testing.assert_array_equal(cb.read(), count)
        np.testing.assert_array_equal(zb.read(), z)


def _det_model() -> onnx.ModelProto:
    """Mul and Add on the device around ai.onnx.ml LabelEncoder, which the torch provider
    has no kernel for (a CPU fallback node)."""
    nodes = [oh.make_node("Mul", ["x", "two"], ["a"]),
             oh.make_node("LabelEncoder", ["a"], ["d"], domain="ai.onnx.ml",
                          keys_floats=[0.0, 2.0], values_floats=[5.0, 7.0], default_float=0.5),
             oh.make_node("Add", ["d", "one"], ["y"]), oh.make_node("Neg", ["a"], ["n"])]
    model = _model(nodes, [_vi("x", T.FLOAT, [2, 3, 3])],
                   [_vi("y", T.FLOAT, [2, 3, 3]), _vi("n", T.FLOAT, [2, 3, 3])],
                   {"two": np.array(2, np.float32), "one": np.array(1, np.float32)})
    model.opset_import.append(oh.make_opsetid("ai.onnx.ml", 2))
    return model


def test_segmented_capture_around_a_cpu_fallback_node():
    s = _session(_det_model(), torch=True)
    ref = _session(_det_model())
    assert s.execution_provider_fallback_report() is not None
    xb = s.allocate_device_binding("x", None, F, (2, 3, 3), (2, 3, 3))
    yb = s.allocate_device_output_binding("y", F, (2, 3, 3), (2, 3, 3))
    nb = s.allocate_device_output_binding("n", F, (2, 3, 3), (2, 3, 3))
    rng = np.random.default_rng(3)
    xb.write(rng.standard_normal((2, 3, 3)).astype(np.float32))
    res = s.try_capture_with_device_bindings({}, [xb, yb, nb])
    assert res.captured and res.segments == 2
    nodes = [(d.op_type, d.seam_kind) for d in s.capture_segmentation() if d.node_id >= 0]
    assert nodes == [("LabelEncoder", ok.SeamKind.CPU_FALLBACK)]
    det = next(d for d in s.capture_segmentation() if d.op_type == "LabelEncoder")
    assert "runs on cpu" in det.reason
    copies = [d for d in s.capture_segmentation() if d.node_id < 0]
    assert copies and all(d.seam_kind is ok.SeamKind.KERNEL_NOT_CAPTURABLE for d in copies)
    for _ in range(10):
        x = rng.standard_normal((2, 3, 3)).astype(np.float32)
        xb.write(x)
        assert s.replay_device_graph([xb, yb, nb])
        y, n = ref.run({"x": x})
        np.testing.assert_allclose(yb.read(), y, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(nb.read(), n)


def test_not_capturable_lists_every_declining_node_and_runs_nothing():
    s = _session(_nonzero_model("NonZero"), **{"capture.allow_seams": "0"})
    xb, cb, zb = _nonzero_bindings(s)
    xb.write(np.ones(6, np.float32))
    res = s.try_capture_with_device_bindings({}, [xb, cb, zb])
    assert not res.captured and isinstance(res, ok.NotCapturable)
    assert [(d.op_type, d.seam_kind) for d in res.declines] == [
        ("NonZero", ok.SeamKind.DATA_DEPENDENT_SHAPE), ("Cast", ok.SeamKind.DATA_DEPENDENT_SHAPE),
        ("ReduceSum", ok.SeamKind.DATA_DEPENDENT_SHAPE)]
    assert res.declines[0].reason == "ai.onnx::NonZero: the kernel's output shape depends on data"
    assert s.captured_graph_segment_count() == 0
    np.testing.assert_array_equal(zb.read(), np.zeros(6))  # nothing ran
    out = s.run_with_device_bindings({}, [xb, cb, zb])  # the eager retry is safe
    assert out == [None, None] and cb.read() == 15  # the sum of the indices 0..5


def test_a_graph_of_seams_only_is_not_capturable():
    m = _model([oh.make_node("NonZero", ["x"], ["y"])], [_vi("x", T.FLOAT, [4])],
               [_vi("y", T.INT64, [1, "k"])])
    s = _session(m)
    xb = s.allocate_device_binding("x", None, F, (4,), (4,))
    yb = s.allocate_device_output_binding("y", I64, (1, 4), (1, 0))
    res = s.try_capture_with_device_bindings({}, [xb, yb])
    assert not res.captured
    assert [(d.node_id, d.op_type) for d in res.declines] == [(0, "NonZero")]
    assert "NonZero" in str(res)


# --- control flow ----------------------------------------------------------------------------

def _if_model() -> onnx.ModelProto:
    then = oh.make_graph([oh.make_node("Add", ["x", "one"], ["t"])], "then", [],
                         [_vi("t", T.FLOAT, [3])])
    other = oh.make_graph([oh.make_node("Mul", ["x", "three"], ["e"])], "else", [],
                          [_vi("e", T.FLOAT, [3])])
    nodes = [oh.make_node("If", ["cond"], ["b"], then_branch=then, else_branch=other),
             oh.make_node("Relu", ["b"], ["y"])]
    return _model(nodes, [_vi("cond", T.BOOL, []), _vi("x", T.FLOAT, [3])],
                  [_vi("y", T.FLOAT, [3])],
                  {"one": np.array(1, np.float32), "three": np.array(3, np.float32)})


def test_if_branch_flip_returns_false_with_correct_outputs_and_retires():
    s = _session(_if_model())
    cb = s.allocate_device_binding("cond", None, ok.DataType.BOOL, (), ())
    xb = s.allocate_device_binding("x", None, F, (3,), (3,))
    yb = s.allocate_device_output_binding("y", F, (3,), (3,))
    binds = [cb, xb, yb]
    cb.write(np.array(True))
    xb.write(np.array([-2, 0, 2], np.float32))
    res = s.try_capture_with_device_bindings({}, binds)
    assert res.captured and res.segments == 1
    [seam] = s.capture_segmentation()
    assert seam.op_type == "If" and seam.seam_kind is ok.SeamKind.HOST_CONTROL_FLOW
    np.testing.assert_array_equal(yb.read(), [0, 1, 3])
    xb.write(np.array([-5, 1, 4], np.float32))
    assert s.replay_device_graph(binds) is True
    np.testing.assert_array_equal(yb.read(), [0, 2, 5])
    cb.write(np.array(False))  # the other branch: this step is still right, the graph retires
    assert s.replay_device_graph(binds) is False
    np.testing.assert_array_equal(yb.read(), [0, 3, 12])
    assert s.captured_graph_segment_count() == 0
    with pytest.raises(ok.CaptureError):
        s.replay_device_graph(binds)
    assert s.try_capture_with_device_bindings({}, binds).captured  # capture again
    xb.write(np.array([1, 1, 1], np.float32))
    assert s.replay_device_graph(binds) is True
    np.testing.assert_array_equal(yb.read(), [3, 3, 3])


# --- bindings ------------------------------------------------------------------------------

def test_replay_refuses_other_bindings_and_released_ones():
    s = _session(_mlp())
    xb = s.allocate_device_binding("x", None, F, (4, 8), (4, 8))
    yb = s.allocate_device_output_binding("y", F, (4, 4), (4, 4))
    other = s.allocate_device_binding("x", None, F, (4, 8), (4, 8))
    s.try_capture_with_device_bindings({}, [xb, yb])
    with pytest.raises(ok.CaptureError, match="the same objects"):
        s.replay_device_graph([other, yb])
    with pytest.raises(ok.CaptureError, match="the same objects"):
        s.replay_device_graph([xb])
    assert s.replay_device_graph([xb, yb]) and s.replay_device_graph([xb, yb])  # checked once
    with pytest.raises(ok.CaptureError, match="the same objects"):
        s.replay_device_graph([yb, other])
    xb.release()
    with pytest.raises(ok.CaptureError, match="released"):
        s.replay_device_graph([xb, yb])


def test_a_fixed_binding_that_changes_length_runs_eagerly_and_retires():
    nodes = [oh.make_node("ReduceSum", ["x"], ["y"], keepdims=1)]
    m = _model(nodes, [_vi("x", T.FLOAT, ["n"])], [_vi("y", T.FLOAT, [1])])
    s = _session(m)
    xb = s.allocate_device_binding("x", None, F, (8,), (4,))
    yb = s.allocate_device_output_binding("y", F, (1,), (1,))
    xb.write(np.arange(8, dtype=np.float32))
    assert s.try_capture_with_device_bindings({}, [xb, yb]).captured
    assert yb.read()[0] == 6
    xb.set_logical_shape((6,))
    assert s.replay_device_graph([xb, yb]) is False
    assert yb.read()[0] == 15 and s.captured_graph_segment_count() == 0


# --- capture-safe indexing -------------------------------------------------------------------

def _gather_model() -> onnx.ModelProto:
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    nodes = [oh.make_node("Gather", ["table", "idx"], ["g"], axis=0),
             oh.make_node("Add", ["g", "g"], ["y"])]
    return _model(nodes, [_vi("idx", T.INT64, [2])], [_vi("y", T.FLOAT, [2, 4])],
                  {"table": table})


@pytest.mark.parametrize("torch", [False, True], ids=["numpy", "torch_cpu"])
def test_out_of_range_gather_in_a_replay_clamps_and_latches_a_bit(torch):
    s = _session(_gather_model(), torch)
    ib = s.allocate_device_binding("idx", None, I64, (2,), (2,))
    yb = s.allocate_device_output_binding("y", F, (2, 4), (2, 4))
    ib.write(np.array([1, 2], np.int64))
    assert s.try_capture_with_device_bindings({}, [ib, yb]).captured
    ib.write(np.array([3, 12], np.int64))
    assert s.replay_device_graph([ib, yb]) is True
    assert s.check_device_capture_error() == ok.CaptureViolation.GATHER_INDEX
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    np.testing.assert_array_equal(yb.read(), 2 * table[[3, 9]])  # clamped to the last row
    ib.write(np.array([0, -1], np.int64))  # in range (negative wraps): the bit stays latched
    assert s.replay_device_graph([ib, yb])
    np.testing.assert_array_equal(yb.read(), 2 * table[[0, 9]])
    assert s.check_device_capture_error() == ok.CaptureViolation.GATHER_INDEX
    assert s.reset_device_graph() and s.check_device_capture_error() == 0
    with pytest.raises(ok.KernelError, match="out of range"):  # eager runs raise
        s.run({"idx": np.array([3, 12], np.int64)})


# --- decoders --------------------------------------------------------------------------------

@pytest.mark.parametrize("torch", [False, True], ids=["numpy", "torch_cpu"])
def test_static_cache_decoder_captures_whole_and_replays_50_steps_like_eager(torch):
    cfg, cap = zoo.GptConfig(), 64
    model = zoo.gpt_static_decoder_step(cfg, capacity=cap)
    s, ref = _session(model, torch), _session(model)
    kv, feeds, logits = zoo.static_decode_bindings(s, cfg, cap)
    binds = [*kv, *feeds.values(), logits]
    h, d = cfg.heads, cfg.hidden // cfg.heads
    past = {f"past_{k}_{i}": np.zeros((1, h, cap, d), np.float32)
            for i in range(cfg.layers) for k in ("key", "value")}
    names = [m.name for m in ref.outputs()]
    token = 7
    for step in range(50):
        step_feeds = zoo.static_decode_feeds(step, token, cap)
        for name, value in step_feeds.items():
            feeds[name].write(value)
        if step == 0:
            res = s.try_capture_with_device_bindings({}, binds)
            assert res.captured and res.segments == 1 and s.capture_segmentation() == []
        else:
            assert s.replay_device_graph(binds) is True
        expect, *present = ref.run({**step_feeds, **past})
        np.testing.assert_allclose(logits.read(), expect, rtol=1e-5, atol=1e-5)
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], present)}
        token = int(expect[0, -1].argmax())
    np.testing.assert_allclose(kv[0].read(), past["past_key_0"], rtol=1e-5, atol=1e-6)
    assert s.check_device_capture_error() == 0


def test_growing_kv_decoder_segments_around_the_cache_and_replays_like_eager():
    cfg, cap = zoo.GptConfig(), 40
    model = zoo.gpt_decoder_step(cfg)
    s, ref = _session(model), _session(model)
    h, d = cfg.heads, cfg.hidden // cfg.heads
    kv = [s.allocate_device_binding(f"past_{k}_{i}", f"present_{k}_{i}", F, (1, h, cap, d),
                                    (1, h, 0, d))
          for i in range(cfg.layers) for k in ("key", "value")]
    ids = s.allocate_device_binding("input_ids", None, I64, (1, 1), (1, 1))
    logits = s.allocate_device_output_binding("logits", F, (1, 1, cfg.vocab), (1, 1, cfg.vocab))
    binds = [*kv, ids, logits]
    past = {f"past_{k}_{i}": np.zeros((1, h, 0, d), np.float32)
            for i in range(cfg.layers) for k in ("key", "value")}
    names = [m.name for m in ref.outputs()]
    token = 3
    for step in range(30):
        ids.write(np.array([[token]], np.int64))
        if step == 0:
            res = s.try_capture_with_device_bindings({}, binds)
            assert res.captured and res.segments >= 2
        else:
            assert s.replay_device_graph(binds) is True
        expect, *present = ref.run({"input_ids": np.array([[token]], np.int64), **past})
        np.testing.assert_array_equal(logits.read(), expect)
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], present)}
        token = int(expect[0, -1].argmax())
    assert kv[0].logical_shape == (1, h, 30, d)
    kinds = {d.seam_kind for d in s.capture_segmentation()}
    assert ok.SeamKind.GROWING_SHAPE in kinds
    concat = [d for d in s.capture_segmentation() if d.op_type == "Concat"]
    assert len(concat) == 2 * cfg.layers
    assert all(d.seam_kind is ok.SeamKind.GROWING_SHAPE for d in concat)
    layer_norms = [d for d in s.capture_segmentation() if "LayerNorm" in d.op_type]
    assert layer_norms == []  # the fixed-shape parts of every layer are recorded


def test_captures_and_replays_count_as_ineligible_for_the_decode_memo():
    s = _session(_mlp())
    xb = s.allocate_device_binding("x", None, F, (4, 8), (4, 8))
    yb = s.allocate_device_output_binding("y", F, (4, 4), (4, 4))
    s.try_capture_with_device_bindings({}, [xb, yb])
    for _ in range(5):
        s.replay_device_graph([xb, yb])
    assert s.decode_memo_counts() == (0, 0, 0, 6)


def test_capture_spans_carry_capture_status_and_reason():
    ctx = ok.TraceContext.in_memory()
    s = ok.InferenceSession.builder().device("cpu").trace(ctx).from_graph(
        _nonzero_model("NonZero"))
    xb, cb, zb = _nonzero_bindings(s)
    xb.write(np.array([1, 0, 2, 0, 0, 3], np.float32))
    s.try_capture_with_device_bindings({}, [xb, cb, zb])
    nodes = {sp.name: sp.attributes for sp in ctx.spans if sp.category == "node"}
    assert nodes["NonZero"]["capture_status"] == "seam"
    assert "depends on data" in nodes["NonZero"]["capture_reason"]
    assert nodes["Mul"]["capture_status"] == "captured"
    assert nodes["Mul"]["capture_reason"] == ""
    assert nodes["Relu"]["capture_status"] == "captured"


def test_traced_replays_span_seam_ops_and_each_captured_segment():
    ctx = ok.TraceContext.in_memory()
    s = ok.InferenceSession.builder().device("cpu").trace(ctx).from_graph(
        _nonzero_model("NonZero"))
    xb, cb, zb = _nonzero_bindings(s)
    xb.write(np.array([1, 0, 2, 0, 0, 3], np.float32))
    s.try_capture_with_device_bindings({}, [xb, cb, zb])
    ctx.clear()
    assert s.replay_device_graph([xb, cb, zb])
    names = [sp.name for sp in ctx.spans]
    assert names.count("captured_segment") == 2 and names.count("model_replay") == 1
    assert [n for n in names if n in ("NonZero", "Cast", "ReduceSum", "Mul", "Relu")] == [
        "NonZero", "Cast", "ReduceSum"]  # seams are traced op by op, segments as a whole
    segment = next(sp for sp in ctx.spans if sp.name == "captured_segment")
    assert segment.attributes["capture_status"] == "replayed"
    assert cb.read() == 7  # indices 0, 2, 5 of the nonzero elements


def test_the_capture_example_replays_the_eager_tokens():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "examples" / "capture_decode.py"
    spec = importlib.util.spec_from_file_location("capture_decode_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    cfg, cap = zoo.GptConfig(), 32
    model = zoo.gpt_static_decoder_step(cfg, capacity=cap)
    tokens, ms = example.greedy_replayed(_session(model), cfg, cap, 7, 12)
    assert tokens == example.greedy_eager(_session(model), cfg, cap, 7, 12)
    assert len(tokens) == 12 and ms > 0


def test_a_refused_capture_leaves_no_graph_installed():
    s = _session(_nonzero_model("NonZero"), **{"capture.allow_seams": "0"})
    xb, cb, zb = _nonzero_bindings(s)
    xb.write(np.ones(6, np.float32))
    assert not s.try_capture_with_device_bindings({}, [xb, cb, zb]).captured
    assert s.captured_graph_segment_count() == 0 and s.capture_segmentation() == []
    with pytest.raises(ok.CaptureError, match="no captured device graph"):
        s.replay_device_graph([xb, cb, zb])


# --- segments recorded as device graphs (an eager stand-in on torch's CPU device) -----------

class _EagerGraphs:
    """CUDA graphs' contract without a GPU: `record` runs the segment once and keeps its
    outputs as the static ones; each replay reruns it and copies into them (a graph writes
    the same memory every time). Checks the static-input and -output plumbing."""

    def __init__(self) -> None:
        self.recorded = self.replays = 0

    def record(self, fn, label):
        outputs = fn()
        self.recorded += 1

        def replay():
            self.replays += 1
            for old, new in zip(outputs, fn()):
                old.copy_(new)

        return outputs, replay


@pytest.fixture
def graphs(monkeypatch):
    pytest.importorskip("torch", reason="the torch provider needs torch")
    from onnxkiln.device_graph import DeviceGraphs

    stand_in = _EagerGraphs()
    monkeypatch.setattr(DeviceGraphs, "_graph_backend", lambda self: stand_in)
    return stand_in


def test_static_decoder_segment_recorded_as_a_graph_replays_like_eager(graphs):
    cfg, cap = zoo.GptConfig(), 32
    model = zoo.gpt_static_decoder_step(cfg, capacity=cap)
    s, ref = _session(model, torch=True), _session(model, torch=True)
    kv, feeds, logits = zoo.static_decode_bindings(s, cfg, cap)
    rkv, rfeeds, rlogits = zoo.static_decode_bindings(ref, cfg, cap)
    binds, rbinds = [*kv, *feeds.values(), logits], [*rkv, *rfeeds.values(), rlogits]
    token = 5
    for step in range(12):
        for name, value in zoo.static_decode_feeds(step, token, cap).items():
            feeds[name].write(value)
            rfeeds[name].write(value)
        if step == 0:
            assert s.try_capture_with_device_bindings({}, binds).segments == 1
        else:
            assert s.replay_device_graph(binds)
        ref.run_with_device_bindings({}, rbinds)
        np.testing.assert_array_equal(logits.read(), rlogits.read())
        token = int(rlogits.read().argmax())
    np.testing.assert_array_equal(kv[-1].read(), rkv[-1].read())
    assert (graphs.recorded, graphs.replays) == (1, 11)


def test_growing_decoder_segments_recorded_as_graphs_replay_like_eager(graphs):
    cfg, cap = zoo.GptConfig(), 24
    model = zoo.gpt_decoder_step(cfg)
    s, ref = _session(model, torch=True), _session(model, torch=True)
    h, d = cfg.heads, cfg.hidden // cfg.heads

    def bindings(session):
        kv = [session.allocate_device_binding(f"past_{k}_{i}", f"present_{k}_{i}", F,
                                              (1, h, cap, d), (1, h, 0, d))
              for i in range(cfg.layers) for k in ("key", "value")]
        ids = session.allocate_device_binding("input_ids", None, I64, (1, 1), (1, 1))
        out = session.allocate_device_output_binding("logits", F, (1, 1, cfg.vocab),
                                                     (1, 1, cfg.vocab))
        return [*kv, ids, out], ids, out

    binds, ids, logits = bindings(s)
    rbinds, rids, rlogits = bindings(ref)
    token = 3
    for step in range(10):
        ids.write(np.array([[token]], np.int64))
        rids.write(np.array([[token]], np.int64))
        if step == 0:
            res = s.try_capture_with_device_bindings({}, binds)
            assert res.segments >= 2
        else:
            assert s.replay_device_graph(binds)
        ref.run_with_device_bindings({}, rbinds)
        np.testing.assert_array_equal(logits.read(), rlogits.read())
        token = int(rlogits.read().argmax())
    assert graphs.recorded >= 2 and graphs.replays == 9 * graphs.recorded
    assert binds[0].logical_shape == (1, h, 10, d)


def test_cpu_fallback_seam_between_recorded_graphs_replays_like_eager(graphs):
    s, ref = _session(_det_model(), torch=True), _session(_det_model())
    xb = s.allocate_device_binding("x", None, F, (2, 3, 3), (2, 3, 3))
    yb = s.allocate_device_output_binding("y", F, (2, 3, 3), (2, 3, 3))
    nb = s.allocate_device_output_binding("n", F, (2, 3, 3), (2, 3, 3))
    rng = np.random.default_rng(5)
    xb.write(rng.standard_normal((2, 3, 3)).astype(np.float32))
    assert s.try_capture_with_device_bindings({}, [xb, yb, nb]).segments == 2
    assert graphs.recorded == 2
    for _ in range(5):
        x = rng.standard_normal((2, 3, 3)).astype(np.float32)
        xb.write(x)
        assert s.replay_device_graph([xb, yb, nb])
        y, n = ref.run({"x": x})
        np.testing.assert_allclose(yb.read(), y, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(nb.read(), n)
    assert graphs.replays == 10


def test_a_branch_flip_that_changes_shapes_reruns_the_step_eagerly():
    then = oh.make_graph([oh.make_node("Slice", ["x", "zero", "two"], ["t"])], "then", [],
                         [_vi("t", T.FLOAT, [2])])
    other = oh.make_graph([oh.make_node("Mul", ["x", "three"], ["e"])], "else", [],
                          [_vi("e", T.FLOAT, [3])])
    nodes = [oh.make_node("If", ["cond"], ["b"], then_branch=then, else_branch=other),
             oh.make_node("Relu", ["b"], ["y"])]
    m = _model(nodes, [_vi("cond", T.BOOL, []), _vi("x", T.FLOAT, [3])],
               [_vi("y", T.FLOAT, ["n"])],
               {"zero": np.array([0], np.int64), "two": np.array([2], np.int64),
                "three": np.array(3, np.float32)})
    s = _session(m)
    cb = s.allocate_device_binding("cond", None, ok.DataType.BOOL, (), ())
    xb = s.allocate_device_binding("x", None, F, (3,), (3,))
    yb = s.allocate_device_output_binding("y", F, (3,), (2,))
    cb.write(np.array(True))
    xb.write(np.array([-1, 2, 5], np.float32))
    assert s.try_capture_with_device_bindings({}, [cb, xb, yb]).captured
    np.testing.assert_array_equal(yb.read(), [0, 2])
    cb.write(np.array(False))  # the else branch has another shape: the Relu segment's guard
    assert s.replay_device_graph([cb, xb, yb]) is False
    np.testing.assert_array_equal(yb.read(), [0, 6, 15])
    assert yb.logical_shape == (3,) and s.captured_graph_segment_count() == 0
