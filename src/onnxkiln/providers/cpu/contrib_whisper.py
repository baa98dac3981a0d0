"""CPU kernel: com.microsoft WhisperBeamSearch, and the model_type 2 run that BeamSearch
(`contrib_beam.py`) shares with it: beam search over the Whisper encoder-decoder pair that
onnxruntime.transformers' Whisper export writes (`_whisper_pair.py`), as onnxruntime's CPU
kernel runs it.

The sequences start with decoder_input_ids (or decoder_start_token_id alone) and the beams
follow the shared loop (`_beam_search.decode`), except that the first check for every batch
item being done comes after the first decoder run. After the common logits processors come
temperature and, with logits_processor 1, the timestamp rules (`_whisper_timestamps.py`).
BeamSearch with model_type 2 runs the same way without what its schema lacks, as onnxruntime
runs it: no temperature, extra_decoding_ids or cross_qk_layer_head input (temperature 1), no
cross_qk or no_speech_probs output, and no timestamp token attributes, so its logits_processor
1 is refused (beginning_timestamp_token_id is unset).

Where onnxruntime's CPU kernel differs from the op's description, onnxkiln follows the
kernel: attention_mask (3-D) and extra_decoding_ids are checked and then unused, init_decoder
is not run, cross_qk holds no value unless decoder_output_cross_qk, which is refused as that
kernel refuses it. Where the kernel leaves memory unwritten, onnxkiln writes defined values:
no_speech_probs reads 0 (only the CUDA kernel computes it) and a decoder that reads
encoder_hidden_states gets the encoder's (onnxruntime passes an uninitialized buffer; the
export's decoders do not read it). A vocab_size below the logits' width keeps each row's
first vocab_size logits (onnxruntime reads the rows with a vocab_size stride). Decoders that
share a past/present buffer (DecoderMaskedMultiHeadAttention) are refused: onnxruntime's CPU
kernel leaves their cache_indirection uninitialized.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu import _generation as gen
from onnxkiln.providers.cpu._beam_search import BeamRun, counts, decode, logits_processor
from onnxkiln.providers.cpu._whisper_pair import WhisperPair
from onnxkiln.providers.cpu._whisper_timestamps import WhisperProcessors
from onnxkiln.providers.cpu.contrib_generation import search_subgraphs
from onnxkiln.providers.cpu.contrib_transformer import MS
from onnxkiln.providers.cpu.control import unbuilt
from onnxkiln.providers.cpu.registry import kernel

__all__ = ["WHISPER_ONLY", "whisper_search"]

_I32 = np.dtype(np.int32)
_F32 = np.dtype(np.float32)
_N_INPUTS = 15
WHISPER_ONLY = frozenset({
    "beginning_timestamp_token_id", "decoder_output_cross_qk", "no_speech_token_id",
    "no_timestamps_token_id", "start_of_lm_token_id", "transcribe_token_id",
    "translate_token_id"})
"""WhisperBeamSearch's attributes that BeamSearch's schema lacks."""
SCHEMA = gen.NodeSchema(
    WHISPER_ONLY | {"decoder", "decoder_start_token_id", "early_stopping", "encoder",
                    "eos_token_id", "init_decoder", "model_type", "no_repeat_ngram_size",
                    "pad_token_id", "vocab_size"},
    ("eos_token_id", "pad_token_id"), max_inputs=_N_INPUTS, max_outputs=5)


def _check_node(op: str, info: NodeInfo) -> None:
    kind = gen.int_attr(info, "model_type", 2)
    if kind != 2:
        raise ValueError(f"{op}: model_type must be 2 (Whisper), got {kind}; BeamSearch serves "
                         f"model_types 0, 1 and 2")
    if gen.int_attr(info, "decoder_output_cross_qk", 0):
        raise ValueError(f"{op}: decoder_output_cross_qk (the cross_qk output) is not "
                         f"supported, as onnxruntime's CPU kernel does not support it")


def _decoder_ids(op: str, info: NodeInfo, value, batch: int) -> np.ndarray:
    """decoder_input_ids (batch, L) int32, or decoder_start_token_id for every row."""
    if value is None:
        start = gen.int_attr(info, "decoder_start_token_id", -1)
        if start < 0:
            raise ValueError(f"{op}: without decoder_input_ids the sequences start with "
                             f"decoder_start_token_id, which must be >= 0, got {start}")
        return np.full((batch, 1), start, _I32)
    ids = np.asarray(value)
    if ids.ndim != 2 or ids.shape[0] != batch or ids.shape[1] == 0 or ids.dtype.kind not in "iu":
        raise ValueError(f"{op}: decoder_input_ids must be a non-empty int32 (batch {batch}, "
                         f"length) tensor, got {ids.dtype} {ids.shape}")
    return ids.astype(_I32)


def _check_unused(op: str, ins: list, batch: int) -> None:
    """The inputs onnxruntime's CPU kernel checks but does not use."""
    mask, extra = ins[9], ins[13]
    if mask is not None and np.ndim(mask) != 3:
        raise ValueError(f"{op}: attention_mask must be 3-D, got shape {np.shape(mask)}")
    if extra is not None and (np.ndim(extra) != 2 or np.shape(extra)[0] != batch):
        raise ValueError(f"{op}: extra_decoding_ids must be (batch {batch}, length), got shape "
                         f"{np.shape(extra)}")


