"""Device bindings: persistent buffers, in-place KV append, checks."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import onnxkiln as ok
from onnxkiln import zoo
from onnxkiln.testing import make_model, tensor_info

CFG = zoo.MODELS["gpt2"][1]
HEADS, DIM = CFG.heads, CFG.hidden // CFG.heads


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
    if where in ("cpu", "cuda"):
        b = b.providers([where] if where == "cpu" else ["cuda", "cpu"])
    else:
        b = b.providers(["cuda", "cpu"]).option("testing.cuda_on_torch_cpu", "1")
    return b.from_graph(model)


@pytest.fixture(scope="module")
def gpt():
    return zoo.gpt_decoder_step(CFG)


def _kv_bindings(s, capacity, batch=1):
    return [s.allocate_device_binding(f"past_{kv}_{i}", f"present_{kv}_{i}", ok.DataType.FLOAT,
                                      (batch, HEADS, capacity, DIM), (batch, HEADS, 0, DIM))
            for i in range(CFG.layers) for kv in ("key", "value")]


def _greedy_plain(s, prompt, steps):
    past = {f"past_{kv}_{i}": np.zeros((1, HEADS, 0, DIM), np.float32)
            for i in range(CFG.layers) for kv in ("key", "value")}
    names = [m.name for m in s.outputs()]
    ids, tokens, logits = prompt, [], []
    for _ in range(steps):
        outs = s.run({"input_ids": ids, **past})
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], outs[1:])}
        logits.append(outs[0][0, -1])
        tokens.append(int(outs[0][0, -1].argmax()))
        ids = np.array([[tokens[-1]]], np.int64)
    return tokens, logits


@pytest.mark.parametrize("where", _providers())
def test_decode_loop_with_kv_bindings_matches_growing_past(gpt, where):
    s = _session(gpt, where)
    prompt = np.array([[3, 14, 15, 92]], np.int64)
    expected, expected_logits = _greedy_plain(s, prompt, 8)
    binds = _kv_bindings(s, capacity=32)
    buffers = [b.tensor for b in binds]
    ids, tokens = prompt, []
    for step in range(8):
        logits, *kv = s.run_with_device_bindings({"input_ids": ids}, binds)
        assert kv == [None] * len(binds)  # bound outputs stay in their bindings
        np.testing.assert_allclose(logits[0, -1], expected_logits[step], rtol=1e-5, atol=1e-5)
        tokens.append(int(logits[0, -1].argmax()))
        ids = np.array([[tokens[-1]]], np.int64)
    assert tokens == expected
    assert all(b.logical_shape == (1, HEADS, 4 + 7, DIM) for b in binds)
    assert all(b.tensor is t for b, t in zip(binds, buffers))  # same buffers throughout


@pytest.mark.parametrize("where", _providers())
def test_kv_append_writes_only_the_new_positions(gpt, where):
    s = _session(gpt, where)
    binds = _kv_bindings(s, capacity=16)
    s.run_with_device_bindings({"input_ids": np.array([[1, 2, 3]], np.int64)}, binds)
    before = [b.read() for b in binds]
    sentinel = np.full((1, HEADS, 16 - 4, DIM), 7.0, np.float32)
    binds[0].write(sentinel, offset=(0, 0, 4, 0))  # beyond the next position
    ctx = ok.TraceContext.in_memory()
    s.set_trace_context(ctx)
    s.run_with_device_bindings({"input_ids": np.array([[4]], np.int64)}, binds)
    after = [b.read() for b in binds]
    for old, new in zip(before, after):
        np.testing.assert_array_equal(new[:, :, :3], old)  # the past is untouched
    full = np.asarray(binds[0]._provider.to_host(binds[0].tensor))
    np.testing.assert_array_equal(full[:, :, 4:], sentinel[:, :, :])  # nothing past the end
    variants = {sp.attributes.get("node"): sp.attributes.get("kernel_variant")
                for sp in ctx.spans if sp.attributes.get("op_type") == "Concat"}
    appended = [n for n, v in variants.items() if v == "concat.kv_append_in_place"]
    assert len(appended) == 2 * CFG.layers


@pytest.mark.parametrize("where", _providers())
def test_capacity_overflow_names_the_binding(gpt, where):
    s = _session(gpt, where)
    binds = _kv_bindings(s, capacity=4)
    s.run_with_device_bindings({"input_ids": np.array([[1, 2, 3]], np.int64)}, binds)
    with pytest.raises(ok.DeviceBindingError) as e:
        s.run_with_device_bindings({"input_ids": np.array([[4, 5]], np.int64)}, binds)
    assert "past_key_0" in str(e.value) and "capacity 4" in str(e.value)


def _add_model():
    return make_model([helper.make_node("Add", ["a", "b"], ["y"])],
                      [tensor_info("a", np.float32, ["n", 3]),
                       tensor_info("b", np.float32, ["n", 3])],
                      [tensor_info("y", np.float32, ["n", 3])])


@pytest.mark.parametrize("where", _providers())
def test_output_binding_and_logical_shapes(where):
    s = _session(_add_model(), where)
    a = s.allocate_device_binding("a", None, ok.DataType.FLOAT, (8, 3), (2, 3))
    y = s.allocate_device_output_binding("y", ok.DataType.FLOAT, (8, 3), (0, 3))
    a.write(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = np.ones((2, 3), np.float32)
    assert s.run_with_device_bindings({"b": b}, [a, y]) == [None]
    assert y.logical_shape == (2, 3)
    np.testing.assert_array_equal(y.read(), np.arange(6).reshape(2, 3) + 1)
    a.set_logical_shape((1, 3))
    s.run_with_device_bindings({"b": b[:1]}, [a, y])
    np.testing.assert_array_equal(y.read(), [[1, 2, 3]])
    stats = a.transfer_stats()
    assert (stats.writes, stats.host_to_device_bytes) == (1, 24)
    assert y.transfer_stats().reads == 2 and y.transfer_stats().device_to_host_bytes == 12 + 24
    with pytest.raises(ok.DeviceBindingError, match="capacity"):
        s.run_with_device_bindings({"b": np.ones((1, 3), np.float32)},
                                   [s.allocate_device_binding("a", None, ok.DataType.FLOAT,
                                                              (1, 3), (1, 3)),
                                    s.allocate_device_output_binding(
                                        "y", ok.DataType.FLOAT, (0, 3), (0, 3))])


def test_binding_checks_give_clear_errors():
    s = _session(_add_model(), "cpu")
    other = _session(_add_model(), "cpu")
    with pytest.raises(ok.InputNotFoundError, match="unknown input 'bb'.*did you mean 'b'"):
        s.allocate_device_binding("bb", None, ok.DataType.FLOAT, (2, 3), (2, 3))
    with pytest.raises(ok.InputNotFoundError, match="unknown output 'z'"):
        s.allocate_device_output_binding("z", ok.DataType.FLOAT, (2, 3), (2, 3))
    with pytest.raises(ok.DeviceBindingError, match="dtype int64.*declares float32"):
        s.allocate_device_binding("a", None, ok.DataType.INT64, (2, 3), (2, 3))
    with pytest.raises(ok.DeviceBindingError, match="no dim larger"):
        s.allocate_device_binding("a", None, ok.DataType.FLOAT, (2, 3), (3, 3))
    a = s.allocate_device_binding("a", None, ok.DataType.FLOAT, (2, 3), (2, 3))
    b = np.ones((2, 3), np.float32)
    with pytest.raises(ok.DeviceBindingError, match="bound twice"):
        s.run_with_device_bindings({"b": b}, [a, a])
    with pytest.raises(ok.DeviceBindingError, match="both given in inputs and bound"):
        s.run_with_device_bindings({"a": b, "b": b}, [a])
    with pytest.raises(ok.DeviceBindingError, match="another session"):
        other.run_with_device_bindings({"b": b}, [a])
    with pytest.raises(ok.DeviceBindingError, match="does not fit"):
        a.write(np.ones((3, 3), np.float32))
    with pytest.raises(ok.DeviceBindingError, match="holds float32"):
        a.write(np.ones((2, 3), np.float64))
    a.release()
    with pytest.raises(ok.DeviceBindingError, match="released"):
        s.run_with_device_bindings({"b": b}, [a])
    assert s.device_allocation_counts() is None  # host memory is not counted


def test_the_decode_loop_example_matches_plain_runs(gpt):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "examples" / "decode_loop.py"
    spec = importlib.util.spec_from_file_location("decode_loop_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    s = _session(gpt, "cpu")
    prompt = np.array([[5, 6, 7]], np.int64)
    bound = example.greedy_with_bindings(s, CFG, prompt, steps=6, capacity=9)
    assert bound == example.greedy_plain(s, CFG, prompt, steps=6)
    assert len(bound) == 6


@pytest.mark.parametrize("where", ["cpu", "torch_cpu"])
def test_write_at_a_start_per_axis_fills_that_block_only(where):
    s = _session(_add_model(), where)
    a = s.allocate_device_binding("a", None, ok.DataType.FLOAT, (4, 5), (4, 5))
    a.write(np.zeros((4, 5), np.float32))
    a.write(np.full((2, 2), 7, np.float32), (1, 3))
    a.write(np.full((1, 1), 9, np.float32), (3, 0))
    expected = np.zeros((4, 5), np.float32)
    expected[1:3, 3:5] = 7
    expected[3, 0] = 9
    np.testing.assert_array_equal(a.read(), expected)
    assert a.transfer_stats().writes == 3
    for offset in ((3, 4), (0, -1), (0, 0, 0)):  # past the capacity, negative, wrong rank
        with pytest.raises(ok.DeviceBindingError):
            a.write(np.ones((2, 2), np.float32), offset)
    np.testing.assert_array_equal(a.read(), expected)  # a refused write changes nothing
