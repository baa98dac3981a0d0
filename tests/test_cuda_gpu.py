"""The CUDA provider on a real GPU: skipped (with the reason) where there is none.

scripts/gpu_check.sh runs this file on a GPU machine together with the torch-kernel tests.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnxkiln as ok
from onnxkiln import zoo

torch = pytest.importorskip("torch", reason="the CUDA provider needs torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_model_on_cuda_matches_the_cpu(name):
    generator, small, _ = zoo.MODELS[name]
    model = generator(small)
    feeds = zoo.random_inputs(model, seed=3)
    expected = ok.InferenceSession.builder().device("cpu").from_graph(model).run(feeds)
    s = ok.InferenceSession.builder().device("cuda").from_graph(model)
    assert s.device_id() == ok.DeviceId(ok.DeviceType.CUDA, 0)
    for e, g in zip(expected, s.run(feeds)):
        np.testing.assert_allclose(g, e, rtol=2e-3, atol=2e-4)
    report = s.execution_provider_fallback_report()
    print(name, "fallback:", report)


def test_cuda_tensor_inputs_are_zero_copy_and_auto_picks_cuda():
    model = zoo.mlp(zoo.MODELS["mlp"][1])
    feeds = zoo.random_inputs(model, seed=0)
    s = ok.InferenceSession.builder().device("auto").from_graph(model)
    assert s.device_id().type is ok.DeviceType.CUDA
    x = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
    np.testing.assert_allclose(s.run(x)[0], s.run(feeds)[0], rtol=1e-5, atol=1e-6)


def test_allocation_counts_and_kv_bindings_on_cuda():
    cfg = zoo.MODELS["gpt2"][1]
    s = ok.InferenceSession.builder().device("cuda").from_graph(zoo.gpt_decoder_step(cfg))
    heads, dim = cfg.heads, cfg.hidden // cfg.heads
    before = s.device_allocation_counts()
    binds = [s.allocate_device_binding(f"past_{kv}_{i}", f"present_{kv}_{i}", ok.DataType.FLOAT,
                                       (1, heads, 32, dim), (1, heads, 0, dim))
             for i in range(cfg.layers) for kv in ("key", "value")]
    after = s.device_allocation_counts()
    assert after.allocations >= before.allocations + len(binds)
    assert after.bytes_in_use >= before.bytes_in_use + len(binds) * heads * 32 * dim * 4
    assert all(b.tensor.is_cuda for b in binds)
    s.run_with_device_bindings({"input_ids": np.array([[1, 2]], np.int64)}, binds)
    assert binds[0].logical_shape == (1, heads, 2, dim)


def test_static_decoder_replays_a_cuda_graph_like_the_cpu_and_allocates_nothing():
    cfg, cap = zoo.GptConfig(), 32
    model = zoo.gpt_static_decoder_step(cfg, capacity=cap)
    s = ok.InferenceSession.builder().device("cuda").from_graph(model)
    ref = ok.InferenceSession.builder().device("cpu").from_graph(model)
    kv, feeds, logits = zoo.static_decode_bindings(s, cfg, cap)
    binds = [*kv, *feeds.values(), logits]
    h, d = cfg.heads, cfg.hidden // cfg.heads
    past = {f"past_{k}_{i}": np.zeros((1, h, cap, d), np.float32)
            for i in range(cfg.layers) for k in ("key", "value")}
    names = [m.name for m in ref.outputs()]
    token = 5
    for step in range(20):
        step_feeds = zoo.static_decode_feeds(step, token, cap)
        for name, value in step_feeds.items():
            feeds[name].write(value)
        if step == 0:
            res = s.try_capture_with_device_bindings({}, binds)
            assert res.captured and res.segments == 1, s.capture_segmentation()
        else:
            before = s.device_allocation_counts()
            assert s.replay_device_graph(binds) is True
            assert s.device_allocation_counts().allocations == before.allocations
        expect, *present = ref.run({**step_feeds, **past})
        np.testing.assert_allclose(logits.read(), expect, rtol=2e-3, atol=2e-4)
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], present)}
        token = int(expect[0, -1].argmax())
    assert s.check_device_capture_error() == 0


def test_out_of_range_gather_in_a_cuda_graph_latches_a_bit():
    from onnx import TensorProto as T
    from onnx import helper as oh
    from onnx import numpy_helper

    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    graph = oh.make_graph([oh.make_node("Gather", ["table", "idx"], ["y"], axis=0)], "g",
                          [oh.make_tensor_value_info("idx", T.INT64, [2])],
                          [oh.make_tensor_value_info("y", T.FLOAT, [2, 4])],
                          [numpy_helper.from_array(table, "table")])
    s = ok.InferenceSession.builder().device("cuda").from_graph(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    ib = s.allocate_device_binding("idx", None, ok.DataType.INT64, (2,), (2,))
    yb = s.allocate_device_output_binding("y", ok.DataType.FLOAT, (2, 4), (2, 4))
    ib.write(np.array([1, 2], np.int64))
    assert s.try_capture_with_device_bindings({}, [ib, yb]).captured
    ib.write(np.array([3, 40], np.int64))
    assert s.replay_device_graph([ib, yb])
    assert s.check_device_capture_error() == ok.CaptureViolation.GATHER_INDEX
    np.testing.assert_array_equal(yb.read(), table[[3, 9]])


def test_growing_kv_decoder_segments_on_cuda_and_replays_like_the_cpu():
    cfg, cap = zoo.GptConfig(), 32
    model = zoo.gpt_decoder_step(cfg)
    s = ok.InferenceSession.builder().device("cuda").from_graph(model)
    ref = ok.InferenceSession.builder().device("cpu").from_graph(model)
    h, d = cfg.heads, cfg.hidden // cfg.heads
    kv = [s.allocate_device_binding(f"past_{k}_{i}", f"present_{k}_{i}", ok.DataType.FLOAT,
                                    (1, h, cap, d), (1, h, 0, d))
          for i in range(cfg.layers) for k in ("key", "value")]
    ids = s.allocate_device_binding("input_ids", None, ok.DataType.INT64, (1, 1), (1, 1))
    logits = s.allocate_device_output_binding("logits", ok.DataType.FLOAT, (1, 1, cfg.vocab),
                                              (1, 1, cfg.vocab))
    binds = [*kv, ids, logits]
    past = {f"past_{k}_{i}": np.zeros((1, h, 0, d), np.float32)
            for i in range(cfg.layers) for k in ("key", "value")}
    names = [m.name for m in ref.outputs()]
    token = 3
    for step in range(12):
        ids.write(np.array([[token]], np.int64))
        if step == 0:
            res = s.try_capture_with_device_bindings({}, binds)
            assert res.captured and res.segments >= 2
            print("segments", res.segments, [str(x) for x in s.capture_segmentation()])
        else:
            assert s.replay_device_graph(binds) is True
        expect, *present = ref.run({"input_ids": np.array([[token]], np.int64), **past})
        np.testing.assert_allclose(logits.read(), expect, rtol=2e-3, atol=2e-4)
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], present)}
        token = int(expect[0, -1].argmax())
