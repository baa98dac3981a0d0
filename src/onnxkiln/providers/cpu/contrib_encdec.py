"""The encoder-decoder (T5/BART, model_type 1) subgraph driver of com.microsoft BeamSearch and
GreedySearch, as onnxruntime.transformers' convert_generation writes it.

The `encoder` subgraph runs once on the batch: encoder_input_ids, encoder_attention_mask and
decoder_input_ids (every row decoder_start_token_id) give the first step's logits, the
encoder hidden states, one self key and value per layer and then one cross key and value per
layer. Its outputs are repeated num_beams times per batch item. Each later step runs the
`decoder` subgraph on the last token of every row with the encoder mask, the hidden states
(when it declares them), the self pasts and the cross keys/values; it returns logits and the
new self presents. Sequences start with decoder_start_token_id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu import _generation as gen

__all__ = ["EncoderDecoder", "model_type"]

_I32 = np.dtype(np.int32)
_F32 = np.dtype(np.float32)


def model_type(op: str, info: NodeInfo, served: tuple[int, ...] = (0, 1)) -> int:
    """The model_type attribute, refused unless one of `served`: 0 (GPT-2 style) and 1
    (encoder-decoder) for every search op, 2 (Whisper) for BeamSearch."""
    kind = gen.int_attr(info, "model_type", 0)
    if kind not in served:
        whisper = (", 2: Whisper encoder-decoder" if 2 in served else
                   "; Whisper, model_type 2, runs as BeamSearch or WhisperBeamSearch")
        raise ValueError(f"{op}: model_type {kind} is not supported (0: GPT-2 style decoder, "
                         f"1: T5/BART encoder-decoder{whisper})")
    return kind


class EncoderDecoder:
    """Runs the encoder subgraph once, then the decoder subgraph per step, for a search op."""

    def __init__(self, op: str, info: NodeInfo) -> None:
        self.op = op
        if "encoder" not in info.subgraphs:
            raise ValueError(f"{op}: model_type 1 needs an `encoder` graph attribute")
        if "init_decoder" in info.node.attributes:
            raise ValueError(f"{op}: init_decoder belongs to model_type 0, not model_type 1")
        self.encoder, self.decoder = info.subgraphs["encoder"], info.subgraphs["decoder"]
        self.start_token = gen.int_attr(info, "decoder_start_token_id", -1)
        if self.start_token < 0:
            raise ValueError(f"{op}: model_type 1 needs decoder_start_token_id >= 0, got "
                             f"{self.start_token}")
        enc = info.node.attributes["encoder"].value
        dec = info.node.attributes["decoder"].value
        if len(enc.inputs) != 3 or (len(enc.outputs) - 2) % 4 or len(enc.outputs) < 6:
            raise ValueError(f"{op}: the encoder subgraph must take encoder_input_ids, "
                             f"encoder_attention_mask and decoder_input_ids and return logits, "
                             f"encoder_hidden_states, then a self and a cross key and value per "
                             f"layer; it has {len(enc.inputs)} inputs and {len(enc.outputs)} "
                             f"outputs")
        self.layers = (len(enc.outputs) - 2) // 4
        self.hidden = len(dec.inputs) > 2 and dec.inputs[2].name == "encoder_hidden_states"
        want_in = 2 + self.hidden + 4 * self.layers
        if len(dec.inputs) != want_in or len(dec.outputs) != 1 + 2 * self.layers:
            raise ValueError(f"{op}: for {self.layers} layers the decoder subgraph must take "
                             f"{want_in} inputs (input_ids, encoder_attention_mask"
                             f"{', encoder_hidden_states' if self.hidden else ''}, self and "
                             f"cross pasts) and return {1 + 2 * self.layers} (logits, self "
                             f"presents); it has {len(dec.inputs)} and {len(dec.outputs)}")

    def first_tokens(self, batch: int) -> np.ndarray:
        """The sequences' first column: decoder_start_token_id on every row, (batch, 1)."""
        return np.full((batch, 1), self.start_token, _I32)

    def start(self, ids: np.ndarray, mask: np.ndarray, beams: int, captured: Sequence[Any]):
        """Run the encoder on (batch, S) ids and mask; (first logits (batch * beams, V), state)
        with every output repeated `beams` times per batch item."""
        outs = self.encoder((ids, mask, self.first_tokens(ids.shape[0])), captured)
        rep = [np.repeat(np.asarray(o), beams, axis=0) for o in outs]
        n = 2 * self.layers
        logits = gen.last_logits(self.op, rep[0], ids.shape[0] * beams)
        fixed = [np.repeat(mask, beams, axis=0)] + ([rep[1]] if self.hidden else [])
        return logits, [fixed, rep[2:2 + n], rep[2 + n:]]

    def step(self, tokens: np.ndarray, state: list, captured: Sequence[Any],
             order: np.ndarray | None = None) -> np.ndarray:
        """One decoder run on tokens (rows,); `order` picks each new row's parent row for the
        self pasts (cross keys/values and the mask stay with their batch item)."""
        fixed, pasts, cross = state
        if order is not None:
            pasts = [p[order] for p in pasts]
        feeds = (tokens.reshape(-1, 1).astype(_I32), *fixed, *pasts, *cross)
        outs = self.decoder(feeds, captured)
        state[1] = list(outs[1:])
        return gen.last_logits(self.op, outs[0], tokens.shape[0])
