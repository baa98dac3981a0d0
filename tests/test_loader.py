"""Loader: paths, bytes, graphs, external data safety, and malformed models."""

from __future__ import annotations

import mmap
import os

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

from onnxkiln import InferenceSession, ModelLoadError, UnsupportedOpError, loader
from onnxkiln.testing import make_model, tensor_info


def _affine_model() -> onnx.ModelProto:
    """y = x @ w + b with weights big enough to be saved as external data."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    b = np.linspace(-1, 1, 4, dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]),
             helper.make_node("Add", ["t", "b"], ["y"])]
    return make_model(nodes, [tensor_info("x", np.float32, ["n", 3])],
                      [tensor_info("y", np.float32, ["n", 4])], {"w": w, "b": b})


def _expected(x: np.ndarray) -> np.ndarray:
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    return x @ w + np.linspace(-1, 1, 4, dtype=np.float32)


def _save_external(model: onnx.ModelProto, folder, location: str = "weights.bin") -> str:
    path = os.path.join(folder, "model.onnx")
    onnx.save(model, path, save_as_external_data=True, location=location, size_threshold=0)
    return path


def _set_location(path: str, location: str) -> None:
    model = onnx.load(path, load_external_data=False)
    for t in model.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(model, path)


X = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]], dtype=np.float32)


def test_load_path_bytes_and_graph_give_the_same_result(tmp_path):
    model = _affine_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for session in (
        InferenceSession.load(path),
        InferenceSession.load(str(path)),
        InferenceSession.load_bytes(path.read_bytes()),
        InferenceSession.load_bytes(memoryview(path.read_bytes())),
        InferenceSession.from_graph(model),
        InferenceSession.from_graph(ir.serde.deserialize_model(model)),
        InferenceSession.from_graph(ir.serde.deserialize_model(model).graph),
    ):
        np.testing.assert_allclose(session.run({"x": X})[0], _expected(X), rtol=1e-6)


def test_external_data_is_memory_mapped_and_resolved_beside_the_model(tmp_path):
    path = _save_external(_affine_model(), tmp_path)
    model = loader.load_path(path)
    tensor = model.graph.initializers["w"].const_value
    assert isinstance(tensor, ir.ExternalTensor)
    tensor.numpy()
    assert isinstance(tensor.raw, mmap.mmap)
    session = InferenceSession.load(path)
    np.testing.assert_allclose(session.run({"x": X})[0], _expected(X), rtol=1e-6)


def _mapped_buffer(array: np.ndarray) -> object:
    """The object at the bottom of an array's base chain (an mmap when nothing copied it)."""
    base: object = array
    while isinstance(base, np.ndarray | memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return base


def test_session_runs_on_views_of_the_mapped_weights_not_copies(tmp_path):
    """What bench/large_model.py measures at 2.5 GB: the plan's weights are the mmap."""
    path = _save_external(_affine_model(), tmp_path)
    session = InferenceSession.load(path)
    weights = {session._plan.slot_names[s]: a for s, a in session._plan.constants.items()}
    for name in ("w", "b"):
        assert not weights[name].flags.owndata
        assert isinstance(_mapped_buffer(weights[name]), mmap.mmap), name
    np.testing.assert_allclose(session.run({"x": X})[0], _expected(X), rtol=1e-6)


def test_load_bytes_with_external_data_needs_a_folder(tmp_path):
    path = _save_external(_affine_model(), tmp_path)
    with open(path, "rb") as f:
        data = f.read()
    with pytest.raises(ModelLoadError, match="external_data_dir"):
        InferenceSession.load_bytes(data)
    session = InferenceSession.load_bytes(data, external_data_dir=str(tmp_path))
    np.testing.assert_allclose(session.run({"x": X})[0], _expected(X), rtol=1e-6)


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "sub/../../outside.bin"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    path = _save_external(_affine_model(), folder)
    (tmp_path / "outside.bin").write_bytes(b"\0" * 256)
    _set_location(path, location)
    with pytest.raises(ModelLoadError, match="escapes the model folder|outside the model folder"):
        InferenceSession.load(path)


def test_external_data_symlink_out_of_the_folder_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    path = _save_external(_affine_model(), folder)
    (tmp_path / "secret.bin").write_bytes((folder / "weights.bin").read_bytes())
    os.remove(folder / "weights.bin")
    os.symlink(tmp_path / "secret.bin", folder / "weights.bin")
    with pytest.raises(ModelLoadError, match="outside the model folder"):
        InferenceSession.load(path)


def test_missing_and_truncated_external_data_name_the_initializer(tmp_path):
    path = _save_external(_affine_model(), tmp_path)
    data = (tmp_path / "weights.bin").read_bytes()
    (tmp_path / "weights.bin").write_bytes(data[:10])
    with pytest.raises(ModelLoadError, match="initializer '(w|b)'.*truncated"):
        InferenceSession.load(path)
    os.remove(tmp_path / "weights.bin")
    with pytest.raises(ModelLoadError, match="initializer '(w|b)'.*missing"):
        InferenceSession.load(path)


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "empty"),
        (b"\xff\xff\xff\xff garbage that is not protobuf \x00\x01", "not a valid ONNX protobuf"),
        (b"\x0a\x05hello", "no graph"),
    ],
)
def test_corrupt_bytes_fail_cleanly(data, match):
    with pytest.raises(ModelLoadError, match=match):
        InferenceSession.load_bytes(data)


