"""The CUDA registry: zoo-model coverage, opset coverage vs the CPU provider, declines."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import reason  # noqa: E402

from onnxkiln import loader, zoo  # noqa: E402
from onnxkiln.optimizer import optimize  # noqa: E402
from onnxkiln.providers.cpu import REGISTRY as CPU  # noqa: E402
from onnxkiln.providers.cuda import REGISTRY  # noqa: E402
from onnxkiln.testing import node_model  # noqa: E402


def _ops(model, optimized: bool):
    ir_model = loader.from_graph(model)
    if optimized:
        ir_model = optimize(ir_model, "all")
    imports = dict(ir_model.opset_imports)
    return {(n.domain, n.op_type, imports.get(n.domain, 1)) for n in ir_model.graph.all_nodes()}


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
@pytest.mark.parametrize("optimized", [False, True])
def test_zoo_model_ops_all_resolve(name, optimized):
    build, cfg, _ = zoo.MODELS[name]
    missing = sorted(f"{d or 'ai.onnx'}::{op}@{v}" for d, op, v in _ops(build(cfg), optimized)
                     if REGISTRY.resolve(d, op, v) is None)
    assert not missing, f"{name}: no CUDA kernel for {missing}"


def test_registered_ranges_stay_within_the_cpu_providers():
    """Every (domain, op) we serve, the CPU serves too (the partitioner's fallback)."""
    for domain, op in REGISTRY.ops():
        for since, until in REGISTRY.versions(domain, op):
            for v in {since, until or since + 3}:
                assert CPU.resolve(domain, op, v) is not None, f"{domain}::{op}@{v}"


def test_every_kernel_has_a_supports_check():
    lacking = [f"{s.domain}::{s.op_type}" for s in REGISTRY
               if s.supports is None and s.op_type != "Constant"]
    assert not lacking


def _f(shape, dt=np.float32):
    return np.zeros(shape, dt)


@pytest.mark.parametrize("model,expected", [
    (lambda: node_model("Div", {"a": _f(3, np.uint64), "b": _f(3, np.uint64)}),
     "uint64"),
    (lambda: node_model("MatMul", {"a": _f((2, 2), np.int32), "b": _f((2, 2), np.int32)}),
     "no integer GEMM"),
    (lambda: node_model("Cast", {"x": _f(3)}, to=23), "Cast to float4e2m1"),
    (lambda: node_model("Cast", {"x": _f(3)}, to=8), "string"),
    (lambda: node_model("Relu", {"x": _f(3, np.uint16)}), "uint16"),
    (lambda: node_model("Conv", {"x": _f((1, 1, 2, 2, 2, 2)), "w": _f((1, 1, 1, 1, 1, 1))}),
     "spatial dims"),
    (lambda: node_model("MaxPool", {"x": _f((1, 1, 4, 4))}, n_outputs=2, kernel_shape=[2, 2],
                        storage_order=2), "storage_order must be 0 or 1"),
    (lambda: node_model("BatchNormalization", {"x": _f((2, 3, 2))}, n_outputs=3,
                        initializers={k: _f(3) for k in "sbmv"}, spatial=0, opset=8),
     "spatial=0"),
    (lambda: node_model("Add", {"a": _f(3, np.complex64), "b": _f(3, np.complex64)}),
     "complex64"),
])
def test_supports_declines_with_a_reason(model, expected):
    why = reason(model())
    assert why is not None and expected in why, why


def test_supports_accepts_ordinary_nodes():
    assert reason(node_model("Add", {"a": _f(3), "b": _f(3)})) is None
    assert reason(node_model("MatMul", {"a": _f((2, 2), np.float16),
                                        "b": _f((2, 2), np.float16)})) is None


def test_device_scope_places_host_derived_outputs():
    from onnxkiln.providers.cuda.device import current_device, device_scope
    with device_scope("cpu"):
        assert current_device() == torch.device("cpu")
        with device_scope("meta"):
            assert current_device() == torch.device("meta")
        assert current_device() == torch.device("cpu")
