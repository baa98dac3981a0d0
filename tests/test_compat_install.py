"""onnxruntime programs, unchanged, on onnxkiln: `onnxkiln.compat.install()`,
`python -m onnxkiln.compat SCRIPT`, onnxruntime's exception classes, module functions,
device descriptors and the session and options calls real packages make. Each is checked
against onnxruntime on the same call where that makes sense."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from packaging.version import Version

import onnxkiln
import onnxkiln.compat as rt
from onnxkiln.compat import _errors
from onnxkiln.errors import InvalidInputError, InvalidOptionError, ModelLoadError

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (test extra)")
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state  # noqa: E402

F32 = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), opset=17, **kw):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kw)


def _relu(dim="N"):
    return _model([helper.make_node("Relu", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", F32, [dim, 3])],
                  [helper.make_tensor_value_info("y", F32, [dim, 3])])


def _add_w(w=None):
    w = np.ones(3, np.float32) if w is None else w
    return _model([helper.make_node("Add", ["x", "w"], ["y"])],
                  [helper.make_tensor_value_info("x", F32, ["N", 3])],
                  [helper.make_tensor_value_info("y", F32, ["N", 3])],
                  [numpy_helper.from_array(w, "w")])


@pytest.fixture
def relu_path(tmp_path):
    path = tmp_path / "relu.onnx"
    onnx.save(_relu(), path)
    return str(path)


def _run_python(args, cwd, timeout=120):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


# -- install() and `python -m onnxkiln.compat` ----------------------------------------

SCRIPT = '''
import json, sys
import numpy as np
import onnxruntime as ort
import onnxruntime.capi._pybind_state as C
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument, NoSuchFile, Fail
from onnxruntime.capi.onnxruntime_inference_collection import InferenceSession
import onnxruntime.backend as backend

sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
y, = sess.run(None, {"x": np.array([[-1, 0, 2]], np.float32)})
caught = []
try:
    sess.run(None, {"x": np.ones((1, 3), np.int64)})
except InvalidArgument as e:
    caught.append("InvalidArgument")
try:
    ort.InferenceSession(sys.argv[1] + ".missing")
except NoSuchFile:
    caught.append("NoSuchFile")
ro = ort.RunOptions()
ro.terminate = True
try:
    sess.run(None, {"x": np.ones((1, 3), np.float32)}, ro)
except C.Fail:
    caught.append("Fail")
rep = backend.prepare(sys.argv[1])
z = rep.run(np.array([[3, -3, 1]], np.float32))[0]
print(json.dumps({"y": y.tolist(), "z": z.tolist(), "caught": caught,
                  "is_collection_class": InferenceSession is type(sess),
                  "version_ok": ort.__version__.count(".") == 2,
                  "argv": sys.argv[2:], "name": __name__}))
sys.exit(3)
'''


def test_script_runs_unchanged_as_on_onnxruntime(tmp_path, relu_path):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    kiln = _run_python(["-m", "onnxkiln.compat", str(script), relu_path, "--flag"], tmp_path)
    real = _run_python([str(script), relu_path, "--flag"], tmp_path)
    assert kiln.returncode == real.returncode == 3, kiln.stderr[-2000:]
    got = json.loads(kiln.stdout.strip().splitlines()[-1])
    want = json.loads(real.stdout.strip().splitlines()[-1])
    assert got == want
    assert got["y"] == [[0.0, 0.0, 2.0]] and got["z"] == [[3.0, 0.0, 1.0]]
    assert got["caught"] == ["InvalidArgument", "NoSuchFile", "Fail"]
    assert got["argv"] == ["--flag"] and got["name"] == "__main__"


def test_script_sees_onnxkiln_and_run_module(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text(textwrap.dedent('''
        import sys
        import onnxruntime, onnxkiln.compat
        print(onnxruntime is onnxkiln.compat, sys.argv[1:])
    '''))
    out = _run_python(["-m", "onnxkiln.compat", "-m", "mypkg.tool", "a", "b"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "['a',", "'b']"]


def test_bad_command_lines(tmp_path):
    out = _run_python(["-m", "onnxkiln.compat"], tmp_path)
    assert out.returncode == 2 and "usage" in out.stderr
    out = _run_python(["-m", "onnxkiln.compat", "nope.py"], tmp_path)
    assert out.returncode == 2 and "can't open file 'nope.py'" in out.stderr


def test_install_refuses_when_onnxruntime_is_imported(tmp_path):
    code = textwrap.dedent('''
        import onnxruntime
        import onnxkiln.compat
        try:
            onnxkiln.compat.install()
        except ImportError as e:
            print(type(e).__name__, "|", e)
        print(onnxkiln.compat.installed(), __import__("sys").modules["onnxruntime"] is onnxruntime)
    ''')
    out = _run_python(["-c", code], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.strip().splitlines()
    assert first.startswith("InstallError | onnxkiln.compat.install(): the real onnxruntime is "
                            "already imported")
    assert "python -m onnxkiln.compat" in first
    assert second == "False True"


def test_install_aliases_and_other_submodules(tmp_path):
    code = textwrap.dedent('''
        import sys
        import onnxkiln.compat
        onnxkiln.compat.install(); onnxkiln.compat.install()   # a second call does nothing
        import onnxruntime, onnxruntime.capi.onnxruntime_pybind11_state as S
        import onnxruntime.capi._pybind_state as P
        print(onnxruntime is onnxkiln.compat, P.InvalidArgument is S.InvalidArgument,
              S.Fail.__module__, onnxruntime.capi.onnxruntime_pybind11_state is S)
        try:
            import onnxruntime.transformers
        except ModuleNotFoundError as e:
            print("refused", e.name)
        onnxkiln.compat.uninstall()
        print("onnxruntime" in sys.modules, onnxkiln.compat.installed())
    ''')
    out = _run_python(["-c", code], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines() == [
        "True True onnxruntime.capi.onnxruntime_pybind11_state True",
        "refused onnxruntime.transformers", "False False"]


# -- exception classes ----------------------------------------------------------------

def _error_cases(tmp_path, relu_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"garbage\xff\xff")
    unknown = _model([helper.make_node("FooOp", ["x"], ["y"], domain="x.y")],
                     [helper.make_tensor_value_info("x", F32, [2])],
                     [helper.make_tensor_value_info("y", F32, [2])])
    unknown.opset_import.append(helper.make_opsetid("x.y", 1))
    reshape = _model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                     [helper.make_tensor_value_info("x", F32, [2, 3]),
                      helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                     [helper.make_tensor_value_info("y", F32, None)]).SerializeToString()
    x = np.ones((2, 3), np.float32)
    ro_flag = []

    def terminated(m):
        ro = m.RunOptions()
        ro.terminate = True
        ro_flag.append(ro)
        return m.InferenceSession(relu_path).run(None, {"x": x}, ro)

    return {
        "dtype": lambda m: m.InferenceSession(relu_path).run(None, {"x": x.astype(np.int64)}),
        "rank": lambda m: m.InferenceSession(relu_path).run(None, {"x": x[None]}),
        "dim": lambda m: m.InferenceSession(relu_path).run(None, {"x": np.ones((2, 4),
                                                                                np.float32)}),
        "output_name": lambda m: m.InferenceSession(relu_path).run(["q"], {"x": x}),
        "missing_file": lambda m: m.InferenceSession(relu_path + ".missing"),
        "garbage": lambda m: m.InferenceSession(str(garbage)),
        "unknown_op": lambda m: m.InferenceSession(unknown.SerializeToString()),
        "kernel": lambda m: m.InferenceSession(reshape).run(
            None, {"x": x, "s": np.array([5, 5])}),
        "terminate": terminated,
    }


@pytest.mark.parametrize("name", ["dtype", "rank", "dim", "output_name", "missing_file",
                                  "garbage", "unknown_op", "kernel", "terminate"])
def test_errors_are_onnxruntimes_classes(tmp_path, relu_path, name):
    case = _error_cases(tmp_path, relu_path)[name]
    with pytest.raises(Exception) as real:  # whatever onnxruntime raises
        case(ort)
    with pytest.raises(onnxkiln.SessionError) as ours:
        case(rt)
    ort_name = type(real.value).__name__
    assert isinstance(ours.value, getattr(_errors, ort_name)), (ort_name, type(ours.value))
    assert type(ours.value).__mro__[1].__module__ == "onnxkiln.errors"  # still onnxkiln's


def test_translated_error_keeps_class_message_and_attributes():
    err = onnxkiln.KernelError("boom", node_name="n1", op_type="Add")
    same = _errors.translate(err)
    assert same is err and isinstance(err, onnxkiln.KernelError)
    assert isinstance(err, _errors.Fail) and str(err) == "boom" and err.node_name == "n1"
    assert _errors.translate(ValueError("x")).__class__ is ValueError
    assert type(_errors.translate(InvalidInputError("a"))) is type(
        _errors.translate(InvalidInputError("b")))  # one combined class per pair


def test_exception_class_names_match_onnxruntime():
    names = ["Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError",
             "RuntimeException", "InvalidProtobuf", "ModelLoaded", "NotImplemented",
             "InvalidGraph", "EPFail"]
    from onnxkiln.compat.capi import onnxruntime_pybind11_state as ours
    for name in names:
        assert hasattr(ort_state, name)
        cls = getattr(ours, name)
        assert issubclass(cls, onnxkiln.SessionError) and cls.__name__ == name


# -- module functions and descriptors -------------------------------------------------

def test_version_and_build_info():
    assert Version(rt.__version__) == Version(rt.get_version_string())
    assert Version(rt.__version__) >= Version("1.16")
    assert rt.__version__.count(".") == ort.__version__.count(".") == 2
    assert Version(onnxkiln.__version__) >= Version("0.1")
    assert onnxkiln.__version__ in rt.get_build_info()
    assert rt.get_device() == ort.get_device() == "CPU" or rt.get_device() == "GPU"
    assert set(rt.get_all_providers()) >= {"CPUExecutionProvider", "CUDAExecutionProvider"}


def test_noop_functions_return_none_like_onnxruntime():
    for name in ("enable_telemetry_events", "disable_telemetry_events", "preload_dlls"):
        assert getattr(rt, name)() is None and getattr(ort, name)() is None
    assert rt.set_default_logger_verbosity(1) is None
    with pytest.warns(UserWarning, match="preload_dlls"):
        rt.preload_dlls(directory="/opt/cuda")


@pytest.fixture
def fresh_seed():
    from onnxkiln.ops import random

    yield
    random.set_default_seed(None)


def test_set_seed_makes_unseeded_random_ops_repeat(fresh_seed):
    model = _model([helper.make_node("RandomNormal", [], ["y"], shape=[4])], [],
                   [helper.make_tensor_value_info("y", F32, [4])]).SerializeToString()
    rt.set_seed(7)
    a = rt.InferenceSession(model).run(None, {})[0]
    rt.set_seed(7)
    b = rt.InferenceSession(model).run(None, {})[0]
    rt.set_seed(8)
    c = rt.InferenceSession(model).run(None, {})[0]
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    with pytest.raises(_errors.InvalidArgument, match="set_seed takes an int"):
        rt.set_seed("7")


def test_ort_device_as_onnxruntime():
    for name, dev_id in (("cpu", 0), ("cuda", 1), ("dml", 0), ("npu", 0), ("cann", 0),
                         ("webgpu", 0)):
        ours, theirs = rt.OrtDevice.make(name, dev_id), ort.OrtDevice.make(name, dev_id)
        assert (ours.device_type(), ours.device_id(), ours.device_mem_type(),
                ours.device_vendor_id()) == (theirs.device_type(), theirs.device_id(),
                                             theirs.device_mem_type(), theirs.device_vendor_id())
    assert rt.OrtDevice.make("cuda", 0).device_vendor_id() == rt.OrtDeviceVendorId.NVIDIA == 0x10DE
    C = ort.capi._pybind_state.OrtDevice
    assert (rt.OrtDevice.cpu(), rt.OrtDevice.cuda(), rt.OrtDevice.npu(), rt.OrtDevice.dml(),
            rt.OrtDevice.default_memory()) == (C.cpu(), C.cuda(), C.npu(), C.dml(),
                                               C.default_memory())
    assert rt.OrtDevice(0, 0, 0) == rt.OrtDevice.make("cpu", 0)
    with pytest.raises(_errors.InvalidArgument, match="unknown device type 'tpu'"):
        rt.OrtDevice.make("tpu", 0)


def test_memory_info_and_arena_cfg_as_onnxruntime(relu_path):
    ours = rt.InferenceSession(relu_path)
    theirs = ort.InferenceSession(relu_path)
    for a, b in zip(ours.get_input_memory_infos() + ours.get_output_memory_infos(),
                    theirs.get_input_memory_infos() + theirs.get_output_memory_infos()):
        assert (a.name, int(a.allocator_type), a.device_id, int(a.mem_type),
                a.device_mem_type, a.device_vendor_id) == (
            b.name, int(b.allocator_type), b.device_id, int(b.mem_type),
            int(b.device_mem_type), b.device_vendor_id)
    info = rt.OrtMemoryInfo("Cpu", rt.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                            rt.OrtMemType.DEFAULT)
    assert info == ours.get_input_memory_infos()[0]
    for args in (({"max_mem": 10},), (1, 2, 3, 4)):
        a, b = rt.OrtArenaCfg(*args), ort.OrtArenaCfg(*args)
        assert (a.max_mem, a.arena_extend_strategy, a.initial_chunk_size_bytes,
                a.max_dead_bytes_per_chunk) == (b.max_mem, b.arena_extend_strategy,
                                                b.initial_chunk_size_bytes,
                                                b.max_dead_bytes_per_chunk)
    with pytest.raises(_errors.InvalidArgument, match="unknown key 'bogus'"):
        rt.OrtArenaCfg({"bogus": 1})


# -- session calls --------------------------------------------------------------------

def _async(sess, feed):
    done, got = threading.Event(), {}

    def callback(results, user_data, err):
        got.update(results=results, user_data=user_data, err=err)
        done.set()

    sess.run_async(None, feed, callback, "ud")
    assert done.wait(30)
    return got


def test_run_async_as_onnxruntime(relu_path):
    x = np.array([[-1, 2, -3]], np.float32)
    ours, theirs = rt.InferenceSession(relu_path), ort.InferenceSession(relu_path)
    a, b = _async(ours, {"x": x}), _async(theirs, {"x": x})
    assert a["err"] == b["err"] == "" and a["user_data"] == b["user_data"] == "ud"
    np.testing.assert_array_equal(a["results"][0], b["results"][0])
    bad = {"x": x.astype(np.int64)}
    a, b = _async(ours, bad), _async(theirs, bad)
    assert a["results"] == b["results"] == [] and a["err"] and b["err"]
    with pytest.raises(_errors.InvalidArgument, match="callback must be callable"):
        ours.run_async(None, {"x": x}, None, None)


def test_provider_graph_assignment_info_as_onnxruntime(relu_path):
    with pytest.raises(_errors.Fail, match="record_ep_graph_assignment_info"):
        rt.InferenceSession(relu_path).get_provider_graph_assignment_info()
    so_k, so_o = rt.SessionOptions(), ort.SessionOptions()
    for so in (so_k, so_o):
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    a = rt.InferenceSession(relu_path, so_k).get_provider_graph_assignment_info()
    b = ort.InferenceSession(relu_path, so_o).get_provider_graph_assignment_info()
    assert [(s.ep_name, [(n.name, n.op_type) for n in s.get_nodes()]) for s in a] == [
        (s.ep_name, [(n.name, n.op_type) for n in s.get_nodes()]) for s in b]


def test_add_initializer_as_onnxruntime(tmp_path):
    path = tmp_path / "add.onnx"
    onnx.save(_add_w(), path)
    x = np.zeros((1, 3), np.float32)
    value = np.array([5, 6, 7], np.float32)
    outs = []
    for m in (rt, ort):
        so = m.SessionOptions()
        ov = m.OrtValue.ortvalue_from_numpy(value)
        so.add_initializer("w", ov)
        outs.append(m.InferenceSession(str(path), so).run(None, {"x": x})[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], [[5, 6, 7]])
    so = rt.SessionOptions()
    so.add_initializer("w", value.astype(np.float64))
    with pytest.raises(_errors.InvalidArgument, match="the value is DOUBLE, the model's "
                                                      "initializer FLOAT"):
        rt.InferenceSession(str(path), so)
    so = rt.SessionOptions()
    so.add_initializer("q", value)   # onnxruntime ignores a name the model lacks
    with pytest.warns(UserWarning, match="no initializer named 'q'"):
        y = rt.InferenceSession(str(path), so).run(None, {"x": x})[0]
    np.testing.assert_array_equal(y, [[1, 1, 1]])
    with pytest.raises(_errors.InvalidArgument, match="OrtValue or a numpy array"):
        so.add_initializer("w", [1.0, 2.0, 3.0])


def _external_model(tmp_path):
    model = _add_w(np.arange(300, dtype=np.float32).reshape(100, 3)[:1].reshape(3) + 0)
    w = np.arange(3, dtype=np.float32) + 10
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "w"))
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="ext.bin", size_threshold=0)
    return path, w


def test_add_external_initializers_and_files_in_memory(tmp_path):
    path, w = _external_model(tmp_path)
    x = np.zeros((1, 3), np.float32)
    blob = (tmp_path / "ext.bin").read_bytes()
    (tmp_path / "ext.bin").unlink()  # from now on the weights come only from memory
    for m in (rt, ort):
        so = m.SessionOptions()
        so.add_external_initializers_from_files_in_memory(["ext.bin"], [blob], [len(blob)])
        y = m.InferenceSession(str(path), so).run(None, {"x": x})[0]
        np.testing.assert_array_equal(y, [w])
        so = m.SessionOptions()
        so.add_external_initializers(["w"], [m.OrtValue.ortvalue_from_numpy(w * 2)])
        y = m.InferenceSession(str(path), so).run(None, {"x": x})[0]
        np.testing.assert_array_equal(y, [w * 2])
    so = rt.SessionOptions()
    so.add_external_initializers_from_files_in_memory(["ext.bin"], [blob[:4]], [4])
    with pytest.raises(ModelLoadError, match="outside the 4 bytes"):
        rt.InferenceSession(str(path), so)
    with pytest.raises(_errors.InvalidArgument, match="not within its buffer"):
        so.add_external_initializers_from_files_in_memory(["ext.bin"], [blob], [len(blob) + 1])
    with pytest.raises(InvalidOptionError, match="1 names but 2 values"):
        so.add_external_initializers(["w"], [w, w])


def test_free_dimension_override_by_name_as_onnxruntime(relu_path):
    for m in (rt, ort):
        so = m.SessionOptions()
        so.add_free_dimension_override_by_name("N", 5)
        sess = m.InferenceSession(relu_path, so)
        assert sess.get_inputs()[0].shape == [5, 3]
        assert sess.get_outputs()[0].shape == [5, 3]
        assert sess.run(None, {"x": np.ones((5, 3), np.float32)})[0].shape == (5, 3)
        exc = _errors.InvalidArgument if m is rt else ort_state.InvalidArgument
        with pytest.raises(exc, match="x"):
            sess.run(None, {"x": np.ones((2, 3), np.float32)})
    so = rt.SessionOptions()
    so.add_free_dimension_override_by_name("N", 5)
    assert rt.InferenceSession(relu_path, so).session.inputs()[0].shape == (5, 3)  # planned
    with pytest.raises(_errors.InvalidArgument, match="int >= 0"):
        so.add_free_dimension_override_by_name("N", -1)


def test_free_dimension_override_by_denotation_as_onnxruntime(tmp_path):
    model = _relu("batch")
    model.graph.input[0].type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    path = tmp_path / "den.onnx"
    onnx.save(model, path)
    shapes = []
    for m in (rt, ort):
        so = m.SessionOptions()
        so.add_free_dimension_override_by_denotation("DATA_BATCH", 4)
        sess = m.InferenceSession(str(path), so)
        shapes.append(sess.get_inputs()[0].shape)
        assert sess.run(None, {"x": np.ones((4, 3), np.float32)})[0].shape == (4, 3)
    assert shapes[0] == shapes[1] == [4, 3]


def test_optimized_model_external_initializers_config_keys(tmp_path):
    src = tmp_path / "add.onnx"
    onnx.save(_add_w(np.arange(3000, dtype=np.float32)[:3] * 0 + 2), src)
    big = _model([helper.make_node("Add", ["x", "w"], ["y"])],
                 [helper.make_tensor_value_info("x", F32, ["N", 512])],
                 [helper.make_tensor_value_info("y", F32, ["N", 512])],
                 [numpy_helper.from_array(np.full(512, 2, np.float32), "w")])
    onnx.save(big, src)
    out = tmp_path / "opt.onnx"
    so = rt.SessionOptions()
    so.optimized_model_filepath = str(out)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                "opt.bin")
    so.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "100")
    rt.InferenceSession(str(src), so)
    rt.InferenceSession(str(src), so)  # a second build writes the file again, not after it
    assert (tmp_path / "opt.bin").stat().st_size == 512 * 4
    saved = onnx.load(out, load_external_data=False)
    assert saved.graph.initializer[0].data_location == TensorProto.EXTERNAL
    y = ort.InferenceSession(str(out)).run(None, {"x": np.zeros((1, 512), np.float32)})[0]
    np.testing.assert_array_equal(y, np.full((1, 512), 2, np.float32))
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                "../x.bin")
    with pytest.raises(_errors.InvalidArgument, match="must be a file name"):
        rt.InferenceSession(str(src), so)


def test_load_config_from_model(tmp_path, monkeypatch):
    model = _relu()
    helper.set_model_props(model, {"ort_config": json.dumps(
        {"session_options": {"intra_op_num_threads": 2, "graph_optimization_level": 1}})})
    path = tmp_path / "cfg.onnx"
    onnx.save(model, path)
    assert rt.InferenceSession(str(path)).get_session_options().intra_op_num_threads == 0
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    so = rt.InferenceSession(str(path)).get_session_options()
    assert (so.intra_op_num_threads, so.graph_optimization_level) == (2, 1)
    helper.set_model_props(model, {"ort_config": '{"session_options": {"bogus": 1}}'})
    onnx.save(model, path)
    with pytest.raises(_errors.InvalidArgument, match="unknown session option 'bogus'"):
        rt.InferenceSession(str(path))


def test_custom_ops_library_is_refused_clearly():
    so = rt.SessionOptions()
    with pytest.raises(_errors.NotImplemented,
                       match=r"register_custom_ops_library\('libcustom.so'\)"):
        so.register_custom_ops_library("libcustom.so")


def test_onnxkiln_backend_prepare_path_and_bytes(relu_path):
    from onnxkiln import backend
    from onnxkiln.compat import backend as ort_backend

    x = np.array([[-1, 1, 2]], np.float32)
    import onnxruntime.backend

    want = onnxruntime.backend.prepare(relu_path).run(x)[0]
    for model in (relu_path, Path(relu_path).read_bytes(), onnx.load(relu_path)):
        np.testing.assert_array_equal(backend.prepare(model).run(x)[0], want)
        np.testing.assert_array_equal(ort_backend.prepare(model).run(x)[0], want)
    with pytest.raises(_errors.NoSuchFile):
        ort_backend.prepare(relu_path + ".missing")
    with pytest.raises(ModelLoadError, match="got int"):
        backend.prepare(3)
    assert ort_backend.supports_device("CPU") and ort_backend.is_compatible(relu_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ort_backend.run(relu_path, x)[0].tolist() == [[0, 1, 2]]


@pytest.mark.parametrize("call", [
    lambda: rt.get_ep_devices(),
    lambda: rt.register_execution_provider_library("ep", "libep.so"),
    lambda: rt.copy_tensors([], [], None),
    lambda: rt.SessionOptions().add_provider("X", {}),
    lambda: rt.SessionOptions().set_load_cancellation_flag(True),
])
def test_what_onnxkiln_cannot_honour_is_one_clear_error(call):
    with pytest.raises(_errors.NotImplemented, match="not supported by onnxkiln; "):
        call()


def test_unhonoured_session_method_names_the_call(relu_path):
    sess = rt.InferenceSession(relu_path)
    with pytest.raises(_errors.NotImplemented,
                       match="InferenceSession.run_with_ortvaluevector: .*run_with_ort_values"):
        sess.run_with_ortvaluevector(None, None, None, None)


def test_every_onnxruntime_session_method_exists():
    for theirs, ours in ((ort.InferenceSession, rt.InferenceSession),
                         (ort.SessionOptions, rt.SessionOptions),
                         (ort.RunOptions, rt.RunOptions), (ort.OrtValue, rt.OrtValue),
                         (ort.IOBinding, rt.IOBinding)):
        missing = [n for n in dir(theirs) if not n.startswith("_") and not hasattr(ours, n)]
        assert missing == [], theirs.__name__


def test_tuning_knobs_are_accepted():
    assert rt.set_global_thread_pool_sizes(2, 2) is None
    assert rt.create_and_register_allocator(None, None) is None
    assert rt.has_collective_ops() is False
    so = rt.SessionOptions()
    assert so.has_providers() is ort.SessionOptions().has_providers() is False


def test_cuda_only_provider_options_warn(relu_path):
    with pytest.warns(UserWarning, match=r"\['cudnn_conv_algo_search'\] have no onnxkiln"):
        rt.InferenceSession(relu_path, providers=[
            ("CUDAExecutionProvider", {"cudnn_conv_algo_search": "DEFAULT"}),
            "CPUExecutionProvider"])


def test_distribution_metadata_after_install(tmp_path):
    code = textwrap.dedent('''
        import importlib.metadata as md
        import onnxkiln.compat
        onnxkiln.compat.install()
        print(md.version("onnxruntime"), md.metadata("onnxruntime")["Name"])
    ''')
    out = _run_python(["-c", code], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1.32.0", "onnxruntime"]
