"""InferenceSession: running, input validation, metadata, builder options, caches."""

from __future__ import annotations

import logging
import threading

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxkiln as ok
from onnxkiln import (
    DataType,
    ExecutionProviderUnavailableError,
    InferenceSession,
    InputNotFoundError,
    InvalidInputError,
    InvalidOptionError,
    KernelError,
    SequenceOutputError,
    ShapeError,
    UnknownOptionError,
)
from onnxkiln.testing import make_model, ort_session, tensor_info


def _two_input_model() -> onnx.ModelProto:
    """y = relu(a + b), z = a * 2 with a symbolic batch dim shared by both inputs."""
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
        helper.make_node("Mul", ["a", "two"], ["z"], name="double"),
    ]
    model = make_model(
        nodes,
        [tensor_info("a", np.float32, ["batch", 3]), tensor_info("b", np.float32, ["batch", 3])],
        [tensor_info("y", np.float32, ["batch", 3]), tensor_info("z", np.float32, ["batch", 3])],
        {"two": np.float32(2)},
        name="two_inputs",
    )
    model.producer_name = "unit-test"
    model.producer_version = "1.2"
    model.model_version = 7
    model.doc_string = "a test model"
    helper.set_model_props(model, {"author": "onnxkiln", "purpose": "tests"})
    return model


A = np.array([[1, -2, 3], [-4, 5, -6]], dtype=np.float32)
B = np.array([[0.5, 0.5, -5], [1, 1, 1]], dtype=np.float32)


@pytest.fixture(scope="module")
def session() -> InferenceSession:
    return InferenceSession.from_graph(_two_input_model())


def test_run_returns_outputs_in_graph_order(session):
    y, z = session.run({"a": A, "b": B})
    np.testing.assert_array_equal(y, np.maximum(A + B, 0))
    np.testing.assert_array_equal(z, A * 2)
    assert y.dtype == np.float32 and z.dtype == np.float32


def test_run_accepts_pairs_and_python_lists(session):
    y, _ = session.run([("a", A.tolist()), ("b", B)])
    np.testing.assert_array_equal(y, np.maximum(A + B, 0))
    assert y.dtype == np.float32


def test_run_outputs_keeps_kinds(session):
    res = session.run_outputs({"a": A, "b": B})
    assert [r.name for r in res] == ["y", "z"]
    assert all(r.kind == "tensor" for r in res)
    np.testing.assert_array_equal(res[1].as_tensor(), A * 2)
    with pytest.raises(SequenceOutputError):
        res[0].as_sequence()


def test_unknown_input_lists_valid_names_and_closest(session):
    with pytest.raises(InputNotFoundError) as info:
        session.run({"a": A, "bb": B})
    text = str(info.value)
    assert "unknown input 'bb'" in text and "['a', 'b']" in text and "did you mean 'b'" in text
    assert isinstance(info.value, KeyError)


def test_missing_required_input_is_named(session):
    with pytest.raises(InputNotFoundError, match="missing required input 'b'.*requires"):
        session.run({"a": A})


def test_duplicate_input_is_rejected(session):
    with pytest.raises(InvalidInputError, match="input 'a' is given twice"):
        session.run([("a", A), ("a", A), ("b", B)])


def test_dtype_mismatch_says_expected_got_and_how_to_cast(session):
    with pytest.raises(InvalidInputError) as info:
        session.run({"a": A.astype(np.float64), "b": B})
    text = str(info.value)
    assert "expects float32" in text and "got float64 array of shape (2, 3)" in text
    assert "x.astype(np.float32)" in text
    assert isinstance(info.value, ValueError)


def test_python_floats_for_an_int_input_are_refused():
    model = make_model([helper.make_node("Identity", ["i"], ["o"])],
                       [tensor_info("i", np.int64, [2])], [tensor_info("o", np.int64, [2])])
    s = InferenceSession.from_graph(model)
    np.testing.assert_array_equal(s.run({"i": [3, 4]})[0], np.array([3, 4], np.int64))
    with pytest.raises(InvalidInputError, match="expects int64"):
        s.run({"i": [1.5, 2.0]})


