"""The `onnxkiln` command: what each command prints on stdout and stderr, and its exit
code (0 ok, 1 the model or run failed, 2 usage). Most tests call main(argv); a few run the
command in a subprocess (the entry points, the lazy --help, a crash-free failure)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxkiln
from onnxkiln.cli import _commands, _output, main
from onnxkiln.testing import make_model, tensor_info


def _save(tmp_path, model, name="m.onnx"):
    path = tmp_path / name
    onnx.save(model, path)
    return path


@pytest.fixture(autouse=True)
def _no_progress_lines(monkeypatch):
    """Slow steps print progress on stderr; a busy machine must not change what tests see."""
    monkeypatch.setattr(_output, "SHOW_AFTER_S", 1e9)


@pytest.fixture
def model_path(tmp_path):
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
        [tensor_info("x", np.float32, ["batch", 3])], [tensor_info("y", np.float32, ["batch", 2])],
        {"w": np.array([[1, -1], [2, -2], [3, -3]], np.float32)}, name="tiny",
    )
    return _save(tmp_path, model, "tiny.onnx")


@pytest.fixture
def fused_path(tmp_path):
    """MatMul, Add, Relu: the optimizer fuses them into one FusedGemm."""
    long_name = "encoder/layer_0/attention/output/dense/MatMul_with_a_rather_long_name_0"
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["t"], name=long_name),
         helper.make_node("Add", ["t", "b"], ["u"], name="add_1"),
         helper.make_node("Relu", ["u"], ["y"], name="relu_2")],
        [tensor_info("x", np.float32, ["batch", 3])], [tensor_info("y", np.float32, ["batch", 2])],
        {"w": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)}, name="fused")
    return _save(tmp_path, model, "fused.onnx")


def _run(argv, capsys):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# run ------------------------------------------------------------------------------------
def test_run_with_an_input_file_prints_and_saves_outputs(model_path, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.array([[1, 0, 1], [0, 1, 0]], np.float32))
    code, out, err = _run(["run", model_path, "--input", f"x={tmp_path / 'x.npy'}",
                           "--repeat", "3", "--save", tmp_path / "out"], capsys)
    assert code == 0 and err == ""
    assert "y" in out and "float32" in out and "(2, 2)" in out
    assert "first run" in out and "steady: 3 runs after 1 warm-up run, median" in out
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), [[4, 0], [2, 0]])


def test_run_reports_the_first_run_apart_from_the_steady_runs(model_path, capsys):
    code, out, _ = _run(["run", model_path, "--repeat", "0"], capsys)
    assert code == 0 and "first run" in out and "steady" not in out
    code, out, _ = _run(["run", model_path, "--json", "--repeat", "2", "--warmup", "0",
                         "--device", "cpu", "--threads", "1"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["first_run_ms"] > 0 and doc["load_s"] > 0
    assert doc["steady"]["runs"] == 2 and doc["steady"]["warmup"] == 0
    assert doc["steady"]["min_ms"] <= doc["steady"]["median_ms"]
    assert doc["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 3], "from": "random"}]
    (y,) = doc["outputs"]
    assert y["name"] == "y" and y["kind"] == "tensor" and y["shape"] == [1, 2]
    assert len(y["values"][0]) == 2


def test_random_inputs_bind_named_dims_and_follow_the_given_inputs(tmp_path, capsys):
    model = make_model([helper.make_node("Add", ["a", "b"], ["y"])],
                       [tensor_info("a", np.float32, ["batch", "n"]),
                        tensor_info("b", np.float32, ["batch", "n"])],
                       [tensor_info("y", np.float32, ["batch", "n"])])
    path = _save(tmp_path, model)
    np.save(tmp_path / "a.npy", np.zeros((4, 5), np.float32))
    code, out, _ = _run(["run", path, "-i", f"a={tmp_path / 'a.npy'}", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["dims"] == {"batch": 4, "n": 5}
    assert [i["shape"] for i in doc["inputs"]] == [[4, 5], [4, 5]]
    code, out, _ = _run(["run", path, "--dim", "batch=2", "--dim", "n=3", "--json"], capsys)
    assert json.loads(out)["outputs"][0]["shape"] == [2, 3]
    code, out, err = _run(["run", path, "-i", f"a={tmp_path / 'a.npy'}", "--dim", "n=6"],
                          capsys)
    assert code == 2 and out == ""
    assert err == "error: --dim n=6 disagrees with the given inputs, where n is 5\n"


def test_random_integers_are_token_like_and_ranges_can_be_asked(tmp_path, capsys):
    """ids index an embedding table; masks are all 1; ints:LOW:HIGH picks the range."""
    model = make_model(
        [helper.make_node("Gather", ["table", "input_ids"], ["rows"]),
         helper.make_node("Cast", ["attention_mask"], ["mask"], to=onnx.TensorProto.FLOAT)],
        [tensor_info("input_ids", np.int64, ["batch", "seq"]),
         tensor_info("attention_mask", np.int64, ["batch", "seq"])],
        [tensor_info("rows", np.float32, ["batch", "seq"]),
         tensor_info("mask", np.float32, ["batch", "seq"])],
        {"table": np.arange(8, dtype=np.float32)})
    path = _save(tmp_path, model)
    code, _, _ = _run(["run", path, "--dim", "seq=64", "--save", tmp_path / "a"], capsys)
    assert code == 0
    assert set(np.unique(np.load(tmp_path / "a" / "rows.npy"))) == {0.0, 1.0}
    assert (np.load(tmp_path / "a" / "mask.npy") == 1).all()
    code, _, _ = _run(["run", path, "--dim", "seq=64", "-i", "input_ids=ints:5:8",
                       "--save", tmp_path / "b"], capsys)
    assert code == 0 and set(np.unique(np.load(tmp_path / "b" / "rows.npy"))) == {5, 6, 7}
    code, _, err = _run(["run", path, "-i", "attention_mask=ints:0:1000000000000000000000"],
                        capsys)
    assert code == 2 and "the input is int64, which holds" in err


def test_sequence_and_map_outputs_print_and_save(tmp_path, capsys):
    """A classifier's ZipMap output (a sequence of maps) is shown, not refused."""
    maps = helper.make_sequence_type_proto(helper.make_map_type_proto(
        onnx.TensorProto.INT64, helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)))
    model = make_model(
        [helper.make_node("ZipMap", ["p"], ["probs"], domain="ai.onnx.ml",
                          classlabels_int64s=[0, 1])],
        [tensor_info("p", np.float32, [1, 2])], [helper.make_value_info("probs", maps)],
        extra_opsets={"ai.onnx.ml": 1})
    path = _save(tmp_path, model)
    np.save(tmp_path / "p.npy", np.array([[0.25, 0.75]], np.float32))
    code, out, _ = _run(["run", path, "-i", f"p={tmp_path / 'p.npy'}", "--save", tmp_path / "o"],
                        capsys)
    assert code == 0 and "sequence[map]" in out and '"1": 0.75' in out
    assert json.loads((tmp_path / "o" / "probs.json").read_text()) == [{"0": 0.25, "1": 0.75}]


