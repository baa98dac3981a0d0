"""Smoke tests of the benchmark suite (bench/): structure and sanity of its results on the
small configs, the memory probe, `onnxkiln bench --suite`, and the OpenBLAS re-exec."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the suite compares against onnxruntime")
pytest.importorskip("threadpoolctl", reason="the suite reports the BLAS kernel")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import suite  # noqa: E402


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "results.json"
    args = suite.parser().parse_args(
        ["--quick", "--models", "mlp,lstm", "--repeat", "3", "--threads", "1", "--no-memory",
         "--no-creation", "--keep-env", "--gap-ms", "2", "--json", str(path)])
    lines: list[str] = []
    results = suite.run(args, out=lines.append, argv=["--quick"])
    return results, "\n".join(lines), json.loads(path.read_text())


def test_one_row_per_requested_model_with_sane_numbers(quick):
    results, _, _ = quick
    assert [r["model"] for r in results["models"]] == ["mlp", "lstm"]
    assert results["ok"] and results["threads"] == 1 and results["quick"]
    for row in results["models"]:
        assert row["ok"], row["errors"]
        assert set(row["ms"]) == {"onnxkiln", "onnxruntime", "reference"}
        assert all(ms > 0 for ms in row["ms"].values())
        assert row["samples"]["onnxkiln"] == row["samples"]["onnxruntime"] == 3
        assert 1 <= row["samples"]["reference"] <= 3
        assert row["kiln_vs_ort"] == pytest.approx(row["ms"]["onnxkiln"]
                                                  / row["ms"]["onnxruntime"])
        assert row["ref_vs_kiln"] > 0 and not row["ref_cut_off"]
        assert row["kiln_vs_ort_paired"] > 0 and "during" in row["other_load_cores"]
        assert row["min_ms"]["onnxkiln"] <= row["ms"]["onnxkiln"]
        assert 0 <= row["max_abs_diff"] < 1e-4 and row["ref_max_abs_diff"] < 1e-4
        assert row["nodes"] > 0 and 0 < row["kiln_nodes"] <= row["nodes"]
    g = results["geomean"]
    ratios = [r["kiln_vs_ort"] for r in results["models"]]
    assert g["kiln_vs_ort"] == pytest.approx(math.sqrt(ratios[0] * ratios[1]))
    assert g["worst_kiln_vs_ort"] == max(ratios)


def test_overhead_microbenchmark_reports_us_per_op(quick):
    o = quick[0]["overhead"]
    assert o["nodes"] == 1000
    assert all(o["value_ok"].values())
    assert set(o["us_per_op"]) == {"onnxkiln", "onnxruntime", "reference"}
    assert all(0 < us < 1000 for us in o["us_per_op"].values())


def test_output_tables_and_json_agree(quick):
    results, text, saved = quick
    assert "geometric mean" in text and "dispatch overhead" in text
    assert "mlp" in text and "lstm" in text
    assert saved["models"][0]["ms"] == pytest.approx(results["models"][0]["ms"])
    assert saved["command"] == "python -m bench --quick"
    blas = saved["machine"]["blas"]
    assert saved["machine"]["numpy"] == np.__version__
    assert all("architecture" in b for b in blas)
    markdown = suite.format_models(results, markdown=True)
    assert markdown.count("\n") == 3 + len(results["models"]) + 1
    assert markdown.splitlines()[3].startswith("|---|")


def test_interleave_shuffles_rounds_and_limits_samples():
    import random

    order: list[str] = []
    calls = {k: (lambda k=k: order.append(k)) for k in "abc"}
    times = suite.interleave(calls, 4, {"c": 2}, random.Random(0))
    assert [len(times[k]) for k in "abc"] == [4, 4, 2]
    rounds = [order[0:3], order[3:6]]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert sorted(order[6:]) == ["a", "a", "b", "b"]


def test_memory_probe_reports_growth_over_its_baseline(tmp_path, capsys):
    from bench import memprobe

    from onnxkiln import zoo

    model = zoo.mlp()
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    np.savez(tmp_path / "f.npz", **zoo.random_inputs(model))
    # the suite runs it in a fresh process per engine; in-process here, for speed
    assert memprobe.main(["onnxkiln", str(tmp_path / "m.onnx"), str(tmp_path / "f.npz"),
                          "--threads", "1", "--runs", "2"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["engine"] == "onnxkiln" and not result["timed_out"]
    assert result["baseline"] > 10 * 2**20  # python + numpy + onnx + onnxruntime resident
    assert 0 <= result["run_growth"] <= result["peak"] + 2**20 < 100 * 2**20
    assert result["load_s"] > 0


def test_cli_bench_suite_runs_the_harness(capsys):
    from onnxkiln.cli import main

    code = main(["bench", "--threads", "1", "--suite", "--quick", "--models", "mlp",
                 "--repeat", "2", "--no-memory", "--no-overhead", "--no-creation",
                 "--no-reference", "--keep-env"])
    out = capsys.readouterr().out
    assert code == 0
    assert "threads 1" in out and "geometric mean" in out
    row = next(line for line in out.splitlines() if line.startswith("mlp "))
    assert row.split()[1:4] == ["7", "->", row.split()[3]] and "x" in row


def test_cli_bench_needs_a_model_or_suite(capsys):
    from onnxkiln.cli import main

    assert main(["bench"]) == 2
    assert "--suite" in capsys.readouterr().err


def test_openblas_pins_are_dropped_for_the_suite_only():
    env = {**os.environ, "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "Haswell")}
    proc = subprocess.run([sys.executable, "-m", "bench", "--machine"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120, check=True)
    machine = json.loads(proc.stdout)
    assert machine["openblas_pins_removed"]["OPENBLAS_CORETYPE"] == env["OPENBLAS_CORETYPE"]
    assert machine["openblas_pins_present"] == {}
    assert machine["blas"], "threadpoolctl should see numpy's BLAS"


@pytest.mark.parametrize("shape", ["chain", "fanin"])
@pytest.mark.parametrize("engine", ["onnxkiln", "onnxruntime"])
def test_creation_scale_builds_and_checks_both_shapes(shape, engine):
    from bench import creation_scale

    seconds = creation_scale.measure(engine, shape, 50, timeout=60)
    assert seconds is not None and 0 < seconds < 60


def test_quantized_report_on_a_float16_mlp(tmp_path, capsys):
    pytest.importorskip("onnxconverter_common",
                        reason="bench/quantized.py makes float16 models with onnxconverter-common")
    from bench import quantized

    out = tmp_path / "quantized.json"
    assert quantized.main(["--models", "zoo:mlp", "--variants", "fp32,fp16",
                           "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["failed"] == [] and [r["variant"] for r in report["rows"]] == ["fp32", "fp16"]
    fp16 = report["rows"][1]
    for key in ("kiln_vs_ort", "kiln_vs_fp32", "ort_vs_fp32"):
        assert all(math.isfinite(v) for v in fp16[key].values())
    assert 0 < fp16["ort_vs_fp32"]["rel"] < 1e-2 and math.isfinite(fp16["fp32_ratio"])
    assert "zoo:mlp" in capsys.readouterr().out


def test_quantized_float16_repair_makes_bert_loadable():
    pytest.importorskip("onnxconverter_common",
                        reason="bench/quantized.py makes float16 models with onnxconverter-common")
    from bench import quantized

    # the converter's BERT reads a widened graph output and casts a mask to float32
    (row,) = quantized.run(["zoo:bert"], ("fp16",))["rows"]
    assert "failed" not in row and row["kiln_vs_fp32"]["rel"] < 1e-2
