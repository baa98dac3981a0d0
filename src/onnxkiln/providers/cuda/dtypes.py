"""ONNX element types <-> torch dtypes, and the `supports` helpers that decline the rest."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import NodeInfo

__all__ = [
    "FLOAT8",
    "FLOATS",
    "HELD",
    "INTS",
    "SERVED",
    "SUB_BYTE",
    "from_torch",
    "needs",
    "to_torch",
    "to_torch_dtype",
    "unsupported_reason",
]

_TORCH: dict[DataType, torch.dtype] = {
    DataType.FLOAT: torch.float32,
    DataType.DOUBLE: torch.float64,
    DataType.FLOAT16: torch.float16,
    DataType.BFLOAT16: torch.bfloat16,
    DataType.INT8: torch.int8,
    DataType.INT16: torch.int16,
    DataType.INT32: torch.int32,
    DataType.INT64: torch.int64,
    DataType.UINT8: torch.uint8,
    DataType.BOOL: torch.bool,
    # storage and conversion only: kernels that compute on them say so in `supports`
    DataType.FLOAT8E4M3FN: torch.float8_e4m3fn,
    DataType.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz,
    DataType.FLOAT8E5M2: torch.float8_e5m2,
    DataType.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
    # torch has no arithmetic on these (see _WHY), but moves, views and conversions
    DataType.UINT16: torch.uint16,
    DataType.UINT32: torch.uint32,
    DataType.UINT64: torch.uint64,
    # torch's shell dtypes, one element per byte (the value as an int8/uint8 would hold it):
    # no kernel computes on them; Cast, CastLike, Quantize/DequantizeLinear go through the
    # byte-wide view (to_carrier / from_carrier)
    DataType.INT4: torch.int4,
    DataType.UINT4: torch.uint4,
    DataType.INT2: torch.int2,
    DataType.UINT2: torch.uint2,
}
# shell dtype -> (byte-wide carrier dtype, bits, signed)
_SUB_BYTE = {torch.int4: (torch.int8, 4, True), torch.uint4: (torch.uint8, 4, False),
             torch.int2: (torch.int8, 2, True), torch.uint2: (torch.uint8, 2, False)}
_FROM_TORCH = {v: k for k, v in _TORCH.items()}

FLOATS = frozenset({DataType.FLOAT, DataType.DOUBLE, DataType.FLOAT16, DataType.BFLOAT16})
INTS = frozenset({DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64,
                  DataType.UINT8})
FLOAT8 = frozenset({DataType.FLOAT8E4M3FN, DataType.FLOAT8E4M3FNUZ, DataType.FLOAT8E5M2,
                    DataType.FLOAT8E5M2FNUZ})
SUB_BYTE = frozenset({DataType.INT4, DataType.UINT4, DataType.INT2, DataType.UINT2})
SERVED = FLOATS | INTS | {DataType.BOOL}
# every element type a torch tensor can hold here (storage-only types included: the kernels'
# own `supports` decline the ones they do not compute on)
HELD = SERVED | FLOAT8 | SUB_BYTE | {DataType.UINT16, DataType.UINT32, DataType.UINT64}
NUMERIC = FLOATS | INTS

_WHY: dict[DataType, str] = {
    DataType.UINT16: "torch has no uint16 arithmetic on CUDA",
    DataType.UINT32: "torch has no uint32 arithmetic on CUDA",
    DataType.UINT64: "torch has no uint64 arithmetic on CUDA",
    DataType.STRING: "torch has no string tensors",
    DataType.FLOAT4E2M1: "torch has no one-per-byte float4e2m1 tensors (the CPU provider "
                         "runs this node)",
    DataType.FLOAT8E8M0: "torch has no float8e8m0 tensors (the CPU provider runs this node)",
    DataType.COMPLEX64: "complex64 is not supported by the torch kernels",
    DataType.COMPLEX128: "complex128 is not supported by the torch kernels",
}


def to_torch_dtype(dt: DataType | int | np.dtype) -> torch.dtype:
    """The torch dtype of an ONNX element type (or numpy dtype); KeyError if none."""
    if isinstance(dt, np.dtype):
        from onnxkiln.dtypes import from_numpy

        dt = from_numpy(dt)
    try:
        return _TORCH[DataType(dt)]
    except (KeyError, ValueError):
        raise KeyError(f"ONNX element type {DataType(dt)} has no torch kernel dtype") from None


def from_torch(dt: torch.dtype) -> DataType:
    """The ONNX element type of a torch dtype."""
    return _FROM_TORCH[dt]


def to_torch(a: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """A host numpy array as a torch tensor on `device` (bfloat16, float8 through their bits).

    On torch's CPU device the tensor shares the array's memory when the array is writable
    and C-contiguous (kernels never write their inputs); otherwise it is a copy."""
    a = np.asarray(a)
    dt = DataType(_np_type(a.dtype))
    if not a.flags.c_contiguous or not a.flags.writeable:  # negative strides, read-only maps
        a = np.array(a, copy=True, order="C")
    if dt == DataType.BFLOAT16:
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    elif dt in FLOAT8:
        t = torch.from_numpy(a.view(np.uint8)).view(_TORCH[dt])
    elif dt in SUB_BYTE:  # shell dtypes cannot be copied: move the carrier, then view
        carrier = _SUB_BYTE[_TORCH[dt]][0]
        wide = a.astype(np.int8 if carrier == torch.int8 else np.uint8)
        return torch.from_numpy(wide).to(device=device).view(_TORCH[dt])
    else:
        t = torch.from_numpy(a)
    return t.to(device=device, dtype=_TORCH[dt])


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A torch tensor as a host numpy array of the matching ONNX dtype (copies to host)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype in _SUB_BYTE:
        from onnxkiln.dtypes import to_numpy as onnx_to_numpy

        wide = to_carrier(t).cpu().numpy()
        return wide.astype(onnx_to_numpy(from_torch(t.dtype)))
    if t.dtype in _F8_NUMPY:
        return t.contiguous().view(torch.uint8).numpy().view(_F8_NUMPY[t.dtype])
    return t.numpy()


def is_sub_byte(dt: torch.dtype) -> bool:
    return dt in _SUB_BYTE


def to_carrier(t: torch.Tensor) -> torch.Tensor:
    """A sub-byte (shell dtype) tensor as its int8/uint8 view; other tensors as they are."""
    info = _SUB_BYTE.get(t.dtype)
    return t if info is None else t.view(info[0])


def from_carrier(v: torch.Tensor, dst: torch.dtype) -> torch.Tensor:
    """Integer values wrapped into the sub-byte type `dst` (two's complement, as a cast to
    int4/uint4/int2/uint2 does) and viewed as it."""
    carrier, bits, signed = _SUB_BYTE[dst]
    v = v.to(torch.int32)
    if signed:
        half = 1 << (bits - 1)
        v = torch.bitwise_and(v + half, (1 << bits) - 1) - half
    else:
        v = torch.bitwise_and(v, (1 << bits) - 1)
    return v.to(carrier).view(dst)


def _f8_numpy() -> dict[torch.dtype, np.dtype]:
    from onnxkiln.dtypes import to_numpy as onnx_to_numpy

    return {_TORCH[d]: onnx_to_numpy(d) for d in FLOAT8}


_F8_NUMPY = _f8_numpy()


def _np_type(dt: np.dtype) -> DataType:
    from onnxkiln.dtypes import from_numpy

    return from_numpy(dt)


def _name(dt: DataType) -> str:
    return str(dt)


def unsupported_reason(info: NodeInfo, allowed: Iterable[DataType] = SERVED,
                       skip_inputs: Iterable[int] = (), what: str = "") -> str | None:
    """Why the node's known input/output dtypes are not all in `allowed`, else None.

    `skip_inputs` are positions not checked (host inputs such as shapes, indices checked
    separately). Unknown dtypes (None) pass: the kernel then meets the real tensor.
    """
    allowed = frozenset(allowed)
    skip = frozenset(skip_inputs)
    pairs = [(d, f"input {i}") for i, d in enumerate(info.input_dtypes) if i not in skip]
    pairs += [(d, f"output {i}") for i, d in enumerate(info.output_dtypes)]
    for dt, where in pairs:
        if dt is None or dt in allowed:
            continue
        why = _WHY.get(dt)
        if why is None:
            if dt in _TORCH:
                why = f"{info.op_type} on {dt} is not supported by the torch kernels"
                if what:
                    why += f" ({what})"
            else:
                why = f"dtype {dt} not supported by torch kernels"
        return f"{why} ({where})"
    return None


def needs(allowed: Iterable[DataType] = SERVED, skip_inputs: Iterable[int] = (),
          what: str = "", extra: Callable[[NodeInfo], str | None] | None = None
          ) -> Callable[[NodeInfo], str | None]:
    """A `supports` callable: dtype check, then an optional attribute check `extra`."""
    allowed = frozenset(allowed)
    skip = tuple(skip_inputs)

    def supports(info: NodeInfo) -> str | None:
        reason = unsupported_reason(info, allowed, skip, what)
        if reason is None and extra is not None:
            reason = extra(info)
        return reason

    return supports
