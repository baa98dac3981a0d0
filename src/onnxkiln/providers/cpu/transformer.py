"""CPU kernels: LLM building blocks (RMSNormalization, RotaryEmbedding, Swish, SwiGLU,
TensorScatter, CausalConvWithState). Imported by `attention.py`."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxkiln.ops.special import expit
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return _F64 if dt == _F64 else _F32


def _work(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """x in its compute dtype (float32 for 16-bit floats), and whether that is a fresh copy."""
    if x.dtype == _F32 or x.dtype == _F64:
        return x, False
    return x.astype(_F32), True


def _broadcasts_to(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    """Whether `small` broadcasts (unidirectionally) to `big`."""
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(reversed(small), reversed(big)))


# ---------------------------------------------------------------------------------------------
# RMSNormalization


@kernel("RMSNormalization", since=23, factory=True, variant="rmsnorm.numpy")
def rms_normalization(info: NodeInfo) -> Callable[..., np.ndarray]:
    """X / sqrt(mean(X^2 over axes [axis, rank)) + epsilon) * scale."""
    axis = int(info.attrs["axis"])
    eps = float(info.attrs["epsilon"])
    stash = int(info.attrs["stash_type"])
    if stash not in (1, 10, 11, 16):
        raise ValueError(f"RMSNormalization: unsupported stash_type {stash}")
    cdt = _F64 if stash == 11 else _F32  # 16-bit stash types compute in float32

    def run(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        ax = axis + x.ndim if axis < 0 else axis
        if not 0 <= ax < max(x.ndim, 1):
            raise ValueError(f"RMSNormalization: axis {axis} out of range for rank {x.ndim}")
        if scale.shape != x.shape[ax:] and not _broadcasts_to(scale.shape, x.shape):
            raise ValueError(
                f"RMSNormalization: scale {scale.shape} does not broadcast to X {x.shape}"
            )
        rows = math.prod(x.shape[:ax])
        cols = math.prod(x.shape[ax:])
        x2 = x.reshape(rows, cols)
        if x2.dtype != cdt:
            x2 = x2.astype(cdt)
        if cols == 0:
            return np.empty(x.shape, scale.dtype)
        ms = np.vecdot(x2, x2)
        ms *= cdt.type(1.0 / cols)
        ms += cdt.type(eps)
        np.sqrt(ms, out=ms)
        np.reciprocal(ms, out=ms)
        y = np.multiply(x2, ms[:, None]).reshape(x.shape)
        if scale.dtype == cdt:
            y *= scale
        else:
            y *= scale.astype(cdt)
        return y.astype(scale.dtype, copy=False)

    return run


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding


@kernel("RotaryEmbedding", since=23, factory=True, variant="rope.numpy")
def rotary_embedding(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Rotate (half-split or interleaved) the first rotary_embedding_dim channels by cos/sin."""
    interleaved = bool(info.attrs["interleaved"])
    rot_attr = int(info.attrs["rotary_embedding_dim"])
    num_heads = info.attrs.get("num_heads")

    def run(x, cos_cache, sin_cache, position_ids=None):
        if x.ndim == 4:
            b, _, s, d = x.shape
            x4 = x  # (B, H, S, D): caches broadcast as (B, 1, S, half)
        elif x.ndim == 3:
            if not num_heads or num_heads <= 0:
                raise ValueError("RotaryEmbedding: 3-D input needs the num_heads attribute")
            b, s, hidden = x.shape
            if hidden % num_heads:
                raise ValueError(
                    f"RotaryEmbedding: hidden size {hidden} not a multiple of num_heads {num_heads}"
                )
            d = hidden // num_heads
            x4 = x.reshape(b, s, num_heads, d)  # (B, S, H, D): caches as (B, S, 1, half)
        else:
            raise ValueError(f"RotaryEmbedding: input must be 3-D or 4-D, got {x.shape}")
        rot = rot_attr or d
        if rot % 2 or rot > d:
            raise ValueError(
                f"RotaryEmbedding: rotary_embedding_dim {rot} must be even and <= head size {d}"
            )
        half = rot // 2
        if position_ids is not None:
            if position_ids.shape != (b, s):
                raise ValueError(
                    f"RotaryEmbedding: position_ids shape {position_ids.shape} expected {(b, s)}"
                )
            if cos_cache.ndim != 2 or sin_cache.ndim != 2:
                raise ValueError("RotaryEmbedding: with position_ids the caches must be 2-D")
            n = cos_cache.shape[0]
            if position_ids.size and (position_ids.min() < 0 or position_ids.max() >= n):
                raise IndexError(
                    f"RotaryEmbedding: position_ids must lie in [0, {n}), got "
                    f"[{position_ids.min()}, {position_ids.max()}]"
                )
            cos = cos_cache[:, :half][position_ids]
            sin = sin_cache[:, :half][position_ids]
        else:
            if cos_cache.ndim != 3 or (*cos_cache.shape[:2], *sin_cache.shape[:2]) != (b, s, b, s):
                raise ValueError(
                    f"RotaryEmbedding: without position_ids the caches must be (B, S, half) = "
                    f"({b}, {s}, {half}), got {cos_cache.shape}, {sin_cache.shape}"
                )
            cos, sin = cos_cache[..., :half], sin_cache[..., :half]
        if cos.shape[-1] != half or sin.shape[-1] != half:
            raise ValueError(
                f"RotaryEmbedding: cache last dimension {cos_cache.shape[-1]} is smaller than "
                f"rotary_embedding_dim/2 = {half}"
            )
        cdt = _compute_dtype(x.dtype)
        expand = 1 if x.ndim == 4 else 2
        cos = np.expand_dims(cos.astype(cdt, copy=False), expand)
        sin = np.expand_dims(sin.astype(cdt, copy=False), expand)
        if interleaved:
            x1, x2 = x4[..., 0:rot:2], x4[..., 1:rot:2]
        else:
            x1, x2 = x4[..., :half], x4[..., half:rot]
        x1 = x1.astype(cdt, copy=False)
        x2 = x2.astype(cdt, copy=False)
        real = x1 * cos
        real -= x2 * sin
        imag = x1 * sin
        imag += x2 * cos
        out = np.empty(x.shape, x.dtype)
        o4 = out.reshape(x4.shape)
        if interleaved:
            np.copyto(o4[..., 0:rot:2], real, casting="unsafe")
            np.copyto(o4[..., 1:rot:2], imag, casting="unsafe")
        else:
            np.copyto(o4[..., :half], real, casting="unsafe")
            np.copyto(o4[..., half:rot], imag, casting="unsafe")
        if rot < d:
            o4[..., rot:] = x4[..., rot:]
        return out

    return run


