"""Realistic ONNX models built in code, for tests, benchmarks and `onnxkiln demo`.

Every generator returns a checked `onnx.ModelProto` (opset 17) with deterministic random
weights, laid out the way exporters emit it before optimisation. `random_inputs` builds
valid feeds for any of them from the declared inputs, binding symbolic dims to small sizes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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
    "lstm",
    "mlp",
    "mobilenet_v2",
    "random_inputs",
    "resnet",
]

OPSET = 17
_F32_MIN = float(np.finfo(np.float32).min)
_HINT = "onnxkiln.zoo."
_I64 = np.int64


class _Builder:
    """Collects nodes and initializers with exporter-like names; weights from a seeded RNG."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._consts: dict[tuple, str] = {}
        self._scope = ""
        self._count = 0

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        outer, self._scope = self._scope, f"{self._scope}/{name}"
        try:
            yield
        finally:
            self._scope = outer

    def op(self, op_type: str, *inputs: str, n_out: int = 1, **attrs: Any) -> Any:
        """Append a node; returns its output name (a list of names when n_out > 1)."""
        self._count += 1
        name = f"{self._scope}/{op_type}_{self._count}"
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        """A Constant node (one per distinct value) holding `value`; 0-D for a scalar."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._count += 1
            name = f"/Constant_{self._count}"
            tensor = numpy_helper.from_array(arr, f"{name}_value")
            self.nodes.append(helper.make_node("Constant", [], [f"{name}_output_0"], name=name,
                                               value=tensor))
            self._consts[key] = f"{name}_output_0"
        return self._consts[key]

    def param(self, name: str, array: np.ndarray) -> str:
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def normal(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        values = self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)
        return self.param(name, values + np.float32(mean) if mean else values)

    def linear(self, x: str, prefix: str, d_in: int, d_out: int) -> str:
        """nn.Linear on a 3-D input as torch exports it: MatMul by the [in, out] weight, Add."""
        w = self.normal(f"{prefix}.weight", (d_in, d_out), d_in**-0.5)
        bias = self.normal(f"{prefix}.bias", (d_out,), 0.02)
        return self.op("Add", self.op("MatMul", x, w), bias)

    def layer_norm(self, x: str, prefix: str, dim: int, eps: float) -> str:
        gamma = self.normal(f"{prefix}.weight", (dim,), 0.1, mean=1.0)
        beta = self.normal(f"{prefix}.bias", (dim,), 0.1)
        return self.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps)

    def rename(self, value: str, new: str) -> str:
        """Give a value a public name (a graph output), in its producer and all consumers."""
        for node in self.nodes:
            for field in (node.input, node.output):
                for i, name in enumerate(field):
                    if name == value:
                        field[i] = new
        return new

    def finish(self, name: str, inputs: list, outputs: list, hints: dict[str, str]
               ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  ir_version=8, producer_name="onnxkiln.zoo")
        helper.set_model_props(model, {_HINT + k: v for k, v in hints.items()})
        onnx.checker.check_model(model)
        return model


def _f32(name: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _i64(name: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.INT64, list(shape))


def _config(cfg: Any, cls: type, overrides: dict[str, Any]) -> Any:
    cfg = cfg if cfg is not None else cls()
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


# --- inputs ---------------------------------------------------------------------------------


def random_inputs(model: onnx.ModelProto, seed: int = 0, **dims: int) -> dict[str, np.ndarray]:
    """Valid feeds for `model`'s declared inputs; symbolic dims bound by `dims` (e.g. seq=8).

    Zoo models carry hints in metadata_props: default dim sizes, token id ranges, and which
    inputs are padding masks (1s then trailing 0s per row; row 0 unpadded). Other inputs get
    standard normal floats, small non-negative integers, or random booleans.
    """
    props = {p.key: p.value for p in model.metadata_props}
    sizes = {k: int(v) for k, v in (kv.split("=") for kv in props.get(_HINT + "dims", "").split(",")
                                    if kv)}
    sizes.update(dims)
    rng = np.random.default_rng(seed)
    initialized = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initialized:
            continue
        tt = vi.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in sizes:
                shape.append(sizes[d.dim_param])
            else:
                raise ValueError(f"input {vi.name!r}: symbolic dim {d.dim_param!r} has no size; "
                                 f"pass it, e.g. random_inputs(model, {d.dim_param}=4)")
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[vi.name] = _sample(rng, dtype, tuple(shape), props.get(f"{_HINT}input.{vi.name}"))
    return feeds


def _sample(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...],
            hint: str | None) -> np.ndarray:
    if hint == "mask":
        mask = np.ones(shape, dtype=dtype)
        seq = shape[-1]
        for row in range(1, shape[0]):
            mask[row, seq - int(rng.integers(0, seq // 2 + 1)):] = 0
        return mask
    if hint and hint.startswith("int:"):
        lo, hi = (int(v) for v in hint.split(":")[1:])
        return rng.integers(lo, hi, size=shape, dtype=dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, size=shape, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


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


# --- ResNet ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResNetConfig:
    layers: tuple[int, ...] = (1, 1)
    widths: tuple[int, ...] = (8, 16)
    bottleneck: bool = False
    stem_width: int = 8
    image_size: int = 32
    num_classes: int = 10

    @classmethod
    def resnet50(cls) -> ResNetConfig:
        return cls((3, 4, 6, 3), (64, 128, 256, 512), True, 64, 224, 1000)


def _conv_bn(b: _Builder, x: str, names: tuple[str, str], c_in: int, c_out: int, k: int,
             stride: int, relu: bool, gamma: float = 1.0) -> str:
    """Conv without bias, then BatchNormalization as its own node (unfused, as exported)."""
    conv, bn = names
    w = b.normal(f"{conv}.weight", (c_out, c_in, k, k), math.sqrt(2.0 / (c_in * k * k)))
    y = b.op("Conv", x, w, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
             dilations=[1, 1], group=1)
    y = b.op("BatchNormalization", y,
             b.param(f"{bn}.weight", b.rng.uniform(0.5, 1.0, c_out) * gamma),
             b.param(f"{bn}.bias", b.rng.normal(0.0, 0.1, c_out)),
             b.param(f"{bn}.running_mean", b.rng.normal(0.0, 0.1, c_out)),
             b.param(f"{bn}.running_var", b.rng.uniform(0.5, 1.5, c_out)),
             epsilon=1e-5, momentum=0.9)
    return b.op("Relu", y) if relu else y


def _res_block(b: _Builder, x: str, p: str, c_in: int, width: int, stride: int,
               bottleneck: bool) -> tuple[str, int]:
    """A basic (two 3x3) or bottleneck (1x1, 3x3 strided, 1x1 x4) block with its shortcut."""
    c_out = width * 4 if bottleneck else width
    with b.scope(p):
        if bottleneck:
            y = _conv_bn(b, x, (f"{p}.conv1", f"{p}.bn1"), c_in, width, 1, 1, True)
            y = _conv_bn(b, y, (f"{p}.conv2", f"{p}.bn2"), width, width, 3, stride, True)
            y = _conv_bn(b, y, (f"{p}.conv3", f"{p}.bn3"), width, c_out, 1, 1, False, 0.2)
        else:
            y = _conv_bn(b, x, (f"{p}.conv1", f"{p}.bn1"), c_in, width, 3, stride, True)
            y = _conv_bn(b, y, (f"{p}.conv2", f"{p}.bn2"), width, width, 3, 1, False, 0.2)
        if stride != 1 or c_in != c_out:
            names = (f"{p}.downsample.0", f"{p}.downsample.1")
            x = _conv_bn(b, x, names, c_in, c_out, 1, stride, False)
        return b.op("Relu", b.op("Add", y, x)), c_out


def resnet(cfg: ResNetConfig | None = None, seed: int = 0, **overrides: Any) -> onnx.ModelProto:
    """torchvision-style ResNet: 7x7/2 stem, MaxPool, residual stages, GAP, Flatten, Gemm.

    Input pixel_values [batch, 3, S, S]; output logits [batch, num_classes].
    """
    cfg = _config(cfg, ResNetConfig, overrides)
    b = _Builder(seed)
    x = _conv_bn(b, "pixel_values", ("conv1", "bn1"), 3, cfg.stem_width, 7, 2, True)
    x = b.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = cfg.stem_width
    for stage, (blocks, width) in enumerate(zip(cfg.layers, cfg.widths)):
        for j in range(blocks):
            stride = 2 if stage > 0 and j == 0 else 1
            x, c = _res_block(b, x, f"layer{stage + 1}.{j}", c, width, stride, cfg.bottleneck)
    x = b.op("Flatten", b.op("GlobalAveragePool", x), axis=1)
    w = b.normal("fc.weight", (cfg.num_classes, c), c**-0.5)
    b.rename(b.op("Gemm", x, w, b.normal("fc.bias", (cfg.num_classes,), 0.02), transB=1), "logits")
    size = cfg.image_size
    return b.finish("resnet", [_f32("pixel_values", ["batch", 3, size, size])],
                    [_f32("logits", ["batch", cfg.num_classes])], {"dims": "batch=1"})


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


# --- MobileNetV2 ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MobileNetConfig:
    # inverted residual stages (expansion t, output channels c, blocks n, first stride s)
    stages: tuple[tuple[int, int, int, int], ...] = ((1, 8, 1, 1), (6, 12, 2, 2), (4, 16, 2, 2))
    stem_width: int = 8
    last_width: int = 32
    image_size: int = 32
    num_classes: int = 10

    @classmethod
    def v2(cls) -> MobileNetConfig:
        """MobileNetV2 1.0 at 224x224 (torchvision's mobilenet_v2 layout, 3.5 M parameters)."""
        stages = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                  (6, 160, 3, 2), (6, 320, 1, 1))
        return cls(stages, 32, 1280, 224, 1000)


