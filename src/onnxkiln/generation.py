"""Token generation with a decoder graph: greedy or sampled, batched, streamed.

    from onnxkiln.generation import generate
    result = generate("folder/with/genai_config.json", [5, 6, 7], max_new_tokens=32)
    result.tokens[0]            # the new tokens of row 0
    result.path                 # "captured", "bound" or "plain": what ran the decode steps

The loop keeps the KV cache in device bindings (`run_with_device_bindings`: the present is
written into the past's buffer, O(1) per token), and the decode step is recorded once and
replayed ("auto"; on the CPU too: a host replay runs kernels specialised for the step's
shapes, the fastest bound path in bench/decode_real.py).
Where a faster path does not apply it falls back (bindings refused: plain `run`; capture
declined: the bound step) and says why in `GenerateResult.fallbacks`. Input names and the
KV layout come from onnxruntime-genai's `genai_config.json` beside the model when there is
one, else from the graph (see `onnxkiln.generation_layout`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxkiln.errors import CaptureError, DeviceBindingError, InvalidInputError
from onnxkiln.generation_layout import GENAI_CONFIG, DecoderLayout, DecoderLayoutError
from onnxkiln.generation_runners import BoundRunner, CapturedRunner, PlainRunner, Timeline

__all__ = ["DecoderLayout", "DecoderLayoutError", "GenerateResult", "Sampling", "generate",
           "load_decoder"]

PATHS = ("auto", "captured", "bound", "plain")
_RUNNERS = {"captured": CapturedRunner, "bound": BoundRunner, "plain": PlainRunner}
_CONFIG = object()  # eos_token_id default: the stop tokens the model's config names


@dataclass
class GenerateResult:
    """What `generate` produced and how.

    `tokens[b]`: row b's new tokens, up to and including the stop token that ended it;
    `sequences`: the same as one [batch, steps] array, `pad` after a row stopped;
    `finish_reasons[b]`: "stop" (a stop token), "length" (the token budget) or "callback";
    `path`: what ran the decode steps ("captured", "bound", "plain"); `fallbacks`: why a
    faster path was not taken; `prefill_ms`: the prompt run and the first token;
    `step_ms`: each later step (run, sampling, callback); `counters`: the path's counters
    (decode memo deltas, captures and replays).
    """

    tokens: list[list[int]]
    sequences: np.ndarray
    finish_reasons: list[str]
    path: str
    fallbacks: list[str]
    prefill_ms: float
    step_ms: list[float]
    counters: dict[str, Any]
    layout: DecoderLayout = field(repr=False)

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: tokens of every row over the time of the steps after prefill."""
        seconds = sum(self.step_ms) / 1e3
        return self.sequences.shape[0] * len(self.step_ms) / seconds if seconds else 0.0


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked from a row's logits: argmax unless `do_sample` (and
    temperature 0 or top_k 1 are argmax too); else softmax(logits / temperature) over the
    top_k highest, cut to the smallest set whose mass reaches top_p, drawn from `rng`.
    `repetition_penalty` first divides positive (multiplies negative) logits of seen tokens."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 \
                or self.repetition_penalty <= 0:
            raise InvalidInputError(
                f"sampling settings out of range: temperature {self.temperature} (>= 0), top_p "
                f"{self.top_p} (0 < p <= 1), top_k {self.top_k} (>= 0), repetition_penalty "
                f"{self.repetition_penalty} (> 0)")

    def choose(self, logits: np.ndarray, seen: np.ndarray, rng: np.random.Generator) -> int:
        """One row's next token from its logits [vocab]; `seen` the row's tokens so far."""
        if self.repetition_penalty != 1.0 and seen.size:
            logits = logits.copy()
            ids = np.unique(seen)
            ids = ids[ids < logits.shape[0]]
            picked = logits[ids]
            logits[ids] = np.where(picked > 0, picked / self.repetition_penalty,
                                   picked * self.repetition_penalty)
        if not self.do_sample or self.temperature == 0 or self.top_k == 1:
            return int(np.argmax(logits))
        scores = logits.astype(np.float64) / self.temperature
        order = np.argsort(-scores, kind="stable")
        if self.top_k:
            order = order[: self.top_k]
        probs = np.exp(scores[order] - scores[order[0]])
        probs /= probs.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        pick = int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right"))
        return int(order[min(pick, len(order) - 1)])


