"""Torch kernels: indexing (Gather*, Scatter*), TopK, CumSum, Trilu, Einsum, OneHot.

Eager calls check index bounds and raise IndexError naming the op, the bad index and the
valid range, like the CPU provider (one host sync per call, the price of a clear error);
negative indices wrap as in ONNX. Each indexing kernel carries `.unchecked`, the same kernel
without that sync (out-of-range indices clamped), for providers.capture_safe: its wrappers clamp
and flag a violation bit on the device first, so a captured replay never syncs or raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cuda._util import attr_str, axis_of, ints, up
from onnxkiln.providers.cuda.dtypes import FLOATS, NUMERIC, SERVED, needs
from onnxkiln.providers.cuda.registry import kernel
from onnxkiln.providers.cuda.unsigned import UNSIGNED, topk_values

Tensor = torch.Tensor
_IDX = frozenset({DataType.INT32, DataType.INT64})


def _norm_index(idx: Tensor, n: int) -> Tensor:
    """int64 indices with negatives wrapped and the rest clamped into [0, n) (no sync)."""
    idx = idx.to(torch.int64)
    idx = torch.where(idx < 0, idx + n, idx)
    return idx.clamp(0, max(n - 1, 0))


def _out_of_range(bad: Tensor, idx: Tensor, n: int, op: str, where: str,
                  shape: tuple[int, ...]) -> IndexError:
    value = int(idx[bad].reshape(-1)[0])
    return IndexError(f"{op}: index {value} is out of range for {where} of size {n} (data shape "
                      f"{list(shape)}; valid indices are [-{n}, {n - 1}])")


def _index(idx: Tensor, n: int, op: str, axis: int, shape: tuple[int, ...],
           check: bool) -> Tensor:
    """int64 indices with negatives wrapped; `check`: IndexError on any outside [-n, n)
    (one host sync), else clamped into range."""
    if not check:
        return _norm_index(idx, n)
    idx = idx.to(torch.int64)
    bad = (idx < -n) | (idx >= n)
    if bool(bad.any()):  # the one host sync of an eager call
        raise _out_of_range(bad, idx, n, op, f"axis {axis}", shape)
    return torch.where(idx < 0, idx + n, idx)


def _checked_pair(make: Callable[[bool], Callable[..., Tensor]]) -> Callable[..., Tensor]:
    """make(True), the eager kernel that raises, carrying make(False) as `.unchecked`."""
    run = make(True)
    run.unchecked = make(False)
    return run


def _index_types(*positions: int, allowed=SERVED, host=()):
    """supports: data dtypes in `allowed`, index inputs int32/int64."""
    def supports(info: NodeInfo) -> str | None:
        why = needs(allowed, skip_inputs=(*positions, *host))(info)
        if why:
            return why
        for p in positions:
            if p < len(info.input_dtypes) and info.input_dtypes[p] not in (None, *_IDX):
                return f"{info.op_type}: indices of type {info.input_dtypes[p]} are not served"
        return None
    return supports


@kernel("Gather", since=1, factory=True, supports=_index_types(1))
def gather(info: NodeInfo) -> Callable[[Tensor, Tensor], Tensor]:
    """x taken at `indices` along `axis` (IndexError outside [-n, n))."""
    axis = int(info.attrs.get("axis") or 0)

    def make(check: bool) -> Callable[[Tensor, Tensor], Tensor]:
        def run(x: Tensor, indices: Tensor) -> Tensor:
            a = axis_of(axis, x.ndim, "Gather")
            idx = _index(indices, x.shape[a], "Gather", a, tuple(x.shape), check)
            out = torch.index_select(x, a, idx.reshape(-1))
            return out.reshape((*x.shape[:a], *indices.shape, *x.shape[a + 1:]))
        return run

    return _checked_pair(make)


@kernel("GatherElements", since=11, factory=True, supports=_index_types(1))
def gather_elements(info: NodeInfo) -> Callable[[Tensor, Tensor], Tensor]:
    """out[i][j][k] = x[index[i][j][k]][j][k] along `axis` (IndexError outside [-n, n))."""
    axis = int(info.attrs.get("axis") or 0)

    def make(check: bool) -> Callable[[Tensor, Tensor], Tensor]:
        def run(x: Tensor, indices: Tensor) -> Tensor:
            a = axis_of(axis, x.ndim, "GatherElements")
            idx = _index(indices, x.shape[a], "GatherElements", a, tuple(x.shape), check)
            return torch.gather(x, a, idx)
        return run

    return _checked_pair(make)


def _linear_index(indices: Tensor, dims: tuple[int, ...], op: str, first: int,
                  shape: tuple[int, ...], check: bool) -> Tensor:
    """Row-major offsets of the (..., k) index tuples into `dims` (data dims first..first+k);
    `check`: IndexError on any component out of range (one host sync for all), else clamped."""
    k = indices.shape[-1]
    idx = indices.to(torch.int64)
    if check and k and idx.numel():
        bad = torch.zeros(idx.shape[:-1], dtype=torch.bool, device=idx.device)
        for j in range(k):
            bad = bad | (idx[..., j] < -dims[j]) | (idx[..., j] >= dims[j])
        if bool(bad.any()):  # the one host sync of an eager call
            for j in range(k):
                col = idx[..., j]
                wrong = (col < -dims[j]) | (col >= dims[j])
                if bool(wrong.any()):
                    raise _out_of_range(wrong, col, dims[j], op,
                                        f"axis {first + j} (component {j} of the index tuple)",
                                        shape)
    lin = torch.zeros(indices.shape[:-1], dtype=torch.int64, device=indices.device)
    for j in range(k):
        lin = lin * dims[j] + _norm_index(idx[..., j], dims[j])
    return lin


@kernel("GatherND", since=11, factory=True, supports=_index_types(1))
def gather_nd(info: NodeInfo) -> Callable[[Tensor, Tensor], Tensor]:
    """Slices of x at index tuples over its leading dims after `batch_dims` (IndexError when a
    component is out of range)."""
    b = int(info.attrs.get("batch_dims") or 0)

    def make(check: bool) -> Callable[[Tensor, Tensor], Tensor]:
        def run(x: Tensor, indices: Tensor) -> Tensor:
            k = indices.shape[-1]
            batch = x.shape[:b]
            nb = math.prod(batch)
            inner = x.shape[b:b + k]
            rest = x.shape[b + k:]
            xf = x.reshape(nb * math.prod(inner), *rest)
            idx = indices.reshape(nb, -1, k)
            lin = _linear_index(idx, tuple(inner), "GatherND", b, tuple(x.shape), check)
            lin = lin + torch.arange(nb, device=x.device).reshape(nb, 1) * math.prod(inner)
            out = torch.index_select(xf, 0, lin.reshape(-1))
            return out.reshape((*indices.shape[:-1], *rest))
        return run

    return _checked_pair(make)


_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _reduction(info: NodeInfo) -> str:
    red = attr_str(info.attrs.get("reduction")) or "none"
    if red != "none" and red not in _REDUCE:
        raise ValueError(f"{info.op_type}: unknown reduction {red!r}")
    return red


@kernel("ScatterND", since=11, factory=True, supports=_index_types(1))
def scatter_nd(info: NodeInfo) -> Callable[..., Tensor]:
    """A copy of data with `updates` written (or reduced) at the index tuples (IndexError when
    a component is out of range)."""
    red = _reduction(info)

    def make(check: bool) -> Callable[..., Tensor]:
        def run(data: Tensor, indices: Tensor, updates: Tensor) -> Tensor:
            k = indices.shape[-1]
            out = data.clone()
            lead = data.shape[:k]
            flat = out.view(math.prod(lead), *data.shape[k:])
            lin = _linear_index(indices, tuple(lead), "ScatterND", 0, tuple(data.shape),
                                check).reshape(-1)
            upd = updates.reshape(-1, *data.shape[k:])
            if red == "none":
                flat.index_copy_(0, lin, upd)
            elif red == "add":
                flat.index_add_(0, lin, upd)
            else:
                idx = lin.reshape(-1, *([1] * (upd.ndim - 1))).expand(upd.shape)
                flat.scatter_reduce_(0, idx, upd, _REDUCE[red], include_self=True)
            return out
        return run

    return _checked_pair(make)


def _scatter_elements(info: NodeInfo) -> Callable[..., Tensor]:
    axis = int(info.attrs.get("axis") or 0)
    red = _reduction(info) if info.op_type == "ScatterElements" else "none"
    op = info.op_type

    def make(check: bool) -> Callable[..., Tensor]:
        def run(data: Tensor, indices: Tensor, updates: Tensor) -> Tensor:
            a = axis_of(axis, data.ndim, op)
            idx = _index(indices, data.shape[a], op, a, tuple(data.shape), check)
            if red == "none":
                return torch.scatter(data, a, idx, updates)
            return torch.scatter_reduce(data, a, idx, updates, _REDUCE[red], include_self=True)
        return run

    return _checked_pair(make)


@kernel("ScatterElements", since=11, factory=True, supports=_index_types(1))
def scatter_elements(info: NodeInfo) -> Callable[..., Tensor]:
    """A copy of data with updates written (or reduced) at `indices` along `axis`
    (IndexError outside [-n, n))."""
    return _scatter_elements(info)


@kernel("Scatter", since=9, factory=True, supports=_index_types(1))
def scatter(info: NodeInfo) -> Callable[..., Tensor]:
    """Deprecated ScatterElements without reduction."""
    return _scatter_elements(info)


# ---------------------------------------------------------------------------------------
# TopK, CumSum, Trilu, Einsum, OneHot


def _topk(x: Tensor, k: int, axis: int, largest: bool) -> tuple[Tensor, Tensor]:
    a = axis_of(axis, x.ndim, "TopK")
    if not 0 <= k <= x.shape[a]:
        raise ValueError(f"TopK: k={k} out of range for an axis of size {x.shape[a]}")
    # a stable sort keeps the lower index first among equal values, as ONNX asks
    # (unsigned values sort through an order-preserving signed view)
    values, indices = topk_values(x, lambda v: torch.sort(v, dim=a, descending=largest,
                                                          stable=True))
    return values.narrow(a, 0, k).contiguous(), indices.narrow(a, 0, k).contiguous()


_TOPK_TYPES = needs(NUMERIC | UNSIGNED, skip_inputs=(1,))


@kernel("TopK", since=1, until=9, multi_output=True, supports=_TOPK_TYPES)
def topk_v1(x: Tensor, *, k: int, axis: int) -> tuple[Tensor, Tensor]:
    """The k largest along axis (k attribute), sorted descending."""
    return _topk(x, int(k), axis, True)


@kernel("TopK", since=10, factory=True, multi_output=True, host_inputs=(1,),
        supports=_TOPK_TYPES)
def topk(info: NodeInfo) -> Callable[..., tuple[Tensor, Tensor]]:
    """The K (host input) largest or smallest along axis, always sorted."""
    axis = int(info.attrs["axis"])
    largest = bool(info.attrs.get("largest", 1)) if info.opset >= 11 else True
    return lambda x, k: _topk(x, ints(k)[0], axis, largest)


def _scan_factory(info: NodeInfo, fn, identity: float) -> Callable[..., Tensor]:
    exclusive = bool(info.attrs.get("exclusive") or 0)
    reverse = bool(info.attrs.get("reverse") or 0)
    op = info.op_type

    def run(x: Tensor, axis) -> Tensor:
        a = axis_of(ints(axis)[0], x.ndim, op)
        src = up(torch.flip(x, (a,)) if reverse else x)
        if exclusive:  # shift by one: the identity first, the last element dropped
            n = src.shape[a]
            head = torch.full_like(src.narrow(a, 0, min(n, 1)), identity)
            src = torch.cat((head, src.narrow(a, 0, max(n - 1, 0))), dim=a)
        out = fn(src, dim=a, dtype=src.dtype)
        if reverse:
            out = torch.flip(out, (a,))
        return out.to(x.dtype)

    return run


_SCAN_TYPES = needs(NUMERIC - {DataType.UINT8, DataType.INT8, DataType.INT16}, skip_inputs=(1,))


@kernel("CumSum", since=11, factory=True, host_inputs=(1,), supports=_SCAN_TYPES)
def cumsum(info: NodeInfo) -> Callable[..., Tensor]:
    """Running sum along the host `axis`; exclusive and reverse variants."""
    return _scan_factory(info, torch.cumsum, 0)


@kernel("CumProd", since=26, factory=True, host_inputs=(1,), supports=_SCAN_TYPES)
def cumprod(info: NodeInfo) -> Callable[..., Tensor]:
    """Running product along the host `axis`; exclusive and reverse variants."""
    return _scan_factory(info, torch.cumprod, 1)


@kernel("NonZero", since=9, capture=CaptureSupport.DATA_DEPENDENT_SHAPE, supports=needs(SERVED))
def nonzero(x: Tensor) -> Tensor:
    """(rank, count) int64 indices of the non-zero elements (syncs: the count is data)."""
    if x.ndim == 0:
        x = x.reshape(1)
    return torch.nonzero(x).t().contiguous()


@kernel("Compress", since=9, factory=True, capture=CaptureSupport.DATA_DEPENDENT_SHAPE,
        supports=needs(SERVED))
def compress(info: NodeInfo) -> Callable[..., Tensor]:
    """Slices along `axis` (or elements of the flattened input) where condition is true;
    entries of condition past the axis are ignored (syncs: the count is data)."""
    axis = info.attrs.get("axis")

    def run(x: Tensor, condition: Tensor) -> Tensor:
        src, a = (x.reshape(-1), 0) if axis is None else (x, axis_of(int(axis), x.ndim,
                                                                        "Compress"))
        cond = condition.reshape(-1)[: src.shape[a]]
        return torch.index_select(src, a, torch.nonzero(cond).reshape(-1))

    return run


@kernel("Trilu", since=14, factory=True, host_inputs=(1,),
        supports=needs(SERVED, skip_inputs=(1,)))
def trilu(info: NodeInfo) -> Callable[..., Tensor]:
    """Upper (upper=1) or lower triangle of the last two dims, offset by host k."""
    upper = bool(info.attrs.get("upper", 1))

    def run(x: Tensor, k=None) -> Tensor:
        kk = 0 if k is None else ints(k)[0]
        return torch.triu(x, kk) if upper else torch.tril(x, kk)

    return run


kernel("Trilu", since=1, domain="com.microsoft", factory=True, host_inputs=(1,),
       supports=needs(SERVED, skip_inputs=(1,)))(trilu)


@kernel("Einsum", since=12, factory=True, supports=needs(FLOATS, what="no integer "
                                                         "matmul on CUDA"))
def einsum(info: NodeInfo) -> Callable[..., Tensor]:
    """torch.einsum of the equation (float16/bfloat16 in float32)."""
    eq = attr_str(info.attrs["equation"]).replace(" ", "")

    def run(*xs: Tensor) -> Tensor:
        y = torch.einsum(eq, *[up(x) for x in xs]).to(xs[0].dtype)
        if len(xs) == 1 and y.untyped_storage().data_ptr() == xs[0].untyped_storage().data_ptr():
            y = y.clone()  # a pure permutation/diagonal comes back as a view
        return y

    return run


@kernel("OneHot", since=9, factory=True, host_inputs=(1,), supports=needs(SERVED, (1,)))
def one_hot(info: NodeInfo) -> Callable[..., Tensor]:
    """values[1] where index == position along the new `axis`, else values[0]."""
    axis = int(info.attrs.get("axis", -1))

    def run(indices: Tensor, depth, values: Tensor) -> Tensor:
        d = int(np.asarray(depth).reshape(-1)[0])
        idx = indices.to(torch.int64)
        idx = torch.where(idx < 0, idx + d, idx)
        a = axis_of(axis, indices.ndim + 1, "OneHot")
        pos = torch.arange(d, device=indices.device).reshape(
            (d,) + (1,) * (indices.ndim - a))
        hit = idx.unsqueeze(a) == pos
        return torch.where(hit, values[1], values[0])

    return run
