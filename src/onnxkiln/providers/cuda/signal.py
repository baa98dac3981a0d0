"""Torch kernels: signal processing (DFT, STFT, Hann/Hamming/Blackman windows,
MelWeightMatrix).

Transforms run as torch.fft on the device (float16/bfloat16 in float32). The lengths and
axes that shape an output (dft_length, axis, frame_step, frame_length, a window's size,
MelWeightMatrix's operands) are host inputs: they are read on the host, never downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from onnxkiln.dtypes import DataType
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cuda._util import host_input
from onnxkiln.providers.cuda.device import current_device
from onnxkiln.providers.cuda.dtypes import FLOATS, SERVED, needs, to_torch, to_torch_dtype
from onnxkiln.providers.cuda.registry import kernel

Tensor = torch.Tensor


def _work(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, float16 and bfloat16 transform in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scalar_int(value, op: str, name: str) -> int:
    a = np.asarray(value)
    if a.size != 1:
        raise ValueError(f"{op}: '{name}' must be a scalar, got shape {list(a.shape)}")
    return int(a.reshape(-1)[0])


def _to_complex(x: Tensor, op: str) -> tuple[Tensor, bool]:
    """[..., 1] real or [..., 2] (re, im) input as a tensor without the last dim."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise ValueError(f"{op}: input's last dimension must be 1 (real) or 2 (complex) and "
                         f"rank >= 2, got shape {list(x.shape)}")
    w = x.to(_work(x.dtype))
    if x.shape[-1] == 1:
        return w[..., 0], False
    return torch.view_as_complex(w.contiguous()), True


def _from_complex(y: Tensor, dtype: torch.dtype) -> Tensor:
    """A complex tensor as [..., 2] (re, im) of `dtype`."""
    return torch.view_as_real(y).to(dtype)


def _dft(x: Tensor, axis: int, length: int | None, inverse: bool, onesided: bool) -> Tensor:
    """The DFT of `x` ([..., 1|2]) along `axis` (an axis of x, not its last one)."""
    op, rank = "DFT", x.ndim
    a = axis + rank if axis < 0 else axis
    if not 0 <= a <= rank - 2:
        raise ValueError(f"{op}: axis {axis} is out of range for input of rank {rank} "
                         f"(expected [-{rank}, -2] or [0, {rank - 2}]; the last dim holds re/im)")
    if length is not None and length < 1:
        raise ValueError(f"{op}: dft_length must be positive, got {length}")
    sig, is_complex = _to_complex(x, op)
    if onesided and inverse:
        if not is_complex:
            raise ValueError(f"{op}: inverse one-sided DFT (IRFFT) needs complex input (last "
                             f"dim 2), got shape {list(x.shape)}")
        n = length if length is not None else 2 * (sig.shape[a] - 1)
        if n < 1:
            raise ValueError(f"{op}: IRFFT length {n} must be positive")
        return torch.fft.irfft(sig, n=n, dim=a)[..., None].to(x.dtype)
    if onesided:
        if is_complex:
            raise ValueError(f"{op}: one-sided DFT (RFFT) needs real input (last dim 1), "
                             f"got shape {list(x.shape)}")
        y = torch.fft.rfft(sig, n=length, dim=a)
    elif inverse:
        y = torch.fft.ifft(sig, n=length, dim=a)
    else:
        y = torch.fft.fft(sig, n=length, dim=a)
    return _from_complex(y, x.dtype)


@kernel("DFT", since=17, until=19, host_inputs=(1,), capture=CaptureSupport.READS_HOST_SCALAR,
        supports=needs(FLOATS, skip_inputs=(1,)))
def dft_v17(x: Tensor, dft_length=None, *, axis, inverse, onesided) -> Tensor:
    """Discrete Fourier transform along the `axis` attribute (default 1)."""
    n = None if dft_length is None else _scalar_int(dft_length, "DFT", "dft_length")
    return _dft(x, int(axis), n, bool(inverse), bool(onesided))


@kernel("DFT", since=20, factory=True, host_inputs=(1, 2),
        capture=CaptureSupport.READS_HOST_SCALAR, supports=needs(FLOATS, skip_inputs=(1, 2)))
