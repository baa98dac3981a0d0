"""How long a sleeping intra-op worker takes to join a dispatch on this machine.

    python bench/wake_latency.py [--rounds 30] [--gaps 0,0.002,0.05,0.2]

Dispatches a 2-thread `parallel_for` of 8 memory-bound GEMV chunks (about 1.5 ms of work
on the calling thread alone) inside a run scope (BLAS single-threaded, as in a run), after
an idle gap, and reports when the worker claimed its first chunk, counted from the start
of the dispatch, and how often it never joined. The pool's backoff is off so every
dispatch splits. A development tool: what it measures limits what a second thread can buy
for work of a millisecond or two (the closing numbers of docs/performance.md).
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

from onnxkiln import pool
from onnxkiln.pool import pool_for, run_scope


def measure(gap_s: float, rounds: int) -> tuple[list[float], int]:
    """(first-claim delays in seconds, dispatches the worker never joined)."""
    a = np.random.default_rng(0).random((1, 4096), dtype=np.float32)
    b = np.random.default_rng(1).random((4096, 4096), dtype=np.float32)
    y = np.empty((1, 4096), np.float32)
    chunks = [(i * 512, (i + 1) * 512) for i in range(8)]
    caller = threading.get_ident()
    delays, missed = [], 0
    with run_scope(2):
        p = pool_for(2)
        for _ in range(rounds):
            first: list[float] = []
            start = time.perf_counter()

            def chunk(i: int, first=first, start=start) -> None:
                if threading.get_ident() != caller and not first:
                    first.append(time.perf_counter() - start)
                lo, hi = chunks[i]
                np.matmul(a, b[:, lo:hi], out=y[:, lo:hi])

            p.parallel_for(len(chunks), chunk)
            if first:
                delays.append(first[0])
            else:
                missed += 1
            time.sleep(gap_s)
    return delays, missed


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--gaps", default="0,0.002,0.05,0.2", help="idle seconds before dispatches")
    args = p.parse_args(argv)
    pool.BACKOFF_MIN_S = pool.BACKOFF_MAX_S = 0.0
    for gap in (float(g) for g in args.gaps.split(",")):
        delays, missed = measure(gap, args.rounds)
        us = np.array(delays) * 1e6 if delays else np.array([np.nan])
        print(f"idle {gap * 1e3:6.1f} ms before: worker joined after median "
              f"{np.median(us):6.0f} us, p90 {np.percentile(us, 90):6.0f} us; never joined "
              f"{missed}/{args.rounds}")


if __name__ == "__main__":
    main()
