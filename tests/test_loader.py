"""Loader: paths, bytes, graphs, external data safety, and malformed models."""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

from onnxkiln import InferenceSession, ModelLoadError, UnsupportedOpError, loader
from onnxkiln.testing import make_model, tensor_info

sys.path.insert(0, str(Path(__file__).resolve().parent / "hostile"))
import escapes  # the hostile suite's models of external data escaping

_OPENED: list[str] | None = None  # the paths opened while a test watches, else None


def _record_opens(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], str | bytes | Path):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_record_opens)  # hooks stay for the process: it records only when asked


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


def _doubling_functions(levels: int, main_calls: int = 1) -> onnx.ModelProto:
    """f0 is a Neg; f_i calls f_(i-1) twice; the graph calls f_levels `main_calls` times."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    fns = [helper.make_function("local", "f0", ["x"], ["y"],
                                [helper.make_node("Neg", ["x"], ["y"])], opsets)]
    fns.extend(helper.make_function("local", f"f{i}", ["x"], ["y"], [
        helper.make_node(f"f{i - 1}", ["x"], ["t"], domain="local"),
        helper.make_node(f"f{i - 1}", ["t"], ["y"], domain="local")], opsets)
        for i in range(1, levels + 1))
    names = ["x", *(f"t{j}" for j in range(main_calls - 1)), "y"]
    nodes = [helper.make_node(f"f{levels}", [names[j]], [names[j + 1]], domain="local")
             for j in range(main_calls)]
    g = helper.make_graph(nodes, "g", [tensor_info("x", np.float32, [2])],
                          [tensor_info("y", np.float32, [2])])
    return helper.make_model(g, functions=fns, opset_imports=opsets)


def test_inlined_size_is_counted_per_function_once():
    from onnxkiln.inlining import inlined_size

    total, sizes = inlined_size(_doubling_functions(40, main_calls=3))
    assert total == 3 * 2 ** 40
    assert sizes[("local", "f40", "")] == 2 ** 40 and sizes[("local", "f0", "")] == 1


def test_inlining_names_values_as_onnx_ir_does():
    """inline_functions only makes the unique-name search linear: the names are the same."""
    from onnx_ir.passes.common import InlinePass

    from onnxkiln.inlining import inline_functions

    def names(model: ir.Model) -> list[tuple[str, list[str]]]:
        return [(n.name, [v.name for v in n.outputs]) for n in model.graph]

    proto = _doubling_functions(5, main_calls=3)
    ours, theirs = ir.serde.deserialize_model(proto), ir.serde.deserialize_model(proto)
    inline_functions(ours)
    InlinePass()(theirs)
    assert names(ours) == names(theirs) and len(names(ours)) == 3 * 32


def test_an_inlining_bomb_is_refused_before_inlining():
    with pytest.raises(ModelLoadError, match=r"would make 1073741824 nodes.*'local::f30'"):
        InferenceSession.from_graph(_doubling_functions(30))


def test_the_inlining_bound_is_a_session_option():
    model = _doubling_functions(6)  # 64 Negs
    builder = InferenceSession.builder().option("load.max_inlined_nodes", "63")
    with pytest.raises(ModelLoadError, match="64 nodes, over the bound of 63"):
        builder.from_graph(model)
    session = InferenceSession.builder().option("load.max_inlined_nodes", "64").from_graph(model)
    y = session.run({"x": np.array([1, -2], np.float32)})[0]
    np.testing.assert_array_equal(y, [1, -2])  # an even number of negations


@pytest.mark.parametrize("value", ["0", "-5", "1e6", "lots", "\u0663"])
def test_the_inlining_bound_must_be_a_whole_number(value):
    from onnxkiln import InvalidOptionError

    with pytest.raises(InvalidOptionError, match="load.max_inlined_nodes"):
        InferenceSession.builder().option("load.max_inlined_nodes", value)


def test_recursive_functions_are_named_in_the_error():
    model = _doubling_functions(3)
    model.functions[1].node[1].op_type = "f3"  # f1 -> f3 -> f2 -> f1
    with pytest.raises(ModelLoadError, match=r"'local::f3' calls itself \(f3 -> f2 -> f1 -> f3\)"):
        InferenceSession.from_graph(model)


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



def _assert_refused_unread(load, tmp_path):
    """`load()` raises ModelLoadError naming the folder, and never opens the secret."""
    global _OPENED
    secret = str(tmp_path / "secret.bin")
    _OPENED = []
    try:
        with pytest.raises(ModelLoadError, match="outside the model folder|escapes the model "
                           "folder") as info:
            load()
        opened = _OPENED
    finally:
        _OPENED = None
    assert not [p for p in opened if os.path.realpath(p) == secret], opened
    assert "1234.5" not in str(info.value)


@pytest.mark.parametrize("where", ["up", "absolute", "symlink"])
@pytest.mark.parametrize("kind", escapes.KINDS)
def test_external_data_anywhere_outside_the_folder_is_refused_unread(tmp_path, kind, where):
    folder, locations = escapes.write_secret(tmp_path)
    location = locations[["up", "absolute", "symlink"].index(where)]
    path = folder / "m.onnx"
    onnx.save(escapes.escape_model(kind, location), path)
    _assert_refused_unread(lambda: InferenceSession.load(path), tmp_path)


def test_every_load_path_refuses_the_escape(tmp_path):
    import onnxkiln.compat as ort

    folder, locations = escapes.write_secret(tmp_path)
    model = escapes.escape_model("function_default", locations[0])
    path = folder / "m.onnx"
    onnx.save(model, path)
    data = path.read_bytes()
    _assert_refused_unread(lambda: InferenceSession.load_bytes(data, str(folder)), tmp_path)
    _assert_refused_unread(lambda: ort.InferenceSession(str(path)), tmp_path)
    for load in (lambda: InferenceSession.from_graph(model),
                 lambda: InferenceSession.from_graph(ir.serde.deserialize_model(model)),
                 lambda: ort.InferenceSession(data)):
        with pytest.raises(ModelLoadError, match="no folder to read it from"):
            load()


@pytest.mark.parametrize("kind", escapes.KINDS)
def test_external_data_inside_the_folder_is_read_from_it_wherever_the_cwd(
        tmp_path, monkeypatch, kind):
    """Function bodies and defaults used to resolve against the working directory."""
    folder, _ = escapes.write_secret(tmp_path)
    (folder / "good.bin").write_bytes(escapes.SECRET_BYTES)
    onnx.save(escapes.escape_model(kind, "good.bin"), folder / "m.onnx")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    y = InferenceSession.load(folder / "m.onnx").run({})[0]
    if kind == "node_attribute":
        expected = np.full(4, escapes.SECRET_VALUES[0])
    elif kind == "sparse_initializer_indices":
        expected = np.ones(4, np.float32)
    else:
        expected = escapes.SECRET_VALUES
    np.testing.assert_array_equal(y.reshape(-1), expected)


def _one_initializer(tensor: onnx.TensorProto) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", tensor.data_type, None)],
                              [tensor])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                             ir_version=10)


def _tensor(dtype=onnx.TensorProto.FLOAT, dims=(4,), **fields) -> onnx.TensorProto:
    t = onnx.TensorProto(name="w", data_type=dtype, dims=list(dims))
    for key, value in fields.items():
        if key == "raw_data":
            t.raw_data = value
        else:
            getattr(t, key).extend(value)
    return t


@pytest.mark.parametrize("tensor, match", [
    (_tensor(raw_data=b"\0" * 12), r"12 bytes of raw data, but dims \[4\] of FLOAT need 16"),
    (_tensor(raw_data=b"\0" * 20), r"20 bytes of raw data, but dims \[4\] of FLOAT need 16"),
    (_tensor(onnx.TensorProto.INT4, (1 << 16, 1 << 16), raw_data=b"\0" * 4),
     r"4 bytes of raw data, but dims \[65536, 65536\] of INT4 need 2147483648"),
    (_tensor(onnx.TensorProto.UINT4, (5,), raw_data=b"\0" * 2), "need 3"),
    (_tensor(float_data=[1, 2, 3]), r"holds 3 values in float_data, but dims \[4\]"),
    (_tensor(onnx.TensorProto.COMPLEX64, float_data=[1] * 4), "holds 4 values .* need 8"),
    (_tensor(onnx.TensorProto.INT4, (5,), int32_data=[1, 2]), "holds 2 values .* need 3"),
    (_tensor(onnx.TensorProto.STRING, (3,), string_data=[b"a"]), "holds 1 values in string"),
    (_tensor(onnx.TensorProto.INT64, int32_data=[1] * 4), "int32_data, which cannot hold INT64"),
    (_tensor(), r"declares 4 elements \(dims \[4\]\) but holds no data"),
    (_tensor(dims=(1 << 20, 1 << 20)), "declares 1099511627776 elements"),
    (_tensor(onnx.TensorProto.STRING, (1,), raw_data=b"ab"), "strings go in string_data"),
    (_tensor(dims=(-1, 4)), "negative dims"),
    (_tensor(1000), "unknown data type 1000"),
    (_tensor(onnx.TensorProto.UNDEFINED, (0,)), "no data type"),
])
def test_embedded_data_must_hold_what_the_dims_declare(tensor, match):
    with pytest.raises(ModelLoadError, match=f"initializer 'w' of graph 'g' .*{match}"):
        InferenceSession.from_graph(_one_initializer(tensor))


def _external_tensor(location="w.bin", dims=(4,), **info) -> onnx.TensorProto:
    t = _tensor(dims=dims)
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in {"location": location, **info}.items():
        t.external_data.add(key=key, value=str(value))
    return t


@pytest.mark.parametrize("tensor, match", [
    (_external_tensor(length=8), "with length 8, but dims .4. of FLOAT take 16 bytes"),
    (_external_tensor(length=32), "with length 32, but dims .4. of FLOAT take 16 bytes"),
    (_external_tensor(dims=(1 << 16, 1 << 16)), "needs bytes up to 17179869184 but the file "
                                                "has 64"),
    (_external_tensor(offset=56), "needs bytes up to 72 but the file has 64"),
    (_external_tensor(offset="abc"), "offset 'abc', which is not a byte count"),
    (_external_tensor(length="-16"), "length '-16', which is not a byte count"),
    (_external_tensor("w\0.bin"), "contains a NUL byte"),
    (_external_tensor("a" * 10_000), r"longer than a file path can be \(10000 characters\)"),
    (_external_tensor("a" * 300 + "/w.bin"), "longer than a file path can be"),
    (_external_tensor("."), "is not a regular file"),
    (_external_tensor(""), "has external data but no location"),
    (_external_tensor("loop.bin"), "cannot be resolved|missing"),
    (_external_tensor("w.bin/x"), r"cannot be read \(Not a directory\)"),
])
def test_external_data_is_checked_against_its_file_before_mapping(tmp_path, tensor, match):
    (tmp_path / "w.bin").write_bytes(bytes(range(64)))
    (tmp_path / "loop.bin").symlink_to(tmp_path / "loop.bin")
    onnx.save(_one_initializer(tensor), tmp_path / "m.onnx")
    with pytest.raises(ModelLoadError, match=match):
        InferenceSession.load(tmp_path / "m.onnx")


def test_external_data_keys_given_twice_are_refused(tmp_path):
    """Readers differ on which `location` wins: one checked, another read."""
    (tmp_path / "w.bin").write_bytes(b"\0" * 64)
    t = _external_tensor()
    t.external_data.add(key="location", value="../secret.bin")
    onnx.save(_one_initializer(t), tmp_path / "m.onnx")
    with pytest.raises(ModelLoadError, match=r"key\(s\) \['location'\] given more than once"):
        InferenceSession.load(tmp_path / "m.onnx")


def test_external_strings_and_fifos_are_refused(tmp_path):
    os.mkfifo(tmp_path / "fifo.bin")  # opening it to map would block forever
    onnx.save(_one_initializer(_external_tensor("fifo.bin")), tmp_path / "m.onnx")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        InferenceSession.load(tmp_path / "m.onnx")
    t = _external_tensor()
    t.data_type = onnx.TensorProto.STRING
    (tmp_path / "w.bin").write_bytes(b"\0" * 64)
    onnx.save(_one_initializer(t), tmp_path / "m.onnx")
    with pytest.raises(ModelLoadError, match="strings cannot be stored as external data"):
        InferenceSession.load(tmp_path / "m.onnx")


def _sparse(dims, indices, index_shape, values=(1.5, -2.0, 7.0)):
    v = helper.make_tensor("c", onnx.TensorProto.FLOAT, [len(values)], list(values))
    i = helper.make_tensor("i", onnx.TensorProto.INT64, index_shape, indices)
    return helper.make_sparse_tensor(v, i, dims)


def _sparse_model(sparse, as_initializer=False, op="Constant") -> onnx.ModelProto:
    nodes = [helper.make_node("Identity", ["c"], ["y"])]
    if not as_initializer:
        nodes.insert(0, helper.make_node(op, [], ["c"], sparse_value=sparse))
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(
        "y", onnx.TensorProto.FLOAT, None)], sparse_initializer=[sparse] * as_initializer)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("as_initializer", [False, True])
@pytest.mark.parametrize("dims, indices, shape", [
    ([2, 3], [0, 4, 5], [3]), ([2, 3], [0, 0, 1, 1, 1, 2], [3, 2]), ([6], [0, 4, 5], [3, 1])])
def test_sparse_tensors_are_made_dense(dims, indices, shape, as_initializer):
    model = _sparse_model(_sparse(dims, indices, shape), as_initializer)
    y = InferenceSession.from_graph(model).run({})[0]
    np.testing.assert_array_equal(y, np.array([1.5, 0, 0, 0, -2, 7], np.float32).reshape(dims))


@pytest.mark.parametrize("sparse, match", [
    (_sparse([2, 3], [0, 4, 6], [3]), "index outside its 6 elements"),
    (_sparse([2, 3], [0, 0, 1, 1, 2, 0], [3, 2]), r"index outside its dims \[2, 3\]"),
    (_sparse([2, 3], [0, 1], [2]), r"indices of shape \[2\] for 3 values"),
    (_sparse([1 << 20, 1 << 20], [0, 1, 2], [3]), "would be 4398046511104 bytes dense"),
    (_sparse([-6], [0, 1, 2], [3]), r"negative dims \[-6\]"),
])
def test_bad_sparse_tensors_are_refused(sparse, match):
    with pytest.raises(ModelLoadError, match=match):
        InferenceSession.from_graph(_sparse_model(sparse))


def test_sparse_values_and_indices_of_the_wrong_form_are_refused():
    sparse = _sparse([6], [0, 1, 2], [3])
    sparse.indices.data_type = onnx.TensorProto.INT32
    sparse.indices.ClearField("int64_data")
    sparse.indices.int32_data.extend([0, 1, 2])
    with pytest.raises(ModelLoadError, match="indices of type int32; they must be int64"):
        InferenceSession.from_graph(_sparse_model(sparse))
    sparse = _sparse([6], [0, 1, 2], [3])
    sparse.ClearField("indices")
    with pytest.raises(ModelLoadError, match=r"indices of shape \[0\] for 3 values"):
        InferenceSession.from_graph(_sparse_model(sparse))
    sparse = _sparse([6], [0, 1], [2], values=(1.0, 2.0))
    sparse.values.dims[:] = [2, 1]
    with pytest.raises(ModelLoadError, match=r"values of shape \[2, 1\]; they must be 1-D"):
        InferenceSession.from_graph(_sparse_model(sparse))


def test_sparse_attribute_outside_constant_is_refused():
    with pytest.raises(ModelLoadError, match="only as Constant's sparse_value"):
        InferenceSession.from_graph(_sparse_model(_sparse([3], [0, 1, 2], [3]), op="Foo"))


def test_functions_imported_at_another_opset_run_at_the_models_as_onnxruntime():
    """skl2onnx writes ai.onnx 21 functions into opset 22 models; onnxruntime runs them."""
    ort = pytest.importorskip("onnxruntime")
    body = [helper.make_node("Add", ["a", "a"], ["s"]), helper.make_node("Relu", ["s"], ["b"])]
    func = helper.make_function("local", "twice", ["a"], ["b"], body,
                                [helper.make_opsetid("", 21)])
    graph = helper.make_graph(
        [helper.make_node("twice", ["x"], ["y"], domain="local")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, functions=[func], ir_version=10, opset_imports=[
        helper.make_opsetid("", 22), helper.make_opsetid("local", 1)])
    x = np.array([-1, 2, 3], np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = InferenceSession.load_bytes(model.SerializeToString()).run({"x": x})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [0, 4, 6])
