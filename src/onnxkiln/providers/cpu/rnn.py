"""CPU kernels: recurrent layers (RNN, GRU, LSTM), every opset version.

The input projection of the whole sequence is one matmul; then the time loop runs in
numba (`rnn_fast`, variants `<op>.numba.blas` / `<op>.numba.dot`) when numba is on and
every activation is one it compiles (sigmoid, tanh, relu), else in the numpy loop here
(variant `<op>.numpy`, with the reason). In the numpy loop shorter sequences
(sequence_lens) are handled with per-batch masks: the state stops changing after a
sequence's last step and its outputs past that are zero; the reverse direction first
reverses each sequence within its own length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from onnxkiln.providers.base import NodeInfo, report_variant
from onnxkiln.providers.cpu import rnn_fast
from onnxkiln.providers.cpu.registry import kernel

Activation = Callable[[np.ndarray], np.ndarray]

# name -> (builder(alpha, beta), default alpha, default beta); None = does not use it.
# Every builder returns a function that may overwrite its argument (always a temporary).
# alpha and beta are Python floats: numpy keeps the array's dtype with them.


def _relu(a, b):
    return lambda x: np.maximum(x, 0, out=x)


def _tanh(a, b):
    return lambda x: np.tanh(x, out=x)


def _sigmoid(a, b):
    def f(x):
        # 1 / (1 + e) for x >= 0, e / (1 + e) below, e = exp(-|x|) <= 1: never overflows
        e = np.abs(x)
        np.negative(e, out=e)
        np.exp(e, out=e)
        num = np.where(x >= 0, 1, e)
        e += 1
        return np.divide(num, e, out=x)

    return f


def _affine(a, b):
    def f(x):
        x *= a
        x += b
        return x

    return f


def _leaky_relu(a, b):
    return lambda x: np.where(x >= 0, x, x * a)


def _thresholded_relu(a, b):
    return lambda x: np.where(x > a, x, 0).astype(x.dtype, copy=False)


def _scaled_tanh(a, b):
    def f(x):
        x *= b
        np.tanh(x, out=x)
        x *= a
        return x

    return f


def _hard_sigmoid(a, b):
    def f(x):
        x *= a
        x += b
        return np.clip(x, 0, 1, out=x)

    return f


def _elu(a, b):
    return lambda x: np.where(x >= 0, x, np.expm1(np.minimum(x, 0)) * a)


def _softsign(a, b):
    return lambda x: np.divide(x, np.abs(x) + 1, out=x)


def _softplus(a, b):
    return lambda x: np.logaddexp(x, 0, out=x)


_ACTIVATIONS: dict[str, tuple[Callable[[Any, Any], Activation], float | None, float | None]] = {
    "relu": (_relu, None, None),
    "tanh": (_tanh, None, None),
    "sigmoid": (_sigmoid, None, None),
    "affine": (_affine, 1.0, 0.0),
    "leakyrelu": (_leaky_relu, 0.01, None),
    "thresholdedrelu": (_thresholded_relu, 1.0, None),
    "scaledtanh": (_scaled_tanh, 1.0, 1.0),
    "hardsigmoid": (_hard_sigmoid, 0.2, 0.5),
    "elu": (_elu, 1.0, None),
    "softsign": (_softsign, None, None),
    "softplus": (_softplus, None, None),
}


def _activation_names(
    attrs, n_per_dir: int, n_dirs: int, defaults: Sequence[str]
) -> list[tuple[str, float | None, float | None]]:
    """Per slot (direction-major), (lower-case name, alpha, beta), alphas/betas in order."""
    names = list(attrs.get("activations") or [])
    if not names:
        names = list(defaults)
    if len(names) < n_per_dir * n_dirs:
        if len(names) == n_per_dir:
            names = names * n_dirs
        else:
            raise ValueError(
                f"activations: expected {n_per_dir * n_dirs} names for {n_dirs} direction(s), "
                f"got {len(names)}: {names}"
            )
    alphas = list(attrs.get("activation_alpha") or [])
    betas = list(attrs.get("activation_beta") or [])
    slots = []
    for name in names[: n_per_dir * n_dirs]:
        key = (name.decode() if isinstance(name, bytes) else str(name)).lower()
        entry = _ACTIVATIONS.get(key)
        if entry is None:
            raise ValueError(
                f"unsupported activation {name!r}; expected one of "
                f"{', '.join(sorted(_ACTIVATIONS))}"
            )
        _, alpha, beta = entry
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        slots.append((key, None if alpha is None else float(alpha),
                      None if beta is None else float(beta)))
    return slots


def _activations(slots, n_per_dir: int, n_dirs: int) -> list[list[Activation]]:
    """Per direction, the n_per_dir numpy activation functions."""
    funcs = [_ACTIVATIONS[key][0](alpha, beta) for key, alpha, beta in slots]
    return [funcs[d * n_per_dir:(d + 1) * n_per_dir] for d in range(n_dirs)]


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)


class RnnSetup:
    """Run-time facts shared by the three cells: shapes, layout, masks, reversal indices."""

    def __init__(self, x, r, sequence_lens, initial, layout: int, gates: int,
                 hidden_size: int | None, n_dirs: int):
        if x.ndim != 3:
            raise ValueError(f"X must be 3-D, got shape {x.shape}")
        self.out_dtype = x.dtype
        self.dtype = _compute_dtype(x.dtype)
        if layout:
            x = x.transpose(1, 0, 2)
        self.x = x.astype(self.dtype, copy=False)
        self.seq, self.batch, _ = x.shape
        hidden = r.shape[-1]
        if hidden_size is not None and hidden_size != hidden:
            raise ValueError(f"hidden_size is {hidden_size} but R has shape {r.shape}")
        if r.shape != (n_dirs, gates * hidden, hidden):
            raise ValueError(
                f"R must have shape {(n_dirs, gates * hidden, hidden)}, got {r.shape}"
            )
        self.hidden = hidden
        self.r_rows = gates * hidden
        self.layout = layout
        self.lens = None
        if sequence_lens is not None:
            lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
            if lens.shape != (self.batch,):
                raise ValueError(
                    f"sequence_lens must have shape ({self.batch},), got {sequence_lens.shape}"
                )
            if np.any(lens < 0) or np.any(lens > self.seq):
                raise ValueError(f"sequence_lens values must be in [0, {self.seq}], got {lens}")
            if np.any(lens != self.seq):
                self.lens = lens
        if self.lens is not None:
            steps = np.arange(self.seq)[:, None]
            self.mask = (steps < self.lens[None, :])[:, :, None]  # (T, B, 1)
            # s -> L-1-s within each sequence, identity past its end (an involution)
            self.rev = np.where(steps < self.lens, self.lens - 1 - steps, steps)
        self.initial = [self.state(v, n_dirs) for v in initial]

    def state(self, value, n_dirs: int):
        """An initial state input as (dirs, B, H) in the compute dtype, or None."""
        if value is None:
            return None
        if self.layout:
            value = value.transpose(1, 0, 2)
        shape = (n_dirs, self.batch, self.hidden)
        if value.shape != shape:
            raise ValueError(f"initial state must have shape {shape}, got {value.shape}")
        return value.astype(self.dtype, copy=False)

    def project(self, rev: bool, w, wb):
        """X @ W^T + bias for all time steps at once: (T, B, gates*H), reversed if `rev`."""
        if w.shape != (self.r_rows, self.x.shape[2]):
            raise ValueError(
                f"W must have {self.r_rows} rows and {self.x.shape[2]} columns per direction, "
                f"got {w.shape}"
            )
        xw = self.x.reshape(-1, self.x.shape[2]) @ w.T.astype(self.dtype, copy=False)
        if wb is not None:
            xw += wb
        xw = xw.reshape(self.seq, self.batch, -1)
        return self._reverse(xw) if rev else xw

    def _reverse(self, a):
        if self.lens is None:
            return a[::-1]
        return a[self.rev, np.arange(self.batch)[None, :]]

    def finish(self, ys: list[np.ndarray] | None, states: list[list[np.ndarray]], reverse):
        """Assemble Y and the final states in the node's layout and dtype."""
        out = []
        if ys is not None:
            parts = [self._reverse(y) if rev else y for y, rev in zip(ys, reverse)]
            y = np.stack(parts, axis=1)  # (T, D, B, H)
            if self.layout:
                y = y.transpose(2, 0, 1, 3)
            out.append(np.ascontiguousarray(y, dtype=self.out_dtype))
        else:
            out.append(None)
        for per_dir in states:
            s = np.stack(per_dir)  # (D, B, H)
            if self.lens is not None and not self.lens.all():
                s[:, self.lens == 0] = 0  # as onnxruntime: empty sequences end at zero
            if self.layout:
                s = s.transpose(1, 0, 2)
            out.append(np.ascontiguousarray(s, dtype=self.out_dtype))
        return tuple(out)