def test_a_failed_run_on_random_inputs_names_their_dims(tmp_path, capsys):
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       [tensor_info("x", np.float32, ["batch", "k"])],
                       [tensor_info("y", np.float32, ["batch", 2])],
                       {"w": np.ones((3, 2), np.float32)})
    code, out, err = _run(["run", _save(tmp_path, model)], capsys)
    assert code == 1 and out == ""
    note, error = err.splitlines()
    assert note.startswith("note: the random inputs had batch=1, k=1; give sizes that fit "
                           "with --dim NAME=SIZE")
    assert error.startswith("error: ") and "MatMul" in error
    assert main(["run", str(_save(tmp_path, model)), "--dim", "k=3"]) == 0


# usage errors and failures: one line on stderr, the exit code --------------------------
@pytest.mark.parametrize(("make", "message"), [
    (lambda d: d / "none.npy", "no such file"),
    (lambda d: np.save(d / "obj.npy", np.array([{}], object), allow_pickle=True)
     or d / "obj.npy", "the array holds Python objects (pickled)"),
    (lambda d: np.savez(d / "two.npz", a=np.ones(3), b=np.ones(2)) or d / "two.npz",
     "an .npz archive (arrays a, b); an input takes one .npy array"),
    (lambda d: (d / "text.npy").write_text("1 2 3") and d / "text.npy", "not a .npy file"),
])
def test_input_files_that_cannot_be_read_are_usage_errors(model_path, tmp_path, capsys,
                                                          make, message):
    path = make(tmp_path)
    code, out, err = _run(["run", model_path, "-i", f"x={path}"], capsys)
    assert code == 2 and out == ""
    assert err == f"error: --input x={path}: {message}" + err.split(message, 1)[1]
    assert err.count("\n") == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--dim", "seq=4"], "unknown --dim name(s) ['seq']; the model's named dims are ['batch']"),
    (["--dim", "batch"], "--dim takes NAME=VALUE, got 'batch'"),
    (["--dim", "batch=-2"], "--dim batch takes a size >= 0, got '-2'"),
    (["-i", "z=random"], "unknown input(s) ['z']; the model's inputs are ['x']"),
    (["-i", "x=ints:3:1"], "--input x=ints:LOW:HIGH takes integers with LOW < HIGH, got "
                           "'ints:3:1'"),
])
def test_bad_feed_values_are_one_line_usage_errors(model_path, capsys, argv, message):
    code, out, err = _run(["run", model_path, *argv], capsys)
    assert (code, out, err) == (2, "", f"error: {message}\n")


