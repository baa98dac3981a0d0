"""Transformer zoo models: a BERT encoder and GPT-2 decoder steps with a KV cache (growing,
and fixed-capacity for device-graph capture)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnxkiln.zoo._builder import _F32_MIN, _I64, _Builder, _config, _f32, _i64

__all__ = ["BertConfig", "GptConfig", "bert_encoder", "gpt_decoder_step",
           "gpt_static_decoder_step", "static_decode_feeds"]


# --- BERT -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BertConfig:
    layers: int = 2
    hidden: int = 32
    heads: int = 4
    ffn: int = 64
    vocab: int = 100
    max_positions: int = 64
    type_vocab: int = 2
    eps: float = 1e-12

    @classmethod
    def base(cls) -> BertConfig:
        return cls(12, 768, 12, 3072, 30522, 512, 2)


def _gelu_erf(b: _Builder, x: str) -> str:
    """Exact GELU as torch exports it: x * (erf(x / sqrt 2) + 1) * 0.5."""
    e = b.op("Add", b.op("Erf", b.op("Div", x, b.const(math.sqrt(2.0)))), b.const(1.0))
    return b.op("Mul", b.op("Mul", x, e), b.const(0.5))


def _gelu_tanh(b: _Builder, x: str) -> str:
    """GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    cube = b.op("Mul", b.const(0.044715), b.op("Pow", x, b.const(3.0)))
    t = b.op("Tanh", b.op("Mul", b.const(math.sqrt(2.0 / math.pi)), b.op("Add", x, cube)))
    return b.op("Mul", b.op("Mul", b.const(0.5), x), b.op("Add", b.const(1.0), t))


def _heads(b: _Builder, x: str, split: str, perm: list[int]) -> str:
    return b.op("Transpose", b.op("Reshape", x, split), perm=perm)


def _shape_prefix(b: _Builder, x: str, tail: Sequence[int]) -> str:
    """Shape(x)[:2] ++ tail, the dynamic reshape target torch emits for x.view(b, s, ...)."""
    prefix = b.op("Slice", b.op("Shape", x), b.const([0], _I64), b.const([2], _I64))
    return b.op("Concat", prefix, b.const(list(tail), _I64), axis=0)


def _bert_embeddings(b: _Builder, cfg: BertConfig) -> str:
    h, p = cfg.hidden, "embeddings"
    shape = b.op("Shape", "input_ids")
    seq = b.op("Unsqueeze", b.op("Gather", shape, b.const(1, _I64)), b.const([0], _I64))
    start, axis = b.const([0], _I64), b.const([1], _I64)
    positions = np.arange(cfg.max_positions, dtype=_I64)[None]
    pos_ids = b.op("Slice", b.param(f"{p}.position_ids", positions), start, seq, axis)
    types = b.param(f"{p}.token_type_ids", np.zeros((1, cfg.max_positions), _I64))
    type_ids = b.op("Expand", b.op("Slice", types, start, seq, axis), shape)
    word = b.op("Gather", b.normal(f"{p}.word_embeddings.weight", (cfg.vocab, h), 0.02),
                "input_ids")
    kind = b.op("Gather", b.normal(f"{p}.token_type_embeddings.weight", (cfg.type_vocab, h), 0.02),
                type_ids)
    pos = b.op("Gather", b.normal(f"{p}.position_embeddings.weight", (cfg.max_positions, h), 0.02),
               pos_ids)
    return b.layer_norm(b.op("Add", b.op("Add", word, kind), pos), f"{p}.LayerNorm", h, cfg.eps)


