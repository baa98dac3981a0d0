"""The commands behind `onnxkiln COMMAND`: each takes the parsed arguments and an Output
and returns the exit code (a SessionError or a UsageError escapes to `main`)."""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import Progress
from rich.table import Column, Table
from rich.text import Text

from onnxkiln import loader
from onnxkiln.builder import SessionBuilder
from onnxkiln.cli import UsageError
from onnxkiln.cli._feeds import Feeds, make_feeds
from onnxkiln.cli._output import Output, describe, plain, print_wide, timing
from onnxkiln.dtypes import DataType
from onnxkiln.errors import (
    InvalidOptionError,
    SessionError,
    UnknownOptionError,
    UnsupportedOpError,
)
from onnxkiln.session import InferenceSession
from onnxkiln.trace import OpTime, Profile, TraceContext, summarize

__all__ = ["cmd_bench", "cmd_cache", "cmd_check", "cmd_demo", "cmd_info", "cmd_profile",
           "cmd_run", "cmd_serve"]

_FIRST_RUN = "first run (kernels compile, or load from the disk cache, on first use)"


# run ---------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace, out: Output) -> int:
    """Run once (the first-run time), warm up, time `--repeat` steady runs."""
    session, load_s = _load(args, out)
    feeds = _feeds(session, args)
    first_s, outputs = _first_run(session, feeds, out)
    for _ in range(args.warmup if args.repeat else 0):
        session.run_outputs(feeds.arrays)
    times = _timed(lambda: session.run_outputs(feeds.arrays), args.repeat)
    saved = _save(args.save, outputs) if args.save else None
    steady = timing(times)
    if out.as_json:
        out.json({"model": args.model, "load_s": load_s, "first_run_ms": first_s * 1e3,
                  "steady": {**steady, "warmup": args.warmup if args.repeat else 0},
                  "inputs": _inputs_doc(feeds), "dims": feeds.dims,
                  "outputs": [{"name": o.name, "kind": o.kind, **_value_doc(o.value)}
                              for o in outputs],
                  "saved": saved})
        return 0
    table = Table("output", "type", "shape", "values", title="outputs")
    for o in outputs:
        table.add_row(o.name, *describe(o.value))
    out.print(table)
    out.print(f"load {load_s:.2f} s; first run {first_s * 1e3:.3f} ms (first-use costs "
              "included)")
    if times:
        out.print(f"steady: {_plural(steady['runs'], 'run')} after "
                  f"{_plural(args.warmup, 'warm-up run')}, median "
                  f"{steady['median_ms']:.3f} ms, min {steady['min_ms']:.3f} ms, p90 "
                  f"{steady['p90_ms']:.3f} ms")
    if saved:
        out.print(f"outputs saved in {args.save}")
    return 0


def _load(args: argparse.Namespace, out: Output) -> tuple[InferenceSession, float]:
    """The session for `args.model` on --device with --threads; and the seconds it took."""
    builder = _builder(args.device, threads=args.threads)
    start = time.perf_counter()
    with out.step(f"loading {args.model} (reading, optimizing, planning)"):
        session = builder.load(args.model)
    return session, time.perf_counter() - start


def _builder(device: str, threads: int | None = None, providers: str | None = None,
             optimization: str | None = None) -> SessionBuilder:
    """A session builder from command-line values; a value it refuses is a UsageError."""
    try:
        builder = InferenceSession.builder().device(device)
        if threads:
            builder.intra_op_threads(threads)
        if providers:
            builder.providers([p.strip() for p in providers.split(",") if p.strip()])
        if optimization:
            builder.optimization(optimization)
    except (InvalidOptionError, UnknownOptionError) as e:
        raise UsageError(str(e)) from None
    return builder


def _feeds(session: InferenceSession, args: argparse.Namespace) -> Feeds:
    return make_feeds(session.inputs(), args.input, args.dim, args.seed)


def _first_run(session: InferenceSession, feeds: Feeds, out: Output) -> tuple[float, list]:
    """Time the first run; when it fails on random inputs, say which dims they had."""
    start = time.perf_counter()
    try:
        with out.step(_FIRST_RUN):
            outputs = session.run_outputs(feeds.arrays)
    except SessionError:
        if feeds.dims and any(o == "random" or o.startswith("ints:")
                              for o in feeds.origin.values()):
            dims = ", ".join(f"{d}={n}" for d, n in sorted(feeds.dims.items()))
            out.note(f"note: the random inputs had {dims}; give sizes that fit with --dim "
                     "NAME=SIZE, or the inputs with --input NAME=FILE.npy")
        raise
    return time.perf_counter() - start, outputs