def test_truncated_model_file_fails_cleanly(tmp_path):
    data = _affine_model().SerializeToString()
    for cut in (len(data) // 3, len(data) // 2, len(data) - 3):
        with pytest.raises(ModelLoadError):
            InferenceSession.load_bytes(data[:cut])


def test_missing_file_and_folder_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        InferenceSession.load(tmp_path / "nope.onnx")
    with pytest.raises(ModelLoadError, match="is a folder"):
        InferenceSession.load(tmp_path)


def _graph(nodes, inputs=("x",), outputs=("y",), inits=None) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "g", [tensor_info(i, np.float32, [2]) for i in inputs],
        [tensor_info(o, np.float32, [2]) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_cycle_is_a_load_error_naming_the_nodes():
    model = _graph([
        helper.make_node("Add", ["x", "b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
        helper.make_node("Identity", ["a"], ["y"], name="out"),
    ])
    with pytest.raises(ModelLoadError, match="cycle.*'first'.*'second'|cycle.*'second'.*'first'"):
        InferenceSession.from_graph(model)


def test_undefined_value_is_a_load_error_naming_node_and_value():
    model = _graph([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")])
    with pytest.raises(ModelLoadError, match="'adder'.*'ghost'.*(undefined|missing initializer)"):
        InferenceSession.from_graph(model)


def test_missing_initializer_is_a_load_error():
    model = _graph([helper.make_node("Mul", ["x", "scale"], ["y"], name="scaler")])
    with pytest.raises(ModelLoadError, match="'scale'.*missing initializer"):
        InferenceSession.from_graph(model)


def test_value_defined_twice_is_a_load_error():
    model = _graph([
        helper.make_node("Relu", ["x"], ["y"], name="a"),
        helper.make_node("Neg", ["x"], ["y"], name="b"),
    ])
    with pytest.raises(ModelLoadError, match="'y' is defined twice"):
        InferenceSession.from_graph(model)


def test_unsorted_graph_is_sorted_and_runs():
    model = _graph([
        helper.make_node("Neg", ["t"], ["y"], name="second"),
        helper.make_node("Relu", ["x"], ["t"], name="first"),
    ])
    y = InferenceSession.from_graph(model).run({"x": np.array([-1, 2], np.float32)})[0]
    np.testing.assert_array_equal(y, [0, -2])


def test_model_local_function_is_inlined():
    fn = helper.make_function(
        "local", "Scale2", ["a"], ["b"],
        [helper.make_node("Add", ["a", "a"], ["b"])],
        opset_imports=[helper.make_opsetid("", 17)],
    )
    g = helper.make_graph(
        [helper.make_node("Scale2", ["x"], ["t"], domain="local"),
         helper.make_node("Scale2", ["t"], ["y"], domain="local")],
        "g", [tensor_info("x", np.float32, [2])], [tensor_info("y", np.float32, [2])],
    )
    model = helper.make_model(
        g, functions=[fn],
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
    )
    session = InferenceSession.from_graph(model)
    assert [n.op_type for n in session.graph()] == ["Add", "Add"]
    y = session.run({"x": np.array([1.5, -2], np.float32)})[0]
    np.testing.assert_array_equal(y, [6, -8])


def test_domain_without_opset_import_is_a_load_error():
    g = helper.make_graph(
        [helper.make_node("Foo", ["x"], ["y"], domain="custom.domain", name="foo")],
        "g", [tensor_info("x", np.float32, [2])], [tensor_info("y", np.float32, [2])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelLoadError, match="'foo'.*custom.domain.*does not import"):
        InferenceSession.from_graph(model)


def test_opset_imports_are_honoured_per_domain():
    """Softmax's default axis is 1 with 2-D coercion before opset 13, -1 after."""
    x = np.arange(8, dtype=np.float32).reshape(1, 2, 4) / 4
    results = {}
    for opset in (11, 13):
        g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g",
                              [tensor_info("x", np.float32, [1, 2, 4])],
                              [tensor_info("y", np.float32, [1, 2, 4])])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        results[opset] = InferenceSession.from_graph(model).run({"x": x})[0]
    np.testing.assert_allclose(results[11].sum(axis=(1, 2)), [1.0], rtol=1e-6)
    np.testing.assert_allclose(results[13].sum(axis=2), [[1.0, 1.0]], rtol=1e-6)


def test_unsupported_ops_are_all_listed_at_load():
    g = helper.make_graph(
        [helper.make_node("FancyOp", ["x"], ["t"], name="fancy1", domain="my.ops"),
         helper.make_node("OtherOp", ["t"], ["y"], name="other2", domain="my.ops")],
        "g", [tensor_info("x", np.float32, [2])], [tensor_info("y", np.float32, [2])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("my.ops", 3)])
    with pytest.raises(UnsupportedOpError) as info:
        InferenceSession.from_graph(model)
    text = str(info.value)
    assert "2 node(s)" in text
    assert "'fancy1' my.ops::FancyOp opset 3" in text
    assert "'other2' my.ops::OtherOp opset 3" in text
    assert "float32[2]" in text and "cpu" in text
