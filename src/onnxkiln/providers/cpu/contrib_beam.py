"""CPU kernel: com.microsoft BeamSearch over a GPT-2 style decoder subgraph (model_type 0), a
T5/BART style encoder-decoder pair (model_type 1, driven by `contrib_encdec.py`) or a Whisper
encoder-decoder pair (model_type 2, run as WhisperBeamSearch runs it, `contrib_whisper.py`),
what onnxruntime.transformers' convert_generation emits for beam decoding. The beam loop
all of them share is `_beam_search.py`.

What onnxruntime's schema check refuses when it loads the model is refused when the session
is built: an attribute BeamSearch does not declare (WhisperBeamSearch's timestamp token ids,
decoder_output_cross_qk), a missing eos_token_id or pad_token_id, more than 12 inputs or 3
outputs.
"""

from __future__ import annotations

from collections.abc import Callable

from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu import _generation as gen
from onnxkiln.providers.cpu._beam_search import BeamRun, counts, decode, logits_processor
from onnxkiln.providers.cpu.contrib_encdec import EncoderDecoder, model_type
from onnxkiln.providers.cpu.contrib_generation import begin, search_driver, search_subgraphs
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.contrib_whisper import WHISPER_ONLY, whisper_search
from onnxkiln.providers.cpu.control import unbuilt
from onnxkiln.providers.cpu.registry import kernel

__all__: list[str] = []

SCHEMA = gen.NodeSchema(
    frozenset({"decoder", "decoder_start_token_id", "early_stopping", "encoder", "eos_token_id",
               "init_decoder", "model_type", "no_repeat_ngram_size", "pad_token_id",
               "vocab_size"}),
    ("eos_token_id", "pad_token_id"), max_inputs=12, max_outputs=3)


def _check_schema(op: str, info: NodeInfo) -> None:
    names = set(info.node.attributes) if info.node is not None else set(info.attrs)
    whisper = sorted(names & WHISPER_ONLY)
    hint = (f"; {whisper[0]} is a WhisperBeamSearch attribute: run a Whisper pair with the "
            f"timestamp processor as WhisperBeamSearch" if whisper else "")
    SCHEMA.check(op, info, hint)


@kernel("BeamSearch", since=1, domain=MS, factory=True, multi_output=True,
        capture=CaptureSupport.HOST_SYNC, variant="beamsearch.gpt")
def beam_search(info: NodeInfo) -> Callable[..., tuple]:
    """Beam search: sequences, the optional sequences_scores and per-step scores.
    decoder_input_ids and logits_processor are read as onnxruntime's CPU kernel reads them:
    for model_types 0 and 1 the first not at all, the second only checked (>= 0); for
    model_type 2 the first is the prompt and logits_processor 1 (timestamps) is refused, as
    BeamSearch has no beginning_timestamp_token_id."""
    op = "BeamSearch"
    placeholder = unbuilt(info, search_subgraphs(info))
    if placeholder is not None:
        return placeholder
    _check_schema(op, info)
    if model_type(op, info, served=(0, 1, 2)) == 2:
        return whisper_search(op, info)
    dec = search_driver(op, info)
    early = bool(gen.int_attr(info, "early_stopping", 0))
    want_scores = len(info.output_present) > 2 and info.output_present[2]

    def run(*args) -> tuple:
        ins = list(args[:info.n_inputs]) + [None] * max(0, 12 - info.n_inputs)
        captured = args[info.n_inputs:]
        logits_processor(op, ins[11])
        pad, eos = gen.int_attr(info, "pad_token_id", 0), gen.int_attr(info, "eos_token_id", -1)
        ids, mask, max_len = gen.prompt(op, ins[0], ins[1], ins[9], pad,
                                        isinstance(dec, EncoderDecoder))
        beams, returns, penalty = counts(op, ins)
        first, logits, dstate = begin(dec, ids, mask, pad, beams, captured)
        vocab = gen.vocab_size(op, info, logits)
        proc = gen.processors(op, info, vocab, first.shape[0], ins[2], ins[6], ins[7], ins[8])
        settings = BeamRun(beams, returns, max_len, penalty, early, eos, pad, vocab, want_scores)
        return tuple(decode(settings, first, logits, proc,
                            lambda tok, order, _: dec.step(tok, dstate, captured, order)))

    return run