def test_argument_errors_exit_2_and_a_failing_model_exits_1(model_path, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["profile", str(model_path), "--runs", "0"])
    assert exit_.value.code == 2 and "argument --runs: must be >= 1, got 0" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(model_path), "--threads", "many"])
    assert exit_.value.code == 2 and "expected an integer, got 'many'" in capsys.readouterr().err
    assert _run(["run", model_path, "--device", "tpu"], capsys) == (
        2, "", "error: device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'\n")
    (tmp_path / "file").write_text("")
    assert _run(["run", model_path, "--save", tmp_path / "file" / "out"], capsys)[0::2] == (
        2, f"error: --save {tmp_path / 'file' / 'out'}: cannot make the folder (Not a "
           "directory)\n")
    assert _run(["profile", model_path, "--trace", tmp_path / "file" / "t.json"], capsys)[0] == 2
    code, out, err = _run(["run", tmp_path / "missing.onnx"], capsys)
    assert code == 1 and out == "" and err.startswith("error: ModelLoadError: ")
    assert "does not exist" in err and err.count("\n") == 1


def test_model_text_prints_as_it_is_not_as_markup(tmp_path, capsys):
    """Brackets in names are not rich markup: `ids[batch, sequence]` keeps its brackets."""
    model = make_model([helper.make_node("Identity", ["ids[batch, sequence]"], ["[bold]y"])],
                       [tensor_info("ids[batch, sequence]", np.int64, ["batch", "sequence"])],
                       [tensor_info("[bold]y", np.int64, ["batch", "sequence"])])
    path = _save(tmp_path, model)
    code, out, _ = _run(["info", path], capsys)
    assert code == 0 and "ids[batch, sequence]" in out and "[bold]y" in out
    assert "[batch, sequence]" in out
    code, _, err = _run(["run", path, "-i", "[red]z=random"], capsys)
    assert code == 2 and "['[red]z']" in err and "['ids[batch, sequence]']" in err


# info, check, bench, profile ----------------------------------------------------------
def test_info_lists_io_opsets_histogram_and_size(model_path, capsys):
    code, out, _ = _run(["info", model_path], capsys)
    assert code == 0
    assert "graph 'tiny'" in out and "ai.onnx 21" in out
    assert "ai.onnx::MatMul" in out and "ai.onnx::Relu" in out and "2 nodes" in out
    assert "[batch, 3]" in out and "[batch, 2]" in out and "6 parameters" in out
    code, out, _ = _run(["info", model_path, "--json"], capsys)
    doc = json.loads(out)
    assert doc["graph"] == "tiny" and doc["opsets"] == {"ai.onnx": 21}
    assert doc["io"] == [{"kind": "input", "name": "x", "dtype": "float32", "shape": ["batch", 3]},
                         {"kind": "output", "name": "y", "dtype": "float32",
                          "shape": ["batch", 2]}]
    assert doc["ops"] == {"ai.onnx::MatMul": 1, "ai.onnx::Relu": 1} and doc["parameters"] == 6
    assert doc["weight_bytes"] == 24 and doc["file_bytes"] == model_path.stat().st_size


