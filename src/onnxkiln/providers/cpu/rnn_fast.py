"""The compiled path of RNN, GRU and LSTM: the numba kernels of `_numba_rnn` (one GEMM for
the input projection of every step and direction, then the time loop) and their callers.

Weights are laid out once at plan time when they are initializers (W^T of every direction
side by side, biases summed, R and R^T in the compute dtype), otherwise per run. The
kernels load (compile, or read numba's disk cache) on the first run that needs them:
building a session imports neither numba nor scipy (numba's np.dot calls scipy's BLAS).
A specialisation (`specialize`) fixes the shapes: validation, output shapes, the product
mode and the kernel's flags are worked out once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu import _numba

__all__ = ["CODES", "build", "product_mode"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_JIT = "onnxkiln.providers.cpu._numba_rnn"
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # as _numba_jit.FASTMATH
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_KERNELS = {"RNN": "rnn_seq", "GRU": "gru_seq", "LSTM": "lstm_seq"}
CODES = {"sigmoid": 0, "tanh": 1, "relu": 2}  # activations the kernels compute
_N_PARAMS = 18


def _signature(name: str, dt: np.dtype) -> tuple:
    from numba import types

    f = types.float32 if dt == _F32 else types.float64

    def arr(nd: int, ro: bool = True):
        return types.Array(f, nd, "C", readonly=ro)

    head = (arr(3), arr(2), arr(1), arr(3), arr(3))  # x, wt (or W), bias, r, rt
    lens = types.Array(types.int64, 1, "C", readonly=True)
    tail = (lens, types.UniTuple(types.int64, _N_PARAMS), types.float64, arr(4, False),
            arr(3, False))  # lens, params, clip, y, yh
    if name == "lstm_seq":  # ..., p, h0, c0, ..., yc
        return (*head, arr(2), arr(3), arr(3), *tail, arr(3, False))
    if name == "gru_seq":  # ..., rt2, rbh, h0, ...
        return (*head, arr(3), arr(2), arr(3), *tail)
    return (*head, arr(3), *tail)  # rnn_seq: ..., h0, ...


for _name in _KERNELS.values():
    _numba.register(_name, _JIT, lambda dt, n=_name: _signature(n, dt), (_F32, _F64),
                    _FASTMATH)

# From this size of one direction's R the dot loop runs at every batch (measured, table in
# _numba_rnn: as fast as BLAS for one row, up to 5x faster for several, 20% slower only
# for 2-3 rows below 2 MB), so R^T is not laid out: no copy of R is kept.
DOT_ALWAYS = 1 << 20
_DOT_FROM = 8, 768 << 10  # below DOT_ALWAYS: rows, R bytes from which the dot loop wins
_W_ROWS = 1 << 18  # from this size of W the projection reads W itself, not a copy of W^T


def product_mode(batch: int, r_bytes: int) -> int:
    """0: BLAS for the recurrent product (one GEMM per step, h @ R^T); 1: the dot loop,
    for a recurrent weight too large for L2, where a GEMM of several rows would repack it
    every step and one row streams it as fast."""
    if r_bytes >= DOT_ALWAYS:
        return 1
    return int(batch >= _DOT_FROM[0] and r_bytes >= _DOT_FROM[1])


class Weights(NamedTuple):
    """One node's weights in the compute dtype, as the kernel takes them."""

    args: tuple  # the kernel's weight operands: wt, bias, r, rt (+ p; + rt2, rbh)
    w_rows: int  # args[0] is W (D*G, I) itself rather than W^T (I, D*G)
    has_bias: int
    n_in: int
    hidden: int
    r_bytes: int  # one direction's R, for product_mode


