"""Latency of the zoo models per optimization level, beside onnxruntime, in one process.

    python bench/optimize.py                      # realistic sizes, every level
    python bench/optimize.py --only bert --levels disabled,all --repeat 20
    python bench/optimize.py --small               # the small test configs (quick)

Each level gets its own session over an `optimize()`d copy of the model (built through
InferenceSession's constructor, so the run path is the real one even before the session
calls the optimizer itself). Runs are interleaved with onnxruntime's (graph optimizations
on), in a shuffled order each repetition, and the ratio is ours / theirs. Like
bench/run.py, the script re-executes itself without the OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE
pins unless --keep-env is given.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/optimize.py`
from bench._timing import interleave_runs

PINNED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
SIZES = {
    "mlp": {"batch": 1},
    "resnet": {"batch": 1},
    "bert": {"batch": 1, "seq": 128},
    "gpt2": {"batch": 1, "seq": 1, "past_seq": 128},
}
LEVELS = ("disabled", "basic", "extended", "all")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", choices=sorted(SIZES))
    parser.add_argument("--levels", default=",".join(LEVELS))
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--stat", choices=("median", "min"), default="median",
                        help="min resists other processes' load on a shared machine")
    parser.add_argument("--keep-env", action="store_true")
    args = parser.parse_args()
    if not args.keep_env and any(k in os.environ for k in PINNED):
        env = {k: v for k, v in os.environ.items() if k not in PINNED}
        os.execve(sys.executable, [sys.executable, *sys.argv, "--keep-env"], env)

    import numpy as np

    from onnxkiln import zoo
    from onnxkiln.testing import ort_session

    _register_kernels()

    levels = [lv for lv in args.levels.split(",") if lv]
    stat = np.median if args.stat == "median" else np.min
    print(f"{'model':<8} {'level':<9} {'nodes':>6} {'opt s':>6} {'ms':>9} {'ort ms':>8} "
          f"{'ratio':>6} {'max|diff|':>10}")
    for name in args.only or list(SIZES):
        generator, small, large = zoo.MODELS[name]
        proto = generator(small if args.small else large)
        feeds = zoo.random_inputs(proto, seed=0, **({} if args.small else SIZES[name]))
        ort = ort_session(proto, optimize=True)
        runs = {"ort": lambda f, s=ort: s.run(None, f)}
        info = {}
        for level in levels:
            session, nodes, seconds = _session(proto, level)
            runs[level] = lambda f, s=session: s.run(f)
            info[level] = (nodes, seconds)
        times = interleave_runs(runs, feeds, args.repeat)
        ref = runs["ort"](feeds)
        ort_ms = float(stat(times["ort"])) * 1e3
        for level in levels:
            out = runs[level](feeds)
            diff = max(float(np.max(np.abs(a - b))) for a, b in zip(out, ref) if a.size)
            ms = float(stat(times[level])) * 1e3
            nodes, seconds = info[level]
            print(f"{name:<8} {level:<9} {nodes:>6} {seconds:>6.2f} {ms:>9.3f} {ort_ms:>8.3f} "
                  f"{ms / ort_ms:>5.2f}x {diff:>10.2e}", flush=True)
    return 0


def _register_kernels():
    """Contrib and fused kernel modules the providers package may not import yet."""
    import contextlib
    import importlib

    for mod in ("contrib_transformer", "contrib_fused", "contrib_attention", "fused"):
        with contextlib.suppress(ImportError):
            importlib.import_module(f"onnxkiln.providers.cpu.{mod}")


def _session(proto, level):
    from onnxkiln import loader
    from onnxkiln.optimizer import optimize
    from onnxkiln.partition import select_providers
    from onnxkiln.session import InferenceSession, SessionBuilder

    model = loader.from_graph(proto)
    start = time.perf_counter()
    optimize(model, level)
    seconds = time.perf_counter() - start
    session = InferenceSession(model, select_providers("cpu", None),
                               SessionBuilder().optimization(level))
    return session, len(model.graph), seconds


if __name__ == "__main__":
    sys.exit(main())