def _directions(direction) -> tuple[bool, ...]:
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if direction == "forward":
        return (False,)
    if direction == "reverse":
        return (True,)
    if direction == "bidirectional":
        return (False, True)
    raise ValueError(f"direction must be forward, reverse or bidirectional, got {direction!r}")


def _clipper(clip) -> Callable[[np.ndarray], np.ndarray]:
    if clip is None:
        return lambda x: x
    c = float(clip)
    return lambda x: np.clip(x, -c, c, out=x)


def split_bias(b, d, gates, hidden, dtype):
    """Direction d's (Wb, Rb) halves of B [D, 2 * gates * hidden], or (None, None)."""
    if b is None:
        return None, None
    if b.shape[-1] != 2 * gates * hidden:
        raise ValueError(f"B must have {2 * gates * hidden} columns, got shape {b.shape}")
    bd = b[d].astype(dtype, copy=False)
    return bd[: gates * hidden], bd[gates * hidden:]


def zero_state(setup: RnnSetup):
    """A zero hidden (or cell) state [batch, hidden] for the setup's dtype."""
    return np.zeros((setup.batch, setup.hidden), setup.dtype)


# ----------------------------------------------------------------------------- cells


def _run_rnn(setup, xw, rt, h, acts, clip, want_y):
    f = acts[0]
    ys = np.empty((setup.seq, setup.batch, setup.hidden), setup.dtype) if want_y else None
    mask = setup.mask if setup.lens is not None else None
    for t in range(setup.seq):
        a = h @ rt
        a += xw[t]
        h_new = f(clip(a))
        if mask is not None:
            h_new = np.where(mask[t], h_new, h)
        if want_y:
            ys[t] = h_new
        h = h_new
    if want_y and mask is not None:
        ys *= mask
    return ys, (h,)


