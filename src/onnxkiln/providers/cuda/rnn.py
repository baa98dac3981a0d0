"""Torch kernels: RNN, GRU and LSTM (every opset).

The input projection runs as one matmul per direction, then a Python loop over time steps
(one small GEMM each). sequence_lens stays on the device: per-batch masks freeze the state
after a sequence's end, the reverse direction reverses each sequence within its own length
with a gather, and empty sequences end at a zero state (as onnxruntime).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cuda._util import attr_str, wants
from onnxkiln.providers.cuda.dtypes import FLOATS, needs
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor
Act = Callable[[Tensor], Tensor]

# name -> (builder(alpha, beta), default alpha, default beta)
_ACTS: dict[str, tuple[Callable[..., Act], float | None, float | None]] = {
    "relu": (lambda a, b: torch.relu, None, None),
    "tanh": (lambda a, b: torch.tanh, None, None),
    "sigmoid": (lambda a, b: torch.sigmoid, None, None),
    "affine": (lambda a, b: lambda x: x * a + b, 1.0, 0.0),
    "leakyrelu": (lambda a, b: lambda x: torch.where(x >= 0, x, x * a), 0.01, None),
    "thresholdedrelu": (lambda a, b: lambda x: torch.where(x > a, x, 0.0), 1.0, None),
    "scaledtanh": (lambda a, b: lambda x: torch.tanh(x * b) * a, 1.0, 1.0),
    "hardsigmoid": (lambda a, b: lambda x: torch.clamp(x * a + b, 0, 1), 0.2, 0.5),
    "elu": (lambda a, b: lambda x: torch.where(x >= 0, x, torch.expm1(x) * a), 1.0, None),
    "softsign": (lambda a, b: lambda x: x / (torch.abs(x) + 1), None, None),
    "softplus": (lambda a, b: lambda x: torch.logaddexp(x, torch.zeros_like(x)), None, None),
}


def _directions(direction) -> tuple[bool, ...]:
    d = attr_str(direction) or "forward"
    table = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}
    if d not in table:
        raise ValueError(f"LSTM: direction must be forward, reverse or bidirectional, got {d!r}")
    return table[d]


def _activations(attrs, n_dirs: int, defaults: list[str]) -> list[list[Act]]:
    k = len(defaults)
    names = list(attrs.get("activations") or []) or list(defaults)
    if len(names) == k and n_dirs == 2:
        names = names * 2
    if len(names) < k * n_dirs:
        raise ValueError(f"expected {k * n_dirs} activations, got {names}")
    alphas = list(attrs.get("activation_alpha") or [])
    betas = list(attrs.get("activation_beta") or [])
    funcs = []
    for name in names[: 3 * n_dirs]:
        key = attr_str(name).lower()
        if key not in _ACTS:
            raise ValueError(f"unsupported activation {name!r}")
        build, alpha, beta = _ACTS[key]
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        funcs.append(build(None if alpha is None else float(alpha),
                           None if beta is None else float(beta)))
    return [funcs[d * k:(d + 1) * k] for d in range(n_dirs)]


def _rnn_supports(info: NodeInfo) -> str | None:
    why = needs(FLOATS, skip_inputs=(4,))(info)
    if why:
        return why
    dts = info.input_dtypes
    if len(dts) > 4 and dts[4] not in (None, DataType.INT32, DataType.INT64):
        return f"{info.op_type}: sequence_lens of type {dts[4]} is not served"
    return None


class _Seq:
    """Run-time facts shared by the cells: layout, lengths masks, reversal, final states."""

    def __init__(self, x: Tensor, sequence_lens, layout: int, hidden: int) -> None:
        self.out_dt = x.dtype
        self.ct = torch.float64 if x.dtype == torch.float64 else torch.float32
        self.layout = layout
        self.xs = (x.transpose(0, 1) if layout else x).to(self.ct)  # (T, B, I)
        self.t_len, self.batch = self.xs.shape[:2]
        self.hidden = hidden
        self.dev = x.device
        self.mask = self.rev_idx = self.lens = None
        if sequence_lens is not None:
            self.lens = sequence_lens.to(torch.int64).reshape(-1)
            steps = torch.arange(self.t_len, device=self.dev).unsqueeze(1)  # (T, 1)
            valid = steps < self.lens.unsqueeze(0)  # (T, B)
            self.mask = valid.unsqueeze(2)
            self.rev_idx = torch.where(valid, self.lens.unsqueeze(0) - 1 - steps, steps)

    def reverse(self, a: Tensor) -> Tensor:
        """(T, B, K) reversed within each sequence's length (an involution)."""
        if self.rev_idx is None:
            return torch.flip(a, (0,))
        return torch.gather(a, 0, self.rev_idx.unsqueeze(2).expand(-1, -1, a.shape[2]))

    def state(self, v: Tensor | None, d: int) -> Tensor:
        if v is None:
            return torch.zeros((self.batch, self.hidden), dtype=self.ct, device=self.dev)
        v = v.transpose(0, 1) if self.layout else v
        return v[d].to(self.ct)

    def keep(self, t: int, new: Tensor, old: Tensor) -> Tensor:
        return new if self.mask is None else torch.where(self.mask[t], new, old)

    def outputs(self, ys: list[Tensor] | None, finals: list[list[Tensor]], reverse) -> tuple:
        out_y = None
        if ys is not None:
            parts = []
            for yd, rev in zip(ys, reverse):
                if self.mask is not None:
                    yd = yd * self.mask
                parts.append(self.reverse(yd) if rev else yd)
            out_y = torch.stack(parts, dim=1)  # (T, D, B, H)
            if self.layout:
                out_y = out_y.permute(2, 0, 1, 3)
            out_y = out_y.contiguous().to(self.out_dt)
        result = [out_y]
        for per_dir in finals:
            s = torch.stack(per_dir)
            if self.lens is not None:  # empty sequences end at zero, as onnxruntime
                s = torch.where((self.lens == 0).reshape(1, -1, 1), 0.0, s)
            if self.layout:
                s = s.transpose(0, 1)
            result.append(s.contiguous().to(self.out_dt))
        return tuple(result)