def test_check_reports_opsets_and_placement(model_path, capsys):
    code, out, _ = _run(["check", model_path, "--device", "cpu"], capsys)
    assert code == 0 and "opsets ai.onnx" in out and "nodes per provider: cpu" in out
    assert "ok: every node has a kernel" in out
    code, out, _ = _run(["check", model_path, "--device", "cpu", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["ok"] is True and doc["device"] == "cpu"
    assert doc["nodes_per_provider"] == {"cpu": doc["nodes"]} and doc["fallback"] == []


def test_info_and_check_show_the_files_opsets_not_the_fused_graphs(fused_path, capsys):
    """The optimizer's fused op imports a domain the file does not: neither command shows it."""
    declared = {i.domain or "ai.onnx": i.version for i in onnx.load(fused_path).opset_import}
    session = onnxkiln.InferenceSession(fused_path)
    assert [n.op_type for n in session.graph()] == ["FusedGemm"]
    assert session.model_metadata().opset_imports == {"": 21}
    for argv in (["info", fused_path, "--json"], ["check", fused_path, "--device", "cpu",
                                                  "--json"]):
        code, out, _ = _run(argv, capsys)
        assert code == 0 and json.loads(out)["opsets"] == declared == {"ai.onnx": 21}
    code, out, _ = _run(["check", fused_path, "--device", "cpu"], capsys)
    assert "opsets ai.onnx 21;" in out


def test_check_lists_every_unsupported_op_and_exits_1(tmp_path, capsys):
    nodes = [helper.make_node("NoSuchOp", ["x"], ["y"], domain="example.ops", name="a"),
             helper.make_node("AlsoMissing", ["y"], ["z"], domain="example.ops", name="b")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2])],
                              [helper.make_tensor_value_info("z", 1, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("example.ops", 1)])
    code, out, _ = _run(["check", _save(tmp_path, model), "--device", "cpu"], capsys)
    assert code == 1
    assert "NoSuchOp" in out and "AlsoMissing" in out and "2 node(s)" in out


