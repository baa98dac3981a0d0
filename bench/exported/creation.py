"""Session creation times: in a fresh process (import + create, then the first run) and
warm (another session of the same model in a process that already has one).

    python -m bench.exported.creation onnxkiln MODEL.onnx --manifest DIR --model NAME
(the harness runs this per runtime; it prints one JSON line).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._env import ROOT
from bench.exported import harness, manifest


def fresh(runtime: str, cache: Path, entry: dict[str, Any], dims: dict[str, int],
          threads: int, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run the child below in a new interpreter; its timings (or an error), plus the wall
    time of the whole process (interpreter start and numpy included)."""
    cmd = [sys.executable, "-m", "bench.exported.creation", runtime,
           str(manifest.model_path(cache, entry)), "--dims", json.dumps(dims),
           "--manifest", str(cache), "--model", entry["name"], "--threads", str(threads)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"more than {timeout_s:g} s"}
    wall = time.perf_counter() - start
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    return {**result, "process_s": wall}


def warm(path: Path, feeds: dict[str, np.ndarray], threads: int, repeat: int, gap_s: float,
         rng: random.Random, budget_s: float = 20.0) -> dict[str, Any]:
    """Median seconds to create another session of the model (both runtimes, interleaved,
    `repeat` each, fewer once `budget_s` is spent) and of its first run."""
    create: dict[str, list[float]] = {r: [] for r in harness.RUNTIMES}
    first: dict[str, list[float]] = {r: [] for r in harness.RUNTIMES}
    deadline = time.perf_counter() + budget_s
    for _ in range(repeat):
        if create["onnxkiln"] and time.perf_counter() > deadline:
            break
        order = list(harness.RUNTIMES)
        rng.shuffle(order)
        for runtime in order:
            gc.collect()
            time.sleep(gap_s)
            runner = harness.open_runner(runtime, path, threads)
            create[runtime].append(runner.create_s)
            start = time.perf_counter()
            runner.run(feeds)
            first[runtime].append(time.perf_counter() - start)
            del runner
    return {r: {"create_s": float(np.median(create[r])),
                "first_run_s": float(np.median(first[r])), "all_create_s": create[r]}
            for r in harness.RUNTIMES}


def measure(cache: Path, entry: dict[str, Any], dims: dict[str, int], feeds: dict, threads: int,
            repeat: int, gap_s: float, rng: random.Random, budget_s: float = 20.0
            ) -> dict[str, Any]:
    """Fresh-process and warm creation for both runtimes; errors recorded, not raised."""
    out: dict[str, Any] = {"threads": threads, "dims": dims, "fresh": {}, "warm_repeat": repeat}
    for runtime in harness.RUNTIMES:
        out["fresh"][runtime] = fresh(runtime, cache, entry, dims, threads)
    try:
        out["warm"] = warm(manifest.model_path(cache, entry), feeds, threads, repeat, gap_s, rng,
                           budget_s)
    except Exception as e:  # a runtime that cannot load it: the timed runs say so too
        out["warm"] = {"error": harness.describe(e, "warm creation")}
    return out


def _child(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.exported.creation")
    p.add_argument("runtime", choices=harness.RUNTIMES)
    p.add_argument("path", type=Path)
    p.add_argument("--manifest", type=Path, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--dims", required=True, help="JSON: the run's dims")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    entry = next(e for e in manifest.load(args.manifest)["models"] if e["name"] == args.model)
    feeds = manifest.make_feeds(entry, json.loads(args.dims))
    start = time.perf_counter()
    __import__(args.runtime)  # its import is part of what a fresh process pays
    imported = time.perf_counter()
    runner = harness.open_runner(args.runtime, args.path, args.threads)
    created = time.perf_counter()
    runner.run(feeds)
    done = time.perf_counter()
    print(json.dumps({"import_s": imported - start, "create_s": created - imported,
                      "import_create_s": created - start, "first_run_s": done - created}))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
