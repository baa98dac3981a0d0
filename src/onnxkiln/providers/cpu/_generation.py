"""What onnxruntime's generation ops (GreedySearch, BeamSearch, Sampling) share: reading their
scalar inputs, the logits processors, and the GPT-2 style decoder subgraph driver.

The decoder subgraph (model_type 0) takes input_ids, position_ids, attention_mask (int32) and
one past state per layer, shaped (2, batch, heads, past_length, head_size); it returns logits
(batch, length, vocab) and one present state per layer. The first run sees the whole prompt
with empty pasts, later runs one token per row with the previous presents as pasts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxkiln.errors import ModelLoadError
from onnxkiln.providers.base import NodeInfo

_I32 = np.dtype(np.int32)
_F32 = np.dtype(np.float32)
NEG_INF = np.finfo(np.float32).min  # what onnxruntime writes for a banned token


def scalar(value: np.ndarray | None, what: str, default: Any, kind: type = int) -> Any:
    """The one element of an optional shape-(1,) input, or `default` when it is absent."""
    if value is None:
        return default
    arr = np.asarray(value)
    if arr.size != 1:
        raise ValueError(f"{what} must hold one element (shape (1,)), got shape {arr.shape}")
    return kind(arr.reshape(-1)[0])


def int_attr(info: NodeInfo, name: str, default: int) -> int:
    return int(info.attrs.get(name, default))


@dataclass(frozen=True)
class NodeSchema:
    """What onnxruntime's schema check reads of a search node when it loads the model."""

    attributes: frozenset[str]
    required: tuple[str, ...]
    max_inputs: int
    max_outputs: int

    def check(self, op: str, info: NodeInfo, hint: str = "") -> None:
        """Refuse, as onnxruntime refuses the model, an attribute the schema lacks, a missing
        required one, or more inputs or outputs than it declares; `hint` follows an
        unrecognized attribute's message."""
        names = set(info.node.attributes) if info.node is not None else set(info.attrs)
        where = f"this is an invalid model: node {info.describe()}"
        unknown = sorted(names - self.attributes)
        if unknown:
            raise ModelLoadError(f"{where}: Unrecognized attribute: {unknown[0]} for operator "
                                 f"{op} (it takes {', '.join(sorted(self.attributes))}){hint}")
        require_attributes(info, self.required)
        for kind, n, most in (("input", info.n_inputs, self.max_inputs),
                              ("output", info.n_outputs, self.max_outputs)):
            if n > most:
                raise ModelLoadError(f"{where}: {op} has {kind} size {n}, at most {most}")


def require_attributes(info: NodeInfo, names: tuple[str, ...]) -> None:
    """Refuse, as onnxruntime's schema check refuses the model, a search node without one of
    the attributes its schema requires (eos_token_id, pad_token_id)."""
    present = set(info.node.attributes) if info.node is not None else set(info.attrs)
    missing = [n for n in names if n not in present]
    if missing:
        raise ModelLoadError(f"this is an invalid model: node {info.describe()}: Required "
                             f"attribute '{missing[0]}' is missing")


@dataclass(frozen=True)
class Processors:
    """The logits processors every search op applies, in onnxruntime's order: repetition
    penalty, no-repeat n-grams, vocab mask, the first step's prefix vocab mask, min length."""

    eos: int
    min_length: int = 0
    repetition_penalty: float = 1.0
    no_repeat_ngram: int = 0
    vocab_mask: np.ndarray | None = None  # (V,) bool: allowed
    prefix_mask: np.ndarray | None = None  # (batch, V) bool: allowed on the first step

    def apply(self, scores: np.ndarray, seqs: np.ndarray, first: bool, beams: int) -> None:
        """Edit scores (rows, V) in place for sequences seqs (rows, cur_len)."""
        if self.repetition_penalty != 1.0:
            pen = np.float32(self.repetition_penalty)
            for row in range(scores.shape[0]):
                toks = np.unique(seqs[row])
                toks = toks[(toks >= 0) & (toks < scores.shape[1])]
                s = scores[row, toks]
                scores[row, toks] = np.where(s < 0, s * pen, s / pen)
        if self.no_repeat_ngram > 0:
            self._block_ngrams(scores, seqs)
        if self.vocab_mask is not None:
            scores[:, ~self.vocab_mask] = NEG_INF
        if first and self.prefix_mask is not None:
            allowed = np.repeat(self.prefix_mask, beams, axis=0)
            scores[~allowed] = NEG_INF
        if seqs.shape[1] < self.min_length and 0 <= self.eos < scores.shape[1]:
            scores[:, self.eos] = NEG_INF

    def _block_ngrams(self, scores: np.ndarray, seqs: np.ndarray) -> None:
        n = self.no_repeat_ngram
        length = seqs.shape[1]
        if length + 1 < n:
            return
        for row in range(scores.shape[0]):
            seq = seqs[row]
            tail = seq[length - n + 1:] if n > 1 else seq[:0]
            for i in range(length - n + 1):
                if np.array_equal(seq[i:i + n - 1], tail):
                    tok = seq[i + n - 1]
                    if 0 <= tok < scores.shape[1]:
                        scores[row, tok] = NEG_INF


