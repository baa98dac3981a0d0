"""CPU kernels: onnxruntime's com.microsoft.nchwc ops, which its NCHWc layout transformer
writes into models saved with ORT_ENABLE_ALL (ReorderInput/ReorderOutput, Conv, the pools,
Upsample).

Blocked tensors keep a 4-D NCHW shape [N, Cp, H, W], Cp being C rounded up to the block b
(zero channels), with their memory in [N, Cp/b, H, W, b] order: channel c of pixel (h, w) is
element (c % b) of block c // b. Each kernel converts its blocked input to NCHW with the Cp
channels, runs onnxkiln's own Conv/pool/Resize kernel and blocks the result again
(correctness first: two copies per op; per-channel ops do not care about the padding
channels, which ReorderOutput drops).

Reordered Conv filters keep OIHW dims (output, and for blocked inputs input, channels padded)
with data in onnxruntime's filter orders: [O/b, I/b, kH, kW, b_in, b_out] for convs on
blocked inputs, [O/b, I, kH, kW, b_out] for depthwise convs and for convs reading plain NCHW
input (fewer input channels than a block, as onnxruntime decides). Nothing in a blocked
tensor records b, so every kernel uses the block onnxruntime's MLAS picks on this CPU (16
with AVX-512F, else 8), as onnxruntime itself does: such models are only valid on CPUs with
the block of the one that saved them (onnxruntime warns about that when it saves them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.conv import conv
from onnxkiln.providers.cpu.pool import average_pool, global_average_pool, max_pool
from onnxkiln.providers.cpu.registry import kernel
from onnxkiln.providers.cpu.resize import resize

__all__ = ["block_size", "from_blocked", "to_blocked"]

NCHWC = "com.microsoft.nchwc"


@functools.cache
def block_size() -> int:
    """The NCHWc block onnxruntime's MLAS uses on this CPU: 16 lanes with AVX-512F, else 8."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as feats
    return 16 if feats.get("AVX512F") else 8


