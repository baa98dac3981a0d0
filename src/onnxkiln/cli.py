"""`onnxkiln run | info | check | bench | profile | demo | serve`: the command line."""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Column, Table

from onnxkiln import loader
from onnxkiln.dtypes import DataType, to_numpy
from onnxkiln.errors import SessionError, UnsupportedOpError
from onnxkiln.session import InferenceSession
from onnxkiln.trace import OpTime, TraceContext, summarize
from onnxkiln.types import IoMeta

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `onnxkiln` command; returns the process exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    console = Console(highlight=False, soft_wrap=True)
    try:
        return args.func(args, console)
    except SessionError as e:
        console.print(f"[bold red]error:[/] {type(e).__name__}: {e}", markup=True)
        return 2
    except _UsageError as e:
        console.print(f"error: {e}")
        return 2


class _UsageError(Exception):
    """A bad command-line value; printed as `error: ...` with exit code 2."""


def _feed_args(p: argparse.ArgumentParser, model_optional: bool = False) -> None:
    p.add_argument("model", nargs="?" if model_optional else None)
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy|random")
    p.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE",
                   help="size for a symbolic dim of random inputs (default 1)")
    p.add_argument("--seed", type=int, default=0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnxkiln", description="ONNX inference runtime.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a model on given or random inputs")
    _feed_args(run)
    run.add_argument("--repeat", type=int, default=1)
    run.add_argument("--save", metavar="DIR", help="write each output to DIR/<name>.npy")
    run.set_defaults(func=_cmd_run)
    bench = sub.add_parser("bench", help="latency percentiles and throughput, vs onnxruntime; "
                           "--suite: the benchmark suite")
    _feed_args(bench, model_optional=True)
    bench.add_argument("--runs", type=int, default=100)
    bench.add_argument("--warmup", type=int, default=5, help="untimed runs first")
    bench.add_argument("--threads", type=int, help="intra-op threads (both runtimes)")
    bench.add_argument("--no-ort", action="store_true", help="skip onnxruntime")
    bench.add_argument("--suite", nargs=argparse.REMAINDER, metavar="SUITE OPTIONS",
                       help="run the benchmark suite (the zoo models vs onnxruntime and onnx's "
                       "ReferenceEvaluator; needs the source checkout's bench/ folder); every "
                       "later argument goes to it: see `python -m bench --help`")
    bench.set_defaults(func=_cmd_bench)
    profile = sub.add_parser("profile", help="time per op type and node, and a Chrome trace")
    _feed_args(profile)
    profile.add_argument("--runs", type=int, default=10)
    profile.add_argument("--top", type=int, default=10, help="how many nodes to list")
    profile.add_argument("--trace", metavar="FILE.json",
                         help="Chrome trace path (default <model name>_profile.json)")
    profile.set_defaults(func=_cmd_profile)
    info = sub.add_parser("info", help="inputs, outputs, opsets, op histogram and size")
    info.add_argument("model")
    info.set_defaults(func=_cmd_info)
    check = sub.add_parser("check", help="can this model run here: unsupported ops, opsets, "
                           "placement per provider")
    check.add_argument("model")
    check.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    check.add_argument("--providers", help="comma-separated priority list, e.g. cuda,cpu")
    check.add_argument("--optimization", default="all",
                       choices=["disabled", "basic", "extended", "all"])
    check.set_defaults(func=_cmd_check)
    demo = sub.add_parser("demo", help="run the built-in demo model, and onnxruntime if present")
    demo.add_argument("--repeat", type=int, default=20)
    demo.set_defaults(func=_cmd_demo)
    _serve_args(sub.add_parser("serve", help="serve a model over HTTP on Ray Serve (extra 'ray')"))
    return parser


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to listen on all interfaces")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--replicas", type=int, default=1, help="replicas, each with its session")
    p.add_argument("--max-batch-size", type=int, default=32,
                   help="requests per @serve.batch batch; 1 turns batching off")
    p.add_argument("--batch-wait-ms", type=float, default=5.0,
                   help="how long a batch waits to fill")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, help="intra-op threads per replica")
    p.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves per replica")
    p.add_argument("--replica-gpus", type=float, default=0.0, help="GPUs Ray gives each replica")
    p.add_argument("--route-prefix", default="/")
    p.add_argument("--name", default="onnxkiln", help="the Serve application's name")
    p.add_argument("--address", help="a Ray cluster to join (default: start a local one)")
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace, console: Console) -> int:
    from onnxkiln.integrations.ray._cli import serve_command

    return serve_command(args, console)