@pytest.mark.parametrize(("dtype", "values", "bad"), [
    (np.int8, [200, -129], "-129"), (np.int32, [2**40], str(2**40)),
    (np.uint8, [-1], "-1"), (np.int64, [2**63], str(2**63)),
    (np.float16, [1e6], "1000000.0"), (np.float32, [1e40], "1e+40")])
def test_python_numbers_that_do_not_fit_the_dtype_are_refused(dtype, values, bad):
    """numpy would wrap the integers and turn the floats into inf; the error names both."""
    model = make_model([helper.make_node("Identity", ["i"], ["o"])],
                       [tensor_info("i", dtype, [None])], [tensor_info("o", dtype, [None])])
    s = InferenceSession.from_graph(model)
    with pytest.raises(InvalidInputError, match=np.dtype(dtype).name) as info:
        s.run({"i": values})
    assert bad in str(info.value)
    edge = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else np.finfo(dtype)
    fits = [int(edge.min), int(edge.max)] if np.dtype(dtype).kind in "iu" else [float(edge.max)]
    np.testing.assert_array_equal(s.run({"i": fits})[0], np.array(fits, dtype))
    if np.dtype(dtype).kind == "f":  # infinity itself is a value, not an overflow
        assert s.run({"i": [float("inf")]})[0].tolist() == [np.inf]


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_ndarray_subclasses_run_as_plain_arrays():
    """np.matrix would stay 2-D under numpy's functions and a masked array would skip its
    masked entries; both are read as their plain data (as onnxruntime reads them)."""
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["u"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("CumSum", ["x", "axis"], ["c"])]
    model = make_model(nodes, [tensor_info("x", np.float32, [2, 2])],
                       [tensor_info("u", np.float32, [1, 2, 2]), tensor_info("s", np.float32, []),
                        tensor_info("c", np.float32, [2, 2])],
                       {"axes": np.array([0], np.int64), "axis": np.array(1, np.int64)})
    s = InferenceSession.from_graph(model)
    data = np.array([[1, 2], [3, 4]], np.float32)
    for x in (np.matrix(data), np.ma.masked_array(data, mask=[[0, 1], [0, 0]])):
        u, total, c = s.run({"x": x})
        assert type(u) is np.ndarray and u.shape == (1, 2, 2)
        assert total.shape == () and float(total) == 10.0
        np.testing.assert_array_equal(c, np.cumsum(data, axis=1))


def test_rank_and_static_dim_mismatch(session):
    with pytest.raises(ShapeError, match=r"expects rank 2.*got shape \(3,\)"):
        session.run({"a": A[0], "b": B})
    with pytest.raises(ShapeError, match=r"expects dim 3 at axis 1.*got shape \(2, 2\)"):
        session.run({"a": A[:, :2], "b": B})


def test_equal_named_dims_may_differ_as_on_onnxruntime(session):
    """'batch' in both inputs is no contract: (2, 3) + (1, 3) broadcasts, as onnxruntime runs
    it; sizes that cannot broadcast fail in the Add, not in validation."""
    theirs = ort_session(_two_input_model())
    for feeds in ({"a": A, "b": B[:1]}, {"a": A[:1], "b": B}):
        for got, want in zip(session.run(feeds), theirs.run(None, feeds), strict=True):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(KernelError, match=r"node 'add'.*broadcast"):
        session.run({"a": A, "b": np.ones((3, 3), np.float32)})


def test_inputs_outputs_metadata(session):
    ins, outs = session.inputs(), session.outputs()
    assert [(m.name, m.dtype, m.shape, m.kind, m.optional) for m in ins] == [
        ("a", DataType.FLOAT, ("batch", 3), "tensor", False),
        ("b", DataType.FLOAT, ("batch", 3), "tensor", False),
    ]
    assert [(m.name, m.shape) for m in outs] == [("y", ("batch", 3)), ("z", ("batch", 3))]


def test_model_metadata(session):
    meta = session.model_metadata()
    assert meta.producer_name == "unit-test" and meta.producer_version == "1.2"
    assert meta.model_version == 7 and meta.doc_string == "a test model"
    assert meta.graph_name == "two_inputs"
    assert meta.metadata_props == {"author": "onnxkiln", "purpose": "tests"}
    assert meta.opset_imports == {"": 21}
    assert meta.ir_version == 10


