"""Runs one ONNX node through the CPU provider (numpy) and the CUDA provider's torch kernels
on torch's CPU device, and compares dtype, shape and values.

The NodeInfo is built exactly as the planner builds it (onnxkiln.plan._node_info over the
loaded onnx_ir graph), initializers appear as constant inputs, and host_inputs positions are
passed to the torch kernel as numpy arrays.

ONNXKILN_TORCH_TEST_DEVICE (default "cpu") runs the torch side on another device, e.g.
"cuda" in the GPU check; TF32 is then switched off so float32 tolerances still hold.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import torch

from onnxkiln import loader
from onnxkiln.plan import _node_info
from onnxkiln.providers.cpu import REGISTRY as CPU
from onnxkiln.providers.cuda import REGISTRY as CUDA
from onnxkiln.providers.cuda.device import device_scope
from onnxkiln.providers.cuda.dtypes import to_numpy, to_torch
from onnxkiln.testing import node_model

__all__ = ["DEVICE", "check", "check_node", "node_info", "reason", "run_graph", "run_session"]

DEVICE = os.environ.get("ONNXKILN_TORCH_TEST_DEVICE", "cpu")
if DEVICE != "cpu":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

TOL = {
    np.dtype(np.float64): (1e-9, 1e-10),
    np.dtype(np.float32): (1e-5, 1e-5),
    np.dtype(np.float16): (2e-3, 2e-3),
}
BF16_TOL = (2e-2, 2e-2)


def node_info(model: onnx.ModelProto):
    """(NodeInfo, values of the node's inputs known as initializers) for a one-node model."""
    ir_model = loader.from_graph(model)
    graph = ir_model.graph
    (node,) = list(graph)
    domain = node.domain if node.domain not in ("ai.onnx",) else ""
    opset = ir_model.opset_imports.get(domain, ir_model.opset_imports.get("", 1))
    names = {v.name for v in graph.inputs}
    in_slots, constants = [], {}
    for i, v in enumerate(node.inputs):
        if v is None or not v.name:
            in_slots.append(None)
            continue
        in_slots.append(i)
        if v.name not in names and v.const_value is not None:
            constants[i] = v.const_value.numpy()
    out_slots = [100 + i if v is not None and v.name else None for i, v in enumerate(node.outputs)]
    info = _node_info(node, domain, opset, in_slots, out_slots, constants, {})
    return info, constants, node


def reason(model: onnx.ModelProto) -> str | None:
    """The CUDA registry's decline reason for the node (None: served)."""
    info, _, _ = node_info(model)
    spec = CUDA.resolve(info.domain, info.op_type, info.opset)
    assert spec is not None, f"no CUDA kernel for {info.describe()}"
    return spec.supports(info) if spec.supports is not None else None


def _assert_close(a: np.ndarray, b: np.ndarray, rtol, atol, what: str) -> None:
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} (torch) vs {b.dtype} (numpy)"
    assert a.shape == b.shape, f"{what}: shape {a.shape} (torch) vs {b.shape} (numpy)"
    if a.dtype.kind in "biu":
        np.testing.assert_array_equal(a, b, err_msg=what)
        return
    a32, b32 = a.astype(np.float64), b.astype(np.float64)
    if rtol is None:
        rtol, atol = TOL.get(a.dtype, BF16_TOL)
    np.testing.assert_allclose(a32, b32, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """float8 and int4/uint4/int2/uint2 tensors as their bytes (torch cannot copy or compare
    the sub-byte shell dtypes, nor NaN-compare float8); others as they are."""
    if t.dtype.itemsize == 1 and t.dtype not in (torch.int8, torch.uint8, torch.bool):
        return t.view(torch.uint8)
    return t


def check(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], rtol: float | None = None,
          atol: float | None = None, outputs: tuple[int, ...] | None = None) -> list[Any]:
    """Run the node on both providers and assert equal results. Returns the torch outputs."""
    info, constants, node = node_info(model)
    values: list[np.ndarray | None] = []
    for i, v in enumerate(node.inputs):
        if v is None or not v.name:
            values.append(None)
        elif i in constants:
            values.append(constants[i])
        else:
            values.append(np.asarray(feeds[v.name]))
    cpu_spec = CPU.resolve(info.domain, info.op_type, info.opset)
    spec = CUDA.resolve(info.domain, info.op_type, info.opset)
    assert spec is not None, f"no CUDA kernel for {info.describe()}"
    why = spec.supports(info) if spec.supports is not None else None
    assert why is None, f"CUDA kernel declined {info.describe()}: {why}"
    expected = cpu_spec.build(info)(*values)
    with device_scope(DEVICE):
        fn = spec.build(info)
    args, before = [], []
    for i, v in enumerate(values):
        if v is None or i in spec.host_inputs:
            args.append(v)
        else:
            t = to_torch(v, DEVICE)
            args.append(t)
            before.append((t, _bytes(t).clone()))
    got = fn(*args)
    for t, copy in before:  # never written
        t = _bytes(t)
        assert torch.equal(t, copy) or (t.is_floating_point() and torch.equal(
            torch.nan_to_num(t), torch.nan_to_num(copy))), "kernel wrote into an input"
    if not cpu_spec.multi_output:
        expected = (expected,)
    if not spec.multi_output:
        got = (got,)
    result = []
    for i in range(info.n_outputs):
        if outputs is not None and i not in outputs:
            continue
        if not info.output_present[i] or i >= len(expected) or expected[i] is None:
            continue
        g = got[i]
        if spec.host_outputs:
            assert isinstance(g, np.ndarray), f"output {i}: host output is {type(g)}"
            gn = g
        else:
            assert isinstance(g, torch.Tensor), f"output {i}: {type(g)}, not a torch tensor"
            assert g.device.type == torch.device(DEVICE).type, f"output {i} on {g.device}"
            if not spec.view:
                for t, _ in before:
                    if t.numel() and g.numel():
                        assert g.untyped_storage().data_ptr() != \
                            t.untyped_storage().data_ptr(), f"output {i} aliases an input"
            gn = to_numpy(g)
        _assert_close(gn, np.asarray(expected[i]), rtol, atol, f"{info.op_type} output {i}")
        result.append(g)
    return result