def load_decoder(model: Any, config: str | Path | None = None,
                 layout: DecoderLayout | None = None) -> tuple[Any, DecoderLayout]:
    """(session, layout) for `model`: an onnxkiln InferenceSession, a model file, or a folder
    holding genai_config.json. The layout is `layout` if given, else the genai config in
    `config` (a folder or the json) or beside the model file, else inferred from the graph."""
    from onnxkiln.session import InferenceSession

    session = model
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.is_dir():
            config = config or path
            name = DecoderLayout.from_genai_config(path).extra["filename"] \
                if (path / GENAI_CONFIG).exists() else "model.onnx"
            path = path / name
        elif config is None and (path.parent / GENAI_CONFIG).exists():
            config = path.parent
        session = InferenceSession.load(path)
    if not hasattr(session, "run_with_device_bindings"):
        raise DecoderLayoutError(f"generate needs an onnxkiln InferenceSession or a model path, "
                                 f"got {type(model).__name__}")
    if layout is None:
        layout = DecoderLayout.from_genai_config(config, session) if config is not None \
            else DecoderLayout.infer(session)
    return session, layout


def generate(model: Any, prompt: Any, *, max_new_tokens: int | None = None,
             max_length: int | None = None, eos_token_id: Any = _CONFIG,
             pad_token_id: int | None = None, attention_mask: Any = None,
             do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int | None = None,
             rng: np.random.Generator | None = None,
             callback: Callable[[int, list[int]], bool | None] | None = None,
             path: str = "auto", capacity: int | None = None, config: str | Path | None = None,
             layout: DecoderLayout | None = None) -> GenerateResult:
    """Generate tokens after `prompt` with a decoder graph.

    Args:
        model: an onnxkiln `InferenceSession`, a model file, or a folder with
            genai_config.json (see `load_decoder`).
        prompt: token ids: one list, a list of lists (ragged rows), or a [batch, seq] array
            with `attention_mask` (1 for tokens, 0 for padding on either side).
        max_new_tokens: tokens to generate per row; default `max_length` minus the longest
            prompt, else 20.
        max_length: prompt plus new tokens of the longest row.
        eos_token_id: stop token(s): an int, a list, or None for none; default the config's.
        pad_token_id: emitted by rows that stopped (and fed back for them); default the
            config's pad, else the first stop token, else 0.
        do_sample, temperature, top_k, top_p, repetition_penalty: see `Sampling`; with
            `do_sample=False` (the default) the choice is greedy (argmax).
        seed, rng: the numpy Generator sampling draws from (`rng`, else one seeded with
            `seed`): the same seed gives the same tokens.
        callback: called after every step as `callback(step, tokens)` with each row's new
            token (pad for stopped rows); returning False stops generation.
        path: "auto" (as "captured"), "captured" (the decode step recorded once and
            replayed), "bound" (KV bindings, the decode memo) or
            "plain" (`run`); each falls back to the next where it does not apply.
        capacity: KV positions to allocate (default prompt plus new tokens).
        config, layout: where the names and KV layout come from (see `load_decoder`).

    Returns:
        A `GenerateResult` with the tokens, per-step times and the path that ran.

    Raises:
        DecoderLayoutError: the graph is not a decoder, or cannot take this batch.
        InvalidInputError: bad prompt, lengths or sampling settings.
    """
    if path not in PATHS:
        raise InvalidInputError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    session, layout = load_decoder(model, config, layout)
    rows = _rows(prompt, attention_mask)
    _check_batch(layout, rows)
    width = max(len(r) for r in rows)
    new = _budget(max_new_tokens, max_length, width)
    stops = _stops(layout, eos_token_id)
    pad = pad_token_id if pad_token_id is not None else (
        layout.pad if layout.pad is not None else (min(stops) if stops else 0))
    capacity = _capacity(layout, capacity, width + new)
    sampling = Sampling(do_sample, temperature, top_k, top_p, repetition_penalty)
    loop = _Loop(session, layout, rows, pad, capacity, stops, sampling,
                 rng if rng is not None else np.random.default_rng(seed), callback)
    return loop.run(path, new)


