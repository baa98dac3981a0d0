"""Models whose external data points outside their folder, one for each place ONNX lets a
tensor sit, for the hostile cases (`cases_external.py`) and the loader's tests.

`write_secret(tmp)` puts a secret file beside the model's folder (and a symlink to it
inside); `escape_model(kind, location)` is a model of that kind whose one external tensor
reads the secret at `location`. Every such model must be refused before a byte is read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

SECRET_INDICES = np.arange(4, dtype=np.int64)  # bytes 0-31 of the secret file
SECRET_VALUES = np.array([1234.5, -8765.25, 31337.0, 4242.125], np.float32)  # bytes 32-47
SECRET_BYTES = SECRET_INDICES.tobytes() + SECRET_VALUES.tobytes()
OPSET = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
KINDS = ("initializer", "constant", "node_attribute", "function_node", "function_default",
         "if_initializer", "loop_attribute", "sparse_initializer_values",
         "sparse_initializer_indices", "sparse_attribute")


def write_secret(tmp: Path) -> tuple[Path, list[str]]:
    """The model folder `tmp/model` and the locations that reach `tmp/secret.bin` from it:
    through `..`, absolutely, and through a symlink inside the folder."""
    folder = tmp / "model"
    folder.mkdir()
    secret = tmp / "secret.bin"
    secret.write_bytes(SECRET_BYTES)
    (folder / "link.bin").symlink_to(secret)
    return folder, ["../secret.bin", str(secret), "link.bin"]


def external(name: str, location: str, indices: bool = False, count: int = 4) -> TensorProto:
    """A tensor of `count` float32 values (or int64 indices) read from `location`."""
    t = TensorProto(name=name, dims=[count], data_location=TensorProto.EXTERNAL,
                    data_type=TensorProto.INT64 if indices else TensorProto.FLOAT)
    where = {"location": location, "offset": "0" if indices else "32",
             "length": str(count * (8 if indices else 4))}
    for key, value in where.items():
        t.external_data.add(key=key, value=value)
    return t


def _model(nodes, inits=(), functions=(), sparse=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "main", [], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], list(inits), sparse_initializer=list(sparse))
    return helper.make_model(graph, opset_imports=OPSET, functions=list(functions),
                             ir_version=10)


def _sparse(name: str, location: str, external_part: str) -> onnx.SparseTensorProto:
    values = (external(name, location) if external_part == "values"
              else helper.make_tensor(name, TensorProto.FLOAT, [4], SECRET_VALUES * 0 + 1))
    indices = (external(name + "_i", location, indices=True) if external_part == "indices"
               else helper.make_tensor(name + "_i", TensorProto.INT64, [4], [0, 1, 2, 3]))
    return helper.make_sparse_tensor(values, indices, [4])


def _branch(name: str, nodes, inits=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(
        "b", TensorProto.FLOAT, None)], list(inits))


def escape_model(kind: str, location: str) -> onnx.ModelProto:
    """A model of `kind` (one of KINDS) whose output is the tensor read from `location`."""
    w = external("w", location)
    if kind == "initializer":
        return _model([helper.make_node("Identity", ["w"], ["y"])], [w])
    if kind == "constant":
        return _model([helper.make_node("Constant", [], ["y"], value=w)])
    if kind == "node_attribute":  # ConstantOfShape fills with its one element
        shape = helper.make_tensor("shape", TensorProto.INT64, [1], [4])
        value = external("w", location, count=1)
        return _model([helper.make_node("ConstantOfShape", ["shape"], ["y"], value=value)],
                      [shape])
    if kind in ("function_node", "function_default"):
        if kind == "function_node":
            body = helper.make_node("Constant", [], ["out"], value=w)
            defaults = []
        else:
            body = helper.make_node("Constant", [], ["out"])
            body.attribute.append(onnx.AttributeProto(
                name="value", ref_attr_name="v", type=onnx.AttributeProto.TENSOR))
            defaults = [helper.make_attribute("v", w)]
        func = helper.make_function("local", "Secret", [], ["out"], [body], OPSET,
                                    attribute_protos=defaults)
        return _model([helper.make_node("Secret", [], ["y"], domain="local")],
                      functions=[func])
    if kind in ("if_initializer", "loop_attribute"):
        cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
        if kind == "if_initializer":
            then = _branch("then", [helper.make_node("Identity", ["w"], ["b"])], [w])
            other = _branch("else", [helper.make_node("Constant", [], ["b"], value_floats=[0.0])])
            return _model([helper.make_node("If", ["cond"], ["y"], then_branch=then,
                                            else_branch=other)], [cond])
        body = helper.make_graph(
            [helper.make_node("Identity", ["c"], ["c_out"]),
             helper.make_node("Constant", [], ["b"], value=w)], "body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
            [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
        trips = helper.make_tensor("trips", TensorProto.INT64, [], [1])
        return _model([helper.make_node("Loop", ["trips", "cond"], ["y"], body=body)],
                      [cond, trips])
    if kind.startswith("sparse_initializer"):
        part = kind.removeprefix("sparse_initializer_")
        return _model([helper.make_node("Identity", ["w"], ["y"])],
                      sparse=[_sparse("w", location, part)])
    if kind == "sparse_attribute":
        return _model([helper.make_node("Constant", [], ["y"],
                                        sparse_value=_sparse("w", location, "values"))])
    raise ValueError(f"unknown escape kind {kind!r}")