def to_blocked(x: np.ndarray, b: int, channels_last: bool = False) -> np.ndarray:
    """NCHW... (or NHWC... when channels_last) to a blocked tensor: shape [N, Cp, spatial...]
    with Cp = C rounded up to b (zeros), memory in [N, Cp/b, spatial..., b] order."""
    if channels_last:
        x = np.moveaxis(x, -1, 1)
    n, c = x.shape[:2]
    cp = -(-c // b) * b
    if cp != c:
        x = np.concatenate([x, np.zeros((n, cp - c, *x.shape[2:]), x.dtype)], axis=1)
    y = np.moveaxis(x.reshape(n, cp // b, b, *x.shape[2:]), 2, -1)
    return np.ascontiguousarray(y).reshape(x.shape)


def from_blocked(x: np.ndarray, b: int, channels: int | None = None,
                 channels_last: bool = False) -> np.ndarray:
    """A blocked tensor back to NCHW... with its first `channels` channels (all if None)."""
    n, cp = x.shape[:2]
    y = np.moveaxis(np.ascontiguousarray(x).reshape(n, cp // b, *x.shape[2:], b), -1, 2)
    y = y.reshape(x.shape)
    if channels is not None:
        y = y[:, :channels]
    if channels_last:
        y = np.moveaxis(y, 1, -1)
    return np.ascontiguousarray(y)


def _blocked_input(op: str, x: np.ndarray) -> int:
    """The block size, after checking that `x` can be a blocked 4-D tensor."""
    b = block_size()
    if x.ndim != 4 or x.shape[1] % b:
        raise ValueError(f"nchwc {op}: input must be a 4-D blocked tensor with channels a "
                         f"multiple of {b}, got {x.shape}")
    return b


def _inner(info: NodeInfo, op: str, attrs: dict, opset: int, n_inputs: int,
           consts: tuple = ()) -> NodeInfo:
    """A NodeInfo for onnxkiln's standard-domain `op` with `attrs` and constant inputs."""
    consts = tuple(consts) + (None,) * (n_inputs - len(consts))
    return NodeInfo(name=info.name, op_type=op, domain="", opset=opset, attrs=attrs,
                    n_inputs=n_inputs, n_outputs=1, input_present=(True,) * n_inputs,
                    output_present=(True,), input_dtypes=(None,) * n_inputs,
                    output_dtypes=(None,), input_shapes=(None,) * n_inputs,
                    const_inputs=consts)


def _spatial_attrs(info: NodeInfo, names: tuple[str, ...]) -> dict:
    """The node's attributes among `names` that are set (empty lists count as unset)."""
    out = {}
    for k in names:
        v = info.attrs.get(k)
        if v is None or (isinstance(v, (list, tuple)) and not v):
            continue
        out[k] = v.decode() if isinstance(v, bytes) else v
    return out


# ---- weights ------------------------------------------------------------------------------

def unblock_weight(w: np.ndarray, b: int, blocked_in: bool) -> np.ndarray:
    """A reordered nchwc Conv filter (OIHW dims, blocked data) back to plain OIHW."""
    o, i = w.shape[:2]
    k = w.shape[2:]
    if o % b or (blocked_in and i % b):
        raise ValueError(f"nchwc Conv: filter {w.shape} is not padded to the block of {b}")
    if blocked_in:
        v = w.reshape(o // b, i // b, *k, b, b)  # [O/b, I/b, k..., b_in, b_out]
        v = np.moveaxis(v, (-1, -2), (1, 3))  # [O/b, b_out, I/b, b_in, k...]
    else:
        v = w.reshape(o // b, i, *k, b)  # [O/b, I, k..., b_out]
        v = np.moveaxis(v, -1, 1)
    return np.ascontiguousarray(v.reshape(w.shape))


# ---- activations --------------------------------------------------------------------------

_ACT_DEFAULTS = {"Clip": [float(np.finfo(np.float32).min), float(np.finfo(np.float32).max)],
                 "LeakyRelu": [0.01], "HardSigmoid": [0.2, 0.5]}


def _activation(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray] | None:
    """The fused activation the transformer folded into the Conv (None for none); params
    left out take the standard op's defaults."""
    name = info.attrs.get("activation")
    name = name.decode() if isinstance(name, bytes) else name
    if not name:
        return None
    params = [float(p) for p in (info.attrs.get("activation_params") or [])]
    params = params or _ACT_DEFAULTS.get(name, [])
    want = len(_ACT_DEFAULTS.get(name, []))
    if len(params) != want:
        raise ValueError(f"nchwc Conv: activation {name} takes {want} activation_params, "
                         f"got {params}")
    f32 = [np.float32(p) for p in params]
    acts = {
        "Relu": lambda y: np.maximum(y, 0, out=y),
        "Clip": lambda y: np.clip(y, f32[0], f32[1], out=y),
        "LeakyRelu": lambda y: np.where(y >= 0, y, y * f32[0]).astype(y.dtype),
        "HardSigmoid": lambda y: np.clip(y * f32[0] + f32[1], 0, 1).astype(y.dtype),
        "HardSwish": lambda y: (y * np.clip(y / np.float32(6) + np.float32(0.5), 0, 1)
                                ).astype(y.dtype),
        # the tanh form of the logistic: no overflow for large negative inputs
        "Sigmoid": lambda y: (np.float32(0.5) * (1 + np.tanh(y * np.float32(0.5)))
                              ).astype(y.dtype),
        "Tanh": lambda y: np.tanh(y, out=y),
    }
    if name not in acts:
        raise ValueError(f"nchwc Conv: unknown fused activation {name!r}")
    return acts[name]


# ---- kernels ------------------------------------------------------------------------------

@kernel("ReorderInput", since=1, domain=NCHWC, variant="nchwc.reorder")
def reorder_input(x: np.ndarray, *, channels_last=0) -> np.ndarray:
    """ReorderInput: NCHW (or NHWC with channels_last) to the blocked layout."""
    if x.ndim != 4:
        raise ValueError(f"nchwc ReorderInput: input must be 4-D, got {x.shape}")
    return to_blocked(x, block_size(), bool(channels_last))


@kernel("ReorderOutput", since=1, domain=NCHWC, variant="nchwc.reorder")
def reorder_output(x: np.ndarray, *, channels=0, channels_last=0) -> np.ndarray:
    """ReorderOutput: the blocked layout back to NCHW (or NHWC), keeping `channels`."""
    b = _blocked_input("ReorderOutput", x)
    c = int(channels)
    if c <= 0 or c > x.shape[1]:
        raise ValueError(f"nchwc ReorderOutput: channels={c} does not fit input {x.shape}")
    return from_blocked(x, b, c, bool(channels_last))


@kernel("Conv", since=1, domain=NCHWC, factory=True, variant="nchwc.conv")
def nchwc_conv(info: NodeInfo) -> Callable[..., np.ndarray]:
    """nchwc Conv: plain Conv on the unblocked input and filter, plus the Sum input (the
    residual add the transformer fused), then the fused activation."""
    attrs = _spatial_attrs(info, ("auto_pad", "kernel_shape", "dilations", "strides", "pads"))
    group = int(info.attrs.get("group") or 1)
    attrs["group"] = group
    act = _activation(info)
    w_const = info.const_inputs[1] if len(info.const_inputs) > 1 else None
    b_const = info.const_inputs[2] if len(info.const_inputs) > 2 else None

    @functools.cache
    def plan(b: int, filter_bi_bo: bool):
        w = unblock_weight(w_const, b, filter_bi_bo) if w_const is not None else None
        return conv(_inner(info, "Conv", attrs, 11, 3, (None, w, b_const))), w

    def finish(y: np.ndarray, b: int, s: np.ndarray | None) -> np.ndarray:
        y = to_blocked(y, b)
        if s is not None:
            if s.shape != y.shape:
                raise ValueError(f"nchwc Conv: Sum {s.shape} does not match output {y.shape}")
            y += s
        return act(y) if act is not None else y

    def run(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None,
            s: np.ndarray | None = None) -> np.ndarray:
        b, blocked_in, bi_bo = _conv_layout(x.shape, w.shape, group)
        if w_const is not None:  # the filter is an initializer: unblocked once
            fn, wp = plan(b, bi_bo)
        else:
            fn, wp = conv(_inner(info, "Conv", attrs, 11, 3)), unblock_weight(w, b, bi_bo)
        return finish(fn(from_blocked(x, b) if blocked_in else x, wp, bias), b, s)

    def specialize(dtypes, shapes, consts):
        """The inner Conv's specialisation for the unblocked shapes (same dims as the
        blocked ones), with the unblocked constant filter."""
        if w_const is None or shapes[0] is None or shapes[1] is None:
            return None
        b, blocked_in, bi_bo = _conv_layout(shapes[0], shapes[1], group)
        fn, wp = plan(b, bi_bo)
        sb = shapes[2] if len(shapes) > 2 else None
        special = fn.specialize(tuple(dtypes[:3]), (shapes[0], wp.shape, sb),
                                (None, wp, consts[2] if len(consts) > 2 else None))
        if special is None:
            return None

        def run_special(x, w, bias=None, s=None):
            return finish(special(from_blocked(x, b) if blocked_in else x, wp, bias), b, s)

        return run_special

    run.specialize = specialize
    return run


def _conv_layout(x_shape: tuple, w_shape: tuple, group: int) -> tuple[int, bool, bool]:
    """(block, input is blocked, filter in [O/b, I/b, kH, kW, b, b] order) as onnxruntime
    decides them: fewer input channels than a block is plain NCHW input, else blocked."""
    b = block_size()
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ValueError(f"nchwc Conv: input {x_shape} and filter {w_shape} must be 4-D")
    blocked_in = x_shape[1] >= b
    if blocked_in and x_shape[1] % b:
        raise ValueError(f"nchwc Conv: {x_shape[1]} input channels are neither under "
                         f"nor a multiple of the block of {b}")
    if group > 1 and (w_shape[1] != 1 or group != x_shape[1] or not blocked_in):
        raise ValueError(f"nchwc Conv: grouped convs must be depthwise, got group={group} "
                         f"and filter {w_shape}")
    return b, blocked_in, blocked_in and group == 1


def _pool(info: NodeInfo, factory, op: str, names: tuple[str, ...], opset: int):
    inner = factory(_inner(info, op, _spatial_attrs(info, names), opset, 1))

    def run(x: np.ndarray) -> np.ndarray:
        b = _blocked_input(op, x)
        y = inner(from_blocked(x, b))
        return to_blocked(y[0] if isinstance(y, tuple) else y, b)

    return run


_POOL_ATTRS = ("auto_pad", "kernel_shape", "dilations", "strides", "pads", "ceil_mode")


@kernel("MaxPool", since=1, domain=NCHWC, factory=True,
        variant="nchwc.pool")
def nchwc_max_pool(info: NodeInfo) -> Callable[..., np.ndarray]:
    """nchwc MaxPool: MaxPool over the unblocked input (no Indices output)."""
    return _pool(info, max_pool, "MaxPool", (*_POOL_ATTRS, "storage_order"), 12)


@kernel("AveragePool", since=1, domain=NCHWC, factory=True,
        variant="nchwc.pool")
def nchwc_average_pool(info: NodeInfo) -> Callable[..., np.ndarray]:
    """nchwc AveragePool: AveragePool over the unblocked input."""
    return _pool(info, average_pool, "AveragePool", (*_POOL_ATTRS, "count_include_pad"), 19)


@kernel("GlobalAveragePool", since=1, domain=NCHWC, factory=True,
        variant="nchwc.pool")
def nchwc_global_average_pool(info: NodeInfo) -> Callable[..., np.ndarray]:
    """nchwc GlobalAveragePool: the spatial mean of each (padded) channel."""
    return _pool(info, global_average_pool, "GlobalAveragePool", (), 1)


@kernel("GlobalMaxPool", since=1, domain=NCHWC, variant="nchwc.pool")
def nchwc_global_max_pool(x: np.ndarray) -> np.ndarray:
    """nchwc GlobalMaxPool: the spatial max of each (padded) channel, blocked in place."""
    _blocked_input("GlobalMaxPool", x)
    # per channel, so the blocked order does not matter: [N, Cp, 1, 1] is blocked already
    return from_blocked(x, block_size()).max(axis=(2, 3), keepdims=True)


@kernel("Upsample", since=1, domain=NCHWC, factory=True,
        variant="nchwc.upsample")
def nchwc_upsample(info: NodeInfo) -> Callable[..., np.ndarray]:
    """nchwc Upsample: integer `scales` over the NCHW axes, nearest (floor) or linear with
    the written coordinate_transformation_mode, by onnxkiln's Resize."""
    scales = [int(s) for s in (info.attrs.get("scales") or [])]
    if not scales or min(scales) < 1:
        raise ValueError(f"nchwc Upsample: scales must be positive integers, got {scales}")
    attrs = _spatial_attrs(info, ("mode", "coordinate_transformation_mode"))
    attrs.setdefault("mode", "nearest")
    attrs.setdefault("coordinate_transformation_mode", "asymmetric")  # the op's default
    attrs["nearest_mode"] = "floor"
    if attrs["mode"] not in ("nearest", "linear"):
        raise ValueError(f"nchwc Upsample: mode must be nearest or linear, got {attrs['mode']}")
    s = np.asarray(scales, dtype=np.float32)
    inner = resize(_inner(info, "Resize", attrs, 13, 3, (None, None, s)))

    def run(x: np.ndarray) -> np.ndarray:
        b = _blocked_input("Upsample", x)
        if len(scales) != x.ndim:
            raise ValueError(f"nchwc Upsample: {len(scales)} scales for a {x.ndim}-D input")
        if scales[:2] != [1, 1]:
            raise ValueError(f"nchwc Upsample: N and C scales must be 1, got {scales}")
        return to_blocked(inner(from_blocked(x, b), None, s), b)

    return run