def processors(op: str, info: NodeInfo, vocab: int, batch: int, min_length, repetition,
               vocab_mask, prefix_mask) -> Processors:
    """Processors from the node's attributes and its optional inputs, checked."""
    ngram = int_attr(info, "no_repeat_ngram_size", 0)
    if ngram < 0:
        raise ValueError(f"{op}: no_repeat_ngram_size must be >= 0, got {ngram}")
    pen = scalar(repetition, f"{op} repetition_penalty", 1.0, float)
    if not pen > 0:
        raise ValueError(f"{op}: repetition_penalty must be > 0, got {pen}")
    vm = pm = None
    if vocab_mask is not None:
        if vocab_mask.shape != (vocab,):
            raise ValueError(f"{op}: vocab_mask must be ({vocab},), got {vocab_mask.shape}")
        vm = np.asarray(vocab_mask) != 0
    if prefix_mask is not None:
        if prefix_mask.shape != (batch, vocab):
            raise ValueError(f"{op}: prefix_vocab_mask must be ({batch}, {vocab}), got "
                             f"{prefix_mask.shape}")
        pm = np.asarray(prefix_mask) != 0
    return Processors(int_attr(info, "eos_token_id", -1),
                      scalar(min_length, f"{op} min_length", 0), pen, ngram, vm, pm)


class GptDecoder:
    """Runs a GPT-2 style decoder subgraph (and its optional init_decoder) for a search op."""

    def __init__(self, op: str, info: NodeInfo) -> None:
        if int_attr(info, "model_type", 0) != 0:
            raise ValueError(f"{op}: the GPT-2 style decoder driver serves model_type 0, got "
                             f"model_type {int_attr(info, 'model_type', 0)}")
        self.op = op
        self.decoder = info.subgraphs["decoder"]
        self.first_decoder = info.subgraphs.get("init_decoder", self.decoder)
        graph = info.node.attributes["decoder"].value
        n_in, n_out = len(graph.inputs), len(graph.outputs)
        if n_in < 4 or n_out != n_in - 2:
            raise ValueError(f"{op}: the decoder subgraph must take input_ids, position_ids, "
                             f"attention_mask and one past per layer and return logits and one "
                             f"present per layer; it has {n_in} inputs and {n_out} outputs")
        self.layers = n_in - 3
        self.past_dims, self.past_dtype = self._past_meta(graph.inputs[3])

    def _past_meta(self, past) -> tuple[tuple[int, int], np.dtype]:
        dims = None if past.shape is None else list(past.shape)
        if dims is None or len(dims) != 5 or not all(isinstance(dims[i], int) for i in (0, 2, 4)) \
                or dims[0] != 2:
            raise ValueError(f"{self.op}: the decoder's past input {past.name!r} must be declared "
                             f"(2, batch, num_heads, past_length, head_size) with num_heads and "
                             f"head_size fixed, got {dims}")
        from onnxkiln.dtypes import DataType

        dtype = DataType(past.dtype).numpy if past.dtype is not None else _F32
        return (dims[2], dims[4]), dtype

    def start(self, ids: np.ndarray, mask: np.ndarray, pad: int, captured: Sequence[Any]):
        """First run on the prompt ids (rows, S) with mask (rows, S): (last logits, state).

        Position ids count the non-pad tokens of each row (pads get 0), whatever the mask
        says: onnxruntime derives them from the ids alone, and the next token continues
        from that count."""
        pos = np.zeros(ids.shape, _I32)
        counts = np.zeros(ids.shape[0], _I32)
        for row in range(ids.shape[0]):
            on = ids[row] != pad
            pos[row, on] = np.arange(on.sum(), dtype=_I32)
            counts[row] = on.sum()
        heads, size = self.past_dims
        past = np.zeros((2, ids.shape[0], heads, 0, size), self.past_dtype)
        outs = self.first_decoder((ids, pos, mask, *([past] * self.layers)), captured)
        return last_logits(self.op, outs[0], ids.shape[0]), [counts, mask, list(outs[1:])]

    def step(self, tokens: np.ndarray, state: list, captured: Sequence[Any],
             order: np.ndarray | None = None) -> np.ndarray:
        """One decoding run on tokens (rows,); `order` picks the parent row of each new row
        (beam search), reordering positions, masks and pasts; returns the last logits."""
        counts, mask, pasts = state
        if order is not None:
            counts, mask = counts[order], mask[order]
            pasts = [p[:, order] for p in pasts]
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), _I32)], axis=1)
        pos = counts.reshape(-1, 1).astype(_I32)
        outs = self.decoder((tokens.reshape(-1, 1).astype(_I32), pos, mask, *pasts), captured)
        state[:] = [counts + 1, mask, list(outs[1:])]
        return last_logits(self.op, outs[0], tokens.shape[0])




