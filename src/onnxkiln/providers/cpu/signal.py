"""CPU kernels: signal processing (DFT, STFT, window functions, MelWeightMatrix)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxkiln.dtypes import to_numpy
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu._tensor_util import const_input
from onnxkiln.providers.cpu.registry import kernel

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """float64 stays float64; float32, float16 and bfloat16 compute in float32."""
    return _F64 if dtype == _F64 else _F32


def _scalar_int(value: np.ndarray, op: str, name: str) -> int:
    a = np.asarray(value)
    if a.size != 1:
        raise ValueError(f"{op}: '{name}' must be a scalar, got shape {list(a.shape)}")
    return int(a.reshape(-1)[0])


def _to_complex(x: np.ndarray, op: str) -> tuple[np.ndarray, bool]:
    """[..., 1] real or [..., 2] (re, im) input as a complex array without the last dim."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise ValueError(
            f"{op}: input's last dimension must be 1 (real) or 2 (complex) and rank >= 2, "
            f"got shape {list(x.shape)}"
        )
    work = _work_dtype(x.dtype)
    if x.shape[-1] == 1:
        return x[..., 0].astype(work, copy=False), False
    ctype = np.complex128 if work == _F64 else np.complex64
    xc = np.ascontiguousarray(x, dtype=work).view(ctype)[..., 0]
    return xc, True


