"""MatMulNBits' weight format, for every provider: the attributes' geometry (K, N, bits,
block_size), unpacking of the 2/4/8-bit codes, and the dequantized float32 weight
W = (q - zero_point) * scale per block of `block_size` along K (g_idx: a block per K row).

The host computes W this way wherever the product runs (the CPU's float path, a device
provider's upload), so every provider multiplies by the same weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["NBitsGeometry", "block_zero_points", "check_packing", "dequantize_weight",
           "nbits_geometry", "unpack_bits"]

OP = "MatMulNBits"
_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)
_FLOATS = frozenset({_F32, np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})


def unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values packed `8 // bits` to a byte (low bits first) along the last axis, unpacked.

    The result has `packed.shape[-1] * 8 // bits` entries on the last axis (uint8).
    """
    if bits == 8:
        return packed
    per = 8 // bits
    shifts = np.arange(0, 8, bits, dtype=_U8)
    out = np.right_shift(packed[..., None], shifts)
    np.bitwise_and(out, _U8.type((1 << bits) - 1), out=out)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * per)


@dataclasses.dataclass(frozen=True, slots=True)
class NBitsGeometry:
    """K x N weights in `bits`-bit codes: `n_blocks` blocks of `block` along K per column,
    `blob` bytes per packed block."""

    k: int
    n: int
    bits: int
    block: int
    n_blocks: int
    blob: int


def nbits_geometry(attrs: Mapping[str, Any]) -> NBitsGeometry:
    """K, N, bits and block_size from the attributes, checked, with the blocks per row and
    the bytes per block they imply."""
    for name in ("K", "N", "block_size"):
        if attrs.get(name) is None:
            raise ValueError(f"{OP}: attribute '{name}' is required")
    k, n, block = int(attrs["K"]), int(attrs["N"]), int(attrs["block_size"])
    bits = int(attrs.get("bits", 4))
    if bits not in (2, 4, 8):
        raise ValueError(f"{OP}: bits must be one of [2, 4, 8], got {bits}")
    if k < 1 or n < 1:
        raise ValueError(f"{OP}: K and N must be >= 1, got K={k}, N={n}")
    if block < 16 or block & (block - 1):
        raise ValueError(f"{OP}: block_size must be a power of 2 >= 16, got {block}")
    n_blocks = -(-k // block)
    return NBitsGeometry(k, n, bits, block, n_blocks, block * bits // 8)


def check_packing(g: NBitsGeometry, b: np.ndarray, scales: np.ndarray) -> None:
    """B is uint8 (N, n_blocks, blob) and scales hold one float per block."""
    if b.dtype != _U8:
        raise TypeError(f"{OP}: B must be uint8, got {b.dtype}")
    if b.shape != (g.n, g.n_blocks, g.blob):
        raise ValueError(
            f"{OP}: B must have shape (N, k_blocks, blob_size) = ({g.n}, {g.n_blocks}, {g.blob}) "
            f"for K={g.k}, N={g.n}, bits={g.bits}, block_size={g.block}; got {b.shape}"
        )
    if scales.dtype not in _FLOATS:
        raise TypeError(f"{OP}: scales must be float32/float16/bfloat16, got {scales.dtype}")
    if scales.size != g.n * g.n_blocks:
        raise ValueError(
            f"{OP}: scales must have N * k_blocks = {g.n * g.n_blocks} values (shape "
            f"({g.n}, {g.n_blocks})), got shape {scales.shape}"
        )


def block_zero_points(g: NBitsGeometry, zp: np.ndarray | None) -> np.ndarray:
    """Zero points as float32 (N, k_blocks): 2^(bits-1) when absent, unpacked from uint8."""
    if zp is None:
        return np.full((g.n, g.n_blocks), float(1 << (g.bits - 1)), _F32)
    if zp.dtype == _U8:
        per_row = -(-g.n_blocks * g.bits // 8)
        if zp.size != g.n * per_row:
            raise ValueError(
                f"{OP}: packed uint8 zero_points must have shape (N, ceil(k_blocks * bits / 8)) "
                f"= ({g.n}, {per_row}), got {zp.shape}"
            )
        return unpack_bits(zp.reshape(g.n, per_row), g.bits)[:, : g.n_blocks].astype(_F32)
    if zp.dtype not in _FLOATS:
        raise TypeError(f"{OP}: zero_points must be packed uint8 or scales' float type, got "
                        f"{zp.dtype}")
    if zp.size != g.n * g.n_blocks:
        raise ValueError(
            f"{OP}: zero_points of type {zp.dtype} must have shape (N, k_blocks) = "
            f"({g.n}, {g.n_blocks}), got {zp.shape}"
        )
    return zp.reshape(g.n, g.n_blocks).astype(_F32)


def _group_index(g: NBitsGeometry, g_idx: np.ndarray) -> np.ndarray | None:
    """g_idx as int64 (K,), or None when it is the trivial k // block_size."""
    gi = g_idx.reshape(-1).astype(np.int64)
    if gi.shape[0] != g.k:
        raise ValueError(f"{OP}: g_idx must have K = {g.k} entries, got {g_idx.shape}")
    if gi.size and (gi.min() < 0 or gi.max() >= g.n_blocks):
        raise IndexError(f"{OP}: g_idx values must lie in [0, {g.n_blocks}), got "
                         f"[{int(gi.min())}, {int(gi.max())}]")
    return None if np.array_equal(gi, np.arange(g.k) // g.block) else gi


def dequantize_weight(g: NBitsGeometry, b: np.ndarray, scales: np.ndarray,
                      zp: np.ndarray | None, g_idx: np.ndarray | None) -> np.ndarray:
    """The dequantized weight W (N, K) in float32: (q - zero_point) * scale per K block."""
    check_packing(g, b, scales)
    q = unpack_bits(b, g.bits).reshape(g.n, g.n_blocks, g.block)
    s = scales.reshape(g.n, g.n_blocks).astype(_F32)
    z = block_zero_points(g, zp)
    gi = None if g_idx is None else _group_index(g, g_idx)
    if gi is not None:  # act-order: a block per K row
        w = q.reshape(g.n, -1)[:, : g.k].astype(_F32)
        w -= z[:, gi]
        w *= s[:, gi]
        return w
    w = q.astype(_F32)
    w -= z[:, :, None]
    w *= s[:, :, None]
    w = w.reshape(g.n, g.n_blocks * g.block)
    return np.ascontiguousarray(w[:, : g.k]) if g.n_blocks * g.block != g.k else w
