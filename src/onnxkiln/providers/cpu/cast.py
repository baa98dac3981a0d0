"""CPU kernels: Cast and CastLike between every ONNX element type numpy can hold."""

from __future__ import annotations

import re
from collections.abc import Callable

import ml_dtypes
import numpy as np

from onnxkiln.dtypes import DataType, to_numpy
from onnxkiln.ops.attrs import attr_str, decode_strings
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.registry import kernel

__all__ = ["cast", "cast_like", "target_type"]

Converter = Callable[[np.ndarray], np.ndarray]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I32 = np.dtype(np.int32)
_I64 = np.dtype(np.int64)
_U64 = np.dtype(np.uint64)
_FLOAT8 = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_ML_FLOATS = _FLOAT8 | {
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float4_e2m1fn),
    _E8M0,
}
_SMALL_INTS = frozenset(
    np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2)
)
# Float -> narrow int goes through a C-style int32 conversion and then
# wraps, which is what onnxruntime's static_cast produces on x86 for out-of-range values.
_VIA_INT = {
    np.dtype(np.int8): _I32,
    np.dtype(np.uint8): _I32,
    np.dtype(np.int16): _I32,
    np.dtype(np.uint16): _I32,
}
_ROUND_MODES = ("up", "down", "nearest")


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt in _ML_FLOATS


def _is_string(dt: np.dtype) -> bool:
    return dt.kind in "OUS"


def target_type(to: int | str | bytes) -> DataType:
    """The `to` attribute as a DataType (opset 1 spells it as a name such as "FLOAT")."""
    name = attr_str(to)
    if isinstance(name, str):
        try:
            return DataType[name.upper()]
        except KeyError:
            raise ValueError(f"Cast: unknown target type name {name!r}") from None
    return DataType(int(name))


