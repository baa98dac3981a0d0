"""Torch builders for the exported suite: torchvision and transformers models from configs
(seeded random weights, no downloads) and a plain-torch RNN tagger.

Runs in the export venv only (torch, torchvision, transformers). Each builder takes the
Spec's config and returns an Exportable: the module in eval mode, example inputs, and the
input/output description the manifest records.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from bench.exported.catalog import SEED


@dataclass
class Exportable:
    module: Any  # a torch.nn.Module (eval mode)
    inputs: list[dict[str, Any]]  # manifest input specs: name, dtype, shape (named dims), range
    outputs: list[str]
    config: dict[str, Any]  # the config summary the manifest records
    derived: dict[str, tuple[str, int]] = field(default_factory=dict)  # dim = other + k

    def example(self, dims: dict[str, int]) -> tuple[Any, ...]:
        """Seeded example tensors at `dims` (the export traces with these)."""
        g = torch.Generator().manual_seed(SEED)
        out = []
        for spec in self.inputs:
            shape = [dims[d] if isinstance(d, str) else d for d in spec["shape"]]
            if spec["dtype"] == "int64":
                low, high = spec["range"]
                out.append(torch.randint(low, high, shape, generator=g))
            else:
                out.append(torch.randn(shape, generator=g) * spec.get("scale", 1.0))
        return tuple(out)


def _tensor(name: str, shape: list[Any], dtype: str = "float32", **extra: Any
            ) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": shape, **extra}


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- torchvision ----------------------------------------------------------------------------


def calibrate_batchnorm(model: nn.Module, image: int, batch: int = 8) -> nn.Module:
    """Set every BatchNorm's running statistics from one seeded random batch (then eval).

    Freshly initialized statistics (mean 0, var 1) let activations shrink layer by layer:
    random-weight MobileNetV3 and EfficientNet logits come out near 1e-15, which makes the
    output comparison meaningless. Calibrated, each layer sees unit-scale inputs, as in a
    trained network.
    """
    model.eval()
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: one batch sets the statistics
        m.train()
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        images = torch.randn(batch, 3, image, image, generator=g)
        model(list(images) if hasattr(model, "postprocess_detections") else images)
    return model.eval()


def tv_classifier(config: dict[str, Any]) -> Exportable:
    """A torchvision ImageNet classifier, 224x224, random weights, calibrated BatchNorm."""
    import torchvision

    torch.manual_seed(SEED)
    model = getattr(torchvision.models, config["arch"])(weights=None)
    model = calibrate_batchnorm(model, 224)
    return Exportable(model, [_tensor("images", ["batch", 3, 224, 224])], ["logits"],
                      {**config, "image": 224, "params": _params(model)})


class _Detector(nn.Module):
    """Tensor in, tensors out: torchvision detectors take a list of images and return a
    list of dicts."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        det = self.model(list(images))[0]
        return det["boxes"], det["scores"], det["labels"]


def tv_ssdlite(config: dict[str, Any]) -> Exportable:
    """SSDlite 320 with a MobileNetV3-Large backbone (91 COCO classes), random weights,
    calibrated BatchNorm."""
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None)
    model = calibrate_batchnorm(model, 320, batch=2)
    return Exportable(_Detector(model).eval(), [_tensor("images", [1, 3, 320, 320])],
                      ["boxes", "scores", "labels"],
                      {"arch": "ssdlite320_mobilenet_v3_large", "image": 320,
                       "params": _params(model)})


# --- plain torch RNN tagger ------------------------------------------------------------------


class RNNTagger(nn.Module):
    """Token ids -> embedding -> 2-layer bidirectional LSTM/GRU -> per-token tag logits."""

    def __init__(self, cell: str, vocab: int, embed: int, hidden: int, layers: int,
                 tags: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = getattr(nn, cell)(embed, hidden, layers, batch_first=True,
                                     bidirectional=True)
        self.head = nn.Linear(2 * hidden, tags)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(token_ids))
        return self.head(out)


def rnn_tagger(config: dict[str, Any]) -> Exportable:
    sizes = {"vocab": 5000, "embed": 128, "hidden": 256, "layers": 2, "tags": 17}
    torch.manual_seed(SEED)
    model = RNNTagger(config["cell"], **sizes).eval()
    return Exportable(model, [_tensor("token_ids", ["batch", "seq"], "int64",
                                      range=[0, sizes["vocab"]])], ["tag_logits"],
                      {**config, **sizes, "bidirectional": True, "params": _params(model)})


