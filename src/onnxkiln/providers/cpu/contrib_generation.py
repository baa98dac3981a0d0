"""CPU kernels: com.microsoft GreedySearch and Sampling, the generation loops that
onnxruntime.transformers' convert_generation wraps around a GPT-2 style decoder subgraph
(GreedySearch also around a T5/BART encoder-decoder pair, model_type 1).

Both run the decoder on the prompt, then one token per row until every row has produced
eos_token_id or the sequences reach max_length. A row's eos and every later position read
pad_token_id, as onnxruntime writes them; sequences are (batch, max_length). BeamSearch lives
in `contrib_beam.py`; the decoder driver and logits processors in `_generation.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu import _generation as gen
from onnxkiln.providers.cpu.contrib_encdec import EncoderDecoder, model_type
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.control import unbuilt
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

_I32 = np.dtype(np.int32)
_F32 = np.dtype(np.float32)


def search_subgraphs(info: NodeInfo) -> tuple[str, ...]:
    """The graph attributes a search node sets that its kernel runs."""
    attrs = info.node.attributes if info.node is not None else {}
    return tuple(n for n in ("decoder", "init_decoder", "encoder") if n == "decoder" or n in attrs)


def search_driver(op: str, info: NodeInfo) -> gen.GptDecoder | EncoderDecoder:
    """The subgraph driver for the node's model_type (0: GPT-2 style, 1: encoder-decoder)."""
    if model_type(op, info) == 1:
        return EncoderDecoder(op, info)
    return gen.GptDecoder(op, info)


def begin(dec, ids: np.ndarray, mask: np.ndarray, pad: int, beams: int,
          captured: tuple) -> tuple[np.ndarray, np.ndarray, list]:
    """Start decoding: (the sequences' first columns (batch, L), first logits (batch * beams,
    V), driver state). A GPT-2 style decoder continues the prompt (rows repeated `beams`
    times); an encoder-decoder pair starts from decoder_start_token_id."""
    if isinstance(dec, EncoderDecoder):
        logits, state = dec.start(ids, mask, beams, captured)
        return dec.first_tokens(ids.shape[0]), logits, state
    logits, state = dec.start(np.repeat(ids, beams, axis=0), np.repeat(mask, beams, axis=0),
                              pad, captured)
    return ids, logits, state


def _split(info: NodeInfo, args: tuple, n_inputs: int) -> tuple[list, tuple]:
    """The node's inputs (absent ones None, padded to the schema's count) and the captures."""
    ins = list(args[:info.n_inputs]) + [None] * max(0, n_inputs - info.n_inputs)
    return ins, args[info.n_inputs:]