def _bert_layer(b: _Builder, x: str, mask: str, p: str, cfg: BertConfig) -> str:
    h, nh = cfg.hidden, cfg.heads
    dh = h // nh
    with b.scope("attention/self"):
        split = _shape_prefix(b, x, [nh, dh])
        q = _heads(b, b.linear(x, f"{p}.attention.self.query", h, h), split, [0, 2, 1, 3])
        k = _heads(b, b.linear(x, f"{p}.attention.self.key", h, h), split, [0, 2, 3, 1])
        v = _heads(b, b.linear(x, f"{p}.attention.self.value", h, h), split, [0, 2, 1, 3])
        scores = b.op("Div", b.op("MatMul", q, k), b.const(math.sqrt(dh)))
        probs = b.op("Softmax", b.op("Add", scores, mask), axis=-1)
        ctx = b.op("Transpose", b.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", ctx, _shape_prefix(b, x, [h]))
    with b.scope("attention/output"):
        a = b.linear(ctx, f"{p}.attention.output.dense", h, h)
        x = b.layer_norm(b.op("Add", a, x), f"{p}.attention.output.LayerNorm", h, cfg.eps)
    with b.scope("intermediate"):
        f = _gelu_erf(b, b.linear(x, f"{p}.intermediate.dense", h, cfg.ffn))
    with b.scope("output"):
        f = b.linear(f, f"{p}.output.dense", cfg.ffn, h)
        return b.layer_norm(b.op("Add", f, x), f"{p}.output.LayerNorm", h, cfg.eps)


def bert_encoder(cfg: BertConfig | None = None, seed: int = 0, **overrides: Any
                 ) -> onnx.ModelProto:
    """A BERT encoder as torch exports it unfused, with the pooler.

    Inputs input_ids, attention_mask (int64 [batch, seq], mask 1 = token, 0 = padding);
    outputs last_hidden_state [batch, seq, hidden], pooler_output [batch, hidden].
    """
    cfg = _config(cfg, BertConfig, overrides)
    b = _Builder(seed)
    with b.scope("embeddings"):
        x = _bert_embeddings(b, cfg)
    with b.scope("extended_attention_mask"):
        m = b.op("Cast", b.op("Unsqueeze", "attention_mask", b.const([1, 2], _I64)),
                 to=TensorProto.FLOAT)
        mask = b.op("Mul", b.op("Sub", b.const(1.0), m), b.const(_F32_MIN))
    for i in range(cfg.layers):
        with b.scope(f"encoder/layer.{i}"):
            x = _bert_layer(b, x, mask, f"encoder.layer.{i}", cfg)
    x = b.rename(x, "last_hidden_state")
    with b.scope("pooler"):
        first = b.op("Gather", x, b.const(0, _I64), axis=1)
        w = b.normal("pooler.dense.weight", (cfg.hidden, cfg.hidden), cfg.hidden**-0.5)
        dense = b.op("Gemm", first, w, b.normal("pooler.dense.bias", (cfg.hidden,), 0.02),
                     transB=1)
        b.rename(b.op("Tanh", dense), "pooler_output")
    ids = ["batch", "seq"]
    return b.finish(
        "bert_encoder", [_i64("input_ids", ids), _i64("attention_mask", ids)],
        [_f32("last_hidden_state", [*ids, cfg.hidden]),
         _f32("pooler_output", ["batch", cfg.hidden])],
        {"dims": "batch=1,seq=8", "input.input_ids": f"int:0:{cfg.vocab}",
         "input.attention_mask": "mask"},
    )


# --- GPT-2 decoder step ---------------------------------------------------------------------


@dataclass(frozen=True)
class GptConfig:
    layers: int = 2
    hidden: int = 32
    heads: int = 4
    vocab: int = 100
    max_positions: int = 64
    eps: float = 1e-5
    causal_mask: str = "trilu"  # "trilu": Trilu over ones; "range": Range/Greater/Not

    @classmethod
    def gpt2_small(cls) -> GptConfig:
        return cls(12, 768, 12, 50257, 1024)


def _causal_mask(b: _Builder, cfg: GptConfig, past: str, seq: str, total: str,
                 positions: str) -> str:
    """Bool [seq, total], True where query i (at position past + i) may attend to key j."""
    if cfg.causal_mask == "trilu":
        shape = b.op("Concat", b.op("Unsqueeze", seq, b.const([0], _I64)),
                     b.op("Unsqueeze", total, b.const([0], _I64)), axis=0)
        ones = b.op("ConstantOfShape", shape,
                    value=numpy_helper.from_array(np.ones(1, np.float32)))
        return b.op("Cast", b.op("Trilu", ones, past, upper=0), to=TensorProto.BOOL)
    if cfg.causal_mask == "range":
        keys = b.op("Unsqueeze", b.op("Range", b.const(0, _I64), total, b.const(1, _I64)),
                    b.const([0], _I64))
        queries = b.op("Unsqueeze", positions, b.const([1], _I64))
        return b.op("Not", b.op("Greater", keys, queries))
    raise ValueError(f"causal_mask must be 'trilu' or 'range', got {cfg.causal_mask!r}")


def _gpt_block(b: _Builder, x: str, allowed: str, i: int, cfg: GptConfig) -> str:
    h, nh = cfg.hidden, cfg.heads
    dh, p = h // nh, f"transformer.h.{i}"
    with b.scope("attn"):
        a = b.layer_norm(x, f"{p}.ln_1", h, cfg.eps)
        qkv = b.linear(a, f"{p}.attn.c_attn", h, 3 * h)
        q, k, v = b.op("Split", qkv, b.const([h, h, h], _I64), n_out=3, axis=2)
        split = _shape_prefix(b, a, [nh, dh])
        q, k, v = (_heads(b, t, split, [0, 2, 1, 3]) for t in (q, k, v))
        k = b.rename(b.op("Concat", f"past_key_{i}", k, axis=2), f"present_key_{i}")
        v = b.rename(b.op("Concat", f"past_value_{i}", v, axis=2), f"present_value_{i}")
        kt = b.op("Transpose", k, perm=[0, 1, 3, 2])
        scores = b.op("Div", b.op("MatMul", q, kt), b.const(math.sqrt(dh)))
        scores = b.op("Where", allowed, scores, b.const(_F32_MIN))
        ctx = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)
        ctx = b.op("Reshape", b.op("Transpose", ctx, perm=[0, 2, 1, 3]), _shape_prefix(b, a, [h]))
        x = b.op("Add", x, b.linear(ctx, f"{p}.attn.c_proj", h, h))
    with b.scope("mlp"):
        m = b.layer_norm(x, f"{p}.ln_2", h, cfg.eps)
        m = _gelu_tanh(b, b.linear(m, f"{p}.mlp.c_fc", h, 4 * h))
        return b.op("Add", x, b.linear(m, f"{p}.mlp.c_proj", 4 * h, h))