def dft(info: NodeInfo) -> Callable[..., Tensor]:
    """Discrete Fourier transform along the `axis` input (default -2)."""
    inverse, onesided = bool(info.attrs["inverse"]), bool(info.attrs["onesided"])

    def run(x: Tensor, dft_length=None, axis=None) -> Tensor:
        n = None if dft_length is None else _scalar_int(dft_length, "DFT", "dft_length")
        a = -2 if axis is None else _scalar_int(axis, "DFT", "axis")
        return _dft(x, a, n, inverse, onesided)

    return run


def _frame_length(signal: Tensor, window: Tensor | None, frame_length) -> int:
    length = signal.shape[1]
    if frame_length is not None:
        flen = _scalar_int(frame_length, "STFT", "frame_length")
        if window is not None and tuple(window.shape) != (flen,):
            raise ValueError(f"STFT: window must have shape [{flen}] (frame_length), got "
                             f"{list(window.shape)}")
    elif window is not None:
        if window.ndim != 1:
            raise ValueError(f"STFT: window must be 1-D, got shape {list(window.shape)}")
        flen = window.shape[0]
    else:
        flen = length
    if not 1 <= flen <= length:
        raise ValueError(f"STFT: frame_length {flen} must be in [1, signal length {length}]")
    return flen


@kernel("STFT", since=17, host_inputs=(1, 3), capture=CaptureSupport.READS_HOST_SCALAR,
        supports=needs(FLOATS, skip_inputs=(1, 3)))
