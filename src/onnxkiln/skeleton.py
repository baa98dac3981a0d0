"""A light protobuf copy of a model for onnx shape inference: large initializers become
typed graph inputs, so inference never copies the weights."""

from __future__ import annotations

import onnx
import onnx_ir as ir

__all__ = ["skeleton"]


def skeleton(model: ir.Model, small_bytes: int = 1024, value_info: bool = False
             ) -> onnx.ModelProto:
    """The model as a proto: nodes, inputs, outputs, functions, initializers of at most
    `small_bytes` (shape computations read them); larger ones become typed inputs. With
    `value_info`, the intermediate types the IR already knows are kept as hints."""
    g = model.graph
    graph = onnx.GraphProto(name=g.name or "graph")
    graph.node.extend(ir.serde.serialize_node(n) for n in g)
    graph.input.extend(ir.serde.serialize_value(v) for v in g.inputs)
    graph.output.extend(ir.serde.serialize_value(v) for v in g.outputs)
    for name, value in g.initializers.items():
        tensor = value.const_value
        if tensor is None:
            continue
        if tensor.nbytes <= small_bytes:
            graph.initializer.append(ir.serde.serialize_tensor(tensor))
            graph.initializer[-1].name = name
        elif not value.is_graph_input():
            graph.input.append(onnx.helper.make_tensor_value_info(
                name, tensor.dtype.value, list(tensor.shape.numpy())))
    if value_info:
        for node in g:
            graph.value_info.extend(ir.serde.serialize_value(v) for v in node.outputs
                                    if v.name and v.type is not None and not v.is_graph_output())
    proto = onnx.helper.make_model(graph, ir_version=max(model.ir_version or 8, 4))
    del proto.opset_import[:]
    proto.opset_import.extend(onnx.helper.make_opsetid(d, v)
                              for d, v in model.opset_imports.items())
    proto.functions.extend(ir.serde.serialize_function(f) for f in model.functions.values())
    return proto