def _processors(op: str, info: NodeInfo, ins: list, vocab: int, batch: int) -> WhisperProcessors:
    common = gen.processors(op, info, vocab, batch, ins[2], ins[6], ins[7], ins[8])
    temperature = gen.scalar(ins[14], f"{op} temperature", 1.0, float)
    if logits_processor(op, ins[11]) != 1:
        return WhisperProcessors(common, temperature)
    begin = gen.int_attr(info, "beginning_timestamp_token_id", -1)
    if not 0 < begin < vocab:
        unset = "" if op == "WhisperBeamSearch" else (
            f" ({op} has no such attribute: the timestamp processor runs as WhisperBeamSearch)")
        raise ValueError(f"{op}: logits_processor 1 (timestamps) needs 0 < "
                         f"beginning_timestamp_token_id < vocab_size {vocab}, got {begin}{unset}")
    ids = [gen.int_attr(info, name, -1) for name in (
        "no_timestamps_token_id", "start_of_lm_token_id", "decoder_start_token_id",
        "translate_token_id", "transcribe_token_id")]
    return WhisperProcessors(common, temperature, True, gen.int_attr(info, "eos_token_id", -1),
                             begin, tuple(ids[:2]), tuple(ids[2:]))


def whisper_search(op: str, info: NodeInfo) -> Callable[..., tuple]:
    """The run of a model_type 2 beam search node (WhisperBeamSearch, or BeamSearch with
    model_type 2), its subgraphs built: the outputs the node asks for."""
    pair = WhisperPair(op, info)
    early = bool(gen.int_attr(info, "early_stopping", 0))
    present = list(info.output_present) + [False] * (5 - len(info.output_present))

    def run(*args) -> tuple:
        # inputs past the node's schema (BeamSearch's 12) read as absent
        ins = list(args[:info.n_inputs]) + [None] * max(0, _N_INPUTS - info.n_inputs)
        captured = args[info.n_inputs:]
        features = np.asarray(ins[0])
        if features.ndim != 3 or features.dtype != _F32:
            raise ValueError(f"{op}: input_features must be float32 (batch, feature_size, "
                             f"frames), got {features.dtype} {features.shape}")
        batch = features.shape[0]
        _check_unused(op, ins, batch)
        ids = _decoder_ids(op, info, ins[10], batch)
        max_len = gen.scalar(ins[1], f"{op} max_length", None)
        if max_len is None or max_len <= ids.shape[1] + 1:
            raise ValueError(f"{op}: max_length ({max_len}) must exceed the decoder_input_ids "
                             f"length ({ids.shape[1]}) by at least 2 (onnxruntime's kernel runs "
                             f"no decoder step otherwise)")
        beams, returns, penalty = counts(op, ins)
        logits, state = pair.start(features, ids, beams, captured)
        vocab = gen.vocab_size(op, info, logits)
        proc = _processors(op, info, ins, vocab, batch)
        pad, eos = gen.int_attr(info, "pad_token_id", 0), gen.int_attr(info, "eos_token_id", -1)
        settings = BeamRun(beams, returns, max_len, penalty, early, eos, pad, vocab, present[2],
                           stop_after_first=False)
        out = decode(settings, ids, logits, proc,
                     lambda tok, order, seqs: pair.step(tok, order, seqs, state, captured))
        if not present[2]:
            out.append(None)
        out.append(None)  # cross_qk: without decoder_output_cross_qk no value, as onnxruntime
        if present[4]:
            no_speech = gen.int_attr(info, "no_speech_token_id", -1)
            if not 0 <= no_speech < vocab:
                raise ValueError(f"{op}: no_speech_probs needs 0 <= no_speech_token_id < "
                                 f"vocab_size {vocab}, got {no_speech}")
            out.append(np.zeros(batch, _F32))
        return tuple(out[:len(info.output_present)])

    return run


@kernel("WhisperBeamSearch", since=1, domain=MS, factory=True, multi_output=True,
        capture=CaptureSupport.HOST_SYNC)
def whisper_beam_search(info: NodeInfo) -> Callable[..., tuple]:
    """Whisper beam search: sequences, the optional sequences_scores, per-step scores and
    no_speech_probs (zeros)."""
    op = "WhisperBeamSearch"
    placeholder = unbuilt(info, search_subgraphs(info))
    if placeholder is not None:
        return placeholder
    SCHEMA.check(op, info)
    _check_node(op, info)
    return whisper_search(op, info)