def _mb_conv_bn(b: _Builder, x: str, p: str, c_in: int, c_out: int, k: int, stride: int,
                group: int, relu6: bool, gamma: float = 1.0) -> str:
    """Conv (group=1, or depthwise with group=channels) + BatchNormalization [+ ReLU6 as Clip]."""
    w = b.normal(f"{p}.0.weight", (c_out, c_in // group, k, k),
                 math.sqrt(2.0 / (c_in // group * k * k)))
    y = b.op("Conv", x, w, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
             dilations=[1, 1], group=group)
    y = b.op("BatchNormalization", y,
             b.param(f"{p}.1.weight", b.rng.uniform(0.5, 1.0, c_out) * gamma),
             b.param(f"{p}.1.bias", b.rng.normal(0.0, 0.1, c_out)),
             b.param(f"{p}.1.running_mean", b.rng.normal(0.0, 0.1, c_out)),
             b.param(f"{p}.1.running_var", b.rng.uniform(0.5, 1.5, c_out)),
             epsilon=1e-5, momentum=0.9)
    return b.op("Clip", y, b.const(0.0), b.const(6.0)) if relu6 else y


def _inverted_residual(b: _Builder, x: str, p: str, c_in: int, c_out: int, stride: int,
                       expand: int) -> str:
    """1x1 expand (skipped when t=1), 3x3 depthwise, 1x1 linear project; Add when shapes match."""
    hidden = c_in * expand
    with b.scope(p):
        y, i = x, 0
        if expand != 1:
            y = _mb_conv_bn(b, y, f"{p}.conv.{i}", c_in, hidden, 1, 1, 1, True)
            i += 1
        y = _mb_conv_bn(b, y, f"{p}.conv.{i}", hidden, hidden, 3, stride, hidden, True)
        y = _mb_conv_bn(b, y, f"{p}.conv.{i + 1}", hidden, c_out, 1, 1, 1, False, 0.2)
        return b.op("Add", x, y) if stride == 1 and c_in == c_out else y


def mobilenet_v2(cfg: MobileNetConfig | None = None, seed: int = 0, **overrides: Any
                 ) -> onnx.ModelProto:
    """torchvision-style MobileNetV2: 3x3/2 stem, inverted residual blocks (ReLU6 as Clip),
    1x1 conv to last_width, GlobalAveragePool, Flatten, Gemm (dropout omitted, as in eval).

    Input pixel_values [batch, 3, S, S]; output logits [batch, num_classes].
    """
    cfg = _config(cfg, MobileNetConfig, overrides)
    b = _Builder(seed)
    x = _mb_conv_bn(b, "pixel_values", "features.0", 3, cfg.stem_width, 3, 2, 1, True)
    c, index = cfg.stem_width, 1
    for expand, width, blocks, stride in cfg.stages:
        for j in range(blocks):
            x = _inverted_residual(b, x, f"features.{index}", c, width, stride if j == 0 else 1,
                                   expand)
            c, index = width, index + 1
    x = _mb_conv_bn(b, x, f"features.{index}", c, cfg.last_width, 1, 1, 1, True)
    x = b.op("Flatten", b.op("GlobalAveragePool", x), axis=1)
    w = b.normal("classifier.1.weight", (cfg.num_classes, cfg.last_width), cfg.last_width**-0.5)
    bias = b.normal("classifier.1.bias", (cfg.num_classes,), 0.02)
    b.rename(b.op("Gemm", x, w, bias, transB=1), "logits")
    size = cfg.image_size
    return b.finish("mobilenet_v2", [_f32("pixel_values", ["batch", 3, size, size])],
                    [_f32("logits", ["batch", cfg.num_classes])], {"dims": "batch=1"})


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
