"""CPU kernels: com.microsoft NGramHashMapping and VarlenNGramHashMapping, the Engram n-gram
hash ids of compressed token ids (for n-gram embedding tables).

For n = 2 .. max_ngram_size, mix = XOR over shifts i < n of id[t - i] * multipliers[i]
(arithmetic in the ids' integer type, wrapping); head h of order n gets mix mod
vocab_sizes[head] in [0, vocab) plus head_offsets[head]; heads of n = 2 come first. History
before this call comes from past_ids (right-aligned) or is pad_id (eos_token_id when given);
present_ids returns the last max_ngram_size - 1 ids. With reset_on_eos and eos_token_id, a
shift reaching at or before the latest earlier eos reads eos_token_id; with segment_ids, a
shift reaching before the current segment's start inside this chunk reads the fill id too
(the chunk's first segment continues the history). VarlenNGramHashMapping does the same per
request of a packed batch, with past_segment_ids carrying the history's segments.
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


class _Hasher:
    """The attributes of a hash-mapping node and the hash of one extended id block."""

    def __init__(self, op: str, info: NodeInfo) -> None:
        self.op = op
        self.n = int(info.attrs.get("max_ngram_size", 0))
        self.heads = int(info.attrs.get("n_head_per_ngram", 0))
        self.pad = int(info.attrs.get("pad_id", 0))
        self.reset = bool(int(info.attrs.get("reset_on_eos", 0)))
        if self.n < 2 or self.heads < 1:
            raise ValueError(f"{op}: max_ngram_size must be >= 2 and n_head_per_ngram >= 1, "
                             f"got {self.n}, {self.heads}")
        self.width = (self.n - 1) * self.heads

    def check(self, multipliers, vocab, offsets) -> None:
        if multipliers.size < self.n or vocab.shape != (self.width,):
            raise ValueError(f"{self.op}: multipliers must hold at least {self.n} values and "
                             f"vocab_sizes be ({self.width},), got {multipliers.shape}, "
                             f"{vocab.shape}")
        if (vocab <= 0).any():
            raise ValueError(f"{self.op}: vocab_sizes must be positive")
        if offsets is not None and offsets.shape != (self.width,):
            raise ValueError(f"{self.op}: head_offsets must be ({self.width},), got "
                             f"{offsets.shape}")

    def floor(self, ext: np.ndarray, eos, seg_starts: np.ndarray | None) -> np.ndarray:
        """Per new position, the last extended index whose id reads as the fill id."""
        hist = self.n - 1
        pos = hist + np.arange(ext.shape[1] - hist)
        floor = np.full((ext.shape[0], pos.size), -1, np.int64)
        if self.reset and eos is not None:
            floor = np.maximum(floor, _last_before(ext == int(eos))[:, pos])
        if seg_starts is not None:  # extended index of each new token's segment start
            floor = np.maximum(floor, seg_starts - 1)
        return floor

    def __call__(self, ext, floor, fill: int, multipliers, vocab, offsets) -> np.ndarray:
        """(rows, new, width) hash ids of the ids after the first max_ngram_size - 1."""
        dt = ext.dtype  # the mix wraps in the ids' own width, as onnxruntime's
        pos = self.n - 1 + np.arange(ext.shape[1] - self.n + 1)
        mult = multipliers.reshape(-1).astype(dt)
        out = np.empty((ext.shape[0], pos.size, self.width), dt)
        mix = np.zeros((ext.shape[0], pos.size), dt)
        with np.errstate(over="ignore"):
            for i in range(self.n):
                src = pos - i
                tok = np.where(src[None, :] <= floor, dt.type(fill), ext[:, src])
                mix = mix ^ (tok * mult[i])
                if i >= 1:
                    sl = slice((i - 1) * self.heads, i * self.heads)
                    out[:, :, sl] = np.mod(mix[:, :, None], vocab[sl].astype(dt))
            if offsets is not None:
                out += offsets.astype(dt)
        return out


def _fill(h: _Hasher, eos) -> int:
    return h.pad if eos is None else int(np.asarray(eos).reshape(-1)[0])


@kernel(OP, since=1, domain=MS, factory=True, multi_output=True, variant="ngramhash.numpy")
def ngram_hash_mapping(info: NodeInfo) -> Callable[..., tuple]:
    """(hash_ids (B, L, (max_ngram_size - 1) * n_head_per_ngram), present_ids)."""
    h = _Hasher(OP, info)

    def run(ids, multipliers, vocab, past=None, offsets=None, eos=None, segments=None):
        if ids.ndim != 2:
            raise ValueError(f"{OP}: input_ids must be (batch, length), got {ids.shape}")
        h.check(multipliers, vocab, offsets)
        b, hist, fill = ids.shape[0], h.n - 1, _fill(h, eos)
        if past is None:
            past = np.full((b, hist), fill, ids.dtype)
        elif past.shape != (b, hist):
            raise ValueError(f"{OP}: past_ids must be {(b, hist)}, got {past.shape}")
        ext = np.concatenate([past.astype(ids.dtype), ids], axis=1)
        starts = None
        if segments is not None:
            if segments.shape != ids.shape:
                raise ValueError(f"{OP}: segment_ids must be {ids.shape}, got {segments.shape}")
            first = _segment_starts(segments)  # the chunk's first segment keeps the history
            starts = np.where(first == 0, 0, hist + first)
        floor = h.floor(ext, None if eos is None else fill, starts)
        return h(ext, floor, fill, multipliers, vocab, offsets), ext[:, -hist:]

    return run


@kernel("VarlenNGramHashMapping", since=1, domain=MS, factory=True, multi_output=True,
        variant="varlen_ngramhash.numpy")
def varlen_ngram_hash_mapping(info: NodeInfo) -> Callable[..., tuple]:
    """NGramHashMapping per request of a packed (tokens,) batch cut by
    cumulative_sequence_length: (hash_ids, present_ids, present_segment_ids, state_update)."""
    op = "VarlenNGramHashMapping"
    h = _Hasher(op, info)
    cap = int(info.attrs.get("state_update_capacity", 0))
    if not 0 <= cap <= 8:
        raise ValueError(f"{op}: state_update_capacity must lie in [0, 8], got {cap}")
    want_seg = len(info.output_present) > 2 and info.output_present[2]

    def run(ids, multipliers, vocab, cu, past=None, offsets=None, eos=None, segments=None,
            past_segments=None, count=None):
        h.check(multipliers, vocab, offsets)
        bounds = [int(v) for v in np.asarray(cu).reshape(-1)]
        b, hist, fill = len(bounds) - 1, h.n - 1, _fill(h, eos)
        if ids.ndim != 1 or b < 1 or bounds[0] != 0 or bounds[-1] != ids.size or \
                np.any(np.diff(bounds) <= 0):
            raise ValueError(f"{op}: input_ids must be (tokens,) and cumulative_sequence_length "
                             f"rise strictly from 0 to {ids.size}, got {ids.shape}, {bounds}")
        if past is not None and past.shape != (b, hist):
            raise ValueError(f"{op}: past_ids must be {(b, hist)}, got {past.shape}")
        if want_seg and segments is None:
            raise ValueError(f"{op}: present_segment_ids requires segment_ids")
        if (cap > 0) != (count is not None):
            raise ValueError(f"{op}: capture_count is required exactly when "
                             f"state_update_capacity > 0")
        out = np.empty((ids.size, h.width), ids.dtype)
        present = np.empty((b, hist), ids.dtype)
        present_seg = np.zeros((b, hist), np.int32)
        update = np.full((b, cap, hist), h.pad, ids.dtype)
        for r in range(b):
            lo, hi = bounds[r], bounds[r + 1]
            head = np.full(hist, fill, ids.dtype) if past is None else past[r].astype(ids.dtype)
            ext = np.concatenate([head, ids[lo:hi]])[None]
            starts, seg_ext = None, None
            if segments is not None:
                seg_head = (np.full(hist, segments[lo], np.int32) if past_segments is None
                            else past_segments[r].astype(np.int32))
                seg_ext = np.concatenate([seg_head, segments[lo:hi].astype(np.int32)])
                # without past_segment_ids the history counts as the first token's segment
                starts = _segment_starts(seg_ext[None])[:, hist:]
                present_seg[r] = seg_ext[-hist:]
            floor = h.floor(ext, None if eos is None else fill, starts)
            out[lo:hi] = h(ext, floor, fill, multipliers, vocab, offsets)[0]
            present[r] = ext[0, -hist:]
            if cap:
                n = max(0, min(int(np.asarray(count).reshape(-1)[r]), cap, hi - lo))
                for j in range(n):
                    update[r, j] = ext[0, j + 1:j + 1 + hist]
        return out, present, present_seg, update

    return run
