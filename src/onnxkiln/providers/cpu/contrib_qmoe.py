"""CPU kernel: com.microsoft QMoE, MoE with integer-quantized expert weights (what
onnxruntime-genai's builder writes for int4/int8 Mixtral, Phi-MoE and gpt-oss models).

Weights are the raw layout (weights_prepacked 0, as quantize_matmul_{4,8}bits writes them):
uint8 (experts, N, K * bits / 8), each row a little-endian bit stream (low bits first); scales
per row (experts, N) or per block of block_size along K (experts, N, K / block_size); zero
points packed the same way along their last axis, 2 ** (bits - 1) when absent. The weights
are dequantized, (q - zero_point) * scale, once when they are constants, then the MoE kernel
runs on them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.contrib_moe import forward, moe_attrs
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` unsigned `bits`-wide codes of each row of uint8 `packed`."""
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], -1)[..., :count]


def dequantize(op: str, name: str, q: np.ndarray, scales, zero_points, bits: int,
               block: int) -> np.ndarray:
    """Float32 weights (experts, N, K) from one projection's quantized inputs."""
    if q.dtype != np.uint8 or q.ndim != 3:
        raise ValueError(f"{op}: {name} weights must be uint8 (experts, N, K * {bits} / 8), "
                         f"got {q.dtype} {q.shape}")
    if scales is None:
        raise ValueError(f"{op}: {name} scales are required for integer weights")
    e, n, k = q.shape[0], q.shape[1], q.shape[2] * 8 // bits
    if block and k % block:
        raise ValueError(f"{op}: {name}'s input size {k} must be a multiple of block_size "
                         f"{block}")
    groups = k // block if block else 1
    want = (e, n, groups) if block else (e, n)
    if scales.shape != want:
        raise ValueError(f"{op}: {name} scales must be {want}, got {scales.shape}")
    codes = unpack_bits(q, bits, k).astype(_F32).reshape(e, n, groups, -1)
    if zero_points is None:
        zp = np.full((e, n, groups), 2 ** (bits - 1), _F32)
    else:
        zshape = (e, n, -(-groups * bits // 8)) if block else (e, -(-n * bits // 8))
        if zero_points.dtype != np.uint8 or zero_points.shape != zshape:
            raise ValueError(f"{op}: {name} zero points must be uint8 {zshape}, got "
                             f"{zero_points.dtype} {zero_points.shape}")
        zp = unpack_bits(zero_points, bits, groups if block else n).astype(_F32)
        zp = zp.reshape(e, n, groups)
    w = (codes - zp[..., None]) * scales.astype(_F32).reshape(e, n, groups, 1)
    return w.reshape(e, n, k)


class _Projection:
    """One of fc1/fc2/fc3: its bit width, and its float weights dequantized at plan time
    when all its inputs are constants (then never again)."""

    def __init__(self, op: str, info: NodeInfo, name: str, index: tuple[int, int, int],
                 bits: int, block: int):
        self.name, self.index, self.bits, self.block = name, index, bits, block
        consts, present = info.const_inputs, info.input_present
        self.fixed = None
        vals = [consts[i] if i < len(consts) else None for i in index]
        known = all(i >= len(present) or not present[i] or consts[i] is not None
                    for i in index)
        if known and vals[0] is not None:
            self.fixed = dequantize(op, name, vals[0], vals[1], vals[2], bits, block)

    def weights(self, op: str, args: list) -> np.ndarray | None:
        if self.fixed is not None:
            return self.fixed
        q, s, z = (args[i] for i in self.index)
        return None if q is None else dequantize(op, self.name, q, s, z, self.bits, self.block)


def _bits(op: str, info: NodeInfo, name: str, base: int) -> int:
    bits = int(info.attrs.get(f"{name}_expert_weight_bits", base))
    if bits not in (2, 4, 8):
        raise ValueError(f"{op}: {name} weights of {bits} bits are not supported on CPU (2, 4 "
                         f"or 8)")
    return bits


@kernel("QMoE", since=1, domain=MS, factory=True, variant="qmoe.dequant")
def qmoe(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Quantized MoE: integer weights dequantized to float32, then the MoE block."""
    op = "QMoE"
    quant = info.attrs.get("quant_type", "int")
    quant = quant.decode() if isinstance(quant, bytes) else str(quant)
    if quant != "int":
        raise ValueError(f"{op}: quant_type {quant!r} is not supported on CPU (only 'int')")
    if int(info.attrs.get("weights_prepacked", -1)) == 1:
        raise ValueError(f"{op}: prepacked weights (weights_prepacked=1) are not supported")
    expert, k, normalize = moe_attrs(op, info)
    block = int(info.attrs.get("block_size", 0) or 0)
    if block and (block < 16 or block & (block - 1)):
        raise ValueError(f"{op}: block_size must be a power of two >= 16, got {block}")
    base = int(info.attrs.get("expert_weight_bits", 4))
    bits1 = _bits(op, info, "fc1", base)
    fc1 = _Projection(op, info, "fc1", (2, 3, 11), bits1, block)
    fc2 = _Projection(op, info, "fc2", (5, 6, 12), _bits(op, info, "fc2", base), block)
    fc3 = _Projection(op, info, "fc3", (8, 9, 13), _bits(op, info, "fc3", bits1), block)

    def run(*args) -> np.ndarray:
        a = list(args) + [None] * max(0, 15 - len(args))
        if any(v is not None for v in a[15:]):
            raise ValueError(f"{op}: global and activation scales (fp4/fp8 modes) are not "
                             f"supported on CPU")
        w1, w2 = fc1.weights(op, a), fc2.weights(op, a)
        if w1 is None or w2 is None:
            raise ValueError(f"{op}: fc1 and fc2 weights are required")
        return forward(op, expert, k, normalize, a[0], a[1], w1, a[4], w2, a[7],
                       fc3.weights(op, a), a[10], mix=a[14])

    return run