def _from_complex(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A complex array as [..., 2] (re, im) of `dtype`."""
    real = _F64 if y.dtype == np.complex128 else _F32
    out = np.ascontiguousarray(y).view(real).reshape(*y.shape, 2)
    return out if out.dtype == dtype else out.astype(dtype)


def _dft(
    x: np.ndarray, axis: int, length: int | None, inverse: bool, onesided: bool, op: str
) -> np.ndarray:
    """The DFT of `x` ([..., 1|2]) along `axis` (an axis of x, not its last one)."""
    rank = x.ndim
    a = axis + rank if axis < 0 else axis
    if not 0 <= a <= rank - 2:
        raise ValueError(
            f"{op}: axis {axis} is out of range for input of rank {rank} "
            f"(expected [-{rank}, -2] or [0, {rank - 2}]; the last dim holds re/im)"
        )
    if length is not None and length < 1:
        raise ValueError(f"{op}: dft_length must be positive, got {length}")
    sig, is_complex = _to_complex(x, op)
    if onesided and inverse:
        if not is_complex:
            raise ValueError(
                f"{op}: inverse one-sided DFT (IRFFT) needs complex input (last dim 2), "
                f"got shape {list(x.shape)}"
            )
        n = length if length is not None else 2 * (sig.shape[a] - 1)
        if n < 1:
            raise ValueError(f"{op}: IRFFT length {n} must be positive")
        y = np.fft.irfft(sig, n=n, axis=a)
        y = y.astype(_work_dtype(x.dtype), copy=False)[..., None]
        return y if y.dtype == x.dtype else y.astype(x.dtype)
    if onesided:
        if is_complex:
            raise ValueError(
                f"{op}: one-sided DFT (RFFT) needs real input (last dim 1), "
                f"got shape {list(x.shape)}"
            )
        y = np.fft.rfft(sig, n=length, axis=a)
    elif inverse:
        y = np.fft.ifft(sig, n=length, axis=a)
    else:
        y = np.fft.fft(sig, n=length, axis=a)
    if _work_dtype(x.dtype) == _F32:
        y = y.astype(np.complex64, copy=False)
    return _from_complex(y, x.dtype)


@kernel("DFT", since=17, until=19)
def dft_v17(
    x: np.ndarray, dft_length: np.ndarray | None = None, *, axis: int, inverse: int, onesided: int
) -> np.ndarray:
    """Discrete Fourier transform along the `axis` attribute (default 1)."""
    n = None if dft_length is None else _scalar_int(dft_length, "DFT", "dft_length")
    return _dft(x, axis, n, bool(inverse), bool(onesided), "DFT")


@kernel("DFT", since=20, factory=True)
def dft(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Discrete Fourier transform along the `axis` input (default -2)."""
    inverse, onesided = bool(info.attrs["inverse"]), bool(info.attrs["onesided"])
    c_len, c_axis = const_input(info, 1), const_input(info, 2)
    fixed_len = None if c_len is None else _scalar_int(c_len, "DFT", "dft_length")
    fixed_axis = None if c_axis is None else _scalar_int(c_axis, "DFT", "axis")

    def run(
        x: np.ndarray, dft_length: np.ndarray | None = None, axis: np.ndarray | None = None
    ) -> np.ndarray:
        n = fixed_len
        if n is None and dft_length is not None:
            n = _scalar_int(dft_length, "DFT", "dft_length")
        a = fixed_axis
        if a is None:
            a = -2 if axis is None else _scalar_int(axis, "DFT", "axis")
        return _dft(x, a, n, inverse, onesided, "DFT")

    return run


@kernel("STFT", since=17)
def stft(
    signal: np.ndarray,
    frame_step: np.ndarray,
    window: np.ndarray | None = None,
    frame_length: np.ndarray | None = None,
    *,
    onesided: int,
) -> np.ndarray:
    """Short-time Fourier transform: [batch, frames, bins, 2]."""
    if signal.ndim != 3 or signal.shape[-1] not in (1, 2):
        raise ValueError(
            f"STFT: signal must have shape [batch, length, 1|2], got {list(signal.shape)}"
        )
    step = _scalar_int(frame_step, "STFT", "frame_step")
    if step < 1:
        raise ValueError(f"STFT: frame_step must be positive, got {step}")
    length = signal.shape[1]
    if frame_length is not None:
        flen = _scalar_int(frame_length, "STFT", "frame_length")
        if window is not None and window.shape != (flen,):
            raise ValueError(
                f"STFT: window must have shape [{flen}] (frame_length), got {list(window.shape)}"
            )
    elif window is not None:
        if window.ndim != 1:
            raise ValueError(f"STFT: window must be 1-D, got shape {list(window.shape)}")
        flen = window.shape[0]
    else:
        flen = length
    if not 1 <= flen <= length:
        raise ValueError(f"STFT: frame_length {flen} must be in [1, signal length {length}]")
    sig, _ = _to_complex(signal, "STFT")
    frames = np.lib.stride_tricks.sliding_window_view(sig, flen, axis=1)[:, ::step]
    work = _work_dtype(signal.dtype)
    if window is not None:
        frames = frames * window.astype(work, copy=False)
    if onesided and not np.iscomplexobj(frames):
        y = np.fft.rfft(frames, axis=-1)
    else:
        y = np.fft.fft(frames, axis=-1)
        if onesided:  # complex signal: keep the first half of the spectrum, as onnxruntime
            y = y[..., : flen // 2 + 1]
    if work == _F32:
        y = y.astype(np.complex64, copy=False)
    return _from_complex(y, signal.dtype)


# Windows


def _window_factory(
    info: NodeInfo, coeffs: tuple[float, ...], name: str
) -> Callable[[np.ndarray], np.ndarray]:
    periodic = bool(info.attrs["periodic"])
    dtype = to_numpy(info.attrs["output_datatype"])

    def compute(size: np.ndarray) -> np.ndarray:
        n = _scalar_int(size, name, "size")
        if n < 0:
            raise ValueError(f"{name}: size must be >= 0, got {n}")
        denom = n if periodic else n - 1
        with np.errstate(divide="ignore", invalid="ignore"):
            phase = np.arange(n, dtype=_F64) * (2.0 * math.pi / denom if denom else math.inf)
            w = np.full(n, coeffs[0], dtype=_F64)
            # Highest harmonic first: Blackman's peak then sums to exactly 1.0, so integer
            # outputs hold 1 there, as in onnxruntime.
            for k in range(len(coeffs) - 1, 0, -1):
                w += coeffs[k] * np.cos(k * phase)
            return w.astype(dtype)

    c = const_input(info, 0)
    if c is not None:
        cached = compute(c)
        return lambda size: cached.copy()
    return compute


@kernel("HannWindow", since=17, factory=True)
def hann_window(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """Hann window: 0.5 - 0.5 cos(2 pi n / N), N = size (periodic) or size - 1."""
    return _window_factory(info, (0.5, -0.5), "HannWindow")


@kernel("HammingWindow", since=17, factory=True)
def hamming_window(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """Hamming window: 25/46 - 21/46 cos(2 pi n / N)."""
    return _window_factory(info, (25.0 / 46.0, -21.0 / 46.0), "HammingWindow")


@kernel("BlackmanWindow", since=17, factory=True)
def blackman_window(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """Blackman window: 0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""
    return _window_factory(info, (0.42, -0.5, 0.08), "BlackmanWindow")


# MelWeightMatrix


def _hz_to_mel(hz: float) -> float:
    return 2595.0 * math.log10(1.0 + hz / 700.0)


@kernel("MelWeightMatrix", since=17, capture=CaptureSupport.DATA_DEPENDENT_SHAPE)
def mel_weight_matrix(
    num_mel_bins: np.ndarray,
    dft_length: np.ndarray,
    sample_rate: np.ndarray,
    lower_edge_hertz: np.ndarray,
    upper_edge_hertz: np.ndarray,
    *,
    output_datatype: int,
) -> np.ndarray:
    """Triangular mel filterbank, [dft_length // 2 + 1, num_mel_bins], peaks of 1."""
    op = "MelWeightMatrix"
    n_mel = _scalar_int(num_mel_bins, op, "num_mel_bins")
    n_dft = _scalar_int(dft_length, op, "dft_length")
    rate = _scalar_int(sample_rate, op, "sample_rate")
    lo = float(np.asarray(lower_edge_hertz, dtype=_F64).reshape(-1)[0])
    hi = float(np.asarray(upper_edge_hertz, dtype=_F64).reshape(-1)[0])
    if n_mel < 1 or n_dft < 1 or rate < 1:
        raise ValueError(
            f"{op}: num_mel_bins, dft_length and sample_rate must be positive, "
            f"got {n_mel}, {n_dft}, {rate}"
        )
    if not 0.0 <= lo < hi:
        raise ValueError(f"{op}: need 0 <= lower_edge_hertz < upper_edge_hertz, got {lo}, {hi}")
    n_bins = n_dft // 2 + 1
    if math.floor((n_dft + 1) * hi / rate) >= n_bins:
        raise ValueError(
            f"{op}: upper_edge_hertz {hi} maps to a bin beyond the {n_bins} spectrogram bins "
            f"of dft_length {n_dft} at sample_rate {rate}"
        )
    # num_mel_bins + 2 equally spaced mel points (step (hi - lo) / (num_mel_bins + 2), so the
    # last point stays below the upper edge), mapped to spectrogram bin indices.
    mel_lo, mel_hi = _hz_to_mel(lo), _hz_to_mel(hi)
    mels = mel_lo + np.arange(n_mel + 2, dtype=_F64) * ((mel_hi - mel_lo) / (n_mel + 2))
    hz = 700.0 * (np.power(10.0, mels / 2595.0) - 1.0)
    edges = np.floor((n_dft + 1) * hz / rate).astype(np.int64)
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(n_bins, dtype=np.int64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rise = np.where(center > left, (j - left) / (center - left), 1.0)
        fall = (right - j) / (right - center)
    w = np.where((j >= left) & (j <= center), rise, 0.0)
    w = np.where((j >= center) & (j < right), fall, w)
    return w.astype(to_numpy(output_datatype))
