"""WhisperBeamSearch's logits processors after the common ones: temperature, then (with
logits_processor 1) the Whisper timestamp rules, in onnxruntime's order and float32 arithmetic.

Timestamp tokens are the ids from beginning_timestamp_token_id on. Per row, over its whole
sequence (decoder_input_ids included): no_timestamps and start_of_lm are always banned;
decoder_start, translate and transcribe once a timestamp precedes the last token; timestamps
come in pairs (after a lone one only timestamps or eos may follow, after a pair no timestamp),
never decrease, and the first lies within 50 of the beginning; and when the timestamps' total
log-probability beats every text token's, only timestamps remain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxkiln.providers.cpu import _generation as gen

__all__ = ["WhisperProcessors"]

_F32 = np.dtype(np.float32)
_LOWEST = np.float32(gen.NEG_INF)
_MAX_INITIAL_TIMESTAMP = 50  # onnxruntime's fixed max_initial_timestamp_index


@dataclass(frozen=True)
class WhisperProcessors:
    """The common processors, then temperature, then the timestamp rules when `timestamps`."""

    common: gen.Processors
    temperature: float = 1.0
    timestamps: bool = False
    eos: int = -1
    begin: int = -1  # beginning_timestamp_token_id
    banned: tuple[int, ...] = ()  # no_timestamps, start_of_lm
    after_first: tuple[int, ...] = ()  # decoder_start, translate, transcribe

    def apply(self, scores: np.ndarray, seqs: np.ndarray, first: bool, beams: int) -> None:
        """Edit log-probs scores (rows, V) in place for sequences seqs (rows, cur_len)."""
        self.common.apply(scores, seqs, first, beams)
        if self.temperature > 0 and self.temperature != 1.0:
            scores /= np.float32(self.temperature)
        if self.timestamps:
            for row in range(scores.shape[0]):
                self._row(scores[row], seqs[row])

    def _row(self, s: np.ndarray, seq: np.ndarray) -> None:
        beg, n = self.begin, seq.size
        stamps = np.nonzero(seq >= beg)[0]
        start = int(stamps[0]) + 1 if stamps.size else n  # tokens up to the first timestamp
        _ban(s, self.banned)
        if n > start:
            _ban(s, self.after_first)
        last = n > 0 and seq[-1] >= beg
        penultimate = n <= start or seq[n - 2] >= beg
        if last and penultimate:
            s[beg:] = _LOWEST
        elif last:
            s[:max(self.eos, 0)] = _LOWEST
        if stamps.size:
            s[beg:int(seq[stamps[-1]]) + (0 if last and not penultimate else 1)] = _LOWEST
        if n == start:
            s[beg + _MAX_INITIAL_TIMESTAMP + 1:] = _LOWEST
        stamp_part = s[beg:]
        live = stamp_part[stamp_part > _LOWEST]
        top = np.float32(stamp_part.max())
        total = np.exp(live - top, dtype=_F32).sum(dtype=_F32) if live.size else _F32.type(0)
        stamp_logprob = np.log(total) + top if total > 0 else _LOWEST
        if stamp_logprob > s[:beg].max():
            s[:beg] = _LOWEST


def _ban(s: np.ndarray, ids: tuple[int, ...]) -> None:
    for i in ids:
        if 0 <= i < s.size:
            s[i] = _LOWEST