def test_check_reports_a_model_that_does_not_load(tmp_path, capsys):
    (tmp_path / "broken.onnx").write_bytes(b"\x08\x07 this is not a model")
    code, out, err = _run(["check", tmp_path / "broken.onnx"], capsys)
    assert code == 1 and err == "" and out.startswith("cannot load: ModelLoadError: ")
    code, out, _ = _run(["check", tmp_path / "broken.onnx", "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["error"]["kind"] == "ModelLoadError"


def test_bench_prints_percentiles_throughput_and_the_onnxruntime_ratio(model_path, capsys):
    pytest.importorskip("onnxruntime")
    code, out, _ = _run(["bench", model_path, "--runs", "5", "--warmup", "1"], capsys)
    assert code == 0
    for text in ("p50 ms", "p90 ms", "p99 ms", "runs/s", "onnxkiln", "onnxruntime",
                 "onnxkiln / onnxruntime: p50 ", "first run"):
        assert text in out


def test_bench_json_without_onnxruntime(model_path, capsys):
    code, out, err = _run(["bench", model_path, "--runs", "3", "--no-ort", "--threads", "1",
                           "--device", "cpu", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and "onnxruntime" not in err
    assert list(doc["latency"]) == ["onnxkiln"] and doc["onnxkiln_over_onnxruntime"] is None
    st = doc["latency"]["onnxkiln"]
    assert 0 < st["p50_ms"] <= st["p99_ms"] and st["runs_per_s"] > 0 and doc["runs"] == 3


def test_bench_needs_a_model_or_the_suite(capsys):
    assert _run(["bench"], capsys)[::2] == (
        2, "error: bench needs a MODEL file (or --suite for the benchmark suite)\n")


def test_profile_prints_op_and_node_tables_and_writes_a_chrome_trace(model_path, tmp_path,
                                                                     capsys):
    trace = tmp_path / "profile.json"
    code, out, _ = _run(["profile", model_path, "--runs", "3", "--dim", "batch=4", "--top", "1",
                         "--trace", trace, "--threads", "1"], capsys)
    assert code == 0
    assert "tiny.onnx: 3 traced runs" in out and "time per op type" in out
    assert "top 1 nodes" in out and f"Chrome trace: {trace} (9 events)" in out
    for header in ("count", "total ms", "% of run", "mean µs"):
        assert header in out
    events = json.loads(trace.read_text())
    assert [e["name"] for e in events].count("model_run") == 3
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == 6 and all(e["name"].endswith("_kernel_time") for e in nodes)
    assert nodes[0]["args"]["input_type_shape"][0] == {"float": [4, 3]}


def test_profile_maps_a_fused_node_to_the_model_nodes_on_one_line(fused_path, tmp_path, capsys):
    trace = tmp_path / "t.json"
    code, out, _ = _run(["profile", fused_path, "--runs", "2", "--trace", trace], capsys)
    long_name = "encoder/layer_0/attention/output/dense/MatMul_with_a_rather_long_name_0"
    assert code == 0
    assert "replaces (the model's nodes)" in out
    (row,) = [line for line in out.splitlines() if "add_1" in line]
    assert row.split("│")[1].strip() == "FusedGemm"
    assert row.split("│")[-2].strip() == f"{long_name}, add_1, relu_2"
    nodes = [e for e in json.loads(trace.read_text()) if e["cat"] == "Node"]
    assert [e["args"]["fused_from"] for e in nodes] == [[long_name, "add_1", "relu_2"]] * 2
    shared = ("/enc/layer.0/dense/MatMul", "/enc/layer.0/dense/Add", "/enc/layer.0/act/Div")
    assert _commands._sources(shared) == "/enc/layer.0/{dense/MatMul, dense/Add, act/Div}"
    assert _commands._sources(tuple("abcdef")) == "a, b, c, d, +2 more"


def test_profile_default_trace_path_is_beside_the_working_folder(model_path, tmp_path,
                                                                  monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["profile", str(model_path), "--runs", "1"]) == 0
    assert (tmp_path / "tiny_profile.json").exists()


# progress, caches, help ---------------------------------------------------------------
def test_slow_steps_say_what_they_do_on_stderr(model_path, monkeypatch, capsys):
    monkeypatch.setattr(_output, "SHOW_AFTER_S", 0.0)
    code, out, err = _run(["run", model_path, "--json"], capsys)
    assert code == 0 and json.loads(out)["outputs"][0]["name"] == "y"
    lines = err.splitlines()
    assert f"loading {model_path} (reading, optimizing, planning)…" in lines
    assert any(line.startswith(f"loading {model_path} (reading, optimizing, planning): ")
               and line.endswith(" s") for line in lines)
    assert any(line.startswith("first run (kernels compile") for line in lines)


def test_cache_shows_and_clears_the_kernel_caches(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    monkeypatch.setenv("ONNXKILN_FUSE_CACHE", str(tmp_path / "fuse"))
    code, out, _ = _run(["cache", "--json"], capsys)
    numba_cache, fuse_cache = json.loads(out)["caches"]
    assert code == 0 and numba_cache["files"] == 0
    assert numba_cache["folder"].startswith(str(tmp_path / "numba" / "cpu_"))
    assert fuse_cache["folder"] == str(tmp_path / "fuse")
    for folder, names in ((numba_cache["folder"], ["k.nbi", "k.nbc", "keep.txt"]),
                          (fuse_cache["folder"], ["k_ab.py", "__pycache__/k_ab.nbc"])):
        for name in names:
            path = tmp_path / folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"12345")
    code, out, _ = _run(["cache"], capsys)
    assert code == 0 and str(tmp_path / "fuse") in out and "10 B" in out
    assert "onnxkiln cache --clear deletes them" in out
    code, out, _ = _run(["cache", "--clear"], capsys)
    assert code == 0 and "removed 4 file(s)" in out
    assert [p.name for p in (tmp_path / "numba").rglob("*") if p.is_file()] == ["keep.txt"]


def test_help_shows_defaults_exit_codes_and_the_caches(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "timed steady runs after the first run and the warm-up (0: none) (default: 3)" in \
        " ".join(out.split())
    assert "--device DEVICE" in out and "(default: auto)" in out and "--threads" in out
    assert "exit codes: 0 ok, 1 the model or the run failed, 2 a usage error." in out
    assert "onnxkiln cache --clear" in out


def test_entry_points_version_and_a_lazy_help():
    """`python -m onnxkiln --version`; --help imports neither numpy, onnx nor rich."""
    version = subprocess.run([sys.executable, "-m", "onnxkiln", "--version"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert (version.returncode, version.stdout) == (0, f"onnxkiln {onnxkiln.__version__}\n")
    code = ("import sys\nfrom onnxkiln.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "print([m for m in ('numpy', 'onnx', 'rich') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "[]"
    assert "usage: onnxkiln" in proc.stdout


def test_a_failing_command_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "onnxkiln", "run", str(tmp_path / "m.onnx")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: ModelLoadError: ") and "Traceback" not in proc.stderr


def test_demo_runs_and_compares_with_onnxruntime():
    pytest.importorskip("onnxruntime")
    proc = subprocess.run([sys.executable, "-m", "onnxkiln", "demo", "--repeat", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "onnxkiln: 2 runs" in proc.stdout and "onnxruntime: 2 runs" in proc.stdout
    diff = float(proc.stdout.split("max |onnxkiln - onnxruntime| = ")[1].split(";")[0])
    assert diff < 1e-3
