"""External data and tensor sizes: data read from outside the model's folder (through each
place a tensor can sit, by `..`, an absolute path and a symlink), dims the file or the
protobuf does not hold, lengths that differ from the tensor, locations no file system
takes, and sparse tensors, which onnxruntime makes dense."""

from __future__ import annotations

import numpy as np
import onnx
from escapes import SECRET_BYTES, SECRET_VALUES, escape_model, write_secret
from harness import case, classify
from onnx import TensorProto, helper

ESCAPE = "external data read from outside the model's folder"
SIZES = "sizes checked against the data before mapping or allocating"
LOCATIONS = "external-data locations no file system takes"
SPARSE = "refused what is valid: sparse tensors"


def _session(rt, path):
    return rt.ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _refuse_escapes(rt, tmp, kind):
    """Load the `kind` model three times (`..`, absolute, symlink); each must be refused,
    without the secret in the message; the first refusal is raised for the harness."""
    folder, locations = write_secret(tmp)
    errors = []
    for i, location in enumerate(locations):
        path = folder / f"m{i}.onnx"
        onnx.save(escape_model(kind, location), path)
        try:
            out = _session(rt, path).run(None, {})[0]
        except Exception as e:  # classified below
            errors.append(e)
            continue
        leaked = np.isin(SECRET_VALUES, np.asarray(out, np.float32)).any()
        raise AssertionError(f"{kind} at {location!r} loaded and ran (secret read: {leaked})")
    for e in errors:
        if classify(e, rt.name)[0] != "refused":
            raise e
        assert "1234.5" not in str(e) and SECRET_BYTES[32:] not in str(e).encode(), str(e)
    raise errors[0]


@case(ESCAPE, "refused")
def case_external_escape_initializer(rt, tmp):
    """An initializer's external data outside the folder."""
    _refuse_escapes(rt, tmp, "initializer")


@case(ESCAPE, "refused")
def case_external_escape_constant(rt, tmp):
    """A Constant's value tensor with external data outside the folder."""
    _refuse_escapes(rt, tmp, "constant")


@case(ESCAPE, "refused")
def case_external_escape_node_attribute(rt, tmp):
    """ConstantOfShape's value attribute with external data outside the folder."""
    _refuse_escapes(rt, tmp, "node_attribute")


@case(ESCAPE, "refused")
def case_external_escape_function_node(rt, tmp):
    """A Constant inside a model-local function, its data outside the folder."""
    _refuse_escapes(rt, tmp, "function_node")


@case(ESCAPE, "refused")
def case_external_escape_function_default(rt, tmp):
    """A function's default attribute value with external data outside the folder."""
    _refuse_escapes(rt, tmp, "function_default")


@case(ESCAPE, "refused")
def case_external_escape_if_initializer(rt, tmp):
    """An initializer of an If branch with external data outside the folder."""
    _refuse_escapes(rt, tmp, "if_initializer")


@case(ESCAPE, "refused")
def case_external_escape_loop_attribute(rt, tmp):
    """A Constant in a Loop body with external data outside the folder."""
    _refuse_escapes(rt, tmp, "loop_attribute")


@case(ESCAPE, "refused")
def case_external_escape_sparse_values(rt, tmp):
    """A sparse initializer's values with external data outside the folder."""
    _refuse_escapes(rt, tmp, "sparse_initializer_values")


@case(ESCAPE, "refused")
def case_external_escape_sparse_indices(rt, tmp):
    """A sparse initializer's indices with external data outside the folder."""
    _refuse_escapes(rt, tmp, "sparse_initializer_indices")


@case(ESCAPE, "refused")
def case_external_escape_sparse_attribute(rt, tmp):
    """A Constant's sparse_value with external values outside the folder."""
    _refuse_escapes(rt, tmp, "sparse_attribute")


@case(ESCAPE, "refused")
def case_external_from_bytes_without_folder(rt, tmp):
    """Model bytes whose initializer names an external file: no folder to read it from."""
    (tmp / "w.bin").write_bytes(SECRET_BYTES)
    model = escape_model("initializer", "w.bin")
    rt.ort.InferenceSession(model.SerializeToString(),
                            providers=["CPUExecutionProvider"]).run(None, {})


def _save(tmp, tensor, data=b"\0" * 64):
    """A model whose output is `tensor` (an initializer), its file `w.bin` holding `data`."""
    folder = tmp / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(data)
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", tensor.data_type, None)],
                              [tensor])
    path = folder / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                                ir_version=10), path)
    return path


def _external(location="w.bin", dims=(4,), dtype=TensorProto.FLOAT, **info):
    t = TensorProto(name="w", dims=list(dims), data_type=dtype,
                    data_location=TensorProto.EXTERNAL)
    for key, value in {"location": location, **info}.items():
        t.external_data.add(key=key, value=str(value))
    return t


@case(SIZES, "refused", memory=512 << 20)
def case_external_huge_dims_small_file(rt, tmp):
    """Dims of 16 GB over a 64-byte external file."""
    _session(rt, _save(tmp, _external(dims=(1 << 16, 1 << 16)))).run(None, {})


@case(SIZES, "refused", memory=512 << 20)
def case_raw_data_int4_huge_dims(rt, tmp):
    """An int4 initializer of 4 raw bytes declaring 2^32 elements (8 GB once unpacked)."""
    t = TensorProto(name="w", dims=[1 << 16, 1 << 16], data_type=TensorProto.INT4,
                    raw_data=b"\0" * 4)
    _session(rt, _save(tmp, t)).run(None, {})


