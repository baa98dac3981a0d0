"""onnxkiln.compat's SparseTensor and LoRA adapters, each compared with onnxruntime itself:
values, formats, type strings, and the calls both refuse."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

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
