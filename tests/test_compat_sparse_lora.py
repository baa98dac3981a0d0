"""onnxkiln.compat's SparseTensor and LoRA adapters, each compared with onnxruntime itself:
values, formats, type strings, and the calls both refuse."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxkiln.compat as rt
from onnxkiln.compat import _errors

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (test extra)")

SHAPE = [9, 9]
COO_CASES = [  # (values, indices): linear indices, and (row, column) pairs
    (np.array([1.0, 2.0, 3.0], np.float32), np.array([3, 5, 15], np.int64)),
    (np.array([4, -5], np.int32), np.array([[0, 1], [8, 8]], np.int64)),
    (np.array(["xyz", "yxz", "zyx"]), np.array([3, 5, 15], np.int64)),
]


def _both(build):
    """`build(runtime, device)` on onnxruntime and on onnxkiln.compat."""
    return [build(m, m.OrtDevice.make("cpu", 0)) for m in (ort, rt)]


def _identity(elem_type=TensorProto.FLOAT):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", elem_type, SHAPE)],
        [helper.make_tensor_value_info("y", elem_type, SHAPE)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_sparse_format_enum_values_as_onnxruntime():
    assert {k: int(v) for k, v in rt.OrtSparseFormat.__members__.items()} == \
        {k: int(v) for k, v in ort.OrtSparseFormat.__members__.items()}


@pytest.mark.parametrize(("values", "indices"), COO_CASES)
def test_coo_tensor_reads_back_as_onnxruntime(values, indices):
    theirs, ours = _both(lambda m, d: m.SparseTensor.sparse_coo_from_numpy(
        SHAPE, values, indices, d))
    assert int(ours.format()) == int(theirs.format()) == int(rt.OrtSparseFormat.ORT_SPARSE_COO)
    assert ours.dense_shape() == theirs.dense_shape() == SHAPE
    assert ours.data_type() == theirs.data_type()
    assert ours.device_name() == theirs.device_name() == "cpu"
    for got, want in ((ours.values(), theirs.values()),
                      (ours.as_coo_view().indices(), theirs.as_coo_view().indices())):
        np.testing.assert_array_equal(got, want)
        assert got.shape == want.shape and not got.flags.writeable
    if values.dtype.kind != "U":
        assert ours.values().dtype == theirs.values().dtype


def test_csr_tensor_reads_back_as_onnxruntime():
    values = np.array([1.0, 2.0, 3.0], np.float64)
    inner = np.array([1, 4, 1], np.int64)
    outer = np.array([0, 2, 2, 3, 3, 3, 3, 3, 3, 3], np.int64)
    for vals in (values, np.array(["a", "b", "c"])):
        theirs, ours = _both(lambda m, d, v=vals: m.SparseTensor.sparse_csr_from_numpy(
            SHAPE, v, inner, outer, d))
        assert int(ours.format()) == int(theirs.format()) == 2
        assert ours.data_type() == theirs.data_type()
        np.testing.assert_array_equal(ours.values(), theirs.values())
        for view in ("inner", "outer"):
            got = getattr(ours.as_csrc_view(), view)()
            np.testing.assert_array_equal(got, getattr(theirs.as_csrc_view(), view)())
            assert not got.flags.writeable
    dense = ours.to_dense()
    assert dense[0, 1] == "a" and dense[0, 4] == "b" and dense[2, 1] == "c"


def test_to_dense_places_values_by_indices():
    device = rt.OrtDevice.make("cpu", 0)
    values, indices = COO_CASES[1]
    dense = rt.SparseTensor.sparse_coo_from_numpy(SHAPE, values, indices, device).to_dense()
    expected = np.zeros(SHAPE, np.int32)
    expected[0, 1], expected[8, 8] = 4, -5
    np.testing.assert_array_equal(dense, expected)
    csr = rt.SparseTensor.sparse_csr_from_numpy(
        [2, 3], np.float32([1, 2]), np.int64([2, 0]), np.int64([0, 1, 2]), device)
    np.testing.assert_array_equal(csr.to_dense(), [[0, 0, 1], [2, 0, 0]])


def test_numeric_values_share_the_callers_memory():
    values = np.array([1.0, 2.0], np.float32)
    st = rt.SparseTensor.sparse_coo_from_numpy(SHAPE, values, np.int64([0, 1]),
                                               rt.OrtDevice.make("cpu", 0))
    values[0] = 7.0
    assert st.values()[0] == 7.0


def test_ort_value_wraps_a_sparse_tensor_as_onnxruntime():
    values, indices = COO_CASES[0]
    theirs, ours = _both(lambda m, d: m.OrtValue.ort_value_from_sparse_tensor(
        m.SparseTensor.sparse_coo_from_numpy(SHAPE, values, indices, d)))
    for method in ("is_sparse_tensor", "is_tensor", "data_type", "shape", "element_type",
                   "device_name", "has_value"):
        assert getattr(ours, method)() == getattr(theirs, method)(), method
    np.testing.assert_array_equal(ours.as_sparse_tensor().values(),
                                  theirs.as_sparse_tensor().values())
    with pytest.raises(RuntimeError, match="Tensor"):
        ours.numpy()
    with pytest.raises(RuntimeError, match="does not contain SparseTensor"):
        rt.OrtValue.ortvalue_from_numpy(np.ones(2)).as_sparse_tensor()
    with pytest.raises(RuntimeError, match="does not contain SparseTensor"):
        ort.OrtValue.ortvalue_from_numpy(np.ones(2)).as_sparse_tensor()


def test_sparse_feed_to_a_dense_input_is_refused_as_onnxruntime():
    values, indices = COO_CASES[0]
    theirs, ours = _both(lambda m, d: m.OrtValue.ort_value_from_sparse_tensor(
        m.SparseTensor.sparse_coo_from_numpy(SHAPE, values, indices, d)))
    message = "input with name: 'x' expected to be of type.* but received a sparse tensor"
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match=message):
        ort.InferenceSession(_identity()).run_with_ort_values(None, {"x": theirs})
    session = rt.InferenceSession(_identity())
    for call in (session.run_with_ort_values, session.run):
        with pytest.raises(_errors.InvalidArgument, match=message):
            call(None, {"x": ours})
    with pytest.raises(_errors.InvalidArgument, match=message):
        session.run(None, {"x": ours.as_sparse_tensor()})


def _raises_on_both(build, match):
    """Both runtimes refuse `build(runtime, device)` with a RuntimeError."""
    for runtime in (ort, rt):
        with pytest.raises(RuntimeError, match=match):
            build(runtime, runtime.OrtDevice.make("cpu", 0))


def test_wrong_views_and_bad_layouts_are_refused_as_onnxruntime():
    values = np.float32([1, 2])
    _raises_on_both(lambda m, d: m.SparseTensor.sparse_coo_from_numpy(
        [3, 3], values, np.int64([0, 1]), d).as_csrc_view(), "does not contain CSR")
    _raises_on_both(lambda m, d: m.SparseTensor.sparse_coo_from_numpy(
        [3, 3], values, np.int64([0, 1]), d).as_blocksparse_view(), "does not contain Block")
    _raises_on_both(lambda m, d: m.SparseTensor.sparse_csr_from_numpy(
        [3, 3], values, np.int64([0, 1]), np.int64([0, 2, 2, 2]), d).as_coo_view(),
        "does not contain COO")
    _raises_on_both(lambda m, d: m.SparseTensor.sparse_coo_from_numpy(
        [3, 3], values, np.int64([0]), d), "(?i)index size|coo_indices has 1")
    _raises_on_both(lambda m, d: m.SparseTensor.sparse_coo_from_numpy(
        [3, 3], values.reshape(1, 2), np.int64([0, 1]), d), "(?i)1-D")
    _raises_on_both(lambda m, d: m.SparseTensor.sparse_csr_from_numpy(
        [3, 3], values, np.int64([0, 1]), np.int64([0, 1]), d), "rows \\+ 1")


def test_onnxkiln_checks_indices_against_the_dense_shape():
    device = rt.OrtDevice.make("cpu", 0)
    with pytest.raises(_errors.InvalidArgument, match=r"linear COO indices must lie in \[0, 9\)"):
        rt.SparseTensor.sparse_coo_from_numpy([3, 3], np.float32([1]), np.int64([9]), device)
    with pytest.raises(_errors.InvalidArgument, match="inner .*column.* in \\[0, 3\\)"):
        rt.SparseTensor.sparse_csr_from_numpy([2, 3], np.float32([1]), np.int64([3]),
                                              np.int64([0, 1, 1]), device)
    with pytest.raises(_errors.InvalidArgument, match="must rise from 0"):
        rt.SparseTensor.sparse_csr_from_numpy([2, 3], np.float32([1]), np.int64([0]),
                                              np.int64([0, 2, 1]), device)


def test_cuda_copies_and_device_buffers_are_refused():
    st = rt.SparseTensor.sparse_coo_from_numpy([3, 3], np.float32([1]), np.int64([0]),
                                               rt.OrtDevice.make("cpu", 0))
    with pytest.raises(_errors.NotImplemented, match="to_cuda: not supported by onnxkiln"):
        st.to_cuda(rt.OrtDevice.make("cuda", 0))
    with pytest.raises(_errors.NotImplemented, match="host memory"):
        rt.SparseTensor.sparse_coo_from_numpy([3, 3], np.float32([1]), np.int64([0]),
                                              rt.OrtDevice.make("cuda", 0))
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(RuntimeError, match="Cuda is not available"):
            ort.SparseTensor.sparse_coo_from_numpy(
                [3, 3], np.float32([1]), np.int64([0]),
                ort.OrtDevice.make("cpu", 0)).to_cuda(ort.OrtDevice.make("cuda", 0))


# --- LoRA adapters ---------------------------------------------------------------------

PARAMS = {  # one of each kind of element the format carries: raw bytes of numeric types
    "f32": np.arange(10, dtype=np.float32).reshape(5, 2),
    "i64": np.arange(10, dtype=np.int64).reshape(2, 5) - 4,
    "f16": np.linspace(-1, 1, 6).astype(np.float16).reshape(1, 2, 3),
    "u8": np.array([0, 7, 255], np.uint8),
    "i8": np.array([-128, 127], np.int8),
    "u64": np.array([2**64 - 1], np.uint64),
    "f64": np.array([2.5]),
    "empty": np.zeros((0, 3), np.float32),
}


def _export(runtime, path, params, adapter_version=3, model_version=5):
    fmt = runtime.AdapterFormat()
    fmt.set_adapter_version(adapter_version)
    fmt.set_model_version(model_version)
    fmt.set_parameters({k: runtime.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()})
    fmt.export_adapter(str(path))


def _check_read(runtime, path, params, adapter_version=3, model_version=5):
    read = runtime.AdapterFormat.read_adapter(str(path))
    assert read.get_adapter_version() == adapter_version
    assert read.get_model_version() == model_version
    assert read.get_format_version() == 1
    got = read.get_parameters()
    assert sorted(got) == sorted(params)
    for name, want in params.items():
        value = got[name]
        assert value.is_tensor() and value.shape() == list(want.shape), name
        assert value.element_type() == int(helper.np_dtype_to_tensor_dtype(want.dtype)), name
        np.testing.assert_array_equal(value.numpy(), want)


@pytest.mark.parametrize(("writer", "reader"), [(rt, ort), (ort, rt), (rt, rt)],
                         ids=["onnxkiln->onnxruntime", "onnxruntime->onnxkiln", "onnxkiln"])
def test_adapter_files_cross_between_runtimes(tmp_path, writer, reader):
    path = tmp_path / "p.onnx_adapter"
    _export(writer, path, PARAMS, adapter_version=-2, model_version=2**31 - 1)
    _check_read(reader, path, PARAMS, adapter_version=-2, model_version=2**31 - 1)


def test_an_empty_adapter_crosses_between_runtimes(tmp_path):
    for writer, reader in ((rt, ort), (ort, rt)):
        path = tmp_path / f"{writer.__name__}.onnx_adapter"
        writer.AdapterFormat().export_adapter(str(path))
        _check_read(reader, path, {}, 0, 0)
    fresh = rt.AdapterFormat()
    assert (fresh.get_adapter_version(), fresh.get_model_version(), fresh.get_parameters()) == \
        (0, 0, {})


def _lora_model():
    """output = x @ W + (x @ A) @ B, where A and B are initializers a run may override."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input_x", "W"], ["base"]),
         helper.make_node("MatMul", ["input_x", "lora_param_a"], ["xa"]),
         helper.make_node("MatMul", ["xa", "lora_param_b"], ["xab"]),
         helper.make_node("Add", ["base", "xab"], ["output"])], "g",
        [helper.make_tensor_value_info("input_x", TensorProto.FLOAT, [4, 4]),
         helper.make_tensor_value_info("lora_param_a", TensorProto.FLOAT, [4, 2]),
         helper.make_tensor_value_info("lora_param_b", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [4, 4])],
        [numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "W"),
         numpy_helper.from_array(np.zeros((4, 2), np.float32), "lora_param_a"),
         numpy_helper.from_array(np.zeros((2, 4), np.float32), "lora_param_b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


LORA = {"lora_param_a": np.arange(8, dtype=np.float32).reshape(4, 2) / 4,
        "lora_param_b": np.arange(8, dtype=np.float32).reshape(2, 4) - 3}
X = np.arange(16, dtype=np.float32).reshape(4, 4) / 8


def _run(runtime, feeds, *adapter_paths, ort_values=False):
    options = runtime.RunOptions()
    for path in adapter_paths:
        adapter = runtime.LoraAdapter()
        adapter.Load(str(path))
        options.add_active_adapter(adapter)
    session = runtime.InferenceSession(_lora_model(), providers=["CPUExecutionProvider"])
    if ort_values:
        feeds = {k: runtime.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
        return session.run_with_ort_values(None, feeds, options)[0].numpy()
    return session.run(None, feeds, options)[0]


@pytest.mark.parametrize("writer", [rt, ort], ids=["onnxkiln-file", "onnxruntime-file"])
@pytest.mark.parametrize("ort_values", [False, True], ids=["run", "run_with_ort_values"])
def test_run_with_adapter_as_onnxruntime(tmp_path, writer, ort_values):
    path = tmp_path / "lora.onnx_adapter"
    _export(writer, path, LORA)
    expected = _run(ort, {"input_x": X}, path)
    np.testing.assert_allclose(expected, X @ np.arange(16).reshape(4, 4) + X @ LORA[
        "lora_param_a"] @ LORA["lora_param_b"], rtol=1e-6)
    np.testing.assert_allclose(_run(rt, {"input_x": X}, path, ort_values=ort_values), expected,
                               rtol=1e-6)


def test_adapter_values_win_over_feeds_and_later_adapters_over_earlier(tmp_path):
    first, second = tmp_path / "a.onnx_adapter", tmp_path / "b.onnx_adapter"
    _export(rt, first, LORA)
    _export(rt, second, {"lora_param_b": LORA["lora_param_b"] * 2})
    feeds = {"input_x": X, "lora_param_a": np.ones((4, 2), np.float32)}
    np.testing.assert_allclose(_run(rt, feeds, first), _run(ort, feeds, first), rtol=1e-6)
    # onnxruntime 1.32 crashes (SIGSEGV) on two adapters sharing a name: numpy is the oracle
    expected = X @ np.arange(16).reshape(4, 4) + X @ LORA["lora_param_a"] @ (
        LORA["lora_param_b"] * 2)
    np.testing.assert_allclose(_run(rt, feeds, first, second), expected, rtol=1e-6)
    np.testing.assert_allclose(_run(rt, {"input_x": X}), _run(ort, {"input_x": X}), rtol=1e-6)


def test_adapter_parameters_the_model_cannot_take_are_refused_as_onnxruntime(tmp_path):
    unknown, wrong_shape = tmp_path / "u.onnx_adapter", tmp_path / "w.onnx_adapter"
    _export(ort, unknown, {"other": np.ones(3, np.float32)})
    _export(ort, wrong_shape, {"lora_param_a": np.ones((4, 3), np.float32)})
    invalid = ort.capi.onnxruntime_pybind11_state.InvalidArgument
    for path, match in ((unknown, "other"), (wrong_shape, "lora_param_a")):
        with pytest.raises(invalid, match=match):
            _run(ort, {"input_x": X}, path)
        with pytest.raises(_errors.InvalidArgument, match=match):
            _run(rt, {"input_x": X}, path)


def test_damaged_or_missing_adapter_files_are_refused(tmp_path):
    good = tmp_path / "g.onnx_adapter"
    _export(rt, good, LORA)
    data = good.read_bytes()
    cases = {"junk": b"junkjunkjunk", "truncated": data[:len(data) // 2],
             "no_identifier": data[:4] + b"XXXX" + data[8:]}
    for name, content in cases.items():
        path = tmp_path / f"{name}.onnx_adapter"
        path.write_bytes(content)
        for load in (lambda p: rt.LoraAdapter().Load(str(p)),
                     lambda p: rt.AdapterFormat.read_adapter(str(p))):
            with pytest.raises(RuntimeError, match="not a valid onnxruntime adapter file"):
                load(path)
        with pytest.raises(RuntimeError):
            ort.AdapterFormat.read_adapter(str(path))
    with pytest.raises(RuntimeError, match="cannot read"):
        rt.LoraAdapter().Load(str(tmp_path / "missing.onnx_adapter"))


def test_adapter_refusals_name_the_call(tmp_path):
    for bad in (np.array(["a"], object), np.array([True])):  # onnxruntime reads neither
        with pytest.raises(_errors.InvalidArgument, match="LoRA parameters are numeric"):
            rt.AdapterFormat().set_parameters({"s": rt.OrtValue.ortvalue_from_numpy(bad)})
    path = tmp_path / "bool.onnx_adapter"
    _export(ort, path, {"flag": np.array([True])})
    with pytest.raises(RuntimeError, match="not a supported LoRA parameter type"):
        ort.AdapterFormat.read_adapter(str(path))
    with pytest.raises(RuntimeError, match="data_type 9, not one of the LoRA parameter"):
        rt.AdapterFormat.read_adapter(str(path))
    with pytest.raises(_errors.InvalidArgument, match="no 0-d"):
        rt.AdapterFormat().set_parameters({"s": np.array(1.0, np.float32)})
    with pytest.raises(_errors.InvalidArgument, match="int32"):
        rt.AdapterFormat().set_adapter_version(2**31)
    with pytest.raises(_errors.InvalidArgument, match="LoraAdapter"):
        rt.RunOptions().add_active_adapter(None)


def test_io_binding_runs_ignore_active_adapters_as_onnxruntime(tmp_path):
    """onnxruntime 1.32 feeds adapters in run() and run_with_ort_values() only."""
    path = tmp_path / "lora.onnx_adapter"
    _export(rt, path, LORA)
    results = []
    for runtime in (ort, rt):
        adapter = runtime.LoraAdapter()
        adapter.Load(str(path))
        options = runtime.RunOptions()
        options.add_active_adapter(adapter)
        session = runtime.InferenceSession(_lora_model(), providers=["CPUExecutionProvider"])
        binding = session.io_binding()
        binding.bind_cpu_input("input_x", X)
        binding.bind_output("output")
        session.run_with_iobinding(binding, options)
        results.append(binding.copy_outputs_to_cpu()[0])
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)
    np.testing.assert_allclose(results[0], _run(ort, {"input_x": X}), rtol=1e-6)


def test_adapters_do_not_stand_in_for_required_inputs_as_onnxruntime(tmp_path):
    """onnxruntime's Python API checks the feeds before adding the adapters: a parameter
    that is a plain graph input (no default) must be fed by the caller."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "lora_param_a"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4]),
         helper.make_tensor_value_info("lora_param_a", TensorProto.FLOAT, [4, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "a.onnx_adapter"
    _export(ort, path, {"lora_param_a": LORA["lora_param_a"]})
    results = []
    for runtime in (ort, rt):
        adapter = runtime.LoraAdapter()
        adapter.Load(str(path))
        options = runtime.RunOptions()
        options.add_active_adapter(adapter)
        session = runtime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
        with pytest.raises(ValueError, match=re.escape(
                "Required inputs (['lora_param_a']) are missing from input feed (['x'])")):
            session.run(None, {"x": X}, options)
        feeds = {"x": X, "lora_param_a": np.ones((4, 2), np.float32)}
        results.append(session.run(None, feeds, options)[0])  # the adapter's value wins
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)
    np.testing.assert_allclose(results[0], X @ LORA["lora_param_a"], rtol=1e-6)


def test_the_capi_module_exports_the_sparse_and_adapter_classes_as_onnxruntimes_does():
    from onnxkiln import compat
    from onnxkiln.compat.capi import onnxruntime_pybind11_state as capi

    for name in ("SparseTensor", "OrtSparseFormat", "LoraAdapter", "AdapterFormat"):
        assert getattr(capi, name) is getattr(compat, name)
        assert name in capi.__all__
