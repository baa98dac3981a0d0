"""`onnx.backend.base.Backend` over onnxkiln, so onnx's backend tests and tools run on it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from onnxkiln.errors import InvalidOptionError, ModelLoadError
from onnxkiln.session import InferenceSession

__all__ = ["OnnxkilnBackend", "OnnxkilnRep", "prepare", "run_model", "run_node", "supports_device"]


class OnnxkilnRep(BackendRep):
    """A prepared model: runs positional or named inputs, returns outputs in graph order."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self._names = [m.name for m in session.inputs()]
        self._required = [m.name for m in session.inputs() if not m.optional]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Inputs as a list (graph input order), a dict, or a single array."""
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            names = self._names if len(inputs) > len(self._required) else self._required
            feeds = dict(zip(names, inputs))
        return tuple(o.value for o in self.session.run_outputs(feeds))


class OnnxkilnBackend(Backend):
    """The onnx backend API: prepare / run_model / run_node / supports_device."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str | os.PathLike | bytes, device: str = "CPU",
                **kwargs: Any) -> OnnxkilnRep:
        """Build a session for `model` (a ModelProto, a model path or its serialized bytes)
        on `device` ("CPU")."""
        if not cls.supports_device(device):
            raise InvalidOptionError(f"onnxkiln backend does not support device {device!r}")
        builder = InferenceSession.builder().device("cpu")
        if isinstance(model, str | os.PathLike):
            return OnnxkilnRep(builder.load(model))
        if isinstance(model, bytes | bytearray | memoryview):
            return OnnxkilnRep(builder.load_bytes(bytes(model)))
        if isinstance(model, onnx.ModelProto):
            return OnnxkilnRep(builder.from_graph(model))
        raise ModelLoadError(
            f"prepare: give a model path, its bytes or an onnx.ModelProto, got "
            f"{type(model).__name__}")

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[Any, ...]:
        """Prepare and run once."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Sequence[Any],
        device: str = "CPU",
        outputs_info: Sequence[tuple[Any, Any]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run a single node on numpy inputs, wrapped in a one-node model."""
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        names = [n for n in node.input if n]
        graph_inputs = [
            onnx.helper.make_tensor_value_info(
                n, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype), np.shape(x)
            )
            for n, x in zip(names, inputs)
        ]
        graph_outputs = [onnx.helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o]
        graph = onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opsets = [onnx.helper.make_opsetid("", opset)]
        if node.domain not in ("", "ai.onnx"):
            opsets.append(onnx.helper.make_opsetid(node.domain, 1))
        model = onnx.helper.make_model(graph, opset_imports=opsets)
        return cls.run_model(model, dict(zip(names, inputs)), device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """CPU always; CUDA once the CUDA provider exists."""
        return str(device).upper().startswith("CPU")


prepare = OnnxkilnBackend.prepare
run_model = OnnxkilnBackend.run_model
run_node = OnnxkilnBackend.run_node
supports_device = OnnxkilnBackend.supports_device