def last_logits(op: str, logits: Any, rows: int) -> np.ndarray:
    """A subgraph's logits (rows, length, vocab) at the last position, as float32 (rows, V),
    or a clear error naming the op."""
    if not isinstance(logits, np.ndarray) or logits.ndim != 3 or logits.shape[0] != rows:
        raise ValueError(f"{op}: the subgraph logits must be (batch, length, vocab) "
                         f"with {rows} rows, got {getattr(logits, 'shape', type(logits))}")
    return logits[:, -1, :].astype(_F32)

def prompt(op: str, input_ids: np.ndarray, max_length: np.ndarray, attention_mask, pad: int,
           encoder: bool = False):
    """Check the prompt inputs; return (ids int32, mask int32, max_length).

    For an encoder-decoder model (`encoder`) the output sequences start from the one
    decoder_start_token_id, and the default mask hides only leading pads (a pad id after
    the first real token stays visible), as onnxruntime builds it."""
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or ids.dtype.kind not in "iu" or ids.shape[1] == 0:
        raise ValueError(f"{op}: input_ids must be a non-empty int32 (batch, sequence_length) "
                         f"tensor, got {ids.dtype} {ids.shape}")
    length = scalar(max_length, f"{op} max_length", None)
    if length is None:
        raise ValueError(f"{op}: max_length is required")
    if encoder and length <= 1:
        raise ValueError(f"{op}: max_length ({length}) must be greater than 1 (sequences start "
                         f"with decoder_start_token_id)")
    if not encoder and length <= ids.shape[1]:
        raise ValueError(f"{op}: max_length ({length}) must be greater than the input sequence "
                         f"length ({ids.shape[1]})")
    if attention_mask is None and encoder:
        mask = (np.cumsum(ids != pad, axis=1) > 0).astype(_I32)
    elif attention_mask is None:
        mask = (ids != pad).astype(_I32)
    else:
        if attention_mask.shape != ids.shape:
            raise ValueError(f"{op}: attention_mask must match input_ids {ids.shape}, got "
                             f"{attention_mask.shape}")
        mask = np.asarray(attention_mask).astype(_I32)
    return ids.astype(_I32), mask, length


def vocab_size(op: str, info: NodeInfo, logits: np.ndarray) -> int:
    """The vocab_size attribute (when set) or the decoder's logits width."""
    v = int_attr(info, "vocab_size", -1)
    if v <= 0:
        return logits.shape[1]
    if v > logits.shape[1]:
        raise ValueError(f"{op}: vocab_size {v} exceeds the decoder's logits width "
                         f"{logits.shape[1]}")
    return v