def _run_gru(setup, xw, r, rbh, h, acts, clip, want_y, linear_before_reset):
    f, g = acts
    n = setup.hidden
    if linear_before_reset:
        r_all_t = np.ascontiguousarray(r.T)
    else:
        r_zr_t = np.ascontiguousarray(r[: 2 * n].T)
        r_h_t = np.ascontiguousarray(r[2 * n:].T)
    ys = np.empty((setup.seq, setup.batch, n), setup.dtype) if want_y else None
    mask = setup.mask if setup.lens is not None else None
    for t in range(setup.seq):
        x_t = xw[t]
        if linear_before_reset:
            hr = h @ r_all_t
            zr = hr[:, : 2 * n]
            zr += x_t[:, : 2 * n]
            hh = hr[:, 2 * n:]
            if rbh is not None:
                hh += rbh
        else:
            zr = h @ r_zr_t
            zr += x_t[:, : 2 * n]
        zr = f(clip(zr))
        z, rg = zr[:, :n], zr[:, n:]
        if linear_before_reset:
            hh *= rg
        else:
            hh = (rg * h) @ r_h_t
        hh += x_t[:, 2 * n:]
        hh = g(clip(hh))
        # H = (1 - z) * hh + z * H_prev = hh + z * (H_prev - hh)
        h_new = h - hh
        h_new *= z
        h_new += hh
        if mask is not None:
            h_new = np.where(mask[t], h_new, h)
        if want_y:
            ys[t] = h_new
        h = h_new
    if want_y and mask is not None:
        ys *= mask
    return ys, (h,)