class _Loop:
    """One generation: the runner fallbacks, the per-step token choice and bookkeeping."""

    def __init__(self, session: Any, layout: DecoderLayout, rows: list[list[int]], pad: int,
                 capacity: int, stops: frozenset[int], sampling: Sampling,
                 rng: np.random.Generator, callback: Callable | None) -> None:
        self.session, self.layout, self.rows, self.pad = session, layout, rows, pad
        self.capacity, self.stops, self.sampling, self.rng = capacity, stops, sampling, rng
        self.callback = callback
        self.seen = [np.asarray(r, np.int64) for r in rows]
        self.out: list[list[int]] = [[] for _ in rows]
        self.reasons: list[str | None] = [None] * len(rows)
        self.fallbacks: list[str] = []

    def run(self, path: str, new: int) -> GenerateResult:
        if path == "auto":
            path = "captured"
        kinds = {"captured": ["captured", "bound", "plain"], "bound": ["bound", "plain"],
                 "plain": ["plain"]}[path]
        start = time.perf_counter()
        runner, logits = self._prefill(kinds)
        steps: list[float] = []
        try:
            self._take(logits, 0)
            prefill_ms = (time.perf_counter() - start) * 1e3
            for step in range(1, new):
                if all(self.reasons):
                    break
                tick = time.perf_counter()
                last = np.array([[o[-1] if r is None else self.pad]
                                 for o, r in zip(self.out, self.reasons)], np.int64)
                self._take(runner.run(last, False), step)
                steps.append((time.perf_counter() - tick) * 1e3)
            counters = runner.counters()
        finally:
            runner.close()
        used = runner.path
        if used == "captured" and not counters.get("captures"):
            self.fallbacks.append(f"captured: {counters.get('capture_declined', 'no capture')}")
            used = "bound"
        return self._result(used, prefill_ms, steps, counters)

    def _prefill(self, kinds: list[str]) -> tuple[Any, np.ndarray]:
        """The first runner that takes the prompt, and the prompt's last logits."""
        for kind in kinds:
            runner = None
            try:
                timeline = Timeline(self.layout, self.rows, self.pad, self.capacity)
                runner = _RUNNERS[kind](self.session, self.layout, timeline)
                return runner, self._feed_prompt(runner, timeline)
            except (DeviceBindingError, CaptureError) as exc:
                if kind == kinds[-1]:
                    raise
                self.fallbacks.append(f"{kind}: {exc}")
                if runner is not None:
                    runner.close()
        raise AssertionError("unreachable: the last kind re-raises")

    def _feed_prompt(self, runner: Any, timeline: Timeline) -> np.ndarray:
        ids = timeline.prompt()
        if self.layout.input_length is None or self.layout.input_length == ids.shape[1]:
            return runner.run(ids, True)
        if self.layout.input_length != 1:
            raise DecoderLayoutError(
                f"input '{self.layout.input_ids}' takes exactly {self.layout.input_length} "
                f"tokens per run; a prompt of {ids.shape[1]} cannot be fed")
        for j in range(ids.shape[1]):  # one token per run: the prompt token by token
            logits = runner.run(ids[:, j:j + 1], True)
        return logits

    def _take(self, logits: np.ndarray, step: int) -> None:
        """Choose each live row's token from `logits` [batch, vocab]; stop rows; callback."""
        emitted = []
        for b, row in enumerate(logits):
            if self.reasons[b] is not None:
                emitted.append(self.pad)
                continue
            token = self.sampling.choose(row, self.seen[b], self.rng)
            self.out[b].append(token)
            if self.sampling.repetition_penalty != 1.0:  # the only reader of `seen`
                self.seen[b] = np.append(self.seen[b], token)
            emitted.append(token)
            if token in self.stops:
                self.reasons[b] = "stop"
        if self.callback is not None and self.callback(step, emitted) is False:
            self.reasons = [r or "callback" for r in self.reasons]

    def _result(self, path: str, prefill_ms: float, steps: list[float],
                counters: dict) -> GenerateResult:
        width = max(len(o) for o in self.out)
        seq = np.full((len(self.out), width), self.pad, np.int64)
        for b, o in enumerate(self.out):
            seq[b, : len(o)] = o
        reasons = [r or "length" for r in self.reasons]
        return GenerateResult(self.out, seq, reasons, path, self.fallbacks, prefill_ms, steps,
                              counters, self.layout)


