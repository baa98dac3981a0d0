"""CPU kernel: onnxruntime's com.microsoft DynamicQuantizeLSTM (what quantize_dynamic writes).

An LSTM whose W [D, I, 4H] and R [D, H, 4H] (transposed against the onnx LSTM's) are int8 or
uint8 with a scale and zero point per direction or per direction and gate column, computed
as onnxruntime's CPU kernel computes it: X (its first max(sequence_lens) steps) and, at each
step, the previous hidden state of the whole batch are quantized to uint8 over their range
(DynamicQuantizeLinear's), multiplied with the integer weights exactly, and the products
scaled by the two scales; the gates then add the peepholes and the bias in onnxruntime's
order. A hidden state read after its sequence ended is the last one, or 0 when Y is an
output (onnxruntime reads it back from Y).

Deviations: distinct zero points per gate column are honoured (onnxruntime takes the first
one only), and the batch is quantized as one block, which is onnxruntime's single-threaded
result: with more intra-op threads its kernel quantizes each thread's rows on their own
when the batch has over 4 rows or 2 to 4 rows of at most 256 hidden units.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu import rnn
from onnxkiln.providers.cpu.quant import dynamic_quantize_linear
from onnxkiln.providers.cpu.registry import kernel

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_QUANT = (np.dtype(np.int8), np.dtype(np.uint8))
_W, _R, _W_SCALE = 1, 2, 8


class _Weights:
    """One direction's integer weights minus their zero points [K, 4H] and scales [4H]."""

    def __init__(self, q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> None:
        # integers held in float64: BLAS sums their products exactly (below 2**53)
        self.q = q.astype(np.float64) - zero.astype(np.float64).reshape(1, -1)
        self.scale = np.broadcast_to(scale.astype(_F32, copy=False).reshape(-1),
                                     (q.shape[1],))

    def product(self, a: np.ndarray) -> np.ndarray:
        """a (M, K) float32 @ the weights: a quantized to uint8 over its range, the integer
        product exact, scaled by a's scale times the weights' (float32)."""
        qa, a_scale, a_zero = dynamic_quantize_linear(np.ascontiguousarray(a, _F32))
        acc = (qa.astype(np.float64) - float(a_zero)) @ self.q
        return acc.astype(_F32) * (a_scale * self.scale)


def _weights(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray,
             name: str) -> list[_Weights]:
    """Per direction, the checked weights of W or R ([D, K, 4H])."""
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
    return [_Weights(q[i], scale[i], zero_point[i]) for i in range(d)]


def _gates(setup, xw: np.ndarray, r: _Weights, p, bias, h, c, acts, clip, want_y: bool,
           input_forget: bool):
    """The time loop of one direction over xw (T, B, 4H): (Y or None, (h, c))."""
    f, g, hf = acts
    n, steps = setup.hidden, xw.shape[0]
    ys = np.zeros((setup.seq, setup.batch, n), _F32) if want_y else None
    mask = setup.mask if setup.lens is not None else None
    read = h  # the hidden state onnxruntime's recurrent product reads
    for t in range(steps):
        gates = xw[t] + r.product(read)
        i, o, fg, cg = (gates[:, k * n:(k + 1) * n] for k in range(4))
        if p is not None:
            i += c * p[:n]
        i = f(clip(i if bias is None else i + bias[:n]))
        if input_forget:
            fg = 1 - i
        else:
            if p is not None:
                fg += c * p[2 * n:]
            fg = f(clip(fg if bias is None else fg + bias[2 * n:3 * n]))
        cg = g(clip(cg if bias is None else cg + bias[3 * n:]))
        c_new = c * fg + i * cg
        if p is not None:
            o += c_new * p[n:2 * n]
        o = f(clip(o if bias is None else o + bias[n:2 * n]))
        h_new = hf(c_new.copy()) * o
        if mask is not None:
            h_new = np.where(mask[t], h_new, h)
            c_new = np.where(mask[t], c_new, c)
        h, c = h_new, c_new
        read = h if mask is None or not want_y else h * mask[t]
        if want_y:
            ys[t] = read
    return ys, (h, c)


@kernel("DynamicQuantizeLSTM", since=1, domain=MS, factory=True, multi_output=True)
def dynamic_quantize_lstm(info: NodeInfo) -> Callable[..., tuple]:
    """LSTM with quantized W and R (W_scale, W_zero_point, R_scale, R_zero_point last)."""
    if "layout" in info.attrs and int(info.attrs["layout"] or 0):
        raise ValueError("DynamicQuantizeLSTM has no layout attribute (batch first)")
    reverse, _, hidden_size, clip, acts, want_y, _ = rnn.parse_attributes(
        info, 3, ["Sigmoid", "Tanh", "Tanh"])
    input_forget = bool(int(info.attrs.get("input_forget") or 0))
    consts = tuple(info.const_inputs) + (None,) * (info.n_inputs - len(info.const_inputs))
    fixed = {}
    for i, name in ((_W, "W"), (_R, "R")):
        parts = [consts[i], *consts[_W_SCALE + 2 * (i - 1):_W_SCALE + 2 * i]]
        if all(v is not None for v in parts):
            fixed[i] = _weights(*parts, name)

    def run(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None,
            w_scale=None, w_zero_point=None, r_scale=None, r_zero_point=None):
        if any(v is None for v in (w_scale, w_zero_point, r_scale, r_zero_point)):
            raise ValueError("DynamicQuantizeLSTM: W_scale, W_zero_point, R_scale and "
                             "R_zero_point are required")
        if x.dtype != _F32:
            raise TypeError(f"DynamicQuantizeLSTM: X must be float32, got {x.dtype}")
        ws = fixed.get(_W) or _weights(w, w_scale, w_zero_point, "W")
        rs = fixed.get(_R) or _weights(r, r_scale, r_zero_point, "R")
        n = rs[0].q.shape[0]
        shaped_r = np.empty((len(reverse), 4 * n, n), _F32)  # for the setup's shape checks
        s = rnn.RnnSetup(x, shaped_r, sequence_lens, [initial_h, initial_c], 0, 4, hidden_size,
                       len(reverse))
        if len(ws) != len(reverse) or ws[0].q.shape != (x.shape[2], 4 * n):
            raise ValueError(f"DynamicQuantizeLSTM: W must be [{len(reverse)}, {x.shape[2]}, "
                             f"{4 * n}], got {list(np.shape(w))}")
        if p is not None and p.shape != (len(reverse), 3 * n):
            raise ValueError(f"P must have shape {(len(reverse), 3 * n)}, got {p.shape}")
        steps = s.seq if s.lens is None else int(s.lens.max(initial=0))
        rows = s.x[:steps].reshape(-1, s.x.shape[2])
        ys, hs, cs = [], [], []
        for d, rev in enumerate(reverse):
            xw = np.zeros((s.seq, s.batch, 4 * n), _F32)
            xw[:steps] = ws[d].product(rows).reshape(steps, s.batch, -1)
            if rev:
                xw = s._reverse(xw)
            wb, rb = rnn.split_bias(b, d, 4, n, _F32)
            h0 = rnn.zero_state(s) if s.initial[0] is None else s.initial[0][d]
            c0 = rnn.zero_state(s) if s.initial[1] is None else s.initial[1][d]
            pd = None if p is None else p[d].astype(_F32, copy=False)
            y, (h, c) = _gates(s, xw[:steps], rs[d], pd, None if wb is None else wb + rb,
                               h0, c0, acts[d], clip, want_y, input_forget)
            ys.append(y)
            hs.append(h)
            cs.append(c)
        return s.finish(ys if want_y else None, [hs, cs], reverse)

    run.variant = "dynamicquantizelstm.numpy"
    return run
