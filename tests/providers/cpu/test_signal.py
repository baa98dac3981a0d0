"""Signal kernels (providers/cpu/signal.py): DFT, STFT, windows, MelWeightMatrix."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.testing import assert_matches_ort, node_model

RNG = np.random.default_rng(7)
I64 = np.int64
BF16 = np.dtype(ml_dtypes.bfloat16)


def check(op, feeds, inits=None, opset=20, n=1, names=None, rtol=1e-4, atol=1e-4, **attrs):
    """Run one node on onnxkiln and onnxruntime and compare; returns onnxkiln's outputs."""
    model = node_model(
        op, feeds, n_outputs=n, opset=opset, initializers=inits, input_names=names, **attrs
    )
    return assert_matches_ort(model, feeds, rtol=rtol, atol=atol)


def ours(op, feeds, inits=None, opset=20, n=1, names=None, **attrs):
    """onnxkiln's outputs only (forms onnxruntime lacks, error cases)."""
    model = node_model(
        op, feeds, n_outputs=n, opset=opset, initializers=inits, input_names=names, **attrs
    )
    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def signal(shape, complex_=False, dtype=np.float32):
    return RNG.standard_normal((*shape, 2 if complex_ else 1)).astype(dtype)


def as_complex(x):
    x = x.astype(np.float64)
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0]


def as_pairs(y, dtype):
    return np.stack([y.real, y.imag], axis=-1).astype(dtype)


# DFT


@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("inverse", [0, 1])
@pytest.mark.parametrize("axis", [1, 2, -2, -3])
@pytest.mark.parametrize("length", [None, 5, 11])
def test_dft_matches_ort(complex_, inverse, axis, length):
    x = signal((2, 7, 8), complex_)
    inits = {} if length is None else {"n": np.array(length, I64)}
    names = ["x"] if length is None else ["x", "n"]
    check("DFT", {"x": x}, inits, opset=17, names=names, axis=axis, inverse=inverse)
    inits["a"] = np.array(axis, I64)
    names = ["x", names[1] if length else "", "a"]
    check("DFT", {"x": x}, inits, opset=20, names=names, inverse=inverse)


@pytest.mark.parametrize("axis", [0, 1, -2])
@pytest.mark.parametrize("length", [None, 6, 9])
def test_rfft_matches_ort(axis, length):
    x = signal((4, 9), dtype=np.float64)
    feeds = {"x": x, "a": np.array(axis, I64)}
    if length is None:
        check("DFT", feeds, names=["x", "", "a"], onesided=1)
    else:
        feeds["n"] = np.array(length, np.int32)
        check("DFT", feeds, names=["x", "n", "a"], onesided=1)
    y = ours("DFT", {"x": x}, opset=17, axis=axis, onesided=1)[0]
    ref = np.fft.rfft(x[..., 0], axis=axis % 3)
    np.testing.assert_allclose(y, as_pairs(ref, np.float64), rtol=1e-10, atol=1e-10)


