"""Whole zoo models through the torch kernels alone (torch CPU device) vs the numpy kernels."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import run_graph  # noqa: E402

from onnxkiln import loader, zoo  # noqa: E402
from onnxkiln.optimizer import optimize  # noqa: E402


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
@pytest.mark.parametrize("optimized", [False, True])
def test_zoo_model_runs_entirely_on_torch_kernels(name, optimized):
    build, cfg, _ = zoo.MODELS[name]
    model = build(cfg)
    feeds = zoo.random_inputs(model, seed=0)
    ir_model = loader.from_graph(model)
    if optimized:
        ir_model = optimize(ir_model, "all")
    expected = run_graph(ir_model, feeds, device=False)
    got = run_graph(ir_model, feeds, device=True)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-4)
        else:
            np.testing.assert_array_equal(g, e)
