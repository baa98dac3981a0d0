"""onnxkiln.compat against onnxruntime's documented Python API behaviour.

Ported from the expectations of onnxruntime's own Python tests (session construction,
input/output metadata, runs with output subsets, errors on bad feeds, SessionOptions,
RunOptions, OrtValue, IOBinding, the profiling file), written anew against
onnxkiln.compat. Where onnxruntime is installed, observable results (NodeArgs, metadata,
outputs, option defaults, profile event fields) are compared with it directly.
"""

from __future__ import annotations

import gc
import json
import logging
import re
import threading
import time
import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxkiln.compat as rt
from onnxkiln.compat._options import log_threshold
from onnxkiln.errors import (
    DeviceBindingError,
    InputNotFoundError,
    InvalidInputError,
    InvalidOptionError,
    KernelError,
    ModelLoadError,
    RunCancelledError,
    SequenceOutputError,
    SessionError,
    ShapeError,
    UnknownOptionError,
)
from onnxkiln.session import SessionBuilder
from onnxkiln.testing import tensor_info

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (test extra)")
ort.set_default_logger_severity(3)

CPU = ["CPUExecutionProvider"]


# --- models -----------------------------------------------------------------------------------


def make_model(nodes, inputs, outputs, initializers=None, opset=17, name="test"):
    """A ModelProto (outputs may leave their type or shape out: not checker-clean)."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _two_branch() -> onnx.ModelProto:
    """x[N,3], z[?,?], initializer-input w[3]; y1 = x + w (shape left to inference),
    y2 = x * z; model metadata filled in."""
    x = tensor_info("x", np.float32, ["N", 3])
    z = tensor_info("z", np.float32, [None, None])
    w = tensor_info("w", np.float32, [3])
    y1 = helper.make_tensor_value_info("y1", TensorProto.FLOAT, None)
    y2 = tensor_info("y2", np.float32, ["N", 3])
    nodes = [helper.make_node("Add", ["x", "w"], ["y1"], name="add"),
             helper.make_node("Mul", ["x", "z"], ["y2"], name="mul")]
    m = make_model(nodes, [x, z, w], [y1, y2], {"w": np.ones(3, np.float32)}, opset=17,
                   name="two_branch")
    m.producer_name, m.producer_version, m.domain = "probe", "1.0", "ai.test"
    m.doc_string, m.model_version, m.graph.doc_string = "model doc", 3, "graph doc"
    helper.set_model_props(m, {"author": "onnxkiln", "k": "v"})
    return m


def _diverging() -> onnx.ModelProto:
    """y = Relu(x); bad = Reshape(x, [7]) fails for any x that is not 7 elements."""
    x = tensor_info("x", np.float32, ["N", 3])
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"),
             helper.make_node("Reshape", ["x", "shape7"], ["bad"], name="reshape7")]
    return make_model(nodes, [x], [tensor_info("y", np.float32, ["N", 3]),
                                   tensor_info("bad", np.float32, [7])],
                      {"shape7": np.array([7], np.int64)}, opset=17)


def _relu_neg() -> onnx.ModelProto:
    x = tensor_info("x", np.float32, ["N", 3])
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"),
             helper.make_node("Neg", ["x"], ["z"], name="neg")]
    return make_model(nodes, [x], [tensor_info("y", np.float32, ["N", 3]),
                                   tensor_info("z", np.float32, ["N", 3])], opset=17)


def _typed_io() -> onnx.ModelProto:
    """string, bool, float16, int64 inputs through Identity/Not/Cast, a sequence output,
    and an output of unknown rank (Reshape to a runtime shape)."""
    ins = [tensor_info("s", np.object_, [2]), tensor_info("b", np.bool_, [2]),
           tensor_info("h", np.float16, ["n"]), tensor_info("x", np.float32, ["N", 3]),
           tensor_info("shape", np.int64, [2])]
    nodes = [helper.make_node("Identity", ["s"], ["s_out"]),
             helper.make_node("Not", ["b"], ["b_out"]),
             helper.make_node("Cast", ["h"], ["h_out"], to=TensorProto.DOUBLE),
             helper.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
             helper.make_node("Reshape", ["x", "shape"], ["r"])]
    outs = [tensor_info("s_out", np.object_, [2]), tensor_info("b_out", np.bool_, [2]),
            helper.make_tensor_value_info("h_out", TensorProto.DOUBLE, None),
            helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, None)]
    return make_model(nodes, ins, outs, opset=17)


def _typed_feeds() -> dict[str, np.ndarray]:
    return {"s": np.array(["a", "bc"], dtype=object), "b": np.array([True, False]),
            "h": np.array([1.5, -2.0], np.float16), "x": np.arange(6, dtype=np.float32)
            .reshape(2, 3), "shape": np.array([3, 2], np.int64)}


def _long_loop(iterations: int) -> onnx.ModelProto:
    """Loop `iterations` times adding 1 to a [4] float carry."""
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "one"], ["v_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.ones(4, np.float32), "one")])
    loop = helper.make_node("Loop", ["n", "cond", "v0"], ["v"], body=body)
    return make_model([loop], [tensor_info("v0", np.float32, [4])],
                      [tensor_info("v", np.float32, [4])],
                      {"n": np.array(iterations, np.int64), "cond": np.array(True)}, opset=17)


@pytest.fixture
def two_branch_path(tmp_path):
    path = tmp_path / "two_branch.onnx"
    onnx.save(_two_branch(), path)
    return path


def _ort(model, options=None) -> ort.InferenceSession:
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=CPU)


def _args(args) -> list[tuple]:
    return [(a.name, a.type, list(a.shape)) for a in args]


A = np.arange(6, dtype=np.float32).reshape(2, 3)


# --- construction -----------------------------------------------------------------------------


def test_session_from_str_path_pathlike_and_bytes(two_branch_path):
    feed = {"x": A, "z": A}
    want = _ort(_two_branch()).run(None, feed)
    for source in (str(two_branch_path), two_branch_path, two_branch_path.read_bytes()):
        sess = rt.InferenceSession(source, providers=CPU)
        if isinstance(source, bytes):
            assert sess._model_path is None and sess._model_bytes == source
        else:
            assert sess._model_path == str(two_branch_path)  # optimum reads it
        for ours, theirs in zip(sess.run(None, feed), want):
            np.testing.assert_array_equal(ours, theirs)


def test_bad_model_sources_raise_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="Unable to load from type"):
        rt.InferenceSession(123)
    with pytest.raises(ModelLoadError, match="does not exist"):
        rt.InferenceSession(tmp_path / "missing.onnx")
    with pytest.raises(ModelLoadError, match="not a valid ONNX protobuf"):
        rt.InferenceSession(b"\x08\x07garbage")


def test_default_providers_and_options(two_branch_path):
    sess = rt.InferenceSession(two_branch_path)
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    assert rt.get_available_providers()[-1] == "CPUExecutionProvider"
    assert "CUDAExecutionProvider" in rt.get_all_providers()
    assert rt.get_device() in ("CPU", "GPU")


def test_provider_options_are_strings(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=[
        ("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested", "n": 2})])
    assert sess.get_provider_options() == {
        "CPUExecutionProvider": {"arena_extend_strategy": "kSameAsRequested", "n": "2"}}
    sess = rt.InferenceSession(two_branch_path, providers=CPU, provider_options=[{"a": 1}])
    assert sess.get_provider_options() == {"CPUExecutionProvider": {"a": "1"}}


@pytest.mark.skipif("CUDAExecutionProvider" in rt.get_available_providers(),
                    reason="CUDA can run here: no fallback to observe")
def test_cuda_provider_falls_back_to_cpu_with_a_warning(two_branch_path):
    with pytest.warns(UserWarning, match="'CUDAExecutionProvider' is not in available"):
        sess = rt.InferenceSession(
            two_branch_path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.session.device_id().type.value == "cpu"
    np.testing.assert_array_equal(sess.run(["y2"], {"x": A, "z": A})[0], A * A)


def test_other_onnxruntime_providers_are_skipped_with_a_warning(two_branch_path):
    with pytest.warns(UserWarning, match="'TensorrtExecutionProvider' is not in available"):
        sess = rt.InferenceSession(two_branch_path, providers=["TensorrtExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_duplicate_provider_warns(two_branch_path):
    with pytest.warns(UserWarning, match="Duplicate provider"):
        rt.InferenceSession(two_branch_path, providers=CPU * 2)


@pytest.mark.parametrize(("providers", "options", "match"), [
    (["FooExecutionProvider"], None, "unknown execution provider 'FooExecutionProvider'"),
    ("CPUExecutionProvider", None, "should be a sequence of provider names"),
    (CPU, [{}, {}], "same length"),
    ([("CPUExecutionProvider", {})], [{}], "Only string values"),
    (CPU, ["x"], "must be dicts"),
    ([("CPUExecutionProvider",)], None, r"strings or \(string, dict\) tuples"),
    (None, [{}], "without 'providers'"),
])
def test_bad_provider_arguments_raise_value_errors(two_branch_path, providers, options, match):
    with pytest.raises(InvalidOptionError, match=match) as info:
        rt.InferenceSession(two_branch_path, providers=providers, provider_options=options)
    assert isinstance(info.value, ValueError)


def test_set_providers_rebuilds_the_session(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    sess.run(["y1"], {"x": A, "z": A})
    sess.set_providers(["CPUExecutionProvider"], [{"k": "v"}])
    assert sess.get_provider_options() == {"CPUExecutionProvider": {"k": "v"}}
    np.testing.assert_array_equal(sess.run(["y1"], {"x": A, "z": A})[0], A + 1)
    with pytest.raises(InvalidOptionError, match="InvalidProvider"):
        sess.set_providers(["InvalidProvider"])


# --- metadata ---------------------------------------------------------------------------------


def test_inputs_outputs_and_initializers_match_onnxruntime(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    theirs = ort.InferenceSession(str(two_branch_path), providers=CPU)
    assert _args(sess.get_inputs()) == _args(theirs.get_inputs()) == [
        ("x", "tensor(float)", ["N", 3]), ("z", "tensor(float)", [None, None])]
    assert _args(sess.get_outputs()) == _args(theirs.get_outputs()) == [
        ("y1", "tensor(float)", ["N", 3]), ("y2", "tensor(float)", ["N", 3])]
    assert _args(sess.get_overridable_initializers()) == _args(
        theirs.get_overridable_initializers()) == [("w", "tensor(float)", [3])]
    assert str(sess.get_inputs()[0]) == "NodeArg(name='x', type='tensor(float)', shape=['N', 3])"


def test_type_strings_and_shapes_match_onnxruntime():
    model = _typed_io()
    sess = rt.InferenceSession(model.SerializeToString(), providers=CPU)
    theirs = _ort(model)
    assert _args(sess.get_inputs()) == _args(theirs.get_inputs())
    assert _args(sess.get_outputs()) == _args(theirs.get_outputs())
    assert [a.type for a in sess.get_outputs()] == [
        "tensor(string)", "tensor(bool)", "tensor(double)", "seq(tensor(float))",
        "tensor(float)"]


def test_optional_input_type_string_matches_onnxruntime():
    opt = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))
    graph = helper.make_graph([helper.make_node("OptionalHasElement", ["o"], ["h"])], "g",
                              [opt], [helper.make_tensor_value_info("h", TensorProto.BOOL, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    sess = rt.InferenceSession(model.SerializeToString(), providers=CPU)
    assert _args(sess.get_inputs()) == _args(_ort(model).get_inputs()) == [
        ("o", "optional(tensor(float))", [2])]
    # an optional input may be left out of the feed
    assert sess.run(None, {})[0].item() is False
    assert sess.run(None, {"o": np.ones(2, np.float32)})[0].item() is True


def test_string_keyed_map_type_matches_onnxruntime():
    zipmap = helper.make_node("ZipMap", ["p"], ["m"], domain="ai.onnx.ml",
                              classlabels_strings=["a", "b"])
    out = helper.make_value_info("m", helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.STRING,
                                   helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    graph = helper.make_graph([zipmap], "g", [tensor_info("p", np.float32, ["N", 2])], [out])
    model = helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    sess = rt.InferenceSession(model.SerializeToString(), providers=CPU)
    assert _args(sess.get_outputs()) == _args(_ort(model).get_outputs()) == [
        ("m", "seq(map(string,tensor(float)))", [])]
    p = np.array([[0.25, 0.75]], np.float32)
    assert sess.run(None, {"p": p})[0] == _ort(model).run(None, {"p": p})[0]


def test_modelmeta_matches_onnxruntime(two_branch_path):
    ours = rt.InferenceSession(two_branch_path, providers=CPU).get_modelmeta()
    theirs = ort.InferenceSession(str(two_branch_path), providers=CPU).get_modelmeta()
    for field in ("producer_name", "graph_name", "domain", "description",
                  "graph_description", "version", "custom_metadata_map"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.custom_metadata_map == {"author": "onnxkiln", "k": "v"}


def test_overridable_initializer_can_be_fed(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    w = np.full(3, 10, np.float32)
    (y1,) = sess.run(["y1"], {"x": A, "z": A, "w": w})
    np.testing.assert_array_equal(y1, A + 10)
    np.testing.assert_array_equal(
        y1, ort.InferenceSession(str(two_branch_path), providers=CPU).run(
            ["y1"], {"x": A, "z": A, "w": w})[0])


# --- run ----------------------------------------------------------------------------------


def test_run_none_and_empty_list_return_every_output(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    for names in (None, []):
        y1, y2 = sess.run(names, {"x": A, "z": A})
        np.testing.assert_array_equal(y1, A + 1)
        np.testing.assert_array_equal(y2, A * A)


def test_run_output_subsets_keep_the_requested_order(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    theirs = ort.InferenceSession(str(two_branch_path), providers=CPU)
    feed = {"x": A, "z": A + 1}
    for names in (["y2"], ["y1"], ["y2", "y1"], ("y1",), ["y2", "y2"]):
        ours, want = sess.run(names, feed), theirs.run(list(names), feed)
        assert len(ours) == len(want) == len(names)
        for a, b in zip(ours, want):
            np.testing.assert_array_equal(a, b)


def test_run_with_an_output_subset_does_not_compute_other_outputs():
    model = _diverging()
    sess = rt.InferenceSession(model.SerializeToString(), providers=CPU)
    with pytest.raises(KernelError):
        sess.run(None, {"x": A})
    (y,) = sess.run(["y"], {"x": A})  # the failing Reshape is pruned away
    np.testing.assert_array_equal(y, np.maximum(A, 0))
    # onnxruntime 1.32 runs every node here (even with only_execute_path_to_fetches) and
    # fails; pruning is onnxkiln.compat's choice, the kept outputs' values are the same


def test_pruned_sessions_are_cached_per_output_subset(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    feed = {"x": A, "z": A}
    sess.run(["y1"], feed)
    sess.run(["y1"], feed)
    sess.run(["y2", "y1"], feed)  # every output: the full session
    assert list(sess._subsets) == [frozenset({"y1"})]
    pruned, _ = sess._subsets[frozenset({"y1"})]
    assert [n.op_type for n in pruned.graph()] == ["Add"]
    assert pruned.cache_stats().hits >= 1


def test_only_requested_nodes_appear_in_the_profile(tmp_path):
    so = rt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prune")
    sess = rt.InferenceSession(_relu_neg().SerializeToString(), so, providers=CPU)
    sess.run(["z"], {"x": A})
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    assert [e["args"]["op_name"] for e in events if e["cat"] == "Node"] == ["Neg"]


@pytest.mark.parametrize(("feed", "error", "match"), [
    ({"x": A}, InvalidInputError, re.escape("Required inputs (['z']) are missing from input "
                                            "feed (['x']).")),
    ({"x": A, "z": A, "q": A}, InputNotFoundError, "unknown input 'q'"),
    ({"x": A.astype(np.float64), "z": A}, InvalidInputError, "expects float32"),
    ({"x": A[None], "z": A}, ShapeError, "expects rank 2"),
    ({"x": np.ones((2, 4), np.float32), "z": A}, ShapeError, "expects dim 3 at axis 1"),
])
def test_bad_feeds_raise_session_errors(two_branch_path, feed, error, match):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    with pytest.raises(error, match=match) as info:
        sess.run(None, feed)
    assert isinstance(info.value, SessionError)
    assert isinstance(info.value, RuntimeError)
    # onnxruntime refuses the same feeds (with its own exception classes)
    with pytest.raises(Exception):  # noqa: B017 (onnxruntime's own exception classes)
        ort.InferenceSession(str(two_branch_path), providers=CPU).run(None, feed)


def test_missing_input_is_a_value_error_as_in_onnxruntime(two_branch_path):
    with pytest.raises(ValueError, match="are missing from input feed"):
        ort.InferenceSession(str(two_branch_path), providers=CPU).run(None, {"x": A})
    with pytest.raises(ValueError, match="are missing from input feed"):
        rt.InferenceSession(two_branch_path, providers=CPU).run(None, {"x": A})


def test_bad_output_names_and_feed_types(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    feed = {"x": A, "z": A}
    with pytest.raises(InvalidInputError, match="Invalid output name: 'nope'"):
        sess.run(["nope"], feed)
    with pytest.raises(InvalidInputError, match=r"write \['y1'\]"):
        sess.run("y1", feed)
    with pytest.raises(InvalidInputError, match="must be a dict"):
        sess.run(None, [("x", A), ("z", A)])


def test_python_lists_and_typed_inputs_match_onnxruntime():
    model = _typed_io()
    feeds = _typed_feeds()
    sess = rt.InferenceSession(model.SerializeToString(), providers=CPU)
    theirs = _ort(model).run(None, feeds)
    ours = sess.run(None, feeds)
    for name, a, b in zip([o.name for o in sess.get_outputs()], ours, theirs):
        if name == "seq":
            assert isinstance(a, list) and len(a) == len(b) == 2
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
        else:
            assert a.dtype == np.asarray(b).dtype, name
            np.testing.assert_array_equal(a, b)
    listed = dict(feeds, x=A.tolist(), s=["a", "bc"])
    for a, b in zip(sess.run(["r", "s_out"], listed), _ort(model).run(["r", "s_out"], listed)):
        np.testing.assert_array_equal(a, b)


def test_zipmap_output_is_a_list_of_dicts_as_in_onnxruntime():
    pytest.importorskip("skl2onnx")
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3)).astype(np.float32)
    model = to_onnx(LogisticRegression().fit(X, X[:, 0] > 0), X[:1])
    sess = rt.InferenceSession(model.SerializeToString(), providers=CPU)
    theirs = _ort(model)
    assert _args(sess.get_outputs()) == _args(theirs.get_outputs())
    assert sess.get_outputs()[1].type == "seq(map(int64,tensor(float)))"
    (probs,) = sess.run(["output_probability"], {"X": X[:3]})
    (want,) = theirs.run(["output_probability"], {"X": X[:3]})
    assert [sorted(p) for p in probs] == [sorted(p) for p in want]
    for p, q in zip(probs, want):
        for k in q:
            assert p[k] == pytest.approx(q[k], rel=1e-5, abs=1e-6)


def test_run_with_ort_values(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    x = rt.OrtValue.ortvalue_from_numpy(A)
    outs = sess.run_with_ort_values(["y2"], {"x": x, "z": x})
    assert len(outs) == 1 and isinstance(outs[0], rt.OrtValue)
    np.testing.assert_array_equal(outs[0].numpy(), A * A)
    # OrtValues are accepted in run() too, as in onnxruntime
    np.testing.assert_array_equal(sess.run(["y2"], {"x": x, "z": A})[0], A * A)
    with pytest.raises(InvalidInputError, match="not an OrtValue"):
        sess.run_with_ort_values(None, {"x": A, "z": A})


def test_sequence_ortvalue_from_run_with_ort_values():
    model = _typed_io()
    sess = rt.InferenceSession(model.SerializeToString(), providers=CPU)
    feeds = {k: rt.OrtValue.ortvalue_from_numpy(v) for k, v in _typed_feeds().items()}
    (seq,) = sess.run_with_ort_values(["seq"], feeds)
    assert seq.is_tensor_sequence() and not seq.is_tensor()
    assert seq.data_type() == "seq(tensor(float))"
    with pytest.raises(SequenceOutputError, match="holds a sequence"):
        seq.numpy()


def test_runs_from_several_threads(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            x = np.full((k + 1, 3), k, np.float32)
            for _ in range(20):
                names = ["y1"] if k % 2 else ["y2", "y1"]
                outs = dict(zip(names, sess.run(names, {"x": x, "z": x})))
                np.testing.assert_array_equal(outs["y1"], x + 1)
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# --- SessionOptions -----------------------------------------------------------------------------


_OPTION_FIELDS = (
    "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "enable_profiling",
    "graph_optimization_level", "inter_op_num_threads", "intra_op_num_threads",
    "log_severity_level", "log_verbosity_level", "logid", "optimized_model_filepath",
    "profile_file_prefix", "use_deterministic_compute", "use_per_session_threads",
)


def test_session_options_defaults_match_onnxruntime():
    ours, theirs = rt.SessionOptions(), ort.SessionOptions()
    for field in _OPTION_FIELDS:
        assert getattr(ours, field) == getattr(theirs, field), field
    assert int(ours.execution_mode) == int(theirs.execution_mode)
    assert {k: int(v) for k, v in rt.GraphOptimizationLevel.__members__.items()} == {
        k: int(v) for k, v in ort.GraphOptimizationLevel.__members__.items()}


def test_session_options_reject_unknown_attributes():
    so = rt.SessionOptions()
    with pytest.raises(AttributeError):
        so.intra_op_threads = 2  # the onnxruntime name is intra_op_num_threads


def test_session_config_entries():
    so = rt.SessionOptions()
    so.add_session_config_entry("session.load_model_format", "ONNX")
    assert so.get_session_config_entry("session.load_model_format") == "ONNX"
    with pytest.raises(UnknownOptionError, match="does not have configuration with key: nope"):
        so.get_session_config_entry("nope")
    with pytest.raises(RuntimeError):  # onnxruntime raises a RuntimeError here too
        so.get_session_config_entry("nope")
    with pytest.raises(InvalidOptionError, match="two strings"):
        so.add_session_config_entry("k", 1)


def test_known_config_entries_reach_onnxkiln(two_branch_path):
    so = rt.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "2")
    with pytest.raises(InvalidOptionError, match="ep.context_enable"):
        rt.InferenceSession(two_branch_path, so, providers=CPU)
    so = rt.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no equivalent
    rt.InferenceSession(two_branch_path, so, providers=CPU)


@pytest.mark.parametrize("level", list(rt.GraphOptimizationLevel))
def test_every_optimization_level_runs_as_onnxruntime(two_branch_path, level):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    sess = rt.InferenceSession(two_branch_path, so, providers=CPU)
    assert sess.get_session_options().graph_optimization_level == level
    theirs = ort.SessionOptions()
    theirs.graph_optimization_level = ort.GraphOptimizationLevel(int(level))
    want = ort.InferenceSession(str(two_branch_path), theirs, providers=CPU)
    feed = {"x": A, "z": A}
    for a, b in zip(sess.run(None, feed), want.run(None, feed)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_bad_option_values_raise_at_session_build(two_branch_path):
    so = rt.SessionOptions()
    so.graph_optimization_level = 5
    with pytest.raises(InvalidOptionError, match="graph_optimization_level"):
        rt.InferenceSession(two_branch_path, so, providers=CPU)
    so = rt.SessionOptions()
    so.intra_op_num_threads = "2"
    with pytest.raises(InvalidOptionError, match="intra_op_num_threads"):
        rt.InferenceSession(two_branch_path, so, providers=CPU)
    with pytest.raises(InvalidOptionError, match="onnxkiln.compat.SessionOptions"):
        rt.InferenceSession(two_branch_path, ort.SessionOptions(), providers=CPU)


def test_intra_op_threads_and_copied_options(two_branch_path, monkeypatch):
    calls: list[int] = []
    original = SessionBuilder.intra_op_threads

    def spy(self, n):
        calls.append(n)
        return original(self, n)

    monkeypatch.setattr(SessionBuilder, "intra_op_threads", spy)
    so = rt.SessionOptions()
    rt.InferenceSession(two_branch_path, so, providers=CPU)
    assert calls == []  # 0: onnxkiln's default
    so.intra_op_num_threads = 2
    sess = rt.InferenceSession(two_branch_path, so, providers=CPU)
    so.intra_op_num_threads = 7
    assert calls == [2]
    assert sess.get_session_options().intra_op_num_threads == 2
    np.testing.assert_array_equal(sess.run(["y2"], {"x": A, "z": A})[0], A * A)
    assert calls == [2, 2]  # the pruned session for ['y2'] has the same settings


def test_optimized_model_filepath_is_written(tmp_path, two_branch_path):
    so = rt.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = rt.InferenceSession(two_branch_path, so, providers=CPU)
    sess.run(["y1"], {"x": A, "z": A})  # a pruned session must not overwrite the file
    saved = rt.InferenceSession(tmp_path / "opt.onnx", providers=CPU)
    assert [a.name for a in saved.get_outputs()] == ["y1", "y2"]
    np.testing.assert_array_equal(saved.run(["y2"], {"x": A, "z": A})[0], A * A)


def test_log_severity_silences_onnxkiln_warnings_on_this_thread_only(caplog):
    log = logging.getLogger("onnxkiln.partition")
    other: list[None] = []
    with caplog.at_level(logging.WARNING, logger="onnxkiln"), log_threshold(3):
        log.warning("hidden")
        log.error("shown error")
        t = threading.Thread(target=lambda: (log.warning("other thread"), other.append(None)))
        t.start()
        t.join()
    log.warning("shown after")
    messages = [r.getMessage() for r in caplog.records]
    assert "hidden" not in messages
    assert {"shown error", "other thread", "shown after"} <= set(messages)


def test_default_logger_severity_sets_the_onnxkiln_logger():
    logger = logging.getLogger("onnxkiln")
    before = logger.level
    try:
        rt.set_default_logger_severity(3)
        assert logger.level == logging.ERROR
        with pytest.raises(InvalidOptionError):
            rt.set_default_logger_severity(7)
    finally:
        rt.set_default_logger_severity(2)
        logger.setLevel(before)


# --- profiling ----------------------------------------------------------------------------------


def test_profiling_file_name_content_and_end(tmp_path, two_branch_path):
    so = rt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "kiln")
    sess = rt.InferenceSession(two_branch_path, so, providers=CPU)
    assert sess.get_profiling_start_time_ns() > 0
    feed = {"x": A, "z": A}
    sess.run(None, feed)
    path = sess.end_profiling()
    assert re.fullmatch(re.escape(str(tmp_path / "kiln")) +
                        r"_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{3}\.json", path)
    assert sess.end_profiling() == ""  # ended already, as in onnxruntime
    size = (tmp_path / path).stat().st_size
    sess.run(None, feed)  # not profiled any more
    assert (tmp_path / path).stat().st_size == size

    theirs_opts = ort.SessionOptions()
    theirs_opts.enable_profiling = True
    theirs_opts.profile_file_prefix = str(tmp_path / "ort")
    theirs = ort.InferenceSession(str(two_branch_path), theirs_opts, providers=CPU)
    theirs.run(None, feed)
    with open(theirs.end_profiling()) as f:
        ort_nodes = [e for e in json.load(f) if e["cat"] == "Node"]
    with open(path) as f:
        events = json.load(f)
    nodes = [e for e in events if e["cat"] == "Node"]
    assert {e["name"] for e in nodes} == {e["name"] for e in ort_nodes} == {
        "add_kernel_time", "mul_kernel_time"}
    for ours, ref in zip(sorted(nodes, key=lambda e: e["name"]),
                         sorted(ort_nodes, key=lambda e: e["name"])):
        assert set(ref) <= set(ours)
        for key in ("op_name", "provider", "node_index", "input_type_shape",
                    "output_type_shape"):
            assert key in ours["args"]
        assert ours["args"]["op_name"] == ref["args"]["op_name"]
        assert ours["args"]["provider"] == ref["args"]["provider"]
        assert ours["args"]["input_type_shape"] == ref["args"]["input_type_shape"]
        assert ours["args"]["output_type_shape"] == ref["args"]["output_type_shape"]


def test_profile_is_written_when_the_session_goes_away(tmp_path, two_branch_path):
    so = rt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "gone")
    sess = rt.InferenceSession(two_branch_path, so, providers=CPU)
    sess.run(None, {"x": A, "z": A})
    del sess
    gc.collect()
    (written,) = tmp_path.glob("gone_*.json")
    assert any(e["cat"] == "Node" for e in json.loads(written.read_text()))


def test_no_profiling_by_default(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    assert sess.end_profiling() == ""
    assert sess.get_profiling_start_time_ns() == 0


# --- RunOptions ---------------------------------------------------------------------------------


def test_run_options_defaults_match_onnxruntime():
    ours, theirs = rt.RunOptions(), ort.RunOptions()
    for field in ("log_severity_level", "log_verbosity_level", "logid",
                  "only_execute_path_to_fetches", "terminate"):
        assert getattr(ours, field) == getattr(theirs, field), field
    ours.add_run_config_entry("gpu_graph_id", "1")
    assert ours.get_run_config_entry("gpu_graph_id") == "1"
    with pytest.raises(UnknownOptionError):
        ours.get_run_config_entry("nope")


def test_terminate_set_before_the_run(two_branch_path):
    sess = rt.InferenceSession(two_branch_path, providers=CPU)
    ro = rt.RunOptions()
    ro.logid = "tagged"
    ro.terminate = True
    with pytest.raises(RunCancelledError, match="terminate flag"):
        sess.run(None, {"x": A, "z": A}, ro)
    ro.terminate = False
    np.testing.assert_array_equal(sess.run(["y2"], {"x": A, "z": A}, ro)[0], A * A)


def test_terminate_from_another_thread_stops_a_running_loop():
    model = _long_loop(5_000_000)
    sess = rt.InferenceSession(model.SerializeToString(), providers=CPU)
    ro = rt.RunOptions()
    timer = threading.Timer(0.2, lambda: setattr(ro, "terminate", True))
    start = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(RunCancelledError):
            sess.run(None, {"v0": np.zeros(4, np.float32)}, ro)
    finally:
        timer.cancel()
    assert time.perf_counter() - start < 30
    assert ro.terminate
    ro.terminate = False
    small = rt.InferenceSession(_long_loop(3).SerializeToString(), providers=CPU)
    np.testing.assert_array_equal(small.run(None, {"v0": np.zeros(4, np.float32)}, ro)[0],
                                  np.full(4, 3, np.float32))


# --- OrtValue -----------------------------------------------------------------------------------


def test_ortvalue_from_numpy_shares_memory_and_matches_onnxruntime():
    a = A.copy()
    ours, theirs = rt.OrtValue.ortvalue_from_numpy(a), ort.OrtValue.ortvalue_from_numpy(a)
    for method in ("shape", "data_type", "element_type", "device_name", "is_tensor",
                   "has_value", "tensor_size_in_bytes", "is_tensor_sequence"):
        assert getattr(ours, method)() == getattr(theirs, method)(), method
    assert ours.data_ptr() == a.ctypes.data
    view = ours.numpy()
    assert np.shares_memory(view, a)
    view[0, 0] = 42
    assert a[0, 0] == 42
    np.testing.assert_array_equal(np.asarray(ours), a)
    ours.update_inplace(np.zeros_like(a))
    assert not a.any()
    with pytest.raises(InvalidInputError, match="elements"):
        ours.update_inplace(np.zeros(5, np.float32))


def test_ortvalue_from_numpy_copies_non_contiguous_arrays():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    v = rt.OrtValue.ortvalue_from_numpy(a)
    np.testing.assert_array_equal(v.numpy(), a)
    assert v.numpy().flags.c_contiguous


@pytest.mark.parametrize("element_type", [np.float32, np.int64, TensorProto.INT64,
                                          TensorProto.FLOAT16, np.bool_])
def test_ortvalue_from_shape_and_type_matches_onnxruntime(element_type):
    ours = rt.OrtValue.ortvalue_from_shape_and_type([2, 3], element_type)
    theirs = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], element_type)
    assert ours.shape() == theirs.shape() == [2, 3]
    assert ours.data_type() == theirs.data_type()
    assert ours.element_type() == theirs.element_type()


def test_ortvalue_on_another_device_is_refused():
    with pytest.raises(DeviceBindingError, match="host memory"):
        rt.OrtValue.ortvalue_from_numpy(A, "cuda", 0)
    with pytest.raises(DeviceBindingError, match="host memory"):
        rt.OrtValue.ortvalue_from_shape_and_type([2], np.float32, "cuda", 0)


def test_ortvalue_with_onnx_type_reinterprets_bits():
    bits = np.array([0x3F80, 0x4000], np.uint16)  # bfloat16 1.0, 2.0
    v = rt.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, TensorProto.BFLOAT16)
    assert v.data_type() == "tensor(bfloat16)"
    np.testing.assert_array_equal(v.numpy().astype(np.float32), [1.0, 2.0])
    assert v.numpy().dtype == ml_dtypes.bfloat16
    with pytest.raises(InvalidInputError, match="item sizes"):
        rt.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, TensorProto.FLOAT)


# --- IOBinding ----------------------------------------------------------------------------------


@pytest.fixture
def relu_neg():
    model = _relu_neg()
    return rt.InferenceSession(model.SerializeToString(), providers=CPU), _ort(model)


def test_bind_cpu_input_and_allocated_outputs_match_onnxruntime(relu_neg):
    sess, theirs = relu_neg
    results = []
    for s in (sess, theirs):
        b = s.io_binding()
        b.bind_cpu_input("x", A - 2)
        b.bind_output("z")
        b.bind_output("y")
        b.synchronize_inputs()
        s.run_with_iobinding(b)
        b.synchronize_outputs()
        outs = b.get_outputs()
        assert len(outs) == 2
        results.append([o.numpy() for o in outs])
        copied = b.copy_outputs_to_cpu()
        for o, c in zip(outs, copied):
            np.testing.assert_array_equal(o.numpy(), c)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(results[0][0], -(A - 2))


def test_bind_input_by_data_ptr_of_an_ortvalue(relu_neg):
    sess, _ = relu_neg
    x = rt.OrtValue.ortvalue_from_numpy(A - 2)
    b = sess.io_binding()
    b.bind_input("x", "cpu", 0, np.float32, [2, 3], x.data_ptr())
    b.bind_output("y")
    sess.run_with_iobinding(b)
    np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], np.maximum(A - 2, 0))
    # the same buffer read as [1, 3] (a prefix)
    b.bind_input("x", "cpu", 0, np.float32, [1, 3], x.data_ptr())
    sess.run_with_iobinding(b)
    np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], np.maximum(A - 2, 0)[:1])
    # an output of one run feeds the next by pointer
    (y,) = b.get_outputs()
    b.bind_input("x", "cpu", 0, np.float32, y.shape(), y.data_ptr())
    sess.run_with_iobinding(b)


def test_bind_input_refuses_foreign_and_oversized_pointers(relu_neg):
    sess, _ = relu_neg
    raw = A.copy()
    b = sess.io_binding()
    with pytest.raises(DeviceBindingError, match="not the data_ptr"):
        b.bind_input("x", "cpu", 0, np.float32, [2, 3], raw.ctypes.data)
    x = rt.OrtValue.ortvalue_from_numpy(raw)
    with pytest.raises(DeviceBindingError, match="needs 48 bytes"):
        b.bind_input("x", "cpu", 0, np.float32, [4, 3], x.data_ptr())
    with pytest.raises(DeviceBindingError, match="host memory"):
        b.bind_input("x", "cuda", 0, np.float32, [2, 3], x.data_ptr())
    for shape in ([-1, 3], [-2], [2, -3]):  # numpy would infer or reinterpret them
        with pytest.raises(DeviceBindingError, match="negative dim"):
            b.bind_input("x", "cpu", 0, np.float32, shape, x.data_ptr())
        with pytest.raises(DeviceBindingError, match="negative dim"):
            b.bind_output("y", "cpu", 0, np.float32, shape, x.data_ptr())


def test_preallocated_outputs_receive_the_results(relu_neg):
    sess, theirs = relu_neg
    y = rt.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
    zbuf = np.zeros((2, 3), np.float32)
    z = rt.OrtValue.ortvalue_from_numpy(zbuf)
    b = sess.io_binding()
    b.bind_cpu_input("x", A - 2)
    b.bind_ortvalue_output("y", y)
    b.bind_output("z", "cpu", 0, np.float32, [2, 3], z.data_ptr())
    sess.run_with_iobinding(b)
    np.testing.assert_array_equal(y.numpy(), np.maximum(A - 2, 0))
    np.testing.assert_array_equal(zbuf, -(A - 2))
    outs = b.get_outputs()
    assert outs[0] is y and outs[1].data_ptr() == z.data_ptr()
    # onnxruntime fills a preallocated OrtValue the same way
    ty = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
    tb = theirs.io_binding()
    tb.bind_cpu_input("x", A - 2)
    tb.bind_ortvalue_output("y", ty)
    theirs.run_with_iobinding(tb)
    np.testing.assert_array_equal(ty.numpy(), y.numpy())


def test_preallocated_output_of_the_wrong_shape_raises(relu_neg):
    sess, _ = relu_neg
    b = sess.io_binding()
    b.bind_cpu_input("x", A)
    b.bind_ortvalue_output("y", rt.OrtValue.ortvalue_from_shape_and_type([3, 3], np.float32))
    with pytest.raises(ShapeError, match=r"float\[3, 3\] but this run computed float\[2, 3\]"):
        sess.run_with_iobinding(b)
    with pytest.raises(InvalidInputError, match="`element_type` and `shape`"):
        b.bind_output("y", "cpu", 0, None, None, 1234)


def test_binding_errors(relu_neg):
    sess, _ = relu_neg
    b = sess.io_binding()
    with pytest.raises(InputNotFoundError, match="no input named 'nope'"):
        b.bind_cpu_input("nope", A)
    with pytest.raises(InvalidInputError, match="no output named 'nope'"):
        b.bind_output("nope")
    with pytest.raises(InvalidInputError, match="at least one output"):
        sess.run_with_iobinding(b)
    b.bind_output("y")
    with pytest.raises(InvalidInputError, match=re.escape("Required inputs (['x'])")):
        sess.run_with_iobinding(b)
    b.bind_cpu_input("x", A)
    sess.run_with_iobinding(b)
    b.clear_binding_inputs()
    with pytest.raises(InvalidInputError, match="Required inputs"):
        sess.run_with_iobinding(b)
    other = rt.InferenceSession(_relu_neg().SerializeToString(), providers=CPU)
    with pytest.raises(InvalidInputError, match="session that created it"):
        other.run_with_iobinding(b)
    b.clear_binding_outputs()
    assert b.get_outputs() == []


def test_rebinding_an_output_keeps_its_place(relu_neg):
    sess, _ = relu_neg
    b = sess.io_binding()
    b.bind_cpu_input("x", A)
    b.bind_output("y")
    b.bind_output("z")
    b.bind_output("y")
    sess.run_with_iobinding(b)
    y, z = b.copy_outputs_to_cpu()
    np.testing.assert_array_equal(y, A)
    np.testing.assert_array_equal(z, -A)


def test_iobinding_with_one_output_runs_the_pruned_graph():
    sess = rt.InferenceSession(_diverging().SerializeToString(), providers=CPU)
    b = sess.io_binding()
    b.bind_ortvalue_input("x", rt.OrtValue.ortvalue_from_numpy(A))
    b.bind_output("y")
    sess.run_with_iobinding(b)  # 'bad' (a failing Reshape) is not computed
    np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], A)


def test_run_options_reach_iobinding_runs(relu_neg):
    sess, _ = relu_neg
    b = sess.io_binding()
    b.bind_cpu_input("x", A)
    b.bind_output("y")
    ro = rt.RunOptions()
    ro.terminate = True
    with pytest.raises(RunCancelledError):
        sess.run_with_iobinding(b, ro)


def test_warnings_are_python_warnings_not_prints(two_branch_path, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rt.InferenceSession(two_branch_path, providers=["CoreMLExecutionProvider"])
    assert any("CoreMLExecutionProvider" in str(w.message) for w in caught)
    assert capsys.readouterr().out == ""


# --- what exporters write: negative dims, loose dim names, model versions ---------------------
def _paddle_like() -> onnx.ModelProto:
    """x: float32[-1, 3, ?, ?] (paddle2onnx's spelling) and y: float32[?] added to it."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["?"])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [-1, 3, "?", "?"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_negative_dims_and_repeated_dim_names_as_on_onnxruntime():
    model = _paddle_like()
    ours, theirs = rt.InferenceSession(model.SerializeToString(), providers=CPU), _ort(model)
    assert _args(ours.get_inputs()) == _args(theirs.get_inputs()) == [
        ("x", "tensor(float)", [None, 3, "?", "?"]), ("y", "tensor(float)", ["?"])]
    assert _args(ours.get_outputs()) == _args(theirs.get_outputs())
    x = np.arange(2 * 3 * 2 * 4, dtype=np.float32).reshape(2, 3, 2, 4)
    for y in (np.ones(4, np.float32), np.ones(1, np.float32)):  # '?' differs from x's '?'s
        np.testing.assert_array_equal(ours.run(None, {"x": x, "y": y})[0],
                                      theirs.run(None, {"x": x, "y": y})[0])
    with pytest.raises(Exception, match="broadcast") as mine:
        ours.run(None, {"x": x, "y": np.ones(3, np.float32)})
    with pytest.raises(Exception, match="broadcast"):
        theirs.run(None, {"x": x, "y": np.ones(3, np.float32)})
    assert "Add" in str(mine.value)


@pytest.mark.parametrize("version", [None, 0, 5])
def test_model_version_as_onnxruntime_reports_it(version):
    model = _paddle_like()
    if version is not None:
        model.model_version = version
    ours = rt.InferenceSession(model.SerializeToString(), providers=CPU).get_modelmeta()
    assert ours.version == _ort(model).get_modelmeta().version
    assert ours.version == (2 ** 63 - 1 if version is None else version)


def test_numpy_str_and_bytes_arrays_feed_string_inputs_through_compat():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [None])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ours = rt.InferenceSession(model.SerializeToString(), providers=CPU)
    text = np.array(["a", "b\u00e9"])
    (want,) = _ort(model).run(None, {"x": text})
    for given in (text, np.char.encode(text, "utf-8")):
        assert ours.run(None, {"x": given})[0].tolist() == want.tolist() == ["a", "b\u00e9"]


def test_session_made_outputs_have_a_backing_base_as_onnxruntime_returns_them(two_branch_path):
    """onnxruntime hands out session-owned outputs as arrays backed by another object; so
    does compat, with the same memory and values, and nothing shared with the feeds."""
    feeds = {"x": A, "z": A + 1}
    ours = rt.InferenceSession(two_branch_path).run(None, feeds)
    theirs = _ort(_two_branch()).run(None, feeds)
    assert all(t.base is not None for t in theirs)
    for o, t in zip(ours, theirs, strict=True):
        assert o.base is not None and not np.shares_memory(o, A)
        np.testing.assert_array_equal(o, t)
    ours[0][...] = 0  # the caller's to change: the next run is unaffected
    np.testing.assert_array_equal(rt.InferenceSession(two_branch_path).run(["y1"], feeds)[0],
                                  theirs[0])