def stft(signal: Tensor, frame_step, window: Tensor | None = None, frame_length=None, *,
         onesided) -> Tensor:
    """Short-time Fourier transform: [batch, frames, bins, 2]."""
    if signal.ndim != 3 or signal.shape[-1] not in (1, 2):
        raise ValueError(f"STFT: signal must have shape [batch, length, 1|2], got "
                         f"{list(signal.shape)}")
    step = _scalar_int(frame_step, "STFT", "frame_step")
    if step < 1:
        raise ValueError(f"STFT: frame_step must be positive, got {step}")
    flen = _frame_length(signal, window, frame_length)
    sig, is_complex = _to_complex(signal, "STFT")
    frames = sig.unfold(1, flen, step)  # (batch, frames, flen), a view
    if window is not None:
        frames = frames * window.to(_work(signal.dtype))
    if onesided and not is_complex:
        y = torch.fft.rfft(frames, dim=-1)
    else:
        y = torch.fft.fft(frames, dim=-1)
        if onesided:  # complex signal: the first half of the spectrum, as the CPU provider
            y = y[..., : flen // 2 + 1]
    return _from_complex(y, signal.dtype)


def _output_dtype_supports(info: NodeInfo) -> str | None:
    dt = DataType(int(info.attrs.get("output_datatype", DataType.FLOAT)))
    if dt not in SERVED:
        return f"output_datatype {dt} is not a type torch kernels run"
    return None


def _window(info: NodeInfo, coeffs: tuple[float, ...], name: str) -> Callable[..., Tensor]:
    """Sum of cosines coeffs[k] cos(2 pi k n / N) computed in float64 on the device, then
    cast (truncating for integer outputs), as the CPU provider does."""
    periodic = bool(info.attrs["periodic"])
    dtype = to_torch_dtype(int(info.attrs["output_datatype"]))
    device = current_device()

    def compute(size) -> Tensor:
        n = _scalar_int(size, name, "size")
        if n < 0:
            raise ValueError(f"{name}: size must be >= 0, got {n}")
        denom = n if periodic else n - 1
        step = 2.0 * math.pi / denom if denom else math.inf
        phase = torch.arange(n, dtype=torch.float64, device=device) * step
        w = torch.full((n,), coeffs[0], dtype=torch.float64, device=device)
        for k in range(len(coeffs) - 1, 0, -1):  # highest harmonic first, as the CPU provider
            w = w + coeffs[k] * torch.cos(k * phase)
        return w.to(dtype)

    c = host_input(info, 0)
    if c is not None:
        cached = compute(c)
        return lambda size: cached.clone()
    return compute


def _window_kernel(op: str, coeffs: tuple[float, ...], doc: str) -> None:
    def build(info: NodeInfo) -> Callable[..., Tensor]:
        return _window(info, coeffs, op)

    build.__doc__ = doc
    kernel(op, since=17, factory=True, host_inputs=(0,), capture=CaptureSupport.READS_HOST_SCALAR,
           supports=needs(SERVED, skip_inputs=(0,), extra=_output_dtype_supports))(build)


_window_kernel("HannWindow", (0.5, -0.5), "Hann window: 0.5 - 0.5 cos(2 pi n / N).")
_window_kernel("HammingWindow", (25.0 / 46.0, -21.0 / 46.0),
               "Hamming window: 25/46 - 21/46 cos(2 pi n / N).")
_window_kernel("BlackmanWindow", (0.42, -0.5, 0.08),
               "Blackman window: 0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N).")


def _hz_to_mel(hz: float) -> float:
    return 2595.0 * math.log10(1.0 + hz / 700.0)


def _mel_edges(n_mel: int, n_dft: int, rate: int, lo: float, hi: float) -> np.ndarray:
    """Spectrogram bin index of each of the num_mel_bins + 2 equally spaced mel points."""
    op = "MelWeightMatrix"
    if n_mel < 1 or n_dft < 1 or rate < 1:
        raise ValueError(f"{op}: num_mel_bins, dft_length and sample_rate must be positive, "
                         f"got {n_mel}, {n_dft}, {rate}")
    if not 0.0 <= lo < hi:
        raise ValueError(f"{op}: need 0 <= lower_edge_hertz < upper_edge_hertz, got {lo}, {hi}")
    n_bins = n_dft // 2 + 1
    if math.floor((n_dft + 1) * hi / rate) >= n_bins:
        raise ValueError(f"{op}: upper_edge_hertz {hi} maps to a bin beyond the {n_bins} "
                         f"spectrogram bins of dft_length {n_dft} at sample_rate {rate}")
    mel_lo, mel_hi = _hz_to_mel(lo), _hz_to_mel(hi)
    # step (hi - lo) / (num_mel_bins + 2), so the last point stays below the upper edge
    mels = mel_lo + np.arange(n_mel + 2, dtype=np.float64) * ((mel_hi - mel_lo) / (n_mel + 2))
    hz = 700.0 * (np.power(10.0, mels / 2595.0) - 1.0)
    return np.floor((n_dft + 1) * hz / rate).astype(np.int64)


@kernel("MelWeightMatrix", since=17, factory=True, host_inputs=(0, 1, 2, 3, 4),
        capture=CaptureSupport.READS_HOST_SCALAR,
        supports=needs(SERVED, skip_inputs=(0, 1, 2, 3, 4), extra=_output_dtype_supports))
def mel_weight_matrix(info: NodeInfo) -> Callable[..., Tensor]:
    """Triangular mel filterbank, [dft_length // 2 + 1, num_mel_bins] with peaks of 1, built
    from host scalars and uploaded."""
    dtype = to_torch_dtype(int(info.attrs.get("output_datatype", DataType.FLOAT)))
    device = current_device()

    def run(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
        op = "MelWeightMatrix"
        n_dft = _scalar_int(dft_length, op, "dft_length")
        edges = _mel_edges(_scalar_int(num_mel_bins, op, "num_mel_bins"), n_dft,
                           _scalar_int(sample_rate, op, "sample_rate"),
                           float(np.asarray(lower_edge_hertz, np.float64).reshape(-1)[0]),
                           float(np.asarray(upper_edge_hertz, np.float64).reshape(-1)[0]))
        left, center, right = edges[:-2], edges[1:-1], edges[2:]
        j = np.arange(n_dft // 2 + 1, dtype=np.int64)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            rise = np.where(center > left, (j - left) / (center - left), 1.0)
            fall = (right - j) / (right - center)
        w = np.where((j >= left) & (j <= center), rise, 0.0)
        w = np.where((j >= center) & (j < right), fall, w)
        return to_torch(w, device).to(dtype)

    return run
