"""Realistic ONNX models built in code, for tests, benchmarks and `onnxkiln demo`.

Every generator returns a checked `onnx.ModelProto` (opset 17) with deterministic random
weights, laid out the way exporters emit it before optimisation. `random_inputs` builds
valid feeds for any of them from the declared inputs, binding symbolic dims to small sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from onnxkiln.zoo._builder import OPSET, random_inputs
from onnxkiln.zoo.cnn import MobileNetConfig, ResNetConfig, mobilenet_v2, resnet
from onnxkiln.zoo.dense import LstmConfig, MlpConfig, lstm, mlp
from onnxkiln.zoo.transformer import (
    BertConfig,
    GptConfig,
    bert_encoder,
    gpt_decoder_step,
    gpt_static_decoder_step,
    static_decode_bindings,
    static_decode_feeds,
)

__all__ = [
    "MODELS",
    "OPSET",
    "BertConfig",
    "GptConfig",
    "LstmConfig",
    "MlpConfig",
    "MobileNetConfig",
    "ResNetConfig",
    "bert_encoder",
    "default_model",
    "gpt_decoder_step",
    "gpt_static_decoder_step",
    "lstm",
    "mlp",
    "mobilenet_v2",
    "random_inputs",
    "resnet",
    "static_decode_bindings",
    "static_decode_feeds",
]


# --- registry and demo ----------------------------------------------------------------------

MODELS: dict[str, tuple[Callable[..., onnx.ModelProto], Any, Any]] = {
    "mlp": (mlp, MlpConfig(), MlpConfig.large()),
    "resnet": (resnet, ResNetConfig(), ResNetConfig.resnet50()),
    "bert": (bert_encoder, BertConfig(), BertConfig.base()),
    "gpt2": (gpt_decoder_step, GptConfig(), GptConfig.gpt2_small()),
    "mobilenet": (mobilenet_v2, MobileNetConfig(), MobileNetConfig.v2()),
    "lstm": (lstm, LstmConfig(), LstmConfig.large()),
}
"""name -> (generator, small config, realistic config: MLP 1024-4096-4096-1000, ResNet-50 at
224, BERT-base, GPT-2 small, MobileNetV2 1.0 at 224, LSTM 2x512 over 128 steps)."""


def default_model(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The `onnxkiln demo` model: a 2-layer BERT encoder (hidden 64) and feeds for 32 tokens."""
    cfg = BertConfig(layers=2, hidden=64, heads=4, ffn=256, vocab=1000, max_positions=128)
    model = bert_encoder(cfg, seed=seed)
    return model, random_inputs(model, seed=seed, batch=1, seq=32)
