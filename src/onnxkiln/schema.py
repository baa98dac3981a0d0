"""Facts read from the ONNX operator schemas (attribute defaults), cached per op and opset."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import onnx

__all__ = ["schema_defaults"]


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
