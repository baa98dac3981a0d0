"""CPU kernels: Conv (im2col + BLAS, depthwise and 1x1 fast paths) and ConvTranspose."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from onnxkiln.ops.window import Geometry, conv_geometry, int_tuple, transpose_pads
from onnxkiln.providers.base import NodeInfo, report_variant
from onnxkiln.providers.cpu import _conv_special, _numba
from onnxkiln.providers.cpu._window import compute_dtype, padded_copy
from onnxkiln.providers.cpu.registry import kernel
from onnxkiln.schema import positive_int_attr

__all__ = ["conv", "conv_transpose"]



def _const(info: NodeInfo, i: int) -> np.ndarray | None:
    return info.const_inputs[i] if len(info.const_inputs) > i else None


def _finish(res: np.ndarray, bias: np.ndarray | None, out_dtype: np.dtype, fresh: bool):
    """Add bias and cast to the output dtype in one pass; never returns an input's memory."""
    if fresh and res.dtype == out_dtype and res.flags.c_contiguous:
        if bias is not None:
            np.add(res, bias, out=res)
        return res
    if out_dtype.kind == "V":  # ml_dtypes (bfloat16): no ufunc output loops
        return (res + bias if bias is not None else res).astype(out_dtype)
    y = np.empty(res.shape, dtype=out_dtype)
    if bias is not None:
        np.add(res, bias, out=y, casting="unsafe")
    else:
        np.copyto(y, res, casting="unsafe")
    return y


def _check_channels(op: str, x: np.ndarray, w: np.ndarray, group: int, transpose: bool) -> None:
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(
            f"{op}: X must be (N, C, D1, ...) and W of the same rank; got X {x.shape}, W {w.shape}"
        )
    c = x.shape[1]
    if group < 1 or c % group:
        raise ValueError(f"{op}: input channels {c} not divisible by group {group}")
    if transpose:
        if w.shape[0] != c:
            raise ValueError(f"{op}: W {w.shape} must have {c} (input channels) in dim 0")
    else:
        if w.shape[1] * group != c or w.shape[0] % group:
            raise ValueError(
                f"{op}: W {w.shape} does not match X channels {c} with group {group}: "
                f"expected W dim 1 == {c // group} and W dim 0 divisible by {group}"
            )


class _Cached:
    """A value derived from an input: computed once when the input is constant."""

    __slots__ = ("_const", "_derive", "_memo")

    def __init__(self, const: np.ndarray | None, derive: Callable[..., Any]) -> None:
        self._const, self._derive, self._memo = const, derive, {}

    def get(self, value: np.ndarray, *key: Any) -> Any:
        if self._const is None:
            return self._derive(value, *key)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._derive(self._const, *key)
        return got


def _bias_nd(b: np.ndarray | None, nsp: int, cdt: np.dtype) -> np.ndarray | None:
    if b is None:
        return None
    return np.asarray(b, dtype=cdt).reshape(-1, *([1] * nsp))


# ---------------------------------------------------------------------------- Conv plans


@dataclass(frozen=True, slots=True)
class _ConvPlan:
    kind: str  # "1x1", "depthwise", "im2col" or "numba"
    geo: Geometry
    out_shape: tuple[int, ...]
    n: int
    group: int
    extra: Any  # per-kind precomputed data
    variant: str = ""  # the name traces show for this shape
    reason: str | None = None  # why a faster variant was not taken


def _conv_kind(w_shape: tuple, group: int) -> str:
    return "depthwise" if group > 1 and w_shape[0] == group and w_shape[1] == 1 else "im2col"


# The direct numba conv beats im2col + GEMM up to this many input channels per group
# (measured: 3.3x at 4, 1.3x at 8; 0.3-0.4x at 32 and more, where BLAS wins).
_NUMBA_MAX_CG = 8


