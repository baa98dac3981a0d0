"""CPU kernel: com.microsoft NGramHashMapping, the Engram n-gram hash ids of compressed token
ids (for n-gram embedding tables).

For n = 2 .. max_ngram_size, mix = XOR over shifts i < n of id[t - i] * multipliers[i]
(arithmetic in the ids' integer type, wrapping); head h of order n gets mix mod
vocab_sizes[head] in [0, vocab) plus head_offsets[head]; heads of n = 2 come first. History
before this call comes from past_ids (right-aligned) or is pad_id (eos_token_id when given);
present_ids returns the last max_ngram_size - 1 ids. With reset_on_eos and eos_token_id, a
shift reaching at or before the latest earlier eos reads eos_token_id; with segment_ids, a
shift reaching before the current segment's start inside this chunk reads the fill id too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

OP = "NGramHashMapping"


def _last_before(mask: np.ndarray) -> np.ndarray:
    """For each column p, the last index q < p with mask[:, q] true, else -1."""
    idx = np.where(mask, np.arange(mask.shape[1]), -1)
    upto = np.maximum.accumulate(idx, axis=1)  # last true at or before q
    return np.concatenate([np.full((mask.shape[0], 1), -1), upto[:, :-1]], axis=1)


def _segment_starts(segments: np.ndarray) -> np.ndarray:
    """Per token, the index of its segment's first token within the chunk."""
    change = np.ones(segments.shape, bool)
    change[:, 1:] = segments[:, 1:] != segments[:, :-1]
    starts = np.where(change, np.arange(segments.shape[1]), 0)
    return np.maximum.accumulate(starts, axis=1)


@kernel(OP, since=1, domain=MS, factory=True, multi_output=True, variant="ngramhash.numpy")
def ngram_hash_mapping(info: NodeInfo) -> Callable[..., tuple]:
    """(hash_ids (B, L, (max_ngram_size - 1) * n_head_per_ngram), present_ids)."""
    n_max = int(info.attrs.get("max_ngram_size", 0))
    heads = int(info.attrs.get("n_head_per_ngram", 0))
    pad = int(info.attrs.get("pad_id", 0))
    reset = bool(int(info.attrs.get("reset_on_eos", 0)))
    if n_max < 2 or heads < 1:
        raise ValueError(f"{OP}: max_ngram_size must be >= 2 and n_head_per_ngram >= 1, got "
                         f"{n_max}, {heads}")
    width = (n_max - 1) * heads

    def run(ids, multipliers, vocab, past=None, offsets=None, eos=None, segments=None):
        if ids.ndim != 2 or multipliers.size < n_max or vocab.shape != (width,):
            raise ValueError(f"{OP}: input_ids must be (batch, length), multipliers at least "
                             f"({n_max},) and vocab_sizes ({width},), got {ids.shape}, "
                             f"{multipliers.shape}, {vocab.shape}")
        if (vocab <= 0).any():
            raise ValueError(f"{OP}: vocab_sizes must be positive")
        b, length = ids.shape
        fill = pad if eos is None else int(np.asarray(eos).reshape(-1)[0])
        hist = n_max - 1
        if past is None:
            past = np.full((b, hist), fill, ids.dtype)
        elif past.shape != (b, hist):
            raise ValueError(f"{OP}: past_ids must be {(b, hist)}, got {past.shape}")
        dt = ids.dtype  # the mix wraps in the ids' own width, as onnxruntime's
        ext = np.concatenate([past, ids], axis=1).astype(dt)
        pos = hist + np.arange(length)
        floor = np.full((b, length), -1, np.int64)  # shifts at or below this read `fill`
        if reset and eos is not None:
            floor = np.maximum(floor, _last_before(ext == fill)[:, pos])
        if segments is not None:
            if segments.shape != ids.shape:
                raise ValueError(f"{OP}: segment_ids must be {ids.shape}, got {segments.shape}")
            floor = np.maximum(floor, hist + _segment_starts(segments) - 1)
        mult = multipliers.reshape(-1).astype(dt)
        out = np.empty((b, length, width), dt)
        mix = np.zeros((b, length), dt)
        with np.errstate(over="ignore"):
            for i in range(n_max):
                src = pos - i
                tok = np.where(src[None, :] <= floor, dt.type(fill), ext[:, src])
                mix = mix ^ (tok * mult[i])
                if i >= 1:
                    sl = slice((i - 1) * heads, i * heads)
                    out[:, :, sl] = _mod(mix[:, :, None], vocab[sl].astype(dt))
        if offsets is not None:
            if offsets.shape != (width,):
                raise ValueError(f"{OP}: head_offsets must be ({width},), got {offsets.shape}")
            out += offsets.astype(dt)
        return out, ext[:, -hist:]

    return run


def _mod(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """x mod m in [0, m) also for a negative mix (a negative multiplier), as onnxruntime."""
    return np.mod(x, m)