def test_graph_and_device_id(session):
    assert [n.op_type for n in session.graph()] == ["Add", "Relu", "Mul"]
    assert session.device_id() == ok.DeviceId(ok.DeviceType.CPU, 0)
    assert str(session.device_id()) == "cpu"


def test_specialisation_cache_counts_signatures():
    s = InferenceSession.from_graph(_two_input_model())
    s.run({"a": A, "b": B})
    s.run({"a": A + 1, "b": B})
    assert s.cache_stats() == ok.CacheStats(entries=1, hits=1, misses=1, evictions=0)
    s.run({"a": A[:1], "b": B[:1]})
    assert s.cache_stats() == ok.CacheStats(entries=2, hits=1, misses=2, evictions=0)


def test_warmup_makes_the_first_run_a_hit():
    s = (InferenceSession.builder()
         .warmup([ok.WarmupShape("a", (4, 3)), ok.WarmupShape("b", (4, 3))])
         .from_graph(_two_input_model()))
    assert s.cache_stats().misses == 1
    s.run({"a": np.ones((4, 3), np.float32), "b": np.ones((4, 3), np.float32)})
    assert s.cache_stats() == ok.CacheStats(entries=1, hits=1, misses=1, evictions=0)
    with pytest.raises(InputNotFoundError, match="warmup names unknown input 'c'"):
        s.warmup([ok.WarmupShape("c", (1,))])


def test_builder_rejects_unknown_options_and_bad_values():
    b = InferenceSession.builder()
    with pytest.raises(UnknownOptionError) as info:
        b.option("ep.context_enabled", "1")
    assert "ep.context_enable" in str(info.value) and "valid keys" in str(info.value)
    with pytest.raises(InvalidOptionError, match=r"must be one of \['0', '1'\], got 'yes'"):
        b.option("ep.context_enable", "yes")
    with pytest.raises(InvalidOptionError, match="optimization level"):
        b.optimization("max")
    with pytest.raises(InvalidOptionError, match="device must be"):
        b.device("tpu")
    with pytest.raises(InvalidOptionError, match="intra_op_threads"):
        b.intra_op_threads(0)
    with pytest.raises(InvalidOptionError, match="unknown provider 'rocm'"):
        b.providers(["rocm"]).from_graph(_two_input_model())
    assert b.option("ep.context_enable", "1") is b


def test_builder_stores_optimization_level():
    s = InferenceSession.builder().optimization("basic").from_graph(_two_input_model())
    assert s._optimization == "basic"


def test_cuda_without_cpu_is_an_error_when_cuda_cannot_run():
    with pytest.raises(ExecutionProviderUnavailableError, match="cuda.*without 'cpu'"):
        InferenceSession.builder().providers(["cuda"]).from_graph(_two_input_model())


def test_cuda_device_falls_back_to_cpu_with_a_warning(caplog):
    from onnxkiln import partition

    partition._warned.clear()
    with caplog.at_level(logging.WARNING, logger="onnxkiln.partition"):
        s = InferenceSession.builder().device("cuda").from_graph(_two_input_model())
    assert s.device_id().type is ok.DeviceType.CPU
    assert any("CUDA requested but unavailable" in r.message for r in caplog.records)
    np.testing.assert_array_equal(s.run({"a": A, "b": B})[1], A * 2)


def test_blas_is_single_threaded_during_a_run_and_restored_after():
    from onnxkiln import threads

    s = InferenceSession.builder().intra_op_threads(2).from_graph(_two_input_model())
    before = threads.blas_threads()
    seen = []
    generic = s._compiled

    def spy(values):
        seen.append(threads.blas_threads())
        return generic(values)

    s._compiled = spy
    s.run({"a": A, "b": B})
    assert seen and all(n == 1 for n in seen[0].values())
    assert threads.blas_threads() == before


def test_kernel_failure_names_node_and_chains_the_cause():
    model = make_model(
        [helper.make_node("Gather", ["data", "idx"], ["y"], name="lookup", axis=0)],
        [tensor_info("data", np.float32, [3, 2]), tensor_info("idx", np.int64, [1])],
        [tensor_info("y", np.float32, [1, 2])],
    )
    s = InferenceSession.from_graph(model)
    with pytest.raises(KernelError) as info:
        s.run({"data": np.zeros((3, 2), np.float32), "idx": np.array([7])})
    assert info.value.node_name == "lookup" and info.value.op_type == "Gather"
    assert "node 'lookup' (ai.onnx::Gather opset 21" in str(info.value)
    assert info.value.__cause__ is not None