@case(SIZES, "refused", memory=512 << 20)
def case_embedded_huge_dims_no_data(rt, tmp):
    """An initializer declaring 2^40 floats and holding no data at all."""
    t = TensorProto(name="w", dims=[1 << 20, 1 << 20], data_type=TensorProto.FLOAT)
    _session(rt, _save(tmp, t)).run(None, {})


@case(SIZES, "refused")
def case_embedded_no_data(rt, tmp):
    """An initializer declaring 4 floats and holding none (not zeros)."""
    t = TensorProto(name="w", dims=[4], data_type=TensorProto.FLOAT)
    _session(rt, _save(tmp, t)).run(None, {})


@case(SIZES, "refused")
def case_raw_data_short(rt, tmp):
    """12 bytes of raw data for 4 floats."""
    t = TensorProto(name="w", dims=[4], data_type=TensorProto.FLOAT, raw_data=b"\0" * 12)
    _session(rt, _save(tmp, t)).run(None, {})


@case(SIZES, "refused")
def case_typed_data_count(rt, tmp):
    """float_data with 3 values for dims [4]."""
    t = helper.make_tensor("w", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    t.dims[0] = 4
    _session(rt, _save(tmp, t)).run(None, {})


@case(SIZES, "refused")
def case_external_length_shorter(rt, tmp):
    """An external length of 8 bytes for 4 floats (it read the prefix)."""
    _session(rt, _save(tmp, _external(length=8))).run(None, {})


@case(SIZES, "refused")
def case_external_length_longer(rt, tmp):
    """An external length of 32 bytes for 4 floats."""
    _session(rt, _save(tmp, _external(length=32))).run(None, {})


@case(SIZES, "refused")
def case_external_offset_past_file(rt, tmp):
    """An offset that leaves 8 of the 16 bytes the tensor needs."""
    _session(rt, _save(tmp, _external(offset=56))).run(None, {})


@case(LOCATIONS, "refused")
def case_external_location_nul(rt, tmp):
    """A location holding a NUL byte."""
    _session(rt, _save(tmp, _external(location="w\0.bin"))).run(None, {})


@case(LOCATIONS, "refused")
def case_external_location_too_long(rt, tmp):
    """A location of 10,000 characters."""
    _session(rt, _save(tmp, _external(location="a" * 10_000))).run(None, {})


@case(LOCATIONS, "refused")
def case_external_location_long_component(rt, tmp):
    """A location whose first folder name is 300 characters (over NAME_MAX)."""
    _session(rt, _save(tmp, _external(location="a" * 300 + "/w.bin"))).run(None, {})


@case(LOCATIONS, "refused")
def case_external_location_folder(rt, tmp):
    """A location naming the model's folder itself."""
    _session(rt, _save(tmp, _external(location="."))).run(None, {})


@case(LOCATIONS, "refused")
def case_external_offset_not_a_number(rt, tmp):
    """An offset of 'abc'."""
    _session(rt, _save(tmp, _external(offset="abc"))).run(None, {})


def _sparse_model(shape, indices, as_initializer=False):
    values = helper.make_tensor("c", TensorProto.FLOAT, [3], [1.5, -2.0, 7.0])
    sparse = helper.make_sparse_tensor(
        values, helper.make_tensor("i", TensorProto.INT64, shape, indices), [2, 3])
    nodes = [helper.make_node("Add", ["x", "c"], ["y"])]
    if not as_initializer:
        nodes.insert(0, helper.make_node("Constant", [], ["c"], sparse_value=sparse))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        sparse_initializer=[sparse] if as_initializer else None)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run_sparse(rt, model):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = rt.ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(y, x + np.array([[1.5, 0, 0], [0, -2, 7]], np.float32))


@case(SPARSE, "ok")
def case_sparse_constant_linear_indices(rt, tmp):
    """Constant(sparse_value) with linear indices, read by Add."""
    _run_sparse(rt, _sparse_model([3], [0, 4, 5]))


@case(SPARSE, "ok")
def case_sparse_constant_coordinate_indices(rt, tmp):
    """Constant(sparse_value) with [nnz, rank] coordinate indices, read by Add."""
    _run_sparse(rt, _sparse_model([3, 2], [0, 0, 1, 1, 1, 2]))


@case(SPARSE, "ok")
def case_sparse_initializer(rt, tmp):
    """A sparse initializer read by Add."""
    _run_sparse(rt, _sparse_model([3], [0, 4, 5], as_initializer=True))


@case(SPARSE, "refused")
def case_sparse_index_out_of_range(rt, tmp):
    """A sparse index past the dense tensor's 6 elements."""
    _run_sparse(rt, _sparse_model([3], [0, 4, 6]))


@case(SPARSE, "refused", memory=512 << 20)
def case_sparse_huge_dense_form(rt, tmp):
    """One sparse value in a dense shape of 2^40 floats."""
    values = helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0])
    sparse = helper.make_sparse_tensor(
        values, helper.make_tensor("i", TensorProto.INT64, [1], [0]), [1 << 20, 1 << 20])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], sparse_value=sparse),
         helper.make_node("Shape", ["c"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rt.ort.InferenceSession(model.SerializeToString(),
                            providers=["CPUExecutionProvider"]).run(None, {})


@case(SIZES, "ok")
def case_external_inside_folder_runs(rt, tmp):
    """The control: external data inside the folder, offset and length right, runs."""
    folder, _ = write_secret(tmp)
    (folder / "good.bin").write_bytes(SECRET_BYTES)
    onnx.save(escape_model("function_default", "good.bin"), folder / "m.onnx")
    out = _session(rt, folder / "m.onnx").run(None, {})[0]
    np.testing.assert_array_equal(out, SECRET_VALUES)
