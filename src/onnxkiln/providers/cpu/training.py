"""CPU kernels: ai.onnx.preview.training (Adagrad, Adam, Momentum, Gradient).

The optimizers take R (learning rate), T (update count), then the variadic groups of
tensors the spec lists (X..., G..., and their state tensors) and return the new X...
followed by the new state tensors.

Gradient differentiates a region of the node's *enclosing* graph, which NodeInfo does not
describe; it reads the node itself from `info.node` (an `onnx_ir.Node`, whose `.graph` is
the enclosing graph) when the planner provides it. See `onnxkiln.providers.cpu._autodiff`.
"""

from __future__ import annotations

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu._autodiff import GradientProgram
from onnxkiln.providers.cpu.registry import kernel

TRAINING = "ai.onnx.preview.training"


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)


def _scalar(value, name: str) -> float:
    a = np.asarray(value)
    if a.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {a.shape}")
    return a.reshape(()).item()


def _groups(tensors: tuple, n_groups: int, op: str) -> list[tuple]:
    """Split the variadic inputs into n_groups equal groups, zipped per optimized tensor."""
    if not tensors or len(tensors) % n_groups:
        raise ValueError(
            f"{op} expects {n_groups} tensors per optimized variable after R and T, "
            f"got {len(tensors)}"
        )
    n = len(tensors) // n_groups
    groups = [tensors[i * n:(i + 1) * n] for i in range(n_groups)]
    for i, per_var in enumerate(zip(*groups)):
        shapes = {np.shape(t) for t in per_var}
        if len(shapes) != 1:
            raise ValueError(f"{op}: tensors of variable {i} have different shapes {shapes}")
    return list(zip(*groups))


def _cast_all(arrays, dtype):
    return [np.asarray(a).astype(dtype, copy=False) for a in arrays]


def _out(value, dtype) -> np.ndarray:
    """A fresh array of the input's dtype (0-d math yields numpy scalars)."""
    return np.array(value, dtype=dtype)


@kernel("Adagrad", since=1, domain=TRAINING, factory=True, multi_output=True,
        variant="adagrad.numpy")
def adagrad(info: NodeInfo):
    """One ADAGRAD step for each (X, G, H); returns X_new..., H_new...."""
    norm = float(info.attrs["norm_coefficient"])
    epsilon = float(info.attrs["epsilon"])
    decay = float(info.attrs["decay_factor"])

    def run(r, t, *tensors):
        rate = _scalar(r, "R") / (1 + _scalar(t, "T") * decay)
        xs_new, hs_new = [], []
        for x, g, h in _groups(tensors, 3, "Adagrad"):
            c = _compute_dtype(x.dtype).type
            xf, gf, hf = _cast_all((x, g, h), c)
            g_reg = xf * c(norm) + gf
            h_new = hf + g_reg * g_reg
            x_new = xf - c(rate) * g_reg / (np.sqrt(h_new) + c(epsilon))
            xs_new.append(_out(x_new, x.dtype))
            hs_new.append(_out(h_new, h.dtype))
        return (*xs_new, *hs_new)

    return run


@kernel("Adam", since=1, domain=TRAINING, factory=True, multi_output=True, variant="adam.numpy")
def adam(info: NodeInfo):
    """One Adam step for each (X, G, V, H); returns X_new..., V_new..., H_new...."""
    alpha = float(info.attrs["alpha"])
    beta = float(info.attrs["beta"])
    epsilon = float(info.attrs["epsilon"])
    norm = float(info.attrs["norm_coefficient"])
    norm_post = float(info.attrs["norm_coefficient_post"])

    def run(r, t, *tensors):
        rate = _scalar(r, "R")
        count = _scalar(t, "T")
        if count > 0:
            rate = rate * np.sqrt(1 - beta**count) / (1 - alpha**count)
        xs_new, vs_new, hs_new = [], [], []
        for x, g, v, h in _groups(tensors, 4, "Adam"):
            c = _compute_dtype(x.dtype).type
            xf, gf, vf, hf = _cast_all((x, g, v, h), c)
            g_reg = xf * c(norm) + gf
            v_new = vf * c(alpha) + g_reg * c(1 - alpha)
            h_new = hf * c(beta) + g_reg * g_reg * c(1 - beta)
            x_new = xf - c(rate) * v_new / (np.sqrt(h_new) + c(epsilon))
            if norm_post:
                x_new = x_new * c(1 - norm_post)
            xs_new.append(_out(x_new, x.dtype))
            vs_new.append(_out(v_new, v.dtype))
            hs_new.append(_out(h_new, h.dtype))
        return (*xs_new, *vs_new, *hs_new)

    return run


@kernel("Momentum", since=1, domain=TRAINING, factory=True, multi_output=True,
        variant="momentum.numpy")
def momentum(info: NodeInfo):
    """One SGD-with-momentum step (standard or nesterov) for each (X, G, V)."""
    alpha = float(info.attrs["alpha"])
    beta = float(info.attrs["beta"])
    norm = float(info.attrs["norm_coefficient"])
    mode = info.attrs["mode"]
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"mode must be 'standard' or 'nesterov', got {mode!r}")
    nesterov = mode == "nesterov"

    def run(r, t, *tensors):
        rate = _scalar(r, "R")
        beta_adj = beta if _scalar(t, "T") > 0 else 1.0
        xs_new, vs_new = [], []
        for x, g, v in _groups(tensors, 3, "Momentum"):
            c = _compute_dtype(x.dtype).type
            xf, gf, vf = _cast_all((x, g, v), c)
            g_reg = xf * c(norm) + gf
            v_new = vf * c(alpha) + g_reg * c(beta_adj)
            direction = g_reg + v_new * c(alpha) if nesterov else v_new
            xs_new.append(_out(xf - c(rate) * direction, x.dtype))
            vs_new.append(_out(v_new, v.dtype))
        return (*xs_new, *vs_new)

    return run


@kernel("Gradient", since=1, domain=TRAINING, factory=True, multi_output=True,
        variant="gradient.reverse_mode")
def gradient(info: NodeInfo):
    """d y / d x for each x in xs, by reverse-mode differentiation of the enclosing graph."""
    node = getattr(info, "node", None)
    if node is None:
        raise NotImplementedError(
            "Gradient differentiates the graph around the node, but this planner does not "
            "pass the node (NodeInfo.node) to kernel factories"
        )
    xs = [str(x) for x in info.attrs.get("xs") or []]
    zs = [str(z) for z in info.attrs.get("zs") or []]
    y = info.attrs.get("y")
    if not xs or not y:
        raise ValueError("Gradient needs the attributes xs (non-empty) and y")
    if info.n_inputs != len(xs) + len(zs):
        raise ValueError(
            f"Gradient has {info.n_inputs} inputs but xs and zs name {len(xs) + len(zs)}"
        )
    program = GradientProgram(node, xs, zs, str(y))
    return program.run