def test_outputs_never_alias_inputs_or_weights():
    w = np.arange(4, dtype=np.float32)
    model = make_model(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["w"], ["z"])],
        [tensor_info("x", np.float32, [4])],
        [tensor_info("y", np.float32, [4]), tensor_info("z", np.float32, [4])], {"w": w},
    )
    s = InferenceSession.from_graph(model)
    x = np.ones(4, np.float32)
    y, z = s.run({"x": x})
    y[:] = 5
    z[:] = 5
    np.testing.assert_array_equal(x, 1)
    np.testing.assert_array_equal(s.run({"x": x})[1], w)


def test_initializer_backed_input_is_optional_and_overridable():
    model = make_model(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        [tensor_info("x", np.float32, [2]), tensor_info("bias", np.float32, [2])],
        [tensor_info("y", np.float32, [2])], {"bias": np.array([10, 20], np.float32)},
    )
    s = InferenceSession.from_graph(model)
    assert [(m.name, m.optional) for m in s.inputs()] == [("x", False), ("bias", True)]
    x = np.array([1, 2], np.float32)
    np.testing.assert_array_equal(s.run({"x": x})[0], [11, 22])
    np.testing.assert_array_equal(s.run({"x": x, "bias": x})[0], [2, 4])


def test_values_are_freed_after_their_last_use():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
         helper.make_node("Add", ["x", "b"], ["y"])],
        [tensor_info("x", np.float32, [2])], [tensor_info("y", np.float32, [2])],
    )
    s = InferenceSession.builder().option("memory.inplace", "0").from_graph(model)
    plan = s._plan
    slot = {n: i for i, n in enumerate(plan.slot_names)}
    assert plan.last_use[slot["a"]] == 1 and plan.last_use[slot["b"]] == 2
    assert plan.last_use[slot["x"]] == 2 and slot["y"] not in plan.last_use
    source = s._compiled.source.splitlines()
    line = source.index(f"    v{slot['b']} = k1(v{slot['a']})")
    assert source[line + 1] == f"    del v{slot['a']}"
    np.testing.assert_array_equal(s.run({"x": np.array([-1, 2], np.float32)})[0], [-1, 0])


def test_constant_nodes_are_evaluated_at_plan_time():
    model = make_model(
        [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", 1, [2], [3, 4])),
         helper.make_node("Mul", ["x", "c"], ["y"])],
        [tensor_info("x", np.float32, [2])], [tensor_info("y", np.float32, [2])],
    )
    s = InferenceSession.from_graph(model)
    assert [st.op_type for st in s._plan.steps] == ["Mul"]
    np.testing.assert_array_equal(s.run({"x": np.array([1, 2], np.float32)})[0], [3, 8])


def test_concurrent_runs_from_threads_are_correct(session):
    rng = np.random.default_rng(0)
    feeds = [{"a": rng.standard_normal((5, 3)).astype(np.float32),
              "b": rng.standard_normal((5, 3)).astype(np.float32)} for _ in range(8)]
    errors = []

    def work(f):
        for _ in range(50):
            y, z = session.run(f)
            if not (np.array_equal(y, np.maximum(f["a"] + f["b"], 0))
                    and np.array_equal(z, f["a"] * 2)):
                errors.append("mismatch")

    threads = [threading.Thread(target=work, args=(f,)) for f in feeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_string_initializers_come_out_as_str_objects():
    model = make_model(
        [helper.make_node("Identity", ["s"], ["y"])], [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.STRING, [2])],
        {"s": np.array(["ab", "é"], dtype=object)},
    )
    y = InferenceSession.from_graph(model).run({})[0]
    assert y.dtype == object and y.tolist() == ["ab", "é"]


def test_a_name_in_the_wrong_case_suggests_the_right_one():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                       [tensor_info("x", np.float32, [2])], [tensor_info("y", np.float32, [2])])
    with pytest.raises(InputNotFoundError, match="unknown input 'X'.*did you mean 'x'"):
        InferenceSession.from_graph(model).run({"X": np.zeros(2, np.float32)})