# ---------------------------------------------------------------------------------------------
# Swish, SwiGLU


def _swish(a: np.ndarray, alpha: float) -> np.ndarray:
    """a * sigmoid(alpha * a) as a fresh float32/float64 array."""
    ac, _ = _work(a)
    gate = expit(ac * ac.dtype.type(alpha)) if alpha != 1.0 else expit(ac)
    gate *= ac
    return gate


@kernel("Swish", since=24, variant="swish.expit")
def swish(x: np.ndarray, *, alpha: float) -> np.ndarray:
    """x * sigmoid(alpha * x)."""
    return _swish(x, alpha).astype(x.dtype, copy=False)


@kernel("SwiGLU", since=28, variant="swiglu.expit")
def swiglu(a: np.ndarray, b: np.ndarray, *, alpha: float) -> np.ndarray:
    """Swish_alpha(A) * B for same-shape A, B."""
    if a.shape != b.shape:
        raise ValueError(f"SwiGLU: A {a.shape} and B {b.shape} must have the same shape")
    if a.dtype != b.dtype:
        raise ValueError(f"SwiGLU: A ({a.dtype}) and B ({b.dtype}) must have the same type")
    y = _swish(a, alpha)
    y *= b if b.dtype == y.dtype else b.astype(y.dtype)
    return y.astype(a.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# TensorScatter


@kernel("TensorScatter", since=24, factory=True, variant="tensorscatter.put")
def tensor_scatter(info: NodeInfo) -> Callable[..., np.ndarray]:
    """A copy of past_cache with `update` written along `axis` from each batch's write index."""
    mode = info.attrs["mode"]
    mode = mode.decode() if isinstance(mode, bytes) else mode
    axis_attr = int(info.attrs["axis"])
    if mode not in ("linear", "circular"):
        raise ValueError(f"TensorScatter: mode must be 'linear' or 'circular', got {mode!r}")

    def run(past, update, write_indices=None):
        r = past.ndim
        ax = axis_attr + r if axis_attr < 0 else axis_attr
        if not 1 <= ax < r:
            raise ValueError(f"TensorScatter: axis {axis_attr} invalid for rank {r} (not 0)")
        if update.ndim != r or any(update.shape[i] != past.shape[i] for i in range(r) if i != ax):
            raise ValueError(
                f"TensorScatter: update {update.shape} must match past_cache {past.shape} "
                f"except on axis {ax}"
            )
        n, s = past.shape[ax], update.shape[ax]
        if s > n:
            raise ValueError(f"TensorScatter: update length {s} exceeds cache length {n}")
        out = past.copy()
        if s == 0 or out.size == 0:
            return out
        batch = past.shape[0]
        if write_indices is None:
            starts = np.zeros(batch, np.int64)
        else:
            starts = np.asarray(write_indices, np.int64).reshape(-1)
            if starts.shape != (batch,):
                raise ValueError(
                    f"TensorScatter: write_indices shape {write_indices.shape} expected ({batch},)"
                )
        if mode == "linear":
            if starts.min() < 0 or starts.max() + s > n:
                raise IndexError(
                    f"TensorScatter: linear write [{starts.min()}, {starts.max() + s}) "
                    f"outside the cache length {n}"
                )
            if not starts.any():
                idx = (slice(None),) * ax + (slice(0, s),)
                out[idx] = update
                return out
        idx = starts[:, None] + np.arange(s)  # (B, S)
        if mode == "circular":
            idx %= n
        shape = [1] * r
        shape[0], shape[ax] = batch, s
        np.put_along_axis(out, idx.reshape(shape), update, axis=ax)
        return out

    return run


# ---------------------------------------------------------------------------------------------
# CausalConvWithState


@kernel("CausalConvWithState", since=27, factory=True, multi_output=True, variant="causalconv.taps")
def causal_conv_with_state(info: NodeInfo) -> Callable[..., tuple]:
    """Depthwise causal 1-D conv over [past_state, input], optional SiLU; carries k-1 steps."""
    act = info.attrs["activation"]
    act = act.decode() if isinstance(act, bytes) else act
    if act not in ("none", "silu", "swish"):
        raise ValueError(f"CausalConvWithState: activation must be none/silu/swish, got {act!r}")

    def run(x, weight, bias=None, past_state=None):
        if x.ndim != 3:
            raise ValueError(f"CausalConvWithState: input must be (B, C, L), got {x.shape}")
        b, c, length = x.shape
        if weight.ndim != 3 or weight.shape[0] != c or weight.shape[1] != 1:
            raise ValueError(f"CausalConvWithState: weight must be ({c}, 1, k), got {weight.shape}")
        k = weight.shape[2]
        if k < 1:
            raise ValueError("CausalConvWithState: kernel size must be >= 1")
        if bias is not None and bias.shape != (c,):
            raise ValueError(f"CausalConvWithState: bias must be ({c},), got {bias.shape}")
        if past_state is not None and past_state.shape != (b, c, k - 1):
            raise ValueError(
                f"CausalConvWithState: past_state must be {(b, c, k - 1)}, got {past_state.shape}"
            )
        cdt = _compute_dtype(x.dtype)
        padded = np.empty((b, c, length + k - 1), cdt)
        if past_state is None:
            padded[:, :, : k - 1] = 0
        else:
            padded[:, :, : k - 1] = past_state
        padded[:, :, k - 1 :] = x
        w = weight[:, 0, :].astype(cdt, copy=False)
        out = np.multiply(padded[:, :, :length], w[:, 0:1])
        tmp = np.empty_like(out) if k > 1 else None
        for i in range(1, k):
            np.multiply(padded[:, :, i : i + length], w[:, i : i + 1], out=tmp)
            out += tmp
        if bias is not None:
            out += bias.astype(cdt, copy=False)[:, None]
        if act != "none":
            out *= expit(out)
        state = padded[:, :, length:].astype(x.dtype)
        return out.astype(x.dtype, copy=False), state

    return run