def test_dft_default_axis_and_runtime_inputs():
    x = signal((3, 4, 6), True)
    y = ours("DFT", {"x": x}, opset=20, inverse=0)[0]  # default axis -2: the last signal dim
    np.testing.assert_allclose(y, as_pairs(np.fft.fft(as_complex(x), axis=2), np.float32),
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    y = ours("DFT", {"x": x}, opset=17)[0]  # opset 17 default axis 1
    np.testing.assert_allclose(y, as_pairs(np.fft.fft(as_complex(x), axis=1), np.float32),
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    feeds = {"x": x, "n": np.array(4, I64), "a": np.array(1, I64)}  # all runtime inputs
    check("DFT", feeds, inverse=1)


@pytest.mark.parametrize("length", [None, 8, 11, 3])
@pytest.mark.parametrize("opset", [17, 20])
def test_irfft_against_numpy(length, opset):
    full = RNG.standard_normal((3, 10))
    spec = np.fft.rfft(full, axis=1)  # 6 bins
    x = as_pairs(spec, np.float32)
    inits = {} if length is None else {"n": np.array(length, I64)}
    if opset == 17:
        names = ["x", "n"] if length else ["x"]
        y = ours("DFT", {"x": x}, inits, opset=17, names=names, axis=1, onesided=1, inverse=1)[0]
    else:
        inits["a"] = np.array(1, I64)
        names = ["x", "n" if length else "", "a"]
        y = ours("DFT", {"x": x}, inits, opset=20, names=names, onesided=1, inverse=1)[0]
    ref = np.fft.irfft(spec, n=length or 10, axis=1)
    assert y.dtype == np.float32 and y.shape == (3, length or 10, 1)
    np.testing.assert_allclose(y[..., 0], ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_dft_half_types_against_numpy(dtype):
    x = signal((2, 8), True).astype(dtype)
    for onesided, xx in ((0, x), (1, x[..., :1])):
        y = ours("DFT", {"x": xx}, {"a": np.array(1, I64)}, names=["x", "", "a"],
                 onesided=onesided)[0]  # fmt: skip
        fft = np.fft.rfft if onesided else np.fft.fft
        ref = fft(as_complex(xx.astype(np.float32)), axis=1)
        assert y.dtype == dtype
        np.testing.assert_allclose(y.astype(np.float32), as_pairs(ref, np.float32),
                                   rtol=3e-2, atol=5e-2)  # fmt: skip


def test_dft_empty_batch_and_errors():
    y = ours("DFT", {"x": signal((0, 4))}, opset=17, axis=1)[0]
    assert y.shape == (0, 4, 2) and y.dtype == np.float32
    with pytest.raises(Exception, match="axis"):
        ours("DFT", {"x": signal((2, 4))}, opset=17, axis=2)  # the re/im axis
    with pytest.raises(Exception, match="real input"):
        ours("DFT", {"x": signal((2, 4), True)}, opset=17, axis=1, onesided=1)
    with pytest.raises(Exception, match="last dimension"):
        ours("DFT", {"x": RNG.random((2, 4, 3)).astype(np.float32)}, opset=17, axis=1)


# STFT


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize(("step", "flen", "window"), [
    (8, 16, None), (4, None, "hann"), (5, 12, "hann"), (3, 7, None), (16, 16, "ones"),
])  # fmt: skip
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stft_matches_ort(onesided, step, flen, window, dtype):
    sig = signal((2, 64), dtype=dtype)
    inits = {"step": np.array(step, I64)}
    names = ["sig", "step", "", ""]
    size = flen or 16
    if window is not None:
        w = np.hanning(size) if window == "hann" else np.ones(size)
        inits["w"] = w.astype(dtype)
        names[2] = "w"
    if flen is not None:
        inits["len"] = np.array(flen, I64)
        names[3] = "len"
    names = names[: 4 if flen is not None else 3]
    check("STFT", {"sig": sig}, inits, opset=17, names=names, onesided=onesided)


def test_stft_complex_signal_and_defaults():
    sig = signal((1, 32), True)
    inits = {"step": np.array(4, I64), "w": np.hanning(8).astype(np.float32)}
    check("STFT", {"sig": sig}, inits, opset=17, names=["sig", "step", "w"], onesided=0)
    check("STFT", {"sig": sig}, inits, opset=17, names=["sig", "step", "w"], onesided=1)
    # Neither window nor frame_length: one frame spanning the whole signal (onnxruntime fails).
    real = signal((2, 10))
    y = ours("STFT", {"sig": real}, {"step": np.array(3, I64)}, opset=17,
             names=["sig", "step"])[0]  # fmt: skip
    ref = np.fft.rfft(real[..., 0], axis=1)[:, None]
    np.testing.assert_allclose(y, as_pairs(ref, np.float32), rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match="window"):
        ours("STFT", {"sig": real}, {"step": np.array(3, I64), "w": np.ones(4, np.float32),
             "len": np.array(5, I64)}, opset=17, names=["sig", "step", "w", "len"])  # fmt: skip


def test_stft_half_against_numpy():
    sig = signal((1, 40)).astype(np.float16)
    w = np.hanning(8).astype(np.float16)
    y = ours("STFT", {"sig": sig}, {"step": np.array(8, I64), "w": w}, opset=17,
             names=["sig", "step", "w"])[0]  # fmt: skip
    frames = np.stack([sig[0, i : i + 8, 0].astype(np.float32) for i in range(0, 33, 8)])
    ref = np.fft.rfft(frames * w.astype(np.float32), axis=1)[None]
    assert y.dtype == np.float16 and y.shape == (1, 5, 5, 2)
    np.testing.assert_allclose(y.astype(np.float32), as_pairs(ref, np.float32), atol=2e-2)


# Windows

WINDOWS = ["HannWindow", "HammingWindow", "BlackmanWindow"]


@pytest.mark.parametrize("op", WINDOWS)
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [0, 1, 2, 5, 10, 33])
@pytest.mark.parametrize("out", [1, 11, 7])
def test_windows_match_ort(op, periodic, size, out):
    check(op, {"n": np.array(size, I64)}, opset=17, periodic=periodic, output_datatype=out,
          rtol=1e-6, atol=1e-6)  # fmt: skip
    if size:  # onnxruntime rejects a constant size 0 at load time
        check(op, {}, {"n": np.array(size, np.int32)}, opset=17, periodic=periodic,
              output_datatype=out, rtol=1e-6, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize("op", WINDOWS)
def test_windows_against_numpy(op):
    n = 12
    ref = {"HannWindow": np.hanning, "HammingWindow": None, "BlackmanWindow": np.blackman}[op]
    y = ours(op, {"n": np.array(n, I64)}, opset=17, periodic=0)[0]
    if ref is not None:  # numpy's Hamming uses 0.54/0.46, ONNX 25/46 and 21/46
        np.testing.assert_allclose(y, ref(n), atol=1e-6)
    else:
        k = np.arange(n)
        np.testing.assert_allclose(y, 25 / 46 - 21 / 46 * np.cos(2 * np.pi * k / (n - 1)),
                                   atol=1e-6)  # fmt: skip
    y16 = ours(op, {"n": np.array(n, I64)}, opset=17, output_datatype=16)[0]  # bfloat16
    assert y16.dtype == BF16
    y32 = ours(op, {"n": np.array(n, I64)}, opset=17)[0]
    np.testing.assert_allclose(y16.astype(np.float32), y32, atol=1e-2)


# MelWeightMatrix


@pytest.mark.parametrize(("bins", "dft", "rate", "lo", "hi"), [
    (8, 16, 8192, 0.0, 4096.0),
    (20, 512, 16000, 20.0, 8000.0),
    (40, 1024, 22050, 0.0, 11025.0),
    (4, 64, 8000, 300.0, 3000.0),
    (3, 9, 1000, 0.0, 450.0),
    (10, 32, 16000, 125.0, 7600.0),
])  # fmt: skip
@pytest.mark.parametrize("out", [1, 11])
def test_mel_weight_matrix_matches_ort(bins, dft, rate, lo, hi, out):
    feeds = {"b": np.array(bins, I64), "d": np.array(dft, I64), "r": np.array(rate, I64),
             "lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)}  # fmt: skip
    y = check("MelWeightMatrix", feeds, opset=17, output_datatype=out, rtol=1e-6, atol=1e-6)[0]
    assert y.shape == (dft // 2 + 1, bins)


def test_mel_weight_matrix_int32_inputs_and_float16_output():
    feeds = {"b": np.array(8, np.int32), "d": np.array(16, np.int32),
             "r": np.array(8192, np.int32), "lo": np.array(0, np.float16),
             "hi": np.array(4096, np.float16)}  # fmt: skip
    y = ours("MelWeightMatrix", feeds, opset=17, output_datatype=10)[0]
    assert y.dtype == np.float16 and y.shape == (9, 8)
    assert np.all(y.max(axis=0) == 1)  # every triangle peaks at 1
    feeds["hi"] = np.array(8192, np.float16)  # beyond the last bin, as onnxruntime
    with pytest.raises(Exception, match="upper_edge_hertz"):
        ours("MelWeightMatrix", feeds, opset=17)