def _cmd_check(args: argparse.Namespace, console: Console) -> int:
    """Exit 0 when every node has a kernel on the asked providers, 1 when some do not."""
    builder = InferenceSession.builder().device(args.device).optimization(args.optimization)
    if args.providers:
        builder = builder.providers([p.strip() for p in args.providers.split(",") if p.strip()])
    try:
        session = builder.load(args.model)
    except UnsupportedOpError as e:
        console.print(f"[bold red]unsupported:[/] {e}", markup=True)
        return 1
    meta = session.model_metadata()
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(meta.opset_imports.items()))
    console.print(f"{args.model}: opsets {opsets}; {len(list(session.graph()))} nodes after "
                  f"optimization '{args.optimization}'; device {session.device_id()}")
    placed = collections.Counter(s.provider for s in session._plan.steps if s.node_id >= 0)
    console.print("nodes per provider: " + ", ".join(f"{p} {n}" for p, n in placed.items()))
    report = session.execution_provider_fallback_report()
    if report is not None:
        console.print(f"fallback: {report}")
        table = Table("node", "op", "reason")
        for d in report.declines:
            table.add_row(d.node_name, f"{d.domain or 'ai.onnx'}::{d.op_type}", d.reason)
        if report.declines:
            console.print(table)
    console.print("ok: every node has a kernel")
    return 0


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    if args.repeat < 1:
        console.print("error: --repeat must be >= 1")
        return 2
    session = InferenceSession.load(args.model)
    feeds = _feeds(session, args)
    outputs, times = _timed(session.run, feeds, args.repeat)
    _print_outputs(console, [m.name for m in session.outputs()], outputs)
    _print_times(console, "onnxkiln", times)
    if args.save:
        folder = Path(args.save)
        folder.mkdir(parents=True, exist_ok=True)
        for meta, value in zip(session.outputs(), outputs):
            np.save(folder / f"{_safe_name(meta.name)}.npy", value)
        console.print(f"outputs saved in {folder}")
    return 0


def _feeds(session: InferenceSession, args: argparse.Namespace) -> dict[str, np.ndarray]:
    """Inputs from --input files, random for the rest (--dim sizes symbolic dims)."""
    dims = _parse_pairs(args.dim, "--dim")
    sources = _parse_pairs(args.input, "--input")
    rng = np.random.default_rng(args.seed)
    feeds = {}
    for meta in session.inputs():
        source = sources.pop(meta.name, None)
        if source is None and meta.optional:
            continue
        if source is None or source == "random":
            feeds[meta.name] = random_input(meta, dims, rng)
        else:
            feeds[meta.name] = np.load(source, allow_pickle=False)
    if sources:
        names = [m.name for m in session.inputs()]
        raise _UsageError(f"unknown input(s) {sorted(sources)}; the model's inputs are {names}")
    return feeds


def _cmd_bench(args: argparse.Namespace, console: Console) -> int:
    if args.suite is not None:
        return _bench_suite(args)
    if args.model is None:
        raise _UsageError("bench needs a MODEL file (or --suite for the benchmark suite)")
    if args.runs < 1 or args.warmup < 0:
        raise _UsageError("--runs must be >= 1 and --warmup >= 0")
    builder = InferenceSession.builder()
    if args.threads:
        builder.intra_op_threads(args.threads)
    session = builder.load(args.model)
    feeds = _feeds(session, args)
    runners = {"onnxkiln": session.run}
    ort = None if args.no_ort else _ort_runner(args, console)
    if ort is not None:
        runners["onnxruntime"] = ort
    for fn in runners.values():
        for _ in range(args.warmup):
            fn(feeds)
    times: dict[str, list[float]] = {k: [] for k in runners}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=args.runs)
        for _ in range(args.runs):  # interleaved, so drift hits both alike
            for name, fn in runners.items():
                start = time.perf_counter()
                fn(feeds)
                times[name].append(time.perf_counter() - start)
            progress.advance(task)
    table = Table("runtime", "runs", "p50 ms", "p90 ms", "p99 ms", "mean ms", "runs/s",
                  title=f"{Path(args.model).name}: latency")
    stats = {name: _latency(t) for name, t in times.items()}
    for name, st in stats.items():
        cells = [f"{st[k]:.3f}" for k in ("p50", "p90", "p99", "mean")]
        table.add_row(name, str(args.runs), *cells, f"{st['rate']:.1f}")
    console.print(table)
    if "onnxruntime" in stats:
        ours, theirs = stats["onnxkiln"], stats["onnxruntime"]
        console.print(f"onnxkiln / onnxruntime: p50 {ours['p50'] / theirs['p50']:.2f}x, "
                      f"p99 {ours['p99'] / theirs['p99']:.2f}x, throughput "
                      f"{ours['rate'] / theirs['rate']:.2f}x")
    return 0