def _run_lstm(setup, xw, rt, p, h, c, acts, clip, want_y, input_forget):
    f, g, hf = acts
    n = setup.hidden
    ys = np.empty((setup.seq, setup.batch, n), setup.dtype) if want_y else None
    mask = setup.mask if setup.lens is not None else None
    if p is not None:
        p_i, p_o, p_f = p[:n], p[n: 2 * n], p[2 * n:]
    for t in range(setup.seq):
        gates = h @ rt
        gates += xw[t]
        i, o, fg, cg = gates[:, :n], gates[:, n: 2 * n], gates[:, 2 * n: 3 * n], gates[:, 3 * n:]
        if p is not None:
            i += p_i * c
            if not input_forget:
                fg += p_f * c
        i = f(clip(i))
        fg = 1 - i if input_forget else f(clip(fg))
        cg = g(clip(cg))
        c_new = fg * c
        c_new += i * cg
        if p is not None:
            o += p_o * c_new
        o = f(clip(o))
        h_new = hf(c_new.copy())
        h_new *= o
        if mask is not None:
            h_new = np.where(mask[t], h_new, h)
            c_new = np.where(mask[t], c_new, c)
        if want_y:
            ys[t] = h_new
        h, c = h_new, c_new
    if want_y and mask is not None:
        ys *= mask
    return ys, (h, c)


# ----------------------------------------------------------------------------- kernels


def parse_attributes(info: NodeInfo, n_acts: int, defaults: Sequence[str]):
    """Attributes parsed once: (directions, layout, hidden_size, clip function, numpy
    activations per direction, whether Y is wanted, the compiled path's Spec)."""
    attrs = info.attrs
    reverse = _directions(attrs.get("direction") or "forward")
    layout = int(attrs.get("layout") or 0)
    hidden_size = attrs.get("hidden_size")
    slots = _activation_names(attrs, n_acts, len(reverse), defaults)
    acts = _activations(slots, n_acts, len(reverse))
    present = info.output_present or (True,) * info.n_outputs
    want_y = bool(present and present[0])
    codes = [rnn_fast.CODES.get(key) for key, _, _ in slots]
    spec = None
    if None not in codes:  # 3 codes per direction, 2 directions
        flat = [c for d in range(len(reverse))
                for c in codes[d * n_acts:(d + 1) * n_acts] + [0] * (3 - n_acts)]
        flag = {"LSTM": "input_forget", "GRU": "linear_before_reset"}.get(info.op_type)
        spec = rnn_fast.Spec(
            op=info.op_type, n_dirs=len(reverse), rev0=int(reverse[0]), layout=layout,
            hidden_size=hidden_size, clip=attrs.get("clip"),
            codes=tuple(flat + [0] * (6 - len(flat))),
            flag=int(attrs.get(flag) or 0) if flag else 0, want_y=want_y)
    return reverse, layout, hidden_size, _clipper(attrs.get("clip")), acts, want_y, spec


def _dispatch(info: NodeInfo, spec, slow: Callable[..., tuple]) -> Callable[..., tuple]:
    """The node's kernel: the compiled path when it applies, else the numpy loop `slow`."""
    tag = info.op_type.lower()
    if spec is None:
        fast, why = None, "an activation other than sigmoid, tanh or relu: the numpy loop"
    else:
        fast, why = rnn_fast.build(info, spec)
    if fast is None:
        slow.variant, slow.variant_reason = f"{tag}.numpy", why
        return slow

    def run(*args):
        got = fast(*args)
        if isinstance(got, str):
            report_variant(f"{tag}.numpy", got)
            return slow(*args)
        out, variant = got
        report_variant(variant)
        return out

    run.variant, run.variant_reason = f"{tag}.numba", None
    run.specialize = fast.specialize
    return run