# --- transformers ----------------------------------------------------------------------------


def _hf(config_class: str, model_class: str, config: dict[str, Any]) -> tuple[Any, Any]:
    """A transformers model from its config with seeded random weights, eager attention."""
    import transformers

    cfg = getattr(transformers, config_class)(**config)
    torch.manual_seed(SEED)
    model = getattr(transformers, model_class)._from_config(cfg, attn_implementation="eager")
    return model.eval(), cfg


def _summary(cfg: Any, keys: tuple[str, ...], model: nn.Module) -> dict[str, Any]:
    return {**{k: getattr(cfg, k) for k in keys}, "params": _params(model),
            "attn_implementation": "eager"}


def _cache_kw(model: nn.Module) -> str:
    """The forward argument that takes the KV cache: `cache` in transformers 5.x,
    `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


def _cache_out(out: Any) -> Any:
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


def _flat(cache: Any) -> tuple[torch.Tensor, ...]:
    """A DynamicCache as (k0, v0, k1, v1, ...)."""
    return tuple(t for layer in cache.layers for t in (layer.keys, layer.values))


class _Encoder(nn.Module):
    """Named tensor inputs, the listed fields of the model output as a tuple."""

    def __init__(self, model: nn.Module, names: list[str], fields: list[str]) -> None:
        super().__init__()
        self.model, self.names, self.fields = model, names, fields

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.names, args)))
        return tuple(getattr(out, f) for f in self.fields)


def _text_inputs(vocab: int, names: tuple[str, ...]) -> list[dict[str, Any]]:
    ranges = {"input_ids": [0, vocab], "attention_mask": [1, 2], "token_type_ids": [0, 2]}
    return [_tensor(n, ["batch", "seq"], "int64", range=ranges[n]) for n in names]


def bert(config: dict[str, Any]) -> Exportable:
    model, cfg = _hf("BertConfig", "BertModel", config)
    names = ("input_ids", "attention_mask", "token_type_ids")
    fields = ["last_hidden_state", "pooler_output"]
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "vocab_size")
    return Exportable(_Encoder(model, list(names), fields), _text_inputs(cfg.vocab_size, names),
                      fields, _summary(cfg, keys, model))


def distilbert(config: dict[str, Any]) -> Exportable:
    model, cfg = _hf("DistilBertConfig", "DistilBertModel", config)
    names = ("input_ids", "attention_mask")
    keys = ("dim", "n_layers", "n_heads", "hidden_dim", "vocab_size")
    return Exportable(_Encoder(model, list(names), ["last_hidden_state"]),
                      _text_inputs(cfg.vocab_size, names), ["last_hidden_state"],
                      _summary(cfg, keys, model))


def vit(config: dict[str, Any]) -> Exportable:
    model, cfg = _hf("ViTConfig", "ViTModel", config)
    fields = ["last_hidden_state", "pooler_output"]
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "image_size", "patch_size")
    return Exportable(_Encoder(model, ["pixel_values"], fields),
                      [_tensor("pixel_values", ["batch", 3, cfg.image_size, cfg.image_size])],
                      fields, _summary(cfg, keys, model))


def whisper_encoder(config: dict[str, Any]) -> Exportable:
    """Whisper's audio encoder (30 s of 80-bin log-mel frames)."""
    model, cfg = _hf("WhisperConfig", "WhisperModel", config)
    encoder = model.get_encoder()
    frames = 2 * cfg.max_source_positions
    keys = ("d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
            "num_mel_bins", "max_source_positions")
    return Exportable(_Encoder(encoder, ["input_features"], ["last_hidden_state"]),
                      [_tensor("input_features", ["batch", cfg.num_mel_bins, frames])],
                      ["last_hidden_state"], _summary(cfg, keys, encoder))


def t5_encoder(config: dict[str, Any]) -> Exportable:
    model, cfg = _hf("T5Config", "T5EncoderModel", config)
    names = ("input_ids", "attention_mask")
    keys = ("d_model", "d_ff", "num_layers", "num_heads", "d_kv", "vocab_size")
    return Exportable(_Encoder(model, list(names), ["last_hidden_state"]),
                      _text_inputs(cfg.vocab_size, names), ["last_hidden_state"],
                      _summary(cfg, keys, model))


