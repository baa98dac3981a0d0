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
