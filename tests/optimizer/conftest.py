"""Shared harness for optimizer tests: optimize a model, count its nodes, and check that the
optimized graph computes what the unoptimized one (ours and onnxruntime's) computes."""

from __future__ import annotations

import collections
import importlib
from collections.abc import Mapping

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from onnxkiln import loader
from onnxkiln.optimizer import optimize
from onnxkiln.partition import select_providers
from onnxkiln.session import InferenceSession, SessionBuilder
from onnxkiln.testing import ort_session

# Kernel modules the providers package may not import yet (contrib ops written in parallel,
# and the optimizer's own fused kernels); importing registers them.
for _mod in ("contrib_transformer", "contrib_fused", "contrib_attention", "fused"):
    importlib.import_module(f"onnxkiln.providers.cpu.{_mod}")


def parse(text: str, **initializers: np.ndarray) -> onnx.ModelProto:
    """A checked model from ONNX text syntax, plus initializers given as arrays (the text
    refers to them by name without declaring them)."""
    model = onnx.parser.parse_model(text)
    for name, value in initializers.items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    onnx.checker.check_model(model)
    return model


def ops(model: ir.Model) -> collections.Counter:
    """Op types of the main graph, `domain::Op` outside the standard domain."""
    return collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
        for n in model.graph)


def run(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run an (already optimized) model through a session that optimizes nothing more."""
    session = InferenceSession.__new__(InferenceSession)
    session._setup(model, select_providers("cpu", None), SessionBuilder().optimization("disabled"))
    return session.run(dict(feeds))


class Harness:
    """`check(model, feeds)` optimizes, compares, and returns the optimized model."""

    parse = staticmethod(parse)
    ops = staticmethod(ops)
    run = staticmethod(run)

    def optimize(self, proto: onnx.ModelProto, level: str = "extended") -> ir.Model:
        return optimize(loader.from_graph(proto), level)

    def check(
        self,
        proto: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        level: str = "extended",
        *,
        before: int | None = None,
        after: int | None = None,
        rtol: float = 1e-5,
        atol: float = 1e-6,
        ort_optimized: bool | None = None,
    ) -> ir.Model:
        """Optimize at `level`; assert node counts (main graph) and that ours-optimized
        equals ours-unoptimized and onnxruntime on the original model; when the optimized
        graph uses only ai.onnx/com.microsoft ops (or `ort_optimized`), onnxruntime runs it
        too and must agree."""
        plain = loader.from_graph(proto)
        if before is not None:
            assert len(plain.graph) == before, ops(plain)
        model = optimize(loader.from_graph(proto), level)
        if after is not None:
            assert len(model.graph) == after, ops(model)
        expected = run(plain, feeds)
        got = run(model, feeds)
        reference = ort_session(proto).run(None, dict(feeds))
        _same(got, expected, rtol, atol, "optimized vs unoptimized")
        _same(got, reference, rtol, atol, "optimized vs onnxruntime")
        domains = {n.domain for n in model.graph.all_nodes()}
        if ort_optimized if ort_optimized is not None else "onnxkiln" not in domains:
            theirs = ort_session(ir.serde.serialize_model(model)).run(None, dict(feeds))
            _same(got, theirs, rtol, atol, "optimized graph on onnxruntime")
        return model


def _same(a, b, rtol, atol, what) -> None:
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        y = np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, f"{what}: output {i}"
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"{what}: output {i}")


@pytest.fixture
def harness() -> Harness:
    return Harness()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
