"""CPU kernels: onnxruntime's com.microsoft 8-bit quantized ops (what its quantizer writes).

QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool,
QLinearAveragePool, QLinearConcat, QLinearWhere, QLinearSoftmax and QGemm, on uint8 or int8
tensors with per-tensor scales and zero points (QGemm's B may be per column). The float
arithmetic follows onnxruntime's CPU kernels step by step (which float32 roundings happen
where), so results match it bit for bit (QLinearSoftmax: but for rare ties, see there);
rounding is half to even, then saturation to the type's range.

onnx knows none of these schemas, so no attribute defaults are filled in at plan time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.ops import special
from onnxkiln.ops.attrs import norm_axis
from onnxkiln.ops.window import pool_geometry, window_counts
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._tensor_util import const_input
from onnxkiln.providers.cpu._window import padded_copy
from onnxkiln.providers.cpu.contrib_quant import _present
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_U8 = np.dtype(np.uint8)
_I8 = np.dtype(np.int8)
_RANGE = {_U8: (0, 255), _I8: (-128, 127)}
_MAX_TABLES = 32


def _qtype(op: str, x: np.ndarray, what: str = "input") -> np.dtype:
    if x.dtype not in _RANGE:
        raise TypeError(f"{op}: {what} must be uint8 or int8, got {x.dtype}")
    return x.dtype


def _scale(op: str, v: np.ndarray, what: str) -> np.float32:
    if v.size != 1:
        raise ValueError(f"{op}: {what} must be a scalar (per tensor), got shape {v.shape}")
    return _F32.type(v.reshape(-1)[0])


def _zp(op: str, v: np.ndarray | None, dt: np.dtype, what: str) -> int:
    """A scalar zero point of type dt as int; 0 when absent."""
    if v is None:
        return 0
    if v.dtype != dt:
        raise TypeError(f"{op}: {what} must be {dt} like its tensor, got {v.dtype}")
    if v.size != 1:
        raise ValueError(f"{op}: {what} must be a scalar (per tensor), got shape {v.shape}")
    return int(v.reshape(-1)[0])


def _saturate(v: np.ndarray, dt: np.dtype) -> np.ndarray:
    """round half to even, clamp to dt's range, cast (v is a fresh float array, overwritten)."""
    lo, hi = _RANGE[dt]
    if not isinstance(v, np.ndarray):  # 0-d arithmetic gives numpy scalars
        v = np.array(v)
    np.rint(v, out=v)
    np.clip(v, lo, hi, out=v)
    return v.astype(dt)


def _codes(dt: np.dtype) -> np.ndarray:
    """The 256 values of dt in the order of their uint8 bit patterns (a lookup table's keys)."""
    return np.arange(256, dtype=_U8).view(dt)


