"""Matrix products split across onnxkiln's intra-op pool.

BLAS runs single-threaded inside a run (onnxkiln.threads); a product large enough to pay
for a dispatch is split into chunks of output columns (or of rows when the output is
narrow), each one BLAS call, claimed by the pool's threads. A column chunk computes each
output element exactly as the whole product does, so column splits are bit-identical to
one call; row chunks keep at least ROW_ALIGN rows (OpenBLAS takes another path for a
single row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxkiln.pool import parallel_for

__all__ = ["SPLIT_MIN_FLOPS", "Split", "matmul_split", "plan_split", "split_ranges"]

SPLIT_MIN_FLOPS = 2_000_000
"""Products below this many flops (2*M*K*N) run whole: a dispatch to the pool costs a few
µs and the chunks must each be worth far more."""
COL_ALIGN = 64  # column chunk widths are multiples of this (whole BLAS panels)
ROW_ALIGN = 16
MIN_CHUNK_FLOPS = 500_000


@dataclass(frozen=True, slots=True)
class Split:
    """How one (M, K) @ (K, N) product is cut: `axis` 1 (output columns) or 0 (rows), and
    the [start, stop) ranges along it."""

    axis: int
    ranges: tuple[tuple[int, int], ...]


def split_ranges(size: int, parts: int, align: int) -> tuple[tuple[int, int], ...]:
    """At most `parts` ranges covering [0, size), each a multiple of `align` but the last."""
    step = -(-size // parts)
    step = -(-step // align) * align
    return tuple((lo, min(size, lo + step)) for lo in range(0, size, step))


def plan_split(m: int, k: int, n: int, threads: int) -> Split | None:
    """The split of an (m, k) @ (k, n) product for `threads` threads, or None (whole)."""
    flops = 2 * m * k * n
    if threads < 2 or flops < SPLIT_MIN_FLOPS:
        return None
    parts = min(2 * threads, max(threads, flops // MIN_CHUNK_FLOPS))
    if n >= COL_ALIGN * threads:
        ranges = split_ranges(n, min(parts, -(-n // COL_ALIGN)), COL_ALIGN)
        return Split(1, ranges) if len(ranges) > 1 else None
    if m >= ROW_ALIGN * threads:
        ranges = split_ranges(m, min(parts, m // ROW_ALIGN), ROW_ALIGN)
        return Split(0, ranges) if len(ranges) > 1 else None
    return None


def matmul_split(a: np.ndarray, b: np.ndarray, split: Split | None,
                 out: np.ndarray | None = None) -> np.ndarray:
    """a @ b for 2-D a and b, cut as `split` says (None: one BLAS call)."""
    if split is None:
        return np.matmul(a, b, out=out)
    y = np.empty((a.shape[0], b.shape[1]), np.result_type(a, b)) if out is None else out
    ranges = split.ranges
    if split.axis == 1:
        def chunk(i: int) -> None:
            lo, hi = ranges[i]
            np.matmul(a, b[:, lo:hi], out=y[:, lo:hi])
    else:
        def chunk(i: int) -> None:
            lo, hi = ranges[i]
            np.matmul(a[lo:hi], b, out=y[lo:hi])
    parallel_for(len(ranges), chunk)
    return y