def _plan_conv(
    attrs: dict, group: int, x_shape: tuple, w_shape: tuple, fast: Callable | None = None,
    fast_reason: str | None = None,
) -> _ConvPlan:
    geo = conv_geometry(attrs, x_shape, w_shape)
    n = x_shape[0]
    out_shape = (n, w_shape[0], *geo.out)
    kind = _conv_kind(w_shape, group)
    if kind == "im2col" and all(k == 1 for k in geo.kernel) and not geo.needs_pad:
        kind = "1x1"
    label = {"depthwise": "depthwise", "im2col": "grouped" if group > 1 else "im2col",
             "1x1": "1x1_gemm"}[kind]
    reason = None
    cg = x_shape[1] // group
    if group > 1 and kind != "1x1" and cg > _NUMBA_MAX_CG:
        reason = f"{cg} input channels per group: im2col + GEMM is faster"
    elif group > 1 and kind != "1x1":
        if fast is not None and len(geo.out) in (1, 2):
            extra = (*geo.strides, *geo.dilations, *geo.pads_begin, group)
            if len(geo.out) == 1:  # as 2-D with height 1
                extra = (1, extra[0], 1, extra[1], 0, extra[2], group)
            return _ConvPlan("numba", geo, out_shape, n, group, extra, f"conv.{label}_numba")
        reason = fast_reason or f"numba kernel covers 1-D and 2-D convs, not {len(geo.out)}-D"
    extra = None
    if kind == "depthwise":
        extra = _plan_depthwise(geo)
    elif kind == "im2col":
        extra = (n, group, cg, *geo.kernel, *geo.out)
    variant = f"conv.{label}_numpy" if group > 1 and kind != "1x1" else f"conv.{label}"
    return _ConvPlan(kind, geo, out_shape, n, group, extra, variant, reason)