def _lookup(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """table[x] for an 8-bit x, indexed by its bit pattern."""
    return table[x.view(_U8) if x.dtype != _U8 else x]


def _requant_table(dt: np.dtype, xs: np.float32, xz: int, ys: np.float32, yz: int,
                   out_dt: np.dtype) -> np.ndarray:
    """out[v] = saturate(round((v - xz) * xs / ys) + yz) for each value v of dt."""
    v = _codes(dt).astype(_F32)
    v -= _F32.type(xz)
    v *= xs
    return _quantize_table(v, ys, yz, out_dt)


def _quantize_table(v: np.ndarray, ys: np.float32, yz: int, dt: np.dtype) -> np.ndarray:
    """saturate(round(v / ys) + yz): rounded before the zero point is added, as onnxruntime's
    lookup tables (MlasQuantizeLinear) do, which decides ties when ys halves a step."""
    v /= ys
    np.rint(v, out=v)
    v += _F32.type(yz)
    return _saturate(v, dt)


def _fma32(a: np.float32, b: float, c: np.float32) -> np.float32:
    """float32 a * b + c with one rounding (the product is exact in float64)."""
    return _F32.type(_F64.type(a) * _F64.type(b) + _F64.type(c))


def _binary(op: str, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp):
    dt = _qtype(op, a, "A")
    if b.dtype != dt:
        raise TypeError(f"{op}: A is {dt} but B is {b.dtype}")
    params = (_scale(op, a_scale, "A_scale"), _zp(op, a_zp, dt, "A_zero_point"),
              _scale(op, b_scale, "B_scale"), _zp(op, b_zp, dt, "B_zero_point"),
              _scale(op, c_scale, "C_scale"), _zp(op, c_zp, dt, "C_zero_point"))
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError as e:
        raise ValueError(f"{op}: A {a.shape} and B {b.shape} do not broadcast") from e
    return dt, params


@kernel("QLinearAdd", since=1, domain=MS, variant="qlinearadd.numpy")
def qlinear_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale,
                c_zero_point=None) -> np.ndarray:
    """C = saturate(round((A_scale (A - A_zp) + B_scale (B - B_zp)) / C_scale) + C_zp).

    As in onnxruntime: ra = A_scale / C_scale, rb = B_scale / C_scale and
    k = C_zp - fma(ra, A_zp, rb B_zp) in float32, then fma(A, ra, fma(B, rb, k)).
    """
    dt, (sa, za, sb, zb, sc, zc) = _binary("QLinearAdd", a, a_scale, a_zero_point, b, b_scale,
                                           b_zero_point, c_scale, c_zero_point)
    ra, rb = sa / sc, sb / sc
    k = _F32.type(zc) - _fma32(ra, za, rb * _F32.type(zb))
    t = b.astype(_F64)  # products are exact in float64: one rounding per fused add
    t *= _F64.type(rb)
    t += _F64.type(k)
    t = t.astype(_F32).astype(_F64)
    v = a.astype(_F64)
    v *= _F64.type(ra)
    if v.shape == np.broadcast_shapes(v.shape, t.shape):
        v += t
    else:
        v = v + t
    return _saturate(np.asarray(v).astype(_F32), dt)


@kernel("QLinearMul", since=1, domain=MS, variant="qlinearmul.numpy")
def qlinear_mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale,
                c_zero_point=None) -> np.ndarray:
    """C = saturate(round((A - A_zp)(B - B_zp) * (A_scale B_scale / C_scale) + C_zp))."""
    dt, (sa, za, sb, zb, sc, zc) = _binary("QLinearMul", a, a_scale, a_zero_point, b, b_scale,
                                           b_zero_point, c_scale, c_zero_point)
    m = sa * sb / sc
    v = a.astype(_F32)
    v -= _F32.type(za)
    bc = b.astype(_F32)
    bc -= _F32.type(zb)
    if v.shape == np.broadcast_shapes(v.shape, bc.shape):
        v *= bc
    else:
        v = np.asarray(v * bc)
    v *= m
    v += _F32.type(zc)
    return _saturate(v, dt)


def _lut_kernel(op: str, fn: Callable[[np.ndarray], None]) -> Callable[..., np.ndarray]:
    """Y = quantize(fn(dequantize(X))) through a 256-entry table per parameter set; fn works in
    place on float32 values."""
    tables: dict[tuple, np.ndarray] = {}

    def run(x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None) -> np.ndarray:
        dt = _qtype(op, x, "X")
        if y_scale is None:
            raise ValueError(f"{op}: Y_scale is required")
        key = (dt, _scale(op, x_scale, "X_scale"), _zp(op, x_zero_point, dt, "X_zero_point"),
               _scale(op, y_scale, "Y_scale"), _zp(op, y_zero_point, dt, "Y_zero_point"))
        table = tables.get(key)
        if table is None:
            _, xs, xz, ys, yz = key
            v = _codes(dt).astype(_F32)
            v -= _F32.type(xz)
            v *= xs
            fn(v)
            if len(tables) >= _MAX_TABLES:
                tables.clear()
            table = tables[key] = _quantize_table(v, ys, yz, dt)
        return _lookup(table, x)

    return run


