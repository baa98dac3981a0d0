"""Torch kernels: ai.onnx.preview.training optimizers (Adagrad, Adam, Momentum).

R (learning rate) and T (update count) are host scalars, as the CPU kernels read them (the
step size is computed in Python floats there too); a device-resident R or T is copied to
the host first, which is a sync the planner pays, inherent to a scalar read. The updates run
in float32/float64 (float16/bfloat16 in float32) on the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cuda._util import attr_str, up
from onnxkiln.providers.cuda.dtypes import FLOATS, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor
TRAINING = "ai.onnx.preview.training"
_SUPPORTS = needs(FLOATS, skip_inputs=(0, 1))  # R and T: host scalars of any type


def _scalar(value, name: str) -> float:
    a = np.asarray(value)
    if a.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {a.shape}")
    return a.reshape(()).item()


def _groups(tensors: tuple, n_groups: int, op: str) -> list[tuple]:
    """Split the variadic inputs into n_groups equal groups, zipped per optimized tensor."""
    if not tensors or len(tensors) % n_groups:
        raise ValueError(f"{op} expects {n_groups} tensors per optimized variable after R and "
                         f"T, got {len(tensors)}")
    n = len(tensors) // n_groups
    groups = [tensors[i * n:(i + 1) * n] for i in range(n_groups)]
    for i, per_var in enumerate(zip(*groups)):
        shapes = {tuple(t.shape) for t in per_var}
        if len(shapes) != 1:
            raise ValueError(f"{op}: tensors of variable {i} have different shapes {shapes}")
    return list(zip(*groups))


def _register(op: str):
    return kernel(op, since=1, domain=TRAINING, factory=True, multi_output=True,
                  host_inputs=(0, 1), supports=_SUPPORTS,
                  capture=CaptureSupport.READS_HOST_SCALAR)


@_register("Adagrad")
def adagrad(info: NodeInfo) -> Callable[..., tuple]:
    """One ADAGRAD step for each (X, G, H); returns X_new..., H_new...."""
    norm = float(info.attrs["norm_coefficient"])
    epsilon = float(info.attrs["epsilon"])
    decay = float(info.attrs["decay_factor"])

    def run(r, t, *tensors):
        rate = _scalar(r, "R") / (1 + _scalar(t, "T") * decay)
        xs, hs = [], []
        for x, g, h in _groups(tensors, 3, "Adagrad"):
            xf, gf, hf = up(x), up(g).to(up(x).dtype), up(h).to(up(x).dtype)
            g_reg = xf * norm + gf
            h_new = hf + g_reg * g_reg
            xs.append((xf - rate * g_reg / (torch.sqrt(h_new) + epsilon)).to(x.dtype))
            hs.append(h_new.to(h.dtype))
        return (*xs, *hs)

    return run


@_register("Adam")
def adam(info: NodeInfo) -> Callable[..., tuple]:
    """One Adam step for each (X, G, V, H); returns X_new..., V_new..., H_new...."""
    alpha, beta = float(info.attrs["alpha"]), float(info.attrs["beta"])
    epsilon = float(info.attrs["epsilon"])
    norm, norm_post = float(info.attrs["norm_coefficient"]), float(
        info.attrs["norm_coefficient_post"])

    def run(r, t, *tensors):
        rate, count = _scalar(r, "R"), _scalar(t, "T")
        if count > 0:
            rate = rate * math.sqrt(1 - beta ** count) / (1 - alpha ** count)
        xs, vs, hs = [], [], []
        for x, g, v, h in _groups(tensors, 4, "Adam"):
            c = up(x).dtype
            xf, gf, vf, hf = (up(a).to(c) for a in (x, g, v, h))
            g_reg = xf * norm + gf
            v_new = vf * alpha + g_reg * (1 - alpha)
            h_new = hf * beta + g_reg * g_reg * (1 - beta)
            x_new = xf - rate * v_new / (torch.sqrt(h_new) + epsilon)
            if norm_post:
                x_new = x_new * (1 - norm_post)
            xs.append(x_new.to(x.dtype))
            vs.append(v_new.to(v.dtype))
            hs.append(h_new.to(h.dtype))
        return (*xs, *vs, *hs)

    return run


@_register("Momentum")
def momentum(info: NodeInfo) -> Callable[..., tuple]:
    """One SGD-with-momentum step (standard or nesterov) for each (X, G, V)."""
    alpha, beta = float(info.attrs["alpha"]), float(info.attrs["beta"])
    norm = float(info.attrs["norm_coefficient"])
    mode = attr_str(info.attrs["mode"])
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"mode must be 'standard' or 'nesterov', got {mode!r}")
    nesterov = mode == "nesterov"

    def run(r, t, *tensors):
        rate = _scalar(r, "R")
        beta_adj = beta if _scalar(t, "T") > 0 else 1.0
        xs, vs = [], []
        for x, g, v in _groups(tensors, 3, "Momentum"):
            c = up(x).dtype
            xf, gf, vf = (up(a).to(c) for a in (x, g, v))
            g_reg = xf * norm + gf
            v_new = vf * alpha + g_reg * beta_adj
            direction = g_reg + v_new * alpha if nesterov else v_new
            xs.append((xf - rate * direction).to(x.dtype))
            vs.append(v_new.to(v.dtype))
        return (*xs, *vs)

    return run