def gpt_decoder_step(cfg: GptConfig | None = None, seed: int = 0, **overrides: Any
                     ) -> onnx.ModelProto:
    """One GPT-2 forward over new tokens with a KV cache (decode: seq=1; prefill: past may be 0).

    Inputs input_ids int64 [batch, seq], past_key_i / past_value_i [batch, heads, past_seq,
    head_dim]; positions are computed as past_seq + arange(seq). Outputs logits [batch, seq,
    vocab] (lm_head tied to wte) and present_key_i / present_value_i (past ++ new on axis 2).
    """
    cfg = _config(cfg, GptConfig, overrides)
    b = _Builder(seed)
    h, dh = cfg.hidden, cfg.hidden // cfg.heads
    with b.scope("transformer"):
        past = b.op("Gather", b.op("Shape", "past_key_0"), b.const(2, _I64))
        seq = b.op("Gather", b.op("Shape", "input_ids"), b.const(1, _I64))
        total = b.op("Add", past, seq)
        positions = b.op("Range", past, total, b.const(1, _I64))
        wte = b.normal("transformer.wte.weight", (cfg.vocab, h), h**-0.5)
        wpe = b.normal("transformer.wpe.weight", (cfg.max_positions, h), 0.01)
        pos = b.op("Gather", wpe, b.op("Unsqueeze", positions, b.const([0], _I64)))
        x = b.op("Add", b.op("Gather", wte, "input_ids"), pos)
        allowed = _causal_mask(b, cfg, past, seq, total, positions)
    for i in range(cfg.layers):
        with b.scope(f"transformer/h.{i}"):
            x = _gpt_block(b, x, allowed, i, cfg)
    x = b.layer_norm(x, "transformer.ln_f", h, cfg.eps)
    with b.scope("lm_head"):
        b.rename(b.op("MatMul", x, b.op("Transpose", wte, perm=[1, 0])), "logits")
    kv_in, kv_out = ["batch", cfg.heads, "past_seq", dh], ["batch", cfg.heads, "total_seq", dh]
    inputs = [_i64("input_ids", ["batch", "seq"])]
    outputs = [_f32("logits", ["batch", "seq", cfg.vocab])]
    for i in range(cfg.layers):
        inputs += [_f32(f"past_key_{i}", kv_in), _f32(f"past_value_{i}", kv_in)]
        outputs += [_f32(f"present_key_{i}", kv_out), _f32(f"present_value_{i}", kv_out)]
    hints = {"dims": "batch=1,seq=1,past_seq=4", "input.input_ids": f"int:0:{cfg.vocab}"}
    return b.finish("gpt_decoder_step", inputs, outputs, hints)


