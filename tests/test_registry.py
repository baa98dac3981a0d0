"""Kernel registry: specs, opset ranges, duplicates, schema defaults, build-once factories."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnxkiln import loader
from onnxkiln.executor import CompiledPlan
from onnxkiln.plan import build_plan
from onnxkiln.providers.base import KernelRegistry, KernelSpec, NodeInfo
from onnxkiln.providers.cpu import REGISTRY
from onnxkiln.testing import make_model, tensor_info


def test_resolve_picks_the_range_covering_the_opset():
    reg = KernelRegistry("test")
    reg.kernel("Op", since=1, until=12)(lambda x: x)
    reg.kernel("Op", since=13)(lambda x: -x)
    assert reg.resolve("", "Op", 12).until == 12
    assert reg.resolve("ai.onnx", "Op", 13).since == 13
    assert reg.resolve("", "Op", 99).since == 13
    assert reg.resolve("", "Missing", 13) is None
    assert reg.versions("", "Op") == [(1, 12), (13, None)]


def test_overlapping_registration_is_an_error():
    reg = KernelRegistry("test")
    reg.kernel("Op", since=5, until=10)(lambda x: x)
    with pytest.raises(ValueError, match="duplicate registration of ai.onnx::Op on test"):
        reg.kernel("Op", since=10)(lambda x: x)
    reg.kernel("Op", since=11)(lambda x: x)  # adjacent ranges are fine


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"op_type": ""}, "op_type"),
        ({"since": 0}, "since"),
        ({"since": 5, "until": 3}, "until"),
        ({"fn": 3}, "callable"),
    ],
)
def test_kernel_spec_checks_its_arguments(kwargs, match):
    args = {"domain": "", "op_type": "Op", "since": 1, "until": None, "fn": lambda x: x}
    args.update(kwargs)
    with pytest.raises(TypeError, match=match):
        KernelSpec(**args)


def _run_with(reg: KernelRegistry, model):
    plan = build_plan(loader.from_graph(model), [reg])
    return plan, CompiledPlan(plan)


def test_attributes_are_bound_once_with_schema_defaults():
    reg = KernelRegistry("test")
    seen = []

    @reg.kernel("LeakyRelu", since=6)
    def leaky(x, *, alpha):
        seen.append(alpha)
        return np.where(x > 0, x, x * np.float32(alpha))

    model = make_model(
        [helper.make_node("LeakyRelu", ["x"], ["t"]),
         helper.make_node("LeakyRelu", ["t"], ["y"], alpha=0.5)],
        [tensor_info("x", np.float32, [2])], [tensor_info("y", np.float32, [2])],
    )
    _, run = _run_with(reg, model)
    y = run([np.array([-1.0, 2.0], np.float32)])[0]
    assert seen == pytest.approx([0.01, 0.5])  # schema default 0.01, then the node's 0.5
    np.testing.assert_allclose(y, [-0.005, 2.0], rtol=1e-6)


def test_factories_run_once_per_node_at_plan_time_and_see_constants():
    reg = KernelRegistry("test")
    built: list[NodeInfo] = []

    @reg.kernel("Mul", since=7, factory=True)
    def mul(info: NodeInfo):
        built.append(info)
        return lambda a, b: a * b

    model = make_model(
        [helper.make_node("Mul", ["x", "w"], ["y"], name="scale")],
        [tensor_info("x", np.float32, [2])], [tensor_info("y", np.float32, [2])],
        {"w": np.array([2, 3], np.float32)},
    )
    _, run = _run_with(reg, model)
    for _ in range(3):
        np.testing.assert_array_equal(run([np.ones(2, np.float32)])[0], [2, 3])
    assert len(built) == 1
    info = built[0]
    assert (info.name, info.op_type, info.opset, info.n_inputs, info.n_outputs) == (
        "scale", "Mul", 21, 2, 1)
    assert info.const_inputs[0] is None
    np.testing.assert_array_equal(info.const_inputs[1], [2, 3])
    assert info.describe() == "'scale' ai.onnx::Mul opset 21"


def test_multi_output_kernels_fill_only_the_wanted_outputs():
    reg = KernelRegistry("test")

    @reg.kernel("Split", since=18, multi_output=True, factory=True)
    def split(info: NodeInfo):
        n = info.attrs["num_outputs"]
        return lambda x: tuple(np.split(x, n))

    model = make_model(
        [helper.make_node("Split", ["x"], ["", "b", "c"], num_outputs=3)],
        [tensor_info("x", np.float32, [3])],
        [tensor_info("b", np.float32, [1]), tensor_info("c", np.float32, [1])],
    )
    _, run = _run_with(reg, model)
    b, c = run([np.array([1, 2, 3], np.float32)])
    np.testing.assert_array_equal(b, [2])
    np.testing.assert_array_equal(c, [3])


def test_every_cpu_kernel_has_a_unique_variant_and_docstring():
    specs = list(REGISTRY)
    assert len(specs) > 100
    for spec in specs:
        assert spec.variant, spec
        assert spec.fn.__doc__, f"{spec.op_type} ({spec.fn.__qualname__}) has no docstring"


def test_keyword_attributes_of_simple_kernels_exist_in_the_schema():
    """Each keyword attribute a kernel binds is defined by some schema version it covers."""
    import onnx

    from onnxkiln.providers.base import _keyword_only

    history: dict[tuple[str, str], list] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        domain = "" if schema.domain == "ai.onnx" else schema.domain
        history.setdefault((domain, schema.name), []).append(schema)
    for spec in REGISTRY:
        if spec.factory or (spec.domain, spec.op_type) not in history:
            continue
        covered = [s for s in history[(spec.domain, spec.op_type)] if spec.covers(s.since_version)
                   or s.since_version <= spec.since]
        names = {a for s in covered for a in s.attributes}
        for name in _keyword_only(spec.fn):
            assert name in names, (
                f"{spec.op_type} kernel {spec.fn.__qualname__} takes attribute '{name}' that no "
                f"schema version in its opset range defines"
            )
