"""The Whisper encoder-decoder subgraph driver of com.microsoft WhisperBeamSearch (model_type 2),
as onnxruntime.transformers' Whisper export writes the pair for the beam search op.

The `encoder` subgraph runs once on the batch: encoder_input_ids (the float audio features,
(B, feature_size, frames)) and decoder_input_ids (B, L) give logits (B, L, V), the encoder
hidden states, one self key and value per layer and then one cross key and value per layer.
Its outputs are repeated num_beams times per batch item and the last position's logits start
the search. Each later step runs the `decoder` subgraph on input_ids, the hidden states (when
it declares them), the self pasts (following the beams) and the cross keys/values (staying
with their batch item); it returns logits and the new self presents. input_ids is the last
token of every row when the decoder declares it (B, 1), else the whole sequence so far, as
onnxruntime feeds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu import _generation as gen

__all__ = ["WhisperPair"]

_I32 = np.dtype(np.int32)
_F32 = np.dtype(np.float32)


def _names(values) -> list[str]:
    return [v.name for v in values]


class WhisperPair:
    """Runs the encoder subgraph once, then the decoder subgraph per step."""

    def __init__(self, op: str, info: NodeInfo) -> None:
        self.op = op
        attrs = info.node.attributes
        if "encoder" not in info.subgraphs:
            raise ValueError(f"{op}: model_type 2 needs an `encoder` graph attribute")
        self.encoder, self.decoder = info.subgraphs["encoder"], info.subgraphs["decoder"]
        self.layers = self._check_encoder(_names(attrs["encoder"].value.inputs),
                                          _names(attrs["encoder"].value.outputs))
        dec = attrs["decoder"].value
        self.hidden = self._check_decoder(_names(dec.inputs), _names(dec.outputs))
        dims = None if dec.inputs[0].shape is None else list(dec.inputs[0].shape)
        self.whole_sequence = not (dims is not None and len(dims) == 2 and dims[1] == 1)

    def _check_encoder(self, ins: list[str], outs: list[str]) -> int:
        want = ["logits", "encoder_hidden_states", "present_key_self_0", "present_value_self_0"]
        if ins != ["encoder_input_ids", "decoder_input_ids"] or len(outs) < 6 \
                or (len(outs) - 2) % 4 or outs[:4] != want:
            raise ValueError(f"{self.op}: the encoder subgraph must take encoder_input_ids and "
                             f"decoder_input_ids and return {', '.join(want)}, ..., then a cross "
                             f"key and value per layer (2 + 4 * layers outputs); it takes {ins} "
                             f"and returns {outs}")
        return (len(outs) - 2) // 4

    def _check_decoder(self, ins: list[str], outs: list[str]) -> bool:
        if "past_sequence_length" in ins:
            raise ValueError(f"{self.op}: decoders sharing a past/present buffer "
                             f"(past_sequence_length, beam_width, cache_indirection inputs, the "
                             f"DecoderMaskedMultiHeadAttention form) are not supported (on the "
                             f"CPU onnxruntime leaves their cache_indirection uninitialized); "
                             f"export the decoder with concatenated pasts")
        hidden = len(ins) > 1 and ins[1] == "encoder_hidden_states"
        want_in = 1 + hidden + 4 * self.layers
        if not ins or ins[0] != "input_ids" or len(ins) != want_in or not outs \
                or outs[0] != "logits" or len(outs) != 1 + 2 * self.layers:
            raise ValueError(f"{self.op}: for {self.layers} layers the decoder subgraph must take "
                             f"{want_in} inputs (input_ids"
                             f"{', encoder_hidden_states' if hidden else ''}, the self and cross "
                             f"pasts) and return {1 + 2 * self.layers} (logits, the self "
                             f"presents); it takes {ins} and returns {outs}")
        return hidden

    def start(self, features: np.ndarray, ids: np.ndarray, beams: int,
              captured: Sequence[Any]) -> tuple[np.ndarray, list]:
        """Run the encoder: (first logits (batch * beams, V), state)."""
        outs = self.encoder((features, ids), captured)
        logits = gen.last_logits(self.op, outs[0], ids.shape[0])
        rep = [np.repeat(np.asarray(o), beams, axis=0) for o in outs[1:]]
        n = 2 * self.layers
        fixed = [rep[0]] if self.hidden else []
        return np.repeat(logits, beams, axis=0), [fixed, rep[1:1 + n], rep[1 + n:]]

    def step(self, tokens: np.ndarray, order: np.ndarray, seqs: np.ndarray, state: list,
             captured: Sequence[Any]) -> np.ndarray:
        """One decoder run for the rows' new tokens (rows,); `order` picks each row's parent
        row for the self pasts; `seqs` (rows, length) are the sequences so far."""
        fixed, pasts, cross = state
        pasts = [p[order] for p in pasts]
        ids = seqs if self.whole_sequence else tokens.reshape(-1, 1)
        outs = self.decoder((ids.astype(_I32), *fixed, *pasts, *cross), captured)
        state[1] = list(outs[1:])
        return gen.last_logits(self.op, outs[0], tokens.shape[0])
