"""CPU kernels: onnxruntime's quantized transformer and NHWC layers (com.microsoft).

QAttention and QEmbedLayerNormalization dequantize their integer operands, (q - zero_point)
* scale, and run the float Attention / EmbedLayerNormalization kernels; constant weights and
tables are dequantized once. NhwcMaxPool is MaxPool on channels-last (u)int8 data, the
com.microsoft QLinearConv the ONNX one with an optional channels-last layout; MatMulInteger16
multiplies 16-bit integers into 32 bits; MatMulBnb4 multiplies by bitsandbytes' FP4/NF4 weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._tensor_util import const_input
from onnxkiln.providers.cpu.contrib_attention import ms_attention
from onnxkiln.providers.cpu.contrib_norm import embed_layer_normalization
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.pool import max_pool
from onnxkiln.providers.cpu.quant import qlinear_conv
from onnxkiln.providers.cpu.registry import kernel

_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
_QUANT = (np.dtype(np.uint8), np.dtype(np.int8))


def _dequantize(q: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, op: str,
                name: str) -> np.ndarray:
    """(q - zp) * scale in float32; scale and zp scalar or per last-axis element."""
    if q.dtype not in _QUANT:
        raise TypeError(f"{op}: {name} must be uint8 or int8, got {q.dtype}")
    if scale.dtype not in (_F32, _F16):
        raise TypeError(f"{op}: {name}'s scale must be float32 or float16, got {scale.dtype}")
    last = q.shape[-1] if q.ndim else 1
    for what, p in (("scale", scale), ("zero point", zp)):
        if p is not None and p.size not in (1, last):
            raise ValueError(f"{op}: {name}'s {what} has {p.size} values; expected 1 or {last}")
    y = q.astype(_F32)
    if zp is not None:
        if zp.dtype != q.dtype:
            raise TypeError(f"{op}: {name}'s zero point must be {q.dtype}, got {zp.dtype}")
        y -= zp.reshape(-1).astype(_F32) if zp.size > 1 else _F32.type(zp.reshape(())[()])
    y *= scale.reshape(-1).astype(_F32) if scale.size > 1 else _F32.type(scale.reshape(())[()])
    return y


class _ConstDequant:
    """Dequantizes one operand, once when its value, scale and zero point are constants."""

    def __init__(self, info: NodeInfo, idx: tuple[int, int, int | None], op: str,
                 name: str) -> None:
        self.op, self.name = op, name
        vals = [const_input(info, i) if i is not None else None for i in idx]
        self.ready = None
        present = info.input_present
        zp_absent = idx[2] is None or (idx[2] < len(present) and not present[idx[2]])
        if vals[0] is not None and vals[1] is not None and (vals[2] is not None or zp_absent):
            self.ready = _dequantize(vals[0], vals[1], vals[2], op, name)

    def __call__(self, q: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
        if self.ready is not None:
            return self.ready
        return _dequantize(q, scale, zp, self.op, self.name)


def _float_info(info: NodeInfo, n_inputs: int, attrs: dict | None = None) -> NodeInfo:
    """The float op's NodeInfo: no constants known (the inputs are dequantized here)."""
    return dataclasses.replace(info, n_inputs=n_inputs, input_present=(), input_dtypes=(),
                               input_shapes=(), const_inputs=(),
                               attrs=info.attrs if attrs is None else attrs)


@kernel("QAttention", since=1, domain=MS, factory=True, multi_output=True,
        variant="qattention.dequant_sdpa")
def q_attention(info: NodeInfo) -> Callable[..., tuple]:
    """Attention on (input - input_zp) * input_scale and (weight - weight_zp) * weight_scale
    (weight parameters scalar or per column); output and present in input_scale's type."""
    op = "QAttention"
    weights = _ConstDequant(info, (1, 4, 7), op, "weight")
    attn = ms_attention(_float_info(info, 5))

    def run(x, weight, bias, input_scale, weight_scale, mask_index=None, input_zero_point=None,
            weight_zero_point=None, past=None):
        if input_scale.size != 1:
            raise ValueError(f"{op}: input_scale must be a scalar, got shape {input_scale.shape}")
        if input_zero_point is not None and input_zero_point.size != 1:
            raise ValueError(f"{op}: input_zero_point must be a scalar, got shape "
                             f"{input_zero_point.shape}")
        out_dt = input_scale.dtype
        xf = _dequantize(x, input_scale, input_zero_point, op, "input")
        wf = weights(weight, weight_scale, weight_zero_point)
        out, present = attn(xf, wf, bias.astype(_F32, copy=False), mask_index,
                            None if past is None else past.astype(_F32, copy=False))
        if out_dt != _F32:
            out = out.astype(out_dt)
            present = None if present is None else present.astype(out_dt)
        return out, present

    return run


