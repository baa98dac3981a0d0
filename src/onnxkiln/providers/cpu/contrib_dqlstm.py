"""CPU kernel: onnxruntime's com.microsoft DynamicQuantizeLSTM (what quantize_dynamic writes).

An LSTM whose W [D, I, 4H] and R [D, H, 4H] (transposed against the onnx LSTM's) are int8 or
uint8 with a scale and zero point per direction or per direction and gate column. The weights
are dequantized (once, when they are constants) and run through rnn.py's LSTM in float32
with X rounded to uint8 steps as onnxruntime quantizes it (DynamicQuantizeLinear's range).
onnxruntime also quantizes each step's hidden state, which onnxkiln does not: results differ
from it by that rounding (about 1e-2 on unit-scale data, a few 1e-2 on wide layers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.quant import dynamic_quantize_linear
from onnxkiln.providers.cpu.registry import kernel
from onnxkiln.providers.cpu.rnn import lstm

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_QUANT = (np.dtype(np.int8), np.dtype(np.uint8))
_N_LSTM = 8  # X, W, R, B, sequence_lens, initial_h, initial_c, P
_W, _R, _W_SCALE = 1, 2, 8


def _dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, name: str):
    """[D, K, 4H] integers -> the onnx LSTM's float32 [D, 4H, K]."""
    if q.dtype not in _QUANT or q.ndim != 3:
        raise ValueError(f"DynamicQuantizeLSTM: {name} must be int8 or uint8 [D, K, 4H], "
                         f"got {q.dtype} {list(q.shape)}")
    if zero_point.dtype != q.dtype:
        raise ValueError(f"DynamicQuantizeLSTM: {name}_zero_point must be {q.dtype} like {name},"
                         f" got {zero_point.dtype}")
    if q.dtype == _QUANT[0] and zero_point.any():  # as onnxruntime refuses them
        raise ValueError(f"DynamicQuantizeLSTM: int8 {name} needs {name}_zero_point 0")
    d, _, gates = q.shape
    for part, v in (("scale", scale), ("zero_point", zero_point)):
        if v.shape not in ((d,), (d, gates)):
            raise ValueError(f"DynamicQuantizeLSTM: {name}_{part} must have shape [{d}] or "
                             f"[{d}, {gates}], got {list(v.shape)}")
    w = q.astype(_F32)
    w -= zero_point.astype(_F32).reshape(d, 1, -1)
    w *= scale.astype(_F32, copy=False).reshape(d, 1, -1)
    return np.ascontiguousarray(w.transpose(0, 2, 1))


def _uint8_steps(x: np.ndarray) -> np.ndarray:
    """x quantized to uint8 over its whole range and back (onnxruntime's X for X W^T)."""
    if not x.size:
        return x
    q, scale, zero = dynamic_quantize_linear(x)
    out = q.astype(_F32)
    out -= _F32.type(zero)
    out *= _F32.type(scale)
    return out


@kernel("DynamicQuantizeLSTM", since=1, domain=MS, factory=True, multi_output=True)
def dynamic_quantize_lstm(info: NodeInfo) -> Callable[..., tuple]:
    """LSTM with quantized W and R (W_scale, W_zero_point, R_scale, R_zero_point last)."""
    if "layout" in info.attrs and int(info.attrs["layout"] or 0):
        raise ValueError("DynamicQuantizeLSTM has no layout attribute (batch first)")
    consts = tuple(info.const_inputs) + (None,) * (info.n_inputs - len(info.const_inputs))
    fixed = {}
    for i, name in ((_W, "W"), (_R, "R")):
        parts = [consts[i], *consts[_W_SCALE + 2 * (i - 1):_W_SCALE + 2 * i]]
        if all(p is not None for p in parts):
            fixed[i] = _dequantize(*parts, name)
    dtypes = list(info.input_dtypes[:_N_LSTM])
    shapes = list(info.input_shapes[:_N_LSTM])
    for i in (_W, _R):  # as the onnx LSTM sees them: float like X, [D, 4H, K]
        if i < len(dtypes):
            dtypes[i] = dtypes[0]
        if i < len(shapes) and shapes[i] is not None and len(shapes[i]) == 3:
            shapes[i] = (shapes[i][0], shapes[i][2], shapes[i][1])
    inner = lstm(dataclasses.replace(
        info, op_type="LSTM", domain="", n_inputs=min(info.n_inputs, _N_LSTM),
        input_present=tuple(info.input_present[:_N_LSTM]),
        input_dtypes=tuple(dtypes), input_shapes=tuple(shapes),
        const_inputs=tuple(fixed.get(i, c) for i, c in enumerate(consts[:_N_LSTM]))))

    def run(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None,
            w_scale=None, w_zero_point=None, r_scale=None, r_zero_point=None):
        if any(v is None for v in (w_scale, w_zero_point, r_scale, r_zero_point)):
            raise ValueError("DynamicQuantizeLSTM: W_scale, W_zero_point, R_scale and "
                             "R_zero_point are required")
        if x.dtype != _F32:
            raise TypeError(f"DynamicQuantizeLSTM: X must be float32, got {x.dtype}")
        wf = fixed.get(_W)
        if wf is None:
            wf = _dequantize(w, w_scale, w_zero_point, "W")
        rf = fixed.get(_R)
        if rf is None:
            rf = _dequantize(r, r_scale, r_zero_point, "R")
        out = inner(_uint8_steps(x), wf, rf, b, sequence_lens, initial_h, initial_c, p)
        run.variant = inner.variant
        return out

    run.variant = inner.variant
    return run
