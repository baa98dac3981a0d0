"""What the exported suite holds: one Spec per .onnx file (model, size, exporter).

Plain data (no torch): `bench.exported.build` turns each Spec into a file with the builder
of the same name in `bench.exported.models` or `bench.exported.sk_models`. Every model
gets random weights from a seed (no downloads); sizes are the library's default configs
("base", "tiny" for Whisper, "default" for T5) or small ones (hidden 128, 2-4 layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEED = 0
BUILD_VERSION = 1
"""Bump when a builder changes what it exports: every entry's spec_hash changes with it."""


@dataclass(frozen=True)
class Spec:
    name: str
    family: str
    size: str
    exporter: str  # "torchscript" (dynamo=False), "dynamo" (dynamo=True) or "skl2onnx"
    builder: str  # function name in bench.exported.models / sk_models
    config: dict[str, Any]
    runs: tuple[dict[str, Any], ...]
    quick: bool = False
    notes: str = ""
    export_dims: dict[str, int] = field(default_factory=dict)  # example sizes for the export


def batches(sizes: tuple[int, ...] = (1, 4), **dims: int) -> tuple[dict[str, Any], ...]:
    """One run per batch size, the other dims fixed."""
    return tuple({"label": f"b{b}", "dims": {"batch": b, **dims}} for b in sizes)


_BN = {"batchnorm": "calibrated"}  # see models.calibrate_batchnorm
_EAGER = ("attn_implementation='eager' (under the TorchScript exporter the sdpa path traces "
          "shape-dependent Python branches, e.g. is_causal, as constants)")
BERT_SMALL = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 2,
              "intermediate_size": 512}
GPT2_SMALL = {"n_embd": 128, "n_layer": 4, "n_head": 4}
VIT_SMALL = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
             "intermediate_size": 512}
T5_SMALL = {"d_model": 128, "d_ff": 512, "num_layers": 2, "num_decoder_layers": 2,
            "num_heads": 4, "d_kv": 32}
TEXT = batches(seq=128)
IMAGE = batches()
TABULAR = batches((1, 16))
DECODE = batches(past_seq=128, total_seq=129)
T5_DECODE = batches(enc_seq=128, past_seq=32)


def _both(name: str, family: str, size: str, builder: str, config: dict[str, Any],
          runs: tuple[dict[str, Any], ...], quick: bool = False, notes: str = "",
          exporters: tuple[str, ...] = ("torchscript", "dynamo")) -> list[Spec]:
    short = {"torchscript": "ts", "dynamo": "dynamo"}
    return [Spec(f"{name}-{short[e]}", family, size, e, builder, config, runs, quick, notes)
            for e in exporters]


TS = ("torchscript",)
SPECS: list[Spec] = [
    *_both("resnet18", "resnet18", "base", "tv_classifier", {"arch": "resnet18", **_BN},
           IMAGE),
    *_both("mobilenetv3-large", "mobilenetv3", "large", "tv_classifier",
           {"arch": "mobilenet_v3_large", **_BN}, IMAGE),
    *_both("mobilenetv3-small", "mobilenetv3", "small", "tv_classifier",
           {"arch": "mobilenet_v3_small", **_BN}, IMAGE, quick=True, exporters=TS),
    *_both("efficientnet-b0", "efficientnet", "b0", "tv_classifier",
           {"arch": "efficientnet_b0", **_BN}, IMAGE, exporters=TS),
    *_both("ssdlite320", "detector", "mobilenetv3-large", "tv_ssdlite", _BN,
           batches((1,)), notes="fixed batch 1: torchvision's detection transform loops "
           "over a list of images"),
    *_both("bert-small", "bert", "small", "bert", BERT_SMALL, TEXT, quick=True, notes=_EAGER),
    *_both("bert-base", "bert", "base", "bert", {}, TEXT, notes=_EAGER),
    *_both("distilbert-base", "distilbert", "base", "distilbert", {}, TEXT, notes=_EAGER,
           exporters=("dynamo",)),
    *_both("gpt2-small-prefill", "gpt2", "small", "gpt2_prefill", GPT2_SMALL, TEXT,
           quick=True, notes=_EAGER),
    *_both("gpt2-base-prefill", "gpt2", "base", "gpt2_prefill", {}, TEXT, notes=_EAGER,
           exporters=TS),
    *_both("gpt2-small-decode", "gpt2", "small", "gpt2_decode", GPT2_SMALL, DECODE,
           quick=True, notes=_EAGER),
    *_both("gpt2-base-decode", "gpt2", "base", "gpt2_decode", {}, DECODE, notes=_EAGER),
    *_both("t5-small-encoder", "t5", "small", "t5_encoder", T5_SMALL, TEXT, quick=True,
           notes=_EAGER, exporters=TS),
    *_both("t5-small-decoder", "t5", "small", "t5_decoder", T5_SMALL, T5_DECODE, quick=True,
           notes=_EAGER, exporters=TS),
    *_both("t5-default-encoder", "t5", "default", "t5_encoder", {}, TEXT, notes=_EAGER),
    *_both("t5-default-decoder", "t5", "default", "t5_decoder", {}, T5_DECODE, notes=_EAGER),
    *_both("whisper-tiny-encoder", "whisper", "tiny", "whisper_encoder", {}, batches((1,)),
           notes=_EAGER + "; timed at batch 1 only (batch 4 takes ~10 s a round here)"),
    *_both("vit-small", "vit", "small", "vit", VIT_SMALL, IMAGE, quick=True, notes=_EAGER),
    *_both("vit-base", "vit", "base", "vit", {}, IMAGE, notes=_EAGER, exporters=TS),
    *_both("lstm-tagger", "rnn", "small", "rnn_tagger", {"cell": "LSTM"}, batches(seq=64),
           quick=True),
    *_both("gru-tagger", "rnn", "small", "rnn_tagger", {"cell": "GRU"}, batches(seq=64),
           exporters=TS),
    Spec("sk-scaler-logreg", "sklearn", "20x3", "skl2onnx", "logreg", {}, TABULAR, True),
    Spec("sk-svc", "sklearn", "20x2", "skl2onnx", "svc", {}, TABULAR, True),
    Spec("sk-random-forest", "sklearn", "100 trees", "skl2onnx", "random_forest", {},
         TABULAR, True),
    Spec("sk-gradient-boosting", "sklearn", "100x3 trees", "skl2onnx", "gradient_boosting",
         {}, TABULAR, True),
    Spec("sk-pca", "sklearn", "50->10", "skl2onnx", "pca", {}, TABULAR, True),
]
