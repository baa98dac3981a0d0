"""What a decoder graph looks like to a generation loop: its input names and KV-cache layout.

`DecoderLayout.from_genai_config(folder)` reads onnxruntime-genai's `genai_config.json` (the
model builder writes one beside every model); `DecoderLayout.infer(session)` reads the same
facts from the graph alone, by the usual names:

- the token input `input_ids`, the output `logits` (else the first output that is not a
  present), optional `attention_mask` (0/1 integers, or an additive float mask), optional
  `position_ids` [batch, seq] and `cache_position` / `position` [seq] (a static cache's
  write position);
- KV pairs: an input whose name starts with `past` and an output named the same with
  `past_key_values` or `past` read as `present` (`past_key_values.0.key` -> `present.0.key`,
  `past_key_values.0` -> `present.0`, `past_key_0` -> `present_key_0`);
- KV dims from the declared input types: the batch axis is the dim named like `input_ids`'
  batch dim, the sequence axis the dim whose name differs between past and present (or names
  a past / sequence length); other symbolic dims come from the attention node's attributes.

Three cache forms follow from the types: *growing* (present = past + new, the sequence dim
symbolic), *shared buffer* (every past feeds GroupQueryAttention, which takes the lengths
from `attention_mask`'s row sums: the past may be a fixed-capacity buffer), and *static*
(past and present of one fixed length, new entries scattered in at `cache_position`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxkiln.errors import SessionError

__all__ = ["GENAI_CONFIG", "DecoderLayout", "DecoderLayoutError"]

GENAI_CONFIG = "genai_config.json"
_POSITION_NAMES = ("cache_position", "position")


class DecoderLayoutError(SessionError, ValueError):
    """The graph is not a decoder a generation loop can drive (names what is missing)."""


@dataclass(frozen=True)
class DecoderLayout:
    """Input/output names and KV layout of a decoder graph.

    `kv_dims` is one KV entry's shape with the batch dim at `batch_axis` and the sequence
    dim at `seq_axis` given as 0 (fill them with `kv_shape`). `static_length` is the fixed
    KV length of a static cache (None when the cache grows). `shared_buffer`: the attention
    reads the lengths from the mask, so a fixed-capacity past is valid too. `input_length`:
    input_ids' static sequence length (1: one token per run, the prompt fed token by token).
    """

    input_ids: str
    logits: str
    past: tuple[str, ...]
    present: tuple[str, ...]
    kv_dims: tuple[int, ...]
    batch_axis: int
    seq_axis: int
    kv_dtype: Any = np.float32
    attention_mask: str | None = None
    mask_dtype: Any = np.int64
    position_ids: str | None = None
    cache_position: str | None = None
    static_length: int | None = None
    shared_buffer: bool = False
    input_length: int | None = None
    batch: int | None = None
    eos: tuple[int, ...] = ()
    pad: int | None = None
    context_length: int | None = None
    source: str = "graph"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def layers(self) -> int:
        """Number of KV entries (a key and a value per layer count as two)."""
        return len(self.past)

    @property
    def mask_additive(self) -> bool:
        """A float mask is added to the scores (0 keeps, a large negative drops)."""
        return np.dtype(self.mask_dtype).kind == "f"

    def kv_shape(self, batch: int, length: int) -> tuple[int, ...]:
        """One KV entry's shape for `batch` rows and `length` positions."""
        dims = list(self.kv_dims)
        dims[self.batch_axis], dims[self.seq_axis] = batch, length
        return tuple(dims)

    def empty_past(self, batch: int = 1) -> dict[str, np.ndarray]:
        """The past of a first step: every KV input with length 0 (static: zeroed buffers)."""
        length = self.static_length or 0
        return {n: np.zeros(self.kv_shape(batch, length), self.kv_dtype) for n in self.past}

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def from_genai_config(cls, folder: str | Path, session: Any = None) -> DecoderLayout:
        """The layout described by `folder/genai_config.json`; `session` (optional) adds what
        the config does not say (dtypes, static dims, the cache form) from the graph."""
        path = Path(folder)
        path = path if path.suffix == ".json" else path / GENAI_CONFIG
        try:
            config = json.loads(path.read_text())
            model = config["model"]
            decoder = model["decoder"]
            ins, outs = decoder["inputs"], decoder["outputs"]
            layers = int(decoder["num_hidden_layers"])
            kv_dims = (0, int(decoder["num_key_value_heads"]), 0, int(decoder["head_size"]))
            past = tuple(name % i for i in range(layers)
                         for name in (ins["past_key_names"], ins["past_value_names"]))
            present = tuple(name % i for i in range(layers)
                            for name in (outs["present_key_names"], outs["present_value_names"]))
            names = {"input_ids": ins["input_ids"], "logits": outs["logits"],
                     "attention_mask": ins.get("attention_mask"),
                     "position_ids": ins.get("position_ids")}
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise DecoderLayoutError(f"{path}: not a usable onnxruntime-genai config "
                                     f"({type(exc).__name__}: {exc})") from exc
        eos = model.get("eos_token_id", ())
        layout = cls(**names, past=past, present=present, kv_dims=kv_dims, batch_axis=0,
                     seq_axis=2, eos=tuple(eos) if isinstance(eos, list) else (int(eos),),
                     pad=model.get("pad_token_id"), context_length=model.get("context_length"),
                     source=str(path), extra={"filename": decoder.get("filename", "model.onnx"),
                                              "search": config.get("search", {})})
        return layout if session is None else layout._refined(session)

    @classmethod
    def infer(cls, session: Any) -> DecoderLayout:
        """The layout read from `session`'s graph by name conventions (see the module doc)."""
        inputs = {m.name: m for m in session.inputs()}
        outputs = {m.name: m for m in session.outputs()}
        pairs = _kv_pairs(inputs, outputs)
        missing = [what for what, ok in (("an 'input_ids' input", "input_ids" in inputs),
                                          ("past/present KV pairs", bool(pairs))) if not ok]
        logits = "logits" if "logits" in outputs else next(
            (n for n in outputs if n not in {p for _, p in pairs}), None)
        if logits is None:
            missing.append("a 'logits' output")
        if missing:
            raise DecoderLayoutError(
                f"not a decoder graph: it lacks {' and '.join(missing)} (inputs "
                f"{sorted(inputs)}, outputs {sorted(outputs)}); generate needs input_ids, "
                "logits and past_* inputs paired with present_* outputs, or a genai_config.json")
        position = next((n for n in _POSITION_NAMES if n in inputs
                         and len(inputs[n].shape or ()) == 1), None)
        layout = cls(input_ids="input_ids", logits=logits, past=tuple(p for p, _ in pairs),
                     present=tuple(q for _, q in pairs), kv_dims=(), batch_axis=0, seq_axis=0,
                     attention_mask="attention_mask" if "attention_mask" in inputs else None,
                     position_ids="position_ids" if "position_ids" in inputs else None,
                     cache_position=position)
        return layout._refined(session)

    def _refined(self, session: Any) -> DecoderLayout:
        """This layout with dtypes, axes, static dims and the cache form read from the graph."""
        inputs = {m.name: m for m in session.inputs()}
        outputs = {m.name: m for m in session.outputs()}
        for name in (self.input_ids, *self.past, self.attention_mask, self.position_ids):
            if name is not None and name not in inputs:
                raise DecoderLayoutError(f"{self.source}: names input '{name}', which the "
                                         f"graph does not have (inputs: {sorted(inputs)})")
        for name in (self.logits, *self.present):
            if name not in outputs:
                raise DecoderLayoutError(f"{self.source}: names output '{name}', which the "
                                         f"graph does not have (outputs: {sorted(outputs)})")
        ids = inputs[self.input_ids].shape or (None, None)
        past, present = inputs[self.past[0]], outputs[self.present[0]]
        batch_axis, seq_axis = _kv_axes(past.shape, present.shape, ids)
        dims = _kv_dims(self, session, past.shape, batch_axis, seq_axis)
        static = past.shape[seq_axis] if past.shape and isinstance(past.shape[seq_axis], int) \
            else None
        mask = inputs.get(self.attention_mask) if self.attention_mask else None
        consumers = _consumers(session.graph(), set(self.past))
        cache_position = self.cache_position or next(
            (n for n in _POSITION_NAMES if n in inputs and len(inputs[n].shape or ()) == 1), None)
        return dataclasses.replace(
            self, kv_dims=dims, batch_axis=batch_axis, seq_axis=seq_axis,
            kv_dtype=past.dtype.numpy, static_length=static,
            mask_dtype=mask.dtype.numpy if mask is not None else np.int64,
            shared_buffer=bool(consumers) and consumers <= {"GroupQueryAttention"}
            and mask is not None,
            input_length=ids[1] if len(ids) > 1 and isinstance(ids[1], int) else None,
            batch=ids[0] if ids and isinstance(ids[0], int) else None,
            cache_position=cache_position if static else None)