def _timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _save(folder_name: str, outputs: list) -> list[str]:
    """Tensors to <name>.npy, sequences and maps to <name>.json; the files written."""
    folder = Path(folder_name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--save {folder}: cannot make the folder ({e.strerror})") from None
    written = []
    for o in outputs:
        if isinstance(o.value, np.ndarray | np.generic):
            path = folder / f"{_safe_name(o.name)}.npy"
            np.save(path, np.asarray(o.value))
        else:
            path = folder / f"{_safe_name(o.name)}.json"
            path.write_text(json.dumps(plain(o.value), default=str))
        written.append(str(path))
    return written


def _inputs_doc(feeds: Feeds) -> list[dict[str, Any]]:
    return [{"name": name, "dtype": str(a.dtype), "shape": list(a.shape),
             "from": feeds.origin.get(name, "random")} for name, a in feeds.arrays.items()]


def _value_doc(value: Any) -> dict[str, Any]:
    if isinstance(value, np.ndarray | np.generic):
        a = np.asarray(value)
        return {"dtype": str(a.dtype), "shape": list(a.shape), "values": plain(a, limit=8)}
    return {"length": len(value) if hasattr(value, "__len__") else None,
            "values": plain(value, limit=8)}


# bench -------------------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace, out: Output) -> int:
    """Latency percentiles and throughput, interleaved with onnxruntime's."""
    if args.suite is not None:
        return _bench_suite(args)
    if args.model is None:
        raise UsageError("bench needs a MODEL file (or --suite for the benchmark suite)")
    session, load_s = _load(args, out)
    feeds = _feeds(session, args)
    first_s, _ = _first_run(session, feeds, out)
    runners = {"onnxkiln": lambda: session.run_outputs(feeds.arrays)}
    ort = None if args.no_ort else _ort_runner(args, out, feeds.arrays)
    if ort is not None:
        runners["onnxruntime"] = ort
    for fn in runners.values():
        for _ in range(args.warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in runners}
    with Progress(console=out.err, transient=True, disable=not out.err.is_terminal) as progress:
        task = progress.add_task("benchmarking", total=args.runs)
        for _ in range(args.runs):  # interleaved, so drift hits both alike
            for name, fn in runners.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
            progress.advance(task)
    stats = {name: _latency(t) for name, t in times.items()}
    ratio = None
    if "onnxruntime" in stats:
        ours, theirs = stats["onnxkiln"], stats["onnxruntime"]
        ratio = {"p50": ours["p50_ms"] / theirs["p50_ms"], "p99": ours["p99_ms"] / theirs["p99_ms"],
                 "throughput": ours["runs_per_s"] / theirs["runs_per_s"]}
    if out.as_json:
        out.json({"model": args.model, "load_s": load_s, "first_run_ms": first_s * 1e3,
                  "runs": args.runs, "warmup": args.warmup, "dims": feeds.dims,
                  "latency": stats, "onnxkiln_over_onnxruntime": ratio})
        return 0
    table = Table("runtime", "runs", "p50 ms", "p90 ms", "p99 ms", "mean ms", "runs/s",
                  title=f"{Path(args.model).name}: latency")
    for name, st in stats.items():
        cells = [f"{st[k]:.3f}" for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")]
        table.add_row(name, str(args.runs), *cells, f"{st['runs_per_s']:.1f}")
    out.print(f"load {load_s:.2f} s; first run {first_s * 1e3:.3f} ms; then {args.warmup} "
              "untimed warm-up runs")
    out.print(table)
    if ratio is not None:
        out.print(f"onnxkiln / onnxruntime: p50 {ratio['p50']:.2f}x, p99 {ratio['p99']:.2f}x, "
                  f"throughput {ratio['throughput']:.2f}x")
    return 0


def _bench_suite(args: argparse.Namespace) -> int:
    """`onnxkiln bench --suite ...`: the harness in the checkout's bench/ (python -m bench)."""
    if args.model is not None:
        raise UsageError("bench --suite builds its own models; drop the MODEL argument")
    suite_args = list(args.suite)
    if args.threads and "--threads" not in suite_args:
        suite_args += ["--threads", str(args.threads)]
    root = Path(__file__).resolve().parents[3]
    if (root / "bench" / "suite.py").is_file():
        sys.path.insert(0, str(root))
    try:
        from bench import _env  # type: ignore[import-not-found]
        from bench.suite import main as suite_main  # type: ignore[import-not-found]
    except ImportError as e:
        raise UsageError("--suite needs onnxkiln's source checkout (its bench/ folder); "
                         f"run `python -m bench` there ({e})") from e
    # numpy is loaded already: drop the OpenBLAS pins by re-executing `python -m bench`
    _env.unpin(suite_args, keep_env="--keep-env" in suite_args)
    return suite_main(suite_args)


def _ort_runner(args: argparse.Namespace, out: Output, feeds: dict[str, np.ndarray]):
    """onnxruntime's run on the same feeds (its CUDA provider for a cuda --device), or None
    with a note on stderr."""
    if importlib.util.find_spec("onnxruntime") is None:
        out.note("onnxruntime is not installed, so there is no comparison: "
                 "pip install 'onnxkiln[bench]' adds it")
        return None
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if args.threads:
        options.intra_op_num_threads = args.threads
    providers = ["CPUExecutionProvider"]
    if args.device.startswith("cuda"):
        providers.insert(0, "CUDAExecutionProvider")
    try:
        ort = onnxruntime.InferenceSession(args.model, options, providers=providers)
    except Exception as e:  # onnxruntime raises its own exception types
        out.note(f"onnxruntime cannot load the model ({type(e).__name__}: {e}); skipping it")
        return None
    return lambda: ort.run(None, feeds)


def _latency(times: list[float]) -> dict[str, float]:
    ms = np.array(times) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"p50_ms": float(p50), "p90_ms": float(p90), "p99_ms": float(p99),
            "mean_ms": float(ms.mean()), "runs_per_s": len(ms) / float(np.sum(ms) / 1e3)}


# profile -----------------------------------------------------------------------------
def cmd_profile(args: argparse.Namespace, out: Output) -> int:
    """Traced runs after an untraced first one: self time per op type and node."""
    session, _ = _load(args, out)
    feeds = _feeds(session, args)
    _first_run(session, feeds, out)  # first-run costs are not the profile
    path = Path(args.trace or f"{_safe_name(Path(args.model).stem)}_profile.json")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as e:
        raise UsageError(f"--trace {path}: cannot write it ({e.strerror})") from None
    ctx = TraceContext.chrome(path)
    session.set_trace_context(ctx)
    try:
        with Progress(console=out.err, transient=True, disable=not out.err.is_terminal) as progress:
            task = progress.add_task("profiling", total=args.runs)
            for _ in range(args.runs):
                session.run_outputs(feeds.arrays)
                progress.advance(task)
    finally:
        session.set_trace_context(TraceContext.disabled())
        ctx.close()
    profile = summarize(ctx.spans)
    run_ms = profile.run_ns / profile.runs / 1e6
    out.print(Text.assemble((Path(args.model).name, "bold"),
                            f": {profile.runs} traced runs, mean {run_ms:.3f} ms per run; "
                            "times are per run, self time (an If/Loop/Scan node's own time "
                            "excludes its body's ops)"))
    print_wide(out, _op_table("op type", profile.by_op, profile, None))
    print_wide(out, _op_table("node", profile.by_node, profile, args.top))
    covered = sum(t.self_ns for t in profile.by_op.values()) / max(profile.run_ns, 1)
    out.print(f"ops cover {covered:.1%} of traced run time (the rest: tracing, dispatch, "
              "input validation)")
    if any(t.fused_from for t in profile.by_node.values()):
        out.print("a fused node's row names the model's nodes it replaced (all of them: "
                  "args.fused_from in the trace)")
    out.print(f"Chrome trace: {path} ({len(ctx.spans)} events); open it in "
              "https://ui.perfetto.dev or chrome://tracing")
    return 0


def _op_table(what: str, rows: dict[str, OpTime], profile: Profile, top: int | None) -> Table:
    ranked = sorted(rows.items(), key=lambda kv: -kv[1].self_ns)
    title = f"time per {what}" if top is None else f"top {min(top, len(ranked))} nodes"
    columns = [Column(what, no_wrap=True)]
    if top is not None:
        columns.append(Column("op type", no_wrap=True))
    fused = top is not None and any(t.fused_from for _, t in ranked[:top])
    table = Table(*columns, "count", "total ms", "% of run", "mean µs", title=title)
    if fused:
        table.add_column("replaces (the model's nodes)", no_wrap=True)
    for key, t in ranked[:top]:
        cells = [key] if top is None else [key, t.op_type]
        cells += [f"{t.count / profile.runs:g}", f"{t.self_ns / profile.runs / 1e6:.3f}",
                  f"{t.self_ns / max(profile.run_ns, 1):.1%}", f"{t.self_ns / t.count / 1e3:.1f}"]
        table.add_row(*cells, *([_sources(t.fused_from)] if fused else []))
    return table


def _sources(names: tuple[str, ...], shown: int = 4) -> str:
    """A fused node's source names, their shared scope (`a/b/`) written once."""
    if not names:
        return ""
    parts = [n.split("/") for n in names]
    depth = 0
    while len(names) > 1 and all(len(p) > depth + 1 and p[depth] == parts[0][depth]
                                 for p in parts):
        depth += 1
    scope = "/".join(parts[0][:depth])
    short = ["/".join(p[depth:]) for p in parts[:shown]] if scope else list(names[:shown])
    more = f", +{len(names) - shown} more" if len(names) > shown else ""
    return (f"{scope}/{{{', '.join(short)}{more}}}" if scope else ", ".join(short) + more)


# info and check ----------------------------------------------------------------------
def cmd_info(args: argparse.Namespace, out: Output) -> int:
    """What the file holds, before any optimization."""
    model = loader.load_path(args.model)
    graph = model.graph
    inits = set(graph.initializers)
    io = [{"kind": kind, "name": v.name,
           "dtype": str(DataType(v.dtype)) if v.dtype is not None else "?",
           "shape": None if v.shape is None else
           [d if isinstance(d, int) else (d.value or "?") for d in v.shape]}
          for kind, values in (("input", graph.inputs), ("output", graph.outputs))
          for v in values if not (kind == "input" and v.name in inits)]
    histogram = collections.Counter(
        f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in graph.all_nodes())
    params = sum(int(np.prod(v.shape.numpy())) for v in graph.initializers.values()
                 if v.shape is not None)
    weights = sum(v.const_value.nbytes for v in graph.initializers.values()
                  if v.const_value is not None)
    opsets = {d or "ai.onnx": v for d, v in sorted(model.opset_imports.items())}
    doc = {"model": args.model, "graph": graph.name, "ir_version": model.ir_version,
           "producer": f"{model.producer_name or ''} {model.producer_version or ''}".strip(),
           "opsets": opsets, "io": io, "nodes": sum(histogram.values()),
           "ops": dict(histogram.most_common()), "initializers": len(inits),
           "parameters": params, "weight_bytes": weights,
           "file_bytes": os.path.getsize(args.model)}
    if out.as_json:
        out.json(doc)
        return 0
    out.print(Text.assemble((args.model, "bold"), f"  graph '{graph.name}'  ir_version "
                            f"{model.ir_version}  producer {doc['producer'] or '?'}"))
    out.print("opsets: " + ", ".join(f"{d} {v}" for d, v in opsets.items()))
    table = Table("kind", "name", "type", "shape", title="inputs and outputs")
    for v in io:
        shape = "?" if v["shape"] is None else f"[{', '.join(map(str, v['shape']))}]"
        table.add_row(v["kind"], v["name"], v["dtype"], shape)
    out.print(table)
    ops = Table("op", "count", title=f"{doc['nodes']} nodes")
    for op, count in doc["ops"].items():
        ops.add_row(op, str(count))
    out.print(ops)
    out.print(f"size: file {_human(doc['file_bytes'])}, {len(inits)} initializers, "
              f"{params:,} parameters, {_human(weights)} of weights")
    return 0


def cmd_check(args: argparse.Namespace, out: Output) -> int:
    """Exit 0 when the model loads and every node has a kernel on the asked providers, 1
    when it does not (the reason printed, never raised)."""
    builder = _builder(args.device, providers=args.providers, optimization=args.optimization)
    doc: dict[str, Any] = {"model": args.model, "ok": False}
    try:
        with out.step(f"loading {args.model}"):
            session = builder.load(args.model)
    except SessionError as e:
        unsupported = isinstance(e, UnsupportedOpError)
        doc["error"] = {"kind": type(e).__name__, "message": str(e)}
        if out.as_json:
            out.json(doc)
        else:
            out.print(Text.assemble(("unsupported: " if unsupported else "cannot load: ",
                                     "bold red"), str(e) if unsupported else
                                    f"{type(e).__name__}: {e}"))
        return 1
    meta = session.model_metadata()
    placed = collections.Counter(s.provider for s in session._plan.steps if s.node_id >= 0)
    report = session.execution_provider_fallback_report()
    declines = [] if report is None else report.declines
    doc.update(ok=True, opsets={d or "ai.onnx": v for d, v in sorted(meta.opset_imports.items())},
               optimization=args.optimization, nodes=len(list(session.graph())),
               device=str(session.device_id()), nodes_per_provider=dict(placed),
               fallback=[{"node": d.node_name, "op": f"{d.domain or 'ai.onnx'}::{d.op_type}",
                          "reason": d.reason} for d in declines])
    if out.as_json:
        out.json(doc)
        return 0
    opsets = ", ".join(f"{d} {v}" for d, v in doc["opsets"].items())
    out.print(f"{args.model}: opsets {opsets}; {doc['nodes']} nodes after optimization "
              f"'{args.optimization}'; device {doc['device']}")
    out.print("nodes per provider: " + ", ".join(f"{p} {n}" for p, n in placed.items()))
    if report is not None:
        out.print(f"fallback: {report}")
        if declines:
            table = Table("node", "op", "reason")
            for d in doc["fallback"]:
                table.add_row(d["node"], d["op"], d["reason"])
            out.print(table)
    out.print("ok: every node has a kernel")
    return 0


# demo, cache, serve ------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace, out: Output) -> int:
    """The zoo's default model on onnxkiln, and onnxruntime when installed."""
    from onnxkiln import zoo

    model, feeds = zoo.default_model()
    session = InferenceSession.from_graph(model)
    out.print(Text.assemble(("demo: ", "bold"), f"{model.graph.name} ({len(model.graph.node)} "
                            "nodes), inputs " + ", ".join(f"{k} {v.dtype}{list(v.shape)}"
                                                          for k, v in feeds.items())))
    outputs = session.run(feeds)
    times = _timed(lambda: session.run(feeds), args.repeat)
    table = Table("output", "type", "shape", "values", title="outputs")
    for meta, value in zip(session.outputs(), outputs):
        table.add_row(meta.name, *describe(value))
    out.print(table)
    _print_times(out, "onnxkiln", times)
    if importlib.util.find_spec("onnxruntime") is None:
        out.note("onnxruntime is not installed, so there is no comparison: "
                 "pip install 'onnxkiln[bench]' adds it")
        return 0
    from onnxkiln.testing import ort_session

    ort = ort_session(model, optimize=True)
    theirs = ort.run(None, feeds)
    ort_times = _timed(lambda: ort.run(None, feeds), args.repeat)
    _print_times(out, "onnxruntime", ort_times)
    diff = max(float(np.max(np.abs(a.astype(np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(outputs, theirs))
    ratio = np.median(times) / np.median(ort_times)
    out.print(f"max |onnxkiln - onnxruntime| = {diff:.3g}; median time ratio "
              f"onnxkiln/onnxruntime = {ratio:.2f}x")
    return 0


def _print_times(out: Output, who: str, times: list[float]) -> None:
    t = timing(times)
    out.print(f"{who}: {t['runs']} runs (after a first run), median {t['median_ms']:.3f} ms, "
              f"min {t['min_ms']:.3f} ms, p90 {t['p90_ms']:.3f} ms")


def cmd_cache(args: argparse.Namespace, out: Output) -> int:
    """The disk caches of compiled kernels: where, how big; --clear empties them."""
    from onnxkiln.cli._cache import clear, locations

    found = locations()
    removed = clear(found) if args.clear else None
    if out.as_json:
        out.json({"caches": [c.doc() for c in found], "removed_files": removed})
        return 0
    table = Table("cache", "folder", "files", "size", title="compiled-kernel disk caches")
    for c in found:
        table.add_row(c.what, str(c.folder), str(c.files), _human(c.nbytes))
    print_wide(out, table)
    if removed is not None:
        out.print(f"removed {removed} file(s); kernels compile again on first use")
    else:
        out.print("onnxkiln cache --clear deletes them; NUMBA_CACHE_DIR and "
                  "ONNXKILN_FUSE_CACHE move them (ONNXKILN_FUSE_CACHE=0: no fuse cache)")
    return 0


def cmd_serve(args: argparse.Namespace, out: Output) -> int:
    """`onnxkiln serve`: onnxkiln.integrations.ray's command."""
    from onnxkiln.integrations.ray._cli import serve_command

    return serve_command(args, out.console)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "output"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"
