"""Convolutional zoo models: ResNet and MobileNetV2."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import onnx

from onnxkiln.zoo._builder import _Builder, _config, _f32

__all__ = ["MobileNetConfig", "ResNetConfig", "mobilenet_v2", "resnet"]


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
