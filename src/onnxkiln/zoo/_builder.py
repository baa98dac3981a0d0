"""The model builder the zoo generators share (exporter-like names, seeded weights), and
`random_inputs`, which makes valid feeds for any zoo model."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["OPSET", "random_inputs"]

OPSET = 17
_F32_MIN = float(np.finfo(np.float32).min)
_HINT = "onnxkiln.zoo."
_I64 = np.int64


class _Builder:
    """Collects nodes and initializers with exporter-like names; weights from a seeded RNG."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._consts: dict[tuple, str] = {}
        self._scope = ""
        self._count = 0

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        outer, self._scope = self._scope, f"{self._scope}/{name}"
        try:
            yield
        finally:
            self._scope = outer

    def op(self, op_type: str, *inputs: str, n_out: int = 1, **attrs: Any) -> Any:
        """Append a node; returns its output name (a list of names when n_out > 1)."""
        self._count += 1
        name = f"{self._scope}/{op_type}_{self._count}"
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        """A Constant node (one per distinct value) holding `value`; 0-D for a scalar."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._count += 1
            name = f"/Constant_{self._count}"
            tensor = numpy_helper.from_array(arr, f"{name}_value")
            self.nodes.append(helper.make_node("Constant", [], [f"{name}_output_0"], name=name,
                                               value=tensor))
            self._consts[key] = f"{name}_output_0"
        return self._consts[key]

    def param(self, name: str, array: np.ndarray) -> str:
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def normal(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        values = self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)
        return self.param(name, values + np.float32(mean) if mean else values)

    def linear(self, x: str, prefix: str, d_in: int, d_out: int) -> str:
        """nn.Linear on a 3-D input as torch exports it: MatMul by the [in, out] weight, Add."""
        w = self.normal(f"{prefix}.weight", (d_in, d_out), d_in**-0.5)
        bias = self.normal(f"{prefix}.bias", (d_out,), 0.02)
        return self.op("Add", self.op("MatMul", x, w), bias)

    def layer_norm(self, x: str, prefix: str, dim: int, eps: float) -> str:
        gamma = self.normal(f"{prefix}.weight", (dim,), 0.1, mean=1.0)
        beta = self.normal(f"{prefix}.bias", (dim,), 0.1)
        return self.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps)

    def rename(self, value: str, new: str) -> str:
        """Give a value a public name (a graph output), in its producer and all consumers."""
        for node in self.nodes:
            for field in (node.input, node.output):
                for i, name in enumerate(field):
                    if name == value:
                        field[i] = new
        return new

    def finish(self, name: str, inputs: list, outputs: list, hints: dict[str, str]
               ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  ir_version=8, producer_name="onnxkiln.zoo")
        helper.set_model_props(model, {_HINT + k: v for k, v in hints.items()})
        onnx.checker.check_model(model)
        return model


def _f32(name: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _i64(name: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.INT64, list(shape))


def _config(cfg: Any, cls: type, overrides: dict[str, Any]) -> Any:
    cfg = cfg if cfg is not None else cls()
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


# --- inputs ---------------------------------------------------------------------------------


def random_inputs(model: onnx.ModelProto, seed: int = 0, **dims: int) -> dict[str, np.ndarray]:
    """Valid feeds for `model`'s declared inputs; symbolic dims bound by `dims` (e.g. seq=8).

    Zoo models carry hints in metadata_props: default dim sizes, token id ranges, and which
    inputs are padding masks (1s then trailing 0s per row; row 0 unpadded). Other inputs get
    standard normal floats, small non-negative integers, or random booleans.
    """
    props = {p.key: p.value for p in model.metadata_props}
    sizes = {k: int(v) for k, v in (kv.split("=") for kv in props.get(_HINT + "dims", "").split(",")
                                    if kv)}
    sizes.update(dims)
    rng = np.random.default_rng(seed)
    initialized = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initialized:
            continue
        tt = vi.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in sizes:
                shape.append(sizes[d.dim_param])
            else:
                raise ValueError(f"input {vi.name!r}: symbolic dim {d.dim_param!r} has no size; "
                                 f"pass it, e.g. random_inputs(model, {d.dim_param}=4)")
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[vi.name] = _sample(rng, dtype, tuple(shape), props.get(f"{_HINT}input.{vi.name}"))
    return feeds


def _sample(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...],
            hint: str | None) -> np.ndarray:
    if hint == "mask":
        mask = np.ones(shape, dtype=dtype)
        seq = shape[-1]
        for row in range(1, shape[0]):
            mask[row, seq - int(rng.integers(0, seq // 2 + 1)):] = 0
        return mask
    if hint and hint.startswith("int:"):
        lo, hi = (int(v) for v in hint.split(":")[1:])
        return rng.integers(lo, hi, size=shape, dtype=dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, size=shape, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)
