"""`onnxkiln run | info | demo`: the command line."""

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
from rich.table import Table

from onnxkiln import loader
from onnxkiln.dtypes import DataType, to_numpy
from onnxkiln.errors import SessionError
from onnxkiln.session import InferenceSession
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnxkiln", description="ONNX inference runtime.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a model on given or random inputs")
    run.add_argument("model")
    run.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy|random")
    run.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE",
                     help="size for a symbolic dim of random inputs (default 1)")
    run.add_argument("--repeat", type=int, default=1)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--save", metavar="DIR", help="write each output to DIR/<name>.npy")
    run.set_defaults(func=_cmd_run)
    info = sub.add_parser("info", help="inputs, outputs, opsets, op histogram and size")
    info.add_argument("model")
    info.set_defaults(func=_cmd_info)
    demo = sub.add_parser("demo", help="run the built-in demo model, and onnxruntime if present")
    demo.add_argument("--repeat", type=int, default=20)
    demo.set_defaults(func=_cmd_demo)
    return parser


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    if args.repeat < 1:
        console.print("error: --repeat must be >= 1")
        return 2
    session = InferenceSession.load(args.model)
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
        console.print(f"error: unknown input(s) {sorted(sources)}; the model's inputs are {names}")
        return 2
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
            raise SystemExit(f"onnxkiln: {flag} takes NAME=VALUE, got {item!r}")
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
