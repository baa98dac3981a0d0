"""Decoder graphs from onnxruntime-genai's model builder, built from tiny random-weight configs.

    from bench.genai_models import build, greedy
    path = build("llama", "int4", hidden=256, layers=2)  # model.onnx + genai_config.json
    tokens = greedy(session, path, prompt=[5, 6, 7], steps=32)

The builder is the tool most people use to make decoder ONNX files (Llama, Qwen, Phi, Gemma,
Mistral ...): its graphs use `GroupQueryAttention` (rotary inside), `MatMulNBits` for int4 weights
(at `accuracy_level=4` on the CPU by default), and `SkipSimplifiedLayerNormalization`. Weights
are seeded random; the tokenizer is a word-level one over `t0 .. tN`, so nothing is downloaded.
Built folders are cached under `$ONNXKILN_GENAI_CACHE` (default `~/.cache/onnxkiln/genai`),
keyed by every build argument. The builder needs `onnxruntime-genai`, `transformers` and
`torch`; `available()` says whether they import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxkiln.generation_layout import DecoderLayout

# Gemma2 is left out: its sliding-window GQA needs a preallocated cache of the window's size,
# which the plain reference loop (`greedy`) does not feed.
ARCHS = ("llama", "qwen2", "qwen3", "phi3", "mistral", "gemma")
PRECISIONS = ("fp32", "int4")


def available() -> str | None:
    """None when the builder can run here, else why not (for a skip reason)."""
    for module in ("onnxruntime_genai", "transformers", "torch"):
        try:
            __import__(module)
        except ImportError as exc:
            return f"the genai model builder needs {module}: {exc}"
    return None


def _config(arch: str, hidden: int, layers: int, vocab: int, context: int) -> Any:
    """A transformers config of `arch` with `layers` layers of width `hidden`."""
    import transformers as tf

    heads = max(hidden // 64, 2)
    common = {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 2 * hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": max(heads // 2, 1), "max_position_embeddings": context,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    if arch == "llama":
        return tf.LlamaConfig(**common)
    if arch == "qwen2":
        return tf.Qwen2Config(**common)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=hidden // heads)
    if arch == "phi3":
        return tf.Phi3Config(**common, original_max_position_embeddings=context)
    if arch == "mistral":
        return tf.MistralConfig(**common, sliding_window=None)
    if arch == "gemma":
        return tf.GemmaConfig(**common, head_dim=hidden // heads)
    raise ValueError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHS)}")


def _save_source(folder: Path, arch: str, hidden: int, layers: int, vocab: int,
                 context: int, seed: int) -> None:
    """A transformers checkpoint (random weights) and a word-level tokenizer in `folder`."""
    import torch
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"t{i}": i for i in range(vocab)}
    raw = Tokenizer(models.WordLevel(vocab=words, unk_token="t0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="t0", bos_token="t1",
                                           eos_token="t2", pad_token="t3")
    torch.manual_seed(seed)
    config = _config(arch, hidden, layers, vocab, context)
    config.architectures = None
    model = tf.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def cache_root() -> Path:
    """Where built folders live."""
    default = Path.home() / ".cache" / "onnxkiln" / "genai"
    return Path(os.environ.get("ONNXKILN_GENAI_CACHE", default))


def build(arch: str = "llama", precision: str = "fp32", *, hidden: int = 256, layers: int = 2,
          vocab: int = 512, context: int = 256, accuracy_level: int | None = None,
          seed: int = 0, root: Path | None = None) -> Path:
    """The builder's output folder for these arguments, built once and cached.

    `accuracy_level` applies to int4 (`MatMulNBits`); None keeps the builder's CPU default (4).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    level = "" if accuracy_level is None or precision != "int4" else f"-acc{accuracy_level}"
    name = f"{arch}-{precision}{level}-h{hidden}-l{layers}-v{vocab}-c{context}-s{seed}"
    out = (root or cache_root()) / name
    if (out / "genai_config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # built in a private folder, then renamed into place: concurrent test workers may
    # build the same model, and a reader must never see a half-written one
    work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out.parent))
    try:
        _save_source(work / "src", arch, hidden, layers, vocab, context, seed)
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i",
                   str(work / "src"), "-o", str(work / "out"), "-p", precision, "-e", "cpu",
                   "-c", str(work / "cache")]
        if level:
            command += ["--extra_options", f"accuracy_level={accuracy_level}"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not (work / "out" / "genai_config.json").exists():
            raise RuntimeError(f"the genai builder failed for {name}:\n{done.stderr[-3000:]}")
        try:
            os.rename(work / "out", out)
        except OSError:  # another process put it there first
            if not (out / "genai_config.json").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


class DecoderIO:
    """Input/output names and KV layout of a builder folder, read from its genai_config.json
    (parsed by `onnxkiln.generation_layout.DecoderLayout`, which `onnxkiln.generate` uses)."""

    def __init__(self, folder: Path):
        layout = DecoderLayout.from_genai_config(folder)
        self.layout = layout
        self.model_path = Path(folder) / layout.extra["filename"]
        self.layers = layout.layers // 2
        self.kv_heads = layout.kv_dims[1]
        self.head_size = layout.kv_dims[3]
        self.eos = layout.eos[0] if len(layout.eos) == 1 else list(layout.eos)
        self.input_ids = layout.input_ids
        self.attention_mask = layout.attention_mask
        self.position_ids = layout.position_ids
        self.past, self.present = list(layout.past), list(layout.present)
        self.logits = layout.logits

    def empty_past(self, batch: int = 1, dtype: Any = np.float32) -> dict[str, np.ndarray]:
        """The past of a first step: every KV input with length 0."""
        shape = (batch, self.kv_heads, 0, self.head_size)
        return {name: np.zeros(shape, dtype) for name in self.past}

    def feeds(self, tokens: np.ndarray, total: int, past: dict[str, np.ndarray]) -> dict:
        """The inputs of one step: `tokens` [batch, new] after `total - new` earlier tokens."""
        batch, new = tokens.shape
        feeds = {self.input_ids: tokens.astype(np.int64), **past}
        if self.attention_mask:
            feeds[self.attention_mask] = np.ones((batch, total), np.int64)
        if self.position_ids:
            start = total - new
            feeds[self.position_ids] = np.tile(np.arange(start, total, dtype=np.int64), (batch, 1))
        return feeds


def greedy(session: Any, folder: Path, prompt: Sequence[int], steps: int) -> list[int]:
    """`steps` greedy tokens after `prompt`, one plain `session.run(names, feeds)` per step.

    `session` is an onnxruntime or onnxkiln session of the folder's model; each step feeds the
    presents of the last one back as the past (no bindings: the reference loop).
    """
    io = DecoderIO(folder)
    past = io.empty_past()
    tokens = np.asarray([prompt], np.int64)
    total, produced = tokens.shape[1], []
    for _ in range(steps):
        logits, *present = session.run([io.logits, *io.present], io.feeds(tokens, total, past))
        past = dict(zip(io.past, present, strict=True))
        token = int(np.argmax(logits[0, -1]))
        produced.append(token)
        tokens = np.asarray([[token]], np.int64)
        total += 1
    return produced