# --- GPT-2 decoder step with fixed-capacity KV buffers ----------------------------------------


def _static_block(b: _Builder, x: str, mask: str, kv_index: str, i: int, cfg: GptConfig) -> str:
    """One GPT-2 block over fixed-capacity caches: the new key/value are scattered into the
    past at the step's position, attention runs over the whole capacity under `mask`.
    Draws its weights in the same order as `_gpt_block` (so the same seed, the same model)."""
    h, nh = cfg.hidden, cfg.heads
    dh, p = h // nh, f"transformer.h.{i}"
    with b.scope("attn"):
        a = b.layer_norm(x, f"{p}.ln_1", h, cfg.eps)
        qkv = b.linear(a, f"{p}.attn.c_attn", h, 3 * h)
        q, k, v = b.op("Split", qkv, b.const([h, h, h], _I64), n_out=3, axis=2)
        split = b.const([1, 1, nh, dh], _I64)
        q, k, v = (_heads(b, t, split, [0, 2, 1, 3]) for t in (q, k, v))  # [1, nh, 1, dh]
        k = b.rename(b.op("ScatterND", f"past_key_{i}", kv_index, k), f"present_key_{i}")
        v = b.rename(b.op("ScatterND", f"past_value_{i}", kv_index, v), f"present_value_{i}")
        kt = b.op("Transpose", k, perm=[0, 1, 3, 2])
        scores = b.op("Div", b.op("MatMul", q, kt), b.const(math.sqrt(dh)))  # [1, nh, 1, cap]
        ctx = b.op("MatMul", b.op("Softmax", b.op("Add", scores, mask), axis=-1), v)
        ctx = b.op("Reshape", b.op("Transpose", ctx, perm=[0, 2, 1, 3]), b.const([1, 1, h], _I64))
        x = b.op("Add", x, b.linear(ctx, f"{p}.attn.c_proj", h, h))
    with b.scope("mlp"):
        m = b.layer_norm(x, f"{p}.ln_2", h, cfg.eps)
        m = _gelu_tanh(b, b.linear(m, f"{p}.mlp.c_fc", h, 4 * h))
        return b.op("Add", x, b.linear(m, f"{p}.mlp.c_proj", 4 * h, h))


