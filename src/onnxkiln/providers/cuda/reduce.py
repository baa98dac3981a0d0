"""Torch kernels: Reduce* (every opset; axes attribute or host axes input) and ArgMax/ArgMin.

float16/bfloat16 accumulate in float32. Integer Sum/Prod stay in their type (wrapping on
overflow; the CPU provider saturates int8..int32). Max/Min propagate NaN wherever it is (the
CPU provider lets only a leading NaN win). Empty reductions give the ONNX identities.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._util import axis_of, ints, up
from onnxkiln.providers.cuda.dtypes import FLOATS, NUMERIC, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor
_EXACT_INTS = frozenset({DataType.INT32, DataType.INT64})


def _axes(raw: list[int] | None, rank: int, noop: bool) -> tuple[int, ...]:
    if not raw:
        return () if noop else tuple(range(rank))
    return tuple(sorted({axis_of(a, rank, "Reduce") for a in raw}))


def _sum(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    return torch.sum(x, dim=dims, keepdim=True, dtype=x.dtype)


def _prod(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    for d in dims:
        x = torch.prod(x, dim=d, keepdim=True, dtype=x.dtype)
    return x


def _extreme(fn, fill_float: float, info_fn):
    def run(x: Tensor, dims: tuple[int, ...]) -> Tensor:
        if any(x.shape[d] == 0 for d in dims):
            shape = [1 if i in dims else s for i, s in enumerate(x.shape)]
            if x.dtype == torch.bool:
                fill = fill_float > 0  # empty max: False, empty min: True
            else:
                fill = fill_float if x.dtype.is_floating_point else info_fn(x.dtype)
            return torch.full(shape, fill, dtype=x.dtype, device=x.device)
        return fn(x, dim=dims, keepdim=True)
    return run


def _log_sum_exp(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    if any(x.shape[d] == 0 for d in dims):
        return torch.log(_sum(x, dims))
    return torch.logsumexp(x, dim=dims, keepdim=True)


_REDUCERS: dict[str, tuple[Callable[[Tensor, tuple[int, ...]], Tensor], frozenset]] = {
    "ReduceSum": (_sum, FLOATS | _EXACT_INTS),
    "ReduceMean": (lambda x, d: torch.mean(x, dim=d, keepdim=True) if x.numel() else
                   torch.zeros([1 if i in d else s for i, s in enumerate(x.shape)],
                               dtype=x.dtype, device=x.device), FLOATS),
    "ReduceProd": (_prod, FLOATS | _EXACT_INTS),
    "ReduceMax": (_extreme(torch.amax, -math.inf, lambda dt: torch.iinfo(dt).min),
                  NUMERIC | {DataType.BOOL}),
    "ReduceMin": (_extreme(torch.amin, math.inf, lambda dt: torch.iinfo(dt).max),
                  NUMERIC | {DataType.BOOL}),
    "ReduceL1": (lambda x, d: _sum(torch.abs(x), d), FLOATS | _EXACT_INTS),
    "ReduceL2": (lambda x, d: torch.sqrt(_sum(x * x, d)), FLOATS),
    "ReduceSumSquare": (lambda x, d: _sum(x * x, d), FLOATS | _EXACT_INTS),
    "ReduceLogSum": (lambda x, d: torch.log(_sum(x, d)), FLOATS),
    "ReduceLogSumExp": (_log_sum_exp, FLOATS),
}


def _factory(info: NodeInfo) -> Callable[..., Tensor]:
    reducer = _REDUCERS[info.op_type][0]
    keepdims = bool(info.attrs.get("keepdims", 1))
    noop = bool(info.attrs.get("noop_with_empty_axes") or 0)
    attr_axes = info.attrs.get("axes")
    attr_axes = None if attr_axes is None else ints(attr_axes)

    def run(x: Tensor, axes=None) -> Tensor:
        raw = attr_axes if axes is None else ints(axes)
        dims = _axes(raw, x.ndim, noop)
        if not dims:
            return x.clone()
        y = reducer(up(x), dims).to(x.dtype)
        if not keepdims:
            y = y.reshape([s for i, s in enumerate(y.shape) if i not in dims])
        return y

    return run


def _register(op: str, input_since: int) -> None:
    allowed = _REDUCERS[op][1]
    doc = f"{op} over the given axes (all when empty), keepdims attribute."
    kernel(op, since=1, until=input_since - 1, factory=True,
           supports=needs(allowed))(_doc(_factory, doc))
    kernel(op, since=input_since, factory=True, host_inputs=(1,),
           supports=needs(allowed, skip_inputs=(1,)))(_doc(_factory, doc))


def _doc(fn, doc):
    def factory(info: NodeInfo):
        return fn(info)
    factory.__doc__ = doc
    return factory


for _op in _REDUCERS:
    _register(_op, 13 if _op == "ReduceSum" else 18)


def _arg_factory(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    axis = int(info.attrs.get("axis") or 0)
    keepdims = bool(info.attrs.get("keepdims", 1))
    last = bool(info.attrs.get("select_last_index") or 0)
    fn = torch.argmax if info.op_type == "ArgMax" else torch.argmin
    op = info.op_type

    def run(x: Tensor) -> Tensor:
        a = axis_of(axis, x.ndim, op)
        if last:
            n = x.shape[a]
            y = (n - 1) - fn(torch.flip(x, (a,)), dim=a, keepdim=keepdims)
        else:
            y = fn(x, dim=a, keepdim=keepdims)
        return y

    return run


@kernel("ArgMax", since=1, factory=True, supports=needs(NUMERIC))
def arg_max(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """int64 index of the first (or last: select_last_index) maximum along `axis`."""
    return _arg_factory(info)


@kernel("ArgMin", since=1, factory=True, supports=needs(NUMERIC))
def arg_min(info: NodeInfo) -> Callable[[Tensor], Tensor]:
    """int64 index of the first (or last: select_last_index) minimum along `axis`."""
    return _arg_factory(info)
