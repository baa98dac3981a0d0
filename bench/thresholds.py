"""Where splitting work across the intra-op pool starts to pay, per kernel family.

    python bench/thresholds.py [--threads 2] [--repeat 200]

For each family (GEMM over output columns, row kernels, depthwise conv over channel
blocks, batched products over the batch) and a ladder of sizes, times the kernel whole
on the calling thread and split across a pool of --threads, interleaved, and prints the
median of each and their ratio; the smallest size from which the split wins on every
larger size is the family's threshold (the constants SPLIT_MIN_FLOPS, ROWS_SPLIT_MIN and
DW_SPLIT_MIN in onnxkiln/providers/cpu/_gemm.py, _row_kernels.py, _conv_special.py).
Run it on a quiet machine: a split measured under load says nothing. The pool's backoff
(it runs calls inline after dispatches its workers did not keep up with) is off here, so
that each split is measured as a split.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from onnxkiln.pool import run_enter, run_leave
from onnxkiln.providers.cpu import _gemm, _numba


def _median_pair(whole: Callable[[], object], split: Callable[[], object], repeat: int,
                 threads: int) -> tuple[float, float]:
    """Median seconds of `whole` (one thread) and `split` (a pool of `threads`), interleaved."""
    a, b = [], []
    for _ in range(repeat):
        previous = run_enter(1)
        try:
            t = time.perf_counter()
            whole()
            a.append(time.perf_counter() - t)
        finally:
            run_leave(previous)
        previous = run_enter(threads)
        try:
            t = time.perf_counter()
            split()
            b.append(time.perf_counter() - t)
        finally:
            run_leave(previous)
    return float(np.median(a)), float(np.median(b))


def gemm_cases(threads: int):
    """(label, work, whole, split): square-ish products from 0.1 to 50 MFLOP."""
    rng = np.random.default_rng(0)
    for m, k, n in [(16, 64, 128), (32, 128, 128), (64, 128, 256), (64, 256, 384),
                    (128, 256, 512), (128, 512, 768), (256, 768, 768), (512, 768, 768)]:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        split = _gemm.plan_split(m, k, n, threads) if 2 * m * k * n >= 1 else None
        if split is None:  # below the threshold plan_split declines: cut as it would
            split = _gemm.Split(1, _gemm.split_ranges(n, threads, _gemm.COL_ALIGN))
        yield (f"gemm {m}x{k}x{n}", 2 * m * k * n, lambda a=a, b=b: np.matmul(a, b),
               lambda a=a, b=b, s=split: _gemm.matmul_split(a, b, s))


def row_cases(threads: int):
    """Softmax rows through the numba kernel, 4K to 4M elements."""
    from onnxkiln.providers.cpu import _row_kernels

    fn = _numba.load("softmax_rows", np.float32)
    if fn is None:
        return
    rng = np.random.default_rng(1)
    for rows, n in [(16, 256), (64, 256), (128, 512), (256, 512), (512, 1024), (1024, 2048),
                    (4096, 1024)]:
        x = rng.standard_normal((rows, n), dtype=np.float32)
        y = np.empty_like(x)
        ranges = _gemm.split_ranges(rows, 2 * threads, 1)
        whole = _row_kernels.softmax_rows(fn, rows, n, False)  # no split at 1 thread

        def split(x=x, y=y, ranges=ranges):
            from onnxkiln.pool import parallel_for

            parallel_for(len(ranges), lambda i: fn(x[ranges[i][0]:ranges[i][1]],
                                                   y[ranges[i][0]:ranges[i][1]], 0))

        yield f"softmax {rows}x{n}", rows * n, lambda x=x, w=whole: w(x), split


_PARAMS = (1, 1, 1, 1, 1, 1)  # stride, dilation 1; pad 1 (a 3x3 "same" conv)


def depthwise_cases(threads: int):
    """3x3 depthwise convs through the channels-last / planes kernels."""
    from onnxkiln.pool import parallel_for

    rng = np.random.default_rng(2)
    for c, h in [(32, 7), (64, 14), (128, 14), (144, 28), (96, 56), (32, 112)]:
        kind = "cl" if h * h <= 256 else "planes"
        fn = _numba.load(f"depthwise_{kind}", np.float32)
        if fn is None:
            return
        x = rng.standard_normal((1, c, h, h), dtype=np.float32)
        taps = rng.standard_normal((c, 3, 3), dtype=np.float32)
        w = np.ascontiguousarray(taps.transpose(1, 2, 0) if kind == "cl" else taps)
        bias = np.zeros(c, np.float32)
        out = np.empty_like(x)
        ranges = _gemm.split_ranges(c, min(2 * threads, max(1, c // 16)), 16)

        def split(x=x, w=w, bias=bias, out=out, ranges=ranges, fn=fn):
            parallel_for(len(ranges), lambda i: fn(x, w, bias, _PARAMS, ranges[i][0],
                                                   ranges[i][1], out))

        yield (f"depthwise {kind} {c}x{h}x{h}", c * h * h * 9,
               lambda x=x, w=w, bias=bias, out=out, fn=fn, c=c: fn(x, w, bias, _PARAMS, 0, c,
                                                                   out),
               split)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=200)
    args = p.parse_args(argv)
    from onnxkiln import pool

    pool.BACKOFF_MIN_S = pool.BACKOFF_MAX_S = 0.0
    _gemm.SPLIT_MIN_FLOPS = 0  # plan_split's cut for every size
    for family in (gemm_cases, row_cases, depthwise_cases):
        print(f"\n{family.__name__.replace('_cases', '')}: median us whole / split "
              f"({args.threads} threads)")
        for label, work, whole, split in family(args.threads):
            whole(), split()
            a, b = _median_pair(whole, split, args.repeat, args.threads)
            print(f"  {label:30s} work {work:>11,d}  {a * 1e6:9.1f} / {b * 1e6:9.1f}  "
                  f"split/whole {b / a:5.2f}")


if __name__ == "__main__":
    main()
