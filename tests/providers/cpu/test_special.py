"""onnxkiln's numpy erf and expit against scipy.special and mpmath where they are installed;
the numba kernels standing down without scipy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from onnxkiln.ops.special import erf, expit

ROOT = Path(__file__).resolve().parents[3]
F32, F64 = np.float32, np.float64


def _every_float32(n: int = 1 << 20) -> np.ndarray:
    """Random bit patterns: every exponent, denormals and both signs; no inf or NaN."""
    bits = np.random.default_rng(0).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(F32)
    return np.concatenate([x[np.isfinite(x)], np.linspace(-4.5, 4.5, n, dtype=F32)])


def _ulps32(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got - exact| in units of the float32 spacing at exact (exact in float64)."""
    spacing = np.spacing(np.abs(exact.astype(F32))).astype(F64)
    return np.abs(got.astype(F64) - exact) / spacing


def test_erf_float32_within_one_ulp_of_scipy_in_float64():
    special = pytest.importorskip("scipy.special")
    x = _every_float32()
    assert _ulps32(erf(x), special.erf(x.astype(F64))).max() <= 1.0


def test_erf_float64_within_two_ulp_of_mpmath_and_close_to_scipy():
    mp = pytest.importorskip("mpmath")
    special = pytest.importorskip("scipy.special")
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-6.5, 6.5, 3000), rng.uniform(-0.3, 0.3, 1000),
                        np.logspace(-320, 0.8, 300), -np.logspace(-300, 0.8, 100)])
    with mp.workdps(40):
        exact = np.array([float(mp.erf(mp.mpf(float(v)))) for v in x])
    assert (np.abs(erf(x) - exact) / np.spacing(np.abs(exact))).max() <= 2.0
    dense = np.linspace(-7, 7, 1 << 20)
    ref = special.erf(dense)
    assert (np.abs(erf(dense) - ref) / np.spacing(np.abs(ref))).max() <= 4.0


@pytest.mark.parametrize("dt", [F32, F64])
def test_erf_special_values(dt):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 6.0, -6.5], dt)
    got = erf(x)
    np.testing.assert_array_equal(got, np.array([0, 0, 1, -1, np.nan, 1, -1, 1, -1], dt))
    assert np.signbit(got[1]) and not np.signbit(got[0])
    tiny = np.array([np.finfo(dt).smallest_subnormal, -np.finfo(dt).tiny, 1e-30], dt)
    np.testing.assert_allclose(erf(tiny), tiny * dt(2 / np.sqrt(np.pi)), rtol=4e-7, atol=0)


def test_erf_dtypes_out_and_layouts():
    x = np.random.default_rng(2).standard_normal((33, 70)).astype(F32)
    want = erf(x)
    assert want.dtype == F32 and want.shape == x.shape
    y = x.copy()
    assert erf(y, out=y) is y
    np.testing.assert_array_equal(y, want)
    out = np.empty((70, 33), F32).T  # not C-contiguous
    erf(x, out=out)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(erf(x[:, ::3]), want[:, ::3])
    z = x.reshape(-1).copy()  # out overlapping the input, shifted by one
    erf(z[1:], out=z[:-1])
    np.testing.assert_array_equal(z[:-1], want.reshape(-1)[1:])
    assert erf(x.astype(np.float16)).dtype == np.float16
    assert erf(x.astype(ml_dtypes.bfloat16)).dtype == ml_dtypes.bfloat16
    assert erf(np.arange(3)).dtype == F64
    assert isinstance(erf(F32(0.5)), np.floating) and np.isclose(erf(0.5), 0.5204998778130465)
    with pytest.raises(ValueError, match="shape"):
        erf(x, out=np.empty(3, F32))
    with pytest.raises(TypeError, match="dtype"):
        erf(np.array(["a"]))


def test_expit_float32_close_to_scipy_in_float64_and_no_overflow():
    special = pytest.importorskip("scipy.special")
    x = _every_float32()
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        got = expit(x)
    exact = special.expit(x.astype(F64))
    # numpy's float32 exp is within a few ulp; the result keeps that in both tails
    assert _ulps32(got, exact)[exact >= np.finfo(F32).tiny].max() <= 4.0
    denormal = exact < np.finfo(F32).tiny
    assert np.abs(got - exact)[denormal].max() <= 2 * float(np.finfo(F32).smallest_subnormal)


def test_expit_float64_tails_and_values():
    x = np.array([-700.0, -100.0, -1.0, -0.0, 0.0, 1.0, 40.0, 800.0, np.inf, -np.inf, np.nan])
    got = expit(x)
    np.testing.assert_allclose(got[:8], 1 / (1 + np.exp(-x[:8])),
                               rtol=1e-15, atol=0)
    np.testing.assert_allclose(got[1], np.exp(-100.0), rtol=1e-15)  # no 1 - 1 cancellation
    np.testing.assert_array_equal(got[8:], [1.0, 0.0, np.nan])
    y = x.copy()
    assert expit(y, out=y) is y
    np.testing.assert_array_equal(y, got)
    assert expit(np.ones(2, np.float16)).dtype == np.float16


def test_erf_tables_match_their_generator():
    pytest.importorskip("mpmath")
    done = subprocess.run([sys.executable, str(ROOT / "scripts/fit_erf.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, "rerun python scripts/fit_erf.py: _erf_tables.py is stale"


def test_numba_kernels_stand_down_without_scipy(monkeypatch):
    """numba's np.dot needs scipy: without it the numpy kernels run, and the reason says so."""
    from onnxkiln.providers.cpu import _numba

    monkeypatch.setattr(_numba, "_installed", True)
    monkeypatch.setattr(_numba, "_no_scipy", True)
    monkeypatch.delenv(_numba.ENV, raising=False)
    assert "scipy is not installed" in _numba.disabled_reason()