def _common(info: NodeInfo, defaults: list[str]):
    attrs = info.attrs
    reverse = _directions(attrs.get("direction"))
    clip = attrs.get("clip")
    clip = None if clip is None else float(clip)
    acts = _activations(attrs, len(reverse), defaults)
    return reverse, int(attrs.get("layout") or 0), clip, acts, wants(info, 0)


def _clip(v: Tensor, clip: float | None) -> Tensor:
    return v if clip is None else torch.clamp(v, -clip, clip)


def _project(seq: _Seq, w: Tensor, bias: Tensor | None, rev: bool) -> Tensor:
    xw = torch.matmul(seq.xs, w.to(seq.ct).t())
    if bias is not None:
        xw = xw + bias
    return seq.reverse(xw) if rev else xw


@kernel("RNN", since=1, factory=True, multi_output=True, supports=_rnn_supports,
        variant="rnn.torch")
def rnn(info: NodeInfo) -> Callable[..., tuple]:
    """Simple RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)."""
    reverse, layout, clip, acts, want_y = _common(info, ["Tanh"])

    def run(x, w, r, b=None, sequence_lens=None, initial_h=None) -> tuple:
        n = r.shape[-1]
        seq = _Seq(x, sequence_lens, layout, n)
        ys, hs = [], []
        for d, rev in enumerate(reverse):
            f = acts[d][0]
            bias = None if b is None else b[d].to(seq.ct)[:n] + b[d].to(seq.ct)[n:]
            xw = _project(seq, w[d], bias, rev)
            rt = r[d].to(seq.ct).t()
            h = seq.state(initial_h, d)
            y = []
            for t in range(seq.t_len):
                h = seq.keep(t, f(_clip(torch.addmm(xw[t], h, rt), clip)), h)
                y.append(h)
            if want_y:
                ys.append(torch.stack(y))
            hs.append(h)
        return seq.outputs(ys if want_y else None, [hs], reverse)

    return run


@kernel("GRU", since=1, factory=True, multi_output=True, supports=_rnn_supports,
        variant="gru.torch")