@kernel("RNN", since=1, factory=True, multi_output=True, variant="rnn.numpy")
def rnn(info: NodeInfo):
    """Simple RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)."""
    reverse, layout, hidden_size, clip, acts, want_y, spec = parse_attributes(info, 1, ["Tanh"])

    def run(x, w, r, b=None, sequence_lens=None, initial_h=None):
        s = RnnSetup(x, r, sequence_lens, [initial_h], layout, 1, hidden_size, len(reverse))
        ys, hs = [], []
        for d, rev in enumerate(reverse):
            wb, rb = split_bias(b, d, 1, s.hidden, s.dtype)
            bias = None if wb is None else wb + rb
            xw = s.project(rev, w[d], bias)
            h0 = zero_state(s) if s.initial[0] is None else s.initial[0][d]
            rt = r[d].T.astype(s.dtype)
            y, (h,) = _run_rnn(s, xw, rt, h0, acts[d], clip, want_y)
            ys.append(y)
            hs.append(h)
        return s.finish(ys if want_y else None, [hs], reverse)

    return _dispatch(info, spec, run)


@kernel("GRU", since=1, factory=True, multi_output=True, variant="gru.numpy")
def gru(info: NodeInfo):
    """GRU with update/reset gates (gate order z, r, h), linear_before_reset 0 or 1."""
    reverse, layout, hidden_size, clip, acts, want_y, spec = parse_attributes(
        info, 2, ["Sigmoid", "Tanh"]
    )
    lbr = int(info.attrs.get("linear_before_reset") or 0)

    def run(x, w, r, b=None, sequence_lens=None, initial_h=None):
        s = RnnSetup(x, r, sequence_lens, [initial_h], layout, 3, hidden_size, len(reverse))
        n = s.hidden
        ys, hs = [], []
        for d, rev in enumerate(reverse):
            wb, rb = split_bias(b, d, 3, n, s.dtype)
            rbh = None
            if wb is not None:
                bias = wb.copy()
                if lbr:
                    bias[: 2 * n] += rb[: 2 * n]
                    rbh = rb[2 * n:]
                else:
                    bias += rb
            else:
                bias = None
            xw = s.project(rev, w[d], bias)
            h0 = zero_state(s) if s.initial[0] is None else s.initial[0][d]
            rd = r[d].astype(s.dtype, copy=False)
            y, (h,) = _run_gru(s, xw, rd, rbh, h0, acts[d], clip, want_y, lbr)
            ys.append(y)
            hs.append(h)
        return s.finish(ys if want_y else None, [hs], reverse)

    return _dispatch(info, spec, run)


@kernel("LSTM", since=1, factory=True, multi_output=True, variant="lstm.numpy")
def lstm(info: NodeInfo):
    """LSTM (gate order i, o, f, c) with optional peepholes and coupled input/forget gates."""
    reverse, layout, hidden_size, clip, acts, want_y, spec = parse_attributes(
        info, 3, ["Sigmoid", "Tanh", "Tanh"]
    )
    input_forget = int(info.attrs.get("input_forget") or 0)

    def run(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
        s = RnnSetup(x, r, sequence_lens, [initial_h, initial_c], layout, 4, hidden_size,
                   len(reverse))
        n = s.hidden
        if p is not None and p.shape != (len(reverse), 3 * n):
            raise ValueError(f"P must have shape {(len(reverse), 3 * n)}, got {p.shape}")
        ys, hs, cs = [], [], []
        for d, rev in enumerate(reverse):
            wb, rb = split_bias(b, d, 4, n, s.dtype)
            bias = None if wb is None else wb + rb
            xw = s.project(rev, w[d], bias)
            h0 = zero_state(s) if s.initial[0] is None else s.initial[0][d]
            c0 = zero_state(s) if s.initial[1] is None else s.initial[1][d]
            rt = r[d].T.astype(s.dtype)
            pd = None if p is None else p[d].astype(s.dtype, copy=False)
            y, (h, c) = _run_lstm(s, xw, rt, pd, h0, c0, acts[d], clip, want_y, input_forget)
            ys.append(y)
            hs.append(h)
            cs.append(c)
        return s.finish(ys if want_y else None, [hs, cs], reverse)

    return _dispatch(info, spec, run)
