"""Facts read from the ONNX operator schemas (attribute defaults, cached per op and opset),
and checks of attribute values the schemas constrain but onnx does not enforce."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import onnx

__all__ = ["check_arity", "positive_int_attr", "schema_defaults"]


@functools.cache
def schema_defaults(op_type: str, domain: str, opset: int) -> Mapping[str, Any]:
    """Attribute name -> default value (Python/numpy) for the schema serving this opset."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return {}
    out: dict[str, Any] = {}
    for name, attr in schema.attributes.items():
        default = attr.default_value
        if default.type == onnx.AttributeProto.UNDEFINED:
            continue
        value = onnx.helper.get_attribute_value(default)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [x.decode() for x in value]
        elif isinstance(value, onnx.TensorProto):
            value = onnx.numpy_helper.to_array(value)
        out[name] = value
    return out


@functools.cache
def _max_inputs(op_type: str, domain: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op_type, opset, domain).max_input
    except onnx.defs.SchemaError:
        return None


def check_arity(op_type: str, domain: str, opset: int, n_inputs: int) -> None:
    """Refuse a node with more inputs than its schema allows (onnxruntime refuses the model;
    the kernel would be called with an argument it does not take). Extra outputs are the
    planner's to judge: an unused one is ignored, a used one refused."""
    most = _max_inputs(op_type, domain, opset)
    if most is not None and n_inputs > most:
        raise ValueError(f"{op_type} (opset {opset}) takes at most {most} inputs; "
                         f"the node has {n_inputs}")


def positive_int_attr(attrs: Mapping[str, Any], name: str, op: str, default: int = 1) -> int:
    """An integer attribute that must be >= 1 (Conv's `group`): absent means `default`,
    0 or a negative value is refused rather than read as the default."""
    value = int(attrs.get(name, default))
    if value < 1:
        raise ValueError(f"{op}: attribute '{name}' must be >= 1, got {value}")
    return value