def _natural(name: str) -> list[Any]:
    """Sort key putting layer 10 after layer 9 and `key` before `value`."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _kv_pairs(inputs: dict, outputs: dict) -> list[tuple[str, str]]:
    pairs = []
    for name in sorted(inputs, key=_natural):
        if not name.startswith("past"):
            continue
        for guess in (name.replace("past_key_values", "present", 1),
                      name.replace("past", "present", 1)):
            if guess in outputs:
                pairs.append((name, guess))
                break
    return pairs


def _kv_axes(past: Sequence | None, present: Sequence | None, ids: Sequence) -> tuple[int, int]:
    """(batch axis, sequence axis) of a KV entry from the declared past/present shapes."""
    if not past:
        return 0, 2
    rank = len(past)
    batch_name = ids[0] if ids and isinstance(ids[0], str) else None
    batch = next((i for i, d in enumerate(past) if isinstance(d, str)
                  and (d == batch_name or "batch" in d.lower())), 1 if rank == 5 else 0)
    seq = None
    if present and len(present) == rank:
        seq = next((i for i, (a, b) in enumerate(zip(past, present))
                    if i != batch and a != b and isinstance(a, str)), None)
    if seq is None:
        seq = next((i for i, d in enumerate(past) if i != batch and isinstance(d, str)
                    and ("past" in d.lower() or "seq" in d.lower())), None)
    return batch, seq if seq is not None else rank - 2


def _kv_dims(layout: DecoderLayout, session: Any, shape: Sequence | None, batch: int,
             seq: int) -> tuple[int, ...]:
    """One KV entry's dims (batch and sequence as 0): declared sizes, else the layout's
    (a genai config), else the attention node's head counts."""
    if not shape:
        if layout.kv_dims:
            return layout.kv_dims
        raise DecoderLayoutError(f"input '{layout.past[0]}' declares no shape; pass a "
                                 "genai_config.json or a DecoderLayout")
    dims = []
    for axis, d in enumerate(shape):
        if axis in (batch, seq):
            dims.append(0)
        elif isinstance(d, int):
            dims.append(d)
        elif layout.kv_dims and len(layout.kv_dims) == len(shape):
            dims.append(layout.kv_dims[axis])
        else:
            dims.append(_attention_dim(session, layout.past[0], axis, len(shape), d))
    return tuple(dims)


