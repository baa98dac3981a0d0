"""MLP and LSTM zoo models."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import onnx

from onnxkiln.zoo._builder import _I64, _Builder, _config, _f32

__all__ = ["LstmConfig", "MlpConfig", "lstm", "mlp"]


# --- MLP ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MlpConfig:
    in_features: int = 32
    hidden: tuple[int, ...] = (64, 64)
    out_features: int = 10

    @classmethod
    def large(cls) -> MlpConfig:
        return cls(1024, (4096, 4096), 1000)


def mlp(cfg: MlpConfig | None = None, seed: int = 0, **overrides: Any) -> onnx.ModelProto:
    """Linear layers (Gemm and MatMul+Add alternating), Relu between them, a final Softmax.

    Input x [batch, in_features]; output probs [batch, out_features].
    """
    cfg = _config(cfg, MlpConfig, overrides)
    b = _Builder(seed)
    sizes = [cfg.in_features, *cfg.hidden, cfg.out_features]
    x = "x"
    for i, (d_in, d_out) in enumerate(itertools.pairwise(sizes)):
        with b.scope(f"fc{i}"):
            if i % 2 == 0:  # torch exports nn.Linear on a 2-D input as Gemm(transB=1)
                w = b.normal(f"fc{i}.weight", (d_out, d_in), d_in**-0.5)
                x = b.op("Gemm", x, w, b.normal(f"fc{i}.bias", (d_out,), 0.02), transB=1)
            else:
                x = b.linear(x, f"fc{i}", d_in, d_out)
            if i < len(sizes) - 2:
                x = b.op("Relu", x)
    b.rename(b.op("Softmax", x, axis=-1), "probs")
    return b.finish("mlp", [_f32("x", ["batch", cfg.in_features])],
                    [_f32("probs", ["batch", cfg.out_features])], {"dims": "batch=1"})


# --- LSTM -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LstmConfig:
    layers: int = 2
    input_size: int = 8
    hidden: int = 16
    num_classes: int = 5
    seq: int = 6

    @classmethod
    def large(cls) -> LstmConfig:
        """2 stacked layers, input 256, hidden 512, 128 steps (a mid-size speech/text LSTM)."""
        return cls(2, 256, 512, 10, 128)


def lstm(cfg: LstmConfig | None = None, seed: int = 0, **overrides: Any) -> onnx.ModelProto:
    """A stacked unidirectional LSTM as torch exports nn.LSTM(batch_first=True): Transpose to
    [seq, batch, in], one ONNX LSTM node per layer (zero initial state) with Squeeze of the
    direction axis between layers, Transpose back, and a Gemm head on the last hidden state.

    Input x [batch, seq, input_size] (seq defaults to cfg.seq); outputs output [batch, seq,
    hidden] and logits [batch, num_classes].
    """
    cfg = _config(cfg, LstmConfig, overrides)
    b = _Builder(seed)
    h, bound = cfg.hidden, cfg.hidden**-0.5
    y = b.op("Transpose", "x", perm=[1, 0, 2])
    d_in, last = cfg.input_size, ""
    for i in range(cfg.layers):
        with b.scope(f"lstm/layer{i}"):
            w = b.param(f"lstm.weight_ih_l{i}", b.rng.uniform(-bound, bound, (1, 4 * h, d_in)))
            r = b.param(f"lstm.weight_hh_l{i}", b.rng.uniform(-bound, bound, (1, 4 * h, h)))
            bias = b.param(f"lstm.bias_l{i}", b.rng.uniform(-bound, bound, (1, 8 * h)))
            seq_y, last, _ = b.op("LSTM", y, w, r, bias, n_out=3, hidden_size=h)
            y = b.op("Squeeze", seq_y, b.const([1], _I64))
        d_in = h
    b.rename(b.op("Transpose", y, perm=[1, 0, 2]), "output")
    with b.scope("fc"):
        final = b.op("Squeeze", last, b.const([0], _I64))
        w = b.normal("fc.weight", (cfg.num_classes, h), h**-0.5)
        bias = b.normal("fc.bias", (cfg.num_classes,), 0.02)
        b.rename(b.op("Gemm", final, w, bias, transB=1), "logits")
    return b.finish("lstm", [_f32("x", ["batch", "seq", cfg.input_size])],
                    [_f32("output", ["batch", "seq", h]),
                     _f32("logits", ["batch", cfg.num_classes])],
                    {"dims": f"batch=1,seq={cfg.seq}"})
