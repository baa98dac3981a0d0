"""Matrix products split across onnxkiln's intra-op pool.

BLAS runs single-threaded inside a run (onnxkiln.threads); a product large enough to pay
for a dispatch is split into chunks of output columns (or of rows when the output is
narrow), each one BLAS call, claimed by the pool's threads. A column chunk computes each
output element exactly as the whole product does, so column splits are bit-identical to
one call; row chunks keep at least ROW_ALIGN rows (OpenBLAS takes another path for a
single row).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnxkiln.pool import active_threads, parallel_for
from onnxkiln.providers.cpu import _numba

__all__ = ["SMALL_M_MAX", "SPLIT_MIN_FLOPS", "SPLIT_MIN_S", "Split", "constant_product",
           "few_rows_product", "matmul_split", "plan_split", "split_ranges", "timed_split"]

SPLIT_MIN_FLOPS = 150_000_000
"""Products of operands only seen at run time below this many flops (2*M*K*N) run whole.
Measured with bench/thresholds.py on the 2-core development VM, quiet: two threads
multiplying at once each run ~15% slower than alone and a dispatch costs 30-70 us more, so
a split lost up to 100 MFLOP (128x512x768: 1.07x the whole) and won from 300 MFLOP
(0.60x)."""
SPLIT_MIN_S = 0.8e-3
"""Products against a constant B in a specialised plan are split when their second whole
call took this long: few-row products are bound by reading B, not by FLOPs (a GPT-2
decode step's (1, 768) @ (768, 3072) moves 9 MB for 5 MFLOP), so their cost is timed, not
estimated. Splits pay from about 1 ms of work (bench/thresholds.py)."""
COL_ALIGN = 64  # column chunk widths are multiples of this (whole BLAS panels)
THIN_CHUNKS = 4  # column chunks per thread of products with few rows
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


def plan_split(m: int, k: int, n: int, threads: int,
               min_flops: int | None = None) -> Split | None:
    """The split of an (m, k) @ (k, n) product for `threads` threads, or None (whole, also
    below `min_flops`, default SPLIT_MIN_FLOPS).

    One chunk per thread: each chunk repacks the operand it shares (A for a column split,
    B for a row split), so more chunks cost more packing. The longer output side is cut,
    keeping chunks at least COL_ALIGN columns or ROW_ALIGN rows wide (BLAS is slow on
    thinner slices)."""
    least = SPLIT_MIN_FLOPS if min_flops is None else min_flops
    if threads < 2 or 2 * m * k * n < least:
        return None
    cols_ok, rows_ok = n >= COL_ALIGN * threads, m >= ROW_ALIGN * threads
    if cols_ok and (n >= m or not rows_ok):
        return Split(1, split_ranges(n, threads, COL_ALIGN))
    if rows_ok:
        return Split(0, split_ranges(m, threads, ROW_ALIGN))
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


SMALL_M_MAX = 16
"""Products of 2..SMALL_M_MAX rows against a constant B choose their implementation by
timing: OpenBLAS packs B on every call and, given B transposed, is up to 10x slower than
with B as (K, N) (measured: (4, 128) @ (128, 50257) 19 ms vs 2 ms); the numba row kernels
(_numba_gemv) beat it on long rows ((4, 768) @ (768, 768): 111 vs 216 us)."""
SMALL_M_MIN_ELEMENTS = 1 << 14  # B smaller than this: BLAS as given
LAYOUT_COPY_MAX_BYTES = 64 << 20  # largest B copied into another layout when that wins
LAYOUT_COPY_MIN_GAIN = 1.3  # ... by at least this factor
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _gemv_signature(dt: np.dtype) -> tuple:
    from numba import types

    f = types.float32 if dt == _F32 else types.float64
    i64 = types.int64
    return (types.Array(f, 2, "C", readonly=True), types.Array(f, 2, "C", readonly=True),
            i64, i64, i64, f, types.Array(f, 2, "C"))


def _axpy_signature(dt: np.dtype) -> tuple:
    from numba import types

    f = types.float32 if dt == _F32 else types.float64
    i64 = types.int64
    return (types.Array(f, 2, "C", readonly=True), types.Array(f, 2, "C", readonly=True),
            i64, i64, f, types.Array(f, 2, "C"))


_FAST = {"reassoc", "contract", "nsz", "arcp"}
for _rows in (1, 2, 4, 8):
    _numba.register(f"gemv_rows{_rows}", "onnxkiln.providers.cpu._numba_gemv", _gemv_signature,
                    (_F32, _F64), _FAST)
_numba.register("axpy_rows", "onnxkiln.providers.cpu._numba_gemv", _axpy_signature,
                (_F32, _F64), _FAST)


Product = Callable[[np.ndarray], np.ndarray]


def timed_split(whole: Product, split: Product | None) -> Product:
    """call(a): `whole` for the first two calls, the second timed; from then on `split` if
    that call took SPLIT_MIN_S or more, else `whole`. Column splits give the same bits as
    one call on most BLAS builds, not on all: OpenBLAS 0.3.31 (DYNAMIC_ARCH) on an AMD EPYC
    rounds some chunks' sums differently, so there the choice moves results by rounding."""
    if split is None or active_threads() < 2:
        return whole
    if SPLIT_MIN_S <= 0:
        return split
    calls = 0
    chosen: Product | None = None

    def call(a: np.ndarray) -> np.ndarray:
        nonlocal calls, chosen
        if chosen is not None:
            return chosen(a)
        calls += 1
        start = time.perf_counter()
        y = whole(a)
        if calls == 2:
            chosen = split if time.perf_counter() - start >= SPLIT_MIN_S else whole
        return y

    return call


def constant_product(m: int, k: int, b: np.ndarray) -> tuple[Product, str]:
    """(call, kind): call(a) -> a @ b for a of shape (m, k) and a constant 2-D b, kind
    "few_rows" (few_rows_product), "blas" (one BLAS call) or "blas_split" (one BLAS call,
    split across the pool by timed_split once it shows itself slow enough)."""
    rows = few_rows_product(m, b)
    if rows is not None:
        return rows, "few_rows"
    threads = active_threads()
    split = plan_split(m, k, b.shape[1], threads, min_flops=0)
    if split is not None and split.axis == 1 and m < ROW_ALIGN * threads:
        # thin A: chunks repack little, and more of them let a worker that wakes late
        # (50-120 us, up to 1 ms on a VM) still take a share
        split = Split(1, split_ranges(b.shape[1], THIN_CHUNKS * threads, COL_ALIGN))

    def whole(a2: np.ndarray) -> np.ndarray:
        return np.matmul(a2, b)

    if split is None:
        return whole, "blas"
    return timed_split(whole, lambda a2: matmul_split(a2, b, split)), "blas_split"


def _columns_split(fn: Callable, m: int, n: int, k: int, dt: np.dtype, parts: int = 1
                   ) -> Callable[[np.ndarray], np.ndarray]:
    """call(a) running chunk(a, c, lo, hi) over output columns, in `parts` chunks claimed
    across the pool."""
    ranges = split_ranges(n, parts, COL_ALIGN)

    def call(a: np.ndarray) -> np.ndarray:
        a = np.ascontiguousarray(a)
        c = np.empty((m, n), dt)
        if len(ranges) == 1:
            fn(a, c, 0, n)
        else:
            parallel_for(len(ranges), lambda i: fn(a, c, *ranges[i]))
        return c

    return call


def _rows_kernel(m: int, bt: np.ndarray, parts: int) -> Product | None:
    """a @ bt.T through the gemv_rows kernels (rows in groups of 8, 4, 2, 1), in `parts`
    column chunks."""
    handles = {r: _numba.lazy(f"gemv_rows{r}", bt.dtype) for r in (8, 4, 2, 1)}
    if any(h is None or not h.ready() for h in handles.values()):
        return None
    groups, r0 = [], 0
    for r in (8, 4, 2, 1):
        while m - r0 >= r:
            groups.append((handles[r].fn, r0))
            r0 += r
    zero = bt.dtype.type(0)

    def chunk(a: np.ndarray, c: np.ndarray, lo: int, hi: int) -> None:
        for fn, start in groups:
            fn(a, bt, start, lo, hi, zero, c)

    return _columns_split(chunk, m, bt.shape[0], bt.shape[1], bt.dtype, parts)


def _axpy_kernel(m: int, b: np.ndarray, parts: int) -> Product | None:
    """a @ b through the axpy_rows kernel (B as (K, N)), in `parts` column chunks."""
    handle = _numba.lazy("axpy_rows", b.dtype)
    if handle is None or not handle.ready():
        return None
    fn, zero = handle.fn, b.dtype.type(0)
    return _columns_split(lambda a, c, lo, hi: fn(a, b, lo, hi, zero, c), m, b.shape[1],
                          b.shape[0], b.dtype, parts)


def few_rows_product(m: int, b: np.ndarray) -> Callable[[np.ndarray], np.ndarray] | None:
    """call(a) -> a @ b for a of shape (m, K), 2 <= m <= SMALL_M_MAX, b a constant (K, N)
    (any strides: a transposed view of an (N, K) weight is common): the fastest of BLAS
    and the numba row kernels, each on B as given or copied into its layout (a copy only
    when it wins by LAYOUT_COPY_MIN_GAIN and is at most LAYOUT_COPY_MAX_BYTES), timed
    once on this shape, its output columns split across the pool by timed_split. None
    when the product is too small for this to matter."""
    k, n = b.shape
    if not 2 <= m <= SMALL_M_MAX or k * n < SMALL_M_MIN_ELEMENTS or b.dtype not in (_F32, _F64):
        return None
    copy_ok = b.nbytes <= LAYOUT_COPY_MAX_BYTES
    kn = b if b.flags.c_contiguous else (np.ascontiguousarray(b) if copy_ok else None)
    nk = b.T if b.T.flags.c_contiguous else (np.ascontiguousarray(b.T) if copy_ok else None)
    given = "kn" if b.flags.c_contiguous else "nk" if b.T.flags.c_contiguous else ""
    threads = active_threads()
    parts = THIN_CHUNKS * threads
    cols = None if threads < 2 else Split(1, split_ranges(n, parts, COL_ALIGN))

    def blas(bb: np.ndarray) -> tuple[Product, Product | None]:
        return (lambda a2: np.matmul(a2, bb),
                None if cols is None else (lambda a2: matmul_split(a2, bb, cols)))

    # (layout, whole, split): the split computes the same columns in chunks across the pool
    candidates: list[tuple[str, Product, Product | None]] = [("blas", *blas(b))]
    if kn is not None and given != "kn":
        candidates.append(("kn", *blas(kn)))
    for layout, make in (("nk", lambda p: _rows_kernel(m, nk, p)),
                         ("kn", lambda p: _axpy_kernel(m, kn, p))):
        if (nk if layout == "nk" else kn) is not None:
            fn = make(1)
            if fn is not None:
                candidates.append((layout, fn, make(parts) if cols else None))
    a = np.ones((m, k), b.dtype)
    timed = [(_best_time(fn, a), layout, fn, split) for layout, fn, split in candidates]
    best = min(timed, key=lambda t: t[0])
    as_given = min((t for t in timed if t[1] in ("blas", given)), key=lambda t: t[0])
    if best[1] not in ("blas", given) and best[0] * LAYOUT_COPY_MIN_GAIN > as_given[0]:
        best = as_given  # a copy of B that does not win clearly is not worth its memory
    return timed_split(best[2], best[3])


def _best_time(fn: Product, a: np.ndarray, budget_s: float = 0.02) -> float:
    """The shortest of up to 3 timed calls of fn(a) after a warm one (fewer when they take
    longer than `budget_s` together): one sample let noise pick a 1.8x slower candidate."""
    fn(a)
    best, spent = float("inf"), 0.0
    for _ in range(3):
        start = time.perf_counter()
        fn(a)
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return best


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.matmul across the pool, for kernels that multiply shapes they only see at run time
    (attention's batched Q @ K' and P @ V, products of non-constant operands): 2-D
    products split by plan_split, batched ones with equal batch dims over the batch; every
    other case (broadcast batch dims, vectors, small work, one thread) is np.matmul."""
    threads = active_threads()
    if threads < 2 or a.ndim < 2 or b.ndim < 2:
        return np.matmul(a, b)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if a.ndim == 2 and b.ndim == 2:
        return matmul_split(a, b, plan_split(m, k, n, threads))
    if b.ndim == 2 and a.flags.c_contiguous:  # batch dims folded into the rows
        rows = a.size // k
        return matmul_split(a.reshape(rows, k), b, plan_split(rows, k, n, threads)).reshape(
            *a.shape[:-1], n)
    if a.shape[:-2] != b.shape[:-2] or a.dtype != b.dtype:
        return np.matmul(a, b)
    batch = a.size // (m * k) if m * k else 0
    if batch < 2 or 2 * batch * m * k * n < SPLIT_MIN_FLOPS:
        return np.matmul(a, b)
    a3, b3 = a.reshape(batch, m, k), b.reshape(batch, k, n)
    y = np.empty((batch, m, n), np.result_type(a, b))
    ranges = split_ranges(batch, min(batch, 2 * threads), 1)

    def chunk(i: int) -> None:
        lo, hi = ranges[i]
        np.matmul(a3[lo:hi], b3[lo:hi], out=y[lo:hi])

    parallel_for(len(ranges), chunk)
    return y.reshape(*a.shape[:-2], m, n)
