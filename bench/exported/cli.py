"""`python -m bench --suite exported`: onnxkiln vs onnxruntime on real exported models.

    make bench-models                                  # export once (.venv-export)
    python -m bench --suite exported --threads 1,2 --json exported.json
    python -m bench --suite exported --quick --models bert,sklearn
    python -m bench --suite exported --contention 2 --models resnet18-ts
    python -m bench.report exported.json               # Markdown tables from the JSON

Per model and batch: median ms of each runtime over interleaved rounds and their ratio at
each thread count, the largest |difference| of the outputs; per model: session creation in
a fresh process and warm; with --contention K, each runtime's slowdown while K busy
processes run. The cache is only read here; `--export-python PATH` builds it when missing.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import _env
from bench._timing import GAP_S
from bench.exported import contention, creation, harness, manifest, report


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench --suite exported",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=manifest.DEFAULT_CACHE,
                   help="the exported-model folder (manifest.json)")
    p.add_argument("--models", help="comma-separated names or families (default: all)")
    p.add_argument("--quick", action="store_true",
                   help="small variants only and few rounds (a smoke test)")
    p.add_argument("--repeat", type=int, help="most timed rounds per model, batch and thread "
                   "count (default 10; --quick 3)")
    p.add_argument("--budget", type=float, default=4.0, metavar="S",
                   help="seconds of timed rounds to aim for per model, batch and thread "
                   "count; fewer rounds for slow models, at least 3")
    p.add_argument("--threads", default="1,2", help="comma-separated intra-op thread counts")
    p.add_argument("--contention", type=int, default=0, metavar="K",
                   help="also time each model (first batch) while K busy processes run")
    p.add_argument("--json", metavar="PATH", help="write all results as JSON")
    p.add_argument("--no-creation", action="store_true", help="skip session-creation timing")
    p.add_argument("--gap-ms", type=float, default=GAP_S * 1e3, metavar="MS",
                   help="idle pause before each timed call (spinning pool threads settle)")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                   help="before each model, wait up to S seconds for an idle machine")
    p.add_argument("--seed", type=int, default=0, help="inputs and round order")
    p.add_argument("--export-python", metavar="PATH",
                   help="an interpreter with torch/transformers: build a missing cache with it")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--keep-env", action="store_true",
                   help="keep OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE (default: re-run without them)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    _env.unpin(["--suite", "exported", *argv], keep_env=args.keep_env)
    results = run(args, out=lambda line: print(line, flush=True), argv=argv)
    return 0 if results["ok"] else 1


def load_cache(args: argparse.Namespace, out: Callable[[str], Any]) -> dict[str, Any]:
    """The manifest; with --export-python, build the cache first if it is missing."""
    try:
        return manifest.load(args.cache)
    except manifest.CacheMissing:
        if not args.export_python:
            raise
    cmd = [args.export_python, "-m", "bench.exported.build", "--out", str(args.cache)]
    if args.models:
        cmd += ["--models", args.models]
    out(f"building the cache: {shlex.join(cmd)}")
    subprocess.run(cmd, cwd=_env.ROOT, check=True)
    return manifest.load(args.cache)


def _threads(text: str) -> list[int]:
    try:
        threads = [int(t) for t in text.split(",") if t]
    except ValueError:
        raise SystemExit(f"--threads takes comma-separated integers, got {text!r}") from None
    if not threads or min(threads) < 1:
        raise SystemExit(f"--threads needs counts >= 1, got {text!r}")
    return threads


def run(args: argparse.Namespace, out: Callable[[str], Any] = print,
        argv: Sequence[str] = ()) -> dict[str, Any]:
    """Run the exported suite as `args` says; print with `out`; return (and with --json,
    write) the results."""
    threads = _threads(args.threads)
    repeat = args.repeat or (3 if args.quick else 10)
    if repeat < 1 or args.contention < 0:
        raise SystemExit("--repeat must be >= 1 and --contention >= 0")
    cache = load_cache(args, out)
    wanted = [m for m in (args.models or "").split(",") if m]
    entries = manifest.select(cache, wanted, args.quick)
    rng = random.Random(args.seed)
    results: dict[str, Any] = {
        "suite": "exported", "machine": _env.machine(), "threads": threads,
        "quick": args.quick, "repeat": repeat, "budget_s": args.budget, "gap_ms": args.gap_ms,
        "contention_k": args.contention, "cache": str(args.cache),
        "command": shlex.join(["python", "-m", "bench", "--suite", "exported", *argv]),
        "started": _now(), "failed_exports": [e for e in cache["failed"]
                                              if not wanted or e["name"] in wanted
                                              or e["family"] in wanted],
        "rows": [], "creation": [], "contention": [],
    }
    out(report.header(results))
    start = time.perf_counter()
    for entry in entries:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # numpy warnings from kernels: worth seeing
            bench_model(entry, threads, repeat, args, rng, results, out)
        seen = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
        for row in results["rows"]:
            if row["model"] == entry["name"]:
                row["warnings"] = seen[:10]
        gc.collect()
    results["summary"] = report.summarize(results)
    results["finished"], results["seconds"] = _now(), time.perf_counter() - start
    results["loadavg_end"] = _env.loadavg()
    results["ok"] = all(r["ok"] for r in results["rows"])
    out("")
    out(report.render(results, markdown=args.markdown, head=False))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
        out(f"\nresults written to {args.json}")
    return results


def bench_model(entry: dict[str, Any], threads: list[int], repeat: int,
                args: argparse.Namespace, rng: random.Random, results: dict[str, Any],
                out: Callable[[str], Any]) -> None:
    """Everything for one model: its rows, then creation and contention if both load."""
    start = time.perf_counter()
    before = _env.wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else _load_now()
    rows = bench_entry(entry, Path(args.cache), threads, repeat, args, rng)
    for row in rows:
        row["other_load_cores_before"] = before
        out(report.row_line(row))
    results["rows"] += rows
    if not args.no_creation and _loads(rows):
        results["creation"].append(_creation(entry, args, repeat, rng))
        out(report.creation_line(results["creation"][-1]))
    if args.contention and _loads(rows):
        results["contention"].append(_contention(entry, args, repeat, rng))
        out(report.contention_line(results["contention"][-1]))
    results.setdefault("seconds_per_model", {})[entry["name"]] = time.perf_counter() - start


def bench_entry(entry: dict[str, Any], cache: Path, threads: list[int], repeat: int,
                args: argparse.Namespace, rng: random.Random) -> list[dict[str, Any]]:
    """One row per run (batch) of the model, each with its timings per thread count."""
    path = manifest.model_path(cache, entry)
    rows = [{"model": entry["name"], "family": entry["family"], "exporter": entry["exporter"],
             "size": entry["size"], "run": run["label"], "dims": run["dims"],
             "nodes": entry["nodes"], "kiln_nodes": None, "errors": {}, "diff": None,
             "first_run_ms": {}, "create_s": {}, "threads": {}}
            for run in entry["runs"]]
    for n in threads:
        errors: dict[str, str] = {}
        runners = harness.open_runners(path, n, errors)
        for row, run in zip(rows, entry["runs"]):
            row["errors"].update({f"{k}@{n}": v for k, v in errors.items()})
            if "onnxkiln" in runners:
                row["kiln_nodes"] = runners["onnxkiln"].nodes
            row["create_s"][str(n)] = {k: r.create_s for k, r in runners.items()}
            feeds = manifest.make_feeds(entry, run["dims"], args.seed)
            live = dict(runners)
            run_errors: dict[str, str] = {}
            outputs, first = harness.first_outputs(live, feeds, run_errors)
            row["errors"].update({f"{k}@{n}": v for k, v in run_errors.items()})
            row["first_run_ms"][str(n)] = first
            if len(outputs) == 2:
                diff = harness.compare(outputs["onnxkiln"], outputs["onnxruntime"])
                if row["diff"] is None or diff["max_abs_diff"] > row["diff"]["max_abs_diff"]:
                    row["diff"] = diff
            del outputs
            if live:
                row["threads"][str(n)] = harness.time_runners(
                    live, feeds, repeat, args.budget, args.gap_ms / 1e3, rng)
        del runners
        gc.collect()
    for row in rows:
        row["ok"] = not row["errors"] and bool(row["diff"] and row["diff"]["ok"])
    return rows


def _loads(rows: list[dict[str, Any]]) -> bool:
    """Both runtimes loaded and ran the model (creation and contention need both)."""
    return all(r["diff"] is not None for r in rows)


def _creation(entry: dict[str, Any], args: argparse.Namespace, repeat: int,
              rng: random.Random) -> dict[str, Any]:
    run = entry["runs"][0]
    feeds = manifest.make_feeds(entry, run["dims"], args.seed)
    result = creation.measure(Path(args.cache), entry, run["dims"], feeds, 1,
                              2 if args.quick else 3, args.gap_ms / 1e3, rng, 2 * args.budget)
    return {"model": entry["name"], "run": run["label"], **result}


def _contention(entry: dict[str, Any], args: argparse.Namespace, repeat: int,
                rng: random.Random) -> dict[str, Any]:
    run = entry["runs"][0]
    feeds = manifest.make_feeds(entry, run["dims"], args.seed)
    result = contention.measure(manifest.model_path(Path(args.cache), entry), feeds,
                                args.contention, repeat, args.budget, args.gap_ms / 1e3, rng)
    return {"model": entry["name"], "run": run["label"], **result}


def _load_now() -> float | None:
    """Cores other processes keep busy, over a short window (recorded before each model)."""
    load = _env.OtherLoad()
    time.sleep(0.5)
    return load.cores()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