def _attention_dim(session: Any, past: str, axis: int, rank: int, name: Any) -> int:
    """A symbolic head-count / head-size dim of `past`, from the GroupQueryAttention node it
    feeds (kv_num_heads; head size = packed QKV width / (num_heads + 2 kv_num_heads))."""
    for node in session.graph():
        if node.op_type != "GroupQueryAttention" or past not in [
                v.name for v in node.inputs if v is not None]:
            continue
        attrs = node.attributes
        heads, kv_heads = attrs["num_heads"].as_int(), attrs["kv_num_heads"].as_int()
        if rank == 4 and axis == 1:
            return kv_heads
        width = _width(node.inputs[0])
        if rank == 4 and axis == 3 and width:
            packed = len(node.inputs) < 2 or node.inputs[1] is None
            return width // (heads + 2 * kv_heads) if packed else width // heads
    raise DecoderLayoutError(f"cannot tell the size of dim {axis} ('{name}') of '{past}' from "
                             "the graph; pass a genai_config.json or a DecoderLayout")


def _width(value: Any) -> int | None:
    """The last dim of a value: declared, or the output width of the MatMul(NBits) making it."""
    if value.shape is not None and isinstance(value.shape[-1], int):
        return value.shape[-1]
    node = value.producer()
    while node is not None and node.op_type == "Add":  # a bias after the projection
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    if node is None:
        return None
    if node.op_type == "MatMulNBits":
        return node.attributes["N"].as_int()
    if node.op_type == "MatMul":
        weight = node.inputs[1]
        if weight is not None and weight.shape is not None and isinstance(weight.shape[-1], int):
            return weight.shape[-1]
    return None


def _consumers(graph: Any, names: set[str]) -> set[str]:
    """Op types of the nodes reading any of `names`."""
    return {node.op_type for node in graph
            if any(v is not None and v.name in names for v in node.inputs)}