@kernel("QLinearSigmoid", since=1, domain=MS, factory=True, variant="qlinearsigmoid.lut")
def qlinear_sigmoid(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = quantize(sigmoid(dequantize(X))), through a 256-entry table per parameter set."""
    return _lut_kernel("QLinearSigmoid", lambda v: special.expit(v, out=v))


@kernel("QLinearLeakyRelu", since=1, domain=MS, factory=True, variant="qlinearleakyrelu.lut")
def qlinear_leaky_relu(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = quantize(leaky_relu(dequantize(X), alpha)), through a 256-entry table."""
    alpha = _F32.type(info.attrs.get("alpha", 0.01))

    def leaky(v: np.ndarray) -> None:
        np.multiply(v, alpha, out=v, where=v < 0)

    return _lut_kernel("QLinearLeakyRelu", leaky)


@kernel("QLinearGlobalAveragePool", since=1, domain=MS, factory=True,
        variant="qlinearglobalaveragepool.numpy")
def qlinear_global_average_pool(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Mean over the spatial dims (channels first, or last with channels_last=1), requantized:
    saturate(round((sum - n x_zp) * (x_scale / (y_scale n))) + y_zp); spatial dims become 1."""
    op = "QLinearGlobalAveragePool"
    channels_last = bool(info.attrs.get("channels_last", 0))

    def run(x, x_scale, x_zero_point, y_scale, y_zero_point) -> np.ndarray:
        dt = _qtype(op, x, "X")
        if x.ndim < 3:
            raise ValueError(f"{op}: X must have rank >= 3 (N, C, D1, ...), got {x.shape}")
        xs, ys = _scale(op, x_scale, "x_scale"), _scale(op, y_scale, "y_scale")
        xz = _zp(op, x_zero_point, dt, "x_zero_point")
        yz = _zp(op, y_zero_point, dt, "y_zero_point")
        if channels_last:
            n_, c = x.shape[0], x.shape[-1]
            out_shape = (n_,) + (1,) * (x.ndim - 2) + (c,)
            sums = x.reshape(n_, -1, c).sum(axis=1, dtype=np.int64)
            count = int(np.prod(x.shape[1:-1]))
        else:
            n_, c = x.shape[:2]
            out_shape = (n_, c) + (1,) * (x.ndim - 2)
            sums = x.reshape(n_, c, -1).sum(axis=2, dtype=np.int64)
            count = int(np.prod(x.shape[2:]))
        if count == 0:
            raise ValueError(f"{op}: X has no spatial elements to average ({x.shape})")
        v = (sums - xz * count).astype(_F32)
        v *= xs / (ys * _F32.type(count))
        np.rint(v, out=v)  # before the zero point, as MLAS requantizes: it decides ties
        v += _F32.type(yz)
        return _saturate(v, dt).reshape(out_shape)

    return run


@kernel("QLinearConcat", since=1, domain=MS, factory=True, variant="qlinearconcat.lut")
def qlinear_concat(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Concatenate (tensor, scale, zero point) triples along `axis`, each requantized to
    Y_scale / Y_zero_point (through a 256-entry table; copied when its parameters equal Y's)."""
    op = "QLinearConcat"
    if info.attrs.get("axis") is None:
        raise ValueError(f"{op}: attribute 'axis' is required")
    axis_attr = int(info.attrs["axis"])
    tables: dict[tuple, np.ndarray] = {}

    def run(y_scale, y_zero_point, *triples) -> np.ndarray:
        if not triples or len(triples) % 3:
            raise ValueError(f"{op}: inputs after Y_scale, Y_zero_point must be (tensor, scale, "
                             f"zero point) triples, got {len(triples)} inputs")
        if y_zero_point is None:
            raise ValueError(f"{op}: Y_zero_point is required (it sets the output type)")
        dt = _qtype(op, y_zero_point, "Y_zero_point")
        ys, yz = _scale(op, y_scale, "Y_scale"), _zp(op, y_zero_point, dt, "Y_zero_point")
        xs_ = triples[0::3]
        first = xs_[0]
        if first.ndim == 0:
            raise ValueError(f"{op}: inputs must have rank >= 1")
        ax = norm_axis(axis_attr, first.ndim, op)
        pieces = []
        for i, (x, s, z) in enumerate(zip(xs_, triples[1::3], triples[2::3])):
            if x.dtype != dt:
                raise TypeError(f"{op}: input {i} is {x.dtype} but Y_zero_point is {dt}")
            if x.ndim != first.ndim or any(
                a != b for j, (a, b) in enumerate(zip(x.shape, first.shape)) if j != ax
            ):
                raise ValueError(f"{op}: input {i} of shape {x.shape} does not match input 0 "
                                 f"{first.shape} outside axis {ax}")
            key = (_scale(op, s, f"scale of input {i}"), _zp(op, z, dt, f"zero point of input {i}"))
            if key == (ys, yz):
                pieces.append(x)
                continue
            table = tables.get(key)
            if table is None:
                if len(tables) >= _MAX_TABLES:
                    tables.clear()
                table = tables[key] = _requant_table(dt, key[0], key[1], ys, yz, dt)
            pieces.append(_lookup(table, x))
        return np.concatenate(pieces, axis=ax)

    return run


def _gemm_param(op: str, v: np.ndarray | None, n: int, what: str) -> np.ndarray | None:
    """b_scale / b_zero_point: a scalar or one value per column of op(B) (n of them)."""
    if v is None or v.size == 1:
        return v if v is None else v.reshape(())
    if v.ndim != 1 or v.shape[0] != n:
        raise ValueError(f"{op}: {what} must be a scalar or have one value per column of B "
                         f"({n}), got shape {v.shape}")
    return v


@kernel("QGemm", since=1, domain=MS, factory=True, variant="qgemm.blas")
def qgemm(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = alpha a_scale b_scale ((A' - a_zp) @ (B' - b_zp) + C), A' / B' transposed by transA /
    transB, C an int32 bias; float32 out, or requantized to y_scale / y_zero_point when given.

    The product is summed exactly (float32 while the sums stay below 2^24, else float64, then
    wrapped to int32 like the accumulator), made float32, then scaled in float32.
    """
    op = "QGemm"
    trans_a = bool(info.attrs.get("transA", 0))
    trans_b = bool(info.attrs.get("transB", 0))
    alpha = _F32.type(info.attrs.get("alpha", 1.0))
    b_const, bz_const = const_input(info, 3), const_input(info, 5)
    static_b = b_const is not None and (bz_const is not None or not _present(info, 5))
    memo: dict[tuple, np.ndarray] = {}

    def centered_b(b: np.ndarray, b_zp: np.ndarray | None, cdt: np.dtype) -> np.ndarray:
        key = (b.dtype, cdt)
        got = memo.get(key) if static_b else None
        if got is None:
            bt = b.T if trans_b else b
            got = bt.astype(cdt)
            if b_zp is not None:
                got -= _gemm_param(op, b_zp, bt.shape[1], "b_zero_point").astype(cdt)
            if static_b:
                memo[key] = got
        return got

    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point=None, c=None, y_scale=None,
            y_zero_point=None) -> np.ndarray:
        adt, bdt = _qtype(op, a, "A"), _qtype(op, b, "B")
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(f"{op}: A and B must be 2-D, got {a.shape} and {b.shape}")
        at = a.T if trans_a else a
        (m, k), (kb, n) = at.shape, (b.shape[::-1] if trans_b else b.shape)
        if k != kb:
            raise ValueError(f"{op}: A {a.shape} and B {b.shape} (transA={int(trans_a)}, "
                             f"transB={int(trans_b)}) do not multiply")
        az = _zp(op, a_zero_point, adt, "a_zero_point")
        if b_zero_point is not None and b_zero_point.dtype != bdt:
            raise TypeError(f"{op}: b_zero_point must be {bdt} like B, got {b_zero_point.dtype}")
        sa = _scale(op, a_scale, "a_scale")
        sb = _gemm_param(op, b_scale, n, "b_scale").astype(_F32)
        span_a = max(abs(v - az) for v in _RANGE[adt])
        exact32 = k * span_a * 255 < (1 << 24)
        cdt = _F32 if exact32 else _F64
        ac = at.astype(cdt)
        ac -= cdt.type(az)
        acc = ac @ centered_b(b, b_zero_point, cdt)
        if c is not None:
            if c.dtype != np.int32:
                raise TypeError(f"{op}: C must be int32, got {c.dtype}")
            try:
                shape = np.broadcast_shapes(c.shape, (m, n))
            except ValueError:
                shape = None
            if shape != (m, n):
                raise ValueError(f"{op}: C {c.shape} does not broadcast to Y ({m}, {n})")
        if not exact32 or c is not None:
            acc = acc.astype(np.int64)
            if c is not None:
                acc += c
            acc = acc.astype(np.int32).astype(_F32)
        scale = alpha * sa * sb
        if y_scale is None:
            if y_zero_point is not None:
                raise ValueError(f"{op}: y_zero_point is given without y_scale")
            acc *= scale
            return acc
        if y_zero_point is None:
            raise ValueError(f"{op}: y_scale is given without y_zero_point (it sets the type)")
        ydt = _qtype(op, y_zero_point, "y_zero_point")
        acc *= scale / _scale(op, y_scale, "y_scale")
        np.rint(acc, out=acc)
        acc += _F32.type(_zp(op, y_zero_point, ydt, "y_zero_point"))
        return _saturate(acc, ydt)

    return run


@kernel("QLinearSoftmax", since=1, domain=MS, factory=True, variant="qlinearsoftmax.numpy")
def qlinear_softmax(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = quantize(softmax(dequantize(X))) over `axis` (opset >= 13, the `opset` attribute)
    or over the dims from `axis` on, flattened (opset < 13).

    Close to onnxruntime's steps: exponentials exp((x - max + s) x_scale) rounded to float32
    (s scales them up, leaving room for the row's sum), summed in order in float32, times
    floor(1 / y_scale) (onnxruntime's inverse scale; exact for the 1/256 that quantization
    tools write), divided by the sum, rounded half to even; then the zero point and
    saturation. Results match onnxruntime bit for bit except, rarely, by one step where
    several equal inputs make a value fall on a rounding tie.
    """
    op = "QLinearSoftmax"
    if info.attrs.get("opset") is None:
        raise ValueError(f"{op}: attribute 'opset' is required")
    opset = int(info.attrs["opset"])
    axis_attr = int(info.attrs.get("axis", -1 if opset >= 13 else 1))
    f32_max = np.finfo(_F32).max

    def exponentials(xs: np.float32, count: int) -> np.ndarray:
        """table[d + 255] = the scaled float32 exp(d x_scale), for d = x - max in [-255, 0];
        the scale (onnxruntime's, worked out in float32) leaves room for `count` of them."""
        headroom = np.log(f32_max / _F32.type(count)) - _F32.type(5)
        shift = float(max(_F32.type(0), headroom) / xs)
        d = np.arange(-255, 1, dtype=_F64)
        return np.exp((d + shift) * float(xs)).astype(_F32)

    def run(x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None) -> np.ndarray:
        dt = _qtype(op, x, "X")
        if y_scale is None or y_zero_point is None:
            raise ValueError(f"{op}: y_scale and y_zero_point are required")
        ydt = _qtype(op, y_zero_point, "y_zero_point")
        if ydt != dt:
            raise TypeError(f"{op}: X is {dt} but y_zero_point is {ydt}")
        xs, ys = _scale(op, x_scale, "X_scale"), _scale(op, y_scale, "y_scale")
        yz = _zp(op, y_zero_point, dt, "y_zero_point")
        _zp(op, x_zero_point, dt, "x_zero_point")  # cancels out: checked only
        if x.ndim == 0:
            raise ValueError(f"{op}: X must have rank >= 1")
        ax = norm_axis(axis_attr, x.ndim, op)
        if x.size == 0:
            return x.copy()
        v = x.astype(np.int16)
        if opset < 13:
            v = v.reshape(int(np.prod(x.shape[:ax], dtype=np.int64)), -1)
            ax = 1
        v -= v.max(axis=ax, keepdims=True)
        v += 255
        e = exponentials(xs, v.shape[ax])[v]
        total = np.cumsum(e, axis=ax, dtype=_F32).take([-1], axis=ax)  # in order, as a loop
        e = e * _F64.type(np.floor(_F32.type(1) / ys))  # float64: never overflows
        e /= total
        np.rint(e, out=e)  # before the zero point, as onnxruntime: ties go to the even step
        e += _F32.type(yz)
        return _saturate(e, dt).reshape(x.shape)

    return run


@kernel("QLinearAveragePool", since=1, domain=MS, factory=True,
        variant="qlinearaveragepool.numpy")
def qlinear_average_pool(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = quantize(AveragePool(dequantize(X))) with AveragePool's attributes; channels_last=1
    pools an (N, D1, ..., C) tensor.

    As onnxruntime: each window is summed in float32 one tap at a time in row-major kernel
    order (a float AveragePool's separable sums round differently, which moves ties), then
    divided by the window count and y_scale, and y_zero_point added before rounding."""
    from onnxkiln.providers.cpu.pool import _argmax_taps

    op = "QLinearAveragePool"
    attrs = {k: v for k, v in info.attrs.items() if k != "channels_last"}
    channels_last = bool(info.attrs.get("channels_last", 0))
    include_pad = bool(attrs.get("count_include_pad") or 0)
    if attrs.get("kernel_shape") is None:
        raise ValueError(f"{op}: attribute 'kernel_shape' is required")

    def pool(v: np.ndarray) -> np.ndarray:
        geo = pool_geometry(attrs, v.shape)
        if geo.needs_pad:
            v = padded_copy(v, geo, 0, _F32)
        taps = _argmax_taps(geo)
        acc = v[taps[0]].copy()
        for tap in taps[1:]:
            acc += v[tap]
        return np.divide(acc, np.asarray(window_counts(geo, include_pad), _F32), out=acc)

    def run(x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None) -> np.ndarray:
        dt = _qtype(op, x, "X")
        if y_scale is None:
            raise ValueError(f"{op}: y_scale is required")
        if x.ndim < 3:
            raise ValueError(f"{op}: X must have rank >= 3, got {x.shape}")
        xs, ys = _scale(op, x_scale, "x_scale"), _scale(op, y_scale, "y_scale")
        xz = _zp(op, x_zero_point, dt, "x_zero_point")
        yz = _zp(op, y_zero_point, dt, "y_zero_point")
        v = x.astype(_F32)
        v -= _F32.type(xz)
        v *= xs
        if channels_last:
            v = np.moveaxis(v, -1, 1)
        y = pool(v)
        if channels_last:
            y = np.moveaxis(y, 1, -1)
        y /= ys
        y += _F32.type(yz)
        return _saturate(y, dt)

    return run


@kernel("QLinearWhere", since=1, domain=MS, factory=True, variant="qlinearwhere.lut")
def qlinear_where(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Z = where(condition, X, Y), X and Y requantized to z_scale / z_zero_point (256-entry
    tables; copied when their parameters equal Z's); the three broadcast together."""
    op = "QLinearWhere"
    tables: dict[tuple, np.ndarray] = {}

    def requant(v, s, z, dt, target, what) -> np.ndarray:
        if v.dtype != dt:
            raise TypeError(f"{op}: {what} is {v.dtype} but z_zero_point is {dt}")
        key = (_scale(op, s, f"{what}_scale"), _zp(op, z, dt, f"{what}_zero_point"))
        if key == target:
            return v
        table = tables.get((dt, *key, *target))
        if table is None:
            if len(tables) >= _MAX_TABLES:
                tables.clear()
            table = tables[(dt, *key, *target)] = _requant_table(dt, *key, *target, dt)
        return _lookup(table, v)

    def run(condition, x, x_scale, x_zero_point, y, y_scale, y_zero_point, z_scale,
            z_zero_point) -> np.ndarray:
        if condition.dtype != np.bool_:
            raise TypeError(f"{op}: condition must be bool, got {condition.dtype}")
        dt = _qtype(op, z_zero_point, "z_zero_point")
        target = (_scale(op, z_scale, "z_scale"), _zp(op, z_zero_point, dt, "z_zero_point"))
        xv = requant(x, x_scale, x_zero_point, dt, target, "x")
        yv = requant(y, y_scale, y_zero_point, dt, target, "y")
        try:
            return np.where(condition, xv, yv)
        except ValueError as e:
            raise ValueError(f"{op}: condition {condition.shape}, X {x.shape} and Y {y.shape} "
                             "do not broadcast") from e

    return run
