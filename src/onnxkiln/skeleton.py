"""A light protobuf copy of a model for onnx shape inference: large initializers become
typed graph inputs, so inference never copies the weights, and main-graph nodes leave out
their doc strings and metadata (exporters write a stack trace per node: on a torch export
of GPT-2 they are 93% of the copy's bytes, which the checker and inference would parse)."""

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
    graph.node.extend(_node(n) for n in g)
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


def _node(node: ir.Node) -> onnx.NodeProto:
    """The node as shape inference reads it: op, value names and attributes."""
    proto = onnx.NodeProto(op_type=node.op_type)
    if node.domain:
        proto.domain = node.domain
    if node.name:
        proto.name = node.name
    if node.overload:
        proto.overload = node.overload
    proto.input.extend("" if v is None else v.name for v in node.inputs)
    outputs = list(node.outputs)
    while outputs and not outputs[-1].name:  # as onnx_ir writes them: no trailing blanks
        outputs.pop()
    proto.output.extend(v.name or "" for v in outputs)
    for a in node.attributes.values():
        into = (ir.serde.serialize_reference_attribute_into if a.is_ref()
                else ir.serde.serialize_attribute_into)
        into(proto.attribute.add(), from_=a)
    return proto