def _bench_suite(args: argparse.Namespace) -> int:
    """`onnxkiln bench --suite ...`: the harness in the checkout's bench/ (python -m bench)."""
    if args.model is not None:
        raise _UsageError("bench --suite builds its own models; drop the MODEL argument")
    suite_args = list(args.suite)
    if args.threads and "--threads" not in suite_args:
        suite_args += ["--threads", str(args.threads)]
    root = Path(__file__).resolve().parents[2]
    if (root / "bench" / "suite.py").is_file():
        sys.path.insert(0, str(root))
    try:
        from bench import _env  # type: ignore[import-not-found]
        from bench.suite import main as suite_main  # type: ignore[import-not-found]
    except ImportError as e:
        raise _UsageError("--suite needs onnxkiln's source checkout (its bench/ folder); "
                          f"run `python -m bench` there ({e})") from e
    # numpy is loaded already: drop the OpenBLAS pins by re-executing `python -m bench`
    _env.unpin(suite_args, keep_env="--keep-env" in suite_args)
    return suite_main(suite_args)


def _ort_runner(args: argparse.Namespace, console: Console):
    if importlib.util.find_spec("onnxruntime") is None:
        console.print("onnxruntime is not installed; skipping the comparison")
        return None
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if args.threads:
        options.intra_op_num_threads = args.threads
    try:
        ort = onnxruntime.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types
        console.print(f"onnxruntime cannot load the model ({type(e).__name__}: {e}); skipping it")
        return None
    return lambda feeds: ort.run(None, feeds)


def _latency(times: list[float]) -> dict[str, float]:
    ms = np.array(times) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"p50": p50, "p90": p90, "p99": p99, "mean": float(ms.mean()),
            "rate": len(ms) / float(np.sum(ms) / 1e3)}


def _cmd_profile(args: argparse.Namespace, console: Console) -> int:
    if args.runs < 1 or args.top < 0:
        raise _UsageError("--runs must be >= 1 and --top >= 0")
    session = InferenceSession.load(args.model)
    feeds = _feeds(session, args)
    session.run(feeds)  # first-run costs are not the profile
    path = Path(args.trace or f"{_safe_name(Path(args.model).stem)}_profile.json")
    ctx = TraceContext.chrome(path)
    session.set_trace_context(ctx)
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("profiling", total=args.runs)
            for _ in range(args.runs):
                session.run(feeds)
                progress.advance(task)
    finally:
        session.set_trace_context(TraceContext.disabled())
        ctx.close()
    profile = summarize(ctx.spans)
    run_ms = profile.run_ns / profile.runs / 1e6
    console.print(f"[bold]{Path(args.model).name}[/]: {profile.runs} traced runs, mean "
                  f"{run_ms:.3f} ms per run; times are per run, self time (an If/Loop/Scan "
                  "node's own time excludes its body's ops)")
    width = None if console.is_terminal else max(console.width, 120)  # files: no folding
    console.print(_op_table("op type", profile.by_op, profile, None), width=width)
    console.print(_op_table("node", profile.by_node, profile, args.top), width=width)
    covered = sum(t.self_ns for t in profile.by_op.values()) / max(profile.run_ns, 1)
    console.print(f"ops cover {covered:.1%} of traced run time (the rest: tracing, dispatch, "
                  "input validation)")
    console.print(f"Chrome trace: {path} ({len(ctx.spans)} events); open it in "
                  "https://ui.perfetto.dev or chrome://tracing")
    return 0


def _op_table(what: str, rows: dict[str, OpTime], profile, top: int | None) -> Table:
    ranked = sorted(rows.items(), key=lambda kv: -kv[1].self_ns)
    title = f"time per {what}" if top is None else f"top {min(top, len(ranked))} nodes"
    columns = [Column(what, overflow="fold")]
    if top is not None:
        columns.append(Column("op type", overflow="fold"))
    table = Table(*columns, "count", "total ms", "% of run", "mean µs", title=title)
    for key, t in ranked[:top]:
        cells = [key] if top is None else [key, t.op_type]
        table.add_row(*cells, f"{t.count / profile.runs:g}",
                      f"{t.self_ns / profile.runs / 1e6:.3f}",
                      f"{t.self_ns / max(profile.run_ns, 1):.1%}",
                      f"{t.self_ns / t.count / 1e3:.1f}")
    return table