@kernel("QEmbedLayerNormalization", since=1, domain=MS, factory=True, multi_output=True,
        variant="qembedlayernorm.dequant")
def q_embed_layer_normalization(info: NodeInfo) -> Callable[..., tuple]:
    """EmbedLayerNormalization with (u)int8 word/position/segment tables, gamma and beta, each
    dequantized with its own scalar scale and zero point; float32 out."""
    op = "QEmbedLayerNormalization"
    parts = [_ConstDequant(info, (q, q + 6, q + 11), op, name)
             for q, name in ((2, "word_embedding"), (3, "position_embedding"),
                             (4, "segment_embedding"), (5, "gamma"), (6, "beta"))]
    embed = embed_layer_normalization(_float_info(info, 8))

    def run(ids, seg, word, pos, seg_table, gamma, beta, mask, word_s, pos_s, seg_s, gamma_s,
            beta_s, word_zp, pos_zp, seg_zp=None, gamma_zp=None, beta_zp=None):
        quant = (word, pos, seg_table, gamma, beta)
        scales = (word_s, pos_s, seg_s, gamma_s, beta_s)
        zps = (word_zp, pos_zp, seg_zp, gamma_zp, beta_zp)
        floats = []
        for part, q, s, z in zip(parts, quant, scales, zps, strict=True):
            if q is None:
                floats.append(None)
                continue
            if s is None:
                raise ValueError(f"{op}: {part.name} needs its scale")
            if s.size != 1 or (z is not None and z.size != 1):
                raise ValueError(f"{op}: {part.name}'s scale and zero point must be scalars")
            floats.append(part(q, s, z))
        if (seg is None) != (floats[2] is None):
            raise ValueError(f"{op}: segment_ids and segment_embedding come together")
        out = embed(ids, seg, floats[0], floats[1], floats[2], floats[3], floats[4], mask)
        return out[0], out[1]

    return run


