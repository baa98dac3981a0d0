"""Concurrency stress: N threads run one session for M iterations; every result must equal
the single-thread result bit for bit.

    python scripts/stress.py                             # 8 threads x 500 iterations, all models
    python scripts/stress.py --threads 16 --iterations 2000 --models bert resnet
    python scripts/stress.py --minutes 30                # repeat rounds until the time is up

Models and feeds come from tests/test_concurrency.py (mlp, resnet and bert with a
different shape per thread, and a Loop/If model); each round runs the plain path and the
cancellable (hooked) path. Exits 1 on any mismatch or error.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from onnxkiln import InferenceSession  # noqa: E402
from test_concurrency import MODELS, RUNS, feeds_for, hammer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--models", nargs="+", default=sorted(MODELS), choices=sorted(MODELS))
    parser.add_argument("--variants", nargs="+", default=sorted(RUNS), choices=sorted(RUNS))
    parser.add_argument("--minutes", type=float, default=0.0,
                        help="repeat rounds until this much time has passed")
    args = parser.parse_args()
    deadline = time.time() + args.minutes * 60
    total_runs = total_mismatches = rounds = 0
    started = time.perf_counter()
    while True:
        for name in args.models:
            model = MODELS[name]()
            session = InferenceSession.builder().device("cpu").from_graph(model)
            feeds = [feeds_for(name, model, k) for k in range(args.threads)]
            expected = [session.run(f) for f in feeds]
            for variant in args.variants:
                t0 = time.perf_counter()
                done, mismatches = hammer(session, feeds, expected, args.iterations,
                                          RUNS[variant])
                seconds = time.perf_counter() - t0
                total_runs += done
                total_mismatches += len(mismatches)
                print(f"{name:7s} {variant:12s} {args.threads} threads x {args.iterations} "
                      f"iterations: {done} runs in {seconds:.1f}s ({done / seconds:.0f}/s), "
                      f"{len(mismatches)} mismatches", flush=True)
                for m in mismatches[:5]:
                    print("   ", m)
        rounds += 1
        if time.time() >= deadline:
            break
    elapsed = time.perf_counter() - started
    print(f"total: {rounds} round(s), {total_runs} runs in {elapsed:.0f}s on "
          f"{threading.active_count()} live thread(s) after join, {total_mismatches} mismatches")
    return 1 if total_mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