def _format_float(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (np.inf, -np.inf):
        return "INF" if v > 0 else "-INF"
    return f"{v:.8g}"


def _to_string(x: np.ndarray) -> np.ndarray:
    """Numbers as onnxruntime prints them: %.8g floats, NaN/INF/-INF, bools as 1/0."""
    dt = x.dtype
    if dt.kind == "S":
        return decode_strings(x)
    if _is_string(dt):
        return x.astype(object)
    if dt.kind == "b":
        vals = ["1" if v else "0" for v in x.reshape(-1).tolist()]
    elif _is_float(dt):
        vals = [_format_float(v) for v in x.astype(_F64).reshape(-1).tolist()]
    else:
        vals = [str(v) for v in x.astype(_I64 if dt in _SMALL_INTS else dt).reshape(-1).tolist()]
    out = np.empty(len(vals), dtype=object)
    out[:] = vals
    return out.reshape(x.shape)


_FLOAT_PREFIX = re.compile(
    r"\s*([+-]?(?:0x(?:[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p[+-]?\d+)?"
    r"|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?|inf(?:inity)?|nan))",
    re.IGNORECASE,
)
_INT_PREFIX = re.compile(r"\s*([+-]?\d+)")


def _text(s: object) -> str:
    return s.decode("utf-8") if isinstance(s, (bytes, bytearray)) else str(s)


def _parse_float(s: object) -> float:
    """strtod-like: the longest numeric prefix (decimal, hex, inf/infinity, nan)."""
    t = _text(s)
    if "_" not in t:
        try:
            return float(t)
        except ValueError:
            pass
    m = _FLOAT_PREFIX.match(t)
    if m is None:
        raise ValueError(f"Cast: cannot convert string {t!r} to a floating-point number")
    num = m.group(1)
    if num.lstrip("+-")[:2].lower() == "0x":
        return float.fromhex(num)
    return float(num)


def _parse_int(s: object, unsigned: bool) -> int:
    """stoll/stoull-like: the leading decimal integer; unsigned wraps negatives."""
    t = _text(s)
    m = _INT_PREFIX.match(t)
    if m is None:
        if t.strip().lower() in ("true", "false"):
            return int(t.strip().lower() == "true")
        raise ValueError(f"Cast: cannot convert string {t!r} to an integer")
    v = int(m.group(1))
    if unsigned:
        if abs(v) >= 1 << 64:
            raise ValueError(f"Cast: string {t!r} is out of range for uint64")
        return v & ((1 << 64) - 1)
    if not -(1 << 63) <= v < 1 << 63:
        raise ValueError(f"Cast: string {t!r} is out of range for int64")
    return v


def _from_string(x: np.ndarray, dst: np.ndarray, saturate: int, round_mode: str) -> np.ndarray:
    items = x.reshape(-1).tolist()
    if _is_float(dst):
        vals = np.array([_parse_float(s) for s in items], dtype=_F64).reshape(x.shape)
        return _numeric_converter(_F64, dst, saturate, round_mode)(vals)
    if dst.kind == "b":
        return np.array([_parse_int(s, True) != 0 for s in items], dtype=bool).reshape(x.shape)
    unsigned = dst.kind == "u" or dst.name.startswith("uint")
    wide = _U64 if unsigned else _I64
    vals = np.array([_parse_int(s, unsigned) for s in items], dtype=wide).reshape(x.shape)
    return vals if dst == wide else vals.astype(dst)


def _to_float8(x: np.ndarray, dst: np.dtype, saturate: int) -> np.ndarray:
    if x.dtype != _F32:
        with np.errstate(over="ignore"):
            x = x.astype(_F32)
    f = x
    if saturate:
        top = float(ml_dtypes.finfo(dst).max)
        f = np.clip(f, -top, top)
    return f.astype(dst)


def _to_e8m0(x: np.ndarray, saturate: int, round_mode: str) -> np.ndarray:
    """Power-of-two scale: exponent of |x| rounded by `round_mode`; NaN is 0xFF.

    Follows the spec's table: with saturate, 0 and values below 2^-127 give 0x00, inf and
    values above 2^127 give 0xFE; without saturate all of those give NaN (0xFF).
    """
    f = np.abs(x.astype(_F64))
    mant, exp = np.frexp(f)
    exp = exp.astype(_I64) + 126  # f = (2*mant) * 2^(exp-1); biased exponent is exp-1+127
    frac = mant * 2 - 1
    if round_mode == "up":
        exp += frac > 0
    elif round_mode == "nearest":
        exp += frac >= 0.5
    finite = np.isfinite(f)
    low, high = (0, 254) if saturate else (255, 255)
    bits = np.where(exp > 254, high, np.where(exp < 0, low, exp))
    bits = np.where(f == 0, low, bits)
    bits = np.where(finite, bits, np.where(np.isnan(f), 255, high))
    return bits.astype(np.uint8).view(_E8M0)


def _numeric_converter(src: np.dtype, dst: np.dtype, saturate: int, round_mode: str) -> Converter:
    """The conversion between two non-string dtypes, chosen once."""
    if dst == _E8M0:
        return lambda x: _to_e8m0(x, saturate, round_mode)
    if dst in _FLOAT8:
        return lambda x: _to_float8(x, dst, saturate)
    if dst.kind == "b":
        return lambda x: x.astype(bool)
    if src in _SMALL_INTS:
        return lambda x: x.astype(dst)
    if src in _ML_FLOATS or src == _F16:
        inner = _numeric_converter(_F32, dst, saturate, round_mode)
        return lambda x: inner(x.astype(_F32))
    if _is_float(src) and not _is_float(dst):
        mid = _VIA_INT.get(dst)

        def float_to_int(x: np.ndarray) -> np.ndarray:
            with np.errstate(invalid="ignore", over="ignore"):
                return x.astype(dst) if mid is None else x.astype(mid).astype(dst)

        return float_to_int
    if src != _F32 and dst.itemsize < 4 and _is_float(dst):
        # onnxruntime narrows to half/bfloat16 through float (rounding twice)
        def via_float(x: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore"):
                return x.astype(_F32).astype(dst)

        return via_float

    if _is_float(dst) and (dst.itemsize < 4 or (_is_float(src) and dst.itemsize < src.itemsize)):

        def narrowing(x: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore"):
                return x.astype(dst)

        return narrowing
    return lambda x: x.astype(dst)  # cannot overflow: no errstate (it costs ~3 us a call)


def _converter(src: np.dtype, dst: np.dtype, saturate: int, round_mode: str) -> Converter:
    if src == dst:
        return lambda x: x
    if dst.kind == "O":
        return _to_string
    if _is_string(src):
        return lambda x: _from_string(x, dst, saturate, round_mode)
    return _numeric_converter(src, dst, saturate, round_mode)


def _cast_fn(
    src: np.dtype | None, dst: np.dtype, saturate: int, round_mode: str
) -> Callable[..., np.ndarray]:
    """A kernel casting to `dst`: the converter for the input dtype known at plan time, else
    chosen per call, or once per input signature (specialize)."""

    def dynamic(x: np.ndarray) -> np.ndarray:
        return _converter(x.dtype, dst, saturate, round_mode)(x)

    def specialize(dtypes, shapes, consts) -> Converter | None:
        return None if dtypes[0] is None else _converter(dtypes[0], dst, saturate, round_mode)

    if src is None:
        dynamic.specialize = specialize
        return dynamic
    static = _converter(src, dst, saturate, round_mode)

    def run(x: np.ndarray) -> np.ndarray:
        return static(x) if x.dtype == src else dynamic(x)

    run.specialize = specialize
    return run


def _options(info: NodeInfo) -> tuple[int, str]:
    saturate = info.attrs.get("saturate")
    round_mode = attr_str(info.attrs.get("round_mode")) or "up"
    if round_mode not in _ROUND_MODES:
        raise ValueError(f"Cast: round_mode must be one of {_ROUND_MODES}, got {round_mode!r}")
    return (1 if saturate is None else int(saturate)), round_mode


def _known_dtype(info: NodeInfo, i: int) -> np.dtype | None:
    dts = info.input_dtypes
    if i < len(dts) and dts[i] is not None:
        try:
            return to_numpy(dts[i])
        except KeyError:
            return None
    return None


@kernel("Cast", since=1, factory=True, view=True)
def cast(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Convert to the `to` type; the input itself when it already has that type."""
    dst = to_numpy(target_type(info.attrs["to"]))
    saturate, round_mode = _options(info)
    return _cast_fn(_known_dtype(info, 0), dst, saturate, round_mode)


@kernel("CastLike", since=15, factory=True, view=True)
def cast_like(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Convert the first input to the element type of the second."""
    saturate, round_mode = _options(info)
    src = _known_dtype(info, 0)
    dst = _known_dtype(info, 1)
    if dst is not None:
        fn = _cast_fn(src, dst, saturate, round_mode)
        return lambda x, target_type: fn(x)

    def convert_to(src: np.dtype, target: np.dtype) -> Converter:
        d = np.dtype(object) if _is_string(target) else target
        return _converter(src, d, saturate, round_mode)

    def run(x: np.ndarray, target_type: np.ndarray) -> np.ndarray:
        return convert_to(x.dtype, target_type.dtype)(x)

    def specialize(dtypes, shapes, consts) -> Callable[..., np.ndarray] | None:
        if dtypes[0] is None or dtypes[1] is None:
            return None
        fn = convert_to(dtypes[0], dtypes[1])
        return lambda x, target_type: fn(x)

    run.specialize = specialize
    return run