def gpt_static_decoder_step(cfg: GptConfig | None = None, capacity: int = 128, seed: int = 0,
                            **overrides: Any) -> onnx.ModelProto:
    """One GPT-2 decode step (batch 1, one new token) over fixed-capacity KV buffers, every
    shape static: the form device-graph capture replays.

    The same weights and names as `gpt_decoder_step(cfg, seed)`, so the two agree. Inputs
    input_ids int64 [1, 1]; position int64 [1] (where the new token goes: the number of tokens
    before it); attention_mask float32 [1, capacity], additive (0 where a key may be attended,
    float32 min where not; see `static_decode_feeds`); past_key_i / past_value_i float32
    [1, heads, capacity, head_dim]. The new key/value are written at `position` by ScatterND
    (as torch exports `cache[:, :, pos] = k`), giving present_key_i / present_value_i of the
    same shape; attention runs over the whole capacity. Outputs logits [1, 1, vocab], then
    present_key_i, present_value_i per layer (the order of `gpt_decoder_step`).
    Positions must stay below both `capacity` and `cfg.max_positions`. Masked cache slots are
    still read, so a fresh cache must be zeroed (NaN there would leak through the softmax).
    """
    cfg = _config(cfg, GptConfig, overrides)
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    b = _Builder(seed)
    h, nh, dh = cfg.hidden, cfg.heads, cfg.hidden // cfg.heads
    with b.scope("transformer"):
        wte = b.normal("transformer.wte.weight", (cfg.vocab, h), h**-0.5)
        wpe = b.normal("transformer.wpe.weight", (cfg.max_positions, h), 0.01)
        x = b.op("Add", b.op("Gather", wte, "input_ids"), b.op("Gather", wpe, "position"))
        # ScatterND indices [1, nh, 1, 3]: (0, head, position) for every head
        heads = np.zeros((1, nh, 1, 2), _I64)
        heads[0, :, 0, 1] = np.arange(nh)
        pos = b.op("Expand", b.op("Reshape", "position", b.const([1, 1, 1, 1], _I64)),
                   b.const([1, nh, 1, 1], _I64))
        kv_index = b.op("Concat", b.const(heads, _I64), pos, axis=-1)
        mask = b.op("Reshape", "attention_mask", b.const([1, 1, 1, capacity], _I64))
    for i in range(cfg.layers):
        with b.scope(f"transformer/h.{i}"):
            x = _static_block(b, x, mask, kv_index, i, cfg)
    x = b.layer_norm(x, "transformer.ln_f", h, cfg.eps)
    with b.scope("lm_head"):
        b.rename(b.op("MatMul", x, b.op("Transpose", wte, perm=[1, 0])), "logits")
    kv = [1, nh, capacity, dh]
    inputs = [_i64("input_ids", [1, 1]), _i64("position", [1]),
              _f32("attention_mask", [1, capacity])]
    outputs = [_f32("logits", [1, 1, cfg.vocab])]
    for i in range(cfg.layers):
        inputs += [_f32(f"past_key_{i}", kv), _f32(f"past_value_{i}", kv)]
        outputs += [_f32(f"present_key_{i}", kv), _f32(f"present_value_{i}", kv)]
    hints = {"input.input_ids": f"int:0:{cfg.vocab}",
             "input.position": f"int:0:{min(capacity, cfg.max_positions)}",
             "capacity": str(capacity)}
    return b.finish("gpt_static_decoder_step", inputs, outputs, hints)


def static_decode_feeds(step: int, token: int, capacity: int) -> dict[str, np.ndarray]:
    """input_ids, position and attention_mask for `gpt_static_decoder_step` at `step` (the
    new token's position): keys 0..step may be attended (mask 0), the rest get float32 min."""
    if not 0 <= step < capacity:
        raise ValueError(f"step {step} is outside the capacity {capacity}")
    mask = np.full((1, capacity), _F32_MIN, np.float32)
    mask[0, : step + 1] = 0.0
    return {"input_ids": np.array([[token]], _I64), "position": np.array([step], _I64),
            "attention_mask": mask}


def static_decode_bindings(session: Any, cfg: GptConfig, capacity: int
                           ) -> tuple[list[Any], dict[str, Any], Any]:
    """Device bindings for every input and output of `gpt_static_decoder_step` in `session`:
    the KV buffers (each bound as past input and present output, zeroed: masked slots are
    still read), the per-step inputs by name (write `static_decode_feeds` into them), and
    the logits output. What a captured decode loop replays over."""
    from onnxkiln.dtypes import DataType

    shape = (1, cfg.heads, capacity, cfg.hidden // cfg.heads)
    kv = [session.allocate_device_binding(f"past_{kv}_{i}", f"present_{kv}_{i}",
                                          DataType.FLOAT, shape, shape)
          for i in range(cfg.layers) for kv in ("key", "value")]
    for b in kv:
        b.write(np.zeros(shape, np.float32))
    feeds = {name: session.allocate_device_binding(name, None, dtype, dims, dims)
             for name, dtype, dims in [("input_ids", DataType.INT64, (1, 1)),
                                       ("position", DataType.INT64, (1,)),
                                       ("attention_mask", DataType.FLOAT, (1, capacity))]}
    logits = session.allocate_device_output_binding("logits", DataType.FLOAT,
                                                    (1, 1, cfg.vocab), (1, 1, cfg.vocab))
    return kv, feeds, logits