def _rows(prompt: Any, mask: Any) -> list[list[int]]:
    """The prompt as ragged rows of ints (a masked array keeps its tokens where mask is 1)."""
    if isinstance(prompt, np.ndarray) or mask is not None:
        ids = np.asarray(prompt)
        ids = ids[None] if ids.ndim == 1 else ids
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise InvalidInputError(f"prompt array must be integer [batch, seq], got {ids.dtype}"
                                    f"{list(ids.shape)}")
        if mask is None:
            return [list(map(int, r)) for r in ids]
        mask = np.asarray(mask)
        if mask.shape != ids.shape:
            raise InvalidInputError(f"attention_mask shape {mask.shape} differs from the "
                                    f"prompt's {ids.shape}")
        rows = [list(map(int, r[m.astype(bool)])) for r, m in zip(ids, mask)]
    elif prompt and all(isinstance(t, (int, np.integer)) for t in prompt):
        rows = [[int(t) for t in prompt]]
    else:
        try:
            rows = [[int(t) for t in r] for r in prompt]
        except TypeError as exc:
            raise InvalidInputError(f"prompt must be token ids (a list, a list of lists or an "
                                    f"array), got {type(prompt).__name__}") from exc
    if not rows or any(not r for r in rows):
        raise InvalidInputError("every prompt row needs at least one token")
    return rows


def _check_batch(layout: DecoderLayout, rows: list[list[int]]) -> None:
    """Refuse batches the graph cannot express (with the reason)."""
    if layout.batch is not None and len(rows) != layout.batch:
        raise DecoderLayoutError(f"input '{layout.input_ids}' has a fixed batch of "
                                 f"{layout.batch}; got {len(rows)} rows")
    ragged = len({len(r) for r in rows}) > 1
    if ragged and layout.attention_mask is None:
        raise DecoderLayoutError("prompts of different lengths need padding, and this graph "
                                 "has no attention_mask input to mask it; run rows one by one")
    if ragged and layout.shared_buffer and layout.input_length == 1:
        raise DecoderLayoutError("a graph that takes one token per run and reads lengths "
                                 "from the mask cannot take prompts of different lengths")


def _budget(max_new_tokens: int | None, max_length: int | None, width: int) -> int:
    if max_new_tokens is None:
        max_new_tokens = 20 if max_length is None else max_length - width
    if max_new_tokens < 1:
        raise InvalidInputError(f"nothing to generate: max_new_tokens {max_new_tokens} "
                                f"(max_length {max_length}, longest prompt {width})")
    return int(max_new_tokens)


def _stops(layout: DecoderLayout, eos: Any) -> frozenset[int]:
    if eos is _CONFIG:
        return frozenset(layout.eos)
    if eos is None:
        return frozenset()
    return frozenset([int(eos)] if isinstance(eos, (int, np.integer)) else map(int, eos))


def _capacity(layout: DecoderLayout, capacity: int | None, needed: int) -> int:
    """KV positions to allocate: enough for the prompt and every new token."""
    if layout.static_length is not None:
        if needed > layout.static_length:
            raise InvalidInputError(f"the graph's cache holds {layout.static_length} positions;"
                                    f" prompt plus new tokens need {needed}")
        return layout.static_length
    if layout.context_length is not None and needed > layout.context_length:
        raise InvalidInputError(f"prompt plus new tokens ({needed}) exceed the model's "
                                f"context length {layout.context_length}")
    capacity = capacity or needed
    if capacity < needed:
        raise InvalidInputError(f"capacity {capacity} is below prompt plus new tokens {needed}")
    return capacity
