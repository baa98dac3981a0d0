"""Time one exported model on onnxkiln and onnxruntime: sessions, feeds, interleaved rounds,
output comparison. The CLI (bench/exported/cli.py) loops over models and thread counts.

Both runtimes load the same file from the cache (external data beside it); onnxkiln with
its default optimization and `intra_op_threads(n)`, onnxruntime with its default graph
optimizations, `intra_op_num_threads = n` and `inter_op_num_threads = 1`. `threads=None`
means each runtime's own default (the contention runs use it).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import _env
from bench._timing import interleave

RUNTIMES = ("onnxkiln", "onnxruntime")
DIFF_TOL = 1e-3
"""Largest |onnxkiln - onnxruntime| accepted, relative to max(1, the largest |output|)."""


@dataclass
class Runner:
    """One runtime's session on one model at one thread count; `run(feeds)` -> outputs."""

    runtime: str
    threads: int | None
    run: Callable[[dict[str, np.ndarray]], list[Any]]
    create_s: float
    nodes: int | None = None  # onnxkiln: nodes after its optimizer


def open_runner(runtime: str, path: Path, threads: int | None) -> Runner:
    """A session on the model file at `path` (threads None: the runtime's default)."""
    start = time.perf_counter()
    if runtime == "onnxkiln":
        from onnxkiln import InferenceSession

        builder = InferenceSession.builder()
        if threads is not None:
            builder = builder.intra_op_threads(threads)
        session = builder.load(str(path))
        seconds = time.perf_counter() - start
        tensors = all(m.kind == "tensor" for m in session.outputs())
        run = session.run if tensors else session.run_outputs  # ZipMap: a list of maps
        return Runner(runtime, threads, run, seconds, len(list(session.graph())))
    if runtime == "onnxruntime":
        import onnxruntime

        opts = onnxruntime.SessionOptions()  # default graph optimizations (ORT_ENABLE_ALL)
        if threads is not None:
            opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        ort = onnxruntime.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        seconds = time.perf_counter() - start
        return Runner(runtime, threads, lambda feeds: ort.run(None, feeds), seconds)
    raise ValueError(f"unknown runtime {runtime!r}")


def plain(value: Any) -> np.ndarray:
    """An output as an array: a SessionOutput's value, a ZipMap list of {class: p} maps as
    rows of probabilities in class order, a map as its values in key order."""
    value = getattr(value, "value", value)
    if isinstance(value, dict):
        return np.asarray([value[k] for k in sorted(value)])
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return np.asarray([[row[k] for k in sorted(row)] for row in value])
    return np.asarray(value)


def compare(kiln: list[Any], ort: list[Any]) -> dict[str, Any]:
    """Largest |difference| over all outputs (inf where counts or shapes differ), and
    whether it is within DIFF_TOL of onnxruntime's scale."""
    a, b = [plain(v) for v in kiln], [plain(v) for v in ort]
    result: dict[str, Any] = {"max_abs_diff": 0.0, "ort_max_abs": 0.0, "mismatch": None}
    if len(a) != len(b):
        result.update(max_abs_diff=math.inf, mismatch=f"{len(a)} outputs, expected {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape:
            result["max_abs_diff"] = math.inf
            result["mismatch"] = f"output {i}: shape {x.shape}, onnxruntime {y.shape}"
            continue
        if y.size:
            result["ort_max_abs"] = max(result["ort_max_abs"],
                                        float(np.nanmax(np.abs(y.astype(np.float64)),
                                                        initial=0.0)))
        if x.size:
            result["max_abs_diff"] = max(result["max_abs_diff"], _diff(x, y))
    result["ok"] = result["mismatch"] is None and (
        result["max_abs_diff"] <= DIFF_TOL * max(1.0, result["ort_max_abs"]))
    return result


def _diff(x: np.ndarray, y: np.ndarray) -> float:
    """max |x - y|, NaNs equal where both have them (inf where only one does)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    nx, ny = np.isnan(x), np.isnan(y)
    if not np.array_equal(nx, ny):
        return math.inf
    both = ~nx
    return float(np.max(np.abs(x[both] - y[both]), initial=0.0))


def rounds_for(estimate_s: float, repeat: int, budget_s: float, least: int) -> int:
    """Timed rounds: as many as fit in `budget_s`, at most `repeat`, at least `least`, or
    2 when one round alone takes over twice the budget (the slowest models, where the
    spread matters little next to the ratio)."""
    if estimate_s <= 0:
        return repeat
    if estimate_s > 2 * budget_s:
        least = min(least, 2)
    return max(min(least, repeat), min(repeat, int(budget_s / estimate_s)))


def time_runners(runners: dict[str, Runner], feeds: dict[str, np.ndarray], repeat: int,
                 budget_s: float, gap_s: float, rng: random.Random, least: int = 3
                 ) -> dict[str, Any]:
    """Medians over interleaved rounds (a warm-up run each first, which sizes the rounds),
    the per-round ratio, and the load other processes put on the machine meanwhile."""
    estimate = 0.0
    for runner in runners.values():
        start = time.perf_counter()
        runner.run(feeds)
        estimate += time.perf_counter() - start + gap_s
    n = rounds_for(estimate, repeat, budget_s, least)
    load = _env.OtherLoad()
    calls = {k: (lambda r=r: r.run(feeds)) for k, r in runners.items()}
    times = interleave(calls, n, {}, rng, gap_s)
    out: dict[str, Any] = {"rounds": n, "other_load_cores": load.cores(),
                           "ms": {k: float(np.median(t)) * 1e3 for k, t in times.items()},
                           "min_ms": {k: float(np.min(t)) * 1e3 for k, t in times.items()}}
    if set(times) == set(RUNTIMES):
        out["kiln_vs_ort"] = out["ms"]["onnxkiln"] / out["ms"]["onnxruntime"]
        out["kiln_vs_ort_paired"] = float(np.median(np.divide(times["onnxkiln"],
                                                              times["onnxruntime"])))
    return out


def first_outputs(runners: dict[str, Runner], feeds: dict[str, np.ndarray],
                  errors: dict[str, str]) -> tuple[dict[str, list[Any]], dict[str, float]]:
    """Each runner's first run (its outputs and ms); a runner that fails is dropped from
    `runners` and its error recorded."""
    outputs, first_ms = {}, {}
    for name in list(runners):
        try:
            start = time.perf_counter()
            outputs[name] = runners[name].run(feeds)
            first_ms[name] = (time.perf_counter() - start) * 1e3
        except Exception as e:  # a runtime that cannot run the model is a result
            errors[name] = describe(e, "run")
            del runners[name]
    return outputs, first_ms


def open_runners(path: Path, threads: int | None, errors: dict[str, str]
                 ) -> dict[str, Runner]:
    """Both runtimes' sessions; one that fails to load is left out, its error recorded."""
    runners = {}
    for runtime in RUNTIMES:
        try:
            runners[runtime] = open_runner(runtime, path, threads)
        except Exception as e:  # e.g. an op onnxkiln lacks: reported, not a crash
            errors[runtime] = describe(e, "load")
    return runners


def describe(e: BaseException, stage: str) -> str:
    text = f"{type(e).__name__}: {e}".strip().replace("\n", " | ")
    return f"{stage}: {text[:600]}"
