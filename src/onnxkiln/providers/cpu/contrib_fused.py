"""CPU kernels: onnxruntime's com.microsoft fused float ops.

FusedMatMul (MatMul with transposes and a scale), FusedConv (Conv + optional sum input Z +
activation) and FusedGemm (Gemm + activation). The Conv and Gemm work runs through the ONNX
kernels in conv.py and linalg.py; the activation is applied in place on their fresh result.

onnx knows none of these schemas, so no attribute defaults are filled in at plan time: every
kernel reads `info.attrs.get(name, default)` with onnxruntime's documented defaults.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import ml_dtypes
import numpy as np

from onnxkiln.ops.attrs import attr_str
from onnxkiln.ops.special import expit
from onnxkiln.providers.base import NodeInfo, report_variant, reported_variant
from onnxkiln.providers.cpu._conv_special import epilogue_for
from onnxkiln.providers.cpu._gemm import constant_product
from onnxkiln.providers.cpu._tensor_util import const_input
from onnxkiln.providers.cpu.conv import conv as _onnx_conv
from onnxkiln.providers.cpu.linalg import gemm as _onnx_gemm
from onnxkiln.providers.cpu.registry import kernel

__all__ = ["OURS_CONV_ACTIVATIONS", "activation_fn", "fused_conv_kernel"]

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_LOW = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})

Activation = Callable[[np.ndarray], np.ndarray]


# ---------------------------------------------------------------------------------------------
# activations, in place on a fresh float32/float64 array


def _relu(y):
    return np.maximum(y, 0, out=y)


def _tanh(y):
    return np.tanh(y, out=y)


def _sigmoid(y):
    return expit(y, out=y)


def _hard_swish(y):
    g = y * y.dtype.type(1.0 / 6.0)
    g += y.dtype.type(0.5)
    np.clip(g, 0, 1, out=g)
    return np.multiply(y, g, out=y)


def _silu(y):
    return np.multiply(y, expit(y), out=y)


def _softsign(y):
    d = np.abs(y)
    d += 1
    return np.divide(y, d, out=y)


def _softplus(y):
    return np.logaddexp(0, y, out=y)


def _leaky_relu(alpha: float) -> Activation:
    def f(y):
        return np.multiply(y, y.dtype.type(alpha), out=y, where=y < 0)
    return f


def _clip(lo: float, hi: float) -> Activation:
    def f(y):
        return np.clip(y, lo, hi, out=y)
    return f


def _hard_sigmoid(alpha: float, beta: float) -> Activation:
    def f(y):
        y *= y.dtype.type(alpha)
        y += y.dtype.type(beta)
        return np.clip(y, 0, 1, out=y)
    return f


def _elu(alpha: float) -> Activation:
    def f(y):
        neg = np.minimum(y, 0)
        np.expm1(neg, out=neg)
        neg *= y.dtype.type(alpha)
        np.copyto(y, neg, where=y < 0)
        return y
    return f


def _selu(alpha: float, gamma: float) -> Activation:
    elu = _elu(alpha)

    def f(y):
        elu(y)
        y *= y.dtype.type(gamma)
        return y
    return f


def _scaled_tanh(alpha: float, beta: float) -> Activation:
    def f(y):
        y *= y.dtype.type(beta)
        np.tanh(y, out=y)
        y *= y.dtype.type(alpha)
        return y
    return f


def _thresholded_relu(alpha: float) -> Activation:
    def f(y):
        np.copyto(y, y.dtype.type(0), where=y <= alpha)
        return y
    return f


def _parametric_softplus(alpha: float, beta: float) -> Activation:
    def f(y):
        y *= y.dtype.type(beta)
        np.logaddexp(0, y, out=y)
        y *= y.dtype.type(alpha)
        return y
    return f


# name -> (parameter names it needs, builder)
_ACTIVATIONS: dict[str, tuple[tuple[str, ...], Callable[..., Activation]]] = {
    "Relu": ((), lambda: _relu),
    "Tanh": ((), lambda: _tanh),
    "Sigmoid": ((), lambda: _sigmoid),
    "Softsign": ((), lambda: _softsign),
    "Softplus": ((), lambda: _softplus),
    "LeakyRelu": (("alpha",), _leaky_relu),
    "Elu": (("alpha",), _elu),
    "ThresholdedRelu": (("alpha",), _thresholded_relu),
    "Clip": (("min", "max"), _clip),
    "HardSigmoid": (("alpha", "beta"), _hard_sigmoid),
    "ScaledTanh": (("alpha", "beta"), _scaled_tanh),
    "ParametricSoftplus": (("alpha", "beta"), _parametric_softplus),
    "Selu": (("alpha", "gamma"), _selu),
    "HardSwish": ((), lambda: _hard_swish),
    "Silu": ((), lambda: _silu),
}
# FusedConv passes its parameters as a list in this order
_CONV_ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid")
OURS_CONV_ACTIVATIONS = (*_CONV_ACTIVATIONS, "HardSwish", "Silu")  # onnxkiln's FusedConv


def activation_fn(op: str, name: str | None, params: Mapping[str, float],
                  allowed: tuple[str, ...] | None = None) -> Activation | None:
    """The in-place activation `name` with its parameters; None for no activation."""
    if not name:
        return None
    entry = _ACTIVATIONS.get(name)
    if entry is None or (allowed is not None and name not in allowed):
        names = sorted(allowed if allowed is not None else _ACTIVATIONS)
        raise ValueError(f"{op}: unsupported activation {name!r}; expected one of {names}")
    needs, build = entry
    missing = [p for p in needs if params.get(p) is None]
    if missing:
        raise ValueError(f"{op}: activation {name} needs parameter(s) {missing}")
    return build(*(float(params[p]) for p in needs))


def _activate(y: np.ndarray, act: Activation | None) -> np.ndarray:
    """act(y) for the kernel's own fresh y; float16/bfloat16 in float32, ints in float64."""
    if act is None:
        return y
    dt = y.dtype
    if dt in _LOW:
        return act(y.astype(_F32)).astype(dt)
    if dt.kind != "f":
        return act(y.astype(np.float64)).astype(dt)
    return act(y)


