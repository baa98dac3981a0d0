"""The beam search loop com.microsoft BeamSearch (`contrib_beam.py`, every model_type) and
WhisperBeamSearch (`contrib_whisper.py`) share, as onnxruntime's CPU kernel runs it.

Each step scores every beam's next tokens by log-softmax plus the beam's running sum, keeps
the best 2 * num_beams candidates per batch item and takes them in order: a candidate ending
in eos_token_id (among the first num_beams) becomes a finished hypothesis scored
sum / length ** length_penalty, the others continue as beams until num_beams are chosen.
A batch item is done once it holds num_beams hypotheses and, unless early_stopping, its worst
one scores at least a best candidate sum over the length before the step (onnxruntime reads
that sum from a window of the flat candidate scores shifted for every item but the first).
The best num_return_sequences hypotheses are returned, padded with pad_token_id to
max_length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnxkiln.providers.cpu import _generation as gen

__all__ = ["BeamRun", "counts", "decode", "log_softmax", "logits_processor"]

_I32 = np.dtype(np.int32)
_F32 = np.dtype(np.float32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


class _Hypotheses:
    """The finished hypotheses of one batch item, at most num_beams, best kept."""

    def __init__(self, beams: int, length_penalty: float, early_stopping: bool) -> None:
        self.beams, self.penalty, self.early = beams, length_penalty, early_stopping
        self.items: list[tuple[float, np.ndarray]] = []
        self.done = False

    def score(self, total: float, length: int) -> float:
        # float32 throughout, powf included, as onnxruntime's scorer computes it
        scale = np.power(np.float32(length), np.float32(self.penalty))
        return float(np.float32(total) / scale)

    def worst(self) -> float:
        return min(s for s, _ in self.items) if self.items else 1e9

    def add(self, seq: np.ndarray, total: float) -> None:
        s = self.score(total, seq.size)
        if len(self.items) < self.beams or s > self.worst():
            self.items.append((s, seq.copy()))
            if len(self.items) > self.beams:  # drop the latest of the tied worst
                worst = self.worst()
                last = max(i for i, (sc, _) in enumerate(self.items) if sc == worst)
                del self.items[last]

    def finished(self, best_total: float, length: int) -> bool:
        if len(self.items) < self.beams:
            return False
        if self.early:
            return True
        return self.worst() >= self.score(best_total, length)


class _Beams:
    """The search state of one run: sequences (batch * beams, cur), beam sums, hypotheses."""

    def __init__(self, ids: np.ndarray, beams: int, max_len: int, penalty: float, early: bool):
        """ids: (batch, L) the sequences' first columns, each row repeated `beams` times.

        A full batch item is judged done against a best sum over the sequence length before
        the step; `_bound` says which best sum."""
        self.batch, self.k, self.max_len = ids.shape[0], beams, max_len
        self.seqs = np.repeat(ids, beams, axis=0)
        self.sums = np.zeros((self.batch, beams), _F32)
        self.sums[:, 1:] = np.float32(-1e9)  # the first step expands beam 0 only
        self.hyps = [_Hypotheses(beams, penalty, early) for _ in range(self.batch)]

    def advance(self, scores: np.ndarray, eos: int, pad: int):
        """Choose the next beams from processed log-probs (batch * beams, V): returns the
        parent row and token of each new row."""
        k, vocab, cur = self.k, scores.shape[1], self.seqs.shape[1]
        total = (scores + self.sums.reshape(-1, 1)).reshape(self.batch, k * vocab)
        top = np.argsort(-total, axis=1, kind="stable")[:, :2 * k]
        parents = np.zeros((self.batch, k), np.int64)
        tokens = np.full((self.batch, k), pad, _I32)
        sums = np.zeros((self.batch, k), _F32)
        for b in range(self.batch):
            if self.hyps[b].done:  # pad tokens on row 0's state (on its own with one beam,
                parents[b] = 0 if k > 1 else b  # where onnxruntime reorders no pasts): only
                continue                        # the optional per-step scores show them
            chosen = 0
            for rank, idx in enumerate(top[b]):
                beam, tok = divmod(int(idx), vocab)
                row = b * k + beam
                if tok == eos:
                    if rank < k:
                        self.hyps[b].add(self.seqs[row], float(total[b, idx]))
                    continue
                parents[b, chosen], tokens[b, chosen] = row, tok
                sums[b, chosen] = total[b, idx]
                chosen += 1
                if chosen == k:
                    break
            self.hyps[b].done = self.hyps[b].finished(self._bound(total, top, b), cur)
        order = parents.reshape(-1)
        self.seqs = np.concatenate([self.seqs[order], tokens.reshape(-1, 1)], axis=1)
        self.sums = sums
        return order, tokens.reshape(-1)

    def _bound(self, total: np.ndarray, top: np.ndarray, b: int) -> float:
        """The best sum batch item b's done check compares with: onnxruntime takes the
        maximum of the flat (batch, 2 * beams) candidate scores over [b * beams,
        b * beams + 2 * beams), so from item 1 on the window starts in the item before."""
        flat = np.take_along_axis(total, top, axis=1).reshape(-1)
        return float(flat[b * self.k:b * self.k + 2 * self.k].max())

    def finish(self, returns: int, pad: int):
        """(sequences (batch, returns, max_len), their scores (batch, returns))."""
        out = np.full((self.batch, returns, self.max_len), pad, _I32)
        best = np.zeros((self.batch, returns), _F32)
        for b, hyp in enumerate(self.hyps):
            if not hyp.done:
                for j in range(self.k):
                    hyp.add(self.seqs[b * self.k + j], float(self.sums[b, j]))
            ranked = sorted(hyp.items, key=lambda t: -t[0])[:returns]
            for r, (s, seq) in enumerate(ranked):
                out[b, r, :seq.size] = seq
                best[b, r] = s
        return out, best


def counts(op: str, ins: list) -> tuple[int, int, float]:
    """num_beams, num_return_sequences and length_penalty from inputs 3 to 5, checked."""
    beams = gen.scalar(ins[3], f"{op} num_beams", None)
    returns = gen.scalar(ins[4], f"{op} num_return_sequences", None)
    if beams is None or returns is None:
        raise ValueError(f"{op}: num_beams and num_return_sequences are required inputs")
    if beams < 1 or not 1 <= returns <= beams:
        raise ValueError(f"{op}: need num_beams >= 1 and 1 <= num_return_sequences <= "
                         f"num_beams, got num_beams {beams}, num_return_sequences {returns}")
    return beams, returns, gen.scalar(ins[5], f"{op} length_penalty", 1.0, float)


def logits_processor(op: str, value) -> int:
    """The optional logits_processor input (>= 0; 0 when absent)."""
    kind = gen.scalar(value, f"{op} logits_processor", 0)
    if kind < 0:
        raise ValueError(f"{op}: logits_processor must be >= 0, got {kind}")
    return kind


@dataclass(frozen=True)
class BeamRun:
    """One beam search's settings: the loop `decode` runs with them."""

    beams: int
    returns: int
    max_len: int
    penalty: float
    early: bool
    eos: int
    pad: int
    vocab: int
    want_scores: bool
    stop_after_first: bool = True  # model_type 2 (Whisper) runs the decoder once first