def _decode(op: str, info: NodeInfo, dec, ins: list, captured: tuple,
            choose: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
    """The loop GreedySearch and Sampling share: `choose(scores, step)` picks each row's
    next token from its processed scores (rows, V)."""
    pad, eos = gen.int_attr(info, "pad_token_id", 0), gen.int_attr(info, "eos_token_id", -1)
    encdec = isinstance(dec, EncoderDecoder)
    ids, mask, max_len = gen.prompt(op, ins[0], ins[1], ins[6], pad, encdec)
    first, logits, state = begin(dec, ids, mask, pad, 1, captured)
    batch, length = first.shape
    vocab = gen.vocab_size(op, info, logits)
    proc = gen.processors(op, info, vocab, batch, ins[2], ins[3], ins[4], ins[5])
    out = np.full((batch, max_len), pad, _I32)
    out[:, :length] = first
    done = np.zeros(batch, bool)
    cur = length
    while True:
        scores = np.array(logits[:, :vocab], _F32)
        proc.apply(scores, out[:, :cur], cur == length, 1)
        tok = choose(scores, cur - length).astype(_I32)
        done |= tok == eos
        tok[done] = pad
        out[:, cur] = tok
        cur += 1
        if cur >= max_len or done.all():
            return out
        logits = dec.step(tok, state, captured)


@kernel("GreedySearch", since=1, domain=MS, factory=True, capture=CaptureSupport.HOST_SYNC,
        variant="greedysearch.gpt")
def greedy_search(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Greedy decoding: each step takes the highest processed score (first on ties). Serves
    model_type 1 (encoder-decoder) too, which onnxruntime's CPU GreedySearch refuses."""
    op = "GreedySearch"
    gen.require_attributes(info, ("eos_token_id", "pad_token_id"))
    placeholder = unbuilt(info, search_subgraphs(info))
    if placeholder is not None:
        return placeholder
    dec = search_driver(op, info)

    def run(*args) -> np.ndarray:
        ins, captured = _split(info, args, 7)
        return _decode(op, info, dec, ins, captured, lambda s, _: s.argmax(axis=1))

    return run


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def top_p_filter(scores: np.ndarray, top_p: float, keep: int, fill: float) -> np.ndarray:
    """Scores with `fill` outside the smallest highest-probability set whose probabilities
    reach top_p (at least `keep` tokens stay)."""
    order = np.argsort(-scores, axis=1, kind="stable")
    probs = np.take_along_axis(_softmax(scores), order, axis=1)
    before = np.cumsum(probs, axis=1) - probs  # mass of the better tokens
    drop = before >= np.float32(top_p)
    drop[:, :max(keep, 1)] = False
    out = scores.copy()
    rows = np.nonzero(drop)[0]
    out[rows, order[drop]] = np.float32(fill)
    return out


class _Sampler:
    """Sampling's per-step choice: temperature, top-p, then one draw from the softmax; keeps
    the last step's filtered scores for the optional output. presence_mask and
    presence_penalty belong to custom sampling (custom=1, refused), so they are not applied."""

    def __init__(self, op: str, info: NodeInfo) -> None:
        self.temperature = float(info.attrs.get("temperature", 1.0))
        self.top_p = float(info.attrs.get("top_p", 0.0))
        self.fill = float(info.attrs.get("filter_value", -np.inf))
        self.keep = gen.int_attr(info, "min_tokens_to_keep", 1)
        self.custom = gen.int_attr(info, "custom", 0)
        if not self.temperature > 0:
            raise ValueError(f"{op}: temperature must be > 0, got {self.temperature}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"{op}: top_p must lie in [0, 1], got {self.top_p}")
        if self.keep < 1:
            raise ValueError(f"{op}: min_tokens_to_keep must be >= 1, got {self.keep}")
        if self.custom:
            raise ValueError(f"{op}: custom=1 sampling is not supported")
        self.filtered: np.ndarray | None = None
        self.rng: np.random.Generator | None = None

    def __call__(self, scores: np.ndarray, step: int) -> np.ndarray:
        if self.temperature != 1.0:
            scores = scores / np.float32(self.temperature)
        if 0.0 < self.top_p < 1.0:
            scores = top_p_filter(scores, self.top_p, self.keep, self.fill)
        self.filtered = scores
        probs = _softmax(scores.astype(np.float64))
        draws = self.rng.random(scores.shape[0])[:, None]
        cdf = np.cumsum(probs, axis=1)
        return np.minimum((cdf < draws * cdf[:, -1:]).sum(axis=1), scores.shape[1] - 1)


@kernel("Sampling", since=1, domain=MS, factory=True, multi_output=True,
        capture=CaptureSupport.HOST_SYNC, variant="sampling.gpt")
def sampling(info: NodeInfo) -> Callable[..., tuple]:
    """Top-p sampling with temperature; the `seed` input makes a run reproducible (a
    different generator from onnxruntime's, so the same seed draws other tokens)."""
    op = "Sampling"
    gen.require_attributes(info, ("eos_token_id", "pad_token_id"))
    placeholder = unbuilt(info, search_subgraphs(info))
    if placeholder is not None:
        return placeholder
    dec = gen.GptDecoder(op, info)
    _Sampler(op, info)  # refuse bad attributes at plan time

    def run(*args) -> tuple:
        ins, captured = _split(info, args, 9)
        sampler = _Sampler(op, info)
        seed = gen.scalar(ins[8], f"{op} seed", None)
        sampler.rng = np.random.default_rng(seed)
        if ins[7] is not None and (np.ndim(ins[7]) != 2 or
                                   np.shape(ins[7])[0] != np.shape(ins[0])[0]):
            raise ValueError(f"{op}: presence_mask must be (batch, vocab_size), got "
                             f"{np.shape(ins[7])}")
        seqs = _decode(op, info, dec, ins, captured, sampler)
        return seqs, sampler.filtered

    return run