def test_constructor_takes_a_path_bytes_or_a_model_with_builder_keywords(tmp_path):
    """What onnxruntime users type first: InferenceSession(model, providers=...)."""
    proto = _two_input_model()
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    expected = InferenceSession.from_graph(proto).run({"a": A, "b": B})
    for model in (str(path), path, proto.SerializeToString(), proto,
                  ok.loader.from_graph(proto)):
        s = InferenceSession(model, providers=["CPUExecutionProvider"], intra_op_threads=1,
                             optimization="basic", options={"specialize": "0"})
        for got, want in zip(s.run({"a": A, "b": B}), expected):
            np.testing.assert_array_equal(got, want)
        assert s._threads == 1 and s._optimization == "basic"
    with pytest.raises(InvalidOptionError, match="no option 'thread'; it takes"):
        InferenceSession(proto, thread=2)
    with pytest.raises(InvalidOptionError, match="intra_op_threads must be an int"):
        InferenceSession(proto, intra_op_threads=0)
    with pytest.raises(ok.ModelLoadError, match="a model is a path, serialized bytes"):
        InferenceSession(42)
    with pytest.raises(ok.ModelLoadError, match="got bytes: use load_bytes"):
        InferenceSession.load(proto.SerializeToString())
    with pytest.raises(InvalidOptionError, match="external_data_dir is for models given as"):
        InferenceSession(str(path), external_data_dir=str(tmp_path))


def _branchy_model() -> onnx.ModelProto:
    """y = relu(x); z = reshape(x, [3]), which fails for any x that is not 3 long."""
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Reshape", ["x", "s"], ["z"])]
    return make_model(nodes, [tensor_info("x", np.float32, [None])],
                      [tensor_info("y", np.float32, [None]), tensor_info("z", np.float32, [3])],
                      {"s": np.array([3], np.int64)})


def test_run_takes_onnxruntime_order_and_an_outputs_selection():
    s = InferenceSession(_branchy_model())
    x = np.array([-1, 2, -3], np.float32)
    y, z = np.maximum(x, 0), x
    for got in (s.run({"x": x}), s.run(None, {"x": x}), s.run([], {"x": x})):
        np.testing.assert_array_equal(got[0], y)
        np.testing.assert_array_equal(got[1], z)
    (zz,) = s.run(["z"], {"x": x})
    np.testing.assert_array_equal(zz, z)
    first, second = s.run({"x": x}, outputs=["z", "z"])
    first[0] = 99  # a name asked twice: two arrays
    assert second[0] == -1
    out = s.run_outputs(["z", "y"], {"x": x})
    assert [o.name for o in out] == ["z", "y"]
    np.testing.assert_array_equal(out[1].value, y)
    with pytest.raises(InvalidInputError, match=r"unknown output 'Y'.*did you mean 'y'"):
        s.run(["Y"], {"x": x})
    with pytest.raises(InvalidInputError, match="not both"):
        s.run(["y"], {"x": x}, outputs=["y"])
    with pytest.raises(InvalidInputError, match="RunOptions"):
        s.run(None, {"x": x}, None)


def test_an_outputs_selection_runs_only_the_nodes_it_needs():
    """Pruned as onnxkiln.compat prunes: the Reshape that fails is not needed for y."""
    s = InferenceSession(_branchy_model())
    x = np.arange(4, dtype=np.float32) - 2
    with pytest.raises(KernelError, match="Reshape"):
        s.run({"x": x})
    for _ in range(2):  # the second call reuses the cached pruned plan
        (y,) = s.run(["y"], {"x": x})
        np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert len(s._pruned_plans) == 1
    (y,) = s.run(["y"], {"x": x}, cancel=threading.Event())  # the hooked path prunes too
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_pasted_onnxruntime_code_runs_and_matches_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    path = str(tmp_path / "m.onnx")
    onnx.save(_two_input_model(), path)
    feeds = {"a": A, "b": B}
    theirs = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ours = ok.InferenceSession(path, providers=["CPUExecutionProvider"])
    for names in (None, ["z"], ["z", "y"]):
        for got, want in zip(ours.run(names, feeds), theirs.run(names, feeds), strict=True):
            np.testing.assert_array_equal(got, want)


