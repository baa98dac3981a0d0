"""The `onnxkiln` command: run, info, bench, profile, demo."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxkiln.cli import main
from onnxkiln.testing import make_model, tensor_info


@pytest.fixture
def model_path(tmp_path):
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
        [tensor_info("x", np.float32, ["batch", 3])], [tensor_info("y", np.float32, ["batch", 2])],
        {"w": np.array([[1, -1], [2, -2], [3, -3]], np.float32)}, name="tiny",
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    return path


def test_run_with_an_input_file_prints_and_saves_outputs(model_path, tmp_path, capsys):
    x = np.array([[1, 0, 1], [0, 1, 0]], np.float32)
    np.save(tmp_path / "x.npy", x)
    code = main(["run", str(model_path), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "3",
                 "--save", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0
    assert "y" in out and "float32" in out and "(2, 2)" in out and "3 runs" in out
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), [[4, 0], [2, 0]])


def test_run_with_random_inputs_binds_symbolic_dims(model_path, tmp_path, capsys):
    code = main(["run", str(model_path), "--input", "x=random", "--dim", "batch=5",
                 "--save", str(tmp_path / "o")])
    assert code == 0
    y = np.load(tmp_path / "o" / "y.npy")
    assert y.shape == (5, 2) and (y >= 0).all()


def test_run_reports_unknown_inputs_and_model_errors(model_path, tmp_path, capsys):
    assert main(["run", str(model_path), "--input", "z=random"]) == 2
    assert "unknown input(s) ['z']" in capsys.readouterr().out
    assert main(["run", str(tmp_path / "missing.onnx")]) == 2
    assert "ModelLoadError" in capsys.readouterr().out


def test_info_lists_io_opsets_histogram_and_size(model_path, capsys):
    assert main(["info", str(model_path)]) == 0
    out = capsys.readouterr().out
    assert "graph 'tiny'" in out and "ai.onnx 21" in out
    assert "ai.onnx::MatMul" in out and "ai.onnx::Relu" in out and "2 nodes" in out
    assert "('batch', 3)" in out and "('batch', 2)" in out
    assert "6 parameters" in out


def test_demo_runs_and_compares_with_onnxruntime():
    pytest.importorskip("onnxruntime")
    proc = subprocess.run([sys.executable, "-m", "onnxkiln.cli", "demo", "--repeat", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "onnxkiln: 2 runs" in proc.stdout and "onnxruntime: 2 runs" in proc.stdout
    diff = float(proc.stdout.split("max |onnxkiln - onnxruntime| = ")[1].split(";")[0])
    assert diff < 1e-3


def test_profile_prints_op_and_node_tables_and_writes_a_chrome_trace(model_path, tmp_path,
                                                                     capsys):
    trace = tmp_path / "profile.json"
    code = main(["profile", str(model_path), "--runs", "3", "--dim", "batch=4", "--top", "1",
                 "--trace", str(trace)])
    out = capsys.readouterr().out
    assert code == 0
    assert "tiny.onnx: 3 traced runs" in out and "time per op type" in out
    assert "top 1 nodes" in out and f"Chrome trace: {trace} (9 events)" in out
    for header in ("count", "total ms", "% of run", "mean µs"):
        assert header in out
    assert "MatMul" in out and "Relu" in out
    events = json.loads(trace.read_text())
    assert [e["name"] for e in events].count("model_run") == 3
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == 6 and all(e["name"].endswith("_kernel_time") for e in nodes)
    assert nodes[0]["args"]["input_type_shape"][0] == {"float": [4, 3]}


def test_profile_default_trace_path_is_beside_the_working_folder(model_path, tmp_path,
                                                                  monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["profile", str(model_path), "--runs", "1"]) == 0
    assert (tmp_path / "tiny_profile.json").exists()


def test_bench_prints_percentiles_throughput_and_the_onnxruntime_ratio(model_path, capsys):
    pytest.importorskip("onnxruntime")
    assert main(["bench", str(model_path), "--runs", "5", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    for text in ("p50 ms", "p90 ms", "p99 ms", "runs/s", "onnxkiln", "onnxruntime",
                 "onnxkiln / onnxruntime: p50 "):
        assert text in out


def test_bench_without_onnxruntime(model_path, capsys):
    assert main(["bench", str(model_path), "--runs", "3", "--no-ort", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "onnxkiln" in out and "onnxruntime" not in out


def test_bad_command_line_values_exit_with_code_2(model_path, capsys):
    assert main(["bench", str(model_path), "--dim", "batch"]) == 2
    assert "error: --dim takes NAME=VALUE, got 'batch'" in capsys.readouterr().out
    assert main(["profile", str(model_path), "--runs", "0"]) == 2
    assert "error: --runs must be >= 1" in capsys.readouterr().out


def test_check_reports_opsets_and_placement(model_path, capsys):
    assert main(["check", str(model_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "opsets ai.onnx" in out and "nodes per provider: cpu" in out
    assert "ok: every node has a kernel" in out


def test_check_lists_every_unsupported_op_and_exits_1(tmp_path, capsys):
    nodes = [helper.make_node("NoSuchOp", ["x"], ["y"], domain="example.ops", name="a"),
             helper.make_node("AlsoMissing", ["y"], ["z"], domain="example.ops", name="b")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2])],
                              [helper.make_tensor_value_info("z", 1, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("example.ops", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(model, path)
    assert main(["check", str(path), "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "NoSuchOp" in out and "AlsoMissing" in out and "2 node(s)" in out