def check_node(op_type: str, feeds: Mapping[str, np.ndarray], *, initializers=None,
               n_outputs: int = 1, opset: int = 21, domain: str = "", input_names=None,
               rtol=None, atol=None, **attrs) -> list[Any]:
    """`check(node_model(...))` in one call."""
    model = node_model(op_type, feeds, n_outputs=n_outputs, opset=opset,
                       initializers=initializers, domain=domain, input_names=input_names,
                       **attrs)
    return check(model, feeds, rtol=rtol, atol=atol)


def run_graph(ir_model, feeds: Mapping[str, np.ndarray], device: bool) -> list[np.ndarray]:
    """Run a whole loaded model node by node on one registry (no partitioner): the CPU
    provider's numpy kernels, or (device=True) the torch kernels on torch's CPU device with
    values moved between host and device where host_inputs/host_outputs ask."""
    graph = ir_model.graph
    imports = dict(ir_model.opset_imports)
    values: dict[str, Any] = {k: _host(v) for k, v in feeds.items()}
    for name, v in graph.initializers.items():
        values[name] = v.const_value.numpy()
    registry = CUDA if device else CPU
    for node in graph:
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = imports.get(domain, 1)
        spec = registry.resolve(domain, node.op_type, opset)
        assert spec is not None, f"no kernel for {domain}::{node.op_type}@{opset}"
        in_slots = [None if v is None or not v.name else i for i, v in enumerate(node.inputs)]
        consts = {i: values[v.name] for i, v in enumerate(node.inputs)
                  if v is not None and v.name in graph.initializers}
        out_slots = [100 + i if v is not None and v.name else None
                     for i, v in enumerate(node.outputs)]
        info = _node_info(node, domain, opset, in_slots, out_slots, consts, {})
        if device and spec.supports is not None:
            why = spec.supports(info)
            assert why is None, f"{info.describe()} declined: {why}"
        with device_scope(DEVICE):
            fn = spec.build(info)
        args = []
        for i, v in enumerate(node.inputs):
            a = None if v is None or not v.name else values[v.name]
            if device and a is not None:
                if i in spec.host_inputs:
                    a = to_numpy(a) if isinstance(a, torch.Tensor) else a
                elif isinstance(a, list):  # a sequence (inside an optional or not)
                    a = [e if isinstance(e, torch.Tensor) else to_torch(e, DEVICE) for e in a]
                elif not isinstance(a, torch.Tensor):
                    a = to_torch(a, DEVICE)
            args.append(a)
        out = fn(*args)
        outs = out if spec.multi_output else (out,)
        for v, o in zip(node.outputs, outs):
            if v is not None and v.name:
                values[v.name] = o
    return [_to_host(values[v.name]) for v in graph.outputs]


def run_session(model: onnx.ModelProto, feeds: Mapping[str, Any]) -> list[Any]:
    """Run a model in a session on the torch provider alone (control flow included): a node
    the provider declines fails the build with "declined: <reason>"."""
    import onnxkiln as ok
    from onnxkiln.errors import ExecutionProviderUnavailableError

    options = {"testing.cuda_on_torch_cpu": "1"} if DEVICE == "cpu" else {}
    try:
        session = ok.InferenceSession(model.SerializeToString(), providers=["cuda"],
                                      options=options)
    except ExecutionProviderUnavailableError as e:
        reasons = [line.split(": ", 1)[-1] for line in str(e).splitlines()[1:]
                   if line.startswith("  ")]
        raise AssertionError(f"declined: {reasons[0] if reasons else e}") from None
    return list(session.run(None, dict(feeds)))


def _host(v: Any) -> Any:
    """A feed as the kernels take it: None (an empty optional), a list (a sequence) of
    arrays, or an array."""
    if v is None:
        return None
    if isinstance(v, list):
        return [np.asarray(e) for e in v]
    return np.asarray(v)


def _to_host(o: Any) -> Any:
    if o is None:
        return None
    if isinstance(o, list):
        return [_to_host(e) for e in o]
    return to_numpy(o) if isinstance(o, torch.Tensor) else np.asarray(o)