@kernel("NhwcMaxPool", since=1, domain=MS, factory=True, variant="nhwcmaxpool.transpose")
def nhwc_max_pool(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """MaxPool over the middle (spatial) axes of channels-last (u)int8 x."""
    op = "NhwcMaxPool"
    attrs = dict(info.attrs)
    if "kernel_shape" not in attrs:
        raise ValueError(f"{op}: kernel_shape is required")
    attrs.setdefault("auto_pad", "NOTSET")
    attrs.setdefault("ceil_mode", 0)
    pool = max_pool(dataclasses.replace(info, domain="", opset=12, attrs=attrs, n_outputs=1,
                                        output_present=(True,), input_shapes=(),
                                        output_dtypes=()))

    def run(x: np.ndarray) -> np.ndarray:
        if x.dtype not in _QUANT:
            raise TypeError(f"{op}: x must be uint8 or int8, got {x.dtype}")
        y = pool(_channels_first(x, op))
        y = y[0] if isinstance(y, tuple) else y
        return np.ascontiguousarray(np.moveaxis(y, 1, -1))

    return run


def _channels_first(x: np.ndarray, op: str) -> np.ndarray:
    if x.ndim < 3:
        raise ValueError(f"{op}: x must be (N, spatial..., C), got shape {x.shape}")
    return np.ascontiguousarray(np.moveaxis(x, -1, 1))


@kernel("QLinearConv", since=1, domain=MS, factory=True, variant="qlinearconv.ms.im2col")
def qlinear_conv_ms(info: NodeInfo) -> Callable[..., np.ndarray]:
    """ONNX QLinearConv; with channels_last=1, x and y are (N, spatial..., C) while w stays
    (M, C/group, kernel...)."""
    attrs = dict(info.attrs)
    channels_last = bool(attrs.pop("channels_last", 0))
    attrs.setdefault("auto_pad", "NOTSET")
    attrs.setdefault("group", 1)
    conv = qlinear_conv(dataclasses.replace(info, domain="", opset=10, attrs=attrs,
                                            input_shapes=()))
    if not channels_last:
        return conv
    op = "QLinearConv"

    def run(x, *rest):
        y = conv(_channels_first(x, op), *rest)
        return np.ascontiguousarray(np.moveaxis(y, 1, -1))

    return run


_INT16 = (np.dtype(np.int16), np.dtype(np.uint16))


@kernel("MatMulInteger16", since=1, domain=MS, variant="matmulinteger16.int64")
def matmul_integer16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A @ B for int16/uint16 operands, exact in int64, stored as int32 (uint32 when both
    operands are uint16)."""
    op = "MatMulInteger16"
    if a.dtype not in _INT16 or b.dtype not in _INT16:
        raise TypeError(f"{op}: A and B must be int16 or uint16, got {a.dtype} and {b.dtype}")
    try:
        y = np.matmul(a.astype(np.int64), b.astype(np.int64))
    except ValueError as e:
        raise ValueError(f"{op}: cannot multiply A {a.shape} by B {b.shape}: {e}") from e
    both_unsigned = a.dtype == b.dtype == np.dtype(np.uint16)
    return y.astype(np.uint32 if both_unsigned else np.int32)


# bitsandbytes' 4-bit code books (QLoRA): index = the stored nibble
_BNB4_CODES = {
    0: np.array([s * v for s in (1, -1)
                 for v in (0.0, 1 / 192, 2 / 3, 1.0, 1 / 3, 0.5, 1 / 6, 0.25)], _F32),
    1: np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                 -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                 0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                 0.7229568362236023, 1.0], _F32),
}


@kernel("MatMulBnb4", since=1, domain=MS, factory=True, variant="matmulbnb4.dequant_blas")
def matmul_bnb4(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = A @ B' where B [N, K] (flattened, two codes a byte, high nibble first) decodes
    through the FP4 (quant_type 0) or NF4 (1) code book times its block's absmax; B' is B
    transposed when transB (default), else B read as [K, N]."""
    op = "MatMulBnb4"
    a = info.attrs
    k, n, block = int(a.get("K", 0)), int(a.get("N", 0)), int(a.get("block_size", 0))
    quant_type = int(a.get("quant_type", 1))
    trans_b = bool(a.get("transB", 1))
    if k <= 0 or n <= 0:
        raise ValueError(f"{op}: attributes K and N must be positive, got K={k}, N={n}")
    if block < 16 or block & (block - 1):
        raise ValueError(f"{op}: block_size must be a power of 2 and >= 16, got {block}")
    if quant_type not in _BNB4_CODES:
        raise ValueError(f"{op}: quant_type must be 0 (FP4) or 1 (NF4), got {quant_type}")
    codes = _BNB4_CODES[quant_type]
    static = const_input(info, 1) is not None and const_input(info, 2) is not None
    memo: list[np.ndarray] = []

    def weight(b: np.ndarray, absmax: np.ndarray) -> np.ndarray:
        if b.dtype != np.uint8 or b.size != (n * k + 1) // 2:
            raise ValueError(f"{op}: B must hold {(n * k + 1) // 2} uint8 values, got "
                             f"{b.dtype} {b.shape}")
        n_blocks = -(-n * k // block)
        if absmax.size != n_blocks:
            raise ValueError(f"{op}: absmax must hold {n_blocks} values, got {absmax.size}")
        flat = b.reshape(-1)
        nib = np.stack([flat >> 4, flat & 0xF], axis=-1).reshape(-1)[: n * k]
        vals = codes[nib]
        scale = np.repeat(absmax.reshape(-1).astype(_F32), block)[: n * k]
        w = (vals * scale).reshape(n, k)
        return np.ascontiguousarray(w.T) if trans_b else w.reshape(k, n)

    def run(x: np.ndarray, b: np.ndarray, absmax: np.ndarray) -> np.ndarray:
        if x.dtype != _F32:
            raise TypeError(f"{op}: A must be float32, got {x.dtype}")
        if x.ndim < 1 or x.shape[-1] != k:
            raise ValueError(f"{op}: A's last dim must be K={k}, got shape {x.shape}")
        if memo:
            w = memo[0]
        else:
            w = weight(b, absmax)
            if static:
                memo.append(w)
        return np.matmul(x, w)

    return run
