"""CPU kernels: linear algebra (MatMul, Gemm, MatMulInteger, Einsum, Det)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from onnxkiln.pool import active_threads, parallel_for
from onnxkiln.providers.base import NodeInfo, report_variant
from onnxkiln.providers.cpu import _gemm
from onnxkiln.providers.cpu._gemm import (
    Split,
    constant_product,
    matmul_split,
    plan_split,
    split_ranges,
)
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
# Types numpy has no BLAS for: computed in float32 and cast back (as onnxruntime does).
_LOW = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})


def _const(info: NodeInfo, i: int) -> np.ndarray | None:
    """The value of input i when it is an initializer/Constant, else None."""
    consts = info.const_inputs
    return consts[i] if i < len(consts) else None


def _shape_error(op: str, a: np.ndarray, b: np.ndarray, err: Exception) -> ValueError:
    return ValueError(
        f"{op}: cannot multiply A of shape {a.shape} by B of shape {b.shape}: the last dim of A "
        f"must equal the second-to-last dim of B (the only dim of a 1-D B), and the batch dims "
        f"must broadcast ({err})"
    )


def _mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.matmul, with A's batch dims folded into one GEMM when B is a single matrix."""
    if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous and a.shape[-1] == b.shape[0]:
        lead = a.shape[:-1]
        y = np.matmul(a.reshape(math.prod(lead), a.shape[-1]), b)
        return y.reshape(*lead, b.shape[1])
    return np.matmul(a, b)


def _blas_ready(w: np.ndarray) -> np.ndarray:
    """w itself when BLAS can take it without a copy (C or Fortran order), else a C copy."""
    if w.flags.c_contiguous or w.flags.f_contiguous:
        return w
    return np.ascontiguousarray(w)