def _present(layers: int) -> list[str]:
    return [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


class _GPT2Prefill(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True)
        return (out.logits, *_flat(_cache_out(out)))


def gpt2_prefill(config: dict[str, Any]) -> Exportable:
    """GPT-2 LM over a prompt: logits and the KV cache it fills (present.*)."""
    model, cfg = _hf("GPT2Config", "GPT2LMHeadModel", config)
    keys = ("n_embd", "n_layer", "n_head", "vocab_size")
    return Exportable(_GPT2Prefill(model), _text_inputs(cfg.vocab_size,
                                                        ("input_ids", "attention_mask")),
                      ["logits", *_present(cfg.n_layer)], _summary(cfg, keys, model))


class _GPT2Decode(nn.Module):
    """One decode step: the new token, the mask over past + new, the flat past."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.kw = model, _cache_kw(model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        cache = DynamicCache([(past[i], past[i + 1]) for i in range(0, len(past), 2)])
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True,
                         **{self.kw: cache})
        return (out.logits, *_flat(_cache_out(out)))


def _past(layers: int, heads: int, head_dim: int, seq: str, prefix: str = "past"
          ) -> list[dict[str, Any]]:
    return [_tensor(f"{prefix}.{i}.{kv}", ["batch", heads, seq, head_dim])
            for i in range(layers) for kv in ("key", "value")]


def gpt2_decode(config: dict[str, Any]) -> Exportable:
    """GPT-2 decode step with past key values (input_ids of length 1)."""
    model, cfg = _hf("GPT2Config", "GPT2LMHeadModel", config)
    keys = ("n_embd", "n_layer", "n_head", "vocab_size")
    inputs = [_tensor("input_ids", ["batch", 1], "int64", range=[0, cfg.vocab_size]),
              _tensor("attention_mask", ["batch", "total_seq"], "int64", range=[1, 2]),
              *_past(cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, "past_seq")]
    return Exportable(_GPT2Decode(model), inputs, ["logits", *_present(cfg.n_layer)],
                      _summary(cfg, keys, model), derived={"total_seq": ("past_seq", 1)})


class _T5Decode(nn.Module):
    """One decoder step: the new token, the encoder states and mask, then per layer the
    self-attention past (key, value) and the cross-attention keys and values."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.kw = model, _cache_kw(model)

    def forward(self, decoder_input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor,
                encoder_attention_mask: torch.Tensor, *past: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache, EncoderDecoderCache

        self_kv = [(past[i], past[i + 1]) for i in range(0, len(past), 4)]
        cross_kv = [(past[i + 2], past[i + 3]) for i in range(0, len(past), 4)]
        cache = EncoderDecoderCache(DynamicCache(self_kv), DynamicCache(cross_kv))
        out = self.model(decoder_input_ids=decoder_input_ids,
                         encoder_outputs=(encoder_hidden_states,),
                         attention_mask=encoder_attention_mask, use_cache=True,
                         **{self.kw: cache})
        return (out.logits, *_flat(_cache_out(out).self_attention_cache))


def t5_decoder(config: dict[str, Any]) -> Exportable:
    """T5 (LM head) decoder step with self- and cross-attention past (optimum's
    decoder-with-past layout)."""
    model, cfg = _hf("T5Config", "T5ForConditionalGeneration", config)
    keys = ("d_model", "d_ff", "num_decoder_layers", "num_heads", "d_kv", "vocab_size")
    inputs = [_tensor("decoder_input_ids", ["batch", 1], "int64", range=[0, cfg.vocab_size]),
              _tensor("encoder_hidden_states", ["batch", "enc_seq", cfg.d_model]),
              _tensor("encoder_attention_mask", ["batch", "enc_seq"], "int64", range=[1, 2])]
    for i in range(cfg.num_decoder_layers):
        inputs += [_tensor(f"past.{i}.{kv}", ["batch", cfg.num_heads, seq, cfg.d_kv])
                   for kv, seq in (("key", "past_seq"), ("value", "past_seq"),
                                   ("cross_key", "enc_seq"), ("cross_value", "enc_seq"))]
    return Exportable(_T5Decode(model), inputs, ["logits", *_present(cfg.num_decoder_layers)],
                      _summary(cfg, keys, model.decoder))
