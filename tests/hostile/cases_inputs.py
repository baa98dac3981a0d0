"""Odd run inputs (ndarray subclasses, Python lists that do not fit the dtype), attribute
values the schema forbids, and bindings with impossible shapes: each handled as onnxruntime
handles it, through onnxruntime's API (onnxkiln.compat on onnxkiln)."""

from __future__ import annotations

import numpy as np
from harness import case
from onnx import TensorProto, helper, numpy_helper


def _model(node, x_type, x_shape, initializers=(), opset=17) -> bytes:
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", x_type, x_shape)],
        [helper.make_tensor_value_info(node.output[0], x_type, None)], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model.SerializeToString()


def _run(rt, node, x_type, x_shape, value, initializers=()):
    sess = rt.ort.InferenceSession(_model(node, x_type, x_shape, initializers),
                                   providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": value})[0]


@case("inputs handled as onnxruntime does", "ok")
def case_matrix_unsqueeze(rt, tmp):
    """np.matrix into Unsqueeze: a plain 3-D result, not a 2-D matrix."""
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    node = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    y = _run(rt, node, TensorProto.FLOAT, [2, 2], np.matrix([[1, 2], [3, 4]], np.float32),
             [axes])
    assert type(y) is np.ndarray and y.shape == (1, 2, 2), (type(y), y.shape)


@case("inputs handled as onnxruntime does", "ok")
def case_matrix_reduce_sum(rt, tmp):
    """np.matrix into ReduceSum(keepdims=0): a scalar, not (1, 1)."""
    node = helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)
    y = _run(rt, node, TensorProto.FLOAT, [2, 2], np.matrix([[1, 2], [3, 4]], np.float32))
    assert np.shape(y) == () and float(y) == 10.0, (np.shape(y), y)


@case("inputs handled as onnxruntime does", "ok")
def case_masked_cumsum(rt, tmp):
    """A masked array into CumSum: its data, masked entries included (as onnxruntime)."""
    axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
    node = helper.make_node("CumSum", ["x", "axis"], ["y"])
    x = np.ma.masked_array(np.array([1, 2, 3], np.float32), mask=[0, 1, 0])
    y = _run(rt, node, TensorProto.FLOAT, [3], x, [axis])
    assert type(y) is np.ndarray and y.tolist() == [1.0, 3.0, 6.0], y


def _refuses_list(rt, x_type, value) -> None:
    node = helper.make_node("Identity", ["x"], ["y"])
    y = _run(rt, node, x_type, [None], value)
    raise AssertionError(f"{value} was accepted as {y!r}")


@case("inputs handled as onnxruntime does", "refused")
def case_list_int8_overflow(rt, tmp):
    """[200, -129] for an int8 input: refused, not wrapped to [-56, 127]."""
    _refuses_list(rt, TensorProto.INT8, [200, -129])


@case("inputs handled as onnxruntime does", "refused")
def case_list_int32_overflow(rt, tmp):
    """2**40 for an int32 input: refused, not truncated to 0."""
    _refuses_list(rt, TensorProto.INT32, [2**40])


@case("inputs handled as onnxruntime does", "refused", on_ort=True)
def case_list_float16_overflow(rt, tmp):
    """1e6 for a float16 input: refused, not made inf (onnxruntime makes it inf)."""
    _refuses_list(rt, TensorProto.FLOAT16, [1e6])


@case("inputs handled as onnxruntime does", "ok")
def case_list_in_range(rt, tmp):
    """Python ints that fit the input's dtype still convert."""
    node = helper.make_node("Identity", ["x"], ["y"])
    y = _run(rt, node, TensorProto.INT8, [None], [-128, 127])
    assert y.dtype == np.int8 and y.tolist() == [-128, 127], y


@case("accepted what should be refused", "refused")
def case_conv_group_zero(rt, tmp):
    """A Conv with group=0: refused, not run as group=1."""
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=0)
    y = _run(rt, node, TensorProto.FLOAT, [1, 2, 3, 3], np.ones((1, 2, 3, 3), np.float32), [w])
    raise AssertionError(f"ran and gave shape {y.shape}")


def _bind_with_shape(rt, shape) -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    sess = rt.ort.InferenceSession(_model(node, TensorProto.FLOAT, [None]),
                                   providers=["CPUExecutionProvider"])
    value = rt.ort.OrtValue.ortvalue_from_numpy(np.arange(4, dtype=np.float32) - 2)
    binding = sess.io_binding()
    binding.bind_input("x", "cpu", 0, np.float32, shape, value.data_ptr())
    binding.bind_output("y")
    sess.run_with_iobinding(binding)
    y = binding.copy_outputs_to_cpu()[0]
    raise AssertionError(f"bound with shape {shape} and ran: {y!r}")


@case("accepted what should be refused", "refused")
def case_bind_input_shape_minus_one(rt, tmp):
    """io_binding().bind_input with shape [-1]: refused."""
    _bind_with_shape(rt, [-1])


@case("accepted what should be refused", "refused")
def case_bind_input_shape_minus_two(rt, tmp):
    """io_binding().bind_input with shape [-2]: refused."""
    _bind_with_shape(rt, [-2])