def _negative_dims_model() -> onnx.ModelProto:
    """Relu and Shape of x: float32[-1, 3, ?, ?] as paddle2onnx declares it."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [-1, 3, "?", "?"])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [-1, 3, "?", "?"])
    shape = helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, [4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]),
                               helper.make_node("Shape", ["x"], ["shape"])], "g", [x], [y, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("level", ["disabled", "all"])
def test_negative_dims_mean_any_size_as_on_onnxruntime(level):
    model = _negative_dims_model()
    s = InferenceSession.builder().optimization(level).from_graph(model)
    assert [m.shape for m in (*s.inputs(), *s.outputs())] == [
        (None, 3, "?", "?"), (None, 3, "?", "?"), (4,)]
    theirs = ort_session(model)
    assert [m.shape for m in theirs.get_inputs()] == [[None, 3, "?", "?"]]
    for batch in (1, 4):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 3, 2, 5), np.float32)}
        for got, want in zip(s.run(feeds), theirs.run(None, feeds), strict=True):
            np.testing.assert_array_equal(got, want)  # Shape is not folded to [-1, 3, ...]
    with pytest.raises(ShapeError, match="expects dim 3 at axis 1"):
        s.run({"x": np.zeros((1, 2, 2, 5), np.float32)})


def _strings_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.STRING, [None])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.STRING, [None])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_numpy_str_and_bytes_arrays_feed_string_inputs():
    """`U` arrays as onnxruntime takes them; `S` arrays decode as UTF-8 (onnxruntime reads
    them as the same text given as str objects should be)."""
    s = InferenceSession.from_graph(_strings_model())
    theirs = ort_session(_strings_model())
    text = np.array(["a", "\u00e9t\u00e9", ""])
    (want,) = theirs.run(None, {"x": text})
    for given in (text, np.char.encode(text, "utf-8"), text.astype(object)):
        (got,) = s.run({"x": given})
        assert got.dtype == object and [type(v) for v in got] == [str] * 3
        assert got.tolist() == want.tolist() == ["a", "\u00e9t\u00e9", ""]
    with pytest.raises(InvalidInputError, match=r"input 'x'.*element \[1\] is not UTF-8"):
        s.run({"x": np.array([b"ok", b"\xff"])})
    with pytest.raises(InvalidInputError, match="cast it with x.astype"):
        s.run({"x": np.zeros(2, np.float32)})


def test_numpy_str_and_bytes_arrays_feed_a_sequence_of_strings():
    seq = helper.make_tensor_sequence_value_info("s", onnx.TensorProto.STRING, [None])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.STRING, [None])
    index = helper.make_tensor("i", onnx.TensorProto.INT64, [], [1])
    graph = helper.make_graph([helper.make_node("SequenceAt", ["s", "i"], ["y"])], "g", [seq],
                              [y], [index])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    items = [np.array(["a"]), np.array(["b\u00e9", "c"])]
    (want,) = ort_session(model).run(None, {"s": items})
    s = InferenceSession.from_graph(model)
    for given in (items, [np.char.encode(a, "utf-8") for a in items]):
        (got,) = s.run({"s": given})
        assert got.dtype == object and got.tolist() == want.tolist() == ["b\u00e9", "c"]


def test_model_metadata_version_and_opsets_as_the_file_says():
    """No model_version: INT64_MAX, as onnxruntime reports; opsets are the file's, not those
    fusions add (Gelu fused into an onnxkiln/com.microsoft op)."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    c = {n: helper.make_tensor(n, onnx.TensorProto.FLOAT, [], [v])
         for n, v in (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))}
    nodes = [helper.make_node(op, ins, [out]) for op, ins, out in (
        ("Div", ["x", "sqrt2"], "d"), ("Erf", ["d"], "e"), ("Add", ["e", "one"], "p"),
        ("Mul", ["x", "p"], "m"), ("Mul", ["m", "half"], "y"))]
    graph = helper.make_graph(nodes, "g", [x], [y], list(c.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    s = InferenceSession.from_graph(model)
    assert len(list(s.graph())) == 1  # fused
    meta = s.model_metadata()
    assert meta.opset_imports == {"": 17}
    assert meta.model_version == ort_session(model).get_modelmeta().version == 2 ** 63 - 1
    model.model_version = 0
    assert InferenceSession.from_graph(model).model_metadata().model_version == 0

