"""The exported-model harness (bench/exported/) on a tiny cache made here: a real skl2onnx
pipeline (ZipMap output) exported by the suite's own builder, and an onnxkiln.zoo model.
No export venv needed; timings are only checked for sanity."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the harness compares against onnxruntime")
pytest.importorskip("threadpoolctl", reason="the harness records the BLAS kernel")
pytest.importorskip("skl2onnx", reason="the tiny cache holds a skl2onnx pipeline")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import report as bench_report  # noqa: E402
from bench.__main__ import split_suite  # noqa: E402
from bench.exported import (  # noqa: E402
    build,
    catalog,
    cli,
    contention,
    creation,
    harness,
    manifest,
    report,
)


def _zoo_entry(cache: Path) -> dict:
    """A small zoo BERT as a cache entry: token ids in [0, vocab), a mask of ones."""
    from onnxkiln import zoo

    config = zoo.BertConfig()
    model = zoo.bert_encoder(config)
    (cache / "zoo-bert.onnx").write_bytes(model.SerializeToString())
    ranges = {"input_ids": [0, config.vocab], "attention_mask": [1, 2]}
    inputs = [{"name": i.name, "dtype": "int64", "shape": ["batch", "seq"],
               "range": ranges[i.name]} for i in model.graph.input]
    return {"name": "zoo-bert", "family": "zoo", "size": "small", "file": "zoo-bert.onnx",
            "exporter": "zoo", "notes": "", "versions": {}, "config": {}, "inputs": inputs,
            "outputs": [o.name for o in model.graph.output], "nodes": len(model.graph.node),
            "runs": list(catalog.batches((1, 2), seq=8)), "quick": False}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cache")
    spec = next(s for s in catalog.SPECS if s.name == "sk-scaler-logreg")
    data = manifest.empty()
    data["models"] = [build.export_one(spec, folder), _zoo_entry(folder)]
    data["failed"] = [{"name": "ssdlite320-dynamo", "family": "detector", "exporter": "dynamo",
                       "error": "TorchExportError: data-dependent guard"}]
    manifest.save(folder, data)
    return folder


def _args(cache: Path, *extra: str):
    return cli.parser().parse_args(["--cache", str(cache), "--threads", "1", "--repeat", "2",
                                    "--budget", "0.05", "--gap-ms", "1", "--no-creation",
                                    "--keep-env", *extra])


@pytest.fixture(scope="module")
def results(cache, tmp_path_factory):
    path = tmp_path_factory.mktemp("out") / "exported.json"
    lines: list[str] = []
    out = cli.run(_args(cache, "--json", str(path)), out=lines.append, argv=["--threads", "1"])
    return out, "\n".join(lines), json.loads(path.read_text())


def test_one_row_per_model_and_batch_with_sane_numbers(results):
    out, _, _ = results
    assert [(r["model"], r["run"]) for r in out["rows"]] == [
        ("sk-scaler-logreg", "b1"), ("sk-scaler-logreg", "b16"), ("zoo-bert", "b1"),
        ("zoo-bert", "b2")]
    for row in out["rows"]:
        assert row["ok"], row["errors"]
        t = row["threads"]["1"]
        assert set(t["ms"]) == set(harness.RUNTIMES) and all(v > 0 for v in t["ms"].values())
        assert t["kiln_vs_ort"] == pytest.approx(t["ms"]["onnxkiln"] / t["ms"]["onnxruntime"])
        assert t["rounds"] == 2 and t["min_ms"]["onnxkiln"] <= t["ms"]["onnxkiln"]
        assert 0 <= row["diff"]["max_abs_diff"] < 1e-4 and row["diff"]["mismatch"] is None
        assert row["kiln_nodes"] > 0 and row["first_run_ms"]["1"]["onnxruntime"] > 0
    ratios = [r["threads"]["1"]["kiln_vs_ort"] for r in out["rows"]]
    s = out["summary"]["1"]
    assert s["geomean"] == pytest.approx(math.exp(np.mean(np.log(ratios))))
    assert s["worst"] == max(ratios) and s["rows"] == 4


def test_zipmap_probabilities_are_compared_as_rows(cache):
    entry = manifest.load(cache)["models"][0]
    assert entry["name"] == "sk-scaler-logreg" and entry["nodes"] > 0
    assert entry["outputs"] == ["output_label", "output_probability"]
    feeds = manifest.make_feeds(entry, {"batch": 3})
    errors: dict[str, str] = {}
    runners = harness.open_runners(manifest.model_path(cache, entry), 1, errors)
    outputs, _ = harness.first_outputs(runners, feeds, errors)
    assert not errors
    probs = outputs["onnxruntime"][1]
    assert isinstance(probs, list) and isinstance(probs[0], dict)  # ZipMap: maps per row
    assert harness.plain(probs).shape == (3, 3)
    assert harness.compare(outputs["onnxkiln"], outputs["onnxruntime"])["ok"]


def test_compare_flags_shape_changes_nans_and_large_differences():
    a = np.ones((2, 3), np.float32)
    assert harness.compare([a], [a])["max_abs_diff"] == 0.0
    bad = harness.compare([a[:1]], [a])
    assert math.isinf(bad["max_abs_diff"]) and "shape" in bad["mismatch"] and not bad["ok"]
    nan = a.copy()
    nan[0, 0] = np.nan
    assert harness.compare([nan], [nan])["ok"]
    assert not harness.compare([nan], [a])["ok"]
    assert not harness.compare([a + 0.01], [a])["ok"]
    assert harness.compare([a * 1000 + 0.01], [a * 1000])["ok"]  # relative to the scale
    assert not harness.compare([a], [a, a])["ok"]


def test_rounds_fit_the_budget():
    assert harness.rounds_for(0.01, 10, 4.0, 3) == 10  # fast: capped by --repeat
    assert harness.rounds_for(1.0, 10, 4.0, 3) == 4
    assert harness.rounds_for(3.0, 10, 4.0, 3) == 3  # slow: at least 3
    assert harness.rounds_for(9.0, 10, 4.0, 3) == 2  # one round > twice the budget
    assert harness.rounds_for(1.0, 1, 4.0, 3) == 1


def test_feeds_follow_the_manifest(cache):
    entry = manifest.load(cache)["models"][1]
    feeds = manifest.make_feeds(entry, {"batch": 2, "seq": 8}, seed=3)
    ids = feeds["input_ids"]
    assert ids.shape == (2, 8) and ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 100
    assert (feeds["attention_mask"] == 1).all()
    again = manifest.make_feeds(entry, {"batch": 2, "seq": 8}, seed=3)
    assert np.array_equal(again["input_ids"], ids)
    with pytest.raises(ValueError, match="needs dim 'seq'"):
        manifest.make_feeds(entry, {"batch": 2})


def test_json_schema_and_report_rendering(results):
    _, text, saved = results
    assert saved["suite"] == "exported" and saved["threads"] == [1]
    assert saved["command"] == "python -m bench --suite exported --threads 1"
    assert saved["machine"]["numpy"] == np.__version__
    assert saved["failed_exports"][0]["name"] == "ssdlite320-dynamo"
    row = saved["rows"][0]
    assert {"model", "family", "exporter", "run", "dims", "nodes", "kiln_nodes", "diff",
            "threads", "errors", "warnings", "other_load_cores_before"} <= set(row)
    assert {"ms", "min_ms", "rounds", "kiln_vs_ort", "kiln_vs_ort_paired",
            "other_load_cores"} <= set(row["threads"]["1"])
    markdown = bench_report.render(saved)  # python -m bench.report dispatches on "suite"
    table = [x for x in markdown.splitlines() if x.startswith("|")]
    assert len(table) == 2 + 4 + 2  # header, rule, rows, geomean and worst
    assert table[2].startswith("| sk-scaler-logreg | skl2onnx | b1 |")
    assert "did not export: ssdlite320-dynamo" in markdown and "geometric mean" in text


def test_creation_in_a_fresh_process_and_warm(cache):
    entry = manifest.load(cache)["models"][1]
    dims = entry["runs"][0]["dims"]
    feeds = manifest.make_feeds(entry, dims)
    import random

    result = creation.measure(cache, entry, dims, feeds, 1, 2, 0.0, random.Random(0))
    for runtime in harness.RUNTIMES:
        fresh = result["fresh"][runtime]
        assert "error" not in fresh, fresh
        assert min(fresh["import_s"], fresh["create_s"], fresh["first_run_s"]) > 0
        assert fresh["import_create_s"] == pytest.approx(fresh["import_s"] + fresh["create_s"])
        assert fresh["process_s"] > fresh["import_create_s"]
        assert 0 < result["warm"][runtime]["create_s"] < 60
        assert len(result["warm"][runtime]["all_create_s"]) == 2
    text = report.format_creation({"creation": [{"model": "zoo-bert", **result}]}, True)
    assert "| zoo-bert |" in text


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state


def test_busy_processes_are_always_stopped():
    with contention.Busy(2) as busy:
        pids = busy.pids
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    assert not any(_alive(p) for p in pids)
    with pytest.raises(RuntimeError), contention.Busy(1) as busy:
        pids = busy.pids
        raise RuntimeError("a failing measurement")
    assert not any(_alive(p) for p in pids)


def test_busy_processes_end_when_the_harness_is_killed():
    # the child exits without cleaning up, as a SIGKILL would
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import os; from bench.exported "
            "import contention; b = contention.Busy(1).__enter__(); print(b.pids[0], "
            "flush=True); os._exit(0)")
    pid = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, timeout=60).stdout)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_contention_reports_slowdowns_and_leaves_nothing_behind(cache, monkeypatch):
    started: list[int] = []
    real_enter = contention.Busy.__enter__

    def enter(self):
        real_enter(self)
        started.extend(self.pids)
        return self

    monkeypatch.setattr(contention.Busy, "__enter__", enter)
    out = cli.run(_args(cache, "--models", "zoo-bert", "--contention", "1"), out=lambda s: None)
    c = out["contention"][0]
    assert len(started) == 1 and not _alive(started[0])
    assert c["model"] == "zoo-bert" and c["run"] == "b1" and c["busy_processes"] == 1
    keys = {f"{r}@{t}" for r in harness.RUNTIMES for t in ("default", "1")}
    assert set(c["slowdown"]) == keys
    for key in keys:
        assert c["slowdown"][key] == pytest.approx(c["busy"]["ms"][key] / c["quiet"]["ms"][key])
    assert c["kiln_vs_ort_slowdown@1"] == pytest.approx(
        c["slowdown"]["onnxkiln@1"] / c["slowdown"]["onnxruntime@1"])
    assert set(c["default_slower_than_1"]) == set(harness.RUNTIMES)
    assert "under contention: 1 busy" in report.render(out)


def test_a_missing_cache_says_which_command_builds_it(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match=r"venv-export/bin/python -m bench\.exported\.build "
                       r"--out .*nothing"):
        cli.run(_args(tmp_path / "nothing"), out=lambda s: None)
    monkeypatch.setattr(manifest, "DEFAULT_CACHE", tmp_path / "models")
    with pytest.raises(SystemExit, match="build it with `make bench-models`"):
        manifest.load(tmp_path / "models")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / manifest.MANIFEST).write_text("{")
    with pytest.raises(SystemExit, match="not valid JSON"):
        manifest.load(tmp_path / "models")
    proc = subprocess.run([sys.executable, "-m", "bench", "--suite", "exported", "--cache",
                           str(tmp_path / "nothing"), "--keep-env"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1 and "no exported-model cache" in proc.stderr


def test_export_python_builds_a_missing_cache(tmp_path):
    # this venv has sklearn and skl2onnx, enough to export the sklearn entries
    args = _args(tmp_path / "new", "--models", "sk-pca", "--repeat", "1",
                 "--export-python", sys.executable)
    lines: list[str] = []
    out = cli.run(args, out=lines.append)
    assert lines[0].startswith("building the cache: ") and "--models sk-pca" in lines[0]
    assert [r["model"] for r in out["rows"]] == ["sk-pca", "sk-pca"] and out["ok"]
    assert (tmp_path / "new" / manifest.MANIFEST).is_file()


def test_selection_by_name_family_and_quick(cache):
    data = manifest.load(cache)
    assert [e["name"] for e in manifest.select(data, ["zoo"], False)] == ["zoo-bert"]
    assert [e["name"] for e in manifest.select(data, [], True)] == ["sk-scaler-logreg"]
    with pytest.raises(SystemExit, match="unknown model"):
        manifest.select(data, ["nope"], False)


def test_suite_flag_dispatch():
    assert split_suite(["--suite", "exported", "--quick"]) == ("exported", ["--quick"])
    assert split_suite(["--suite=exported"]) == ("exported", [])
    assert split_suite(["--quick"]) == ("realistic", ["--quick"])


def test_build_exports_once_and_records_failures(tmp_path, monkeypatch):
    logs: list[str] = []
    data = build.build(tmp_path, ["sk-pca"], False, 300, logs.append)
    entry = data["models"][0]
    assert entry["name"] == "sk-pca" and (tmp_path / entry["file"]).is_file()
    assert entry["inputs"][0]["shape"] == ["batch", 50] and entry["opset"] and entry["nodes"]
    assert entry["spec_hash"] == build.spec_hash(next(s for s in catalog.SPECS
                                                       if s.name == "sk-pca"))
    build.build(tmp_path, ["sk-pca"], False, 300, logs.append)
    assert logs[-1] == "  sk-pca: up to date"
    crashed = build._export_in_child(dataclasses.replace(catalog.SPECS[-1], name="gone"),
                                     tmp_path, 60)  # the child cannot find it: exits non-zero
    assert crashed["name"] == "gone" and "StopIteration" in crashed["error"]


def test_an_export_error_becomes_the_models_failure_record(tmp_path, monkeypatch):
    from bench.exported import sk_models

    def broken(config):
        raise ValueError("the converter\x1b[96m refused\x1b[0m")

    monkeypatch.setattr(sk_models, "pca", broken)
    result = tmp_path / "r.json"
    assert build.main(["--out", str(tmp_path), "--one", "sk-pca", "--result", str(result)]) == 0
    assert json.loads(result.read_text()) == {"error": "ValueError: the converter refused"}


def test_catalog_is_consistent():
    names = [s.name for s in catalog.SPECS]
    assert len(names) == len(set(names))
    for spec in catalog.SPECS:
        assert spec.exporter in build.PACKAGES and spec.runs
        assert all({"label", "dims"} <= set(run) for run in spec.runs)
    assert os.path.basename(manifest.DEFAULT_CACHE) == "models"