def _prep_weight(w: np.ndarray, kind: str, group: int, cdt: np.dtype) -> np.ndarray:
    """W reshaped for its path: (g, M/g, C/g*prod(k)) for matmul, (prod(k), C, 1) for depthwise."""
    if kind == "depthwise":
        taps = np.asarray(w, dtype=cdt).reshape(w.shape[0], -1).T
        return np.ascontiguousarray(taps)[:, :, None]
    if kind == "numba":  # (M, C/g, KH, KW); 1-D kernels as height 1
        w4 = w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]) if w.ndim == 3 else w
        return np.ascontiguousarray(w4, dtype=cdt)
    return np.ascontiguousarray(np.asarray(w, dtype=cdt).reshape(group, w.shape[0] // group, -1))


def _run_1x1(plan: _ConvPlan, x: np.ndarray, wm: np.ndarray, cdt: np.dtype) -> np.ndarray:
    strides = plan.geo.strides
    if any(s != 1 for s in strides):
        x = x[(Ellipsis, *(slice(None, None, s) for s in strides))]
    g = plan.group
    xm = x.reshape(plan.n, g, x.shape[1] // g, math.prod(plan.geo.out))
    if xm.dtype != cdt:
        xm = xm.astype(cdt)
    if plan.n == 1 and g == 1:
        return np.matmul(wm[0], xm[0, 0]).reshape(plan.out_shape), True
    return np.matmul(wm, xm).reshape(plan.out_shape), True


def _run_im2col(plan: _ConvPlan, x: np.ndarray, wm: np.ndarray, cdt: np.dtype) -> np.ndarray:
    geo = plan.geo
    xp = padded_copy(x, geo, 0, cdt) if geo.needs_pad else x
    s_n, s_c, *s_sp = xp.strides
    cg = plan.extra[2]
    view = as_strided(
        xp,
        shape=plan.extra,
        strides=(
            s_n,
            s_c * cg,
            s_c,
            *(s * d for s, d in zip(s_sp, geo.dilations)),
            *(s * st for s, st in zip(s_sp, geo.strides)),
        ),
        writeable=False,
    )
    cols = np.empty(plan.extra, dtype=cdt)
    np.copyto(cols, view, casting="unsafe")
    n, g = plan.n, plan.group
    if n == 1 and g == 1:  # one plain 2-D GEMM
        return np.matmul(wm[0], cols.reshape(wm.shape[2], -1)).reshape(plan.out_shape), True
    cols = cols.reshape(n, g, wm.shape[2], math.prod(geo.out))
    return np.matmul(wm, cols).reshape(plan.out_shape), True


@dataclass(frozen=True, slots=True)
class _Depthwise:
    """Shifted multiply-accumulate plan over stride-phase planes of one flat padded buffer."""

    planes: tuple[int, ...]  # Q: padded length per axis divided by the stride (rounded up)
    n_phases: int
    buf_len: int
    length: int  # out[0] * prod(Q[1:]): the flat span each tap reads
    taps: tuple[tuple[int, int], ...]  # (phase, flat offset) per kernel position
    fills: tuple[tuple[int, tuple[slice, ...], tuple[slice, ...]], ...]
    crop: tuple[slice, ...] | None


def _plan_depthwise(geo: Geometry) -> _Depthwise:
    s, k, d = geo.strides, geo.kernel, geo.dilations
    q = tuple(-(-p // st) for p, st in zip(geo.padded, s))
    flat = [math.prod(q[i + 1:]) for i in range(len(q))]
    length = geo.out[0] * flat[0]
    taps = []
    for pos in itertools.product(*(range(kk) for kk in k)):
        phase = np.ravel_multi_index([(j * dd) % st for j, dd, st in zip(pos, d, s)], s)
        off = sum((j * dd) // st * f for j, dd, st, f in zip(pos, d, s, flat))
        taps.append((int(phase), off))
    fills = []
    for phase, a in enumerate(itertools.product(*(range(st) for st in s))):
        dst, src = [], []
        for ai, st, pb, size in zip(a, s, geo.pads_begin, geo.in_shape):
            q0, q1 = -(-(pb - ai) // st), -(-(pb + size - ai) // st)
            start = q0 * st + ai - pb
            dst.append(slice(q0, q1))
            src.append(slice(start, start + (q1 - q0 - 1) * st + 1, st))
        if all(sl.stop > sl.start for sl in dst):
            fills.append((phase, tuple(dst), tuple(src)))
    crop = None
    if tuple(q[1:]) != tuple(geo.out[1:]):
        crop = (slice(None),) * 3 + tuple(slice(0, o) for o in geo.out[1:])
    buf_len = max(math.prod(q), max(off for _, off in taps) + length)
    return _Depthwise(q, math.prod(s), buf_len, length, tuple(taps), tuple(fills), crop)


def _run_depthwise(plan: _ConvPlan, x: np.ndarray, taps: np.ndarray, cdt: np.dtype):
    dw: _Depthwise = plan.extra
    n, c = x.shape[:2]
    buf = np.zeros((dw.n_phases, n, c, dw.buf_len), dtype=cdt)
    planes = buf[..., : math.prod(dw.planes)].reshape(dw.n_phases, n, c, *dw.planes)
    for phase, dst, src in dw.fills:
        planes[(phase, slice(None), slice(None), *dst)] = x[(slice(None), slice(None), *src)]
    length = dw.length
    acc = np.empty((n, c, length), dtype=cdt)
    tmp = np.empty_like(acc)
    for j, (phase, off) in enumerate(dw.taps):
        src = buf[phase, :, :, off : off + length]
        if j == 0:
            np.multiply(src, taps[0], out=acc)
        else:
            np.multiply(src, taps[j], out=tmp)
            np.add(acc, tmp, out=acc)
    res = acc.reshape(n, c, plan.geo.out[0], *dw.planes[1:])
    return (res, True) if dw.crop is None else (res[dw.crop], False)


def _run_numba(plan: _ConvPlan, x: np.ndarray, w4: np.ndarray, cdt: np.dtype, fast, bias):
    """The compiled direct conv, bias included; 1-D convs run as 2-D with height 1."""
    x4 = np.ascontiguousarray(x, dtype=cdt)
    if x4.ndim == 3:
        x4 = x4.reshape(x4.shape[0], x4.shape[1], 1, x4.shape[2])
    out = np.empty((plan.n, w4.shape[0], *(plan.out_shape[2:] if x.ndim == 4
                                          else (1, plan.out_shape[2]))), dtype=cdt)
    fast(x4, w4, bias, plan.extra, out)
    return out.reshape(plan.out_shape)


_CONV_RUNNERS = {"1x1": _run_1x1, "im2col": _run_im2col, "depthwise": _run_depthwise}


@kernel("Conv", since=1, factory=True, variant="conv.im2col")
def conv(info: NodeInfo):
    """Conv: im2col + BLAS matmul; depthwise shifted-MAC and 1x1 matmul fast paths."""
    attrs = dict(info.attrs)
    group = positive_int_attr(attrs, "group", "Conv")
    w_const, b_const = _const(info, 1), _const(info, 2)
    weights = _Cached(w_const, lambda w, kind, cdt: _prep_weight(w, kind, group, cdt))
    biases = _Cached(b_const, lambda b, nsp, cdt: _bias_nd(b, nsp, cdt))
    flat_biases = _Cached(b_const, lambda b, cdt: np.ascontiguousarray(b, dtype=cdt))
    # Grouped/depthwise convs: the numba kernels for the declared dtype, loaded on first use.
    fast_fns: dict[np.dtype, _numba.Lazy] = {}
    depthwise_fns: dict[str, _numba.Lazy | None] = {}
    fast_reason = _numba.disabled_reason() if group > 1 else None
    if group > 1 and fast_reason is None:
        dt = info.input_dtypes[0] if info.input_dtypes else None
        cdt0 = compute_dtype(dt.numpy) if dt is not None and dt.numpy.kind in "fV" else _F32
        handle = _numba.lazy("conv2d", cdt0)
        if handle is not None:
            fast_fns[cdt0] = handle
        depthwise_fns = {kind: _numba.lazy(f"depthwise_{kind}", cdt0)
                         for kind in ("planes", "cl")}

    def plan_for(x_shape: tuple, w_shape: tuple, cdt: np.dtype) -> _ConvPlan:
        handle = fast_fns.get(cdt)
        fast = handle.fn if handle is not None and handle.ready() else None
        reason = None if fast else (fast_reason or (handle.reason if handle else None)
                                    or f"numba kernel made for the declared type, not {cdt}")
        return _plan_conv(attrs, group, x_shape, w_shape, fast, reason)

    def execute(plan: _ConvPlan, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                cdt: np.dtype) -> np.ndarray:
        if plan.kind == "numba":
            bias = (_zeros(w.shape[0], cdt) if b is None else flat_biases.get(b, cdt))
            w4 = weights.get(w, "numba", cdt)
            return _finish(_run_numba(plan, x, w4, cdt, fast_fns[cdt].fn, bias), None,
                           x.dtype, True)
        wkind = "depthwise" if plan.kind == "depthwise" else "matmul"
        res, fresh = _CONV_RUNNERS[plan.kind](plan, x, weights.get(w, wkind, cdt), cdt)
        bias = None if b is None else biases.get(b, x.ndim - 2, cdt)
        return _finish(res, bias, x.dtype, fresh)

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        cdt = compute_dtype(x.dtype)
        _check_channels("Conv", x, w, group, transpose=False)
        plan = plan_for(x.shape, w.shape, cdt)
        report_variant(plan.variant, plan.reason)
        return execute(plan, x, w, b, cdt)

    def specialize(dtypes, shapes, consts, epilogue=None):
        """Plan, weights and thread split for one input signature (_conv_special). FusedConv
        passes its activation as `epilogue`; the result's `epilogue` attribute says whether
        it applies it (else None: the caller must)."""
        sx, sw_, dt = shapes[0], shapes[1], dtypes[0]
        if sx is None or sw_ is None or dt is None or w_const is None or (
                len(shapes) > 2 and shapes[2] is not None and b_const is None):
            return None
        cdt = compute_dtype(dt)
        _check_channels("Conv", np.empty(sx, cdt), w_const, group, transpose=False)
        plan = plan_for(sx, sw_, cdt)
        special = _special_runner(plan, group, w_const, b_const, cdt, dt, depthwise_fns,
                                  epilogue)
        if special is None:
            def special(x, w, b=None):
                return execute(plan, x, w, b, cdt)

            special.variant = plan.variant
            special.epilogue = None
        special.variant_reason = plan.reason
        return special

    run.variant, run.variant_reason = "conv.im2col", None
    run.specialize = specialize
    return run


def _special_runner(plan: _ConvPlan, group: int, w: np.ndarray, b: np.ndarray | None,
                    cdt: np.dtype, dt: np.dtype, depthwise_fns: dict,
                    epilogue: _conv_special.Epilogue | None) -> Callable | None:
    """The fast path of _conv_special for this plan, or None (keep the plan's runner); its
    `epilogue` attribute is the epilogue it applies (None when it leaves it)."""
    if dt != cdt:
        return None
    nsp = len(plan.geo.out)
    bias = None if b is None else np.ascontiguousarray(b, dtype=cdt)
    if plan.kind in ("1x1", "im2col") and group == 1:
        wm = np.ascontiguousarray(np.asarray(w, dtype=cdt).reshape(w.shape[0], -1))
        make = _conv_special.one_by_one_call if plan.kind == "1x1" else _conv_special.im2col_call
        finish = _conv_special.finisher(bias, epilogue, cdt)
        special = make(plan.geo, wm, bias, (1, *plan.out_shape[1:]), finish)
        if plan.n > 1:
            special = _conv_special.per_image_call(special, plan.out_shape, cdt)
        special.variant = plan.variant
        special.epilogue = epilogue if finish is not None else None
        return special
    depthwise = group > 1 and w.shape[0] == group and w.shape[1] == 1 and nsp == 2
    if depthwise and plan.kind == "numba":
        small = math.prod(plan.geo.out) <= _conv_special.CL_MAX_POSITIONS
        kind = "cl" if small else "planes"
        handle = depthwise_fns.get(kind)
        if handle is None or not handle.ready():
            return None
        taps = np.asarray(w, dtype=cdt)[:, 0]
        wk = np.ascontiguousarray(taps.transpose(1, 2, 0) if small else taps)
        flat = bias if bias is not None else np.zeros(w.shape[0], cdt)
        special = _conv_special.depthwise_call(handle.fn, kind, plan.geo, wk, flat,
                                               plan.out_shape, epilogue)
        special.epilogue = epilogue
        return special
    return None


_F32 = np.dtype(np.float32)


def _zeros(n: int, dt: np.dtype) -> np.ndarray:
    return np.zeros(n, dt)


# ---------------------------------------------------------------------------- ConvTranspose


@dataclass(frozen=True, slots=True)
class _TransposePlan:
    n: int
    group: int
    in_sp: tuple[int, ...]
    out_shape: tuple[int, ...]
    buf_shape: tuple[int, ...] | None  # None: the matmul result is the output (1x1, no pads)
    taps: tuple[tuple[slice, ...], ...]
    crop: tuple[slice, ...]


def _plan_transpose(attrs: dict, group: int, x_shape: tuple, w_shape: tuple) -> _TransposePlan:
    nsp = len(x_shape) - 2
    in_sp = tuple(x_shape[2:])
    k = tuple(w_shape[2:])
    given = attrs.get("kernel_shape")
    if given is not None and len(given) > 0 and tuple(given) != k:
        raise ValueError(f"kernel_shape {list(given)} does not match W spatial dims {list(k)}")
    s = int_tuple(attrs.get("strides"), nsp, 1, "strides")
    d = int_tuple(attrs.get("dilations"), nsp, 1, "dilations")
    out_pad = int_tuple(attrs.get("output_padding"), nsp, 0, "output_padding")
    begin, _, out = transpose_pads(attrs, in_sp, k, s, d, out_pad)
    m = w_shape[1] * group
    out_shape = (x_shape[0], m, *out)
    lo = [min(0, b) for b in begin]
    full = [(n - 1) * st + (kk - 1) * dd + 1 for n, st, kk, dd in zip(in_sp, s, k, d)]
    hi = [max(f, b + o) for f, b, o in zip(full, begin, out)]
    buf_shape = (x_shape[0], m, *(h - low for h, low in zip(hi, lo)))
    taps = [
        tuple(
            slice(j * dd - low, j * dd - low + (n - 1) * st + 1, st)
            for j, dd, low, n, st in zip(pos, d, lo, in_sp, s)
        )
        for pos in itertools.product(*(range(kk) for kk in k))
    ]
    crop = (slice(None), slice(None), *(slice(b - low, b - low + o)
                                        for b, low, o in zip(begin, lo, out)))
    if math.prod(k) == 1 and all(st == 1 for st in s) and tuple(out) == in_sp and not any(begin):
        buf_shape = None
    return _TransposePlan(x_shape[0], group, in_sp, out_shape, buf_shape, tuple(taps), crop)


def _prep_transpose_weight(w: np.ndarray, group: int, cdt: np.dtype) -> np.ndarray:
    """W (C, M/g, *k) as (g, M/g*prod(k), C/g), the left operand of the col matmul."""
    c = w.shape[0]
    wg = np.asarray(w, dtype=cdt).reshape(group, c // group, -1)
    return np.ascontiguousarray(wg.transpose(0, 2, 1))


def _run_transpose(plan: _TransposePlan, x: np.ndarray, wt: np.ndarray, cdt: np.dtype):
    n, g = plan.n, plan.group
    xm = x.reshape(n, g, x.shape[1] // g, math.prod(plan.in_sp))
    if xm.dtype != cdt:
        xm = xm.astype(cdt)
    cols = np.matmul(wt, xm)  # (N, g, M/g * prod(k), prod(in))
    m = plan.out_shape[1]
    if plan.buf_shape is None:
        return cols.reshape(plan.out_shape), True
    cols = cols.reshape(n, m, len(plan.taps), *plan.in_sp)
    buf = np.zeros(plan.buf_shape, dtype=cdt)
    for j, dst in enumerate(plan.taps):
        view = buf[(slice(None), slice(None), *dst)]
        np.add(view, cols[:, :, j], out=view)
    res = buf[plan.crop]
    return res, res.shape == buf.shape


@kernel("ConvTranspose", since=1, factory=True, variant="convtranspose.col2im")
def conv_transpose(info: NodeInfo):
    """ConvTranspose: BLAS matmul to columns, then col2im with one strided add per kernel tap."""
    attrs = dict(info.attrs)
    group = positive_int_attr(attrs, "group", "ConvTranspose")
    weights = _Cached(_const(info, 1), lambda w, cdt: _prep_transpose_weight(w, group, cdt))
    biases = _Cached(_const(info, 2), lambda b, nsp, cdt: _bias_nd(b, nsp, cdt))

    def execute(plan: _TransposePlan, x: np.ndarray, w: np.ndarray, b) -> np.ndarray:
        cdt = compute_dtype(x.dtype)
        res, fresh = _run_transpose(plan, x, weights.get(w, cdt), cdt)
        bias = None if b is None else biases.get(b, x.ndim - 2, cdt)
        return _finish(res, bias, x.dtype, fresh)

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        _check_channels("ConvTranspose", x, w, group, transpose=True)
        return execute(_plan_transpose(attrs, group, x.shape, w.shape), x, w, b)

    def specialize(dtypes, shapes, consts):
        if shapes[0] is None or shapes[1] is None:
            return None
        _check_channels("ConvTranspose", np.empty(shapes[0], np.float32),
                        np.empty(shapes[1], np.float32), group, transpose=True)
        plan = _plan_transpose(attrs, group, shapes[0], shapes[1])
        return lambda x, w, b=None: execute(plan, x, w, b)

    run.specialize = specialize
    return run