def prepare(op: str, w, r, b, p, lbr: int, n_dirs: int, hidden_size, cdt: np.dtype) -> Weights:
    """Check and lay out W, R, B (and P) for the kernel; errors as the numpy path's.

    wt (I, D*G) = W^T of every direction side by side (for a large W, W itself as given:
    no copy); bias (D*G,) = Wb + Rb (for a GRU with linear_before_reset, without the h
    gate's Rb: that is rbh (D, H)); r (D, G, H) as given (no copy when already in the
    dtype) for the dot loop, rt (D, H, G) = R^T for BLAS (a GRU without
    linear_before_reset: rt of the z, r gates, rt2 of the h gate), laid out only when R
    is small enough for BLAS to be chosen (see product_mode)."""
    g = _GATES[op]
    hidden = r.shape[-1]
    rows = g * hidden
    if hidden_size is not None and hidden_size != hidden:
        raise ValueError(f"hidden_size is {hidden_size} but R has shape {r.shape}")
    if r.shape != (n_dirs, rows, hidden):
        raise ValueError(f"R must have shape {(n_dirs, rows, hidden)}, got {r.shape}")
    if w.ndim != 3 or w.shape[:2] != (n_dirs, rows):
        raise ValueError(f"W must have {rows} rows and (input size) columns per direction, "
                         f"got {w.shape}")
    w2 = w.reshape(n_dirs * rows, -1)
    w_rows = int(w2.nbytes >= _W_ROWS)
    wt = np.ascontiguousarray(w2 if w_rows else w2.T, dtype=cdt)
    bias, rbh = np.zeros(1, cdt), np.zeros((n_dirs, hidden), cdt)
    if b is not None:
        if b.shape != (n_dirs, 2 * rows):
            raise ValueError(f"B must have {2 * rows} columns, got shape {b.shape}")
        bb = b.astype(cdt, copy=False)
        wb, rb = bb[:, :rows], bb[:, rows:]
        bias = wb + rb
        if op == "GRU" and lbr:
            bias[:, 2 * hidden:] = wb[:, 2 * hidden:]
            rbh = np.ascontiguousarray(rb[:, 2 * hidden:])
        bias = bias.reshape(-1)
    rc = np.ascontiguousarray(r, dtype=cdt)
    none = np.zeros((1, 1, 1), cdt)
    if rc[0].nbytes >= DOT_ALWAYS:  # the dot loop only: R^T is never read
        rt = none
        extra: tuple = (none, rbh) if op == "GRU" else ()
    elif op == "GRU" and not lbr:
        rt = np.ascontiguousarray(rc[:, :2 * hidden].transpose(0, 2, 1))
        extra = (np.ascontiguousarray(rc[:, 2 * hidden:].transpose(0, 2, 1)), rbh)
    else:
        rt = np.ascontiguousarray(rc.transpose(0, 2, 1))
        extra = (none, rbh) if op == "GRU" else ()
    if op == "LSTM":
        if p is not None and p.shape != (n_dirs, 3 * hidden):
            raise ValueError(f"P must have shape {(n_dirs, 3 * hidden)}, got {p.shape}")
        extra = (np.zeros((n_dirs, 3 * hidden), cdt) if p is None
                 else np.ascontiguousarray(p, dtype=cdt),)
    return Weights((wt, bias, rc, rt, *extra), w_rows, int(b is not None), w2.shape[1],
                   hidden, rc[0].nbytes)


def _lens(sequence_lens, batch: int, seq: int) -> np.ndarray:
    lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
    if lens.shape != (batch,):
        raise ValueError(f"sequence_lens must have shape ({batch},), got {sequence_lens.shape}")
    if lens.min() < 0 or lens.max() > seq:
        raise ValueError(f"sequence_lens values must be in [0, {seq}], got {lens}")
    return lens


def _state(value, shape: tuple[int, ...], cdt: np.dtype) -> np.ndarray:
    if value.shape != shape:
        raise ValueError(f"initial state must have shape {shape}, got {value.shape}")
    return np.ascontiguousarray(value, dtype=cdt)


@dataclass(frozen=True, slots=True)
class Spec:
    """What the compiled path needs from the node, fixed at plan time."""

    op: str
    n_dirs: int
    rev0: int  # direction "reverse"
    layout: int
    hidden_size: int | None
    clip: float | None
    codes: tuple[int, ...]  # activation codes (CODES), 3 per direction, 2 directions
    flag: int  # LSTM input_forget, GRU linear_before_reset
    want_y: bool
    clip_value: float = field(init=False)
    variants: tuple[str, str] = field(init=False)  # the trace variant per product mode

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip_value", 0.0 if self.clip is None else float(self.clip))
        tag = self.op.lower()
        object.__setattr__(self, "variants", (f"{tag}.numba.blas", f"{tag}.numba.dot"))


def _const(info: NodeInfo, i: int):
    consts = info.const_inputs
    return consts[i] if i < len(consts) else None


def _plan_weights(info: NodeInfo, spec: Spec, cdt: np.dtype) -> Weights | None:
    """The weights laid out now when W, R (and B, P when present) are initializers, else
    None (laid out per run; a bad shape is then reported by the run)."""
    present = info.input_present or ()
    w, r = _const(info, 1), _const(info, 2)
    b = _const(info, 3) if len(present) > 3 and present[3] else None
    p = _const(info, 7) if len(present) > 7 and present[7] else None
    if w is None or r is None or (b is None and len(present) > 3 and present[3]):
        return None
    if spec.op == "LSTM" and p is None and len(present) > 7 and present[7]:
        return None
    try:
        return prepare(spec.op, w, r, b, p, spec.flag, spec.n_dirs, spec.hidden_size, cdt)
    except ValueError:
        return None


def _plan_dtype(info: NodeInfo) -> np.dtype | None:
    """The compute dtype known at plan time (X's, or the constant W's: both are T), if any."""
    dt = info.input_dtypes[0].numpy if info.input_dtypes and info.input_dtypes[0] else None
    w = _const(info, 1)
    if dt is None and w is not None:
        dt = w.dtype
    return dt if dt in (_F32, _F64) else None


class _Facts(NamedTuple):
    """What one input signature fixes: output shapes, the kernel's flags, the variant."""

    yshape: tuple[int, ...] | None
    sshape: tuple[int, ...]
    params: tuple[int, ...]
    variant: str