def gru(info: NodeInfo) -> Callable[..., tuple]:
    """GRU (gate order z, r, h), linear_before_reset 0 or 1."""
    reverse, layout, clip, acts, want_y = _common(info, ["Sigmoid", "Tanh"])
    lbr = bool(info.attrs.get("linear_before_reset") or 0)

    def run(x, w, r, b=None, sequence_lens=None, initial_h=None) -> tuple:
        n = r.shape[-1]
        seq = _Seq(x, sequence_lens, layout, n)
        ys, hs = [], []
        for d, rev in enumerate(reverse):
            f, g = acts[d]
            bias = rbh = None
            if b is not None:
                wb, rb = b[d].to(seq.ct)[:3 * n], b[d].to(seq.ct)[3 * n:]
                if lbr:
                    bias = torch.cat((wb[:2 * n] + rb[:2 * n], wb[2 * n:]))
                    rbh = rb[2 * n:]
                else:
                    bias = wb + rb
            xw = _project(seq, w[d], bias, rev)
            rd = r[d].to(seq.ct)
            r_all_t, r_zr_t, r_h_t = rd.t(), rd[:2 * n].t(), rd[2 * n:].t()
            h = seq.state(initial_h, d)
            y = []
            for t in range(seq.t_len):
                x_t = xw[t]
                if lbr:
                    hr = torch.matmul(h, r_all_t)
                    zr = hr[:, :2 * n] + x_t[:, :2 * n]
                    hh = hr[:, 2 * n:] if rbh is None else hr[:, 2 * n:] + rbh
                else:
                    zr = torch.addmm(x_t[:, :2 * n], h, r_zr_t)
                zr = f(_clip(zr, clip))
                z, rg = zr[:, :n], zr[:, n:]
                hh = hh * rg if lbr else torch.matmul(rg * h, r_h_t)
                hh = g(_clip(hh + x_t[:, 2 * n:], clip))
                h = seq.keep(t, hh + z * (h - hh), h)
                y.append(h)
            if want_y:
                ys.append(torch.stack(y))
            hs.append(h)
        return seq.outputs(ys if want_y else None, [hs], reverse)

    return run


@kernel("LSTM", since=1, factory=True, multi_output=True, supports=_rnn_supports,
        variant="lstm.torch")
def lstm(info: NodeInfo) -> Callable[..., tuple]:
    """LSTM (gate order i, o, f, c) with peepholes, clip, input_forget, both layouts."""
    reverse, layout, clip, acts, want_y = _common(info, ["Sigmoid", "Tanh", "Tanh"])
    input_forget = bool(info.attrs.get("input_forget") or 0)

    def run(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
        n = r.shape[-1]
        seq = _Seq(x, sequence_lens, layout, n)
        ys, hs, cs = [], [], []
        for d, rev in enumerate(reverse):
            f, g, hf = acts[d]
            bias = None if b is None else b[d].to(seq.ct)[:4 * n] + b[d].to(seq.ct)[4 * n:]
            xw = _project(seq, w[d], bias, rev)
            rt = r[d].to(seq.ct).t()
            pd = None if p is None else p[d].to(seq.ct)
            h, c = seq.state(initial_h, d), seq.state(initial_c, d)
            y = []
            for t in range(seq.t_len):
                i, o, fg, cg = torch.addmm(xw[t], h, rt).split(n, dim=1)
                if pd is not None:
                    i = i + pd[:n] * c
                    if not input_forget:
                        fg = fg + pd[2 * n:] * c
                i = f(_clip(i, clip))
                fg = 1 - i if input_forget else f(_clip(fg, clip))
                c_new = fg * c + i * g(_clip(cg, clip))
                if pd is not None:
                    o = o + pd[n:2 * n] * c_new
                h_new = hf(c_new) * f(_clip(o, clip))
                h, c = seq.keep(t, h_new, h), seq.keep(t, c_new, c)
                y.append(h)
            if want_y:
                ys.append(torch.stack(y))
            hs.append(h)
            cs.append(c)
        return seq.outputs(ys if want_y else None, [hs, cs], reverse)

    return run
