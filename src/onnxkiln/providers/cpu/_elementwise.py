"""Large elementwise ufunc steps split across the intra-op pool (the `specialize` of the
kernels that are bare numpy ufuncs: Add, Mul, Exp, Tanh, Equal, ...).

The output is cut along its first axis long enough for every thread to get chunks; each
input is cut the same way where it has that axis at full size and taken whole where it
broadcasts (size 1, or fewer dims). Each chunk is one ufunc call writing its slice of the
output, so the result is the same as one call, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxkiln.pool import active_threads, parallel_for
from onnxkiln.providers.cpu._gemm import split_ranges

__all__ = ["SPLIT_MIN_ELEMENTS", "ufunc_specializer"]

SPLIT_MIN_ELEMENTS = 1 << 20
"""Outputs smaller than this stay on the calling thread: a split pays only from about 1 ms
of work on the 2-core development VM (bench/thresholds.py; one pass over 1M float32
elements takes 0.5-2 ms)."""


def ufunc_specializer(ufunc: np.ufunc, dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
    """The split call of `ufunc` for these input shapes, or None (the ufunc itself)."""
    threads = active_threads()
    if (threads < 2 or not isinstance(ufunc, np.ufunc) or len(shapes) != ufunc.nin
            or any(s is None for s in shapes)):
        return None
    out_shape = np.broadcast_shapes(*shapes)
    if math.prod(out_shape) < SPLIT_MIN_ELEMENTS or any(d is None for d in dtypes):
        return None
    axis = next((a for a, d in enumerate(out_shape) if d >= 2 * threads), None)
    if axis is None:
        return None
    dtype = ufunc(*(np.empty(0, d) for d in dtypes)).dtype
    nd = len(out_shape)
    cut = []  # per input: the axis to slice, or None (broadcast: taken whole)
    for s in shapes:
        own = axis - (nd - len(s))
        cut.append(own if own >= 0 and s[own] == out_shape[axis] else None)
    ranges = split_ranges(out_shape[axis], 2 * threads, 1)

    def run(*xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        fits = out is not None and out.shape == out_shape and out.dtype == dtype
        y = out if fits else np.empty(out_shape, dtype)

        def chunk(i: int) -> None:
            lo, hi = ranges[i]
            parts = [x if a is None else x[(slice(None),) * a + (slice(lo, hi),)]
                     for x, a in zip(xs, cut)]
            ufunc(*parts, out=y[(slice(None),) * axis + (slice(lo, hi),)])

        parallel_for(len(ranges), chunk)
        return y

    run.variant = f"{ufunc.__name__}.split"
    return run