def _facts(spec: Spec, wts: Weights, xshape, h0: bool, c0: bool, lens: bool) -> _Facts:
    lay = spec.layout
    seq, batch = (xshape[1], xshape[0]) if lay else (xshape[0], xshape[1])
    if xshape[2] != wts.n_in:
        raise ValueError(f"W must have {xshape[2]} columns (X's input size) per direction, "
                         f"got {wts.n_in}")
    n_dirs, hidden = spec.n_dirs, wts.hidden
    mode = product_mode(batch, wts.r_bytes)
    params = (n_dirs, spec.rev0, lay, int(h0), int(c0), wts.has_bias, int(lens),
              int(spec.want_y), int(spec.clip is not None), mode, spec.flag, *spec.codes,
              wts.w_rows)
    return _Facts(
        ((batch, seq, n_dirs, hidden) if lay else (seq, n_dirs, batch, hidden))
        if spec.want_y else None,
        (batch, n_dirs, hidden) if lay else (n_dirs, batch, hidden), params,
        spec.variants[mode])


_NO_LENS = np.zeros(0, np.int64)
_DUMMY = {dt: (np.zeros((1, 1, 1), dt), np.zeros((1, 1, 1, 1), dt)) for dt in (_F32, _F64)}


def _execute(fn, spec: Spec, facts: _Facts, wts: Weights, x, sequence_lens, initial_h,
             initial_c) -> tuple:
    """Allocate the outputs and run the kernel (the projection included)."""
    cdt = x.dtype
    sshape = facts.sshape
    no_state, no_y = _DUMMY[cdt]
    lens = _NO_LENS
    if sequence_lens is not None:
        lay = spec.layout
        lens = _lens(sequence_lens, x.shape[0] if lay else x.shape[1],
                     x.shape[1] if lay else x.shape[0])
    h0 = no_state if initial_h is None else _state(initial_h, sshape, cdt)
    y = no_y if facts.yshape is None else np.empty(facts.yshape, cdt)
    yh = np.empty(sshape, cdt)
    x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    if spec.op == "LSTM":
        c0 = no_state if initial_c is None else _state(initial_c, sshape, cdt)
        yc = np.empty(sshape, cdt)
        fn(x, *wts.args, h0, c0, lens, facts.params, spec.clip_value, y, yh, yc)
        return (None if facts.yshape is None else y, yh, yc)
    fn(x, *wts.args, h0, lens, facts.params, spec.clip_value, y, yh)
    return (None if facts.yshape is None else y, yh)


def build(info: NodeInfo, spec: Spec) -> tuple[Callable[..., Any] | None, str | None]:
    """(the compiled kernel of this node, None) or (None, why the numpy loop runs).

    The kernel returns (outputs, variant), or a string saying why this call goes to the
    numpy loop (float16 or bfloat16, an empty sequence or batch, numba not importing); it
    has a `specialize(dtypes, shapes, consts)` that binds one input signature."""
    why = _numba.disabled_reason()
    if why is not None:
        return None, why
    name = _KERNELS[spec.op]
    handles = {dt: _numba.lazy(name, dt) for dt in (_F32, _F64)}
    cdt0 = _plan_dtype(info)
    planned = _plan_weights(info, spec, cdt0) if cdt0 is not None else None

    def weights(cdt, w, r, b, p) -> Weights:
        if planned is not None and cdt == cdt0:
            return planned
        return prepare(spec.op, w, r, b, p, spec.flag, spec.n_dirs, spec.hidden_size, cdt)

    def run(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
        if x.ndim != 3:
            raise ValueError(f"X must be 3-D, got shape {x.shape}")
        handle = handles.get(x.dtype)
        if handle is None or 0 in x.shape:
            return f"{x.dtype} input or an empty sequence or batch: the numpy loop"
        if not handle.ready():
            return handle.reason
        wts = weights(x.dtype, w, r, b, p)
        facts = _facts(spec, wts, x.shape, initial_h is not None, initial_c is not None,
                       sequence_lens is not None)
        return _execute(handle.fn, spec, facts, wts, x, sequence_lens, initial_h,
                        initial_c), facts.variant

    def specialize(dtypes, shapes, consts) -> Callable[..., tuple] | None:
        """The kernel for one signature: X's dtype and shapes fixed, weights laid out once
        when the signature fixes them; None where the generic path must run."""
        sx, cdt = shapes[0], dtypes[0]
        handle = handles.get(cdt)
        if handle is None or sx is None or len(sx) != 3 or 0 in sx or not handle.ready():
            return None
        shapes = tuple(shapes) + (None,) * (8 - len(shapes))
        consts = tuple(consts) + (None,) * (8 - len(consts))
        fixed = all(consts[i] is not None or shapes[i] is None for i in (1, 2, 3, 7))
        wts = weights(cdt, *(consts[i] for i in (1, 2, 3, 7))) if fixed else None
        if wts is None:
            return None  # weights that are graph inputs: the generic path lays them out
        facts = _facts(spec, wts, sx, shapes[5] is not None, shapes[6] is not None,
                       shapes[4] is not None)
        fn = handle.fn

        def special(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None,
                    p=None):
            return _execute(fn, spec, facts, wts, x, sequence_lens, initial_h, initial_c)

        special.variant, special.variant_reason = facts.variant, None
        return special

    run.specialize = specialize
    return run, None