def _cmd_info(args: argparse.Namespace, console: Console) -> int:
    model = loader.load_path(args.model)
    graph = model.graph
    console.print(f"[bold]{args.model}[/]  graph '{graph.name}'  ir_version {model.ir_version}  "
                  f"producer {model.producer_name or '?'} {model.producer_version or ''}")
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(model.opset_imports.items()))
    console.print(f"opsets: {opsets}")
    session_io = Table("kind", "name", "type", "shape", title="inputs and outputs")
    inits = set(graph.initializers)
    for kind, values in (("input", graph.inputs), ("output", graph.outputs)):
        for v in values:
            if kind == "input" and v.name in inits:
                continue
            dtype = str(DataType(v.dtype)) if v.dtype is not None else "?"
            shape = "?" if v.shape is None else str(tuple(
                d if isinstance(d, int) else (d.value or "?") for d in v.shape))
            session_io.add_row(kind, v.name, dtype, shape)
    console.print(session_io)
    histogram = collections.Counter(
        f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in graph.all_nodes())
    ops = Table("op", "count", title=f"{sum(histogram.values())} nodes")
    for op, count in histogram.most_common():
        ops.add_row(op, str(count))
    console.print(ops)
    params = sum(int(np.prod(v.shape.numpy())) for v in graph.initializers.values()
                 if v.shape is not None)
    nbytes = sum(v.const_value.nbytes for v in graph.initializers.values()
                 if v.const_value is not None)
    size = os.path.getsize(args.model)
    console.print(f"size: file {_human(size)}, {len(inits)} initializers, {params:,} "
                  f"parameters, {_human(nbytes)} of weights")
    return 0


def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from onnxkiln import zoo

    model, feeds = zoo.default_model()
    session = InferenceSession.from_graph(model)
    console.print(f"[bold]demo:[/] {model.graph.name} ({len(model.graph.node)} nodes), inputs "
                  + ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in feeds.items()))
    outputs, times = _timed(session.run, feeds, max(args.repeat, 1))
    _print_outputs(console, [m.name for m in session.outputs()], outputs)
    _print_times(console, "onnxkiln", times)
    if importlib.util.find_spec("onnxruntime") is None:
        console.print("onnxruntime is not installed; skipping the comparison")
        return 0
    from onnxkiln.testing import ort_session

    ort = ort_session(model, optimize=True)
    theirs, ort_times = _timed(lambda f: ort.run(None, f), feeds, max(args.repeat, 1))
    _print_times(console, "onnxruntime", ort_times)
    diff = max(float(np.max(np.abs(a.astype(np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(outputs, theirs))
    ratio = np.median(times) / np.median(ort_times)
    console.print(f"max |onnxkiln - onnxruntime| = {diff:.3g}; median time ratio "
                  f"onnxkiln/onnxruntime = {ratio:.2f}x")
    return 0


def random_input(meta: IoMeta, dims: dict[str, str], rng: np.random.Generator) -> np.ndarray:
    """A random array for an input; symbolic dims take sizes from `dims` (default 1)."""
    shape = tuple(
        d if isinstance(d, int) else int(dims.get(d, 1)) if isinstance(d, str) else 1
        for d in (meta.shape or ())
    )
    dtype = to_numpy(meta.dtype) if meta.dtype != DataType.UNDEFINED else np.dtype(np.float32)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)
    if dtype.kind == "O":
        return np.array(rng.integers(0, 10, size=shape).astype(str), dtype=object)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _timed(fn, feeds, repeat: int):
    outputs = fn(feeds)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(feeds)
        times.append(time.perf_counter() - start)
    return outputs, times


def _print_outputs(console: Console, names: list[str], outputs: list[np.ndarray]) -> None:
    table = Table("output", "dtype", "shape", "values", title="outputs")
    with np.printoptions(precision=4, threshold=8, edgeitems=3, linewidth=70):
        for name, value in zip(names, outputs):
            value = np.asarray(value)
            table.add_row(name, str(value.dtype), str(tuple(value.shape)), str(value.ravel()))
    console.print(table)


def _print_times(console: Console, who: str, times: list[float]) -> None:
    ms = np.array(times) * 1e3
    console.print(f"{who}: {len(ms)} runs, median {np.median(ms):.3f} ms, "
                  f"min {ms.min():.3f} ms, p90 {np.percentile(ms, 90):.3f} ms")


def _parse_pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise _UsageError(f"{flag} takes NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "output"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


if __name__ == "__main__":
    sys.exit(main())