@kernel("MatMul", since=1, factory=True, variant="matmul.blas")
def matmul(info: NodeInfo) -> Callable[..., np.ndarray]:
    """numpy.matmul semantics; float16/bfloat16 multiply in float32 (a constant B is cast once)."""
    b_const = _const(info, 1)
    b32 = b_const.astype(_F32) if b_const is not None and b_const.dtype in _LOW else None
    a_type = info.input_dtypes[0] if info.input_dtypes else None

    def run_blas(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        try:
            return _mm(a, b)
        except ValueError as e:
            raise _shape_error("MatMul", a, b, e) from e

    ranks = [len(sh) if sh is not None else None for sh in info.input_shapes[:2]]
    variant = _matmul_variant(*ranks) if len(ranks) == 2 and None not in ranks else None
    if a_type is not None and a_type.numpy.kind == "f" and a_type.numpy not in _LOW:
        kernel_fn = run_blas  # float32/float64 known at plan time: straight to BLAS
    else:

        def kernel_fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            try:
                if a.dtype in _LOW:
                    bb = b32 if b32 is not None else b.astype(_F32)
                    return _mm(a.astype(_F32), bb).astype(a.dtype)
                return _mm(a, b)
            except ValueError as e:
                raise _shape_error("MatMul", a, b, e) from e

    if variant is not None:  # ranks known at plan time: the variant is fixed (no per-call cost)
        kernel_fn.variant = variant
        kernel_fn.specialize = _specialize_matmul
        return kernel_fn
    inner = kernel_fn

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        report_variant(_matmul_variant(a.ndim, b.ndim))
        return inner(a, b)

    run.variant = "matmul.blas"
    run.specialize = _specialize_matmul
    return run


def _specialize_matmul(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
    """float32/float64 products of known shapes: A's batch dims folded into the rows of one
    GEMM when B is 2-D, batched products split over their batch, both across the pool."""
    sa, sb = shapes[0], shapes[1]
    dt = dtypes[0]
    if sa is None or sb is None or dt not in (_F32, _F64) or dtypes[1] != dt:
        return None
    if len(sa) < 2 or len(sb) < 2 or sa[-1] != sb[-2]:
        return None  # vectors and mismatches: the generic kernel (and its error)
    threads = active_threads()
    if len(sb) == 2:
        m, k, n = math.prod(sa[:-1]), sa[-1], sb[1]
        b = consts[1]
        if b is not None:
            product, kind = constant_product(m, k, b)
            out_shape = (*sa[:-1], n)
            return _named(lambda a, b: product(a.reshape(m, k)).reshape(out_shape),
                          f"matmul.{kind}", None)
        split = plan_split(m, k, n, threads)
        if len(sa) == 2:
            if split is None:
                run = _matmul_2d
            else:
                def run(a, b):
                    return matmul_split(a, b, split)
        else:
            out_shape = (*sa[:-1], n)

            def run(a, b):
                return matmul_split(a.reshape(m, k), b, split).reshape(out_shape)
        return _named(run, "matmul.gemm_2d" if len(sa) == 2 else "matmul.folded_2d", split)
    if sa[:-2] != sb[:-2]:
        return None  # broadcast batch dims: numpy's matmul
    return _batched_matmul(sa, sb, dt, threads)


def _matmul_2d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a, b)


def _named(fn: Callable[..., np.ndarray], variant: str, split: Split | None):
    fn.variant = variant + ("_split" if split is not None else "")
    return fn


def _batched_matmul(sa: tuple, sb: tuple, dt: np.dtype, threads: int):
    """(..., M, K) @ (..., K, N) with equal batch dims, the batch split across the pool."""
    batch = math.prod(sa[:-2])
    m, k, n = sa[-2], sa[-1], sb[-1]
    out_shape = (*sa[:-2], m, n)
    if threads < 2 or batch < 2 or 2 * batch * m * k * n < _gemm.SPLIT_MIN_FLOPS:
        return _named(_matmul_2d, "matmul.batched", None)
    ranges = split_ranges(batch, min(batch, 2 * threads), 1)

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a3, b3 = a.reshape(batch, m, k), b.reshape(batch, k, n)
        y = np.empty((batch, m, n), dt)

        def chunk(i: int) -> None:
            lo, hi = ranges[i]
            np.matmul(a3[lo:hi], b3[lo:hi], out=y[lo:hi])

        parallel_for(len(ranges), chunk)
        return y.reshape(out_shape)

    return _named(run, "matmul.batched", Split(0, ranges))


def _matmul_variant(a_rank: int, b_rank: int) -> str:
    """The trace name of the path `_mm` takes for these ranks (C-contiguous A assumed)."""
    if a_rank <= 2 and b_rank <= 2:
        return "matmul.gemm_2d"
    if b_rank == 2:
        return "matmul.folded_2d"  # A's batch dims folded into the rows of one GEMM
    return "matmul.batched"


def _int_scale(y: np.ndarray, factor: float) -> np.ndarray:
    """y * factor for an integer y, truncated back to y's dtype (in place)."""
    if float(factor).is_integer():  # exact, wrapping like the integer type does
        np.multiply(y, np.array(int(factor), np.int64).astype(y.dtype), out=y)
    else:
        np.multiply(y, factor, out=y, casting="unsafe")
    return y


@kernel("Gemm", since=1, factory=True, variant="gemm.blas")
def gemm(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = alpha * A' @ B' + beta * C; C broadcasts to (M, N) (also when opset < 7 says not to).

    A constant B is oriented once (transposition stays a BLAS flag, no copy), cast to float32
    for float16/bfloat16, and pre-multiplied by alpha; a constant C is pre-multiplied by beta.
    """
    alpha = float(info.attrs.get("alpha", 1.0))
    beta = float(info.attrs.get("beta", 1.0))
    trans_a = bool(info.attrs.get("transA", 0))
    trans_b = bool(info.attrs.get("transB", 0))
    b_const, c_const = _const(info, 1), _const(info, 2)

    def orient_b(b: np.ndarray) -> np.ndarray:
        if b.ndim != 2:
            raise ValueError(f"Gemm: B must be 2-D, got shape {b.shape}")
        return b.T if trans_b else b

    # Pre-oriented constant B in its compute dtype, with alpha folded in for float types.
    wb: np.ndarray | None = None
    wb_alpha = alpha
    if b_const is not None and b_const.ndim == 2:
        w = orient_b(b_const)
        if w.dtype in _LOW:
            w = w.astype(_F32)
        if w.dtype.kind == "f" and alpha != 1.0:
            w = w * w.dtype.type(alpha)
            wb_alpha = 1.0
        wb = _blas_ready(w)
    wc: np.ndarray | None = None
    if c_const is not None and beta != 0.0 and c_const.dtype.kind == "f":
        cdt = _F32 if c_const.dtype in _LOW else c_const.dtype
        wc = c_const.astype(cdt) * cdt.type(beta) if beta != 1.0 else c_const.astype(cdt)

    def run(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        if a.ndim != 2:
            raise ValueError(f"Gemm: A must be 2-D, got shape {a.shape}")
        dt = a.dtype
        low = dt in _LOW
        aa = a.T if trans_a else a
        if low:
            aa = aa.astype(_F32)
        if wb is not None:
            bb, scale = wb, wb_alpha
        else:
            bb, scale = orient_b(b), alpha
            if low:
                bb = bb.astype(_F32)
        try:
            y = np.matmul(aa, bb)
        except ValueError as e:
            raise ValueError(
                f"Gemm: A' of shape {aa.shape} (transA={int(trans_a)}) and B' of shape "
                f"{bb.shape} (transB={int(trans_b)}) do not share K"
            ) from e
        if scale != 1.0:
            if y.dtype.kind == "f":
                y *= y.dtype.type(scale)
            else:
                _int_scale(y, scale)
        if c is not None and beta != 0.0:
            try:
                if wc is not None:
                    y += wc
                elif y.dtype.kind == "f":
                    cc = c.astype(y.dtype, copy=False)
                    y += cc * y.dtype.type(beta) if beta != 1.0 else cc
                elif beta == 1.0:
                    y += c
                else:
                    np.add(y, c * beta, out=y, casting="unsafe")
            except ValueError as e:
                raise ValueError(
                    f"Gemm: C of shape {c.shape} does not broadcast to the result (M, N) = "
                    f"{y.shape}"
                ) from e
        return y.astype(dt) if low else y

    def specialize(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
        """Constant B in float32/float64 with A of known shape: one (split) GEMM, then the
        scale and C in place."""
        sa = shapes[0]
        if wb is None or sa is None or len(sa) != 2 or dtypes[0] != wb.dtype:
            return None
        m, k = (sa[1], sa[0]) if trans_a else sa
        if k != wb.shape[0] or wb.dtype not in (_F32, _F64):
            return None
        product, kind = constant_product(m, k, wb)
        scale = wb.dtype.type(wb_alpha)
        bias = wc if wc is not None else None
        if bias is None and len(shapes) > 2 and shapes[2] is not None and beta != 0.0:
            return None  # a C that is not constant: the generic path
        try:
            np.broadcast_shapes(bias.shape if bias is not None else (), (m, wb.shape[1]))
        except ValueError:
            return None

        def special(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
            y = product(a.T if trans_a else a)
            if wb_alpha != 1.0:
                y *= scale
            if bias is not None:
                y += bias
            return y

        return _named(special, f"gemm.{kind}", None)

    run.specialize = specialize
    return run


def _as_float_operand(x: np.ndarray, zp: np.ndarray | None, dt: np.dtype, row_zp: bool):
    """x - zero_point in a float dtype that holds every product sum exactly."""
    xf = x.astype(dt)
    if zp is not None:
        z = np.asarray(zp).astype(dt)
        if row_zp and z.ndim == 1 and z.size > 1 and x.ndim >= 2:
            z = z.reshape(-1, 1)  # per-row zero point of A: [M] means one per row
        xf -= z
    return xf


@kernel("MatMulInteger", since=10, factory=True, variant="matmulinteger.blas")
def matmul_integer(info: NodeInfo) -> Callable[..., np.ndarray]:
    """(A - a_zero_point) @ (B - b_zero_point) as int32 (exact: BLAS in float, then cast)."""
    b_const, bzp_const = _const(info, 1), _const(info, 3)
    has_bzp = len(info.input_present) > 3 and info.input_present[3]
    prepared: dict[np.dtype, np.ndarray] = {}
    if b_const is not None and (bzp_const is not None or not has_bzp):
        for fdt in (_F32, _F64):
            prepared[fdt] = _as_float_operand(b_const, bzp_const, fdt, False)

    def run(
        a: np.ndarray,
        b: np.ndarray,
        a_zero_point: np.ndarray | None = None,
        b_zero_point: np.ndarray | None = None,
    ) -> np.ndarray:
        k = a.shape[-1] if a.ndim else 0
        # |(a - za) * (b - zb)| <= 255 * 255, so float32 sums stay exact up to K = 258.
        fdt = _F32 if k <= 256 else _F64
        af = _as_float_operand(a, a_zero_point, fdt, True)
        bf = prepared.get(fdt)
        if bf is None:
            bf = _as_float_operand(b, b_zero_point, fdt, False)
        try:
            y = _mm(af, bf)
        except ValueError as e:
            raise _shape_error("MatMulInteger", a, b, e) from e
        if k > 33000:  # the sum may leave int32: wrap it as 32-bit accumulation would
            return y.astype(np.int64).astype(np.int32)
        return y.astype(np.int32)

    return run


@kernel("Einsum", since=12, factory=True, variant="einsum.numpy")
def einsum(info: NodeInfo) -> Callable[..., np.ndarray]:
    """numpy.einsum (BLAS where it can); the contraction path is chosen once per signature
    (specialize), per call otherwise."""
    equation = str(info.attrs["equation"]).replace(" ", "")

    def run(*xs: np.ndarray, path: Any = "greedy") -> np.ndarray:
        dt = xs[0].dtype if xs else _F32
        ops = [x.astype(_F32) for x in xs] if dt in _LOW else xs
        try:
            y = np.einsum(equation, *ops, optimize=path)
        except ValueError as e:
            shapes = ", ".join(str(x.shape) for x in xs)
            raise ValueError(
                f"Einsum: equation {equation!r} does not fit inputs {shapes}: {e}"
            ) from e
        if dt in _LOW:
            return np.asarray(y).astype(dt)
        y = np.asarray(y)
        if any(np.may_share_memory(y, x) for x in xs):
            y = y.copy()
        return y

    def specialize(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
        if any(s is None for s in shapes) or not dtypes:
            return None
        dt = _F32 if dtypes[0] in _LOW else dtypes[0]
        dummies = [np.empty(s, dt) for s in shapes]
        path = np.einsum_path(equation, *dummies, optimize="greedy")[0]
        return functools.partial(run, path=path)

    run.specialize = specialize
    return run


@kernel("Det", since=11, variant="det.lapack")
def det(x: np.ndarray) -> np.ndarray:
    """Determinant of the trailing square matrices; float16/bfloat16 computed in float32."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Det: input must be [..., M, M], got shape {x.shape}")
    if x.dtype in _LOW:
        return np.asarray(np.linalg.det(x.astype(_F32))).astype(x.dtype)
    return np.asarray(np.linalg.det(x))