# ---------------------------------------------------------------------------------------------
# FusedMatMul


def _orient(x: np.ndarray, trans: bool, trans_batch: bool, op: str, name: str) -> np.ndarray:
    """x with its first dim moved behind the batch dims (transBatch) and/or last two swapped."""
    if trans_batch:
        if x.ndim < 3:
            raise ValueError(f"{op}: transBatch{name} needs {name} of rank >= 3, got {x.shape}")
        x = np.moveaxis(x, 0, -2)
    if trans and x.ndim >= 2:
        x = np.swapaxes(x, -1, -2)
    return x


@kernel("FusedMatMul", since=1, domain=MS, factory=True, variant="fusedmatmul.blas")
def fused_matmul(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = alpha * matmul(A', B'): ' transposes the last two dims (transA/transB) and/or moves
    dim 0 behind the batch dims (transBatchA/transBatchB); float16/bfloat16 in float32."""
    op = "FusedMatMul"
    attrs = info.attrs
    alpha = float(attrs.get("alpha", 1.0))
    ta, tb = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    tba, tbb = bool(attrs.get("transBatchA", 0)), bool(attrs.get("transBatchB", 0))
    b_const = const_input(info, 1)
    b_ready: np.ndarray | None = None
    if b_const is not None and b_const.dtype.kind in "fV" and (not tbb or b_const.ndim >= 3):
        bb = _orient(b_const, tb, tbb, op, "B")
        b_ready = bb.astype(_F32) if bb.dtype in _LOW else bb

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        dt = a.dtype
        if b.dtype != dt:
            raise TypeError(f"{op}: A is {dt} but B is {b.dtype}")
        aa = _orient(a, ta, tba, op, "A")
        bb = b_ready if b_ready is not None else _orient(b, tb, tbb, op, "B")
        if dt in _LOW:
            aa = aa.astype(_F32)
            bb = bb.astype(_F32, copy=False)
        try:
            y = np.matmul(aa, bb)
        except ValueError as e:
            raise ValueError(
                f"{op}: A' {aa.shape} (from {a.shape}, transA={int(ta)}, transBatchA={int(tba)}) "
                f"and B' {bb.shape} (from {b.shape}, transB={int(tb)}, transBatchB={int(tbb)}) "
                f"cannot be multiplied"
            ) from e
        if alpha != 1.0:
            y = np.multiply(y, y.dtype.type(alpha), out=y if isinstance(y, np.ndarray) else None)
        return y.astype(dt) if dt in _LOW else y

    def specialize(dtypes, shapes, consts):
        """A' (..., K) against a constant 2-D B': A's batch dims folded into rows, the
        product through the few-row kernels or a (split) GEMM."""
        sa = shapes[0]
        if (b_ready is None or b_ready.ndim != 2 or sa is None or len(sa) < 2 or ta or tba
                or dtypes[0] not in (_F32, np.dtype(np.float64)) or b_ready.dtype != dtypes[0]
                or sa[-1] != b_ready.shape[0]):
            return None
        m, k, n = math.prod(sa[:-1]), sa[-1], b_ready.shape[1]
        out_shape = (*sa[:-1], n)
        product, kind = constant_product(m, k, b_ready)
        scale = b_ready.dtype.type(alpha)

        def special(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            y = product(a.reshape(m, k))
            if alpha != 1.0:
                y *= scale
            return y.reshape(out_shape)

        special.variant = f"fusedmatmul.{kind}"
        return special

    run.specialize = specialize
    return run


# ---------------------------------------------------------------------------------------------
# FusedConv and FusedGemm


@kernel("FusedConv", since=1, domain=MS, factory=True, variant="fusedconv.im2col")
def fused_conv(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = activation(Conv(X, W, B) + Z): activation Relu, Tanh, Sigmoid, LeakyRelu [alpha],
    Clip [min, max] or HardSigmoid [alpha, beta], parameters in `activation_params`."""
    return fused_conv_kernel(info, _CONV_ACTIVATIONS)


def fused_conv_kernel(info: NodeInfo, allowed: tuple[str, ...]) -> Callable[..., np.ndarray]:
    """FusedConv's kernel with the activations `allowed` (com.microsoft's, or onnxkiln's
    with HardSwish and Silu too)."""
    op = "FusedConv"
    name = attr_str(info.attrs.get("activation")) or ""
    plist = list(info.attrs.get("activation_params") or [])
    needs = _ACTIVATIONS[name][0] if name in _ACTIVATIONS else ()
    act = activation_fn(op, name, dict(zip(needs, plist)), allowed)
    conv_info = dataclasses.replace(
        info, op_type="Conv", domain="", opset=11, n_inputs=min(info.n_inputs, 3),
        input_present=tuple(info.input_present[:3]), const_inputs=tuple(info.const_inputs[:3]),
        attrs={k: v for k, v in info.attrs.items()
               if k not in ("activation", "activation_params")},
    )
    conv = _onnx_conv(conv_info)

    def run(x: np.ndarray, w: np.ndarray, b=None, z=None) -> np.ndarray:
        y = conv(x, w, b)
        made = reported_variant()  # the Conv path this shape took, for traces
        inner, why = made if made is not None else (getattr(conv, "variant", None),
                                                    getattr(conv, "variant_reason", None))
        if inner:
            report_variant("fusedconv." + inner.split(".", 1)[-1], why)
        if z is not None:
            if z.shape != y.shape:
                raise ValueError(f"{op}: Z must have the output's shape {y.shape}, got {z.shape}")
            y += z
        return _activate(y, act)

    has_z = info.n_inputs > 3 and info.input_present[3]
    epilogue = None if has_z else epilogue_for(name, tuple(plist))

    def specialize(dtypes, shapes, consts):
        """Conv's specialisation, with the activation as its epilogue where Conv's path can
        apply it (no Z), else the activation (and Z) applied to its fresh output."""
        inner = conv.specialize(dtypes[:3], shapes[:3], consts[:3], epilogue=epilogue)
        if inner is None:
            return None
        post = None if epilogue is not None and inner.epilogue == epilogue else act

        def special(x, w, b=None, z=None):
            y = inner(x, w, b)
            if z is not None:
                if z.shape != y.shape:
                    raise ValueError(f"{op}: Z must have the output's shape {y.shape}, got "
                                     f"{z.shape}")
                y += z
            return _activate(y, post)

        special.variant = "fusedconv." + (getattr(inner, "variant", "") or ".").split(".", 1)[-1]
        special.fused_activation = post is None and act is not None  # applied by the conv
        special.variant_reason = getattr(inner, "variant_reason", None)
        return special

    run.specialize = specialize
    return run


@kernel("FusedGemm", since=1, domain=MS, factory=True, variant="fusedgemm.blas")
def fused_gemm(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = activation(alpha * A' @ B' + beta * C), the activation's parameters in
    activation_alpha / activation_beta / activation_gamma (Relu, LeakyRelu, Tanh, Sigmoid,
    Elu, HardSigmoid, ScaledTanh, ThresholdedRelu, Softsign, Softplus, ParametricSoftplus,
    Selu)."""
    op = "FusedGemm"
    attrs = info.attrs
    act = activation_fn(op, attr_str(attrs.get("activation")) or "", {
        "alpha": attrs.get("activation_alpha"),
        "beta": attrs.get("activation_beta"),
        "gamma": attrs.get("activation_gamma"),
    })
    gemm_info = dataclasses.replace(
        info, op_type="Gemm", domain="", opset=13,
        attrs={k: attrs[k] for k in ("alpha", "beta", "transA", "transB") if k in attrs},
    )
    gemm = _onnx_gemm(gemm_info)

    def run(a: np.ndarray, b: np.ndarray, c=None) -> np.ndarray:
        return _activate(gemm(a, b, c), act)

    def specialize(dtypes, shapes, consts):
        inner = gemm.specialize(dtypes, shapes, consts)
        if inner is None:
            return None

        def special(a, b, c=None):
            return _activate(inner(a, b, c), act)

        special.variant = "fusedgemm." + inner.variant.split(".", 1)[-1]
        return special

    run.specialize = specialize
    return run
