"""onnxkiln.compat where onnxruntime's own Python API tests reach: the capi names they
import, device and memory descriptors, provider-argument checks, DLPack capsules, void
string feeds; each compared with onnxruntime itself."""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxkiln.compat as rt
from onnxkiln.compat import _errors
from onnxkiln.compat.capi import _pybind_state as rt_c
from onnxkiln.compat.capi import onnxruntime_inference_collection as rt_collection

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (test extra)")
from onnxruntime.capi import _pybind_state as ort_c  # noqa: E402
from onnxruntime.capi import onnxruntime_inference_collection as ort_collection  # noqa: E402


def _identity(elem_type=TensorProto.FLOAT, shape=(2, 2)):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", elem_type, list(shape))],
        [helper.make_tensor_value_info("y", elem_type, list(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_capi_names_the_tests_import():
    assert rt_c.OrtValue is rt.OrtValue
    assert hasattr(rt_c.OrtValue, "from_dlpack") == hasattr(ort_c.OrtValue, "from_dlpack")
    with pytest.raises(_errors.NotImplemented, match="SessionIOBinding.*io_binding"):
        rt_c.SessionIOBinding(object())
    for name in ("OrtValueVector", "SessionIOBinding", "OrtDeviceMemoryType",
                 "OrtMemoryInfoDeviceType"):
        assert hasattr(rt_c, name) and hasattr(ort_c, name), name
    assert rt_collection.OrtDeviceVendorId is rt.OrtDeviceVendorId
    assert hasattr(ort_collection, "OrtDeviceVendorId")


def test_ortvalue_vector():
    vector = rt_c.OrtValueVector()
    vector.reserve(2)
    vector.push_back(rt.OrtValue.ortvalue_from_numpy(np.arange(3, dtype=np.int64)))
    vector.shrink_to_fit()
    assert len(vector) == 1 and vector.element_type_at(0) == TensorProto.INT64
    with pytest.raises(_errors.InvalidArgument, match="push_back takes an OrtValue"):
        vector.push_back(np.ones(2))
    sess = rt.InferenceSession(_identity())
    binding = sess.io_binding()
    binding.bind_cpu_input("x", np.ones((2, 2), np.float32))
    binding.bind_output("y")
    sess.run_with_iobinding(binding)
    outputs = binding.get_outputs_as_ortvaluevector()
    assert isinstance(outputs, rt_c.OrtValueVector)
    np.testing.assert_array_equal(outputs[0].numpy(), np.ones((2, 2), np.float32))


def test_device_enums_and_vendors_as_onnxruntime():
    for enum_name in ("OrtDeviceVendorId", "OrtDeviceMemoryType", "OrtMemoryInfoDeviceType"):
        ours, theirs = getattr(rt, enum_name), getattr(ort, enum_name)
        assert {m: int(v) for m, v in ours.__members__.items()} == {
            m: int(v) for m, v in theirs.__members__.items()}, enum_name
    for name in ("cpu", "gpu", "cuda", "npu", "dml", "cann", "webgpu"):
        ours, theirs = rt.OrtDevice.make(name, 0), ort.OrtDevice.make(name, 0)
        assert (ours.device_type(), ours.device_vendor_id()) == (
            theirs.device_type(), theirs.device_vendor_id()), name


def test_memory_info_create_v2_as_onnxruntime():
    def described(module):
        info = module.OrtMemoryInfo.create_v2(
            "Test", module.OrtMemoryInfoDeviceType.CPU, 0x8086, 0,
            module.OrtDeviceMemoryType.HOST_ACCESSIBLE, 128,
            module.OrtAllocatorType.ORT_ARENA_ALLOCATOR)
        return (info.name, info.device_id, int(info.mem_type), int(info.allocator_type),
                int(info.device_mem_type), info.device_vendor_id)

    assert described(rt) == described(ort) == ("Test", 0, -1, 1, 5, 0x8086)
    plain = rt.OrtMemoryInfo("Cpu", rt.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                             rt.OrtMemType.DEFAULT)
    assert (plain.device_mem_type, plain.device_vendor_id) == (rt.OrtDeviceMemoryType.DEFAULT, 0)
    with pytest.raises(ValueError):
        rt.OrtMemoryInfo.create_v2("Bad", 9, 0, 0, 0, 0, 1)


def test_build_info_and_unknown_provider_say_what_onnxruntime_says():
    assert "Build Info" in rt.get_build_info() and "Build Info" in ort.get_build_info()
    sess = rt.InferenceSession(_identity(), providers=["CPUExecutionProvider"])
    with pytest.raises(RuntimeError, match="Unknown Provider Type: InvalidProvider"):
        sess.set_providers(["InvalidProvider"])
    assert sess.get_input_epdevices() == [None]
    assert len(ort.InferenceSession(_identity()).get_input_epdevices()) == 1


def test_from_dlpack_takes_a_capsule():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    value = rt.OrtValue.ortvalue_from_numpy(array)
    again = rt.OrtValue.from_dlpack(value.__dlpack__())
    np.testing.assert_array_equal(again.numpy(), array)
    assert again.data_ptr() == value.data_ptr()  # no copy
    np.testing.assert_array_equal(ort.OrtValue.from_dlpack(array.__dlpack__()).numpy(), array)
    with pytest.raises(_errors.InvalidArgument, match="DLPack capsule"):
        rt.OrtValue.from_dlpack(3)


def test_void_arrays_feed_string_inputs_as_onnxruntime():
    model = _identity(TensorProto.STRING)
    results = []
    for raw in ([b"must", b"have", b"same", b"size"],
                [b"A\0A\0", b"B\0B\0", b"\xc3\xa9t!", b"x\0\0\0"]):  # zeros are kept
        x = np.array(raw, dtype=np.void).reshape(2, 2)
        ours = rt.InferenceSession(model).run(None, {"x": x})[0]
        theirs = ort.InferenceSession(model).run(None, {"x": x})[0]
        assert ours.tolist() == theirs.tolist()
        results.append(ours.tolist())
    assert results == [[["must", "have"], ["same", "size"]],
                       [["A\0A\0", "B\0B\0"], ["ét!", "x\0\0\0"]]]
    with pytest.raises(_errors.InvalidArgument, match="not UTF-8"):
        rt.InferenceSession(model).run(None, {"x": np.array([b"\xff\xfe"] * 4, np.void)
                                              .reshape(2, 2)})


@pytest.mark.parametrize("providers, options", [
    (None, None),
    (["a"], None),
    (["a", "b"], None),
    ([("a", {1: 2}), "b"], None),
    (["a", "b"], [{1: 2}, {}]),
    (["a", "d"], None),  # not available: kept, with a warning
])
def test_check_and_normalize_provider_args_as_onnxruntime(providers, options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = ort_collection.check_and_normalize_provider_args(providers, options, "abc")
        ours = rt_collection.check_and_normalize_provider_args(providers, options, "abc")
    assert ours == theirs


def test_check_and_normalize_provider_args_refuses_as_onnxruntime():
    with pytest.warns(UserWarning, match="Duplicate provider 'a'"):
        assert rt_collection.check_and_normalize_provider_args(
            ["a", "b", "a"], [{"x": 1}, {}, {"y": 2}], ["a", "b"]) == (
            ["a", "b"], [{"x": "1"}, {}])
    for providers, options in ((3, None), ([3], None), (["a"], 3), (["a"], ["not dict"]),
                               (["a", "b"], [{1: 2}]), ([("a", {1: 2})], [{3: 4}])):
        with pytest.raises(ValueError):
            ort_collection.check_and_normalize_provider_args(providers, options, ["a", "b"])
        with pytest.raises(ValueError):
            rt_collection.check_and_normalize_provider_args(providers, options, ["a", "b"])


def test_graph_assignment_info_one_node_a_subgraph_as_onnxruntime():
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["t0"], name="add_0"),
         helper.make_node("Mul", ["t0", "b"], ["t1"], name="mul_0"),
         helper.make_node("Add", ["t1", "a"], ["c"], name="add_1")], "g",
        [helper.make_tensor_value_info(n, f32, [2]) for n in "ab"],
        [helper.make_tensor_value_info("c", f32, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def assigned(module):
        so = module.SessionOptions()
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        sess = module.InferenceSession(model.SerializeToString(), so)
        return [(s.ep_name, [(n.domain, n.op_type, n.name) for n in s.get_nodes()])
                for s in sess.get_provider_graph_assignment_info()]

    assert sorted(assigned(rt)) == sorted(assigned(ort))
    assert len(assigned(rt)) == 3


def test_logger_callback_gets_onnxkiln_records(monkeypatch):
    messages = []
    try:
        rt.set_default_logger_callback(lambda *record: messages.append(record), severity=0)
        rt.InferenceSession(_identity())
        assert messages, "the callback was never called"
        for severity, category, logid, location, message in messages:
            assert severity in range(5) and category.startswith("onnxkiln")
            assert isinstance(logid, str) and ".py:" in location and isinstance(message, str)
        rt.set_default_logger_callback(None)
        count = len(messages)
        rt.InferenceSession(_identity())
        assert len(messages) == count  # removed
        for bad in ({"severity": 5}, {"severity": -1}):
            with pytest.raises(RuntimeError, match="severity must be 0 to 4"):
                rt.set_default_logger_callback(print, **bad)
        with pytest.raises(RuntimeError, match="callable or None"):
            rt.set_default_logger_callback("not a callable")

        def raising(*record):
            raise ValueError("from the callback")

        reported = []
        monkeypatch.setattr("sys.unraisablehook", reported.append)
        rt.set_default_logger_callback(raising, severity=0)
        y = rt.InferenceSession(_identity()).run(None, {"x": np.ones((2, 2), np.float32)})[0]
        assert y.tolist() == [[1, 1], [1, 1]]  # the run went on
        assert reported and all(str(r.exc_value) == "from the callback" for r in reported)
    finally:
        rt.set_default_logger_callback(None)
        rt.set_default_logger_severity(2)


def _vectorizer(key_type, vocabulary):
    """DictVectorizer over a map input (`vocabulary` is int64 or string keys)."""
    keyword = "int64_vocabulary" if key_type == TensorProto.INT64 else "string_vocabulary"
    value = helper.make_map_type_proto(key_type, helper.make_tensor_type_proto(
        TensorProto.FLOAT, []))
    graph = helper.make_graph(
        [helper.make_node("DictVectorizer", ["x"], ["y"], domain="ai.onnx.ml",
                          **{keyword: vocabulary})], "g",
        [helper.make_value_info("x", value)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)]).SerializeToString()


INT_MAP_FEEDS = [
    ({0: 1.0, "a": 2.0},
     "Unexpected key type  <class 'str'>, it cannot be linked to C type int64_t"),
    ({0.5: 1.0}, "Unexpected key type  <class 'float'>, it cannot be linked to C type int64_t"),
    ({0: "a"}, "Unexpected value type  <class 'str'>, it cannot be linked to C type int64_t"),
    ({0: None}, "Unexpected value type  <class 'NoneType'>, it cannot be linked"),
    ({"a": 1.0, 0: 2.0}, "Unexpected input data type. Actual: ((map(string,tensor(float))))"),
    ({b"a": 1.0}, "Key type must be int or string (not <class 'bytes'>)"),
    ({}, "Size of dictionary is empty"),
]


@pytest.mark.parametrize(("feed", "message"), INT_MAP_FEEDS)
def test_map_feeds_refused_as_onnxruntime_refuses_them(feed, message):
    model = _vectorizer(TensorProto.INT64, [0, 1, 2])
    with pytest.raises((RuntimeError, ort_c.InvalidArgument), match=re.escape(message)):
        ort.InferenceSession(model).run(None, {"x": feed})
    with pytest.raises(_errors.InvalidArgument, match=re.escape(message)):
        rt.InferenceSession(model).run(None, {"x": feed})


@pytest.mark.parametrize(("key_type", "vocabulary", "feed"), [
    (TensorProto.INT64, [0, 1, 2], {np.int32(1): np.float64(2.0), True: 3.0, 2: np.float32(4)}),
    (TensorProto.INT64, [0, 1, 2], {np.uint64(2): 1}),
    (TensorProto.STRING, ["a", "b"], {"b": np.float64(3.0), np.str_("a"): 1.0}),
    (TensorProto.STRING, ["a", "3"], {"a": 1.0, 3: 2.0}),
])
def test_map_feeds_accepted_as_onnxruntime_accepts_them(key_type, vocabulary, feed):
    model = _vectorizer(key_type, vocabulary)
    expected, = ort.InferenceSession(model).run(None, {"x": feed})
    got, = rt.InferenceSession(model).run(None, {"x": feed})
    np.testing.assert_array_equal(got, expected)
    with pytest.raises(_errors.InvalidArgument, match="expected: \\(\\(map"):
        other = {0: 1.0} if key_type == TensorProto.STRING else {"a": 1.0}
        rt.InferenceSession(model).run(None, {"x": other})


def test_optimized_model_of_a_model_with_external_data_saved_elsewhere(tmp_path):
    """The optimized model, written in another folder than its source, holds the weights
    the source kept in a file beside it (inline, or in the file the config entry names)."""
    source, out = tmp_path / "source", tmp_path / "out"
    source.mkdir()
    out.mkdir()
    weights = np.arange(64, dtype=np.float32).reshape(8, 8) / 64
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(weights, "w"),
         numpy_helper.from_array(np.ones(8, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, source / "m.onnx", save_as_external_data=True, location="m.bin",
              size_threshold=0)
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    expected, = ort.InferenceSession(str(source / "m.onnx")).run(None, {"x": x})
    for entries in ({}, {"session.optimized_model_external_initializers_file_name": "o.bin",
                         "session.optimized_model_external_initializers_min_size_in_bytes": "100"}):
        so = rt.SessionOptions()
        so.optimized_model_filepath = str(out / "o.onnx")
        for key, value in entries.items():
            so.add_session_config_entry(key, value)
        rt.InferenceSession(str(source / "m.onnx"), so)
        written = onnx.load(out / "o.onnx", load_external_data=False)
        locations = {t.name: [e.value for e in t.external_data if e.key == "location"]
                     for t in written.graph.initializer}
        assert locations == ({"w": [], "b": []} if not entries else {"w": ["o.bin"], "b": []})
        for runtime in (ort, rt):
            got, = runtime.InferenceSession(str(out / "o.onnx")).run(None, {"x": x})
            np.testing.assert_allclose(got, expected, rtol=1e-6)
        (out / "o.onnx").unlink()


def test_dict_feeds_only_maps_of_floats_as_onnxruntime():
    """onnxruntime turns every dict value into a float: a map of int64 values cannot be fed."""
    graph = helper.make_graph(
        [helper.make_node("DictVectorizer", ["x"], ["y"], domain="ai.onnx.ml",
                          string_vocabulary=["a", "b"])], "g",
        [helper.make_value_info("x", helper.make_map_type_proto(
            TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.INT64, [])))],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)]).SerializeToString()
    message = re.escape("Actual: ((map(string,tensor(float)))) , expected: "
                        "((map(string,tensor(int64))))")
    for feed in ({"a": 3}, {"a": np.array(3, np.int64)}):
        with pytest.raises(ort_c.InvalidArgument, match=message):
            ort.InferenceSession(model).run(None, {"x": feed})
        with pytest.raises(_errors.InvalidArgument, match=message):
            rt.InferenceSession(model).run(None, {"x": feed})
    float_model = _vectorizer(TensorProto.STRING, ["a", "b"])
    feed = {"b": np.array(2.5), "a": np.array(1, np.int64)}  # 0-d arrays are numbers too
    np.testing.assert_array_equal(rt.InferenceSession(float_model).run(None, {"x": feed})[0],
                                  ort.InferenceSession(float_model).run(None, {"x": feed})[0])


def test_map_type_outside_the_schema_is_an_invalid_graph_as_onnxruntime():
    graph = helper.make_graph(
        [helper.make_node("DictVectorizer", ["x"], ["y"], domain="ai.onnx.ml",
                          string_vocabulary=["a", "b"])], "g",
        [helper.make_value_info("x", helper.make_map_type_proto(
            TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.BOOL, [])))],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, None)])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)]).SerializeToString()
    with pytest.raises(ort_c.InvalidGraph, match="Type Error: Type 'map"):
        ort.InferenceSession(model)
    with pytest.raises(_errors.InvalidGraph, match=re.escape(
            "Type Error: Type 'map(string, bool)' of input parameter (x) of operator "
            "(DictVectorizer)")):
        rt.InferenceSession(model)
