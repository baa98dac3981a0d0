"""Helpers for tests and benchmarks: build one-node models, compare against onnxruntime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxkiln import onnx_guard

__all__ = [
    "assert_matches_ort",
    "assert_same",
    "build_kernel",
    "check_node",
    "check_outputs_against_ort",
    "make_model",
    "node_model",
    "ort_session",
    "run_node",
    "run_ort",
    "run_ours",
    "tensor_info",
]

DEFAULT_OPSET = 21


def tensor_info(name: str, dtype: Any, shape: Sequence[int | str | None] | None):
    """A ValueInfoProto for a tensor; dtype is numpy-like or an ONNX element type int."""
    elem = dtype if isinstance(dtype, int) else helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem, shape)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = DEFAULT_OPSET,
    extra_opsets: Mapping[str, int] | None = None,
    name: str = "test",
) -> onnx.ModelProto:
    """A checked ModelProto from nodes and value infos; initializers given as numpy arrays."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), inits)
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    ir_version = 10 if opset >= 21 else 8
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    onnx_guard.check_model(model)
    return model


def node_model(
    op_type: str,
    feeds: Mapping[str, np.ndarray],
    n_outputs: int = 1,
    opset: int = DEFAULT_OPSET,
    initializers: Mapping[str, np.ndarray] | None = None,
    domain: str = "",
    input_names: Sequence[str] | None = None,
    **attrs: Any,
) -> onnx.ModelProto:
    """A model with one node of `op_type`; feeds become inputs, initializers constants.

    Outputs are named y0, y1, ... with unknown type and shape (inferred by consumers).
    `input_names` sets the node's input order (use "" for an absent optional input);
    by default it is the feeds' then the initializers' keys.
    """
    initializers = dict(initializers or {})
    names = list(input_names) if input_names is not None else [*feeds, *initializers]
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain or None, **attrs)
    inputs = [tensor_info(k, v.dtype, v.shape) for k, v in feeds.items()]
    outputs = [helper.make_value_info(o, onnx.TypeProto()) for o in outs]
    extra = {domain: 1} if domain else None
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()]
    graph = helper.make_graph([node], op_type.lower(), inputs, outputs, inits)
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10 if opset >= 21 else 8)
    inferred = onnx_guard.infer_shapes(model)
    del model.graph.output[:]
    by_name = {vi.name: vi for vi in inferred.graph.value_info}
    by_name.update({vi.name: vi for vi in inferred.graph.output})
    for o in outs:
        vi = by_name.get(o) or helper.make_value_info(o, onnx.TypeProto())
        model.graph.output.append(vi)
    return model


def ort_session(model: onnx.ModelProto, optimize: bool = False):
    """An onnxruntime CPU session for `model` (graph optimizations off unless `optimize`)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    data = model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run `model` on onnxruntime's CPU provider with graph optimizations disabled."""
    return ort_session(model).run(None, dict(feeds))


def assert_matches_ort(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    rtol: float = 1e-5,
    atol: float = 1e-6,
    optimization: str = "all",
) -> list[np.ndarray]:
    """Run on onnxkiln and onnxruntime; assert equal dtypes, shapes and values. Returns ours."""
    from onnxkiln import InferenceSession

    session = InferenceSession.builder().optimization(optimization).from_graph(model)
    ours = session.run(dict(feeds))
    theirs = run_ort(model, feeds)
    assert len(ours) == len(theirs), f"{len(ours)} outputs vs onnxruntime's {len(theirs)}"
    for i, (a, b) in enumerate(zip(ours, theirs)):
        b = np.asarray(b)
        assert a.dtype == b.dtype, f"output {i}: dtype {a.dtype} vs onnxruntime's {b.dtype}"
        assert a.shape == b.shape, f"output {i}: shape {a.shape} vs onnxruntime's {b.shape}"
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {i}")
        elif a.dtype.kind in "biuUSO":
            np.testing.assert_array_equal(a, b, err_msg=f"output {i}")
        else:  # ml_dtypes (bfloat16, float8...): compare as float32
            a32, b32 = a.astype(np.float32), b.astype(np.float32)
            np.testing.assert_allclose(a32, b32, rtol=rtol, atol=atol, err_msg=f"output {i}")
    return ours


def run_ours(model: onnx.ModelProto, feeds: Mapping[str, Any]) -> list[Any]:
    """Run `model` on onnxkiln (default session) and return its outputs."""
    from onnxkiln import InferenceSession

    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def check_node(op_type: str, feeds: Mapping[str, np.ndarray], inits=None, opset: int = 21,
               n: int = 1, names: Sequence[str] | None = None, **attrs: Any) -> list[np.ndarray]:
    """One `op_type` node on onnxkiln and onnxruntime, compared; returns onnxkiln's outputs."""
    model = node_model(op_type, feeds, n_outputs=n, opset=opset, initializers=inits,
                       input_names=names, **attrs)
    return assert_matches_ort(model, feeds)


def run_node(op_type: str, feeds: Mapping[str, np.ndarray], inits=None, opset: int = 21,
             n: int = 1, names: Sequence[str] | None = None, **attrs: Any) -> list[Any]:
    """One `op_type` node on onnxkiln only (forms onnxruntime lacks, error cases)."""
    model = node_model(op_type, feeds, n_outputs=n, opset=opset, initializers=inits,
                       input_names=names, **attrs)
    return run_ours(model, feeds)


def build_kernel(op_type: str, opset: int, attrs: Mapping[str, Any] | None = None, *,
                 const: Sequence[Any] = (), n_inputs: int = 1, n_outputs: int = 1,
                 domain: str = "", registry: Any = None):
    """A CPU kernel built straight from the registry, for direct calls and error checks."""
    from onnxkiln.providers.base import NodeInfo

    if registry is None:
        from onnxkiln.providers.cpu.registry import REGISTRY as registry
    spec = registry.resolve(domain, op_type, opset)
    assert spec is not None, f"no kernel for {op_type} at opset {opset}"
    info = NodeInfo(
        name="n", op_type=op_type, domain=domain, opset=opset, attrs=dict(attrs or {}),
        n_inputs=n_inputs, n_outputs=n_outputs,
        input_present=(True,) * n_inputs, output_present=(True,) * n_outputs,
        const_inputs=tuple(const) + (None,) * (n_inputs - len(const)),
    )
    return spec.build(info)


def assert_same(ours: Any, theirs: Any, where: str = "output", rtol: float = 1e-6,
                atol: float = 1e-6) -> None:
    """Recursive equality of tensors, sequences (lists) and empty optionals (None)."""
    if theirs is None:
        assert ours is None, f"{where}: expected an empty optional, got {ours!r}"
        return
    if isinstance(theirs, list):
        assert isinstance(ours, list), f"{where}: expected a sequence, got {type(ours)}"
        assert len(ours) == len(theirs), f"{where}: length {len(ours)} vs {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{where}[{i}]", rtol, atol)
        return
    a, b = np.asarray(ours), np.asarray(theirs)
    assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} vs {b.dtype}"
    assert a.shape == b.shape, f"{where}: shape {a.shape} vs {b.shape}"
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=where)


def check_outputs_against_ort(model: onnx.ModelProto, feeds: Mapping[str, Any]) -> list[Any]:
    """All outputs (tensors, sequences, optionals) of onnxkiln vs onnxruntime; returns ours."""
    from onnxkiln import InferenceSession

    ours = [o.value for o in InferenceSession.from_graph(model).run_outputs(dict(feeds))]
    theirs = run_ort(model, feeds)
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_same(a, b, f"output {i}")
    return ours
