"""The benchmark suite: onnxkiln, onnxruntime and onnx's ReferenceEvaluator side by side.

    python -m bench                          # realistic sizes, threads = physical cores
    python -m bench --threads 2 --json results.json
    python -m bench --quick --models mlp,lstm --repeat 5     # small configs: a smoke test
    onnxkiln bench --suite [same options]

Per model (built in code by onnxkiln.zoo, identical inputs for every engine): the median
latency of each engine over interleaved rounds (each round runs every engine once, in a
shuffled order), onnxkiln/onnxruntime and ReferenceEvaluator/onnxkiln ratios, the largest
|onnxkiln - onnxruntime| over all outputs, and the peak memory of each engine measured in a
fresh process (bench/memprobe.py documents the method). Then the geometric means, a
dispatch-overhead microbenchmark (1,000 chained one-element Adds) and session creation
time for the BERT model.

Engines: onnxkiln's default session (optimization "all") with intra_op_threads = --threads;
onnxruntime's CPU provider with its default graph optimizations and intra_op_num_threads
= --threads; the ReferenceEvaluator under a BLAS thread limit of --threads, with few
repeats and a time cap per model ("> X s" when a run passes it).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import _env
from bench._timing import GAP_S, Timeout, deadline, interleave, timed

ENGINES = ("onnxkiln", "onnxruntime", "reference")


@dataclass(frozen=True)
class Case:
    zoo_name: str
    dims: dict[str, int]  # symbolic dims of the realistic size
    quick_dims: dict[str, int]
    label: str


SUITE: dict[str, Case] = {
    "mlp": Case("mlp", {"batch": 1}, {"batch": 1}, "MLP 1024-4096-4096-1000, batch 1"),
    "resnet": Case("resnet", {"batch": 1}, {"batch": 1}, "ResNet-50, 224x224, batch 1"),
    "mobilenet": Case("mobilenet", {"batch": 1}, {"batch": 1},
                      "MobileNetV2 1.0, 224x224, batch 1"),
    "bert": Case("bert", {"batch": 1, "seq": 128}, {"batch": 1, "seq": 8},
                 "BERT-base encoder, seq 128, batch 1"),
    "gpt2": Case("gpt2", {"batch": 1, "seq": 1, "past_seq": 128},
                 {"batch": 1, "seq": 1, "past_seq": 4},
                 "GPT-2 small decode step, KV past 128, batch 1"),
    "lstm": Case("lstm", {"batch": 1}, {"batch": 1},
                 "LSTM 2 layers, input 256, hidden 512, seq 128, batch 1"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser, threads_flag: bool = True) -> None:
    """The suite's options (shared with `onnxkiln bench --suite`)."""
    if threads_flag:
        p.add_argument("--threads", type=int, help="intra-op threads for every engine "
                       "(default: physical cores)")
    p.add_argument("--models", default=",".join(SUITE),
                   help=f"comma-separated subset of {','.join(SUITE)}")
    p.add_argument("--repeat", type=int, default=20, help="timed rounds per model")
    p.add_argument("--quick", action="store_true",
                   help="small configs and few repeats (a smoke test, not a benchmark)")
    p.add_argument("--json", metavar="PATH", help="write all results as JSON")
    p.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    p.add_argument("--ref-repeat", type=int, default=3,
                   help="timed ReferenceEvaluator runs per model (it is slow)")
    p.add_argument("--ref-cap", type=float, default=120.0, metavar="S",
                   help="ReferenceEvaluator seconds per model before it is cut off")
    p.add_argument("--no-reference", action="store_true", help="skip the ReferenceEvaluator")
    p.add_argument("--no-memory", action="store_true",
                   help="skip the per-engine memory probes (child processes)")
    p.add_argument("--no-overhead", action="store_true", help="skip the dispatch microbenchmark")
    p.add_argument("--no-creation", action="store_true", help="skip session-creation timing")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                   help="before each model, wait up to S seconds for other processes to "
                   "leave the CPUs idle (shared machines); the load seen is recorded")
    p.add_argument("--gap-ms", type=float, default=GAP_S * 1e3, metavar="MS",
                   help="idle pause before each timed call, so the previous engine's spinning "
                   "threads (OpenBLAS, onnxruntime) settle first")
    p.add_argument("--seed", type=int, default=0, help="inputs and round order")
    p.add_argument("--machine", action="store_true",
                   help="print the machine description (CPU, versions, BLAS kernel) and exit")
    p.add_argument("--keep-env", action="store_true",
                   help="keep OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE (default: re-run without them)")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench`: parse, drop the OpenBLAS pins (re-executing), run, report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    _env.unpin(argv, keep_env=args.keep_env)
    if args.machine:
        print(json.dumps(_env.machine(), indent=1))
        return 0
    results = run(args, out=print, argv=argv)
    return 0 if results["ok"] else 1


def run(args: argparse.Namespace, out: Callable[[str], Any] = print,
        argv: Sequence[str] = ()) -> dict[str, Any]:
    """Run the suite as `args` (parsed by `parser()`) says; print with `out`; return the
    results (also written to args.json when given). `argv` is recorded as the command."""
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(SUITE))
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; the suite has {list(SUITE)}")
    threads = args.threads or _env.physical_cores()
    if threads < 1 or args.repeat < 1 or args.ref_repeat < 1:
        raise SystemExit("--threads, --repeat and --ref-repeat must be >= 1")
    rng = random.Random(args.seed)
    results: dict[str, Any] = {
        "machine": _env.machine(), "threads": threads, "quick": args.quick,
        "repeat": args.repeat, "gap_ms": args.gap_ms,
        "command": shlex.join(["python", "-m", "bench", *argv]), "started": _now(),
        "models": [], "ok": True,
    }
    out(_header(results))
    engines = [e for e in ENGINES if not (e == "reference" and args.no_reference)]
    with tempfile.TemporaryDirectory(prefix="onnxkiln-bench-") as tmp:
        for name in names:
            before = _env.wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
            row = bench_model(name, args, threads, engines, rng, Path(tmp))
            row["other_load_cores"]["before"] = before
            results["models"].append(row)
            out(_model_line(row))
            gc.collect()
    results["geomean"] = _geomeans(results["models"])
    out("")
    out(format_models(results, args.markdown))
    if not args.no_memory:
        out("")
        out(format_memory(results, args.markdown))
    if not args.no_overhead:
        results["overhead"] = bench_overhead(args, threads, engines, rng)
        out("")
        out(format_overhead(results["overhead"]))
    if not args.no_creation:
        results["session_creation"] = bench_creation(args, threads, rng)
        out(format_creation(results["session_creation"]))
    results["finished"] = _now()
    results["loadavg_end"] = _env.loadavg()
    results["ok"] = all(r["ok"] for r in results["models"])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=_jsonable) + "\n")
        out(f"\nresults written to {args.json}")
    return results


# --- one model ------------------------------------------------------------------------------


def build(name: str, quick: bool):
    """The model proto and its feeds (seeded) for one suite entry."""
    from onnxkiln import zoo

    case = SUITE[name]
    generator, small, large = zoo.MODELS[case.zoo_name]
    model = generator(small if quick else large)
    feeds = zoo.random_inputs(model, seed=0, **(case.quick_dims if quick else case.dims))
    return model, feeds


def make_engine(engine: str, data: bytes, threads: int, info: dict | None = None
                ) -> Callable[[dict], list]:
    """A callable feeds -> outputs for one engine over serialized model bytes; `info`, when
    given, receives facts about the session (onnxkiln: its optimized node count)."""
    if engine == "onnxkiln":
        from onnxkiln import InferenceSession

        session = InferenceSession.builder().optimization("all").intra_op_threads(threads) \
            .load_bytes(data)
        if info is not None:
            info["nodes"] = len(list(session.graph()))
        return session.run
    if engine == "onnxruntime":
        import onnxruntime

        opts = onnxruntime.SessionOptions()  # default graph optimizations (ORT_ENABLE_ALL)
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        ort = onnxruntime.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        return lambda feeds: ort.run(None, feeds)
    if engine == "reference":
        import onnx
        from onnx.reference import ReferenceEvaluator
        from threadpoolctl import threadpool_limits

        ref = ReferenceEvaluator(onnx.load_from_string(data))

        def run(feeds: dict) -> list:
            with threadpool_limits(threads, user_api="blas"):
                return ref.run(None, feeds)

        return run
    raise ValueError(f"unknown engine {engine!r}")


def bench_model(name: str, args: argparse.Namespace, threads: int, engines: list[str],
                rng: random.Random, tmp: Path) -> dict[str, Any]:
    """Time, compare and (in child processes) measure one suite model."""
    case = SUITE[name]
    model, feeds = build(name, args.quick)
    data = model.SerializeToString()
    row: dict[str, Any] = {
        "model": name, "label": case.label if not args.quick else f"{name} (small config)",
        "nodes": len(model.graph.node), "params": sum(math.prod(t.dims)
                                                      for t in model.graph.initializer),
        "model_mb": len(data) / 2**20, "ok": True, "errors": {},
        "ms": {}, "samples": {}, "create_s": {}, "first_run_ms": {}, "ref_cap_s": args.ref_cap,
    }
    del model
    calls: dict[str, Callable[[], Any]] = {}
    outputs: dict[str, list] = {}
    ref_limit = args.ref_repeat
    for engine in engines:
        try:
            start = time.perf_counter()
            info: dict[str, Any] = {}
            fn = make_engine(engine, data, threads, info)
            row["create_s"][engine] = time.perf_counter() - start
            if "nodes" in info:
                row["kiln_nodes"] = info["nodes"]
            cap = args.ref_cap if engine == "reference" else 0.0
            start = time.perf_counter()
            with deadline(cap):
                outputs[engine] = [np.asarray(o) for o in fn(feeds)]
            first = time.perf_counter() - start
            row["first_run_ms"][engine] = first * 1e3
            if engine == "reference":  # few timed runs, inside the cap; at least one
                ref_limit = max(1, min(args.ref_repeat, int((cap - first) / first)))
                if first * 2 > cap:
                    row["ms"]["reference"] = first * 1e3  # its only run is its sample
                    row["samples"]["reference"] = 1
                    continue
            else:
                fn(feeds)
                fn(feeds)  # warm: first-run costs are not latency
            calls[engine] = lambda fn=fn: fn(feeds)
        except Timeout:
            row["ms"][engine] = None
            row["errors"][engine] = f"> {args.ref_cap:g} s"
        except Exception as e:  # an engine that cannot run the model is a result, not a crash
            if engine != "reference":
                row["ok"] = False
            row["errors"][engine] = f"{type(e).__name__}: {e}"[:300]
    repeat = min(args.repeat, 5) if args.quick else args.repeat
    load = _env.OtherLoad()  # other processes' CPU use while the engines are timed
    times = interleave(calls, repeat, {"reference": ref_limit}, rng, args.gap_ms / 1e3)
    row["other_load_cores"] = {"during": load.cores()}
    for engine, t in times.items():
        row["ms"][engine] = float(np.median(t)) * 1e3
        row["samples"][engine] = len(t)
        row.setdefault("min_ms", {})[engine] = float(np.min(t)) * 1e3
        row.setdefault("all_ms", {})[engine] = [x * 1e3 for x in t]
    del calls
    _ratios(row, outputs)
    kiln, ort = times.get("onnxkiln"), times.get("onnxruntime")
    if kiln and ort:  # per-round ratios: robust to drift that spans a round
        row["kiln_vs_ort_paired"] = float(np.median(np.divide(kiln, ort)))
    if not args.no_memory:
        row["memory"] = _memory(name, data, feeds, threads, engines, row, args, tmp)
    return row


def _ratios(row: dict[str, Any], outputs: dict[str, list]) -> None:
    ms = row["ms"]
    kiln, ort, ref = ms.get("onnxkiln"), ms.get("onnxruntime"), ms.get("reference")
    row["kiln_vs_ort"] = kiln / ort if kiln and ort else None
    row["ref_vs_kiln"] = ref / kiln if ref and kiln else None
    row["ref_cut_off"] = bool(kiln and ref is None and
                              row["errors"].get("reference", "").startswith(">"))
    if row["ref_cut_off"]:  # the cap over onnxkiln's time: a lower bound of the speed-up
        row["ref_vs_kiln"] = row["ref_cap_s"] * 1e3 / kiln
    row["max_abs_diff"] = _max_diff(outputs.get("onnxkiln"), outputs.get("onnxruntime"))
    row["ref_max_abs_diff"] = _max_diff(outputs.get("reference"), outputs.get("onnxruntime"))
    theirs = outputs.get("onnxruntime") or []
    row["ort_max_abs"] = max((float(np.max(np.abs(o))) for o in theirs if o.size), default=0.0)
    if row["max_abs_diff"] is not None and not (
            row["max_abs_diff"] <= 1e-3 * max(1.0, row["ort_max_abs"])):
        row["ok"] = False
        row["errors"]["diff"] = f"onnxkiln differs from onnxruntime by {row['max_abs_diff']:g}"


def _max_diff(a: list | None, b: list | None) -> float | None:
    if a is None or b is None:
        return None
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return math.inf
        if x.size:
            worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y))))
    return worst


def _memory(name: str, data: bytes, feeds: dict, threads: int, engines: list[str],
            row: dict[str, Any], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Run bench.memprobe once per engine in a fresh process (same file, same feeds)."""
    model_path, feeds_path = tmp / f"{name}.onnx", tmp / f"{name}.npz"
    model_path.write_bytes(data)
    np.savez(feeds_path, **feeds)
    result: dict[str, Any] = {"method": "bench/memprobe.py: VmHWM growth over VmRSS after "
                                        "imports, fresh process per engine"}
    for engine in engines:
        if engine not in row["ms"] or (engine == "reference" and row["ms"][engine] is None):
            result[engine] = None  # it failed or passed its cap in the timed runs
            continue
        runs = 1 if engine == "reference" else 3
        cap = args.ref_cap if engine == "reference" else 0.0
        cmd = [sys.executable, "-m", "bench.memprobe", engine, str(model_path), str(feeds_path),
               "--threads", str(threads), "--runs", str(runs), "--cap", str(cap)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=_env.ROOT,
                                  timeout=cap + 600, check=False)
        except subprocess.TimeoutExpired:
            result[engine] = {"error": "the memory probe timed out"}
            continue
        try:
            result[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            result[engine] = {"error": f"exit {proc.returncode}: {proc.stderr[-300:]}"}
    model_path.unlink()
    feeds_path.unlink()
    return result


# --- microbenchmarks ------------------------------------------------------------------------


def chain_model(n: int):
    """n one-element Adds in a chain: per-op dispatch cost, no math to speak of."""
    from onnx import helper

    from onnxkiln.testing import make_model, tensor_info

    nodes = [helper.make_node("Add", ["x" if i == 0 else f"t{i - 1}", "one"],
                              [f"t{i}" if i < n - 1 else "y"]) for i in range(n)]
    return make_model(nodes, [tensor_info("x", np.float32, [1])],
                      [tensor_info("y", np.float32, [1])], {"one": np.ones(1, np.float32)},
                      name=f"chain{n}")


def bench_overhead(args: argparse.Namespace, threads: int, engines: list[str],
                   rng: random.Random, n: int = 1000) -> dict[str, Any]:
    """Median µs per op of a chain of n one-element Adds, per engine."""
    data = chain_model(n).SerializeToString()
    feeds = {"x": np.ones(1, np.float32)}
    calls, result = {}, {"nodes": n, "us_per_op": {}, "value_ok": {}}
    for engine in engines:
        fn = make_engine(engine, data, threads)
        y = fn(feeds)[0]
        result["value_ok"][engine] = bool(np.allclose(y, n + 1.0))
        fn(feeds)
        calls[engine] = lambda fn=fn: fn(feeds)
    repeat = 5 if args.quick else max(args.repeat, 30)
    times = interleave(calls, repeat, {"reference": max(3, args.ref_repeat)}, rng,
                       args.gap_ms / 1e3)
    for engine, t in times.items():
        result["us_per_op"][engine] = float(np.median(t)) / n * 1e6
    us = result["us_per_op"]
    if "onnxkiln" in us and "onnxruntime" in us:
        result["kiln_minus_ort_us"] = us["onnxkiln"] - us["onnxruntime"]
    result["per_run_us"] = _per_run_cost(threads, [e for e in engines if e != "reference"],
                                         rng)
    return result


def _per_run_cost(threads: int, engines: list[str], rng: random.Random, runs: int = 2000,
                  samples: int = 7) -> dict[str, float]:
    """µs per `run` of an Identity model (the fixed cost of a call: input checks, thread
    setup, output finishing), median of `samples` blocks of back-to-back runs, engines
    alternating in a shuffled order."""
    from onnx import helper

    from onnxkiln.testing import make_model, tensor_info

    model = make_model([helper.make_node("Identity", ["x"], ["y"])],
                       [tensor_info("x", np.float32, [1, 4])],
                       [tensor_info("y", np.float32, [1, 4])], name="identity")
    data = model.SerializeToString()
    feeds = {"x": np.ones((1, 4), np.float32)}
    fns = {e: make_engine(e, data, threads) for e in engines}
    times: dict[str, list[float]] = {e: [] for e in engines}
    for fn in fns.values():
        for _ in range(100):
            fn(feeds)
    for _ in range(samples):
        order = list(engines)
        rng.shuffle(order)
        for e in order:
            fn = fns[e]
            start = time.perf_counter()
            for _ in range(runs):
                fn(feeds)
            times[e].append((time.perf_counter() - start) / runs * 1e6)
    return {e: float(np.median(t)) for e, t in times.items()}


def bench_creation(args: argparse.Namespace, threads: int, rng: random.Random,
                   name: str = "bert") -> dict[str, Any]:
    """Session creation (parse + optimize + plan, from serialized bytes) for the BERT
    model, onnxkiln vs onnxruntime, interleaved; and each one's first run after it."""
    model, feeds = build(name, args.quick)
    data = model.SerializeToString()
    del model
    repeat = 2 if args.quick else 5
    samples: dict[str, list[float]] = {"onnxkiln": [], "onnxruntime": []}
    first: dict[str, list[float]] = {"onnxkiln": [], "onnxruntime": []}
    for _ in range(repeat):
        order = list(samples)
        rng.shuffle(order)
        for engine in order:
            gc.collect()
            time.sleep(args.gap_ms / 1e3)
            start = time.perf_counter()
            fn = make_engine(engine, data, threads)
            samples[engine].append(time.perf_counter() - start)
            first[engine].append(timed(lambda fn=fn: fn(feeds), args.gap_ms / 1e3))
            del fn
    return {
        "model": name, "label": SUITE[name].label if not args.quick else f"{name} (small)",
        "model_mb": len(data) / 2**20, "repeat": repeat,
        "create_ms": {k: float(np.median(v)) * 1e3 for k, v in samples.items()},
        "first_run_ms": {k: float(np.median(v)) * 1e3 for k, v in first.items()},
        "all_create_ms": {k: [x * 1e3 for x in v] for k, v in samples.items()},
    }


# --- summary and formatting -----------------------------------------------------------------


def _geomeans(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def gm(values: list[float]) -> float | None:
        values = [v for v in values if v]
        return math.exp(sum(map(math.log, values)) / len(values)) if values else None

    kiln = [r["kiln_vs_ort"] for r in rows if r.get("kiln_vs_ort")]
    ref = [r["ref_vs_kiln"] for r in rows if r.get("ref_vs_kiln")]
    return {"kiln_vs_ort": gm(kiln), "ref_vs_kiln": gm(ref),
            "ref_vs_kiln_is_lower_bound": any(r.get("ref_cut_off") for r in rows),
            "worst_kiln_vs_ort": max(kiln, default=None),
            "least_ref_vs_kiln": min(ref, default=None)}


def _table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def _ms(row: dict[str, Any], engine: str) -> str:
    if engine in row["errors"] and row["ms"].get(engine) is None:
        err = row["errors"][engine]
        return err if err.startswith(">") else "error"
    value = row["ms"].get(engine)
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 1000 else f"{value:,.0f}"


def _x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def format_models(results: dict[str, Any], markdown: bool = False) -> str:
    """The latency table: one row per model, then the geometric means."""
    header = ["model", "nodes (optimized)", "onnxkiln ms", "onnxruntime ms", "reference ms",
              "kiln/ort", "ref/kiln", "max abs diff vs ort"]
    rows = []
    for r in results["models"]:
        ref = ("> " if r.get("ref_cut_off") else "") + _x(r["ref_vs_kiln"], 0)
        diff = "-" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.1e}"
        nodes = str(r["nodes"]) + (f" -> {r['kiln_nodes']}" if r.get("kiln_nodes") else "")
        rows.append([r["label"] if markdown else r["model"], nodes,
                     _ms(r, "onnxkiln"), _ms(r, "onnxruntime"), _ms(r, "reference"),
                     _x(r["kiln_vs_ort"]), ref, diff])
    g = results["geomean"]
    rows.append(["geometric mean", "", "", "", "", _x(g["kiln_vs_ort"]),
                 (">= " if g["ref_vs_kiln_is_lower_bound"] else "") + _x(g["ref_vs_kiln"], 0),
                 ""])
    title = (f"median latency, {results['threads']} thread(s), interleaved rounds "
             f"(onnxkiln/onnxruntime: lower is better; ref/kiln: speed-up over the "
             f"ReferenceEvaluator)")
    return title + ("\n\n" if markdown else "\n") + _table(header, rows, markdown)


def format_memory(results: dict[str, Any], markdown: bool = False) -> str:
    """Peak memory per engine (fresh process each; see bench/memprobe.py)."""
    header = ["model", "weights MiB", *(f"{e} peak (run) MiB" for e in ENGINES)]
    rows = []
    for r in results["models"]:
        cells = [r["model"], f"{r['params'] * 4 / 2**20:.1f}"]
        for engine in ENGINES:
            m = (r.get("memory") or {}).get(engine)
            if not m:
                cells.append("-")
            elif "error" in m:
                cells.append("error")
            else:
                cells.append(f"{m['peak'] / 2**20:.0f} ({m['run_growth'] / 2**20:.0f})")
        rows.append(cells)
    title = ("peak memory: resident growth over load + runs in a fresh process per engine "
             "(in parentheses: growth during the runs alone)")
    return title + ("\n\n" if markdown else "\n") + _table(header, rows, markdown)


def format_overhead(o: dict[str, Any]) -> str:
    us = o["us_per_op"]
    parts = [f"{e} {us[e]:.2f} us/op" for e in ENGINES if e in us]
    text = f"dispatch overhead ({o['nodes']} chained one-element Adds): " + ", ".join(parts)
    per_run = o.get("per_run_us")
    if per_run:
        text += "; per-run cost (Identity model): " + ", ".join(
            f"{e} {v:.1f} us" for e, v in per_run.items())
    return text


def format_creation(c: dict[str, Any]) -> str:
    k, o = c["create_ms"], c["first_run_ms"]
    return (f"session creation, {c['label']} ({c['model_mb']:.0f} MB, from bytes, median of "
            f"{c['repeat']}): onnxkiln {k['onnxkiln']:.0f} ms, onnxruntime "
            f"{k['onnxruntime']:.0f} ms ({k['onnxkiln'] / k['onnxruntime']:.2f}x); first run "
            f"after it: onnxkiln {o['onnxkiln']:.1f} ms, onnxruntime {o['onnxruntime']:.1f} ms")


def _model_line(r: dict[str, Any]) -> str:
    cells = ", ".join(f"{e} {_ms(r, e)} ms" for e in ENGINES if e in r["ms"] or e in r["errors"])
    errors = {k: v for k, v in r["errors"].items() if not v.startswith(">")}
    load = r.get("other_load_cores", {}).get("during")
    busy = "" if load is None else f"  (other processes: {load:.2f} cores busy)"
    return f"  {r['model']}: {cells}{busy}" + (f"  ERRORS: {errors}" if errors else "")


def _header(results: dict[str, Any]) -> str:
    m = results["machine"]
    blas = "; ".join(f"{b['internal_api']} {b['version']} {b['architecture']}"
                     for b in m["blas"]) or "none"
    removed = m["openblas_pins_removed"]
    return (f"onnxkiln bench suite: {m['cpu']}, {m['physical_cores']} physical cores; "
            f"threads {results['threads']}; numpy {m['numpy']}, onnxruntime {m['onnxruntime']}, "
            f"onnx {m['onnx']}; BLAS {blas}"
            + (f"; removed from the environment: {removed}" if removed else "")
            + (f"; OpenBLAS pins kept: {m['openblas_pins_present']}"
               if m["openblas_pins_present"] else ""))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