def decode(run: BeamRun, first: np.ndarray, logits: np.ndarray, proc,
           step: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> list:
    """The loop of every beam search: [sequences, sequences_scores, scores when wanted].
    `first` (batch, L) starts the sequences, `logits` (batch * beams, V') are the first
    step's, `proc.apply` edits the log-probs, and `step(tokens, parents, sequences)` runs the
    decoder for the next logits. The per-step scores have onnxruntime's shape
    (max_length - L, batch, beams, vocab); steps never run (every item done) read 0."""
    batch, length = first.shape
    state = _Beams(first, run.beams, run.max_len, run.penalty, run.early)
    steps = np.zeros((run.max_len - length, batch * run.beams, run.vocab), _F32) \
        if run.want_scores else None
    n = 0
    while True:
        scores = log_softmax(np.array(logits[:, :run.vocab], _F32))
        with np.errstate(over="ignore"):  # a banned token's lowest float plus a sum: -inf
            proc.apply(scores, state.seqs, n == 0, run.beams)
            if steps is not None:
                steps[n] = scores + state.sums.reshape(-1, 1)
            order, tokens = state.advance(scores, run.eos, run.pad)
        n += 1
        if state.seqs.shape[1] >= run.max_len:
            break
        if all(h.done for h in state.hyps) and (n > 1 or run.stop_after_first):
            break
        logits = step(tokens, order, state.seqs)
    out = list(state.finish(run.returns, run.pad))
    if steps is not None:
        out.append(steps.reshape(-1, batch, run.beams, run.vocab))
    return out
