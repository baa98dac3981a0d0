"""CPU kernel: com.microsoft BeamSearch over a GPT-2 style decoder subgraph or a T5/BART style
encoder-decoder pair (model_type 1, driven by `contrib_encdec.py`), what
onnxruntime.transformers' convert_generation emits for beam decoding.

Each step scores every beam's next tokens by log-softmax plus the beam's running sum, keeps
the best 2 * num_beams candidates per batch item and takes them in order: a candidate ending
in eos_token_id (among the first num_beams) becomes a finished hypothesis scored
sum / length ** length_penalty, the others continue as beams until num_beams are chosen.
A batch item is done once it holds num_beams hypotheses and, unless early_stopping, no beam
can still beat its worst one. The best num_return_sequences hypotheses are returned, padded
with pad_token_id to max_length.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu import _generation as gen
from onnxkiln.providers.cpu.contrib_encdec import EncoderDecoder
from onnxkiln.providers.cpu.contrib_generation import begin, search_driver, search_subgraphs
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.control import unbuilt
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

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
        return float(np.float32(total) / np.float32(length ** self.penalty))

    def worst(self) -> float:
        return min(s for s, _ in self.items) if self.items else 1e9

    def add(self, seq: np.ndarray, total: float) -> None:
        s = self.score(total, seq.size)
        if len(self.items) < self.beams or s > self.worst():
            self.items.append((s, seq.copy()))
            if len(self.items) > self.beams:
                self.items.remove(min(self.items, key=lambda t: t[0]))

    def finished(self, best_total: float, length: int) -> bool:
        if len(self.items) < self.beams:
            return False
        if self.early:
            return True
        return self.worst() >= self.score(best_total, length)


class _Beams:
    """The search state of one run: sequences (batch * beams, cur), beam sums, hypotheses."""

    def __init__(self, ids: np.ndarray, beams: int, max_len: int, penalty: float, early: bool,
                 done_shift: int = 1):
        """ids: (batch, L) the sequences' first columns, each row repeated `beams` times.

        done_shift: a full batch item is judged done against its best candidate's sum over
        the length after this step (GPT-2 style, 1) or before it (encoder-decoder, 0): the
        lengths that follow onnxruntime best on generated cases. Exact ties between the worst
        hypothesis and that bound can still be decided the other way by onnxruntime."""
        self.done_shift = done_shift
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
            if self.hyps[b].done:  # pad tokens on row 0's state, as onnxruntime: only the
                parents[b] = 0     # optional per-step scores show them
                continue
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
            best = float(total[b, top[b, 0]])
            self.hyps[b].done = self.hyps[b].finished(best, cur + self.done_shift)
        order = parents.reshape(-1)
        self.seqs = np.concatenate([self.seqs[order], tokens.reshape(-1, 1)], axis=1)
        self.sums = sums
        return order, tokens.reshape(-1)

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


def _counts(op: str, ins: list) -> tuple[int, int, float]:
    beams = gen.scalar(ins[3], f"{op} num_beams", None)
    returns = gen.scalar(ins[4], f"{op} num_return_sequences", None)
    if beams is None or returns is None:
        raise ValueError(f"{op}: num_beams and num_return_sequences are required inputs")
    if beams < 1 or not 1 <= returns <= beams:
        raise ValueError(f"{op}: need num_beams >= 1 and 1 <= num_return_sequences <= "
                         f"num_beams, got num_beams {beams}, num_return_sequences {returns}")
    return beams, returns, gen.scalar(ins[5], f"{op} length_penalty", 1.0, float)


@kernel("BeamSearch", since=1, domain=MS, factory=True, multi_output=True,
        capture=CaptureSupport.HOST_SYNC, variant="beamsearch.gpt")
def beam_search(info: NodeInfo) -> Callable[..., tuple]:
    """Beam search: sequences, the optional sequences_scores and per-step scores."""
    op = "BeamSearch"
    placeholder = unbuilt(info, search_subgraphs(info))
    if placeholder is not None:
        return placeholder
    dec = search_driver(op, info)
    early = bool(gen.int_attr(info, "early_stopping", 0))
    want_scores = len(info.output_present) > 2 and info.output_present[2]

    def run(*args) -> tuple:
        ins = list(args[:info.n_inputs]) + [None] * max(0, 12 - info.n_inputs)
        captured = args[info.n_inputs:]
        if ins[10] is not None or ins[11] is not None:
            raise ValueError(f"{op}: decoder_input_ids and logits_processor are not supported")
        pad, eos = gen.int_attr(info, "pad_token_id", 0), gen.int_attr(info, "eos_token_id", -1)
        ids, mask, max_len = gen.prompt(op, ins[0], ins[1], ins[9], pad,
                                        isinstance(dec, EncoderDecoder))
        beams, returns, penalty = _counts(op, ins)
        first, logits, dstate = begin(dec, ids, mask, pad, beams, captured)
        batch, length = first.shape
        state = _Beams(first, beams, max_len, penalty, early,
                       0 if isinstance(dec, EncoderDecoder) else 1)
        vocab = gen.vocab_size(op, info, logits)
        proc = gen.processors(op, info, vocab, batch, ins[2], ins[6], ins[7], ins[8])
        steps = []
        while True:
            scores = log_softmax(np.array(logits[:, :vocab], _F32))
            proc.apply(scores, state.seqs, state.seqs.shape[1] == length, beams)
            if want_scores:
                steps.append(scores + state.sums.reshape(-1, 1))
            order, tokens = state.advance(scores, eos, pad)
            if state.seqs.shape[1] >= max_len or all(h.done for h in state.hyps):
                break
            logits = dec.step(tokens, dstate, captured, order)
        seqs, best = state.finish(returns, pad)
        out = [seqs, best]
        if want_scores:
            out.append(np.stack(steps).reshape(len(steps), batch, beams, vocab))
        return tuple(out)

    return run
