"""CPU kernels: com.microsoft HyperConnectionPreMix, HyperConnectionPostMix and EngramGate,
the hyper-connection stream mixing and Engram gate of multi-stream residual models.

Streams are grouped (..., C, H) or flattened (..., C * H) with num_branches = C. PreMix
reduces them, Y = reduction_scale * sum_c X[c] * pre_mix[c]; PostMix mixes and injects,
Y[k] = sum_c stream_mix[c, k] X[c] + post_mix[k] * block_output. EngramGate:
gate = sigmoid(sign(d) sqrt(max(|d|, 1e-6))), d = <RMSNorm(key), RMSNorm(query)> / sqrt(H),
output gate * value per hyper-connection, and optionally RMSNorm(output) with conv_norm_scale.
float32 arithmetic, results in the streams' type.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.ops.special import expit
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_F32 = np.dtype(np.float32)


def _grouped(op: str, x: np.ndarray, branches: int) -> np.ndarray:
    """Streams as float32 (..., C, H)."""
    if branches < 0:
        raise ValueError(f"{op}: num_branches must be >= 0, got {branches}")
    if branches:
        if x.ndim < 1 or x.shape[-1] % branches:
            raise ValueError(f"{op}: flattened streams need a last dim divisible by "
                             f"num_branches {branches}, got {x.shape}")
        return x.astype(_F32).reshape(*x.shape[:-1], branches, -1)
    if x.ndim < 2:
        raise ValueError(f"{op}: grouped streams must be (..., C, H), got {x.shape}")
    return x.astype(_F32)


def _gates(op: str, name: str, g: np.ndarray, lead: tuple, c: int, h: int) -> np.ndarray:
    """A (..., C), (..., C, 1), (..., C, H) or (..., C * H) gate as (..., C, 1 or H)."""
    g = g.astype(_F32)
    if g.shape == (*lead, c):
        return g[..., None]
    if g.shape in ((*lead, c, 1), (*lead, c, h)):
        return g
    if g.shape == (*lead, c * h):
        return g.reshape(*lead, c, h)
    raise ValueError(f"{op}: {name} must be {(*lead, c)}, {(*lead, c, 1)}, {(*lead, c, h)} or "
                     f"{(*lead, c * h)}, got {g.shape}")


@kernel("HyperConnectionPreMix", since=1, domain=MS, factory=True, variant="hcpre.numpy")
def hyper_connection_pre_mix(info: NodeInfo) -> Callable[..., np.ndarray]:
    """(..., H) = reduction_scale * sum over the C streams of streams * pre_mix."""
    op = "HyperConnectionPreMix"
    branches = int(info.attrs.get("num_branches", 0))
    scale = np.float32(info.attrs.get("reduction_scale", 1.0))

    def run(streams: np.ndarray, pre_mix: np.ndarray) -> np.ndarray:
        x = _grouped(op, streams, branches)
        lead, (c, h) = x.shape[:-2], x.shape[-2:]
        y = scale * np.sum(x * _gates(op, "pre_mix", pre_mix, lead, c, h), axis=-2)
        return y.astype(streams.dtype)

    return run


@kernel("HyperConnectionPostMix", since=1, domain=MS, factory=True, variant="hcpost.numpy")
def hyper_connection_post_mix(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Streams mixed by stream_mix (identity when absent) plus post_mix * block_output."""
    op = "HyperConnectionPostMix"
    branches = int(info.attrs.get("num_branches", 0))

    def run(streams, block_output, post_mix, stream_mix=None) -> np.ndarray:
        x = _grouped(op, streams, branches)
        lead, (c, h) = x.shape[:-2], x.shape[-2:]
        if block_output.shape != (*lead, h):
            raise ValueError(f"{op}: block_output must be {(*lead, h)}, got "
                             f"{block_output.shape}")
        post = _gates(op, "post_mix", post_mix, lead, c, h)
        if post.shape[-1] == h and post_mix.shape == (*lead, c * h):
            raise ValueError(f"{op}: post_mix must be {(*lead, c)}, {(*lead, c, 1)} or "
                             f"{(*lead, c, h)}, got {post_mix.shape}")
        if stream_mix is None:
            mixed = x
        else:
            if stream_mix.shape != (*lead, c, c):
                raise ValueError(f"{op}: stream_mix must be {(*lead, c, c)}, got "
                                 f"{stream_mix.shape}")
            mixed = np.swapaxes(stream_mix.astype(_F32), -1, -2) @ x
        y = mixed + post * block_output.astype(_F32)[..., None, :]
        return y.reshape(streams.shape).astype(streams.dtype)

    return run


def _rms(x: np.ndarray, scale: np.ndarray, eps: np.float32) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale.astype(_F32)


@kernel("EngramGate", since=1, domain=MS, factory=True, multi_output=True,
        variant="engramgate.numpy")
def engram_gate(info: NodeInfo) -> Callable[..., tuple]:
    """(gate * value per hyper-connection, its RMSNorm when conv_norm_scale is given)."""
    op = "EngramGate"
    eps = np.float32(info.attrs.get("epsilon", 1e-5))
    want_normed = len(info.output_present) > 1 and info.output_present[1]

    def run(key, query, value, key_scale, query_scale, conv_scale=None) -> tuple:
        if key.ndim != 4 or query.shape != key.shape or value.shape != (
                *key.shape[:2], key.shape[3]):
            raise ValueError(f"{op}: key and query must be (B, S, hc, H) alike and value "
                             f"(B, S, H), got {key.shape}, {query.shape}, {value.shape}")
        hc_h = key.shape[2:]
        for name, s in (("key_norm_scale", key_scale), ("query_norm_scale", query_scale),
                        ("conv_norm_scale", conv_scale)):
            if s is not None and s.shape != hc_h:
                raise ValueError(f"{op}: {name} must be {hc_h}, got {s.shape}")
        if want_normed and conv_scale is None:
            raise ValueError(f"{op}: gated_value_normed needs conv_norm_scale")
        k = _rms(key.astype(_F32), key_scale, eps)
        q = _rms(query.astype(_F32), query_scale, eps)
        d = np.sum(k * q, axis=-1, keepdims=True) / np.float32(np.sqrt(key.shape[3]))
        gate = expit(np.sign(d) * np.sqrt(np.maximum(np.abs(d), np.float32(1e-6))))
        out = gate * value.astype(_F32)[:, :, None, :]
        normed = _rms(out, conv_scale, eps).astype(key.dtype) if want_normed else None
        return out.astype(key.dtype), normed

    return run
